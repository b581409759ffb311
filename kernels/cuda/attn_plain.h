/* attn_plain — attention over the paged KV cache with fp16 or fp32 keys and values: the plain
 * kernel beside attn.cu's tuned fp32 one, so `--kv-type f16` (the GPU's default) has a kernel.
 *
 * Same cache layout and arguments as cu_attention (attn.h): blocks of [n_kv_head][block_size]
 * [head_dim] elements per layer, query row i attends to positions [0, kv_len[i]) of the sequence
 * whose block table is block_tables + q_seq[i] * bt_stride, GQA head h reads kv head
 * h / (n_head / n_kv_head), scale 1/sqrt(head_dim); head_dim <= 256, head_dim_v == head_dim.
 * One CTA of 128 threads per (row, q head) walks the keys in tiles of 128 (a thread scores one key
 * of a tile, then each thread adds p * v for one or two dims over the tile's keys in key order):
 * every sum is in a fixed order that depends only on the row's own length, so a row's output is
 * the same bits whatever the batch, the chunk or the other rows (DESIGN 3.4). No split of the key
 * range yet: one CTA per (row, head) reads the row's whole context (slow for one long sequence;
 * attn.cu's split-K is the model to follow once the split count is taken from each row's length).
 * Asynchronous on stream; STRATA_EINVAL for a bad shape.
 */
#ifndef STRATA_CUDA_ATTN_PLAIN_H
#define STRATA_CUDA_ATTN_PLAIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cu_attention_plain: k and v pools of one layer, IEEE half when f16 != 0, else float; out is
 * [n_q][n_head][head_dim] floats. */
int cu_attention_plain(const float *q, int64_t n_q, int n_head, const void *k, const void *v,
                       int f16, int block_size, int n_kv_head, int head_dim,
                       const int32_t *block_tables, int64_t bt_stride, const int32_t *q_seq,
                       const int32_t *kv_len, float *out, void *stream);

#ifdef __cplusplus
}
#endif
#endif
