/* quantize_test — `strata quantize` on a small GGUF written here: output types per rule, metadata
 * copied, bytes equal to quantizing the rows directly (whatever the thread count), dequantized
 * output close to the input, --pure, and the errors. */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "launcher/cmd.h"
#include "tests/testutil.h"
#include "tools/fixture.h"
#include "tools/quantize.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const struct strata_cmd strata_cmd_quantize;

struct spec {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
    uint32_t want, want_pure; /* output type without and with --pure (for Q4_K) */
};

/* Every rule of quantize_choose, for target Q4_K. */
static const struct spec specs[] = {
    {"token_embd.weight", QT_F32, 2, {512, 6, 1, 1}, QT_Q4_K, QT_Q4_K},
    {"blk.0.attn_norm.weight", QT_F16, 1, {512, 1, 1, 1}, QT_F32, QT_F16},
    {"blk.0.attn_k.bias", QT_F32, 1, {256, 1, 1, 1}, QT_F32, QT_F32},
    {"blk.0.attn_q.weight", QT_F32, 2, {100, 3, 1, 1}, QT_F16, QT_F16}, /* 100: not a multiple of 32
                                                                         */
    {"blk.0.attn_k.weight", QT_Q8_0, 2, {256, 4, 1, 1}, QT_Q4_K, QT_Q4_K},    /* requantized */
    {"blk.0.ffn_gate_inp.weight", QT_F32, 2, {512, 4, 1, 1}, QT_F32, QT_F32}, /* router */
    {"blk.1.ffn_gate_inp.weight", QT_F16, 2, {512, 4, 1, 1}, QT_F32, QT_F16}, /* kept by --pure */
    {"blk.0.ffn_up_exps.weight", QT_BF16, 3, {512, 5, 4, 1}, QT_Q4_K, QT_Q4_K},
    {"blk.0.ffn_down_exps.weight", QT_F16, 3, {288, 3, 4, 1}, QT_Q5_0, QT_Q5_0}, /* 288 = 9 * 32 */
    {"blk.0.ssm_norm.weight", QT_F32, 2, {256, 2, 1, 1}, QT_F32, QT_Q4_K},       /* a 2-D norm */
    {"blk.0.pos_table", QT_F32, 2, {64, 2, 1, 1}, QT_F32, QT_F32},               /* not *.weight */
    {"output.weight", QT_Q4_K, 2, {256, 3, 1, 1}, QT_Q4_K, QT_Q4_K},             /* already Q4_K */
};
#define NSPECS ((int)(sizeof specs / sizeof specs[0]))

static struct test_rng rng = {0x243F6A8885A308D3ull};

static uint64_t nel(const struct spec *s)
{
    return s->ne[0] * s->ne[1] * s->ne[2] * s->ne[3];
}

/* make_input writes the test model to path; src[i] gets each tensor's values as F32 (what its
 * stored bytes dequantize to). */
static void make_input(const char *path, float **src)
{
    struct gguf_writer *w = NULL;
    ck_assert_int_eq(gguf_writer_open(path, 0, &w), 0);
    ck_assert_int_eq(gguf_w_str(w, "general.architecture", "testarch"), 0);
    ck_assert_int_eq(gguf_w_u32(w, "general.file_type", 0), 0);
    ck_assert_int_eq(gguf_w_u32(w, "testarch.block_count", 1), 0);
    const char *toks[] = {"a", "bc", "<s>"};
    ck_assert_int_eq(gguf_w_arr_str(w, "tokenizer.ggml.tokens", 3, toks, NULL), 0);
    const float scores[] = {0.5f, -1.25f, 3.0f};
    ck_assert_int_eq(gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, 3, scores), 0);
    for (int i = 0; i < NSPECS; i++)
        ck_assert_int_eq(
            gguf_w_tensor(w, specs[i].name, specs[i].type, specs[i].n_dims, specs[i].ne), 0);
    ck_assert_int_eq(gguf_writer_begin(w), 0);
    for (int i = 0; i < NSPECS; i++) {
        uint64_t n = nel(&specs[i]), bytes = 0;
        float *x = malloc(n * 4);
        for (uint64_t j = 0; j < n; j++)
            x[j] = test_gauss(&rng) * (j % 37 == 3 ? 4.0f : 0.5f) + (i == 7 ? 0.3f : 0);
        ck_assert_int_eq(qtype_row_bytes(specs[i].type, n, &bytes), 0);
        void *q = malloc(bytes);
        /* whole tensors quantize as their rows do: every row length here is a multiple of the block
         */
        ck_assert_int_eq(quant_quantize(specs[i].type, x, q, (int64_t)n), 0);
        ck_assert_int_eq(quant_dequantize(specs[i].type, q, x, (int64_t)n), 0);
        ck_assert_int_eq(gguf_writer_data(w, q, bytes), 0);
        free(q);
        src[i] = x;
    }
    ck_assert_int_eq(gguf_writer_finish(w), 0);
}

static void free_src(float **src)
{
    for (int i = 0; i < NSPECS; i++)
        free(src[i]);
}

/* check_output: every tensor has the wanted type, its bytes are the direct quantization of the
 * source rows, and it dequantizes close to the source. */
static void check_output(const char *path, float **src, bool pure)
{
    struct gguf_file *g = NULL;
    ck_assert_int_eq(gguf_open(path, &g), 0);
    ck_assert_uint_eq(g->n_tensors, NSPECS);
    for (int i = 0; i < NSPECS; i++) {
        const struct spec *s = &specs[i];
        const struct gguf_tensor *t = gguf_tensor_find(g, s->name);
        ck_assert_ptr_nonnull(t);
        uint32_t want = pure ? s->want_pure : s->want;
        ck_assert_msg(t->type == want, "%s: %s, want %s", s->name, qtype_name(t->type),
                      qtype_name(want));
        ck_assert_uint_eq(t->n_dims, s->n_dims);
        for (int d = 0; d < 4; d++)
            ck_assert_uint_eq(t->ne[d], s->ne[d]);
        uint64_t n = nel(s), bytes = 0;
        ck_assert_int_eq(qtype_row_bytes(want, n, &bytes), 0);
        ck_assert_uint_eq(t->nbytes, bytes);
        unsigned char *q = malloc(bytes);
        /* a tensor kept in its type is copied, so it dequantizes exactly (checked below) */
        if (want != s->type) {
            ck_assert_int_eq(quant_quantize(want, src[i], q, (int64_t)n), 0);
            ck_assert_msg(memcmp(q, t->data, bytes) == 0,
                          "%s: bytes differ from quantizing its rows", s->name);
        }
        float *y = malloc(n * 4);
        ck_assert_int_eq(quant_dequantize(want, t->data, y, (int64_t)n), 0);
        double se = 0, sx = 0;
        for (uint64_t j = 0; j < n; j++) {
            se += ((double)y[j] - src[i][j]) * ((double)y[j] - src[i][j]);
            sx += (double)src[i][j] * src[i][j];
        }
        /* Q4_K / Q5_0 of these rows (outliers every 37th element): 7-10%; float targets: exact or
         * fp16 */
        double lim = want == s->type   ? 0
                     : want == QT_Q4_K ? 0.12
                     : want == QT_Q5_0 ? 0.1
                     : want == QT_F16  ? 5e-4
                                       : 0;
        ck_assert_msg(sqrt(se / sx) <= lim, "%s as %s: relative rms error %g > %g", s->name,
                      qtype_name(want), sqrt(se / sx), lim);
        free(q);
        free(y);
    }
    struct gguf_str str;
    ck_assert_int_eq(gguf_get_str(g, "general.architecture", &str), 0);
    ck_assert(str.len == 8 && memcmp(str.ptr, "testarch", 8) == 0);
    uint32_t u = 0;
    ck_assert_int_eq(gguf_get_u32(g, "testarch.block_count", &u), 0);
    ck_assert_uint_eq(u, 1);
    ck_assert_int_eq(gguf_get_u32(g, "general.file_type", &u), 0);
    ck_assert_uint_eq(u, 15);
    ck_assert_int_eq(gguf_get_u32(g, "general.quantization_version", &u), 0);
    ck_assert_uint_eq(u, 2);
    const struct gguf_value *arr = NULL;
    ck_assert_int_eq(gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING, &arr), 0);
    ck_assert_uint_eq(arr->arr.n, 3);
    struct gguf_str s2 = gguf_arr_str(arr, 2);
    ck_assert(s2.len == 3 && memcmp(s2.ptr, "<s>", 3) == 0);
    ck_assert_int_eq(gguf_get_arr(g, "tokenizer.ggml.scores", GGUF_FLOAT32, &arr), 0);
    ck_assert(gguf_arr_f64(arr, 1) == -1.25);
    ck_assert_uint_eq(g->n_kv, 6);
    gguf_close(g);
}

static char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", test_tmpdir(), name);
    return p;
}

START_TEST(test_rules_bytes_and_metadata)
{
    float *src[NSPECS];
    const char *in = tmp_path("in.gguf"), *out = tmp_path("out.gguf");
    make_input(in, src);
    struct quantize_opts o = {.type = QT_Q4_K, .threads = 3, .report = stdout};
    struct quantize_totals tot;
    int rv = quantize_file(in, out, &o, &tot);
    ck_assert_msg(rv == 0, "%s: %s", strata_strerror(rv), strata_errdetail());
    ck_assert_uint_eq(tot.n_tensors, NSPECS);
    ck_assert_uint_eq(tot.n_converted, 7);
    ck_assert_uint_lt(tot.bytes_out, tot.bytes_in);
    check_output(out, src, false);

    /* one thread gives the same file */
    const char *out1 = tmp_path("out1.gguf");
    o.threads = 1;
    o.report = NULL;
    ck_assert_int_eq(quantize_file(in, out1, &o, NULL), 0);
    size_t n3 = 0, n1 = 0;
    char *a = test_read_file(out, &n3), *b = test_read_file(out1, &n1);
    ck_assert(a && b && n3 == n1 && memcmp(a, b, n1) == 0);
    free(a);
    free(b);

    o.pure = true;
    ck_assert_int_eq(quantize_file(in, out1, &o, NULL), 0);
    check_output(out1, src, true);
    free_src(src);
}
END_TEST

START_TEST(test_command_line)
{
    float *src[NSPECS];
    const char *in = tmp_path("cli-in.gguf"), *out = tmp_path("cli-out.gguf");
    make_input(in, src);
    char *ok[] = {"quantize", (char *)in, (char *)out, "Q4_K", "--threads", "2", NULL};
    ck_assert_int_eq(strata_cmd_quantize.run(6, ok), 0);
    check_output(out, src, false);
    char *help[] = {"quantize", "--help", NULL};
    ck_assert_int_eq(strata_cmd_quantize.run(2, help), 0);
    char *badtype[] = {"quantize", (char *)in, (char *)out, "iq2_xxs", NULL};
    ck_assert_int_eq(strata_cmd_quantize.run(4, badtype), 2);
    char *badthreads[] = {"quantize", (char *)in, (char *)out, "q8_0", "--threads", "0", NULL};
    ck_assert_int_eq(strata_cmd_quantize.run(6, badthreads), 2);
    char *missing[] = {"quantize", "/nonexistent/x.gguf", (char *)out, "q8_0", NULL};
    ck_assert_int_eq(strata_cmd_quantize.run(4, missing), 1);
    free_src(src);
}
END_TEST

/* --tensor-type: the first matching pattern wins over the rules, and the block fallback still
 * applies to the type it picks. */
START_TEST(test_tensor_type_overrides)
{
    struct quantize_opts o = {.type = QT_Q8_0, .n_overrides = 2};
    o.overrides[0] = (struct quantize_override){"_exps", QT_Q4_K};
    o.overrides[1] = (struct quantize_override){"ffn_gate_inp", QT_Q8_0};
    const char *why;
    struct gguf_tensor exps = {.name = "blk.0.ffn_up_exps.weight", .n_dims = 3,
                               .ne = {256, 64, 8, 1}, .type = QT_F32};
    ck_assert_uint_eq(quantize_choose(&exps, &o, &why), QT_Q4_K);
    ck_assert_str_eq(why, "--tensor-type");
    exps.ne[0] = 96; /* not a multiple of 256: q4_K falls back to q5_0 */
    ck_assert_uint_eq(quantize_choose(&exps, &o, &why), QT_Q5_0);
    struct gguf_tensor router = {.name = "blk.0.ffn_gate_inp.weight", .n_dims = 2,
                                 .ne = {256, 8, 1, 1}, .type = QT_F32};
    ck_assert_uint_eq(quantize_choose(&router, &o, &why), QT_Q8_0); /* overrides the router rule */
    struct gguf_tensor attn = {.name = "blk.0.attn_q.weight", .n_dims = 2, .ne = {256, 256, 1, 1},
                               .type = QT_F32};
    ck_assert_uint_eq(quantize_choose(&attn, &o, &why), QT_Q8_0);
}
END_TEST

/* MXFP4_MOE (llama-quantize's): stacked experts MXFP4, their biases kept, other matrices Q8_0,
 * routers and norms F32; the experts' bytes are quant_quantize(MXFP4)'s. */
START_TEST(test_mxfp4_moe)
{
    struct quantize_opts o = {.type = QT_Q8_0, .mxfp4_moe = true};
    const char *why;
    struct gguf_tensor exps = {.name = "blk.0.ffn_up_exps.weight", .n_dims = 3,
                               .ne = {2880, 64, 8, 1}, .type = QT_BF16};
    ck_assert_uint_eq(quantize_choose(&exps, &o, &why), QT_MXFP4);
    ck_assert_str_eq(why, "experts: mxfp4");
    struct gguf_tensor bias = {.name = "blk.0.ffn_up_exps.bias", .n_dims = 2,
                               .ne = {2880, 8, 1, 1}, .type = QT_F32};
    ck_assert_uint_eq(quantize_choose(&bias, &o, &why), QT_F32);
    struct gguf_tensor attn = {.name = "blk.0.attn_q.weight", .n_dims = 2, .ne = {2880, 64, 1, 1},
                               .type = QT_BF16};
    ck_assert_uint_eq(quantize_choose(&attn, &o, &why), QT_Q8_0);
    struct gguf_tensor router = {.name = "blk.0.ffn_gate_inp.weight", .n_dims = 2,
                                 .ne = {2880, 8, 1, 1}, .type = QT_BF16};
    ck_assert_uint_eq(quantize_choose(&router, &o, &why), QT_F32);
    ck_assert_uint_eq(quantize_ftype(QT_MXFP4), 38);
}
END_TEST

/* strata quantize mxfp4_moe of an F32 gpt-oss model gives, tensor for tensor, the bytes of the
 * same model generated as mxfp4_moe (the fixture quantizes its floats with quant_quantize): MXFP4
 * experts, Q8_0 matrices, F32 routers, norms, biases and sinks. */
START_TEST(mxfp4_moe_file_matches_the_fixture)
{
    char src[600], out[600], want[600];
    snprintf(src, sizeof src, "%s/oss-f32.gguf", test_tmpdir());
    snprintf(out, sizeof out, "%s/oss-q.gguf", test_tmpdir());
    snprintf(want, sizeof want, "%s/oss-mx.gguf", test_tmpdir());
    struct fixture_opts fo = {.arch = "gpt-oss", .type = "f32", .seed = 5};
    ck_assert_msg(fixture_write(&fo, src) == 0, "%s", strata_errdetail());
    fo.type = "mxfp4_moe";
    ck_assert_msg(fixture_write(&fo, want) == 0, "%s", strata_errdetail());
    struct quantize_opts o = {.type = QT_Q8_0, .mxfp4_moe = true, .threads = 2};
    ck_assert_msg(quantize_file(src, out, &o, NULL) == 0, "%s", strata_errdetail());
    struct gguf_file *a, *b;
    ck_assert_int_eq(gguf_open(out, &a), 0);
    ck_assert_int_eq(gguf_open(want, &b), 0);
    ck_assert_uint_eq(a->n_tensors, b->n_tensors);
    uint32_t n_mxfp4 = 0;
    for (uint64_t i = 0; i < b->n_tensors; i++) {
        const struct gguf_tensor *tb = &b->tensors[i], *ta = gguf_tensor_find(a, tb->name);
        ck_assert_ptr_nonnull(ta);
        ck_assert_msg(ta->type == tb->type, "%s: %s, want %s", tb->name, qtype_name(ta->type),
                      qtype_name(tb->type));
        ck_assert_uint_eq(ta->nbytes, tb->nbytes);
        ck_assert_msg(memcmp(ta->data, tb->data, tb->nbytes) == 0, "%s: bytes differ", tb->name);
        n_mxfp4 += tb->type == QT_MXFP4;
    }
    ck_assert_uint_eq(n_mxfp4, 3 * 2); /* gate, up, down of the tiny shape's 2 layers */
    uint32_t ftype = 0;
    ck_assert_int_eq(gguf_get_u32(a, "general.file_type", &ftype), 0);
    ck_assert_uint_eq(ftype, 38);
    gguf_close(a);
    gguf_close(b);
    unlink(src);
    unlink(out);
    unlink(want);
}
END_TEST

/* COPY with --override-kv: the tensors byte for byte, a key replaced, one added, the file type
 * kept; bad overrides are refused with the form to use. */
START_TEST(test_copy_edits_metadata_only)
{
    float *src[NSPECS];
    const char *in = tmp_path("kv-in.gguf"), *out = tmp_path("kv-out.gguf");
    make_input(in, src);
    char a[] = "general.architecture=str:otherarch", b[] = "strata.stop=str:\n\n",
         c[] = "testarch.block_count=int:3";
    char *argv[] = {"quantize", (char *)in,      (char *)out, "copy",          "--override-kv",
                    a,          "--override-kv", b,           "--override-kv", c,
                    NULL};
    ck_assert_int_eq(strata_cmd_quantize.run(10, argv), 0);
    struct gguf_file *f, *g;
    ck_assert_int_eq(gguf_open(in, &f), 0);
    ck_assert_int_eq(gguf_open(out, &g), 0);
    ck_assert_uint_eq(g->n_tensors, f->n_tensors);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i], *u = gguf_tensor_find(g, t->name);
        ck_assert_ptr_nonnull(u);
        ck_assert_uint_eq(u->type, t->type);
        ck_assert_uint_eq(u->nbytes, t->nbytes);
        ck_assert_mem_eq(u->data, t->data, t->nbytes);
    }
    struct gguf_str str;
    ck_assert_int_eq(gguf_get_str(g, "general.architecture", &str), 0);
    ck_assert(str.len == 9 && memcmp(str.ptr, "otherarch", 9) == 0);
    ck_assert_int_eq(gguf_get_str(g, "strata.stop", &str), 0);
    ck_assert(str.len == 2 && memcmp(str.ptr, "\n\n", 2) == 0);
    uint32_t u32;
    ck_assert_int_eq(gguf_get_u32(g, "testarch.block_count", &u32), 0);
    ck_assert_uint_eq(u32, 3);
    ck_assert_int_eq(gguf_get_u32(g, "general.file_type", &u32), 0);
    ck_assert_uint_eq(u32, 0); /* make_input's, not a quantized one's */
    gguf_close(f);
    gguf_close(g);
    static const char *const bad[] = {"nokey",     "=str:x",     "k=str",
                                      "k=int:1.5", "k=bool:yes", "k=list:a"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char buf[32];
        struct quantize_kv kv;
        snprintf(buf, sizeof buf, "%s", bad[i]);
        ck_assert_int_eq(quantize_kv_parse(buf, &kv), STRATA_EINVAL);
        ck_assert_msg(strstr(strata_errdetail(), "TYPE"), "%s: %s", bad[i], strata_errdetail());
    }
    free_src(src);
}
END_TEST

START_TEST(test_undequantizable_source)
{
    const char *in = tmp_path("iq2.gguf"), *out = tmp_path("iq2-out.gguf");
    struct gguf_writer *w = NULL;
    const uint64_t ne[2] = {256, 2};
    ck_assert_int_eq(gguf_writer_open(in, 0, &w), 0);
    ck_assert_int_eq(gguf_w_tensor(w, "blk.0.ffn_up.weight", QT_IQ2_XXS, 2, ne), 0);
    ck_assert_int_eq(gguf_writer_begin(w), 0);
    unsigned char zero[132] = {0};
    ck_assert_int_eq(gguf_writer_data(w, zero, sizeof zero), 0);
    ck_assert_int_eq(gguf_writer_finish(w), 0);
    struct quantize_opts o = {.type = QT_Q8_0, .threads = 1};
    ck_assert_int_eq(quantize_file(in, out, &o, NULL), STRATA_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "blk.0.ffn_up.weight"));
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "iq2_xxs"));
    FILE *f = fopen(out, "rb");
    ck_assert_ptr_null(f); /* nothing left behind */
    o.type = QT_Q8_K;
    ck_assert_int_eq(quantize_file(in, out, &o, NULL), STRATA_EUNSUPPORTED);
}
END_TEST

static Suite *quantize_suite(void)
{
    Suite *s = suite_create("quantize");
    TCase *tc = tcase_create("file");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_rules_bytes_and_metadata);
    tcase_add_test(tc, test_command_line);
    tcase_add_test(tc, test_undequantizable_source);
    tcase_add_test(tc, test_copy_edits_metadata_only);
    tcase_add_test(tc, test_tensor_type_overrides);
    tcase_add_test(tc, test_mxfp4_moe);
    tcase_add_test(tc, mxfp4_moe_file_matches_the_fixture);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(quantize_suite());
}
