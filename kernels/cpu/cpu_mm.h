/* cpu_mm — a set of matrix products shared out over a thread pool as one parallel loop.
 *
 * A step's matrices (q, k and v; or gate and up of every expert hit) go to the pool as one loop
 * over items of whole 8-row kernel groups of all of them, so threads stream distinct rows and a
 * decode step pays one wake-up per step rather than one per matrix. Each output element is one
 * cpu_matmul row dot, so the split never changes a bit. Used by the CPU backend's dense products
 * and by the routed-expert step (moe.h). The caller's thread runs cpu_mm_run; not reentrant on
 * one cpu_mm_runner.
 */
#ifndef STRATA_CPU_MM_H
#define STRATA_CPU_MM_H

#include <stddef.h>
#include <stdint.h>

struct pool;

/* One matrix (n_out rows of n_in elements of type, row_bytes apart) times n_tok rows of
 * activations (made by cpu_quantize_acts for type, act_stride bytes apart) into n_tok rows of out
 * (out_stride floats apart). */
struct cpu_mm_task {
    uint32_t type, n_in, n_out;
    uint64_t row_bytes;
    const void *w;
    const void *acts;
    size_t act_stride;
    uint32_t n_tok;
    float *out;
    size_t out_stride;
};

/* cpu_mm_run computes tasks[0..n) on pool; first is scratch of n + 1 entries. Returns the weight
 * bytes streamed (each matrix once). Blocks until done. */
uint64_t cpu_mm_run(struct pool *pool, const struct cpu_mm_task *tasks, uint32_t n,
                    uint32_t *first);

#endif
