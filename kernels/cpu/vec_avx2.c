/* vec_avx2 — RMSNorm, RoPE and attention for AVX2, equal bit for bit to kernels/ref/ops.c: every
 * lane computes one independent element (a key's score, a dim of the output) with the reference's
 * operations in the reference's order (attention's multiply-adds fused, as its fmaf), so only
 * the element-wise parts are vectorized: the double
 * sum of RMSNorm stays one sequential chain, and sinf/cosf stay libm's scalar calls; the
 * softmax's expf is glibc's method on 4 double lanes where it matches this libm (cpu_vexp2_ok),
 * else libm's. An fp16 cache is read in place, each row converted as it is loaded. */
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

/* exp4: glibc's expf (the table method, as vec_avx512.c's exp8) on 4 double lanes */
static inline __m128 exp4(__m128 x)
{
    const __m256d xd = _mm256_cvtps_pd(x);
    const __m256d inv = _mm256_set1_pd(0x1.71547652b82fep+5), shift = _mm256_set1_pd(0x1.8p+52);
    const __m256d z = _mm256_fmadd_pd(inv, xd, shift);
    const __m256i ki = _mm256_castpd_si256(z);
    const __m256d kd = _mm256_sub_pd(z, shift);
    const __m256d r = _mm256_fmsub_pd(inv, xd, kd);
    const __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    __m256i t = _mm256_i64gather_epi64((const long long *)cpu_exp_tab, idx, 8);
    t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
    const __m256d z2 = _mm256_fmadd_pd(r, _mm256_set1_pd(0x1.c6af84b912394p-20),
                                       _mm256_set1_pd(0x1.ebfce50fac4f3p-13));
    const __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(0x1.62e42ff0c52d6p-6), _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z2, r2, y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)));
}

/* exp8v: y[0..8) = expf(x[0..8)) (y may be x). */
static inline __attribute__((always_inline)) void exp8v(const float *x, float *y)
{
    const __m256 v = _mm256_loadu_ps(x);
    const __m256 e =
        _mm256_set_m128(exp4(_mm256_extractf128_ps(v, 1)), exp4(_mm256_castps256_ps128(v)));
    /* glibc's main path takes (bits >> 20 & 0x7ff) <= 0x42a: |x| below about 88 */
    const __m256i top =
        _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 20), _mm256_set1_epi32(0x7ff));
    unsigned odd = (unsigned)_mm256_movemask_ps(
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a))));
    /* the others from libm, from a copy of the inputs (y may be x) */
    _Alignas(32) float in[8];
    if (odd) _mm256_store_ps(in, v);
    _mm256_storeu_ps(y, e);
    cpu_expf_libm_lanes(y, in, odd);
}

void cpu_expf_avx2(const float *x, float *y, uint32_t n)
{
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        exp8v(x + i, y + i);
    if (i < n) { /* the tail through a padded copy (each lane is its own): no scalar calls */
        _Alignas(32) float t[8] = {0};
        memcpy(t, x + i, (n - i) * sizeof(float));
        exp8v(t, t);
        memcpy(y + i, t, (n - i) * sizeof(float));
    }
}

/* ld8: 8 floats at element d of a row of floats or, h16, of halves (converted
 * in registers: exact, as quant_f16_to_f32 but for a signaling NaN, which vcvtph2ps quiets; a
 * cache row never holds one, kv_store_write's conversion makes quiet NaNs only) */
static inline __attribute__((always_inline)) __m256 ld8(const void *row, uint32_t d, bool h16)
{
    return h16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d)))
               : _mm256_loadu_ps((const float *)row + d);
}

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
static inline __attribute__((always_inline)) void transpose8(__m256 r[8])
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

/* transpose_block writes kt[d][j] = k_j[d] for the block's keys j < nb (later lanes repeat the
 * last key: they are computed and never read). */
static inline __attribute__((always_inline)) void
transpose_rows(const void *const *krow, uint32_t nb, uint32_t head_dim, float (*kt)[KB], bool h16)
{
    const void *k[KB];
    for (uint32_t j = 0; j < KB; j++)
        k[j] = krow[j < nb ? j : nb - 1];
    for (uint32_t g = 0; g < (nb + 7) / 8; g++) {
        uint32_t d = 0;
        for (; d + 8 <= head_dim; d += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++)
                r[j] = ld8(k[8 * g + j], d, h16);
            transpose8(r);
            for (int c = 0; c < 8; c++)
                _mm256_store_ps(&kt[d + c][8 * g], r[c]);
        }
        for (; d < head_dim; d++)
            for (int j = 0; j < 8; j++)
                kt[d][8 * g + j] = cpu_att_ld1(k[8 * g + j], d, h16);
    }
}

/* cols_rows is transpose_rows for a k_cols view (keys j0.. from slot `slot` of their cache block
 * of bt): 8 keys in one block are a run of each column row, loaded as they lie (lanes past nb
 * read the block's unwritten slots: computed, never read); a group split across blocks is read
 * key by key (cpu_att_col_keys). */
static inline __attribute__((always_inline)) void cols_rows(const void *const *krow, uint32_t nb,
                                                            uint32_t head_dim, uint32_t bt,
                                                            uint32_t slot, float (*kt)[KB],
                                                            bool h16)
{
    for (uint32_t g = 0; g < (nb + 7) / 8; g++) {
        if ((slot + 8 * g) % bt + 8 <= bt) {
            for (uint32_t d = 0; d < head_dim; d++)
                _mm256_store_ps(&kt[d][8 * g], ld8(krow[8 * g], d * bt, h16));
            continue;
        }
        cpu_att_col_keys(krow, 8 * g, 8 * g + 8, nb, head_dim, bt, kt, h16);
    }
}

static void transpose_block(const struct ops_kv_view *kv, uint32_t j0, const void *const *krow,
                            uint32_t nb, uint32_t head_dim, float (*kt)[KB], bool h16)
{
    const uint32_t bt = kv->block_tokens, slot = j0 % bt;
    if (kv->k_cols && h16)
        cols_rows(krow, nb, head_dim, bt, slot, kt, true);
    else if (kv->k_cols)
        cols_rows(krow, nb, head_dim, bt, slot, kt, false);
    else if (h16)
        transpose_rows(krow, nb, head_dim, kt, true);
    else
        transpose_rows(krow, nb, head_dim, kt, false);
}

/* kcol8: lanes 8u.. of dim d of the block's keys: from kt, or (cols) from a k_cols view's block
 * in place, its 32 keys a run of each column row (krow: key j0's element 0; bt the view's
 * block_tokens). */
static inline __attribute__((always_inline)) __m256 kcol8(const float (*kt)[KB], const void *krow,
                                                          uint32_t bt, uint32_t d, uint32_t u,
                                                          bool cols, bool h16)
{
    return cols ? ld8(krow, d * bt + 8 * u, h16) : _mm256_load_ps(&kt[d][8 * u]);
}

/* scores_block: s[j] = (fmaf chain of q[d] * k_j[d], d in order) * scale for the ng lane vectors of
 * the block; one chain per lane vector, the ng chains side by side. */
static inline __attribute__((always_inline)) void
scores_block_from(const float *q, const float (*kt)[KB], const void *krow, uint32_t bt,
                  uint32_t head_dim, uint32_t ng, float scale, float *s, bool cols, bool h16)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (uint32_t d = 0; d < head_dim; d++) {
        const __m256 qv = _mm256_set1_ps(q[d]);
        a0 = _mm256_fmadd_ps(qv, kcol8(kt, krow, bt, d, 0, cols, h16), a0);
        if (ng > 1) a1 = _mm256_fmadd_ps(qv, kcol8(kt, krow, bt, d, 1, cols, h16), a1);
        if (ng > 2) a2 = _mm256_fmadd_ps(qv, kcol8(kt, krow, bt, d, 2, cols, h16), a2);
        if (ng > 3) a3 = _mm256_fmadd_ps(qv, kcol8(kt, krow, bt, d, 3, cols, h16), a3);
    }
    const __m256 sv = _mm256_set1_ps(scale);
    _mm256_store_ps(s, _mm256_mul_ps(a0, sv));
    _mm256_store_ps(s + 8, _mm256_mul_ps(a1, sv));
    _mm256_store_ps(s + 16, _mm256_mul_ps(a2, sv));
    _mm256_store_ps(s + 24, _mm256_mul_ps(a3, sv));
}

/* values_block: o = o * c, then o = fma(p_j, v_j, o) for j < nb in order, 32 dims at a time. */
static inline __attribute__((always_inline)) void values_rows(float *o, float c, const float *p,
                                                              const void *const *vrow, uint32_t nb,
                                                              uint32_t head_dim_v, bool h16)
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
            o0 = _mm256_fmadd_ps(pv, ld8(vrow[j], d, h16), o0);
            o1 = _mm256_fmadd_ps(pv, ld8(vrow[j], d + 8, h16), o1);
            o2 = _mm256_fmadd_ps(pv, ld8(vrow[j], d + 16, h16), o2);
            o3 = _mm256_fmadd_ps(pv, ld8(vrow[j], d + 24, h16), o3);
        }
        _mm256_storeu_ps(o + d, o0);
        _mm256_storeu_ps(o + d + 8, o1);
        _mm256_storeu_ps(o + d + 16, o2);
        _mm256_storeu_ps(o + d + 24, o3);
    }
    for (; d + 8 <= head_dim_v; d += 8) {
        __m256 o0 = _mm256_mul_ps(_mm256_loadu_ps(o + d), cv);
        for (uint32_t j = 0; j < nb; j++)
            o0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), ld8(vrow[j], d, h16), o0);
        _mm256_storeu_ps(o + d, o0);
    }
    for (; d < head_dim_v; d++) {
        float x = o[d] * c;
        for (uint32_t j = 0; j < nb; j++)
            x = fmaf(p[j], cpu_att_ld1(vrow[j], d, h16), x);
        o[d] = x;
    }
}

/* scores2: scores_block for two queries side by side, eight chains (each still one lane vector
 * summing its keys' dims in order); ng the lane vectors the longer of the two needs. */
static inline __attribute__((always_inline)) void
scores2_from(const float *const *q, const float (*kt)[KB], const void *krow, uint32_t bt,
             uint32_t head_dim, uint32_t ng, float scale, float *const *s, bool cols, bool h16,
             bool pf, const char *pk)
{
    const size_t pstep = (size_t)bt * (h16 ? 2 : 4);
    __m256 a[2][4];
    _Pragma("GCC unroll 4")
    for (uint32_t u = 0; u < 4; u++)
        a[0][u] = a[1][u] = _mm256_setzero_ps();
    for (uint32_t d = 0; d < head_dim; d++) {
        const __m256 x0 = _mm256_set1_ps(q[0][d]), x1 = _mm256_set1_ps(q[1][d]);
        if (pf) { /* cpu_att_ahead's block: its column row d */
            _mm_prefetch(pk + d * pstep, _MM_HINT_T1);
            if (!h16) _mm_prefetch(pk + d * pstep + 64, _MM_HINT_T1);
        }
        _Pragma("GCC unroll 4")
        for (uint32_t u = 0; u < 4; u++)
            if (u < ng) {
            const __m256 k = kcol8(kt, krow, bt, d, u, cols, h16);
            a[0][u] = _mm256_fmadd_ps(x0, k, a[0][u]);
            a[1][u] = _mm256_fmadd_ps(x1, k, a[1][u]);
            }
    }
    const __m256 sv = _mm256_set1_ps(scale);
    _Pragma("GCC unroll 4")
    for (uint32_t u = 0; u < 4; u++) {
        _mm256_store_ps(s[0] + 8 * u, _mm256_mul_ps(a[0][u], sv));
        _mm256_store_ps(s[1] + 8 * u, _mm256_mul_ps(a[1][u], sv));
    }
}

/* scores: the scores of the block's na queries qp, two at a time: from kt, or (cols) from a
 * k_cols view's block in place. A decode step makes one pass of its few queries over each
 * block, where staging it in kt (its stores, then its loads) cost more than converting each
 * key twice as it is loaded. */
static inline __attribute__((always_inline)) void
scores_from(const float *const *qp, uint32_t na, const uint32_t *nbq, const float (*kt)[KB],
            const void *krow, uint32_t bt, uint32_t head_dim, float scale, float (*pb)[KB],
            bool cols, bool h16, bool pf, const char *pk)
{
    uint32_t q = 0;
    if (pf && na >= 2) { /* the first pair prefetches cpu_att_ahead's block */
        const uint32_t nb = nbq[0] > nbq[1] ? nbq[0] : nbq[1];
        float *const sp[2] = {pb[0], pb[1]};
        scores2_from(qp, kt, krow, bt, head_dim, (nb + 7) / 8, scale, sp, cols, h16, true, pk);
        q = 2;
    }
    for (; q + 2 <= na; q += 2) {
        const uint32_t nb = nbq[q] > nbq[q + 1] ? nbq[q] : nbq[q + 1];
        float *const sp[2] = {pb[q], pb[q + 1]};
        scores2_from(qp + q, kt, krow, bt, head_dim, (nb + 7) / 8, scale, sp, cols, h16, false,
                     NULL);
    }
    if (q < na)
        scores_block_from(qp[q], kt, krow, bt, head_dim, (nbq[q] + 7) / 8, scale, pb[q], cols, h16);
}

static void scores(const float *const *qp, uint32_t na, const uint32_t *nbq, const float (*kt)[KB],
                   const void *krow, uint32_t bt, uint32_t head_dim, float scale, float (*pb)[KB],
                   bool cols, bool h16)
{
    if (!cols)
        scores_from(qp, na, nbq, kt, NULL, 0, head_dim, scale, pb, false, false, false, NULL);
    else if (h16)
        scores_from(qp, na, nbq, NULL, krow, bt, head_dim, scale, pb, true, true, false, NULL);
    else
        scores_from(qp, na, nbq, NULL, krow, bt, head_dim, scale, pb, true, false, false, NULL);
}

/* scores_pf: scores of a k_cols view's block in place, prefetching cpu_att_ahead's block (pk). */
static void scores_pf(const float *const *qp, uint32_t na, const uint32_t *nbq, const void *krow,
                      uint32_t bt, uint32_t head_dim, float scale, float (*pb)[KB], bool h16,
                      const char *pk)
{
    if (h16)
        scores_from(qp, na, nbq, NULL, krow, bt, head_dim, scale, pb, true, true, true, pk);
    else
        scores_from(qp, na, nbq, NULL, krow, bt, head_dim, scale, pb, true, false, true, pk);
}

/* values2: values_rows for two queries of one block at once where head_dim_v is a multiple of
 * 32: eight chains side by side sharing each value load, every output lane adding p_j * v_j in
 * key order; a query with fewer keys than the other finishes its own after the common ones. */
static inline __attribute__((always_inline)) void
values2_rows(float *const *o, const float *c, const float *const *p, const void *const *vrow,
             const uint32_t *nb, uint32_t head_dim_v, bool h16, bool pf, const char *pv,
             size_t pv_step)
{
    const uint32_t vbytes = head_dim_v * (h16 ? 2 : 4);
    const uint32_t n = nb[0] < nb[1] ? nb[0] : nb[1];
    for (uint32_t d = 0; d < head_dim_v; d += 32) {
        __m256 acc[2][4];
        _Pragma("GCC unroll 2")
        for (int i = 0; i < 2; i++) {
            const __m256 cv = _mm256_set1_ps(c[i]);
            _Pragma("GCC unroll 4")
            for (int u = 0; u < 4; u++)
                acc[i][u] = _mm256_mul_ps(_mm256_loadu_ps(o[i] + d + 8 * u), cv);
        }
        for (uint32_t j = 0; j < n; j++) {
            if (pf && d == 0) /* cpu_att_ahead's block: key j's V row */
                for (uint32_t b = 0; b < vbytes; b += 64)
                    _mm_prefetch(pv + j * pv_step + b, _MM_HINT_T1);
            __m256 v[4];
            _Pragma("GCC unroll 4")
            for (int u = 0; u < 4; u++)
                v[u] = ld8(vrow[j], d + 8 * u, h16);
            _Pragma("GCC unroll 2")
            for (int i = 0; i < 2; i++) {
                const __m256 pv = _mm256_set1_ps(p[i][j]);
                _Pragma("GCC unroll 4")
                for (int u = 0; u < 4; u++)
                    acc[i][u] = _mm256_fmadd_ps(pv, v[u], acc[i][u]);
            }
        }
        _Pragma("GCC unroll 2")
        for (int i = 0; i < 2; i++) {
            for (uint32_t j = n; j < nb[i]; j++) {
                const __m256 pv = _mm256_set1_ps(p[i][j]);
                _Pragma("GCC unroll 4")
                for (int u = 0; u < 4; u++)
                    acc[i][u] = _mm256_fmadd_ps(pv, ld8(vrow[j], d + 8 * u, h16), acc[i][u]);
            }
            _Pragma("GCC unroll 4")
            for (int u = 0; u < 4; u++)
                _mm256_storeu_ps(o[i] + d + 8 * u, acc[i][u]);
        }
    }
}

static void values2(float *const *o, const float *c, const float *const *p, const void *const *vrow,
                    const uint32_t *nb, uint32_t head_dim_v, bool h16)
{
    if (h16)
        values2_rows(o, c, p, vrow, nb, head_dim_v, true, false, NULL, 0);
    else
        values2_rows(o, c, p, vrow, nb, head_dim_v, false, false, NULL, 0);
}

/* values2_pf: values2, prefetching cpu_att_ahead's block's V rows (pv, pv_step bytes apart). */
static void values2_pf(float *const *o, const float *c, const float *const *p,
                       const void *const *vrow, const uint32_t *nb, uint32_t head_dim_v, bool h16,
                       const char *pv, size_t pv_step)
{
    if (h16)
        values2_rows(o, c, p, vrow, nb, head_dim_v, true, true, pv, pv_step);
    else
        values2_rows(o, c, p, vrow, nb, head_dim_v, false, true, pv, pv_step);
}

static void values_block(float *o, float c, const float *p, const void *const *vrow, uint32_t nb,
                         uint32_t head_dim_v, bool h16)
{
    if (h16)
        values_rows(o, c, p, vrow, nb, head_dim_v, true);
    else
        values_rows(o, c, p, vrow, nb, head_dim_v, false);
}

/* block_max: the largest of s[0..nb), s[j] > max ? s[j] : max from -inf as ops_attention's loop
 * (a NaN never wins), on lanes: the maximum does not depend on the order (only the sign of a zero
 * can, and a zero's sign is lost in every use: s - max and m - max only reach expf). */
static inline float block_max(const float *s, uint32_t nb)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 v = ninf;
    for (uint32_t g = 0; g < (nb + 7) / 8; g++) {
        const __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(nb - 8 * g)), lane);
        const __m256 x =
            _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 8 * g), _mm256_castsi256_ps(in));
        v = _mm256_max_ps(x, v);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

void cpu_attention_avx2(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v,
                        float scale, const struct ops_kv_view *kv, int vexp)
{
    _Alignas(32) float kt[CPU_ATT_MAXD][KB];
    _Alignas(32) float pb[CPU_ATT_MAXQ][KB]; /* the block's queries' weights */
    float cq[CPU_ATT_MAXQ], sq[CPU_ATT_MAXQ];
    uint32_t iq[CPU_ATT_MAXQ], nbq[CPU_ATT_MAXQ];
    const void *krow[KB], *vrow[KB];
    const bool h16 = kv->hblocks != NULL; /* fp16 rows read in place, converted in registers */
    float m[CPU_ATT_MAXQ], l[CPU_ATT_MAXQ];
    const uint32_t nq = a->n_tok * a->n_head, max_keys = a->n_keys0 + a->n_tok - 1;
    const bool in_place = cpu_att_in_place(kv, nq);
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t h = 0; h < a->n_head; h++) {
            m[t * a->n_head + h] = -INFINITY;
            l[t * a->n_head + h] = 0.0f;
            memset(a->out + t * a->out_tok + h * a->out_head, 0, head_dim_v * sizeof(float));
        }
    /* a window: blocks aligned to key 0 as ops_attention_ex's, from the first query's first */
    for (uint32_t j0 = cpu_att_lo(a, 0) / KB * KB; j0 < max_keys; j0 += KB) {
        const uint32_t nbmax = max_keys - j0 < KB ? max_keys - j0 : KB;
        cpu_att_rows(kv, j0, nbmax, krow, vrow);
        const char *pk = NULL, *pv = NULL;
        size_t pv_step = 0;
        /* in the loops when the first pair takes the block: scores_pf, values2_pf */
        const bool spread = cpu_att_ahead(
            kv, j0, max_keys, in_place && nq >= 2 && head_dim_v % 32 == 0, &pk, &pv, &pv_step);
        if (!spread) cpu_att_prefetch(kv, j0 + KB, max_keys, head_dim, head_dim_v);
        if (!in_place) transpose_block(kv, j0, krow, nbmax, head_dim, kt, h16);
        /* the queries with keys in the block; their scores two at a time; each one's weights
         * (ops_attention's online softmax, step for step); the sums four queries side by side
         * (each in key order); the values two at a time */
        uint32_t na = 0;
        for (uint32_t i = 0; i < nq; i++) {
            const uint32_t t = i / a->n_head, n_keys = a->n_keys0 + t;
            if (n_keys <= j0 || j0 + KB <= cpu_att_lo(a, t)) continue;
            iq[na] = i;
            nbq[na++] = n_keys - j0 < KB ? n_keys - j0 : KB;
        }
        const float *qp[CPU_ATT_MAXQ];
        float *op[CPU_ATT_MAXQ];
        for (uint32_t q = 0; q < na; q++) {
            const uint32_t t = iq[q] / a->n_head, h = iq[q] % a->n_head;
            qp[q] = a->q + t * a->q_tok + h * a->q_head;
            op[q] = a->out + t * a->out_tok + h * a->out_head;
        }
        if (spread && na >= 2)
            scores_pf(qp, na, nbq, krow[0], kv->block_tokens, head_dim, scale, pb, h16, pk);
        else
            scores(qp, na, nbq, (const float(*)[KB])kt, krow[0], kv->block_tokens, head_dim, scale,
                   pb, in_place, h16);
        uint32_t q;
        for (q = 0; q < na; q++) {
            const uint32_t i = iq[q], lo = cpu_att_lo(a, i / a->n_head), nb = nbq[q];
            float *s = pb[q];
            for (uint32_t j = 0; j0 + j < lo; j++)
                s[j] = -INFINITY; /* before the window: weight 0, as ops_attention_ex's */
            const float bm = block_max(s, nb);
            const float mn = bm > m[i] ? bm : m[i];
            cq[q] = m[i] - mn; /* its expf below: 0 on the first block, where m is -inf */
            if (vexp) {
                for (uint32_t j = 0; j < nb; j++)
                    s[j] -= mn;
                cpu_expf_avx2(s, s, nb);
            } else {
                for (uint32_t j = 0; j < nb; j++)
                    s[j] = expf(s[j] - mn);
            }
            m[i] = mn;
        }
        if (vexp) /* the queries' rescales in vectors, not one libm call a query */
            cpu_expf_avx2(cq, cq, na);
        else
            for (q = 0; q < na; q++)
                cq[q] = expf(cq[q]);
        for (q = 0; q < na; q++)
            sq[q] = l[iq[q]] * cq[q];
        cpu_att_sums(na, sq, (const float(*)[KB])pb, nbq);
        q = 0;
        if (head_dim_v % 32 == 0)
            for (; q + 2 <= na; q += 2) {
                const float *const pq[2] = {pb[q], pb[q + 1]};
                if (spread && q == 0)
                    values2_pf(op + q, cq + q, pq, vrow, nbq + q, head_dim_v, h16, pv, pv_step);
                else
                    values2(op + q, cq + q, pq, vrow, nbq + q, head_dim_v, h16);
            }
        for (; q < na; q++)
            values_block(op[q], cq[q], pb[q], vrow, nbq[q], head_dim_v, h16);
        for (q = 0; q < na; q++)
            l[iq[q]] = sq[q];
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
void cpu_expf_avx2(const float *x, float *y, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        y[i] = expf(x[i]);
}
void cpu_attention_avx2(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v,
                        float scale, const struct ops_kv_view *kv, int vexp)
{
    (void)vexp;
    struct ops_kv_view w = *kv;
    ops_kv_widen(&w, a->n_keys0 + a->n_tok - 1, head_dim, head_dim_v);
    kv = &w;
    for (uint32_t t = 0; t < a->n_tok; t++)
        for (uint32_t h = 0; h < a->n_head; h++)
            ops_attention_ex(a->out + t * a->out_tok + h * a->out_head,
                             a->q + t * a->q_tok + h * a->q_head, head_dim, head_dim_v, scale, kv,
                             cpu_att_lo(a, t), a->n_keys0 + t,
                             a->sinks ? a->sinks[h] : -INFINITY);
}
#endif
