#include "gpu-worker/service.h"

#include "common/base/err.h"
#include "common/ipc/ipc.h"
#include "common/base/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define RATE_SAMPLES   9 /* status rates span the last 8 sampling periods (4 s) */
#define RATE_PERIOD_MS 500

/* A parked poll: its call (holding one ipc context) and its decoded request, which lives in the
 * call's message until the call is answered. */
struct waiter {
    struct ipc_call *call;
    struct service_poll p;
    int64_t deadline_ns;
    struct waiter *next;
};

struct rate_sample {
    int64_t t_ns;
    uint64_t generated, prefilled;
};

struct service {
    struct service_opts o;
    char url[256];
    struct engine *e;
    struct ipc_server *srv;
    int64_t started_ns;
    _Atomic uint64_t requests; /* new requests accepted */
    _Atomic uint64_t monitor_ns; /* answering status, heat and vram: what a monitor costs */

    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;
    pthread_t thread;
    bool thread_live;
    bool stopping;
    bool woken; /* a window ran or a poll was parked since the thread last looked */
    struct waiter *waiters;
    struct rate_sample rate[RATE_SAMPLES]; /* ring, newest at rate_i */
    int rate_i, rate_n;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- decoding ----------------------------------------------------------------------------------
 */

static int opt(int rv)
{
    return rv == STRATA_ENOENT ? 0 : rv;
}

static int get_f32(struct msg *m, const char *key, double min, double max, float *out)
{
    double v;
    int rv = msg_get_f64(m, NULL, key, min, max, &v);
    if (rv == 0) *out = (float)v;
    return opt(rv);
}

static int get_u32(struct msg *m, const char *key, uint32_t min, uint32_t max, uint32_t *out)
{
    int64_t v;
    int rv = msg_get_i64(m, NULL, key, min, max, &v);
    if (rv == 0) *out = (uint32_t)v;
    return rv;
}

int service_parse_submit(struct msg *m, uint32_t n_vocab, uint32_t n_ctx,
                         struct service_submit *out)
{
    memset(out, 0, sizeof *out);
    struct engine_req *r = &out->req;
    size_t id_len;
    int rv;
    if (n_vocab == 0) return strata_errf(STRATA_EINVAL, "service: a model without a vocabulary");
    if ((rv = msg_get_str(m, NULL, "id", WCLIENT_ID_MAX, &r->id, &id_len)) != 0) return rv;
    if (id_len == 0)
        return strata_errf(STRATA_EPROTO, "field 'id': empty: give 1..%d bytes", WCLIENT_ID_MAX);
    /* the pre-check bounded the count by the message size; the limits are ours to answer */
    if ((rv = msg_get_i32s(m, NULL, "prompt", UINT32_MAX, 0, (int32_t)(n_vocab - 1), &r->prompt,
                           &r->n_prompt)) != 0)
        return rv;
    if (r->n_prompt == 0) return strata_errf(STRATA_EPROTO, "field 'prompt': empty");
    if (r->n_prompt >= n_ctx || r->n_prompt > WCLIENT_MAX_PROMPT)
        return strata_errf(STRATA_ELIMIT,
                           "field 'prompt': %u ids do not fit the context of %u positions with "
                           "room to generate: shorten the prompt",
                           r->n_prompt, n_ctx);
    if ((rv = get_u32(m, "max_tokens", 1, WCLIENT_MAX_TOKENS, &r->max_tokens)) != 0) return rv;
    sample_params_default(&r->sp);
    struct sample_params *sp = &r->sp;
    int64_t top_k = 0;
    if ((rv = get_f32(m, "temperature", 0, 1000, &sp->temperature)) != 0 ||
        (rv = opt(msg_get_i64(m, NULL, "top_k", 0, INT32_MAX, &top_k))) != 0 ||
        (rv = get_f32(m, "top_p", 0, 1, &sp->top_p)) != 0 ||
        (rv = get_f32(m, "min_p", 0, 1, &sp->min_p)) != 0 ||
        (rv = get_f32(m, "repeat_penalty", -100, 100, &sp->repeat_penalty)) != 0 ||
        (rv = get_f32(m, "presence_penalty", -100, 100, &sp->presence_penalty)) != 0 ||
        (rv = get_f32(m, "frequency_penalty", -100, 100, &sp->frequency_penalty)) != 0)
        return rv;
    sp->top_k = (uint32_t)top_k;
    rv = msg_get_u64(m, NULL, "seed", UINT64_MAX, &sp->seed);
    if (rv != 0 && rv != STRATA_ENOENT) return rv;
    out->has_seed = rv == 0;
    if ((rv = opt(msg_get_i32s(m, NULL, "stop", WCLIENT_MAX_STOP, 0, (int32_t)(n_vocab - 1),
                               &r->stop, &r->n_stop))) != 0)
        return rv;
    if ((rv = opt(get_u32(m, "n_generated", 0, r->n_prompt, &r->n_generated))) != 0 ||
        (rv = opt(msg_get_bool(m, NULL, "logprobs", &r->logprobs))) != 0 ||
        (rv = opt(get_u32(m, "top_logprobs", 0, WCLIENT_MAX_TOP, &r->n_top))) != 0)
        return rv;
    if (r->n_top) r->logprobs = true;
    if ((rv = opt(msg_get_str(m, NULL, "grammar", WCLIENT_MAX_GRAMMAR, &r->grammar, NULL))) != 0)
        return rv;
    return 0;
}

/* item_str reads array item it as a request id into m's zone. */
static int item_str(struct msg *m, const msgpack_object *it, uint32_t i, const char **out)
{
    if (it->type != MSGPACK_OBJECT_STR || it->via.str.size == 0 ||
        it->via.str.size > WCLIENT_ID_MAX)
        return strata_errf(STRATA_EPROTO, "field 'ids': item %u is not a string of 1..%d bytes", i,
                           WCLIENT_ID_MAX);
    char *s = msgpack_zone_malloc_no_align(&m->zone, it->via.str.size + 1);
    if (!s) return STRATA_ENOMEM;
    memcpy(s, it->via.str.ptr, it->via.str.size);
    s[it->via.str.size] = 0;
    *out = s;
    return 0;
}

int service_parse_ids(struct msg *m, const char **ids, uint32_t *n)
{
    const msgpack_object *it;
    int rv = msg_get_arr(m, NULL, "ids", UINT32_MAX, &it, n);
    if (rv != 0) return rv;
    if (*n == 0) return strata_errf(STRATA_EPROTO, "field 'ids': empty");
    if (*n > WCLIENT_POLL_MAX_IDS)
        return strata_errf(STRATA_ELIMIT, "field 'ids': %u ids, at most %d a call: split them", *n,
                           WCLIENT_POLL_MAX_IDS);
    for (uint32_t i = 0; i < *n; i++)
        if ((rv = item_str(m, &it[i], i, &ids[i])) != 0) return rv;
    return 0;
}

int service_parse_poll(struct msg *m, struct service_poll *out)
{
    memset(out, 0, sizeof *out);
    int rv = service_parse_ids(m, out->ids, &out->n);
    if (rv != 0) return rv;
    const int64_t *from;
    uint32_t nf;
    int64_t one;
    rv = msg_get_i64(m, NULL, "from", 0, WCLIENT_MAX_TOKENS, &one);
    if (rv == 0) {
        for (uint32_t i = 0; i < out->n; i++)
            out->from[i] = (uint32_t)one;
    } else if (rv == STRATA_EPROTO) {
        if ((rv = msg_get_i64s(m, NULL, "from", WCLIENT_POLL_MAX_IDS, 0, WCLIENT_MAX_TOKENS, &from,
                               &nf)) != 0)
            return rv;
        if (nf != out->n)
            return strata_errf(STRATA_EPROTO, "field 'from': %u indices for %u ids", nf, out->n);
        for (uint32_t i = 0; i < nf; i++)
            out->from[i] = (uint32_t)from[i];
    } else if (rv != STRATA_ENOENT) {
        return rv;
    }
    int64_t wait = 2000;
    if ((rv = opt(msg_get_i64(m, NULL, "wait_ms", 0, INT32_MAX, &wait))) != 0) return rv;
    out->wait_ms = wait > WCLIENT_POLL_WAIT_MAX_MS ? WCLIENT_POLL_WAIT_MAX_MS : (int)wait;
    return 0;
}

/* ---- ops ----------------------------------------------------------------------------------------
 */

static int op_hello(struct ipc_call *call, void *ctx)
{
    struct service *s = ctx;
    struct msg *m = ipc_call_msg(call);
    int64_t lo = WCLIENT_PROTO_MIN, hi = WCLIENT_PROTO_MAX;
    int rv;
    if ((rv = opt(msg_get_i64(m, NULL, "proto_min", 0, INT32_MAX, &lo))) != 0 ||
        (rv = opt(msg_get_i64(m, NULL, "proto_max", 0, INT32_MAX, &hi))) != 0)
        return rv;
    if (hi < WCLIENT_PROTO_MIN || lo > WCLIENT_PROTO_MAX)
        return strata_errf(STRATA_EPROTO,
                           "the client speaks worker protocol %lld..%lld, this worker %d..%d: "
                           "upgrade the older of the two",
                           (long long)lo, (long long)hi, WCLIENT_PROTO_MIN, WCLIENT_PROTO_MAX);
    struct backend_info bi;
    engine_backend_info(s->e, &bi);
    struct msg_builder b;
    msg_begin_reply(&b);
    msg_key(&b, "proto_min");
    msg_pack_i64(&b, WCLIENT_PROTO_MIN);
    msg_key(&b, "proto_max");
    msg_pack_i64(&b, WCLIENT_PROTO_MAX);
    msg_key(&b, "fingerprint");
    msg_pack_u64(&b, s->o.fingerprint);
    msg_key(&b, "model");
    msg_pack_str(&b, s->o.model_name);
    msg_key(&b, "arch");
    msg_pack_str(&b, s->o.arch);
    msg_key(&b, "backend");
    msg_pack_str(&b, bi.name);
    msg_key(&b, "kv_type");
    msg_pack_str(&b, kv_type_name(bi.kv_type));
    msg_key(&b, "n_ctx");
    msg_pack_i64(&b, s->o.n_ctx);
    msg_key(&b, "max_seqs");
    msg_pack_i64(&b, s->o.max_running);
    msg_key(&b, "pid");
    msg_pack_i64(&b, getpid());
    msg_key(&b, "bit_exact");
    msg_pack_bool(&b, bi.bit_exact);
    ipc_reply(call, &b);
    return 0;
}

static int op_meta(struct ipc_call *call, void *ctx)
{
    struct service *s = ctx;
    struct msg_builder b;
    msg_begin_reply(&b);
    msg_key(&b, "gguf");
    msg_pack_bin(&b, s->o.meta, s->o.meta_len);
    msg_key(&b, "n_ctx");
    msg_pack_i64(&b, s->o.n_ctx);
    msg_key(&b, "fingerprint");
    msg_pack_u64(&b, s->o.fingerprint);
    ipc_reply(call, &b);
    return 0;
}

/* pick_seed: a seed for a request that brought none, returned to the client so a resubmit after
 * a restart continues the same random stream. */
static uint64_t pick_seed(void)
{
    uint64_t v;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) == (ssize_t)sizeof v) return v;
    static _Atomic uint64_t n;
    return (uint64_t)now_ns() * 0x9E3779B97F4A7C15ull + atomic_fetch_add(&n, 1);
}

static int op_submit(struct ipc_call *call, void *ctx)
{
    struct service *s = ctx;
    struct msg *m = ipc_call_msg(call);
    struct service_submit sub;
    int rv = service_parse_submit(m, s->o.n_vocab, s->o.n_ctx, &sub);
    if (rv != 0) return rv;
    struct engine_update u = {0};
    bool existing = engine_poll(s->e, sub.req.id, 0, &u) == 0;
    if (!existing) {
        if (!sub.has_seed) sub.req.sp.seed = pick_seed();
        if ((rv = engine_submit(s->e, &sub.req)) != 0) return rv;
        atomic_fetch_add(&s->requests, 1);
        /* a racing duplicate may have won: report the seed of the request that exists */
        if ((rv = engine_poll(s->e, sub.req.id, 0, &u)) != 0) return rv;
    }
    struct msg_builder b;
    msg_begin_reply(&b);
    msg_key(&b, "id");
    msg_pack_str(&b, sub.req.id);
    msg_key(&b, "seed");
    msg_pack_u64(&b, u.seed);
    msg_key(&b, "existing");
    msg_pack_bool(&b, existing);
    ipc_reply(call, &b);
    return 0;
}

static const char *const finish_names[] = {
    [ENGINE_FINISH_NONE] = "running",  [ENGINE_FINISH_STOP] = "stop",
    [ENGINE_FINISH_LENGTH] = "length", [ENGINE_FINISH_CANCELLED] = "cancelled",
    [ENGINE_FINISH_ERROR] = "error",
};

/* pack_update packs one poll item: the engine's answer for id from `from`, the stop token taken
 * off the tokens and reported on its own. */
static void pack_update(struct msg_builder *b, struct service *s, const char *id, uint32_t from,
                        struct engine_token *toks)
{
    struct engine_update u = {.toks = toks, .cap = SERVICE_POLL_CAP};
    int rv = engine_poll(s->e, id, from, &u);
    if (rv != 0) {
        msg_pack_map(b, 3);
        msg_pack_str(b, "id");
        msg_pack_str(b, id);
        msg_pack_str(b, "ok");
        msg_pack_bool(b, false);
        msg_pack_str(b, "error");
        msg_pack_map(b, 2);
        msg_pack_str(b, "code");
        msg_pack_i64(b, rv);
        msg_pack_str(b, "message");
        if (rv == STRATA_ENOENT)
            msg_pack_str(b, "unknown request: resubmit it with the tokens received so far");
        else
            msg_pack_str(b, strata_errdetail());
        return;
    }
    int32_t stop = -1;
    if (u.finish == ENGINE_FINISH_STOP && u.n > 0 && !u.grammar_end) stop = toks[--u.n].id;
    uint32_t n_top = 0;
    for (uint32_t i = 0; i < u.n; i++)
        if (toks[i].n_top > n_top) n_top = toks[i].n_top;
    uint32_t n_fields = 14 + (u.finish != ENGINE_FINISH_NONE) + (stop >= 0) +
                        2 * (u.finish == ENGINE_FINISH_ERROR) + (n_top ? 3 : 0);
    msg_pack_map(b, n_fields);
    msg_pack_str(b, "id");
    msg_pack_str(b, id);
    msg_pack_str(b, "ok");
    msg_pack_bool(b, true);
    msg_pack_str(b, "from");
    msg_pack_i64(b, from);
    msg_pack_str(b, "tokens");
    msg_pack_array(b, u.n);
    for (uint32_t i = 0; i < u.n; i++)
        msg_pack_i64(b, toks[i].id);
    msg_pack_str(b, "logprobs");
    msg_pack_array(b, u.n);
    for (uint32_t i = 0; i < u.n; i++)
        msg_pack_f64(b, toks[i].logprob);
    msg_pack_str(b, "n_total");
    msg_pack_i64(b, u.n_total);
    msg_pack_str(b, "seed");
    msg_pack_u64(b, u.seed);
    msg_pack_str(b, "n_cached");
    msg_pack_i64(b, u.t.n_cached);
    msg_pack_str(b, "queue_ms");
    msg_pack_f64(b, u.t.queue_ms);
    msg_pack_str(b, "prefill_ms");
    msg_pack_f64(b, u.t.prefill_ms);
    msg_pack_str(b, "decode_ms");
    msg_pack_f64(b, u.t.decode_ms);
    msg_pack_str(b, "draft_n");
    msg_pack_i64(b, u.t.n_draft);
    msg_pack_str(b, "draft_n_accepted");
    msg_pack_i64(b, u.t.n_draft_accepted);
    msg_pack_str(b, "decode_passes");
    msg_pack_i64(b, u.t.n_passes);
    if (u.finish != ENGINE_FINISH_NONE) {
        msg_pack_str(b, "finish");
        msg_pack_str(b, finish_names[u.finish]);
    }
    if (stop >= 0) {
        msg_pack_str(b, "stop_token");
        msg_pack_i64(b, stop);
    }
    if (u.finish == ENGINE_FINISH_ERROR) {
        msg_pack_str(b, "error_code");
        msg_pack_i64(b, u.error ? u.error : STRATA_EINTERNAL);
        msg_pack_str(b, "error_message");
        msg_pack_str(b, u.error_msg);
    }
    if (n_top) {
        /* every token gets n_top alternatives; a token that has fewer is padded with id -1 */
        msg_pack_str(b, "top_n");
        msg_pack_i64(b, n_top);
        msg_pack_str(b, "top_ids");
        msg_pack_array(b, u.n * n_top);
        for (uint32_t i = 0; i < u.n; i++)
            for (uint32_t k = 0; k < n_top; k++)
                msg_pack_i64(b, k < toks[i].n_top ? toks[i].top[k].id : -1);
        msg_pack_str(b, "top_logprobs");
        msg_pack_array(b, u.n * n_top);
        for (uint32_t i = 0; i < u.n; i++)
            for (uint32_t k = 0; k < n_top; k++)
                msg_pack_f64(b, k < toks[i].n_top ? toks[i].top[k].logprob : -1e30);
    }
}

/* answer_poll replies to a poll with every id's update. */
static void answer_poll(struct service *s, struct ipc_call *call, const struct service_poll *p)
{
    struct engine_token *toks = malloc(SERVICE_POLL_CAP * sizeof *toks);
    if (!toks) {
        ipc_reply_error(call, STRATA_ENOMEM, "out of memory for a poll reply");
        return;
    }
    struct msg_builder b;
    msg_begin_reply(&b);
    msg_key(&b, "updates");
    msg_pack_array(&b, p->n);
    for (uint32_t i = 0; i < p->n; i++)
        pack_update(&b, s, p->ids[i], p->from[i], toks);
    free(toks);
    ipc_reply(call, &b);
}

/* progressed: has any id of p news (tokens after from, a finish, or is unknown)? Renews leases. */
static bool progressed(struct service *s, const struct service_poll *p)
{
    for (uint32_t i = 0; i < p->n; i++) {
        struct engine_update u = {0};
        if (engine_poll(s->e, p->ids[i], p->from[i], &u) != 0 || u.n_total > p->from[i] ||
            u.finish != ENGINE_FINISH_NONE)
            return true;
    }
    return false;
}

static int op_poll(struct ipc_call *call, void *ctx)
{
    struct service *s = ctx;
    struct waiter *w = calloc(1, sizeof *w);
    if (!w) return STRATA_ENOMEM;
    int rv = service_parse_poll(ipc_call_msg(call), &w->p);
    if (rv != 0) {
        free(w);
        return rv;
    }
    if (w->p.wait_ms == 0 || progressed(s, &w->p)) {
        answer_poll(s, call, &w->p);
        free(w);
        return 0;
    }
    w->call = call;
    w->deadline_ns = now_ns() + (int64_t)w->p.wait_ms * 1000000;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        free(w);
        return strata_errf(STRATA_ECLOSED, "the worker is shutting down");
    }
    w->next = s->waiters;
    s->waiters = w;
    /* the thread re-checks it once parked: a window may have run since progressed() looked */
    s->woken = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int op_cancel(struct ipc_call *call, void *ctx)
{
    struct service *s = ctx;
    const char *ids[WCLIENT_POLL_MAX_IDS];
    uint32_t n, cancelled = 0;
    int rv = service_parse_ids(ipc_call_msg(call), ids, &n);
    if (rv != 0) return rv;
    for (uint32_t i = 0; i < n; i++) {
        rv = engine_cancel(s->e, ids[i]);
        if (rv == 0)
            cancelled++;
        else if (rv != STRATA_ENOENT)
            return rv;
    }
    struct msg_builder b;
    msg_begin_reply(&b);
    msg_key(&b, "cancelled");
    msg_pack_i64(&b, cancelled);
    ipc_reply(call, &b);
    return 0;
}

static int op_status(struct ipc_call *call, void *ctx)
{
    struct service *s = ctx;
    struct engine_status st;
    engine_status(s->e, &st);
    double tok_s = 0, pre_s = 0;
    pthread_mutex_lock(&s->mu);
    if (s->rate_n >= 2) {
        const struct rate_sample
            *a = &s->rate[(s->rate_i - s->rate_n + 1 + RATE_SAMPLES) % RATE_SAMPLES],
            *z = &s->rate[s->rate_i];
        double dt = (double)(z->t_ns - a->t_ns) / 1e9;
        tok_s = (double)(z->generated - a->generated) / dt;
        pre_s = (double)(z->prefilled - a->prefilled) / dt;
    }
    pthread_mutex_unlock(&s->mu);
    struct msg_builder b;
    msg_begin_reply(&b);
#define KEY_I(k, v)                                                                                \
    msg_key(&b, k);                                                                                \
    msg_pack_u64(&b, v)
    KEY_I("running", st.running);
    KEY_I("queued", st.queued);
    KEY_I("finished", st.finished);
    KEY_I("max_seqs", s->o.max_running);
    KEY_I("max_queue", s->o.max_queue);
    KEY_I("kv_blocks_used", st.kv_blocks_used);
    KEY_I("kv_blocks_cached", st.kv_blocks_cached);
    KEY_I("kv_blocks_total", st.kv_blocks_total);
    KEY_I("windows", st.windows);
    KEY_I("tokens_generated", st.tokens_generated);
    KEY_I("prompt_tokens", st.tokens_prefilled);
    KEY_I("prefix_hits", st.prefix_hits);
    KEY_I("preemptions", st.preemptions);
    KEY_I("lapsed", st.lapsed);
    KEY_I("drafts_proposed", st.drafts_proposed);
    KEY_I("drafts_accepted", st.drafts_accepted);
    KEY_I("decode_passes", st.decode_passes);
    KEY_I("decode_tokens", st.decode_tokens);
    KEY_I("verify_passes", st.verify_passes);
    KEY_I("draft_passes", st.draft_passes);
    KEY_I("requests", atomic_load(&s->requests));
#undef KEY_I
    msg_key(&b, "window_s");
    msg_pack_f64(&b, st.window_s);
    msg_key(&b, "monitor_s");
    msg_pack_f64(&b, (double)atomic_load(&s->monitor_ns) / 1e9);
    msg_key(&b, "spec");
    msg_pack_str(&b, st.spec ? st.spec : "off");
    msg_key(&b, "draft_accept_rate");
    msg_pack_f64(&b, st.drafts_proposed ? (double)st.drafts_accepted / st.drafts_proposed : 0.0);
    msg_key(&b, "accepted_per_window");
    msg_pack_f64(&b, st.verify_passes ? (double)st.drafts_accepted / st.verify_passes : 0.0);
    msg_key(&b, "tokens_per_pass");
    msg_pack_f64(&b, st.decode_passes ? (double)st.decode_tokens / st.decode_passes : 0.0);
    msg_key(&b, "tok_s");
    msg_pack_f64(&b, tok_s);
    msg_key(&b, "prefill_tok_s");
    msg_pack_f64(&b, pre_s);
    msg_key(&b, "uptime_s");
    msg_pack_f64(&b, (double)(now_ns() - s->started_ns) / 1e9);
    struct backend_info bi;
    engine_backend_info(s->e, &bi);
    msg_key(&b, "backend");
    msg_pack_map(&b, 5);
    msg_pack_str(&b, "name");
    msg_pack_str(&b, bi.name);
    msg_pack_str(&b, "device");
    msg_pack_str(&b, bi.device);
    msg_pack_str(&b, "kv_type");
    msg_pack_str(&b, kv_type_name(bi.kv_type));
    msg_pack_str(&b, "kv_bytes");
    msg_pack_u64(&b, bi.kv_bytes);
    msg_pack_str(&b, "bit_exact");
    msg_pack_bool(&b, bi.bit_exact);
    const uint64_t pairs = bi.hits + bi.misses;
    msg_key(&b, "cache");
    msg_pack_map(&b, 13);
    msg_pack_str(&b, "copy_bytes");
    msg_pack_u64(&b, bi.copy_bytes);
    msg_pack_str(&b, "adapt_wait_s");
    msg_pack_f64(&b, bi.adapt_wait_s);
    msg_pack_str(&b, "windows");
    msg_pack_u64(&b, st.windows);
    msg_pack_str(&b, "slots");
    msg_pack_u64(&b, bi.cache_slots);
    msg_pack_str(&b, "bytes");
    msg_pack_u64(&b, (uint64_t)bi.cache_slots * bi.slot_bytes);
    msg_pack_str(&b, "hit_rate");
    msg_pack_f64(&b, pairs ? (double)bi.hits / (double)pairs : 0);
    msg_pack_str(&b, "hits");
    msg_pack_u64(&b, bi.hits);
    msg_pack_str(&b, "misses");
    msg_pack_u64(&b, bi.misses);
    msg_pack_str(&b, "resident");
    msg_pack_u64(&b, bi.resident);
    msg_pack_str(&b, "swaps");
    msg_pack_u64(&b, bi.swaps);
    msg_pack_str(&b, "copy_gibs");
    msg_pack_f64(&b, bi.copy_gibs);
    msg_pack_str(&b, "first_hit_rate");
    msg_pack_f64(&b, bi.first_hit_rate);
    msg_pack_str(&b, "verify_failures");
    msg_pack_u64(&b, bi.verify_failures);
    ipc_reply(call, &b);
    return 0;
}

static int op_vram(struct ipc_call *call, void *ctx)
{
    struct service *s = ctx;
    uint64_t want;
    int rv = msg_get_u64(ipc_call_msg(call), NULL, "cache_bytes", UINT64_MAX, &want);
    /* the resize runs on the decode thread between windows; the reply waits for it */
    if (rv == 0 && (rv = engine_resize(s->e, want)) != 0) return rv;
    if (rv != 0 && rv != STRATA_ENOENT) return rv;
    struct backend_info bi;
    engine_backend_info(s->e, &bi);
    struct msg_builder b;
    msg_begin_reply(&b);
    msg_key(&b, "backend");
    msg_pack_str(&b, bi.name);
    msg_key(&b, "total_bytes");
    msg_pack_u64(&b, 0);
    msg_key(&b, "free_bytes");
    msg_pack_u64(&b, 0);
    msg_key(&b, "weights_bytes");
    msg_pack_u64(&b, s->o.weights_bytes);
    msg_key(&b, "kv_bytes");
    msg_pack_u64(&b, bi.kv_bytes);
    msg_key(&b, "cache_bytes");
    msg_pack_u64(&b, (uint64_t)bi.cache_slots * bi.slot_bytes);
    msg_key(&b, "cache_slots");
    msg_pack_u64(&b, bi.cache_slots);
    ipc_reply(call, &b);
    return 0;
}

/* op_heat: the tokens routed to each (layer, expert) since start, row-major u64s in a bin. */
static int op_heat(struct ipc_call *call, void *ctx)
{
    struct service *s = ctx;
    uint32_t nl, ne;
    int rv = engine_routed(s->e, NULL, &nl, &ne);
    if (rv != 0) return strata_errf(rv, "the model has no routed experts: no heat to report");
    uint64_t *v = malloc((size_t)nl * ne * sizeof *v);
    if (!v) return strata_errf(STRATA_ENOMEM, "heat");
    engine_routed(s->e, v, &nl, &ne);
    struct msg_builder b;
    msg_begin_reply(&b);
    msg_key(&b, "n_layer");
    msg_pack_u64(&b, nl);
    msg_key(&b, "n_expert");
    msg_pack_u64(&b, ne);
    msg_key(&b, "counts");
    msg_pack_bin(&b, v, (size_t)nl * ne * sizeof *v); /* host byte order: the client is local */
    ipc_reply(call, &b);
    free(v);
    return 0;
}

/* timed runs a monitor's op and counts its time in monitor_ns (status reports it). */
static int timed(int (*op)(struct ipc_call *, void *), struct ipc_call *call, void *ctx)
{
    struct service *s = ctx;
    const int64_t t0 = now_ns();
    int rv = op(call, ctx);
    atomic_fetch_add(&s->monitor_ns, (uint64_t)(now_ns() - t0));
    return rv;
}

static int op_status_timed(struct ipc_call *c, void *ctx) { return timed(op_status, c, ctx); }
static int op_vram_timed(struct ipc_call *c, void *ctx) { return timed(op_vram, c, ctx); }
static int op_heat_timed(struct ipc_call *c, void *ctx) { return timed(op_heat, c, ctx); }

static const struct ipc_op ops[] = {
    {"hello", op_hello},   {"meta", op_meta},            {"submit", op_submit},
    {"poll", op_poll},     {"cancel", op_cancel},        {"status", op_status_timed},
    {"vram", op_vram_timed}, {"heat", op_heat_timed},    {NULL, NULL},
};

static int handle(struct ipc_call *call, void *ctx)
{
    return ipc_dispatch(call, ops, ctx);
}

/* ---- the poll thread ----------------------------------------------------------------------------
 */

void service_on_window(void *ctx)
{
    struct service *s = ctx;
    pthread_mutex_lock(&s->mu);
    s->woken = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* sample_rate records the engine's counters (under s->mu). */
static void sample_rate(struct service *s, int64_t t)
{
    struct engine_status st;
    engine_status(s->e, &st);
    s->rate_i = (s->rate_i + 1) % RATE_SAMPLES;
    s->rate[s->rate_i] = (struct rate_sample){t, st.tokens_generated, st.tokens_prefilled};
    if (s->rate_n < RATE_SAMPLES) s->rate_n++;
}

static void *poll_thread(void *arg)
{
    struct service *s = arg;
    int64_t next_sample = now_ns();
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        int64_t t = now_ns(), until = next_sample;
        for (struct waiter *w = s->waiters; w; w = w->next)
            if (w->deadline_ns < until) until = w->deadline_ns;
        if (!s->woken && until > t) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t abs = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + (until - t);
            ts.tv_sec = abs / 1000000000;
            ts.tv_nsec = abs % 1000000000;
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            continue;
        }
        s->woken = false;
        if (t >= next_sample) {
            sample_rate(s, t);
            next_sample = t + (int64_t)RATE_PERIOD_MS * 1000000;
        }
        /* decide outside the lock: engine_poll takes the engine's lock */
        struct waiter *list = s->waiters, *keep = NULL;
        s->waiters = NULL;
        pthread_mutex_unlock(&s->mu);
        while (list) {
            struct waiter *w = list;
            list = w->next;
            if (now_ns() >= w->deadline_ns || progressed(s, &w->p)) {
                answer_poll(s, w->call, &w->p);
                free(w);
            } else {
                w->next = keep;
                keep = w;
            }
        }
        pthread_mutex_lock(&s->mu);
        while (keep) {
            struct waiter *w = keep;
            keep = w->next;
            w->next = s->waiters;
            s->waiters = w;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- lifecycle ----------------------------------------------------------------------------------
 */

int service_init(const struct service_opts *o, struct service **out)
{
    if (!o->meta || o->n_ctx < 2 || o->max_running == 0)
        return strata_errf(STRATA_EINVAL, "service: metadata, n_ctx >= 2 and max_running are "
                                          "required");
    struct service *s = calloc(1, sizeof *s);
    if (!s) return STRATA_ENOMEM;
    s->o = *o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = s;
    return 0;
}

int service_start(struct service *s, struct engine *e, const char *url)
{
    if (strlen(url) >= sizeof s->url)
        return strata_errf(STRATA_ELIMIT, "service: URL %s is too long", url);
    strcpy(s->url, url);
    s->e = e;
    s->started_ns = now_ns();
    struct ipc_server_opts so = {
        .name = "worker",
        .n_ctx = (int)(s->o.max_running + s->o.max_queue + SERVICE_CONTROL_CTX),
        .watchdog_ms = s->o.watchdog_ms,
    };
    int rv = ipc_server_start(s->url, handle, s, &so, &s->srv);
    if (rv != 0) return rv;
    if ((rv = pthread_create(&s->thread, NULL, poll_thread, s)) != 0) {
        ipc_server_close(s->srv);
        s->srv = NULL;
        return strata_errf(strata_errno(rv), "service: cannot start its thread");
    }
    s->thread_live = true;
    LOG_INFO("worker: serving %s (%u streams, %u queued, %d contexts)", s->url, s->o.max_running,
             s->o.max_queue, so.n_ctx);
    return 0;
}

void service_stop(struct service *s)
{
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_live) pthread_join(s->thread, NULL);
    s->thread_live = false;
    if (s->srv) ipc_server_stop(s->srv);
    /* no handler runs now: answer (ECLOSED, consumed) whatever is still parked */
    struct waiter *w;
    while ((w = s->waiters) != NULL) {
        s->waiters = w->next;
        ipc_reply_error(w->call, STRATA_ECLOSED, "the worker is shutting down");
        free(w);
    }
}

void service_fini(struct service *s)
{
    if (!s) return;
    service_stop(s);
    ipc_server_close(s->srv);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

const char *service_url(const struct service *s)
{
    return s->url;
}
