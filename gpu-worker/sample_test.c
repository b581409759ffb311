#include "gpu-worker/sample.h"
#include "common/base/err.h"
#include "tests/testutil.h"

#include <math.h>
#include <string.h>

static struct sample *new_sampler(uint32_t n)
{
    struct sample *s;
    ck_assert_int_eq(sample_init(n, &s), 0);
    return s;
}

START_TEST(greedy_takes_the_argmax_lowest_id_on_ties)
{
    const float logits[5] = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f};
    struct sample *s = new_sampler(5);
    struct sample_params p;
    sample_params_default(&p);
    struct sample_result r;
    ck_assert_int_eq(sample_token(s, &p, logits, NULL, 0, 7, &r), 0);
    ck_assert_int_eq(r.id, 1);
    sample_fini(s);
}
END_TEST

START_TEST(uniform_is_a_function_of_seed_and_position)
{
    ck_assert(sample_uniform(42, 9) == sample_uniform(42, 9));
    ck_assert(sample_uniform(42, 9) != sample_uniform(42, 10));
    ck_assert(sample_uniform(42, 9) != sample_uniform(43, 9));
    double sum = 0;
    for (uint64_t i = 0; i < 100000; i++) {
        double u = sample_uniform(5, i);
        ck_assert(u >= 0.0 && u < 1.0);
        sum += u;
    }
    ck_assert_double_eq_tol(sum / 100000, 0.5, 0.01);
}
END_TEST

/* draw counts how often each of 4 tokens is picked over n positions. */
static void draw(const struct sample_params *p, const float *logits, uint32_t n, uint32_t *hist)
{
    struct sample *s = new_sampler(4);
    memset(hist, 0, 4 * sizeof *hist);
    struct sample_result r;
    for (uint32_t pos = 0; pos < n; pos++) {
        ck_assert_int_eq(sample_token(s, p, logits, NULL, 0, pos, &r), 0);
        hist[r.id]++;
    }
    sample_fini(s);
}

START_TEST(temperature_and_filters_shape_the_distribution)
{
    const float logits[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 1.0f;
    p.seed = 1234;
    uint32_t h[4];
    const uint32_t n = 20000;
    draw(&p, logits, n, h);
    ck_assert_double_eq_tol(h[0] / (double)n, 0.50, 0.02);
    ck_assert_double_eq_tol(h[1] / (double)n, 0.30, 0.02);
    ck_assert_double_eq_tol(h[3] / (double)n, 0.05, 0.01);
    p.temperature = 0.5f; /* p ~ p^2: 0.25, 0.09, 0.0225, 0.0025 over 0.365 */
    draw(&p, logits, n, h);
    ck_assert_double_eq_tol(h[0] / (double)n, 0.25 / 0.365, 0.02);
    p.temperature = 1.0f;
    p.top_k = 2;
    draw(&p, logits, n, h);
    ck_assert_uint_eq(h[2] + h[3], 0);
    ck_assert_double_eq_tol(h[0] / (double)n, 0.5 / 0.8, 0.02);
    p.top_k = 0;
    p.top_p = 0.85f; /* 0.5 + 0.3 < 0.85 <= 0.95: three tokens */
    draw(&p, logits, n, h);
    ck_assert_uint_eq(h[3], 0);
    ck_assert_uint_gt(h[2], 0);
    p.top_p = 1.0f;
    p.min_p = 0.5f; /* p >= 0.25: two tokens */
    draw(&p, logits, n, h);
    ck_assert_uint_eq(h[2] + h[3], 0);
    ck_assert_uint_gt(h[1], 0);
}
END_TEST

START_TEST(same_seed_same_tokens)
{
    float logits[64];
    for (int i = 0; i < 64; i++) logits[i] = sinf((float)i);
    struct sample *s = new_sampler(64);
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0.8f;
    p.seed = 99;
    struct sample_result a, b;
    int differ = 0;
    for (uint64_t pos = 0; pos < 50; pos++) {
        ck_assert_int_eq(sample_token(s, &p, logits, NULL, 0, pos, &a), 0);
        ck_assert_int_eq(sample_token(s, &p, logits, NULL, 0, pos, &b), 0);
        ck_assert_int_eq(a.id, b.id);
        p.seed = 100;
        ck_assert_int_eq(sample_token(s, &p, logits, NULL, 0, pos, &b), 0);
        differ += a.id != b.id;
        p.seed = 99;
    }
    ck_assert_int_gt(differ, 10);
    sample_fini(s);
}
END_TEST

START_TEST(penalties_follow_llama_cpp)
{
    const float logits[4] = {2.0f, 1.5f, -1.0f, 1.2f};
    struct sample *s = new_sampler(4);
    struct sample_params p;
    sample_params_default(&p);
    struct sample_result r;
    const int32_t w0[] = {0};
    p.repeat_penalty = 2.0f; /* 2 -> 1 < 1.5 */
    ck_assert_int_eq(sample_token(s, &p, logits, w0, 1, 0, &r), 0);
    ck_assert_int_eq(r.id, 1);
    const int32_t w1[] = {0, 1, 1, 2};
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 0.2f; /* 2 - 0.2 = 1.8, 1.5 - 0.4 = 1.1 */
    p.presence_penalty = 0.7f;  /* 1.8 - 0.7 = 1.1, 1.1 - 0.7 = 0.4: token 0 and 3 (1.2) */
    ck_assert_int_eq(sample_token(s, &p, logits, w1, 4, 0, &r), 0);
    ck_assert_int_eq(r.id, 3);
    /* A negative logit is multiplied: -1 * 3 = -3 stays below the others. */
    const int32_t w2[] = {2, 2};
    p.frequency_penalty = p.presence_penalty = 0.0f;
    p.repeat_penalty = 3.0f;
    p.n_logprobs = 4;
    ck_assert_int_eq(sample_token(s, &p, logits, w2, 2, 0, &r), 0);
    ck_assert_int_eq(r.top[3].id, 2); /* logprobs stay those of the raw logits */
    ck_assert_float_eq_tol(r.top[3].logprob - r.top[0].logprob, -3.0f, 1e-5f);
    const int32_t bad[] = {4};
    ck_assert_int_eq(sample_token(s, &p, logits, bad, 1, 0, &r), STRATA_EINVAL);
    sample_fini(s);
}
END_TEST

START_TEST(logprobs_are_the_raw_log_softmax)
{
    float logits[100];
    for (int i = 0; i < 100; i++) logits[i] = (float)((i * 37) % 100) / 10.0f;
    logits[50] = logits[27]; /* 9.9 twice: the lower id ranks first */
    struct sample *s = new_sampler(100);
    struct sample_params p;
    sample_params_default(&p);
    p.n_logprobs = 5;
    p.temperature = 0.7f;
    p.top_k = 3;
    struct sample_result r;
    ck_assert_int_eq(sample_token(s, &p, logits, NULL, 0, 3, &r), 0);
    double sum = 0;
    for (int i = 0; i < 100; i++) sum += exp(logits[i]);
    ck_assert_float_eq_tol(r.logprob, logits[r.id] - log(sum), 1e-5);
    ck_assert_uint_eq(r.n_top, 5);
    for (uint32_t j = 0; j < 5; j++) {
        ck_assert_float_eq_tol(r.top[j].logprob, logits[r.top[j].id] - log(sum), 1e-5);
        if (j) ck_assert(r.top[j].logprob <= r.top[j - 1].logprob);
    }
    ck_assert_int_eq(r.top[0].id, 27);
    ck_assert_int_eq(r.top[1].id, 50);
    p.n_logprobs = SAMPLE_MAX_LOGPROBS + 1;
    ck_assert_int_eq(sample_token(s, &p, logits, NULL, 0, 3, &r), STRATA_EINVAL);
    sample_fini(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sample");
    TCase *tc = tcase_create("sample");
    tcase_add_test(tc, greedy_takes_the_argmax_lowest_id_on_ties);
    tcase_add_test(tc, uniform_is_a_function_of_seed_and_position);
    tcase_add_test(tc, temperature_and_filters_shape_the_distribution);
    tcase_add_test(tc, same_seed_same_tokens);
    tcase_add_test(tc, penalties_follow_llama_cpp);
    tcase_add_test(tc, logprobs_are_the_raw_log_softmax);
    suite_add_tcase(s, tc);
    return test_run(s);
}
