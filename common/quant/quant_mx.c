/* quant_mx — MXFP4, the OCP microscaling format gpt-oss ships its experts in: blocks of 32 e2m1
 * (1 sign, 2 exponent, 1 mantissa bit) values under one E8M0 (power of two) scale.
 *
 * The quantizer is ggml's reference (quantize_row_mxfp4_ref; gguf-py's MXFP4 gives the same bytes):
 * the scale exponent is floor(log2(amax)) - 2, which puts amax in [4, 8) times the scale, the top
 * e2m1 magnitudes 4 and 6 (doubled: 8, 12); each element takes the level of least absolute error,
 * the lowest code on a tie.
 */
#include "common/quant/quant_blocks.h"

#include <math.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

const int8_t quant_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void quant_mxfp4_dequantize(const struct blk_mxfp4 *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK_LEGACY) {
        const float d = quant_e8m0_half(x[i].e);
        for (int j = 0; j < 16; j++) {
            y[j] = quant_mxfp4_values[x[i].qs[j] & 0xF] * d;
            y[j + 16] = quant_mxfp4_values[x[i].qs[j] >> 4] * d;
        }
    }
}

/* nearest_code: the code whose level times d is closest to v, the first on a tie. */
static uint8_t nearest_code(float v, float d)
{
    uint8_t best = 0;
    float best_err = fabsf(quant_mxfp4_values[0] * d - v);
    for (uint8_t i = 1; i < 16; i++) {
        const float err = fabsf(quant_mxfp4_values[i] * d - v);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

void quant_mxfp4_quantize(const float *x, struct blk_mxfp4 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK_LEGACY) {
        float amax = 0.0f;
        for (int j = 0; j < QK_LEGACY; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        /* ggml casts the exponent to uint8_t unchecked; below 2^-125 it would wrap, so the
         * smallest scale (e = 0) is taken instead: those blocks round to zero either way */
        const float le = amax > 0.0f ? floorf(log2f(amax)) - 2 + 127 : 0;
        const uint8_t e = (uint8_t)(le > 0 ? le : 0);
        const float d = quant_e8m0_half(e);
        y[i].e = e;
        for (int j = 0; j < 16; j++)
            y[i].qs[j] = (uint8_t)(nearest_code(x[j], d) | nearest_code(x[j + 16], d) << 4);
    }
}
