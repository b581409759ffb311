/* expf.cuh — glibc's expf (the table method of glibc 2.28 and later, from ARM's
 * optimized-routines) as a device function, so that SiLU and the sigmoid gate give the CPU's bits.
 *
 * The algorithm, step for step as x86-64 glibc runs it (__expf_fma, the variant an FMA machine
 * takes; kernels/cpu/vec_avx512.c is the same on 16 lanes): x in double; z = x * 32/ln2 rounded
 * to an integer k by adding 1.5 * 2^52 in the same FMA; r = x * 32/ln2 - k (one FMA);
 * s = 2^(k/32) from a 32-entry table (each entry has its index taken out of the exponent field,
 * put back by adding k << 47); y = (C0 r + C1) r^2 + (C2 r + 1), three FMAs and one product; then
 * y * s, rounded once to float. |x| >= 88, inf and NaN take glibc's special paths first:
 * -inf gives 0; inf and NaN, x + x; above log(2^128), +inf; below log(2^-150), +0; below
 * log(2^-149), 2^-149 (glibc's "may underflow" value). The rest of [-103.97, 88.72] goes through
 * the main path, subnormal results included.
 *
 * Every double step is one IEEE operation written out (__fma_rn / __dmul_rn / __dadd_rn): nvcc must
 * not contract or reorder them, and the build has no fast-math or flush-to-zero. Compiled as C
 * (no __CUDACC__) the same text is a host copy with fma() and plain operators (C11 in ISO mode does
 * not contract), which expf_test.c checks against libm in CI; expf.cu checks the device copy
 * against libm on the GPU.
 */
#ifndef STRATA_CUDA_EXPF_CUH
#define STRATA_CUDA_EXPF_CUH

#include <stdint.h>

#include "kernels/ref/expf_tab.h"

#ifdef __CUDACC__
#define SX_FN           static __device__ __forceinline__
#define SX_TAB          static __device__ const
#define SX_FMA(a, b, c) __fma_rn(a, b, c)
#define SX_MUL(a, b)    __dmul_rn(a, b)
#define SX_ADD(a, b)    __dadd_rn(a, b)
#define SX_FMULF(a, b)  __fmul_rn(a, b)
#define SX_FADDF(a, b)  __fadd_rn(a, b)
#define SX_F2BITS(x)    ((uint32_t)__float_as_uint(x))
#define SX_D2BITS(x)    ((uint64_t)__double_as_longlong(x))
#define SX_BITS2D(u)    __longlong_as_double((long long)(u))
#define SX_TABLE(i)     __ldg(&strata_expf_tab[i])
#define SX_D2F(y)       __double2float_rn(y)
#else
#include <math.h>
#include <string.h>
#define SX_FN           static inline
#define SX_TAB          static const
#define SX_FMA(a, b, c) fma(a, b, c)
#define SX_MUL(a, b)    ((a) * (b))
#define SX_ADD(a, b)    ((a) + (b))
#define SX_FMULF(a, b)  ((a) * (b))
#define SX_FADDF(a, b)  ((a) + (b))
#define SX_F2BITS(x)    sx_f2bits(x)
#define SX_D2BITS(x)    sx_d2bits(x)
#define SX_BITS2D(u)    sx_bits2d(u)
#define SX_TABLE(i)     strata_expf_tab[i]
#define SX_D2F(y)       ((float)(y))
static inline uint32_t sx_f2bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline uint64_t sx_d2bits(double x)
{
    uint64_t u;
    memcpy(&u, &x, 8);
    return u;
}
static inline double sx_bits2d(uint64_t u)
{
    double x;
    memcpy(&x, &u, 8);
    return x;
}
#endif

/* glibc's __exp2f_data.tab: 2^(i/32) as bits, minus i << 47 (added back with k << 47). */
SX_TAB uint64_t strata_expf_tab[32] = {STRATA_EXPF_TAB};

/* strata_expf: glibc's expf(x), bit for bit (NaN in gives a NaN). */
SX_FN float strata_expf(float x)
{
    const uint32_t ux = SX_F2BITS(x), abstop = ux >> 20 & 0x7ff;
    if (abstop >= 0x42b) { /* |x| >= 88, inf or NaN */
        if (ux == 0xff800000u) return 0.0f;
        if (abstop >= 0x7f8) return SX_FADDF(x, x);
        if (x > 0x1.62e42ep6f) return SX_FMULF(0x1p97f, 0x1p97f);        /* overflow: +inf */
        if (x < -0x1.9fe368p6f) return SX_FMULF(0x1p-95f, 0x1p-95f);     /* underflow: +0 */
        if (x < -0x1.9d1d9ep6f) return SX_FMULF(0x1.4p-75f, 0x1.4p-75f); /* 2^-149 */
    }
    const double xd = (double)x, inv = 0x1.71547652b82fep+5, shift = 0x1.8p+52;
    const double z = SX_FMA(inv, xd, shift);
    const uint64_t ki = SX_D2BITS(z);
    const double kd = SX_ADD(z, -shift);
    const double r = SX_FMA(inv, xd, -kd);
    const double s = SX_BITS2D(SX_TABLE(ki % 32) + (ki << 47));
    const double z2 = SX_FMA(0x1.c6af84b912394p-20, r, 0x1.ebfce50fac4f3p-13);
    const double r2 = SX_MUL(r, r);
    double y = SX_FMA(0x1.62e42ff0c52d6p-6, r, 1.0);
    y = SX_FMA(z2, r2, y);
    return SX_D2F(SX_MUL(y, s));
}

#undef SX_FN
#undef SX_TAB
#undef SX_FMA
#undef SX_MUL
#undef SX_ADD
#undef SX_FMULF
#undef SX_FADDF
#undef SX_F2BITS
#undef SX_D2BITS
#undef SX_BITS2D
#undef SX_TABLE
#undef SX_D2F

#endif
