#include <stdlib.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/expf.cuh"
#include "kernels/cuda/mmq.cuh"
#include "kernels/cuda/moe_mma.h"
#include "kernels/cuda/qdec.cuh"

/* cu_matmul_q's tile (matmul.cu) over a group: CTA (x, y) takes rows 64x .. 64x + 63 of the part
 * for group y's pairs (at most CU_MOE_MMA_PAIRS, one MMA column each, their activation rows found
 * through pair_idx). Per weight block: the rows decoded to their integers (qdec.cuh), one MMA per
 * (sub-block, 8 pairs), the exact integer sums scaled in integers, and each block's float term
 * (dx * d) * isum - (dx * dmin) * msum added to the (row, pair) sum block after block: qdot_ref's
 * arithmetic, so the same bits as moe_part_q. GU: the gate's tile and then the up's, with
 * mf_swiglu in the epilogue; otherwise out[p * ld + r], times scale[p] when set. */
#define MM_BM 64
#define MM_BN 32
#define MM_NT (MM_BN / 8)

template <int T, bool GU> __global__ void __launch_bounds__(128) moe_mma_v0(struct cu_moe_mma_task t)
{
    pdl_enter();
    if ((int)blockIdx.y >= (t.n_groups ? *t.n_groups : t.max_groups)) return;
    using D = qdec<T>;
    constexpr int BLK = qt<T>::blck, BYTES = qt<T>::bytes, SUB = D::SUB, NSUB = BLK / SUB;
    constexpr int LD = BLK + 16, NP = GU ? 2 : 1;
    __shared__ __align__(16) int8_t wq[MM_BM][LD];
    __shared__ __align__(16) int8_t xq[MM_BN][LD];
    __shared__ int wsc[MM_BM][NSUB], wmn[MM_BM][NSUB], xs[MM_BN][NSUB];
    __shared__ float wd[MM_BM], wdm[MM_BM], xd[MM_BN];
    __shared__ int pair[MM_BN];

    const struct moe_group grp = t.groups[blockIdx.y];
    const int h0 = blockIdx.z * MM_BN, count = min(grp.count - h0, MM_BN);
    if (count <= 0) return;
    if (threadIdx.x < MM_BN)
        pair[threadIdx.x] = threadIdx.x < count ? t.pair_idx[grp.first + h0 + threadIdx.x] : 0;
    const uint8_t *blob = t.slot_ptr[grp.expert];
    const int nb = t.ncols / BLK, ncols = t.ncols, nrows = t.nrows, r0 = blockIdx.x * MM_BM;
    const int64_t row_bytes = (int64_t)nb * BYTES;
    const uint8_t *act = (const uint8_t *)t.act;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane >> 2, tq = lane & 3;
    const int wr = warp * 16;
    float acc[NP][MM_NT][4];
#pragma unroll
    for (int q = 0; q < NP; q++)
#pragma unroll
        for (int n = 0; n < MM_NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[q][n][i] = 0.0f;

#pragma unroll
    for (int q = 0; q < NP; q++) {
        const uint8_t *w = blob + (q ? t.off_up : t.off);
        for (int kb = 0; kb < nb; kb++) {
            __syncthreads(); /* the previous block's tiles are read (and pair[] is written) */
            for (int i = threadIdx.x; i < MM_BM * (BLK / 4); i += blockDim.x) {
                const int r = i / (BLK / 4), e = i % (BLK / 4) * 4;
                uint32_t v = 0;
                if (r0 + r < nrows) {
                    const uint8_t *b = w + (int64_t)(r0 + r) * row_bytes + (int64_t)kb * BYTES;
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        v |= (uint32_t)(uint8_t)D::q(b, e + j) << (8 * j);
                }
                *(uint32_t *)&wq[r][e] = v;
            }
            for (int i = threadIdx.x; i < MM_BM * NSUB; i += blockDim.x) {
                const int r = i / NSUB, sb = i % NSUB;
                int sc = 0, mn = 0;
                if (r0 + r < nrows)
                    D::scales(w + (int64_t)(r0 + r) * row_bytes + (int64_t)kb * BYTES, sb, &sc,
                              &mn);
                wsc[r][sb] = sc, wmn[r][sb] = mn;
            }
            for (int r = threadIdx.x; r < MM_BM; r += blockDim.x) {
                float d = 0.0f, dmin = 0.0f;
                if (r0 + r < nrows)
                    D::head(w + (int64_t)(r0 + r) * row_bytes + (int64_t)kb * BYTES, &d, &dmin);
                wd[r] = d, wdm[r] = dmin;
            }
            for (int i = threadIdx.x; i < MM_BN * (BLK / 16); i += blockDim.x) {
                const int j = i / (BLK / 16), c = i % (BLK / 16);
                uint4 v = make_uint4(0, 0, 0, 0);
                if (j < count)
                    v = __ldg((const uint4 *)(act + (int64_t)(pair[j] / t.act_div) * t.arb +
                                              (int64_t)kb * BLK) +
                              c);
                *(uint4 *)&xq[j][16 * c] = v;
            }
            for (int i = threadIdx.x; i < MM_BN * NSUB; i += blockDim.x) {
                const int j = i / NSUB, sb = i % NSUB;
                int sum = 0;
                float dx = 0.0f;
                if (j < count) {
                    const uint8_t *a = act + (int64_t)(pair[j] / t.act_div) * t.arb;
                    const int16_t *as =
                        (const int16_t *)(a + ncols) + kb * (BLK / 16) + sb * (SUB / 16);
                    for (int u = 0; u < SUB / 16; u++)
                        sum += as[u];
                    dx = ((const float *)(a + ncols + ncols / 8))[kb];
                }
                xs[j][sb] = sum;
                if (sb == 0) xd[j] = dx;
            }
            __syncthreads();

            int isum[MM_NT][4];
#pragma unroll
            for (int n = 0; n < MM_NT; n++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    isum[n][i] = 0;
#pragma unroll
            for (int sb = 0; sb < NSUB; sb++) {
                const int k0 = sb * SUB + 4 * tq;
                const int sc0 = wsc[wr + g][sb], sc1 = wsc[wr + g + 8][sb];
                uint32_t a[4];
                a[0] = *(const uint32_t *)&wq[wr + g][k0];
                a[1] = *(const uint32_t *)&wq[wr + g + 8][k0];
                if constexpr (SUB == 32) {
                    a[2] = *(const uint32_t *)&wq[wr + g][k0 + 16];
                    a[3] = *(const uint32_t *)&wq[wr + g + 8][k0 + 16];
                }
#pragma unroll
                for (int n = 0; n < MM_NT; n++) {
                    int c[4];
                    const int8_t *xr = xq[8 * n + g];
                    if constexpr (SUB == 32) {
                        const uint32_t b[2] = {*(const uint32_t *)(xr + k0),
                                               *(const uint32_t *)(xr + k0 + 16)};
                        mma_k32(a, b, c);
                    } else {
                        mma_k16(a, *(const uint32_t *)(xr + k0), c);
                    }
                    isum[n][0] += sc0 * c[0], isum[n][1] += sc0 * c[1];
                    isum[n][2] += sc1 * c[2], isum[n][3] += sc1 * c[3];
                }
            }
#pragma unroll
            for (int n = 0; n < MM_NT; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int r = wr + g + (i >> 1) * 8, j = 8 * n + 2 * tq + (i & 1);
                    int msum = 0;
                    if constexpr (D::MINS)
#pragma unroll
                        for (int sb = 0; sb < NSUB; sb++)
                            msum += wmn[r][sb] * xs[j][sb];
                    const float dx = xd[j];
                    const float term = __fsub_rn(__fmul_rn(__fmul_rn(dx, wd[r]), (float)isum[n][i]),
                                                 __fmul_rn(__fmul_rn(dx, wdm[r]), (float)msum));
                    acc[q][n][i] = __fadd_rn(acc[q][n][i], term);
                }
        }
    }
#pragma unroll
    for (int n = 0; n < MM_NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = r0 + wr + g + (i >> 1) * 8, j = 8 * n + 2 * tq + (i & 1);
            if (r >= nrows || j >= count) continue;
            const int p = pair[j];
            if (GU)
                t.out[p * t.ld + r] = __fmul_rn(acc[0][n][i] / (1.0f + strata_expf(-acc[0][n][i])),
                                                 acc[NP - 1][n][i]);
            else
                t.out[p * t.ld + r] = t.scale ? __fmul_rn(t.scale[p], acc[0][n][i]) : acc[0][n][i];
        }
}

/* moe_mma: CTA (x, y) takes rows 64x .. 64x + 63 of the part for group y's pairs on mmq.cuh's
 * tile (gu: the gate's, then the up's), then writes each (row, pair) of the group. */
template <int T, bool GU>
__global__ void __launch_bounds__(MMQ_THREADS) moe_mma(struct cu_moe_mma_task t)
{
    pdl_enter();
    if ((int)blockIdx.y >= (t.n_groups ? *t.n_groups : t.max_groups)) return;
    using M = mmq<T, CU_MOE_MMA_TILE>;
    constexpr int NP = GU ? 2 : 1;
    extern __shared__ __align__(16) uint8_t mm_smem[];
    __shared__ const uint8_t *xrow[CU_MOE_MMA_TILE];
    __shared__ int pair[CU_MOE_MMA_TILE];
    const struct moe_group grp = t.groups[blockIdx.y];
    const int count = grp.count, r0 = blockIdx.x * MMQ_BM;
    for (int j = threadIdx.x; j < CU_MOE_MMA_TILE; j += MMQ_THREADS) {
        const int p = j < count ? t.pair_idx[grp.first + j] : 0;
        pair[j] = p;
        xrow[j] = j < count ? (const uint8_t *)t.act + (int64_t)(p / t.act_div) * t.arb : NULL;
    }
    const uint8_t *blob = t.slot_ptr[grp.expert];
    const int nb = t.ncols / qt<T>::blck;
    float acc[NP][M::NT][4];
#pragma unroll
    for (int q = 0; q < NP; q++) /* run's first barrier publishes pair and xrow */
        M::run(mm_smem, blob + (q ? t.off_up : t.off), nb, t.nrows, r0, xrow, count, acc[q]);
#pragma unroll
    for (int n = 0; n < M::NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = r0 + M::row(i), j = M::col(n, i);
            if (r >= t.nrows || j >= count) continue;
            const int p = pair[j];
            const float g = acc[0][n][i];
            if (GU) /* mf_swiglu's expression (moe_ffn.cu) */
                t.out[p * t.ld + r] = __fmul_rn(g / (1.0f + strata_expf(-g)), acc[NP - 1][n][i]);
            else
                t.out[p * t.ld + r] = t.scale ? __fmul_rn(t.scale[p], g) : g;
        }
}

template <int T, bool GU> static void launch_mma_t(const struct cu_moe_mma_task &t, cudaStream_t s)
{
    using M = mmq<T, CU_MOE_MMA_TILE>;
    static const bool attr = cudaFuncSetAttribute(moe_mma<T, GU>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)M::SMEM) == cudaSuccess;
    (void)attr;
    const dim3 grid((unsigned)((t.nrows + MMQ_BM - 1) / MMQ_BM), (unsigned)t.max_groups);
    cu_launch(moe_mma<T, GU>, grid, MMQ_THREADS, M::SMEM, s, t);
}

static int mmq_v0(void)
{
    static const int v0 = getenv("STRATA_CUDA_MMQ") && atoi(getenv("STRATA_CUDA_MMQ")) == 0;
    return v0;
}

template <int T> static void launch_mma(const struct cu_moe_mma_task &t, bool gu, cudaStream_t s)
{
    if constexpr (qt<T>::blck > 1) {
        if (mmq_v0()) {
            const dim3 grid((unsigned)((t.nrows + MM_BM - 1) / MM_BM), (unsigned)t.max_groups,
                            CU_MOE_MMA_TILE / MM_BN);
            if (gu)
                cu_launch(moe_mma_v0<T, true>, grid, 128, 0, s, t);
            else
                cu_launch(moe_mma_v0<T, false>, grid, 128, 0, s, t);
        } else if (gu) {
            launch_mma_t<T, true>(t, s);
        } else {
            launch_mma_t<T, false>(t, s);
        }
    }
}

extern "C" void cu_moe_mma(uint32_t type, const struct cu_moe_mma_task *t, bool gu, void *stream)
{
#define M(T) launch_mma<T>(*t, gu, (cudaStream_t)stream)
    CU_TYPE_SWITCH(type, M)
#undef M
}
