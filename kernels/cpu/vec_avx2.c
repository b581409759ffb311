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

/* scores8: for each of nq queries, dot[i] lane j = sum_d q_i[d] * k_j[d] in d order, for 8 keys
 * at once (lane j: key j). The keys are transposed once for all the queries of a GQA group. */
static inline void scores8(const float *q, size_t q_stride, uint32_t nq, const float *const k[8],
                           uint32_t head_dim, __m256 *dot)
{
    for (uint32_t i = 0; i < nq; i++)
        dot[i] = _mm256_setzero_ps();
    uint32_t d = 0;
    for (; d + 8 <= head_dim; d += 8) {
        __m256 r[8];
        for (int j = 0; j < 8; j++)
            r[j] = _mm256_loadu_ps(k[j] + d);
        transpose8(r); /* r[c]: dim d + c of the 8 keys */
        for (uint32_t i = 0; i < nq; i++) {
            const float *qi = q + i * q_stride + d;
            __m256 a = dot[i];
            for (int c = 0; c < 8; c++)
                a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(qi[c]), r[c]));
            dot[i] = a;
        }
    }
    for (; d < head_dim; d++) {
        const __m256 col =
            _mm256_set_ps(k[7][d], k[6][d], k[5][d], k[4][d], k[3][d], k[2][d], k[1][d], k[0][d]);
        for (uint32_t i = 0; i < nq; i++)
            dot[i] = _mm256_add_ps(dot[i], _mm256_mul_ps(_mm256_set1_ps(q[i * q_stride + d]), col));
    }
}

/* One query's online-softmax state. */
struct qstate {
    float m, l;
};

void cpu_attention_avx2(float *out, size_t out_stride, const float *q, size_t q_stride,
                        uint32_t n_q, uint32_t head_dim, uint32_t head_dim_v, float scale,
                        const struct ops_kv_view *kv, uint32_t n_keys)
{
    _Alignas(32) float s[CPU_ATT_MAXQ][OPS_ATTN_BLOCK];
    const float *vrow[OPS_ATTN_BLOCK], *krow[OPS_ATTN_BLOCK + 7];
    struct qstate st[CPU_ATT_MAXQ];
    if (n_q > CPU_ATT_MAXQ) {
        cpu_attention_avx2(out, out_stride, q, q_stride, CPU_ATT_MAXQ, head_dim, head_dim_v, scale,
                           kv, n_keys);
        cpu_attention_avx2(out + CPU_ATT_MAXQ * out_stride, out_stride, q + CPU_ATT_MAXQ * q_stride,
                           q_stride, n_q - CPU_ATT_MAXQ, head_dim, head_dim_v, scale, kv, n_keys);
        return;
    }
    for (uint32_t i = 0; i < n_q; i++) {
        st[i] = (struct qstate){-INFINITY, 0.0f};
        memset(out + i * out_stride, 0, head_dim_v * sizeof(float));
    }
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
            __m256 dot[CPU_ATT_MAXQ];
            scores8(q, q_stride, n_q, krow + j, head_dim, dot);
            for (uint32_t i = 0; i < n_q; i++)
                _mm256_store_ps(&s[i][j], _mm256_mul_ps(dot[i], sv));
        }
        for (uint32_t i = 0; i < n_q; i++) {
            float *o = out + i * out_stride;
            float bm = -INFINITY;
            for (uint32_t j = 0; j < nb; j++)
                bm = s[i][j] > bm ? s[i][j] : bm;
            const float mn = bm > st[i].m ? bm : st[i].m;
            const float c = expf(st[i].m - mn); /* 0 on the first block, where m is -inf */
            st[i].l *= c;
            const __m256 cv = _mm256_set1_ps(c);
            uint32_t d = 0;
            for (; d + 8 <= head_dim_v; d += 8)
                _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), cv));
            for (; d < head_dim_v; d++)
                o[d] *= c;
            for (uint32_t j = 0; j < nb; j++) {
                const float p = expf(s[i][j] - mn);
                st[i].l += p;
                const __m256 pv = _mm256_set1_ps(p);
                for (d = 0; d + 8 <= head_dim_v; d += 8)
                    _mm256_storeu_ps(
                        o + d, _mm256_add_ps(_mm256_loadu_ps(o + d),
                                             _mm256_mul_ps(pv, _mm256_loadu_ps(vrow[j] + d))));
                for (; d < head_dim_v; d++)
                    o[d] += p * vrow[j][d];
            }
            st[i].m = mn;
        }
    }
    for (uint32_t i = 0; i < n_q; i++) {
        float *o = out + i * out_stride;
        const float inv = 1.0f / st[i].l;
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
                   float theta, bool neox)
{
    ops_rope(x, n_head, head_dim, n_rot, pos, theta, neox);
}
void cpu_attention_avx2(float *out, size_t out_stride, const float *q, size_t q_stride,
                        uint32_t n_q, uint32_t head_dim, uint32_t head_dim_v, float scale,
                        const struct ops_kv_view *kv, uint32_t n_keys)
{
    for (uint32_t i = 0; i < n_q; i++)
        ops_attention(out + i * out_stride, q + i * q_stride, head_dim, head_dim_v, scale, kv,
                      n_keys);
}
#endif
