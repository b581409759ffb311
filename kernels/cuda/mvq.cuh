/* mvq.cuh — the quantized block dots shared by the weight-product kernels (matvec.cu, moe_ffn.cu):
 * per weight type, how a group of lanes decodes a block from shared memory and dots it with
 * activations quantized by cu_quantize_acts (qact.h), reproducing qdot_ref's integer sums and float
 * steps exactly; and the cp.async copies that stage weight rows into shared memory.
 */
#ifndef STRATA_CUDA_MVQ_CUH
#define STRATA_CUDA_MVQ_CUH

#include "kernels/cuda/common.cuh"

/* ld_words: n 32-bit words from a 2-byte aligned shared-memory address (funnel shifts of aligned
 * words; may read one word past the end, inside the stage's slack). */
template <int N> __device__ __forceinline__ void ld_words(const uint8_t *p, uint32_t *o)
{
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = ((uint32_t)(uintptr_t)p & 3) * 8;
    uint32_t w[N + 1];
#pragma unroll
    for (int i = 0; i <= N; i++) w[i] = a[i];
#pragma unroll
    for (int i = 0; i < N; i++) o[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

__device__ __forceinline__ uint4 ld_act16(const int8_t *p)
{
    return __ldg((const uint4 *)p);
}

__device__ __forceinline__ int dot16(const uint32_t q[4], uint4 x, int acc)
{
    acc = __dp4a((int)q[0], (int)x.x, acc);
    acc = __dp4a((int)q[1], (int)x.y, acc);
    acc = __dp4a((int)q[2], (int)x.z, acc);
    return __dp4a((int)q[3], (int)x.w, acc);
}

__device__ __forceinline__ float hbits(uint32_t u)
{
    return u16_h2f((uint16_t)u);
}

/* Per weight type: LPB lanes per block (fewer lanes per block = less per-block work repeated:
 * header, scales, shuffles); CB blocks of a row staged at a time (1.1-2.2 KB; CB1 with one
 * activation row, where shared memory is left over for Q4_K's two rows an item); MINB, the CTAs
 * per SM the registers must allow with one activation row (8 for the K-quants: +3-6% on the H200,
 * while the same cap cost Q8_0 and Q5_0 4-8%); and the part a lane decodes (load) once for all
 * activation rows (dot), then the block's float term (value) with the
 * reference's roundings: (dx * d) * isum - (dx * dmin) * msum. The reference's third term,
 * (dx * m) * xsum, is a signed zero for these types, and adding it changes only the sign of a zero
 * term, which cannot change the running sum (it starts at +0 and never becomes -0).
 * Integer offsets (Q5_0's 16, Q6_K's 32) are taken out of the dot with the activations' 16-element
 * sums (as): q stays unsigned, so no per-byte subtraction (emulated on sm_90) is needed. */
template <int T> struct mvq;

/* Q8_0: one lane per 32-element block. */
template <> struct mvq<QT_Q8_0> {
    static constexpr int LPB = 1, CB = 64, CB1 = 64, MINB = 1;
    uint32_t q[8];
    float d;
    __device__ __forceinline__ void load(const uint8_t *b, int)
    {
        d = hbits(*(const uint16_t *)b);
        ld_words<8>(b + 2, q);
    }
    __device__ __forceinline__ void dot(const int8_t *aq, const int16_t *, int, int *is, int *ms) const
    {
        *is = dot16(q + 4, ld_act16(aq + 16), dot16(q, ld_act16(aq), 0));
        *ms = 0;
    }
    __device__ __forceinline__ float value(float dx, int is, int) const
    {
        return __fmul_rn(__fmul_rn(dx, d), (float)is);
    }
};

/* spread4: bits 0..3 of h to bit 4 of bytes 0..3 (the multiply puts bit k at bit 8k + 4, with no
 * carries between the partial products). */
__device__ __forceinline__ uint32_t spread4(uint32_t h)
{
    return ((h & 0xFu) * 0x02040810u) & 0x10101010u;
}

/* dp4a_us: dot of 4 unsigned bytes of a with 4 signed bytes of b, plus c. */
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c)
{
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* Q5_0: one lane per block; low nibbles are elements 0..15, high nibbles 16..31, fifth bits qh. */
template <> struct mvq<QT_Q5_0> {
    static constexpr int LPB = 1, CB = 64, CB1 = 64, MINB = 1;
    uint32_t q[8];
    float d;
    __device__ __forceinline__ void load(const uint8_t *b, int)
    {
        uint32_t qh, qs[4];
        d = hbits(*(const uint16_t *)b);
        ld_words<1>(b + 2, &qh);
        ld_words<4>(b + 6, qs);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            q[i] = (qs[i] & 0x0F0F0F0Fu) | spread4(qh >> (4 * i));
            q[4 + i] = ((qs[i] >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * i));
        }
    }
    __device__ __forceinline__ void dot(const int8_t *aq, const int16_t *as, int, int *is, int *ms) const
    {
        const uint32_t s2 = __ldg((const uint32_t *)as); /* the block's two 16-element sums */
        const int sum = (int)(int16_t)s2 + ((int)s2 >> 16);
        *is = dot16(q + 4, ld_act16(aq + 16), dot16(q, ld_act16(aq), 0)) - 16 * sum;
        *ms = 0;
    }
    __device__ __forceinline__ float value(float dx, int is, int) const
    {
        return __fmul_rn(__fmul_rn(dx, d), (float)is);
    }
};

/* Q4_K: 4 lanes per 256-element block; lane j reads the 32 bytes of group j: low nibbles are
 * sub-block 2j (elements 64j..), high nibbles sub-block 2j + 1 (64j + 32..). Blocks are 144 bytes,
 * so 16-byte aligned in a 16-byte aligned matrix. */
template <> struct mvq<QT_Q4_K> {
    static constexpr int LPB = 4, CB = 8, CB1 = 16, MINB = 8;
    uint32_t w[8]; /* 32 bytes of qs: low nibbles sub-block 2j, high nibbles 2j + 1 */
    uint32_t sc, m; /* scales and mins of sub-blocks 2j, 2j + 1 in bytes 0 and 1 */
    float d, dmin;
    __device__ __forceinline__ void load(const uint8_t *b, int j)
    {
        const uint4 hd = *(const uint4 *)b; /* d, dmin | scales[12] (quant_k4_scale_min) */
        d = hbits(hd.x), dmin = hbits(hd.x >> 16);
        /* both sub-blocks' 6-bit values at once, as 16-bit pairs */
        const int sh = 16 * (j & 1);
        const uint32_t s0 = hd.y >> sh, s1 = hd.z >> sh, s2 = hd.w >> sh;
        sc = j < 2 ? s0 & 0x3F3Fu : (s2 & 0x0F0Fu) | ((s0 & 0xC0C0u) >> 2);
        m = j < 2 ? s1 & 0x3F3Fu : ((s2 >> 4) & 0x0F0Fu) | ((s1 & 0xC0C0u) >> 2);
        const uint4 w0 = *(const uint4 *)(b + 16 + 32 * j), w1 = *(const uint4 *)(b + 32 + 32 * j);
        w[0] = w0.x, w[1] = w0.y, w[2] = w0.z, w[3] = w0.w;
        w[4] = w1.x, w[5] = w1.y, w[6] = w1.z, w[7] = w1.w;
    }
    __device__ __forceinline__ void dot(const int8_t *aq, const int16_t *as, int j, int *is, int *ms) const
    {
        const int8_t *x = aq + 64 * j;
        const uint4 x0 = ld_act16(x), x1 = ld_act16(x + 16), x2 = ld_act16(x + 32), x3 = ld_act16(x + 48);
        const uint32_t xl[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const uint32_t xh[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
        int dl = 0, dh16 = 0; /* dh16: the high nibbles left in place, 16 times their dot */
#pragma unroll
        for (int i = 0; i < 8; i++) {
            dl = dp4a_us(w[i] & 0x0F0F0F0Fu, xl[i], dl);
            dh16 = dp4a_us(w[i] & 0xF0F0F0F0u, xh[i], dh16);
        }
        const uint2 s = __ldg((const uint2 *)(as + 4 * j)); /* sums of 16: 4j .. 4j + 3 */
        const int sl = (int)(int16_t)s.x + ((int)s.x >> 16), sh = (int)(int16_t)s.y + ((int)s.y >> 16);
        *is = (int)(sc & 0xFF) * dl + (int)(sc >> 8) * (dh16 >> 4);
        *ms = (int)(m & 0xFF) * sl + (int)(m >> 8) * sh;
    }
    __device__ __forceinline__ float value(float dx, int is, int ms) const
    {
        return __fsub_rn(__fmul_rn(__fmul_rn(dx, d), (float)is),
                         __fmul_rn(__fmul_rn(dx, dmin), (float)ms));
    }
};

/* Q5_K: Q4_K with a fifth bit (176-byte blocks, 16-byte aligned too): lane j reads the 32 bytes
 * of qs for group j (+48) and all 32 of qh (+16), whose bits 2j and 2j + 1 are the fifth bits of
 * its two sub-blocks; values 0..31 in bytes, so both halves dot directly. */
template <> struct mvq<QT_Q5_K> {
    static constexpr int LPB = 4, CB = 8, CB1 = 8, MINB = 8;
    uint32_t lo[8], hi[8]; /* sub-blocks 2j and 2j + 1, one value a byte */
    uint32_t sc, m;
    float d, dmin;
    __device__ __forceinline__ void load(const uint8_t *b, int j)
    {
        const uint4 hd = *(const uint4 *)b;
        d = hbits(hd.x), dmin = hbits(hd.x >> 16);
        const int sh = 16 * (j & 1);
        const uint32_t s0 = hd.y >> sh, s1 = hd.z >> sh, s2 = hd.w >> sh;
        sc = j < 2 ? s0 & 0x3F3Fu : (s2 & 0x0F0Fu) | ((s0 & 0xC0C0u) >> 2);
        m = j < 2 ? s1 & 0x3F3Fu : ((s2 >> 4) & 0x0F0Fu) | ((s1 & 0xC0C0u) >> 2);
        const uint4 h0 = *(const uint4 *)(b + 16), h1 = *(const uint4 *)(b + 32);
        const uint4 w0 = *(const uint4 *)(b + 48 + 32 * j), w1 = *(const uint4 *)(b + 64 + 32 * j);
        const uint32_t hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const uint32_t w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            lo[i] = (w[i] & 0x0F0F0F0Fu) | (((hw[i] >> (2 * j)) & 0x01010101u) << 4);
            hi[i] = ((w[i] >> 4) & 0x0F0F0F0Fu) | (((hw[i] >> (2 * j + 1)) & 0x01010101u) << 4);
        }
    }
    __device__ __forceinline__ void dot(const int8_t *aq, const int16_t *as, int j, int *is, int *ms) const
    {
        const int8_t *x = aq + 64 * j;
        const uint4 x0 = ld_act16(x), x1 = ld_act16(x + 16), x2 = ld_act16(x + 32), x3 = ld_act16(x + 48);
        const uint32_t xl[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const uint32_t xh[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
        int dl = 0, dh = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            dl = dp4a_us(lo[i], xl[i], dl);
            dh = dp4a_us(hi[i], xh[i], dh);
        }
        const uint2 s = __ldg((const uint2 *)(as + 4 * j));
        const int sl = (int)(int16_t)s.x + ((int)s.x >> 16), sh = (int)(int16_t)s.y + ((int)s.y >> 16);
        *is = (int)(sc & 0xFF) * dl + (int)(sc >> 8) * dh;
        *ms = (int)(m & 0xFF) * sl + (int)(m >> 8) * sh;
    }
    __device__ __forceinline__ float value(float dx, int is, int ms) const
    {
        return __fsub_rn(__fmul_rn(__fmul_rn(dx, d), (float)is),
                         __fmul_rn(__fmul_rn(dx, dmin), (float)ms));
    }
};

/* Q6_K: 4 lanes per block; lane p takes positions 16k..16k+15 (k = p % 2) of half p / 2 in all four
 * 32-element quarters: 16 bytes of ql at +0 and +32, 16 of qh; one scale per quarter. */
template <> struct mvq<QT_Q6_K> {
    static constexpr int LPB = 4, CB = 8, CB1 = 8, MINB = 8;
    uint32_t v[4][4];
    int sc[4];
    float d;
    __device__ __forceinline__ void load(const uint8_t *b, int p)
    {
        const int half = p >> 1, k = p & 1;
        uint32_t qa[4], qb[4], qh[4], sw[2];
        ld_words<4>(b + half * 64 + 16 * k, qa);
        ld_words<4>(b + half * 64 + 32 + 16 * k, qb);
        ld_words<4>(b + 128 + half * 32 + 16 * k, qh);
        ld_words<2>(b + 192 + half * 8, sw);
        d = hbits(*(const uint16_t *)(b + 208));
#pragma unroll
        for (int quad = 0; quad < 4; quad++) {
            const int s = k + 2 * quad; /* this half's 16-element run */
            sc[quad] = (int)(int8_t)(sw[s >> 2] >> (8 * (s & 3)));
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t l = quad & 1 ? qb[i] : qa[i];
                v[quad][i] = ((quad < 2 ? l : l >> 4) & 0x0F0F0F0Fu) |
                             (((qh[i] >> (2 * quad)) & 0x03030303u) << 4);
            }
        }
    }
    __device__ __forceinline__ void dot(const int8_t *aq, const int16_t *as, int p, int *is, int *ms) const
    {
        const int half = p >> 1, k = p & 1;
        const uint4 s = __ldg((const uint4 *)(as + 8 * half)); /* this half's 8 sums of 16 */
        const uint32_t sw[4] = {s.x, s.y, s.z, s.w};
        int acc = 0;
#pragma unroll
        for (int quad = 0; quad < 4; quad++) {
            const int dq = dot16(v[quad], ld_act16(aq + half * 128 + 32 * quad + 16 * k), 0);
            const int sum = k ? (int)sw[quad] >> 16 : (int)(int16_t)sw[quad];
            acc += sc[quad] * (dq - 32 * sum);
        }
        *is = acc;
        *ms = 0;
    }
    __device__ __forceinline__ float value(float dx, int is, int) const
    {
        return __fmul_rn(__fmul_rn(dx, d), (float)is);
    }
};

/* sum16: sum of 16 activations k (0..3) of the 8 in s, at index 2k + h. */
__device__ __forceinline__ int sum16(const uint32_t sw[4], int k, int h)
{
    return h ? (int)sw[k] >> 16 : (int)(int16_t)sw[k];
}

/* Q2_K: 4 lanes per block; lane p takes bytes 16h..16h + 15 (h = p & 1) of group g = p / 2's 32
 * bytes of qs, whose bits 2k are the 16 elements of sub-block 8g + 2k + h (k = 0..3), at
 * 128g + 32k + 16h. 84-byte blocks: 4-byte aligned. */
template <> struct mvq<QT_Q2_K> {
    static constexpr int LPB = 4, CB = 8, CB1 = 16, MINB = 8;
    uint32_t v[4][4]; /* sub-block k's values, one a byte */
    uint32_t sc;      /* sub-block k's scale (low nibble) and min (high) in byte k */
    float d, dmin;
    __device__ __forceinline__ void load(const uint8_t *b, int p)
    {
        const int g = p >> 1, h = p & 1;
        const uint32_t *q = (const uint32_t *)(b + 16 + 32 * g + 16 * h);
        const uint32_t qw[4] = {q[0], q[1], q[2], q[3]};
        const uint32_t *s = (const uint32_t *)(b + 8 * g); /* scales of sub-blocks 8g .. 8g + 7 */
        sc = __byte_perm(s[0], s[1], h ? 0x7531 : 0x6420);
        const uint32_t dm = *(const uint32_t *)(b + 80);
        d = hbits(dm), dmin = hbits(dm >> 16);
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int i = 0; i < 4; i++) v[k][i] = (qw[i] >> (2 * k)) & 0x03030303u;
    }
    __device__ __forceinline__ void dot(const int8_t *aq, const int16_t *as, int p, int *is, int *ms) const
    {
        const int g = p >> 1, h = p & 1;
        const uint4 s = __ldg((const uint4 *)(as + 8 * g)); /* sums of 16: 8g .. 8g + 7 */
        const uint32_t sw[4] = {s.x, s.y, s.z, s.w};
        int ia = 0, ma = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int dq = dot16(v[k], ld_act16(aq + 128 * g + 32 * k + 16 * h), 0);
            ia += (int)((sc >> (8 * k)) & 0xF) * dq;
            ma += (int)((sc >> (8 * k + 4)) & 0xF) * sum16(sw, k, h);
        }
        *is = ia;
        *ms = ma;
    }
    __device__ __forceinline__ float value(float dx, int is, int ms) const
    {
        return __fsub_rn(__fmul_rn(__fmul_rn(dx, d), (float)is),
                         __fmul_rn(__fmul_rn(dx, dmin), (float)ms));
    }
};

/* Q3_K: Q2_K's lanes and low bits (qs at +32), the third bit of element 128g + 32k + l at bit
 * 4g + k of hmask[l] (+0); a clear bit means q - 4, taken out with the sums of 16. Scales at +96
 * (quant_k3_scales), d at +108; 110-byte blocks: 2-byte aligned. */
template <> struct mvq<QT_Q3_K> {
    static constexpr int LPB = 4, CB = 8, CB1 = 16, MINB = 8;
    uint32_t v[4][4]; /* q + 4 (0..7), one a byte */
    int sc[4];        /* sub-block 8g + 2k + h's scale, less its 32 */
    float d;
    __device__ __forceinline__ void load(const uint8_t *b, int p)
    {
        const int g = p >> 1, h = p & 1;
        uint32_t qw[4], hw[4], sw[3];
        ld_words<4>(b + 32 + 32 * g + 16 * h, qw);
        ld_words<4>(b + 16 * h, hw);
        ld_words<3>(b + 96, sw);
        d = hbits(*(const uint16_t *)(b + 108));
#pragma unroll
        for (int k = 0; k < 4; k++) {
#pragma unroll
            for (int i = 0; i < 4; i++)
                v[k][i] = ((qw[i] >> (2 * k)) & 0x03030303u) |
                          (((hw[i] >> (4 * g + k)) & 0x01010101u) << 2);
            const int n = 2 * k + h; /* j = 8g + n: quant_k3_scales' bytes */
            const uint32_t lo = (sw[n >> 2] >> (8 * (n & 3) + 4 * g)) & 0xF;
            const uint32_t hi = (sw[2] >> (8 * (n & 3) + 2 * (2 * g + (k >> 1)))) & 3;
            sc[k] = (int)(lo | hi << 4) - 32;
        }
    }
    __device__ __forceinline__ void dot(const int8_t *aq, const int16_t *as, int p, int *is, int *ms) const
    {
        const int g = p >> 1, h = p & 1;
        const uint4 s = __ldg((const uint4 *)(as + 8 * g));
        const uint32_t sw[4] = {s.x, s.y, s.z, s.w};
        int ia = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int dq = dot16(v[k], ld_act16(aq + 128 * g + 32 * k + 16 * h), 0);
            ia += sc[k] * (dq - 4 * sum16(sw, k, h));
        }
        *is = ia;
        *ms = 0;
    }
    __device__ __forceinline__ float value(float dx, int is, int) const
    {
        return __fmul_rn(__fmul_rn(dx, d), (float)is);
    }
};

/* IQ4_NL: one lane per 32-element block (Q8_0 activations); nibbles as Q4_0, each a level of
 * quant_iq4nl_values (byte permutes), signed bytes dotted directly. 18-byte blocks. */
template <> struct mvq<QT_IQ4_NL> {
    static constexpr int LPB = 1, CB = 64, CB1 = 64, MINB = 1;
    uint32_t lo[4], hi[4]; /* elements 0..15, 16..31 */
    float d;
    __device__ __forceinline__ void load(const uint8_t *b, int)
    {
        uint32_t qs[4];
        d = hbits(*(const uint16_t *)b);
        ld_words<4>(b + 2, qs);
#pragma unroll
        for (int i = 0; i < 4; i++) iq4_lut8(qs[i], &lo[i], &hi[i]);
    }
    __device__ __forceinline__ void dot(const int8_t *aq, const int16_t *, int, int *is, int *ms) const
    {
        *is = dot16(hi, ld_act16(aq + 16), dot16(lo, ld_act16(aq), 0));
        *ms = 0;
    }
    __device__ __forceinline__ float value(float dx, int is, int) const
    {
        return __fmul_rn(__fmul_rn(dx, d), (float)is);
    }
};

/* IQ4_XS: 4 lanes per block; lane p takes sub-blocks 2p and 2p + 1 (elements 64p..), their 32
 * bytes of nibbles at +8 + 32p, and their 6-bit scales (low 4 bits in scales_l, high 2 in
 * scales_h), less 32. 136-byte blocks: 8-byte aligned. */
template <> struct mvq<QT_IQ4_XS> {
    static constexpr int LPB = 4, CB = 8, CB1 = 16, MINB = 8;
    uint32_t v[16]; /* levels of elements 64p + 16i .. 64p + 16i + 15 in v[4i .. 4i + 3] */
    int sc0, sc1;
    float d;
    __device__ __forceinline__ void load(const uint8_t *b, int p)
    {
        const uint2 hd = *(const uint2 *)b; /* d, scales_h | scales_l */
        d = hbits(hd.x);
        const int s0 = 2 * p, s1 = 2 * p + 1;
        sc0 = (int)(((hd.y >> (4 * s0)) & 0xF) | (((hd.x >> (16 + 2 * s0)) & 3) << 4)) - 32;
        sc1 = (int)(((hd.y >> (4 * s1)) & 0xF) | (((hd.x >> (16 + 2 * s1)) & 3) << 4)) - 32;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const uint2 a = *(const uint2 *)(b + 8 + 32 * p + 16 * half);
            const uint2 c = *(const uint2 *)(b + 16 + 32 * p + 16 * half);
            const uint32_t qw[4] = {a.x, a.y, c.x, c.y};
#pragma unroll
            for (int i = 0; i < 4; i++) iq4_lut8(qw[i], &v[8 * half + i], &v[8 * half + 4 + i]);
        }
    }
    __device__ __forceinline__ void dot(const int8_t *aq, const int16_t *, int p, int *is, int *ms) const
    {
        const int8_t *x = aq + 64 * p;
        const int d0 = dot16(v + 4, ld_act16(x + 16), dot16(v, ld_act16(x), 0));
        const int d1 = dot16(v + 12, ld_act16(x + 48), dot16(v + 8, ld_act16(x + 32), 0));
        *is = sc0 * d0 + sc1 * d1;
        *ms = 0;
    }
    __device__ __forceinline__ float value(float dx, int is, int) const
    {
        return __fmul_rn(__fmul_rn(dx, d), (float)is);
    }
};

/* cp_async16: 16 bytes from global src into shared memory at dst (a shared-space address),
 * bypassing L1 (weights are read once). cp_async16_tail: the same for the matrix's last 16 bytes
 * at most, zero-filling past total so the last row never reads outside the allocation. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const uint8_t *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void cp_async16_tail(uint32_t dst, const uint8_t *w, int64_t off,
                                                int64_t total)
{
    const int64_t left = total - off;
    const int n = left >= 16 ? 16 : (left > 0 ? (int)left : 0);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(n ? w + off : w),
                 "r"(n));
}

#endif
