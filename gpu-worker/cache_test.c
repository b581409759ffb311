#include "gpu-worker/cache.h"
#include "common/base/err.h"
#include "gpu-worker/copy.h"
#include "gpu-worker/tier.h"
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

START_TEST(spec_forms_and_slot_counts)
{
    struct cache_spec s;
    ck_assert_int_eq(cache_spec_parse("auto", &s), 0);
    ck_assert_int_eq(s.kind, CACHE_AUTO);
    ck_assert_uint_eq(cache_spec_slots(&s, 4096, 7, 100), 7);
    ck_assert_int_eq(cache_spec_parse("96", &s), 0);
    ck_assert_uint_eq(cache_spec_slots(&s, 4096, 0, 100), 96);
    ck_assert_uint_eq(cache_spec_slots(&s, 4096, 0, 50), 50); /* capped at the experts there are */
    ck_assert_int_eq(cache_spec_parse("1.5GiB", &s), 0);
    ck_assert_uint_eq(s.value, 3ull << 29);
    ck_assert_uint_eq(cache_spec_slots(&s, 1u << 20, 0, 100000), 1536);
    ck_assert_int_eq(cache_spec_parse("512MiB", &s), 0);
    ck_assert_uint_eq(s.value, 512ull << 20);
    static const char *bad[] = {"", "-3", "2.5", "12GB", "lots", "1e30GiB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(cache_spec_parse(bad[i], &s), STRATA_EINVAL);
        ck_assert_ptr_nonnull(strstr(strata_errdetail(), "12GiB"));
    }
}
END_TEST

START_TEST(tables_publish_and_fill_order)
{
    struct cache *c;
    ck_assert_int_eq(cache_init(2, 4, 3, 8192, &c), 0);
    ck_assert_int_eq(cache_free_slot(c), 0);
    cache_assign(c, 0, 1, 2);
    ck_assert_int_eq(cache_slot(c, 1, 2), CACHE_NONE); /* not published yet */
    cache_publish(c);
    ck_assert_int_eq(cache_slot(c, 1, 2), 0);
    ck_assert_uint_eq(cache_resident(c), 1);
    ck_assert_int_eq(cache_free_slot(c), 1);
    cache_evict(c, 0);
    ck_assert_int_eq(cache_slot(c, 1, 2), 0); /* windows keep reading the published table */
    cache_publish(c);
    ck_assert_int_eq(cache_slot(c, 1, 2), CACHE_NONE);
    cache_assign(c, 2, 0, 3);
    ck_assert_int_eq(cache_resize(c, 2), 0); /* slot 2 goes: its expert leaves */
    cache_publish(c);
    ck_assert_uint_eq(cache_resident(c), 0);
    ck_assert_int_eq(cache_resize(c, 5), 0);
    ck_assert_uint_eq(c->n_slots, 5);
    ck_assert_int_eq(cache_free_slot(c), 0);
    cache_fini(c);
    /* hottest first; ties by expert id, then layer: without heat the layers share evenly */
    uint32_t order[8];
    ck_assert_int_eq(cache_fill_order(2, 4, NULL, order), 0);
    const uint32_t even[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    ck_assert(memcmp(order, even, sizeof order) == 0);
    const uint64_t heat[8] = {1, 9, 0, 9, 5, 0, 0, 2};
    ck_assert_int_eq(cache_fill_order(2, 4, heat, order), 0);
    const uint32_t hot[8] = {1, 3, 4, 7, 0, 5, 2, 6};
    ck_assert(memcmp(order, hot, sizeof order) == 0);
}
END_TEST

START_TEST(tier_picks_by_its_rule)
{
    struct tier_opts o = {.every = 2, .swaps = 3, .decay = 0.5f, .min_count = 2.0f, .lead = 1.5f};
    struct tier *t;
    ck_assert_int_eq(tier_init(2, 4, &o, &t), 0);
    ck_assert(!tier_window(t));
    ck_assert(tier_window(t)); /* every 2 windows */
    struct cache *c;
    ck_assert_int_eq(cache_init(2, 4, 2, 4096, &c), 0);
    cache_assign(c, 0, 0, 0);
    cache_assign(c, 1, 1, 0);
    /* after the round's decay (x0.5): layer 0: e0 resident 2, e1 5, e2 2.5; layer 1: e0
     * resident 3, e1 3.5 (leads by 0.5 only), e3 1.5 (below min_count) */
    const float counts[2][4] = {{4, 10, 5, 0}, {6, 7, 0, 3}};
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t e = 0; e < 4; e++)
            tier_count(t, l, e, counts[l][e]);
    struct tier_move mv[8];
    uint32_t n = tier_round(t, c, mv, 8);
    ck_assert_float_eq(tier_count_of(t, 0, 1), 5.0f);
    /* only layer 0's e1 leads its layer's least-used resident (e0 at 2) by >= 1.5; e2 would
     * need another victim in layer 0 and there is none left */
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(mv[0].layer, 0);
    ck_assert_uint_eq(mv[0].expert, 1);
    ck_assert_uint_eq(mv[0].slot, 0);
    ck_assert_int_eq(mv[0].victim, 0);
    /* free slots are taken first, and the swaps cap holds */
    cache_evict(c, 1);
    n = tier_round(t, c, mv, 8);
    ck_assert_uint_eq(n, 1); /* after another decay only layer 0 e1 (2.5) reaches min_count */
    ck_assert_uint_eq(mv[0].slot, 1);
    ck_assert_int_eq(mv[0].victim, CACHE_NONE);
    cache_fini(c);
    tier_fini(t);
}
END_TEST

/* ---- the host copy engine -------------------------------------------------------------------- */

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

int main(void)
{
    Suite *s = suite_create("cache");
    TCase *tc = tcase_create("cache");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, spec_forms_and_slot_counts);
    tcase_add_test(tc, tables_publish_and_fill_order);
    tcase_add_test(tc, tier_picks_by_its_rule);
    tcase_add_test(tc, copies_wait_for_their_window_and_fail_when_told);
    suite_add_tcase(s, tc);
    return test_run(s);
}
