/* worker — strata-worker's life: config -> init (attach the arena or open a model file, build the
 * model, start the engine and the service, register) -> run (heartbeat until stopped) -> fini
 * (unregister, stop, unmap).
 *
 * With an arena the model's dense weights and experts are read in place from the arena's mapping
 * (PROT_READ), the worker takes a slot in the arena's registry (pid, endpoint, cache size) and
 * stamps its heartbeat every second, and the engine's expert routing is added to the arena's heat
 * counters. With a model file (--model) the same layout is planned in-process (for the metadata
 * served by `meta` and the fingerprint) and weights are read from the file's mapping; there is no
 * registry then. The socket is ipc://<runtime dir>/worker-<n>.sock with the lowest n whose lock
 * is free, so several workers share one runtime directory.
 * The CPU backend is the only one today; its answers are bit-exact (gpu-worker/fwd.h).
 * worker_stop is async-signal-safe; everything else belongs to the main thread.
 */
#ifndef STRATA_WORKER_H
#define STRATA_WORKER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "gpu-worker/backend.h"

struct worker_config {
    const char *arena;       /* arena name (strata-arena serve), or NULL with model */
    const char *model;       /* a GGUF file to serve without an arena, or NULL */
    const char *shm_dir;     /* the arena's shm directory; NULL: /dev/shm */
    const char *runtime_dir; /* socket directory; NULL: $XDG_RUNTIME_DIR/strata/<name> */
    int threads;             /* forward-pass threads; 0: 1 */
    int orphan_timeout_s;    /* lease of a request not polled; 0: 10 */
    int max_seqs;            /* requests decoded at once; 0: 16 */
    int max_queue;           /* requests waiting; 0: 64 */
    int ctx;                 /* positions per request; 0: the model's trained context */
    bool bit_exact;          /* worker_init refuses (STRATA_EUNSUPPORTED) a backend and options
                                that cannot promise bit-exact answers (DESIGN 3.4) */
    int spec_lookup;             /* prompt-lookup drafts per window (engine_opts.spec_lookup) */
    const char *draft;           /* --draft: a draft model's GGUF file (same vocabulary), or NULL */
    int draft_max;               /* its drafts per window (engine_opts.spec_draft); 0: 4 */
    struct backend_opts backend; /* name, KV type, expert cache (backend_opt); sizes are ours */
    int watchdog_ms;         /* ipc watchdog period; 0: default */
};

struct worker;

/* worker_init does everything up to serving. Errors: STRATA_ENOENT (no such arena or file: the
 * detail says how to make one), STRATA_EINVAL (config), model/engine/ipc errors. Caller owns *out
 * (worker_fini). */
int worker_init(const struct worker_config *c, struct worker **out);

/* worker_run blocks, stamping the registry heartbeat every second, until worker_stop. Warns once
 * when the arena's segment was unlinked under it. Returns 0. */
int worker_run(struct worker *w);

/* worker_stop makes worker_run return; async-signal-safe. */
void worker_stop(struct worker *w);

/* worker_fini unregisters, stops the service and the engine, frees; NULL is fine. */
void worker_fini(struct worker *w);

/* worker_url: the endpoint served, e.g. "ipc:///run/user/1000/strata/m/worker-0.sock". */
const char *worker_url(const struct worker *w);

#endif
