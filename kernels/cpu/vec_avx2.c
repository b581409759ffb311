/* vec_avx2 — RMSNorm, RoPE and attention for AVX2, equal bit for bit to kernels/ref/ops.c: every
 * lane computes one independent element (a key's score, a dim of the output) with the reference's
 * operations in the reference's order, so only the element-wise parts are vectorized: the double
 * sum of RMSNorm stays one sequential chain, and expf/sinf/cosf stay libm's scalar calls. */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
#endif

/* scale_mul: out[i] = (x[i] * s) * w[i], the tail of RMSNorm. */
static void scale_mul(float *out, const float *x, float s, const float *w, uint32_t n)
{
    const __m256 sv = _mm256_set1_ps(s);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv),
                                                _mm256_loadu_ps(w + i)));
    for (; i < n; i++)
        out[i] = (x[i] * s) * w[i];
}

void cpu_rmsnorm_avx2(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / n);
    scale_mul(out, x, 1.0f / sqrtf(mean + eps), w, n);
}

#define ROPE_MAX_HALF 256 /* pairs per head the angle table holds; wider heads use ops_rope */

void cpu_rope_avx2(float *x, uint32_t n_head, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
                   float theta, bool neox, const struct ops_yarn *yarn)
{
    const uint32_t half = n_rot / 2;
    if (half > ROPE_MAX_HALF) {
        if (yarn)
            ops_rope_yarn(x, n_head, head_dim, n_rot, pos, theta, neox, yarn);
        else
            ops_rope(x, n_head, head_dim, n_rot, pos, theta, neox);
        return;
    }
    /* Every head walks the same angles: take them once (ops_rope's sequence of t). */
    float c[ROPE_MAX_HALF], s[ROPE_MAX_HALF];
    const float theta_scale = powf(theta, -2.0f / (float)n_rot);
    float t = (float)pos;
    for (uint32_t i = 0; i < half; i++) {
        if (yarn) {
            ops_yarn_angle(yarn, t, i, &c[i], &s[i]);
        } else {
            c[i] = cosf(t);
            s[i] = sinf(t);
        }
        t *= theta_scale;
    }
    for (uint32_t h = 0; h < n_head; h++) {
        float *v = x + (size_t)h * head_dim;
        uint32_t i = 0;
        if (neox)
            for (; i + 8 <= half; i += 8) {
                const __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + half);
                const __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
                _mm256_storeu_ps(v + i,
                                 _mm256_sub_ps(_mm256_mul_ps(x0, cv), _mm256_mul_ps(x1, sv)));
                _mm256_storeu_ps(v + i + half,
                                 _mm256_add_ps(_mm256_mul_ps(x0, sv), _mm256_mul_ps(x1, cv)));
            }
        for (; i < half; i++) {
            const uint32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c[i] - x1 * s[i];
            v[b] = x0 * s[i] + x1 * c[i];
        }
    }
}

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

#define KB OPS_ATTN_BLOCK /* keys per block: 4 lane vectors of 8 */

/* prefetch_block asks for the K and V rows of the block of keys at j0 (when there is one), so
 * they come from memory while this block computes: decode reads the whole cache per token. */
static void prefetch_block(const struct ops_kv_view *kv, uint32_t j0, uint32_t n_keys,
                           uint32_t head_dim, uint32_t head_dim_v)
{
    for (uint32_t key = j0; key < n_keys && key < j0 + KB; key++) {
        const float *base = kv->blocks[key / kv->block_tokens];
        const uint32_t slot = key % kv->block_tokens;
        const char *k = (const char *)(base + kv->k_off + slot * kv->k_stride);
        const char *v = (const char *)(base + kv->v_off + slot * kv->v_stride);
        for (uint32_t b = 0; b < head_dim * sizeof(float); b += 64)
            _mm_prefetch(k + b, _MM_HINT_T0);
        for (uint32_t b = 0; b < head_dim_v * sizeof(float); b += 64)
            _mm_prefetch(v + b, _MM_HINT_T0);
    }
}

/* transpose_block writes kt[d][j] = k_j[d] for the block's keys j < nb (later lanes repeat the
 * last key: they are computed and never read). */
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

/* scores_block: s[j] = (sum_d q[d] * k_j[d], d in order) * scale for the ng lane vectors of the
 * block; one chain per lane vector, the ng chains side by side. */
static inline void scores_block(const float *q, const float (*kt)[KB], uint32_t head_dim,
                                uint32_t ng, float scale, float *s)
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

/* values_block: o = o * c, then o += p_j * v_j for j < nb in order, 32 dims at a time. */
static inline void values_block(float *o, float c, const float *p, const float *const *vrow,
                                uint32_t nb, uint32_t head_dim_v)
{
    const __m256 cv = _mm256_set1_ps(c);
    uint32_t d = 0;
    for (; d + 32 <= head_dim_v; d += 32) {
        __m256 o0 = _mm256_mul_ps(_mm256_loadu_ps(o + d), cv);
        __m256 o1 = _mm256_mul_ps(_mm256_loadu_ps(o + d + 8), cv);
        __m256 o2 = _mm256_mul_ps(_mm256_loadu_ps(o + d + 16), cv);
        __m256 o3 = _mm256_mul_ps(_mm256_loadu_ps(o + d + 24), cv);
        for (uint32_t j = 0; j < nb; j++) {
            const __m256 pv = _mm256_set1_ps(p[j]);
            const float *v = vrow[j] + d;
            o0 = _mm256_add_ps(o0, _mm256_mul_ps(pv, _mm256_loadu_ps(v)));
            o1 = _mm256_add_ps(o1, _mm256_mul_ps(pv, _mm256_loadu_ps(v + 8)));
            o2 = _mm256_add_ps(o2, _mm256_mul_ps(pv, _mm256_loadu_ps(v + 16)));
            o3 = _mm256_add_ps(o3, _mm256_mul_ps(pv, _mm256_loadu_ps(v + 24)));
        }
        _mm256_storeu_ps(o + d, o0);
        _mm256_storeu_ps(o + d + 8, o1);
        _mm256_storeu_ps(o + d + 16, o2);
        _mm256_storeu_ps(o + d + 24, o3);
    }
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

void cpu_attention_avx2(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v,
                        float scale, const struct ops_kv_view *kv)
{
    _Alignas(32) float kt[CPU_ATT_MAXD][KB];
    _Alignas(32) float s[KB], p[KB];
    const float *krow[KB], *vrow[KB];
    float m[CPU_ATT_MAXQ], l[CPU_ATT_MAXQ];
    const uint32_t nq = a->n_tok * a->n_head, max_keys = a->n_keys0 + a->n_tok - 1;
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t h = 0; h < a->n_head; h++) {
            m[t * a->n_head + h] = -INFINITY;
            l[t * a->n_head + h] = 0.0f;
            memset(a->out + t * a->out_tok + h * a->out_head, 0, head_dim_v * sizeof(float));
        }
    /* a window: blocks aligned to key 0 as ops_attention_ex's, from the first query's first */
    for (uint32_t j0 = cpu_att_lo(a, 0) / KB * KB; j0 < max_keys; j0 += KB) {
        const uint32_t nbmax = max_keys - j0 < KB ? max_keys - j0 : KB;
        for (uint32_t j = 0; j < nbmax; j++) {
            const uint32_t key = j0 + j;
            const float *base = kv->blocks[key / kv->block_tokens];
            const uint32_t slot = key % kv->block_tokens;
            krow[j] = base + kv->k_off + slot * kv->k_stride;
            vrow[j] = base + kv->v_off + slot * kv->v_stride;
        }
        prefetch_block(kv, j0 + KB, max_keys, head_dim, head_dim_v);
        transpose_block(krow, nbmax, head_dim, kt);
        for (uint32_t i = 0; i < nq; i++) {
            const uint32_t t = i / a->n_head, h = i % a->n_head, n_keys = a->n_keys0 + t;
            const uint32_t lo = cpu_att_lo(a, t);
            if (n_keys <= j0 || j0 + KB <= lo) continue;
            const uint32_t nb = n_keys - j0 < KB ? n_keys - j0 : KB;
            float *o = a->out + t * a->out_tok + h * a->out_head;
            scores_block(a->q + t * a->q_tok + h * a->q_head, kt, head_dim, (nb + 7) / 8, scale, s);
            for (uint32_t j = 0; j0 + j < lo; j++)
                s[j] = -INFINITY; /* before the window: weight 0, as ops_attention_ex's */
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
            values_block(o, c, p, vrow, nb, head_dim_v);
            m[i] = mn;
        }
    }
    for (uint32_t i = 0; i < nq; i++) {
        float *o = a->out + (i / a->n_head) * a->out_tok + (i % a->n_head) * a->out_head;
        if (a->sinks) ops_attention_sink(o, head_dim_v, &m[i], &l[i], a->sinks[i % a->n_head]);
        const float inv = 1.0f / l[i];
        const __m256 iv = _mm256_set1_ps(inv);
        uint32_t d = 0;
        for (; d + 8 <= head_dim_v; d += 8)
            _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), iv));
        for (; d < head_dim_v; d++)
            o[d] *= inv;
    }
}

#ifdef __clang__
#pragma clang attribute pop
#endif

#else
void cpu_rmsnorm_avx2(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    ops_rmsnorm(out, x, w, n, eps);
}
void cpu_rope_avx2(float *x, uint32_t n_head, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
                   float theta, bool neox, const struct ops_yarn *yarn)
{
    if (yarn)
        ops_rope_yarn(x, n_head, head_dim, n_rot, pos, theta, neox, yarn);
    else
        ops_rope(x, n_head, head_dim, n_rot, pos, theta, neox);
}
void cpu_attention_avx2(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v,
                        float scale, const struct ops_kv_view *kv)
{
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t h = 0; h < a->n_head; h++)
            ops_attention_ex(a->out + t * a->out_tok + h * a->out_head,
                             a->q + t * a->q_tok + h * a->q_head, head_dim, head_dim_v, scale, kv,
                             cpu_att_lo(a, t), a->n_keys0 + t,
                             a->sinks ? a->sinks[h] : -INFINITY);
}
#endif
