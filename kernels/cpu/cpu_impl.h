/* cpu_impl — what kernels/cpu/cpu.c dispatches to: the per-ISA kernel files' entry points. Not
 * for use outside kernels/cpu. Each entry has exactly the contract of the cpu.h function it backs.
 */
#ifndef STRATA_CPU_IMPL_H
#define STRATA_CPU_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu.h"
#include "kernels/ref/ops.h"

/* cpu_rows_fn computes cpu_matmul for one weight type. */
typedef void (*cpu_rows_fn)(const void *w, uint64_t row_bytes, uint32_t n_in, uint32_t row0,
                            uint32_t row1, const void *acts, size_t act_stride, uint32_t n_tok,
                            float *out, size_t out_stride);

/* cpu_rows_avx2 / cpu_rows_avx512: the matmul kernel of wtype for that ISA (qdot_avx2.c,
 * qdot_avx512.c, both built from qdot_body.inc); NULL for a type they do not cover. */
cpu_rows_fn cpu_rows_avx2(uint32_t wtype);
cpu_rows_fn cpu_rows_avx512(uint32_t wtype);

/* vec_avx2.c: AVX2 versions of the F32 ops; RMSNorm and RoPE also serve CPU_AVX512 (they are
 * bound by a fixed-order double sum and by libm's sinf/cosf, where wider vectors buy nothing). */
void cpu_rmsnorm_avx2(float *out, const float *x, const float *w, uint32_t n, float eps);
void cpu_rope_avx2(float *x, uint32_t n_head, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
                   float theta, bool neox, const struct ops_yarn *yarn);
void cpu_attention_avx2(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v,
                        float scale, const struct ops_kv_view *kv);

/* vec_avx512.c: attention on 16 lanes and activation quantization, for CPU_AVX512. */
int cpu_quantize_acts_avx512(uint32_t wtype, const float *x, size_t x_stride, uint32_t n_in,
                             uint32_t n_tok, void *dst, size_t act_stride);
void cpu_attention_avx512(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v,
                          float scale, const struct ops_kv_view *kv, int vexp);

/* cpu_expf_avx512: y[i] = expf(x[i]) computed 16 at a time the way glibc's expf does (y may be
 * x); vexp above says whether attention uses it. Equal to libm only where cpu_vexp_ok() says. */
void cpu_expf_avx512(const float *x, float *y, uint32_t n);

/* cpu_vexp_ok: whether cpu_expf_avx512 matched libm's expf on every input of a sweep across
 * the main path and its edges (checked once). */
int cpu_vexp_ok(void);

#endif
