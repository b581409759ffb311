#include "gpu-worker/kv_store.h"
#include "common/base/err.h"
#include "common/quant/quant.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct kv_store {
    struct kv_config cfg;
    enum kv_type type;
    size_t elem;         /* bytes of one element */
    size_t block_elems;  /* n_layer * block_tokens * (k_dim + v_dim) */
    size_t piece_bytes;  /* one (block, layer): block_tokens * (k_dim + v_dim) elements */
    void **base;         /* (max_blocks) each block's memory, NULL until reserved */
    uint32_t n_reserved; /* ids below it have memory */
    /* Segment mode (kv_store_use_segments): pieces placed in lent segments, per_seg a segment,
     * piece p = block * n_layer + layer in segment p / per_seg. */
    uint8_t **seg;       /* (max_seg) NULL: the store's own blocks */
    uint64_t seg_bytes;
    uint32_t per_seg, max_seg, n_seg;
};

const char *kv_type_name(enum kv_type t)
{
    return t == KV_F16 ? "f16" : "f32";
}

int kv_type_parse(const char *name, enum kv_type *out)
{
    if (strcmp(name, "f32") == 0)
        *out = KV_F32;
    else if (strcmp(name, "f16") == 0)
        *out = KV_F16;
    else
        return strata_errf(STRATA_EINVAL, "KV type '%s': use f32 or f16", name);
    return 0;
}

static size_t elem_bytes(enum kv_type t)
{
    return t == KV_F16 ? 2 : 4;
}

uint64_t kv_pos_bytes(const struct kv_config *c, enum kv_type t)
{
    return (uint64_t)c->n_layer * (c->k_dim + c->v_dim) * elem_bytes(t);
}

int kv_store_init(const struct kv_config *c, enum kv_type t, struct kv_store **out)
{
    struct kv_store *st = calloc(1, sizeof *st);
    if (st) st->base = calloc(c->max_blocks, sizeof *st->base);
    if (!st || !st->base) {
        free(st);
        return strata_errf(STRATA_ENOMEM, "out of memory for a KV store of %u blocks",
                           c->max_blocks);
    }
    st->cfg = *c;
    st->type = t;
    st->elem = elem_bytes(t);
    st->block_elems = (size_t)c->n_layer * c->block_tokens * (c->k_dim + c->v_dim);
    st->piece_bytes = (size_t)c->block_tokens * (c->k_dim + c->v_dim) * st->elem;
    *out = st;
    return 0;
}

void kv_store_fini(struct kv_store *st)
{
    if (!st) return;
    if (!st->seg)
        for (uint32_t i = 0; i < st->n_reserved; i++)
            free(st->base[i]);
    free(st->base);
    free(st->seg);
    free(st);
}

int kv_store_use_segments(struct kv_store *st, uint64_t seg_bytes)
{
    if (st->n_reserved || st->seg)
        return strata_errf(STRATA_ESTATE, "the KV store already holds blocks");
    const size_t piece = (st->piece_bytes + 63) & ~(size_t)63;
    if (seg_bytes < piece)
        return strata_errf(STRATA_EINVAL,
                           "a KV block's layer takes %zu bytes, more than a segment of %llu",
                           piece, (unsigned long long)seg_bytes);
    st->seg_bytes = seg_bytes;
    st->per_seg = (uint32_t)(seg_bytes / piece);
    st->piece_bytes = piece;
    st->max_seg = kv_store_segments_for(st, st->cfg.max_blocks);
    st->seg = calloc(st->max_seg ? st->max_seg : 1, sizeof *st->seg);
    if (!st->seg) return strata_errf(STRATA_ENOMEM, "out of memory for KV segments");
    return 0;
}

uint32_t kv_store_segments_for(const struct kv_store *st, uint32_t n_ids)
{
    const uint64_t pieces = (uint64_t)n_ids * st->cfg.n_layer;
    return st->per_seg ? (uint32_t)((pieces + st->per_seg - 1) / st->per_seg) : 0;
}

uint32_t kv_store_blocks_in(const struct kv_store *st, uint32_t n_seg)
{
    return st->per_seg ? (uint32_t)((uint64_t)n_seg * st->per_seg / st->cfg.n_layer) : 0;
}

uint32_t kv_store_segments(const struct kv_store *st)
{
    return st->n_seg;
}

void kv_store_set_segment(struct kv_store *st, uint32_t i, uint8_t *mem)
{
    st->seg[i] = mem;
    if (i >= st->n_seg) st->n_seg = i + 1;
}

uint8_t *kv_store_segment(const struct kv_store *st, uint32_t i)
{
    return st->seg[i];
}

void kv_store_drop_segments(struct kv_store *st, uint32_t n)
{
    for (uint32_t i = n; i < st->n_seg; i++)
        st->seg[i] = NULL;
    if (n < st->n_seg) st->n_seg = n;
    const uint32_t ids = kv_store_blocks_in(st, n);
    if (st->n_reserved > ids) st->n_reserved = ids;
}

/* k_cols: whether the store keeps K by columns (ops.h): each piece's K is [k_dim][block_tokens],
 * so a head's keys of a block lie together, transposed, as the attention kernels read them. An
 * MLA cache (no V) keeps rows: its values are read out of the K rows. */
static bool k_cols(const struct kv_config *c)
{
    return c->v_dim > 0;
}

/* v_head: the floats of one head's values as the store lays them: a block's V is [heads][block
 * tokens][v_head] (v_head v_dim, one head: plain rows, where the config names no head size or
 * one that does not divide v_dim). */
static size_t v_head(const struct kv_config *c)
{
    return c->v_head && c->v_dim % c->v_head == 0 ? c->v_head : c->v_dim;
}

/* piece: the memory of block id's rows of layer: K (block_tokens positions of k_dim, by columns
 * where k_cols), then V (head by head, v_head). */
static void *piece(const struct kv_store *st, uint32_t id, uint32_t layer)
{
    if (!st->seg)
        return (uint8_t *)st->base[id] + (size_t)layer * st->piece_bytes;
    const uint64_t p = (uint64_t)id * st->cfg.n_layer + layer;
    return st->seg[p / st->per_seg] + (p % st->per_seg) * st->piece_bytes;
}

int kv_store_reserve(struct kv_store *st, uint32_t n_ids)
{
    if (n_ids > st->cfg.max_blocks) n_ids = st->cfg.max_blocks;
    if (st->seg) {
        if (kv_store_segments_for(st, n_ids) > st->n_seg)
            return strata_errf(STRATA_ENOSPC,
                               "KV blocks below %u need %u segments of the budget, %u are lent",
                               n_ids, kv_store_segments_for(st, n_ids), st->n_seg);
        if (n_ids > st->n_reserved) st->n_reserved = n_ids;
        return 0;
    }
    while (st->n_reserved < n_ids) {
        void *b = aligned_alloc(64, (st->block_elems * st->elem + 63) & ~(size_t)63);
        if (!b)
            return strata_errf(STRATA_ENOMEM, "out of memory for KV block %u (%zu bytes)",
                               st->n_reserved, st->block_elems * st->elem);
        st->base[st->n_reserved++] = b;
    }
    return 0;
}

enum kv_type kv_store_type(const struct kv_store *st)
{
    return st->type;
}

uint64_t kv_store_bytes(const struct kv_store *st)
{
    if (st->seg) return (uint64_t)st->n_seg * st->seg_bytes;
    return (uint64_t)st->n_reserved * st->block_elems * st->elem;
}

/* put stores x as element i from base in the store's type (fp16: rounded as ggml rounds). */
static inline void put(const struct kv_store *st, void *base, size_t i, float x)
{
    if (st->type == KV_F32)
        ((float *)base)[i] = x;
    else
        ((uint16_t *)base)[i] = quant_f32_to_f16(x);
}

void kv_store_write(struct kv_store *st, const struct kv_seq *s, uint32_t layer, uint32_t pos,
                    const float *k, const float *v)
{
    const struct kv_config *c = &st->cfg;
    const size_t bt = c->block_tokens, slot = pos % bt, vh = v_head(c);
    void *base = piece(st, s->blocks[pos / bt], layer);
    /* K element i at i * bt + slot (columns) or slot * k_dim + i (rows); V element i, head i / vh,
     * after K at (head * bt + slot) * vh + i % vh */
    for (uint32_t i = 0; i < c->k_dim; i++)
        put(st, base, k_cols(c) ? i * bt + slot : slot * c->k_dim + i, k[i]);
    for (uint32_t i = 0; i < c->v_dim; i++)
        put(st, base, bt * c->k_dim + (i / vh * bt + slot) * vh + i % vh, v[i]);
}

/* the scratch's parts: the view's table, and for fp16 the widened view's table and rows */
static size_t table_bytes(const struct kv_config *c)
{
    const size_t n_blocks = (c->n_ctx + c->block_tokens - 1) / c->block_tokens;
    return (n_blocks * sizeof(float *) + 63) & ~(size_t)63;
}

size_t kv_store_scratch_bytes(const struct kv_store *st, uint32_t head_dim, uint32_t head_dim_v)
{
    const struct kv_config *c = &st->cfg;
    const size_t n_blocks = (c->n_ctx + c->block_tokens - 1) / c->block_tokens;
    size_t b = table_bytes(c);
    if (st->type == KV_F16)
        b += table_bytes(c) +
             (size_t)n_blocks * c->block_tokens * (head_dim + head_dim_v) * sizeof(float);
    return b;
}

void kv_store_view_direct(const struct kv_store *st, const struct kv_seq *s, uint32_t layer,
                          uint32_t head, uint32_t head_dim, uint32_t head_dim_v, uint32_t n_keys,
                          void *scratch, struct ops_kv_view *out)
{
    const struct kv_config *c = &st->cfg;
    const uint32_t bt = c->block_tokens, nb = (n_keys + bt - 1) / bt;
    memset(out, 0, sizeof *out);
    void **bases = scratch;
    for (uint32_t i = 0; i < nb; i++)
        bases[i] = piece(st, s->blocks[i], layer);
    out->block_tokens = bt;
    out->k_cols = k_cols(c);
    out->k_off = (size_t)head * head_dim * (k_cols(c) ? bt : 1);
    out->v_off = (size_t)bt * c->k_dim + (size_t)head * bt * v_head(c);
    out->k_stride = k_cols(c) ? 1 : c->k_dim;
    out->v_stride = v_head(c);
    if (st->type == KV_F32) {
        out->blocks = (float *const *)bases;
        return;
    }
    /* fp16: the rows in place, in halves; the widened view's table and rows after the table */
    out->hblocks = (const uint16_t *const *)bases;
    out->wtab = (float **)((char *)scratch + table_bytes(c));
    out->conv = (float *)((char *)scratch + 2 * table_bytes(c));
}

void kv_store_view(const struct kv_store *st, const struct kv_seq *s, uint32_t layer, uint32_t head,
                   uint32_t head_dim, uint32_t head_dim_v, uint32_t n_keys, void *scratch,
                   struct ops_kv_view *out)
{
    kv_store_view_direct(st, s, layer, head, head_dim, head_dim_v, n_keys, scratch, out);
    ops_kv_widen(out, n_keys, head_dim, head_dim_v);
}
