/* model — the model contract: hyperparameters per architecture from GGUF keys and the weight table.
 *
 * model_load() reads a parsed GGUF (file mapping or arena metadata), decides the architecture's
 * behaviour as llama.cpp does (RoPE style, q/k norms, gating, biases, shared expert), checks every
 * tensor's presence, shape and type, and fills a table of pointers into the tensor data. Dense
 * weights are read in place; norms and biases (tiny, 1-D) are dequantized to owned F32 arrays.
 * Experts are reached only through model_expert_part(), whose resolver defaults to slices of the
 * GGUF tensors and can be replaced (the worker points it at the arena's blob_at), so one forward
 * pass serves a one-shot run and the served model alike.
 * After load the object is immutable; any thread may read it. It borrows the gguf_file (and its
 * mapping): close the file only after model_fini().
 * Matrix convention, as ggml: a weight of shape (n_out, n_in) has n_out rows of n_in elements;
 * shapes below are written (rows, row length), GGUF ne order reversed.
 */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/gguf/gguf.h"

enum model_arch {
    MODEL_ARCH_LLAMA,     /* "llama" with experts (Mixtral) */
    MODEL_ARCH_QWEN2MOE,  /* "qwen2moe" */
    MODEL_ARCH_QWEN3MOE,  /* "qwen3moe" */
    MODEL_ARCH_OLMOE,     /* "olmoe" */
    MODEL_ARCH_GPT_OSS,   /* "gpt-oss" (llama.cpp's LLM_ARCH_OPENAI_MOE) */
    MODEL_ARCH_GLM4MOE,   /* "glm4moe" (GLM-4.5, GLM-4.5-Air, GLM-4.6) */
    MODEL_ARCH_DEEPSEEK2, /* "deepseek2" (DeepSeek-V2/V3/R1, Kimi K2, GLM-4.7-Flash): MLA */
};

enum model_rope {
    MODEL_ROPE_NORM, /* rotate adjacent pairs (x[2i], x[2i+1]): llama.cpp's LLAMA_ROPE_TYPE_NORM */
    MODEL_ROPE_NEOX, /* rotate halves (x[i], x[i + n_rot/2]): LLAMA_ROPE_TYPE_NEOX */
};

enum model_gating {
    MODEL_GATING_SOFTMAX_TOPK, /* softmax over all experts, then top-k of the probabilities */
    MODEL_GATING_TOPK_SOFTMAX, /* top-k of the router logits, then softmax over the k selected */
    MODEL_GATING_SIGMOID,      /* sigmoid of each logit; top-k of sigmoid + exp_probs_b (the
                                  selection bias), weights the unbiased sigmoids of the k, then
                                  norm_topk and expert_weights_scale (DeepSeek-V3, GLM-4.5) */
};

enum model_qk_norm {
    MODEL_QK_NORM_NONE,
    MODEL_QK_NORM_HEAD, /* RMSNorm of each head, weight (head_dim) shared by heads (qwen3moe) */
    MODEL_QK_NORM_FULL, /* RMSNorm over the whole projection, weight (n_head*head_dim) (olmoe) */
};

/* The parts of one expert, in the order a blob packs them. */
enum model_part {
    MODEL_PART_GATE, /* (n_ff_exp, n_embd) */
    MODEL_PART_UP,   /* (n_ff_exp, n_embd) */
    MODEL_PART_DOWN, /* (n_embd, n_ff_exp) */
    MODEL_PART_COUNT,
};

/* Expert biases (gpt-oss, hp.exp_bias): part p's bias, F32 (n_out of part p), is "part"
 * MODEL_PART_BIAS + p of the resolver and of the blob. A blob packs each bias right after its
 * matrix (gate, gate bias, up, up bias, down, down bias), as the arena orders them. */
#define MODEL_PART_BIAS  MODEL_PART_COUNT
#define MODEL_BLOB_PARTS (2 * MODEL_PART_COUNT)

struct model_hparams {
    enum model_arch arch;
    uint32_t n_vocab;       /* rows of token_embd */
    uint32_t n_embd;        /* residual width */
    uint32_t n_layer;       /* transformer blocks */
    uint32_t n_head;        /* query heads */
    uint32_t n_head_kv;     /* key/value heads (GQA: n_head is a multiple of it) */
    uint32_t head_dim;      /* query/key head size: attention.key_length, else n_embd / n_head */
    uint32_t head_dim_v;    /* value head size: attention.value_length, else head_dim */
    uint32_t n_rot;         /* rotated dims per head: rope.dimension_count, else head_dim */
    uint32_t n_ctx_train;   /* context_length: the default context of a run */
    uint32_t n_expert;      /* experts per layer */
    uint32_t n_expert_used; /* experts per token (top-k) */
    uint32_t n_ff_exp;      /* hidden width of one expert */
    uint32_t n_ff_shexp;    /* hidden width of the shared expert; 0 without one */
    float rms_eps;          /* attention.layer_norm_rms_epsilon */
    float rope_theta;       /* rope.freq_base */
    enum model_rope rope;
    enum model_gating gating;
    bool norm_topk; /* renormalize the k selected weights to sum 1 (SOFTMAX_TOPK only) */
    enum model_qk_norm qk_norm;
    bool qkv_bias; /* some layer's q, k, v projections have biases (optional, as in llama.cpp) */
    /* gpt-oss (all false / 0 / 1 for the other architectures): */
    bool attn_out_bias;     /* attn_output has a bias (bo) */
    bool attn_sinks;        /* each layer has a sink logit per query head (attn_sinks) */
    bool router_bias;       /* the router has a bias (ffn_gate_inp.bias) */
    bool exp_bias;          /* each expert's gate, up and down have F32 biases (in its blob) */
    bool glu_oai;           /* experts use the clamped SwiGLU (alpha 1.702, limit 7) */
    uint32_t n_swa;         /* attention.sliding_window: an SWA layer's token sees its last n_swa
                               keys (itself included); 0 without sliding windows */
    float yarn_factor;      /* rope.scaling.factor under YaRN; 1: no scaling */
    uint32_t yarn_orig_ctx; /* rope.scaling.original_context_length (YaRN) */
    /* glm4moe (0 / 1 / false for the other architectures): */
    uint32_t n_dense_lead; /* leading_dense_block_count: layers [0, n) run a dense SwiGLU FFN */
    uint32_t n_ff_dense;   /* feed_forward_length: the dense layers' hidden width */
    uint32_t n_nextn;      /* nextn_predict_layers: the MTP layers after the n_layer trunk
                              layers, in the file (block_count = n_layer + n_nextn) but never run */
    float exp_scale;       /* expert_weights_scale: the routed weights' factor (1: none) */
    bool exp_probs_b;      /* each MoE layer has a selection bias (blk.N.exp_probs_b.bias) */
    bool shexp_gated;      /* the shared expert's output is scaled by sigmoid(gate_inp_shexp . x)
                              (qwen2moe); false: added as is (glm4moe) */
    uint32_t n_group;      /* expert_group_count: group-limited top-k over this many groups */
    uint32_t n_group_used; /* expert_group_used_count: the groups kept */
    /* deepseek2, multi-head latent attention (false / 0 elsewhere). Its cache geometry is MQA
     * over the latent: n_head_kv 1, head_dim = n_lora_kv + n_rot (the normalized latent, then the
     * rotated key, one per position and layer, as llama.cpp's MLA caches it) and head_dim_v =
     * n_lora_kv (the values are the latent itself: no V rows are stored). */
    bool mla;
    uint32_t n_lora_q;    /* attention.q_lora_rank; 0: q is one projection (attn_q, V2-Lite) */
    uint32_t n_lora_kv;   /* attention.kv_lora_rank: the latent's width */
    uint32_t head_dim_qk; /* a query head: n_nope + n_rot (key_length_mla, or key_length) */
    uint32_t head_dim_vo; /* a value head out of wv_b (value_length_mla, or value_length) */
    float kq_scale;       /* the attention scale: mscale^2 / sqrt(head_dim_qk) under YaRN,
                             mscale = 1 + rope.scaling.yarn_log_multiplier ln(factor) */
};

/* A 2-D weight read in place: n_out rows of n_in elements of type, row r at data + r*row_bytes. */
struct model_mat {
    const void *data; /* NULL for expert parts (reached through model_expert_part) */
    uint32_t type;    /* enum qtype; computable */
    uint32_t n_in;    /* row length (ne0) */
    uint32_t n_out;   /* rows (ne1) */
    uint64_t row_bytes;
};

/* Where the parts of one expert sit in its blob, the arena's packing: parts in enum model_part
 * order, each starting at a multiple of 256 bytes (ARENA_PART_ALIGN). Read from the arena's
 * descriptors for an arena's model; computed by the same rule for a GGUF file, so an expert cache
 * fills its slots in one layout either way. */
struct model_blob_layout {
    uint64_t bytes;                      /* blob_bytes: what one copy of a blob moves */
    uint64_t part_off[MODEL_BLOB_PARTS]; /* each part's (and bias's) first byte in the blob */
};

struct model_layer {
    const float *attn_norm;       /* (n_embd) */
    struct model_mat wq;          /* (n_head*head_dim, n_embd) */
    struct model_mat wk;          /* (n_head_kv*head_dim, n_embd) */
    struct model_mat wv;          /* (n_head_kv*head_dim_v, n_embd) */
    struct model_mat wo;          /* (n_embd, n_head*head_dim_v) */
    const float *bq, *bk, *bv;    /* biases of the three projections, all NULL when absent */
    const float *q_norm, *k_norm; /* (head_dim) or full width per qk_norm; NULL when NONE */
    const float *ffn_norm;        /* (n_embd) */
    struct model_mat router;      /* ffn_gate_inp: (n_expert, n_embd) */
    struct model_mat part[MODEL_PART_COUNT]; /* each expert's part: type and shape, data NULL */
    struct model_blob_layout blob;           /* the parts' places in one expert's blob */
    /* gpt-oss, NULL for the other architectures: */
    const float *bo;       /* (n_embd) attention output bias */
    const float *sinks;    /* (n_head) attention sink logits */
    const float *router_b; /* (n_expert) router bias */
    bool swa;              /* this layer attends through the sliding window (hp.n_swa) */
    /* Shared expert (qwen2moe), all zero without one: */
    struct model_mat gate_shexp;     /* (n_ff_shexp, n_embd) */
    struct model_mat up_shexp;       /* (n_ff_shexp, n_embd) */
    struct model_mat down_shexp;     /* (n_embd, n_ff_shexp) */
    struct model_mat gate_inp_shexp; /* (1, n_embd): its output scaled by sigmoid(this . x) */
    /* glm4moe: */
    bool dense;                /* a leading dense layer (il < n_dense_lead): no router, experts */
    struct model_mat ffn_gate; /* dense layers: (n_ff_dense, n_embd) */
    struct model_mat ffn_up;   /* (n_ff_dense, n_embd) */
    struct model_mat ffn_down; /* (n_embd, n_ff_dense) */
    const float *exp_probs_b;
    /* (n_expert) the selection bias, NULL without one */ /* deepseek2 (MLA): */
    struct model_mat wq_a;  /* (n_lora_q, n_embd) attn_q_a; with n_lora_q 0, attn_q in wq */
    const float *q_a_norm;  /* (n_lora_q) */
    struct model_mat wq_b;  /* (n_head*head_dim_qk, n_lora_q) */
    struct model_mat wkv_a; /* (n_lora_kv + n_rot, n_embd) attn_kv_a_mqa: latent, rope key */
    const float *kv_a_norm; /* (n_lora_kv) */
    struct model_mat k_b;   /* per head (n_lora_kv, n_nope), head h at data + h*n_out*row_bytes: a
                               head's nope query into the latent (attn_k_b in place, or
                               attn_kv_b's key rows transposed, F32) */
    struct model_mat v_b;   /* per head (head_dim_vo, n_lora_kv), as k_b: the latent out into a
                               value head (attn_v_b, or attn_kv_b's value rows, F32) */
};

/* model_expert_fn returns the first byte of part of expert (layer, expert): rows of
 * layer.part[part], contiguous, or for part MODEL_PART_BIAS + p (hp.exp_bias) part p's F32 bias.
 * Called from any thread; must not fail for valid arguments. */
typedef const void *(*model_expert_fn)(void *ctx, uint32_t layer, uint32_t expert,
                                       enum model_part part);

struct model {
    struct model_hparams hp;
    struct model_mat token_embd; /* (n_vocab, n_embd) */
    const float *output_norm;    /* (n_embd) */
    struct model_mat output;     /* (n_vocab, n_embd); token_embd itself when tied */
    struct model_layer *layers;  /* n_layer */
    model_expert_fn expert_part; /* the one resolver of expert weights */
    void *expert_ctx;
    const struct gguf_file *gguf; /* borrowed: metadata and tensor infos */
    void *priv_;                  /* model.c's owned storage */
};

/* model_arch_name: "llama", "qwen2moe", ..., "gpt-oss" */
const char *model_arch_name(enum model_arch a);

/* model_load builds the model from f. Errors: STRATA_EUNSUPPORTED for an unsupported architecture,
 * rope scaling or tensor type; STRATA_ENOENT for a missing key or tensor; STRATA_EFORMAT for a
 * mis-shaped tensor or inconsistent keys; the detail names the key or tensor, the value and the
 * expectation. Caller owns *out (model_fini). */
int model_load(const struct gguf_file *f, struct model **out);

struct arena;

/* model_load_arena builds the model from arena a, whose metadata f was parsed by arena_meta
 * (tensor data NULL): it points f's dense tensors at their bytes in the arena's dense region (f
 * is modified), loads as model_load, and resolves experts with arena_blob_at plus each part's
 * offset in the blob. a and f must outlive the model. Errors as model_load, and STRATA_EFORMAT
 * when the arena's tables do not match f (a dense tensor or an expert part missing or of another
 * size or type). */
int model_load_arena(const struct arena *a, struct gguf_file *f, struct model **out);

/* model_fini frees what model_load allocated; NULL is fine. */
void model_fini(struct model *m);

/* model_set_expert_resolver replaces where expert weights are read from (e.g. the arena's blob_at).
 * Parts must keep the types and shapes of m->layers[l].part. Call before any forward pass. */
void model_set_expert_resolver(struct model *m, model_expert_fn fn, void *ctx);

/* model_expert_blob returns the first byte of expert (layer, expert)'s blob in the model's arena
 * (arena_blob_at: m->layers[layer].blob.bytes bytes, parts at blob.part_off), or NULL when the
 * model was loaded from a GGUF file, whose parts lie apart (model_expert_part gives each), or for
 * indices out of range. Any thread. */
const uint8_t *model_expert_blob(const struct model *m, uint32_t layer, uint32_t expert);

/* model_expert_blob_hash: the arena's stored XXH3_64bits of that blob (arena_blob_hash), or 0 when
 * the model has no arena. Any thread. */
uint64_t model_expert_blob_hash(const struct model *m, uint32_t layer, uint32_t expert);

/* model_expert_part: the rows of part of expert (layer, expert), through the resolver. */
static inline const void *model_expert_part(const struct model *m, uint32_t layer, uint32_t expert,
                                            enum model_part part)
{
    return m->expert_part(m->expert_ctx, layer, expert, part);
}

#endif
