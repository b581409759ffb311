/* moe_group (GPU) — the routed pairs of a layer grouped by expert on the device, so a MoE step
 * needs no host round trip (and a decode step can be captured as a CUDA graph).
 *
 * cu_moe_group writes exactly what moe_group (kernels/ref/moe.h) writes for the same arguments:
 * groups by ascending expert id, each expert's pairs in pair order, runs of at most max_pairs,
 * pair_idx listing them, entries past the count untouched; the group count goes to device memory
 * (*n_groups), where cu_moe_ffn_dev reads it, so the launches after it have a fixed worst-case
 * grid (cu_moe_max_groups) and their idle CTAs exit. One CTA: the counts by shared atomics, a
 * block scan over the experts for the offsets, then one warp walks the pairs in order (warp match
 * for the ranks among equal ids), so the layout never depends on scheduling. ids outside
 * [0, n_expert) or of experts the mask (device bytes, NULL: all) leaves out are skipped, as
 * moe_group skips them. Asynchronous on stream.
 */
#ifndef STRATA_CUDA_MOE_GROUP_H
#define STRATA_CUDA_MOE_GROUP_H

#include <stdint.h>

#include "kernels/cuda/router.h"
#include "kernels/ref/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CU_MOE_GROUP_MAX_EXPERTS 1024

/* cu_moe_max_groups: the most groups n_pairs pairs over n_expert experts make in runs of
 * max_pairs (each expert's last run may be short): min(n_pairs, n_pairs / max_pairs + experts). */
int64_t cu_moe_max_groups(int64_t n_pairs, uint32_t n_expert, uint32_t max_pairs);

/* cu_moe_group: ids [n_tok * k], groups (cu_moe_max_groups entries), pair_idx (n_tok * k) and
 * n_groups (one int32) on the device. STRATA_EINVAL for n_expert above
 * CU_MOE_GROUP_MAX_EXPERTS, max_pairs 0 or a bad shape. */
int cu_moe_group(const int32_t *ids, int64_t n_tok, int k, uint32_t n_expert, const uint8_t *mask,
                 uint32_t max_pairs, struct moe_group *groups, int32_t *pair_idx, int32_t *n_groups,
                 void *stream);

#define CU_ROUTE_GROUP_MAX_TOKENS 32 /* tokens cu_router_group routes in its one CTA */

/* cu_router_group: cu_router_topk (router.h) then cu_moe_group over its picks, in one launch, for
 * 1..CU_ROUTE_GROUP_MAX_TOKENS tokens: the same ids, weights, groups, pair_idx and count, bit for
 * bit (the same code). STRATA_EINVAL outside those shapes (the caller makes the two calls). */
int cu_router_group(const float *logits, int64_t n_tok, int n_exp, int k, enum cu_router_mode mode,
                    int renorm, int32_t *ids, float *weights, const uint8_t *mask,
                    uint32_t max_pairs, struct moe_group *groups, int32_t *pair_idx,
                    int32_t *n_groups, void *stream);

#ifdef __cplusplus
}
#endif
#endif
