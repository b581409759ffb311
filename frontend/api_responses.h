/* api_responses — OpenAI's Responses API (POST /v1/responses), stateless, over the chat machinery.
 *
 * A Responses body is translated into an OpenAI chat body and parsed by api_parse_root:
 * `instructions` becomes the system message, `input` (a string, or message, function_call,
 * function_call_output and reasoning items) the conversation, `tools` (function tools) the chat
 * API's nested shape, `max_output_tokens` max_tokens, `reasoning.effort` reasoning_effort,
 * `text.format` response_format, `top_logprobs` / `include: ["message.output_text.logprobs"]`
 * logprobs. Nothing is stored: `previous_response_id` and item references are refused (send the
 * whole conversation). The answer comes back as a `response` object (reasoning, message and
 * function_call output items) or as the Responses stream's events: response.created,
 * response.in_progress, response.output_item.added, response.content_part.added,
 * response.reasoning_text.delta/done, response.output_text.delta/done,
 * response.function_call_arguments.delta/done, response.content_part.done,
 * response.output_item.done, then response.completed (or response.incomplete at max tokens), each
 * with its sequence_number. Pure functions, any thread; a stream state belongs to one request.
 */
#ifndef STRATA_API_RESPONSES_H
#define STRATA_API_RESPONSES_H

#include "frontend/api.h"
#include "frontend/api_out.h"

#include <stdbool.h>

/* api_responses_parse checks and translates a Responses body into p (kind API_RESPONSES). Returns
 * 0 or the HTTP status with e filled. Free p with api_params_free either way. */
unsigned api_responses_parse(const char *body, size_t len, uint32_t n_vocab, struct api_params *p,
                             struct api_error *e);

/* api_responses_translate is the translation alone: a Responses body (borrowed) to a new OpenAI
 * chat body (*out, owned by the caller; it keeps the original under "x-strata-responses" for the
 * answer's echo of the request). Returns 0 or the status with e filled. */
unsigned api_responses_translate(json_t *body, json_t **out, struct api_error *e);

/* api_responses_object renders a whole answer as a `response` object. */
json_t *api_responses_object(const struct api_answer *a);

/* The stream's position. Zero it to start; api_responses_stream_fini frees it. */
struct api_responses_stream {
    bool started;       /* response.created sent */
    uint32_t seq;       /* the next sequence_number */
    int open;           /* the open output item: 0 none, 1 reasoning, 2 message */
    json_t *items;      /* the output items done so far */
    json_t *lp;         /* the open message's logprob entries so far */
    json_t *lp_pending; /* entries of tokens whose text has not shown yet */
    char *text;         /* the open item's text so far */
    size_t text_len, text_cap;
};

/* api_responses_delta appends the events for new reasoning and text (response.created and
 * response.in_progress first; an output item opens when the kind of text changes). */
int api_responses_delta(struct api_responses_stream *s, const struct api_answer *a,
                        const char *reasoning, size_t rn, const char *text, size_t tn,
                        struct api_sse *out);

/* api_responses_finish closes the open item, adds the function calls and the final
 * response.completed / response.incomplete with the whole response and its usage. */
int api_responses_finish(struct api_responses_stream *s, const struct api_answer *a,
                         struct api_sse *out);

/* api_responses_error_event appends an `error` event for an error after the stream began. */
int api_responses_error_event(struct api_responses_stream *s, const struct api_error *e,
                              struct api_sse *out);

void api_responses_stream_fini(struct api_responses_stream *s);

#endif
