/* arena_serve — the arena-server's life: lock, adopt or build, publish, serve, shut down.
 *
 * arena_serve_init takes the per-name lock file (a second server of the name gets STRATA_EBUSY
 * naming the holder), then adopts a published arena whose fingerprint matches and whose state is
 * READY (reading no tensor data), or removes it and builds a new one under a temporary name:
 * space check, threaded fill that allocates each range just before writing it, READY with a
 * release store, fchmod 0400 (0440 with group), rename into place. It holds flock(LOCK_EX) on both segments while serving, creates or
 * adopts the state segment and loads the heat profile. arena_serve_run blocks (main thread) until
 * arena_serve_stop (async-signal-safe: call it from a SIGINT/SIGTERM handler) or a shutdown
 * request, saving the profile periodically; arena_serve_fini saves it once more and unlinks the
 * segments unless live registered workers still map them (then they stay for the next server to
 * adopt) or force is set.
 */
#ifndef STRATA_ARENA_SERVE_H
#define STRATA_ARENA_SERVE_H

#include "arena-server/arena_build.h"
#include "common/arena/arena.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct arena_serve_config {
    const char *model;         /* the GGUF file (the first split of a split set) */
    const char *name;          /* arena name; NULL: the model's base name without .gguf */
    const char *shm_dir;       /* NULL: /dev/shm */
    const char *runtime_dir;   /* control socket directory; NULL: $XDG_RUNTIME_DIR/strata/NAME */
    const char *profile;       /* heat profile path; NULL: $XDG_STATE_HOME/strata/<fp>.profile */
    uint64_t align;            /* blob alignment; 0: 4 KiB */
    bool force;                /* unlink segments at exit even while workers map them */
    bool group;                /* segments readable by the group (0440 / 0660) */
    bool control;              /* serve the control socket */
    int threads;               /* build threads; 0: automatic */
    int profile_every_s;       /* profile save period; 0: 60 s */
    bool progress;             /* progress bar while building */
    const _Atomic int *cancel; /* set (by a signal handler) to abandon a build in progress */
};

struct arena_server {
    struct arena_serve_config cfg;
    char name[SHM_NAME_MAX + 1];
    char wseg[256], sseg[256]; /* segment names */
    char lock_path[4096];
    char model_path[4096]; /* absolute */
    char profile_path[4096];
    uint64_t saved_heat; /* heat_total when the profile was last loaded or saved: nothing new, no
                            write (a model that never served leaves no profile behind) */
    int lock_fd;
    uint64_t fingerprint;
    struct arena *arena;            /* the published weights segment, read-only */
    struct arena_state *state;      /* the state segment, read-write */
    bool adopted;                   /* true: found ready, nothing read */
    double load_s;                  /* adoption or build wall time */
    struct arena_build_stats build; /* when built */
    int64_t started_ns;
    _Atomic int stop;        /* set by arena_serve_stop */
    _Atomic bool force_stop; /* a shutdown request asked for force */
    struct arena_ctl *ctl;   /* the control socket, or NULL */
};

/* arena_serve_init makes the arena available (adopting or building). Returns 0 and *out, or:
 * STRATA_EBUSY (another server holds the name), STRATA_ENOSPC (does not fit: the detail says how
 * much is needed and what to do), GGUF errors, errno codes. Leaves nothing behind on failure. */
int arena_serve_init(const struct arena_serve_config *cfg, struct arena_server **out);

/* arena_serve_run serves until stopped. Returns 0. */
int arena_serve_run(struct arena_server *s);

/* arena_serve_stop asks arena_serve_run to return; async-signal-safe, any thread. */
void arena_serve_stop(struct arena_server *s, bool force);

/* arena_serve_fini saves the profile, unlinks or keeps the segments, releases the lock and frees.
 * NULL is fine. */
void arena_serve_fini(struct arena_server *s);

#endif
