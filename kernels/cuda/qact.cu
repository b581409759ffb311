#include "common/quant/quant.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matvec.h"
#include "kernels/cuda/qact.h"
#include "kernels/cuda/qact.cuh"

/* Every operation below is one IEEE-rounded step in the CPU's order (nvcc contracts a*b+c into an
 * fma by default, so products that feed a sum are written with __fmul_rn): the bytes equal
 * quant_activations' for every input, which kernels_gputest checks. */

/* One warp per block (qact.cuh): 4 blocks a CTA. */
__global__ void qact_q8_0(const float *x, int64_t n, int64_t n_blocks, size_t arb, uint8_t *act)
{
    pdl_enter();
    const int64_t blk = (int64_t)blockIdx.x * 4 + threadIdx.x / WARP;
    if (blk >= n_blocks) return;
    const int lane = threadIdx.x & (WARP - 1);
    const int64_t nb = n / 32, row = blk / nb, b = blk % nb;
    qact_block_q8_0(x[row * n + b * 32 + lane], n, b, lane, act + row * arb);
}

__global__ void qact_q8_K(const float *x, int64_t n, int64_t n_blocks, size_t arb, uint8_t *act)
{
    pdl_enter();
    const int64_t blk = (int64_t)blockIdx.x * 4 + threadIdx.x / WARP;
    if (blk >= n_blocks) return;
    const int lane = threadIdx.x & (WARP - 1);
    const int64_t nb = n / 256, row = blk / nb, b = blk % nb;
    const float4 *xp = (const float4 *)(x + row * n + b * 256 + lane * 8);
    const float4 x0 = xp[0], x1 = xp[1];
    const float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    qact_block_q8_K(v, n, b, lane, act + row * arb);
}

extern "C" size_t cu_act_row_bytes(uint32_t wtype, int64_t n)
{
    if (!cu_type_supported(wtype) || n <= 0) return 0;
    const struct qtype_info *ti = qtype_get(wtype);
    if (n % (ti->blck < 8 ? 8 : ti->blck)) return 0;
    if (quant_act_type(wtype) == QT_F32) return (size_t)n * sizeof(float);
    size_t bytes = (size_t)n + sizeof(int16_t) * (size_t)(n / 16) + sizeof(float) * (size_t)(n / ti->blck);
    return (bytes + 15) & ~(size_t)15;
}

extern "C" int cu_quantize_acts(uint32_t wtype, const float *x, int64_t n, int n_act, void *act,
                                void *stream)
{
    if (!cu_type_supported(wtype))
        return strata_errf(STRATA_EUNSUPPORTED, "%s weights are computed on the CPU, not the GPU",
                           qtype_name(wtype));
    const size_t arb = cu_act_row_bytes(wtype, n);
    if (arb == 0 || n_act < 1)
        return strata_errf(STRATA_EINVAL, "cu_quantize_acts: %lld %s activations, %d rows",
                           (long long)n, qtype_name(wtype), n_act);
    cudaStream_t s = (cudaStream_t)stream;
    const uint32_t at = quant_act_type(wtype);
    if (at == QT_F32)
        return cu_err(cudaMemcpyAsync(act, x, arb * n_act, cudaMemcpyDeviceToDevice, s));
    const int64_t nblk = n / (at == QT_Q8_0 ? 32 : 256) * n_act;
    const unsigned grid = (unsigned)((nblk + 3) / 4);
    if (at == QT_Q8_0)
        cu_launch(qact_q8_0, grid, 4 * WARP, 0, s, x, n, nblk, arb, (uint8_t *)act);
    else
        cu_launch(qact_q8_K, grid, 4 * WARP, 0, s, x, n, nblk, arb, (uint8_t *)act);
    return cu_launch_check();
}
