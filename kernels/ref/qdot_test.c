/* qdot_test — the reference dot products: the stated bound of qdot_ref against the exact dot
 * product on random rows of many lengths and awkward inputs, qdot_f32's single rounding, the
 * integer decoding of every element position (one-hot activations), and bad types. */
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "kernels/ref/qdot.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint32_t types[] = {QT_F32,  QT_F16,  QT_BF16, QT_Q8_0,   QT_Q4_0,
                                 QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q2_K,   QT_Q3_K,
                                 QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_NL, QT_IQ4_XS, QT_MXFP4};
#define NTYPES ((int)(sizeof types / sizeof types[0]))

static struct test_rng rng = {0x2545F4914F6CDD1Dull};

enum xkind { X_GAUSS, X_HUGE, X_MIXED, X_TINY, X_SPARSE, X_KINDS };

static void fill_x(enum xkind k, float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = test_gauss(&rng);
        switch (k) {
        case X_GAUSS:
            x[i] = g;
            break;
        case X_HUGE:
            x[i] = g;
            break;
        case X_MIXED:
            x[i] = i % 3 ? g * 1e3f : g * 1e-3f;
            break;
        case X_TINY:
            x[i] = g * 1e-5f;
            break; /* Q8_0's fp16 scale goes subnormal */
        default:
            x[i] = test_unif(&rng) < 0.9 ? 0 : g;
            break;
        }
    }
    if (k == X_HUGE) x[(int64_t)(test_unif(&rng) * (double)n)] = 5e4f;
}

/* The row's weights: gaussian, or gaussian plus an offset (the min terms of affine formats). */
static void make_row(uint32_t t, int64_t n, bool offset, void *w, float *wf)
{
    float *src = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        src[i] = test_gauss(&rng) * 0.05f + (offset ? 0.2f : 0);
    ck_assert_int_eq(quant_quantize(t, src, w, n), 0);
    ck_assert_int_eq(quant_dequantize(t, w, wf, n), 0);
    free(src);
}

START_TEST(test_bound_holds)
{
    const uint32_t t = types[_i];
    const struct qtype_info *ti = qtype_get(t);
    static const int64_t lens32[] = {32, 96, 160, 352, 1056, 4000};
    static const int64_t lens256[] = {256, 768, 1280, 2816};
    const bool k = ti->blck == 256;
    const int64_t *lens = k ? lens256 : lens32;
    const int nlens = k ? 4 : 6;
    double worst_ratio = 0, worst_rel_bound = 0;
    for (int li = 0; li < nlens; li++) {
        const int64_t n = lens[li];
        uint64_t wbytes = 0;
        ck_assert_int_eq(qtype_row_bytes(t, (uint64_t)n, &wbytes), 0);
        void *w = malloc(wbytes), *act = malloc(quant_act_bytes(t, n));
        float *wf = malloc((size_t)n * 4), *x = malloc((size_t)n * 4);
        for (int rep = 0; rep < 6; rep++) {
            make_row(t, n, rep & 1, w, wf);
            for (int xk = 0; xk < X_KINDS; xk++) {
                fill_x((enum xkind)xk, x, n);
                ck_assert_int_eq(quant_activations(t, x, act, n), 0);
                long double exact = 0, mag = 0;
                for (int64_t i = 0; i < n; i++) {
                    exact += (long double)wf[i] * x[i];
                    mag += fabsl((long double)wf[i] * x[i]);
                }
                const float got = qdot_ref(t, n, w, act);
                const double E = qdot_ref_bound(t, n, w, x);
                const double err = fabs((double)(got - exact));
                ck_assert_msg(
                    isfinite(got) && err <= E,
                    "%s, n %lld, x kind %d: qdot_ref %.9g, exact %.9Lg, error %g > bound %g",
                    ti->name, (long long)n, xk, got, exact, err, E);
                if (E > 0) worst_ratio = fmax(worst_ratio, err / E);
                if (xk == X_GAUSS) {
                    /* the bound is not vacuous: a few percent of sum |w x| on ordinary inputs */
                    ck_assert_msg(E <= 0.03 * (double)mag, "%s: bound %g is %g of sum |w x|",
                                  ti->name, E, E / (double)mag);
                    worst_rel_bound = fmax(worst_rel_bound, E / (double)mag);
                }
                /* qdot_f32: one rounding of a double sum */
                const float f = qdot_f32(t, n, w, x);
                ck_assert_msg(fabsl(f - exact) <= fabsl(exact) * 0x1p-24 + mag * n * 0x1p-52,
                              "%s: qdot_f32 %.9g vs exact %.9Lg", ti->name, f, exact);
            }
        }
        free(w);
        free(act);
        free(wf);
        free(x);
    }
    printf("%-7s qdot_ref: worst error %.3f of the bound; bound <= %.4f * sum|w x| on gaussian x\n",
           ti->name, worst_ratio, worst_rel_bound);
}
END_TEST

/* One-hot activations pick single weights: qdot_ref's integer decoding must agree with the
 * dequantizer at every position of a block (a layout slip reads a neighbour's value). */
START_TEST(test_one_hot_positions)
{
    const uint32_t t = types[_i];
    const struct qtype_info *ti = qtype_get(t);
    const int64_t n = 512;
    uint64_t wbytes = 0;
    ck_assert_int_eq(qtype_row_bytes(t, n, &wbytes), 0);
    void *w = malloc(wbytes), *act = malloc(quant_act_bytes(t, n));
    float wf[512], x[512];
    make_row(t, n, true, w, wf);
    float amax = 0;
    for (int64_t i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(wf[i]));
    for (int64_t k = 0; k < n; k++) {
        memset(x, 0, sizeof x);
        x[k] = 1;
        if (quant_activations(t, x, act, n) != 0) ck_abort_msg("quant_activations failed");
        const float got = qdot_ref(t, n, w, act);
        /* Q8_0 represents 1 as 127 * fp16(1/127): off by up to 2^-11 */
        if (!(fabsf(got - wf[k]) <= 0x1p-10f * amax))
            ck_abort_msg("%s position %lld: qdot_ref %g, weight %g", ti->name, (long long)k, got,
                         wf[k]);
    }
    free(w);
    free(act);
}
END_TEST

START_TEST(test_zeros_and_bad_types)
{
    float x[256] = {0}, wf[256];
    unsigned char w[1024], act[1200];
    for (int t = 0; t < NTYPES; t++) {
        make_row(types[t], 256, false, w, wf);
        ck_assert_int_eq(quant_activations(types[t], x, act, 256), 0);
        ck_assert(qdot_ref(types[t], 256, w, act) == 0);
        ck_assert(qdot_f32(types[t], 256, w, x) == 0);
    }
    ck_assert(isnan(qdot_ref(QT_IQ2_XXS, 256, w, act)));
    ck_assert(isnan(qdot_ref(QT_Q8_K, 256, w, act)));
    ck_assert(isnan(qdot_f32(77, 256, w, x)));
    ck_assert(isnan(qdot_ref(QT_Q4_K, 128, w, act)));
    ck_assert(isnan(qdot_ref_bound(QT_Q4_0, 31, w, x)));
}
END_TEST

static Suite *qdot_suite(void)
{
    Suite *s = suite_create("qdot");
    TCase *tc = tcase_create("bounds");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_bound_holds, 0, NTYPES);
    tcase_add_loop_test(tc, test_one_hot_positions, 0, NTYPES);
    tcase_add_test(tc, test_zeros_and_bad_types);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(qdot_suite());
}
