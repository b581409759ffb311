#include "common/ipc/ipc.h"

#include "common/base/err.h"
#include "common/base/own.h"
#include "common/base/log.h"

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define URL_PREFIX  "ipc://"
#define PATH_MAX_UN (sizeof(((struct sockaddr_un *)0)->sun_path) - 1) /* 107 on Linux */

/* ---- server ---- */

enum call_state {
    CALL_IDLE, /* no operation: not started yet, or the server stopped */
    CALL_RECV, /* waiting for a request */
    CALL_BUSY, /* the handler (or whoever it deferred to) owes an answer */
    CALL_SEND, /* the answer is being sent */
};

struct ipc_call {
    struct ipc_server *srv;
    nng_ctx ctx;
    nng_aio *aio;
    enum call_state state; /* under srv->mtx */
    uint64_t gen;          /* requests received on this context; tells a stale answer apart */
    nng_msg *req;          /* the request while BUSY: msg's bin fields point into it */
    struct msg msg;        /* the decoded request while BUSY */
};

struct ipc_server {
    char url[sizeof URL_PREFIX + PATH_MAX_UN];
    const char *path; /* inside url */
    char name[128];
    ipc_handler_fn handler;
    void *hctx;
    struct ipc_server_opts opts;
    nng_socket sock;
    bool sock_open;
    nng_listener listener; /* replaced by the watchdog's re-listen */
    int lock_fd;
    pthread_mutex_t mtx;
    pthread_cond_t cv;  /* wakes the watchdog on stop; signals n_replying reaching 0 */
    bool stopping;      /* under mtx: no new sends, no new receives */
    bool stopped;       /* ipc_server_stop finished */
    int n_replying;     /* under mtx: answers between their decision and nng_ctx_send */
    unsigned relistens; /* under mtx */
    atomic_uint pipes;  /* connections whose handshake completed (the listener works) */
    pthread_t watchdog;
    bool watchdog_running;
    struct ipc_call *calls;
    int n_calls;
};

static void start_recv(struct ipc_call *c)
{
    struct ipc_server *srv = c->srv;
    pthread_mutex_lock(&srv->mtx);
    bool stop = srv->stopping;
    c->state = stop ? CALL_IDLE : CALL_RECV;
    pthread_mutex_unlock(&srv->mtx);
    if (!stop) nng_ctx_recv(c->ctx, c->aio);
}

/* answer sends buf (taken over) as c's reply if c still owes the answer to request generation *gen
 * (gen NULL: whatever request c holds). Decide under the lock, send after unlocking; n_replying
 * keeps ipc_server_stop from closing the socket between the two. */
static int answer(struct ipc_call *c, const uint64_t *gen, void *buf, size_t len)
{
    struct ipc_server *srv = c->srv;
    nng_msg *rep = NULL;
    int rv;
    pthread_mutex_lock(&srv->mtx);
    if (c->state != CALL_BUSY || (gen && *gen != c->gen)) {
        pthread_mutex_unlock(&srv->mtx);
        free(buf);
        return strata_errf(STRATA_ESTATE, "ipc %s: a call was answered twice (a handler bug)",
                           srv->name);
    }
    if (srv->stopping) {
        c->state = CALL_IDLE;
        pthread_mutex_unlock(&srv->mtx);
        msg_free(&c->msg);
        nng_msg_free(c->req);
        c->req = NULL;
        free(buf);
        return strata_errf(STRATA_ECLOSED, "ipc %s: server stopped before the answer", srv->name);
    }
    c->state = CALL_SEND;
    srv->n_replying++;
    pthread_mutex_unlock(&srv->mtx);

    msg_free(&c->msg);
    nng_msg_free(c->req);
    c->req = NULL;
    if ((rv = nng_msg_alloc(&rep, 0)) != 0 || (rv = nng_msg_append(rep, buf, len)) != 0) {
        /* the client gets no answer; its request times out or is resent */
        rv = strata_errf(STRATA_ENOMEM, "ipc %s: no memory for a %zu-byte reply", srv->name, len);
        if (rep) nng_msg_free(rep);
        start_recv(c);
    } else {
        nng_aio_set_msg(c->aio, rep);
        nng_ctx_send(c->ctx, c->aio);
    }
    free(buf);
    pthread_mutex_lock(&srv->mtx);
    if (--srv->n_replying == 0) pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mtx);
    return rv;
}

static int answer_error(struct ipc_call *c, const uint64_t *gen, int code, const char *message)
{
    void *buf;
    size_t len;
    int rv = msg_error_reply(code, message, &buf, &len);
    if (rv != 0) return rv;
    return answer(c, gen, buf, len);
}

int ipc_reply(struct ipc_call *call, struct msg_builder *b)
{
    void *buf;
    size_t len;
    int rv = msg_finish(b, &buf, &len);
    if (rv != 0) {
        /* still answer, so the client is not left waiting for a reply that cannot be built */
        answer_error(call, NULL, rv, "the server could not build its reply");
        return rv;
    }
    return answer(call, NULL, buf, len);
}

int ipc_reply_error(struct ipc_call *call, int code, const char *message)
{
    return answer_error(call, NULL, code, message);
}

struct msg *ipc_call_msg(struct ipc_call *call)
{
    return &call->msg;
}

/* peer_ok checks that the message came from a process of our own uid; a stranger's pipe is closed
 * (no reply: it should never have reached a 0600 socket in a 0700 directory). */
static bool peer_ok(struct ipc_server *srv, nng_msg *m)
{
    nng_pipe p = nng_msg_get_pipe(m);
    uint64_t uid = 0;
    int rv = nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid);
    if (rv == 0 && uid == (uint64_t)geteuid()) return true;
    if (rv != 0)
        LOG_WARN("ipc %s: cannot read a peer's uid (%s): dropping its connection", srv->name,
                 nng_strerror(rv));
    else
        LOG_WARN("ipc %s: dropping a connection from uid %llu (this server runs as uid %u)",
                 srv->name, (unsigned long long)uid, (unsigned)geteuid());
    nng_pipe_close(p);
    return false;
}

/* handle runs on an nng thread for a received request. */
static void handle(struct ipc_call *c, nng_msg *req)
{
    struct ipc_server *srv = c->srv;
    uint64_t gen;
    int rv;
    pthread_mutex_lock(&srv->mtx);
    c->state = CALL_BUSY;
    c->req = req;
    gen = ++c->gen;
    pthread_mutex_unlock(&srv->mtx);

    if ((rv = msg_decode(nng_msg_body(req), nng_msg_len(req), &c->msg)) != 0) {
        LOG_WARN("ipc %s: refused a malformed request of %zu bytes: %s", srv->name,
                 nng_msg_len(req), strata_errdetail());
        answer_error(c, &gen, rv, strata_errdetail());
        return;
    }
    if (!c->msg.op) {
        LOG_WARN("ipc %s: refused a reply sent as a request", srv->name);
        answer_error(c, &gen, STRATA_EPROTO, "expected a request (a map with 'op'), got a reply");
        return;
    }
    if (strcmp(c->msg.op, IPC_PING_OP) == 0) {
        struct msg_builder b;
        msg_begin_reply(&b);
        ipc_reply(c, &b);
        return;
    }
    char op[72]; /* the msg is gone once answered, the log line below may still need the op */
    snprintf(op, sizeof op, "%s", c->msg.op);
    strata_errclear();
    rv = srv->handler(c, srv->hctx);
    if (rv == 0) return;
    char detail[512];
    snprintf(detail, sizeof detail, "%s", strata_errdetail());
    if (answer_error(c, &gen, rv, detail) == STRATA_ESTATE)
        LOG_WARN("ipc %s: handler of '%s' failed after answering: %s", srv->name, op, detail);
}

static void call_cb(void *arg)
{
    struct ipc_call *c = arg;
    struct ipc_server *srv = c->srv;
    int rv = nng_aio_result(c->aio);
    pthread_mutex_lock(&srv->mtx);
    enum call_state state = c->state;
    pthread_mutex_unlock(&srv->mtx);

    if (state == CALL_SEND) {
        nng_msg *unsent = rv != 0 ? nng_aio_get_msg(c->aio) : NULL;
        if (rv != 0) {
            if (unsent) nng_msg_free(unsent);
            if (rv != NNG_ECLOSED)
                LOG_DEBUG("ipc %s: a reply was not sent: %s", srv->name, nng_strerror(rv));
        }
        start_recv(c);
        return;
    }
    if (rv == NNG_ECLOSED || rv == NNG_ECANCELED) {
        pthread_mutex_lock(&srv->mtx);
        c->state = CALL_IDLE;
        pthread_mutex_unlock(&srv->mtx);
        return;
    }
    if (rv != 0) {
        LOG_WARN("ipc %s: receive failed: %s", srv->name, nng_strerror(rv));
        start_recv(c);
        return;
    }
    nng_msg *req = nng_aio_get_msg(c->aio);
    if (!peer_ok(srv, req)) {
        nng_msg_free(req);
        start_recv(c);
        return;
    }
    handle(c, req);
}

int ipc_dispatch(struct ipc_call *call, const struct ipc_op *ops, void *ctx)
{
    const char *op = call->msg.op;
    char known[256] = "";
    size_t k = 0;
    for (const struct ipc_op *o = ops; o->name; o++) {
        if (strcmp(o->name, op) == 0) return o->fn(call, ctx);
        if (k < sizeof known)
            k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", k ? ", " : "", o->name);
    }
    return strata_errf(STRATA_EUNSUPPORTED,
                       "op '%s' is not supported by this server (it knows: %s)", op, known);
}

/* take_lock flocks "<path>.lock" so one server owns the socket path. The lock file is never
 * removed: unlinking it could let two processes hold locks on different inodes of the same name. */
static int take_lock(struct ipc_server *srv)
{
    char lock[sizeof srv->url + 8];
    snprintf(lock, sizeof lock, "%s.lock", srv->path);
    int fd, rv;
    if ((rv = own_open(lock, O_RDWR | O_CREAT, 0600, false, &fd)) != 0) return rv;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        close(fd);
        if (e != EWOULDBLOCK)
            return strata_errf(strata_errno(e), "cannot lock %s: %s", lock, strerror(e));
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        return strata_errf(STRATA_EBUSY,
                           "%s is already served by pid %s (it holds %s): stop that server or use "
                           "another runtime directory",
                           srv->path, pid[0] ? pid : "(unknown)", lock);
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        LOG_WARN("ipc %s: cannot write our pid into %s: %s", srv->name, lock, strerror(errno));
    srv->lock_fd = fd;
    return 0;
}

/* listen_now starts a listener on srv's URL. The caller holds the lock file, so a socket file left
 * at the path is stale and removed here: nng would otherwise probe it with a connect of its own. */
static int listen_now(struct ipc_server *srv)
{
    int rv;
    nng_listener l;
    if (unlink(srv->path) != 0 && errno != ENOENT)
        return strata_errf(strata_errno(errno), "cannot remove stale socket %s: %s", srv->path,
                           strerror(errno));
    if ((rv = nng_listener_create(&l, srv->sock, srv->url)) != 0)
        return strata_errf(STRATA_ENNGERR | rv, "cannot listen on %s: %s", srv->url,
                           nng_strerror(rv));
    if ((rv = nng_listener_start(l, 0)) != 0) {
        nng_listener_close(l);
        return strata_errf(STRATA_ENNGERR | rv, "cannot listen on %s: %s", srv->url,
                           nng_strerror(rv));
    }
    if (chmod(srv->path, 0600) != 0) {
        int e = errno;
        nng_listener_close(l);
        return strata_errf(strata_errno(e), "cannot chmod 0600 socket %s: %s", srv->path,
                           strerror(e));
    }
    srv->listener = l;
    return 0;
}

static int64_t now_ms(void);

/* after a ping's timeout, how long its connection may still take to be attached */
#define PING_GRACE_MS 1500

/* xfer sends out[0..n_out) on the non-blocking socket fd and receives exactly n_in bytes into in,
 * both by deadline (ms, now_ms's clock). Returns 0, STRATA_ETIMEDOUT or STRATA_ECLOSED. */
static int xfer(int fd, const void *out, size_t n_out, void *in, size_t n_in, int64_t deadline)
{
    size_t sent = 0, have = 0;
    while (sent < n_out || have < n_in) {
        const int64_t left = deadline - now_ms();
        if (left <= 0) return STRATA_ETIMEDOUT;
        struct pollfd p = {.fd = fd,
                           .events = (have < n_in ? POLLIN : 0) | (sent < n_out ? POLLOUT : 0)};
        int n = poll(&p, 1, (int)left);
        if (n <= 0) continue; /* EINTR, or the time is up: checked above */
        if (sent < n_out && (p.revents & POLLOUT)) {
            ssize_t w = send(fd, (const uint8_t *)out + sent, n_out - sent, MSG_NOSIGNAL);
            if (w > 0)
                sent += (size_t)w;
            else if (errno != EAGAIN && errno != EINTR)
                return STRATA_ECLOSED;
        }
        if (have < n_in && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t r = recv(fd, (uint8_t *)in + have, n_in - have, 0);
            if (r > 0)
                have += (size_t)r;
            else if (r == 0 || (errno != EAGAIN && errno != EINTR))
                return STRATA_ECLOSED;
        } else if (p.revents & (POLLHUP | POLLERR)) {
            return STRATA_ECLOSED;
        }
    }
    return 0;
}

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

/* slow_not_broken: after a ping timed out, whether its connection (still open) or any other is
 * attached to the socket within PING_GRACE_MS: then the server is slow (a loaded machine, a
 * sanitizer, a backlog after SIGSTOP and SIGCONT), not broken by #1518, whose new connections
 * finish the handshake but are never attached. Re-listening on a slow server is worse than
 * useless: it drops every client's connection, and closing a listener while it accepts can hang
 * nng 1.5.2 for good (nng #1498: a worker stopped and continued never finished its SIGTERM). */
static bool slow_not_broken(struct ipc_server *srv, unsigned pipes0)
{
    for (int i = 0; i < PING_GRACE_MS / 10; i++) {
        if (atomic_load(&srv->pipes) != pipes0) {
            LOG_DEBUG("ipc %s: the watchdog's ping was accepted but not answered in %d ms: the "
                      "server is slow, the listener works",
                      srv->name, srv->opts.watchdog_timeout_ms);
            return true;
        }
        nanosleep(&(struct timespec){0, 10 * 1000000}, NULL);
    }
    return false;
}

/* ping makes a real round trip to srv over a new connection (a connection opened before nng
 * 1.5.2's listener broke, #1518, would still answer: only a fresh one proves that new clients
 * get in), speaking req0 over nng's IPC framing on a plain AF_UNIX socket: the SP header both
 * ways, then one request (type 1, 64-bit big-endian length, a 32-bit request id with its top bit
 * set, the body) and its reply, whose id must match. Not an nng client: an nng req0 socket opened
 * and closed here could hang nng_close for good after the process was stopped (SIGSTOP) and
 * continued, and the worker then never finished a SIGTERM. */
static int ping(struct ipc_server *srv)
{
    static const uint8_t hdr[8] = {0, 'S', 'P', 0, 0, 0x30 /* req0 */, 0, 0};
    const int64_t deadline = now_ms() + srv->opts.watchdog_timeout_ms;
    const uint32_t id = 0x80000000u | (uint32_t)(now_ms() & 0x7fffffff);
    const unsigned pipes0 = atomic_load(&srv->pipes);
    uint8_t got[9], *frame = NULL, idb[4];
    void *body = NULL;
    size_t blen = 0;
    struct msg_builder b;
    msg_begin_request(&b, IPC_PING_OP);
    int rv = msg_finish(&b, &body, &blen);
    if (rv != 0) return rv;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        rv = strata_errf(strata_errno(errno), "watchdog: socket: %s", strerror(errno));
        goto done;
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", srv->path);
    /* a full backlog (EAGAIN: the server is slow to accept) is retried until the deadline */
    while (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno != EINPROGRESS) {
        if (errno == EAGAIN && now_ms() < deadline) {
            nanosleep(&(struct timespec){0, 10 * 1000000}, NULL);
            continue;
        }
        rv = errno == EAGAIN
                 ? STRATA_ETIMEDOUT
                 : strata_errf(strata_errno(errno), "watchdog: cannot connect to %s: %s", srv->path,
                               strerror(errno));
        if (rv == STRATA_ETIMEDOUT) goto io;
        goto done;
    }
    if (!(frame = malloc(13 + blen))) {
        rv = strata_errf(STRATA_ENOMEM, "watchdog: no memory for a ping");
        goto done;
    }
    frame[0] = 1;
    put_be(frame + 1, 4 + blen, 8);
    put_be(frame + 9, id, 4);
    memcpy(frame + 13, body, blen);
    uint64_t len = 0;
    if ((rv = xfer(fd, hdr, sizeof hdr, got, 8, deadline)) != 0) goto io;
    if (memcmp(got, "\0SP\0\0\x31", 6) != 0) {
        rv = strata_errf(STRATA_EPROTO, "watchdog: %s answered a handshake that is not rep0's",
                         srv->path);
        goto done;
    }
    if ((rv = xfer(fd, frame, 13 + blen, got, 9, deadline)) != 0) goto io;
    for (int i = 1; i < 9; i++)
        len = len << 8 | got[i];
    if (got[0] != 1 || len < 4 || len > 65536) {
        rv = strata_errf(STRATA_EPROTO, "watchdog: %s answered a ping with a bad frame", srv->path);
        goto done;
    }
    if ((rv = xfer(fd, NULL, 0, idb, 4, deadline)) != 0) goto io;
    if (((uint32_t)idb[0] << 24 | (uint32_t)idb[1] << 16 | (uint32_t)idb[2] << 8 | idb[3]) != id)
        rv = strata_errf(STRATA_EPROTO, "watchdog: %s answered another request id", srv->path);
    goto done;
io:
    if (rv == STRATA_ETIMEDOUT && slow_not_broken(srv, pipes0)) {
        rv = 0;
        goto done;
    }
    rv = rv == STRATA_ETIMEDOUT
             ? strata_errf(rv, "watchdog: no ping reply from %s within %d ms", srv->path,
                           srv->opts.watchdog_timeout_ms)
             : strata_errf(rv, "watchdog: %s closed a new connection", srv->path);
done:
    if (fd >= 0) close(fd);
    free(frame);
    free(body);
    return rv;
}

static void on_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p;
    (void)ev;
    atomic_fetch_add(&((struct ipc_server *)arg)->pipes, 1);
}

/* busy_calls counts contexts that hold a request; under srv->mtx. O(n_ctx): a few dozen. */
static int busy_calls(struct ipc_server *srv)
{
    int n = 0;
    for (int i = 0; i < srv->n_calls; i++)
        n += srv->calls[i].state == CALL_BUSY || srv->calls[i].state == CALL_SEND;
    return n;
}

static void *watchdog_main(void *arg)
{
    struct ipc_server *srv = arg;
    pthread_mutex_lock(&srv->mtx);
    while (!srv->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += srv->opts.watchdog_ms / 1000;
        until.tv_nsec += (long)(srv->opts.watchdog_ms % 1000) * 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        while (!srv->stopping && pthread_cond_timedwait(&srv->cv, &srv->mtx, &until) == 0) {
        }
        if (srv->stopping) break;
        /* with every context holding a request the ping could not be served, and its timeout
         * would say nothing about the listener */
        bool all_busy = busy_calls(srv) == srv->n_calls;
        pthread_mutex_unlock(&srv->mtx);
        int rv = all_busy ? 0 : ping(srv);
        pthread_mutex_lock(&srv->mtx);
        bool stopping = srv->stopping; /* a ping that outlived ipc_server_stop: no re-listen */
        pthread_mutex_unlock(&srv->mtx);
        if (rv != 0 && !stopping) {
            char why[256];
            snprintf(why, sizeof why, "%s", strata_errdetail());
            nng_listener_close(srv->listener);
            rv = listen_now(srv);
            pthread_mutex_lock(&srv->mtx);
            srv->relistens += rv == 0;
            pthread_mutex_unlock(&srv->mtx);
            if (rv == 0)
                LOG_WARN(
                    "ipc %s: the watchdog's ping failed (%s): re-listened on %s (the nng 1.5.2 "
                    "listener can stop accepting, bug #1518)",
                    srv->name, why, srv->url);
            else
                LOG_ERROR("ipc %s: the watchdog's ping failed (%s) and re-listening failed: %s; "
                          "retrying in %d ms",
                          srv->name, why, strata_errdetail(), srv->opts.watchdog_ms);
        }
        pthread_mutex_lock(&srv->mtx);
    }
    pthread_mutex_unlock(&srv->mtx);
    return NULL;
}

int ipc_server_start(const char *url, ipc_handler_fn handler, void *ctx,
                     const struct ipc_server_opts *opts, struct ipc_server **out)
{
    int rv;
    struct ipc_server *srv;
    if (strncmp(url, URL_PREFIX, strlen(URL_PREFIX)) != 0 || !url[strlen(URL_PREFIX)])
        return strata_errf(STRATA_EINVAL, "server URL %s: only ipc://PATH is supported", url);
    if (strlen(url) - strlen(URL_PREFIX) > PATH_MAX_UN)
        return strata_errf(STRATA_ELIMIT,
                           "socket path of %s is longer than %zu bytes: use a shorter "
                           "runtime directory",
                           url, PATH_MAX_UN);
    if (!(srv = calloc(1, sizeof *srv)))
        return strata_errf(STRATA_ENOMEM, "no memory for a server");
    snprintf(srv->url, sizeof srv->url, "%s", url);
    srv->path = srv->url + strlen(URL_PREFIX);
    srv->handler = handler;
    srv->hctx = ctx;
    srv->lock_fd = -1;
    pthread_mutex_init(&srv->mtx, NULL);
    pthread_cond_init(&srv->cv, NULL);
    if (opts) srv->opts = *opts;
    snprintf(srv->name, sizeof srv->name, "%s", srv->opts.name ? srv->opts.name : url);
    srv->opts.name = NULL;
    if (srv->opts.n_ctx <= 0) srv->opts.n_ctx = 16;
    if (srv->opts.recv_max == 0) srv->opts.recv_max = MSG_MAX_BYTES;
    /* A connect-and-close (a port scanner, a health probe) can break nng 1.5.2's listener
     * (#1518): ping twice a second, and give up on a ping after half a second (and the grace a
     * slow server gets), so that a broken listener is replaced within about 2.5 s. A ping is one
     * local round trip. */
    if (srv->opts.watchdog_ms == 0) srv->opts.watchdog_ms = 500;
    if (srv->opts.watchdog_timeout_ms <= 0) srv->opts.watchdog_timeout_ms = 500;

    if ((rv = take_lock(srv)) != 0) goto fail;
    if ((rv = nng_rep0_open(&srv->sock)) != 0) {
        rv = strata_errf(STRATA_ENNGERR | rv, "cannot open a rep0 socket: %s", nng_strerror(rv));
        goto fail;
    }
    srv->sock_open = true;
    if ((rv = nng_pipe_notify(srv->sock, NNG_PIPE_EV_ADD_POST, on_pipe, srv)) != 0) {
        rv = strata_errf(STRATA_ENNGERR | rv, "cannot watch connections: %s", nng_strerror(rv));
        goto fail;
    }
    if ((rv = nng_socket_set_size(srv->sock, NNG_OPT_RECVMAXSZ, srv->opts.recv_max)) != 0) {
        rv = strata_errf(STRATA_ENNGERR | rv, "cannot set the receive cap: %s", nng_strerror(rv));
        goto fail;
    }
    if (!(srv->calls = calloc((size_t)srv->opts.n_ctx, sizeof *srv->calls))) {
        rv = strata_errf(STRATA_ENOMEM, "no memory for %d contexts", srv->opts.n_ctx);
        goto fail;
    }
    for (; srv->n_calls < srv->opts.n_ctx; srv->n_calls++) {
        struct ipc_call *c = &srv->calls[srv->n_calls];
        c->srv = srv;
        if ((rv = nng_aio_alloc(&c->aio, call_cb, c)) != 0) goto fail_nng;
        if ((rv = nng_ctx_open(&c->ctx, srv->sock)) != 0) {
            nng_aio_free(c->aio);
            goto fail_nng;
        }
    }
    if ((rv = listen_now(srv)) != 0) goto fail;
    for (int i = 0; i < srv->n_calls; i++)
        start_recv(&srv->calls[i]);
    if (srv->opts.watchdog_ms > 0) {
        if ((rv = pthread_create(&srv->watchdog, NULL, watchdog_main, srv)) != 0) {
            rv =
                strata_errf(strata_errno(rv), "cannot start the watchdog thread: %s", strerror(rv));
            goto fail;
        }
        srv->watchdog_running = true;
    }
    LOG_DEBUG("ipc %s: listening on %s with %d contexts", srv->name, srv->url, srv->n_calls);
    *out = srv;
    return 0;
fail_nng:
    rv = strata_errf(STRATA_ENNGERR | rv, "cannot set up context %d of %d: %s", srv->n_calls,
                     srv->opts.n_ctx, nng_strerror(rv));
fail:
    ipc_server_close(srv);
    return rv;
}

void ipc_server_stop(struct ipc_server *srv)
{
    pthread_mutex_lock(&srv->mtx);
    if (srv->stopped) {
        pthread_mutex_unlock(&srv->mtx);
        return;
    }
    srv->stopping = true;
    pthread_cond_broadcast(&srv->cv);
    while (srv->n_replying > 0)
        pthread_cond_wait(&srv->cv, &srv->mtx);
    pthread_mutex_unlock(&srv->mtx);

    if (srv->watchdog_running) pthread_join(srv->watchdog, NULL);
    srv->watchdog_running = false;
    if (srv->sock_open) nng_close(srv->sock); /* closes the contexts and the listener */
    srv->sock_open = false;
    for (int i = 0; i < srv->n_calls; i++)
        nng_aio_stop(srv->calls[i].aio);
    if (srv->lock_fd >= 0) {
        /* nng removes the socket file when the listener closes; make sure while we hold the lock */
        unlink(srv->path);
        close(srv->lock_fd);
        srv->lock_fd = -1;
    }
    pthread_mutex_lock(&srv->mtx);
    srv->stopped = true;
    pthread_mutex_unlock(&srv->mtx);
}

void ipc_server_close(struct ipc_server *srv)
{
    if (!srv) return;
    ipc_server_stop(srv);
    for (int i = 0; i < srv->n_calls; i++) {
        struct ipc_call *c = &srv->calls[i];
        if (c->req) { /* a deferred call never answered */
            msg_free(&c->msg);
            nng_msg_free(c->req);
        }
        nng_aio_free(c->aio);
    }
    free(srv->calls);
    pthread_cond_destroy(&srv->cv);
    pthread_mutex_destroy(&srv->mtx);
    free(srv);
}

unsigned ipc_server_relistens(struct ipc_server *srv)
{
    pthread_mutex_lock(&srv->mtx);
    unsigned n = srv->relistens;
    pthread_mutex_unlock(&srv->mtx);
    return n;
}

/* ---- runtime directory ---- */

/* own_dir makes path a directory of ours with mode 0700, or checks that it is one. */
static int own_dir(const char *path)
{
    struct stat st;
    if (mkdir(path, 0700) == 0) {
        if (chmod(path, 0700) != 0) /* mkdir's mode is masked by the umask */
            return strata_errf(strata_errno(errno), "cannot chmod 0700 %s: %s", path,
                               strerror(errno));
    } else if (errno != EEXIST) {
        return strata_errf(strata_errno(errno), "cannot create runtime directory %s: %s", path,
                           strerror(errno));
    }
    if (lstat(path, &st) != 0)
        return strata_errf(strata_errno(errno), "cannot stat runtime directory %s: %s", path,
                           strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return strata_errf(STRATA_EPERM,
                           "runtime directory %s is not a directory: remove it or "
                           "pass another directory",
                           path);
    if (st.st_uid != geteuid() || (st.st_mode & 077) != 0)
        return strata_errf(STRATA_EPERM,
                           "runtime directory %s has mode %03o and owner uid %u; it must be 0700 "
                           "and owned by uid %u: fix it (chmod 700) or pass another directory",
                           path, (unsigned)(st.st_mode & 0777), (unsigned)st.st_uid,
                           (unsigned)geteuid());
    return 0;
}

int ipc_runtime_dir(const char *dir, const char *name, char *out, size_t cap)
{
    int rv, n;
    if (dir) {
        n = snprintf(out, cap, "%s", dir);
    } else {
        if (!name || !*name || strchr(name, '/') || strcmp(name, ".") == 0 ||
            strcmp(name, "..") == 0)
            return strata_errf(STRATA_EINVAL,
                               "runtime directory name '%s' must be one path "
                               "component",
                               name ? name : "");
        const char *xdg = getenv("XDG_RUNTIME_DIR");
        char base[256];
        if (xdg && *xdg)
            n = snprintf(base, sizeof base, "%s/strata", xdg);
        else
            n = snprintf(base, sizeof base, "/tmp/strata-%u", (unsigned)geteuid());
        if (n < 0 || (size_t)n >= sizeof base)
            return strata_errf(STRATA_ELIMIT, "XDG_RUNTIME_DIR is too long (%zu bytes)",
                               strlen(xdg));
        if ((rv = own_dir(base)) != 0) return rv;
        n = snprintf(out, cap, "%s/%s", base, name);
    }
    if (n < 0 || (size_t)n >= cap)
        return strata_errf(STRATA_ELIMIT, "runtime directory path is longer than %zu bytes", cap);
    return own_dir(out);
}

int ipc_url(const char *dir, const char *sock, char *out, size_t cap)
{
    size_t plen = strlen(dir) + 1 + strlen(sock);
    if (plen > PATH_MAX_UN)
        return strata_errf(STRATA_ELIMIT,
                           "socket path %s/%s is %zu bytes, more than the %zu an "
                           "AF_UNIX address holds: use a shorter runtime directory",
                           dir, sock, plen, PATH_MAX_UN);
    int n = snprintf(out, cap, URL_PREFIX "%s/%s", dir, sock);
    if (n < 0 || (size_t)n >= cap)
        return strata_errf(STRATA_ELIMIT, "URL buffer of %zu bytes is too small", cap);
    return 0;
}

/* ---- client ---- */

struct ipc_client {
    nng_socket sock;
    nng_dialer dialer;
    pthread_mutex_t mu;      /* guards dialer and last_redial_ms */
    int64_t last_redial_ms;
    char url[256];
};

static int nng_fail(int rv, const char *what, const char *url)
{
    return strata_errf(STRATA_ENNGERR | rv, "%s %s: %s", what, url, nng_strerror(rv));
}

int ipc_client_open(const char *url, const struct ipc_client_opts *opts, struct ipc_client **out)
{
    struct ipc_client_opts o = {0};
    struct ipc_client *cli;
    int rv;
    if (opts) o = *opts;
    if (o.reconnect_min_ms <= 0) o.reconnect_min_ms = 100;
    if (o.reconnect_max_ms <= 0) o.reconnect_max_ms = 2000;
    if (o.resend_ms <= 0) o.resend_ms = 60000;
    if (o.recv_max == 0) o.recv_max = MSG_MAX_BYTES;
    if (!(cli = calloc(1, sizeof *cli)))
        return strata_errf(STRATA_ENOMEM, "no memory for a client");
    snprintf(cli->url, sizeof cli->url, "%s", url);
    if ((rv = nng_req0_open(&cli->sock)) != 0) {
        free(cli);
        return nng_fail(rv, "cannot open a req0 socket for", url);
    }
    if ((rv = nng_socket_set_ms(cli->sock, NNG_OPT_RECONNMINT, o.reconnect_min_ms)) != 0 ||
        (rv = nng_socket_set_ms(cli->sock, NNG_OPT_RECONNMAXT, o.reconnect_max_ms)) != 0 ||
        (rv = nng_socket_set_ms(cli->sock, NNG_OPT_REQ_RESENDTIME, o.resend_ms)) != 0 ||
        (rv = nng_socket_set_size(cli->sock, NNG_OPT_RECVMAXSZ, o.recv_max)) != 0) {
        rv = nng_fail(rv, "cannot set the options of the socket for", url);
        goto fail;
    }
    /* non-blocking: a server that is not up yet is reached when it comes */
    if ((rv = nng_dial(cli->sock, url, &cli->dialer, NNG_FLAG_NONBLOCK)) != 0) {
        rv = nng_fail(rv, "cannot dial", url);
        goto fail;
    }
    pthread_mutex_init(&cli->mu, NULL);
    *out = cli;
    return 0;
fail:
    nng_close(cli->sock);
    free(cli);
    return rv;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* redial replaces the client's dialer (at most once a second). With nng 1.5.2 a dialer whose peer
 * was killed and restarted can stay without a working pipe for good (seen: one of four frontends'
 * sockets timed out for 30 s while the other three had reconnected in 0.3 s); a fresh dialer
 * connects at once. Calls still waiting on the old pipes fail or are resent by req0. */
static void redial(struct ipc_client *cli)
{
    pthread_mutex_lock(&cli->mu);
    int64_t now = now_ms();
    if (now - cli->last_redial_ms >= 1000) {
        cli->last_redial_ms = now;
        nng_dialer_close(cli->dialer);
        int rv = nng_dial(cli->sock, cli->url, &cli->dialer, NNG_FLAG_NONBLOCK);
        if (rv != 0) LOG_WARN("ipc: redialing %s: %s", cli->url, nng_strerror(rv));
        else LOG_DEBUG("ipc: redialed %s after a timeout", cli->url);
    }
    pthread_mutex_unlock(&cli->mu);
}

/* wait_op runs one operation on aio with at most the time left until deadline. */
static int wait_op(struct ipc_client *cli, nng_ctx ctx, nng_aio *aio, bool send, int64_t deadline,
                   int timeout_ms)
{
    int64_t left = deadline - now_ms();
    if (left <= 0) left = 1;
    nng_aio_set_timeout(aio, (nng_duration)left);
    if (send)
        nng_ctx_send(ctx, aio);
    else
        nng_ctx_recv(ctx, aio);
    nng_aio_wait(aio);
    int rv = nng_aio_result(aio);
    if (rv == 0) return 0;
    nng_msg *left_over = send ? nng_aio_get_msg(aio) : NULL;
    if (left_over) nng_msg_free(left_over); /* a failed send leaves the message with us */
    if (rv == NNG_ETIMEDOUT)
        return strata_errf(STRATA_ETIMEDOUT,
                           "no reply from %s within %d ms: is the server running?", cli->url,
                           timeout_ms);
    return nng_fail(rv, send ? "cannot send to" : "no reply from", cli->url);
}

int ipc_call(struct ipc_client *cli, const void *req, size_t req_len, void **reply,
             size_t *reply_len, int timeout_ms)
{
    nng_ctx ctx;
    nng_aio *aio = NULL;
    nng_msg *m = NULL;
    bool ctx_open = false;
    int rv;
    if (timeout_ms <= 0)
        return strata_errf(STRATA_EINVAL, "ipc_call to %s: timeout %d ms must be positive",
                           cli->url, timeout_ms);
    int64_t deadline = now_ms() + timeout_ms;
    if ((rv = nng_ctx_open(&ctx, cli->sock)) != 0) {
        rv = nng_fail(rv, "cannot open a context for", cli->url);
        goto fail;
    }
    ctx_open = true;
    if ((rv = nng_aio_alloc(&aio, NULL, NULL)) != 0 || (rv = nng_msg_alloc(&m, 0)) != 0 ||
        (rv = nng_msg_append(m, req, req_len)) != 0) {
        rv = nng_fail(rv, "cannot prepare a request for", cli->url);
        goto fail;
    }
    nng_aio_set_msg(aio, m);
    m = NULL;
    if ((rv = wait_op(cli, ctx, aio, true, deadline, timeout_ms)) != 0 ||
        (rv = wait_op(cli, ctx, aio, false, deadline, timeout_ms)) != 0) {
        if (rv == STRATA_ETIMEDOUT) redial(cli);
        goto fail;
    }
    m = nng_aio_get_msg(aio);
    size_t len = nng_msg_len(m);
    void *buf = malloc(len ? len : 1);
    if (!buf) {
        rv = strata_errf(STRATA_ENOMEM, "no memory for a %zu-byte reply from %s", len, cli->url);
        goto fail;
    }
    memcpy(buf, nng_msg_body(m), len);
    *reply = buf;
    *reply_len = len;
fail:
    if (m) nng_msg_free(m);
    if (aio) nng_aio_free(aio);
    if (ctx_open) nng_ctx_close(ctx);
    return rv;
}

int ipc_request(struct ipc_client *cli, struct msg_builder *b, struct msg *reply, int timeout_ms)
{
    void *req, *rep;
    size_t req_len, rep_len;
    int rv = msg_finish(b, &req, &req_len);
    if (rv != 0) return rv;
    rv = ipc_call(cli, req, req_len, &rep, &rep_len, timeout_ms);
    free(req);
    if (rv != 0) return rv;
    if ((rv = msg_decode(rep, rep_len, reply)) != 0) {
        free(rep);
        return rv;
    }
    reply->owned = rep;
    if ((rv = msg_reply_status(reply)) != 0) msg_free(reply);
    return rv;
}

struct deadline {
    char who[64];
    int seconds;
};

static void *deadline_main(void *arg)
{
    struct deadline d = *(struct deadline *)arg;
    free(arg);
    struct timespec ts = {d.seconds, 0};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    LOG_ERROR("%s: stopping took more than %d s (stuck in nng, as nng 1.5.2 can be): exiting now",
              d.who, d.seconds);
    _exit(1);
}

int ipc_stop_deadline(const char *who, int seconds)
{
    struct deadline *d = malloc(sizeof *d);
    if (!d) return strata_errf(STRATA_ENOMEM, "no memory for the stop deadline");
    snprintf(d->who, sizeof d->who, "%s", who);
    d->seconds = seconds;
    pthread_t t;
    int rv = pthread_create(&t, NULL, deadline_main, d);
    if (rv == 0) pthread_detach(t);
    if (rv != 0) {
        free(d);
        return strata_errf(strata_errno(rv), "cannot start the stop deadline: %s", strerror(rv));
    }
    return 0;
}

void ipc_client_close(struct ipc_client *cli)
{
    if (!cli) return;
    nng_close(cli->sock);
    pthread_mutex_destroy(&cli->mu);
    free(cli);
}
