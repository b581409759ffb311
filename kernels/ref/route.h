/* route — DeepSeek-V3-style expert selection (DeepSeek-V3 / Kimi K2's deepseek2, GLM-4.5's
 * glm4moe), as llama.cpp's build_moe_ffn computes it:
 *   p = sigmoid(logits) (or softmax over all experts);
 *   s = p + bias (the selection bias exp_probs_b; s = p without one);
 *   with n_group > 1 groups of n_expert / n_group experts, a group scores the sum of its two
 *   largest s, the n_group_used best groups stay and the others' experts get s = -inf;
 *   the k largest s are the experts; their weights are the unbiased p, divided by their sum when
 *   norm, then multiplied by scale (the routed scaling factor).
 * Scalar and deterministic (ties go to the lower index, ops_topk's rule): every ISA and thread
 * count selects the same experts with the same weights.
 */
#ifndef STRATA_ROUTE_H
#define STRATA_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

struct route_opts {
    uint32_t n_expert, k;
    bool softmax;          /* softmax gating instead of sigmoid */
    const float *bias;     /* (n_expert) selection bias, or NULL */
    uint32_t n_group;      /* expert groups (0 or 1: none) */
    uint32_t n_group_used; /* groups kept (n_group > 1) */
    bool norm;             /* divide the k weights by their sum */
    float scale;           /* then multiply them by this */
};

/* route_biased: logits (n_expert, overwritten with p), scratch (n_expert floats), sel and w (k). */
void route_biased(const struct route_opts *o, float *logits, float *scratch, uint32_t *sel,
                  float *w);

#endif
