/* engine — the worker's scheduler: continuous batching of many requests over one forward pass
 * (a backend, backend.h) and a paged KV cache (kv) with a prefix cache, sampling (sample), leases and timings.
 *
 * One decode-loop thread owns the model pass, the KV cache and every running sequence. A window
 * is one backend_eval of at most max_batch_tokens tokens: first one token of every request that is
 * decoding, then prompt chunks of the requests still prefilling, oldest first. Waiting requests
 * join at window boundaries when the cache can reserve blocks for their prompt plus a share of
 * their max_tokens; when blocks run out the youngest running request is preempted (its blocks
 * freed) and requeued at the head of the queue with its prompt plus what it generated, to be
 * recomputed. Full blocks are published to the prefix cache, so a request whose prompt starts
 * with a cached prefix (a chat's next turn, a preempted request) prefills only the rest.
 * Bit-exact (DESIGN 3.4): a request's tokens never depend on its neighbours, preemption, the
 * prefix cache or a resubmission with its history (same seed: the draw is keyed by position).
 * engine_submit, _poll, _cancel, _status and _epoch may be called from any thread; they take a
 * short lock and never wait for a window. Hooks run on the decode thread and must not block.
 */
#ifndef STRATA_ENGINE_H
#define STRATA_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/arena/model.h"
#include "gpu-worker/backend.h"
#include "gpu-worker/sample.h"
#include "gpu-worker/spec.h"

#define ENGINE_ID_MAX         64 /* most bytes of a request id (without the NUL) */
#define ENGINE_MAX_STOP       16 /* most stop token ids per request */
#define ENGINE_PENALTY_WINDOW 64 /* penalties look at the last N generated tokens (llama.cpp's) */
#define ENGINE_MAX_DRAFT      SPEC_MAX_DRAFT /* drafts verified per request and window */
#define ENGINE_GRAMMAR_CACHE  16 /* grammars whose tables (states, masks) later requests share */
#define ENGINE_GRAMMAR_BYTES  (64u << 20) /* a grammar's tables past this (or failed) start
                                              afresh, well before their state limit */

struct engine_opts {
    uint32_t n_ctx;             /* positions per sequence; 0: the model's trained context */
    uint32_t kv_blocks;         /* KV pool in blocks of BACKEND_KV_BLOCK positions; 0: n_ctx
                                   worth for each of max_running sequences */
    uint32_t max_running;       /* sequences in the batch at once; 0: 16 */
    uint32_t max_queue;         /* requests waiting for admission before submit says busy; 0: 64 */
    uint32_t max_batch_tokens;  /* tokens per window (decode steps + prompt chunks); 0: 256 */
    uint32_t reserve_pct;       /* admission reserves blocks for the prompt plus this % of
                                   max_tokens; 0: 25 (pass >100 to reserve all of max_tokens) */
    uint32_t n_threads;         /* threads of the forward pass; 0: 1 */
    uint32_t orphan_timeout_ms; /* lease: a request not polled for this long is cancelled, and a
                                   finished one forgotten; 0: 10000 */
    bool no_prefix_cache;       /* do not share blocks between requests */
    uint32_t spec_lookup;       /* prompt-lookup drafts a decoding request verifies per window
                                   (0 off, up to ENGINE_MAX_DRAFT); fewer while few are accepted */
    const struct model *draft;  /* a draft model (spec.h: same vocabulary, run on the CPU backend
                                   with its own KV), borrowed like m; NULL: none. With one, it
                                   drafts instead of prompt lookup */
    uint32_t spec_draft;        /* the draft model's drafts per request and window (1..
                                   ENGINE_MAX_DRAFT; 0: 4); fewer while few are accepted */
    struct backend_opts backend; /* which backend, its KV type and expert cache; the sizes (threads,
                                    tokens per pass, context, sequences, blocks) are the fields
                                    above */
    /* on_window: called on the decode thread after every window and every other change of state
     * (admission, finish, cancel, lapse). Must not block: the service wakes long-polls from it. */
    void (*on_window)(void *ctx);
    void *window_ctx;
    /* on_route: expert heat. Called on the decode thread once per (layer, expert) a window
     * routes tokens to, with n the tokens routed to it (prompt tokens recomputed after a
     * preemption count again; prefix-cache hits are not computed, so not counted). Must not
     * block (arena_heat_add is lock-free). NULL: no heat. */
    void (*on_route)(void *ctx, uint32_t layer, uint32_t expert, uint32_t n);
    void *route_ctx;
};

struct engine_req {
    const char *id; /* client-made, 1..ENGINE_ID_MAX bytes; a duplicate is the same request */
    const int32_t *prompt; /* token ids, copied */
    uint32_t n_prompt;     /* 1..n_ctx-1: room for at least one token */
    uint32_t max_tokens;   /* most tokens to generate (beyond n_generated); 0: up to the context */
    struct sample_params sp; /* sampling; sp.seed is the caller's (the service picks one when the
                                client gave none); sp.n_logprobs is ignored: see logprobs/n_top */
    const int32_t *stop;     /* stop token ids (EOS, end of turn), copied; a stop token is
                                returned as the last token */
    uint32_t n_stop;         /* 0..ENGINE_MAX_STOP */
    uint32_t n_generated;    /* the last n_generated prompt ids were generated (a resumed request):
                                penalties count them and sampling positions continue after them */
    bool logprobs;           /* report each token's logprob */
    uint32_t n_top;          /* and this many top alternatives, 0..SAMPLE_MAX_LOGPROBS */
    const char *grammar;     /* GBNF (NUL-terminated) the generated tokens must follow, or NULL:
                                compiled at submit (a bad one is STRATA_EINVAL with the line), its
                                state rebuilt from the n_generated tokens; stop ids are allowed
                                only once the grammar accepts, and a sentence nothing may follow
                                finishes as STOP without a stop token */
};

enum engine_finish {
    ENGINE_FINISH_NONE = 0,  /* running (or tokens remain to be polled) */
    ENGINE_FINISH_STOP,      /* a stop token was generated (it is the last token) */
    ENGINE_FINISH_LENGTH,    /* max_tokens or the context reached */
    ENGINE_FINISH_CANCELLED, /* engine_cancel, a lapsed lease or engine_close */
    ENGINE_FINISH_ERROR,     /* the forward pass or the sampler failed: see error */
};

struct engine_token {
    int32_t id;
    float logprob; /* log-softmax of the raw logits; 0 unless logprobs were asked */
    uint32_t n_top;
    struct sample_logprob top[SAMPLE_MAX_LOGPROBS];
};

struct engine_timings {
    double queue_ms;      /* submit (or requeue after preemption) to admission, summed */
    double prefill_ms;    /* admission to the first token, summed over admissions */
    double decode_ms;     /* first token to the last (or to now while running) */
    uint32_t n_prefilled; /* prompt positions made ready, cached ones included; recomputation
                             after preemption counts again */
    uint32_t n_cached;    /* of them, positions taken from the prefix cache */
    uint32_t n_preempted; /* times the request was preempted */
    uint32_t n_draft;     /* drafts verified (llama-server's draft_n) */
    uint32_t n_draft_accepted; /* of them, accepted (draft_n_accepted) */
    uint32_t n_passes;    /* decode passes that sampled its tokens: generated tokens per pass
                             is n_generated / n_passes */
};

/* What engine_poll returns. The caller sets toks and cap; the rest is filled in. */
struct engine_update {
    struct engine_token *toks; /* in: room for cap tokens */
    uint32_t cap;
    uint32_t n;                /* tokens copied: indices from .. from+n-1 of the generated tokens */
    uint32_t n_total;          /* tokens generated so far */
    enum engine_finish finish; /* NONE until every token was returned (from + n == n_total) */
    bool grammar_end;          /* finish STOP by a complete grammar sentence: the last token is
                                  text, not a stop id */
    int error;                 /* finish == ERROR: the code; message in error_msg */
    char error_msg[256];
    uint64_t seed;
    struct engine_timings t;
};

struct engine_status {
    uint32_t running;          /* requests admitted (holding or being given KV blocks) */
    uint32_t queued;           /* waiting for admission, preempted ones included */
    uint32_t finished;         /* finished and still pollable */
    uint32_t kv_blocks_used;   /* held by sequences */
    uint32_t kv_blocks_free;   /* free, cached ones included */
    uint32_t kv_blocks_cached; /* of the free ones, kept for the prefix cache */
    uint32_t kv_blocks_total;
    double tokens_per_s; /* tokens computed (prompt and generated) per second, over the
                            last second or so */
    uint64_t windows;    /* forward passes run */
    uint64_t tokens_generated;
    uint64_t tokens_prefilled; /* computed prompt positions (cached ones excluded) */
    uint64_t prefix_hits;      /* positions taken from the prefix cache */
    uint64_t preemptions;
    uint64_t lapsed; /* requests cancelled because their lease lapsed */
    uint64_t drafts_proposed, drafts_accepted; /* speculative decoding: drafts verified, accepted */
    uint64_t verify_passes; /* decode items that verified drafts: accepted per window is
                               drafts_accepted / verify_passes */
    uint64_t decode_passes, decode_tokens; /* decode items and the tokens they sampled: tokens
                                              per pass is decode_tokens / decode_passes */
    uint64_t draft_passes;                 /* forward passes of the draft model */
    const char *spec;                      /* "off", "lookup" or "draft" */
    double window_s; /* wall time of the windows (forward pass and tier tick) since start */
};

struct engine;

/* engine_start makes the KV cache, the forward pass and the decode-loop thread for m (borrowed;
 * it must outlive the engine, and its expert resolver must not change while it runs). Errors:
 * STRATA_EINVAL (options), STRATA_ENOMEM, backend errors, thread creation. Caller owns *out
 * (engine_close). */
int engine_start(const struct model *m, const struct engine_opts *o, struct engine **out);

/* engine_close cancels every request, joins the decode thread and frees; NULL is fine. No other
 * call may run on e during or after it. */
void engine_close(struct engine *e);

/* engine_submit queues r (copied; r->id and the arrays may be freed on return) and starts its
 * lease. A duplicate id returns 0 and keeps the existing request (and renews its lease).
 * Errors: STRATA_EINVAL (empty or long id, token ids outside the vocabulary, counts, sampling
 * parameters), STRATA_ELIMIT (a prompt past the context or the whole KV pool), STRATA_EBUSY (the
 * queue holds max_queue requests: retry later), STRATA_ENOMEM. Never blocks on a window. */
int engine_submit(struct engine *e, const struct engine_req *r);

/* engine_poll returns the request's tokens from index `from` (up to out->cap), its finish
 * reason, error and timings, and renews its lease. Non-blocking. STRATA_ENOENT: unknown id
 * (never submitted, or forgotten after its lease lapsed). */
int engine_poll(struct engine *e, const char *id, uint32_t from, struct engine_update *out);

/* engine_cancel ends the request at the next window boundary (finish CANCELLED; tokens already
 * generated stay pollable). A finished request is left as it is. STRATA_ENOENT: unknown id. */
int engine_cancel(struct engine *e, const char *id);

/* engine_status fills out with counters and gauges. */
void engine_status(struct engine *e, struct engine_status *out);

/* engine_routed copies the tokens routed to each (layer, expert) since start, the same counts the
 * on_route hook sees, into out[n_layer * n_expert] (NULL: only the shape). Lock-free; any thread.
 * STRATA_EUNSUPPORTED for a model without routed experts. */
int engine_routed(struct engine *e, uint64_t *out, uint32_t *n_layer, uint32_t *n_expert);

/* engine_epoch: a counter incremented after each window (and each change of state), for
 * long-polls: wait until it moves, then poll. */
uint64_t engine_epoch(struct engine *e);

/* engine_quiesce lands everything the backend has in flight (the adaptive tier's copies), on
 * the decode thread between windows; returns once done. engine_resize changes the backend's
 * fast-tier budget to bytes the same way (the `vram` op): the backend's error (STRATA_EUNSUPPORTED
 * where it has none) comes back with its detail. Both block; STRATA_ESTATE during shutdown. Any
 * thread but the decode thread. */
int engine_quiesce(struct engine *e);
int engine_resize(struct engine *e, uint64_t bytes);

/* engine_backend_info: what the backend is and holds, as of the last window. Any thread. */
void engine_backend_info(struct engine *e, struct backend_info *out);

#endif
