/* tmpl_value — arena, buffers and the value model of the template interpreter: Python's str(),
 * repr(), ==, <, truthiness and json.dumps over template values. See tmpl_int.h. */
#include "common/tmpl/tmpl_int.h"

#include "common/base/err.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tmpl_chunk {
    struct tmpl_chunk *next;
    size_t cap, off;
    _Alignas(16) unsigned char mem[];
};

#define CHUNK_BYTES (64u << 10)

void *tmpl_arena_alloc(struct tmpl_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    struct tmpl_chunk *c = a->head;
    if (!c || c->cap - c->off < n) {
        size_t cap = n > CHUNK_BYTES / 4 ? n : CHUNK_BYTES;
        if (n > a->limit || a->used + cap + sizeof *c > a->limit) return NULL;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->off = 0;
        a->used += cap + sizeof *c;
        /* A big block goes behind the current chunk so the chunk's free tail stays usable. */
        if (a->head && cap != CHUNK_BYTES) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->mem + c->off;
    c->off += n;
    memset(p, 0, n);
    return p;
}

void tmpl_arena_free(struct tmpl_arena *a)
{
    struct tmpl_chunk *c = a->head;
    while (c) {
        struct tmpl_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

int tbuf_add(struct tbuf *b, const void *p, size_t n)
{
    if (n > b->limit || b->n + n > b->limit)
        return strata_errf(STRATA_ELIMIT,
                           "template text grows past its limit of %zu bytes: raise the limit or "
                           "shorten the conversation",
                           b->limit);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return STRATA_ENOMEM;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int tbuf_puts(struct tbuf *b, const char *s)
{
    return tbuf_add(b, s, strlen(s));
}

int tbuf_printf(struct tbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return strata_errf(STRATA_EINTERNAL, "tbuf_printf: %d", n);
    return tbuf_add(b, tmp, (size_t)n);
}

/* ---- UTF-8 ---- */

size_t tmpl_u8_dec(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t len = p[0] < 0x80 ? 1 : p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc0 ? 2 : 0;
    if (len == 0 || len > n) {
        *cp = 0xfffd;
        return 1;
    }
    uint32_t c = len == 1 ? p[0] : p[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            *cp = 0xfffd;
            return 1;
        }
        c = (c << 6) | (p[i] & 0x3f);
    }
    *cp = c;
    return len;
}

int tmpl_u8_enc(char *o, uint32_t c)
{
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xc0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xe0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        o[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | ((c >> 18) & 0x07));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3f));
    o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

size_t tmpl_u8_len(const char *p, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)p[i] & 0xc0) != 0x80;
    return k;
}

size_t tmpl_u8_off(const char *p, size_t n, size_t idx)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (((unsigned char)p[i] & 0xc0) != 0x80) {
            if (k == idx) return i;
            k++;
        }
    }
    return n;
}

/* Python's str.isspace */
bool tmpl_u_isspace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* ---- construction ---- */

struct tstr *tv_newstr(struct tmpl_arena *a, const char *p, size_t n)
{
    struct tstr *s = tmpl_arena_alloc(a, sizeof *s + n + 1);
    if (!s) return NULL;
    s->n = n;
    if (p && n) memcpy(s->p, p, n); /* p NULL: the caller fills the n bytes */
    return s;
}

struct tlist *tv_newlist(struct tmpl_arena *a, size_t cap)
{
    struct tlist *l = tmpl_arena_alloc(a, sizeof *l);
    if (!l) return NULL;
    if (cap) {
        if (cap > SIZE_MAX / sizeof(struct tv) || !(l->v = tmpl_arena_alloc(a, cap * sizeof *l->v)))
            return NULL;
        l->cap = cap;
    }
    return l;
}

struct tdict *tv_newdict(struct tmpl_arena *a, size_t cap)
{
    struct tdict *d = tmpl_arena_alloc(a, sizeof *d);
    if (!d) return NULL;
    if (cap) {
        if (cap > SIZE_MAX / sizeof(struct tv) / 2) return NULL;
        d->k = tmpl_arena_alloc(a, cap * sizeof *d->k);
        d->v = tmpl_arena_alloc(a, cap * sizeof *d->v);
        if (!d->k || !d->v) return NULL;
        d->cap = cap;
    }
    return d;
}

/* grow doubles an arena array; the old block is left to the arena. */
static int grow(struct tmpl_arena *a, struct tv **v, size_t n, size_t *cap)
{
    size_t nc = *cap ? *cap * 2 : 4;
    struct tv *nv = nc <= SIZE_MAX / sizeof *nv ? tmpl_arena_alloc(a, nc * sizeof *nv) : NULL;
    if (!nv) return STRATA_ENOMEM;
    if (n) memcpy(nv, *v, n * sizeof *nv);
    *v = nv;
    *cap = nc;
    return 0;
}

int tv_list_push(struct tmpl_arena *a, struct tlist *l, struct tv v)
{
    if (l->n == l->cap && grow(a, &l->v, l->n, &l->cap) != 0) return STRATA_ENOMEM;
    l->v[l->n++] = v;
    return 0;
}

struct tv *tv_dict_get(const struct tdict *d, struct tv k)
{
    for (size_t i = 0; i < d->n; i++)
        if (tv_eq(d->k[i], k, 0)) return &d->v[i];
    return NULL;
}

struct tv *tv_dict_gets(const struct tdict *d, const char *k, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].k == TV_STR && d->k[i].u.s->n == n && memcmp(d->k[i].u.s->p, k, n) == 0)
            return &d->v[i];
    return NULL;
}

int tv_dict_set(struct tmpl_arena *a, struct tdict *d, struct tv k, struct tv v)
{
    struct tv *slot = tv_dict_get(d, k);
    if (slot) {
        *slot = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap;
        if (grow(a, &d->k, d->n, &cap) != 0) return STRATA_ENOMEM;
        cap = d->cap;
        if (grow(a, &d->v, d->n, &cap) != 0) return STRATA_ENOMEM;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return 0;
}

int tv_from_json(struct tmpl_arena *a, const json_t *j, struct tv *out)
{
    int rv;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        struct tdict *d = tv_newdict(a, json_object_size(j));
        if (!d) return STRATA_ENOMEM;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val)
        {
            struct tv kv, vv;
            struct tstr *ks = tv_newstr(a, key, strlen(key));
            if (!ks) return STRATA_ENOMEM;
            kv = tv_s(ks);
            if ((rv = tv_from_json(a, val, &vv)) != 0) return rv;
            if ((rv = tv_dict_set(a, d, kv, vv)) != 0) return rv;
        }
        *out = tv_d(d);
        return 0;
    }
    case JSON_ARRAY: {
        struct tlist *l = tv_newlist(a, json_array_size(j));
        if (!l) return STRATA_ENOMEM;
        for (size_t i = 0; i < json_array_size(j); i++)
            if ((rv = tv_from_json(a, json_array_get(j, i), &l->v[l->n++])) != 0) return rv;
        *out = tv_l(l);
        return 0;
    }
    case JSON_STRING: {
        struct tstr *s = tv_newstr(a, json_string_value(j), json_string_length(j));
        if (!s) return STRATA_ENOMEM;
        *out = tv_s(s);
        return 0;
    }
    case JSON_INTEGER:
        *out = tv_int(json_integer_value(j));
        return 0;
    case JSON_REAL:
        *out = tv_float(json_real_value(j));
        return 0;
    case JSON_TRUE:
        *out = tv_bool(true);
        return 0;
    case JSON_FALSE:
        *out = tv_bool(false);
        return 0;
    default:
        *out = tv_none();
        return 0;
    }
}

/* ---- Python semantics ---- */

bool tv_truthy(struct tv v)
{
    switch (v.k) {
    case TV_UNDEF:
    case TV_NONE:
        return false;
    case TV_BOOL:
        return v.u.b;
    case TV_INT:
        return v.u.i != 0;
    case TV_FLOAT:
        return v.u.f != 0;
    case TV_STR:
        return v.u.s->n > 0;
    case TV_LIST:
        return v.u.l->n > 0;
    case TV_DICT:
        return v.u.d->ns || v.u.d->n > 0;
    default:
        return true;
    }
}

const char *tv_typename(struct tv v)
{
    switch (v.k) {
    case TV_UNDEF:
        return "Undefined";
    case TV_NONE:
        return "NoneType";
    case TV_BOOL:
        return "bool";
    case TV_INT:
        return "int";
    case TV_FLOAT:
        return "float";
    case TV_STR:
        return "str";
    case TV_LIST:
        return v.u.l->tuple ? "tuple" : "list";
    case TV_DICT:
        return v.u.d->ns ? "Namespace" : "dict";
    case TV_MACRO:
        return "Macro";
    case TV_LOOP:
        return "LoopContext";
    default:
        return "function";
    }
}

bool tv_eq(struct tv a, struct tv b, int depth)
{
    if (depth > TV_MAX_DEPTH) return false;
    if (tv_isnum(a) && tv_isnum(b)) {
        if (tv_isint(a) && tv_isint(b)) return tv_asint(a) == tv_asint(b);
        return tv_asdbl(a) == tv_asdbl(b);
    }
    if (a.k != b.k) return false;
    switch (a.k) {
    case TV_UNDEF:
    case TV_NONE:
        return true;
    case TV_STR:
        return a.u.s->n == b.u.s->n && memcmp(a.u.s->p, b.u.s->p, a.u.s->n) == 0;
    case TV_LIST:
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!tv_eq(a.u.l->v[i], b.u.l->v[i], depth + 1)) return false;
        return true;
    case TV_DICT:
        if (a.u.d->ns || b.u.d->ns) return a.u.d == b.u.d;
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            struct tv *o = tv_dict_get(b.u.d, a.u.d->k[i]);
            if (!o || !tv_eq(a.u.d->v[i], *o, depth + 1)) return false;
        }
        return true;
    case TV_MACRO:
        return a.u.m == b.u.m;
    case TV_LOOP:
        return a.u.loop == b.u.loop;
    case TV_FUNC:
        return a.u.fn == b.u.fn;
    default:
        return false;
    }
}

int tv_cmp(struct tv a, struct tv b, int *r, int depth)
{
    if (depth > TV_MAX_DEPTH)
        return strata_errf(STRATA_ELIMIT, "values nested deeper than %d", TV_MAX_DEPTH);
    if (tv_isnum(a) && tv_isnum(b)) {
        if (tv_isint(a) && tv_isint(b)) {
            int64_t x = tv_asint(a), y = tv_asint(b);
            *r = (x > y) - (x < y);
        } else {
            double x = tv_asdbl(a), y = tv_asdbl(b);
            *r = (x > y) - (x < y);
        }
        return 0;
    }
    if (a.k == TV_STR && b.k == TV_STR) {
        size_t n = a.u.s->n < b.u.s->n ? a.u.s->n : b.u.s->n;
        int c = memcmp(a.u.s->p, b.u.s->p, n);
        *r = c ? (c > 0) - (c < 0) : (a.u.s->n > b.u.s->n) - (a.u.s->n < b.u.s->n);
        return 0;
    }
    if (a.k == TV_LIST && b.k == TV_LIST && a.u.l->tuple == b.u.l->tuple) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (tv_eq(a.u.l->v[i], b.u.l->v[i], depth + 1)) continue;
            return tv_cmp(a.u.l->v[i], b.u.l->v[i], r, depth + 1);
        }
        *r = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return 0;
    }
    return strata_errf(STRATA_EINVAL, "cannot order %s and %s", tv_typename(a), tv_typename(b));
}

int tv_write_float(struct tbuf *b, double f)
{
    if (isnan(f)) return tbuf_puts(b, "nan");
    if (isinf(f)) return tbuf_puts(b, f < 0 ? "-inf" : "inf");
    /* The shortest digits that read back as f, placed as Python's repr places them. */
    char tmp[40];
    int p;
    for (p = 1; p < 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    snprintf(tmp, sizeof tmp, "%.*e", p - 1, f);
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *q = tmp + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int e = atoi(q + 1);
    char o[64];
    int k = 0;
    if (neg) o[k++] = '-';
    if (e < -4 || e >= 16) {
        o[k++] = digits[0];
        if (nd > 1) {
            o[k++] = '.';
            for (int i = 1; i < nd; i++)
                o[k++] = digits[i];
        }
        k += snprintf(o + k, sizeof o - (size_t)k, "e%c%02d", e < 0 ? '-' : '+', abs(e));
    } else if (e < 0) {
        o[k++] = '0';
        o[k++] = '.';
        for (int i = 0; i < -e - 1; i++)
            o[k++] = '0';
        for (int i = 0; i < nd; i++)
            o[k++] = digits[i];
    } else {
        for (int i = 0; i <= e; i++)
            o[k++] = i < nd ? digits[i] : '0';
        o[k++] = '.';
        if (nd > e + 1)
            for (int i = e + 1; i < nd; i++)
                o[k++] = digits[i];
        else
            o[k++] = '0';
    }
    return tbuf_add(b, o, (size_t)k);
}

static int repr_str(struct tbuf *b, const struct tstr *s)
{
    bool sq = memchr(s->p, '\'', s->n) != NULL, dq = memchr(s->p, '"', s->n) != NULL;
    char quote = sq && !dq ? '"' : '\'';
    int rv;
    if ((rv = tbuf_add(b, &quote, 1)) != 0) return rv;
    for (size_t i = 0; i < s->n; i++) {
        unsigned char c = (unsigned char)s->p[i];
        char e[8];
        const char *x = NULL;
        if (c == '\\')
            x = "\\\\";
        else if (c == '\n')
            x = "\\n";
        else if (c == '\r')
            x = "\\r";
        else if (c == '\t')
            x = "\\t";
        else if (c == (unsigned char)quote)
            x = quote == '\'' ? "\\'" : "\\\"";
        else if (c < 0x20 || c == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", c);
            x = e;
        }
        rv = x ? tbuf_puts(b, x) : tbuf_add(b, &s->p[i], 1);
        if (rv) return rv;
    }
    return tbuf_add(b, &quote, 1);
}

/* write_value is str() (repr=false) or repr() (repr=true); containers repr their items. */
static int write_value(struct tbuf *b, struct tv v, bool repr, int depth)
{
    int rv = 0;
    if (depth > TV_MAX_DEPTH)
        return strata_errf(STRATA_ELIMIT, "values nested deeper than %d", TV_MAX_DEPTH);
    switch (v.k) {
    case TV_UNDEF:
        return repr ? tbuf_puts(b, "Undefined") : 0;
    case TV_NONE:
        return tbuf_puts(b, "None");
    case TV_BOOL:
        return tbuf_puts(b, v.u.b ? "True" : "False");
    case TV_INT:
        return tbuf_printf(b, "%" PRId64, v.u.i);
    case TV_FLOAT:
        return tv_write_float(b, v.u.f);
    case TV_STR:
        return repr ? repr_str(b, v.u.s) : tbuf_add(b, v.u.s->p, v.u.s->n);
    case TV_LIST: {
        const struct tlist *l = v.u.l;
        if ((rv = tbuf_puts(b, l->tuple ? "(" : "[")) != 0) return rv;
        for (size_t i = 0; i < l->n; i++) {
            if (i && (rv = tbuf_puts(b, ", ")) != 0) return rv;
            if ((rv = write_value(b, l->v[i], true, depth + 1)) != 0) return rv;
        }
        if (l->tuple && l->n == 1 && (rv = tbuf_puts(b, ",")) != 0) return rv;
        return tbuf_puts(b, l->tuple ? ")" : "]");
    }
    case TV_DICT: {
        const struct tdict *d = v.u.d;
        if ((rv = tbuf_puts(b, d->ns ? "<Namespace {" : "{")) != 0) return rv;
        for (size_t i = 0; i < d->n; i++) {
            if (i && (rv = tbuf_puts(b, ", ")) != 0) return rv;
            if ((rv = write_value(b, d->k[i], true, depth + 1)) != 0) return rv;
            if ((rv = tbuf_puts(b, ": ")) != 0) return rv;
            if ((rv = write_value(b, d->v[i], true, depth + 1)) != 0) return rv;
        }
        return tbuf_puts(b, d->ns ? "}>" : "}");
    }
    case TV_MACRO:
        return tbuf_puts(b, "<Macro>");
    case TV_LOOP:
        return tbuf_puts(b, "<LoopContext>");
    default:
        return tbuf_puts(b, "<built-in function>");
    }
}

int tv_write(struct tbuf *b, struct tv v, int depth)
{
    return write_value(b, v, false, depth);
}

int tv_repr(struct tbuf *b, struct tv v, int depth)
{
    return write_value(b, v, true, depth);
}

static int json_str(struct tbuf *b, const char *p, size_t n)
{
    int rv;
    if ((rv = tbuf_add(b, "\"", 1)) != 0) return rv;
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        if ((rv = tbuf_add(b, p + run, i - run)) != 0) return rv;
        run = i + 1;
        switch (c) {
        case '"':
            rv = tbuf_puts(b, "\\\"");
            break;
        case '\\':
            rv = tbuf_puts(b, "\\\\");
            break;
        case '\n':
            rv = tbuf_puts(b, "\\n");
            break;
        case '\r':
            rv = tbuf_puts(b, "\\r");
            break;
        case '\t':
            rv = tbuf_puts(b, "\\t");
            break;
        case '\b':
            rv = tbuf_puts(b, "\\b");
            break;
        case '\f':
            rv = tbuf_puts(b, "\\f");
            break;
        default:
            rv = tbuf_printf(b, "\\u%04x", c);
        }
        if (rv) return rv;
    }
    if ((rv = tbuf_add(b, p + run, n - run)) != 0) return rv;
    return tbuf_add(b, "\"", 1);
}

static int json_newline(struct tbuf *b, int indent, int level)
{
    int rv = tbuf_add(b, "\n", 1);
    for (int i = 0; !rv && i < indent * level; i++)
        rv = tbuf_add(b, " ", 1);
    return rv;
}

static int json_float(struct tbuf *b, double f)
{
    if (isnan(f)) return tbuf_puts(b, "NaN");
    if (isinf(f)) return tbuf_puts(b, f < 0 ? "-Infinity" : "Infinity");
    return tv_write_float(b, f);
}

/* json.dumps turns keys into strings: str, int, float, bool and None keys are allowed. */
static int json_key(struct tbuf *b, struct tv k)
{
    struct tbuf t = {.limit = b->limit};
    int rv;
    switch (k.k) {
    case TV_STR:
        return json_str(b, k.u.s->p, k.u.s->n);
    case TV_BOOL:
        return json_str(b, k.u.b ? "true" : "false", k.u.b ? 4 : 5);
    case TV_NONE:
        return json_str(b, "null", 4);
    case TV_INT:
        rv = tbuf_printf(&t, "%" PRId64, k.u.i);
        break;
    case TV_FLOAT:
        rv = json_float(&t, k.u.f);
        break;
    default:
        return strata_errf(STRATA_EINVAL,
                           "tojson: keys must be str, int, float, bool or None, not %s",
                           tv_typename(k));
    }
    if (!rv) rv = json_str(b, t.p, t.n);
    free(t.p);
    return rv;
}

int tv_tojson(struct tbuf *b, struct tv v, int indent, int level)
{
    int rv;
    if (level > TV_MAX_DEPTH)
        return strata_errf(STRATA_ELIMIT, "tojson: values nested deeper than %d", TV_MAX_DEPTH);
    switch (v.k) {
    case TV_NONE:
        return tbuf_puts(b, "null");
    case TV_BOOL:
        return tbuf_puts(b, v.u.b ? "true" : "false");
    case TV_INT:
        return tbuf_printf(b, "%" PRId64, v.u.i);
    case TV_FLOAT:
        return json_float(b, v.u.f);
    case TV_STR:
        return json_str(b, v.u.s->p, v.u.s->n);
    case TV_LIST:
    case TV_DICT: {
        bool list = v.k == TV_LIST;
        size_t n = list ? v.u.l->n : v.u.d->n;
        if (!list && v.u.d->ns) break;
        if (n == 0) return tbuf_puts(b, list ? "[]" : "{}");
        if ((rv = tbuf_puts(b, list ? "[" : "{")) != 0) return rv;
        for (size_t i = 0; i < n; i++) {
            if (i && (rv = tbuf_puts(b, indent >= 0 ? "," : ", ")) != 0) return rv;
            if (indent >= 0 && (rv = json_newline(b, indent, level + 1)) != 0) return rv;
            if (!list) {
                if ((rv = json_key(b, v.u.d->k[i])) != 0) return rv;
                if ((rv = tbuf_puts(b, ": ")) != 0) return rv;
            }
            if ((rv = tv_tojson(b, list ? v.u.l->v[i] : v.u.d->v[i], indent, level + 1)) != 0)
                return rv;
        }
        if (indent >= 0 && (rv = json_newline(b, indent, level)) != 0) return rv;
        return tbuf_puts(b, list ? "]" : "}");
    }
    default:
        break;
    }
    return strata_errf(STRATA_EINVAL, "tojson: Object of type %s is not JSON serializable",
                       tv_typename(v));
}
