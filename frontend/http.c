/* http — libmicrohttpd under the frontend: whole bodies in, answers whole or streamed from any
 * thread (suspend/resume), disconnects reported to the request's owner, a deadline on every
 * request's head and body, connections shed or refused at the limit, one log line per request. */
#include "frontend/http.h"

#include "common/base/err.h"
#include "common/base/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* Below this age a connection still sending its head is a client that just connected, not one
 * holding a slot: it is never shed for a newcomer (which is refused 503 instead). */
#define SHED_MIN_AGE_S 1.0
#define WATCH_MS       100 /* the watcher's period: deadlines and disconnects are seen this late */

enum conn_phase {
    CONN_HEAD, /* waiting for a request head: just connected, or kept alive after an answer */
    CONN_BODY, /* the head arrived, the body is being read */
    CONN_BUSY, /* the request is with the handler, waits for its answer, or is being answered */
};

/* A connection as the watcher sees it: made and freed by MHD's connection notifications, touched
 * under the server's mu only. */
struct conn {
    struct conn *prev, *next;
    int fd;
    enum conn_phase phase;
    double since;         /* when the current CONN_HEAD phase began (the request's deadline) */
    bool shed;            /* shut down by the watcher: MHD closes it on its next read */
    bool over;            /* came past the limit with nothing to shed: answered 503 at once */
    struct http_req *req; /* in CONN_BUSY, the request (alive until MHD completes it) */
    char addr[INET6_ADDRSTRLEN];
};

struct http_server {
    struct MHD_Daemon *d;
    http_handler_fn handler;
    http_precheck_fn precheck;
    void *ctx;
    size_t max_body;
    int port;
    unsigned limit;     /* connections served; MHD's own cap is higher, so the rest get a 503 */
    double req_timeout; /* seconds for a request's head and body */
    pthread_mutex_t mu; /* conns; taken before any request's mu, never after */
    struct conn *conns; /* oldest first */
    struct conn *last;
    unsigned n_conns, n_shed;
    pthread_t watcher;
    pthread_cond_t cv;
    bool stop;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum req_state {
    RQ_BODY,     /* reading the body */
    RQ_HANDLER,  /* the handler runs */
    RQ_WAIT,     /* handler returned unanswered: connection suspended until an answer comes */
    RQ_ANSWERED, /* a response was queued with MHD */
};

struct http_req {
    pthread_mutex_t mu;
    int refs; /* MHD's request (until the completed callback), the app (until it answers or ends
                 its stream), a streamed response (until MHD frees it) */
    struct http_server *srv;
    struct MHD_Connection *conn;
    char *method, *path;
    char *body;
    size_t body_len, body_cap;
    bool too_big;
    enum req_state state;
    struct MHD_Response *pending; /* an answer given while the handler ran or the conn slept */
    unsigned pending_status;
    /* a streamed answer */
    char *out;
    size_t out_len, out_off, out_cap;
    bool streaming, ended, gone, suspended;
    void (*on_gone)(void *);
    void *gone_ctx;
    /* for the request's log line */
    double t0;
    unsigned status;
    uint32_t n_prompt, n_gen;
    bool tokens;
    char addr[INET6_ADDRSTRLEN];
};

static void req_unref(struct http_req *r)
{
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    if (r->pending) MHD_destroy_response(r->pending);
    pthread_mutex_destroy(&r->mu);
    free(r->method);
    free(r->path);
    free(r->body);
    free(r->out);
    free(r);
}

/* conn_of is the watcher's record of MHD connection mc (NULL when it could not be made). */
static struct conn *conn_of(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

static void conn_phase(struct http_server *s, struct MHD_Connection *mc, enum conn_phase ph,
                       struct http_req *r)
{
    struct conn *c = conn_of(mc);
    if (!c) return;
    pthread_mutex_lock(&s->mu);
    c->phase = ph;
    c->req = r;
    if (ph == CONN_HEAD) c->since = now_s();
    pthread_mutex_unlock(&s->mu);
}

/* shed shuts c down (mu held): MHD reads EOF and closes it, notifying as for any close. */
static void shed(struct http_server *s, struct conn *c, const char *why)
{
    shutdown(c->fd, SHUT_RDWR);
    c->shed = true;
    s->n_shed++;
    LOG_DEBUG("http: closed the connection from %s: %s", c->addr, why);
}

/* shed_oldest sheds the connection that has waited longest for a request head, at least
 * SHED_MIN_AGE_S, other than keep (mu held). O(n) scan: fine below a few thousand connections.
 * false when there is none. */
static bool shed_oldest(struct http_server *s, const struct conn *keep, double now)
{
    struct conn *old = NULL;
    for (struct conn *c = s->conns; c; c = c->next)
        if (c != keep && !c->shed && c->phase == CONN_HEAD && now - c->since >= SHED_MIN_AGE_S &&
            (!old || c->since < old->since))
            old = c;
    if (old) shed(s, old, "the connection limit is near and it had sent no request");
    return old != NULL;
}

static void on_conn(void *cls, struct MHD_Connection *mc, void **socket_context,
                    enum MHD_ConnectionNotificationCode code)
{
    struct http_server *s = cls;
    struct conn *c = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (!c) return;
        pthread_mutex_lock(&s->mu);
        *(c->prev ? &c->prev->next : &s->conns) = c->next;
        *(c->next ? &c->next->prev : &s->last) = c->prev;
        s->n_conns--;
        if (c->shed) s->n_shed--;
        pthread_mutex_unlock(&s->mu);
        free(c);
        *socket_context = NULL;
        return;
    }
    if (!(c = calloc(1, sizeof *c))) return; /* unwatched: MHD's idle timeout still applies */
    const union MHD_ConnectionInfo *fd =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ad =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    c->fd = fd ? fd->connect_fd : -1;
    if (ad && ad->client_addr->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ad->client_addr)->sin6_addr, c->addr,
                  sizeof c->addr);
    else if (ad && ad->client_addr->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)ad->client_addr)->sin_addr, c->addr,
                  sizeof c->addr);
    c->phase = CONN_HEAD;
    c->since = now_s();
    pthread_mutex_lock(&s->mu);
    c->prev = s->last;
    *(s->last ? &s->last->next : &s->conns) = c;
    s->last = c;
    s->n_conns++;
    if (s->n_conns - s->n_shed > s->limit && !shed_oldest(s, c, c->since)) c->over = true;
    pthread_mutex_unlock(&s->mu);
    *socket_context = c;
}

/* check_gone notices a client that closed its connection while its request waits for an answer
 * or its stream for the next chunk: MHD watches no suspended connection. A peek that reads EOF
 * or a reset is a client gone; bytes (a pipelined request) are not. Both locks held. */
static void check_gone(struct conn *c, struct http_req *r)
{
    bool waiting = r->state == RQ_WAIT && !r->pending;
    bool sleeping = r->streaming && r->suspended && !r->ended;
    if (r->gone || !(waiting || sleeping) || c->fd < 0) return;
    char b;
    ssize_t k = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k > 0 || (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) return;
    r->gone = true;
    if (r->on_gone) r->on_gone(r->gone_ctx);
    LOG_DEBUG("http: client %s of %s left before its answer", c->addr, r->path);
}

/* watch_main enforces the request deadline, sheds the oldest idle connections when the limit is
 * near (7/8 of it) and reports clients that left their suspended requests. */
static void *watch_main(void *arg)
{
    struct http_server *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WATCH_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        double now = now_s();
        for (struct conn *c = s->conns; c; c = c->next) {
            if (c->shed) continue;
            if (c->phase != CONN_BUSY && now - c->since > s->req_timeout) {
                shed(s, c,
                     c->phase == CONN_HEAD
                         ? "no whole request head within the request timeout"
                         : "its request body did not arrive within the request timeout");
            } else if (c->phase == CONN_BUSY && c->req) {
                pthread_mutex_lock(&c->req->mu);
                check_gone(c, c->req);
                pthread_mutex_unlock(&c->req->mu);
            }
        }
        unsigned near = s->limit - s->limit / 8;
        while (s->n_conns - s->n_shed > near && shed_oldest(s, NULL, now))
            ;
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* queue_plain answers from inside MHD (413, 503, a precheck's refusal), without the handler;
 * close asks MHD to close the connection after it. */
static enum MHD_Result queue_plain(struct http_req *r, struct MHD_Connection *c, unsigned status,
                                   const char *body, bool close)
{
    r->state = RQ_ANSWERED;
    r->status = status;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (status == 503 || status == 429) MHD_add_response_header(resp, "Retry-After", "1");
    if (close) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static const char too_many[] =
    "{\"error\":{\"message\":\"the server has as many connections open as it serves "
    "(--conn-limit): "
    "retry in a second\",\"type\":\"server_error\",\"param\":null,\"code\":"
    "\"too_many_connections\"}}";

static const char body_too_big[] =
    "{\"error\":{\"message\":\"request body is larger than the server's limit (--max-body): send "
    "a smaller request or raise the limit\",\"type\":\"invalid_request_error\",\"param\":null,"
    "\"code\":\"body_too_large\"}}";

/* take_pending hands back the answer stored in r (lock held); the caller queues it after unlocking,
 * because MHD locks the response while it calls stream_read, which takes r's lock. */
static struct MHD_Response *take_pending(struct http_req *r, unsigned *status)
{
    struct MHD_Response *resp = r->pending;
    *status = r->status = r->pending_status;
    r->pending = NULL;
    r->state = RQ_ANSWERED;
    return resp;
}

/* queue sends a taken answer (no lock held). */
static enum MHD_Result queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *resp)
{
    if (!resp) return MHD_YES;
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls)
{
    struct http_server *s = cls;
    struct http_req *r = *con_cls;
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        pthread_mutex_init(&r->mu, NULL);
        r->refs = 1;
        r->srv = s;
        r->conn = conn;
        r->method = strdup(method);
        r->path = strdup(url);
        r->t0 = now_s();
        *con_cls = r;
        if (!r->method || !r->path) return MHD_NO;
        struct conn *c = conn_of(conn);
        bool over = false;
        if (c) {
            pthread_mutex_lock(&s->mu);
            memcpy(r->addr, c->addr, sizeof r->addr);
            over = c->over;
            c->phase = CONN_BODY;
            pthread_mutex_unlock(&s->mu);
        }
        if (over) {
            conn_phase(s, conn, CONN_BUSY, NULL);
            return queue_plain(r, conn, MHD_HTTP_SERVICE_UNAVAILABLE, too_many, true);
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->max_body) {
            conn_phase(s, conn, CONN_BUSY, NULL);
            return queue_plain(r, conn, MHD_HTTP_CONTENT_TOO_LARGE, body_too_big, false);
        }
        char refusal[1024];
        unsigned st = s->precheck ? s->precheck(r, s->ctx, refusal, sizeof refusal) : 0;
        if (st) { /* refused on its head: the body (up to max_body) is never read */
            conn_phase(s, conn, CONN_BUSY, NULL);
            return queue_plain(r, conn, st, refusal, true);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (r->too_big || r->body_len + n > s->max_body) {
            r->too_big = true; /* chunked upload past the cap: drain it, answer 413 at the end */
            return MHD_YES;
        }
        if (r->body_len + n + 1 > r->body_cap) {
            size_t cap = r->body_cap ? r->body_cap : 4096;
            while (cap < r->body_len + n + 1)
                cap *= 2;
            char *p = realloc(r->body, cap);
            if (!p) return MHD_NO;
            r->body = p;
            r->body_cap = cap;
        }
        memcpy(r->body + r->body_len, upload, n);
        r->body_len += n;
        r->body[r->body_len] = '\0';
        return MHD_YES;
    }
    pthread_mutex_lock(&r->mu);
    struct MHD_Response *resp = NULL;
    unsigned status = 0;
    if (r->state == RQ_BODY) {
        if (r->too_big) {
            pthread_mutex_unlock(&r->mu);
            conn_phase(s, conn, CONN_BUSY, NULL);
            return queue_plain(r, conn, MHD_HTTP_CONTENT_TOO_LARGE, body_too_big, false);
        }
        if (!r->body && !(r->body = calloc(1, 1))) {
            pthread_mutex_unlock(&r->mu);
            return MHD_NO;
        }
        r->state = RQ_HANDLER;
        r->refs++; /* the app's */
        pthread_mutex_unlock(&r->mu);
        conn_phase(s, conn, CONN_BUSY, r);
        s->handler(r, s->ctx);
        pthread_mutex_lock(&r->mu);
        if (r->pending) {
            resp = take_pending(r, &status);
        } else if (r->state == RQ_HANDLER) {
            r->state = RQ_WAIT;
            MHD_suspend_connection(conn);
        }
    } else if (r->state == RQ_WAIT && r->pending) {
        resp = take_pending(r, &status);
    }
    pthread_mutex_unlock(&r->mu);
    return queue(conn, status, resp);
}

/* log_request writes the request's line, as llama-server does: method, path, client, status,
 * time, tokens (when the handler told them). */
static void log_request(const struct http_req *r, enum MHD_RequestTerminationCode toe)
{
    char toks[96] = "";
    if (r->tokens)
        snprintf(toks, sizeof toks, ", prompt %u tokens, generated %u", r->n_prompt, r->n_gen);
    const char *end = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? ""
                      : toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED
                          ? " (timed out)"
                          : " (the connection closed before the answer was sent)";
    char st[16] = "-"; /* no status: closed before any answer */
    if (r->status) snprintf(st, sizeof st, "%u", r->status);
    LOG_INFO("request: %s %s %s %s %.1f ms%s%s", r->method, r->path, r->addr[0] ? r->addr : "-", st,
             (now_s() - r->t0) * 1e3, toks, end);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct http_server *s = cls;
    struct http_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    conn_phase(s, conn, CONN_HEAD, NULL); /* kept alive: the next request's deadline starts */
    log_request(r, toe);
    pthread_mutex_lock(&r->mu);
    bool open = r->streaming ? !r->ended : !r->pending && r->state != RQ_ANSWERED;
    if (open && !r->gone && (r->streaming || r->on_gone)) {
        r->gone = true;
        if (r->on_gone) r->on_gone(r->gone_ctx);
        LOG_DEBUG("http: client of %s left before its answer ended (termination %d)", r->path,
                  (int)toe);
    }
    r->conn = NULL;
    pthread_mutex_unlock(&r->mu);
    req_unref(r);
}

/* answer stores resp as r's answer; queued at once when the handler still runs, else the
 * suspended connection is resumed and on_access queues it. Consumes the app's reference. */
static void answer(struct http_req *r, unsigned status, struct MHD_Response *resp)
{
    pthread_mutex_lock(&r->mu);
    r->pending = resp;
    r->pending_status = r->status = status;
    if (r->state == RQ_WAIT) MHD_resume_connection(r->conn);
    pthread_mutex_unlock(&r->mu);
}

int http_respond(struct http_req *r, unsigned status, const char *content_type, const char *body,
                 size_t len, const char *const *extra)
{
    int rv = 0;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) {
        rv = strata_errf(STRATA_ENOMEM, "http: response of %zu bytes", len);
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":null}}";
        resp = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        content_type = NULL;
        extra = NULL;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            content_type ? content_type : "application/json");
    for (size_t i = 0; extra && extra[i] && extra[i + 1]; i += 2)
        MHD_add_response_header(resp, extra[i], extra[i + 1]);
    answer(r, status, resp);
    req_unref(r);
    return rv;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct http_req *r = cls;
    pthread_mutex_lock(&r->mu);
    ssize_t n;
    if (r->out_len > r->out_off) {
        size_t k = r->out_len - r->out_off < max ? r->out_len - r->out_off : max;
        memcpy(buf, r->out + r->out_off, k);
        r->out_off += k;
        if (r->out_off == r->out_len) r->out_off = r->out_len = 0;
        n = (ssize_t)k;
    } else if (r->ended) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        /* nothing yet: sleep until http_stream_write or _end resumes us (returning 0 without
         * suspending would spin MHD's thread) */
        r->suspended = true;
        MHD_suspend_connection(r->conn);
        n = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

static void stream_free(void *cls)
{
    struct http_req *r = cls;
    pthread_mutex_lock(&r->mu);
    if (!r->ended && !r->gone) {
        r->gone = true;
        if (r->on_gone) r->on_gone(r->gone_ctx);
    }
    pthread_mutex_unlock(&r->mu);
    req_unref(r);
}

void http_on_gone(struct http_req *r, void (*on_gone)(void *), void *gone_ctx)
{
    pthread_mutex_lock(&r->mu);
    r->on_gone = on_gone;
    r->gone_ctx = gone_ctx;
    pthread_mutex_unlock(&r->mu);
}

void http_set_tokens(struct http_req *r, uint32_t n_prompt, uint32_t n_gen)
{
    pthread_mutex_lock(&r->mu);
    r->n_prompt = n_prompt;
    r->n_gen = n_gen;
    r->tokens = true;
    pthread_mutex_unlock(&r->mu);
}

int http_stream_begin(struct http_req *r, unsigned status, const char *content_type,
                      void (*on_gone)(void *), void *gone_ctx)
{
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, r, stream_free);
    if (!resp) return strata_errf(STRATA_ENOMEM, "http: stream response");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    pthread_mutex_lock(&r->mu);
    r->refs++; /* the response's, dropped by stream_free */
    r->streaming = true;
    r->on_gone = on_gone;
    r->gone_ctx = gone_ctx;
    pthread_mutex_unlock(&r->mu);
    answer(r, status, resp);
    return 0;
}

/* wake resumes a connection that stream_read put to sleep (lock held). */
static void wake(struct http_req *r)
{
    if (r->suspended && r->conn) {
        r->suspended = false;
        MHD_resume_connection(r->conn);
    }
}

int http_stream_write(struct http_req *r, const char *data, size_t n)
{
    int rv = 0;
    pthread_mutex_lock(&r->mu);
    if (r->gone) {
        rv = STRATA_ECLOSED;
        goto out;
    }
    if (r->out_len + n > r->out_cap) {
        size_t cap = r->out_cap ? r->out_cap : 4096;
        while (cap < r->out_len + n)
            cap *= 2;
        char *p = realloc(r->out, cap);
        if (!p) {
            rv = strata_errf(STRATA_ENOMEM, "http: stream buffer of %zu bytes", cap);
            goto out;
        }
        r->out = p;
        r->out_cap = cap;
    }
    memcpy(r->out + r->out_len, data, n);
    r->out_len += n;
    wake(r);
out:
    pthread_mutex_unlock(&r->mu);
    return rv;
}

void http_stream_end(struct http_req *r)
{
    pthread_mutex_lock(&r->mu);
    r->ended = true;
    wake(r);
    pthread_mutex_unlock(&r->mu);
    req_unref(r);
}

const char *http_method(const struct http_req *r)
{
    return r->method;
}

const char *http_path(const struct http_req *r)
{
    return r->path;
}

const char *http_header(const struct http_req *r, const char *name)
{
    return r->conn ? MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name) : NULL;
}

const char *http_body(const struct http_req *r, size_t *len)
{
    if (len) *len = r->body_len;
    return r->body;
}

/* mhd_log sends MHD's messages (mostly clients that left) to the debug log instead of stderr. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    if (strata_log_level() < STRATA_LOG_DEBUG) return;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    LOG_DEBUG("http: %s", buf);
}

int http_server_start(const struct http_opts *o, http_handler_fn handler, http_precheck_fn precheck,
                      void *ctx, struct http_server **out)
{
    const char *host = o->host ? o->host : "127.0.0.1";
    struct sockaddr_in6 a6 = {0};
    struct sockaddr_in a4 = {0};
    const struct sockaddr *sa;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    if (o->port < 0 || o->port > 65535)
        return strata_errf(STRATA_EINVAL, "http: port %d is outside 0..65535", o->port);
    if (strchr(host, ':')) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)o->port);
        if (inet_pton(AF_INET6, host, &a6.sin6_addr) != 1) goto bad_host;
        sa = (const struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)o->port);
        if (inet_pton(AF_INET, host, &a4.sin_addr) != 1) goto bad_host;
        sa = (const struct sockaddr *)&a4;
    }
    struct http_server *s = calloc(1, sizeof *s);
    if (!s) return strata_errf(STRATA_ENOMEM, "http: server");
    s->handler = handler;
    s->precheck = precheck;
    s->ctx = ctx;
    s->max_body = o->max_body ? o->max_body : 8u << 20;
    s->limit = o->conn_limit ? o->conn_limit : 256u;
    s->req_timeout = o->request_timeout_s ? o->request_timeout_s : 30u;
    unsigned threads = (unsigned)(o->threads > 0 ? o->threads : 4);
    /* MHD's own cap sits above ours: a connection past our limit still gets its 503 at once
     * instead of waiting in the listen backlog (MHD stops accepting at its cap, and splits the
     * cap between its threads). */
    unsigned room = s->limit / 4 > 16 ? s->limit / 4 : 16;
    unsigned mhd_limit = (s->limit + room + threads - 1) / threads * threads;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_access, s,
                            MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_THREAD_POOL_SIZE, threads,
                            MHD_OPTION_CONNECTION_LIMIT, mhd_limit, MHD_OPTION_CONNECTION_TIMEOUT,
                            o->timeout_s ? o->timeout_s : 60u, MHD_OPTION_NOTIFY_COMPLETED,
                            on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_conn, s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    int rv = s->d ? pthread_create(&s->watcher, NULL, watch_main, s) : 0;
    if (rv != 0) {
        MHD_stop_daemon(s->d);
        s->d = NULL;
    }
    if (!s->d) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        if (rv != 0) return strata_errf(strata_errno(rv), "http: cannot start the watcher thread");
        return strata_errf(STRATA_EIO,
                           "http: cannot listen on %s port %d (in use, or not an address of this "
                           "machine): pick another --host/--port",
                           host, o->port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : o->port;
    *out = s;
    return 0;
bad_host:
    return strata_errf(STRATA_EINVAL, "http: --host '%s' is not a numeric IPv4 or IPv6 address",
                       host);
}

int http_server_port(const struct http_server *s)
{
    return s->port;
}

void http_server_stop(struct http_server *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->watcher, NULL);
    MHD_stop_daemon(s->d);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
