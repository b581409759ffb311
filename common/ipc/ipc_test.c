#include "common/base/err.h"
#include "common/ipc/ipc.h"
#include "common/ipc/msg.h"
#include "tests/testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Every test opens its sockets itself: Check forks each test, and nng does not survive a fork. */

#define SLOW_MS 1500 /* the slow op's time on an idle machine; slow_ms() stretches it */

/* slow_ms is SLOW_MS times the machine's slowdown (test_slowdown): the checks below compare fast
 * calls with it, and on a loaded machine fast calls are slow too. */
static int slow_ms(void)
{
    return (int)(SLOW_MS * test_slowdown());
}

struct fixture {
    pthread_mutex_t mtx;
    pthread_t slow[16];
    int n_slow;
    struct ipc_call *held;
};

static struct fixture fx = {.mtx = PTHREAD_MUTEX_INITIALIZER};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int op_echo(struct ipc_call *call, void *ctx)
{
    struct msg *m = ipc_call_msg(call);
    int64_t x;
    int rv = msg_get_i64(m, NULL, "x", INT64_MIN, INT64_MAX, &x);
    if (rv != 0) return rv;
    struct msg_builder b;
    msg_begin_reply(&b);
    msg_key(&b, "x");
    msg_pack_i64(&b, x);
    return ipc_reply(call, &b);
}

static int op_fail(struct ipc_call *call, void *ctx)
{
    return strata_errf(STRATA_ELIMIT, "too big: 5");
}

static void *slow_main(void *arg)
{
    struct ipc_call *call = arg;
    usleep((useconds_t)slow_ms() * 1000);
    struct msg_builder b;
    msg_begin_reply(&b);
    msg_key(&b, "slow");
    msg_pack_bool(&b, true);
    ck_assert_int_eq(ipc_reply(call, &b), 0);
    return NULL;
}

/* op_slow answers later from its own thread, as a worker's long poll does */
static int op_slow(struct ipc_call *call, void *ctx)
{
    pthread_mutex_lock(&fx.mtx);
    ck_assert_int_lt(fx.n_slow, 16);
    int rv = pthread_create(&fx.slow[fx.n_slow++], NULL, slow_main, call);
    pthread_mutex_unlock(&fx.mtx);
    return rv == 0 ? 0 : strata_errf(STRATA_ENOMEM, "no thread");
}

/* op_hold never answers by itself: the test answers (after stopping the server) */
static int op_hold(struct ipc_call *call, void *ctx)
{
    pthread_mutex_lock(&fx.mtx);
    fx.held = call;
    pthread_mutex_unlock(&fx.mtx);
    return 0;
}

static const struct ipc_op ops[] = {
    {"echo", op_echo}, {"fail", op_fail}, {"slow", op_slow}, {"hold", op_hold}, {NULL, NULL},
};

static int handler(struct ipc_call *call, void *ctx)
{
    return ipc_dispatch(call, ops, ctx);
}

/* setup makes a fresh runtime directory and the URL of a socket in it. */
static void setup(const char *name, char *dir, char *url)
{
    char want[512];
    snprintf(want, sizeof want, "%s/%s", test_tmpdir(), name);
    ck_assert_int_eq(ipc_runtime_dir(want, NULL, dir, 512), 0);
    ck_assert_int_eq(ipc_url(dir, "s.sock", url, 600), 0);
}

static struct ipc_server *start(const char *url, int watchdog_ms, size_t recv_max)
{
    struct ipc_server_opts o = {.name = "test",
                                .n_ctx = 8,
                                .watchdog_ms = watchdog_ms,
                                .watchdog_timeout_ms = watchdog_ms ? 300 : 0, /* 0: defaults */
                                .recv_max = recv_max};
    struct ipc_server *srv;
    int rv = ipc_server_start(url, handler, NULL, &o, &srv);
    ck_assert_msg(rv == 0, "server start: %s: %s", strata_strerror(rv), strata_errdetail());
    return srv;
}

/* echo calls op echo with x and returns the code; on success checks the echoed value. */
static int echo(struct ipc_client *cli, int64_t x, int timeout_ms)
{
    struct msg_builder b;
    struct msg r;
    msg_begin_request(&b, "echo");
    msg_key(&b, "x");
    msg_pack_i64(&b, x);
    int rv = ipc_request(cli, &b, &r, timeout_ms);
    if (rv != 0) return rv;
    int64_t got = -1;
    ck_assert_int_eq(msg_get_i64(&r, NULL, "x", INT64_MIN, INT64_MAX, &got), 0);
    ck_assert_int_eq(got, x);
    msg_free(&r);
    return 0;
}

static int call_op(struct ipc_client *cli, const char *op, int timeout_ms)
{
    struct msg_builder b;
    struct msg r;
    msg_begin_request(&b, op);
    int rv = ipc_request(cli, &b, &r, timeout_ms);
    if (rv == 0) msg_free(&r);
    return rv;
}

START_TEST(round_trip_and_errors)
{
    char dir[512], url[600];
    setup("rt", dir, url);
    struct ipc_server *srv = start(url, 5000, 0);
    struct ipc_client *cli;
    ck_assert_int_eq(ipc_client_open(url, NULL, &cli), 0);

    ck_assert_int_eq(echo(cli, 42, 2000), 0);
    ck_assert_int_eq(echo(cli, -1, 2000), 0);
    ck_assert_int_eq(call_op(cli, IPC_PING_OP, 2000), 0);
    ck_assert_int_eq(call_op(cli, "fail", 2000), STRATA_ELIMIT);
    ck_assert_str_eq(strata_errdetail(), "too big: 5");
    /* a handler's field error travels back with the key named */
    ck_assert_int_eq(call_op(cli, "echo", 2000), STRATA_ENOENT);
    ck_assert_str_eq(strata_errdetail(), "field 'x': missing");
    ck_assert_int_eq(call_op(cli, "nope", 2000), STRATA_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "op 'nope' is not supported"));
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "echo, fail, slow, hold"));

    /* the socket is 0600, its directory 0700, and the lock file names us */
    struct stat st;
    ck_assert_int_eq(stat(url + 6, &st), 0);
    ck_assert(S_ISSOCK(st.st_mode));
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700);
    char lock[700], pid[32];
    snprintf(lock, sizeof lock, "%s.lock", url + 6);
    char *content = test_read_file(lock, NULL);
    ck_assert_ptr_nonnull(content);
    snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    ck_assert_str_eq(content, pid);
    free(content);

    ipc_client_close(cli);
    ipc_server_close(srv);
    /* stopping removes the socket file */
    ck_assert_int_ne(stat(url + 6, &st), 0);
}
END_TEST

START_TEST(malformed_requests_get_error_replies)
{
    char dir[512], url[600];
    setup("bad", dir, url);
    struct ipc_server *srv = start(url, 5000, 0);
    struct ipc_client *cli;
    ck_assert_int_eq(ipc_client_open(url, NULL, &cli), 0);
    static const struct {
        const char *bytes;
        size_t len;
        int code;
    } cases[] = {
        {"\x93\x01\x02\x03", 4, STRATA_EFORMAT},            /* not a map */
        {"\xdf\xff\xff\xff\xff", 5, STRATA_ETRUNC},         /* 4 G entries in 5 bytes */
        {"\x81\xa1v\x01\x00", 5, STRATA_EFORMAT},           /* trailing byte */
        {"", 0, STRATA_ETRUNC},                             /* empty */
        {"\x82\xa1v\x01\xa2ok\xc3", 8, STRATA_EPROTO},      /* a reply sent as a request */
        {"\x82\xa1v\x07\xa2op\xa4ping", 12, STRATA_EPROTO}, /* future version */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        void *rep;
        size_t len;
        struct msg r;
        ck_assert_int_eq(ipc_call(cli, cases[i].bytes, cases[i].len, &rep, &len, 2000), 0);
        ck_assert_int_eq(msg_decode(rep, len, &r), 0);
        ck_assert_msg(msg_reply_status(&r) == cases[i].code, "case %zu: got %d (%s)", i, r.err_code,
                      r.err_message);
        ck_assert_str_ne(r.err_message, "");
        msg_free(&r);
        free(rep);
    }
    /* and the server goes on serving */
    ck_assert_int_eq(echo(cli, 7, 2000), 0);
    ipc_client_close(cli);
    ipc_server_close(srv);
}
END_TEST

struct hammer {
    const char *url;
    struct ipc_client *shared;
    int id;
    int failures;
};

static void *hammer_main(void *arg)
{
    struct hammer *h = arg;
    struct ipc_client *own;
    ck_assert_int_eq(ipc_client_open(h->url, NULL, &own), 0);
    for (int i = 0; i < 100; i++) {
        h->failures += echo(own, h->id * 1000 + i, 5000) != 0;
        h->failures += echo(h->shared, -(h->id * 1000 + i), 5000) != 0;
    }
    ipc_client_close(own);
    return NULL;
}

struct slow_call {
    struct ipc_client *cli;
    int rv;
    int64_t ms;
};

static void *slow_caller(void *arg)
{
    struct slow_call *s = arg;
    int64_t t0 = now_ms();
    s->rv = call_op(s->cli, "slow", 10000 + slow_ms());
    s->ms = now_ms() - t0;
    return NULL;
}

START_TEST(slow_deferred_calls_do_not_block_many_clients)
{
    char dir[512], url[600];
    setup("many", dir, url);
    struct ipc_server *srv = start(url, 5000, 0);
    struct ipc_client *shared;
    ck_assert_int_eq(ipc_client_open(url, NULL, &shared), 0);
    ck_assert_int_eq(echo(shared, 0, 2000), 0);

    /* 4 slow calls occupy 4 of the 8 contexts for SLOW_MS */
    pthread_t st[4];
    struct slow_call sc[4];
    for (int i = 0; i < 4; i++) {
        sc[i] = (struct slow_call){.cli = shared};
        ck_assert_int_eq(pthread_create(&st[i], NULL, slow_caller, &sc[i]), 0);
    }
    usleep(200 * 1000);

    /* meanwhile 8 threads make 1600 calls on their own sockets and on the shared one */
    int64_t t0 = now_ms();
    pthread_t ht[8];
    struct hammer h[8];
    for (int i = 0; i < 8; i++) {
        h[i] = (struct hammer){.url = url, .shared = shared, .id = i + 1};
        ck_assert_int_eq(pthread_create(&ht[i], NULL, hammer_main, &h[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(ht[i], NULL);
        ck_assert_int_eq(h[i].failures, 0);
    }
    int64_t fast_ms = now_ms() - t0;
    printf("ipc: 1600 echo calls from 8 threads took %lld ms while 4 slow calls were pending\n",
           (long long)fast_ms);

    for (int i = 0; i < 4; i++) {
        pthread_join(st[i], NULL);
        ck_assert_int_eq(sc[i].rv, 0);
        ck_assert_int_ge(sc[i].ms, slow_ms() - 50);
        /* the fast calls were not queued behind the slow ones */
    }
    ck_assert_msg(fast_ms < 200 + slow_ms(), "fast calls took %lld ms (the slow calls take %d)",
                  (long long)fast_ms, slow_ms());
    pthread_mutex_lock(&fx.mtx);
    for (int i = 0; i < fx.n_slow; i++)
        pthread_join(fx.slow[i], NULL);
    pthread_mutex_unlock(&fx.mtx);
    ipc_client_close(shared);
    ipc_server_close(srv);
}
END_TEST

START_TEST(fast_call_passes_a_pending_slow_one)
{
    char dir[512], url[600];
    setup("order", dir, url);
    struct ipc_server *srv = start(url, 5000, 0);
    struct ipc_client *cli;
    ck_assert_int_eq(ipc_client_open(url, NULL, &cli), 0);
    pthread_t t;
    struct slow_call sc = {.cli = cli};
    ck_assert_int_eq(pthread_create(&t, NULL, slow_caller, &sc), 0);
    usleep(100 * 1000);
    int64_t t0 = now_ms();
    ck_assert_int_eq(echo(cli, 5, 2000), 0);
    int64_t fast = now_ms() - t0;
    pthread_join(t, NULL);
    ck_assert_int_eq(sc.rv, 0);
    /* the fast call on the same socket finished long before the slow one */
    ck_assert_msg(fast < slow_ms() / 3, "fast call took %lld ms", (long long)fast);
    pthread_join(fx.slow[0], NULL);
    ipc_client_close(cli);
    ipc_server_close(srv);
}
END_TEST

START_TEST(oversized_message_drops_only_its_connection)
{
    char dir[512], url[600];
    setup("big", dir, url);
    /* the default watchdog: the dropped connection can break nng 1.5.2's listener (#1518; seen
     * about one run in three on a loaded machine), and then the next client is served once the
     * watchdog re-listened, within its ~1 s instead of the 2 s echo's deadline */
    struct ipc_server *srv = start(url, 0, 1024);
    struct ipc_client *big, *next;
    ck_assert_int_eq(ipc_client_open(url, NULL, &big), 0);
    ck_assert_int_eq(echo(big, 1, 2000), 0);

    char blob[4096] = {0};
    struct msg_builder b;
    struct msg r;
    msg_begin_request(&b, "echo");
    msg_key(&b, "blob");
    msg_pack_bin(&b, blob, sizeof blob);
    /* NNG drops the connection: no reply is possible, the call times out */
    ck_assert_int_eq(ipc_request(big, &b, &r, 500), STRATA_ETIMEDOUT);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "within 500 ms"));

    ck_assert_int_eq(ipc_client_open(url, NULL, &next), 0);
    /* a new connection may wait for the watchdog to re-listen (nng #1518): longer when loaded */
    ck_assert_int_eq(echo(next, 2, (int)(2000 * test_slowdown())), 0);
    /* the dropped client reconnects by itself */
    ck_assert_int_eq(echo(big, 3, 3000), 0);
    ipc_client_close(next);
    ipc_client_close(big);
    ipc_server_close(srv);
}
END_TEST

static void unix_addr(struct sockaddr_un *sa, const char *path)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    ck_assert_uint_lt(strlen(path), sizeof sa->sun_path);
    memcpy(sa->sun_path, path, strlen(path) + 1);
}

START_TEST(second_server_on_a_path_is_busy)
{
    char dir[512], url[600];
    setup("lock", dir, url);
    /* a stale socket file from a crashed server is removed under the lock */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa;
    unix_addr(&sa, url + 6);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd);

    struct ipc_server *a = start(url, 5000, 0), *b = NULL;
    ck_assert_int_eq(ipc_server_start(url, handler, NULL, NULL, &b), STRATA_EBUSY);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld ", (long)getpid());
    ck_assert_msg(strstr(strata_errdetail(), pid), "detail: %s", strata_errdetail());

    /* the refused server left the first one's socket alone */
    struct ipc_client *cli;
    ck_assert_int_eq(ipc_client_open(url, NULL, &cli), 0);
    ck_assert_int_eq(echo(cli, 9, 2000), 0);
    ipc_client_close(cli);

    ck_assert_int_eq(ipc_server_start("tcp://127.0.0.1:5555", handler, NULL, NULL, &b),
                     STRATA_EINVAL);

    ipc_server_close(a);
    b = start(url, 5000, 0);
    ipc_server_close(b);
}
END_TEST

/* raw_connect opens an AF_UNIX stream to path: only the tests connect without nng. */
static int raw_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa;
    unix_addr(&sa, path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* break_handshakes opens a burst of connections and closes them, half after sending 2 bytes of the
 * SP header: nng accepts them after they closed, so its header write fails with EPIPE, which nng
 * 1.5.2 reports to its listener as NNG_ECLOSED, and the listener stops for good (#1518). Opening
 * them all before closing any makes it likely that one is accepted late; provoke_1518 repeats the
 * burst until a new client goes unserved, and says whether that happened. */
static void break_handshakes(const char *path)
{
    int fds[8];
    for (int i = 0; i < 8; i++) {
        fds[i] = raw_connect(path);
        ck_assert_int_ge(fds[i], 0);
        if (i % 2 == 1) ck_assert_int_eq(write(fds[i], "\0S", 2), 2);
    }
    for (int i = 0; i < 8; i++)
        close(fds[i]);
    usleep(50 * 1000);
}

static bool provoke_1518(const char *url)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        struct ipc_client *probe;
        break_handshakes(url + 6);
        ck_assert_int_eq(ipc_client_open(url, NULL, &probe), 0);
        int rv = echo(probe, attempt, 250);
        ipc_client_close(probe);
        if (rv == STRATA_ETIMEDOUT) return true;
        ck_assert_int_eq(rv, 0);
    }
    return false;
}

/* on the nng this project builds against, the bug must show; a newer nng may have fixed it */
static bool nng_has_1518(void)
{
    return strcmp(nng_version(), "1.5.2") == 0;
}

START_TEST(without_watchdog_the_listener_dies)
{
    char dir[512], url[600];
    setup("nowd", dir, url);
    struct ipc_server *srv = start(url, -1, 0);
    bool broke = provoke_1518(url);
    printf("ipc: nng %s without the watchdog, after broken handshakes: %s\n", nng_version(),
           broke ? "new clients are not served (bug #1518)" : "still served");
    if (nng_has_1518()) ck_assert(broke);
    if (broke) { /* and it stays dead: nothing else heals it */
        struct ipc_client *cli;
        ck_assert_int_eq(ipc_client_open(url, NULL, &cli), 0);
        ck_assert_int_eq(echo(cli, 1, 1000), STRATA_ETIMEDOUT);
        ipc_client_close(cli);
    }
    ipc_server_close(srv);
}
END_TEST

/* With the default watchdog a listener broken by #1518 is back within a few seconds (a worker
 * socket probed by a connect-and-close was deaf for ~6 s with the old 5 s period): broken right
 * after a re-listen, the worst moment, a new client is served within period + ping timeout +
 * the grace a slow server gets before a re-listen. */
START_TEST(default_watchdog_relistens_within_a_second)
{
    char dir[512], url[600];
    setup("hsdef", dir, url);
    struct ipc_server *srv = start(url, 0, 0);
    if (!provoke_1518(url)) {
        printf("SKIP default_watchdog_relistens_within_a_second: nng %s did not break\n",
               nng_version());
        ipc_server_close(srv);
        return;
    }
    for (int i = 0; i < 1000 && ipc_server_relistens(srv) == 0; i++)
        usleep(10 * 1000);
    ck_assert_uint_ge(ipc_server_relistens(srv), 1);
    unsigned before = ipc_server_relistens(srv);
    ck_assert(provoke_1518(url));
    int64_t t0 = now_ms();
    struct ipc_client *cli;
    ck_assert_int_eq(ipc_client_open(url, NULL, &cli), 0);
    int rv = echo(cli, 12, 10000);
    int64_t took = now_ms() - t0;
    printf("ipc: default watchdog: served %lld ms after the listener broke again\n",
           (long long)took);
    ck_assert_msg(rv == 0, "%s: %s", strata_strerror(rv), strata_errdetail());
    ck_assert_uint_gt(ipc_server_relistens(srv), before);
    /* period 500 + ping timeout 500 + the grace for a slow server's attach (1500) + slack */
    ck_assert_msg(took < 4000, "a new client waited %lld ms for the re-listen", (long long)took);
    ipc_client_close(cli);
    ipc_server_close(srv);
}
END_TEST

START_TEST(watchdog_revives_the_listener)
{
    char dir[512], url[600];
    setup("hs", dir, url);
    struct ipc_server *srv = start(url, 1000, 0); /* pings time out after 300 ms */
    struct ipc_client *cli;
    bool broke = provoke_1518(url);
    if (nng_has_1518()) ck_assert(broke);
    /* a new client is served within the watchdog's period, ping timeout and grace (1000 + 300 +
     * 1500 ms); the bound has slack for a loaded 2-core CI machine */
    int64_t t0 = now_ms();
    ck_assert_int_eq(ipc_client_open(url, NULL, &cli), 0);
    int rv = echo(cli, 11, 5000);
    int64_t took = now_ms() - t0;
    unsigned relistens = ipc_server_relistens(srv);
    printf("ipc: listener broken by bug #1518: %s; a new client was served %lld ms later, after %u "
           "re-listen(s)\n",
           broke ? "yes" : "no", (long long)took, relistens);
    ck_assert_msg(rv == 0, "%s: %s", strata_strerror(rv), strata_errdetail());
    if (broke) {
        ck_assert_uint_ge(relistens, 1);
        ck_assert_int_lt(took, 1000 + 300 + 1500 + 1500);
    }
    ipc_client_close(cli);
    ipc_server_close(srv);
}
END_TEST

START_TEST(stop_with_a_deferred_call_pending)
{
    char dir[512], url[600];
    setup("stop", dir, url);
    struct ipc_server *srv = start(url, 5000, 0);
    struct ipc_client *cli;
    ck_assert_int_eq(ipc_client_open(url, NULL, &cli), 0);
    ck_assert_int_eq(call_op(cli, "hold", 300), STRATA_ETIMEDOUT);
    /* on a loaded machine the server may take the call after our 300 ms are over */
    struct ipc_call *held = NULL;
    for (int64_t end = now_ms() + (int64_t)(5000 * test_slowdown()); !held && now_ms() < end;) {
        pthread_mutex_lock(&fx.mtx);
        held = fx.held;
        pthread_mutex_unlock(&fx.mtx);
        if (!held) usleep(10 * 1000);
    }
    ck_assert_ptr_nonnull(held);
    ck_assert_str_eq(ipc_call_msg(held)->op, "hold");
    ipc_server_stop(srv);
    ipc_server_stop(srv);
    ck_assert_int_eq(ipc_reply_error(held, STRATA_ECANCELED, "late"), STRATA_ECLOSED);
    ck_assert_int_eq(ipc_reply_error(held, STRATA_ECANCELED, "twice"), STRATA_ESTATE);
    ipc_client_close(cli);
    ipc_server_close(srv);
}
END_TEST

static volatile sig_atomic_t g_term;
static void on_term(int sig)
{
    (void)sig;
    g_term = 1;
}

/* A healthy server's watchdog never re-listens, however its process is scheduled: a server in a
 * child process is stopped (SIGSTOP) for 2 s while a call waits on it, continued, keeps serving
 * with no re-listen (re-listening on a busy server once hung nng 1.5.2: the worker never finished
 * its SIGTERM), and stops on SIGTERM in time. The child's exit status is its re-listen count. */
START_TEST(stopped_and_continued_server_keeps_its_listener)
{
    char dir[512], url[600];
    setup("sigstop", dir, url);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGTERM, on_term);
        struct ipc_server_opts o = {.name = "child", .n_ctx = 8}; /* the default watchdog */
        struct ipc_server *srv;
        if (ipc_server_start(url, handler, NULL, &o, &srv) != 0) _exit(100);
        while (!g_term)
            usleep(10 * 1000);
        unsigned n = ipc_server_relistens(srv);
        ipc_server_close(srv);
        _exit(n > 99 ? 99 : (int)n);
    }
    struct ipc_client *cli;
    ck_assert_int_eq(ipc_client_open(url, NULL, &cli), 0);
    int rv = STRATA_ETIMEDOUT;
    for (int i = 0; i < 100 && rv != 0; i++)
        rv = echo(cli, i, 100);
    ck_assert_int_eq(rv, 0);
    usleep(1000 * 1000); /* a few healthy pings */
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    usleep(2000 * 1000);
    ck_assert_int_eq(kill(pid, SIGCONT), 0);
    ck_assert_int_eq(echo(cli, 7, 5000), 0);
    usleep(2500 * 1000); /* pings after the continue, and their grace */
    ck_assert_int_eq(echo(cli, 8, 5000), 0);
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    int st = 0;
    ck_assert_msg(test_wait_exit(pid, 15, &st), "the server did not stop within 15 s of SIGTERM");
    ipc_client_close(cli);
    ck_assert(WIFEXITED(st));
    ck_assert_msg(WEXITSTATUS(st) == 0, "the server re-listened %d time(s) (status %d)",
                  WEXITSTATUS(st), WEXITSTATUS(st));
}
END_TEST

/* A process whose stop hangs exits at its deadline, with status 1 and a message saying why; one
 * that stops in time exits as it would. */
START_TEST(stop_deadline_ends_a_hung_stop)
{
    char log[600];
    snprintf(log, sizeof log, "%s/deadline.log", test_tmpdir());
    for (int hang = 0; hang < 2; hang++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd < 0 || dup2(fd, 2) < 0) _exit(3);
            if (ipc_stop_deadline("test", 1) != 0) _exit(4);
            if (hang) sleep(30); /* the stop that never ends */
            _exit(0);
        }
        int st = 0;
        const bool exited = test_wait_exit(pid, 15, &st);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        ck_assert_msg(exited, "a stop that hangs was still running after %.1f s", s);
        ck_assert(WIFEXITED(st));
        ck_assert_int_eq(WEXITSTATUS(st), hang ? 1 : 0);
        char *text = test_read_file(log, NULL);
        ck_assert_ptr_nonnull(text);
        if (hang) {
            ck_assert_msg(s >= 0.9, "exited after %.2f s, before its 1 s deadline", s);
            ck_assert_msg(strstr(text, "test: stopping took more than 1 s"), "%s", text);
        } else {
            ck_assert_msg(!strstr(text, "stopping took"), "%s", text);
        }
        free(text);
    }
    unlink(log);
}
END_TEST

START_TEST(runtime_dir_rules)
{
    char out[512], url[200];
    char base[400];
    snprintf(base, sizeof base, "%s/xdg", test_tmpdir());
    ck_assert_int_eq(mkdir(base, 0700), 0);
    setenv("XDG_RUNTIME_DIR", base, 1);
    ck_assert_int_eq(ipc_runtime_dir(NULL, "model-a", out, sizeof out), 0);
    char want[600];
    snprintf(want, sizeof want, "%s/strata/model-a", base);
    ck_assert_str_eq(out, want);
    struct stat st;
    ck_assert_int_eq(stat(out, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700);
    /* again: it exists and is fine */
    ck_assert_int_eq(ipc_runtime_dir(NULL, "model-a", out, sizeof out), 0);
    /* opened to others: refused with the fix in the message */
    ck_assert_int_eq(chmod(out, 0755), 0);
    ck_assert_int_eq(ipc_runtime_dir(NULL, "model-a", out, sizeof out), STRATA_EPERM);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "mode 755"));
    ck_assert_int_eq(ipc_runtime_dir(NULL, "../x", out, sizeof out), STRATA_EINVAL);
    char small[8];
    ck_assert_int_eq(ipc_runtime_dir(out, NULL, small, sizeof small), STRATA_ELIMIT);

    char longdir[120];
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = '\0';
    ck_assert_int_eq(ipc_url(longdir, "s.sock", url, sizeof url), STRATA_ELIMIT);
    ck_assert_int_eq(ipc_url("/run/x", "s.sock", url, sizeof url), 0);
    ck_assert_str_eq(url, "ipc:///run/x/s.sock");
}
END_TEST

/* raw_request speaks SP over IPC by hand (an 8-byte handshake, then frames of a type byte, a
 * 64-bit length and a 32-bit request id before the body): 1 if a reply came, 0 if the connection
 * was made but nothing came back, -1 if it could not connect. */
static int raw_request(const char *path)
{
    static const unsigned char hello[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0}; /* req0 */
    unsigned char frame[9 + 4 + 64], in[8];
    void *body;
    size_t len;
    struct msg_builder b;
    msg_begin_request(&b, IPC_PING_OP);
    if (msg_finish(&b, &body, &len) != 0 || len > 64) return -1;
    int fd = raw_connect(path);
    if (fd < 0) {
        free(body);
        return -1;
    }
    frame[0] = 1;
    for (int i = 0; i < 8; i++)
        frame[1 + i] = (unsigned char)((4 + len) >> (56 - 8 * i));
    memcpy(frame + 9, "\x80\x00\x00\x01", 4);
    memcpy(frame + 13, body, len);
    free(body);
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    bool replied = write(fd, hello, 8) == 8 && read(fd, in, 8) == 8 &&
                   write(fd, frame, 13 + len) == (ssize_t)(13 + len) && read(fd, in, 1) == 1 &&
                   in[0] == 1;
    close(fd);
    return replied ? 1 : 0;
}

START_TEST(peers_of_another_uid_are_dropped)
{
    if (geteuid() != 0) {
        printf("SKIP peers_of_another_uid_are_dropped: needs root to act as another uid\n");
        return;
    }
    char dir[512], url[600];
    setup("uid", dir, url);
    struct ipc_server *srv = start(url, 5000, 0);
    /* open the doors that the 0700 directories and the 0600 socket normally keep shut, so only
     * the uid check stands between the stranger and the server */
    ck_assert_int_eq(chmod(test_tmpdir(), 0711), 0);
    ck_assert_int_eq(chmod(dir, 0711), 0);
    ck_assert_int_eq(chmod(url + 6, 0666), 0);
    ck_assert_int_eq(raw_request(url + 6), 1); /* the same uid is answered */
    pid_t pid = fork();
    if (pid == 0) { /* no nng in the child: raw syscalls only */
        if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
        int r = raw_request(url + 6);
        _exit(r == 0 ? 0 : r == 1 ? 1 : 2);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    ck_assert_msg(WEXITSTATUS(status) == 0,
                  "child exit %d (1: a stranger was answered, 2: it could not connect)",
                  WEXITSTATUS(status));
    ipc_server_close(srv);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ipc");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, round_trip_and_errors);
    tcase_add_test(tc, malformed_requests_get_error_replies);
    tcase_add_test(tc, slow_deferred_calls_do_not_block_many_clients);
    tcase_add_test(tc, fast_call_passes_a_pending_slow_one);
    tcase_add_test(tc, oversized_message_drops_only_its_connection);
    tcase_add_test(tc, second_server_on_a_path_is_busy);
    tcase_add_test(tc, without_watchdog_the_listener_dies);
    tcase_add_test(tc, watchdog_revives_the_listener);
    tcase_add_test(tc, default_watchdog_relistens_within_a_second);
    tcase_add_test(tc, stop_with_a_deferred_call_pending);
    tcase_add_test(tc, stop_deadline_ends_a_hung_stop);
    tcase_add_test(tc, stopped_and_continued_server_keeps_its_listener);
    tcase_add_test(tc, runtime_dir_rules);
    tcase_add_test(tc, peers_of_another_uid_are_dropped);
    suite_add_tcase(s, tc);
    return test_run(s);
}
