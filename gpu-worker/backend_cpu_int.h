/* backend_cpu_int — the CPU backend's state, shared by its two files: backend_cpu.c (the forward
 * pass, the backend's table and lifecycle) and backend_cpu_cache.c (slot mode: the expert cache
 * over host slots, its copy engine, the blocking and the async tier, one budget for K/V and
 * slots). Not for use outside these two files.
 * Threads: the decode thread owns struct fwd; the async tier's picker thread touches only the
 * fields the async-tier block of backend_cpu_cache.c lists under pmu.
 */
#ifndef STRATA_BACKEND_CPU_INT_H
#define STRATA_BACKEND_CPU_INT_H

#include "gpu-worker/backend.h"
#include "common/base/pool.h"
#include "kernels/cpu/cpu_mm.h"
#include "kernels/cpu/moe.h"
#include "kernels/ref/ops.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct fwd {
    /* Slot mode: the expert cache over a host slot pool, its copy engine and adaptive tier; all
     * NULL without slots. A window reads the published table; hits are computed from the slot
     * copies, misses from the model's own bytes (the arena or the file), with the same kernel. */
    struct cache *cache;
    struct tier *tier;
    struct copy_engine *copy;
    uint8_t *slots;          /* (n_slots, slot_bytes), page-aligned */
    struct tier_move *moves; /* (tier.swaps) a round's picks */
    uint32_t *chunk_of;      /* (T) a prompt chunk's first batch index, or UINT32_MAX: decode */
    uint32_t *stamp;         /* (T) per chunk, the last (layer, expert) it was counted for */
    uint64_t window;         /* windows ticked */
    /* One budget (--slot-kv 1): the KV store's segments are slots lent to it (cache_lend). */
    uint32_t *seg_slot; /* (segments the KV pool may need) the slot of each segment */
    uint64_t kv_grows;  /* slots the KV cache took */
    /* The async tier (--adapt-async 1): the round in flight and the thread that picks it. */
    struct tier_move *flight; /* (swaps) the round's moves */
    uint64_t *ticket;         /* (swaps) the copy of each posted move */
    uint8_t *landed;          /* (swaps) moves whose copy has landed */
    uint32_t n_flight, n_posted, n_landed;
    uint64_t posted_at;   /* the window after which the last batch was posted */
    uint64_t asked_at;    /* the tick that asked the tier thread for its round */
    bool async_wait;      /* STRATA_ADAPT_ASYNC_WAIT (1): the tick after posting lands all */
    bool pick_inline;     /* STRATA_ADAPT_PICK_INLINE (0): pick on the decode thread */
    uint32_t async_batch; /* STRATA_ADAPT_ASYNC_BATCH (0: all): copies posted per tick */
    pthread_t picker;
    bool picker_started, picker_stop;
    pthread_mutex_t pmu;
    pthread_cond_t pcv;
    enum { PICK_IDLE, PICK_ASKED, PICK_READY } pick;
    uint32_t n_picked;      /* the tier thread's round: its moves, */
    uint32_t thread_posted; /* the first of them it posted */
    int post_err;           /* and why it stopped posting (0: it posted them all) */
    bool evict_pending;     /* victims left the working table: publish at the next tick */
    double adapt_wait_s;    /* decode-thread time spent waiting for copies */
    double window_wait_s;   /* of it, in the window just ticked (STRATA_DECODE_TIMING) */
    double window_join_s;   /* of that, waiting for the tier's thread to finish a pick */
    double combine_s;       /* adding each token's experts (STRATA_DECODE_TIMING) */
    double window_fence_s;  /* the fences (quiesce) called since the last tick */
    double tick_combine_s;
    uint64_t window_swaps;        /* swaps landed at the last tick */
    bool timing;                  /* STRATA_DECODE_TIMING=1 */
    struct backend_stats tick_st; /* the counters at the last tick, for the per-window line */
    uint64_t tick_hits, tick_misses;
    uint64_t hits, misses, swaps, verify_failures;
    double first_hit_rate;
    bool first_done;
    struct kv_store *store; /* K/V rows by block id */
    struct cpu_moe *moe_w;  /* the routed-expert step's scratch */
    uint8_t *att_scratch;   /* (n_threads, att_scratch_bytes) kv_store_view scratch */
    size_t att_scratch_bytes;
    const struct model *m;
    struct ops_yarn yarn; /* the RoPE's YaRN terms (none unless hp.yarn_factor > 1) */
    struct kv_cache *kv;
    struct backend_opts o;
    struct pool *pool;
    struct backend_stats st;
    backend_route_fn route; /* backend_set_route's hook, or NULL */
    void *route_ctx;
    size_t act_stride; /* bytes per token of quantized activations: the widest any matrix needs */
    uint32_t n_ff;     /* widest FFN hidden width (routed or shared expert) */
    uint32_t max_tasks;
    /* Scratch, rows of max_pass_tokens tokens (T) or of routed (token, expert) pairs (T*K): */
    float *x;                      /* (T, n_embd) residual stream */
    float *xn;                     /* (T, n_embd) normalized input of a block */
    float *tmp;                    /* (T, n_embd) a block's output before the residual add */
    float *q, *k, *v;              /* (T, n_head*head_dim), (T, k_dim), (T, v_dim) */
    float *att;                    /* (T, n_head*head_dim_v) */
    float *rlogit;                 /* (T, n_expert) router logits, then probabilities */
    float *rsel;                   /* (n_expert) route_biased's selection scores */
    float *mla_q;                  /* MLA (deepseek2): (T, n_head*head_dim_qk) the q projection */
    float *mla_qa;                 /* (T, n_lora_q) the q LoRA's inner activations */
    float *mla_o;                  /* (T, n_head*head_dim_vo) the heads' values out of wv_b */
    struct cpu_mm_task *mla_tasks; /* (n_head) the per-head products of k_b or v_b */
    uint32_t *mla_first;           /* (n_head + 1) */
    uint8_t *mla_acts;             /* (T * n_head) rows of a head's quantized k_b / v_b inputs */
    int32_t *sel;                  /* (T, n_expert_used) selected experts: pair t*K + j */
    float *selw;                   /* (T, n_expert_used) their weights */
    float *moe;                    /* (T, n_embd) sum of expert outputs */
    float *g, *u;              /* (T, n_ff) shared expert gate and up outputs, then SwiGLU in g */
    float *y;                  /* (T*K, n_embd) expert outputs by pair (or shared expert output) */
    float *shg;                /* (T) shared expert gate logit */
    struct moe_group *groups;  /* (n_expert) a layer's groups: one per expert hit */
    int32_t *pair_idx;         /* (T*K) pairs grouped by expert */
    uint32_t *rtok;            /* (T) the route hook's tokens of one expert */
    uint8_t *acts[3];          /* (T, act_stride) each: quantized inputs of up to three matrices */
    struct cpu_mm_task *tasks; /* (max_tasks) */
    uint32_t *task_first;      /* (max_tasks + 1) first work item of each task */
    uint32_t *pos;             /* (T) positions */
    uint32_t *run_first;       /* (T + 1) first token of each attention run, then n */
    struct kv_seq **seen;      /* (T) sequences of the batch being grown */
    uint32_t *seen_len;        /* (T) their lengths before */
};

/* bcpu_now_s: a monotonic clock in seconds. */
double bcpu_now_s(void);

/* bcpu_env_flag: the integer value of environment variable name, dflt when unset or empty. */
int bcpu_env_flag(const char *name, int dflt);

/* bcpu_cache_open sets slot mode up when the options ask for slots (else does nothing): the
 * cache, the slot pool filled from the heat profile, the copy engine and the tier (and its thread
 * with --adapt-async). STRATA_ENOMEM, STRATA_EINVAL for a budget that holds no slot, the copy
 * engine's errors; bcpu_cache_close undoes what it did. */
int bcpu_cache_open(struct fwd *f);

/* bcpu_cache_close stops the tier's thread, lands the copies in flight and frees slot mode's
 * state; safe on a backend without slots. */
void bcpu_cache_close(struct fwd *f);

/* bcpu_kv_take_slots: with one budget (--slot-kv 1), gives the K/V store the slots its new
 * segments need, after the round in flight has landed (the KV-grow fence). STRATA_ENOMEM when the
 * budget has no slot left. */
int bcpu_kv_take_slots(struct fwd *f);

/* bcpu_window_sync: the copy_hooks.window_sync test hook, run before a pass reads a slot. */
void bcpu_window_sync(struct fwd *f);

/* The backend table's slot-mode entries (backend.h: tick, quiesce, resize, info). */
int bcpu_tick(void *impl);
int bcpu_quiesce(void *impl);
int bcpu_resize(void *impl, uint64_t bytes);
void bcpu_info(const void *impl, struct backend_info *out);

#endif
