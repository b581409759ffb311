#include "gpu-worker/kv.h"
#include "common/err.h"

#include <stdlib.h>

struct kv_cache {
    struct kv_config cfg;
    size_t block_floats; /* n_layer * block_tokens * (k_dim + v_dim) */
    float **free_list;   /* blocks allocated and unused; a stack */
    uint32_t n_free;
    uint32_t n_alloc; /* blocks allocated from the heap so far (<= max_blocks) */
};

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
    kv->free_list = malloc((size_t)cfg->max_blocks * sizeof *kv->free_list);
    if (!kv->free_list) {
        free(kv);
        return strata_errf(STRATA_ENOMEM, "out of memory for a KV pool of %u blocks",
                           cfg->max_blocks);
    }
    *out = kv;
    return 0;
}

void kv_fini(struct kv_cache *kv)
{
    if (!kv) return;
    for (uint32_t i = 0; i < kv->n_free; i++) free(kv->free_list[i]);
    free(kv->free_list);
    free(kv);
}

const struct kv_config *kv_config_of(const struct kv_cache *kv)
{
    return &kv->cfg;
}

uint32_t kv_blocks_free(const struct kv_cache *kv)
{
    return kv->n_free + (kv->cfg.max_blocks - kv->n_alloc);
}

void kv_seq_init(struct kv_seq *s)
{
    *s = (struct kv_seq){0};
}

static float *take_block(struct kv_cache *kv)
{
    if (kv->n_free) return kv->free_list[--kv->n_free];
    if (kv->n_alloc == kv->cfg.max_blocks) return NULL;
    float *b = malloc(kv->block_floats * sizeof *b);
    if (b) kv->n_alloc++;
    return b;
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
                kv->free_list[kv->n_free++] = s->blocks[--s->n_blocks];
            return strata_errf(STRATA_ENOMEM, "out of memory for a KV block");
        }
        s->blocks[s->n_blocks++] = b;
    }
    while (s->n_blocks > need) kv->free_list[kv->n_free++] = s->blocks[--s->n_blocks];
    s->n_tokens = n_tokens;
    return 0;
}

void kv_seq_fini(struct kv_cache *kv, struct kv_seq *s)
{
    while (s->n_blocks) kv->free_list[kv->n_free++] = s->blocks[--s->n_blocks];
    free(s->blocks);
    kv_seq_init(s);
}

static float *row(const struct kv_cache *kv, const struct kv_seq *s, uint32_t layer, uint32_t pos,
                  int v)
{
    const struct kv_config *c = &kv->cfg;
    float *base = s->blocks[pos / c->block_tokens] +
                  (size_t)layer * c->block_tokens * (c->k_dim + c->v_dim);
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
