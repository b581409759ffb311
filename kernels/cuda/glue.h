/* glue — the small steps between the CUDA backend's products: embedding rows, bias and residual
 * adds, the K/V store into the paged device pool, the shared expert's SwiGLU and sigmoid gate, and
 * a row gather.
 *
 * Each kernel computes every output element from its own inputs only, in one fixed expression (no
 * reduction across rows), so a row's bits never depend on the batch it runs in: the backend's
 * bit-exact contract (DESIGN 3.4) holds through them. Where the CPU backend has the same step the
 * expression is the CPU's, with __fmul_rn/__fadd_rn so nvcc does not contract it into an FMA the
 * CPU does not make; expf is glibc's (expf.cuh, checked at start). All launches are
 * asynchronous on stream, return 0 or STRATA_EINVAL (a bad shape; the detail names it) or a CUDA
 * error, and move the bytes their comment states (a benchmark counts them).
 */
#ifndef STRATA_CUDA_GLUE_H
#define STRATA_CUDA_GLUE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cu_set_pdl: whether this thread's later kernel launches (every cu_* launcher of kernels/cuda)
 * go out with programmatic dependent launch (Hopper and later: a kernel's launch and CTA start
 * overlap the end of the kernel ahead of it on the stream; each kernel still waits for that one
 * to finish before it reads what it wrote, so the results are the same bits). Off by default;
 * the CUDA backend turns it on for its all-resident passes. Returns the previous setting. */
bool cu_set_pdl(bool on);

/* cu_embed_rows: out[t] = dequantized row ids[t] of table (rows of row_bytes, type wtype, n_embd
 * elements, a multiple of 8), t < n_tok. Reads n_tok rows, writes n_tok * n_embd floats.
 * STRATA_EUNSUPPORTED for a type the GPU does not dequantize (cu_type_supported). */
int cu_embed_rows(uint32_t wtype, const void *table, uint64_t row_bytes, const int32_t *ids,
                  int64_t n_tok, int64_t n_embd, float *out, void *stream);

/* cu_add_rows: x[r][i] += b[i] for r < rows, i < width (biases). cu_add: x[i] += y[i], i < n
 * (the residual). */
int cu_add_rows(float *x, const float *b, int64_t rows, int64_t width, void *stream);
int cu_add(float *x, const float *y, int64_t n, void *stream);

/* cu_kv_store writes K and V rows of n_tok tokens (k, v: [n_tok][n_kv_head * head_dim] floats)
 * into the paged pools of one layer, laid out as attn.h reads them: block b holds
 * [n_kv_head][block_size][head_dim] elements; token t goes to block slot[t] / block_size, position
 * slot[t] % block_size. f16 != 0: pools of IEEE half, rounded to nearest even (as the host
 * kv_store), else float. */
int cu_kv_store(const float *k, const float *v, const int32_t *slot, int64_t n_tok, int n_kv_head,
                int head_dim, int block_size, int f16, void *k_pool, void *v_pool, void *stream);

/* cu_swiglu: out[i] = silu(g[i]) * u[i] = g / (1 + expf(-g)) * u, i < n; out may be g. */
int cu_swiglu(const float *g, const float *u, float *out, int64_t n, void *stream);

/* cu_gate_add: y[t][d] += sigmoid(gate[t]) * s[t][d] for t < n_tok, d < width (the shared expert,
 * scaled by its sigmoid gate, added to the routed experts' sum). */
int cu_gate_add(float *y, const float *s, const float *gate, int64_t n_tok, int64_t width,
                void *stream);

/* cu_gather_rows: out[i] = x[rows[i]] (width floats), i < n (the rows that ask for logits). */
int cu_gather_rows(const float *x, const int32_t *rows, int64_t n, int64_t width, float *out,
                   void *stream);

#ifdef __cplusplus
}
#endif
#endif
