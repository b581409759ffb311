#include "common/base/err.h"
#include "gpu-worker/backend.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* fwd_set_route: the hook sees every routed token, once per (layer, expert) of a pass, on the
 * caller's thread, in layer then expert order; batched passes route each token exactly as
 * one-token passes do. */

#define N_SEQ  2
#define N_HIST 40 /* tokens per sequence: past one attention block */
#define MAX_K  16

/* What the hook saw, per (sequence, position, layer). */
struct rec {
    uint32_t n_layer, n_expert, K;
    pthread_t caller;
    const uint32_t *slot; /* batch index -> seq * N_HIST + position */
    uint32_t n;           /* tokens of the pass */
    int64_t last;         /* layer * n_expert + expert of the previous call this pass, or -1 */
    uint64_t *layer_sum;  /* (n_layer) tokens reported this pass */
    uint32_t *sel;        /* (N_SEQ * N_HIST, n_layer, MAX_K) experts in the order reported */
    uint32_t *got;        /* (N_SEQ * N_HIST, n_layer) how many */
    uint64_t calls;
};

static void on_route(void *ctx, uint32_t layer, uint32_t expert, const uint32_t *tokens,
                     uint32_t n_tokens)
{
    struct rec *r = ctx;
    ck_assert_msg(pthread_equal(pthread_self(), r->caller), "hook ran off the fwd_eval thread");
    ck_assert_uint_lt(layer, r->n_layer);
    ck_assert_uint_lt(expert, r->n_expert);
    ck_assert_uint_gt(n_tokens, 0);
    const int64_t at = (int64_t)layer * r->n_expert + expert;
    ck_assert_msg(at > r->last, "layer %u expert %u reported after %lld", layer, expert,
                  (long long)r->last);
    r->last = at;
    r->calls++;
    r->layer_sum[layer] += n_tokens;
    for (uint32_t i = 0; i < n_tokens; i++) {
        ck_assert_uint_lt(tokens[i], r->n);
        if (i) ck_assert_uint_gt(tokens[i], tokens[i - 1]);
        const size_t s = (size_t)r->slot[tokens[i]] * r->n_layer + layer;
        ck_assert_uint_lt(r->got[s], r->K);
        r->sel[s * MAX_K + r->got[s]++] = expert;
    }
}

struct env {
    char path[600];
    struct gguf_file *f;
    struct model *m;
    struct kv_cache *kv;
    int32_t hist[N_SEQ][N_HIST];
    struct rec r;
};

static void env_open(struct env *e, const char *arch)
{
    snprintf(e->path, sizeof e->path, "%s/route-%s.gguf", test_tmpdir(), arch);
    struct fixture_opts o = {.arch = arch, .seed = 11, .zipf = 1.2, .threads = 1};
    ck_assert_msg(fixture_write(&o, e->path) == 0, "%s", strata_errdetail());
    ck_assert_int_eq(gguf_open(e->path, &e->f), 0);
    ck_assert_msg(model_load(e->f, &e->m) == 0, "%s", strata_errdetail());
    const struct model_hparams *hp = &e->m->hp;
    ck_assert_uint_le(hp->n_expert_used, MAX_K);
    for (uint32_t s = 0; s < N_SEQ; s++)
        for (uint32_t i = 0; i < N_HIST; i++)
            e->hist[s][i] = (int32_t)((i * 7919u + s * 104729u + 13) % hp->n_vocab);
    e->r = (struct rec){.n_layer = hp->n_layer, .n_expert = hp->n_expert, .K = hp->n_expert_used};
    e->r.layer_sum = calloc(hp->n_layer, sizeof *e->r.layer_sum);
    e->r.sel = calloc((size_t)N_SEQ * N_HIST * hp->n_layer * MAX_K, sizeof *e->r.sel);
    e->r.got = calloc((size_t)N_SEQ * N_HIST * hp->n_layer, sizeof *e->r.got);
}

static void env_close(struct env *e)
{
    free(e->r.layer_sum);
    free(e->r.sel);
    free(e->r.got);
    model_fini(e->m);
    gguf_close(e->f);
    unlink(e->path);
}

/* eval runs one pass of toks (slots[i]: where token i's routing goes) and checks that every
 * token was reported n_expert_used times in every layer. */
static void eval(struct env *e, struct backend *f, const struct backend_token *toks, const uint32_t *slots,
                 uint32_t n)
{
    struct rec *r = &e->r;
    r->caller = pthread_self();
    r->slot = slots;
    r->n = n;
    r->last = -1;
    memset(r->layer_sum, 0, r->n_layer * sizeof *r->layer_sum);
    ck_assert_msg(backend_eval(f, toks, n, NULL) == 0, "%s", strata_errdetail());
    for (uint32_t l = 0; l < r->n_layer; l++)
        ck_assert_uint_eq(r->layer_sum[l], (uint64_t)n * r->K);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < r->n_layer; l++)
            ck_assert_uint_eq(r->got[(size_t)slots[i] * r->n_layer + l], r->K);
}

static struct backend *start(struct env *e, uint32_t threads, uint32_t max_tokens)
{
    struct backend *f;
    struct backend_opts o = {.n_threads = threads, .max_pass_tokens = max_tokens, .n_ctx = 64,
                             .n_seq = N_SEQ};
    ck_assert_int_eq(backend_start(e->m, &o, &f), 0);
    e->kv = backend_kv(f);
    backend_set_route(f, on_route, &e->r);
    return f;
}

static void clear(struct env *e)
{
    const size_t n = (size_t)N_SEQ * N_HIST * e->r.n_layer;
    memset(e->r.got, 0, n * sizeof *e->r.got);
    memset(e->r.sel, 0, n * MAX_K * sizeof *e->r.sel);
}

static void routes_tokens(const char *arch)
{
    struct env e;
    env_open(&e, arch);
    const size_t n_sel = (size_t)N_SEQ * N_HIST * e.r.n_layer * MAX_K;
    uint32_t *base = malloc(n_sel * sizeof *base);
    /* Token by token: one token a pass, one thread. */
    struct backend *f = start(&e, 1, 1);
    struct kv_seq seq[N_SEQ];
    for (uint32_t s = 0; s < N_SEQ; s++) {
        kv_seq_init(&seq[s]);
        for (uint32_t i = 0; i < N_HIST; i++) {
            struct backend_token t = {&seq[s], e.hist[s][i], false};
            uint32_t slot = s * N_HIST + i;
            eval(&e, f, &t, &slot, 1);
        }
        kv_seq_fini(e.kv, &seq[s]);
    }
    backend_close(f);
    memcpy(base, e.r.sel, n_sel * sizeof *base);
    for (size_t i = 0; i < (size_t)N_SEQ * N_HIST * e.r.n_layer; i++)
        for (uint32_t k = 1; k < e.r.K; k++)
            ck_assert_uint_gt(base[i * MAX_K + k], base[i * MAX_K + k - 1]);
    /* Both sequences in shared passes of uneven chunks on 3 threads. */
    clear(&e);
    f = start(&e, 3, 2 * N_HIST);
    for (uint32_t s = 0; s < N_SEQ; s++)
        kv_seq_init(&seq[s]);
    uint32_t done[N_SEQ] = {0};
    const uint64_t calls0 = e.r.calls;
    for (uint32_t step = 0; done[0] < N_HIST || done[1] < N_HIST; step++) {
        struct backend_token t[2 * N_HIST];
        uint32_t slots[2 * N_HIST], n = 0;
        for (uint32_t s = 0; s < N_SEQ; s++) {
            uint32_t c = s == 0 ? 1 + step % 7 : 13 - step % 5;
            for (uint32_t j = 0; j < c && done[s] < N_HIST; j++, done[s]++) {
                slots[n] = s * N_HIST + done[s];
                t[n++] = (struct backend_token){&seq[s], e.hist[s][done[s]], false};
            }
        }
        eval(&e, f, t, slots, n);
    }
    /* Fewer calls than tokens x layers x K: each expert is reported once per pass. */
    ck_assert_uint_lt(e.r.calls - calls0, (uint64_t)N_SEQ * N_HIST * e.r.n_layer * e.r.K);
    ck_assert_msg(memcmp(base, e.r.sel, n_sel * sizeof *base) == 0,
                  "batched passes routed a token differently from one-token passes");
    /* Without the hook a pass reports nothing. */
    backend_set_route(f, NULL, NULL);
    const uint64_t calls1 = e.r.calls;
    struct backend_token t = {&seq[0], 1, true};
    float *logits = malloc(e.m->hp.n_vocab * sizeof *logits);
    ck_assert_int_eq(kv_seq_resize(e.kv, &seq[0], 10), 0);
    ck_assert_int_eq(backend_eval(f, &t, 1, logits), 0);
    ck_assert_uint_eq(e.r.calls, calls1);
    free(logits);
    for (uint32_t s = 0; s < N_SEQ; s++)
        kv_seq_fini(e.kv, &seq[s]);
    backend_close(f);
    free(base);
    env_close(&e);
}

START_TEST(route_qwen3moe)
{
    routes_tokens("qwen3moe");
}
END_TEST

START_TEST(route_qwen2moe)
{
    routes_tokens("qwen2moe");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fwd_route");
    TCase *tc = tcase_create("fwd_route");
    tcase_set_timeout(tc, 120); /* Debug + ASan builds run ~10x slower */
    tcase_add_test(tc, route_qwen3moe);
    tcase_add_test(tc, route_qwen2moe);
    suite_add_tcase(s, tc);
    return test_run(s);
}
