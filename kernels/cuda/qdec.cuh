/* qdec.cuh — a quantized weight block in qdot_ref's integer form, one element at a time, for the
 * tensor-core products of prompt chunks (matmul.cu's cu_matmul_q): w_i = d * sc_s * q_i - dmin *
 * mn_s, s = i / SUB, exactly kernels/ref/qdot.c's decode (q signed, |q| <= 128, so int8). The
 * products need each element once per tile of tokens, so plain byte reads serve: the decode is
 * spread over the tile's tokens.
 *   qdec<T>::SUB   the sub-block length (16 or 32): one int32 dot per (row, token, sub-block);
 *   qdec<T>::MINS  whether the type has mins (dmin * mn_s), which need the activations' sums;
 *   q(b, e)        element e of the block at b;
 *   scales(b, s, &sc, &mn), head(b, &d, &dmin).
 */
#ifndef STRATA_CUDA_QDEC_CUH
#define STRATA_CUDA_QDEC_CUH

#include "kernels/cuda/common.cuh"

__device__ __forceinline__ float qd_h(const uint8_t *p)
{
    return u16_h2f((uint16_t)(p[0] | p[1] << 8));
}

/* the nibble of element e of a 32-element block whose 16 bytes are at qs (Q4_0's order) */
__device__ __forceinline__ int qd_nib32(const uint8_t *qs, int e)
{
    return e < 16 ? qs[e] & 0xF : qs[e - 16] >> 4;
}

template <int T> struct qdec;

/* 32-element types: one sub-block, scale 1, no mins */
struct qdec32 {
    static constexpr int SUB = 32;
    static constexpr bool MINS = false;
    __device__ static void scales(const uint8_t *, int, int *sc, int *mn)
    {
        *sc = 1, *mn = 0;
    }
    __device__ static void head(const uint8_t *b, float *d, float *dmin)
    {
        *d = qd_h(b), *dmin = 0;
    }
};

template <> struct qdec<QT_Q8_0> : qdec32 {
    __device__ static int q(const uint8_t *b, int e)
    {
        return (int8_t)b[2 + e];
    }
};

template <> struct qdec<QT_Q5_0> : qdec32 {
    __device__ static int q(const uint8_t *b, int e)
    {
        return (qd_nib32(b + 6, e) | ((b[2 + e / 8] >> (e % 8)) & 1) << 4) - 16;
    }
};

template <> struct qdec<QT_IQ4_NL> : qdec32 {
    __device__ static int q(const uint8_t *b, int e)
    {
        return iq4_level(qd_nib32(b + 2, e));
    }
};

/* Q4_K / Q5_K: d, dmin, scales[12] (scale_min_k4), [Q5_K: qh[32]], qs: element e of 64-element
 * group c, half hi = e % 64 / 32, lane l = e % 32 */
template <> struct qdec<QT_Q4_K> {
    static constexpr int SUB = 32;
    static constexpr bool MINS = true;
    __device__ static int q(const uint8_t *b, int e)
    {
        const uint8_t v = b[16 + 32 * (e / 64) + e % 32];
        return e % 64 < 32 ? v & 0xF : v >> 4;
    }
    __device__ static void scales(const uint8_t *b, int s, int *sc, int *mn)
    {
        scale_min_k4(s, b + 4, sc, mn);
    }
    __device__ static void head(const uint8_t *b, float *d, float *dmin)
    {
        *d = qd_h(b), *dmin = qd_h(b + 2);
    }
};

template <> struct qdec<QT_Q5_K> : qdec<QT_Q4_K> {
    __device__ static int q(const uint8_t *b, int e)
    {
        const int c = e / 64, hi = e % 64 / 32, l = e % 32;
        const uint8_t v = b[48 + 32 * c + l];
        return (hi ? v >> 4 : v & 0xF) | ((b[16 + l] >> (2 * c + hi)) & 1) << 4;
    }
};

/* Q6_K: ql[128], qh[64], int8 scales[16], d */
template <> struct qdec<QT_Q6_K> {
    static constexpr int SUB = 16;
    static constexpr bool MINS = false;
    __device__ static int q(const uint8_t *b, int e)
    {
        const int h = e / 128, k = e % 128 / 32, l = e % 32;
        const uint8_t lo = b[64 * h + l + 32 * (k & 1)];
        return ((k < 2 ? lo & 0xF : lo >> 4) | ((b[128 + 32 * h + l] >> (2 * k)) & 3) << 4) - 32;
    }
    __device__ static void scales(const uint8_t *b, int s, int *sc, int *mn)
    {
        *sc = (int8_t)b[192 + s], *mn = 0;
    }
    __device__ static void head(const uint8_t *b, float *d, float *dmin)
    {
        *d = qd_h(b + 208), *dmin = 0;
    }
};

/* Q2_K: scales[16] (scale low nibble, min high), qs[64], d, dmin */
template <> struct qdec<QT_Q2_K> {
    static constexpr int SUB = 16;
    static constexpr bool MINS = true;
    __device__ static int q(const uint8_t *b, int e)
    {
        return (b[16 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
    }
    __device__ static void scales(const uint8_t *b, int s, int *sc, int *mn)
    {
        *sc = b[s] & 0xF, *mn = b[s] >> 4;
    }
    __device__ static void head(const uint8_t *b, float *d, float *dmin)
    {
        *d = qd_h(b + 80), *dmin = qd_h(b + 82);
    }
};

/* Q3_K: hmask[32], qs[64], scales[12] (quant_k3_scales), d; a clear hmask bit means q - 4 */
template <> struct qdec<QT_Q3_K> {
    static constexpr int SUB = 16;
    static constexpr bool MINS = false;
    __device__ static int q(const uint8_t *b, int e)
    {
        const int low = (b[32 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
        return low - ((b[e % 32] >> (e / 32)) & 1 ? 0 : 4);
    }
    __device__ static void scales(const uint8_t *b, int s, int *sc, int *mn)
    {
        *sc = k3_scale(b + 96, s), *mn = 0;
    }
    __device__ static void head(const uint8_t *b, float *d, float *dmin)
    {
        *d = qd_h(b + 108), *dmin = 0;
    }
};

/* IQ4_XS: d, scales_h, scales_l[4], then 16 bytes of nibbles per 32 elements */
template <> struct qdec<QT_IQ4_XS> {
    static constexpr int SUB = 32;
    static constexpr bool MINS = false;
    __device__ static int q(const uint8_t *b, int e)
    {
        return iq4_level(qd_nib32(b + 8 + 16 * (e / 32), e % 32));
    }
    __device__ static void scales(const uint8_t *b, int s, int *sc, int *mn)
    {
        const int ls =
            ((b[4 + s / 2] >> (4 * (s % 2))) & 0xF) | (((b[2 + s / 4] >> (2 * (s % 4))) & 3) << 4);
        *sc = ls - 32, *mn = 0;
    }
    __device__ static void head(const uint8_t *b, float *d, float *dmin)
    {
        *d = qd_h(b), *dmin = 0;
    }
};

/* mma_k32 / mma_k16: c = a (16 x 32 or 16 x 16, rows) * b (32 or 16 x 8, columns), int8 in,
 * exact int32 out (PTX's fragment layouts: a row g = lane / 4 and g + 8, b column g). */
__device__ __forceinline__ void mma_k32(const uint32_t a[4], const uint32_t b[2], int c[4])
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%10,%10,%10,%10};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
}

__device__ __forceinline__ void mma_k16(const uint32_t a[2], uint32_t b, int c[4])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%7,%7,%7,%7};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b), "r"(0));
}

#endif
