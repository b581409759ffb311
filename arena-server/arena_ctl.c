#include "arena-server/arena_ctl.h"
#include "arena-server/arena_fingerprint.h"
#include "arena-server/arena_serve.h"
#include "common/base/err.h"
#include "common/ipc/ipc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SOCK_NAME "arena.ipc"

struct arena_ctl {
    struct ipc_server *srv;
};

static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int arena_ctl_url(const char *runtime_dir, const char *name, char *out, size_t cap)
{
    char dir[512];
    int rv = ipc_runtime_dir(runtime_dir, name, dir, sizeof dir);
    if (rv != 0) return rv;
    return ipc_url(dir, SOCK_NAME, out, cap);
}

static void pack_kv_u64(struct msg_builder *b, const char *k, uint64_t v)
{
    msg_key(b, k);
    msg_pack_u64(b, v);
}

static int op_status(struct ipc_call *call, void *ctx)
{
    struct arena_server *s = ctx;
    const struct arena_header *h = s->arena->hdr;
    const struct arena_state_header *sh = s->state->hdr;
    struct msg_builder b;
    char hex[17];
    int64_t now = wall_ns();
    arena_fingerprint_hex(s->fingerprint, hex);
    msg_begin_reply(&b);
    msg_key(&b, "name");
    msg_pack_str(&b, s->name);
    msg_key(&b, "model");
    msg_pack_str(&b, s->model_path);
    msg_key(&b, "fingerprint");
    msg_pack_str(&b, hex);
    pack_kv_u64(&b, "pid", (uint64_t)getpid());
    pack_kv_u64(&b, "size", h->total_bytes);
    pack_kv_u64(&b, "align", h->align);
    pack_kv_u64(&b, "n_layers", h->n_layers);
    pack_kv_u64(&b, "n_expert", h->n_expert);
    msg_key(&b, "adopted");
    msg_pack_bool(&b, s->adopted);
    msg_key(&b, "load_s");
    msg_pack_f64(&b, s->load_s);
    msg_key(&b, "load_gibps");
    msg_pack_f64(&b, s->adopted || s->load_s <= 0 ? 0.0
                                                  : s->build.bytes_read / 1073741824.0 / s->load_s);
    msg_key(&b, "uptime_s");
    msg_pack_f64(&b, (now - s->started_ns) * 1e-9);
    pack_kv_u64(&b, "heat_total", atomic_load(&sh->heat_total));
    pack_kv_u64(&b, "registrations", atomic_load(&sh->registrations));
    pack_kv_u64(&b, "adoptions", atomic_load(&sh->adoptions));
    pack_kv_u64(&b, "profile_saves", atomic_load(&sh->profile_saves));
    msg_key(&b, "profile");
    msg_pack_str(&b, s->profile_path);
    uint32_t n = 0;
    for (int i = 0; i < ARENA_MAX_WORKERS; i++)
        n += atomic_load(&sh->workers[i].pid) != 0;
    msg_key(&b, "workers");
    msg_pack_array(&b, n);
    for (int i = 0, k = 0; i < ARENA_MAX_WORKERS && (uint32_t)k < n; i++) {
        const struct arena_worker *w = &sh->workers[i];
        int32_t pid = atomic_load(&w->pid);
        if (pid == 0) continue;
        k++;
        msg_pack_map(&b, 7);
        msg_pack_str(&b, "pid");
        msg_pack_i64(&b, pid);
        msg_pack_str(&b, "alive");
        msg_pack_bool(&b, arena_pid_alive(pid));
        msg_pack_str(&b, "gpu");
        msg_pack_i64(&b, w->gpu);
        msg_pack_str(&b, "endpoint");
        msg_pack_str(&b, w->endpoint);
        msg_pack_str(&b, "cache_bytes");
        msg_pack_u64(&b, w->cache_bytes);
        msg_pack_str(&b, "cache_slots");
        msg_pack_u64(&b, w->cache_slots);
        msg_pack_str(&b, "heartbeat_age_s");
        msg_pack_f64(&b, (now - atomic_load(&w->heartbeat_ns)) * 1e-9);
    }
    return ipc_reply(call, &b);
}

static int op_inspect(struct ipc_call *call, void *ctx)
{
    struct arena_server *s = ctx;
    const struct arena *a = s->arena;
    const struct arena_header *h = a->hdr;
    struct msg_builder b;
    char hex[17];
    arena_fingerprint_hex(h->fingerprint, hex);
    msg_begin_reply(&b);
    msg_key(&b, "segment");
    msg_pack_str(&b, s->wseg);
    msg_key(&b, "fingerprint");
    msg_pack_str(&b, hex);
    pack_kv_u64(&b, "size", h->total_bytes);
    pack_kv_u64(&b, "align", h->align);
    pack_kv_u64(&b, "n_dense", h->n_dense);
    pack_kv_u64(&b, "dense_bytes", h->dense_bytes);
    pack_kv_u64(&b, "expert_base", h->expert_base);
    pack_kv_u64(&b, "expert_bytes", h->expert_bytes);
    pack_kv_u64(&b, "n_expert", h->n_expert);
    uint32_t n = 0;
    for (uint32_t l = 0; l < h->n_layers; l++)
        n += a->layers[l].n_parts != 0;
    msg_key(&b, "layers");
    msg_pack_array(&b, n);
    for (uint32_t l = 0; l < h->n_layers; l++) {
        const struct arena_layer *L = &a->layers[l];
        if (!L->n_parts) continue;
        msg_pack_map(&b, 5);
        msg_pack_str(&b, "layer");
        msg_pack_u64(&b, l);
        msg_pack_str(&b, "offset");
        msg_pack_u64(&b, h->expert_base + L->offset);
        msg_pack_str(&b, "blob_bytes");
        msg_pack_u64(&b, L->blob_bytes);
        msg_pack_str(&b, "stride");
        msg_pack_u64(&b, L->stride);
        msg_pack_str(&b, "n_parts");
        msg_pack_u64(&b, L->n_parts);
    }
    return ipc_reply(call, &b);
}

static int op_shutdown(struct ipc_call *call, void *ctx)
{
    struct arena_server *s = ctx;
    bool force = false;
    int rv = msg_get_bool(ipc_call_msg(call), NULL, "force", &force);
    if (rv != 0 && rv != STRATA_ENOENT) return rv;
    struct msg_builder b;
    msg_begin_reply(&b);
    pack_kv_u64(&b, "pid", (uint64_t)getpid());
    rv = ipc_reply(call, &b);
    arena_serve_stop(s, force);
    return rv;
}

static const struct ipc_op ops[] = {
    {"status", op_status}, {"inspect", op_inspect}, {"shutdown", op_shutdown}, {NULL, NULL}};

static int handler(struct ipc_call *call, void *ctx)
{
    return ipc_dispatch(call, ops, ctx);
}

int arena_ctl_start(struct arena_server *s, struct arena_ctl **out)
{
    char url[600];
    int rv = arena_ctl_url(s->cfg.runtime_dir, s->name, url, sizeof url);
    if (rv != 0) return rv;
    struct arena_ctl *c = calloc(1, sizeof *c);
    if (!c) return STRATA_ENOMEM;
    struct ipc_server_opts o = {.name = "arena control", .n_ctx = 4};
    if ((rv = ipc_server_start(url, handler, s, &o, &c->srv)) != 0) {
        free(c);
        return rv;
    }
    *out = c;
    return 0;
}

void arena_ctl_stop(struct arena_ctl *c)
{
    if (!c) return;
    ipc_server_close(c->srv);
    free(c);
}

int arena_ctl_request(const char *runtime_dir, const char *name, const char *op, bool force,
                      int timeout_ms, struct msg *reply)
{
    char url[600];
    struct ipc_client *cli = NULL;
    int rv = arena_ctl_url(runtime_dir, name, url, sizeof url);
    if (rv != 0) return rv;
    struct stat st;
    if (stat(url + strlen("ipc://"), &st) != 0)
        return strata_errf(STRATA_ENOENT,
                           "no arena-server for '%s' (no socket %s): start `strata-arena serve`",
                           name, url + strlen("ipc://"));
    if ((rv = ipc_client_open(url, NULL, &cli)) != 0) return rv;
    struct msg_builder b;
    msg_begin_request(&b, op);
    if (force) {
        msg_key(&b, "force");
        msg_pack_bool(&b, true);
    }
    rv = ipc_request(cli, &b, reply, timeout_ms);
    if (rv == STRATA_ETIMEDOUT)
        rv = strata_errf(rv, "the arena-server of '%s' did not answer on %s within %d ms", name,
                         url, timeout_ms);
    ipc_client_close(cli);
    return rv;
}
