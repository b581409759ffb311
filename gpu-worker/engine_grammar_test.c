/* engine_grammar_test — grammar-constrained generation in the engine on a random-weight fixture:
 * outputs that stop are sentences of the grammar (JSON checked by jansson against the schema's
 * shape), outputs cut by length are prefixes, a resumed request continues the same ids with its
 * grammar state rebuilt, drafts change nothing, a lazy grammar holds the text from its trigger
 * on, and a bad grammar is refused at submit. */
#include "common/base/err.h"
#include "common/grammar/grammar.h"
#include "common/tok/tok.h"
#include "gpu-worker/engine.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_GEN 96

static char g_path[600];
static struct gguf_file *g_f;
static struct model *g_m;
static struct tok *g_tok;
static int32_t g_eos;

static const char SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {\"ok\": {\"type\": \"boolean\"}, \"n\": {\"type\": "
    "\"integer\"}, \"tag\": {\"enum\": [\"red\", \"green\"]}}, \"required\": [\"ok\", \"tag\"]}";

static char *schema_gbnf(void)
{
    json_t *s = json_loads(SCHEMA, 0, NULL);
    char *g;
    ck_assert_int_eq(grammar_from_schema(s, &g), 0);
    json_decref(s);
    return g;
}

struct run {
    int32_t ids[MAX_GEN];
    uint32_t n;
    enum engine_finish finish;
    bool grammar_end;
    char text[4096];
    char error[256];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void drain(struct engine *e, const char *id, struct run *r)
{
    struct engine_token t[16];
    struct engine_update u = {.toks = t, .cap = 16};
    const double end = now_s() + 60 * test_slowdown();
    r->n = 0;
    for (;;) {
        ck_assert_int_eq(engine_poll(e, id, r->n, &u), 0);
        for (uint32_t i = 0; i < u.n; i++) {
            ck_assert_uint_lt(r->n, MAX_GEN);
            r->ids[r->n++] = t[i].id;
        }
        if (u.finish != ENGINE_FINISH_NONE) break;
        ck_assert_msg(now_s() < end, "%s not done", id);
        if (!u.n) usleep(1000);
    }
    r->finish = u.finish;
    r->grammar_end = u.grammar_end;
    snprintf(r->error, sizeof r->error, "%s", u.error_msg);
    struct tok_buf b = {0};
    for (uint32_t i = 0; i < r->n; i++)
        if (r->ids[i] != g_eos) ck_assert_int_eq(tok_piece(g_tok, r->ids[i], 0, &b), 0);
    ck_assert_uint_lt(b.n, sizeof r->text);
    memcpy(r->text, b.p ? b.p : "", b.n);
    r->text[b.n] = 0;
    free(b.p);
}

static void submit(struct engine *e, const char *id, const int32_t *prompt, uint32_t n_prompt,
                   uint32_t n_generated, uint32_t max_tokens, uint64_t seed, float temp,
                   const char *grammar)
{
    struct engine_req q = {.id = id,
                           .prompt = prompt,
                           .n_prompt = n_prompt,
                           .max_tokens = max_tokens,
                           .stop = &g_eos,
                           .n_stop = 1,
                           .n_generated = n_generated,
                           .grammar = grammar};
    sample_params_default(&q.sp);
    q.sp.temperature = temp;
    q.sp.seed = seed;
    ck_assert_msg(engine_submit(e, &q) == 0, "%s", strata_errdetail());
}

static struct engine *start(uint32_t spec)
{
    struct engine_opts o = {.n_ctx = 512, .orphan_timeout_ms = 600000, .spec_lookup = spec};
    struct engine *e;
    ck_assert_msg(engine_start(g_m, &o, &e) == 0, "%s", strata_errdetail());
    return e;
}

static const int32_t PROMPT[] = {72, 101, 108, 108, 111, 44, 32, 74, 83, 79, 78, 58};
#define N_PROMPT (sizeof PROMPT / sizeof *PROMPT)

START_TEST(stops_are_sentences_and_lengths_prefixes)
{
    char *gbnf = schema_gbnf();
    struct grammar *g;
    ck_assert_int_eq(grammar_parse(gbnf, strlen(gbnf), &g), 0);
    struct engine *e = start(0);
    int stops = 0, lengths = 0;
    for (int seed = 0; seed < 24; seed++) {
        char id[32];
        snprintf(id, sizeof id, "s%d", seed);
        /* every third greedy; short budgets leave some cut by length */
        submit(e, id, PROMPT, N_PROMPT, 0, seed % 4 == 3 ? 6 : MAX_GEN - 1, (uint64_t)seed,
               seed % 3 == 2 ? 0.0f : 1.0f, gbnf);
        struct run r;
        drain(e, id, &r);
        struct grammar_matcher *m;
        ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
        ck_assert_msg(grammar_matcher_feed(m, r.text, strlen(r.text)) == 0,
                      "seed %d: not a prefix: %s", seed, r.text);
        if (r.finish == ENGINE_FINISH_STOP) {
            stops++;
            ck_assert_msg(grammar_matcher_accepting(m), "seed %d stopped early: %s", seed, r.text);
            json_error_t je;
            json_t *v = json_loads(r.text, 0, &je);
            ck_assert_msg(v, "seed %d: not JSON (%s): %s", seed, je.text, r.text);
            ck_assert(json_is_boolean(json_object_get(v, "ok")));
            const char *tag = json_string_value(json_object_get(v, "tag"));
            ck_assert_msg(tag && (!strcmp(tag, "red") || !strcmp(tag, "green")), "%s", r.text);
            json_t *n = json_object_get(v, "n");
            ck_assert(!n || json_is_integer(n));
            ck_assert_uint_le(json_object_size(v), 3);
            json_decref(v);
        } else {
            ck_assert_msg(r.finish == ENGINE_FINISH_LENGTH, "seed %d: finish %d: %s", seed,
                          r.finish, r.error);
            lengths++;
        }
        grammar_matcher_fini(m);
    }
    ck_assert_int_gt(stops, 0);
    ck_assert_int_gt(lengths, 0);
    engine_close(e);
    grammar_fini(g);
    free(gbnf);
}
END_TEST

START_TEST(a_resumed_request_and_drafts_keep_the_ids)
{
    const char *gbnf = "root ::= \"[\" item (\", \" item)* \"]\"\nitem ::= [a-z]{1,6} | [0-9]+\n";
    struct engine *e = start(0), *d = start(4);
    for (int seed = 0; seed < 6; seed++) {
        char id[32];
        struct run whole, tail, drafted;
        snprintf(id, sizeof id, "w%d", seed);
        submit(e, id, PROMPT, N_PROMPT, 0, 40, 7 + (uint64_t)seed, seed ? 1.0f : 0.0f, gbnf);
        drain(e, id, &whole);
        submit(d, id, PROMPT, N_PROMPT, 0, 40, 7 + (uint64_t)seed, seed ? 1.0f : 0.0f, gbnf);
        drain(d, id, &drafted);
        ck_assert_uint_eq(drafted.n, whole.n);
        ck_assert_mem_eq(drafted.ids, whole.ids, whole.n * sizeof *whole.ids);
        if (whole.n < 3) continue;
        /* resume after k tokens, as a frontend does on a restarted worker */
        const uint32_t k = whole.n / 2;
        int32_t prompt[N_PROMPT + MAX_GEN];
        memcpy(prompt, PROMPT, sizeof PROMPT);
        memcpy(prompt + N_PROMPT, whole.ids, k * sizeof *prompt);
        snprintf(id, sizeof id, "r%d", seed);
        submit(e, id, prompt, N_PROMPT + k, k, 40 - k, 7 + (uint64_t)seed, seed ? 1.0f : 0.0f,
               gbnf);
        drain(e, id, &tail);
        ck_assert_uint_eq(tail.n, whole.n - k);
        ck_assert_mem_eq(tail.ids, whole.ids + k, tail.n * sizeof *tail.ids);
        ck_assert_int_eq(tail.finish, whole.finish);
    }
    engine_close(d);
    engine_close(e);
}
END_TEST

/* a_lazy_grammar_holds_the_text_from_its_trigger: over seeds, the text before a lazy grammar's
 * trigger is free and from the trigger on it is held to the grammar (a sentence when it stops by
 * the grammar); a resumed request (before or after the trigger) and drafts give the same ids. The
 * trigger is a piece the model writes often, so calls begin. */
START_TEST(a_lazy_grammar_holds_the_text_from_its_trigger)
{
    struct engine *e = start(0), *d = start(4);
    /* the alphabetic piece most runs write, past their first pieces (text comes first), in the
     * free text of a lazy grammar whose trigger never comes */
    static uint32_t count[1 << 16];
    static bool first[1 << 16];
    memset(count, 0, sizeof count);
    memset(first, 0, sizeof first);
    for (int seed = 0; seed < 16; seed++) {
        char id[32];
        struct run r;
        snprintf(id, sizeof id, "free%d", seed);
        submit(e, id, PROMPT, N_PROMPT, 0, 60, 200 + (uint64_t)seed, seed % 5 == 4 ? 0.0f : 1.0f,
               "%trigger \"\\x01\"\nroot ::= \"\\x01\"\n");
        drain(e, id, &r);
        static bool seen[1 << 16];
        memset(seen, 0, sizeof seen);
        for (uint32_t i = 0; i < r.n; i++) {
            if (r.ids[i] < 0 || r.ids[i] >= (1 << 16)) continue;
            if (i < 2)
                first[r.ids[i]] = true;
            else if (!seen[r.ids[i]])
                count[r.ids[i]]++;
            seen[r.ids[i]] = true;
        }
    }
    char trig[64] = "";
    uint32_t best = 0;
    for (int32_t t = 0; t < (1 << 16); t++) {
        if (count[t] <= best || t == g_eos || first[t]) continue;
        struct tok_buf b = {0};
        if (tok_piece(g_tok, t, 0, &b) != 0 || !b.n || b.n >= sizeof trig) {
            free(b.p);
            continue;
        }
        bool alpha = false, ok = true;
        for (size_t i = 0; i < b.n; i++) {
            const char c = b.p[i];
            ok &= (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == ' ';
            alpha |= c != ' ';
        }
        if (ok && alpha) {
            best = count[t];
            memcpy(trig, b.p, b.n);
            trig[b.n] = 0;
        }
        free(b.p);
    }
    ck_assert_msg(best > 0, "no alphabetic piece generated");
    char strict[256], lazy[512];
    snprintf(strict, sizeof strict,
             "root ::= \"%s\" \"[\" item (\", \" item)* \"]\"\nitem ::= [a-z]{1,6} | [0-9]+\n",
             trig);
    snprintf(lazy, sizeof lazy, "%%trigger \"%s\"\n%s", trig, strict);
    struct grammar *g;
    ck_assert_int_eq(grammar_parse(strict, strlen(strict), &g), 0);
    int triggered = 0, ended = 0, free_text = 0;
    for (int seed = 0; seed < 16; seed++) {
        char id[32];
        struct run whole, tail, drafted;
        const float temp = seed % 5 == 4 ? 0.0f : 1.0f;
        snprintf(id, sizeof id, "lazy%d", seed);
        submit(e, id, PROMPT, N_PROMPT, 0, 60, 200 + (uint64_t)seed, temp, lazy);
        drain(e, id, &whole);
        ck_assert_msg(whole.finish == ENGINE_FINISH_STOP || whole.finish == ENGINE_FINISH_LENGTH,
                      "seed %d: finish %d: %s", seed, whole.finish, whole.error);
        const char *at = strstr(whole.text, trig);
        if (at) {
            struct grammar_matcher *m;
            ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
            ck_assert_msg(grammar_matcher_feed(m, at, strlen(at)) == 0,
                          "seed %d: after the trigger '%s': %s", seed, trig, at);
            if (whole.grammar_end) {
                ck_assert(grammar_matcher_done(m));
                ended++;
            }
            grammar_matcher_fini(m);
            triggered++;
            free_text += at > whole.text;
        } else {
            ck_assert(!whole.grammar_end);
        }
        submit(d, id, PROMPT, N_PROMPT, 0, 60, 200 + (uint64_t)seed, temp, lazy);
        drain(d, id, &drafted);
        ck_assert_uint_eq(drafted.n, whole.n);
        ck_assert_mem_eq(drafted.ids, whole.ids, whole.n * sizeof *whole.ids);
        if (whole.n < 2) continue;
        /* resume at a point before, and one after, where the trigger began */
        for (uint32_t k = whole.n / 3; k < whole.n; k += whole.n / 3 ? whole.n / 3 : 1) {
            int32_t prompt[N_PROMPT + MAX_GEN];
            memcpy(prompt, PROMPT, sizeof PROMPT);
            memcpy(prompt + N_PROMPT, whole.ids, k * sizeof *prompt);
            snprintf(id, sizeof id, "lr%d-%u", seed, k);
            submit(e, id, prompt, N_PROMPT + k, k, 60 - k, 200 + (uint64_t)seed, temp, lazy);
            drain(e, id, &tail);
            ck_assert_uint_eq(tail.n, whole.n - k);
            ck_assert_mem_eq(tail.ids, whole.ids + k, tail.n * sizeof *tail.ids);
            ck_assert_int_eq(tail.finish, whole.finish);
        }
    }
    ck_assert_msg(triggered >= 4, "%d of 16 triggered ('%s')", triggered, trig);
    ck_assert_int_gt(ended, 0);
    ck_assert_int_gt(free_text, 0);
    grammar_fini(g);
    engine_close(d);
    engine_close(e);
}
END_TEST

START_TEST(bad_grammars_are_refused_at_submit)
{
    struct engine *e = start(0);
    struct engine_req q = {.id = "bad",
                           .prompt = PROMPT,
                           .n_prompt = N_PROMPT,
                           .max_tokens = 4,
                           .grammar = "root ::= \"a\"\n  broken ::= [\n"};
    sample_params_default(&q.sp);
    ck_assert_int_eq(engine_submit(e, &q), STRATA_EINVAL);
    ck_assert_msg(strstr(strata_errdetail(), "line 2"), "%s", strata_errdetail());
    /* generated tokens that do not follow the grammar cannot resume it */
    q.grammar = "root ::= \"x\"+\n";
    q.n_generated = 2;
    ck_assert_int_eq(engine_submit(e, &q), STRATA_EINVAL);
    ck_assert_msg(strstr(strata_errdetail(), "does not follow the grammar"), "%s",
                  strata_errdetail());
    /* a sentence nothing may follow ends as a stop even without stop ids */
    q.id = "fixed";
    q.grammar = "root ::= \"ok\"\n";
    q.n_generated = 0;
    q.max_tokens = 20;
    ck_assert_int_eq(engine_submit(e, &q), 0);
    struct run r;
    drain(e, "fixed", &r);
    ck_assert_int_eq(r.finish, ENGINE_FINISH_STOP);
    ck_assert(r.grammar_end); /* the last token is text, not a stop id */
    ck_assert_str_eq(r.text, "ok");
    /* a control token the grammar names is generated as that token */
    const int32_t im_start = tok_find(g_tok, "<|im_start|>", 12);
    ck_assert_int_ge(im_start, 0);
    char gbnf[64];
    snprintf(gbnf, sizeof gbnf, "root ::= \"x\" <[%d]> \"y\"\n", im_start);
    q.id = "ctrl";
    q.grammar = gbnf;
    ck_assert_int_eq(engine_submit(e, &q), 0);
    drain(e, "ctrl", &r);
    ck_assert_int_eq(r.finish, ENGINE_FINISH_STOP);
    ck_assert_uint_eq(r.n, 3);
    ck_assert_int_eq(r.ids[1], im_start);
    engine_close(e);
}
END_TEST

int main(void)
{
    snprintf(g_path, sizeof g_path, "%s/grammar-tiny.gguf", test_tmpdir());
    struct fixture_opts fo = {.seed = 5};
    if (fixture_write(&fo, g_path) != 0 || gguf_open(g_path, &g_f) != 0 ||
        model_load(g_f, &g_m) != 0 || tok_from_gguf(g_f, NULL, &g_tok) != 0) {
        fprintf(stderr, "fixture: %s\n", strata_errdetail());
        return 1;
    }
    g_eos = tok_eos(g_tok);
    Suite *s = suite_create("engine_grammar");
    TCase *tc = tcase_create("grammar");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, stops_are_sentences_and_lengths_prefixes);
    tcase_add_test(tc, a_resumed_request_and_drafts_keep_the_ids);
    tcase_add_test(tc, a_lazy_grammar_holds_the_text_from_its_trigger);
    tcase_add_test(tc, bad_grammars_are_refused_at_submit);
    suite_add_tcase(s, tc);
    int rv = test_run(s);
    tok_fini(g_tok);
    model_fini(g_m);
    gguf_close(g_f);
    unlink(g_path);
    return rv;
}
