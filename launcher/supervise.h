/* supervise — the supervisor of `strata serve`: spawns child processes, watches them, restarts the
 * ones that die with exponential backoff, and stops them all in order.
 *
 * Children start when sup_start says so and stop by stage, highest first, all children of a stage
 * at once (serve puts the arena in stage 0, workers in 1, frontends in 2: frontends go first so no
 * new request comes in, the arena last so no worker still maps it when it unlinks the segments).
 * A stop is SIGTERM to the child's process group, then SIGKILL after stop_timeout_ms.
 * Children are spawned with posix_spawn (nng is not fork-safe and the supervisor may hold nng
 * sockets for its readiness checks), each in its own process group, so a terminal's Ctrl-C reaches
 * only the supervisor, which then stops them in order. sup_init blocks SIGINT, SIGTERM, SIGHUP and
 * SIGCHLD in the calling thread (restored by sup_fini) and the supervisor waits for them with
 * sigtimedwait; call it before any other thread starts (nng's included) so that every thread
 * inherits the mask and no stop signal is delivered elsewhere. Children get an empty mask and
 * default handlers. SIGINT, SIGTERM or SIGHUP
 * request a stop; a second one during the stop kills what is left at once.
 * Backoff: a child that dies is restarted after backoff_min_ms, doubled at each death up to
 * backoff_max_ms; a child that had stayed up stable_ms starts again from backoff_min_ms.
 * One thread owns a sup and calls all of this; nothing here is thread-safe.
 */
#ifndef STRATA_SUPERVISE_H
#define STRATA_SUPERVISE_H

#include <stdbool.h>
#include <sys/types.h>

#define SUP_MAX_CHILDREN 64

struct sup;

struct sup_opts {
    int backoff_min_ms;  /* first restart delay; 0: 200 */
    int backoff_max_ms;  /* cap of the doubling; 0: 30000 */
    int stable_ms;       /* uptime after which a death counts as the first; 0: 10000 */
    int stop_timeout_ms; /* SIGTERM to SIGKILL; 0: 10000 */
    /* on_spawn: called after every successful spawn (first start and restarts), e.g. to rewrite a
     * state file with the new pid. NULL: none. */
    void (*on_spawn)(void *ctx, int idx, pid_t pid);
    void *spawn_ctx;
};

struct sup_child_opts {
    const char *name;  /* for messages: "arena", "worker-0"; at most 31 bytes */
    char *const *argv; /* argv[0] is the executable's path (no PATH search); copied */
    char *const *env;  /* "NAME=value" entries set on top of our environment (replacing ours of
                          the same name), NULL-terminated; NULL: ours as it is; copied */
    const char *log;   /* file that gets stdout and stderr (appended); NULL: inherit ours */
    int stage;         /* stop order: higher stages stop first */
    bool restart;      /* restart when it dies; false: its death ends sup_run */
    int fatal_status;  /* an exit status by which the child says that starting it again cannot
                          help (strata-arena's 1: it could not start): it is then not restarted
                          and its death ends sup_run, as with restart false; 0: none */
};

/* sup_ready_fn says whether a started child is ready to serve: 0 yes, anything else not yet
 * (called again ~100 ms later). It runs on the supervisor's thread and should not block long. */
typedef int (*sup_ready_fn)(void *ctx);

/* sup_init makes an empty supervisor (o may be NULL for the defaults) and blocks the signals it
 * waits for in the calling thread. Returns 0, STRATA_ENOMEM or an errno error. */
int sup_init(const struct sup_opts *o, struct sup **out);

/* sup_add copies c and gives its index in *idx; the child does not start yet. STRATA_EINVAL for a
 * missing argv or name, STRATA_ELIMIT past SUP_MAX_CHILDREN, STRATA_ENOMEM. */
int sup_add(struct sup *s, const struct sup_child_opts *c, int *idx);

/* sup_start spawns child idx now (it must not be running). Returns 0, or the spawn's errno error
 * with a detail naming the executable (e.g. STRATA_ESYSERR|ENOENT: not built). */
int sup_start(struct sup *s, int idx);

/* sup_wait_ready blocks until ready(ctx) returns 0, restarting other children meanwhile. Returns 0;
 * STRATA_ECANCELED when a stop was requested (by a signal); STRATA_ECLOSED when child idx exited
 * before it was ready (the detail has its exit status and name; it is not restarted);
 * STRATA_ETIMEDOUT after timeout_ms (negative: no limit). */
int sup_wait_ready(struct sup *s, int idx, sup_ready_fn ready, void *ctx, int timeout_ms);

/* sup_run watches the children and restarts the ones that die until a stop is requested (returns
 * 0), a child added with restart false dies (STRATA_ECLOSED, the detail names it), or timeout_ms
 * passes (STRATA_ETIMEDOUT; negative: no limit). Call it again to go on watching. */
int sup_run(struct sup *s, int timeout_ms);

/* sup_stop_all stops every running child, stage by stage, highest first: SIGTERM to its process
 * group, SIGKILL after stop_timeout_ms (at once on a second stop signal). Returns when all have
 * been reaped. Nothing is restarted after it; sup_start may start children again. */
void sup_stop_all(struct sup *s);

/* sup_detach forgets child idx: it is neither stopped nor waited for from now on (serve
 * --keep-arena leaves the arena running past its own exit). */
void sup_detach(struct sup *s, int idx);

/* sup_request_stop makes sup_run and sup_wait_ready return as a stop signal would. */
void sup_request_stop(struct sup *s);

/* sup_stopping says whether a stop was requested. */
bool sup_stopping(const struct sup *s);

/* sup_pid: child idx's pid, 0 while it is not running. */
pid_t sup_pid(const struct sup *s, int idx);

/* sup_restarts: how many times child idx was restarted after dying. */
unsigned sup_restarts(const struct sup *s, int idx);

/* sup_fini stops what still runs (sup_stop_all), restores the signal mask and frees; NULL is
 * fine. */
void sup_fini(struct sup *s);

#endif
