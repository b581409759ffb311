#include "common/arena/model.h"
#include "common/arena/arena.h"
#include "common/base/err.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What model_load allocates: the layer table, the expert pointer table of the default resolver and
 * the F32 copies of norms and biases. */
struct model_priv {
    const void **exp_ptr;      /* [layer][expert][part]: where each part lies in the GGUF mapping */
    const struct arena *arena; /* model_load_arena: experts come from its blobs */
    void **owned;              /* F32 vectors */
    const struct model_hparams *hp; /* the model's */
    size_t n_owned, cap_owned;
};

static const char *const arch_names[] = {
    [MODEL_ARCH_LLAMA] = "llama",         [MODEL_ARCH_QWEN2MOE] = "qwen2moe",
    [MODEL_ARCH_QWEN3MOE] = "qwen3moe",   [MODEL_ARCH_OLMOE] = "olmoe",
    [MODEL_ARCH_GPT_OSS] = "gpt-oss",     [MODEL_ARCH_GLM4MOE] = "glm4moe",
    [MODEL_ARCH_DEEPSEEK2] = "deepseek2",
};

static const char *const part_names[MODEL_PART_COUNT] = {"gate", "up", "down"};

const char *model_arch_name(enum model_arch a)
{
    return (unsigned)a < sizeof arch_names / sizeof arch_names[0] ? arch_names[a] : "?";
}

static const void *gguf_expert_part(void *ctx, uint32_t layer, uint32_t expert,
                                    enum model_part part)
{
    const struct model *m = ctx;
    const struct model_priv *p = m->priv_;
    return p->exp_ptr[((size_t)layer * m->hp.n_expert + expert) * MODEL_BLOB_PARTS + part];
}

void model_set_expert_resolver(struct model *m, model_expert_fn fn, void *ctx)
{
    m->expert_part = fn;
    m->expert_ctx = ctx;
}

/* ---- keys ---------------------------------------------------------------------------------- */

/* arch_u32 reads "<arch>.<key>"; when dflt is non-NULL a missing key takes *dflt. */
static int arch_u32(const struct gguf_file *f, const char *arch, const char *key,
                    const uint32_t *dflt, uint32_t *out)
{
    char name[128];
    snprintf(name, sizeof name, "%s.%s", arch, key);
    if (dflt && !gguf_find(f, name)) {
        *out = *dflt;
        return 0;
    }
    int rv = gguf_get_u32(f, name, out);
    if (rv == STRATA_ENOENT)
        return strata_errf(rv, "key %s is missing: the file is not a complete %s model", name,
                           arch);
    if (rv)
        return strata_errf(rv, "key %s: %s (a per-layer array is not supported)", name,
                           strata_errdetail());
    return 0;
}

static int arch_f32(const struct gguf_file *f, const char *arch, const char *key, const float *dflt,
                    float *out)
{
    char name[128];
    snprintf(name, sizeof name, "%s.%s", arch, key);
    if (dflt && !gguf_find(f, name)) {
        *out = *dflt;
        return 0;
    }
    int rv = gguf_get_f32(f, name, out);
    if (rv == STRATA_ENOENT)
        return strata_errf(rv, "key %s is missing: the file is not a complete %s model", name,
                           arch);
    return rv;
}

/* ---- tensors ------------------------------------------------------------------------------- */

static int own(struct model_priv *p, void *ptr)
{
    if (p->n_owned == p->cap_owned) {
        size_t cap = p->cap_owned ? 2 * p->cap_owned : 64;
        void **o = realloc(p->owned, cap * sizeof *o);
        if (!o) return STRATA_ENOMEM;
        p->owned = o;
        p->cap_owned = cap;
    }
    p->owned[p->n_owned++] = ptr;
    return 0;
}

static const char *fmt_name(char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static const char *fmt_name(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return buf;
}

static int check_type(const struct gguf_tensor *t)
{
    const struct qtype_info *q = qtype_get(t->type);
    if (!q || !q->computable)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "tensor %s has type %s, which strata cannot compute with: requantize "
                           "the model to a supported type (f32, f16, bf16, q8_0, q4_0, q4_1, "
                           "q5_0, q5_1, q2_K..q6_K, iq4_nl, iq4_xs)",
                           t->name, qtype_name(t->type));
    if (t->ne[0] % q->blck)
        return strata_errf(STRATA_EFORMAT,
                           "tensor %s: rows of %llu elements are not a multiple "
                           "of %s's block of %u",
                           t->name, (unsigned long long)t->ne[0], q->name, q->blck);
    return 0;
}

/* check_shape: t must be (ne2, ne1, ne0) in ggml order, unused dims 1. */
static int check_shape(const struct gguf_tensor *t, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                       const char *what)
{
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1)
        return strata_errf(STRATA_EFORMAT,
                           "tensor %s has ne [%llu, %llu, %llu, %llu], expected [%llu, %llu, "
                           "%llu] %s: the file does not match its own hyperparameters",
                           t->name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                           (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
                           (unsigned long long)ne0, (unsigned long long)ne1,
                           (unsigned long long)ne2, what);
    return check_type(t);
}

static int find(const struct gguf_file *f, const char *name, const struct gguf_tensor **out)
{
    *out = gguf_tensor_find(f, name);
    if (!*out) return strata_errf(STRATA_ENOENT, "tensor %s is missing from the model", name);
    return 0;
}

static void mat_of(const struct gguf_tensor *t, struct model_mat *out)
{
    const struct qtype_info *q = qtype_get(t->type);
    out->data = t->data;
    out->type = t->type;
    out->n_in = (uint32_t)t->ne[0];
    out->n_out = (uint32_t)t->ne[1];
    out->row_bytes = t->ne[0] / q->blck * q->bytes;
}

static int get_mat(const struct gguf_file *f, const char *name, uint32_t n_in, uint32_t n_out,
                   const char *what, struct model_mat *out)
{
    const struct gguf_tensor *t;
    int rv;
    if ((rv = find(f, name, &t)) != 0) return rv;
    if ((rv = check_shape(t, n_in, n_out, 1, what)) != 0) return rv;
    mat_of(t, out);
    return 0;
}

/* get_vec dequantizes the 1-D tensor name of n elements into an owned F32 array. */
static int get_vec(const struct gguf_file *f, struct model_priv *p, const char *name, uint32_t n,
                   const char *what, const float **out)
{
    const struct gguf_tensor *t;
    int rv;
    if ((rv = find(f, name, &t)) != 0) return rv;
    if ((rv = check_shape(t, n, 1, 1, what)) != 0) return rv;
    float *v = malloc((size_t)n * sizeof *v);
    if (!v || own(p, v) != 0) {
        free(v);
        return strata_errf(STRATA_ENOMEM, "out of memory for tensor %s", name);
    }
    if ((rv = quant_dequantize(t->type, t->data, v, n)) != 0) return rv;
    *out = v;
    return 0;
}

/* ---- architecture ---------------------------------------------------------------------------- */

static int parse_arch(const struct gguf_file *f, enum model_arch *out)
{
    struct gguf_str s;
    int rv = gguf_get_str(f, "general.architecture", &s);
    if (rv)
        return strata_errf(rv, "key general.architecture is missing or not a string: not a "
                               "model file");
    for (size_t i = 0; i < sizeof arch_names / sizeof arch_names[0]; i++) {
        if (strlen(arch_names[i]) == s.len && memcmp(arch_names[i], s.ptr, s.len) == 0) {
            *out = (enum model_arch)i;
            return 0;
        }
    }
    return strata_errf(STRATA_EUNSUPPORTED,
                       "architecture '%.*s' is not supported: strata runs llama (with experts), "
                       "qwen2moe, qwen3moe, olmoe, gpt-oss, glm4moe and deepseek2",
                       (int)(s.len > 64 ? 64 : s.len), s.ptr);
}

/* parse_mla: deepseek2's attention keys. Current converters write key_length / value_length as
 * the MLA cache's (kv_lora_rank + n_rot, kv_lora_rank) and the heads' as key_length_mla /
 * value_length_mla; older files have only the heads' (and attn_kv_b instead of attn_k_b and
 * attn_v_b). Both run as MLA here: the cache holds the latent and the rope key. Also the expert
 * groups and the attention scale under YaRN (llama.cpp's deepseek2 graph). */
static int parse_mla(const struct gguf_file *f, const char *a, struct model_hparams *hp)
{
    int rv;
    char name[128];
    const uint32_t zero = 0, one = 1;
    if ((rv = arch_u32(f, a, "attention.q_lora_rank", &zero, &hp->n_lora_q)) != 0 ||
        (rv = arch_u32(f, a, "attention.kv_lora_rank", NULL, &hp->n_lora_kv)) != 0 ||
        (rv = arch_u32(f, a, "attention.key_length_mla", &hp->head_dim, &hp->head_dim_qk)) != 0 ||
        (rv = arch_u32(f, a, "attention.value_length_mla", &hp->head_dim_v, &hp->head_dim_vo)) !=
            0 ||
        (rv = arch_u32(f, a, "expert_group_count", &one, &hp->n_group)) != 0 ||
        (rv = arch_u32(f, a, "expert_group_used_count", &hp->n_group, &hp->n_group_used)) != 0)
        return rv;
    if (hp->n_lora_kv == 0 || hp->head_dim_qk <= hp->n_rot || hp->head_dim_vo == 0)
        return strata_errf(STRATA_EFORMAT,
                           "%s: kv_lora_rank %u, key head %u with %u rotated dims, value head %u: "
                           "the latent must be non-empty and a key head longer than its rope "
                           "part",
                           a, hp->n_lora_kv, hp->head_dim_qk, hp->n_rot, hp->head_dim_vo);
    if (hp->n_group == 0 || hp->n_group > 64 || hp->n_expert % hp->n_group ||
        hp->n_group_used == 0 || hp->n_group_used > hp->n_group)
        return strata_errf(STRATA_EFORMAT,
                           "%s.expert_group_count %u, expert_group_used_count %u: groups must "
                           "split the %u experts evenly (at most 64 groups) and keep 1..all",
                           a, hp->n_group, hp->n_group_used, hp->n_expert);
    float log_mul = 0.0f;
    if ((rv = arch_f32(f, a, "rope.scaling.yarn_log_multiplier", &log_mul, &log_mul)) != 0)
        return rv;
    const float mscale = hp->yarn_factor > 1.0f ? 1.0f + log_mul * logf(hp->yarn_factor) : 1.0f;
    hp->kq_scale = mscale * mscale / sqrtf((float)hp->head_dim_qk);
    hp->mla = true;
    hp->n_head_kv = 1;
    hp->head_dim = hp->n_lora_kv + hp->n_rot;
    hp->head_dim_v = hp->n_lora_kv;
    snprintf(name, sizeof name, "blk.%u.exp_probs_b.bias", hp->n_dense_lead);
    hp->exp_probs_b = gguf_tensor_find(f, name) != NULL; /* V3 and later; V2 has none */
    return 0;
}

/* parse_glm4moe: llama.cpp's GLM4_MOE hparams: NEOX RoPE over rope.dimension_count (half the
 * head), sigmoid gating with the selection bias (expert_gating_func 2, the default), the routed
 * weights scaled by expert_weights_scale and renormalized when expert_weights_norm, the leading
 * dense layers, q/k norms when the file has them (GLM-4.5 does, Air does not), and a shared
 * expert of expert_shared_count expert widths, ungated. */
static int parse_glm4moe(const struct gguf_file *f, const char *a, struct model_hparams *hp)
{
    int rv;
    char name[128];
    /* a deepseek2 file without the key is DeepSeek-V2's: softmax (llama.cpp's default) */
    const uint32_t zero = 0, sigmoid = hp->arch == MODEL_ARCH_DEEPSEEK2 ? 1 : 2;
    uint32_t gating, n_shared;
    hp->rope = MODEL_ROPE_NEOX;
    hp->norm_topk = false;
    hp->qk_norm =
        gguf_tensor_find(f, "blk.0.attn_q_norm.weight") ? MODEL_QK_NORM_HEAD : MODEL_QK_NORM_NONE;
    if ((rv = arch_u32(f, a, "expert_gating_func", &sigmoid, &gating)) != 0 ||
        (rv = arch_u32(f, a, "leading_dense_block_count", &zero, &hp->n_dense_lead)) != 0 ||
        (rv = arch_u32(f, a, "feed_forward_length", &zero, &hp->n_ff_dense)) != 0 ||
        (rv = arch_u32(f, a, "expert_shared_count", NULL, &n_shared)) != 0 ||
        (rv = arch_f32(f, a, "expert_weights_scale", NULL, &hp->exp_scale)) != 0)
        return rv;
    if (gating == 1)
        hp->gating = MODEL_GATING_SOFTMAX_TOPK;
    else if (gating == 0 || gating == 2)
        hp->gating = MODEL_GATING_SIGMOID;
    else
        return strata_errf(STRATA_EUNSUPPORTED,
                           "%s.expert_gating_func %u: strata takes 1 (softmax) and 2 (sigmoid)", a,
                           gating);
    if (hp->n_dense_lead > hp->n_layer || (hp->n_dense_lead && hp->n_ff_dense == 0))
        return strata_errf(STRATA_EFORMAT,
                           "%s.leading_dense_block_count %u with feed_forward_length %u: the "
                           "dense layers must be within the %u layers and have a width",
                           a, hp->n_dense_lead, hp->n_ff_dense, hp->n_layer);
    if (!(hp->exp_scale > 0.0f))
        return strata_errf(STRATA_EFORMAT, "%s.expert_weights_scale %g must be positive", a,
                           hp->exp_scale);
    hp->n_ff_shexp = n_shared * hp->n_ff_exp;
    /* llama.cpp adds the bias to whatever the gating gives, for selection only */
    snprintf(name, sizeof name, "blk.%u.exp_probs_b.bias", hp->n_dense_lead);
    hp->exp_probs_b = gguf_tensor_find(f, name) != NULL;
    return 0;
}

static int parse_hparams(const struct gguf_file *f, struct model_hparams *hp)
{
    const char *a;
    int rv;
    if ((rv = parse_arch(f, &hp->arch)) != 0) return rv;
    a = arch_names[hp->arch];

    const struct gguf_tensor *embd;
    if ((rv = find(f, "token_embd.weight", &embd)) != 0) return rv;
    hp->n_vocab = (uint32_t)embd->ne[1];

    if ((rv = arch_u32(f, a, "embedding_length", NULL, &hp->n_embd)) != 0) return rv;
    if ((rv = arch_u32(f, a, "block_count", NULL, &hp->n_layer)) != 0) return rv;
    uint32_t zero = 0;
    if ((rv = arch_u32(f, a, "nextn_predict_layers", &zero, &hp->n_nextn)) != 0) return rv;
    if (hp->n_nextn >= hp->n_layer)
        return strata_errf(STRATA_EFORMAT,
                           "%s.nextn_predict_layers %u leaves none of block_count %u layers to run",
                           a, hp->n_nextn, hp->n_layer);
    hp->n_layer -= hp->n_nextn; /* the MTP layers come last and are never run (llama.cpp's rule) */
    if ((rv = arch_u32(f, a, "attention.head_count", NULL, &hp->n_head)) != 0) return rv;
    if ((rv = arch_u32(f, a, "attention.head_count_kv", &hp->n_head, &hp->n_head_kv)) != 0)
        return rv;
    if ((rv = arch_u32(f, a, "context_length", NULL, &hp->n_ctx_train)) != 0) return rv;
    if (hp->n_embd == 0 || hp->n_layer == 0 || hp->n_head == 0 || hp->n_head_kv == 0 ||
        hp->n_head % hp->n_head_kv != 0 || hp->n_ctx_train == 0)
        return strata_errf(STRATA_EFORMAT,
                           "%s: embedding_length %u, block_count %u, head_count %u, "
                           "head_count_kv %u, context_length %u: each must be positive and "
                           "head_count a multiple of head_count_kv",
                           a, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->n_ctx_train);
    uint32_t hd = hp->n_embd / hp->n_head;
    if ((rv = arch_u32(f, a, "attention.key_length", &hd, &hp->head_dim)) != 0) return rv;
    if ((rv = arch_u32(f, a, "attention.value_length", &hp->head_dim, &hp->head_dim_v)) != 0)
        return rv;
    if ((rv = arch_u32(f, a, "rope.dimension_count", &hp->head_dim, &hp->n_rot)) != 0) return rv;
    if (hp->head_dim == 0 || hp->head_dim_v == 0 || hp->n_rot % 2 || hp->n_rot > hp->head_dim)
        return strata_errf(STRATA_EFORMAT,
                           "%s: key_length %u, value_length %u, rope.dimension_count %u: heads "
                           "must be non-empty and the rotated dims even and within a head",
                           a, hp->head_dim, hp->head_dim_v, hp->n_rot);

    if ((rv = arch_u32(f, a, "expert_count", &zero, &hp->n_expert)) != 0) return rv;
    if ((rv = arch_u32(f, a, "expert_used_count", &zero, &hp->n_expert_used)) != 0) return rv;
    if (hp->n_expert == 0)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "%s.expert_count is missing or 0: a dense model; strata runs "
                           "mixture-of-experts models only",
                           a);
    if (hp->n_expert_used == 0 || hp->n_expert_used > hp->n_expert)
        return strata_errf(STRATA_EFORMAT, "%s.expert_used_count %u must be in 1..%u", a,
                           hp->n_expert_used, hp->n_expert);
    /* Mixtral and OLMoE files give the expert width as feed_forward_length. */
    char name[128];
    snprintf(name, sizeof name, "%s.expert_feed_forward_length", a);
    if (gguf_find(f, name))
        rv = arch_u32(f, a, "expert_feed_forward_length", NULL, &hp->n_ff_exp);
    else
        rv = arch_u32(f, a, "feed_forward_length", NULL, &hp->n_ff_exp);
    if (rv) return rv;

    if ((rv = arch_f32(f, a, "attention.layer_norm_rms_epsilon", NULL, &hp->rms_eps)) != 0)
        return rv;
    float theta = 10000.0f;
    if ((rv = arch_f32(f, a, "rope.freq_base", &theta, &hp->rope_theta)) != 0) return rv;

    snprintf(name, sizeof name, "%s.rope.scaling.type", a);
    struct gguf_str st;
    const bool yarn =
        gguf_get_str(f, name, &st) == 0 && st.len == 4 && memcmp(st.ptr, "yarn", 4) == 0;
    hp->yarn_factor = 1.0f;
    if (yarn && (hp->arch == MODEL_ARCH_GPT_OSS || hp->arch == MODEL_ARCH_DEEPSEEK2)) {
        float one = 1.0f;
        if ((rv = arch_f32(f, a, "rope.scaling.factor", &one, &hp->yarn_factor)) != 0 ||
            (rv = arch_u32(f, a, "rope.scaling.original_context_length", &hp->n_ctx_train,
                           &hp->yarn_orig_ctx)) != 0)
            return rv;
        if (!(hp->yarn_factor >= 1.0f) || hp->yarn_orig_ctx == 0)
            return strata_errf(STRATA_EFORMAT,
                               "%s.rope.scaling.factor %g and original_context_length %u: YaRN "
                               "needs a factor >= 1 and a positive context",
                               a, hp->yarn_factor, hp->yarn_orig_ctx);
    } else if (gguf_get_str(f, name, &st) == 0 &&
               !(st.len == 4 && memcmp(st.ptr, "none", 4) == 0))
        return strata_errf(STRATA_EUNSUPPORTED,
                           "%s is '%.*s': RoPE scaling is not supported yet; use a file without "
                           "it (or --ctx within the unscaled context)",
                           name, (int)(st.len > 32 ? 32 : st.len), st.ptr);
    if (gguf_tensor_find(f, "rope_freqs.weight"))
        return strata_errf(STRATA_EUNSUPPORTED,
                           "tensor rope_freqs.weight (per-dimension RoPE factors) is not "
                           "supported yet");

    switch (hp->arch) {
    case MODEL_ARCH_LLAMA:
        hp->rope = MODEL_ROPE_NORM;
        hp->gating = MODEL_GATING_TOPK_SOFTMAX;
        hp->norm_topk = true; /* implied: a softmax over the k selected sums to 1 */
        hp->qk_norm = MODEL_QK_NORM_NONE;
        break;
    case MODEL_ARCH_QWEN2MOE:
        hp->rope = MODEL_ROPE_NEOX;
        hp->gating = MODEL_GATING_SOFTMAX_TOPK;
        hp->norm_topk = false;
        hp->qk_norm = MODEL_QK_NORM_NONE;
        break;
    case MODEL_ARCH_QWEN3MOE:
        hp->rope = MODEL_ROPE_NEOX;
        hp->gating = MODEL_GATING_SOFTMAX_TOPK;
        hp->norm_topk = true; /* llama.cpp always renormalizes for qwen3moe */
        hp->qk_norm = MODEL_QK_NORM_HEAD;
        break;
    case MODEL_ARCH_OLMOE:
        hp->rope = MODEL_ROPE_NEOX;
        hp->gating = MODEL_GATING_SOFTMAX_TOPK;
        hp->norm_topk = false;
        hp->qk_norm = MODEL_QK_NORM_FULL;
        break;
    case MODEL_ARCH_GPT_OSS:
        /* llama.cpp: NEOX RoPE, top-k of the biased router logits then a softmax over the k
         * (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT), biases everywhere, sinks, the clamped
         * SwiGLU, and sliding windows on every other layer from layer 0 (set_swa_pattern(2)) */
        hp->rope = MODEL_ROPE_NEOX;
        hp->gating = MODEL_GATING_TOPK_SOFTMAX;
        hp->norm_topk = true;
        hp->qk_norm = MODEL_QK_NORM_NONE;
        hp->attn_out_bias = hp->attn_sinks = hp->router_bias = hp->exp_bias = true;
        hp->glu_oai = true;
        if ((rv = arch_u32(f, a, "attention.sliding_window", NULL, &hp->n_swa)) != 0) return rv;
        if (hp->n_swa == 0)
            return strata_errf(STRATA_EFORMAT, "%s.attention.sliding_window is 0", a);
        break;
    case MODEL_ARCH_GLM4MOE:
        if ((rv = parse_glm4moe(f, a, hp)) != 0) return rv;
        break;
    case MODEL_ARCH_DEEPSEEK2:
        /* DeepSeek's routing and layer kinds are GLM's (llama.cpp built glm4moe after them),
         * with ffn_norm before the FFN, NORM RoPE and multi-head latent attention */
        if ((rv = parse_glm4moe(f, a, hp)) != 0 || (rv = parse_mla(f, a, hp)) != 0) return rv;
        hp->rope = MODEL_ROPE_NORM;
        hp->qk_norm = MODEL_QK_NORM_NONE;
        break;
    }
    hp->shexp_gated = hp->arch == MODEL_ARCH_QWEN2MOE;
    if (hp->exp_scale == 0.0f) hp->exp_scale = 1.0f;
    snprintf(name, sizeof name, "%s.expert_weights_norm", a);
    if (hp->gating != MODEL_GATING_TOPK_SOFTMAX && gguf_find(f, name) &&
        (rv = gguf_get_bool(f, name, &hp->norm_topk)) != 0)
        return strata_errf(rv, "key %s must be a bool", name);

    /* llama.cpp loads q/k/v biases when a file has them (TENSOR_NOT_REQUIRED for llama and
     * qwen2moe): Qwen1.5-MoE has them, a fine-tune or a conversion without them is as valid */
    hp->qkv_bias = false;
    for (uint32_t il = 0; il < hp->n_layer && !hp->qkv_bias; il++)
        hp->qkv_bias = gguf_tensor_find(f, fmt_name(name, sizeof name, "blk.%u.attn_q.bias", il));

    if (hp->arch == MODEL_ARCH_QWEN2MOE) {
        const struct gguf_tensor *t = gguf_tensor_find(f, "blk.0.ffn_up_shexp.weight");
        uint32_t dflt = t ? (uint32_t)t->ne[1] : 0;
        if ((rv = arch_u32(f, a, "expert_shared_feed_forward_length", &dflt, &hp->n_ff_shexp)) != 0)
            return rv;
        if (hp->n_ff_shexp == 0)
            return strata_errf(STRATA_ENOENT,
                               "qwen2moe: blk.0.ffn_up_shexp.weight (the shared expert) is "
                               "missing");
    }
    return 0;
}

/* ---- experts ------------------------------------------------------------------------------- */

/* load_exp_bias points the default resolver at part's stacked F32 bias of layer il,
 * blk.N.ffn_X_exps.bias of shape (n_expert, n_out). */
static int load_exp_bias(const struct gguf_file *f, struct model *m, uint32_t il,
                         enum model_part part, uint32_t n_out)
{
    struct model_priv *p = m->priv_;
    char name[128];
    const struct gguf_tensor *t;
    int rv;
    fmt_name(name, sizeof name, "blk.%u.ffn_%s_exps.bias", il, part_names[part]);
    if ((rv = find(f, name, &t)) != 0) return rv;
    if (t->type != QT_F32)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "tensor %s has type %s: expert biases must be f32 (as converted)", name,
                           qtype_name(t->type));
    if ((rv = check_shape(t, n_out, m->hp.n_expert, 1, "(n_expert, n_out)")) != 0) return rv;
    const void **ptr = p->exp_ptr + (size_t)il * m->hp.n_expert * MODEL_BLOB_PARTS +
                       MODEL_PART_BIAS + part;
    for (uint32_t e = 0; t->data && e < m->hp.n_expert; e++)
        ptr[(size_t)e * MODEL_BLOB_PARTS] = t->data + (size_t)e * n_out * sizeof(float);
    return 0;
}

/* load_experts fills layer il's part table and the default resolver's pointers, from the stacked
 * blk.N.ffn_X_exps.weight tensors or, in older Mixtral files, blk.N.ffn_X.E.weight per expert. */
static int load_experts(const struct gguf_file *f, struct model *m, uint32_t il)
{
    const struct model_hparams *hp = &m->hp;
    struct model_priv *p = m->priv_;
    struct model_layer *L = &m->layers[il];
    char name[128];
    int rv;
    for (int part = 0; part < MODEL_PART_COUNT; part++) {
        uint32_t n_in = part == MODEL_PART_DOWN ? hp->n_ff_exp : hp->n_embd;
        uint32_t n_out = part == MODEL_PART_DOWN ? hp->n_embd : hp->n_ff_exp;
        bool down = part == MODEL_PART_DOWN;
        const void **ptr = p->exp_ptr + (size_t)il * hp->n_expert * MODEL_BLOB_PARTS + part;
        const struct gguf_tensor *t = gguf_tensor_find(
            f, fmt_name(name, sizeof name, "blk.%u.ffn_%s_exps.weight", il, part_names[part]));
        if (t) {
            if ((rv = check_shape(t, n_in, n_out, hp->n_expert,
                                  down ? "(n_expert, n_embd, n_ff_exp)"
                                       : "(n_expert, n_ff_exp, n_embd)")) != 0)
                return rv;
            mat_of(t, &L->part[part]);
            L->part[part].data = NULL;
            uint64_t bytes = L->part[part].row_bytes * n_out;
            /* arena metadata has no data: model_load_arena resolves experts from blobs */
            for (uint32_t e = 0; t->data && e < hp->n_expert; e++)
                ptr[(size_t)e * MODEL_BLOB_PARTS] = t->data + e * bytes;
            if (hp->exp_bias && (rv = load_exp_bias(f, m, il, (enum model_part)part, n_out)) != 0)
                return rv;
            continue;
        }
        for (uint32_t e = 0; e < hp->n_expert; e++) {
            fmt_name(name, sizeof name, "blk.%u.ffn_%s.%u.weight", il, part_names[part], e);
            t = gguf_tensor_find(f, name);
            if (!t)
                return strata_errf(STRATA_ENOENT,
                                   "tensor blk.%u.ffn_%s_exps.weight (or per-expert %s) is "
                                   "missing from the model",
                                   il, part_names[part], name);
            if ((rv = check_shape(t, n_in, n_out, 1,
                                  down ? "(n_embd, n_ff_exp)" : "(n_ff_exp, n_embd)")) != 0)
                return rv;
            if (e == 0) {
                mat_of(t, &L->part[part]);
                L->part[part].data = NULL;
            } else if (t->type != L->part[part].type) {
                return strata_errf(STRATA_EUNSUPPORTED,
                                   "tensor %s has type %s but expert 0 of the layer has %s: "
                                   "experts of one layer must share a type",
                                   name, qtype_name(t->type), qtype_name(L->part[part].type));
            }
            ptr[(size_t)e * MODEL_BLOB_PARTS] = t->data;
        }
    }
    return 0;
}

/* file_blob_layout packs layer L's parts as the arena does (arena_layout_plan): in part order,
 * each bias (bias true) right after its matrix, each at the next multiple of ARENA_PART_ALIGN. */
static void file_blob_layout(struct model_layer *L, bool bias)
{
    uint64_t off = 0;
    for (int part = 0; part < MODEL_PART_COUNT; part++) {
        off = (off + ARENA_PART_ALIGN - 1) / ARENA_PART_ALIGN * ARENA_PART_ALIGN;
        L->blob.part_off[part] = off;
        off += L->part[part].row_bytes * L->part[part].n_out;
        if (!bias) continue;
        off = (off + ARENA_PART_ALIGN - 1) / ARENA_PART_ALIGN * ARENA_PART_ALIGN;
        L->blob.part_off[MODEL_PART_BIAS + part] = off;
        off += (uint64_t)L->part[part].n_out * sizeof(float);
    }
    L->blob.bytes = off;
}

/* load_biases reads layer il's q, k and v biases: all three or none (the forward pass adds them
 * together), each optional as in llama.cpp. An output-projection bias, which llama.cpp also takes
 * for llama, is refused rather than ignored unless bo (gpt-oss, which load_layer reads). */
static int load_biases(const struct gguf_file *f, struct model_priv *p, uint32_t il, uint32_t nq,
                       uint32_t nk, uint32_t nv, bool bo, struct model_layer *L)
{
    static const char *const which[3] = {"attn_q", "attn_k", "attn_v"};
    char n[3][128], o[128];
    int have = 0, rv;
    for (int i = 0; i < 3; i++)
        have += gguf_tensor_find(f, fmt_name(n[i], sizeof n[i], "blk.%u.%s.bias", il, which[i])) !=
                NULL;
    if (!bo && gguf_tensor_find(f, fmt_name(o, sizeof o, "blk.%u.attn_output.bias", il)))
        return strata_errf(STRATA_EUNSUPPORTED,
                           "tensor %s (a bias on the attention output) is not supported yet", o);
    if (have == 0) return 0;
    if (have < 3) {
        for (int i = 0; i < 3; i++)
            if (!gguf_tensor_find(f, n[i]))
                return strata_errf(STRATA_EUNSUPPORTED,
                                   "layer %u has %d of the q/k/v biases but not %s: strata takes "
                                   "the three together or none",
                                   il, have, n[i]);
    }
    if ((rv = get_vec(f, p, n[0], nq, "(n_head*head_dim)", &L->bq)) ||
        (rv = get_vec(f, p, n[1], nk, "(n_head_kv*head_dim)", &L->bk)) ||
        (rv = get_vec(f, p, n[2], nv, "(n_head_kv*head_dim_v)", &L->bv)))
        return rv;
    return 0;
}

/* load_qk_norm reads layer il's q/k norms per hp.qk_norm. */
static int load_qk_norm(const struct gguf_file *f, struct model_priv *p, uint32_t il, uint32_t nq,
                        uint32_t nk, struct model_layer *L)
{
    const struct model_hparams *hp = p->hp;
    char n[128];
    int rv;
#define NAME(s) fmt_name(n, sizeof n, "blk.%u." s, il)
    if (hp->qk_norm == MODEL_QK_NORM_HEAD &&
        ((rv = get_vec(f, p, NAME("attn_q_norm.weight"), hp->head_dim, "(head_dim)", &L->q_norm)) ||
         (rv = get_vec(f, p, NAME("attn_k_norm.weight"), hp->head_dim, "(head_dim)", &L->k_norm))))
        return rv;
    if (hp->qk_norm == MODEL_QK_NORM_FULL &&
        ((rv = get_vec(f, p, NAME("attn_q_norm.weight"), nq, "(n_head*head_dim)", &L->q_norm)) ||
         (rv = get_vec(f, p, NAME("attn_k_norm.weight"), nk, "(n_head_kv*head_dim)", &L->k_norm))))
        return rv;
#undef NAME
    return 0;
}

/* own_f32 allocates n floats the model owns. */
static float *own_f32(struct model_priv *p, size_t n)
{
    float *v = malloc(n * sizeof *v);
    if (!v || own(p, v) != 0) {
        free(v);
        strata_errf(STRATA_ENOMEM, "out of memory for %zu floats of the model", n);
        return NULL;
    }
    return v;
}

/* load_mla reads layer il's multi-head latent attention (deepseek2): the q projection (through
 * the q LoRA with its norm, or one matrix), the latent and rope key projection with the latent's
 * norm, the per-head k_b and v_b as F32 (attn_k_b / attn_v_b, or split out of the older
 * attn_kv_b), and the output projection. */
static int load_mla(const struct gguf_file *f, struct model *m, uint32_t il)
{
    const struct model_hparams *hp = &m->hp;
    struct model_priv *p = m->priv_;
    struct model_layer *L = &m->layers[il];
    const uint32_t H = hp->n_head, R = hp->n_lora_kv, V = hp->head_dim_vo,
                   nope = hp->head_dim_qk - hp->n_rot, nq = H * hp->head_dim_qk;
    const struct gguf_tensor *t;
    char n[128];
    int rv;
#define NAME(s) fmt_name(n, sizeof n, "blk.%u." s, il)
    if ((hp->n_lora_q && ((rv = get_mat(f, NAME("attn_q_a.weight"), hp->n_embd, hp->n_lora_q,
                                        "(q_lora_rank, n_embd)", &L->wq_a)) ||
                          (rv = get_vec(f, p, NAME("attn_q_a_norm.weight"), hp->n_lora_q,
                                        "(q_lora_rank)", &L->q_a_norm)) ||
                          (rv = get_mat(f, NAME("attn_q_b.weight"), hp->n_lora_q, nq,
                                        "(n_head*key_length_mla, q_lora_rank)", &L->wq_b)))) ||
        (!hp->n_lora_q && (rv = get_mat(f, NAME("attn_q.weight"), hp->n_embd, nq,
                                        "(n_head*key_length_mla, n_embd)", &L->wq))) ||
        (rv = get_mat(f, NAME("attn_kv_a_mqa.weight"), hp->n_embd, R + hp->n_rot,
                      "(kv_lora_rank + n_rot, n_embd)", &L->wkv_a)) ||
        (rv = get_vec(f, p, NAME("attn_kv_a_norm.weight"), R, "(kv_lora_rank)", &L->kv_a_norm)) ||
        (rv = get_mat(f, NAME("attn_output.weight"), H * V, hp->n_embd,
                      "(n_embd, n_head*value_length_mla)", &L->wo)))
        return rv;
    if ((t = gguf_tensor_find(f, NAME("attn_k_b.weight")))) {
        /* ggml (nope, kv_lora_rank, n_head) and (kv_lora_rank, v, n_head): read in place, in
         * the file's type, head h's matrix n_out rows after head h-1's */
        if ((rv = check_shape(t, nope, R, H, "(n_head, kv_lora_rank, n_nope)")) != 0) return rv;
        mat_of(t, &L->k_b);
        if ((rv = find(f, NAME("attn_v_b.weight"), &t)) ||
            (rv = check_shape(t, R, V, H, "(n_head, value_length_mla, kv_lora_rank)")))
            return rv;
        mat_of(t, &L->v_b);
        return 0;
    }
    /* older files: attn_kv_b (n_head*(nope + v), kv_lora_rank), each head's nope key rows then
     * its value rows; k_b is the key rows transposed, v_b the value rows, both made F32 */
    if ((rv = find(f, NAME("attn_kv_b.weight"), &t)) != 0)
        return strata_errf(rv, "layer %u has neither attn_k_b/attn_v_b nor attn_kv_b: %s", il,
                           strata_errdetail());
    const uint32_t rows = H * (nope + V);
    if ((rv = check_shape(t, R, rows, 1, "(n_head*(n_nope + value_length_mla), kv_lora_rank)")))
        return rv;
    float *kb = own_f32(p, (size_t)H * R * nope), *vb = own_f32(p, (size_t)H * V * R);
    float *kv = malloc((size_t)rows * R * sizeof *kv);
    if (!kb || !vb || !kv) {
        free(kv);
        return strata_errf(STRATA_ENOMEM, "out of memory splitting %s", t->name);
    }
    if ((rv = quant_dequantize(t->type, t->data, kv, (int64_t)rows * R)) == 0) {
        for (uint32_t h = 0; h < H; h++) {
            const float *k = kv + (size_t)h * (nope + V) * R, *v = k + (size_t)nope * R;
            for (uint32_t c = 0; c < R; c++)
                for (uint32_t d = 0; d < nope; d++)
                    kb[((size_t)h * R + c) * nope + d] = k[(size_t)d * R + c];
            memcpy(vb + (size_t)h * V * R, v, (size_t)V * R * sizeof *v);
        }
    }
    free(kv);
    L->k_b = (struct model_mat){kb, QT_F32, nope, R, (uint64_t)nope * sizeof(float)};
    L->v_b = (struct model_mat){vb, QT_F32, R, V, (uint64_t)R * sizeof(float)};
#undef NAME
    return rv;
}

static int load_layer(const struct gguf_file *f, struct model *m, uint32_t il)
{
    const struct model_hparams *hp = &m->hp;
    struct model_priv *p = m->priv_;
    struct model_layer *L = &m->layers[il];
    uint32_t nq = hp->n_head * hp->head_dim, nk = hp->n_head_kv * hp->head_dim,
             nv = hp->n_head_kv * hp->head_dim_v, no = hp->n_head * hp->head_dim_v;
    char n[128];
    int rv;
#define NAME(s) fmt_name(n, sizeof n, "blk.%u." s, il)
    if ((rv = get_vec(f, p, NAME("attn_norm.weight"), hp->n_embd, "(n_embd)", &L->attn_norm)) ||
        (hp->mla && (rv = load_mla(f, m, il))) ||
        (!hp->mla && ((rv = get_mat(f, NAME("attn_q.weight"), hp->n_embd, nq,
                                    "(n_head*head_dim, n_embd)", &L->wq)) ||
                      (rv = get_mat(f, NAME("attn_k.weight"), hp->n_embd, nk,
                                    "(n_head_kv*head_dim, n_embd)", &L->wk)) ||
                      (rv = get_mat(f, NAME("attn_v.weight"), hp->n_embd, nv,
                                    "(n_head_kv*head_dim_v, n_embd)", &L->wv)) ||
                      (rv = get_mat(f, NAME("attn_output.weight"), no, hp->n_embd,
                                    "(n_embd, n_head*head_dim_v)", &L->wo)))) ||
        (rv = get_vec(f, p,
                      hp->arch == MODEL_ARCH_GPT_OSS || hp->arch == MODEL_ARCH_GLM4MOE
                          ? NAME("post_attention_norm.weight")
                          : NAME("ffn_norm.weight"),
                      hp->n_embd, "(n_embd)", &L->ffn_norm)))
        return rv;
    L->dense = il < hp->n_dense_lead;
    if (L->dense) {
        /* a leading dense layer (glm4moe): a SwiGLU FFN, no router, no experts */
        const uint32_t F = hp->n_ff_dense;
        if ((rv = load_biases(f, p, il, nq, nk, nv, false, L)) ||
            (rv = get_mat(f, NAME("ffn_gate.weight"), hp->n_embd, F, "(n_ff_dense, n_embd)",
                          &L->ffn_gate)) ||
            (rv = get_mat(f, NAME("ffn_up.weight"), hp->n_embd, F, "(n_ff_dense, n_embd)",
                          &L->ffn_up)) ||
            (rv = get_mat(f, NAME("ffn_down.weight"), F, hp->n_embd, "(n_embd, n_ff_dense)",
                          &L->ffn_down)))
            return rv;
        return load_qk_norm(f, p, il, nq, nk, L);
    }
    if ((rv = get_mat(f, NAME("ffn_gate_inp.weight"), hp->n_embd, hp->n_expert,
                      "(n_expert, n_embd)", &L->router)) ||
        (hp->exp_probs_b && (rv = get_vec(f, p, NAME("exp_probs_b.bias"), hp->n_expert,
                                          "(n_expert)", &L->exp_probs_b))))
        return rv;
    if ((rv = load_biases(f, p, il, nq, nk, nv, hp->attn_out_bias, L)) != 0) return rv;
    if ((hp->attn_out_bias &&
         (rv = get_vec(f, p, NAME("attn_output.bias"), hp->n_embd, "(n_embd)", &L->bo))) ||
        (hp->attn_sinks &&
         (rv = get_vec(f, p, NAME("attn_sinks.weight"), hp->n_head, "(n_head)", &L->sinks))) ||
        (hp->router_bias &&
         (rv = get_vec(f, p, NAME("ffn_gate_inp.bias"), hp->n_expert, "(n_expert)", &L->router_b))))
        return rv;
    L->swa = hp->n_swa && il % 2 == 0;
    if ((rv = load_qk_norm(f, p, il, nq, nk, L)) != 0) return rv;
    if (hp->n_ff_shexp &&
        ((hp->shexp_gated && (rv = get_mat(f, NAME("ffn_gate_inp_shexp.weight"), hp->n_embd, 1,
                                           "(n_embd)", &L->gate_inp_shexp))) ||
         (rv = get_mat(f, NAME("ffn_gate_shexp.weight"), hp->n_embd, hp->n_ff_shexp,
                       "(n_ff_shexp, n_embd)", &L->gate_shexp)) ||
         (rv = get_mat(f, NAME("ffn_up_shexp.weight"), hp->n_embd, hp->n_ff_shexp,
                       "(n_ff_shexp, n_embd)", &L->up_shexp)) ||
         (rv = get_mat(f, NAME("ffn_down_shexp.weight"), hp->n_ff_shexp, hp->n_embd,
                       "(n_embd, n_ff_shexp)", &L->down_shexp))))
        return rv;
#undef NAME
    return load_experts(f, m, il);
}

int model_load(const struct gguf_file *f, struct model **out)
{
    int rv;
    struct model *m = calloc(1, sizeof *m);
    struct model_priv *p = calloc(1, sizeof *p);
    if (!m || !p) {
        free(m);
        free(p);
        return strata_errf(STRATA_ENOMEM, "out of memory for the model table");
    }
    m->priv_ = p;
    m->gguf = f;
    p->hp = &m->hp;
    if ((rv = parse_hparams(f, &m->hp)) != 0) goto fail;
    const struct model_hparams *hp = &m->hp;
    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    p->exp_ptr = calloc((size_t)hp->n_layer * hp->n_expert * MODEL_BLOB_PARTS, sizeof *p->exp_ptr);
    if (!m->layers || !p->exp_ptr) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for %u layers of %u experts", hp->n_layer,
                         hp->n_expert);
        goto fail;
    }
    if ((rv = get_mat(f, "token_embd.weight", hp->n_embd, hp->n_vocab, "(n_vocab, n_embd)",
                      &m->token_embd)) != 0 ||
        (rv = get_vec(f, p, "output_norm.weight", hp->n_embd, "(n_embd)", &m->output_norm)) != 0)
        goto fail;
    if (gguf_tensor_find(f, "output.weight")) {
        if ((rv = get_mat(f, "output.weight", hp->n_embd, hp->n_vocab, "(n_vocab, n_embd)",
                          &m->output)) != 0)
            goto fail;
    } else {
        m->output = m->token_embd; /* tied embeddings */
    }
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        if ((rv = load_layer(f, m, il)) != 0) goto fail;
        file_blob_layout(&m->layers[il], hp->exp_bias);
    }
    model_set_expert_resolver(m, gguf_expert_part, m);
    *out = m;
    return 0;
fail:
    model_fini(m);
    return rv;
}

void model_fini(struct model *m)
{
    if (!m) return;
    struct model_priv *p = m->priv_;
    if (p) {
        for (size_t i = 0; i < p->n_owned; i++)
            free(p->owned[i]);
        free(p->owned);
        free(p->exp_ptr);
        free(p);
    }
    free(m->layers);
    free(m);
}

const uint8_t *model_expert_blob(const struct model *m, uint32_t layer, uint32_t expert)
{
    const struct model_priv *p = m->priv_;
    return p->arena ? arena_blob_at(p->arena, layer, expert) : NULL;
}

uint64_t model_expert_blob_hash(const struct model *m, uint32_t layer, uint32_t expert)
{
    const struct model_priv *p = m->priv_;
    return p->arena ? arena_blob_hash(p->arena, layer, expert) : 0;
}

/* ---- arena ----------------------------------------------------------------------------------- */

static const void *arena_expert_part(void *ctx, uint32_t layer, uint32_t expert,
                                     enum model_part part)
{
    const struct model *m = ctx;
    const struct model_priv *p = m->priv_;
    return arena_blob_at(p->arena, layer, expert) + m->layers[layer].blob.part_off[part];
}

/* arena_dense_data points f's dense tensors at the arena's copies. */
static int arena_dense_data(const struct arena *a, struct gguf_file *f)
{
    const uint8_t *img = (const uint8_t *)a->hdr;
    for (uint64_t i = 0; i < a->hdr->n_dense; i++) {
        const struct arena_tensor *d = &a->dense[i];
        const char *name = arena_str(a, d->name_off);
        const struct gguf_tensor *t = gguf_tensor_find(f, name);
        if (!t || t->nbytes != d->bytes || t->type != d->type)
            return strata_errf(STRATA_EFORMAT,
                               "arena dense tensor %s (%llu bytes) has no matching tensor info in "
                               "the arena's metadata: the arena is damaged, rebuild it",
                               name, (unsigned long long)d->bytes);
        f->tensors[t - f->tensors].data = img + d->offset;
    }
    return 0;
}

/* arena_parts finds each expert part of layer il among the layer's blob parts, by source tensor
 * name, and checks its type and size against the model's part table. */
static int arena_parts(const struct arena *a, struct model *m, uint32_t il)
{
    const struct model_layer *L = &m->layers[il];
    const struct arena_layer *al = arena_layer_get(a, il);
    if (L->dense) {
        m->layers[il].blob.bytes = 0; /* a dense layer has no experts, hence no blobs */
        return 0;
    }
    for (int part = 0; part < MODEL_PART_COUNT; part++) {
        char stacked[96], single[96];
        snprintf(stacked, sizeof stacked, "blk.%u.ffn_%s_exps.weight", il, part_names[part]);
        snprintf(single, sizeof single, "blk.%u.ffn_%s.*.weight", il, part_names[part]);
        const struct arena_part *ap = NULL;
        for (uint32_t k = 0; al && k < al->n_parts; k++) {
            const struct arena_part *c = &a->parts[al->part_first + k];
            const char *name = arena_str(a, c->name_off);
            if (strcmp(name, stacked) == 0 || strcmp(name, single) == 0) ap = c;
        }
        uint64_t bytes = L->part[part].row_bytes * L->part[part].n_out;
        if (!ap || ap->type != L->part[part].type || ap->bytes != bytes ||
            a->hdr->n_expert != m->hp.n_expert)
            return strata_errf(STRATA_EFORMAT,
                               "arena has no blob part %s of %llu bytes for layer %u's %u "
                               "experts: the arena is damaged or of another model, rebuild it",
                               stacked, (unsigned long long)bytes, il, m->hp.n_expert);
        m->layers[il].blob.part_off[part] = ap->offset;
        if (!m->hp.exp_bias) continue;
        char bname[96];
        snprintf(bname, sizeof bname, "blk.%u.ffn_%s_exps.bias", il, part_names[part]);
        const struct arena_part *bp = NULL;
        for (uint32_t k = 0; al && k < al->n_parts; k++) {
            const struct arena_part *c = &a->parts[al->part_first + k];
            if (strcmp(arena_str(a, c->name_off), bname) == 0) bp = c;
        }
        if (!bp || bp->type != QT_F32 || bp->bytes != (uint64_t)L->part[part].n_out * sizeof(float))
            return strata_errf(STRATA_EFORMAT,
                               "arena has no blob part %s of %u floats for layer %u: the arena is "
                               "damaged or of another model, rebuild it",
                               bname, L->part[part].n_out, il);
        m->layers[il].blob.part_off[MODEL_PART_BIAS + part] = bp->offset;
    }
    m->layers[il].blob.bytes = al->blob_bytes;
    return 0;
}

int model_load_arena(const struct arena *a, struct gguf_file *f, struct model **out)
{
    struct model *m = NULL;
    int rv;
    if ((rv = arena_dense_data(a, f)) != 0 || (rv = model_load(f, &m)) != 0) return rv;
    struct model_priv *p = m->priv_;
    p->arena = a;
    for (uint32_t il = 0; il < m->hp.n_layer; il++)
        if ((rv = arena_parts(a, m, il)) != 0) goto fail;
    model_set_expert_resolver(m, arena_expert_part, m);
    *out = m;
    return 0;
fail:
    model_fini(m);
    return rv;
}
