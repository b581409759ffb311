/* pool — a fixed set of compute threads that run one parallel loop at a time (the forward pass's
 * matmuls, attention heads, expert rows).
 *
 * pool_for(n items) gives each thread a contiguous share of the items, which it claims a chunk of
 * `grain` at a time through a counter of its own; a thread done with its share takes chunks of
 * the others', so a thread that got a core to itself does more than one sharing its core. Each
 * thread walks consecutive items: a matmul thread streams one run of rows, its prefetch running
 * on from one chunk into the next (chunks handed out in turn through one counter left each
 * thread every other chunk: a 1024-row product, 2 threads, Zen 4, 47 us against 22). Items must
 * be independent (distinct output rows), which is what keeps results independent of the split.
 * The calling thread works too. Between loops workers spin for POOL_SPIN_US, then sleep on a
 * condition variable: back-to-back loops of a forward pass start in microseconds, an idle pool
 * costs nothing. Nothing is allocated after pool_start.
 * One thread at a time calls pool_for (the owner of the pool); fn runs on every pool thread.
 */
#ifndef STRATA_POOL_H
#define STRATA_POOL_H

#include <stdint.h>

#define POOL_SPIN_US 300 /* how long an idle worker polls for the next loop before sleeping */

struct pool;

/* pool_fn runs items [lo, hi) on pool thread `thread` (0 = the caller, 1..n_threads-1). */
typedef void (*pool_fn)(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread);

/* pool_start starts n_threads - 1 workers (n_threads 0 means 1: no workers). Errors:
 * STRATA_ENOMEM, an errno code from pthread_create. Caller owns *out (pool_close). */
int pool_start(uint32_t n_threads, struct pool **out);

/* pool_close stops and joins the workers; NULL is fine. */
void pool_close(struct pool *p);

/* pool_threads: n_threads as started, the caller included. */
uint32_t pool_threads(const struct pool *p);

/* pool_for runs fn over items [0, n) in chunks of grain (0 means 1) and returns when every item
 * is done. Runs inline when there is one thread or one chunk. */
void pool_for(struct pool *p, uint32_t n, uint32_t grain, pool_fn fn, void *ctx);

#endif
