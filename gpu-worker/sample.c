#include "gpu-worker/sample.h"
#include "common/base/err.h"
#include "kernels/ref/ops.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

struct cand {
    int32_t id;
    float logit;
};

struct sample {
    uint32_t n_vocab;
    struct cand *c;  /* (n_vocab) candidates */
    uint32_t *count; /* (n_vocab) occurrences in the penalty window; zero between calls */
};

void sample_params_default(struct sample_params *p)
{
    *p = (struct sample_params){.temperature = 0.0f, .top_p = 1.0f, .repeat_penalty = 1.0f};
}

int sample_init(uint32_t n_vocab, struct sample **out)
{
    struct sample *s = calloc(1, sizeof *s);
    if (s) {
        s->n_vocab = n_vocab;
        s->c = malloc((size_t)n_vocab * sizeof *s->c);
        s->count = calloc(n_vocab, sizeof *s->count);
    }
    if (!s || !s->c || !s->count) {
        sample_fini(s);
        return strata_errf(STRATA_ENOMEM, "out of memory for a sampler of %u tokens", n_vocab);
    }
    *out = s;
    return 0;
}

void sample_fini(struct sample *s)
{
    if (!s) return;
    free(s->c);
    free(s->count);
    free(s);
}

static uint64_t splitmix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double sample_uniform(uint64_t seed, uint64_t pos)
{
    return (double)(splitmix64(splitmix64(seed) ^ pos) >> 11) * 0x1.0p-53;
}

/* Most likely first; equal logits by lower id, so the order is total and qsort deterministic. */
static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* logprobs fills out's logprob and top-N from the raw logits. */
static void logprobs(const struct sample_params *p, const float *logits, uint32_t n,
                     struct sample_result *out)
{
    float max = -INFINITY;
    for (uint32_t i = 0; i < n; i++) max = logits[i] > max ? logits[i] : max;
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) sum += exp((double)logits[i] - max);
    const double lse = max + log(sum);
    out->logprob = (float)(logits[out->id] - lse);
    /* Insertion into a short sorted list: N <= 20, one pass over the vocabulary. */
    struct cand top[SAMPLE_MAX_LOGPROBS];
    const uint32_t k = p->n_logprobs < n ? p->n_logprobs : n;
    uint32_t have = 0;
    for (uint32_t i = 0; i < n && k; i++) {
        const struct cand c = {(int32_t)i, logits[i]};
        if (have == k && cand_cmp(&c, &top[k - 1]) >= 0) continue;
        uint32_t j = have < k ? have++ : k - 1;
        for (; j > 0 && cand_cmp(&c, &top[j - 1]) < 0; j--) top[j] = top[j - 1];
        top[j] = c;
    }
    out->n_top = have;
    for (uint32_t j = 0; j < have; j++)
        out->top[j] = (struct sample_logprob){top[j].id, (float)(top[j].logit - lse)};
}

int sample_token(struct sample *s, const struct sample_params *p, const float *logits,
                 const int32_t *window, uint32_t n_window, uint64_t pos, struct sample_result *out)
{
    const uint32_t n = s->n_vocab;
    if (p->n_logprobs > SAMPLE_MAX_LOGPROBS)
        return strata_errf(STRATA_EINVAL, "%u logprobs asked, at most %d", p->n_logprobs,
                           SAMPLE_MAX_LOGPROBS);
    if (!(p->top_p > 0.0f) || !(p->min_p >= 0.0f && p->min_p <= 1.0f) ||
        !(p->repeat_penalty > 0.0f) || isnan(p->temperature))
        return strata_errf(STRATA_EINVAL,
                           "sampling parameters top_p %g, min_p %g, repeat_penalty %g, "
                           "temperature %g: top_p and repeat_penalty must be > 0, min_p in [0, 1]",
                           p->top_p, p->min_p, p->repeat_penalty, p->temperature);
    for (uint32_t i = 0; i < n_window; i++)
        if (window[i] < 0 || (uint32_t)window[i] >= n)
            return strata_errf(STRATA_EINVAL, "penalty window token %d is outside the vocabulary "
                               "of %u", window[i], n);

    /* greedy over the raw logits needs no candidate list: neutral penalties leave every logit's
     * bits as they are */
    const bool penalized = n_window && (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
                                        p->frequency_penalty != 0.0f);
    if (p->temperature <= 0.0f && !p->allow && !penalized) {
        out->id = (int32_t)ops_argmax(logits, n);
        logprobs(p, logits, n, out);
        return 0;
    }
    for (uint32_t i = 0; i < n; i++) s->c[i] = (struct cand){(int32_t)i, logits[i]};
    for (uint32_t i = 0; i < n_window; i++) s->count[window[i]]++;
    for (uint32_t i = 0; i < n_window; i++) {
        const int32_t id = window[i];
        const uint32_t c = s->count[id];
        if (!c) continue; /* already penalized */
        float *l = &s->c[id].logit;
        *l = *l > 0.0f ? *l / p->repeat_penalty : *l * p->repeat_penalty;
        *l -= (float)c * p->frequency_penalty + p->presence_penalty;
        s->count[id] = 0;
    }

    uint32_t m = n;
    if (p->allow) { /* the grammar's tokens only, in id order (ties still go to the lower id) */
        m = 0;
        for (uint32_t i = 0; i < n; i++)
            if ((p->allow[i >> 5] >> (i & 31)) & 1) s->c[m++] = s->c[i];
        if (m == 0)
            return strata_errf(STRATA_EINVAL, "the grammar allows no token here: no token of the "
                               "vocabulary continues it");
    }
    if (p->temperature <= 0.0f) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < m; i++)
            if (s->c[i].logit > s->c[best].logit) best = i;
        out->id = s->c[best].id;
        logprobs(p, logits, n, out);
        return 0;
    }
    qsort(s->c, m, sizeof *s->c, cand_cmp);
    if (p->top_k && p->top_k < m) m = p->top_k;
    /* Probabilities at temperature 1 for top-p and min-p, as llama.cpp's chain computes them. */
    const float max = s->c[0].logit;
    if (p->top_p < 1.0f) {
        double sum = 0.0, cum = 0.0;
        for (uint32_t i = 0; i < m; i++) sum += exp((double)s->c[i].logit - max);
        uint32_t keep = m;
        for (uint32_t i = 0; i < m; i++) {
            cum += exp((double)s->c[i].logit - max) / sum;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        m = keep;
    }
    if (p->min_p > 0.0f) {
        const float floor = max + logf(p->min_p);
        uint32_t keep = 1;
        while (keep < m && s->c[keep].logit >= floor) keep++;
        m = keep;
    }
    double sum = 0.0;
    for (uint32_t i = 0; i < m; i++) sum += exp(((double)s->c[i].logit - max) / p->temperature);
    const double target = sample_uniform(p->seed, pos) * sum;
    double cum = 0.0;
    uint32_t pick = m - 1; /* rounding may leave cum a hair below target: take the last */
    for (uint32_t i = 0; i < m; i++) {
        cum += exp(((double)s->c[i].logit - max) / p->temperature);
        if (cum > target) {
            pick = i;
            break;
        }
    }
    out->id = s->c[pick].id;
    logprobs(p, logits, n, out);
    return 0;
}
