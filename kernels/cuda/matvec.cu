#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matvec.h"

/* 4 warps per block, one output row per warp: enough independent rows in flight to cover HBM
 * latency on an H200 at the 2048-4096 wide shapes of Qwen3-30B-A3B. */
#define MV_WARPS 4

/* warp_dot: the warp's lanes stride over 32-element chunks of one weight row (one scale decode
 * and 16-byte weight loads per chunk); each lane keeps a partial sum per activation row; the caller
 * reduces across the warp. */
template <int T, int B>
__device__ __forceinline__ void warp_dot(const uint8_t *wrow, int64_t ncols, const float *x,
                                         int64_t ldx, int n_act, float acc[B])
{
    const int lane = threadIdx.x & (WARP - 1);
    const int64_t nch = ncols / 32;
    for (int64_t c = lane; c < nch; c += WARP) {
        float v[32];
        deq32<T>(wrow, c, v);
#pragma unroll
        for (int b = 0; b < B; b++) {
            if (b < n_act) {
                const float4 *xp = (const float4 *)(x + b * ldx + c * 32);
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float4 xv = __ldg(xp + i);
                    s += v[4 * i] * xv.x + v[4 * i + 1] * xv.y + v[4 * i + 2] * xv.z + v[4 * i + 3] * xv.w;
                }
                acc[b] += s;
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
    int64_t blk = ti->blck < 32 ? 32 : ti->blck;
    if (n_act < 1 || n_act > CU_MATVEC_MAX_ACT || ncols <= 0 || nrows <= 0 || ncols % blk)
        return strata_errf(STRATA_EINVAL, "cu_matvec: n_act %d (1..16), ncols %lld (multiple of %lld)",
                           n_act, (long long)ncols, (long long)blk);
    cudaStream_t s = (cudaStream_t)stream;
#define L(T) launch<T>(w, ncols, nrows, x, n_act, y, s)
    CU_TYPE_SWITCH(type, L)
#undef L
    return cu_launch_check();
}
