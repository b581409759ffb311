/* quant — the weight formats of real MoE GGUF files: dequantizers (bit-exact with ggml),
 * quantizers (ggml's reference algorithm, no importance matrix), and activation quantization.
 *
 * Formats (qtype.h ids): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
 * IQ4_NL, IQ4_XS. Rows are n elements, n a multiple of the type's block size (qtype_get()->blck).
 * All functions are pure and thread-safe. The reference dot products live in kernels/ref/qdot.h.
 */
#ifndef STRATA_QUANT_H
#define STRATA_QUANT_H

#include <stdbool.h>
#include <stdint.h>

/* quant_dequantize turns n elements of type at src into floats. STRATA_EUNSUPPORTED for a type
 * strata does not compute with, STRATA_EINVAL when n is not a multiple of the block. */
int quant_dequantize(uint32_t type, const void *src, float *dst, int64_t n);

/* quant_can_quantize: whether quant_quantize supports type. */
bool quant_can_quantize(uint32_t type);

/* quant_quantize turns n floats into type's blocks at dst (qtype_row_bytes(type, n) bytes), byte
 * for byte as ggml's reference quantizer does. STRATA_EUNSUPPORTED / STRATA_EINVAL as above. */
int quant_quantize(uint32_t type, const float *src, void *dst, int64_t n);

/* quant_act_type is the type activations are quantized to for a dot product with a weight row of
 * wtype: QT_Q8_0 for 32-element block types, QT_Q8_K for 256-element (K and IQ4_XS) types, QT_F32
 * for F32/F16/BF16 weights (activations stay float). */
uint32_t quant_act_type(uint32_t wtype);

/* quant_act_bytes is the size of n activations quantized to quant_act_type(wtype). */
uint64_t quant_act_bytes(uint32_t wtype, int64_t n);

/* quant_activations quantizes n floats for a dot product with wtype weights into dst
 * (quant_act_bytes bytes). Deterministic; the fast kernels use the same layout. */
int quant_activations(uint32_t wtype, const float *x, void *dst, int64_t n);

/* fp16 / bf16 conversions as ggml does them (round to nearest even; bf16 keeps NaN quiet). */
float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);

#endif
