/* qdot_avx2 — the matmul kernels of qdot_body.inc for AVX2 + FMA + F16C (maddubs + madd integer
 * dots, 256-bit). Compiled for that target with a pragma so the rest of the binary stays baseline
 * x86-64; cpu.c calls in only when __builtin_cpu_supports says the CPU has it. */
#include "common/quant/qtype.h"
#include "common/quant/quant_blocks.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_impl.h"

#include <string.h>

#if defined(__x86_64__) && !defined(STRATA_NO_QDOT_SIMD)
#include <immintrin.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#define VNNI   0
#define FN(nm) nm##_avx2
#include "kernels/cpu/qdot_body.inc"

#ifdef __clang__
#pragma clang attribute pop
#endif

#else
cpu_rows_fn cpu_rows_avx2(uint32_t wtype)
{
    (void)wtype;
    return NULL;
}
#endif
