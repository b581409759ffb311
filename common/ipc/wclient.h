/* wclient — the client side of strata-worker's ops (docs/protocol.md, "Worker ops"): hello, meta,
 * submit, poll, cancel, status, vram, and a stream helper that survives a worker restart.
 *
 * One wclient is one REQ socket dialed to one worker (never two: a REQ socket dialed to two workers
 * would spread one stream's polls across them). Every call has a deadline (wclient_opts); a poll
 * waits on the worker at most poll_wait_ms for new tokens, then answers with what it has.
 * Threads: a wclient may be called from any number of threads at once (each call uses its own nng
 * context); a stream belongs to one thread at a time. Results are owned by the caller and freed
 * with the matching *_free. nng is not fork-safe: open a wclient only in the process that uses it.
 * The stream helper makes a worker restart invisible: when a poll answers "unknown request"
 * (STRATA_ENOENT) or the worker does not answer, it resubmits the prompt plus the tokens received
 * so far, with the same seed, n_generated counting them and the remaining max_tokens, and goes on
 * numbering tokens as before; in bit-exact mode the ids are those of an undisturbed run. Once a
 * wclient_hello has told the model, a resubmit first checks the restarted worker serves the same.
 * A caller with several workers can move a stream to another one the same way (caller_resumes,
 * wclient_stream_move).
 */
#ifndef STRATA_WCLIENT_H
#define STRATA_WCLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf_file;

/* Protocol limits of the worker ops, shared by client and worker (the worker refuses more with
 * STRATA_ELIMIT or STRATA_EPROTO and a message). */
#define WCLIENT_PROTO_MIN        1 /* worker-op protocol versions this build speaks (hello) */
#define WCLIENT_PROTO_MAX        1
#define WCLIENT_ID_MAX           64      /* bytes of a request id */
#define WCLIENT_MAX_PROMPT       1000000 /* prompt ids of one submit (the worker's n_ctx is lower) */
#define WCLIENT_MAX_TOKENS       1000000      /* max_tokens of one submit */
#define WCLIENT_MAX_STOP         16           /* stop ids of one submit */
#define WCLIENT_MAX_TOP          20           /* alternatives per token (OpenAI's top_logprobs) */
#define WCLIENT_MAX_GRAMMAR      (1u << 20)   /* bytes of a submit's grammar */
#define WCLIENT_POLL_MAX_IDS     256          /* ids of one poll */
#define WCLIENT_POLL_WAIT_MAX_MS 5000         /* longest wait a poll may ask for */
#define WCLIENT_REPLY_MAX        (256u << 20) /* largest reply the client accepts (meta) */

struct wclient;

struct wclient_opts {
    int timeout_ms;      /* deadline of each call beyond the poll's wait; default 5000 */
    int poll_wait_ms;    /* how long the worker may hold a poll for new tokens; default 2000 */
    int resume_wait_ms;  /* stream: how long to keep retrying a worker that does not answer (it is
                            restarting) before giving up; default 30000 */
    bool caller_resumes; /* stream: wclient_stream_next does not resume a stream itself: a
                            request the worker lost (a poll answered "unknown": it restarted, or
                            the lease lapsed) returns STRATA_ENOENT, a failed poll its error at
                            once (resume_wait_ms unused), so the caller picks the worker to
                            resume it on (wclient_stream_move) or polls again; default false */
};

/* wclient_open makes the socket dialing url (e.g. "ipc:///run/user/1000/strata/m/worker-0.sock").
 * The dial does not wait: a worker not up yet is reached when it comes; calls time out meanwhile.
 * o may be NULL for the defaults. Returns 0 and *out, STRATA_EINVAL, STRATA_ENOMEM or an nng error.
 */
int wclient_open(const char *url, const struct wclient_opts *o, struct wclient **out);

/* wclient_close closes the socket; no call may be in flight or start after it. NULL is fine. */
void wclient_close(struct wclient *c);

/* wclient_url: the URL c dials. */
const char *wclient_url(const struct wclient *c);

struct wclient_hello {
    uint32_t proto_min, proto_max; /* worker-op versions the worker speaks */
    uint64_t fingerprint; /* the model: XXH3 of its GGUF metadata bytes, the same for every worker
                             of one model file (arena or not); refuse a worker whose differs */
    char model[128];      /* general.name, else the arena's or file's name */
    char arch[32];        /* general.architecture */
    char backend[16];     /* "cpu" or "cuda" */
    char kv_type[8];      /* "f32" or "f16": a stream fails over only to the same backend and
                             KV type (empty from an older worker) */
    uint32_t n_ctx;       /* most positions (prompt + generated) of one request */
    uint32_t max_seqs;    /* requests decoded at once */
    int32_t pid;
    bool bit_exact; /* answers depend only on the model and the token history */
};

/* wclient_hello asks the worker who it is, and remembers the first fingerprint (streams check it
 * before resubmitting). Blocks up to timeout_ms. Returns 0, STRATA_EPROTO when
 * its protocol range does not meet WCLIENT_PROTO_MIN..MAX (the detail says both), STRATA_ETIMEDOUT,
 * or the worker's error. */
int wclient_hello(struct wclient *c, struct wclient_hello *out);

struct wclient_meta {
    void *bytes; /* the GGUF metadata: header, KV pairs, tensor infos (malloc'd) */
    size_t len;
    struct gguf_file *gguf; /* parsed from bytes with gguf_open_mem(check_data=false) */
    uint32_t n_ctx;         /* the worker's context per request */
    uint64_t fingerprint;   /* as hello */
};

/* wclient_meta fetches and parses the model's metadata (tokenizer, chat template, context length).
 * Free with wclient_meta_free. Returns 0, a GGUF parse error, or a call error as wclient_hello. */
int wclient_meta(struct wclient *c, struct wclient_meta *out);
void wclient_meta_free(struct wclient_meta *m); /* zeroed or freed twice is fine */

/* Sampling, as gpu-worker/sample.h: the chain is penalties -> top-k -> top-p -> min-p ->
 * temperature -> draw; temperature <= 0 is greedy. */
struct wclient_sampling {
    float temperature;       /* <= 0: greedy */
    uint32_t top_k;          /* 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* 0: off */
    float repeat_penalty;    /* 1: off */
    float presence_penalty;  /* 0: off */
    float frequency_penalty; /* 0: off */
    bool has_seed;           /* false: the worker picks a seed and returns it */
    uint64_t seed;
};

/* wclient_sampling_default: greedy, no filters or penalties, no seed. */
void wclient_sampling_default(struct wclient_sampling *s);

struct wclient_req {
    const char *id;        /* client-made, 1..WCLIENT_ID_MAX bytes, unique on the worker (e.g.
                              "<host>-<pid>-<n>"); resubmitting an id the worker has returns
                              the existing request (idempotent) */
    const int32_t *prompt; /* token ids, 1..min(n_ctx - 1, WCLIENT_MAX_PROMPT) */
    uint32_t n_prompt;
    uint32_t max_tokens; /* tokens to generate, >= 1 */
    struct wclient_sampling sampling;
    const int32_t *stop; /* stop ids (EOS, end of turn); the matched one is not returned */
    uint32_t n_stop;
    uint32_t n_generated;  /* of the prompt, how many trailing ids were generated (a resumed
                              request: penalties count them); usually 0 */
    bool logprobs;         /* report each token's logprob */
    uint32_t top_logprobs; /* and this many alternatives, 0..WCLIENT_MAX_TOP */
    const char *grammar;   /* GBNF that constrains the generated tokens (NUL-terminated, at most
                              WCLIENT_MAX_GRAMMAR bytes), or NULL; a resumed request's worker
                              rebuilds the grammar's state from the n_generated tokens */
};

/* wclient_submit queues r on the worker. *seed (may be NULL) gets the seed in use (the worker's
 * pick when r has none); *existing (may be NULL) is true when the id was already known. Returns 0,
 * STRATA_EBUSY (queue full: retry later or another worker), STRATA_ELIMIT (prompt past the context
 * or a limit above), STRATA_EINVAL/EPROTO (a bad field), or a call error. */
int wclient_submit(struct wclient *c, const struct wclient_req *r, uint64_t *seed, bool *existing);

enum wclient_finish {
    WCLIENT_RUNNING = 0, /* queued or generating */
    WCLIENT_STOP,        /* a stop id was sampled */
    WCLIENT_LENGTH,      /* max_tokens or the context reached */
    WCLIENT_CANCELLED,   /* cancel, or its lease lapsed */
    WCLIENT_ERROR,       /* the worker failed it: error_code says why */
};

/* One request's answer to a poll. Arrays are malloc'd with the result. */
struct wclient_update {
    char id[WCLIENT_ID_MAX + 1];
    int code;          /* 0, or STRATA_ENOENT: the worker does not know the id (it restarted,
                          or the request's lease lapsed) and nothing below is set */
    uint32_t from;     /* index of tokens[0] among the request's generated tokens */
    uint32_t n_tokens; /* new tokens */
    int32_t *tokens;
    float *logprobs;  /* n_tokens, when asked; else NULL */
    uint32_t n_top;   /* alternatives per token (0 when not asked) */
    int32_t *top_ids; /* n_tokens * n_top, most likely first */
    float *top_logprobs;
    enum wclient_finish finish;
    int32_t stop_token; /* the stop id that ended it (WCLIENT_STOP), else -1 */
    int error_code;     /* WCLIENT_ERROR: the worker's code */
    uint32_t n_prompt;  /* the prompt as submitted */
    uint32_t n_cached;  /* prompt tokens served from the worker's prefix cache */
    double queue_ms, prefill_ms, decode_ms; /* timings so far */
    uint32_t n_draft, n_draft_accepted; /* speculative drafts verified, accepted (this worker's) */
    uint32_t n_passes;                  /* decode passes that sampled its tokens */
};

struct wclient_poll_result {
    uint32_t n; /* as many as ids, in their order */
    struct wclient_update *u;
};

/* wclient_poll asks for the tokens after from[i] of each ids[i] (n in 1..WCLIENT_POLL_MAX_IDS),
 * letting the worker wait up to wait_ms (0..WCLIENT_POLL_WAIT_MAX_MS; negative: poll_wait_ms) for
 * any of them to progress. Renews the requests' leases. Free with wclient_poll_free. Returns 0 (an
 * unknown id is a per-update code, not a failure), or a call error. */
int wclient_poll(struct wclient *c, const char *const *ids, const uint32_t *from, uint32_t n,
                 int wait_ms, struct wclient_poll_result *out);
void wclient_poll_free(struct wclient_poll_result *r);

/* wclient_cancel ends request id (its tokens stay pollable until the lease lapses). Cancelling an
 * unknown or finished request succeeds: the call is idempotent. */
int wclient_cancel(struct wclient *c, const char *id);

struct wclient_status {
    uint32_t running; /* requests holding KV and decoding */
    uint32_t queued;  /* waiting for admission */
    uint32_t max_seqs, max_queue;
    uint32_t kv_blocks_used, kv_blocks_total;
    double tok_s;              /* generated tokens per second, recent */
    double prefill_tok_s;      /* prompt tokens per second, recent */
    uint64_t windows;          /* forward passes since start */
    uint64_t tokens_generated; /* since start */
    uint64_t prompt_tokens;    /* prefilled since start (cache hits excluded) */
    uint64_t prefix_hits;      /* prompt tokens served from the prefix cache */
    uint64_t requests;         /* submitted since start */
    uint32_t cache_slots;      /* expert cache (0 on the CPU backend) */
    uint64_t cache_bytes;
    double cache_hit_rate; /* routed (token, expert) pairs served from the cache, 0..1 */
    uint64_t cache_hits, cache_misses; /* those pairs counted apart */
    uint32_t cache_resident;           /* experts in slots */
    uint64_t cache_swaps;              /* moved in by the adaptive tier */
    double cache_copy_gibs;            /* copy rate while copying */
    double adapt_wait_s;               /* windows' time spent waiting for the tier's copies */
    char backend[16], kv_type[8];      /* what computes; empty from an older worker */
    char spec[8];                      /* speculative decoding: off, lookup or draft */
    uint64_t drafts_proposed, drafts_accepted; /* drafts verified, accepted since start */
    uint64_t verify_passes;            /* decode steps that verified drafts */
    uint64_t decode_passes, decode_tokens; /* decode steps and the tokens they sampled */
    double uptime_s;
    double window_s;      /* wall time of its windows since start */
    double monitor_s;     /* time it spent answering status, heat and vram (a monitor's cost) */
    uint64_t copy_bytes;  /* bytes the expert cache copied into slots */
};

/* wclient_status reads the worker's figures. */
int wclient_status(struct wclient *c, struct wclient_status *out);

struct wclient_vram {
    char backend[16];
    uint64_t total_bytes, free_bytes; /* device memory (0 on the CPU backend) */
    uint64_t weights_bytes, kv_bytes, cache_bytes;
    uint32_t cache_slots;
};

/* wclient_vram reads the worker's memory figures; with resize, asks it to make its expert cache
 * new_cache_bytes big first (STRATA_EUNSUPPORTED on the CPU backend). */
int wclient_vram(struct wclient *c, bool resize, uint64_t new_cache_bytes,
                 struct wclient_vram *out);

struct wclient_heat {
    uint32_t n_layer, n_expert;
    uint64_t *counts; /* (n_layer, n_expert) tokens routed since the worker started (malloc'd) */
};

/* wclient_heat reads the worker's routing counts (the monitor's heat map). Free with
 * wclient_heat_free. STRATA_EUNSUPPORTED for a model without routed experts, or a call error. */
int wclient_heat(struct wclient *c, struct wclient_heat *out);
void wclient_heat_free(struct wclient_heat *h); /* zeroed or freed twice is fine */

/* ---- streams ----------------------------------------------------------------------------------
 */

struct wclient_stream;

/* wclient_stream_start submits r (copied: the caller's arrays may go) and returns a stream that
 * polls it. r without a seed gets the worker's pick, kept for resubmits. Errors as wclient_submit.
 */
int wclient_stream_start(struct wclient *c, const struct wclient_req *r,
                         struct wclient_stream **out);

/* wclient_stream_next waits (up to poll_wait_ms, more while a restarted worker comes back) for new
 * tokens and returns them in *u (owned by the stream, valid until the next call; u->from counts
 * from the first generated token whatever the resubmits). u->n_tokens may be 0 when nothing came.
 * Once u->finish is not WCLIENT_RUNNING the stream is over. Returns 0, or STRATA_ETIMEDOUT when the
 * worker has not answered for resume_wait_ms, STRATA_EPROTO when it came back with another
 * model, a resubmit's error, or (caller_resumes) STRATA_ENOENT when the worker lost the request.
 * After an error the stream may be polled again or moved. */
int wclient_stream_next(struct wclient_stream *s, const struct wclient_update **u);

/* wclient_stream_move resumes s on worker to (another worker of the same model, or s's own), as a
 * restart's resubmit does: the prompt plus the tokens received, the same seed, n_generated counting
 * them and the remaining max_tokens, so in bit-exact mode the ids go on as an undisturbed run's.
 * The request gets a new id ("<first id>~<n>"): a stalled worker that still holds the old one must
 * not answer for it. The old worker is not told (it may be gone): a request left running there
 * ends when its lease lapses. When every token was received already, nothing is submitted and the
 * next wclient_stream_next ends the stream ("length"). One attempt, no retry; blocks up to two
 * calls (hello, submit). Returns 0 and the stream then polls to; or STRATA_EPROTO (to serves
 * another model), STRATA_ESTATE (s has finished), a submit's error (STRATA_EBUSY, a call error),
 * and s is unchanged: poll it again or move it elsewhere. */
int wclient_stream_move(struct wclient_stream *s, struct wclient *to);

/* wclient_stream_cancel cancels the request on the worker (idempotent). */
int wclient_stream_cancel(struct wclient_stream *s);

uint64_t wclient_stream_seed(const struct wclient_stream *s);
uint32_t wclient_stream_resubmits(const struct wclient_stream *s); /* worker restarts survived */

/* wclient_stream_free frees s without cancelling it (a request left running ends when its lease
 * lapses). NULL is fine. */
void wclient_stream_free(struct wclient_stream *s);

#endif
