/* fe_test — the whole HTTP frontend against in-process fake workers: answers whole and streamed,
 * stop strings, reasoning, logprobs, every error path, disconnects, routing and refusals, streams
 * moving to another worker when theirs fails, workers found and dropped by a discovery. */
#include "frontend/chat.h"
#include "frontend/fe.h"
#include "frontend/fe_model.h"
#include "frontend/fe_web.h"

#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/tok/tok.h"
#include "tests/testutil.h"
#include "tools/fixture_vocab.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define REPLY "<think>Let me see.</think>Hello world. The answer is 42."

/* ---- a fake worker ----------------------------------------------------------------------------
 */

struct fake {
    uint64_t fingerprint;
    atomic_bool down, busy; /* flipped by the test while the monitor reads them */
    uint32_t n_ctx;
    void *meta;
    size_t meta_len;
    struct tok *tok;
    int32_t reply[256];
    uint32_t n_reply;
    atomic_int delay_ms; /* per update */
    atomic_int starts, cancels, frees;
    atomic_int fail_at;  /* > 0: a stream here that has made this many tokens fails once, */
    atomic_int fail_why; /* with this: STRATA_ENOENT (lost; the worker stays up) or a call error
                            (the worker goes down) */
    atomic_int moves_in; /* streams moved here */
    /* a prefix cache: a prompt equal to the one started before it has all but its last token
     * cached (the worker computes at least the last position) */
    atomic_bool prefix_cache;
    char kv_type[8];     /* what its hello says: a stream fails over only to the same ("" too) */
    atomic_uint routed;  /* its heat: every (layer, expert) of a 2 x 4 grid has this many tokens
                            times (1 + expert) */
    pthread_mutex_t mu;
    int32_t last_prompt[512];
    uint32_t n_last_prompt;
};

struct fake_stream {
    struct fake *w;
    struct wclient_req r;
    uint32_t at;
    bool cancelled;
    uint32_t n_cached;
    struct wclient_update u;
    int32_t toks[2], top_ids[2 * WCLIENT_MAX_TOP];
    float lps[2], top_lps[2 * WCLIENT_MAX_TOP];
};

static int f_hello(void *h, struct wclient_hello *out)
{
    struct fake *w = h;
    if (w->down) return strata_errf(STRATA_ETIMEDOUT, "fake worker is down");
    memset(out, 0, sizeof *out);
    out->fingerprint = w->fingerprint;
    out->n_ctx = w->n_ctx;
    snprintf(out->model, sizeof out->model, "fake");
    snprintf(out->backend, sizeof out->backend, "cpu");
    snprintf(out->kv_type, sizeof out->kv_type, "%s", w->kv_type);
    return 0;
}

static int f_meta(void *h, struct wclient_meta *out)
{
    struct fake *w = h;
    memset(out, 0, sizeof *out);
    out->n_ctx = w->n_ctx;
    out->fingerprint = w->fingerprint;
    return gguf_open_mem(w->meta, w->meta_len, false, &out->gguf);
}

static void f_meta_free(struct wclient_meta *m)
{
    gguf_close(m->gguf);
    m->gguf = NULL;
}

static int f_status(void *h, struct wclient_status *out)
{
    memset(out, 0, sizeof *out);
    out->tok_s = 100;
    out->windows = 40;
    out->cache_hits = 300;
    out->cache_misses = 100;
    out->cache_swaps = 20;
    out->adapt_wait_s = 0.2;
    return 0;
}

static int f_start(void *h, const struct wclient_req *r, void **out)
{
    struct fake *w = h;
    if (w->busy) return strata_errf(STRATA_EBUSY, "fake queue full");
    if (r->n_prompt >= w->n_ctx) return strata_errf(STRATA_ELIMIT, "prompt past the context");
    struct fake_stream *s = calloc(1, sizeof *s);
    s->w = w;
    s->r = *r;
    pthread_mutex_lock(&w->mu);
    if (w->prefix_cache && r->n_prompt == w->n_last_prompt &&
        memcmp(r->prompt, w->last_prompt, r->n_prompt * sizeof(int32_t)) == 0)
        s->n_cached = r->n_prompt - 1;
    w->n_last_prompt = r->n_prompt < 512 ? r->n_prompt : 512;
    memcpy(w->last_prompt, r->prompt, w->n_last_prompt * sizeof(int32_t));
    pthread_mutex_unlock(&w->mu);
    atomic_fetch_add(&w->starts, 1);
    *out = s;
    return 0;
}

/* two tokens of the reply per update; the reply's end is a stop token */
static int f_next(void *h, const struct wclient_update **out)
{
    struct fake_stream *s = h;
    struct fake *w = s->w;
    if (w->delay_ms) usleep((useconds_t)w->delay_ms * 1000);
    if (w->down) return strata_errf(STRATA_ETIMEDOUT, "fake worker is down");
    int at = atomic_load(&w->fail_at);
    if (at > 0 && s->at >= (uint32_t)at && atomic_compare_exchange_strong(&w->fail_at, &at, 0)) {
        int why = atomic_load(&w->fail_why);
        if (why != STRATA_ENOENT) w->down = true;
        return strata_errf(why, "fake worker failed at token %u", s->at);
    }
    struct wclient_update *u = &s->u;
    memset(u, 0, sizeof *u);
    u->from = s->at;
    u->tokens = s->toks;
    u->n_prompt = s->r.n_prompt;
    u->n_cached = s->n_cached;
    u->prefill_ms = 10;
    u->decode_ms = 1 + s->at;
    /* a worker with speculative drafts: 6 verified, 4 accepted over 3 passes */
    u->n_draft = 6;
    u->n_draft_accepted = 4;
    u->n_passes = 3;
    if (s->r.logprobs) {
        u->logprobs = s->lps;
        u->n_top = s->r.top_logprobs;
        u->top_ids = s->top_ids;
        u->top_logprobs = s->top_lps;
    }
    if (s->cancelled) {
        u->finish = WCLIENT_CANCELLED;
    } else {
        for (int k = 0; k < 2 && s->at < w->n_reply && s->at < s->r.max_tokens; k++) {
            s->toks[u->n_tokens] = w->reply[s->at++];
            s->lps[u->n_tokens] = -0.25f;
            for (uint32_t t = 0; t < u->n_top; t++) {
                s->top_ids[u->n_tokens * u->n_top + t] = (int32_t)(65 + t);
                s->top_lps[u->n_tokens * u->n_top + t] = -0.25f - (float)t;
            }
            u->n_tokens++;
        }
        if (s->at == s->r.max_tokens)
            u->finish = WCLIENT_LENGTH;
        else if (s->at == w->n_reply)
            u->finish = WCLIENT_STOP;
    }
    *out = u;
    return 0;
}

static int f_cancel(void *h)
{
    struct fake_stream *s = h;
    if (!s->cancelled) atomic_fetch_add(&s->w->cancels, 1);
    s->cancelled = true;
    return 0;
}

static void f_free(void *h)
{
    struct fake_stream *s = h;
    atomic_fetch_add(&s->w->frees, 1);
    free(s);
}

static void f_close(void *h) {}

/* the stream goes on where it was (wclient_stream_move resubmits what it received) */
static int f_move(void *h, void *to)
{
    struct fake_stream *s = h;
    struct fake *w = to;
    if (w->down) return strata_errf(STRATA_ETIMEDOUT, "fake worker is down");
    if (w->busy) return strata_errf(STRATA_EBUSY, "fake queue full");
    s->w = w;
    atomic_fetch_add(&w->moves_in, 1);
    return 0;
}

static int f_vram(void *h, struct wclient_vram *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->backend, sizeof out->backend, "cpu");
    out->weights_bytes = 1000;
    out->kv_bytes = 200;
    return 0;
}

static int f_heat(void *h, struct wclient_heat *out)
{
    struct fake *w = h;
    out->n_layer = 2;
    out->n_expert = 4;
    out->counts = calloc(8, sizeof *out->counts);
    for (int i = 0; i < 8; i++)
        out->counts[i] = (uint64_t)atomic_load(&w->routed) * (uint64_t)(1 + i % 4);
    return 0;
}

static void f_heat_free(struct wclient_heat *h)
{
    free(h->counts);
    h->counts = NULL;
}

static const struct fe_backend fake_ops = {
    f_hello, f_meta,  f_meta_free, f_status, f_start, f_next,     f_cancel,
    f_free,  f_close, f_move,      f_vram,   f_heat,  f_heat_free};

/* ---- fixture: a vocabulary GGUF and a frontend on a free port ----------------------------------
 */

static char vocab_path[512];
static struct fake W0, W1;
static struct fe *F;
static int PORT;

static void write_vocab(void)
{
    struct gguf_writer *w;
    snprintf(vocab_path, sizeof vocab_path, "%s/vocab.gguf", test_tmpdir());
    ck_assert_int_eq(gguf_writer_open(vocab_path, 0, &w), 0);
    ck_assert_int_eq(gguf_w_str(w, "general.name", "fakemodel"), 0);
    ck_assert_int_eq(fixture_vocab_write(w, 600), 0);
    ck_assert_int_eq(gguf_writer_begin(w), 0);
    ck_assert_int_eq(gguf_writer_finish(w), 0);
}

static void fake_init(struct fake *w, uint64_t fp)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    w->fingerprint = fp;
    w->n_ctx = 256;
    w->meta = test_read_file(vocab_path, &w->meta_len);
    ck_assert_ptr_nonnull(w->meta);
    ck_assert_int_eq(tok_load(vocab_path, NULL, &w->tok), 0);
    struct tok_ids ids = {0};
    ck_assert_int_eq(tok_encode(w->tok, REPLY, strlen(REPLY), 0, &ids), 0);
    ck_assert_uint_lt(ids.n, 256);
    memcpy(w->reply, ids.v, ids.n * sizeof *ids.v);
    w->n_reply = (uint32_t)ids.n;
    free(ids.v);
}

/* fake_reply makes text w's reply. */
static void fake_reply(struct fake *w, const char *text)
{
    struct tok_ids ids = {0};
    ck_assert_int_eq(tok_encode(w->tok, text, strlen(text), 0, &ids), 0);
    ck_assert_uint_lt(ids.n, 256);
    memcpy(w->reply, ids.v, ids.n * sizeof *ids.v);
    w->n_reply = (uint32_t)ids.n;
    free(ids.v);
}

static void fake_fini(struct fake *w)
{
    tok_fini(w->tok);
    free(w->meta);
}

static void start_fe(struct fe_opts *o, int n_workers)
{
    write_vocab();
    fake_init(&W0, 42);
    fake_init(&W1, 43);
    ck_assert_int_eq(fe_init(o, &F), 0);
    ck_assert_int_eq(fe_worker_add(F, &fake_ops, &W0, "fake0"), 0);
    if (n_workers > 1) ck_assert_int_eq(fe_worker_add(F, &fake_ops, &W1, "fake1"), 0);
    ck_assert_int_eq(fe_start(F), 0);
    PORT = fe_port(F);
    ck_assert_int_gt(PORT, 0);
}

static void setup(void)
{
    struct fe_opts o = {
        .max_tokens = 100, .max_body = 4096, .monitor_ms = 50, .worker_wait_ms = 1000};
    start_fe(&o, 1);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
}

static void teardown(void)
{
    fe_fini(F);
    fake_fini(&W0);
    fake_fini(&W1);
}

/* ---- a small HTTP client ----------------------------------------------------------------------
 */

struct resp {
    int status;
    char head[4096];
    char *body; /* de-chunked */
    size_t len;
};

static int connect_fe(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)PORT)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_req(int fd, const char *method, const char *path, const char *body,
                     const char *extra)
{
    char head[1024];
    size_t n = body ? strlen(body) : 0;
    int k = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n%s\r\n",
                     method, path, n, extra ? extra : "");
    ck_assert_int_eq(write(fd, head, (size_t)k), k);
    if (n) ck_assert_int_eq(write(fd, body, n), (ssize_t)n);
}

static void parse_resp(char *raw, size_t n, struct resp *r)
{
    char *sep = strstr(raw, "\r\n\r\n");
    ck_assert_ptr_nonnull(sep);
    size_t hl = (size_t)(sep - raw);
    snprintf(r->head, sizeof r->head, "%.*s", (int)hl, raw);
    r->status = atoi(raw + 9);
    char *p = sep + 4, *end = raw + n;
    r->body = malloc(n + 1);
    r->len = 0;
    if (strcasestr(r->head, "transfer-encoding: chunked")) {
        while (p < end) {
            size_t c = strtoul(p, &p, 16);
            p = strstr(p, "\r\n") + 2;
            if (c == 0) break;
            memcpy(r->body + r->len, p, c);
            r->len += c;
            p += c + 2;
        }
    } else {
        memcpy(r->body, p, (size_t)(end - p));
        r->len = (size_t)(end - p);
    }
    r->body[r->len] = '\0';
}

static void request(const char *method, const char *path, const char *body, const char *extra,
                    struct resp *r)
{
    int fd = connect_fe();
    send_req(fd, method, path, body, extra);
    size_t cap = 1 << 16, n = 0;
    char *raw = malloc(cap);
    ssize_t k;
    while ((k = read(fd, raw + n, cap - n - 1)) > 0) {
        n += (size_t)k;
        if (n + 1 == cap) raw = realloc(raw, cap *= 2);
    }
    raw[n] = '\0';
    close(fd);
    parse_resp(raw, n, r);
    free(raw);
}

static json_t *post_json(const char *path, const char *body, int want_status)
{
    struct resp r;
    request("POST", path, body, NULL, &r);
    ck_assert_msg(r.status == want_status, "status %d, want %d: %s", r.status, want_status, r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    ck_assert_msg(j != NULL, "not JSON: %s", r.body);
    free(r.body);
    return j;
}

/* sse_text concatenates the streamed deltas of key (content, reasoning_content, text) and checks
 * the framing: every event is JSON or [DONE], which comes last. */
static char *sse_collect(const char *body, const char *key, json_t **last, int *n_events)
{
    static char out[4096];
    out[0] = '\0';
    *n_events = 0;
    bool done = false;
    for (const char *p = body; (p = strstr(p, "data: ")) != NULL;) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        ck_assert_ptr_nonnull(e);
        ck_assert(!done);
        if (strncmp(p, "[DONE]", 6) == 0) {
            done = true;
            p = e;
            continue;
        }
        json_t *j = json_loadb(p, (size_t)(e - p), 0, NULL);
        ck_assert_ptr_nonnull(j);
        (*n_events)++;
        json_t *c = json_array_get(json_object_get(j, "choices"), 0);
        json_t *d = json_object_get(c, "delta") ? json_object_get(c, "delta") : c;
        const char *s = json_string_value(json_object_get(d, key));
        if (s) strncat(out, s, sizeof out - strlen(out) - 1);
        if (last) {
            json_decref(*last);
            *last = j;
        } else {
            json_decref(j);
        }
        p = e;
    }
    ck_assert(done);
    return out;
}

static const char *str_at(json_t *j, const char *path)
{
    /* "a.b.0.c": objects by key, arrays by index */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *t = strtok(buf, "."); t && j; t = strtok(NULL, "."))
        j = json_is_array(j) ? json_array_get(j, (size_t)atoi(t)) : json_object_get(j, t);
    return json_string_value(j);
}

static json_int_t int_at(json_t *j, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *t = strtok(buf, "."); t && j; t = strtok(NULL, "."))
        j = json_is_array(j) ? json_array_get(j, (size_t)atoi(t)) : json_object_get(j, t);
    ck_assert_msg(json_is_integer(j), "%s is not an integer", path);
    return json_integer_value(j);
}

/* ---- tests --------------------------------------------------------------------------------------
 */

static const char *chat_body =
    "{\"model\":\"anything\",\"messages\":[{\"role\":\"user\",\"content\":"
    "\"hi\"}]%s}";

static json_t *chat(const char *extra, int status)
{
    char body[2048];
    snprintf(body, sizeof body, chat_body, extra);
    return post_json("/v1/chat/completions", body, status);
}

START_TEST(chat_whole)
{
    json_t *j = chat("", 200);
    ck_assert_str_eq(str_at(j, "object"), "chat.completion");
    /* the fixture's template has no reasoning markup: the think tags stay in the content */
    ck_assert_str_eq(str_at(j, "choices.0.message.content"), REPLY);
    ck_assert_str_eq(str_at(j, "choices.0.finish_reason"), "stop");
    ck_assert_int_eq(int_at(j, "usage.completion_tokens"), W0.n_reply);
    ck_assert_int_eq(int_at(j, "usage.prompt_tokens"), W0.n_last_prompt);
    ck_assert_int_eq(int_at(j, "usage.total_tokens"), W0.n_reply + W0.n_last_prompt);
    ck_assert_str_eq(str_at(j, "model"), "anything");
    /* the worker's drafts in llama-server's timings; (3 passes + 4 accepted) / 3 passes */
    ck_assert_int_eq(int_at(j, "timings.draft_n"), 6);
    ck_assert_int_eq(int_at(j, "timings.draft_n_accepted"), 4);
    ck_assert_double_eq_tol(
        json_real_value(json_object_get(json_object_get(j, "timings"), "tokens_per_pass")),
        7.0 / 3.0, 1e-4); /* as the JSON text rounds it */
    /* the prompt is the chatml rendering, special tokens parsed */
    struct tok_buf b = {0};
    ck_assert_int_eq(tok_decode(W0.tok, W0.last_prompt, W0.n_last_prompt, TOK_DECODE_SPECIAL, &b),
                     0);
    ck_assert_str_eq(b.p, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    ck_assert_int_eq(W0.last_prompt[0], tok_find(W0.tok, "<|im_start|>", 12));
    free(b.p);
    json_decref(j);
}
END_TEST

START_TEST(chat_stream)
{
    struct resp r;
    char body[512];
    snprintf(body, sizeof body, chat_body,
             ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    request("POST", "/v1/chat/completions", body, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strcasestr(r.head, "content-type: text/event-stream"));
    json_t *last = NULL;
    int n;
    ck_assert_str_eq(sse_collect(r.body, "content", NULL, &n), REPLY);
    ck_assert_int_ge(n, 1 + (int)W0.n_reply / 2);
    /* the role comes first; the usage chunk last, with no choices */
    ck_assert_ptr_nonnull(strstr(r.body, "\"role\":\"assistant\""));
    ck_assert(strstr(r.body, "\"role\"") < strstr(r.body, "\"finish_reason\":\"stop\""));
    sse_collect(r.body, "content", &last, &n);
    ck_assert_int_eq(json_array_size(json_object_get(last, "choices")), 0);
    ck_assert_int_eq(int_at(last, "usage.completion_tokens"), W0.n_reply);
    json_decref(last);
    free(r.body);
}
END_TEST

START_TEST(completion_ids_length)
{
    json_t *j = post_json("/v1/completions", "{\"prompt\":[1,2,3],\"max_tokens\":3}", 200);
    ck_assert_str_eq(str_at(j, "object"), "text_completion");
    ck_assert_str_eq(str_at(j, "choices.0.finish_reason"), "length");
    ck_assert_int_eq(int_at(j, "usage.completion_tokens"), 3);
    ck_assert_int_eq(int_at(j, "usage.prompt_tokens"), 3);
    ck_assert_int_eq(W0.last_prompt[2], 3);
    struct tok_buf b = {0};
    tok_decode(W0.tok, W0.reply, 3, 0, &b);
    ck_assert_str_eq(str_at(j, "choices.0.text"), b.p);
    free(b.p);
    json_decref(j);
    /* a string prompt, streamed */
    struct resp r;
    request("POST", "/v1/completions", "{\"prompt\":\"Once\",\"stream\":true}", NULL, &r);
    int n;
    ck_assert_str_eq(sse_collect(r.body, "text", NULL, &n), REPLY);
    free(r.body);
}
END_TEST

START_TEST(stop_strings)
{
    /* whole: the text before the stop, finish "stop", the worker's request cancelled */
    json_t *j = chat(",\"stop\":[\"nothing\",\"world\"]", 200);
    ck_assert_str_eq(str_at(j, "choices.0.message.content"), "<think>Let me see.</think>Hello ");
    ck_assert_str_eq(str_at(j, "choices.0.finish_reason"), "stop");
    ck_assert_int_ge(atomic_load(&W0.cancels), 1);
    json_decref(j);
    /* streamed: a stop string split across tokens is held back, never shown */
    struct resp r;
    char body[512];
    snprintf(body, sizeof body, chat_body, ",\"stream\":true,\"stop\":\"answer is\"");
    request("POST", "/v1/chat/completions", body, NULL, &r);
    int n;
    ck_assert_str_eq(sse_collect(r.body, "content", NULL, &n),
                     "<think>Let me see.</think>Hello world. The ");
    ck_assert_ptr_null(strstr(r.body, "answer"));
    free(r.body);
    /* a stop string that never matches is released at the end */
    j = chat(",\"stop\":\"42!\"", 200);
    ck_assert_str_eq(str_at(j, "choices.0.message.content"), REPLY);
    json_decref(j);
}
END_TEST

START_TEST(logprobs)
{
    json_t *j = chat(",\"logprobs\":true,\"top_logprobs\":2,\"max_tokens\":4", 200);
    json_t *c = json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    ck_assert_int_eq(json_array_size(c), 4);
    json_t *e = json_array_get(c, 0);
    ck_assert(json_real_value(json_object_get(e, "logprob")) == -0.25);
    ck_assert_int_eq(json_array_size(json_object_get(e, "top_logprobs")), 2);
    ck_assert_str_eq(str_at(e, "top_logprobs.0.token"), "b"); /* id 65 is 'b' in GPT-2's order */
    ck_assert_int_gt(json_array_size(json_object_get(e, "bytes")), 0);
    json_decref(j);
    j = post_json("/v1/completions", "{\"prompt\":\"x\",\"logprobs\":1,\"max_tokens\":2}", 200);
    ck_assert_int_eq(
        json_array_size(json_object_get(
            json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"),
            "token_logprobs")),
        2);
    json_decref(j);
}
END_TEST

START_TEST(errors)
{
    struct {
        const char *path, *body;
        int status;
        const char *param;
    } cases[] = {
        {"/v1/chat/completions", "{\"messages\":", 400, NULL},
        {"/v1/chat/completions", "[1]", 400, NULL},
        {"/v1/chat/completions", "{}", 400, "messages"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":17}",
         400, "n"},
        {"/v1/completions", "{\"prompt\":\"x\",\"n\":0}", 400, "n"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":\"hot\"}", 400,
         "temperature"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":0}", 400,
         "max_tokens"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":101}", 400,
         "max_tokens"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
         "messages[0].content"},
        {"/v1/chat/completions", "{\"messages\":[{\"content\":\"hi\"}]}", 400, "messages[0]"},
        {"/v1/completions", "{\"prompt\":[1,99999]}", 400, "prompt"},
        {"/v1/completions", "{\"prompt\":\"\"}", 400, "prompt"},
        {"/v1/completions", "{\"prompt\":\"x\",\"stop\":[1]}", 400, "stop"},
        {"/v1/completions", "{\"prompt\":\"x\",\"top_k\":2147483648}", 400, "top_k"},
        {"/v1/completions", "{\"prompt\":\"x\",\"logprobs\":9}", 400, "logprobs"},
        {"/v1/nothing", "{}", 404, NULL},
        {"/tokenize", "{\"content\":3}", 400, "content"},
        {"/detokenize", "{\"tokens\":[-1]}", 400, "tokens"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *j = post_json(cases[i].path, cases[i].body, cases[i].status);
        json_t *e = json_object_get(j, "error");
        ck_assert_msg(json_is_string(json_object_get(e, "message")), "case %zu", i);
        ck_assert_msg(json_is_string(json_object_get(e, "type")), "case %zu", i);
        ck_assert(json_object_get(e, "param") && json_object_get(e, "code"));
        if (cases[i].param) ck_assert_str_eq(str_at(e, "param"), cases[i].param);
        json_decref(j);
    }
    /* a prompt longer than the context */
    char *big = malloc(8192);
    strcpy(big, "{\"prompt\":[");
    for (int i = 0; i < 300; i++)
        strcat(big, i ? ",5" : "5");
    strcat(big, "]}");
    json_t *j = post_json("/v1/completions", big, 400);
    ck_assert_str_eq(str_at(j, "error.code"), "context_length_exceeded");
    json_decref(j);
    /* a body over --max-body (4096 here) */
    memset(big, ' ', 8000);
    big[8000] = '\0';
    j = post_json("/v1/completions", big, 413);
    ck_assert_str_eq(str_at(j, "error.type"), "invalid_request_error");
    json_decref(j);
    free(big);
    /* GET on a POST endpoint */
    struct resp r;
    request("GET", "/v1/completions", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 405);
    free(r.body);
}
END_TEST

/* named_events parses a Messages or Responses stream: every event is "event: NAME" then "data:"
 * JSON whose type is NAME; no "[DONE]". Returns the data objects. */
static json_t *named_events(const char *body)
{
    json_t *list = json_array();
    ck_assert_ptr_null(strstr(body, "[DONE]"));
    for (const char *p = body; (p = strstr(p, "event: ")) != NULL;) {
        const char *nl = strchr(p, '\n');
        ck_assert_ptr_nonnull(nl);
        ck_assert(strncmp(nl + 1, "data: ", 6) == 0);
        const char *end = strstr(nl, "\n\n");
        ck_assert_ptr_nonnull(end);
        json_t *d = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
        ck_assert_ptr_nonnull(d);
        ck_assert_int_eq(
            strncmp(json_string_value(json_object_get(d, "type")), p + 7, (size_t)(nl - p - 7)), 0);
        json_array_append_new(list, d);
        p = end;
    }
    return list;
}

/* deltas concatenates the delta.<key> (Messages) or <key> (Responses) of the events of type. */
static char *deltas(json_t *ev, const char *type, const char *key)
{
    static char out[4096];
    out[0] = '\0';
    size_t i;
    json_t *d;
    json_array_foreach(ev, i, d)
    {
        if (strcmp(json_string_value(json_object_get(d, "type")), type) != 0) continue;
        json_t *v = json_object_get(json_object_get(d, "delta"), key);
        if (!v) v = json_object_get(d, key);
        if (json_is_string(v)) strncat(out, json_string_value(v), sizeof out - strlen(out) - 1);
    }
    return out;
}

static const char *last_type(json_t *ev)
{
    return json_string_value(json_object_get(json_array_get(ev, json_array_size(ev) - 1), "type"));
}

static const char *msg_body = "{\"model\":\"anything\",\"max_tokens\":50,\"messages\":[{\"role\":"
                              "\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}]%s}";

static json_t *messages(const char *extra, int status)
{
    char body[2048];
    snprintf(body, sizeof body, msg_body, extra);
    return post_json("/v1/messages", body, status);
}

START_TEST(anthropic_messages)
{
    json_t *j = messages("", 200);
    ck_assert_str_eq(str_at(j, "type"), "message");
    ck_assert_str_eq(str_at(j, "role"), "assistant");
    ck_assert_str_eq(str_at(j, "model"), "anything");
    ck_assert_int_eq(strncmp(str_at(j, "id"), "msg_", 4), 0);
    ck_assert_str_eq(str_at(j, "content.0.type"), "text");
    ck_assert_str_eq(str_at(j, "content.0.text"), REPLY);
    ck_assert_str_eq(str_at(j, "stop_reason"), "end_turn");
    ck_assert(json_is_null(json_object_get(j, "stop_sequence")));
    ck_assert_int_eq(int_at(j, "usage.output_tokens"), W0.n_reply);
    ck_assert_int_eq(int_at(j, "usage.input_tokens"), W0.n_last_prompt);
    struct tok_buf b = {0};
    tok_decode(W0.tok, W0.last_prompt, W0.n_last_prompt, TOK_DECODE_SPECIAL, &b);
    ck_assert_str_eq(b.p, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    free(b.p);
    json_decref(j);
    /* the system prompt comes first */
    j = messages(",\"system\":\"Be kind.\"", 200);
    b = (struct tok_buf){0};
    tok_decode(W0.tok, W0.last_prompt, W0.n_last_prompt, TOK_DECODE_SPECIAL, &b);
    ck_assert_str_eq(b.p, "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nhi<|im_end|>"
                          "\n<|im_start|>assistant\n");
    free(b.p);
    json_decref(j);
    /* stop reasons: a stop sequence (named), max_tokens */
    j = messages(",\"stop_sequences\":[\"nothing\",\"world\"]", 200);
    ck_assert_str_eq(str_at(j, "content.0.text"), "<think>Let me see.</think>Hello ");
    ck_assert_str_eq(str_at(j, "stop_reason"), "stop_sequence");
    ck_assert_str_eq(str_at(j, "stop_sequence"), "world");
    json_decref(j);
    char body[512];
    snprintf(body, sizeof body,
             "{\"max_tokens\":3,\"messages\":[{\"role\":\"user\",\"content\":"
             "\"hi\"}]}");
    j = post_json("/v1/messages", body, 200);
    ck_assert_str_eq(str_at(j, "stop_reason"), "max_tokens");
    ck_assert_int_eq(int_at(j, "usage.output_tokens"), 3);
    json_decref(j);
    /* streamed: the Messages events, the text as the whole answer's */
    struct resp r;
    snprintf(body, sizeof body, msg_body, ",\"stream\":true,\"stop_sequences\":[\"answer is\"]");
    request("POST", "/v1/messages", body, "anthropic-version: 2023-06-01\r\n", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strcasestr(r.head, "content-type: text/event-stream"));
    json_t *ev = named_events(r.body);
    ck_assert_str_eq(str_at(json_array_get(ev, 0), "type"), "message_start");
    ck_assert_str_eq(str_at(json_array_get(ev, 1), "type"), "ping");
    ck_assert_str_eq(str_at(json_array_get(ev, 2), "content_block.type"), "text");
    ck_assert_str_eq(deltas(ev, "content_block_delta", "text"),
                     "<think>Let me see.</think>Hello world. The ");
    json_t *md = json_array_get(ev, json_array_size(ev) - 2);
    ck_assert_str_eq(str_at(md, "type"), "message_delta");
    ck_assert_str_eq(str_at(md, "delta.stop_reason"), "stop_sequence");
    ck_assert_str_eq(str_at(md, "delta.stop_sequence"), "answer is");
    ck_assert_int_gt(int_at(md, "usage.output_tokens"), 0);
    ck_assert_str_eq(last_type(ev), "message_stop");
    json_decref(ev);
    free(r.body);
    /* errors in Anthropic's shape */
    j = messages(",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]", 400);
    ck_assert_str_eq(str_at(j, "type"), "error");
    ck_assert_str_eq(str_at(j, "error.type"), "invalid_request_error");
    ck_assert_ptr_nonnull(strstr(str_at(j, "error.message"), "image"));
    json_decref(j);
    j = post_json("/v1/messages", "{\"messages\":", 400);
    ck_assert_str_eq(str_at(j, "error.type"), "invalid_request_error");
    json_decref(j);
    request("GET", "/v1/messages", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 405);
    ck_assert_ptr_nonnull(strstr(r.body, "\"type\":\"error\""));
    free(r.body);
    /* count_tokens counts the prompt the messages render to */
    j = post_json("/v1/messages/count_tokens",
                  "{\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 200);
    json_t *c = chat("", 200);
    ck_assert_int_eq(int_at(j, "input_tokens"), int_at(c, "usage.prompt_tokens"));
    json_decref(c);
    json_decref(j);
}
END_TEST

START_TEST(openai_responses)
{
    json_t *j = post_json("/v1/responses", "{\"model\":\"anything\",\"input\":\"hi\"}", 200);
    ck_assert_str_eq(str_at(j, "object"), "response");
    ck_assert_str_eq(str_at(j, "status"), "completed");
    ck_assert_int_eq(strncmp(str_at(j, "id"), "resp_", 5), 0);
    ck_assert_str_eq(str_at(j, "output.0.type"), "message");
    ck_assert_str_eq(str_at(j, "output.0.content.0.type"), "output_text");
    ck_assert_str_eq(str_at(j, "output.0.content.0.text"), REPLY);
    ck_assert_int_eq(int_at(j, "usage.output_tokens"), W0.n_reply);
    ck_assert_int_eq(int_at(j, "usage.input_tokens"), W0.n_last_prompt);
    json_decref(j);
    /* instructions become the system message */
    j = post_json("/v1/responses",
                  "{\"instructions\":\"Be kind.\",\"input\":[{\"role\":\"user\",\"content\":"
                  "[{\"type\":\"input_text\",\"text\":\"hi\"}]}],\"max_output_tokens\":3}",
                  200);
    struct tok_buf b = {0};
    tok_decode(W0.tok, W0.last_prompt, W0.n_last_prompt, TOK_DECODE_SPECIAL, &b);
    ck_assert_str_eq(b.p, "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nhi<|im_end|>"
                          "\n<|im_start|>assistant\n");
    free(b.p);
    ck_assert_str_eq(str_at(j, "status"), "incomplete");
    ck_assert_str_eq(str_at(j, "incomplete_details.reason"), "max_output_tokens");
    ck_assert_str_eq(str_at(j, "instructions"), "Be kind.");
    json_decref(j);
    /* streamed */
    struct resp r;
    request("POST", "/v1/responses", "{\"input\":\"hi\",\"stream\":true}", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    json_t *ev = named_events(r.body);
    ck_assert_str_eq(str_at(json_array_get(ev, 0), "type"), "response.created");
    ck_assert_str_eq(deltas(ev, "response.output_text.delta", "delta"), REPLY);
    ck_assert_str_eq(last_type(ev), "response.completed");
    json_t *done = json_array_get(ev, json_array_size(ev) - 1);
    ck_assert_str_eq(str_at(done, "response.output.0.content.0.text"), REPLY);
    ck_assert_int_eq(int_at(done, "response.usage.output_tokens"), W0.n_reply);
    for (size_t i = 0; i < json_array_size(ev); i++)
        ck_assert_int_eq(int_at(json_array_get(ev, i), "sequence_number"), (json_int_t)i);
    json_decref(ev);
    free(r.body);
    /* logprobs on the output text, whole and streamed (every token's entry, in order) */
    j = post_json("/v1/responses",
                  "{\"input\":\"hi\",\"top_logprobs\":2,\"include\":[\"message.output_text."
                  "logprobs\"]}",
                  200);
    json_t *lp = json_object_get(
        json_array_get(json_object_get(json_array_get(json_object_get(j, "output"), 0), "content"),
                       0),
        "logprobs");
    ck_assert_uint_eq(json_array_size(lp), W0.n_reply);
    ck_assert(json_real_value(json_object_get(json_array_get(lp, 0), "logprob")) == -0.25);
    ck_assert_uint_eq(json_array_size(json_object_get(json_array_get(lp, 0), "top_logprobs")), 2);
    json_decref(j);
    request("POST", "/v1/responses",
            "{\"input\":\"hi\",\"stream\":true,\"include\":[\"message.output_text.logprobs\"]}",
            NULL, &r);
    ev = named_events(r.body);
    size_t n_lp = 0;
    for (size_t i = 0; i < json_array_size(ev); i++)
        if (strcmp(str_at(json_array_get(ev, i), "type"), "response.output_text.delta") == 0)
            n_lp += json_array_size(json_object_get(json_array_get(ev, i), "logprobs"));
    ck_assert_uint_eq(n_lp, W0.n_reply);
    done = json_array_get(ev, json_array_size(ev) - 1);
    ck_assert_uint_eq(
        json_array_size(json_object_get(
            json_array_get(
                json_object_get(
                    json_array_get(json_object_get(json_object_get(done, "response"), "output"), 0),
                    "content"),
                0),
            "logprobs")),
        W0.n_reply);
    json_decref(ev);
    free(r.body);
    /* stateless: no previous_response_id; errors in OpenAI's shape */
    j = post_json("/v1/responses", "{\"input\":\"hi\",\"previous_response_id\":\"resp_x\"}", 400);
    ck_assert_str_eq(str_at(j, "error.param"), "previous_response_id");
    json_decref(j);
}
END_TEST

START_TEST(props_template_models)
{
    struct resp r;
    request("GET", "/props", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    free(r.body);
    ck_assert_int_eq(int_at(j, "default_generation_settings.n_ctx"), 256);
    ck_assert_ptr_nonnull(strstr(str_at(j, "chat_template"), "<|im_start|>"));
    ck_assert_int_ge(int_at(j, "total_slots"), 0);
    ck_assert_ptr_nonnull(str_at(j, "build_info"));
    json_decref(j);
    j = post_json("/apply-template",
                  "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\","
                  "\"content\":\"hi\"}]}",
                  200);
    ck_assert_str_eq(str_at(j, "prompt"), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi"
                                          "<|im_end|>\n<|im_start|>assistant\n");
    json_decref(j);
    j = post_json("/apply-template", "{\"messages\":[]}", 400);
    ck_assert_str_eq(str_at(j, "error.param"), "messages");
    json_decref(j);
    request("GET", "/v1/models", NULL, NULL, &r);
    j = json_loads(r.body, 0, NULL);
    free(r.body);
    ck_assert_int_eq(int_at(j, "data.0.max_model_len"), 256);
    ck_assert_int_eq(int_at(j, "data.0.meta.n_ctx"), 256);
    json_decref(j);
    request("GET", "/v1/models/fakemodel", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    j = json_loads(r.body, 0, NULL);
    free(r.body);
    ck_assert_str_eq(str_at(j, "id"), "fakemodel");
    ck_assert_int_eq(int_at(j, "max_model_len"), 256);
    json_decref(j);
    request("GET", "/v1/models/other", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 404);
    ck_assert_ptr_nonnull(strstr(r.body, "model_not_found"));
    free(r.body);
    request("GET", "/v1/models/other", NULL, "anthropic-version: 2023-06-01\r\n", &r);
    ck_assert_int_eq(r.status, 404);
    ck_assert_ptr_nonnull(strstr(r.body, "not_found_error"));
    free(r.body);
    request("GET", "/v1/models", NULL, "anthropic-version: 2023-06-01\r\n", &r);
    j = json_loads(r.body, 0, NULL);
    free(r.body);
    ck_assert_str_eq(str_at(j, "data.0.type"), "model");
    ck_assert_str_eq(str_at(j, "data.0.id"), "fakemodel");
    json_decref(j);
}
END_TEST

START_TEST(cached_tokens_and_timings)
{
    W0.prefix_cache = true;
    json_t *j = chat("", 200);
    ck_assert_int_eq(int_at(j, "usage.prompt_tokens_details.cached_tokens"), 0);
    json_decref(j);
    j = chat("", 200); /* the same prompt again: all but its last token cached */
    json_int_t n = int_at(j, "usage.prompt_tokens");
    ck_assert_int_eq(int_at(j, "usage.prompt_tokens_details.cached_tokens"), n - 1);
    ck_assert_int_eq(int_at(j, "timings.cache_n"), n - 1);
    ck_assert_int_eq(int_at(j, "timings.prompt_n"), 1);
    ck_assert_int_eq(int_at(j, "timings.predicted_n"), W0.n_reply);
    json_t *t = json_object_get(j, "timings");
    ck_assert(json_real_value(json_object_get(t, "prompt_ms")) == 10.0);
    ck_assert(json_real_value(json_object_get(t, "prompt_per_second")) == 100.0);
    double pms = json_real_value(json_object_get(t, "predicted_ms"));
    ck_assert(pms > 0);
    ck_assert_double_eq_tol(json_real_value(json_object_get(t, "predicted_per_second")),
                            W0.n_reply * 1000.0 / pms, 1e-3);
    json_decref(j);
    /* and in the stream's usage chunk, the Messages and Responses usage */
    struct resp r;
    char body[512];
    snprintf(body, sizeof body, chat_body,
             ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    request("POST", "/v1/chat/completions", body, NULL, &r);
    json_t *last = NULL;
    int ne;
    sse_collect(r.body, "content", &last, &ne);
    ck_assert_int_eq(int_at(last, "usage.prompt_tokens_details.cached_tokens"), n - 1);
    json_decref(last);
    free(r.body);
    j = messages("", 200);
    ck_assert_int_gt(int_at(j, "usage.cache_read_input_tokens"), 0);
    ck_assert_int_eq(int_at(j, "usage.input_tokens") + int_at(j, "usage.cache_read_input_tokens"),
                     W0.n_last_prompt);
    json_decref(j);
    W0.prefix_cache = false;
}
END_TEST

START_TEST(logprobs_streamed)
{
    struct resp r;
    char body[512];
    snprintf(body, sizeof body, chat_body, ",\"stream\":true,\"logprobs\":true,\"top_logprobs\":3");
    request("POST", "/v1/chat/completions", body, NULL, &r);
    /* every content token has its entry, in order, with 3 alternatives */
    size_t n = 0;
    char text[1024] = "";
    for (const char *p = r.body; (p = strstr(p, "data: {")) != NULL; p += 6) {
        json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        json_t *lp = json_object_get(
            json_object_get(json_array_get(json_object_get(c, "choices"), 0), "logprobs"),
            "content");
        size_t i;
        json_t *e;
        json_array_foreach(lp, i, e)
        {
            ck_assert(json_real_value(json_object_get(e, "logprob")) == -0.25);
            ck_assert_int_eq(json_array_size(json_object_get(e, "top_logprobs")), 3);
            strncat(text, json_string_value(json_object_get(e, "token")),
                    sizeof text - strlen(text) - 1);
            n++;
        }
        json_decref(c);
    }
    ck_assert_uint_eq(n, W0.n_reply);
    ck_assert_str_eq(text, REPLY);
    free(r.body);
    /* completions: the four arrays per chunk */
    request("POST", "/v1/completions",
            "{\"prompt\":\"x\",\"stream\":true,\"logprobs\":2,\"max_tokens\":5}", NULL, &r);
    n = 0;
    json_int_t offset = -1;
    for (const char *p = r.body; (p = strstr(p, "data: {")) != NULL; p += 6) {
        json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        json_t *lp = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "logprobs");
        if (json_is_object(lp)) {
            size_t k = json_array_size(json_object_get(lp, "tokens"));
            ck_assert_uint_eq(json_array_size(json_object_get(lp, "token_logprobs")), k);
            ck_assert_uint_eq(json_array_size(json_object_get(lp, "text_offset")), k);
            json_t *tops = json_object_get(lp, "top_logprobs");
            ck_assert_uint_eq(json_object_size(json_array_get(tops, 0)), 2);
            json_int_t o =
                json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 0));
            ck_assert_int_ge(o, offset);
            offset = o;
            n += k;
        }
        json_decref(c);
    }
    ck_assert_uint_eq(n, 5);
    free(r.body);
}
END_TEST

START_TEST(n_choices)
{
    /* n = 3: three choices of the one prompt; the later ones start after the first has a token,
     * so they find its prompt in the (fake) prefix cache */
    W0.prefix_cache = true;
    int starts = atomic_load(&W0.starts);
    json_t *j = chat(",\"n\":3,\"seed\":5", 200);
    ck_assert_int_eq(atomic_load(&W0.starts) - starts, 3);
    json_t *cs = json_object_get(j, "choices");
    ck_assert_int_eq(json_array_size(cs), 3);
    json_int_t np = int_at(j, "usage.prompt_tokens");
    for (size_t i = 0; i < 3; i++) {
        json_t *c = json_array_get(cs, i);
        ck_assert_int_eq(int_at(c, "index"), (json_int_t)i);
        ck_assert_str_eq(str_at(c, "message.content"), REPLY);
        ck_assert_str_eq(str_at(c, "finish_reason"), "stop");
        ck_assert_int_eq(int_at(c, "timings.predicted_n"), W0.n_reply);
        if (i > 0) ck_assert_int_eq(int_at(c, "timings.cache_n"), np - 1);
    }
    ck_assert_int_eq(int_at(j, "usage.completion_tokens"), 3 * W0.n_reply);
    ck_assert_int_eq(int_at(j, "usage.total_tokens"), np + 3 * W0.n_reply);
    json_decref(j);
    /* streamed: chunks of both indices, one [DONE] at the end, the usage of both */
    struct resp r;
    char body[512];
    snprintf(body, sizeof body, chat_body,
             ",\"n\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    request("POST", "/v1/chat/completions", body, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    char text[2][1024] = {"", ""};
    int roles = 0, finishes = 0;
    json_t *last = NULL;
    for (const char *p = r.body; (p = strstr(p, "data: ")) != NULL; p += 6) {
        if (strncmp(p + 6, "[DONE]", 6) == 0) {
            ck_assert_ptr_null(strstr(p + 6, "data: "));
            break;
        }
        json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        ck_assert_ptr_nonnull(c);
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        if (ch) {
            json_int_t k = int_at(ch, "index");
            ck_assert(k == 0 || k == 1);
            const char *t = str_at(ch, "delta.content");
            if (t) strncat(text[k], t, sizeof text[k] - strlen(text[k]) - 1);
            roles += str_at(ch, "delta.role") != NULL;
            finishes += str_at(ch, "finish_reason") != NULL;
        }
        json_decref(last);
        last = c;
    }
    ck_assert_str_eq(text[0], REPLY);
    ck_assert_str_eq(text[1], REPLY);
    ck_assert_int_eq(roles, 2);
    ck_assert_int_eq(finishes, 2);
    ck_assert_int_eq(int_at(last, "usage.completion_tokens"), 2 * W0.n_reply);
    json_decref(last);
    free(r.body);
    /* completions */
    j = post_json("/v1/completions", "{\"prompt\":\"x\",\"n\":2,\"max_tokens\":3}", 200);
    ck_assert_int_eq(json_array_size(json_object_get(j, "choices")), 2);
    ck_assert_str_eq(str_at(j, "choices.1.finish_reason"), "length");
    ck_assert_int_eq(int_at(j, "usage.completion_tokens"), 6);
    json_decref(j);
    W0.prefix_cache = false;
}
END_TEST

/* revive_later brings a fake worker back 150 ms from now: a worker restart, seen by a request
 * already waiting for it. */
static void *revive_later(void *arg)
{
    usleep(150 * 1000);
    ((struct fake *)arg)->down = false;
    return NULL;
}

START_TEST(busy_and_down)
{
    W0.busy = true;
    struct resp r;
    char body[512];
    snprintf(body, sizeof body, chat_body, "");
    request("POST", "/v1/chat/completions", body, NULL, &r);
    ck_assert_int_eq(r.status, 429);
    ck_assert_ptr_nonnull(strcasestr(r.head, "Retry-After: 1"));
    free(r.body);
    W0.busy = false;
    W0.down = true;
    usleep(300 * 1000); /* the monitor notices (every 50 ms here) */
    request("GET", "/health", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 503);
    free(r.body);
    json_t *j = chat("", 503); /* after waiting worker_wait_ms (1 s here) for a worker */
    ck_assert_str_eq(str_at(j, "error.code"), "no_worker");
    json_decref(j);
    /* a worker that comes back while a request waits serves it, whole or streamed */
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, revive_later, &W0), 0);
    json_decref(chat("", 200));
    pthread_join(t, NULL);
    W0.down = true;
    usleep(300 * 1000);
    ck_assert_int_eq(pthread_create(&t, NULL, revive_later, &W0), 0);
    struct resp sr;
    char sbody[512];
    snprintf(sbody, sizeof sbody, chat_body, ",\"stream\":true");
    request("POST", "/v1/chat/completions", sbody, NULL, &sr);
    pthread_join(t, NULL);
    ck_assert_int_eq(sr.status, 200);
    ck_assert_ptr_nonnull(strstr(sr.body, "[DONE]"));
    ck_assert_ptr_null(strstr(sr.body, "\"error\""));
    free(sr.body);
    W0.down = false;
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    usleep(100 * 1000);
    request("GET", "/health", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    free(r.body);
}
END_TEST

START_TEST(endpoints)
{
    json_t *j = post_json("/tokenize", "{\"content\":\"Hello world\",\"with_pieces\":true}", 200);
    json_t *toks = json_object_get(j, "tokens");
    ck_assert_int_gt(json_array_size(toks), 0);
    char pieces[64] = "";
    for (size_t i = 0; i < json_array_size(toks); i++) {
        json_t *e = json_array_get(toks, i);
        ck_assert(json_is_integer(json_object_get(e, "id")));
        strcat(pieces, json_string_value(json_object_get(e, "piece")));
    }
    ck_assert_str_eq(pieces, "Hello world");
    char body[1024];
    json_decref(j);
    j = post_json("/tokenize", "{\"content\":\"Hello world\"}", 200);
    toks = json_object_get(j, "tokens");
    char *ts = json_dumps(toks, JSON_COMPACT);
    snprintf(body, sizeof body, "{\"tokens\":%s}", ts);
    free(ts);
    json_decref(j);
    j = post_json("/detokenize", body, 200);
    ck_assert_str_eq(str_at(j, "content"), "Hello world");
    json_decref(j);
    struct resp r;
    request("GET", "/v1/models", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    j = json_loads(r.body, 0, NULL);
    ck_assert_str_eq(str_at(j, "data.0.id"), "fakemodel");
    ck_assert_int_eq(int_at(j, "data.0.meta.n_ctx"), 256);
    json_decref(j);
    free(r.body);
    json_decref(chat("", 200));
    request("GET", "/metrics", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strstr(r.body, "# TYPE strata_requests_total counter"));
    ck_assert_ptr_nonnull(strstr(r.body, "strata_generated_tokens_total"));
    ck_assert_ptr_nonnull(strstr(r.body, "strata_worker_up{worker=\"fake0\"} 1.000"));
    ck_assert_ptr_nonnull(
        strstr(r.body, "strata_worker_decode_tokens_per_second{worker=\"fake0\"} 100.000"));
    /* the expert cache's figures: hits and misses apart, swaps and adapt wait per window */
    ck_assert_ptr_nonnull(strstr(r.body, "strata_worker_expert_hits_total{worker=\"fake0\"} 300.000"));
    ck_assert_ptr_nonnull(strstr(r.body, "strata_worker_expert_misses_total{worker=\"fake0\"} 100.000"));
    ck_assert_ptr_nonnull(
        strstr(r.body, "strata_worker_expert_swaps_per_window{worker=\"fake0\"} 0.500"));
    ck_assert_ptr_nonnull(
        strstr(r.body, "strata_worker_adapt_wait_seconds_per_window{worker=\"fake0\"} 0.005"));
    ck_assert_ptr_nonnull(strstr(r.body, "# TYPE strata_worker_expert_hits_total counter"));
    free(r.body);
}
END_TEST

START_TEST(disconnect_cancels)
{
    W0.delay_ms = 100; /* 2 tokens per 100 ms: the stream lasts about a second */
    int fd = connect_fe();
    char body[512];
    snprintf(body, sizeof body, chat_body, ",\"stream\":true");
    send_req(fd, "POST", "/v1/chat/completions", body, NULL);
    char buf[512];
    ck_assert_int_gt(read(fd, buf, sizeof buf), 0); /* headers and the role chunk */
    close(fd);
    for (int i = 0; i < 100 && atomic_load(&W0.cancels) == 0; i++)
        usleep(20 * 1000);
    ck_assert_int_eq(atomic_load(&W0.cancels), 1);
    for (int i = 0; i < 100 && atomic_load(&W0.frees) == 0; i++)
        usleep(20 * 1000);
    ck_assert_int_eq(atomic_load(&W0.frees), 1);
    struct resp r;
    request("GET", "/metrics", NULL, NULL, &r);
    ck_assert_ptr_nonnull(strstr(r.body, "strata_disconnects_total 1"));
    free(r.body);
}
END_TEST

/* ---- API key, reasoning, routing: frontends of their own ----------------------------------------
 */

START_TEST(api_key)
{
    struct fe_opts o = {.api_key = "sekret", .monitor_ms = 50};
    start_fe(&o, 1);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    struct resp r;
    char body[512];
    snprintf(body, sizeof body, chat_body, "");
    request("POST", "/v1/chat/completions", body, NULL, &r);
    ck_assert_int_eq(r.status, 401);
    ck_assert_ptr_nonnull(strstr(r.body, "invalid_api_key"));
    free(r.body);
    request("POST", "/v1/chat/completions", body, "Authorization: Bearer wrong\r\n", &r);
    ck_assert_int_eq(r.status, 401);
    free(r.body);
    request("POST", "/v1/chat/completions", body, "Authorization: Bearer sekret\r\n", &r);
    ck_assert_int_eq(r.status, 200);
    free(r.body);
    request("GET", "/health", NULL, NULL, &r); /* health needs no key */
    ck_assert_int_eq(r.status, 200);
    free(r.body);
    /* Anthropic's clients send x-api-key and anthropic-version, and get Anthropic's error */
    snprintf(body, sizeof body, msg_body, "");
    request("POST", "/v1/messages", body, "x-api-key: wrong\r\nanthropic-version: 2023-06-01\r\n",
            &r);
    ck_assert_int_eq(r.status, 401);
    json_t *j = json_loads(r.body, 0, NULL);
    ck_assert_str_eq(str_at(j, "type"), "error");
    ck_assert_str_eq(str_at(j, "error.type"), "authentication_error");
    json_decref(j);
    free(r.body);
    request("POST", "/v1/messages", body, "x-api-key: sekret\r\nanthropic-version: 2023-06-01\r\n",
            &r);
    ck_assert_int_eq(r.status, 200);
    free(r.body);
    teardown();
}
END_TEST

/* start_templated starts a frontend of one fake worker whose chat template is src. */
static void start_templated(const char *name, const char *src, uint32_t max_tokens)
{
    static char path[512]; /* the frontend keeps the option's pointer */
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
    FILE *fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fputs(src, fp);
    fclose(fp);
    struct fe_opts o = {.chat_template = path, .monitor_ms = 50, .max_tokens = max_tokens};
    start_fe(&o, 1);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
}

START_TEST(reasoning)
{
    /* a think-style template: the answer's <think> part becomes reasoning_content, and
     * chat_template_kwargs reach the template */
    start_templated(
        "think.jinja",
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% "
        "endfor %}<|im_start|>assistant\n{% if enable_thinking is defined and not "
        "enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% if reasoning_effort is "
        "defined %}effort={{ reasoning_effort }}{% endif %}",
        0);
    json_t *j = chat("", 200);
    ck_assert_str_eq(str_at(j, "choices.0.message.content"), "Hello world. The answer is 42.");
    ck_assert_str_eq(str_at(j, "choices.0.message.reasoning_content"), "Let me see.");
    json_decref(j);
    struct resp r;
    char body[512];
    snprintf(body, sizeof body, chat_body, ",\"stream\":true");
    request("POST", "/v1/chat/completions", body, NULL, &r);
    int n;
    ck_assert_str_eq(sse_collect(r.body, "content", NULL, &n), "Hello world. The answer is 42.");
    ck_assert_str_eq(sse_collect(r.body, "reasoning_content", NULL, &n), "Let me see.");
    free(r.body);
    j = chat(",\"chat_template_kwargs\":{\"enable_thinking\":false}", 200);
    struct tok_buf b = {0};
    tok_decode(W0.tok, W0.last_prompt, W0.n_last_prompt, TOK_DECODE_SPECIAL, &b);
    ck_assert_ptr_nonnull(strstr(b.p, "assistant\n<think>\n\n</think>"));
    ck_assert_ptr_null(strstr(b.p, "effort="));
    free(b.p);
    json_decref(j);
    j = chat(",\"reasoning_effort\":\"low\"", 200);
    b = (struct tok_buf){0};
    tok_decode(W0.tok, W0.last_prompt, W0.n_last_prompt, TOK_DECODE_SPECIAL, &b);
    ck_assert_ptr_nonnull(strstr(b.p, "effort=low"));
    free(b.p);
    json_decref(j);
    teardown();
}
END_TEST

START_TEST(harmony_reasoning_with_and_without_tools)
{
    /* a gpt-oss-style template: the analysis channel is the reasoning whether or not the request
     * has tools (whose calls are in the commentary channel's headers), in every API shape, whole
     * and streamed */
    start_templated(
        "harmony.jinja",
        "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}{% for c "
        "in m.tool_calls or [] %}<|start|>assistant<|channel|>commentary to=functions.{{ "
        "c.function.name }} <|constrain|>json<|message|>{{ c.function.arguments | "
        "tojson }}<|call|>{% endfor %}<|end|>{% endfor %}<|start|>assistant",
        250);
    static const char CALL[] =
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
        "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}"
        "<|call|>";
    static const char FINAL[] = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>"
                                "assistant<|channel|>final<|message|>It is sunny.";
    static const char PARAMS[] =
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}";
    char tools[512], extra[1024], body[2048];
    snprintf(tools, sizeof tools,
             "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":%s}}]",
             PARAMS);
    fake_reply(&W0, CALL);
    snprintf(extra, sizeof extra, ",\"tools\":%s", tools);
    json_t *j = chat(extra, 200);
    ck_assert_str_eq(str_at(j, "choices.0.message.reasoning_content"), "Need the weather.");
    ck_assert_str_eq(str_at(j, "choices.0.message.tool_calls.0.function.name"), "get_weather");
    ck_assert_str_eq(str_at(j, "choices.0.message.tool_calls.0.function.arguments"),
                     "{\"city\":\"Oslo\"}");
    ck_assert_str_eq(str_at(j, "choices.0.finish_reason"), "tool_calls");
    json_decref(j);
    struct resp r;
    snprintf(extra, sizeof extra, ",\"stream\":true,\"tools\":%s", tools);
    snprintf(body, sizeof body, chat_body, extra);
    request("POST", "/v1/chat/completions", body, NULL, &r);
    int n;
    json_t *last = NULL;
    ck_assert_str_eq(sse_collect(r.body, "reasoning_content", NULL, &n), "Need the weather.");
    ck_assert_str_eq(sse_collect(r.body, "content", NULL, &n), "");
    ck_assert_ptr_nonnull(strstr(r.body, "\"tool_calls\":[{"));
    sse_collect(r.body, "finish_reason", &last, &n);
    json_decref(last);
    free(r.body);
    /* Messages: a thinking block, then the tool_use block */
    static const char MSG[] =
        "{\"max_tokens\":250%s,\"messages\":[{\"role\":\"user\",\"content\":"
        "\"hi\"}],\"tools\":[{\"name\":\"get_weather\",\"input_schema\":%s}]}";
    static const char RSP[] = "{\"input\":\"hi\"%s,\"tools\":[{\"type\":\"function\",\"name\":"
                              "\"get_weather\",\"parameters\":%s}]}";
    snprintf(body, sizeof body, MSG, "", PARAMS);
    j = post_json("/v1/messages", body, 200);
    ck_assert_str_eq(str_at(j, "content.0.type"), "thinking");
    ck_assert_str_eq(str_at(j, "content.0.thinking"), "Need the weather.");
    ck_assert_str_eq(str_at(j, "content.1.type"), "tool_use");
    ck_assert_str_eq(str_at(j, "content.1.name"), "get_weather");
    ck_assert_str_eq(str_at(j, "stop_reason"), "tool_use");
    json_decref(j);
    snprintf(body, sizeof body, MSG, ",\"stream\":true", PARAMS);
    request("POST", "/v1/messages", body, NULL, &r);
    json_t *ev = named_events(r.body);
    ck_assert_str_eq(deltas(ev, "content_block_delta", "thinking"), "Need the weather.");
    ck_assert_str_eq(deltas(ev, "content_block_delta", "partial_json"), "{\"city\":\"Oslo\"}");
    json_decref(ev);
    free(r.body);
    /* Responses: a reasoning item, then the function_call item */
    snprintf(body, sizeof body, RSP, "", PARAMS);
    j = post_json("/v1/responses", body, 200);
    ck_assert_str_eq(str_at(j, "output.0.type"), "reasoning");
    ck_assert_str_eq(str_at(j, "output.0.content.0.text"), "Need the weather.");
    ck_assert_str_eq(str_at(j, "output.1.type"), "function_call");
    ck_assert_str_eq(str_at(j, "output.1.name"), "get_weather");
    json_decref(j);
    snprintf(body, sizeof body, RSP, ",\"stream\":true", PARAMS);
    request("POST", "/v1/responses", body, NULL, &r);
    ev = named_events(r.body);
    ck_assert_str_eq(deltas(ev, "response.reasoning_text.delta", "delta"), "Need the weather.");
    json_decref(ev);
    free(r.body);
    /* a final answer, with tools and without: reasoning and content */
    fake_reply(&W0, FINAL);
    for (int with = 0; with < 2; with++) {
        snprintf(extra, sizeof extra, "%s%s", with ? ",\"tools\":" : "", with ? tools : "");
        j = chat(extra, 200);
        ck_assert_str_eq(str_at(j, "choices.0.message.reasoning_content"), "Need the weather.");
        ck_assert_str_eq(str_at(j, "choices.0.message.content"), "It is sunny.");
        ck_assert_str_eq(str_at(j, "choices.0.finish_reason"), "stop");
        json_decref(j);
        snprintf(extra, sizeof extra, ",\"stream\":true%s%s", with ? ",\"tools\":" : "",
                 with ? tools : "");
        snprintf(body, sizeof body, chat_body, extra);
        request("POST", "/v1/chat/completions", body, NULL, &r);
        ck_assert_str_eq(sse_collect(r.body, "reasoning_content", NULL, &n), "Need the weather.");
        ck_assert_str_eq(sse_collect(r.body, "content", NULL, &n), "It is sunny.");
        free(r.body);
    }
    teardown();
}
END_TEST

START_TEST(thinking_blocks)
{
    /* a think-style template: the reasoning becomes Messages' thinking blocks and a Responses
     * reasoning item, whole and streamed; thinking {"type": "disabled"} reaches the template as
     * enable_thinking = false */
    start_templated(
        "think.jinja",
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% "
        "endfor %}<|im_start|>assistant\n{% if enable_thinking is defined and not "
        "enable_thinking %}<think>\n\n</think>\n\n{% endif %}",
        0);
    json_t *j = messages("", 200);
    ck_assert_str_eq(str_at(j, "content.0.type"), "thinking");
    ck_assert_str_eq(str_at(j, "content.0.thinking"), "Let me see.");
    ck_assert_str_eq(str_at(j, "content.1.type"), "text");
    ck_assert_str_eq(str_at(j, "content.1.text"), "Hello world. The answer is 42.");
    json_decref(j);
    struct resp r;
    char body[512];
    snprintf(body, sizeof body, msg_body, ",\"stream\":true");
    request("POST", "/v1/messages", body, NULL, &r);
    json_t *ev = named_events(r.body);
    ck_assert_str_eq(deltas(ev, "content_block_delta", "thinking"), "Let me see.");
    ck_assert_str_eq(deltas(ev, "content_block_delta", "text"), "Hello world. The answer is 42.");
    /* block 0 thinking, block 1 text, each opened and closed once */
    int starts = 0, stops = 0;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        const char *t = str_at(json_array_get(ev, i), "type");
        if (strcmp(t, "content_block_start") == 0) {
            ck_assert_int_eq(int_at(json_array_get(ev, i), "index"), starts);
            ck_assert_str_eq(str_at(json_array_get(ev, i), "content_block.type"),
                             starts ? "text" : "thinking");
            starts++;
        }
        stops += strcmp(t, "content_block_stop") == 0;
    }
    ck_assert_int_eq(starts, 2);
    ck_assert_int_eq(stops, 2);
    json_decref(ev);
    free(r.body);
    j = messages(",\"thinking\":{\"type\":\"disabled\"}", 200);
    struct tok_buf b = {0};
    tok_decode(W0.tok, W0.last_prompt, W0.n_last_prompt, TOK_DECODE_SPECIAL, &b);
    ck_assert_ptr_nonnull(strstr(b.p, "assistant\n<think>\n\n</think>"));
    free(b.p);
    json_decref(j);
    j = post_json("/v1/responses", "{\"input\":\"hi\"}", 200);
    ck_assert_str_eq(str_at(j, "output.0.type"), "reasoning");
    ck_assert_str_eq(str_at(j, "output.0.content.0.text"), "Let me see.");
    ck_assert_str_eq(str_at(j, "output.1.content.0.text"), "Hello world. The answer is 42.");
    json_decref(j);
    request("POST", "/v1/responses", "{\"input\":\"hi\",\"stream\":true}", NULL, &r);
    ev = named_events(r.body);
    ck_assert_str_eq(deltas(ev, "response.reasoning_text.delta", "delta"), "Let me see.");
    ck_assert_str_eq(deltas(ev, "response.output_text.delta", "delta"),
                     "Hello world. The answer is 42.");
    json_decref(ev);
    free(r.body);
    teardown();
}
END_TEST

START_TEST(template_sees_tools)
{
    /* /apply-template and count_tokens render the tools as a generation does: the template's
     * `tools` variable, absent with tool_choice "none" */
    char path[512];
    snprintf(path, sizeof path, "%s/tools.jinja", test_tmpdir());
    FILE *fp = fopen(path, "w");
    fputs("{% if tools %}TOOLS{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
          "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "<|im_start|>assistant\n",
          fp);
    fclose(fp);
    struct fe_opts o = {.chat_template = path, .monitor_ms = 50};
    start_fe(&o, 1);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    static const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_"
                               "weather\",\"parameters\":{\"type\":\"object\"}}}]";
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}",
             tools);
    json_t *j = post_json("/apply-template", body, 200);
    ck_assert_int_eq(strncmp(str_at(j, "prompt"), "TOOLS get_weather", 17), 0);
    ck_assert_ptr_nonnull(strstr(str_at(j, "prompt"), "<|im_start|>user\nhi<|im_end|>"));
    json_decref(j);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s,\"tool_choice\":\"none\"}",
             tools);
    j = post_json("/apply-template", body, 200);
    ck_assert_ptr_null(strstr(str_at(j, "prompt"), "TOOLS"));
    json_decref(j);
    json_t *plain = post_json("/v1/messages/count_tokens",
                              "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 200);
    j = post_json("/v1/messages/count_tokens",
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"name\":"
                  "\"get_weather\",\"input_schema\":{\"type\":\"object\"}}]}",
                  200);
    ck_assert_int_gt(int_at(j, "input_tokens"), int_at(plain, "input_tokens"));
    json_decref(j);
    json_decref(plain);
    teardown();
}
END_TEST

START_TEST(n_counts_against_max_active)
{
    /* each choice is a generation: n above --max-active is 429, n up to it is served */
    struct fe_opts o = {.max_active = 2, .monitor_ms = 50};
    start_fe(&o, 1);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    json_t *j = chat(",\"n\":3", 429);
    ck_assert_str_eq(str_at(j, "error.code"), "busy");
    json_decref(j);
    j = chat(",\"n\":2", 200);
    ck_assert_int_eq(json_array_size(json_object_get(j, "choices")), 2);
    json_decref(j);
    j = chat("", 200); /* every admission was given back */
    json_decref(j);
    j = chat(",\"n\":2,\"stream\":false", 200);
    json_decref(j);
    teardown();
}
END_TEST

START_TEST(routing_and_refusal)
{
    struct fe_opts o = {.monitor_ms = 50};
    start_fe(&o, 2); /* W1 serves another model: refused */
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    usleep(200 * 1000);
    for (int i = 0; i < 4; i++)
        json_decref(chat("", 200));
    ck_assert_int_eq(atomic_load(&W0.starts), 4);
    ck_assert_int_eq(atomic_load(&W1.starts), 0);
    struct resp r;
    request("GET", "/metrics", NULL, NULL, &r);
    ck_assert_ptr_nonnull(strstr(r.body, "strata_worker_up{worker=\"fake1\"} 0.000"));
    free(r.body);
    teardown();
    /* two workers of one model: concurrent requests spread by queue length */
    write_vocab();
    fake_init(&W0, 42);
    fake_init(&W1, 42);
    W0.delay_ms = W1.delay_ms = 30;
    ck_assert_int_eq(fe_init(&o, &F), 0);
    fe_worker_add(F, &fake_ops, &W0, "a");
    fe_worker_add(F, &fake_ops, &W1, "b");
    ck_assert_int_eq(fe_start(F), 0);
    PORT = fe_port(F);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    usleep(200 * 1000);
    int fds[6];
    char body[512];
    snprintf(body, sizeof body, chat_body, ",\"stream\":true");
    for (int i = 0; i < 6; i++) {
        fds[i] = connect_fe();
        send_req(fds[i], "POST", "/v1/chat/completions", body, NULL);
        usleep(20 * 1000);
    }
    for (int i = 0; i < 6; i++) {
        char buf[4096];
        while (read(fds[i], buf, sizeof buf) > 0)
            ;
        close(fds[i]);
    }
    ck_assert_int_eq(atomic_load(&W0.starts) + atomic_load(&W1.starts), 6);
    ck_assert_int_ge(atomic_load(&W0.starts), 2);
    ck_assert_int_ge(atomic_load(&W1.starts), 2);
    teardown();
}
END_TEST

/* ---- failover and discovery ------------------------------------------------------------------
 */

static bool metrics_have(const char *needle)
{
    struct resp r;
    request("GET", "/metrics", NULL, NULL, &r);
    bool has = r.body && strstr(r.body, needle) != NULL;
    free(r.body);
    return has;
}

/* wait_metric waits up to 5 s for /metrics to hold needle (want) or not to. */
static void wait_metric(const char *needle, bool want)
{
    for (int i = 0; i < 250 && metrics_have(needle) != want; i++)
        usleep(20 * 1000);
    ck_assert_msg(metrics_have(needle) == want, "/metrics %s '%s'", want ? "lacks" : "still has",
                  needle);
}

/* start_pair starts a frontend on two fake workers of one model, both ready (W0 is picked when
 * both are idle). */
static void start_pair(const struct fe_opts *o)
{
    write_vocab();
    fake_init(&W0, 42);
    fake_init(&W1, 42);
    ck_assert_int_eq(fe_init(o, &F), 0);
    ck_assert_int_eq(fe_worker_add(F, &fake_ops, &W0, "fake0"), 0);
    ck_assert_int_eq(fe_worker_add(F, &fake_ops, &W1, "fake1"), 0);
    ck_assert_int_eq(fe_start(F), 0);
    PORT = fe_port(F);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    wait_metric("strata_worker_up{worker=\"fake1\"} 1.000", true);
}

/* stream_same streams a chat answer and checks the client got what an undisturbed run gives: the
 * whole reply, finish "stop", no error event. */
static void stream_same(void)
{
    struct resp r;
    char body[512];
    snprintf(body, sizeof body, chat_body, ",\"stream\":true");
    request("POST", "/v1/chat/completions", body, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    int n;
    ck_assert_str_eq(sse_collect(r.body, "content", NULL, &n), REPLY);
    ck_assert_ptr_null(strstr(r.body, "\"error\""));
    ck_assert_ptr_nonnull(strstr(r.body, "\"finish_reason\":\"stop\""));
    free(r.body);
}

/* fail_at makes the next stream on w that reaches token `at` fail with why. */
static void fail_at(struct fake *w, int at, int why)
{
    atomic_store(&w->fail_why, why);
    atomic_store(&w->fail_at, at);
}

START_TEST(failover_worker_dies)
{
    struct fe_opts o = {.monitor_ms = 50};
    start_pair(&o);
    /* W0 stops answering mid-stream: the stream ends on W1, the client sees one answer */
    fail_at(&W0, 6, STRATA_ETIMEDOUT);
    stream_same();
    ck_assert_int_eq(atomic_load(&W0.starts), 1);
    ck_assert_int_eq(atomic_load(&W1.starts), 0);
    ck_assert_int_eq(atomic_load(&W1.moves_in), 1);
    ck_assert(metrics_have("strata_stream_moves_total 1\n"));
    /* the dead worker takes no new request until it answers a hello again */
    ck_assert(metrics_have("strata_worker_up{worker=\"fake0\"} 0.000"));
    json_decref(chat("", 200));
    ck_assert_int_eq(atomic_load(&W0.starts), 1);
    ck_assert_int_eq(atomic_load(&W1.starts), 1);
    W0.down = false;
    wait_metric("strata_worker_up{worker=\"fake0\"} 1.000", true);
    /* a whole answer moves the same way */
    fail_at(&W0, 4, STRATA_ETIMEDOUT);
    json_t *j = chat("", 200);
    ck_assert_str_eq(str_at(j, "choices.0.message.content"), REPLY);
    ck_assert_str_eq(str_at(j, "choices.0.finish_reason"), "stop");
    ck_assert_int_eq(int_at(j, "usage.completion_tokens"), W0.n_reply);
    json_decref(j);
    ck_assert_int_eq(atomic_load(&W0.starts), 2);
    ck_assert_int_eq(atomic_load(&W1.moves_in), 2);
    teardown();
}
END_TEST

/* revive brings a fake worker back 300 ms after it went down. */
static void *revive(void *arg)
{
    struct fake *w = arg;
    while (!w->down)
        usleep(1000);
    usleep(300 * 1000);
    w->down = false;
    return NULL;
}

START_TEST(failover_lost)
{
    struct fe_opts o = {.monitor_ms = 50};
    start_pair(&o);
    /* W0 answers that it lost the request (it restarted): the stream ends on W1; W0 stays in
     * use, it answers */
    fail_at(&W0, 6, STRATA_ENOENT);
    stream_same();
    ck_assert_int_eq(atomic_load(&W1.moves_in), 1);
    ck_assert_int_eq(atomic_load(&W0.moves_in), 0);
    ck_assert(metrics_have("strata_worker_up{worker=\"fake0\"} 1.000"));
    teardown();
    /* alone, a worker that lost a stream takes it back */
    start_fe(&o, 1);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    fail_at(&W0, 6, STRATA_ENOENT);
    stream_same();
    ck_assert_int_eq(atomic_load(&W0.moves_in), 1);
    ck_assert(metrics_have("strata_stream_moves_total 0\n"));
    /* alone, a worker that stops answering keeps its stream until it answers again */
    fail_at(&W0, 6, STRATA_ETIMEDOUT);
    pthread_t t;
    pthread_create(&t, NULL, revive, &W0);
    stream_same();
    pthread_join(t, NULL);
    ck_assert_int_eq(atomic_load(&W0.moves_in), 1);
    teardown();
}
END_TEST

/* A discovery the test edits: the URLs are the fake workers' names. */
static struct {
    pthread_mutex_t mu;
    const char *urls[2];
    int n;
} disc = {PTHREAD_MUTEX_INITIALIZER, {NULL, NULL}, 0};

static void disc_set(const char *a, const char *b)
{
    pthread_mutex_lock(&disc.mu);
    disc.urls[0] = a;
    disc.urls[1] = b;
    disc.n = (a != NULL) + (b != NULL);
    pthread_mutex_unlock(&disc.mu);
}

static int d_list(void *ctx, char (*urls)[FE_URL_MAX], int max, int *n)
{
    pthread_mutex_lock(&disc.mu);
    for (*n = 0; *n < disc.n && *n < max; (*n)++)
        snprintf(urls[*n], FE_URL_MAX, "%s", disc.urls[*n]);
    pthread_mutex_unlock(&disc.mu);
    return 0;
}

static int d_open(void *ctx, const char *url, const struct fe_backend **ops, void **w)
{
    *ops = &fake_ops;
    *w = strcmp(url, "fake0") == 0 ? &W0 : &W1;
    return 0;
}

START_TEST(discovery)
{
    struct fe_opts o = {.monitor_ms = 50};
    write_vocab();
    fake_init(&W0, 42);
    fake_init(&W1, 42);
    disc_set("fake0", NULL);
    ck_assert_int_eq(fe_init(&o, &F), 0);
    struct fe_discovery d = {.list = d_list, .open = d_open};
    int n = 0;
    ck_assert_int_eq(fe_discovery_set(F, &d, &n), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(fe_start(F), 0);
    PORT = fe_port(F);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    json_decref(chat("", 200));
    ck_assert_int_eq(atomic_load(&W0.starts), 1);
    /* a worker that registers later is found and used */
    disc_set("fake0", "fake1");
    wait_metric("strata_worker_up{worker=\"fake1\"} 1.000", true);
    /* one that leaves the registry is dropped: new requests go to the other */
    disc_set("fake1", NULL);
    wait_metric("worker=\"fake0\"", false);
    json_decref(chat("", 200));
    json_decref(chat("", 200));
    ck_assert_int_eq(atomic_load(&W0.starts), 1);
    ck_assert_int_eq(atomic_load(&W1.starts), 2);
    /* and taken back when it registers again under its URL */
    disc_set("fake1", "fake0");
    wait_metric("strata_worker_up{worker=\"fake0\"} 1.000", true);
    teardown();
}
END_TEST

/* ---- the CLI chat over the same fake worker -----------------------------------------------------
 */

START_TEST(chat_cli)
{
    write_vocab();
    fake_init(&W0, 42);
    const char *script = "hi\n/reset\nagain\nmore\n/quit\nnever read\n";
    FILE *in = fmemopen((void *)script, strlen(script), "r");
    char *outbuf = NULL;
    size_t outlen = 0;
    FILE *out = open_memstream(&outbuf, &outlen);
    struct chat_opts o = {.in = in, .out = out, .system = "be brief"};
    ck_assert_int_eq(chat_run(&o, &fake_ops, &W0), 0);
    fclose(out);
    fclose(in);
    /* three answers, each followed by its statistics; the reset announced */
    ck_assert_int_eq(atomic_load(&W0.starts), 3);
    const char *p = outbuf;
    for (int i = 0; i < 3; i++) {
        p = strstr(p, REPLY);
        ck_assert_msg(p != NULL, "answer %d missing in: %s", i, outbuf);
        p = strstr(p, "decode ");
        ck_assert_ptr_nonnull(p);
        ck_assert_ptr_nonnull(strstr(p, "tok/s"));
    }
    ck_assert_ptr_nonnull(strstr(outbuf, "(conversation cleared)"));
    /* the last prompt holds the conversation since the reset: system, "again", its answer,
     * "more" */
    struct tok_buf b = {0};
    tok_decode(W0.tok, W0.last_prompt, W0.n_last_prompt, TOK_DECODE_SPECIAL, &b);
    ck_assert_ptr_nonnull(strstr(b.p, "<|im_start|>system\nbe brief<|im_end|>"));
    ck_assert_ptr_null(strstr(b.p, "hi<|im_end|>"));
    ck_assert_ptr_nonnull(
        strstr(b.p, "again<|im_end|>\n<|im_start|>assistant\n" REPLY "<|im_end|>"));
    ck_assert_ptr_nonnull(strstr(b.p, "more<|im_end|>\n<|im_start|>assistant\n"));
    free(b.p);
    free(outbuf);
    fake_fini(&W0);
}
END_TEST

/* ---- hostile clients (issue 32)
 * ------------------------------------------------------------------
 */

/* status_within reads fd's status line within timeout_s: the status, 0 when the server closed
 * without one, -1 when nothing came in time. */
static int status_within(int fd, double timeout_s)
{
    char head[2048];
    size_t n = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (n < 12) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        int ms = (int)(timeout_s * 1000 -
                       ((t.tv_sec - t0.tv_sec) * 1e3 + (t.tv_nsec - t0.tv_nsec) / 1e6));
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (ms <= 0 || poll(&p, 1, ms) <= 0) return -1;
        ssize_t k = read(fd, head + n, sizeof head - 1 - n);
        if (k <= 0) return 0;
        n += (size_t)k;
    }
    head[n] = '\0';
    return atoi(head + 9);
}

/* Slowloris: every connection the frontend serves is held by a client dribbling a head; /health
 * is still answered at once. */
START_TEST(slowloris_health_answered)
{
    struct fe_opts o = {.conn_limit = 8, .monitor_ms = 50};
    start_fe(&o, 1);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    int slow[8];
    for (int i = 0; i < 8; i++) {
        slow[i] = connect_fe();
        ck_assert_int_eq(write(slow[i], "GET /health HTTP/1.1\r\nX-A: ", 27), 27);
    }
    for (int t = 0; t < 6; t++) {
        for (int i = 0; i < 8; i++)
            if (write(slow[i], "a", 1) != 1) {
            } /* one may have been closed by the server */
        usleep(200 * 1000);
    }
    int fd = connect_fe();
    send_req(fd, "GET", "/health", NULL, NULL);
    int st = status_within(fd, 3.0);
    close(fd);
    for (int i = 0; i < 8; i++)
        close(slow[i]);
    ck_assert_msg(st == 200, "/health got %d (-1: no answer in 3 s) with 8 slow clients", st);
    teardown();
}
END_TEST

/* A client that leaves a non-streaming request cancels it, as a stream's does. */
START_TEST(whole_disconnect_cancels)
{
    W0.delay_ms = 100; /* 2 tokens per 100 ms: the answer takes about a second */
    int fd = connect_fe();
    char body[512];
    snprintf(body, sizeof body, chat_body, "");
    send_req(fd, "POST", "/v1/chat/completions", body, NULL);
    for (int i = 0; i < 100 && atomic_load(&W0.starts) == 0; i++)
        usleep(10 * 1000);
    close(fd);
    for (int i = 0; i < 40 && atomic_load(&W0.cancels) == 0; i++)
        usleep(20 * 1000);
    ck_assert_msg(atomic_load(&W0.cancels) == 1, "the request ran on after its client left");
    struct resp r;
    request("GET", "/metrics", NULL, NULL, &r);
    ck_assert_ptr_nonnull(strstr(r.body, "strata_disconnects_total 1"));
    free(r.body);
}
END_TEST

/* A request without the key is refused on its head: the frontend does not wait for (and hold)
 * the body it announced. */
START_TEST(key_checked_before_body)
{
    struct fe_opts o = {.api_key = "sekret", .monitor_ms = 50};
    start_fe(&o, 1);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    int fd = connect_fe();
    const char head[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                        "application/json\r\nContent-Length: 4000000\r\n\r\n";
    ck_assert_int_eq(write(fd, head, sizeof head - 1), (ssize_t)sizeof head - 1);
    int st = status_within(fd, 2.0);
    close(fd);
    ck_assert_msg(st == 401, "got %d (-1: waited for the body) instead of 401", st);
    teardown();
}
END_TEST

/* ---- the web pages, /status, failover by kind ---------------------------------------------------
 */

START_TEST(web_pages)
{
    struct fe_opts o = {.api_key = "sekret", .monitor_ms = 50};
    start_fe(&o, 1);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    struct resp r;
    /* the pages load without the key (they ask for it), with a CSP that forbids inline script */
    static const char *const pages[][2] = {{"/", "<title>strata chat</title>"},
                                           {"/monitor", "<title>strata monitor</title>"},
                                           {"/web/chat.js", "reasoning_content"},
                                           {"/web/common.js", "textContent"},
                                           {"/web/monitor.js", "/status"},
                                           {"/web/app.css", "--accent"}};
    size_t total = 0;
    for (size_t i = 0; i < sizeof pages / sizeof *pages; i++) {
        request("GET", pages[i][0], NULL, NULL, &r);
        ck_assert_msg(r.status == 200, "%s: %d", pages[i][0], r.status);
        ck_assert_msg(strstr(r.body, pages[i][1]), "%s lacks %s", pages[i][0], pages[i][1]);
        ck_assert_ptr_nonnull(strcasestr(r.head, "Content-Security-Policy: default-src 'none'; "
                                                 "script-src 'self'"));
        ck_assert_ptr_nonnull(strcasestr(r.head, "X-Content-Type-Options: nosniff"));
        ck_assert_ptr_nonnull(strcasestr(r.head, i < 2 ? "text/html" : i < 5 ? "text/javascript"
                                                                             : "text/css"));
        total += r.len;
        /* the ETag is the file's hash: a revalidation gets 304 */
        char etag[128], extra[200];
        const char *e = strcasestr(r.head, "ETag: ");
        ck_assert_ptr_nonnull(e);
        sscanf(e + 6, "%127[^\r\n]", etag);
        free(r.body);
        snprintf(extra, sizeof extra, "If-None-Match: %s\r\n", etag);
        request("GET", pages[i][0], NULL, extra, &r);
        ck_assert_int_eq(r.status, 304);
        free(r.body);
    }
    ck_assert_uint_eq(total, fe_web_total_bytes);
    printf("web pages: %zu bytes in all (html, js, css, uncompressed)\n", total);
    request("GET", "/web/nothing.js", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 401); /* not a page: the key is asked first */
    free(r.body);
    request("GET", "/web/nothing.js", NULL, "Authorization: Bearer sekret\r\n", &r);
    ck_assert_int_eq(r.status, 404);
    free(r.body);
    /* the data is not open: /status needs the key */
    request("GET", "/status", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 401);
    free(r.body);
    request("GET", "/status", NULL, "Authorization: Bearer sekret\r\n", &r);
    ck_assert_int_eq(r.status, 200);
    free(r.body);
    teardown();
}
END_TEST

static json_t *get_status(void)
{
    struct resp r;
    request("GET", "/status", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strcasestr(r.head, "Cache-Control: no-store"));
    json_t *j = json_loads(r.body, 0, NULL);
    ck_assert_msg(j != NULL, "not JSON: %s", r.body);
    free(r.body);
    return j;
}

START_TEST(status_json)
{
    atomic_store(&W0.routed, 5);
    json_t *j = get_status();
    ck_assert_str_eq(str_at(j, "object"), "strata.status");
    ck_assert_str_eq(str_at(j, "model.id"), "fakemodel");
    ck_assert(json_is_true(json_object_get(j, "ready")));
    ck_assert_str_eq(str_at(j, "workers.0.name"), "fake0");
    ck_assert_str_eq(str_at(j, "workers.0.backend"), "cpu");
    ck_assert_int_eq(int_at(j, "workers.0.cache_hits"), 300);
    json_int_t gens = int_at(j, "frontend.generations");
    json_decref(j);
    j = NULL;
    /* vram and heat are read while someone watches /status: within a few monitor rounds */
    json_t *heat = NULL;
    for (int i = 0; i < 100 && !json_is_object(heat); i++) {
        usleep(20 * 1000);
        json_decref(j);
        j = get_status();
        heat = json_object_get(json_array_get(json_object_get(j, "workers"), 0), "heat");
    }
    ck_assert_msg(json_is_object(heat), "no heat in /status");
    ck_assert_int_eq(int_at(j, "workers.0.heat.n_layer"), 2);
    ck_assert_int_eq(int_at(j, "workers.0.heat.n_expert"), 4);
    ck_assert_int_eq(int_at(j, "workers.0.heat.counts.1.3"), 20);
    ck_assert_int_eq(int_at(j, "workers.0.vram.weights_bytes"), 1000);
    json_decref(j);
    /* the heat follows the worker's counts, and a generation shows in the counters */
    atomic_store(&W0.routed, 7);
    json_decref(chat("", 200));
    json_int_t c = 0;
    for (int i = 0; i < 100 && c != 28; i++) {
        usleep(20 * 1000);
        j = get_status();
        c = int_at(j, "workers.0.heat.counts.0.3");
        if (c != 28) json_decref(j);
    }
    ck_assert_int_eq(c, 28);
    ck_assert_int_eq(int_at(j, "frontend.generations"), gens + 1);
    ck_assert_int_eq(int_at(j, "frontend.ttft_n"), 1);
    json_decref(j);
}
END_TEST

static struct fake W2;

START_TEST(failover_same_kind)
{
    /* W0 (f32) dies mid-stream with only W1 (f16) beside it: the stream does not move to W1, it
     * keeps polling W0 until it answers again and ends there */
    struct fe_opts o = {.monitor_ms = 50};
    start_pair(&o);
    snprintf(W0.kv_type, sizeof W0.kv_type, "f32");
    snprintf(W1.kv_type, sizeof W1.kv_type, "f16");
    usleep(200 * 1000); /* the monitor's hellos tell the kinds */
    fail_at(&W0, 6, STRATA_ETIMEDOUT);
    pthread_t t;
    pthread_create(&t, NULL, revive, &W0);
    stream_same();
    pthread_join(t, NULL);
    ck_assert_int_eq(atomic_load(&W1.moves_in), 0);
    ck_assert_int_eq(atomic_load(&W1.starts), 0);
    teardown();
    /* with W2 (f32) too, listed after W1 (the first candidate when all are idle), the stream
     * skips W1 and moves to W2 */
    write_vocab();
    fake_init(&W0, 42);
    fake_init(&W1, 42);
    fake_init(&W2, 42);
    snprintf(W0.kv_type, sizeof W0.kv_type, "f32");
    snprintf(W1.kv_type, sizeof W1.kv_type, "f16");
    snprintf(W2.kv_type, sizeof W2.kv_type, "f32");
    ck_assert_int_eq(fe_init(&o, &F), 0);
    ck_assert_int_eq(fe_worker_add(F, &fake_ops, &W0, "fake0"), 0);
    ck_assert_int_eq(fe_worker_add(F, &fake_ops, &W1, "fake1"), 0);
    ck_assert_int_eq(fe_worker_add(F, &fake_ops, &W2, "fake2"), 0);
    ck_assert_int_eq(fe_start(F), 0);
    PORT = fe_port(F);
    ck_assert_int_eq(fe_wait_ready(F, 5000), 0);
    wait_metric("strata_worker_up{worker=\"fake2\"} 1.000", true);
    wait_metric("strata_worker_up{worker=\"fake1\"} 1.000", true);
    fail_at(&W0, 6, STRATA_ETIMEDOUT);
    stream_same();
    ck_assert_int_eq(atomic_load(&W1.moves_in), 0);
    ck_assert_int_eq(atomic_load(&W2.moves_in), 1);
    /* without the rule W1 would have taken it: it does take new requests (any kind may start) */
    json_decref(chat("", 200));
    ck_assert_int_eq(atomic_load(&W1.starts) + atomic_load(&W2.starts), 1);
    teardown();
    fake_fini(&W2);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fe");
    TCase *tc = tcase_create("served");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, chat_whole);
    tcase_add_test(tc, chat_stream);
    tcase_add_test(tc, completion_ids_length);
    tcase_add_test(tc, stop_strings);
    tcase_add_test(tc, logprobs);
    tcase_add_test(tc, errors);
    tcase_add_test(tc, busy_and_down);
    tcase_add_test(tc, endpoints);
    tcase_add_test(tc, disconnect_cancels);
    tcase_add_test(tc, whole_disconnect_cancels);
    tcase_add_test(tc, anthropic_messages);
    tcase_add_test(tc, openai_responses);
    tcase_add_test(tc, props_template_models);
    tcase_add_test(tc, cached_tokens_and_timings);
    tcase_add_test(tc, logprobs_streamed);
    tcase_add_test(tc, n_choices);
    tcase_add_test(tc, status_json);
    suite_add_tcase(s, tc);
    TCase *own = tcase_create("own");
    tcase_set_timeout(own, 30);
    tcase_add_test(own, api_key);
    tcase_add_test(own, reasoning);
    tcase_add_test(own, thinking_blocks);
    tcase_add_test(own, harmony_reasoning_with_and_without_tools);
    tcase_add_test(own, template_sees_tools);
    tcase_add_test(own, n_counts_against_max_active);
    tcase_add_test(own, routing_and_refusal);
    tcase_add_test(own, failover_worker_dies);
    tcase_add_test(own, failover_lost);
    tcase_add_test(own, discovery);
    tcase_add_test(own, chat_cli);
    tcase_add_test(own, slowloris_health_answered);
    tcase_add_test(own, key_checked_before_body);
    tcase_add_test(own, web_pages);
    tcase_add_test(own, failover_same_kind);
    suite_add_tcase(s, own);
    return s;
}

int main(void)
{
    return test_run(suite());
}
