#include "tools/perplexity.h"

#include "common/base/err.h"
#include "common/tok/tok.h"
#include "gpu-worker/backend.h"
#include "gpu-worker/kv.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tokens per forward pass: enough rows to keep the matmuls busy, while the logits buffer
 * (this many rows of n_vocab floats) stays small for a 150K vocabulary. */
#define PPL_CHUNK 64

int ppl_read_file(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return strata_errf(strata_errno(errno), "cannot open %s", path);
    char *p = NULL;
    size_t n = 0, cap = 0, got;
    int rv = 0;
    do {
        if (n + 1 >= cap) {
            cap = cap ? cap * 2 : 1 << 20;
            char *np = realloc(p, cap);
            if (!np) {
                rv = strata_errf(STRATA_ENOMEM, "out of memory reading %s (%zu bytes)", path, n);
                break;
            }
            p = np;
        }
        got = fread(p + n, 1, cap - n - 1, f);
        n += got;
    } while (got);
    if (!rv && ferror(f)) rv = strata_errf(strata_errno(errno), "cannot read %s", path);
    fclose(f);
    if (rv) {
        free(p);
        return rv;
    }
    p[n] = '\0';
    *buf = p;
    *len = n;
    return 0;
}

int ppl_read_tokens(const char *path, bool raw_ids, const struct tok *tk, int32_t **ids, size_t *n)
{
    char *buf;
    size_t len;
    int rv = ppl_read_file(path, &buf, &len);
    if (rv) return rv;
    if (!raw_ids) {
        struct tok_ids out = {0};
        if ((rv = tok_encode(tk, buf, len, 0, &out)) != 0) {
            free(out.v);
        } else {
            *ids = out.v;
            *n = out.n;
        }
        free(buf);
        return rv;
    }
    if (len % 4) {
        free(buf);
        return strata_errf(STRATA_EFORMAT,
                           "%s: %zu bytes is not a whole number of uint32 ids: is it a raw id "
                           "file (drop --ids for text)?",
                           path, len);
    }
    /* In place: each little-endian uint32 becomes an int32 of the same width. */
    int32_t *v = (int32_t *)(void *)buf;
    const uint8_t *b = (const uint8_t *)buf;
    for (size_t i = 0; i < len / 4; i++) {
        uint32_t x = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
                     (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24;
        if (x > INT32_MAX) {
            free(buf);
            return strata_errf(STRATA_EFORMAT, "%s: id %zu is %u, not a token id", path, i, x);
        }
        v[i] = (int32_t)x;
    }
    *ids = v;
    *n = len / 4;
    return 0;
}

size_t ppl_windows(size_t n, uint32_t ctx, uint32_t stride, struct ppl_window *out, size_t max)
{
    size_t k = 0, prev_end = 0;
    if (n < 2 || ctx < 2 || stride == 0) return 0;
    for (size_t b = 0; b < n; b += stride) {
        size_t e = b + ctx < n ? b + ctx : n, s = b + 1 > prev_end ? b + 1 : prev_end;
        if (s < e) {
            if (out && k < max) out[k] = (struct ppl_window){b, e, s};
            k++;
        }
        prev_end = e;
        if (e == n) break;
    }
    return k;
}

/* nll_of: -log softmax(logits)[target], in double. */
static double nll_of(const float *logits, uint32_t n_vocab, int32_t target)
{
    double mx = logits[0], sum = 0.0;
    for (uint32_t i = 1; i < n_vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    for (uint32_t i = 0; i < n_vocab; i++)
        sum += exp((double)logits[i] - mx);
    return mx + log(sum) - (double)logits[target];
}

/* eval_window runs w through a fresh sequence and adds the NLL of its scored tokens. */
static int eval_window(struct backend *f, struct kv_cache *kv, const struct model *m,
                       const int32_t *ids, const struct ppl_window *w, struct backend_token *toks,
                       float *logits, double *nll, uint64_t *scored)
{
    const uint32_t V = m->hp.n_vocab;
    struct kv_seq seq;
    kv_seq_init(&seq);
    int rv = 0;
    for (size_t c = w->begin; c < w->end && !rv; c += PPL_CHUNK) {
        const size_t ce = c + PPL_CHUNK < w->end ? c + PPL_CHUNK : w->end;
        uint32_t nt = 0;
        /* Token q's logits predict q + 1: needed for q in [first - 1, end - 1). */
        for (size_t q = c; q < ce; q++)
            toks[nt++] = (struct backend_token){&seq, ids[q], q + 1 >= w->first && q + 1 < w->end};
        if ((rv = backend_eval(f, toks, nt, logits)) != 0) break;
        const float *row = logits;
        for (size_t q = c; q < ce; q++) {
            if (!(q + 1 >= w->first && q + 1 < w->end)) continue;
            *nll += nll_of(row, V, ids[q + 1]);
            ++*scored;
            row += V;
        }
    }
    kv_seq_fini(kv, &seq);
    return rv;
}

int ppl_eval(const struct model *m, const int32_t *ids, size_t n, const struct ppl_opts *o,
             struct ppl_result *out)
{
    if (o->ctx < 2 || o->stride == 0 || o->stride > o->ctx)
        return strata_errf(STRATA_EINVAL, "ctx %u, stride %u: give ctx >= 2 and 1 <= stride <= ctx",
                           o->ctx, o->stride);
    if (n < 2) return strata_errf(STRATA_EINVAL, "%zu tokens: perplexity needs at least 2", n);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= m->hp.n_vocab)
            return strata_errf(STRATA_EINVAL,
                               "token %zu is id %d, outside the model's vocabulary of %u: was the "
                               "text tokenized with this model's tokenizer?",
                               i, ids[i], m->hp.n_vocab);
    const size_t n_windows = ppl_windows(n, o->ctx, o->stride, NULL, 0);
    struct ppl_window *ws = malloc(n_windows * sizeof *ws);
    struct backend_token *toks = malloc(PPL_CHUNK * sizeof *toks);
    float *logits = malloc((size_t)PPL_CHUNK * m->hp.n_vocab * sizeof *logits);
    struct kv_cache *kv = NULL;
    struct backend *f = NULL;
    int rv;
    if (!ws || !toks || !logits) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for %zu windows of %u tokens", n_windows,
                         o->ctx);
        goto fail;
    }
    ppl_windows(n, o->ctx, o->stride, ws, n_windows);
    struct backend_opts bo = {.n_threads = o->n_threads, .max_pass_tokens = PPL_CHUNK, .n_ctx = o->ctx, .n_seq = 1};
    if ((rv = backend_start(m, &bo, &f)) != 0) goto fail;
    kv = backend_kv(f);
    *out = (struct ppl_result){.n_windows = n_windows};
    for (size_t i = 0; i < n_windows; i++) {
        if ((rv = eval_window(f, kv, m, ids, &ws[i], toks, logits, &out->nll, &out->scored)) != 0)
            goto fail;
        if (o->progress) o->progress(o->arg, i + 1, n_windows, out->nll, out->scored);
    }
    out->perplexity = exp(out->nll / (double)out->scored);
fail:
    backend_close(f);
    free(ws);
    free(toks);
    free(logits);
    return rv;
}
