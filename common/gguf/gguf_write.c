/* gguf_write — the GGUF v3 writer of gguf.h: KV pairs and tensor infos are declared and kept in
 * memory, then written at gguf_writer_begin, then tensor data is streamed through one buffer in
 * declaration order, padded to the alignment by the writer.
 *
 * Everything the reader (gguf_read.c) would refuse is refused here first, when it is declared
 * (partial blocks, sizes past int64, nesting past GGUF_MAX_DEPTH, bools other than 0/1, repeated
 * keys or tensor names), so strata never writes a file it cannot read. The file is written as
 * PATH.tmp, fsynced and renamed, so PATH holds the old file or the whole new one.
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
#include <unistd.h>

/* Writes go through one buffer; a chunk at least as large goes to write() directly. 1 MiB stays in
 * L2, so both the copy into it and the kernel's copy out of it hit the cache: measured 2-3 GiB per
 * CPU-second for chunks of 4 KiB to 64 MiB (tmpfs, 2-core VM), above what the disk takes. */
#define WBUF_BYTES (1u << 20)

struct gguf_writer {
    char *path;
    char *tmp; /* path.tmp, renamed to path by gguf_writer_finish */
    int fd;
    uint32_t alignment;
    struct gguf_kv *kv; /* values owned (gguf_value_free(..., true)) */
    uint64_t n_kv, cap_kv;
    struct gguf_tensor *t;
    uint64_t n_t, cap_t;
    struct gguf_nidx tidx;
    uint64_t data_end; /* end of the last declared tensor, from the data section's start */
    bool begun;
    uint64_t cur;      /* tensor being streamed */
    uint64_t cur_done; /* its bytes written */
    uint8_t *buf;
    size_t buf_len;
    uint64_t written; /* bytes passed to emit, i.e. the file's size once flushed */
    int err;          /* sticky: once a write failed every later call returns it */
};

static int write_all(struct gguf_writer *w, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t k = write(w->fd, b, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0)
            return w->err = strata_errf(strata_errno(errno),
                                        "%s: write failed after %" PRIu64 " bytes: %s", w->tmp,
                                        w->written, strerror(errno));
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int flush(struct gguf_writer *w)
{
    int rv = write_all(w, w->buf, w->buf_len);
    w->buf_len = 0;
    return rv;
}

static int emit(struct gguf_writer *w, const void *p, size_t n)
{
    int rv;
    if (w->buf_len + n > WBUF_BYTES && (rv = flush(w)) != 0) return rv;
    if (n >= WBUF_BYTES) {
        if ((rv = write_all(w, p, n)) != 0) return rv;
    } else {
        memcpy(w->buf + w->buf_len, p, n);
        w->buf_len += n;
    }
    w->written += n;
    return 0;
}

static int emit_zeros(struct gguf_writer *w, uint64_t n)
{
    static const uint8_t zeros[256];
    int rv = 0;
    while (n > 0 && !rv) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        rv = emit(w, zeros, k);
        n -= k;
    }
    return rv;
}

static int emit_uint(struct gguf_writer *w, uint64_t v, size_t n)
{
    return emit(w, &v, n);
}

static int emit_str(struct gguf_writer *w, const char *s, uint64_t len)
{
    int rv = emit_uint(w, len, 8);
    return rv ? rv : emit(w, s, len);
}

/* emit_value writes a value without its type tag (the caller wrote it, or the array's header did).
 */
static int emit_value(struct gguf_writer *w, const struct gguf_value *v)
{
    int rv;
    switch (v->type) {
    case GGUF_STRING:
        return emit_str(w, v->str.ptr, v->str.len);
    case GGUF_ARRAY:
        if ((rv = emit_uint(w, v->arr.type, 4)) != 0 || (rv = emit_uint(w, v->arr.n, 8)) != 0)
            return rv;
        if (gguf_vtype_size(v->arr.type))
            return emit(w, v->arr.raw, v->arr.n * gguf_vtype_size(v->arr.type));
        for (uint64_t i = 0; i < v->arr.n; i++)
            if ((rv = emit_value(w, &v->arr.items[i])) != 0) return rv;
        return 0;
    case GGUF_FLOAT32: {
        float f = (float)v->f;
        return emit(w, &f, 4);
    }
    case GGUF_FLOAT64:
        return emit(w, &v->f, 8);
    case GGUF_BOOL:
        return emit_uint(w, v->b, 1);
    default:
        return emit_uint(w, gguf_vtype_signed(v->type) ? (uint64_t)v->i : v->u,
                         gguf_vtype_size(v->type));
    }
}

/* value_copy deep-copies src into dst (owned), checking types and nesting as the reader would. On
 * failure dst owns nothing. */
static int value_copy(struct gguf_value *dst, const struct gguf_value *src, int depth,
                      const char *key)
{
    *dst = (struct gguf_value){.type = src->type};
    if ((unsigned)src->type >= GGUF_VTYPE_COUNT)
        return strata_errf(STRATA_EINVAL, "GGUF key %s: unknown value type %u", key,
                           (unsigned)src->type);
    if (src->type == GGUF_STRING) {
        if (src->str.len && !src->str.ptr)
            return strata_errf(STRATA_EINVAL,
                               "GGUF key %s: string of %" PRIu64 " bytes has no data", key,
                               src->str.len);
        char *p = malloc(src->str.len ? src->str.len : 1);
        if (!p)
            return strata_errf(STRATA_ENOMEM, "GGUF key %s: no memory for %" PRIu64 " bytes", key,
                               src->str.len);
        if (src->str.len) memcpy(p, src->str.ptr, src->str.len);
        dst->str = (struct gguf_str){p, src->str.len};
        return 0;
    }
    if (src->type != GGUF_ARRAY) {
        *dst = *src;
        return 0;
    }
    enum gguf_vtype et = src->arr.type;
    uint64_t n = src->arr.n;
    if ((unsigned)et >= GGUF_VTYPE_COUNT)
        return strata_errf(STRATA_EINVAL, "GGUF key %s: unknown array element type %u", key,
                           (unsigned)et);
    if (depth + 1 > GGUF_MAX_DEPTH)
        return strata_errf(STRATA_EINVAL, "GGUF key %s: arrays nest deeper than %d levels", key,
                           GGUF_MAX_DEPTH);
    dst->arr.type = et;
    size_t es = gguf_vtype_size(et);
    if (es) {
        if (n > SIZE_MAX / es)
            return strata_errf(STRATA_EOVERFLOW,
                               "GGUF key %s: array of %" PRIu64 " elements is too large", key, n);
        if (n && !src->arr.raw)
            return strata_errf(STRATA_EINVAL, "GGUF key %s: array of %" PRIu64 " %s has no data",
                               key, n, gguf_vtype_name(et));
        if (et == GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (src->arr.raw[i] > 1)
                    return strata_errf(STRATA_EINVAL,
                                       "GGUF key %s: bool element %" PRIu64 " is %u, not 0 or 1",
                                       key, i, src->arr.raw[i]);
        uint8_t *raw = malloc(n ? n * es : 1);
        if (!raw)
            return strata_errf(STRATA_ENOMEM, "GGUF key %s: no memory for %" PRIu64 " elements",
                               key, n);
        if (n) memcpy(raw, src->arr.raw, n * es);
        dst->arr.raw = raw;
        dst->arr.n = n;
        return 0;
    }
    if (n && !src->arr.items)
        return strata_errf(STRATA_EINVAL, "GGUF key %s: array of %" PRIu64 " %s has no items", key,
                           n, gguf_vtype_name(et));
    if (n == 0) return 0;
    dst->arr.items = calloc(n, sizeof *dst->arr.items);
    if (!dst->arr.items)
        return strata_errf(STRATA_ENOMEM, "GGUF key %s: no memory for %" PRIu64 " items", key, n);
    for (uint64_t i = 0; i < n; i++) {
        int rv = 0;
        if (src->arr.items[i].type != et)
            rv = strata_errf(STRATA_EINVAL,
                             "GGUF key %s: item %" PRIu64 " has type %s in an array of %s", key, i,
                             gguf_vtype_name(src->arr.items[i].type), gguf_vtype_name(et));
        else
            rv = value_copy(&dst->arr.items[i], &src->arr.items[i], depth + 1, key);
        if (rv) {
            gguf_value_free(dst, true);
            return rv;
        }
        dst->arr.n = i + 1;
    }
    return 0;
}

int gguf_writer_open(const char *path, uint32_t alignment, struct gguf_writer **out)
{
    if (alignment == 0) alignment = GGUF_DEFAULT_ALIGNMENT;
    if (alignment & (alignment - 1))
        return strata_errf(STRATA_EINVAL, "GGUF alignment %u is not a power of two", alignment);
    int rv = 0;
    struct gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return strata_errf(STRATA_ENOMEM, "no memory for a GGUF writer");
    w->fd = -1;
    w->alignment = alignment;
    w->path = strdup(path);
    w->tmp = malloc(strlen(path) + 5);
    w->buf = malloc(WBUF_BYTES);
    if (!w->path || !w->tmp || !w->buf) {
        rv = strata_errf(STRATA_ENOMEM, "no memory for a GGUF writer");
        goto fail;
    }
    sprintf(w->tmp, "%s.tmp", path);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        rv = strata_errf(strata_errno(errno), "%s: cannot create: %s", w->tmp, strerror(errno));
        goto fail;
    }
    if (alignment != GGUF_DEFAULT_ALIGNMENT &&
        (rv = gguf_w_u32(w, "general.alignment", alignment)) != 0)
        goto fail;
    *out = w;
    return 0;
fail:
    gguf_writer_abort(w);
    return rv;
}

/* add_kv checks state and key, then copies v in. */
static int add_kv(struct gguf_writer *w, const char *key, const struct gguf_value *v)
{
    if (w->err) return w->err;
    if (w->begun)
        return strata_errf(STRATA_ESTATE,
                           "GGUF key %s: KV pairs must be set before gguf_writer_begin", key);
    if (!key[0]) return strata_errf(STRATA_EINVAL, "GGUF keys must not be empty");
    if (gguf_kv_find(w->kv, w->n_kv, key))
        return strata_errf(STRATA_EEXIST, "GGUF key %s is set twice", key);
    if (w->n_kv == w->cap_kv) {
        uint64_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        struct gguf_kv *kv = realloc(w->kv, cap * sizeof *kv);
        if (!kv) return strata_errf(STRATA_ENOMEM, "no memory for %" PRIu64 " KV pairs", cap);
        w->kv = kv;
        w->cap_kv = cap;
    }
    struct gguf_kv *kv = &w->kv[w->n_kv];
    kv->key = strdup(key);
    if (!kv->key) return strata_errf(STRATA_ENOMEM, "no memory for GGUF key %s", key);
    int rv = value_copy(&kv->val, v, 0, key);
    if (rv) {
        free(kv->key);
        return rv;
    }
    w->n_kv++;
    return 0;
}

int gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    return add_kv(w, key, &(struct gguf_value){.type = GGUF_UINT32, .u = v});
}

int gguf_w_i32(struct gguf_writer *w, const char *key, int32_t v)
{
    return add_kv(w, key, &(struct gguf_value){.type = GGUF_INT32, .i = v});
}

int gguf_w_u64(struct gguf_writer *w, const char *key, uint64_t v)
{
    return add_kv(w, key, &(struct gguf_value){.type = GGUF_UINT64, .u = v});
}

int gguf_w_f32(struct gguf_writer *w, const char *key, float v)
{
    return add_kv(w, key, &(struct gguf_value){.type = GGUF_FLOAT32, .f = v});
}

int gguf_w_bool(struct gguf_writer *w, const char *key, bool v)
{
    return add_kv(w, key, &(struct gguf_value){.type = GGUF_BOOL, .b = v});
}

int gguf_w_strn(struct gguf_writer *w, const char *key, const char *v, uint64_t len)
{
    return add_kv(w, key, &(struct gguf_value){.type = GGUF_STRING, .str = {v, len}});
}

int gguf_w_str(struct gguf_writer *w, const char *key, const char *v)
{
    return gguf_w_strn(w, key, v, strlen(v));
}

int gguf_w_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem, uint64_t n,
               const void *data)
{
    if (gguf_vtype_size(elem) == 0)
        return strata_errf(STRATA_EINVAL, "GGUF key %s: gguf_w_arr takes scalar elements, not %s",
                           key, gguf_vtype_name(elem));
    struct gguf_value v = {.type = GGUF_ARRAY};
    v.arr.type = elem;
    v.arr.n = n;
    v.arr.raw = data;
    return add_kv(w, key, &v);
}

int gguf_w_arr_str(struct gguf_writer *w, const char *key, uint64_t n, const char *const *strs,
                   const uint64_t *lens)
{
    if (n > SIZE_MAX / sizeof(struct gguf_value))
        return strata_errf(STRATA_EOVERFLOW, "GGUF key %s: %" PRIu64 " strings is too many", key,
                           n);
    struct gguf_value v = {.type = GGUF_ARRAY};
    v.arr.type = GGUF_STRING;
    v.arr.n = n;
    v.arr.items = calloc(n ? n : 1, sizeof *v.arr.items);
    if (!v.arr.items)
        return strata_errf(STRATA_ENOMEM, "GGUF key %s: no memory for %" PRIu64 " strings", key, n);
    for (uint64_t i = 0; i < n; i++) {
        v.arr.items[i].type = GGUF_STRING;
        v.arr.items[i].str = (struct gguf_str){strs[i], lens ? lens[i] : strlen(strs[i])};
    }
    int rv = add_kv(w, key, &v);
    free(v.arr.items);
    return rv;
}

int gguf_w_value(struct gguf_writer *w, const char *key, const struct gguf_value *v)
{
    return add_kv(w, key, v);
}

int gguf_w_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                  const uint64_t *ne)
{
    if (w->err) return w->err;
    if (w->begun)
        return strata_errf(STRATA_ESTATE,
                           "tensor %s: tensors must be declared before gguf_writer_begin", name);
    if (!name[0]) return strata_errf(STRATA_EINVAL, "tensor names must not be empty");
    const struct qtype_info *qt = qtype_get(type);
    if (!qt) return strata_errf(STRATA_EINVAL, "tensor %s: unknown type %u", name, type);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return strata_errf(STRATA_EINVAL, "tensor %s: %u dimensions; 1 to %d are allowed", name,
                           n_dims, GGUF_MAX_DIMS);
    struct gguf_tensor t = {.n_dims = n_dims, .type = type};
    uint64_t elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 1 || t.ne[d] > (uint64_t)INT64_MAX / elems)
            return strata_errf(t.ne[d] < 1 ? STRATA_EINVAL : STRATA_EOVERFLOW,
                               "tensor %s: dimension %u is %" PRIu64
                               ": it must be >= 1 and the element count "
                               "must fit int64",
                               name, d, t.ne[d]);
        elems *= t.ne[d];
    }
    if (t.ne[0] % qt->blck)
        return strata_errf(STRATA_EINVAL,
                           "tensor %s: row length %" PRIu64
                           " is not a multiple of the %s block size %u",
                           name, t.ne[0], qt->name, qt->blck);
    if (elems / qt->blck > (uint64_t)INT64_MAX / qt->bytes)
        return strata_errf(STRATA_EOVERFLOW, "tensor %s: byte size overflows int64", name);
    t.nbytes = elems / qt->blck * qt->bytes;
    t.offset = gguf_round_up(w->data_end, w->alignment);
    if (t.offset > (uint64_t)INT64_MAX - t.nbytes)
        return strata_errf(STRATA_EOVERFLOW, "tensor %s: the data section would pass 2^63 bytes",
                           name);
    if (w->n_t == w->cap_t) {
        uint64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        struct gguf_tensor *nt = realloc(w->t, cap * sizeof *nt);
        if (!nt) return strata_errf(STRATA_ENOMEM, "no memory for %" PRIu64 " tensors", cap);
        w->t = nt;
        w->cap_t = cap;
    }
    int rv = gguf_nidx_reserve(&w->tidx, w->t, sizeof *w->t, w->n_t, w->n_t + 1);
    if (rv) return rv;
    t.name = strdup(name);
    if (!t.name) return strata_errf(STRATA_ENOMEM, "no memory for tensor name %s", name);
    w->t[w->n_t] = t;
    if (gguf_nidx_add(&w->tidx, w->t, sizeof *w->t, w->n_t) >= 0) {
        free(t.name);
        return strata_errf(STRATA_EEXIST, "tensor %s is declared twice", name);
    }
    w->n_t++;
    w->data_end = t.offset + t.nbytes;
    return 0;
}

int gguf_writer_begin(struct gguf_writer *w)
{
    if (w->err) return w->err;
    if (w->begun) return strata_errf(STRATA_ESTATE, "%s: gguf_writer_begin called twice", w->path);
    w->begun = true;
    int rv;
    if ((rv = emit_uint(w, GGUF_MAGIC, 4)) || (rv = emit_uint(w, 3, 4)) ||
        (rv = emit_uint(w, w->n_t, 8)) || (rv = emit_uint(w, w->n_kv, 8)))
        return rv;
    for (uint64_t i = 0; i < w->n_kv; i++) {
        const struct gguf_kv *kv = &w->kv[i];
        if ((rv = emit_str(w, kv->key, strlen(kv->key))) || (rv = emit_uint(w, kv->val.type, 4)) ||
            (rv = emit_value(w, &kv->val)))
            return rv;
    }
    for (uint64_t i = 0; i < w->n_t; i++) {
        const struct gguf_tensor *t = &w->t[i];
        if ((rv = emit_str(w, t->name, strlen(t->name))) || (rv = emit_uint(w, t->n_dims, 4)))
            return rv;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if ((rv = emit_uint(w, t->ne[d], 8)) != 0) return rv;
        if ((rv = emit_uint(w, t->type, 4)) || (rv = emit_uint(w, t->offset, 8))) return rv;
    }
    return emit_zeros(w, gguf_round_up(w->written, w->alignment) - w->written);
}

int gguf_writer_data(struct gguf_writer *w, const void *buf, size_t n)
{
    if (w->err) return w->err;
    if (!w->begun)
        return strata_errf(STRATA_ESTATE, "%s: tensor data before gguf_writer_begin", w->path);
    const uint8_t *p = buf;
    while (n > 0) {
        if (w->cur >= w->n_t)
            return strata_errf(STRATA_EOVERFLOW,
                               "%s: %zu bytes of data beyond the %" PRIu64 " declared tensors",
                               w->path, n, w->n_t);
        const struct gguf_tensor *t = &w->t[w->cur];
        uint64_t left = t->nbytes - w->cur_done;
        size_t k = n < left ? n : (size_t)left;
        int rv = emit(w, p, k);
        if (rv) return rv;
        p += k;
        n -= k;
        w->cur_done += k;
        if (w->cur_done == t->nbytes) {
            if ((rv = emit_zeros(w, gguf_round_up(t->nbytes, w->alignment) - t->nbytes)) != 0)
                return rv;
            w->cur++;
            w->cur_done = 0;
        }
    }
    return 0;
}

static void writer_free(struct gguf_writer *w)
{
    for (uint64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        gguf_value_free(&w->kv[i].val, true);
    }
    free(w->kv);
    for (uint64_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->t);
    free(w->tidx.slot);
    free(w->buf);
    free(w->path);
    free(w->tmp);
    free(w);
}

void gguf_writer_abort(struct gguf_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp);
    }
    writer_free(w);
}

int gguf_writer_finish(struct gguf_writer *w)
{
    if (!w) return 0;
    int rv = w->err;
    if (!rv && !w->begun) rv = gguf_writer_begin(w);
    if (!rv && w->cur < w->n_t) {
        const struct gguf_tensor *t = &w->t[w->cur];
        rv = strata_errf(STRATA_ETRUNC,
                         "%s: tensor %s has %" PRIu64 " of its %" PRIu64 " bytes and %" PRIu64
                         " more tensors have none: the file was not written",
                         w->path, t->name, w->cur_done, t->nbytes, w->n_t - w->cur - 1);
    }
    if (!rv) rv = flush(w);
    /* fsync before rename, so a crash leaves the old file or the whole new one, never a torn one.
     */
    if (!rv && fsync(w->fd) != 0)
        rv = strata_errf(strata_errno(errno), "%s: fsync: %s", w->tmp, strerror(errno));
    if (rv) {
        gguf_writer_abort(w);
        return rv;
    }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        rv = strata_errf(strata_errno(errno), "%s: close: %s", w->tmp, strerror(errno));
    } else if (rename(w->tmp, w->path) != 0) {
        rv = strata_errf(strata_errno(errno), "cannot rename %s to %s: %s", w->tmp, w->path,
                         strerror(errno));
    }
    if (rv) unlink(w->tmp);
    writer_free(w);
    return rv;
}
