#include "tools/trace.h"

#include "common/base/err.h"
#include "gpu-worker/backend.h"
#include "gpu-worker/kv.h"

#include <math.h>
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

/* Passes of at most TRACE_CHUNK tokens of a window: its tokens share each expert's weight reads,
 * and the forward pass's scratch stays near 50 MB for Qwen3-30B-A3B's shapes. */
#define TRACE_CHUNK 256

struct rec {
    uint32_t n_layer, n_used;
    uint16_t *sel; /* (TRACE_CHUNK, n_layer, n_used) the pass's picks, in the order reported */
    uint32_t *got; /* (TRACE_CHUNK, n_layer) picks reported; may pass n_used, which trace_record
                      reports */
};

/* route notes the pass's picks. The forward pass reports a layer's experts in ascending id order,
 * so each token's picks of a layer land sorted, as trace_push wants them. */
static void route(void *ctx, uint32_t layer, uint32_t expert, const uint32_t *tokens,
                  uint32_t n_tokens)
{
    struct rec *r = ctx;
    for (uint32_t i = 0; i < n_tokens; i++) {
        const size_t k = (size_t)tokens[i] * r->n_layer + layer;
        if (r->got[k] < r->n_used) r->sel[k * r->n_used + r->got[k]] = (uint16_t)expert;
        r->got[k]++;
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
    const uint32_t chunk = ctx < TRACE_CHUNK ? ctx : TRACE_CHUNK;
    struct rec r = {.n_layer = hp->n_layer, .n_used = hp->n_expert_used};
    r.sel = malloc((size_t)chunk * hp->n_layer * hp->n_expert_used * sizeof *r.sel);
    r.got = malloc((size_t)chunk * hp->n_layer * sizeof *r.got);
    struct backend_token *toks = malloc(chunk * sizeof *toks);
    struct kv_cache *kv = NULL;
    struct backend *f = NULL;
    struct kv_seq seq;
    kv_seq_init(&seq);
    int rv = 0;
    if (!r.sel || !r.got || !toks) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for trace passes of %u tokens", chunk);
        goto fail;
    }
    struct backend_opts bo = {.n_threads = n_threads, .max_pass_tokens = chunk, .n_ctx = ctx, .n_seq = 1};
    if ((rv = backend_start(m, &bo, &f)) != 0) goto fail;
    kv = backend_kv(f);
    backend_set_route(f, route, &r);
    for (size_t i = 0; i < n;) {
        if (i % ctx == 0) {
            kv_seq_fini(kv, &seq);
            kv_seq_init(&seq);
        }
        /* A pass stops at the window's end: the next window starts from an empty context. */
        const size_t left = ctx - i % ctx < n - i ? ctx - i % ctx : n - i;
        const uint32_t c = left < chunk ? (uint32_t)left : chunk;
        /* No logits are asked for: the routing is all a trace needs. */
        for (uint32_t j = 0; j < c; j++)
            toks[j] = (struct backend_token){&seq, ids[i + j], false};
        memset(r.got, 0, (size_t)c * hp->n_layer * sizeof *r.got);
        if ((rv = backend_eval(f, toks, c, NULL)) != 0) goto fail;
        for (uint32_t j = 0; j < c; j++) {
            for (uint32_t l = 0; l < hp->n_layer; l++)
                if (r.got[(size_t)j * hp->n_layer + l] != hp->n_expert_used) {
                    rv = strata_errf(STRATA_EINTERNAL,
                                     "token %zu, layer %u: the forward pass reported %u experts, "
                                     "expected %u: its routing hook broke its contract",
                                     i + j, l, r.got[(size_t)j * hp->n_layer + l],
                                     hp->n_expert_used);
                    goto fail;
                }
            if ((rv = trace_push(t, r.sel + (size_t)j * hp->n_layer * hp->n_expert_used)) != 0)
                goto fail;
        }
        i += c;
    }
fail:
    kv_seq_fini(kv, &seq);
    backend_close(f);
    free(r.sel);
    free(r.got);
    free(toks);
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
