/* vec_avx512 — attention for AVX-512, equal bit for bit to ops_attention (and to vec_avx2.c's):
 * the same scheme on 16 lanes. A block of 32 keys is loaded as it lies from a cache that keeps K
 * by columns (else transposed in 16 x 16 tiles) once for all the queries of a call; a query's
 * scores are two lane vectors of 16 keys (each lane a chain of FMAs over its key's dims in index
 * order), four queries side by side so eight chains hide the latency; values are accumulated 64
 * dims per pass. expf is glibc's method on lanes where it matches libm (below). */
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_impl.h"

#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "common/quant/quant_blocks.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#pragma clang attribute push(                                                                      \
    __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")
#endif

#define KB OPS_ATTN_BLOCK /* keys per block: 2 lane vectors of 16 */

/* transpose16: rows r[0..15] (16 floats each) -> columns. */
static inline __attribute__((always_inline)) void transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    /* u[4i + c], 128-bit lane L: column 4L + c of rows 4i..4i+3 */
    for (int c = 0; c < 4; c++) {
        const __m512 a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
        const __m512 b = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
        const __m512 e = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        const __m512 f = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
        r[c] = _mm512_shuffle_f32x4(a, e, 0x88);
        r[c + 8] = _mm512_shuffle_f32x4(a, e, 0xDD);
        r[c + 4] = _mm512_shuffle_f32x4(b, f, 0x88);
        r[c + 12] = _mm512_shuffle_f32x4(b, f, 0xDD);
    }
}

/* ld16: 16 floats at element d of a row of floats or, h16, of halves (in
 * registers: vcvtph2ps, exact, as quant_f16_to_f32 but for a signaling NaN, which it quiets; a
 * cache row never holds one, kv_store_write's conversion makes quiet NaNs only) */
static inline __attribute__((always_inline)) __m512 ld16(const void *row, uint32_t d, bool h16)
{
    return h16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + d)))
               : _mm512_loadu_ps((const float *)row + d);
}

/* transpose_block: kt[d][j] = k_j[d] for j < nb; later lanes repeat the last key (computed,
 * never read). */
static inline __attribute__((always_inline)) void
transpose_rows(const void *const *krow, uint32_t nb, uint32_t head_dim, float (*kt)[KB], bool h16)
{
    const void *k[KB];
    for (uint32_t j = 0; j < KB; j++)
        k[j] = krow[j < nb ? j : nb - 1];
    for (uint32_t g = 0; g < (nb + 15) / 16; g++) {
        uint32_t d = 0;
        for (; d + 16 <= head_dim; d += 16) {
            __m512 r[16];
            for (int j = 0; j < 16; j++)
                r[j] = ld16(k[16 * g + j], d, h16);
            transpose16(r);
            for (int c = 0; c < 16; c++)
                _mm512_store_ps(&kt[d + c][16 * g], r[c]);
        }
        for (; d < head_dim; d++)
            for (int j = 0; j < 16; j++)
                kt[d][16 * g + j] = cpu_att_ld1(k[16 * g + j], d, h16);
    }
}

/* cols_rows is transpose_rows for a k_cols view (keys j0.. from slot `slot` of their cache block
 * of bt): 16 keys in one block are a run of each column row, loaded as they lie (lanes past nb
 * read the block's unwritten slots: computed, never read); a group split across blocks is read
 * key by key (cpu_att_col_keys). */
static inline __attribute__((always_inline)) void cols_rows(const void *const *krow, uint32_t nb,
                                                            uint32_t head_dim, uint32_t bt,
                                                            uint32_t slot, float (*kt)[KB],
                                                            bool h16)
{
    for (uint32_t g = 0; g < (nb + 15) / 16; g++) {
        if ((slot + 16 * g) % bt + 16 <= bt) {
            for (uint32_t d = 0; d < head_dim; d++)
                _mm512_store_ps(&kt[d][16 * g], ld16(krow[16 * g], d * bt, h16));
            continue;
        }
        cpu_att_col_keys(krow, 16 * g, 16 * g + 16, nb, head_dim, bt, kt, h16);
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

/* kcol16: lanes 16u.. of dim d of the block's keys: from kt, or (cols) from a k_cols view's
 * block in place, its 32 keys a run of each column row (krow: key j0's element 0; bt the view's
 * block_tokens). */
static inline __attribute__((always_inline)) __m512
kcol16(const float (*kt)[KB], const void *krow, uint32_t bt, uint32_t d, int u, bool cols, bool h16)
{
    return cols ? ld16(krow, d * bt + 16 * u, h16) : _mm512_load_ps(&kt[d][16 * u]);
}

/* scores4: s[i] = the scaled scores of queries q[i], i < 4, over the block: eight chains side
 * by side, each lane summing its key's dims in index order (a missing query repeats q[0]). */
static inline __attribute__((always_inline)) void
scores4_from(const float *const *q, const float (*kt)[KB], const void *krow, uint32_t bt,
             uint32_t head_dim, float scale, float *const *s, bool cols, bool h16, bool pf,
             const char *pk)
{
    const size_t pstep = (size_t)bt * (h16 ? 2 : 4);
    __m512 a[4][2];
    _Pragma("GCC unroll 4")
    for (int i = 0; i < 4; i++)
        a[i][0] = a[i][1] = _mm512_setzero_ps();
    for (uint32_t d = 0; d < head_dim; d++) {
        const __m512 k0 = kcol16(kt, krow, bt, d, 0, cols, h16),
                     k1 = kcol16(kt, krow, bt, d, 1, cols, h16);
        if (pf) { /* cpu_att_ahead's block: its column row d */
            _mm_prefetch(pk + d * pstep, _MM_HINT_T1);
            if (!h16) _mm_prefetch(pk + d * pstep + 64, _MM_HINT_T1);
        }
        _Pragma("GCC unroll 4")
        for (int i = 0; i < 4; i++) {
            const __m512 x = _mm512_set1_ps(q[i][d]);
            a[i][0] = _mm512_fmadd_ps(x, k0, a[i][0]);
            a[i][1] = _mm512_fmadd_ps(x, k1, a[i][1]);
        }
    }
    const __m512 sv = _mm512_set1_ps(scale);
    _Pragma("GCC unroll 4")
    for (int i = 0; i < 4; i++) {
        _mm512_store_ps(s[i], _mm512_mul_ps(a[i][0], sv));
        _mm512_store_ps(s[i] + 16, _mm512_mul_ps(a[i][1], sv));
    }
}

static void scores4(const float *const *q, const float (*kt)[KB], uint32_t head_dim, float scale,
                    float *const *s)
{
    scores4_from(q, kt, NULL, 0, head_dim, scale, s, false, false, false, NULL);
}

/* scores4_cols: scores4 from a k_cols view's block in place: a decode step makes one pass of
 * its <= 4 queries over each block, and staging the block in kt (its stores, then its loads)
 * was 18% of a step's attention from cache and half of it from DRAM (Zen 4, 16K keys: 23 -> 12
 * ms a step). */
static void scores4_cols(const float *const *q, const void *krow, uint32_t bt, uint32_t head_dim,
                         float scale, float *const *s, bool h16)
{
    if (h16)
        scores4_from(q, NULL, krow, bt, head_dim, scale, s, true, true, false, NULL);
    else
        scores4_from(q, NULL, krow, bt, head_dim, scale, s, true, false, false, NULL);
}

/* scores4_cols_pf: scores4_cols, prefetching cpu_att_ahead's block's K columns (pk) a column row
 * a dim: a variant of its own, as a runtime flag in the shared loop cost up to a fifth where the
 * cache was in L3 */
static void scores4_cols_pf(const float *const *q, const void *krow, uint32_t bt, uint32_t head_dim,
                            float scale, float *const *s, bool h16, const char *pk)
{
    if (h16)
        scores4_from(q, NULL, krow, bt, head_dim, scale, s, true, true, true, pk);
    else
        scores4_from(q, NULL, krow, bt, head_dim, scale, s, true, false, true, pk);
}

/* values_block: o = o * c, then o = fma(p_j, v_j, o) for j < nb in order. */
static inline __attribute__((always_inline)) void values_rows(float *o, float c, const float *p,
                                                              const void *const *vrow, uint32_t nb,
                                                              uint32_t head_dim_v, bool h16)
{
    const __m512 cv = _mm512_set1_ps(c);
    uint32_t d = 0;
    for (; d + 64 <= head_dim_v; d += 64) {
        __m512 o0 = _mm512_mul_ps(_mm512_loadu_ps(o + d), cv);
        __m512 o1 = _mm512_mul_ps(_mm512_loadu_ps(o + d + 16), cv);
        __m512 o2 = _mm512_mul_ps(_mm512_loadu_ps(o + d + 32), cv);
        __m512 o3 = _mm512_mul_ps(_mm512_loadu_ps(o + d + 48), cv);
        for (uint32_t j = 0; j < nb; j++) {
            const __m512 pv = _mm512_set1_ps(p[j]);
            o0 = _mm512_fmadd_ps(pv, ld16(vrow[j], d, h16), o0);
            o1 = _mm512_fmadd_ps(pv, ld16(vrow[j], d + 16, h16), o1);
            o2 = _mm512_fmadd_ps(pv, ld16(vrow[j], d + 32, h16), o2);
            o3 = _mm512_fmadd_ps(pv, ld16(vrow[j], d + 48, h16), o3);
        }
        _mm512_storeu_ps(o + d, o0);
        _mm512_storeu_ps(o + d + 16, o1);
        _mm512_storeu_ps(o + d + 32, o2);
        _mm512_storeu_ps(o + d + 48, o3);
    }
    for (; d + 16 <= head_dim_v; d += 16) {
        __m512 o0 = _mm512_mul_ps(_mm512_loadu_ps(o + d), cv);
        for (uint32_t j = 0; j < nb; j++)
            o0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), ld16(vrow[j], d, h16), o0);
        _mm512_storeu_ps(o + d, o0);
    }
    for (; d < head_dim_v; d++) {
        float x = o[d] * c;
        for (uint32_t j = 0; j < nb; j++)
            x = fmaf(p[j], cpu_att_ld1(vrow[j], d, h16), x);
        o[d] = x;
    }
}

/* values4: values_rows for four queries of one block at once where head_dim_v is a multiple of
 * 64: sixteen chains side by side, each output lane adding p_j * v_j in key order; a query with
 * fewer keys than the others finishes its own after the common ones. */
static inline __attribute__((always_inline)) void
values4_rows(float *const *o, const float *c, float *const *p, const void *const *vrow,
             const uint32_t *nb, uint32_t head_dim_v, bool h16, bool pf, const char *pv,
             size_t pv_step)
{
    const uint32_t vbytes = head_dim_v * (h16 ? 2 : 4);
    uint32_t n = nb[0];
    _Pragma("GCC unroll 4")
    for (int i = 1; i < 4; i++)
        n = nb[i] < n ? nb[i] : n;
    for (uint32_t d = 0; d < head_dim_v; d += 64) {
        __m512 acc[4][4];
        _Pragma("GCC unroll 4")
        for (int i = 0; i < 4; i++) {
            const __m512 cv = _mm512_set1_ps(c[i]);
            _Pragma("GCC unroll 4")
            for (int u = 0; u < 4; u++)
                acc[i][u] = _mm512_mul_ps(_mm512_loadu_ps(o[i] + d + 16 * u), cv);
        }
        for (uint32_t j = 0; j < n; j++) {
            if (pf && d == 0) /* cpu_att_ahead's block: key j's V row */
                for (uint32_t o2 = 0; o2 < vbytes; o2 += 64)
                    _mm_prefetch(pv + j * pv_step + o2, _MM_HINT_T1);
            __m512 v[4];
            _Pragma("GCC unroll 4")
            for (int u = 0; u < 4; u++)
                v[u] = ld16(vrow[j], d + 16 * u, h16);
            _Pragma("GCC unroll 4")
            for (int i = 0; i < 4; i++) {
                const __m512 pv = _mm512_set1_ps(p[i][j]);
                _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] =
                    _mm512_fmadd_ps(pv, v[u], acc[i][u]);
            }
        }
        _Pragma("GCC unroll 4")
        for (int i = 0; i < 4; i++) {
            for (uint32_t j = n; j < nb[i]; j++) {
                const __m512 pv = _mm512_set1_ps(p[i][j]);
                _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] =
                    _mm512_fmadd_ps(pv, ld16(vrow[j], d + 16 * u, h16), acc[i][u]);
            }
            _Pragma("GCC unroll 4")
            for (int u = 0; u < 4; u++)
                _mm512_storeu_ps(o[i] + d + 16 * u, acc[i][u]);
        }
    }
}

static void values4(float *const *o, const float *c, float *const *p, const void *const *vrow,
                    const uint32_t *nb, uint32_t head_dim_v, bool h16)
{
    if (h16)
        values4_rows(o, c, p, vrow, nb, head_dim_v, true, false, NULL, 0);
    else
        values4_rows(o, c, p, vrow, nb, head_dim_v, false, false, NULL, 0);
}

/* values4_pf: values4, prefetching cpu_att_ahead's block's V rows (pv, pv_step bytes apart) a
 * row a key */
static void values4_pf(float *const *o, const float *c, float *const *p, const void *const *vrow,
                       const uint32_t *nb, uint32_t head_dim_v, bool h16, const char *pv,
                       size_t pv_step)
{
    if (h16)
        values4_rows(o, c, p, vrow, nb, head_dim_v, true, true, pv, pv_step);
    else
        values4_rows(o, c, p, vrow, nb, head_dim_v, false, true, pv, pv_step);
}

static void values_block(float *o, float c, const float *p, const void *const *vrow, uint32_t nb,
                         uint32_t head_dim_v, bool h16)
{
    if (h16)
        values_rows(o, c, p, vrow, nb, head_dim_v, true);
    else
        values_rows(o, c, p, vrow, nb, head_dim_v, false);
}

/* ---- expf on 16 lanes, the same bits as glibc's (2.28+) expf on an FMA machine ----
 * glibc's expf is the table method of ARM's optimized-routines: x in double, k = round(x * 32 /
 * ln2) by the shift trick, r the remainder, 2^(k/32) from a 32-entry table, a degree-3
 * polynomial in r, all with FMAs where __expf_fma has them (read off its disassembly), one
 * rounding to float at the end. Lanes outside its main path (|x| >= 88: huge, tiny, inf, NaN)
 * call expf itself. cpu.c checks the result against libm's expf on a sweep of inputs before
 * using it (a libm with another algorithm keeps the scalar calls). */

static inline __m256 exp8(__m256 x)
{
    const __m512d xd = _mm512_cvtps_pd(x);
    const __m512d inv = _mm512_set1_pd(0x1.71547652b82fep+5), shift = _mm512_set1_pd(0x1.8p+52);
    const __m512d z = _mm512_fmadd_pd(inv, xd, shift);
    const __m512i ki = _mm512_castpd_si512(z);
    const __m512d kd = _mm512_sub_pd(z, shift);
    const __m512d r = _mm512_fmsub_pd(inv, xd, kd);
    const __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
    const __m512i *tab = (const __m512i *)cpu_exp_tab;
    const __m512i lo =
        _mm512_permutex2var_epi64(_mm512_loadu_si512(tab), idx, _mm512_loadu_si512(tab + 1));
    const __m512i hi =
        _mm512_permutex2var_epi64(_mm512_loadu_si512(tab + 2), idx, _mm512_loadu_si512(tab + 3));
    __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(idx, _mm512_set1_epi64(16)), lo, hi);
    t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
    const __m512d z2 = _mm512_fmadd_pd(r, _mm512_set1_pd(0x1.c6af84b912394p-20),
                                       _mm512_set1_pd(0x1.ebfce50fac4f3p-13));
    const __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(0x1.62e42ff0c52d6p-6), _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z2, r2, y);
    return _mm512_cvtpd_ps(_mm512_mul_pd(y, _mm512_castsi512_pd(t)));
}

/* exp16: y[0..16) = expf(x[0..16)) (y may be x). */
static inline __attribute__((always_inline)) void exp16(const float *x, float *y)
{
    const __m512 v = _mm512_loadu_ps(x);
    const __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(exp8(_mm512_castps512_ps256(v))),
                                        exp8(_mm512_extractf32x8_ps(v, 1)), 1);
    /* glibc's main path takes (bits >> 20 & 0x7ff) <= 0x42a: |x| below about 88 */
    const __m512i top =
        _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 20), _mm512_set1_epi32(0x7ff));
    __mmask16 odd = _mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(0x42a));
    /* the others from libm, from a copy of the inputs: y may be x (a softmax in place), and
     * the store below overwrites them (exp8 of -inf, a masked key's score, is not 0) */
    _Alignas(64) float in[16];
    if (odd) _mm512_store_ps(in, v);
    _mm512_storeu_ps(y, e);
    cpu_expf_libm_lanes(y, in, odd);
}

void cpu_expf_avx512(const float *x, float *y, uint32_t n)
{
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16)
        exp16(x + i, y + i);
    if (i < n) { /* the tail through a padded copy (each lane is its own): no scalar calls */
        _Alignas(64) float t[16] = {0};
        memcpy(t, x + i, (n - i) * sizeof(float));
        exp16(t, t);
        memcpy(y + i, t, (n - i) * sizeof(float));
    }
}

/* block_max: the largest of s[0..nb), s[j] > max ? s[j] : max from -inf as ops_attention's loop
 * (a NaN never wins), on lanes: the maximum does not depend on the order (only the sign of a zero
 * can, and a zero's sign is lost in every use: s - max and m - max only reach expf). */
static inline float block_max(const float *s, uint32_t nb)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __mmask16 k0 = nb >= 16 ? 0xffff : (__mmask16)((1u << nb) - 1),
                    k1 = nb >= 32  ? 0xffff
                         : nb > 16 ? (__mmask16)((1u << (nb - 16)) - 1)
                                   : 0;
    __m512 v = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, k0, s), ninf);
    v = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, k1, s + 16), v);
    return _mm512_reduce_max_ps(v); /* a tree of maxima: no lane holds a NaN */
}

/* softmax_block: ops_attention's online-softmax update of the block's nq queries, query q with
 * scores s[q] over nb[q] keys, output o[q], running max m[q] and sum l[q]: step for step per
 * query, the queries side by side so the sums' dependent adds (in key order, as the reference
 * adds them) overlap, then each query's values. */
static void softmax_block(uint32_t nq, float *const *o, float *const *m, float *const *l,
                          float (*s)[KB], const uint32_t *nb, const void *const *vrow, bool h16,
                          uint32_t head_dim_v, int vexp, const char *pv, size_t pv_step)
{
    float c[CPU_ATT_MAXQ], mn[CPU_ATT_MAXQ], sum[CPU_ATT_MAXQ];
    for (uint32_t q = 0; q < nq; q++) {
        const float bm = block_max(s[q], nb[q]);
        mn[q] = bm > *m[q] ? bm : *m[q];
        c[q] = *m[q] - mn[q]; /* its expf below: 0 on the first block, where m is -inf */
        if (vexp) {
            for (uint32_t j = 0; j < nb[q]; j++)
                s[q][j] -= mn[q];
            cpu_expf_avx512(s[q], s[q], nb[q]);
        } else {
            for (uint32_t j = 0; j < nb[q]; j++)
                s[q][j] = expf(s[q][j] - mn[q]);
        }
    }
    if (vexp) /* the queries' rescales in vectors, not one libm call a query */
        cpu_expf_avx512(c, c, nq);
    else
        for (uint32_t q = 0; q < nq; q++)
            c[q] = expf(c[q]);
    for (uint32_t q = 0; q < nq; q++)
        sum[q] = *l[q] * c[q];
    cpu_att_sums(nq, sum, (const float(*)[KB])s, nb);
    uint32_t q = 0;
    if (head_dim_v % 64 == 0)
        for (; q + 4 <= nq; q += 4) {
            float *const pq[4] = {s[q], s[q + 1], s[q + 2], s[q + 3]};
            if (pv)
                values4_pf(o + q, c + q, pq, vrow, nb + q, head_dim_v, h16, pv, pv_step);
            else
                values4(o + q, c + q, pq, vrow, nb + q, head_dim_v, h16);
        }
    for (; q < nq; q++)
        values_block(o[q], c[q], s[q], vrow, nb[q], head_dim_v, h16);
    for (q = 0; q < nq; q++) {
        *l[q] = sum[q];
        *m[q] = mn[q];
    }
}

void cpu_attention_avx512(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v,
                          float scale, const struct ops_kv_view *kv, int vexp)
{
    _Alignas(64) float kt[CPU_ATT_MAXD][KB];
    _Alignas(64) float sc[CPU_ATT_MAXQ + 1][KB]; /* the block's queries' scores (one spare) */
    const void *krow[KB], *vrow[KB];
    const bool h16 = kv->hblocks != NULL; /* fp16 rows read in place, converted in registers */
    float m[CPU_ATT_MAXQ], l[CPU_ATT_MAXQ];
    float *oq[CPU_ATT_MAXQ], *mq[CPU_ATT_MAXQ], *lq[CPU_ATT_MAXQ];
    uint32_t nbq[CPU_ATT_MAXQ];
    const uint32_t nq = a->n_tok * a->n_head, max_keys = a->n_keys0 + a->n_tok - 1;
    const bool in_place = cpu_att_in_place(kv, nq);
    for (uint32_t i = 0; i < nq; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        memset(a->out + (i / a->n_head) * a->out_tok + (i % a->n_head) * a->out_head, 0,
               head_dim_v * sizeof(float));
    }
    /* a window: blocks aligned to key 0 as ops_attention_ex's, from the first query's first */
    for (uint32_t j0 = cpu_att_lo(a, 0) / KB * KB; j0 < max_keys; j0 += KB) {
        const uint32_t nbmax = max_keys - j0 < KB ? max_keys - j0 : KB;
        cpu_att_rows(kv, j0, nbmax, krow, vrow);
        const char *pk = NULL, *pv = NULL;
        size_t pv_step = 0;
        /* in the loops when one group of 4 takes the block: scores4_cols_pf, values4_pf */
        const bool spread = cpu_att_ahead(
            kv, j0, max_keys, in_place && nq == 4 && head_dim_v % 64 == 0, &pk, &pv, &pv_step);
        if (!spread) cpu_att_prefetch(kv, j0 + KB, max_keys, head_dim, head_dim_v);
        if (!in_place) transpose_block(kv, j0, krow, nbmax, head_dim, kt, h16);
        /* queries four at a time; each takes the block only when it has keys in it (a key at
         * or past j0, a window reaching j0 + KB): the group's tokens may differ */
        uint32_t na = 0;
        for (uint32_t i = 0; i < nq; i += 4) {
            uint32_t qi[4], nq4 = 0;
            for (uint32_t k = i; k < i + 4 && k < nq; k++) {
                const uint32_t t = k / a->n_head;
                if (a->n_keys0 + t > j0 && j0 + KB > cpu_att_lo(a, t)) qi[nq4++] = k;
            }
            if (!nq4) continue;
            const float *qp[4];
            float *sp[4];
            for (uint32_t k = 0; k < 4; k++) {
                const uint32_t x = qi[k < nq4 ? k : 0];
                qp[k] = a->q + (x / a->n_head) * a->q_tok + (x % a->n_head) * a->q_head;
                sp[k] = sc[k < nq4 ? na + k : CPU_ATT_MAXQ]; /* a missing query's: the spare */
            }
            if (spread)
                scores4_cols_pf(qp, krow[0], kv->block_tokens, head_dim, scale, sp, h16, pk);
            else if (in_place)
                scores4_cols(qp, krow[0], kv->block_tokens, head_dim, scale, sp, h16);
            else
                scores4(qp, kt, head_dim, scale, sp);
            for (uint32_t k = 0; k < nq4; k++, na++) {
                const uint32_t t = qi[k] / a->n_head, h = qi[k] % a->n_head;
                const uint32_t n = a->n_keys0 + t - j0, lo = cpu_att_lo(a, t);
                for (uint32_t j = 0; j0 + j < lo; j++)
                    sc[na][j] = -INFINITY; /* before the window: weight 0 */
                nbq[na] = n < KB ? n : KB;
                oq[na] = a->out + t * a->out_tok + h * a->out_head;
                mq[na] = &m[qi[k]];
                lq[na] = &l[qi[k]];
            }
        }
        softmax_block(na, oq, mq, lq, sc, nbq, vrow, h16, head_dim_v, vexp, pv, pv_step);
    }
    for (uint32_t i = 0; i < nq; i++) {
        float *o = a->out + (i / a->n_head) * a->out_tok + (i % a->n_head) * a->out_head;
        if (a->sinks) ops_attention_sink(o, head_dim_v, &m[i], &l[i], a->sinks[i % a->n_head]);
        const float inv = 1.0f / l[i];
        const __m512 iv = _mm512_set1_ps(inv);
        uint32_t d = 0;
        for (; d + 16 <= head_dim_v; d += 16)
            _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), iv));
        for (; d < head_dim_v; d++)
            o[d] *= inv;
    }
}

/* hsum_epi32 adds v's 16 lanes with the vector adds' wrap-around: garbage activations (a NaN
 * converts to INT32_MIN) must give garbage sums, not the signed overflow of a scalar reduction
 * (_mm512_reduce_add_epi32 is plain C addition in GCC's headers, which UBSan stops on). */
static int32_t hsum_epi32(__m512i v)
{
    const __m256i a = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i b = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    b = _mm_add_epi32(b, _mm_shuffle_epi32(b, _MM_SHUFFLE(1, 0, 3, 2)));
    b = _mm_add_epi32(b, _mm_shuffle_epi32(b, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(b);
}

/* q8_K_block is quant_q8_K of one block: the element of largest magnitude (the first on ties)
 * sets the scale -max/127, levels nearest-even (the FPU's rounding, as quant_nearest_int), capped
 * at 127, bsums per 16. */
static void q8_K_block(const float *x, struct blk_q8_K *y)
{
    __m512 v[16], am = _mm512_setzero_ps();
    for (int k = 0; k < 16; k++) {
        v[k] = _mm512_loadu_ps(x + 16 * k);
        am = _mm512_max_ps(am, _mm512_abs_ps(v[k]));
    }
    const float amax = _mm512_reduce_max_ps(am);
    if (amax == 0.0f) {
        memset(y, 0, sizeof *y);
        return;
    }
    float max = 0.0f;
    for (int k = 0; k < 16; k++) {
        const __mmask16 hit =
            _mm512_cmp_ps_mask(_mm512_abs_ps(v[k]), _mm512_set1_ps(amax), _CMP_EQ_OQ);
        if (hit) {
            max = x[16 * k + __builtin_ctz(hit)];
            break;
        }
    }
    const float iscale = -127.f / max;
    const __m512 is = _mm512_set1_ps(iscale);
    for (int k = 0; k < 16; k++) {
        const __m512i q =
            _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(is, v[k])), _mm512_set1_epi32(127));
        _mm_storeu_si128((__m128i *)(y->qs + 16 * k), _mm512_cvtepi32_epi8(q));
        y->bsums[k] = (int16_t)hsum_epi32(q);
    }
    y->d = 1 / iscale;
}

/* q8_0_block is quant_quantize(QT_Q8_0) of one block: scale amax/127 (stored as fp16), levels
 * roundf (half away from zero) of x / scale. */
static void q8_0_block(const float *x, struct blk_q8_0 *y)
{
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float d = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    y->d = quant_f32_to_f16(d);
    const __m512 iv = _mm512_set1_ps(id), half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512 src[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        const __m512 v = _mm512_mul_ps(src[k], iv);
        /* roundf: truncate, then step away from zero when the dropped part is >= 1/2 (exact) */
        const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __mmask16 up =
            _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), half, _CMP_GE_OQ);
        const __m512 step = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(one),
            _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN))));
        const __m512 r = _mm512_mask_add_ps(t, up, t, step);
        _mm_storeu_si128((__m128i *)(y->qs + 16 * k), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r)));
    }
}

int cpu_quantize_acts_avx512(uint32_t wtype, const float *x, size_t x_stride, uint32_t n_in,
                             uint32_t n_tok, void *dst, size_t act_stride)
{
    const uint32_t at = quant_act_type(wtype);
    if ((at != QT_Q8_K || n_in % QK_K) && (at != QT_Q8_0 || n_in % QK_LEGACY))
        return ops_quantize_acts(wtype, x, x_stride, n_in, n_tok, dst, act_stride);
    for (uint32_t t = 0; t < n_tok; t++) {
        const float *xr = x + t * x_stride;
        uint8_t *d = (uint8_t *)dst + t * act_stride;
        if (at == QT_Q8_K)
            for (uint32_t b = 0; b < n_in / QK_K; b++)
                q8_K_block(xr + b * QK_K, (struct blk_q8_K *)d + b);
        else
            for (uint32_t b = 0; b < n_in / QK_LEGACY; b++)
                q8_0_block(xr + b * QK_LEGACY, (struct blk_q8_0 *)d + b);
    }
    return 0;
}

#ifdef __clang__
#pragma clang attribute pop
#endif

#else
void cpu_expf_avx512(const float *x, float *y, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        y[i] = expf(x[i]);
}
int cpu_quantize_acts_avx512(uint32_t wtype, const float *x, size_t x_stride, uint32_t n_in,
                             uint32_t n_tok, void *dst, size_t act_stride)
{
    return ops_quantize_acts(wtype, x, x_stride, n_in, n_tok, dst, act_stride);
}
void cpu_attention_avx512(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v,
                          float scale, const struct ops_kv_view *kv, int vexp)
{
    (void)vexp;
    cpu_attention_avx2(a, head_dim, head_dim_v, scale, kv, 0);
}
#endif
