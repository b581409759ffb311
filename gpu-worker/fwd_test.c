#include "gpu-worker/backend.h"
#include "common/base/err.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Bit-exact mode (DESIGN 3.4): the logits of every position of one history, computed many ways,
 * compared with memcmp against one token at a time on one thread. Every case runs once per
 * backend this machine has and per KV type (each type is its own contract), from one table. */

#define N_HIST   40 /* the target sequence's tokens: past one attention block of 32 */
#define N_OTHERS 16 /* neighbours sharing its batches */

struct env {
    char path[600];
    struct gguf_file *f;
    struct model *m;
    const char *backend;
    enum kv_type kv_type;
    struct kv_cache *kv; /* the running backend's */
    uint32_t V;
    int32_t hist[N_HIST];
    float *base; /* (N_HIST, V): one token per pass, one thread */
};

/* The (backend, KV type) pairs every case runs with: filled by main. */
#define MAX_CONFIGS 8
struct config {
    const char *backend;
    enum kv_type kv_type;
};
static struct config configs[MAX_CONFIGS];
static int n_configs;

static void env_open(struct env *e, const char *arch, int config)
{
    e->backend = configs[config].backend;
    e->kv_type = configs[config].kv_type;
    snprintf(e->path, sizeof e->path, "%s/%s.gguf", test_tmpdir(), arch);
    struct fixture_opts o = {.arch = arch, .seed = 3};
    ck_assert_msg(fixture_write(&o, e->path) == 0, "%s", strata_errdetail());
    ck_assert_int_eq(gguf_open(e->path, &e->f), 0);
    ck_assert_msg(model_load(e->f, &e->m) == 0, "%s", strata_errdetail());
    e->V = e->m->hp.n_vocab;
    for (int i = 0; i < N_HIST; i++)
        e->hist[i] = (int32_t)((i * 7919u + 13) % e->V);
    e->base = malloc((size_t)N_HIST * e->V * sizeof(float));
}

static void env_close(struct env *e)
{
    free(e->base);
    model_fini(e->m);
    gguf_close(e->f);
}

static struct backend *start(struct env *e, uint32_t threads, uint32_t max_tokens)
{
    struct backend *f;
    struct backend_opts o = {.name = e->backend,
                             .kv_type = e->kv_type,
                             .n_threads = threads,
                             .max_pass_tokens = max_tokens,
                             .n_ctx = 128,
                             .n_seq = N_OTHERS + 2};
    ck_assert_msg(backend_start(e->m, &o, &f) == 0, "%s", strata_errdetail());
    e->kv = backend_kv(f);
    return f;
}

/* feed runs hist[from..to) into s in chunks of chunk, every token's logits into out rows. */
static void feed(struct env *e, struct backend *f, struct kv_seq *s, uint32_t from, uint32_t to,
                 uint32_t chunk, float *out)
{
    struct backend_token t[N_HIST];
    for (uint32_t i = from; i < to; i += chunk) {
        uint32_t n = to - i < chunk ? to - i : chunk;
        for (uint32_t j = 0; j < n; j++)
            t[j] = (struct backend_token){s, e->hist[i + j], true};
        ck_assert_msg(backend_eval(f, t, n, out + (size_t)i * e->V) == 0, "%s", strata_errdetail());
    }
}

static void baseline(struct env *e)
{
    struct backend *f = start(e, 1, 1);
    struct kv_seq s;
    kv_seq_init(&s);
    feed(e, f, &s, 0, N_HIST, 1, e->base);
    for (size_t i = 0; i < (size_t)N_HIST * e->V; i++)
        ck_assert(isfinite(e->base[i]));
    kv_seq_fini(e->kv, &s);
    backend_close(f);
}

static void check_rows(struct env *e, const float *got, uint32_t from, uint32_t to, const char *how)
{
    for (uint32_t p = from; p < to; p++)
        ck_assert_msg(
            memcmp(got + (size_t)p * e->V, e->base + (size_t)p * e->V, e->V * sizeof(float)) == 0,
            "%s: logits of position %u differ from one-token decode", how, p);
}

/* Chunk sizes and thread counts: a prompt in one pass, in chunks of 7 on 2 threads, of 5 on 3. */
static void chunks_and_threads(struct env *e)
{
    /* {1, 4}: decode steps on more threads than KV heads, which cut their query heads apart */
    static const uint32_t cfg[][2] = {{N_HIST, 2}, {7, 2}, {5, 3}, {1, 4}};
    float *got = malloc((size_t)N_HIST * e->V * sizeof(float));
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        struct backend *f = start(e, cfg[c][1], N_HIST);
        struct kv_seq s;
        kv_seq_init(&s);
        feed(e, f, &s, 0, N_HIST, cfg[c][0], got);
        char how[64];
        snprintf(how, sizeof how, "chunk %u, %u threads", cfg[c][0], cfg[c][1]);
        check_rows(e, got, 0, N_HIST, how);
        kv_seq_fini(e->kv, &s);
        backend_close(f);
    }
    free(got);
}

/* Inside batches shared with 16 other sequences, each at its own stage: some still in their
 * prompts (several tokens per pass), some decoding (one token per pass). */
static void among_neighbours(struct env *e)
{
    struct backend *f = start(e, 2, 256);
    struct kv_seq target, others[N_OTHERS];
    kv_seq_init(&target);
    for (int k = 0; k < N_OTHERS; k++)
        kv_seq_init(&others[k]);
    float *got = malloc((size_t)N_HIST * e->V * sizeof(float));
    float *logits = malloc((size_t)256 * e->V * sizeof(float));
    struct backend_token t[256];
    uint32_t done = 0;
    for (uint32_t step = 0; done < N_HIST; step++) {
        uint32_t n = 0, n_out = 0, first = 0, mine = step % 3 == 0 ? 6 : 1;
        /* Neighbours first and last so the target sits in the middle of the batch. */
        for (int k = 0; k < N_OTHERS / 2; k++) {
            uint32_t cnt = (k + step) % 4 == 0 ? 5 : 1;
            for (uint32_t j = 0; j < cnt; j++)
                t[n++] = (struct backend_token){
                    &others[k], (int32_t)((k * 31 + step * 7 + j) % e->V), j + 1 == cnt};
        }
        for (uint32_t j = 0; j < mine && done + j < N_HIST; j++) {
            if (j == 0)
                for (uint32_t i = 0; i < n; i++)
                    first += t[i].logits;
            t[n++] = (struct backend_token){&target, e->hist[done + j], true};
        }
        for (int k = N_OTHERS / 2; k < N_OTHERS; k++)
            t[n++] = (struct backend_token){&others[k], (int32_t)((k * 17 + step) % e->V), k % 2};
        for (uint32_t i = 0; i < n; i++)
            n_out += t[i].logits;
        ck_assert_msg(backend_eval(f, t, n, logits) == 0, "%s", strata_errdetail());
        uint32_t fed = mine < N_HIST - done ? mine : N_HIST - done;
        memcpy(got + (size_t)done * e->V, logits + (size_t)first * e->V,
               (size_t)fed * e->V * sizeof(float));
        done += fed;
    }
    check_rows(e, got, 0, N_HIST, "in a batch of 17 sequences");
    kv_seq_fini(e->kv, &target);
    for (int k = 0; k < N_OTHERS; k++)
        kv_seq_fini(e->kv, &others[k]);
    free(got);
    free(logits);
    backend_close(f);
}

/* Re-prefilled from its middle: decode to the end, cut back to 17, feed the rest as a prompt. */
static void reprefill(struct env *e)
{
    struct backend *f = start(e, 2, 32);
    struct kv_seq s;
    kv_seq_init(&s);
    float *got = malloc((size_t)N_HIST * e->V * sizeof(float));
    feed(e, f, &s, 0, 34, 1, got);
    ck_assert_int_eq(kv_seq_resize(e->kv, &s, 17), 0);
    feed(e, f, &s, 17, N_HIST, 9, got);
    check_rows(e, got, 17, N_HIST, "re-prefilled from position 17");
    kv_seq_fini(e->kv, &s);
    free(got);
    backend_close(f);
}

static void bit_exact(const char *arch, int config)
{
    struct env e;
    env_open(&e, arch, config);
    baseline(&e);
    chunks_and_threads(&e);
    among_neighbours(&e);
    reprefill(&e);
    env_close(&e);
    unlink(e.path);
}

START_TEST(bit_exact_qwen3moe)
{
    bit_exact("qwen3moe", _i);
}
END_TEST

START_TEST(bit_exact_qwen2moe)
{
    bit_exact("qwen2moe", _i);
}
END_TEST

/* gpt-oss: sliding windows of 8 keys on even layers (the history runs past a 32-key attention
 * block, so windows start mid-block and past it), sinks, biases, YaRN. Backends without its
 * kernels refuse it (backend_cuda_test); the bit-exact contract is the CPU's. */
START_TEST(bit_exact_gpt_oss)
{
    if (strcmp(configs[_i].backend, "cpu") != 0) return;
    bit_exact("gpt-oss", _i);
}
END_TEST

/* glm4moe: a dense layer, sigmoid routing with the selection bias and scaling, the ungated shared
 * expert, half the head rotated, q/k norms, biases, the MTP layer skipped. CPU only, as gpt-oss. */
START_TEST(bit_exact_glm4moe)
{
    if (strcmp(configs[_i].backend, "cpu") != 0) return;
    bit_exact("glm4moe", _i);
}
END_TEST

/* deepseek2: MLA (the latent and rope key cached, V read out of the K rows, heads split across
 * threads), group-limited routing, YaRN with DeepSeek's mscale. CPU only. */
START_TEST(bit_exact_deepseek2)
{
    if (strcmp(configs[_i].backend, "cpu") != 0) return;
    bit_exact("deepseek2", _i);
}
END_TEST

START_TEST(context_is_refused_past_its_end)
{
    struct env e;
    env_open(&e, "llama", _i);
    struct backend *f;
    struct backend_opts o = {.name = e.backend,
                             .kv_type = e.kv_type,
                             .n_threads = 1,
                             .max_pass_tokens = 32,
                             .n_ctx = 20,
                             .n_seq = 1};
    ck_assert_int_eq(backend_start(e.m, &o, &f), 0);
    struct kv_cache *kv = backend_kv(f);
    struct kv_seq s;
    kv_seq_init(&s);
    float *logits = malloc(e.V * sizeof(float));
    ck_assert_int_eq(backend_prompt(f, &s, e.hist, 21, 0, logits), STRATA_ELIMIT);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "context of 20"));
    ck_assert_uint_eq(s.n_tokens, 0); /* a failed pass leaves the sequence as it was */
    ck_assert_int_eq(backend_prompt(f, &s, e.hist, 20, 8, logits), 0);
    struct backend_token t = {&s, 1, true};
    ck_assert_int_eq(backend_eval(f, &t, 1, logits), STRATA_ELIMIT);
    ck_assert_uint_eq(s.n_tokens, 20);
    t.id = (int32_t)e.V;
    ck_assert_int_eq(backend_eval(f, &t, 1, logits), STRATA_EINVAL);
    ck_assert_int_eq(backend_eval(f, &t, 0, logits), STRATA_EINVAL);
    free(logits);
    kv_seq_fini(kv, &s);
    backend_close(f);
    env_close(&e);
    unlink(e.path);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fwd");
    TCase *tc = tcase_create("fwd");
    tcase_set_timeout(tc, 240); /* Debug + ASan builds run ~10x slower */
    for (const char *const *b = backend_names(); *b; b++)
        if (backend_available(*b))
            for (int t = KV_F32; t <= KV_F16 && n_configs < MAX_CONFIGS; t++)
                configs[n_configs++] = (struct config){*b, (enum kv_type)t};
    /* the other architectures under the first configuration only when short: the K/V types'
     * and backends' paths are the same code for every architecture */
    const int n_other =
        test_matrix_short("fwd", "the configurations after the first for all but qwen3moe")
            ? 1
            : n_configs;
    tcase_add_loop_test(tc, bit_exact_qwen3moe, 0, n_configs);
    tcase_add_loop_test(tc, bit_exact_qwen2moe, 0, n_other);
    tcase_add_loop_test(tc, bit_exact_gpt_oss, 0, n_other);
    tcase_add_loop_test(tc, bit_exact_glm4moe, 0, n_other);
    tcase_add_loop_test(tc, bit_exact_deepseek2, 0, n_other);
    tcase_add_loop_test(tc, context_is_refused_past_its_end, 0, n_other);
    suite_add_tcase(s, tc);
    return test_run(s);
}
