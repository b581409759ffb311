/* tools_test — tool calls rendered by the real chat templates (the bundled Jinja files, through
 * our template interpreter) are recognized and parsed back into the same names and arguments;
 * the forcing grammars accept what the templates write; streaming holds back a marker's start;
 * an unclosed call stays text. */
#include "common/base/err.h"
#include "common/grammar/grammar.h"
#include "common/tmpl/tmpl.h"
#include "frontend/tools.h"
#include "tests/testutil.h"

#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
    "\"Weather "
    "of a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
    "\"string\"}, \"days\": {\"type\": \"integer\"}}, \"required\": [\"city\"]}}}, {\"type\": "
    "\"function\", \"function\": {\"name\": \"get_time\", \"description\": \"Time\", "
    "\"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"zone\": {\"type\": \"string\"}}}}}]";

static const struct {
    const char *file;
    enum tools_family family;
    int n_calls; /* calls in the assistant turn (templates of one call per turn get one) */
} CASES[] = {
    {"Qwen-Qwen2.5-7B-Instruct", TOOLS_HERMES, 2},
    {"Qwen-Qwen3-0.6B", TOOLS_HERMES, 2},
    {"Qwen-QwQ-32B", TOOLS_HERMES, 2},
    {"Qwen3-Coder", TOOLS_QWEN_XML, 2},
    {"GLM-4.7-Flash", TOOLS_GLM, 2},
    {"Mistral-Small-3.2-24B-Instruct-2506", TOOLS_MISTRAL, 2},
    {"mistralai-Mistral-Nemo-Instruct-2407", TOOLS_MISTRAL_V3, 2},
    {"meta-llama-Llama-3.1-8B-Instruct", TOOLS_LLAMA3, 1},
    {"meta-llama-Llama-3.3-70B-Instruct", TOOLS_LLAMA3, 1},
    {"deepseek-ai-DeepSeek-V3.1", TOOLS_DEEPSEEK, 2},
    {"openai-gpt-oss-120b", TOOLS_HARMONY, 1},
};

static struct tmpl *load(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.jinja", dir, name);
    size_t len;
    char *src = test_read_file(path, &len);
    ck_assert_ptr_nonnull(src);
    struct tmpl *t;
    ck_assert_msg(tmpl_compile(src, len, NULL, &t) == 0, "%s: %s", name, strata_errdetail());
    tmpl_set_now(t, 1721952000);
    free(src);
    return t;
}

static char *render(const struct tmpl *t, json_t *msgs, bool gen)
{
    json_t *vars =
        json_pack("{s:O, s:b, s:s, s:s, s:o}", "messages", msgs, "add_generation_prompt", gen,
                  "bos_token", "<s>", "eos_token", "</s>", "tools", json_loads(TOOLS, 0, NULL));
    char *out = NULL;
    size_t len;
    int rv = tmpl_render_json(t, vars, &out, &len);
    ck_assert_msg(rv == 0, "render: %s", strata_errdetail());
    json_decref(vars);
    return out;
}

START_TEST(rendered_calls_parse_back)
{
    const char *dir = test_data_path("chat-templates");
    if (!dir) return;
    struct tmpl *t = load(dir, CASES[_i].file);
    const enum tools_family f = tools_detect(t, "<s>", "</s>");
    ck_assert_msg(f == CASES[_i].family, "%s: detected %s, want %s", CASES[_i].file,
                  tools_family_name(f), tools_family_name(CASES[_i].family));
    json_t *calls =
        json_loads("[{\"id\": \"abcdefghi\", \"type\": \"function\", \"function\": {\"name\": "
                   "\"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}}, {\"id\": "
                   "\"bcdefghij\", \"type\": \"function\", \"function\": {\"name\": \"get_time\", "
                   "\"arguments\": {\"zone\": \"CET\"}}}]",
                   0, NULL);
    if (CASES[_i].n_calls == 1) json_array_remove(calls, 1);
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "Weather in Paris?");
    char *prompt = render(t, msgs, true);
    json_array_append_new(msgs, json_pack("{s:s, s:s, s:O}", "role", "assistant", "content", "",
                                          "tool_calls", calls));
    /* a tool answer after the calls, so every template renders the assistant turn as history */
    json_array_append_new(msgs, json_pack("{s:s, s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                                          "abcdefghi", "name", "get_weather", "content", "sunny"));
    char *full = render(t, msgs, true);
    /* the assistant's turn: after the prompt when it is a prefix, else after the question */
    const char *turn = strncmp(full, prompt, strlen(prompt)) == 0
                           ? full + strlen(prompt)
                           : strstr(full, "Weather in Paris?") + strlen("Weather in Paris?");
    const char *reply = strstr(turn, "sunny");
    ck_assert_ptr_nonnull(reply);
    struct tools_parsed p;
    json_t *tools = json_loads(TOOLS, 0, NULL);
    /* typed by the tools' parameters as a request's answer is */
    ck_assert_int_eq(tools_parse(f, tools, turn, (size_t)(reply - turn), "seed", &p), 0);
    ck_assert_msg(!p.unclosed && p.n_calls == (size_t)CASES[_i].n_calls,
                  "%s: %zu calls (unclosed %d) from:\n%.*s", CASES[_i].file, p.n_calls, p.unclosed,
                  (int)(reply - turn), turn);
    for (size_t i = 0; i < p.n_calls; i++) {
        json_t *fn = json_object_get(json_array_get(calls, i), "function");
        ck_assert_str_eq(p.calls[i].name, json_string_value(json_object_get(fn, "name")));
        json_t *args = json_loads(p.calls[i].arguments, 0, NULL);
        ck_assert_msg(json_equal(args, json_object_get(fn, "arguments")), "%s: arguments %s",
                      CASES[_i].file, p.calls[i].arguments);
        json_decref(args);
        ck_assert_uint_eq(strlen(p.calls[i].id),
                          f == TOOLS_MISTRAL || f == TOOLS_MISTRAL_V3 ? 9 : 29);
    }
    /* the grammar that forces calls compiles and, for the JSON syntaxes written as the grammar
     * writes them, accepts the template's own rendering of the first call */
    char *gbnf;
    ck_assert_int_eq(tools_grammar(f, tools, NULL, true, false, NULL, &gbnf), 0);
    struct grammar *g;
    ck_assert_msg(grammar_parse(gbnf, strlen(gbnf), &g) == 0, "%s: %s\n%s", CASES[_i].file,
                  strata_errdetail(), gbnf);
    if (f == TOOLS_QWEN_XML ||
        f == TOOLS_GLM) { /* the XML-like calls as the template writes them */
        const char *a = strstr(turn, "<tool_call>"), *b = a;
        for (const char *c; (c = strstr(b, "</tool_call>")) && c < reply;)
            b = c + strlen("</tool_call>");
        struct grammar_matcher *m;
        ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
        ck_assert_msg(grammar_matcher_feed(m, a, (size_t)(b - a)) == 0 &&
                          grammar_matcher_accepting(m),
                      "%s: the grammar refuses the template's calls:\n%.*s\n%s", CASES[_i].file,
                      (int)(b - a), a, gbnf);
        grammar_matcher_fini(m);
    }
    grammar_fini(g);
    free(gbnf);
    json_decref(tools);
    tools_parsed_free(&p);
    free(prompt);
    free(full);
    json_decref(msgs);
    json_decref(calls);
    tmpl_fini(t);
}
END_TEST

/* forced: what a grammar forces parses back into a call of the forced tool. */
START_TEST(forced_calls_parse)
{
    static const char *texts[] = {
        [TOOLS_HERMES] = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": "
                         "\"UTC\"}}\n</tool_call>",
        [TOOLS_QWEN_XML] = "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n"
                           "</parameter>\n</function>\n</tool_call>",
        [TOOLS_GLM] = "<tool_call>get_time<arg_key>zone</arg_key><arg_value>UTC</arg_value>"
                      "</tool_call>",
        [TOOLS_MISTRAL] = "[TOOL_CALLS]get_time[ARGS]{\"zone\": \"UTC\"}",
        [TOOLS_MISTRAL_V3] = "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"zone\": "
                             "\"UTC\"}}]",
        [TOOLS_LLAMA3] = "{\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}",
        [TOOLS_DEEPSEEK] = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
                           "{\"zone\": \"UTC\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        [TOOLS_HARMONY] = "<|channel|>commentary to=functions.get_time <|constrain|>json"
                          "<|message|>{\"zone\": \"UTC\"}<|call|>",
    };
    const enum tools_family f = (enum tools_family)_i;
    json_t *tools = json_loads(TOOLS, 0, NULL);
    char *gbnf;
    ck_assert_int_eq(tools_grammar(f, tools, "get_time", false, false, NULL, &gbnf), 0);
    struct grammar *g;
    ck_assert_msg(grammar_parse(gbnf, strlen(gbnf), &g) == 0, "%s", strata_errdetail());
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    ck_assert_msg(grammar_matcher_feed(m, texts[f], strlen(texts[f])) == 0 &&
                      grammar_matcher_accepting(m),
                  "%s: the grammar refuses %s\n%s", tools_family_name(f), texts[f], gbnf);
    /* the forced tool only */
    grammar_matcher_fini(m);
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    ck_assert_int_ne(grammar_matcher_feed(m, "get_weather", 11) == 0 &&
                         grammar_matcher_feed(m, texts[f], strlen(texts[f])) == 0,
                     1);
    grammar_matcher_fini(m);
    struct tools_parsed p;
    ck_assert_int_eq(tools_parse(f, NULL, texts[f], strlen(texts[f]), "x", &p), 0);
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].name, "get_time");
    ck_assert_str_eq(p.calls[0].arguments, "{\"zone\":\"UTC\"}");
    ck_assert_uint_eq(p.content_len, 0);
    tools_parsed_free(&p);
    grammar_fini(g);
    free(gbnf);
    json_decref(tools);
}
END_TEST

START_TEST(streams_hold_markers_and_unclosed_calls_stay_text)
{
    const char *s = "Let me check. <tool_";
    ck_assert_uint_eq(tools_content_end(TOOLS_HERMES, s, strlen(s)), 14);
    s = "Let me check. <tool_call>\n{\"name\"";
    ck_assert_uint_eq(tools_content_end(TOOLS_HERMES, s, strlen(s)), 14);
    s = "Plain answer <b>bold</b>";
    ck_assert_uint_eq(tools_content_end(TOOLS_HERMES, s, strlen(s)), strlen(s));
    ck_assert_uint_eq(tools_content_end(TOOLS_LLAMA3, "  ", 2), 0);
    ck_assert_uint_eq(tools_content_end(TOOLS_LLAMA3, "Hi {", 4), 4);
    ck_assert_uint_eq(tools_content_end(TOOLS_MISTRAL, "ok [TOOL", 8), 3);
    struct tools_parsed p;
    s = "Sure. <tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"U";
    ck_assert_int_eq(tools_parse(TOOLS_HERMES, NULL, s, strlen(s), "x", &p), 0);
    ck_assert(p.unclosed);
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert_str_eq(p.content, s);
    tools_parsed_free(&p);
    /* content around calls is kept; arguments given as a JSON text become the object */
    s = "Checking.\n<tool_call>\n{\"name\": \"a\", \"arguments\": \"{\\\"k\\\": [1]}\"}\n"
        "</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
    ck_assert_int_eq(tools_parse(TOOLS_HERMES, NULL, s, strlen(s), "x", &p), 0);
    ck_assert_uint_eq(p.n_calls, 2);
    ck_assert_str_eq(p.content, "Checking.");
    ck_assert_str_eq(p.calls[0].arguments, "{\"k\":[1]}");
    ck_assert_str_eq(p.calls[1].name, "b");
    ck_assert_str_ne(p.calls[0].id, p.calls[1].id);
    tools_parsed_free(&p);
    /* gpt-oss: reasoning, a call and a final message, in channels */
    s = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>"
        "<|start|>assistant<|channel|>final<|message|>Checking.<|return|>";
    ck_assert_int_eq(tools_parse(TOOLS_HARMONY, NULL, s, strlen(s), "x", &p), 0);
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].name, "get_weather");
    ck_assert_str_eq(p.calls[0].arguments, "{\"city\":\"Oslo\"}");
    ck_assert_str_eq(p.content, "Checking.");
    tools_parsed_free(&p);
    ck_assert_uint_eq(tools_content_end(TOOLS_HARMONY, s, strlen(s)), 0);
    s = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4";
    ck_assert_int_eq(tools_parse(TOOLS_HARMONY, NULL, s, strlen(s), "x", &p), 0);
    ck_assert_uint_eq(p.n_calls, 0);
    ck_assert_str_eq(p.content, "4"); /* no call: still the final channel only */
    tools_parsed_free(&p);
}
END_TEST

/* ---- grammar walks: random sentences of a forcing grammar --------------------------------------
 */

static const char TYPED[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"plan\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": "
    "\"integer\"}, \"temp\": {\"type\": \"number\"}, \"metric\": {\"type\": \"boolean\"}, "
    "\"unit\": {\"enum\": [\"c\", \"f\"]}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": "
    "\"string\"}, \"maxItems\": 3}, \"where\": {\"type\": \"object\", \"properties\": {\"lat\": "
    "{\"type\": \"number\"}, \"lon\": {\"type\": \"number\"}}, \"required\": [\"lat\", \"lon\"], "
    "\"additionalProperties\": false}, \"level\": {\"enum\": [1, 2, 3]}}, \"required\": "
    "[\"city\", \"days\", \"unit\", \"where\"]}}}, {\"type\": \"function\", \"function\": "
    "{\"name\": \"ping\", \"parameters\": {\"type\": \"object\", \"properties\": {\"ok\": "
    "{\"type\": \"boolean\"}}, \"required\": [\"ok\"]}}}]";

/* typed_valid: args (a JSON text) validate against TYPED's function name. */
static bool typed_valid(const char *name, const char *args)
{
    json_t *a = json_loads(args, 0, NULL), *v;
    const char *k;
    bool ok = json_is_object(a);
    if (ok && !strcmp(name, "ping")) {
        ok = json_object_size(a) == 1 && json_is_boolean(json_object_get(a, "ok"));
    } else if (ok && !strcmp(name, "plan")) {
        static const char *const req[] = {"city", "days", "unit", "where"};
        for (size_t i = 0; i < 4; i++)
            ok &= json_object_get(a, req[i]) != NULL;
        json_object_foreach(a, k, v)
        {
            if (!strcmp(k, "city"))
                ok &= json_is_string(v);
            else if (!strcmp(k, "days"))
                ok &= json_is_integer(v);
            else if (!strcmp(k, "temp"))
                ok &= json_is_number(v);
            else if (!strcmp(k, "metric"))
                ok &= json_is_boolean(v);
            else if (!strcmp(k, "unit"))
                ok &= json_is_string(v) &&
                      (!strcmp(json_string_value(v), "c") || !strcmp(json_string_value(v), "f"));
            else if (!strcmp(k, "level"))
                ok &=
                    json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= 3;
            else if (!strcmp(k, "tags")) {
                size_t i;
                json_t *t;
                ok &= json_is_array(v) && json_array_size(v) <= 3;
                json_array_foreach(v, i, t) ok &= json_is_string(t);
            } else if (!strcmp(k, "where"))
                ok &= json_object_size(v) == 2 && json_is_number(json_object_get(v, "lat")) &&
                      json_is_number(json_object_get(v, "lon"));
            else
                ok = false;
        }
    } else
        ok = false;
    json_decref(a);
    return ok;
}

/* A vocabulary of every printable byte, the newline, and pieces of the syntaxes. */
static const char *const PIECES[] = {
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>\n",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "true",
    "false",
    "plan",
    "ping",
    "\", \"",
    "{\"name\": \"",
    "\"arguments\": ",
    "}\n",
    ">\n",
    "1.5",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
};

struct wvocab {
    char *tok[160];
    uint32_t len[160];
    uint32_t n;
    struct grammar_vocab *v;
};

static void wvocab_make(struct wvocab *w)
{
    w->n = 0;
    for (int c = 0x20; c < 0x7f; c++) {
        w->tok[w->n] = calloc(1, 2);
        w->tok[w->n][0] = (char)c;
        w->len[w->n++] = 1;
    }
    w->tok[w->n] = strdup("\n");
    w->len[w->n++] = 1;
    for (size_t i = 0; i < sizeof PIECES / sizeof *PIECES; i++) {
        w->tok[w->n] = strdup(PIECES[i]);
        w->len[w->n] = (uint32_t)strlen(PIECES[i]);
        w->n++;
    }
    ck_assert_int_eq(grammar_vocab_init(w->n, (const char *const *)w->tok, w->len, &w->v), 0);
}

static void wvocab_free(struct wvocab *w)
{
    for (uint32_t i = 0; i < w->n; i++)
        free(w->tok[i]);
    grammar_vocab_fini(w->v);
}

/* grammar_walk appends a random sentence of m's grammar, from where m is, to out; pieces are
 * favoured, so walks end. false when it did not end in max steps. */
static bool grammar_walk(struct grammar_matcher *m, const struct wvocab *w, struct test_rng *r,
                         char *out, size_t cap, uint32_t max_steps)
{
    size_t n = strlen(out);
    for (uint32_t step = 0; step < max_steps; step++) {
        if (grammar_matcher_done(m) ||
            (grammar_matcher_accepting(m) && !grammar_matcher_pending(m) && test_unif(r) < 0.3))
            return true; /* a sentence (parallel calls: another may follow) */
        uint32_t mask[8], allowed[160], na = 0, nl = 0;
        ck_assert_int_eq(grammar_matcher_mask_into(m, mask), 0);
        for (uint32_t t = 0; t < w->n; t++)
            if ((mask[t >> 5] >> (t & 31)) & 1) allowed[na++] = t;
        for (uint32_t i = 0; i < na; i++) /* the pieces first */
            if (w->len[allowed[i]] > 1) {
                uint32_t x = allowed[nl];
                allowed[nl++] = allowed[i];
                allowed[i] = x;
            }
        if (!na) return grammar_matcher_accepting(m);
        const uint32_t t = nl && test_unif(r) < 0.6 ? allowed[(size_t)(test_unif(r) * nl)]
                                                    : allowed[(size_t)(test_unif(r) * na)];
        ck_assert_int_eq(grammar_matcher_accept_token(m, (int32_t)t), 0);
        ck_assert_uint_lt(n + w->len[t], cap);
        memcpy(out + n, w->tok[t], w->len[t]);
        out[n += w->len[t]] = 0;
    }
    return grammar_matcher_accepting(m) && !grammar_matcher_pending(m);
}

/* A forcing grammar of TYPED and a matcher of it over the walks' vocabulary. */
struct walker {
    json_t *tools;
    char *gbnf;
    struct grammar *g;
    struct wvocab w;
    struct grammar_matcher *proto;
};

static void walker_init(struct walker *k, enum tools_family f, bool lazy)
{
    k->tools = json_loads(TYPED, 0, NULL);
    ck_assert_int_eq(tools_grammar(f, k->tools, NULL, true, lazy, NULL, &k->gbnf), 0);
    ck_assert_msg(grammar_parse(k->gbnf, strlen(k->gbnf), &k->g) == 0, "%s\n%s", strata_errdetail(),
                  k->gbnf);
    wvocab_make(&k->w);
    ck_assert_int_eq(grammar_matcher_init(k->g, k->w.v, &k->proto), 0);
}

static void walker_fini(struct walker *k)
{
    grammar_matcher_fini(k->proto);
    wvocab_free(&k->w);
    grammar_fini(k->g);
    free(k->gbnf);
    json_decref(k->tools);
}

/* walk_calls: the calls parsed from out (a walk of seed), each valid; how many call `plan`. */
static int walk_calls(enum tools_family f, const json_t *tools, const char *out, int seed,
                      struct tools_parsed *p)
{
    int plans = 0;
    ck_assert_int_eq(tools_parse(f, tools, out, strlen(out), "s", p), 0);
    ck_assert_msg(!p->unclosed && p->n_calls >= 1, "seed %d: no call in\n%s", seed, out);
    for (size_t i = 0; i < p->n_calls; i++) {
        ck_assert_msg(typed_valid(p->calls[i].name, p->calls[i].arguments),
                      "seed %d: %s(%s) from\n%s", seed, p->calls[i].name, p->calls[i].arguments,
                      out);
        plans += !strcmp(p->calls[i].name, "plan");
    }
    return plans;
}

/* typed_xml_calls_validate: over seeds, every forced Qwen3-Coder or GLM call parses into
 * arguments that validate against the function's parameters (types, enums, nested JSON,
 * required ones present). */
START_TEST(typed_xml_calls_validate)
{
    const enum tools_family f = _i ? TOOLS_GLM : TOOLS_QWEN_XML;
    struct walker k;
    walker_init(&k, f, false);
    json_t *tools = k.tools;
    struct grammar_matcher *proto = k.proto;
    int ended = 0, plans = 0;
    static char out[1 << 16];
    for (uint64_t seed = 1; seed <= 24; seed++) {
        struct test_rng r = {seed};
        struct grammar_matcher *m;
        ck_assert_int_eq(grammar_matcher_fork(proto, &m), 0);
        out[0] = 0;
        const bool done = grammar_walk(m, &k.w, &r, out, sizeof out, 3000);
        grammar_matcher_fini(m);
        if (!done) continue;
        ended++;
        struct tools_parsed p;
        plans += walk_calls(f, tools, out, (int)seed, &p);
        tools_parsed_free(&p);
    }
    ck_assert_int_ge(ended, 16);
    ck_assert_int_gt(plans, 4);
    /* a string parameter keeps text that reads as JSON; the others are typed */
    const char *s = f == TOOLS_QWEN_XML
                        ? "<tool_call>\n<function=plan>\n<parameter=city>\n123\n</parameter>\n"
                          "<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>"
                        : "<tool_call>plan<arg_key>city</arg_key><arg_value>123</arg_value>"
                          "<arg_key>metric</arg_key><arg_value>True</arg_value></tool_call>";
    struct tools_parsed p;
    ck_assert_int_eq(tools_parse(f, tools, s, strlen(s), "s", &p), 0);
    ck_assert_uint_eq(p.n_calls, 1);
    ck_assert_str_eq(p.calls[0].arguments, "{\"city\":\"123\",\"metric\":true}");
    tools_parsed_free(&p);
    /* a required parameter cannot be left out, nor a number given as text */
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_fork(proto, &m), 0);
    s = f == TOOLS_QWEN_XML ? "<tool_call>\n<function=plan>\n<parameter=days>\n"
                            : "<tool_call>plan<arg_key>days";
    ck_assert_int_eq(grammar_matcher_feed(m, s, strlen(s)), STRATA_EINVAL); /* city first */
    s = f == TOOLS_QWEN_XML ? "<tool_call>\n<function=plan>\n<parameter=city>\nx\n</parameter>\n"
                              "<parameter=days>\nthree"
                            : "<tool_call>plan<arg_key>city</arg_key><arg_value>x</arg_value>"
                              "<arg_key>days</arg_key><arg_value>three";
    ck_assert_int_eq(grammar_matcher_feed(m, s, strlen(s)), STRATA_EINVAL);
    grammar_matcher_fini(m);
    walker_fini(&k);
}
END_TEST

/* lazy_grammars_hold_calls_once_begun: tool_choice auto's grammar lets any text through until the
 * family's marker, then holds the call to the tools; over seeds, what follows free text parses
 * into valid calls. */
START_TEST(lazy_grammars_hold_calls_once_begun)
{
    static const char *const lead[] = {
        [TOOLS_HERMES] = "<tool_call>",
        [TOOLS_QWEN_XML] = "<tool_call>",
        [TOOLS_GLM] = "<tool_call>",
        [TOOLS_MISTRAL] = "[TOOL_CALLS]",
        [TOOLS_MISTRAL_V3] = "[TOOL_CALLS]",
        [TOOLS_LLAMA3] = "{",
        [TOOLS_DEEPSEEK] = "<｜tool▁calls▁begin｜>",
        [TOOLS_HARMONY] = "<|channel|>commentary to=",
    };
    const enum tools_family f = (enum tools_family)_i;
    struct walker k;
    walker_init(&k, f, true);
    json_t *tools = k.tools;
    struct grammar_matcher *proto = k.proto;
    static char out[1 << 16];
    int ended = 0;
    for (uint64_t seed = 1; seed <= 12; seed++) {
        struct test_rng r = {seed};
        struct grammar_matcher *m;
        ck_assert_int_eq(grammar_matcher_fork(proto, &m), 0);
        /* free text first (Llama 3's calls only open an answer) */
        const char *text = f == TOOLS_LLAMA3 ? " \n" : seed % 2 ? "Let me see. " : "";
        ck_assert_int_eq(grammar_matcher_feed(m, text, strlen(text)), 0);
        ck_assert(grammar_matcher_pending(m) && grammar_matcher_accepting(m));
        snprintf(out, sizeof out, "%s%s", text, lead[f]);
        ck_assert_int_eq(grammar_matcher_feed(m, lead[f], strlen(lead[f])), 0);
        ck_assert(!grammar_matcher_pending(m));
        const bool done = grammar_walk(m, &k.w, &r, out, sizeof out, 3000);
        grammar_matcher_fini(m);
        if (!done) continue;
        ended++;
        struct tools_parsed p;
        walk_calls(f, tools, out, (int)seed, &p);
        if (f != TOOLS_HARMONY)
            ck_assert_str_eq(p.content, seed % 2 && f != TOOLS_LLAMA3 ? "Let me see." : "");
        tools_parsed_free(&p);
    }
    ck_assert_int_ge(ended, 8);
    /* a marker that goes on against the grammar is refused, and the text stays free */
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_fork(proto, &m), 0);
    char bad[64];
    snprintf(bad, sizeof bad, "%s\x01", lead[f]);
    ck_assert_int_eq(grammar_matcher_feed(m, bad, strlen(bad)), STRATA_EINVAL);
    ck_assert(grammar_matcher_pending(m));
    grammar_matcher_fini(m);
    walker_fini(&k);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tools");
    TCase *tc = tcase_create("tools");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, rendered_calls_parse_back, 0, (int)(sizeof CASES / sizeof *CASES));
    tcase_add_loop_test(tc, forced_calls_parse, 0, TOOLS_HARMONY + 1);
    tcase_add_test(tc, streams_hold_markers_and_unclosed_calls_stay_text);
    tcase_add_loop_test(tc, typed_xml_calls_validate, 0, 2);
    tcase_add_loop_test(tc, lazy_grammars_hold_calls_once_begun, 0, TOOLS_HARMONY + 1);
    suite_add_tcase(s, tc);
    return test_run(s);
}
