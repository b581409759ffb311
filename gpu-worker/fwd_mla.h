/* fwd_mla — the per-token steps of multi-head latent attention (deepseek2: DeepSeek-V2/V3, Kimi
 * K2, GLM-4.7-Flash) on the CPU, in llama.cpp's absorbed form: the cache holds, per position and
 * layer, the normalized latent (n_lora_kv) and the rotated rope key (n_rot); a query head's nope
 * part is taken into the latent through that head's k_b, so attention is MQA over the cached rows
 * (keys: latent + rope key, values: the latent), and each head's latent output leaves through its
 * v_b. backend_cpu.c runs the projections and the attention; these are the rows in between.
 * Pure functions of their inputs (index-order sums, the kernels/cpu RoPE and RMSNorm): the same
 * bits on every ISA, thread count and batch. Any thread.
 */
#ifndef STRATA_FWD_MLA_H
#define STRATA_FWD_MLA_H

#include "common/arena/model.h"
#include "kernels/ref/ops.h"

/* mla_q_row: q (n_head * head_dim_qk: per head nope then rope) of one token at pos becomes
 * out (n_head * (n_lora_kv + n_rot): per head wk_b . nope, then the rotated rope part). q's rope
 * parts are rotated in place. yarn: the RoPE's YaRN terms (NULL: none). */
void mla_q_row(const struct model_hparams *hp, const struct model_layer *L, float *q, uint32_t pos,
               const struct ops_yarn *yarn, float *out);

/* mla_kv_row: kv (n_lora_kv + n_rot, from attn_kv_a_mqa) in place: the latent RMS-normalized
 * with kv_a_norm, the rope key rotated for pos: the row the cache stores. */
void mla_kv_row(const struct model_hparams *hp, const struct model_layer *L, float *kv,
                uint32_t pos, const struct ops_yarn *yarn);

/* mla_out_row: att (n_head * n_lora_kv, each head's attention over the latent) into out
 * (n_head * head_dim_vo) through each head's wv_b: attn_output's input. */
void mla_out_row(const struct model_hparams *hp, const struct model_layer *L, const float *att,
                 float *out);

#endif
