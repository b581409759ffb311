#include "kernels/ref/ops.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "kernels/ref/qdot.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 1;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

START_TEST(rmsnorm_matches_the_formula)
{
    float x[96], w[96], y[96];
    for (int i = 0; i < 96; i++) {
        x[i] = frand() * 3;
        w[i] = frand();
    }
    ops_rmsnorm(y, x, w, 96, 1e-6f);
    double ss = 0;
    for (int i = 0; i < 96; i++) ss += (double)x[i] * x[i];
    for (int i = 0; i < 96; i++)
        ck_assert_double_eq_tol(y[i], x[i] / sqrt(ss / 96 + 1e-6) * w[i], 1e-5);
}
END_TEST

START_TEST(rope_rotates_the_right_pairs)
{
    const float theta = 10000.0f;
    float a[8], b[8];
    for (int i = 0; i < 8; i++) a[i] = b[i] = (float)(i + 1);
    ops_rope(a, 1, 8, 8, 0, theta, false);
    for (int i = 0; i < 8; i++) ck_assert_float_eq(a[i], (float)(i + 1)); /* position 0: identity */
    /* Normal: pair (2i, 2i+1) by pos * theta^(-2i/8); NeoX: pair (i, i+4) by the same angle. */
    ops_rope(a, 1, 8, 8, 3, theta, false);
    ops_rope(b, 1, 8, 8, 3, theta, true);
    for (int i = 0; i < 4; i++) {
        double ang = 3.0 * pow(theta, -2.0 * i / 8);
        double x0 = 2 * i + 1, x1 = 2 * i + 2;
        ck_assert_double_eq_tol(a[2 * i], x0 * cos(ang) - x1 * sin(ang), 1e-4);
        ck_assert_double_eq_tol(a[2 * i + 1], x0 * sin(ang) + x1 * cos(ang), 1e-4);
        x0 = i + 1, x1 = i + 5;
        ck_assert_double_eq_tol(b[i], x0 * cos(ang) - x1 * sin(ang), 1e-4);
        ck_assert_double_eq_tol(b[i + 4], x0 * sin(ang) + x1 * cos(ang), 1e-4);
    }
    /* n_rot < head_dim leaves the tail alone; the second head rotates like the first. */
    float c[12] = {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6};
    ops_rope(c, 2, 6, 4, 5, theta, true);
    ck_assert_float_eq(c[4], 5.0f);
    ck_assert_float_eq(c[5], 6.0f);
    ck_assert_mem_eq(c, c + 6, 6 * sizeof(float));
}
END_TEST

START_TEST(softmax_topk_silu)
{
    float x[5] = {1, 3, 3, -2, 0.5f};
    uint32_t idx[3];
    ops_topk(x, 5, 3, idx);
    ck_assert_uint_eq(idx[0], 1); /* a tie: lower index first */
    ck_assert_uint_eq(idx[1], 2);
    ck_assert_uint_eq(idx[2], 0);
    ops_softmax(x, 5);
    double sum = 0;
    for (int i = 0; i < 5; i++) sum += x[i];
    ck_assert_double_eq_tol(sum, 1.0, 1e-6);
    ck_assert_float_eq_tol(x[1] / x[0], expf(2.0f), 1e-4);
    ck_assert_float_eq_tol(ops_silu(2.0f), 2.0f / (1.0f + expf(-2.0f)), 1e-7);
}
END_TEST

/* scan_argmax: the loop ops_argmax stands for. */
static uint32_t scan_argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

START_TEST(argmax_is_the_scans_pick)
{
    /* lengths around the lanes' multiples; few distinct values, so ties, +0 / -0 and NaNs
     * (x[0] among them) fall anywhere, the maximum in the tail too */
    const float vals[] = {-1.0f, 0.0f, -0.0f, 2.0f, 2.0f, NAN, -INFINITY, INFINITY, 0.5f};
    static float x[1000];
    for (uint32_t n = 0; n <= 40; n++)
        for (int rep = 0; rep < 400; rep++) {
            const int nv = rep % 3 == 0 ? 9 : rep % 3 == 1 ? 5 : 3; /* some without NaN or inf */
            for (uint32_t i = 0; i < n; i++)
                x[i] = vals[(uint32_t)((frand() + 1.0f) * 1000.0f) % (uint32_t)nv];
            ck_assert_msg(ops_argmax(x, n) == scan_argmax(x, n), "n %u rep %d: %u, the scan %u", n,
                          rep, ops_argmax(x, n), scan_argmax(x, n));
        }
    for (uint32_t i = 0; i < 1000; i++)
        x[i] = frand();
    x[777] = 3.0f;
    ck_assert_uint_eq(ops_argmax(x, 1000), 777);
    x[3] = 3.0f; /* the first of a tie */
    ck_assert_uint_eq(ops_argmax(x, 1000), 3);
}
END_TEST

/* A weight matrix of rows x n in type, and its float values. */
static void *make_weights(uint32_t type, uint32_t rows, uint32_t n, uint64_t *row_bytes)
{
    ck_assert_int_eq(qtype_row_bytes(type, n, row_bytes), 0);
    uint8_t *w = malloc(rows * *row_bytes);
    float *f = malloc(n * sizeof *f);
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t i = 0; i < n; i++) f[i] = frand() * 0.1f;
        ck_assert_int_eq(quant_quantize(type, f, w + r * *row_bytes, n), 0);
    }
    free(f);
    return w;
}

START_TEST(matmul_is_one_row_dot_per_element)
{
    const uint32_t types[] = {QT_F32, QT_F16, QT_Q8_0, QT_Q4_K, QT_Q6_K};
    const uint32_t n = 512, rows = 13, T = 5;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t type = types[ti];
        uint64_t rb;
        void *w = make_weights(type, rows, n, &rb);
        float *x = malloc(T * n * sizeof *x);
        for (uint32_t i = 0; i < T * n; i++) x[i] = frand();
        size_t ab = quant_act_bytes(type, n);
        uint8_t *acts = malloc(T * ab);
        ck_assert_int_eq(ops_quantize_acts(type, x, n, n, T, acts, ab), 0);
        float all[5 * 13], split[5 * 13], one[13];
        ops_matmul(type, w, rb, n, 0, rows, acts, ab, T, all, rows);
        ops_matmul(type, w, rb, n, 0, 4, acts, ab, T, split, rows);
        ops_matmul(type, w, rb, n, 4, rows, acts, ab, T, split, rows);
        ck_assert_mem_eq(all, split, sizeof all); /* any row split, same bits */
        for (uint32_t t = 0; t < T; t++) {
            ops_matmul(type, w, rb, n, 0, rows, acts + t * ab, ab, 1, one, rows);
            ck_assert_mem_eq(one, all + t * rows, sizeof one); /* any batch, same bits */
            for (uint32_t r = 0; r < rows; r++) {
                const void *wr = (const uint8_t *)w + r * rb;
                double bound = qdot_ref_bound(type, n, wr, x + t * n);
                float *deq = malloc(n * sizeof *deq);
                ck_assert_int_eq(quant_dequantize(type, wr, deq, n), 0);
                double exact = 0;
                for (uint32_t i = 0; i < n; i++) exact += (double)deq[i] * x[t * n + i];
                free(deq);
                ck_assert_msg(fabs(all[t * rows + r] - exact) <= bound,
                              "%s row %u: %g vs %g, bound %g", qtype_name(type), r,
                              all[t * rows + r], exact, bound);
            }
        }
        free(w);
        free(x);
        free(acts);
    }
}
END_TEST

/* attention through a paged view of block_tokens positions per block, keys [key_lo, n_keys),
 * with a sink logit (-INFINITY: none); plain ops_attention when key_lo is 0 and there is none. */
static void paged_attention_ex(float *out, const float *q, const float *K, const float *V,
                               uint32_t d, uint32_t dv, uint32_t key_lo, uint32_t n_keys,
                               uint32_t bt, float sink)
{
    uint32_t nb = (n_keys + bt - 1) / bt;
    float **blocks = malloc(nb * sizeof *blocks);
    /* Layout of kv.c: per block, bt K rows of d then bt V rows of dv. */
    for (uint32_t b = 0; b < nb; b++) {
        blocks[b] = calloc((size_t)bt * (d + dv), sizeof(float));
        for (uint32_t s = 0; s < bt && b * bt + s < n_keys; s++) {
            memcpy(blocks[b] + s * d, K + (b * bt + s) * d, d * sizeof(float));
            memcpy(blocks[b] + bt * d + s * dv, V + (b * bt + s) * dv, dv * sizeof(float));
        }
    }
    struct ops_kv_view v = {.blocks = blocks,
                            .block_tokens = bt,
                            .v_off = (size_t)bt * d,
                            .k_stride = d,
                            .v_stride = dv};
    if (key_lo == 0 && sink == -INFINITY)
        ops_attention(out, q, d, dv, 1.0f / sqrtf((float)d), &v, n_keys);
    else
        ops_attention_ex(out, q, d, dv, 1.0f / sqrtf((float)d), &v, key_lo, n_keys, sink);
    for (uint32_t b = 0; b < nb; b++) free(blocks[b]);
    free(blocks);
}

static void paged_attention(float *out, const float *q, const float *K, const float *V,
                            uint32_t d, uint32_t dv, uint32_t n_keys, uint32_t bt)
{
    paged_attention_ex(out, q, K, V, d, dv, 0, n_keys, bt, -INFINITY);
}

START_TEST(attention_is_softmax_in_fixed_blocks)
{
    const uint32_t d = 16, dv = 8, N = 100;
    float *K = malloc(N * d * sizeof *K), *V = malloc(N * dv * sizeof *V), q[16];
    for (uint32_t i = 0; i < N * d; i++) K[i] = frand() * 2;
    for (uint32_t i = 0; i < N * dv; i++) V[i] = frand();
    for (uint32_t i = 0; i < d; i++) q[i] = frand() * 2;
    const uint32_t counts[] = {1, 31, 32, 33, 64, 100};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        uint32_t n = counts[c];
        float a[8], b[8];
        paged_attention(a, q, K, V, d, dv, n, 32);
        paged_attention(b, q, K, V, d, dv, n, 7);
        ck_assert_mem_eq(a, b, sizeof a); /* paging changes addresses, never arithmetic */
        double s[100], mx = -1e30, sum = 0;
        for (uint32_t j = 0; j < n; j++) {
            s[j] = 0;
            for (uint32_t i = 0; i < d; i++) s[j] += (double)q[i] * K[j * d + i];
            s[j] /= sqrt((double)d);
            mx = s[j] > mx ? s[j] : mx;
        }
        for (uint32_t j = 0; j < n; j++) sum += exp(s[j] - mx);
        for (uint32_t i = 0; i < dv; i++) {
            double o = 0;
            for (uint32_t j = 0; j < n; j++) o += exp(s[j] - mx) / sum * V[j * dv + i];
            ck_assert_double_eq_tol(a[i], o, 1e-5);
        }
    }
    free(K);
    free(V);
}
END_TEST

/* gpt-oss's attention: keys [lo, n) of a sliding window and a sink that joins the denominator
 * with no value, against the softmax written out in double. */
START_TEST(attention_window_and_sink_match_the_softmax)
{
    const uint32_t d = 16, dv = 8, N = 100;
    float *K = malloc(N * d * sizeof *K), *V = malloc(N * dv * sizeof *V), q[16];
    for (uint32_t i = 0; i < N * d; i++) K[i] = frand() * 2;
    for (uint32_t i = 0; i < N * dv; i++) V[i] = frand();
    for (uint32_t i = 0; i < d; i++) q[i] = frand() * 2;
    const struct {
        uint32_t lo, n;
        float sink;
    } cases[] = {{0, 40, -INFINITY}, {5, 40, -INFINITY}, {31, 33, -INFINITY}, {32, 64, 0.5f},
                 {0, 1, 3.0f},       {60, 100, -2.0f},   {99, 100, 40.0f},   {0, 100, 1.0f}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const uint32_t lo = cases[c].lo, n = cases[c].n;
        const float sink = cases[c].sink;
        float a[8], b[8];
        paged_attention_ex(a, q, K, V, d, dv, lo, n, 32, sink);
        paged_attention_ex(b, q, K, V, d, dv, lo, n, 7, sink);
        ck_assert_mem_eq(a, b, sizeof a);
        double sc[100], mx = sink, sum = 0;
        for (uint32_t j = lo; j < n; j++) {
            sc[j] = 0;
            for (uint32_t i = 0; i < d; i++) sc[j] += (double)q[i] * K[j * d + i];
            sc[j] /= sqrt((double)d);
            mx = sc[j] > mx ? sc[j] : mx;
        }
        for (uint32_t j = lo; j < n; j++) sum += exp(sc[j] - mx);
        sum += exp((double)sink - mx);
        for (uint32_t i = 0; i < dv; i++) {
            double o = 0;
            for (uint32_t j = lo; j < n; j++) o += exp(sc[j] - mx) / sum * V[j * dv + i];
            ck_assert_msg(fabs(a[i] - o) <= 1e-5 + 1e-5 * fabs(o), "case %zu dim %u: %g vs %g", c,
                          i, a[i], o);
        }
    }
    /* no window and no sink: ops_attention's bits */
    float a[8], b[8];
    paged_attention(a, q, K, V, d, dv, 77, 32);
    paged_attention_ex(b, q, K, V, d, dv, 0, 77, 32, -INFINITY);
    ck_assert_mem_eq(a, b, sizeof a);
    free(K);
    free(V);
}
END_TEST

/* The clamped SwiGLU: gate clamped above only, up on both sides, alpha in the sigmoid, up + 1. */
START_TEST(swiglu_oai_clamps)
{
    const float g[] = {0.5f, -3.0f, 10.0f, -10.0f, 7.0f}, u[] = {0.25f, 2.0f, -10.0f, 9.0f, 0.0f};
    float out[5];
    ops_swiglu_oai(out, g, u, 5, 1.702f, 7.0f);
    for (int i = 0; i < 5; i++) {
        const double gc = g[i] < 7 ? g[i] : 7, uc = u[i] > 7 ? 7 : u[i] < -7 ? -7 : u[i];
        const double want = gc / (1 + exp(-1.702 * gc)) * (uc + 1);
        ck_assert_msg(fabs(out[i] - want) <= 1e-6 * (1 + fabs(want)), "%d: %g vs %g", i, out[i],
                      want);
    }
    float in_place[2] = {10.0f, 1.0f}, up[2] = {100.0f, 1.0f};
    ops_swiglu_oai(in_place, in_place, up, 2, 1.702f, 7.0f);
    ck_assert_float_eq(in_place[0], out[4] * 8.0f); /* (7, 7): the (7, 0) case times 8 */
}
END_TEST

/* YaRN: factor 1 is plain RoPE bit for bit; with a factor the low pairs (fast rotations) keep their
 * angle, the high pairs (slow ones) are interpolated by 1/factor, the ramp between; cos and sin
 * carry 1 + 0.1 ln(factor). Checked against the formulas in double. */
START_TEST(rope_yarn_ramps_and_scales)
{
    const uint32_t hd = 64, nr = 64;
    float x[64], y[64], z[64];
    for (uint32_t i = 0; i < hd; i++) x[i] = frand();
    struct ops_yarn none, yn;
    ops_yarn_init(&none, nr, 4096, 150000.0f, 1.0f);
    memcpy(y, x, sizeof x);
    memcpy(z, x, sizeof x);
    ops_rope(y, 1, hd, nr, 1234, 150000.0f, true);
    ops_rope_yarn(z, 1, hd, nr, 1234, 150000.0f, true, &none);
    ck_assert_mem_eq(y, z, sizeof y);
    ops_yarn_init(&yn, nr, 4096, 150000.0f, 32.0f);
    /* llama.cpp's corr dims for gpt-oss (n_rot 64, base 150000, 4096 positions): 8.09 -> 8,
     * 17.4 -> 18 */
    ck_assert_float_eq(yn.corr[0], 8.0f);
    ck_assert_float_eq(yn.corr[1], 18.0f);
    ck_assert_float_eq_tol(yn.mscale, 1.0 + 0.1 * log(32.0), 1e-6);
    const uint32_t pos = 3000;
    memcpy(z, x, sizeof x);
    ops_rope_yarn(z, 1, hd, nr, pos, 150000.0f, true, &yn);
    for (uint32_t i = 0; i < nr / 2; i++) {
        const double te = pos * pow(150000.0, -2.0 * i / nr);
        const double r = (i - 8.0) / 10.0, ramp = 1 - (r < 0 ? 0 : r > 1 ? 1 : r);
        const double a = te / 32 * (1 - ramp) + te * ramp, ms = 1 + 0.1 * log(32.0);
        const double w0 = x[i] * cos(a) * ms - x[i + 32] * sin(a) * ms;
        const double w1 = x[i] * sin(a) * ms + x[i + 32] * cos(a) * ms;
        /* float angles: pos * theta^(-2i/n) built by products carries a few ulps of 3000 */
        ck_assert_msg(fabs(z[i] - w0) < 2e-3 && fabs(z[i + 32] - w1) < 2e-3,
                      "pair %u: %g %g vs %g %g", i, z[i], z[i + 32], w0, w1);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("ops");
    tcase_add_test(tc, rmsnorm_matches_the_formula);
    tcase_add_test(tc, rope_rotates_the_right_pairs);
    tcase_add_test(tc, softmax_topk_silu);
    tcase_add_test(tc, argmax_is_the_scans_pick);
    tcase_add_test(tc, matmul_is_one_row_dot_per_element);
    tcase_add_test(tc, attention_is_softmax_in_fixed_blocks);
    tcase_add_test(tc, attention_window_and_sink_match_the_softmax);
    tcase_add_test(tc, swiglu_oai_clamps);
    tcase_add_test(tc, rope_yarn_ramps_and_scales);
    suite_add_tcase(s, tc);
    return test_run(s);
}
