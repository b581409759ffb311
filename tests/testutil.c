#include "tests/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <grp.h>
#include <pwd.h>
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
        printf("SKIP %s: ../shared/data is absent (set STRATA_SHARED_DATA to run it)\n", rel);
        return NULL;
    }
    return buf;
}

const char *test_tmpdir(void)
{
    static char dir[512];
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/strata-test-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            abort();
        }
    }
    return dir;
}

int test_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
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
