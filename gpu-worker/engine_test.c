#include "gpu-worker/engine.h"
#include "common/base/err.h"
#include "gpu-worker/backend.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <math.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Every test compares the engine's ids with a plain loop (fwd_prompt, then one fwd_eval and one
 * sample_token per token, alone in its own cache): in bit-exact mode batching, chunking,
 * preemption, the prefix cache and resubmission must not change a single id. */

#define CTX     512
#define MAX_GEN 64

static char g_path[600];

struct env {
    struct gguf_file *f;
    struct model *m;
};

static void env_open_path(struct env *v, const char *path)
{
    ck_assert_int_eq(gguf_open(path, &v->f), 0);
    ck_assert_msg(model_load(v->f, &v->m) == 0, "%s", strata_errdetail());
}

static void env_open(struct env *v)
{
    env_open_path(v, g_path);
}

static void env_close(struct env *v)
{
    model_fini(v->m);
    gguf_close(v->f);
}

struct job {
    char id[32];
    int32_t prompt[200];
    uint32_t n_prompt;
    struct engine_req q;
    int32_t want[MAX_GEN]; /* the plain loop's ids */
    uint32_t n_want;
    int32_t got[MAX_GEN];
    uint32_t n_got;
    struct engine_update u;
};

/* reference generates what q asks for, the plain way. */
static void reference(const struct model *m, const struct engine_req *q, int32_t *ids,
                      uint32_t *n_ids)
{
    struct kv_cache *kv;
    struct backend *f;
    struct sample *s;
    struct backend_opts fo = {.n_threads = 1, .max_pass_tokens = 64, .n_ctx = CTX, .n_seq = 1};
    ck_assert_int_eq(backend_start(m, &fo, &f), 0);
    kv = backend_kv(f);
    ck_assert_int_eq(sample_init(m->hp.n_vocab, &s), 0);
    float *logits = malloc(m->hp.n_vocab * sizeof *logits);
    int32_t hist[CTX];
    uint32_t n = q->n_prompt, gen0 = q->n_prompt - q->n_generated;
    memcpy(hist, q->prompt, n * sizeof *hist);
    struct kv_seq seq;
    kv_seq_init(&seq);
    ck_assert_int_eq(backend_prompt(f, &seq, hist, n, 0, logits), 0);
    *n_ids = 0;
    for (;;) {
        uint32_t w0 = n - gen0 > ENGINE_PENALTY_WINDOW ? n - ENGINE_PENALTY_WINDOW : gen0;
        struct sample_result r;
        ck_assert_int_eq(sample_token(s, &q->sp, logits, hist + w0, n - w0, n, &r), 0);
        hist[n++] = ids[(*n_ids)++] = r.id;
        bool stop = false;
        for (uint32_t i = 0; i < q->n_stop; i++)
            stop |= q->stop[i] == r.id;
        if (stop || *n_ids == q->max_tokens || n == CTX) break;
        struct backend_token t = {&seq, r.id, true};
        ck_assert_int_eq(backend_eval(f, &t, 1, logits), 0);
    }
    kv_seq_fini(kv, &seq);
    free(logits);
    sample_fini(s);
    backend_close(f);
}

/* job_make: a prompt of n ids drawn from salt; greedy when temp is 0. */
static void job_make(struct job *j, const char *id, uint32_t n, uint32_t salt, float temp,
                     uint32_t max_tokens)
{
    memset(j, 0, sizeof *j);
    snprintf(j->id, sizeof j->id, "%s", id);
    for (uint32_t i = 0; i < n; i++)
        j->prompt[i] = (int32_t)((i * 2654435761u + salt * 97) % 512);
    j->n_prompt = n;
    sample_params_default(&j->q.sp);
    j->q.sp.temperature = temp;
    j->q.sp.seed = 1000 + salt;
    if (temp > 0) {
        j->q.sp.top_k = 40;
        j->q.sp.top_p = 0.95f;
        j->q.sp.repeat_penalty = 1.1f;
        j->q.sp.presence_penalty = 0.2f;
    }
    j->q.id = j->id;
    j->q.prompt = j->prompt;
    j->q.n_prompt = n;
    j->q.max_tokens = max_tokens;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* drain polls j until it finishes (or timeout_s passes), collecting its ids. */
static void drain(struct engine *e, struct job *j, double timeout_s)
{
    struct engine_token t[8];
    double end = now_s() + timeout_s;
    for (;;) {
        j->u.toks = t;
        j->u.cap = 8; /* small: drain must page through from */
        ck_assert_int_eq(engine_poll(e, j->id, j->n_got, &j->u), 0);
        /* every poll's timings are durations: never negative (the clock read before the lock
         * once gave a prefill_ms of -0.03 ms, which the client refuses, failing the poll) */
        ck_assert_msg(j->u.t.queue_ms >= 0 && j->u.t.prefill_ms >= 0 && j->u.t.decode_ms >= 0,
                      "%s: queue %g, prefill %g, decode %g ms", j->id, j->u.t.queue_ms,
                      j->u.t.prefill_ms, j->u.t.decode_ms);
        for (uint32_t i = 0; i < j->u.n; i++) {
            ck_assert_uint_lt(j->n_got, MAX_GEN);
            j->got[j->n_got++] = t[i].id;
        }
        if (j->u.finish != ENGINE_FINISH_NONE) return;
        ck_assert_msg(now_s() < end, "request %s not done after %.0f s (%u tokens)", j->id,
                      timeout_s, j->n_got);
        if (!j->u.n) usleep(1000);
    }
}

static void check_same(const struct job *j)
{
    ck_assert_msg(j->u.finish == ENGINE_FINISH_LENGTH || j->u.finish == ENGINE_FINISH_STOP,
                  "%s finished %d: %s", j->id, j->u.finish, j->u.error_msg);
    ck_assert_uint_eq(j->n_got, j->n_want);
    for (uint32_t i = 0; i < j->n_want; i++)
        ck_assert_msg(j->got[i] == j->want[i], "%s: token %u is %d, alone %d", j->id, i, j->got[i],
                      j->want[i]);
}

static struct engine *start(struct env *v, struct engine_opts *o)
{
    if (!o->n_ctx) o->n_ctx = CTX;
    /* run_all drains one job at a time: the others' leases must outlast that on a loaded machine
     * under sanitizers (the default 10 s did not), or they lapse and are forgotten */
    if (!o->orphan_timeout_ms) o->orphan_timeout_ms = 600 * 1000;
    struct engine *e;
    ck_assert_msg(engine_start(v->m, o, &e) == 0, "%s", strata_errdetail());
    return e;
}

/* run_all submits every job at once, drains them and checks each against its reference. */
static void run_all(struct engine *e, struct env *v, struct job *jobs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        reference(v->m, &jobs[i].q, jobs[i].want, &jobs[i].n_want);
    for (uint32_t i = 0; i < n; i++)
        ck_assert_msg(engine_submit(e, &jobs[i].q) == 0, "%s", strata_errdetail());
    for (uint32_t i = 0; i < n; i++)
        drain(e, &jobs[i], 60);
    for (uint32_t i = 0; i < n; i++)
        check_same(&jobs[i]);
}

static atomic_uint g_windows;
static atomic_ulong g_heat;

static void on_window(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&g_windows, 1);
}

static void on_route(void *ctx, uint32_t layer, uint32_t expert, uint32_t n)
{
    (void)ctx;
    ck_assert_uint_lt(layer, 2);
    ck_assert_uint_lt(expert, 8);
    atomic_fetch_add(&g_heat, n);
}

START_TEST(sixteen_concurrent_requests_give_their_lone_ids)
{
    struct env v;
    env_open(&v);
    static struct job jobs[16];
    for (uint32_t i = 0; i < 16; i++) {
        char id[16];
        snprintf(id, sizeof id, "c%u", i);
        /* Prompts of 3..78 ids (past two KV blocks), half sampled at temperature 0.9. */
        job_make(&jobs[i], id, 3 + i * 5, i, i % 2 ? 0.9f : 0.0f, 10 + i % 5);
    }
    struct engine_opts o = {
        .max_running = 16, .max_batch_tokens = 48, .on_window = on_window, .on_route = on_route};
    struct engine *e = start(&v, &o);
    run_all(e, &v, jobs, 16);
    struct engine_status st;
    engine_status(e, &st);
    uint32_t gen = 0, prompt = 0;
    for (uint32_t i = 0; i < 16; i++)
        gen += jobs[i].n_got, prompt += jobs[i].n_prompt;
    ck_assert_uint_eq(st.tokens_generated, gen);
    ck_assert_uint_eq(st.tokens_prefilled + st.prefix_hits, prompt);
    /* 48 tokens a window: prompts and steps shared windows, far fewer than one per token. */
    ck_assert_uint_lt(st.windows, (gen + prompt) / 4);
    ck_assert_uint_ge(st.windows, (gen + prompt - 1) / 48);
    ck_assert_uint_gt(atomic_load(&g_heat), 0);
    ck_assert_uint_eq(st.running, 0);
    ck_assert_uint_eq(st.finished, 16);
    ck_assert_uint_eq(st.kv_blocks_used, 0);
    /* The hook and the epoch follow the window just after the lock that published its tokens. */
    ck_assert_uint_ge(engine_epoch(e) + 1, st.windows);
    engine_close(e);
    ck_assert_uint_ge(atomic_load(&g_windows), st.windows);
    env_close(&v);
}
END_TEST

static void preemption_case(bool prefix_cache)
{
    struct env v;
    env_open(&v);
    static struct job jobs[6];
    for (uint32_t i = 0; i < 6; i++) {
        char id[16];
        snprintf(id, sizeof id, "p%u", i);
        job_make(&jobs[i], id, 40 + i, 50 + i, i % 2 ? 0.7f : 0.0f, 40);
    }
    /* 8 blocks of 32 positions; each request ends at 80 positions (3 blocks): 18 > 8. */
    struct engine_opts o = {.max_running = 6,
                            .kv_blocks = 8,
                            .max_batch_tokens = 64,
                            .reserve_pct = 1,
                            .no_prefix_cache = !prefix_cache,
                            /* with the prefix cache, drafts by the model itself too: preempted
                             * requests drop their draft KV and catch up when readmitted */
                            .draft = prefix_cache ? v.m : NULL};
    struct engine *e = start(&v, &o);
    run_all(e, &v, jobs, 6);
    struct engine_status st;
    engine_status(e, &st);
    ck_assert_uint_gt(st.preemptions, 0);
    uint32_t preempted = 0;
    for (uint32_t i = 0; i < 6; i++)
        preempted += jobs[i].u.t.n_preempted;
    ck_assert_uint_eq(preempted, st.preemptions);
    if (!prefix_cache) ck_assert_uint_eq(st.prefix_hits, 0);
    if (prefix_cache) ck_assert_uint_gt(st.drafts_accepted, 0);
    engine_close(e);
    env_close(&v);
}

/* Speculative decoding by prompt lookup: drafts verified in one window give the same ids as
 * plain decoding, greedy and sampled (with penalties), beside requests without drafts, and with
 * the expert cache's async tier swapping under them. */
START_TEST(drafts_give_the_same_ids)
{
    struct env v;
    env_open(&v);
    static struct job jobs[8];
    for (uint32_t i = 0; i < 8; i++) {
        char id[16];
        snprintf(id, sizeof id, "d%u", i);
        job_make(&jobs[i], id, 12 + i * 3, i, i % 2 ? 0.8f : 0.0f, 40);
        /* a prompt that repeats itself, as code edits and quotes do: lookup finds drafts */
        for (uint32_t k = 6; k < jobs[i].n_prompt; k++)
            jobs[i].prompt[k] = jobs[i].prompt[k % 6];
    }
    const struct backend_opts cache = {
        .expert_cache = {CACHE_SLOTS, 5},
        .tier = {.every = 1, .swaps = 4, .decay = 0.9f, .min_count = 0.5f, .lead = 0.25f,
                 .async = _i == 1}};
    struct engine_opts o = {.max_running = 8, .max_batch_tokens = 64, .spec_lookup = 4,
                            .backend = _i ? cache : (struct backend_opts){0}};
    struct engine *e = start(&v, &o);
    run_all(e, &v, jobs, 8);
    struct engine_status st;
    engine_status(e, &st);
    ck_assert_uint_gt(st.drafts_proposed, 0);
    ck_assert_uint_gt(st.drafts_accepted, 0);
    ck_assert_uint_gt(st.decode_tokens, st.decode_passes); /* more than a token per pass */
    printf("drafts: %llu of %llu accepted, %.2f tokens per decode pass\n",
           (unsigned long long)st.drafts_accepted, (unsigned long long)st.drafts_proposed,
           (double)st.decode_tokens / (double)st.decode_passes);
    engine_close(e);
    env_close(&v);
}
END_TEST

/* A draft model: for each of the four architectures as the target, drafts from the model itself
 * (most accepted) and from a fixture of another architecture and seed sharing the vocabulary
 * (few accepted) give the plain loop's ids, greedy and sampled, six streams at once, with the
 * expert cache smaller than the model and its async tier swapping; the rejected drafts' KV goes
 * in both models (a wrong draft KV would only lower acceptance, so the self-draft's acceptance
 * is checked too). */
static const char *const g_archs[] = {"qwen3moe", "llama", "olmoe", "qwen2moe"};

START_TEST(a_draft_model_gives_the_same_ids)
{
    char tpath[600], dpath[600];
    snprintf(tpath, sizeof tpath, "%s/spec-target-%d.gguf", test_tmpdir(), _i);
    snprintf(dpath, sizeof dpath, "%s/spec-draft-%d.gguf", test_tmpdir(), _i);
    struct fixture_opts to = {.arch = g_archs[_i], .seed = 21 + _i};
    struct fixture_opts dop = {.arch = g_archs[(_i + 1) % 4], .seed = 91 + _i};
    ck_assert_msg(fixture_write(&to, tpath) == 0, "%s", strata_errdetail());
    ck_assert_msg(fixture_write(&dop, dpath) == 0, "%s", strata_errdetail());
    struct env v, d;
    env_open_path(&v, tpath);
    env_open_path(&d, dpath);
    static struct job jobs[6];
    for (int self = 1; self >= 0; self--) {
        for (uint32_t i = 0; i < 6; i++) {
            char id[16];
            snprintf(id, sizeof id, "m%u", i);
            job_make(&jobs[i], id, 5 + i * 4, i + 3 * _i, i % 2 ? 0.8f : 0.0f, 28);
        }
        const struct backend_opts cache = {
            .expert_cache = {CACHE_SLOTS, 5},
            .tier = {.every = 1, .swaps = 4, .decay = 0.9f, .min_count = 0.5f, .lead = 0.25f,
                     .async = true}};
        struct engine_opts o = {.max_running = 6, .max_batch_tokens = 40, .spec_draft = 4,
                                .draft = self ? v.m : d.m, .backend = cache};
        struct engine *e = start(&v, &o);
        run_all(e, &v, jobs, 6);
        struct engine_status st;
        engine_status(e, &st);
        ck_assert_str_eq(st.spec, "draft");
        ck_assert_uint_gt(st.drafts_proposed, 0);
        ck_assert_uint_gt(st.draft_passes, 0);
        uint32_t nd = 0, na = 0, gen = 0, passes = 0;
        for (uint32_t i = 0; i < 6; i++) {
            nd += jobs[i].u.t.n_draft;
            na += jobs[i].u.t.n_draft_accepted;
            gen += jobs[i].n_got;
            passes += jobs[i].u.t.n_passes;
        }
        /* the requests' own counts add up to the engine's */
        ck_assert_uint_eq(nd, st.drafts_proposed);
        ck_assert_uint_eq(na, st.drafts_accepted);
        ck_assert_uint_eq(passes, st.decode_passes);
        /* a first token comes from a prefill pass, or from a decode-like pass when the prompt's
         * last chunk was one token */
        ck_assert_uint_ge(gen, st.decode_tokens);
        ck_assert_uint_le(gen, st.decode_tokens + 6);
        if (self) {
            /* greedy requests accept every draft of their own model */
            ck_assert_uint_gt(st.decode_tokens, 2 * st.decode_passes);
            for (uint32_t i = 0; i < 6; i += 2)
                ck_assert_msg(jobs[i].u.t.n_draft_accepted == jobs[i].u.t.n_draft,
                              "%s: %u of %u drafts of the model itself accepted", jobs[i].id,
                              jobs[i].u.t.n_draft_accepted, jobs[i].u.t.n_draft);
        }
        printf("%s, draft %s: %llu of %llu accepted, %.2f tokens per decode pass\n", g_archs[_i],
               self ? "itself" : g_archs[(_i + 1) % 4], (unsigned long long)st.drafts_accepted,
               (unsigned long long)st.drafts_proposed,
               (double)st.decode_tokens / (double)st.decode_passes);
        engine_close(e);
    }
    env_close(&d);
    env_close(&v);
    unlink(tpath);
    unlink(dpath);
}
END_TEST

/* The bundled demo model (a trained one: its drafts are right as often as real text makes them):
 * prompt lookup and the model drafting for itself give the plain loop's ids, greedy and sampled,
 * six streams at once. */
START_TEST(the_demo_model_with_drafts)
{
    const char *path = STRATA_SOURCE_DIR "/models/demo.gguf";
    if (access(path, R_OK) != 0) {
        printf("SKIP: %s is not there\n", path);
        return;
    }
    struct env v;
    env_open_path(&v, path);
    static struct job jobs[6];
    for (int mode = 0; mode < 2; mode++) {
        for (uint32_t i = 0; i < 6; i++) {
            char id[16];
            snprintf(id, sizeof id, "demo%u", i);
            job_make(&jobs[i], id, 24 + i * 5, 40 + i, i % 2 ? 0.7f : 0.0f, 48);
            for (uint32_t k = 0; k < jobs[i].n_prompt; k++) /* a repeated line of the vocabulary */
                jobs[i].prompt[k] = (int32_t)(300 + (k % 9) * 37 + i);
        }
        struct engine_opts o = {.max_running = 6, .max_batch_tokens = 64};
        if (mode == 0)
            o.spec_lookup = 4;
        else
            o.draft = v.m;
        struct engine *e = start(&v, &o);
        run_all(e, &v, jobs, 6);
        struct engine_status st;
        engine_status(e, &st);
        ck_assert_uint_gt(st.drafts_accepted, 0);
        printf("demo, %s: %llu of %llu drafts accepted, %.2f tokens per decode pass\n",
               mode ? "draft itself" : "lookup 4", (unsigned long long)st.drafts_accepted,
               (unsigned long long)st.drafts_proposed,
               (double)st.decode_tokens / (double)st.decode_passes);
        engine_close(e);
    }
    env_close(&v);
}
END_TEST

/* A draft model of another vocabulary is refused at start: one of another size with both sizes
 * in the message; fixtures of other architectures and seeds share the built-in one. */
START_TEST(a_draft_of_another_vocabulary_is_refused)
{
    char dpath[600];
    snprintf(dpath, sizeof dpath, "%s/spec-vocab.gguf", test_tmpdir());
    struct env v, d, o2;
    env_open(&v);
    struct fixture_opts dop = {.seed = 3, .vocab = STRATA_SOURCE_DIR "/models/demo-tokenizer.gguf"};
    ck_assert_msg(fixture_write(&dop, dpath) == 0, "%s", strata_errdetail());
    env_open_path(&d, dpath);
    ck_assert_uint_ne(d.m->hp.n_vocab, v.m->hp.n_vocab);
    char want[128];
    snprintf(want, sizeof want, "a vocabulary of %u tokens, the model %u", d.m->hp.n_vocab,
             v.m->hp.n_vocab);
    struct engine_opts o = {.draft = d.m, .max_running = 2, .n_ctx = CTX};
    struct engine *e = NULL;
    ck_assert_int_eq(engine_start(v.m, &o, &e), STRATA_EINVAL);
    ck_assert_msg(strstr(strata_errdetail(), want), "%s", strata_errdetail());
    ck_assert_ptr_null(e);
    struct fixture_opts oo = {.arch = "olmoe", .seed = 4};
    ck_assert_int_eq(fixture_write(&oo, dpath), 0);
    env_open_path(&o2, dpath);
    ck_assert_int_eq(spec_vocab_check(v.m, o2.m), 0);
    env_close(&o2);
    env_close(&d);
    env_close(&v);
    unlink(dpath);
}
END_TEST

/* spec_lookup and the adaptive count. */
START_TEST(lookup_and_adapt)
{
    const int32_t h[] = {1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 2, 3, 4};
    int32_t out[8];
    /* the last 3 (2 3 4) last seen at 6..8, followed by 7 8 2 3 4 */
    ck_assert_uint_eq(spec_lookup(h, 14, 4, out), 4);
    ck_assert_int_eq(out[0], 7);
    ck_assert_int_eq(out[1], 8);
    ck_assert_int_eq(out[3], 3);
    const int32_t g[] = {5, 6, 7, 6};
    ck_assert_uint_eq(spec_lookup(g, 4, 4, out), 2); /* a 1-gram: 6 at 1, then 7 6 */
    ck_assert_int_eq(out[0], 7);
    const int32_t none[] = {1, 2, 3};
    ck_assert_uint_eq(spec_lookup(none, 3, 4, out), 0);
    ck_assert_uint_eq(spec_lookup(none, 1, 4, out), 0);
    struct spec_adapt a;
    spec_adapt_init(&a, 6);
    ck_assert_uint_eq(spec_adapt_want(&a), 6);
    spec_adapt_update(&a, 6, 6);
    ck_assert_uint_eq(spec_adapt_want(&a), 6); /* at most max */
    spec_adapt_update(&a, 6, 3);
    ck_assert_uint_eq(spec_adapt_want(&a), 6);
    spec_adapt_update(&a, 6, 0);
    ck_assert_uint_eq(spec_adapt_want(&a), 3);
    spec_adapt_update(&a, 3, 3);
    ck_assert_uint_eq(spec_adapt_want(&a), 4);
    spec_adapt_update(&a, 0, 0); /* no drafts (nothing to look up): nothing learnt */
    ck_assert_uint_eq(spec_adapt_want(&a), 4);
    spec_adapt_update(&a, 4, 0);
    spec_adapt_update(&a, 2, 0);
    ck_assert_uint_eq(spec_adapt_want(&a), 1);
    /* one wasted draft: rest, twice as long each time in a row, until a draft is accepted */
    const uint32_t rests[] = {SPEC_REST, 2 * SPEC_REST, 4 * SPEC_REST, SPEC_REST_MAX,
                              SPEC_REST_MAX, SPEC_REST};
    for (int r = 0; r < 6; r++) {
        if (r == 5) spec_adapt_update(&a, 1, 1); /* accepted: k 2, the rest back to the first */
        if (r == 5) spec_adapt_update(&a, 2, 0); /* k 1 */
        spec_adapt_update(&a, 1, 0);
        for (uint32_t i = 0; i < rests[r]; i++)
            ck_assert_uint_eq(spec_adapt_want(&a), 0);
        ck_assert_uint_eq(spec_adapt_want(&a), 1);
    }
}
END_TEST

/* Commands from another thread (the service's vram op, quiesce) run on the decode thread between
 * windows while requests decode; their answers come back with the backend's detail, and the
 * requests' ids are unchanged. */
struct cmd_run {
    struct engine *e;
    int n_quiesce, n_resize;
    char resize_msg[256];
};

static void *commands(void *arg)
{
    struct cmd_run *c = arg;
    for (int i = 0; i < 40; i++) {
        if (engine_quiesce(c->e) == 0) c->n_quiesce++;
        if (engine_resize(c->e, 1u << 20) == STRATA_EUNSUPPORTED) {
            c->n_resize++;
            snprintf(c->resize_msg, sizeof c->resize_msg, "%s", strata_errdetail());
        }
    }
    return NULL;
}

START_TEST(commands_run_between_windows)
{
    struct env v;
    env_open(&v);
    static struct job jobs[6];
    for (uint32_t i = 0; i < 6; i++) {
        char id[16];
        snprintf(id, sizeof id, "m%u", i);
        job_make(&jobs[i], id, 5 + i * 7, i, 0.0f, 12);
    }
    struct engine_opts o = {.max_running = 6, .max_batch_tokens = 16};
    struct engine *e = start(&v, &o);
    struct backend_info bi;
    engine_backend_info(e, &bi);
    ck_assert_str_eq(bi.name, "cpu");
    ck_assert(bi.bit_exact);
    ck_assert_int_eq(bi.kv_type, KV_F32);
    struct cmd_run c = {.e = e};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, commands, &c), 0);
    run_all(e, &v, jobs, 6);
    pthread_join(th, NULL);
    ck_assert_int_eq(c.n_quiesce, 40);
    ck_assert_int_eq(c.n_resize, 40);
    ck_assert_ptr_nonnull(strstr(c.resize_msg, "--expert-cache"));
    engine_backend_info(e, &bi);
    ck_assert_uint_gt(bi.kv_bytes, 0); /* storage made for the blocks the requests used */
    engine_close(e);
    env_close(&v);
}
END_TEST

START_TEST(preemption_under_a_tiny_pool_keeps_the_ids)
{
    preemption_case(false);
}
END_TEST

START_TEST(preemption_with_the_prefix_cache_keeps_the_ids)
{
    preemption_case(true);
}
END_TEST

START_TEST(a_follow_up_turn_prefills_only_its_new_tokens)
{
    struct env v;
    env_open(&v);
    static struct job a, b;
    job_make(&a, "turn1", 70, 7, 0.0f, 10);
    struct engine_opts o = {.max_running = 4};
    struct engine *e = start(&v, &o);
    run_all(e, &v, &a, 1);
    /* The next turn: the conversation so far (70 + 10 ids) plus 20 new ones. The first turn's
     * cache holds 79 positions (its last id was never fed): two full blocks. */
    job_make(&b, "turn2", 100, 0, 0.0f, 10);
    memcpy(b.prompt, a.prompt, 70 * sizeof *b.prompt);
    memcpy(b.prompt + 70, a.got, 10 * sizeof *b.prompt);
    run_all(e, &v, &b, 1);
    ck_assert_uint_eq(b.u.t.n_cached, 64);
    ck_assert_uint_eq(b.u.t.n_prefilled, 100);
    struct engine_status st;
    engine_status(e, &st);
    ck_assert_uint_eq(st.prefix_hits, 64);
    ck_assert_uint_eq(st.tokens_prefilled, 70 + 36);
    ck_assert_uint_eq(st.kv_blocks_cached, 3); /* turn 1's two, turn 2's third */
    ck_assert(b.u.t.queue_ms >= 0 && b.u.t.prefill_ms > 0 && b.u.t.decode_ms > 0);
    /* The same prompt again: all but the block holding its last position comes from the cache. */
    static struct job c;
    job_make(&c, "again", 100, 0, 0.0f, 10);
    memcpy(c.prompt, b.prompt, sizeof c.prompt);
    run_all(e, &v, &c, 1);
    ck_assert_uint_eq(c.u.t.n_cached, 96);
    engine_close(e);
    env_close(&v);
}
END_TEST

START_TEST(a_resumed_request_continues_the_same_ids)
{
    struct env v;
    env_open(&v);
    struct engine_opts o = {.max_running = 4};
    struct engine *e = start(&v, &o);
    for (int sampled = 0; sampled < 2; sampled++) {
        static struct job full, rest;
        job_make(&full, sampled ? "full-t" : "full-g", 20, 3, sampled ? 1.0f : 0.0f, 24);
        full.q.sp.repeat_penalty = 1.3f;
        full.q.sp.frequency_penalty = 0.5f;
        run_all(e, &v, &full, 1);
        /* A worker restart after 9 tokens: the frontend resubmits prompt + those 9. */
        job_make(&rest, sampled ? "rest-t" : "rest-g", 29, 3, sampled ? 1.0f : 0.0f, 15);
        rest.q.sp = full.q.sp;
        memcpy(rest.prompt, full.prompt, 20 * sizeof *rest.prompt);
        memcpy(rest.prompt + 20, full.got, 9 * sizeof *rest.prompt);
        rest.q.n_generated = 9;
        ck_assert_int_eq(engine_submit(e, &rest.q), 0);
        drain(e, &rest, 60);
        ck_assert_uint_eq(rest.n_got, 15);
        for (uint32_t i = 0; i < 15; i++)
            ck_assert_int_eq(rest.got[i], full.got[9 + i]);
        ck_assert_uint_eq(rest.u.seed, full.q.sp.seed);
    }
    engine_close(e);
    env_close(&v);
}
END_TEST

START_TEST(a_lapsed_lease_cancels_and_polls_keep_it)
{
    struct env v;
    env_open(&v);
    /* The fixture's whole context: both would run for seconds (4086 tokens) if not stopped. */
    struct engine_opts o = {.n_ctx = 4096, .max_running = 2, .orphan_timeout_ms = 400};
    struct engine *e = start(&v, &o);
    static struct job kept, lost;
    job_make(&kept, "kept", 10, 1, 0.0f, 0);
    job_make(&lost, "lost", 10, 2, 0.0f, 0);
    ck_assert_int_eq(engine_submit(e, &kept.q), 0);
    ck_assert_int_eq(engine_submit(e, &lost.q), 0);
    struct engine_status st;
    struct engine_token t[4];
    double end = now_s() + 60; /* generous: a loaded machine makes each window slow */
    do {
        usleep(20000);
        kept.u.toks = t;
        kept.u.cap = 4;
        ck_assert_int_eq(engine_poll(e, "kept", 0, &kept.u), 0);
        engine_status(e, &st);
        ck_assert(now_s() < end);
    } while (st.lapsed == 0); /* "lost" is never polled: its lease lapses */
    ck_assert_int_eq(engine_poll(e, "lost", 0, &lost.u), STRATA_ENOENT);
    ck_assert_uint_eq(st.lapsed, 1);
    ck_assert_int_eq(kept.u.finish, ENGINE_FINISH_NONE);
    ck_assert_uint_gt(kept.u.n_total, 0);
    engine_status(e, &st);
    ck_assert_uint_eq(st.running + st.queued, 1);
    engine_close(e);
    env_close(&v);
}
END_TEST

START_TEST(duplicate_cancel_busy_and_refusals)
{
    struct env v;
    env_open(&v);
    struct engine_opts o = {.max_running = 1, .max_queue = 2};
    struct engine *e = start(&v, &o);
    static struct job a, b, c, d, dup;
    job_make(&a, "a", 10, 1, 0.0f, 0);
    job_make(&b, "b", 10, 2, 0.0f, 5);
    job_make(&c, "c", 10, 3, 0.0f, 5);
    job_make(&d, "d", 10, 4, 0.0f, 5);
    ck_assert_int_eq(engine_submit(e, &a.q), 0);
    /* A resend of "a" with other contents is the same request. */
    job_make(&dup, "a", 30, 9, 0.0f, 3);
    ck_assert_int_eq(engine_submit(e, &dup.q), 0);
    struct engine_status st;
    double end = now_s() + 10;
    do {
        usleep(1000);
        engine_status(e, &st);
        ck_assert(now_s() < end);
    } while (st.running != 1);
    ck_assert_uint_eq(st.queued, 0);
    ck_assert_int_eq(engine_submit(e, &b.q), 0);
    ck_assert_int_eq(engine_submit(e, &c.q), 0);
    ck_assert_int_eq(engine_submit(e, &d.q), STRATA_EBUSY);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "2 requests are waiting"));
    ck_assert_int_eq(engine_poll(e, "d", 0, &d.u), STRATA_ENOENT);
    engine_status(e, &st);
    ck_assert_uint_eq(st.queued, 2);

    /* Cancel "a" once it has produced tokens; they stay pollable. */
    struct engine_token t[4];
    do {
        usleep(1000);
        a.u.toks = t;
        a.u.cap = 4;
        ck_assert_int_eq(engine_poll(e, "a", 0, &a.u), 0);
    } while (a.u.n_total < 3);
    ck_assert_int_eq(engine_cancel(e, "a"), 0);
    drain(e, &a, 10);
    ck_assert_int_eq(a.u.finish, ENGINE_FINISH_CANCELLED);
    ck_assert_uint_ge(a.n_got, 3);
    ck_assert_uint_lt(a.n_got, CTX - 10);
    ck_assert_int_eq(engine_cancel(e, "a"), 0); /* finished: left as it is */
    ck_assert_int_eq(engine_cancel(e, "zz"), STRATA_ENOENT);
    drain(e, &b, 30);
    drain(e, &c, 30);
    ck_assert_uint_eq(b.n_got, 5);
    ck_assert_uint_eq(b.u.t.n_prefilled, 10);
    ck_assert_int_eq(b.u.finish, ENGINE_FINISH_LENGTH);

    /* Refusals: context, vocabulary, id, sampling parameters. */
    static struct job bad;
    job_make(&bad, "long", 4, 1, 0.0f, 1);
    int32_t *big = calloc(CTX, sizeof *big);
    bad.q.prompt = big;
    bad.q.n_prompt = CTX;
    ck_assert_int_eq(engine_submit(e, &bad.q), STRATA_ELIMIT);
    free(big);
    job_make(&bad, "vocab", 4, 1, 0.0f, 1);
    bad.prompt[2] = 512;
    ck_assert_int_eq(engine_submit(e, &bad.q), STRATA_EINVAL);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "512"));
    job_make(&bad, "", 4, 1, 0.0f, 1);
    ck_assert_int_eq(engine_submit(e, &bad.q), STRATA_EINVAL);
    job_make(&bad, "topp", 4, 1, 0.5f, 1);
    bad.q.sp.top_p = 0.0f;
    ck_assert_int_eq(engine_submit(e, &bad.q), STRATA_EINVAL);
    job_make(&bad, "ntop", 4, 1, 0.0f, 1);
    bad.q.logprobs = true;
    bad.q.n_top = SAMPLE_MAX_LOGPROBS + 1;
    ck_assert_int_eq(engine_submit(e, &bad.q), STRATA_EINVAL);
    engine_close(e);
    env_close(&v);
}
END_TEST

START_TEST(stop_tokens_and_logprobs)
{
    struct env v;
    env_open(&v);
    struct engine_opts o = {.max_running = 2};
    struct engine *e = start(&v, &o);
    static struct job a, b;
    job_make(&a, "free", 12, 5, 0.0f, 8);
    run_all(e, &v, &a, 1);
    /* Stopping at the third token of the free run: it is the last token returned. */
    job_make(&b, "stopped", 12, 5, 0.0f, 8);
    int32_t stop[2] = {a.got[2], 511};
    b.q.stop = stop;
    b.q.n_stop = 2;
    b.q.logprobs = true;
    b.q.n_top = 3;
    ck_assert_int_eq(engine_submit(e, &b.q), 0);
    struct engine_token t[8];
    double end = now_s() + 30;
    do {
        b.u.toks = t;
        b.u.cap = 8;
        usleep(1000);
        ck_assert_int_eq(engine_poll(e, "stopped", 0, &b.u), 0);
        ck_assert(now_s() < end);
    } while (b.u.finish == ENGINE_FINISH_NONE);
    ck_assert_int_eq(b.u.finish, ENGINE_FINISH_STOP);
    uint32_t first = a.got[0] == stop[0] ? 1 : a.got[1] == stop[0] ? 2 : 3;
    ck_assert_uint_eq(b.u.n, first);
    ck_assert_int_eq(t[b.u.n - 1].id, stop[0]);
    for (uint32_t i = 0; i < b.u.n; i++) {
        ck_assert_uint_eq(t[i].n_top, 3);
        ck_assert_int_eq(t[i].top[0].id, t[i].id); /* greedy: the top alternative */
        ck_assert(t[i].logprob <= 0.0f && fabsf(t[i].logprob - t[i].top[0].logprob) < 1e-6f);
        ck_assert(t[i].top[1].logprob <= t[i].top[0].logprob);
    }
    engine_close(e);
    env_close(&v);
}
END_TEST

/* Heat per (layer, expert) of the tiny fixture (2 layers, 8 experts). */
#define HEAT_L 2
#define HEAT_E 8
static atomic_ulong g_cell[HEAT_L][HEAT_E];

static void heat_cell(void *ctx, uint32_t layer, uint32_t expert, uint32_t n)
{
    (void)ctx;
    ck_assert_uint_lt(layer, HEAT_L);
    ck_assert_uint_lt(expert, HEAT_E);
    atomic_fetch_add(&g_cell[layer][expert], n);
}

static void count_tokens(void *ctx, uint32_t layer, uint32_t expert, const uint32_t *tokens,
                         uint32_t n_tokens)
{
    (void)tokens;
    uint64_t(*want)[HEAT_E] = ctx;
    want[layer][expert] += n_tokens;
}

START_TEST(heat_counts_routed_tokens_not_windows)
{
    struct env v;
    env_open(&v);
    const struct model_hparams *hp = &v.m->hp;
    ck_assert_uint_eq(hp->n_layer, HEAT_L);
    ck_assert_uint_eq(hp->n_expert, HEAT_E);
    for (uint32_t l = 0; l < HEAT_L; l++)
        for (uint32_t x = 0; x < HEAT_E; x++)
            atomic_store(&g_cell[l][x], 0);
    /* 21 prompt tokens in windows of 8, then 12 generated: 14 windows, 32 tokens computed (the
     * last generated token is never fed). */
    static struct job j;
    job_make(&j, "heat", 21, 9, 0.0f, 12);
    struct engine_opts o = {
        .max_running = 1, .max_batch_tokens = 8, .no_prefix_cache = true, .on_route = heat_cell};
    struct engine *e = start(&v, &o);
    run_all(e, &v, &j, 1);
    ck_assert_uint_eq(j.n_got, 12);
    struct engine_status st;
    engine_status(e, &st);
    ck_assert_uint_eq(st.windows, 3 + 11);
    engine_close(e); /* joins the decode thread: every hook call has returned */
    /* The same 32 tokens in one plain pass, counted by the forward pass's own hook. */
    const uint32_t n = 21 + 11;
    int32_t hist[21 + 11];
    memcpy(hist, j.prompt, 21 * sizeof *hist);
    memcpy(hist + 21, j.got, 11 * sizeof *hist);
    struct kv_cache *kv;
    struct backend *f;
    struct backend_opts fo = {.n_threads = 2, .max_pass_tokens = n, .n_ctx = CTX, .n_seq = 1};
    ck_assert_int_eq(backend_start(v.m, &fo, &f), 0);
    kv = backend_kv(f);
    uint64_t want[HEAT_L][HEAT_E] = {{0}};
    backend_set_route(f, count_tokens, want);
    struct kv_seq seq;
    kv_seq_init(&seq);
    ck_assert_int_eq(backend_prompt(f, &seq, hist, n, 0, NULL), 0);
    for (uint32_t l = 0; l < HEAT_L; l++) {
        uint64_t sum = 0;
        for (uint32_t x = 0; x < HEAT_E; x++) {
            ck_assert_msg(atomic_load(&g_cell[l][x]) == want[l][x],
                          "layer %u expert %u: heat %lu, routed tokens %llu", l, x,
                          atomic_load(&g_cell[l][x]), (unsigned long long)want[l][x]);
            sum += atomic_load(&g_cell[l][x]);
        }
        ck_assert_uint_eq(sum, (uint64_t)n * hp->n_expert_used);
    }
    kv_seq_fini(kv, &seq);
    backend_close(f);
    env_close(&v);
}
END_TEST

int main(void)
{
    snprintf(g_path, sizeof g_path, "%s/engine-tiny.gguf", test_tmpdir());
    struct fixture_opts fo = {.seed = 11};
    if (fixture_write(&fo, g_path) != 0) {
        fprintf(stderr, "fixture: %s\n", strata_errdetail());
        return 1;
    }
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 300); /* Debug + ASan builds on a loaded machine run ~20x slower */
    tcase_add_test(tc, sixteen_concurrent_requests_give_their_lone_ids);
    tcase_add_test(tc, preemption_under_a_tiny_pool_keeps_the_ids);
    tcase_add_test(tc, commands_run_between_windows);
    tcase_add_loop_test(tc, drafts_give_the_same_ids, 0, 2);
    tcase_add_loop_test(tc, a_draft_model_gives_the_same_ids, 0, 4);
    tcase_add_test(tc, a_draft_of_another_vocabulary_is_refused);
    tcase_add_test(tc, the_demo_model_with_drafts);
    tcase_add_test(tc, lookup_and_adapt);
    tcase_add_test(tc, preemption_with_the_prefix_cache_keeps_the_ids);
    tcase_add_test(tc, a_follow_up_turn_prefills_only_its_new_tokens);
    tcase_add_test(tc, a_resumed_request_continues_the_same_ids);
    tcase_add_test(tc, a_lapsed_lease_cancels_and_polls_keep_it);
    tcase_add_test(tc, duplicate_cancel_busy_and_refusals);
    tcase_add_test(tc, stop_tokens_and_logprobs);
    tcase_add_test(tc, heat_counts_routed_tokens_not_windows);
    suite_add_tcase(s, tc);
    int rv = test_run(s);
    unlink(g_path);
    return rv;
}
