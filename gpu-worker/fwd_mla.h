/* fwd_mla — the per-token steps of multi-head latent attention (deepseek2: DeepSeek-V2/V3, Kimi
 * K2, GLM-4.7-Flash) on the CPU, in llama.cpp's absorbed form: the cache holds, per position and
 * layer, the normalized latent (n_lora_kv) and the rotated rope key (n_rot); a query head's nope
 * part is taken into the latent through that head's k_b, so attention is MQA over the cached rows
 * (keys: latent + rope key, values: the latent), and each head's latent output leaves through its
 * v_b. backend_cpu.c runs the projections and the attention; these are the rows in between and the
 * per-head products, as cpu_mm tasks over F32 weights (one row dot per output element, as every
 * matmul: the same bits on every ISA, thread count and batch). Any thread.
 */
#ifndef STRATA_FWD_MLA_H
#define STRATA_FWD_MLA_H

#include "common/arena/model.h"
#include "kernels/cpu/cpu_mm.h"
#include "kernels/ref/ops.h"

/* mla_q_rope: q (n_head * head_dim_qk: per head nope then rope) of one token at pos: its rope
 * parts rotated in place and copied to the end of each head's row of out (n_head * (n_lora_kv +
 * n_rot)), whose first n_lora_kv floats per head mla_absorb_tasks fills. yarn: NULL for none. */
void mla_q_rope(const struct model_hparams *hp, float *q, uint32_t pos, const struct ops_yarn *yarn,
                float *out);

/* mla_kv_row: kv (n_lora_kv + n_rot, from attn_kv_a_mqa) in place: the latent RMS-normalized
 * with kv_a_norm, the rope key rotated for pos: the row the cache stores. */
void mla_kv_row(const struct model_hparams *hp, const struct model_layer *L, float *kv,
                uint32_t pos, const struct ops_yarn *yarn);

/* mla_absorb_tasks: n_head tasks (into tasks) taking n tokens' nope queries (rows of q, as for
 * mla_q_rope) through each head's wk_b into the first n_lora_kv floats of each head's row of out.
 */
void mla_absorb_tasks(const struct model_hparams *hp, const struct model_layer *L, const float *q,
                      uint32_t n, float *out, struct cpu_mm_task *tasks);

/* mla_out_tasks: n_head tasks taking n tokens' attention outputs over the latent (att, rows of
 * n_head * n_lora_kv) through each head's wv_b into out (rows of n_head * head_dim_vo). */
void mla_out_tasks(const struct model_hparams *hp, const struct model_layer *L, const float *att,
                   uint32_t n, float *out, struct cpu_mm_task *tasks);

#endif
