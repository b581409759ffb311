#include "common/ipc/msg.h"

#include "common/base/err.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The top-level map is written as a map32 (0xdf + 4-byte count) so msg_finish() can patch the count
 * in place after the fields are known. */
#define TOP_HEADER_BYTES 5

#define STR_(x) #x
#define STR(x)  STR_(x)

/* ---- builder ---- */

static int sbuf_write(void *data, const char *buf, size_t len)
{
    struct msg_builder *b = data;
    if (b->err) return -1;
    if (msgpack_sbuffer_write(&b->buf, buf, len) != 0) {
        b->err = STRATA_ENOMEM;
        return -1;
    }
    return 0;
}

static void begin(struct msg_builder *b)
{
    static const char top[TOP_HEADER_BYTES] = {(char)0xdf, 0, 0, 0, 0};
    memset(b, 0, sizeof *b);
    msgpack_sbuffer_init(&b->buf);
    msgpack_packer_init(&b->pk, b, sbuf_write);
    sbuf_write(b, top, sizeof top);
    msg_key(b, "v");
    msg_pack_i64(b, MSG_VERSION);
}

void msg_begin_request(struct msg_builder *b, const char *op)
{
    begin(b);
    msg_key(b, "op");
    msg_pack_str(b, op);
}

void msg_begin_reply(struct msg_builder *b)
{
    begin(b);
    msg_key(b, "ok");
    msg_pack_bool(b, true);
}

void msg_key(struct msg_builder *b, const char *key)
{
    b->n_top++;
    msg_pack_str(b, key);
}

void msg_pack_str(struct msg_builder *b, const char *s)
{
    msg_pack_strn(b, s, strlen(s));
}

void msg_pack_strn(struct msg_builder *b, const char *s, size_t len)
{
    if (len > UINT32_MAX) {
        b->err = b->err ? b->err : STRATA_EOVERFLOW;
        return;
    }
    msgpack_pack_str(&b->pk, len);
    msgpack_pack_str_body(&b->pk, s, len);
}

void msg_pack_i64(struct msg_builder *b, int64_t v)
{
    msgpack_pack_int64(&b->pk, v);
}

void msg_pack_u64(struct msg_builder *b, uint64_t v)
{
    msgpack_pack_uint64(&b->pk, v);
}

void msg_pack_f64(struct msg_builder *b, double v)
{
    msgpack_pack_double(&b->pk, v);
}

void msg_pack_bool(struct msg_builder *b, bool v)
{
    if (v)
        msgpack_pack_true(&b->pk);
    else
        msgpack_pack_false(&b->pk);
}

void msg_pack_nil(struct msg_builder *b)
{
    msgpack_pack_nil(&b->pk);
}

void msg_pack_bin(struct msg_builder *b, const void *p, size_t len)
{
    if (len > UINT32_MAX) {
        b->err = b->err ? b->err : STRATA_EOVERFLOW;
        return;
    }
    msgpack_pack_bin(&b->pk, len);
    msgpack_pack_bin_body(&b->pk, p, len);
}

void msg_pack_map(struct msg_builder *b, uint32_t n_entries)
{
    msgpack_pack_map(&b->pk, n_entries);
}

void msg_pack_array(struct msg_builder *b, uint32_t n_items)
{
    msgpack_pack_array(&b->pk, n_items);
}

void msg_pack_i32s(struct msg_builder *b, const int32_t *v, uint32_t n)
{
    msgpack_pack_array(&b->pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_int32(&b->pk, v[i]);
}

void msg_pack_i64s(struct msg_builder *b, const int64_t *v, uint32_t n)
{
    msgpack_pack_array(&b->pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_int64(&b->pk, v[i]);
}

int msg_finish(struct msg_builder *b, void **buf, size_t *len)
{
    int rv = b->err;
    /* a builder already finished or released has no header to patch */
    if (rv == 0 && b->buf.size < TOP_HEADER_BYTES) rv = STRATA_EINVAL;
    if (rv != 0) {
        msg_builder_fini(b);
        return strata_errf(rv, "building a message failed: %s", strata_strerror(rv));
    }
    unsigned char *p = (unsigned char *)b->buf.data;
    p[1] = (unsigned char)(b->n_top >> 24);
    p[2] = (unsigned char)(b->n_top >> 16);
    p[3] = (unsigned char)(b->n_top >> 8);
    p[4] = (unsigned char)b->n_top;
    *len = b->buf.size;
    *buf = msgpack_sbuffer_release(&b->buf);
    msg_builder_fini(b);
    return 0;
}

void msg_builder_fini(struct msg_builder *b)
{
    msgpack_sbuffer_destroy(&b->buf);
    memset(b, 0, sizeof *b);
}

int msg_error_reply(int code, const char *message, void **buf, size_t *len)
{
    struct msg_builder b;
    begin(&b);
    msg_key(&b, "ok");
    msg_pack_bool(&b, false);
    msg_key(&b, "error");
    msg_pack_map(&b, 2);
    msg_pack_str(&b, "code");
    msg_pack_i64(&b, code);
    msg_pack_str(&b, "message");
    msg_pack_str(&b, message && *message ? message : strata_strerror(code));
    return msg_finish(&b, buf, len);
}

/* ---- structure pre-check ---- */

struct walk {
    const unsigned char *p;
    size_t len;
    size_t off;
    int max_depth;
};

static int need(struct walk *w, uint64_t n, const char *what)
{
    if (n > w->len - w->off)
        return strata_errf(STRATA_ETRUNC,
                           "msgpack: %s at offset %zu needs %" PRIu64 " bytes, %zu are left", what,
                           w->off, n, w->len - w->off);
    return 0;
}

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* read_count reads an n-byte big-endian count after the type byte. */
static int read_count(struct walk *w, int n, uint64_t *count)
{
    int rv = need(w, (uint64_t)n, "a length");
    if (rv != 0) return rv;
    *count = be(w->p + w->off, n);
    w->off += (size_t)n;
    return 0;
}

/* walk_obj checks one object at w->off and advances past it. Recursion is bounded by max_depth: the
 * stack holds one small frame per nesting level. Each container's count is checked against the
 * bytes left before its items are walked (every item takes at least one byte), so the work is
 * linear in len whatever the counts claim. */
static int walk_obj(struct walk *w, int depth)
{
    int rv;
    size_t at = w->off;
    uint64_t skip = 0;  /* payload bytes that follow (strings, bin, ext, numbers) */
    uint64_t items = 0; /* nested objects that follow (2 per map entry) */
    bool container = false;
    if ((rv = need(w, 1, "an object")) != 0) return rv;
    unsigned t = w->p[w->off++];
    if (t <= 0x7f || t >= 0xe0) return 0; /* fixint */
    if (t <= 0x8f) {
        container = true;
        items = 2 * (uint64_t)(t & 0x0f);
    } else if (t <= 0x9f) {
        container = true;
        items = t & 0x0f;
    } else if (t <= 0xbf) {
        skip = t & 0x1f;
    } else {
        uint64_t n;
        switch (t) {
        case 0xc0:
        case 0xc2:
        case 0xc3: /* nil, false, true */
            return 0;
        case 0xc1:
            return strata_errf(STRATA_EFORMAT, "msgpack: reserved byte 0xc1 at offset %zu", at);
        case 0xc4:
        case 0xd9: /* bin 8, str 8 */
            if ((rv = read_count(w, 1, &skip)) != 0) return rv;
            break;
        case 0xc5:
        case 0xda:
            if ((rv = read_count(w, 2, &skip)) != 0) return rv;
            break;
        case 0xc6:
        case 0xdb:
            if ((rv = read_count(w, 4, &skip)) != 0) return rv;
            break;
        case 0xc7:
        case 0xc8:
        case 0xc9: /* ext 8/16/32: count, then a type byte and the data */
            if ((rv = read_count(w, 1 << (t - 0xc7), &n)) != 0) return rv;
            skip = n + 1;
            break;
        case 0xca:
            skip = 4;
            break; /* float 32 */
        case 0xcb:
            skip = 8;
            break; /* float 64 */
        case 0xcc:
        case 0xcd:
        case 0xce:
        case 0xcf: /* uint 8..64 */
            skip = 1u << (t - 0xcc);
            break;
        case 0xd0:
        case 0xd1:
        case 0xd2:
        case 0xd3: /* int 8..64 */
            skip = 1u << (t - 0xd0);
            break;
        case 0xd4:
        case 0xd5:
        case 0xd6:
        case 0xd7:
        case 0xd8: /* fixext 1..16 and a type byte */
            skip = (1u << (t - 0xd4)) + 1;
            break;
        case 0xdc:
        case 0xdd: /* array 16/32 */
            if ((rv = read_count(w, t == 0xdc ? 2 : 4, &items)) != 0) return rv;
            container = true;
            break;
        default: /* 0xde, 0xdf: map 16/32 */
            if ((rv = read_count(w, t == 0xde ? 2 : 4, &n)) != 0) return rv;
            items = 2 * n;
            container = true;
            break;
        }
    }
    if (!container) {
        if ((rv = need(w, skip, "a string, bin, ext or number")) != 0) return rv;
        w->off += (size_t)skip;
        return 0;
    }
    if (items > w->len - w->off)
        return strata_errf(STRATA_ETRUNC,
                           "msgpack: container at offset %zu declares %" PRIu64
                           " items, only %zu bytes are left",
                           at, items, w->len - w->off);
    if (depth + 1 > w->max_depth)
        return strata_errf(STRATA_ELIMIT, "msgpack: nesting deeper than %d at offset %zu",
                           w->max_depth, at);
    for (uint64_t i = 0; i < items; i++)
        if ((rv = walk_obj(w, depth + 1)) != 0) return rv;
    return 0;
}

int msg_precheck(const void *buf, size_t len, int max_depth)
{
    struct walk w = {buf, len, 0, max_depth};
    int rv;
    if (len == 0) return strata_errf(STRATA_ETRUNC, "msgpack: empty message");
    unsigned t = w.p[0];
    if (!((t >= 0x80 && t <= 0x8f) || t == 0xde || t == 0xdf))
        return strata_errf(STRATA_EFORMAT, "msgpack: the message is not a map (first byte 0x%02x)",
                           t);
    if ((rv = walk_obj(&w, 0)) != 0) return rv;
    if (w.off != len)
        return strata_errf(STRATA_EFORMAT,
                           "msgpack: %zu trailing bytes after the message at offset %zu",
                           len - w.off, w.off);
    return 0;
}

/* ---- decoding ---- */

static const char *type_name(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return "nil";
    case MSGPACK_OBJECT_BOOLEAN:
        return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return "integer";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return "negative integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return "float";
    case MSGPACK_OBJECT_STR:
        return "string";
    case MSGPACK_OBJECT_ARRAY:
        return "array";
    case MSGPACK_OBJECT_MAP:
        return "map";
    case MSGPACK_OBJECT_BIN:
        return "bin";
    default:
        return "ext";
    }
}

/* field looks key up in map (NULL: the root): 0 and *out, STRATA_ENOENT, or STRATA_EPROTO when map
 * is not a map. */
static int field(struct msg *m, const msgpack_object *map, const char *key,
                 const msgpack_object **out)
{
    if (!map) map = &m->root;
    if (map->type != MSGPACK_OBJECT_MAP)
        return strata_errf(STRATA_EPROTO, "field '%s': looked up in a %s, not a map", key,
                           type_name(map));
    size_t klen = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == klen &&
            memcmp(k->via.str.ptr, key, klen) == 0) {
            *out = &map->via.map.ptr[i].val;
            return 0;
        }
    }
    return strata_errf(STRATA_ENOENT, "field '%s': missing", key);
}

/* int_value checks that o is an integer in [min, max]; what names the expectation for the detail.
 */
static int int_value(const msgpack_object *o, const char *key, int64_t min, int64_t max,
                     int64_t *out)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 <= (uint64_t)INT64_MAX && (int64_t)o->via.u64 >= min &&
            (int64_t)o->via.u64 <= max) {
            *out = (int64_t)o->via.u64;
            return 0;
        }
        return strata_errf(STRATA_EPROTO,
                           "field '%s': expected an integer in [%" PRId64 ", %" PRId64
                           "], got %" PRIu64,
                           key, min, max, o->via.u64);
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        if (o->via.i64 >= min && o->via.i64 <= max) {
            *out = o->via.i64;
            return 0;
        }
        return strata_errf(STRATA_EPROTO,
                           "field '%s': expected an integer in [%" PRId64 ", %" PRId64
                           "], got %" PRId64,
                           key, min, max, o->via.i64);
    }
    return strata_errf(STRATA_EPROTO,
                       "field '%s': expected an integer in [%" PRId64 ", %" PRId64 "], got %s", key,
                       min, max, type_name(o));
}

/* redetail returns code with this thread's detail prefixed and suffixed (the detail is copied
 * first: strata_errf writes into the same buffer it would read from). */
static int redetail(int code, const char *prefix, const char *suffix)
{
    char d[512];
    snprintf(d, sizeof d, "%s", strata_errdetail());
    return strata_errf(code, "%s%s%s", prefix, d, suffix);
}

/* zcopy copies len bytes into m's zone with a NUL after them. */
static char *zcopy(struct msg *m, const char *p, size_t len)
{
    char *s = msgpack_zone_malloc_no_align(&m->zone, len + 1);
    if (!s) return NULL;
    memcpy(s, p, len);
    s[len] = '\0';
    return s;
}

int msg_decode(const void *buf, size_t len, struct msg *m)
{
    int rv;
    size_t off = 0;
    const msgpack_object *o;
    memset(m, 0, sizeof *m);
    if ((rv = msg_precheck(buf, len, MSG_MAX_DEPTH)) != 0) return rv;
    if (!msgpack_zone_init(&m->zone, 1024))
        return strata_errf(STRATA_ENOMEM, "msgpack: no memory for a zone");
    m->live = true;
    switch (msgpack_unpack(buf, len, &off, &m->zone, &m->root)) {
    case MSGPACK_UNPACK_SUCCESS:
        break;
    case MSGPACK_UNPACK_NOMEM_ERROR:
        rv = strata_errf(STRATA_ENOMEM, "msgpack: out of memory unpacking %zu bytes", len);
        goto fail;
    default: /* the precheck accepted it, so the unpacker's own rules refused it */
        rv = strata_errf(STRATA_EFORMAT, "msgpack: the unpacker refused a %zu-byte message", len);
        goto fail;
    }
    if ((rv = field(m, NULL, "v", &o)) != 0 ||
        (rv = int_value(o, "v", MSG_VERSION_MIN, MSG_VERSION, &m->v)) != 0) {
        rv = redetail(STRATA_EPROTO, "",
                      " (this build speaks protocol versions " STR(MSG_VERSION_MIN) ".." STR(
                          MSG_VERSION) ")");
        goto fail;
    }
    if (field(m, NULL, "op", &o) == 0) {
        if ((rv = msg_get_str(m, NULL, "op", 64, &m->op, NULL)) != 0) goto fail;
        return 0;
    }
    if ((rv = msg_get_bool(m, NULL, "ok", &m->ok)) != 0) {
        if (rv == STRATA_ENOENT)
            rv = strata_errf(STRATA_EPROTO,
                             "message has neither 'op' (a request) nor 'ok' (a reply)");
        goto fail;
    }
    if (m->ok) return 0;
    const msgpack_object *err;
    int64_t code;
    if ((rv = msg_get_map(m, NULL, "error", &err)) != 0 ||
        (rv = msg_get_i64(m, err, "code", 1, INT32_MAX, &code)) != 0) {
        rv = redetail(STRATA_EPROTO, "failed reply: ", "");
        goto fail;
    }
    m->err_code = (int)code;
    m->err_message = "";
    rv = msg_get_str(m, err, "message", SIZE_MAX, &m->err_message, NULL);
    if (rv != 0 && rv != STRATA_ENOENT) goto fail;
    return 0;
fail:
    msg_free(m);
    return rv;
}

void msg_free(struct msg *m)
{
    if (m->live) msgpack_zone_destroy(&m->zone);
    free(m->owned);
    memset(m, 0, sizeof *m);
}

int msg_reply_status(const struct msg *m)
{
    if (m->op) return strata_errf(STRATA_EPROTO, "expected a reply, got a request for '%s'", m->op);
    if (m->ok) return 0;
    return strata_errf(m->err_code, "%s", m->err_message);
}

/* ---- typed accessors ---- */

int msg_get_str(struct msg *m, const msgpack_object *map, const char *key, size_t max_len,
                const char **s, size_t *len)
{
    const msgpack_object *o;
    int rv = field(m, map, key, &o);
    if (rv != 0) return rv;
    if (o->type != MSGPACK_OBJECT_STR)
        return strata_errf(STRATA_EPROTO, "field '%s': expected a string, got %s", key,
                           type_name(o));
    if (o->via.str.size > max_len)
        return strata_errf(STRATA_EPROTO, "field '%s': string of %u bytes exceeds the limit of %zu",
                           key, o->via.str.size, max_len);
    char *c = zcopy(m, o->via.str.ptr, o->via.str.size);
    if (!c)
        return strata_errf(STRATA_ENOMEM, "field '%s': no memory to copy %u bytes", key,
                           o->via.str.size);
    *s = c;
    if (len) *len = o->via.str.size;
    return 0;
}

int msg_get_i64(struct msg *m, const msgpack_object *map, const char *key, int64_t min, int64_t max,
                int64_t *out)
{
    const msgpack_object *o;
    int rv = field(m, map, key, &o);
    if (rv != 0) return rv;
    return int_value(o, key, min, max, out);
}

int msg_get_u64(struct msg *m, const msgpack_object *map, const char *key, uint64_t max,
                uint64_t *out)
{
    const msgpack_object *o;
    int rv = field(m, map, key, &o);
    if (rv != 0) return rv;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= max) {
        *out = o->via.u64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        return strata_errf(STRATA_EPROTO,
                           "field '%s': expected a non-negative integer up to %" PRIu64
                           ", got %" PRIu64,
                           key, max, o->via.u64);
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return strata_errf(STRATA_EPROTO,
                           "field '%s': expected a non-negative integer, got %" PRId64, key,
                           o->via.i64);
    return strata_errf(STRATA_EPROTO, "field '%s': expected a non-negative integer, got %s", key,
                       type_name(o));
}

int msg_get_f64(struct msg *m, const msgpack_object *map, const char *key, double min, double max,
                double *out)
{
    const msgpack_object *o;
    double v;
    int rv = field(m, map, key, &o);
    if (rv != 0) return rv;
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        v = o->via.f64;
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        v = (double)o->via.u64;
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        v = (double)o->via.i64;
        break;
    default:
        return strata_errf(STRATA_EPROTO, "field '%s': expected a number in [%g, %g], got %s", key,
                           min, max, type_name(o));
    }
    if (isnan(v) || v < min || v > max)
        return strata_errf(STRATA_EPROTO, "field '%s': expected a number in [%g, %g], got %g", key,
                           min, max, v);
    *out = v;
    return 0;
}

int msg_get_bool(struct msg *m, const msgpack_object *map, const char *key, bool *out)
{
    const msgpack_object *o;
    int rv = field(m, map, key, &o);
    if (rv != 0) return rv;
    if (o->type != MSGPACK_OBJECT_BOOLEAN)
        return strata_errf(STRATA_EPROTO, "field '%s': expected a bool, got %s", key, type_name(o));
    *out = o->via.boolean;
    return 0;
}

int msg_get_bin(struct msg *m, const msgpack_object *map, const char *key, size_t max_len,
                const void **p, size_t *len)
{
    const msgpack_object *o;
    int rv = field(m, map, key, &o);
    if (rv != 0) return rv;
    if (o->type != MSGPACK_OBJECT_BIN)
        return strata_errf(STRATA_EPROTO, "field '%s': expected bin, got %s", key, type_name(o));
    if (o->via.bin.size > max_len)
        return strata_errf(STRATA_EPROTO, "field '%s': bin of %u bytes exceeds the limit of %zu",
                           key, o->via.bin.size, max_len);
    *p = o->via.bin.ptr;
    *len = o->via.bin.size;
    return 0;
}

int msg_get_map(struct msg *m, const msgpack_object *map, const char *key,
                const msgpack_object **out)
{
    const msgpack_object *o;
    int rv = field(m, map, key, &o);
    if (rv != 0) return rv;
    if (o->type != MSGPACK_OBJECT_MAP)
        return strata_errf(STRATA_EPROTO, "field '%s': expected a map, got %s", key, type_name(o));
    *out = o;
    return 0;
}

int msg_get_arr(struct msg *m, const msgpack_object *map, const char *key, uint32_t max_n,
                const msgpack_object **items, uint32_t *n)
{
    const msgpack_object *o;
    int rv = field(m, map, key, &o);
    if (rv != 0) return rv;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return strata_errf(STRATA_EPROTO, "field '%s': expected an array, got %s", key,
                           type_name(o));
    if (o->via.array.size > max_n)
        return strata_errf(STRATA_EPROTO, "field '%s': array of %u items exceeds the limit of %u",
                           key, o->via.array.size, max_n);
    *items = o->via.array.ptr;
    *n = o->via.array.size;
    return 0;
}

/* get_ints reads an integer array into zone memory of elem_size bytes per item (4 or 8). */
static int get_ints(struct msg *m, const msgpack_object *map, const char *key, uint32_t max_n,
                    int64_t min, int64_t max, size_t elem_size, void **out, uint32_t *n)
{
    const msgpack_object *items = NULL;
    uint32_t count = 0;
    int rv = msg_get_arr(m, map, key, max_n, &items, &count);
    if (rv != 0) return rv;
    void *v = NULL;
    if (count > 0 && !(v = msgpack_zone_malloc(&m->zone, (size_t)count * elem_size)))
        return strata_errf(STRATA_ENOMEM, "field '%s': no memory for %u integers", key, count);
    for (uint32_t i = 0; i < count; i++) {
        int64_t x = 0;
        if ((rv = int_value(&items[i], key, min, max, &x)) != 0) {
            char where[32];
            snprintf(where, sizeof where, " (item %u)", i);
            return redetail(rv, "", where);
        }
        if (elem_size == sizeof(int32_t))
            ((int32_t *)v)[i] = (int32_t)x;
        else
            ((int64_t *)v)[i] = x;
    }
    *out = v;
    *n = count;
    return 0;
}

int msg_get_i32s(struct msg *m, const msgpack_object *map, const char *key, uint32_t max_n,
                 int32_t min, int32_t max, const int32_t **out, uint32_t *n)
{
    void *v;
    int rv = get_ints(m, map, key, max_n, min, max, sizeof(int32_t), &v, n);
    if (rv == 0) *out = v;
    return rv;
}

int msg_get_i64s(struct msg *m, const msgpack_object *map, const char *key, uint32_t max_n,
                 int64_t min, int64_t max, const int64_t **out, uint32_t *n)
{
    void *v;
    int rv = get_ints(m, map, key, max_n, min, max, sizeof(int64_t), &v, n);
    if (rv == 0) *out = v;
    return rv;
}
