#include <mma.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matvec.h"
#include "kernels/cuda/mmq.cuh"
#include "kernels/cuda/qact.h"
#include "kernels/cuda/qdec.cuh"

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
    pdl_enter();
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
    cu_launch(matmul_kernel<T>, grid, 128, 0, s, (const uint8_t *)w, row_bytes, ncols, nrows, x,
              n_tok, y);
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

/* ---- the bit-exact product: int8 tensor cores, qdot_ref's arithmetic ------------------------ */

/* matmul_q: CTA (x, y) takes rows 64x .. 64x + 63 times tokens BN y .. BN y + BN - 1 on mmq.cuh's
 * tile. */
template <int T, int BN>
__global__ void __launch_bounds__(MMQ_THREADS)
    matmul_q(const uint8_t *w, int nb, int nrows, const uint8_t *act, int64_t arb, int n_tok,
             float *y)
{
    pdl_enter();
    using M = mmq<T, BN>;
    extern __shared__ __align__(16) uint8_t mq_smem[];
    __shared__ const uint8_t *xrow[BN];
    const int r0 = blockIdx.x * MMQ_BM, t0 = blockIdx.y * BN, nv = min(BN, n_tok - t0);
    for (int j = threadIdx.x; j < BN; j += MMQ_THREADS)
        xrow[j] = j < nv ? act + (int64_t)(t0 + j) * arb : NULL;
    float acc[M::NT][4];
    M::run(mq_smem, w, nb, nrows, r0, xrow, nv, acc); /* its first barrier publishes xrow */
#pragma unroll
    for (int n = 0; n < M::NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = r0 + M::row(i), t = t0 + M::col(n, i);
            if (r < nrows && t < n_tok) y[(int64_t)t * nrows + r] = acc[n][i];
        }
}

template <int T, int BN>
static void launch_q_bn(const uint8_t *w, int nb, int nrows, const uint8_t *act, int64_t arb,
                        int n_tok, float *y, cudaStream_t s)
{
    static const bool attr = cudaFuncSetAttribute(matmul_q<T, BN>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)mmq<T, BN>::SMEM) == cudaSuccess;
    (void)attr;
    const dim3 grid((unsigned)((nrows + MMQ_BM - 1) / MMQ_BM), (unsigned)((n_tok + BN - 1) / BN));
    cu_launch(matmul_q<T, BN>, grid, MMQ_THREADS, mmq<T, BN>::SMEM, s, w, nb, nrows, act, arb,
              n_tok, y);
}

template <int T>
static void launch_q(const uint8_t *w, int nb, int nrows, const uint8_t *act, int64_t arb, int n_tok,
                     float *y, cudaStream_t s)
{
    if constexpr (qt<T>::blck > 1) {
        if (n_tok > 32) /* 64-token tiles; a short chunk's on 32 */
            launch_q_bn<T, 64>(w, nb, nrows, act, arb, n_tok, y, s);
        else
            launch_q_bn<T, 32>(w, nb, nrows, act, arb, n_tok, y, s);
    }
}

extern "C" int cu_matmul_q(uint32_t type, const void *w, int64_t ncols, int64_t nrows,
                           const void *act, int64_t n_tok, float *y, void *stream)
{
    const struct qtype_info *ti = qtype_get(type);
    if (!ti || ti->blck == 1 || !cu_type_supported(type))
        return strata_errf(STRATA_EUNSUPPORTED,
                           "cu_matmul_q: %s weights have no exact GPU product (quantized GPU "
                           "types only)", qtype_name(type));
    if (ncols <= 0 || ncols % ti->blck || nrows <= 0 || n_tok <= 0 || nrows > INT32_MAX ||
        ncols > INT32_MAX / 2 || n_tok > 65535LL * 32 || (uintptr_t)w % 16)
        return strata_errf(STRATA_EINVAL,
                           "cu_matmul_q: %lld rows of %lld columns (a multiple of %u), %lld tokens, "
                           "weights at a multiple of 16 bytes",
                           (long long)nrows, (long long)ncols, ti->blck, (long long)n_tok);
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t arb = (int64_t)cu_act_row_bytes(type, ncols);
    const int nb = (int)(ncols / ti->blck);
#define L(T) launch_q<T>((const uint8_t *)w, nb, (int)nrows, (const uint8_t *)act, arb, (int)n_tok, y, s)
    CU_TYPE_SWITCH(type, L)
#undef L
    return cu_launch_check();
}
