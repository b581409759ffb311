/* cpu_impl — what kernels/cpu/cpu.c dispatches to: the per-ISA kernel files' entry points. Not
 * for use outside kernels/cpu. Each entry has exactly the contract of the cpu.h function it backs.
 */
#ifndef STRATA_CPU_IMPL_H
#define STRATA_CPU_IMPL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu.h"
#include "kernels/ref/ops.h"
#include "common/quant/quant.h"

/* cpu_att_rows points krow[j] and vrow[j] at the K and V rows of keys j0 + j, j < nb, in place:
 * floats of a float view, halves of an fp16 view (the kernels convert them as they load them).
 * In a k_cols view krow[j] is the key's element 0, element d lying d * block_tokens further. */
static inline void cpu_att_rows(const struct ops_kv_view *kv, uint32_t j0, uint32_t nb,
                                const void **krow, const void **vrow)
{
    uint32_t b = j0 / kv->block_tokens, slot = j0 % kv->block_tokens; /* one division, not nb */
    for (uint32_t j = 0; j < nb; j++, slot++) {
        if (slot == kv->block_tokens) b++, slot = 0;
        const size_t ko = ops_kv_k_at(kv, slot, 0), vo = kv->v_off + slot * kv->v_stride;
        if (kv->hblocks) {
            krow[j] = kv->hblocks[b] + ko;
            vrow[j] = kv->hblocks[b] + vo;
        } else {
            krow[j] = kv->blocks[b] + ko;
            vrow[j] = kv->blocks[b] + vo;
        }
    }
}

/* cpu_att_ld1: element d of a row of floats or, h16, of halves, as a float (the kernels' tails) */
static inline __attribute__((always_inline)) float cpu_att_ld1(const void *row, uint32_t d,
                                                               bool h16)
{
    return h16 ? quant_f16_to_f32(((const uint16_t *)row)[d]) : ((const float *)row)[d];
}

/* cpu_att_col_keys fills kt[d][j] = k_j[d] for lanes j in [j_lo, j_hi) from a k_cols view's
 * keys (krow as cpu_att_rows points them, bt the view's block_tokens), one key at a time: the
 * kernels' way for a lane group of keys split across cache blocks. Lanes at or past nb repeat the
 * last key (computed, never read). */
static inline void cpu_att_col_keys(const void *const *krow, uint32_t j_lo, uint32_t j_hi,
                                    uint32_t nb, uint32_t head_dim, uint32_t bt,
                                    float (*kt)[OPS_ATTN_BLOCK], bool h16)
{
    for (uint32_t j = j_lo; j < j_hi; j++) {
        const void *k = krow[j < nb ? j : nb - 1];
        for (uint32_t d = 0; d < head_dim; d++)
            kt[d][j] = cpu_att_ld1(k, d * bt, h16);
    }
}

/* cpu_att_sums: sum[q] += p[q][j] for j < nb[q] in key order (ops_attention's sum), four
 * queries at a time in registers so that their chains of dependent adds run side by side. */
static inline void cpu_att_sums(uint32_t nq, float *sum, const float (*p)[OPS_ATTN_BLOCK],
                                const uint32_t *nb)
{
    uint32_t q0 = 0;
    for (; q0 + 4 <= nq; q0 += 4) {
        float a0 = sum[q0], a1 = sum[q0 + 1], a2 = sum[q0 + 2], a3 = sum[q0 + 3];
        uint32_t n = nb[q0];
        for (uint32_t q = q0 + 1; q < q0 + 4; q++)
            n = nb[q] < n ? nb[q] : n;
        uint32_t j = 0;
        for (; j < n; j++) {
            a0 += p[q0][j];
            a1 += p[q0 + 1][j];
            a2 += p[q0 + 2][j];
            a3 += p[q0 + 3][j];
        }
        for (uint32_t k = j; k < nb[q0]; k++)
            a0 += p[q0][k];
        for (uint32_t k = j; k < nb[q0 + 1]; k++)
            a1 += p[q0 + 1][k];
        for (uint32_t k = j; k < nb[q0 + 2]; k++)
            a2 += p[q0 + 2][k];
        for (uint32_t k = j; k < nb[q0 + 3]; k++)
            a3 += p[q0 + 3][k];
        sum[q0] = a0, sum[q0 + 1] = a1, sum[q0 + 2] = a2, sum[q0 + 3] = a3;
    }
    for (; q0 < nq; q0++) {
        float a0 = sum[q0];
        for (uint32_t j = 0; j < nb[q0]; j++)
            a0 += p[q0][j];
        sum[q0] = a0;
    }
}

/* cpu_att_in_place: whether a call of nq queries takes its scores from a k_cols view's blocks
 * in place rather than from a transposed copy: one pass of <= 4 queries (a decode step's group)
 * over each block, and blocks that hold whole key blocks (the default, BACKEND_KV_BLOCK). */
static inline bool cpu_att_in_place(const struct ops_kv_view *kv, uint32_t nq)
{
    return nq <= 4 && kv->k_cols && kv->block_tokens % OPS_ATTN_BLOCK == 0;
}

/* cpu_expf_libm_lanes: the vector expfs' lanes outside glibc's main path (|x| >= 88, inf, NaN):
 * y[j] = expf(in[j]) for each bit j of odd (in a copy of the inputs, as y may be them). */
static inline void cpu_expf_libm_lanes(float *y, const float *in, unsigned odd)
{
    while (odd) {
        const int j = __builtin_ctz(odd);
        y[j] = expf(in[j]);
        odd &= odd - 1;
    }
}

/* CPU_ATT_AHEAD: blocks ahead a decode step's in-place scores and values prefetch the cache: one
 * line at a time, spread over the block's work (the K columns in the scores' loop over dims, the
 * V rows in the values' loop over keys), into L2. A prefetch of the whole next block at its
 * start, as prompts do, left one thread streaming the cache at 8 GB/s (fp16, 4K keys, 32 heads,
 * Zen 4: 1.03 us a block of 32 keys and 4 queries; spread, 2 blocks ahead: 0.72-0.77). */
#define CPU_ATT_AHEAD 2

/* cpu_att_ahead: for the block at j0, where the block CPU_ATT_AHEAD further starts (its K
 * columns at *pk, its V rows at *pv, pv_step bytes apart) when there is a whole one and the
 * kernels prefetch in their loops (`loops`: in place, and the query groups and value widths
 * whose kernels take pk and pv); false otherwise (the caller prefetches the next block at once
 * with cpu_att_prefetch). */
static inline bool cpu_att_ahead(const struct ops_kv_view *kv, uint32_t j0, uint32_t n_keys,
                                 bool loops, const char **pk, const char **pv, size_t *pv_step)
{
    const uint32_t jn = j0 + CPU_ATT_AHEAD * OPS_ATTN_BLOCK;
    if (!loops || jn + OPS_ATTN_BLOCK > n_keys) return false;
    const void *k, *v;
    cpu_att_rows(kv, jn, 1, &k, &v);
    *pk = k;
    *pv = v;
    *pv_step = kv->v_stride * (kv->hblocks ? 2 : 4);
    return true;
}

/* cpu_att_prefetch asks for the K and V rows of the block of keys at j0 (when there is one), so
 * they come from memory while this block computes: decode reads the whole cache per token. */
static inline void cpu_att_prefetch(const struct ops_kv_view *kv, uint32_t j0, uint32_t n_keys,
                                    uint32_t head_dim, uint32_t head_dim_v)
{
    const size_t el = kv->hblocks ? 2 : 4;
    const uint32_t bt = kv->block_tokens;
    for (uint32_t key = j0; key < n_keys && key < j0 + OPS_ATTN_BLOCK; key++) {
        const uint32_t b = key / bt, slot = key % bt;
        const char *base = kv->hblocks ? (const char *)kv->hblocks[b] : (const char *)kv->blocks[b];
        const char *k = base + ops_kv_k_at(kv, slot, 0) * el;
        const char *v = base + (kv->v_off + slot * kv->v_stride) * el;
        if (!kv->k_cols)
            for (size_t o = 0; o < head_dim * el; o += 64)
                __builtin_prefetch(k + o, 0, 2);
        else if (key == j0 || slot == 0) {
            /* the block's keys from here on, a run of each of its column rows */
            uint32_t n = bt - slot;
            if (n > j0 + OPS_ATTN_BLOCK - key) n = j0 + OPS_ATTN_BLOCK - key;
            for (uint32_t d = 0; d < head_dim; d++)
                for (size_t o = 0; o < n * el; o += 64)
                    __builtin_prefetch(k + (size_t)d * bt * el + o, 0, 2);
        }
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
