#include "tests/testutil.h"
#include "arena-server/arena_build.h"
#include "common/arena/arena.h"
#include "common/arena/arena_layout.h"
#include "common/base/err.h"

#include <arpa/inet.h>
#include <ftw.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

const char *test_data_path(const char *rel)
{
    static char buf[4096];
    const char *env = getenv("STRATA_SHARED_DATA");
    if (env && *env)
        snprintf(buf, sizeof buf, "%s/%s", env, rel);
    else
        snprintf(buf, sizeof buf, "%s/../shared/data/%s", STRATA_SOURCE_DIR, rel);
    struct stat st;
    if (stat(buf, &st) != 0) {
        printf(
            "SKIP %s: the optional golden data is absent (set STRATA_SHARED_DATA to its folder)\n",
            rel);
        return NULL;
    }
    return buf;
}

/* The root of everything this test binary writes: TMPDIR and the XDG directories of the tests and
 * of the processes they start point into it, and the process that made it removes it at exit
 * (after main returns, so a main that stops leftover processes first still finds their files). */
static char root[512];
static pid_t root_pid;
static bool keep_root; /* a test failed: its files stay for a look */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    if (remove(path) != 0) fprintf(stderr, "testutil: cannot remove %s: %m\n", path);
    return 0;
}

static void remove_root(void)
{
    if (getpid() != root_pid) return; /* a forked test exiting: the root is its parent's */
    if (keep_root || getenv("STRATA_TEST_KEEP"))
        fprintf(stderr, "testutil: the tests' files are kept in %s (%s)\n", root,
                keep_root ? "a test failed" : "STRATA_TEST_KEEP");
    else
        nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void make_root(void)
{
    if (root[0]) return;
    const char *t = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/strata-test-XXXXXX", t && *t ? t : "/tmp");
    /* traversable by others, as /tmp is, so a test acting as another uid reaches the paths it is
     * given (ipc_test); nothing inside is: every directory in it is 0700 */
    if (!mkdtemp(root) || chmod(root, 0711) != 0) {
        perror(root);
        abort();
    }
    static const char *const xdg[][2] = {{"XDG_STATE_HOME", "state"},
                                         {"XDG_RUNTIME_DIR", "run"},
                                         {"XDG_CACHE_HOME", "cache"},
                                         {"XDG_CONFIG_HOME", "config"},
                                         {"XDG_DATA_HOME", "data"}};
    char path[600];
    for (size_t i = 0; i < sizeof xdg / sizeof *xdg; i++) {
        snprintf(path, sizeof path, "%s/%s", root, xdg[i][1]);
        if (mkdir(path, 0700) != 0 || setenv(xdg[i][0], path, 1) != 0) {
            perror(path);
            abort();
        }
    }
    setenv("TMPDIR", root, 1);
    root_pid = getpid();
    atexit(remove_root);
}

const char *test_tmpdir(void)
{
    static char dir[600];
    if (!dir[0]) {
        make_root();
        snprintf(dir, sizeof dir, "%s/strata-test-XXXXXX", root);
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            abort();
        }
    }
    return dir;
}

static int run_suite(Suite *s, bool fork)
{
    make_root();
    SRunner *sr = srunner_create(s);
    if (!fork) srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    keep_root |= failed != 0;
    return failed == 0 ? 0 : 1;
}

int test_run(Suite *s)
{
    return run_suite(s, true);
}

int test_run_threads(Suite *s)
{
    return run_suite(s, false);
}

double test_slowdown(void)
{
    const char *e = getenv("STRATA_TEST_SLOWDOWN");
    double f = e ? strtod(e, NULL) : 1.0;
    return f >= 1.0 && f <= 100.0 ? f : 1.0;
}

bool test_matrix_short(const char *suite, const char *left_out)
{
    const char *e = getenv("STRATA_TEST_MATRIX");
    if (!e || strcmp(e, "short") != 0) return false;
    printf("NOTE %s: STRATA_TEST_MATRIX=short leaves out %s (scripts/check-full runs them)\n", suite,
           left_out);
    return true;
}

char *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len) *len = (size_t)n;
    }
    return buf;
}

double test_unif(struct test_rng *r)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (double)(r->s >> 11) * 0x1p-53;
}

float test_gauss(struct test_rng *r)
{
    double u = test_unif(r), v = test_unif(r);
    return (float)(sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

int test_free_ports(int n)
{
    /* from 10000 up to the ephemeral range's start (32768 by default: 22768 ports); where that
     * range starts below 12000 there is no room under it, and the ports are taken from 20000 up */
    unsigned lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%u %u", &lo, &hi) != 2) lo = 32768;
        fclose(f);
    }
    const unsigned from = lo >= 12000 ? 10000 : 20000, span = lo >= 12000 ? lo - from : 40000;
    for (int tries = 0; tries < 200; tries++) {
        const int base =
            (int)(from + (getpid() * 7919u + (unsigned)tries * 104729u) % (span - (unsigned)n));
        bool ok = true;
        for (int i = 0; i < n && ok; i++) {
            const int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(base + i))};
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
            if (fd >= 0) close(fd);
        }
        if (ok) return base;
    }
    ck_abort_msg("no %d free consecutive ports from %u on 127.0.0.1", n, from);
    return 0;
}

unsigned test_other_uid(void)
{
    for (unsigned uid = 60999; uid > 50000; uid--)
        if (!getpwuid(uid) && !getgrgid(uid)) return uid;
    abort(); /* every uid of the range has an account: nothing to test as */
}

int test_as_other_user(const char *what, int (*fn)(void *ctx), void *ctx)
{
    if (geteuid() != 0) {
        printf("SKIP %s: switching to another user needs root (CI runs as root)\n", what);
        return -1;
    }
    unsigned id = test_other_uid();
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setresgid(id, id, id) != 0 || setresuid(id, id, id) != 0)
            _exit(126);
        _exit(fn(ctx) & 0xff);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void test_arena_build(struct gguf_file *f, const char *path, const char *dir, const char *name,
                      struct arena **a)
{
    mkdir(dir, 0700);
    struct arena_layout *L;
    ck_assert_msg(arena_layout_plan(f, ARENA_ALIGN_SMALL, path, &L) == 0, "%s",
                  strata_errdetail());
    char seg[300], tmp[320];
    shm_name(seg, sizeof seg, name, "");
    snprintf(tmp, sizeof tmp, "%s.tmp", seg);
    struct shm_seg s;
    struct arena_build_stats st;
    struct arena_build_opts bo = {.threads = 1};
    ck_assert_msg(arena_build_create(L, f, dir, tmp, &bo, &s, &st) == 0, "%s",
                  strata_errdetail());
    atomic_store_explicit(&((struct arena_header *)s.map)->state, ARENA_READY,
                          memory_order_release);
    ck_assert_int_eq(shm_publish(dir, &s, tmp, seg, 0400), 0);
    shm_close(&s);
    arena_layout_fini(L);
    ck_assert_int_eq(arena_open(dir, name, a), 0);
}

bool test_wait_exit(pid_t pid, double seconds, int *status)
{
    for (int i = 0; i < (int)(seconds * 100); i++) {
        pid_t r = waitpid(pid, status, WNOHANG);
        ck_assert_int_ne(r, -1);
        if (r == pid) return true;
        usleep(10 * 1000);
    }
    if (waitpid(pid, status, WNOHANG) == pid) return true;
    kill(pid, SIGKILL);
    waitpid(pid, status, 0);
    return false;
}
