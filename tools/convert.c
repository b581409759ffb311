#include "tools/convert.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- safetensors ----------------------------------------------------------------------------- */

struct st_tensor {
    char *name;
    uint32_t dtype; /* QT_F32, QT_F16, QT_BF16 */
    uint32_t n_dims;
    uint64_t shape[4]; /* as stored: the last dimension is the row */
    const uint8_t *data;
};

struct st_map {
    void *map;
    size_t size;
};

struct ckpt {
    struct st_tensor *t;
    size_t n, cap;
    struct st_map *maps;
    size_t n_maps;
};

static int st_dtype(const char *s, uint32_t *out)
{
    if (strcmp(s, "F32") == 0) *out = QT_F32;
    else if (strcmp(s, "F16") == 0) *out = QT_F16;
    else if (strcmp(s, "BF16") == 0) *out = QT_BF16;
    else return STRATA_EUNSUPPORTED;
    return 0;
}

static int st_open(struct ckpt *c, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return strata_errf(strata_errno(errno), "%s: cannot open", path);
    struct stat st;
    int rv = 0;
    json_t *hdr = NULL;
    if (fstat(fd, &st) != 0 || st.st_size < 8) {
        close(fd);
        return strata_errf(STRATA_ETRUNC, "%s: not a safetensors file (%lld bytes)", path,
                           (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return strata_errf(strata_errno(errno), "%s: cannot map", path);
    struct st_map *maps = realloc(c->maps, (c->n_maps + 1) * sizeof *maps);
    if (!maps) {
        munmap(map, (size_t)st.st_size);
        return STRATA_ENOMEM;
    }
    c->maps = maps;
    c->maps[c->n_maps++] = (struct st_map){map, (size_t)st.st_size};
    uint64_t hlen;
    memcpy(&hlen, map, 8);
    if (hlen > (uint64_t)st.st_size - 8)
        return strata_errf(STRATA_EFORMAT, "%s: header of %llu bytes past the end", path,
                           (unsigned long long)hlen);
    json_error_t je;
    hdr = json_loadb((const char *)map + 8, hlen, 0, &je);
    if (!json_is_object(hdr)) {
        rv = strata_errf(STRATA_EFORMAT, "%s: header is not a JSON object: %s", path, je.text);
        goto out;
    }
    const uint8_t *base = (const uint8_t *)map + 8 + hlen;
    const uint64_t data_bytes = (uint64_t)st.st_size - 8 - hlen;
    const char *key;
    json_t *v;
    json_object_foreach(hdr, key, v)
    {
        if (strcmp(key, "__metadata__") == 0) continue;
        struct st_tensor t = {0};
        json_t *sh = json_object_get(v, "shape"), *off = json_object_get(v, "data_offsets");
        const char *dt = json_string_value(json_object_get(v, "dtype"));
        if (!dt || !json_is_array(sh) || json_array_size(sh) > 4 || json_array_size(off) != 2) {
            rv = strata_errf(STRATA_EFORMAT, "%s: tensor %s: bad dtype, shape or offsets", path,
                             key);
            goto out;
        }
        if (st_dtype(dt, &t.dtype) != 0) {
            rv = strata_errf(STRATA_EUNSUPPORTED, "%s: tensor %s has dtype %s: F32, F16 or BF16 "
                             "expected", path, key, dt);
            goto out;
        }
        uint64_t n = 1;
        t.n_dims = (uint32_t)json_array_size(sh);
        for (uint32_t d = 0; d < t.n_dims; d++) {
            t.shape[d] = (uint64_t)json_integer_value(json_array_get(sh, d));
            n *= t.shape[d];
        }
        uint64_t b = (uint64_t)json_integer_value(json_array_get(off, 0)),
                 e = (uint64_t)json_integer_value(json_array_get(off, 1));
        if (b > e || e > data_bytes || e - b != n * qtype_get(t.dtype)->bytes) {
            rv = strata_errf(STRATA_EFORMAT, "%s: tensor %s: offsets [%llu, %llu) do not hold "
                             "its %llu elements", path, key, (unsigned long long)b,
                             (unsigned long long)e, (unsigned long long)n);
            goto out;
        }
        t.data = base + b;
        if (c->n == c->cap) {
            size_t cap = c->cap ? 2 * c->cap : 256;
            struct st_tensor *nt = realloc(c->t, cap * sizeof *nt);
            if (!nt) {
                rv = STRATA_ENOMEM;
                goto out;
            }
            c->t = nt;
            c->cap = cap;
        }
        if (!(t.name = strdup(key))) {
            rv = STRATA_ENOMEM;
            goto out;
        }
        c->t[c->n++] = t;
    }
out:
    json_decref(hdr);
    return rv;
}

static void ckpt_close(struct ckpt *c)
{
    for (size_t i = 0; i < c->n; i++) free(c->t[i].name);
    free(c->t);
    for (size_t i = 0; i < c->n_maps; i++) munmap(c->maps[i].map, c->maps[i].size);
    free(c->maps);
}

static int ckpt_open(struct ckpt *c, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return strata_errf(strata_errno(errno), "%s: cannot open the checkpoint folder", dir);
    struct dirent *de;
    int rv = 0;
    char path[4096];
    while (rv == 0 && (de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 12 || strcmp(de->d_name + n - 12, ".safetensors") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        rv = st_open(c, path);
    }
    closedir(d);
    if (rv == 0 && c->n == 0)
        rv = strata_errf(STRATA_ENOENT, "%s holds no *.safetensors file", dir);
    return rv;
}

static const struct st_tensor *ckpt_find(const struct ckpt *c, const char *name)
{
    /* O(n): a few thousand tensors at most, looked up once each. */
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->t[i].name, name) == 0) return &c->t[i];
    return NULL;
}

/* ---- the plan: output tensors, each a list of source row ranges ------------------------------ */

/* One expert's (or the whole tensor's) rows: rows [row0, row0 + ne1) of src, flattened over its
 * leading dimensions. */
struct piece {
    const struct st_tensor *src;
    uint64_t row0;
};

struct out_tensor {
    char name[96];
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[3];      /* ggml order: row length, rows, experts */
    struct piece *piece; /* ne[2] pieces */
    uint32_t perm_heads; /* > 0: permute rows of this many heads to adjacent-pair RoPE */
};

struct plan {
    struct out_tensor *t;
    size_t n, cap;
};

static int src_rows(const struct st_tensor *s, uint64_t *rows)
{
    *rows = 1;
    for (uint32_t d = 0; d + 1 < s->n_dims; d++) *rows *= s->shape[d];
    return 0;
}

/* Where an output tensor's rows come from: each expert's slice of the source has src_per rows
 * (ne1, or 2*ne1 for a fused gate_up) and the output takes ne1 of them from row_off. */
struct rows_from {
    uint64_t src_per, row_off;
};

static int add_rows(struct plan *p, const struct ckpt *c, uint32_t type, uint32_t n_dims,
                    uint64_t ne0, uint64_t ne1, uint64_t n_exp, const char *src_fmt,
                    struct rows_from rf, uint32_t perm_heads, const char *fmt, va_list ap);

/* add plans tensor fmt(...) of (n_exp, ne1, ne0) from src_fmt (with %llu for an expert index when
 * the sources are per expert; one stacked source otherwise), all rows of each expert's slice. */
static int add(struct plan *p, const struct ckpt *c, uint32_t type, uint32_t n_dims,
               uint64_t ne0, uint64_t ne1, uint64_t n_exp, const char *src_fmt,
               uint32_t perm_heads, const char *fmt, ...) __attribute__((format(printf, 10, 11)));
static int add(struct plan *p, const struct ckpt *c, uint32_t type, uint32_t n_dims,
               uint64_t ne0, uint64_t ne1, uint64_t n_exp, const char *src_fmt,
               uint32_t perm_heads, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rv = add_rows(p, c, type, n_dims, ne0, ne1, n_exp, src_fmt, (struct rows_from){ne1, 0},
                      perm_heads, fmt, ap);
    va_end(ap);
    return rv;
}

/* add_fused plans gate (half 0) or up (half 1) of a fused (n_exp, 2*ff, n_embd) gate_up. */
static int add_fused(struct plan *p, const struct ckpt *c, uint32_t type, uint64_t ne0,
                     uint64_t ne1, uint64_t n_exp, const char *src, int half, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));
static int add_fused(struct plan *p, const struct ckpt *c, uint32_t type, uint64_t ne0,
                     uint64_t ne1, uint64_t n_exp, const char *src, int half, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rv = add_rows(p, c, type, 3, ne0, ne1, n_exp, src,
                      (struct rows_from){2 * ne1, half * ne1}, 0, fmt, ap);
    va_end(ap);
    return rv;
}

static int add_rows(struct plan *p, const struct ckpt *c, uint32_t type, uint32_t n_dims,
                    uint64_t ne0, uint64_t ne1, uint64_t n_exp, const char *src_fmt,
                    struct rows_from rf, uint32_t perm_heads, const char *fmt, va_list ap)
{
    const uint64_t src_per = rf.src_per, row_off = rf.row_off;
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 256;
        struct out_tensor *nt = realloc(p->t, cap * sizeof *nt);
        if (!nt) return STRATA_ENOMEM;
        p->t = nt;
        p->cap = cap;
    }
    struct out_tensor *o = &p->t[p->n];
    *o = (struct out_tensor){.n_dims = n_dims, .ne = {ne0, ne1, n_exp}, .perm_heads = perm_heads};
    vsnprintf(o->name, sizeof o->name, fmt, ap);
    /* Q8_0 needs rows of whole 32-element blocks; llama.cpp falls back to F16 likewise. */
    o->type = type == QT_Q8_0 && ne0 % 32 ? QT_F16 : type;
    if (!(o->piece = calloc(n_exp, sizeof *o->piece))) return STRATA_ENOMEM;
    p->n++;
    char name[160];
    bool per_expert = strstr(src_fmt, "%llu") != NULL;
    for (uint64_t e = 0; e < n_exp; e++) {
        snprintf(name, sizeof name, src_fmt, (unsigned long long)e);
        const struct st_tensor *s = ckpt_find(c, name);
        if (!s) return strata_errf(STRATA_ENOENT, "tensor %s is missing from the checkpoint", name);
        uint64_t rows, need = per_expert ? src_per : n_exp * src_per;
        src_rows(s, &rows);
        if (s->shape[s->n_dims - 1] != ne0 || rows != need)
            return strata_errf(STRATA_EFORMAT,
                               "tensor %s: %llu rows of %llu, expected %llu rows of %llu for %s",
                               name, (unsigned long long)rows,
                               (unsigned long long)s->shape[s->n_dims - 1],
                               (unsigned long long)need, (unsigned long long)ne0, o->name);
        o->piece[e] = (struct piece){s, (per_expert ? 0 : e * src_per) + row_off};
    }
    return 0;
}

static void plan_free(struct plan *p)
{
    for (size_t i = 0; i < p->n; i++) free(p->t[i].piece);
    free(p->t);
}

/* ---- config ------------------------------------------------------------------------------------ */

struct hf {
    const char *arch; /* GGUF architecture */
    bool mixtral;
    uint64_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ff_exp, n_ff_shexp;
    uint64_t n_expert, n_used, n_ctx, n_vocab;
    double eps, theta;
    bool tied, has_norm_topk, norm_topk;
};

static int cfg_u64(json_t *cfg, const char *key, const uint64_t *dflt, uint64_t *out)
{
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        if (!dflt) return strata_errf(STRATA_ENOENT, "config.json has no \"%s\"", key);
        *out = *dflt;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return strata_errf(STRATA_EFORMAT, "config.json: \"%s\" must be a non-negative integer",
                           key);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* cfg_experts: the expert count; transformers 4.x wrote "num_experts" for Qwen and OLMoE and
 * "num_local_experts" for Mixtral, 5.x writes "num_local_experts" everywhere. */
static int cfg_experts(json_t *cfg, uint64_t *out)
{
    if (json_object_get(cfg, "num_local_experts")) return cfg_u64(cfg, "num_local_experts", NULL, out);
    if (json_object_get(cfg, "num_experts")) return cfg_u64(cfg, "num_experts", NULL, out);
    return strata_errf(STRATA_ENOENT, "config.json has neither \"num_experts\" nor "
                                      "\"num_local_experts\"");
}

static int parse_config(json_t *cfg, struct hf *h)
{
    const char *a = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
    static const char *const map[][2] = {{"Qwen3MoeForCausalLM", "qwen3moe"},
                                         {"MixtralForCausalLM", "llama"},
                                         {"OlmoeForCausalLM", "olmoe"},
                                         {"Qwen2MoeForCausalLM", "qwen2moe"}};
    for (size_t i = 0; a && i < sizeof map / sizeof map[0]; i++)
        if (strcmp(a, map[i][0]) == 0) h->arch = map[i][1];
    if (!h->arch)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "config.json architecture '%s': convert handles Qwen3MoeForCausalLM, "
                           "MixtralForCausalLM, OlmoeForCausalLM and Qwen2MoeForCausalLM",
                           a ? a : "(none)");
    h->mixtral = strcmp(h->arch, "llama") == 0;
    int rv;
    uint64_t zero = 0, one = 1;
    if ((rv = cfg_u64(cfg, "hidden_size", NULL, &h->n_embd)) ||
        (rv = cfg_u64(cfg, "num_hidden_layers", NULL, &h->n_layer)) ||
        (rv = cfg_u64(cfg, "num_attention_heads", NULL, &h->n_head)) ||
        (rv = cfg_u64(cfg, "num_key_value_heads", &h->n_head, &h->n_head_kv)) ||
        (rv = cfg_u64(cfg, "intermediate_size", NULL, &h->n_ff)) ||
        (rv = cfg_u64(cfg, "moe_intermediate_size", &h->n_ff, &h->n_ff_exp)) ||
        (rv = cfg_u64(cfg, "shared_expert_intermediate_size", &zero, &h->n_ff_shexp)) ||
        (rv = cfg_experts(cfg, &h->n_expert)) ||
        (rv = cfg_u64(cfg, "num_experts_per_tok", NULL, &h->n_used)) ||
        (rv = cfg_u64(cfg, "max_position_embeddings", NULL, &h->n_ctx)) ||
        (rv = cfg_u64(cfg, "vocab_size", NULL, &h->n_vocab)))
        return rv;
    if (h->n_head == 0 || h->n_embd % h->n_head)
        return strata_errf(STRATA_EFORMAT, "config.json: hidden_size %llu, %llu heads",
                           (unsigned long long)h->n_embd, (unsigned long long)h->n_head);
    uint64_t hd = h->n_embd / h->n_head;
    if ((rv = cfg_u64(cfg, "head_dim", &hd, &h->head_dim))) return rv;
    uint64_t step;
    if ((rv = cfg_u64(cfg, "decoder_sparse_step", &one, &step))) return rv;
    json_t *mlp_only = json_object_get(cfg, "mlp_only_layers");
    if (step != 1 || json_array_size(mlp_only) > 0)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "config.json: dense layers (decoder_sparse_step %llu, %zu "
                           "mlp_only_layers) are not supported: every layer must be MoE",
                           (unsigned long long)step, json_array_size(mlp_only));
    json_t *rs = json_object_get(cfg, "rope_scaling"), *clip = json_object_get(cfg, "clip_qkv");
    if ((rs && !json_is_null(rs)) || (clip && !json_is_null(clip)))
        return strata_errf(STRATA_EUNSUPPORTED,
                           "config.json: rope_scaling and clip_qkv are not supported");
    json_t *eps = json_object_get(cfg, "rms_norm_eps"), *th = json_object_get(cfg, "rope_theta");
    if (!json_is_number(eps))
        return strata_errf(STRATA_ENOENT, "config.json has no numeric \"rms_norm_eps\"");
    h->eps = json_number_value(eps);
    /* transformers 5.x moved rope_theta and rope_scaling into "rope_parameters" */
    json_t *rp = json_object_get(cfg, "rope_parameters");
    if (json_is_object(rp)) {
        const char *type = json_string_value(json_object_get(rp, "rope_type"));
        if (type && strcmp(type, "default") != 0)
            return strata_errf(STRATA_EUNSUPPORTED,
                               "config.json: rope_parameters.rope_type \"%s\" is not supported", type);
        if (!json_is_number(th)) th = json_object_get(rp, "rope_theta");
    }
    h->theta = json_is_number(th) ? json_number_value(th) : 10000.0;
    json_t *tie = json_object_get(cfg, "tie_word_embeddings");
    h->tied = json_is_true(tie);
    json_t *nt = json_object_get(cfg, "norm_topk_prob");
    h->has_norm_topk = json_is_boolean(nt);
    h->norm_topk = json_is_true(nt);
    if (h->n_used == 0 || h->n_used > h->n_expert)
        return strata_errf(STRATA_EFORMAT, "config.json: num_experts_per_tok %llu of %llu experts",
                           (unsigned long long)h->n_used, (unsigned long long)h->n_expert);
    return 0;
}

/* moe_block: Mixtral checkpoints of transformers 4.x name the MoE block "block_sparse_moe", 5.x
 * and the Qwen/OLMoE ones "mlp". */
static const char *moe_block(const struct ckpt *c, unsigned long long L)
{
    char name[160];
    snprintf(name, sizeof name, "model.layers.%llu.block_sparse_moe.gate.weight", L);
    return ckpt_find(c, name) ? "block_sparse_moe" : "mlp";
}

/* moe_name writes "model.layers.L.<block>.<leaf>" into buf (160 bytes) and returns it. */
static const char *moe_name(const struct ckpt *c, unsigned long long L, const char *leaf, char *buf)
{
    snprintf(buf, 160, "model.layers.%llu.%s.%s", L, moe_block(c, L), leaf);
    return buf;
}

/* copy_vocab copies every tokenizer.* key of the GGUF at path into w, after checking that its
 * vocabulary has the model's n_vocab tokens (the embedding and output rows). */
static int copy_vocab(struct gguf_writer *w, const char *path, uint64_t n_vocab)
{
    struct gguf_file *v;
    int rv = gguf_open(path, &v);
    if (rv) return rv;
    const struct gguf_value *toks;
    if ((rv = gguf_get_arr(v, "tokenizer.ggml.tokens", GGUF_STRING, &toks))) goto out;
    if (toks->arr.n != n_vocab) {
        rv = strata_errf(STRATA_EINVAL, "--vocab %s has %llu tokens, the model's vocab_size is %llu",
                         path, (unsigned long long)toks->arr.n, (unsigned long long)n_vocab);
        goto out;
    }
    for (uint64_t i = 0; i < v->n_kv; i++)
        if (strncmp(v->kv[i].key, "tokenizer.", 10) == 0 &&
            (rv = gguf_w_value(w, v->kv[i].key, &v->kv[i].val)))
            goto out;
out:
    gguf_close(v);
    return rv;
}

static int build_plan(const struct hf *h, const struct ckpt *c, uint32_t wt, struct plan *p)
{
    const uint64_t E = h->n_embd, nq = h->n_head * h->head_dim, nk = h->n_head_kv * h->head_dim,
                   F = h->n_ff_exp, X = h->n_expert;
    int rv;
    char s[160];
    if ((rv = add(p, c, wt, 2, E, h->n_vocab, 1, "model.embed_tokens.weight", 0,
                  "token_embd.weight")))
        return rv;
    for (uint64_t l = 0; l < h->n_layer; l++) {
        const unsigned long long L = (unsigned long long)l;
#define SRC(fmt) (snprintf(s, sizeof s, "model.layers.%llu." fmt, L), s)
        if ((rv = add(p, c, QT_F32, 1, E, 1, 1, SRC("input_layernorm.weight"), 0,
                      "blk.%llu.attn_norm.weight", L)) ||
            (rv = add(p, c, wt, 2, E, nq, 1, SRC("self_attn.q_proj.weight"),
                      h->mixtral ? (uint32_t)h->n_head : 0, "blk.%llu.attn_q.weight", L)) ||
            (rv = add(p, c, wt, 2, E, nk, 1, SRC("self_attn.k_proj.weight"),
                      h->mixtral ? (uint32_t)h->n_head_kv : 0, "blk.%llu.attn_k.weight", L)) ||
            (rv = add(p, c, wt, 2, E, nk, 1, SRC("self_attn.v_proj.weight"), 0,
                      "blk.%llu.attn_v.weight", L)) ||
            (rv = add(p, c, wt, 2, nq, E, 1, SRC("self_attn.o_proj.weight"), 0,
                      "blk.%llu.attn_output.weight", L)))
            return rv;
        if (strcmp(h->arch, "qwen2moe") == 0 &&
            ((rv = add(p, c, QT_F32, 1, nq, 1, 1, SRC("self_attn.q_proj.bias"), 0,
                       "blk.%llu.attn_q.bias", L)) ||
             (rv = add(p, c, QT_F32, 1, nk, 1, 1, SRC("self_attn.k_proj.bias"), 0,
                       "blk.%llu.attn_k.bias", L)) ||
             (rv = add(p, c, QT_F32, 1, nk, 1, 1, SRC("self_attn.v_proj.bias"), 0,
                       "blk.%llu.attn_v.bias", L))))
            return rv;
        const bool olmoe = strcmp(h->arch, "olmoe") == 0;
        if ((strcmp(h->arch, "qwen3moe") == 0 || olmoe) &&
            ((rv = add(p, c, QT_F32, 1, olmoe ? nq : h->head_dim, 1, 1,
                       SRC("self_attn.q_norm.weight"), 0, "blk.%llu.attn_q_norm.weight", L)) ||
             (rv = add(p, c, QT_F32, 1, olmoe ? nk : h->head_dim, 1, 1,
                       SRC("self_attn.k_norm.weight"), 0, "blk.%llu.attn_k_norm.weight", L))))
            return rv;
        char router_src[160];
        if ((rv = add(p, c, QT_F32, 1, E, 1, 1, SRC("post_attention_layernorm.weight"), 0,
                      "blk.%llu.ffn_norm.weight", L)) ||
            (rv = add(p, c, QT_F32, 2, E, X, 1, moe_name(c, L, "gate.weight", router_src), 0,
                      "blk.%llu.ffn_gate_inp.weight", L)))
            return rv;
        /* Experts: per-expert 2-D weights (stacked here), or fused 3-D ones. */
        char fused[160];
        snprintf(fused, sizeof fused, "model.layers.%llu.mlp.experts.gate_up_proj", L);
        if (ckpt_find(c, fused)) {
            if ((rv = add_fused(p, c, wt, E, F, X, fused, 0, "blk.%llu.ffn_gate_exps.weight", L)) ||
                (rv = add_fused(p, c, wt, E, F, X, fused, 1, "blk.%llu.ffn_up_exps.weight", L)) ||
                (rv = add(p, c, wt, 3, F, E, X, SRC("mlp.experts.down_proj"), 0,
                          "blk.%llu.ffn_down_exps.weight", L)))
                return rv;
        } else {
            static const char *const hfn[2][3] = {{"gate_proj", "up_proj", "down_proj"},
                                                  {"w1", "w3", "w2"}};
            static const char *const gn[3] = {"gate", "up", "down"};
            for (int k = 0; k < 3; k++) {
                char src[160];
                snprintf(src, sizeof src, "model.layers.%llu.%s.experts.%%llu.%s.weight", L,
                         moe_block(c, L), hfn[h->mixtral][k]);
                if ((rv = add(p, c, wt, 3, k == 2 ? F : E, k == 2 ? E : F, X, src, 0,
                              "blk.%llu.ffn_%s_exps.weight", L, gn[k])))
                    return rv;
            }
        }
        if (h->n_ff_shexp &&
            ((rv = add(p, c, QT_F32, 1, E, 1, 1, SRC("mlp.shared_expert_gate.weight"), 0,
                       "blk.%llu.ffn_gate_inp_shexp.weight", L)) ||
             (rv = add(p, c, wt, 2, E, h->n_ff_shexp, 1, SRC("mlp.shared_expert.gate_proj.weight"),
                       0, "blk.%llu.ffn_gate_shexp.weight", L)) ||
             (rv = add(p, c, wt, 2, E, h->n_ff_shexp, 1, SRC("mlp.shared_expert.up_proj.weight"),
                       0, "blk.%llu.ffn_up_shexp.weight", L)) ||
             (rv = add(p, c, wt, 2, h->n_ff_shexp, E, 1, SRC("mlp.shared_expert.down_proj.weight"),
                       0, "blk.%llu.ffn_down_shexp.weight", L))))
            return rv;
#undef SRC
    }
    if ((rv = add(p, c, QT_F32, 1, E, 1, 1, "model.norm.weight", 0, "output_norm.weight")))
        return rv;
    if (!h->tied && ckpt_find(c, "lm_head.weight") &&
        (rv = add(p, c, wt, 2, E, h->n_vocab, 1, "lm_head.weight", 0, "output.weight")))
        return rv;
    return 0;
}

static int write_kv(struct gguf_writer *w, const struct hf *h)
{
    char k[128];
    int rv;
#define KEY(s) (snprintf(k, sizeof k, "%s." s, h->arch), k)
    if ((rv = gguf_w_str(w, "general.architecture", h->arch)) ||
        (rv = gguf_w_str(w, "general.name", "converted by strata")) ||
        (rv = gguf_w_u32(w, KEY("context_length"), (uint32_t)h->n_ctx)) ||
        (rv = gguf_w_u32(w, KEY("embedding_length"), (uint32_t)h->n_embd)) ||
        (rv = gguf_w_u32(w, KEY("block_count"), (uint32_t)h->n_layer)) ||
        (rv = gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)h->n_ff)) ||
        (rv = gguf_w_u32(w, KEY("expert_feed_forward_length"), (uint32_t)h->n_ff_exp)) ||
        (rv = gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)h->n_head)) ||
        (rv = gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)h->n_head_kv)) ||
        (rv = gguf_w_u32(w, KEY("attention.key_length"), (uint32_t)h->head_dim)) ||
        (rv = gguf_w_u32(w, KEY("attention.value_length"), (uint32_t)h->head_dim)) ||
        (rv = gguf_w_u32(w, KEY("rope.dimension_count"), (uint32_t)h->head_dim)) ||
        (rv = gguf_w_f32(w, KEY("rope.freq_base"), (float)h->theta)) ||
        (rv = gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), (float)h->eps)) ||
        (rv = gguf_w_u32(w, KEY("expert_count"), (uint32_t)h->n_expert)) ||
        (rv = gguf_w_u32(w, KEY("expert_used_count"), (uint32_t)h->n_used)) ||
        (rv = gguf_w_u32(w, KEY("vocab_size"), (uint32_t)h->n_vocab)))
        return rv;
    if (h->n_ff_shexp &&
        (rv = gguf_w_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)h->n_ff_shexp)))
        return rv;
    if (h->has_norm_topk && !h->mixtral &&
        (rv = gguf_w_bool(w, KEY("expert_weights_norm"), h->norm_topk)))
        return rv;
#undef KEY
    return 0;
}

/* src_row converts row r of a piece's source to floats. */
static int src_row(const struct st_tensor *s, uint64_t r, uint64_t n, float *out)
{
    const struct qtype_info *q = qtype_get(s->dtype);
    return quant_dequantize(s->dtype, s->data + r * n * q->bytes, out, (int64_t)n);
}

static int write_tensor(struct gguf_writer *w, const struct out_tensor *o, float *row, void *qrow)
{
    uint64_t rb;
    int rv;
    if ((rv = qtype_row_bytes(o->type, o->ne[0], &rb))) return rv;
    const uint64_t hd = o->perm_heads ? o->ne[1] / o->perm_heads : 0;
    for (uint64_t e = 0; e < o->ne[2]; e++) {
        for (uint64_t r = 0; r < o->ne[1]; r++) {
            /* Hugging Face rotates halves of a head; llama's GGUF rotates adjacent pairs: output
             * row 2i+j of a head is source row j*hd/2 + i (llama.cpp's permute()). */
            uint64_t sr = r;
            if (hd) {
                uint64_t h = r / hd, x = r % hd;
                sr = h * hd + (x % 2) * (hd / 2) + x / 2;
            }
            if ((rv = src_row(o->piece[e].src, o->piece[e].row0 + sr, o->ne[0], row)) ||
                (rv = quant_quantize(o->type, row, qrow, (int64_t)o->ne[0])) ||
                (rv = gguf_writer_data(w, qrow, rb)))
                return rv;
        }
    }
    return 0;
}

int convert_hf(const struct convert_opts *o)
{
    if (o->type != QT_F32 && o->type != QT_F16 && o->type != QT_Q8_0)
        return strata_errf(STRATA_EINVAL, "convert writes f32, f16 or q8_0 weights, not %s",
                           qtype_name(o->type));
    struct ckpt c = {0};
    struct plan p = {0};
    struct gguf_writer *w = NULL;
    struct hf h = {0};
    float *row = NULL;
    void *qrow = NULL;
    json_error_t je;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", o->dir);
    json_t *cfg = json_load_file(path, 0, &je);
    int rv;
    if (!cfg) {
        rv = strata_errf(STRATA_ENOENT, "%s: %s", path, je.text);
        goto out;
    }
    if ((rv = parse_config(cfg, &h)) || (rv = ckpt_open(&c, o->dir)) ||
        (rv = build_plan(&h, &c, o->type, &p)))
        goto out;
    uint64_t widest = 0;
    for (size_t i = 0; i < p.n; i++) widest = p.t[i].ne[0] > widest ? p.t[i].ne[0] : widest;
    row = malloc(widest * sizeof *row);
    qrow = malloc(widest * sizeof *row);
    if (!row || !qrow) {
        rv = STRATA_ENOMEM;
        goto out;
    }
    if ((rv = gguf_writer_open(o->out, 0, &w)) || (rv = write_kv(w, &h)) ||
        (o->vocab && (rv = copy_vocab(w, o->vocab, h.n_vocab))))
        goto out;
    for (size_t i = 0; i < p.n; i++) {
        const struct out_tensor *t = &p.t[i];
        uint64_t ne[3] = {t->ne[0], t->ne[1], t->ne[2]};
        if ((rv = gguf_w_tensor(w, t->name, t->type, t->n_dims, ne))) goto out;
    }
    if ((rv = gguf_writer_begin(w))) goto out;
    for (size_t i = 0; i < p.n; i++)
        if ((rv = write_tensor(w, &p.t[i], row, qrow))) goto out;
    rv = gguf_writer_finish(w);
    w = NULL;
out:
    gguf_writer_abort(w);
    free(row);
    free(qrow);
    plan_free(&p);
    ckpt_close(&c);
    json_decref(cfg);
    return rv;
}
