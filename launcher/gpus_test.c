/* gpus_test — which GPUs `strata serve` uses (gpus_plan) for every kind of --gpus / --cpu against
 * machines with and without GPUs and builds with and without CUDA, and the refusal as a person
 * sees it from the strata binary of this build. */
#include "launcher/gpus.h"

#include "common/base/err.h"
#include "tests/testutil.h"

#include <stdio.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>

static int plan(const char *list, bool cpu, bool cuda, int n_gpus, int *gpus, int *n)
{
    for (int i = 0; i < GPUS_MAX; i++)
        gpus[i] = -1;
    return gpus_plan(list, cpu, cuda, n_gpus, gpus, n);
}

START_TEST(defaults_and_lists)
{
    int g[GPUS_MAX], n;
    /* by default: every GPU when the build has CUDA and the machine GPUs, else the CPU */
    ck_assert_int_eq(plan(NULL, false, true, 2, g, &n), 0);
    ck_assert_int_eq(n, 2);
    ck_assert(g[0] == 0 && g[1] == 1);
    ck_assert_int_eq(plan(NULL, false, true, 0, g, &n), 0);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(plan(NULL, false, false, 4, g, &n), 0);
    ck_assert_int_eq(n, 0);
    /* --cpu wins over GPUs present */
    ck_assert_int_eq(plan(NULL, true, true, 4, g, &n), 0);
    ck_assert_int_eq(n, 0);
    /* a list, in its order */
    ck_assert_int_eq(plan("3,1", false, true, 4, g, &n), 0);
    ck_assert_int_eq(n, 2);
    ck_assert(g[0] == 3 && g[1] == 1);
    ck_assert_int_eq(plan("all", false, true, 3, g, &n), 0);
    ck_assert_int_eq(n, 3);
}
END_TEST

START_TEST(refusals)
{
    int g[GPUS_MAX], n;
    static const struct {
        const char *list;
        bool cpu, cuda;
        int n_gpus;
        const char *says;
    } bad[] = {
        {"0", true, true, 2, "--cpu and --gpus 0"},
        {"0,1", false, false, 2, "built without CUDA"},
        {"0,2", false, true, 2, "there is no GPU 2: the NVIDIA driver lists 2"},
        {"0", false, true, 0, "lists no GPU"},
        {"all", false, true, 0, "lists no GPU"},
        {"all", false, false, 1, "built without CUDA"},
        {"1,1", false, true, 2, "GPU 1 is named twice"},
        {"0,", false, true, 2, "trailing comma"},
        {"x", false, true, 2, "expected GPU indices"},
        {"-1", false, true, 2, "expected GPU indices"},
        {"0;1", false, true, 2, "expected GPU indices"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rv = plan(bad[i].list, bad[i].cpu, bad[i].cuda, bad[i].n_gpus, g, &n);
        ck_assert_msg(rv == STRATA_EINVAL, "--gpus %s: %d", bad[i].list, rv);
        ck_assert_msg(strstr(strata_errdetail(), bad[i].says), "--gpus %s: '%s' lacks '%s'",
                      bad[i].list, strata_errdetail(), bad[i].says);
    }
}
END_TEST

/* the refusal from the binary: this build has no CUDA (or the machine no such GPU), and serve
 * says so before starting anything */
START_TEST(serve_refuses)
{
    const char *b = getenv("STRATA_BUILD_DIR");
    char cmd[2048], log[600];
    snprintf(log, sizeof log, "%s/serve.log", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s/strata serve --gpus 0,7 --runtime-dir %s/rt >%s 2>&1",
             b ? b : ".", test_tmpdir(), log);
    int st = system(cmd);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %#x", st);
    size_t len;
    char *out = test_read_file(log, &len);
    ck_assert_ptr_nonnull(out);
    ck_assert_msg(strstr(out, gpus_have_cuda() ? "there is no GPU" : "built without CUDA") ||
                      (gpus_have_cuda() && strstr(out, "lists no GPU")),
                  "%s", out);
    printf("strata serve --gpus 0,7 says: %s", out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gpus");
    TCase *tc = tcase_create("plan");
    tcase_add_test(tc, defaults_and_lists);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, serve_refuses);
    suite_add_tcase(s, tc);
    return test_run(s);
}
