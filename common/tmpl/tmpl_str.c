/* tmpl_str — Python's str methods and formatting for the template interpreter: case mapping
 * (ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic; other scripts are left as they are),
 * strip with Unicode whitespace, split, replace, find, count, `%` formatting and str.format. */
#include "common/tmpl/tmpl_int.h"

#include "common/base/err.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t cp_upper(uint32_t c)
{
    if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
    if (c >= 0xe0 && c <= 0xfe && c != 0xf7) return c - 0x20;
    if (c == 0xff) return 0x178;
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) return c & ~1u;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c & 1) ? c : c - 1;
    if (c == 0x3c2) return 0x3a3;
    if (c >= 0x3b1 && c <= 0x3cb) return c - 0x20;
    if (c == 0x3ac) return 0x386;
    if (c >= 0x3ad && c <= 0x3af) return c - 0x25;
    if (c == 0x3cc) return 0x38c;
    if (c == 0x3cd || c == 0x3ce) return c - 0x3f;
    if (c >= 0x430 && c <= 0x44f) return c - 0x20;
    if (c >= 0x450 && c <= 0x45f) return c - 0x50;
    return c;
}

static uint32_t cp_lower(uint32_t c)
{
    if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
    if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 0x20;
    if (c == 0x178) return 0xff;
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) return c | 1u;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c & 1) ? c + 1 : c;
    if (c >= 0x391 && c <= 0x3ab && c != 0x3a2) return c + 0x20;
    if (c == 0x386) return 0x3ac;
    if (c >= 0x388 && c <= 0x38a) return c + 0x25;
    if (c == 0x38c) return 0x3cc;
    if (c == 0x38e || c == 0x38f) return c + 0x3f;
    if (c >= 0x410 && c <= 0x42f) return c + 0x20;
    if (c >= 0x400 && c <= 0x40f) return c + 0x50;
    return c;
}

static bool cp_cased(uint32_t c)
{
    return cp_upper(c) != c || cp_lower(c) != c || (c >= 'A' && c <= 'Z') || c == 0xdf;
}

static bool jinja_word_sep(uint32_t c)
{
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || tmpl_u_isspace(c);
}

int tmpl_str_case(struct trt *rt, const struct tstr *s, enum tcase mode, struct tv *out)
{
    struct tbuf b = {.limit = rt->t->lim.max_memory};
    bool start = true; /* at the start of a word (title) or of the string (capitalize) */
    int rv = 0;
    for (size_t i = 0; i < s->n && !rv;) {
        uint32_t c;
        i += tmpl_u8_dec(s->p + i, s->n - i, &c);
        uint32_t o = c;
        switch (mode) {
        case TCASE_UPPER:
            o = cp_upper(c);
            break;
        case TCASE_LOWER:
            o = cp_lower(c);
            break;
        case TCASE_CAPITALIZE:
            o = start ? cp_upper(c) : cp_lower(c);
            start = false;
            break;
        case TCASE_TITLE_PY:
            o = start ? cp_upper(c) : cp_lower(c);
            start = !cp_cased(c);
            break;
        case TCASE_TITLE_JINJA:
            o = jinja_word_sep(c) ? c : start ? cp_upper(c) : cp_lower(c);
            start = jinja_word_sep(c);
            break;
        }
        char e[4];
        rv = tbuf_add(&b, e, (size_t)tmpl_u8_enc(e, o));
    }
    return tmpl_rt_buf_str(rt, &b, rv, out);
}

static bool in_chars(const struct tstr *chars, uint32_t c)
{
    if (!chars) return tmpl_u_isspace(c);
    for (size_t i = 0; i < chars->n;) {
        uint32_t x;
        i += tmpl_u8_dec(chars->p + i, chars->n - i, &x);
        if (x == c) return true;
    }
    return false;
}

int tmpl_str_strip(struct trt *rt, const struct tstr *s, const struct tstr *chars, int which,
                   struct tv *out)
{
    size_t a = 0, b = s->n;
    while ((which & 1) && a < b) {
        uint32_t c;
        size_t k = tmpl_u8_dec(s->p + a, b - a, &c);
        if (!in_chars(chars, c)) break;
        a += k;
    }
    while ((which & 2) && b > a) {
        size_t st = b - 1;
        while (st > a && ((unsigned char)s->p[st] & 0xc0) == 0x80)
            st--;
        uint32_t c;
        tmpl_u8_dec(s->p + st, b - st, &c);
        if (!in_chars(chars, c)) break;
        b = st;
    }
    if (a == 0 && b == s->n) {
        *out = tv_s((struct tstr *)s);
        return 0;
    }
    struct tstr *r = tmpl_rt_str(rt, s->p + a, b - a);
    if (!r) return tmpl_rt_oom(rt);
    *out = tv_s(r);
    return 0;
}

int tmpl_str_replace(struct trt *rt, const struct tstr *s, const struct tstr *old,
                     const struct tstr *new_, int64_t count, struct tv *out)
{
    struct tbuf b = {.limit = rt->t->lim.max_memory};
    int rv = 0;
    size_t i = 0;
    if (old->n == 0) { /* Python inserts new_ before every character and at the end */
        while (!rv && i <= s->n) {
            if (count >= 0 && count-- == 0) break;
            rv = tbuf_add(&b, new_->p, new_->n);
            if (i == s->n) {
                i++;
                break;
            }
            uint32_t c;
            size_t k = tmpl_u8_dec(s->p + i, s->n - i, &c);
            if (!rv) rv = tbuf_add(&b, s->p + i, k);
            i += k;
        }
        if (!rv && i < s->n) rv = tbuf_add(&b, s->p + i, s->n - i);
        return tmpl_rt_buf_str(rt, &b, rv, out);
    }
    while (!rv) {
        const char *hit = count != 0 ? memmem(s->p + i, s->n - i, old->p, old->n) : NULL;
        if (!hit) break;
        size_t at = (size_t)(hit - s->p);
        if ((rv = tbuf_add(&b, s->p + i, at - i)) == 0) rv = tbuf_add(&b, new_->p, new_->n);
        i = at + old->n;
        if (count > 0) count--;
    }
    if (!rv) rv = tbuf_add(&b, s->p + i, s->n - i);
    return tmpl_rt_buf_str(rt, &b, rv, out);
}

/* ---- % formatting ---- */

static int fmt_one(struct trt *rt, struct tbuf *b, const char *spec, size_t speclen, char conv,
                   struct tv v)
{
    char f[48], tmp[512];
    int rv;
    if (speclen > 20) return tmpl_rt_err(rt, STRATA_EINVAL, "format specification too long");
    if (conv == 's' || conv == 'r') {
        struct tbuf t = {.limit = rt->t->lim.max_memory};
        rv = conv == 's' ? tv_write(&t, v, 0) : tv_repr(&t, v, 0);
        /* width and precision count code points; apply them by hand */
        if (!rv) {
            const char *q = spec;
            bool left = false;
            while (*q == '-' || *q == ' ' || *q == '+' || *q == '#' || *q == '0')
                left |= *q++ == '-';
            long width = strtol(q, (char **)&q, 10);
            long prec = *q == '.' ? strtol(q + 1, NULL, 10) : -1;
            size_t n = t.n, cps = tmpl_u8_len(t.p ? t.p : "", t.n);
            if (prec >= 0 && (size_t)prec < cps) {
                n = tmpl_u8_off(t.p, t.n, (size_t)prec);
                cps = (size_t)prec;
            }
            for (long k = (long)cps; !rv && !left && k < width; k++)
                rv = tbuf_add(b, " ", 1);
            if (!rv) rv = tbuf_add(b, t.p ? t.p : "", n);
            for (long k = (long)cps; !rv && left && k < width; k++)
                rv = tbuf_add(b, " ", 1);
        }
        free(t.p);
        return rv;
    }
    if (!tv_isnum(v))
        return tmpl_rt_err(rt, STRATA_EINVAL, "%%%c format: a real number is required, not %s",
                           conv, tv_typename(v));
    if (conv == 'c') {
        char e[4];
        return tbuf_add(b, e, (size_t)tmpl_u8_enc(e, (uint32_t)tv_asint(v) & 0x1fffff));
    }
    if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
        int64_t x = v.k == TV_FLOAT ? (int64_t)v.u.f : tv_asint(v);
        snprintf(f, sizeof f, "%%%.*s%s%c", (int)speclen, spec, "ll", conv == 'i' ? 'd' : conv);
        snprintf(tmp, sizeof tmp, f, (long long)x);
    } else {
        snprintf(f, sizeof f, "%%%.*s%c", (int)speclen, spec, conv);
        snprintf(tmp, sizeof tmp, f, tv_asdbl(v));
    }
    return tbuf_puts(b, tmp);
}

int tmpl_str_percent(struct trt *rt, const struct tstr *s, struct tv args, struct tv *out)
{
    struct tbuf b = {.limit = rt->t->lim.max_memory};
    bool tuple = args.k == TV_LIST && args.u.l->tuple;
    size_t next = 0;
    int rv = 0;
    for (size_t i = 0; i < s->n && !rv;) {
        const char *pct = memchr(s->p + i, '%', s->n - i);
        size_t at = pct ? (size_t)(pct - s->p) : s->n;
        if ((rv = tbuf_add(&b, s->p + i, at - i)) != 0 || !pct) break;
        i = at + 1;
        struct tv v = args;
        if (i < s->n && s->p[i] == '(') {
            const char *close = memchr(s->p + i, ')', s->n - i);
            if (!close || args.k != TV_DICT) {
                rv = tmpl_rt_err(rt, STRATA_EINVAL, "%%(name) format needs a dict argument");
                break;
            }
            struct tv *x = tv_dict_gets(args.u.d, s->p + i + 1, (size_t)(close - s->p) - i - 1);
            if (!x) {
                rv = tmpl_rt_err(rt, STRATA_EINVAL, "%% format: key '%.*s' is missing",
                                 (int)((size_t)(close - s->p) - i - 1), s->p + i + 1);
                break;
            }
            v = *x;
            i = (size_t)(close - s->p) + 1;
        } else if (i < s->n && s->p[i] == '%') {
            rv = tbuf_add(&b, "%", 1);
            i++;
            continue;
        } else if (tuple) {
            if (next >= args.u.l->n) {
                rv = tmpl_rt_err(rt, STRATA_EINVAL, "not enough arguments for format string");
                break;
            }
            v = args.u.l->v[next++];
        } else if (next++ > 0) {
            rv = tmpl_rt_err(rt, STRATA_EINVAL, "not enough arguments for format string");
            break;
        }
        size_t sp = i;
        while (i < s->n && strchr("-+ #0123456789.", s->p[i]))
            i++;
        if (i >= s->n || !strchr("sridxXofFeEgGc", s->p[i])) {
            rv = tmpl_rt_err(rt, STRATA_EINVAL, "unsupported format character in '%.*s'",
                             (int)(s->n > 40 ? 40 : s->n), s->p);
            break;
        }
        rv = fmt_one(rt, &b, s->p + sp, i - sp, s->p[i], v);
        i++;
    }
    if (!rv && tuple && next < args.u.l->n)
        rv = tmpl_rt_err(rt, STRATA_EINVAL, "not all arguments converted during string formatting");
    return tmpl_rt_buf_str(rt, &b, rv, out);
}

/* str_format: str.format with "{}", "{0}", "{name}" fields (no format specs), "{{" and "}}". */
static int str_format(struct trt *rt, const struct tstr *s, struct tv *args, size_t nargs,
                      const char **kwn, struct tv *kwv, size_t nkw, struct tv *out)
{
    struct tbuf b = {.limit = rt->t->lim.max_memory};
    size_t auto_i = 0;
    int rv = 0;
    for (size_t i = 0; i < s->n && !rv; i++) {
        char c = s->p[i];
        if ((c == '{' || c == '}') && i + 1 < s->n && s->p[i + 1] == c) {
            rv = tbuf_add(&b, &c, 1);
            i++;
            continue;
        }
        if (c != '{') {
            rv = tbuf_add(&b, &c, 1);
            continue;
        }
        const char *close = memchr(s->p + i, '}', s->n - i);
        if (!close) {
            rv = tmpl_rt_err(rt, STRATA_EINVAL, "str.format: single '{' encountered");
            break;
        }
        const char *f = s->p + i + 1;
        size_t fn = (size_t)(close - f);
        const struct tv *v = NULL;
        if (memchr(f, ':', fn) || memchr(f, '!', fn)) {
            rv = tmpl_rt_err(rt, STRATA_EUNSUPPORTED, "str.format: format specs are not supported");
            break;
        }
        if (fn == 0) {
            if (auto_i < nargs) v = &args[auto_i++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            size_t k = (size_t)strtoul(f, NULL, 10);
            if (k < nargs) v = &args[k];
        } else {
            for (size_t k = 0; k < nkw; k++)
                if (strlen(kwn[k]) == fn && memcmp(kwn[k], f, fn) == 0) v = &kwv[k];
        }
        if (!v) {
            rv = tmpl_rt_err(rt, STRATA_EINVAL, "str.format: no argument for '{%.*s}'", (int)fn, f);
            break;
        }
        rv = tv_write(&b, *v, 0);
        i = (size_t)(close - s->p);
    }
    return tmpl_rt_buf_str(rt, &b, rv, out);
}

/* ---- methods ---- */

static int need_str(struct trt *rt, const char *m, const struct tv *v, bool opt)
{
    if (!v || v->k == TV_NONE)
        return opt ? 0
                   : tmpl_rt_err(rt, STRATA_EINVAL,
                                 "str.%s: missing "
                                 "argument",
                                 m);
    if (v->k != TV_STR)
        return tmpl_rt_err(rt, STRATA_EINVAL, "str.%s: argument must be str, not %s", m,
                           tv_typename(*v));
    return 0;
}

/* split: sep NULL splits on whitespace runs; from_right for rsplit. */
static int split(struct trt *rt, const struct tstr *s, const struct tstr *sep, int64_t max,
                 bool from_right, struct tv *out)
{
    struct tlist *l = tv_newlist(&rt->arena, 0);
    struct tv piece;
    if (!l) return tmpl_rt_oom(rt);
    if (sep && sep->n == 0) return tmpl_rt_err(rt, STRATA_EINVAL, "str.split: empty separator");
    /* Work on [a, b): pieces come off the left (split) or the right (rsplit). */
    size_t a = 0, b = s->n;
    int64_t done = 0;
    for (;;) {
        if (!sep) {
            /* skip whitespace on the working side */
            while (a < b) {
                uint32_t c;
                if (from_right) {
                    size_t st = b - 1;
                    while (st > a && ((unsigned char)s->p[st] & 0xc0) == 0x80)
                        st--;
                    tmpl_u8_dec(s->p + st, b - st, &c);
                    if (!tmpl_u_isspace(c)) break;
                    b = st;
                } else {
                    size_t k = tmpl_u8_dec(s->p + a, b - a, &c);
                    if (!tmpl_u_isspace(c)) break;
                    a += k;
                }
            }
            if (a >= b) break;
            if (max >= 0 && done >= max) { /* the rest, as it is */
                struct tstr *r = tmpl_rt_str(rt, s->p + a, b - a);
                if (!r || tv_list_push(&rt->arena, l, tv_s(r)) != 0) return tmpl_rt_oom(rt);
                break;
            }
            size_t e;
            if (from_right) {
                e = b;
                while (e > a) {
                    size_t st = e - 1;
                    while (st > a && ((unsigned char)s->p[st] & 0xc0) == 0x80)
                        st--;
                    uint32_t c;
                    tmpl_u8_dec(s->p + st, e - st, &c);
                    if (tmpl_u_isspace(c)) break;
                    e = st;
                }
                struct tstr *r = tmpl_rt_str(rt, s->p + e, b - e);
                if (!r) return tmpl_rt_oom(rt);
                piece = tv_s(r);
                b = e;
            } else {
                e = a;
                while (e < b) {
                    uint32_t c;
                    size_t k = tmpl_u8_dec(s->p + e, b - e, &c);
                    if (tmpl_u_isspace(c)) break;
                    e += k;
                }
                struct tstr *r = tmpl_rt_str(rt, s->p + a, e - a);
                if (!r) return tmpl_rt_oom(rt);
                piece = tv_s(r);
                a = e;
            }
        } else {
            const char *hit = NULL;
            if (max < 0 || done < max) {
                if (!from_right) {
                    hit = memmem(s->p + a, b - a, sep->p, sep->n);
                } else {
                    for (size_t k = b >= sep->n + a ? b - sep->n + 1 : 0; k-- > a;)
                        if (memcmp(s->p + k, sep->p, sep->n) == 0) {
                            hit = s->p + k;
                            break;
                        }
                }
            }
            size_t at = hit ? (size_t)(hit - s->p) : 0;
            size_t ps = !hit ? a : from_right ? at + sep->n : a;
            size_t pe = !hit ? b : from_right ? b : at;
            struct tstr *r = tmpl_rt_str(rt, s->p + ps, pe - ps);
            if (!r) return tmpl_rt_oom(rt);
            piece = tv_s(r);
            if (tv_list_push(&rt->arena, l, piece) != 0) return tmpl_rt_oom(rt);
            if (!hit) break;
            if (from_right)
                b = at;
            else
                a = at + sep->n;
            done++;
            continue;
        }
        if (tv_list_push(&rt->arena, l, piece) != 0) return tmpl_rt_oom(rt);
        done++;
    }
    if (from_right) /* pieces were taken right to left */
        for (size_t i = 0; i < l->n / 2; i++) {
            struct tv t = l->v[i];
            l->v[i] = l->v[l->n - 1 - i];
            l->v[l->n - 1 - i] = t;
        }
    *out = tv_l(l);
    return 0;
}

static const struct tv *arg_at(struct tv *args, size_t nargs, const char **kwn, struct tv *kwv,
                               size_t nkw, size_t pos, const char *name)
{
    if (pos < nargs) return &args[pos];
    for (size_t k = 0; name && k < nkw; k++)
        if (!strcmp(kwn[k], name)) return &kwv[k];
    return NULL;
}

static int affix(struct trt *rt, const struct tstr *s, const struct tv *x, bool end, bool *hit)
{
    *hit = false;
    if (x && x->k == TV_LIST && x->u.l->tuple) {
        for (size_t i = 0; i < x->u.l->n && !*hit; i++) {
            int rv = affix(rt, s, &x->u.l->v[i], end, hit);
            if (rv) return rv;
        }
        return 0;
    }
    int rv = need_str(rt, end ? "endswith" : "startswith", x, false);
    if (rv) return rv;
    const struct tstr *a = x->u.s;
    *hit = a->n <= s->n && memcmp(s->p + (end ? s->n - a->n : 0), a->p, a->n) == 0;
    return 0;
}

int tmpl_str_method(struct trt *rt, const struct tstr *s, const char *m, struct tv *args,
                    size_t nargs, const char **kwn, struct tv *kwv, size_t nkw, struct tv *out,
                    bool *found)
{
#define ARG(pos, name) arg_at(args, nargs, kwn, kwv, nkw, pos, name)
    const struct tv *a0 = ARG(0, NULL), *a1 = ARG(1, NULL);
    int rv;
    *found = true;
    if (!strcmp(m, "upper")) return tmpl_str_case(rt, s, TCASE_UPPER, out);
    if (!strcmp(m, "lower")) return tmpl_str_case(rt, s, TCASE_LOWER, out);
    if (!strcmp(m, "title")) return tmpl_str_case(rt, s, TCASE_TITLE_PY, out);
    if (!strcmp(m, "capitalize")) return tmpl_str_case(rt, s, TCASE_CAPITALIZE, out);
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        if ((rv = need_str(rt, m, a0, true)) != 0) return rv;
        int which = m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3;
        return tmpl_str_strip(rt, s, a0 && a0->k == TV_STR ? a0->u.s : NULL, which, out);
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        const struct tv *sep = ARG(0, "sep"), *mx = ARG(1, "maxsplit");
        if ((rv = need_str(rt, m, sep, true)) != 0) return rv;
        if (mx && !tv_isint(*mx))
            return tmpl_rt_err(rt, STRATA_EINVAL, "str.%s: maxsplit must be an int", m);
        return split(rt, s, sep && sep->k == TV_STR ? sep->u.s : NULL, mx ? tv_asint(*mx) : -1,
                     m[0] == 'r', out);
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        bool hit;
        if ((rv = affix(rt, s, a0, m[0] == 'e', &hit)) != 0) return rv;
        *out = tv_bool(hit);
        return 0;
    }
    if (!strcmp(m, "replace")) {
        const struct tv *cnt = ARG(2, "count");
        if ((rv = need_str(rt, m, a0, false)) != 0 || (rv = need_str(rt, m, a1, false)) != 0)
            return rv;
        return tmpl_str_replace(rt, s, a0->u.s, a1->u.s,
                                cnt && tv_isint(*cnt) ? tv_asint(*cnt) : -1, out);
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "count")) {
        if ((rv = need_str(rt, m, a0, false)) != 0) return rv;
        const struct tstr *sub = a0->u.s;
        int64_t idx = -1, cnt = 0;
        if (m[0] == 'c' && sub->n == 0) {
            *out = tv_int((int64_t)tmpl_u8_len(s->p, s->n) + 1);
            return 0;
        }
        for (size_t i = 0; i + sub->n <= s->n;) {
            if (memcmp(s->p + i, sub->p, sub->n) == 0) {
                idx = (int64_t)tmpl_u8_len(s->p, i);
                cnt++;
                if (m[0] == 'f') break;
                i += sub->n ? sub->n : 1;
            } else {
                i++;
            }
        }
        *out = tv_int(m[0] == 'c' ? cnt : idx);
        return 0;
    }
    if (!strcmp(m, "join")) {
        struct tlist *l;
        struct tbuf b = {.limit = rt->t->lim.max_memory};
        if (!a0) return tmpl_rt_err(rt, STRATA_EINVAL, "str.join: missing argument");
        if ((rv = tmpl_rt_iter(rt, *a0, &l)) != 0) return rv;
        for (size_t i = 0; i < l->n && !rv; i++) {
            if (l->v[i].k != TV_STR)
                rv = tmpl_rt_err(rt, STRATA_EINVAL, "str.join: item %zu is %s, not str", i,
                                 tv_typename(l->v[i]));
            if (!rv && i) rv = tbuf_add(&b, s->p, s->n);
            if (!rv) rv = tbuf_add(&b, l->v[i].u.s->p, l->v[i].u.s->n);
        }
        return tmpl_rt_buf_str(rt, &b, rv, out);
    }
    if (!strcmp(m, "format")) return str_format(rt, s, args, nargs, kwn, kwv, nkw, out);
    if (!strcmp(m, "isdigit") || !strcmp(m, "isspace") || !strcmp(m, "isalpha")) {
        bool all = s->n > 0;
        for (size_t i = 0; i < s->n && all;) {
            uint32_t c;
            i += tmpl_u8_dec(s->p + i, s->n - i, &c);
            all = m[2] == 'd'   ? (c >= '0' && c <= '9')
                  : m[2] == 's' ? tmpl_u_isspace(c)
                                : cp_cased(c);
        }
        *out = tv_bool(all);
        return 0;
    }
    *found = false;
    return 0;
#undef ARG
}
