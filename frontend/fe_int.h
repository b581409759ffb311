/* fe_int — the frontend's shared state, for fe.c (server, workers, monitor, metrics, small
 * endpoints) and fe_job.c (generations). Not part of the fe API.
 *
 * Locking: f->mu guards the worker status copies, the job count and the model pointer's first
 * publication; counters are atomics; a worker's ready flag and in-flight count are atomics read
 * without the lock by the router (a slightly stale queue length only makes routing less even).
 */
#ifndef STRATA_FE_INT_H
#define STRATA_FE_INT_H

#include "frontend/api.h"
#include "frontend/fe.h"
#include "frontend/fe_model.h"
#include "frontend/http.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define FE_MAX_WORKERS 32

struct fe_worker {
    const struct fe_backend *ops;
    void *h;
    char name[256];
    atomic_bool ready;   /* answered hello with the model's fingerprint, and no call of a
                            stream failed since (the router's and mover's test) */
    bool refused;        /* another model's fingerprint (logged once) */
    bool discovered;     /* from the discovery: dropped when it is no longer listed */
    bool dropped;        /* no longer listed: not checked, not ready (f->mu) */
    bool was_down;       /* the last hello failed (logged on the transitions only) */
    atomic_int inflight; /* this frontend's generations on it */
    bool has_status;     /* st was read at least once (f->mu) */
    struct wclient_status st;
    struct wclient_hello hello; /* its last hello (f->mu): backend and KV type for failover */
    bool has_hello;
    /* read only while someone watches /status (FE_STATUS_WATCH_MS), under f->mu: */
    bool has_vram;
    struct wclient_vram vram;
    struct wclient_heat heat;
    atomic_ullong requests; /* generations routed to it */
};

/* The monitor reads vram and heat of each worker for this long after the last GET /status. */
#define FE_STATUS_WATCH_MS 5000

struct fe {
    struct fe_opts o;
    struct http_server *http;
    struct fe_worker workers[FE_MAX_WORKERS];
    atomic_int n_workers;     /* grows only, from the monitor once started; a slot is set before it
                                 is counted */
    struct fe_discovery disc; /* disc.list NULL: the workers are fixed */
    char disc_urls[FE_MAX_WORKERS][FE_URL_MAX];
    bool disc_full; /* a listed worker found no slot (logged once) */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* monitor wake-up, job count drops, readiness */
    pthread_t monitor;
    bool monitor_on;
    atomic_bool stopping;
    bool stopped;
    atomic_bool ready; /* model built and a worker ready */
    int model_err;     /* why the model could not be built (f->mu) */
    char model_err_detail[256];
    struct fe_model model; /* valid once model_ok (never changes after) */
    atomic_bool model_ok;
    uint64_t fingerprint;
    int n_jobs;          /* generation threads alive (f->mu) */
    int n_admitted;      /* of them, not yet answering: counted against max_active (f->mu) */
    struct fe_job *jobs; /* their list, to cancel at stop (f->mu) */
    atomic_llong status_seen_ns; /* CLOCK_MONOTONIC of the last GET /status, 0: never */
    int64_t started_ns;
    atomic_ullong next_id;
    char id_prefix[40];
    /* metrics */
    atomic_ullong m_requests, m_errors, m_gen_requests, m_prompt_tokens, m_gen_tokens,
        m_cached_tokens, m_busy, m_disconnects, m_moves;
    atomic_ullong m_prefill_us, m_decode_us, m_ttft_us, m_ttft_n;
};

/* fe_reply_error answers r with e (OpenAI's shape) and counts it; fe_reply_error_as in the shape of
 * kind's API (api_error_json_as). */
void fe_reply_error(struct fe *f, struct http_req *r, const struct api_error *e);
void fe_reply_error_as(struct fe *f, struct http_req *r, enum api_kind kind,
                       const struct api_error *e);

/* fe_job_http handles POST /v1/chat/completions, /v1/completions, /v1/messages and /v1/responses:
 * parse, prompt, route, submit, then a thread of its own streams or collects the answer. Answers r
 * in every case. */
void fe_job_http(struct fe *f, struct http_req *r, enum api_kind kind);

/* fe_worker_gone: rv means the worker does not answer (a timeout, a broken connection, busy). */
bool fe_worker_gone(int rv);

/* fe_move_stream moves stream (of ops, on worker *slot, whose poll failed with why: STRATA_ENOENT
 * when the worker answered that it lost the request, else a call error) to the ready worker of
 * the same fe_backend, compute backend and KV type (hello's backend, kv_type) with the shortest
 * queue, other workers first; a worker that lost the request
 * but answers takes it back when no other can. A worker whose calls failed is marked not ready
 * (the monitor's next hello decides again). Blocks on the submits. Returns 0 and the new *slot,
 * STRATA_ESTATE (nowhere to go), or the last move's error. */
int fe_move_stream(struct fe *f, const struct fe_backend *ops, void *stream, int *slot, int why);

/* fe_jobs_cancel asks every job to end (fe_stop); f->mu held. */
void fe_jobs_cancel(struct fe *f);

#endif
