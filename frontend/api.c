/* api — OpenAI request bodies: parse, check types and ranges, name the bad field. */
#include "frontend/api.h"
#include "common/base/err.h"
#include "common/grammar/grammar.h"

#include "frontend/api_anthropic.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD "invalid_request_error"

unsigned api_fail(struct api_error *e, unsigned status, const char *type, const char *param,
                  const char *code, const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

char *api_error_json(const struct api_error *e)
{
    /* messages quote the client's bytes (JSON parse errors do), which need not be UTF-8 */
    json_t *o =
        json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message",
                  api_lossy_string(e->message, strlen(e->message)), "type", e->type ? e->type : BAD,
                  "param", e->param[0] ? json_string(e->param) : json_null(), "code",
                  e->code ? json_string(e->code) : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

char *api_error_json_as(enum api_kind kind, const struct api_error *e)
{
    return kind == API_MESSAGES ? api_anthropic_error_json(e) : api_error_json(e);
}

/* utf8_len returns the length of the valid UTF-8 sequence at s[0..n), or 0 if none starts there. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t len = s[0] < 0x80                   ? 1
                 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2
                 : s[0] >= 0xe0 && s[0] < 0xf0 ? 3
                 : s[0] >= 0xf0 && s[0] < 0xf5 ? 4
                                               : 0;
    if (len == 0 || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (len == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0))) return 0;
    if (len == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))) return 0;
    return len;
}

json_t *api_lossy_string(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *b = malloc(3 * n + 1); /* each byte at worst becomes a 3-byte U+FFFD */
    size_t bn = 0;
    if (!b) return NULL;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_len((const unsigned char *)s + i, n - i);
        if (k) {
            memcpy(b + bn, s + i, k);
            bn += k;
            i += k;
        } else {
            memcpy(b + bn, "\xef\xbf\xbd", 3);
            bn += 3;
            i++;
        }
    }
    j = json_stringn(b, bn);
    free(b);
    return j;
}

const char *api_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "?";
}

unsigned api_load(const char *body, size_t len, json_t **root, struct api_error *e)
{
    json_error_t je;
    *root = json_loadb(body, len, 0, &je);
    if (!*root)
        return api_fail(e, 400, BAD, NULL, "invalid_json",
                        "the request body is not valid JSON: %s (line %d, column %d)", je.text,
                        je.line, je.column);
    if (!json_is_object(*root))
        return api_fail(e, 400, BAD, NULL, "invalid_json",
                        "the request body must be a JSON object, got %s", api_type_name(*root));
    return 0;
}

/* field returns key's value, or NULL when absent or null (both mean "the default"). */
static json_t *field(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

static unsigned get_num(json_t *o, const char *key, double min, double max, float *out,
                        struct api_error *e)
{
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_number(v))
        return api_fail(e, 400, BAD, key, "invalid_type", "'%s' must be a number, got %s", key,
                        api_type_name(v));
    double d = json_number_value(v);
    if (!(d >= min && d <= max))
        return api_fail(e, 400, BAD, key, "invalid_value", "'%s' is %g: it must be in [%g, %g]",
                        key, d, min, max);
    *out = (float)d;
    return 0;
}

static unsigned get_int(json_t *o, const char *key, int64_t min, int64_t max, int64_t *out,
                        struct api_error *e)
{
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_integer(v))
        return api_fail(e, 400, BAD, key, "invalid_type", "'%s' must be an integer, got %s", key,
                        api_type_name(v));
    json_int_t i = json_integer_value(v);
    if (i < min || i > max)
        return api_fail(e, 400, BAD, key, "invalid_value",
                        "'%s' is %lld: it must be in [%lld, %lld]", key, (long long)i,
                        (long long)min, (long long)max);
    *out = i;
    return 0;
}

static unsigned get_bool(json_t *o, const char *key, bool *out, struct api_error *e)
{
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v))
        return api_fail(e, 400, BAD, key, "invalid_type", "'%s' must be true or false, got %s", key,
                        api_type_name(v));
    *out = json_is_true(v);
    return 0;
}

static unsigned get_str(json_t *o, const char *key, const char **out, struct api_error *e)
{
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_string(v))
        return api_fail(e, 400, BAD, key, "invalid_type", "'%s' must be a string, got %s", key,
                        api_type_name(v));
    *out = json_string_value(v);
    return 0;
}

/* text_of turns a message's content (a string, null, or an array of {"type": "text", "text"}
 * parts) into one string value (a new reference). */
static unsigned text_of(json_t *content, size_t i, json_t **out, struct api_error *e)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (!content || json_is_null(content)) {
        *out = json_string("");
        return 0;
    }
    if (json_is_string(content)) {
        *out = json_incref(content);
        return 0;
    }
    if (!json_is_array(content))
        return api_fail(e, 400, BAD, param, "invalid_type",
                        "'%s' must be a string or an array of text parts, got %s", param,
                        api_type_name(content));
    size_t total = 0, j;
    json_t *part;
    json_array_foreach(content, j, part)
    {
        json_t *t = json_object_get(part, "text");
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!json_is_object(part) || !type || strcmp(type, "text") != 0 || !json_is_string(t))
            return api_fail(e, 400, BAD, param, "invalid_value",
                            "%s[%zu]: only {\"type\": \"text\", \"text\": \"...\"} parts are "
                            "supported (this model reads text only)",
                            param, j);
        total += json_string_length(t);
    }
    char *buf = malloc(total + 1);
    if (!buf) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t at = 0;
    json_array_foreach(content, j, part)
    {
        json_t *t = json_object_get(part, "text");
        memcpy(buf + at, json_string_value(t), json_string_length(t));
        at += json_string_length(t);
    }
    *out = json_stringn(buf, at);
    free(buf);
    if (!*out)
        return api_fail(e, 400, BAD, param, "invalid_value", "%s: the text is not valid UTF-8",
                        param);
    return 0;
}

/* args_as_objects turns each call's "arguments" text into the object it encodes: templates
 * iterate the arguments (Qwen3-Coder, GLM) or print them with tojson, as llama.cpp gives them. */
static void args_as_objects(json_t *calls)
{
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c)
    {
        json_t *fn = json_object_get(c, "function");
        const char *a = json_string_value(json_object_get(fn, "arguments"));
        json_t *o = a ? json_loads(a, 0, NULL) : NULL;
        if (json_is_object(o))
            json_object_set_new(fn, "arguments", o);
        else
            json_decref(o);
    }
}

static unsigned parse_messages(json_t *root, struct api_params *p, struct api_error *e)
{
    json_t *msgs = json_object_get(root, "messages");
    if (!msgs)
        return api_fail(e, 400, BAD, "messages", "missing_required_parameter",
                        "'messages' is required: an array of {\"role\", \"content\"} objects");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return api_fail(e, 400, BAD, "messages", "invalid_value",
                        "'messages' must be a non-empty array of {\"role\", \"content\"} objects, "
                        "got %s",
                        json_is_array(msgs) ? "an empty array" : api_type_name(msgs));
    if (!(p->messages = json_array()))
        return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m))
            return api_fail(e, 400, BAD, param, "invalid_type",
                            "'%s' must be an object with \"role\" and \"content\", got %s", param,
                            api_type_name(m));
        if (!json_is_string(json_object_get(m, "role")))
            return api_fail(e, 400, BAD, param, "invalid_value",
                            "'%s.role' must be a string such as \"user\"", param);
        /* the template sees the message as sent (tool calls, names, reasoning) with its content
         * flattened to a string */
        json_t *copy = json_copy(m), *text = NULL;
        unsigned st;
        if (!copy) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        if ((st = text_of(json_object_get(m, "content"), i, &text, e)) != 0) {
            json_decref(copy);
            return st;
        }
        json_object_set_new(copy, "content", text);
        args_as_objects(json_object_get(copy, "tool_calls"));
        json_array_append_new(p->messages, copy);
    }
    return 0;
}

static unsigned parse_prompt(json_t *root, uint32_t n_vocab, struct api_params *p,
                             struct api_error *e)
{
    json_t *v = json_object_get(root, "prompt");
    if (!v)
        return api_fail(e, 400, BAD, "prompt", "missing_required_parameter",
                        "'prompt' is required: a string or an array of token ids");
    if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)))
        v = json_array_get(v, 0);
    if (json_is_string(v)) {
        p->prompt = json_string_value(v);
        p->prompt_len = json_string_length(v);
        if (p->prompt_len == 0)
            return api_fail(e, 400, BAD, "prompt", "invalid_value", "'prompt' is empty");
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return api_fail(e, 400, BAD, "prompt", "invalid_value",
                        "'prompt' must be a non-empty string or array of token ids (one prompt "
                        "per request), got %s",
                        json_is_array(v) ? "an empty array" : api_type_name(v));
    size_t n = json_array_size(v), i;
    json_t *id;
    if (!(p->prompt_ids = malloc(n * sizeof *p->prompt_ids)))
        return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    json_array_foreach(v, i, id)
    {
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (json_int_t)n_vocab)
            return api_fail(e, 400, BAD, "prompt", "invalid_value",
                            "prompt[%zu] must be a token id in [0, %u) (one prompt per request: "
                            "an array of strings is not supported), got %s",
                            i, n_vocab,
                            json_is_integer(id) ? "an id out of range" : api_type_name(id));
        p->prompt_ids[i] = (int32_t)json_integer_value(id);
    }
    p->n_prompt_ids = n;
    return 0;
}

static unsigned parse_stop(json_t *root, struct api_params *p, struct api_error *e)
{
    json_t *v = field(root, "stop");
    if (!v) return 0;
    if (json_is_string(v)) {
        p->stop[p->n_stop++] = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) > FE_STOP_MAX)
        return api_fail(e, 400, BAD, "stop", "invalid_value",
                        "'stop' must be a string or an array of at most %d strings", FE_STOP_MAX);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s)
    {
        if (!json_is_string(s))
            return api_fail(e, 400, BAD, "stop", "invalid_type",
                            "stop[%zu] must be a string, got %s", i, api_type_name(s));
        p->stop[p->n_stop++] = json_string_value(s);
    }
    return 0;
}

/* set_grammar takes gbnf (malloc'd) as p's grammar once it compiles; param names the field. */
static unsigned set_grammar(struct api_params *p, char *gbnf, const char *param,
                            struct api_error *e)
{
    struct grammar *g = NULL;
    int rv = grammar_parse(gbnf, strlen(gbnf), &g);
    grammar_fini(g);
    if (rv) {
        free(gbnf);
        return api_fail(e, 400, BAD, param, "invalid_grammar", "'%s': %s", param,
                        strata_errdetail());
    }
    free(p->grammar);
    p->grammar = gbnf;
    return 0;
}

/* schema_grammar compiles a JSON schema (param names it) into p's grammar. */
static unsigned schema_grammar(struct api_params *p, const json_t *schema, const char *param,
                               struct api_error *e)
{
    char *gbnf;
    if (schema && !json_is_object(schema) && !json_is_boolean(schema))
        return api_fail(e, 400, BAD, param, "invalid_schema",
                        "'%s' must be a JSON schema object, got %s", param, api_type_name(schema));
    int rv = grammar_from_schema(schema, &gbnf);
    if (rv == STRATA_ENOMEM) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (rv)
        return api_fail(e, 400, BAD, param, "invalid_schema", "'%s': %s", param,
                        strata_errdetail());
    return set_grammar(p, gbnf, param, e);
}

/* parse_format reads response_format ({"type": "text" | "json_object" | "json_schema"}) and
 * llama-server's `grammar` (GBNF) and `json_schema` (a schema) into p->grammar. */
static unsigned parse_format(json_t *r, struct api_params *p, struct api_error *e)
{
    const char *gbnf = NULL;
    unsigned st;
    if ((st = get_str(r, "grammar", &gbnf, e)) != 0) return st;
    json_t *js = field(r, "json_schema"), *rf = field(r, "response_format");
    if (gbnf && js)
        return api_fail(e, 400, BAD, "grammar", "invalid_value",
                        "send either 'grammar' or 'json_schema', not both");
    if (gbnf) {
        char *copy = strdup(gbnf);
        if (!copy) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        if ((st = set_grammar(p, copy, "grammar", e)) != 0) return st;
    }
    if (js && (st = schema_grammar(p, js, "json_schema", e)) != 0) return st;
    if (!rf) return 0;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !type)
        return api_fail(e, 400, BAD, "response_format", "invalid_type",
                        "'response_format' must be an object with a 'type': \"text\", "
                        "\"json_object\" or \"json_schema\"");
    if (strcmp(type, "text") == 0) return 0;
    if ((gbnf || js) && strcmp(type, "text") != 0)
        return api_fail(e, 400, BAD, "response_format", "invalid_value",
                        "send either 'response_format' or '%s', not both",
                        gbnf ? "grammar" : "json_schema");
    if (strcmp(type, "json_object") == 0) {
        json_t *schema = field(rf, "schema"); /* llama-server accepts a schema here too */
        if (schema) return schema_grammar(p, schema, "response_format.schema", e);
        char *copy = strdup(grammar_json_object());
        if (!copy) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return set_grammar(p, copy, "response_format", e);
    }
    if (strcmp(type, "json_schema") == 0) {
        json_t *o = field(rf, "json_schema");
        if (!json_is_object(o))
            return api_fail(e, 400, BAD, "response_format.json_schema",
                            o ? "invalid_type" : "missing_required_parameter",
                            "'response_format.json_schema' must be an object with 'name' and "
                            "'schema'");
        json_t *schema = field(o, "schema");
        return schema_grammar(p, schema, "response_format.json_schema.schema", e);
    }
    return api_fail(e, 400, BAD, "response_format.type", "invalid_value",
                    "'response_format.type' is \"%s\": use \"text\", \"json_object\" or "
                    "\"json_schema\"",
                    type);
}

/* tool_named: the tool of p->tools called name, or NULL. */
static const json_t *tool_named(const struct api_params *p, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(p->tools, i, t)
    {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (n && strcmp(n, name) == 0) return t;
    }
    return NULL;
}

/* parse_tools reads tools, tool_choice and parallel_tool_calls (OpenAI's shapes). Each tool's
 * parameters must compile to a grammar, since a forced call is held to them. */
static unsigned parse_tools(json_t *r, struct api_params *p, struct api_error *e)
{
    unsigned st;
    p->parallel_tool_calls = true;
    if ((st = get_bool(r, "parallel_tool_calls", &p->parallel_tool_calls, e)) != 0) return st;
    json_t *tools = field(r, "tools"), *choice = field(r, "tool_choice");
    if (tools && (!json_is_array(tools) || json_array_size(tools) == 0))
        return api_fail(e, 400, BAD, "tools", "invalid_type",
                        "'tools' must be a non-empty array of {\"type\": \"function\", "
                        "\"function\": {\"name\", \"parameters\"}}");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        char param[64];
        snprintf(param, sizeof param, "tools[%zu]", i);
        json_t *fn = json_object_get(t, "function");
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!json_is_object(t) || !type || strcmp(type, "function") != 0 || !json_is_object(fn))
            return api_fail(e, 400, BAD, param, "invalid_value",
                            "'%s' must be {\"type\": \"function\", \"function\": {...}}",
                            param);
        size_t n = name ? strlen(name) : 0;
        bool ok = n > 0 && n <= 64;
        for (size_t k = 0; ok && k < n; k++)
            ok = (name[k] >= 'a' && name[k] <= 'z') || (name[k] >= 'A' && name[k] <= 'Z') ||
                 (name[k] >= '0' && name[k] <= '9') || name[k] == '_' || name[k] == '-' ||
                 name[k] == '.';
        if (!ok)
            return api_fail(e, 400, BAD, param, "invalid_value",
                            "'%s.function.name' must be 1..64 of a-z, A-Z, 0-9, _, - and .",
                            param);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(name, json_string_value(json_object_get(
                                  json_object_get(json_array_get(tools, k), "function"), "name"))))
                return api_fail(e, 400, BAD, param, "invalid_value",
                                "'%s': a second tool named '%s'", param, name);
        json_t *params = field(fn, "parameters");
        char *gbnf = NULL;
        int rv = params ? grammar_from_schema(params, &gbnf) : 0;
        free(gbnf);
        if (rv == STRATA_ENOMEM) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        if (rv)
            return api_fail(e, 400, BAD, param, "invalid_schema", "'%s.function.parameters': %s",
                            param, strata_errdetail());
    }
    p->tools = tools;
    if (!choice) {
        p->tool_choice = NULL;
        return 0;
    }
    const char *cs = json_string_value(choice);
    if (cs) {
        if (strcmp(cs, "auto") && strcmp(cs, "none") && strcmp(cs, "required"))
            return api_fail(e, 400, BAD, "tool_choice", "invalid_value",
                            "'tool_choice' is \"%s\": use \"auto\", \"none\", \"required\" "
                            "or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                            cs);
        if (!strcmp(cs, "required") && !tools)
            return api_fail(e, 400, BAD, "tool_choice", "invalid_value",
                            "'tool_choice' is \"required\" but the request has no 'tools'");
        p->tool_choice = choice;
        return 0;
    }
    const char *name =
        json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
    if (!json_is_object(choice) || !name)
        return api_fail(e, 400, BAD, "tool_choice", "invalid_type",
                        "'tool_choice' must be a string or {\"type\": \"function\", "
                        "\"function\": {\"name\": ...}}");
    if (!tools || !tool_named(p, name))
        return api_fail(e, 400, BAD, "tool_choice", "unknown_tool",
                        "'tool_choice' names the function '%s', which is not in 'tools'", name);
    p->tool_choice = choice;
    return 0;
}

unsigned api_parse(enum api_kind kind, const char *body, size_t len, uint32_t n_vocab,
                   struct api_params *p, struct api_error *e)
{
    json_t *root;
    unsigned st = api_load(body, len, &root, e);
    if (st != 0) {
        memset(p, 0, sizeof *p);
        p->root = root;
        return st;
    }
    return api_parse_root(kind, root, n_vocab, p, e);
}

unsigned api_parse_root(enum api_kind kind, json_t *root, uint32_t n_vocab, struct api_params *p,
                        struct api_error *e)
{
    unsigned st;
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->model = "";
    p->root = root;
    p->parallel_tool_calls = true;
    /* OpenAI's defaults: temperature 1 (0 asks for greedy), no filters or penalties */
    p->sampling =
        (struct wclient_sampling){.temperature = 1.0f, .top_p = 1.0f, .repeat_penalty = 1.0f};
    json_t *r = p->root;
    int64_t n = 1, max_tokens = 0, mct = 0, top_k = 0, seed = 0, lp = 0;
    bool has_seed = json_is_integer(json_object_get(r, "seed"));
    if ((st = get_str(r, "model", &p->model, e)) || (st = get_bool(r, "stream", &p->stream, e)) ||
        (st = get_int(r, "n", INT64_MIN, INT64_MAX, &n, e)) ||
        (st = get_int(r, "max_tokens", 1, WCLIENT_MAX_TOKENS, &max_tokens, e)) ||
        (st = get_int(r, "max_completion_tokens", 1, WCLIENT_MAX_TOKENS, &mct, e)) ||
        (st = get_num(r, "temperature", 0, 2, &p->sampling.temperature, e)) ||
        (st = get_num(r, "top_p", 0, 1, &p->sampling.top_p, e)) ||
        /* the worker protocol carries top_k as a non-negative int32 */
        (st = get_int(r, "top_k", 0, INT32_MAX, &top_k, e)) ||
        (st = get_num(r, "min_p", 0, 1, &p->sampling.min_p, e)) ||
        (st = get_num(r, "presence_penalty", -2, 2, &p->sampling.presence_penalty, e)) ||
        (st = get_num(r, "frequency_penalty", -2, 2, &p->sampling.frequency_penalty, e)) ||
        (st = get_num(r, "repeat_penalty", 0, 10, &p->sampling.repeat_penalty, e)) ||
        (st = get_int(r, "seed", INT64_MIN, INT64_MAX, &seed, e)) || (st = parse_stop(r, p, e)) ||
        (st = parse_format(r, p, e)))
        return st;
    if (n < 1 || n > API_MAX_N || (n > 1 && (kind == API_MESSAGES || kind == API_RESPONSES)))
        return api_fail(e, 400, BAD, "n", "invalid_value",
                        "'n' is %lld: send 1 to %d choices per request", (long long)n,
                        kind == API_MESSAGES || kind == API_RESPONSES ? 1 : API_MAX_N);
    p->n = (uint32_t)n;
    p->max_tokens = mct ? mct : max_tokens;
    p->sampling.top_k = (uint32_t)top_k;
    p->sampling.has_seed = has_seed;
    p->sampling.seed = (uint64_t)seed;
    json_t *so = field(r, "stream_options");
    if (so && (!json_is_object(so) || (st = get_bool(so, "include_usage", &p->include_usage, e))))
        return st ? st
                  : api_fail(e, 400, BAD, "stream_options", "invalid_type",
                             "'stream_options' must be an object, got %s", api_type_name(so));
    if (api_is_chat(kind)) {
        int64_t top = 0;
        if ((st = get_bool(r, "logprobs", &p->logprobs, e)) ||
            (st = get_int(r, "top_logprobs", 0, API_MAX_TOP_LOGPROBS, &top, e)) ||
            (st = get_str(r, "reasoning_effort", &p->reasoning_effort, e)) ||
            (st = parse_messages(r, p, e)) || (st = parse_tools(r, p, e)))
            return st;
        const char *cs = json_string_value(p->tool_choice);
        if (p->grammar && p->tool_choice && (!cs || !strcmp(cs, "required")))
            return api_fail(e, 400, BAD, "tool_choice", "invalid_value",
                            "a forced tool call and a response format or grammar do not go "
                            "together: drop one");
        if (top && !p->logprobs)
            return api_fail(e, 400, BAD, "top_logprobs", "invalid_value",
                            "'top_logprobs' needs 'logprobs': true");
        p->top_logprobs = (uint32_t)top;
        json_t *kw = field(r, "chat_template_kwargs");
        if (kw && !json_is_object(kw))
            return api_fail(e, 400, BAD, "chat_template_kwargs", "invalid_type",
                            "'chat_template_kwargs' must be an object, got %s", api_type_name(kw));
        p->template_kwargs = kw;
    } else {
        /* the legacy API's logprobs is a count of alternatives */
        if ((st = get_int(r, "logprobs", 0, 5, &lp, e)) || (st = parse_prompt(r, n_vocab, p, e)))
            return st;
        p->logprobs = field(r, "logprobs") != NULL;
        p->top_logprobs = (uint32_t)lp;
    }
    return 0;
}

void api_params_free(struct api_params *p)
{
    free(p->grammar);
    json_decref(p->messages);
    json_decref(p->root);
    free(p->prompt_ids);
    memset(p, 0, sizeof *p);
}

json_t *api_usage_json(uint32_t n_prompt, uint32_t n_cached, uint32_t n_gen)
{
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)n_prompt,
                     "completion_tokens", (json_int_t)n_gen, "total_tokens",
                     (json_int_t)n_prompt + n_gen, "prompt_tokens_details", "cached_tokens",
                     (json_int_t)n_cached);
}

json_t *api_timings_json(const struct wclient_update *u, uint32_t n_gen)
{
    uint32_t pn = u->n_prompt > u->n_cached ? u->n_prompt - u->n_cached : 0;
    return json_pack("{s:I, s:I, s:f, s:f, s:I, s:f, s:f, s:f}", "prompt_n", (json_int_t)pn,
                     "cache_n", (json_int_t)u->n_cached, "prompt_ms", u->prefill_ms,
                     "prompt_per_second", u->prefill_ms > 0 ? pn * 1000.0 / u->prefill_ms : 0.0,
                     "predicted_n", (json_int_t)n_gen, "predicted_ms", u->decode_ms,
                     "predicted_per_second", u->decode_ms > 0 ? n_gen * 1000.0 / u->decode_ms : 0.0,
                     "queue_ms", u->queue_ms);
}

unsigned api_parse_tokenize(const char *body, size_t len, struct api_tokenize *t,
                            struct api_error *e)
{
    unsigned st;
    memset(t, 0, sizeof *t);
    if ((st = api_load(body, len, &t->root, e)) != 0) return st;
    json_t *c = json_object_get(t->root, "content");
    if (!json_is_string(c))
        return api_fail(e, 400, BAD, "content", c ? "invalid_type" : "missing_required_parameter",
                        "'content' must be the string to tokenize");
    t->content = json_string_value(c);
    t->content_len = json_string_length(c);
    if ((st = get_bool(t->root, "add_special", &t->add_special, e)) ||
        (st = get_bool(t->root, "parse_special", &t->parse_special, e)) ||
        (st = get_bool(t->root, "with_pieces", &t->with_pieces, e)))
        return st;
    return 0;
}

unsigned api_parse_detokenize(const char *body, size_t len, uint32_t n_vocab, int32_t **ids,
                              size_t *n, struct api_error *e)
{
    json_t *root;
    unsigned st;
    *ids = NULL;
    *n = 0;
    if ((st = api_load(body, len, &root, e)) != 0) {
        json_decref(root);
        return st;
    }
    json_t *v = json_object_get(root, "tokens"), *id;
    size_t i;
    if (!json_is_array(v)) {
        st = api_fail(e, 400, BAD, "tokens", "invalid_type",
                      "'tokens' must be an array of token ids");
        goto out;
    }
    if (!(*ids = malloc((json_array_size(v) + 1) * sizeof **ids))) {
        st = api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    json_array_foreach(v, i, id)
    {
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (json_int_t)n_vocab) {
            st = api_fail(e, 400, BAD, "tokens", "invalid_value",
                          "tokens[%zu] must be a token id in [0, %u)", i, n_vocab);
            goto out;
        }
        (*ids)[i] = (int32_t)json_integer_value(id);
    }
    *n = json_array_size(v);
out:
    if (st) {
        free(*ids);
        *ids = NULL;
    }
    json_decref(root);
    return st;
}
