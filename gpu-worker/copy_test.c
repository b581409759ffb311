#include "gpu-worker/copy.h"
#include "common/base/err.h"
#include "tests/copy_cases.h"
#include "tests/testutil.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The engine's cases (tests/copy_cases.h) on the host backend and on a fake device: a backend of
 * four lanes whose bytes land only at finish, as a GPU's land when their event completes, and
 * which checks what the engine promises a backend (lanes in order, at most four in flight, a copy
 * issued only after its window was marked on the backend). Then the bookkeeping only a backend
 * sees. copy_cuda_gputest runs the same cases on CUDA. */

/* ---- the host rig ---- */

struct host_rig {
    uint8_t *slots;
    uint64_t slot_bytes;
};

static struct copy_engine *host_start(void *ctx, uint64_t slot_bytes, uint32_t n_slots,
                                      const struct copy_hooks *hooks)
{
    struct host_rig *r = ctx;
    r->slots = calloc(n_slots, slot_bytes);
    r->slot_bytes = slot_bytes;
    struct copy_engine *ce;
    ck_assert_int_eq(copy_start(r->slots, slot_bytes, n_slots, hooks, &ce), 0);
    return ce;
}

static void host_stop(void *ctx)
{
    struct host_rig *r = ctx;
    free(r->slots);
}

static void host_read(void *ctx, uint32_t slot, uint64_t off, void *out, uint64_t bytes)
{
    struct host_rig *r = ctx;
    memcpy(out, r->slots + slot * r->slot_bytes + off, bytes);
}

static void host_set(void *ctx, uint32_t slot, uint8_t byte)
{
    struct host_rig *r = ctx;
    memset(r->slots + slot * r->slot_bytes, byte, r->slot_bytes);
}

static void *host_alloc(void *ctx, uint64_t bytes, bool *pinned)
{
    *pinned = true; /* the host backend ignores it: the flag must not matter there */
    return malloc(bytes);
}

static void host_free(void *ctx, void *p)
{
    free(p);
}

static struct host_rig g_host;
static const struct copy_rig host = {&g_host,  host_start, host_stop, host_read,
                                     host_set, host_alloc, host_free};

/* ---- the fake device: four lanes, bytes land at finish ---- */

struct fake {
    uint8_t *slots;
    uint64_t slot_bytes;
    int thread_rv;
    pthread_mutex_t mu;
    struct {
        uint32_t slot, n;
        struct copy_extent x[COPY_MAX_EXTENTS];
    } lane[4];
    bool held[4];                  /* a lane between its issue and its finish */
    uint32_t fifo[4], head, count; /* the lanes issued, oldest first */
    uint32_t in_flight, max_in_flight;
    uint64_t marked; /* the last window the backend was told of */
    uint32_t bad_fence, bad_lane, issued;
    bool thread_started, closed;
};

static int fake_thread_start(void *ctx)
{
    struct fake *f = ctx;
    f->thread_started = true;
    return f->thread_rv;
}

static int fake_issue(void *ctx, uint32_t lane, uint32_t slot, const struct copy_extent *x,
                      uint32_t n, uint64_t after)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->bad_fence += after > f->marked;
    f->bad_lane += lane >= 4 || f->held[lane];
    f->held[lane % 4] = true;
    f->fifo[(f->head + f->count++) % 4] = lane % 4;
    if (++f->in_flight > f->max_in_flight) f->max_in_flight = f->in_flight;
    f->issued++;
    pthread_mutex_unlock(&f->mu);
    f->lane[lane].slot = slot;
    f->lane[lane].n = n;
    memcpy(f->lane[lane].x, x, n * sizeof *x);
    return 0;
}

static int fake_finish(void *ctx, uint32_t lane, uint32_t slot, uint64_t span,
                       const struct copy_hooks *hk)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    /* finished oldest first, each lane once, into the slot it was issued for */
    f->bad_lane +=
        !f->count || lane != f->fifo[f->head] || !f->held[lane] || slot != f->lane[lane].slot;
    f->held[lane % 4] = false;
    f->head = (f->head + 1) % 4;
    f->count--;
    f->in_flight--;
    pthread_mutex_unlock(&f->mu);
    uint8_t *dst = f->slots + slot * f->slot_bytes;
    for (uint32_t i = 0; i < f->lane[lane].n; i++) {
        const struct copy_extent *x = &f->lane[lane].x[i];
        if (x->src)
            memcpy(dst + x->dst_off, x->src, x->bytes);
        else
            memset(dst + x->dst_off, x->fill, x->bytes);
    }
    if (hk->after_copy) hk->after_copy(hk->ctx, slot, dst, span);
    return 0;
}

static int fake_window(void *ctx, uint64_t w)
{
    struct fake *f = ctx;
    pthread_mutex_lock(&f->mu);
    f->marked = w;
    pthread_mutex_unlock(&f->mu);
    return 0;
}

static uint32_t fake_issued(struct fake *f)
{
    pthread_mutex_lock(&f->mu);
    const uint32_t n = f->issued;
    pthread_mutex_unlock(&f->mu);
    return n;
}

static void fake_close(void *ctx)
{
    struct fake *f = ctx;
    f->closed = true;
}

static struct fake g_fake;

static struct copy_engine *fake_start(void *ctx, uint64_t slot_bytes, uint32_t n_slots,
                                      const struct copy_hooks *hooks)
{
    struct fake *f = ctx;
    const int thread_rv = f->thread_rv;
    memset(f, 0, sizeof *f);
    f->thread_rv = thread_rv;
    pthread_mutex_init(&f->mu, NULL);
    f->slots = calloc(n_slots, slot_bytes);
    f->slot_bytes = slot_bytes;
    const struct copy_backend be = {.ctx = f,
                                    .lanes = 4,
                                    .thread_start = fake_thread_start,
                                    .issue = fake_issue,
                                    .finish = fake_finish,
                                    .window = fake_window,
                                    .close = fake_close};
    struct copy_engine *ce;
    ck_assert_int_eq(copy_start_backend(&be, slot_bytes, n_slots, hooks, &ce), 0);
    return ce;
}

static void fake_stop(void *ctx)
{
    struct fake *f = ctx;
    ck_assert(f->closed);
    ck_assert_uint_eq(f->bad_fence, 0);
    ck_assert_uint_eq(f->bad_lane, 0);
    ck_assert_uint_eq(f->in_flight, 0);
    ck_assert_uint_le(f->max_in_flight, 4);
    pthread_mutex_destroy(&f->mu);
    free(f->slots);
}

static void fake_read(void *ctx, uint32_t slot, uint64_t off, void *out, uint64_t bytes)
{
    struct fake *f = ctx;
    memcpy(out, f->slots + slot * f->slot_bytes + off, bytes);
}

static void fake_set(void *ctx, uint32_t slot, uint8_t byte)
{
    struct fake *f = ctx;
    memset(f->slots + slot * f->slot_bytes, byte, f->slot_bytes);
}

static const struct copy_rig fake = {&g_fake,  fake_start, fake_stop, fake_read,
                                     fake_set, host_alloc, host_free};

START_TEST(windows_and_failures)
{
    copy_case_windows_and_failures(_i ? &fake : &host);
}
END_TEST

START_TEST(deferred_copies_run_when_waited)
{
    copy_case_deferred(_i ? &fake : &host);
}
END_TEST

START_TEST(tickets_in_order_and_after_copy)
{
    copy_case_order_and_after_copy(_i ? &fake : &host);
}
END_TEST

/* the fake device's own view: copies made runnable together fill every lane before the first
 * finishes (the copies overlap), each issued after its window reached the backend */
START_TEST(lanes_fill_and_fences_reach_the_backend)
{
    struct copy_engine *ce = fake_start(&g_fake, 4096, 8, NULL);
    uint8_t src[64];
    memset(src, 0x33, sizeof src);
    const struct copy_extent x = {src, sizeof src, 0, false, 0};
    uint64_t t[8];
    for (uint32_t i = 0; i < 8; i++)
        ck_assert_int_eq(copy_post(ce, i, &x, 1, 2, &t[i]), 0);
    cc_nap(20);
    ck_assert_uint_eq(fake_issued(&g_fake), 0); /* fenced on window 2 */
    ck_assert_int_eq(copy_window_done(ce, 1), 0);
    cc_nap(20);
    ck_assert_uint_eq(fake_issued(&g_fake), 0);
    ck_assert_uint_eq(g_fake.marked, 1);
    ck_assert_int_eq(copy_window_done(ce, 2), 0);
    ck_assert_int_eq(copy_wait(ce, t[7]), 0);
    ck_assert(g_fake.thread_started);
    ck_assert_uint_eq(g_fake.issued, 8);
    ck_assert_uint_eq(g_fake.max_in_flight, 4);   /* all eight runnable at once: four lanes full */
    ck_assert_int_eq(copy_window_done(ce, 2), 0); /* an old window: nothing to mark */
    ck_assert_uint_eq(g_fake.marked, 2);
    copy_close(ce);
    fake_stop(&g_fake);
}
END_TEST

/* a backend whose thread cannot start (CUDA: no device) fails every copy with its code; a
 * backend with no lane, or too many, is refused and closed */
START_TEST(backend_failures)
{
    g_fake.thread_rv = STRATA_EIO; /* read by the copy thread when it starts */
    struct copy_engine *ce = fake_start(&g_fake, 4096, 2, NULL);
    uint8_t src[16] = {1};
    const struct copy_extent x = {src, sizeof src, 0, false, 0};
    uint64_t a, b;
    ck_assert_int_eq(copy_post(ce, 0, &x, 1, 0, &a), 0);
    ck_assert_int_eq(copy_post(ce, 1, &x, 1, 0, &b), 0);
    ck_assert_int_eq(copy_wait(ce, b), STRATA_EIO);
    int rv = 0;
    ck_assert(copy_done(ce, a, &rv));
    ck_assert_int_eq(rv, STRATA_EIO);
    ck_assert_uint_eq(g_fake.issued, 0);
    struct copy_stats st;
    copy_get_stats(ce, &st);
    ck_assert_uint_eq(st.failed, 2);
    copy_close(ce);
    fake_stop(&g_fake);
    g_fake.thread_rv = 0;

    struct fake f = {0};
    struct copy_backend be = {.ctx = &f, .lanes = 0, .close = fake_close};
    ck_assert_int_eq(copy_start_backend(&be, 4096, 1, NULL, &ce), STRATA_EINVAL);
    ck_assert(f.closed);
    f.closed = false;
    be.lanes = COPY_MAX_LANES + 1;
    ck_assert_int_eq(copy_start_backend(&be, 4096, 1, NULL, &ce), STRATA_EINVAL);
    ck_assert(f.closed);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("copy");
    TCase *tc = tcase_create("copy");
    tcase_set_timeout(tc, 60);
    /* _i: 0 the host backend, 1 the fake device */
    tcase_add_loop_test(tc, windows_and_failures, 0, 2);
    tcase_add_loop_test(tc, deferred_copies_run_when_waited, 0, 2);
    tcase_add_loop_test(tc, tickets_in_order_and_after_copy, 0, 2);
    tcase_add_test(tc, lanes_fill_and_fences_reach_the_backend);
    tcase_add_test(tc, backend_failures);
    suite_add_tcase(s, tc);
    return test_run(s);
}
