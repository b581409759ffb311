/* api_anthropic — Messages bodies to chat bodies, and answers back to messages and events. */
#include "frontend/api_anthropic.h"

#include "common/base/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD "invalid_request_error"

static unsigned oom(struct api_error *e)
{
    return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* add_text appends s[len] to *buf (malloc'd, NUL-terminated). */
static unsigned add_text(char **buf, size_t *n, const char *s, size_t len, struct api_error *e)
{
    char *p = realloc(*buf, *n + len + 1);
    if (!p) return oom(e);
    memcpy(p + *n, s, len);
    *n += len;
    p[*n] = '\0';
    *buf = p;
    return 0;
}

/* tool_result_text flattens a tool_result's content: a string, or text blocks. */
static unsigned tool_result_text(json_t *c, const char *param, json_t **out, struct api_error *e)
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
                        "'%s' must be a string or an array of text blocks, got %s", param,
                        api_type_name(c));
    char *buf = NULL;
    size_t n = 0, i;
    json_t *b;
    unsigned st = 0;
    json_array_foreach(c, i, b)
    {
        const char *type = json_string_value(json_object_get(b, "type"));
        json_t *t = json_object_get(b, "text");
        if (!type || strcmp(type, "text") != 0 || !json_is_string(t)) {
            st = api_fail(e, 400, BAD, param, "invalid_value",
                          "%s[%zu]: only text blocks are supported in a tool result (this model "
                          "reads text only)",
                          param, i);
            break;
        }
        if (n && (st = add_text(&buf, &n, "\n", 1, e)) != 0) break;
        if ((st = add_text(&buf, &n, json_string_value(t), json_string_length(t), e)) != 0) break;
    }
    if (st == 0) *out = json_stringn(buf ? buf : "", n);
    free(buf);
    return st;
}

/* message translates one Messages message into chat messages appended to msgs: an assistant's
 * text, thinking and tool_use blocks make one message; a user's tool_result blocks make `tool`
 * messages (first, as the chat API wants them right after the calls), its text one user message. */
static unsigned message(json_t *m, size_t i, json_t *msgs, struct api_error *e)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%zu]", i);
    if (!json_is_object(m))
        return api_fail(e, 400, BAD, param, "invalid_type",
                        "'%s' must be an object with \"role\" and \"content\", got %s", param,
                        api_type_name(m));
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role || (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0))
        return api_fail(e, 400, BAD, param, "invalid_value",
                        "'%s.role' must be \"user\" or \"assistant\" (the system prompt goes in "
                        "'system')",
                        param);
    bool user = strcmp(role, "user") == 0;
    json_t *content = json_object_get(m, "content");
    if (json_is_string(content))
        return json_array_append_new(msgs,
                                     json_pack("{s:s, s:O}", "role", role, "content", content)) == 0
                   ? 0
                   : oom(e);
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (!json_is_array(content))
        return api_fail(e, 400, BAD, param, "invalid_type",
                        "'%s' must be a string or an array of content blocks, got %s", param,
                        content ? api_type_name(content) : "nothing");
    char *text = NULL, *thinking = NULL;
    size_t tn = 0, thn = 0, j;
    json_t *calls = json_array(), *b;
    unsigned st = 0;
    if (!calls) return oom(e);
    json_array_foreach(content, j, b)
    {
        char bp[96];
        snprintf(bp, sizeof bp, "%s[%zu]", param, j);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !type) {
            st = api_fail(e, 400, BAD, bp, "invalid_type",
                          "'%s' must be a content block with a \"type\"", bp);
            break;
        }
        if (strcmp(type, "text") == 0) {
            json_t *t = json_object_get(b, "text");
            if (!json_is_string(t)) {
                st = api_fail(e, 400, BAD, bp, "invalid_value", "'%s.text' must be a string", bp);
                break;
            }
            if ((st = add_text(&text, &tn, json_string_value(t), json_string_length(t), e)) != 0)
                break;
        } else if (strcmp(type, "thinking") == 0 && !user) {
            json_t *t = json_object_get(b, "thinking");
            if (json_is_string(t) &&
                (st = add_text(&thinking, &thn, json_string_value(t), json_string_length(t), e)))
                break;
        } else if (strcmp(type, "redacted_thinking") == 0 && !user) {
            continue; /* encrypted by another server: nothing a template can show */
        } else if (strcmp(type, "tool_use") == 0 && !user) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
            json_t *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || (input && !json_is_object(input))) {
                st = api_fail(e, 400, BAD, bp, "invalid_value",
                              "'%s' must have a string \"id\" and \"name\" and an object "
                              "\"input\"",
                              bp);
                break;
            }
            char *args = input ? json_dumps(input, JSON_COMPACT) : strdup("{}");
            json_t *call = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type",
                                            "function", "function", "name", name, "arguments", args)
                                : NULL;
            free(args);
            if (!call || json_array_append_new(calls, call) != 0) {
                st = oom(e);
                break;
            }
        } else if (strcmp(type, "tool_result") == 0 && user) {
            json_t *id = json_object_get(b, "tool_use_id"), *out = NULL;
            if (!json_is_string(id)) {
                st = api_fail(e, 400, BAD, bp, "invalid_value",
                              "'%s.tool_use_id' must be the id of the tool_use it answers", bp);
                break;
            }
            char cp[128];
            snprintf(cp, sizeof cp, "%s.content", bp);
            if ((st = tool_result_text(json_object_get(b, "content"), cp, &out, e)) != 0) break;
            if (!out ||
                json_array_append_new(msgs, json_pack("{s:s, s:O, s:o}", "role", "tool",
                                                      "tool_call_id", id, "content", out)) != 0) {
                st = oom(e);
                break;
            }
        } else {
            st = api_fail(e, 400, BAD, bp, "invalid_value",
                          "'%s': a \"%s\" block is not supported in a%s message (text, %s)", bp,
                          type, user ? " user" : "n assistant",
                          user ? "tool_result; this model reads text only" : "thinking, tool_use");
            break;
        }
    }
    if (st == 0 && (tn || thn || json_array_size(calls) || !user)) {
        json_t *o = json_pack("{s:s, s:s%}", "role", role, "content", text ? text : "", tn);
        if (o && thn) json_object_set_new(o, "reasoning_content", json_stringn(thinking, thn));
        if (o && json_array_size(calls)) json_object_set(o, "tool_calls", calls);
        if (!o || json_array_append_new(msgs, o) != 0) st = oom(e);
    }
    json_decref(calls);
    free(text);
    free(thinking);
    return st;
}

static unsigned system_prompt(json_t *sys, json_t *msgs, struct api_error *e)
{
    if (!sys || json_is_null(sys)) return 0;
    json_t *text = NULL;
    unsigned st = tool_result_text(sys, "system", &text, e);
    if (st != 0) return st;
    if (!text || json_array_append_new(
                     msgs, json_pack("{s:s, s:o}", "role", "system", "content", text)) != 0)
        return oom(e);
    return 0;
}

static unsigned tools(json_t *in, json_t *out, struct api_error *e)
{
    json_t *t = json_object_get(in, "tools");
    /* no tools is the chat API's absent 'tools' (which refuses an empty list) */
    if (!t || json_is_null(t) || (json_is_array(t) && json_array_size(t) == 0)) return 0;
    if (!json_is_array(t))
        return api_fail(e, 400, BAD, "tools", "invalid_type",
                        "'tools' must be an array of {\"name\", \"description\", "
                        "\"input_schema\"}, got %s",
                        api_type_name(t));
    json_t *list = json_array(), *tool;
    size_t i;
    json_array_foreach(t, i, tool)
    {
        json_t *name = json_object_get(tool, "name"),
               *schema = json_object_get(tool, "input_schema");
        json_t *desc = json_object_get(tool, "description");
        if (!json_is_string(name) || !json_is_object(schema)) {
            json_decref(list);
            return api_fail(e, 400, BAD, "tools", "invalid_value",
                            "tools[%zu] must have a string \"name\" and an object "
                            "\"input_schema\" (Anthropic's server tools are not supported)",
                            i);
        }
        json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
        if (fn && json_is_string(desc)) json_object_set(fn, "description", desc);
        json_array_append_new(list, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    json_object_set_new(out, "tools", list);
    return 0;
}

static unsigned tool_choice(json_t *in, json_t *out, struct api_error *e)
{
    json_t *c = json_object_get(in, "tool_choice");
    if (!c || json_is_null(c)) return 0;
    const char *type = json_string_value(json_object_get(c, "type"));
    json_t *name = json_object_get(c, "name");
    json_t *choice = NULL;
    if (!json_is_object(c) || !type)
        return api_fail(e, 400, BAD, "tool_choice", "invalid_type",
                        "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | "
                        "\"none\"}");
    if (strcmp(type, "auto") == 0)
        choice = json_string("auto");
    else if (strcmp(type, "any") == 0)
        choice = json_string("required");
    else if (strcmp(type, "none") == 0)
        choice = json_string("none");
    else if (strcmp(type, "tool") == 0 && json_is_string(name))
        choice = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    else
        return api_fail(e, 400, BAD, "tool_choice", "invalid_value",
                        "'tool_choice.type' is \"%s\": send \"auto\", \"any\", \"none\", or "
                        "\"tool\" with a \"name\"",
                        type);
    json_object_set_new(out, "tool_choice", choice);
    json_t *dp = json_object_get(c, "disable_parallel_tool_use");
    if (json_is_boolean(dp))
        json_object_set_new(out, "parallel_tool_calls", json_boolean(!json_is_true(dp)));
    return 0;
}

/* copy carries the fields whose name and meaning are the chat API's too. */
static void copy(json_t *in, json_t *out, const char *key, const char *to)
{
    json_t *v = json_object_get(in, key);
    if (v) json_object_set(out, to, v);
}

unsigned api_anthropic_translate(json_t *in, json_t **out, struct api_error *e)
{
    unsigned st;
    json_t *o = json_object(), *msgs = json_array();
    *out = o;
    if (!o || !msgs) {
        json_decref(msgs);
        return oom(e);
    }
    json_object_set_new(o, "messages", msgs);
    static const char *const same[] = {"model", "max_tokens", "temperature",
                                       "top_p", "top_k",      "stream"};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++)
        copy(in, o, same[i], same[i]);
    json_t *stop = json_object_get(in, "stop_sequences");
    if (stop && !json_is_null(stop)) {
        size_t i;
        json_t *s;
        if (!json_is_array(stop) || json_array_size(stop) > FE_STOP_MAX)
            return api_fail(e, 400, BAD, "stop_sequences", "invalid_value",
                            "'stop_sequences' must be an array of at most %d strings", FE_STOP_MAX);
        json_array_foreach(stop, i, s)
        {
            if (!json_is_string(s))
                return api_fail(e, 400, BAD, "stop_sequences", "invalid_type",
                                "stop_sequences[%zu] must be a string, got %s", i,
                                api_type_name(s));
        }
        json_object_set(o, "stop", stop);
    }
    json_t *th = json_object_get(in, "thinking");
    if (th && !json_is_null(th)) {
        const char *type = json_string_value(json_object_get(th, "type"));
        if (!json_is_object(th) || !type ||
            (strcmp(type, "enabled") != 0 && strcmp(type, "disabled") != 0))
            return api_fail(e, 400, BAD, "thinking", "invalid_value",
                            "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or "
                            "{\"type\": \"disabled\"}");
        json_object_set_new(o, "chat_template_kwargs",
                            json_pack("{s:b}", "enable_thinking", strcmp(type, "enabled") == 0));
    }
    if ((st = system_prompt(json_object_get(in, "system"), msgs, e)) != 0) return st;
    json_t *m = json_object_get(in, "messages"), *mi;
    if (!json_is_array(m) || json_array_size(m) == 0)
        return api_fail(e, 400, BAD, "messages", m ? "invalid_value" : "missing_required_parameter",
                        "'messages' must be a non-empty array of {\"role\", \"content\"} objects");
    size_t i;
    json_array_foreach(m, i, mi)
    {
        if ((st = message(mi, i, msgs, e)) != 0) return st;
    }
    if ((st = tools(in, o, e)) != 0 || (st = tool_choice(in, o, e)) != 0) return st;
    return 0;
}

unsigned api_anthropic_parse(const char *body, size_t len, uint32_t n_vocab, struct api_params *p,
                             struct api_error *e)
{
    return api_parse_translated(API_MESSAGES, api_anthropic_translate, body, len, n_vocab, p, e);
}

char *api_anthropic_error_json(const struct api_error *e)
{
    const char *type = e->status == 400   ? "invalid_request_error"
                       : e->status == 401 ? "authentication_error"
                       : e->status == 403 ? "permission_error"
                       : e->status == 404 ? "not_found_error"
                       : e->status == 413 ? "request_too_large"
                       : e->status == 429 ? "rate_limit_error"
                       : e->status == 503 ? "overloaded_error"
                       : e->status >= 500 ? "api_error"
                                          : "invalid_request_error";
    json_t *o = json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type", type, "message",
                          api_str(e->message, strlen(e->message)));
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

static const char *stop_reason(const struct api_answer *a)
{
    switch (a->finish) {
    case API_FINISH_STOP_STR:
        return "stop_sequence";
    case API_FINISH_LENGTH:
        return "max_tokens";
    case API_FINISH_TOOL_CALLS:
        return "tool_use";
    default:
        return "end_turn";
    }
}

static json_t *usage(const struct api_answer *a)
{
    /* Anthropic counts cache reads apart: input_tokens are the ones prefilled */
    return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens",
                     (json_int_t)(a->n_prompt - (a->n_cached < a->n_prompt ? a->n_cached : 0)),
                     "output_tokens", (json_int_t)a->n_gen, "cache_read_input_tokens",
                     (json_int_t)a->n_cached, "cache_creation_input_tokens", (json_int_t)0);
}

/* tool_input parses a call's arguments; text that is not a JSON object is passed as {}. */
static json_t *tool_input(const char *args)
{
    json_t *j = args ? json_loads(args, 0, NULL) : NULL;
    if (json_is_object(j)) return j;
    json_decref(j);
    return json_object();
}

static json_t *tool_block(const struct api_tool_call *c, bool with_input)
{
    return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", c->id ? c->id : "", "name",
                     c->name ? c->name : "", "input",
                     with_input ? tool_input(c->arguments) : json_object());
}

json_t *api_anthropic_message(const struct api_answer *a)
{
    json_t *content = json_array();
    if (a->reasoning_len)
        json_array_append_new(content,
                              json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                        api_str(a->reasoning, a->reasoning_len), "signature", ""));
    if (a->content_len || (!a->reasoning_len && !a->n_tool_calls))
        json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text",
                                                 api_str(a->content, a->content_len)));
    for (size_t i = 0; i < a->n_tool_calls; i++)
        json_array_append_new(content, tool_block(&a->tool_calls[i], true));
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:s?, s:o}", "id", a->id, "type", "message",
                     "role", "assistant", "model", a->model, "content", content, "stop_reason",
                     stop_reason(a), "stop_sequence", a->stop_sequence, "usage", usage(a));
}

static int start(struct api_anthropic_stream *s, const struct api_answer *a, struct api_sse *out)
{
    int rv;
    if (s->started) return 0;
    s->started = true;
    json_t *u = usage(a);
    json_object_set_new(u, "output_tokens", json_integer(0));
    if ((rv = api_sse_event(out, "message_start",
                            json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}}", "type",
                                      "message_start", "message", "id", a->id, "type", "message",
                                      "role", "assistant", "model", a->model, "content",
                                      "stop_reason", "stop_sequence", "usage", u))) != 0)
        return rv;
    return api_sse_event(out, "ping", json_pack("{s:s}", "type", "ping"));
}

static int close_block(struct api_anthropic_stream *s, struct api_sse *out)
{
    if (!s->open) return 0;
    s->open = 0;
    return api_sse_event(
        out, "content_block_stop",
        json_pack("{s:s, s:i}", "type", "content_block_stop", "index", s->index++));
}

/* text_delta opens a block of kind (1 thinking, 2 text) when another is open, then adds text. */
static int text_delta(struct api_anthropic_stream *s, int kind, const char *t, size_t n,
                      struct api_sse *out)
{
    int rv;
    if (!n) return 0;
    if (s->open != kind) {
        if ((rv = close_block(s, out)) != 0) return rv;
        json_t *block = kind == 1 ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "",
                                              "signature", "")
                                  : json_pack("{s:s, s:s}", "type", "text", "text", "");
        if ((rv = api_sse_event(out, "content_block_start",
                                json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                                          s->index, "content_block", block))) != 0)
            return rv;
        s->open = kind;
    }
    json_t *d = kind == 1
                    ? json_pack("{s:s, s:o}", "type", "thinking_delta", "thinking", api_str(t, n))
                    : json_pack("{s:s, s:o}", "type", "text_delta", "text", api_str(t, n));
    return api_sse_event(
        out, "content_block_delta",
        json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index", s->index, "delta", d));
}

int api_anthropic_delta(struct api_anthropic_stream *s, const struct api_answer *a,
                        const char *reasoning, size_t rn, const char *text, size_t tn,
                        struct api_sse *out)
{
    int rv;
    if ((rv = start(s, a, out)) != 0 || (rv = text_delta(s, 1, reasoning, rn, out)) != 0) return rv;
    return text_delta(s, 2, text, tn, out);
}

int api_anthropic_finish(struct api_anthropic_stream *s, const struct api_answer *a,
                         struct api_sse *out)
{
    int rv;
    if ((rv = start(s, a, out)) != 0 || (rv = close_block(s, out)) != 0) return rv;
    for (size_t i = 0; i < a->n_tool_calls; i++) {
        const struct api_tool_call *c = &a->tool_calls[i];
        const char *args = c->arguments ? c->arguments : "{}";
        if ((rv = api_sse_event(out, "content_block_start",
                                json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                                          s->index, "content_block", tool_block(c, false)))) != 0 ||
            (rv = api_sse_event(out, "content_block_delta",
                                json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta",
                                          "index", s->index, "delta", "type", "input_json_delta",
                                          "partial_json", args))) != 0)
            return rv;
        s->open = 2;
        if ((rv = close_block(s, out)) != 0) return rv;
    }
    if ((rv = api_sse_event(out, "message_delta",
                            json_pack("{s:s, s:{s:s, s:s?}, s:o}", "type", "message_delta", "delta",
                                      "stop_reason", stop_reason(a), "stop_sequence",
                                      a->stop_sequence, "usage", usage(a)))) != 0)
        return rv;
    return api_sse_event(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

int api_anthropic_error_event(const struct api_error *e, struct api_sse *out)
{
    char *s = api_anthropic_error_json(e);
    json_t *o = s ? json_loads(s, 0, NULL) : NULL;
    free(s);
    return api_sse_event(out, "error", o);
}
