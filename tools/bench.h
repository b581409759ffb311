/* bench — what `strata bench` measures: prefill and decode speed of the CPU forward pass on one
 * model, where the time goes, the weight bandwidth it reaches against the machine's measured
 * streaming-read bandwidth, and the same prompt/decode run through llama.cpp (node-llama-cpp) for
 * a side-by-side figure.
 * A run: a warm-up pass pages the weights in; then a `prompt`-token prompt in one chunk (prefill),
 * then `gen` greedy decode tokens, one a pass (or with drafts, as many as were accepted plus one); `reps` runs, the best of each phase kept
 * (other work on the machine only ever slows a run down). Prompt ids are (i * 7919 + 13) % n_vocab,
 * the rule tools/bench_llama.mjs uses too. Blocking; one run at a time per process.
 */
#ifndef STRATA_BENCH_H
#define STRATA_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu-worker/backend.h"

struct bench_opts {
    const char *model; /* GGUF path; with arena, its name (for messages) */
    const char *arena;   /* an arena's name (strata-arena serve): the model is its metadata and
                            its experts its blobs, as a worker sees them; NULL: model's file */
    const char *shm_dir; /* the arena's directory; NULL: /dev/shm */
    uint32_t threads;  /* compute threads; 0: the online CPUs */
    uint32_t prompt;   /* prompt tokens (>= 1) */
    uint32_t gen;      /* decode steps (>= 1) */
    uint32_t reps;     /* runs; 0 means 1 */
    const char *prompt_text; /* a text file: the prompt is its tokens (BOS added), not `prompt`
                                synthetic ids; NULL: synthetic */
    uint32_t spec_lookup;    /* decode with up to N prompt-lookup drafts a pass (spec.h) */
    const char *draft;       /* or with this draft model's (same vocabulary) */
    uint32_t draft_max;      /* its drafts a pass; 0: 4 */
    bool decode_random;      /* decode steps take seeded random ids (as llama-bench's tg does),
                                not the greedy pick: a random-weight model's greedy stream
                                repeats, and its routing with it, which flatters a cache */
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
    uint32_t prompt;     /* prompt tokens run */
    uint64_t drafts_proposed, drafts_accepted, decode_passes; /* the best decode run's */
    uint64_t decode_hits, decode_misses; /* the expert cache's pairs of the last rep's decode */
};

/* bench_run runs o and fills *out. Errors: those of gguf_open, model_load, fwd_start, fwd_eval;
 * STRATA_EINVAL for zero prompt or gen, or prompt + gen above the model's context. */
int bench_run(const struct bench_opts *o, struct bench_result *out);

/* bench_read_gbs measures reading a buffer of `bytes` (>= 64 MiB beats the caches) with n
 * threads, best of 3 passes, in GB/s (1e9 bytes). STRATA_ENOMEM when the buffer cannot be had. */
int bench_read_gbs(uint32_t threads, uint64_t bytes, double *out);

#define BENCH_MAX_TASKS 512 /* matmuls of one parallel loop in the kernel benchmarks */

/* bench_matmul_gbs times cpu_matmul of one matrix of wtype with rows of n_in (quantized gaussians:
 * 64 distinct rows repeated until the matrix holds `bytes`, >= 64 MiB beats the caches) times
 * n_tok tokens, the rows shared over `threads` threads in items of 64 as the forward pass shares
 * them; best of 3 passes, in weight GB/s (1e9 bytes). Errors: STRATA_EINVAL for a type that is
 * not quantized and computable or n_in not a whole number of its blocks, STRATA_ENOMEM. */
int bench_matmul_gbs(uint32_t wtype, uint32_t n_in, uint32_t n_tok, uint32_t threads,
                     uint64_t bytes, double *out);

/* The expert step of decode windows (the CPU's share in the hybrid: the misses). */
struct bench_experts {
    uint32_t window;     /* tokens of the window, each routed to n_expert_used experts */
    uint32_t n_expert;   /* experts per layer they are routed over */
    uint32_t layers;     /* layers timed, each with its own experts */
    double hit;          /* experts a layer runs, on average */
    double tok_per_exp;  /* tokens per expert run, on average */
    double s;            /* best time of the step over all layers */
    uint64_t bytes;      /* expert weight bytes those steps read */
    double gbs;          /* bytes / s */
};

/* bench_experts times the routed-expert step of a decode window of `window` tokens as the
 * forward pass runs it (activations quantized, gathered per expert, gate and up of every expert
 * hit in one parallel loop, SwiGLU, down in another, the weighted sum), over n_expert experts per
 * layer: copies of the model's experts (expert e is the model's e % n_expert, each copy its own
 * memory, so every hit streams from DRAM). Routing is uniform random (fixed seed), distinct
 * experts per token. o gives the model, threads and reps; best of the reps. Errors: those of
 * gguf_open and model_load, STRATA_EINVAL (a model without experts, window 0), STRATA_ENOMEM. */
int bench_experts(const struct bench_opts *o, uint32_t window, uint32_t n_expert,
                  struct bench_experts *out);

#endif
