/* copy_cases — gpu-worker/copy.h's cases, run against every backend: copy_test runs them on the
 * host backend and on a fake device of several lanes, copy_cuda_gputest on CUDA's. A rig starts
 * an engine over n_slots of slot_bytes and reads and presets the slots' bytes from the host; a
 * case asserts only what copy.h promises, so a backend that passes them behaves as the others.
 * Included by those two tests only (static functions).
 */
#ifndef STRATA_TESTS_COPY_CASES_H
#define STRATA_TESTS_COPY_CASES_H

#include "gpu-worker/copy.h"
#include "common/base/err.h"
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct copy_rig {
    void *ctx;
    /* start: slots of the backend's memory, preset to 0, and an engine over them */
    struct copy_engine *(*start)(void *ctx, uint64_t slot_bytes, uint32_t n_slots,
                                 const struct copy_hooks *hooks);
    /* stop: after copy_close, the slots go */
    void (*stop)(void *ctx);
    void (*read)(void *ctx, uint32_t slot, uint64_t off, void *out, uint64_t bytes);
    void (*set)(void *ctx, uint32_t slot, uint8_t byte);
    /* host: a source buffer, and whether it is page-locked (copy_extent.pinned) */
    void *(*host_alloc)(void *ctx, uint64_t bytes, bool *pinned);
    void (*host_free)(void *ctx, void *p);
};

static uint8_t cc_byte(const struct copy_rig *r, uint32_t slot, uint64_t off)
{
    uint8_t b;
    r->read(r->ctx, slot, off, &b, 1);
    return b;
}

static void cc_nap(uint32_t ms)
{
    struct timespec ts = {0, (long)ms * 1000000};
    nanosleep(&ts, NULL);
}

static int cc_fail_odd(void *ctx, uint32_t slot, uint64_t ticket)
{
    return ticket % 2 ? STRATA_EIO : 0;
}

/* fences hold copies back until their window; extents land at their offsets, gaps zeroed, nothing
 * past the blob; bad extents are refused; the fail hook fails the copies it names */
static void copy_case_windows_and_failures(const struct copy_rig *r)
{
    const uint64_t SB = 4096;
    uint8_t src[3000], got[3024];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (uint8_t)(i * 7 + 1);
    struct copy_engine *ce = r->start(r->ctx, SB, 4, NULL);
    const struct copy_extent x[] = {
        {src, 1000, 0, false, 0}, {NULL, 24, 1000, false, 0}, {src + 1000, 2000, 1024, false, 0}};
    r->set(r->ctx, 1, 0xee);
    uint64_t t1;
    ck_assert_int_eq(copy_post(ce, 1, x, 3, 5, &t1), 0);
    cc_nap(50);
    int rv = -1;
    ck_assert(!copy_done(ce, t1, &rv)); /* fenced on window 5 */
    ck_assert_uint_eq(cc_byte(r, 1, 0), 0xee);
    ck_assert_int_eq(copy_window_done(ce, 4), 0);
    cc_nap(50);
    ck_assert(!copy_done(ce, t1, &rv));
    ck_assert_int_eq(copy_window_done(ce, 5), 0);
    ck_assert_int_eq(copy_wait(ce, t1), 0);
    ck_assert(copy_done(ce, t1, &rv));
    ck_assert_int_eq(rv, 0);
    r->read(r->ctx, 1, 0, got, sizeof got);
    ck_assert(memcmp(got, src, 1000) == 0);
    for (int i = 1000; i < 1024; i++)
        ck_assert_uint_eq(got[i], 0);
    ck_assert(memcmp(got + 1024, src + 1000, 2000) == 0);
    ck_assert_uint_eq(cc_byte(r, 1, 3024), 0xee); /* nothing past the blob */
    const struct copy_extent out_of_slot = {src, 100, 4000, false, 0};
    ck_assert_int_eq(copy_post(ce, 0, &out_of_slot, 1, 0, &t1), STRATA_EINVAL);
    ck_assert_int_eq(copy_post(ce, 4, x, 1, 0, &t1), STRATA_EINVAL);
    struct copy_stats st;
    copy_get_stats(ce, &st);
    ck_assert_uint_eq(st.copies, 1);
    ck_assert_uint_eq(st.bytes, 3024);
    copy_close(ce);
    r->stop(r->ctx);

    const struct copy_hooks hooks = {.fail = cc_fail_odd, .hold_ms = 20};
    ce = r->start(r->ctx, SB, 4, &hooks);
    uint64_t a, b;
    ck_assert_int_eq(copy_post(ce, 2, x, 1, 0, &a), 0);
    ck_assert_int_eq(copy_post(ce, 3, x, 1, 0, &b), 0);
    ck_assert_int_eq(copy_wait(ce, a), STRATA_EIO);
    ck_assert_int_eq(copy_wait(ce, b), 0);
    ck_assert_uint_eq(cc_byte(r, 2, 0), 0); /* the failed copy wrote nothing */
    ck_assert_uint_eq(cc_byte(r, 3, 0), src[0]);
    copy_get_stats(ce, &st);
    ck_assert_uint_eq(st.failed, 1);
    copy_close(ce);
    r->stop(r->ctx);
}

static uint32_t cc_waited;

static void cc_count_wait(void *ctx, uint64_t ticket)
{
    cc_waited++;
}

static int cc_refuse_slot_3(void *ctx, uint32_t slot)
{
    return slot == 3 ? STRATA_EIO : 0;
}

/* defer: a copy runs only once waited for (or at close), whatever the time; on_wait sees each
 * wait that finds its copy in flight; refuse makes a post fail */
static void copy_case_deferred(const struct copy_rig *r)
{
    uint8_t src[100];
    memset(src, 0x5c, sizeof src);
    const struct copy_hooks hooks = {
        .defer = true, .on_wait = cc_count_wait, .refuse = cc_refuse_slot_3};
    cc_waited = 0;
    struct copy_engine *ce = r->start(r->ctx, 4096, 4, &hooks);
    const struct copy_extent x = {src, sizeof src, 0, false, 0};
    uint64_t a, b, c;
    ck_assert_int_eq(copy_post(ce, 0, &x, 1, 0, &a), 0);
    ck_assert_int_eq(copy_post(ce, 1, &x, 1, 0, &b), 0);
    ck_assert_int_eq(copy_post(ce, 3, &x, 1, 0, &c), STRATA_EIO);
    cc_nap(30);
    int rv;
    ck_assert(!copy_done(ce, a, &rv));
    ck_assert_uint_eq(cc_byte(r, 0, 0), 0);
    ck_assert_int_eq(copy_wait(ce, a), 0);
    ck_assert_uint_eq(cc_waited, 1);
    ck_assert_uint_eq(cc_byte(r, 0, 0), 0x5c);
    ck_assert(!copy_done(ce, b, &rv)); /* not waited for yet */
    ck_assert_uint_eq(cc_byte(r, 1, 0), 0);
    ck_assert_int_eq(copy_post(ce, 2, &x, 1, 0, &c), 0);
    copy_close(ce); /* runs the deferred ones */
    ck_assert_uint_eq(cc_byte(r, 1, 0), 0x5c);
    ck_assert_uint_eq(cc_byte(r, 2, 0), 0x5c);
    ck_assert_uint_eq(cc_waited, 1);
    r->stop(r->ctx);
}

static void cc_flip(void *ctx, uint32_t slot, uint8_t *dst, uint64_t bytes)
{
    dst[bytes / 3] ^= 0x10;
}

/* many copies, pinned and pageable sources, fills, fenced on several windows: tickets complete in
 * posting order (a later ticket done means every earlier one is), copy_wait_all lands them all,
 * the last copy into a slot wins, and after_copy's change is what the slot holds */
static void copy_case_order_and_after_copy(const struct copy_rig *r)
{
    enum { N = 24, SLOTS = 4, BYTES = 2000 };
    const struct copy_hooks hooks = {.after_copy = cc_flip};
    bool pinned = false;
    uint8_t *pin = r->host_alloc(r->ctx, (uint64_t)N * BYTES, &pinned);
    uint8_t *page = malloc((size_t)N * BYTES);
    ck_assert(pin && page);
    for (size_t i = 0; i < (size_t)N * BYTES; i++)
        pin[i] = page[i] = (uint8_t)(i * 13 + i / BYTES);
    struct copy_engine *ce = r->start(r->ctx, 4096, SLOTS, &hooks);
    uint64_t t[N];
    for (uint32_t i = 0; i < N; i++) {
        const struct copy_extent x[] = {
            {(i % 2 ? pin : page) + (size_t)i * BYTES, BYTES, 0, i % 2 && pinned, 0},
            {NULL, 96, BYTES, false, (uint8_t)(0xa0 + i)}};
        ck_assert_int_eq(copy_post(ce, i % SLOTS, x, 2, 1 + i / 8, &t[i]), 0);
    }
    for (uint64_t w = 1; w <= 3; w++)
        ck_assert_int_eq(copy_window_done(ce, w), 0);
    ck_assert_int_eq(copy_wait(ce, t[N / 2]), 0);
    for (uint32_t i = 0; i <= N / 2; i++) {
        int rv = -1;
        ck_assert(copy_done(ce, t[i], &rv));
        ck_assert_int_eq(rv, 0);
    }
    copy_wait_all(ce);
    for (uint32_t i = 0; i < N; i++)
        ck_assert(copy_done(ce, t[i], NULL));
    uint8_t got[BYTES + 96], want[BYTES + 96];
    for (uint32_t s = 0; s < SLOTS; s++) {
        const uint32_t i = N - SLOTS + s; /* the last copy into slot s */
        memcpy(want, page + (size_t)i * BYTES, BYTES);
        memset(want + BYTES, 0xa0 + i, 96);
        want[(BYTES + 96) / 3] ^= 0x10;
        r->read(r->ctx, s, 0, got, sizeof got);
        ck_assert_msg(memcmp(got, want, sizeof got) == 0, "slot %u", s);
    }
    struct copy_stats st;
    copy_get_stats(ce, &st);
    ck_assert_uint_eq(st.copies, N);
    ck_assert_uint_eq(st.bytes, (uint64_t)N * (BYTES + 96));
    copy_close(ce);
    r->stop(r->ctx);
    r->host_free(r->ctx, pin);
    free(page);
}

#endif
