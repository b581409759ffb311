#include "common/quant/quant.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matvec.h"
#include "kernels/cuda/qact.h"

/* Every operation below is one IEEE-rounded step in the CPU's order (nvcc contracts a*b+c into an
 * fma by default, so products that feed a sum are written with __fmul_rn): the bytes equal
 * quant_activations' for every input, which kernels_gputest checks. */

/* Q8_0: one warp per 32-element block, lane i element i. d = amax / 127, q = roundf(x / d) through
 * the reciprocal, as common/quant/quant.c's q8_0_quantize; d is stored as its fp16 value widened. */
__global__ void qact_q8_0(const float *x, int64_t n, int64_t n_blocks, size_t arb, uint8_t *act)
{
    pdl_enter();
    const int64_t blk = (int64_t)blockIdx.x * 4 + threadIdx.x / WARP;
    if (blk >= n_blocks) return;
    const int lane = threadIdx.x & (WARP - 1);
    const int64_t nb = n / 32, row = blk / nb, b = blk % nb;
    const float v = x[row * n + b * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t *r = act + row * arb;
    const int q = (int)roundf(__fmul_rn(v, id));
    r[b * 32 + lane] = (uint8_t)(int8_t)q;
    int sum = q;
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((lane & 15) == 0) ((int16_t *)(r + n))[b * 2 + lane / 16] = (int16_t)sum;
    if (lane == 0) ((float *)(r + n + n / 8))[b] = __half2float(__float2half_rn(d));
}

/* Q8_K: one warp per 256-element block, lane i elements 8i..8i+7. The scale comes from the element
 * of largest magnitude with its sign (the first one on ties, as quant_amax_signed), iscale =
 * -127 / max, q = nearest-even(iscale * x) capped at 127, d = 1 / iscale; an all-zero block is
 * all zeros. */
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
    float amax = 0.0f, max = 0.0f;
    int at = 256; /* index of max; 256 = none */
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (amax < fabsf(v[j])) amax = fabsf(v[j]), max = v[j], at = lane * 8 + j;
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        float oa = __shfl_xor_sync(0xffffffffu, amax, o), om = __shfl_xor_sync(0xffffffffu, max, o);
        int oat = __shfl_xor_sync(0xffffffffu, at, o);
        if (oa > amax || (oa == amax && oat < at)) amax = oa, max = om, at = oat;
    }
    uint8_t *r = act + row * arb;
    uint32_t q[2] = {0, 0};
    int sum = 0;
    float d = 0.0f;
    if (max != 0.0f) {
        const float iscale = -127.f / max;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int t = __float2int_rn(__fmul_rn(iscale, v[j]));
            t = t < 127 ? t : 127;
            q[j / 4] |= (uint32_t)(uint8_t)(int8_t)t << (8 * (j % 4));
            sum += t;
        }
        d = 1.0f / iscale;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    *(uint2 *)(r + b * 256 + lane * 8) = make_uint2(q[0], q[1]);
    if ((lane & 1) == 0) ((int16_t *)(r + n))[b * 16 + lane / 2] = (int16_t)sum;
    if (lane == 0) ((float *)(r + n + n / 8))[b] = d;
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
