#include "gpu-worker/kv.h"
#include "common/base/err.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Every pool block is one allocation: this header, its token ids, then the K/V floats (at
 * hdr_bytes, a multiple of 64), so a block table entry (the floats) finds its header without a
 * lookup. */
struct blk {
    uint32_t refs;             /* sequences holding the block */
    bool cached;               /* published: in the hash table under key */
    uint64_t key;              /* kv_prefix_hash(parent, ids) */
    uint64_t parent;           /* key of the blocks before it */
    struct blk *hnext;         /* hash bucket chain */
    struct blk *lprev, *lnext; /* the LRU of cached blocks nobody holds */
    int32_t ids[];             /* block_tokens token ids, when cached */
};

struct kv_cache {
    struct kv_config cfg;
    size_t block_floats; /* n_layer * block_tokens * (k_dim + v_dim) */
    size_t hdr_bytes;    /* header and ids before a block's floats */
    float **free_list;   /* blocks allocated, unused and unpublished; a stack */
    uint32_t n_free;
    uint32_t n_alloc;     /* blocks allocated from the heap so far (<= max_blocks) */
    struct blk **buckets; /* published blocks by key; n_buckets is a power of two */
    uint32_t n_buckets;
    struct blk *lru_head, *lru_tail; /* cached, refs 0: evicted from the head */
    uint32_t n_lru;
};

static struct blk *hdr(const struct kv_cache *kv, float *data)
{
    return (struct blk *)((char *)data - kv->hdr_bytes);
}

static float *data_of(const struct kv_cache *kv, struct blk *b)
{
    return (float *)((char *)b + kv->hdr_bytes);
}

int kv_init(const struct kv_config *cfg, struct kv_cache **out)
{
    if (cfg->n_layer == 0 || cfg->k_dim == 0 || cfg->v_dim == 0 || cfg->block_tokens == 0 ||
        cfg->n_ctx == 0 || cfg->max_blocks == 0)
        return strata_errf(STRATA_EINVAL,
                           "KV cache: layers %u, k_dim %u, v_dim %u, block_tokens %u, n_ctx %u, "
                           "max_blocks %u: each must be positive",
                           cfg->n_layer, cfg->k_dim, cfg->v_dim, cfg->block_tokens, cfg->n_ctx,
                           cfg->max_blocks);
    struct kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return strata_errf(STRATA_ENOMEM, "out of memory for the KV cache");
    kv->cfg = *cfg;
    kv->block_floats = (size_t)cfg->n_layer * cfg->block_tokens * (cfg->k_dim + cfg->v_dim);
    kv->hdr_bytes =
        (sizeof(struct blk) + (size_t)cfg->block_tokens * sizeof(int32_t) + 63) & ~(size_t)63;
    kv->n_buckets = 16;
    while (kv->n_buckets < cfg->max_blocks)
        kv->n_buckets *= 2;
    kv->free_list = malloc((size_t)cfg->max_blocks * sizeof *kv->free_list);
    kv->buckets = calloc(kv->n_buckets, sizeof *kv->buckets);
    if (!kv->free_list || !kv->buckets) {
        kv_fini(kv);
        return strata_errf(STRATA_ENOMEM, "out of memory for a KV pool of %u blocks",
                           cfg->max_blocks);
    }
    *out = kv;
    return 0;
}

void kv_fini(struct kv_cache *kv)
{
    if (!kv) return;
    for (uint32_t i = 0; i < kv->n_free; i++)
        free(hdr(kv, kv->free_list[i]));
    for (struct blk *b = kv->lru_head, *next; b; b = next) {
        next = b->lnext;
        free(b);
    }
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

uint32_t kv_blocks_cached(const struct kv_cache *kv)
{
    return kv->n_lru;
}

void kv_seq_init(struct kv_seq *s)
{
    *s = (struct kv_seq){0};
}

static void lru_unlink(struct kv_cache *kv, struct blk *b)
{
    *(b->lprev ? &b->lprev->lnext : &kv->lru_head) = b->lnext;
    *(b->lnext ? &b->lnext->lprev : &kv->lru_tail) = b->lprev;
    b->lprev = b->lnext = NULL;
    kv->n_lru--;
}

static void unhash(struct kv_cache *kv, struct blk *b)
{
    struct blk **p = &kv->buckets[b->key & (kv->n_buckets - 1)];
    while (*p != b)
        p = &(*p)->hnext;
    *p = b->hnext;
    b->hnext = NULL;
    b->cached = false;
}

/* take_block: a free block, else a new one, else the least recently released cached block. */
static float *take_block(struct kv_cache *kv)
{
    struct blk *b;
    if (kv->n_free) {
        b = hdr(kv, kv->free_list[--kv->n_free]);
    } else if (kv->n_alloc < kv->cfg.max_blocks) {
        b = malloc(kv->hdr_bytes + kv->block_floats * sizeof(float));
        if (!b) return NULL;
        kv->n_alloc++;
        memset(b, 0, sizeof *b);
    } else if (kv->lru_head) {
        b = kv->lru_head;
        lru_unlink(kv, b);
        unhash(kv, b);
    } else {
        return NULL;
    }
    b->refs = 1;
    return data_of(kv, b);
}

static void release(struct kv_cache *kv, float *data)
{
    struct blk *b = hdr(kv, data);
    if (--b->refs) return;
    if (!b->cached) {
        kv->free_list[kv->n_free++] = data;
        return;
    }
    b->lprev = kv->lru_tail;
    *(kv->lru_tail ? &kv->lru_tail->lnext : &kv->lru_head) = b;
    kv->lru_tail = b;
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
        float **b = realloc(s->blocks, (size_t)need * sizeof *b);
        if (!b) return strata_errf(STRATA_ENOMEM, "out of memory for a block table");
        s->blocks = b;
        s->cap = need;
    }
    while (s->n_blocks < need) {
        float *b = take_block(kv);
        if (!b) {
            /* Only malloc can fail here (the count was checked): give back what this call took. */
            while (s->n_blocks > (s->n_tokens + bt - 1) / bt)
                release(kv, s->blocks[--s->n_blocks]);
            return strata_errf(STRATA_ENOMEM, "out of memory for a KV block");
        }
        s->blocks[s->n_blocks++] = b;
    }
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
static struct blk *find(const struct kv_cache *kv, uint64_t key, uint64_t parent,
                        const int32_t *ids)
{
    for (struct blk *b = kv->buckets[key & (kv->n_buckets - 1)]; b; b = b->hnext)
        if (b->key == key && b->parent == parent &&
            memcmp(b->ids, ids, kv->cfg.block_tokens * sizeof *ids) == 0)
            return b;
    return NULL;
}

uint64_t kv_prefix_publish(struct kv_cache *kv, const struct kv_seq *s, uint32_t i, uint64_t parent,
                           const int32_t *ids)
{
    const uint32_t bt = kv->cfg.block_tokens;
    const uint64_t key = kv_prefix_hash(parent, ids, bt);
    struct blk *b = hdr(kv, s->blocks[i]);
    if (b->cached || find(kv, key, parent, ids)) return key;
    b->cached = true;
    b->key = key;
    b->parent = parent;
    memcpy(b->ids, ids, bt * sizeof *ids);
    struct blk **head = &kv->buckets[key & (kv->n_buckets - 1)];
    b->hnext = *head;
    *head = b;
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
        if (!find(kv, next, k, ids + (size_t)found * bt)) break;
        k = next;
    }
    if (!found) return 0;
    if (found > s->cap) {
        float **b = realloc(s->blocks, (size_t)found * sizeof *b);
        if (!b) return strata_errf(STRATA_ENOMEM, "out of memory for a block table");
        s->blocks = b;
        s->cap = found;
    }
    k = KV_PREFIX_ROOT;
    for (uint32_t i = 0; i < found; i++) {
        uint64_t next = kv_prefix_hash(k, ids + (size_t)i * bt, bt);
        struct blk *b = find(kv, next, k, ids + (size_t)i * bt);
        if (b->refs++ == 0) lru_unlink(kv, b);
        s->blocks[s->n_blocks++] = data_of(kv, b);
        k = next;
    }
    s->n_tokens = found * bt;
    *n_blocks = found;
    *key = k;
    return 0;
}

static float *row(const struct kv_cache *kv, const struct kv_seq *s, uint32_t layer, uint32_t pos,
                  int v)
{
    const struct kv_config *c = &kv->cfg;
    float *base =
        s->blocks[pos / c->block_tokens] + (size_t)layer * c->block_tokens * (c->k_dim + c->v_dim);
    uint32_t slot = pos % c->block_tokens;
    return v ? base + (size_t)c->block_tokens * c->k_dim + (size_t)slot * c->v_dim
             : base + (size_t)slot * c->k_dim;
}

float *kv_k(const struct kv_cache *kv, const struct kv_seq *s, uint32_t layer, uint32_t pos)
{
    return row(kv, s, layer, pos, 0);
}

float *kv_v(const struct kv_cache *kv, const struct kv_seq *s, uint32_t layer, uint32_t pos)
{
    return row(kv, s, layer, pos, 1);
}

void kv_view(const struct kv_cache *kv, const struct kv_seq *s, uint32_t layer, uint32_t head,
             uint32_t head_dim, uint32_t head_dim_v, struct ops_kv_view *out)
{
    const struct kv_config *c = &kv->cfg;
    size_t layer_off = (size_t)layer * c->block_tokens * (c->k_dim + c->v_dim);
    out->blocks = s->blocks;
    out->block_tokens = c->block_tokens;
    out->k_off = layer_off + (size_t)head * head_dim;
    out->v_off = layer_off + (size_t)c->block_tokens * c->k_dim + (size_t)head * head_dim_v;
    out->k_stride = c->k_dim;
    out->v_stride = c->v_dim;
}
