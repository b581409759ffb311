/* The host copy of strata_expf (expf.cuh compiled as C: the same text the GPU runs, with fma() for
 * __fma_rn) against this libm's expf: every 251st float bit pattern (both signs, every exponent,
 * every table index, inf and NaN among them) and the neighbours of each of glibc's branch points.
 * A wrong table entry, polynomial coefficient, rounding step or special path fails here, in CI,
 * without a GPU. Skips where libm is not glibc 2.28 or later (another algorithm). */
#include "kernels/cuda/expf.cuh"
#include "tests/testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int differs(float x)
{
    const float e = expf(x), g = strata_expf(x);
    return memcmp(&e, &g, 4) != 0 && !(isnan(e) && isnan(g));
}

static float of_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static int glibc_table_expf(void)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 28)
    return 1;
#else
    printf("SKIP expf: this libm is not glibc 2.28+, whose expf strata_expf copies\n");
    return 0;
#endif
}

START_TEST(strided_sweep_equals_libm)
{
    if (!glibc_table_expf()) return;
    enum { STRIDE = 251, CHUNK = 1 << 20 };
    uint64_t n = 0;
    for (uint64_t k = 0; k < (1ull << 32); k += (uint64_t)STRIDE * CHUNK) {
        /* one assertion per chunk: Check logs every assertion that passes */
        uint64_t bad = 0;
        for (uint64_t i = k; i < k + (uint64_t)STRIDE * CHUNK && i < (1ull << 32) && !bad;
             i += STRIDE, n++)
            if (differs(of_bits((uint32_t)i))) bad = i | 1ull << 32;
        ck_assert_msg(!bad, "expf(%a) = %a, strata_expf %a", of_bits((uint32_t)bad),
                      expf(of_bits((uint32_t)bad)), strata_expf(of_bits((uint32_t)bad)));
    }
    ck_assert_uint_eq(n, (1ull << 32) / STRIDE + 1);
}
END_TEST

/* The table alone, against an independent 2^(i/32): a one-ulp error in an entry changes so few
 * floats' results that a sampled sweep can miss it. exp2l has 64 bits, so rounding it to double
 * gives the nearest double (every entry is more than 1/50 ulp from a tie). */
START_TEST(table_is_two_to_the_i_over_32)
{
    for (uint64_t i = 0; i < 32; i++) {
        const double want = (double)exp2l((long double)i / 32);
        uint64_t u;
        memcpy(&u, &want, 8);
        ck_assert_msg(strata_expf_tab[i] + (i << 47) == u,
                      "entry %u: %016llx, 2^(%u/32) is %016llx", (unsigned)i,
                      (unsigned long long)strata_expf_tab[i], (unsigned)i,
                      (unsigned long long)(u - (i << 47)));
    }
}
END_TEST

START_TEST(branch_points_equal_libm)
{
    if (!glibc_table_expf()) return;
    /* |x| = 88, log(2^128), log(2^-150), log(2^-149), -inf, inf, NaN, zeros, the largest finite */
    static const uint32_t at[] = {0x42b00000u, 0xc2b00000u, 0x42b17217u, 0xc2cff1b4u,
                                  0xc2ce8ecfu, 0xff800000u, 0x7f800000u, 0x7fc00000u,
                                  0x00000000u, 0x80000000u, 0x7f7fffffu, 0xff7fffffu};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
        for (uint32_t d = 0; d < 33; d++) {
            const float x = of_bits(at[i] + d - 16);
            ck_assert_msg(!differs(x), "expf(%a) = %a, strata_expf %a", x, expf(x), strata_expf(x));
        }
    /* the main path's subnormal results and the last finite one */
    for (float x = -103.9f; x < -87.0f; x += 0.01f)
        if (differs(x)) ck_abort_msg("expf(%a) = %a, strata_expf %a", x, expf(x), strata_expf(x));
    ck_assert(strata_expf(0x1.62e42ep6f) < INFINITY && strata_expf(0x1.62e430p6f) == INFINITY);
    ck_assert(strata_expf(-INFINITY) == 0.0f && isnan(strata_expf(NAN)));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("expf");
    TCase *tc = tcase_create("expf");
    tcase_set_timeout(tc, 120); /* Debug + ASan */
    tcase_add_test(tc, strided_sweep_equals_libm);
    tcase_add_test(tc, branch_points_equal_libm);
    tcase_add_test(tc, table_is_two_to_the_i_over_32);
    suite_add_tcase(s, tc);
    return test_run(s);
}
