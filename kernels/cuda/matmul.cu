#include <mma.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matvec.h"

using namespace nvcuda;

#define MM_TILE 64
#define MM_K    32
#define MM_LD   (MM_K + 8) /* pad rows by 16 bytes against bank conflicts */

/* 4 warps, each owning a 32x32 quarter of the 64x64 output tile (2x2 WMMA fragments). */
template <int T>
__global__ void __launch_bounds__(128)
    matmul_kernel(const uint8_t *w, int64_t row_bytes, int64_t ncols, int64_t nrows,
                  const float *x, int64_t n_tok, float *y)
{
    __shared__ __align__(32) half xs[MM_TILE][MM_LD];
    __shared__ __align__(32) half ws[MM_TILE][MM_LD];
    __shared__ __align__(32) float cs[4][16 * 16];
    const int64_t m0 = (int64_t)blockIdx.y * MM_TILE, n0 = (int64_t)blockIdx.x * MM_TILE;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x & (WARP - 1);
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int64_t k0 = 0; k0 < ncols; k0 += MM_K) {
        /* 64 rows x 4 chunks of 8 for each operand: 256 chunks over 128 threads. */
        for (int c = threadIdx.x; c < MM_TILE * (MM_K / 8); c += blockDim.x) {
            int r = c >> 2, kc = (c & 3) * 8;
            float v[8];
            if (n0 + r < nrows)
                deq8<T>(w + (n0 + r) * row_bytes, (k0 + kc) / 8, v);
            else
                for (int i = 0; i < 8; i++) v[i] = 0.0f;
            for (int i = 0; i < 8; i++) ws[r][kc + i] = __float2half(v[i]);
            const float *xr = x + (m0 + r) * ncols + k0 + kc;
            for (int i = 0; i < 8; i++) xs[r][kc + i] = __float2half(m0 + r < n_tok ? xr[i] : 0.0f);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MM_K; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(a[i], &xs[wm + 16 * i][kk], MM_LD);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(b[j], &ws[wn + 16 * j][kk], MM_LD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    /* Through shared memory so the edges of the output are bounds-checked. */
#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            wmma::store_matrix_sync(cs[warp], acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += WARP) {
                int64_t m = m0 + wm + 16 * i + e / 16, n = n0 + wn + 16 * j + e % 16;
                if (m < n_tok && n < nrows) y[m * nrows + n] = cs[warp][e];
            }
            __syncwarp();
        }
    }
}

template <int T>
static void launch(const void *w, int64_t ncols, int64_t nrows, const float *x, int64_t n_tok,
                   float *y, cudaStream_t s)
{
    int64_t row_bytes = ncols / qt<T>::blck * qt<T>::bytes;
    dim3 grid((unsigned)((nrows + MM_TILE - 1) / MM_TILE), (unsigned)((n_tok + MM_TILE - 1) / MM_TILE));
    matmul_kernel<T><<<grid, 128, 0, s>>>((const uint8_t *)w, row_bytes, ncols, nrows, x, n_tok, y);
}

extern "C" int cu_matmul(uint32_t type, const void *w, int64_t ncols, int64_t nrows, const float *x,
                         int64_t n_tok, float *y, void *stream)
{
    const struct qtype_info *ti = qtype_get(type);
    if (!ti || !cu_type_supported(type))
        return strata_errf(STRATA_EUNSUPPORTED, "%s weights are computed on the CPU, not the GPU",
                           qtype_name(type));
    if (ncols % MM_K || ncols % ti->blck || n_tok <= 0 || nrows <= 0)
        return strata_errf(STRATA_EINVAL, "cu_matmul: ncols %lld must be a multiple of 32 and %u",
                           (long long)ncols, ti->blck);
    cudaStream_t s = (cudaStream_t)stream;
#define L(T) launch<T>(w, ncols, nrows, x, n_tok, y, s)
    CU_TYPE_SWITCH(type, L)
#undef L
    return cu_launch_check();
}
