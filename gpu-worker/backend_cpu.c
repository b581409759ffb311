/* The CPU backend: today's forward pass, behind backend.h's table.
 *
 * Kernels: kernels/cpu (AVX2 / AVX-512 when the CPU has them, equal bit for bit to kernels/ref).
 * Every matmul output is one row dot of one token, attention walks keys in fixed blocks, experts
 * are added to a token in expert-id order (kernels/ref/moe.h), and threads only split independent
 * rows or heads: bit-exact by construction for each KV type. The routed experts of a layer run as
 * one cpu_moe_ffn step over every expert (the GPU backend runs the same step for its misses).
 * A backend owns its scratch, its K/V storage (kv_store) and a pool of n_threads-1 threads.
 * gpt-oss's extras ride in the same steps, switched by the model's flags: q/k/v biases with the
 * others, YaRN in the RoPE (cpu_rope_yarn), windows and sinks in cpu_attention's query table
 * (att_items, sinks_of), the output and router biases (add_rows), and the expert biases and
 * clamped SwiGLU inside the expert step (cpu_moe_set_oss), whose blobs carry the biases.
 */
#include "gpu-worker/backend.h"
#include "gpu-worker/fwd_mla.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/pool.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_mm.h"
#include "kernels/cpu/moe.h"
#include "kernels/ref/moe.h"
#include "kernels/ref/ops.h"
#include "kernels/ref/route.h"

#include <xxhash.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    uint64_t window;          /* windows ticked */
    /* One budget (--slot-kv 1): the KV store's segments are slots lent to it (cache_lend). */
    uint32_t *seg_slot;       /* (segments the KV pool may need) the slot of each segment */
    uint64_t kv_grows;        /* slots the KV cache took */
    /* The async tier (--adapt-async 1): the round in flight and the thread that picks it. */
    struct tier_move *flight; /* (swaps) the round's moves */
    uint64_t *ticket;         /* (swaps) the copy of each posted move */
    uint8_t *landed;          /* (swaps) moves whose copy has landed */
    uint32_t n_flight, n_posted, n_landed;
    uint64_t posted_at;       /* the window after which the last batch was posted */
    uint64_t asked_at;        /* the tick that asked the tier thread for its round */
    bool async_wait;          /* STRATA_ADAPT_ASYNC_WAIT (1): the tick after posting lands all */
    bool pick_inline;         /* STRATA_ADAPT_PICK_INLINE (0): pick on the decode thread */
    uint32_t async_batch;     /* STRATA_ADAPT_ASYNC_BATCH (0: all): copies posted per tick */
    pthread_t picker;
    bool picker_started, picker_stop;
    pthread_mutex_t pmu;
    pthread_cond_t pcv;
    enum { PICK_IDLE, PICK_ASKED, PICK_READY } pick;
    uint32_t n_picked;        /* the tier thread's round: its moves, */
    uint32_t thread_posted;   /* the first of them it posted */
    int post_err;             /* and why it stopped posting (0: it posted them all) */
    bool evict_pending;       /* victims left the working table: publish at the next tick */
    double adapt_wait_s;      /* decode-thread time spent waiting for copies */
    double window_wait_s;     /* of it, in the window just ticked (STRATA_DECODE_TIMING) */
    double window_join_s;     /* of that, waiting for the tier's thread to finish a pick */
    double combine_s;         /* adding each token's experts (STRATA_DECODE_TIMING) */
    double window_fence_s;    /* the fences (quiesce) called since the last tick */
    double tick_combine_s;
    uint64_t window_swaps;    /* swaps landed at the last tick */
    bool timing;              /* STRATA_DECODE_TIMING=1 */
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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void widen_act(struct fwd *f, const struct model_mat *w)
{
    if (!w->n_in) return;
    size_t b = quant_act_bytes(w->type, w->n_in);
    if (b > f->act_stride) f->act_stride = b;
}

static size_t mla_act_bytes(const struct model_mat *w);

static int alloc_scratch(struct fwd *f)
{
    const struct model_hparams *hp = &f->m->hp;
    const size_t T = f->o.max_pass_tokens;
    f->n_ff = hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp;
    if (hp->n_ff_dense > f->n_ff) f->n_ff = hp->n_ff_dense;
    widen_act(f, &f->m->output);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const struct model_layer *L = &f->m->layers[l];
        const struct model_mat *mats[] = {&L->wq,       &L->wk,         &L->wv,
                                          &L->wo,       &L->router,     &L->part[0],
                                          &L->part[1],  &L->part[2],    &L->gate_shexp,
                                          &L->up_shexp, &L->down_shexp, &L->gate_inp_shexp,
                                          &L->ffn_gate, &L->ffn_up,     &L->ffn_down,
                                          &L->wq_a,     &L->wq_b,       &L->wkv_a};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            widen_act(f, mats[i]);
    }
    /* Round rows up to 64 bytes so each token's activations start on their own cache line. */
    f->act_stride = (f->act_stride + 63) & ~(size_t)63;
    size_t mla_acts_max = 0; /* MLA: a head's k_b / v_b input row, the widest of the layers */
    for (uint32_t l = 0; hp->mla && l < hp->n_layer; l++) {
        const struct model_layer *L = &f->m->layers[l];
        const size_t kb = mla_act_bytes(&L->k_b), vb = mla_act_bytes(&L->v_b);
        if (kb > mla_acts_max) mla_acts_max = kb;
        if (vb > mla_acts_max) mla_acts_max = vb;
    }
    const size_t E = hp->n_embd, K = hp->n_expert_used, P = T * (K ? K : 1);
    f->max_tasks = 3;
    struct {
        void **p;
        size_t bytes;
    } bufs[] = {
        {(void **)&f->x, T * E * sizeof(float)},
        {(void **)&f->xn, T * E * sizeof(float)},
        {(void **)&f->tmp, T * E * sizeof(float)},
        {(void **)&f->q, T * hp->n_head * hp->head_dim * sizeof(float)},
        {(void **)&f->k, T * hp->n_head_kv * hp->head_dim * sizeof(float)},
        {(void **)&f->v, T * hp->n_head_kv * hp->head_dim_v * sizeof(float)},
        {(void **)&f->att, T * hp->n_head * hp->head_dim_v * sizeof(float)},
        {(void **)&f->rlogit, T * hp->n_expert * sizeof(float)},
        {(void **)&f->rsel, hp->n_expert * sizeof(float)},
        {(void **)&f->mla_q, T * hp->n_head * hp->head_dim_qk * sizeof(float)},
        {(void **)&f->mla_qa, T * hp->n_lora_q * sizeof(float)},
        {(void **)&f->mla_o, T * hp->n_head * hp->head_dim_vo * sizeof(float)},
        {(void **)&f->mla_tasks, (hp->mla ? hp->n_head : 0) * sizeof(struct cpu_mm_task)},
        {(void **)&f->mla_first, (hp->mla ? hp->n_head + 1 : 0) * sizeof(uint32_t)},
        {(void **)&f->mla_acts, T * hp->n_head * mla_acts_max},
        {(void **)&f->sel, T * K * sizeof(int32_t)},
        {(void **)&f->selw, T * K * sizeof(float)},
        {(void **)&f->moe, T * E * sizeof(float)},
        {(void **)&f->g, T * f->n_ff * sizeof(float)},
        {(void **)&f->u, T * f->n_ff * sizeof(float)},
        {(void **)&f->y, P * E * sizeof(float)},
        {(void **)&f->shg, T * sizeof(float)},
        {(void **)&f->groups, (hp->n_expert ? hp->n_expert : 1) * sizeof(struct moe_group)},
        {(void **)&f->pair_idx, P * sizeof(int32_t)},
        {(void **)&f->rtok, T * sizeof(uint32_t)},
        {(void **)&f->acts[0], T * f->act_stride},
        {(void **)&f->acts[1], T * f->act_stride},
        {(void **)&f->acts[2], T * f->act_stride},
        {(void **)&f->tasks, f->max_tasks * sizeof(struct cpu_mm_task)},
        {(void **)&f->task_first, (f->max_tasks + 1) * sizeof(uint32_t)},
        {(void **)&f->pos, T * sizeof(uint32_t)},
        {(void **)&f->run_first, (T + 1) * sizeof(uint32_t)},
        {(void **)&f->seen, T * sizeof(struct kv_seq *)},
        {(void **)&f->seen_len, T * sizeof(uint32_t)},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i].p = malloc(bufs[i].bytes ? bufs[i].bytes : 1);
        if (!*bufs[i].p)
            return strata_errf(STRATA_ENOMEM,
                               "out of memory for forward scratch of %zu tokens: lower the batch "
                               "or chunk size",
                               T);
    }
    f->att_scratch_bytes =
        (kv_store_scratch_bytes(f->store, hp->head_dim, hp->head_dim_v) + 63) & ~(size_t)63;
    if (!(f->att_scratch = aligned_alloc(64, f->o.n_threads * f->att_scratch_bytes)))
        return strata_errf(STRATA_ENOMEM, "out of memory for attention scratch (%zu bytes)",
                           f->o.n_threads * f->att_scratch_bytes);
    int rv = cpu_moe_init((uint32_t)P, (uint32_t)E, hp->n_ff_exp, f->act_stride,
                          hp->n_expert ? hp->n_expert : 1, &f->moe_w);
    if (rv) return rv;
    /* gpt-oss: SwiGLU alpha and limit as llama.cpp's LLM_FFN_SWIGLU_OAI_MOE */
    const struct cpu_moe_oss oss = {hp->exp_bias, hp->glu_oai, 1.702f, 7.0f};
    cpu_moe_set_oss(f->moe_w, &oss);
    return 0;
}

static void cpu_close(void *impl);

/* ---- slot mode: the expert cache on the host ------------------------------------------------ */

#define SLOT_POISON 0xa5 /* the bytes of a slot no expert holds: a window reading it shows */

static int async_start(struct fwd *f);
static void async_stop(struct fwd *f);
static int async_quiesce(struct fwd *f);
static int env_flag(const char *name, int dflt);

/* land finishes the copy of (l, e) into slot: waits for it, checks the slot's bytes when asked,
 * and gives the slot to the expert in the working table only if the copy is good. */
static void finish(struct fwd *f, int rv, uint32_t slot, uint32_t l, uint32_t e)
{
    uint8_t *s = f->slots + (uint64_t)slot * f->cache->slot_bytes;
    if (f->cache->owner[slot] == CACHE_LENT) {
        /* only with the KV-grow fence removed (copy_hooks.kv_unfenced): the slot is KV now */
        LOG_ERROR("expert cache: the copy of layer %u expert %u landed in slot %u, lent to the "
                  "KV cache: it stays on the host tier",
                  l, e, slot);
        return;
    }
    if (rv) {
        /* a free slot holds poison: a window that read it anyway would show in the logits */
        memset(s, SLOT_POISON, f->cache->slot_bytes);
        LOG_WARN("expert cache: the copy of layer %u expert %u into slot %u failed (%s): it "
                 "stays on the host tier",
                 l, e, slot, strata_strerror(rv));
        return;
    }
    if (f->o.cache_verify) {
        const uint64_t got = XXH3_64bits(s, f->m->layers[l].blob.bytes),
                       want = copy_blob_hash(f->m, l, e);
        if (got != want) {
            f->verify_failures++;
            LOG_WARN("expert cache: slot %u holds layer %u expert %u with xxHash %016llx, the "
                     "source has %016llx: the copy is refused and the expert stays on the host "
                     "tier",
                     slot, l, e, (unsigned long long)got, (unsigned long long)want);
            memset(s, SLOT_POISON, f->cache->slot_bytes);
            return;
        }
    }
    cache_assign(f->cache, slot, l, e);
}

static int land(struct fwd *f, uint64_t ticket, uint32_t slot, uint32_t l, uint32_t e)
{
    finish(f, copy_wait(f->copy, ticket), slot, l, e);
    return 0;
}

/* fill_slots copies experts order[0..n) into free slots (blocking: posted, then landed), then
 * publishes the table. */
static int fill_slots(struct fwd *f, const uint32_t *order, uint32_t n)
{
    const uint32_t NE = f->m->hp.n_expert;
    for (uint32_t i = 0; i < n; i++) {
        const int32_t slot = cache_free_slot(f->cache);
        if (slot == CACHE_NONE) break;
        struct copy_extent x[COPY_MAX_EXTENTS];
        const uint32_t l = order[i] / NE, e = order[i] % NE;
        if (f->m->layers[l].dense) continue; /* a dense layer (glm4moe) has no experts */
        uint64_t ticket;
        int rv = copy_post(f->copy, (uint32_t)slot, x, copy_blob_extents(f->m, l, e, x), f->window,
                           &ticket);
        if (!rv) rv = land(f, ticket, (uint32_t)slot, l, e);
        if (rv) return rv;
        /* a refused copy leaves its slot free: the next expert takes it */
    }
    cache_publish(f->cache);
    return 0;
}

/* slot_pool (re)makes the pool for n slots, keeping the first `keep` slots' bytes (the rest
 * poisoned), moves the KV segments lent from it, and restarts the copy engine over it. Nothing may
 * be in flight (between windows, quiesced). */
static int slot_pool(struct fwd *f, uint32_t n, uint32_t keep)
{
    const uint64_t sb = f->cache->slot_bytes;
    uint8_t *p = aligned_alloc(4096, (n ? n : 1) * sb);
    if (!p)
        return strata_errf(STRATA_ENOMEM, "out of memory for %u expert slots of %.1f MiB", n,
                           (double)sb / (1 << 20));
    if (!f->slots) keep = 0;
    if (keep > n) keep = n;
    if (keep) memcpy(p, f->slots, keep * sb);
    if (n > keep) memset(p + keep * sb, SLOT_POISON, (n - keep) * sb);
    copy_close(f->copy);
    f->copy = NULL;
    free(f->slots);
    f->slots = p;
    if (f->seg_slot)
        for (uint32_t i = 0; i < kv_store_segments(f->store); i++)
            kv_store_set_segment(f->store, i, p + (uint64_t)f->seg_slot[i] * sb);
    return copy_start(p, sb, n, f->o.copy_hooks, &f->copy);
}

static uint8_t *slot_mem(const struct fwd *f, uint32_t s)
{
    return f->slots + (uint64_t)s * f->cache->slot_bytes;
}

/* verify_resident checks every resident slot's xxHash against its expert's (--cache-verify, after
 * a KV grow took a slot: no KV row may have landed in a slot a window reads); a mismatch leaves
 * the expert on the host tier. The caller publishes. */
static void verify_resident(struct fwd *f)
{
    const uint32_t NE = f->m->hp.n_expert;
    for (uint32_t s = 0; s < f->cache->n_slots; s++) {
        const int32_t x = f->cache->owner[s];
        if (x < 0) continue;
        const uint32_t l = (uint32_t)x / NE, e = (uint32_t)x % NE;
        if (XXH3_64bits(slot_mem(f, s), f->m->layers[l].blob.bytes) == copy_blob_hash(f->m, l, e))
            continue;
        f->verify_failures++;
        LOG_WARN("expert cache: slot %u (layer %u expert %u) changed while resident: the expert "
                 "goes back to the host tier",
                 s, l, e);
        cache_evict(f->cache, s);
        memset(slot_mem(f, s), SLOT_POISON, f->cache->slot_bytes);
    }
}

/* kv_take_slots: with one budget, the slots the KV blocks handed out so far need (a KV grow),
 * taken through the fence: the round in flight lands first, then each slot taken leaves the
 * working table (the least-used resident, or a free slot) and the table is republished, and only
 * then does the pass write K/V rows into it. */
static int kv_take_slots(struct fwd *f)
{
    const uint32_t need = kv_store_segments_for(f->store, kv_blocks_used_ever(f->kv));
    uint32_t have = kv_store_segments(f->store);
    if (need <= have) return 0;
    if (!(f->o.copy_hooks && f->o.copy_hooks->kv_unfenced)) {
        const double t0 = now_s();
        async_quiesce(f);
        f->window_wait_s += now_s() - t0;
    }
    for (; have < need; have++) {
        const int32_t s = cache_lend(f->cache, f->tier ? tier_counts(f->tier) : NULL,
                                     f->cache->n_slots);
        if (s == CACHE_NONE)
            return strata_errf(STRATA_ENOSPC,
                               "the KV cache needs %u slots of the budget, which has %u", need,
                               f->cache->n_slots);
        f->seg_slot[have] = (uint32_t)s;
        kv_store_set_segment(f->store, have, slot_mem(f, (uint32_t)s));
        f->kv_grows++;
    }
    cache_publish(f->cache);
    if (f->o.cache_verify) {
        verify_resident(f);
        cache_publish(f->cache);
    }
    LOG_DEBUG("expert cache: the KV cache holds %u slots of %u", f->cache->n_lent,
              f->cache->n_slots);
    return 0;
}

/* kv_budget: with one budget, the KV pool is what n slots hold (within the pool configured). */
static int kv_budget(struct fwd *f, uint32_t n)
{
    const uint32_t cap = kv_blocks_cap(f->kv), in = kv_store_blocks_in(f->store, n);
    if (!in)
        return strata_errf(STRATA_ENOSPC,
                           "--slot-kv: a budget of %u slots holds no KV block of %llu bytes", n,
                           (unsigned long long)(kv_pos_bytes(kv_config_of(f->kv),
                                                             kv_store_type(f->store)) *
                                                kv_config_of(f->kv)->block_tokens));
    return kv_set_max_blocks(f->kv, in < cap ? in : cap);
}

/* cache_open sizes the cache (slots of the largest blob), makes the pool and fills it
 * hottest-first from o->heat (cache_fill_order's rule). With --slot-kv the slots are the whole
 * budget: the KV blocks take their memory from it (kv_take_slots). */
static int cache_open(struct fwd *f)
{
    const struct model_hparams *hp = &f->m->hp;
    uint64_t sb = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++)
        if (f->m->layers[l].blob.bytes > sb) sb = f->m->layers[l].blob.bytes;
    sb = (sb + 4095) & ~(uint64_t)4095;
    const uint32_t total = hp->n_layer * hp->n_expert;
    int rv;
    uint32_t max_seg = 0;
    if (f->o.slot_kv) {
        if ((rv = kv_store_use_segments(f->store, sb)) != 0) return rv;
        max_seg = kv_store_segments_for(f->store, kv_blocks_cap(f->kv));
    }
    /* auto is 0 on the CPU: its host tier already is RAM; slots are for testing the tier */
    const uint32_t n = cache_spec_slots(&f->o.expert_cache, sb, 0, total + max_seg);
    if (!n || !total) {
        if (f->o.slot_kv)
            return strata_errf(STRATA_EINVAL,
                               "--slot-kv 1 puts the KV cache in the expert cache's budget: "
                               "give the budget with --expert-cache N or a size");
        return 0;
    }
    uint32_t *order = malloc(total * sizeof *order);
    const uint32_t swaps = f->o.tier.swaps ? f->o.tier.swaps : 1;
    const size_t T = f->o.max_pass_tokens;
    if (!order || !(f->moves = malloc(swaps * sizeof *f->moves)) ||
        !(f->chunk_of = malloc(T * sizeof *f->chunk_of)) ||
        !(f->stamp = malloc(T * sizeof *f->stamp)) ||
        (max_seg && !(f->seg_slot = malloc(max_seg * sizeof *f->seg_slot)))) {
        free(order);
        return strata_errf(STRATA_ENOMEM, "out of memory for the expert cache");
    }
    if ((rv = cache_init(hp->n_layer, hp->n_expert, n, sb, &f->cache)) != 0 ||
        (rv = slot_pool(f, n, 0)) != 0 || (f->o.slot_kv && (rv = kv_budget(f, n)) != 0) ||
        (f->o.tier.every && (rv = tier_init(hp->n_layer, hp->n_expert, &f->o.tier, &f->tier))) ||
        (f->tier && f->o.tier.async && (rv = async_start(f)) != 0) ||
        (rv = cache_fill_order(hp->n_layer, hp->n_expert, f->o.heat, order)) != 0 ||
        (rv = fill_slots(f, order, total)) != 0) {
        free(order);
        return rv;
    }
    free(order);
    LOG_INFO("expert cache: %u slots of %.2f MiB on the host (slot mode), %u of %u experts "
             "resident, tier %s%s",
             n, (double)sb / (1 << 20), cache_resident(f->cache), total,
             !f->tier ? "static" : f->o.tier.async ? "adaptive, async" : "adaptive, blocking",
             f->o.slot_kv ? "; one budget with the KV cache" : "");
    return 0;
}

static void cache_close(struct fwd *f)
{
    async_stop(f);
    copy_close(f->copy);
    tier_fini(f->tier);
    cache_fini(f->cache);
    free(f->slots);
    free(f->moves);
    free(f->flight);
    free(f->ticket);
    free(f->landed);
    free(f->chunk_of);
    free(f->stamp);
    free(f->seg_slot);
}

/* round runs one blocking tier round: each move's victim leaves the working table, the copy is
 * posted after the window just finished and landed, then the table is published. */
static int round_blocking(struct fwd *f)
{
    const uint32_t n = tier_round(f->tier, f->cache, f->moves, f->o.tier.swaps);
    if (f->o.on_round) f->o.on_round(f->o.round_ctx, tier_snapshot(f->tier));
    const uint32_t NE = f->m->hp.n_expert;
    for (uint32_t i = 0; i < n; i++) {
        const struct tier_move *mv = &f->moves[i];
        if (mv->victim != CACHE_NONE) cache_evict(f->cache, mv->slot);
        struct copy_extent x[COPY_MAX_EXTENTS];
        uint64_t ticket;
        int rv = copy_post(f->copy, mv->slot, x, copy_blob_extents(f->m, mv->layer, mv->expert, x),
                           f->window, &ticket);
        if (!rv) rv = land(f, ticket, mv->slot, mv->layer, mv->expert);
        if (rv) {
            cache_publish(f->cache);
            return rv;
        }
        if (f->cache->work[(uint64_t)mv->layer * NE + mv->expert] != CACHE_NONE) f->swaps++;
    }
    cache_publish(f->cache);
    return 0;
}

static int cpu_start(const struct model *m, const struct backend_opts *o, struct kv_cache *kv,
                     void **out)
{
    struct fwd *f = calloc(1, sizeof *f);
    if (!f) return strata_errf(STRATA_ENOMEM, "out of memory for the forward pass");
    f->m = m;
    f->kv = kv;
    f->o = *o;
    ops_yarn_init(&f->yarn, m->hp.n_rot, m->hp.yarn_orig_ctx, m->hp.rope_theta, m->hp.yarn_factor);
    /* DeepSeek's YaRN leaves the RoPE's magnitude at 1 and puts mscale^2 into the attention
     * scale instead (hp.kq_scale), as llama.cpp's deepseek2 graph does */
    if (m->hp.mla) f->yarn.mscale = 1.0f;
    if (f->o.n_threads == 0) f->o.n_threads = 1;
    f->timing = env_flag("STRATA_DECODE_TIMING", 0) != 0;
    int rv;
    if ((rv = kv_store_init(kv_config_of(kv), o->kv_type, &f->store)) != 0 ||
        (rv = alloc_scratch(f)) != 0 || (rv = pool_start(f->o.n_threads, &f->pool)) != 0 ||
        (rv = cache_open(f)) != 0)
        goto fail;
    *out = f;
    return 0;
fail:
    cpu_close(f);
    return rv;
}

static void cpu_close(void *impl)
{
    struct fwd *f = impl;
    if (!f) return;
    pool_close(f->pool);
    void *bufs[] = {f->x,         f->xn,      f->tmp,       f->q,           f->k,          f->v,
                    f->att,       f->rlogit,  f->sel,       f->selw,        f->moe,        f->g,
                    f->u,         f->y,       f->shg,       f->groups,      f->pair_idx,   f->rtok,
                    f->acts[0],   f->acts[1], f->acts[2],   f->tasks,       f->task_first, f->pos,
                    f->run_first, f->seen,    f->seen_len,  f->att_scratch, f->rsel,       f->mla_q,
                    f->mla_qa,    f->mla_o,   f->mla_tasks, f->mla_first,   f->mla_acts};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    cache_close(f);
    cpu_moe_fini(f->moe_w);
    kv_store_fini(f->store);
    free(f);
}

static void cpu_set_route(void *impl, backend_route_fn fn, void *ctx)
{
    struct fwd *f = impl;
    f->route = fn;
    f->route_ctx = ctx;
}

static void cpu_get_stats(const void *impl, struct backend_stats *out)
{
    const struct fwd *f = impl;
    *out = f->st;
}

static void cpu_reset_stats(void *impl)
{
    struct fwd *f = impl;
    memset(&f->st, 0, sizeof f->st);
}

/* ---- the async tier ----------------------------------------------------------------------
 * DESIGN 3.3's order: a move's victim leaves the working table and the table is republished
 * before its copy may write the slot; the copy waits for the last window that may still read the
 * slot (copy_post's after_window); the expert turns resident only once its copy has landed.
 * The tier's thread picks and posts while a window runs: it takes the victims out of the working
 * table (the window reads the published one, which still holds them), posts the copies fenced
 * on that running window, and the tick at the window's end publishes the table: so a copy
 * really waits for a window in progress, on the CPU too. Landing, and posting a round's later
 * batches (STRATA_ADAPT_ASYNC_BATCH) or an inline pick (STRATA_ADAPT_PICK_INLINE), run at ticks.
 * Under pmu: pick, n_picked, thread_posted, post_err, evict_pending and f->window, and every
 * change of the working table or of the published one while the thread may run. */

/* thread_post runs on the tier's thread: moves [0, end) of the round leave the table (their
 * victims out of the working table, published at the next tick) and their copies go, fenced on
 * the window running now. Returns the count posted; *err why it stopped. The test hooks:
 * unfenced posts and lands each copy before its victim leaves the table; no_window_wait posts
 * them fenced on no window. */
static uint32_t thread_post(struct fwd *f, uint32_t end, int *err)
{
    const struct copy_hooks *h = f->o.copy_hooks;
    const bool unfenced = h && h->unfenced, no_wait = h && h->no_window_wait;
    pthread_mutex_lock(&f->pmu);
    if (!unfenced) {
        for (uint32_t i = 0; i < end; i++)
            if (f->flight[i].victim != CACHE_NONE) cache_evict(f->cache, f->flight[i].slot);
        f->evict_pending = end > 0;
    }
    /* the running window may still read the victims' slots: it ends at tick f->window + 1,
     * which publishes the table without them */
    const uint64_t after = unfenced || no_wait ? 0 : f->window + 1;
    pthread_mutex_unlock(&f->pmu);
    *err = 0;
    uint32_t i = 0;
    for (; i < end; i++) {
        const struct tier_move *mv = &f->flight[i];
        struct copy_extent x[COPY_MAX_EXTENTS];
        if ((*err =
                 copy_post(f->copy, mv->slot, x, copy_blob_extents(f->m, mv->layer, mv->expert, x),
                           after, &f->ticket[i])) != 0)
            break;
        f->landed[i] = 0;
        if (unfenced) copy_wait(f->copy, f->ticket[i]);
    }
    if (unfenced) {
        pthread_mutex_lock(&f->pmu);
        for (uint32_t k = 0; k < i; k++)
            if (f->flight[k].victim != CACHE_NONE) cache_evict(f->cache, f->flight[k].slot);
        f->evict_pending = i > 0;
        pthread_mutex_unlock(&f->pmu);
    }
    return i;
}

static void *picker_main(void *arg)
{
    struct fwd *f = arg;
    pthread_mutex_lock(&f->pmu);
    for (;;) {
        while (f->pick != PICK_ASKED && !f->picker_stop)
            pthread_cond_wait(&f->pcv, &f->pmu);
        if (f->picker_stop) break;
        pthread_mutex_unlock(&f->pmu);
        const uint32_t n = tier_pick(f->tier, f->cache, f->flight, f->o.tier.swaps);
        const uint32_t end = f->async_batch && n > f->async_batch ? f->async_batch : n;
        int err;
        const uint32_t posted = thread_post(f, end, &err);
        pthread_mutex_lock(&f->pmu);
        f->n_picked = n;
        f->thread_posted = posted;
        f->post_err = err;
        f->pick = PICK_READY;
        pthread_cond_broadcast(&f->pcv);
    }
    pthread_mutex_unlock(&f->pmu);
    return NULL;
}

static int env_flag(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static int async_start(struct fwd *f)
{
    const uint32_t swaps = f->o.tier.swaps ? f->o.tier.swaps : 1;
    f->async_wait = env_flag("STRATA_ADAPT_ASYNC_WAIT", 1) != 0;
    f->pick_inline = env_flag("STRATA_ADAPT_PICK_INLINE", 0) != 0;
    f->async_batch = (uint32_t)env_flag("STRATA_ADAPT_ASYNC_BATCH", 0);
    if (!(f->flight = malloc(swaps * sizeof *f->flight)) ||
        !(f->ticket = malloc(swaps * sizeof *f->ticket)) || !(f->landed = calloc(swaps, 1)))
        return strata_errf(STRATA_ENOMEM, "out of memory for the async tier");
    pthread_mutex_init(&f->pmu, NULL);
    pthread_cond_init(&f->pcv, NULL);
    if (f->pick_inline) return 0;
    int err = pthread_create(&f->picker, NULL, picker_main, f);
    if (err) return strata_errf(strata_errno(err), "cannot start the adaptive tier's thread");
    f->picker_started = true;
    return 0;
}

/* pick_settle waits until no pick is running (the picker reads the working table). */
static void pick_settle(struct fwd *f)
{
    pthread_mutex_lock(&f->pmu);
    while (f->pick == PICK_ASKED)
        pthread_cond_wait(&f->pcv, &f->pmu);
    pthread_mutex_unlock(&f->pmu);
}

/* adopt takes over the tier thread's round once it is ready (no thread running): its posted
 * copies are the round in flight, its unposted moves the later batches. Returns the thread's
 * posting error (its unposted moves are then dropped). */
static int adopt(struct fwd *f)
{
    pthread_mutex_lock(&f->pmu);
    int err = 0;
    if (f->pick == PICK_READY) {
        err = f->post_err;
        f->n_flight = err ? f->thread_posted : f->n_picked;
        f->n_posted = f->thread_posted;
        f->n_landed = 0;
        /* the copies were released at the tick after the one that asked (their window's): the
         * tick after that lands them (ASYNC_WAIT), so they run during a whole window */
        f->posted_at = f->asked_at + 1;
        f->pick = PICK_IDLE;
    }
    pthread_mutex_unlock(&f->pmu);
    return err;
}

/* land_flight lands the posted copies that are done (all of them when wait): each good copy's
 * expert turns resident in the working table; the caller publishes. Returns the count landed. */
static uint32_t land_flight(struct fwd *f, bool wait)
{
    uint32_t n = 0;
    const double t0 = now_s();
    for (uint32_t i = 0; i < f->n_posted; i++) {
        if (f->landed[i]) continue;
        int rv;
        if (wait)
            rv = copy_wait(f->copy, f->ticket[i]);
        else if (!copy_done(f->copy, f->ticket[i], &rv))
            continue;
        const struct tier_move *mv = &f->flight[i];
        finish(f, rv, mv->slot, mv->layer, mv->expert);
        f->landed[i] = 1;
        f->n_landed++;
        if (f->cache->work[(uint64_t)mv->layer * f->m->hp.n_expert + mv->expert] != CACHE_NONE) {
            f->swaps++;
            n++;
        }
    }
    if (wait) f->window_wait_s += now_s() - t0;
    if (f->n_landed == f->n_flight) f->n_flight = f->n_posted = f->n_landed = 0;
    return n;
}

/* post_flight posts up to async_batch more moves of the round: their victims leave the working
 * table, the table is republished, then the copies go, fenced on the window just finished (the
 * last that may read the victims' slots). */
static int post_flight(struct fwd *f)
{
    uint32_t end = f->n_flight;
    if (f->async_batch && end - f->n_posted > f->async_batch) end = f->n_posted + f->async_batch;
    const bool unfenced = f->o.copy_hooks && f->o.copy_hooks->unfenced;
    if (!unfenced) {
        for (uint32_t i = f->n_posted; i < end; i++)
            if (f->flight[i].victim != CACHE_NONE) cache_evict(f->cache, f->flight[i].slot);
        cache_publish(f->cache);
    }
    for (uint32_t i = f->n_posted; i < end; i++) {
        const struct tier_move *mv = &f->flight[i];
        struct copy_extent x[COPY_MAX_EXTENTS];
        int rv = copy_post(f->copy, mv->slot, x, copy_blob_extents(f->m, mv->layer, mv->expert, x),
                           f->window, &f->ticket[i]);
        if (rv) {
            /* a failed round: the copies posted land, the moves not posted are dropped (their
             * slots stay free), and the error goes to the caller */
            f->n_posted = i;
            async_quiesce(f);
            return rv;
        }
        f->landed[i] = 0;
        /* the test hook that removes the fence: the copy lands before the next window, which
         * still reads the victim's slot from the old table */
        if (unfenced) copy_wait(f->copy, f->ticket[i]);
    }
    if (unfenced) {
        for (uint32_t i = f->n_posted; i < end; i++)
            if (f->flight[i].victim != CACHE_NONE) cache_evict(f->cache, f->flight[i].slot);
    }
    f->n_posted = end;
    f->posted_at = f->window;
    return 0;
}

/* async_quiesce is the fence: the pick in progress settles, the round's posted copies land, its
 * unposted moves are dropped (their counts stay for the next round), the table is published. */
static int async_quiesce(struct fwd *f)
{
    if (!f->flight) return 0;
    pick_settle(f);
    adopt(f);
    if (f->evict_pending) {
        cache_publish(f->cache);
        f->evict_pending = false;
    }
    /* between windows, or before the next one reads a slot: with the victims published out,
     * nothing reads them any more, so the copies fenced on that window may run now */
    copy_window_done(f->copy, f->window + 1);
    land_flight(f, true);
    f->n_flight = f->n_posted = f->n_landed = 0;
    cache_publish(f->cache);
    return 0;
}

static void async_stop(struct fwd *f)
{
    if (!f->flight) return;
    async_quiesce(f);
    if (f->picker_started) {
        pthread_mutex_lock(&f->pmu);
        f->picker_stop = true;
        pthread_cond_broadcast(&f->pcv);
        pthread_mutex_unlock(&f->pmu);
        pthread_join(f->picker, NULL);
    }
    pthread_mutex_destroy(&f->pmu);
    pthread_cond_destroy(&f->pcv);
}

/* async_tick (cpu_tick has published the victims the tier thread took out during the window):
 * adopt the thread's round, land what has landed (with ASYNC_WAIT everything, at the tick after
 * the one that released the copies), post the next batch of a round, and start a pick when one
 * is due. */
static int async_tick(struct fwd *f)
{
    int rv = adopt(f);
    if (rv) {
        /* a failed round: what the thread posted lands, the rest is dropped */
        async_quiesce(f);
        return rv;
    }
    bool changed = false;
    /* with ASYNC_WAIT a round lands at one tick, waited for: the tick after its copies were
     * released; without, each tick lands what has landed */
    if (f->n_posted && (!f->async_wait || f->window > f->posted_at))
        changed = land_flight(f, f->async_wait) > 0 || f->n_flight == 0;
    if (f->n_flight > f->n_posted) {
        if (changed) cache_publish(f->cache);
        changed = false;
        rv = post_flight(f);
    }
    if (changed) cache_publish(f->cache);
    pthread_mutex_lock(&f->pmu);
    const bool idle = f->pick == PICK_IDLE;
    pthread_mutex_unlock(&f->pmu);
    /* one round at a time: a round is due only once the last one has landed */
    if (!rv && idle && f->n_flight == 0 && tier_window(f->tier)) {
        tier_decay(f->tier);
        if (f->o.on_round) f->o.on_round(f->o.round_ctx, tier_snapshot(f->tier));
        if (f->pick_inline) {
            f->n_flight = tier_pick(f->tier, f->cache, f->flight, f->o.tier.swaps);
            f->n_posted = f->n_landed = 0;
            if (f->n_flight) rv = post_flight(f);
        } else {
            pthread_mutex_lock(&f->pmu);
            f->asked_at = f->window;
            f->pick = PICK_ASKED;
            pthread_cond_broadcast(&f->pcv);
            pthread_mutex_unlock(&f->pmu);
        }
    }
    return rv;
}

/* async_join: the tick waits for the round the last tick asked (ASYNC_WAIT): its victims then
 * left the table during that window, fenced on it, so the window in which its experts turn
 * resident does not depend on timing. */
static void async_join(struct fwd *f)
{
    const double t0 = now_s();
    pick_settle(f);
    f->window_join_s += now_s() - t0;
}

/* window_sync (the test hook of that name), at the start of a pass before it reads a slot: wait
 * for the tier thread's posting and, with the window wait or the fence removed, for those copies'
 * bytes, so that a copy the fence would hold is written while this window may read its slot. */
static void window_sync(struct fwd *f)
{
    pick_settle(f);
    const struct copy_hooks *h = f->o.copy_hooks;
    pthread_mutex_lock(&f->pmu);
    const uint32_t n = f->pick == PICK_READY ? f->thread_posted : 0;
    pthread_mutex_unlock(&f->pmu);
    if (h->no_window_wait)
        for (uint32_t i = 0; i < n; i++)
            copy_wait(f->copy, f->ticket[i]);
}

static int cpu_tick(void *impl)
{
    struct fwd *f = impl;
    const double t0 = now_s();
    if (f->flight && f->async_wait) async_join(f);
    if (f->flight) {
        /* the victims the tier thread took out during the window are published out: the copies
         * fenced on it (copy_window_done below) write slots no later window reads */
        pthread_mutex_lock(&f->pmu);
        f->window++;
        if (f->evict_pending) {
            cache_publish(f->cache);
            f->evict_pending = false;
        }
        pthread_mutex_unlock(&f->pmu);
    } else {
        f->window++;
    }
    int rv = 0;
    const uint64_t swaps0 = f->swaps;
    if (f->cache) {
        copy_window_done(f->copy, f->window);
        rv = !f->tier                ? 0
             : f->o.tier.async       ? async_tick(f)
             : tier_window(f->tier) ? round_blocking(f)
                                     : 0;
    }
    /* the window's waits: its KV grow's fence (in the pass), then this tick's */
    f->adapt_wait_s += f->window_wait_s + f->window_join_s;
    f->window_swaps = f->swaps - swaps0;
    if (f->timing) {
        /* this window's share: the counters less those at the last tick. The CPU computes hits
         * and misses in one expert step (one side: no idle); tick: this call, the tier's work
         * between windows (a blocking round's copies, the async tier's landing and posting) */
        const struct backend_stats *st = &f->st, *p = &f->tick_st;
        LOG_INFO("window %llu: %.2f ms (attention %.2f, dense %.2f, experts %.2f, combine %.2f, "
                 "output %.2f), tick %.3f ms, fence %.3f ms, %llu hits %llu misses, adapt wait "
                 "%.3f join %.3f ms, %llu swaps/window",
                 (unsigned long long)f->window, 1e3 * (st->total_s - p->total_s),
                 1e3 * (st->attention_s - p->attention_s), 1e3 * (st->dense_s - p->dense_s),
                 1e3 * (st->experts_s - p->experts_s), 1e3 * (f->combine_s - f->tick_combine_s),
                 1e3 * (st->output_s - p->output_s), 1e3 * (now_s() - t0),
                 1e3 * f->window_fence_s,
                 (unsigned long long)(f->hits - f->tick_hits),
                 (unsigned long long)(f->misses - f->tick_misses), 1e3 * f->window_wait_s,
                 1e3 * f->window_join_s, (unsigned long long)f->window_swaps);
        f->tick_st = *st;
        f->tick_hits = f->hits;
        f->tick_misses = f->misses;
        f->tick_combine_s = f->combine_s;
    }
    f->window_wait_s = f->window_join_s = f->window_fence_s = 0;
    return rv;
}

static int cpu_quiesce(void *impl)
{
    struct fwd *f = impl;
    if (!f->cache) return 0;
    const double t0 = now_s();
    const int rv = async_quiesce(f);
    f->window_fence_s += now_s() - t0;
    return rv;
}

/* kv_fit: with one budget shrinking to n slots, the KV pool becomes what n slots hold (refused,
 * STRATA_EBUSY, while a sequence holds a block past it), the segments it no longer needs go back
 * to the slots (poisoned), and the segments in slots at or past n move below n (their bytes
 * copied, into a free slot or the least-used resident's). Fenced, between windows. */
static int kv_fit(struct fwd *f, uint32_t n)
{
    int rv = kv_budget(f, n);
    if (rv) return rv;
    const uint32_t need = kv_store_segments_for(f->store, kv_blocks_used_ever(f->kv));
    for (uint32_t i = need; i < kv_store_segments(f->store); i++) {
        cache_unlend(f->cache, f->seg_slot[i]);
        memset(slot_mem(f, f->seg_slot[i]), SLOT_POISON, f->cache->slot_bytes);
    }
    kv_store_drop_segments(f->store, need);
    for (uint32_t i = 0; i < need; i++) {
        if (f->seg_slot[i] < n) continue;
        const int32_t s = cache_lend(f->cache, f->tier ? tier_counts(f->tier) : NULL, n);
        if (s == CACHE_NONE) /* cannot happen: need segments fit in n slots */
            return strata_errf(STRATA_ENOSPC, "no slot below %u for KV segment %u", n, i);
        memcpy(slot_mem(f, (uint32_t)s), slot_mem(f, f->seg_slot[i]), f->cache->slot_bytes);
        LOG_INFO("expert cache: the KV cache's segment %u moves from slot %u to slot %d", i,
                 f->seg_slot[i], s);
        cache_unlend(f->cache, f->seg_slot[i]);
        f->seg_slot[i] = (uint32_t)s;
        kv_store_set_segment(f->store, i, slot_mem(f, (uint32_t)s));
    }
    return 0;
}

/* cpu_resize changes slot mode's pool to bytes / slot_bytes slots, between windows: the slots
 * kept keep their experts; new ones are filled by the tier's next rounds. With one budget
 * (--slot-kv) it is the budget that changes: the KV cache keeps its blocks (kv_fit) and its pool
 * grows or shrinks with the budget. */
static int cpu_resize(void *impl, uint64_t bytes)
{
    struct fwd *f = impl;
    if (f->cache) async_quiesce(f); /* the fence: no copy in flight while slots change hands */
    if (!f->cache)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "this CPU backend runs without an expert cache: start it with "
                           "--expert-cache N to resize one");
    uint64_t total = f->m->hp.n_layer * f->m->hp.n_expert;
    if (f->seg_slot) total += kv_store_segments_for(f->store, kv_blocks_cap(f->kv));
    uint64_t n = bytes / f->cache->slot_bytes;
    if (n > total) n = total;
    const uint32_t old = f->cache->n_slots;
    int rv;
    if ((uint32_t)n < old) {
        if (f->seg_slot && (rv = kv_fit(f, (uint32_t)n)) != 0) {
            cache_publish(f->cache);
            return rv;
        }
        /* evicts first: no window reads the slots freed */
        if ((rv = cache_resize(f->cache, (uint32_t)n)) != 0) return rv;
        cache_publish(f->cache);
        return slot_pool(f, (uint32_t)n, (uint32_t)n);
    }
    if ((rv = slot_pool(f, (uint32_t)n, old)) != 0 ||
        (rv = cache_resize(f->cache, (uint32_t)n)) != 0)
        return rv;
    return f->seg_slot ? kv_budget(f, (uint32_t)n) : 0;
}

static void cpu_info(const void *impl, struct backend_info *out)
{
    const struct fwd *f = impl;
    *out = (struct backend_info){
        .name = "cpu",
        .kv_type = kv_store_type(f->store),
        .kv_bytes = kv_store_bytes(f->store),
        .kv_pos_bytes = kv_pos_bytes(kv_config_of(f->kv), kv_store_type(f->store)),
        .bit_exact = true,
    };
    snprintf(out->device, sizeof out->device, "%s x %u threads", cpu_isa_name(cpu_isa()),
             f->o.n_threads);
    if (!f->cache) return;
    struct copy_stats cs;
    copy_get_stats(f->copy, &cs);
    out->cache_slots = f->cache->n_slots;
    out->slot_bytes = f->cache->slot_bytes;
    out->resident = cache_resident(f->cache);
    out->hits = f->hits;
    out->misses = f->misses;
    out->first_hit_rate = f->first_hit_rate;
    out->swaps = f->swaps;
    out->copy_bytes = cs.bytes;
    out->copy_gibs = cs.busy_s > 0 ? (double)cs.bytes / cs.busy_s / (1 << 30) : 0;
    out->verify_failures = f->verify_failures;
    out->adapt_wait_s = f->adapt_wait_s;
    out->kv_slots = f->cache->n_lent;
}

/* ---- matmuls ------------------------------------------------------------------------------ */

/* run_tasks computes f->tasks[0..n) in one parallel loop (cpu_mm.h). */
static void run_tasks(struct fwd *f, uint32_t n)
{
    f->st.weight_bytes += cpu_mm_run(f->pool, f->tasks, n, f->task_first);
}

/* Quantization of n rows for the pool: rows [lo, hi) of src into dst. */
struct quant_job {
    uint32_t type, n_in;
    const float *x;
    size_t x_stride;
    uint8_t *dst;
    size_t dst_stride;
    _Atomic int rv;
};

static void quant_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct quant_job *j = ctx;
    int rv = cpu_quantize_acts(j->type, j->x + lo * j->x_stride, j->x_stride, j->n_in, hi - lo,
                               j->dst + lo * j->dst_stride, j->dst_stride);
    if (rv) atomic_store(&j->rv, rv);
}

/* quantize: activations of n rows of x for a matmul with w, into dst (rows of act_stride). */
static int quantize(struct fwd *f, const struct model_mat *w, const float *x, size_t x_stride,
                    uint32_t n, uint8_t *dst)
{
    struct quant_job j = {w->type, w->n_in, x, x_stride, dst, f->act_stride, 0};
    pool_for(f->pool, n, 16, quant_rows, &j);
    return atomic_load(&j.rv);
}

static struct cpu_mm_task task(struct fwd *f, const struct model_mat *w, const void *wdata,
                               const void *acts, uint32_t n_tok, float *out, size_t out_stride)
{
    return (struct cpu_mm_task){w->type, w->n_in,       w->n_out, w->row_bytes, wdata,
                                acts,    f->act_stride, n_tok,    out,          out_stride};
}

/* inputs_for: activations of x (n rows of w->n_in) for matrix w, reusing those already made for
 * `prev` when both quantize the same way. */
static int inputs_for(struct fwd *f, const struct model_mat *w, const struct model_mat *prev,
                      const uint8_t *prev_acts, const float *x, size_t x_stride, uint32_t n,
                      uint8_t *dst, const uint8_t **out)
{
    if (prev && quant_act_type(prev->type) == quant_act_type(w->type) && prev->n_in == w->n_in) {
        *out = prev_acts;
        return 0;
    }
    *out = dst;
    return quantize(f, w, x, x_stride, n, dst);
}

/* matmul: out (n_tok rows of out_stride floats) = W . x for n_tok rows of x (x_stride floats). */
static int matmul(struct fwd *f, const struct model_mat *w, const float *x, size_t x_stride,
                  uint32_t n_tok, float *out, size_t out_stride)
{
    int rv = quantize(f, w, x, x_stride, n_tok, f->acts[0]);
    if (rv) return rv;
    f->tasks[0] = task(f, w, w->data, f->acts[0], n_tok, out, out_stride);
    run_tasks(f, 1);
    return 0;
}

/* add_rows adds bias b (width floats) to each of n rows of x (gpt-oss's output and router
 * biases). */
static void add_rows(float *x, const float *b, uint32_t n, size_t width)
{
    for (uint32_t t = 0; t < n; t++)
        for (size_t i = 0; i < width; i++)
            x[t * width + i] += b[i];
}

/* ---- attention ----------------------------------------------------------------------------- */

/* Attention job: items are (run, KV head) pairs; a run is up to ATT_RUN consecutive tokens of
 * one sequence at consecutive positions (a prompt chunk), so they share each block of keys. */
#define ATT_RUN 16

struct att_job {
    struct fwd *f;
    const struct backend_token *toks;
    uint32_t layer;
    uint32_t n_runs;
};

/* sinks_of: the sink logits of query heads h.. of layer il (gpt-oss), NULL without sinks. */
static const float *sinks_of(const struct model *m, uint32_t il, uint32_t h)
{
    return m->layers[il].sinks ? m->layers[il].sinks + h : NULL;
}

static void att_items(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct att_job *j = ctx;
    struct fwd *f = j->f;
    const struct model_hparams *hp = &f->m->hp;
    const float scale = 1.0f / sqrtf((float)hp->head_dim);
    const uint32_t group = hp->n_head / hp->n_head_kv;
    const size_t nq = (size_t)hp->n_head * hp->head_dim, no = (size_t)hp->n_head * hp->head_dim_v;
    for (uint32_t i = lo; i < hi; i++) {
        const uint32_t r = i / hp->n_head_kv, g = i % hp->n_head_kv, h = g * group;
        const uint32_t t0 = f->run_first[r], nt = f->run_first[r + 1] - t0;
        struct ops_kv_view view;
        kv_store_view(f->store, j->toks[t0].seq, j->layer, g, hp->head_dim, hp->head_dim_v,
                      f->pos[t0] + nt, f->att_scratch + (size_t)thread * f->att_scratch_bytes,
                      &view);
        const struct cpu_att_q a = {f->q + t0 * nq + (size_t)h * hp->head_dim,
                                    nq,
                                    hp->head_dim,
                                    f->att + t0 * no + (size_t)h * hp->head_dim_v,
                                    no,
                                    hp->head_dim_v,
                                    nt,
                                    group,
                                    f->pos[t0] + 1,
                                    f->m->layers[j->layer].swa ? hp->n_swa : 0,
                                    sinks_of(f->m, j->layer, h)};
        cpu_attention(&a, hp->head_dim, hp->head_dim_v, scale, &view);
    }
}

/* runs splits the batch into runs of one sequence's consecutive positions, at most ATT_RUN tokens
 * and CPU_ATT_MAXQ queries each; returns their count. */
static uint32_t runs(struct fwd *f, const struct backend_token *toks, uint32_t n)
{
    const uint32_t group = f->m->hp.n_head / f->m->hp.n_head_kv;
    uint32_t max = CPU_ATT_MAXQ / group < ATT_RUN ? CPU_ATT_MAXQ / group : ATT_RUN, nr = 0;
    if (!max) max = 1;
    for (uint32_t t = 0; t < n; t++)
        if (t == 0 || toks[t].seq != toks[t - 1].seq || f->pos[t] != f->pos[t - 1] + 1 ||
            t - f->run_first[nr - 1] == max)
            f->run_first[nr++] = t;
    f->run_first[nr] = n;
    return nr;
}

/* After the projections, per token (items): biases, q/k norms, RoPE, and the K/V store. */
struct qkv_job {
    struct fwd *f;
    const struct backend_token *toks;
    uint32_t layer;
};

static void qkv_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct qkv_job *j = ctx;
    struct fwd *f = j->f;
    const struct backend_token *toks = j->toks;
    const uint32_t il = j->layer;
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[il];
    const size_t nq = (size_t)hp->n_head * hp->head_dim, nk = (size_t)hp->n_head_kv * hp->head_dim,
                 nv = (size_t)hp->n_head_kv * hp->head_dim_v;
    for (uint32_t t = lo; t < hi; t++) {
        float *q = f->q + t * nq, *k = f->k + t * nk, *v = f->v + t * nv;
        if (L->bq) {
            for (size_t i = 0; i < nq; i++)
                q[i] += L->bq[i];
            for (size_t i = 0; i < nk; i++)
                k[i] += L->bk[i];
            for (size_t i = 0; i < nv; i++)
                v[i] += L->bv[i];
        }
        if (hp->qk_norm == MODEL_QK_NORM_HEAD) {
            for (uint32_t h = 0; h < hp->n_head; h++)
                cpu_rmsnorm(q + h * hp->head_dim, q + h * hp->head_dim, L->q_norm, hp->head_dim,
                            hp->rms_eps);
            for (uint32_t h = 0; h < hp->n_head_kv; h++)
                cpu_rmsnorm(k + h * hp->head_dim, k + h * hp->head_dim, L->k_norm, hp->head_dim,
                            hp->rms_eps);
        } else if (hp->qk_norm == MODEL_QK_NORM_FULL) {
            cpu_rmsnorm(q, q, L->q_norm, nq, hp->rms_eps);
            cpu_rmsnorm(k, k, L->k_norm, nk, hp->rms_eps);
        }
        const bool neox = hp->rope == MODEL_ROPE_NEOX;
        if (hp->yarn_factor > 1.0f) {
            /* YaRN (gpt-oss): the angles mixed per pair */
            cpu_rope_yarn(q, hp->n_head, hp->head_dim, hp->n_rot, f->pos[t], hp->rope_theta, neox,
                          &f->yarn);
            cpu_rope_yarn(k, hp->n_head_kv, hp->head_dim, hp->n_rot, f->pos[t], hp->rope_theta,
                          neox, &f->yarn);
        } else {
            cpu_rope(q, hp->n_head, hp->head_dim, hp->n_rot, f->pos[t], hp->rope_theta, neox);
            cpu_rope(k, hp->n_head_kv, hp->head_dim, hp->n_rot, f->pos[t], hp->rope_theta, neox);
        }
        kv_store_write(f->store, toks[t].seq, il, f->pos[t], k, v);
    }
}

/* ---- multi-head latent attention (deepseek2; the rows in fwd_mla.c) ------------------------- */

struct mla_job {
    struct fwd *f;
    const struct backend_token *toks;
    uint32_t layer, n_runs, chunk, n_chunks;
};

/* mla_rows, items = tokens: the queries' rope parts, the cached row (stored). */
static void mla_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct mla_job *j = ctx;
    struct fwd *f = j->f;
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[j->layer];
    const struct ops_yarn *y = hp->yarn_factor > 1.0f ? &f->yarn : NULL;
    const size_t nq = (size_t)hp->n_head * hp->head_dim, qk = (size_t)hp->n_head * hp->head_dim_qk;
    for (uint32_t t = lo; t < hi; t++) {
        mla_q_rope(hp, f->mla_q + t * qk, f->pos[t], y, f->q + t * nq);
        mla_kv_row(hp, L, f->k + t * hp->head_dim, f->pos[t], y);
        kv_store_write(f->store, j->toks[t].seq, j->layer, f->pos[t], f->k + t * hp->head_dim,
                       f->v);
    }
}

/* mla_att, items = (run, chunk of heads): MQA over the cached rows, the values being the rows'
 * first n_lora_kv floats (the view reads them in the K rows: the cache stores no V). */
static void mla_att(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct mla_job *j = ctx;
    struct fwd *f = j->f;
    const struct model_hparams *hp = &f->m->hp;
    const size_t nq = (size_t)hp->n_head * hp->head_dim, no = (size_t)hp->n_head * hp->head_dim_v;
    for (uint32_t i = lo; i < hi; i++) {
        const uint32_t r = i / j->n_chunks, h = i % j->n_chunks * j->chunk;
        const uint32_t nh = hp->n_head - h < j->chunk ? hp->n_head - h : j->chunk;
        const uint32_t t0 = f->run_first[r], nt = f->run_first[r + 1] - t0;
        struct ops_kv_view view;
        kv_store_view(f->store, j->toks[t0].seq, j->layer, 0, hp->head_dim, 0, f->pos[t0] + nt,
                      f->att_scratch + (size_t)thread * f->att_scratch_bytes, &view);
        view.v_off = view.k_off;
        view.v_stride = view.k_stride;
        const struct cpu_att_q a = {f->q + t0 * nq + (size_t)h * hp->head_dim,
                                    nq,
                                    hp->head_dim,
                                    f->att + t0 * no + (size_t)h * hp->head_dim_v,
                                    no,
                                    hp->head_dim_v,
                                    nt,
                                    nh,
                                    f->pos[t0] + 1,
                                    0,
                                    NULL};
        cpu_attention(&a, hp->head_dim, hp->head_dim_v, hp->kq_scale, &view);
    }
}

static uint32_t runs(struct fwd *f, const struct backend_token *toks, uint32_t n);

/* mla_act_bytes: a per-head input row's activations for w, rounded to a cache line. */
static size_t mla_act_bytes(const struct model_mat *w)
{
    return (quant_act_bytes(w->type, w->n_in) + 63) & ~(size_t)63;
}

/* mla_heads: for each of n tokens and each head h, out[t][h] (n_out floats at out + t*H*out_head
 * + h*out_head) = head h's matrix of w . x[t][h] (w->n_in floats at x + (t*H + h)*x_head): the
 * k_b absorption or the v_b output. F32 weights read the floats in place; others quantize them. */
static int mla_heads(struct fwd *f, const struct model_mat *w, const float *x, size_t x_head,
                     uint32_t n, float *out, size_t out_head)
{
    const uint32_t H = f->m->hp.n_head;
    const void *acts = x;
    size_t ab = x_head * sizeof(float);
    if (quant_act_type(w->type) != QT_F32) {
        ab = mla_act_bytes(w);
        struct quant_job j = {w->type, w->n_in, x, x_head, f->mla_acts, ab, 0};
        pool_for(f->pool, n * H, 16, quant_rows, &j);
        if (atomic_load(&j.rv)) return atomic_load(&j.rv);
        acts = f->mla_acts;
    }
    mla_head_tasks(w, H, acts, ab, n, out, H * out_head, out_head, f->mla_tasks);
    f->st.weight_bytes += cpu_mm_run(f->pool, f->mla_tasks, H, f->mla_first);
    return 0;
}

static int attention_mla(struct fwd *f, const struct backend_token *toks, uint32_t n, uint32_t il)
{
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[il];
    const size_t E = hp->n_embd, qk = (size_t)hp->n_head * hp->head_dim_qk;
    int rv;
    double t0 = now_s();
    for (uint32_t t = 0; t < n; t++)
        cpu_rmsnorm(f->xn + t * E, f->x + t * E, L->attn_norm, E, hp->rms_eps);
    double t1 = now_s();
    if (hp->n_lora_q) {
        if ((rv = matmul(f, &L->wq_a, f->xn, E, n, f->mla_qa, hp->n_lora_q))) return rv;
        for (uint32_t t = 0; t < n; t++)
            cpu_rmsnorm(f->mla_qa + t * hp->n_lora_q, f->mla_qa + t * hp->n_lora_q, L->q_a_norm,
                        hp->n_lora_q, hp->rms_eps);
        if ((rv = matmul(f, &L->wq_b, f->mla_qa, hp->n_lora_q, n, f->mla_q, qk))) return rv;
    } else if ((rv = matmul(f, &L->wq, f->xn, E, n, f->mla_q, qk))) {
        return rv;
    }
    if ((rv = matmul(f, &L->wkv_a, f->xn, E, n, f->k, hp->head_dim))) return rv;
    double t2 = now_s();
    struct mla_job j = {f, toks, il, 0, 0, 0};
    pool_for(f->pool, n, 1, mla_rows, &j);
    if ((rv = mla_heads(f, &L->k_b, f->mla_q, hp->head_dim_qk, n, f->q, hp->head_dim))) return rv;
    /* every token's row is stored before any token attends (as attention()) */
    j.n_runs = runs(f, toks, n);
    uint32_t max_nt = 1;
    for (uint32_t r = 0; r < j.n_runs; r++)
        if (f->run_first[r + 1] - f->run_first[r] > max_nt)
            max_nt = f->run_first[r + 1] - f->run_first[r];
    /* chunks of heads for the threads: each query is computed on its own, so the split never
     * changes a bit */
    j.chunk = CPU_ATT_MAXQ / max_nt;
    const uint32_t share = (hp->n_head + f->o.n_threads - 1) / f->o.n_threads;
    if (j.chunk > share) j.chunk = share;
    if (j.chunk == 0) j.chunk = 1;
    j.n_chunks = (hp->n_head + j.chunk - 1) / j.chunk;
    pool_for(f->pool, j.n_runs * j.n_chunks, 1, mla_att, &j);
    if ((rv = mla_heads(f, &L->v_b, f->att, hp->head_dim_v, n, f->mla_o, hp->head_dim_vo)))
        return rv;
    double t3 = now_s();
    if ((rv = matmul(f, &L->wo, f->mla_o, (size_t)hp->n_head * hp->head_dim_vo, n, f->tmp, E)))
        return rv;
    for (size_t i = 0; i < n * E; i++)
        f->x[i] += f->tmp[i];
    double t4 = now_s();
    f->st.attention_s += (t1 - t0) + (t3 - t2);
    f->st.dense_s += (t2 - t1) + (t4 - t3);
    return 0;
}

static int attention(struct fwd *f, const struct backend_token *toks, uint32_t n, uint32_t il)
{
    if (f->m->hp.mla) return attention_mla(f, toks, n, il);
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[il];
    const size_t E = hp->n_embd, nq = (size_t)hp->n_head * hp->head_dim,
                 nk = (size_t)hp->n_head_kv * hp->head_dim,
                 nv = (size_t)hp->n_head_kv * hp->head_dim_v;
    int rv;
    double t0 = now_s();
    for (uint32_t t = 0; t < n; t++)
        cpu_rmsnorm(f->xn + t * E, f->x + t * E, L->attn_norm, E, hp->rms_eps);
    double t1 = now_s();
    const uint8_t *aq, *ak, *av;
    if ((rv = inputs_for(f, &L->wq, NULL, NULL, f->xn, E, n, f->acts[0], &aq)) ||
        (rv = inputs_for(f, &L->wk, &L->wq, aq, f->xn, E, n, f->acts[1], &ak)) ||
        (rv = inputs_for(f, &L->wv, &L->wk, ak, f->xn, E, n, f->acts[2], &av)))
        return rv;
    f->tasks[0] = task(f, &L->wq, L->wq.data, aq, n, f->q, nq);
    f->tasks[1] = task(f, &L->wk, L->wk.data, ak, n, f->k, nk);
    f->tasks[2] = task(f, &L->wv, L->wv.data, av, n, f->v, nv);
    run_tasks(f, 3);
    double t2 = now_s();
    struct qkv_job qj = {f, toks, il};
    pool_for(f->pool, n, 4, qkv_rows, &qj);
    /* Every token's K/V of this layer is stored before any token attends: a prompt chunk's later
     * tokens see its earlier ones, and each sees only positions <= its own. */
    struct att_job j = {f, toks, il, runs(f, toks, n)};
    pool_for(f->pool, j.n_runs * hp->n_head_kv, 1, att_items, &j);
    double t3 = now_s();
    if ((rv = matmul(f, &L->wo, f->att, (size_t)hp->n_head * hp->head_dim_v, n, f->tmp, E)))
        return rv;
    if (L->bo) add_rows(f->tmp, L->bo, n, E);
    for (size_t i = 0; i < n * E; i++)
        f->x[i] += f->tmp[i];
    double t4 = now_s();
    f->st.attention_s += (t1 - t0) + (t3 - t2);
    f->st.dense_s += (t2 - t1) + (t4 - t3);
    return 0;
}

/* ---- MoE ----------------------------------------------------------------------------------- */

/* route picks each token's experts and weights from its router logits, per the arch's gating:
 * DeepSeek-V3's (sigmoid, selection bias, scaling: glm4moe) through route_biased. */
static void route(struct fwd *f, uint32_t n, uint32_t il)
{
    const struct model_hparams *hp = &f->m->hp;
    const uint32_t E = hp->n_expert, K = hp->n_expert_used;
    const struct model_layer *L = &f->m->layers[il];
    const bool biased = hp->gating == MODEL_GATING_SIGMOID || L->exp_probs_b ||
                        hp->exp_scale != 1.0f || hp->n_group > 1;
    const struct route_opts ro = {E,
                                  K,
                                  hp->gating != MODEL_GATING_SIGMOID,
                                  L->exp_probs_b,
                                  hp->n_group,
                                  hp->n_group_used,
                                  hp->norm_topk,
                                  hp->exp_scale};
    for (uint32_t t = 0; t < n; t++) {
        float *p = f->rlogit + (size_t)t * E, *w = f->selw + (size_t)t * K;
        uint32_t *sel = (uint32_t *)(f->sel + (size_t)t * K); /* ids < n_expert fit both */
        if (biased) {
            route_biased(&ro, p, f->rsel, sel, w);
            continue;
        }
        if (hp->gating == MODEL_GATING_TOPK_SOFTMAX) {
            ops_topk(p, E, K, sel);
            for (uint32_t i = 0; i < K; i++)
                w[i] = p[sel[i]];
            ops_softmax(w, K);
            continue;
        }
        ops_softmax(p, E);
        ops_topk(p, E, K, sel);
        float sum = 0.0f;
        for (uint32_t i = 0; i < K; i++)
            sum += w[i] = p[sel[i]];
        if (hp->norm_topk)
            for (uint32_t i = 0; i < K; i++)
                w[i] /= sum;
    }
}

/* Expert parts for cpu_moe_ffn: from the expert's slot when the published table holds it, else
 * through the model's resolver (arena or file). */
struct part_ctx {
    const struct fwd *f;
    uint32_t layer;
};

static const void *expert_part(void *ctx, uint32_t expert, int part)
{
    const struct part_ctx *c = ctx;
    const struct fwd *f = c->f;
    const int32_t slot = f->cache ? cache_slot(f->cache, c->layer, expert) : CACHE_NONE;
    if (slot == CACHE_NONE) return model_expert_part(f->m, c->layer, expert, (enum model_part)part);
    return f->slots + (uint64_t)slot * f->cache->slot_bytes +
           f->m->layers[c->layer].blob.part_off[part];
}

/* count_layer: the layer's hits and misses, and its routed entries for the tier: a decode token
 * counts each pair, a prompt chunk each of its experts once. */
static void count_layer(struct fwd *f, uint32_t il, int n_groups)
{
    const uint32_t K = f->m->hp.n_expert_used;
    for (int g = 0; g < n_groups; g++) {
        const struct moe_group *gr = &f->groups[g];
        const uint32_t e = (uint32_t)gr->expert;
        const bool hit = cache_slot(f->cache, il, e) != CACHE_NONE;
        *(hit ? &f->hits : &f->misses) += (uint64_t)gr->count;
        if (!f->tier) continue;
        const uint32_t mark = il * f->m->hp.n_expert + e + 1;
        float n = 0;
        for (int32_t i = 0; i < gr->count; i++) {
            const uint32_t t = (uint32_t)f->pair_idx[gr->first + i] / K, c = f->chunk_of[t];
            if (c == UINT32_MAX) {
                n += 1;
            } else if (f->stamp[c] != mark) {
                f->stamp[c] = mark;
                n += 1;
            }
        }
        tier_count(f->tier, il, e, n);
    }
}

/* combine_rows: each token's expert outputs summed in expert-id order (moe_combine), items =
 * tokens. */
static void combine_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct fwd *f = ctx;
    moe_combine(f->y, f->sel, lo, hi, (int)f->m->hp.n_expert_used, f->m->hp.n_embd, f->moe);
}

/* report_routes calls the route hook per expert with the tokens of its pairs, ascending. */
static void report_routes(struct fwd *f, uint32_t il, int n_groups)
{
    const uint32_t K = f->m->hp.n_expert_used;
    for (int g = 0; g < n_groups; g++) {
        const struct moe_group *gr = &f->groups[g];
        for (int32_t i = 0; i < gr->count; i++)
            f->rtok[i] = (uint32_t)f->pair_idx[gr->first + i] / K;
        f->route(f->route_ctx, il, (uint32_t)gr->expert, f->rtok, (uint32_t)gr->count);
    }
}

static int routed_experts(struct fwd *f, uint32_t n, uint32_t il)
{
    const struct model *m = f->m;
    const struct model_hparams *hp = &m->hp;
    const struct model_layer *L = &m->layers[il];
    const int K = (int)hp->n_expert_used;
    /* One group per expert hit: the CPU's matmul takes any token count at the same bits. */
    const int ng = moe_group(f->sel, n, K, hp->n_expert, NULL, UINT32_MAX, f->groups, f->pair_idx);
    if (f->route) report_routes(f, il, ng);
    if (f->cache) count_layer(f, il, ng);
    const struct cpu_moe_parts parts = {
        {L->part[MODEL_PART_GATE].type, L->part[MODEL_PART_GATE].n_in,
         L->part[MODEL_PART_GATE].n_out, L->part[MODEL_PART_GATE].row_bytes},
        {L->part[MODEL_PART_UP].type, L->part[MODEL_PART_UP].n_in, L->part[MODEL_PART_UP].n_out,
         L->part[MODEL_PART_UP].row_bytes},
        {L->part[MODEL_PART_DOWN].type, L->part[MODEL_PART_DOWN].n_in,
         L->part[MODEL_PART_DOWN].n_out, L->part[MODEL_PART_DOWN].row_bytes},
    };
    struct part_ctx pc = {f, il};
    uint64_t bytes;
    int rv = cpu_moe_ffn(f->moe_w, f->pool, &parts, expert_part, &pc, f->groups, ng, f->pair_idx,
                         f->selw, n, K, f->xn, hp->n_embd, f->y, &bytes);
    if (rv) return rv;
    f->st.weight_bytes += bytes;
    const double t0 = f->timing ? now_s() : 0;
    pool_for(f->pool, n, 4, combine_rows, f);
    if (f->timing) f->combine_s += now_s() - t0;
    return 0;
}

/* swiglu_ffn adds down . (silu(gate . xn) * (up . xn)) to f->moe: the shared expert, scaled by
 * sigmoid(gate_inp . xn) when gate_inp is given (qwen2moe), or a dense layer's FFN (glm4moe). */
static int swiglu_ffn(struct fwd *f, uint32_t n, const struct model_mat *gate,
                      const struct model_mat *up, const struct model_mat *down,
                      const struct model_mat *gate_inp)
{
    const size_t E = f->m->hp.n_embd, F = gate->n_out;
    int rv;
    const uint8_t *ag, *au, *as = NULL;
    if ((rv = inputs_for(f, gate, NULL, NULL, f->xn, E, n, f->acts[0], &ag)) ||
        (rv = inputs_for(f, up, gate, ag, f->xn, E, n, f->acts[1], &au)) ||
        (gate_inp && (rv = inputs_for(f, gate_inp, up, au, f->xn, E, n, f->acts[2], &as))))
        return rv;
    f->tasks[0] = task(f, gate, gate->data, ag, n, f->g, F);
    f->tasks[1] = task(f, up, up->data, au, n, f->u, F);
    if (gate_inp) f->tasks[2] = task(f, gate_inp, gate_inp->data, as, n, f->shg, 1);
    run_tasks(f, gate_inp ? 3 : 2);
    for (uint32_t t = 0; t < n; t++)
        ops_swiglu(f->g + t * F, f->g + t * F, f->u + t * F, F);
    if ((rv = matmul(f, down, f->g, F, n, f->y, E))) return rv;
    for (uint32_t t = 0; t < n; t++) {
        const float s = gate_inp ? 1.0f / (1.0f + expf(-f->shg[t])) : 1.0f;
        for (size_t d = 0; d < E; d++)
            f->moe[t * E + d] += s * f->y[t * E + d];
    }
    return 0;
}

static int shared_expert(struct fwd *f, uint32_t n, uint32_t il)
{
    const struct model_layer *L = &f->m->layers[il];
    return swiglu_ffn(f, n, &L->gate_shexp, &L->up_shexp, &L->down_shexp,
                      f->m->hp.shexp_gated ? &L->gate_inp_shexp : NULL);
}

static int moe(struct fwd *f, uint32_t n, uint32_t il)
{
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[il];
    const size_t E = hp->n_embd;
    int rv;
    double t0 = now_s();
    for (uint32_t t = 0; t < n; t++)
        cpu_rmsnorm(f->xn + t * E, f->x + t * E, L->ffn_norm, E, hp->rms_eps);
    double t1 = now_s();
    if (L->dense) {
        /* a leading dense layer (glm4moe): its FFN in the place of the experts */
        memset(f->moe, 0, n * E * sizeof *f->moe);
        if ((rv = swiglu_ffn(f, n, &L->ffn_gate, &L->ffn_up, &L->ffn_down, NULL))) return rv;
        for (size_t i = 0; i < n * E; i++)
            f->x[i] += f->moe[i];
        f->st.attention_s += t1 - t0;
        f->st.dense_s += now_s() - t1;
        return 0;
    }
    if ((rv = matmul(f, &L->router, f->xn, E, n, f->rlogit, hp->n_expert))) return rv;
    if (L->router_b) add_rows(f->rlogit, L->router_b, n, hp->n_expert);
    route(f, n, il);
    double t2 = now_s();
    if ((rv = routed_experts(f, n, il))) return rv;
    double t3 = now_s();
    if (hp->n_ff_shexp && (rv = shared_expert(f, n, il))) return rv;
    for (size_t i = 0; i < n * E; i++)
        f->x[i] += f->moe[i];
    double t4 = now_s();
    f->st.attention_s += t1 - t0;
    f->st.dense_s += (t2 - t1) + (t4 - t3);
    f->st.experts_s += t3 - t2;
    return 0;
}

/* grow assigns positions and grows each sequence of the batch; on error it restores them all. */
static int grow(struct fwd *f, const struct backend_token *toks, uint32_t n)
{
    uint32_t n_seen = 0;
    int rv = 0;
    /* O(n * sequences): a batch holds at most a few hundred sequences. */
    for (uint32_t t = 0; t < n; t++) {
        uint32_t s = 0;
        while (s < n_seen && f->seen[s] != toks[t].seq)
            s++;
        if (s == n_seen) {
            f->seen[n_seen] = toks[t].seq;
            f->seen_len[n_seen++] = toks[t].seq->n_tokens;
        }
        f->pos[t] = toks[t].seq->n_tokens;
        if ((rv = kv_seq_resize(f->kv, toks[t].seq, f->pos[t] + 1)) != 0) break;
    }
    if (!rv && f->seg_slot) rv = kv_take_slots(f);
    if (!rv) rv = kv_store_reserve(f->store, kv_blocks_used_ever(f->kv));
    if (rv)
        for (uint32_t s = 0; s < n_seen; s++)
            kv_seq_resize(f->kv, f->seen[s], f->seen_len[s]);
    return rv;
}

/* mark_chunks: for the tier's counting, each token's prompt chunk (the first batch index of its
 * sequence when the sequence has several tokens in the batch, not all asking for logits) or
 * UINT32_MAX for a decode step. A sequence's tokens that all ask for logits are a decode step and
 * its drafts being verified: each counts, as decode tokens do (DESIGN 3.3).
 * O(n * sequences), as grow. */
static void mark_chunks(struct fwd *f, const struct backend_token *toks, uint32_t n)
{
    for (uint32_t t = 0; t < n; t++) {
        uint32_t first = t, count = 0;
        bool all_logits = true;
        for (uint32_t u = 0; u < n; u++)
            if (toks[u].seq == toks[t].seq) {
                if (!count) first = u;
                count++;
                all_logits &= toks[u].logits;
            }
        f->chunk_of[t] = count > 1 && !all_logits ? first : UINT32_MAX;
        f->stamp[t] = 0;
    }
}

/* cpu_eval: backend_eval has checked the count and the ids. */
static int cpu_eval(void *impl, const struct backend_token *toks, uint32_t n, float *logits)
{
    struct fwd *f = impl;
    const struct model *m = f->m;
    const struct model_hparams *hp = &m->hp;
    const size_t E = hp->n_embd;
    int rv;
    if ((rv = grow(f, toks, n)) != 0) return rv;
    if (f->picker_started && f->o.copy_hooks && f->o.copy_hooks->window_sync) window_sync(f);
    const double t0 = now_s();
    const uint64_t hits0 = f->hits, misses0 = f->misses;
    if (f->tier) mark_chunks(f, toks, n);
    for (uint32_t t = 0; t < n; t++) {
        const uint8_t *row =
            (const uint8_t *)m->token_embd.data + (uint64_t)toks[t].id * m->token_embd.row_bytes;
        if ((rv = quant_dequantize(m->token_embd.type, row, f->x + t * E, E)) != 0) goto fail;
    }
    for (uint32_t il = 0; il < hp->n_layer; il++)
        if ((rv = attention(f, toks, n, il)) || (rv = moe(f, n, il))) goto fail;
    const double t1 = now_s();
    uint32_t n_out = 0;
    for (uint32_t t = 0; t < n; t++)
        if (toks[t].logits)
            cpu_rmsnorm(f->xn + n_out++ * E, f->x + t * E, m->output_norm, E, hp->rms_eps);
    if (n_out && (rv = matmul(f, &m->output, f->xn, E, n_out, logits, hp->n_vocab)) != 0) goto fail;
    const double t2 = now_s();
    f->st.passes++;
    f->st.tokens += n;
    f->st.output_s += t2 - t1;
    f->st.total_s += t2 - t0;
    if (f->cache && !f->first_done) {
        const uint64_t pairs = f->hits - hits0 + f->misses - misses0;
        f->first_hit_rate = pairs ? (double)(f->hits - hits0) / (double)pairs : 0;
        f->first_done = true;
        LOG_INFO("expert cache: first window hit rate %.1f%% (%llu of %llu pairs from slots)",
                 100.0 * f->first_hit_rate, (unsigned long long)(f->hits - hits0),
                 (unsigned long long)pairs);
    }
    if (f->o.copy_hooks && f->o.copy_hooks->window_ms) {
        const uint32_t ms = f->o.copy_hooks->window_ms;
        nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000}, NULL);
    }
    return 0;
fail:
    for (uint32_t t = n; t-- > 0;)
        kv_seq_resize(f->kv, toks[t].seq, f->pos[t]);
    return rv;
}

const struct backend_ops backend_cpu_ops = {
    .name = "cpu",
    .start = cpu_start,
    .eval = cpu_eval,
    .set_route = cpu_set_route,
    .tick = cpu_tick,
    .quiesce = cpu_quiesce,
    .resize = cpu_resize,
    .info = cpu_info,
    .get_stats = cpu_get_stats,
    .reset_stats = cpu_reset_stats,
    .close = cpu_close,
};
