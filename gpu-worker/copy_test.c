#include "gpu-worker/copy.h"
#include "common/base/err.h"
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static int fail_odd(void *ctx, uint32_t slot, uint64_t ticket)
{
    return ticket % 2 ? STRATA_EIO : 0;
}

START_TEST(copies_wait_for_their_window_and_fail_when_told)
{
    uint8_t *slots = calloc(4, 4096);
    uint8_t src[3000];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (uint8_t)(i * 7 + 1);
    struct copy_engine *ce;
    ck_assert_int_eq(copy_start(slots, 4096, 4, NULL, &ce), 0);
    const struct copy_extent x[] = {{src, 1000, 0}, {NULL, 24, 1000}, {src + 1000, 2000, 1024}};
    memset(slots + 4096, 0xee, 4096);
    uint64_t t1;
    ck_assert_int_eq(copy_post(ce, 1, x, 3, 5, &t1), 0);
    struct timespec ts = {0, 50 * 1000000};
    nanosleep(&ts, NULL);
    int rv = -1;
    ck_assert(!copy_done(ce, t1, &rv)); /* fenced on window 5 */
    ck_assert_uint_eq(slots[4096], 0xee);
    copy_window_done(ce, 4);
    nanosleep(&ts, NULL);
    ck_assert(!copy_done(ce, t1, &rv));
    copy_window_done(ce, 5);
    ck_assert_int_eq(copy_wait(ce, t1), 0);
    ck_assert(copy_done(ce, t1, &rv));
    ck_assert_int_eq(rv, 0);
    ck_assert(memcmp(slots + 4096, src, 1000) == 0);
    for (int i = 1000; i < 1024; i++)
        ck_assert_uint_eq(slots[4096 + i], 0);
    ck_assert(memcmp(slots + 4096 + 1024, src + 1000, 2000) == 0);
    ck_assert_uint_eq(slots[4096 + 3024], 0xee); /* nothing past the blob */
    const struct copy_extent out_of_slot = {src, 100, 4000};
    ck_assert_int_eq(copy_post(ce, 0, &out_of_slot, 1, 0, &t1), STRATA_EINVAL);
    ck_assert_int_eq(copy_post(ce, 4, x, 1, 0, &t1), STRATA_EINVAL);
    struct copy_stats st;
    copy_get_stats(ce, &st);
    ck_assert_uint_eq(st.copies, 1);
    ck_assert_uint_eq(st.bytes, 3024);
    copy_close(ce);

    const struct copy_hooks hooks = {.fail = fail_odd, .hold_ms = 20};
    ck_assert_int_eq(copy_start(slots, 4096, 4, &hooks, &ce), 0);
    uint64_t a, b;
    ck_assert_int_eq(copy_post(ce, 2, x, 1, 0, &a), 0);
    ck_assert_int_eq(copy_post(ce, 3, x, 1, 0, &b), 0);
    ck_assert_int_eq(copy_wait(ce, a), STRATA_EIO);
    ck_assert_int_eq(copy_wait(ce, b), 0);
    copy_get_stats(ce, &st);
    ck_assert_uint_eq(st.failed, 1);
    copy_close(ce);
    free(slots);
}
END_TEST

static uint32_t g_waited;

static void count_wait(void *ctx, uint64_t ticket)
{
    g_waited++;
}

static int refuse_slot_3(void *ctx, uint32_t slot)
{
    return slot == 3 ? STRATA_EIO : 0;
}

/* defer: a copy runs only once waited for (or at close), whatever the time; on_wait sees each
 * wait that finds its copy in flight; refuse makes a post fail. */
START_TEST(deferred_copies_run_when_waited)
{
    uint8_t *slots = calloc(4, 4096);
    uint8_t src[100];
    memset(src, 0x5c, sizeof src);
    const struct copy_hooks hooks = {.defer = true, .on_wait = count_wait,
                                     .refuse = refuse_slot_3};
    struct copy_engine *ce;
    ck_assert_int_eq(copy_start(slots, 4096, 4, &hooks, &ce), 0);
    const struct copy_extent x = {src, sizeof src, 0};
    uint64_t a, b, c;
    ck_assert_int_eq(copy_post(ce, 0, &x, 1, 0, &a), 0);
    ck_assert_int_eq(copy_post(ce, 1, &x, 1, 0, &b), 0);
    ck_assert_int_eq(copy_post(ce, 3, &x, 1, 0, &c), STRATA_EIO);
    struct timespec ts = {0, 30 * 1000000};
    nanosleep(&ts, NULL);
    int rv;
    ck_assert(!copy_done(ce, a, &rv));
    ck_assert_uint_eq(slots[0], 0);
    ck_assert_int_eq(copy_wait(ce, a), 0);
    ck_assert_uint_eq(g_waited, 1);
    ck_assert_uint_eq(slots[0], 0x5c);
    ck_assert(!copy_done(ce, b, &rv)); /* not waited for yet */
    ck_assert_uint_eq(slots[4096], 0);
    ck_assert_int_eq(copy_post(ce, 2, &x, 1, 0, &c), 0);
    copy_close(ce); /* runs the deferred ones */
    ck_assert_uint_eq(slots[4096], 0x5c);
    ck_assert_uint_eq(slots[2 * 4096], 0x5c);
    ck_assert_uint_eq(g_waited, 1);
    free(slots);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("copy");
    TCase *tc = tcase_create("copy");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, copies_wait_for_their_window_and_fail_when_told);
    tcase_add_test(tc, deferred_copies_run_when_waited);
    suite_add_tcase(s, tc);
    return test_run(s);
}
