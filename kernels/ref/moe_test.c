#include "kernels/ref/moe.h"
#include "tests/testutil.h"

#include <stdint.h>
#include <string.h>

/* moe_group: the experts a mask selects, ascending, each expert's pairs in pair order, in runs of
 * at most max_pairs, laid out back to back in pair_idx. */
START_TEST(groups_follow_ids_mask_and_cap)
{
    /* 4 tokens, top-2, over 4 experts */
    const int32_t ids[8] = {2, 0, 1, 2, 2, 3, 0, 2};
    struct moe_group g[8];
    int32_t idx[8];
    int n = moe_group(ids, 4, 2, 4, NULL, UINT32_MAX, g, idx);
    ck_assert_int_eq(n, 4);
    const int32_t want_idx[8] = {1, 6, 2, 0, 3, 4, 7, 5};
    ck_assert(memcmp(idx, want_idx, sizeof idx) == 0);
    ck_assert_int_eq(g[2].expert, 2);
    ck_assert_int_eq(g[2].first, 3);
    ck_assert_int_eq(g[2].count, 4);
    /* a cap of 3 pairs cuts expert 2 in two runs; a mask leaves experts 0 and 3 out */
    const uint8_t mask[4] = {0, 1, 1, 0};
    n = moe_group(ids, 4, 2, 4, mask, 3, g, idx);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(g[0].expert, 1);
    ck_assert_int_eq(g[1].expert, 2);
    ck_assert_int_eq(g[1].count, 3);
    ck_assert_int_eq(g[2].expert, 2);
    ck_assert_int_eq(g[2].first, 4);
    ck_assert_int_eq(g[2].count, 1);
    ck_assert_int_eq(idx[4], 7);
}
END_TEST

/* moe_combine adds a token's outputs from zero in ascending expert id, whatever the pair order:
 * the float sum is order-sensitive, so the values make a wrong order show. */
START_TEST(combine_adds_in_expert_order)
{
    const int32_t ids[3] = {7, 1, 4};         /* one token, top-3: expert order is pairs 1, 2, 0 */
    const float out[3] = {1.0f, 1e8f, -1e8f}; /* (1e8 + -1e8) + 1 = 1; (1 + 1e8) + -1e8 = 0 */
    float y;
    moe_combine(out, ids, 0, 1, 3, 1, &y);
    ck_assert_float_eq(y, 1.0f);
    const int32_t ids2[3] = {0, 1, 4}; /* expert order is pair order: 1 + 1e8 - 1e8 = 0 */
    moe_combine(out, ids2, 0, 1, 3, 1, &y);
    ck_assert_float_eq(y, 0.0f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("moe");
    TCase *tc = tcase_create("moe");
    tcase_add_test(tc, groups_follow_ids_mask_and_cap);
    tcase_add_test(tc, combine_adds_in_expert_order);
    suite_add_tcase(s, tc);
    return test_run(s);
}
