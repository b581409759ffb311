#include "kernels/cuda/router.cuh"

__global__ void router_kernel(const float *logits, int64_t n_tok, int n_exp, int k, int mode,
                              int renorm, int32_t *ids, float *weights)
{
    pdl_enter();
    int64_t t = (int64_t)blockIdx.x * 4 + threadIdx.x / WARP;
    if (t >= n_tok) return;
    router_token(logits, t, n_exp, k, mode, renorm, ids, weights);
}

extern "C" int cu_router_topk(const float *logits, int64_t n_tok, int n_exp, int k,
                              enum cu_router_mode mode, int renorm, int32_t *ids, float *weights,
                              void *stream)
{
    if (n_exp < 1 || n_exp > RT_PER_LANE * WARP || k < 1 || k > 16 || k > n_exp)
        return strata_errf(STRATA_EINVAL, "cu_router_topk: %d experts (<= 256), top-%d", n_exp, k);
    dim3 grid((unsigned)((n_tok + 3) / 4));
    cu_launch(router_kernel, grid, 4 * WARP, 0, (cudaStream_t)stream, logits, n_tok, n_exp, k,
              (int)mode, renorm, ids, weights);
    return cu_launch_check();
}
