/* quant_test — the quant formats: fp16/bf16 rounding, the golden vectors of ../shared/data/quant
 * (every dequantizer bit for bit, every quantizer byte for byte), round-trip error bounds on
 * generated rows of odd lengths and awkward contents, activation quantization, and errors. */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "common/quant/quant_blocks.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 64 /* bytes after every output buffer that must stay untouched */

/* CHECK is ck_assert_msg for loops of millions: Check reports every passing ck_assert to its parent
 * process (one write each), which made this test take seconds of system time. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

/* The computable types, in the order of the golden files' list. */
static const uint32_t types[] = {QT_F16,  QT_BF16, QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0,   QT_Q5_1,
                                 QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_NL, QT_IQ4_XS,
                                 QT_MXFP4};
#define NTYPES ((int)(sizeof types / sizeof types[0]))

static struct test_rng rng = {0x9E3779B97F4A7C15ull};

static void *guarded(size_t n)
{
    unsigned char *p = malloc(n + GUARD);
    ck_assert_ptr_nonnull(p);
    memset(p, 0xA5, n + GUARD);
    return p;
}

static void check_guard(const void *p, size_t n, const char *what)
{
    const unsigned char *g = (const unsigned char *)p + n;
    for (int i = 0; i < GUARD; i++)
        CHECK(g[i] == 0xA5, "%s wrote past its %zu bytes", what, n);
}

/* ---- fp16 / bf16 ----------------------------------------------------------------------------- */

START_TEST(test_f16_every_value_and_midpoint)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = quant_f16_to_f32((uint16_t)h);
        bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (nan) {
            CHECK(isnan(f) && isnan(quant_f16_to_f32(quant_f32_to_f16(f))), "f16 NaN %04x", h);
            continue;
        }
        CHECK(quant_f32_to_f16(f) == h, "f16 %04x -> %a -> %04x", h, f, quant_f32_to_f16(f));
    }
    /* between each pair of neighbours: the midpoint goes to the even one, a hair off it to the
     * nearer one (subnormals included) */
    for (uint32_t h = 0; h < 0x7bff; h++) {
        float a = quant_f16_to_f32((uint16_t)h), b = quant_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)(((double)a + b) / 2);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        CHECK(quant_f32_to_f16(mid) == even, "midpoint of %04x: %04x", h, quant_f32_to_f16(mid));
        CHECK(quant_f32_to_f16(nextafterf(mid, 0)) == h, "below the midpoint of %04x", h);
        CHECK(quant_f32_to_f16(nextafterf(mid, INFINITY)) == h + 1, "above the midpoint of %04x",
              h);
        CHECK(quant_f32_to_f16(-mid) == (even | 0x8000), "negative midpoint of %04x", h);
    }
    ck_assert_uint_eq(quant_f32_to_f16(65519.99f), 0x7bff);
    ck_assert_uint_eq(quant_f32_to_f16(65520.0f), 0x7c00);
    ck_assert_uint_eq(quant_f32_to_f16(1e30f), 0x7c00);
    ck_assert_uint_eq(quant_f32_to_f16(-INFINITY), 0xfc00);
    ck_assert_uint_eq(quant_f32_to_f16(1e-30f), 0);
}
END_TEST

/* The rows conversion (F16C where the CPU has it) gives each of the 65,536 halves the scalar's
 * bits, signaling NaNs too, at every offset of an 8-value group and with a tail. */
START_TEST(test_f16_rows_every_value)
{
    enum { N = 0x10000 + 11 };
    static uint16_t h[N];
    static float got[N];
    for (uint32_t i = 0; i < N; i++)
        h[i] = (uint16_t)(i * 7919u); /* 7919 is odd: the first 65,536 are every value once */
    for (uint32_t off = 0; off < 8; off += 3) {
        quant_f16_to_f32_rows(h + off, got, N - off);
        for (uint32_t i = 0; i < N - off; i++) {
            const float want = quant_f16_to_f32(h[off + i]);
            CHECK(memcmp(&got[i], &want, 4) == 0, "f16 %04x at %u: rows give another float",
                  h[off + i], i);
        }
    }
}
END_TEST

START_TEST(test_bf16_nearest_even)
{
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)(test_unif(&rng) * 4294967296.0);
        float f;
        memcpy(&f, &u, 4);
        uint16_t h = quant_f32_to_bf16(f);
        if (isnan(f)) {
            CHECK(isnan(quant_bf16_to_f32(h)), "bf16 of a NaN: %04x", h);
            continue;
        }
        if (isinf(quant_bf16_to_f32(h)) && !isinf(f)) continue; /* rounded past the largest bf16 */
        /* h is the nearest of h-1, h, h+1 (same sign); on a tie its last bit is 0 */
        double e0 = fabs((double)f - quant_bf16_to_f32(h));
        for (int d = -1; d <= 1; d += 2) {
            uint16_t o = (uint16_t)(h + d);
            if ((o & 0x7f80) == 0x7f80 || (o & 0x8000) != (h & 0x8000)) continue;
            double e1 = fabs((double)f - quant_bf16_to_f32(o));
            CHECK(e0 < e1 || (e0 == e1 && !(h & 1)), "bf16 of %a: %04x", f, h);
        }
    }
    ck_assert_uint_eq(quant_f32_to_bf16(1.0f), 0x3f80);
    ck_assert(isnan(quant_bf16_to_f32(quant_f32_to_bf16(NAN))));
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------- */

START_TEST(test_unsupported_and_bad_lengths)
{
    static const uint32_t bad[] = {QT_Q8_1,  QT_Q8_K,  QT_IQ2_XXS, QT_IQ1_S, QT_I32,
                                   QT_TQ1_0, 4,        99};
    float f[256] = {0};
    unsigned char q[1024];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert(!quant_can_quantize(bad[i]));
        ck_assert_int_eq(quant_dequantize(bad[i], q, f, 256), STRATA_EUNSUPPORTED);
        ck_assert_msg(strstr(strata_errdetail(), qtype_name(bad[i])),
                      "detail '%s' does not name %s", strata_errdetail(), qtype_name(bad[i]));
        ck_assert_int_eq(quant_quantize(bad[i], f, q, 256), STRATA_EUNSUPPORTED);
        ck_assert_int_eq(quant_activations(bad[i], f, q, 256), STRATA_EUNSUPPORTED);
    }
    ck_assert(quant_can_quantize(QT_F32));
    for (int t = 0; t < NTYPES; t++)
        ck_assert(quant_can_quantize(types[t]));
    ck_assert_int_eq(quant_quantize(QT_Q4_0, f, q, 33), STRATA_EINVAL);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "33"));
    ck_assert_int_eq(quant_dequantize(QT_Q4_K, q, f, 128), STRATA_EINVAL);
    ck_assert_int_eq(quant_activations(QT_IQ4_XS, f, q, 32), STRATA_EINVAL);
}
END_TEST

/* ---- golden vectors -------------------------------------------------------------------------- */

/* golden_open opens golden-<type>.gguf (lower-case name) and finds a tensor; false when the shared
 * data is absent (the test then skips). */
static bool golden_open(const char *file, struct gguf_file **g)
{
    char rel[128];
    snprintf(rel, sizeof rel, "quant/%s", file);
    const char *path = test_data_path(rel);
    if (!path) return false;
    int rv = gguf_open(path, g);
    ck_assert_msg(rv == 0, "%s: %s: %s", path, strata_strerror(rv), strata_errdetail());
    return true;
}

static const struct gguf_tensor *golden_tensor(const struct gguf_file *g, const char *name,
                                               uint32_t type)
{
    const struct gguf_tensor *t = gguf_tensor_find(g, name);
    ck_assert_msg(t != NULL, "golden file has no tensor %s", name);
    ck_assert_uint_eq(t->type, type);
    ck_assert_uint_eq(t->ne[0] * t->ne[1], 65536);
    return t;
}

static void golden_file_name(uint32_t type, char *buf, size_t len)
{
    snprintf(buf, len, "golden-%s.gguf", qtype_name(type));
    for (char *c = buf; *c; c++)
        *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
}

START_TEST(test_golden_dequantize)
{
    const uint32_t type = types[_i];
    char file[64];
    golden_file_name(type, file, sizeof file);
    struct gguf_file *g = NULL;
    if (!golden_open(file, &g)) return;
    const struct gguf_tensor *q = golden_tensor(g, "quant", type);
    const struct gguf_tensor *dq = golden_tensor(g, "dequant", QT_F32);
    const int64_t n = 65536;
    float *out = guarded((size_t)n * 4);
    ck_assert_int_eq(quant_dequantize(type, q->data, out, n), 0);
    check_guard(out, (size_t)n * 4, "dequantize");
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&out[i], dq->data + 4 * i, 4)) {
            if (first < 0) first = i;
            bad++;
        }
    ck_assert_msg(bad == 0, "%s: %lld of %lld floats differ from the golden dequant, first at %lld",
                  qtype_name(type), (long long)bad, (long long)n, (long long)first);
    free(out);
    gguf_close(g);
}
END_TEST

START_TEST(test_golden_quantize)
{
    const uint32_t type = types[_i];
    char file[64];
    golden_file_name(type, file, sizeof file);
    struct gguf_file *g = NULL, *s = NULL;
    if (!golden_open(file, &g)) return;
    ck_assert(golden_open("golden-src.gguf", &s));
    const struct gguf_tensor *q = golden_tensor(g, "quant", type);
    const struct gguf_tensor *src = golden_tensor(s, "src", QT_F32);
    uint64_t bytes = 0;
    ck_assert_int_eq(qtype_row_bytes(type, 65536, &bytes), 0);
    ck_assert_uint_eq(bytes, q->nbytes);
    unsigned char *out = guarded(bytes);
    float *x = malloc(65536 * 4);
    memcpy(x, src->data, 65536 * 4); /* the mapping is only 32-byte aligned: take an aligned copy */
    /* row by row, as llama-quantize does (256 rows of 256) */
    uint64_t row_bytes = bytes / 256;
    for (int r = 0; r < 256; r++)
        ck_assert_int_eq(quant_quantize(type, x + 256 * r, out + row_bytes * r, 256), 0);
    check_guard(out, bytes, "quantize");
    uint64_t bad = 0, first = 0;
    for (uint64_t i = 0; i < bytes; i++)
        if (out[i] != q->data[i] && bad++ == 0) first = i;
    ck_assert_msg(bad == 0,
                  "%s: %llu of %llu bytes differ from ggml's, first at byte %llu (block %llu)",
                  qtype_name(type), (unsigned long long)bad, (unsigned long long)bytes,
                  (unsigned long long)first, (unsigned long long)(first / qtype_get(type)->bytes));
    free(x);
    free(out);
    gguf_close(g);
    gguf_close(s);
}
END_TEST

/* ---- round trips on generated rows ----------------------------------------------------------- */

/* The stated round-trip bound: |x_i - dequantize(quantize(x))_i| <= c * amax_B + tau, B the
 * element's block (32 elements; 256 for the K-quants and IQ4_XS). For the float and 32-element
 * formats c is analytic (level step / 2, or a full step where ggml clamps the top level, plus the
 * fp16 rounding of the scales); for the K and IQ formats, whose least-squares scale searches have
 * no closed-form worst case, c is the worst seen over many rows plus about 30%. tau = 2 * M *
 * 2^-25: a scale that falls into fp16's subnormal range (amax below ~1e-3) is rounded by up to
 * 2^-25, multiplied by the largest integer factor M a weight applies to it. rms: the largest
 * relative RMS error of gaussian rows. */
static const struct {
    uint32_t type;
    double c, M, rms;
} bounds[] = {
    {QT_F16, 0x1p-11, 0.5, 3e-4},
    {QT_BF16, 0x1p-8, 0, 2.5e-3},
    {QT_Q8_0, (1.0 / 254 + 0x1p-11) * (1 + 0x1p-14), 127, 8e-3},
    {QT_Q4_0, (1.0 / 8 + 0x1p-11) * (1 + 0x1p-14), 8, 0.13},
    {QT_Q4_1, (1.0 / 15 + 3 * 0x1p-11) * (1 + 0x1p-14), 16, 0.12},
    {QT_Q5_0, (1.0 / 16 + 0x1p-11) * (1 + 0x1p-14), 16, 0.065},
    {QT_Q5_1, (1.0 / 31 + 3 * 0x1p-11) * (1 + 0x1p-14), 32, 0.06},
    {QT_Q2_K, 0.45, 15 * 3 + 15, 0.4},
    {QT_Q3_K, 0.25, 32 * 4, 0.2},
    {QT_Q4_K, 0.12, 63 * 15 + 63, 0.1},
    {QT_Q5_K, 0.06, 63 * 31 + 63, 0.05},
    {QT_Q6_K, 0.025, 128 * 32, 0.025},
    {QT_IQ4_NL, 0.14, 127, 0.11},
    {QT_IQ4_XS, 0.13, 32 * 127, 0.1},
    {QT_MXFP4, 0.25, 0, 0.16},
};

enum rowkind { ROW_GAUSS, ROW_ZERO, ROW_HUGE, ROW_MIXED, ROW_TINY, ROW_OFFSET, ROW_KINDS };
static const char *const rowkind_name[] = {"gauss", "zeros", "one huge", "mixed magnitudes",
                                           "tiny",  "offset"};

static void fill_row(enum rowkind k, float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = test_gauss(&rng);
        switch (k) {
        case ROW_GAUSS:
            x[i] = g;
            break;
        case ROW_ZERO:
            x[i] = 0;
            break;
        case ROW_HUGE:
            x[i] = g;
            break;
        case ROW_MIXED:
            x[i] = i % 5 ? g * 3e3f : g * 1e-3f;
            break; /* within fp16's range */
        case ROW_TINY:
            x[i] = g * 1e-4f;
            break;
        default:
            x[i] = g + 4.0f;
            break; /* all positive: exercises the min of affine formats */
        }
    }
    if (k == ROW_HUGE) x[(int64_t)(test_unif(&rng) * (double)n)] = 2e4f;
}

START_TEST(test_roundtrip_bounds)
{
    const uint32_t type = bounds[_i].type;
    const struct qtype_info *ti = qtype_get(type);
    const int B = ti->blck == QK_K ? QK_K : QK_LEGACY;
    /* 32 * k for odd k, and 256 * {1, 3, 5} */
    static const int64_t legacy_lens[] = {32, 96, 160, 352, 1056, 2080};
    static const int64_t k_lens[] = {256, 768, 1280};
    const int64_t *lens = B == QK_K ? k_lens : legacy_lens;
    const int nlens = B == QK_K ? 3 : 6;
    const double tau = 2 * bounds[_i].M * 0x1p-25;
    double worst = 0, worst_rms = 0;
    for (int li = 0; li < nlens; li++) {
        const int64_t n = lens[li];
        uint64_t bytes = 0;
        ck_assert_int_eq(qtype_row_bytes(type, (uint64_t)n, &bytes), 0);
        float *x = malloc((size_t)n * 4), *y = guarded((size_t)n * 4);
        void *q = guarded(bytes);
        for (int rep = 0; rep < 4; rep++) {
            for (int k = 0; k < ROW_KINDS; k++) {
                fill_row((enum rowkind)k, x, n);
                ck_assert_int_eq(quant_quantize(type, x, q, n), 0);
                ck_assert_int_eq(quant_dequantize(type, q, y, n), 0);
                check_guard(q, bytes, "quantize");
                check_guard(y, (size_t)n * 4, "dequantize");
                double se = 0, sx = 0;
                for (int64_t b = 0; b < n; b += B) {
                    double amax = 0;
                    for (int64_t i = b; i < b + B; i++)
                        amax = fmax(amax, fabs(x[i]));
                    for (int64_t i = b; i < b + B; i++) {
                        double e = fabs((double)y[i] - x[i]);
                        CHECK(isfinite(y[i]) && e <= bounds[_i].c * amax + tau,
                              "%s, %s row of %lld, element %lld: %g -> %g, error %g > %g * %g + %g",
                              ti->name, rowkind_name[k], (long long)n, (long long)i, x[i], y[i], e,
                              bounds[_i].c, amax, tau);
                        if (amax > 0) worst = fmax(worst, (e - tau) / amax);
                        se += e * e;
                        sx += (double)x[i] * x[i];
                    }
                }
                if (k == ROW_ZERO)
                    for (int64_t i = 0; i < n; i++)
                        CHECK(y[i] == 0, "%s: zero row gives %g", ti->name, y[i]);
                if (k == ROW_GAUSS) {
                    worst_rms = fmax(worst_rms, sqrt(se / sx));
                    ck_assert_msg(sqrt(se / sx) <= bounds[_i].rms, "%s: relative rms error %g > %g",
                                  ti->name, sqrt(se / sx), bounds[_i].rms);
                }
            }
        }
        free(x);
        free(y);
        free(q);
    }
    printf("%-7s round trip: worst error %.4f * block amax (bound %.4f), worst rms %.4f (bound "
           "%.4f)\n",
           ti->name, worst, bounds[_i].c, worst_rms, bounds[_i].rms);
}
END_TEST

/* ---- activations ----------------------------------------------------------------------------- */

START_TEST(test_activations)
{
    const int64_t n = 768;
    float x[768];
    for (int64_t i = 0; i < n; i++)
        x[i] = test_gauss(&rng) * (i % 100 == 7 ? 50 : 1);
    for (int i = 0; i < 64; i++)
        x[256 + i] = 0; /* a zero Q8_0 block */
    for (int t = 0; t < NTYPES + 1; t++) {
        const uint32_t w = t < NTYPES ? types[t] : QT_F32;
        const struct qtype_info *ti = qtype_get(w);
        const uint32_t at = quant_act_type(w);
        ck_assert_uint_eq(at, ti->blck == 1 ? QT_F32 : ti->blck == 32 ? QT_Q8_0 : QT_Q8_K);
        uint64_t want = 0;
        ck_assert_int_eq(qtype_row_bytes(at, (uint64_t)n, &want), 0);
        ck_assert_uint_eq(quant_act_bytes(w, n), want);
        unsigned char *a = guarded(want);
        ck_assert_int_eq(quant_activations(w, x, a, n), 0);
        check_guard(a, want, "quant_activations");
        if (at == QT_F32) {
            ck_assert_mem_eq(a, x, want);
        } else if (at == QT_Q8_0) {
            unsigned char *ref = guarded(want);
            ck_assert_int_eq(quant_quantize(QT_Q8_0, x, ref, n), 0);
            ck_assert_mem_eq(a, ref, want);
            free(ref);
        } else {
            const struct blk_q8_K *b = (const void *)a;
            for (int k = 0; k < n / QK_K; k++) {
                double amax = 0;
                for (int i = 0; i < QK_K; i++)
                    amax = fmax(amax, fabs(x[QK_K * k + i]));
                for (int s = 0; s < 16; s++) {
                    int sum = 0;
                    for (int i = 0; i < 16; i++)
                        sum += b[k].qs[16 * s + i];
                    CHECK(b[k].bsums[s] == sum, "q8_K bsums[%d] %d, sum %d", s, b[k].bsums[s], sum);
                }
                for (int i = 0; i < QK_K; i++) {
                    double e = fabs((double)b[k].d * b[k].qs[i] - x[QK_K * k + i]);
                    CHECK(e <= amax / 254 * (1 + 0x1p-14), "q8_K element %d: error %g, amax %g", i,
                          e, amax);
                }
            }
        }
        free(a);
    }
    /* an all-zero super-block: zero scale, levels and sums */
    float z[256] = {0};
    struct blk_q8_K k8;
    memset(&k8, 0x5A, sizeof k8);
    ck_assert_int_eq(quant_activations(QT_Q4_K, z, &k8, 256), 0);
    ck_assert(k8.d == 0 && k8.qs[17] == 0 && k8.bsums[15] == 0);
}
END_TEST

static Suite *quant_suite(void)
{
    Suite *s = suite_create("quant");
    TCase *tc = tcase_create("conversions");
    tcase_add_test(tc, test_f16_every_value_and_midpoint);
    tcase_add_test(tc, test_f16_rows_every_value);
    tcase_add_test(tc, test_bf16_nearest_even);
    tcase_add_test(tc, test_unsupported_and_bad_lengths);
    suite_add_tcase(s, tc);
    tc = tcase_create("golden");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_golden_dequantize, 0, NTYPES);
    tcase_add_loop_test(tc, test_golden_quantize, 0, NTYPES);
    suite_add_tcase(s, tc);
    tc = tcase_create("generated");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_roundtrip_bounds, 0, (int)(sizeof bounds / sizeof bounds[0]));
    tcase_add_test(tc, test_activations);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(quant_suite());
}
