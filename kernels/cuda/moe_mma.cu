#include "kernels/cuda/common.cuh"
#include "kernels/cuda/expf.cuh"
#include "kernels/cuda/mmq.cuh"
#include "kernels/cuda/moe_mma.h"

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
    static const bool attr =
        cudaFuncSetAttribute(moe_mma<T, GU>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)M::SMEM) == cudaSuccess;
    (void)attr;
    const dim3 grid((unsigned)((t.nrows + MMQ_BM - 1) / MMQ_BM), (unsigned)t.max_groups);
    cu_launch(moe_mma<T, GU>, grid, MMQ_THREADS, M::SMEM, s, t);
}

template <int T> static void launch_mma(const struct cu_moe_mma_task &t, bool gu, cudaStream_t s)
{
    if constexpr (qt<T>::blck > 1) {
        if (gu)
            launch_mma_t<T, true>(t, s);
        else
            launch_mma_t<T, false>(t, s);
    }
}

extern "C" void cu_moe_mma(uint32_t type, const struct cu_moe_mma_task *t, bool gu, void *stream)
{
#define M(T) launch_mma<T>(*t, gu, (cudaStream_t)stream)
    CU_TYPE_SWITCH(type, M)
#undef M
}
