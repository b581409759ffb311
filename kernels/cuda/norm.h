/* norm — RMSNorm (whole rows, or per head for q/k norms) and rotary embeddings on the GPU.
 *
 * cu_rmsnorm: y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, rows of width floats; one warp per row,
 * a CTA per row for rows of 1024 floats or more (sums in an order fixed by the width alone).
 * q/k norms are the same call: per-head norms (qwen3moe) use rows = n_tok * n_head, width =
 * head_dim; full-width norms (olmoe) rows = n_tok, width = n_head * head_dim. x may equal y.
 * cu_rope rotates the first n_rot dims of each head in place: normal (adjacent pairs, llama) or NeoX
 * (pairs i, i + n_rot/2; qwen, olmoe), angle pos * base^(-2i/n_rot). Asynchronous on stream.
 */
#ifndef STRATA_CUDA_NORM_H
#define STRATA_CUDA_NORM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int cu_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t width, float eps,
               void *stream);

int cu_rope(float *x, const int32_t *pos, int64_t n_tok, int n_head, int head_dim, int n_rot,
            float base, int neox, void *stream);

#define CU_ROW_NORM_MIN 1024 /* rows this wide or wider are normed by a CTA (a sum order of its own) */

/* cu_add_rmsnorm: x += y (the residual add, as cu_add), then out = cu_rmsnorm of the new x: the
 * same bits as the two calls, in one launch. */
int cu_add_rmsnorm(float *x, const float *y, const float *w, float *out, int64_t rows,
                   int64_t width, float eps, void *stream);

/* Wide rows (CU_ROW_NORM_MIN or more) sum their squares in one order however they are launched:
 * chunks of 256 elements, each chunk's sum in a fixed tree, the chunks' sums in chunk order. The
 * split forms below spread a row over a CTA per chunk (rows of at most CU_ROW_SYNC_CHUNKS chunks,
 * at most one CTA per SM in all; else one CTA a row, the same bits), their CTAs meeting through
 * sync: cu_row_sync_bytes(rows) of device memory, zeroed once before its first use, then reused by
 * the launches of one stream (never two streams at once). */
#define CU_ROW_SYNC_CHUNKS 32
size_t cu_row_sync_bytes(int64_t rows);

/* cu_add_rmsnorm_q: cu_add_rmsnorm, then out's rows quantized into act for wtype weights, the bytes
 * cu_quantize_acts(wtype, out, width, rows, act) writes (rows cu_act_row_bytes apart), in the same
 * launch; with sync (or NULL: one CTA a row) split as above, the same bytes. Rows of
 * CU_ROW_NORM_MIN or more, weights whose activations are Q8_0 or Q8_K; else STRATA_EINVAL. */
int cu_add_rmsnorm_q(float *x, const float *y, const float *w, float *out, int64_t rows,
                     int64_t width, float eps, uint32_t wtype, void *act, void *sync,
                     void *stream);

/* cu_qk_rope_store: per head row of each token, in one launch: q and k normed per head (q_norm,
 * k_norm: head_dim weights each, or NULL for none) and rotated as cu_rmsnorm and cu_rope do, then
 * k and v written into the paged pools as cu_kv_store writes them (f16: round to nearest even).
 * The same expressions per element as those three calls; no sum across rows. */
int cu_qk_rope_store(float *q, float *k, const float *v, const float *q_norm, const float *k_norm,
                     const int32_t *pos, const int32_t *slot, int64_t n_tok, int n_head,
                     int n_kv_head, int head_dim, int n_rot, float base, int neox, float eps,
                     int f16, int block_size, void *k_pool, void *v_pool, void *stream);

#ifdef __cplusplus
}
#endif
#endif
