#include "common/arena/arena_layout.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYERS 65536u
#define KEY_MAX    128

/* One expert tensor family of one layer while planning: a 3-D (or bias) tensor, or the n_expert
 * per-expert 2-D tensors of the old Mixtral layout. */
struct src_part {
    uint32_t layer;
    int rank;          /* blob order: gate, gate_up, up, down, others */
    char key[KEY_MAX]; /* "ffn_gate_exps.weight" or "ffn_gate.*.weight" */
    bool per_expert;
    uint32_t type, n_dims;
    uint64_t ne[ARENA_MAX_DIMS];    /* one expert's slice */
    uint64_t bytes;                 /* one expert's share */
    const struct gguf_tensor **src; /* [0] for a stacked tensor, [e] per expert */
    uint64_t name_off;              /* in the string table */
};

struct plan {
    const struct gguf_file *f;
    uint32_t n_expert;
    struct src_part *sp;
    size_t n_sp, cap_sp;
    char *str;
    size_t n_str, cap_str;
};

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* parse_blk splits "blk.N.rest" into N and rest; false for any other name. */
static bool parse_blk(const char *name, uint32_t *layer, const char **rest)
{
    if (strncmp(name, "blk.", 4) != 0) return false;
    const char *p = name + 4;
    uint64_t v = 0;
    if (*p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (uint64_t)(*p++ - '0');
        if (v >= MAX_LAYERS) return false;
    }
    if (*p != '.' || strlen(p + 1) >= KEY_MAX - 8) return false; /* long names stay dense */
    *layer = (uint32_t)v;
    *rest = p + 1;
    return true;
}

/* is_stacked: rest is "<x>_exps.weight" or "<x>_exps.bias" with no other dot. */
static bool is_stacked(const char *rest)
{
    const char *dot = strchr(rest, '.');
    if (!dot || dot - rest < 5 || strncmp(dot - 5, "_exps", 5) != 0) return false;
    return strcmp(dot + 1, "weight") == 0 || strcmp(dot + 1, "bias") == 0;
}

/* per_expert_of: rest is "ffn_{gate,up,down}.E.weight"; sets the family ("ffn_gate") length and E.
 */
static bool per_expert_of(const char *rest, size_t *fam_len, uint32_t *e)
{
    static const char *const fams[] = {"ffn_gate.", "ffn_up.", "ffn_down."};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(fams[i]);
        if (strncmp(rest, fams[i], n) != 0) continue;
        const char *p = rest + n;
        uint64_t v = 0;
        if (*p < '0' || *p > '9') return false;
        while (*p >= '0' && *p <= '9') {
            v = v * 10 + (uint64_t)(*p++ - '0');
            if (v >= 65536) return false;
        }
        if (strcmp(p, ".weight") != 0) return false;
        *fam_len = n - 1;
        *e = (uint32_t)v;
        return true;
    }
    return false;
}

static int rank_of(const char *key)
{
    static const char *const order[] = {"ffn_gate_exps.", "ffn_gate.", "ffn_gate_up_exps.",
                                        "ffn_up_exps.",   "ffn_up.",   "ffn_down_exps.",
                                        "ffn_down."};
    static const int ranks[] = {0, 0, 1, 2, 2, 3, 3};
    int r = 4;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (strncmp(key, order[i], strlen(order[i])) == 0) r = ranks[i];
    size_t n = strlen(key);
    bool bias = n >= 5 && strcmp(key + n - 5, ".bias") == 0;
    return r * 2 + (bias ? 1 : 0);
}

static int cmp_sp(const void *a, const void *b)
{
    const struct src_part *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return strcmp(x->key, y->key);
}

static int cmp_ext(const void *a, const void *b)
{
    const struct arena_extent *x = a, *y = b;
    if (x->split != y->split) return x->split < y->split ? -1 : 1;
    if (x->src != y->src) return x->src < y->src ? -1 : 1;
    return 0;
}

static int add_str(struct plan *p, const char *s, uint64_t *off)
{
    size_t n = strlen(s) + 1;
    if (p->n_str + n > p->cap_str) {
        size_t cap = (p->cap_str ? p->cap_str * 2 : 4096) + n;
        char *q = realloc(p->str, cap);
        if (!q) return STRATA_ENOMEM;
        p->str = q;
        p->cap_str = cap;
    }
    memcpy(p->str + p->n_str, s, n);
    *off = p->n_str;
    p->n_str += n;
    return 0;
}

static struct src_part *find_sp(struct plan *p, uint32_t layer, const char *key)
{
    for (size_t i = p->n_sp; i-- > 0;)
        if (p->sp[i].layer == layer && strcmp(p->sp[i].key, key) == 0) return &p->sp[i];
    return NULL;
}

static int new_sp(struct plan *p, uint32_t layer, const char *key, struct src_part **out)
{
    if (p->n_sp == p->cap_sp) {
        size_t cap = p->cap_sp ? p->cap_sp * 2 : 64;
        struct src_part *q = realloc(p->sp, cap * sizeof *q);
        if (!q) return STRATA_ENOMEM;
        p->sp = q;
        p->cap_sp = cap;
    }
    struct src_part *s = &p->sp[p->n_sp];
    memset(s, 0, sizeof *s);
    s->layer = layer;
    snprintf(s->key, sizeof s->key, "%s", key);
    s->rank = rank_of(key);
    s->src = calloc(p->n_expert ? p->n_expert : 1, sizeof *s->src);
    if (!s->src) return STRATA_ENOMEM;
    p->n_sp++;
    *out = s;
    return 0;
}

/* find_n_expert: `<arch>.expert_count`, else the last dimension of the first stacked tensor, else
 * 1 + the largest per-expert index; 0 for a model without experts. */
static int find_n_expert(const struct gguf_file *f, uint32_t *out)
{
    struct gguf_str arch;
    char key[160];
    *out = 0;
    if (gguf_get_str(f, "general.architecture", &arch) == 0 && arch.len < 100) {
        snprintf(key, sizeof key, "%.*s.expert_count", (int)arch.len, arch.ptr);
        if (gguf_get_u32(f, key, out) == 0 && *out > 0) {
            if (*out > 65536)
                return strata_errf(STRATA_EFORMAT, "%s = %u is not a plausible expert count", key,
                                   *out);
            return 0;
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        uint32_t layer, e;
        const char *rest;
        size_t fl;
        if (!parse_blk(t->name, &layer, &rest)) continue;
        if (is_stacked(rest)) {
            uint64_t n = t->ne[t->n_dims - 1];
            *out = n > 65536 ? 65536 : (uint32_t)n;
            return 0;
        }
        if (per_expert_of(rest, &fl, &e) && e + 1 > *out) *out = e + 1;
    }
    return 0;
}

static int collect(struct plan *p)
{
    const struct gguf_file *f = p->f;
    int rv;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        uint32_t layer, e;
        const char *rest;
        size_t fl;
        char key[KEY_MAX];
        if (!parse_blk(t->name, &layer, &rest)) continue;
        struct src_part *s;
        if (is_stacked(rest)) {
            uint64_t n = t->ne[t->n_dims - 1];
            if (t->n_dims < 2 || n != p->n_expert || t->nbytes % n != 0)
                return strata_errf(STRATA_EFORMAT,
                                   "tensor %s: last dimension %llu is not the expert count %u",
                                   t->name, (unsigned long long)n, p->n_expert);
            if ((rv = new_sp(p, layer, rest, &s)) != 0) return rv;
            s->type = t->type;
            s->n_dims = t->n_dims - 1;
            for (uint32_t d = 0; d < ARENA_MAX_DIMS; d++)
                s->ne[d] = d < s->n_dims ? t->ne[d] : 1;
            s->bytes = t->nbytes / n;
            s->src[0] = t;
            if ((rv = add_str(p, t->name, &s->name_off)) != 0) return rv;
        } else if (per_expert_of(rest, &fl, &e)) {
            if (e >= p->n_expert)
                return strata_errf(STRATA_EFORMAT, "tensor %s: expert %u but the model has %u",
                                   t->name, e, p->n_expert);
            snprintf(key, sizeof key, "%.*s.*.weight", (int)fl, rest);
            s = find_sp(p, layer, key);
            if (!s) {
                char name[KEY_MAX + 16];
                if ((rv = new_sp(p, layer, key, &s)) != 0) return rv;
                s->per_expert = true;
                s->type = t->type;
                s->n_dims = t->n_dims;
                memcpy(s->ne, t->ne, sizeof s->ne);
                s->bytes = t->nbytes;
                snprintf(name, sizeof name, "blk.%u.%s", layer, key);
                if ((rv = add_str(p, name, &s->name_off)) != 0) return rv;
            } else if (s->type != t->type || s->bytes != t->nbytes ||
                       memcmp(s->ne, t->ne, sizeof s->ne) != 0) {
                return strata_errf(STRATA_EUNSUPPORTED,
                                   "tensor %s differs in type or shape from expert 0 of its "
                                   "family; per-expert tensors must match",
                                   t->name);
            }
            if (s->src[e]) return strata_errf(STRATA_EFORMAT, "tensor %s appears twice", t->name);
            s->src[e] = t;
        }
    }
    for (size_t i = 0; i < p->n_sp; i++) {
        if (!p->sp[i].per_expert) continue;
        for (uint32_t e = 0; e < p->n_expert; e++)
            if (!p->sp[i].src[e])
                return strata_errf(STRATA_EFORMAT, "blk.%u.%s: expert %u's tensor is missing",
                                   p->sp[i].layer, p->sp[i].key, e);
    }
    return 0;
}

static bool is_expert_tensor(const char *name)
{
    uint32_t layer, e;
    const char *rest;
    size_t fl;
    return parse_blk(name, &layer, &rest) && (is_stacked(rest) || per_expert_of(rest, &fl, &e));
}

/* put_* serialize little-endian GGUF fields (x86-64 and aarch64 are both little-endian). */
static uint8_t *put(uint8_t *q, const void *v, size_t n)
{
    memcpy(q, v, n);
    return q + n;
}

static uint64_t info_bytes(const struct gguf_tensor *t)
{
    return 8 + strlen(t->name) + 4 + 8ull * t->n_dims + 4 + 8;
}

/* build_meta: the first split's header and KV pairs verbatim, then the tensor infos of all splits
 * (re-serialized: identical bytes for a single file), padded to the GGUF alignment. */
static int build_meta(const struct gguf_file *f, uint8_t **out, uint64_t *out_bytes)
{
    uint64_t infos0 = 0, infos_all = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        uint64_t b = info_bytes(&f->tensors[i]);
        infos_all += b;
        if (f->tensors[i].split == 0) infos0 += b;
    }
    if (f->header_bytes < 24 + infos0)
        return strata_errf(STRATA_EFORMAT,
                           "GGUF header of %llu bytes is shorter than its tensor infos",
                           (unsigned long long)f->header_bytes);
    uint64_t kv_bytes = f->header_bytes - 24 - infos0;
    uint64_t align = f->alignment ? f->alignment : GGUF_DEFAULT_ALIGNMENT;
    uint64_t n = round_up(24 + kv_bytes + infos_all, align);
    uint8_t *m = calloc(1, n), *q = m;
    if (!m) return STRATA_ENOMEM;
    const uint8_t *src = f->splits[0].map;
    q = put(q, src, 8); /* magic and version */
    q = put(q, &f->n_tensors, 8);
    q = put(q, src + 16, 8); /* n_kv */
    q = put(q, src + 24, kv_bytes);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        uint64_t len = strlen(t->name);
        q = put(q, &len, 8);
        q = put(q, t->name, len);
        q = put(q, &t->n_dims, 4);
        q = put(q, t->ne, 8ull * t->n_dims);
        q = put(q, &t->type, 4);
        q = put(q, &t->offset, 8);
    }
    *out = m;
    *out_bytes = n;
    return 0;
}

static int layout_tables(struct plan *p, struct arena_layout *L, uint64_t align)
{
    const struct gguf_file *f = p->f;
    struct arena_header *h = &L->hdr;
    uint32_t n_layers = 0;
    for (size_t i = 0; i < p->n_sp; i++)
        if (p->sp[i].layer + 1 > n_layers) n_layers = p->sp[i].layer + 1;
    uint64_t n_dense = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (!is_expert_tensor(f->tensors[i].name)) n_dense++;

    L->dense = calloc(n_dense ? n_dense : 1, sizeof *L->dense);
    L->layers = calloc(n_layers ? n_layers : 1, sizeof *L->layers);
    L->parts = calloc(p->n_sp ? p->n_sp : 1, sizeof *L->parts);
    if (!L->dense || !L->layers || !L->parts) return STRATA_ENOMEM;

    /* Dense tensors keep file order; their names go to the string table. */
    uint64_t di = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        if (is_expert_tensor(t->name)) continue;
        struct arena_tensor *d = &L->dense[di++];
        d->bytes = t->nbytes;
        memcpy(d->ne, t->ne, sizeof d->ne);
        d->n_dims = t->n_dims;
        d->type = t->type;
        int rv = add_str(p, t->name, &d->name_off);
        if (rv != 0) return rv;
    }

    /* Parts in blob order; each layer's blobs laid out one after the other. */
    uint64_t layer_off = 0;
    for (size_t i = 0; i < p->n_sp;) {
        uint32_t l = p->sp[i].layer;
        struct arena_layer *ly = &L->layers[l];
        ly->part_first = (uint32_t)i;
        uint64_t off = 0;
        for (; i < p->n_sp && p->sp[i].layer == l; i++) {
            const struct src_part *s = &p->sp[i];
            struct arena_part *pt = &L->parts[i];
            off = round_up(off, ARENA_PART_ALIGN);
            pt->offset = off;
            pt->bytes = s->bytes;
            memcpy(pt->ne, s->ne, sizeof pt->ne);
            pt->n_dims = s->n_dims;
            pt->type = s->type;
            pt->name_off = s->name_off;
            pt->flags = s->per_expert ? ARENA_PART_PER_EXPERT : 0;
            off += s->bytes;
            ly->n_parts++;
        }
        ly->blob_bytes = off;
        ly->stride = round_up(off, align);
        ly->offset = layer_off;
        layer_off += ly->stride * p->n_expert;
        L->blob_bytes_sum += off * p->n_expert;
    }

    /* Section offsets: header page, metadata, strings, tables, dense region, expert region. */
    uint64_t at = ARENA_HEADER_BYTES;
    h->meta_off = at;
    at = round_up(at + h->meta_bytes, 8);
    h->strings_off = at;
    h->strings_bytes = p->n_str;
    at = round_up(at + p->n_str, 8);
    h->dense_table_off = at;
    h->n_dense = n_dense;
    at += n_dense * sizeof(struct arena_tensor);
    h->layers_off = at;
    h->n_layers = n_layers;
    h->n_expert = p->n_expert;
    at += (uint64_t)n_layers * sizeof(struct arena_layer);
    h->parts_off = at;
    h->n_parts = p->n_sp;
    at += p->n_sp * sizeof(struct arena_part);
    h->hashes_off = at;
    at += (uint64_t)n_layers * p->n_expert * 8;
    at = round_up(at, ARENA_PART_ALIGN);
    h->dense_off = at;
    for (uint64_t i = 0; i < n_dense; i++) {
        L->dense[i].offset = at;
        at = round_up(at + L->dense[i].bytes, ARENA_PART_ALIGN);
    }
    h->dense_bytes = at - h->dense_off;
    h->expert_base = round_up(at, align);
    h->expert_bytes = layer_off;
    h->total_bytes = round_up(h->expert_base + layer_off, align);
    return 0;
}

static int make_extents(struct plan *p, struct arena_layout *L)
{
    const struct gguf_file *f = p->f;
    const struct arena_header *h = &L->hdr;
    uint64_t n = h->n_dense + (uint64_t)p->n_sp * p->n_expert;
    L->ext = calloc(n ? n : 1, sizeof *L->ext);
    if (!L->ext) return STRATA_ENOMEM;
    uint64_t k = 0, di = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        if (is_expert_tensor(t->name)) continue;
        L->ext[k++] = (struct arena_extent){.split = t->split,
                                            .src = f->splits[t->split].data_off + t->offset,
                                            .len = t->nbytes,
                                            .dst = L->dense[di++].offset};
        L->hdr.source_bytes += t->nbytes;
    }
    for (size_t i = 0; i < p->n_sp; i++) {
        const struct src_part *s = &p->sp[i];
        const struct arena_layer *ly = &L->layers[s->layer];
        for (uint32_t e = 0; e < p->n_expert; e++) {
            const struct gguf_tensor *t = s->per_expert ? s->src[e] : s->src[0];
            uint64_t src = f->splits[t->split].data_off + t->offset;
            if (!s->per_expert) src += (uint64_t)e * s->bytes;
            L->ext[k++] = (struct arena_extent){
                .split = t->split,
                .src = src,
                .len = s->bytes,
                .dst = arena_blob_offset(h, ly, e) + L->parts[i].offset};
            L->hdr.source_bytes += s->bytes;
        }
    }
    L->n_ext = k;
    qsort(L->ext, k, sizeof *L->ext, cmp_ext);
    return 0;
}

int arena_layout_plan(const struct gguf_file *f, uint64_t align, const char *model_path,
                      struct arena_layout **out)
{
    int rv;
    struct plan p = {.f = f};
    struct arena_layout *L = calloc(1, sizeof *L);
    if (!L) return STRATA_ENOMEM;
    if (align < ARENA_ALIGN_SMALL || (align & (align - 1))) {
        rv = strata_errf(STRATA_EINVAL, "alignment %llu is not a power of two >= 4096",
                         (unsigned long long)align);
        goto fail;
    }
    uint64_t path_off;
    if ((rv = add_str(&p, model_path, &path_off)) != 0) goto fail;
    if ((rv = find_n_expert(f, &p.n_expert)) != 0) goto fail;
    if ((rv = collect(&p)) != 0) goto fail;
    if (p.n_sp) qsort(p.sp, p.n_sp, sizeof *p.sp, cmp_sp); /* sp is NULL without experts */
    if ((rv = build_meta(f, &L->meta, &L->hdr.meta_bytes)) != 0) goto fail;
    if ((rv = layout_tables(&p, L, align)) != 0) goto fail;
    if ((rv = make_extents(&p, L)) != 0) goto fail;
    struct arena_header *h = &L->hdr;
    memcpy(h->magic, ARENA_MAGIC, 8);
    h->version_major = ARENA_VERSION_MAJOR;
    h->version_minor = ARENA_VERSION_MINOR;
    h->align = align;
    h->model_path_off = path_off;
    h->n_splits = f->n_splits;
    L->strings = p.str;
    p.str = NULL;
    *out = L;
    rv = 0;
fail:
    for (size_t i = 0; i < p.n_sp; i++)
        free(p.sp[i].src);
    free(p.sp);
    free(p.str);
    if (rv != 0) arena_layout_fini(L);
    return rv;
}

void arena_layout_fini(struct arena_layout *L)
{
    if (!L) return;
    free(L->meta);
    free(L->strings);
    free(L->dense);
    free(L->layers);
    free(L->parts);
    free(L->ext);
    free(L);
}

void arena_layout_write_tables(const struct arena_layout *L, uint8_t *img)
{
    const struct arena_header *h = &L->hdr;
    struct arena_header *d = (struct arena_header *)img;
    memcpy(d, h, sizeof *h);
    atomic_store_explicit(&d->state, ARENA_BUILDING, memory_order_relaxed);
    memcpy(img + h->meta_off, L->meta, h->meta_bytes);
    memcpy(img + h->strings_off, L->strings, h->strings_bytes);
    memcpy(img + h->dense_table_off, L->dense, h->n_dense * sizeof *L->dense);
    memcpy(img + h->layers_off, L->layers, (uint64_t)h->n_layers * sizeof *L->layers);
    memcpy(img + h->parts_off, L->parts, h->n_parts * sizeof *L->parts);
}
