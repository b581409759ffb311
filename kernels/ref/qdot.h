/* qdot — the reference dot products of one weight row (any computable type, common/quant/quant.h) with
 * activations: plain C, one reduction order, the yardstick the SIMD and CUDA kernels are checked
 * against. Pure functions; any thread.
 *
 * qdot_ref's reduction order, per weight type:
 *   quantized weights: activations come as quant_activations() made them (Q8_0 per 32, Q8_K per
 *   256 elements). A weight is w_i = d * sc_s * q_i - dmin * m_s + m, s its sub-block (sc_s = 1,
 *   m_s = 0 for the 32-element formats; m is Q4_1/Q5_1's offset, 0 otherwise). For each weight
 *   block in row order, with qx the integer activations, three exact int32 sums:
 *     isum = sum_s sc_s * sum_{i in s} q_i * qx_i
 *     msum = sum_s m_s * sum_{i in s} qx_i
 *     xsum = sum_i qx_i
 *   and the block adds, in float and in this order, to a float accumulator:
 *     blk = (dx * d) * (float)isum - (dx * dmin) * (float)msum + (dx * m) * (float)xsum
 *   (dx: the activation block's scale), block after block.
 *   F32/F16/BF16 weights: activations stay F32; products summed in double in index order, rounded
 *   once at the end (as qdot_f32).
 */
#ifndef STRATA_QDOT_H
#define STRATA_QDOT_H

#include <stdint.h>

/* qdot_ref returns the dot product of n weights of wtype at w_row with act, n activations that
 * quant_activations(wtype, ...) produced. n must be a multiple of wtype's block; NAN for a type
 * that is not computable. */
float qdot_ref(uint32_t wtype, int64_t n, const void *w_row, const void *act);

/* qdot_f32 returns the dot product of the dequantized row with float activations x: dequantized as
 * quant_dequantize does, accumulated in double in index order, rounded to float once. NAN for a
 * type that is not computable. */
float qdot_f32(uint32_t wtype, int64_t n, const void *w_row, const float *x);

/* qdot_ref_bound returns E, a bound that holds for every row and input (finite, |x| < 8e6):
 *     |qdot_ref(w, quant_activations(x)) - sum_i w_i * x_i| <= E
 * where w_i is the dequantized weight (exact sum, real arithmetic). With b the activation blocks
 * (32 elements for Q8_0, 256 for Q8_K), amax_b = max |x_i| over the block, nb the block count:
 *     E = sum_b delta_b * sum_{i in b} |w_i|  +  (nb + 8) * 2^-24 * sum_i P_i * (|x_i| + delta_b)
 *   delta_b = amax_b * rho + tau, the largest rounding of one activation:
 *     Q8_0: rho = (1/254 + 2^-11) * (1 + 2^-14), tau = 127 * 2^-25 (its scale is fp16: 2^-11
 *           relative, and an absolute 2^-25 when amax < 2^-14 * 127 makes it subnormal);
 *     Q8_K: rho = 1/254 * (1 + 2^-14), tau = 0 (a float scale);
 *     (the 1 + 2^-14: the float products x * (1/d) that pick each level are off by up to 3 ulps);
 *   P_i = |d * sc_s * q_i| + |dmin * m_s| + |m|: the parts w_i is made of, for the float rounding
 *   of the scales, of (float)isum and of the accumulation.
 * Float weights (F32 activations): E = 2^-23 * sum_i |w_i * x_i|.
 * Why per block and not c * sum |w_i x_i|: an activation is rounded to a step of its block's
 * amax/127, so a small x_i beside a large one has no relative accuracy. NAN for a bad type. */
double qdot_ref_bound(uint32_t wtype, int64_t n, const void *w_row, const float *x);

#endif
