#include "gpu-worker/backend.h"
#include "gpu-worker/hybrid_plan.h"
#include "common/base/err.h"
#include "common/base/log.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const struct backend_ops backend_cpu_ops;
#ifdef STRATA_HAVE_CUDA
extern const struct backend_ops backend_cuda_ops;
#endif

/* The one registration point: the first available backend is the default (the CPU's, until
 * `strata serve` picks GPUs itself). */
static const struct backend_ops *const registry[] = {
    &backend_cpu_ops,
#ifdef STRATA_HAVE_CUDA
    &backend_cuda_ops,
#endif
};
#define N_BACKENDS (sizeof registry / sizeof registry[0])

struct backend {
    const struct backend_ops *ops;
    void *impl;
    const struct model *m;
    struct kv_cache *kv;
    uint32_t max_pass_tokens;
    struct backend_token *chunk; /* (max_pass_tokens) backend_prompt's batch */
};

struct backend_opts backend_opts_default(void)
{
    /* the hybrid registers an arena's experts whole and sends a prompt chunk's missed experts
     * over PCIe where the bus beats the CPU (measured at start): on the H200 that made a 512-token
     * prompt 2.7x faster with no expert in VRAM (docs/hybrid.md) */
    return (struct backend_opts){
        .tier = TIER_OPTS_DEFAULT, .pin = HYB_PIN_WHOLE, .pcie_threshold = BACKEND_PCIE_AUTO};
}

void backend_kv_config(const struct model *m, uint32_t n_ctx, uint32_t n_seq, struct kv_config *out)
{
    const struct model_hparams *hp = &m->hp;
    if (n_ctx == 0) n_ctx = hp->n_ctx_train;
    out->n_layer = hp->n_layer;
    out->k_dim = hp->n_head_kv * hp->head_dim;
    /* MLA (deepseek2) stores no V rows: its values are the first head_dim_v floats of each K row,
     * the latent (kv_pos_bytes then counts what llama.cpp's MLA cache holds) */
    out->v_dim = hp->mla ? 0 : hp->n_head_kv * hp->head_dim_v;
    out->v_head = hp->mla ? 0 : hp->head_dim_v;
    out->block_tokens = BACKEND_KV_BLOCK;
    out->n_ctx = n_ctx;
    out->max_blocks = (n_ctx + BACKEND_KV_BLOCK - 1) / BACKEND_KV_BLOCK * (n_seq ? n_seq : 1);
}

const char *const *backend_names(void)
{
    static const char *names[N_BACKENDS + 1];
    for (size_t i = 0; i < N_BACKENDS; i++)
        names[i] = registry[i]->name;
    return names;
}

static const struct backend_ops *find(const char *name)
{
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (strcmp(registry[i]->name, name) == 0) return registry[i];
    return NULL;
}

static bool ops_available(const struct backend_ops *ops)
{
    return !ops->available || ops->available();
}

bool backend_available(const char *name)
{
    const struct backend_ops *ops = find(name);
    return ops && ops_available(ops);
}

int backend_start(const struct model *m, const struct backend_opts *o, struct backend **out)
{
    const struct backend_ops *ops = NULL;
    if (o->name) {
        if (!(ops = find(o->name))) {
            char list[128] = "";
            for (size_t i = 0; i < N_BACKENDS; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                         registry[i]->name);
            return strata_errf(STRATA_ENOENT, "no backend '%s': this build has %s", o->name, list);
        }
        if (!ops_available(ops))
            return strata_errf(STRATA_EUNSUPPORTED,
                               "backend '%s' cannot run on this machine: use --backend cpu",
                               o->name);
    } else {
        for (size_t i = 0; i < N_BACKENDS && !ops; i++)
            if (ops_available(registry[i])) ops = registry[i];
    }
    if (o->max_pass_tokens == 0)
        return strata_errf(STRATA_EINVAL,
                           "max_pass_tokens (tokens per forward pass) must be positive");
    struct backend *b = calloc(1, sizeof *b);
    if (!b) return strata_errf(STRATA_ENOMEM, "out of memory for the backend");
    b->ops = ops;
    b->m = m;
    b->max_pass_tokens = o->max_pass_tokens;
    struct kv_config kc;
    backend_kv_config(m, o->n_ctx, o->n_seq, &kc);
    if (o->kv_blocks) kc.max_blocks = o->kv_blocks;
    int rv;
    if (!(b->chunk = malloc(o->max_pass_tokens * sizeof *b->chunk))) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for a batch of %u tokens",
                         o->max_pass_tokens);
        goto fail;
    }
    if ((rv = kv_init(&kc, &b->kv)) != 0 || (rv = ops->start(m, o, b->kv, &b->impl)) != 0)
        goto fail;
    if (m->hp.mla) {
        /* what MLA saves: llama.cpp's latent cache against the heads' K and V it stands for */
        const struct model_hparams *hp = &m->hp;
        const uint64_t pos = kv_pos_bytes(&kc, o->kv_type),
                       mha = (uint64_t)hp->n_layer * hp->n_head *
                             (hp->head_dim_qk + hp->head_dim_vo) * (pos / hp->n_layer / kc.k_dim);
        LOG_INFO("KV cache (MLA): %u floats per position and layer (latent %u + rope key %u), "
                 "%.1f KiB per position over %u layers as %s (%.1f KiB without MLA)",
                 kc.k_dim, hp->n_lora_kv, hp->n_rot, (double)pos / 1024, hp->n_layer,
                 kv_type_name(o->kv_type), (double)mha / 1024);
    }
    *out = b;
    return 0;
fail:
    kv_fini(b->kv);
    free(b->chunk);
    free(b);
    return rv;
}

void backend_close(struct backend *b)
{
    if (!b) return;
    b->ops->quiesce(b->impl);
    b->ops->close(b->impl);
    kv_fini(b->kv);
    free(b->chunk);
    free(b);
}

struct kv_cache *backend_kv(const struct backend *b)
{
    return b->kv;
}

const struct model *backend_model(const struct backend *b)
{
    return b->m;
}

int backend_eval(struct backend *b, const struct backend_token *toks, uint32_t n, float *logits)
{
    const uint32_t V = b->m->hp.n_vocab;
    if (n == 0 || n > b->max_pass_tokens)
        return strata_errf(STRATA_EINVAL, "a forward pass of %u tokens: it takes 1..%u", n,
                           b->max_pass_tokens);
    for (uint32_t t = 0; t < n; t++) {
        if (toks[t].id < 0 || (uint32_t)toks[t].id >= V)
            return strata_errf(STRATA_EINVAL, "token id %d is outside the vocabulary of %u",
                               toks[t].id, V);
        if (toks[t].logits && !logits)
            return strata_errf(STRATA_EINVAL, "token %u asks for logits and there is no buffer",
                               t);
    }
    return b->ops->eval(b->impl, toks, n, logits);
}

int backend_prompt(struct backend *b, struct kv_seq *s, const int32_t *ids, uint32_t n,
                   uint32_t chunk, float *logits)
{
    if (chunk == 0 || chunk > b->max_pass_tokens) chunk = b->max_pass_tokens;
    for (uint32_t i = 0; i < n; i += chunk) {
        uint32_t c = n - i < chunk ? n - i : chunk;
        for (uint32_t j = 0; j < c; j++)
            b->chunk[j] = (struct backend_token){s, ids[i + j], logits && i + j == n - 1};
        int rv = backend_eval(b, b->chunk, c, logits);
        if (!rv) rv = backend_tick(b);
        if (rv) return rv;
    }
    return 0;
}

void backend_set_route(struct backend *b, backend_route_fn fn, void *ctx)
{
    b->ops->set_route(b->impl, fn, ctx);
}

int backend_tick(struct backend *b)
{
    return b->ops->tick(b->impl);
}

int backend_quiesce(struct backend *b)
{
    return b->ops->quiesce(b->impl);
}

int backend_resize(struct backend *b, uint64_t bytes)
{
    return b->ops->resize(b->impl, bytes);
}

void backend_info(const struct backend *b, struct backend_info *out)
{
    b->ops->info(b->impl, out);
}

void backend_get_stats(const struct backend *b, struct backend_stats *out)
{
    b->ops->get_stats(b->impl, out);
}

void backend_reset_stats(struct backend *b)
{
    b->ops->reset_stats(b->impl);
}

int backend_opt(struct backend_opts *o, const char *name, const char *value)
{
    if (strcmp(name, "backend") == 0) {
        if (!find(value)) {
            char list[128] = "";
            for (size_t i = 0; i < N_BACKENDS; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                         registry[i]->name);
            return strata_errf(STRATA_EINVAL, "--backend %s: this build has %s", value, list);
        }
        o->name = value;
        if (!o->kv_type_set && strcmp(value, "cuda") == 0) o->kv_type = KV_F16; /* the GPU's */
        return 0;
    }
    if (strcmp(name, "kv-type") == 0) {
        int rv = kv_type_parse(value, &o->kv_type);
        if (rv == 0) o->kv_type_set = true;
        return rv;
    }
    if (strcmp(name, "vram-reserve-mib") == 0) {
        char *end;
        unsigned long v = strtoul(value, &end, 10);
        if (!*value || *end || v == 0 || v > (1ul << 20))
            return strata_errf(STRATA_EINVAL,
                               "--vram-reserve-mib %s: give MiB of VRAM to leave, 1 to 1048576",
                               value);
        o->vram_reserve_mib = (uint32_t)v;
        return 0;
    }
    if (strcmp(name, "expert-cache") == 0) return cache_spec_parse(value, &o->expert_cache);
    if (strcmp(name, "pcie-threshold") == 0 && strcmp(value, "auto") == 0) {
        o->pcie_threshold = BACKEND_PCIE_AUTO;
        return 0;
    }
    if (strcmp(name, "pin") == 0) {
        enum hyb_pin p;
        int rv = hyb_pin_parse(value, &p);
        if (rv == 0) o->pin = (uint8_t)p;
        return rv;
    }
    static const struct {
        const char *name;
        int is_float;
        size_t off;
        double lo, hi;
    } nums[] = {
        {"adapt-every", 0, offsetof(struct backend_opts, tier.every), 0, 1e6},
        {"adapt-swaps", 0, offsetof(struct backend_opts, tier.swaps), 0, 1e6},
        {"adapt-decay", 1, offsetof(struct backend_opts, tier.decay), 0, 1},
        {"adapt-min", 1, offsetof(struct backend_opts, tier.min_count), 0, 1e9},
        {"adapt-lead", 1, offsetof(struct backend_opts, tier.lead), 0, 1e9},
        {"pcie-frac", 1, offsetof(struct backend_opts, pcie_frac), 0, 1},
        {"pcie-threshold", 0, offsetof(struct backend_opts, pcie_threshold), 0, 1e6},
        {"vram-mib", 0, offsetof(struct backend_opts, vram_mib), 0, 1 << 24},
        {"gpu", 0, offsetof(struct backend_opts, gpu), 0, 1023},
    };
    if (strcmp(name, "cache-verify") == 0 || strcmp(name, "adapt-async") == 0 ||
        strcmp(name, "slot-kv") == 0) {
        if (strcmp(value, "0") != 0 && strcmp(value, "1") != 0)
            return strata_errf(STRATA_EINVAL, "--%s %s: give 0 or 1", name, value);
        *(name[0] == 'c' ? &o->cache_verify : name[0] == 's' ? &o->slot_kv : &o->tier.async) =
            value[0] == '1';
        return 0;
    }
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        if (strcmp(name, nums[i].name) != 0) continue;
        char *end;
        double v = strtod(value, &end);
        if (end == value || *end || v < nums[i].lo || v > nums[i].hi ||
            (!nums[i].is_float && v != (double)(uint32_t)v))
            return strata_errf(STRATA_EINVAL, "--%s %s: give %s from %g to %g", name, value,
                               nums[i].is_float ? "a number" : "a whole number", nums[i].lo,
                               nums[i].hi);
        char *field = (char *)o + nums[i].off;
        if (nums[i].is_float)
            *(float *)field = (float)v;
        else
            *(uint32_t *)field = (uint32_t)v;
        return 0;
    }
    return STRATA_ENOENT;
}
