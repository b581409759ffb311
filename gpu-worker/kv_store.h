/* kv_store — the host storage of the KV cache: one allocation per block id (kv.h names the ids),
 * made when the id is first used, holding K/V as fp32 or fp16.
 *
 * A block of block_tokens positions holds, for each layer in order, its K (k_dim elements a
 * position, stored by columns: [k_dim][block_tokens], each head's keys transposed together, see
 * ops.h's k_cols; an MLA cache, v_dim 0, keeps K rows) then V (v_dim elements a position, head
 * by head: [v_dim / v_head][block_tokens][v_head], so one head's rows lie together). Writing a row
 * converts floats to the store's type (fp16: round to nearest even, as ggml); attention reads a
 * float view (kv_store_view): fp32 rows in place, fp16 rows converted into the caller's scratch.
 * Each type is its own bit-exact contract: a position's stored bits depend only on the floats
 * written, so logits stay the same across batches, chunks, threads and re-prefill for a given type
 * (fp16 is not fp32: the two differ by its rounding). Threads: kv_store_reserve on the decode
 * thread between passes; during a pass any thread writes the rows of positions it owns and reads
 * any row.
 */
#ifndef STRATA_KV_STORE_H
#define STRATA_KV_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "gpu-worker/kv.h"
#include "kernels/ref/ops.h"

enum kv_type {
    KV_F32 = 0, /* 4 bytes an element: the CPU default */
    KV_F16 = 1, /* 2 bytes: half the memory (llama.cpp's default KV type) */
};

/* kv_type_name: "f32", "f16". kv_type_parse: STRATA_EINVAL naming the choices for another name. */
const char *kv_type_name(enum kv_type t);
int kv_type_parse(const char *name, enum kv_type *out);

/* kv_pos_bytes: bytes one position takes over all layers (K and V). */
uint64_t kv_pos_bytes(const struct kv_config *c, enum kv_type t);

struct kv_store;

/* kv_store_init: an empty store for blocks of c (no block memory yet). Caller owns *out
 * (kv_store_fini). STRATA_ENOMEM. */
int kv_store_init(const struct kv_config *c, enum kv_type t, struct kv_store **out);

/* kv_store_fini frees every block; NULL is fine. */
void kv_store_fini(struct kv_store *st);

/* kv_store_reserve makes storage for block ids below n_ids (kv_blocks_used_ever). STRATA_ENOMEM
 * leaves the ids already made. Decode thread, between passes. */
int kv_store_reserve(struct kv_store *st, uint32_t n_ids);

/* Segment mode: the store's blocks live in memory lent to it in segments of seg_bytes (slot
 * mode's one budget for KV and expert slots, DESIGN 3.1), not in its own allocations. Each
 * (block, layer) is a piece of block_tokens K rows then V rows (64-byte aligned), placed in
 * order: piece id * n_layer + layer in segment piece / per-segment. kv_store_use_segments switches
 * an empty store (STRATA_ESTATE otherwise; STRATA_EINVAL when a piece is larger than a segment);
 * then kv_store_reserve makes no memory but checks that the segments set cover the ids
 * (STRATA_ENOSPC). kv_store_segments_for: segments that ids below n_ids need;
 * kv_store_blocks_in: the ids n_seg segments hold. kv_store_set_segment gives (or moves)
 * segment i; kv_store_drop_segments keeps the first n (the ids past them must be given back
 * first: kv_trim). Decode thread, between passes. */
int kv_store_use_segments(struct kv_store *st, uint64_t seg_bytes);
uint32_t kv_store_segments_for(const struct kv_store *st, uint32_t n_ids);
uint32_t kv_store_blocks_in(const struct kv_store *st, uint32_t n_seg);
uint32_t kv_store_segments(const struct kv_store *st);
void kv_store_set_segment(struct kv_store *st, uint32_t i, uint8_t *mem);
uint8_t *kv_store_segment(const struct kv_store *st, uint32_t i);
void kv_store_drop_segments(struct kv_store *st, uint32_t n);

/* kv_store_type: the element type. kv_store_bytes: block memory allocated
 * so far (segment mode: the segments lent). */
enum kv_type kv_store_type(const struct kv_store *st);
uint64_t kv_store_bytes(const struct kv_store *st);

/* kv_store_write stores position pos of s in layer: k (k_dim floats) and v (v_dim floats),
 * converted to the store's type. pos < s->n_tokens, its block reserved. */
void kv_store_write(struct kv_store *st, const struct kv_seq *s, uint32_t layer, uint32_t pos,
                    const float *k, const float *v);

/* kv_store_scratch_bytes: the scratch one kv_store_view call needs (per thread). */
size_t kv_store_scratch_bytes(const struct kv_store *st, uint32_t head_dim, uint32_t head_dim_v);

/* kv_store_view fills out with the float view ops_attention reads of KV head `head` (head_dim
 * and head_dim_v elements) of layer, positions [0, n_keys) of s. scratch (kv_store_scratch_bytes,
 * 64-byte aligned) backs the view until the next call with the same scratch. */
void kv_store_view(const struct kv_store *st, const struct kv_seq *s, uint32_t layer, uint32_t head,
                   uint32_t head_dim, uint32_t head_dim_v, uint32_t n_keys, void *scratch,
                   struct ops_kv_view *out);

/* kv_store_view_direct is kv_store_view without the conversion: an fp16 store's view is the fp16
 * view of its rows in place (ops.h), which cpu_attention reads converting a block of keys at a
 * time (and ops_kv_widen turns into kv_store_view's); an fp32 store's is kv_store_view's. */
void kv_store_view_direct(const struct kv_store *st, const struct kv_seq *s, uint32_t layer,
                          uint32_t head, uint32_t head_dim, uint32_t head_dim_v, uint32_t n_keys,
                          void *scratch, struct ops_kv_view *out);

#endif
