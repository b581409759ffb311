/* http_fuzz — request bodies of the HTTP API through their parsers. The first input byte picks the
 * endpoint (chat, completions, tokenize, detokenize, Anthropic's messages, responses), the rest is
 * the body. Checked, beyond not crashing or leaking: a refused body has a 4xx/5xx status, a
 * message and renders as OpenAI's (and for messages Anthropic's) error JSON; an accepted one has
 * every field in its documented range (n within its cap, stop count, ids inside the vocabulary,
 * top_logprobs within its cap, chat messages all with string content). */
#include "frontend/api.h"
#include "frontend/api_anthropic.h"
#include "frontend/api_responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_VOCAB 1000

static void check_error(const struct api_error *e)
{
    if (e->status < 400 || e->status > 599 || !e->message[0]) abort();
    char *j = api_error_json(e);
    json_t *o = j ? json_loads(j, 0, NULL) : NULL;
    if (!o || !json_is_string(json_object_get(json_object_get(o, "error"), "message"))) abort();
    json_decref(o);
    free(j);
    j = api_error_json_as(API_MESSAGES, e);
    o = j ? json_loads(j, 0, NULL) : NULL;
    if (!o || !json_is_string(json_object_get(json_object_get(o, "error"), "type"))) abort();
    json_decref(o);
    free(j);
}

/* check_chat: an accepted chat-like request's fields are in range. */
static void check_chat(const struct api_params *p)
{
    size_t i;
    json_t *m;
    if (p->n_stop > FE_STOP_MAX || p->top_logprobs > API_MAX_TOP_LOGPROBS || p->max_tokens < 0 ||
        p->n < 1 || p->n > API_MAX_N)
        abort();
    json_array_foreach(p->messages, i, m)
    {
        if (!json_is_string(json_object_get(m, "content"))) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    struct api_error e;
    memset(&e, 0, sizeof e);
    switch (data[0] % 6) {
    case 0:
    case 1: {
        struct api_params p;
        enum api_kind kind = data[0] % 4 == 0 ? API_CHAT : API_COMPLETION;
        if (api_parse(kind, body, len, N_VOCAB, &p, &e) != 0) {
            check_error(&e);
        } else {
            check_chat(&p);
            for (size_t i = 0; i < p.n_prompt_ids; i++)
                if (p.prompt_ids[i] < 0 || p.prompt_ids[i] >= N_VOCAB) abort();
            if (kind == API_COMPLETION && !p.prompt && !p.n_prompt_ids) abort();
        }
        api_params_free(&p);
        break;
    }
    case 2: {
        struct api_tokenize t;
        if (api_parse_tokenize(body, len, &t, &e) != 0)
            check_error(&e);
        else if (!t.content)
            abort();
        json_decref(t.root);
        break;
    }
    case 3: {
        int32_t *ids;
        size_t n;
        if (api_parse_detokenize(body, len, N_VOCAB, &ids, &n, &e) != 0) check_error(&e);
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= N_VOCAB) abort();
        free(ids);
        break;
    }
    case 4:
    case 5: {
        struct api_params p;
        bool msgs = data[0] % 6 == 4;
        unsigned st = msgs ? api_anthropic_parse(body, len, N_VOCAB, &p, &e)
                           : api_responses_parse(body, len, N_VOCAB, &p, &e);
        if (st != 0) {
            check_error(&e);
        } else {
            check_chat(&p);
            if (p.n != 1 || p.kind != (msgs ? API_MESSAGES : API_RESPONSES) ||
                !json_array_size(p.messages))
                abort();
        }
        api_params_free(&p);
        break;
    }
    }
    return 0;
}
