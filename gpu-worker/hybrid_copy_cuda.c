/* What moves experts into the CUDA hybrid's VRAM slots: registration, the copies (posted to
 * copy_cuda.h's engine, landed into the working table), the start's background fill and the
 * tier's rounds with the pick's thread. hybrid_cuda.h has the contract, hybrid_cuda_impl.h what
 * this file and hybrid_cuda.c share. */
#include "gpu-worker/hybrid_cuda_impl.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "gpu-worker/copy_cuda.h"

#include <xxhash.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
 * flight, after hyb_copy_fence) */
static uint8_t *slot_at(void *ctx, uint32_t s)
{
    return hyb_slot_ptr(ctx, s);
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

/* poison: a failed or refused copy's slot, free now, is filled with a pattern, fenced on window
 * after like a copy (0: the fill's slots, in no table) and in order with the copies, so before any
 * later copy into it: a window that read it anyway would show in the logits. Best effort: a
 * poison that cannot be posted leaves the slot as the copy left it. */
static void poison(struct hyb *h, uint32_t slot, uint64_t after)
{
    const struct copy_extent x = {.bytes = h->slot_bytes, .fill = 0xa5};
    uint64_t ticket;
    copy_post(h->ce, slot, &x, 1, after, &ticket);
}

/* verify: --cache-verify: the slot's bytes, brought back, hash as the host's blob */
static int verify(struct hyb *h, uint32_t slot, uint32_t l, uint32_t e)
{
    const uint64_t bytes = h->m->layers[l].blob.bytes;
    uint8_t *a = malloc(bytes);
    if (!a) return STRATA_ENOMEM;
    int rv = STRATA_EIO;
    if (cudaMemcpy(a, hyb_slot_ptr(h, slot), bytes, cudaMemcpyDeviceToHost) == cudaSuccess) {
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
    poison(h, f->mv.slot, h->window);
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
    const double t0 = hyb_now();
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
    if (wait) h->adapt_wait_s += hyb_now() - t0;
    h->copy_s += hyb_now() - t0;
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
        if ((rv = hyb_publish(h))) return rv;
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

/* fill_copy posts the copies of experts[0..n) (layer * NE + expert, n <= HYB_FILL_BATCH) into
 * slots[0..n), fenced on no window (the slots are in no table), waits for them and verifies them
 * when asked: ok[i] says which copies are good. */
static void fill_copy(struct hyb *h, const uint32_t *slots, const uint32_t *experts, uint32_t n,
                      uint8_t *ok)
{
    uint64_t ticket[HYB_FILL_BATCH];
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
    uint32_t slots[HYB_FILL_BATCH], ex[HYB_FILL_BATCH];
    uint8_t ok[HYB_FILL_BATCH];
    uint32_t n_free = 0, next = 0;
    for (uint32_t s = h->fill_slots; free_slots && s-- > 0;)
        free_slots[n_free++] = s;
    for (;;) {
        pthread_mutex_lock(&h->mu);
        const bool stop = h->fill_stop;
        pthread_mutex_unlock(&h->mu);
        if (stop || !free_slots || !n_free || next >= h->fill_total) break;
        uint32_t n = 0;
        while (n < HYB_FILL_BATCH && n_free && next < h->fill_total) {
            slots[n] = free_slots[--n_free];
            ex[n++] = h->forder[next++];
        }
        fill_copy(h, slots, ex, n, ok);
        uint32_t failed = 0;
        for (uint32_t i = 0; i < n; i++)
            if (!ok[i]) {
                poison(h, slots[i], 0); /* before the next expert's copy into it */
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
    h->fill_s = hyb_now() - h->fill_t0;
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
             h->fill_copies, h->fill_s, h->fill_s > 0 ? hyb_gib(h->fill_bytes) / h->fill_s : 0.0,
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
    return hyb_publish(h);
}

int hyb_fill_start(struct hyb *h)
{
    const uint32_t total = h->L * h->NE;
    if (!(h->forder = malloc(total * sizeof *h->forder)) ||
        !(h->fland = malloc(((size_t)h->cache->n_slots + 1) * 3 * sizeof *h->fland)))
        return strata_errf(STRATA_ENOMEM, "out of memory for the fill order");
    int rv = cache_fill_order(h->L, h->NE, h->o.heat, h->forder);
    if (rv) return rv;
    h->fill_total = total;
    h->fill_slots = h->cache->n_slots;
    h->fill_t0 = hyb_now();
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
        return hyb_publish(h);
    }
    return 0;
}

/* ---- the tier's rounds -------------------------------------------------------------------------
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
    return rv ? rv : hyb_publish(h);
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
        if ((rv = hyb_publish(h))) return rv;
        /* the round goes on: its next batch (STRATA_ADAPT_ASYNC_BATCH), or its copies landing */
        if (h->n_fl) return h->n_fl_posted < h->n_fl ? post_round(h, h->async_batch) : 0;
    }
    if (h->picker_started) {
        /* with ASYNC_WAIT the tick after a pick was asked waits for it: the window a round is
         * posted in does not depend on the picker's timing */
        if (h->async_wait) {
            const double t0 = hyb_now();
            pick_settle(h, false);
            h->adapt_wait_s += hyb_now() - t0;
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
    if (!h->reg_wait) return;
    /* STRATA_HYBRID_PIN=wait: this tick returns once every queued blob is registered or refused,
     * so that a benchmark times the PCIe share with the whole set usable */
    const double t0 = hyb_now();
    pthread_mutex_lock(&h->mu);
    while (h->pins.registered + h->pins.failed < h->pins.tail) {
        pthread_mutex_unlock(&h->mu);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&h->mu);
    }
    const uint32_t n = h->pins.registered, bad = h->pins.failed;
    pthread_mutex_unlock(&h->mu);
    const double s = hyb_now() - t0;
    LOG_INFO("expert cache: %u blobs registered, %u refused, in %.2f s before serving on "
             "(STRATA_HYBRID_PIN=wait)",
             n, bad, s);
}

/* ---- the hybrid's calls ------------------------------------------------------------------------
 */

int hyb_copy_start(struct hyb *h, bool pick_thread)
{
    int rv, attr = 0;
    const uint64_t LE = (uint64_t)h->L * h->NE;
    const struct copy_cuda_opts co = {.device = h->dev,
                                      .stream = h->s,
                                      .n_slots = (uint32_t)LE,
                                      .slot_bytes = h->slot_bytes,
                                      .slot_at = slot_at,
                                      .slot_ctx = h};
    if ((rv = copy_cuda_start(&co, h->o.copy_hooks, &h->ce))) return rv;
    /* registration: read-only where the device takes it (the arena is mapped read-only) */
    cudaDeviceGetAttribute(&attr, cudaDevAttrHostRegisterReadOnlySupported, h->dev);
    h->ro_flag = attr != 0;
    h->can_map = true; /* mapped registrations: the PCIe share reads them through the slot table */
    if (h->pin != HYB_PIN_NONE && hyb_from_arena(h->m)) {
        if (h->pin == HYB_PIN_WHOLE)
            for (uint32_t i = 0; i < LE; i++)
                hyb_pinset_want(&h->pins, i);
        /* the thread starts after the first window (reg_begin): cudaHostRegister holds the
         * driver while it pins, which would stall the start's allocations and first pass */
        h->reg_pending = true;
    }
    if (h->tier && h->o.tier.async && pick_thread) {
        int err = pthread_create(&h->picker, NULL, picker_main, h);
        if (err) return strata_errf(strata_errno(err), "cannot start the adaptive tier's thread");
        h->picker_started = true;
    }
    return 0;
}

int hyb_copy_tick(struct hyb *h)
{
    /* the window just run is the last that may read what this tick takes out of the table */
    int rv = copy_window_done(h->ce, h->window);
    if (rv) return rv;
    if (h->reg_pending) reg_begin(h);
    const bool landed = fill_land(h) > 0;
    if ((rv = pcie_news(h) || landed ? hyb_publish(h) : 0)) return rv;
    /* the tier starts once the start's fill has ended (its slots are the fill's until then) */
    if (!h->tier || h->fill_started) return 0;
    return h->o.tier.async ? async_tick(h) : tier_window(h->tier) ? round_blocking(h) : 0;
}

int hyb_quiesce(struct hyb *h)
{
    pick_settle(h, true); /* a pick in progress ends; its moves are dropped */
    /* what the fill has copied lands; the fill itself goes on (a request does not wait for it) */
    if (fill_land(h) && !h->n_fl_posted) return hyb_publish(h);
    if (h->n_fl_posted) {
        land_all(h, true);
        h->n_fl = h->n_fl_posted = 0;
        return hyb_publish(h);
    }
    h->n_fl = 0;
    return 0;
}

int hyb_copy_fence(struct hyb *h)
{
    int rv;
    if ((rv = fill_end(h)) || (rv = hyb_quiesce(h))) return rv;
    copy_wait_all(h->ce); /* the poisons too */
    return 0;
}

void hyb_copy_close(struct hyb *h)
{
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
}
