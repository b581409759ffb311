/* qdot_avx512 — the matmul kernels of qdot_body.inc for AVX-512 F/BW/VL + VNNI: the K-quants'
 * integer dots on 512-bit vectors with dpwssd folding the scale multiply into the accumulate, the
 * 32-element formats with 256-bit dpbusd. Compiled for that target with a pragma; cpu.c calls in
 * only when __builtin_cpu_supports says the CPU has every one of those extensions. */
#include "common/quant/qtype.h"
#include "common/quant/quant_blocks.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_impl.h"

#include <string.h>

#if defined(__x86_64__) && !defined(STRATA_NO_QDOT_SIMD)
#include <immintrin.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#pragma clang attribute push(                                                                      \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))),                 \
    apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

#define VNNI   1
#define FN(nm) nm##_avx512
#include "kernels/cpu/qdot_body.inc"

#ifdef __clang__
#pragma clang attribute pop
#endif

#else
cpu_rows_fn cpu_rows_avx512(uint32_t wtype)
{
    (void)wtype;
    return NULL;
}
#endif
