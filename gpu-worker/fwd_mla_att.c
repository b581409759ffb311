/* fwd_mla_att — MLA's attention on AVX2: MQA over the cached rows of n_lora_kv + n_rot floats
 * (576 for DeepSeek-V3), wider than kernels/cpu's attention takes (CPU_ATT_MAXD), which would run
 * the scalar reference for them. The same method as that kernel (a block of 32 keys transposed
 * once for all the queries that share it, 8 keys per lane vector, each lane summing its key's dims
 * in index order with a multiply then an add, the values 8 dims per lane) and ops_attention's
 * online softmax step for step: the bits of ops_attention. No windows, no sinks (MLA has none).
 * STRATA_CPU=ref (cpu_isa() CPU_REF) or a CPU without AVX2 takes cpu_attention instead.
 */
#include "gpu-worker/fwd_mla.h"
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <string.h>

#define KB OPS_ATTN_BLOCK /* keys per block: 4 lane vectors of 8 */

#if defined(__x86_64__)
#include <immintrin.h>

/* avx2 without fma: no multiply-add can be contracted into an FMA the reference does not do */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif

/* transpose8: rows r[0..7] (8 floats each) -> columns. */
static inline void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* transpose_block: kt[d][j] = k_j[d] for the block's keys (lanes past nb repeat the last key:
 * computed, never read). */
static void transpose_block(const float *const *krow, uint32_t nb, uint32_t head_dim,
                            float (*kt)[KB])
{
    const float *k[KB];
    for (uint32_t j = 0; j < KB; j++)
        k[j] = krow[j < nb ? j : nb - 1];
    for (uint32_t g = 0; g < (nb + 7) / 8; g++) {
        uint32_t d = 0;
        for (; d + 8 <= head_dim; d += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++)
                r[j] = _mm256_loadu_ps(k[8 * g + j] + d);
            transpose8(r);
            for (int c = 0; c < 8; c++)
                _mm256_store_ps(&kt[d + c][8 * g], r[c]);
        }
        for (; d < head_dim; d++)
            for (int j = 0; j < 8; j++)
                kt[d][8 * g + j] = k[8 * g + j][d];
    }
}

/* scores: s[j] = (sum_d q[d] * k_j[d], d in order) * scale, ng lane vectors side by side. */
static void scores(const float *q, const float (*kt)[KB], uint32_t head_dim, uint32_t ng,
                   float scale, float *s)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (uint32_t d = 0; d < head_dim; d++) {
        const __m256 qv = _mm256_set1_ps(q[d]);
        a0 = _mm256_add_ps(a0, _mm256_mul_ps(qv, _mm256_load_ps(&kt[d][0])));
        if (ng > 1) a1 = _mm256_add_ps(a1, _mm256_mul_ps(qv, _mm256_load_ps(&kt[d][8])));
        if (ng > 2) a2 = _mm256_add_ps(a2, _mm256_mul_ps(qv, _mm256_load_ps(&kt[d][16])));
        if (ng > 3) a3 = _mm256_add_ps(a3, _mm256_mul_ps(qv, _mm256_load_ps(&kt[d][24])));
    }
    const __m256 sv = _mm256_set1_ps(scale);
    _mm256_store_ps(s, _mm256_mul_ps(a0, sv));
    _mm256_store_ps(s + 8, _mm256_mul_ps(a1, sv));
    _mm256_store_ps(s + 16, _mm256_mul_ps(a2, sv));
    _mm256_store_ps(s + 24, _mm256_mul_ps(a3, sv));
}

/* values: o = o * c, then o += p_j * v_j for j < nb in order, 8 dims a lane vector. */
static void values(float *o, float c, const float *p, const float *const *vrow, uint32_t nb,
                   uint32_t head_dim_v)
{
    const __m256 cv = _mm256_set1_ps(c);
    uint32_t d = 0;
    for (; d + 8 <= head_dim_v; d += 8) {
        __m256 o0 = _mm256_mul_ps(_mm256_loadu_ps(o + d), cv);
        for (uint32_t j = 0; j < nb; j++)
            o0 = _mm256_add_ps(o0,
                               _mm256_mul_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(vrow[j] + d)));
        _mm256_storeu_ps(o + d, o0);
    }
    for (; d < head_dim_v; d++) {
        float x = o[d] * c;
        for (uint32_t j = 0; j < nb; j++)
            x += p[j] * vrow[j][d];
        o[d] = x;
    }
}

static void attention_avx2(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v,
                           float scale, const struct ops_kv_view *kv)
{
    _Alignas(32) float kt[MLA_ATT_MAXD][KB]; /* 128 KiB of the stack (threads get 8 MiB) */
    _Alignas(32) float s[KB], p[KB];
    const float *krow[KB], *vrow[KB];
    float m[CPU_ATT_MAXQ], l[CPU_ATT_MAXQ];
    const uint32_t nq = a->n_tok * a->n_head, max_keys = a->n_keys0 + a->n_tok - 1;
    for (uint32_t i = 0; i < nq; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        memset(a->out + (i / a->n_head) * a->out_tok + (i % a->n_head) * a->out_head, 0,
               head_dim_v * sizeof(float));
    }
    for (uint32_t j0 = 0; j0 < max_keys; j0 += KB) {
        const uint32_t nbmax = max_keys - j0 < KB ? max_keys - j0 : KB;
        for (uint32_t j = 0; j < nbmax; j++) {
            const uint32_t key = j0 + j;
            const float *base = kv->blocks[key / kv->block_tokens];
            const uint32_t slot = key % kv->block_tokens;
            krow[j] = base + kv->k_off + slot * kv->k_stride;
            vrow[j] = base + kv->v_off + slot * kv->v_stride;
        }
        transpose_block(krow, nbmax, head_dim, kt);
        for (uint32_t i = 0; i < nq; i++) {
            const uint32_t t = i / a->n_head, h = i % a->n_head, n_keys = a->n_keys0 + t;
            if (n_keys <= j0) continue;
            const uint32_t nb = n_keys - j0 < KB ? n_keys - j0 : KB;
            float *o = a->out + t * a->out_tok + h * a->out_head;
            scores(a->q + t * a->q_tok + h * a->q_head, (const float(*)[KB])kt, head_dim,
                   (nb + 7) / 8, scale, s);
            /* ops_attention's online softmax, step for step */
            float bm = -INFINITY;
            for (uint32_t j = 0; j < nb; j++)
                bm = s[j] > bm ? s[j] : bm;
            const float mn = bm > m[i] ? bm : m[i];
            const float c = expf(m[i] - mn); /* 0 on the first block, where m is -inf */
            l[i] *= c;
            for (uint32_t j = 0; j < nb; j++) {
                p[j] = expf(s[j] - mn);
                l[i] += p[j];
            }
            values(o, c, p, vrow, nb, head_dim_v);
            m[i] = mn;
        }
    }
    for (uint32_t i = 0; i < nq; i++) {
        float *o = a->out + (i / a->n_head) * a->out_tok + (i % a->n_head) * a->out_head;
        const float inv = 1.0f / l[i];
        for (uint32_t d = 0; d < head_dim_v; d++)
            o[d] *= inv;
    }
}

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

void mla_attention(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v, float scale,
                   const struct ops_kv_view *kv)
{
#if defined(__x86_64__)
    if (cpu_isa() != CPU_REF && head_dim <= MLA_ATT_MAXD && !a->window && !a->sinks) {
        attention_avx2(a, head_dim, head_dim_v, scale, kv);
        return;
    }
#endif
    cpu_attention(a, head_dim, head_dim_v, scale, kv);
}
