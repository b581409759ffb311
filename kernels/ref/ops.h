/* ops — the plain-C reference of every op of the forward pass: RMSNorm, RoPE, softmax, top-k,
 * SwiGLU, the weight matmul and attention over a paged KV cache.
 *
 * These define the numbers: the SIMD and CUDA kernels are tested against them, and bit-exact mode
 * (DESIGN 3.4) rests on their fixed reduction orders. Each output element is reduced in one order
 * whatever the batch: a matmul output is qdot_ref of one weight row with one token's quantized
 * activations (no batch-dependent blocking), attention walks keys in blocks of OPS_ATTN_BLOCK with
 * an online softmax, the same for prefill and decode.
 * Activations: weights are never dequantized for a matmul; activations are quantized with
 * quant_activations (Q8_0 / Q8_K, or kept F32 for float weights) and dotted with qdot_ref, the
 * arithmetic the fast kernels reproduce. Attention, norms and softmax are F32 (sums of squares and
 * softmax denominators in double, as ggml); attention's dot products and value sums are chains of
 * fmaf, dims and keys in order (the CUDA kernels' operations as well).
 * All functions are pure and thread-safe; callers split rows or heads across threads.
 */
#ifndef STRATA_OPS_H
#define STRATA_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OPS_ATTN_BLOCK 32 /* keys per online-softmax step: fixed, so decode and prefill agree */

/* ops_rmsnorm: out = x / sqrt(mean(x^2) + eps) * w over n elements; out may be x. */
void ops_rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps);

/* ops_rope rotates the first n_rot dims of each of n_head heads of head_dim in x (in place) for
 * position pos: adjacent pairs when neox is false, halves (i, i + n_rot/2) when true. The angle of
 * pair i is pos * theta^(-2i/n_rot), built by repeated multiplication as ggml does. */
void ops_rope(float *x, uint32_t n_head, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
              float theta, bool neox);

/* YaRN (llama.cpp's rope with ext_factor): each pair's angle mixes the interpolated angle
 * freq_scale * t and the original t by a ramp over the pair index between corr[0] and corr[1];
 * cos and sin are scaled by mscale. ops_yarn_none is plain RoPE (same bits as ops_rope). */
struct ops_yarn {
    float freq_scale; /* 1 / the context extension factor */
    float ext_factor; /* 0: no ramp (linear scaling), 1: YaRN */
    float mscale;     /* attention factor times 1 + 0.1 ln(1 / freq_scale) under YaRN */
    float corr[2];    /* the pair range of the ramp (ggml_rope_yarn_corr_dims) */
};

/* ops_yarn_init fills y for n_rot rotated dims, a model trained at n_ctx_orig positions with base
 * theta, extended by factor (> 1; 1 gives ops_yarn_none), with llama.cpp's defaults beta_fast 32,
 * beta_slow 1, attention factor 1. */
void ops_yarn_init(struct ops_yarn *y, uint32_t n_rot, uint32_t n_ctx_orig, float theta,
                   float factor);

/* ops_yarn_angle: pair i's cos and sin (times mscale) for the original angle t (ops_rope_yarn's
 * step, shared with the SIMD RoPE). */
void ops_yarn_angle(const struct ops_yarn *y, float t, uint32_t i, float *c, float *s);

/* ops_rope_yarn is ops_rope with YaRN's angle mix and magnitude scale (ggml's rope_yarn, per pair
 * i: theta_extrap = pos * theta^(-2i/n_rot) built by repeated multiplication). */
void ops_rope_yarn(float *x, uint32_t n_head, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
                   float theta, bool neox, const struct ops_yarn *y);

/* ops_softmax: x = exp(x - max) / sum, in place. */
void ops_softmax(float *x, uint32_t n);

/* ops_topk writes the indices of the k largest of x[0..n) to idx, largest first; ties go to the
 * lower index, so the choice is a pure function of x. */
void ops_topk(const float *x, uint32_t n, uint32_t k, uint32_t *idx);

/* ops_argmax: the first index of x[0..n)'s largest value, as a scan keeping the first strictly
 * greater one gives it: NaNs never win (0 when x[0] is one), and +0 and -0 tie. 0 for n = 0. */
uint32_t ops_argmax(const float *x, uint32_t n);

/* ops_silu: x * sigmoid(x). */
float ops_silu(float x);

/* ops_swiglu: out[i] = silu(gate[i]) * up[i]; out may alias gate or up. */
void ops_swiglu(float *out, const float *gate, const float *up, uint32_t n);

/* ops_swiglu_oai: gpt-oss's clamped SwiGLU (ggml's swiglu_oai): with g = min(gate, limit) and
 * u = clamp(up, -limit, limit), out = g * sigmoid(alpha * g) * (u + 1). out may alias. */
void ops_swiglu_oai(float *out, const float *gate, const float *up, uint32_t n, float alpha,
                    float limit);

/* ops_quantize_acts quantizes n_tok rows of n_in floats (row t at x + t*x_stride) for a matmul
 * with wtype weights: row t lands at dst + t*act_stride (act_stride >= quant_act_bytes(wtype,
 * n_in)). Returns quant_activations' error. */
int ops_quantize_acts(uint32_t wtype, const float *x, size_t x_stride, uint32_t n_in,
                      uint32_t n_tok, void *dst, size_t act_stride);

/* ops_matmul computes rows [row0, row1) of W . act for n_tok tokens: out[t*out_stride + r] =
 * qdot_ref(wtype, n_in, w + r*row_bytes, acts + t*act_stride). Each element is one dot in one order,
 * independent of n_tok and of how rows are split. */
void ops_matmul(uint32_t wtype, const void *w, uint64_t row_bytes, uint32_t n_in, uint32_t row0,
                uint32_t row1, const void *acts, size_t act_stride, uint32_t n_tok, float *out,
                size_t out_stride);

/* A view of one KV head of one layer of a paged cache: key j's row is at
 * blocks[j / block_tokens] + k_off + (j % block_tokens) * k_stride (floats), values likewise;
 * with k_cols the keys are stored by columns instead, element d of key j at
 * blocks[j / block_tokens] + k_off + d * block_tokens + j % block_tokens (k_stride unused): a
 * block's keys of one head are then one array [head_dim][block_tokens], the transposed keys the
 * SIMD kernels compute scores from (values stay rows).
 * An fp16 view (hblocks set) has the same layout in halves from hblocks' bases; only
 * cpu_attention reads one (its SIMD kernels convert each row as they load it, its fallback widens
 * the view first, ops_kv_widen); the reference functions read float views. */
struct ops_kv_view {
    float *const *blocks;  /* per block of block_tokens positions: its base */
    uint32_t block_tokens; /* positions per cache block */
    size_t k_off, v_off;   /* floats from a block's base to this layer's and head's first K / V */
    size_t k_stride, v_stride; /* floats between consecutive positions */
    uint32_t k_cols;           /* nonzero: K by columns (above), k_stride unused */
    const uint16_t *const *hblocks; /* fp16 view: per block its base (blocks unused) */
    float **wtab; /* fp16 view: room for the widened view's table (one pointer a block) */
    float *conv;  /* fp16 view: room for the widened rows: block_tokens * (head_dim + head_dim_v)
                     floats a block of the keys viewed */
};

/* ops_kv_k_at: where element d of the key in slot `slot` of a block lies, in elements from the
 * block's base (rows or, k_cols, columns). */
static inline size_t ops_kv_k_at(const struct ops_kv_view *v, uint32_t slot, uint32_t d)
{
    return v->k_off +
           (v->k_cols ? (size_t)d * v->block_tokens + slot : (size_t)slot * v->k_stride + d);
}

/* ops_kv_widen turns fp16 view v of keys [0, n_keys) into a float view in place: each block's
 * rows converted (quant_f16_to_f32) into v->conv as blocks of block_tokens K rows of head_dim
 * (by columns for a k_cols view), then V rows of head_dim_v, v->wtab their table. A float view
 * is left as it is. */
void ops_kv_widen(struct ops_kv_view *v, uint32_t n_keys, uint32_t head_dim, uint32_t head_dim_v);

/* ops_attention: out (head_dim_v) = softmax(scale * q . K^T) . V over keys [0, n_keys) of kv, in
 * blocks of OPS_ATTN_BLOCK keys with an online softmax. n_keys >= 1. */
void ops_attention(float *out, const float *q, uint32_t head_dim, uint32_t head_dim_v, float scale,
                   const struct ops_kv_view *kv, uint32_t n_keys);

/* ops_attention_ex is ops_attention over keys [key_lo, n_keys) (a sliding window: key_lo < n_keys)
 * with an attention sink: a logit `sink` (not scaled) that joins the softmax's denominator with
 * no value (gpt-oss; -INFINITY for none). Blocks stay aligned to key 0 so a window's keys are
 * reduced as the full pass reduces them: blocks wholly below key_lo are skipped, the keys below it
 * in the first block weigh 0; the sink comes last, as one more online-softmax step. With key_lo 0
 * and no sink it returns ops_attention's bits. */
void ops_attention_ex(float *out, const float *q, uint32_t head_dim, uint32_t head_dim_v,
                      float scale, const struct ops_kv_view *kv, uint32_t key_lo, uint32_t n_keys,
                      float sink);

/* ops_attention_sink is ops_attention_ex's last step, shared with the SIMD kernels: with the
 * online softmax's running max *m and sum *l and the unnormalized output out (head_dim_v), the
 * sink's update (none for -INFINITY). The caller then scales out by 1 / *l. */
void ops_attention_sink(float *out, uint32_t head_dim_v, float *m, float *l, float sink);

#endif
