/* fe_grammar_test — structured output and tool calls through a real server: a strata-worker
 * (worker_run on a thread, its socket in the test's directory) on a random-weight fixture and a
 * strata-frontend over HTTP in front of it. Over many seeds an answer that finishes with `stop`
 * validates against its schema and one cut by `length` is a prefix of the grammar's language. */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/grammar/grammar.h"
#include "frontend/fe.h"
#include "gpu-worker/worker.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <arpa/inet.h>
#include <check.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static struct worker *W;
static pthread_t W_th;
static struct fe *F;
static int PORT;

static void *worker_main(void *arg)
{
    worker_run(arg);
    return NULL;
}

struct resp {
    int status;
    char *body; /* de-chunked */
};

/* post sends body to path over a fresh connection and reads the whole answer. */
static void post(const char *path, const char *body, struct resp *r)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)PORT)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char head[512];
    const size_t n = strlen(body);
    int k = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n\r\n",
                     path, n);
    ck_assert_int_eq(write(fd, head, (size_t)k), k);
    ck_assert_int_eq(write(fd, body, n), (ssize_t)n);
    size_t cap = 1 << 16, got = 0;
    char *raw = malloc(cap);
    ssize_t m;
    while ((m = read(fd, raw + got, cap - got - 1)) > 0) {
        got += (size_t)m;
        if (got + 1 == cap) raw = realloc(raw, cap *= 2);
    }
    raw[got] = 0;
    close(fd);
    char *sep = strstr(raw, "\r\n\r\n");
    ck_assert_ptr_nonnull(sep);
    r->status = atoi(raw + 9);
    char *p = sep + 4, *end = raw + got;
    r->body = malloc(got + 1);
    size_t len = 0;
    *sep = 0;
    if (strcasestr(raw, "transfer-encoding: chunked")) {
        while (p < end) {
            size_t c = strtoul(p, &p, 16);
            p = strstr(p, "\r\n") + 2;
            if (c == 0) break;
            memcpy(r->body + len, p, c);
            len += c;
            p += c + 2;
        }
    } else {
        memcpy(r->body, p, (size_t)(end - p));
        len = (size_t)(end - p);
    }
    r->body[len] = 0;
    free(raw);
}

static json_t *post_json(const char *body, int want)
{
    struct resp r;
    post("/v1/chat/completions", body, &r);
    ck_assert_msg(r.status == want, "status %d, want %d: %s\nbody: %s", r.status, want, r.body,
                  body);
    json_t *j = json_loads(r.body, 0, NULL);
    ck_assert_msg(j, "not JSON: %s", r.body);
    free(r.body);
    return j;
}

static const char *choice_str(json_t *j, const char *a, const char *b)
{
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *v = json_object_get(c, a);
    return json_string_value(b ? json_object_get(v, b) : v);
}

/* Pieces of Hermes calls, as GPT-2 byte-level token text (Ġ a space, Ċ a newline): the fixture's
 * vocabulary gets them in place of some of its unused [PAD] tokens, so that a random model begins
 * calls by itself now and then (tool_choice auto) and sometimes in ways the grammar refuses. */
static const char *const CALL_PIECES[] = {
    "<tool_call>",  "<tool_call>Ċ",  "<tool_call>Ċ{\"", "<tool_call>Ċ{\"name\":",
    "Ġ<tool_call>", ".<tool_call>Ċ", "<tool_call>x",    "<tool_call>Ċ{\"name\":Ġ\"ping\"",
    "</tool_call>", "Ċ</tool_call>", "}}Ċ</tool_call>", "<tool_call>ĊĊ",
};
#define N_CALL_PIECES (sizeof CALL_PIECES / sizeof *CALL_PIECES)

/* call_vocab writes to path the tokenizer of the fixture at base with CALL_PIECES as the last
 * tokens (NORMAL ones). */
static void call_vocab(const char *base, const char *path)
{
    struct gguf_file *f;
    struct gguf_writer *w;
    ck_assert_int_eq(gguf_open(base, &f), 0);
    ck_assert_int_eq(gguf_writer_open(path, 0, &w), 0);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        if (strncmp(kv->key, "tokenizer.", 10) != 0) continue;
        if (!strcmp(kv->key, "tokenizer.ggml.tokens")) {
            const uint64_t n = kv->val.arr.n;
            char **toks = calloc(n, sizeof *toks);
            for (uint64_t t = 0; t < n; t++) {
                const struct gguf_str *st = &kv->val.arr.items[t].str;
                toks[t] = t >= n - N_CALL_PIECES ? strdup(CALL_PIECES[t - (n - N_CALL_PIECES)])
                                                 : strndup(st->ptr, st->len);
            }
            ck_assert_int_eq(gguf_w_arr_str(w, kv->key, n, (const char *const *)toks, NULL), 0);
            for (uint64_t t = 0; t < n; t++)
                free(toks[t]);
            free(toks);
        } else if (!strcmp(kv->key, "tokenizer.ggml.token_type")) {
            const uint64_t n = kv->val.arr.n;
            int32_t *types = malloc(n * sizeof *types);
            memcpy(types, kv->val.arr.raw, n * sizeof *types);
            for (uint64_t t = n - N_CALL_PIECES; t < n; t++)
                types[t] = 1; /* NORMAL */
            ck_assert_int_eq(gguf_w_arr(w, kv->key, GGUF_INT32, n, types), 0);
            free(types);
        } else {
            ck_assert_int_eq(gguf_w_value(w, kv->key, &kv->val), 0);
        }
    }
    ck_assert_int_eq(gguf_writer_begin(w), 0);
    ck_assert_int_eq(gguf_writer_finish(w), 0);
    gguf_close(f);
}

static void setup(void)
{
    const char *tmp = test_tmpdir();
    static char model[600], run[600]; /* the worker keeps pointers to them */
    char url[700];
    snprintf(model, sizeof model, "%s/gram.gguf", tmp);
    snprintf(run, sizeof run, "%s/run-gram", tmp);
    mkdir(run, 0700);
    static char base[600], vocab[600];
    snprintf(base, sizeof base, "%s/gram-base.gguf", tmp);
    snprintf(vocab, sizeof vocab, "%s/gram-vocab.gguf", tmp);
    struct fixture_opts fo = {.seed = 5, .threads = 1};
    ck_assert_int_eq(fixture_write(&fo, base), 0);
    call_vocab(base, vocab);
    fo.vocab = vocab;
    ck_assert_int_eq(fixture_write(&fo, model), 0);
    struct worker_config c = {.model = model,
                              .runtime_dir = run,
                              .ctx = 512,
                              .max_seqs = 8,
                              .orphan_timeout_s = 60,
                              .watchdog_ms = -1};
    ck_assert_msg(worker_init(&c, &W) == 0, "%s", strata_errdetail());
    ck_assert_int_eq(pthread_create(&W_th, NULL, worker_main, W), 0);
    struct fe_opts o = {.max_tokens = 128, .monitor_ms = 50};
    ck_assert_int_eq(fe_init(&o, &F), 0);
    snprintf(url, sizeof url, "ipc://%s/worker-0.sock", run);
    ck_assert_msg(fe_add_worker_url(F, url) == 0, "%s", strata_errdetail());
    ck_assert_int_eq(fe_start(F), 0);
    ck_assert_int_eq(fe_wait_ready(F, 20000), 0);
    PORT = fe_port(F);
}

static void teardown(void)
{
    fe_fini(F);
    worker_stop(W);
    pthread_join(W_th, NULL);
    worker_fini(W);
}

static const char SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 12}, "
    "\"days\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"maxItems\": 3}, "
    "\"unit\": {\"enum\": [\"c\", \"f\"]}}, \"required\": [\"unit\", \"days\"], "
    "\"additionalProperties\": false}";

static bool schema_valid(const json_t *v)
{
    const char *unit = json_string_value(json_object_get(v, "unit"));
    const json_t *days = json_object_get(v, "days"), *city = json_object_get(v, "city");
    if (!json_is_object(v) || !unit || (strcmp(unit, "c") && strcmp(unit, "f"))) return false;
    if (!json_is_array(days) || json_array_size(days) > 3) return false;
    for (size_t i = 0; i < json_array_size(days); i++)
        if (!json_is_integer(json_array_get(days, i))) return false;
    if (city && !json_is_string(city)) return false;
    return json_object_size(v) == 2u + (city != NULL);
}

START_TEST(json_schema_answers_validate_over_seeds)
{
    json_t *schema = json_loads(SCHEMA, 0, NULL);
    char *gbnf;
    ck_assert_int_eq(grammar_from_schema(schema, &gbnf), 0);
    struct grammar *g;
    ck_assert_int_eq(grammar_parse(gbnf, strlen(gbnf), &g), 0);
    int stops = 0, lengths = 0;
    for (int seed = 0; seed < 16; seed++) {
        char body[2048];
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather %d?\"}], "
                 "\"seed\": %d, \"temperature\": %s, \"max_tokens\": %d, \"response_format\": "
                 "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"w\", \"strict\": "
                 "true, \"schema\": %s}}}",
                 seed, seed, seed % 4 == 1 ? "0" : "1.0", seed % 3 == 2 ? 6 : 120, SCHEMA);
        json_t *j = post_json(body, 200);
        const char *content = choice_str(j, "message", "content");
        const char *finish = choice_str(j, "finish_reason", NULL);
        ck_assert_ptr_nonnull(content);
        struct grammar_matcher *m;
        ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
        ck_assert_msg(grammar_matcher_feed(m, content, strlen(content)) == 0,
                      "seed %d: not a prefix of the schema's language: %s", seed, content);
        if (!strcmp(finish, "stop")) {
            json_t *v = json_loads(content, 0, NULL);
            ck_assert_msg(v && schema_valid(v), "seed %d: invalid answer: %s", seed, content);
            json_decref(v);
            stops++;
        } else {
            ck_assert_str_eq(finish, "length");
            lengths++;
        }
        grammar_matcher_fini(m);
        json_decref(j);
    }
    ck_assert_int_gt(stops, 0);
    ck_assert_int_gt(lengths, 0);
    grammar_fini(g);
    free(gbnf);
    json_decref(schema);
}
END_TEST

START_TEST(json_object_and_grammar_and_streams)
{
    json_t *j = post_json("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"seed\": "
                          "3, \"max_tokens\": 120, \"response_format\": {\"type\": "
                          "\"json_object\"}}",
                          200);
    const char *content = choice_str(j, "message", "content");
    if (!strcmp(choice_str(j, "finish_reason", NULL), "stop")) {
        json_t *v = json_loads(content, 0, NULL);
        ck_assert_msg(json_is_object(v), "not an object: %s", content);
        json_decref(v);
    }
    json_decref(j);
    /* llama-server's grammar field; a closed sentence stops without an end of turn */
    j = post_json("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": "
                  "50, \"grammar\": \"root ::= \\\"yes\\\" | \\\"no\\\"\"}",
                  200);
    content = choice_str(j, "message", "content");
    ck_assert_msg(!strcmp(content, "yes") || !strcmp(content, "no"), "%s", content);
    ck_assert_str_eq(choice_str(j, "finish_reason", NULL), "stop");
    json_decref(j);
    /* completions take a grammar too */
    struct resp c;
    post("/v1/completions",
         "{\"prompt\": \"Answer:\", \"max_tokens\": 20, \"grammar\": \"root ::= [0-9]{3}\"}", &c);
    ck_assert_int_eq(c.status, 200);
    json_t *cj = json_loads(c.body, 0, NULL);
    const char *ct = choice_str(cj, "text", NULL);
    ck_assert_msg(ct && strlen(ct) == 3 && strspn(ct, "0123456789") == 3, "%s", c.body);
    ck_assert_str_eq(choice_str(cj, "finish_reason", NULL), "stop");
    json_decref(cj);
    free(c.body);
    /* streamed: the deltas make the same answer as a whole one */
    struct resp r;
    const char *req = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"seed\": 9, "
                      "\"max_tokens\": 100, \"stream\": %s, \"response_format\": {\"type\": "
                      "\"json_schema\", \"json_schema\": {\"name\": \"w\", \"schema\": %s}}}";
    char body[2048];
    snprintf(body, sizeof body, req, "true", SCHEMA);
    post("/v1/chat/completions", body, &r);
    ck_assert_int_eq(r.status, 200);
    char text[8192] = "";
    for (char *p = r.body; (p = strstr(p, "data: ")) != NULL; p += 6) {
        json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        const char *d = choice_str(c, "delta", "content");
        if (d) strncat(text, d, sizeof text - strlen(text) - 1);
        json_decref(c);
    }
    free(r.body);
    snprintf(body, sizeof body, req, "false", SCHEMA);
    j = post_json(body, 200);
    ck_assert_str_eq(text, choice_str(j, "message", "content"));
    json_decref(j);
}
END_TEST

static void refused(const char *body, const char *param, const char *want)
{
    json_t *j = post_json(body, 400);
    json_t *err = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(err, "message"));
    ck_assert_str_eq(json_string_value(json_object_get(err, "param")), param);
    ck_assert_msg(strstr(msg, want), "message '%s', want '%s'", msg, want);
    json_decref(j);
}

START_TEST(bad_schemas_and_grammars_are_400)
{
    refused("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
            "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"w\", \"schema\": "
            "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"strng\"}}}}}}",
            "response_format.json_schema.schema", "#/properties/a: unknown type 'strng'");
    refused("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
            "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"w\", \"schema\": "
            "{\"$ref\": \"#/$defs/gone\"}}}}",
            "response_format.json_schema.schema", "does not resolve");
    refused("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
            "{\"type\": \"yaml\"}}",
            "response_format.type", "use \"text\"");
    refused("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"grammar\": "
            "\"root ::= \\\"a\\\"\\nb ::= (\"}",
            "grammar", "line 2");
    refused("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"grammar\": "
            "\"root ::= foo\"}",
            "grammar", "'foo' is used but not defined");
}
END_TEST

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"unit\": {\"enum\": [\"c\", \"f\"]}, \"n\": "
    "{\"type\": \"integer\"}}, \"required\": [\"unit\"], \"additionalProperties\": false}}}, "
    "{\"type\": \"function\", \"function\": {\"name\": \"ping\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"ok\": {\"type\": \"boolean\"}}, \"required\": [\"ok\"], "
    "\"additionalProperties\": false}}}]";

/* call_valid: a call of one of TOOLS with arguments its parameters accept. */
static bool call_valid(json_t *call, const char *only)
{
    const char *name =
        json_string_value(json_object_get(json_object_get(call, "function"), "name"));
    const char *args =
        json_string_value(json_object_get(json_object_get(call, "function"), "arguments"));
    const char *type = json_string_value(json_object_get(call, "type"));
    if (!name || !args || !type || strcmp(type, "function") ||
        !json_string_value(json_object_get(call, "id")))
        return false;
    if (only && strcmp(name, only)) return false;
    json_t *a = json_loads(args, 0, NULL);
    bool ok = json_is_object(a);
    if (ok && !strcmp(name, "get_weather")) {
        const char *unit = json_string_value(json_object_get(a, "unit"));
        json_t *n = json_object_get(a, "n");
        ok = unit && (!strcmp(unit, "c") || !strcmp(unit, "f")) && (!n || json_is_integer(n)) &&
             json_object_size(a) == 1u + (n != NULL);
    } else if (ok) {
        ok = !strcmp(name, "ping") && json_is_boolean(json_object_get(a, "ok")) &&
             json_object_size(a) == 1;
    }
    json_decref(a);
    return ok;
}

START_TEST(forced_tool_calls_validate)
{
    int calls = 0;
    for (int seed = 0; seed < 10; seed++) {
        char body[4096];
        const bool named = seed % 2;
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], \"seed\": "
                 "%d, \"max_tokens\": 120, \"tools\": %s, \"tool_choice\": %s, "
                 "\"parallel_tool_calls\": %s}",
                 seed, TOOLS,
                 named ? "{\"type\": \"function\", \"function\": {\"name\": \"ping\"}}"
                       : "\"required\"",
                 seed % 3 ? "false" : "true");
        json_t *j = post_json(body, 200);
        json_t *c = json_array_get(json_object_get(j, "choices"), 0);
        json_t *tc = json_object_get(json_object_get(c, "message"), "tool_calls");
        const char *finish = choice_str(j, "finish_reason", NULL);
        if (!strcmp(finish, "tool_calls")) {
            ck_assert_msg(json_array_size(tc) >= 1, "no calls: %s", json_dumps(j, 0));
            if (seed % 3) ck_assert_uint_eq(json_array_size(tc), 1);
            for (size_t i = 0; i < json_array_size(tc); i++)
                ck_assert_msg(call_valid(json_array_get(tc, i), named ? "ping" : NULL),
                              "seed %d: %s", seed, json_dumps(tc, 0));
            calls++;
        } else {
            ck_assert_str_eq(finish, "length"); /* cut before the call closed: text, no calls */
            ck_assert_ptr_null(tc);
        }
        json_decref(j);
    }
    ck_assert_int_gt(calls, 0);
}
END_TEST

START_TEST(tool_calls_stream_as_deltas)
{
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"seed\": 1, "
             "\"max_tokens\": 120, \"stream\": true, \"tools\": %s, \"tool_choice\": "
             "{\"type\": \"function\", \"function\": {\"name\": \"ping\"}}}",
             TOOLS);
    struct resp r;
    post("/v1/chat/completions", body, &r);
    ck_assert_int_eq(r.status, 200);
    int n_calls = 0;
    const char *finish = NULL;
    char last_finish[32] = "";
    for (char *p = r.body; (p = strstr(p, "data: ")) != NULL; p += 6) {
        json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        json_t *tc = json_object_get(json_object_get(ch, "delta"), "tool_calls");
        for (size_t i = 0; i < json_array_size(tc); i++) {
            ck_assert(json_is_integer(json_object_get(json_array_get(tc, i), "index")));
            ck_assert(call_valid(json_array_get(tc, i), "ping"));
            n_calls++;
        }
        /* no text of the call leaks out as content */
        const char *d = json_string_value(json_object_get(json_object_get(ch, "delta"), "content"));
        ck_assert_msg(!d || !strstr(d, "tool_call"), "content delta %s", d);
        if ((finish = json_string_value(json_object_get(ch, "finish_reason"))))
            snprintf(last_finish, sizeof last_finish, "%s", finish);
        json_decref(c);
    }
    free(r.body);
    ck_assert_str_eq(last_finish, "tool_calls");
    ck_assert_int_eq(n_calls, 1);
}
END_TEST

/* auto_calls_validate_over_seeds: under tool_choice auto the text is free until the model begins
 * a call, and every call it makes parses and its arguments validate (the lazy grammar holds a
 * call once begun); streamed answers carry the same calls as deltas. */
START_TEST(auto_calls_validate_over_seeds)
{
    int calls = 0, texts = 0;
    for (int seed = 0; seed < 24; seed++) {
        char body[4096];
        const bool stream = seed % 4 == 3;
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], \"seed\": "
                 "%d, \"max_tokens\": 100, \"tools\": %s%s%s}",
                 seed, TOOLS, seed % 2 ? ", \"tool_choice\": \"auto\"" : "",
                 stream ? ", \"stream\": true" : "");
        json_t *tc = NULL;
        const char *finish = NULL;
        char content[8192] = "";
        json_t *j = NULL;
        struct resp r = {0};
        if (!stream) {
            j = post_json(body, 200);
            json_t *msg =
                json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
            tc = json_incref(json_object_get(msg, "tool_calls"));
            finish = choice_str(j, "finish_reason", NULL);
            snprintf(content, sizeof content, "%s",
                     json_string_value(json_object_get(msg, "content")) ?: "");
        } else {
            post("/v1/chat/completions", body, &r);
            ck_assert_int_eq(r.status, 200);
            tc = json_array();
            static char last[32];
            for (char *p = r.body; (p = strstr(p, "data: ")) != NULL; p += 6) {
                json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
                json_t *delta =
                    json_object_get(json_array_get(json_object_get(c, "choices"), 0), "delta");
                json_array_extend(tc, json_object_get(delta, "tool_calls"));
                const char *d = json_string_value(json_object_get(delta, "content"));
                if (d) strncat(content, d, sizeof content - strlen(content) - 1);
                const char *fr = json_string_value(json_object_get(
                    json_array_get(json_object_get(c, "choices"), 0), "finish_reason"));
                if (fr) snprintf(last, sizeof last, "%s", fr);
                json_decref(c);
            }
            finish = last;
        }
        if (json_array_size(tc)) {
            ck_assert_str_eq(finish, "tool_calls");
            for (size_t i = 0; i < json_array_size(tc); i++)
                ck_assert_msg(call_valid(json_array_get(tc, i), NULL), "seed %d: %s", seed,
                              json_dumps(tc, 0));
            calls++;
        } else {
            /* no call: free text, or a call cut by the length (left as text) */
            ck_assert_msg(!strstr(content, "<tool_call>") || !strcmp(finish, "length"),
                          "seed %d: finish %s with a call in the text: %s", seed, finish, content);
            texts++;
        }
        json_decref(tc);
        json_decref(j);
        free(r.body);
    }
    ck_assert_int_gt(calls, 0);
    ck_assert_int_gt(texts, 0);
}
END_TEST

START_TEST(tool_errors_and_history)
{
    char body[4096];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": %s, "
             "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"nope\"}}}",
             TOOLS);
    refused(body, "tool_choice", "'nope', which is not in 'tools'");
    refused("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": "
            "\"required\"}",
            "tool_choice", "no 'tools'");
    refused("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": "
            "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
            "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"wat\"}}}}}]}",
            "tools[0]", "unknown type 'wat'");
    refused("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": "
            "[{\"type\": \"function\", \"function\": {\"name\": \"bad name\"}}]}",
            "tools[0]", "function.name");
    /* a conversation with a call and its result renders and answers */
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": "
             "\"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call_1\", "
             "\"type\": \"function\", \"function\": {\"name\": \"ping\", \"arguments\": "
             "\"{\\\"ok\\\": true}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"call_1\", "
             "\"content\": \"pong\"}], \"max_tokens\": 4, \"tools\": %s, \"tool_choice\": "
             "\"none\"}",
             TOOLS);
    json_t *j = post_json(body, 200);
    ck_assert_ptr_null(json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"),
        "tool_calls"));
    json_decref(j);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fe_grammar");
    TCase *tc = tcase_create("server");
    tcase_set_timeout(tc, 240);
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_add_test(tc, json_schema_answers_validate_over_seeds);
    tcase_add_test(tc, json_object_and_grammar_and_streams);
    tcase_add_test(tc, bad_schemas_and_grammars_are_400);
    tcase_add_test(tc, forced_tool_calls_validate);
    tcase_add_test(tc, tool_calls_stream_as_deltas);
    tcase_add_test(tc, auto_calls_validate_over_seeds);
    tcase_add_test(tc, tool_errors_and_history);
    suite_add_tcase(s, tc);
    return test_run_threads(s);
}
