/* fwd_mla — the per-token steps of multi-head latent attention (deepseek2: DeepSeek-V2/V3, Kimi
 * K2, GLM-4.7-Flash) on the CPU, in llama.cpp's absorbed form: the cache holds, per position and
 * layer, the normalized latent (n_lora_kv) and the rotated rope key (n_rot); a query head's nope
 * part is taken into the latent through that head's k_b, so attention is MQA over the cached rows
 * (keys: latent + rope key, values: the latent), and each head's latent output leaves through its
 * v_b. backend_cpu.c runs the projections and the attention; these are the rows in between and the
 * per-head products, as cpu_mm tasks over k_b and v_b in their file's type (one row dot per output
 * element, as every matmul: the same bits on every ISA, thread count and batch). Any thread.
 */
#ifndef STRATA_FWD_MLA_H
#define STRATA_FWD_MLA_H

#include "common/arena/model.h"
#include "kernels/cpu/cpu.h"
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

/* mla_head_tasks: n_head tasks (into tasks), head h's matrix of w (per-head matrices, head h at
 * w->data + h * n_out * row_bytes: k_b or v_b) times n tokens' inputs for it, the activations of
 * token t's head h at acts + (t * n_head + h) * act_bytes (cpu_quantize_acts for w->type; for F32
 * the floats themselves), into out + t * out_tok + h * out_head. */
void mla_head_tasks(const struct model_mat *w, uint32_t n_head, const void *acts, size_t act_bytes,
                    uint32_t n, float *out, size_t out_tok, size_t out_head,
                    struct cpu_mm_task *tasks);

#endif
