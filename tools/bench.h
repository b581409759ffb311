/* bench — what `strata bench` measures: prefill and decode speed of the CPU forward pass on one
 * model, where the time goes, the weight bandwidth it reaches against the machine's measured
 * streaming-read bandwidth, and the same prompt/decode run through llama.cpp (node-llama-cpp) for
 * a side-by-side figure.
 * A run: a warm-up pass pages the weights in; then a `prompt`-token prompt in one chunk (prefill),
 * then `gen` greedy decode steps, one token per pass; `reps` runs, the best of each phase kept
 * (other work on the machine only ever slows a run down). Prompt ids are (i * 7919 + 13) % n_vocab,
 * the rule tools/bench_llama.mjs uses too. Blocking; one run at a time per process.
 */
#ifndef STRATA_BENCH_H
#define STRATA_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu-worker/backend.h"

struct bench_opts {
    const char *model; /* GGUF path */
    uint32_t threads;  /* compute threads; 0: the online CPUs */
    uint32_t prompt;   /* prompt tokens (>= 1) */
    uint32_t gen;      /* decode steps (>= 1) */
    uint32_t reps;     /* runs; 0 means 1 */
    struct backend_opts backend; /* name, KV type, expert cache; the sizes are the bench's */
};

struct bench_result {
    uint32_t threads;
    const char *isa; /* kernels/cpu's ISA name */
    struct backend_info info; /* the backend that ran */
    double prefill_s, decode_s;
    double prefill_tok_s, decode_tok_s;
    struct backend_stats prefill, decode; /* the forward pass's own breakdown of each phase */
    double read_gbs;     /* streaming read bandwidth of this machine, same thread count */
    double decode_gbs;   /* weight bytes per second the decode steps streamed */
    uint64_t file_bytes; /* the GGUF's size */
};

/* bench_run runs o and fills *out. Errors: those of gguf_open, model_load, fwd_start, fwd_eval;
 * STRATA_EINVAL for zero prompt or gen, or prompt + gen above the model's context. */
int bench_run(const struct bench_opts *o, struct bench_result *out);

/* bench_read_gbs measures reading a buffer of `bytes` (>= 64 MiB beats the caches) with n
 * threads, best of 3 passes, in GB/s (1e9 bytes). STRATA_ENOMEM when the buffer cannot be had. */
int bench_read_gbs(uint32_t threads, uint64_t bytes, double *out);

#endif
