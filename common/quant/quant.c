/* quant — dispatch, fp16/bf16, the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the
 * activation formats. The K-quants live in quant_k.c, IQ4_NL/IQ4_XS in quant_iq.c, MXFP4 in
 * quant_mx.c.
 *
 * Bit-exactness with ggml depends on every float expression being evaluated as written: GCC in ISO
 * mode (-std=c11) does not contract a*b+c into an FMA; clang does unless told not to (below).
 */
#include "common/quant/quant.h"
#include "common/base/err.h"
#include "common/quant/qtype.h"
#include "common/quant/quant_blocks.h"

#include <float.h>
#include <stdatomic.h>
#include <math.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- fp16 / bf16 ----------------------------------------------------------------------------- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float quant_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000 | (man << 13));
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 is exact in float */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

#if defined(__x86_64__) && !defined(STRATA_NO_QDOT_SIMD)
#include <immintrin.h>

/* f16_rows_f16c: 8 halves a vcvtph2ps (the conversion is exact); a group holding a signaling NaN
 * goes through quant_f16_to_f32, which keeps its quiet bit clear where the instruction sets it */
__attribute__((target("avx,f16c"))) static void f16_rows_f16c(const uint16_t *h, float *f, size_t n)
{
    const __m128i e = _mm_set1_epi16(0x7e00), inf = _mm_set1_epi16(0x7c00),
                  man = _mm_set1_epi16(0x03ff), zero = _mm_setzero_si128();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(h + i));
        const __m128i snan = _mm_andnot_si128(_mm_cmpeq_epi16(_mm_and_si128(v, man), zero),
                                              _mm_cmpeq_epi16(_mm_and_si128(v, e), inf));
        if (_mm_movemask_epi8(snan)) {
            for (size_t k = i; k < i + 8; k++)
                f[k] = quant_f16_to_f32(h[k]);
            continue;
        }
        _mm256_storeu_ps(f + i, _mm256_cvtph_ps(v));
    }
    for (; i < n; i++)
        f[i] = quant_f16_to_f32(h[i]);
}
#endif

void quant_f16_to_f32_rows(const uint16_t *h, float *f, size_t n)
{
#if defined(__x86_64__) && !defined(STRATA_NO_QDOT_SIMD)
    /* every AVX2 CPU has F16C, and "avx2" (unlike "f16c", which clang's builtin does not know)
     * also says the OS saves the ymm state the instruction needs; asked once */
    static _Atomic int have; /* 0: not asked, 1: yes, 2: no */
    int known = atomic_load_explicit(&have, memory_order_relaxed);
    if (!known) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") ? 1 : 2;
        atomic_store_explicit(&have, known, memory_order_relaxed);
    }
    if (known == 1) {
        f16_rows_f16c(h, f, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        f[i] = quant_f16_to_f32(h[i]);
}

uint16_t quant_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffff;
    if (a > 0x7f800000) return sign | 0x7e00;  /* NaN: a quiet NaN, as ggml */
    if (a >= 0x477ff000) return sign | 0x7c00; /* >= 65520 rounds to infinity */
    if (a >= 0x38800000) {                     /* a normal half: rebias the exponent, round */
        uint32_t h = a - (112u << 23);
        return sign | (uint16_t)((h + 0xfff + ((h >> 13) & 1)) >> 13);
    }
    if (a <= 0x33000000) return sign; /* at most 2^-25: rounds (ties to even) to zero */
    /* a subnormal half: count units of 2^-24, rounding the shifted-out bits to nearest even */
    uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000, shift = 126 - e;
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return sign | (uint16_t)r;
}

float quant_bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

uint16_t quant_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64); /* keep NaN quiet */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

#define F16(h) quant_f16_to_f32(h)

/* ---- 32-element formats: ggml's quantize_row_*_ref and dequantize_row_* ------------------------
 */

static void min_max(const float *x, int n, float *min, float *max)
{
    *min = FLT_MAX;
    *max = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

/* Both nibble formats put element j in the low and element j+16 in the high nibble of qs[j]; the
 * 5-bit ones keep the fifth bits in qh, element j at bit j. */
static void q4_0_quantize(const float *x, struct blk_q4_0 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK_LEGACY) {
        const float d = quant_amax_signed(x, QK_LEGACY) / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = quant_f32_to_f16(d);
        for (int j = 0; j < 16; j++) {
            int q0 = (int)(x[j] * id + 8.5f), q1 = (int)(x[j + 16] * id + 8.5f);
            y[i].qs[j] = (uint8_t)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
        }
    }
}

static void q4_1_quantize(const float *x, struct blk_q4_1 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK_LEGACY) {
        float min, max;
        min_max(x, QK_LEGACY, &min, &max);
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = quant_f32_to_f16(d);
        y[i].m = quant_f32_to_f16(min);
        for (int j = 0; j < 16; j++) {
            int q0 = (int)((x[j] - min) * id + 0.5f), q1 = (int)((x[j + 16] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
        }
    }
}

static void pack5(const int *q, uint8_t *qs, uint8_t *qh)
{
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
        h |= (uint32_t)((q[j] >> 4) & 1) << j;
        h |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    memcpy(qh, &h, 4);
}

static void q5_0_quantize(const float *x, struct blk_q5_0 *y, int64_t nb)
{
    int q[QK_LEGACY];
    for (int64_t i = 0; i < nb; i++, x += QK_LEGACY) {
        const float d = quant_amax_signed(x, QK_LEGACY) / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = quant_f32_to_f16(d);
        for (int j = 0; j < QK_LEGACY; j++) {
            q[j] = (int)(x[j] * id + 16.5f);
            if (q[j] > 31) q[j] = 31;
        }
        pack5(q, y[i].qs, y[i].qh);
    }
}

static void q5_1_quantize(const float *x, struct blk_q5_1 *y, int64_t nb)
{
    int q[QK_LEGACY];
    for (int64_t i = 0; i < nb; i++, x += QK_LEGACY) {
        float min, max;
        min_max(x, QK_LEGACY, &min, &max);
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = quant_f32_to_f16(d);
        y[i].m = quant_f32_to_f16(min);
        /* no clamp: (x - min) * id + 0.5 stays below 32 (ggml does not clamp either) */
        for (int j = 0; j < QK_LEGACY; j++)
            q[j] = (int)((x[j] - min) * id + 0.5f);
        pack5(q, y[i].qs, y[i].qh);
    }
}

static void q8_0_quantize(const float *x, struct blk_q8_0 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK_LEGACY) {
        float amax = 0.0f;
        for (int j = 0; j < QK_LEGACY; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = quant_f32_to_f16(d);
        for (int j = 0; j < QK_LEGACY; j++)
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void q4_0_dequantize(const struct blk_q4_0 *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK_LEGACY) {
        const float d = F16(x[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = ((x[i].qs[j] & 0xF) - 8) * d;
            y[j + 16] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void q4_1_dequantize(const struct blk_q4_1 *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK_LEGACY) {
        const float d = F16(x[i].d), m = F16(x[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (x[i].qs[j] & 0xF) * d + m;
            y[j + 16] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

/* unpack5 rebuilds the 5-bit values of a Q5_0/Q5_1 block. */
static void unpack5(const uint8_t *qs, const uint8_t *qh, int *q)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0xF) | (int)((h >> j) & 1) << 4;
        q[j + 16] = (qs[j] >> 4) | (int)((h >> (j + 16)) & 1) << 4;
    }
}

static void q5_0_dequantize(const struct blk_q5_0 *x, float *y, int64_t nb)
{
    int q[QK_LEGACY];
    for (int64_t i = 0; i < nb; i++, y += QK_LEGACY) {
        const float d = F16(x[i].d);
        unpack5(x[i].qs, x[i].qh, q);
        for (int j = 0; j < QK_LEGACY; j++)
            y[j] = (q[j] - 16) * d;
    }
}

static void q5_1_dequantize(const struct blk_q5_1 *x, float *y, int64_t nb)
{
    int q[QK_LEGACY];
    for (int64_t i = 0; i < nb; i++, y += QK_LEGACY) {
        const float d = F16(x[i].d), m = F16(x[i].m);
        unpack5(x[i].qs, x[i].qh, q);
        for (int j = 0; j < QK_LEGACY; j++)
            y[j] = q[j] * d + m;
    }
}

static void q8_0_dequantize(const struct blk_q8_0 *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK_LEGACY) {
        const float d = F16(x[i].d);
        for (int j = 0; j < QK_LEGACY; j++)
            y[j] = x[i].qs[j] * d;
    }
}

/* ---- Q8_K activations (ggml's quantize_row_q8_K_ref) ------------------------------------------
 */

void quant_q8_K(const float *x, struct blk_q8_K *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max = quant_amax_signed(x, QK_K);
        if (max == 0.0f) {
            /* ggml leaves bsums unset here; zeros keep the output deterministic */
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = quant_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++)
                sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* ---- dispatch -------------------------------------------------------------------------------- */

/* check_row validates type and length for the functions below; *nb gets the block count. */
static int check_row(uint32_t type, int64_t n, const char *what, int64_t *nb)
{
    const struct qtype_info *t = qtype_get(type);
    if (!t || !t->computable)
        return strata_errf(
            STRATA_EUNSUPPORTED,
            "cannot %s tensor type %s: strata computes with f32, f16, bf16, q4_0, q4_1, "
            "q5_0, q5_1, q8_0, q2_K..q6_K, iq4_nl, iq4_xs and mxfp4",
            what, qtype_name(type));
    if (n < 0 || n % t->blck)
        return strata_errf(STRATA_EINVAL,
                           "cannot %s %lld elements as %s: not a multiple of its %u-element block",
                           what, (long long)n, t->name, t->blck);
    *nb = n / t->blck;
    return 0;
}

int quant_dequantize(uint32_t type, const void *src, float *dst, int64_t n)
{
    int64_t nb = 0;
    int rv = check_row(type, n, "dequantize", &nb);
    if (rv) return rv;
    switch (type) {
    case QT_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case QT_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = quant_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case QT_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = quant_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case QT_Q4_0:
        q4_0_dequantize(src, dst, nb);
        break;
    case QT_Q4_1:
        q4_1_dequantize(src, dst, nb);
        break;
    case QT_Q5_0:
        q5_0_dequantize(src, dst, nb);
        break;
    case QT_Q5_1:
        q5_1_dequantize(src, dst, nb);
        break;
    case QT_Q8_0:
        q8_0_dequantize(src, dst, nb);
        break;
    case QT_IQ4_NL:
    case QT_IQ4_XS:
        quant_iq_dequantize(type, src, dst, nb);
        break;
    case QT_MXFP4:
        quant_mxfp4_dequantize(src, dst, nb);
        break;
    default:
        quant_k_dequantize(type, src, dst, nb);
        break;
    }
    return 0;
}

bool quant_can_quantize(uint32_t type)
{
    const struct qtype_info *t = qtype_get(type);
    return t && t->computable;
}

int quant_quantize(uint32_t type, const float *src, void *dst, int64_t n)
{
    int64_t nb = 0;
    int rv = check_row(type, n, "quantize to", &nb);
    if (rv) return rv;
    switch (type) {
    case QT_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case QT_F16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = quant_f32_to_f16(src[i]);
        break;
    case QT_BF16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = quant_f32_to_bf16(src[i]);
        break;
    case QT_Q4_0:
        q4_0_quantize(src, dst, nb);
        break;
    case QT_Q4_1:
        q4_1_quantize(src, dst, nb);
        break;
    case QT_Q5_0:
        q5_0_quantize(src, dst, nb);
        break;
    case QT_Q5_1:
        q5_1_quantize(src, dst, nb);
        break;
    case QT_Q8_0:
        q8_0_quantize(src, dst, nb);
        break;
    case QT_IQ4_NL:
    case QT_IQ4_XS:
        quant_iq_quantize(type, src, dst, nb);
        break;
    case QT_MXFP4:
        quant_mxfp4_quantize(src, dst, nb);
        break;
    default:
        quant_k_quantize(type, src, dst, nb);
        break;
    }
    return 0;
}

uint32_t quant_act_type(uint32_t wtype)
{
    const struct qtype_info *t = qtype_get(wtype);
    if (!t || t->blck == 1) return QT_F32;
    return t->blck == QK_K ? QT_Q8_K : QT_Q8_0;
}

uint64_t quant_act_bytes(uint32_t wtype, int64_t n)
{
    uint64_t bytes = 0;
    if (n < 0 || qtype_row_bytes(quant_act_type(wtype), (uint64_t)n, &bytes) != 0) return 0;
    return bytes;
}

int quant_activations(uint32_t wtype, const float *x, void *dst, int64_t n)
{
    int64_t nb;
    int rv = check_row(wtype, n, "quantize activations for", &nb);
    if (rv) return rv;
    switch (quant_act_type(wtype)) {
    case QT_F32:
        memcpy(dst, x, (size_t)n * sizeof(float));
        break;
    case QT_Q8_0:
        q8_0_quantize(x, dst, n / QK_LEGACY);
        break;
    default:
        quant_q8_K(x, dst, n / QK_K);
        break;
    }
    return 0;
}
