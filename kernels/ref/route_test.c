#include "kernels/ref/route.h"
#include "tests/testutil.h"

#include <math.h>
#include <string.h>

static float logit_of(float p)
{
    return logf(p / (1.0f - p));
}

/* Sigmoid gating: the bias picks the experts, the unbiased sigmoids weigh them, then the
 * renormalization and the routed scaling factor. */
START_TEST(bias_selects_and_sigmoid_weighs)
{
    const float probs[6] = {0.9f, 0.2f, 0.3f, 0.8f, 0.1f, 0.5f};
    const float bias[6] = {0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    float lg[6], s[6], w[2];
    uint32_t sel[2];
    for (int i = 0; i < 6; i++)
        lg[i] = logit_of(probs[i]);
    struct route_opts o = {.n_expert = 6, .k = 2, .bias = bias, .norm = false, .scale = 1.0f};
    route_biased(&o, lg, s, sel, w);
    ck_assert_uint_eq(sel[0], 1); /* 0.2 + 1 beats 0.9 */
    ck_assert_uint_eq(sel[1], 0);
    ck_assert_float_eq_tol(w[0], 0.2f, 1e-6f); /* the weight is the unbiased sigmoid */
    ck_assert_float_eq_tol(w[1], 0.9f, 1e-6f);
    for (int i = 0; i < 6; i++)
        lg[i] = logit_of(probs[i]);
    o.norm = true;
    o.scale = 2.5f;
    route_biased(&o, lg, s, sel, w);
    ck_assert_float_eq_tol(w[0], 2.5f * 0.2f / 1.1f, 1e-6f);
    ck_assert_float_eq_tol(w[1], 2.5f * 0.9f / 1.1f, 1e-6f);
    /* no bias: the plain top-k of the sigmoids */
    for (int i = 0; i < 6; i++)
        lg[i] = logit_of(probs[i]);
    o.bias = NULL;
    route_biased(&o, lg, s, sel, w);
    ck_assert_uint_eq(sel[0], 0);
    ck_assert_uint_eq(sel[1], 3);
}
END_TEST

/* Group-limited top-k (DeepSeek-V3): 4 groups of 4, a group scores its two best; the best single
 * expert sits in a group that loses, so it is not chosen. */
START_TEST(groups_limit_the_choice)
{
    const float probs[16] = {
        0.99f, 0.01f, 0.01f, 0.01f, /* group 0: 1.00 */
        0.60f, 0.60f, 0.10f, 0.10f, /* group 1: 1.20 */
        0.70f, 0.55f, 0.40f, 0.40f, /* group 2: 1.25 */
        0.30f, 0.30f, 0.30f, 0.30f, /* group 3: 0.60 */
    };
    float lg[16], s[16], w[3];
    uint32_t sel[3];
    for (int i = 0; i < 16; i++)
        lg[i] = logit_of(probs[i]);
    const struct route_opts o = {
        .n_expert = 16, .k = 3, .n_group = 4, .n_group_used = 2, .scale = 1.0f};
    route_biased(&o, lg, s, sel, w);
    ck_assert_uint_eq(sel[0], 8);
    ck_assert(sel[1] == 4 || sel[1] == 5);
    ck_assert(sel[2] == 4 || sel[2] == 5);
    ck_assert_uint_ne(sel[1], sel[2]);
    ck_assert(isinf(s[0]) && s[0] < 0); /* group 0 masked */
    /* without groups, expert 0 wins */
    for (int i = 0; i < 16; i++)
        lg[i] = logit_of(probs[i]);
    struct route_opts flat = o;
    flat.n_group = 1;
    route_biased(&flat, lg, s, sel, w);
    ck_assert_uint_eq(sel[0], 0);
}
END_TEST

/* Softmax gating with the selection bias (llama.cpp adds it to whatever the gating gives). */
START_TEST(softmax_gating_takes_the_bias_too)
{
    float lg[4] = {2.0f, 1.0f, 0.0f, 0.0f}, s[4], w[1];
    const float bias[4] = {0.0f, 0.0f, 0.9f, 0.0f};
    uint32_t sel[1];
    const struct route_opts o = {
        .n_expert = 4, .k = 1, .softmax = true, .bias = bias, .scale = 1.0f};
    route_biased(&o, lg, s, sel, w);
    const float z = expf(2.0f) + expf(1.0f) + 2.0f;
    ck_assert_uint_eq(sel[0], 2);
    ck_assert_float_eq_tol(w[0], 1.0f / z, 1e-6f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("route");
    TCase *tc = tcase_create("route");
    tcase_add_test(tc, bias_selects_and_sigmoid_weighs);
    tcase_add_test(tc, groups_limit_the_choice);
    tcase_add_test(tc, softmax_gating_takes_the_bias_too);
    suite_add_tcase(s, tc);
    return test_run(s);
}
