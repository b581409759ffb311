/* qact.cuh — one block of activations quantized as cu_quantize_acts does (qact.h's layout), by one
 * warp: the device code of qact.cu's kernels, shared with the kernels that quantize the rows they
 * have just written (the fused norms of norm.cu and moe_ffn.cu), so both give the same bytes.
 *
 * qact_block(row, n, b, lane, at) quantizes block b (32 elements for Q8_0, 256 for Q8_K) of the
 * n-float row row into act row r (cu_act_row_bytes apart). Every warp lane takes part.
 */
#ifndef STRATA_CUDA_QACT_CUH
#define STRATA_CUDA_QACT_CUH

#include "kernels/cuda/common.cuh"

/* Q8_0: lane i element i. d = amax / 127, q = roundf(x / d) through the reciprocal, as
 * common/quant/quant.c's q8_0_quantize; d is stored as its fp16 value widened. */
__device__ __forceinline__ void qact_block_q8_0(float v, int64_t n, int64_t b, int lane, uint8_t *r)
{
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = (int)roundf(__fmul_rn(v, id));
    r[b * 32 + lane] = (uint8_t)(int8_t)q;
    int sum = q;
#pragma unroll
    for (int o = 1; o < 16; o <<= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((lane & 15) == 0) ((int16_t *)(r + n))[b * 2 + lane / 16] = (int16_t)sum;
    if (lane == 0) ((float *)(r + n + n / 8))[b] = __half2float(__float2half_rn(d));
}

/* Q8_K: lane i elements 8i..8i+7 (v). The scale comes from the element of largest magnitude with
 * its sign (the first one on ties, as quant_amax_signed), iscale = -127 / max, q = nearest-even(
 * iscale * x) capped at 127, d = 1 / iscale; an all-zero block is all zeros. */
__device__ __forceinline__ void qact_block_q8_K(const float v[8], int64_t n, int64_t b, int lane,
                                                uint8_t *r)
{
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

/* qact_row: the warps of a CTA (nw of them, this one w) quantize one row of n floats (xr, written
 * by this CTA before a barrier) into r, blocks w, w + nw, ...; at: QT_Q8_0 or QT_Q8_K. */
__device__ __forceinline__ void qact_row(const float *xr, int64_t n, uint32_t at, int w, int nw,
                                         int lane, uint8_t *r)
{
    if (at == QT_Q8_0) {
        for (int64_t b = w; b < n / 32; b += nw)
            qact_block_q8_0(xr[b * 32 + lane], n, b, lane, r);
    } else {
        for (int64_t b = w; b < n / 256; b += nw) {
            const float4 *xp = (const float4 *)(xr + b * 256 + lane * 8);
            const float4 x0 = xp[0], x1 = xp[1];
            const float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            qact_block_q8_K(v, n, b, lane, r);
        }
    }
}

/* qact_chunk: the blocks of elements 256c .. 256c + 255 of an n-float row (xc: those elements,
 * written by this 256-thread CTA before a barrier) quantized into r by its warps (w, lane), the
 * bytes of qact_row. */
__device__ __forceinline__ void qact_chunk(const float *xc, int64_t n, uint32_t at, int64_t c, int w,
                                           int lane, uint8_t *r)
{
    if (at == QT_Q8_0) {
        const int64_t b = c * 8 + w;
        if (b < n / 32) qact_block_q8_0(xc[w * 32 + lane], n, b, lane, r);
    } else if (w == 0 && c < n / 256) {
        const float4 *xp = (const float4 *)(xc + lane * 8);
        const float4 x0 = xp[0], x1 = xp[1];
        const float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        qact_block_q8_K(v, n, c, lane, r);
    }
}

#endif
