#include "gpu-worker/fwd_mla.h"
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

void mla_head_tasks(const struct model_mat *w, uint32_t n_head, const void *acts, size_t act_bytes,
                    uint32_t n, float *out, size_t out_tok, size_t out_head,
                    struct cpu_mm_task *tasks)
{
    for (uint32_t h = 0; h < n_head; h++)
        tasks[h] =
            (struct cpu_mm_task){w->type,
                                 w->n_in,
                                 w->n_out,
                                 w->row_bytes,
                                 (const uint8_t *)w->data + (uint64_t)h * w->n_out * w->row_bytes,
                                 (const uint8_t *)acts + h * act_bytes,
                                 n_head * act_bytes,
                                 n,
                                 out + h * out_head,
                                 out_tok};
}
