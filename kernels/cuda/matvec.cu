#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matvec.h"

/* 4 warps per block, one output row per warp: enough independent rows in flight to cover HBM
 * latency on an H200 at the 2048-4096 wide shapes of Qwen3-30B-A3B. */
#define MV_WARPS 4

/* warp_dot: the warp's lanes stride over 8-element chunks of one weight row; each lane keeps a
 * partial sum per activation row; the caller reduces across the warp. Two chunks per iteration
 * keep two weight loads in flight per lane. */
template <int T, int B>
__device__ __forceinline__ void warp_dot(const uint8_t *wrow, int64_t ncols, const float *x,
                                         int64_t ldx, int n_act, float acc[B])
{
    const int lane = threadIdx.x & (WARP - 1);
    const int64_t nch = ncols / 8;
    for (int64_t c = lane; c < nch; c += WARP) {
        float v[8];
        deq8<T>(wrow, c, v);
#pragma unroll
        for (int b = 0; b < B; b++) {
            if (b < n_act) {
                const float4 *xp = (const float4 *)(x + b * ldx + c * 8);
                float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
                acc[b] += v[0] * x0.x + v[1] * x0.y + v[2] * x0.z + v[3] * x0.w + v[4] * x1.x +
                          v[5] * x1.y + v[6] * x1.z + v[7] * x1.w;
            }
        }
    }
}

template <int T, int B>
__global__ void __launch_bounds__(MV_WARPS *WARP)
    matvec_kernel(const uint8_t *w, int64_t row_bytes, int64_t ncols, int64_t nrows,
                  const float *x, int n_act, float *y)
{
    const int64_t row = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x / WARP);
    if (row >= nrows) return;
    float acc[B];
#pragma unroll
    for (int b = 0; b < B; b++) acc[b] = 0.0f;
    warp_dot<T, B>(w + row * row_bytes, ncols, x, ncols, n_act, acc);
#pragma unroll
    for (int b = 0; b < B; b++) {
        float s = warp_sum(acc[b]);
        if (b < n_act && (threadIdx.x & (WARP - 1)) == 0) y[b * nrows + row] = s;
    }
}

extern "C" bool cu_type_supported(uint32_t type)
{
    switch (type) {
    case QT_F32: case QT_F16: case QT_BF16: case QT_Q8_0: case QT_Q5_0: case QT_Q4_K: case QT_Q6_K:
        return true;
    default:
        return false;
    }
}

template <int T>
static void launch(const void *w, int64_t ncols, int64_t nrows, const float *x, int n_act, float *y,
                   cudaStream_t s)
{
    int64_t row_bytes = ncols / qt<T>::blck * qt<T>::bytes;
    dim3 grid((unsigned)((nrows + MV_WARPS - 1) / MV_WARPS));
    const uint8_t *wp = (const uint8_t *)w;
    /* Specialize the activation count in steps so small batches keep few registers. */
    if (n_act == 1)
        matvec_kernel<T, 1><<<grid, MV_WARPS * WARP, 0, s>>>(wp, row_bytes, ncols, nrows, x, n_act, y);
    else if (n_act <= 4)
        matvec_kernel<T, 4><<<grid, MV_WARPS * WARP, 0, s>>>(wp, row_bytes, ncols, nrows, x, n_act, y);
    else if (n_act <= 8)
        matvec_kernel<T, 8><<<grid, MV_WARPS * WARP, 0, s>>>(wp, row_bytes, ncols, nrows, x, n_act, y);
    else
        matvec_kernel<T, 16><<<grid, MV_WARPS * WARP, 0, s>>>(wp, row_bytes, ncols, nrows, x, n_act, y);
}

extern "C" int cu_matvec(uint32_t type, const void *w, int64_t ncols, int64_t nrows, const float *x,
                         int n_act, float *y, void *stream)
{
    if (!cu_type_supported(type))
        return strata_errf(STRATA_EUNSUPPORTED, "%s weights are computed on the CPU, not the GPU",
                           qtype_name(type));
    const struct qtype_info *ti = qtype_get(type);
    int64_t blk = ti->blck < 8 ? 8 : ti->blck;
    if (n_act < 1 || n_act > CU_MATVEC_MAX_ACT || ncols <= 0 || nrows <= 0 || ncols % blk)
        return strata_errf(STRATA_EINVAL, "cu_matvec: n_act %d (1..16), ncols %lld (multiple of %lld)",
                           n_act, (long long)ncols, (long long)blk);
    cudaStream_t s = (cudaStream_t)stream;
#define L(T) launch<T>(w, ncols, nrows, x, n_act, y, s)
    CU_TYPE_SWITCH(type, L)
#undef L
    return cu_launch_check();
}
