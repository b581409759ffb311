/* cpu_moe — the routed experts of one MoE layer on the CPU: the twin of cu_moe_ffn
 * (kernels/cuda/moe_ffn.h), with the same groups and pair indexing (kernels/ref/moe.h).
 *
 * For each pair of each group (expert e, pair = tok * k + j):
 *   h[pair]   = silu(gate_e . x_tok) * (up_e . x_tok)       (n_ff)
 *   out[pair] = weight_pair * (down_e . h[pair])            (n_embd, at out + pair * n_embd)
 * or, for gpt-oss (cpu_moe_set_oss), with each expert's biases and the clamped SwiGLU:
 *   h[pair]   = swiglu_oai(gate_e . x_tok + bg_e, up_e . x_tok + bu_e)
 *   out[pair] = weight_pair * (down_e . h[pair] + bd_e)
 * with activations quantized for each part's type (cpu_quantize_acts) and every product one
 * cpu_matmul row dot, so a pair's output is the same bits whatever else is in the window, which
 * groups it shares, the thread count, or which tier computed it. moe_combine adds a token's k
 * outputs afterwards. Each group's weights are read once for all its pairs; the rows of all groups
 * of a step are shared out in one parallel loop (cpu_mm.h).
 * A cpu_moe holds scratch for up to max_pairs pairs; one thread at a time calls cpu_moe_ffn.
 */
#ifndef STRATA_CPU_MOE_H
#define STRATA_CPU_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ref/moe.h"

struct pool;

/* One part's matrix shape: n_out rows of n_in elements of type, row_bytes apart. */
struct cpu_moe_part {
    uint32_t type, n_in, n_out;
    uint64_t row_bytes;
};

/* A layer's expert parts: gate and up (n_ff, n_embd), down (n_embd, n_ff). */
struct cpu_moe_parts {
    struct cpu_moe_part gate, up, down;
};

/* gpt-oss's experts: biases and the clamped SwiGLU. */
struct cpu_moe_oss {
    bool bias;    /* each expert has F32 biases: parts 3, 4, 5 of the part function */
    bool glu_oai; /* ops_swiglu_oai with alpha, limit instead of ops_swiglu */
    float alpha, limit;
};

/* cpu_moe_part_fn returns the rows of part (0 gate, 1 up, 2 down) of expert e, or with biases
 * (cpu_moe_set_oss) their biases (3 gate, 4 up: n_ff floats; 5 down: n_embd floats); any
 * thread. */
typedef const void *(*cpu_moe_part_fn)(void *ctx, uint32_t expert, int part);

struct cpu_moe;

/* cpu_moe_init: scratch for up to max_pairs pairs of layers up to n_embd wide with experts up to
 * n_ff wide, activations up to act_stride bytes a row (quant_act_bytes of the widest part, a
 * multiple of 64). Caller owns *out (cpu_moe_fini). STRATA_ENOMEM. */
int cpu_moe_init(uint32_t max_pairs, uint32_t n_embd, uint32_t n_ff, size_t act_stride,
                 uint32_t max_groups, struct cpu_moe **out);

void cpu_moe_fini(struct cpu_moe *w);

/* cpu_moe_set_oss makes w's steps gpt-oss's (o copied; all false: the plain SwiGLU step, the
 * default). Not while a step runs. */
void cpu_moe_set_oss(struct cpu_moe *w, const struct cpu_moe_oss *o);

/* cpu_moe_ffn computes the pairs of groups[0..n_groups) (moe_group order) for tokens x (n_tok rows
 * of x_stride floats, each n_embd wide) routed top-k with weights pair_w[n_tok * k], into out
 * (rows of n_embd floats at pair index). Rows of out of pairs in no group are not written.
 * Returns 0, STRATA_EINVAL (more pairs or groups than the scratch), or a quantization error.
 * *weight_bytes (may be NULL) gets the bytes of weights streamed. Blocks until done. */
int cpu_moe_ffn(struct cpu_moe *w, struct pool *pool, const struct cpu_moe_parts *parts,
                cpu_moe_part_fn part, void *ctx, const struct moe_group *groups, int n_groups,
                const int32_t *pair_idx, const float *pair_w, uint32_t n_tok, int k, const float *x,
                size_t x_stride, float *out, uint64_t *weight_bytes);

#endif
