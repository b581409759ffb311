/* router.cuh — one token's router softmax and top-k by one warp (router.cu's kernel, and the fused
 * routing and grouping of moe_group.cu: the same code, so the same picks and weights).
 */
#ifndef STRATA_CUDA_ROUTER_CUH
#define STRATA_CUDA_ROUTER_CUH

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/router.h"

#define RT_PER_LANE 8 /* 256 experts / 32 lanes */

/* router_token: token t's k picks (ids, weights [t * k + j]) from its n_exp logits; the calling
 * warp's 32 lanes all take part. */
__device__ __forceinline__ void router_token(const float *logits, int64_t t, int n_exp, int k,
                                             int mode, int renorm, int32_t *ids, float *weights)
{
    int lane = threadIdx.x & (WARP - 1);
    const float *l = logits + t * n_exp;
    float v[RT_PER_LANE];
#pragma unroll
    for (int i = 0; i < RT_PER_LANE; i++) {
        int e = lane + i * WARP;
        v[i] = e < n_exp ? l[e] : -INFINITY;
    }
    if (mode == CU_ROUTER_SOFTMAX_TOPK) {
        float m = -INFINITY;
#pragma unroll
        for (int i = 0; i < RT_PER_LANE; i++)
            m = fmaxf(m, v[i]);
        m = warp_max(m);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < RT_PER_LANE; i++) {
            int e = lane + i * WARP;
            v[i] = e < n_exp ? expf(v[i] - m) : -1.0f; /* probabilities; -1 marks padding */
            if (e < n_exp) s += v[i];
        }
        s = warp_sum(s);
#pragma unroll
        for (int i = 0; i < RT_PER_LANE; i++)
            v[i] = v[i] >= 0.0f ? v[i] / s : -INFINITY;
    }
    /* k rounds of a warp-wide argmax; ties to the lower id. */
    float sel_sum = 0.0f, top = 0.0f;
    for (int j = 0; j < k; j++) {
        float best = -INFINITY;
        int bid = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < RT_PER_LANE; i++) {
            int e = lane + i * WARP;
            if (v[i] > best || (v[i] == best && e < bid)) best = v[i], bid = e;
        }
#pragma unroll
        for (int o = WARP / 2; o > 0; o >>= 1) {
            float ob = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bid, o);
            if (ob > best || (ob == best && oi < bid)) best = ob, bid = oi;
        }
        if (j == 0) top = best;
        float w = mode == CU_ROUTER_SOFTMAX_TOPK ? best : expf(best - top);
        sel_sum += w;
        if (lane == 0) ids[t * k + j] = bid, weights[t * k + j] = w;
        if ((bid & (WARP - 1)) == lane) {
#pragma unroll
            for (int i = 0; i < RT_PER_LANE; i++)
                if (i == bid / WARP) v[i] = -INFINITY;
        }
    }
    __syncwarp();
    if (lane == 0 && (mode == CU_ROUTER_TOPK_SOFTMAX || renorm))
        for (int j = 0; j < k; j++)
            weights[t * k + j] /= sel_sum;
}

#endif
