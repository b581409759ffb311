#include "common/ipc/wclient.h"

#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/ipc/ipc.h"
#include "common/ipc/msg.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct wclient {
    struct ipc_client *ipc;
    struct wclient_opts o;
    char url[256];
    _Atomic uint64_t fingerprint; /* the model of the first hello, 0 before */
};

int wclient_open(const char *url, const struct wclient_opts *o, struct wclient **out)
{
    if (!url || strlen(url) >= sizeof((struct wclient *)0)->url)
        return strata_errf(STRATA_EINVAL, "worker URL '%s' is missing or longer than 255 bytes",
                           url ? url : "");
    struct wclient *c = calloc(1, sizeof *c);
    if (!c) return STRATA_ENOMEM;
    c->o = o ? *o : (struct wclient_opts){0};
    if (c->o.timeout_ms <= 0) c->o.timeout_ms = 5000;
    if (c->o.poll_wait_ms < 0 || c->o.poll_wait_ms > WCLIENT_POLL_WAIT_MAX_MS)
        c->o.poll_wait_ms = WCLIENT_POLL_WAIT_MAX_MS;
    else if (c->o.poll_wait_ms == 0)
        c->o.poll_wait_ms = 2000;
    if (c->o.resume_wait_ms <= 0) c->o.resume_wait_ms = 30000;
    strcpy(c->url, url);
    /* replies come from a worker of our own uid; `meta` of a model with a large vocabulary can
     * pass the 16 MiB default */
    struct ipc_client_opts io = {.recv_max = WCLIENT_REPLY_MAX};
    int rv = ipc_client_open(url, &io, &c->ipc);
    if (rv != 0) {
        free(c);
        return rv;
    }
    *out = c;
    return 0;
}

void wclient_close(struct wclient *c)
{
    if (!c) return;
    ipc_client_close(c->ipc);
    free(c);
}

const char *wclient_url(const struct wclient *c)
{
    return c->url;
}

/* copy_str reads optional string key into buf (cut to fit); missing leaves buf as it was. */
static int copy_str(struct msg *m, const msgpack_object *map, const char *key, char *buf,
                    size_t cap)
{
    const char *s;
    size_t len;
    int rv = msg_get_str(m, map, key, 4096, &s, &len);
    if (rv == STRATA_ENOENT) return 0;
    if (rv != 0) return rv;
    if (len >= cap) len = cap - 1;
    memcpy(buf, s, len);
    buf[len] = 0;
    return 0;
}

/* opt: an optional field's result: absent is fine. */
static int opt(int rv)
{
    return rv == STRATA_ENOENT ? 0 : rv;
}

static int get_u32(struct msg *m, const msgpack_object *map, const char *key, uint32_t *out)
{
    int64_t v;
    int rv = msg_get_i64(m, map, key, 0, UINT32_MAX, &v);
    if (rv == 0) *out = (uint32_t)v;
    return rv;
}

int wclient_hello(struct wclient *c, struct wclient_hello *out)
{
    struct msg_builder b;
    struct msg r;
    memset(out, 0, sizeof *out);
    msg_begin_request(&b, "hello");
    msg_key(&b, "proto_min");
    msg_pack_i64(&b, WCLIENT_PROTO_MIN);
    msg_key(&b, "proto_max");
    msg_pack_i64(&b, WCLIENT_PROTO_MAX);
    int rv = ipc_request(c->ipc, &b, &r, c->o.timeout_ms);
    if (rv != 0) return rv;
    int64_t pid = 0;
    bool be = false;
    if ((rv = get_u32(&r, NULL, "proto_min", &out->proto_min)) != 0 ||
        (rv = get_u32(&r, NULL, "proto_max", &out->proto_max)) != 0 ||
        (rv = msg_get_u64(&r, NULL, "fingerprint", UINT64_MAX, &out->fingerprint)) != 0 ||
        (rv = get_u32(&r, NULL, "n_ctx", &out->n_ctx)) != 0 ||
        (rv = opt(get_u32(&r, NULL, "max_seqs", &out->max_seqs))) != 0 ||
        (rv = opt(msg_get_i64(&r, NULL, "pid", 0, INT32_MAX, &pid))) != 0 ||
        (rv = opt(msg_get_bool(&r, NULL, "bit_exact", &be))) != 0 ||
        (rv = copy_str(&r, NULL, "model", out->model, sizeof out->model)) != 0 ||
        (rv = copy_str(&r, NULL, "arch", out->arch, sizeof out->arch)) != 0 ||
        (rv = copy_str(&r, NULL, "backend", out->backend, sizeof out->backend)) != 0 ||
        (rv = opt(copy_str(&r, NULL, "kv_type", out->kv_type, sizeof out->kv_type))) != 0)
        goto done;
    out->pid = (int32_t)pid;
    out->bit_exact = be;
    uint64_t none = 0;
    atomic_compare_exchange_strong(&c->fingerprint, &none, out->fingerprint);
    if (out->proto_max < WCLIENT_PROTO_MIN || out->proto_min > WCLIENT_PROTO_MAX)
        rv = strata_errf(STRATA_EPROTO,
                         "worker %s speaks worker protocol %u..%u, this client %d..%d: upgrade "
                         "the older of the two",
                         c->url, out->proto_min, out->proto_max, WCLIENT_PROTO_MIN,
                         WCLIENT_PROTO_MAX);
done:
    msg_free(&r);
    return rv;
}

int wclient_meta(struct wclient *c, struct wclient_meta *out)
{
    struct msg_builder b;
    struct msg r;
    memset(out, 0, sizeof *out);
    msg_begin_request(&b, "meta");
    int rv = ipc_request(c->ipc, &b, &r, c->o.timeout_ms);
    if (rv != 0) return rv;
    const void *p;
    size_t len;
    if ((rv = msg_get_bin(&r, NULL, "gguf", WCLIENT_REPLY_MAX, &p, &len)) != 0 ||
        (rv = get_u32(&r, NULL, "n_ctx", &out->n_ctx)) != 0 ||
        (rv = opt(msg_get_u64(&r, NULL, "fingerprint", UINT64_MAX, &out->fingerprint))) != 0)
        goto fail;
    if (!(out->bytes = malloc(len ? len : 1))) {
        rv = STRATA_ENOMEM;
        goto fail;
    }
    if (len) memcpy(out->bytes, p, len);
    out->len = len;
    if ((rv = gguf_open_mem(out->bytes, len, false, &out->gguf)) != 0) goto fail;
    msg_free(&r);
    return 0;
fail:
    msg_free(&r);
    wclient_meta_free(out);
    return rv;
}

void wclient_meta_free(struct wclient_meta *m)
{
    gguf_close(m->gguf);
    free(m->bytes);
    memset(m, 0, sizeof *m);
}

void wclient_sampling_default(struct wclient_sampling *s)
{
    *s = (struct wclient_sampling){.temperature = 0, .top_p = 1, .repeat_penalty = 1};
}

static int check_req(const struct wclient_req *r)
{
    size_t id_len = r->id ? strlen(r->id) : 0;
    if (id_len == 0 || id_len > WCLIENT_ID_MAX)
        return strata_errf(STRATA_EINVAL, "request id of %zu bytes: give 1..%d bytes", id_len,
                           WCLIENT_ID_MAX);
    if (r->n_prompt == 0 || r->n_prompt > WCLIENT_MAX_PROMPT)
        return strata_errf(STRATA_ELIMIT, "prompt of %u ids: give 1..%d", r->n_prompt,
                           WCLIENT_MAX_PROMPT);
    if (r->max_tokens == 0 || r->max_tokens > WCLIENT_MAX_TOKENS)
        return strata_errf(STRATA_ELIMIT, "max_tokens %u: give 1..%d", r->max_tokens,
                           WCLIENT_MAX_TOKENS);
    if (r->n_stop > WCLIENT_MAX_STOP || r->top_logprobs > WCLIENT_MAX_TOP ||
        r->n_generated > r->n_prompt || (r->grammar && strlen(r->grammar) > WCLIENT_MAX_GRAMMAR))
        return strata_errf(STRATA_ELIMIT,
                           "%u stop ids (at most %d), top_logprobs %u (at most %d), n_generated "
                           "%u of a %u-id prompt, a grammar of %zu bytes (at most %u)",
                           r->n_stop, WCLIENT_MAX_STOP, r->top_logprobs, WCLIENT_MAX_TOP,
                           r->n_generated, r->n_prompt, r->grammar ? strlen(r->grammar) : 0,
                           WCLIENT_MAX_GRAMMAR);
    return 0;
}

int wclient_submit(struct wclient *c, const struct wclient_req *r, uint64_t *seed, bool *existing)
{
    int rv = check_req(r);
    if (rv != 0) return rv;
    const struct wclient_sampling *s = &r->sampling;
    struct msg_builder b;
    msg_begin_request(&b, "submit");
    msg_key(&b, "id");
    msg_pack_str(&b, r->id);
    msg_key(&b, "prompt");
    msg_pack_i32s(&b, r->prompt, r->n_prompt);
    msg_key(&b, "max_tokens");
    msg_pack_i64(&b, r->max_tokens);
    msg_key(&b, "temperature");
    msg_pack_f64(&b, s->temperature);
    msg_key(&b, "top_k");
    msg_pack_i64(&b, s->top_k);
    msg_key(&b, "top_p");
    msg_pack_f64(&b, s->top_p);
    msg_key(&b, "min_p");
    msg_pack_f64(&b, s->min_p);
    msg_key(&b, "repeat_penalty");
    msg_pack_f64(&b, s->repeat_penalty);
    msg_key(&b, "presence_penalty");
    msg_pack_f64(&b, s->presence_penalty);
    msg_key(&b, "frequency_penalty");
    msg_pack_f64(&b, s->frequency_penalty);
    if (s->has_seed) {
        msg_key(&b, "seed");
        msg_pack_u64(&b, s->seed);
    }
    msg_key(&b, "stop");
    msg_pack_i32s(&b, r->stop, r->n_stop);
    msg_key(&b, "n_generated");
    msg_pack_i64(&b, r->n_generated);
    msg_key(&b, "logprobs");
    msg_pack_bool(&b, r->logprobs);
    msg_key(&b, "top_logprobs");
    msg_pack_i64(&b, r->top_logprobs);
    if (r->grammar) {
        msg_key(&b, "grammar");
        msg_pack_str(&b, r->grammar);
    }
    struct msg m;
    if ((rv = ipc_request(c->ipc, &b, &m, c->o.timeout_ms)) != 0) return rv;
    uint64_t sd = 0;
    bool ex = false;
    if ((rv = msg_get_u64(&m, NULL, "seed", UINT64_MAX, &sd)) == 0 &&
        (rv = opt(msg_get_bool(&m, NULL, "existing", &ex))) == 0) {
        if (seed) *seed = sd;
        if (existing) *existing = ex;
    }
    msg_free(&m);
    return rv;
}

/* ---- poll -------------------------------------------------------------------------------------
 */

static const char *const finish_names[] = {
    [WCLIENT_RUNNING] = "running",     [WCLIENT_STOP] = "stop",   [WCLIENT_LENGTH] = "length",
    [WCLIENT_CANCELLED] = "cancelled", [WCLIENT_ERROR] = "error",
};

/* get_f32s reads an array of n numbers (floats or integers) into a malloc'd array. */
static int get_f32s(struct msg *m, const msgpack_object *map, const char *key, uint32_t n,
                    float **out)
{
    const msgpack_object *it;
    uint32_t k;
    int rv = msg_get_arr(m, map, key, n, &it, &k);
    if (rv != 0) return rv;
    if (k != n) return strata_errf(STRATA_EPROTO, "field '%s': %u values for %u tokens", key, k, n);
    float *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) return STRATA_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        switch (it[i].type) {
        case MSGPACK_OBJECT_FLOAT32:
        case MSGPACK_OBJECT_FLOAT64:
            v[i] = (float)it[i].via.f64;
            break;
        case MSGPACK_OBJECT_POSITIVE_INTEGER:
            v[i] = (float)it[i].via.u64;
            break;
        case MSGPACK_OBJECT_NEGATIVE_INTEGER:
            v[i] = (float)it[i].via.i64;
            break;
        default:
            free(v);
            return strata_errf(STRATA_EPROTO, "field '%s': item %u is not a number", key, i);
        }
    }
    *out = v;
    return 0;
}

/* dup_i32s copies a zone array into a malloc'd one (NULL and 0 stay NULL). */
static int dup_i32s(const int32_t *src, uint32_t n, int32_t **out)
{
    if (n == 0) return 0;
    if (!(*out = malloc(n * sizeof **out))) return STRATA_ENOMEM;
    memcpy(*out, src, n * sizeof **out);
    return 0;
}

static int parse_update(struct msg *m, const msgpack_object *it, struct wclient_update *u)
{
    u->stop_token = -1;
    bool ok = false;
    int rv = msg_get_bool(m, it, "ok", &ok);
    if (rv != 0) return rv;
    if (!ok) {
        const msgpack_object *err;
        int64_t code = STRATA_EPROTO;
        if ((rv = msg_get_map(m, it, "error", &err)) != 0 ||
            (rv = msg_get_i64(m, err, "code", 1, INT32_MAX, &code)) != 0)
            return rv;
        u->code = (int)code;
        return 0;
    }
    const int32_t *tok;
    const char *fin = NULL;
    int64_t stop = -1, ecode = 0;
    if ((rv = get_u32(m, it, "from", &u->from)) != 0 ||
        (rv = msg_get_i32s(m, it, "tokens", WCLIENT_MAX_TOKENS, INT32_MIN, INT32_MAX, &tok,
                           &u->n_tokens)) != 0 ||
        (rv = dup_i32s(tok, u->n_tokens, &u->tokens)) != 0 ||
        (rv = opt(msg_get_str(m, it, "finish", 16, &fin, NULL))) != 0 ||
        (rv = opt(msg_get_i64(m, it, "stop_token", -1, INT32_MAX, &stop))) != 0 ||
        (rv = opt(msg_get_i64(m, it, "error_code", 0, INT32_MAX, &ecode))) != 0 ||
        (rv = opt(get_u32(m, it, "n_prompt", &u->n_prompt))) != 0 ||
        (rv = opt(get_u32(m, it, "n_cached", &u->n_cached))) != 0 ||
        (rv = opt(msg_get_f64(m, it, "queue_ms", 0, 1e15, &u->queue_ms))) != 0 ||
        (rv = opt(msg_get_f64(m, it, "prefill_ms", 0, 1e15, &u->prefill_ms))) != 0 ||
        (rv = opt(msg_get_f64(m, it, "decode_ms", 0, 1e15, &u->decode_ms))) != 0 ||
        (rv = opt(get_u32(m, it, "draft_n", &u->n_draft))) != 0 ||
        (rv = opt(get_u32(m, it, "draft_n_accepted", &u->n_draft_accepted))) != 0 ||
        (rv = opt(get_u32(m, it, "decode_passes", &u->n_passes))) != 0)
        return rv;
    u->stop_token = (int32_t)stop;
    u->error_code = (int)ecode;
    u->finish = WCLIENT_RUNNING;
    for (int f = WCLIENT_STOP; fin && f <= WCLIENT_ERROR; f++)
        if (strcmp(fin, finish_names[f]) == 0) u->finish = (enum wclient_finish)f;
    if (fin && u->finish == WCLIENT_RUNNING && strcmp(fin, "running") != 0)
        return strata_errf(STRATA_EPROTO, "field 'finish': unknown reason '%s'", fin);
    if ((rv = opt(get_f32s(m, it, "logprobs", u->n_tokens, &u->logprobs))) != 0) return rv;
    if ((rv = opt(get_u32(m, it, "top_n", &u->n_top))) != 0) return rv;
    if (u->n_top > WCLIENT_MAX_TOP)
        return strata_errf(STRATA_EPROTO, "field 'top_n': %u is above %d", u->n_top,
                           WCLIENT_MAX_TOP);
    if (u->n_top && u->n_tokens) {
        uint32_t nt = u->n_top * u->n_tokens, k;
        if ((rv = msg_get_i32s(m, it, "top_ids", nt, INT32_MIN, INT32_MAX, &tok, &k)) != 0 ||
            (rv = dup_i32s(tok, k, &u->top_ids)) != 0 ||
            (rv = get_f32s(m, it, "top_logprobs", nt, &u->top_logprobs)) != 0)
            return rv;
        if (k != nt)
            return strata_errf(STRATA_EPROTO, "field 'top_ids': %u ids for %u tokens of %u", k,
                               u->n_tokens, u->n_top);
    }
    return 0;
}

static void update_free(struct wclient_update *u)
{
    free(u->tokens);
    free(u->logprobs);
    free(u->top_ids);
    free(u->top_logprobs);
    memset(u, 0, sizeof *u);
}

void wclient_poll_free(struct wclient_poll_result *r)
{
    for (uint32_t i = 0; r->u && i < r->n; i++)
        update_free(&r->u[i]);
    free(r->u);
    r->u = NULL;
    r->n = 0;
}

int wclient_poll(struct wclient *c, const char *const *ids, const uint32_t *from, uint32_t n,
                 int wait_ms, struct wclient_poll_result *out)
{
    memset(out, 0, sizeof *out);
    if (n == 0 || n > WCLIENT_POLL_MAX_IDS)
        return strata_errf(STRATA_ELIMIT, "poll of %u ids: give 1..%d", n, WCLIENT_POLL_MAX_IDS);
    if (wait_ms < 0) wait_ms = c->o.poll_wait_ms;
    if (wait_ms > WCLIENT_POLL_WAIT_MAX_MS) wait_ms = WCLIENT_POLL_WAIT_MAX_MS;
    struct msg_builder b;
    msg_begin_request(&b, "poll");
    msg_key(&b, "ids");
    msg_pack_array(&b, n);
    for (uint32_t i = 0; i < n; i++)
        msg_pack_str(&b, ids[i]);
    msg_key(&b, "from");
    msg_pack_array(&b, n);
    for (uint32_t i = 0; i < n; i++)
        msg_pack_i64(&b, from[i]);
    msg_key(&b, "wait_ms");
    msg_pack_i64(&b, wait_ms);
    struct msg m;
    int rv = ipc_request(c->ipc, &b, &m, wait_ms + c->o.timeout_ms);
    if (rv != 0) return rv;
    const msgpack_object *it;
    uint32_t k;
    if ((rv = msg_get_arr(&m, NULL, "updates", n, &it, &k)) != 0) goto fail;
    if (k != n) {
        rv = strata_errf(STRATA_EPROTO, "poll of %u ids answered with %u updates", n, k);
        goto fail;
    }
    if (!(out->u = calloc(n, sizeof *out->u))) {
        rv = STRATA_ENOMEM;
        goto fail;
    }
    out->n = n;
    for (uint32_t i = 0; i < n; i++) {
        snprintf(out->u[i].id, sizeof out->u[i].id, "%s", ids[i]);
        if ((rv = parse_update(&m, &it[i], &out->u[i])) != 0) goto fail;
    }
    msg_free(&m);
    return 0;
fail:
    msg_free(&m);
    wclient_poll_free(out);
    return rv;
}

int wclient_cancel(struct wclient *c, const char *id)
{
    struct msg_builder b;
    struct msg m;
    msg_begin_request(&b, "cancel");
    msg_key(&b, "ids");
    msg_pack_array(&b, 1);
    msg_pack_str(&b, id);
    int rv = ipc_request(c->ipc, &b, &m, c->o.timeout_ms);
    if (rv == 0) msg_free(&m);
    return rv;
}

int wclient_status(struct wclient *c, struct wclient_status *out)
{
    struct msg_builder b;
    struct msg m;
    memset(out, 0, sizeof *out);
    msg_begin_request(&b, "status");
    int rv = ipc_request(c->ipc, &b, &m, c->o.timeout_ms);
    if (rv != 0) return rv;
    const msgpack_object *cache = NULL;
    if ((rv = get_u32(&m, NULL, "running", &out->running)) != 0 ||
        (rv = get_u32(&m, NULL, "queued", &out->queued)) != 0 ||
        (rv = opt(get_u32(&m, NULL, "max_seqs", &out->max_seqs))) != 0 ||
        (rv = opt(get_u32(&m, NULL, "max_queue", &out->max_queue))) != 0 ||
        (rv = opt(get_u32(&m, NULL, "kv_blocks_used", &out->kv_blocks_used))) != 0 ||
        (rv = opt(get_u32(&m, NULL, "kv_blocks_total", &out->kv_blocks_total))) != 0 ||
        (rv = opt(msg_get_f64(&m, NULL, "tok_s", 0, 1e15, &out->tok_s))) != 0 ||
        (rv = opt(msg_get_f64(&m, NULL, "prefill_tok_s", 0, 1e15, &out->prefill_tok_s))) != 0 ||
        (rv = opt(msg_get_u64(&m, NULL, "windows", UINT64_MAX, &out->windows))) != 0 ||
        (rv = opt(msg_get_u64(&m, NULL, "tokens_generated", UINT64_MAX, &out->tokens_generated))) !=
            0 ||
        (rv = opt(msg_get_u64(&m, NULL, "prompt_tokens", UINT64_MAX, &out->prompt_tokens))) != 0 ||
        (rv = opt(msg_get_u64(&m, NULL, "prefix_hits", UINT64_MAX, &out->prefix_hits))) != 0 ||
        (rv = opt(msg_get_u64(&m, NULL, "requests", UINT64_MAX, &out->requests))) != 0 ||
        (rv = opt(msg_get_u64(&m, NULL, "drafts_proposed", UINT64_MAX, &out->drafts_proposed))) !=
            0 ||
        (rv = opt(msg_get_u64(&m, NULL, "drafts_accepted", UINT64_MAX, &out->drafts_accepted))) !=
            0 ||
        (rv = opt(msg_get_u64(&m, NULL, "verify_passes", UINT64_MAX, &out->verify_passes))) != 0 ||
        (rv = opt(msg_get_u64(&m, NULL, "decode_passes", UINT64_MAX, &out->decode_passes))) != 0 ||
        (rv = opt(msg_get_u64(&m, NULL, "decode_tokens", UINT64_MAX, &out->decode_tokens))) != 0 ||
        (rv = opt(copy_str(&m, NULL, "spec", out->spec, sizeof out->spec))) != 0 ||
        (rv = opt(msg_get_f64(&m, NULL, "uptime_s", 0, 1e15, &out->uptime_s))) != 0 ||
        (rv = opt(msg_get_f64(&m, NULL, "window_s", 0, 1e15, &out->window_s))) != 0 ||
        (rv = opt(msg_get_f64(&m, NULL, "monitor_s", 0, 1e15, &out->monitor_s))) != 0 ||
        (rv = opt(msg_get_map(&m, NULL, "cache", &cache))) != 0)
        goto done;
    if (cache && ((rv = opt(get_u32(&m, cache, "slots", &out->cache_slots))) != 0 ||
                  (rv = opt(msg_get_u64(&m, cache, "bytes", UINT64_MAX, &out->cache_bytes))) != 0 ||
                  (rv = opt(msg_get_f64(&m, cache, "hit_rate", 0, 1, &out->cache_hit_rate))) != 0 ||
                  (rv = opt(msg_get_u64(&m, cache, "hits", UINT64_MAX, &out->cache_hits))) != 0 ||
                  (rv = opt(msg_get_u64(&m, cache, "misses", UINT64_MAX, &out->cache_misses))) != 0 ||
                  (rv = opt(get_u32(&m, cache, "resident", &out->cache_resident))) != 0 ||
                  (rv = opt(msg_get_u64(&m, cache, "swaps", UINT64_MAX, &out->cache_swaps))) != 0 ||
                  (rv = opt(msg_get_u64(&m, cache, "copy_bytes", UINT64_MAX, &out->copy_bytes))) != 0 ||
                  (rv = opt(msg_get_f64(&m, cache, "copy_gibs", 0, 1e9, &out->cache_copy_gibs))) != 0 ||
                  (rv = opt(msg_get_f64(&m, cache, "adapt_wait_s", 0, 1e15, &out->adapt_wait_s))) != 0))
        goto done;
    const msgpack_object *be = NULL;
    if ((rv = opt(msg_get_map(&m, NULL, "backend", &be))) != 0) goto done;
    if (be && ((rv = opt(copy_str(&m, be, "name", out->backend, sizeof out->backend))) != 0 ||
               (rv = opt(copy_str(&m, be, "kv_type", out->kv_type, sizeof out->kv_type))) != 0))
        goto done;
done:
    msg_free(&m);
    return rv;
}

int wclient_vram(struct wclient *c, bool resize, uint64_t new_cache_bytes, struct wclient_vram *out)
{
    struct msg_builder b;
    struct msg m;
    memset(out, 0, sizeof *out);
    msg_begin_request(&b, "vram");
    if (resize) {
        msg_key(&b, "cache_bytes");
        msg_pack_u64(&b, new_cache_bytes);
    }
    int rv = ipc_request(c->ipc, &b, &m, c->o.timeout_ms);
    if (rv != 0) return rv;
    if ((rv = copy_str(&m, NULL, "backend", out->backend, sizeof out->backend)) != 0 ||
        (rv = opt(msg_get_u64(&m, NULL, "total_bytes", UINT64_MAX, &out->total_bytes))) != 0 ||
        (rv = opt(msg_get_u64(&m, NULL, "free_bytes", UINT64_MAX, &out->free_bytes))) != 0 ||
        (rv = opt(msg_get_u64(&m, NULL, "weights_bytes", UINT64_MAX, &out->weights_bytes))) != 0 ||
        (rv = opt(msg_get_u64(&m, NULL, "kv_bytes", UINT64_MAX, &out->kv_bytes))) != 0 ||
        (rv = opt(msg_get_u64(&m, NULL, "cache_bytes", UINT64_MAX, &out->cache_bytes))) != 0 ||
        (rv = opt(get_u32(&m, NULL, "cache_slots", &out->cache_slots))) != 0)
        goto done;
done:
    msg_free(&m);
    return rv;
}

int wclient_heat(struct wclient *c, struct wclient_heat *out)
{
    struct msg_builder b;
    struct msg m;
    memset(out, 0, sizeof *out);
    msg_begin_request(&b, "heat");
    int rv = ipc_request(c->ipc, &b, &m, c->o.timeout_ms);
    if (rv != 0) return rv;
    const void *p;
    size_t len;
    if ((rv = get_u32(&m, NULL, "n_layer", &out->n_layer)) != 0 ||
        (rv = get_u32(&m, NULL, "n_expert", &out->n_expert)) != 0 ||
        (rv = msg_get_bin(&m, NULL, "counts", WCLIENT_REPLY_MAX, &p, &len)) != 0)
        goto done;
    if (len != (size_t)out->n_layer * out->n_expert * sizeof *out->counts) {
        rv = strata_errf(STRATA_EPROTO, "heat: %zu bytes of counts for %u x %u", len,
                         out->n_layer, out->n_expert);
        goto done;
    }
    if (len && !(out->counts = malloc(len))) {
        rv = strata_errf(STRATA_ENOMEM, "heat");
        goto done;
    }
    if (len) memcpy(out->counts, p, len);
done:
    msg_free(&m);
    return rv;
}

void wclient_heat_free(struct wclient_heat *h)
{
    free(h->counts);
    h->counts = NULL;
}

/* ---- streams ----------------------------------------------------------------------------------
 */

struct wclient_stream {
    struct wclient *c;            /* the worker it runs on now */
    char id[WCLIENT_ID_MAX + 1];  /* its id there */
    char id0[WCLIENT_ID_MAX + 1]; /* the first id; a moved request is "<id0>~<moves>" */
    uint32_t moves;
    struct wclient_req req; /* as first submitted; req.prompt points at hist */
    int32_t *hist;          /* the prompt, then every generated token received */
    uint32_t n_hist, cap_hist;
    int32_t *stop;
    char *grammar;  /* req.grammar's copy */
    uint32_t base; /* generated tokens received before the current submit */
    uint32_t from; /* the current submit's next token index to ask for */
    uint32_t resubmits;
    bool done;
    bool at_end; /* every token came, the finish did not: the next poll makes it up */
    struct wclient_poll_result last; /* the last poll's answer, which *u points into */
    struct wclient_update end;       /* the finish made up when the worker died at the end */
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* gone: an error that means the worker is not answering (dead or restarting), worth retrying. */
static bool gone(int rv)
{
    return rv == STRATA_ETIMEDOUT || rv == STRATA_ECLOSED || rv == STRATA_EBUSY ||
           (rv & STRATA_ENNGERR) != 0;
}

/* resubmit sends the history so far as a new prompt with the remaining budget to worker `to` as
 * request id, retrying while the worker is gone, until deadline; then the stream polls it there. */
static int resubmit(struct wclient_stream *s, struct wclient *to, const char *id, int64_t deadline)
{
    uint32_t got = s->n_hist - s->req.n_prompt;
    struct wclient_req r = s->req;
    r.id = id;
    r.prompt = s->hist;
    r.n_prompt = s->n_hist;
    r.n_generated = s->req.n_generated + got;
    r.max_tokens = s->req.max_tokens - got;
    uint64_t fp = atomic_load(&s->c->fingerprint);
    bool checked = fp == 0;
    for (;;) {
        int64_t t0 = now_ms();
        struct wclient_hello h;
        int rv = checked ? 0 : wclient_hello(to, &h);
        if (rv == 0 && !checked) {
            if (h.fingerprint != fp)
                return strata_errf(STRATA_EPROTO,
                                   "worker %s serves another model (fingerprint %016llx, the "
                                   "request's is %016llx): request %s cannot resume there",
                                   to->url, (unsigned long long)h.fingerprint,
                                   (unsigned long long)fp, s->id);
            checked = true;
        }
        if (rv == 0 && (rv = wclient_submit(to, &r, NULL, NULL)) == 0) break;
        if (!gone(rv) || t0 >= deadline) return rv;
        if (now_ms() - t0 < 100) nanosleep(&(struct timespec){0, 100 * 1000000}, NULL);
    }
    if (id != s->id) snprintf(s->id, sizeof s->id, "%s", id);
    s->c = to;
    s->base = got;
    s->from = 0;
    s->resubmits++;
    return 0;
}

/* end_update makes up the finish of a stream whose every token came but whose worker went away
 * before it sent the finish. */
static const struct wclient_update *end_update(struct wclient_stream *s)
{
    s->end = (struct wclient_update){.finish = WCLIENT_LENGTH, .stop_token = -1};
    snprintf(s->end.id, sizeof s->end.id, "%s", s->id);
    s->end.from = s->n_hist - s->req.n_prompt;
    s->end.n_prompt = s->req.n_prompt;
    s->done = true;
    s->at_end = false;
    return &s->end;
}

int wclient_stream_start(struct wclient *c, const struct wclient_req *r,
                         struct wclient_stream **out)
{
    int rv = check_req(r);
    if (rv != 0) return rv;
    struct wclient_stream *s = calloc(1, sizeof *s);
    if (!s) return STRATA_ENOMEM;
    s->c = c;
    s->req = *r;
    snprintf(s->id, sizeof s->id, "%s", r->id);
    snprintf(s->id0, sizeof s->id0, "%s", r->id);
    s->req.id = s->id;
    s->cap_hist = r->n_prompt + (r->max_tokens < 4096 ? r->max_tokens : 4096);
    s->hist = malloc(s->cap_hist * sizeof *s->hist);
    s->stop = malloc((r->n_stop ? r->n_stop : 1) * sizeof *s->stop);
    if (!s->hist || !s->stop) {
        rv = STRATA_ENOMEM;
        goto fail;
    }
    memcpy(s->hist, r->prompt, r->n_prompt * sizeof *s->hist);
    s->n_hist = r->n_prompt;
    if (r->n_stop) memcpy(s->stop, r->stop, r->n_stop * sizeof *s->stop);
    s->req.prompt = s->hist;
    s->req.stop = s->stop;
    if (r->grammar && !(s->grammar = strdup(r->grammar))) {
        rv = STRATA_ENOMEM;
        goto fail;
    }
    s->req.grammar = s->grammar;
    uint64_t seed;
    if ((rv = wclient_submit(c, &s->req, &seed, NULL)) != 0) goto fail;
    s->req.sampling.has_seed = true;
    s->req.sampling.seed = seed;
    *out = s;
    return 0;
fail:
    wclient_stream_free(s);
    return rv;
}

/* append adds an update's tokens to the history. */
static int append(struct wclient_stream *s, const struct wclient_update *u)
{
    if (u->n_tokens == 0) return 0;
    if (s->n_hist + u->n_tokens > s->cap_hist) {
        uint32_t cap =
            s->cap_hist * 2 > s->n_hist + u->n_tokens ? s->cap_hist * 2 : s->n_hist + u->n_tokens;
        int32_t *h = realloc(s->hist, cap * sizeof *h);
        if (!h) return STRATA_ENOMEM;
        s->hist = h;
        s->req.prompt = h;
        s->cap_hist = cap;
    }
    memcpy(s->hist + s->n_hist, u->tokens, u->n_tokens * sizeof *u->tokens);
    s->n_hist += u->n_tokens;
    return 0;
}

int wclient_stream_next(struct wclient_stream *s, const struct wclient_update **u)
{
    wclient_poll_free(&s->last);
    if (s->at_end) {
        *u = end_update(s);
        return 0;
    }
    int64_t deadline = now_ms() + s->c->o.resume_wait_ms;
    for (;;) {
        const char *id = s->id;
        int64_t t0 = now_ms();
        int rv = s->done ? STRATA_ESTATE : wclient_poll(s->c, &id, &s->from, 1, -1, &s->last);
        if (rv == STRATA_ESTATE)
            return strata_errf(rv, "stream %s has finished: poll it no more", s->id);
        if (rv != 0) {
            if (!gone(rv) || t0 >= deadline || s->c->o.caller_resumes) return rv;
            if (now_ms() - t0 < 100) nanosleep(&(struct timespec){0, 100 * 1000000}, NULL);
            continue;
        }
        struct wclient_update *w = &s->last.u[0];
        if (w->code == STRATA_ENOENT) {
            wclient_poll_free(&s->last);
            if (s->n_hist - s->req.n_prompt >= s->req.max_tokens) {
                /* the worker died after the last token and before we saw its finish */
                *u = end_update(s);
                return 0;
            }
            if (s->c->o.caller_resumes)
                return strata_errf(STRATA_ENOENT,
                                   "worker %s lost request %s (it restarted, or the lease lapsed)",
                                   s->c->url, s->id);
            if ((rv = resubmit(s, s->c, s->id, deadline)) != 0) return rv;
            continue;
        }
        if (w->code != 0) return strata_errf(w->code, "poll of %s: worker error", s->id);
        if (w->from != s->from)
            return strata_errf(STRATA_EPROTO, "poll of %s from %u answered from %u", s->id, s->from,
                               w->from);
        if ((rv = append(s, w)) != 0) return rv;
        s->from += w->n_tokens;
        w->from += s->base;
        w->n_prompt = s->req.n_prompt;
        if (w->finish != WCLIENT_RUNNING) s->done = true;
        *u = w;
        return 0;
    }
}

int wclient_stream_move(struct wclient_stream *s, struct wclient *to)
{
    if (s->done || s->at_end)
        return strata_errf(STRATA_ESTATE, "stream %s has finished: there is nothing to move",
                           s->id);
    if (s->n_hist - s->req.n_prompt >= s->req.max_tokens) {
        s->at_end = true;
        return 0;
    }
    char id[WCLIENT_ID_MAX + 1];
    int n = snprintf(id, sizeof id, "%s~%u", s->id0, s->moves + 1);
    if (n < 0 || n >= (int)sizeof id)
        return strata_errf(STRATA_ELIMIT,
                           "request id %s~%u is longer than %d bytes: a stream that may move needs "
                           "an id of at most %d bytes",
                           s->id0, s->moves + 1, WCLIENT_ID_MAX, WCLIENT_ID_MAX - 11);
    int rv = resubmit(s, to, id, now_ms()); /* a deadline of now: one attempt */
    if (rv == 0) s->moves++;
    return rv;
}

int wclient_stream_cancel(struct wclient_stream *s)
{
    return wclient_cancel(s->c, s->id);
}

uint64_t wclient_stream_seed(const struct wclient_stream *s)
{
    return s->req.sampling.seed;
}

uint32_t wclient_stream_resubmits(const struct wclient_stream *s)
{
    return s->resubmits;
}

void wclient_stream_free(struct wclient_stream *s)
{
    if (!s) return;
    wclient_poll_free(&s->last);
    free(s->hist);
    free(s->stop);
    free(s->grammar);
    free(s);
}
