/* matmul — weight matrix times a prompt chunk on the tensor cores.
 *
 * y[m][n] = sum_k x[m][k] * W[n][k] for m < n_tok, n < nrows, k < ncols: W as in matvec.h, x and y
 * float row-major. Tiles of 64 tokens x 64 weight rows; weights are dequantized and activations
 * rounded to fp16 in shared memory, products accumulate in fp32 (WMMA 16x16x16). fp16 rounding of
 * the activations bounds the error at about 2^-11 relative per product, so this path is outside
 * bit-exact mode (DESIGN §3.4); cu_matmul_q below is the bit-exact product for a chunk.
 * ncols must be a multiple of 32. Asynchronous on stream.
 */
#ifndef STRATA_CUDA_MATMUL_H
#define STRATA_CUDA_MATMUL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int cu_matmul(uint32_t type, const void *w, int64_t ncols, int64_t nrows, const float *x,
              int64_t n_tok, float *y, void *stream);

/* cu_matmul_q: the bit-exact product for any token count: y[t * nrows + r] = qdot_ref(type,
 * ncols, row r, activation row t) bit for bit, t < n_tok, for the quantized GPU types (what
 * cu_matvec gives for 1-16 rows, in one launch for a whole prompt chunk). act: n_tok rows of
 * cu_quantize_acts(type) (row stride cu_act_row_bytes). Each weight block is decoded to qdot_ref's
 * integer form in shared memory, the int8 tensor cores (mma.sync m16n8k32 for 32-element
 * sub-blocks, m16n8k16 for the 16-element sub-blocks of Q2_K, Q3_K and Q6_K) give each
 * (row, token, sub-block) its exact int32 dot, the sub-blocks' scales and mins are applied in
 * integers, and each block's float term is added in block order with qdot_ref's roundings
 * (mmq.cuh's tile: 64 rows x 64 tokens, 32 for a chunk of 32 tokens or fewer). w must be 16-byte
 * aligned. STRATA_EUNSUPPORTED for a float or CPU-only type, STRATA_EINVAL for a bad shape or a
 * misaligned w. Asynchronous on stream; needs sm_80 or later. */
int cu_matmul_q(uint32_t type, const void *w, int64_t ncols, int64_t nrows, const void *act,
                int64_t n_tok, float *y, void *stream);

#ifdef __cplusplus
}
#endif
#endif
