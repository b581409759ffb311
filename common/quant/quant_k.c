/* quant_k — the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): 256-element super-blocks of 16 or 32
 * element sub-blocks whose scales are themselves quantized.
 *
 * The quantizers are ggml's quantize_row_*_ref (what llama-quantize runs without an importance
 * matrix), written expression for expression: the scale searches compare float sums, so a
 * reordered sum picks another scale and changes the bytes. nearest_int is round-half-even through
 * the 1.5 * 2^23 trick, as in ggml. Dequantizers compute d * sc * q - dmin * m in ggml's order.
 */
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "common/quant/quant_blocks.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define F16(h)     quant_f16_to_f32(h)
#define TO16(f)    quant_f32_to_f16(f)
#define MINI(a, b) ((a) < (b) ? (a) : (b))
#define MAXI(a, b) ((a) > (b) ? (a) : (b))

/* Below this magnitude a group counts as all zero (ggml's GROUP_MAX_EPS). */
#define GROUP_MAX_EPS 1e-15f

/* ---- scale searches (ggml's make_qx_quants, make_q3_quants, make_qkx2_quants) ------------------
 */

/* sym_first_pass: the start both symmetric searches share. *max is the element of largest
 * magnitude; L gets the levels -nmax..nmax-1 at scale -nmax / *max, plus offset; *sumlx and *suml2
 * the x^2-weighted sums of l * x and l * l. Returns false, with L zeroed, for an all-zero group. */
static bool sym_first_pass(int n, int nmax, const float *x, int8_t *L, int offset, float *max,
                           float *sumlx, float *suml2)
{
    *max = quant_amax_signed(x, n);
    if (fabsf(*max) < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return false;
    }
    float iscale = -nmax / *max;
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = MAXI(-nmax, MINI(nmax - 1, quant_nearest_int(iscale * x[i])));
        L[i] = (int8_t)(l + offset);
        float w = x[i] * x[i];
        slx += w * x[i] * l;
        sl2 += w * l * l;
    }
    *sumlx = slx;
    *suml2 = sl2;
    return true;
}

/* qx_quants: symmetric levels -nmax..nmax-1, weights x^2, best of 19 trial scales (Q6_K). */
static float qx_quants(int n, int nmax, const float *x, int8_t *L)
{
    float max, sumlx, suml2;
    if (!sym_first_pass(n, nmax, x, L, nmax, &max, &sumlx, &suml2)) return 0.f;
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        float iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = MAXI(-nmax, MINI(nmax - 1, quant_nearest_int(iscale * x[i])));
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                int l = quant_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + MAXI(-nmax, MINI(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* q3_quants: as qx_quants but refines one level at a time (up to 5 sweeps) instead of trying
 * scales (Q3_K). */
static float q3_quants(int n, int nmax, const float *x, int8_t *L)
{
    float max, sumlx, suml2;
    if (!sym_first_pass(n, nmax, x, L, 0, &max, &sumlx, &suml2)) return 0.f;
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = MAXI(-nmax, MINI(nmax - 1, quant_nearest_int(x[i] * sl2 / slx)));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i)
        L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* qkx2_quants: levels 0..nmax with a min (w = scale * l - the_min), least squares over nstep+1
 * trial scales, error weighted by weights (absolute error when use_mad). Q2_K, Q4_K, Q5_K. */
static float qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                         float *the_min, float rmin, float rdelta, int nstep, bool use_mad)
{
    uint8_t Laux[32];
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        int l = quant_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)MAXI(0, MINI(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = MAXI(0, MINI(nmax, quant_nearest_int(iscale * (x[i] - min))));
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* pack2 stores 2-bit levels: byte l of each 32-byte group holds elements l, l+32, l+64, l+96 of
 * its 128 (Q2_K, and Q3_K's low bits). */
static void pack2(const uint8_t *L, uint8_t *qs)
{
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                      (L[j + l + 96] << 6));
}

/* ---- Q2_K ------------------------------------------------------------------------------------ */

static void q2_K_quantize(const float *x, struct blk_q2_K *y, int64_t nb)
{
    uint8_t L[QK_K];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; ++j) {
            for (int l = 0; l < 16; ++l)
                weights[l] = fabsf(x[16 * j + l]);
            scales[j] = qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f,
                                    15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; ++j)
                y[i].scales[j] = (uint8_t)quant_nearest_int(iscale * scales[j]);
            y[i].d = TO16(max_scale / q4scale);
        } else {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = TO16(0.f);
        }
        if (max_min > 0) {
            float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; ++j)
                y[i].scales[j] |= (uint8_t)(quant_nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = TO16(max_min / q4scale);
        } else {
            y[i].dmin = TO16(0.f);
        }
        /* requantize against the rounded scales, as ggml does */
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = F16(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = F16(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ++ii) {
                int l = quant_nearest_int((x[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t)MAXI(0, MINI(3, l));
            }
        }
        pack2(L, y[i].qs);
    }
}

static void q2_K_dequantize(const struct blk_q2_K *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d = F16(x[i].d), min = F16(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int n = 0; n < QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int half = 0; half < 2; half++) {
                    uint8_t sc = x[i].scales[is++];
                    float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                    for (int l = 0; l < 16; ++l)
                        *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
                }
            }
        }
    }
}

/* ---- Q3_K ------------------------------------------------------------------------------------ */

static void q3_K_quantize(const float *x, struct blk_q3_K *y, int64_t nb)
{
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        for (int j = 0; j < QK_K / 16; ++j)
            scales[j] = q3_quants(16, 4, x + 16 * j, L + 16 * j);
        float max_scale = quant_amax_signed(scales, QK_K / 16);
        memset(y[i].scales, 0, 12);
        if (max_scale) {
            float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) {
                int l = MAXI(-32, MINI(31, quant_nearest_int(iscale * scales[j]))) + 32;
                if (j < 8)
                    y[i].scales[j] = (uint8_t)(l & 0xF);
                else
                    y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                y[i].scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = TO16(1 / iscale);
        } else {
            y[i].d = TO16(0.f);
        }
        int8_t sc[16];
        quant_k3_scales(y[i].scales, sc);
        for (int j = 0; j < QK_K / 16; ++j) {
            float d = F16(y[i].d) * (sc[j] - 32);
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii) {
                int l = MAXI(-4, MINI(3, quant_nearest_int(x[16 * j + ii] / d)));
                L[16 * j + ii] = (int8_t)(l + 4);
            }
        }
        /* the high bit of element j goes to bit j/32 of hmask[j%32]; the low two bits to qs */
        uint8_t low[QK_K];
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        for (int j = 0; j < QK_K; ++j) {
            if (L[j] > 3) y[i].hmask[j % 32] |= (uint8_t)(1 << (j / 32));
            low[j] = (uint8_t)(L[j] & 3);
        }
        pack2(low, y[i].qs);
    }
}

static void q3_K_dequantize(const struct blk_q3_K *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d_all = F16(x[i].d);
        const uint8_t *q = x[i].qs, *hm = x[i].hmask;
        int8_t sc[16];
        quant_k3_scales(x[i].scales, sc);
        uint8_t m = 1;
        int is = 0;
        for (int n = 0; n < QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int half = 0; half < 32; half += 16) {
                    float dl = d_all * (sc[is++] - 32);
                    for (int l = half; l < half + 16; ++l)
                        *y++ = dl * (((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                }
            }
        }
    }
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------------------------
 */

/* k45_scales runs the sub-block searches of a Q4_K (nmax 15) or Q5_K (nmax 31) super-block, packs
 * the 6-bit scales and mins and the two fp16 factors, and requantizes x against the rounded
 * scales into L. */
static void k45_scales(const float *x, int nmax, uint8_t *scales12, uint16_t *dh, uint16_t *dminh,
                       uint8_t *L)
{
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    const bool q4 = nmax == 15;
    for (int j = 0; j < QK_K / 32; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l)
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l)
            weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j],
                                q4 ? -1.f : -0.5f, 0.1f, q4 ? 20 : 15, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t ls = (uint8_t)quant_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)quant_nearest_int(inv_min * mins[j]);
        ls = MINI(63, ls);
        lm = MINI(63, lm);
        if (j < 4) {
            scales12[j] = ls;
            scales12[j + 4] = lm;
        } else {
            scales12[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            scales12[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales12[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *dh = TO16(max_scale / 63.f);
    *dminh = TO16(max_min / 63.f);
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t sc, m;
        quant_k4_scale_min(j, scales12, &sc, &m);
        const float d = F16(*dh) * sc;
        if (!d) continue;
        const float dm = F16(*dminh) * m;
        for (int ii = 0; ii < 32; ++ii) {
            int l = quant_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)MAXI(0, MINI(nmax, l));
        }
    }
}

static void q4_K_quantize(const float *x, struct blk_q4_K *y, int64_t nb)
{
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        k45_scales(x, 15, y[i].scales, &y[i].d, &y[i].dmin, L);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; ++l)
                q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

static void q5_K_quantize(const float *x, struct blk_q5_K *y, int64_t nb)
{
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        k45_scales(x, 31, y[i].scales, &y[i].d, &y[i].dmin, L);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK_K; n += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

static void q4_K_dequantize(const struct blk_q4_K *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *q = x[i].qs;
        const float d = F16(x[i].d), min = F16(x[i].dmin);
        for (int is = 0; is < 8; is += 2, q += 32) {
            uint8_t sc, m;
            quant_k4_scale_min(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            quant_k4_scale_min(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; ++l)
                *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l)
                *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void q5_K_dequantize(const struct blk_q5_K *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = F16(x[i].d), min = F16(x[i].dmin);
        uint8_t u1 = 1, u2 = 2;
        for (int is = 0; is < 8; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            quant_k4_scale_min(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            quant_k4_scale_min(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; ++l)
                *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l)
                *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

/* ---- Q6_K ------------------------------------------------------------------------------------ */

static void q6_K_quantize(const float *x, struct blk_q6_K *y, int64_t nb)
{
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        for (int ib = 0; ib < QK_K / 16; ++ib)
            scales[ib] = qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
        float max_scale = quant_amax_signed(scales, QK_K / 16);
        if (fabsf(max_scale) < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -128.f / max_scale;
        y[i].d = TO16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ++ib)
            y[i].scales[ib] = (int8_t)MINI(127, quant_nearest_int(iscale * scales[ib]));
        for (int j = 0; j < QK_K / 16; ++j) {
            float d = F16(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii) {
                int l = MAXI(-32, MINI(31, quant_nearest_int(x[16 * j + ii] / d)));
                L[16 * j + ii] = (int8_t)(l + 32);
            }
        }
        /* per 128 elements: ql holds the low nibbles of (l, l+64) and (l+32, l+96), qh the high
         * two bits of all four */
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const int8_t *g = L + j + l;
                ql[l] = (uint8_t)((g[0] & 0xF) | ((g[64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((g[32] & 0xF) | ((g[96] & 0xF) << 4));
                qh[l] = (uint8_t)((g[0] >> 4) | ((g[32] >> 4) << 2) | ((g[64] >> 4) << 4) |
                                  ((g[96] >> 4) << 6));
            }
        }
    }
}

static void q6_K_dequantize(const struct blk_q6_K *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d = F16(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; ++l) {
                int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

/* ---- dispatch (quant.c has checked type and length) -------------------------------------------
 */

void quant_k_dequantize(uint32_t type, const void *src, float *dst, int64_t nb)
{
    switch (type) {
    case QT_Q2_K:
        q2_K_dequantize(src, dst, nb);
        break;
    case QT_Q3_K:
        q3_K_dequantize(src, dst, nb);
        break;
    case QT_Q4_K:
        q4_K_dequantize(src, dst, nb);
        break;
    case QT_Q5_K:
        q5_K_dequantize(src, dst, nb);
        break;
    default:
        q6_K_dequantize(src, dst, nb);
        break;
    }
}

void quant_k_quantize(uint32_t type, const float *src, void *dst, int64_t nb)
{
    switch (type) {
    case QT_Q2_K:
        q2_K_quantize(src, dst, nb);
        break;
    case QT_Q3_K:
        q3_K_quantize(src, dst, nb);
        break;
    case QT_Q4_K:
        q4_K_quantize(src, dst, nb);
        break;
    case QT_Q5_K:
        q5_K_quantize(src, dst, nb);
        break;
    default:
        q6_K_quantize(src, dst, nb);
        break;
    }
}
