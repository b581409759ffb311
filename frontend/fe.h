/* fe — strata-frontend: the OpenAI-compatible HTTP API (and Anthropic's Messages, OpenAI's
 * Responses, llama-server's extras) in front of one or more workers.
 *
 * A struct fe owns the HTTP server (frontend/http.h), the workers it talks to (one backend handle,
 * i.e. one REQ socket, each), the model built from the first worker's metadata (fe_model.h), the
 * generations in flight and the metrics. A monitor thread says hello to every worker once a second
 * (refusing one whose model fingerprint differs from the first's), fetches the metadata once, and
 * reads each worker's status for routing and /metrics; with a discovery (an arena's registry) it
 * also adds the workers that appear and drops those that leave. Each generation runs on a thread of
 * its own that polls its worker and writes SSE chunks or the final body; a request goes to the
 * ready worker with the shortest queue. When its worker fails (calls time out past failover_ms, or
 * it lost the request), the stream moves to another ready worker of the model with the same backend
 * and KV type (their hellos say; another would compute other logits), invisibly to the client,
 * and the failed worker takes no new request until it answers a hello again. The pages `/` and
 * `/monitor` (fe_web.h) and GET /status (fe_status.h) are served beside the API.
 * Lifecycle: fe_init, fe_worker_add..., fe_start, fe_stop, fe_fini (stop before fini). Any HTTP
 * thread may use the fe between start and stop.
 * Workers are reached through struct fe_backend, so tests can drive the whole frontend with an
 * in-process fake; fe_wclient.c is the real one (common/ipc/wclient.h).
 */
#ifndef STRATA_FE_H
#define STRATA_FE_H

#include "common/ipc/wclient.h"

#include <stddef.h>
#include <stdint.h>

/* A worker as the frontend uses it. Calls block (each has its own deadline) and may run from any
 * thread at once; a stream belongs to one thread. Errors are STRATA_* codes with a detail. */
struct fe_backend {
    int (*hello)(void *w, struct wclient_hello *out);
    int (*meta)(void *w, struct wclient_meta *out);
    void (*meta_free)(struct wclient_meta *m);
    int (*status)(void *w, struct wclient_status *out);
    int (*stream_start)(void *w, const struct wclient_req *r, void **stream);
    int (*stream_next)(void *stream, const struct wclient_update **u);
    int (*stream_cancel)(void *stream);
    void (*stream_free)(void *stream);
    void (*close)(void *w);
    /* stream_move resumes the stream on worker w of the same backend (another worker, or its own
     * after it lost the request): wclient_stream_move. On error the stream is unchanged. */
    int (*stream_move)(void *stream, void *w);
    /* For the monitor page (fe_status.h), NULL when the backend has none: the worker's memory
     * (wclient_vram) and its routing counts (wclient_heat, freed with heat_free). */
    int (*vram)(void *w, struct wclient_vram *out);
    int (*heat)(void *w, struct wclient_heat *out);
    void (*heat_free)(struct wclient_heat *h);
};

struct fe_opts {
    const char *host;           /* bind address; NULL: 127.0.0.1 */
    int port;                   /* 0: any free port (fe_port) */
    const char *api_key;        /* NULL: no key; else "Authorization: Bearer KEY" is required */
    int threads;                /* HTTP threads; 0: 4 */
    unsigned conn_limit;        /* open connections; 0: 256 */
    unsigned timeout_s;         /* idle connection timeout; 0: 60 */
    unsigned request_timeout_s; /* a request's head and body must arrive within it; 0: 30 */
    size_t max_body;            /* request body bytes; 0: 8 MiB */
    uint32_t max_tokens;        /* most tokens one request may ask for; 0: the context */
    uint32_t max_active;        /* generations in flight; more get 429; 0: 64 */
    const char *chat_template;  /* --chat-template NAME|FILE; NULL: the model's */
    const char *model_alias;    /* the name /v1/models reports; NULL: general.name */
    int monitor_ms;             /* hello/status (and discovery) period; 0: 1000 */
    int failover_ms;    /* a worker that does not answer a call within this (beyond a poll's wait)
                           is down: its streams move to another worker; 0: 1500 */
    int worker_wait_ms; /* a request that finds no worker ready (one restarting) waits this long
                           for one, on its own thread, before its 503; 0: 10000; < 0: no wait */
};

struct fe;

/* fe_init makes a frontend with no workers and no model yet. STRATA_ENOMEM. */
int fe_init(const struct fe_opts *o, struct fe **out);

/* fe_worker_add hands the frontend a worker: ops and handle w (the fe closes it at fini), name for
 * logs and metrics (e.g. its URL). Before fe_start only (after it, workers come from a discovery).
 * STRATA_ELIMIT past 32 workers. */
int fe_worker_add(struct fe *f, const struct fe_backend *ops, void *w, const char *name);

/* The real workers (fe_wclient.c). fe_add_worker_url opens a wclient for url and adds it.
 * fe_add_workers_arena adds every live worker of arena `name`'s registry (shm_dir NULL:
 * /dev/shm) and follows the registry (fe_discovery_set); STRATA_ENOENT when there is none, or the
 * arena's error. */
extern const struct fe_backend fe_backend_wclient;
int fe_add_worker_url(struct fe *f, const char *url);
int fe_add_workers_arena(struct fe *f, const char *shm_dir, const char *name);

#define FE_URL_MAX 256

/* A source of workers that changes while the frontend runs (an arena's registry). */
struct fe_discovery {
    void *ctx; /* owned by the fe from fe_discovery_set on, freed with fini at fe_fini */
    /* list writes the URLs of the workers to use now (at most max); 0, or an error: that round
     * changes nothing */
    int (*list)(void *ctx, char (*urls)[FE_URL_MAX], int max, int *n);
    /* open makes the backend handle of a URL seen for the first time */
    int (*open)(void *ctx, const char *url, const struct fe_backend **ops, void **w);
    void (*fini)(void *ctx); /* may be NULL */
};

/* fe_discovery_set (before fe_start, once) adds the workers d lists now, and makes the monitor list
 * them again every monitor_ms: a new URL is opened and added (up to 32 workers in all), a worker no
 * longer listed is dropped from routing (its handle stays open until fini, its streams move away)
 * and taken back when it is listed again. *n (may be NULL) gets the number listed now. Returns 0
 * or list's error. */
int fe_discovery_set(struct fe *f, const struct fe_discovery *d, int *n);
/* fe_arena_endpoints lists up to max endpoints of live workers in arena `name`'s registry.
 * STRATA_ENOENT when there is none (the detail says what to start), or the arena's error. */
int fe_arena_endpoints(const char *shm_dir, const char *name, char (*urls)[FE_URL_MAX], int max,
                       int *n);

/* fe_start binds the HTTP server and starts the monitor. /health answers 503 until a worker
 * answered and the model was built from its metadata. Errors of http_server_start. */
int fe_start(struct fe *f);

/* fe_port is the bound HTTP port (after fe_start). */
int fe_port(const struct fe *f);

/* fe_wait_ready blocks until a worker is ready (0) or timeout_ms passed (STRATA_ETIMEDOUT); a
 * model that could not be built is returned as its error. */
int fe_wait_ready(struct fe *f, int timeout_ms);

/* fe_model_of returns the model once ready (NULL before): for the CLI chat, which also uses
 * fe_generate below instead of HTTP. */
const struct fe_model *fe_model_of(const struct fe *f);

/* fe_stop refuses new requests (503), cancels the generations in flight, waits for their threads,
 * stops the monitor and the HTTP server. Safe to call twice. */
void fe_stop(struct fe *f);

/* fe_fini stops f if needed, closes the workers and frees f. NULL is fine. */
void fe_fini(struct fe *f);

/* fe_pick_stream starts a stream for r on the ready worker with the shortest queue, trying the
 * next on STRATA_EBUSY. *ops and *stream are the backend and stream to drive; *slot identifies the
 * worker for fe_release. Returns 0, STRATA_ESTATE (no worker ready), STRATA_EBUSY (all busy) or the
 * submit's error (STRATA_ELIMIT: prompt past the worker's context). */
int fe_pick_stream(struct fe *f, const struct wclient_req *r, const struct fe_backend **ops,
                   void **stream, int *slot);

/* fe_release ends the bookkeeping of a stream from fe_pick_stream (after its last use). */
void fe_release(struct fe *f, int slot);

/* fe_next_id writes a request id unique across frontends and restarts into buf (>= 48 bytes). */
void fe_next_id(struct fe *f, char *buf, size_t n);

#endif
