/* copy — the copy engine the expert cache fills its slots through: post a copy of a blob into a
 * slot that may start only once a given window has finished with that slot; ask or wait for its
 * completion. One engine, two backends: the host's (copy_start: memcpy into a host slot pool, the
 * CPU slot mode) and CUDA's (copy_cuda.h: a copy stream fenced by window events, the hybrid's VRAM
 * slots). The engine owns the queue, the tickets, the fences, the test hooks and the copy thread;
 * a backend (struct copy_backend) only moves one copy's bytes and marks a window on its side.
 * A copy is a list of extents into the slot (copy_blob_extents: an arena blob is one extent of
 * exactly blob_bytes; a GGUF file's parts sit at their blob offsets, the gaps zeroed). The fence:
 * copy_post(after_window = W) starts the copy only after copy_window_done(W), the last window that
 * may still read the slot's previous expert. Tickets complete in posting order. Test hooks
 * (struct copy_hooks) hold, defer, refuse, fail or alter copies, so tests can make every race and
 * every bad copy happen.
 * Threads: any thread may post, mark windows and wait, under the engine's lock; the copy thread
 * issues and finishes copies, at most the backend's lanes in flight. copy_close waits for copies
 * in flight (deferred ones run then).
 */
#ifndef STRATA_COPY_H
#define STRATA_COPY_H

#include <stdbool.h>
#include <stdint.h>

struct model;

/* One piece of a copy: bytes from src to dst_off in the slot; src NULL: every byte set to fill
 * (0: zeros, a GGUF blob's gaps; a poison pattern for a failed copy's slot). pinned: src lies in
 * page-locked host memory (registered or cudaMallocHost), which the CUDA backend copies from
 * directly; any other source goes through its pinned bounce buffers. The host backend ignores it.
 */
struct copy_extent {
    const void *src;
    uint64_t bytes;
    uint64_t dst_off;
    bool pinned;
    uint8_t fill;
};

#define COPY_MAX_EXTENTS                                                                           \
    12 /* parts of one blob (gpt-oss: 3 matrices, 3 biases), with their gaps                       \
        */

struct copy_hooks {
    void *ctx;
    /* hold_ms: every copy's completion is reported this long after its bytes landed. */
    uint32_t hold_ms;
    /* window_ms: the backend stretches every window by this long (read by the backend). */
    uint32_t window_ms;
    /* defer: a copy starts (writes its bytes) only once someone waits for it (copy_wait) or the
     * engine closes; copy_done is false until then. With no tick waiting for the tier's round
     * (STRATA_ADAPT_ASYNC_WAIT=0) a round's copies are then in flight at every fence, whatever
     * the timing: the fence's wait is what lands them. */
    bool defer;
    /* on_wait: runs on the waiting thread when copy_wait finds its copy not yet complete (a copy
     * in flight across a fence), before it blocks. */
    void (*on_wait)(void *ctx, uint64_t ticket);
    /* unfenced: the backend posts a move's copy before it takes the victim out of the table a
     * window reads (a removed fence, for the test that must then fail). */
    bool unfenced;
    /* no_window_wait: the tier's thread posts a move's copy fenced on no window, not on the
     * window running while it posts, which may still read the victim's slot (the window wait
     * removed, for the test that must then fail). */
    bool no_window_wait;
    /* window_sync: a pass waits, before it reads a slot, for the tier thread's round asked at
     * the last tick to be posted (and, with no_window_wait, for those copies to land), so the
     * windows a round runs across do not depend on the threads' timing. */
    bool window_sync;
    /* kv_unfenced: with one budget (--slot-kv 1), a KV grow takes a slot without landing the
     * round in flight first (the KV-grow fence removed, for the test that must then fail). */
    bool kv_unfenced;
    /* refuse: a nonzero return makes copy_post fail with it (a round that cannot be posted). */
    int (*refuse)(void *ctx, uint32_t slot);
    /* fail: a nonzero return fails the copy (its slot is not filled). */
    int (*fail)(void *ctx, uint32_t slot, uint64_t ticket);
    /* after_copy: runs on the copy thread once the bytes are in the slot, before completion:
     * it may change them (a torn or wrong copy). On CUDA it sees a copy brought back from the
     * slot into a pinned buffer, and what it leaves there is sent up again before completion. */
    void (*after_copy)(void *ctx, uint32_t slot, uint8_t *dst, uint64_t bytes);
};

struct copy_stats {
    uint64_t copies; /* completed */
    uint64_t failed;
    uint64_t bytes; /* copied */
    double busy_s;  /* copy thread time spent copying (issuing and waiting for its copies) */
};

#define COPY_MAX_LANES 8

/* A backend: how one copy's bytes move. The engine calls issue, then finish, on its copy thread,
 * for each copy in ticket order (but those the fail hook fails, which it never issues), with at
 * most `lanes` copies issued and not yet finished, finished oldest first; a lane (0..lanes) is
 * held by one copy from its issue to its finish, so per-lane resources (a bounce buffer, an
 * event) need no lock. window runs on the thread that calls copy_window_done, under the engine's
 * lock, before the window counts as done. */
struct copy_backend {
    void *ctx;
    uint32_t lanes; /* 1..COPY_MAX_LANES */
    /* thread_start: on the copy thread before any copy (CUDA: its device); a failure fails every
     * copy with its code. May be NULL. */
    int (*thread_start)(void *ctx);
    /* issue: start the copy of x[0..n) into slot on lane; after: the window it is fenced on (0:
     * none), already marked done by copy_window_done. A nonzero return fails the copy. */
    int (*issue)(void *ctx, uint32_t lane, uint32_t slot, const struct copy_extent *x, uint32_t n,
                 uint64_t after);
    /* finish: block until lane's copy has landed in the slot; then, when hooks->after_copy is
     * set, run it on the slot's first span bytes (on CUDA: brought back and sent up again). */
    int (*finish)(void *ctx, uint32_t lane, uint32_t slot, uint64_t span,
                  const struct copy_hooks *hooks);
    /* window: window w has finished on the readers' side (CUDA: an event recorded on the pass's
     * stream, which issue then makes the copy stream wait for). May be NULL. */
    int (*window)(void *ctx, uint64_t w);
    /* close: after the copy thread has stopped; frees ctx. May be NULL. */
    void (*close)(void *ctx);
};

struct copy_engine;

/* copy_start starts the host backend's engine over slots (n_slots of slot_bytes, borrowed, host
 * memory). hooks may be NULL (copied). Caller owns *out (copy_close). STRATA_ENOMEM, thread
 * errors. */
int copy_start(uint8_t *slots, uint64_t slot_bytes, uint32_t n_slots,
               const struct copy_hooks *hooks, struct copy_engine **out);

/* copy_start_backend starts an engine over backend be (copied; the engine owns be->ctx from
 * here, closed by copy_close, or by this call when it fails) for n_slots of slot_bytes.
 * STRATA_EINVAL (lanes out of range), STRATA_ENOMEM, thread errors. */
int copy_start_backend(const struct copy_backend *be, uint64_t slot_bytes, uint32_t n_slots,
                       const struct copy_hooks *hooks, struct copy_engine **out);

/* copy_close waits for posted copies (every fence released), stops the thread and closes the
 * backend; NULL is fine. */
void copy_close(struct copy_engine *ce);

/* copy_post queues a copy of extents x[0..n) into slot, to start once window after_window has
 * finished (0: at once). Returns 0 and *ticket; STRATA_EINVAL when an extent falls outside the
 * slot or n exceeds COPY_MAX_EXTENTS; STRATA_ENOMEM. Never blocks on the copy. */
int copy_post(struct copy_engine *ce, uint32_t slot, const struct copy_extent *x, uint32_t n,
              uint64_t after_window, uint64_t *ticket);

/* copy_window_done: window w (counted from 1) has finished; copies fenced on it may start. On
 * CUDA "finished" means queued: the copies also wait for the event recorded on the pass's stream
 * now. Returns 0, or the backend's error (the window then stays not done). */
int copy_window_done(struct copy_engine *ce, uint64_t w);

/* copy_done: whether ticket has completed; *rv its result (0, or the failure's code). */
bool copy_done(struct copy_engine *ce, uint64_t ticket, int *rv);

/* copy_wait blocks until ticket completes and returns its result. */
int copy_wait(struct copy_engine *ce, uint64_t ticket);

/* copy_wait_all blocks until every copy posted before the call has completed (deferred ones are
 * released, as by copy_wait of the last), whatever their results: a fence before the slots'
 * memory changes. */
void copy_wait_all(struct copy_engine *ce);

void copy_get_stats(struct copy_engine *ce, struct copy_stats *out);

/* copy_blob_extents: the copy of model m's expert (l, e) into a slot: the arena's blob as one
 * extent of exactly blob_bytes (not marked pinned: the caller knows its registration), or, from
 * a GGUF file, each part (and bias) at its blob offset with the gaps zeroed, so the slot holds the
 * arena's bytes either way. Fills x[0..COPY_MAX_EXTENTS); returns the extent count. */
uint32_t copy_blob_extents(const struct model *m, uint32_t l, uint32_t e, struct copy_extent *x);

/* copy_blob_hash: the XXH3 of expert (l, e)'s blob as the arena stores it: the arena's own hash,
 * or from a GGUF file computed over the extents a copy moves; 0 when out of memory. */
uint64_t copy_blob_hash(const struct model *m, uint32_t l, uint32_t e);

#endif
