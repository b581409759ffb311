/* fe — the frontend's server: workers and their monitor, routing, the small endpoints, metrics. */
#include "frontend/fe_int.h"
#include "frontend/fe_status.h"
#include "frontend/fe_web.h"

#include "frontend/api_anthropic.h"

#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/base/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int fe_init(const struct fe_opts *o, struct fe **out)
{
    struct fe *f = calloc(1, sizeof *f);
    if (!f) return strata_errf(STRATA_ENOMEM, "frontend");
    f->o = *o;
    if (!f->o.max_active) f->o.max_active = 64;
    if (!f->o.monitor_ms) f->o.monitor_ms = 1000;
    if (f->o.failover_ms <= 0) f->o.failover_ms = 1500;
    if (f->o.worker_wait_ms == 0) f->o.worker_wait_ms = 10000;
    pthread_mutex_init(&f->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&f->cv, &ca);
    pthread_condattr_destroy(&ca);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    f->started_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* ids must stay unique on a worker across frontends and frontend restarts: pid + start time */
    snprintf(f->id_prefix, sizeof f->id_prefix, "fe%x-%llx", (unsigned)getpid(),
             (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
    *out = f;
    return 0;
}

/* worker_add fills the next slot, then counts it (the router reads the count under f->mu). */
static int worker_add(struct fe *f, const struct fe_backend *ops, void *w, const char *name,
                      bool discovered)
{
    int n = atomic_load(&f->n_workers);
    if (n == FE_MAX_WORKERS)
        return strata_errf(STRATA_ELIMIT, "worker %s: at most %d workers per frontend", name,
                           FE_MAX_WORKERS);
    struct fe_worker *wk = &f->workers[n];
    wk->ops = ops;
    wk->h = w;
    wk->discovered = discovered;
    snprintf(wk->name, sizeof wk->name, "%s", name);
    pthread_mutex_lock(&f->mu);
    atomic_store(&f->n_workers, n + 1);
    pthread_mutex_unlock(&f->mu);
    return 0;
}

int fe_worker_add(struct fe *f, const struct fe_backend *ops, void *w, const char *name)
{
    return worker_add(f, ops, w, name, false);
}

/* discover makes the discovered workers those the discovery lists now (fe_discovery_set). Dropped
 * workers keep their slot and handle: a job's stream may still use it, and a worker that comes
 * back (a restart takes the same socket) gets it again. */
static int discover(struct fe *f, int *found)
{
    int n = 0, nw = atomic_load(&f->n_workers);
    int rv = f->disc.list(f->disc.ctx, f->disc_urls, FE_MAX_WORKERS, &n);
    if (rv != 0) return rv;
    bool known[FE_MAX_WORKERS] = {false};
    for (int i = 0; i < nw; i++) {
        struct fe_worker *wk = &f->workers[i];
        bool listed = false;
        for (int k = 0; k < n && !listed; k++)
            if (strcmp(f->disc_urls[k], wk->name) == 0) listed = known[k] = true;
        if (!wk->discovered || listed == !wk->dropped) continue;
        pthread_mutex_lock(&f->mu);
        wk->dropped = !listed;
        if (!listed) atomic_store(&wk->ready, false);
        wk->refused = false; /* a worker back under this URL is another process: check it again */
        pthread_mutex_unlock(&f->mu);
        if (listed)
            LOG_INFO("frontend: worker %s is registered again", wk->name);
        else
            LOG_WARN("frontend: worker %s left the registry: no new request goes to it", wk->name);
    }
    for (int k = 0; k < n; k++) {
        const struct fe_backend *ops;
        void *h;
        if (known[k]) continue;
        if (atomic_load(&f->n_workers) == FE_MAX_WORKERS) {
            if (!f->disc_full)
                LOG_WARN("frontend: worker %s is not used: this frontend has its %d workers "
                         "already; restart it to forget the gone ones",
                         f->disc_urls[k], FE_MAX_WORKERS);
            f->disc_full = true;
            continue;
        }
        if ((rv = f->disc.open(f->disc.ctx, f->disc_urls[k], &ops, &h)) != 0) {
            LOG_WARN("frontend: cannot open worker %s: %s: %s", f->disc_urls[k],
                     strata_strerror(rv), strata_errdetail());
            continue;
        }
        worker_add(f, ops, h, f->disc_urls[k], true);
        LOG_INFO("frontend: worker %s is registered: using it", f->disc_urls[k]);
    }
    if (found) *found = n;
    return 0;
}

int fe_discovery_set(struct fe *f, const struct fe_discovery *d, int *n)
{
    f->disc = *d;
    return discover(f, n);
}

/* build_model fetches the metadata from wk and builds the model (monitor thread, once). */
static int build_model(struct fe *f, struct fe_worker *wk, const struct wclient_hello *h)
{
    struct wclient_meta meta = {0};
    int rv = wk->ops->meta(wk->h, &meta);
    if (rv == 0)
        rv = fe_model_init(&f->model, meta.gguf, meta.n_ctx ? meta.n_ctx : h->n_ctx,
                           f->o.chat_template, wk->name);
    wk->ops->meta_free(&meta);
    pthread_mutex_lock(&f->mu);
    if (rv == 0) {
        f->fingerprint = h->fingerprint;
        atomic_store(&f->model_ok, true);
        LOG_INFO("frontend: model %s from %s: %u tokens of context, vocabulary %u", f->model.name,
                 wk->name, f->model.n_ctx, f->model.n_vocab);
    } else {
        f->model_err = rv;
        snprintf(f->model_err_detail, sizeof f->model_err_detail, "%s", strata_errdetail());
        LOG_ERROR("frontend: cannot build the model from %s's metadata: %s: %s", wk->name,
                  strata_strerror(rv), strata_errdetail());
    }
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return rv;
}

static void check_worker(struct fe *f, struct fe_worker *wk)
{
    struct wclient_hello h;
    struct wclient_status st;
    if (wk->refused || wk->dropped) return;
    int rv = wk->ops->hello(wk->h, &h);
    if (rv != 0) {
        if (!wk->was_down || atomic_load(&wk->ready))
            LOG_WARN("frontend: worker %s does not answer: %s: %s (retrying every %d ms)", wk->name,
                     strata_strerror(rv), strata_errdetail(), f->o.monitor_ms);
        wk->was_down = true;
        atomic_store(&wk->ready, false);
        return;
    }
    if (wk->was_down) LOG_INFO("frontend: worker %s answers", wk->name);
    wk->was_down = false;
    if (!atomic_load(&f->model_ok) && build_model(f, wk, &h) != 0) return;
    if (h.fingerprint != f->fingerprint) {
        wk->refused = true;
        atomic_store(&wk->ready, false);
        LOG_ERROR("frontend: worker %s serves another model (fingerprint %016llx, %s) than the "
                  "first worker (%016llx): not using it; start it on the same model file",
                  wk->name, (unsigned long long)h.fingerprint, h.model,
                  (unsigned long long)f->fingerprint);
        return;
    }
    rv = wk->ops->status(wk->h, &st);
    fe_status_watch(f, wk);
    pthread_mutex_lock(&f->mu);
    wk->hello = h;
    wk->has_hello = true;
    if (rv == 0) {
        wk->st = st;
        wk->has_status = true;
    }
    atomic_store(&wk->ready, true);
    atomic_store(&f->ready, true);
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static void *monitor_main(void *arg)
{
    struct fe *f = arg;
    pthread_mutex_lock(&f->mu);
    while (!atomic_load(&f->stopping)) {
        pthread_mutex_unlock(&f->mu);
        bool any = false;
        int rv = f->disc.list ? discover(f, NULL) : 0;
        if (rv != 0)
            LOG_DEBUG("frontend: worker discovery: %s: %s", strata_strerror(rv),
                      strata_errdetail());
        for (int i = 0; i < atomic_load(&f->n_workers); i++) {
            check_worker(f, &f->workers[i]);
            any |= atomic_load(&f->workers[i].ready);
        }
        atomic_store(&f->ready, any && atomic_load(&f->model_ok));
        pthread_mutex_lock(&f->mu);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long ns = ts.tv_nsec + (long)(f->o.monitor_ms % 1000) * 1000000L;
        ts.tv_sec += f->o.monitor_ms / 1000 + ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        if (!atomic_load(&f->stopping)) pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

int fe_wait_ready(struct fe *f, int timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long ns = ts.tv_nsec + (long)(timeout_ms % 1000) * 1000000L;
    ts.tv_sec += timeout_ms / 1000 + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    int rv = 0;
    pthread_mutex_lock(&f->mu);
    while (!atomic_load(&f->ready) && !f->model_err && rv != ETIMEDOUT)
        rv = pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    if (atomic_load(&f->ready))
        rv = 0;
    else if (f->model_err)
        rv = strata_errf(f->model_err, "%s", f->model_err_detail);
    else
        rv = strata_errf(STRATA_ETIMEDOUT, "no worker answered within %d ms", timeout_ms);
    pthread_mutex_unlock(&f->mu);
    return rv;
}

const struct fe_model *fe_model_of(const struct fe *f)
{
    return atomic_load(&f->model_ok) ? &f->model : NULL;
}

void fe_next_id(struct fe *f, char *buf, size_t n)
{
    snprintf(buf, n, "%s-%llu", f->id_prefix, (unsigned long long)atomic_fetch_add(&f->next_id, 1));
}

bool fe_worker_gone(int rv)
{
    return rv == STRATA_EBUSY || rv == STRATA_ETIMEDOUT || rv == STRATA_ECLOSED ||
           (rv & STRATA_ENNGERR) != 0;
}

/* worker_failed takes wk out of routing after a failed call (not for a full queue: the worker
 * answers); the monitor's next hello puts it back if it answers. */
static void worker_failed(struct fe_worker *wk, int rv)
{
    if (rv != STRATA_EBUSY && atomic_exchange(&wk->ready, false))
        LOG_WARN("frontend: worker %s failed a call: %s: routing around it until it answers",
                 wk->name, strata_strerror(rv));
}

/* same_kind: a and b compute alike (backend and KV type, as their hellos said), so a stream of one
 * can go on on the other: another KV type or backend gives other logits, and a bit-exact or
 * greedy answer would change mid-stream. */
static bool same_kind(const struct fe_worker *a, const struct fe_worker *b)
{
    return a->has_hello && b->has_hello && strcmp(a->hello.backend, b->hello.backend) == 0 &&
           strcmp(a->hello.kv_type, b->hello.kv_type) == 0;
}

/* pick returns the untried ready worker of backend ops (NULL: any) and, when like is given, of
 * like's kind (same_kind), with the shortest queue (ours in flight plus what it last reported
 * waiting), or -1. */
static int pick(struct fe *f, const struct fe_backend *ops, const struct fe_worker *like,
                const bool *tried)
{
    int best = -1;
    long best_q = 0;
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < atomic_load(&f->n_workers); i++) {
        struct fe_worker *wk = &f->workers[i];
        if (tried[i] || !atomic_load(&wk->ready) || (ops && wk->ops != ops)) continue;
        if (like && !same_kind(like, wk)) continue;
        long q = atomic_load(&wk->inflight) + (wk->has_status ? (long)wk->st.queued : 0);
        if (best < 0 || q < best_q) {
            best = i;
            best_q = q;
        }
    }
    pthread_mutex_unlock(&f->mu);
    return best;
}

int fe_pick_stream(struct fe *f, const struct wclient_req *r, const struct fe_backend **ops,
                   void **stream, int *slot)
{
    bool tried[FE_MAX_WORKERS] = {0};
    int rv = strata_errf(STRATA_ESTATE, "no worker is ready"), best;
    while ((best = pick(f, NULL, NULL, tried)) >= 0) {
        struct fe_worker *wk = &f->workers[best];
        tried[best] = true;
        atomic_fetch_add(&wk->inflight, 1);
        rv = wk->ops->stream_start(wk->h, r, stream);
        if (rv == 0) {
            atomic_fetch_add(&wk->requests, 1);
            *ops = wk->ops;
            *slot = best;
            return 0;
        }
        atomic_fetch_sub(&wk->inflight, 1);
        if (!fe_worker_gone(rv)) return rv;
        worker_failed(wk, rv);
        LOG_DEBUG("frontend: worker %s refused %s: %s", wk->name, r->id, strata_strerror(rv));
    }
    return rv;
}

int fe_move_stream(struct fe *f, const struct fe_backend *ops, void *stream, int *slot, int why)
{
    struct fe_worker *old = &f->workers[*slot];
    bool tried[FE_MAX_WORKERS] = {false}, lost = why == STRATA_ENOENT;
    int rv = strata_errf(STRATA_ESTATE, "no other worker of the same backend and KV type is ready"),
        best;
    if (!lost) worker_failed(old, why);
    tried[*slot] = true;
    while ((best = pick(f, ops, old, tried)) >= 0) {
        struct fe_worker *wk = &f->workers[best];
        tried[best] = true;
        atomic_fetch_add(&wk->inflight, 1);
        if ((rv = ops->stream_move(stream, wk->h)) == 0) {
            atomic_fetch_add(&wk->requests, 1);
            atomic_fetch_sub(&old->inflight, 1);
            atomic_fetch_add(&f->m_moves, 1);
            LOG_INFO("frontend: worker %s %s a stream: it continues on worker %s", old->name,
                     lost ? "lost" : "stopped answering on", wk->name);
            *slot = best;
            return 0;
        }
        atomic_fetch_sub(&wk->inflight, 1);
        if (fe_worker_gone(rv)) worker_failed(wk, rv);
        LOG_WARN("frontend: moving a stream from worker %s to %s failed: %s: %s", old->name,
                 wk->name, strata_strerror(rv), strata_errdetail());
    }
    /* a worker that answered "unknown request" is up (it restarted): resume the stream there */
    if (lost && (rv = ops->stream_move(stream, old->h)) == 0)
        LOG_INFO("frontend: worker %s lost a stream and no other worker is ready: resumed there",
                 old->name);
    return rv;
}

void fe_release(struct fe *f, int slot)
{
    atomic_fetch_sub(&f->workers[slot].inflight, 1);
}

void fe_reply_error(struct fe *f, struct http_req *r, const struct api_error *e)
{
    fe_reply_error_as(f, r, API_CHAT, e);
}

void fe_reply_error_as(struct fe *f, struct http_req *r, enum api_kind kind,
                       const struct api_error *e)
{
    atomic_fetch_add(&f->m_errors, 1);
    if (e->status == 429) atomic_fetch_add(&f->m_busy, 1);
    char *body = api_error_json_as(kind, e);
    static const char *const retry[] = {"Retry-After", "1", NULL};
    http_respond(r, e->status, NULL, body ? body : "{}", body ? strlen(body) : 2,
                 e->status == 429 || e->status == 503 ? retry : NULL);
    free(body);
}

static void reply_json(struct http_req *r, unsigned status, json_t *o)
{
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                              "\"param\":null,\"code\":null}}";
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(8)) : NULL;
    if (s)
        http_respond(r, status, NULL, s, strlen(s), NULL);
    else
        http_respond(r, 500, NULL, oom, sizeof oom - 1, NULL);
    free(s);
    json_decref(o);
}

static bool is(const char *path, const char *a, const char *b)
{
    return strcmp(path, a) == 0 || (b && strcmp(path, b) == 0);
}

/* kind_of: the API whose error shape a path's answers take. */
static enum api_kind kind_of(const char *path)
{
    if (is(path, "/v1/messages", "/v1/messages/count_tokens")) return API_MESSAGES;
    if (is(path, "/v1/responses", "/responses")) return API_RESPONSES;
    return API_CHAT;
}

/* not_ready answers 503: no worker has answered yet (or the model could not be built). */
static void not_ready(struct fe *f, struct http_req *r)
{
    struct api_error e;
    api_fail(&e, 503, "unavailable_error", NULL, "model_loading",
             "no worker is ready yet (%d configured): start strata-worker, or wait for it to "
             "load the model",
             atomic_load(&f->n_workers));
    fe_reply_error_as(f, r, kind_of(http_path(r)), &e);
}

/* model_json is the served model as /v1/models lists it: llama-server's meta, vLLM's
 * max_model_len; in Anthropic's shape for a client that sends anthropic-version. */
static json_t *model_json(const struct fe *f, const char *name, bool anthropic)
{
    if (anthropic)
        return json_pack("{s:s, s:s, s:s, s:s}", "type", "model", "id", name, "display_name", name,
                         "created_at", "1970-01-01T00:00:00Z");
    return json_pack("{s:s, s:s, s:I, s:s, s:I, s:{s:I, s:I, s:I}}", "id", name, "object", "model",
                     "created", (json_int_t)0, "owned_by", "strata", "max_model_len",
                     (json_int_t)f->model.n_ctx, "meta", "n_ctx", (json_int_t)f->model.n_ctx,
                     "n_ctx_train", (json_int_t)f->model.n_ctx_train, "n_vocab",
                     (json_int_t)f->model.n_vocab);
}

/* do_models answers GET /v1/models (the one model) and GET /v1/models/ID (it, when ID names it;
 * else 404). */
static void do_models(struct fe *f, struct http_req *r, const char *id)
{
    const char *name = f->o.model_alias ? f->o.model_alias : f->model.name;
    bool anthropic = http_header(r, "anthropic-version") != NULL;
    if (id && strcmp(id, name) != 0) {
        struct api_error e;
        api_fail(&e, 404, "invalid_request_error", "model", "model_not_found",
                 "no model '%s': this server serves '%s'", id, name);
        return fe_reply_error_as(f, r, anthropic ? API_MESSAGES : API_CHAT, &e);
    }
    if (id) return reply_json(r, 200, model_json(f, name, anthropic));
    if (anthropic)
        return reply_json(r, 200,
                          json_pack("{s:[o], s:b, s:s, s:s}", "data", model_json(f, name, true),
                                    "has_more", 0, "first_id", name, "last_id", name));
    reply_json(r, 200,
               json_pack("{s:s, s:[o]}", "object", "list", "data", model_json(f, name, false)));
}

/* do_props answers llama-server's GET /props: the context, the slots (requests the ready workers
 * decode at once), the chat template and its special tokens. */
static void do_props(struct fe *f, struct http_req *r)
{
    const struct fe_model *m = &f->model;
    json_int_t slots = 0;
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < atomic_load(&f->n_workers); i++)
        if (atomic_load(&f->workers[i].ready) && f->workers[i].has_status)
            slots += f->workers[i].st.max_seqs;
    pthread_mutex_unlock(&f->mu);
    const char *name = f->o.model_alias ? f->o.model_alias : m->name;
    json_t *params =
        json_pack("{s:I, s:f, s:i, s:f, s:f, s:f, s:f, s:f, s:b}", "n_predict",
                  (json_int_t)(f->o.max_tokens ? f->o.max_tokens : m->n_ctx), "temperature", 1.0,
                  "top_k", 0, "top_p", 1.0, "min_p", 0.0, "repeat_penalty", 1.0, "presence_penalty",
                  0.0, "frequency_penalty", 0.0, "stream", 0);
    reply_json(r, 200,
               json_pack("{s:{s:I, s:o, s:b}, s:I, s:s, s:s, s:o, s:s, s:s, s:{s:b, s:b}, s:s}",
                         "default_generation_settings", "n_ctx", (json_int_t)m->n_ctx, "params",
                         params, "is_processing", 0, "total_slots", slots, "model_path", name,
                         "model_alias", name, "chat_template",
                         api_str(m->tmpl_src, m->tmpl_src ? strlen(m->tmpl_src) : 0), "bos_token",
                         m->bos_text, "eos_token", m->eos_text, "modalities", "vision", 0, "audio",
                         0, "build_info", "strata " STRATA_VERSION));
}

/* template_kwargs: the request's chat_template_kwargs plus its tools as the template's `tools`
 * variable (unless tool_choice is "none"), as a generation renders them (a new reference). */
static json_t *template_kwargs(const struct api_params *p)
{
    const char *choice = json_string_value(p->tool_choice);
    json_t *kw = p->template_kwargs ? json_copy((json_t *)p->template_kwargs) : json_object();
    if (kw && p->tools && !(choice && strcmp(choice, "none") == 0))
        json_object_set(kw, "tools", p->tools);
    return kw;
}

/* do_apply_template answers llama-server's POST /apply-template: a chat body's messages rendered
 * with the chat template and the generation prompt, not tokenized. */
static void do_apply_template(struct fe *f, struct http_req *r)
{
    size_t len;
    const char *body = http_body(r, &len);
    struct api_params p;
    struct api_error e;
    char *text = NULL;
    size_t n = 0;
    if (api_parse(API_CHAT, body, len, f->model.n_vocab, &p, &e) != 0) goto fail;
    json_t *kw = template_kwargs(&p);
    int rv = fe_model_render(&f->model, p.messages, kw, p.reasoning_effort, &text, &n);
    json_decref(kw);
    if (rv != 0) {
        api_fail(&e, rv == STRATA_ENOMEM ? 500 : 400,
                 rv == STRATA_ENOMEM ? "server_error" : "invalid_request_error", "messages",
                 "template_error", "the chat template refused these messages: %s",
                 strata_errdetail());
        goto fail;
    }
    reply_json(r, 200, json_pack("{s:o}", "prompt", api_str(text, n)));
    free(text);
    api_params_free(&p);
    return;
fail:
    free(text);
    api_params_free(&p);
    fe_reply_error(f, r, &e);
}

/* do_count_tokens answers Anthropic's POST /v1/messages/count_tokens: the prompt's token count
 * as a Messages request would render it. */
static void do_count_tokens(struct fe *f, struct http_req *r)
{
    size_t len;
    const char *body = http_body(r, &len);
    struct api_params p;
    struct api_error e;
    struct tok_ids ids = {0};
    bool opens;
    if (api_anthropic_parse(body, len, f->model.n_vocab, &p, &e) != 0) goto fail;
    json_t *kw = template_kwargs(&p);
    int rv = fe_model_chat(&f->model, p.messages, kw, p.reasoning_effort, &ids, &opens);
    json_decref(kw);
    if (rv != 0) {
        api_fail(&e, rv == STRATA_ENOMEM ? 500 : 400,
                 rv == STRATA_ENOMEM ? "server_error" : "invalid_request_error", "messages",
                 "template_error", "the chat template refused these messages: %s",
                 strata_errdetail());
        goto fail;
    }
    reply_json(r, 200, json_pack("{s:I}", "input_tokens", (json_int_t)ids.n));
    free(ids.v);
    api_params_free(&p);
    return;
fail:
    free(ids.v);
    api_params_free(&p);
    fe_reply_error_as(f, r, API_MESSAGES, &e);
}

static void do_tokenize(struct fe *f, struct http_req *r)
{
    size_t len;
    const char *body = http_body(r, &len);
    struct api_tokenize t;
    struct api_error e;
    struct tok_ids ids = {0};
    struct tok_buf piece = {0};
    json_t *arr = NULL;
    if (api_parse_tokenize(body, len, &t, &e) != 0) goto fail;
    unsigned flags =
        (t.add_special ? TOK_ADD_SPECIAL : 0) | (t.parse_special ? TOK_PARSE_SPECIAL : 0);
    if (tok_encode(f->model.tok, t.content, t.content_len, flags, &ids) != 0) {
        api_fail(&e, 500, "server_error", NULL, NULL, "tokenizer failed: %s", strata_errdetail());
        goto fail;
    }
    arr = json_array();
    for (size_t i = 0; arr && i < ids.n; i++) {
        if (!t.with_pieces) {
            json_array_append_new(arr, json_integer(ids.v[i]));
            continue;
        }
        piece.n = 0;
        tok_piece(f->model.tok, ids.v[i], TOK_DECODE_SPECIAL, &piece);
        json_t *ps = json_stringn(piece.p ? piece.p : "", piece.n);
        if (!ps) { /* a piece that is part of a UTF-8 sequence: llama-server sends its bytes */
            ps = json_array();
            for (size_t k = 0; k < piece.n; k++)
                json_array_append_new(ps, json_integer((unsigned char)piece.p[k]));
        }
        json_array_append_new(arr,
                              json_pack("{s:I, s:o}", "id", (json_int_t)ids.v[i], "piece", ps));
    }
    free(ids.v);
    free(piece.p);
    json_decref(t.root);
    reply_json(r, 200, arr ? json_pack("{s:o}", "tokens", arr) : NULL);
    return;
fail:
    free(ids.v);
    json_decref(t.root);
    fe_reply_error(f, r, &e);
}

static void do_detokenize(struct fe *f, struct http_req *r)
{
    size_t len, n;
    const char *body = http_body(r, &len);
    int32_t *ids;
    struct api_error e;
    struct tok_buf out = {0};
    if (api_parse_detokenize(body, len, f->model.n_vocab, &ids, &n, &e) != 0) {
        fe_reply_error(f, r, &e);
        return;
    }
    /* tok_stream makes the text valid UTF-8 (JSON strings must be) */
    struct tok_stream ts;
    tok_stream_init(&ts, f->model.tok, TOK_DECODE_SPECIAL);
    for (size_t i = 0; i < n; i++)
        tok_stream_feed(&ts, ids[i], &out);
    tok_stream_flush(&ts, &out);
    free(ids);
    reply_json(r, 200, json_pack("{s:s%}", "content", out.p ? out.p : "", out.n));
    free(out.p);
}

/* metrics_add appends printf output to a growing buffer. */
static void mprintf(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (*buf && *len + (size_t)n < *cap) {
            *len += (size_t)n;
            return;
        }
        size_t c = *cap ? *cap * 2 : 8192;
        while (c < *len + (size_t)n + 1)
            c *= 2;
        char *p = realloc(*buf, c);
        if (!p) return;
        *buf = p;
        *cap = c;
    }
}

static void do_metrics(struct fe *f, struct http_req *r)
{
    char *b = NULL;
    size_t n = 0, cap = 0;
    double prefill_s = atomic_load(&f->m_prefill_us) / 1e6,
           decode_s = atomic_load(&f->m_decode_us) / 1e6;
    unsigned long long pt = atomic_load(&f->m_prompt_tokens) - atomic_load(&f->m_cached_tokens),
                       gt = atomic_load(&f->m_gen_tokens);
#define COUNTER(name, help, v)                                                                     \
    mprintf(&b, &n, &cap, "# HELP " name " " help "\n# TYPE " name " counter\n" name " %llu\n",    \
            (unsigned long long)(v))
#define GAUGE(name, help, fmt, v)                                                                  \
    mprintf(&b, &n, &cap, "# HELP " name " " help "\n# TYPE " name " gauge\n" name " " fmt "\n", v)
    COUNTER("strata_requests_total", "HTTP requests received.", atomic_load(&f->m_requests));
    COUNTER("strata_request_errors_total", "HTTP requests answered with an error.",
            atomic_load(&f->m_errors));
    COUNTER("strata_requests_busy_total", "Requests refused with 429.", atomic_load(&f->m_busy));
    COUNTER("strata_generations_total", "Completions started.", atomic_load(&f->m_gen_requests));
    COUNTER("strata_disconnects_total", "Streams whose client left before the end.",
            atomic_load(&f->m_disconnects));
    COUNTER("strata_stream_moves_total", "Streams moved to another worker when theirs failed.",
            atomic_load(&f->m_moves));
    COUNTER("strata_prompt_tokens_total", "Prompt tokens submitted.",
            atomic_load(&f->m_prompt_tokens));
    COUNTER("strata_prompt_tokens_cached_total", "Prompt tokens served by a prefix cache.",
            atomic_load(&f->m_cached_tokens));
    COUNTER("strata_generated_tokens_total", "Tokens generated.", gt);
    pthread_mutex_lock(&f->mu);
    int jobs = f->n_jobs;
    pthread_mutex_unlock(&f->mu);
    GAUGE("strata_requests_active", "Generations in flight on this frontend.", "%d", jobs);
    GAUGE("strata_prefill_tokens_per_second", "Prompt tokens per second of prefill, all requests.",
          "%.3f", prefill_s > 0 ? pt / prefill_s : 0.0);
    GAUGE("strata_decode_tokens_per_second", "Generated tokens per second of decode, per request.",
          "%.3f", decode_s > 0 ? gt / decode_s : 0.0);
    GAUGE("strata_time_to_first_token_seconds", "Mean time to the first token.", "%.6f",
          atomic_load(&f->m_ttft_n) ? atomic_load(&f->m_ttft_us) / 1e6 / atomic_load(&f->m_ttft_n)
                                    : 0.0);
    static const char *const wnames[][2] = {
        {"strata_worker_up", "1 when the worker answers with this model."},
        {"strata_worker_inflight", "This frontend's generations on the worker."},
        {"strata_worker_running", "Requests the worker decodes."},
        {"strata_worker_queued", "Requests waiting in the worker's queue."},
        {"strata_worker_kv_blocks_used", "KV blocks in use."},
        {"strata_worker_kv_blocks_total", "KV blocks of the worker."},
        {"strata_worker_decode_tokens_per_second", "The worker's recent decode rate."},
        {"strata_worker_prefill_tokens_per_second", "The worker's recent prefill rate."},
        {"strata_worker_requests_total", "Generations this frontend routed to the worker."},
        {"strata_worker_expert_hits_total", "Routed (token, expert) pairs computed from slots."},
        {"strata_worker_expert_misses_total", "Routed pairs computed from the host tier."},
        {"strata_worker_experts_resident", "Experts in the worker's expert cache."},
        {"strata_worker_expert_swaps_total", "Experts the adaptive tier moved into the cache."},
        {"strata_worker_expert_copy_gibps", "GiB/s of the cache's copies while copying."},
        {"strata_worker_adapt_wait_seconds_per_window", "Mean wait of a window for the tier."},
        {"strata_worker_expert_swaps_per_window", "Mean experts the tier moved in a window."},
        {"strata_worker_drafts_total", "Speculative drafts the worker verified."},
        {"strata_worker_drafts_accepted_total", "Of them, drafts accepted."},
        {"strata_worker_draft_acceptance_ratio", "Drafts accepted over drafts verified."},
        {"strata_worker_drafts_accepted_per_window", "Mean drafts accepted a verify step."},
        {"strata_worker_tokens_per_decode_pass", "Mean tokens a decode step sampled."},
    };
    for (size_t k = 0; k < sizeof wnames / sizeof *wnames; k++) {
        mprintf(&b, &n, &cap, "# HELP %s %s\n# TYPE %s %s\n", wnames[k][0], wnames[k][1],
                wnames[k][0], strstr(wnames[k][0], "_total") ? "counter" : "gauge");
        pthread_mutex_lock(&f->mu);
        for (int i = 0; i < atomic_load(&f->n_workers); i++) {
            const struct fe_worker *w = &f->workers[i];
            if (w->dropped) continue;
            const struct wclient_status *s = &w->st;
            double v[] = {
                atomic_load(&w->ready),   atomic_load(&w->inflight), s->running, s->queued,
                s->kv_blocks_used,        s->kv_blocks_total,        s->tok_s,   s->prefill_tok_s,
                atomic_load(&w->requests), s->cache_hits, s->cache_misses, s->cache_resident,
                s->cache_swaps,           s->cache_copy_gibs,
                s->windows ? s->adapt_wait_s / (double)s->windows : 0.0,
                s->windows ? (double)s->cache_swaps / (double)s->windows : 0.0,
                s->drafts_proposed, s->drafts_accepted,
                s->drafts_proposed ? (double)s->drafts_accepted / s->drafts_proposed : 0.0,
                s->verify_passes ? (double)s->drafts_accepted / s->verify_passes : 0.0,
                s->decode_passes ? (double)s->decode_tokens / s->decode_passes : 0.0};
            mprintf(&b, &n, &cap, "%s{worker=\"%s\"} %.3f\n", wnames[k][0], w->name, v[k]);
        }
        pthread_mutex_unlock(&f->mu);
    }
#undef COUNTER
#undef GAUGE
    http_respond(r, 200, "text/plain; version=0.0.4", b ? b : "", n, NULL);
    free(b);
}

/* key_eq compares a client's key with ours in time that depends on our key's length only, so a
 * client cannot learn it byte by byte from how long a refusal takes. */
static bool key_eq(const char *got, const char *key)
{
    size_t n = strlen(key), m = strlen(got);
    unsigned char d = m != n;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(key[i] ^ (i < m ? got[i] : 0));
    return d == 0;
}

/* authorized checks the API key: "Authorization: Bearer KEY" (or the x-api-key header). */
static bool authorized(const struct fe *f, const struct http_req *r)
{
    if (!f->o.api_key) return true;
    const char *h = http_header(r, "Authorization");
    if (h && strncasecmp(h, "Bearer ", 7) == 0 && key_eq(h + 7, f->o.api_key)) return true;
    h = http_header(r, "x-api-key");
    return h && key_eq(h, f->o.api_key);
}

/* precheck refuses a request without the API key on its head, before its body is read (an
 * unauthenticated client must not make the frontend hold max_body bytes). /health needs no key. */
static unsigned precheck(const struct http_req *r, void *ctx, char *body, size_t cap)
{
    struct fe *f = ctx;
    /* the pages carry no data: they ask for the key and send it with their calls */
    if (is(http_path(r), "/health", "/v1/health") || authorized(f, r) ||
        ((strcmp(http_method(r), "GET") == 0 || strcmp(http_method(r), "HEAD") == 0) &&
         fe_web_find(http_path(r))))
        return 0;
    struct api_error e;
    api_fail(&e, 401, "authentication_error", NULL, "invalid_api_key",
             "missing or wrong API key: send the header 'Authorization: Bearer <key>' with "
             "the key the frontend was started with (--api-key, --api-key-file or "
             "$STRATA_API_KEY)");
    atomic_fetch_add(&f->m_requests, 1);
    atomic_fetch_add(&f->m_errors, 1);
    char *j = api_error_json_as(kind_of(http_path(r)), &e);
    snprintf(body, cap, "%s", j ? j : "{}");
    free(j);
    return e.status;
}

static void on_http(struct http_req *r, void *ctx)
{
    struct fe *f = ctx;
    const char *m = http_method(r), *p = http_path(r);
    bool get = strcmp(m, "GET") == 0, post = strcmp(m, "POST") == 0;
    struct api_error e;
    atomic_fetch_add(&f->m_requests, 1);
    if (is(p, "/health", "/v1/health") && get) {
        if (atomic_load(&f->stopping) || !atomic_load(&f->ready)) return not_ready(f, r);
        return reply_json(r, 200, json_pack("{s:s}", "status", "ok"));
    }
    if (is(p, "/metrics", NULL) && get) return do_metrics(f, r);
    if (is(p, "/status", "/v1/status") && get) return fe_status_http(f, r);
    if ((get || strcmp(m, "HEAD") == 0) && fe_web_http(r)) return;
    const char *model_id = strncmp(p, "/v1/models/", 11) == 0 && p[11] ? p + 11 : NULL;
    bool want_get = is(p, "/v1/models", "/models") || model_id || is(p, "/props", NULL);
    bool known = want_get || is(p, "/tokenize", NULL) || is(p, "/detokenize", NULL) ||
                 is(p, "/apply-template", NULL) ||
                 is(p, "/v1/chat/completions", "/chat/completions") ||
                 is(p, "/v1/completions", "/completions") || kind_of(p) != API_CHAT;
    if (!known) {
        api_fail(&e, 404, "invalid_request_error", NULL, "not_found",
                 "no endpoint %s %s: see docs/api.md for the endpoints strata serves", m, p);
        return fe_reply_error(f, r, &e);
    }
    if ((want_get && !get) || (!want_get && !post)) {
        api_fail(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                 "%s takes %s, not %s", p, want_get ? "GET" : "POST", m);
        return fe_reply_error_as(f, r, kind_of(p), &e);
    }
    if (atomic_load(&f->stopping) || !atomic_load(&f->model_ok)) return not_ready(f, r);
    if (is(p, "/props", NULL)) return do_props(f, r);
    if (want_get) return do_models(f, r, model_id);
    if (is(p, "/tokenize", NULL)) return do_tokenize(f, r);
    if (is(p, "/detokenize", NULL)) return do_detokenize(f, r);
    if (is(p, "/apply-template", NULL)) return do_apply_template(f, r);
    if (is(p, "/v1/messages/count_tokens", NULL)) return do_count_tokens(f, r);
    fe_job_http(f, r,
                is(p, "/v1/chat/completions", "/chat/completions") ? API_CHAT
                : is(p, "/v1/completions", "/completions")         ? API_COMPLETION
                                                                   : kind_of(p));
}

int fe_start(struct fe *f)
{
    struct http_opts ho = {.host = f->o.host,
                           .port = f->o.port,
                           .threads = f->o.threads,
                           .conn_limit = f->o.conn_limit,
                           .timeout_s = f->o.timeout_s,
                           .request_timeout_s = f->o.request_timeout_s,
                           .max_body = f->o.max_body};
    int rv = http_server_start(&ho, on_http, precheck, f, &f->http);
    if (rv != 0) return rv;
    if ((rv = pthread_create(&f->monitor, NULL, monitor_main, f)) != 0) {
        http_server_stop(f->http);
        f->http = NULL;
        return strata_errf(strata_errno(rv), "frontend: monitor thread");
    }
    f->monitor_on = true;
    return 0;
}

int fe_port(const struct fe *f)
{
    return f->http ? http_server_port(f->http) : 0;
}

void fe_stop(struct fe *f)
{
    if (f->stopped) return;
    f->stopped = true;
    atomic_store(&f->stopping, true);
    pthread_mutex_lock(&f->mu);
    fe_jobs_cancel(f);
    while (f->n_jobs > 0)
        pthread_cond_wait(&f->cv, &f->mu);
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    if (f->monitor_on) pthread_join(f->monitor, NULL);
    f->monitor_on = false;
    http_server_stop(f->http);
    f->http = NULL;
}

void fe_fini(struct fe *f)
{
    if (!f) return;
    fe_stop(f);
    for (int i = 0; i < atomic_load(&f->n_workers); i++) {
        f->workers[i].ops->close(f->workers[i].h);
        free(f->workers[i].heat.counts);
    }
    if (f->disc.fini) f->disc.fini(f->disc.ctx);
    fe_model_fini(&f->model);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
}
