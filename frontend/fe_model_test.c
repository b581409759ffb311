/* fe_model_test — what the frontend takes from a model's metadata beyond the tokenizer: its name
 * (general.name unless a converter's placeholder, else the worker's runtime directory) and its own
 * stop strings (strata.stop). The metadata is edited as a user would, with
 * `strata quantize IN OUT copy --override-kv`. */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "frontend/fe_model.h"
#include "tests/testutil.h"
#include "tools/fixture.h"
#include "tools/quantize.h"

#include <stdio.h>
#include <string.h>

/* edited writes the tiny fixture with the overrides ("KEY=TYPE:VALUE") and opens it. */
static struct gguf_file *edited(const char *const *kv, int n)
{
    static int k;
    char src[600], dst[600];
    snprintf(src, sizeof src, "%s/src.gguf", test_tmpdir());
    snprintf(dst, sizeof dst, "%s/edited-%d.gguf", test_tmpdir(), k++);
    struct fixture_opts fo = {.threads = 1};
    if (k == 1) ck_assert_int_eq(fixture_write(&fo, src), 0); /* once per test process */
    struct quantize_opts qo = {.copy = true, .threads = 1, .n_kv = n};
    static char text[QUANTIZE_MAX_KV][256];
    for (int i = 0; i < n; i++) {
        snprintf(text[i], sizeof text[i], "%s", kv[i]);
        ck_assert_int_eq(quantize_kv_parse(text[i], &qo.kv[i]), 0);
    }
    ck_assert_msg(quantize_file(src, dst, &qo, NULL) == 0, "%s", strata_errdetail());
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open(dst, &f), 0);
    return f;
}

START_TEST(name_is_general_name_else_the_runtime_directory)
{
    char buf[128];
    const char *url = "ipc:///run/user/1000/strata/demo/worker-0.sock";
    struct gguf_file *f = edited((const char *[]){"general.name=str:  Qwen3 30B A3B "}, 1);
    fe_model_name(f, url, buf, sizeof buf);
    ck_assert_str_eq(buf, "Qwen3 30B A3B");
    gguf_close(f);
    f = edited((const char *[]){"general.name=str:converted by strata"}, 1);
    fe_model_name(f, url, buf, sizeof buf);
    ck_assert_str_eq(buf, "demo");
    fe_model_name(f, "ipc://worker.sock", buf, sizeof buf); /* no directory to name it */
    ck_assert_str_eq(buf, "strata");
    fe_model_name(f, "tcp://127.0.0.1:5555", buf, sizeof buf);
    ck_assert_str_eq(buf, "strata");
    fe_model_name(f, NULL, buf, sizeof buf);
    ck_assert_str_eq(buf, "strata");
    struct fe_model m;
    ck_assert_int_eq(fe_model_init(&m, f, 256, NULL, url), 0);
    ck_assert_str_eq(m.name, "demo");
    fe_model_fini(&m);
    gguf_close(f);
}
END_TEST

START_TEST(stop_strings_come_from_strata_stop)
{
    struct fe_model m;
    struct gguf_file *f = edited(NULL, 0);
    ck_assert_int_eq(fe_model_init(&m, f, 256, NULL, NULL), 0);
    ck_assert_uint_eq(m.n_stop_strs, 0);
    fe_model_fini(&m);
    gguf_close(f);

    f = edited((const char *[]){"strata.stop=str:\n\n"}, 1);
    ck_assert_int_eq(fe_model_init(&m, f, 256, NULL, NULL), 0);
    ck_assert_uint_eq(m.n_stop_strs, 1);
    ck_assert_str_eq(m.stop_strs[0], "\n\n");
    fe_model_fini(&m);
    gguf_close(f);

    f = edited((const char *[]){"strata.stop=int:3"}, 1);
    ck_assert_int_eq(fe_model_init(&m, f, 256, NULL, NULL), STRATA_EINVAL);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "strata.stop must be a string"));
    ck_assert_ptr_null(m.tok); /* nothing held after a failure */
    gguf_close(f);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fe_model");
    TCase *tc = tcase_create("metadata");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, name_is_general_name_else_the_runtime_directory);
    tcase_add_test(tc, stop_strings_come_from_strata_stop);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(suite());
}
