/* backend — the worker's forward pass behind one function table (the frontend's fe_backend is the
 * model): a batch of tokens of several sequences through the model into host logits.
 *
 * The engine, `strata run`, bench, perplexity and trace call only these functions; which backend
 * runs is a name in the options ("cpu" today; "cuda" registers itself in backend.c when the build
 * has CUDA). A backend owns its memory: K/V storage (the bookkeeping, kv.h, is shared and lives
 * here so the engine can manage sequences), scratch, threads, and later its expert cache.
 * A batch is any mix of prompt chunks and decode steps: each token names its sequence, and the
 * tokens of one sequence take consecutive positions after those it already holds (batch order).
 * Bit-exact (DESIGN 3.4) per backend and KV type: a token's logits depend only on the model and its
 * sequence's history, never on the batch, the chunking, the thread count or decode vs re-prefill.
 * Threads: one thread at a time calls into a backend (the decode thread); the model and its
 * expert resolver are borrowed and must outlive it.
 */
#ifndef STRATA_BACKEND_H
#define STRATA_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "common/arena/model.h"
#include "gpu-worker/cache.h"
#include "gpu-worker/copy.h"
#include "gpu-worker/kv.h"
#include "gpu-worker/kv_store.h"
#include "gpu-worker/tier.h"

#define BACKEND_KV_BLOCK 32 /* positions per KV block by default: one attention key block */

struct backend_opts {
    const char *name;         /* "cpu", ...; NULL: the first available (backend_names) */
    uint32_t n_threads;       /* CPU threads computing a pass, the caller's included; 0 means 1 */
    uint32_t max_pass_tokens; /* most tokens one backend_eval takes; scratch is sized for it */
    uint32_t n_ctx;           /* positions per sequence; 0: the model's trained context */
    uint32_t n_seq;           /* sequences of full length the KV pool holds; 0 means 1 */
    uint32_t kv_blocks;       /* KV pool blocks, overriding n_ctx * n_seq; 0: from them */
    enum kv_type kv_type;     /* K/V storage type (f32 default on the CPU) */
    bool kv_type_set;         /* --kv-type was given: otherwise --backend cuda picks f16 */
    uint32_t vram_reserve_mib; /* VRAM a GPU backend leaves unplanned; 0: 700 */
    uint32_t vram_mib;         /* --vram-mib: the most VRAM a GPU backend takes (its budget, for
                                  K/V and expert slots together); 0: all that is free */
    uint32_t gpu;              /* --gpu: the CUDA device index (of those CUDA_VISIBLE_DEVICES
                                  shows) */
    /* The expert cache and its adaptive tier (cache.h, tier.h): */
    struct cache_spec expert_cache; /* --expert-cache: auto (0 slots on the CPU backend), N, XGiB */
    struct tier_opts tier;          /* --adapt-*: every 0 is a static cache */
    bool cache_verify;              /* --cache-verify: each slot's xxHash checked as it turns
                                       resident; a mismatch keeps the expert on the host tier */
    bool slot_kv;                   /* --slot-kv 1: slot mode's KV blocks take their memory from
                                       the cache's budget (one budget, DESIGN 3.1): a KV grow
                                       takes a slot through the tier's fence */
    const uint64_t *heat; /* (n_layer * n_expert) routed-token totals for the first fill (the
                             arena's heat), borrowed during backend_start; NULL: none */
    const struct copy_hooks *copy_hooks; /* tests: hold, fail or change copies; NULL: none */
    /* on_round: after each tier round's decay, its counts (n_layer * n_expert) on the decode
     * thread, e.g. for the arena's decayed profile. NULL: none. */
    void (*on_round)(void *ctx, const float *counts);
    void *round_ctx;
    /* The CUDA hybrid (gpu-worker/hybrid_cuda.h, docs/hybrid.md): */
    uint8_t pin;             /* --pin: 0 need, 1 whole (backend_opts_default), 2 none (enum
                                hyb_pin) */
    float pcie_frac;         /* --pcie-frac: share of a decode window's missed experts the GPU
                                computes from registered host memory (0: none) */
    uint32_t pcie_threshold; /* --pcie-threshold: a prompt chunk's missed expert with at least
                                this many pairs goes over PCIe (0: none; BACKEND_PCIE_AUTO:
                                measured at start) */
};

#define BACKEND_PCIE_AUTO UINT32_MAX /* --pcie-threshold auto */

/* backend_opts_default: the defaults a command starts from (tier TIER_OPTS_DEFAULT, cache auto). */
struct backend_opts backend_opts_default(void);

struct backend_token {
    struct kv_seq *seq; /* the sequence the token extends */
    int32_t id;         /* token id < n_vocab */
    bool logits;        /* write this token's logits */
};

/* Where a backend's time went since start or the last backend_reset_stats (caller's wall time). */
struct backend_stats {
    uint64_t passes;       /* backend_eval calls */
    uint64_t tokens;       /* tokens evaluated */
    double total_s;        /* inside backend_eval */
    double attention_s;    /* norms, q/k norms, RoPE, K/V writes, attention over the cache */
    double dense_s;        /* q/k/v/o projections, router, shared expert */
    double experts_s;      /* routed experts: gather, gate/up, SwiGLU, down, weighted sum */
    double output_s;       /* final norm and output matmul */
    uint64_t weight_bytes; /* bytes of weight matrices the products streamed */
    uint64_t host_bytes;   /* of them, expert bytes a GPU backend's CPU twin read from host RAM */
    uint64_t pcie_bytes;   /* of them, expert bytes a GPU read over PCIe (the hybrid's share) */
};

/* What a backend is and holds, for status and hello. */
struct backend_info {
    const char *name; /* "cpu" */
    char device[64];  /* what computes, e.g. "avx2 x 2 threads" */
    enum kv_type kv_type;
    uint64_t kv_bytes;     /* K/V storage allocated now */
    uint64_t kv_pos_bytes; /* K/V bytes one position takes */
    bool bit_exact;        /* answers promised bit-exact across batches, splits and restarts */
    /* the expert cache: */
    uint32_t cache_slots;     /* slots (0: every expert computed from the host tier) */
    uint64_t slot_bytes;      /* bytes of one slot: the largest blob */
    uint32_t resident;        /* experts in slots now */
    uint64_t hits, misses;    /* routed (token, expert) pairs computed from a slot / the host */
    double first_hit_rate;    /* hits / pairs of the first window (a warm start shows here) */
    uint64_t swaps;           /* experts the tier moved in */
    uint64_t copy_bytes;      /* bytes copied into slots */
    double copy_gibs;         /* their rate while copying */
    uint64_t verify_failures; /* copies refused by --cache-verify */
    double adapt_wait_s;      /* time windows waited for the tier's copies */
    uint32_t kv_slots;        /* slots lent to the KV cache (--slot-kv: one budget) */
    uint64_t pcie_pairs;      /* of the misses, pairs a GPU computed from registered host memory */
    double pcie_gbs;          /* host-to-GPU copy rate measured at start (GB/s), 0: not measured */
    uint64_t graph_replays;   /* passes replayed from a captured CUDA graph (cuda) */
    double mem_gbs;           /* device memory copy bandwidth measured at start (GPU), else 0 */
    uint64_t vram_bytes;      /* VRAM the backend holds now (GPU), else 0 */
    uint64_t vram_budget;     /* the most it may hold: K/V and slots share it (GPU), else 0 */
    uint32_t fill_left;       /* experts the start's background fill has still to copy */
    uint64_t kv_grows;        /* K/V growths on demand (GPU hybrid) */
    uint32_t kv_took_slots;   /* slots K/V growth took back from the expert cache */
};

/* backend_route_fn: the tokens a pass routes to one expert of one layer. tokens[0..n_tokens) are
 * indices into the pass's batch, ascending; the array is valid during the call only. */
typedef void (*backend_route_fn)(void *ctx, uint32_t layer, uint32_t expert, const uint32_t *tokens,
                                 uint32_t n_tokens);

struct backend;

/* The table a backend implements (backend.c registers each). */
struct backend_ops {
    const char *name;
    /* available: whether this machine can run it (a GPU present, ...); NULL: always. */
    bool (*available)(void);
    int (*start)(const struct model *m, const struct backend_opts *o, struct kv_cache *kv,
                 void **impl);
    int (*eval)(void *impl, const struct backend_token *toks, uint32_t n, float *logits);
    void (*set_route)(void *impl, backend_route_fn fn, void *ctx);
    int (*tick)(void *impl);
    int (*quiesce)(void *impl);
    int (*resize)(void *impl, uint64_t bytes);
    void (*info)(const void *impl, struct backend_info *out);
    void (*get_stats)(const void *impl, struct backend_stats *out);
    void (*reset_stats)(void *impl);
    void (*close)(void *impl);
};

/* backend_kv_config: the KV configuration for m with contexts of n_ctx positions (0: trained) and
 * room for n_seq full-length sequences. */
void backend_kv_config(const struct model *m, uint32_t n_ctx, uint32_t n_seq,
                       struct kv_config *out);

/* backend_names: the registered backends' names, NULL-terminated, and whether each runs here. */
const char *const *backend_names(void);
bool backend_available(const char *name);

/* backend_start makes the KV bookkeeping and starts the named backend on m. Errors:
 * STRATA_ENOENT (no such backend: the detail lists them), STRATA_EUNSUPPORTED (not available
 * here), STRATA_EINVAL (options), STRATA_ENOMEM, the backend's own. Caller owns *out
 * (backend_close). */
int backend_start(const struct model *m, const struct backend_opts *o, struct backend **out);

/* backend_close quiesces, stops the backend's threads and frees; NULL is fine. Every sequence
 * must have been kv_seq_fini'd. */
void backend_close(struct backend *b);

/* backend_kv: the KV bookkeeping sequences are made against (kv_seq_*, kv_prefix_*). */
struct kv_cache *backend_kv(const struct backend *b);

/* backend_model: the model it runs. */
const struct model *backend_model(const struct backend *b);

/* backend_eval runs n (1..max_pass_tokens) tokens, growing their sequences, and writes the logits
 * of each token with .logits set, in batch order, as rows of n_vocab floats. Blocks until done.
 * Errors: STRATA_EINVAL (count, token id), STRATA_ELIMIT (past a sequence's context),
 * STRATA_ENOSPC (KV pool), STRATA_ENOMEM, a quant error; on error every sequence keeps its
 * previous length. */
int backend_eval(struct backend *b, const struct backend_token *toks, uint32_t n, float *logits);

/* backend_prompt feeds ids[0..n) to s in chunks of `chunk` tokens (0 or above max_pass_tokens:
 * max_pass_tokens) and writes the last token's logits (n_vocab floats) when logits is non-NULL,
 * ticking after each chunk (one window each). Errors as backend_eval and backend_tick; on error
 * s holds the chunks that completed. */
int backend_prompt(struct backend *b, struct kv_seq *s, const int32_t *ids, uint32_t n,
                   uint32_t chunk, float *logits);

/* backend_set_route makes every later pass call fn (NULL: none, the default) once per (layer,
 * expert) that holds tokens of the pass, after the layer's routing and before its experts run:
 * layers in order, a layer's experts in ascending id order. Over one layer, n_tokens sums to
 * n * n_expert_used. fn runs on the thread that calls backend_eval. */
void backend_set_route(struct backend *b, backend_route_fn fn, void *ctx);

/* backend_tick: the point between windows where a backend lands background work (the adaptive
 * tier's rounds and copies); whoever calls backend_eval calls it after each window.
 * backend_quiesce: land everything in flight before the caller changes what it may touch (a request
 * start, a KV grow, a resize, shutdown). backend_resize: change the memory budget of the fast tier
 * to bytes (STRATA_EUNSUPPORTED where a backend has none to change). */
int backend_tick(struct backend *b);
int backend_quiesce(struct backend *b);
int backend_resize(struct backend *b, uint64_t bytes);

/* backend_info, backend_get_stats, backend_reset_stats: same thread as backend_eval. */
void backend_info(const struct backend *b, struct backend_info *out);
void backend_get_stats(const struct backend *b, struct backend_stats *out);
void backend_reset_stats(struct backend *b);

/* The options every command that runs a backend takes (the worker, `strata run`, `strata bench`),
 * for its usage text. */
#define BACKEND_OPTS_USAGE                                                                         \
    "  --backend NAME       the forward pass: cpu (default: the first this machine runs)\n"        \
    "  --kv-type T          K/V storage: f32 (default; f16 with --backend cuda) or f16 (half the\n" \
    "                       memory)\n"                                                             \
    "  --vram-reserve-mib N VRAM a GPU backend leaves to others (default 700)\n"                   \
    "  --vram-mib N         the most VRAM a GPU backend takes, K/V and slots (default: all)\n"     \
    "  --gpu N              the CUDA device (default 0)\n"                                         \
    "  --expert-cache C     fast-tier slots: auto (CPU: none), N slots or a size (12GiB)\n"        \
    "  --adapt-every N      windows between adaptive-tier rounds (default 4; 0: static cache)\n"   \
    "  --adapt-swaps N      most experts moved in a round (default 96)\n"                          \
    "  --adapt-decay F      counts decay per round (default 0.7)\n"                                \
    "  --adapt-min F        count a candidate needs (default 2.0)\n"                               \
    "  --adapt-lead F       lead over the resident it replaces (default 1.5)\n"                    \
    "  --adapt-async 1      the tier's copies run while windows do (default 0: blocking)\n"        \
    "  --cache-verify 1     check each slot's xxHash as it turns resident (debug)\n"            \
    "  --slot-kv 1          CPU slot mode: KV blocks take slots of the cache's budget\n"         \
    "  --pin P              cuda hybrid: register an arena's experts whole (default), by need\n" \
    "                       or none\n"                                                           \
    "  --pcie-frac F        cuda hybrid: share of missed experts the GPU reads over PCIe (0)\n"  \
    "  --pcie-threshold N   cuda hybrid: prompt-chunk experts with >= N pairs go over PCIe (0:\n" \
    "                       none; auto, the default: where the CPU would take longer than the\n" \
    "                       bus, measured)\n"

/* backend_opt applies option `name` (without its dashes) with value to o. Returns 0, STRATA_ENOENT
 * when name is not a backend option (the caller's own), STRATA_EINVAL for a bad value (the detail
 * says what is accepted). value is borrowed. */
int backend_opt(struct backend_opts *o, const char *name, const char *value);

#endif
