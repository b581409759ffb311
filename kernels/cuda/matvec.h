/* matvec — weight-matrix times a few activation rows on the GPU (decode: 1-16 tokens).
 *
 * y[b][o] = W[o] . act[b] for b < n_act (1..16), o < nrows; W is nrows rows of ncols weights of one
 * type, rows contiguous (row bytes = qtype_row_bytes), its base 16-byte aligned (cudaMalloc's and
 * the slot allocator's are). act holds n_act rows as cu_quantize_acts (qact.h) made them, row stride
 * cu_act_row_bytes; y is float, row-major with leading dimension nrows.
 * Quantized weights (Q8_0, Q5_0, Q4_K, Q5_K, Q6_K) compute exactly what the CPU reference qdot_ref does:
 * exact integer block dots, each block's float term in the reference's order, the terms summed
 * block after block; so y is bit-identical to qdot_ref over quant_activations' bytes, for any n_act.
 * Float weights (F32, F16, BF16) multiply float activations in fp32, one warp reduction per output
 * in a fixed order for a given ncols (within 1e-5 of the reference's double sum). Other types stay
 * on the CPU (cu_type_supported). Asynchronous on stream.
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
 * STRATA_EINVAL for n_act outside 1..16, ncols not a multiple of the type's block (8 for floats)
 * or weights not 16-byte aligned. */
int cu_matvec(uint32_t type, const void *w, int64_t ncols, int64_t nrows, const void *act, int n_act,
              float *y, void *stream);

#ifdef __cplusplus
}
#endif
#endif
