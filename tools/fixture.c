#include "tools/fixture.h"

#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "tools/fixture_vocab.h"
#include "tools/quantize.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum arch {
    ARCH_QWEN3MOE,
    ARCH_LLAMA,
    ARCH_OLMOE,
    ARCH_QWEN2MOE,
    ARCH_GPT_OSS,
    ARCH_GLM4MOE,
    ARCH_DEEPSEEK2,
    ARCH_COUNT
};

static const char *const arch_names[ARCH_COUNT] = {"qwen3moe", "llama",   "olmoe",    "qwen2moe",
                                                   "gpt-oss",  "glm4moe", "deepseek2"};

struct shape {
    const char *name;
    struct fixture_hparams hp;
    bool large; /* FIXTURE_AUTO writes random blocks */
};

/* Widths are multiples of 256 so every K-quant applies to every matrix (llama.cpp would fall back
 * to Q5_0/Q8_0 for rows of other lengths); the tiny head size (128) differs from n_embd/n_head (64)
 * to exercise attention.key_length. qwen3-30b-a3b is Qwen/Qwen3-30B-A3B's config.json; the shared
 * expert widths (qwen2moe only) are 2-4 expert widths, as Qwen1.5-MoE's 5632 = 4 x 1408. */
static const struct shape shapes[] = {
    {"tiny",
     {.n_layer = 2,
      .n_embd = 256,
      .n_head = 4,
      .n_head_kv = 2,
      .head_dim = 128,
      .n_expert = 8,
      .n_expert_used = 2,
      .n_ff = 768,
      .n_ff_exp = 256,
      .n_ff_shexp = 512,
      .n_vocab = 512,
      .n_ctx = 4096,
      .rms_eps = 1e-6f,
      .rope_base = 1e6f},
     false},
    {"qwen3-mini",
     {.n_layer = 8,
      .n_embd = 1024,
      .n_head = 16,
      .n_head_kv = 4,
      .head_dim = 64,
      .n_expert = 64,
      .n_expert_used = 8,
      .n_ff = 3072,
      .n_ff_exp = 512,
      .n_ff_shexp = 2048,
      .n_vocab = 151936,
      .n_ctx = 40960,
      .rms_eps = 1e-6f,
      .rope_base = 1e6f},
     true},
    {"qwen3-30b-a3b",
     {.n_layer = 48,
      .n_embd = 2048,
      .n_head = 32,
      .n_head_kv = 4,
      .head_dim = 128,
      .n_expert = 128,
      .n_expert_used = 8,
      .n_ff = 6144,
      .n_ff_exp = 768,
      .n_ff_shexp = 3072,
      .n_vocab = 151936,
      .n_ctx = 40960,
      .rms_eps = 1e-6f,
      .rope_base = 1e6f},
     true},
    /* gpt-oss-mini: gpt-oss's layer kind (head_dim 64, top-4, o200k vocabulary) at a size a
     * small machine benchmarks in seconds */
    {"gpt-oss-mini",
     {.n_layer = 8,
      .n_embd = 1024,
      .n_head = 16,
      .n_head_kv = 4,
      .head_dim = 64,
      .n_expert = 32,
      .n_expert_used = 4,
      .n_ff = 1024,
      .n_ff_exp = 1024,
      .n_vocab = 201088,
      .n_ctx = 131072,
      .rms_eps = 1e-5f,
      .rope_base = 150000.0f},
     true},
    /* openai/gpt-oss-20b and -120b's config.json (n_ff as the expert width, head_dim 64) */
    {"gpt-oss-20b",
     {.n_layer = 24,
      .n_embd = 2880,
      .n_head = 64,
      .n_head_kv = 8,
      .head_dim = 64,
      .n_expert = 32,
      .n_expert_used = 4,
      .n_ff = 2880,
      .n_ff_exp = 2880,
      .n_vocab = 201088,
      .n_ctx = 131072,
      .rms_eps = 1e-5f,
      .rope_base = 150000.0f},
     true},
    {"gpt-oss-120b",
     {.n_layer = 36,
      .n_embd = 2880,
      .n_head = 64,
      .n_head_kv = 8,
      .head_dim = 64,
      .n_expert = 128,
      .n_expert_used = 4,
      .n_ff = 2880,
      .n_ff_exp = 2880,
      .n_vocab = 201088,
      .n_ctx = 131072,
      .rms_eps = 1e-5f,
      .rope_base = 150000.0f},
     true},
    /* glm4-mini: GLM-4.5's layer kind (head 128 of which 64 rotate, 1 dense layer, top-8 of 64
     * with a shared expert, the 151552-token vocabulary) at a size a small machine benchmarks */
    {"glm4-mini",
     {.n_layer = 8,
      .n_embd = 1024,
      .n_head = 16,
      .n_head_kv = 4,
      .head_dim = 128,
      .n_expert = 64,
      .n_expert_used = 8,
      .n_ff = 3072,
      .n_ff_exp = 512,
      .n_vocab = 151552,
      .n_ctx = 131072,
      .rms_eps = 1e-5f,
      .rope_base = 1e6f,
      .n_rot = 64,
      .n_dense_lead = 1,
      .n_nextn = 1,
      .n_expert_shared = 1,
      .exp_scale = 1.0f},
     true},
    /* zai-org/GLM-4.5-Air and GLM-4.5's config.json (46 and 92 layers, each plus its MTP layer;
     * partial_rotary_factor 0.5; GLM-4.5 has q/k norms and 3 dense layers, routed_scaling 2.5).
     * Their expert width 1408 is no multiple of 256: the q4_k_m mix falls back as llama.cpp does */
    {"glm4.5-air",
     {.n_layer = 46,
      .n_embd = 4096,
      .n_head = 96,
      .n_head_kv = 8,
      .head_dim = 128,
      .n_expert = 128,
      .n_expert_used = 8,
      .n_ff = 10944,
      .n_ff_exp = 1408,
      .n_vocab = 151552,
      .n_ctx = 131072,
      .rms_eps = 1e-5f,
      .rope_base = 1e6f,
      .n_rot = 64,
      .n_dense_lead = 1,
      .n_nextn = 1,
      .n_expert_shared = 1,
      .exp_scale = 1.0f},
     true},
    {"glm4.5",
     {.n_layer = 92,
      .n_embd = 5120,
      .n_head = 96,
      .n_head_kv = 8,
      .head_dim = 128,
      .n_expert = 160,
      .n_expert_used = 8,
      .n_ff = 12288,
      .n_ff_exp = 1536,
      .n_vocab = 151552,
      .n_ctx = 131072,
      .rms_eps = 1e-5f,
      .rope_base = 1e6f,
      .n_rot = 64,
      .n_dense_lead = 3,
      .n_nextn = 1,
      .n_expert_shared = 1,
      .exp_scale = 2.5f,
      .qk_norm = true},
     true},
    /* ds-mini: DeepSeek-V3's layer kind (MLA with both LoRAs, 8 groups of which 4 are kept, two
     * shared experts, YaRN) at a size a small machine benchmarks */
    {"ds-mini",
     {.n_layer = 8,
      .n_embd = 1024,
      .n_head = 16,
      .head_dim = 192,
      .n_expert = 64,
      .n_expert_used = 6,
      .n_ff = 3072,
      .n_ff_exp = 512,
      .n_vocab = 129280,
      .n_ctx = 163840,
      .rms_eps = 1e-6f,
      .rope_base = 10000.0f,
      .n_rot = 64,
      .n_dense_lead = 1,
      .n_expert_shared = 2,
      .exp_scale = 2.5f,
      .n_lora_q = 512,
      .n_lora_kv = 512,
      .head_dim_v = 128,
      .n_group = 8,
      .n_group_used = 4,
      .yarn_factor = 40.0f,
      .yarn_orig_ctx = 4096,
      .yarn_log_mul = 0.1f},
     true},
    /* deepseek-ai/DeepSeek-V3's config.json (61 layers, its MTP layer not converted) */
    {"deepseek-v3",
     {.n_layer = 61,
      .n_embd = 7168,
      .n_head = 128,
      .head_dim = 192,
      .n_expert = 256,
      .n_expert_used = 8,
      .n_ff = 18432,
      .n_ff_exp = 2048,
      .n_vocab = 129280,
      .n_ctx = 163840,
      .rms_eps = 1e-6f,
      .rope_base = 10000.0f,
      .n_rot = 64,
      .n_dense_lead = 3,
      .n_expert_shared = 1,
      .exp_scale = 2.5f,
      .n_lora_q = 1536,
      .n_lora_kv = 512,
      .head_dim_v = 128,
      .n_group = 8,
      .n_group_used = 4,
      .yarn_factor = 40.0f,
      .yarn_orig_ctx = 4096,
      .yarn_log_mul = 0.1f},
     true},
    /* moonshotai/Kimi-K2-Instruct's config.json: DeepSeek-V3's layers with 384 experts, 64 heads,
     * one group */
    {"kimi-k2",
     {.n_layer = 61,
      .n_embd = 7168,
      .n_head = 64,
      .head_dim = 192,
      .n_expert = 384,
      .n_expert_used = 8,
      .n_ff = 18432,
      .n_ff_exp = 2048,
      .n_vocab = 163840,
      .n_ctx = 131072,
      .rms_eps = 1e-6f,
      .rope_base = 50000.0f,
      .n_rot = 64,
      .n_dense_lead = 1,
      .n_expert_shared = 1,
      .exp_scale = 2.827f,
      .n_lora_q = 1536,
      .n_lora_kv = 512,
      .head_dim_v = 128,
      .n_group = 1,
      .n_group_used = 1,
      .yarn_factor = 32.0f,
      .yarn_orig_ctx = 4096,
      .yarn_log_mul = 0.1f},
     true},
    /* zai-org/GLM-4.7-Flash (llama.cpp runs it as deepseek2): MLA with a 192+64 key head and a
     * 256 value head, 64 experts top-4 and one shared, one dense layer, its MTP layer */
    {"glm4.7-flash",
     {.n_layer = 47,
      .n_embd = 2048,
      .n_head = 20,
      .head_dim = 256,
      .n_expert = 64,
      .n_expert_used = 4,
      .n_ff = 10240,
      .n_ff_exp = 1536,
      .n_vocab = 154880,
      .n_ctx = 202752,
      .rms_eps = 1e-5f,
      .rope_base = 1e6f,
      .n_rot = 64,
      .n_dense_lead = 1,
      .n_nextn = 1,
      .n_expert_shared = 1,
      .exp_scale = 1.8f,
      .n_lora_q = 768,
      .n_lora_kv = 512,
      .head_dim_v = 256,
      .n_group = 1,
      .n_group_used = 1},
     true},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

/* Where each block type keeps its fp16 fields (ggml-common.h's block_* layouts): the scale d and,
 * for the types with one, the min (Q4_1 m, Q5_1 m, K-quant dmin). Random blocks get a bounded d
 * here; every other byte is any value the format allows. */
struct blk_fields {
    uint32_t type;
    int off_d, off_min; /* -1: none */
};
static const struct blk_fields blk_fields[] = {
    {QT_Q4_0, 0, -1}, {QT_Q4_1, 0, 2},    {QT_Q5_0, 0, -1},   {QT_Q5_1, 0, 2},
    {QT_Q8_0, 0, -1}, {QT_Q2_K, 80, 82},  {QT_Q3_K, 108, -1}, {QT_Q4_K, 0, 2},
    {QT_Q5_K, 0, 2},  {QT_Q6_K, 208, -1}, {QT_IQ4_NL, 0, -1}, {QT_IQ4_XS, 0, -1},
    {QT_MXFP4, 0, -1}, /* its scale is an E8M0 byte, not an fp16 (put_scale) */
};
#define N_BLK_FIELDS (sizeof blk_fields / sizeof blk_fields[0])

/* How random blocks of one type are scaled, measured once per write (calibrate). */
struct blk_cal {
    const struct blk_fields *f;
    float unit;      /* std of the weights when d = 1 */
    float min_ratio; /* min field = min_ratio * d centres the weights on 0 */
};

/* What a tensor's elements are, so its spread follows from the model's shape. */
enum role {
    ROLE_EMBD,   /* token_embd: unit spread (plus the sink coordinate with zipf routing) */
    ROLE_OUTPUT, /* output: logits with a spread of ~16 */
    ROLE_NORM,   /* RMSNorm weights: 1 +- 0.17 */
    ROLE_BIAS,   /* q/k/v biases */
    ROLE_IN,     /* matrices reading the normalized stream: q, k, v, gate, up, routers */
    ROLE_RESID,  /* matrices writing the residual stream: attn_output, ffn_down */
};

/* Element 0 of each row may be fixed: the zipf router's sink coordinate (see plan_router). */
enum col0 { COL0_RANDOM, COL0_SET, COL0_ROUTER };

struct tdesc {
    char name[64];
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t n_rows;    /* ne[1] * ne[2] * ne[3] */
    uint64_t row_bytes; /* bytes of ne[0] elements of type */
    int layer;          /* -1: not in a block */
    float mean, half;   /* elements are uniform in mean +- half */
    uint64_t key;       /* RNG stream of this tensor */
    enum col0 col0;
    float col0_val;
    bool zero_row0;            /* row 0 of each matrix is zero: nothing is written to the sink */
    const struct blk_cal *cal; /* random blocks; NULL: generated from floats */
};

struct fx {
    enum arch arch;
    const struct shape *shape;
    struct fixture_hparams hp;
    bool mix;
    uint32_t type;
    bool blocks;
    uint64_t seed;
    double zipf;
    bool old_layout, tied, no_bias;
    bool mxfp4_moe; /* llama-quantize's MXFP4_MOE: 3-D expert tensors MXFP4, other matrices Q8_0 */
    uint32_t n_vocab;
    float *router_col0; /* [n_layer][n_expert] with zipf routing */
    struct blk_cal cal[N_BLK_FIELDS];
    struct tdesc *t;
    uint32_t n_t, cap_t;
    uint64_t max_ne0;
};

/* ---- counter-based RNG: splitmix64 keyed by (seed, tensor), positioned by element ------------ */

#define GAMMA 0x9e3779b97f4a7c15ull

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The i-th output of splitmix64 started at key: any element is computed on its own, so threads
 * and chunk sizes never change a byte. */
static uint64_t rng_at(uint64_t key, uint64_t i)
{
    return mix64(key + (i + 1) * GAMMA);
}

/* rng_sym: uniform in [-1, 1). */
static float rng_sym(uint64_t key, uint64_t i)
{
    return (float)(rng_at(key, i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

static uint64_t name_key(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    return mix64(mix64(seed + GAMMA) ^ h);
}

/* ---- options --------------------------------------------------------------------------------- */

static int parse_arch(const char *name, enum arch *out)
{
    for (int a = 0; a < ARCH_COUNT; a++) {
        if (strcmp(name, arch_names[a]) == 0) {
            *out = (enum arch)a;
            return 0;
        }
    }
    return strata_errf(STRATA_EINVAL,
                       "unknown architecture '%s': use qwen3moe, llama, olmoe, qwen2moe, gpt-oss, "
                       "glm4moe or deepseek2",
                       name);
}

static int find_shape(const char *name, const struct shape **out)
{
    for (size_t i = 0; i < N_SHAPES; i++) {
        if (strcmp(name, shapes[i].name) == 0) {
            *out = &shapes[i];
            return 0;
        }
    }
    return strata_errf(STRATA_EINVAL,
                       "unknown shape '%s': use tiny, qwen3-mini, qwen3-30b-a3b, gpt-oss-mini, "
                       "gpt-oss-20b, gpt-oss-120b, glm4-mini, glm4.5-air, glm4.5, ds-mini, "
                       "deepseek-v3, kimi-k2 or glm4.7-flash",
                       name);
}

/* adapt: the per-architecture facts of llama.cpp's loaders. olmoe and qwen2moe size q and the
 * attention output as (n_embd, n_embd), so their head size is n_embd/n_head; olmoe has as many KV
 * heads as heads; llama and olmoe read the expert width from feed_forward_length. */
static void adapt(enum arch a, struct fixture_hparams *hp)
{
    switch (a) {
    case ARCH_QWEN3MOE:
        break;
    case ARCH_LLAMA:
        hp->n_ff = hp->n_ff_exp;
        hp->rms_eps = 1e-5f;
        break;
    case ARCH_OLMOE:
        hp->n_head_kv = hp->n_head;
        hp->head_dim = hp->n_embd / hp->n_head;
        hp->n_ff = hp->n_ff_exp;
        hp->rms_eps = 1e-5f;
        hp->rope_base = 10000.0f;
        break;
    case ARCH_QWEN2MOE:
        hp->head_dim = hp->n_embd / hp->n_head;
        break;
    case ARCH_GPT_OSS:
        hp->n_ff = hp->n_ff_exp;
        hp->rms_eps = 1e-5f;
        hp->rope_base = 150000.0f;
        break;
    case ARCH_GLM4MOE:
        /* the tiny shape gets GLM's layer kinds: a dense layer, two MoE layers, the MTP layer,
         * half the head rotated, q/k norms (GLM-4.5's), the routed scaling of 2.5 */
        if (hp->n_rot == 0) {
            hp->n_layer = 3;
            hp->n_rot = hp->head_dim / 2;
            hp->n_dense_lead = 1;
            hp->n_nextn = 1;
            hp->n_expert_shared = 1;
            hp->exp_scale = 2.5f;
            hp->qk_norm = true;
            hp->rms_eps = 1e-5f;
        }
        hp->n_ff_shexp = hp->n_expert_shared * hp->n_ff_exp;
        break;
    case ARCH_DEEPSEEK2:
        /* the tiny shape gets DeepSeek-V3's layer kinds: a dense layer, two MoE layers of 4
         * groups (2 kept), MLA with both LoRAs (ranks 256: the K-quants' block), YaRN, and an
         * MTP layer (GLM-4.7-Flash's kind: in the file, never run) */
        if (hp->n_lora_kv == 0) {
            hp->n_layer = 3;
            hp->head_dim = 192;
            hp->head_dim_v = 128;
            hp->n_rot = 64;
            hp->n_lora_q = 256;
            hp->n_lora_kv = 256;
            hp->n_dense_lead = 1;
            hp->n_nextn = 1;
            hp->n_expert_shared = 1;
            hp->exp_scale = 2.5f;
            hp->n_group = 4;
            hp->n_group_used = 2;
            hp->yarn_factor = 40.0f;
            hp->yarn_orig_ctx = 4096;
            hp->yarn_log_mul = 0.1f;
            hp->n_ctx = 163840;
            hp->rope_base = 10000.0f;
        }
        hp->n_head_kv = 1;
        hp->qk_norm = false;
        hp->n_ff_shexp = hp->n_expert_shared * hp->n_ff_exp;
        break;
    case ARCH_COUNT:
        break;
    }
    if (a != ARCH_QWEN2MOE && a != ARCH_GLM4MOE && a != ARCH_DEEPSEEK2) hp->n_ff_shexp = 0;
    if (a != ARCH_DEEPSEEK2) {
        hp->n_lora_q = hp->n_lora_kv = hp->head_dim_v = hp->n_group = hp->n_group_used = 0;
        hp->yarn_factor = hp->yarn_log_mul = 0.0f;
        hp->yarn_orig_ctx = 0;
    }
    if (a != ARCH_GLM4MOE && a != ARCH_DEEPSEEK2) {
        hp->n_rot = hp->n_dense_lead = hp->n_nextn = hp->n_expert_shared = 0;
        hp->exp_scale = 0.0f;
        hp->qk_norm = false;
    }
}

int fixture_hparams(const char *arch, const char *shape, struct fixture_hparams *out)
{
    enum arch a = ARCH_QWEN3MOE;
    const struct shape *s = &shapes[0];
    int rv;
    if ((arch && (rv = parse_arch(arch, &a)) != 0) || (shape && (rv = find_shape(shape, &s)) != 0))
        return rv;
    *out = s->hp;
    adapt(a, out);
    return 0;
}

/* ---- tensor plan ----------------------------------------------------------------------------- */

/* use_more_bits is llama.cpp's rule (src/llama-quant.cpp, llama_tensor_get_type) for the layers
 * whose attn_v and ffn_down get Q6_K in a Q4_K_M file: the first and last eighth, and every third
 * layer in between. */
static bool use_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* mix_type: Q4_K_M as llama_tensor_get_type assigns it (llama-quant.cpp), for the tensors these
 * architectures have: output (or token_embd when tied) Q6_K; attn_v Q6_K in use_more_bits layers;
 * ffn_down* (experts, per-expert and shared) Q6_K in use_more_bits layers; and the 8-expert bumps
 * (Mixtral's): attn_v and attn_k Q8_0, attn_output Q5_K. Everything else Q4_K. */
static uint32_t mix_type(const struct fx *fx, const char *name, int layer)
{
    int n = (int)fx->hp.n_layer;
    bool eight = fx->hp.n_expert == 8;
    if (strcmp(name, "output.weight") == 0 || (fx->tied && strcmp(name, "token_embd.weight") == 0))
        return QT_Q6_K;
    if (strstr(name, "attn_v.weight"))
        return eight ? QT_Q8_0 : use_more_bits(layer, n) ? QT_Q6_K : QT_Q4_K;
    if (strstr(name, "attn_k.weight")) return eight ? QT_Q8_0 : QT_Q4_K;
    if (strstr(name, "ffn_down")) return use_more_bits(layer, n) ? QT_Q6_K : QT_Q4_K;
    if (strstr(name, "attn_output.weight")) return eight ? QT_Q5_K : QT_Q4_K;
    return QT_Q4_K;
}

static int add(struct fx *fx, enum role role, int layer, const char *fmt, uint32_t n_dims,
               uint64_t ne0, uint64_t ne1, uint64_t ne2, ...) __attribute__((format(printf, 4, 9)));

/* add declares one tensor: name from fmt (layer and expert numbers follow ne2), its type, its
 * spread from its role (GPT-2's init: residual writers scaled by 1/sqrt(2 n_layer)). */
static int add(struct fx *fx, enum role role, int layer, const char *fmt, uint32_t n_dims,
               uint64_t ne0, uint64_t ne1, uint64_t ne2, ...)
{
    if (fx->n_t == fx->cap_t) {
        uint32_t cap = fx->cap_t ? fx->cap_t * 2 : 256;
        struct tdesc *t = realloc(fx->t, cap * sizeof *t);
        if (!t) return strata_errf(STRATA_ENOMEM, "fixture: %u tensor descriptions", cap);
        fx->t = t;
        fx->cap_t = cap;
    }
    struct tdesc *t = &fx->t[fx->n_t];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, ne2);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->ne[3] = 1;
    t->n_rows = ne1 * ne2;
    t->layer = layer;
    t->key = name_key(fx->seed, t->name);

    bool matrix =
        n_dims >= 2 && !strstr(t->name, "ffn_gate_inp.weight") && !strstr(t->name, ".bias");
    t->type = !matrix         ? QT_F32
              : fx->mix       ? mix_type(fx, t->name, layer)
              : fx->mxfp4_moe ? (strstr(t->name, "_exps.") ? QT_MXFP4 : QT_Q8_0)
                              : fx->type;
    const struct qtype_info *qi = qtype_get(t->type);
    if (fx->mix && ne0 % qi->blck != 0) {
        /* llama-quant.cpp's fallback for rows that are no multiple of a K-quant's 256 */
        t->type = t->type == QT_Q4_K ? QT_Q5_0 : t->type == QT_Q5_K ? QT_Q5_1 : QT_Q8_0;
        qi = qtype_get(t->type);
    }
    if (ne0 % qi->blck != 0)
        return strata_errf(STRATA_EINVAL,
                           "%s has rows of %llu elements, not a multiple of %s's block of %u: "
                           "choose another type",
                           t->name, (unsigned long long)ne0, qi->name, qi->blck);
    t->row_bytes = ne0 / qi->blck * qi->bytes;

    float in = 1.0f / sqrtf((float)ne0);
    float std = 1.0f;
    switch (role) {
    case ROLE_EMBD:
        std = 1.0f;
        break;
    case ROLE_OUTPUT:
        std = 16.0f * in;
        break;
    case ROLE_NORM:
        t->mean = 1.0f, std = 0.1f;
        break;
    case ROLE_BIAS:
        std = 0.1f;
        break;
    case ROLE_IN:
        std = in;
        break;
    case ROLE_RESID:
        std = in / sqrtf(2.0f * (float)fx->hp.n_layer);
        break;
    }
    t->half = std * sqrtf(3.0f);
    if (fx->blocks) {
        for (size_t i = 0; i < N_BLK_FIELDS; i++)
            if (fx->cal[i].f && fx->cal[i].f->type == t->type) t->cal = &fx->cal[i];
    }
    if (ne0 > fx->max_ne0) fx->max_ne0 = ne0;
    fx->n_t++;
    return 0;
}

/* The last tensor added. */
static struct tdesc *last(struct fx *fx)
{
    return &fx->t[fx->n_t - 1];
}

/* plan_router: Zipf-like routing without a router bias (these architectures have none). Token
 * embeddings get a constant "sink" coordinate 0 (c = sqrt(n_embd - 1), as much energy as the
 * other coordinates together, like the massive activations of trained models). Nothing writes
 * coordinate 0 of the residual (row 0 of attn_output and ffn_down is zero) and attn_norm and
 * output_norm zero it, so it reaches only the routers, through ffn_norm, as h0 ~ sqrt(n_embd / 2)
 * for every token. Router row e gets column 0 = beta * log(p_e) / h0 with p_e ~ rank^-S, rank a
 * seeded permutation per layer: every token's logit for e is shifted by beta * log(p_e) on top of
 * the random part's noise (std ~ 1/sqrt 2). beta is about the scale of a Gumbel of that noise's
 * variance, under which top-1 choice frequencies would be exactly p_e; the top-k flattens the head.
 * The residual grows a little with depth (GPT-2 init keeps it bounded), which weakens the skew of
 * the last layers slightly. fixture_test measures the popularity; strata trace measures it in vivo.
 */
static int plan_router(struct fx *fx)
{
    uint32_t ne = fx->hp.n_expert, nl = fx->hp.n_layer + fx->hp.n_nextn; /* MTP layers route too */
    float n = (float)fx->hp.n_embd;
    uint32_t *perm = malloc(ne * sizeof *perm);
    fx->router_col0 = malloc((size_t)nl * ne * sizeof *fx->router_col0);
    if (!perm || !fx->router_col0) {
        free(perm);
        return strata_errf(STRATA_ENOMEM, "fixture: router plan of %u x %u", nl, ne);
    }
    float h0 = sqrtf(n / 2.0f), noise = 1.0f / sqrtf(2.0f);
    /* 0.8: Gaussian noise has lighter tails than the Gumbel of its variance, which made the
     * measured top-1 exponent 1.25 S (fixture_test prints it) */
    float beta = 0.8f * noise * sqrtf(6.0f) / 3.14159265f;
    for (uint32_t l = 0; l < nl; l++) {
        uint64_t key = name_key(fx->seed ^ l, "router-ranking");
        for (uint32_t e = 0; e < ne; e++)
            perm[e] = e;
        for (uint32_t e = ne - 1; e > 0; e--) { /* Fisher-Yates */
            uint32_t j = (uint32_t)(rng_at(key, e) % (e + 1));
            uint32_t tmp = perm[e];
            perm[e] = perm[j];
            perm[j] = tmp;
        }
        for (uint32_t r = 0; r < ne; r++)
            fx->router_col0[(size_t)l * ne + perm[r]] =
                beta * (float)(-fx->zipf * log((double)r + 1.0)) / h0;
    }
    free(perm);
    return 0;
}

static void set_col0(struct tdesc *t, float v)
{
    t->col0 = COL0_SET;
    t->col0_val = v;
}

/* plan_mla: layer l's multi-head latent attention (deepseek2), as current converters write it
 * (attn_k_b and attn_v_b, 3-D: one matrix per head) or, with old_layout, the older attn_kv_b;
 * attn_output last. */
static int plan_mla(struct fx *fx, uint32_t l)
{
    const struct fixture_hparams *hp = &fx->hp;
    const uint64_t E = hp->n_embd, H = hp->n_head, R = hp->n_lora_kv, rot = hp->n_rot,
                   nope = hp->head_dim - rot, VH = hp->head_dim_v, QW = H * hp->head_dim;
    const int il = (int)l;
    int rv;
    if (hp->n_lora_q) {
        if ((rv = add(fx, ROLE_IN, il, "blk.%u.attn_q_a.weight", 2, E, hp->n_lora_q, 1, l)) != 0 ||
            (rv = add(fx, ROLE_NORM, il, "blk.%u.attn_q_a_norm.weight", 1, hp->n_lora_q, 1, 1,
                      l)) != 0 ||
            (rv = add(fx, ROLE_IN, il, "blk.%u.attn_q_b.weight", 2, hp->n_lora_q, QW, 1, l)) != 0)
            return rv;
    } else if ((rv = add(fx, ROLE_IN, il, "blk.%u.attn_q.weight", 2, E, QW, 1, l)) != 0) {
        return rv;
    }
    if ((rv = add(fx, ROLE_IN, il, "blk.%u.attn_kv_a_mqa.weight", 2, E, R + rot, 1, l)) != 0 ||
        (rv = add(fx, ROLE_NORM, il, "blk.%u.attn_kv_a_norm.weight", 1, R, 1, 1, l)) != 0)
        return rv;
    if (fx->old_layout) {
        if ((rv = add(fx, ROLE_IN, il, "blk.%u.attn_kv_b.weight", 2, R, H * (nope + VH), 1, l)) !=
            0)
            return rv;
    } else if ((rv = add(fx, ROLE_IN, il, "blk.%u.attn_k_b.weight", 3, nope, R, H, l)) != 0 ||
               (rv = add(fx, ROLE_IN, il, "blk.%u.attn_v_b.weight", 3, R, VH, H, l)) != 0) {
        return rv;
    }
    return add(fx, ROLE_RESID, il, "blk.%u.attn_output.weight", 2, H * VH, E, 1, l);
}

/* plan: every tensor llama.cpp's loader creates for the architecture, in file order. */
static int plan(struct fx *fx)
{
    const struct fixture_hparams *hp = &fx->hp;
    uint64_t E = hp->n_embd, V = fx->n_vocab, X = hp->n_expert, F = hp->n_ff_exp;
    uint64_t QW = (uint64_t)hp->n_head * hp->head_dim, KW = (uint64_t)hp->n_head_kv * hp->head_dim;
    bool sink = fx->zipf > 0;
    int rv;

    if ((rv = add(fx, ROLE_EMBD, -1, "token_embd.weight", 2, E, V, 1)) != 0) return rv;
    if (sink) set_col0(last(fx), sqrtf((float)(E - 1)));
    const bool ds = fx->arch == ARCH_DEEPSEEK2, glm = fx->arch == ARCH_GLM4MOE || ds;
    for (uint32_t l = 0; l < hp->n_layer + hp->n_nextn; l++) {
        int il = (int)l;
        if ((rv = add(fx, ROLE_NORM, il, "blk.%u.attn_norm.weight", 1, E, 1, 1, l)) != 0) return rv;
        if (sink) set_col0(last(fx), 0.0f);
        if (ds) {
            if ((rv = plan_mla(fx, l)) != 0) return rv;
            last(fx)->zero_row0 = sink;
        } else if ((rv = add(fx, ROLE_IN, il, "blk.%u.attn_q.weight", 2, E, QW, 1, l)) != 0 ||
                   (rv = add(fx, ROLE_IN, il, "blk.%u.attn_k.weight", 2, E, KW, 1, l)) != 0 ||
                   (rv = add(fx, ROLE_IN, il, "blk.%u.attn_v.weight", 2, E, KW, 1, l)) != 0)
            return rv;
        const bool oss = fx->arch == ARCH_GPT_OSS;
        if ((fx->arch == ARCH_QWEN2MOE || oss || (glm && !ds)) && !fx->no_bias &&
            ((rv = add(fx, ROLE_BIAS, il, "blk.%u.attn_q.bias", 1, QW, 1, 1, l)) != 0 ||
             (rv = add(fx, ROLE_BIAS, il, "blk.%u.attn_k.bias", 1, KW, 1, 1, l)) != 0 ||
             (rv = add(fx, ROLE_BIAS, il, "blk.%u.attn_v.bias", 1, KW, 1, 1, l)) != 0))
            return rv;
        if (!ds && (rv = add(fx, ROLE_RESID, il, "blk.%u.attn_output.weight", 2, QW, E, 1, l)) != 0)
            return rv;
        if (!ds) last(fx)->zero_row0 = sink;
        /* gpt-oss: the output bias, one sink logit per head (spread 1: they matter) */
        if (oss && ((rv = add(fx, ROLE_BIAS, il, "blk.%u.attn_output.bias", 1, E, 1, 1, l)) != 0 ||
                    (rv = add(fx, ROLE_NORM, il, "blk.%u.attn_sinks.weight", 1, hp->n_head, 1, 1,
                              l)) != 0))
            return rv;
        if (fx->arch == ARCH_QWEN3MOE || fx->arch == ARCH_OLMOE || (glm && hp->qk_norm)) {
            /* qwen3moe normalizes each head; olmoe the whole projection */
            uint64_t qn = fx->arch == ARCH_OLMOE ? QW : hp->head_dim;
            uint64_t kn = fx->arch == ARCH_OLMOE ? KW : hp->head_dim;
            if ((rv = add(fx, ROLE_NORM, il, "blk.%u.attn_q_norm.weight", 1, qn, 1, 1, l)) != 0 ||
                (rv = add(fx, ROLE_NORM, il, "blk.%u.attn_k_norm.weight", 1, kn, 1, 1, l)) != 0)
                return rv;
        }
        if ((rv = add(fx, ROLE_NORM, il,
                      oss || (glm && !ds) ? "blk.%u.post_attention_norm.weight"
                                          : "blk.%u.ffn_norm.weight",
                      1, E, 1, 1, l)) != 0)
            return rv;
        if (sink) set_col0(last(fx), 1.0f);
        if (glm && l < hp->n_dense_lead) {
            /* GLM's leading dense layers: a SwiGLU FFN of n_ff */
            uint64_t D = hp->n_ff;
            if ((rv = add(fx, ROLE_IN, il, "blk.%u.ffn_gate.weight", 2, E, D, 1, l)) != 0 ||
                (rv = add(fx, ROLE_RESID, il, "blk.%u.ffn_down.weight", 2, D, E, 1, l)) != 0)
                return rv;
            last(fx)->zero_row0 = sink;
            if ((rv = add(fx, ROLE_IN, il, "blk.%u.ffn_up.weight", 2, E, D, 1, l)) != 0) return rv;
            continue;
        }
        if ((rv = add(fx, ROLE_IN, il, "blk.%u.ffn_gate_inp.weight", 2, E, X, 1, l)) != 0)
            return rv;
        if (sink) last(fx)->col0 = COL0_ROUTER;
        if (oss && (rv = add(fx, ROLE_BIAS, il, "blk.%u.ffn_gate_inp.bias", 1, X, 1, 1, l)) != 0)
            return rv;
        /* the selection bias of sigmoid routing (DeepSeek-V3's e_score_correction_bias) */
        if (glm && (rv = add(fx, ROLE_BIAS, il, "blk.%u.exp_probs_b.bias", 1, X, 1, 1, l)) != 0)
            return rv;
        /* with zipf routing the popularity is the router's column 0: no bias reshuffles it */
        if (glm && sink) last(fx)->half = 0.0f;
        if (fx->old_layout && fx->arch == ARCH_LLAMA) {
            for (uint32_t e = 0; e < hp->n_expert; e++) {
                if ((rv = add(fx, ROLE_IN, il, "blk.%u.ffn_gate.%u.weight", 2, E, F, 1, l, e)) !=
                        0 ||
                    (rv = add(fx, ROLE_RESID, il, "blk.%u.ffn_down.%u.weight", 2, F, E, 1, l, e)) !=
                        0)
                    return rv;
                last(fx)->zero_row0 = sink;
                if ((rv = add(fx, ROLE_IN, il, "blk.%u.ffn_up.%u.weight", 2, E, F, 1, l, e)) != 0)
                    return rv;
            }
        } else {
            if ((rv = add(fx, ROLE_IN, il, "blk.%u.ffn_gate_exps.weight", 3, E, F, X, l)) != 0 ||
                (rv = add(fx, ROLE_IN, il, "blk.%u.ffn_up_exps.weight", 3, E, F, X, l)) != 0 ||
                (rv = add(fx, ROLE_RESID, il, "blk.%u.ffn_down_exps.weight", 3, F, E, X, l)) != 0)
                return rv;
            last(fx)->zero_row0 = sink;
            /* gpt-oss's expert biases: 2-D, one row per expert (F32 in every converted file) */
            if (oss &&
                ((rv = add(fx, ROLE_BIAS, il, "blk.%u.ffn_gate_exps.bias", 2, F, X, 1, l)) != 0 ||
                 (rv = add(fx, ROLE_BIAS, il, "blk.%u.ffn_up_exps.bias", 2, F, X, 1, l)) != 0 ||
                 (rv = add(fx, ROLE_BIAS, il, "blk.%u.ffn_down_exps.bias", 2, E, X, 1, l)) != 0))
                return rv;
        }
        if (fx->arch == ARCH_QWEN2MOE) {
            /* ffn_gate_inp_shexp has one output: llama.cpp creates it 1-D, {n_embd} */
            uint64_t S = hp->n_ff_shexp;
            if ((rv = add(fx, ROLE_IN, il, "blk.%u.ffn_gate_inp_shexp.weight", 1, E, 1, 1, l)) !=
                    0 ||
                (rv = add(fx, ROLE_IN, il, "blk.%u.ffn_gate_shexp.weight", 2, E, S, 1, l)) != 0 ||
                (rv = add(fx, ROLE_IN, il, "blk.%u.ffn_up_shexp.weight", 2, E, S, 1, l)) != 0 ||
                (rv = add(fx, ROLE_RESID, il, "blk.%u.ffn_down_shexp.weight", 2, S, E, 1, l)) != 0)
                return rv;
            last(fx)->zero_row0 = sink;
        }
        if (glm && hp->n_ff_shexp) {
            /* GLM's shared expert has no gate: its output is added as is */
            uint64_t S = hp->n_ff_shexp;
            if ((rv = add(fx, ROLE_IN, il, "blk.%u.ffn_gate_shexp.weight", 2, E, S, 1, l)) != 0 ||
                (rv = add(fx, ROLE_RESID, il, "blk.%u.ffn_down_shexp.weight", 2, S, E, 1, l)) != 0)
                return rv;
            last(fx)->zero_row0 = sink;
            if ((rv = add(fx, ROLE_IN, il, "blk.%u.ffn_up_shexp.weight", 2, E, S, 1, l)) != 0)
                return rv;
        }
        /* the MTP layer's own tensors (llama.cpp loads them, skipped, and never runs them) */
        if (l >= hp->n_layer &&
            ((rv = add(fx, ROLE_IN, il, "blk.%u.nextn.eh_proj.weight", 2, 2 * E, E, 1, l)) != 0 ||
             (rv = add(fx, ROLE_NORM, il, "blk.%u.nextn.enorm.weight", 1, E, 1, 1, l)) != 0 ||
             (rv = add(fx, ROLE_NORM, il, "blk.%u.nextn.hnorm.weight", 1, E, 1, 1, l)) != 0 ||
             (rv = add(fx, ROLE_NORM, il, "blk.%u.nextn.shared_head_norm.weight", 1, E, 1, 1, l)) !=
                 0))
            return rv;
    }
    if ((rv = add(fx, ROLE_NORM, -1, "output_norm.weight", 1, E, 1, 1)) != 0) return rv;
    if (sink) set_col0(last(fx), 0.0f);
    if (!fx->tied && (rv = add(fx, ROLE_OUTPUT, -1, "output.weight", 2, E, V, 1)) != 0) return rv;
    return 0;
}

/* ---- metadata -------------------------------------------------------------------------------- */

static int write_kv(const struct fx *fx, struct gguf_writer *w, const struct gguf_file *vocab)
{
    const bool ds = fx->arch == ARCH_DEEPSEEK2;
    const struct fixture_hparams *hp = &fx->hp;
    const char *a = arch_names[fx->arch];
    char key[128], name[96];
    int rv;
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, a), key)
    snprintf(name, sizeof name, "strata fixture %s %s", a, fx->shape->name);
    if ((rv = gguf_w_str(w, "general.architecture", a)) != 0 ||
        (rv = gguf_w_str(w, "general.name", name)) != 0 ||
        (rv = gguf_w_u32(w, "general.file_type",
                         fx->mxfp4_moe ? 38 /* LLAMA_FTYPE_MOSTLY_MXFP4_MOE */
                                       : quantize_ftype(fx->mix ? QT_Q4_K : fx->type))) != 0 ||
        (rv = gguf_w_u32(w, "general.quantization_version", 2)) != 0 ||
        (rv = gguf_w_u32(w, KEY("block_count"), hp->n_layer + hp->n_nextn)) != 0 ||
        (rv = gguf_w_u32(w, KEY("context_length"), hp->n_ctx)) != 0 ||
        (rv = gguf_w_u32(w, KEY("embedding_length"), hp->n_embd)) != 0 ||
        (rv = gguf_w_u32(w, KEY("feed_forward_length"), hp->n_ff)) != 0 ||
        (rv = gguf_w_u32(w, KEY("attention.head_count"), hp->n_head)) != 0 ||
        (rv = gguf_w_u32(w, KEY("attention.head_count_kv"),
                         ds && fx->old_layout ? hp->n_head : hp->n_head_kv)) != 0 ||
        (rv = gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), hp->rms_eps)) != 0 ||
        (rv = gguf_w_f32(w, KEY("rope.freq_base"), hp->rope_base)) != 0 ||
        (rv = gguf_w_u32(w, KEY("expert_count"), hp->n_expert)) != 0 ||
        (rv = gguf_w_u32(w, KEY("expert_used_count"), hp->n_expert_used)) != 0)
        return rv;
    /* convert_hf_to_gguf.py writes the head size when config.json has head_dim (Qwen3 always);
     * llama.cpp needs it whenever it is not n_embd/n_head */
    if (!ds && (fx->arch == ARCH_QWEN3MOE || fx->arch == ARCH_GPT_OSS || fx->arch == ARCH_GLM4MOE ||
                hp->head_dim * hp->n_head != hp->n_embd)) {
        if ((rv = gguf_w_u32(w, KEY("attention.key_length"), hp->head_dim)) != 0 ||
            (rv = gguf_w_u32(w, KEY("attention.value_length"), hp->head_dim)) != 0)
            return rv;
    }
    if (fx->arch == ARCH_QWEN3MOE || fx->arch == ARCH_QWEN2MOE || fx->arch == ARCH_GPT_OSS ||
        fx->arch == ARCH_GLM4MOE || ds) {
        if ((rv = gguf_w_u32(w, KEY("expert_feed_forward_length"), hp->n_ff_exp)) != 0) return rv;
    }
    /* gpt-oss: sliding windows (128 in the real files; the tiny shape's 8 makes them matter in a
     * short test) and YaRN over the 4096 positions it was trained at */
    if (fx->arch == ARCH_GPT_OSS &&
        ((rv = gguf_w_u32(w, KEY("attention.sliding_window"), fx->shape->large ? 128 : 8)) != 0 ||
         (rv = gguf_w_str(w, KEY("rope.scaling.type"), "yarn")) != 0 ||
         (rv = gguf_w_f32(w, KEY("rope.scaling.factor"), 32.0f)) != 0 ||
         (rv = gguf_w_u32(w, KEY("rope.scaling.original_context_length"), 4096)) != 0))
        return rv;
    if (fx->arch == ARCH_QWEN2MOE &&
        (rv = gguf_w_u32(w, KEY("expert_shared_feed_forward_length"), hp->n_ff_shexp)) != 0)
        return rv;
    /* glm4moe, as convert_hf_to_gguf.py's Glm4MoeModel writes it */
    if ((fx->arch == ARCH_GLM4MOE || ds) &&
        ((rv = gguf_w_u32(w, KEY("rope.dimension_count"), hp->n_rot)) != 0 ||
         (rv = gguf_w_u32(w, KEY("expert_shared_count"), hp->n_expert_shared)) != 0 ||
         (rv = gguf_w_u32(w, KEY("leading_dense_block_count"), hp->n_dense_lead)) != 0 ||
         (rv = gguf_w_f32(w, KEY("expert_weights_scale"), hp->exp_scale)) != 0 ||
         (rv = gguf_w_bool(w, KEY("expert_weights_norm"), true)) != 0 ||
         (rv = gguf_w_u32(w, KEY("expert_gating_func"), 2)) != 0 ||
         (rv = gguf_w_u32(w, KEY("nextn_predict_layers"), hp->n_nextn)) != 0))
        return rv;
    /* deepseek2 as convert_hf_to_gguf.py's DeepseekV2Model writes it today: the cache's head
     * sizes (latent + rope key, latent) as key/value_length and the heads' as the _mla keys; the
     * older layout (attn_kv_b) had only the heads' sizes and as many KV heads as heads */
    if (ds) {
        const uint32_t R = hp->n_lora_kv;
        const bool old = fx->old_layout;
        if ((hp->n_lora_q && (rv = gguf_w_u32(w, KEY("attention.q_lora_rank"), hp->n_lora_q))) ||
            (rv = gguf_w_u32(w, KEY("attention.kv_lora_rank"), R)) != 0 ||
            (rv = gguf_w_u32(w, KEY("attention.key_length"), old ? hp->head_dim : R + hp->n_rot)) ||
            (rv = gguf_w_u32(w, KEY("attention.value_length"), old ? hp->head_dim_v : R)) ||
            (!old && (rv = gguf_w_u32(w, KEY("attention.key_length_mla"), hp->head_dim))) ||
            (!old && (rv = gguf_w_u32(w, KEY("attention.value_length_mla"), hp->head_dim_v))) ||
            (rv = gguf_w_u32(w, KEY("expert_group_count"), hp->n_group)) != 0 ||
            (rv = gguf_w_u32(w, KEY("expert_group_used_count"), hp->n_group_used)) != 0)
            return rv;
        if (hp->yarn_factor > 1.0f &&
            ((rv = gguf_w_str(w, KEY("rope.scaling.type"), "yarn")) != 0 ||
             (rv = gguf_w_f32(w, KEY("rope.scaling.factor"), hp->yarn_factor)) != 0 ||
             (rv = gguf_w_u32(w, KEY("rope.scaling.original_context_length"), hp->yarn_orig_ctx)) !=
                 0 ||
             (rv = gguf_w_f32(w, KEY("rope.scaling.yarn_log_multiplier"), hp->yarn_log_mul)) != 0))
            return rv;
    }
    if (fx->arch == ARCH_LLAMA &&
        ((rv = gguf_w_u32(w, KEY("rope.dimension_count"), hp->head_dim)) != 0 ||
         (rv = gguf_w_u32(w, KEY("vocab_size"), fx->n_vocab)) != 0))
        return rv;
#undef KEY
    if (!vocab) return fixture_vocab_write(w, fx->n_vocab);
    for (uint64_t i = 0; i < vocab->n_kv; i++) {
        const struct gguf_kv *kv = &vocab->kv[i];
        if (strncmp(kv->key, "tokenizer.", 10) == 0 &&
            (rv = gguf_w_value(w, kv->key, &kv->val)) != 0)
            return rv;
    }
    return 0;
}

/* ---- data ------------------------------------------------------------------------------------ */

/* gen_row: the floats of one row (row counts over all matrices of a 3-D tensor). */
static void gen_row(const struct fx *fx, const struct tdesc *t, uint64_t row, float *out)
{
    uint64_t ne0 = t->ne[0], base = row * ne0;
    if (t->zero_row0 && row % t->ne[1] == 0) {
        memset(out, 0, ne0 * sizeof *out);
        return;
    }
    for (uint64_t j = 0; j < ne0; j++)
        out[j] = t->mean + t->half * rng_sym(t->key, base + j);
    if (t->col0 == COL0_SET)
        out[0] = t->col0_val;
    else if (t->col0 == COL0_ROUTER)
        out[0] = fx->router_col0[(size_t)t->layer * fx->hp.n_expert + row];
}

/* fill_random: bytes [off, off + n) of the tensor's random byte stream, 8 per RNG output. */
static void fill_random(uint64_t key, uint64_t off, uint8_t *dst, size_t n)
{
    while (n > 0) {
        uint64_t v = rng_at(key, off / 8);
        size_t skip = off % 8, take = 8 - skip < n ? 8 - skip : n;
        if (take == 8) {
            memcpy(dst, &v, 8);
        } else {
            for (size_t i = 0; i < take; i++)
                dst[i] = (uint8_t)(v >> (8 * (skip + i)));
        }
        dst += take;
        off += take;
        n -= take;
    }
}

static void put_f16(uint8_t *p, float v)
{
    uint16_t h = quant_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* put_scale writes a block's scale field: fp16, or for MXFP4 the E8M0 byte of the power of two
 * nearest v (its levels are multiplied by 2^(e - 128): v = 1 is e = 128). */
static void put_scale(uint32_t type, uint8_t *p, float v)
{
    if (type != QT_MXFP4) {
        put_f16(p, v);
        return;
    }
    const long e = 128 + lrintf(log2f(v));
    p[0] = (uint8_t)(e < 1 ? 1 : e > 254 ? 254 : e);
}

/* set_scales: every block's d (and min) for weights of spread std: d varies by +-25% between
 * blocks, as trained weights' scales do, and stays finite and bounded. */
static void set_scales(const struct blk_cal *c, uint32_t bbytes, uint64_t key, uint64_t blk0,
                       uint8_t *dst, size_t n_blk, float std)
{
    float d0 = std / c->unit;
    for (size_t b = 0; b < n_blk; b++) {
        float d = d0 * (1.0f + 0.25f * rng_sym(key ^ 0x5ca1e5ull, blk0 + b));
        put_scale(c->f->type, dst + b * bbytes + c->f->off_d, d);
        if (c->f->off_min >= 0) put_f16(dst + b * bbytes + c->f->off_min, d * c->min_ratio);
    }
}

/* gen_rows: n rows of t from row r0 into dst; scratch holds one row of floats. */
static int gen_rows(const struct fx *fx, const struct tdesc *t, uint64_t r0, uint64_t n,
                    uint8_t *dst, float *scratch)
{
    const struct qtype_info *qi = qtype_get(t->type);
    int rv;
    if (!t->cal) {
        for (uint64_t r = 0; r < n; r++) {
            gen_row(fx, t, r0 + r, scratch);
            if ((rv = quant_quantize(t->type, scratch, dst + r * t->row_bytes,
                                     (int64_t)t->ne[0])) != 0)
                return rv;
        }
        return 0;
    }
    uint64_t blk_per_row = t->ne[0] / qi->blck;
    fill_random(t->key, r0 * t->row_bytes, dst, n * t->row_bytes);
    set_scales(t->cal, qi->bytes, t->key, r0 * blk_per_row, dst, n * blk_per_row,
               t->half / sqrtf(3.0f));
    for (uint64_t r = 0; r < n; r++) {
        uint8_t *row = dst + r * t->row_bytes;
        if (t->zero_row0 && (r0 + r) % t->ne[1] == 0) {
            memset(row, 0, t->row_bytes); /* zero scales: all formats decode to 0 */
        } else if (t->col0 != COL0_RANDOM) {
            /* the fixed element needs real quantization: only the row's first block */
            gen_row(fx, t, r0 + r, scratch);
            if ((rv = quant_quantize(t->type, scratch, row, qi->blck)) != 0) return rv;
        }
    }
    return 0;
}

/* calibrate measures a block type's weight spread with d = 1 and the min that centres it, from
 * 64 random blocks through quant_dequantize, so scales need no per-format algebra. */
static int calibrate(const struct blk_fields *f, struct blk_cal *c)
{
    enum { NB = 64 };
    const struct qtype_info *qi = qtype_get(f->type);
    uint8_t *blk = malloc((size_t)NB * qi->bytes);
    float *v = malloc((size_t)NB * qi->blck * sizeof *v);
    double mean[2] = {0, 0}, sq = 0;
    size_t n = (size_t)NB * qi->blck;
    int rv = 0;
    if (!blk || !v) {
        rv = strata_errf(STRATA_ENOMEM, "fixture: calibrating %s", qi->name);
        goto fail;
    }
    /* pass 0: min 0; pass 1: min 1 (the mean moves linearly with it); pass 2: centred */
    float min_field[3] = {0.0f, 1.0f, 0.0f};
    for (int pass = f->off_min < 0 ? 2 : 0; pass < 3; pass++) {
        if (pass == 2 && f->off_min >= 0) min_field[2] = (float)(-mean[0] / (mean[1] - mean[0]));
        fill_random(0x0ddba11ull, 0, blk, (size_t)NB * qi->bytes);
        for (size_t b = 0; b < NB; b++) {
            put_scale(f->type, blk + b * qi->bytes + f->off_d, 1.0f);
            if (f->off_min >= 0) put_f16(blk + b * qi->bytes + f->off_min, min_field[pass]);
        }
        if ((rv = quant_dequantize(f->type, blk, v, (int64_t)n)) != 0) goto fail;
        double s = 0;
        for (size_t i = 0; i < n; i++)
            s += v[i];
        double m = s / (double)n;
        if (pass < 2) mean[pass] = m;
        for (size_t i = 0; pass == 2 && i < n; i++)
            sq += ((double)v[i] - m) * ((double)v[i] - m);
    }
    c->min_ratio = min_field[2];
    c->f = f;
    c->unit = (float)sqrt(sq / (double)n);
fail:
    free(blk);
    free(v);
    return rv;
}

/* ---- parallel generation, written in order --------------------------------------------------- */

struct item {
    uint32_t t;
    uint64_t r0, n;
};

struct slot {
    const struct fx *fx;
    const struct item *it;
    uint8_t *buf;
    float *scratch;
    pthread_t th;
    bool running;
    int rv;
    char detail[256]; /* the worker's strata_errdetail, which is per thread */
};

static void *slot_run(void *arg)
{
    struct slot *s = arg;
    const struct tdesc *t = &s->fx->t[s->it->t];
    s->rv = gen_rows(s->fx, t, s->it->r0, s->it->n, s->buf, s->scratch);
    if (s->rv) snprintf(s->detail, sizeof s->detail, "%s: %s", t->name, strata_errdetail());
    return NULL;
}

static int start_batch(struct slot *set, int nthreads, const struct item *items, size_t n_items,
                       size_t first)
{
    for (int k = 0; k < nthreads; k++) {
        set[k].running = false;
        if (first + (size_t)k >= n_items) continue;
        set[k].it = &items[first + (size_t)k];
        set[k].rv = 0;
        int e = pthread_create(&set[k].th, NULL, slot_run, &set[k]);
        if (e != 0) return strata_errf(strata_errno(e), "fixture: starting a generator thread");
        set[k].running = true;
    }
    return 0;
}

static int join_batch(struct slot *set, int nthreads)
{
    int rv = 0;
    for (int k = 0; k < nthreads; k++) {
        if (!set[k].running) continue;
        pthread_join(set[k].th, NULL);
        set[k].running = false;
        if (set[k].rv && !rv) rv = strata_errf(set[k].rv, "%s", set[k].detail);
    }
    return rv;
}

/* write_data: items of up to FIXTURE_CHUNK_BYTES in file order; batch b+1 is generated by the
 * threads while the main thread writes batch b. */
static int write_data(const struct fx *fx, struct gguf_writer *w, int nthreads)
{
    size_t n_items = 0, cap = 0;
    struct item *items = NULL;
    struct slot *slots = calloc(2 * (size_t)nthreads, sizeof *slots);
    int rv = 0;
    if (!slots) return strata_errf(STRATA_ENOMEM, "fixture: %d generator slots", nthreads);
    for (uint32_t ti = 0; ti < fx->n_t; ti++) {
        const struct tdesc *t = &fx->t[ti];
        uint64_t per = FIXTURE_CHUNK_BYTES / t->row_bytes ? FIXTURE_CHUNK_BYTES / t->row_bytes : 1;
        for (uint64_t r = 0; r < t->n_rows; r += per) {
            if (n_items == cap) {
                cap = cap ? cap * 2 : 1024;
                struct item *ni = realloc(items, cap * sizeof *ni);
                if (!ni) {
                    rv = strata_errf(STRATA_ENOMEM, "fixture: %zu work items", cap);
                    goto fail;
                }
                items = ni;
            }
            items[n_items++] = (struct item){ti, r, t->n_rows - r < per ? t->n_rows - r : per};
        }
    }
    uint64_t max_bytes = 0;
    for (size_t i = 0; i < n_items; i++) {
        uint64_t b = items[i].n * fx->t[items[i].t].row_bytes;
        if (b > max_bytes) max_bytes = b;
    }
    for (int k = 0; k < 2 * nthreads; k++) {
        slots[k].fx = fx;
        slots[k].buf = malloc(max_bytes);
        slots[k].scratch = malloc(fx->max_ne0 * sizeof(float));
        if (!slots[k].buf || !slots[k].scratch) {
            rv = strata_errf(STRATA_ENOMEM, "fixture: %d buffers of %llu bytes", 2 * nthreads,
                             (unsigned long long)max_bytes);
            goto fail;
        }
    }
    size_t n_batches = (n_items + (size_t)nthreads - 1) / (size_t)nthreads;
    if ((rv = start_batch(slots, nthreads, items, n_items, 0)) != 0 ||
        (rv = join_batch(slots, nthreads)) != 0)
        goto fail;
    for (size_t b = 0; b < n_batches; b++) {
        struct slot *cur = &slots[(b % 2) * (size_t)nthreads];
        struct slot *next = &slots[((b + 1) % 2) * (size_t)nthreads];
        if (b + 1 < n_batches &&
            (rv = start_batch(next, nthreads, items, n_items, (b + 1) * (size_t)nthreads)) != 0)
            goto fail;
        for (int k = 0; k < nthreads && b * (size_t)nthreads + (size_t)k < n_items; k++) {
            const struct item *it = cur[k].it;
            if ((rv = gguf_writer_data(w, cur[k].buf, it->n * fx->t[it->t].row_bytes)) != 0)
                goto fail;
        }
        if ((rv = join_batch(next, nthreads)) != 0) goto fail;
    }
fail:
    for (int k = 0; k < 2 * nthreads; k++) {
        if (slots[k].running) pthread_join(slots[k].th, NULL);
        free(slots[k].buf);
        free(slots[k].scratch);
    }
    free(slots);
    free(items);
    return rv;
}

/* ---- entry ----------------------------------------------------------------------------------- */

static int setup(const struct fixture_opts *o, struct fx *fx)
{
    int rv;
    if ((rv = parse_arch(o->arch ? o->arch : "qwen3moe", &fx->arch)) != 0 ||
        (rv = find_shape(o->shape ? o->shape : "tiny", &fx->shape)) != 0)
        return rv;
    fx->hp = fx->shape->hp;
    adapt(fx->arch, &fx->hp);
    const char *type = o->type ? o->type : "q4_k_m";
    fx->mix = strcmp(type, "q4_k_m") == 0;
    fx->mxfp4_moe = strcmp(type, "mxfp4_moe") == 0;
    if (fx->mxfp4_moe) {
        fx->type = QT_Q8_0;
    } else if (!fx->mix) {
        int t = qtype_parse(type);
        if (t < 0 || !qtype_get((uint32_t)t)->computable || !quant_can_quantize((uint32_t)t))
            return strata_errf(STRATA_EINVAL,
                               "type '%s' is not one strata computes with: use q4_k_m, "
                               "mxfp4_moe, f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                               "q2_k..q6_k, iq4_nl, iq4_xs or mxfp4",
                               type);
        fx->type = (uint32_t)t;
    }
    if (o->old_layout && fx->arch != ARCH_LLAMA && fx->arch != ARCH_DEEPSEEK2)
        return strata_errf(STRATA_EINVAL,
                           "--old-layout is Mixtral's (arch llama) and older DeepSeek "
                           "conversions' (deepseek2), not %s's",
                           arch_names[fx->arch]);
    if (o->tied && fx->arch != ARCH_LLAMA && fx->arch != ARCH_QWEN3MOE)
        return strata_errf(STRATA_EINVAL, "llama.cpp requires output.weight for %s: drop --tied",
                           arch_names[fx->arch]);
    if (o->no_bias && fx->arch != ARCH_QWEN2MOE)
        return strata_errf(STRATA_EINVAL, "--no-bias drops qwen2moe's q/k/v biases; %s has none",
                           arch_names[fx->arch]);
    if (!(o->zipf >= 0 && o->zipf <= 16))
        return strata_errf(STRATA_EINVAL, "zipf exponent %g is outside [0, 16]", o->zipf);
    if (o->threads < 0 || o->threads > 256)
        return strata_errf(STRATA_EINVAL, "%d threads: use 1..256, or 0 for one per CPU",
                           o->threads);
    fx->seed = o->seed;
    fx->zipf = o->zipf;
    fx->old_layout = o->old_layout;
    fx->tied = o->tied;
    fx->no_bias = o->no_bias;
    fx->n_vocab = fx->hp.n_vocab;
    fx->blocks = o->mode == FIXTURE_BLOCKS || (o->mode == FIXTURE_AUTO && fx->shape->large);
    if (fx->blocks) {
        for (size_t i = 0; i < N_BLK_FIELDS; i++) {
            uint32_t t = blk_fields[i].type;
            /* with llama.cpp's fallbacks for rows no multiple of 256 (Q5_0, Q5_1) */
            const bool k_mix = t == QT_Q4_K || t == QT_Q5_K || t == QT_Q6_K || t == QT_Q8_0 ||
                               t == QT_Q5_0 || t == QT_Q5_1;
            bool used = fx->mix         ? k_mix
                        : fx->mxfp4_moe ? (t == QT_MXFP4 || t == QT_Q8_0)
                                        : t == fx->type;
            if (used && (rv = calibrate(&blk_fields[i], &fx->cal[i])) != 0) return rv;
        }
    }
    return 0;
}

static int auto_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 8 ? 8 : (int)n;
}

int fixture_write(const struct fixture_opts *o, const char *path)
{
    struct fx fx = {0};
    struct gguf_file *vocab = NULL;
    struct gguf_writer *w = NULL;
    int rv;

    if ((rv = setup(o, &fx)) != 0) goto fail;
    if (o->vocab) {
        const struct gguf_value *toks;
        if ((rv = gguf_open(o->vocab, &vocab)) != 0 ||
            (rv = gguf_get_arr(vocab, "tokenizer.ggml.tokens", GGUF_STRING, &toks)) != 0)
            goto fail;
        if (toks->arr.n == 0 || toks->arr.n > UINT32_MAX) {
            rv = strata_errf(STRATA_EFORMAT, "%s: %llu tokens in tokenizer.ggml.tokens", o->vocab,
                             (unsigned long long)toks->arr.n);
            goto fail;
        }
        fx.n_vocab = (uint32_t)toks->arr.n;
    }
    if (fx.zipf > 0 && (rv = plan_router(&fx)) != 0) goto fail;
    if ((rv = plan(&fx)) != 0) goto fail;
    if ((rv = gguf_writer_open(path, 0, &w)) != 0 || (rv = write_kv(&fx, w, vocab)) != 0) goto fail;
    for (uint32_t i = 0; i < fx.n_t; i++) {
        const struct tdesc *t = &fx.t[i];
        if ((rv = gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne)) != 0) goto fail;
    }
    if ((rv = gguf_writer_begin(w)) != 0 ||
        (rv = write_data(&fx, w, o->threads ? o->threads : auto_threads())) != 0)
        goto fail;
    rv = gguf_writer_finish(w);
    w = NULL;
fail:
    gguf_writer_abort(w);
    gguf_close(vocab);
    free(fx.t);
    free(fx.router_col0);
    return rv;
}
