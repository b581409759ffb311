/* cmd_bench_grammar_test — `strata bench-grammar` run in the test process: its usage errors (exit
 * 2, naming the option), a schema it cannot read or compile (exit 1, with why), a run over a
 * synthetic vocabulary and one over a fixture model (its vocabulary, and the decode step beside),
 * each printing its figures. */
#include "common/base/err.h"
#include "launcher/cmd.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const struct strata_cmd strata_cmd_bench_grammar;

/* bench runs the command with args (NULL-terminated), stdout and stderr to a file; returns its
 * exit status and what it printed in *out (malloc'd). */
static int bench(const char *const *args, char **out)
{
    const char *argv[32] = {"bench-grammar"};
    int argc = 1;
    while (args[argc - 1])
        argv[argc] = args[argc - 1], argc++;
    char path[600];
    snprintf(path, sizeof path, "%s/out-%d.txt", test_tmpdir(), (int)getpid());
    fflush(stdout);
    fflush(stderr);
    ck_assert_ptr_nonnull(freopen(path, "w", stdout));
    ck_assert_int_eq(dup2(fileno(stdout), fileno(stderr)), fileno(stderr));
    int rc = strata_cmd_bench_grammar.run(argc, (char **)argv);
    fflush(stdout);
    fflush(stderr);
    *out = test_read_file(path, NULL);
    ck_assert_ptr_nonnull(*out);
    return rc;
}

static void expect(const char *const *args, int rc, const char *want)
{
    char *s;
    int got = bench(args, &s);
    ck_assert_msg(got == rc, "%s: exit %d, want %d:\n%s", args[0] ? args[0] : "", got, rc, s);
    ck_assert_msg(strstr(s, want), "%s: want '%s' in:\n%s", args[0] ? args[0] : "", want, s);
    free(s);
}

START_TEST(usage_errors)
{
    expect((const char *[]){"--help", NULL}, 0, "usage: strata bench-grammar");
    expect((const char *[]){"--frobnicate", NULL}, 2, "unknown argument '--frobnicate'");
    expect((const char *[]){"--requests", "0", NULL}, 2, "--requests");
    expect((const char *[]){"--tokens", "-3", NULL}, 2, "--tokens");
    expect((const char *[]){"--vocab", "255", NULL}, 2, "--vocab"); /* below the 256 bytes */
    expect((const char *[]){"--threads", "x", NULL}, 2, "--threads");
    expect((const char *[]){"a.gguf", "b.gguf", NULL}, 2, "unknown argument 'b.gguf'");
}
END_TEST

START_TEST(bad_schemas)
{
    char path[600];
    snprintf(path, sizeof path, "%s/s.json", test_tmpdir());
    expect((const char *[]){"--schema", "/nonexistent/s.json", NULL}, 1, "/nonexistent/s.json");
    FILE *f = fopen(path, "w");
    fputs("{\"type\": ", f);
    fclose(f);
    expect((const char *[]){"--schema", path, NULL}, 1, path);
    f = fopen(path, "w");
    fputs("{\"type\": \"string\", \"pattern\": \"^a\"}", f);
    fclose(f);
    expect((const char *[]){"--schema", path, NULL}, 1, "'pattern' is not supported");
    f = fopen(path, "w");
    fputs("{\"$ref\": \"#\"}", f);
    fclose(f);
    expect((const char *[]){"--schema", path, NULL}, 1, "refers back to itself");
    expect((const char *[]){"/nonexistent/m.gguf", "--requests", "1", NULL}, 1,
           "/nonexistent/m.gguf");
}
END_TEST

START_TEST(a_synthetic_run_prints_its_figures)
{
    char path[600];
    snprintf(path, sizeof path, "%s/s.json", test_tmpdir());
    FILE *f = fopen(path, "w");
    fputs("{\"type\": \"object\", \"properties\": {\"n\": {\"enum\": [\"é\", \"ß\"]}, \"k\": "
          "{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"maxItems\": 3}}, "
          "\"required\": [\"n\"]}",
          f);
    fclose(f);
    const char *const args[] = {"--schema", path,       "--vocab", "2000", "--requests",
                                "3",        "--tokens", "40",      NULL};
    char *s;
    ck_assert_int_eq(bench(args, &s), 0);
    ck_assert_msg(strstr(s, "vocabulary: 2000 tokens (synthetic"), "%s", s);
    ck_assert_msg(strstr(s, "mask + feed per token (CPU time): mean "), "%s", s);
    /* the built-in example without a model: no decode line */
    ck_assert_ptr_null(strstr(s, "decode step"));
    free(s);
    const char *const ex[] = {"--vocab", "300", "--requests", "1", "--tokens", "10", NULL};
    ck_assert_int_eq(bench(ex, &s), 0);
    ck_assert_msg(strstr(s, "(the built-in example)") && strstr(s, "of 1 answers"), "%s", s);
    free(s);
}
END_TEST

START_TEST(a_model_run_prints_its_decode_step)
{
    char model[600];
    snprintf(model, sizeof model, "%s/bg.gguf", test_tmpdir());
    struct fixture_opts fo = {.seed = 5};
    ck_assert_msg(fixture_write(&fo, model) == 0, "%s", strata_errdetail());
    const char *const args[] = {model, "--requests", "2", "--tokens", "20", "--threads", "1", NULL};
    char *s;
    ck_assert_int_eq(bench(args, &s), 0);
    /* the built-in vocabulary of 512 tokens, all with text */
    ck_assert_msg(strstr(s, "vocabulary: 512 tokens (the model's)"), "%s", s);
    ck_assert_msg(strstr(s, "decode step of ") && strstr(s, "the grammar adds"), "%s", s);
    free(s);
    unlink(model);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cmd_bench_grammar");
    TCase *tc = tcase_create("cmd_bench_grammar");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, usage_errors);
    tcase_add_test(tc, bad_schemas);
    tcase_add_test(tc, a_synthetic_run_prints_its_figures);
    tcase_add_test(tc, a_model_run_prints_its_decode_step);
    suite_add_tcase(s, tc);
    return test_run(s);
}
