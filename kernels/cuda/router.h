/* router — the MoE router's softmax and top-k on the GPU, one warp per token.
 *
 * CU_ROUTER_SOFTMAX_TOPK (qwen3moe, olmoe, qwen2moe): softmax over all n_exp logits, then the k
 * largest probabilities; with renorm the k weights are divided by their sum (qwen3moe).
 * CU_ROUTER_TOPK_SOFTMAX (Mixtral): the k largest logits, then softmax over those k.
 * Ties go to the lower expert id, as in the CPU reference. ids/weights are [n_tok][k], in descending
 * weight order. n_exp <= 256, k <= 16. Asynchronous on stream.
 */
#ifndef STRATA_CUDA_ROUTER_H
#define STRATA_CUDA_ROUTER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum cu_router_mode { CU_ROUTER_SOFTMAX_TOPK = 0, CU_ROUTER_TOPK_SOFTMAX = 1 };

int cu_router_topk(const float *logits, int64_t n_tok, int n_exp, int k, enum cu_router_mode mode,
                   int renorm, int32_t *ids, float *weights, void *stream);

#ifdef __cplusplus
}
#endif
#endif
