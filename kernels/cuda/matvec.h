/* matvec — weight-matrix times a few activation rows on the GPU (decode: 1-16 tokens).
 *
 * y[b][o] = sum_i W[o][i] * x[b][i] for b < n_act (1..16), o < nrows, i < ncols. W is nrows rows of
 * ncols weights of one type, rows contiguous (row bytes = qtype_row_bytes); x and y are float,
 * row-major with leading dimensions ncols and nrows. Weights are dequantized on the fly in 8-element
 * chunks and multiplied in fp32; each output is one warp's reduction, in a fixed order for a given
 * (type, ncols), so results do not depend on n_act or on the other rows. Types: F32, F16, BF16, Q8_0,
 * Q5_0, Q4_K, Q6_K (cu_type_supported); others stay on the CPU. Asynchronous on stream.
 */
#ifndef STRATA_CUDA_MATVEC_H
#define STRATA_CUDA_MATVEC_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CU_MATVEC_MAX_ACT 16

/* cu_type_supported: whether the GPU kernels compute with weights of this type. */
bool cu_type_supported(uint32_t type);

/* cu_matvec launches the product. STRATA_EUNSUPPORTED for a CPU-only type (detail names it),
 * STRATA_EINVAL for n_act outside 1..16 or ncols not a multiple of the type's block (8 for floats). */
int cu_matvec(uint32_t type, const void *w, int64_t ncols, int64_t nrows, const float *x, int n_act,
              float *y, void *stream);

#ifdef __cplusplus
}
#endif
#endif
