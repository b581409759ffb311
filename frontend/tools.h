/* tools — tool calls in the chat templates' own syntaxes: which syntax a template speaks, the
 * grammar that forces a call, and the parser from a model's text to OpenAI's tool_calls.
 *
 * A template's family is found by rendering a probe conversation whose assistant turn makes a
 * call and looking at how the template wrote it, so any template that renders calls the way its
 * model emits them is recognized whatever its source looks like. Families: Hermes/Qwen
 * `<tool_call>{json}</tool_call>`, Qwen3-Coder `<tool_call><function=..><parameter=..>`, GLM
 * `<tool_call>name<arg_key>..`, Mistral `[TOOL_CALLS]name[ARGS]{json}` and the older
 * `[TOOL_CALLS][{json}]`, Llama 3.x `{"name", "parameters"}`, DeepSeek V3 `<｜tool▁call▁begin｜>`
 * and gpt-oss harmony `to=functions.name ... <|message|>{json}<|call|>`.
 * Parsing is a pure function of the text; any thread.
 */
#ifndef STRATA_TOOLS_H
#define STRATA_TOOLS_H

#include "frontend/api.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct tmpl;
struct tok;

enum tools_family {
    TOOLS_HERMES,     /* Qwen2.5/Qwen3, Hermes, SmolLM3: <tool_call>\n{"name", "arguments"} */
    TOOLS_QWEN_XML,   /* Qwen3-Coder: <tool_call>\n<function=name>\n<parameter=k>\nv\n... */
    TOOLS_GLM,        /* GLM 4.5+: <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value> */
    TOOLS_MISTRAL,    /* Mistral Small 3.2+: [TOOL_CALLS]name[CALL_ID]id[ARGS]{...} */
    TOOLS_MISTRAL_V3, /* Mistral Nemo: [TOOL_CALLS][{"name", "arguments", "id"}] */
    TOOLS_LLAMA3,     /* Llama 3.1-3.3: {"name": ..., "parameters": {...}} */
    TOOLS_DEEPSEEK,   /* DeepSeek V3 / R1 / V3.1 */
    TOOLS_HARMONY,    /* gpt-oss */
};

const char *tools_family_name(enum tools_family f);

/* tools_detect renders a probe call through t and names the family its output shows; Hermes when
 * none does (a template without tools: the model is then asked in the Hermes form). */
enum tools_family tools_detect(const struct tmpl *t, const char *bos, const char *eos);

/* The calls found in a model's answer. content is the answer without them (malloc'd; for gpt-oss
 * the final channel's message, calls or not). unclosed:
 * a call was opened and not completed (the text is then all content, and no call reported). */
struct tools_parsed {
    char *content;
    size_t content_len;
    struct api_tool_call *calls;
    size_t n_calls;
    bool unclosed;
};

/* tools_parse splits text[0..n) into content and calls; ids are made from id_seed and the
 * call's index (9 characters for Mistral, whose templates require it, "call_..." otherwise).
 * Arguments come out as compact JSON objects; the XML-like syntaxes' values are typed by the
 * parameters' schemas in tools (the request's; NULL: JSON when a value reads as JSON).
 * STRATA_ENOMEM only. */
int tools_parse(enum tools_family f, const json_t *tools, const char *text, size_t n,
                const char *id_seed, struct tools_parsed *out);
void tools_parsed_free(struct tools_parsed *p);

/* tools_content_end: how many bytes of text[0..n) are surely content: up to the first call
 * marker, or a tail that may begin one, held back while streaming (gpt-oss: none, its channels
 * are sorted out at the end). */
size_t tools_content_end(enum tools_family f, const char *text, size_t n);

/* tools_grammar writes GBNF (malloc'd) that forces f's call syntax for one of tools (or only the
 * one named `only`), arguments held to each function's parameters: JSON by the schema, or in the
 * XML-like syntaxes (Qwen3-Coder, GLM) each parameter's value by its schema (a string's text as
 * it is, an enum's strings, anything else JSON), the required ones present, in the order of
 * `properties`; several calls when parallel. lazy (tool_choice auto): a lazy grammar whose
 * trigger is the family's call marker, so text before a call is free and a call once begun is
 * held to the grammar. Markers that are control tokens of tok ([TOOL_CALLS], gpt-oss's
 * <|channel|>) become token references <[id]> (tok NULL: all text). STRATA_EINVAL for a schema
 * the grammar cannot express (the detail names the tool), STRATA_ENOMEM. */
int tools_grammar(enum tools_family f, const json_t *tools, const char *only, bool parallel,
                  bool lazy, const struct tok *tok, char **gbnf);

/* tools_string_param: a parameter schema whose values are strings (type string, or an enum or
 * const of strings): the XML-like syntaxes write them as bare text. */
bool tools_string_param(const json_t *ps);

#endif
