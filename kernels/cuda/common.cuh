/* common.cuh — what every strata CUDA kernel shares: warp helpers, error wrapping, and the
 * per-type dequantization of 8 consecutive weights (the unit all weight kernels are built from).
 *
 * deq8<T>(row, c, v) writes elements [8c, 8c+8) of a weight row of type T into v. The block layouts
 * are ggml's (common/quant/quant.c is the CPU reference); element order inside a block follows the
 * dequantizer, so the GPU and CPU agree on which weight multiplies which activation.
 * Launch constants in the kernels were tuned on an H200 (132 SMs, 4.8 TB/s HBM3e).
 */
#ifndef STRATA_CUDA_COMMON_CUH
#define STRATA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/base/err.h"
#include "common/quant/qtype.h"

#define WARP 32

/* cu_err maps a CUDA error to strata's space (STRATA_ECUDAERR | e), 0 for success. */
static inline int cu_err(cudaError_t e)
{
    return e == cudaSuccess ? 0 : (STRATA_ECUDAERR | (int)e);
}

/* cu_launch_check returns the launch error of the last kernel, as a strata code. */
static inline int cu_launch_check(void)
{
    return cu_err(cudaGetLastError());
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float h2f(const uint8_t *p)
{
    __half_raw r;
    r.x = (uint16_t)(p[0] | (p[1] << 8));
    return __half2float(__half(r));
}

__device__ __forceinline__ float bf2f(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

/* Q4_K / Q5_K packed 6-bit scale and min of sub-block j (ggml's get_scale_min_k4). */
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Types the GPU computes with. Others stay on the CPU (cu_type_supported says which). */
template <int T> struct qt;
template <> struct qt<QT_F32> { static constexpr int blck = 1, bytes = 4; };
template <> struct qt<QT_F16> { static constexpr int blck = 1, bytes = 2; };
template <> struct qt<QT_BF16> { static constexpr int blck = 1, bytes = 2; };
template <> struct qt<QT_Q8_0> { static constexpr int blck = 32, bytes = 34; };
template <> struct qt<QT_Q5_0> { static constexpr int blck = 32, bytes = 22; };
template <> struct qt<QT_Q4_K> { static constexpr int blck = 256, bytes = 144; };
template <> struct qt<QT_Q5_K> { static constexpr int blck = 256, bytes = 176; };
template <> struct qt<QT_Q6_K> { static constexpr int blck = 256, bytes = 210; };

template <int T> __device__ __forceinline__ void deq8(const uint8_t *row, int64_t c, float v[8]);

template <> __device__ __forceinline__ void deq8<QT_F32>(const uint8_t *row, int64_t c, float v[8])
{
    const float4 *p = (const float4 *)(row + c * 32);
    float4 a = __ldg(p), b = __ldg(p + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

template <> __device__ __forceinline__ void deq8<QT_F16>(const uint8_t *row, int64_t c, float v[8])
{
    uint4 u = __ldg((const uint4 *)(row + c * 16));
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __half22float2(h[i]);
        v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
}

template <> __device__ __forceinline__ void deq8<QT_BF16>(const uint8_t *row, int64_t c, float v[8])
{
    uint4 u = __ldg((const uint4 *)(row + c * 16));
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

/* The quantized blocks below are only 2-byte aligned in a row (34, 22, 210 bytes) or 4-byte (144):
 * every read is the widest aligned load, since at these sizes the load instructions, not the
 * bytes, bound the kernels (measured on the H200: byte loads held Q4_K at 20% of the roofline). */
__device__ __forceinline__ float u16_h2f(uint16_t u)
{
    __half_raw r;
    r.x = u;
    return __half2float(__half(r));
}

template <> __device__ __forceinline__ void deq8<QT_Q8_0>(const uint8_t *row, int64_t c, float v[8])
{
    const uint16_t *b = (const uint16_t *)(row + (c >> 2) * 34); /* 4 chunks per block */
    float d = u16_h2f(__ldg(b));
    const uint16_t *q = b + 1 + (c & 3) * 4;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint16_t u = __ldg(q + i);
        v[2 * i] = d * (float)(int8_t)(u & 0xff);
        v[2 * i + 1] = d * (float)(int8_t)(u >> 8);
    }
}

template <> __device__ __forceinline__ void deq8<QT_Q5_0>(const uint8_t *row, int64_t c, float v[8])
{
    const uint16_t *b = (const uint16_t *)(row + (c >> 2) * 22);
    float d = u16_h2f(__ldg(b));
    uint32_t qh = __ldg(b + 1) | ((uint32_t)__ldg(b + 2) << 16);
    int k = (int)(c & 3); /* chunks 0,1: low nibbles of qs[0..15]; 2,3: high nibbles */
    const uint16_t *qs = b + 3 + (k & 1) * 4;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint16_t u = __ldg(qs + i);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int e = 2 * i + h, j = (k & 1) * 8 + e; /* j: index within qs */
            uint32_t q = h ? (u >> 8) : (u & 0xff);
            int x = k < 2 ? (int)((q & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16
                          : (int)((q >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
            v[e] = (float)x * d;
        }
    }
}

template <> __device__ __forceinline__ void deq8<QT_Q4_K>(const uint8_t *row, int64_t c, float v[8])
{
    const uint8_t *b = row + (c >> 5) * 144; /* 32 chunks per 256-element block */
    int e = (int)(c & 31) * 8;               /* element within the block */
    int j = e >> 6;                          /* 64-element group: two sub-blocks */
    int hi = (e >> 5) & 1;                   /* second sub-block uses high nibbles */
    int sb = 2 * j + hi;
    uint32_t dm = __ldg((const uint32_t *)b); /* d, dmin */
    const uint32_t *sw = (const uint32_t *)(b + 4);
    uint32_t s0 = __ldg(sw), s1 = __ldg(sw + 1), s2 = __ldg(sw + 2);
    uint8_t sc8[12];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        sc8[i] = (uint8_t)(s0 >> (8 * i));
        sc8[4 + i] = (uint8_t)(s1 >> (8 * i));
        sc8[8 + i] = (uint8_t)(s2 >> (8 * i));
    }
    int sc, m;
    scale_min_k4(sb, sc8, &sc, &m);
    float d = u16_h2f((uint16_t)dm) * (float)sc, mn = u16_h2f((uint16_t)(dm >> 16)) * (float)m;
    uint2 u = __ldg((const uint2 *)(b + 16 + j * 32 + (e & 31)));
    const uint32_t w[2] = {u.x, u.y};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint32_t x = w[i >> 2] >> (8 * (i & 3) + 4 * hi);
        v[i] = d * (float)(x & 0xF) - mn;
    }
}

/* Q5_K: Q4_K's head and nibble layout (qs at +48), the fifth bit of element l of group j's two
 * sub-blocks in bits 2j and 2j + 1 of qh[l] (+16). */
template <> __device__ __forceinline__ void deq8<QT_Q5_K>(const uint8_t *row, int64_t c, float v[8])
{
    const uint8_t *b = row + (c >> 5) * 176;
    int e = (int)(c & 31) * 8, j = e >> 6, hi = (e >> 5) & 1, sb = 2 * j + hi;
    uint32_t dm = __ldg((const uint32_t *)b);
    const uint32_t *sw = (const uint32_t *)(b + 4);
    uint32_t s0 = __ldg(sw), s1 = __ldg(sw + 1), s2 = __ldg(sw + 2);
    uint8_t sc8[12];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        sc8[i] = (uint8_t)(s0 >> (8 * i));
        sc8[4 + i] = (uint8_t)(s1 >> (8 * i));
        sc8[8 + i] = (uint8_t)(s2 >> (8 * i));
    }
    int sc, m;
    scale_min_k4(sb, sc8, &sc, &m);
    float d = u16_h2f((uint16_t)dm) * (float)sc, mn = u16_h2f((uint16_t)(dm >> 16)) * (float)m;
    uint2 u = __ldg((const uint2 *)(b + 48 + j * 32 + (e & 31)));
    uint2 h = __ldg((const uint2 *)(b + 16 + (e & 31)));
    const uint32_t w[2] = {u.x, u.y}, hw[2] = {h.x, h.y};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint32_t x = (w[i >> 2] >> (8 * (i & 3) + 4 * hi)) & 0xF;
        x |= ((hw[i >> 2] >> (8 * (i & 3) + sb)) & 1) << 4;
        v[i] = d * (float)x - mn;
    }
}

template <> __device__ __forceinline__ void deq8<QT_Q6_K>(const uint8_t *row, int64_t c, float v[8])
{
    const uint8_t *b = row + (c >> 5) * 210;
    int e = (int)(c & 31) * 8;
    int half = e >> 7; /* 128-element halves */
    int r = e & 127;
    int quad = r >> 5; /* which of q1..q4 */
    int l0 = r & 31;   /* multiple of 8 */
    const uint16_t *ql = (const uint16_t *)(b + half * 64 + (quad & 1) * 32 + l0);
    const uint16_t *qh = (const uint16_t *)(b + 128 + half * 32 + l0);
    const int8_t scl = ((const int8_t *)(b + 192))[half * 8 + 2 * quad + l0 / 16];
    float d = u16_h2f(__ldg((const uint16_t *)(b + 208))) * (float)scl;
    const int sl = (quad >> 1) * 4, sh = quad * 2;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t lo = __ldg(ql + i), hh = __ldg(qh + i);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t a = (lo >> (8 * h + sl)) & 0xF, bb = (hh >> (8 * h + sh)) & 3;
            v[2 * i + h] = d * (float)((int)(a | (bb << 4)) - 32);
        }
    }
}

/* Dispatch a templated functor over the GPU's weight types: F(TYPE) expands per case. */
#define CU_TYPE_SWITCH(type, F)                                                                    \
    switch (type) {                                                                                \
    case QT_F32: F(QT_F32); break;                                                                 \
    case QT_F16: F(QT_F16); break;                                                                 \
    case QT_BF16: F(QT_BF16); break;                                                               \
    case QT_Q8_0: F(QT_Q8_0); break;                                                               \
    case QT_Q5_0: F(QT_Q5_0); break;                                                               \
    case QT_Q4_K: F(QT_Q4_K); break;                                                               \
    case QT_Q5_K: F(QT_Q5_K); break;                                                               \
    case QT_Q6_K: F(QT_Q6_K); break;                                                               \
    default: break;                                                                                \
    }

#endif
