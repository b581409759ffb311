/* api — the OpenAI-compatible request bodies: parsing and validating /v1/chat/completions,
 * /v1/completions, /tokenize and /detokenize bodies, OpenAI's error shape, and the usage and
 * timings every answer carries. Anthropic's /v1/messages (api_anthropic.h) and OpenAI's
 * /v1/responses (api_responses.h) are translated into the same struct api_params.
 *
 * Bodies are untrusted bytes (fuzzed by frontend/http_fuzz.c). api_parse checks every field the
 * frontend uses for type and range and fails with a filled struct api_error: the HTTP status,
 * OpenAI's `type`, the offending `param` and a message that names the value and what to send
 * instead. Unknown fields are ignored (as llama-server does); `n` is 1..API_MAX_N. The
 * parsed params own the JSON tree; strings and objects in them point into it. Pure functions, any
 * thread.
 */
#ifndef STRATA_API_H
#define STRATA_API_H

#include "common/ipc/wclient.h"
#include "frontend/fe_stop.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define API_MAX_TOP_LOGPROBS 20 /* OpenAI's cap on top_logprobs */
#define API_MAX_N            16 /* choices of one chat or completion request */

enum api_kind {
    API_CHAT,       /* /v1/chat/completions */
    API_COMPLETION, /* /v1/completions */
    API_MESSAGES,   /* Anthropic's /v1/messages, translated to a chat (api_anthropic.h) */
    API_RESPONSES,  /* OpenAI's /v1/responses, translated to a chat (api_responses.h) */
};

/* api_is_chat: the request is a conversation rendered with the chat template. */
static inline bool api_is_chat(enum api_kind k)
{
    return k != API_COMPLETION;
}

struct api_error {
    unsigned status;   /* HTTP status: 400, 401, 404, 413, 429, 500, 503 */
    const char *type;  /* "invalid_request_error", "authentication_error", "server_error"... */
    char param[64];    /* the offending field, "" for none */
    const char *code;  /* OpenAI's code string or NULL */
    char message[512]; /* for a person: what was wrong, with the value, and what to do */
};

/* api_fail fills e and returns e->status. param and code may be NULL. */
unsigned api_fail(struct api_error *e, unsigned status, const char *type, const char *param,
                  const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* api_error_json renders e as {"error": {"message", "type", "param", "code"}} (malloc'd). */
char *api_error_json(const struct api_error *e);

/* api_error_json_as renders e in the error shape of kind's API: Anthropic's for API_MESSAGES,
 * OpenAI's otherwise (malloc'd). */
char *api_error_json_as(enum api_kind kind, const struct api_error *e);

/* api_type_name names v's JSON type for a message: "an object", "a string"... */
const char *api_type_name(const json_t *v);

/* api_lossy_string makes a JSON string of bytes that may not be UTF-8 (a token's piece can be part
 * of a character, an error message can quote the client's bytes): invalid bytes become U+FFFD.
 * NULL only when out of memory. */
json_t *api_lossy_string(const char *s, size_t n);

struct api_params {
    enum api_kind kind;
    json_t *root;       /* the parsed body (owned) */
    json_t *messages;   /* chat: the messages with every content as a string (owned) */
    const char *prompt; /* completion: the prompt text (into root), or NULL with ids */
    size_t prompt_len;
    int32_t *prompt_ids; /* completion: the prompt as token ids (owned), or NULL */
    size_t n_prompt_ids;
    const char *model; /* as sent, "" when absent */
    uint32_t n;        /* choices, 1..API_MAX_N (chat and completions) */
    bool stream;
    bool include_usage; /* stream_options.include_usage */
    int64_t max_tokens; /* max_tokens or max_completion_tokens; 0: not given */
    struct wclient_sampling sampling;
    const char *stop[FE_STOP_MAX]; /* into root */
    size_t n_stop;
    bool logprobs;                 /* report logprobs */
    uint32_t top_logprobs;         /* alternatives per token */
    const json_t *template_kwargs; /* chat_template_kwargs object (into root) or NULL */
    const char *reasoning_effort;  /* or NULL */
    char *grammar; /* GBNF the answer must follow (owned), or NULL: from response_format
                      (json_object, json_schema), llama-server's `grammar` or `json_schema`, or
                      a forced tool call; checked by api_parse */
    json_t *tools;       /* chat: the `tools` array as sent (into root), or NULL */
    json_t *tool_choice; /* "auto" (also when absent with tools), "none", "required", or
                            {"type": "function", "function": {"name"}} (into root), or NULL */
    bool parallel_tool_calls; /* several calls in one answer may be made; default true */
};

/* A tool call parsed from a model's answer. */
struct api_tool_call {
    char *id;        /* "call_..." (malloc'd) */
    char *name;      /* the function's name (malloc'd) */
    char *arguments; /* its arguments as a JSON text (malloc'd) */
};

/* api_parse parses and checks a chat or completion body. Token ids in a prompt array must be below
 * n_vocab. Returns 0, or the HTTP status with e filled (400 for any bad body). Free p with
 * api_params_free either way. */
unsigned api_parse(enum api_kind kind, const char *body, size_t len, uint32_t n_vocab,
                   struct api_params *p, struct api_error *e);

/* api_load parses body as a JSON object into *root (NULL or the non-object on failure: decref it
 * either way). Returns 0 or 400 with e filled. */
unsigned api_load(const char *body, size_t len, json_t **root, struct api_error *e);

/* api_parse_root is api_parse of an already parsed body: root is taken over (p owns it, also on
 * failure). The translators of other APIs build an OpenAI chat body and parse it here. */
unsigned api_parse_root(enum api_kind kind, json_t *root, uint32_t n_vocab, struct api_params *p,
                        struct api_error *e);

void api_params_free(struct api_params *p);

/* api_usage_json renders OpenAI's usage: prompt, completion and total tokens, and
 * prompt_tokens_details.cached_tokens (prompt tokens the worker's prefix cache served). */
json_t *api_usage_json(uint32_t n_prompt, uint32_t n_cached, uint32_t n_gen);

/* api_timings_json renders llama-server's timings of one answer from the last update of its
 * request (the worker's figures) and n_gen, the tokens received: prompt_n (tokens prefilled, the
 * cached ones excluded), cache_n, prompt_ms, prompt_per_second, predicted_n, predicted_ms,
 * predicted_per_second, queue_ms. */
json_t *api_timings_json(const struct wclient_update *u, uint32_t n_gen);

/* A /tokenize body: {"content": str, "add_special": bool, "parse_special": bool,
 * "with_pieces": bool}. content points into root. */
struct api_tokenize {
    json_t *root;
    const char *content;
    size_t content_len;
    bool add_special, parse_special, with_pieces;
};

unsigned api_parse_tokenize(const char *body, size_t len, struct api_tokenize *t,
                            struct api_error *e);

/* A /detokenize body: {"tokens": [ids below n_vocab]}. ids is malloc'd. */
unsigned api_parse_detokenize(const char *body, size_t len, uint32_t n_vocab, int32_t **ids,
                              size_t *n, struct api_error *e);

#endif
