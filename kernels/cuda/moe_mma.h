/* moe_mma — the routed experts of a prompt chunk on the int8 tensor cores (cu_moe_ffn_dev's
 * CU_MOE_MMA, moe_ffn.h).
 *
 * One part (gate, up or down), or gate and up together with SwiGLU, of every group's expert times
 * the group's activation rows, in one launch for every group of a layer: CTA (x, y) takes rows
 * 64x .. 64x + 63 of the part for group y's pairs (at most CU_MOE_MMA_TILE, one MMA column each;
 * groups past the count exit). The activation row of pair p is row p / act_div of act
 * (cu_quantize_acts rows for the part's type); the result goes to out[p * ld + r], times scale[p]
 * when scale is set, or with gu, silu(gate) * up (mf_swiglu's expression, moe_ffn.cu). Every
 * (row, pair) is qdot_ref's arithmetic (matmul.h's cu_matmul_q), so the same bits as the matvec
 * kernels of moe_ffn.cu. Asynchronous on stream.
 */
#ifndef STRATA_CUDA_MOE_MMA_H
#define STRATA_CUDA_MOE_MMA_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/ref/moe.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CU_MOE_MMA_TILE 64 /* the most pairs of a group: one tile's MMA columns */

struct cu_moe_mma_task {
    const uint8_t *const *slot_ptr; /* device address of each expert's blob */
    const struct moe_group *groups;
    const int32_t *pair_idx;
    uint64_t off, off_up; /* the part's offset in a blob; gu: up's */
    int nrows, ncols;     /* of the part */
    const void *act;      /* cu_quantize_acts rows */
    int64_t arb;          /* bytes between activation rows */
    int act_div;
    float *out;
    int64_t ld;
    const float *scale;
    const int32_t *n_groups; /* the group count in device memory, or NULL */
    int max_groups;          /* the grid's groups (the count itself when n_groups is NULL) */
};

/* cu_moe_mma: the task's part of a quantized GPU type (or its gate and up, gu). */
void cu_moe_mma(uint32_t type, const struct cu_moe_mma_task *t, bool gu, void *stream);

#ifdef __cplusplus
}
#endif
#endif
