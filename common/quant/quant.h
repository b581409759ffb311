/* quant — the weight formats of real MoE GGUF files: dequantizers (bit-exact with ggml),
 * quantizers (ggml's reference algorithm, no importance matrix), and activation quantization.
 *
 * Formats (qtype.h ids): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
 * Q6_K, IQ4_NL, IQ4_XS, MXFP4. Rows are n elements, n a multiple of the type's block size
 * (qtype_get()->blck). All functions are pure and thread-safe. Block layouts:
 * common/quant/quant_blocks.h. The reference dot products live in kernels/ref/qdot.h.
 */
#ifndef STRATA_QUANT_H
#define STRATA_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* quant_dequantize turns n elements of type at src into floats. STRATA_EUNSUPPORTED for a type
 * strata does not compute with, STRATA_EINVAL when n is not a multiple of the block. */
int quant_dequantize(uint32_t type, const void *src, float *dst, int64_t n);

/* quant_can_quantize: whether quant_quantize supports type. */
bool quant_can_quantize(uint32_t type);

/* quant_quantize turns n floats into type's blocks at dst (qtype_row_bytes(type, n) bytes), byte
 * for byte as ggml's reference quantizer does (what llama-quantize runs without an importance
 * matrix) for every type above, Q2_K, Q3_K, IQ4_NL and IQ4_XS included: checked against
 * ../shared/data/quant. STRATA_EUNSUPPORTED / STRATA_EINVAL as above. Input must be finite and,
 * for types with fp16 scales, small enough that a scale fits fp16 (|x| < ~60000 * 8 for Q4_0).
 * Round trip: |x_i - dequantize(quantize(x))_i| <= c * amax_B + 2 * M * 2^-25, B the element's
 * block (32, or 256 for the K-quants and IQ4_XS), M the largest integer factor of an fp16 scale
 * (the fp16 scale may be subnormal for amax below ~1e-3). c is analytic for the float and
 * 32-element formats, measured (+30%) for the K and IQ formats' least-squares searches:
 *   f16 2^-11, bf16 2^-8, q8_0 1/254 + 2^-11, q4_0 1/8 + 2^-11 (ggml clamps the top level),
 *   q4_1 1/15 + 3 * 2^-11, q5_0 1/16 + 2^-11, q5_1 1/31 + 3 * 2^-11,
 *   q2_K 0.45, q3_K 0.25, q4_K 0.12, q5_K 0.06, q6_K 0.025, iq4_nl 0.14, iq4_xs 0.13,
 *   mxfp4 1/4 (amax is in [4, 8) times the scale and the top level 6: an element between 6 and
 *   amax, or in the gap from 4 to 6, is off by at most amax / 4; no fp16 term, the scale is a
 *   power of two).
 * quant_test.c checks them. */
int quant_quantize(uint32_t type, const float *src, void *dst, int64_t n);

/* quant_act_type is the type activations are quantized to for a dot product with a weight row of
 * wtype: QT_Q8_0 for 32-element block types (MXFP4 included), QT_Q8_K for 256-element (K and
 * IQ4_XS) types, QT_F32
 * for F32/F16/BF16 weights (activations stay float). */
uint32_t quant_act_type(uint32_t wtype);

/* quant_act_bytes is the size of n activations quantized to quant_act_type(wtype). */
uint64_t quant_act_bytes(uint32_t wtype, int64_t n);

/* quant_activations quantizes n floats for a dot product with wtype weights into dst
 * (quant_act_bytes bytes): Q8_0 exactly as quant_quantize(QT_Q8_0) does, Q8_K as ggml's
 * quantize_row_q8_K_ref (scale -max/127, bsums filled; an all-zero block is all zeros), F32 copied.
 * Deterministic; the fast kernels use the same layout. Errors as quant_quantize for wtype. */
int quant_activations(uint32_t wtype, const float *x, void *dst, int64_t n);

/* fp16 / bf16 conversions as ggml does them (round to nearest even; bf16 keeps NaN quiet). */
float quant_f16_to_f32(uint16_t h);
/* quant_f16_to_f32_rows converts n halves, each to the bits quant_f16_to_f32 gives (F16C where the
 * CPU has it; every one of the 65,536 values checked in quant_test) */
void quant_f16_to_f32_rows(const uint16_t *h, float *f, size_t n);
uint16_t quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);

#ifdef __cplusplus
}
#endif

#endif
