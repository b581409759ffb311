#include "gpu-worker/kv.h"
#include "common/base/err.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Bookkeeping of one block id. Token ids of published blocks live in kv_cache.ids, block_tokens per
 * block id. */
struct blk {
    uint32_t refs;         /* sequences holding the block */
    bool cached;           /* published: in the hash table under key */
    uint64_t key;          /* kv_prefix_hash(parent, ids) */
    uint64_t parent;       /* key of the blocks before it */
    uint32_t hnext;        /* hash bucket chain, KV_NO_BLOCK at its end */
    uint32_t lprev, lnext; /* the LRU of cached blocks nobody holds */
};

#define KV_NO_BLOCK UINT32_MAX

struct kv_cache {
    struct kv_config cfg; /* cfg.max_blocks: the limit now (kv_set_max_blocks), <= cap */
    uint32_t cap;         /* blocks the arrays hold: max_blocks as configured */
    struct blk *blk;     /* (max_blocks) */
    int32_t *ids;        /* (max_blocks, block_tokens) token ids of published blocks */
    uint32_t *free_list; /* block ids used before, unused and unpublished now; a stack */
    uint32_t n_free;
    uint32_t n_alloc;  /* block ids handed out for the first time so far: 0 .. n_alloc-1 */
    uint32_t *buckets; /* published blocks by key; n_buckets is a power of two */
    uint32_t n_buckets;
    uint32_t lru_head, lru_tail; /* cached, refs 0: evicted from the head */
    uint32_t n_lru;
};

int kv_init(const struct kv_config *cfg, struct kv_cache **out)
{
    /* v_dim may be 0: an MLA cache (deepseek2) reads its values out of the K rows */
    if (cfg->n_layer == 0 || cfg->k_dim == 0 || cfg->block_tokens == 0 || cfg->n_ctx == 0 ||
        cfg->max_blocks == 0)
        return strata_errf(STRATA_EINVAL,
                           "KV cache: layers %u, k_dim %u, v_dim %u, block_tokens %u, n_ctx %u, "
                           "max_blocks %u: each must be positive (v_dim may be 0)",
                           cfg->n_layer, cfg->k_dim, cfg->v_dim, cfg->block_tokens, cfg->n_ctx,
                           cfg->max_blocks);
    struct kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return strata_errf(STRATA_ENOMEM, "out of memory for the KV cache");
    kv->cfg = *cfg;
    kv->cap = cfg->max_blocks;
    kv->n_buckets = 16;
    while (kv->n_buckets < cfg->max_blocks)
        kv->n_buckets *= 2;
    kv->blk = calloc(cfg->max_blocks, sizeof *kv->blk);
    kv->ids = malloc((size_t)cfg->max_blocks * cfg->block_tokens * sizeof *kv->ids);
    kv->free_list = malloc((size_t)cfg->max_blocks * sizeof *kv->free_list);
    kv->buckets = malloc(kv->n_buckets * sizeof *kv->buckets);
    if (!kv->blk || !kv->ids || !kv->free_list || !kv->buckets) {
        kv_fini(kv);
        return strata_errf(STRATA_ENOMEM, "out of memory for a KV pool of %u blocks",
                           cfg->max_blocks);
    }
    for (uint32_t i = 0; i < kv->n_buckets; i++)
        kv->buckets[i] = KV_NO_BLOCK;
    kv->lru_head = kv->lru_tail = KV_NO_BLOCK;
    *out = kv;
    return 0;
}

void kv_fini(struct kv_cache *kv)
{
    if (!kv) return;
    free(kv->blk);
    free(kv->ids);
    free(kv->free_list);
    free(kv->buckets);
    free(kv);
}

const struct kv_config *kv_config_of(const struct kv_cache *kv)
{
    return &kv->cfg;
}

uint32_t kv_blocks_free(const struct kv_cache *kv)
{
    return kv->n_free + kv->n_lru + (kv->cfg.max_blocks - kv->n_alloc);
}

uint32_t kv_blocks_used_ever(const struct kv_cache *kv)
{
    return kv->n_alloc;
}

uint32_t kv_blocks_cached(const struct kv_cache *kv)
{
    return kv->n_lru;
}

void kv_seq_init(struct kv_seq *s)
{
    *s = (struct kv_seq){0};
}

static void lru_unlink(struct kv_cache *kv, uint32_t id)
{
    struct blk *b = &kv->blk[id];
    *(b->lprev != KV_NO_BLOCK ? &kv->blk[b->lprev].lnext : &kv->lru_head) = b->lnext;
    *(b->lnext != KV_NO_BLOCK ? &kv->blk[b->lnext].lprev : &kv->lru_tail) = b->lprev;
    b->lprev = b->lnext = KV_NO_BLOCK;
    kv->n_lru--;
}

static void unhash(struct kv_cache *kv, uint32_t id)
{
    struct blk *b = &kv->blk[id];
    uint32_t *p = &kv->buckets[b->key & (kv->n_buckets - 1)];
    while (*p != id)
        p = &kv->blk[*p].hnext;
    *p = b->hnext;
    b->hnext = KV_NO_BLOCK;
    b->cached = false;
}

/* drop_cached takes a cached block nobody holds out of the prefix cache and its LRU. */
static void drop_cached(struct kv_cache *kv, uint32_t id)
{
    lru_unlink(kv, id);
    unhash(kv, id);
}

/* take_block: a free block, else a never-used one, else the least recently released cached
 * block; KV_NO_BLOCK when none is left. */
static uint32_t take_block(struct kv_cache *kv)
{
    uint32_t id;
    if (kv->n_free) {
        id = kv->free_list[--kv->n_free];
    } else if (kv->n_alloc < kv->cfg.max_blocks) {
        id = kv->n_alloc++;
        kv->blk[id] =
            (struct blk){.hnext = KV_NO_BLOCK, .lprev = KV_NO_BLOCK, .lnext = KV_NO_BLOCK};
    } else if (kv->lru_head != KV_NO_BLOCK) {
        id = kv->lru_head;
        drop_cached(kv, id);
    } else {
        return KV_NO_BLOCK;
    }
    kv->blk[id].refs = 1;
    return id;
}

static void release(struct kv_cache *kv, uint32_t id)
{
    struct blk *b = &kv->blk[id];
    if (--b->refs) return;
    if (!b->cached) {
        kv->free_list[kv->n_free++] = id;
        return;
    }
    b->lprev = kv->lru_tail;
    b->lnext = KV_NO_BLOCK;
    *(kv->lru_tail != KV_NO_BLOCK ? &kv->blk[kv->lru_tail].lnext : &kv->lru_head) = id;
    kv->lru_tail = id;
    kv->n_lru++;
}

int kv_seq_resize(struct kv_cache *kv, struct kv_seq *s, uint32_t n_tokens)
{
    const uint32_t bt = kv->cfg.block_tokens;
    if (n_tokens > kv->cfg.n_ctx)
        return strata_errf(STRATA_ELIMIT,
                           "%u positions exceed the context of %u tokens: shorten the prompt or "
                           "max tokens, or raise the context (--ctx)",
                           n_tokens, kv->cfg.n_ctx);
    const uint32_t need = (n_tokens + bt - 1) / bt;
    if (need > s->n_blocks && need - s->n_blocks > kv_blocks_free(kv))
        return strata_errf(STRATA_ENOSPC,
                           "KV cache: %u more blocks needed, %u free of %u: fewer or shorter "
                           "sequences, or a larger cache",
                           need - s->n_blocks, kv_blocks_free(kv), kv->cfg.max_blocks);
    if (need > s->cap) {
        uint32_t *b = realloc(s->blocks, (size_t)need * sizeof *b);
        if (!b) return strata_errf(STRATA_ENOMEM, "out of memory for a block table");
        s->blocks = b;
        s->cap = need;
    }
    while (s->n_blocks < need) /* the count was checked: a block is always there */
        s->blocks[s->n_blocks++] = take_block(kv);
    while (s->n_blocks > need)
        release(kv, s->blocks[--s->n_blocks]);
    s->n_tokens = n_tokens;
    return 0;
}

void kv_seq_fini(struct kv_cache *kv, struct kv_seq *s)
{
    while (s->n_blocks)
        release(kv, s->blocks[--s->n_blocks]);
    free(s->blocks);
    kv_seq_init(s);
}

uint64_t kv_prefix_hash(uint64_t parent, const int32_t *ids, uint32_t n)
{
    return XXH3_64bits_withSeed(ids, (size_t)n * sizeof *ids, parent);
}

/* find: the published block of key that follows parent and holds ids. A 64-bit key collision
 * is astronomically rare, but checking the tokens and the parent key makes a wrong match need
 * two colliding prefixes that also end in the same block. */
static uint32_t find(const struct kv_cache *kv, uint64_t key, uint64_t parent, const int32_t *ids)
{
    const uint32_t bt = kv->cfg.block_tokens;
    for (uint32_t id = kv->buckets[key & (kv->n_buckets - 1)]; id != KV_NO_BLOCK;
         id = kv->blk[id].hnext) {
        const struct blk *b = &kv->blk[id];
        if (b->key == key && b->parent == parent &&
            memcmp(kv->ids + (size_t)id * bt, ids, bt * sizeof *ids) == 0)
            return id;
    }
    return KV_NO_BLOCK;
}

uint64_t kv_prefix_publish(struct kv_cache *kv, const struct kv_seq *s, uint32_t i, uint64_t parent,
                           const int32_t *ids)
{
    const uint32_t bt = kv->cfg.block_tokens;
    const uint64_t key = kv_prefix_hash(parent, ids, bt);
    const uint32_t id = s->blocks[i];
    struct blk *b = &kv->blk[id];
    if (b->cached || find(kv, key, parent, ids) != KV_NO_BLOCK) return key;
    b->cached = true;
    b->key = key;
    b->parent = parent;
    memcpy(kv->ids + (size_t)id * bt, ids, bt * sizeof *ids);
    uint32_t *head = &kv->buckets[key & (kv->n_buckets - 1)];
    b->hnext = *head;
    *head = id;
    return key;
}

int kv_prefix_attach(struct kv_cache *kv, struct kv_seq *s, const int32_t *ids, uint32_t n_ids,
                     uint32_t max_blocks, uint32_t *n_blocks, uint64_t *key)
{
    const uint32_t bt = kv->cfg.block_tokens;
    *n_blocks = 0;
    *key = KV_PREFIX_ROOT;
    if (s->n_blocks || s->n_tokens)
        return strata_errf(STRATA_EINVAL,
                           "a prefix can only be attached to an empty sequence (it holds %u "
                           "positions)",
                           s->n_tokens);
    uint32_t n = n_ids / bt < max_blocks ? n_ids / bt : max_blocks, found = 0;
    uint64_t k = KV_PREFIX_ROOT;
    /* Count first, so the block table grows before any reference is taken. */
    for (; found < n; found++) {
        uint64_t next = kv_prefix_hash(k, ids + (size_t)found * bt, bt);
        if (find(kv, next, k, ids + (size_t)found * bt) == KV_NO_BLOCK) break;
        k = next;
    }
    if (!found) return 0;
    if (found > s->cap) {
        uint32_t *b = realloc(s->blocks, (size_t)found * sizeof *b);
        if (!b) return strata_errf(STRATA_ENOMEM, "out of memory for a block table");
        s->blocks = b;
        s->cap = found;
    }
    k = KV_PREFIX_ROOT;
    for (uint32_t i = 0; i < found; i++) {
        uint64_t next = kv_prefix_hash(k, ids + (size_t)i * bt, bt);
        const uint32_t id = find(kv, next, k, ids + (size_t)i * bt);
        if (kv->blk[id].refs++ == 0) lru_unlink(kv, id);
        s->blocks[s->n_blocks++] = id;
        k = next;
    }
    s->n_tokens = found * bt;
    *n_blocks = found;
    *key = k;
    return 0;
}

uint32_t kv_blocks_cap(const struct kv_cache *kv)
{
    return kv->cap;
}

int kv_trim(struct kv_cache *kv, uint32_t n_ids)
{
    if (n_ids >= kv->n_alloc) return 0;
    for (uint32_t id = n_ids; id < kv->n_alloc; id++)
        if (kv->blk[id].refs)
            return strata_errf(STRATA_EBUSY,
                               "KV block %u is held by a sequence: the pool cannot shrink below "
                               "%u blocks until it ends",
                               id, id + 1);
    for (uint32_t id = n_ids; id < kv->n_alloc; id++)
        if (kv->blk[id].cached) drop_cached(kv, id);
    uint32_t k = 0;
    for (uint32_t i = 0; i < kv->n_free; i++)
        if (kv->free_list[i] < n_ids) kv->free_list[k++] = kv->free_list[i];
    kv->n_free = k;
    kv->n_alloc = n_ids;
    return 0;
}

int kv_set_max_blocks(struct kv_cache *kv, uint32_t n)
{
    if (n == 0 || n > kv->cap)
        return strata_errf(STRATA_EINVAL, "KV pool of %u blocks: 1 to %u", n, kv->cap);
    int rv = kv_trim(kv, n);
    if (rv) return rv;
    kv->cfg.max_blocks = n;
    return 0;
}
