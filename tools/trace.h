/* trace — which experts a model routes each token to, and what an expert cache would make of it:
 * `strata trace`.
 *
 * A trace holds, per token and per layer, the n_used experts the router picked (ascending ids).
 * trace_record fills one by running the reference forward pass over whole windows with its
 * routing hook (fwd_set_route), which names the tokens routed to each expert of each layer; a
 * token's routing does not depend on the batch it shares a pass with (bit-exact mode).
 * The analysis reads a trace only: per-layer expert counts, the entropy of the popularity, and the
 * hit rate of a per-layer LRU cache replaying the trace in token order (each token's experts in
 * ascending id order, as the forward pass visits them; misses load the expert, evicting the least
 * recently used). A trace is built by one thread; analysis functions only read it.
 */
#ifndef STRATA_TRACE_H
#define STRATA_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "common/arena/model.h"

struct trace {
    uint32_t n_layer, n_expert, n_used;
    uint64_t n_tokens;
    uint16_t *sel; /* (n_tokens, n_layer, n_used) expert ids, ascending within a (token, layer) */
    uint64_t cap;  /* tokens sel has room for */
};

/* trace_init prepares an empty trace. STRATA_EINVAL for a zero size, more than 65535 experts or
 * n_used > n_expert. */
int trace_init(struct trace *t, uint32_t n_layer, uint32_t n_expert, uint32_t n_used);

/* trace_fini frees t's storage. */
void trace_fini(struct trace *t);

/* trace_push appends one token's routing: sel holds n_layer * n_used expert ids, layer by layer,
 * each layer's distinct and ascending. STRATA_EINVAL otherwise (the detail says where),
 * STRATA_ENOMEM. */
int trace_push(struct trace *t, const uint16_t *sel);

/* trace_record runs ids[0..n) through m (borrowed, not changed) in windows of ctx tokens, each
 * from an empty context, and appends every token's routing to t (made by trace_init with m's
 * sizes). Blocks; uses n_threads threads. Errors: STRATA_EINVAL (ctx 0, an id outside the
 * vocabulary), STRATA_EINTERNAL when the forward pass did not report exactly n_used experts in a
 * layer for a token, STRATA_ENOMEM, forward-pass errors. */
int trace_record(const struct model *m, const int32_t *ids, size_t n, uint32_t ctx,
                 uint32_t n_threads, struct trace *t);

/* trace_counts writes how many tokens picked each expert of layer (n_expert counts) to out. */
void trace_counts(const struct trace *t, uint32_t layer, uint64_t *out);

/* trace_entropy: the entropy, in bits, of layer's expert popularity (counts / their sum); 0 for an
 * empty trace. log2(n_expert) means perfectly even routing. */
double trace_entropy(const struct trace *t, uint32_t layer);

/* trace_lru replays layer's accesses through an LRU cache of slots experts (starting empty) and
 * returns the hits; *accesses gets n_tokens * n_used. slots >= n_expert hits all but the first
 * access of each expert. */
uint64_t trace_lru(const struct trace *t, uint32_t layer, uint32_t slots, uint64_t *accesses);

#endif
