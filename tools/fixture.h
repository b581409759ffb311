/* fixture — GGUF MoE models with random weights and the real tensor names, shapes and metadata of
 * llama.cpp's qwen3moe, llama (Mixtral), olmoe, qwen2moe, gpt-oss, glm4moe and deepseek2 files, for
 * tests and benchmarks.
 *
 * A fixture is a pure function of its options: the bytes depend on (seed, tensor name, element)
 * through a counter-based RNG (splitmix64), so the thread count and chunking never change them.
 * Small shapes generate floats and quantize them with quant_quantize (a model test can trust the
 * numbers); large shapes write random quantized blocks whose fp16 scales are finite and chosen so
 * the weights have the same spread, at disk speed (FIXTURE_BLOCKS).
 * Scales are set so a random forward pass stays well-conditioned: residual-path outputs are scaled
 * by 1/sqrt(2 n_layer) (GPT-2 init) and logits have a spread of ~10-16, so the top two logits of a
 * greedy step are rarely closer than 0.05.
 * fixture_write() streams through the GGUF writer (common/gguf/gguf.h): memory stays at a few
 * chunks of FIXTURE_CHUNK_BYTES per thread. It may be called from any thread; it keeps no global
 * state.
 */
#ifndef STRATA_FIXTURE_H
#define STRATA_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#define FIXTURE_CHUNK_BYTES (8u << 20) /* output bytes a worker generates at once */

enum fixture_mode {
    FIXTURE_AUTO = 0, /* FLOAT for tiny, BLOCKS for qwen3-mini and larger */
    FIXTURE_FLOAT,    /* floats quantized with quant_quantize: real data for model tests */
    FIXTURE_BLOCKS,   /* random quantized blocks with bounded fp16 scales: disk speed */
};

/* Options; a zeroed struct is the default: qwen3moe, tiny, q4_k_m, seed 0, uniform routing. */
struct fixture_opts {
    const char *arch;  /* "qwen3moe" (NULL), "llama", "olmoe", "qwen2moe", "gpt-oss", "glm4moe",
                          "deepseek2" */
    const char *shape; /* "tiny" (NULL), "qwen3-mini", "qwen3-30b-a3b", "gpt-oss-mini",
                          "gpt-oss-20b", "gpt-oss-120b", "glm4-mini", "glm4.5-air", "glm4.5",
                          "ds-mini", "deepseek-v3", "kimi-k2", "glm4.7-flash" */
    const char *type;  /* "q4_k_m" (NULL: llama.cpp's Q4_K_M mix), "mxfp4_moe" (llama.cpp's
                          MXFP4_MOE: expert tensors MXFP4, other matrices Q8_0) or a computable
                          type name, e.g. "f32", "q8_0", "q4_k": every weight matrix in it */
    uint64_t seed;
    double zipf;       /* 0: uniform routing; S > 0: expert popularity per layer ~ rank^-S */
    const char *vocab; /* a GGUF whose tokenizer.* keys are copied; NULL: the built-in BPE */
    bool old_layout;   /* llama: one 2-D tensor per expert, blk.N.ffn_gate.E.weight; deepseek2:
                          attn_kv_b (older converters) instead of attn_k_b and attn_v_b */
    bool tied;         /* no output.weight (llama, qwen3moe): logits use token_embd */
    bool no_bias;      /* qwen2moe only: no attn_q/k/v.bias (llama.cpp loads such files too) */
    enum fixture_mode mode;
    int threads; /* generator threads; 0: one per CPU, at most 8 */
};

/* The hyperparameters a fixture gets from (arch, shape). */
struct fixture_hparams {
    uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim;
    uint32_t n_expert, n_expert_used;
    uint32_t n_ff;       /* feed_forward_length as written (llama, olmoe: the expert width) */
    uint32_t n_ff_exp;   /* expert hidden width */
    uint32_t n_ff_shexp; /* shared expert hidden width (qwen2moe), else 0 */
    uint32_t n_vocab;    /* rows of token_embd with the built-in vocabulary */
    uint32_t n_ctx;
    float rms_eps, rope_base;
    /* glm4moe (0 / false elsewhere): */
    uint32_t n_rot;           /* rotated dims per head (partial rotary); 0: the whole head */
    uint32_t n_dense_lead;    /* leading dense layers, their FFN n_ff wide */
    uint32_t n_nextn;         /* MTP layers written after the n_layer trunk layers */
    uint32_t n_expert_shared; /* shared experts, n_ff_exp wide each (n_ff_shexp = their sum) */
    float exp_scale;          /* expert_weights_scale */
    bool qk_norm;             /* per-head q/k norms (GLM-4.5; Air has none) */
    /* deepseek2 (MLA; 0 elsewhere): head_dim is a query head's nope + rope (n_rot) dims */
    uint32_t n_lora_q, n_lora_kv;   /* q and kv LoRA ranks (n_lora_q 0: one q projection) */
    uint32_t head_dim_v;            /* a value head */
    uint32_t n_group, n_group_used; /* expert groups and those kept (group-limited top-k) */
    float yarn_factor;              /* YaRN: factor (0: none), trained context, log multiplier */
    uint32_t yarn_orig_ctx;
    float yarn_log_mul;
};

/* fixture_hparams resolves (arch, shape) (NULL: the defaults). STRATA_EINVAL names the unknown
 * value and lists the known ones. */
int fixture_hparams(const char *arch, const char *shape, struct fixture_hparams *out);

/* fixture_write writes the fixture o describes to path (atomically: path.tmp, then renamed).
 * Blocks until done. STRATA_EINVAL for bad options (detail says which), STRATA_EIO / errno codes
 * from writing, the gguf reader's codes for a bad --vocab file. */
int fixture_write(const struct fixture_opts *o, const char *path);

#endif
