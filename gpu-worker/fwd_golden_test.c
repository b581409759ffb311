#include "common/base/err.h"
#include "gpu-worker/backend.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

/* Golden logits: the bytes of the logits of every position of one history, per architecture and
 * type mix, pinned as one XXH3_64bits per case. The hashes were made on the forward pass before the
 * backend seam was cut (commit "fwd_golden_test: pin today's logits"), so "bytes unchanged" in a
 * refactor is this test, not a claim. A change that is meant to move the bytes must say so and
 * update the table: STRATA_GOLDEN_PRINT=1 prints the new one. */

#define N_POS 40 /* past one attention block of 32 keys */

struct golden {
    const char *arch, *type;
    uint64_t hash;
};

static const struct golden goldens[] = {
    /* moved on purpose when attention's multiply-adds became fused (fmaf, as the CUDA kernels'):
     * three q8_0 cases and mxfp4_moe kept their bytes (their quantized activations absorbed it) */
    {"qwen3moe", "f32", 0x6b39205dcb121acc},
    {"qwen3moe", "q8_0", 0xbc91e150f9ac7e9a},
    {"qwen3moe", "q4_k_m", 0x06604f73e66dc152},
    {"llama", "f32", 0x38918a8278a9f522},
    {"llama", "q8_0", 0x5e3cd29eef792ddc},
    {"llama", "q4_k_m", 0x21fb9b96bc2bc4ae},
    {"olmoe", "f32", 0x3b7f987e40bcdd7f},
    {"olmoe", "q8_0", 0x59470bc896a48aeb},
    {"olmoe", "q4_k_m", 0xcb8174b8bc8e2f1c},
    {"qwen2moe", "f32", 0xca52dbc234178c26},
    {"qwen2moe", "q8_0", 0x7d67e5d66626fa80},
    {"qwen2moe", "q4_k_m", 0xabe2d98d399d4934},
    /* gpt-oss, pinned when it was added (llama.cpp parity: tests/llamacpp) */
    {"gpt-oss", "f32", 0x413595519b2af0da},
    {"gpt-oss", "mxfp4_moe", 0x54d709a27bdb9b94},
    /* glm4moe, pinned when it was added (llama.cpp parity: tests/llamacpp) */
    {"glm4moe", "f32", 0xecc55e84dc00faa4},
    {"glm4moe", "q4_k_m", 0x5ddeab57fc215513},
    /* deepseek2 (MLA), pinned when it was added (llama.cpp parity: tests/llamacpp) */
    {"deepseek2", "f32", 0x4d30cbe460ffcc9f},
    {"deepseek2", "q4_k_m", 0xa5a0fdd83519a1bf},
};
#define N_GOLDEN (sizeof goldens / sizeof goldens[0])

/* case_hash builds the case's fixture and returns the hash of (N_POS, n_vocab) logits, the history
 * fed in chunks of 7 tokens on two threads (bit-exact mode makes chunking and threads invisible).
 */
static uint64_t case_hash(const struct golden *g)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s-%s.gguf", test_tmpdir(), g->arch, g->type);
    struct fixture_opts o = {.arch = g->arch, .type = g->type, .seed = 11};
    ck_assert_msg(fixture_write(&o, path) == 0, "%s", strata_errdetail());
    struct gguf_file *f;
    struct model *m;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_msg(model_load(f, &m) == 0, "%s", strata_errdetail());
    uint32_t V = m->hp.n_vocab;
    struct kv_cache *kv;
    struct backend *fw;
    struct backend_opts fo = {.n_threads = 2, .max_pass_tokens = 8, .n_ctx = 64, .n_seq = 1};
    ck_assert_int_eq(backend_start(m, &fo, &fw), 0);
    kv = backend_kv(fw);
    struct kv_seq s;
    kv_seq_init(&s);
    float *logits = malloc((size_t)N_POS * V * sizeof *logits);
    ck_assert_ptr_nonnull(logits);
    struct backend_token t[8];
    for (uint32_t i = 0; i < N_POS; i += 7) {
        uint32_t n = N_POS - i < 7 ? N_POS - i : 7;
        for (uint32_t j = 0; j < n; j++)
            t[j] = (struct backend_token){&s, (int32_t)(((i + j) * 7919u + 13) % V), true};
        ck_assert_msg(backend_eval(fw, t, n, logits + (size_t)i * V) == 0, "%s", strata_errdetail());
    }
    uint64_t h = XXH3_64bits(logits, (size_t)N_POS * V * sizeof *logits);
    free(logits);
    kv_seq_fini(kv, &s);
    backend_close(fw);
    model_fini(m);
    gguf_close(f);
    unlink(path);
    return h;
}

START_TEST(golden_logits)
{
    const struct golden *g = &goldens[_i];
    uint64_t h = case_hash(g);
    if (getenv("STRATA_GOLDEN_PRINT"))
        printf("    {\"%s\", \"%s\", 0x%016" PRIx64 "},\n", g->arch, g->type, h);
    ck_assert_msg(h == g->hash,
                  "%s %s: logits hash 0x%016" PRIx64 ", golden 0x%016" PRIx64
                  " (a change to the arithmetic moved the bytes)",
                  g->arch, g->type, h, g->hash);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fwd_golden");
    TCase *tc = tcase_create("golden");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, golden_logits, 0, (int)N_GOLDEN);
    suite_add_tcase(s, tc);
    return test_run(s);
}
