/* moe — the host side of the routed-expert step, shared by every backend: grouping (token, k) pairs
 * by expert and the combine of each token's expert outputs.
 *
 * A pair is tok * k + j: the j-th expert of token tok as the router picked it (ids[pair]). Groups
 * list the pairs of the experts a mask selects, by ascending expert id, each expert's pairs in
 * token order, cut into runs of at most max_pairs (the GPU's register budget: CU_MOE_MAX_PAIRS; the
 * CPU takes any count at the same bits and passes UINT32_MAX). The expert step writes each pair's
 * weighted output at out[pair]; moe_combine then adds a token's k outputs in ascending expert-id
 * order (DESIGN 3.4), so outputs made by different tiers combine to the same bits. Pure functions.
 */
#ifndef STRATA_REF_MOE_H
#define STRATA_REF_MOE_H

#include <stddef.h>
#include <stdint.h>

struct moe_group {
    int32_t expert; /* expert id */
    int32_t first;  /* index of its first pair in pair_idx */
    int32_t count;  /* pairs in this run */
};

/* moe_group fills groups and pair_idx (arrays of n_tok * k) from ids[n_tok * k] for the experts
 * with mask[e] != 0 (NULL: every expert), n_expert experts; returns the group count. Pairs of
 * other experts are left out. */
int moe_group(const int32_t *ids, int64_t n_tok, int k, uint32_t n_expert, const uint8_t *mask,
              uint32_t max_pairs, struct moe_group *groups, int32_t *pair_idx);

/* moe_combine: y[t] = sum over j of out[t * k + j] (n_embd floats each), from zero, in ascending
 * ids[t * k + j] order; tokens [t0, t1). */
void moe_combine(const float *out, const int32_t *ids, uint32_t t0, uint32_t t1, int k,
                 size_t n_embd, float *y);

#endif
