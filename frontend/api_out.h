/* api_out — what the translated APIs (Anthropic's Messages, OpenAI's Responses) share: their
 * parse entry (a body translated into a chat body, parsed as one), what they render an answer
 * from, and the server-sent events they write.
 *
 * The generation (fe_job.c) fills a struct api_answer with the text so far, the counts and, at the
 * end, the finish; a renderer turns it into one whole body or appends SSE events to a struct
 * api_sse, which the generation writes to the client. Named events ("event: NAME\ndata: JSON")
 * are what both APIs stream. Pure functions, any thread; an api_sse belongs to one request.
 */
#ifndef STRATA_API_OUT_H
#define STRATA_API_OUT_H

#include "frontend/api.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* An API's translation of a body (in, borrowed) into an OpenAI chat body (*out, new; set or NULL
 * also on failure): 0, or the HTTP status with e filled. */
typedef unsigned (*api_translate_fn)(json_t *in, json_t **out, struct api_error *e);

/* api_parse_translated parses body as kind's (API_MESSAGES, API_RESPONSES) through translate,
 * then as the chat body it becomes; as api_parse: free p with api_params_free either way. */
unsigned api_parse_translated(enum api_kind kind, api_translate_fn translate, const char *body,
                              size_t len, uint32_t n_vocab, struct api_params *p,
                              struct api_error *e);

/* Why an answer ended, in the chat API's words. */
enum api_finish {
    API_FINISH_NONE,      /* still going */
    API_FINISH_STOP,      /* an end-of-turn token or one of the model's own stop strings */
    API_FINISH_STOP_STR,  /* one of the request's stop strings: stop_sequence says which */
    API_FINISH_LENGTH,    /* max_tokens or the context */
    API_FINISH_TOOL_CALLS /* the model called tools */
};

struct api_answer {
    const char *id;    /* the response id ("msg_...", "resp_...") */
    const char *model; /* the model name to report */
    long long created; /* Unix seconds */
    const struct api_params *p;
    uint32_t n_prompt, n_cached, n_gen;
    /* whole answers: the text, split into the answer and the reasoning */
    const char *content, *reasoning;
    size_t content_len, reasoning_len;
    enum api_finish finish;
    const char *stop_sequence; /* API_FINISH_STOP_STR: the request's string that matched */
    const struct api_tool_call *tool_calls;
    size_t n_tool_calls;
    /* logprob entries in the chat API's shape ({"token", "logprob", "bytes", "top_logprobs"}):
     * a whole answer's, or in a stream the round's; NULL when not asked */
    const json_t *logprobs;
};

/* Events ready to send, "event: NAME\ndata: JSON\n\n" each. */
struct api_sse {
    char *p;
    size_t n, cap;
};

/* api_sse_event appends one event (data is taken; name NULL: a "data:" line only). STRATA_ENOMEM
 * (data is freed either way). */
int api_sse_event(struct api_sse *b, const char *name, json_t *data);

void api_sse_free(struct api_sse *b);

/* api_str makes a JSON string of n bytes (not always valid UTF-8: see api_lossy_string). */
json_t *api_str(const char *s, size_t n);

#endif
