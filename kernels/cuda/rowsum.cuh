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
#define ROW_SYNC_CHUNKS  CU_ROW_SYNC_CHUNKS /* chunks of a row split over CTAs, at most */

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

/* The sum of squares of a wide row has one order whatever the launch, so a row normed by one CTA
 * and a row split over CTAs give the same bits: the row is cut into chunks of ROW_NORM_THREADS
 * elements (chunk m: elements m * ROW_NORM_THREADS + tid, tid the thread), each chunk's squares
 * summed by cta_sum, then the chunks' sums added in chunk order. */

/* row_chunks_sum: that total in one CTA from a thread's M chunk values (sq[m], its element of chunk
 * m squared; zero past the row), n_chunks of them real; red holds ROW_MAXV * NT / 32 floats. One
 * barrier. */
template <int NT, int M>
__device__ __forceinline__ float row_chunks_sum(const float (&sq)[M], int n_chunks, float *red)
{
#pragma unroll
    for (int m = 0; m < M; m++) {
        if (m >= n_chunks) break;
        const float s = warp_sum(sq[m]);
        if (threadIdx.x % WARP == 0) red[m * (NT / WARP) + threadIdx.x / WARP] = s;
    }
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int m = 0; m < M; m++) {
        if (m >= n_chunks) break;
        float p = red[m * (NT / WARP)];
#pragma unroll
        for (int i = 1; i < NT / WARP; i++) p += red[m * (NT / WARP) + i];
        tot = m ? tot + p : p;
    }
    return tot;
}

/* A row split over CTAs (one a chunk) meets through struct row_sync, one a row in device memory
 * (cu_row_sync_bytes: zeroed once, then reused by launch after launch in one stream): the CTAs'
 * chunk sums, an arrival count and a generation. The last CTA to arrive resets the count and
 * bumps the generation; the others wait for it. Every CTA of the row must be resident at once:
 * launchers split only grids of at most one CTA per SM. */
struct row_sync {
    unsigned arrived, gen;
    float part[ROW_SYNC_CHUNKS];
};

/* row_split_sum: chunk c's sum p (every thread's, as cta_sum gives it) published, the row's CTAs
 * met, and the row's total in row_chunks_sum's order returned to every thread. */
__device__ __forceinline__ float row_split_sum(float p, struct row_sync *rs, int c, int n_chunks)
{
    __shared__ float tot;
    if (threadIdx.x == 0) {
        volatile struct row_sync *v = rs;
        const unsigned g0 = v->gen;
        v->part[c] = p;
        __threadfence();
        if (atomicAdd(&rs->arrived, 1u) == (unsigned)n_chunks - 1) {
            rs->arrived = 0;
            __threadfence();
            atomicAdd(&rs->gen, 1u);
        } else {
            while (v->gen == g0) __nanosleep(20);
        }
        __threadfence();
        float t = v->part[0];
        for (int i = 1; i < n_chunks; i++) t += v->part[i];
        tot = t;
    }
    __syncthreads();
    return tot;
}

#endif
