/* tools — tool-call syntaxes: detection from a template, forcing grammars, parsing. */
#include "frontend/tools.h"
#include "common/base/err.h"
#include "common/grammar/grammar.h"
#include "common/tmpl/tmpl.h"
#include "common/tok/tok.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_CALLS_END   "<｜tool▁calls▁end｜>"
#define DS_CALL_BEGIN  "<｜tool▁call▁begin｜>"
#define DS_CALL_END    "<｜tool▁call▁end｜>"
#define DS_SEP         "<｜tool▁sep｜>"

static const char *const NAMES[] = {"hermes",     "qwen3-coder", "glm",      "mistral",
                                    "mistral-v3", "llama3",      "deepseek", "harmony"};

const char *tools_family_name(enum tools_family f)
{
    return NAMES[f];
}

enum tools_family tools_detect(const struct tmpl *t, const char *bos, const char *eos)
{
    static const char probe[] =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", "
        "\"content\": \"\", \"tool_calls\": [{\"id\": \"abcdefghi\", \"type\": \"function\", "
        "\"function\": {\"name\": \"probe_fn\", \"arguments\": {\"a\": 1}}}]}, {\"role\": "
        "\"tool\", \"tool_call_id\": \"abcdefghi\", \"name\": \"probe_fn\", \"content\": \"r\"}], "
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"probe_fn\", "
        "\"description\": \"d\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": "
        "{\"type\": \"integer\"}}}}}], \"add_generation_prompt\": true}";
    static const struct {
        const char *marker;
        enum tools_family f;
    } signs[] = {
        {"to=functions.probe_fn", TOOLS_HARMONY},
        {DS_CALL_BEGIN, TOOLS_DEEPSEEK},
        {"[TOOL_CALLS][", TOOLS_MISTRAL_V3},
        {"[TOOL_CALLS]probe_fn", TOOLS_MISTRAL},
        {"<function=probe_fn>", TOOLS_QWEN_XML},
        {"<tool_call>probe_fn", TOOLS_GLM},
        {"<tool_call>", TOOLS_HERMES},
        {"\"name\": \"probe_fn\", \"parameters\"", TOOLS_LLAMA3},
    };
    json_t *vars = json_loads(probe, 0, NULL);
    char *out = NULL;
    size_t len;
    enum tools_family f = TOOLS_HERMES;
    if (vars) {
        json_object_set_new(vars, "bos_token", json_string(bos ? bos : ""));
        json_object_set_new(vars, "eos_token", json_string(eos ? eos : ""));
    }
    if (vars && tmpl_render_json(t, vars, &out, &len) == 0)
        for (size_t i = 0; i < sizeof signs / sizeof *signs; i++)
            if (strstr(out, signs[i].marker)) {
                f = signs[i].f;
                break;
            }
    free(out);
    json_decref(vars);
    return f;
}

/* ---- parsing ----------------------------------------------------------------------------------
 */

static size_t find(const char *s, size_t n, size_t from, const char *m)
{
    const size_t k = strlen(m);
    for (size_t i = from; i + k <= n; i++)
        if (memcmp(s + i, m, k) == 0) return i;
    return n;
}

static bool at(const char *s, size_t n, size_t pos, const char *m)
{
    const size_t k = strlen(m);
    return pos + k <= n && memcmp(s + pos, m, k) == 0;
}

static size_t skip_ws(const char *s, size_t n, size_t pos)
{
    while (pos < n && (s[pos] == ' ' || s[pos] == '\n' || s[pos] == '\t' || s[pos] == '\r'))
        pos++;
    return pos;
}

/* json_at parses one JSON value at s[pos..n) and sets *end after it. */
static json_t *json_at(const char *s, size_t n, size_t pos, size_t *end)
{
    json_error_t je;
    json_t *v = json_loadb(s + pos, n - pos, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &je);
    if (v) *end = pos + (size_t)je.position;
    return v;
}

struct parse {
    enum tools_family f;
    const json_t *tools; /* the request's, for the types of XML-like arguments; may be NULL */
    const char *seed;
    struct tools_parsed *out;
    size_t cap;
    int err;
};

static void make_id(const struct parse *p, size_t idx, char *buf, size_t n)
{
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t h = 1469598103934665603ull ^ idx;
    for (const char *c = p->seed; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    const bool mistral = p->f == TOOLS_MISTRAL || p->f == TOOLS_MISTRAL_V3;
    size_t k = 0;
    if (!mistral) k = (size_t)snprintf(buf, n, "call_");
    const size_t len = mistral ? 9 : 29;
    for (; k < len && k + 1 < n; k++) {
        h ^= h >> 29;
        h *= 0xbf58476d1ce4e5b9ull;
        h ^= h >> 32;
        buf[k] = alnum[h % 62];
    }
    buf[k] = 0;
}

/* add_call appends a call of name with args (a JSON value: an object, or a text that encodes
 * one; taken). */
static void add_call(struct parse *p, const char *name, size_t name_len, json_t *args)
{
    if (json_is_string(args)) { /* arguments sent as a JSON text of an object */
        json_t *o = json_loads(json_string_value(args), 0, NULL);
        if (o) {
            json_decref(args);
            args = o;
        }
    }
    if (!args) args = json_object();
    struct tools_parsed *o = p->out;
    if (o->n_calls == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 4;
        struct api_tool_call *c = realloc(o->calls, cap * sizeof *c);
        if (!c) {
            p->err = STRATA_ENOMEM;
            json_decref(args);
            return;
        }
        o->calls = c;
        p->cap = cap;
    }
    char id[40];
    make_id(p, o->n_calls, id, sizeof id);
    struct api_tool_call *c = &o->calls[o->n_calls];
    c->id = strdup(id);
    c->name = strndup(name, name_len);
    c->arguments = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(args);
    if (!c->id || !c->name || !c->arguments) {
        free(c->id);
        free(c->name);
        free(c->arguments);
        p->err = STRATA_ENOMEM;
        return;
    }
    o->n_calls++;
}

/* call_object takes a call written as JSON: {"name", "arguments" | "parameters"}. */
static bool call_object(struct parse *p, json_t *v)
{
    const char *name = json_string_value(json_object_get(v, "name"));
    json_t *args = json_object_get(v, "arguments");
    if (!args) args = json_object_get(v, "parameters");
    if (!json_is_object(v) || !name || (args && !json_is_object(args) && !json_is_string(args)))
        return false;
    add_call(p, name, strlen(name), json_incref(args));
    return true;
}

/* param_schema: the schema of parameter key of function name[0..nl) in p's tools, or NULL. */
static const json_t *param_schema(const struct parse *p, const char *name, size_t nl,
                                  const char *key)
{
    size_t i;
    const json_t *t;
    json_array_foreach(p->tools, i, t)
    {
        const json_t *fn = json_object_get(t, "function");
        const char *n = json_string_value(json_object_get(fn, "name"));
        if (n && strlen(n) == nl && memcmp(n, name, nl) == 0)
            return json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"),
                                   key);
    }
    return NULL;
}

/* value_of reads an XML-style parameter value: the text for a string parameter (ps, NULL when
 * unknown), else JSON when it is JSON (Python's True and False as booleans), else the text. */
static json_t *value_of(const json_t *ps, const char *s, size_t n)
{
    if (ps && tools_string_param(ps)) return json_stringn(s, n);
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY, NULL);
    if (!v && n == 4 && memcmp(s, "True", 4) == 0) v = json_true();
    if (!v && n == 5 && memcmp(s, "False", 5) == 0) v = json_false();
    return v ? v : json_stringn(s, n);
}

/* xml_arg reads one XML-style parameter value at s[v..) that ends at close, into *val, and
 * returns where close is (n when it is not there). A typed parameter's JSON is read as JSON
 * first: its strings may hold the closing marker. strip_nl: a newline before close is not the
 * value's (Qwen3-Coder writes one). */
static size_t xml_arg(const json_t *ps, const char *s, size_t n, size_t v, const char *close,
                      bool strip_nl, json_t **val)
{
    if (ps && !tools_string_param(ps)) {
        size_t end;
        json_t *j = json_at(s, n, skip_ws(s, n, v), &end);
        if (j && at(s, n, (end = skip_ws(s, n, end)), close)) {
            *val = j;
            return end;
        }
        json_decref(j);
    }
    const size_t e = find(s, n, v, close);
    if (e == n) return n;
    size_t vl = e - v;
    if (strip_nl && vl && s[v + vl - 1] == '\n') vl--;
    *val = value_of(ps, s + v, vl);
    return e;
}

/* xml_param adds the parameter named s[k..k_end) to args, its value at s[v..) ending at close,
 * typed by the parameter's schema in function s[name..name_end); returns where close is, n when
 * it is not there. */
static size_t xml_param(const struct parse *p, const char *s, size_t n, size_t name,
                        size_t name_end, size_t k, size_t k_end, size_t v, const char *close,
                        bool strip_nl, json_t *args)
{
    char *key = strndup(s + k, k_end - k);
    json_t *val = NULL;
    const size_t e = key ? xml_arg(param_schema(p, s + name, name_end - name, key), s, n, v, close,
                                   strip_nl, &val)
                         : n;
    if (e < n) json_object_set_new(args, key, val);
    free(key);
    return e;
}

/* Each family's parser takes the calls from pos (at the first marker) and returns where they
 * end, or (size_t)-1 when a call is not complete. */
typedef size_t (*parse_fn)(struct parse *p, const char *s, size_t n, size_t pos);

static size_t parse_hermes(struct parse *p, const char *s, size_t n, size_t pos)
{
    while (at(s, n, pos, "<tool_call>")) {
        size_t end;
        json_t *v = json_at(s, n, skip_ws(s, n, pos + 11), &end);
        bool ok = v && call_object(p, v);
        json_decref(v);
        end = ok ? skip_ws(s, n, end) : n;
        if (!ok || !at(s, n, end, "</tool_call>")) return (size_t)-1;
        pos = skip_ws(s, n, end + 12);
    }
    return pos;
}

static size_t parse_qwen_xml(struct parse *p, const char *s, size_t n, size_t pos)
{
    while (at(s, n, pos, "<tool_call>")) {
        pos = skip_ws(s, n, pos + 11);
        if (!at(s, n, pos, "<function=")) return (size_t)-1;
        size_t name = pos + 10, name_end = find(s, n, name, ">");
        if (name_end == n) return (size_t)-1;
        json_t *args = json_object();
        pos = skip_ws(s, n, name_end + 1);
        while (at(s, n, pos, "<parameter=")) {
            size_t k = pos + 11, k_end = find(s, n, k, ">");
            size_t v = k_end + 1 < n && s[k_end + 1] == '\n' ? k_end + 2 : k_end + 1;
            size_t v_end = k_end < n ? xml_param(p, s, n, name, name_end, k, k_end, v,
                                                 "</parameter>", true, args)
                                     : n;
            if (v_end == n) {
                json_decref(args);
                return (size_t)-1;
            }
            pos = skip_ws(s, n, v_end + 12);
        }
        if (!at(s, n, pos, "</function>")) {
            json_decref(args);
            return (size_t)-1;
        }
        pos = skip_ws(s, n, pos + 11);
        if (!at(s, n, pos, "</tool_call>")) {
            json_decref(args);
            return (size_t)-1;
        }
        add_call(p, s + name, name_end - name, args);
        pos = skip_ws(s, n, pos + 12);
    }
    return pos;
}

static size_t parse_glm(struct parse *p, const char *s, size_t n, size_t pos)
{
    while (at(s, n, pos, "<tool_call>")) {
        size_t name = skip_ws(s, n, pos + 11), name_end = name;
        while (name_end < n && s[name_end] != '<' && s[name_end] != '\n')
            name_end++;
        json_t *args = json_object();
        pos = skip_ws(s, n, name_end);
        while (at(s, n, pos, "<arg_key>")) {
            size_t k = pos + 9, k_end = find(s, n, k, "</arg_key>");
            size_t v = skip_ws(s, n, k_end + 10);
            if (k_end == n || !at(s, n, v, "<arg_value>")) break;
            v += 11;
            size_t v_end =
                xml_param(p, s, n, name, name_end, k, k_end, v, "</arg_value>", false, args);
            if (v_end == n) break;
            pos = skip_ws(s, n, v_end + 12);
        }
        if (!at(s, n, pos, "</tool_call>") || name_end == name) {
            json_decref(args);
            return (size_t)-1;
        }
        add_call(p, s + name, name_end - name, args);
        pos = skip_ws(s, n, pos + 12);
    }
    return pos;
}

static size_t parse_mistral(struct parse *p, const char *s, size_t n, size_t pos)
{
    while (at(s, n, pos, "[TOOL_CALLS]")) {
        pos = skip_ws(s, n, pos + 12);
        size_t end;
        if (pos < n && s[pos] == '[') { /* the older form: a JSON array of calls */
            json_t *a = json_at(s, n, pos, &end), *c;
            size_t i;
            if (!json_is_array(a)) {
                json_decref(a);
                return (size_t)-1;
            }
            json_array_foreach(a, i, c) if (!call_object(p, c))
            {
                json_decref(a);
                return (size_t)-1;
            }
            json_decref(a);
            pos = skip_ws(s, n, end);
            continue;
        }
        size_t name = pos, name_end = name;
        while (name_end < n && s[name_end] != '[')
            name_end++;
        pos = name_end;
        if (at(s, n, pos, "[CALL_ID]")) pos = find(s, n, pos, "[ARGS]");
        if (!at(s, n, pos, "[ARGS]") || name_end == name) return (size_t)-1;
        json_t *args = json_at(s, n, pos + 6, &end);
        if (!json_is_object(args) && !json_is_string(args)) {
            json_decref(args);
            return (size_t)-1;
        }
        add_call(p, s + name, name_end - name, args);
        pos = skip_ws(s, n, end);
    }
    return pos;
}

static size_t parse_llama3(struct parse *p, const char *s, size_t n, size_t pos)
{
    if (at(s, n, pos, "<|python_tag|>")) pos += 14;
    for (;;) {
        size_t end;
        json_t *v = json_at(s, n, skip_ws(s, n, pos), &end);
        bool ok = v && call_object(p, v);
        json_decref(v);
        if (!ok) return (size_t)-1;
        pos = skip_ws(s, n, end);
        if (pos < n && s[pos] == ';') { /* several calls, as Llama 3.2 writes them */
            pos++;
            continue;
        }
        return pos;
    }
}

static size_t parse_deepseek(struct parse *p, const char *s, size_t n, size_t pos)
{
    if (at(s, n, pos, DS_CALLS_BEGIN)) pos += strlen(DS_CALLS_BEGIN);
    while (at(s, n, (pos = skip_ws(s, n, pos)), DS_CALL_BEGIN)) {
        size_t x = pos + strlen(DS_CALL_BEGIN), sep = find(s, n, x, DS_SEP), end;
        if (sep == n) return (size_t)-1;
        size_t name = x, name_end = sep, a = sep + strlen(DS_SEP);
        if (sep - x == 8 && memcmp(s + x, "function", 8) == 0) { /* V3 / R1: name, ```json */
            name = a;
            name_end = find(s, n, a, "\n");
            a = skip_ws(s, n, name_end);
            if (at(s, n, a, "```json")) a += 7;
        }
        json_t *args = json_at(s, n, skip_ws(s, n, a), &end);
        if (!json_is_object(args) && !json_is_string(args)) {
            json_decref(args);
            return (size_t)-1;
        }
        end = skip_ws(s, n, end);
        if (at(s, n, end, "```")) end = skip_ws(s, n, end + 3);
        if (!at(s, n, end, DS_CALL_END) || name_end == name) {
            json_decref(args);
            return (size_t)-1;
        }
        add_call(p, s + name, name_end - name, args);
        pos = end + strlen(DS_CALL_END);
    }
    if (at(s, n, pos, DS_CALLS_END)) pos += strlen(DS_CALLS_END);
    return pos;
}

static size_t parse_harmony(struct parse *p, const char *s, size_t n, size_t pos)
{
    size_t to;
    while ((to = find(s, n, pos, "to=functions.")) < n) {
        size_t name = to + 13, name_end = name;
        while (name_end < n && s[name_end] != ' ' && s[name_end] != '<' && s[name_end] != '\n')
            name_end++;
        size_t msg = find(s, n, name_end, "<|message|>"), end;
        if (msg == n || name_end == name) return (size_t)-1;
        json_t *args = json_at(s, n, msg + 11, &end);
        if (!json_is_object(args) && !json_is_string(args)) {
            json_decref(args);
            return (size_t)-1;
        }
        add_call(p, s + name, name_end - name, args);
        pos = end;
        if (at(s, n, pos, "<|call|>")) pos += 8;
        if (find(s, n, pos, "to=functions.") == n) break;
    }
    return pos;
}

static const struct family {
    parse_fn parse;
    const char *markers[3]; /* where calls start */
} FAMILIES[] = {
    [TOOLS_HERMES] = {parse_hermes, {"<tool_call>"}},
    [TOOLS_QWEN_XML] = {parse_qwen_xml, {"<tool_call>"}},
    [TOOLS_GLM] = {parse_glm, {"<tool_call>"}},
    [TOOLS_MISTRAL] = {parse_mistral, {"[TOOL_CALLS]"}},
    [TOOLS_MISTRAL_V3] = {parse_mistral, {"[TOOL_CALLS]"}},
    [TOOLS_LLAMA3] = {parse_llama3, {"<|python_tag|>", "{\""}},
    [TOOLS_DEEPSEEK] = {parse_deepseek, {DS_CALLS_BEGIN, DS_CALL_BEGIN}},
    [TOOLS_HARMONY] = {parse_harmony,
                       {"<|channel|>commentary to=functions.", "<|start|>assistant to=functions.",
                        " to=functions."}},
};

/* first_marker: where the first call starts, n if nowhere. Llama 3's calls are the whole answer:
 * only a JSON object at the start counts. */
static size_t first_marker(enum tools_family f, const char *s, size_t n)
{
    if (f == TOOLS_LLAMA3) {
        size_t pos = skip_ws(s, n, 0);
        return at(s, n, pos, "<|python_tag|>") || at(s, n, pos, "{\"") ? pos : n;
    }
    size_t best = n;
    for (int i = 0; i < 3 && FAMILIES[f].markers[i]; i++) {
        size_t k = find(s, n, 0, FAMILIES[f].markers[i]);
        if (k < best) best = k;
    }
    return best;
}

/* harmony_content sets out's content to the final channel's message of a harmony answer (the
 * analysis channel is reasoning, the commentary channel the calls), "" when it has none. */
static int harmony_content(const char *s, size_t n, struct tools_parsed *out)
{
    static const char FINAL[] = "<|channel|>final<|message|>";
    size_t at = find(s, n, 0, FINAL), end = n;
    if (at < n) {
        at += sizeof FINAL - 1;
        static const char *const ends[] = {"<|end|>", "<|return|>", "<|start|>", "<|call|>"};
        for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
            size_t e = find(s, n, at, ends[i]);
            if (e < end) end = e;
        }
    } else
        at = end = 0;
    if (!(out->content = strndup(s + at, end - at))) {
        tools_parsed_free(out);
        return STRATA_ENOMEM;
    }
    out->content_len = end - at;
    return 0;
}

int tools_parse(enum tools_family f, const json_t *tools, const char *text, size_t n,
                const char *id_seed, struct tools_parsed *out)
{
    memset(out, 0, sizeof *out);
    struct parse p = {.f = f, .tools = tools, .seed = id_seed ? id_seed : "", .out = out};
    size_t start = first_marker(f, text, n), end = n;
    if (start < n) end = FAMILIES[f].parse(&p, text, n, start);
    if (p.err) {
        tools_parsed_free(out);
        return p.err;
    }
    if (end == (size_t)-1) { /* a call opened and not closed: keep the text as it is */
        for (size_t i = 0; i < out->n_calls; i++) {
            free(out->calls[i].id);
            free(out->calls[i].name);
            free(out->calls[i].arguments);
        }
        out->n_calls = 0;
        out->unclosed = true;
        start = n;
        end = n;
    }
    /* the content: before the calls and after them; gpt-oss's is its final channel */
    if (f == TOOLS_HARMONY && !out->unclosed && find(text, n, 0, "<|channel|>") < n)
        return harmony_content(text, n, out);
    out->content = malloc(n + 1);
    if (!out->content) {
        tools_parsed_free(out);
        return STRATA_ENOMEM;
    }
    size_t head = start, tail = n - end;
    while (head && out->n_calls && (text[head - 1] == ' ' || text[head - 1] == '\n'))
        head--;
    memcpy(out->content, text, head);
    memcpy(out->content + head, text + end, tail);
    out->content_len = head + tail;
    out->content[out->content_len] = 0;
    return 0;
}

void tools_parsed_free(struct tools_parsed *p)
{
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].id);
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    free(p->content);
    memset(p, 0, sizeof *p);
}

size_t tools_content_end(enum tools_family f, const char *text, size_t n)
{
    size_t end = first_marker(f, text, n);
    if (f == TOOLS_LLAMA3) /* an answer of blanks so far may still open a call */
        return skip_ws(text, n, 0) == n ? 0 : end;
    if (f == TOOLS_HARMONY) return 0; /* channels: the content is known once the answer is */
    if (end < n) return end;
    /* a tail that may begin a marker is held back */
    for (int i = 0; i < 3 && FAMILIES[f].markers[i]; i++) {
        const char *m = FAMILIES[f].markers[i];
        const size_t k = strlen(m);
        for (size_t j = n > k ? n - k + 1 : 0; j < n; j++)
            if (memcmp(text + j, m, n - j) == 0 && j < end) end = j;
    }
    return end;
}

/* ---- forcing grammars -------------------------------------------------------------------------
 */

struct gb {
    char *p;
    size_t n, cap;
    bool oom;
};

static void gb_printf(struct gb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void gb_printf(struct gb *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0 || b->oom) return;
    if (b->n + (size_t)k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 512;
        while (cap < b->n + (size_t)k + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

/* The call syntax of each family around a function's name and its arguments: GBNF pieces.
 * `open`, `close` surround all calls; `sep` goes between parallel ones. */
struct syntax {
    const char *open, *before_name, *after_name, *after_args, *sep, *close;
    bool json_args; /* the arguments are JSON (else XML-like text) */
    bool parallel;  /* the syntax has several calls */
};

static const struct syntax SYNTAX[] = {
    [TOOLS_HERMES] = {"", "\"<tool_call>\\n{\\\"name\\\": \\\"", "\\\", \\\"arguments\\\": \"",
                      "\"}\\n</tool_call>\"", "\"\\n\"", "", true, true},
    [TOOLS_QWEN_XML] = {"", "\"<tool_call>\\n<function=", ">\\n\"",
                        "\"</function>\\n</tool_call>\"", "\"\\n\"", "", false, true},
    [TOOLS_GLM] = {"", "\"<tool_call>", "\"", "\"</tool_call>\"", "", "", false, true},
    [TOOLS_MISTRAL] = {"", "\"[TOOL_CALLS]", "[ARGS]\"", "", "", "", true, true},
    [TOOLS_MISTRAL_V3] = {"\"[TOOL_CALLS][\"", "\"{\\\"name\\\": \\\"",
                          "\\\", \\\"arguments\\\": \"", "\"}\"", "\", \"", "\"]\"", true, true},
    [TOOLS_LLAMA3] = {"", "\"{\\\"name\\\": \\\"", "\\\", \\\"parameters\\\": \"", "\"}\"", "", "",
                      true, false},
    [TOOLS_DEEPSEEK] = {"\"" DS_CALLS_BEGIN "\"", "\"" DS_CALL_BEGIN, DS_SEP "\"",
                        "\"" DS_CALL_END "\"", "", "\"" DS_CALLS_END "\"", true, true},
    [TOOLS_HARMONY] = {"", "\"<|channel|>commentary to=functions.",
                       " <|constrain|>json<|message|>\"", "\"<|call|>\"", "", "", true, false},
};

/* token_refs rewrites the markers in b's literals that are control tokens of tok as <[id]>, so
 * the grammar has the model write the token itself, not its text spelled by other tokens. */
static void token_refs(struct gb *b, const struct tok *tok)
{
    static const char *const markers[] = {
        "[TOOL_CALLS]", "[ARGS]",   "[CALL_ID]",    "<|channel|>", "<|constrain|>",
        "<|message|>",  "<|call|>", DS_CALLS_BEGIN, DS_CALLS_END,  DS_CALL_BEGIN,
        DS_CALL_END,    DS_SEP,     "<tool_call>",  "</tool_call>"};
    for (size_t k = 0; tok && k < sizeof markers / sizeof *markers && !b->oom; k++) {
        const size_t ml = strlen(markers[k]);
        const int32_t id = tok_find(tok, markers[k], ml);
        if (id < 0 || tok_token_type(tok, id) != TOK_TYPE_CONTROL) continue;
        struct gb out = {0};
        for (size_t i = 0; i < b->n;) {
            if (i + ml <= b->n && memcmp(b->p + i, markers[k], ml) == 0) {
                gb_printf(&out, "\" <[%d]> \"", id);
                i += ml;
            } else
                gb_printf(&out, "%c", b->p[i++]);
        }
        free(b->p);
        *b = out;
    }
}

/* gb_lit writes s as a GBNF literal. */
static void gb_lit(struct gb *b, const char *s)
{
    gb_printf(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        if (*c == '"' || *c == '\\')
            gb_printf(b, "\\%c", *c);
        else if (*c == '\n')
            gb_printf(b, "\\n");
        else if (*c < 0x20 || *c == 0x7f)
            gb_printf(b, "\\x%02x", *c);
        else
            gb_printf(b, "%c", *c);
    gb_printf(b, "\"");
}

/* The triggers of a lazy grammar (tool_choice auto): where each family's calls begin. */
static const char *const TRIGGER[] = {
    [TOOLS_HERMES] = "%trigger \"<tool_call>\"",
    [TOOLS_QWEN_XML] = "%trigger \"<tool_call>\"",
    [TOOLS_GLM] = "%trigger \"<tool_call>\"",
    [TOOLS_MISTRAL] = "%trigger \"[TOOL_CALLS]\"",
    [TOOLS_MISTRAL_V3] = "%trigger \"[TOOL_CALLS]\"",
    [TOOLS_LLAMA3] = "%trigger-start \"{\"",
    [TOOLS_DEEPSEEK] = "%trigger \"" DS_CALLS_BEGIN "\"",
    [TOOLS_HARMONY] = "%trigger \"<|channel|>commentary to=\"",
};

/* xml_value writes the GBNF of one parameter's value in the XML-like syntaxes: a string's text as
 * it is (an enum's or const's strings as alternatives), anything else as JSON of its schema
 * (rule `rule`, added to the schemas compiled). */
static void xml_value(struct gb *b, const json_t *ps, const char *rule)
{
    const json_t *en = json_object_get(ps, "enum"), *cn = json_object_get(ps, "const"), *v;
    size_t i;
    if (!tools_string_param(ps)) {
        gb_printf(b, "%s", rule);
        return;
    }
    if (json_is_string(cn)) {
        gb_lit(b, json_string_value(cn));
        return;
    }
    if (json_array_size(en)) {
        gb_printf(b, "(");
        json_array_foreach(en, i, v)
        {
            gb_printf(b, "%s", i ? " | " : "");
            gb_lit(b, json_string_value(v));
        }
        gb_printf(b, ")");
        return;
    }
    gb_printf(b, "xml-text");
}

bool tools_string_param(const json_t *ps)
{
    const json_t *type = json_object_get(ps, "type"), *en = json_object_get(ps, "enum"), *v;
    size_t i;
    if (json_is_string(json_object_get(ps, "const"))) return true;
    if (json_array_size(en)) {
        json_array_foreach(en, i, v) if (!json_is_string(v)) return false;
        return true;
    }
    return json_is_string(type) && strcmp(json_string_value(type), "string") == 0;
}

int tools_grammar(enum tools_family f, const json_t *tools, const char *only, bool parallel,
                  bool lazy, const struct tok *tok, char **gbnf)
{
    *gbnf = NULL;
    const struct syntax *sx = &SYNTAX[f];
    const size_t n = json_array_size(tools);
    size_t cap = n + 1; /* schemas: one per function, or one per typed parameter */
    for (size_t i = 0; i < n; i++)
        cap += json_object_size(json_object_get(
            json_object_get(json_object_get(json_array_get(tools, i), "function"), "parameters"),
            "properties"));
    const json_t **schemas = calloc(cap, sizeof *schemas);
    char(*names)[32] = calloc(cap, sizeof *names);
    const char **np = calloc(cap, sizeof *np);
    json_t *any_object = json_pack("{s:s}", "type", "object");
    struct gb b = {0}, xa = {0}; /* the grammar, and the XML syntaxes' argument rules */
    char *args = NULL;
    int rv = 0;
    size_t k = 0, ns = 0;
    bool generic = false; /* some function takes any XML arguments */
    if (!schemas || !names || !np || !any_object) {
        rv = STRATA_ENOMEM;
        goto out;
    }
    if (lazy) gb_printf(&b, "%s\n", TRIGGER[f]);
    if (parallel && sx->parallel)
        gb_printf(&b, "root ::= %s call (%s call)* %s\n", sx->open, sx->sep, sx->close);
    else
        gb_printf(&b, "root ::= %s call %s\n", sx->open, sx->close);
    gb_printf(&b, "call ::=");
    for (size_t i = 0; i < n; i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (only && strcmp(name, only) != 0) continue;
        const json_t *params = json_object_get(fn, "parameters");
        char args_rule[32];
        if (sx->json_args) {
            snprintf(names[ns], sizeof names[ns], "args-%zu", k);
            np[ns] = names[ns];
            schemas[ns++] = params && !json_is_null(params) ? params : any_object;
            snprintf(args_rule, sizeof args_rule, "args-%zu", k);
        } else if (!json_is_object(json_object_get(params, "properties"))) {
            snprintf(args_rule, sizeof args_rule, "xml-args");
            generic = true;
        } else { /* each parameter by its schema, the required ones present */
            snprintf(args_rule, sizeof args_rule, "xargs-%zu", k);
            const json_t *props = json_object_get(params, "properties"), *req, *ps;
            const char *key;
            size_t j = 0;
            gb_printf(&xa, "%s ::=", args_rule);
            json_object_foreach((json_t *)props, key, ps)
            {
                bool required = false;
                size_t r;
                json_t *rk;
                req = json_object_get(params, "required");
                json_array_foreach(req, r, rk) required |= !strcmp(json_string_value(rk), key);
                const char *rule = names[ns];
                snprintf(names[ns], sizeof names[ns], "xv-%zu-%zu", k, j++);
                if (!tools_string_param(ps)) { /* JSON: its schema's rule */
                    np[ns] = names[ns];
                    schemas[ns++] = ps;
                }
                gb_printf(&xa, " (");
                gb_printf(&xa, f == TOOLS_QWEN_XML ? "\"<parameter=\" " : "\"<arg_key>\" ");
                gb_lit(&xa, key);
                gb_printf(&xa, f == TOOLS_QWEN_XML ? " \">\\n\" " : " \"</arg_key><arg_value>\" ");
                xml_value(&xa, ps, rule);
                gb_printf(&xa,
                          f == TOOLS_QWEN_XML ? " \"\\n</parameter>\\n\")" : " \"</arg_value>\")");
                if (!required) gb_printf(&xa, "?");
            }
            gb_printf(&xa, "\n");
        }
        gb_printf(&b, "%s %s%s%s %s %s", k ? " |" : "", sx->before_name, name, sx->after_name,
                  args_rule, sx->after_args);
        k++;
    }
    gb_printf(&b, "\n");
    if (xa.n) gb_printf(&b, "%s", xa.p);
    token_refs(&b, tok);
    if (k == 0) {
        rv = strata_errf(STRATA_EINVAL, "no tool named '%s'", only ? only : "");
        goto out;
    }
    if (ns) {
        if ((rv = grammar_from_schemas(schemas, np, ns, &args)) != 0) goto out;
        gb_printf(&b, "%s", args);
    }
    if (!sx->json_args) gb_printf(&b, "xml-text ::= [^<]*\n");
    if (generic && f == TOOLS_QWEN_XML)
        gb_printf(&b, "xml-args ::= (\"<parameter=\" [a-zA-Z0-9_.-]+ \">\\n\" [^<]* "
                      "\"</parameter>\\n\")*\n");
    else if (generic)
        gb_printf(&b, "xml-args ::= (\"<arg_key>\" [a-zA-Z0-9_.-]+ \"</arg_key><arg_value>\" "
                      "[^<]* \"</arg_value>\")*\n");
    if (b.oom || xa.oom) rv = STRATA_ENOMEM;
out:
    free(args);
    free(schemas);
    free(names);
    free(np);
    free(xa.p);
    json_decref(any_object);
    if (rv) {
        free(b.p);
        return rv;
    }
    *gbnf = b.p;
    return 0;
}
