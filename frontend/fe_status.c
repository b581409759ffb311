/* fe_status — GET /status and the JSON of a worker that `strata status` shares. */
#include "frontend/fe_status.h"

#include "common/base/err.h"
#include "frontend/fe_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* fin: a worker's figure as JSON can hold it (json_real refuses NaN and infinities, and one
 * refused value would drop every key packed with it). */
static double fin(double x)
{
    return isfinite(x) ? x : 0.0;
}

/* text: a name from the worker (general.name is the GGUF's bytes, not always UTF-8; json_string
 * would refuse it and the pack drop the keys beside it). */
static json_t *text(const char *s, size_t cap)
{
    return api_lossy_string(s, strnlen(s, cap));
}

json_t *fe_worker_json(const struct wclient_hello *h, const struct wclient_status *s)
{
    json_t *w = json_object();
    if (!w) return NULL;
    if (h)
        json_object_update_new(w, json_pack("{s:o, s:o, s:o, s:o, s:i, s:i, s:i, s:b}", "model",
                                            text(h->model, sizeof h->model), "arch",
                                            text(h->arch, sizeof h->arch), "backend",
                                            text(h->backend, sizeof h->backend), "kv_type",
                                            text(h->kv_type, sizeof h->kv_type), "pid",
                                            (int)h->pid, "n_ctx", (int)h->n_ctx, "max_seqs",
                                            (int)h->max_seqs, "bit_exact", h->bit_exact));
    if (!s) return w;
    json_object_update_new(
        w,
        json_pack("{s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:I, s:I, s:I, s:I, s:I}", "running",
                  (int)s->running, "queued", (int)s->queued, "max_queue", (int)s->max_queue,
                  "kv_blocks_used", (int)s->kv_blocks_used, "kv_blocks_total",
                  (int)s->kv_blocks_total, "tok_s", fin(s->tok_s), "prefill_tok_s",
                  fin(s->prefill_tok_s),
                  "windows", (json_int_t)s->windows, "tokens_generated",
                  (json_int_t)s->tokens_generated, "prompt_tokens", (json_int_t)s->prompt_tokens,
                  "prefix_hits", (json_int_t)s->prefix_hits, "requests", (json_int_t)s->requests));
    json_object_update_new(
        w,
        json_pack("{s:i, s:I, s:f, s:I, s:I, s:i, s:I, s:f, s:I, s:f}", "cache_slots",
                  (int)s->cache_slots, "cache_bytes", (json_int_t)s->cache_bytes, "cache_hit_rate",
                  fin(s->cache_hit_rate), "cache_hits", (json_int_t)s->cache_hits, "cache_misses",
                  (json_int_t)s->cache_misses, "cache_resident", (int)s->cache_resident,
                  "cache_swaps", (json_int_t)s->cache_swaps, "cache_copy_gibs",
                  fin(s->cache_copy_gibs),
                  "cache_copy_bytes", (json_int_t)s->copy_bytes, "adapt_wait_s",
                  fin(s->adapt_wait_s)));
    json_object_update_new(w, json_pack("{s:f, s:f, s:f}", "uptime_s", fin(s->uptime_s),
                                        "window_s", fin(s->window_s), "monitor_s",
                                        fin(s->monitor_s)));
    /* an older worker says nothing in status: hello's names stand */
    if (s->backend[0]) json_object_set_new(w, "backend", text(s->backend, sizeof s->backend));
    if (s->kv_type[0]) json_object_set_new(w, "kv_type", text(s->kv_type, sizeof s->kv_type));
    return w;
}

json_t *fe_vram_json(const struct wclient_vram *v)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:i}", "total_bytes", (json_int_t)v->total_bytes,
                     "free_bytes", (json_int_t)v->free_bytes, "weights_bytes",
                     (json_int_t)v->weights_bytes, "kv_bytes", (json_int_t)v->kv_bytes,
                     "cache_bytes", (json_int_t)v->cache_bytes, "cache_slots", (int)v->cache_slots);
}

void fe_status_watch(struct fe *f, struct fe_worker *wk)
{
    int64_t seen = atomic_load(&f->status_seen_ns);
    if (!seen || mono_ns() - seen > (int64_t)FE_STATUS_WATCH_MS * 1000000) return;
    struct wclient_vram v;
    struct wclient_heat h = {0};
    bool has_v = wk->ops->vram && wk->ops->vram(wk->h, &v) == 0;
    bool has_h = wk->ops->heat && wk->ops->heat(wk->h, &h) == 0;
    pthread_mutex_lock(&f->mu);
    if (has_v) {
        wk->vram = v;
        wk->has_vram = true;
    }
    if (has_h) { /* swap: the old counts are freed below, outside the lock */
        struct wclient_heat old = wk->heat;
        wk->heat = h;
        h = old;
    }
    pthread_mutex_unlock(&f->mu);
    if (has_h) free(h.counts);
}

/* heat_json: {"n_layer", "n_expert", "counts": [[per expert] per layer]}. */
static json_t *heat_json(const struct wclient_heat *h)
{
    json_t *rows = json_array();
    for (uint32_t l = 0; rows && l < h->n_layer; l++) {
        json_t *row = json_array();
        for (uint32_t e = 0; row && e < h->n_expert; e++)
            json_array_append_new(row,
                                  json_integer((json_int_t)h->counts[(size_t)l * h->n_expert + e]));
        json_array_append_new(rows, row);
    }
    return json_pack("{s:i, s:i, s:o}", "n_layer", (int)h->n_layer, "n_expert", (int)h->n_expert,
                     "counts", rows);
}

void fe_status_http(struct fe *f, struct http_req *r)
{
    atomic_store(&f->status_seen_ns, mono_ns());
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    const struct fe_model *m = fe_model_of(f);
    json_t *model =
        m ? json_pack("{s:s, s:i, s:i}", "id", f->o.model_alias ? f->o.model_alias : m->name,
                      "n_ctx", (int)m->n_ctx, "n_vocab", (int)m->n_vocab)
          : json_null();
    json_t *workers = json_array();
    pthread_mutex_lock(&f->mu);
    int jobs = f->n_jobs;
    for (int i = 0; workers && i < atomic_load(&f->n_workers); i++) {
        const struct fe_worker *wk = &f->workers[i];
        if (wk->dropped) continue;
        json_t *w =
            fe_worker_json(wk->has_hello ? &wk->hello : NULL, wk->has_status ? &wk->st : NULL);
        if (!w) continue;
        json_object_set_new(w, "name", json_string(wk->name));
        json_object_set_new(w, "ready", json_boolean(atomic_load(&wk->ready)));
        json_object_set_new(w, "refused", json_boolean(wk->refused));
        json_object_set_new(w, "inflight", json_integer(atomic_load(&wk->inflight)));
        json_object_set_new(w, "routed_requests",
                            json_integer((json_int_t)atomic_load(&wk->requests)));
        json_object_set_new(w, "vram", wk->has_vram ? fe_vram_json(&wk->vram) : json_null());
        json_object_set_new(w, "heat", wk->heat.counts ? heat_json(&wk->heat) : json_null());
        json_array_append_new(workers, w);
    }
    pthread_mutex_unlock(&f->mu);
#define C(name, field) name, (json_int_t)atomic_load(&f->field)
    json_t *fe = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:i, s:f}",
        C("requests", m_requests), C("errors", m_errors), C("busy", m_busy),
        C("generations", m_gen_requests), C("prompt_tokens", m_prompt_tokens),
        C("cached_tokens", m_cached_tokens), C("generated_tokens", m_gen_tokens),
        C("disconnects", m_disconnects), C("moves", m_moves), C("prefill_us", m_prefill_us),
        C("decode_us", m_decode_us), C("ttft_us", m_ttft_us), C("ttft_n", m_ttft_n), "active", jobs,
        "max_active", (int)f->o.max_active, "uptime_s", (double)(mono_ns() - f->started_ns) / 1e9);
#undef C
    json_t *o = json_pack("{s:s, s:f, s:b, s:o, s:o, s:o}", "object", "strata.status", "time",
                          (double)now.tv_sec + now.tv_nsec / 1e9, "ready", atomic_load(&f->ready),
                          "model", model, "frontend", fe, "workers", workers);
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(12)) : NULL;
    json_decref(o);
    if (!s) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":null}}";
        http_respond(r, 500, NULL, oom, sizeof oom - 1, NULL);
        return;
    }
    static const char *const nocache[] = {"Cache-Control", "no-store", NULL};
    http_respond(r, 200, NULL, s, strlen(s), nocache);
    free(s);
}
