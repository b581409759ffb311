/* api_anthropic — Anthropic's Messages API (POST /v1/messages) over the chat machinery.
 *
 * A Messages body is translated into an OpenAI chat body and parsed by api_parse_root, so every
 * check and default of the chat API applies: `system` becomes the first message, content blocks
 * are joined into text, `tool_use` blocks become the assistant's `tool_calls` (arguments as JSON
 * text), `tool_result` blocks become `tool` messages, `thinking` blocks the assistant's
 * `reasoning_content`; `tools` take the chat API's function shape, `tool_choice` its words,
 * `thinking` sets the template's `enable_thinking`, `stop_sequences` the stop strings. Errors name
 * the Anthropic field. The answer is rendered back as a `message` (whole) or the Messages stream's
 * events: message_start, ping, content_block_start/delta/stop (thinking, text, tool_use blocks),
 * message_delta (stop reason, usage), message_stop.
 * Pure functions, any thread; a stream state belongs to one request.
 */
#ifndef STRATA_API_ANTHROPIC_H
#define STRATA_API_ANTHROPIC_H

#include "frontend/api.h"
#include "frontend/api_out.h"

#include <stdbool.h>

/* api_anthropic_parse checks and translates a Messages body into p (kind API_MESSAGES). Returns 0
 * or the HTTP status with e filled. Free p with api_params_free either way. */
unsigned api_anthropic_parse(const char *body, size_t len, uint32_t n_vocab, struct api_params *p,
                             struct api_error *e);

/* api_anthropic_translate is the translation alone: a Messages body (borrowed) to a new OpenAI
 * chat body (*out, owned by the caller). Returns 0 or the status with e filled. */
unsigned api_anthropic_translate(json_t *body, json_t **out, struct api_error *e);

/* api_anthropic_error_json renders e as {"type": "error", "error": {"type", "message"}}
 * (malloc'd); the type follows the status (400 invalid_request_error, 401 authentication_error,
 * 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 503 overloaded_error, 5xx
 * api_error). */
char *api_anthropic_error_json(const struct api_error *e);

/* api_anthropic_message renders a whole answer as a `message` object. */
json_t *api_anthropic_message(const struct api_answer *a);

/* The stream's position: which content block is open. Zero it to start. */
struct api_anthropic_stream {
    bool started; /* message_start sent */
    int index;    /* the next content block's index */
    int open;     /* the open block: 0 none, 1 thinking, 2 text */
};

/* api_anthropic_delta appends the events for new reasoning and text (message_start first, on the
 * first call; a block opens when the kind of text changes). */
int api_anthropic_delta(struct api_anthropic_stream *s, const struct api_answer *a,
                        const char *reasoning, size_t rn, const char *text, size_t tn,
                        struct api_sse *out);

/* api_anthropic_finish closes the open block, adds the tool_use blocks, then message_delta (stop
 * reason, usage) and message_stop. */
int api_anthropic_finish(struct api_anthropic_stream *s, const struct api_answer *a,
                         struct api_sse *out);

/* api_anthropic_error_event appends an `error` event for an error after the stream began. */
int api_anthropic_error_event(const struct api_error *e, struct api_sse *out);

#endif
