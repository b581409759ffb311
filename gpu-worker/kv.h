/* kv — the KV cache's bookkeeping: blocks named by uint32 ids, per sequence a block table, reference
 * counts, the prefix cache and its LRU. It holds no K/V data: storage is a pool indexed by block id
 * that the backend owns (gpu-worker/kv_store.h on the host; a device pool on a GPU).
 *
 * A block holds block_tokens consecutive positions of one sequence for every layer. A block table
 * maps logical block i (positions i*block_tokens ...) to a block id, so sequences grow, shrink and
 * share without moving data. Ids are handed out lowest first, up to max_blocks: ids below
 * kv_blocks_used_ever() are the ones storage must have. A sequence is refused past n_ctx positions
 * (STRATA_ELIMIT) and the pool past max_blocks (STRATA_ENOSPC).
 * Prefix cache: a full block can be published under the chained hash of its tokens and of every
 * block before it; other sequences attach it read-only, counted by a reference count. A published
 * block nobody holds stays cached (and counts as free) until the pool needs it, least recently
 * released first. A published block is never written again: a sequence writes only past its
 * n_tokens, and only full blocks are published or attached.
 * Not thread-safe: one thread (the worker's decode loop) resizes sequences; during a forward pass
 * any thread may read the block tables.
 */
#ifndef STRATA_KV_H
#define STRATA_KV_H

#include <stdint.h>

struct kv_config {
    uint32_t n_layer;
    uint32_t k_dim;        /* floats of one position's keys in one layer (n_head_kv*head_dim) */
    uint32_t v_dim;        /* floats of its values (n_head_kv*head_dim_v) */
    uint32_t v_head;       /* floats of one head's values (head_dim_v): kv_store keeps a block's V
                              head by head; 0: V rows of v_dim as they come */
    uint32_t block_tokens; /* positions per block */
    uint32_t n_ctx;        /* most positions of one sequence */
    uint32_t max_blocks;   /* blocks in the pool, over all sequences */
};

struct kv_cache;

/* A sequence's block table. Zero-initialize it (or kv_seq_init); free it with kv_seq_fini. */
struct kv_seq {
    uint32_t n_tokens; /* positions held: 0 .. n_tokens-1 */
    uint32_t n_blocks; /* entries of blocks in use */
    uint32_t cap;      /* entries allocated */
    uint32_t *blocks;  /* logical block -> block id */
};

/* kv_init checks cfg and creates an empty pool (no block memory yet). Caller owns *out. */
int kv_init(const struct kv_config *cfg, struct kv_cache **out);

/* kv_fini frees the pool and every block; sequences must have been kv_seq_fini'd. NULL is fine. */
void kv_fini(struct kv_cache *kv);

/* kv_config_of: the cache's configuration. */
const struct kv_config *kv_config_of(const struct kv_cache *kv);

/* kv_blocks_free: blocks still available to sequences, cached ones nobody holds included. */
uint32_t kv_blocks_free(const struct kv_cache *kv);

/* kv_blocks_used_ever: block ids handed out so far; every id a sequence holds is below it. */
uint32_t kv_blocks_used_ever(const struct kv_cache *kv);

/* kv_blocks_cached: of the free blocks, those kept for the prefix cache. */
uint32_t kv_blocks_cached(const struct kv_cache *kv);

void kv_seq_init(struct kv_seq *s);

/* kv_seq_resize makes s hold exactly n_tokens positions: growing takes blocks (contents of new
 * positions undefined until written; a cached block may be evicted for it; the storage of a
 * never-used id must be made before it is written: kv_blocks_used_ever), shrinking returns
 * the blocks past the end (to re-prefill from the middle; not into a published block).
 * STRATA_ELIMIT past n_ctx, STRATA_ENOSPC when the pool is exhausted, STRATA_ENOMEM (the block
 * table); on error s is
 * unchanged. */
int kv_seq_resize(struct kv_cache *kv, struct kv_seq *s, uint32_t n_tokens);

/* kv_seq_fini releases all of s's blocks: to the pool, or to the prefix cache when published. */
void kv_seq_fini(struct kv_cache *kv, struct kv_seq *s);

/* kv_trim gives back the block ids at or above n_ids (the storage behind them may then be reused:
 * kv_blocks_used_ever drops to n_ids): cached ones leave the prefix cache, free ones the free
 * list. STRATA_EBUSY, nothing changed, when a sequence holds one of them. */
int kv_trim(struct kv_cache *kv, uint32_t n_ids);

/* kv_set_max_blocks makes the pool n blocks (1 .. kv_blocks_cap): the ids at or above n are
 * trimmed (kv_trim: STRATA_EBUSY when held) and never handed out; kv_config_of's max_blocks
 * reads n. For a budget shared with other memory (slot mode's KV and expert slots). */
int kv_set_max_blocks(struct kv_cache *kv, uint32_t n);

/* kv_blocks_cap: the most blocks the pool can be set to (max_blocks as configured). */
uint32_t kv_blocks_cap(const struct kv_cache *kv);

#define KV_PREFIX_ROOT 0 /* the parent hash of a sequence's first block */

/* kv_prefix_hash: the key of a block holding ids[0..n) after a prefix whose key is parent. */
uint64_t kv_prefix_hash(uint64_t parent, const int32_t *ids, uint32_t n);

/* kv_prefix_publish offers logical block i of s to the prefix cache. The block must be full and
 * written; ids are its block_tokens token ids and parent the key of the blocks before it.
 * Returns the block's key (the parent of block i+1). A block already published, or a prefix
 * already cached in another block, leaves the cache as it is. Never fails. */
uint64_t kv_prefix_publish(struct kv_cache *kv, const struct kv_seq *s, uint32_t i, uint64_t parent,
                           const int32_t *ids);

/* kv_prefix_attach gives an empty s the longest cached prefix of ids[0..n_ids), in whole blocks,
 * at most max_blocks of them: *n_blocks blocks (s->n_tokens = *n_blocks * block_tokens), and
 * *key the last one's key (KV_PREFIX_ROOT for none). Blocks match on their tokens and their
 * parent's key, so a hash collision of one block never attaches foreign data. STRATA_ENOMEM (s
 * unchanged), STRATA_EINVAL if s is not empty. */
int kv_prefix_attach(struct kv_cache *kv, struct kv_seq *s, const int32_t *ids, uint32_t n_ids,
                     uint32_t max_blocks, uint32_t *n_blocks, uint64_t *key);

#endif
