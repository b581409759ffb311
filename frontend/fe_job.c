/* fe_job — one completion request: prompt, submit, then a thread that polls the worker and turns
 * tokens into text (stop strings, reasoning split, logprobs) as SSE chunks or one final body, in
 * the shape of the API asked (OpenAI's chat and completions here; Anthropic's Messages and
 * OpenAI's Responses through api_anthropic.h and api_responses.h). */
#include "frontend/fe_int.h"

#include "frontend/api_anthropic.h"
#include "frontend/api_responses.h"

#include "common/base/err.h"
#include "common/base/log.h"
#include "frontend/tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A request for n > 1 choices: one job per choice, each with its own worker request and thread,
 * sharing the HTTP answer. Choice 0 goes first; the others are submitted once it has its first
 * token, so its prompt's KV blocks are in the worker's prefix cache and theirs hit it. The job that
 * ends last answers (whole: every choice; streamed: the usage chunk and [DONE]) and frees the
 * group. */
struct fe_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_bool gone;            /* the client left */
    bool prefilled;              /* choice 0 has a token (or ended) */
    uint32_t left;               /* choices not ended */
    uint32_t n_gen;              /* tokens of the choices ended */
    uint32_t n_cached;           /* choice 0's cached prompt tokens (the prompt is counted once) */
    struct wclient_update last0; /* choice 0's timings */
    uint32_t n_gen0;             /* and tokens */
    json_t *choices;             /* whole answers: each choice by index */
    struct api_error err;        /* the first error of a choice */
    bool cancelled;              /* a choice ended without an answer (shutdown, client gone) */
    bool began;                  /* streamed: choice 0 began the stream */
};

struct fe_job {
    struct fe *f;
    struct fe_group *g;  /* n > 1: the request's group, else NULL */
    uint32_t index;      /* the choice */
    struct fe_job *next; /* f->jobs (f->mu) */
    struct http_req *r;
    struct api_params p;
    const struct fe_backend *ops;
    void *stream;
    int slot;
    char id[WCLIENT_ID_MAX + 1]; /* the worker's request id */
    char resp_id[WCLIENT_ID_MAX + 16];
    long long created;
    uint32_t n_prompt;
    atomic_bool gone;   /* the client left (set under the stream's lock by http) */
    atomic_bool cancel; /* fe_stop */
    bool admitted;      /* counted in f->n_admitted */
    struct tok_stream ts;
    struct tok_buf text; /* this update's new text */
    struct fe_stop stop;
    bool split;   /* reasoning markup is split out */
    bool hreason; /* gpt-oss with tools: the text stays whole (its calls are in the channel
                     headers) and its analysis channel is the reasoning, through rs too */
    struct tmpl_reason_stream rs;
    struct tmpl_reason_out ro;
    struct tok_buf content, reasoning; /* a whole answer (not streamed) */
    json_t *lp;      /* logprobs: chat content entries, or the completion's four arrays */
    uint32_t n_gen;  /* tokens received */
    size_t emitted;  /* bytes of answer text released so far (the completion text_offset) */
    double t_submit; /* monotonic seconds */
    double ttft;     /* seconds to the first token, -1 before it */
    struct wclient_update last; /* timings of the last update */
    /* Messages and Responses streams: where the answer is, and the events to send */
    struct api_anthropic_stream as;
    struct api_responses_stream rsp;
    struct api_sse ev;
    /* no worker was ready at submit (one restarting): the job thread submits req when one is */
    bool wait_pick;
    struct wclient_req req;
    int32_t *req_ids; /* req's prompt (owned) */
    /* tool calls: the answer's content is parsed for calls in the template's syntax */
    bool tools_on;
    bool tlazy; /* tool_choice auto: p.grammar is lazy (free text until a call begins) */
    enum tools_family tfam;
    struct tok_buf tcontent; /* stream: the content so far */
    size_t tsent;            /* of it, bytes sent as content deltas */
    struct tools_parsed tp;  /* the calls found at the end */
};

/* A stream whose workers all stay away this long ends with a 503 error event. */
#define FE_AWAY_S 30.0

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int buf_add(struct tok_buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return strata_errf(STRATA_ENOMEM, "frontend: text buffer of %zu bytes", cap);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n); /* s may be NULL when n is 0 (an empty stop-matcher feed) */
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

static json_t *bytes_of(const char *s, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* piece_json returns the token's text piece as a string and (chat) its bytes. */
static json_t *piece(const struct fe_model *m, int32_t id, json_t **bytes)
{
    struct tok_buf b = {0};
    tok_piece(m->tok, id, TOK_DECODE_SPECIAL, &b);
    json_t *s = api_lossy_string(b.p ? b.p : "", b.n);
    if (bytes) *bytes = bytes_of(b.p ? b.p : "", b.n);
    free(b.p);
    return s;
}

/* add_logprobs appends token i of u to dst: a chat "content" entry, or the completion arrays
 * (tokens, token_logprobs, top_logprobs, text_offset). */
static void add_logprobs(struct fe_job *j, const struct wclient_update *u, uint32_t i, json_t *dst)
{
    const struct fe_model *m = &j->f->model;
    if (!u->logprobs) return;
    if (api_is_chat(j->p.kind)) {
        json_t *bytes, *tops = json_array();
        json_t *tok = piece(m, u->tokens[i], &bytes);
        for (uint32_t k = 0; k < u->n_top && k < j->p.top_logprobs; k++) {
            json_t *tb, *ts = piece(m, u->top_ids[i * u->n_top + k], &tb);
            json_array_append_new(tops, json_pack("{s:o, s:f, s:o}", "token", ts, "logprob",
                                                  (double)u->top_logprobs[i * u->n_top + k],
                                                  "bytes", tb));
        }
        json_array_append_new(dst, json_pack("{s:o, s:f, s:o, s:o}", "token", tok, "logprob",
                                             (double)u->logprobs[i], "bytes", bytes, "top_logprobs",
                                             tops));
        return;
    }
    json_t *tops = json_object();
    for (uint32_t k = 0; k < u->n_top && k < j->p.top_logprobs; k++) {
        json_t *ts = piece(m, u->top_ids[i * u->n_top + k], NULL);
        json_object_set_new(tops, json_string_value(ts),
                            json_real(u->top_logprobs[i * u->n_top + k]));
        json_decref(ts);
    }
    json_array_append_new(json_object_get(dst, "tokens"), piece(m, u->tokens[i], NULL));
    json_array_append_new(json_object_get(dst, "token_logprobs"), json_real(u->logprobs[i]));
    json_array_append_new(json_object_get(dst, "top_logprobs"), tops);
    json_array_append_new(json_object_get(dst, "text_offset"),
                          json_integer((json_int_t)j->emitted));
}

static json_t *new_logprobs(const struct fe_job *j)
{
    if (!j->p.logprobs) return NULL;
    if (api_is_chat(j->p.kind)) return json_array();
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

static json_t *usage(const struct fe_job *j)
{
    return api_usage_json(j->n_prompt, j->last.n_cached, j->n_gen);
}

static json_t *timings(const struct fe_job *j)
{
    const struct wclient_update *u = &j->last;
    json_t *t = api_timings_json(u, j->n_gen);
    /* speculative decoding, llama-server's names; tokens per pass over the worker's passes */
    if (t && u->n_draft) {
        json_object_set_new(t, "draft_n", json_integer(u->n_draft));
        json_object_set_new(t, "draft_n_accepted", json_integer(u->n_draft_accepted));
        json_object_set_new(t, "tokens_per_pass",
                            json_real(u->n_passes ? (double)(u->n_passes + u->n_draft_accepted) /
                                                        u->n_passes
                                                  : 0.0));
    }
    return t;
}

static const char *model_name(const struct fe_job *j)
{
    if (j->f->o.model_alias) return j->f->o.model_alias;
    return j->p.model[0] ? j->p.model : j->f->model.name;
}

/* answer describes j for the Messages and Responses renderers; finish NULL: still going. */
static struct api_answer answer(const struct fe_job *j, const char *finish)
{
    struct api_answer a = {.id = j->resp_id,
                           .model = model_name(j),
                           .created = j->created,
                           .p = &j->p,
                           .n_prompt = j->n_prompt,
                           .n_cached = j->last.n_cached,
                           .n_gen = j->n_gen,
                           .content = j->content.p,
                           .content_len = j->content.n,
                           .reasoning = j->reasoning.p,
                           .reasoning_len = j->reasoning.n,
                           .logprobs = j->lp};
    const char *hit = fe_stop_matched(&j->stop);
    if (!finish) return a;
    a.finish = strcmp(finish, "length") == 0 ? API_FINISH_LENGTH : API_FINISH_STOP;
    /* the request's own stop strings are reported; the model's (strata.stop) end the turn */
    for (size_t i = 0; hit && i < j->p.n_stop; i++)
        if (strcmp(hit, j->p.stop[i]) == 0) {
            a.finish = API_FINISH_STOP_STR;
            a.stop_sequence = j->p.stop[i];
        }
    /* the calls parsed from the answer (at the finish: whole, or a stream's held tail) */
    if (j->tools_on && j->tp.n_calls) {
        a.finish = API_FINISH_TOOL_CALLS;
        a.tool_calls = j->tp.calls;
        a.n_tool_calls = j->tp.n_calls;
    }
    return a;
}

/* send_events writes the events the renderers queued in j->ev. */
static int send_events(struct fe_job *j, int rv)
{
    if (rv == 0 && j->ev.n) rv = http_stream_write(j->r, j->ev.p, j->ev.n);
    j->ev.n = 0;
    return rv;
}

/* emit_other streams one round of a Messages or Responses answer. */
static int emit_other(struct fe_job *j, const char *content, size_t cn, const char *reasoning,
                      size_t rn, const json_t *lp, const char *finish)
{
    struct api_answer a = answer(j, finish);
    a.logprobs = lp;
    int rv = j->p.kind == API_MESSAGES
                 ? api_anthropic_delta(&j->as, &a, reasoning, rn, content, cn, &j->ev)
                 : api_responses_delta(&j->rsp, &a, reasoning, rn, content, cn, &j->ev);
    if (rv == 0 && finish)
        rv = j->p.kind == API_MESSAGES ? api_anthropic_finish(&j->as, &a, &j->ev)
                                       : api_responses_finish(&j->rsp, &a, &j->ev);
    return send_events(j, rv);
}

/* chunk wraps one choice into a stream chunk object. */
static json_t *chunk(const struct fe_job *j, json_t *choice)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", j->resp_id, "object",
                     j->p.kind == API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)j->created, "model", model_name(j), "choices", choice);
}

static int sse(struct fe_job *j, json_t *o)
{
    int rv = STRATA_ENOMEM;
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(8)) : NULL;
    json_decref(o);
    if (!s) return strata_errf(rv, "frontend: chunk");
    size_t n = strlen(s);
    char *line = malloc(n + 9);
    if (line) {
        memcpy(line, "data: ", 6);
        memcpy(line + 6, s, n);
        memcpy(line + 6 + n, "\n\n", 2);
        rv = http_stream_write(j->r, line, n + 8);
    }
    free(line);
    free(s);
    return rv;
}

/* calls_json renders parsed calls as OpenAI's tool_calls (with "index" for stream deltas). */
static json_t *calls_json(const struct tools_parsed *tp, bool index)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < tp->n_calls; i++) {
        json_t *c = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", tp->calls[i].id, "type",
                              "function", "function", "name", tp->calls[i].name, "arguments",
                              tp->calls[i].arguments);
        if (c && index) json_object_set_new(c, "index", json_integer((json_int_t)i));
        json_array_append_new(a, c);
    }
    return a;
}

/* tools_stream turns a round's content into what may be sent: text up to where a call may begin
 * is released, the rest held; at the finish the held text is parsed, and its calls come back as
 * tool_calls deltas (*calls, NULL when none) with the content that was not a call. */
static int tools_stream(struct fe_job *j, const char **content, size_t *cn, const char *finish,
                        json_t **calls)
{
    int rv = buf_add(&j->tcontent, *content, *cn);
    if (rv) return rv;
    const char *all = j->tcontent.p ? j->tcontent.p : "";
    size_t n = j->tcontent.n, end = finish ? n : tools_content_end(j->tfam, all, n);
    *content = all + j->tsent;
    *cn = end > j->tsent ? end - j->tsent : 0;
    if (finish) {
        if ((rv = tools_parse(j->tfam, j->p.tools, all, n, j->id, &j->tp)) != 0) return rv;
        if (j->tp.n_calls || j->tfam == TOOLS_HARMONY) { /* gpt-oss: its final channel */
            *content = j->tp.content + (j->tp.content_len > j->tsent ? j->tsent : 0);
            *cn = j->tp.content_len > j->tsent ? j->tp.content_len - j->tsent : 0;
        }
        if (j->tp.n_calls && !(*calls = calls_json(&j->tp, true))) return STRATA_ENOMEM;
    }
    j->tsent += *cn;
    return 0;
}

/* emit sends (stream) or keeps (whole answer) the text released this round, split into content
 * and reasoning, with the round's logprobs. finish is NULL until the last round. */
static int emit(struct fe_job *j, const char *text, size_t n, json_t *lp, const char *finish)
{
    const char *content = text, *reasoning = "";
    size_t cn = n, rn = 0;
    int rv = 0;
    if (j->split || j->hreason) {
        j->ro.content_len = j->ro.reasoning_len = 0;
        if ((rv = tmpl_reason_feed(&j->rs, text, n, &j->ro)) != 0 ||
            (finish && (rv = tmpl_reason_finish(&j->rs, &j->ro)) != 0))
            goto out;
        if (j->split) {
            content = j->ro.content ? j->ro.content : "";
            cn = j->ro.content_len;
        }
        reasoning = j->ro.reasoning ? j->ro.reasoning : "";
        rn = j->ro.reasoning_len;
    }
    json_t *calls = NULL;
    if (j->tools_on && j->p.stream) {
        if ((rv = tools_stream(j, &content, &cn, finish, &calls)) != 0) goto out;
        if (calls) finish = "tool_calls";
    }
    j->emitted += cn;
    if (!j->p.stream) {
        if ((rv = buf_add(&j->content, content, cn)) == 0)
            rv = buf_add(&j->reasoning, reasoning, rn);
        if (lp && j->p.kind == API_CHAT) json_array_extend(j->lp, lp);
        goto out;
    }
    if (j->p.kind == API_MESSAGES || j->p.kind == API_RESPONSES) {
        json_decref(calls); /* their renderers take the calls from j->tp */
        rv = emit_other(j, content, cn, reasoning, rn, lp, finish);
        goto out;
    }
    bool has_lp = lp && (j->p.kind == API_CHAT ? json_array_size(lp)
                                               : json_array_size(json_object_get(lp, "tokens")));
    if (!cn && !rn && !has_lp && !finish) goto out;
    json_t *lpj =
        has_lp ? (j->p.kind == API_CHAT ? json_pack("{s:O}", "content", lp) : json_incref(lp))
               : json_null();
    json_t *choice;
    if (j->p.kind == API_CHAT) {
        json_t *delta = json_object();
        if (cn) json_object_set_new(delta, "content", json_stringn(content, cn));
        if (rn) json_object_set_new(delta, "reasoning_content", json_stringn(reasoning, rn));
        if (calls) json_object_set_new(delta, "tool_calls", calls);
        choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", (int)j->index, "delta", delta,
                           "logprobs", lpj, "finish_reason", finish);
    } else {
        choice = json_pack("{s:i, s:s%, s:o, s:s?}", "index", (int)j->index, "text", content, cn,
                           "logprobs", lpj, "finish_reason", finish);
    }
    json_t *c = chunk(j, choice);
    if (c && finish) json_object_set_new(c, "timings", timings(j));
    rv = sse(j, c);
out:
    return rv;
}

/* take turns one poll update into text and emits it; *hit: a stop string matched. */
static int take(struct fe_job *j, const struct wclient_update *u, bool *hit)
{
    int rv = 0;
    json_t *lp = j->p.stream ? new_logprobs(j) : NULL;
    json_t *dst = j->p.stream ? lp : j->lp;
    j->text.n = 0;
    for (uint32_t i = 0; i < u->n_tokens; i++) {
        if (j->ttft < 0) j->ttft = now_s() - j->t_submit;
        j->n_gen++;
        if ((rv = tok_stream_feed(&j->ts, u->tokens[i], &j->text)) != 0) goto out;
        if (dst) add_logprobs(j, u, i, dst);
    }
    const char *rel;
    size_t rel_len;
    *hit = fe_stop_feed(&j->stop, j->text.p ? j->text.p : "", j->text.n, &rel, &rel_len);
    rv = emit(j, rel, rel_len, lp, NULL);
out:
    json_decref(lp);
    return rv;
}

/* finish_text flushes the decoder and the stop matcher and sends the last round. */
static int finish_text(struct fe_job *j, const char *finish)
{
    const char *rel = "";
    size_t rel_len = 0;
    j->text.n = 0;
    tok_stream_flush(&j->ts, &j->text);
    if (fe_stop_feed(&j->stop, j->text.p ? j->text.p : "", j->text.n, &rel, &rel_len))
        finish = "stop";
    else {
        /* released text of this feed and the held tail go out together */
        struct tok_buf all = {0};
        const char *tail;
        size_t tail_len;
        buf_add(&all, rel, rel_len);
        fe_stop_flush(&j->stop, &tail, &tail_len);
        buf_add(&all, tail, tail_len);
        int rv = emit(j, all.p ? all.p : "", all.n, NULL, finish);
        free(all.p);
        return rv;
    }
    return emit(j, rel, rel_len, NULL, finish);
}

/* whole_calls parses a whole answer's content for calls into j->tp: true when j->tp's content
 * takes the place of the answer's (it had calls, or it is gpt-oss's final channel). */
static bool whole_calls(struct fe_job *j)
{
    return j->tools_on &&
           tools_parse(j->tfam, j->p.tools, j->content.p ? j->content.p : "", j->content.n, j->id,
                       &j->tp) == 0 &&
           (j->tp.n_calls || j->tfam == TOOLS_HARMONY);
}

/* whole_choice is j's choice of a whole chat or completion answer. */
static json_t *whole_choice(struct fe_job *j, const char *finish)
{
    json_t *lpj =
        j->lp ? (j->p.kind == API_CHAT ? json_pack("{s:O}", "content", j->lp) : json_incref(j->lp))
              : json_null();
    if (j->p.kind == API_CHAT) {
        json_t *msg = json_pack("{s:s, s:s%}", "role", "assistant", "content",
                                j->content.p ? j->content.p : "", j->content.n);
        if (whole_calls(j)) {
            json_object_set_new(msg, "content",
                                j->tp.content_len || !j->tp.n_calls
                                    ? json_stringn(j->tp.content, j->tp.content_len)
                                    : json_null());
            if (j->tp.n_calls) {
                json_object_set_new(msg, "tool_calls", calls_json(&j->tp, false));
                finish = "tool_calls";
            }
        }
        if (j->reasoning.n)
            json_object_set_new(msg, "reasoning_content",
                                json_stringn(j->reasoning.p, j->reasoning.n));
        return json_pack("{s:i, s:o, s:o, s:s}", "index", (int)j->index, "message", msg, "logprobs",
                         lpj, "finish_reason", finish);
    }
    return json_pack("{s:i, s:s%, s:o, s:s}", "index", (int)j->index, "text",
                     j->content.p ? j->content.p : "", j->content.n, "logprobs", lpj,
                     "finish_reason", finish);
}

/* whole_object wraps the choices into the answer object. */
static json_t *whole_object(const struct fe_job *j, json_t *choices, json_t *usage, json_t *timings)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:o}", "id", j->resp_id, "object",
                     j->p.kind == API_CHAT ? "chat.completion" : "text_completion", "created",
                     (json_int_t)j->created, "model", model_name(j), "choices", choices, "usage",
                     usage, "timings", timings);
}

static json_t *whole_answer(struct fe_job *j, const char *finish)
{
    if (j->p.kind == API_MESSAGES || j->p.kind == API_RESPONSES) {
        const bool parsed = whole_calls(j);
        struct api_answer a = answer(j, finish);
        if (parsed) { /* the text around the calls */
            a.content = j->tp.content;
            a.content_len = j->tp.content_len;
        }
        return j->p.kind == API_MESSAGES ? api_anthropic_message(&a) : api_responses_object(&a);
    }
    return whole_object(j, json_pack("[o]", whole_choice(j, finish)), usage(j), timings(j));
}

static void job_free(struct fe_job *j)
{
    api_params_free(&j->p);
    fe_stop_fini(&j->stop);
    if (j->split || j->hreason) {
        tmpl_reason_finish(&j->rs, &j->ro);
        tmpl_reason_out_free(&j->ro);
    }
    free(j->text.p);
    free(j->content.p);
    free(j->reasoning.p);
    json_decref(j->lp);
    free(j->req_ids);
    api_responses_stream_fini(&j->rsp);
    api_sse_free(&j->ev);
    free(j->tcontent.p);
    tools_parsed_free(&j->tp);
    free(j);
}

/* job_release stops counting j against --max-active: called before the last bytes go out, so a
 * client that sends its next request the moment it has the answer finds the slot free. */
static void job_release(struct fe_job *j)
{
    pthread_mutex_lock(&j->f->mu);
    if (j->admitted) j->f->n_admitted--;
    j->admitted = false;
    pthread_mutex_unlock(&j->f->mu);
}

/* job_unlink removes j from f's list and wakes fe_stop. */
static void job_unlink(struct fe_job *j)
{
    struct fe *f = j->f;
    job_release(j);
    pthread_mutex_lock(&f->mu);
    for (struct fe_job **pp = &f->jobs; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    f->n_jobs--;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

void fe_jobs_cancel(struct fe *f)
{
    for (struct fe_job *j = f->jobs; j; j = j->next)
        atomic_store(&j->cancel, true);
}

static void on_gone(void *ctx)
{
    struct fe_job *j = ctx;
    atomic_store(&j->gone, true);
}

static void on_gone_group(void *ctx)
{
    struct fe_group *g = ctx;
    atomic_store(&g->gone, true);
}

/* job_gone: the client left (j's own flag, or its group's). */
static bool job_gone(struct fe_job *j)
{
    return atomic_load(&j->gone) || (j->g && atomic_load(&j->g->gone));
}

/* begin_stream starts j's SSE answer: 200, then the role (first, as OpenAI sends it). */
static int begin_stream(struct fe_job *j)
{
    /* a group's stream is begun by choice 0, which the others start after */
    if (!j->g || j->index == 0) {
        if (http_stream_begin(j->r, 200, "text/event-stream", j->g ? on_gone_group : on_gone,
                              j->g ? (void *)j->g : j) != 0)
            return STRATA_ENOMEM;
        if (j->g) j->g->began = true;
    }
    /* Messages and Responses open with the first update, which brings the cached-token count */
    if (j->p.kind == API_CHAT)
        sse(j,
            chunk(j, json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", (int)j->index, "delta",
                               "role", "assistant", "content", "", "logprobs", "finish_reason")));
    return 0;
}

/* wait_pick submits j's request once a worker is ready again, polling every 100 ms for at most
 * the frontend's worker_wait_ms; it gives up early when the client leaves or the frontend stops.
 * On success the stream has begun (streamed requests). Otherwise e holds the answer to give. */
static int wait_pick(struct fe_job *j, struct api_error *e)
{
    struct fe *f = j->f;
    double end = now_s() + f->o.worker_wait_ms / 1000.0;
    int rv;
    for (;;) {
        rv = fe_pick_stream(f, &j->req, &j->ops, &j->stream, &j->slot);
        if (rv != STRATA_ESTATE || now_s() >= end || job_gone(j) || atomic_load(&j->cancel)) break;
        nanosleep(&(struct timespec){0, 100 * 1000000}, NULL);
    }
    free(j->req_ids);
    j->req_ids = NULL;
    if (rv == 0 && j->p.stream && begin_stream(j) != 0) {
        j->ops->stream_cancel(j->stream);
        j->ops->stream_free(j->stream);
        fe_release(f, j->slot);
        rv = STRATA_ENOMEM;
    }
    if (rv == 0) return 0;
    if (rv == STRATA_ESTATE)
        api_fail(e, 503, "unavailable_error", NULL, "no_worker",
                 "no worker became ready within %d ms: start strata-worker or wait for it to "
                 "come back",
                 f->o.worker_wait_ms);
    else if (rv == STRATA_EBUSY)
        api_fail(e, 429, "rate_limit_error", NULL, "busy",
                 "every worker's queue is full: retry after a second");
    else
        api_fail(e, 503, "unavailable_error", NULL, "worker_error",
                 "submitting to the worker failed: %s: %s", strata_strerror(rv),
                 strata_errdetail());
    return rv;
}

static void group_free(struct fe_group *g)
{
    if (!g) return;
    json_decref(g->choices);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void group_prefilled(struct fe_group *g)
{
    pthread_mutex_lock(&g->mu);
    g->prefilled = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* group_wait holds a later choice until choice 0 has a token; false when the request is over
 * already (an error, a cancel, the client gone): the choice then submits nothing. */
static bool group_wait(struct fe_job *j)
{
    struct fe_group *g = j->g;
    pthread_mutex_lock(&g->mu);
    while (!g->prefilled && !job_gone(j) && !atomic_load(&j->cancel)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    bool go = !g->err.status && !g->cancelled && !job_gone(j) && !atomic_load(&j->cancel);
    pthread_mutex_unlock(&g->mu);
    return go;
}

/* group_end ends choice j of its group: its last chunk (streamed) or its choice object, then, for
 * the choice that ends last, the request's answer. finish NULL or "cancelled": no answer. */
static void group_end(struct fe_job *j, struct api_error *e, const char *finish)
{
    struct fe_group *g = j->g;
    struct fe *f = j->f;
    bool cancelled = !e->status && (!finish || strcmp(finish, "cancelled") == 0);
    json_t *choice = NULL;
    if (j->p.stream && g->began) {
        if (e->status) {
            char *s = api_error_json(e);
            json_t *o = s ? json_loads(s, 0, NULL) : NULL;
            free(s);
            sse(j, o);
        } else if (!cancelled) {
            finish_text(j, finish);
        }
    } else if (!e->status && !cancelled && !job_gone(j)) {
        if (finish_text(j, finish) != 0 || !(choice = whole_choice(j, finish)))
            api_fail(e, 500, "server_error", NULL, NULL, "frontend: %s", strata_errdetail());
        else
            json_object_set_new(choice, "timings", timings(j));
    }
    pthread_mutex_lock(&g->mu);
    g->n_gen += j->n_gen;
    if (j->index == 0) {
        g->last0 = j->last;
        g->n_gen0 = j->n_gen;
        g->n_cached = j->last.n_cached;
        g->prefilled = true; /* the others may go (or see the error and end) */
        pthread_cond_broadcast(&g->cv);
    }
    if (e->status && !g->err.status) g->err = *e;
    if (cancelled) g->cancelled = true;
    if (choice) json_array_set_new(g->choices, j->index, choice);
    bool last = --g->left == 0;
    pthread_mutex_unlock(&g->mu);
    if (!last) return;
    struct http_req *r = j->r;
    http_set_tokens(r, j->n_prompt, g->n_gen);
    if (j->p.stream && g->began) {
        if (g->err.status) atomic_fetch_add(&f->m_errors, 1);
        if (!g->err.status && !g->cancelled && j->p.include_usage)
            sse(j, json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", j->resp_id, "object",
                             j->p.kind == API_CHAT ? "chat.completion.chunk" : "text_completion",
                             "created", (json_int_t)j->created, "model", model_name(j), "choices",
                             "usage", api_usage_json(j->n_prompt, g->n_cached, g->n_gen)));
        http_stream_write(r, "data: [DONE]\n\n", 14);
        http_stream_end(r);
    } else if (g->err.status) {
        fe_reply_error(f, r, &g->err);
    } else if (atomic_load(&g->gone)) {
        api_fail(e, 499, "invalid_request_error", NULL, "client_closed",
                 "the client closed the connection before the answer");
        fe_reply_error(f, r, e);
    } else if (g->cancelled) {
        api_fail(e, 503, "unavailable_error", NULL, NULL,
                 "the frontend is shutting down: retry on another frontend");
        fe_reply_error(f, r, e);
    } else {
        /* the request's timings are choice 0's; each choice has its own */
        json_t *o = whole_object(j, json_incref(g->choices),
                                 api_usage_json(j->n_prompt, g->n_cached, g->n_gen),
                                 api_timings_json(&g->last0, g->n_gen0));
        char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(8)) : NULL;
        json_decref(o);
        if (s)
            http_respond(r, 200, NULL, s, strlen(s), NULL);
        else {
            api_fail(e, 500, "server_error", NULL, NULL, "frontend: out of memory");
            fe_reply_error(f, r, e);
        }
        free(s);
    }
    group_free(g);
}

static void *job_main(void *arg)
{
    struct fe_job *j = arg;
    struct fe *f = j->f;
    const char *finish = NULL;
    struct api_error e = {0};
    int rv = 0;
    double away = -1; /* when the stream's worker failed, until a poll succeeds again */
    if (j->g && j->index > 0 && !group_wait(j)) {
        job_release(j);
        group_end(j, &e, NULL);
        job_unlink(j);
        job_free(j);
        return NULL;
    }
    if (j->wait_pick && wait_pick(j, &e) != 0) {
        job_release(j);
        if (j->g)
            group_end(j, &e, NULL);
        else
            fe_reply_error_as(f, j->r, j->p.kind, &e);
        job_unlink(j);
        job_free(j);
        return NULL;
    }
    atomic_fetch_add(&f->m_gen_requests, 1);
    atomic_fetch_add(&f->m_prompt_tokens, j->n_prompt);
    while (!finish) {
        if (job_gone(j) || atomic_load(&j->cancel)) {
            j->ops->stream_cancel(j->stream);
            if (job_gone(j)) atomic_fetch_add(&f->m_disconnects, 1);
            finish = "cancelled";
            break;
        }
        const struct wclient_update *u;
        if ((rv = j->ops->stream_next(j->stream, &u)) != 0 &&
            (rv == STRATA_ENOENT || fe_worker_gone(rv))) {
            /* the worker is down or lost the request: the stream moves on (to the same worker
             * when it lost it and no other is ready); the client sees nothing of it */
            if (away < 0) away = now_s();
            int mv = fe_move_stream(f, j->ops, j->stream, &j->slot, rv);
            if (mv == 0 || now_s() - away < FE_AWAY_S) {
                if (mv != 0) nanosleep(&(struct timespec){0, 100 * 1000000}, NULL);
                continue;
            }
            LOG_WARN("frontend: request %s: no worker took it over in %.0f s: %s", j->id, FE_AWAY_S,
                     strata_strerror(mv));
        }
        if (rv != 0) {
            api_fail(&e, rv == STRATA_ENOENT || fe_worker_gone(rv) ? 503 : 500, "server_error",
                     NULL, "worker_error", "the worker stopped answering mid-request: %s: %s",
                     strata_strerror(rv), strata_errdetail());
            break;
        }
        away = -1;
        j->last = *u;
        if (j->g && j->index == 0 && (u->n_tokens || u->finish)) group_prefilled(j->g);
        bool hit = false;
        if ((rv = take(j, u, &hit)) != 0) {
            if (rv == STRATA_ECLOSED) {
                atomic_store(&j->gone, true);
                continue;
            }
            api_fail(&e, 500, "server_error", NULL, NULL, "frontend: %s: %s", strata_strerror(rv),
                     strata_errdetail());
            break;
        }
        if (hit) {
            j->ops->stream_cancel(j->stream);
            finish = "stop";
        } else if (u->finish == WCLIENT_STOP || u->finish == WCLIENT_CANCELLED) {
            finish = "stop";
        } else if (u->finish == WCLIENT_LENGTH) {
            finish = "length";
        } else if (u->finish == WCLIENT_ERROR) {
            api_fail(&e, 500, "server_error", NULL, "worker_error",
                     "the worker failed the request: %s", strata_strerror(u->error_code));
            break;
        }
    }
    atomic_fetch_add(&f->m_gen_tokens, j->n_gen);
    atomic_fetch_add(&f->m_cached_tokens, j->last.n_cached);
    atomic_fetch_add(&f->m_prefill_us, (unsigned long long)(j->last.prefill_ms * 1000));
    atomic_fetch_add(&f->m_decode_us, (unsigned long long)(j->last.decode_ms * 1000));
    if (j->ttft >= 0) {
        atomic_fetch_add(&f->m_ttft_us, (unsigned long long)(j->ttft * 1e6));
        atomic_fetch_add(&f->m_ttft_n, 1);
    }
    j->ops->stream_free(j->stream);
    fe_release(f, j->slot);
    job_release(j);
    if (j->g) {
        group_end(j, &e, finish);
        job_unlink(j);
        job_free(j);
        return NULL;
    }
    http_set_tokens(j->r, j->n_prompt, j->n_gen);
    if (j->p.stream) {
        bool openai = j->p.kind == API_CHAT || j->p.kind == API_COMPLETION;
        if (e.status && !openai) {
            atomic_fetch_add(&f->m_errors, 1);
            send_events(j, j->p.kind == API_MESSAGES
                               ? api_anthropic_error_event(&e, &j->ev)
                               : api_responses_error_event(&j->rsp, &e, &j->ev));
        } else if (e.status) {
            atomic_fetch_add(&f->m_errors, 1);
            char *s = api_error_json(&e);
            json_t *o = s ? json_loads(s, 0, NULL) : NULL;
            free(s);
            sse(j, o);
        } else if (strcmp(finish, "cancelled") != 0 && finish_text(j, finish) == 0 &&
                   j->p.include_usage && openai) {
            json_t *c = json_pack(
                "{s:s, s:s, s:I, s:s, s:[], s:o}", "id", j->resp_id, "object",
                j->p.kind == API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                (json_int_t)j->created, "model", model_name(j), "choices", "usage", usage(j));
            sse(j, c);
        }
        if (openai) http_stream_write(j->r, "data: [DONE]\n\n", 14);
        http_stream_end(j->r);
    } else if (!e.status && job_gone(j)) {
        /* nobody reads this: it ends the request (nginx's 499 in the log line) */
        api_fail(&e, 499, "invalid_request_error", NULL, "client_closed",
                 "the client closed the connection before the answer");
        fe_reply_error_as(f, j->r, j->p.kind, &e);
    } else if (e.status || strcmp(finish, "cancelled") == 0) {
        if (!e.status)
            api_fail(&e, 503, "unavailable_error", NULL, NULL,
                     "the frontend is shutting down: retry on another frontend");
        fe_reply_error_as(f, j->r, j->p.kind, &e);
    } else if ((rv = finish_text(j, finish)) != 0) {
        api_fail(&e, 500, "server_error", NULL, NULL, "frontend: %s", strata_errdetail());
        fe_reply_error_as(f, j->r, j->p.kind, &e);
    } else {
        json_t *o = whole_answer(j, finish);
        char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(8)) : NULL;
        json_decref(o);
        if (s) {
            http_respond(j->r, 200, NULL, s, strlen(s), NULL);
        } else {
            api_fail(&e, 500, "server_error", NULL, NULL, "frontend: out of memory");
            fe_reply_error_as(f, j->r, j->p.kind, &e);
        }
        free(s);
    }
    job_unlink(j);
    job_free(j);
    return NULL;
}

/* tools_setup: with tools (and tool_choice other than "none") the answer is parsed for calls in
 * the template's syntax; "required" or a named function forces a call by a grammar, "auto" (or
 * none given) holds a call to the grammar once the model begins one (a lazy grammar). */
static unsigned tools_setup(struct fe *f, struct fe_job *j, struct api_error *e)
{
    const char *choice = json_string_value(j->p.tool_choice);
    if (!j->p.tools || (choice && !strcmp(choice, "none"))) return 0;
    const struct fe_model *m = &f->model;
    j->tools_on = true;
    j->tfam = tools_detect(m->tmpl, m->bos_text, m->eos_text);
    const bool lazy = !j->p.tool_choice || (choice && !strcmp(choice, "auto"));
    if (lazy && j->p.grammar) return 0; /* the request's own grammar or response_format holds */
    const char *only = choice ? NULL
                              : json_string_value(json_object_get(
                                    json_object_get(j->p.tool_choice, "function"), "name"));
    char *gbnf;
    int rv =
        tools_grammar(j->tfam, j->p.tools, only, j->p.parallel_tool_calls, lazy, m->tok, &gbnf);
    if (rv == STRATA_ENOMEM) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (rv && lazy) { /* a schema past the grammar's reach: calls are parsed, not held */
        LOG_DEBUG("frontend: tool calls without a grammar: %s", strata_errdetail());
        return 0;
    }
    if (rv)
        return api_fail(e, 400, "invalid_request_error", "tools", "invalid_schema",
                        "the forced tool call cannot be expressed as a grammar: %s",
                        strata_errdetail());
    free(j->p.grammar);
    j->p.grammar = gbnf;
    j->tlazy = lazy;
    return 0;
}

/* prompt_ids builds the request's prompt; an error is a 400 (or 500) in e. */
static unsigned prompt_ids(struct fe *f, struct fe_job *j, struct tok_ids *ids, bool *opens,
                           struct api_error *e)
{
    const struct fe_model *m = &f->model;
    int rv;
    *opens = false;
    if (api_is_chat(j->p.kind)) {
        /* the tools go to the template as its `tools` variable, beside the client's kwargs */
        json_t *kw = j->tools_on ? json_copy((json_t *)j->p.template_kwargs) : NULL;
        if (j->tools_on && !kw) kw = json_object();
        if (kw) json_object_set(kw, "tools", j->p.tools);
        rv = fe_model_chat(m, j->p.messages, kw ? kw : j->p.template_kwargs, j->p.reasoning_effort,
                           ids, opens);
        json_decref(kw);
        if (rv == STRATA_EINVAL || rv == STRATA_ELIMIT)
            return api_fail(e, 400, "invalid_request_error", "messages", "template_error",
                            "the chat template refused these messages: %s", strata_errdetail());
    } else if (j->p.prompt) {
        rv = tok_encode(m->tok, j->p.prompt, j->p.prompt_len, TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL,
                        ids);
    } else {
        rv = 0;
        for (size_t i = 0; i < j->p.n_prompt_ids && rv == 0; i++) {
            if (ids->n == ids->cap) {
                size_t cap = ids->cap ? ids->cap * 2 : 256;
                int32_t *v = realloc(ids->v, cap * sizeof *v);
                if (!v) {
                    rv = STRATA_ENOMEM;
                    break;
                }
                ids->v = v;
                ids->cap = cap;
            }
            ids->v[ids->n++] = j->p.prompt_ids[i];
        }
    }
    if (rv != 0)
        return api_fail(e, 500, "server_error", NULL, NULL, "building the prompt failed: %s: %s",
                        strata_strerror(rv), strata_errdetail());
    if (ids->n == 0)
        return api_fail(e, 400, "invalid_request_error",
                        api_is_chat(j->p.kind) ? "messages" : "prompt", "invalid_value",
                        "the prompt is empty after tokenization");
    if (ids->n >= m->n_ctx)
        return api_fail(e, 400, "invalid_request_error",
                        api_is_chat(j->p.kind) ? "messages" : "prompt", "context_length_exceeded",
                        "the prompt is %zu tokens and the context holds %u (prompt plus answer): "
                        "shorten the prompt",
                        ids->n, m->n_ctx);
    return 0;
}

/* job_setup readies j's text path: stop strings, reasoning split, detokenizer, logprobs. */
static int job_setup(struct fe_job *j, bool opens)
{
    const struct fe_model *m = &j->f->model;
    enum api_kind kind = j->p.kind;
    /* the request's stop strings, then, for a chat, the model's own end of turn (strata.stop) */
    const char *stops[FE_STOP_CAP];
    size_t n_stops = j->p.n_stop;
    memcpy(stops, j->p.stop, n_stops * sizeof *stops);
    /* (under a grammar the grammar says where the answer ends: a model's own stop text, such as
     * the demo's blank line, could cut a JSON answer in its whitespace; a lazy grammar's free
     * text keeps them) */
    for (uint32_t i = 0; api_is_chat(kind) && (!j->p.grammar || j->tlazy) && i < m->n_stop_strs;
         i++)
        stops[n_stops++] = m->stop_strs[i];
    if (fe_stop_init(&j->stop, stops, n_stops) != 0) return STRATA_ENOMEM;
    /* a grammar holds the answer from its first token (no think tags, no channel headers): there
     * is no reasoning to split out, and a prompt that opens one must not take the answer; a lazy
     * grammar (tool_choice auto) holds only a call, after the text */
    j->split = api_is_chat(kind) && m->reason != TMPL_REASON_NONE && (!j->p.grammar || j->tlazy) &&
               !(j->tools_on && j->tfam == TOOLS_HARMONY); /* its calls are in the headers */
    j->hreason = api_is_chat(kind) && m->reason == TMPL_REASON_CHANNEL && j->tools_on &&
                 j->tfam == TOOLS_HARMONY && (!j->p.grammar || j->tlazy);
    if (j->split || j->hreason) tmpl_reason_init(&j->rs, m->reason, opens);
    /* the calls of some families start with a control token ([TOOL_CALLS]) */
    const bool special_calls =
        j->tools_on && (j->tfam == TOOLS_MISTRAL || j->tfam == TOOLS_MISTRAL_V3 ||
                        j->tfam == TOOLS_DEEPSEEK || j->tfam == TOOLS_HARMONY);
    tok_stream_init(
        &j->ts, m->tok,
        (m->reason == TMPL_REASON_CHANNEL && j->split) || special_calls ? TOK_DECODE_SPECIAL : 0);
    if (!j->p.stream) j->lp = new_logprobs(j);
    return 0;
}

/* clone_choice makes choice i of j0's group: the same body parsed again, its own worker request
 * (its own id; with a seed, seed + i so that the choices differ), submitted by its thread once
 * choice 0 has a token. Not yet linked or started. */
static struct fe_job *clone_choice(struct fe_job *j0, uint32_t i, const struct wclient_req *req,
                                   bool opens)
{
    struct fe *f = j0->f;
    size_t len;
    const char *body = http_body(j0->r, &len);
    struct api_error e;
    struct fe_job *c = calloc(1, sizeof *c);
    int32_t *ids = malloc(req->n_prompt * sizeof *ids);
    if (!c || !ids) goto fail;
    c->f = f;
    c->r = j0->r;
    c->g = j0->g;
    c->index = i;
    c->ttft = -1;
    if (api_parse(j0->p.kind, body, len, f->model.n_vocab, &c->p, &e) != 0 ||
        tools_setup(f, c, &e) != 0 || job_setup(c, opens) != 0)
        goto fail;
    c->n_prompt = j0->n_prompt;
    c->created = j0->created;
    memcpy(c->resp_id, j0->resp_id, sizeof c->resp_id);
    fe_next_id(f, c->id, sizeof c->id);
    memcpy(ids, req->prompt, req->n_prompt * sizeof *ids);
    c->req = *req;
    c->req.id = c->id;
    c->req.prompt = ids;
    c->req_ids = ids;
    if (c->req.sampling.has_seed) c->req.sampling.seed += i;
    c->wait_pick = true;
    return c;
fail:
    free(ids);
    if (c) {
        c->req_ids = NULL;
        job_free(c);
    }
    return NULL;
}

/* start_thread runs job_main for j, detached. */
static int start_thread(struct fe_job *j)
{
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int rv = pthread_create(&t, &a, job_main, j);
    pthread_attr_destroy(&a);
    return rv;
}

void fe_job_http(struct fe *f, struct http_req *r, enum api_kind kind)
{
    const struct fe_model *m = &f->model;
    struct api_error e;
    struct tok_ids ids = {0};
    bool opens, linked = false;
    size_t len;
    const char *body = http_body(r, &len);
    struct fe_job *j = calloc(1, sizeof *j), *clones[API_MAX_N] = {NULL};
    uint32_t n = 1, reserved = 0;
    if (!j) {
        api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    j->f = f;
    j->r = r;
    j->ttft = -1;
    unsigned st = kind == API_MESSAGES    ? api_anthropic_parse(body, len, m->n_vocab, &j->p, &e)
                  : kind == API_RESPONSES ? api_responses_parse(body, len, m->n_vocab, &j->p, &e)
                                          : api_parse(kind, body, len, m->n_vocab, &j->p, &e);
    if (st != 0 || tools_setup(f, j, &e) != 0 || prompt_ids(f, j, &ids, &opens, &e) != 0) goto fail;
    j->n_prompt = (uint32_t)ids.n;
    n = j->p.n ? j->p.n : 1;
    uint32_t limit = f->o.max_tokens ? f->o.max_tokens : m->n_ctx;
    if (j->p.max_tokens > limit) {
        api_fail(&e, 400, "invalid_request_error",
                 json_object_get(j->p.root, "max_completion_tokens") ? "max_completion_tokens"
                                                                     : "max_tokens",
                 "invalid_value", "max_tokens is %lld: this server allows at most %u per request",
                 (long long)j->p.max_tokens, limit);
        goto fail;
    }
    uint32_t room = m->n_ctx - j->n_prompt;
    uint32_t max_tokens = j->p.max_tokens ? (uint32_t)j->p.max_tokens : limit;
    if (max_tokens > room) max_tokens = room;
    if (job_setup(j, opens) != 0) {
        api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    if (n > 1) {
        if (!(j->g = calloc(1, sizeof *j->g)) || !(j->g->choices = json_array())) {
            free(j->g);
            j->g = NULL;
            api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
            goto fail;
        }
        pthread_mutex_init(&j->g->mu, NULL);
        pthread_cond_init(&j->g->cv, NULL);
        j->g->left = n;
        for (uint32_t i = 0; i < n; i++)
            json_array_append_new(j->g->choices, json_null());
    }

    pthread_mutex_lock(&f->mu);
    if (atomic_load(&f->stopping)) {
        pthread_mutex_unlock(&f->mu);
        api_fail(&e, 503, "unavailable_error", NULL, NULL, "the frontend is shutting down");
        goto fail;
    }
    if ((uint32_t)f->n_admitted + n > f->o.max_active) {
        int busy = f->n_admitted;
        pthread_mutex_unlock(&f->mu);
        api_fail(&e, 429, "rate_limit_error", NULL, "busy",
                 "the server is busy: %d requests in flight (--max-active): retry after a second",
                 busy);
        goto fail;
    }
    f->n_jobs++;
    f->n_admitted += n; /* the later choices' admissions too: they take them over when linked */
    reserved = n - 1;
    j->admitted = true;
    j->next = f->jobs;
    f->jobs = j;
    linked = true;
    pthread_mutex_unlock(&f->mu);

    fe_next_id(f, j->id, sizeof j->id);
    static const char *const prefix[] = {[API_CHAT] = "chatcmpl-",
                                         [API_COMPLETION] = "cmpl-",
                                         [API_MESSAGES] = "msg_",
                                         [API_RESPONSES] = "resp_"};
    snprintf(j->resp_id, sizeof j->resp_id, "%s%s", prefix[kind], j->id);
    j->created = (long long)time(NULL);
    struct wclient_req req = {.id = j->id,
                              .prompt = ids.v,
                              .n_prompt = (uint32_t)ids.n,
                              .max_tokens = max_tokens,
                              .sampling = j->p.sampling,
                              .stop = m->stop_ids,
                              .n_stop = m->n_stop_ids,
                              .logprobs = j->p.logprobs,
                              .top_logprobs = j->p.top_logprobs,
                              .grammar = j->p.grammar};
    for (uint32_t i = 1; i < n; i++)
        if (!(clones[i] = clone_choice(j, i, &req, opens))) {
            api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
            goto fail;
        }
    j->t_submit = now_s();
    int rv = fe_pick_stream(f, &req, &j->ops, &j->stream, &j->slot);
    if (rv == STRATA_ESTATE && f->o.worker_wait_ms > 0) {
        /* every worker is away (one restarting): wait for one on the job's thread, where the
         * wait holds none of the HTTP threads */
        j->wait_pick = true;
        j->req = req;
        j->req_ids = ids.v;
        ids.v = NULL;
        rv = 0;
    } else if (rv == STRATA_ESTATE) {
        api_fail(&e, 503, "unavailable_error", NULL, "no_worker",
                 "no worker is ready to serve: start strata-worker or wait for it to come back");
        goto fail;
    } else if (rv == STRATA_EBUSY) {
        api_fail(&e, 429, "rate_limit_error", NULL, "busy",
                 "every worker's queue is full: retry after a second");
        goto fail;
    } else if (rv == STRATA_EINVAL && j->p.grammar) {
        api_fail(&e, 400, "invalid_request_error", "grammar", "invalid_grammar",
                 "the worker refused the grammar: %s", strata_errdetail());
        goto fail;
    } else if (rv == STRATA_ELIMIT) {
        api_fail(&e, 400, "invalid_request_error", api_is_chat(kind) ? "messages" : "prompt",
                 "context_length_exceeded", "the worker refused the request: %s",
                 strata_errdetail());
        goto fail;
    } else if (rv != 0) {
        api_fail(&e, 503, "unavailable_error", NULL, "worker_error",
                 "submitting to the worker failed: %s: %s", strata_strerror(rv),
                 strata_errdetail());
        goto fail;
    }
    free(ids.v);
    ids.v = NULL;
    if (!j->p.stream || j->wait_pick) {
        /* a client that leaves cancels the request, as a stream's */
        if (j->g)
            http_on_gone(r, on_gone_group, j->g);
        else
            http_on_gone(r, on_gone, j);
    } else if (begin_stream(j) != 0) {
        api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail_stream;
    }
    /* the later choices are counted and listed before any thread runs: the last to end frees the
     * group */
    pthread_mutex_lock(&f->mu);
    reserved = 0;
    for (uint32_t i = 1; i < n; i++) {
        f->n_jobs++;
        clones[i]->admitted = true;
        clones[i]->next = f->jobs;
        f->jobs = clones[i];
    }
    pthread_mutex_unlock(&f->mu);
    for (uint32_t i = 0; i < n; i++) {
        struct fe_job *c = i ? clones[i] : j;
        if ((rv = start_thread(c)) == 0) continue;
        LOG_ERROR("frontend: cannot start a generation thread: %s", strerror(rv));
        if (i > 0 || j->g) {
            /* the group answers once its other choices end; this one ends with an error */
            if (!c->wait_pick) {
                c->ops->stream_cancel(c->stream);
                c->ops->stream_free(c->stream);
                fe_release(f, c->slot);
            }
            api_fail(&e, 503, "unavailable_error", NULL, NULL, "out of threads: retry later");
            job_release(c);
            group_end(c, &e, NULL);
            job_unlink(c);
            job_free(c);
            continue;
        }
        if (!j->wait_pick) {
            j->ops->stream_cancel(j->stream);
            j->ops->stream_free(j->stream);
            fe_release(f, j->slot);
        }
        if (j->p.stream && !j->wait_pick) {
            http_stream_end(r);
            job_unlink(j);
            job_free(j);
            return;
        }
        api_fail(&e, 503, "unavailable_error", NULL, NULL, "out of threads: retry later");
        goto fail;
    }
    return;
fail_stream:
    j->ops->stream_cancel(j->stream);
    j->ops->stream_free(j->stream);
    fe_release(f, j->slot);
fail:
    free(ids.v);
    if (reserved) {
        pthread_mutex_lock(&f->mu);
        f->n_admitted -= (int)reserved;
        pthread_mutex_unlock(&f->mu);
    }
    fe_reply_error_as(f, r, kind, &e);
    for (uint32_t i = 1; i < n; i++)
        if (clones[i]) job_free(clones[i]);
    if (j) {
        group_free(j->g);
        if (linked) job_unlink(j);
        job_free(j);
    }
}
