/* moe_ffn — the routed experts of one MoE layer on the GPU, all hit experts in one pass.
 *
 * Expert weights come from slots: slot_ptr[e] is the device address of expert e's blob (the arena
 * blob copied into a VRAM slot), parts at the offsets of struct cu_moe_parts, each in its own type.
 * The host groups the (token, k) pairs routed to resident experts by expert id (cu_moe_group, in
 * ascending id order); misses are left to the CPU. For each group:
 *   h[pair]   = silu(gate_e . x_tok) * (up_e . x_tok)           (n_ff per pair)
 *   out[pair] = weight_pair * (down_e . h[pair])                (n_embd per pair, at tok * k + j)
 * Each group's weights are read once for all its pairs (up to 16 at a time). cu_moe_combine then sums
 * each token's k outputs in ascending expert-id order (DESIGN §3.4), so a pair computed by the CPU
 * and copied into out[] combines the same way. Asynchronous on stream.
 */
#ifndef STRATA_CUDA_MOE_FFN_H
#define STRATA_CUDA_MOE_FFN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { CU_PART_GATE = 0, CU_PART_UP = 1, CU_PART_DOWN = 2 };

struct cu_moe_parts {
    uint32_t type[3];   /* qtype of gate, up, down */
    uint64_t off[3];    /* byte offset of each part inside a blob */
    int64_t n_embd;     /* gate/up: n_ff rows of n_embd; down: n_embd rows of n_ff */
    int64_t n_ff;
};

struct cu_moe_group {
    int32_t expert;     /* expert id */
    int32_t first;      /* index of its first pair in pair_idx */
    int32_t count;      /* pairs routed to it */
};

/* cu_moe_group (host): from ids[n_tok * k] and a residency test (resident[e] != 0), fill groups
 * (ascending expert id) and pair_idx (pair = tok * k + j, grouped); returns the group count. Arrays
 * sized n_tok * k. Pure host code: the worker knows routing before it splits hits and misses. */
int cu_moe_group(const int32_t *ids, int64_t n_tok, int k, const uint8_t *resident,
                 struct cu_moe_group *groups, int32_t *pair_idx);

/* cu_moe_ffn: groups, pair_idx, pair_w (weights [n_tok * k]) on the device; h is scratch of
 * n_tok * k * n_ff floats; out is [n_tok * k][n_embd]. */
int cu_moe_ffn(const struct cu_moe_parts *parts, const uint8_t *const *slot_ptr,
               const struct cu_moe_group *groups, int n_groups, const int32_t *pair_idx,
               const float *pair_w, int k, const float *x, float *h, float *out, void *stream);

/* cu_moe_combine: y[t] = sum over j of out[t * k + j] in ascending ids[t * k + j] order. */
int cu_moe_combine(const float *out, const int32_t *ids, int64_t n_tok, int k, int64_t n_embd,
                   float *y, void *stream);

#ifdef __cplusplus
}
#endif
#endif
