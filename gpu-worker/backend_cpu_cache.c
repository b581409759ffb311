/* The CPU backend's slot mode (backend_cpu_int.h): the expert cache over a host slot pool, filled
 * through the copy engine (copy.h) from the arena's blobs or the file, the adaptive tier in its
 * blocking and async forms, and one budget for K/V blocks and slots. The forward pass
 * (backend_cpu.c) reads the published table and computes hits from slots, misses from the
 * model's own bytes, with the same kernel: the answers do not depend on what this file does.
 */
#include "gpu-worker/backend_cpu_int.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "kernels/cpu/cpu.h"

#include <xxhash.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- slot mode: the expert cache on the host ------------------------------------------------ */

#define SLOT_POISON 0xa5 /* the bytes of a slot no expert holds: a window reading it shows */

static int async_start(struct fwd *f);
static void async_stop(struct fwd *f);
static int async_quiesce(struct fwd *f);

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
int bcpu_kv_take_slots(struct fwd *f)
{
    const uint32_t need = kv_store_segments_for(f->store, kv_blocks_used_ever(f->kv));
    uint32_t have = kv_store_segments(f->store);
    if (need <= have) return 0;
    if (!(f->o.copy_hooks && f->o.copy_hooks->kv_unfenced)) {
        const double t0 = bcpu_now_s();
        async_quiesce(f);
        f->window_wait_s += bcpu_now_s() - t0;
    }
    for (; have < need; have++) {
        const int32_t s =
            cache_lend(f->cache, f->tier ? tier_counts(f->tier) : NULL, f->cache->n_slots);
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
        return strata_errf(
            STRATA_ENOSPC, "--slot-kv: a budget of %u slots holds no KV block of %llu bytes", n,
            (unsigned long long)(kv_pos_bytes(kv_config_of(f->kv), kv_store_type(f->store)) *
                                 kv_config_of(f->kv)->block_tokens));
    return kv_set_max_blocks(f->kv, in < cap ? in : cap);
}

/* cache_open sizes the cache (slots of the largest blob), makes the pool and fills it
 * hottest-first from o->heat (cache_fill_order's rule). With --slot-kv the slots are the whole
 * budget: the KV blocks take their memory from it (kv_take_slots). */
int bcpu_cache_open(struct fwd *f)
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
             !f->tier          ? "static"
             : f->o.tier.async ? "adaptive, async"
                               : "adaptive, blocking",
             f->o.slot_kv ? "; one budget with the KV cache" : "");
    return 0;
}

void bcpu_cache_close(struct fwd *f)
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

static int async_start(struct fwd *f)
{
    const uint32_t swaps = f->o.tier.swaps ? f->o.tier.swaps : 1;
    f->async_wait = bcpu_env_flag("STRATA_ADAPT_ASYNC_WAIT", 1) != 0;
    f->pick_inline = bcpu_env_flag("STRATA_ADAPT_PICK_INLINE", 0) != 0;
    f->async_batch = (uint32_t)bcpu_env_flag("STRATA_ADAPT_ASYNC_BATCH", 0);
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
    const double t0 = bcpu_now_s();
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
    if (wait) f->window_wait_s += bcpu_now_s() - t0;
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
    const double t0 = bcpu_now_s();
    pick_settle(f);
    f->window_join_s += bcpu_now_s() - t0;
}

/* bcpu_window_sync (the test hook window_sync), at the start of a pass before it reads a slot:
 * wait for the tier thread's posting and, with the window wait or the fence removed, for those
 * copies' bytes, so that a copy the fence would hold is written while this window may read its
 * slot. */
void bcpu_window_sync(struct fwd *f)
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

int bcpu_tick(void *impl)
{
    struct fwd *f = impl;
    const double t0 = bcpu_now_s();
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
        rv = !f->tier               ? 0
             : f->o.tier.async      ? async_tick(f)
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
                 1e3 * (st->output_s - p->output_s), 1e3 * (bcpu_now_s() - t0),
                 1e3 * f->window_fence_s, (unsigned long long)(f->hits - f->tick_hits),
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

int bcpu_quiesce(void *impl)
{
    struct fwd *f = impl;
    if (!f->cache) return 0;
    const double t0 = bcpu_now_s();
    const int rv = async_quiesce(f);
    f->window_fence_s += bcpu_now_s() - t0;
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
int bcpu_resize(void *impl, uint64_t bytes)
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

void bcpu_info(const void *impl, struct backend_info *out)
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
