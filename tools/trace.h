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
 *
 * trace_replay replays a trace through an expert cache the way the worker runs one: windows of
 * tokens, one pool of slots over all layers (struct cache, first filled evenly as a worker without
 * heat fills it), rounds of at most `swaps` moves every `every` windows, a move picked after
 * window W usable from window W+1+lag (its victim leaves the table at once, as in the async tier),
 * and no round while one is in flight. A hit is a (token, expert) pair whose expert the published
 * table holds during the pair's window. The policies differ only in the pick (see enum).
 */
#ifndef STRATA_TRACE_H
#define STRATA_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/arena/model.h"
#include "gpu-worker/tier.h"

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

/* The trace file (`strata trace --save`, scripts/train-moe.py; read by `strata trace --replay`),
 * little endian: the 8 bytes "STRATATR", u32 version (1), u32 n_layer, n_expert, n_used, ctx
 * (the tokens of each recording window, each from an empty context; 0 unknown), u64 n_tokens,
 * then the n_tokens * n_layer * n_used expert ids in trace order, one byte each when n_expert
 * <= 256, else u16. */

/* trace_save writes t, recorded in windows of ctx tokens, to path. STRATA_EIO with the path. */
int trace_save(const struct trace *t, uint32_t ctx, const char *path);

/* trace_load reads path into t (fresh; trace_fini frees it) and its window into *ctx (may be
 * NULL). STRATA_EIO, STRATA_EFORMAT for a file that is no trace, names more than
 * TRACE_MAX_PER_TOKEN ids a token, is cut short or has bytes after its ids, or holds a (token,
 * layer) whose ids are out of range or not ascending (the detail says where), STRATA_ENOMEM. */
int trace_load(const char *path, struct trace *t, uint32_t *ctx);

/* trace_read is trace_load on an open stream (read to its end; name is for messages). */
int trace_read(FILE *f, const char *name, struct trace *t, uint32_t *ctx);

/* n_layer * n_used a trace file may name: 4096 layers of 256 picks */
#define TRACE_MAX_PER_TOKEN (1u << 20)

/* Reuse distances: for each access of a (layer, expert) after its first, the tokens since that
 * layer last picked that expert (1: the token before), in TRACE_REUSE_BUCKETS power-of-two
 * buckets [1], [2, 3], [4, 7], ..., the last open-ended. */
#define TRACE_REUSE_BUCKETS 8

/* trace_reuse adds layer's reuse distances to hist (counts) and to iid what a stream with the
 * same popularity but no temporal order would give in expectation: each token picking expert e
 * independently with probability p_e = count_e / n_tokens, so its count_e - 1 gaps are geometric
 * (the bucket [a, b] holds (1 - p)^(a-1) - (1 - p)^b of them). More mass at short distances than
 * iid is temporal locality beyond popularity, which only a policy that adapts can use. */
void trace_reuse(const struct trace *t, uint32_t layer, uint64_t hist[TRACE_REUSE_BUCKETS],
                 double iid[TRACE_REUSE_BUCKETS]);

/* trace_counts writes how many tokens picked each expert of layer (n_expert counts) to out. */
void trace_counts(const struct trace *t, uint32_t layer, uint64_t *out);

/* trace_entropy: the entropy, in bits, of layer's expert popularity (counts / their sum); 0 for an
 * empty trace. log2(n_expert) means perfectly even routing. */
double trace_entropy(const struct trace *t, uint32_t layer);

/* trace_lru replays layer's accesses through an LRU cache of slots experts (starting empty) and
 * returns the hits; *accesses gets n_tokens * n_used. slots >= n_expert hits all but the first
 * access of each expert. */
uint64_t trace_lru(const struct trace *t, uint32_t layer, uint32_t slots, uint64_t *accesses);

/* The replay's policies. All but STATIC start from the even fill and pick up to `swaps` moves a
 * round; the baselines take victims from any layer, the tier from the candidate's own layer. */
enum trace_policy {
    TRACE_TIER,   /* gpu-worker/tier.h's tier_round on the counts (prompt-chunk rule, decay,
                     min, lead): exactly the worker's rule */
    TRACE_LRU,    /* the most recently used non-residents replace the least recently used */
    TRACE_LFU,    /* the most often used so far (undecayed counts) replace the least */
    TRACE_STATIC, /* the hottest (layer, expert)s of the whole trace, fixed from the start */
    TRACE_BELADY, /* offline: the non-resident used soonest (from its landing window) replaces
                     the resident used farthest ahead; one used later than every resident is not
                     admitted (bypass). "Sooner" first counts the pairs in the windows up to
                     where the next round could land (a prompt chunk uses most experts in its
                     next window), then the next use after them */
    TRACE_N_POLICY
};

/* trace_policy_name: "tier", "lru", "lfu", "static", "belady". */
const char *trace_policy_name(enum trace_policy p);

struct trace_replay_opts {
    uint32_t window;       /* tokens a window: 1 replays decode steps (each pair counts); more
                              replays prompt chunks (each expert of a chunk counts once) */
    uint32_t lag;          /* windows a move's copy takes: picked after W, usable from W+1+lag
                              (0: the blocking tier; 1: the async tier with ASYNC_WAIT) */
    struct tier_opts tier; /* every (0: no rounds), swaps, decay, min_count, lead; async unused */
    bool chunk_share;      /* the tier counts an expert of a prompt chunk by its share of the
                              chunk's tokens (pairs / tokens, at most 1) rather than once, the
                              worker's rule: an alternative to compare, not what the worker runs */
};

/* trace_replay replays t through a cache of slots slots (at most n_layer * n_expert) under policy
 * p and o; *hits and *accesses get the pairs hit and the pairs replayed (n_tokens * n_layer *
 * n_used). Deterministic. STRATA_EINVAL for window 0 or too many slots, STRATA_ENOMEM. */
int trace_replay(const struct trace *t, enum trace_policy p, uint32_t slots,
                 const struct trace_replay_opts *o, uint64_t *hits, uint64_t *accesses);

#endif
