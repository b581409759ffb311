/* copy — the copy engine the expert cache fills its slots through: post a copy of a blob into a
 * slot that may start only once a given window has finished with that slot; ask or wait for its
 * completion. Backend-neutral interface; this is the host implementation (one copy thread, for
 * the CPU backend's slot mode). The CUDA one (streams, events) implements the same calls.
 *
 * A copy is a list of extents into the slot: from an arena blob it is one extent of exactly
 * blob_bytes (never a slot-sized read, which would cross into the next blob); from a GGUF file it
 * is each part at its blob offset, the gaps zero-filled, so the slot holds the arena's bytes.
 * The fence: copy_post(after_window = W) starts the copy only after copy_window_done(W) — the last
 * window that may still read the slot's previous expert. Tickets complete in posting order.
 * Test hooks (struct copy_hooks) hold a copy's completion, stretch a window, fail a copy or change
 * the bytes it wrote, so tests can make every race and every bad copy happen.
 * Threads: any thread may post, mark windows and wait (the decode thread, the tier's thread),
 * under the engine's lock; the copy thread writes slots. copy_close waits for copies in flight (deferred ones run then).
 */
#ifndef STRATA_COPY_H
#define STRATA_COPY_H

#include <stdbool.h>
#include <stdint.h>

/* One piece of a copy: bytes from src (NULL: zeros) to dst_off in the slot. */
struct copy_extent {
    const void *src;
    uint64_t bytes;
    uint64_t dst_off;
};

#define COPY_MAX_EXTENTS 12 /* parts of one blob (gpt-oss: 3 matrices, 3 biases), with their gaps */

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
     * it may change them (a torn or wrong copy). */
    void (*after_copy)(void *ctx, uint32_t slot, uint8_t *dst, uint64_t bytes);
};

struct copy_stats {
    uint64_t copies; /* completed */
    uint64_t failed;
    uint64_t bytes; /* copied */
    double busy_s;  /* copy thread time spent copying */
};

struct copy_engine;

/* copy_start starts the copy thread over slots (n_slots of slot_bytes, borrowed). hooks may be
 * NULL (copied). Caller owns *out (copy_close). STRATA_ENOMEM, thread errors. */
int copy_start(uint8_t *slots, uint64_t slot_bytes, uint32_t n_slots,
               const struct copy_hooks *hooks, struct copy_engine **out);

/* copy_close waits for posted copies and stops the thread; NULL is fine. */
void copy_close(struct copy_engine *ce);

/* copy_post queues a copy of extents x[0..n) into slot, to start once window after_window has
 * finished (0: at once). Returns 0 and *ticket; STRATA_EINVAL when an extent falls outside the
 * slot or n exceeds COPY_MAX_EXTENTS; STRATA_ENOMEM. Never blocks on the copy. */
int copy_post(struct copy_engine *ce, uint32_t slot, const struct copy_extent *x, uint32_t n,
              uint64_t after_window, uint64_t *ticket);

/* copy_window_done: window w (counted from 1) has finished; copies fenced on it may start. */
void copy_window_done(struct copy_engine *ce, uint64_t w);

/* copy_done: whether ticket has completed; *rv its result (0, or the failure's code). */
bool copy_done(struct copy_engine *ce, uint64_t ticket, int *rv);

/* copy_wait blocks until ticket completes and returns its result. */
int copy_wait(struct copy_engine *ce, uint64_t ticket);

void copy_get_stats(struct copy_engine *ce, struct copy_stats *out);

#endif
