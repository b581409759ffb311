#include "gpu-worker/backend.h"
#include "common/base/err.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The CUDA backend's host-side pieces, on any machine: its options (--backend cuda picks f16 KV
 * unless --kv-type was given, --vram-reserve-mib), and how a machine without a GPU, or a build
 * without CUDA, answers for it. The GPU half is backend_cuda_gputest.c. */

static bool cuda_registered(void)
{
    for (const char *const *b = backend_names(); *b; b++)
        if (strcmp(*b, "cuda") == 0) return true;
    return false;
}

START_TEST(options_pick_the_gpu_defaults)
{
    struct backend_opts o = backend_opts_default();
    if (!cuda_registered()) {
        ck_assert_int_eq(backend_opt(&o, "backend", "cuda"), STRATA_EINVAL);
        ck_assert_ptr_nonnull(strstr(strata_errdetail(), "this build has cpu"));
        return;
    }
    ck_assert_int_eq(backend_opt(&o, "backend", "cuda"), 0);
    ck_assert_int_eq(o.kv_type, KV_F16);
    struct backend_opts f = backend_opts_default();
    ck_assert_int_eq(backend_opt(&f, "kv-type", "f32"), 0);
    ck_assert_int_eq(backend_opt(&f, "backend", "cuda"), 0);
    ck_assert_int_eq(f.kv_type, KV_F32);
    struct backend_opts c = backend_opts_default();
    ck_assert_int_eq(backend_opt(&c, "backend", "cpu"), 0);
    ck_assert_int_eq(c.kv_type, KV_F32); /* the CPU keeps its default */
}
END_TEST

START_TEST(vram_reserve_is_parsed)
{
    struct backend_opts o = backend_opts_default();
    ck_assert_uint_eq(o.vram_reserve_mib, 0); /* 0: the backend's 700 */
    ck_assert_int_eq(backend_opt(&o, "vram-reserve-mib", "2048"), 0);
    ck_assert_uint_eq(o.vram_reserve_mib, 2048);
    const char *bad[] = {"", "0", "-5", "12GiB", "2000000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(backend_opt(&o, "vram-reserve-mib", bad[i]), STRATA_EINVAL);
        ck_assert_ptr_nonnull(strstr(strata_errdetail(), "--vram-reserve-mib"));
    }
    ck_assert_uint_eq(o.vram_reserve_mib, 2048);
}
END_TEST

/* --gpu (the device) and --vram-mib (the budget K/V and slots share): whole numbers, named when
 * refused; the usage text every command prints lists them */
START_TEST(gpu_and_vram_budget_are_parsed)
{
    struct backend_opts o = backend_opts_default();
    ck_assert_uint_eq(o.gpu, 0);
    ck_assert_uint_eq(o.vram_mib, 0); /* 0: all that is free */
    ck_assert_int_eq(backend_opt(&o, "gpu", "3"), 0);
    ck_assert_int_eq(backend_opt(&o, "vram-mib", "65536"), 0);
    ck_assert_uint_eq(o.gpu, 3);
    ck_assert_uint_eq(o.vram_mib, 65536);
    const char *bad[] = {"", "-1", "x", "2.5", "5000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(backend_opt(&o, "gpu", bad[i]), STRATA_EINVAL);
        ck_assert_ptr_nonnull(strstr(strata_errdetail(), "--gpu"));
    }
    ck_assert_int_eq(backend_opt(&o, "vram-mib", "lots"), STRATA_EINVAL);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "--vram-mib"));
    ck_assert_uint_eq(o.gpu, 3);
    ck_assert_uint_eq(o.vram_mib, 65536);
    ck_assert_ptr_nonnull(strstr(BACKEND_OPTS_USAGE, "--gpu N"));
    ck_assert_ptr_nonnull(strstr(BACKEND_OPTS_USAGE, "--vram-mib N"));
}
END_TEST

/* Without a GPU (CI), asking for the CUDA backend is refused by name with what to do instead. */
START_TEST(no_gpu_is_refused_by_name)
{
    if (cuda_registered() && backend_available("cuda")) return; /* the GPU test covers it */
    char path[600];
    snprintf(path, sizeof path, "%s/qwen3moe.gguf", test_tmpdir());
    struct fixture_opts fo = {.arch = "qwen3moe", .seed = 1};
    ck_assert_msg(fixture_write(&fo, path) == 0, "%s", strata_errdetail());
    struct gguf_file *f;
    struct model *m;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_int_eq(model_load(f, &m), 0);
    struct backend_opts o = backend_opts_default();
    o.name = "cuda";
    o.max_pass_tokens = 4;
    o.n_ctx = 64;
    struct backend *b;
    const int rv = backend_start(m, &o, &b);
    if (cuda_registered()) {
        ck_assert_int_eq(rv, STRATA_EUNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(strata_errdetail(), "use --backend cpu"));
    } else {
        ck_assert_int_eq(rv, STRATA_ENOENT);
        ck_assert_ptr_nonnull(strstr(strata_errdetail(), "no backend 'cuda'"));
    }
    model_fini(m);
    gguf_close(f);
    unlink(path);
}
END_TEST

/* gpt-oss's attention sinks, sliding windows and biases have no CUDA kernels yet: a GPU refuses
 * the model by name instead of running it without them. */
START_TEST(gpt_oss_is_refused_by_name)
{
    if (!cuda_registered() || !backend_available("cuda")) {
        printf("SKIP gpt-oss refusal: no CUDA device\n");
        return;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/gpt-oss.gguf", test_tmpdir());
    struct fixture_opts fo = {.arch = "gpt-oss", .type = "q8_0", .seed = 1};
    ck_assert_msg(fixture_write(&fo, path) == 0, "%s", strata_errdetail());
    struct gguf_file *f;
    struct model *m;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_int_eq(model_load(f, &m), 0);
    struct backend_opts o = backend_opts_default();
    o.name = "cuda";
    o.max_pass_tokens = 4;
    o.n_ctx = 64;
    struct backend *b;
    ck_assert_int_eq(backend_start(m, &o, &b), STRATA_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "attention sinks"));
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "use --backend cpu"));
    model_fini(m);
    gguf_close(f);
    unlink(path);
}
END_TEST

/* glm4moe and deepseek2 likewise: refused by name on a GPU. */
START_TEST(glm4moe_and_deepseek2_are_refused_by_name)
{
    static const char *const archs[] = {"glm4moe", "deepseek2"};
    if (!cuda_registered() || !backend_available("cuda")) {
        printf("SKIP glm4moe and deepseek2 refusal: no CUDA device\n");
        return;
    }
    for (int i = 0; i < 2; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s.gguf", test_tmpdir(), archs[i]);
        struct fixture_opts fo = {.arch = archs[i], .type = "q8_0", .seed = 1};
        ck_assert_msg(fixture_write(&fo, path) == 0, "%s", strata_errdetail());
        struct gguf_file *f;
        struct model *m;
        ck_assert_int_eq(gguf_open(path, &f), 0);
        ck_assert_int_eq(model_load(f, &m), 0);
        struct backend_opts o = backend_opts_default();
        o.name = "cuda";
        o.max_pass_tokens = 4;
        o.n_ctx = 64;
        struct backend *b;
        ck_assert_int_eq(backend_start(m, &o, &b), STRATA_EUNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(strata_errdetail(), archs[i]));
        ck_assert_ptr_nonnull(strstr(strata_errdetail(), "use --backend cpu"));
        model_fini(m);
        gguf_close(f);
        unlink(path);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("backend_cuda");
    TCase *tc = tcase_create("host");
    tcase_add_test(tc, options_pick_the_gpu_defaults);
    tcase_add_test(tc, vram_reserve_is_parsed);
    tcase_add_test(tc, gpu_and_vram_budget_are_parsed);
    tcase_add_test(tc, no_gpu_is_refused_by_name);
    tcase_add_test(tc, gpt_oss_is_refused_by_name);
    tcase_add_test(tc, glm4moe_and_deepseek2_are_refused_by_name);
    suite_add_tcase(s, tc);
    return test_run(s);
}
