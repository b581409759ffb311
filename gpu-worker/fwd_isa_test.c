/* fwd_isa_test — the forward pass computes the same bytes on every kernel ISA: the logits of a
 * 40-token prompt fed in chunks of 7 on 2 threads, under the AVX2 and AVX-512 kernels, compared
 * with memcmp against the plain-C reference kernels (STRATA_CPU=ref), for fixtures whose weight
 * types cover the K-quants, the 32-element formats and float weights, with and without a shared
 * expert. */
#include "common/base/err.h"
#include "gpu-worker/backend.h"
#include "kernels/cpu/cpu.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_TOK 40

static const struct {
    const char *arch, *type;
} models[] = {
    {"qwen3moe", NULL},   /* the Q4_K_M mix: Q4_K, Q6_K, ... */
    {"qwen2moe", "q5_0"}, /* shared expert; Q8_0 activations with an offset format */
    {"olmoe", "iq4_xs"},  /* signed levels; full-width q/k norms */
    {"llama", "bf16"},    /* float weights */
    {"gpt-oss", "mxfp4_moe"}, /* MXFP4 experts with biases, sinks, sliding windows */
    {"glm4moe", "q4_k"},      /* sigmoid routing, dense layer, partial rotary, q/k norms */
    {"deepseek2", "q8_0"},    /* MLA, group-limited routing, YaRN */
};

/* logits_of runs the prompt on the current ISA: (N_TOK, n_vocab) floats, caller frees. */
static float *logits_of(const struct model *m)
{
    struct kv_cache *kv;
    struct backend *f;
    struct backend_opts o = {.n_threads = 2, .max_pass_tokens = 8, .n_ctx = 64, .n_seq = 1};
    ck_assert_int_eq(backend_start(m, &o, &f), 0);
    kv = backend_kv(f);
    const uint32_t V = m->hp.n_vocab;
    float *out = malloc((size_t)N_TOK * V * sizeof(float));
    struct kv_seq s;
    kv_seq_init(&s);
    struct backend_token t[7];
    for (uint32_t i = 0; i < N_TOK; i += 7) {
        const uint32_t n = N_TOK - i < 7 ? N_TOK - i : 7;
        for (uint32_t j = 0; j < n; j++)
            t[j] = (struct backend_token){&s, (int32_t)(((i + j) * 7919u + 13) % V), true};
        ck_assert_msg(backend_eval(f, t, n, out + (size_t)i * V) == 0, "%s", strata_errdetail());
    }
    kv_seq_fini(kv, &s);
    backend_close(f);
    return out;
}

START_TEST(same_logits_on_every_isa)
{
    char path[600];
    snprintf(path, sizeof path, "%s/isa-%s.gguf", test_tmpdir(), models[_i].arch);
    struct fixture_opts fo = {.arch = models[_i].arch, .type = models[_i].type, .seed = 11};
    ck_assert_msg(fixture_write(&fo, path) == 0, "%s", strata_errdetail());
    struct gguf_file *gf;
    struct model *m;
    ck_assert_int_eq(gguf_open(path, &gf), 0);
    ck_assert_msg(model_load(gf, &m) == 0, "%s", strata_errdetail());
    ck_assert_int_eq(cpu_isa_set(CPU_REF), 0);
    float *want = logits_of(m);
    const size_t n = (size_t)N_TOK * m->hp.n_vocab;
    int tested = 0;
    for (int isa = CPU_AVX2; isa <= CPU_AVX512; isa++) {
        if (!cpu_isa_supported((enum cpu_isa)isa)) continue;
        ck_assert_int_eq(cpu_isa_set((enum cpu_isa)isa), 0);
        float *got = logits_of(m);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                          "%s %s on %s: logit %zu of position %zu is %.9g, reference %.9g",
                          models[_i].arch, models[_i].type ? models[_i].type : "q4_k_m",
                          cpu_isa_name((enum cpu_isa)isa), i % m->hp.n_vocab, i / m->hp.n_vocab,
                          got[i], want[i]);
        free(got);
        tested++;
    }
    if (!tested) printf("SKIP fwd_isa: this CPU has neither AVX2 nor AVX-512\n");
    free(want);
    model_fini(m);
    gguf_close(gf);
    unlink(path);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fwd_isa");
    TCase *tc = tcase_create("fwd_isa");
    tcase_set_timeout(tc, 240); /* Debug + ASan: the reference kernels are slow */
    tcase_add_loop_test(tc, same_logits_on_every_isa, 0, (int)(sizeof models / sizeof models[0]));
    suite_add_tcase(s, tc);
    return test_run(s);
}
