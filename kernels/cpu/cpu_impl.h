/* cpu_impl — what kernels/cpu/cpu.c dispatches to: the per-ISA kernel files' entry points. Not
 * for use outside kernels/cpu. Each entry has exactly the contract of the cpu.h function it backs.
 */
#ifndef STRATA_CPU_IMPL_H
#define STRATA_CPU_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu.h"
#include "kernels/ref/ops.h"
#include "common/quant/quant.h"

/* cpu_att_rows points krow[j] and vrow[j] at the K and V rows of keys j0 + j, j < nb (nb at most
 * OPS_ATTN_BLOCK): a float view's in place; an fp16 view's in place as halves, or with widen
 * converted into kv->conv (nb K rows of head_dim, then nb V rows of head_dim_v: the floats
 * ops_kv_widen gives them). */
static inline void cpu_att_rows(const struct ops_kv_view *kv, uint32_t j0, uint32_t nb,
                                uint32_t head_dim, uint32_t head_dim_v, bool widen,
                                const void **krow, const void **vrow)
{
    for (uint32_t j = 0; j < nb; j++) {
        const uint32_t key = j0 + j, slot = key % kv->block_tokens;
        if (!kv->hblocks) {
            const float *base = kv->blocks[key / kv->block_tokens];
            krow[j] = base + kv->k_off + slot * kv->k_stride;
            vrow[j] = base + kv->v_off + slot * kv->v_stride;
            continue;
        }
        const uint16_t *base = kv->hblocks[key / kv->block_tokens];
        const uint16_t *kh = base + kv->k_off + slot * kv->k_stride,
                       *vh = base + kv->v_off + slot * kv->v_stride;
        if (!widen) {
            krow[j] = kh;
            vrow[j] = vh;
            continue;
        }
        float *kd = kv->conv + (size_t)j * head_dim,
              *vd = kv->conv + (size_t)nb * head_dim + (size_t)j * head_dim_v;
        quant_f16_to_f32_rows(kh, kd, head_dim);
        quant_f16_to_f32_rows(vh, vd, head_dim_v);
        krow[j] = kd;
        vrow[j] = vd;
    }
}

/* cpu_att_prefetch asks for the K and V rows of the block of keys at j0 (when there is one), so
 * they come from memory while this block computes: decode reads the whole cache per token. */
static inline void cpu_att_prefetch(const struct ops_kv_view *kv, uint32_t j0, uint32_t n_keys,
                                    uint32_t head_dim, uint32_t head_dim_v)
{
    const size_t el = kv->hblocks ? 2 : 4;
    for (uint32_t key = j0; key < n_keys && key < j0 + OPS_ATTN_BLOCK; key++) {
        const uint32_t b = key / kv->block_tokens, slot = key % kv->block_tokens;
        const char *base = kv->hblocks ? (const char *)kv->hblocks[b] : (const char *)kv->blocks[b];
        const char *k = base + (kv->k_off + slot * kv->k_stride) * el;
        const char *v = base + (kv->v_off + slot * kv->v_stride) * el;
        for (size_t o = 0; o < head_dim * el; o += 64)
            __builtin_prefetch(k + o, 0, 2);
        for (size_t o = 0; o < head_dim_v * el; o += 64)
            __builtin_prefetch(v + o, 0, 2);
    }
}

/* cpu_rows_fn computes cpu_matmul for one weight type. */
typedef void (*cpu_rows_fn)(const void *w, uint64_t row_bytes, uint32_t n_in, uint32_t row0,
                            uint32_t row1, const void *acts, size_t act_stride, uint32_t n_tok,
                            float *out, size_t out_stride);

/* cpu_rows_avx2 / cpu_rows_avx512: the matmul kernel of wtype for that ISA (qdot_avx2.c,
 * qdot_avx512.c, both built from qdot_body.inc); NULL for a type they do not cover. */
cpu_rows_fn cpu_rows_avx2(uint32_t wtype);
cpu_rows_fn cpu_rows_avx512(uint32_t wtype);

/* vec_avx2.c: AVX2 versions of the F32 ops; RMSNorm and RoPE also serve CPU_AVX512 (they are
 * bound by a fixed-order double sum and by libm's sinf/cosf, where wider vectors buy nothing). */
void cpu_rmsnorm_avx2(float *out, const float *x, const float *w, uint32_t n, float eps);
void cpu_rope_avx2(float *x, uint32_t n_head, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
                   float theta, bool neox, const struct ops_yarn *yarn);
void cpu_attention_avx2(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v,
                        float scale, const struct ops_kv_view *kv, int vexp);

/* vec_avx512.c: attention on 16 lanes and activation quantization, for CPU_AVX512. */
int cpu_quantize_acts_avx512(uint32_t wtype, const float *x, size_t x_stride, uint32_t n_in,
                             uint32_t n_tok, void *dst, size_t act_stride);
void cpu_attention_avx512(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v,
                          float scale, const struct ops_kv_view *kv, int vexp);

/* cpu_expf_avx512: y[i] = expf(x[i]) computed 16 at a time the way glibc's expf does (y may be
 * x); vexp above says whether attention uses it. Equal to libm only where cpu_vexp_ok() says. */
void cpu_expf_avx512(const float *x, float *y, uint32_t n);

/* cpu_vexp_ok: whether cpu_expf_avx512 matched libm's expf on every input of a sweep across
 * the main path and its edges (checked once). */
int cpu_vexp_ok(void);

/* cpu_expf_avx2 / cpu_vexp2_ok: the same on 4 double lanes (vec_avx2.c), for CPU_AVX2. */
void cpu_expf_avx2(const float *x, float *y, uint32_t n);
int cpu_vexp2_ok(void);

/* cpu_exp_tab: 2^(i/32), i < 32, as double bits (glibc's expf table) */
extern const uint64_t cpu_exp_tab[32];

#endif
