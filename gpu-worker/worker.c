#include "gpu-worker/worker.h"

#include "common/arena/arena_layout.h"
#include "common/arena/arena.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/ipc/ipc.h"
#include "common/base/log.h"
#include "common/arena/model.h"
#include "gpu-worker/engine.h"
#include "gpu-worker/service.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <xxhash.h>

struct worker {
    struct worker_config c;
    char name[SHM_NAME_MAX + 1];
    char url[256];
    char model_name[SHM_NAME_MAX + 1];
    char arch[32];
    struct arena *arena;       /* with --arena */
    struct arena_state *state; /* with --arena, when its state segment exists */
    int slot;                  /* registry slot, -1 when not registered */
    struct gguf_file *f;       /* the arena's metadata or the model file */
    struct arena_layout *plan; /* --model: the layout an arena would have (its metadata) */
    struct model *m;
    struct gguf_file *draft_f; /* --draft: the draft model's file */
    struct model *draft;
    struct engine *e;
    struct service *svc;
    _Atomic int stop;
};

static void heat(void *ctx, uint32_t layer, uint32_t expert, uint32_t n)
{
    arena_heat_add(ctx, layer, expert, n);
}

/* profile: each tier round's decayed counts become the arena's decayed profile. */
static void profile(void *ctx, const float *counts)
{
    arena_profile_store(ctx, counts);
}

/* attach_arena maps the arena and builds the model over it. */
static int attach_arena(struct worker *w)
{
    int rv = arena_open(w->c.shm_dir, w->c.arena, &w->arena);
    if (rv == STRATA_ENOENT)
        return strata_errf(rv,
                           "no arena named %s in %s: start one with `strata-arena serve "
                           "MODEL.gguf --name %s`, or serve a file with --model",
                           w->c.arena, w->c.shm_dir ? w->c.shm_dir : SHM_DEFAULT_DIR, w->c.arena);
    if (rv != 0) return rv;
    if ((rv = arena_meta(w->arena, &w->f)) != 0 ||
        (rv = model_load_arena(w->arena, w->f, &w->m)) != 0)
        return rv;
    rv = arena_state_open(w->c.shm_dir, w->c.arena, &w->state);
    if (rv != 0) {
        LOG_WARN("arena %s has no usable state segment (%s: %s): serving unregistered and "
                 "without heat; restart strata-arena to recreate it",
                 w->c.arena, strata_strerror(rv), strata_errdetail());
        w->state = NULL;
    }
    snprintf(w->name, sizeof w->name, "%s", w->c.arena);
    return 0;
}

/* open_model opens a GGUF file and plans its arena layout in-process for the metadata. */
static int open_model(struct worker *w)
{
    char abs[PATH_MAX];
    int rv;
    if (!realpath(w->c.model, abs))
        return strata_errf(strata_errno(errno), "model file %s: cannot open it", w->c.model);
    if ((rv = arena_default_name(abs, w->name, sizeof w->name)) != 0 ||
        (rv = gguf_open(abs, &w->f)) != 0 ||
        (rv = arena_layout_plan(w->f, ARENA_ALIGN_SMALL, abs, &w->plan)) != 0 ||
        (rv = model_load(w->f, &w->m)) != 0)
        return rv;
    return 0;
}

/* open_draft opens the --draft model (read from its file's mapping, computed on the CPU). */
static int open_draft(struct worker *w)
{
    int rv = gguf_open(w->c.draft, &w->draft_f);
    if (!rv) rv = model_load(w->draft_f, &w->draft);
    if (rv) return strata_errf(rv, "--draft %s: %s", w->c.draft, strata_errdetail());
    return 0;
}

/* meta_bytes: the GGUF metadata as an arena stores it. */
static const void *meta_bytes(const struct worker *w, size_t *len)
{
    if (w->plan) {
        *len = w->plan->hdr.meta_bytes;
        return w->plan->meta;
    }
    *len = w->arena->hdr->meta_bytes;
    return (const uint8_t *)w->arena->hdr + w->arena->hdr->meta_off;
}

static void name_of(struct worker *w)
{
    struct gguf_str s;
    if (gguf_get_str(w->f, "general.name", &s) == 0 && s.len > 0)
        snprintf(w->model_name, sizeof w->model_name, "%.*s", (int)s.len, s.ptr);
    else
        snprintf(w->model_name, sizeof w->model_name, "%s", w->name);
    snprintf(w->arch, sizeof w->arch, "%s", model_arch_name(w->m->hp.arch));
}

/* serve starts the service on the first free worker-<n>.sock of the runtime directory. */
static int serve(struct worker *w)
{
    char dir[4096], sock[32];
    int rv = ipc_runtime_dir(w->c.runtime_dir, w->name, dir, sizeof dir);
    if (rv != 0) return rv;
    for (int n = 0; n < ARENA_MAX_WORKERS; n++) {
        snprintf(sock, sizeof sock, "worker-%d.sock", n);
        if ((rv = ipc_url(dir, sock, w->url, sizeof w->url)) != 0) return rv;
        if ((rv = service_start(w->svc, w->e, w->url)) != STRATA_EBUSY) return rv;
    }
    return strata_errf(STRATA_EBUSY,
                       "%s already holds %d workers' sockets: stop some or use "
                       "another --runtime-dir",
                       dir, ARENA_MAX_WORKERS);
}

int worker_init(const struct worker_config *c, struct worker **out)
{
    if (!c->arena == !c->model)
        return strata_errf(STRATA_EINVAL, "give exactly one of --arena NAME and --model FILE");
    if (c->threads < 0 || c->orphan_timeout_s < 0 || c->max_seqs < 0 || c->max_queue < 0 ||
        c->ctx < 0)
        return strata_errf(STRATA_EINVAL, "threads, orphan timeout, max seqs, max queue and "
                                          "context must not be negative");
    if (c->spec_lookup > ENGINE_MAX_DRAFT || c->draft_max > ENGINE_MAX_DRAFT)
        return strata_errf(STRATA_EINVAL,
                           "--spec-lookup %d, --draft-max %d: at most %d drafts a window",
                           c->spec_lookup, c->draft_max, ENGINE_MAX_DRAFT);
    struct worker *w = calloc(1, sizeof *w);
    if (!w) return STRATA_ENOMEM;
    w->c = *c;
    w->slot = -1;
    int rv = c->arena ? attach_arena(w) : open_model(w);
    if (rv == 0 && c->draft) rv = open_draft(w);
    if (rv != 0) goto fail;
    name_of(w);
    const struct model_hparams *hp = &w->m->hp;
    uint32_t n_ctx = c->ctx ? (uint32_t)c->ctx : hp->n_ctx_train;
    uint32_t max_running = c->max_seqs ? (uint32_t)c->max_seqs : 16;
    uint32_t max_queue = c->max_queue ? (uint32_t)c->max_queue : 64;
    size_t meta_len;
    const void *meta = meta_bytes(w, &meta_len);
    uint64_t weights = 0;
    for (uint64_t i = 0; i < w->f->n_tensors; i++)
        weights += w->f->tensors[i].nbytes;
    struct service_opts so = {
        .meta = meta,
        .meta_len = meta_len,
        .fingerprint = XXH3_64bits(meta, meta_len),
        .model_name = w->model_name,
        .arch = w->arch,
        .n_vocab = hp->n_vocab,
        .n_ctx = n_ctx,
        .max_running = max_running,
        .max_queue = max_queue,
        .weights_bytes = weights,
        .watchdog_ms = c->watchdog_ms,
    };
    if ((rv = service_init(&so, &w->svc)) != 0) goto fail;
    struct engine_opts eo = {
        .n_ctx = n_ctx,
        .max_running = max_running,
        .max_queue = max_queue,
        .n_threads = c->threads ? (uint32_t)c->threads : 1,
        .orphan_timeout_ms = (uint32_t)(c->orphan_timeout_s ? c->orphan_timeout_s : 10) * 1000,
        .on_window = service_on_window,
        .window_ctx = w->svc,
        .on_route = w->state ? heat : NULL,
        .route_ctx = w->state,
        .backend = c->backend,
        .spec_lookup = c->spec_lookup > 0 ? (uint32_t)c->spec_lookup : 0,
        .draft = w->draft,
        .spec_draft = c->draft_max > 0 ? (uint32_t)c->draft_max : 0,
    };
    /* The expert cache's first fill, hottest first: by the arena's decayed profile (the last
     * worker's tier), else by its heat totals. */
    const size_t n_cells = (size_t)hp->n_layer * hp->n_expert;
    uint64_t *heat = NULL;
    float *decayed = NULL;
    if (w->state && w->state->hdr->n_layers == hp->n_layer &&
        w->state->hdr->n_expert == hp->n_expert && (heat = malloc(n_cells * sizeof *heat)) &&
        (decayed = malloc(n_cells * sizeof *decayed))) {
        const bool recent = arena_profile_get(w->state, decayed);
        for (size_t i = 0; i < n_cells; i++)
            heat[i] = recent ? (uint64_t)(decayed[i] * 1024.0f) : atomic_load(&w->state->heat[i]);
        eo.backend.heat = heat;
        eo.backend.on_round = profile;
        eo.backend.round_ctx = w->state;
        LOG_INFO("expert cache: first fill by the arena's %s",
                 recent ? "decayed profile" : "heat totals");
    }
    rv = engine_start(w->m, &eo, &w->e);
    free(heat);
    free(decayed);
    eo.backend.heat = NULL;
    if (rv != 0) {
        if (w->draft) rv = strata_errf(rv, "--draft %s: %s", c->draft, strata_errdetail());
        goto fail;
    }
    struct backend_info bi;
    engine_backend_info(w->e, &bi);
    if (c->bit_exact && !bi.bit_exact) {
        rv = strata_errf(STRATA_EUNSUPPORTED,
                         "--bit-exact: the %s backend cannot promise bit-exact answers with this "
                         "configuration: drop --bit-exact or change the backend's options",
                         bi.name);
        goto fail;
    }
    if ((rv = serve(w)) != 0) goto fail;
    if (w->state && (rv = arena_worker_register(w->state, -1, w->url, 0, 0, &w->slot)) != 0)
        goto fail;
    LOG_INFO("worker: %s (%s, %u layers, %u experts) from %s %s, context %u, %u streams, "
             "fingerprint %016llx%s",
             w->model_name, w->arch, hp->n_layer, hp->n_expert, c->arena ? "arena" : "file",
             c->arena ? c->arena : c->model, n_ctx, max_running, (unsigned long long)so.fingerprint,
             w->slot >= 0 ? ", registered" : "");
    *out = w;
    return 0;
fail:
    worker_fini(w);
    return rv;
}

int worker_run(struct worker *w)
{
    bool warned = false;
    while (!atomic_load(&w->stop)) {
        for (int i = 0; i < 10 && !atomic_load(&w->stop); i++)
            nanosleep(&(struct timespec){0, 100 * 1000000}, NULL);
        if (w->slot >= 0) arena_worker_heartbeat(w->state, w->slot);
        if (w->arena && !warned && shm_removed(&w->arena->seg)) {
            LOG_WARN("arena %s was removed while this worker maps it: it keeps serving from its "
                     "mapping; restart it once a new arena is up",
                     w->name);
            warned = true;
        }
    }
    return 0;
}

void worker_stop(struct worker *w)
{
    atomic_store(&w->stop, 1);
}

void worker_fini(struct worker *w)
{
    if (!w) return;
    if (w->slot >= 0) arena_worker_unregister(w->state, w->slot);
    if (w->svc) service_stop(w->svc);
    engine_close(w->e);
    service_fini(w->svc);
    model_fini(w->m);
    gguf_close(w->f);
    model_fini(w->draft);
    gguf_close(w->draft_f);
    arena_layout_fini(w->plan);
    arena_state_close(w->state);
    arena_close(w->arena);
    free(w);
}

const char *worker_url(const struct worker *w)
{
    return w->url;
}
