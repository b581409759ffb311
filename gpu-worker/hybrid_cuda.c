/* The CUDA hybrid: VRAM slots, the split MoE step with the CPU twin, the tier on a copy stream.
 * hybrid_cuda.h has the contract; hybrid_plan.h the decisions (tested without a GPU). */
#include "gpu-worker/hybrid_cuda.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/pool.h"
#include "common/quant/quant.h"
#include "gpu-worker/copy_cuda.h"
#include "gpu-worker/hybrid_plan.h"
#include "kernels/cpu/moe.h"
#include "kernels/cuda/glue.h"

#include <cuda_runtime_api.h>
#include <xxhash.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_STAGE    16 /* STRATA_PCIE_MODE=stage: VRAM staging slots, experts over PCIe a layer */
#define FILL_BATCH 64 /* copies the start's fill posts before it waits for them */

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
    /* STRATA_PCIE_MODE=stage: the PCIe share copied into staging slots before its launch instead
     * of read through mapped memory (one switch, for measuring both) */
    bool stage;
    uint8_t *d_stage;                 /* (N_STAGE, slot_bytes) */
    const uint8_t **h_stab, **d_stab; /* (NE) a layer's table of the staged experts */
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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int ck(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    return strata_errf(STRATA_ECUDAERR | (int)e, "CUDA: %s: %s", what, cudaGetErrorString(e));
}

static double gib(uint64_t b)
{
    return (double)b / (1u << 30);
}

uint64_t hyb_device_bytes(const struct model *m, uint32_t T)
{
    const struct model_hparams *hp = &m->hp;
    const uint64_t P = (uint64_t)T * hp->n_expert_used, LE = (uint64_t)hp->n_layer * hp->n_expert;
    return 3 * LE * sizeof(void *) + 2 * P * hp->n_embd * 4 + 2 * P * 4 +
           P * sizeof(struct moe_group) + (8u << 20); /* 8 MiB: allocation rounding */
}

static uint8_t *slot_ptr(const struct hyb *h, uint32_t s)
{
    return h->chunks[s / HYB_CHUNK_SLOTS] + (uint64_t)(s % HYB_CHUNK_SLOTS) * h->slot_bytes;
}

/* pool_to makes the slot pool n slots: whole chunks freed from the tail or added. */
static int pool_to(struct hyb *h, uint32_t n)
{
    const uint32_t want = (n + HYB_CHUNK_SLOTS - 1) / HYB_CHUNK_SLOTS;
    while (h->n_chunks > want)
        cudaFree(h->chunks[--h->n_chunks]);
    if (want > h->cap_chunks) {
        uint8_t **c = realloc(h->chunks, want * sizeof *c);
        if (!c) return strata_errf(STRATA_ENOMEM, "out of memory for the slot table");
        h->chunks = c, h->cap_chunks = want;
    }
    while (h->n_chunks < want) {
        /* every chunk is allocated whole, the last one too: growing later never moves slots */
        const uint64_t b = hyb_chunk_bytes(h->slot_bytes, HYB_CHUNK_SLOTS);
        if (cudaMalloc((void **)&h->chunks[h->n_chunks], b) != cudaSuccess) {
            cudaGetLastError();
            return strata_errf(STRATA_ENOSPC,
                               "CUDA: no VRAM for %u expert slots (%.2f GiB): give a smaller "
                               "--expert-cache",
                               n, gib(h->slot_bytes * n));
        }
        h->n_chunks++;
    }
    return 0;
}

/* publish: the published residency to the other device table, in stream order; windows queued
 * after it read the new table, those before it the old. */
static int publish(struct hyb *h)
{
    cache_publish(h->cache);
    const int nb = h->cur ^ 1;
    int rv;
    if ((rv = ck(cudaEventSynchronize(h->tab_ev[nb]), "slot table staging"))) return rv;
    const uint64_t LE = (uint64_t)h->L * h->NE;
    for (uint64_t i = 0; i < LE; i++) {
        const int32_t s = h->cache->pub[i];
        h->h_tab[nb][i] = s != CACHE_NONE ? slot_ptr(h, (uint32_t)s)
                          : h->host_ok[i] ? h->h_pcie[i]
                                          : NULL;
    }
    if ((rv = ck(cudaMemcpyAsync(h->d_tab[nb], h->h_tab[nb], LE * sizeof(void *),
                                 cudaMemcpyHostToDevice, h->s),
                 "slot table up")) ||
        (rv = ck(cudaEventRecord(h->tab_ev[nb], h->s), "slot table event")))
        return rv;
    h->cur = nb;
    return 0;
}

/* ---- registration ---------------------------------------------------------------------------- */

static void *reg_main(void *arg)
{
    struct hyb *h = arg;
    cudaSetDevice(h->dev);
    pthread_mutex_lock(&h->mu);
    for (;;) {
        uint32_t b;
        while (!h->reg_stop && !hyb_pinset_next(&h->pins, &b))
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->reg_stop) break;
        pthread_mutex_unlock(&h->mu);
        const uint32_t l = b / h->NE, e = b % h->NE;
        const uint8_t *blob = model_expert_blob(h->m, l, e);
        bool ok = false;
        if (blob) {
            unsigned flags = cudaHostRegisterPortable | (h->can_map ? cudaHostRegisterMapped : 0) |
                             (h->ro_flag ? cudaHostRegisterReadOnly : 0);
            ok = cudaHostRegister((void *)blob, h->m->layers[l].blob.bytes, flags) == cudaSuccess;
            if (!ok) cudaGetLastError();
            if (ok && h->can_map) {
                void *d = NULL;
                /* the kernels read parts with 16-byte copies */
                if (cudaHostGetDevicePointer(&d, (void *)blob, 0) == cudaSuccess &&
                    (uintptr_t)d % 16 == 0)
                    h->h_pcie[b] = d;
                else
                    cudaGetLastError();
            }
        }
        pthread_mutex_lock(&h->mu);
        if (ok) h->pin_ptr[b] = blob;
        hyb_pinset_done(&h->pins, b, ok);
        h->reg_new++;
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void want_pin(struct hyb *h, uint32_t l, uint32_t e)
{
    if (h->pin != HYB_PIN_NEED) return;
    pthread_mutex_lock(&h->mu);
    if (hyb_pinset_want(&h->pins, l * h->NE + e)) pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static bool pinned(struct hyb *h, uint32_t l, uint32_t e)
{
    pthread_mutex_lock(&h->mu);
    const bool r = hyb_pinset_has(&h->pins, l * h->NE + e);
    pthread_mutex_unlock(&h->mu);
    return r;
}

/* pcie_news: registrations landed since the last call become usable by the PCIe share (the
 * caller republishes the table, which then holds their device pointers); whether any did */
static bool pcie_news(struct hyb *h)
{
    if (h->rule.frac <= 0 && !h->rule.threshold) return false;
    pthread_mutex_lock(&h->mu);
    const uint32_t n = h->reg_new;
    h->reg_new = 0;
    const uint64_t LE = (uint64_t)h->L * h->NE;
    if (n)
        for (uint64_t i = 0; i < LE; i++)
            h->host_ok[i] = h->h_pcie[i] != NULL && hyb_pinset_has(&h->pins, (uint32_t)i);
    pthread_mutex_unlock(&h->mu);
    return n > 0;
}

/* ---- copies -----------------------------------------------------------------------------------
 */

/* slot_at: the copy engine's view of a slot (on its thread: the pool changes only with no copy in
 * flight, after drain) */
static uint8_t *slot_at(void *ctx, uint32_t s)
{
    return slot_ptr(ctx, s);
}

/* post_copy posts the copy of expert (l, e) into slot, fenced on window after (0: none): from
 * registered memory directly, else through the engine's pinned bounce buffers (queued for
 * registration with --pin need). Returns copy_post's code. */
static int post_copy(struct hyb *h, uint32_t slot, uint32_t l, uint32_t e, uint64_t after,
                     uint64_t *ticket)
{
    struct copy_extent x[COPY_MAX_EXTENTS];
    const uint32_t n = copy_blob_extents(h->m, l, e, x);
    x[0].pinned = model_expert_blob(h->m, l, e) && pinned(h, l, e);
    if (!x[0].pinned) want_pin(h, l, e);
    return copy_post(h->ce, slot, x, n, after, ticket);
}

/* poison: a failed or refused copy's slot, free now, is filled with a pattern (in order with the
 * copies, so before any later copy into it): a window that read it anyway would show in the
 * logits. Best effort: a poison that cannot be posted leaves the slot as the copy left it. */
static void poison(struct hyb *h, uint32_t slot)
{
    const struct copy_extent x = {.bytes = h->slot_bytes, .fill = 0xa5};
    uint64_t ticket;
    copy_post(h->ce, slot, &x, 1, 0, &ticket);
}

/* drain: every copy posted (poisons too) has completed; before the slot pool changes */
static void drain(struct hyb *h)
{
    copy_wait_all(h->ce);
}

/* verify: --cache-verify: the slot's bytes, brought back, hash as the host's blob */
static int verify(struct hyb *h, uint32_t slot, uint32_t l, uint32_t e)
{
    const uint64_t bytes = h->m->layers[l].blob.bytes;
    uint8_t *a = malloc(bytes);
    if (!a) return STRATA_ENOMEM;
    int rv = STRATA_EIO;
    if (cudaMemcpy(a, slot_ptr(h, slot), bytes, cudaMemcpyDeviceToHost) == cudaSuccess) {
        const uint64_t got = XXH3_64bits(a, bytes), want = copy_blob_hash(h->m, l, e);
        rv = got == want ? 0 : STRATA_EFORMAT;
        if (rv)
            LOG_WARN("expert cache: slot %u holds layer %u expert %u with xxHash %016llx, the "
                     "host's is %016llx: it stays on the host tier",
                     slot, l, e, (unsigned long long)got, (unsigned long long)want);
    } else {
        cudaGetLastError();
    }
    free(a);
    return rv;
}

/* land: the copy's expert turns resident in the working table if it is good; a failed copy's
 * slot is poisoned and stays free. */
static void land(struct hyb *h, struct flight *f)
{
    f->landed = true;
    if (!f->rv && h->o.cache_verify) f->rv = verify(h, f->mv.slot, f->mv.layer, f->mv.expert);
    if (hyb_land(h->cache, f->mv.slot, f->mv.layer, f->mv.expert, f->rv == 0)) {
        h->copies++;
        return;
    }
    poison(h, f->mv.slot);
    if (f->rv == STRATA_EFORMAT) {
        h->verify_failures++; /* verify() logged it */
        return;
    }
    h->failed++;
    LOG_WARN("expert cache: the copy of layer %u expert %u into slot %u failed (%s): it stays on "
             "the host tier",
             f->mv.layer, f->mv.expert, f->mv.slot, strata_strerror(f->rv));
}

/* land_all lands the flights posted (waiting for each when wait); returns the count still out */
static uint32_t land_all(struct hyb *h, bool wait)
{
    uint32_t out = 0;
    const double t0 = now_s();
    for (uint32_t i = 0; i < h->n_fl_posted; i++) {
        struct flight *f = &h->fl[i];
        if (f->landed) continue;
        if (wait) {
            f->rv = copy_wait(h->ce, f->ticket);
        } else if (!copy_done(h->ce, f->ticket, &f->rv)) {
            out++;
            continue;
        }
        land(h, f);
        if (!f->rv && f->mv.victim != (int32_t)-2) h->swaps++;
    }
    if (wait) h->adapt_wait_s += now_s() - t0;
    h->copy_s += now_s() - t0;
    if (!out && h->n_fl_posted == h->n_fl) h->n_fl = h->n_fl_posted = 0;
    return out;
}

/* post_round posts the round's next moves (fl[n_fl_posted..), at most `batch` of them, 0: all):
 * their victims leave the table, which is republished, then the copies go, fenced on the window
 * just finished (marked at the tick: the last that may read the victims' slots). A copy the
 * engine refuses lands at once as failed. */
static int post_round(struct hyb *h, uint32_t batch)
{
    int rv;
    const uint32_t from = h->n_fl_posted,
                   end = batch && h->n_fl - from > batch ? from + batch : h->n_fl;
    const bool unfenced = h->o.copy_hooks && h->o.copy_hooks->unfenced;
    if (!unfenced) {
        for (uint32_t i = from; i < end; i++)
            if (h->fl[i].mv.victim >= 0) cache_evict(h->cache, h->fl[i].mv.slot);
        if ((rv = publish(h))) return rv;
    }
    for (uint32_t i = from; i < end; i++) {
        struct flight *f = &h->fl[i];
        f->landed = false;
        f->rv = post_copy(h, f->mv.slot, f->mv.layer, f->mv.expert, h->window, &f->ticket);
        if (f->rv)
            land(h, f);
        else
            h->copy_bytes += h->m->layers[f->mv.layer].blob.bytes;
    }
    h->n_fl_posted = end;
    h->posted_at = h->window;
    if (unfenced) {
        /* the removed fence (a test hook): the copies land while the old table is still read */
        for (uint32_t i = from; i < end; i++)
            if (!h->fl[i].landed) copy_wait(h->ce, h->fl[i].ticket);
        for (uint32_t i = from; i < end; i++)
            if (h->fl[i].mv.victim >= 0) cache_evict(h->cache, h->fl[i].mv.slot);
    }
    return 0;
}

/* fill_copy posts the copies of experts[0..n) (layer * NE + expert, n <= FILL_BATCH) into
 * slots[0..n), fenced on no window (the slots are in no table), waits for them and verifies them
 * when asked: ok[i] says which copies are good. */
static void fill_copy(struct hyb *h, const uint32_t *slots, const uint32_t *experts, uint32_t n,
                      uint8_t *ok)
{
    uint64_t ticket[FILL_BATCH];
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t l = experts[i] / h->NE, e = experts[i] % h->NE;
        ok[i] = post_copy(h, slots[i], l, e, 0, &ticket[i]) == 0;
        if (ok[i]) h->fill_bytes += h->m->layers[l].blob.bytes;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (!ok[i] || copy_wait(h->ce, ticket[i])) {
            ok[i] = 0;
            continue;
        }
        if (h->o.cache_verify && verify(h, slots[i], experts[i] / h->NE, experts[i] % h->NE)) {
            ok[i] = 0;
            h->fill_refused++;
        }
    }
}

/* fill_main: the start's fill, hottest first: slots [0, fill_slots) get the first experts of
 * the order; a slot whose copy fails (or is refused) is poisoned and tries the next expert. */
static void *fill_main(void *arg)
{
    struct hyb *h = arg;
    cudaSetDevice(h->dev);
    uint32_t *free_slots = malloc((h->fill_slots + 1) * sizeof *free_slots);
    uint32_t slots[FILL_BATCH], ex[FILL_BATCH];
    uint8_t ok[FILL_BATCH];
    uint32_t n_free = 0, next = 0;
    for (uint32_t s = h->fill_slots; free_slots && s-- > 0;)
        free_slots[n_free++] = s;
    for (;;) {
        pthread_mutex_lock(&h->mu);
        const bool stop = h->fill_stop;
        pthread_mutex_unlock(&h->mu);
        if (stop || !free_slots || !n_free || next >= h->fill_total) break;
        uint32_t n = 0;
        while (n < FILL_BATCH && n_free && next < h->fill_total) {
            slots[n] = free_slots[--n_free];
            ex[n++] = h->forder[next++];
        }
        fill_copy(h, slots, ex, n, ok);
        uint32_t failed = 0;
        for (uint32_t i = 0; i < n; i++)
            if (!ok[i]) {
                poison(h, slots[i]); /* before the next expert's copy into it */
                free_slots[n_free++] = slots[i];
                failed++;
            }
        pthread_mutex_lock(&h->mu);
        for (uint32_t i = 0; i < n; i++) {
            if (!ok[i]) continue;
            uint32_t *q = h->fland + 3 * h->n_fland++;
            q[0] = slots[i], q[1] = ex[i] / h->NE, q[2] = ex[i] % h->NE;
            h->fill_copies++;
        }
        h->fill_failed += failed;
        pthread_mutex_unlock(&h->mu);
    }
    free(free_slots);
    pthread_mutex_lock(&h->mu);
    h->fill_done = true;
    h->fill_s = now_s() - h->fill_t0;
    pthread_cond_broadcast(&h->fill_cv);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* fill_joined: the fill's thread has ended and is joined: its counts join the cache's, logged */
static void fill_joined(struct hyb *h)
{
    pthread_join(h->fill_th, NULL);
    h->fill_started = false;
    h->copy_bytes += h->fill_bytes;
    h->verify_failures += h->fill_refused;
    h->failed += h->fill_failed - h->fill_refused;
    LOG_INFO("expert cache: the start's fill ended: %u experts in VRAM slots in %.3f s (%.2f "
             "GiB/s) while serving, %u copies failed or refused%s",
             h->fill_copies, h->fill_s, h->fill_s > 0 ? gib(h->fill_bytes) / h->fill_s : 0.0,
             h->fill_failed,
             h->fill_stop ? "; stopped before its end (a resize, a K/V growth or close)" : "");
}

/* fill_land: the decode thread turns what the fill has copied resident in the working table
 * (the caller publishes); joins the fill's thread once it has ended. Returns the count landed. */
static uint32_t fill_land(struct hyb *h)
{
    if (!h->fill_started) return 0;
    pthread_mutex_lock(&h->mu);
    const uint32_t n = h->n_fland;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t *q = h->fland + 3 * i;
        hyb_land(h->cache, q[0], q[1], q[2], true);
    }
    h->n_fland = 0;
    h->fill_landed += n;
    const bool ended = h->fill_done;
    pthread_mutex_unlock(&h->mu);
    if (ended) fill_joined(h);
    return n;
}

/* fill_end: a fence for whatever changes the slot pool: the fill stops, what it copied lands,
 * the rest of its slots stay free (the tier fills them), published. */
static int fill_end(struct hyb *h)
{
    if (!h->fill_started) return 0;
    pthread_mutex_lock(&h->mu);
    h->fill_stop = true;
    while (!h->fill_done)
        pthread_cond_wait(&h->fill_cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    fill_land(h);
    return publish(h);
}

/* fill: starts the start's fill on its thread (STRATA_HYBRID_FILL=wait: waits for it, the
 * first window then sees every slot filled) */
static int fill(struct hyb *h)
{
    const uint32_t total = h->L * h->NE;
    if (!(h->forder = malloc(total * sizeof *h->forder)) ||
        !(h->fland = malloc(((size_t)h->cache->n_slots + 1) * 3 * sizeof *h->fland)))
        return strata_errf(STRATA_ENOMEM, "out of memory for the fill order");
    int rv = cache_fill_order(h->L, h->NE, h->o.heat, h->forder);
    if (rv) return rv;
    h->fill_total = total;
    h->fill_slots = h->cache->n_slots;
    h->fill_t0 = now_s();
    if (!h->fill_slots) return 0;
    int err = pthread_create(&h->fill_th, NULL, fill_main, h);
    if (err) return strata_errf(strata_errno(err), "cannot start the fill thread");
    h->fill_started = true;
    const char *w = getenv("STRATA_HYBRID_FILL");
    if (w && strcmp(w, "wait") == 0) {
        pthread_mutex_lock(&h->mu);
        while (!h->fill_done)
            pthread_cond_wait(&h->fill_cv, &h->mu);
        pthread_mutex_unlock(&h->mu);
        fill_land(h);
        return publish(h);
    }
    return 0;
}

/* ---- open / close -----------------------------------------------------------------------------
 */

static const void *host_part(void *ctx, uint32_t expert, int part);
static void *picker_main(void *arg);
static void pick_settle(struct hyb *h, bool drop);

/* twin_parts: a layer's expert parts as cpu_moe_ffn takes them */
static struct cpu_moe_parts twin_parts(const struct model_layer *Lr)
{
    const struct model_mat *p = Lr->part;
    return (struct cpu_moe_parts){{p[0].type, p[0].n_in, p[0].n_out, p[0].row_bytes},
                                  {p[1].type, p[1].n_in, p[1].n_out, p[1].row_bytes},
                                  {p[2].type, p[2].n_in, p[2].n_out, p[2].row_bytes}};
}

struct twin_ctx {
    const struct model *m;
    uint32_t layer;
};

/* auto_threshold (--pcie-threshold auto): the fewest pairs at which the CPU twin takes longer on
 * one expert (layer 0's expert 0, best of 2) than its blob takes over the bus at the measured
 * rate: from there on, sending the expert over PCIe frees the CPU for the rest. 0 (never) when
 * the CPU is faster at every count up to the pass's tokens (and 64). */
static uint32_t auto_threshold(struct hyb *h)
{
    const struct model_layer *Lr = &h->m->layers[0];
    if (h->pcie_gbs <= 0) return 0;
    const double bus = (double)Lr->blob.bytes / (h->pcie_gbs * 1e9);
    const size_t E = h->m->hp.n_embd;
    const uint32_t top = h->T < 64 ? h->T : 64;
    for (size_t i = 0; i < (size_t)top * E; i++)
        h->h_xn[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    for (uint32_t i = 0; i < top * h->K; i++)
        h->h_selw[i] = 1.0f;
    const struct cpu_moe_parts cp = twin_parts(Lr);
    struct twin_ctx tc = {h->m, 0};
    uint32_t found = 0;
    for (uint32_t t = 1; t <= top && !found; t *= 2) {
        for (uint32_t i = 0; i < t; i++)
            h->pidx[i] = (int32_t)(i * h->K);
        const struct moe_group g = {0, 0, (int32_t)t};
        double best = 1e9;
        for (int rep = 0; rep < 2; rep++) {
            const double t0 = now_s();
            if (cpu_moe_ffn(h->twin, h->pool, &cp, host_part, &tc, &g, 1, h->pidx, h->h_selw, t,
                            (int)h->K, h->h_xn, E, h->h_out, NULL))
                return 0;
            const double dt = now_s() - t0;
            if (dt < best) best = dt;
        }
        if (best > bus) found = t;
    }
    LOG_INFO("expert cache: --pcie-threshold auto: %u (an expert's %.2f MiB cross the bus in %.3f "
             "ms at %.1f GB/s)",
             found, (double)Lr->blob.bytes / (1 << 20), bus * 1e3, h->pcie_gbs);
    return found;
}

/* measure_pcie: the host-to-device rate of a pinned copy (the PCIe share's and the copies' bound),
 * for the bench's roofline; 0 when the buffers cannot be had */
static void measure_pcie(struct hyb *h)
{
    const size_t bytes = 64u << 20;
    void *src = NULL, *dst = NULL;
    /* on the pass's stream, idle before the first window */
    if (cudaStreamSynchronize(h->s) != cudaSuccess || cudaMallocHost(&src, bytes) != cudaSuccess ||
        cudaMalloc(&dst, bytes) != cudaSuccess) {
        cudaGetLastError();
    } else {
        for (int i = 0; i < 3; i++) {
            const double t0 = now_s();
            if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, h->s) != cudaSuccess ||
                cudaStreamSynchronize(h->s) != cudaSuccess)
                break;
            const double gbs = (double)bytes / (now_s() - t0) / 1e9;
            if (gbs > h->pcie_gbs) h->pcie_gbs = gbs;
        }
    }
    cudaFreeHost(src);
    cudaFree(dst);
}

int hyb_start(const struct model *m, const struct backend_opts *o, const struct cu_moe_parts *parts,
              void *stream, uint32_t n_slots, uint64_t slot_bytes, uint64_t reserve,
              struct hyb **out)
{
    const struct model_hparams *hp = &m->hp;
    struct hyb *h = calloc(1, sizeof *h);
    if (!h) return strata_errf(STRATA_ENOMEM, "out of memory for the hybrid");
    h->m = m;
    h->o = *o;
    h->parts = parts;
    h->s = (cudaStream_t)stream;
    h->L = hp->n_layer, h->NE = hp->n_expert, h->K = hp->n_expert_used;
    h->T = o->max_pass_tokens, h->P = h->T * h->K;
    h->slot_bytes = slot_bytes;
    h->pin = (enum hyb_pin)o->pin;
    h->dev = (int)o->gpu;
    const char *pm = getenv("STRATA_PCIE_MODE");
    h->stage = pm && strcmp(pm, "stage") == 0;
    h->rule = (struct hyb_pcie_rule){o->pcie_frac, o->pcie_threshold, h->stage ? N_STAGE : 0};
    const char *t = getenv("STRATA_DECODE_TIMING");
    h->timing = t && atoi(t);
    const char *aw = getenv("STRATA_ADAPT_ASYNC_WAIT");
    h->async_wait = !aw || !*aw || atoi(aw) != 0;
    const char *ab = getenv("STRATA_ADAPT_ASYNC_BATCH"), *pi = getenv("STRATA_ADAPT_PICK_INLINE");
    h->async_batch = ab && *ab ? (uint32_t)atoi(ab) : 0;
    const bool pick_thread = pi && *pi && atoi(pi) == 0; /* on CUDA the pick is inline unless =0 */
    pthread_mutex_init(&h->pmu, NULL);
    pthread_cond_init(&h->pcv, NULL);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    pthread_cond_init(&h->fill_cv, NULL);
    const uint64_t LE = (uint64_t)h->L * h->NE, P = h->P, E = hp->n_embd;
    const uint32_t swaps = o->tier.swaps > 64 ? o->tier.swaps : 64;
    int rv, attr = 0;
    /* the CPU twin's activation rows: the widest expert part's, 64-byte rows */
    size_t act = 0;
    for (uint32_t l = 0; l < h->L; l++)
        for (int p = 0; p < MODEL_PART_COUNT; p++) {
            const struct model_mat *w = &m->layers[l].part[p];
            const size_t b = quant_act_bytes(w->type, w->n_in);
            if (b > act) act = b;
        }
    act = (act + 63) & ~(size_t)63;
    if ((rv = cache_init(h->L, h->NE, n_slots, slot_bytes, &h->cache)) ||
        (rv = hyb_pinset_init((uint32_t)LE, &h->pins)) ||
        (rv = pool_start(o->n_threads ? o->n_threads : 1, &h->pool)) ||
        (rv = cpu_moe_init(h->P, (uint32_t)E, hp->n_ff_exp, act, h->NE, &h->twin)))
        goto fail;
    if (o->tier.every && (rv = tier_init(h->L, h->NE, &o->tier, &h->tier))) goto fail;
    if (h->tier && o->tier.async && pick_thread) {
        int err = pthread_create(&h->picker, NULL, picker_main, h);
        if (err) {
            rv = strata_errf(strata_errno(err), "cannot start the adaptive tier's thread");
            goto fail;
        }
        h->picker_started = true;
    }
    struct {
        void **p;
        size_t bytes;
    } hostb[] = {
        {(void **)&h->groups, P * sizeof(struct moe_group)},
        {(void **)&h->hg, P * sizeof(struct moe_group)},
        {(void **)&h->pg, P * sizeof(struct moe_group)},
        {(void **)&h->mg, P * sizeof(struct moe_group)},
        {(void **)&h->pidx, P * 4},
        {(void **)&h->hi, P * 4},
        {(void **)&h->ppi, P * 4},
        {(void **)&h->mi, P * 4},
        {(void **)&h->h_out, P * E * 4},
        {(void **)&h->chunk_of, h->T * 4},
        {(void **)&h->stamp, h->T * 4},
        {(void **)&h->rtok, h->T * 4},
        {(void **)&h->host_ok, LE},
        {(void **)&h->pin_ptr, LE * sizeof(void *)},
        {(void **)&h->moves, swaps * sizeof(struct tier_move)},
        {(void **)&h->fl, swaps * sizeof(struct flight)},
        {(void **)&h->ev_used, h->L},
        {(void **)&h->ev_a, h->L * sizeof(cudaEvent_t)},
        {(void **)&h->ev_b, h->L * sizeof(cudaEvent_t)},
    };
    for (size_t i = 0; i < sizeof hostb / sizeof hostb[0]; i++)
        if (!(*hostb[i].p = calloc(1, hostb[i].bytes ? hostb[i].bytes : 1))) {
            rv = strata_errf(STRATA_ENOMEM, "out of memory for the hybrid's host buffers");
            goto fail;
        }
    for (uint32_t i = 0; i < h->T; i++)
        h->chunk_of[i] = UINT32_MAX;
    struct {
        void **p;
        size_t bytes;
    } pinb[] = {
        {(void **)&h->h_tab[0], LE * sizeof(void *)},
        {(void **)&h->h_tab[1], LE * sizeof(void *)},
        {(void **)&h->h_pcie, LE * sizeof(void *)},
        {(void **)&h->h_groups, 2 * P * sizeof(struct moe_group)},
        {(void **)&h->h_idx, 2 * P * 4},
        {(void **)&h->h_rows, P * 4},
        {(void **)&h->h_xn, (size_t)h->T * E * 4},
        {(void **)&h->h_selw, P * 4},
        {(void **)&h->h_pack, P * E * 4},
        {(void **)&h->h_stab, h->NE * sizeof(void *)},
    };
    for (size_t i = 0; i < sizeof pinb / sizeof pinb[0]; i++) {
        if ((rv = ck(cudaMallocHost(pinb[i].p, pinb[i].bytes ? pinb[i].bytes : 1),
                     "cudaMallocHost")))
            goto fail;
        memset(*pinb[i].p, 0, pinb[i].bytes);
    }
    struct {
        void **p;
        size_t bytes;
    } devb[] = {
        {(void **)&h->d_tab[0], LE * sizeof(void *)},
        {(void **)&h->d_tab[1], LE * sizeof(void *)},
        {(void **)&h->d_groups, 2 * P * sizeof(struct moe_group)},
        {(void **)&h->d_idx, 2 * P * 4},
        {(void **)&h->d_rows, P * 4},
        {(void **)&h->d_yy, 2 * P * E * 4},
        {(void **)&h->d_stab, h->NE * sizeof(void *)},
        {(void **)&h->d_stage, h->stage ? N_STAGE * slot_bytes : 1},
    };
    for (size_t i = 0; i < sizeof devb / sizeof devb[0]; i++)
        if ((rv = ck(cudaMalloc(devb[i].p, devb[i].bytes), "cudaMalloc"))) goto fail;
    if ((rv = ck(cudaEventCreateWithFlags(&h->tab_ev[0], cudaEventDisableTiming), "event")) ||
        (rv = ck(cudaEventCreateWithFlags(&h->tab_ev[1], cudaEventDisableTiming), "event")))
        goto fail;
    for (uint32_t l = 0; h->timing && l < h->L; l++)
        if ((rv = ck(cudaEventCreate(&h->ev_a[l]), "event")) ||
            (rv = ck(cudaEventCreate(&h->ev_b[l]), "event")))
            goto fail;
    /* registration: read-only where the device takes it (the arena is mapped read-only) */
    cudaDeviceGetAttribute(&attr, cudaDevAttrHostRegisterReadOnlySupported, h->dev);
    h->ro_flag = attr != 0;
    h->can_map = true; /* mapped registrations: the PCIe share reads them through the slot table */
    if (h->pin != HYB_PIN_NONE && model_expert_blob(m, 0, 0)) {
        if (h->pin == HYB_PIN_WHOLE)
            for (uint32_t i = 0; i < LE; i++)
                hyb_pinset_want(&h->pins, i);
        /* the thread starts after the first window (reg_begin): cudaHostRegister holds the
         * driver while it pins, which would stall the start's allocations and first pass */
        h->reg_pending = true;
    }
    /* the slots, then the re-check: what the allocations really took may leave less than the
     * reserve (the context, rounding): whole chunks go back */
    if ((rv = pool_to(h, n_slots))) goto fail;
    size_t vfree = 0, vtotal = 0;
    if ((rv = ck(cudaMemGetInfo(&vfree, &vtotal), "cudaMemGetInfo"))) goto fail;
    const struct hyb_budget bud = {.reserve = reserve,
                                   .slot_bytes = slot_bytes,
                                   .n_total = (uint32_t)LE,
                                   .chunk_slots = HYB_CHUNK_SLOTS};
    const uint32_t keep = hyb_shrink_to(n_slots, vfree, &bud);
    if (keep < n_slots) {
        LOG_WARN("expert cache: %.2f GiB of VRAM free after allocating, below the %.0f MiB "
                 "reserve: %u slots instead of %u",
                 gib(vfree), (double)reserve / (1 << 20), keep, n_slots);
        n_slots = keep;
        if ((rv = cache_resize(h->cache, n_slots)) || (rv = pool_to(h, n_slots))) goto fail;
    }
    measure_pcie(h); /* before the fill's copies share the bus */
    const struct copy_cuda_opts co = {.device = h->dev,
                                      .stream = h->s,
                                      .n_slots = (uint32_t)LE,
                                      .slot_bytes = slot_bytes,
                                      .slot_at = slot_at,
                                      .slot_ctx = h};
    if ((rv = copy_cuda_start(&co, o->copy_hooks, &h->ce))) goto fail;
    if ((rv = publish(h)) || (rv = fill(h))) goto fail;
    if (h->rule.threshold == BACKEND_PCIE_AUTO) h->rule.threshold = auto_threshold(h);
    LOG_INFO("expert cache: %u VRAM slots of %.2f MiB (%.2f GiB), %u of %u experts resident%s, "
             "the rest on the CPU (%u threads); tier %s; pin %s; pcie share %.2f, threshold %u "
             "(%s)",
             n_slots, (double)slot_bytes / (1 << 20), gib(slot_bytes * n_slots),
             cache_resident(h->cache), (uint32_t)LE,
             h->fill_started ? " (the fill runs in the background)" : "",
             o->n_threads ? o->n_threads : 1,
             !h->tier        ? "static"
             : o->tier.async ? "adaptive, async"
                             : "adaptive, blocking",
             hyb_pin_name(h->pin), h->rule.frac, h->rule.threshold,
             h->stage ? "staging slots" : "zero-copy");
    *out = h;
    return 0;
fail:
    hyb_close(h);
    return rv;
}

void hyb_close(struct hyb *h)
{
    if (!h) return;
    if (h->s) cudaStreamSynchronize(h->s);
    if (h->picker_started) {
        pick_settle(h, true);
        pthread_mutex_lock(&h->pmu);
        h->picker_stop = true;
        pthread_cond_broadcast(&h->pcv);
        pthread_mutex_unlock(&h->pmu);
        pthread_join(h->picker, NULL);
        h->picker_started = false;
    }
    if (h->fill_started) {
        pthread_mutex_lock(&h->mu);
        h->fill_stop = true;
        while (!h->fill_done)
            pthread_cond_wait(&h->fill_cv, &h->mu);
        pthread_mutex_unlock(&h->mu);
        fill_joined(h);
    }
    if (h->reg_started) {
        pthread_mutex_lock(&h->mu);
        h->reg_stop = true;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->reg, NULL);
    }
    copy_close(h->ce); /* its copies read registered memory and write the slots */
    if (h->reg_started || h->pcie_pairs)
        LOG_INFO("expert cache: %u blobs registered, %u refused (copied through bounce buffers); "
                 "%llu of %llu missed pairs computed over PCIe",
                 h->pins.registered, h->pins.failed, (unsigned long long)h->pcie_pairs,
                 (unsigned long long)h->misses);
    /* unregistered before the arena is unmapped (the caller closes the arena after us) */
    if (h->pin_ptr)
        for (uint64_t i = 0; i < (uint64_t)h->L * h->NE; i++)
            if (h->pin_ptr[i]) cudaHostUnregister((void *)h->pin_ptr[i]);
    pool_to(h, 0);
    free(h->chunks);
    void *dev[] = {h->d_tab[0], h->d_tab[1], h->d_groups, h->d_idx,
                   h->d_rows,   h->d_yy,     h->d_stab,   h->d_stage};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        cudaFree(dev[i]);
    void *pin[] = {h->h_tab[0], h->h_tab[1], h->h_pcie, h->h_groups, h->h_idx,
                   h->h_rows,   h->h_xn,     h->h_selw, h->h_pack,   h->h_stab};
    for (size_t i = 0; i < sizeof pin / sizeof pin[0]; i++)
        cudaFreeHost(pin[i]);
    for (uint32_t l = 0; h->ev_a && l < h->L; l++) {
        if (h->ev_a[l]) cudaEventDestroy(h->ev_a[l]);
        if (h->ev_b[l]) cudaEventDestroy(h->ev_b[l]);
    }
    for (int i = 0; i < 2; i++)
        if (h->tab_ev[i]) cudaEventDestroy(h->tab_ev[i]);
    free(h->forder);
    free(h->fland);
    void *hostb[] = {h->groups, h->hg,    h->pg,       h->mg,    h->pidx, h->hi,      h->ppi,
                     h->mi,     h->h_out, h->chunk_of, h->stamp, h->rtok, h->host_ok, h->pin_ptr,
                     h->moves,  h->fl,    h->ev_used,  h->ev_a,  h->ev_b};
    for (size_t i = 0; i < sizeof hostb / sizeof hostb[0]; i++)
        free(hostb[i]);
    cpu_moe_fini(h->twin);
    pool_close(h->pool);
    tier_fini(h->tier);
    cache_fini(h->cache);
    hyb_pinset_fini(&h->pins);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    pthread_cond_destroy(&h->fill_cv);
    pthread_mutex_destroy(&h->pmu);
    pthread_cond_destroy(&h->pcv);
    free(h);
}

/* ---- a layer ----------------------------------------------------------------------------------
 */

int hyb_stage(struct hyb *h, const struct hyb_io *io, uint32_t n)
{
    const size_t E = h->m->hp.n_embd;
    int rv;
    if ((rv = ck(cudaMemcpyAsync(h->h_xn, io->xn, (size_t)n * E * 4, cudaMemcpyDeviceToHost, h->s),
                 "x down")) ||
        (rv = ck(cudaMemcpyAsync(h->h_selw, io->selw, (size_t)n * h->K * 4, cudaMemcpyDeviceToHost,
                                 h->s),
                 "weights down")))
        return rv;
    return 0;
}

void hyb_pass(struct hyb *h, const uint32_t *chunk_of, uint32_t n)
{
    memcpy(h->chunk_of, chunk_of, n * sizeof *chunk_of);
    for (uint32_t i = 0; i < n; i++)
        h->stamp[i] = 0;
}

static const void *host_part(void *ctx, uint32_t expert, int part)
{
    const struct twin_ctx *c = ctx;
    return model_expert_part(c->m, c->layer, expert, (enum model_part)part);
}

/* count: hits and misses, the tier's counts (a decode token counts each pair, a prompt chunk each
 * expert once), the route hook, over the full grouping */
static void count(struct hyb *h, uint32_t il, int ng, const int32_t *slot_of,
                  backend_route_fn route, void *route_ctx)
{
    for (int g = 0; g < ng; g++) {
        const struct moe_group *gr = &h->groups[g];
        const uint32_t e = (uint32_t)gr->expert;
        const bool hit = slot_of[e] != CACHE_NONE;
        *(hit ? &h->hits : &h->misses) += (uint64_t)gr->count;
        *(hit ? &h->w_hits : &h->w_misses) += (uint64_t)gr->count;
        if (route) {
            for (int32_t i = 0; i < gr->count; i++)
                h->rtok[i] = (uint32_t)h->pidx[gr->first + i] / h->K;
            route(route_ctx, il, e, h->rtok, (uint32_t)gr->count);
        }
        if (!h->tier) continue;
        const uint32_t mark = il * h->NE + e + 1;
        float c = 0;
        for (int32_t i = 0; i < gr->count; i++) {
            const uint32_t t = (uint32_t)h->pidx[gr->first + i] / h->K, ch = h->chunk_of[t];
            if (ch == UINT32_MAX) {
                c += 1;
            } else if (h->stamp[ch] != mark) {
                h->stamp[ch] = mark;
                c += 1;
            }
        }
        tier_count(h->tier, il, e, c);
    }
}

int hyb_moe_start(struct hyb *h, const struct hyb_io *io, uint32_t il, uint32_t n,
                  const int32_t *h_sel, backend_route_fn route, void *route_ctx,
                  struct backend_stats *st)
{
    const struct model_layer *Lr = &h->m->layers[il];
    const int32_t *slot_of = h->cache->pub + (uint64_t)il * h->NE;
    bool prompt = false;
    for (uint32_t t = 0; t < n && !prompt; t++)
        prompt = h->chunk_of[t] != UINT32_MAX;
    struct hyb_split *const sp = &h->sp;
    *sp = (struct hyb_split){.hit_groups = h->hg,
                             .pcie_groups = h->pg,
                             .miss_groups = h->mg,
                             .hit_idx = h->hi,
                             .pcie_idx = h->ppi,
                             .miss_idx = h->mi};
    const int ng =
        hyb_split_layer(h_sel, n, (int)h->K, h->NE, slot_of, h->host_ok + (uint64_t)il * h->NE,
                        &h->rule, prompt, CU_MOE_MAX_PAIRS, h->groups, h->pidx, sp);
    count(h, il, ng, slot_of, route, route_ctx);
    h->pcie_pairs += sp->pcie_pairs;
    int rv;
    /* the GPU side first, so it runs while the CPU computes the misses */
    const int ngpu = sp->n_hit + sp->n_pcie;
    if (ngpu) {
        memcpy(h->h_groups, sp->hit_groups, (size_t)sp->n_hit * sizeof *h->h_groups);
        memcpy(h->h_idx, sp->hit_idx, (size_t)sp->hit_pairs * 4);
        for (int g = 0; g < sp->n_pcie; g++) {
            struct moe_group G = sp->pcie_groups[g];
            G.first += (int32_t)sp->hit_pairs;
            h->h_groups[sp->n_hit + g] = G;
        }
        memcpy(h->h_idx + sp->hit_pairs, sp->pcie_idx, (size_t)sp->pcie_pairs * 4);
        if ((rv = ck(cudaMemcpyAsync(h->d_groups, h->h_groups, (size_t)ngpu * sizeof *h->h_groups,
                                     cudaMemcpyHostToDevice, h->s),
                     "groups up")) ||
            (rv = ck(cudaMemcpyAsync(h->d_idx, h->h_idx,
                                     (size_t)(sp->hit_pairs + sp->pcie_pairs) * 4,
                                     cudaMemcpyHostToDevice, h->s),
                     "pairs up")))
            return rv;
        if (h->timing) cudaEventRecord(h->ev_a[il], h->s);
        if (!h->stage || !sp->n_pcie) {
            /* one launch: slots for the hits, registered host memory for the PCIe share, both
             * through the published table */
            if ((rv = cu_moe_ffn(&h->parts[il], h->d_tab[h->cur] + (uint64_t)il * h->NE,
                                 h->d_groups, ngpu, h->d_idx, io->selw, n, (int)h->K, io->xn, io->h,
                                 io->ws, h->d_yy, h->s)))
                return rv;
        } else {
            /* staging: each PCIe expert's blob copied into a staging slot (registered memory,
             * in stream order after the last layer's launch read the slots), then its own launch */
            uint32_t j = 0;
            for (int g = 0; g < sp->n_pcie; g++) {
                const int32_t e = sp->pcie_groups[g].expert;
                if (g && sp->pcie_groups[g - 1].expert == e) continue;
                uint8_t *dst = h->d_stage + (uint64_t)j++ * h->slot_bytes;
                h->h_stab[e] = dst;
                if ((rv = ck(cudaMemcpyAsync(dst, model_expert_blob(h->m, il, (uint32_t)e),
                                             Lr->blob.bytes, cudaMemcpyHostToDevice, h->s),
                             "staging copy")))
                    return rv;
            }
            if ((rv = ck(cudaMemcpyAsync(h->d_stab, h->h_stab, h->NE * sizeof(void *),
                                         cudaMemcpyHostToDevice, h->s),
                         "staging table up")) ||
                (sp->n_hit &&
                 (rv = cu_moe_ffn(&h->parts[il], h->d_tab[h->cur] + (uint64_t)il * h->NE,
                                  h->d_groups, sp->n_hit, h->d_idx, io->selw, n, (int)h->K, io->xn,
                                  io->h, io->ws, h->d_yy, h->s))) ||
                (rv = cu_moe_ffn(&h->parts[il], h->d_stab, h->d_groups + sp->n_hit, sp->n_pcie,
                                 h->d_idx, io->selw, n, (int)h->K, io->xn, io->h, io->ws, h->d_yy,
                                 h->s)))
                return rv;
        }
        if (h->timing) {
            cudaEventRecord(h->ev_b[il], h->s);
            h->ev_used[il] = 1;
        }
        for (int p = 0; p < MODEL_PART_COUNT; p++)
            st->weight_bytes +=
                (uint64_t)(sp->n_hit + sp->n_pcie) * Lr->part[p].n_out * Lr->part[p].row_bytes;
        for (int g = 0; g < sp->n_pcie; g++)
            if (!g || sp->pcie_groups[g - 1].expert != sp->pcie_groups[g].expert)
                st->pcie_bytes += Lr->blob.bytes;
    }
    return 0;
}

int hyb_moe_finish(struct hyb *h, const struct hyb_io *io, uint32_t il, uint32_t n,
                   struct backend_stats *st)
{
    const struct model_layer *Lr = &h->m->layers[il];
    const size_t E = h->m->hp.n_embd;
    const uint32_t P = n * h->K;
    const struct hyb_split *const sp = &h->sp;
    int rv;
    /* the CPU side: the misses from the host bytes, on the worker's pool, while the GPU runs */
    const float *src = h->d_yy;
    if (sp->n_miss) {
        const double t0 = now_s();
        const struct cpu_moe_parts cp = twin_parts(Lr);
        struct twin_ctx tc = {h->m, il};
        uint64_t bytes = 0;
        if ((rv = cpu_moe_ffn(h->twin, h->pool, &cp, host_part, &tc, sp->miss_groups, sp->n_miss,
                              sp->miss_idx, h->h_selw, n, (int)h->K, h->h_xn, E, h->h_out, &bytes)))
            return rv;
        st->weight_bytes += bytes;
        st->host_bytes += bytes;
        for (uint32_t i = 0; i < sp->miss_pairs; i++)
            memcpy(h->h_pack + (size_t)i * E, h->h_out + (size_t)sp->miss_idx[i] * E, E * 4);
        hyb_gather_index(sp, P, h->h_rows);
        const double t1 = now_s();
        h->cpu_s += t1 - t0;
        if ((rv = ck(cudaMemcpyAsync(h->d_yy + (size_t)P * E, h->h_pack,
                                     (size_t)sp->miss_pairs * E * 4, cudaMemcpyHostToDevice, h->s),
                     "miss rows up")) ||
            (rv = ck(
                 cudaMemcpyAsync(h->d_rows, h->h_rows, (size_t)P * 4, cudaMemcpyHostToDevice, h->s),
                 "rows up")) ||
            (rv = cu_gather_rows(h->d_yy, h->d_rows, P, (int64_t)E, io->y, h->s)))
            return rv;
        src = io->y;
    }
    return cu_moe_combine(src, io->sel, n, (int)h->K, (int64_t)E, io->moe, h->s);
}

/* ---- between windows --------------------------------------------------------------------------
 */

static int round_blocking(struct hyb *h)
{
    const uint32_t n = tier_round(h->tier, h->cache, h->moves, h->o.tier.swaps);
    if (h->o.on_round) h->o.on_round(h->o.round_ctx, tier_snapshot(h->tier));
    if (!n) return 0;
    h->n_fl = n;
    h->n_fl_posted = 0;
    for (uint32_t i = 0; i < n; i++)
        h->fl[i].mv = h->moves[i];
    int rv = post_round(h, 0);
    land_all(h, true);
    return rv ? rv : publish(h);
}

/* the picker thread (STRATA_ADAPT_PICK_INLINE=0): tier_pick reads only the working table, which
 * the decode thread leaves alone while a pick is asked (nothing of the tier is in flight then,
 * and the fill has ended), and the counts' snapshot; windows go on counting meanwhile */
static void *picker_main(void *arg)
{
    struct hyb *h = arg;
    pthread_mutex_lock(&h->pmu);
    for (;;) {
        while (h->pick != PICK_ASKED && !h->picker_stop)
            pthread_cond_wait(&h->pcv, &h->pmu);
        if (h->picker_stop) break;
        pthread_mutex_unlock(&h->pmu);
        const uint32_t n = tier_pick(h->tier, h->cache, h->moves, h->o.tier.swaps);
        pthread_mutex_lock(&h->pmu);
        h->n_picked = n;
        h->pick = PICK_READY;
        pthread_cond_broadcast(&h->pcv);
    }
    pthread_mutex_unlock(&h->pmu);
    return NULL;
}

/* pick_settle waits until no pick is running; drop: a ready pick is thrown away (a fence) */
static void pick_settle(struct hyb *h, bool drop)
{
    if (!h->picker_started) return;
    pthread_mutex_lock(&h->pmu);
    while (h->pick == PICK_ASKED)
        pthread_cond_wait(&h->pcv, &h->pmu);
    if (drop) h->pick = PICK_IDLE;
    pthread_mutex_unlock(&h->pmu);
}

/* take: the round's moves become the flights to post */
static void take(struct hyb *h, uint32_t n)
{
    h->n_fl = n;
    h->n_fl_posted = 0;
    for (uint32_t i = 0; i < n; i++)
        h->fl[i].mv = h->moves[i];
}

static int async_tick(struct hyb *h)
{
    int rv = 0;
    if (h->n_fl_posted) {
        const bool wait = h->async_wait && h->window > h->posted_at;
        land_all(h, wait);
        /* what landed turns resident now; the rest at a later tick */
        if ((rv = publish(h))) return rv;
        /* the round goes on: its next batch (STRATA_ADAPT_ASYNC_BATCH), or its copies landing */
        if (h->n_fl) return h->n_fl_posted < h->n_fl ? post_round(h, h->async_batch) : 0;
    }
    if (h->picker_started) {
        /* with ASYNC_WAIT the tick after a pick was asked waits for it: the window a round is
         * posted in does not depend on the picker's timing */
        if (h->async_wait) {
            const double t0 = now_s();
            pick_settle(h, false);
            h->adapt_wait_s += now_s() - t0;
        }
        pthread_mutex_lock(&h->pmu);
        if (h->pick == PICK_READY) {
            take(h, h->n_picked);
            h->pick = PICK_IDLE;
        }
        const bool idle = h->pick == PICK_IDLE;
        pthread_mutex_unlock(&h->pmu);
        if (h->n_fl) return post_round(h, h->async_batch);
        if (idle && tier_window(h->tier)) {
            tier_decay(h->tier);
            if (h->o.on_round) h->o.on_round(h->o.round_ctx, tier_snapshot(h->tier));
            pthread_mutex_lock(&h->pmu);
            h->pick = PICK_ASKED;
            pthread_cond_broadcast(&h->pcv);
            pthread_mutex_unlock(&h->pmu);
        }
        return 0;
    }
    if (tier_window(h->tier)) {
        tier_decay(h->tier);
        if (h->o.on_round) h->o.on_round(h->o.round_ctx, tier_snapshot(h->tier));
        take(h, tier_pick(h->tier, h->cache, h->moves, h->o.tier.swaps));
        if (h->n_fl) rv = post_round(h, h->async_batch);
    }
    return rv;
}

/* reg_begin starts the registration thread (after the first window, so that the first token
 * never waits for the pinning); a thread that cannot start leaves every copy on bounce buffers */
static void reg_begin(struct hyb *h)
{
    h->reg_pending = false;
    int err = pthread_create(&h->reg, NULL, reg_main, h);
    if (err) {
        LOG_WARN("expert cache: cannot start the registration thread (%s): every copy goes "
                 "through pinned bounce buffers",
                 strerror(err));
        return;
    }
    h->reg_started = true;
}

int hyb_tick(struct hyb *h)
{
    h->window++;
    /* the window just run is the last that may read what this tick takes out of the table */
    int rv = copy_window_done(h->ce, h->window);
    if (rv) return rv;
    if (h->reg_pending) reg_begin(h);
    const bool landed = fill_land(h) > 0;
    rv = pcie_news(h) || landed ? publish(h) : 0;
    const double w0 = h->adapt_wait_s;
    const uint64_t sw0 = h->swaps;
    /* the tier starts once the start's fill has ended (its slots are the fill's until then) */
    if (!rv && h->tier && !h->fill_started)
        rv = h->o.tier.async ? async_tick(h) : tier_window(h->tier) ? round_blocking(h) : 0;
    if (!h->first_done && h->w_hits + h->w_misses) {
        h->first_hit_rate = (double)h->w_hits / (double)(h->w_hits + h->w_misses);
        h->first_done = true;
        LOG_INFO("expert cache: first window hit rate %.1f%% (%llu of %llu pairs from VRAM slots)",
                 100.0 * h->first_hit_rate, (unsigned long long)h->w_hits,
                 (unsigned long long)(h->w_hits + h->w_misses));
    }
    if (h->timing) {
        double gpu = 0;
        for (uint32_t l = 0; l < h->L; l++) {
            if (!h->ev_used[l]) continue;
            float ms = 0;
            if (cudaEventElapsedTime(&ms, h->ev_a[l], h->ev_b[l]) == cudaSuccess) gpu += ms * 1e-3;
            h->ev_used[l] = 0;
        }
        LOG_INFO("window %llu: hybrid: %llu hits (GPU %.3f ms), %llu misses (CPU %.3f ms), "
                 "%llu over PCIe; idle GPU %.3f ms, CPU %.3f ms; adapt wait %.3f ms, %llu "
                 "swaps/window",
                 (unsigned long long)h->window, (unsigned long long)h->w_hits, 1e3 * gpu,
                 (unsigned long long)h->w_misses, 1e3 * h->cpu_s, (unsigned long long)h->pcie_pairs,
                 1e3 * (h->cpu_s > gpu ? h->cpu_s - gpu : 0),
                 1e3 * (gpu > h->cpu_s ? gpu - h->cpu_s : 0), 1e3 * (h->adapt_wait_s - w0),
                 (unsigned long long)(h->swaps - sw0));
        h->cpu_s = 0;
    }
    h->w_hits = h->w_misses = 0;
    return rv;
}

int hyb_quiesce(struct hyb *h)
{
    pick_settle(h, true); /* a pick in progress ends; its moves are dropped */
    /* what the fill has copied lands; the fill itself goes on (a request does not wait for it) */
    if (fill_land(h) && !h->n_fl_posted) return publish(h);
    if (h->n_fl_posted) {
        land_all(h, true);
        h->n_fl = h->n_fl_posted = 0;
        return publish(h);
    }
    h->n_fl = 0;
    return 0;
}

int hyb_resize(struct hyb *h, uint64_t bytes)
{
    int rv;
    if ((rv = fill_end(h)) || (rv = hyb_quiesce(h))) return rv;
    drain(h); /* poisons too: the copy thread leaves the pool alone from here */
    const uint32_t total = h->L * h->NE;
    uint64_t n = bytes / h->slot_bytes;
    if (n > total) n = total;
    if ((uint32_t)n < h->cache->n_slots) {
        /* evict first and publish, then wait for every window queued on the old table */
        if ((rv = cache_resize(h->cache, (uint32_t)n)) || (rv = publish(h)) ||
            (rv = ck(cudaStreamSynchronize(h->s), "resize")))
            return rv;
        return pool_to(h, (uint32_t)n);
    }
    if ((rv = pool_to(h, (uint32_t)n))) return rv;
    rv = cache_resize(h->cache, (uint32_t)n);
    LOG_INFO("expert cache: %u VRAM slots (%.2f GiB) after the resize", (uint32_t)n,
             gib(h->slot_bytes * n));
    return rv ? rv : publish(h);
}

void hyb_info(const struct hyb *h, struct backend_info *out)
{
    out->cache_slots = h->cache->n_slots;
    out->slot_bytes = h->slot_bytes;
    out->resident = cache_resident(h->cache);
    out->hits = h->hits;
    out->misses = h->misses;
    out->first_hit_rate = h->first_hit_rate;
    out->swaps = h->swaps;
    out->copy_bytes = h->copy_bytes;
    out->copy_gibs = h->copy_s > 0 ? (double)h->copy_bytes / h->copy_s / (1 << 30) : 0;
    out->adapt_wait_s = h->adapt_wait_s;
    out->verify_failures = h->verify_failures;
    out->pcie_pairs = h->pcie_pairs;
    out->pcie_gbs = h->pcie_gbs;
    pthread_mutex_lock((pthread_mutex_t *)&h->mu);
    out->fill_left = h->fill_started ? h->fill_slots - h->fill_copies : 0;
    pthread_mutex_unlock((pthread_mutex_t *)&h->mu);
}

uint64_t hyb_vram_bytes(const struct hyb *h)
{
    return (uint64_t)h->n_chunks * hyb_chunk_bytes(h->slot_bytes, HYB_CHUNK_SLOTS) +
           (h->stage ? N_STAGE * h->slot_bytes : 0);
}

uint32_t hyb_slots(const struct hyb *h)
{
    return h->cache->n_slots;
}
