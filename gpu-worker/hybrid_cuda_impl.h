/* hybrid_cuda_impl — what the CUDA hybrid's two files share: hybrid_cuda.c (the VRAM slots, the
 * device tables, the split MoE step, start and close) and hybrid_copy_cuda.c (what moves experts
 * into the slots: registration, the start's background fill and the tier's rounds, all posted to
 * copy_cuda.h's engine). struct hyb, and each file's entry points for the other. Not for use
 * outside these two files; hybrid_cuda.h has the contract and the threads.
 */
#ifndef STRATA_HYBRID_CUDA_IMPL_H
#define STRATA_HYBRID_CUDA_IMPL_H

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "common/base/err.h"
#include "common/base/pool.h"
#include "gpu-worker/copy.h"
#include "gpu-worker/hybrid_cuda.h"
#include "gpu-worker/hybrid_plan.h"
#include "kernels/cpu/moe.h"

#define HYB_PREFETCH_PAIRS 4 /* a prompt chunk's pairs an expert, on average, for the prefetch */
#define HYB_FILL_BATCH 64 /* copies the start's fill posts before it waits for them */

/* One move of the tier in flight: its copy's ticket of the copy engine. */
struct flight {
    struct tier_move mv;
    uint64_t ticket;
    int rv; /* the copy's result, once landed */
    bool landed;
};

struct hyb {
    const struct model *m;
    struct backend_opts o;
    const struct cu_moe_parts *parts;
    cudaStream_t s; /* the pass's stream */
    /* the copy engine (copy_cuda.h): its own stream, fenced on window events recorded on s; the
     * start's fill and the tier post to it (the tier only once the fill has ended) */
    struct copy_engine *ce;
    uint32_t L, NE, K, T, P;
    /* slots: chunks of HYB_CHUNK_SLOTS */
    struct cache *cache;
    uint64_t slot_bytes;
    uint8_t **chunks;
    uint32_t n_chunks, cap_chunks;
    /* the device tables: two buffers of L * NE slot pointers, each with its pinned staging */
    const uint8_t **d_tab[2], **h_tab[2];
    cudaEvent_t tab_ev[2];
    int cur;
    /* PCIe (zero-copy): device pointers of registered host blobs (L * NE), and which the split may
     * send to the GPU; the published table holds them for experts not in a slot */
    const uint8_t **h_pcie;
    uint8_t *host_ok;
    struct hyb_pcie_rule rule;
    /* the PCIe share's form (STRATA_PCIE_MODE): staged experts are copied into staging slots (a
     * layer's worth) on stage_s while the hits' launch runs, then launched apart; the others are
     * read through mapped memory in the hits' launch. auto (the default) stages prompt chunks,
     * whose experts serve many tokens (a zero-copy read crosses the bus once per token tile), and
     * reads decode windows' zero-copy; stage stages both; zero stages none. */
    bool stage, stage_prompt; /* decode windows / prompt chunks staged */
    uint32_t n_stage;         /* staging slots a buffer (NE when either is, and the share can be
                                 on); two buffers, a layer's each: layer l uses buffer l & 1 */
    uint8_t *d_stage;         /* (2, n_stage, slot_bytes) */
    cudaStream_t stage_s;     /* the staging copies */
    cudaEvent_t stage_ev[3];  /* [0] the slots free (on s), [1 + b] buffer b's copies done */
    const uint8_t **h_stab, **d_stab; /* (2, NE) each buffer's table of its staged experts */
    /* the prefetch (prompt chunks of at least HYB_PREFETCH_PAIRS pairs an expert on average;
     * STRATA_PCIE_PREFETCH=0 turns it off): while layer l runs, every missed registered expert of
     * layer l + 1 is copied into buffer (l + 1) & 1 before its router has picked, as a whole
     * layer's weights would be; the staged launch of l + 1 then finds its experts there. */
    bool prefetch;
    int32_t pf_layer[2];  /* the layer buffer b holds prefetched, -1: none */
    uint32_t *pf_slot[2]; /* (NE) buffer b's staging slot of expert e, UINT32_MAX: not there */
    uint32_t pf_used[2];  /* slots of buffer b taken */
    uint64_t pf_copies, pf_unused; /* experts prefetched; of them, not routed over PCIe after */
    /* registration */
    enum hyb_pin pin;
    bool ro_flag, can_map;
    struct hyb_pinset pins;
    const void **pin_ptr; /* (L * NE) the registered base of each blob, for unregistering */
    pthread_t reg;
    bool reg_started, reg_stop;
    pthread_mutex_t mu;
    pthread_cond_t cv, fill_cv;
    uint32_t reg_new; /* registrations landed since the last publication of h_pcie */
    bool reg_pending; /* the registration thread is to start at the next tick */
    bool reg_wait;    /* STRATA_HYBRID_PIN=wait: that tick waits for the queue (benchmarks) */
    /* the split and the CPU twin */
    struct moe_group *groups, *hg, *pg, *mg;
    int32_t *pidx, *hi, *ppi, *mi;
    struct moe_group *h_groups; /* pinned: hit groups then pcie groups */
    int32_t *h_idx;             /* pinned: hit pairs then pcie pairs */
    int32_t *h_rows;            /* pinned: the gather's rows */
    float *h_xn, *h_selw;       /* pinned: the CPU twin's inputs */
    float *h_out;               /* (P, E) the CPU twin's rows at pair index */
    float *h_pack;              /* pinned (P, E) the miss rows, packed for the upload */
    struct moe_group *d_groups;
    int32_t *d_idx, *d_rows;
    float *d_yy; /* (2P, E): the GPU's rows at pair index, then the packed miss rows */
    uint32_t *chunk_of, *stamp, *rtok;
    struct hyb_split sp; /* the layer between hyb_moe_start and hyb_moe_finish */
    struct pool *pool;
    struct cpu_moe *twin;
    /* the tier */
    struct tier *tier;
    struct tier_move *moves;
    struct flight *fl;
    uint32_t n_fl, n_fl_posted;
    uint64_t window, posted_at;
    /* the async tier's pick on its own thread (STRATA_ADAPT_PICK_INLINE=0) and its copies posted
     * a batch a tick (STRATA_ADAPT_ASYNC_BATCH=N; 0: the round at once) */
    uint32_t async_batch;
    pthread_t picker;
    bool picker_started, picker_stop;
    pthread_mutex_t pmu;
    pthread_cond_t pcv;
    enum { PICK_IDLE, PICK_ASKED, PICK_READY } pick;
    uint32_t n_picked;
    bool async_wait;
    /* the start's fill, in the background: its own thread posts the hottest experts' copies
     * into the slots it owns (free in the tables until landed); the decode thread lands what is
     * done at each tick. The tier waits for it to end. */
    int dev;
    pthread_t fill_th;
    bool fill_started, fill_stop, fill_done; /* fill_stop, fill_done: under mu */
    uint32_t *forder, fill_total, fill_slots, fill_copies;
    uint32_t *fland; /* (fill_slots * 3) landed (slot, layer, expert), under mu */
    uint32_t n_fland, fill_landed, fill_failed, fill_refused;
    uint64_t fill_bytes;
    double fill_t0, fill_s;
    /* stats */
    uint64_t hits, misses, pcie_pairs, swaps, copies, copy_bytes, failed, verify_failures;
    double copy_s, adapt_wait_s, first_hit_rate;
    double pcie_gbs; /* a 64 MiB pinned copy up, best of 3, at start */
    bool first_done;
    /* STRATA_DECODE_TIMING: per layer, the GPU's hit time (events) and the CPU's miss time */
    bool timing;
    cudaEvent_t *ev_a, *ev_b;
    uint8_t *ev_used;
    double cpu_s, gpu_s, cpu_idle_s, gpu_idle_s;
    uint64_t w_hits, w_misses;
};

static inline double hyb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int hyb_ck(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    return strata_errf(STRATA_ECUDAERR | (int)e, "CUDA: %s: %s", what, cudaGetErrorString(e));
}

static inline double hyb_gib(uint64_t b)
{
    return (double)b / (1u << 30);
}

static inline uint8_t *hyb_slot_ptr(const struct hyb *h, uint32_t s)
{
    return h->chunks[s / HYB_CHUNK_SLOTS] + (uint64_t)(s % HYB_CHUNK_SLOTS) * h->slot_bytes;
}

/* ---- hybrid_cuda.c ---- */

/* hyb_publish: the published residency to the other device table, in stream order; windows
 * queued after it read the new table, those before it the old. Decode thread. */
int hyb_publish(struct hyb *h);

/* ---- hybrid_copy_cuda.c ---- */

/* hyb_copy_start, at hyb_start once the slots are allocated: the copy engine (its stream fenced
 * on window events recorded on h->s), the registration's plan (its thread starts at the first
 * tick) and, with pick_thread, the tier's pick thread. */
int hyb_copy_start(struct hyb *h, bool pick_thread);

/* hyb_fill_start starts the start's fill on its thread (STRATA_HYBRID_FILL=wait: waits for it,
 * the first window then sees every slot filled), after the first publication. */
int hyb_fill_start(struct hyb *h);

/* hyb_copy_tick: the copies' part of a tick, after h->window counted the window just run: that
 * window marked on the copy engine, the registration started, what the fill and the registration
 * landed published, and the tier's round (once the fill has ended). */
int hyb_copy_tick(struct hyb *h);

/* hyb_copy_fence: before the slot pool changes: the fill stops (what it copied lands), the round
 * in flight lands (hyb_quiesce), and every copy posted (poisons too) has completed, so the copy
 * thread reads no slot address from here until the next post. */
int hyb_copy_fence(struct hyb *h);

/* hyb_copy_close, first in hyb_close (also of a start that failed half way): the pick, fill and
 * registration threads stop, the copy engine closes, the registrations are undone (before the
 * caller unmaps the arena). */
void hyb_copy_close(struct hyb *h);

/* hyb_from_arena: whether the experts are an arena's blobs, which registration and the PCIe share
 * need (asked of every layer: DeepSeek-V3's and GLM-4.5's first layers are dense, without blobs) */
static inline bool hyb_from_arena(const struct model *m)
{
    for (uint32_t l = 0; l < m->hp.n_layer; l++)
        if (model_expert_blob(m, l, 0)) return true;
    return false;
}

#endif
