#include "gpu-worker/tier.h"
#include "common/base/err.h"
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

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

int main(void)
{
    Suite *s = suite_create("tier");
    TCase *tc = tcase_create("tier");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, tier_picks_by_its_rule);
    suite_add_tcase(s, tc);
    return test_run(s);
}
