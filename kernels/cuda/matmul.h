/* matmul — weight matrix times a prompt chunk on the tensor cores.
 *
 * y[m][n] = sum_k x[m][k] * W[n][k] for m < n_tok, n < nrows, k < ncols: W as in matvec.h, x and y
 * float row-major. Tiles of 64 tokens x 64 weight rows; weights are dequantized and activations
 * rounded to fp16 in shared memory, products accumulate in fp32 (WMMA 16x16x16). fp16 rounding of
 * the activations bounds the error at about 2^-11 relative per product, so this path is outside
 * bit-exact mode (DESIGN §3.4): the worker uses matvec for decode and for bit-exact runs.
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

#ifdef __cplusplus
}
#endif
#endif
