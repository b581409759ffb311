#include "launcher/sup_svc.h"
#include "common/base/err.h"
#include "common/tok/tok.h"
#include "common/ipc/wclient.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int sup_svc_base(char *out, size_t cap)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n = xdg && *xdg ? snprintf(out, cap, "%s/strata", xdg)
                        : snprintf(out, cap, "/tmp/strata-%u", (unsigned)geteuid());
    if (n < 0 || (size_t)n >= cap)
        return strata_errf(STRATA_ELIMIT, "the runtime directory path is longer than %zu bytes",
                           cap);
    return 0;
}

int sup_svc_dir(const char *runtime_dir, const char *name, char *out, size_t cap)
{
    if (runtime_dir) {
        if ((size_t)snprintf(out, cap, "%s", runtime_dir) >= cap)
            return strata_errf(STRATA_ELIMIT, "--runtime-dir is longer than %zu bytes", cap);
        return 0;
    }
    if (!name || !*name || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return strata_errf(STRATA_EINVAL, "service name '%s' must be one path component",
                           name ? name : "");
    char base[512];
    int rv = sup_svc_base(base, sizeof base);
    if (rv) return rv;
    if ((size_t)snprintf(out, cap, "%s/%s", base, name) >= cap)
        return strata_errf(STRATA_ELIMIT, "the runtime directory path is longer than %zu bytes",
                           cap);
    return 0;
}

int sup_svc_worker_url(const char *dir, int i, char *out, size_t cap)
{
    /* 107: what sockaddr_un.sun_path holds with its NUL */
    char path[SUP_SVC_URL_MAX];
    int n = snprintf(path, sizeof path, "%s/worker-%d.sock", dir, i);
    if (n < 0 || n > 107)
        return strata_errf(STRATA_ELIMIT,
                           "socket path %s/worker-%d.sock is longer than the 107 bytes an AF_UNIX "
                           "address holds: use a shorter --runtime-dir",
                           dir, i);
    if ((size_t)snprintf(out, cap, "ipc://%s", path) >= cap)
        return strata_errf(STRATA_ELIMIT, "URL buffer of %zu bytes is too small", cap);
    return 0;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int sup_svc_worker_urls(const char *dir, char (*urls)[SUP_SVC_URL_MAX], int max, int *n)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return strata_errf(errno == ENOENT ? STRATA_ENOENT : strata_errno(errno),
                           "runtime directory %s: %s", dir, strerror(errno));
    int nums[SUP_SVC_MAX_SOCKS], k = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && k < SUP_SVC_MAX_SOCKS) {
        int i, used = 0;
        /* worker-<n>.sock exactly: not its .lock file */
        if (sscanf(e->d_name, "worker-%d.sock%n", &i, &used) == 1 && used > 0 &&
            e->d_name[used] == '\0' && i >= 0)
            nums[k++] = i;
    }
    closedir(d);
    qsort(nums, (size_t)k, sizeof nums[0], cmp_int);
    for (int j = 0; j < k && *n < max; j++) {
        int rv = sup_svc_worker_url(dir, nums[j], urls[*n], SUP_SVC_URL_MAX);
        if (rv) return rv;
        (*n)++;
    }
    return 0;
}

int sup_svc_find_worker(const char *dir, int timeout_ms, char *url, size_t cap)
{
    char urls[SUP_SVC_MAX_SOCKS][SUP_SVC_URL_MAX];
    int n = 0;
    int rv = sup_svc_worker_urls(dir, urls, SUP_SVC_MAX_SOCKS, &n);
    if (rv == STRATA_ENOENT)
        return strata_errf(STRATA_ENOENT,
                           "no service runs there (%s does not exist): start one with `strata "
                           "serve MODEL.gguf --name NAME`",
                           dir);
    if (rv) return rv;
    struct wclient_opts o = {.timeout_ms = timeout_ms};
    for (int i = 0; i < n; i++) {
        struct wclient *c;
        struct wclient_hello h;
        if (wclient_open(urls[i], &o, &c) != 0) continue;
        rv = wclient_hello(c, &h);
        wclient_close(c);
        if (rv == 0) {
            snprintf(url, cap, "%s", urls[i]);
            return 0;
        }
    }
    return strata_errf(STRATA_ENOENT,
                       "no worker answered in %s (%d socket file%s): is `strata serve` running "
                       "under this name? `strata status` lists what runs",
                       dir, n, n == 1 ? "" : "s");
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* wait_fd polls fd for events until end_ms. Returns 0, STRATA_ETIMEDOUT or an errno error. */
static int wait_fd(int fd, short events, int64_t end_ms)
{
    for (;;) {
        int64_t left = end_ms - now_ms();
        if (left <= 0) return STRATA_ETIMEDOUT;
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, (int)left);
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) return strata_errno(errno);
    }
}

int sup_svc_http_status(const char *host, int port, const char *path, int timeout_ms, int *status)
{
    struct sockaddr_storage sa = {0};
    socklen_t salen;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&sa;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&sa;
    const char *h = strcmp(host, "localhost") == 0 || strcmp(host, "0.0.0.0") == 0 ? "127.0.0.1"
                    : strcmp(host, "::") == 0                                      ? "::1"
                                                                                   : host;
    if (inet_pton(AF_INET, h, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        salen = sizeof *a4;
    } else if (inet_pton(AF_INET6, h, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        salen = sizeof *a6;
    } else {
        return strata_errf(STRATA_EINVAL, "host '%s': expected an IP address or localhost", host);
    }
    int64_t end = now_ms() + timeout_ms;
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return strata_errno(errno);
    int rv = 0;
    char buf[512];
    if (connect(fd, (struct sockaddr *)&sa, salen) != 0) {
        if (errno != EINPROGRESS) {
            rv = strata_errno(errno);
            goto out;
        }
        if ((rv = wait_fd(fd, POLLOUT, end)) != 0) goto out;
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            rv = strata_errno(err);
            goto out;
        }
    }
    int n = snprintf(buf, sizeof buf, "GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n",
                     path, h, port);
    if (send(fd, buf, (size_t)n, MSG_NOSIGNAL) != n) {
        rv = strata_errno(errno);
        goto out;
    }
    size_t got = 0;
    while (got < sizeof buf - 1 && !memchr(buf, '\n', got)) {
        if ((rv = wait_fd(fd, POLLIN, end)) != 0) goto out;
        ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
    }
    buf[got] = '\0';
    if (sscanf(buf, "HTTP/1.%*d %d", status) != 1)
        rv = strata_errf(STRATA_EPROTO, "%s:%d%s did not answer HTTP", host, port, path);
out:
    close(fd);
    return rv;
}

/* gen_state is one generation's output as strata run prints it. */
struct gen_state {
    struct tok *tk;
    struct tok_stream ts;
    struct tok_buf text;
    struct tok_ids ids;
    json_t *lps;
    bool json;
};

/* gen_take appends token i of update u: its id, its logprobs and its text. */
static int gen_take(struct gen_state *st, const struct wclient_update *u, uint32_t i, int32_t id,
                    bool has_lp)
{
    if (st->ids.n == st->ids.cap) {
        size_t cap = st->ids.cap ? 2 * st->ids.cap : 256;
        int32_t *v = realloc(st->ids.v, cap * sizeof *v);
        if (!v) return STRATA_ENOMEM;
        st->ids.v = v;
        st->ids.cap = cap;
    }
    st->ids.v[st->ids.n++] = id;
    json_t *top = json_array();
    for (uint32_t j = 0; has_lp && j < u->n_top; j++)
        json_array_append_new(top, json_pack("{s:i, s:f}", "id", u->top_ids[i * u->n_top + j],
                                             "logprob", (double)u->top_logprobs[i * u->n_top + j]));
    json_array_append_new(st->lps, json_pack("{s:i, s:f, s:o}", "id", id, "logprob",
                                             has_lp && u->logprobs ? (double)u->logprobs[i] : 0.0,
                                             "top", top));
    size_t before = st->text.n;
    int rv = tok_stream_feed(&st->ts, id, &st->text);
    if (rv == 0 && !st->json) {
        fwrite(st->text.p + before, 1, st->text.n - before, stdout);
        fflush(stdout);
    }
    return rv;
}

static double now_s(void)
{
    return now_ms() / 1000.0;
}

int sup_svc_generate(const char *url, const struct sup_svc_gen *g)
{
    struct wclient_opts wo = {0};
    struct wclient *c = NULL;
    struct wclient_meta meta = {0};
    struct wclient_stream *s = NULL;
    struct gen_state st = {.lps = json_array(), .json = g->json};
    struct tok_ids prompt = {0};
    int rv;
    if ((rv = wclient_open(url, &wo, &c)) != 0 || (rv = wclient_meta(c, &meta)) != 0) goto out;
    if ((rv = tok_from_gguf(meta.gguf, NULL, &st.tk)) != 0) goto out;
    if (g->prompt) {
        if ((rv = tok_encode(st.tk, g->prompt, strlen(g->prompt),
                             TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL, &prompt)) != 0)
            goto out;
    } else if (g->n_ids) {
        if (!(prompt.v = malloc(g->n_ids * sizeof *prompt.v))) {
            rv = STRATA_ENOMEM;
            goto out;
        }
        memcpy(prompt.v, g->ids, g->n_ids * sizeof *prompt.v);
        prompt.n = prompt.cap = g->n_ids;
    }
    if (!prompt.n) {
        rv = strata_errf(STRATA_EINVAL, "the prompt has no tokens");
        goto out;
    }
    int32_t eos = tok_eos(st.tk);
    char id[WCLIENT_ID_MAX + 1], host[32] = "host";
    gethostname(host, sizeof host - 1);
    snprintf(id, sizeof id, "run-%.20s-%d-%lld", host, (int)getpid(), (long long)now_ms());
    struct wclient_req r = {.id = id,
                            .prompt = prompt.v,
                            .n_prompt = (uint32_t)prompt.n,
                            .max_tokens = g->max_tokens,
                            .sampling = g->sampling,
                            .stop = &eos,
                            .n_stop = !g->ignore_eos && eos >= 0,
                            .logprobs = true,
                            .top_logprobs = g->n_logprobs};
    tok_stream_init(&st.ts, st.tk, 0);
    double t0 = now_s(), t1 = 0;
    if ((rv = wclient_stream_start(c, &r, &s)) != 0) goto out;
    const char *finish = NULL;
    while (!finish) {
        const struct wclient_update *u;
        if ((rv = wclient_stream_next(s, &u)) != 0) goto out;
        if (u->n_tokens && !t1) t1 = now_s();
        for (uint32_t i = 0; i < u->n_tokens; i++)
            if ((rv = gen_take(&st, u, i, u->tokens[i], true)) != 0) goto out;
        switch (u->finish) {
        case WCLIENT_RUNNING:
            break;
        case WCLIENT_STOP:
            /* strata run keeps the EOS it sampled as the last id; the worker does not send it */
            if (u->stop_token >= 0 && (rv = gen_take(&st, u, 0, u->stop_token, false)) != 0)
                goto out;
            finish = "stop";
            break;
        case WCLIENT_LENGTH:
            finish = "length";
            break;
        case WCLIENT_CANCELLED:
            finish = "cancelled";
            break;
        case WCLIENT_ERROR:
            rv = strata_errf(u->error_code ? u->error_code : STRATA_EINTERNAL,
                             "the worker failed the request: %s", strata_strerror(u->error_code));
            goto out;
        }
    }
    size_t before = st.text.n;
    if ((rv = tok_stream_flush(&st.ts, &st.text)) != 0) goto out;
    double t2 = now_s();
    uint64_t seed = wclient_stream_seed(s);
    if (g->json) {
        json_t *pi = json_array(), *gi = json_array();
        for (size_t i = 0; i < prompt.n; i++)
            json_array_append_new(pi, json_integer(prompt.v[i]));
        for (size_t i = 0; i < st.ids.n; i++)
            json_array_append_new(gi, json_integer(st.ids.v[i]));
        json_t *o = json_pack("{s:o, s:o, s:s%, s:O, s:I, s:s}", "prompt_ids", pi, "ids", gi,
                              "text", st.text.p ? st.text.p : "", st.text.n, "top_logprobs", st.lps,
                              "seed", (json_int_t)seed, "finish_reason", finish);
        char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (line) puts(line);
        free(line);
        json_decref(o);
    } else {
        fwrite(st.text.p + before, 1, st.text.n - before, stdout);
        putchar('\n');
    }
    if (!t1) t1 = t2;
    /* tokens come in batches per poll, so the rate is over the whole request */
    fprintf(stderr,
            "strata run: %s: prompt %zu tokens, first tokens after %.3f s, %zu generated in "
            "%.3f s (%.1f tok/s with the prompt), seed %llu, %u worker restart%s survived\n",
            url, prompt.n, t1 - t0, st.ids.n, t2 - t0, st.ids.n / (t2 - t0),
            (unsigned long long)seed, wclient_stream_resubmits(s),
            wclient_stream_resubmits(s) == 1 ? "" : "s");
out:
    wclient_stream_free(s);
    json_decref(st.lps);
    free(st.text.p);
    free(st.ids.v);
    free(prompt.v);
    tok_fini(st.tk);
    wclient_meta_free(&meta);
    wclient_close(c);
    return rv;
}
