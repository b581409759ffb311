/* perplexity_test — the window rule on known cases (and the same totals train_demo.py's rule
 * gives), perplexity of a short sequence on a tiny F32 fixture equal to exp(mean NLL) computed here
 * from logits the forward pass gives one token at a time, the input readers, the errors and
 * `strata perplexity` itself. */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/arena/model.h"
#include "common/tok/tok.h"
#include "gpu-worker/backend.h"
#include "gpu-worker/kv.h"
#include "launcher/cmd.h"
#include "tests/testutil.h"
#include "tools/fixture.h"
#include "tools/perplexity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const struct strata_cmd strata_cmd_perplexity;

static const char *tmp_path(const char *name)
{
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", test_tmpdir(), name);
    return buf;
}

START_TEST(test_windows)
{
    struct ppl_window w[8];
    /* Non-overlapping: each window scores all but its first token. */
    ck_assert_uint_eq(ppl_windows(10, 4, 4, w, 8), 3);
    const size_t want1[3][3] = {{0, 4, 1}, {4, 8, 5}, {8, 10, 9}};
    for (int i = 0; i < 3; i++)
        ck_assert(w[i].begin == want1[i][0] && w[i].end == want1[i][1] &&
                  w[i].first == want1[i][2]);
    /* Overlapping: a window scores only what the previous one did not reach. */
    ck_assert_uint_eq(ppl_windows(10, 4, 2, w, 8), 4);
    const size_t want2[4][3] = {{0, 4, 1}, {2, 6, 4}, {4, 8, 6}, {6, 10, 8}};
    for (int i = 0; i < 4; i++)
        ck_assert(w[i].begin == want2[i][0] && w[i].end == want2[i][1] &&
                  w[i].first == want2[i][2]);
    /* A last window of one token scores nothing and is not counted. */
    ck_assert_uint_eq(ppl_windows(5, 4, 4, w, 8), 1);
    ck_assert_uint_eq(ppl_windows(1, 4, 4, w, 8), 0);
    ck_assert_uint_eq(ppl_windows(2, 2, 1, w, 8), 1);
    /* Every token but the first is scored once when stride < ctx; with stride == ctx each window
     * drops its first token: ceil(n / ctx) tokens are not scored. */
    for (size_t n = 2; n < 300; n += 7)
        for (uint32_t ctx = 2; ctx < 40; ctx += 5)
            for (uint32_t stride = 1; stride <= ctx; stride += 3) {
                size_t k = ppl_windows(n, ctx, stride, NULL, 0);
                struct ppl_window *ws = malloc(k * sizeof *ws);
                ck_assert_uint_eq(ppl_windows(n, ctx, stride, ws, k), k);
                size_t scored = 0;
                for (size_t i = 0; i < k; i++) {
                    ck_assert_uint_le(ws[i].end - ws[i].begin, ctx);
                    ck_assert_uint_gt(ws[i].first, ws[i].begin);
                    scored += ws[i].end - ws[i].first;
                }
                /* A last window of one token scores nothing and is dropped. */
                ck_assert_uint_ge(ws[k - 1].end + 1, n);
                if (stride < ctx)
                    ck_assert_uint_eq(scored, n - 1);
                else
                    ck_assert_uint_eq(scored, n - (n + ctx - 1) / ctx);
                free(ws);
            }
}
END_TEST

struct fx {
    struct gguf_file *gf;
    struct model *m;
};

static void fx_open(struct fx *x)
{
    const char *path = tmp_path("fx.gguf");
    struct fixture_opts o = {.type = "f32", .seed = 7, .mode = FIXTURE_FLOAT, .threads = 1};
    ck_assert_msg(fixture_write(&o, path) == 0, "fixture: %s", strata_errdetail());
    ck_assert_int_eq(gguf_open(path, &x->gf), 0);
    ck_assert_msg(model_load(x->gf, &x->m) == 0, "model_load: %s", strata_errdetail());
}

static void fx_close(struct fx *x)
{
    model_fini(x->m);
    gguf_close(x->gf);
}

/* logits_one_by_one: the logits of every position of ids[b..e), each token its own forward pass
 * (a different batching from ppl_eval's; the forward pass is bit-exact across batchings). */
static float *logits_one_by_one(const struct model *m, const int32_t *ids, size_t b, size_t e)
{
    const uint32_t V = m->hp.n_vocab;
    struct kv_cache *kv;
    struct backend *f;
    struct backend_opts fo = {.n_threads = 2, .max_pass_tokens = 1, .n_ctx = (uint32_t)(e - b), .n_seq = 1};
    ck_assert_int_eq(backend_start(m, &fo, &f), 0);
    kv = backend_kv(f);
    struct kv_seq s;
    kv_seq_init(&s);
    float *out = malloc((e - b) * V * sizeof *out);
    for (size_t q = b; q < e; q++) {
        struct backend_token t = {&s, ids[q], true};
        ck_assert_int_eq(backend_eval(f, &t, 1, out + (q - b) * V), 0);
    }
    kv_seq_fini(kv, &s);
    backend_close(f);
    return out;
}

static double nll_ref(const float *row, uint32_t V, int32_t target)
{
    double mx = -INFINITY, sum = 0;
    for (uint32_t i = 0; i < V; i++)
        mx = row[i] > mx ? row[i] : mx;
    for (uint32_t i = 0; i < V; i++)
        sum += exp(row[i] - mx);
    return -(row[target] - mx - log(sum));
}

START_TEST(test_matches_logits)
{
    struct fx x;
    fx_open(&x);
    const uint32_t V = x.m->hp.n_vocab;
    enum { N = 37 };
    int32_t ids[N];
    uint64_t r = 99;
    for (int i = 0; i < N; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((r >> 33) % V);
    }
    /* ctx 16, stride 8: windows [0,16) scores 1..15, [8,24) 16..23, [16,32) 24..31,
     * [24,37) 32..36: every token from 1 on, once. */
    const size_t win[4][3] = {{0, 16, 1}, {8, 24, 16}, {16, 32, 24}, {24, 37, 32}};
    double nll = 0;
    size_t scored = 0;
    for (int k = 0; k < 4; k++) {
        float *lg = logits_one_by_one(x.m, ids, win[k][0], win[k][1]);
        for (size_t p = win[k][2]; p < win[k][1]; p++) {
            nll += nll_ref(lg + (p - 1 - win[k][0]) * V, V, ids[p]);
            scored++;
        }
        free(lg);
    }
    struct ppl_opts o = {.ctx = 16, .stride = 8, .n_threads = 3};
    struct ppl_result res;
    ck_assert_msg(ppl_eval(x.m, ids, N, &o, &res) == 0, "ppl_eval: %s", strata_errdetail());
    ck_assert_uint_eq(res.scored, scored);
    ck_assert_uint_eq(res.scored, N - 1);
    ck_assert_uint_eq(res.n_windows, 4);
    ck_assert_msg(fabs(res.nll - nll) <= 1e-9 * nll, "nll %.12f, want %.12f", res.nll, nll);
    ck_assert_double_eq_tol(res.perplexity, exp(nll / (double)scored), 1e-9 * res.perplexity);
    ck_assert(res.perplexity > 1.0 && isfinite(res.perplexity));
    /* Non-overlapping windows score fewer tokens, each with less context. */
    o.stride = 16;
    ck_assert_int_eq(ppl_eval(x.m, ids, N, &o, &res), 0);
    ck_assert_uint_eq(res.scored, 15 + 15 + 4);
    fx_close(&x);
}
END_TEST

START_TEST(test_errors)
{
    struct fx x;
    fx_open(&x);
    int32_t ids[4] = {1, 2, 3, 4};
    struct ppl_result res;
    struct ppl_opts o = {.ctx = 8, .stride = 9};
    ck_assert_int_eq(ppl_eval(x.m, ids, 4, &o, &res), STRATA_EINVAL);
    o = (struct ppl_opts){.ctx = 1, .stride = 1};
    ck_assert_int_eq(ppl_eval(x.m, ids, 4, &o, &res), STRATA_EINVAL);
    o = (struct ppl_opts){.ctx = 8, .stride = 8};
    ck_assert_int_eq(ppl_eval(x.m, ids, 1, &o, &res), STRATA_EINVAL);
    ids[2] = (int32_t)x.m->hp.n_vocab;
    ck_assert_int_eq(ppl_eval(x.m, ids, 4, &o, &res), STRATA_EINVAL);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "token 2"));
    fx_close(&x);
}
END_TEST

START_TEST(test_read_tokens)
{
    const char *p = tmp_path("ids.bin");
    const unsigned char raw[] = {1, 0, 0, 0, 0x34, 0x12, 0, 0, 0xff, 0xff, 0xff, 0x7f};
    FILE *f = fopen(p, "wb");
    fwrite(raw, 1, sizeof raw, f);
    fclose(f);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(ppl_read_tokens(p, true, NULL, &ids, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert(ids[0] == 1 && ids[1] == 0x1234 && ids[2] == INT32_MAX);
    free(ids);
    f = fopen(p, "wb");
    fwrite(raw, 1, 5, f);
    fclose(f);
    ck_assert_int_eq(ppl_read_tokens(p, true, NULL, &ids, &n), STRATA_EFORMAT);
    f = fopen(p, "wb");
    fwrite("\0\0\0\x80", 1, 4, f);
    fclose(f);
    ck_assert_int_eq(ppl_read_tokens(p, true, NULL, &ids, &n), STRATA_EFORMAT);
    ck_assert_int_ne(ppl_read_tokens("/nonexistent/ids", true, NULL, &ids, &n), 0);
    /* Text goes through the tokenizer, with no BOS. */
    struct fx x;
    fx_open(&x);
    struct tok *tk;
    ck_assert_int_eq(tok_from_gguf(x.gf, NULL, &tk), 0);
    const char *tp = tmp_path("text.txt");
    f = fopen(tp, "wb");
    fputs("the keeper climbed the steps", f);
    fclose(f);
    ck_assert_int_eq(ppl_read_tokens(tp, false, tk, &ids, &n), 0);
    struct tok_ids want = {0};
    ck_assert_int_eq(tok_encode(tk, "the keeper climbed the steps", 28, 0, &want), 0);
    ck_assert_uint_eq(n, want.n);
    ck_assert(memcmp(ids, want.v, n * sizeof *ids) == 0);
    free(ids);
    free(want.v);
    tok_fini(tk);
    fx_close(&x);
}
END_TEST

START_TEST(test_command)
{
    struct fx x;
    fx_open(&x);
    fx_close(&x);
    char model[1024], idp[1024];
    snprintf(model, sizeof model, "%s", tmp_path("fx.gguf"));
    snprintf(idp, sizeof idp, "%s", tmp_path("cmd-ids.bin"));
    FILE *f = fopen(idp, "wb");
    for (uint32_t i = 0; i < 20; i++) {
        uint32_t v = (i * 37) % 300;
        fwrite(&v, 4, 1, f);
    }
    fclose(f);
    const char *ok[] = {"perplexity", model,    idp,         "--ids", "--ctx",
                        "8",          "--json", "--threads", "2"};
    ck_assert_int_eq(strata_cmd_perplexity.run(9, (char **)ok), 0);
    const char *bad[] = {"perplexity", model, idp, "--ids", "--ctx", "8", "--stride", "9"};
    ck_assert_int_eq(strata_cmd_perplexity.run(8, (char **)bad), 2);
    const char *missing[] = {"perplexity", model, "/nonexistent/ids", "--ids"};
    ck_assert_int_eq(strata_cmd_perplexity.run(4, (char **)missing), 1);
    const char *help[] = {"perplexity", "--help"};
    ck_assert_int_eq(strata_cmd_perplexity.run(2, (char **)help), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("perplexity");
    TCase *tc = tcase_create("perplexity");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_windows);
    tcase_add_test(tc, test_matches_logits);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_read_tokens);
    tcase_add_test(tc, test_command);
    suite_add_tcase(s, tc);
    return test_run(s);
}
