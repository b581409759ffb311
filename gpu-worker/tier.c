#include "gpu-worker/tier.h"
#include "common/base/err.h"

#include <stdlib.h>
#include <string.h>

struct tier {
    uint32_t n_layer, n_expert;
    struct tier_opts o;
    float *count;      /* (n_layer * n_expert) decayed counts, added to by the windows */
    float *snap;       /* (n_layer * n_expert) the counts as of the last tier_decay */
    uint32_t windows; /* since the last round */
    uint32_t *cand;   /* (n_layer * n_expert) scratch: candidates of a round */
    uint8_t *taken;   /* (n_layer * n_expert) scratch: residents evicted this round */
};

int tier_init(uint32_t n_layer, uint32_t n_expert, const struct tier_opts *o, struct tier **out)
{
    const size_t n = (size_t)n_layer * n_expert;
    struct tier *t = calloc(1, sizeof *t);
    if (t) {
        t->count = calloc(n, sizeof *t->count);
        t->snap = calloc(n, sizeof *t->snap);
        t->cand = malloc(n * sizeof *t->cand);
        t->taken = malloc(n);
    }
    if (!t || !t->count || !t->snap || !t->cand || !t->taken) {
        tier_fini(t);
        return strata_errf(STRATA_ENOMEM, "out of memory for the adaptive tier");
    }
    t->n_layer = n_layer;
    t->n_expert = n_expert;
    t->o = *o;
    *out = t;
    return 0;
}

void tier_fini(struct tier *t)
{
    if (!t) return;
    free(t->count);
    free(t->snap);
    free(t->cand);
    free(t->taken);
    free(t);
}

void tier_count(struct tier *t, uint32_t layer, uint32_t expert, float n)
{
    t->count[(size_t)layer * t->n_expert + expert] += n;
}

bool tier_window(struct tier *t)
{
    if (!t->o.every) return false;
    if (++t->windows < t->o.every) return false;
    t->windows = 0;
    return true;
}

const float *tier_snapshot(const struct tier *t)
{
    return t->snap;
}

const float *tier_counts(const struct tier *t)
{
    return t->count;
}

float tier_count_of(const struct tier *t, uint32_t layer, uint32_t expert)
{
    return t->count[(size_t)layer * t->n_expert + expert];
}

static int hotter(const void *a, const void *b, void *ctx)
{
    const struct tier *t = ctx;
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    const float cx = t->snap[x], cy = t->snap[y];
    if (cx != cy) return cx > cy ? -1 : 1;
    return x < y ? -1 : x > y;
}

void tier_decay(struct tier *t)
{
    const size_t n = (size_t)t->n_layer * t->n_expert;
    for (size_t i = 0; i < n; i++)
        t->snap[i] = t->count[i] *= t->o.decay;
}

uint32_t tier_round(struct tier *t, const struct cache *c, struct tier_move *moves, uint32_t max)
{
    tier_decay(t);
    return tier_pick(t, c, moves, max);
}

uint32_t tier_pick(struct tier *t, const struct cache *c, struct tier_move *moves, uint32_t max)
{
    const size_t n = (size_t)t->n_layer * t->n_expert;
    const float *count = t->snap;
    uint32_t nc = 0;
    for (size_t i = 0; i < n; i++)
        if (c->work[i] == CACHE_NONE && count[i] >= t->o.min_count) t->cand[nc++] = (uint32_t)i;
    qsort_r(t->cand, nc, sizeof *t->cand, hotter, t);
    memset(t->taken, 0, n);
    /* free slots of the working table, handed out in order */
    uint32_t next_free = 0, n_moves = 0;
    for (uint32_t k = 0; k < nc && n_moves < max && n_moves < t->o.swaps; k++) {
        const uint32_t x = t->cand[k], l = x / t->n_expert, e = x % t->n_expert;
        while (next_free < c->n_slots && c->owner[next_free] != CACHE_NONE)
            next_free++;
        if (next_free < c->n_slots) {
            moves[n_moves++] = (struct tier_move){l, e, next_free++, CACHE_NONE};
            continue;
        }
        /* the least-used resident of layer l not already evicted this round; O(n_expert) */
        int32_t victim = CACHE_NONE;
        for (uint32_t v = 0; v < t->n_expert; v++) {
            const uint32_t y = l * t->n_expert + v;
            if (c->work[y] == CACHE_NONE || t->taken[y]) continue;
            if (victim == CACHE_NONE || count[y] < count[victim]) victim = (int32_t)y;
        }
        if (victim == CACHE_NONE || count[x] < count[victim] + t->o.lead) continue;
        t->taken[victim] = 1;
        moves[n_moves++] = (struct tier_move){l, e, (uint32_t)c->work[victim], victim};
    }
    return n_moves;
}
