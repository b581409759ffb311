/* rowsum.cuh — the one CTA-wide sum of the wide-row RMSNorm, shared by every kernel that ends in
 * one (norm.cu's, the MoE combine's), so the fused and the separate steps give the same bits.
 *
 * cta_sum<NT>(s, red): every thread of an NT-thread CTA gets the sum of the threads' s: the warps'
 * butterflies, then the warps' values in warp order. red holds NT / 32 floats; one barrier, so a
 * second call needs another red or a barrier between.
 */
#ifndef STRATA_CUDA_ROWSUM_CUH
#define STRATA_CUDA_ROWSUM_CUH

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/norm.h"

#define ROW_NORM_THREADS 256             /* threads of a wide row's CTA */
#define ROW_NORM_MIN     CU_ROW_NORM_MIN /* rows at least this wide are normed by a CTA */
#define ROW_MAXV         16 /* a thread's elements kept in registers: rows up to 4096 wide */

template <int NT> __device__ __forceinline__ float cta_sum(float s, float *red)
{
    s = warp_sum(s);
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = s;
    __syncthreads();
    s = red[0];
#pragma unroll
    for (int i = 1; i < NT / WARP; i++) s += red[i];
    return s;
}

/* row_scale: RMSNorm's 1 / sqrt(mean + eps) from the sum of squares. */
__device__ __forceinline__ float row_scale(float ss, int64_t width, float eps)
{
    return 1.0f / sqrtf(ss / (float)width + eps);
}

#endif
