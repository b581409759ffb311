#include "common/base/err.h"
#include "common/base/log.h"
#include "common/quant/qtype.h"
#include "tests/testutil.h"

#include <errno.h>
#include <nng/nng.h>
#include <string.h>

START_TEST(strerror_covers_every_space)
{
    for (int c = 0; c < STRATA_ENCODES_; c++) ck_assert_ptr_nonnull(strata_strerror(c));
    ck_assert_str_eq(strata_strerror(STRATA_ENOSPC), "not enough space");
    ck_assert_str_eq(strata_strerror(strata_errno(ENOENT)), strerror(ENOENT));
    ck_assert_str_eq(strata_strerror(STRATA_ENNGERR | NNG_ETIMEDOUT), nng_strerror(NNG_ETIMEDOUT));
    ck_assert_int_eq(strata_errno(0), STRATA_EIO);
    ck_assert_ptr_nonnull(strstr(strata_strerror(STRATA_ECUDAERR | 2), "CUDA error 2"));
}
END_TEST

START_TEST(detail_is_kept_per_call)
{
    ck_assert_int_eq(strata_errf(STRATA_EFORMAT, "tensor %s bad", "x"), STRATA_EFORMAT);
    ck_assert_str_eq(strata_errdetail(), "tensor x bad");
    /* wrapping the previous detail in a new one */
    strata_errf(STRATA_ENOENT, "arena 'demo': %s (start it)", strata_errdetail());
    ck_assert_str_eq(strata_errdetail(), "arena 'demo': tensor x bad (start it)");
    strata_errclear();
    ck_assert_str_eq(strata_errdetail(), "");
}
END_TEST

START_TEST(log_levels_parse)
{
    enum strata_log_level l;
    ck_assert_int_eq(strata_log_parse_level("debug", &l), 0);
    ck_assert_int_eq(l, STRATA_LOG_DEBUG);
    ck_assert_int_eq(strata_log_parse_level("loud", &l), STRATA_EINVAL);
}
END_TEST

START_TEST(qtype_sizes)
{
    uint64_t b;
    ck_assert_int_eq(qtype_row_bytes(QT_Q4_K, 512, &b), 0);
    ck_assert_uint_eq(b, 288);
    ck_assert_int_eq(qtype_row_bytes(QT_Q4_K, 100, &b), STRATA_EINVAL);
    ck_assert_int_eq(qtype_row_bytes(4, 32, &b), STRATA_EINVAL);
    ck_assert_int_eq(qtype_parse("Q6_K"), QT_Q6_K);
    ck_assert_int_eq(qtype_parse("nope"), -1);
    ck_assert_str_eq(qtype_name(77), "type#77");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("err");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, strerror_covers_every_space);
    tcase_add_test(tc, detail_is_kept_per_call);
    tcase_add_test(tc, log_levels_parse);
    tcase_add_test(tc, qtype_sizes);
    suite_add_tcase(s, tc);
    return test_run(s);
}
