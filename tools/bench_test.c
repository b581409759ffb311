/* bench_test — strata bench's measurements on a tiny fixture: positive speeds, a breakdown that
 * fits inside the total, the weight bytes decode streams, a read bandwidth; bad lengths refused;
 * the kernel and expert-step benchmarks; the command's table, JSON line, --rounds and --sweep. */
#include "common/arena/arena.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/arena/model.h"
#include "common/quant/qtype.h"
#include "kernels/cpu/cpu.h"
#include "launcher/cmd.h"
#include "tests/testutil.h"
#include "tools/bench.h"
#include "tools/fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

START_TEST(measures_a_tiny_model)
{
    char path[600];
    snprintf(path, sizeof path, "%s/bench.gguf", test_tmpdir());
    struct fixture_opts fo = {.seed = 5};
    ck_assert_msg(fixture_write(&fo, path) == 0, "%s", strata_errdetail());
    struct bench_opts o = {.model = path, .threads = 2, .prompt = 40, .gen = 6, .reps = 2};
    struct bench_result r;
    ck_assert_msg(bench_run(&o, &r) == 0, "%s", strata_errdetail());
    ck_assert_uint_eq(r.threads, 2);
    ck_assert(r.prefill_tok_s > 0 && r.decode_tok_s > 0);
    ck_assert(r.prefill_s > 0 && r.decode_s > 0);
    ck_assert_uint_eq(r.prefill.tokens, 40);
    ck_assert_uint_eq(r.prefill.passes, 1); /* the prompt in one chunk */
    ck_assert_uint_eq(r.decode.tokens, 6);
    ck_assert_uint_eq(r.decode.passes, 6);
    const struct backend_stats *s[] = {&r.prefill, &r.decode};
    for (int i = 0; i < 2; i++) {
        const double parts = s[i]->attention_s + s[i]->dense_s + s[i]->experts_s + s[i]->output_s;
        ck_assert(parts > 0 && parts <= s[i]->total_s * 1.0001);
        ck_assert_uint_gt(s[i]->weight_bytes, 0);
    }
    /* a decode step streams at least the output matrix */
    ck_assert_uint_ge(r.decode.weight_bytes / 6, 512ull * 256 * 210 / 256);
    ck_assert(r.read_gbs > 0.1 && r.decode_gbs > 0);
    ck_assert_uint_gt(r.file_bytes, 1u << 20);
    unlink(path);
}
END_TEST

START_TEST(refuses_bad_lengths)
{
    char path[600];
    snprintf(path, sizeof path, "%s/bench-bad.gguf", test_tmpdir());
    struct fixture_opts fo = {.seed = 5};
    ck_assert_int_eq(fixture_write(&fo, path), 0);
    struct bench_result r;
    struct bench_opts zero = {.model = path, .threads = 1, .prompt = 0, .gen = 4, .reps = 1};
    ck_assert_int_eq(bench_run(&zero, &r), STRATA_EINVAL);
    struct bench_opts long_ctx = {.model = path, .threads = 1, .prompt = 5000, .gen = 4, .reps = 1}; /* the tiny shape's context is 4096 */
    ck_assert_int_eq(bench_run(&long_ctx, &r), STRATA_EINVAL);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "context of 4096"));
    struct bench_opts missing = {.model = "/nonexistent/model.gguf", .threads = 1, .prompt = 4, .gen = 4, .reps = 1};
    ck_assert_int_ne(bench_run(&missing, &r), 0);
    unlink(path);
}
END_TEST

/* --decode-ids random: the decode steps' routed pairs are counted apart (gen steps, every layer's
 * top-k each), the same ids every rep; drafts need the greedy stream and are refused with it. */
START_TEST(decodes_random_ids)
{
    char path[600];
    snprintf(path, sizeof path, "%s/bench-random.gguf", test_tmpdir());
    struct fixture_opts fo = {.seed = 5};
    ck_assert_int_eq(fixture_write(&fo, path), 0);
    struct bench_opts o = {.model = path, .threads = 2, .prompt = 16, .gen = 5, .reps = 2,
                           .decode_random = true, .backend = backend_opts_default()};
    o.backend.expert_cache = (struct cache_spec){.kind = CACHE_SLOTS, .value = 4};
    struct bench_result r;
    ck_assert_msg(bench_run(&o, &r) == 0, "%s", strata_errdetail());
    ck_assert_uint_eq(r.decode.tokens, 5);
    struct gguf_file *f = NULL;
    struct model *m = NULL;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_int_eq(model_load(f, &m), 0);
    /* the default fixture: every layer routed */
    ck_assert_uint_eq(r.decode_hits + r.decode_misses, 5ull * m->hp.n_layer * m->hp.n_expert_used);
    model_fini(m);
    gguf_close(f);
    o.spec_lookup = 2;
    ck_assert_int_eq(bench_run(&o, &r), STRATA_EINVAL);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "greedy"));
    unlink(path);
}
END_TEST

/* --arena: the model of an arena, its experts the arena's blobs (as a worker reads them), streams
 * the file's weight bytes a decode step; the expert step runs on it too; a missing arena is
 * refused with what to start. */
START_TEST(runs_on_an_arena)
{
    char path[600], shm[600];
    snprintf(path, sizeof path, "%s/bench-arena.gguf", test_tmpdir());
    snprintf(shm, sizeof shm, "%s/shm", test_tmpdir());
    struct fixture_opts fo = {.seed = 5};
    ck_assert_int_eq(fixture_write(&fo, path), 0);
    struct gguf_file *f = NULL;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    struct arena *a = NULL;
    test_arena_build(f, path, shm, "benchtest", &a);
    struct bench_opts of = {.model = path, .threads = 2, .prompt = 24, .gen = 4, .reps = 1};
    struct bench_opts oa = of;
    oa.model = "benchtest", oa.arena = "benchtest", oa.shm_dir = shm;
    struct bench_result rf, ra;
    ck_assert_msg(bench_run(&of, &rf) == 0, "%s", strata_errdetail());
    ck_assert_msg(bench_run(&oa, &ra) == 0, "%s", strata_errdetail());
    ck_assert_uint_eq(ra.prefill.tokens, 24);
    ck_assert_uint_eq(ra.decode.tokens, 4);
    ck_assert_uint_eq(ra.decode.weight_bytes, rf.decode.weight_bytes);
    ck_assert_uint_eq(ra.file_bytes, a->hdr->total_bytes);
    struct bench_experts x;
    ck_assert_msg(bench_experts(&oa, 8, 32, &x) == 0, "%s", strata_errdetail());
    ck_assert(x.gbs > 0);
    struct bench_opts none = oa;
    none.arena = "nosuch";
    ck_assert_int_eq(bench_run(&none, &ra), STRATA_ENOENT);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "strata-arena serve"));
    arena_close(a);
    gguf_close(f);
    unlink(path);
}
END_TEST

/* The kernel and expert-step benchmarks: positive bandwidths, the routing's counts add up. */
START_TEST(kernels_and_expert_step)
{
    double g = 0;
    ck_assert_int_eq(bench_matmul_gbs(QT_Q4_K, 512, 3, 2, 1u << 20, &g), 0);
    ck_assert(g > 0);
    ck_assert_int_eq(bench_matmul_gbs(QT_Q8_0, 96, 1, 1, 1u << 20, &g), 0);
    ck_assert(g > 0);
    ck_assert_int_eq(bench_matmul_gbs(QT_F32, 256, 1, 1, 1u << 20, &g), STRATA_EINVAL);
    ck_assert_int_eq(bench_matmul_gbs(QT_Q4_K, 100, 1, 1, 1u << 20, &g), STRATA_EINVAL);
    char path[600];
    snprintf(path, sizeof path, "%s/bench-x.gguf", test_tmpdir());
    struct fixture_opts fo = {.seed = 5};
    ck_assert_int_eq(fixture_write(&fo, path), 0);
    struct bench_opts o = {.model = path, .threads = 2, .prompt = 1, .gen = 1, .reps = 2};
    struct bench_experts x;
    ck_assert_msg(bench_experts(&o, 8, 32, &x) == 0, "%s", strata_errdetail());
    ck_assert_uint_eq(x.window, 8);
    ck_assert_uint_eq(x.n_expert, 32);
    ck_assert_uint_gt(x.layers, 0);
    ck_assert(x.hit >= 1 && x.hit <= 32);
    ck_assert(x.s > 0 && x.gbs > 0 && x.bytes > 0);
    /* pairs = window * n_expert_used, spread over the experts run */
    ck_assert(x.tok_per_exp >= 1 && x.tok_per_exp <= 8);
    ck_assert_int_eq(bench_experts(&o, 0, 32, &x), STRATA_EINVAL);
    unlink(path);
}
END_TEST

extern const struct strata_cmd strata_cmd_bench;

/* run_cmd runs `strata bench args...` with stdout to a file; returns its status, *out the text. */
static int run_cmd(char **argv, int argc, char **out)
{
    char path[600];
    snprintf(path, sizeof path, "%s/bench-out.txt", test_tmpdir());
    fflush(stdout);
    FILE *saved = fdopen(dup(fileno(stdout)), "w");
    ck_assert_ptr_nonnull(freopen(path, "w", stdout));
    int st = strata_cmd_bench.run(argc, argv);
    fflush(stdout);
    dup2(fileno(saved), fileno(stdout));
    fclose(saved);
    *out = test_read_file(path, NULL);
    ck_assert_ptr_nonnull(*out);
    return st;
}

START_TEST(command_prints_table_and_json)
{
    char path[600];
    snprintf(path, sizeof path, "%s/bench-cmd.gguf", test_tmpdir());
    struct fixture_opts fo = {.seed = 5};
    ck_assert_int_eq(fixture_write(&fo, path), 0);
    char *out;
    char *json[] = {"bench", path, "--prompt",  "8", "--gen",    "2", "--reps",
                    "1",     "--threads", "1",  "--json", "--rounds", "2"};
    ck_assert_int_eq(run_cmd(json, 13, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"prefill_tok_s\": "));
    ck_assert_ptr_nonnull(strstr(out, "\"rounds\": 2"));
    ck_assert_ptr_nonnull(strstr(out, "\"decode_tok_s\": "));
    ck_assert_ptr_eq(strchr(out, '\n'), out + strlen(out) - 1); /* one line */
    free(out);
    /* --llama without the package: the table, and how to install it */
    char *table[] = {"bench",  path, "--prompt", "8",     "--gen",           "2",
                     "--reps", "1",  "--llama",  "--nlc", "/nonexistent/nlc"};
    ck_assert_int_eq(run_cmd(table, 11, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "where the time goes"));
    ck_assert_ptr_nonnull(strstr(out, "node"));
    free(out);
    /* --sweep: decode at 1, 2 and all threads, each row with its load and share of the read
     * bandwidth; in JSON one object per thread count */
    char *sweep[] = {"bench", path, "--prompt", "8", "--gen", "2", "--reps", "1", "--sweep"};
    ck_assert_int_eq(run_cmd(sweep, 9, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "decode by threads"));
    ck_assert_ptr_nonnull(strstr(out, "MiB/token"));
    ck_assert_ptr_nonnull(strstr(out, "\n  1 "));
    free(out);
    char *sweep_json[] = {"bench", path, "--prompt", "8",      "--gen",  "2",
                          "--reps", "1",  "--json",  "--sweep", "--threads", "1"};
    ck_assert_int_eq(run_cmd(sweep_json, 12, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "{\"sweep\": [{\"threads\": 1, \"load\": "));
    ck_assert_ptr_nonnull(strstr(out, "\"mib_per_token\": "));
    free(out);
    char *help[] = {"bench", "--help"};
    ck_assert_int_eq(run_cmd(help, 2, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: strata bench"));
    free(out);
    char *bad[] = {"bench", path, "--gen", "0"};
    ck_assert_int_eq(run_cmd(bad, 4, &out), 2);
    free(out);
    unlink(path);
}
END_TEST

/* leftovers: entries of dir whose name starts with prefix. */
static int leftovers(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d) closedir(d);
    return n;
}

/* With strata's kernels forced to AVX2 on an AVX-512 machine, llama.cpp must run AVX2 code too:
 * bench runs it from a copy of node-llama-cpp's directory holding only ggml's haswell variant,
 * says so when there is none, leaves the original as it was and removes the copy. */
START_TEST(llama_follows_forced_avx2)
{
    if (!cpu_isa_supported(CPU_AVX512) || system("node --version >/dev/null 2>&1") != 0) {
        printf("SKIP bench llama_follows_forced_avx2: needs an AVX-512 CPU and node\n");
        return;
    }
    const char *tmp = test_tmpdir();
    char path[600], nlc[600], bins[800], f[900], cmd[3000];
    snprintf(path, sizeof path, "%s/bench-hsw.gguf", tmp);
    struct fixture_opts fo = {.seed = 5};
    ck_assert_int_eq(fixture_write(&fo, path), 0);
    snprintf(nlc, sizeof nlc, "%s/nlc", tmp);
    snprintf(bins, sizeof bins, "%s/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64", nlc);
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/node_modules/node-llama-cpp' '%s' && touch '%s/libggml-cpu-icelake.so'",
             nlc, bins, bins);
    ck_assert_int_eq(system(cmd), 0);
    const char *old_tmp = getenv("TMPDIR");
    char *saved = old_tmp ? strdup(old_tmp) : NULL;
    setenv("TMPDIR", tmp, 1);
    const enum cpu_isa was = cpu_isa();
    ck_assert_int_eq(cpu_isa_set(CPU_AVX2), 0);
    char *args[] = {"bench",  path, "--prompt", "8",     "--gen", "2",
                    "--reps", "1",  "--llama",  "--nlc", nlc};
    char *out;
    ck_assert_int_eq(run_cmd(args, 11, &out), 0);
    ck_assert_msg(strstr(out, "has no libggml-cpu-haswell.so"), "%s", out);
    free(out);
    snprintf(f, sizeof f, "%s/libggml-cpu-haswell.so", bins);
    FILE *h = fopen(f, "w");
    ck_assert_ptr_nonnull(h);
    fclose(h);
    /* the copy is made and node runs in it; this package is empty, so no timings come back */
    ck_assert_int_eq(run_cmd(args, 11, &out), 0);
    ck_assert_msg(strstr(out, "gave no timings") && strstr(out, "strata-bench-nlc-"), "%s", out);
    free(out);
    snprintf(f, sizeof f, "%s/libggml-cpu-icelake.so", bins);
    ck_assert_msg(access(f, F_OK) == 0, "the original install lost its other variants");
    ck_assert_int_eq(leftovers(tmp, "strata-bench-nlc-"), 0);
    ck_assert_int_eq(cpu_isa_set(was), 0);
    if (saved)
        setenv("TMPDIR", saved, 1);
    else
        unsetenv("TMPDIR");
    free(saved);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", nlc);
    ck_assert_int_eq(system(cmd), 0);
    unlink(path);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bench");
    TCase *tc = tcase_create("bench");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, measures_a_tiny_model);
    tcase_add_test(tc, refuses_bad_lengths);
    tcase_add_test(tc, runs_on_an_arena);
    tcase_add_test(tc, decodes_random_ids);
    tcase_add_test(tc, kernels_and_expert_step);
    tcase_add_test(tc, command_prints_table_and_json);
    tcase_add_test(tc, llama_follows_forced_avx2);
    suite_add_tcase(s, tc);
    return test_run(s);
}
