#include "gpu-worker/kv.h"
#include "common/err.h"
#include "tests/testutil.h"

#include <string.h>

static const struct kv_config cfg = {
    .n_layer = 2, .k_dim = 8, .v_dim = 4, .block_tokens = 4, .n_ctx = 20, .max_blocks = 6};

START_TEST(rows_stay_put_across_growth)
{
    struct kv_cache *kv;
    ck_assert_int_eq(kv_init(&cfg, &kv), 0);
    struct kv_seq s;
    kv_seq_init(&s);
    ck_assert_int_eq(kv_seq_resize(kv, &s, 3), 0);
    ck_assert_uint_eq(s.n_blocks, 1);
    for (uint32_t p = 0; p < 3; p++)
        for (uint32_t l = 0; l < 2; l++) {
            for (uint32_t i = 0; i < 8; i++) kv_k(kv, &s, l, p)[i] = 100.0f * l + 10 * p + i;
            for (uint32_t i = 0; i < 4; i++) kv_v(kv, &s, l, p)[i] = -100.0f * l - 10 * p - i;
        }
    ck_assert_int_eq(kv_seq_resize(kv, &s, 9), 0);
    ck_assert_uint_eq(s.n_blocks, 3);
    ck_assert_uint_eq(kv_blocks_free(kv), 3);
    for (uint32_t p = 3; p < 9; p++)
        for (uint32_t l = 0; l < 2; l++) {
            for (uint32_t i = 0; i < 8; i++) kv_k(kv, &s, l, p)[i] = 100.0f * l + 10 * p + i;
            for (uint32_t i = 0; i < 4; i++) kv_v(kv, &s, l, p)[i] = -100.0f * l - 10 * p - i;
        }
    /* Through the attention view, every row reads back what was written, K and V apart. */
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t h = 0; h < 2; h++) {
            struct ops_kv_view v;
            kv_view(kv, &s, l, h, 4, 2, &v);
            for (uint32_t p = 0; p < 9; p++) {
                const float *kr = v.blocks[p / 4] + v.k_off + (p % 4) * v.k_stride;
                const float *vr = v.blocks[p / 4] + v.v_off + (p % 4) * v.v_stride;
                ck_assert_float_eq(kr[1], 100.0f * l + 10 * p + h * 4 + 1);
                ck_assert_float_eq(vr[1], -100.0f * l - 10 * p - h * 2 - 1);
            }
        }
    kv_seq_fini(kv, &s);
    ck_assert_uint_eq(kv_blocks_free(kv), 6);
    kv_fini(kv);
}
END_TEST

START_TEST(limits_are_refused_and_leave_the_sequence_alone)
{
    struct kv_cache *kv;
    ck_assert_int_eq(kv_init(&cfg, &kv), 0);
    struct kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    ck_assert_int_eq(kv_seq_resize(kv, &a, 21), STRATA_ELIMIT);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "context of 20"));
    ck_assert_uint_eq(a.n_tokens, 0);
    ck_assert_int_eq(kv_seq_resize(kv, &a, 20), 0); /* 5 blocks */
    ck_assert_int_eq(kv_seq_resize(kv, &b, 5), STRATA_ENOSPC);
    ck_assert_uint_eq(b.n_tokens, 0);
    ck_assert_uint_eq(b.n_blocks, 0);
    /* Shrinking returns blocks: re-prefill from the middle. */
    ck_assert_int_eq(kv_seq_resize(kv, &a, 8), 0);
    ck_assert_uint_eq(a.n_blocks, 2);
    ck_assert_int_eq(kv_seq_resize(kv, &b, 16), 0);
    ck_assert_uint_eq(kv_blocks_free(kv), 0);
    kv_seq_fini(kv, &a);
    kv_seq_fini(kv, &b);
    kv_fini(kv);
    struct kv_config bad = cfg;
    bad.block_tokens = 0;
    ck_assert_int_eq(kv_init(&bad, &kv), STRATA_EINVAL);
    kv_fini(NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv");
    TCase *tc = tcase_create("kv");
    tcase_add_test(tc, rows_stay_put_across_growth);
    tcase_add_test(tc, limits_are_refused_and_leave_the_sequence_alone);
    suite_add_tcase(s, tc);
    return test_run(s);
}
