#include "gpu-worker/copy_cuda.h"
#include "gpu-worker/backend.h"
#include "common/base/err.h"
#include "tests/copy_cases.h"
#include "tests/testutil.h"

#include <cuda_runtime_api.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* copy.h's cases (tests/copy_cases.h, as copy_test runs them on the host) on the CUDA backend:
 * VRAM slots, a copy stream, window events on a pass stream of the test's, pinned and pageable
 * sources (direct and bounced), after_copy through the copy-back. Then what only a GPU shows: a
 * copy fenced on a window waits, on the device, for the work queued on the pass stream before
 * that window was marked. */

struct gpu_rig {
    uint8_t *slots;
    uint64_t slot_bytes;
    cudaStream_t pass, rd; /* the windows' stream; the test's reads */
};

static uint8_t *slot_at(void *ctx, uint32_t slot)
{
    struct gpu_rig *r = ctx;
    return r->slots + (uint64_t)slot * r->slot_bytes;
}

static struct copy_engine *gpu_start(void *ctx, uint64_t slot_bytes, uint32_t n_slots,
                                     const struct copy_hooks *hooks)
{
    struct gpu_rig *r = ctx;
    r->slot_bytes = slot_bytes;
    ck_assert_int_eq(cudaMalloc((void **)&r->slots, n_slots * slot_bytes), cudaSuccess);
    ck_assert_int_eq(cudaMemset(r->slots, 0, n_slots * slot_bytes), cudaSuccess);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(cudaStreamCreateWithFlags(&r->pass, cudaStreamNonBlocking), cudaSuccess);
    ck_assert_int_eq(cudaStreamCreateWithFlags(&r->rd, cudaStreamNonBlocking), cudaSuccess);
    const struct copy_cuda_opts o = {.device = 0,
                                     .stream = r->pass,
                                     .n_slots = n_slots,
                                     .slot_bytes = slot_bytes,
                                     .slot_at = slot_at,
                                     .slot_ctx = r};
    struct copy_engine *ce;
    ck_assert_msg(copy_cuda_start(&o, hooks, &ce) == 0, "%s", strata_errdetail());
    return ce;
}

static void gpu_stop(void *ctx)
{
    struct gpu_rig *r = ctx;
    cudaStreamSynchronize(r->pass);
    cudaStreamDestroy(r->pass);
    cudaStreamDestroy(r->rd);
    cudaFree(r->slots);
}

/* read: on a stream of its own, so that it never waits for the pass or the copy stream */
static void gpu_read(void *ctx, uint32_t slot, uint64_t off, void *out, uint64_t bytes)
{
    struct gpu_rig *r = ctx;
    ck_assert_int_eq(
        cudaMemcpyAsync(out, slot_at(r, slot) + off, bytes, cudaMemcpyDeviceToHost, r->rd),
        cudaSuccess);
    ck_assert_int_eq(cudaStreamSynchronize(r->rd), cudaSuccess);
}

static void gpu_set(void *ctx, uint32_t slot, uint8_t byte)
{
    struct gpu_rig *r = ctx;
    ck_assert_int_eq(cudaMemsetAsync(slot_at(r, slot), byte, r->slot_bytes, r->rd), cudaSuccess);
    ck_assert_int_eq(cudaStreamSynchronize(r->rd), cudaSuccess);
}

static void *gpu_host_alloc(void *ctx, uint64_t bytes, bool *pinned)
{
    void *p = NULL;
    *pinned = cudaMallocHost(&p, bytes) == cudaSuccess;
    return *pinned ? p : NULL;
}

static void gpu_host_free(void *ctx, void *p)
{
    cudaFreeHost(p);
}

static struct gpu_rig g_gpu;
static const struct copy_rig gpu = {&g_gpu,  gpu_start,      gpu_stop,     gpu_read,
                                    gpu_set, gpu_host_alloc, gpu_host_free};

START_TEST(windows_and_failures)
{
    copy_case_windows_and_failures(&gpu);
}
END_TEST

START_TEST(deferred_copies_run_when_waited)
{
    copy_case_deferred(&gpu);
}
END_TEST

START_TEST(tickets_in_order_and_after_copy)
{
    copy_case_order_and_after_copy(&gpu);
}
END_TEST

static atomic_bool g_gate_open;

/* gate: a host function on the pass stream that holds it until the test opens the gate (the
 * stand-in for a long window's kernels) */
static void CUDART_CB gate(void *arg)
{
    while (!atomic_load(&g_gate_open))
        cc_nap(1);
}

/* the fence on the device: window 1 is marked while the pass stream is still held; a copy fenced
 * on it is issued at once but must not land before the pass stream passes the mark; a copy
 * fenced on no window lands meanwhile */
START_TEST(the_fence_waits_on_the_device)
{
    struct copy_engine *ce = gpu_start(&g_gpu, 4096, 2, NULL);
    uint8_t src[256];
    memset(src, 0x77, sizeof src);
    const struct copy_extent x = {src, sizeof src, 0, false, 0};
    atomic_store(&g_gate_open, false);
    ck_assert_int_eq(cudaLaunchHostFunc(g_gpu.pass, gate, NULL), cudaSuccess);
    ck_assert_int_eq(copy_window_done(ce, 1), 0);
    uint64_t fenced, free_;
    ck_assert_int_eq(copy_post(ce, 0, &x, 1, 1, &fenced), 0);
    ck_assert_int_eq(copy_post(ce, 1, &x, 1, 0, &free_), 0);
    cc_nap(50);
    int rv;
    ck_assert(!copy_done(ce, fenced, &rv));
    ck_assert_uint_eq(cc_byte(&gpu, 0, 0), 0);
    /* tickets complete in order: the unfenced copy behind it is not reported before it, but its
     * bytes have no fence to wait for (the copy stream runs them in order, so it also waits) */
    ck_assert(!copy_done(ce, free_, &rv));
    atomic_store(&g_gate_open, true);
    ck_assert_int_eq(copy_wait(ce, fenced), 0);
    ck_assert_int_eq(copy_wait(ce, free_), 0);
    ck_assert_uint_eq(cc_byte(&gpu, 0, 0), 0x77);
    ck_assert_uint_eq(cc_byte(&gpu, 1, 255), 0x77);
    copy_close(ce);
    gpu_stop(&g_gpu);
}
END_TEST

int main(void)
{
    /* asked of the driver, not CUDA, which does not survive the fork of each case */
    if (!backend_available("cuda")) {
        fprintf(stderr, "copy_cuda_gputest: no CUDA device here: this test needs a GPU\n");
        return 1;
    }
    Suite *s = suite_create("copy_cuda");
    TCase *tc = tcase_create("copy_cuda");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, windows_and_failures);
    tcase_add_test(tc, deferred_copies_run_when_waited);
    tcase_add_test(tc, tickets_in_order_and_after_copy);
    tcase_add_test(tc, the_fence_waits_on_the_device);
    suite_add_tcase(s, tc);
    return test_run(s);
}
