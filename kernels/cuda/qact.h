/* qact — activations quantized on the GPU for the quantized weight products (cu_matvec).
 *
 * The CPU reference multiplies quantized weights with activations quantized by quant_activations
 * (Q8_0 per 32 elements for the 32-element weight types, Q8_K per 256 for the K-quants; floats kept
 * for float weights) and sums exact integer block dots (kernels/ref/qdot.h). The GPU does the same
 * arithmetic, so its activations are the same numbers: cu_quantize_acts reproduces quant_activations
 * value for value (scales, rounding, ties, all-zero blocks), in a layout made for 16-byte loads:
 *   one row of n elements = int8 q[n], then int16 s[n / 16] (the sum of each 16 q, Q8_K's bsums),
 *   then float d[n / blk] (blk 32 or 256; Q8_0's fp16 scale already widened), padded to
 *   cu_act_row_bytes; x = d * q.
 * The sums let the products subtract a weight format's offset (Q5_0's 16, Q6_K's 32, Q4_K's mins)
 * once per 16 elements instead of once per element. Float weight types take the float row itself
 * (cu_act_row_bytes = 4 n). Asynchronous on stream.
 */
#ifndef STRATA_CUDA_QACT_H
#define STRATA_CUDA_QACT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cu_act_row_bytes: bytes of one activation row of n elements for wtype weights (a multiple of 16),
 * 0 for a type the GPU does not compute with or an n that is not a whole number of blocks. */
size_t cu_act_row_bytes(uint32_t wtype, int64_t n);

/* cu_quantize_acts: n_act rows of n floats at x (row stride n) into act (row stride
 * cu_act_row_bytes). STRATA_EUNSUPPORTED for a CPU-only type, STRATA_EINVAL for a bad n. */
int cu_quantize_acts(uint32_t wtype, const float *x, int64_t n, int n_act, void *act, void *stream);

#ifdef __cplusplus
}
#endif
#endif
