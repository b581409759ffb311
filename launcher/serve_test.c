/* serve_test — `strata serve` end to end on a tiny fixture (CPU backend, bit-exact mode), the
 * real binaries of $STRATA_BUILD_DIR under the real supervisor:
 *   - a worker killed -9 mid-stream with 4 frontends x 4 streams open: it is restarted, every
 *     stream completes with the text of an undisturbed run, and the arena read nothing again
 *     (same arena pid and load, built once); prints the restart-to-first-token time;
 *   - the arena killed -9 while a worker serves: the worker keeps serving, the new arena adopts
 *     the segments (adopted, adoptions 1), `strata run --name` still gives the in-process ids;
 *   - a frontend killed -9 mid-stream: its requests end when their leases lapse;
 *   - two workers, requests spread over both, one killed -9 (serve restarts it), then one stopped
 *     (SIGSTOP: its calls time out): the frontend moves their streams to the other worker, where
 *     every one completes unchanged;
 *   - Ctrl-C (SIGINT) stops everything in order and leaves no segment or socket behind.
 * Skips with a message when strata-worker or strata-frontend are not built. nng is opened only
 * inside the tests (Check forks each one), after the children were spawned.
 */
#include "arena-server/arena_ctl.h"
#include "common/base/err.h"
#include "common/ipc/msg.h"
#include "common/ipc/wclient.h"
#include "launcher/sup_svc.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define NAME       "tiny"
#define CANDIDATES 24 /* prompts tried for long greedy continuations */
/* tokens per stream: Debug and sanitizer builds compute ~10x slower, and shorter streams keep the
 * test at seconds there while every stream is still running when the kill comes */
#if defined(__OPTIMIZE__) && !defined(__SANITIZE_ADDRESS__)
#define GEN_TOKENS 400
#else
#define GEN_TOKENS 100
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* limit_s and limit_ms: how long an event (serve coming up, a worker back, a status answer) may
 * take on an idle machine, stretched by test_slowdown(): on CI's loaded 2-core machine every one
 * of them takes longer, and none of them is what a test measures. */
static double limit_s(double s)
{
    return s * test_slowdown();
}

static int limit_ms(int ms)
{
    return (int)(ms * test_slowdown());
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static const char *bin(const char *name)
{
    static char path[4][1024];
    static int k;
    char *p = path[k++ % 4];
    const char *b = getenv("STRATA_BUILD_DIR");
    snprintf(p, sizeof path[0], "%s/%s", b && *b ? b : ".", name);
    return p;
}

/* have_bins says whether the binaries are built, printing why the test skips otherwise. */
static bool have_bins(void)
{
    const char *names[] = {"strata", "strata-arena", "strata-worker", "strata-frontend"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (access(bin(names[i]), X_OK) != 0) {
            printf("SKIP: %s is not built yet (this test needs the whole system)\n", bin(names[i]));
            return false;
        }
    }
    return true;
}

/* A strata serve under test and its directories. */
struct svc {
    pid_t pid;
    char dir[600], run[700], shm[700], logs[700], model[700];
    int port, n_frontends, n_workers;
};

static json_t *state(const struct svc *s)
{
    char path[800];
    snprintf(path, sizeof path, "%s/%s", s->run, SUP_SVC_STATE_FILE);
    return json_load_file(path, 0, NULL);
}

static int state_pid(const struct svc *s, const char *list, int i)
{
    json_t *st = state(s);
    json_t *e = list ? json_array_get(json_object_get(st, list), (size_t)i) : st;
    int pid = (int)json_integer_value(json_object_get(e, list ? "pid" : "arena_pid"));
    json_decref(st);
    return pid;
}

static int http_health(int port)
{
    int status = 0;
    return sup_svc_http_status("127.0.0.1", port, "/health", 1000, &status) == 0 ? status : 0;
}

/* svc_start runs `strata serve` on a fresh fixture with the given extra options and waits until
 * every frontend answers /health 200. */
static void svc_prepare(struct svc *s, const char *tag)
{
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "%s/%s", test_tmpdir(), tag);
    snprintf(s->run, sizeof s->run, "%s/run", s->dir);
    snprintf(s->shm, sizeof s->shm, "%s/shm", s->dir);
    snprintf(s->logs, sizeof s->logs, "%s/logs", s->dir);
    snprintf(s->model, sizeof s->model, "%s/tiny.gguf", s->dir);
    ck_assert_int_eq(mkdir(s->dir, 0700), 0);
    mkdir(s->shm, 0700);
    mkdir(s->logs, 0700);
    struct fixture_opts fo = {.type = "q8_0"};
    ck_assert_int_eq(fixture_write(&fo, s->model), 0);
}

/* svc_launch starts strata serve on s's fixture and directories. */
static void svc_launch(struct svc *s, int n_workers, int n_frontends, const char *const *extra)
{
    s->n_workers = n_workers;
    s->n_frontends = n_frontends;
    s->port = test_free_ports(n_frontends);
    char port[16], nw[16], nf[16], log[800];
    snprintf(port, sizeof port, "%d", s->port);
    snprintf(nw, sizeof nw, "%d", n_workers);
    snprintf(nf, sizeof nf, "%d", n_frontends);
    snprintf(log, sizeof log, "%s/serve.log", s->logs);
    const char *argv[40] = {
        bin("strata"),   "serve", s->model,      "--name", NAME,          "--port",    port,
        "--workers",     nw,      "--frontends", nf,       "--bit-exact", "--shm-dir", s->shm,
        "--runtime-dir", s->run,  "--log-dir",   s->logs,  "--threads",   "1"};
    int n = 20;
    for (int i = 0; extra && extra[i]; i++)
        argv[n++] = extra[i];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    ck_assert_int_eq(posix_spawn(&s->pid, argv[0], &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    for (double t0 = now_s(); now_s() - t0 < limit_s(60); sleep_ms(50)) {
        int st;
        ck_assert_msg(waitpid(s->pid, &st, WNOHANG) == 0, "strata serve exited; see %s", log);
        bool up = state_pid(s, "frontends", n_frontends - 1) > 0;
        for (int i = 0; up && i < n_frontends; i++)
            up = http_health(s->port + i) == 200;
        if (up) return;
    }
    ck_abort_msg("strata serve did not come up in %.0f s; see %s", limit_s(60), log);
}

static void svc_start(struct svc *s, const char *tag, int n_workers, int n_frontends,
                      const char *const *extra)
{
    svc_prepare(s, tag);
    svc_launch(s, n_workers, n_frontends, extra);
}

/* count_entries counts the files in dir whose name does not end in .lock. */
static int count_entries(const char *dir, char *first, size_t cap)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || (len > 5 && strcmp(e->d_name + len - 5, ".lock") == 0)) continue;
        if (!n++) snprintf(first, cap, "%s", e->d_name);
    }
    if (d) closedir(d);
    return n;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* svc_stop sends SIGINT (Ctrl-C) and checks that serve exits 0 leaving no segment or socket. */
static void svc_interrupt(struct svc *s)
{
    int st;
    kill(s->pid, SIGINT);
    double t0 = now_s();
    while (waitpid(s->pid, &st, WNOHANG) == 0) {
        ck_assert_msg(now_s() - t0 < limit_s(30), "strata serve did not stop in %.0f s",
                      limit_s(30));
        sleep_ms(20);
    }
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "strata serve: wait status %#x", st);
}

static void svc_stop(struct svc *s)
{
    svc_interrupt(s);
    char first[256] = "";
    ck_assert_msg(count_entries(s->shm, first, sizeof first) == 0, "left in shm: %s", first);
    ck_assert_msg(count_entries(s->run, first, sizeof first) == 0, "left in run: %s", first);
    nftw(s->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- an HTTP client for /v1/completions (the frontend's SSE or JSON) ---- */

struct call {
    int port;
    char prompt[64];
    int max_tokens;
    double temperature;
    int seed;
    bool stream;
    _Atomic int chunks; /* SSE events seen so far */
    double max_gap;     /* longest wait between two reads of the answer after the first, s */
    char *text;         /* the completion's text (malloc'd; may hold NULs: a random model) */
    size_t len;
    char finish[16];
    int status;
};

static char *dechunk(char *body)
{
    char *out = body, *p = body;
    for (;;) {
        char *end;
        long n = strtol(p, &end, 16);
        if (end == p || n <= 0) break;
        p = strstr(end, "\r\n");
        if (!p) break;
        p += 2;
        memmove(out, p, (size_t)n);
        out += n;
        p += n + 2;
    }
    *out = '\0';
    return body;
}

static void parse_event(struct call *c, json_t *o)
{
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    const char *t = json_string_value(json_object_get(ch, "text"));
    const char *f = json_string_value(json_object_get(ch, "finish_reason"));
    if (t) {
        size_t n = json_string_length(json_object_get(ch, "text"));
        c->text = realloc(c->text, c->len + n + 1);
        memcpy(c->text + c->len, t, n + 1);
        c->len += n;
    }
    if (f) snprintf(c->finish, sizeof c->finish, "%s", f);
}

static void *call_main(void *arg)
{
    struct call *c = arg;
    char body[512], req[1024];
    int bl =
        snprintf(body, sizeof body,
                 "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":%g,\"seed\":%d,"
                 "\"stream\":%s}",
                 c->prompt, c->max_tokens, c->temperature, c->seed, c->stream ? "true" : "false");
    int rl = snprintf(req, sizeof req,
                      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                      "application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
                      bl, body);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->text = calloc(1, 1);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || write(fd, req, (size_t)rl) != rl) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, got = 0;
    char *buf = malloc(cap);
    for (double t_last = 0;;) {
        if (got + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + got, cap - got - 1);
        if (r <= 0) break;
        double t = now_s();
        if (t_last > 0 && t - t_last > c->max_gap) c->max_gap = t - t_last;
        t_last = t;
        buf[got + (size_t)r] = '\0';
        for (char *p = buf + (got > 6 ? got - 6 : 0); (p = strstr(p, "data: ")) != NULL; p += 6)
            atomic_fetch_add(&c->chunks, 1);
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    sscanf(buf, "HTTP/1.%*d %d", &c->status);
    char *b = strstr(buf, "\r\n\r\n");
    if (b) {
        b += 4;
        if (strcasestr(buf, "transfer-encoding: chunked")) dechunk(b);
        if (c->stream) {
            for (char *p = b; (p = strstr(p, "data: ")) != NULL;) {
                p += 6;
                char *e = strstr(p, "\n\n");
                if (e) *e = '\0';
                json_t *o = json_loads(p, JSON_ALLOW_NUL, NULL);
                if (o) parse_event(c, o);
                json_decref(o);
                if (!e) break;
                p = e + 2;
            }
        } else {
            json_t *o = json_loads(b, JSON_ALLOW_NUL, NULL);
            if (o) parse_event(c, o);
            json_decref(o);
        }
    }
    free(buf);
    return NULL;
}

static void call_init(struct call *c, int port, int i, int max_tokens, bool stream)
{
    memset(c, 0, sizeof *c);
    c->port = port;
    snprintf(c->prompt, sizeof c->prompt, "Story number %d:", i);
    c->max_tokens = max_tokens;
    /* half greedy, half sampled with a seed: a resumed stream must keep both */
    c->temperature = i % 2 ? 0.7 : 0.0;
    c->seed = 1000 + i;
    c->stream = stream;
}

/* long_prompts runs the candidates undisturbed and keeps the n with the longest completions
 * (most run to max_tokens: a random model rarely samples its EOS once it loops), so every stream
 * is still running when a test kills something. ref[k] is prompt[k]'s undisturbed call. */
static void long_prompts(int port, int n, int *prompt, struct call *ref)
{
    static struct call all[CANDIDATES];
    pthread_t th[CANDIDATES];
    for (int i = 0; i < CANDIDATES; i++) {
        call_init(&all[i], port, i, GEN_TOKENS, false);
        pthread_create(&th[i], NULL, call_main, &all[i]);
    }
    for (int i = 0; i < CANDIDATES; i++)
        pthread_join(th[i], NULL);
    bool used[CANDIDATES] = {false};
    for (int k = 0; k < n; k++) {
        int best = -1;
        for (int i = 0; i < CANDIDATES; i++) {
            ck_assert_int_eq(all[i].status, 200);
            if (!used[i] && (best < 0 || all[i].len > all[best].len)) best = i;
        }
        used[best] = true;
        prompt[k] = best;
        ref[k] = all[best];
    }
    for (int i = 0; i < CANDIDATES; i++)
        if (!used[i]) free(all[i].text);
}

/* run_streams starts n streams (stream k: prompt[k] on frontend port + k % n_ports) and returns
 * once every one has seen at least min_chunks events. */
static void run_streams(struct call *c, pthread_t *th, int n, const int *prompt, int port,
                        int n_ports, int max_tokens, int min_chunks)
{
    for (int k = 0; k < n; k++) {
        call_init(&c[k], port + k % n_ports, prompt[k], max_tokens, true);
        pthread_create(&th[k], NULL, call_main, &c[k]);
    }
    for (double t0 = now_s();; sleep_ms(2)) {
        int ready = 0;
        for (int k = 0; k < n; k++)
            ready += atomic_load(&c[k].chunks) >= min_chunks;
        if (ready == n) return;
        ck_assert_msg(now_s() - t0 < limit_s(30), "only %d of %d streams started in %.0f s", ready,
                      n, limit_s(30));
    }
}

static void check_same(struct call *got, const struct call *ref, int n)
{
    for (int k = 0; k < n; k++) {
        ck_assert_int_eq(got[k].status, 200);
        ck_assert_msg(got[k].len == ref[k].len && memcmp(got[k].text, ref[k].text, got[k].len) == 0,
                      "stream %d (%s): text differs from the undisturbed run (%zu vs %zu bytes)", k,
                      got[k].prompt, got[k].len, ref[k].len);
        ck_assert_str_eq(got[k].finish, ref[k].finish);
    }
}

static void free_calls(struct call *c, int n)
{
    for (int k = 0; k < n; k++)
        free(c[k].text);
}

/* worker_figures reads a worker's status within timeout_ms (pid 0 when it does not answer). */
static int worker_figures(const char *url, struct wclient_status *s, int timeout_ms)
{
    struct wclient_opts wo = {.timeout_ms = timeout_ms};
    struct wclient *c;
    struct wclient_hello h = {0};
    if (wclient_open(url, &wo, &c) != 0) return 0;
    int rv = wclient_hello(c, &h);
    if (!rv) rv = wclient_status(c, s);
    wclient_close(c);
    return rv ? 0 : h.pid;
}

/* metric reads a counter or gauge from the frontend's /metrics (-1 when it cannot); a name ending
 * in '{' matches the first series of that name, whatever its labels. */
static double metric(int port, const char *name)
{
    char req[128], buf[32768], line[160];
    int n = snprintf(req, sizeof req,
                     "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    size_t got = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, req, (size_t)n) == n)
        for (ssize_t r;
             got < sizeof buf - 1 && (r = read(fd, buf + got, sizeof buf - 1 - got)) > 0;)
            got += (size_t)r;
    close(fd);
    buf[got] = '\0';
    const bool any = name[strlen(name) - 1] == '{';
    snprintf(line, sizeof line, any ? "\n%s" : "\n%s ", name);
    const char *p = strstr(buf, line);
    if (p && any) p = strstr(p, "} ");
    return p ? atof(p + (any ? 2 : strlen(line))) : -1;
}

static json_t *arena_status(const struct svc *s)
{
    struct msg reply;
    int rv = arena_ctl_request(s->run, NAME, "status", false, limit_ms(2000), &reply);
    if (rv) return NULL;
    json_t *o = json_object();
    int64_t i;
    double d;
    bool b;
    const char *keys[] = {"pid", "registrations", "adoptions"};
    for (size_t k = 0; k < 3; k++)
        if (msg_get_i64(&reply, NULL, keys[k], 0, INT64_MAX, &i) == 0)
            json_object_set_new(o, keys[k], json_integer(i));
    if (msg_get_f64(&reply, NULL, "load_s", 0, 1e9, &d) == 0)
        json_object_set_new(o, "load_s", json_real(d));
    if (msg_get_bool(&reply, NULL, "adopted", &b) == 0)
        json_object_set_new(o, "adopted", json_boolean(b));
    msg_free(&reply);
    return o;
}

static int count_in_file(const char *path, const char *needle)
{
    char *s = test_read_file(path, NULL);
    int n = 0;
    for (const char *p = s; p && (p = strstr(p, needle)) != NULL; p++)
        n++;
    free(s);
    return n;
}

START_TEST(worker_killed_mid_stream)
{
    if (!have_bins()) return;
    enum { N = 16, FRONTENDS = 4 };
    struct svc s;
    svc_start(&s, "worker-kill", 1, FRONTENDS, NULL);
    static struct call ref[N], got[N];
    int prompt[N];
    long_prompts(s.port, N, prompt, ref);
    char url[SUP_SVC_URL_MAX], log[800];
    ck_assert_int_eq(sup_svc_worker_url(s.run, 0, url, sizeof url), 0);
    json_t *a0 = arena_status(&s);
    ck_assert_ptr_nonnull(a0);
    int old = state_pid(&s, "workers", 0);
    ck_assert_int_gt(old, 0);

    pthread_t th[N];
    run_streams(got, th, N, prompt, s.port, FRONTENDS, GEN_TOKENS, 3);
    int running = 0;
    for (int k = 0; k < N; k++)
        running += got[k].finish[0] == '\0';
    double t_kill = now_s();
    ck_assert_int_eq(kill(old, SIGKILL), 0);
    /* the restarted worker: its first answer, then its first token (its counters start at 0) */
    /* A worker busy with 16 resumed streams on a loaded 2-core box can take a while to answer a
     * status request: each poll waits up to a second, the whole wait is generous, and the failure
     * says which of the two steps did not come. */
    double t_hello = 0, t_tok = 0;
    while (!t_tok) {
        ck_assert_msg(now_s() - t_kill < limit_s(60), "the restarted worker %s within %.0f s",
                      t_hello ? "answered but made no "
                                "token"
                              : "did not answer",
                      limit_s(60));
        struct wclient_status ws = {0};
        int pid = worker_figures(url, &ws, limit_ms(1000));
        if (pid && pid != old && !t_hello) t_hello = now_s();
        if (pid && pid != old && ws.tokens_generated > 0) t_tok = now_s();
        if (!t_tok) sleep_ms(2);
    }
    for (int k = 0; k < N; k++)
        pthread_join(th[k], NULL);
    check_same(got, ref, N);

    json_t *a1 = arena_status(&s);
    ck_assert_ptr_nonnull(a1);
    ck_assert_int_eq(json_integer_value(json_object_get(a1, "pid")),
                     json_integer_value(json_object_get(a0, "pid")));
    ck_assert(json_real_value(json_object_get(a1, "load_s")) ==
              json_real_value(json_object_get(a0, "load_s")));
    ck_assert_int_eq(json_integer_value(json_object_get(a1, "registrations")),
                     json_integer_value(json_object_get(a0, "registrations")) + 1);
    snprintf(log, sizeof log, "%s/arena.log", s.logs);
    ck_assert_int_eq(count_in_file(log, "built arena"), 1);
    snprintf(log, sizeof log, "%s/serve.log", s.logs);
    ck_assert_int_eq(count_in_file(log, "was killed by signal 9"), 1);
    printf("worker kill -9 with %d of %d streams mid-flight (4 frontends x 4 streams): the "
           "restarted worker (after serve's 200 ms backoff) answered after %.0f ms and made its "
           "first token after %.0f ms; all "
           "%d texts equal the undisturbed run; arena pid %lld kept, built once, %lld "
           "registrations\n",
           running, N, (t_hello - t_kill) * 1e3, (t_tok - t_kill) * 1e3, N,
           (long long)json_integer_value(json_object_get(a1, "pid")),
           (long long)json_integer_value(json_object_get(a1, "registrations")));
    json_decref(a0);
    json_decref(a1);
    free_calls(got, N);
    free_calls(ref, N);
    svc_stop(&s);
}
END_TEST

/* run_ids runs `strata run ARGS --json` and returns its "ids" (caller decrefs). */
static json_t *run_ids(const struct svc *s, const char *const *args)
{
    char out[800];
    snprintf(out, sizeof out, "%s/run-%d.json", s->logs, (int)getpid());
    const char *argv[32] = {bin("strata"), "run"};
    int n = 2;
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int st;
    ck_assert_int_eq(posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "strata run failed");
    json_t *o = json_load_file(out, 0, NULL);
    ck_assert_ptr_nonnull(o);
    json_t *ids = json_incref(json_object_get(o, "ids"));
    json_decref(o);
    ck_assert_int_gt(json_array_size(ids), 0);
    return ids;
}

START_TEST(arena_restarted_while_serving)
{
    if (!have_bins()) return;
    enum { N = 4 };
    struct svc s;
    svc_start(&s, "arena-kill", 1, 1, NULL);
    static struct call ref[N], got[N];
    int prompt[N];
    long_prompts(s.port, N, prompt, ref);
    json_t *a0 = arena_status(&s);
    ck_assert_ptr_nonnull(a0);
    ck_assert(json_is_false(json_object_get(a0, "adopted")));
    int old_arena = (int)json_integer_value(json_object_get(a0, "pid"));
    int worker = state_pid(&s, "workers", 0);

    pthread_t th[N];
    run_streams(got, th, N, prompt, s.port, 1, GEN_TOKENS, 3);
    ck_assert_int_eq(kill(old_arena, SIGKILL), 0);
    json_t *a1 = NULL;
    for (double t0 = now_s(); !a1; sleep_ms(20)) {
        ck_assert_msg(now_s() - t0 < limit_s(30), "no new arena server within %.0f s", limit_s(30));
        a1 = arena_status(&s);
        if (a1 && json_integer_value(json_object_get(a1, "pid")) == old_arena) {
            json_decref(a1);
            a1 = NULL;
        }
    }
    for (int k = 0; k < N; k++)
        pthread_join(th[k], NULL);
    check_same(got, ref, N);
    /* the new server adopted the segments: nothing read, the worker untouched */
    ck_assert(json_is_true(json_object_get(a1, "adopted")));
    ck_assert_int_eq(json_integer_value(json_object_get(a1, "adoptions")), 1);
    ck_assert_int_eq(state_pid(&s, "workers", 0), worker);
    char log[800];
    snprintf(log, sizeof log, "%s/arena.log", s.logs);
    ck_assert_int_eq(count_in_file(log, "built arena"), 1);
    ck_assert_int_eq(count_in_file(log, "adopted arena"), 1);

    /* strata run --name uses the service and gives the in-process reference's ids */
    const char *remote[] = {"--name", NAME, "--runtime-dir", s.run, "--ids",  "1,2,3,4",
                            "-n",     "24", "--temp",        "0",   "--json", NULL};
    const char *local[] = {s.model, "--ids", "1,2,3,4", "-n", "24", "--temp", "0", "--json", NULL};
    json_t *r = run_ids(&s, remote), *l = run_ids(&s, local);
    ck_assert(json_equal(r, l));
    json_decref(r);
    json_decref(l);
    json_decref(a0);
    json_decref(a1);
    free_calls(got, N);
    free_calls(ref, N);
    svc_stop(&s);
}
END_TEST

START_TEST(frontend_killed_leases_lapse)
{
    if (!have_bins()) return;
    enum { N = 16, LONG = 4000, LEASE_S = 1 };
    struct svc s;
    const char *extra[] = {"--orphan-timeout", "1", NULL};
    svc_start(&s, "frontend-kill", 1, 1, extra);
    static struct call ref[N], got[N];
    int prompt[N];
    long_prompts(s.port, N, prompt, ref);
    char url[SUP_SVC_URL_MAX];
    ck_assert_int_eq(sup_svc_worker_url(s.run, 0, url, sizeof url), 0);
    int fe = state_pid(&s, "frontends", 0);

    pthread_t th[N];
    run_streams(got, th, N, prompt, s.port, 1, LONG, 3);
    struct wclient_status w0 = {0}, w1 = {0}, w2 = {0};
    ck_assert_int_gt(worker_figures(url, &w0, limit_ms(1000)), 0);
    ck_assert_msg(w0.running + w0.queued > 0, "no request was running when the frontend died");
    double t_kill = now_s();
    ck_assert_int_eq(kill(fe, SIGKILL), 0);
    for (int k = 0; k < N; k++)
        pthread_join(th[k], NULL); /* their connections broke */
    double t_idle = 0;
    while (!t_idle) {
        ck_assert_msg(now_s() - t_kill < LEASE_S + limit_s(10),
                      "requests still running %.1f s after the "
                      "frontend died",
                      now_s() - t_kill);
        ck_assert_int_gt(worker_figures(url, &w1, limit_ms(1000)), 0);
        if (w1.running + w1.queued == 0)
            t_idle = now_s();
        else
            sleep_ms(20);
    }
    sleep_ms(500);
    ck_assert_int_gt(worker_figures(url, &w2, limit_ms(1000)), 0);
    ck_assert_uint_eq(w2.tokens_generated, w1.tokens_generated); /* nothing runs on */
    /* cut short: had they run to the end, the streams would have made N * LONG tokens */
    uint64_t made = w1.tokens_generated - w0.tokens_generated;
    ck_assert_msg(made < (uint64_t)N * LONG / 2, "%llu tokens after the kill",
                  (unsigned long long)made);
    /* serve restarted the frontend, which serves again */
    for (double t0 = now_s(); http_health(s.port) != 200; sleep_ms(50))
        ck_assert_msg(now_s() - t0 < limit_s(30), "the frontend did not come back");
    ck_assert_int_ne(state_pid(&s, "frontends", 0), fe);
    struct call again;
    call_init(&again, s.port, prompt[0], GEN_TOKENS, false);
    call_main(&again);
    ck_assert(again.len == ref[0].len && memcmp(again.text, ref[0].text, again.len) == 0);
    printf("frontend kill -9 with %u requests running: the worker was idle %.2f s later (lease "
           "%d s), %llu tokens made meanwhile of the %d the requests asked for\n",
           w0.running + w0.queued, t_idle - t_kill, LEASE_S, (unsigned long long)made, N * LONG);
    free(again.text);
    free_calls(got, N);
    free_calls(ref, N);
    svc_stop(&s);
}
END_TEST

/* max_gap is the longest pause any of n streams saw between two reads, in ms. */
static double max_gap_ms(const struct call *c, int n)
{
    double g = 0;
    for (int k = 0; k < n; k++)
        g = c[k].max_gap > g ? c[k].max_gap : g;
    return g * 1e3;
}

START_TEST(two_workers_one_killed)
{
    if (!have_bins()) return;
    enum { N = 8 };
    struct svc s;
    svc_start(&s, "two-workers", 2, 1, NULL);
    static struct call ref[N], got[N];
    int prompt[N];
    long_prompts(s.port, N, prompt, ref);
    char url[2][SUP_SVC_URL_MAX];
    struct wclient_status w[2] = {{0}}, after[2] = {{0}};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(sup_svc_worker_url(s.run, i, url[i], sizeof url[i]), 0);
        ck_assert_int_gt(worker_figures(url[i], &w[i], limit_ms(1000)), 0);
        /* the frontend spread the undisturbed requests over both */
        ck_assert_msg(w[i].requests > 0, "worker %d got no request", i);
    }
    /* worker 1 killed -9: serve restarts it within a second, but its streams finish on worker 0
     * (the restarted worker lost them; moving costs the same prefill as resuming there) */
    int victim = state_pid(&s, "workers", 1);
    pthread_t th[N];
    run_streams(got, th, N, prompt, s.port, 1, GEN_TOKENS, 3);
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    for (int k = 0; k < N; k++)
        pthread_join(th[k], NULL);
    check_same(got, ref, N);
    double moves = metric(s.port, "strata_stream_moves_total"), gap = max_gap_ms(got, N);
    ck_assert_msg(moves >= 1, "the frontend moved %g streams", moves);
    ck_assert_int_gt(worker_figures(url[0], &after[0], limit_ms(1000)), 0);
    int back = worker_figures(url[1], &after[1], limit_ms(1000));
    ck_assert_msg(back > 0 && back != victim, "worker 1 was not restarted");
    ck_assert_msg(after[1].requests == 0 && after[1].tokens_generated == 0,
                  "the restarted worker 1 took %llu requests, made %llu tokens",
                  (unsigned long long)after[1].requests,
                  (unsigned long long)after[1].tokens_generated);
    printf("two workers (%llu and %llu requests undisturbed), worker 1 killed -9 mid-stream: "
           "%g streams moved to worker 0, all %d completed unchanged, the longest pause a "
           "client saw was %.0f ms; worker 0 made %llu more tokens, the restarted worker 1 (pid "
           "%d) none\n",
           (unsigned long long)w[0].requests, (unsigned long long)w[1].requests, moves, N, gap,
           (unsigned long long)(after[0].tokens_generated - w[0].tokens_generated), back);
    free_calls(got, N);

    /* worker 0 stopped (SIGSTOP: alive to serve, silent to the frontend): its calls time out
     * and its streams move to worker 1 after the failover time */
    int stopped = state_pid(&s, "workers", 0);
    ck_assert_int_gt(worker_figures(url[1], &w[1], limit_ms(1000)), 0);
    run_streams(got, th, N, prompt, s.port, 1, GEN_TOKENS, 3);
    ck_assert_int_eq(kill(stopped, SIGSTOP), 0);
    for (int k = 0; k < N; k++)
        pthread_join(th[k], NULL);
    ck_assert_int_eq(kill(stopped, SIGCONT), 0);
    check_same(got, ref, N);
    double moves2 = metric(s.port, "strata_stream_moves_total") - moves;
    ck_assert_msg(moves2 >= 1, "the frontend moved %g streams off the stopped worker", moves2);
    ck_assert_int_gt(worker_figures(url[1], &after[1], limit_ms(1000)), 0);
    ck_assert_uint_ge(after[1].requests - w[1].requests, (uint64_t)moves2);
    printf("worker 0 stopped (SIGSTOP) mid-stream: %g streams moved to worker 1, all %d "
           "completed unchanged, the longest pause a client saw was %.0f ms (the frontend's "
           "--failover-ms 1500 past a poll's 1 s wait)\n",
           moves2, N, max_gap_ms(got, N));
    free_calls(got, N);
    free_calls(ref, N);
    svc_stop(&s);
}
END_TEST

/* run_cmd runs `strata ARGS` with stdout and stderr to out; returns the exit status. */
static int run_cmd(const char *const *args, const char *out)
{
    const char *argv[32] = {bin("strata")};
    int n = 1;
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int st;
    ck_assert_int_eq(posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void expect(const char *const *args, int status, const char *needle)
{
    char out[700];
    snprintf(out, sizeof out, "%s/cli.out", test_tmpdir());
    int got = run_cmd(args, out);
    char *text = test_read_file(out, NULL);
    ck_assert_msg(got == status, "strata %s ...: exit %d, want %d: %s", args[0], got, status,
                  text ? text : "");
    ck_assert_msg(text && strstr(text, needle), "strata %s ...: no '%s' in: %s", args[0], needle,
                  text ? text : "");
    free(text);
}

START_TEST(cli_errors)
{
    if (access(bin("strata"), X_OK) != 0) {
        printf("SKIP: %s is not built\n", bin("strata"));
        return;
    }
    char empty[700];
    snprintf(empty, sizeof empty, "%s/empty", test_tmpdir());
    mkdir(empty, 0700);
    expect((const char *[]){"serve", "--help", NULL}, 0, "--keep-arena");
    expect((const char *[]){"serve", "--workers", "0", "m.gguf", NULL}, 2, "--workers '0'");
    expect((const char *[]){"serve", "a.gguf", "b.gguf", NULL}, 2, "at most one MODEL");
    expect((const char *[]){"serve", "/nonexistent/m.gguf", "--runtime-dir", empty, NULL}, 1,
           "/nonexistent/m.gguf");
    expect((const char *[]){"status", "--help", NULL}, 0, "--json");
    expect((const char *[]){"status", "--runtime-dir", empty, NULL}, 1, "is not running");
    expect((const char *[]){"run", "--name", "x", "--runtime-dir", empty, "-p", "hi", NULL}, 1,
           "no worker answered");
    expect((const char *[]){"run", "--name", "x", "--teacher", "1", "-p", "hi", NULL}, 2,
           "without --teacher");
    /* a key file others can read is refused; a missing --log-dir is told as such */
    char keyf[700], model[700], logs[700];
    snprintf(keyf, sizeof keyf, "%s/key", test_tmpdir());
    FILE *kf = fopen(keyf, "w");
    ck_assert_ptr_nonnull(kf);
    fputs("k\n", kf);
    fclose(kf);
    chmod(keyf, 0644);
    expect((const char *[]){"serve", "--api-key-file", keyf, "m.gguf", NULL}, 2,
           "other users can read the key");
    snprintf(model, sizeof model, "%s/cli.gguf", test_tmpdir());
    struct fixture_opts fo = {.type = "q8_0"};
    ck_assert_int_eq(fixture_write(&fo, model), 0);
    snprintf(logs, sizeof logs, "%s/no-such-dir", test_tmpdir());
    expect((const char *[]){"serve", model, "--runtime-dir", empty, "--log-dir", logs, NULL}, 1,
           "directory does not exist");
    char demo[700];
    snprintf(demo, sizeof demo, "%s/models/demo.gguf", STRATA_SOURCE_DIR);
    if (access(demo, R_OK) != 0)
        expect((const char *[]){"serve", "--runtime-dir", empty, NULL}, 1, "models/MODEL.md");
}
END_TEST

/* A stream driven by hand over the worker protocol, so it can be moved to another worker. */
struct moving {
    char id[48];
    int w;             /* the worker it runs on */
    int32_t prompt[8]; /* its own prompt */
    int32_t *got;      /* tokens received so far */
    uint32_t n_got;    /* of GEN_TOKENS */
    uint32_t base;     /* n_got when last submitted: the request numbers its tokens from it */
    bool done, moved;
};

/* moving_submit (re)submits m on worker w: the prompt plus what it received, the same seed. */
static void moving_submit(struct moving *m, struct wclient *c, int w, int k)
{
    int32_t full[8 + GEN_TOKENS];
    memcpy(full, m->prompt, sizeof m->prompt);
    memcpy(full + 8, m->got, m->n_got * sizeof *full);
    struct wclient_req r = {.id = m->id,
                            .prompt = full,
                            .n_prompt = 8 + m->n_got,
                            .max_tokens = GEN_TOKENS - m->n_got,
                            .n_generated = m->n_got};
    wclient_sampling_default(&r.sampling);
    r.sampling.temperature = k % 2 ? 0.7f : 0.0f;
    r.sampling.has_seed = true;
    r.sampling.seed = 500 + (uint64_t)k;
    m->w = w;
    m->base = m->n_got;
    ck_assert_int_eq(wclient_submit(c, &r, NULL, NULL), 0);
}

/* moving_run drives n streams until every one is done; with kill_pid, kills that worker once every
 * stream has tokens and moves the streams of worker 1 to worker 0. */
static void moving_run(struct moving *m, int n, struct wclient **c, int kill_pid)
{
    bool killed = false;
    for (double t0 = now_s();;) {
        ck_assert_msg(now_s() - t0 < limit_s(60), "streams did not finish in %.0f s", limit_s(60));
        int done = 0, started = 0;
        for (int k = 0; k < n; k++) {
            done += m[k].done;
            started += m[k].n_got > 0 || m[k].done;
        }
        if (done == n) return;
        if (kill_pid && !killed && started == n) {
            ck_assert_int_eq(kill(kill_pid, SIGKILL), 0);
            killed = true;
            for (int k = 0; k < n; k++) {
                if (m[k].w != 1 || m[k].done) continue;
                /* a new id: the request is new to worker 0 */
                snprintf(m[k].id + strlen(m[k].id), 8, "-moved");
                m[k].moved = true;
                moving_submit(&m[k], c[0], 0, k);
            }
        }
        for (int k = 0; k < n; k++) {
            if (m[k].done) continue;
            const char *ids[1] = {m[k].id};
            uint32_t from = m[k].n_got - m[k].base;
            struct wclient_poll_result pr = {0};
            const int prv = wclient_poll(c[m[k].w], ids, &from, 1, 0, &pr);
            ck_assert_msg(prv == 0, "poll of %s on worker %d: %s: %s", m[k].id, m[k].w,
                          strata_strerror(prv), strata_errdetail());
            const struct wclient_update *u = &pr.u[0];
            ck_assert_int_eq(u->code, 0);
            ck_assert_uint_eq(u->from, from);
            ck_assert_uint_le(m[k].n_got + u->n_tokens, GEN_TOKENS);
            if (u->n_tokens)
                memcpy(m[k].got + m[k].n_got, u->tokens, u->n_tokens * sizeof *u->tokens);
            m[k].n_got += u->n_tokens;
            m[k].done = u->finish != WCLIENT_RUNNING;
            wclient_poll_free(&pr);
        }
        sleep_ms(1); /* polls that do not wait: leave the CPU to the workers */
    }
}

START_TEST(stream_moves_to_other_worker)
{
    if (!have_bins()) return;
    enum { N = 8 };
    struct svc s;
    svc_start(&s, "move", 2, 1, NULL);
    struct wclient *c[2];
    for (int i = 0; i < 2; i++) {
        char url[SUP_SVC_URL_MAX];
        ck_assert_int_eq(sup_svc_worker_url(s.run, i, url, sizeof url), 0);
        ck_assert_int_eq(wclient_open(url, NULL, &c[i]), 0);
    }
    static struct moving ref[N], m[N];
    for (int pass = 0; pass < 2; pass++) {
        struct moving *x = pass ? m : ref;
        for (int k = 0; k < N; k++) {
            snprintf(x[k].id, sizeof x[k].id, "move-%d-%d-%d", (int)getpid(), pass, k);
            for (int j = 0; j < 8; j++)
                x[k].prompt[j] = 10 + 37 * k + 11 * j;
            x[k].got = calloc(GEN_TOKENS, sizeof *x[k].got);
            /* undisturbed: all on worker 0; then spread over both */
            moving_submit(&x[k], c[pass ? k % 2 : 0], pass ? k % 2 : 0, k);
        }
        moving_run(x, N, c, pass ? state_pid(&s, "workers", 1) : 0);
    }
    int moved = 0;
    for (int k = 0; k < N; k++) {
        moved += m[k].moved;
        ck_assert_uint_eq(m[k].n_got, ref[k].n_got);
        ck_assert_msg(memcmp(m[k].got, ref[k].got, m[k].n_got * sizeof *m[k].got) == 0,
                      "stream %d%s differs from the undisturbed run", k,
                      m[k].moved ? " (moved to worker 0)" : "");
        free(m[k].got);
        free(ref[k].got);
    }
    ck_assert_int_gt(moved, 0);
    printf("worker 1 killed -9 with %d of %d streams on it: resubmitted to worker 0 with the "
           "tokens they had, every stream equals the undisturbed run\n",
           moved, N);
    wclient_close(c[0]);
    wclient_close(c[1]);
    svc_stop(&s);
}
END_TEST

START_TEST(keep_arena_reused)
{
    if (!have_bins()) return;
    struct svc s;
    const char *keep[] = {"--keep-arena", NULL};
    svc_start(&s, "keep-arena", 1, 1, keep);
    json_t *a0 = arena_status(&s);
    ck_assert_ptr_nonnull(a0);
    svc_interrupt(&s);
    /* the arena runs on with its segments; the next serve uses it and leaves it running too */
    json_t *a1 = arena_status(&s);
    ck_assert_ptr_nonnull(a1);
    ck_assert(json_equal(json_object_get(a0, "pid"), json_object_get(a1, "pid")));
    char first[256];
    ck_assert_int_eq(count_entries(s.shm, first, sizeof first), 2);
    svc_launch(&s, 1, 1, NULL);
    ck_assert_int_eq(state_pid(&s, NULL, 0), json_integer_value(json_object_get(a0, "pid")));
    struct call c;
    call_init(&c, s.port, 0, 16, false);
    call_main(&c);
    ck_assert_int_eq(c.status, 200);
    ck_assert_uint_gt(c.len, 0);
    free(c.text);
    svc_interrupt(&s);
    json_t *a2 = arena_status(&s);
    ck_assert_ptr_nonnull(a2);
    ck_assert(json_equal(json_object_get(a0, "pid"), json_object_get(a2, "pid")));
    char log[800];
    snprintf(log, sizeof log, "%s/arena.log", s.logs);
    ck_assert_int_eq(count_in_file(log, "built arena"), 1);
    snprintf(log, sizeof log, "%s/serve.log", s.logs);
    ck_assert_int_eq(count_in_file(log, "is already served by pid"), 1);
    /* strata-arena stop removes it; then nothing is left */
    const char *argv[] = {bin("strata-arena"), "stop", NAME, "--runtime-dir", s.run, NULL};
    pid_t pid;
    int st;
    ck_assert_int_eq(posix_spawn(&pid, argv[0], NULL, NULL, (char *const *)argv, environ), 0);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_int_eq(st, 0);
    ck_assert_int_eq(count_entries(s.shm, first, sizeof first), 0);
    json_decref(a0);
    json_decref(a1);
    json_decref(a2);
    nftw(s.dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
END_TEST

/* The API key never reaches a command line other users can read (ps): given as --api-key, serve
 * warns and hands it to the frontends through their environment; the frontend still requires it. */
START_TEST(api_key_not_in_ps)
{
    if (!have_bins()) return;
    struct svc s;
    const char *key[] = {"--api-key", "sekret-in-argv", NULL};
    svc_start(&s, "api-key", 1, 1, key);
    int fe = state_pid(&s, "frontends", 0);
    ck_assert_int_gt(fe, 0);
    char path[64], cmd[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", fe);
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ssize_t n = read(fd, cmd, sizeof cmd - 1);
    close(fd);
    ck_assert_int_gt(n, 0);
    for (ssize_t i = 0; i < n; i++)
        if (!cmd[i]) cmd[i] = ' ';
    cmd[n] = '\0';
    ck_assert_msg(!strstr(cmd, "sekret-in-argv"), "the key is on the frontend's command line: %s",
                  cmd);
    int status = 0;
    ck_assert_int_eq(sup_svc_http_status("127.0.0.1", s.port, "/v1/models", 2000, &status), 0);
    ck_assert_int_eq(status, 401); /* the frontend got the key all the same */
    char log[800];
    snprintf(log, sizeof log, "%s/serve.log", s.logs);
    ck_assert_int_eq(count_in_file(log, "every local user can read it (ps)"), 1);
    svc_stop(&s);
}
END_TEST

/* http_post sends a request and returns the response (malloc'd), or NULL. */
static char *http_post(int port, const char *path, const char *body)
{
    char req[2048];
    int rl = snprintf(req, sizeof req,
                      "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                      path, strlen(body), body);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char *buf = NULL;
    size_t got = 0, cap = 1 << 16;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, req, (size_t)rl) == rl) {
        buf = malloc(cap);
        for (ssize_t r; got < cap - 1 && (r = read(fd, buf + got, cap - 1 - got)) > 0;)
            got += (size_t)r;
        buf[got] = '\0';
    }
    close(fd);
    return buf;
}

/* Speculative decoding end to end: the texts of streams decoded with a draft model (the model
 * itself: most drafts accepted, greedy and sampled streams), with the expert cache smaller than
 * the model, equal those of a run without drafts, also when the worker is killed -9 mid-stream
 * and the frontends resume them on its restart; the restarted worker's status, /metrics and a
 * response's timings show the drafts; `strata run` gives the same ids with and without
 * prompt-lookup drafts. */
START_TEST(drafts_keep_the_text_across_a_worker_kill)
{
    if (!have_bins()) return;
    enum { N = 8, FRONTENDS = 2 };
    struct svc s;
    svc_prepare(&s, "spec");
    svc_launch(&s, 1, FRONTENDS, NULL);
    static struct call ref[N], got[N];
    int prompt[N];
    long_prompts(s.port, N, prompt, ref);
    svc_interrupt(&s);
    const char *extra[] = {"--draft",    s.model,          "--draft-max",    "4",
                           "--worker-arg", "--expert-cache", "--worker-arg", "5", NULL};
    svc_launch(&s, 1, FRONTENDS, extra);
    char url[SUP_SVC_URL_MAX];
    ck_assert_int_eq(sup_svc_worker_url(s.run, 0, url, sizeof url), 0);
    int old = state_pid(&s, "workers", 0);
    pthread_t th[N];
    run_streams(got, th, N, prompt, s.port, FRONTENDS, GEN_TOKENS, 3);
    ck_assert_int_eq(kill(old, SIGKILL), 0);
    for (int k = 0; k < N; k++)
        pthread_join(th[k], NULL);
    check_same(got, ref, N);
    struct wclient_status ws = {0};
    int pid = 0;
    for (double t0 = now_s(); !(pid = worker_figures(url, &ws, 500)) || pid == old; sleep_ms(20))
        ck_assert_msg(now_s() - t0 < limit_s(30), "no restarted worker");
    ck_assert_str_eq(ws.spec, "draft");
    ck_assert_uint_gt(ws.drafts_accepted, 0);
    ck_assert_uint_gt(ws.decode_tokens, ws.decode_passes); /* more than a token a pass */
    ck_assert_double_gt(metric(s.port, "strata_worker_drafts_accepted_total{"),
                        0);
    char *r = http_post(s.port, "/v1/completions",
                        "{\"prompt\":\"Story number 3:\",\"max_tokens\":24,\"temperature\":0}");
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(strstr(r, "\"draft_n\"") && strstr(r, "\"draft_n_accepted\"") &&
                      strstr(r, "\"tokens_per_pass\""),
                  "no draft timings in %s", r);
    free(r);
    printf("drafts: %llu of %llu accepted on the restarted worker, %.2f tokens a decode pass; "
           "%d streams equal the run without drafts across its kill -9\n",
           (unsigned long long)ws.drafts_accepted, (unsigned long long)ws.drafts_proposed,
           (double)ws.decode_tokens / (double)ws.decode_passes, N);
    const char *plain[] = {s.model, "--ids", "5,6,7,8,5,6,7,8,5,6", "-n", "40", "--temp", "0.9",
                           "--seed", "3", "--json", "--threads", "1", NULL};
    const char *spec[] = {s.model, "--ids", "5,6,7,8,5,6,7,8,5,6", "-n", "40", "--temp", "0.9",
                          "--seed", "3", "--json", "--threads", "1", "--spec-lookup", "4", NULL};
    json_t *a = run_ids(&s, plain), *b = run_ids(&s, spec);
    ck_assert(json_equal(a, b));
    json_decref(a);
    json_decref(b);
    free_calls(got, N);
    free_calls(ref, N);
    svc_stop(&s);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("serve");
    TCase *tc = tcase_create("e2e");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, cli_errors);
    tcase_add_test(tc, worker_killed_mid_stream);
    tcase_add_test(tc, drafts_keep_the_text_across_a_worker_kill);
    tcase_add_test(tc, arena_restarted_while_serving);
    tcase_add_test(tc, frontend_killed_leases_lapse);
    tcase_add_test(tc, two_workers_one_killed);
    tcase_add_test(tc, keep_arena_reused);
    tcase_add_test(tc, api_key_not_in_ps);
    tcase_add_test(tc, stream_moves_to_other_worker);
    suite_add_tcase(s, tc);
    return s;
}

/* kill_leftovers kills what a failed or timed-out test left running: every process whose command
 * line names a path under root (Check ends a failed test with _exit, and serve's children live
 * in their own process groups, so nothing else would stop them). */
static void kill_leftovers(const char *root)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) != NULL) {
        int pid = atoi(e->d_name);
        char path[64], cmd[4096];
        if (pid <= 0 || pid == getpid()) continue;
        snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
        int fd = open(path, O_RDONLY);
        if (fd < 0) continue;
        ssize_t len = read(fd, cmd, sizeof cmd - 1);
        close(fd);
        for (ssize_t i = 0; i < len; i++)
            if (!cmd[i]) cmd[i] = ' ';
        cmd[len > 0 ? len : 0] = '\0';
        if (strstr(cmd, root) && kill(pid, SIGKILL) == 0) n++;
    }
    if (d) closedir(d);
    if (n) printf("killed %d process(es) that a failed test left running\n", n);
}

int main(void)
{
    /* one directory for all tests (the forked tests inherit it), where leftovers can be found */
    char root[512];
    snprintf(root, sizeof root, "%s", test_tmpdir());
    int rv = test_run(suite());
    kill_leftovers(root);
    if (rv == 0)
        nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    else
        printf("the logs of every process are in %s/*/logs\n", root);
    return rv;
}
