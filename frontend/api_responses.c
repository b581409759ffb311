/* api_responses — Responses bodies to chat bodies, and answers back to responses and events. */
#include "frontend/api_responses.h"

#include "common/base/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD      "invalid_request_error"
#define ORIGINAL "x-strata-responses"

static unsigned oom(struct api_error *e)
{
    return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* parts_text joins a content given as a string or as text parts (input_text, output_text, text,
 * refusal) into a new string. */
static unsigned parts_text(json_t *c, const char *param, json_t **out, struct api_error *e)
{
    if (!c || json_is_null(c)) {
        *out = json_string("");
        return 0;
    }
    if (json_is_string(c)) {
        *out = json_incref(c);
        return 0;
    }
    if (!json_is_array(c))
        return api_fail(e, 400, BAD, param, "invalid_type",
                        "'%s' must be a string or an array of input_text parts, got %s", param,
                        api_type_name(c));
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(c, i, part)
    {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *t =
            json_object_get(part, type && strcmp(type, "refusal") == 0 ? "refusal" : "text");
        if (!type || !json_is_string(t) ||
            (strcmp(type, "input_text") != 0 && strcmp(type, "output_text") != 0 &&
             strcmp(type, "text") != 0 && strcmp(type, "refusal") != 0))
            return api_fail(e, 400, BAD, param, "invalid_value",
                            "%s[%zu]: only input_text and output_text parts are supported (this "
                            "model reads text only)",
                            param, i);
        total += json_string_length(t);
    }
    char *buf = malloc(total + 1);
    size_t at = 0;
    if (!buf) return oom(e);
    json_array_foreach(c, i, part)
    {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *t = json_object_get(part, strcmp(type, "refusal") == 0 ? "refusal" : "text");
        memcpy(buf + at, json_string_value(t), json_string_length(t));
        at += json_string_length(t);
    }
    *out = json_stringn(buf, at);
    free(buf);
    return *out ? 0 : oom(e);
}

/* reasoning_text takes a reasoning item's text: its reasoning_text content, else its summary. */
static void reasoning_text(json_t *item, json_t **pending)
{
    const char *keys[] = {"content", "summary"};
    for (int k = 0; k < 2; k++) {
        json_t *arr = json_object_get(item, keys[k]), *part;
        size_t i;
        if (!json_array_size(arr)) continue;
        char *buf = NULL;
        size_t n = 0;
        json_array_foreach(arr, i, part)
        {
            json_t *t = json_object_get(part, "text");
            if (!json_is_string(t)) continue;
            char *p = realloc(buf, n + json_string_length(t) + 2);
            if (!p) break;
            buf = p;
            if (n) buf[n++] = '\n';
            memcpy(buf + n, json_string_value(t), json_string_length(t));
            n += json_string_length(t);
        }
        if (buf) {
            json_decref(*pending);
            *pending = json_stringn(buf, n);
            free(buf);
            return;
        }
    }
}

/* last_assistant returns the last message when it is an assistant's (function calls join it). */
static json_t *last_assistant(json_t *msgs)
{
    json_t *m = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(m, "role"));
    return role && strcmp(role, "assistant") == 0 ? m : NULL;
}

static unsigned item(json_t *it, size_t i, json_t *msgs, json_t **pending, struct api_error *e)
{
    char param[64];
    snprintf(param, sizeof param, "input[%zu]", i);
    if (!json_is_object(it))
        return api_fail(e, 400, BAD, param, "invalid_type", "'%s' must be an item object, got %s",
                        param, api_type_name(it));
    const char *type = json_string_value(json_object_get(it, "type"));
    if (!type && json_object_get(it, "role")) type = "message";
    if (!type)
        return api_fail(e, 400, BAD, param, "invalid_value", "'%s' has no \"type\" or \"role\"",
                        param);
    unsigned st;
    if (strcmp(type, "message") == 0) {
        const char *role = json_string_value(json_object_get(it, "role"));
        if (!role || (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0 &&
                      strcmp(role, "system") != 0 && strcmp(role, "developer") != 0))
            return api_fail(e, 400, BAD, param, "invalid_value",
                            "'%s.role' must be \"user\", \"assistant\", \"system\" or "
                            "\"developer\"",
                            param);
        char cp[96];
        snprintf(cp, sizeof cp, "%s.content", param);
        json_t *text;
        if ((st = parts_text(json_object_get(it, "content"), cp, &text, e)) != 0) return st;
        json_t *m = json_pack("{s:s, s:o}", "role",
                              strcmp(role, "developer") == 0 ? "system" : role, "content", text);
        if (m && strcmp(role, "assistant") == 0 && *pending) {
            json_object_set_new(m, "reasoning_content", *pending);
            *pending = NULL;
        }
        return m && json_array_append_new(msgs, m) == 0 ? 0 : oom(e);
    }
    if (strcmp(type, "function_call") == 0) {
        json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
        json_t *args = json_object_get(it, "arguments");
        if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
            return api_fail(e, 400, BAD, param, "invalid_value",
                            "'%s' must have string \"call_id\", \"name\" and \"arguments\"", param);
        json_t *m = last_assistant(msgs);
        if (!m || *pending) {
            if (!(m = json_pack("{s:s, s:s}", "role", "assistant", "content", "")) ||
                json_array_append_new(msgs, m) != 0)
                return oom(e);
            if (*pending) json_object_set_new(m, "reasoning_content", *pending);
            *pending = NULL;
        }
        json_t *calls = json_object_get(m, "tool_calls");
        if (!calls) json_object_set_new(m, "tool_calls", calls = json_array());
        return json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type",
                                                      "function", "function", "name", name,
                                                      "arguments", args)) == 0
                   ? 0
                   : oom(e);
    }
    if (strcmp(type, "function_call_output") == 0) {
        json_t *id = json_object_get(it, "call_id"), *text;
        char op[96];
        snprintf(op, sizeof op, "%s.output", param);
        if (!json_is_string(id))
            return api_fail(e, 400, BAD, param, "invalid_value",
                            "'%s.call_id' must be the call_id of the function_call it answers",
                            param);
        if ((st = parts_text(json_object_get(it, "output"), op, &text, e)) != 0) return st;
        return json_array_append_new(msgs, json_pack("{s:s, s:O, s:o}", "role", "tool",
                                                     "tool_call_id", id, "content", text)) == 0
                   ? 0
                   : oom(e);
    }
    if (strcmp(type, "reasoning") == 0) {
        reasoning_text(it, pending);
        return 0;
    }
    return api_fail(e, 400, BAD, param, "invalid_value",
                    "'%s': items of type \"%s\" are not supported (message, function_call, "
                    "function_call_output, reasoning; this server stores nothing, so send whole "
                    "items, not references)",
                    param, type);
}

static unsigned tools(json_t *in, json_t *out, struct api_error *e)
{
    json_t *t = json_object_get(in, "tools"), *tool;
    /* no tools is the chat API's absent 'tools' (which refuses an empty list) */
    if (!t || json_is_null(t) || (json_is_array(t) && json_array_size(t) == 0)) return 0;
    if (!json_is_array(t))
        return api_fail(e, 400, BAD, "tools", "invalid_type",
                        "'tools' must be an array of function tools, got %s", api_type_name(t));
    json_t *list = json_array();
    size_t i;
    json_array_foreach(t, i, tool)
    {
        const char *type = json_string_value(json_object_get(tool, "type"));
        json_t *name = json_object_get(tool, "name");
        if (!type || strcmp(type, "function") != 0 || !json_is_string(name)) {
            json_decref(list);
            return api_fail(e, 400, BAD, "tools", "invalid_value",
                            "tools[%zu] must be {\"type\": \"function\", \"name\", "
                            "\"parameters\"}: built-in tools (%s) are not supported",
                            i, type ? type : "no type");
        }
        json_t *fn = json_pack("{s:O}", "name", name);
        static const char *const keys[] = {"description", "parameters", "strict"};
        for (size_t k = 0; k < 3; k++) {
            json_t *v = json_object_get(tool, keys[k]);
            if (v && !json_is_null(v)) json_object_set(fn, keys[k], v);
        }
        json_array_append_new(list, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    json_object_set_new(out, "tools", list);
    return 0;
}

static unsigned tool_choice(json_t *in, json_t *out, struct api_error *e)
{
    json_t *c = json_object_get(in, "tool_choice");
    if (json_is_string(c)) {
        json_object_set(out, "tool_choice", c);
    } else if (json_is_object(c)) {
        json_t *name = json_object_get(c, "name");
        if (!json_is_string(name))
            return api_fail(e, 400, BAD, "tool_choice", "invalid_value",
                            "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                            "{\"type\": \"function\", \"name\"}");
        json_object_set_new(
            out, "tool_choice",
            json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
    }
    return 0;
}

/* text_format turns text.format into the chat API's response_format. */
static unsigned text_format(json_t *in, json_t *out, struct api_error *e)
{
    json_t *f = json_object_get(json_object_get(in, "text"), "format");
    if (!f || json_is_null(f)) return 0;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!type)
        return api_fail(e, 400, BAD, "text.format", "invalid_value",
                        "'text.format' must have a \"type\": text, json_object or json_schema");
    if (strcmp(type, "text") == 0) return 0;
    if (strcmp(type, "json_object") == 0) {
        json_object_set_new(out, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    if (strcmp(type, "json_schema") != 0)
        return api_fail(e, 400, BAD, "text.format", "invalid_value",
                        "'text.format.type' is \"%s\": send text, json_object or json_schema",
                        type);
    json_t *js = json_object();
    static const char *const keys[] = {"name", "schema", "strict", "description"};
    for (size_t k = 0; k < 4; k++) {
        json_t *v = json_object_get(f, keys[k]);
        if (v) json_object_set(js, keys[k], v);
    }
    json_object_set_new(out, "response_format",
                        json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
    return 0;
}

unsigned api_responses_translate(json_t *in, json_t **out, struct api_error *e)
{
    unsigned st;
    json_t *o = json_object(), *msgs = json_array(), *pending = NULL;
    *out = o;
    if (!o || !msgs) {
        json_decref(msgs);
        return oom(e);
    }
    json_object_set_new(o, "messages", msgs);
    json_object_set(o, ORIGINAL, in);
    json_t *prev = json_object_get(in, "previous_response_id");
    if (prev && !json_is_null(prev))
        return api_fail(e, 400, BAD, "previous_response_id", "invalid_value",
                        "this server stores no responses: send the whole conversation in "
                        "'input' instead of 'previous_response_id'");
    static const char *const same[] = {"model",  "temperature",         "top_p", "top_k",
                                       "stream", "parallel_tool_calls", "seed",  "stop"};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        json_t *v = json_object_get(in, same[i]);
        if (v) json_object_set(o, same[i], v);
    }
    json_t *mot = json_object_get(in, "max_output_tokens");
    if (mot && !json_is_null(mot)) {
        if (!json_is_integer(mot) || json_integer_value(mot) < 1)
            return api_fail(e, 400, BAD, "max_output_tokens", "invalid_value",
                            "'max_output_tokens' must be an integer >= 1");
        json_object_set(o, "max_tokens", mot);
    }
    json_t *effort = json_object_get(json_object_get(in, "reasoning"), "effort");
    if (json_is_string(effort)) json_object_set(o, "reasoning_effort", effort);
    json_t *top = json_object_get(in, "top_logprobs"), *inc = json_object_get(in, "include"), *v;
    size_t i;
    bool lp = json_is_integer(top) && json_integer_value(top) > 0;
    json_array_foreach(inc, i, v)
    {
        if (json_is_string(v) && strcmp(json_string_value(v), "message.output_text.logprobs") == 0)
            lp = true;
    }
    if (lp) {
        json_object_set_new(o, "logprobs", json_true());
        if (top) json_object_set(o, "top_logprobs", top);
    }
    json_t *ins = json_object_get(in, "instructions");
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins))
            return api_fail(e, 400, BAD, "instructions", "invalid_type",
                            "'instructions' must be a string, got %s", api_type_name(ins));
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins));
    }
    json_t *input = json_object_get(in, "input"), *it;
    if (json_is_string(input)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", input));
    } else if (json_is_array(input) && json_array_size(input)) {
        json_array_foreach(input, i, it)
        {
            if ((st = item(it, i, msgs, &pending, e)) != 0) {
                json_decref(pending);
                return st;
            }
        }
        json_decref(pending);
    } else {
        return api_fail(e, 400, BAD, "input",
                        input ? "invalid_value" : "missing_required_parameter",
                        "'input' must be a string or a non-empty array of items");
    }
    if ((st = tools(in, o, e)) != 0 || (st = tool_choice(in, o, e)) != 0 ||
        (st = text_format(in, o, e)) != 0)
        return st;
    return 0;
}

unsigned api_responses_parse(const char *body, size_t len, uint32_t n_vocab, struct api_params *p,
                             struct api_error *e)
{
    return api_parse_translated(API_RESPONSES, api_responses_translate, body, len, n_vocab, p, e);
}

/* ---- answers ----------------------------------------------------------------------------------
 */

static json_t *item_id(const struct api_answer *a, const char *prefix, size_t k)
{
    char buf[160];
    /* the response id is "resp_<id>": items take the same <id> */
    const char *base = strncmp(a->id, "resp_", 5) == 0 ? a->id + 5 : a->id;
    snprintf(buf, sizeof buf, "%s_%s_%zu", prefix, base, k);
    return json_string(buf);
}

static json_t *reasoning_item(const struct api_answer *a, const char *t, size_t n, bool done)
{
    json_t *content =
        done ? json_pack("[{s:s, s:o}]", "type", "reasoning_text", "text", api_str(t, n))
             : json_array();
    return json_pack("{s:o, s:s, s:[], s:o, s:s}", "id", item_id(a, "rs", 0), "type", "reasoning",
                     "summary", "content", content, "status", done ? "completed" : "in_progress");
}

/* text_part: an output_text part; lp its logprob entries (the chat API's shape) or NULL. */
static json_t *text_part(const char *t, size_t n, const json_t *lp)
{
    return json_pack("{s:s, s:o, s:[], s:o}", "type", "output_text", "text", api_str(t, n),
                     "annotations", "logprobs", lp ? json_copy((json_t *)lp) : json_array());
}

static json_t *message_item(const struct api_answer *a, const char *t, size_t n, bool done,
                            const json_t *lp)
{
    return json_pack("{s:o, s:s, s:s, s:s, s:o}", "id", item_id(a, "msg", 0), "type", "message",
                     "status", done ? "completed" : "in_progress", "role", "assistant", "content",
                     done ? json_pack("[o]", text_part(t, n, lp)) : json_array());
}

static json_t *call_item(const struct api_answer *a, size_t k, bool done)
{
    const struct api_tool_call *c = &a->tool_calls[k];
    return json_pack("{s:o, s:s, s:s, s:s, s:s, s:s}", "id", item_id(a, "fc", k), "type",
                     "function_call", "status", done ? "completed" : "in_progress", "call_id",
                     c->id ? c->id : "", "name", c->name ? c->name : "", "arguments",
                     done && c->arguments ? c->arguments : "");
}

/* response renders the response object around output (taken), echoing the request. */
static json_t *response(const struct api_answer *a, const char *status, json_t *output)
{
    json_t *orig = json_object_get(a->p->root, ORIGINAL);
    bool incomplete = a->finish == API_FINISH_LENGTH;
    json_t *o = json_pack(
        "{s:s, s:s, s:I, s:s, s:n, s:o, s:s, s:o, s:b, s:n, s:b, s:f, s:f, s:s, s:{}}", "id", a->id,
        "object", "response", "created_at", (json_int_t)a->created, "status", status, "error",
        "incomplete_details",
        strcmp(status, "incomplete") == 0 && incomplete
            ? json_pack("{s:s}", "reason", "max_output_tokens")
            : json_null(),
        "model", a->model, "output", output, "parallel_tool_calls", a->p->parallel_tool_calls,
        "previous_response_id", "store", 0, "temperature", (double)a->p->sampling.temperature,
        "top_p", (double)a->p->sampling.top_p, "truncation", "disabled", "metadata");
    if (!o) return NULL;
    static const char *const echo[] = {"instructions", "max_output_tokens", "tool_choice",
                                       "tools",        "reasoning",         "text"};
    static const char *const dflt[] = {"null",
                                       "null",
                                       "\"auto\"",
                                       "[]",
                                       "{\"effort\":null,\"summary\":null}",
                                       "{\"format\":{\"type\":\"text\"}}"};
    for (size_t k = 0; k < sizeof echo / sizeof *echo; k++) {
        json_t *v = json_object_get(orig, echo[k]);
        json_object_set_new(o, echo[k],
                            v && !json_is_null(v) ? json_incref(v)
                                                  : json_loads(dflt[k], JSON_DECODE_ANY, NULL));
    }
    if (strcmp(status, "in_progress") != 0) {
        uint32_t cached = a->n_cached < a->n_prompt ? a->n_cached : a->n_prompt;
        json_object_set_new(
            o, "usage",
            json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", (json_int_t)a->n_prompt,
                      "input_tokens_details", "cached_tokens", (json_int_t)cached, "output_tokens",
                      (json_int_t)a->n_gen, "output_tokens_details", "reasoning_tokens",
                      (json_int_t)0, "total_tokens", (json_int_t)a->n_prompt + a->n_gen));
    } else {
        json_object_set_new(o, "usage", json_null());
    }
    return o;
}

static const char *final_status(const struct api_answer *a)
{
    return a->finish == API_FINISH_LENGTH ? "incomplete" : "completed";
}

json_t *api_responses_object(const struct api_answer *a)
{
    json_t *out = json_array();
    if (a->reasoning_len)
        json_array_append_new(out, reasoning_item(a, a->reasoning, a->reasoning_len, true));
    if (a->content_len || (!a->reasoning_len && !a->n_tool_calls))
        json_array_append_new(out, message_item(a, a->content, a->content_len, true, a->logprobs));
    for (size_t k = 0; k < a->n_tool_calls; k++)
        json_array_append_new(out, call_item(a, k, true));
    return response(a, final_status(a), out);
}

/* ev appends event `name` with the stream's next sequence number. */
static int ev(struct api_responses_stream *s, struct api_sse *out, const char *name, json_t *o)
{
    if (o) {
        json_object_set_new(o, "type", json_string(name));
        json_object_set_new(o, "sequence_number", json_integer(s->seq++));
    }
    return api_sse_event(out, name, o);
}

static int start(struct api_responses_stream *s, const struct api_answer *a, struct api_sse *out)
{
    int rv;
    if (s->started) return 0;
    s->started = true;
    if (!s->items && !(s->items = json_array()))
        return strata_errf(STRATA_ENOMEM, "frontend: output items");
    if ((rv = ev(s, out, "response.created",
                 json_pack("{s:o}", "response", response(a, "in_progress", json_array())))) != 0)
        return rv;
    return ev(s, out, "response.in_progress",
              json_pack("{s:o}", "response", response(a, "in_progress", json_array())));
}

static int close_item(struct api_responses_stream *s, const struct api_answer *a,
                      struct api_sse *out)
{
    int rv;
    if (!s->open) return 0;
    int kind = s->open;
    size_t oi = json_array_size(s->items);
    const char *t = s->text ? s->text : "";
    if (kind == 2 && s->lp_pending) { /* logprobs of tokens whose text never showed */
        if (!s->lp) s->lp = json_array();
        json_array_extend(s->lp, s->lp_pending);
        json_decref(s->lp_pending);
        s->lp_pending = NULL;
    }
    json_t *item = kind == 1 ? reasoning_item(a, t, s->text_len, true)
                             : message_item(a, t, s->text_len, true, s->lp);
    json_t *id = json_object_get(item, "id");
    json_t *part = kind == 1 ? json_pack("{s:s, s:o}", "type", "reasoning_text", "text",
                                         api_str(t, s->text_len))
                             : text_part(t, s->text_len, s->lp);
    json_decref(s->lp);
    s->lp = NULL;
    s->open = 0;
    s->text_len = 0;
    if ((rv = ev(s, out, kind == 1 ? "response.reasoning_text.done" : "response.output_text.done",
                 json_pack("{s:O, s:I, s:i, s:O}", "item_id", id, "output_index", (json_int_t)oi,
                           "content_index", 0, "text", json_object_get(part, "text")))) != 0 ||
        (rv = ev(s, out, "response.content_part.done",
                 json_pack("{s:O, s:I, s:i, s:o}", "item_id", id, "output_index", (json_int_t)oi,
                           "content_index", 0, "part", part))) != 0 ||
        (rv = ev(s, out, "response.output_item.done",
                 json_pack("{s:I, s:O}", "output_index", (json_int_t)oi, "item", item))) != 0) {
        json_decref(item);
        return rv;
    }
    return json_array_append_new(s->items, item);
}

/* open_item closes the open item when it is of another kind and opens one of kind. */
static int open_item(struct api_responses_stream *s, const struct api_answer *a, int kind,
                     struct api_sse *out)
{
    int rv;
    if (s->open == kind) return 0;
    if ((rv = close_item(s, a, out)) != 0) return rv;
    size_t oi = json_array_size(s->items);
    json_t *item =
        kind == 1 ? reasoning_item(a, "", 0, false) : message_item(a, "", 0, false, NULL);
    json_t *id = json_incref(json_object_get(item, "id"));
    json_t *part = kind == 1 ? json_pack("{s:s, s:s}", "type", "reasoning_text", "text", "")
                             : text_part("", 0, NULL);
    rv = ev(s, out, "response.output_item.added",
            json_pack("{s:I, s:o}", "output_index", (json_int_t)oi, "item", item));
    if (rv == 0)
        rv = ev(s, out, "response.content_part.added",
                json_pack("{s:O, s:I, s:i, s:o}", "item_id", id, "output_index", (json_int_t)oi,
                          "content_index", 0, "part", part));
    else
        json_decref(part);
    json_decref(id);
    if (rv == 0) s->open = kind;
    return rv;
}

static int text_delta(struct api_responses_stream *s, const struct api_answer *a, int kind,
                      const char *t, size_t n, struct api_sse *out)
{
    int rv;
    if (!n) return 0;
    if ((rv = open_item(s, a, kind, out)) != 0) return rv;
    if (s->text_len + n + 1 > s->text_cap) {
        size_t cap = s->text_cap ? s->text_cap : 256;
        while (cap < s->text_len + n + 1)
            cap *= 2;
        char *p = realloc(s->text, cap);
        if (!p) return strata_errf(STRATA_ENOMEM, "frontend: %zu bytes of output text", cap);
        s->text = p;
        s->text_cap = cap;
    }
    memcpy(s->text + s->text_len, t, n);
    s->text_len += n;
    /* the open item is the next one of the output */
    json_t *d = json_pack(
        "{s:o, s:I, s:i, s:o}", "item_id", item_id(a, kind == 1 ? "rs" : "msg", 0), "output_index",
        (json_int_t)json_array_size(s->items), "content_index", 0, "delta", api_str(t, n));
    if (d && kind == 2) {
        /* the logprobs of the tokens so far go with the first text they made */
        json_t *lp = s->lp_pending ? s->lp_pending : json_array();
        s->lp_pending = NULL;
        if (json_array_size(lp)) {
            if (!s->lp) s->lp = json_array();
            json_array_extend(s->lp, lp);
        }
        json_object_set_new(d, "logprobs", lp);
    }
    return ev(s, out, kind == 1 ? "response.reasoning_text.delta" : "response.output_text.delta",
              d);
}

int api_responses_delta(struct api_responses_stream *s, const struct api_answer *a,
                        const char *reasoning, size_t rn, const char *text, size_t tn,
                        struct api_sse *out)
{
    int rv;
    if (json_array_size(a->logprobs)) {
        if (!s->lp_pending && !(s->lp_pending = json_array()))
            return strata_errf(STRATA_ENOMEM, "frontend: logprobs");
        json_array_extend(s->lp_pending, (json_t *)a->logprobs);
    }
    if ((rv = start(s, a, out)) != 0 || (rv = text_delta(s, a, 1, reasoning, rn, out)) != 0)
        return rv;
    return text_delta(s, a, 2, text, tn, out);
}

int api_responses_finish(struct api_responses_stream *s, const struct api_answer *a,
                         struct api_sse *out)
{
    int rv;
    if ((rv = start(s, a, out)) != 0 || (rv = close_item(s, a, out)) != 0) return rv;
    /* an empty answer is an empty message, as the whole response has it */
    if (json_array_size(s->items) == 0 && !a->n_tool_calls &&
        ((rv = open_item(s, a, 2, out)) != 0 || (rv = close_item(s, a, out)) != 0))
        return rv;
    for (size_t k = 0; k < a->n_tool_calls; k++) {
        size_t oi = json_array_size(s->items);
        json_t *item = call_item(a, k, true);
        json_t *id = json_object_get(item, "id");
        const char *args = a->tool_calls[k].arguments ? a->tool_calls[k].arguments : "";
        if ((rv = ev(s, out, "response.output_item.added",
                     json_pack("{s:I, s:o}", "output_index", (json_int_t)oi, "item",
                               call_item(a, k, false)))) != 0 ||
            (rv = ev(s, out, "response.function_call_arguments.delta",
                     json_pack("{s:O, s:I, s:s}", "item_id", id, "output_index", (json_int_t)oi,
                               "delta", args))) != 0 ||
            (rv =
                 ev(s, out, "response.function_call_arguments.done",
                    json_pack("{s:O, s:I, s:s, s:s}", "item_id", id, "output_index", (json_int_t)oi,
                              "name", a->tool_calls[k].name ? a->tool_calls[k].name : "",
                              "arguments", args))) != 0 ||
            (rv = ev(s, out, "response.output_item.done",
                     json_pack("{s:I, s:O}", "output_index", (json_int_t)oi, "item", item))) != 0) {
            json_decref(item);
            return rv;
        }
        json_array_append_new(s->items, item);
    }
    const char *status = final_status(a);
    char name[40];
    snprintf(name, sizeof name, "response.%s", status);
    return ev(s, out, name,
              json_pack("{s:o}", "response", response(a, status, json_copy(s->items))));
}

int api_responses_error_event(struct api_responses_stream *s, const struct api_error *e,
                              struct api_sse *out)
{
    return ev(s, out, "error",
              json_pack("{s:s?, s:o, s:s?}", "code", e->code, "message",
                        api_str(e->message, strlen(e->message)), "param",
                        e->param[0] ? e->param : NULL));
}

void api_responses_stream_fini(struct api_responses_stream *s)
{
    json_decref(s->items);
    json_decref(s->lp);
    json_decref(s->lp_pending);
    free(s->text);
    memset(s, 0, sizeof *s);
}
