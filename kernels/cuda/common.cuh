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

/* cu_sm_count: the current device's SM count (looked up once per device). */
static inline int cu_sm_count(void)
{
    static int sms[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 1;
    if (!sms[dev] && cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev) !=
                         cudaSuccess)
        sms[dev] = 1;
    return sms[dev];
}

/* Programmatic dependent launch (sm_90). With cu_set_pdl on (glue.h), cu_launch puts a kernel on
 * the stream allowed to start before the kernel ahead of it ends: its CTAs may be resident early,
 * and pdl_enter, the first step of every kernel here, lets the next kernel launch as well
 * (launch_dependents) and then waits until the kernel ahead has finished and its writes are
 * visible (griddepcontrol.wait). So each kernel still sees everything written before it, and its
 * own launch and CTA start overlap the previous kernel's tail; a kernel may read data no earlier
 * kernel of the pass writes (weights) before waiting (pdl_trigger at the top, pdl_wait after), and
 * must write nothing before it waits. Without the launch attribute both are no-ops. */
__device__ __forceinline__ void pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_enter(void)
{
    pdl_trigger();
    pdl_wait();
}

/* cu_pdl_on: this thread's launches go out with programmatic dependent launch (cu_set_pdl). */
extern thread_local bool cu_pdl_on;

/* cu_launch: kernel k on stream s, as k<<<grid, block, smem, s>>>(args...), with programmatic
 * stream serialization while cu_pdl_on. Errors reach cudaGetLastError (cu_launch_check). */
template <typename... P, typename... A>
static inline void cu_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                             A &&...args)
{
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cfg.attrs = at, cfg.numAttrs = cu_pdl_on ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k, static_cast<A &&>(args)...);
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
template <> struct qt<QT_Q2_K> { static constexpr int blck = 256, bytes = 84; };
template <> struct qt<QT_Q3_K> { static constexpr int blck = 256, bytes = 110; };
template <> struct qt<QT_IQ4_XS> { static constexpr int blck = 256, bytes = 136; };
template <> struct qt<QT_IQ4_NL> { static constexpr int blck = 32, bytes = 18; };

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

/* Q2_K: scales[16] (scale low nibble, min high), qs[64] at +16, d, dmin at +80; 84-byte blocks,
 * 4-byte aligned. Byte l of 32-byte group g holds elements 128g + 32k + l in bits 2k. The float
 * steps are quant_dequantize's: dl = d * sc, ml = dmin * m, dl * q - ml. */
template <> __device__ __forceinline__ void deq8<QT_Q2_K>(const uint8_t *row, int64_t c, float v[8])
{
    const uint8_t *b = row + (c >> 5) * 84;
    const int e = (int)(c & 31) * 8, g = e >> 7, k = (e >> 5) & 3, l = e & 31;
    const uint32_t dm = __ldg((const uint32_t *)(b + 80));
    const uint32_t sc = b[e >> 4];
    const float dl = __fmul_rn(u16_h2f((uint16_t)dm), (float)(sc & 0xF)),
                ml = __fmul_rn(u16_h2f((uint16_t)(dm >> 16)), (float)(sc >> 4));
    const uint32_t *q = (const uint32_t *)(b + 16 + 32 * g + l);
    const uint32_t w[2] = {__ldg(q), __ldg(q + 1)};
#pragma unroll
    for (int i = 0; i < 8; i++)
        v[i] = __fsub_rn(__fmul_rn(dl, (float)((w[i >> 2] >> (8 * (i & 3) + 2 * k)) & 3)), ml);
}

/* Q3_K: hmask[32], qs[64] at +32 (Q2_K's layout), 16 6-bit scales at +96 (quant_k3_scales), d at
 * +108; 110-byte blocks, 2-byte aligned. The high bit of element e is bit e / 32 of hmask[e % 32];
 * clear means q - 4. dl = d * (sc - 32), then dl * q. */
__device__ __forceinline__ int k3_scale(const uint8_t *s, int j)
{
    const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4, hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | hi << 4) - 32;
}

template <> __device__ __forceinline__ void deq8<QT_Q3_K>(const uint8_t *row, int64_t c, float v[8])
{
    const uint8_t *b = row + (c >> 5) * 110;
    const int e = (int)(c & 31) * 8, g = e >> 7, k = (e >> 5) & 3, l = e & 31;
    const float dl = __fmul_rn(u16_h2f(__ldg((const uint16_t *)(b + 108))),
                               (float)k3_scale(b + 96, e >> 4));
    const uint16_t *q = (const uint16_t *)(b + 32 + 32 * g + l), *h = (const uint16_t *)(b + l);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t qq = __ldg(q + i), hh = __ldg(h + i);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int low = (qq >> (8 * j + 2 * k)) & 3, high = (hh >> (8 * j + 4 * g + k)) & 1;
            v[2 * i + j] = __fmul_rn(dl, (float)(low - (high ? 0 : 4)));
        }
    }
}

/* IQ4_NL / IQ4_XS levels (quant_iq4nl_values, ggml's kvalues_iq4nl), 4 a word: byte permutes
 * pick them (a table in local memory would be a load per weight). */
#define IQ4_T0 0xBFAD9881u
#define IQ4_T1 0xF6EADDCFu
#define IQ4_T2 0x26190D01u
#define IQ4_T3 0x71594535u

__device__ __forceinline__ int iq4_level(uint32_t i)
{
    return (int)(int8_t)__byte_perm(i < 8 ? IQ4_T0 : IQ4_T2, i < 8 ? IQ4_T1 : IQ4_T3, i & 7);
}

/* iq4_lut4: the levels of the 4 indices in nibbles 0..3 of s, one a byte. */
__device__ __forceinline__ uint32_t iq4_lut4(uint32_t s)
{
    const uint32_t a = __byte_perm(IQ4_T0, IQ4_T1, s & 0x7777), b = __byte_perm(IQ4_T2, IQ4_T3, s & 0x7777);
    return __byte_perm(a, b, 0x3210 | ((s & 0x8888) >> 1));
}

/* iq4_lut8: the levels of a word of nibbles: *lo of the 4 low nibbles, *hi of the 4 high ones. */
__device__ __forceinline__ void iq4_lut8(uint32_t q, uint32_t *lo, uint32_t *hi)
{
    const uint32_t t0 = iq4_lut4(q), t1 = iq4_lut4(q >> 16);
    *lo = __byte_perm(t0, t1, 0x6420);
    *hi = __byte_perm(t0, t1, 0x7531);
}

/* IQ4_NL: d, then 16 bytes of nibbles as Q4_0 (element j low, j + 16 high); 18-byte blocks,
 * 2-byte aligned. d * level. */
template <> __device__ __forceinline__ void deq8<QT_IQ4_NL>(const uint8_t *row, int64_t c, float v[8])
{
    const uint16_t *b = (const uint16_t *)(row + (c >> 2) * 18);
    const float d = u16_h2f(__ldg(b));
    const int k = (int)(c & 3);
    const uint16_t *qs = b + 1 + (k & 1) * 4;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t u = __ldg(qs + i) >> (k < 2 ? 0 : 4);
        v[2 * i] = __fmul_rn(d, (float)iq4_level(u & 0xF));
        v[2 * i + 1] = __fmul_rn(d, (float)iq4_level((u >> 8) & 0xF));
    }
}

/* IQ4_XS: d, scales_h, scales_l[4], then per 32 elements 16 bytes of nibbles as IQ4_NL (+8);
 * 136-byte blocks, 8-byte aligned. dl = d * (ls - 32), then dl * level. */
template <> __device__ __forceinline__ void deq8<QT_IQ4_XS>(const uint8_t *row, int64_t c, float v[8])
{
    const uint8_t *b = row + (c >> 5) * 136;
    const int e = (int)(c & 31) * 8, ib = e >> 5, r = e & 31;
    const uint2 hd = __ldg((const uint2 *)b);
    const int ls = ((hd.y >> (4 * ib)) & 0xF) | (((hd.x >> (16 + 2 * ib)) & 3) << 4);
    const float dl = __fmul_rn(u16_h2f((uint16_t)hd.x), (float)(ls - 32));
    const uint2 u = __ldg((const uint2 *)(b + 8 + 16 * ib + (r & 15)));
    const uint32_t w[2] = {u.x, u.y};
    const int sh = r < 16 ? 0 : 4;
#pragma unroll
    for (int i = 0; i < 8; i++)
        v[i] = __fmul_rn(dl, (float)iq4_level((w[i >> 2] >> (8 * (i & 3) + sh)) & 0xF));
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
    case QT_Q2_K: F(QT_Q2_K); break;                                                               \
    case QT_Q3_K: F(QT_Q3_K); break;                                                               \
    case QT_IQ4_XS: F(QT_IQ4_XS); break;                                                           \
    case QT_IQ4_NL: F(QT_IQ4_NL); break;                                                           \
    default: break;                                                                                \
    }

#endif
