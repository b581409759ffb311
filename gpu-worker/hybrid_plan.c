#include "gpu-worker/hybrid_plan.h"
#include "common/base/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ALLOC_GRAIN ((uint64_t)2 << 20) /* cudaMalloc hands out VRAM in 2 MiB pages */

uint64_t hyb_chunk_bytes(uint64_t slot_bytes, uint32_t slots)
{
    const uint64_t b = slot_bytes * slots;
    return (b + ALLOC_GRAIN - 1) / ALLOC_GRAIN * ALLOC_GRAIN;
}

/* bytes of n slots allocated in chunks of c */
static uint64_t pool_bytes(const struct hyb_budget *b, uint32_t n)
{
    const uint32_t c = b->chunk_slots ? b->chunk_slots : 1;
    return (uint64_t)(n / c) * hyb_chunk_bytes(b->slot_bytes, c) +
           (n % c ? hyb_chunk_bytes(b->slot_bytes, n % c) : 0);
}

uint32_t hyb_auto_slots(const struct hyb_budget *b)
{
    if (!b->slot_bytes || b->vram_free <= b->reserve + b->fixed) return 0;
    const uint64_t room = b->vram_free - b->reserve - b->fixed;
    uint64_t n = room / b->slot_bytes;
    if (n > b->n_total) n = b->n_total;
    while (n && pool_bytes(b, (uint32_t)n) > room)
        n--;
    return (uint32_t)n;
}

uint32_t hyb_plan_slots(const struct cache_spec *spec, const struct hyb_budget *b)
{
    if (spec->kind == CACHE_AUTO) return hyb_auto_slots(b);
    return cache_spec_slots(spec, b->slot_bytes, 0, b->n_total);
}

uint32_t hyb_shrink_to(uint32_t n_slots, uint64_t vram_free_now, const struct hyb_budget *b)
{
    if (vram_free_now >= b->reserve) return n_slots;
    const uint64_t short_by = b->reserve - vram_free_now;
    const uint32_t c = b->chunk_slots ? b->chunk_slots : 1;
    uint32_t n = n_slots;
    uint64_t freed = 0;
    /* the pool gives back whole chunks from its tail (the last one may be partial) */
    while (n && freed < short_by) {
        const uint32_t tail = n % c ? n % c : c;
        freed += hyb_chunk_bytes(b->slot_bytes, tail);
        n -= tail;
    }
    return n;
}

uint64_t hyb_kv_granules(uint64_t block_bytes, uint64_t granule, uint32_t blocks)
{
    if (!granule) return 0;
    return ((uint64_t)blocks * block_bytes + granule - 1) / granule;
}

uint32_t hyb_kv_take(uint64_t budget, uint64_t held, uint64_t grow, uint32_t n_slots,
                     uint64_t slot_bytes, uint32_t chunk_slots, uint64_t *shortfall)
{
    const uint32_t c = chunk_slots ? chunk_slots : 1;
    const uint64_t cb = hyb_chunk_bytes(slot_bytes, c);
    *shortfall = 0;
    if (held + grow <= budget) return n_slots;
    const uint64_t need = held + grow - budget;
    uint64_t freed = 0;
    uint32_t chunks = (n_slots + c - 1) / c;
    while (chunks && freed < need) {
        chunks--;
        freed += cb;
    }
    if (freed < need) *shortfall = need - freed;
    const uint64_t keep = (uint64_t)chunks * c;
    return keep < n_slots ? (uint32_t)keep : n_slots;
}

uint32_t hyb_slots_within(uint64_t room, uint64_t slot_bytes, uint32_t chunk_slots, uint32_t cap)
{
    const uint32_t c = chunk_slots ? chunk_slots : 1;
    const uint64_t cb = hyb_chunk_bytes(slot_bytes, c);
    uint64_t n = cb ? room / cb * c : 0;
    return n < cap ? (uint32_t)n : cap;
}

/* ---- the split --------------------------------------------------------------------------------
 */

/* put appends group g's pairs to one side, cut at cap pairs a group (0: uncut). */
static void put(const struct moe_group *g, const int32_t *pair_idx, uint32_t cap,
                struct moe_group *groups, int *n_groups, int32_t *idx, uint32_t *n_pairs)
{
    for (int32_t i = 0; i < g->count;) {
        int32_t c = g->count - i;
        if (cap && (uint32_t)c > cap) c = (int32_t)cap;
        groups[(*n_groups)++] = (struct moe_group){g->expert, (int32_t)*n_pairs, c};
        memcpy(idx + *n_pairs, pair_idx + g->first + i, (size_t)c * sizeof *idx);
        *n_pairs += (uint32_t)c;
        i += c;
    }
}

int hyb_split_layer(const int32_t *ids, int64_t n_tok, int k, uint32_t n_expert,
                    const int32_t *slot_of, const uint8_t *host_ok,
                    const struct hyb_pcie_rule *rule, bool prompt, uint32_t max_pairs,
                    struct moe_group *groups, int32_t *pair_idx, struct hyb_split *out)
{
    const int ng = moe_group(ids, n_tok, k, n_expert, NULL, UINT32_MAX, groups, pair_idx);
    out->n_hit = out->n_pcie = out->n_miss = 0;
    out->hit_pairs = out->pcie_pairs = out->miss_pairs = 0;
    /* which missed groups go over PCIe: the eligible ones (reachable; in a prompt chunk with at
     * least threshold pairs) ranked by pairs, ties to the lower id, the first `limit` of them:
     * decode ceil(frac * misses), prompt all, both capped at max_experts */
    const bool any = rule && host_ok && (prompt ? rule->threshold > 0 : rule->frac > 0);
    int n_missed = 0, n_elig = 0;
    for (int g = 0; g < ng; g++) {
        const struct moe_group *G = &groups[g];
        if (slot_of[G->expert] != CACHE_NONE) continue;
        n_missed++;
        n_elig += any && host_ok[G->expert] && (!prompt || (uint32_t)G->count >= rule->threshold);
    }
    int limit = 0;
    if (any) limit = prompt ? n_elig : (int)ceilf(rule->frac * (float)n_missed - 1e-6f);
    if (limit > n_elig) limit = n_elig;
    if (any && rule->max_experts && limit > (int)rule->max_experts) limit = (int)rule->max_experts;
    for (int g = 0; g < ng; g++) {
        const struct moe_group *G = &groups[g];
        if (slot_of[G->expert] != CACHE_NONE) {
            put(G, pair_idx, max_pairs, out->hit_groups, &out->n_hit, out->hit_idx,
                &out->hit_pairs);
            continue;
        }
        bool pcie = false;
        if (limit && host_ok[G->expert] && (!prompt || (uint32_t)G->count >= rule->threshold)) {
            int rank = 0;
            for (int h = 0; h < ng; h++) {
                const struct moe_group *H = &groups[h];
                if (h == g || slot_of[H->expert] != CACHE_NONE || !host_ok[H->expert] ||
                    (prompt && (uint32_t)H->count < rule->threshold))
                    continue;
                if (H->count > G->count || (H->count == G->count && H->expert < G->expert)) rank++;
            }
            pcie = rank < limit;
        }
        if (pcie)
            put(G, pair_idx, max_pairs, out->pcie_groups, &out->n_pcie, out->pcie_idx,
                &out->pcie_pairs);
        else
            put(G, pair_idx, 0, out->miss_groups, &out->n_miss, out->miss_idx, &out->miss_pairs);
    }
    return ng;
}

void hyb_gather_index(const struct hyb_split *s, uint32_t n_pairs, int32_t *rows)
{
    for (uint32_t p = 0; p < n_pairs; p++)
        rows[p] = (int32_t)p;
    for (uint32_t i = 0; i < s->miss_pairs; i++)
        rows[s->miss_idx[i]] = (int32_t)(n_pairs + i);
}

bool hyb_land(struct cache *c, uint32_t slot, uint32_t layer, uint32_t expert, bool ok)
{
    const int32_t x = (int32_t)((uint64_t)layer * c->n_expert + expert);
    if (ok) {
        cache_assign(c, slot, layer, expert);
    } else if (c->owner[slot] == x) {
        cache_evict(c, slot);
    }
    return ok;
}

/* ---- registration -----------------------------------------------------------------------------
 */

static const char *const pin_names[] = {"need", "whole", "none"};

int hyb_pin_parse(const char *s, enum hyb_pin *out)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(s, pin_names[i]) == 0) return *out = (enum hyb_pin)i, 0;
    return strata_errf(STRATA_EINVAL, "--pin %s: give whole, need or none", s);
}

const char *hyb_pin_name(enum hyb_pin p)
{
    return (unsigned)p < 3 ? pin_names[p] : "?";
}

int hyb_pinset_init(uint32_t n, struct hyb_pinset *out)
{
    *out = (struct hyb_pinset){.n = n};
    out->state = calloc(n ? n : 1, 1);
    out->queue = malloc((n ? n : 1) * sizeof *out->queue);
    if (!out->state || !out->queue) {
        hyb_pinset_fini(out);
        return strata_errf(STRATA_ENOMEM, "out of memory for the registration set");
    }
    return 0;
}

void hyb_pinset_fini(struct hyb_pinset *s)
{
    free(s->state);
    free(s->queue);
    s->state = NULL;
    s->queue = NULL;
}

bool hyb_pinset_want(struct hyb_pinset *s, uint32_t blob)
{
    if (blob >= s->n || s->state[blob] != HYB_PIN_ABSENT) return false;
    s->state[blob] = HYB_PIN_QUEUED;
    s->queue[s->tail++] = blob;
    return true;
}

bool hyb_pinset_next(struct hyb_pinset *s, uint32_t *blob)
{
    if (s->head == s->tail) return false;
    *blob = s->queue[s->head++];
    return true;
}

void hyb_pinset_done(struct hyb_pinset *s, uint32_t blob, bool ok)
{
    if (blob >= s->n || s->state[blob] != HYB_PIN_QUEUED) return;
    s->state[blob] = ok ? HYB_PIN_REGISTERED : HYB_PIN_FAILED;
    *(ok ? &s->registered : &s->failed) += 1;
}
