/* http — libmicrohttpd under the frontend: whole bodies in, answers whole or streamed from any
 * thread (suspend/resume), disconnects reported to the stream's owner. */
#include "frontend/http.h"

#include "common/base/err.h"
#include "common/base/log.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct http_server {
    struct MHD_Daemon *d;
    http_handler_fn handler;
    void *ctx;
    size_t max_body;
    int port;
};

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

/* queue_plain answers from inside MHD (413), without the handler. */
static enum MHD_Result queue_plain(struct MHD_Connection *c, unsigned status, const char *body)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

static const char body_too_big[] =
    "{\"error\":{\"message\":\"request body is larger than the server's limit (--max-body): send "
    "a smaller request or raise the limit\",\"type\":\"invalid_request_error\",\"param\":null,"
    "\"code\":\"body_too_large\"}}";

/* take_pending hands back the answer stored in r (lock held); the caller queues it after unlocking,
 * because MHD locks the response while it calls stream_read, which takes r's lock. */
static struct MHD_Response *take_pending(struct http_req *r, unsigned *status)
{
    struct MHD_Response *resp = r->pending;
    *status = r->pending_status;
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
        *con_cls = r;
        if (!r->method || !r->path) return MHD_NO;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->max_body) {
            r->state = RQ_ANSWERED;
            return queue_plain(conn, MHD_HTTP_CONTENT_TOO_LARGE, body_too_big);
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
            r->state = RQ_ANSWERED;
            pthread_mutex_unlock(&r->mu);
            return queue_plain(conn, MHD_HTTP_CONTENT_TOO_LARGE, body_too_big);
        }
        if (!r->body && !(r->body = calloc(1, 1))) {
            pthread_mutex_unlock(&r->mu);
            return MHD_NO;
        }
        r->state = RQ_HANDLER;
        r->refs++; /* the app's */
        pthread_mutex_unlock(&r->mu);
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

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct http_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->streaming && !r->ended && !r->gone) {
        r->gone = true;
        if (r->on_gone) r->on_gone(r->gone_ctx);
        LOG_DEBUG("http: client of %s left mid-stream (termination %d)", r->path, (int)toe);
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
    r->pending_status = status;
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

int http_server_start(const struct http_opts *o, http_handler_fn handler, void *ctx,
                      struct http_server **out)
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
    s->ctx = ctx;
    s->max_body = o->max_body ? o->max_body : 8u << 20;
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_access, s,
                            MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_THREAD_POOL_SIZE,
                            (unsigned)(o->threads > 0 ? o->threads : 4),
                            MHD_OPTION_CONNECTION_LIMIT, o->conn_limit ? o->conn_limit : 256u,
                            MHD_OPTION_CONNECTION_TIMEOUT, o->timeout_s ? o->timeout_s : 60u,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (!s->d) {
        free(s);
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
    MHD_stop_daemon(s->d);
    free(s);
}
