/* spec_test — speculative decoding outside the engine (spec_seq, as `strata run` and bench use it),
 * the drafter's KV bookkeeping, prompt lookup and the adaptive count. The contract checked
 * throughout: drafts accepted or rejected, from prompt lookup, the model itself or another model,
 * greedy or sampled, a decode gives the ids of a plain loop (one token a pass), bit for bit; only
 * the number of passes changes. (engine_test checks the same of the engine's batched drafts.) */
#include "gpu-worker/spec.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "gpu-worker/backend.h"
#include "gpu-worker/sample.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CTX     256
#define MAX_GEN 48

static char g_target[600], g_other[600];

struct env {
    struct gguf_file *f;
    struct model *m;
};

static void env_open(struct env *v, const char *path)
{
    ck_assert_int_eq(gguf_open(path, &v->f), 0);
    ck_assert_msg(model_load(v->f, &v->m) == 0, "%s", strata_errdetail());
}

static void env_close(struct env *v)
{
    model_fini(v->m);
    gguf_close(v->f);
}

/* One decode: its options and what came out. */
struct run {
    const int32_t *prompt;
    uint32_t n_prompt;
    uint32_t n_predict;
    uint32_t n_ctx;    /* 0: CTX */
    uint32_t max_pass; /* the target's max_pass_tokens; 0: 64 */
    float temp;
    int32_t stop;         /* an end-of-sequence id, or -1 */
    int32_t stop_pair[2]; /* a two-token stop sequence ({-1, -1}: none) */
    /* out */
    int32_t ids[MAX_GEN];
    uint32_t n_ids;
    bool from_draft[MAX_GEN]; /* ids[i] was sampled from a draft's row (no pass before it) */
    uint64_t proposed, accepted, passes;
};

static void params(const struct run *r, struct sample_params *sp)
{
    sample_params_default(sp);
    sp->temperature = r->temp;
    sp->seed = 77;
    if (r->temp > 0) {
        sp->top_k = 40;
        sp->top_p = 0.95f;
        sp->repeat_penalty = 1.1f;
    }
}

/* stopped: the last token ends r's decode (its stop id or stop pair). */
static bool stopped(const struct run *r, const int32_t *hist, uint32_t n)
{
    if (hist[n - 1] == r->stop) return true;
    return r->stop_pair[0] >= 0 && r->n_ids >= 2 && hist[n - 2] == r->stop_pair[0] &&
           hist[n - 1] == r->stop_pair[1];
}

/* reference decodes r the plain way: one backend_eval per token. */
static void reference(const struct model *m, struct run *r)
{
    const uint32_t n_ctx = r->n_ctx ? r->n_ctx : CTX, nv = m->hp.n_vocab;
    struct backend_opts bo = {.n_threads = 1, .max_pass_tokens = 64, .n_ctx = n_ctx, .n_seq = 1};
    struct backend *be;
    ck_assert_msg(backend_start(m, &bo, &be) == 0, "%s", strata_errdetail());
    struct sample *smp;
    ck_assert_int_eq(sample_init(nv, &smp), 0);
    struct sample_params sp;
    params(r, &sp);
    float *logits = malloc(nv * sizeof *logits);
    int32_t hist[CTX + 1];
    uint32_t n = r->n_prompt;
    memcpy(hist, r->prompt, n * sizeof *hist);
    struct kv_seq seq;
    kv_seq_init(&seq);
    ck_assert_int_eq(backend_prompt(be, &seq, hist, n, 0, logits), 0);
    r->n_ids = 0;
    for (;;) {
        struct sample_result sr;
        ck_assert_int_eq(sample_token(smp, &sp, logits, hist, n, n, &sr), 0);
        hist[n++] = r->ids[r->n_ids++] = sr.id;
        if (stopped(r, hist, n) || r->n_ids == r->n_predict || n - 1 == n_ctx) break;
        struct backend_token t = {&seq, sr.id, true};
        ck_assert_int_eq(backend_eval(be, &t, 1, logits), 0);
    }
    kv_seq_fini(backend_kv(be), &seq);
    free(logits);
    sample_fini(smp);
    backend_close(be);
}

/* decode runs r as `strata run` does: after each sampled token, a pass of the token and up to
 * k_max drafts (dm: a draft model, NULL: prompt lookup), and the next positions sampled from the
 * pass's rows while the drafts match. Checks every pass's bounds and both models' KV lengths. */
static void decode(const struct model *m, const struct model *dm, uint32_t k_max, struct run *r)
{
    const uint32_t n_ctx = r->n_ctx ? r->n_ctx : CTX, nv = m->hp.n_vocab;
    const uint32_t max_pass = r->max_pass ? r->max_pass : 64;
    struct backend_opts bo = {
        .n_threads = 1, .max_pass_tokens = max_pass, .n_ctx = n_ctx, .n_seq = 1};
    struct backend *be;
    ck_assert_msg(backend_start(m, &bo, &be) == 0, "%s", strata_errdetail());
    struct spec_draft *sd = NULL;
    if (dm) {
        struct spec_draft_opts so = {.n_threads = 1, .n_ctx = n_ctx, .n_seq = 1};
        ck_assert_msg(spec_draft_start(m, dm, &so, &sd) == 0, "%s", strata_errdetail());
    }
    struct sample *smp;
    ck_assert_int_eq(sample_init(nv, &smp), 0);
    struct sample_params sp;
    params(r, &sp);
    float *logits = malloc((size_t)(1 + SPEC_MAX_DRAFT) * nv * sizeof *logits);
    int32_t hist[CTX + 1];
    uint32_t n = r->n_prompt;
    memcpy(hist, r->prompt, n * sizeof *hist);
    struct kv_seq seq;
    kv_seq_init(&seq);
    ck_assert_int_eq(backend_prompt(be, &seq, hist, n, 0, logits), 0);
    struct spec_seq ss = {.be = be, .sd = sd, .seq = &seq};
    spec_adapt_init(&ss.ad, k_max);
    r->n_ids = 0;
    bool drafted = false;
    for (uint32_t i = 0; i < r->n_predict; i++) {
        struct sample_result sr;
        ck_assert_int_eq(sample_token(smp, &sp, logits + (size_t)ss.row * nv, hist, n, n, &sr), 0);
        r->from_draft[r->n_ids] = drafted;
        hist[n++] = r->ids[r->n_ids++] = sr.id;
        if (stopped(r, hist, n) || i + 1 == r->n_predict || n - 1 == n_ctx) break;
        if ((drafted = spec_seq_take(&ss, sr.id))) continue;
        const uint32_t left = r->n_predict - i - 1;
        ck_assert_msg(spec_seq_pass(&ss, hist, n, left, n_ctx, max_pass, logits) == 0, "%s",
                      strata_errdetail());
        /* a pass never drafts past what is left to sample, the context or a pass's tokens */
        ck_assert_uint_le(ss.n_drafts + 1, left);
        ck_assert_uint_le(n + ss.n_drafts, n_ctx);
        ck_assert_uint_le(ss.n_drafts + 1, max_pass);
        ck_assert_uint_le(ss.n_drafts, k_max);
        ck_assert_uint_eq(ss.row, 0);
        /* the target holds hist and the drafts; the drafter hist and all drafts but the last */
        ck_assert_uint_eq(seq.n_tokens, n + ss.n_drafts);
        if (sd && ss.n_drafts) ck_assert_uint_eq(ss.dseq.n_tokens, n + ss.n_drafts - 1);
    }
    r->proposed = ss.proposed;
    r->accepted = ss.accepted;
    r->passes = ss.passes;
    spec_seq_fini(&ss);
    kv_seq_fini(backend_kv(be), &seq);
    free(logits);
    sample_fini(smp);
    spec_draft_close(sd);
    backend_close(be);
}

static void check_same(const struct run *want, const struct run *got, const char *what)
{
    ck_assert_msg(got->n_ids == want->n_ids, "%s: %u ids, plain %u", what, got->n_ids, want->n_ids);
    for (uint32_t i = 0; i < want->n_ids; i++)
        ck_assert_msg(got->ids[i] == want->ids[i], "%s: id %u is %d, plain %d", what, i,
                      got->ids[i], want->ids[i]);
    /* every id after the first came from a pass or an accepted draft */
    ck_assert_uint_le(got->accepted, got->proposed);
    ck_assert_uint_eq(got->n_ids - 1, got->accepted + got->passes);
}

/* a prompt of n ids that repeats a line of 7, as quoted code does: lookup finds drafts */
static void prompt_make(int32_t *p, uint32_t n, uint32_t salt)
{
    for (uint32_t i = 0; i < n; i++)
        p[i] = (int32_t)(((i % 7) * 2654435761u + salt * 97) % 500);
}

static struct run run_make(const int32_t *prompt, uint32_t n_prompt, uint32_t n_predict, float temp)
{
    return (struct run){.prompt = prompt,
                        .n_prompt = n_prompt,
                        .n_predict = n_predict,
                        .temp = temp,
                        .stop = -1,
                        .stop_pair = {-1, -1}};
}

/* Prompt lookup, the model drafting for itself and another model drafting (few accepted), with
 * 2, 4 and 8 drafts a pass, greedy and sampled: the plain loop's ids. */
START_TEST(drafts_give_the_plain_ids)
{
    struct env v, o;
    env_open(&v, g_target);
    env_open(&o, g_other);
    int32_t prompt[40];
    prompt_make(prompt, 30, (uint32_t)_i);
    const float temp = _i ? 0.8f : 0.0f;
    struct run want = run_make(prompt, 30, 40, temp);
    reference(v.m, &want);
    static const uint32_t ks[] = {2, 4, 8};
    for (int mode = 0; mode < 3; mode++)
        for (uint32_t ki = 0; ki < 3; ki++) {
            const struct model *dm = mode == 0 ? NULL : mode == 1 ? v.m : o.m;
            struct run got = run_make(prompt, 30, 40, temp);
            decode(v.m, dm, ks[ki], &got);
            char what[64];
            snprintf(what, sizeof what, "%s, k %u, temp %.1f",
                     mode == 0   ? "lookup"
                     : mode == 1 ? "self-draft"
                                 : "other draft",
                     ks[ki], temp);
            check_same(&want, &got, what);
            ck_assert_msg(got.proposed > 0, "%s: no drafts", what);
            if (mode == 1 && temp == 0) {
                /* greedy drafts of the model itself are all right */
                ck_assert_msg(got.accepted == got.proposed, "%s: %llu of %llu accepted", what,
                              (unsigned long long)got.accepted, (unsigned long long)got.proposed);
                ck_assert_uint_lt(got.passes, got.n_ids / 2);
            }
            if (mode == 2) /* another random model is mostly wrong: rejections happened */
                ck_assert_msg(got.accepted < got.proposed, "%s: every draft accepted", what);
        }
    /* k 0 is plain decoding: one pass a token, no drafts */
    struct run plain = run_make(prompt, 30, 40, temp);
    decode(v.m, v.m, 0, &plain);
    check_same(&want, &plain, "k 0");
    ck_assert_uint_eq(plain.proposed, 0);
    ck_assert_uint_eq(plain.passes, plain.n_ids - 1);
    env_close(&o);
    env_close(&v);
}
END_TEST

/* Drafts are cut to the tokens left to sample, the context and a pass's size; the ids stay. */
START_TEST(the_budget_bounds_the_drafts)
{
    struct env v;
    env_open(&v, g_target);
    int32_t prompt[40];
    prompt_make(prompt, 21, 5);
    static const struct {
        uint32_t n_predict, n_ctx, max_pass;
    } cases[] = {
        {1, 0, 0},   /* one token: no pass at all */
        {2, 0, 0},   /* one pass, with nothing left to draft for */
        {3, 0, 0},   /* at most one draft */
        {9, 0, 0},   /* the last passes shrink */
        {40, 26, 0}, /* the context ends the decode: drafts stop at its last position */
        {30, 0, 3},  /* passes of 3 tokens: 2 drafts at most */
        {30, 0, 1},  /* passes of 1 token: no drafts */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int self = 0; self < 2; self++) {
            struct run want = run_make(prompt, 21, cases[c].n_predict, 0);
            want.n_ctx = cases[c].n_ctx;
            want.max_pass = cases[c].max_pass;
            reference(v.m, &want);
            struct run got = want;
            decode(v.m, self ? v.m : NULL, SPEC_MAX_DRAFT, &got);
            char what[64];
            snprintf(what, sizeof what, "case %zu, %s", c, self ? "self-draft" : "lookup");
            check_same(&want, &got, what);
            if (cases[c].n_ctx) ck_assert_uint_eq(21 + want.n_ids, cases[c].n_ctx + 1);
            if (cases[c].max_pass == 1) ck_assert_uint_eq(got.proposed, 0);
            if (cases[c].n_predict == 1) ck_assert_uint_eq(got.passes, 0);
        }
    env_close(&v);
}
END_TEST

/* An end-of-sequence id inside a window of accepted drafts ends the decode there, and a stop
 * sequence of two ids across a window's boundary (the first the window's last, the second after
 * the next pass) ends it where the plain loop ends: the drafts computed past it are not taken. */
START_TEST(stops_inside_and_across_drafts)
{
    struct env v;
    env_open(&v, g_target);
    int32_t prompt[40];
    prompt_make(prompt, 24, 9);
    struct run free_run = run_make(prompt, 24, MAX_GEN, 0);
    decode(v.m, v.m, 4, &free_run); /* where the windows fall */
    struct run ref = run_make(prompt, 24, MAX_GEN, 0);
    reference(v.m, &ref);
    check_same(&ref, &free_run, "no stop");

    /* an id first seen inside a window, with drafts after it in the same window */
    uint32_t j = 0;
    for (uint32_t i = 1; !j && i + 1 < ref.n_ids; i++) {
        bool seen = false;
        for (uint32_t k = 0; k < i; k++)
            seen |= ref.ids[k] == ref.ids[i];
        if (!seen && free_run.from_draft[i] && free_run.from_draft[i + 1]) j = i;
    }
    ck_assert_msg(j, "no id first seen inside a window of drafts");
    struct run want = run_make(prompt, 24, MAX_GEN, 0);
    want.stop = ref.ids[j];
    reference(v.m, &want);
    ck_assert_uint_eq(want.n_ids, j + 1);
    struct run got = want;
    decode(v.m, v.m, 4, &got);
    check_same(&want, &got, "eos in a draft");

    /* a pair whose first id ends a window and whose second comes from the next pass */
    j = 0;
    for (uint32_t i = 1; !j && i + 1 < ref.n_ids; i++) {
        bool seen = false;
        for (uint32_t k = 0; k < i; k++)
            seen |= ref.ids[k] == ref.ids[i] && ref.ids[k + 1] == ref.ids[i + 1];
        if (!seen && free_run.from_draft[i] && !free_run.from_draft[i + 1]) j = i;
    }
    ck_assert_msg(j, "no window boundary inside the decode");
    want = run_make(prompt, 24, MAX_GEN, 0);
    want.stop_pair[0] = ref.ids[j];
    want.stop_pair[1] = ref.ids[j + 1];
    reference(v.m, &want);
    ck_assert_uint_eq(want.n_ids, j + 2);
    got = want;
    decode(v.m, v.m, 4, &got);
    check_same(&want, &got, "a stop pair across a boundary");
    env_close(&v);
}
END_TEST

/* greedy_next: the model's greedy continuation of hist[0..n), k ids. */
static void greedy_next(const struct model *m, const int32_t *hist, uint32_t n, uint32_t k,
                        int32_t *out)
{
    struct run r = run_make(hist, n, k, 0);
    reference(m, &r);
    ck_assert_uint_eq(r.n_ids, k);
    memcpy(out, r.ids, k * sizeof *out);
}

/* The drafter: sequences caught up in batched passes of max_pass_tokens, k passes of drafts, the
 * KV holding hist and all drafts but the last; after spec_draft_keep drops rejected drafts, the
 * next drafts are those of a fresh sequence (its KV holds no stale position). */
START_TEST(the_drafter_keeps_its_kv_right)
{
    struct env v;
    env_open(&v, g_target);
    struct spec_draft_opts so = {.n_threads = 1, .n_ctx = CTX, .n_seq = 2, .max_pass_tokens = 4};
    struct spec_draft *d;
    ck_assert_msg(spec_draft_start(v.m, v.m, &so, &d) == 0, "%s", strata_errdetail());
    int32_t h0[32], h1[8];
    prompt_make(h0, 10, 1);
    prompt_make(h1, 3, 2);
    struct spec_draft_item it[2] = {{.hist = h0, .n_hist = 10, .k = 3},
                                    {.hist = h1, .n_hist = 3, .k = 1}};
    struct kv_seq s0, s1;
    kv_seq_init(&s0);
    kv_seq_init(&s1);
    it[0].seq = &s0;
    it[1].seq = &s1;
    ck_assert_msg(spec_draft_propose(d, it, 2) == 0, "%s", strata_errdetail());
    /* catching up 9 + 2 tokens in passes of 4 is 3 passes, then 3 drafting passes */
    ck_assert_uint_eq(spec_draft_passes(d), 6);
    ck_assert_uint_eq(s0.n_tokens, 10 + 2);
    ck_assert_uint_eq(s1.n_tokens, 3);
    int32_t want[SPEC_MAX_DRAFT];
    greedy_next(v.m, h0, 10, 3, want);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(it[0].out[i], want[i]);
    greedy_next(v.m, h1, 3, 1, want);
    ck_assert_int_eq(it[1].out[0], want[0]);

    /* the first draft accepted, the second rejected: the target sampled another id there */
    h0[10] = it[0].out[0];
    h0[11] = (it[0].out[1] + 1) % (int32_t)v.m->hp.n_vocab;
    spec_draft_keep(d, &s0, 11);
    ck_assert_uint_eq(s0.n_tokens, 11);
    spec_draft_keep(d, &s0, 20); /* never grows */
    ck_assert_uint_eq(s0.n_tokens, 11);
    it[0].n_hist = 12;
    it[0].k = SPEC_MAX_DRAFT;
    ck_assert_msg(spec_draft_propose(d, it, 1) == 0, "%s", strata_errdetail());
    ck_assert_uint_eq(s0.n_tokens, 12 + SPEC_MAX_DRAFT - 1);
    greedy_next(v.m, h0, 12, SPEC_MAX_DRAFT, want);
    for (int i = 0; i < SPEC_MAX_DRAFT; i++)
        ck_assert_msg(it[0].out[i] == want[i], "draft %d is %d, fresh %d", i, it[0].out[i],
                      want[i]);
    /* a history shorter than the KV (the caller went back): the KV is cut to it first */
    it[0].n_hist = 5;
    it[0].k = 2;
    ck_assert_int_eq(spec_draft_propose(d, it, 1), 0);
    ck_assert_uint_eq(s0.n_tokens, 5 + 1);
    greedy_next(v.m, h0, 5, 2, want);
    ck_assert_int_eq(it[0].out[0], want[0]);
    ck_assert_int_eq(it[0].out[1], want[1]);

    /* bad requests are refused before any pass, with what was wrong */
    const uint64_t passes = spec_draft_passes(d);
    struct spec_draft_item three[3] = {it[0], it[1], it[1]};
    ck_assert_int_eq(spec_draft_propose(d, three, 3), STRATA_EINVAL);
    ck_assert_msg(strstr(strata_errdetail(), "3 sequences to draft for, the draft model holds 2"),
                  "%s", strata_errdetail());
    struct spec_draft_item bad = it[1];
    bad.k = 0;
    ck_assert_int_eq(spec_draft_propose(d, &bad, 1), STRATA_EINVAL);
    ck_assert_msg(strstr(strata_errdetail(), "a draft of 0 tokens after 3"), "%s",
                  strata_errdetail());
    bad.k = SPEC_MAX_DRAFT + 1;
    ck_assert_int_eq(spec_draft_propose(d, &bad, 1), STRATA_EINVAL);
    bad.k = 1;
    bad.n_hist = 0;
    ck_assert_int_eq(spec_draft_propose(d, &bad, 1), STRATA_EINVAL);
    ck_assert_uint_eq(spec_draft_passes(d), passes);
    ck_assert_uint_eq(s1.n_tokens, 3);

    spec_draft_release(d, &s0);
    spec_draft_release(d, &s1);
    ck_assert_uint_eq(s0.n_tokens, 0);
    spec_draft_close(d);
    env_close(&v);
}
END_TEST

/* Past the context the drafter fails with the backend's STRATA_ELIMIT, its KV a prefix. */
START_TEST(the_drafter_stops_at_its_context)
{
    struct env v;
    env_open(&v, g_target);
    struct spec_draft_opts so = {.n_threads = 1, .n_ctx = 12, .n_seq = 1};
    struct spec_draft *d;
    ck_assert_int_eq(spec_draft_start(v.m, v.m, &so, &d), 0);
    int32_t h[16];
    prompt_make(h, 10, 3);
    struct kv_seq s;
    kv_seq_init(&s);
    struct spec_draft_item it = {.seq = &s, .hist = h, .n_hist = 10, .k = 4};
    ck_assert_int_eq(spec_draft_propose(d, &it, 1), STRATA_ELIMIT);
    ck_assert_uint_le(s.n_tokens, 12);
    it.k = 3; /* positions 9, 10, 11: the last one there is */
    ck_assert_msg(spec_draft_propose(d, &it, 1) == 0, "%s", strata_errdetail());
    ck_assert_uint_eq(s.n_tokens, 12);
    spec_draft_release(d, &s);
    spec_draft_close(d);
    env_close(&v);
}
END_TEST

/* write_swapped copies from's tokenizer.* keys to a new GGUF `to`, tokens a and b swapped. */
static void write_swapped(const char *from, const char *to, uint64_t a, uint64_t b)
{
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open(from, &f), 0);
    struct gguf_writer *w;
    ck_assert_int_eq(gguf_writer_open(to, 0, &w), 0);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        if (strncmp(kv->key, "tokenizer.", 10) != 0) continue;
        if (strcmp(kv->key, "tokenizer.ggml.tokens") != 0) {
            ck_assert_int_eq(gguf_w_value(w, kv->key, &kv->val), 0);
            continue;
        }
        const uint64_t n = kv->val.arr.n;
        const char **strs = malloc(n * sizeof *strs);
        uint64_t *lens = malloc(n * sizeof *lens);
        for (uint64_t k = 0; k < n; k++) {
            struct gguf_str t = gguf_arr_str(&kv->val, k == a ? b : k == b ? a : k);
            strs[k] = t.ptr;
            lens[k] = t.len;
        }
        ck_assert_int_eq(gguf_w_arr_str(w, kv->key, n, strs, lens), 0);
        free(strs);
        free(lens);
    }
    ck_assert_int_eq(gguf_writer_begin(w), 0);
    ck_assert_int_eq(gguf_writer_finish(w), 0);
    gguf_close(f);
}

/* A draft model of the same vocabulary size whose tokens differ at some id is refused, the
 * message naming the first id and both tokens; the drafter does not start. */
START_TEST(a_draft_with_other_tokens_is_refused)
{
    char vpath[600], dpath[600];
    snprintf(vpath, sizeof vpath, "%s/swapped-vocab.gguf", test_tmpdir());
    snprintf(dpath, sizeof dpath, "%s/swapped-draft.gguf", test_tmpdir());
    write_swapped(g_target, vpath, 300, 301);
    struct fixture_opts fo = {.seed = 11, .vocab = vpath};
    ck_assert_msg(fixture_write(&fo, dpath) == 0, "%s", strata_errdetail());
    struct env v, d;
    env_open(&v, g_target);
    env_open(&d, dpath);
    ck_assert_uint_eq(v.m->hp.n_vocab, d.m->hp.n_vocab);
    const struct gguf_value *toks;
    ck_assert_int_eq(gguf_get_arr(v.f, "tokenizer.ggml.tokens", GGUF_STRING, &toks), 0);
    struct gguf_str t300 = gguf_arr_str(toks, 300), t301 = gguf_arr_str(toks, 301);
    char want[200];
    snprintf(want, sizeof want, "the draft model's token 300 is '%.*s', the model's '%.*s'",
             (int)t301.len, t301.ptr, (int)t300.len, t300.ptr);
    ck_assert_int_eq(spec_vocab_check(v.m, d.m), STRATA_EINVAL);
    ck_assert_msg(strstr(strata_errdetail(), want), "%s", strata_errdetail());
    struct spec_draft_opts so = {.n_ctx = CTX};
    struct spec_draft *sd = (struct spec_draft *)&sd;
    ck_assert_int_eq(spec_draft_start(v.m, d.m, &so, &sd), STRATA_EINVAL);
    ck_assert_int_eq(spec_vocab_check(v.m, v.m), 0);
    env_close(&d);
    env_close(&v);
    unlink(vpath);
    unlink(dpath);
}
END_TEST

START_TEST(lookup_edges)
{
    int32_t out[SPEC_MAX_DRAFT];
    const int32_t two[] = {5, 5};
    ck_assert_uint_eq(spec_lookup(two, 2, 4, out), 1); /* a 1-gram: 5 followed by 5 */
    ck_assert_int_eq(out[0], 5);
    ck_assert_uint_eq(spec_lookup(two, 2, 0, out), 0); /* no drafts wanted */
    ck_assert_uint_eq(spec_lookup(two, 0, 4, out), 0);
    /* drafts end with the history */
    const int32_t h[] = {1, 2, 3, 1, 2};
    ck_assert_uint_eq(spec_lookup(h, 5, SPEC_MAX_DRAFT, out), 3);
    ck_assert_int_eq(out[0], 3);
    ck_assert_int_eq(out[1], 1);
    ck_assert_int_eq(out[2], 2);
    /* the most recent occurrence of a gram */
    const int32_t r[] = {7, 1, 7, 2, 7};
    ck_assert_uint_eq(spec_lookup(r, 5, 1, out), 1);
    ck_assert_int_eq(out[0], 2);
    /* a longer gram wins over a more recent shorter one */
    const int32_t g[] = {4, 2, 3, 9, 1, 3, 7, 2, 3};
    ck_assert_uint_eq(spec_lookup(g, 9, 1, out), 1);
    ck_assert_int_eq(out[0], 9);
    /* a run of one id overlaps itself */
    const int32_t run[] = {5, 5, 5, 5};
    ck_assert_uint_eq(spec_lookup(run, 4, 4, out), 1);
    ck_assert_int_eq(out[0], 5);
}
END_TEST

START_TEST(adapt_edges)
{
    struct spec_adapt a;
    spec_adapt_init(&a, 0); /* max 0: never drafts, whatever it learns */
    ck_assert_uint_eq(spec_adapt_want(&a), 0);
    spec_adapt_update(&a, 1, 1);
    ck_assert_uint_eq(spec_adapt_want(&a), 0);
    /* rests in a row double from SPEC_REST up to SPEC_REST_MAX, and stay there */
    spec_adapt_init(&a, 1);
    uint32_t want_rest = SPEC_REST;
    for (int r = 0; r < 6; r++) {
        ck_assert_uint_eq(spec_adapt_want(&a), 1);
        spec_adapt_update(&a, 1, 0);
        for (uint32_t s = 0; s < want_rest; s++)
            ck_assert_uint_eq(spec_adapt_want(&a), 0);
        want_rest = want_rest * 2 > SPEC_REST_MAX ? SPEC_REST_MAX : want_rest * 2;
    }
    /* a partial acceptance keeps k and ends the doubling */
    ck_assert_uint_eq(spec_adapt_want(&a), 1);
    spec_adapt_init(&a, 4);
    spec_adapt_update(&a, 4, 2);
    ck_assert_uint_eq(spec_adapt_want(&a), 4);
    spec_adapt_update(&a, 4, 0);
    ck_assert_uint_eq(spec_adapt_want(&a), 2);
}
END_TEST

int main(void)
{
    snprintf(g_target, sizeof g_target, "%s/spec-target.gguf", test_tmpdir());
    snprintf(g_other, sizeof g_other, "%s/spec-other.gguf", test_tmpdir());
    struct fixture_opts to = {.seed = 11}, oo = {.arch = "olmoe", .seed = 4};
    if (fixture_write(&to, g_target) != 0 || fixture_write(&oo, g_other) != 0) {
        fprintf(stderr, "fixture: %s\n", strata_errdetail());
        return 1;
    }
    Suite *s = suite_create("spec");
    TCase *tc = tcase_create("spec");
    tcase_set_timeout(tc, 300); /* Debug + ASan builds on a loaded machine run ~20x slower */
    tcase_add_loop_test(tc, drafts_give_the_plain_ids, 0, 2);
    tcase_add_test(tc, the_budget_bounds_the_drafts);
    tcase_add_test(tc, stops_inside_and_across_drafts);
    tcase_add_test(tc, the_drafter_keeps_its_kv_right);
    tcase_add_test(tc, the_drafter_stops_at_its_context);
    tcase_add_test(tc, a_draft_with_other_tokens_is_refused);
    tcase_add_test(tc, lookup_edges);
    tcase_add_test(tc, adapt_edges);
    suite_add_tcase(s, tc);
    int rv = test_run(s);
    unlink(g_target);
    unlink(g_other);
    return rv;
}
