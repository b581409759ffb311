#include "launcher/supervise.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/own.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define READY_POLL_MS 100

struct sup_child {
    char name[32];
    char **argv; /* deep copy, NULL-terminated */
    char **env;  /* "NAME=value" set on top of our environment, NULL-terminated; NULL: none */
    char *log;
    int stage;
    bool restart;
    int fatal_status;
    pid_t pid;          /* 0: not running */
    int64_t started_ms; /* of the current or last run */
    int64_t due_ms;     /* restart time while waiting for one; 0: none */
    int backoff_ms;     /* the delay of the next restart */
    unsigned restarts;
    bool died;  /* exited since sup_start (cleared by it) */
    int status; /* its wait status */
};

struct sup {
    struct sup_opts o;
    struct sup_child c[SUP_MAX_CHILDREN];
    int n;
    sigset_t waited, old_mask;
    bool stop;     /* a stop was requested */
    bool kill_now; /* a second stop signal came during sup_stop_all */
    bool stopping; /* inside sup_stop_all: no restarts */
    int fatal;     /* index of a non-restarting child that died, or -1 */
    int waiting;   /* the child sup_wait_ready waits for, or -1: its death is not restarted */
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* describe writes "exited with status N" / "was killed by signal N (NAME)" for wait status st. */
static void describe(int st, char *buf, size_t n)
{
    if (WIFEXITED(st))
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, n, "ended with wait status %#x", (unsigned)st);
}

int sup_init(const struct sup_opts *o, struct sup **out)
{
    struct sup *s = calloc(1, sizeof *s);
    if (!s) return STRATA_ENOMEM;
    if (o) s->o = *o;
    if (s->o.backoff_min_ms <= 0) s->o.backoff_min_ms = 200;
    if (s->o.backoff_max_ms <= 0) s->o.backoff_max_ms = 30000;
    if (s->o.backoff_max_ms < s->o.backoff_min_ms) s->o.backoff_max_ms = s->o.backoff_min_ms;
    if (s->o.stable_ms <= 0) s->o.stable_ms = 10000;
    if (s->o.stop_timeout_ms <= 0) s->o.stop_timeout_ms = 10000;
    s->fatal = -1;
    s->waiting = -1;
    sigemptyset(&s->waited);
    sigaddset(&s->waited, SIGINT);
    sigaddset(&s->waited, SIGTERM);
    sigaddset(&s->waited, SIGHUP);
    sigaddset(&s->waited, SIGCHLD);
    int rv = pthread_sigmask(SIG_BLOCK, &s->waited, &s->old_mask);
    if (rv) {
        free(s);
        return strata_errf(STRATA_ESYSERR | rv, "cannot block the supervisor's signals");
    }
    *out = s;
    return 0;
}

static void strv_free(char **v)
{
    for (char **a = v; a && *a; a++)
        free(*a);
    free(v);
}

/* strv_copy deep-copies the NULL-terminated src into *dst (NULL stays NULL). */
static int strv_copy(char *const *src, char ***dst)
{
    size_t n = 0;
    *dst = NULL;
    if (!src) return 0;
    while (src[n])
        n++;
    if (!(*dst = calloc(n + 1, sizeof **dst))) return STRATA_ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (!((*dst)[i] = strdup(src[i]))) return STRATA_ENOMEM;
    return 0;
}

static void child_free(struct sup_child *c)
{
    strv_free(c->argv);
    strv_free(c->env);
    free(c->log);
    memset(c, 0, sizeof *c);
}

int sup_add(struct sup *s, const struct sup_child_opts *co, int *idx)
{
    if (!co->argv || !co->argv[0] || !co->name || strlen(co->name) >= sizeof s->c[0].name)
        return strata_errf(STRATA_EINVAL, "a child needs an argv and a name of at most %zu bytes",
                           sizeof s->c[0].name - 1);
    if (s->n == SUP_MAX_CHILDREN)
        return strata_errf(STRATA_ELIMIT, "at most %d children can be supervised",
                           SUP_MAX_CHILDREN);
    struct sup_child *c = &s->c[s->n];
    if (strv_copy(co->argv, &c->argv) != 0 || strv_copy(co->env, &c->env) != 0) goto nomem;
    if (co->log && !(c->log = strdup(co->log))) goto nomem;
    snprintf(c->name, sizeof c->name, "%s", co->name);
    c->stage = co->stage;
    c->restart = co->restart;
    c->fatal_status = co->fatal_status;
    c->backoff_ms = s->o.backoff_min_ms;
    *idx = s->n++;
    return 0;
nomem:
    child_free(c);
    return STRATA_ENOMEM;
}


/* child_env: our environment with add's "NAME=value" entries replacing ours of the same name (the
 * array is malloc'd, its strings borrowed). NULL on ENOMEM. */
static char **child_env(char *const *add)
{
    size_t n = 0, k = 0, m = 0;
    while (environ[n])
        n++;
    while (add[m])
        m++;
    char **e = calloc(n + m + 1, sizeof *e);
    if (!e) return NULL;
    for (size_t i = 0; i < n; i++) {
        bool replaced = false;
        for (size_t a = 0; a < m && !replaced; a++) {
            size_t len = strcspn(add[a], "=");
            replaced = strncmp(environ[i], add[a], len) == 0 && environ[i][len] == '=';
        }
        if (!replaced) e[k++] = environ[i];
    }
    for (size_t a = 0; a < m; a++)
        e[k++] = add[a];
    return e;
}

static int spawn(struct sup *s, int idx)
{
    struct sup_child *c = &s->c[idx];
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t none, dfl;
    int log_fd = -1;
    /* The log is opened here, not in the child: a log directory others can write must not make
     * us follow a symlink or append to someone else's file, and a failure is told as what it is. */
    if (c->log) {
        int lv = own_open(c->log, O_WRONLY | O_CREAT | O_APPEND, 0600, false, &log_fd);
        if (lv == STRATA_ENOENT)
            return strata_errf(lv,
                               "cannot start %s: its log %s cannot be created because its "
                               "directory does not exist: create it or pass another --log-dir",
                               c->name, c->log);
        if (lv != 0)
            return strata_errf(lv, "cannot start %s: log %s: %s", c->name, c->log,
                               strata_errdetail());
    }
    int rv = posix_spawn_file_actions_init(&fa);
    if (rv) {
        if (log_fd >= 0) close(log_fd);
        return strata_errf(STRATA_ESYSERR | rv, "cannot start %s", c->name);
    }
    if ((rv = posix_spawnattr_init(&at)) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        if (log_fd >= 0) close(log_fd);
        return strata_errf(STRATA_ESYSERR | rv, "cannot start %s", c->name);
    }
    if (log_fd >= 0) {
        rv = posix_spawn_file_actions_adddup2(&fa, log_fd, 1);
        if (!rv) rv = posix_spawn_file_actions_adddup2(&fa, log_fd, 2);
    }
    sigemptyset(&none);
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGINT);
    sigaddset(&dfl, SIGTERM);
    sigaddset(&dfl, SIGHUP);
    sigaddset(&dfl, SIGCHLD);
    sigaddset(&dfl, SIGPIPE);
    /* Its own process group: a terminal's Ctrl-C reaches the supervisor only, which stops the
     * children in order, and a stop reaches whatever the child started itself. */
    if (!rv)
        rv = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                               POSIX_SPAWN_SETSIGDEF);
    if (!rv) rv = posix_spawnattr_setpgroup(&at, 0);
    if (!rv) rv = posix_spawnattr_setsigmask(&at, &none);
    if (!rv) rv = posix_spawnattr_setsigdefault(&at, &dfl);
    pid_t pid = 0;
    char **envp = environ;
    if (!rv && c->env && !(envp = child_env(c->env))) rv = ENOMEM;
    /* read before the spawn, so that it is no later than the child's start (see reap) */
    int64_t t0 = now_ms();
    if (!rv) rv = posix_spawn(&pid, c->argv[0], &fa, &at, c->argv, envp);
    if (envp != environ) free(envp); /* only the array: its strings are environ's and c->env's */
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (log_fd >= 0) close(log_fd);
    if (rv)
        return strata_errf(STRATA_ESYSERR | rv, "cannot start %s (%s%s%s): %s", c->name, c->argv[0],
                           c->log ? ", log " : "", c->log ? c->log : "",
                           rv == ENOENT ? "no such file: is it built?" : strerror(rv));
    c->pid = pid;
    c->started_ms = t0;
    c->due_ms = 0;
    LOG_DEBUG("%s started (pid %d)", c->name, (int)pid);
    if (s->o.on_spawn) s->o.on_spawn(s->o.spawn_ctx, idx, pid);
    return 0;
}

int sup_start(struct sup *s, int idx)
{
    struct sup_child *c = &s->c[idx];
    if (c->pid)
        return strata_errf(STRATA_ESTATE, "%s is already running (pid %d)", c->name, c->pid);
    c->died = false;
    c->backoff_ms = s->o.backoff_min_ms;
    return spawn(s, idx);
}

/* reap collects every child that exited and schedules its restart. */
static void reap(struct sup *s)
{
    for (int i = 0; i < s->n; i++) {
        struct sup_child *c = &s->c[i];
        int st;
        if (!c->pid || waitpid(c->pid, &st, WNOHANG) != c->pid) continue;
        /* read after the wait (no earlier than the exit), as started_ms before the spawn (no
         * later than the start): a run is never measured shorter than it was. With the clock
         * read before the wait and after the spawn, a preemption in either gap made a 50 ms run
         * look shorter than 40 ms under load (no backoff reset), and could schedule a restart
         * less than its delay after the exit. */
        int64_t now = now_ms();
        char why[96];
        describe(st, why, sizeof why);
        pid_t old = c->pid;
        c->pid = 0;
        c->died = true;
        c->status = st;
        if (s->stopping) {
            LOG_DEBUG("%s (pid %d) %s", c->name, (int)old, why);
            continue;
        }
        /* sup_wait_ready reports it, and a child that never got ready would fail again the same
         * way. Scheduling its restart here instead would race: under load restart_due, in the same
         * step, can find the backoff passed and start it again before sup_wait_ready looks. */
        if (i == s->waiting) {
            LOG_DEBUG("%s (pid %d) %s before it was ready", c->name, (int)old, why);
            continue;
        }
        bool fatal = c->fatal_status && WIFEXITED(st) && WEXITSTATUS(st) == c->fatal_status;
        if (!c->restart || fatal) {
            LOG_ERROR("%s (pid %d) %s%s", c->name, (int)old, why,
                      fatal ? ": it cannot start, so it is not restarted (its log says why)" : "");
            if (s->fatal < 0) s->fatal = i;
            continue;
        }
        if (now - c->started_ms >= s->o.stable_ms) c->backoff_ms = s->o.backoff_min_ms;
        c->due_ms = now + c->backoff_ms;
        LOG_WARN("%s (pid %d) %s after %.1f s; restarting it in %.1f s (restart %u)", c->name,
                 (int)old, why, (now - c->started_ms) / 1000.0, c->backoff_ms / 1000.0,
                 c->restarts + 1);
        c->backoff_ms =
            c->backoff_ms > s->o.backoff_max_ms / 2 ? s->o.backoff_max_ms : 2 * c->backoff_ms;
    }
}

/* restart_due starts the children whose backoff has passed; a failed spawn waits another backoff.
 */
static void restart_due(struct sup *s)
{
    int64_t now = now_ms();
    for (int i = 0; i < s->n && !s->stopping; i++) {
        struct sup_child *c = &s->c[i];
        if (c->pid || !c->due_ms || c->due_ms > now) continue;
        c->restarts++;
        int rv = spawn(s, i);
        if (rv) {
            c->due_ms = now + c->backoff_ms;
            LOG_ERROR("%s: %s; trying again in %.1f s", strata_strerror(rv), strata_errdetail(),
                      c->backoff_ms / 1000.0);
            c->backoff_ms =
                c->backoff_ms > s->o.backoff_max_ms / 2 ? s->o.backoff_max_ms : 2 * c->backoff_ms;
        } else {
            LOG_INFO("%s restarted (pid %d)", c->name, (int)c->pid);
        }
    }
}

/* step waits up to timeout_ms (less when a restart is due sooner) for a signal, then reaps and
 * restarts. Stop signals set s->stop (and kill_now when one comes during a stop). */
static void step(struct sup *s, int timeout_ms)
{
    int64_t now = now_ms(), wait = timeout_ms < 0 ? 1000 : timeout_ms;
    for (int i = 0; i < s->n; i++)
        if (!s->c[i].pid && s->c[i].due_ms && s->c[i].due_ms - now < wait)
            wait = s->c[i].due_ms - now;
    if (wait < 0) wait = 0;
    struct timespec ts = {wait / 1000, (wait % 1000) * 1000000};
    siginfo_t si;
    int sig = sigtimedwait(&s->waited, &si, &ts);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
        if (s->stopping) s->kill_now = true;
        if (!s->stop) LOG_INFO("%s: stopping", strsignal(sig));
        s->stop = true;
    }
    reap(s);
    restart_due(s);
}

static int wait_ready(struct sup *s, int idx, sup_ready_fn ready, void *ctx, int timeout_ms)
{
    struct sup_child *c = &s->c[idx];
    int64_t end = timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
    for (;;) {
        if (s->stop) return strata_errf(STRATA_ECANCELED, "stopped while waiting for %s", c->name);
        if (!c->pid && c->died) {
            char why[96];
            describe(c->status, why, sizeof why);
            /* it may have died before the wait began, reaped as any other child: no restart */
            c->due_ms = 0;
            if (s->fatal == idx) s->fatal = -1;
            return strata_errf(STRATA_ECLOSED, "%s %s before it was ready%s%s", c->name, why,
                               c->log ? "; see " : "", c->log ? c->log : "");
        }
        if (c->pid && ready(ctx) == 0) return 0;
        int64_t left = end - now_ms();
        if (left <= 0)
            return strata_errf(STRATA_ETIMEDOUT, "%s was not ready after %.1f s", c->name,
                               timeout_ms / 1000.0);
        step(s, left < READY_POLL_MS ? (int)left : READY_POLL_MS);
    }
}

int sup_wait_ready(struct sup *s, int idx, sup_ready_fn ready, void *ctx, int timeout_ms)
{
    s->waiting = idx;
    int rv = wait_ready(s, idx, ready, ctx, timeout_ms);
    s->waiting = -1;
    return rv;
}

int sup_run(struct sup *s, int timeout_ms)
{
    int64_t end = timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
    for (;;) {
        if (s->stop) return 0;
        if (s->fatal >= 0) {
            struct sup_child *c = &s->c[s->fatal];
            char why[96];
            describe(c->status, why, sizeof why);
            s->fatal = -1;
            return strata_errf(STRATA_ECLOSED, "%s %s", c->name, why);
        }
        int64_t left = end - now_ms();
        if (left <= 0) return STRATA_ETIMEDOUT;
        step(s, left > 1000 ? 1000 : (int)left);
    }
}

static void signal_stage(struct sup *s, int stage, int sig)
{
    for (int i = 0; i < s->n; i++) {
        struct sup_child *c = &s->c[i];
        if (!c->pid || c->stage != stage) continue;
        /* The group first (the child and what it started); the pid alone if the child already
         * left its group. */
        if (kill(-c->pid, sig) != 0) kill(c->pid, sig);
    }
}

static bool stage_running(const struct sup *s, int stage)
{
    for (int i = 0; i < s->n; i++)
        if (s->c[i].pid && s->c[i].stage == stage) return true;
    return false;
}

void sup_stop_all(struct sup *s)
{
    s->stopping = true;
    for (int i = 0; i < s->n; i++)
        s->c[i].due_ms = 0;
    for (;;) {
        int stage = 0;
        bool any = false;
        for (int i = 0; i < s->n; i++) {
            if (s->c[i].pid && (!any || s->c[i].stage > stage)) stage = s->c[i].stage;
            any |= s->c[i].pid != 0;
        }
        if (!any) break;
        signal_stage(s, stage, SIGTERM);
        int64_t end = now_ms() + s->o.stop_timeout_ms;
        while (stage_running(s, stage) && !s->kill_now && now_ms() < end)
            step(s, 50);
        if (stage_running(s, stage)) {
            for (int i = 0; i < s->n; i++)
                if (s->c[i].pid && s->c[i].stage == stage)
                    LOG_WARN("%s (pid %d) did not stop%s: killing it", s->c[i].name,
                             (int)s->c[i].pid, s->kill_now ? "" : " in time");
            signal_stage(s, stage, SIGKILL);
            for (int i = 0; i < s->n; i++) {
                struct sup_child *c = &s->c[i];
                if (!c->pid || c->stage != stage) continue;
                waitpid(c->pid, &c->status, 0);
                c->pid = 0;
                c->died = true;
            }
        }
    }
    s->stopping = false;
    s->kill_now = false;
}

void sup_detach(struct sup *s, int idx)
{
    s->c[idx].pid = 0;
    s->c[idx].due_ms = 0;
    s->c[idx].restart = false;
    s->c[idx].died = false;
}

void sup_request_stop(struct sup *s)
{
    s->stop = true;
}

bool sup_stopping(const struct sup *s)
{
    return s->stop;
}

pid_t sup_pid(const struct sup *s, int idx)
{
    return s->c[idx].pid;
}

unsigned sup_restarts(const struct sup *s, int idx)
{
    return s->c[idx].restarts;
}

void sup_fini(struct sup *s)
{
    if (!s) return;
    sup_stop_all(s);
    for (int i = 0; i < s->n; i++)
        child_free(&s->c[i]);
    /* Stop signals that came meanwhile stay pending and would act on the restored mask: take
     * them first so the caller decides (it is exiting anyway). */
    struct timespec zero = {0, 0};
    while (sigtimedwait(&s->waited, NULL, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &s->old_mask, NULL);
    free(s);
}
