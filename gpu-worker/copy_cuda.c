/* copy.h's CUDA backend: a copy stream, window events, pinned bounce buffers a lane.
 * copy_cuda.h has the contract; copy.c the engine that drives it. */
#include "gpu-worker/copy_cuda.h"
#include "common/base/err.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

struct cc {
    int dev;
    cudaStream_t s;     /* the pass's (borrowed) */
    cudaStream_t cs;    /* the copies' */
    cudaEvent_t win_ev; /* recorded on s at each copy_window_done */
    cudaEvent_t done[COPY_CUDA_LANES];
    uint8_t *bounce[COPY_CUDA_LANES];
    uint8_t *(*slot_at)(void *ctx, uint32_t slot);
    void *slot_ctx;
};

static int ck(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    return strata_errf(STRATA_ECUDAERR | (int)e, "CUDA: %s: %s", what, cudaGetErrorString(e));
}

static int cc_thread_start(void *ctx)
{
    const struct cc *c = ctx;
    return ck(cudaSetDevice(c->dev), "copy thread device");
}

/* up: the bytes of extents x[0..n) from src (their own, or the bounce buffer at their offsets)
 * into dst on the copy stream, each run of adjacent extents in one copy; a fill extent is a memset
 * on the device when direct */
static int up(struct cc *c, uint8_t *dst, const struct copy_extent *x, uint32_t n, bool direct,
              const uint8_t *bb)
{
    int rv = 0;
    for (uint32_t i = 0; i < n && !rv;) {
        if (direct) {
            rv = x[i].src ? ck(cudaMemcpyAsync(dst + x[i].dst_off, x[i].src, x[i].bytes,
                                               cudaMemcpyHostToDevice, c->cs),
                               "expert copy")
                          : ck(cudaMemsetAsync(dst + x[i].dst_off, x[i].fill, x[i].bytes, c->cs),
                               "expert copy fill");
            i++;
            continue;
        }
        uint32_t j = i + 1;
        while (j < n && x[j].dst_off == x[j - 1].dst_off + x[j - 1].bytes)
            j++;
        const uint64_t off = x[i].dst_off, bytes = x[j - 1].dst_off + x[j - 1].bytes - off;
        rv = ck(cudaMemcpyAsync(dst + off, bb + off, bytes, cudaMemcpyHostToDevice, c->cs),
                "expert copy");
        i = j;
    }
    return rv;
}

static int cc_issue(void *ctx, uint32_t lane, uint32_t slot, const struct copy_extent *x,
                    uint32_t n, uint64_t after)
{
    struct cc *c = ctx;
    uint8_t *dst = c->slot_at(c->slot_ctx, slot);
    int rv;
    /* the fence: the copy stream waits for the window event (W's, or a later window's) */
    if (after && (rv = ck(cudaStreamWaitEvent(c->cs, c->win_ev, 0), "copy fence"))) return rv;
    bool direct = true;
    for (uint32_t i = 0; i < n; i++)
        direct = direct && (!x[i].src || x[i].pinned);
    uint8_t *bb = c->bounce[lane];
    if (!direct) {
        /* staged: the lane's buffer is free (its last copy finished before this issue) */
        for (uint32_t i = 0; i < n; i++) {
            if (x[i].src)
                memcpy(bb + x[i].dst_off, x[i].src, x[i].bytes);
            else
                memset(bb + x[i].dst_off, x[i].fill, x[i].bytes);
        }
    }
    if ((rv = up(c, dst, x, n, direct, bb))) return rv;
    return ck(cudaEventRecord(c->done[lane], c->cs), "copy event");
}

static int cc_finish(void *ctx, uint32_t lane, uint32_t slot, uint64_t span,
                     const struct copy_hooks *hk)
{
    struct cc *c = ctx;
    int rv;
    if ((rv = ck(cudaEventSynchronize(c->done[lane]), "copy"))) return rv;
    if (!hk->after_copy) return 0;
    /* the copy-back: the slot's bytes to the lane's buffer, the hook, and up again */
    uint8_t *dst = c->slot_at(c->slot_ctx, slot), *bb = c->bounce[lane];
    if ((rv = ck(cudaMemcpyAsync(bb, dst, span, cudaMemcpyDeviceToHost, c->cs), "hook down")) ||
        (rv = ck(cudaStreamSynchronize(c->cs), "hook down")))
        return rv;
    hk->after_copy(hk->ctx, slot, bb, span);
    if ((rv = ck(cudaMemcpyAsync(dst, bb, span, cudaMemcpyHostToDevice, c->cs), "hook up")))
        return rv;
    return ck(cudaStreamSynchronize(c->cs), "hook up");
}

static int cc_window(void *ctx, uint64_t w)
{
    struct cc *c = ctx;
    return ck(cudaEventRecord(c->win_ev, c->s), "window event");
}

static void cc_close(void *ctx)
{
    struct cc *c = ctx;
    if (!c) return;
    if (c->cs) cudaStreamSynchronize(c->cs);
    for (int i = 0; i < COPY_CUDA_LANES; i++) {
        if (c->done[i]) cudaEventDestroy(c->done[i]);
        cudaFreeHost(c->bounce[i]);
    }
    if (c->win_ev) cudaEventDestroy(c->win_ev);
    if (c->cs) cudaStreamDestroy(c->cs);
    free(c);
}

int copy_cuda_start(const struct copy_cuda_opts *o, const struct copy_hooks *hooks,
                    struct copy_engine **out)
{
    struct cc *c = calloc(1, sizeof *c);
    if (!c) return strata_errf(STRATA_ENOMEM, "out of memory for the CUDA copy engine");
    c->dev = o->device;
    c->s = (cudaStream_t)o->stream;
    c->slot_at = o->slot_at;
    c->slot_ctx = o->slot_ctx;
    int rv;
    if ((rv = ck(cudaStreamCreateWithFlags(&c->cs, cudaStreamNonBlocking), "copy stream")) ||
        (rv = ck(cudaEventCreateWithFlags(&c->win_ev, cudaEventDisableTiming), "window event")))
        goto fail;
    for (int i = 0; i < COPY_CUDA_LANES; i++)
        if ((rv =
                 ck(cudaEventCreateWithFlags(&c->done[i], cudaEventDisableTiming), "copy event")) ||
            (rv = ck(cudaMallocHost((void **)&c->bounce[i], o->slot_bytes ? o->slot_bytes : 1),
                     "bounce buffer")))
            goto fail;
    /* one lane under after_copy: its copy-back must read the slot as its own copy left it, and a
     * later copy into the same slot (a poison, then the next expert) issued on another lane
     * would land first (the H200 saw a flip applied twice, which undid it) */
    const bool hooked = hooks && hooks->after_copy;
    const struct copy_backend be = {.ctx = c,
                                    .lanes = hooked ? 1 : COPY_CUDA_LANES,
                                    .thread_start = cc_thread_start,
                                    .issue = cc_issue,
                                    .finish = cc_finish,
                                    .window = cc_window,
                                    .close = cc_close};
    return copy_start_backend(&be, o->slot_bytes, o->n_slots, hooks, out);
fail:
    cc_close(c);
    return rv;
}
