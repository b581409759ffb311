/* sample — picking the next token from logits: penalties, greedy, temperature, top-k, top-p,
 * min-p, a seeded counter-based random stream, and logprobs with top-N alternatives.
 *
 * The order is llama.cpp's default chain: penalties (repetition, presence, frequency) -> grammar
 * mask -> top-k -> top-p -> min-p -> temperature -> draw. Temperature <= 0 is greedy (argmax after penalties).
 * Logprobs are the log-softmax of the raw logits, before penalties and filters (DESIGN 3.4).
 * The uniform draw for the token at position pos is a pure function of (seed, pos)
 * (sample_uniform), so a request resubmitted with its history continues the same stream, and a
 * batch's neighbours never shift it. Ties always go to the lower token id.
 * A sampler owns scratch for one vocabulary; one thread uses it at a time.
 */
#ifndef STRATA_SAMPLE_H
#define STRATA_SAMPLE_H

#include <stdint.h>

#define SAMPLE_MAX_LOGPROBS 20 /* most alternatives reported per token (OpenAI's top_logprobs) */

struct sample_params {
    float temperature;       /* <= 0: greedy */
    uint32_t top_k;          /* keep the k most likely; 0: off */
    float top_p;             /* keep the smallest set of probability >= top_p; >= 1: off */
    float min_p;             /* keep tokens with p >= min_p * p_max; 0: off */
    float repeat_penalty;    /* logits of tokens in the penalty window: / if > 0, * if < 0; 1: off */
    float presence_penalty;  /* subtracted once from a token present in the window */
    float frequency_penalty; /* subtracted per occurrence in the window */
    uint64_t seed;
    uint32_t n_logprobs;  /* alternatives to report, 0..SAMPLE_MAX_LOGPROBS */
    const uint32_t *allow; /* a grammar's mask: only tokens whose bit is set (bit i of word
                              i / 32) may be drawn, greedy or not; applied after the penalties and
                              before the filters. NULL: every token */
};

struct sample_logprob {
    int32_t id;
    float logprob;
};

struct sample_result {
    int32_t id;    /* the chosen token */
    float logprob; /* its log-softmax over the raw logits */
    uint32_t n_top;
    struct sample_logprob top[SAMPLE_MAX_LOGPROBS]; /* most likely first, by raw logits */
};

struct sample;

/* sample_params_default: greedy, no filters or penalties, seed 0, no logprobs. */
void sample_params_default(struct sample_params *p);

/* sample_init allocates scratch for n_vocab tokens. Caller owns *out (sample_fini). */
int sample_init(uint32_t n_vocab, struct sample **out);
void sample_fini(struct sample *s);

/* sample_uniform: the draw in [0, 1) for the token at position pos under seed. */
double sample_uniform(uint64_t seed, uint64_t pos);

/* sample_token picks the token at position pos from logits (n_vocab; not modified). The penalty
 * window is window[0..n_window) (token ids; the caller chooses: last N generated, or with the
 * prompt). STRATA_EINVAL for a bad parameter or a window id outside the vocabulary, and when
 * p->allow allows no token. */
int sample_token(struct sample *s, const struct sample_params *p, const float *logits,
                 const int32_t *window, uint32_t n_window, uint64_t pos, struct sample_result *out);

#endif
