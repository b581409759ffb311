/* ipc — strata's request/reply sockets: an NNG rep0 server with a context pool and a req0 client.
 *
 * Server: a pool of n_ctx nng contexts, each a small state machine (receive -> handler -> send ->
 * receive) driven by its aio callback on nng's threads, so a handler that answers later (a long
 * poll) holds one context and never the others. The handler gets a struct ipc_call and must answer
 * it exactly once with ipc_reply() or ipc_reply_error(), before returning or later from any thread.
 * The server itself answers malformed messages (precheck/decode error reply, logged), the reserved
 * op "ping", and drops messages from peers of another uid by closing their pipe.
 *
 * Hardening for nng 1.5.2 (#1518: a listener stops accepting for good after a connection closes
 * mid-handshake): the server takes an flock on "<socket path>.lock" before listening (a second
 * server fails with STRATA_EBUSY naming the holder), removes a stale socket file only under that
 * lock (so nng never probes it with a connect), chmods the socket 0600, and runs a watchdog thread
 * that pings the server's own URL over a fresh connection every watchdog_ms and re-listens when the
 * ping fails: by default within about a second of the break. A ping that timed out although its
 * connection completed the handshake does not count (the server is slow, the listener works), so
 * a loaded machine does not get its clients' connections closed by a re-listen.
 *
 * Client: one req0 socket per peer; every call opens its own nng context, so any number of threads
 * may call at once. Every wait has a timeout. nng is not fork-safe: open servers and clients only
 * in the process that uses them (in tests: inside the test, never in main or an unchecked fixture).
 */
#ifndef STRATA_IPC_H
#define STRATA_IPC_H

#include "common/ipc/msg.h"

#include <stddef.h>

#define IPC_PING_OP "ping" /* reserved: answered {"v", "ok": true} by the server itself */

struct ipc_server;
struct ipc_call; /* one request being handled: its decoded message and the way to answer it */

/* A handler runs on an nng thread. It returns 0 once it has answered call or handed it to code that
 * will (the deferred reply); or an error code without having answered, and the server then sends an
 * error reply with that code and strata_errdetail() as the message. A handler that may block more
 * than a few milliseconds must defer, because it holds one of nng's few worker threads. */
typedef int (*ipc_handler_fn)(struct ipc_call *call, void *ctx);

struct ipc_server_opts {
    const char *name;        /* for log lines ("arena control"); default: the URL */
    int n_ctx;               /* requests in flight at once (contexts); default 16 */
    size_t recv_max;         /* NNG_OPT_RECVMAXSZ: a larger message drops its connection; default
                                MSG_MAX_BYTES */
    int watchdog_ms;         /* watchdog period; default 500; negative disables it (tests only) */
    int watchdog_timeout_ms; /* how long one watchdog ping may take; default 500 */
};

/* ipc_server_start listens on url (ipc:// only: the hardening needs a path) and serves requests
 * with handler(call, ctx). opts may be NULL for the defaults. The runtime directory must exist (see
 * ipc_runtime_dir). Returns 0 and *out, STRATA_EBUSY when another process holds the socket's lock
 * (the detail names its pid), STRATA_EINVAL for a bad URL or option, STRATA_EPERM, or an errno/nng
 * error with a detail naming the path. */
int ipc_server_start(const char *url, ipc_handler_fn handler, void *ctx,
                     const struct ipc_server_opts *opts, struct ipc_server **out);

/* ipc_server_stop stops the watchdog, closes the socket (no handler starts after it returns),
 * removes the socket file and releases the lock. Blocks until nng's callbacks are done. Calls still
 * awaiting a deferred reply stay valid: ipc_reply on them returns STRATA_ECLOSED. Safe to call
 * twice. */
void ipc_server_stop(struct ipc_server *srv);

/* ipc_server_close stops srv if needed and frees it. No thread may touch a call of srv after it. */
void ipc_server_close(struct ipc_server *srv);

/* ipc_server_relistens counts the watchdog's re-listens since start (for status and tests). */
unsigned ipc_server_relistens(struct ipc_server *srv);

/* ipc_call_msg gives the decoded request (valid until the call is answered); its op is non-NULL. */
struct msg *ipc_call_msg(struct ipc_call *call);

/* ipc_reply finishes b (begun with msg_begin_reply) and sends it as call's answer. b is released
 * and call is consumed whatever happens: it must not be touched after. Returns 0, STRATA_ENOMEM,
 * STRATA_ECLOSED (server stopped), or STRATA_ESTATE (call already answered: a bug in the caller).
 * Never blocks; any thread. */
int ipc_reply(struct ipc_call *call, struct msg_builder *b);

/* ipc_reply_error answers call with an error reply {code, message}; message NULL or "" sends
 * strata_strerror(code). Same ownership and returns as ipc_reply. */
int ipc_reply_error(struct ipc_call *call, int code, const char *message);

/* An op table for ipc_dispatch, ended by an entry with a NULL name. */
struct ipc_op {
    const char *name;
    ipc_handler_fn fn;
};

/* ipc_dispatch runs the entry of ops named by call's op, with ctx. An op not in the table returns
 * STRATA_EUNSUPPORTED (the server answers it) with a detail naming the op. A server's handler is
 * typically `return ipc_dispatch(call, my_ops, ctx);`. */
int ipc_dispatch(struct ipc_call *call, const struct ipc_op *ops, void *ctx);

/* ipc_runtime_dir makes the directory sockets live in and writes its path to out[0..cap): dir as
 * given, or $XDG_RUNTIME_DIR/strata/NAME (/tmp/strata-<uid>/NAME without XDG_RUNTIME_DIR). Missing
 * directories are created 0700; an existing one that is not ours or is open to group or others is
 * refused with STRATA_EPERM (the detail says which and how to fix it). Returns 0, STRATA_EPERM,
 * STRATA_ELIMIT (path too long) or an errno error. */
int ipc_runtime_dir(const char *dir, const char *name, char *out, size_t cap);

/* ipc_url writes "ipc://DIR/SOCK" to out[0..cap); STRATA_ELIMIT if the path exceeds what an AF_UNIX
 * address holds (107 bytes). */
int ipc_url(const char *dir, const char *sock, char *out, size_t cap);

struct ipc_client;

struct ipc_client_opts {
    int reconnect_min_ms; /* NNG_OPT_RECONNMINT; default 100 */
    int reconnect_max_ms; /* NNG_OPT_RECONNMAXT; default 2000 */
    int resend_ms;        /* NNG_OPT_REQ_RESENDTIME: well above the server's longest poll (a few
                             seconds); default 60000 */
    size_t recv_max;      /* NNG_OPT_RECVMAXSZ for replies; default MSG_MAX_BYTES */
};

/* ipc_client_open makes a req0 socket dialing url. The dial does not wait: a server that is not up
 * yet is reached when it comes (calls time out meanwhile). opts may be NULL. Returns 0 and *out, or
 * STRATA_ENNGERR | e with a detail naming the URL. */
int ipc_client_open(const char *url, const struct ipc_client_opts *opts, struct ipc_client **out);

/* ipc_call sends req[0..req_len) and waits at most timeout_ms (> 0) in all for the reply, which it
 * returns in *reply (malloc'd: free() it) and *reply_len. Blocks; any number of threads at once.
 * Returns 0, STRATA_ETIMEDOUT, STRATA_EINVAL, STRATA_ENOMEM or STRATA_ENNGERR | e. */
int ipc_call(struct ipc_client *cli, const void *req, size_t req_len, void **reply,
             size_t *reply_len, int timeout_ms);

/* ipc_request finishes b (a request), calls, and decodes the reply into *reply (which owns the
 * reply bytes: msg_free it). b is released. Returns 0 for a success reply; for an error reply its
 * remote code with the remote message as detail, and *reply holds nothing; or any error of ipc_call
 * or msg_decode. */
int ipc_request(struct ipc_client *cli, struct msg_builder *b, struct msg *reply, int timeout_ms);

/* ipc_client_close closes the socket and frees cli. No call may be in flight or start after it. */
void ipc_client_close(struct ipc_client *cli);

/* ipc_stop_deadline bounds a process's way out: called when it decides to stop, it starts a
 * detached thread that, if the process is still running `seconds` later, logs that who's stop
 * hung and exits with status 1 (_exit: no cleanup that could hang again). nng 1.5.2 can hang an
 * nng_close for good (nng #1498); a process told to stop must stop. Returns 0, or an error (the
 * thread could not start: no deadline, nothing else changes). */
int ipc_stop_deadline(const char *who, int seconds);

#endif
