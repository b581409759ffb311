#include "gpu-worker/fwd_mla.h"
#include "kernels/cpu/cpu.h"

/* rope_rows rotates n rows of n_rot dims, row r at x + r*stride, for pos (NORM pairs). */
static void rope_rows(const struct model_hparams *hp, float *x, uint32_t n, uint32_t stride,
                      uint32_t pos, const struct ops_yarn *yarn)
{
    const bool neox = hp->rope == MODEL_ROPE_NEOX;
    if (yarn)
        cpu_rope_yarn(x, n, stride, hp->n_rot, pos, hp->rope_theta, neox, yarn);
    else
        cpu_rope(x, n, stride, hp->n_rot, pos, hp->rope_theta, neox);
}

void mla_q_row(const struct model_hparams *hp, const struct model_layer *L, float *q, uint32_t pos,
               const struct ops_yarn *yarn, float *out)
{
    const uint32_t H = hp->n_head, R = hp->n_lora_kv, rot = hp->n_rot, qk = hp->head_dim_qk,
                   nope = qk - rot, row = R + rot;
    rope_rows(hp, q + nope, H, qk, pos, yarn);
    for (uint32_t h = 0; h < H; h++) {
        const float *qn = q + (size_t)h * qk, *kb = L->wk_b + (size_t)h * R * nope;
        float *o = out + (size_t)h * row;
        for (uint32_t c = 0; c < R; c++) {
            const float *w = kb + (size_t)c * nope;
            float s = 0.0f;
            for (uint32_t d = 0; d < nope; d++)
                s += w[d] * qn[d];
            o[c] = s;
        }
        for (uint32_t d = 0; d < rot; d++)
            o[R + d] = qn[nope + d];
    }
}

void mla_kv_row(const struct model_hparams *hp, const struct model_layer *L, float *kv,
                uint32_t pos, const struct ops_yarn *yarn)
{
    cpu_rmsnorm(kv, kv, L->kv_a_norm, hp->n_lora_kv, hp->rms_eps);
    rope_rows(hp, kv + hp->n_lora_kv, 1, hp->n_rot, pos, yarn);
}

void mla_out_row(const struct model_hparams *hp, const struct model_layer *L, const float *att,
                 float *out)
{
    const uint32_t H = hp->n_head, R = hp->n_lora_kv, V = hp->head_dim_vo;
    for (uint32_t h = 0; h < H; h++) {
        const float *a = att + (size_t)h * R, *vb = L->wv_b + (size_t)h * V * R;
        for (uint32_t j = 0; j < V; j++) {
            const float *w = vb + (size_t)j * R;
            float s = 0.0f;
            for (uint32_t c = 0; c < R; c++)
                s += w[c] * a[c];
            out[(size_t)h * V + j] = s;
        }
    }
}
