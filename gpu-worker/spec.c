#include "gpu-worker/spec.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "gpu-worker/backend.h"
#include "kernels/ref/ops.h"

#include <stdlib.h>
#include <string.h>

uint32_t spec_lookup(const int32_t *h, uint32_t n, uint32_t k, int32_t *out)
{
    if (n < 2) return 0;
    for (uint32_t g = n > 3 ? 3 : n - 1; g >= 1 && k; g--)
        for (uint32_t i = n - g; i-- > 0;) {
            if (memcmp(h + i, h + n - g, g * sizeof *h) != 0) continue;
            uint32_t c = 0;
            for (; c < k && i + g + c < n; c++)
                out[c] = h[i + g + c];
            if (c) return c;
        }
    return 0;
}

void spec_adapt_init(struct spec_adapt *a, uint32_t max)
{
    *a = (struct spec_adapt){.k = max, .max = max, .next_rest = SPEC_REST};
}

uint32_t spec_adapt_want(struct spec_adapt *a)
{
    if (!a->rest) return a->k;
    a->rest--;
    return 0;
}

void spec_adapt_update(struct spec_adapt *a, uint32_t proposed, uint32_t accepted)
{
    if (!proposed) return;
    if (accepted) a->next_rest = SPEC_REST;
    if (accepted == proposed) {
        a->k = a->k < a->max ? a->k + 1 : a->max;
    } else if (accepted == 0 && a->k > 1) {
        a->k /= 2;
    } else if (accepted == 0) {
        a->rest = a->next_rest;
        if (a->next_rest < SPEC_REST_MAX) a->next_rest *= 2;
    }
}

int spec_vocab_check(const struct model *target, const struct model *draft)
{
    const uint32_t nt = target->hp.n_vocab, nd = draft->hp.n_vocab;
    if (nt != nd)
        return strata_errf(STRATA_EINVAL,
                           "the draft model has a vocabulary of %u tokens, the model %u: a draft "
                           "model must share the model's tokenizer (a smaller model of the same "
                           "family)",
                           nd, nt);
    const struct gguf_value *a = NULL, *b = NULL;
    if (!target->gguf || !draft->gguf ||
        gguf_get_arr(target->gguf, "tokenizer.ggml.tokens", GGUF_STRING, &a) != 0 ||
        gguf_get_arr(draft->gguf, "tokenizer.ggml.tokens", GGUF_STRING, &b) != 0)
        return 0; /* a file without a token list: the sizes are all there is to compare */
    if (a->arr.n != b->arr.n)
        return strata_errf(STRATA_EINVAL,
                           "the draft model's tokenizer lists %llu tokens, the model's %llu: a "
                           "draft model must share the model's tokenizer",
                           (unsigned long long)b->arr.n, (unsigned long long)a->arr.n);
    for (uint64_t i = 0; i < a->arr.n; i++) {
        const struct gguf_str *x = &a->arr.items[i].str, *y = &b->arr.items[i].str;
        if (x->len != y->len || memcmp(x->ptr, y->ptr, x->len) != 0)
            return strata_errf(STRATA_EINVAL,
                               "the draft model's token %llu is '%.*s', the model's '%.*s': a "
                               "draft model must share the model's tokenizer",
                               (unsigned long long)i, (int)(y->len > 40 ? 40 : y->len), y->ptr,
                               (int)(x->len > 40 ? 40 : x->len), x->ptr);
    }
    return 0;
}

struct spec_draft {
    struct backend *be;
    struct kv_cache *kv;
    uint32_t n_vocab, max_pass, n_seq;
    struct backend_token *toks; /* (max_pass) */
    float *logits;              /* (n_seq, n_vocab) */
    uint64_t passes;
};

int spec_draft_start(const struct model *target, const struct model *dm,
                     const struct spec_draft_opts *o, struct spec_draft **out)
{
    int rv = spec_vocab_check(target, dm);
    if (rv) return rv;
    struct spec_draft *d = calloc(1, sizeof *d);
    if (!d) return strata_errf(STRATA_ENOMEM, "out of memory for the draft model");
    d->n_vocab = dm->hp.n_vocab;
    d->n_seq = o->n_seq ? o->n_seq : 1;
    d->max_pass = o->max_pass_tokens ? o->max_pass_tokens : 256;
    if (d->max_pass < d->n_seq) d->max_pass = d->n_seq; /* a drafting pass feeds every sequence */
    struct backend_opts bo = backend_opts_default();
    bo.name = "cpu";
    bo.n_threads = o->n_threads;
    bo.max_pass_tokens = d->max_pass;
    bo.n_ctx = o->n_ctx;
    bo.n_seq = d->n_seq;
    d->toks = malloc(d->max_pass * sizeof *d->toks);
    d->logits = malloc((size_t)d->n_seq * d->n_vocab * sizeof *d->logits);
    if (!d->toks || !d->logits) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for the draft model's %u sequences",
                         d->n_seq);
        goto fail;
    }
    if ((rv = backend_start(dm, &bo, &d->be)) != 0) goto fail;
    d->kv = backend_kv(d->be);
    *out = d;
    return 0;
fail:
    spec_draft_close(d);
    return rv;
}

void spec_draft_close(struct spec_draft *d)
{
    if (!d) return;
    backend_close(d->be);
    free(d->toks);
    free(d->logits);
    free(d);
}

static int pass(struct spec_draft *d, uint32_t n)
{
    int rv = backend_eval(d->be, d->toks, n, d->logits);
    if (!rv) rv = backend_tick(d->be);
    d->passes++;
    return rv;
}

int spec_draft_propose(struct spec_draft *d, struct spec_draft_item *items, uint32_t n)
{
    int rv;
    uint32_t kmax = 0;
    if (n > d->n_seq)
        return strata_errf(STRATA_EINVAL, "%u sequences to draft for, the draft model holds %u",
                           n, d->n_seq);
    for (uint32_t i = 0; i < n; i++) {
        struct spec_draft_item *it = &items[i];
        if (!it->n_hist || !it->k || it->k > SPEC_MAX_DRAFT)
            return strata_errf(STRATA_EINVAL, "a draft of %u tokens after %u", it->k, it->n_hist);
        /* the last token is fed with the drafting passes, the rest before them */
        if (it->seq->n_tokens > it->n_hist - 1 &&
            (rv = kv_seq_resize(d->kv, it->seq, it->n_hist - 1)) != 0)
            return rv;
        if (it->k > kmax) kmax = it->k;
    }
    /* Catch up: the history the drafter has not seen, all but the last token, batched. */
    for (;;) {
        uint32_t m = 0;
        for (uint32_t i = 0; i < n && m < d->max_pass; i++) {
            struct spec_draft_item *it = &items[i];
            /* tokens already put in this batch for it are past seq->n_tokens */
            for (uint32_t p = it->seq->n_tokens; p + 1 < it->n_hist && m < d->max_pass; p++)
                d->toks[m++] = (struct backend_token){it->seq, it->hist[p], false};
        }
        if (!m) break;
        if ((rv = pass(d, m)) != 0) return rv;
    }
    for (uint32_t j = 0; j < kmax; j++) {
        uint32_t m = 0;
        for (uint32_t i = 0; i < n; i++) {
            struct spec_draft_item *it = &items[i];
            if (j < it->k)
                d->toks[m++] = (struct backend_token){
                    it->seq, j ? it->out[j - 1] : it->hist[it->n_hist - 1], true};
        }
        if ((rv = pass(d, m)) != 0) return rv;
        m = 0;
        for (uint32_t i = 0; i < n; i++)
            if (j < items[i].k)
                items[i].out[j] =
                    (int32_t)ops_argmax(d->logits + (size_t)m++ * d->n_vocab, d->n_vocab);
    }
    return 0; /* the last draft was never fed: seq holds hist and out[0 .. k-1) */
}

void spec_draft_keep(struct spec_draft *d, struct kv_seq *seq, uint32_t n)
{
    if (seq->n_tokens > n) kv_seq_resize(d->kv, seq, n);
}

void spec_draft_release(struct spec_draft *d, struct kv_seq *seq)
{
    kv_seq_fini(d->kv, seq);
}

uint64_t spec_draft_passes(const struct spec_draft *d)
{
    return d->passes;
}

bool spec_seq_take(struct spec_seq *s, int32_t id)
{
    if (s->row < s->n_drafts && id == s->drafts[s->row]) {
        s->row++;
        s->accepted++;
        return true;
    }
    return false;
}

int spec_seq_pass(struct spec_seq *s, const int32_t *hist, uint32_t n, uint32_t left,
                  uint32_t n_ctx, uint32_t max_pass, float *logits)
{
    struct kv_cache *kv = backend_kv(s->be);
    int rv;
    spec_adapt_update(&s->ad, s->n_drafts, s->row);
    /* the last pass fed hist up to n - 2 correctly, then rejected drafts */
    if (s->seq->n_tokens > n - 1 && (rv = kv_seq_resize(kv, s->seq, n - 1)) != 0) return rv;
    if (s->sd) spec_draft_keep(s->sd, &s->dseq, n - 1);
    uint32_t want = s->ad.max ? spec_adapt_want(&s->ad) : 0;
    if (want + 1 > left) want = left ? left - 1 : 0;
    if (n + want > n_ctx) want = n_ctx > n ? n_ctx - n : 0;
    if (want + 1 > max_pass) want = max_pass ? max_pass - 1 : 0;
    s->n_drafts = s->row = 0;
    if (want && s->sd) {
        struct spec_draft_item it = {.seq = &s->dseq, .hist = hist, .n_hist = n, .k = want};
        if ((rv = spec_draft_propose(s->sd, &it, 1)) != 0) return rv;
        memcpy(s->drafts, it.out, want * sizeof *s->drafts);
        s->n_drafts = want;
    } else if (want) {
        s->n_drafts = spec_lookup(hist, n, want, s->drafts);
    }
    s->proposed += s->n_drafts;
    struct backend_token t[1 + SPEC_MAX_DRAFT];
    t[0] = (struct backend_token){s->seq, hist[n - 1], true};
    for (uint32_t j = 0; j < s->n_drafts; j++)
        t[1 + j] = (struct backend_token){s->seq, s->drafts[j], true};
    s->passes++;
    if ((rv = backend_eval(s->be, t, 1 + s->n_drafts, logits)) != 0) return rv;
    return backend_tick(s->be);
}

void spec_seq_fini(struct spec_seq *s)
{
    if (s->sd) spec_draft_release(s->sd, &s->dseq);
}
