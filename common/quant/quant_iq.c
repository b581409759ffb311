/* quant_iq — the non-linear 4-bit formats IQ4_NL (32-element blocks, one fp16 scale) and IQ4_XS
 * (256-element super-blocks of 32 with 6-bit sub-block scales), both over the 16 levels below.
 *
 * The quantizer is ggml's quantize_row_iq4_nl_impl as llama-quantize runs it without an importance
 * matrix (weights x^2, 7 trial scales each side of the first guess: quantize_iq4_nl/_xs).
 */
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "common/quant/quant_blocks.h"

#include <math.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define GROUP_MAX_EPS 1e-15f
#define NTRY          7

const int8_t quant_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                       1,    13,   25,  38,  53,  69,  89,  113};

/* best_index picks the level nearest to x; a tie goes to the upper level. Comparing 2x with the
 * sum of two neighbours keeps the midpoint test exact. */
static int best_index(float x)
{
    const float x2 = x + x;
    int idx = 0;
    for (int step = 8; step > 0; step >>= 1) {
        const int j = idx + step;
        if (x2 >= (float)(quant_iq4nl_values[j - 1] + quant_iq4nl_values[j])) idx = j;
    }
    return idx;
}

/* block_scale finds the scale of 32 elements (0 for an all-zero block), levels into L. */
static float block_scale(const float *xb, uint8_t *L)
{
    float weight[32];
    for (int j = 0; j < 32; ++j)
        weight[j] = xb[j] * xb[j];
    float max = quant_amax_signed(xb, 32);
    if (fabsf(max) < GROUP_MAX_EPS) {
        memset(L, 0, 32);
        return 0;
    }
    const int8_t *values = quant_iq4nl_values;
    float d = -max / values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
        int l = best_index(id * xb[j]);
        L[j] = (uint8_t)l;
        float q = values[l];
        sumqx += weight[j] * q * xb[j];
        sumq2 += weight[j] * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -NTRY; itry <= NTRY; ++itry) {
        id = (itry + values[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; ++j) {
            float q = values[best_index(id * xb[j])];
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

static void pack4(const uint8_t *L, uint8_t *qs)
{
    for (int j = 0; j < 16; ++j)
        qs[j] = (uint8_t)(L[j] | (L[16 + j] << 4));
}

static void iq4_nl_quantize(const float *x, struct blk_iq4_nl *y, int64_t nb)
{
    uint8_t L[32];
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float d = block_scale(x, L);
        y[i].d = quant_f32_to_f16(d);
        /* requantize with the final scale (ggml does, for ntry > 0) */
        float id = d ? 1 / d : 0;
        for (int j = 0; j < 32; ++j)
            L[j] = (uint8_t)best_index(id * x[j]);
        pack4(L, y[i].qs);
    }
}

static void iq4_xs_quantize(const float *x, struct blk_iq4_xs *y, int64_t nb)
{
    uint8_t L[QK_K];
    float scales[QK_K / 32];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        for (int ib = 0; ib < QK_K / 32; ++ib)
            scales[ib] = block_scale(x + 32 * ib, L + 32 * ib);
        float max_scale = quant_amax_signed(scales, QK_K / 32);
        y[i].scales_h = 0;
        const float d = -max_scale / 32;
        y[i].d = quant_f32_to_f16(d);
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            int l = quant_nearest_int(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const float dl = d * l;
            const float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; ++j)
                L[32 * ib + j] = (uint8_t)best_index(idl * x[32 * ib + j]);
            l += 32;
            if (ib % 2 == 0)
                y[i].scales_l[ib / 2] = (uint8_t)(l & 0xf);
            else
                y[i].scales_l[ib / 2] |= (uint8_t)((l & 0xf) << 4);
            y[i].scales_h |= (uint16_t)((l >> 4) << (2 * ib));
        }
        for (int ib = 0; ib < QK_K / 32; ++ib)
            pack4(L + 32 * ib, y[i].qs + 16 * ib);
    }
}

static void iq4_dequantize_32(float d, const uint8_t *qs, float *y)
{
    for (int j = 0; j < 16; ++j) {
        y[j] = d * quant_iq4nl_values[qs[j] & 0xf];
        y[j + 16] = d * quant_iq4nl_values[qs[j] >> 4];
    }
}

void quant_iq_dequantize(uint32_t type, const void *src, float *dst, int64_t nb)
{
    if (type == QT_IQ4_NL) {
        const struct blk_iq4_nl *x = src;
        for (int64_t i = 0; i < nb; i++)
            iq4_dequantize_32(quant_f16_to_f32(x[i].d), x[i].qs, dst + 32 * i);
        return;
    }
    const struct blk_iq4_xs *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = quant_f16_to_f32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) |
                           (((x[i].scales_h >> 2 * ib) & 3) << 4);
            iq4_dequantize_32(d * (ls - 32), x[i].qs + 16 * ib, dst + QK_K * i + 32 * ib);
        }
    }
}

void quant_iq_quantize(uint32_t type, const float *src, void *dst, int64_t nb)
{
    if (type == QT_IQ4_NL)
        iq4_nl_quantize(src, dst, nb);
    else
        iq4_xs_quantize(src, dst, nb);
}
