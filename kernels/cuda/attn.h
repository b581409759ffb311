/* attn — attention over a paged KV cache on the GPU, for decode and for prompt chunks.
 *
 * The cache holds fp32 keys and values in blocks of block_size positions; a block is laid out
 * [n_kv_head][block_size][head_dim] (one head's keys of a block contiguous: the decode kernel
 * streams them). Query q (row i of n_q rows, [n_head][head_dim]) attends to positions [0,
 * kv_len[i]) of the sequence whose block table is block_tables + q_seq[i] * bt_stride. A prompt
 * chunk is the same call with one row per token and kv_len = position + 1 (causal). GQA: head h
 * reads kv head h / (n_head / n_kv_head). Scale 1/sqrt(head_dim). Long contexts are split over
 * n_split parts of the key range (flash-decoding): each part's (max, sum, weighted V) goes to the
 * workspace and a second kernel combines them. head_dim <= 256 and a multiple of 32. Asynchronous
 * on stream.
 */
#ifndef STRATA_CUDA_ATTN_H
#define STRATA_CUDA_ATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cu_kv {
    const float *k, *v; /* block pool: n_blocks * n_kv_head * block_size * head_dim floats each */
    int block_size;     /* positions per block */
    int n_kv_head;
    int head_dim;
};

/* cu_attn_workspace_bytes: workspace size for n_q rows, n_head heads, n_split parts. */
size_t cu_attn_workspace_bytes(int64_t n_q, int n_head, int head_dim, int n_split);

/* cu_attn_splits picks a split count for a longest context of max_len keys (1 below 1K keys). */
int cu_attn_splits(int64_t max_len, int64_t n_q, int n_head);

int cu_attention(const float *q, int64_t n_q, int n_head, const struct cu_kv *kv,
                 const int32_t *block_tables, int64_t bt_stride, const int32_t *q_seq,
                 const int32_t *kv_len, int n_split, void *workspace, float *out, void *stream);

/* cu_attention_rows: the same kernels with each row's splits taken from its own length (chunks of
 * CU_ATTN_ROW_CHUNK keys, merged in split order; a row of one chunk is written directly), so a
 * row's output is the same bits whatever the batch, and the grid depends on n_q alone (CTAs loop
 * over a row's chunks), so a decode step can be captured in a CUDA graph. n_q is at most
 * CU_ATTN_ROWS_MAX; every kv_len at most max_len, what cu_attn_rows_workspace_bytes sized the
 * workspace for. */
#define CU_ATTN_ROW_CHUNK 256
#define CU_ATTN_ROWS_MAX  16
size_t cu_attn_rows_workspace_bytes(int n_head, int head_dim, int64_t max_len);
int cu_attention_rows(const float *q, int64_t n_q, int n_head, const struct cu_kv *kv,
                      const int32_t *block_tables, int64_t bt_stride, const int32_t *q_seq,
                      const int32_t *kv_len, int64_t max_len, void *workspace, float *out,
                      void *stream);

#ifdef __cplusplus
}
#endif
#endif
