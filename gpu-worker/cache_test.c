#include "gpu-worker/cache.h"
#include "common/base/err.h"
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

/* One budget: a slot lent to the KV cache takes a free slot first, else the least-used resident
 * (ties: the highest slot); it is never free, never resident, and a shrink past it is refused. */
START_TEST(slots_lent_to_the_kv_cache)
{
    struct cache *c;
    ck_assert_int_eq(cache_init(2, 4, 4, 8192, &c), 0);
    cache_assign(c, 0, 0, 0);
    cache_assign(c, 1, 0, 1);
    cache_assign(c, 3, 1, 2);
    cache_publish(c);
    const float counts[8] = {5, 1, 0, 0, 0, 0, 3, 0};
    ck_assert_int_eq(cache_lend(c, counts, 4), 2); /* the free one */
    ck_assert_uint_eq(c->n_lent, 1);
    ck_assert_int_eq(cache_free_slot(c), CACHE_NONE);
    ck_assert_int_eq(cache_lend(c, counts, 4), 1); /* (0, 1): count 1 */
    ck_assert_int_eq(c->work[1], CACHE_NONE);
    ck_assert_int_eq(cache_slot(c, 0, 1), 1); /* until published */
    cache_publish(c);
    ck_assert_int_eq(cache_slot(c, 0, 1), CACHE_NONE);
    ck_assert_uint_eq(cache_resident(c), 2);
    ck_assert_int_eq(cache_lend(c, NULL, 4), 3); /* no counts: the highest resident */
    ck_assert_int_eq(cache_lend(c, counts, 1), 0);
    ck_assert_int_eq(cache_lend(c, counts, 4), CACHE_NONE); /* all lent */
    cache_evict(c, 3); /* a lent slot is not an expert's: unchanged */
    ck_assert_int_eq(c->owner[3], CACHE_LENT);
    ck_assert_int_eq(cache_resize(c, 2), STRATA_EBUSY);
    ck_assert_uint_eq(c->n_slots, 4);
    cache_unlend(c, 3);
    cache_unlend(c, 2);
    ck_assert_uint_eq(c->n_lent, 2);
    ck_assert_int_eq(cache_free_slot(c), 2);
    ck_assert_int_eq(cache_resize(c, 2), 0);
    ck_assert_uint_eq(c->n_lent, 2);
    cache_fini(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cache");
    TCase *tc = tcase_create("cache");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, spec_forms_and_slot_counts);
    tcase_add_test(tc, tables_publish_and_fill_order);
    tcase_add_test(tc, slots_lent_to_the_kv_cache);
    suite_add_tcase(s, tc);
    return test_run(s);
}
