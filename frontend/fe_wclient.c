/* fe_wclient — the frontend's real workers: common/ipc/wclient.h behind struct fe_backend, and worker
 * discovery by URL or from an arena's registry (re-read every monitor round). */
#include "frontend/fe_int.h"

#include "common/arena/arena.h"
#include "common/base/err.h"
#include "common/base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int w_hello(void *w, struct wclient_hello *out)
{
    return wclient_hello(w, out);
}

static int w_meta(void *w, struct wclient_meta *out)
{
    return wclient_meta(w, out);
}

static int w_status(void *w, struct wclient_status *out)
{
    return wclient_status(w, out);
}

static int w_start(void *w, const struct wclient_req *r, void **stream)
{
    return wclient_stream_start(w, r, (struct wclient_stream **)stream);
}

static int w_next(void *s, const struct wclient_update **u)
{
    return wclient_stream_next(s, u);
}

static int w_cancel(void *s)
{
    return wclient_stream_cancel(s);
}

static void w_free(void *s)
{
    wclient_stream_free(s);
}

static void w_close(void *w)
{
    wclient_close(w);
}

static int w_move(void *s, void *w)
{
    return wclient_stream_move(s, w);
}

static int w_vram(void *w, struct wclient_vram *out)
{
    return wclient_vram(w, false, 0, out);
}

static int w_heat(void *w, struct wclient_heat *out)
{
    return wclient_heat(w, out);
}

const struct fe_backend fe_backend_wclient = {
    w_hello, w_meta,  wclient_meta_free, w_status, w_start, w_next,           w_cancel,
    w_free,  w_close, w_move,            w_vram,   w_heat,  wclient_heat_free};

/* open_url opens a wclient with the frontend's failover timing: a call gets failover_ms beyond a
 * poll's wait (1 s, so a silent worker is noticed within failover_ms + 1 s), and a failed poll or
 * a lost request comes back to the job at once, which picks the worker the stream resumes on. */
static int open_url(struct fe *f, const char *url, struct wclient **c)
{
    struct wclient_opts o = {
        .timeout_ms = f->o.failover_ms, .poll_wait_ms = 1000, .caller_resumes = true};
    return wclient_open(url, &o, c);
}

int fe_add_worker_url(struct fe *f, const char *url)
{
    struct wclient *c;
    int rv = open_url(f, url, &c);
    if (rv != 0) return rv;
    if ((rv = fe_worker_add(f, &fe_backend_wclient, c, url)) != 0) wclient_close(c);
    return rv;
}

/* live_endpoints lists the endpoints of the live workers in arena name's registry (0 of them is no
 * error). */
static int live_endpoints(const char *shm_dir, const char *name, char (*urls)[FE_URL_MAX], int max,
                          int *n)
{
    struct arena_state *st;
    int rv = arena_state_open(shm_dir, name, &st);
    *n = 0;
    if (rv != 0) {
        const char *why = strata_errdetail();
        if (rv == STRATA_ENOENT)
            return strata_errf(rv,
                               "no service '%s' is running (%s): start one with `strata serve "
                               "MODEL.gguf` (named for the file: models/demo.gguf serves as "
                               "'demo'), or pass --worker URL",
                               name, why);
        return strata_errf(rv, "arena '%s' cannot be read: %s: %s (pass --worker URL to skip it)",
                           name, strata_strerror(rv), why);
    }
    for (int i = 0; i < ARENA_MAX_WORKERS && *n < max; i++) {
        const struct arena_worker *w = &st->hdr->workers[i];
        int32_t pid = atomic_load(&w->pid);
        if (pid == 0 || !arena_pid_alive(pid) || !w->endpoint[0]) continue;
        snprintf(urls[*n], FE_URL_MAX, "%.*s", (int)sizeof w->endpoint, w->endpoint);
        LOG_DEBUG("frontend: worker %s (pid %d, gpu %d) in arena %s", urls[*n], pid, w->gpu, name);
        (*n)++;
    }
    arena_state_close(st);
    return 0;
}

static int no_worker(const char *name)
{
    return strata_errf(STRATA_ENOENT,
                       "service '%s' has no live worker: start one with `strata serve` (or "
                       "strata-worker --arena %s), or pass --worker URL",
                       name, name);
}

int fe_arena_endpoints(const char *shm_dir, const char *name, char (*urls)[FE_URL_MAX], int max,
                       int *n)
{
    int rv = live_endpoints(shm_dir, name, urls, max, n);
    return rv == 0 && *n == 0 ? no_worker(name) : rv;
}

/* The registry as a discovery: the arena's name and shm directory, and the frontend for the
 * wclient options. */
struct arena_disc {
    struct fe *f;
    char name[256], shm_dir[1024];
    bool has_shm_dir;
};

static int registry_list(void *ctx, char (*urls)[FE_URL_MAX], int max, int *n)
{
    struct arena_disc *a = ctx;
    return live_endpoints(a->has_shm_dir ? a->shm_dir : NULL, a->name, urls, max, n);
}

static int registry_open(void *ctx, const char *url, const struct fe_backend **ops, void **w)
{
    struct arena_disc *a = ctx;
    *ops = &fe_backend_wclient;
    return open_url(a->f, url, (struct wclient **)w);
}

int fe_add_workers_arena(struct fe *f, const char *shm_dir, const char *name)
{
    struct arena_disc *a = calloc(1, sizeof *a);
    if (!a) return strata_errf(STRATA_ENOMEM, "frontend: arena discovery");
    a->f = f;
    snprintf(a->name, sizeof a->name, "%s", name);
    snprintf(a->shm_dir, sizeof a->shm_dir, "%s", shm_dir ? shm_dir : "");
    a->has_shm_dir = shm_dir != NULL;
    struct fe_discovery d = {.ctx = a, .list = registry_list, .open = registry_open, .fini = free};
    int n = 0, rv = fe_discovery_set(f, &d, &n);
    return rv == 0 && n == 0 ? no_worker(name) : rv;
}
