/* The CUDA hybrid: VRAM slots, the device tables, the split MoE step with the CPU twin, start and
 * close. What moves experts into the slots (registration, the start's fill, the tier's rounds on
 * copy_cuda.h's engine) is hybrid_copy_cuda.c's; hybrid_cuda_impl.h what both share. hybrid_cuda.h
 * has the contract; hybrid_plan.h the decisions (tested without a GPU). */
#include "gpu-worker/hybrid_cuda_impl.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/pool.h"
#include "common/quant/quant.h"
#include "gpu-worker/hybrid_plan.h"
#include "kernels/cpu/moe.h"
#include "kernels/cuda/glue.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t hyb_device_bytes(const struct model *m, uint32_t T)
{
    const struct model_hparams *hp = &m->hp;
    const uint64_t P = (uint64_t)T * hp->n_expert_used, LE = (uint64_t)hp->n_layer * hp->n_expert;
    return 3 * LE * sizeof(void *) + 2 * P * hp->n_embd * 4 + 2 * P * 4 +
           P * sizeof(struct moe_group) + (8u << 20); /* 8 MiB: allocation rounding */
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
                               n, hyb_gib(h->slot_bytes * n));
        }
        h->n_chunks++;
    }
    return 0;
}

int hyb_publish(struct hyb *h)
{
    cache_publish(h->cache);
    const int nb = h->cur ^ 1;
    int rv;
    if ((rv = hyb_ck(cudaEventSynchronize(h->tab_ev[nb]), "slot table staging"))) return rv;
    const uint64_t LE = (uint64_t)h->L * h->NE;
    for (uint64_t i = 0; i < LE; i++) {
        const int32_t s = h->cache->pub[i];
        h->h_tab[nb][i] = s != CACHE_NONE ? hyb_slot_ptr(h, (uint32_t)s)
                          : h->host_ok[i] ? h->h_pcie[i]
                                          : NULL;
    }
    if ((rv = hyb_ck(cudaMemcpyAsync(h->d_tab[nb], h->h_tab[nb], LE * sizeof(void *),
                                     cudaMemcpyHostToDevice, h->s),
                     "slot table up")) ||
        (rv = hyb_ck(cudaEventRecord(h->tab_ev[nb], h->s), "slot table event")))
        return rv;
    h->cur = nb;
    return 0;
}

/* ---- open / close -----------------------------------------------------------------------------
 */

static const void *host_part(void *ctx, uint32_t expert, int part);

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
            const double t0 = hyb_now();
            if (cpu_moe_ffn(h->twin, h->pool, &cp, host_part, &tc, &g, 1, h->pidx, h->h_selw, t,
                            (int)h->K, h->h_xn, E, h->h_out, NULL))
                return 0;
            const double dt = hyb_now() - t0;
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
            const double t0 = hyb_now();
            if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, h->s) != cudaSuccess ||
                cudaStreamSynchronize(h->s) != cudaSuccess)
                break;
            const double gbs = (double)bytes / (hyb_now() - t0) / 1e9;
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
    const bool zero = pm && strcmp(pm, "zero") == 0, both = pm && strcmp(pm, "stage") == 0;
    h->stage_prompt = !zero && o->pcie_threshold != 0;
    h->stage = both && (o->pcie_frac > 0 || o->pcie_threshold != 0);
    /* staging memory only where the share can have experts: registered blobs of an arena */
    if (h->pin == HYB_PIN_NONE || !hyb_from_arena(m)) h->stage = h->stage_prompt = false;
    h->n_stage = h->stage || h->stage_prompt ? h->NE : 0;
    const char *pf = getenv("STRATA_PCIE_PREFETCH");
    h->prefetch = h->stage_prompt && !(pf && strcmp(pf, "0") == 0);
    h->pf_layer[0] = h->pf_layer[1] = -1;
    h->rule = (struct hyb_pcie_rule){o->pcie_frac, o->pcie_threshold, h->n_stage};
    const char *t = getenv("STRATA_DECODE_TIMING");
    h->timing = t && atoi(t);
    const char *pw = getenv("STRATA_HYBRID_PIN");
    h->reg_wait = pw && strcmp(pw, "wait") == 0;
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
    int rv;
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
        {(void **)&h->pf_slot[0], h->NE * 4},
        {(void **)&h->pf_slot[1], h->NE * 4},
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
        {(void **)&h->h_stab, 2 * h->NE * sizeof(void *)},
    };
    for (size_t i = 0; i < sizeof pinb / sizeof pinb[0]; i++) {
        if ((rv = hyb_ck(cudaMallocHost(pinb[i].p, pinb[i].bytes ? pinb[i].bytes : 1),
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
        {(void **)&h->d_stab, 2 * h->NE * sizeof(void *)},
        {(void **)&h->d_stage, h->n_stage ? 2 * h->n_stage * slot_bytes : 1},
    };
    for (size_t i = 0; i < sizeof devb / sizeof devb[0]; i++)
        if ((rv = hyb_ck(cudaMalloc(devb[i].p, devb[i].bytes), "cudaMalloc"))) goto fail;
    if ((rv = hyb_ck(cudaEventCreateWithFlags(&h->tab_ev[0], cudaEventDisableTiming), "event")) ||
        (rv = hyb_ck(cudaEventCreateWithFlags(&h->tab_ev[1], cudaEventDisableTiming), "event")))
        goto fail;
    if (h->n_stage &&
        ((rv = hyb_ck(cudaStreamCreateWithFlags(&h->stage_s, cudaStreamNonBlocking),
                      "staging stream")) ||
         (rv = hyb_ck(cudaEventCreateWithFlags(&h->stage_ev[0], cudaEventDisableTiming),
                      "event")) ||
         (rv = hyb_ck(cudaEventCreateWithFlags(&h->stage_ev[1], cudaEventDisableTiming),
                      "event")) ||
         (rv = hyb_ck(cudaEventCreateWithFlags(&h->stage_ev[2], cudaEventDisableTiming), "event"))))
        goto fail;
    for (uint32_t l = 0; h->timing && l < h->L; l++)
        if ((rv = hyb_ck(cudaEventCreate(&h->ev_a[l]), "event")) ||
            (rv = hyb_ck(cudaEventCreate(&h->ev_b[l]), "event")))
            goto fail;
    /* the slots, then the re-check: what the allocations really took may leave less than the
     * reserve (the context, rounding): whole chunks go back */
    if ((rv = pool_to(h, n_slots))) goto fail;
    size_t vfree = 0, vtotal = 0;
    if ((rv = hyb_ck(cudaMemGetInfo(&vfree, &vtotal), "cudaMemGetInfo"))) goto fail;
    const struct hyb_budget bud = {.reserve = reserve,
                                   .slot_bytes = slot_bytes,
                                   .n_total = (uint32_t)LE,
                                   .chunk_slots = HYB_CHUNK_SLOTS};
    const uint32_t keep = hyb_shrink_to(n_slots, vfree, &bud);
    if (keep < n_slots) {
        LOG_WARN("expert cache: %.2f GiB of VRAM free after allocating, below the %.0f MiB "
                 "reserve: %u slots instead of %u",
                 hyb_gib(vfree), (double)reserve / (1 << 20), keep, n_slots);
        n_slots = keep;
        if ((rv = cache_resize(h->cache, n_slots)) || (rv = pool_to(h, n_slots))) goto fail;
    }
    measure_pcie(h); /* before the fill's copies share the bus */
    if ((rv = hyb_copy_start(h, pick_thread)) || (rv = hyb_publish(h)) || (rv = hyb_fill_start(h)))
        goto fail;
    if (h->rule.threshold == BACKEND_PCIE_AUTO) h->rule.threshold = auto_threshold(h);
    LOG_INFO("expert cache: %u VRAM slots of %.2f MiB (%.2f GiB), %u of %u experts resident%s, "
             "the rest on the CPU (%u threads); tier %s; pin %s; pcie share %.2f, threshold %u "
             "(%s)",
             n_slots, (double)slot_bytes / (1 << 20), hyb_gib(slot_bytes * n_slots),
             cache_resident(h->cache), (uint32_t)LE,
             h->fill_started ? " (the fill runs in the background)" : "",
             o->n_threads ? o->n_threads : 1,
             !h->tier        ? "static"
             : o->tier.async ? "adaptive, async"
                             : "adaptive, blocking",
             hyb_pin_name(h->pin), h->rule.frac, h->rule.threshold,
             h->stage          ? "staged"
             : h->prefetch     ? "staged and prefetched in prompt chunks, zero-copy in decode"
             : h->stage_prompt ? "staged in prompt chunks, zero-copy in decode"
                               : "zero-copy");
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
    if (h->stage_s) cudaStreamSynchronize(h->stage_s);
    if (h->pf_copies)
        LOG_INFO("expert cache: %llu experts prefetched into staging slots in prompt chunks, %llu "
                 "of them not routed over PCIe after",
                 (unsigned long long)h->pf_copies, (unsigned long long)h->pf_unused);
    hyb_copy_close(h);
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
    for (int i = 0; i < 3; i++)
        if (h->stage_ev[i]) cudaEventDestroy(h->stage_ev[i]);
    if (h->stage_s) cudaStreamDestroy(h->stage_s);
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
    if ((rv = hyb_ck(
             cudaMemcpyAsync(h->h_xn, io->xn, (size_t)n * E * 4, cudaMemcpyDeviceToHost, h->s),
             "x down")) ||
        (rv = hyb_ck(cudaMemcpyAsync(h->h_selw, io->selw, (size_t)n * h->K * 4,
                                     cudaMemcpyDeviceToHost, h->s),
                     "weights down")))
        return rv;
    return 0;
}

void hyb_pass(struct hyb *h, const uint32_t *chunk_of, uint32_t n)
{
    memcpy(h->chunk_of, chunk_of, n * sizeof *chunk_of);
    for (uint32_t i = 0; i < n; i++)
        h->stamp[i] = 0;
    h->pf_layer[0] = h->pf_layer[1] = -1; /* a prefetch is a pass's: the table moves at ticks */
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

/* stage_begin: buffer b of the staging slots starts over for layer il; its copies (on stage_s)
 * wait for what s has queued, so for the launch that read the buffer last */
static int stage_begin(struct hyb *h, uint32_t il, uint32_t b)
{
    h->pf_layer[b] = (int32_t)il;
    h->pf_used[b] = 0;
    for (uint32_t e = 0; e < h->NE; e++)
        h->pf_slot[b][e] = UINT32_MAX;
    int rv = hyb_ck(cudaEventRecord(h->stage_ev[0], h->s), "staging event");
    return rv ? rv : hyb_ck(cudaStreamWaitEvent(h->stage_s, h->stage_ev[0], 0), "staging wait");
}

/* stage_copy: expert e of layer il (registered memory) into buffer b's next staging slot */
static int stage_copy(struct hyb *h, uint32_t il, uint32_t b, uint32_t e)
{
    const uint32_t j = h->pf_used[b]++;
    uint8_t *dst = h->d_stage + ((uint64_t)b * h->n_stage + j) * h->slot_bytes;
    h->pf_slot[b][e] = j;
    h->h_stab[b * h->NE + e] = dst;
    return hyb_ck(cudaMemcpyAsync(dst, model_expert_blob(h->m, il, e), h->m->layers[il].blob.bytes,
                                  cudaMemcpyHostToDevice, h->stage_s),
                  "staging copy");
}

/* prefetch: every missed registered expert of layer il into buffer il & 1, before its router
 * has picked (the table and the registrations change only at ticks, between passes) */
static int prefetch(struct hyb *h, uint32_t il)
{
    if (il >= h->L || !h->m->layers[il].blob.bytes) return 0;
    const uint32_t b = il & 1;
    const int32_t *slot_of = h->cache->pub + (uint64_t)il * h->NE;
    const uint8_t *ok = h->host_ok + (uint64_t)il * h->NE;
    int rv = stage_begin(h, il, b);
    for (uint32_t e = 0; !rv && e < h->NE; e++)
        if (slot_of[e] == CACHE_NONE && ok[e]) {
            rv = stage_copy(h, il, b, e);
            h->pf_copies++;
        }
    return rv ? rv : hyb_ck(cudaEventRecord(h->stage_ev[1 + b], h->stage_s), "staging event");
}

/* prefetching: whether a pass of n tokens prefetches (a prompt chunk whose experts serve enough
 * pairs that a layer's missed experts are nearly all routed) */
static bool prefetching(const struct hyb *h, bool prompt, uint32_t n)
{
    return h->prefetch && prompt && (uint64_t)n * h->K >= (uint64_t)HYB_PREFETCH_PAIRS * h->NE;
}

/* staged_launch: the PCIe share's experts in buffer il & 1 of the staging slots, prefetched
 * while the last layer ran or copied now on stage_s while the hits' launch runs on s, then the
 * staged experts' own launch once the copies are in; the next layer's prefetch queues behind */
static int staged_launch(struct hyb *h, const struct hyb_io *io, uint32_t il, uint32_t n,
                         bool prompt)
{
    const struct hyb_split *const sp = &h->sp;
    const uint32_t b = il & 1;
    const bool have = h->pf_layer[b] == (int32_t)il;
    int rv;
    if (!have && (rv = stage_begin(h, il, b))) return rv;
    uint32_t late = 0, routed = 0;
    for (int g = 0; g < sp->n_pcie; g++) {
        const uint32_t e = (uint32_t)sp->pcie_groups[g].expert;
        if (g && sp->pcie_groups[g - 1].expert == (int32_t)e) continue;
        routed++;
        if (h->pf_slot[b][e] != UINT32_MAX) continue;
        if ((rv = stage_copy(h, il, b, e))) return rv;
        late++;
    }
    if (have) h->pf_unused += h->pf_used[b] - routed;
    h->pf_layer[b] = -1; /* used up: a later pass copies again */
    if ((!have || late) &&
        (rv = hyb_ck(cudaEventRecord(h->stage_ev[1 + b], h->stage_s), "staging event")))
        return rv;
    if (prefetching(h, prompt, n) && (rv = prefetch(h, il + 1))) return rv;
    const uint64_t at = (uint64_t)b * h->NE;
    if ((rv = hyb_ck(cudaMemcpyAsync(h->d_stab + at, h->h_stab + at, h->NE * sizeof(void *),
                                     cudaMemcpyHostToDevice, h->s),
                     "staging table up")) ||
        (sp->n_hit &&
         (rv = cu_moe_ffn(&h->parts[il], h->d_tab[h->cur] + (uint64_t)il * h->NE, h->d_groups,
                          sp->n_hit, h->d_idx, io->selw, n, (int)h->K, io->xn, io->h, io->ws,
                          h->d_yy, h->s))) ||
        (rv = hyb_ck(cudaStreamWaitEvent(h->s, h->stage_ev[1 + b], 0), "staging wait")))
        return rv;
    return cu_moe_ffn(&h->parts[il], h->d_stab + at, h->d_groups + sp->n_hit, sp->n_pcie,
                      h->d_idx, io->selw, n, (int)h->K, io->xn, io->h, io->ws, h->d_yy, h->s);
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
    /* the PCIe share copied into staging slots (staged_launch, which also queues the next
     * layer's prefetch), else read zero-copy in the hits' launch */
    const bool staged = sp->n_pcie && (prompt ? h->stage_prompt : h->stage);
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
        if ((rv = hyb_ck(cudaMemcpyAsync(h->d_groups, h->h_groups,
                                         (size_t)ngpu * sizeof *h->h_groups, cudaMemcpyHostToDevice,
                                         h->s),
                         "groups up")) ||
            (rv = hyb_ck(cudaMemcpyAsync(h->d_idx, h->h_idx,
                                         (size_t)(sp->hit_pairs + sp->pcie_pairs) * 4,
                                         cudaMemcpyHostToDevice, h->s),
                         "pairs up")))
            return rv;
        if (h->timing) cudaEventRecord(h->ev_a[il], h->s);
        if (!staged) {
            /* one launch: slots for the hits, registered host memory for the PCIe share, both
             * through the published table */
            if ((rv = cu_moe_ffn(&h->parts[il], h->d_tab[h->cur] + (uint64_t)il * h->NE,
                                 h->d_groups, ngpu, h->d_idx, io->selw, n, (int)h->K, io->xn, io->h,
                                 io->ws, h->d_yy, h->s)))
                return rv;
        } else if ((rv = staged_launch(h, io, il, n, prompt))) {
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
    if (!staged && prefetching(h, prompt, n)) {
        /* this layer staged nothing: what was prefetched for it goes unused, the next layer's
         * prefetch queues all the same */
        const uint32_t b = il & 1;
        if (h->pf_layer[b] == (int32_t)il) h->pf_unused += h->pf_used[b];
        h->pf_layer[b] = -1;
        if ((rv = prefetch(h, il + 1))) return rv;
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
        const double t0 = hyb_now();
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
        const double t1 = hyb_now();
        h->cpu_s += t1 - t0;
        if ((rv = hyb_ck(cudaMemcpyAsync(h->d_yy + (size_t)P * E, h->h_pack,
                                         (size_t)sp->miss_pairs * E * 4, cudaMemcpyHostToDevice,
                                         h->s),
                         "miss rows up")) ||
            (rv = hyb_ck(
                 cudaMemcpyAsync(h->d_rows, h->h_rows, (size_t)P * 4, cudaMemcpyHostToDevice, h->s),
                 "rows up")) ||
            (rv = cu_gather_rows(h->d_yy, h->d_rows, P, (int64_t)E, io->y, h->s)))
            return rv;
        src = io->y;
    }
    return cu_moe_combine(src, io->sel, n, (int)h->K, (int64_t)E, io->moe, h->s);
}

int hyb_tick(struct hyb *h)
{
    h->window++;
    const double w0 = h->adapt_wait_s;
    const uint64_t sw0 = h->swaps;
    const int rv = hyb_copy_tick(h);
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

int hyb_resize(struct hyb *h, uint64_t bytes)
{
    int rv;
    if ((rv = hyb_copy_fence(h))) return rv;
    const uint32_t total = h->L * h->NE;
    uint64_t n = bytes / h->slot_bytes;
    if (n > total) n = total;
    if ((uint32_t)n < h->cache->n_slots) {
        /* evict first and publish, then wait for every window queued on the old table */
        if ((rv = cache_resize(h->cache, (uint32_t)n)) || (rv = hyb_publish(h)) ||
            (rv = hyb_ck(cudaStreamSynchronize(h->s), "resize")))
            return rv;
        return pool_to(h, (uint32_t)n);
    }
    if ((rv = pool_to(h, (uint32_t)n))) return rv;
    rv = cache_resize(h->cache, (uint32_t)n);
    LOG_INFO("expert cache: %u VRAM slots (%.2f GiB) after the resize", (uint32_t)n,
             hyb_gib(h->slot_bytes * n));
    return rv ? rv : hyb_publish(h);
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
           2 * (uint64_t)h->n_stage * h->slot_bytes;
}

uint32_t hyb_slots(const struct hyb *h)
{
    return h->cache->n_slots;
}
