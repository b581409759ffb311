/* vec_avx2 — RMSNorm, RoPE and attention for AVX2, equal bit for bit to kernels/ref/ops.c: every
 * lane computes one independent element (a key's score, a dim of the output) with the reference's
 * operations in the reference's order, so only the element-wise parts are vectorized: the double
 * sum of RMSNorm stays one sequential chain, and expf/sinf/cosf stay libm's scalar calls. */
#include "kernels/cpu/cpu_impl.h"

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
                   float theta, bool neox)
{
    const uint32_t half = n_rot / 2;
    if (half > ROPE_MAX_HALF) {
        ops_rope(x, n_head, head_dim, n_rot, pos, theta, neox);
        return;
    }
    /* Every head walks the same angles: take them once (ops_rope's sequence of t). */
    float c[ROPE_MAX_HALF], s[ROPE_MAX_HALF];
    const float theta_scale = powf(theta, -2.0f / (float)n_rot);
    float t = (float)pos;
    for (uint32_t i = 0; i < half; i++) {
        c[i] = cosf(t);
        s[i] = sinf(t);
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

/* scores8: dot[j] = sum_d q[d] * k_j[d] in d order, for 8 keys at once (lane j: key j). */
static inline __m256 scores8(const float *q, const float *const k[8], uint32_t head_dim)
{
    __m256 dot = _mm256_setzero_ps();
    uint32_t d = 0;
    for (; d + 8 <= head_dim; d += 8) {
        __m256 r[8];
        for (int j = 0; j < 8; j++)
            r[j] = _mm256_loadu_ps(k[j] + d);
        transpose8(r); /* r[i]: dim d + i of the 8 keys */
        for (int i = 0; i < 8; i++)
            dot = _mm256_add_ps(dot, _mm256_mul_ps(_mm256_set1_ps(q[d + i]), r[i]));
    }
    for (; d < head_dim; d++)
        dot = _mm256_add_ps(dot, _mm256_mul_ps(_mm256_set1_ps(q[d]),
                                               _mm256_set_ps(k[7][d], k[6][d], k[5][d], k[4][d],
                                                             k[3][d], k[2][d], k[1][d], k[0][d])));
    return dot;
}

void cpu_attention_avx2(float *out, const float *q, uint32_t head_dim, uint32_t head_dim_v,
                        float scale, const struct ops_kv_view *kv, uint32_t n_keys)
{
    _Alignas(32) float s[OPS_ATTN_BLOCK];
    const float *vrow[OPS_ATTN_BLOCK], *krow[OPS_ATTN_BLOCK + 7];
    float m = -INFINITY, l = 0.0f;
    memset(out, 0, head_dim_v * sizeof(float));
    const __m256 sv = _mm256_set1_ps(scale);
    for (uint32_t j0 = 0; j0 < n_keys; j0 += OPS_ATTN_BLOCK) {
        const uint32_t nb = n_keys - j0 < OPS_ATTN_BLOCK ? n_keys - j0 : OPS_ATTN_BLOCK;
        for (uint32_t j = 0; j < nb; j++) {
            const uint32_t key = j0 + j;
            const float *base = kv->blocks[key / kv->block_tokens];
            const uint32_t slot = key % kv->block_tokens;
            krow[j] = base + kv->k_off + slot * kv->k_stride;
            vrow[j] = base + kv->v_off + slot * kv->v_stride;
        }
        for (uint32_t j = nb; j < (nb + 7) / 8 * 8; j++)
            krow[j] = krow[nb - 1];
        for (uint32_t j = 0; j < nb; j += 8) {
            _Alignas(32) float t[8];
            _mm256_store_ps(t, _mm256_mul_ps(scores8(q, krow + j, head_dim), sv));
            memcpy(s + j, t, (nb - j < 8 ? nb - j : 8) * sizeof(float));
        }
        float bm = -INFINITY;
        for (uint32_t j = 0; j < nb; j++)
            bm = s[j] > bm ? s[j] : bm;
        const float mn = bm > m ? bm : m;
        const float c = expf(m - mn);
        l *= c;
        const __m256 cv = _mm256_set1_ps(c);
        uint32_t d = 0;
        for (; d + 8 <= head_dim_v; d += 8)
            _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(out + d), cv));
        for (; d < head_dim_v; d++)
            out[d] *= c;
        for (uint32_t j = 0; j < nb; j++) {
            const float p = expf(s[j] - mn);
            l += p;
            const __m256 pv = _mm256_set1_ps(p);
            for (d = 0; d + 8 <= head_dim_v; d += 8)
                _mm256_storeu_ps(out + d,
                                 _mm256_add_ps(_mm256_loadu_ps(out + d),
                                               _mm256_mul_ps(pv, _mm256_loadu_ps(vrow[j] + d))));
            for (; d < head_dim_v; d++)
                out[d] += p * vrow[j][d];
        }
        m = mn;
    }
    const float inv = 1.0f / l;
    const __m256 iv = _mm256_set1_ps(inv);
    uint32_t d = 0;
    for (; d + 8 <= head_dim_v; d += 8)
        _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(out + d), iv));
    for (; d < head_dim_v; d++)
        out[d] *= inv;
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
                   float theta, bool neox)
{
    ops_rope(x, n_head, head_dim, n_rot, pos, theta, neox);
}
void cpu_attention_avx2(float *out, const float *q, uint32_t head_dim, uint32_t head_dim_v,
                        float scale, const struct ops_kv_view *kv, uint32_t n_keys)
{
    ops_attention(out, q, head_dim, head_dim_v, scale, kv, n_keys);
}
#endif
