#include "kernels/cuda/common.cuh"
#include "kernels/cuda/router.h"

#define RT_PER_LANE 8 /* 256 experts / 32 lanes */

__global__ void router_kernel(const float *logits, int64_t n_tok, int n_exp, int k, int mode,
                              int renorm, int32_t *ids, float *weights)
{
    int64_t t = (int64_t)blockIdx.x * 4 + threadIdx.x / WARP;
    int lane = threadIdx.x & (WARP - 1);
    if (t >= n_tok) return;
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
        for (int i = 0; i < RT_PER_LANE; i++) m = fmaxf(m, v[i]);
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
        for (int i = 0; i < RT_PER_LANE; i++) v[i] = v[i] >= 0.0f ? v[i] / s : -INFINITY;
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
        for (int j = 0; j < k; j++) weights[t * k + j] /= sel_sum;
}

extern "C" int cu_router_topk(const float *logits, int64_t n_tok, int n_exp, int k,
                              enum cu_router_mode mode, int renorm, int32_t *ids, float *weights,
                              void *stream)
{
    if (n_exp < 1 || n_exp > RT_PER_LANE * WARP || k < 1 || k > 16 || k > n_exp)
        return strata_errf(STRATA_EINVAL, "cu_router_topk: %d experts (<= 256), top-%d", n_exp, k);
    dim3 grid((unsigned)((n_tok + 3) / 4));
    router_kernel<<<grid, 4 * WARP, 0, (cudaStream_t)stream>>>(logits, n_tok, n_exp, k, (int)mode,
                                                               renorm, ids, weights);
    return cu_launch_check();
}
