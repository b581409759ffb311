/* fe_wclient — the frontend's real workers: common/wclient.h behind struct fe_backend, and worker
 * discovery by URL or from an arena's registry. */
#include "frontend/fe.h"

#include "common/arena.h"
#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
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

const struct fe_backend fe_backend_wclient = {
    w_hello, w_meta, wclient_meta_free, w_status, w_start, w_next, w_cancel, w_free, w_close};

int fe_add_worker_url(struct fe *f, const char *url)
{
    struct wclient *c;
    int rv = wclient_open(url, NULL, &c);
    if (rv != 0) return rv;
    if ((rv = fe_worker_add(f, &fe_backend_wclient, c, url)) != 0) wclient_close(c);
    return rv;
}

int fe_arena_endpoints(const char *shm_dir, const char *name, char (*urls)[FE_URL_MAX], int max,
                       int *n)
{
    struct arena_state *st;
    int rv = arena_state_open(shm_dir, name, &st);
    *n = 0;
    if (rv != 0)
        return strata_errf(rv,
                           "arena '%s': %s (start it with strata-arena serve, or pass --worker)",
                           name, strata_errdetail());
    for (int i = 0; i < ARENA_MAX_WORKERS && *n < max; i++) {
        const struct arena_worker *w = &st->hdr->workers[i];
        int32_t pid = atomic_load(&w->pid);
        if (pid == 0 || !arena_pid_alive(pid) || !w->endpoint[0]) continue;
        snprintf(urls[*n], FE_URL_MAX, "%.*s", (int)sizeof w->endpoint, w->endpoint);
        LOG_INFO("frontend: worker %s (pid %d, gpu %d) from arena %s", urls[*n], pid, w->gpu, name);
        (*n)++;
    }
    arena_state_close(st);
    if (*n == 0)
        return strata_errf(STRATA_ENOENT,
                           "arena '%s' has no live worker registered: start strata-worker --arena "
                           "%s first, or pass --worker URL",
                           name, name);
    return 0;
}

int fe_add_workers_arena(struct fe *f, const char *shm_dir, const char *name)
{
    char urls[ARENA_MAX_WORKERS][FE_URL_MAX];
    int n, rv = fe_arena_endpoints(shm_dir, name, urls, ARENA_MAX_WORKERS, &n);
    for (int i = 0; i < n && rv == 0; i++)
        rv = fe_add_worker_url(f, urls[i]);
    return rv;
}
