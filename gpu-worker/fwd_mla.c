#include "gpu-worker/fwd_mla.h"
#include "common/quant/qtype.h"
#include "kernels/cpu/cpu.h"

#include <string.h>

/* rope_rows rotates n rows of n_rot dims, row r at x + r*stride, for pos. */
static void rope_rows(const struct model_hparams *hp, float *x, uint32_t n, uint32_t stride,
                      uint32_t pos, const struct ops_yarn *yarn)
{
    const bool neox = hp->rope == MODEL_ROPE_NEOX;
    if (yarn)
        cpu_rope_yarn(x, n, stride, hp->n_rot, pos, hp->rope_theta, neox, yarn);
    else
        cpu_rope(x, n, stride, hp->n_rot, pos, hp->rope_theta, neox);
}

void mla_q_rope(const struct model_hparams *hp, float *q, uint32_t pos, const struct ops_yarn *yarn,
                float *out)
{
    const uint32_t R = hp->n_lora_kv, rot = hp->n_rot, qk = hp->head_dim_qk, nope = qk - rot;
    rope_rows(hp, q + nope, hp->n_head, qk, pos, yarn);
    for (uint32_t h = 0; h < hp->n_head; h++)
        memcpy(out + (size_t)h * (R + rot) + R, q + (size_t)h * qk + nope, rot * sizeof *q);
}

void mla_kv_row(const struct model_hparams *hp, const struct model_layer *L, float *kv,
                uint32_t pos, const struct ops_yarn *yarn)
{
    cpu_rmsnorm(kv, kv, L->kv_a_norm, hp->n_lora_kv, hp->rms_eps);
    rope_rows(hp, kv + hp->n_lora_kv, 1, hp->n_rot, pos, yarn);
}

/* F32 activations are the floats themselves (quant_act_type): a task reads its rows in place. */
void mla_absorb_tasks(const struct model_hparams *hp, const struct model_layer *L, const float *q,
                      uint32_t n, float *out, struct cpu_mm_task *tasks)
{
    const uint32_t H = hp->n_head, R = hp->n_lora_kv, qk = hp->head_dim_qk, nope = qk - hp->n_rot,
                   row = R + hp->n_rot;
    for (uint32_t h = 0; h < H; h++)
        tasks[h] = (struct cpu_mm_task){QT_F32,
                                        nope,
                                        R,
                                        (uint64_t)nope * sizeof(float),
                                        L->wk_b + (size_t)h * R * nope,
                                        q + (size_t)h * qk,
                                        (size_t)H * qk * sizeof(float),
                                        n,
                                        out + (size_t)h * row,
                                        (size_t)H * row};
}

void mla_out_tasks(const struct model_hparams *hp, const struct model_layer *L, const float *att,
                   uint32_t n, float *out, struct cpu_mm_task *tasks)
{
    const uint32_t H = hp->n_head, R = hp->n_lora_kv, V = hp->head_dim_vo;
    for (uint32_t h = 0; h < H; h++)
        tasks[h] = (struct cpu_mm_task){QT_F32,
                                        R,
                                        V,
                                        (uint64_t)R * sizeof(float),
                                        L->wv_b + (size_t)h * V * R,
                                        att + (size_t)h * R,
                                        (size_t)H * R * sizeof(float),
                                        n,
                                        out + (size_t)h * V,
                                        (size_t)H * V};
}
