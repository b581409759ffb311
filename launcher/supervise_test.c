/* supervise_test — the supervisor on /bin/sh children: restart with doubling backoff and its reset
 * after a stable run, stop by stage in order, SIGKILL for a child that ignores SIGTERM, a stop
 * signal ending sup_run, a child that dies before it is ready (and is not restarted, however soon
 * its backoff passes), a non-restarting child's death, a missing executable, and the on_spawn hook.
 *
 * CI runs this on a loaded 2-core machine, where a /bin/sh can take hundreds of milliseconds to
 * start: no check counts what happened within a fixed time. The tests wait for the event they
 * need (a number of restarts, a child's "ready" file written after its trap is set) under a
 * deadline that only guards against a hang (limit_ms), read the delays the supervisor chose from
 * its log lines, and bound measured times from below only, except kill_after_timeout's stop. */
#include "common/base/err.h"
#include "common/base/log.h"
#include "launcher/supervise.h"
#include "tests/testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* limit_ms: a hang guard of ms on an idle machine, stretched by test_slowdown(). */
static int limit_ms(int ms)
{
    return (int)(ms * test_slowdown());
}

/* run_until_restarts runs s until child c was restarted n times, failing after limit_ms(ms). */
static void run_until_restarts(struct sup *s, int c, unsigned n, int ms)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    while (sup_restarts(s, c) < n) {
        ck_assert_int_eq(sup_run(s, 50), STRATA_ETIMEDOUT);
        clock_gettime(CLOCK_MONOTONIC, &b);
        ck_assert_msg((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 <
                          limit_ms(ms),
                      "%u of %u restarts after %d ms", sup_restarts(s, c), n, limit_ms(ms));
    }
}

/* stderr_to sends our stderr (the supervisor's log) to path and returns the old one's fd for
 * stderr_back. Check reports through its own pipe, not stderr. */
static int stderr_to(const char *path)
{
    if (strata_log_level() < STRATA_LOG_WARN) strata_log_set_level(STRATA_LOG_WARN);
    int old = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(old, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(dup2(fd, 2), 2);
    close(fd);
    return old;
}

static void stderr_back(int old)
{
    ck_assert_int_eq(dup2(old, 2), 2);
    close(old);
}

/* read_delays reads the restart delays of the log lines "... restarting it in 0.2 s ..." in path
 * into v (s); returns the count. */
static int read_delays(const char *path, double *v, int max)
{
    char *text = test_read_file(path, NULL);
    ck_assert_ptr_nonnull(text);
    int n = 0;
    const char *key = "restarting it in ";
    for (const char *p = text; n < max && (p = strstr(p, key)) != NULL; p += strlen(key))
        ck_assert_int_eq(sscanf(p + strlen(key), "%lf", &v[n++]), 1);
    free(text);
    return n;
}

static char *path_in_tmp(const char *tag)
{
    static char buf[4][700];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s-%d", test_tmpdir(), tag, (int)getpid());
    unlink(p);
    return p;
}

static int add_sh(struct sup *s, const char *name, const char *script, int stage, bool restart)
{
    char *argv[] = {"/bin/sh", "-c", (char *)script, NULL};
    struct sup_child_opts co = {.name = name, .argv = argv, .stage = stage, .restart = restart};
    int idx = -1;
    ck_assert_int_eq(sup_add(s, &co, &idx), 0);
    return idx;
}

/* read_ns reads one integer per line (date +%s%N) into v; returns the count. */
static int read_ns(const char *path, long long *v, int max)
{
    FILE *f = fopen(path, "r");
    int n = 0;
    if (!f) return 0;
    while (n < max && fscanf(f, "%lld", &v[n]) == 1)
        n++;
    fclose(f);
    return n;
}

static int file_exists(void *ctx)
{
    return access(ctx, F_OK);
}

START_TEST(restart_backoff_doubles)
{
    const char *f = path_in_tmp("starts"), *log = path_in_tmp("log");
    char script[800];
    snprintf(script, sizeof script, "date +%%s%%N >> %s; exit 1", f);
    struct sup_opts o = {.backoff_min_ms = 100, .backoff_max_ms = 400, .stable_ms = 60000};
    struct sup *s;
    ck_assert_int_eq(sup_init(&o, &s), 0);
    int c = add_sh(s, "flaky", script, 0, true);
    int err = stderr_to(log);
    ck_assert_int_eq(sup_start(s, c), 0);
    run_until_restarts(s, c, 5, 10000);
    stderr_back(err);
    /* the delays it chose double up to the cap and stay there */
    const double want_s[] = {0.1, 0.2, 0.4, 0.4, 0.4};
    double delay[8];
    ck_assert_int_ge(read_delays(log, delay, 8), 5);
    for (int i = 0; i < 5; i++)
        ck_assert_msg(delay[i] == want_s[i], "delay %d: %.1f s, want %.1f", i, delay[i], want_s[i]);
    /* and it waited them: each start (a child's own clock) at least its delay after the last,
     * which wrote its line before it exited (2 ms: our clock's truncation to ms) */
    long long t[64];
    int n = read_ns(f, t, 64);
    ck_assert_int_ge(n, 5);
    for (int i = 1; i < 5; i++) {
        double gap = (t[i] - t[i - 1]) / 1e6;
        ck_assert_msg(gap >= want_s[i - 1] * 1e3 - 2, "gap %d: %.1f ms, want >= %.0f", i, gap,
                      want_s[i - 1] * 1e3);
    }
    sup_fini(s);
}
END_TEST

START_TEST(stable_run_resets_backoff)
{
    const char *log = path_in_tmp("log");
    /* Each run outlives stable_ms (from before the spawn returned to after the exit), so every
     * restart waits the minimum; with doubling the delays would be 0.1, 0.2, 0.4, 0.8 s. */
    struct sup_opts o = {.backoff_min_ms = 100, .backoff_max_ms = 10000, .stable_ms = 40};
    struct sup *s;
    ck_assert_int_eq(sup_init(&o, &s), 0);
    int c = add_sh(s, "steady", "sleep 0.05; exit 1", 0, true);
    int err = stderr_to(log);
    ck_assert_int_eq(sup_start(s, c), 0);
    run_until_restarts(s, c, 4, 10000);
    stderr_back(err);
    double delay[16];
    int n = read_delays(log, delay, 16);
    ck_assert_int_ge(n, 4);
    for (int i = 0; i < n; i++)
        ck_assert_msg(delay[i] == 0.1, "delay %d: %.1f s: the backoff was not reset", i, delay[i]);
    sup_fini(s);
}
END_TEST

START_TEST(stop_by_stage_in_order)
{
    char f[800]; /* path_in_tmp's buffers are reused below */
    snprintf(f, sizeof f, "%s", path_in_tmp("order"));
    struct sup *s;
    /* a child that does not answer SIGTERM in time is killed and writes no line */
    struct sup_opts o = {.stop_timeout_ms = limit_ms(5000)};
    ck_assert_int_eq(sup_init(&o, &s), 0);
    const char *names[] = {"arena", "worker-0", "worker-1", "frontend"};
    const int stages[] = {0, 1, 1, 2};
    int idx[4];
    for (int i = 0; i < 4; i++) {
        /* ready once its trap is set: a SIGTERM before that would end it with no line */
        char ready[800], script[2000];
        snprintf(ready, sizeof ready, "%s", path_in_tmp(names[i]));
        snprintf(script, sizeof script,
                 "trap 'echo %d %s >> %s; exit 0' TERM; touch %s; while :; do sleep 0.05; done",
                 stages[i], names[i], f, ready);
        idx[i] = add_sh(s, names[i], script, stages[i], true);
        ck_assert_int_eq(sup_start(s, idx[i]), 0);
        ck_assert_int_eq(sup_wait_ready(s, idx[i], file_exists, ready, limit_ms(5000)), 0);
    }
    pid_t pids[4];
    for (int i = 0; i < 4; i++)
        pids[i] = sup_pid(s, idx[i]);
    sup_stop_all(s);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(sup_pid(s, idx[i]), 0);
        ck_assert_int_eq(kill(pids[i], 0), -1);
        ck_assert_uint_eq(sup_restarts(s, idx[i]), 0); /* a stop is not a death to restart */
    }
    size_t len;
    char *text = test_read_file(f, &len);
    ck_assert_ptr_nonnull(text);
    int order[4], k = 0;
    for (char *p = text; *p && k < 4; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
        order[k++] = *p - '0';
    ck_assert_int_eq(k, 4);
    ck_assert_msg(order[0] == 2 && order[1] == 1 && order[2] == 1 && order[3] == 0,
                  "stop order: %s", text);
    free(text);
    sup_fini(s);
}
END_TEST

START_TEST(kill_after_timeout)
{
    struct sup_opts o = {.stop_timeout_ms = 300};
    struct sup *s;
    ck_assert_int_eq(sup_init(&o, &s), 0);
    const char *ready = path_in_tmp("stubborn");
    char script[900];
    /* ready once SIGTERM is ignored: before that, SIGTERM alone would end it */
    snprintf(script, sizeof script, "trap '' TERM; touch %s; while :; do sleep 0.05; done", ready);
    int c = add_sh(s, "stubborn", script, 0, true);
    ck_assert_int_eq(sup_start(s, c), 0);
    ck_assert_int_eq(sup_wait_ready(s, c, file_exists, (void *)ready, limit_ms(5000)), 0);
    pid_t pid = sup_pid(s, c);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    sup_stop_all(s);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double took = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
    /* at least the timeout (to the ms); the upper bound: SIGKILL and reaping took no seconds */
    ck_assert_msg(took >= 0.299 && took < 0.3 + 2.7 * test_slowdown(), "stop took %.2f s", took);
    ck_assert_int_eq(kill(pid, 0), -1);
    ck_assert_int_eq(errno, ESRCH);
    sup_fini(s);
}
END_TEST

START_TEST(stop_signal_ends_run)
{
    struct sup *s;
    ck_assert_int_eq(sup_init(NULL, &s), 0);
    int c = add_sh(s, "sleeper", "exec sleep 30", 0, true);
    ck_assert_int_eq(sup_start(s, c), 0);
    ck_assert(!sup_stopping(s));
    kill(getpid(), SIGTERM); /* blocked by sup_init: waits for the supervisor's sigtimedwait */
    ck_assert_int_eq(sup_run(s, limit_ms(5000)), 0);
    ck_assert(sup_stopping(s));
    ck_assert_int_ne(sup_pid(s, c), 0); /* the caller decides when to stop the children */
    sup_stop_all(s);
    ck_assert_int_eq(sup_pid(s, c), 0);
    sup_fini(s);
}
END_TEST

START_TEST(ready_and_died_before_ready)
{
    const char *f = path_in_tmp("ready");
    char script[800];
    snprintf(script, sizeof script, "sleep 0.2; touch %s; exec sleep 30", f);
    struct sup_opts o = {.backoff_min_ms = 20};
    struct sup *s;
    ck_assert_int_eq(sup_init(&o, &s), 0);
    int ok = add_sh(s, "slow", script, 0, true);
    int bad = add_sh(s, "broken", "exit 3", 0, true);
    ck_assert_int_eq(sup_start(s, ok), 0);
    ck_assert_int_eq(sup_wait_ready(s, ok, file_exists, (void *)f, limit_ms(5000)), 0);
    ck_assert_int_eq(sup_start(s, bad), 0);
    ck_assert_int_eq(sup_wait_ready(s, bad, file_exists, "/nonexistent/x", limit_ms(5000)),
                     STRATA_ECLOSED);
    ck_assert_msg(strstr(strata_errdetail(), "broken exited with status 3"), "%s",
                  strata_errdetail());
    /* it failed at start: not restarted */
    ck_assert_int_eq(sup_run(s, 300), STRATA_ETIMEDOUT);
    ck_assert_uint_eq(sup_restarts(s, bad), 0);
    ck_assert_int_eq(sup_pid(s, bad), 0);
    ck_assert_int_ne(sup_pid(s, ok), 0);
    int never = add_sh(s, "never", "exec sleep 30", 0, true);
    ck_assert_int_eq(sup_start(s, never), 0);
    ck_assert_int_eq(sup_wait_ready(s, never, file_exists, "/nonexistent/x", 200),
                     STRATA_ETIMEDOUT);
    sup_fini(s);
}
END_TEST

/* A child that dies before it is ready is not restarted even when its backoff (1 ms here) has
 * passed by the time the supervisor looks at the restarts due: under load that is any death, and a
 * restart there hid the death from sup_wait_ready, which then went on waiting on the new run. */
START_TEST(died_before_ready_not_restarted)
{
    struct sup_opts o = {.backoff_min_ms = 1};
    struct sup *s;
    ck_assert_int_eq(sup_init(&o, &s), 0);
    int bad = add_sh(s, "broken", "exit 3", 0, true);
    /* 60 rounds: a few seconds on a loaded machine; the old code failed within them 4 runs in 5 */
    for (int i = 0; i < 60; i++) {
        ck_assert_int_eq(sup_start(s, bad), 0);
        ck_assert_int_eq(sup_wait_ready(s, bad, file_exists, "/nonexistent/x", limit_ms(5000)),
                         STRATA_ECLOSED);
        ck_assert_msg(sup_restarts(s, bad) == 0, "restarted %u times in round %d",
                      sup_restarts(s, bad), i);
        ck_assert_int_eq(sup_pid(s, bad), 0);
    }
    sup_fini(s);
}
END_TEST

START_TEST(fatal_child_ends_run)
{
    struct sup *s;
    ck_assert_int_eq(sup_init(NULL, &s), 0);
    int c = add_sh(s, "once", "sleep 0.1; exit 4", 0, false);
    ck_assert_int_eq(sup_start(s, c), 0);
    ck_assert_int_eq(sup_run(s, limit_ms(5000)), STRATA_ECLOSED);
    ck_assert_msg(strstr(strata_errdetail(), "once exited with status 4"), "%s",
                  strata_errdetail());
    ck_assert_uint_eq(sup_restarts(s, c), 0);
    sup_fini(s);
}
END_TEST

/* A child's env entries are set on top of ours: a new name added, one of ours replaced, the rest
 * kept. */
START_TEST(child_env)
{
    setenv("SUP_TEST_KEEP", "kept", 1);
    setenv("SUP_TEST_SWAP", "ours", 1);
    struct sup *s;
    ck_assert_int_eq(sup_init(NULL, &s), 0);
    const char *out = path_in_tmp("env");
    char script[600];
    snprintf(script, sizeof script,
             "echo \"$SUP_TEST_KEEP $SUP_TEST_SWAP $SUP_TEST_NEW\" > %s; exit 4", out);
    char *argv[] = {"/bin/sh", "-c", script, NULL};
    char *env[] = {"SUP_TEST_SWAP=theirs", "SUP_TEST_NEW=new", NULL};
    struct sup_child_opts co = {.name = "env", .argv = argv, .env = env, .restart = false};
    int idx;
    ck_assert_int_eq(sup_add(s, &co, &idx), 0);
    ck_assert_int_eq(sup_start(s, idx), 0);
    ck_assert_int_eq(sup_run(s, limit_ms(5000)), STRATA_ECLOSED);
    size_t len;
    char *got = test_read_file(out, &len);
    ck_assert_ptr_nonnull(got);
    ck_assert_str_eq(got, "kept theirs new\n");
    ck_assert_str_eq(getenv("SUP_TEST_SWAP"), "ours"); /* ours is untouched */
    free(got);
    sup_fini(s);
}
END_TEST

/* A restarting child that exits with its fatal status (strata-arena's "cannot start") is not
 * restarted: the run ends and says why, instead of "restarting it in 0.2 s" forever. Another
 * status still restarts it. */
START_TEST(fatal_status_not_restarted)
{
    struct sup_opts o = {.backoff_min_ms = 30};
    struct sup *s;
    ck_assert_int_eq(sup_init(&o, &s), 0);
    char *argv[] = {"/bin/sh", "-c", "sleep 0.1; exit 1", NULL};
    struct sup_child_opts co = {.name = "arena", .argv = argv, .restart = true, .fatal_status = 1};
    int c = -1;
    ck_assert_int_eq(sup_add(s, &co, &c), 0);
    ck_assert_int_eq(sup_start(s, c), 0);
    ck_assert_int_eq(sup_run(s, limit_ms(5000)), STRATA_ECLOSED);
    ck_assert_msg(strstr(strata_errdetail(), "arena exited with status 1"), "%s",
                  strata_errdetail());
    ck_assert_uint_eq(sup_restarts(s, c), 0);
    char *argv2[] = {"/bin/sh", "-c", "exit 3", NULL};
    struct sup_child_opts co2 = {
        .name = "other", .argv = argv2, .restart = true, .fatal_status = 1};
    int d = -1;
    ck_assert_int_eq(sup_add(s, &co2, &d), 0);
    ck_assert_int_eq(sup_start(s, d), 0);
    run_until_restarts(s, d, 1, 5000);
    sup_fini(s);
}
END_TEST

static void count_spawn(void *ctx, int idx, pid_t pid)
{
    int *n = ctx;
    n[idx]++;
    ck_assert_int_gt(pid, 0);
}

START_TEST(missing_binary_and_on_spawn)
{
    int spawned[4] = {0};
    struct sup_opts o = {.backoff_min_ms = 30, .on_spawn = count_spawn, .spawn_ctx = spawned};
    struct sup *s;
    ck_assert_int_eq(sup_init(&o, &s), 0);
    char *argv[] = {"/nonexistent/strata-worker", NULL};
    struct sup_child_opts co = {.name = "ghost", .argv = argv};
    int g;
    ck_assert_int_eq(sup_add(s, &co, &g), 0);
    ck_assert_int_eq(sup_start(s, g), STRATA_ESYSERR | ENOENT);
    ck_assert_msg(strstr(strata_errdetail(), "/nonexistent/strata-worker"), "%s",
                  strata_errdetail());
    ck_assert_int_eq(spawned[g], 0);
    int c = add_sh(s, "flaky", "exit 1", 0, true);
    ck_assert_int_eq(sup_start(s, c), 0);
    run_until_restarts(s, c, 2, 5000);
    ck_assert_int_ge(spawned[c], 3);
    ck_assert_uint_eq((unsigned)spawned[c], sup_restarts(s, c) + 1);
    struct sup_child_opts bad = {.name = NULL, .argv = argv};
    ck_assert_int_eq(sup_add(s, &bad, &g), STRATA_EINVAL);
    sup_fini(s);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("supervise");
    TCase *tc = tcase_create("sup");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, restart_backoff_doubles);
    tcase_add_test(tc, stable_run_resets_backoff);
    tcase_add_test(tc, stop_by_stage_in_order);
    tcase_add_test(tc, kill_after_timeout);
    tcase_add_test(tc, stop_signal_ends_run);
    tcase_add_test(tc, ready_and_died_before_ready);
    tcase_add_test(tc, died_before_ready_not_restarted);
    tcase_add_test(tc, fatal_child_ends_run);
    tcase_add_test(tc, fatal_status_not_restarted);
    tcase_add_test(tc, missing_binary_and_on_spawn);
    tcase_add_test(tc, child_env);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(suite());
}
