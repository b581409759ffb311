/* gguf_read — the GGUF v2/v3 reader: open and map (one file or a split set), parse, check,
 * close, and the tensor name index; the contract is in gguf.h, values and typed getters are in
 * gguf_kv.c, what the module's files share in gguf_impl.h.
 *
 * The reader trusts nothing it reads: every length is compared with the bytes left before anything
 * is touched or allocated, so a count of 2^60 costs one comparison, not an allocation. Values that
 * live in the file (strings, scalar arrays, tensor data) are pointers into the mapping; only the
 * tables of KV pairs, tensors and array items are allocated. Integers are read with memcpy from a
 * little-endian file on a little-endian host (x86-64, aarch64: every machine strata targets).
 */
#include "common/gguf/gguf_impl.h"
#include "common/base/err.h"
#include "common/quant/qtype.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define HEADER_BYTES    24 /* magic, version, n_tensors, n_kv */
#define MIN_KV_BYTES    13 /* key length, a 1-byte key, type, a 1-byte value */
#define MIN_TINFO_BYTES 33 /* name length, a 1-byte name, n_dims, one dim, type, offset */

/* quote copies a name from a hostile file into buf for a message: printable ASCII only, cut at 80.
 */
static const char *quote(char *buf, size_t cap, const char *s, uint64_t len)
{
    size_t n = 0;
    for (uint64_t i = 0; i < len && n + 4 < cap; i++) {
        if (n >= 80) {
            memcpy(buf + n, "...", 3);
            n += 3;
            break;
        }
        unsigned char c = (unsigned char)s[i];
        buf[n++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    buf[n] = '\0';
    return buf;
}

/* ---- name index (struct gguf_nidx, gguf_impl.h) ---------------------------------------------- */

static const char *nidx_name(const void *base, size_t stride, uint64_t i)
{
    return *(char *const *)((const char *)base + i * stride);
}

int gguf_nidx_reserve(struct gguf_nidx *x, const void *base, size_t stride, uint64_t have,
                      uint64_t n)
{
    if (x->slot && n * 2 <= x->mask + 1) return 0;
    uint64_t cap = 16;
    while (cap < n * 2)
        cap *= 2;
    uint64_t *slot = calloc(cap, sizeof *slot);
    if (!slot)
        return strata_errf(STRATA_ENOMEM, "no memory for a name index of %" PRIu64 " slots", cap);
    for (uint64_t i = 0; i < have; i++) {
        const char *s = nidx_name(base, stride, i);
        uint64_t h = XXH3_64bits(s, strlen(s)) & (cap - 1);
        while (slot[h])
            h = (h + 1) & (cap - 1);
        slot[h] = i + 1;
    }
    free(x->slot);
    x->slot = slot;
    x->mask = cap - 1;
    return 0;
}

/* nidx_find returns the index of name, or -1. */
static int64_t nidx_find(const uint64_t *slot, uint64_t mask, const void *base, size_t stride,
                         const char *name)
{
    uint64_t h = XXH3_64bits(name, strlen(name)) & mask;
    for (; slot[h]; h = (h + 1) & mask) {
        uint64_t i = slot[h] - 1;
        if (strcmp(nidx_name(base, stride, i), name) == 0) return (int64_t)i;
    }
    return -1;
}

const struct gguf_tensor *gguf_tensor_find(const struct gguf_file *f, const char *name)
{
    if (!f->index) {
        for (uint64_t i = 0; i < f->n_tensors; i++)
            if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
        return NULL;
    }
    int64_t i = nidx_find(f->index, f->index_mask, f->tensors, sizeof *f->tensors, name);
    return i < 0 ? NULL : &f->tensors[i];
}

int64_t gguf_nidx_add(struct gguf_nidx *x, const void *base, size_t stride, uint64_t i)
{
    const char *name = nidx_name(base, stride, i);
    uint64_t h = XXH3_64bits(name, strlen(name)) & x->mask;
    for (; x->slot[h]; h = (h + 1) & x->mask) {
        uint64_t j = x->slot[h] - 1;
        if (strcmp(nidx_name(base, stride, j), name) == 0) return (int64_t)j;
    }
    x->slot[h] = i + 1;
    return -1;
}

/* ---- parsing one file ------------------------------------------------------------------------ */

struct rd {
    const char *file; /* for messages */
    const uint8_t *p;
    uint64_t size;
    uint64_t off;
};

static uint64_t rd_left(const struct rd *r)
{
    return r->size - r->off;
}

/* rd_need fails unless n bytes remain; what and who name the field ("key length", "KV #3"). */
static int rd_need(const struct rd *r, uint64_t n, const char *what, const char *who)
{
    if (n <= rd_left(r)) return 0;
    return strata_errf(STRATA_ETRUNC,
                       "%s: offset %" PRIu64 ": %s of %s needs %" PRIu64
                       " bytes but the file ends at %" PRIu64,
                       r->file, r->off, what, who, n, r->size);
}

static uint64_t rd_uint(struct rd *r, size_t n)
{
    uint64_t v = 0;
    memcpy(&v, r->p + r->off, n);
    r->off += n;
    return v;
}

/* rd_str reads a length-prefixed string that must fit in the file. */
static int rd_str(struct rd *r, const char *what, const char *who, struct gguf_str *out)
{
    int rv = rd_need(r, 8, what, who);
    if (rv) return rv;
    uint64_t at = r->off;
    uint64_t len = rd_uint(r, 8);
    if (len > rd_left(r))
        return strata_errf(STRATA_ETRUNC,
                           "%s: offset %" PRIu64 ": %s of %s claims %" PRIu64
                           " bytes but only %" PRIu64 " remain",
                           r->file, at, what, who, len, rd_left(r));
    out->ptr = (const char *)r->p + r->off;
    out->len = len;
    r->off += len;
    return 0;
}

/* rd_name reads a key or tensor name: nonempty, no NUL, copied NUL-terminated into *out. */
static int rd_name(struct rd *r, const char *what, const char *who, char **out)
{
    uint64_t at = r->off;
    struct gguf_str s = {0};
    int rv = rd_str(r, what, who, &s);
    if (rv) return rv;
    if (s.len == 0)
        return strata_errf(STRATA_EFORMAT, "%s: offset %" PRIu64 ": %s of %s is empty", r->file, at,
                           what, who);
    if (memchr(s.ptr, 0, s.len)) {
        char q[100];
        return strata_errf(STRATA_EFORMAT,
                           "%s: offset %" PRIu64 ": %s of %s ('%s') contains a NUL byte", r->file,
                           at, what, who, quote(q, sizeof q, s.ptr, s.len));
    }
    char *name = malloc(s.len + 1);
    if (!name)
        return strata_errf(STRATA_ENOMEM, "no memory for a name of %" PRIu64 " bytes", s.len);
    memcpy(name, s.ptr, s.len);
    name[s.len] = '\0';
    *out = name;
    return 0;
}

static int rd_value(struct rd *r, enum gguf_vtype type, int depth, const char *who,
                    struct gguf_value *v);

/* rd_array reads an array's element type, count and elements; on failure v owns nothing. depth is
 * this array's nesting level, 1 for an array that is a KV's value. */
static int rd_array(struct rd *r, int depth, const char *who, struct gguf_value *v)
{
    uint64_t at = r->off;
    int rv = rd_need(r, 12, "array header", who);
    if (rv) return rv;
    uint32_t elem = (uint32_t)rd_uint(r, 4);
    uint64_t n = rd_uint(r, 8);
    if (elem >= GGUF_VTYPE_COUNT)
        return strata_errf(STRATA_EFORMAT,
                           "%s: offset %" PRIu64 ": array of %s has unknown element type %u",
                           r->file, at, who, elem);
    if (elem == GGUF_ARRAY && depth >= GGUF_MAX_DEPTH)
        return strata_errf(STRATA_EFORMAT,
                           "%s: offset %" PRIu64 ": arrays of %s nest deeper than %d levels",
                           r->file, at, who, GGUF_MAX_DEPTH);
    uint64_t min = elem == GGUF_STRING ? 8 : elem == GGUF_ARRAY ? 12 : gguf_vtype_size(elem);
    if (n > rd_left(r) / min)
        return strata_errf(STRATA_ETRUNC,
                           "%s: offset %" PRIu64 ": array of %s declares %" PRIu64
                           " %s elements but only %" PRIu64 " bytes remain (each needs %" PRIu64
                           ")",
                           r->file, at, who, n, gguf_vtype_name(elem), rd_left(r), min);
    v->arr.type = (enum gguf_vtype)elem;
    v->arr.n = 0;
    v->arr.raw = NULL;
    v->arr.items = NULL;
    if (elem != GGUF_STRING && elem != GGUF_ARRAY) {
        const uint8_t *raw = r->p + r->off;
        if (elem == GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (raw[i] > 1)
                    return strata_errf(STRATA_EFORMAT,
                                       "%s: offset %" PRIu64 ": bool element %" PRIu64
                                       " of %s is %u, not 0 or 1",
                                       r->file, r->off + i, i, who, raw[i]);
        v->arr.raw = raw;
        v->arr.n = n;
        r->off += n * min;
        return 0;
    }
    if (n == 0) return 0;
    v->arr.items = calloc(n, sizeof *v->arr.items);
    if (!v->arr.items)
        return strata_errf(STRATA_ENOMEM, "no memory for %" PRIu64 " array items of %s", n, who);
    for (uint64_t i = 0; i < n; i++) {
        rv = rd_value(r, (enum gguf_vtype)elem, depth, who, &v->arr.items[i]);
        if (rv) {
            gguf_value_free(v, false);
            return rv;
        }
        v->arr.n = i + 1;
    }
    return 0;
}

static int rd_value(struct rd *r, enum gguf_vtype type, int depth, const char *who,
                    struct gguf_value *v)
{
    v->type = type;
    if (type == GGUF_STRING) return rd_str(r, "string", who, &v->str);
    if (type == GGUF_ARRAY) return rd_array(r, depth + 1, who, v);
    if ((unsigned)type >= GGUF_VTYPE_COUNT)
        return strata_errf(STRATA_EFORMAT, "%s: offset %" PRIu64 ": %s has unknown value type %u",
                           r->file, r->off - 4, who, (unsigned)type);
    size_t n = gguf_vtype_size(type);
    int rv = rd_need(r, n, "value", who);
    if (rv) return rv;
    uint64_t at = r->off;
    uint64_t u = rd_uint(r, n);
    if (type == GGUF_BOOL && u > 1)
        return strata_errf(STRATA_EFORMAT,
                           "%s: offset %" PRIu64 ": bool %s is %" PRIu64 ", not 0 or 1", r->file,
                           at, who, u);
    gguf_decode_scalar(type, u, v);
    return 0;
}

/* One split being parsed: its header, and its KV pairs until the caller takes them. */
struct part {
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv;
    struct gguf_kv *kv;
    uint64_t header_bytes;
    uint64_t data_off;
};

static void kv_free(struct gguf_kv *kv, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        free(kv[i].key);
        gguf_value_free(&kv[i].val, false);
    }
    free(kv);
}

static int rd_header(struct rd *r, struct part *pt, uint64_t *n_tensors, uint64_t *n_kv_out)
{
    if (r->size < HEADER_BYTES)
        return strata_errf(STRATA_ETRUNC,
                           "%s: %" PRIu64 " bytes is too short for a GGUF header (%d bytes)",
                           r->file, r->size, HEADER_BYTES);
    uint32_t magic = (uint32_t)rd_uint(r, 4);
    if (magic != GGUF_MAGIC)
        return strata_errf(STRATA_EFORMAT,
                           "%s: offset 0: magic is 0x%08x, not 0x%08x (\"GGUF\"): not a GGUF file",
                           r->file, magic, GGUF_MAGIC);
    uint32_t version = (uint32_t)rd_uint(r, 4);
    if (version == 1)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "%s: offset 4: GGUF version 1 is not supported (only 2 and 3): "
                           "convert the file with a current llama.cpp",
                           r->file);
    if (version != 2 && version != 3) {
        if (__builtin_bswap32(version) >= 1 && __builtin_bswap32(version) <= 3)
            return strata_errf(STRATA_EUNSUPPORTED,
                               "%s: offset 4: version field reads 0x%08x: this is a "
                               "big-endian GGUF file; strata reads little-endian files only",
                               r->file, version);
        return strata_errf(STRATA_EUNSUPPORTED,
                           "%s: offset 4: GGUF version %u is not supported (only 2 and 3)", r->file,
                           version);
    }
    pt->version = version;
    *n_tensors = rd_uint(r, 8);
    uint64_t n_kv = rd_uint(r, 8);
    if (n_kv > rd_left(r) / MIN_KV_BYTES)
        return strata_errf(STRATA_ETRUNC,
                           "%s: offset 16: header declares %" PRIu64 " KV pairs but only %" PRIu64
                           " bytes follow (each needs at least %d)",
                           r->file, n_kv, rd_left(r), MIN_KV_BYTES);
    *n_kv_out = n_kv;
    return 0;
}

/* check_alignment takes general.alignment (the KV at offset at) as pt's alignment. */
static int check_alignment(const struct rd *r, uint64_t at, const struct gguf_value *v,
                           struct part *pt)
{
    if (v->type != GGUF_UINT32)
        return strata_errf(STRATA_EFORMAT,
                           "%s: offset %" PRIu64
                           ": general.alignment has type %s; it must be uint32",
                           r->file, at, gguf_vtype_name(v->type));
    if (v->u == 0 || (v->u & (v->u - 1)) != 0)
        return strata_errf(STRATA_EFORMAT,
                           "%s: offset %" PRIu64 ": general.alignment is %" PRIu64
                           "; it must be a nonzero power of two",
                           r->file, at, v->u);
    pt->alignment = (uint32_t)v->u;
    return 0;
}

static int rd_kvs(struct rd *r, uint64_t n, struct part *pt)
{
    struct gguf_nidx idx = {0};
    int rv = 0;
    char who[128], q[100];
    pt->alignment = GGUF_DEFAULT_ALIGNMENT;
    pt->kv = calloc(n ? n : 1, sizeof *pt->kv);
    if (!pt->kv) return strata_errf(STRATA_ENOMEM, "no memory for %" PRIu64 " KV pairs", n);
    if ((rv = gguf_nidx_reserve(&idx, pt->kv, sizeof *pt->kv, 0, n)) != 0) goto fail;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_kv *kv = &pt->kv[i];
        uint64_t at = r->off;
        snprintf(who, sizeof who, "KV #%" PRIu64, i);
        if ((rv = rd_name(r, "key", who, &kv->key)) != 0) goto fail;
        pt->n_kv = i + 1;
        snprintf(who, sizeof who, "KV '%s'", quote(q, sizeof q, kv->key, strlen(kv->key)));
        int64_t dup = gguf_nidx_add(&idx, pt->kv, sizeof *pt->kv, i);
        if (dup >= 0) {
            rv = strata_errf(STRATA_EFORMAT,
                             "%s: offset %" PRIu64 ": duplicate key: %s repeats KV #%" PRId64,
                             r->file, at, who, dup);
            goto fail;
        }
        if ((rv = rd_need(r, 4, "value type", who)) != 0) goto fail;
        kv->val.type = GGUF_VTYPE_COUNT; /* nothing to free until parsed */
        enum gguf_vtype t = (enum gguf_vtype)rd_uint(r, 4);
        if ((rv = rd_value(r, t, 0, who, &kv->val)) != 0) {
            kv->val.type = GGUF_VTYPE_COUNT;
            goto fail;
        }
        if (strcmp(kv->key, "general.alignment") == 0 &&
            (rv = check_alignment(r, at, &kv->val, pt)) != 0)
            goto fail;
    }
    free(idx.slot);
    return 0;
fail:
    free(idx.slot);
    kv_free(pt->kv, pt->n_kv);
    pt->kv = NULL;
    pt->n_kv = 0;
    return rv;
}

/* rd_tinfo reads one tensor info into t (name owned by t on success). */
static int rd_tinfo(struct rd *r, uint64_t i, uint32_t alignment, struct gguf_tensor *t)
{
    char who[128], q[100];
    snprintf(who, sizeof who, "tensor #%" PRIu64, i);
    int rv = rd_name(r, "name", who, &t->name);
    if (rv) return rv;
    snprintf(who, sizeof who, "tensor '%s'", quote(q, sizeof q, t->name, strlen(t->name)));
    uint64_t at = r->off;
    if ((rv = rd_need(r, 4, "dimension count", who)) != 0) goto fail;
    t->n_dims = (uint32_t)rd_uint(r, 4);
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) {
        rv = strata_errf(STRATA_EFORMAT,
                         "%s: offset %" PRIu64 ": %s has %u dimensions; it must have 1 to %d",
                         r->file, at, who, t->n_dims, GGUF_MAX_DIMS);
        goto fail;
    }
    if ((rv = rd_need(r, 8ull * t->n_dims + 12, "shape, type and offset", who)) != 0) goto fail;
    uint64_t elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims) continue;
        at = r->off;
        int64_t ne = (int64_t)rd_uint(r, 8);
        /* ggml accepts 0, but no model holds an empty tensor and every consumer divides by dims. */
        if (ne < 1) {
            rv = strata_errf(STRATA_EFORMAT,
                             "%s: offset %" PRIu64 ": %s dimension %u is %" PRId64
                             "; it must be >= 1",
                             r->file, at, who, d, ne);
            goto fail;
        }
        if ((uint64_t)ne > (uint64_t)INT64_MAX / elems) {
            rv = strata_errf(STRATA_EOVERFLOW,
                             "%s: offset %" PRIu64
                             ": %s element count overflows int64 at dimension %u (%" PRId64 ")",
                             r->file, at, who, d, ne);
            goto fail;
        }
        t->ne[d] = (uint64_t)ne;
        elems *= (uint64_t)ne;
    }
    at = r->off;
    t->type = (uint32_t)rd_uint(r, 4);
    const struct qtype_info *qt = qtype_get(t->type);
    if (!qt) {
        rv = strata_errf(STRATA_EUNSUPPORTED,
                         "%s: offset %" PRIu64 ": %s has unknown tensor type %u: "
                         "a newer ggml type this strata does not know",
                         r->file, at, who, t->type);
        goto fail;
    }
    if (t->ne[0] % qt->blck) {
        rv = strata_errf(STRATA_EFORMAT,
                         "%s: offset %" PRIu64 ": %s row length %" PRIu64
                         " is not a multiple of the %s block size %u",
                         r->file, at, who, t->ne[0], qt->name, qt->blck);
        goto fail;
    }
    /* elems fits int64 and bytes per block <= 292 < 2^9, so the product needs only this check. */
    uint64_t blocks = elems / qt->blck;
    if (blocks > (uint64_t)INT64_MAX / qt->bytes) {
        rv = strata_errf(STRATA_EOVERFLOW,
                         "%s: offset %" PRIu64 ": %s byte size (%" PRIu64
                         " %s blocks) overflows int64",
                         r->file, at, who, blocks, qt->name);
        goto fail;
    }
    t->nbytes = blocks * qt->bytes;
    at = r->off;
    t->offset = rd_uint(r, 8);
    if (t->offset % alignment) {
        rv = strata_errf(STRATA_EFORMAT,
                         "%s: offset %" PRIu64 ": %s data offset %" PRIu64
                         " is not a multiple of the alignment %u",
                         r->file, at, who, t->offset, alignment);
        goto fail;
    }
    if (t->offset > (uint64_t)INT64_MAX - t->nbytes) {
        rv = strata_errf(STRATA_EOVERFLOW,
                         "%s: offset %" PRIu64 ": %s data offset %" PRIu64 " + %" PRIu64
                         " bytes overflows int64",
                         r->file, at, who, t->offset, t->nbytes);
        goto fail;
    }
    return 0;
fail:
    free(t->name);
    t->name = NULL;
    return rv;
}

static int cmp_offset(const void *a, const void *b)
{
    const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
    const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* check_overlap sorts the n tensors of one split by offset; neighbours must not overlap. */
static int check_overlap(const char *file, uint64_t data_off, struct gguf_tensor *t, uint64_t n)
{
    if (n < 2) return 0;
    struct gguf_tensor **s = malloc(n * sizeof *s);
    if (!s) return strata_errf(STRATA_ENOMEM, "no memory to sort %" PRIu64 " tensors", n);
    for (uint64_t i = 0; i < n; i++)
        s[i] = &t[i];
    qsort(s, n, sizeof *s, cmp_offset);
    int rv = 0;
    for (uint64_t i = 1; i < n && !rv; i++) {
        if (s[i]->offset >= s[i - 1]->offset + s[i - 1]->nbytes) continue;
        char qa[100], qb[100];
        rv = strata_errf(STRATA_EFORMAT,
                         "%s: tensor '%s' data [%" PRIu64 ", %" PRIu64
                         ") overlaps tensor '%s' data [%" PRIu64 ", %" PRIu64 ")",
                         file, quote(qa, sizeof qa, s[i]->name, strlen(s[i]->name)),
                         data_off + s[i]->offset, data_off + s[i]->offset + s[i]->nbytes,
                         quote(qb, sizeof qb, s[i - 1]->name, strlen(s[i - 1]->name)),
                         data_off + s[i - 1]->offset,
                         data_off + s[i - 1]->offset + s[i - 1]->nbytes);
    }
    free(s);
    return rv;
}

/* parse_split parses one file's bytes into pt (header, KV pairs) and appends its tensors to f,
 * indexing their names in f so duplicates across splits are found too. */
static int parse_split(struct gguf_file *f, uint32_t split, const char *file, const uint8_t *p,
                       uint64_t size, bool check_data, struct part *pt)
{
    struct rd r = {file, p, size, 0};
    uint64_t n = 0, n_kv = 0;
    int rv = rd_header(&r, pt, &n, &n_kv);
    if (rv) return rv;
    if ((rv = rd_kvs(&r, n_kv, pt)) != 0) return rv;
    if (n > rd_left(&r) / MIN_TINFO_BYTES) {
        rv = strata_errf(STRATA_ETRUNC,
                         "%s: offset 8: header declares %" PRIu64 " tensors but only %" PRIu64
                         " bytes follow the KV pairs at offset %" PRIu64
                         " (each tensor info needs at least %d)",
                         file, n, rd_left(&r), r.off, MIN_TINFO_BYTES);
        goto fail;
    }
    uint64_t first = f->n_tensors;
    struct gguf_tensor *t = realloc(f->tensors, (first + n ? first + n : 1) * sizeof *t);
    if (!t) {
        rv = strata_errf(STRATA_ENOMEM, "no memory for %" PRIu64 " tensor infos", first + n);
        goto fail;
    }
    f->tensors = t;
    struct gguf_nidx idx = {f->index, f->index_mask};
    rv = gguf_nidx_reserve(&idx, t, sizeof *t, first, first + n);
    f->index = idx.slot;
    f->index_mask = idx.mask;
    if (rv) goto fail;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t at = r.off;
        memset(&t[first + i], 0, sizeof t[first + i]);
        if ((rv = rd_tinfo(&r, i, pt->alignment, &t[first + i])) != 0) goto fail;
        t[first + i].split = split;
        f->n_tensors = first + i + 1;
        int64_t dup = gguf_nidx_add(&idx, t, sizeof *t, first + i);
        if (dup >= 0) {
            char q[100];
            const char *name = t[first + i].name;
            rv = strata_errf(STRATA_EFORMAT,
                             "%s: offset %" PRIu64 ": duplicate tensor name '%s' (tensor #%" PRIu64
                             " here; first seen as tensor #%" PRId64 " of split %u)",
                             file, at, quote(q, sizeof q, name, strlen(name)), i, dup,
                             t[dup].split + 1);
            goto fail;
        }
    }
    pt->header_bytes = r.off;
    pt->data_off = gguf_round_up(r.off, pt->alignment);
    for (uint64_t i = 0; check_data && i < n; i++) {
        struct gguf_tensor *x = &t[first + i];
        /* offset + nbytes < 2^63 (checked), so adding data_off < 2^64 cannot wrap. */
        uint64_t beg = pt->data_off + x->offset, end = beg + x->nbytes;
        if (end > size) {
            char q[100];
            rv = strata_errf(STRATA_ETRUNC,
                             "%s: tensor '%s' data [%" PRIu64 ", %" PRIu64
                             ") lies past the end of the file (%" PRIu64 " bytes)",
                             file, quote(q, sizeof q, x->name, strlen(x->name)), beg, end, size);
            goto fail;
        }
        x->data = p + beg;
    }
    /* Without the data, offsets are not locations: an arena's metadata merges the tensor infos of
     * all splits, whose offsets each start again at 0. */
    if (check_data && (rv = check_overlap(file, pt->data_off, t + first, n)) != 0) goto fail;
    return 0;
fail:
    kv_free(pt->kv, pt->n_kv);
    pt->kv = NULL;
    pt->n_kv = 0;
    return rv;
}

/* The splits of a set are named PREFIX-%05d-of-%05d.gguf, as llama.cpp's gguf-split writes them. */
static bool split_name(const char *path, uint32_t *count, size_t *prefix_len)
{
    size_t n = strlen(path);
    const char *tail = "-00001-of-00000.gguf";
    size_t tl = strlen(tail);
    if (n < tl) return false;
    const char *s = path + n - tl;
    if (memcmp(s, "-00001-of-", 10) != 0 || strcmp(s + 15, ".gguf") != 0) return false;
    uint32_t c = 0;
    for (int i = 10; i < 15; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        c = c * 10 + (uint32_t)(s[i] - '0');
    }
    if (c < 1) return false;
    *count = c;
    *prefix_len = n - tl;
    return true;
}

static int map_file(const char *path, struct gguf_split *s)
{
    s->fd = -1;
    s->path = strdup(path);
    if (!s->path) return strata_errf(STRATA_ENOMEM, "no memory for a path");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return strata_errf(strata_errno(errno), "%s: cannot open: %s", path, strerror(errno));
    s->fd = fd;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return strata_errf(strata_errno(errno), "%s: fstat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return strata_errf(STRATA_EINVAL, "%s: not a regular file: give the path of a .gguf file",
                           path);
    s->size = (uint64_t)st.st_size;
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    s->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if (s->size < HEADER_BYTES)
        return strata_errf(STRATA_ETRUNC,
                           "%s: %" PRIu64 " bytes is too short for a GGUF header (%d bytes)", path,
                           s->size, HEADER_BYTES);
    void *m = mmap(NULL, s->size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return strata_errf(strata_errno(errno), "%s: mmap of %" PRIu64 " bytes: %s", path, s->size,
                           strerror(errno));
    s->map = m;
    return 0;
}

void gguf_close(struct gguf_file *f)
{
    if (!f) return;
    kv_free(f->kv, f->n_kv);
    for (uint64_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    for (uint32_t i = 0; f->splits && i < f->n_splits; i++) {
        struct gguf_split *s = &f->splits[i];
        if (s->path && s->map) munmap((void *)s->map, s->size);
        if (s->fd >= 0) close(s->fd);
        free(s->path);
    }
    free(f->splits);
    free(f->index);
    free(f);
}

/* split_u64 reads an integer split.* key of a split's KV pairs. */
static int split_u64(const char *file, const struct part *pt, const char *key, uint64_t *out)
{
    struct gguf_file view = {.n_kv = pt->n_kv, .kv = pt->kv};
    int rv = gguf_get_u64(&view, key, out);
    if (rv == STRATA_ENOENT)
        return strata_errf(STRATA_EFORMAT,
                           "%s: split file lacks the key %s: it was not written by gguf-split",
                           file, key);
    if (rv) {
        char why[512]; /* the detail is rewritten below: copy it out first */
        snprintf(why, sizeof why, "%s", strata_errdetail());
        return strata_errf(rv, "%s: %s", file, why);
    }
    return 0;
}

/* check_split checks split k's split.* keys against the file name's count and the first split's
 * split.tensors.count (*total, which split 0 sets). */
static int check_split(const char *file, const struct part *pt, uint32_t k, uint32_t count,
                       uint64_t *total)
{
    uint64_t no, cnt, tc;
    int rv;
    if ((rv = split_u64(file, pt, "split.no", &no)) != 0) return rv;
    if ((rv = split_u64(file, pt, "split.count", &cnt)) != 0) return rv;
    if ((rv = split_u64(file, pt, "split.tensors.count", &tc)) != 0) return rv;
    if (cnt != count)
        return strata_errf(STRATA_EFORMAT,
                           "%s: split.count is %" PRIu64 " but the file name says %u splits", file,
                           cnt, count);
    if (no != k)
        return strata_errf(STRATA_EFORMAT,
                           "%s: split.no is %" PRIu64
                           " but the file name says split %u (split.no %u)",
                           file, no, k + 1, k);
    if (k == 0) *total = tc;
    if (tc != *total)
        return strata_errf(STRATA_EFORMAT,
                           "%s: split.tensors.count is %" PRIu64
                           " but the first split says %" PRIu64,
                           file, tc, *total);
    return 0;
}

int gguf_open(const char *path, struct gguf_file **out)
{
    uint32_t count = 1;
    size_t prefix = 0;
    bool is_set = split_name(path, &count, &prefix);
    int rv = 0;
    struct part first = {0};
    uint64_t total = 0;
    struct gguf_file *f = calloc(1, sizeof *f);
    if (!f) return strata_errf(STRATA_ENOMEM, "no memory for a GGUF file");
    f->splits = calloc(count, sizeof *f->splits);
    if (!f->splits) {
        free(f);
        return strata_errf(STRATA_ENOMEM, "no memory for %u splits", count);
    }
    char *name = malloc(strlen(path) + 1);
    if (!name) {
        rv = strata_errf(STRATA_ENOMEM, "no memory for a path");
        goto fail;
    }
    for (uint32_t k = 0; k < count; k++) {
        struct gguf_split *s = &f->splits[k];
        if (is_set)
            sprintf(name, "%.*s-%05u-of-%05u.gguf", (int)prefix, path, k + 1, count);
        else
            strcpy(name, path);
        f->n_splits = k + 1;
        rv = map_file(name, s);
        if (rv && is_set && k > 0 && rv == (STRATA_ESYSERR | ENOENT)) {
            rv = strata_errf(
                rv,
                "%s: split %u of %u is missing (the set starts at %s): copy every split "
                "into the same directory",
                name, k + 1, count, path);
        }
        if (rv) goto fail;
        struct part pt = {0};
        if ((rv = parse_split(f, k, name, s->map, s->size, true, &pt)) != 0) goto fail;
        s->data_off = pt.data_off;
        if (k == 0) first = pt;
        if (is_set) {
            rv = check_split(name, &pt, k, count, &total);
        } else {
            uint64_t cnt = 1;
            const struct gguf_kv *c = gguf_kv_find(pt.kv, pt.n_kv, "split.count");
            if (c && gguf_vtype_unsigned(c->val.type)) cnt = c->val.u;
            if (cnt > 1)
                rv = strata_errf(STRATA_EINVAL,
                                 "%s: this file is one split of a set of %" PRIu64
                                 ": open the set's first file, named *-00001-of-%05" PRIu64 ".gguf",
                                 name, cnt, cnt);
        }
        if (k > 0) kv_free(pt.kv, pt.n_kv);
        if (rv) goto fail;
    }
    if (is_set && f->n_tensors != total) {
        rv = strata_errf(STRATA_EFORMAT,
                         "%s: split.tensors.count is %" PRIu64 " but the %u splits hold %" PRIu64
                         " tensors",
                         path, total, count, f->n_tensors);
        goto fail;
    }
    f->version = first.version;
    f->alignment = first.alignment;
    f->kv = first.kv;
    f->n_kv = first.n_kv;
    f->header_bytes = first.header_bytes;
    free(name);
    *out = f;
    return 0;
fail:
    kv_free(first.kv, first.n_kv);
    free(name);
    gguf_close(f);
    return rv;
}

int gguf_open_mem(const void *buf, size_t size, bool check_data, struct gguf_file **out)
{
    struct gguf_file *f = calloc(1, sizeof *f);
    if (!f) return strata_errf(STRATA_ENOMEM, "no memory for a GGUF file");
    f->splits = calloc(1, sizeof *f->splits);
    if (!f->splits) {
        free(f);
        return strata_errf(STRATA_ENOMEM, "no memory for a split");
    }
    f->n_splits = 1;
    f->splits[0] = (struct gguf_split){.fd = -1, .map = buf, .size = size};
    struct part pt = {0};
    int rv = parse_split(f, 0, "<memory>", buf, size, check_data, &pt);
    if (rv) {
        gguf_close(f);
        return rv;
    }
    f->splits[0].data_off = pt.data_off;
    f->version = pt.version;
    f->alignment = pt.alignment;
    f->kv = pt.kv;
    f->n_kv = pt.n_kv;
    f->header_bytes = pt.header_bytes;
    *out = f;
    return 0;
}
