/* qdot — reference dot products. Each weight block is first decoded to its integer form
 * (w_i = d * sc_s * q_i - dmin * m_s + m, the form every fast kernel computes with), then combined
 * with the activation block in the order qdot.h states. Slow on purpose: one clear loop per step.
 */
#include "kernels/ref/qdot.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "common/quant/quant_blocks.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define F16(h) quant_f16_to_f32(h)

/* One weight block in integer form: w_i = d * sc[i / sublen] * q[i] - dmin * mn[i / sublen] + m. */
struct wblock {
    int n, sublen;
    float d, dmin, m;
    int32_t sc[16], mn[16];
    int32_t q[QK_K];
};

/* nibbles32 decodes 16 bytes of a 32-element nibble block (element j low, j+16 high). */
static void nibbles32(const uint8_t *qs, int32_t *q)
{
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 0xF;
        q[j + 16] = qs[j] >> 4;
    }
}

static void fifth_bits(const uint8_t *qh, int32_t *q)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    for (int j = 0; j < 32; j++)
        q[j] |= (int32_t)((h >> j) & 1) << 4;
}

/* decode fills b from the block at p of type t (a computable quantized type). */
static void decode(uint32_t t, const uint8_t *p, struct wblock *b)
{
    memset(b, 0, sizeof *b);
    b->n = b->sublen = QK_LEGACY;
    b->sc[0] = 1;
    switch (t) {
    case QT_Q4_0: {
        const struct blk_q4_0 *x = (const void *)p;
        b->d = F16(x->d);
        nibbles32(x->qs, b->q);
        for (int j = 0; j < 32; j++)
            b->q[j] -= 8;
        return;
    }
    case QT_Q4_1: {
        const struct blk_q4_1 *x = (const void *)p;
        b->d = F16(x->d);
        b->m = F16(x->m);
        nibbles32(x->qs, b->q);
        return;
    }
    case QT_Q5_0: {
        const struct blk_q5_0 *x = (const void *)p;
        b->d = F16(x->d);
        nibbles32(x->qs, b->q);
        fifth_bits(x->qh, b->q);
        for (int j = 0; j < 32; j++)
            b->q[j] -= 16;
        return;
    }
    case QT_Q5_1: {
        const struct blk_q5_1 *x = (const void *)p;
        b->d = F16(x->d);
        b->m = F16(x->m);
        nibbles32(x->qs, b->q);
        fifth_bits(x->qh, b->q);
        return;
    }
    case QT_Q8_0: {
        const struct blk_q8_0 *x = (const void *)p;
        b->d = F16(x->d);
        for (int j = 0; j < 32; j++)
            b->q[j] = x->qs[j];
        return;
    }
    case QT_MXFP4: {
        const struct blk_mxfp4 *x = (const void *)p;
        b->d = quant_e8m0_half(x->e);
        nibbles32(x->qs, b->q);
        for (int j = 0; j < 32; j++)
            b->q[j] = quant_mxfp4_values[b->q[j]];
        return;
    }
    case QT_IQ4_NL: {
        const struct blk_iq4_nl *x = (const void *)p;
        b->d = F16(x->d);
        nibbles32(x->qs, b->q);
        for (int j = 0; j < 32; j++)
            b->q[j] = quant_iq4nl_values[b->q[j]];
        return;
    }
    default:
        break;
    }
    b->n = QK_K;
    switch (t) {
    case QT_Q2_K: {
        const struct blk_q2_K *x = (const void *)p;
        b->sublen = 16;
        b->d = F16(x->d);
        b->dmin = F16(x->dmin);
        for (int s = 0; s < 16; s++) {
            b->sc[s] = x->scales[s] & 0xF;
            b->mn[s] = x->scales[s] >> 4;
        }
        for (int e = 0; e < QK_K; e++)
            b->q[e] = (x->qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
        return;
    }
    case QT_Q3_K: {
        const struct blk_q3_K *x = (const void *)p;
        int8_t sc[16];
        b->sublen = 16;
        b->d = F16(x->d);
        quant_k3_scales(x->scales, sc);
        for (int s = 0; s < 16; s++)
            b->sc[s] = sc[s] - 32;
        for (int e = 0; e < QK_K; e++) {
            int low = (x->qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
            int high = (x->hmask[e % 32] >> (e / 32)) & 1;
            b->q[e] = low - (high ? 0 : 4);
        }
        return;
    }
    case QT_Q4_K:
    case QT_Q5_K: {
        /* Q4_K and Q5_K share the head (d, dmin, scales[12]) and the low-nibble layout */
        const struct blk_q4_K *x4 = (const void *)p;
        const struct blk_q5_K *x5 = (const void *)p;
        const uint8_t *qs = t == QT_Q4_K ? x4->qs : x5->qs;
        b->sublen = 32;
        b->d = F16(x4->d);
        b->dmin = F16(x4->dmin);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, m;
            quant_k4_scale_min(s, x4->scales, &sc, &m);
            b->sc[s] = sc;
            b->mn[s] = m;
        }
        for (int e = 0; e < QK_K; e++) {
            int c = e / 64, hi = e % 64 / 32, l = e % 32;
            b->q[e] = hi ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xF;
            if (t == QT_Q5_K) b->q[e] |= ((x5->qh[l] >> (2 * c + hi)) & 1) << 4;
        }
        return;
    }
    case QT_Q6_K: {
        const struct blk_q6_K *x = (const void *)p;
        b->sublen = 16;
        b->d = F16(x->d);
        for (int s = 0; s < 16; s++)
            b->sc[s] = x->scales[s];
        for (int e = 0; e < QK_K; e++) {
            int h = e / 128, k = e % 128 / 32, l = e % 32;
            uint8_t lo = x->ql[64 * h + l + 32 * (k & 1)];
            int low = k < 2 ? lo & 0xF : lo >> 4;
            int high = (x->qh[32 * h + l] >> (2 * k)) & 3;
            b->q[e] = (low | high << 4) - 32;
        }
        return;
    }
    default: {
        const struct blk_iq4_xs *x = (const void *)p;
        b->sublen = 32;
        b->d = F16(x->d);
        for (int s = 0; s < 8; s++) {
            int ls =
                ((x->scales_l[s / 2] >> 4 * (s % 2)) & 0xf) | (((x->scales_h >> 2 * s) & 3) << 4);
            b->sc[s] = ls - 32;
            nibbles32(x->qs + 16 * s, b->q + 32 * s);
        }
        for (int e = 0; e < QK_K; e++)
            b->q[e] = quant_iq4nl_values[b->q[e]];
        return;
    }
    }
}

/* act_block gives the integer activations and scale of the activation block starting at element
 * e of a Q8_0 or Q8_K row. */
static const int8_t *act_block(uint32_t at, const void *act, int64_t e, float *dx)
{
    if (at == QT_Q8_0) {
        const struct blk_q8_0 *a = (const struct blk_q8_0 *)act + e / QK_LEGACY;
        *dx = F16(a->d);
        return a->qs;
    }
    const struct blk_q8_K *a = (const struct blk_q8_K *)act + e / QK_K;
    *dx = a->d;
    return a->qs;
}

static bool is_float(uint32_t t)
{
    return t == QT_F32 || t == QT_F16 || t == QT_BF16;
}

static bool valid(uint32_t t, int64_t n)
{
    const struct qtype_info *i = qtype_get(t);
    return i && i->computable && n >= 0 && n % i->blck == 0;
}

float qdot_f32(uint32_t wtype, int64_t n, const void *w_row, const float *x)
{
    if (!valid(wtype, n)) return NAN;
    /* 256 elements is a whole number of blocks of every type; a row's tail may be shorter */
    float w[QK_K];
    uint64_t chunk_bytes = 0;
    qtype_row_bytes(wtype, QK_K, &chunk_bytes);
    const uint8_t *p = w_row;
    double sum = 0;
    for (int64_t e = 0; e < n; e += QK_K, p += chunk_bytes) {
        int64_t len = n - e < QK_K ? n - e : QK_K;
        quant_dequantize(wtype, p, w, len);
        for (int64_t i = 0; i < len; i++)
            sum += (double)w[i] * x[e + i];
    }
    return (float)sum;
}

float qdot_ref(uint32_t wtype, int64_t n, const void *w_row, const void *act)
{
    if (!valid(wtype, n)) return NAN;
    if (is_float(wtype)) return qdot_f32(wtype, n, w_row, act);
    const struct qtype_info *ti = qtype_get(wtype);
    const uint32_t at = quant_act_type(wtype);
    const uint8_t *p = w_row;
    struct wblock b;
    float sum = 0;
    for (int64_t e = 0; e < n; e += ti->blck, p += ti->bytes) {
        decode(wtype, p, &b);
        float dx = 0;
        const int8_t *qx = act_block(at, act, e, &dx);
        int32_t isum = 0, msum = 0, xsum = 0;
        for (int s = 0; s < b.n / b.sublen; s++) {
            int32_t dot = 0, bsum = 0;
            for (int i = s * b.sublen; i < (s + 1) * b.sublen; i++) {
                dot += b.q[i] * qx[i];
                bsum += qx[i];
            }
            isum += b.sc[s] * dot;
            msum += b.mn[s] * bsum;
            xsum += bsum;
        }
        sum += (dx * b.d) * (float)isum - (dx * b.dmin) * (float)msum + (dx * b.m) * (float)xsum;
    }
    return sum;
}

double qdot_ref_bound(uint32_t wtype, int64_t n, const void *w_row, const float *x)
{
    if (!valid(wtype, n)) return NAN;
    float w[QK_K];
    uint64_t chunk_bytes = 0;
    qtype_row_bytes(wtype, QK_K, &chunk_bytes);
    if (is_float(wtype)) {
        const uint8_t *p = w_row;
        double s = 0;
        for (int64_t e = 0; e < n; e += QK_K, p += chunk_bytes) {
            int64_t len = n - e < QK_K ? n - e : QK_K;
            quant_dequantize(wtype, p, w, len);
            for (int64_t i = 0; i < len; i++)
                s += fabs((double)w[i] * x[e + i]);
        }
        return s * 0x1p-23;
    }
    const struct qtype_info *ti = qtype_get(wtype);
    const bool q8_0 = quant_act_type(wtype) == QT_Q8_0;
    const int ablk = q8_0 ? QK_LEGACY : QK_K;
    const double rho = (q8_0 ? 1.0 / 254 + 0x1p-11 : 1.0 / 254) * (1 + 0x1p-14);
    const double tau = q8_0 ? 127 * 0x1p-25 : 0;
    const uint8_t *p = w_row;
    struct wblock b;
    double act_err = 0, parts = 0;
    for (int64_t e = 0; e < n; e += ti->blck, p += ti->bytes) {
        decode(wtype, p, &b);
        quant_dequantize(wtype, p, w, ti->blck);
        for (int a = 0; a < b.n; a += ablk) {
            double amax = 0, wabs = 0;
            for (int i = a; i < a + ablk; i++)
                amax = fmax(amax, fabs(x[e + i]));
            const double delta = amax * rho + tau;
            for (int i = a; i < a + ablk; i++) {
                const int s = i / b.sublen;
                const double P = fabs((double)b.d * b.sc[s] * b.q[i]) +
                                 fabs((double)b.dmin * b.mn[s]) + fabs(b.m);
                wabs += fabs(w[i]);
                parts += P * (fabs(x[e + i]) + delta);
            }
            act_err += delta * wabs;
        }
    }
    const double nb = (double)n / ablk;
    return act_err + (nb + 8) * 0x1p-24 * parts;
}
