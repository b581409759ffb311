#include "tools/trace.h"

#include "common/err.h"
#include "gpu-worker/fwd.h"
#include "gpu-worker/kv.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

int trace_init(struct trace *t, uint32_t n_layer, uint32_t n_expert, uint32_t n_used)
{
    memset(t, 0, sizeof *t);
    if (!n_layer || !n_expert || !n_used || n_expert > UINT16_MAX || n_used > n_expert)
        return strata_errf(STRATA_EINVAL,
                           "a trace of %u layers, %u experts, %u per token: need at least one "
                           "of each, at most 65535 experts and no more used than there are",
                           n_layer, n_expert, n_used);
    t->n_layer = n_layer;
    t->n_expert = n_expert;
    t->n_used = n_used;
    return 0;
}

void trace_fini(struct trace *t)
{
    free(t->sel);
    t->sel = NULL;
    t->n_tokens = t->cap = 0;
}

int trace_push(struct trace *t, const uint16_t *sel)
{
    const size_t per = (size_t)t->n_layer * t->n_used;
    for (uint32_t l = 0; l < t->n_layer; l++)
        for (uint32_t i = 0; i < t->n_used; i++) {
            uint16_t e = sel[l * t->n_used + i];
            if (e >= t->n_expert || (i && e <= sel[l * t->n_used + i - 1]))
                return strata_errf(STRATA_EINVAL,
                                   "token %llu, layer %u: expert %u at place %u is out of range "
                                   "(%u experts) or not above the one before",
                                   (unsigned long long)t->n_tokens, l, e, i, t->n_expert);
        }
    if (t->n_tokens == t->cap) {
        uint64_t cap = t->cap ? t->cap * 2 : 1024;
        uint16_t *p = realloc(t->sel, cap * per * sizeof *p);
        if (!p)
            return strata_errf(STRATA_ENOMEM, "out of memory for a trace of %llu tokens",
                               (unsigned long long)cap);
        t->sel = p;
        t->cap = cap;
    }
    memcpy(t->sel + t->n_tokens * per, sel, per * sizeof *sel);
    t->n_tokens++;
    return 0;
}

/* ---- recording --------------------------------------------------------------------------------
 */

struct rec {
    model_expert_fn fn; /* the resolver being wrapped */
    void *ctx;
    uint32_t n_used;
    uint16_t *sel; /* this token's picks, (n_layer, n_used), in the order they were reached */
    uint32_t *got; /* picks seen per layer; may pass n_used, which trace_record reports */
};

/* resolve notes each expert the pass reaches (once per expert: at its GATE part) and hands out the
 * weights through the wrapped resolver. The contract lets any thread resolve, so a pick takes its
 * place with an atomic increment; trace_record sorts each layer's picks after the pass. */
static const void *resolve(void *ctx, uint32_t layer, uint32_t expert, enum model_part part)
{
    struct rec *r = ctx;
    if (part == MODEL_PART_GATE) {
        uint32_t i = __atomic_fetch_add(&r->got[layer], 1, __ATOMIC_RELAXED);
        if (i < r->n_used) r->sel[layer * r->n_used + i] = (uint16_t)expert;
    }
    return r->fn(r->ctx, layer, expert, part);
}

static void sort_u16(uint16_t *v, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            uint16_t x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
}

int trace_record(const struct model *m, const int32_t *ids, size_t n, uint32_t ctx,
                 uint32_t n_threads, struct trace *t)
{
    const struct model_hparams *hp = &m->hp;
    if (!ctx) return strata_errf(STRATA_EINVAL, "a trace window of 0 tokens");
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= hp->n_vocab)
            return strata_errf(STRATA_EINVAL, "token %zu is id %d, outside the vocabulary of %u", i,
                               ids[i], hp->n_vocab);
    /* A private copy of the model struct: the wrapper goes on the copy, so m stays untouched
     * and the weights (borrowed pointers) are shared. */
    struct model mc = *m;
    struct rec r = {.fn = m->expert_part, .ctx = m->expert_ctx, .n_used = hp->n_expert_used};
    r.sel = malloc((size_t)hp->n_layer * hp->n_expert_used * sizeof *r.sel);
    r.got = malloc(hp->n_layer * sizeof *r.got);
    struct kv_cache *kv = NULL;
    struct fwd *f = NULL;
    struct kv_seq seq;
    kv_seq_init(&seq);
    float *logits = NULL;
    int rv;
    if (!r.sel || !r.got) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory");
        goto fail;
    }
    model_set_expert_resolver(&mc, resolve, &r);
    struct kv_config kc;
    fwd_kv_config(&mc, ctx, 1, &kc);
    struct fwd_opts fo = {.n_threads = n_threads, .max_tokens = 1};
    if ((rv = kv_init(&kc, &kv)) != 0 || (rv = fwd_start(&mc, kv, &fo, &f)) != 0) goto fail;
    for (size_t i = 0; i < n; i++) {
        if (i % ctx == 0) {
            kv_seq_fini(kv, &seq);
            kv_seq_init(&seq);
        }
        memset(r.got, 0, hp->n_layer * sizeof *r.got);
        /* No logits are asked for: the routing is all a trace needs. */
        struct fwd_token tk = {&seq, ids[i], false};
        if ((rv = fwd_eval(f, &tk, 1, logits)) != 0) goto fail;
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            if (r.got[l] != hp->n_expert_used) {
                rv = strata_errf(STRATA_EINTERNAL,
                                 "token %zu, layer %u: the forward pass reached %u experts, "
                                 "expected %u: it no longer resolves experts once per pass",
                                 i, l, r.got[l], hp->n_expert_used);
                goto fail;
            }
            sort_u16(r.sel + (size_t)l * hp->n_expert_used, hp->n_expert_used);
        }
        if ((rv = trace_push(t, r.sel)) != 0) goto fail;
    }
fail:
    kv_seq_fini(kv, &seq);
    fwd_close(f);
    kv_fini(kv);
    free(r.sel);
    free(r.got);
    return rv;
}

/* ---- analysis ---------------------------------------------------------------------------------
 */

void trace_counts(const struct trace *t, uint32_t layer, uint64_t *out)
{
    memset(out, 0, t->n_expert * sizeof *out);
    const size_t per = (size_t)t->n_layer * t->n_used;
    for (uint64_t k = 0; k < t->n_tokens; k++)
        for (uint32_t i = 0; i < t->n_used; i++)
            out[t->sel[k * per + (size_t)layer * t->n_used + i]]++;
}

double trace_entropy(const struct trace *t, uint32_t layer)
{
    uint64_t *c = malloc(t->n_expert * sizeof *c);
    if (!c) return NAN;
    trace_counts(t, layer, c);
    double total = (double)t->n_tokens * t->n_used, h = 0;
    for (uint32_t e = 0; e < t->n_expert && total > 0; e++)
        if (c[e]) h -= (double)c[e] / total * log2((double)c[e] / total);
    free(c);
    return h;
}

uint64_t trace_lru(const struct trace *t, uint32_t layer, uint32_t slots, uint64_t *accesses)
{
    /* last[e]: the access time of expert e if it is cached, 0 if not. O(n_expert) per miss:
     * fine for the hundreds of experts a layer has. */
    uint64_t *last = calloc(t->n_expert, sizeof *last), clock = 0, hits = 0;
    uint32_t held = 0;
    const size_t per = (size_t)t->n_layer * t->n_used;
    *accesses = t->n_tokens * t->n_used;
    if (!last || !slots) {
        free(last);
        return 0;
    }
    for (uint64_t k = 0; k < t->n_tokens; k++)
        for (uint32_t i = 0; i < t->n_used; i++) {
            uint16_t e = t->sel[k * per + (size_t)layer * t->n_used + i];
            if (last[e]) {
                hits++;
            } else if (held < slots) {
                held++;
            } else {
                uint32_t victim = 0;
                uint64_t oldest = UINT64_MAX;
                for (uint32_t x = 0; x < t->n_expert; x++)
                    if (last[x] && last[x] < oldest) {
                        oldest = last[x];
                        victim = x;
                    }
                last[victim] = 0;
            }
            last[e] = ++clock;
        }
    free(last);
    return hits;
}
