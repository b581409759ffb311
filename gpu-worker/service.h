/* service — strata-worker's protocol: the worker ops of docs/protocol.md (hello, meta, submit,
 * poll, cancel, status, vram) served over ipc on top of an engine.
 *
 * Every op but poll answers at once on nng's thread. A poll that finds nothing new for any of its
 * ids is parked with its call (one ipc context, no thread) and answered by the service's thread
 * when the engine's on_window hook (service_on_window) says a window ran, or when its wait ends;
 * waits are capped at WCLIENT_POLL_WAIT_MAX_MS, far below NNG's 60 s resend. The same thread
 * samples engine_status twice a second for the tok/s figures of status. The ipc context pool holds
 * max_running + max_queue parked polls plus SERVICE_CONTROL_CTX for submit, cancel and status, so
 * long-polls never starve control ops.
 * Every op is idempotent (a duplicate submit returns the existing request, cancel of an unknown
 * request succeeds); unknown keys are ignored; per-op limits are answered with an error reply.
 * Lifecycle: service_init (the object the engine's hook points at) -> engine_start ->
 * service_start -> ... -> service_stop -> engine_close -> service_fini.
 */
#ifndef STRATA_SERVICE_H
#define STRATA_SERVICE_H

#include "common/ipc/msg.h"
#include "common/ipc/wclient.h"
#include "gpu-worker/engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SERVICE_CONTROL_CTX 16   /* ipc contexts beyond the parked polls, for the other ops */
#define SERVICE_POLL_CAP    1024 /* tokens of one request in one poll reply; the rest next poll */

struct service_opts {
    const void *meta; /* the GGUF metadata bytes served by `meta` (borrowed) */
    size_t meta_len;
    uint64_t fingerprint;   /* XXH3_64bits of meta: the model's identity in hello */
    const char *model_name; /* for hello */
    const char *arch;
    uint32_t n_vocab;     /* token ids must be below it */
    uint32_t n_ctx;       /* positions per request (the engine's) */
    uint32_t max_running; /* as engine_opts (resolved, not 0) */
    uint32_t max_queue;
    uint64_t weights_bytes; /* for vram: model weights this worker holds */
    int watchdog_ms;        /* ipc watchdog period; 0: ipc's default */
};

struct service;

/* service_init copies o (strings and meta stay borrowed) and makes the service, not serving yet.
 * Caller owns *out (service_fini). */
int service_init(const struct service_opts *o, struct service **out);

/* service_on_window is the engine's on_window hook (ctx: the service). Wakes the poll thread;
 * never blocks beyond a short mutex. Harmless before service_start and after service_stop. */
void service_on_window(void *ctx);

/* service_start serves url (ipc://) over e (borrowed: stop the service before the engine).
 * Returns 0, or ipc_server_start's errors (STRATA_EBUSY: another process serves that path; s may
 * then be started on another url). */
int service_start(struct service *s, struct engine *e, const char *url);

/* service_stop closes the socket (answers nothing more), drops parked polls and joins the thread.
 * Safe twice and on a service never started. */
void service_stop(struct service *s);

/* service_fini stops s if needed and frees it; NULL is fine. */
void service_fini(struct service *s);

/* service_url: the URL served. */
const char *service_url(const struct service *s);

/* A decoded submit. Strings and arrays live in the msg's zone. */
struct service_submit {
    struct engine_req req;
    bool has_seed;
};

/* service_parse_submit reads and validates a submit request (limits of wclient.h, token ids below
 * n_vocab, prompt below n_ctx). sampling fields absent take sample_params_default's values.
 * STRATA_ENOENT (required field missing), STRATA_EPROTO (type or range), STRATA_ELIMIT (a limit),
 * with a detail naming the field. Fuzzed (service_fuzz.c). */
int service_parse_submit(struct msg *m, uint32_t n_vocab, uint32_t n_ctx,
                         struct service_submit *out);

/* A decoded poll: n ids (NUL-terminated, in the zone) with their from indices. */
struct service_poll {
    const char *ids[WCLIENT_POLL_MAX_IDS];
    uint32_t from[WCLIENT_POLL_MAX_IDS];
    uint32_t n;
    int wait_ms; /* 0..WCLIENT_POLL_WAIT_MAX_MS */
};

/* service_parse_poll reads {ids, from, wait_ms}: from is an array as long as ids or one integer
 * for all; wait_ms defaults to 2000 and is capped (not refused) at WCLIENT_POLL_WAIT_MAX_MS.
 * Errors as service_parse_submit. Fuzzed. */
int service_parse_poll(struct msg *m, struct service_poll *out);

/* service_parse_ids reads the "ids" array of cancel (or poll): 1..WCLIENT_POLL_MAX_IDS strings of
 * 1..WCLIENT_ID_MAX bytes. */
int service_parse_ids(struct msg *m, const char **ids, uint32_t *n);

#endif
