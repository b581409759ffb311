/* http — the frontend's HTTP server: libmicrohttpd underneath, whole request bodies handed to one
 * handler, answers given whole or streamed, from any thread.
 *
 * The server runs MHD's internal polling (epoll where available) on a pool of `threads` threads,
 * with a connection cap and an idle timeout. A watcher thread guards the cap against clients that
 * hold connections without using them: a request's head and body must arrive whole within
 * request_timeout_s of the moment the connection could send it (a deadline, not an idle timer: a
 * byte every few seconds does not extend it); when the open connections pass 7/8 of conn_limit,
 * the ones that have waited longest without sending a request (at least a second) are closed; and
 * a connection past conn_limit with nothing left to close is answered 503 with Retry-After at once
 * instead of waiting in the listen backlog. A request whose head arrived is first given to
 * precheck (the API key): a refusal is answered without reading the body. The body is then read
 * completely (at most max_body bytes: a larger Content-Length or upload is answered 413 by the
 * server itself) before handler(req, ctx) runs on a pool thread. Every request is logged at its
 * end on one line: method, path, client address, status, time and, when the handler said them
 * (http_set_tokens), the prompt and generated token counts. The handler, or any thread it hands req
 * to, answers exactly once: http_respond (a whole body) or http_stream_begin + http_stream_write...
 * + http_stream_end. An answer given after the handler returned resumes the connection, which MHD
 * keeps suspended meanwhile (a suspended connection never times out, so a long generation is not
 * cut off). Streams use chunked transfer; a stream's writer never blocks on the client. A client
 * that goes away before its answer (a whole answer awaited, or a stream not ended) is reported
 * through the request's on_gone callback (http_on_gone, http_stream_begin), once, and for streams
 * by http_stream_write returning STRATA_ECLOSED. MHD does not watch a suspended connection, so the
 * watcher peeks at each one every 100 ms: end of file or a reset is a client gone (a client that
 * half-closes its side after sending its request reads as gone too). req stays valid until it is
 * answered (whole) or its stream ended.
 */
#ifndef STRATA_HTTP_H
#define STRATA_HTTP_H

#include <stddef.h>
#include <stdint.h>

struct http_server;
struct http_req;

typedef void (*http_handler_fn)(struct http_req *req, void *ctx);

/* http_precheck_fn judges a request on its head alone, before its body is read, on an MHD thread:
 * only the accessors below may be used on req. 0 lets it through; anything else is the status
 * it is answered with at once (connection closed after), with the JSON body it wrote to
 * body[cap]. */
typedef unsigned (*http_precheck_fn)(const struct http_req *req, void *ctx, char *body, size_t cap);

struct http_opts {
    const char *host;           /* numeric address to bind; NULL: 127.0.0.1 ("::" style for IPv6) */
    int port;                   /* 0: any free port (read it back with http_server_port) */
    int threads;                /* MHD pool threads; 0: 4 */
    unsigned conn_limit;        /* connections served at once; more are answered 503; 0: 256 */
    unsigned timeout_s;         /* idle connection timeout; 0: 60 */
    unsigned request_timeout_s; /* deadline for a request's head and body; 0: 30 */
    size_t max_body;            /* request body cap in bytes; 0: 8 MiB */
};

/* http_server_start binds and starts serving; precheck may be NULL. Returns 0 and *out,
 * STRATA_EINVAL for a bad host, STRATA_EIO when MHD cannot start (port taken: the detail names host
 * and port). */
int http_server_start(const struct http_opts *o, http_handler_fn handler, http_precheck_fn precheck,
                      void *ctx, struct http_server **out);

/* http_server_port is the bound port. */
int http_server_port(const struct http_server *s);

/* http_server_stop stops MHD (blocks until its threads are gone) and frees s. Every request handed
 * out must have been answered and every stream ended before (MHD may not stop while a connection
 * is suspended): the caller ends its producers first. NULL is fine. */
void http_server_stop(struct http_server *s);

/* Request accessors (valid until req is answered). The body is NUL-terminated. */
const char *http_method(const struct http_req *r);
const char *http_path(const struct http_req *r);                     /* without the query string */
const char *http_header(const struct http_req *r, const char *name); /* NULL when absent */
const char *http_body(const struct http_req *r, size_t *len);

/* http_respond answers req with status and a whole body (copied), content_type NULL meaning
 * application/json, plus extra headers as "Name", "value" pairs ended by NULL (or extra NULL).
 * req must not be touched after. Returns 0 or STRATA_ENOMEM (req is answered 500 then). */
int http_respond(struct http_req *r, unsigned status, const char *content_type, const char *body,
                 size_t len, const char *const *extra);

/* http_on_gone sets the callback for a client that leaves before req's whole answer: called at most
 * once, from the watcher or an MHD thread under req's lock, never after the answer was given
 * (http_respond) — so it must only set a flag. Call it before handing req to another thread. */
void http_on_gone(struct http_req *r, void (*on_gone)(void *), void *gone_ctx);

/* http_set_tokens puts the prompt and generated token counts on req's log line; before answering.
 */
void http_set_tokens(struct http_req *r, uint32_t n_prompt, uint32_t n_gen);

/* http_stream_begin answers req with status and a body written later, chunk by chunk.
 * on_gone(gone_ctx), when not NULL, is called at most once if the client goes away before
 * http_stream_end, from an MHD thread and under the stream's lock (so never after
 * http_stream_end returned): it must only set a flag. Returns 0 or STRATA_ENOMEM. */
int http_stream_begin(struct http_req *r, unsigned status, const char *content_type,
                      void (*on_gone)(void *), void *gone_ctx);

/* http_stream_write queues data[n] for the client (copied; never blocks). STRATA_ECLOSED when
 * the client is gone, STRATA_ENOMEM. */
int http_stream_write(struct http_req *r, const char *data, size_t n);

/* http_stream_end finishes the body; req must not be touched after. */
void http_stream_end(struct http_req *r);

#endif
