#include "gpu-worker/cache.h"
#include "common/base/err.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

int cache_spec_parse(const char *s, struct cache_spec *out)
{
    if (strcmp(s, "auto") == 0) {
        *out = (struct cache_spec){CACHE_AUTO, 0};
        return 0;
    }
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0 || s[0] == '-') goto bad;
    if (*end == '\0') {
        if (v != (double)(uint64_t)v) goto bad;
        *out = (struct cache_spec){CACHE_SLOTS, (uint64_t)v};
        return 0;
    }
    double unit = strcasecmp(end, "GiB") == 0 || strcasecmp(end, "G") == 0   ? 1024.0 * 1024 * 1024
                  : strcasecmp(end, "MiB") == 0 || strcasecmp(end, "M") == 0 ? 1024.0 * 1024
                                                                             : 0;
    if (unit == 0 || v * unit > 1e18) goto bad;
    *out = (struct cache_spec){CACHE_BYTES, (uint64_t)(v * unit)};
    return 0;
bad:
    return strata_errf(STRATA_EINVAL,
                       "--expert-cache '%s': use auto, a slot count (e.g. 96) or a size (e.g. "
                       "12GiB, 512MiB)",
                       s);
}

uint32_t cache_spec_slots(const struct cache_spec *spec, uint64_t slot_bytes, uint32_t auto_slots,
                          uint32_t n_total)
{
    uint64_t n = spec->kind == CACHE_AUTO    ? auto_slots
                 : spec->kind == CACHE_SLOTS ? spec->value
                 : slot_bytes                ? spec->value / slot_bytes
                                             : 0;
    return n > n_total ? n_total : (uint32_t)n;
}

int cache_init(uint32_t n_layer, uint32_t n_expert, uint32_t n_slots, uint64_t slot_bytes,
               struct cache **out)
{
    const size_t n = (size_t)n_layer * n_expert;
    struct cache *c = calloc(1, sizeof *c);
    if (c) {
        c->work = malloc(n * sizeof *c->work);
        c->pub = malloc(n * sizeof *c->pub);
        c->owner = malloc((n_slots ? n_slots : 1) * sizeof *c->owner);
    }
    if (!c || !c->work || !c->pub || !c->owner) {
        cache_fini(c);
        return strata_errf(STRATA_ENOMEM, "out of memory for an expert cache of %u slots", n_slots);
    }
    c->n_layer = n_layer;
    c->n_expert = n_expert;
    c->n_slots = n_slots;
    c->slot_bytes = slot_bytes;
    for (size_t i = 0; i < n; i++)
        c->work[i] = c->pub[i] = CACHE_NONE;
    for (uint32_t s = 0; s < n_slots; s++)
        c->owner[s] = CACHE_NONE;
    *out = c;
    return 0;
}

void cache_fini(struct cache *c)
{
    if (!c) return;
    free(c->work);
    free(c->pub);
    free(c->owner);
    free(c);
}

void cache_evict(struct cache *c, uint32_t s)
{
    if (c->owner[s] == CACHE_LENT) return; /* not an expert's: cache_unlend gives it back */
    if (c->owner[s] != CACHE_NONE) c->work[c->owner[s]] = CACHE_NONE;
    c->owner[s] = CACHE_NONE;
}

int32_t cache_lend(struct cache *c, const float *counts, uint32_t below)
{
    if (below > c->n_slots) below = c->n_slots;
    int32_t best = CACHE_NONE;
    for (uint32_t s = 0; s < below && best == CACHE_NONE; s++)
        if (c->owner[s] == CACHE_NONE) best = (int32_t)s;
    for (uint32_t s = below; best == CACHE_NONE && s-- > 0;) {
        if (c->owner[s] == CACHE_LENT) continue;
        best = (int32_t)s;
        if (!counts) break;
        for (uint32_t r = s; r-- > 0;)
            if (c->owner[r] != CACHE_LENT && counts[c->owner[r]] < counts[c->owner[best]])
                best = (int32_t)r;
    }
    if (best == CACHE_NONE) return CACHE_NONE;
    cache_evict(c, (uint32_t)best);
    c->owner[best] = CACHE_LENT;
    c->n_lent++;
    return best;
}

void cache_unlend(struct cache *c, uint32_t s)
{
    if (c->owner[s] != CACHE_LENT) return;
    c->owner[s] = CACHE_NONE;
    c->n_lent--;
}

void cache_assign(struct cache *c, uint32_t s, uint32_t l, uint32_t e)
{
    const int32_t x = (int32_t)((uint64_t)l * c->n_expert + e);
    c->owner[s] = x;
    c->work[x] = (int32_t)s;
}

int32_t cache_free_slot(const struct cache *c)
{
    for (uint32_t s = 0; s < c->n_slots; s++)
        if (c->owner[s] == CACHE_NONE) return (int32_t)s;
    return CACHE_NONE;
}

int cache_resize(struct cache *c, uint32_t n_slots)
{
    for (uint32_t s = n_slots; s < c->n_slots; s++)
        if (c->owner[s] == CACHE_LENT)
            return strata_errf(STRATA_EBUSY, "slot %u of %u is lent to the KV cache", s,
                               c->n_slots);
    if (n_slots > c->n_slots) {
        int32_t *o = realloc(c->owner, n_slots * sizeof *o);
        if (!o) return strata_errf(STRATA_ENOMEM, "out of memory for %u cache slots", n_slots);
        for (uint32_t s = c->n_slots; s < n_slots; s++)
            o[s] = CACHE_NONE;
        c->owner = o;
    }
    for (uint32_t s = n_slots; s < c->n_slots; s++)
        cache_evict(c, s);
    c->n_slots = n_slots; /* a shrink keeps the larger owner array */
    return 0;
}

void cache_publish(struct cache *c)
{
    memcpy(c->pub, c->work, (size_t)c->n_layer * c->n_expert * sizeof *c->pub);
}

uint32_t cache_resident(const struct cache *c)
{
    uint32_t n = 0;
    for (size_t i = 0; i < (size_t)c->n_layer * c->n_expert; i++)
        n += c->pub[i] != CACHE_NONE;
    return n;
}

struct rank {
    uint64_t heat;
    uint32_t l, e;
};

static int by_heat(const void *a, const void *b)
{
    const struct rank *x = a, *y = b;
    if (x->heat != y->heat) return x->heat > y->heat ? -1 : 1;
    if (x->e != y->e) return x->e < y->e ? -1 : 1;
    return x->l < y->l ? -1 : x->l > y->l;
}

int cache_fill_order(uint32_t n_layer, uint32_t n_expert, const uint64_t *heat, uint32_t *order)
{
    const size_t n = (size_t)n_layer * n_expert;
    struct rank *r = malloc(n * sizeof *r);
    if (!r) return strata_errf(STRATA_ENOMEM, "out of memory to rank %zu experts", n);
    for (uint32_t l = 0; l < n_layer; l++)
        for (uint32_t e = 0; e < n_expert; e++)
            r[(size_t)l * n_expert + e] =
                (struct rank){heat ? heat[(size_t)l * n_expert + e] : 0, l, e};
    qsort(r, n, sizeof *r, by_heat);
    for (size_t i = 0; i < n; i++)
        order[i] = r[i].l * n_expert + r[i].e;
    free(r);
    return 0;
}
