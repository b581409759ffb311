/* fwd — the reference forward pass: a batch of tokens of several sequences through the model,
 * on the CPU with the kernels of kernels/cpu (AVX2 or AVX-512 when the CPU has them, equal bit for
 * bit to the plain-C kernels/ref), writing K/V into a paged cache and logits for the tokens that
 * ask for them.
 *
 * A batch is any mix of prompt chunks and decode steps: each token names its sequence, and the
 * tokens of one sequence take consecutive positions after those it already holds (in batch order).
 * Bit-exact (DESIGN 3.4): a token's logits depend only on the model and its sequence's history,
 * never on the batch, the chunking, the thread count or decode vs re-prefill: every matmul output
 * is one row dot of one token, attention walks keys in fixed blocks, experts are added to a token
 * in expert-id order, and threads only split independent rows or heads.
 * A fwd object owns its scratch and a pool of n_threads-1 threads; one thread at a time calls
 * fwd_eval. The model and cache are borrowed and must outlive it.
 * Kernels: kernels/cpu (AVX2 / AVX-512 when the CPU has them, equal bit for bit to kernels/ref).
 * Each routed expert is computed once per pass for all the tokens routed to it, and the rows of
 * all a layer's experts are shared out across the threads in one parallel loop per step.
 */
#ifndef STRATA_FWD_H
#define STRATA_FWD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/arena/model.h"
#include "gpu-worker/kv.h"

#define FWD_KV_BLOCK 32 /* positions per KV block by default: one attention key block */

struct fwd_opts {
    uint32_t n_threads;  /* threads computing a pass, the caller's included; 0 means 1 */
    uint32_t max_pass_tokens; /* most tokens one fwd_eval takes; scratch is sized for it */
};

struct fwd_token {
    struct kv_seq *seq; /* the sequence the token extends */
    int32_t id;         /* token id < n_vocab */
    bool logits;        /* write this token's logits */
};

struct fwd;

/* Where a fwd's time went since start or the last fwd_reset_stats (wall time of the caller). */
struct fwd_stats {
    uint64_t passes;       /* fwd_eval calls */
    uint64_t tokens;       /* tokens evaluated */
    double total_s;        /* inside fwd_eval */
    double attention_s;    /* norms, q/k norms, RoPE, K/V writes, attention over the cache */
    double dense_s;        /* q/k/v/o projections, router, shared expert */
    double experts_s;      /* routed experts: gather, gate/up, SwiGLU, down, weighted sum */
    double output_s;       /* final norm and output matmul */
    uint64_t weight_bytes; /* bytes of weight matrices the matmuls streamed */
};

/* fwd_kv_config: the cache configuration for m with contexts of n_ctx positions and up to n_seq
 * sequences of full length (0 for n_ctx: the model's trained context). */
void fwd_kv_config(const struct model *m, uint32_t n_ctx, uint32_t n_seq, struct kv_config *out);

/* fwd_start allocates scratch and starts the thread pool. kv must have been made with
 * fwd_kv_config's layer and row sizes for m. Caller owns *out (fwd_close). */
int fwd_start(const struct model *m, struct kv_cache *kv, const struct fwd_opts *o,
              struct fwd **out);

/* fwd_close stops the threads and frees; NULL is fine. */
void fwd_close(struct fwd *f);

/* fwd_eval runs n (1..max_pass_tokens) tokens, growing their sequences, and writes the logits of each
 * token with .logits set, in batch order, as rows of n_vocab floats. Blocks until done. Errors:
 * STRATA_EINVAL (count, token id), STRATA_ELIMIT (past a sequence's context), STRATA_ENOSPC (KV
 * pool), STRATA_ENOMEM, a quant error; on error every sequence keeps its previous length. */
int fwd_eval(struct fwd *f, const struct fwd_token *toks, uint32_t n, float *logits);

/* fwd_route_fn: the tokens a pass routes to one expert of one layer. tokens[0..n_tokens) are
 * indices into the pass's batch, ascending; the array is the pass's scratch, valid during the
 * call only. */
typedef void (*fwd_route_fn)(void *ctx, uint32_t layer, uint32_t expert, const uint32_t *tokens,
                             uint32_t n_tokens);

/* fwd_set_route makes every later fwd_eval call fn (NULL: no hook, the default, at no cost) once
 * per (layer, expert) that holds tokens of the pass, after the layer's routing and before its
 * experts run: layers in order, a layer's experts in ascending id order, so each token meets its
 * experts of a layer in ascending id order. Over one layer, n_tokens sums to n * n_expert_used.
 * fn runs on the thread that calls fwd_eval, never on the pool's. A pass that fails may already
 * have reported the layers it reached. Same thread as fwd_eval. */
void fwd_set_route(struct fwd *f, fwd_route_fn fn, void *ctx);

/* fwd_get_stats copies the counters; fwd_reset_stats zeroes them. Same thread as fwd_eval. */
void fwd_get_stats(const struct fwd *f, struct fwd_stats *out);
void fwd_reset_stats(struct fwd *f);

/* fwd_prompt feeds ids[0..n) to s in chunks of `chunk` tokens (0 or above max_pass_tokens: max_pass_tokens)
 * and writes the last token's logits to logits (n_vocab floats) when it is non-NULL. Errors as
 * fwd_eval; on error s holds the chunks that completed. */
int fwd_prompt(struct fwd *f, struct kv_seq *s, const int32_t *ids, uint32_t n, uint32_t chunk,
               float *logits);

#endif
