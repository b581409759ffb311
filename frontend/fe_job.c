/* fe_job — one completion request: prompt, submit, then a thread that polls the worker and turns
 * tokens into text (stop strings, reasoning split, logprobs) as SSE chunks or one final body. */
#include "frontend/fe_int.h"

#include "common/base/err.h"
#include "common/base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct fe_job {
    struct fe *f;
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
    bool split; /* reasoning markup is split out */
    struct tmpl_reason_stream rs;
    struct tmpl_reason_out ro;
    struct tok_buf content, reasoning; /* a whole answer (not streamed) */
    json_t *lp;      /* logprobs: chat content entries, or the completion's four arrays */
    uint32_t n_gen;  /* tokens received */
    size_t emitted;  /* bytes of answer text released so far (the completion text_offset) */
    double t_submit; /* monotonic seconds */
    double ttft;     /* seconds to the first token, -1 before it */
    struct wclient_update last; /* timings of the last update */
    /* no worker was ready at submit (one restarting): the job thread submits req when one is */
    bool wait_pick;
    struct wclient_req req;
    int32_t *req_ids; /* req's prompt (owned) */
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
    if (j->p.kind == API_CHAT) {
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
    if (j->p.kind == API_CHAT) return json_array();
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

static json_t *usage(const struct fe_job *j)
{
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)j->n_prompt,
                     "completion_tokens", (json_int_t)j->n_gen, "total_tokens",
                     (json_int_t)(j->n_prompt + j->n_gen));
}

/* timings in llama-server's shape, from the worker's figures (the CLI and loadtest read them) */
static json_t *timings(const struct fe_job *j)
{
    const struct wclient_update *u = &j->last;
    uint32_t pn = u->n_prompt > u->n_cached ? u->n_prompt - u->n_cached : 0;
    json_t *t = json_pack(
        "{s:I, s:I, s:f, s:f, s:I, s:f, s:f, s:f}", "prompt_n", (json_int_t)pn, "cache_n",
        (json_int_t)u->n_cached, "prompt_ms", u->prefill_ms, "prompt_per_second",
        u->prefill_ms > 0 ? pn * 1000.0 / u->prefill_ms : 0.0, "predicted_n", (json_int_t)j->n_gen,
        "predicted_ms", u->decode_ms, "predicted_per_second",
        u->decode_ms > 0 ? j->n_gen * 1000.0 / u->decode_ms : 0.0, "queue_ms", u->queue_ms);
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

/* emit sends (stream) or keeps (whole answer) the text released this round, split into content
 * and reasoning, with the round's logprobs. finish is NULL until the last round. */
static int emit(struct fe_job *j, const char *text, size_t n, json_t *lp, const char *finish)
{
    const char *content = text, *reasoning = "";
    size_t cn = n, rn = 0;
    int rv = 0;
    if (j->split) {
        j->ro.content_len = j->ro.reasoning_len = 0;
        if ((rv = tmpl_reason_feed(&j->rs, text, n, &j->ro)) != 0 ||
            (finish && (rv = tmpl_reason_finish(&j->rs, &j->ro)) != 0))
            goto out;
        content = j->ro.content ? j->ro.content : "";
        cn = j->ro.content_len;
        reasoning = j->ro.reasoning ? j->ro.reasoning : "";
        rn = j->ro.reasoning_len;
    }
    j->emitted += cn;
    if (!j->p.stream) {
        if ((rv = buf_add(&j->content, content, cn)) == 0)
            rv = buf_add(&j->reasoning, reasoning, rn);
        if (lp && j->p.kind == API_CHAT) json_array_extend(j->lp, lp);
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
        choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", 0, "delta", delta, "logprobs", lpj,
                           "finish_reason", finish);
    } else {
        choice = json_pack("{s:i, s:s%, s:o, s:s?}", "index", 0, "text", content, cn, "logprobs",
                           lpj, "finish_reason", finish);
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

static json_t *whole_answer(struct fe_job *j, const char *finish)
{
    json_t *lpj =
        j->lp ? (j->p.kind == API_CHAT ? json_pack("{s:O}", "content", j->lp) : json_incref(j->lp))
              : json_null();
    json_t *choice;
    if (j->p.kind == API_CHAT) {
        json_t *msg = json_pack("{s:s, s:s%}", "role", "assistant", "content",
                                j->content.p ? j->content.p : "", j->content.n);
        if (j->split && j->reasoning.n)
            json_object_set_new(msg, "reasoning_content",
                                json_stringn(j->reasoning.p, j->reasoning.n));
        choice = json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "message", msg, "logprobs", lpj,
                           "finish_reason", finish);
    } else {
        choice =
            json_pack("{s:i, s:s%, s:o, s:s}", "index", 0, "text", j->content.p ? j->content.p : "",
                      j->content.n, "logprobs", lpj, "finish_reason", finish);
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o, s:o}", "id", j->resp_id, "object",
                     j->p.kind == API_CHAT ? "chat.completion" : "text_completion", "created",
                     (json_int_t)j->created, "model", model_name(j), "choices", choice, "usage",
                     usage(j), "timings", timings(j));
}

static void job_free(struct fe_job *j)
{
    api_params_free(&j->p);
    fe_stop_fini(&j->stop);
    if (j->split) {
        tmpl_reason_finish(&j->rs, &j->ro);
        tmpl_reason_out_free(&j->ro);
    }
    free(j->text.p);
    free(j->content.p);
    free(j->reasoning.p);
    json_decref(j->lp);
    free(j->req_ids);
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

/* begin_stream starts j's SSE answer: 200, then the role (first, as OpenAI sends it). */
static int begin_stream(struct fe_job *j)
{
    if (http_stream_begin(j->r, 200, "text/event-stream", on_gone, j) != 0) return STRATA_ENOMEM;
    if (j->p.kind == API_CHAT)
        sse(j, chunk(j, json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", 0, "delta", "role",
                                  "assistant", "content", "", "logprobs", "finish_reason")));
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
        if (rv != STRATA_ESTATE || now_s() >= end || atomic_load(&j->gone) ||
            atomic_load(&j->cancel))
            break;
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

static void *job_main(void *arg)
{
    struct fe_job *j = arg;
    struct fe *f = j->f;
    const char *finish = NULL;
    struct api_error e = {0};
    int rv = 0;
    double away = -1; /* when the stream's worker failed, until a poll succeeds again */
    if (j->wait_pick && wait_pick(j, &e) != 0) {
        fe_reply_error(f, j->r, &e);
        job_unlink(j);
        job_free(j);
        return NULL;
    }
    atomic_fetch_add(&f->m_gen_requests, 1);
    atomic_fetch_add(&f->m_prompt_tokens, j->n_prompt);
    while (!finish) {
        if (atomic_load(&j->gone) || atomic_load(&j->cancel)) {
            j->ops->stream_cancel(j->stream);
            if (atomic_load(&j->gone)) atomic_fetch_add(&f->m_disconnects, 1);
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
    http_set_tokens(j->r, j->n_prompt, j->n_gen);
    if (j->p.stream) {
        if (e.status) {
            atomic_fetch_add(&f->m_errors, 1);
            char *s = api_error_json(&e);
            json_t *o = s ? json_loads(s, 0, NULL) : NULL;
            free(s);
            sse(j, o);
        } else if (strcmp(finish, "cancelled") != 0 && finish_text(j, finish) == 0 &&
                   j->p.include_usage) {
            json_t *c = json_pack(
                "{s:s, s:s, s:I, s:s, s:[], s:o}", "id", j->resp_id, "object",
                j->p.kind == API_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                (json_int_t)j->created, "model", model_name(j), "choices", "usage", usage(j));
            sse(j, c);
        }
        http_stream_write(j->r, "data: [DONE]\n\n", 14);
        http_stream_end(j->r);
    } else if (!e.status && atomic_load(&j->gone)) {
        /* nobody reads this: it ends the request (nginx's 499 in the log line) */
        api_fail(&e, 499, "invalid_request_error", NULL, "client_closed",
                 "the client closed the connection before the answer");
        fe_reply_error(f, j->r, &e);
    } else if (e.status || strcmp(finish, "cancelled") == 0) {
        if (!e.status)
            api_fail(&e, 503, "unavailable_error", NULL, NULL,
                     "the frontend is shutting down: retry on another frontend");
        fe_reply_error(f, j->r, &e);
    } else if ((rv = finish_text(j, finish)) != 0) {
        api_fail(&e, 500, "server_error", NULL, NULL, "frontend: %s", strata_errdetail());
        fe_reply_error(f, j->r, &e);
    } else {
        json_t *o = whole_answer(j, finish);
        char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(8)) : NULL;
        json_decref(o);
        if (s) {
            http_respond(j->r, 200, NULL, s, strlen(s), NULL);
        } else {
            api_fail(&e, 500, "server_error", NULL, NULL, "frontend: out of memory");
            fe_reply_error(f, j->r, &e);
        }
        free(s);
    }
    job_unlink(j);
    job_free(j);
    return NULL;
}

/* prompt_ids builds the request's prompt; an error is a 400 (or 500) in e. */
static unsigned prompt_ids(struct fe *f, struct fe_job *j, struct tok_ids *ids, bool *opens,
                           struct api_error *e)
{
    const struct fe_model *m = &f->model;
    int rv;
    *opens = false;
    if (j->p.kind == API_CHAT) {
        rv = fe_model_chat(m, j->p.messages, j->p.template_kwargs, j->p.reasoning_effort, ids,
                           opens);
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
                        j->p.kind == API_CHAT ? "messages" : "prompt", "invalid_value",
                        "the prompt is empty after tokenization");
    if (ids->n >= m->n_ctx)
        return api_fail(e, 400, "invalid_request_error",
                        j->p.kind == API_CHAT ? "messages" : "prompt", "context_length_exceeded",
                        "the prompt is %zu tokens and the context holds %u (prompt plus answer): "
                        "shorten the prompt",
                        ids->n, m->n_ctx);
    return 0;
}

void fe_job_http(struct fe *f, struct http_req *r, enum api_kind kind)
{
    const struct fe_model *m = &f->model;
    struct api_error e;
    struct tok_ids ids = {0};
    bool opens, linked = false;
    size_t len;
    const char *body = http_body(r, &len);
    struct fe_job *j = calloc(1, sizeof *j);
    if (!j) {
        api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    j->f = f;
    j->r = r;
    j->ttft = -1;
    if (api_parse(kind, body, len, m->n_vocab, &j->p, &e) != 0 ||
        prompt_ids(f, j, &ids, &opens, &e) != 0)
        goto fail;
    j->n_prompt = (uint32_t)ids.n;
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
    /* the request's stop strings, then, for a chat, the model's own end of turn (strata.stop) */
    const char *stops[FE_STOP_CAP];
    size_t n_stops = j->p.n_stop;
    memcpy(stops, j->p.stop, n_stops * sizeof *stops);
    for (uint32_t i = 0; kind == API_CHAT && i < m->n_stop_strs; i++)
        stops[n_stops++] = m->stop_strs[i];
    if (fe_stop_init(&j->stop, stops, n_stops) != 0) {
        api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    j->split = kind == API_CHAT && m->reason != TMPL_REASON_NONE;
    if (j->split) tmpl_reason_init(&j->rs, m->reason, opens);
    tok_stream_init(&j->ts, m->tok,
                    m->reason == TMPL_REASON_CHANNEL && j->split ? TOK_DECODE_SPECIAL : 0);
    if (!j->p.stream) j->lp = new_logprobs(j);

    pthread_mutex_lock(&f->mu);
    if (atomic_load(&f->stopping)) {
        pthread_mutex_unlock(&f->mu);
        api_fail(&e, 503, "unavailable_error", NULL, NULL, "the frontend is shutting down");
        goto fail;
    }
    if ((uint32_t)f->n_admitted >= f->o.max_active) {
        int n = f->n_admitted;
        pthread_mutex_unlock(&f->mu);
        api_fail(&e, 429, "rate_limit_error", NULL, "busy",
                 "the server is busy: %d requests in flight (--max-active): retry after a second",
                 n);
        goto fail;
    }
    f->n_jobs++;
    f->n_admitted++;
    j->admitted = true;
    j->next = f->jobs;
    f->jobs = j;
    linked = true;
    pthread_mutex_unlock(&f->mu);

    fe_next_id(f, j->id, sizeof j->id);
    snprintf(j->resp_id, sizeof j->resp_id, "%s-%s", kind == API_CHAT ? "chatcmpl" : "cmpl", j->id);
    j->created = (long long)time(NULL);
    struct wclient_req req = {.id = j->id,
                              .prompt = ids.v,
                              .n_prompt = (uint32_t)ids.n,
                              .max_tokens = max_tokens,
                              .sampling = j->p.sampling,
                              .stop = m->stop_ids,
                              .n_stop = m->n_stop_ids,
                              .logprobs = j->p.logprobs,
                              .top_logprobs = j->p.top_logprobs};
    j->t_submit = now_s();
    int rv = fe_pick_stream(f, &req, &j->ops, &j->stream, &j->slot);
    if (rv == STRATA_ESTATE && f->o.worker_wait_ms > 0) {
        /* every worker is away (one restarting): wait for one on the job's thread, where the
         * wait holds none of the HTTP threads */
        j->wait_pick = true;
        j->req = req;
        j->req_ids = ids.v;
        ids.v = NULL;
        http_on_gone(r, on_gone, j);
        rv = 0;
    } else if (rv == STRATA_ESTATE) {
        api_fail(&e, 503, "unavailable_error", NULL, "no_worker",
                 "no worker is ready to serve: start strata-worker or wait for it to come back");
        goto fail;
    } else if (rv == STRATA_EBUSY) {
        api_fail(&e, 429, "rate_limit_error", NULL, "busy",
                 "every worker's queue is full: retry after a second");
        goto fail;
    } else if (rv == STRATA_ELIMIT) {
        api_fail(&e, 400, "invalid_request_error", kind == API_CHAT ? "messages" : "prompt",
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
        http_on_gone(r, on_gone, j); /* a client that leaves cancels the request, as a stream's */
    } else if (begin_stream(j) != 0) {
        api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail_stream;
    }
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    rv = pthread_create(&t, &a, job_main, j);
    pthread_attr_destroy(&a);
    if (rv != 0) {
        LOG_ERROR("frontend: cannot start a generation thread: %s", strerror(rv));
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
    fe_reply_error(f, r, &e);
    if (j) {
        if (linked) job_unlink(j);
        job_free(j);
    }
}
