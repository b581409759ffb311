/* http_test — the HTTP server against clients that misbehave: connections held open by a slow or
 * silent head (slowloris) cannot lock others out, a dribbled head meets its deadline whatever its
 * pace, the connection limit is answered 503 at once, a client that leaves a whole answer it is
 * waiting for is reported, a precheck refuses a request before its body is read, and every request
 * gets its log line. A raw-socket client, an in-process server with a handler that holds requests.
 */
#include "frontend/http.h"

#include "common/base/err.h"
#include "tests/testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static struct http_server *S;
static int PORT;

/* held: requests to /hold wait here unanswered until the test answers them */
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static struct http_req *held[64];
static int n_held;
static atomic_int gone;

static void on_gone(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&gone, 1);
}

static void handler(struct http_req *r, void *ctx)
{
    (void)ctx;
    if (strcmp(http_path(r), "/hold") == 0) {
        http_on_gone(r, on_gone, NULL);
        pthread_mutex_lock(&held_mu);
        held[n_held++] = r;
        pthread_mutex_unlock(&held_mu);
        return; /* answered later, from the test */
    }
    http_set_tokens(r, 3, 5);
    http_respond(r, 200, NULL, "{}", 2, NULL);
}

static unsigned precheck(const struct http_req *r, void *ctx, char *body, size_t cap)
{
    (void)ctx;
    const char *k = http_header(r, "X-Key");
    if (strcmp(http_path(r), "/guarded") != 0 || (k && strcmp(k, "ok") == 0)) return 0;
    snprintf(body, cap, "{\"error\":\"no key\"}");
    return 401;
}

static void start(unsigned limit, unsigned req_timeout)
{
    struct http_opts o = {.conn_limit = limit, .request_timeout_s = req_timeout, .threads = 2};
    atomic_store(&gone, 0);
    n_held = 0;
    ck_assert_int_eq(http_server_start(&o, handler, precheck, NULL, &S), 0);
    PORT = http_server_port(S);
}

static void release_held(void)
{
    pthread_mutex_lock(&held_mu);
    for (int i = 0; i < n_held; i++)
        http_respond(held[i], 200, NULL, "{}", 2, NULL);
    n_held = 0;
    pthread_mutex_unlock(&held_mu);
}

static void stop(void)
{
    release_held();
    http_server_stop(S);
    S = NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* limit_s: how long an answer or a close may take on an idle machine, stretched by
 * test_slowdown(); each stands for "at once" against the server's own 2 s or 30 s deadlines. */
static double limit_s(double s)
{
    return s * test_slowdown();
}

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)PORT)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void put(int fd, const char *s)
{
    ck_assert_int_eq(write(fd, s, strlen(s)), (ssize_t)strlen(s));
}

/* status_within reads a response's status line from fd within timeout_s: the status, 0 when the
 * server closed without one, -1 on timeout. */
static int status_within(int fd, double timeout_s, char *head, size_t cap)
{
    size_t n = 0;
    double end = now_s() + timeout_s;
    while (n + 1 < cap) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ms = (int)((end - now_s()) * 1000);
        if (ms <= 0 || poll(&p, 1, ms) <= 0) return -1;
        ssize_t k = read(fd, head + n, cap - 1 - n);
        if (k <= 0) break;
        n += (size_t)k;
        head[n] = '\0';
        if (strstr(head, "\r\n")) break;
    }
    head[n] = '\0';
    return n >= 12 ? atoi(head + 9) : 0;
}

static int get(const char *path, double timeout_s)
{
    int fd = dial();
    char req[256], head[4096];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
    put(fd, req);
    int st = status_within(fd, timeout_s, head, sizeof head);
    close(fd);
    return st;
}

/* closed_within: the server closed fd (EOF or reset) within timeout_s. */
static bool closed_within(int fd, double timeout_s)
{
    char b[256];
    double end = now_s() + timeout_s;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ms = (int)((end - now_s()) * 1000);
        if (ms <= 0 || poll(&p, 1, ms) <= 0) return false;
        ssize_t k = read(fd, b, sizeof b);
        if (k <= 0) return true;
    }
}

/* Every connection the server serves is held by a client that sent part of a head and dribbles
 * a header byte now and then: a new client is still answered at once (the oldest is shed). */
START_TEST(slowloris_cannot_lock_out)
{
    start(8, 30);
    int slow[8];
    for (int i = 0; i < 8; i++) {
        slow[i] = dial();
        put(slow[i], "GET /x HTTP/1.1\r\nHost: x\r\nX-Slow: ");
    }
    /* 1.2 s of dribbling (stretched by the slowdown): every one is past SHED_MIN_AGE_S, counted
     * from when the server saw it, which under load can be well after our connect */
    for (int t = 0; t < 6 * test_slowdown(); t++) {
        for (int i = 0; i < 8; i++)
            if (write(slow[i], "a", 1) != 1) {
            } /* a shed one may be closed already */
        usleep(200 * 1000);
    }
    double t0 = now_s();
    for (int k = 0; k < 3; k++)
        ck_assert_int_eq(get("/health", limit_s(2.0)), 200);
    ck_assert_msg(now_s() - t0 < limit_s(2.0), "three requests took %.1f s", now_s() - t0);
    for (int i = 0; i < 8; i++)
        close(slow[i]);
    stop();
}
END_TEST

/* A head dribbled a byte every 300 ms never goes idle, and is closed at its 2 s deadline. */
START_TEST(head_deadline_not_idle_timer)
{
    start(64, 2);
    int fd = dial();
    put(fd, "GET /x HTTP/1.1\r\nHost: x\r\nX-Slow: ");
    double t0 = now_s();
    bool closed = false;
    while (!closed && now_s() - t0 < limit_s(6)) {
        if (write(fd, "a", 1) != 1) break;
        closed = closed_within(fd, 0.3);
    }
    double took = now_s() - t0;
    ck_assert_msg(closed || took < limit_s(6), "a dribbled head was still open after %.1f s", took);
    ck_assert_msg(took > 1.5 && took < 2.0 + limit_s(2.0), "closed after %.1f s, want about 2",
                  took);
    close(fd);
    /* a body dribbled after a whole head meets the same deadline */
    fd = dial();
    put(fd, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n");
    t0 = now_s();
    closed = false;
    while (!closed && now_s() - t0 < limit_s(6)) {
        if (write(fd, "a", 1) != 1) break;
        closed = closed_within(fd, 0.3);
    }
    took = now_s() - t0;
    ck_assert_msg(took > 1.5 && took < 2.0 + limit_s(2.0),
                  "a dribbled body closed after %.1f s, want about 2", took);
    close(fd);
    stop();
}
END_TEST

/* Every served connection busy with a request (nothing to shed): the next one is answered 503
 * with Retry-After at once instead of waiting in the listen backlog. */
START_TEST(limit_answered_at_once)
{
    start(4, 30);
    int fds[4];
    for (int i = 0; i < 4; i++) {
        fds[i] = dial();
        put(fds[i], "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    for (int i = 0; i < 200 * test_slowdown(); i++) {
        pthread_mutex_lock(&held_mu);
        int n = n_held;
        pthread_mutex_unlock(&held_mu);
        if (n == 4) break;
        usleep(10 * 1000);
    }
    int fd = dial();
    put(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    char head[4096];
    double t0 = now_s();
    int st = status_within(fd, limit_s(3.0), head, sizeof head);
    ck_assert_msg(st == 503, "status %d after %.1f s: %s", st, now_s() - t0, head);
    ck_assert_ptr_nonnull(strcasestr(head, "Retry-After: 1"));
    ck_assert_ptr_nonnull(strstr(head, "too_many_connections"));
    close(fd);
    release_held();
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(status_within(fds[i], limit_s(3.0), head, sizeof head), 200);
        close(fds[i]);
    }
    /* served again once the server has seen those clients close */
    int again = 0;
    for (int i = 0; i < 40 && (again = get("/health", limit_s(3.0))) != 200; i++)
        usleep(50 * 1000);
    ck_assert_int_eq(again, 200);
    stop();
}
END_TEST

/* A client that closes its connection while its whole answer is awaited is reported (on_gone),
 * though MHD watches no suspended connection. */
START_TEST(whole_answer_disconnect_reported)
{
    start(16, 30);
    int fd = dial();
    put(fd, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    for (int i = 0; i < 200 * test_slowdown(); i++) {
        pthread_mutex_lock(&held_mu);
        int n = n_held;
        pthread_mutex_unlock(&held_mu);
        if (n == 1) break;
        usleep(10 * 1000);
    }
    usleep(300 * 1000);
    ck_assert_int_eq(atomic_load(&gone), 0); /* still there: not gone */
    close(fd);
    for (int i = 0; i < 100 * test_slowdown() && atomic_load(&gone) == 0; i++)
        usleep(20 * 1000);
    ck_assert_int_eq(atomic_load(&gone), 1);
    stop();
    ck_assert_int_eq(atomic_load(&gone), 1); /* once */
}
END_TEST

/* A refused head is answered without waiting for the body it announced. */
START_TEST(precheck_before_body)
{
    start(16, 30);
    int fd = dial();
    put(fd, "POST /guarded HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n");
    char head[4096];
    ck_assert_int_eq(status_within(fd, limit_s(2.0), head, sizeof head), 401);
    close(fd);
    fd = dial();
    put(fd, "POST /guarded HTTP/1.1\r\nHost: x\r\nX-Key: ok\r\nContent-Length: 2\r\n"
            "Connection: close\r\n\r\n{}");
    ck_assert_int_eq(status_within(fd, limit_s(2.0), head, sizeof head), 200);
    close(fd);
    stop();
}
END_TEST

/* One line per request: method, path, client, status, time, tokens. */
START_TEST(request_log_line)
{
    char log[700];
    snprintf(log, sizeof log, "%s/http-log.txt", test_tmpdir());
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600), saved = dup(2);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 2);
    close(fd);
    start(16, 30);
    ck_assert_int_eq(get("/health", limit_s(2.0)), 200);
    stop();
    dup2(saved, 2);
    close(saved);
    char *out = test_read_file(log, NULL);
    ck_assert_msg(out && strstr(out, "request: GET /health 127.0.0.1 200 ") &&
                      strstr(out, " ms, prompt 3 tokens, generated 5"),
                  "log:\n%s", out ? out : "");
    free(out);
    unlink(log);
}
END_TEST

int main(void)
{
    /* as strata-frontend's main: a write to a connection the server closed (shed) fails with
     * EPIPE instead of ending the test binary */
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("http");
    TCase *tc = tcase_create("abuse");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, slowloris_cannot_lock_out);
    tcase_add_test(tc, head_deadline_not_idle_timer);
    tcase_add_test(tc, limit_answered_at_once);
    tcase_add_test(tc, whole_answer_disconnect_reported);
    tcase_add_test(tc, precheck_before_body);
    tcase_add_test(tc, request_log_line);
    suite_add_tcase(s, tc);
    return test_run(s);
}
