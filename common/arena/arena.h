/* arena — the layout of a strata arena and its reader side (worker, tools, the server itself).
 *
 * The weights segment `strata-<uid>-<name>` holds, at offsets from its start: a header page, the
 * GGUF metadata (header + KV of the first split and the tensor infos of all splits, so
 * gguf_open_mem(check_data=false) parses it; tensor locations come only from the arena's tables), a
 * string table, the dense tensor table, the per-layer blob descriptors and their parts, one xxHash
 * (XXH3_64bits) per blob, the dense region (each tensor 256-byte aligned) and the expert region.
 * Blob (l, e) starts at `expert_base + layer.offset + e * layer.stride`, stride =
 * round_up(blob_bytes, align), so every blob owns its pages; a copy of a blob moves exactly
 * blob_bytes. arena_blob_at() is the one function that computes blob addresses.
 * The weights segment is immutable once its state is READY (a release store; readers load it with
 * acquire) and readers map it PROT_READ; any thread may read an open arena.
 * The state segment `strata-<uid>-<name>.state` is small and read-write: per-(layer, expert) heat
 * counters, the worker registry and counters, all updated with atomics by any process.
 */
#ifndef STRATA_ARENA_H
#define STRATA_ARENA_H

#include "common/arena/shm.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct gguf_file;

#define ARENA_MAGIC         "STRARENA"
#define ARENA_STATE_MAGIC   "STRASTAT"
#define ARENA_VERSION_MAJOR 1 /* readers refuse another major */
#define ARENA_VERSION_MINOR 0 /* additions a reader of the same major may ignore */
#define ARENA_HEADER_BYTES  4096
#define ARENA_PART_ALIGN    256 /* each part of a blob and each dense tensor starts at this */
#define ARENA_ALIGN_SMALL   4096u
#define ARENA_ALIGN_HUGE    (2u << 20)
#define ARENA_MAX_DIMS      4
#define ARENA_MAX_WORKERS   32
#define ARENA_STATE_SUFFIX  ".state"

enum arena_build_state {
    ARENA_BUILDING = 1, /* being filled under a temporary name */
    ARENA_READY = 2,    /* complete and immutable */
};

/* The header page. All offsets are bytes from the segment's start. */
struct arena_header {
    char magic[8];          /* ARENA_MAGIC, not NUL-terminated */
    uint16_t version_major; /* ARENA_VERSION_MAJOR */
    uint16_t version_minor; /* ARENA_VERSION_MINOR */
    _Atomic uint32_t state; /* enum arena_build_state */
    uint64_t total_bytes;   /* segment size; must equal the file's size */
    uint64_t fingerprint;   /* arena_fingerprint(): model files, header+KV hash, layout, align */
    uint64_t align;         /* blob alignment: ARENA_ALIGN_SMALL or ARENA_ALIGN_HUGE */
    uint64_t meta_off;      /* GGUF metadata bytes */
    uint64_t meta_bytes;
    uint64_t strings_off; /* NUL-terminated names, referenced by name_off fields */
    uint64_t strings_bytes;
    uint64_t dense_table_off; /* struct arena_tensor[n_dense] */
    uint64_t n_dense;
    uint64_t dense_off; /* dense region */
    uint64_t dense_bytes;
    uint64_t layers_off; /* struct arena_layer[n_layers], indexed by GGUF block number */
    uint32_t n_layers;   /* 1 + the largest block number holding experts */
    uint32_t n_expert;   /* experts per MoE layer */
    uint64_t parts_off;  /* struct arena_part[n_parts] */
    uint64_t n_parts;
    uint64_t hashes_off;  /* uint64_t[n_layers * n_expert]: XXH3_64bits of each blob */
    uint64_t expert_base; /* expert region, a multiple of align */
    uint64_t expert_bytes;
    uint64_t source_bytes;   /* tensor bytes copied from the GGUF file(s) */
    uint64_t model_path_off; /* strings offset of the first split's absolute path */
    uint32_t n_splits;       /* GGUF files the model came from */
    uint32_t reserved;
    int64_t built_ns; /* CLOCK_REALTIME when the build finished */
};

/* A dense (non-expert) tensor. */
struct arena_tensor {
    uint64_t offset;             /* from the segment's start, a multiple of ARENA_PART_ALIGN */
    uint64_t bytes;              /* exact data size */
    uint64_t ne[ARENA_MAX_DIMS]; /* ggml order, unused dims 1 */
    uint32_t n_dims;
    uint32_t type;     /* enum qtype */
    uint64_t name_off; /* GGUF tensor name in the string table */
};

/* One layer's blobs. A layer without experts has n_parts == 0 and blob_bytes == 0. */
struct arena_layer {
    uint64_t offset;     /* of blob (l, 0), from expert_base */
    uint64_t blob_bytes; /* bytes of one blob: end of its last part */
    uint64_t stride;     /* round_up(blob_bytes, align) */
    uint32_t part_first; /* this layer's parts: parts[part_first .. part_first+n_parts) */
    uint32_t n_parts;
};

#define ARENA_PART_PER_EXPERT                                                                      \
    1u /* the source is one 2-D tensor per expert (old Mixtral layout)                             \
        */

/* One tensor's share of every blob of a layer: gate, up, down, fused or bias, in blob order. */
struct arena_part {
    uint64_t offset;             /* within the blob, a multiple of ARENA_PART_ALIGN */
    uint64_t bytes;              /* one expert's share of the tensor */
    uint64_t ne[ARENA_MAX_DIMS]; /* one expert's slice, ggml order (the expert dim dropped) */
    uint32_t n_dims;             /* dims of the slice */
    uint32_t type;               /* enum qtype, the tensor's own type */
    uint64_t name_off; /* source tensor name; with PER_EXPERT, '*' stands for the expert */
    uint32_t flags;    /* ARENA_PART_* */
    uint32_t reserved;
};

/* A worker's entry in the registry. A slot is claimed by a CAS of pid from 0 (or a dead pid). */
struct arena_worker {
    _Atomic int32_t pid;          /* 0: free */
    int32_t gpu;                  /* CUDA device ordinal; -1 for the CPU backend */
    _Atomic int64_t heartbeat_ns; /* CLOCK_REALTIME of the worker's last heartbeat */
    uint64_t cache_bytes;         /* VRAM of its expert cache */
    uint32_t cache_slots;         /* expert slots in it */
    uint32_t reserved;
    char endpoint[224]; /* its NNG URL, NUL-terminated */
};

/* The state segment's header; heat counters follow at heat_off. */
struct arena_state_header {
    char magic[8]; /* ARENA_STATE_MAGIC */
    uint16_t version_major;
    uint16_t version_minor;
    uint32_t n_layers; /* as the weights segment */
    uint32_t n_expert;
    uint32_t reserved;
    uint64_t fingerprint; /* of the weights segment it belongs to */
    uint64_t total_bytes;
    uint64_t heat_off;              /* _Atomic uint64_t[n_layers * n_expert]: routed tokens */
    _Atomic int64_t server_pid;     /* the arena-server serving it, 0 after a clean stop */
    _Atomic int64_t server_beat_ns; /* the server's last heartbeat */
    _Atomic uint64_t registrations; /* workers registered since creation */
    _Atomic uint64_t heat_total;    /* sum of all heat added */
    _Atomic uint64_t profile_saves; /* heat profiles written */
    _Atomic uint64_t adoptions;     /* restarts of the server that adopted this arena */
    struct arena_worker workers[ARENA_MAX_WORKERS];
};

/* An open arena (reader view of the weights segment). Fields are read-only for users. */
struct arena {
    struct shm_seg seg;
    const struct arena_header *hdr;
    const char *strings;
    const struct arena_tensor *dense;
    const struct arena_layer *layers;
    const struct arena_part *parts;
    const uint64_t *hashes;
};

/* An open state segment. */
struct arena_state {
    struct shm_seg seg;
    struct arena_state_header *hdr;
    _Atomic uint64_t *heat; /* [layer * n_expert + expert] */
    _Atomic uint32_t *profile; /* [layer * n_expert + expert] the tier's decayed counts, float
                                  bits; NULL in a segment made before it existed */
};

/* arena_check validates a weights segment image of size bytes: magic, major version, state READY
 * (acquire load), total_bytes == size, every section, table entry, name and blob inside the image,
 * parts inside their blob and blobs disjoint. STRATA_EFORMAT / STRATA_EPROTO (other major) /
 * STRATA_ESTATE (not READY) with the detail. Reads no tensor data. Fuzzed (arena_fuzz.c). */
int arena_check(const uint8_t *img, uint64_t size);

/* arena_open maps segment `strata-<uid>-<name>` of dir (NULL: /dev/shm) read-only, checks it
 * (arena_check) and returns a view the caller frees with arena_close. STRATA_ENOENT when there is
 * no such arena; STRATA_EPERM when the segment is a symlink, is not owned by our uid or is
 * writable by anyone else (another user planted it: the detail names it and its owner). Blocks
 * only on the open and mmap. */
int arena_open(const char *dir, const char *name, struct arena **out);

/* arena_view builds a view over an already checked image (no mapping owned; seg.fd is -1). */
void arena_view(const uint8_t *img, uint64_t size, struct arena *out);

/* arena_close unmaps and frees; NULL is fine. */
void arena_close(struct arena *a);

/* arena_layer_get returns layer l's descriptor, or NULL past n_layers. */
const struct arena_layer *arena_layer_get(const struct arena *a, uint32_t l);

/* arena_blob_offset is the padded layout's formula, the one place it is written: the segment offset
 * of blob e of layer L, expert_base + L->offset + e * L->stride. arena_blob_at and the layout
 * planner both use it. */
static inline uint64_t arena_blob_offset(const struct arena_header *h, const struct arena_layer *L,
                                         uint32_t e)
{
    return h->expert_base + L->offset + (uint64_t)e * L->stride;
}

/* arena_blob_at returns the address of blob (l, e) in the mapping, or NULL when layer l has no
 * experts or l, e are out of range. A copy of it moves arena_layer_get(a, l)->blob_bytes. */
const uint8_t *arena_blob_at(const struct arena *a, uint32_t l, uint32_t e);

/* arena_blob_hash returns the stored XXH3_64bits of blob (l, e) (0 when out of range). */
uint64_t arena_blob_hash(const struct arena *a, uint32_t l, uint32_t e);

/* arena_str returns the NUL-terminated string at a checked name offset. */
const char *arena_str(const struct arena *a, uint64_t off);

/* arena_part_name writes part p's source tensor name for expert e into buf (the '*' of a
 * PER_EXPERT name replaced by e). STRATA_EOVERFLOW when buf is too small. */
int arena_part_name(const struct arena *a, const struct arena_part *p, uint32_t e, char *buf,
                    size_t n);

/* arena_dense_find returns the dense tensor named name, or NULL. O(n): called at load time only. */
const struct arena_tensor *arena_dense_find(const struct arena *a, const char *name);

/* arena_meta parses the stored GGUF metadata (caller frees with gguf_close; the object points into
 * the arena's mapping, so close it before arena_close). */
int arena_meta(const struct arena *a, struct gguf_file **out);

/* arena_state_size is the byte size of a state segment for n_layers x n_expert. */
uint64_t arena_state_size(uint32_t n_layers, uint32_t n_expert);

/* arena_state_init writes a fresh state header into a zeroed image of arena_state_size() bytes. */
void arena_state_init(void *img, uint32_t n_layers, uint32_t n_expert, uint64_t fingerprint);

/* arena_state_open maps `strata-<uid>-<name>.state` read-write and checks magic, version and size.
 * Workers use it to add heat and register. The segment must be ours as arena_open's is, except
 * that group write is accepted (a --group server makes it 0660): STRATA_EPERM otherwise. */
int arena_state_open(const char *dir, const char *name, struct arena_state **out);

/* arena_state_view points st at a checked state image owned by the caller (seg.fd is -1). */
int arena_state_view(void *img, uint64_t size, struct arena_state *st);

/* arena_state_close unmaps and frees; NULL is fine. */
void arena_state_close(struct arena_state *st);

/* arena_profile_store writes the adaptive tier's decayed counts (n_layers * n_expert floats) as
 * the arena's decayed profile, which a starting worker fills its cache from; the last writer's
 * round wins. arena_profile_get reads it into out and returns whether any count is positive.
 * Both lock-free; no-ops (false) on a segment without a profile. */
void arena_profile_store(struct arena_state *st, const float *counts);
bool arena_profile_get(const struct arena_state *st, float *out);

/* arena_heat_add adds n routed tokens to (l, e); ignores out-of-range ids. Lock-free. */
void arena_heat_add(struct arena_state *st, uint32_t l, uint32_t e, uint64_t n);

/* arena_worker_register claims a registry slot for the calling process (a free one or one whose pid
 * is dead) and fills it. STRATA_EBUSY when all ARENA_MAX_WORKERS slots hold live processes. */
int arena_worker_register(struct arena_state *st, int gpu, const char *endpoint,
                          uint64_t cache_bytes, uint32_t cache_slots, int *slot);

/* arena_worker_heartbeat stamps slot's heartbeat; arena_worker_unregister frees it (only if it is
 * still ours). */
void arena_worker_heartbeat(struct arena_state *st, int slot);
void arena_worker_unregister(struct arena_state *st, int slot);

/* arena_pid_alive reports whether pid names a live process (EPERM counts as alive). */
bool arena_pid_alive(int32_t pid);

/* arena_workers_live fills up to max pids of registered workers whose process is alive and returns
 * how many there are (which may exceed max). */
int arena_workers_live(const struct arena_state *st, int32_t *pids, int max);

/* arena_default_name writes the arena name for model path (base name without .gguf and
 * without a -0000K-of-0000N split suffix) to buf. STRATA_EINVAL when it is not a valid name. */
int arena_default_name(const char *model, char *buf, size_t n);

#endif
