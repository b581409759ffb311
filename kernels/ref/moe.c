#include "kernels/ref/moe.h"

#include <string.h>

int moe_group(const int32_t *ids, int64_t n_tok, int k, uint32_t n_expert, const uint8_t *mask,
              uint32_t max_pairs, struct moe_group *groups, int32_t *pair_idx)
{
    /* One scan of the pairs per selected expert, O(experts x pairs) with no scratch: a decode
     * window has a few hundred pairs; a 512-token prompt chunk over 128 experts is ~0.5M compares
     * a layer, small beside its matmuls. */
    const int64_t n = n_tok * k;
    int ng = 0, np = 0;
    for (uint32_t e = 0; e < n_expert; e++) {
        if (mask && !mask[e]) continue;
        int run = 0;
        for (int64_t p = 0; p < n; p++) {
            if (ids[p] != (int32_t)e) continue;
            if (run == 0 || (uint32_t)groups[ng - 1].count == max_pairs) {
                groups[ng++] = (struct moe_group){(int32_t)e, np, 0};
                run = 1;
            }
            groups[ng - 1].count++;
            pair_idx[np++] = (int32_t)p;
        }
    }
    return ng;
}

void moe_combine(const float *out, const int32_t *ids, uint32_t t0, uint32_t t1, int k,
                 size_t n_embd, float *y)
{
    for (uint32_t t = t0; t < t1; t++) {
        float *o = y + (size_t)t * n_embd;
        const int32_t *id = ids + (size_t)t * k;
        memset(o, 0, n_embd * sizeof(float));
        /* the k ids of a token are distinct: take them smallest first */
        int32_t last = -1;
        for (int i = 0; i < k; i++) {
            int best = -1;
            for (int j = 0; j < k; j++)
                if (id[j] > last && (best < 0 || id[j] < id[best])) best = j;
            last = id[best];
            const float *x = out + ((size_t)t * k + best) * n_embd;
            for (size_t d = 0; d < n_embd; d++)
                o[d] += x[d];
        }
    }
}
