/* hybrid_cuda — the CUDA backend's expert cache when not every expert fits in VRAM: the hottest
 * experts live in VRAM slots, the others are computed by the CPU twin (cpu_moe_ffn) straight from
 * the arena or the GGUF file, at the same time as the GPU computes the hits.
 *
 * Slots: n_slots of slot_bytes, allocated in chunks of HYB_CHUNK_SLOTS (so the `vram` op frees
 * and takes whole chunks), filled at start hottest-first from the arena's heat (cache_fill_order,
 * as the CPU backend's slot mode). The residency table lives on the device as per-layer slot
 * pointers for cu_moe_ffn, double-buffered: a publication writes the other buffer through its own
 * pinned staging table in stream order, so the host never changes a table a queued window reads.
 * A layer's step (hyb_moe): the router's picks are on the host (pinned), the pairs are grouped once
 * and split (hybrid_plan.h); hits go up and run on the GPU (cu_moe_ffn on the slot table) while
 * the decode thread computes the misses on the worker's pool from the host bytes, uploads their
 * rows, and a device gather merges both sides for cu_moe_combine, which sums each token's outputs
 * in expert-id order: every pair's row is the same bits whichever side made it (given a GPU expert
 * FFN equal to the CPU's), so logits do not depend on the cache.
 * The tier (tier.h) on CUDA: copies go through copy.h's engine with its CUDA backend
 * (copy_cuda.h): each tick marks its window done (an event recorded on the pass's stream), and a
 * copy, fenced on the last window that may read its slot's previous expert, waits on the copy
 * stream (cudaStreamWaitEvent) for that event; blocking rounds land at the tick, async ones
 * (--adapt-async 1) the tick after (STRATA_ADAPT_ASYNC_WAIT=1) or when the engine reports them
 * done. Copies come from registered host memory (--pin) or through the engine's pinned bounce
 * buffers, never from pageable memory; the race hooks (backend_opts.copy_hooks) are the engine's.
 * The start's fill runs in the background (its own thread, posting to the same engine, fenced on
 * no window): the first window is served at once, every miss on the CPU, and the slots turn
 * resident tick by tick as their copies land (STRATA_HYBRID_FILL=wait: the start waits for it);
 * the tier starts once the fill has ended.
 * Code: hybrid_cuda.c (slots, tables, the step), hybrid_copy_cuda.c (registration, the fill, the
 * tier's rounds), hybrid_cuda_impl.h between them.
 * Threads: the decode thread; the copy engine's thread; the fill's thread while it runs; with
 * --pin need|whole a registration thread (cudaHostRegister). Device o->gpu in every thread.
 */
#ifndef STRATA_HYBRID_CUDA_H
#define STRATA_HYBRID_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu-worker/backend.h"
#include "kernels/cuda/moe_ffn.h"

#define HYB_CHUNK_SLOTS 16 /* slots one VRAM allocation holds */

struct hyb;

/* What the hybrid borrows from the CUDA backend's pass. */
struct hyb_io {
    void *stream;       /* the pass's stream */
    const float *xn;    /* (T, n_embd) the layer's normalized input */
    const int32_t *sel; /* (T * K) the router's picks (device) */
    const float *selw;  /* (T * K) their weights (device) */
    float *h;           /* (T * K, n_ff) cu_moe_ffn scratch */
    void *ws;           /* cu_moe_ffn workspace */
    float *y;           /* (T * K, n_embd) scratch: the merged rows */
    float *moe;         /* (T, n_embd) the layer's routed sum, written */
};

/* hyb_device_bytes: VRAM the hybrid takes besides its slots, for T tokens a pass. */
uint64_t hyb_device_bytes(const struct model *m, uint32_t T);

/* hyb_start starts the hybrid for m with n_slots slots of slot_bytes (at most every expert), then
 * re-checks free VRAM against reserve and shrinks the pool by whole chunks if needed (logged), and
 * fills it hottest first. parts: per layer. STRATA_ENOSPC, STRATA_ENOMEM, CUDA errors. */
int hyb_start(const struct model *m, const struct backend_opts *o, const struct cu_moe_parts *parts,
              void *stream, uint32_t n_slots, uint64_t slot_bytes, uint64_t reserve,
              struct hyb **out);
void hyb_close(struct hyb *h);

/* hyb_stage queues the downloads the CPU twin needs for layer il (x normalized, pair weights)
 * before the caller's stream sync that brings the picks down. */
int hyb_stage(struct hyb *h, const struct hyb_io *io, uint32_t n);

/* hyb_pass sets the pass's token -> prompt chunk map (chunk id, or UINT32_MAX: a decode token),
 * for the tier's counting and the PCIe rule. */
void hyb_pass(struct hyb *h, const uint32_t *chunk_of, uint32_t n);

/* hyb_moe_start: layer il's routed experts for n tokens whose picks h_sel (n * K, host) came
 * down: groups and splits them, calls route (may be NULL) per expert as backend_set_route says,
 * and queues the GPU's side (hits, the PCIe share). The caller may queue more GPU work, then calls
 * hyb_moe_finish, which computes the misses on the CPU meanwhile, sends their rows up and queues
 * the combine into io->moe. st: weight_bytes (and host_bytes, pcie_bytes) grow by the bytes
 * the experts stream. */
int hyb_moe_start(struct hyb *h, const struct hyb_io *io, uint32_t il, uint32_t n,
                  const int32_t *h_sel, backend_route_fn route, void *route_ctx,
                  struct backend_stats *st);
int hyb_moe_finish(struct hyb *h, const struct hyb_io *io, uint32_t il, uint32_t n,
                   struct backend_stats *st);

/* the backend table's calls, between windows */
int hyb_tick(struct hyb *h);
int hyb_quiesce(struct hyb *h);
int hyb_resize(struct hyb *h, uint64_t bytes);
void hyb_info(const struct hyb *h, struct backend_info *out);

/* hyb_vram_bytes: the VRAM the slot pool holds now (whole chunks, staging slots); hyb_slots: its
 * slot count. */
uint64_t hyb_vram_bytes(const struct hyb *h);
uint32_t hyb_slots(const struct hyb *h);

#endif
