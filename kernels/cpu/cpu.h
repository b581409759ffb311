/* cpu — the fast CPU kernels of the forward pass (AVX2, AVX-512 + VNNI), chosen at run time.
 *
 * Every function here returns bit for bit what its plain-C reference in kernels/ref returns
 * (cpu_matmul = ops_matmul = qdot_ref per element, cpu_attention = ops_attention, cpu_rope =
 * ops_rope, cpu_rmsnorm = ops_rmsnorm), so bit-exact mode (DESIGN 3.4) holds whichever ISA runs:
 * integer block sums are exact in any order, and each float reduction keeps the reference's
 * sequence per output element; SIMD lanes run independent elements (rows, keys, dims) side by side.
 * The ISA is picked once from the CPU's flags (__builtin_cpu_supports), overridden by the
 * environment variable STRATA_CPU=ref|avx2|avx512 (a level the CPU lacks falls back to the best it
 * has, with a warning). One binary runs on any x86-64; other machines get the references.
 * All functions are pure and thread-safe; callers split rows, tokens or heads across threads.
 */
#ifndef STRATA_CPU_H
#define STRATA_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ref/ops.h"

enum cpu_isa {
    CPU_REF,    /* the kernels/ref functions */
    CPU_AVX2,   /* AVX2 + FMA + F16C */
    CPU_AVX512, /* AVX-512 F/BW/VL + VNNI (512-bit integer dots) */
};

/* cpu_isa returns the ISA in use (decided on the first call of any cpu_ function). */
enum cpu_isa cpu_isa(void);

/* cpu_isa_set switches the ISA for the whole process (tests, benchmarks); a level the CPU lacks
 * is refused with STRATA_EUNSUPPORTED. Not to be called while kernels run on other threads. */
int cpu_isa_set(enum cpu_isa isa);

/* cpu_isa_supported: whether this CPU can run isa. */
int cpu_isa_supported(enum cpu_isa isa);

/* cpu_isa_name: "ref", "avx2", "avx512". */
const char *cpu_isa_name(enum cpu_isa isa);

/* cpu_matmul is ops_matmul (same arguments, same bits): rows [row0, row1) of W times n_tok
 * tokens' activations (made by ops_quantize_acts for wtype). Rows are taken 8 at a time and each
 * weight block is decoded once for up to CPU_TOKEN_TILE tokens, so a prompt chunk reads each row
 * from memory once per tile; for 1..16 tokens (decode, an expert's share of a decode window) the
 * kernels dot the levels in registers straight from the weight bytes (9..16 in two passes
 * over 64-row chunks, the second from L2), so one call streams its rows at memory speed up to a
 * few tokens. Any computable wtype; any row range and token count. */
void cpu_matmul(uint32_t wtype, const void *w, uint64_t row_bytes, uint32_t n_in, uint32_t row0,
                uint32_t row1, const void *acts, size_t act_stride, uint32_t n_tok, float *out,
                size_t out_stride);

#define CPU_TOKEN_TILE 32 /* tokens per pass over a group of rows: their accumulators fit L1 */

/* cpu_quantize_acts is ops_quantize_acts (same bytes; Q8_K and Q8_0 vectorized on AVX-512). */
int cpu_quantize_acts(uint32_t wtype, const float *x, size_t x_stride, uint32_t n_in,
                      uint32_t n_tok, void *dst, size_t act_stride);

/* cpu_qdot is qdot_ref (one row, one activation row), through the matmul kernels. */
float cpu_qdot(uint32_t wtype, int64_t n, const void *w_row, const void *act);

/* cpu_rmsnorm is ops_rmsnorm. */
void cpu_rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps);

/* cpu_swiglu is ops_swiglu and cpu_swiglu_oai ops_swiglu_oai (same bits; out may alias gate or
 * up): expf from the vector copy of glibc's where it matches this libm (attention's), the rest
 * the reference's expression per element. */
void cpu_swiglu(float *out, const float *gate, const float *up, uint32_t n);
void cpu_swiglu_oai(float *out, const float *gate, const float *up, uint32_t n, float alpha,
                    float limit);

/* cpu_rope is ops_rope: the angles of position pos are computed once for all heads. */
void cpu_rope(float *x, uint32_t n_head, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
              float theta, bool neox);

/* cpu_rope_yarn is ops_rope_yarn, its angles computed once for all heads. */
void cpu_rope_yarn(float *x, uint32_t n_head, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
                   float theta, bool neox, const struct ops_yarn *y);

/* The queries of one cpu_attention call: n_tok consecutive positions of one sequence, n_head query
 * heads each (the heads of one GQA group), all over the same KV head. */
struct cpu_att_q {
    const float *q; /* query (t, h) at q + t*q_tok + h*q_head (head_dim floats) */
    size_t q_tok, q_head;
    float *out; /* its output at out + t*out_tok + h*out_head (head_dim_v floats) */
    size_t out_tok, out_head;
    uint32_t n_tok, n_head; /* n_tok * n_head <= CPU_ATT_MAXQ */
    uint32_t n_keys0;       /* token t attends keys [0, n_keys0 + t); n_keys0 >= 1 */
    uint32_t window;        /* > 0: token t attends only its last `window` of those keys */
    const float *sinks;     /* per head h of the group: its sink logit (ops_attention_ex); NULL */
};

/* cpu_att_lo: the first key token t of a attends (its window's start; 0 without one). */
static inline uint32_t cpu_att_lo(const struct cpu_att_q *a, uint32_t t)
{
    const uint32_t n = a->n_keys0 + t;
    return a->window && n > a->window ? n - a->window : 0;
}

/* cpu_attention is ops_attention for every query of a (ops_attention_ex with a window or sinks;
 * same bits, each query on its own): each
 * block of OPS_ATTN_BLOCK keys is transposed once for all the queries, then each query's scores
 * come 8 keys per lane vector (a lane sums its key's dims in index order) and its values 8 dims
 * per lane. kv may be an fp16 view (ops.h): the kernels convert each block of keys as they reach
 * it, the reference path widens the view first; the floats, and so the bits, are the same. */
void cpu_attention(const struct cpu_att_q *a, uint32_t head_dim, uint32_t head_dim_v, float scale,
                   const struct ops_kv_view *kv);

#define CPU_ATT_MAXQ 64  /* queries of one cpu_attention call */
#define CPU_ATT_MAXD 1024 /* head_dim above which cpu_attention runs ops_attention (MLA's rows
                           * are 576: the key block is then 128 KiB of a thread's stack) */

#endif
