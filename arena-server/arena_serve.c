#include "arena-server/arena_serve.h"
#include "arena-server/arena_ctl.h"
#include "arena-server/arena_fingerprint.h"
#include "common/arena/arena_layout.h"
#include "arena-server/arena_profile.h"
#include "arena-server/arena_space.h"
#include "common/base/err.h"
#include "common/base/own.h"
#include "common/gguf/gguf.h"
#include "common/base/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define GiB(x) ((x) / 1073741824.0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* take_lock opens and flocks the name's lock file. The inode check after locking guards against a
 * previous owner that unlinked the file between our open and our flock. The file lives in a
 * directory every user can write: a symlink planted there would make us truncate its target, and
 * a lock file of another user's would let them hold our name, so own_open refuses both. */
static int take_lock(struct arena_server *s)
{
    for (int attempt = 0; attempt < 10; attempt++) {
        int fd, rv;
        if ((rv = own_open(s->lock_path, O_RDWR | O_CREAT, 0600, false, &fd)) != 0) return rv;
        rv = shm_lock(fd, true, false);
        if (rv == STRATA_EBUSY) {
            char pid[32] = "";
            ssize_t r = pread(fd, pid, sizeof pid - 1, 0);
            pid[r > 0 ? r : 0] = '\0';
            pid[strcspn(pid, "\n")] = '\0';
            close(fd);
            return strata_errf(STRATA_EBUSY,
                               "arena '%s' is already served by pid %s (lock %s): stop it with "
                               "`strata-arena stop %s` or pick another --name",
                               s->name, pid[0] ? pid : "?", s->lock_path, s->name);
        }
        if (rv != 0) {
            close(fd);
            return rv;
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && lstat(s->lock_path, &b) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev) {
            char pid[32];
            int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
            if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
                LOG_WARN("cannot write pid to %s: %s", s->lock_path, strerror(errno));
            s->lock_fd = fd;
            return 0;
        }
        close(fd);
    }
    return strata_errf(STRATA_EBUSY,
                       "lock file %s keeps being replaced: another server is starting",
                       s->lock_path);
}

/* remove_stale_tmp removes temporary segments of this name left by a builder that died (we hold the
 * name's lock, so nobody else is building). */
static void remove_stale_tmp(struct arena_server *s)
{
    const char *dir = s->cfg.shm_dir && *s->cfg.shm_dir ? s->cfg.shm_dir : SHM_DEFAULT_DIR;
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s.tmp-", s->wseg);
    size_t pl = strlen(prefix);
    char sprefix[300];
    snprintf(sprefix, sizeof sprefix, "%s.tmp-", s->sseg);
    size_t sl = strlen(sprefix);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, pl) != 0 && strncmp(e->d_name, sprefix, sl) != 0) continue;
        LOG_INFO("removing %s/%s, left by a build that did not finish", dir, e->d_name);
        shm_remove(dir, e->d_name);
    }
    closedir(d);
}

/* try_adopt opens the published arena and keeps it when it is READY with our fingerprint; otherwise
 * says why and removes both segments. *adopted tells which. */
static int try_adopt(struct arena_server *s, bool *adopted)
{
    struct arena *a = NULL;
    *adopted = false;
    int rv = arena_open(s->cfg.shm_dir, s->name, &a);
    if (rv == STRATA_ENOENT) return 0;
    if (rv == STRATA_EPERM) return rv; /* not ours: neither adopted nor removed */
    if (rv == 0 && a->hdr->fingerprint != s->fingerprint) {
        char have[17], want[17];
        arena_fingerprint_hex(a->hdr->fingerprint, have);
        arena_fingerprint_hex(s->fingerprint, want);
        LOG_INFO("arena '%s' holds another model or layout (fingerprint %s, want %s): rebuilding",
                 s->name, have, want);
    } else if (rv == 0) {
        s->arena = a;
        *adopted = true;
        return 0;
    } else {
        LOG_INFO("arena '%s' cannot be adopted (%s: %s): rebuilding", s->name, strata_strerror(rv),
                 strata_errdetail());
    }
    arena_close(a);
    int rv2 = shm_remove(s->cfg.shm_dir, s->wseg);
    if (rv2 == 0) rv2 = shm_remove(s->cfg.shm_dir, s->sseg);
    return rv2;
}

static int build(struct arena_server *s, const struct gguf_file *f)
{
    struct arena_layout *L = NULL;
    struct shm_seg seg = SHM_SEG_INIT;
    char tmp[300] = ""; /* the temporary segment to remove on failure, once created */
    int rv;
    uint64_t align = s->cfg.align ? s->cfg.align : ARENA_ALIGN_SMALL;
    if ((rv = arena_layout_plan(f, align, s->model_path, &L)) != 0) return rv;
    const struct arena_header *h = &L->hdr;
    uint64_t waste = h->expert_bytes - L->blob_bytes_sum;
    LOG_INFO("arena '%s': %.2f GiB (%llu dense tensors, %u layers x %u experts, blobs aligned to "
             "%llu KiB: %.2f GiB of padding, +%.1f%% on %.2f GiB of blobs)",
             s->name, GiB(h->total_bytes), (unsigned long long)h->n_dense, h->n_layers, h->n_expert,
             (unsigned long long)(align >> 10), GiB(waste),
             L->blob_bytes_sum ? 100.0 * waste / L->blob_bytes_sum : 0.0, GiB(L->blob_bytes_sum));

    struct arena_space sp;
    uint64_t need = h->total_bytes + arena_state_size(h->n_layers, h->n_expert);
    if ((rv = arena_space_read(s->cfg.shm_dir, &sp)) != 0) goto out;
    if ((rv = arena_space_check(s->cfg.shm_dir, need, &sp)) != 0) goto out;

    snprintf(tmp, sizeof tmp, "%s.tmp-%d", s->wseg, (int)getpid());
    double t0 = now_s();
    struct arena_build_opts o = {
        .threads = s->cfg.threads, .progress = s->cfg.progress, .cancel = s->cfg.cancel};
    if ((rv = arena_build_create(L, f, s->cfg.shm_dir, tmp, &o, &seg, &s->build)) != 0) goto out;
    struct arena_header *dh = (struct arena_header *)seg.map;
    dh->fingerprint = s->fingerprint;
    dh->built_ns = wall_ns();
    /* Release: a reader that sees READY (acquire) sees every byte written before it. */
    atomic_store_explicit(&dh->state, ARENA_READY, memory_order_release);
    if ((rv = shm_publish(s->cfg.shm_dir, &seg, tmp, s->wseg, s->cfg.group ? 0440 : 0400)) != 0)
        goto out;
    tmp[0] = '\0';
    s->load_s = now_s() - t0;
    LOG_INFO("built arena '%s': %.2f GiB read in %.2f s (%.2f GiB/s; read %.2f s with %.2f s of "
             "allocation over the threads, hash %.2f s, %d threads, %llu reads)",
             s->name, GiB(s->build.bytes_read), s->load_s,
             s->load_s > 0 ? GiB(s->build.bytes_read) / s->load_s : 0.0, s->build.read_s,
             s->build.reserve_s, s->build.hash_s, s->build.threads,
             (unsigned long long)s->build.reads);
    /* Serve from a read-only mapping of what was published, checked as any reader checks it. */
    shm_close(&seg);
    rv = arena_open(s->cfg.shm_dir, s->name, &s->arena);
out:
    if (shm_is_open(&seg)) shm_close(&seg);
    if (tmp[0] && rv != 0) shm_remove(s->cfg.shm_dir, tmp);
    arena_layout_fini(L);
    return rv;
}

/* open_state adopts the state segment of an adopted arena, or creates one (and loads the profile).
 */
static int open_state(struct arena_server *s)
{
    const struct arena_header *h = s->arena->hdr;
    int rv;
    if (s->adopted) {
        rv = arena_state_open(s->cfg.shm_dir, s->name, &s->state);
        if (rv == STRATA_EPERM) return rv;
        if (rv == 0 && s->state->hdr->fingerprint == s->fingerprint) {
            atomic_fetch_add(&s->state->hdr->adoptions, 1);
            return 0;
        }
        if (rv == 0) {
            arena_state_close(s->state);
            s->state = NULL;
        }
        LOG_INFO("state segment of '%s' missing or stale: making a new one", s->name);
        shm_remove(s->cfg.shm_dir, s->sseg);
    }
    char tmp[300];
    struct shm_seg seg = SHM_SEG_INIT;
    uint64_t size = arena_state_size(h->n_layers, h->n_expert);
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", s->sseg, (int)getpid());
    if ((rv = shm_create(s->cfg.shm_dir, tmp, size, &seg)) != 0) return rv;
    arena_state_init(seg.map, h->n_layers, h->n_expert, s->fingerprint);
    s->state = calloc(1, sizeof *s->state);
    if (!s->state) {
        rv = STRATA_ENOMEM;
        goto fail;
    }
    if ((rv = arena_state_view(seg.map, size, s->state)) != 0) goto fail;
    bool other = false;
    rv = arena_profile_load(s->profile_path, s->state, &other);
    if (rv == 0)
        LOG_INFO("heat profile %s loaded (%llu routed tokens)%s", s->profile_path,
                 (unsigned long long)atomic_load(&s->state->hdr->heat_total),
                 other ? "; it was saved for another fingerprint of the same shape" : "");
    else if (rv != STRATA_ENOENT)
        LOG_WARN("heat profile not loaded: %s: %s", strata_strerror(rv), strata_errdetail());
    if ((rv = shm_publish(s->cfg.shm_dir, &seg, tmp, s->sseg, s->cfg.group ? 0660 : 0600)) != 0)
        goto fail;
    s->state->seg = seg;
    return 0;
fail:
    free(s->state);
    s->state = NULL;
    shm_close(&seg);
    shm_remove(s->cfg.shm_dir, tmp);
    return rv;
}

static int resolve_paths(struct arena_server *s, const struct arena_serve_config *cfg)
{
    int rv;
    if (cfg->name)
        rv = shm_check_name(cfg->name) == 0 ? 0 : STRATA_EINVAL;
    else
        rv = arena_default_name(cfg->model, s->name, sizeof s->name);
    if (rv != 0) return rv;
    if (cfg->name) snprintf(s->name, sizeof s->name, "%s", cfg->name);
    if (!realpath(cfg->model, s->model_path))
        return strata_errf(strata_errno(errno), "model %s: %s", cfg->model, strerror(errno));
    if ((rv = shm_name(s->wseg, sizeof s->wseg, s->name, "")) != 0) return rv;
    if ((rv = shm_name(s->sseg, sizeof s->sseg, s->name, ARENA_STATE_SUFFIX)) != 0) return rv;
    char lk[300];
    if ((rv = shm_name(lk, sizeof lk, s->name, ".lock")) != 0) return rv;
    return shm_path(s->lock_path, sizeof s->lock_path, cfg->shm_dir, lk);
}

int arena_serve_init(const struct arena_serve_config *cfg, struct arena_server **out)
{
    int rv;
    struct gguf_file *f = NULL;
    struct arena_server *s = calloc(1, sizeof *s);
    if (!s) return STRATA_ENOMEM;
    s->cfg = *cfg;
    s->lock_fd = -1;
    s->started_ns = wall_ns();
    if ((rv = resolve_paths(s, cfg)) != 0) goto fail;
    if ((rv = take_lock(s)) != 0) goto fail;
    char warn[600];
    arena_space_removeipc(cfg->shm_dir, warn, sizeof warn);
    if (warn[0]) LOG_WARN("%s", warn);

    double t0 = now_s();
    if ((rv = gguf_open(s->model_path, &f)) != 0) goto fail;
    s->fingerprint = arena_fingerprint(f, cfg->align ? cfg->align : ARENA_ALIGN_SMALL);
    if (cfg->profile)
        snprintf(s->profile_path, sizeof s->profile_path, "%s", cfg->profile);
    else if ((rv = arena_profile_path(s->fingerprint, s->profile_path, sizeof s->profile_path)) !=
             0)
        goto fail;
    remove_stale_tmp(s);
    if ((rv = try_adopt(s, &s->adopted)) != 0) goto fail;
    if (s->adopted) {
        s->load_s = now_s() - t0;
        LOG_INFO("adopted arena '%s' (%.2f GiB, fingerprint %016llx) in %.1f ms: no tensor data "
                 "read",
                 s->name, GiB(s->arena->hdr->total_bytes), (unsigned long long)s->fingerprint,
                 s->load_s * 1e3);
    } else if ((rv = build(s, f)) != 0) {
        goto fail;
    }
    gguf_close(f);
    f = NULL;
    if ((rv = open_state(s)) != 0) goto fail;
    /* Held while serving: a LOCK_SH|LOCK_NB that succeeds tells a reader no server is alive. */
    if ((rv = shm_lock_seg(s->cfg.shm_dir, s->wseg, &s->arena->seg, true, false)) != 0 ||
        (rv = shm_lock_seg(s->cfg.shm_dir, s->sseg, &s->state->seg, true, false)) != 0) {
        rv =
            strata_errf(STRATA_EBUSY, "arena '%s' segments are locked by another process", s->name);
        goto fail;
    }
    s->saved_heat = atomic_load(&s->state->hdr->heat_total);
    atomic_store(&s->state->hdr->server_pid, (int64_t)getpid());
    atomic_store(&s->state->hdr->server_beat_ns, wall_ns());
    if (cfg->control && (rv = arena_ctl_start(s, &s->ctl)) != 0) goto fail;
    *out = s;
    return 0;
fail:
    gguf_close(f);
    if (s->adopted || !s->arena) {
        arena_close(s->arena);
        arena_state_close(s->state);
    } else {
        /* A build of ours that cannot be served must not be adopted later. */
        arena_close(s->arena);
        arena_state_close(s->state);
        shm_remove(cfg->shm_dir, s->wseg);
        shm_remove(cfg->shm_dir, s->sseg);
    }
    if (s->lock_fd >= 0) {
        unlink(s->lock_path);
        close(s->lock_fd);
    }
    free(s);
    return rv;
}

/* save_profile writes the heat profile when workers added heat since it was loaded or saved:
 * nothing new keeps the disk idle, and a model that never served (one a worker refused) leaves
 * no profile file behind. */
static void save_profile(struct arena_server *s)
{
    uint64_t heat = atomic_load(&s->state->hdr->heat_total);
    if (heat == s->saved_heat) return;
    int rv = arena_profile_save(s->profile_path, s->state);
    if (rv != 0)
        LOG_WARN("heat profile not saved: %s: %s", strata_strerror(rv), strata_errdetail());
    else
        s->saved_heat = heat;
}

int arena_serve_run(struct arena_server *s)
{
    int every = s->cfg.profile_every_s > 0 ? s->cfg.profile_every_s : 60;
    double next_save = now_s() + every;
    LOG_INFO("serving arena '%s' (pid %d); stop with Ctrl-C or `strata-arena stop %s`", s->name,
             (int)getpid(), s->name);
    while (!atomic_load(&s->stop)) {
        struct timespec ts = {0, 100 * 1000000};
        nanosleep(&ts, NULL);
        atomic_store(&s->state->hdr->server_beat_ns, wall_ns());
        if (now_s() >= next_save) {
            next_save = now_s() + every;
            save_profile(s);
        }
    }
    return 0;
}

void arena_serve_stop(struct arena_server *s, bool force)
{
    if (force) atomic_store(&s->force_stop, true);
    atomic_store(&s->stop, 1);
}

void arena_serve_fini(struct arena_server *s)
{
    if (!s) return;
    arena_ctl_stop(s->ctl);
    save_profile(s);
    atomic_store(&s->state->hdr->server_pid, 0);
    int32_t pids[8];
    int live = arena_workers_live(s->state, pids, 8);
    bool force = s->cfg.force || atomic_load(&s->force_stop);
    if (live > 0 && !force) {
        char list[128] = "";
        for (int i = 0, w = 0; i < live && i < 8; i++)
            w += snprintf(list + w, sizeof list - (size_t)w, "%s%d", i ? " " : "", pids[i]);
        LOG_WARN("%d registered worker(s) still map arena '%s' (pid %s): leaving its segments for "
                 "the next arena-server to adopt; stop the workers first or pass --force",
                 live, s->name, list);
    } else {
        shm_remove(s->cfg.shm_dir, s->wseg);
        shm_remove(s->cfg.shm_dir, s->sseg);
        LOG_INFO("arena '%s' removed", s->name);
    }
    arena_close(s->arena);
    arena_state_close(s->state);
    /* Unlinked while still held, so a server racing us never locks a file that is gone. */
    unlink(s->lock_path);
    close(s->lock_fd);
    free(s);
}
