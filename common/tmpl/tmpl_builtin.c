/* tmpl_builtin — Jinja2's filters that chat templates use. Behaviour follows Jinja2 3.1's
 * definitions (e.g. sort, unique and dictsort ignore case unless told; `title` splits words at
 * spaces and -([{< as Jinja2 does, unlike str.title). */
#include "common/tmpl/tmpl_int.h"

#include "common/base/err.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct targs {
    struct tv *a;
    size_t n;
    const char **kn;
    struct tv *kv;
    size_t nk;
};

/* A returns argument pos (positional) or name (keyword), or NULL. */
static const struct tv *A(const struct targs *x, size_t pos, const char *name)
{
    if (pos < x->n) return &x->a[pos];
    for (size_t k = 0; name && k < x->nk; k++)
        if (!strcmp(x->kn[k], name)) return &x->kv[k];
    return NULL;
}

static bool A_bool(const struct targs *x, size_t pos, const char *name, bool def)
{
    const struct tv *v = A(x, pos, name);
    return v ? tv_truthy(*v) : def;
}

static int need(struct trt *rt, const char *f, const struct tv *v)
{
    return v ? 0 : tmpl_rt_err(rt, STRATA_EINVAL, "%s: a required argument is missing", f);
}

static struct tbuf newbuf(struct trt *rt)
{
    return (struct tbuf){.limit = rt->t->lim.max_memory};
}

/* attr_path: getattr along "a.b.c" (an integer part indexes a list), as Jinja2's make_attrgetter.
 */
static int attr_path(struct trt *rt, struct tv v, const struct tstr *path, struct tv *out)
{
    size_t i = 0;
    while (i <= path->n) {
        const char *dot = memchr(path->p + i, '.', path->n - i);
        size_t e = dot ? (size_t)(dot - path->p) : path->n;
        char part[256];
        if (e - i >= sizeof part) return tmpl_rt_err(rt, STRATA_EINVAL, "attribute name too long");
        memcpy(part, path->p + i, e - i);
        part[e - i] = 0;
        char *end;
        long idx = strtol(part, &end, 10);
        if (*part && !*end && v.k == TV_LIST) {
            v = idx >= 0 && (size_t)idx < v.u.l->n ? v.u.l->v[idx] : tv_undef(NULL);
        } else {
            int rv = tmpl_rt_getattr(rt, v, part, e - i, &v);
            if (rv) return rv;
            if (v.k == TV_UNDEF) v.u.name = path->p;
        }
        i = e + 1;
    }
    *out = v;
    return 0;
}

/* ---- stable sorting with Python's ordering; errors (mixed types) stop it ---- */

struct skey {
    struct tv key, val;
};

static int merge_sort(struct skey *v, struct skey *tmp, size_t n, bool rev)
{
    if (n < 2) return 0;
    size_t h = n / 2;
    int rv;
    if ((rv = merge_sort(v, tmp, h, rev)) != 0 || (rv = merge_sort(v + h, tmp, n - h, rev)) != 0)
        return rv;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c;
        if ((rv = tv_cmp(v[j].key, v[i].key, &c, 0)) != 0) return rv;
        /* take from the right only when strictly before: keeps equal keys in order */
        if (rev ? c > 0 : c < 0)
            tmp[k++] = v[j++];
        else
            tmp[k++] = v[i++];
    }
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
    return 0;
}

/* sort_key: the key Jinja2 compares: the attribute if given, lower-cased unless case_sensitive. */
static int sort_key(struct trt *rt, struct tv v, const struct tv *attr, bool cs, struct tv *out)
{
    int rv;
    if (attr && attr->k == TV_STR && (rv = attr_path(rt, v, attr->u.s, &v)) != 0) return rv;
    if (!cs && v.k == TV_STR) return tmpl_str_case(rt, v.u.s, TCASE_LOWER, out);
    *out = v;
    return 0;
}

/* sorted sorts l in place; pair >= 0 sorts (key, value) pairs by that element (dictsort). */
static int sorted(struct trt *rt, struct tlist *l, const struct tv *attr, bool cs, bool rev,
                  int pair)
{
    struct skey *v = tmpl_arena_alloc(&rt->arena, (l->n + 1) * sizeof *v * 2);
    int rv;
    if (!v) return tmpl_rt_oom(rt);
    for (size_t i = 0; i < l->n; i++) {
        struct tv k = l->v[i];
        if (pair >= 0 && k.k == TV_LIST && k.u.l->n == 2) k = k.u.l->v[pair];
        v[i].val = l->v[i];
        if ((rv = sort_key(rt, k, attr, cs, &v[i].key)) != 0) return rv;
    }
    if ((rv = merge_sort(v, v + l->n + 1, l->n, rev)) != 0)
        return tmpl_rt_err(rt, rv, "sort: %s", strata_errdetail());
    for (size_t i = 0; i < l->n; i++)
        l->v[i] = v[i].val;
    return 0;
}

/* ---- filters ---- */

typedef int (*filter_fn)(struct trt *rt, struct tv in, const struct targs *x, struct tv *out);

static int f_tojson(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *ind = A(x, 0, "indent");
    struct tbuf b = newbuf(rt);
    int rv = tv_tojson(&b, in, ind && tv_isint(*ind) ? (int)tv_asint(*ind) : -1, 0);
    if (rv && strncmp(strata_errdetail(), "line ", 5) != 0)
        rv = tmpl_rt_err(rt, rv, "%s", strata_errdetail());
    return tmpl_rt_buf_str(rt, &b, rv, out);
}

static int f_string(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    struct tstr *s;
    int rv = tmpl_rt_tostr(rt, in, &s);
    if (!rv) *out = tv_s(s);
    return rv;
}

static int f_trim(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *chars = A(x, 0, "chars");
    struct tstr *s;
    int rv = tmpl_rt_tostr(rt, in, &s);
    if (rv) return rv;
    return tmpl_str_strip(rt, s, chars && chars->k == TV_STR ? chars->u.s : NULL, 3, out);
}

static int f_length(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    switch (in.k) {
    case TV_UNDEF:
        *out = tv_int(0);
        return 0;
    case TV_STR:
        *out = tv_int((int64_t)tmpl_u8_len(in.u.s->p, in.u.s->n));
        return 0;
    case TV_LIST:
        *out = tv_int((int64_t)in.u.l->n);
        return 0;
    case TV_DICT:
        if (in.u.d->ns) break;
        *out = tv_int((int64_t)in.u.d->n);
        return 0;
    case TV_LOOP:
        *out = tv_int((int64_t)in.u.loop->items->n);
        return 0;
    default:
        break;
    }
    return tmpl_rt_err(rt, STRATA_EINVAL, "object of type '%s' has no len()", tv_typename(in));
}

static int f_join(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *sep = A(x, 0, "d"), *attr = A(x, 1, "attribute");
    struct tlist *l;
    struct tbuf b = newbuf(rt);
    int rv = tmpl_rt_iter(rt, in, &l);
    struct tstr *ss = NULL;
    if (!rv && sep) rv = tmpl_rt_tostr(rt, *sep, &ss);
    for (size_t i = 0; !rv && i < l->n; i++) {
        struct tv v = l->v[i];
        if (attr && attr->k == TV_STR) rv = attr_path(rt, v, attr->u.s, &v);
        if (!rv && i && ss) rv = tbuf_add(&b, ss->p, ss->n);
        if (!rv) rv = tv_write(&b, v, 0);
    }
    return tmpl_rt_buf_str(rt, &b, rv, out);
}

static int f_replace(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *o = A(x, 0, "old"), *n = A(x, 1, "new"), *c = A(x, 2, "count");
    struct tstr *s, *os, *ns;
    int rv;
    if ((rv = need(rt, "replace", o)) != 0 || (rv = need(rt, "replace", n)) != 0) return rv;
    if ((rv = tmpl_rt_tostr(rt, in, &s)) != 0 || (rv = tmpl_rt_tostr(rt, *o, &os)) != 0 ||
        (rv = tmpl_rt_tostr(rt, *n, &ns)) != 0)
        return rv;
    return tmpl_str_replace(rt, s, os, ns, c && tv_isint(*c) ? tv_asint(*c) : -1, out);
}

static int casef(struct trt *rt, struct tv in, enum tcase mode, struct tv *out)
{
    struct tstr *s;
    int rv = tmpl_rt_tostr(rt, in, &s);
    return rv ? rv : tmpl_str_case(rt, s, mode, out);
}

static int f_upper(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    return casef(rt, in, TCASE_UPPER, out);
}
static int f_lower(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    return casef(rt, in, TCASE_LOWER, out);
}
static int f_title(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    return casef(rt, in, TCASE_TITLE_JINJA, out);
}
static int f_capitalize(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    return casef(rt, in, TCASE_CAPITALIZE, out);
}

static int f_default(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *d = A(x, 0, "default_value");
    bool boolean = A_bool(x, 1, "boolean", false);
    if (in.k == TV_UNDEF || (boolean && !tv_truthy(in))) {
        if (d) {
            *out = *d;
        } else {
            struct tstr *e = tmpl_rt_str(rt, "", 0);
            if (!e) return tmpl_rt_oom(rt);
            *out = tv_s(e);
        }
    } else {
        *out = in;
    }
    return 0;
}

static int f_first(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    struct tlist *l;
    int rv = tmpl_rt_iter(rt, in, &l);
    if (!rv) *out = l->n ? l->v[0] : tv_undef("no first item");
    return rv;
}

static int f_last(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    struct tlist *l;
    int rv = tmpl_rt_iter(rt, in, &l);
    if (!rv) *out = l->n ? l->v[l->n - 1] : tv_undef("no last item");
    return rv;
}

static int f_list(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    struct tlist *l;
    int rv = tmpl_rt_iter(rt, in, &l);
    if (!rv) {
        l->tuple = false;
        *out = tv_l(l);
    }
    return rv;
}

/* parse_int: Python's int(str): optional sign, digits with single underscores, whitespace. */
static bool parse_int(const struct tstr *s, int64_t *out)
{
    char buf[64];
    size_t k = 0;
    const char *p = s->p, *e = s->p + s->n;
    while (p < e && (*p == ' ' || (*p >= '\t' && *p <= '\r')))
        p++;
    while (e > p && (e[-1] == ' ' || (e[-1] >= '\t' && e[-1] <= '\r')))
        e--;
    if (p < e && (*p == '+' || *p == '-')) buf[k++] = *p++;
    if (p == e) return false;
    for (; p < e; p++) {
        if (*p == '_' && p + 1 < e && p[1] != '_' && k && buf[k - 1] >= '0') continue;
        if (*p < '0' || *p > '9' || k >= sizeof buf - 1) return false;
        buf[k++] = *p;
    }
    buf[k] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

static bool parse_float(const struct tstr *s, double *out)
{
    char buf[128];
    if (s->n == 0 || s->n >= sizeof buf) return false;
    memcpy(buf, s->p, s->n);
    buf[s->n] = 0;
    char *end;
    *out = strtod(buf, &end);
    while (*end == ' ' || (*end >= '\t' && *end <= '\r'))
        end++;
    return end != buf && !*end;
}

static int f_int(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *d = A(x, 0, "default");
    int64_t i;
    double f;
    if (tv_isint(in))
        *out = tv_int(tv_asint(in));
    else if (in.k == TV_FLOAT && isfinite(in.u.f) && fabs(in.u.f) < 9.2e18)
        *out = tv_int((int64_t)in.u.f);
    else if (in.k == TV_STR && parse_int(in.u.s, &i))
        *out = tv_int(i);
    else if (in.k == TV_STR && parse_float(in.u.s, &f) && isfinite(f) && fabs(f) < 9.2e18)
        *out = tv_int((int64_t)f);
    else
        *out = d ? *d : tv_int(0);
    return 0;
}

static int f_float(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *d = A(x, 0, "default");
    double f;
    if (tv_isnum(in))
        *out = tv_float(tv_asdbl(in));
    else if (in.k == TV_STR && parse_float(in.u.s, &f))
        *out = tv_float(f);
    else
        *out = d ? *d : tv_float(0);
    return 0;
}

static int f_abs(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    if (in.k == TV_FLOAT)
        *out = tv_float(fabs(in.u.f));
    else if (tv_isint(in) && tv_asint(in) != INT64_MIN)
        *out = tv_int(llabs(tv_asint(in)));
    else
        return tmpl_rt_err(rt, STRATA_EINVAL, "bad operand type for abs(): '%s'", tv_typename(in));
    return 0;
}

static int f_round(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *pv = A(x, 0, "precision"), *mv = A(x, 1, "method");
    int64_t p = pv && tv_isint(*pv) ? tv_asint(*pv) : 0;
    const char *m = mv && mv->k == TV_STR ? mv->u.s->p : "common";
    if (!tv_isnum(in))
        return tmpl_rt_err(rt, STRATA_EINVAL, "round: '%s' is not a number", tv_typename(in));
    if (p < -300 || p > 300) p = p < 0 ? -300 : 300;
    double v = tv_asdbl(in), r, scale = pow(10, (double)p);
    if (!strcmp(m, "ceil"))
        r = ceil(v * scale) / scale;
    else if (!strcmp(m, "floor"))
        r = floor(v * scale) / scale;
    else if (strcmp(m, "common") != 0)
        return tmpl_rt_err(rt, STRATA_EINVAL, "round: method must be common, ceil or floor");
    else if (tv_isint(in) && p >= 0) {
        *out = tv_int(tv_asint(in)); /* Python's round(int, n >= 0) is the int itself */
        return 0;
    } else if (p >= 0 && p < 60) {
        /* printf rounds the exact binary value half-to-even, as Python's round() */
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)p, v);
        r = strtod(buf, NULL);
    } else {
        r = nearbyint(v * scale) / scale;
    }
    *out = tv_float(r);
    return 0;
}

/* select_common implements select, reject, selectattr, rejectattr. */
static int select_common(struct trt *rt, struct tv in, const struct targs *x, bool attr,
                         bool keep_if, struct tv *out)
{
    struct tlist *l, *o;
    size_t ti = attr ? 1 : 0;
    const struct tv *a = attr ? A(x, 0, NULL) : NULL, *test = A(x, ti, NULL);
    int rv;
    if (attr && (!a || a->k != TV_STR))
        return tmpl_rt_err(rt, STRATA_EINVAL, "selectattr/rejectattr need an attribute name");
    if (test && test->k != TV_STR)
        return tmpl_rt_err(rt, STRATA_EINVAL, "select: the test name must be a string");
    if (test && !tmpl_test_exists(test->u.s->p))
        return tmpl_rt_err(rt, STRATA_EINVAL, "no test named '%s'", test->u.s->p);
    if ((rv = tmpl_rt_iter(rt, in, &l)) != 0) return rv;
    if (!(o = tv_newlist(&rt->arena, l->n))) return tmpl_rt_oom(rt);
    for (size_t i = 0; i < l->n; i++) {
        struct tv v = l->v[i];
        bool r;
        if (attr && (rv = attr_path(rt, v, a->u.s, &v)) != 0) return rv;
        if (test) {
            size_t na = x->n > ti + 1 ? x->n - ti - 1 : 0;
            if ((rv = tmpl_test(rt, test->u.s->p, v, x->a + ti + 1, na, &r)) != 0) return rv;
        } else {
            r = tv_truthy(v);
        }
        if (r == keep_if) o->v[o->n++] = l->v[i];
    }
    *out = tv_l(o);
    return 0;
}

static int f_select(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    return select_common(rt, in, x, false, true, out);
}
static int f_reject(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    return select_common(rt, in, x, false, false, out);
}
static int f_selectattr(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    return select_common(rt, in, x, true, true, out);
}
static int f_rejectattr(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    return select_common(rt, in, x, true, false, out);
}

static int f_map(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *attr = A(x, 99, "attribute"), *def = A(x, 99, "default");
    const struct tv *name = x->n ? &x->a[0] : NULL;
    struct tlist *l;
    int rv;
    if (!attr && (!name || name->k != TV_STR))
        return tmpl_rt_err(rt, STRATA_EINVAL, "map needs a filter name or attribute=");
    if ((rv = tmpl_rt_iter(rt, in, &l)) != 0) return rv;
    for (size_t i = 0; i < l->n; i++) {
        struct tv v = l->v[i];
        if (attr) {
            if (attr->k != TV_STR)
                return tmpl_rt_err(rt, STRATA_EINVAL,
                                   "map: attribute= must "
                                   "be a string");
            if ((rv = attr_path(rt, v, attr->u.s, &v)) != 0) return rv;
            if (v.k == TV_UNDEF && def) v = *def;
        } else if ((rv = tmpl_filter(rt, name->u.s->p, v, x->a + 1, x->n - 1, x->kn, x->kv, x->nk,
                                     &v)) != 0) {
            return rv;
        }
        l->v[i] = v;
    }
    l->tuple = false;
    *out = tv_l(l);
    return 0;
}

static int pairs(struct trt *rt, struct tv in, struct tlist **out)
{
    if (in.k == TV_UNDEF) return (*out = tv_newlist(&rt->arena, 0)) ? 0 : tmpl_rt_oom(rt);
    if (in.k != TV_DICT || in.u.d->ns)
        return tmpl_rt_err(rt, STRATA_EINVAL, "items: expected a mapping, got %s", tv_typename(in));
    struct tlist *l = tv_newlist(&rt->arena, in.u.d->n);
    if (!l) return tmpl_rt_oom(rt);
    for (size_t i = 0; i < in.u.d->n; i++) {
        struct tlist *p = tv_newlist(&rt->arena, 2);
        if (!p) return tmpl_rt_oom(rt);
        p->tuple = true;
        p->v[0] = in.u.d->k[i];
        p->v[1] = in.u.d->v[i];
        p->n = 2;
        l->v[l->n++] = tv_l(p);
    }
    *out = l;
    return 0;
}

static int f_items(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    struct tlist *l;
    int rv = pairs(rt, in, &l);
    if (!rv) *out = tv_l(l);
    return rv;
}

static int f_dictsort(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *by = A(x, 1, "by");
    struct tlist *l;
    int rv = pairs(rt, in, &l);
    if (rv) return rv;
    bool value = by && by->k == TV_STR && !strcmp(by->u.s->p, "value");
    if ((rv = sorted(rt, l, NULL, A_bool(x, 0, "case_sensitive", false),
                     A_bool(x, 2, "reverse", false), value)) != 0)
        return rv;
    *out = tv_l(l);
    return 0;
}

static int f_sort(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    struct tlist *l;
    int rv = tmpl_rt_iter(rt, in, &l);
    if (rv) return rv;
    l->tuple = false;
    if ((rv = sorted(rt, l, A(x, 2, "attribute"), A_bool(x, 1, "case_sensitive", false),
                     A_bool(x, 0, "reverse", false), -1)) != 0)
        return rv;
    *out = tv_l(l);
    return 0;
}

static int f_unique(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *attr = A(x, 1, "attribute");
    bool cs = A_bool(x, 0, "case_sensitive", false);
    struct tlist *l, *o, *seen;
    int rv = tmpl_rt_iter(rt, in, &l);
    if (rv) return rv;
    if (!(o = tv_newlist(&rt->arena, l->n)) || !(seen = tv_newlist(&rt->arena, l->n)))
        return tmpl_rt_oom(rt);
    for (size_t i = 0; i < l->n; i++) {
        struct tv k;
        bool dup = false;
        if ((rv = sort_key(rt, l->v[i], attr, cs, &k)) != 0) return rv;
        for (size_t j = 0; j < seen->n && !dup; j++)
            dup = tv_eq(seen->v[j], k, 0);
        if (dup) continue;
        seen->v[seen->n++] = k;
        o->v[o->n++] = l->v[i];
    }
    *out = tv_l(o);
    return 0;
}

static int minmax(struct trt *rt, struct tv in, const struct targs *x, bool max, struct tv *out)
{
    const struct tv *attr = A(x, 1, "attribute");
    bool cs = A_bool(x, 0, "case_sensitive", false);
    struct tlist *l;
    struct tv best = tv_undef("no items"), bk = best;
    int rv = tmpl_rt_iter(rt, in, &l);
    for (size_t i = 0; !rv && i < l->n; i++) {
        struct tv k;
        int c = 0;
        if ((rv = sort_key(rt, l->v[i], attr, cs, &k)) != 0) break;
        if (i && (rv = tv_cmp(k, bk, &c, 0)) != 0) {
            rv = tmpl_rt_err(rt, rv, "%s", strata_errdetail());
            break;
        }
        if (i == 0 || (max ? c > 0 : c < 0)) {
            best = l->v[i];
            bk = k;
        }
    }
    if (!rv) *out = best;
    return rv;
}

static int f_min(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    return minmax(rt, in, x, false, out);
}
static int f_max(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    return minmax(rt, in, x, true, out);
}

static int f_sum(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *attr = A(x, 0, "attribute"), *start = A(x, 1, "start");
    struct tlist *l;
    struct tv acc = start ? *start : tv_int(0);
    int rv = tmpl_rt_iter(rt, in, &l);
    for (size_t i = 0; !rv && i < l->n; i++) {
        struct tv v = l->v[i];
        if (attr && attr->k == TV_STR && (rv = attr_path(rt, v, attr->u.s, &v)) != 0) break;
        if (!tv_isnum(v) || !tv_isnum(acc)) {
            rv = tmpl_rt_err(rt, STRATA_EINVAL, "sum: cannot add %s and %s", tv_typename(acc),
                             tv_typename(v));
            break;
        }
        if (tv_isint(acc) && tv_isint(v)) {
            int64_t r;
            if (__builtin_add_overflow(tv_asint(acc), tv_asint(v), &r))
                rv = tmpl_rt_err(rt, STRATA_EOVERFLOW, "sum overflows 64 bits");
            acc = tv_int(r);
        } else {
            acc = tv_float(tv_asdbl(acc) + tv_asdbl(v));
        }
    }
    if (!rv) *out = acc;
    return rv;
}

static int f_reverse(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    struct tlist *l;
    int rv = tmpl_rt_iter(rt, in, &l);
    if (rv) return rv;
    for (size_t i = 0; i < l->n / 2; i++) {
        struct tv t = l->v[i];
        l->v[i] = l->v[l->n - 1 - i];
        l->v[l->n - 1 - i] = t;
    }
    if (in.k != TV_STR) {
        l->tuple = false;
        *out = tv_l(l);
        return 0;
    }
    struct tbuf b = newbuf(rt);
    for (size_t i = 0; !rv && i < l->n; i++)
        rv = tbuf_add(&b, l->v[i].u.s->p, l->v[i].u.s->n);
    return tmpl_rt_buf_str(rt, &b, rv, out);
}

static int f_batch(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *cnt = A(x, 0, "linecount"), *fill = A(x, 1, "fill_with");
    struct tlist *l, *o, *cur = NULL;
    int rv = tmpl_rt_iter(rt, in, &l);
    if (rv) return rv;
    if (!cnt || !tv_isint(*cnt) || tv_asint(*cnt) <= 0)
        return tmpl_rt_err(rt, STRATA_EINVAL, "batch: linecount must be a positive int");
    size_t n = (size_t)tv_asint(*cnt);
    if (!(o = tv_newlist(&rt->arena, 0))) return tmpl_rt_oom(rt);
    for (size_t i = 0; i < l->n; i++) {
        if (!cur || cur->n == n) {
            if (!(cur = tv_newlist(&rt->arena, n)) || tv_list_push(&rt->arena, o, tv_l(cur)))
                return tmpl_rt_oom(rt);
        }
        cur->v[cur->n++] = l->v[i];
    }
    while (fill && cur && cur->n < n)
        cur->v[cur->n++] = *fill;
    *out = tv_l(o);
    return 0;
}

static int f_indent(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *w = A(x, 0, "width");
    bool first = A_bool(x, 1, "first", false), blank = A_bool(x, 2, "blank", false);
    struct tstr *s, *ind;
    struct tbuf b = newbuf(rt);
    int rv = tmpl_rt_tostr(rt, in, &s);
    if (rv) return rv;
    if (w && w->k == TV_STR) {
        ind = w->u.s;
    } else {
        int64_t n = w && tv_isint(*w) ? tv_asint(*w) : 4;
        if (n < 0) n = 0;
        if (n > 4096)
            return tmpl_rt_err(rt, STRATA_ELIMIT, "indent: width %lld is too large", (long long)n);
        if (!(ind = tmpl_rt_str(rt, NULL, (size_t)n))) return tmpl_rt_oom(rt);
        memset(ind->p, ' ', (size_t)n);
    }
    /* Jinja2 appends "\n" and splits lines, so a trailing newline is dropped */
    if (first) rv = tbuf_add(&b, ind->p, ind->n);
    for (size_t i = 0; !rv;) {
        const char *nl = memchr(s->p + i, '\n', s->n - i);
        size_t e = nl ? (size_t)(nl - s->p) : s->n;
        if (i > 0) {
            rv = tbuf_add(&b, "\n", 1);
            if (!rv && (blank || e > i)) rv = tbuf_add(&b, ind->p, ind->n);
        }
        if (!rv) rv = tbuf_add(&b, s->p + i, e - i);
        if (e == s->n) break;
        i = e + 1;
    }
    return tmpl_rt_buf_str(rt, &b, rv, out);
}

static int f_escape(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    struct tstr *s;
    struct tbuf b = newbuf(rt);
    int rv = tmpl_rt_tostr(rt, in, &s);
    for (size_t i = 0; !rv && i < s->n; i++) {
        switch (s->p[i]) {
        case '&':
            rv = tbuf_puts(&b, "&amp;");
            break;
        case '<':
            rv = tbuf_puts(&b, "&lt;");
            break;
        case '>':
            rv = tbuf_puts(&b, "&gt;");
            break;
        case '"':
            rv = tbuf_puts(&b, "&#34;");
            break;
        case '\'':
            rv = tbuf_puts(&b, "&#39;");
            break;
        default:
            rv = tbuf_add(&b, &s->p[i], 1);
        }
    }
    return tmpl_rt_buf_str(rt, &b, rv, out);
}

static int f_wordcount(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    struct tstr *s;
    int rv = tmpl_rt_tostr(rt, in, &s);
    if (rv) return rv;
    int64_t n = 0;
    bool inword = false;
    for (size_t i = 0; i < s->n;) {
        uint32_t c;
        i += tmpl_u8_dec(s->p + i, s->n - i, &c);
        /* \w: letters, digits, underscore; non-ASCII counts as a letter unless it is a space */
        bool w = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 c == '_' || (c >= 0x80 && !tmpl_u_isspace(c));
        n += w && !inword;
        inword = w;
    }
    *out = tv_int(n);
    return 0;
}

static int f_center(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *w = A(x, 0, "width");
    struct tstr *s;
    int rv = tmpl_rt_tostr(rt, in, &s);
    if (rv) return rv;
    int64_t width = w && tv_isint(*w) ? tv_asint(*w) : 80, len = (int64_t)tmpl_u8_len(s->p, s->n);
    if (width > 1 << 20) return tmpl_rt_err(rt, STRATA_ELIMIT, "center: width is too large");
    if (width <= len) {
        *out = tv_s(s);
        return 0;
    }
    int64_t marg = width - len, left = marg / 2 + (marg & width & 1);
    struct tstr *r = tmpl_rt_str(rt, NULL, s->n + (size_t)marg);
    if (!r) return tmpl_rt_oom(rt);
    memset(r->p, ' ', r->n);
    memcpy(r->p + left, s->p, s->n);
    *out = tv_s(r);
    return 0;
}

static int f_format(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    struct tstr *s;
    int rv = tmpl_rt_tostr(rt, in, &s);
    if (rv) return rv;
    if (x->nk) {
        struct tdict *d = tv_newdict(&rt->arena, x->nk);
        if (!d) return tmpl_rt_oom(rt);
        for (size_t k = 0; k < x->nk; k++) {
            struct tstr *key = tmpl_rt_str(rt, x->kn[k], strlen(x->kn[k]));
            if (!key || tv_dict_set(&rt->arena, d, tv_s(key), x->kv[k])) return tmpl_rt_oom(rt);
        }
        return tmpl_str_percent(rt, s, tv_d(d), out);
    }
    struct tlist *l = tv_newlist(&rt->arena, x->n);
    if (!l) return tmpl_rt_oom(rt);
    l->tuple = true;
    for (size_t i = 0; i < x->n; i++)
        l->v[l->n++] = x->a[i];
    return tmpl_str_percent(rt, s, tv_l(l), out);
}

static int f_attr(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    const struct tv *n = A(x, 0, "name");
    if (!n || n->k != TV_STR) return tmpl_rt_err(rt, STRATA_EINVAL, "attr: name must be a string");
    return tmpl_rt_getattr(rt, in, n->u.s->p, n->u.s->n, out);
}

static int f_safe(struct trt *rt, struct tv in, const struct targs *x, struct tv *out)
{
    return f_string(rt, in, x, out);
}

static const struct {
    const char *name;
    filter_fn fn;
} filters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"format", f_format},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
};

static filter_fn find_filter(const char *name)
{
    for (size_t i = 0; i < sizeof filters / sizeof *filters; i++)
        if (!strcmp(filters[i].name, name)) return filters[i].fn;
    return NULL;
}

bool tmpl_filter_exists(const char *name)
{
    return find_filter(name) != NULL;
}

int tmpl_filter(struct trt *rt, const char *name, struct tv in, struct tv *args, size_t nargs,
                const char **kwn, struct tv *kwv, size_t nkw, struct tv *out)
{
    filter_fn fn = find_filter(name);
    struct targs x = {args, nargs, kwn, kwv, nkw};
    if (!fn) return tmpl_rt_err(rt, STRATA_EINVAL, "no filter named '%s'", name);
    return fn(rt, in, &x, out);
}
