/* attn_plain — attention over the paged KV cache with fp16 or fp32 keys and values, split over the
 * key range by each row's own length (split-K decode for one long sequence, bit-exact in a batch).
 *
 * Same cache layout and arguments as cu_attention (attn.h): blocks of [n_kv_head][block_size]
 * [head_dim] elements per layer, query row i attends to positions [0, kv_len[i]) of the sequence
 * whose block table is block_tables + q_seq[i] * bt_stride, GQA head h reads kv head
 * h / (n_head / n_kv_head), scale 1/sqrt(head_dim); head_dim a multiple of 32 up to 256,
 * head_dim_v == head_dim. A row's keys are cut into chunks of CU_ATTN_CHUNK; a CTA of 128 threads
 * takes one (row, head, chunk) at a time: a thread scores one key, then each warp adds p * v over
 * a quarter of the chunk's keys in key order, the warps' sums added in warp order. A row of one
 * chunk writes its
 * output directly; a longer row leaves a (max, sum, acc) record per chunk in the workspace and the
 * CTA that finishes its last chunk (a counter per row and head) merges them in chunk order. The chunks and every sum depend only on the row's own
 * length, never on the batch, the grid or the other rows, so a row's output is the same bits
 * whatever the batch, the chunk of a prompt or decode vs re-prefill (DESIGN 3.4). The grid is
 * fixed by the row count alone (CTAs loop over a row's chunks; those past its length exit), so a
 * decode step can be captured in a CUDA graph. Asynchronous on stream; STRATA_EINVAL for a bad
 * shape.
 */
#ifndef STRATA_CUDA_ATTN_PLAIN_H
#define STRATA_CUDA_ATTN_PLAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CU_ATTN_CHUNK    128 /* keys of one split of a row */
#define CU_ATTN_MAX_ROWS 16  /* rows one cu_attention_plain call takes (the workspace's) */

/* cu_attn_plain_workspace_bytes: for rows of up to max_len keys. The workspace is zeroed once
 * before its first use (it holds the counters; every call leaves them zero again). */
size_t cu_attn_plain_workspace_bytes(int n_head, int head_dim, int64_t max_len);

/* cu_attention_plain: n_q (1..CU_ATTN_MAX_ROWS) rows of q, k and v pools of one layer (IEEE half
 * when f16 != 0, else float), every kv_len at most max_len (what the workspace was sized for);
 * out is [n_q][n_head][head_dim] floats. */
int cu_attention_plain(const float *q, int64_t n_q, int n_head, const void *k, const void *v,
                       int f16, int block_size, int n_kv_head, int head_dim,
                       const int32_t *block_tables, int64_t bt_stride, const int32_t *q_seq,
                       const int32_t *kv_len, int64_t max_len, void *workspace, float *out,
                       void *stream);

/* cu_attention_tiles: cu_attention_plain's outputs, the same bits row by row, for any number of
 * rows (a prompt chunk) and no workspace: a CTA takes a tile of 64 / G rows times a kv head's G =
 * n_head / n_kv_head q heads and reads each chunk of CU_ATTN_CHUNK keys (and values) of the rows'
 * sequence into shared memory once for all of them; two passes over the keys (each query's max
 * over its keys, then each chunk's record as cu_attention_plain makes it, folded into the sums in
 * chunk order as its merge adds them). Rows of several sequences in a tile take a pass each.
 * cu_attn_tiles_ok: whether the shape fits (G divides 64; the tile's shared memory fits the SM). */
bool cu_attn_tiles_ok(int n_head, int n_kv_head, int head_dim, int f16);
#define CU_ATTN_TILES_MIN_ROWS 128 /* fewer rows fill too few CTAs: cu_attention_plain 16 rows at a
                                    * time is faster (64 rows: 47 us against 95 on an H200) */
int cu_attention_tiles(const float *q, int64_t n_q, int n_head, const void *k, const void *v,
                       int f16, int block_size, int n_kv_head, int head_dim,
                       const int32_t *block_tables, int64_t bt_stride, const int32_t *q_seq,
                       const int32_t *kv_len, float *out, void *stream);

#ifdef __cplusplus
}
#endif
#endif
