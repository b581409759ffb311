/* moe_ffn — the routed experts of one MoE layer on the GPU, all hit experts in a few launches.
 *
 * Expert weights come from slots: slot_ptr[e] is the device address of expert e's blob (the arena
 * blob copied into a VRAM slot, 16-byte aligned), parts at the offsets of struct cu_moe_parts
 * (multiples of 16), each in its own type. The host groups the (token, k) pairs routed to resident
 * experts by expert id (moe_group, ascending ids, at most CU_MOE_MAX_PAIRS pairs a group);
 * misses are left to the CPU. For each pair of a group:
 *   h[pair]   = silu(gate_e . x_tok) * (up_e . x_tok)           (n_ff per pair, at tok * k + j)
 *   out[pair] = weight_pair * (down_e . h[pair])                (n_embd per pair)
 * Each group's weights are read once for all its pairs. Quantized parts multiply activations
 * quantized on the GPU (qact.h) exactly as the CPU reference does (qdot_ref over quant_activations:
 * gate, up, h (glibc's expf in silu, expf.cuh) and out bit-identical to the CPU's); float parts
 * multiply in fp32. cu_moe_combine then sums each token's k outputs in ascending expert-id order (DESIGN §3.4),
 * so a pair computed by the CPU and copied into out[] combines the same way. Asynchronous on stream.
 */
#ifndef STRATA_CUDA_MOE_FFN_H
#define STRATA_CUDA_MOE_FFN_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/ref/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CU_PART_GATE = 0, CU_PART_UP = 1, CU_PART_DOWN = 2 };

struct cu_moe_parts {
    uint32_t type[3];   /* qtype of gate, up, down */
    uint64_t off[3];    /* byte offset of each part inside a blob */
    int64_t n_embd;     /* gate/up: n_ff rows of n_embd; down: n_embd rows of n_ff */
    int64_t n_ff;
    uint32_t n_slots;   /* cu_moe_ffn_dev: entries of slot_ptr (one per expert id, none written
                         * by the pass), read into shared memory before the wait on the kernel
                         * ahead; 0 or above CU_MOE_SLOT_CACHE: each read when its group comes */
};

#define CU_MOE_SLOT_CACHE 256

#define CU_MOE_MAX_PAIRS 16 /* pairs of one group: an expert with more gets several groups */

/* Groups come from moe_group (kernels/ref/moe.h, shared with the CPU expert step) with mask = the
 * resident experts and max_pairs = CU_MOE_MAX_PAIRS. */

/* cu_moe_workspace_bytes: the workspace cu_moe_ffn needs for n_tok tokens routed top-k. */
size_t cu_moe_workspace_bytes(const struct cu_moe_parts *parts, int64_t n_tok, int k);

/* cu_moe_ffn: groups, pair_idx, pair_w (weights [n_tok * k]) on the device; h is scratch of
 * n_tok * k * n_ff floats (it ends holding h for the pairs of resident experts); ws holds
 * cu_moe_workspace_bytes; out is [n_tok * k][n_embd]. STRATA_EUNSUPPORTED for a part type the GPU
 * does not compute with, STRATA_EINVAL for a misaligned part or a bad shape. */
int cu_moe_ffn(const struct cu_moe_parts *parts, const uint8_t *const *slot_ptr,
               const struct moe_group *groups, int n_groups, const int32_t *pair_idx,
               const float *pair_w, int64_t n_tok, int k, const float *x, float *h, void *ws,
               float *out, void *stream);

/* Flags of cu_moe_ffn_dev. */
enum {
    CU_MOE_EVERY_PAIR = 1,  /* every pair is in a group (no mask): h needs no zeroing first */
    CU_MOE_UNFUSED = 2,     /* gate, up and SwiGLU as three launches (cu_moe_ffn's; a diagnostic) */
    CU_MOE_X_QUANTIZED = 4, /* x is already the gate's activations (cu_quantize_acts rows for the
                             * gate type; up's quantize alike): none are made here */
    CU_MOE_MMA = 8,         /* prompt chunks: groups of up to CU_MOE_MMA_PAIRS pairs on the int8
                             * tensor cores (cu_moe_mma_ok parts only; the same bits) */
};

#define CU_MOE_MMA_PAIRS 64 /* pairs of a group with CU_MOE_MMA: one MMA tile's columns */

/* cu_moe_mma_ok: whether CU_MOE_MMA computes these parts (all three quantized, gate and up of one
 * type). */
bool cu_moe_mma_ok(const struct cu_moe_parts *parts);

/* cu_moe_ffn_dev: cu_moe_ffn with the group count in device memory (*n_groups, as cu_moe_group
 * leaves it), at most max_groups (cu_moe_max_groups): every launch has the worst-case grid and its
 * idle CTAs exit, so the step needs no host round trip and can be captured in a CUDA graph. Gate
 * and up of one quantized type run as one launch with SwiGLU in its epilogue (unless
 * CU_MOE_UNFUSED): the same row dots and expressions, so the same bits as cu_moe_ffn for the same
 * groups either way. */
int cu_moe_ffn_dev(const struct cu_moe_parts *parts, const uint8_t *const *slot_ptr,
                   const struct moe_group *groups, const int32_t *n_groups, int max_groups,
                   const int32_t *pair_idx, const float *pair_w, int64_t n_tok, int k,
                   const float *x, float *h, void *ws, float *out, unsigned flags, void *stream);

/* cu_moe_combine: y[t] = sum over j of out[t * k + j] in ascending ids[t * k + j] order. */
int cu_moe_combine(const float *out, const int32_t *ids, int64_t n_tok, int k, int64_t n_embd,
                   float *y, void *stream);

/* cu_moe_combine_add: x[t] += that same sum (the residual add fused: the same bits as
 * cu_moe_combine then cu_add). */
int cu_moe_combine_add(const float *out, const int32_t *ids, int64_t n_tok, int k, int64_t n_embd,
                       float *x, void *stream);

/* cu_moe_combine_add_norm: cu_moe_combine_add, then xn[t] = RMSNorm of the new x[t] with weights
 * norm_w (the next layer's attention norm, or the output norm): the bits of cu_moe_combine_add
 * then cu_rmsnorm, in one launch; with sync (cu_row_sync_bytes(n_tok), norm.h; or NULL: one CTA a
 * token) each token split over a CTA per 256 elements, the same bits. Rows of n_embd >=
 * CU_ROW_NORM_MIN (norm.h) only (else STRATA_EINVAL). */
int cu_moe_combine_add_norm(const float *out, const int32_t *ids, int64_t n_tok, int k,
                            int64_t n_embd, float *x, const float *norm_w, float eps, float *xn,
                            void *sync, void *stream);

/* cu_moe_combine_add_norm_q: cu_moe_combine_add_norm (sync as there), then xn's rows quantized
 * into act for wtype weights (the next product's), the bytes cu_quantize_acts writes, in the same
 * launch. Weights whose activations are Q8_0 or Q8_K only (else STRATA_EINVAL). */
int cu_moe_combine_add_norm_q(const float *out, const int32_t *ids, int64_t n_tok, int k,
                              int64_t n_embd, float *x, const float *norm_w, float eps, float *xn,
                              uint32_t wtype, void *act, void *sync, void *stream);

#ifdef __cplusplus
}
#endif
#endif
