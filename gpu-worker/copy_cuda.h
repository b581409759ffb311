/* copy_cuda — copy.h's CUDA backend: copies from host memory into VRAM slots on a copy stream of
 * its own, fenced by events, driven by copy.h's copy thread (the queue, tickets, fences and hooks
 * are copy.h's, shared with the host backend).
 *
 * copy_window_done(W) records an event on the pass's stream (the one the windows reading the
 * slots run on); a copy fenced on W is issued once W is marked and makes the copy stream wait
 * (cudaStreamWaitEvent) for that event — or for a later window's, which the event then holds:
 * never an earlier one. Each of the COPY_CUDA_LANES lanes owns a pinned bounce buffer of a slot
 * and an event: a copy whose every source extent is pinned (registered or cudaMallocHost'd) goes
 * up directly, any other is staged through its lane's bounce buffer (never a pageable copy); its
 * completion is its lane's event, which the copy thread waits for. after_copy: the slot is brought
 * back into the lane's bounce buffer, the hook changes it there, and it goes up again before the
 * copy completes (a copy-back, on the copy thread). Every hook of struct copy_hooks is the
 * engine's and so the same as on the host.
 * Threads: copy.h's; slot_at runs on the copy thread.
 */
#ifndef STRATA_COPY_CUDA_H
#define STRATA_COPY_CUDA_H

#include <stdint.h>

#include "gpu-worker/copy.h"

#define COPY_CUDA_LANES 4 /* copies in flight: bounce buffers and events */

struct copy_cuda_opts {
    int device;       /* the CUDA device of the slots and the stream */
    void *stream;     /* the pass's stream (cudaStream_t): window events are recorded on it */
    uint32_t n_slots; /* slots a copy may name (at most; slot_at says where each is) */
    uint64_t slot_bytes;
    /* slot_at: slot's device address; it must stay valid while a copy into the slot may run */
    uint8_t *(*slot_at)(void *ctx, uint32_t slot);
    void *slot_ctx;
};

/* copy_cuda_start starts a copy engine on o's device: its copy stream, COPY_CUDA_LANES pinned
 * bounce buffers of slot_bytes and their events, and copy.h's thread. hooks may be NULL (copied).
 * Caller owns *out (copy_close). Call on a thread whose current device is o->device. CUDA errors
 * (STRATA_ECUDAERR), STRATA_ENOMEM, thread errors. */
int copy_cuda_start(const struct copy_cuda_opts *o, const struct copy_hooks *hooks,
                    struct copy_engine **out);

#endif
