#include "common/arena/arena.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/quant/qtype.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(struct arena_header) <= ARENA_HEADER_BYTES, "header fits its page");
_Static_assert(sizeof(struct arena_worker) == 256, "registry entries are 256 bytes");

/* Limits that keep every product below 2^64 and refuse absurd images cheaply. */
#define MAX_LAYERS  65536u
#define MAX_EXPERTS 65536u
#define MAX_PARTS   64u /* per layer */

/* in_image: [off, off+len) lies inside an image of size bytes, without overflow. */
static bool in_image(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}

static bool is_pow2(uint64_t v)
{
    return v && !(v & (v - 1));
}

/* check_dims: dims, a known type, and bytes equal to what the shape takes in that type (a reader
 * sizes its loops by the shape, so the two must agree). */
static int check_dims(const char *what, uint64_t i, uint32_t n_dims, const uint64_t *ne,
                      uint32_t type, uint64_t bytes)
{
    if (n_dims < 1 || n_dims > ARENA_MAX_DIMS)
        return strata_errf(STRATA_EFORMAT, "%s %llu has %u dims", what, (unsigned long long)i,
                           n_dims);
    for (uint32_t d = 0; d < ARENA_MAX_DIMS; d++)
        if (ne[d] == 0)
            return strata_errf(STRATA_EFORMAT, "%s %llu has a zero dimension", what,
                               (unsigned long long)i);
    if (!qtype_get(type))
        return strata_errf(STRATA_EFORMAT, "%s %llu has unknown type %u", what,
                           (unsigned long long)i, type);
    uint64_t total;
    if (qtype_row_bytes(type, ne[0], &total) != 0)
        return strata_errf(STRATA_EFORMAT, "%s %llu: rows of %llu do not fit type %s", what,
                           (unsigned long long)i, (unsigned long long)ne[0], qtype_name(type));
    for (uint32_t d = 1; d < ARENA_MAX_DIMS; d++)
        if (__builtin_mul_overflow(total, ne[d], &total))
            return strata_errf(STRATA_EFORMAT, "%s %llu: size overflows", what,
                               (unsigned long long)i);
    if (total != bytes)
        return strata_errf(STRATA_EFORMAT, "%s %llu: %llu bytes, its shape takes %llu", what,
                           (unsigned long long)i, (unsigned long long)bytes,
                           (unsigned long long)total);
    return 0;
}

int arena_check(const uint8_t *img, uint64_t size)
{
    if (size < ARENA_HEADER_BYTES)
        return strata_errf(STRATA_EFORMAT, "arena image of %llu bytes is smaller than its header",
                           (unsigned long long)size);
    const struct arena_header *h = (const struct arena_header *)img;
    if (memcmp(h->magic, ARENA_MAGIC, 8) != 0)
        return strata_errf(STRATA_EFORMAT, "not a strata arena (bad magic)");
    if (h->version_major != ARENA_VERSION_MAJOR)
        return strata_errf(STRATA_EPROTO,
                           "arena layout version %u.%u, this build reads %u.x: restart the "
                           "arena-server of this version",
                           h->version_major, h->version_minor, ARENA_VERSION_MAJOR);
    uint32_t st = atomic_load_explicit(&h->state, memory_order_acquire);
    if (st != ARENA_READY)
        return strata_errf(STRATA_ESTATE, "arena state is %u, not READY (still being built?)", st);
    if (h->total_bytes != size)
        return strata_errf(STRATA_EFORMAT, "arena header says %llu bytes, the segment has %llu",
                           (unsigned long long)h->total_bytes, (unsigned long long)size);
    if (!is_pow2(h->align) || h->align < ARENA_ALIGN_SMALL)
        return strata_errf(STRATA_EFORMAT, "arena alignment %llu is not a power of two >= 4096",
                           (unsigned long long)h->align);
    if (h->n_layers > MAX_LAYERS || h->n_expert > MAX_EXPERTS ||
        h->n_parts > (uint64_t)MAX_PARTS * MAX_LAYERS || h->n_dense > (1u << 24))
        return strata_errf(STRATA_EFORMAT, "arena counts out of range (%u layers, %u experts)",
                           h->n_layers, h->n_expert);
    uint64_t n_blobs = (uint64_t)h->n_layers * h->n_expert;
    if (!in_image(h->meta_off, h->meta_bytes, size) ||
        !in_image(h->strings_off, h->strings_bytes, size) ||
        !in_image(h->dense_table_off, h->n_dense * sizeof(struct arena_tensor), size) ||
        !in_image(h->dense_off, h->dense_bytes, size) ||
        !in_image(h->layers_off, h->n_layers * (uint64_t)sizeof(struct arena_layer), size) ||
        !in_image(h->parts_off, h->n_parts * sizeof(struct arena_part), size) ||
        !in_image(h->hashes_off, n_blobs * 8, size) ||
        !in_image(h->expert_base, h->expert_bytes, size))
        return strata_errf(STRATA_EFORMAT, "an arena section lies outside the %llu-byte segment",
                           (unsigned long long)size);
    if ((h->dense_table_off | h->layers_off | h->parts_off | h->hashes_off) % 8 != 0 ||
        h->expert_base % h->align != 0)
        return strata_errf(STRATA_EFORMAT, "an arena table or the expert region is misaligned");
    if (h->strings_bytes == 0 || img[h->strings_off + h->strings_bytes - 1] != '\0')
        return strata_errf(STRATA_EFORMAT, "arena string table is not NUL-terminated");
    if (h->model_path_off >= h->strings_bytes)
        return strata_errf(STRATA_EFORMAT, "arena model path offset out of range");

    const struct arena_tensor *dt = (const void *)(img + h->dense_table_off);
    for (uint64_t i = 0; i < h->n_dense; i++) {
        int rv = check_dims("dense tensor", i, dt[i].n_dims, dt[i].ne, dt[i].type, dt[i].bytes);
        if (rv != 0) return rv;
        if (dt[i].name_off >= h->strings_bytes || dt[i].offset % ARENA_PART_ALIGN != 0 ||
            dt[i].offset < h->dense_off ||
            !in_image(dt[i].offset - h->dense_off, dt[i].bytes, h->dense_bytes))
            return strata_errf(STRATA_EFORMAT, "dense tensor %llu lies outside the dense region",
                               (unsigned long long)i);
    }

    const struct arena_layer *ly = (const void *)(img + h->layers_off);
    const struct arena_part *pt = (const void *)(img + h->parts_off);
    uint64_t next_free = 0; /* layers are laid out in order, so disjointness is monotonicity */
    for (uint32_t l = 0; l < h->n_layers; l++) {
        const struct arena_layer *L = &ly[l];
        if (L->n_parts == 0) {
            if (L->blob_bytes != 0)
                return strata_errf(STRATA_EFORMAT, "layer %u has blob bytes but no parts", l);
            continue;
        }
        if (L->n_parts > MAX_PARTS || L->part_first > h->n_parts ||
            L->n_parts > h->n_parts - L->part_first)
            return strata_errf(STRATA_EFORMAT, "layer %u's parts are out of range", l);
        if (L->blob_bytes == 0 || L->stride < L->blob_bytes || L->stride % h->align != 0 ||
            L->offset % h->align != 0 || L->offset < next_free ||
            L->stride > h->expert_bytes / (h->n_expert ? h->n_expert : 1) ||
            !in_image(L->offset, L->stride * h->n_expert, h->expert_bytes))
            return strata_errf(STRATA_EFORMAT,
                               "layer %u's blobs (offset %llu, stride %llu, %llu bytes) do not fit "
                               "the expert region",
                               l, (unsigned long long)L->offset, (unsigned long long)L->stride,
                               (unsigned long long)L->blob_bytes);
        next_free = L->offset + L->stride * h->n_expert;
        uint64_t part_end = 0;
        for (uint32_t p = 0; p < L->n_parts; p++) {
            const struct arena_part *P = &pt[L->part_first + p];
            int rv = check_dims("part", L->part_first + p, P->n_dims, P->ne, P->type, P->bytes);
            if (rv != 0) return rv;
            if (P->name_off >= h->strings_bytes || P->offset % ARENA_PART_ALIGN != 0 ||
                P->offset < part_end || !in_image(P->offset, P->bytes, L->blob_bytes))
                return strata_errf(STRATA_EFORMAT, "layer %u part %u lies outside its blob", l, p);
            part_end = P->offset + P->bytes;
        }
    }
    return 0;
}

void arena_view(const uint8_t *img, uint64_t size, struct arena *a)
{
    const struct arena_header *h = (const struct arena_header *)img;
    memset(a, 0, sizeof *a);
    a->seg = (struct shm_seg)SHM_SEG_INIT;
    a->seg.size = size;
    a->hdr = h;
    a->strings = (const char *)img + h->strings_off;
    a->dense = (const void *)(img + h->dense_table_off);
    a->layers = (const void *)(img + h->layers_off);
    a->parts = (const void *)(img + h->parts_off);
    a->hashes = (const void *)(img + h->hashes_off);
}

int arena_open(const char *dir, const char *name, struct arena **out)
{
    char seg[256];
    int rv;
    struct arena *a = NULL;
    struct shm_seg s = SHM_SEG_INIT;
    if ((rv = shm_name(seg, sizeof seg, name, "")) != 0) return rv;
    if ((rv = shm_open_seg(dir, seg, false, false, &s)) != 0) {
        if (rv == STRATA_ENOENT)
            return strata_errf(STRATA_ENOENT, "no arena '%s' in %s: start `strata-arena serve`",
                               name, dir && *dir ? dir : SHM_DEFAULT_DIR);
        return rv;
    }
    if ((rv = arena_check(s.map, s.size)) != 0) goto fail;
    a = malloc(sizeof *a);
    if (!a) {
        rv = STRATA_ENOMEM;
        goto fail;
    }
    arena_view(s.map, s.size, a);
    a->seg = s;
    *out = a;
    return 0;
fail:
    shm_close(&s);
    return rv;
}

void arena_close(struct arena *a)
{
    if (!a) return;
    if (shm_is_open(&a->seg)) shm_close(&a->seg);
    free(a);
}

const struct arena_layer *arena_layer_get(const struct arena *a, uint32_t l)
{
    return l < a->hdr->n_layers ? &a->layers[l] : NULL;
}

const uint8_t *arena_blob_at(const struct arena *a, uint32_t l, uint32_t e)
{
    const struct arena_header *h = a->hdr;
    if (l >= h->n_layers || e >= h->n_expert || a->layers[l].n_parts == 0) return NULL;
    return (const uint8_t *)h + arena_blob_offset(h, &a->layers[l], e);
}

uint64_t arena_blob_hash(const struct arena *a, uint32_t l, uint32_t e)
{
    if (l >= a->hdr->n_layers || e >= a->hdr->n_expert) return 0;
    return a->hashes[(uint64_t)l * a->hdr->n_expert + e];
}

const char *arena_str(const struct arena *a, uint64_t off)
{
    return off < a->hdr->strings_bytes ? a->strings + off : "";
}

int arena_part_name(const struct arena *a, const struct arena_part *p, uint32_t e, char *buf,
                    size_t n)
{
    const char *name = arena_str(a, p->name_off);
    const char *star = (p->flags & ARENA_PART_PER_EXPERT) ? strchr(name, '*') : NULL;
    int w = star ? snprintf(buf, n, "%.*s%u%s", (int)(star - name), name, e, star + 1)
                 : snprintf(buf, n, "%s", name);
    if (w < 0 || (size_t)w >= n) return strata_errf(STRATA_EOVERFLOW, "tensor name too long");
    return 0;
}

const struct arena_tensor *arena_dense_find(const struct arena *a, const char *name)
{
    for (uint64_t i = 0; i < a->hdr->n_dense; i++)
        if (strcmp(arena_str(a, a->dense[i].name_off), name) == 0) return &a->dense[i];
    return NULL;
}

int arena_meta(const struct arena *a, struct gguf_file **out)
{
    const uint8_t *img = (const uint8_t *)a->hdr;
    return gguf_open_mem(img + a->hdr->meta_off, a->hdr->meta_bytes, false, out);
}

/* ---- state segment --------------------------------------------------------------------------- */

static uint64_t heat_off(void)
{
    return (sizeof(struct arena_state_header) + 63) & ~(uint64_t)63;
}

/* state_bytes: the segment with the decayed profile (float bits after the heat counters), or
 * without it (segments made before it was added, still read). */
static uint64_t state_bytes(uint32_t n_layers, uint32_t n_expert, bool profile)
{
    const uint64_t n = (uint64_t)n_layers * n_expert;
    uint64_t b = heat_off() + n * sizeof(uint64_t) + (profile ? n * sizeof(uint32_t) : 0);
    return (b + 4095) & ~(uint64_t)4095;
}

uint64_t arena_state_size(uint32_t n_layers, uint32_t n_expert)
{
    return state_bytes(n_layers, n_expert, true);
}

void arena_state_init(void *img, uint32_t n_layers, uint32_t n_expert, uint64_t fingerprint)
{
    struct arena_state_header *h = img;
    memcpy(h->magic, ARENA_STATE_MAGIC, 8);
    h->version_major = ARENA_VERSION_MAJOR;
    h->version_minor = ARENA_VERSION_MINOR;
    h->n_layers = n_layers;
    h->n_expert = n_expert;
    h->fingerprint = fingerprint;
    h->total_bytes = arena_state_size(n_layers, n_expert);
    h->heat_off = heat_off();
}

int arena_state_view(void *img, uint64_t size, struct arena_state *st)
{
    struct arena_state_header *h = img;
    if (size < sizeof *h || memcmp(h->magic, ARENA_STATE_MAGIC, 8) != 0)
        return strata_errf(STRATA_EFORMAT, "not a strata arena state segment");
    if (h->version_major != ARENA_VERSION_MAJOR)
        return strata_errf(STRATA_EPROTO, "arena state version %u, this build reads %u",
                           h->version_major, ARENA_VERSION_MAJOR);
    if (h->n_layers > MAX_LAYERS || h->n_expert > MAX_EXPERTS ||
        (h->total_bytes != state_bytes(h->n_layers, h->n_expert, true) &&
         h->total_bytes != state_bytes(h->n_layers, h->n_expert, false)) ||
        h->total_bytes != size || h->heat_off != heat_off())
        return strata_errf(STRATA_EFORMAT, "arena state segment of %llu bytes has a bad size",
                           (unsigned long long)size);
    memset(st, 0, sizeof *st);
    st->seg = (struct shm_seg)SHM_SEG_INIT;
    st->hdr = h;
    st->heat = (_Atomic uint64_t *)((uint8_t *)img + h->heat_off);
    /* a segment made before the profile was added may have no room for it: read without (when
     * both sizes round to the same pages, its zeroed tail reads as no profile yet) */
    if (h->total_bytes == state_bytes(h->n_layers, h->n_expert, true))
        st->profile = (_Atomic uint32_t *)(st->heat + (uint64_t)h->n_layers * h->n_expert);
    return 0;
}

int arena_state_open(const char *dir, const char *name, struct arena_state **out)
{
    char seg[256];
    int rv;
    struct shm_seg s = SHM_SEG_INIT;
    struct arena_state *st = NULL;
    if ((rv = shm_name(seg, sizeof seg, name, ARENA_STATE_SUFFIX)) != 0) return rv;
    if ((rv = shm_open_seg(dir, seg, true, true, &s)) != 0) return rv;
    st = malloc(sizeof *st);
    if (!st) {
        rv = STRATA_ENOMEM;
        goto fail;
    }
    if ((rv = arena_state_view(s.map, s.size, st)) != 0) goto fail;
    st->seg = s;
    *out = st;
    return 0;
fail:
    free(st);
    shm_close(&s);
    return rv;
}

void arena_state_close(struct arena_state *st)
{
    if (!st) return;
    if (shm_is_open(&st->seg)) shm_close(&st->seg);
    free(st);
}

void arena_heat_add(struct arena_state *st, uint32_t l, uint32_t e, uint64_t n)
{
    const struct arena_state_header *h = st->hdr;
    if (l >= h->n_layers || e >= h->n_expert) return;
    atomic_fetch_add_explicit(&st->heat[(uint64_t)l * h->n_expert + e], n, memory_order_relaxed);
    atomic_fetch_add_explicit(&st->hdr->heat_total, n, memory_order_relaxed);
}

void arena_profile_store(struct arena_state *st, const float *counts)
{
    if (!st->profile) return;
    const uint64_t n = (uint64_t)st->hdr->n_layers * st->hdr->n_expert;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &counts[i], sizeof bits);
        atomic_store_explicit(&st->profile[i], bits, memory_order_relaxed);
    }
}

bool arena_profile_get(const struct arena_state *st, float *out)
{
    if (!st->profile) return false;
    const uint64_t n = (uint64_t)st->hdr->n_layers * st->hdr->n_expert;
    bool any = false;
    for (uint64_t i = 0; i < n; i++) {
        const uint32_t bits = atomic_load_explicit(&st->profile[i], memory_order_relaxed);
        memcpy(&out[i], &bits, sizeof bits);
        any |= out[i] > 0;
    }
    return any;
}

bool arena_pid_alive(int32_t pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int arena_worker_register(struct arena_state *st, int gpu, const char *endpoint,
                          uint64_t cache_bytes, uint32_t cache_slots, int *slot)
{
    int32_t me = (int32_t)getpid();
    for (int i = 0; i < ARENA_MAX_WORKERS; i++) {
        struct arena_worker *w = &st->hdr->workers[i];
        int32_t cur = atomic_load(&w->pid);
        if (cur != 0 && cur != me && arena_pid_alive(cur)) continue;
        if (!atomic_compare_exchange_strong(&w->pid, &cur, me)) continue;
        w->gpu = gpu;
        w->cache_bytes = cache_bytes;
        w->cache_slots = cache_slots;
        snprintf(w->endpoint, sizeof w->endpoint, "%s", endpoint ? endpoint : "");
        atomic_store(&w->heartbeat_ns, now_ns());
        atomic_fetch_add(&st->hdr->registrations, 1);
        *slot = i;
        return 0;
    }
    return strata_errf(STRATA_EBUSY, "all %d worker slots of the arena are held by live processes",
                       ARENA_MAX_WORKERS);
}

void arena_worker_heartbeat(struct arena_state *st, int slot)
{
    if (slot >= 0 && slot < ARENA_MAX_WORKERS)
        atomic_store(&st->hdr->workers[slot].heartbeat_ns, now_ns());
}

void arena_worker_unregister(struct arena_state *st, int slot)
{
    if (slot < 0 || slot >= ARENA_MAX_WORKERS) return;
    int32_t me = (int32_t)getpid();
    atomic_compare_exchange_strong(&st->hdr->workers[slot].pid, &me, 0);
}

int arena_workers_live(const struct arena_state *st, int32_t *pids, int max)
{
    int n = 0;
    for (int i = 0; i < ARENA_MAX_WORKERS; i++) {
        int32_t pid = atomic_load(&st->hdr->workers[i].pid);
        if (!arena_pid_alive(pid)) continue;
        if (n < max) pids[n] = pid;
        n++;
    }
    return n;
}

int arena_default_name(const char *model, char *buf, size_t n)
{
    const char *base = strrchr(model, '/');
    base = base ? base + 1 : model;
    size_t len = strlen(base);
    if (len > 5 && strcmp(base + len - 5, ".gguf") == 0) len -= 5;
    /* "-00001-of-00003" (15 characters) names one split of a set, not the model. */
    if (len > 15 && strncmp(base + len - 15, "-", 1) == 0 &&
        strncmp(base + len - 9, "-of-", 4) == 0)
        len -= 15;
    if (len >= n || len > SHM_NAME_MAX)
        return strata_errf(STRATA_EINVAL,
                           "model name '%s' is too long for an arena name: pass --name", base);
    memcpy(buf, base, len);
    buf[len] = '\0';
    int rv = shm_check_name(buf);
    if (rv != 0)
        return strata_errf(rv, "%s: pass --name with letters, digits, '.', '_' and '-'",
                           strata_errdetail());
    return 0;
}
