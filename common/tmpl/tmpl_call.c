/* tmpl_call — Jinja2's tests (`is defined`, ...), the template globals (range, namespace, dict,
 * raise_exception, strftime_now) and methods called on values: str (tmpl_str.c), dict (items, keys,
 * values, get), list (append, pop, index, count) and loop.cycle. */
#include "common/tmpl/tmpl_int.h"

#include "common/base/err.h"

#include <stdio.h>
#include <string.h>

static const char *const globals[] = {
    [TFN_RANGE] = "range",           [TFN_NAMESPACE] = "namespace",   [TFN_DICT] = "dict",
    [TFN_RAISE] = "raise_exception", [TFN_STRFTIME] = "strftime_now",
};

int tmpl_global(const char *name)
{
    for (size_t i = 0; i < sizeof globals / sizeof *globals; i++)
        if (!strcmp(globals[i], name)) return (int)i;
    return -1;
}

static int range(struct trt *rt, struct tv *args, size_t n, struct tv *out)
{
    int64_t v[3] = {0, 0, 1};
    if (n < 1 || n > 3) return tmpl_rt_err(rt, STRATA_EINVAL, "range expects 1 to 3 arguments");
    for (size_t i = 0; i < n; i++) {
        if (!tv_isint(args[i]))
            return tmpl_rt_err(rt, STRATA_EINVAL, "range: '%s' is not an integer",
                               tv_typename(args[i]));
        v[n == 1 ? 1 : i] = tv_asint(args[i]);
    }
    if (v[2] == 0) return tmpl_rt_err(rt, STRATA_EINVAL, "range: step must not be zero");
    double count = v[2] > 0 ? ((double)v[1] - (double)v[0]) / (double)v[2]
                            : ((double)v[0] - (double)v[1]) / -(double)v[2];
    if (count < 0) count = 0;
    if (count > (double)(rt->t->lim.max_memory / sizeof(struct tv)))
        return tmpl_rt_err(rt, STRATA_ELIMIT, "range of %.0f items is larger than max_memory",
                           count);
    struct tlist *l = tv_newlist(&rt->arena, (size_t)count + 1);
    if (!l) return tmpl_rt_oom(rt);
    for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) {
        l->v[l->n++] = tv_int(i);
        if (__builtin_add_overflow(i, v[2], &i)) break;
        i -= v[2];
    }
    *out = tv_l(l);
    return 0;
}

int tmpl_call_global(struct trt *rt, int fn, struct tv *args, size_t nargs, const char **kwn,
                     struct tv *kwv, size_t nkw, struct tv *out)
{
    switch (fn) {
    case TFN_RANGE:
        return range(rt, args, nargs, out);
    case TFN_NAMESPACE:
    case TFN_DICT: {
        struct tdict *d = tv_newdict(&rt->arena, nkw);
        if (!d) return tmpl_rt_oom(rt);
        d->ns = fn == TFN_NAMESPACE;
        for (size_t i = 0; i < nargs; i++) { /* namespace(d) / dict(d) copy a mapping */
            if (args[i].k != TV_DICT)
                return tmpl_rt_err(rt, STRATA_EINVAL, "%s: positional arguments must be mappings",
                                   globals[fn]);
            for (size_t k = 0; k < args[i].u.d->n; k++)
                if (tv_dict_set(&rt->arena, d, args[i].u.d->k[k], args[i].u.d->v[k]))
                    return tmpl_rt_oom(rt);
        }
        for (size_t k = 0; k < nkw; k++) {
            struct tstr *key = tmpl_rt_str(rt, kwn[k], strlen(kwn[k]));
            if (!key || tv_dict_set(&rt->arena, d, tv_s(key), kwv[k])) return tmpl_rt_oom(rt);
        }
        *out = tv_d(d);
        return 0;
    }
    case TFN_RAISE: {
        struct tstr *msg = NULL;
        int rv = nargs ? tmpl_rt_tostr(rt, args[0], &msg) : 0;
        if (rv) return rv;
        return tmpl_rt_err(rt, STRATA_EINVAL, "raise_exception: %s", msg ? msg->p : "");
    }
    case TFN_STRFTIME: {
        if (nargs != 1 || args[0].k != TV_STR)
            return tmpl_rt_err(rt, STRATA_EINVAL, "strftime_now takes one format string");
        time_t now = rt->t->now == (time_t)-1 ? time(NULL) : rt->t->now;
        struct tm tm;
        char buf[512];
        localtime_r(&now, &tm);
        size_t n = args[0].u.s->n ? strftime(buf, sizeof buf, args[0].u.s->p, &tm) : 0;
        if (args[0].u.s->n && n == 0)
            return tmpl_rt_err(rt, STRATA_EINVAL,
                               "strftime_now: format '%.40s' gives nothing or "
                               "more than %zu bytes",
                               args[0].u.s->p, sizeof buf);
        struct tstr *s = tmpl_rt_str(rt, buf, n);
        if (!s) return tmpl_rt_oom(rt);
        *out = tv_s(s);
        return 0;
    }
    default:
        return tmpl_rt_err(rt, STRATA_EINTERNAL, "global function %d", fn);
    }
}

static int dict_method(struct trt *rt, struct tdict *d, const char *m, struct tv *args,
                       size_t nargs, struct tv *out, bool *found)
{
    *found = true;
    if (!strcmp(m, "get")) {
        if (nargs < 1) return tmpl_rt_err(rt, STRATA_EINVAL, "dict.get needs a key");
        struct tv *v = tv_dict_get(d, args[0]);
        *out = v ? *v : nargs > 1 ? args[1] : tv_none();
        return 0;
    }
    bool items = !strcmp(m, "items"), keys = !strcmp(m, "keys"), values = !strcmp(m, "values");
    if (!items && !keys && !values) {
        *found = false;
        return 0;
    }
    struct tlist *l = tv_newlist(&rt->arena, d->n);
    if (!l) return tmpl_rt_oom(rt);
    for (size_t i = 0; i < d->n; i++) {
        if (!items) {
            l->v[l->n++] = keys ? d->k[i] : d->v[i];
            continue;
        }
        struct tlist *p = tv_newlist(&rt->arena, 2);
        if (!p) return tmpl_rt_oom(rt);
        p->tuple = true;
        p->v[0] = d->k[i];
        p->v[1] = d->v[i];
        p->n = 2;
        l->v[l->n++] = tv_l(p);
    }
    *out = tv_l(l);
    return 0;
}

static int list_method(struct trt *rt, struct tlist *l, const char *m, struct tv *args,
                       size_t nargs, struct tv *out, bool *found)
{
    *found = true;
    if (!strcmp(m, "append") && !l->tuple) {
        if (nargs != 1) return tmpl_rt_err(rt, STRATA_EINVAL, "list.append takes one argument");
        if (tv_list_push(&rt->arena, l, args[0])) return tmpl_rt_oom(rt);
        *out = tv_none();
        return 0;
    }
    if (!strcmp(m, "pop") && !l->tuple) {
        int64_t i = nargs ? (tv_isint(args[0]) ? tv_asint(args[0]) : INT64_MAX) : -1;
        if (i < 0) i += (int64_t)l->n;
        if (i < 0 || i >= (int64_t)l->n)
            return tmpl_rt_err(rt, STRATA_EINVAL, "pop index out of range");
        *out = l->v[i];
        memmove(l->v + i, l->v + i + 1, (l->n - (size_t)i - 1) * sizeof *l->v);
        l->n--;
        return 0;
    }
    if (!strcmp(m, "index") || !strcmp(m, "count")) {
        if (nargs < 1) return tmpl_rt_err(rt, STRATA_EINVAL, "list.%s needs a value", m);
        int64_t cnt = 0;
        for (size_t i = 0; i < l->n; i++) {
            if (!tv_eq(l->v[i], args[0], 0)) continue;
            if (m[0] == 'i') {
                *out = tv_int((int64_t)i);
                return 0;
            }
            cnt++;
        }
        if (m[0] == 'i') return tmpl_rt_err(rt, STRATA_EINVAL, "list.index: value is not in list");
        *out = tv_int(cnt);
        return 0;
    }
    *found = false;
    return 0;
}

int tmpl_method(struct trt *rt, struct tv obj, const char *name, struct tv *args, size_t nargs,
                const char **kwn, struct tv *kwv, size_t nkw, struct tv *out, bool *found)
{
    *found = false;
    switch (obj.k) {
    case TV_STR:
        return tmpl_str_method(rt, obj.u.s, name, args, nargs, kwn, kwv, nkw, out, found);
    case TV_DICT:
        if (obj.u.d->ns) return 0;
        return dict_method(rt, obj.u.d, name, args, nargs, out, found);
    case TV_LIST:
        return list_method(rt, obj.u.l, name, args, nargs, out, found);
    case TV_LOOP:
        if (strcmp(name, "cycle") != 0) return 0;
        *found = true;
        if (!nargs) return tmpl_rt_err(rt, STRATA_EINVAL, "loop.cycle needs at least one value");
        *out = args[obj.u.loop->i % nargs];
        return 0;
    default:
        return 0;
    }
}

/* ---- tests ---- */

static const char *const test_names[] = {
    "defined",  "undefined",   "none",        "string",  "number",   "integer",  "float",
    "boolean",  "true",        "false",       "mapping", "iterable", "sequence", "callable",
    "sameas",   "equalto",     "eq",          "==",      "ne",       "!=",       "lt",
    "<",        "le",          "<=",          "gt",      ">",        "ge",       ">=",
    "lessthan", "greaterthan", "divisibleby", "odd",     "even",     "in",       "lower",
    "upper",    "escaped",
};

bool tmpl_test_exists(const char *name)
{
    for (size_t i = 0; i < sizeof test_names / sizeof *test_names; i++)
        if (!strcmp(test_names[i], name)) return true;
    return false;
}

static bool all_case(const struct tstr *s, bool upper)
{
    bool cased = false;
    for (size_t i = 0; i < s->n; i++) {
        char c = s->p[i];
        if ((upper && c >= 'a' && c <= 'z') || (!upper && c >= 'A' && c <= 'Z')) return false;
        cased |= (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    }
    return cased;
}

int tmpl_test(struct trt *rt, const char *t, struct tv v, struct tv *args, size_t nargs, bool *out)
{
    int c, rv;
    const struct tv *a = nargs ? &args[0] : NULL;
    if (!strcmp(t, "defined"))
        *out = v.k != TV_UNDEF;
    else if (!strcmp(t, "undefined"))
        *out = v.k == TV_UNDEF;
    else if (!strcmp(t, "none"))
        *out = v.k == TV_NONE;
    else if (!strcmp(t, "string"))
        *out = v.k == TV_STR;
    else if (!strcmp(t, "number"))
        *out = tv_isnum(v);
    else if (!strcmp(t, "integer"))
        *out = v.k == TV_INT;
    else if (!strcmp(t, "float"))
        *out = v.k == TV_FLOAT;
    else if (!strcmp(t, "boolean"))
        *out = v.k == TV_BOOL;
    else if (!strcmp(t, "true"))
        *out = v.k == TV_BOOL && v.u.b;
    else if (!strcmp(t, "false"))
        *out = v.k == TV_BOOL && !v.u.b;
    else if (!strcmp(t, "mapping"))
        *out = v.k == TV_DICT && !v.u.d->ns;
    /* Jinja2's Undefined can be iterated and has __len__ and __getitem__ */
    else if (!strcmp(t, "iterable"))
        *out = v.k == TV_STR || v.k == TV_LIST || v.k == TV_UNDEF || v.k == TV_LOOP ||
               (v.k == TV_DICT && !v.u.d->ns);
    else if (!strcmp(t, "sequence"))
        *out = v.k == TV_STR || v.k == TV_LIST || v.k == TV_UNDEF || (v.k == TV_DICT && !v.u.d->ns);
    else if (!strcmp(t, "callable"))
        *out = v.k == TV_MACRO || v.k == TV_FUNC;
    else if (!strcmp(t, "lower"))
        *out = v.k == TV_STR && all_case(v.u.s, false);
    else if (!strcmp(t, "upper"))
        *out = v.k == TV_STR && all_case(v.u.s, true);
    else if (!strcmp(t, "escaped"))
        *out = false;
    else if (!strcmp(t, "odd") || !strcmp(t, "even")) {
        if (!tv_isint(v)) return tmpl_rt_err(rt, STRATA_EINVAL, "%s needs an integer", t);
        *out = (tv_asint(v) % 2 != 0) == (t[0] == 'o');
    } else {
        if (!a) return tmpl_rt_err(rt, STRATA_EINVAL, "test '%s' needs an argument", t);
        if (!strcmp(t, "sameas")) {
            *out = (v.k == TV_LIST || v.k == TV_DICT) ? v.k == a->k && v.u.l == a->u.l
                                                      : v.k == a->k && tv_eq(v, *a, 0);
        } else if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "==")) {
            *out = tv_eq(v, *a, 0);
        } else if (!strcmp(t, "ne") || !strcmp(t, "!=")) {
            *out = !tv_eq(v, *a, 0);
        } else if (!strcmp(t, "in")) {
            if (a->k == TV_STR && v.k == TV_STR)
                *out = memmem(a->u.s->p, a->u.s->n, v.u.s->p, v.u.s->n) != NULL || !v.u.s->n;
            else if (a->k == TV_DICT)
                *out = tv_dict_get(a->u.d, v) != NULL;
            else if (a->k == TV_LIST) {
                *out = false;
                for (size_t i = 0; i < a->u.l->n && !*out; i++)
                    *out = tv_eq(a->u.l->v[i], v, 0);
            } else
                return tmpl_rt_err(rt, STRATA_EINVAL, "'in' test: %s is not a container",
                                   tv_typename(*a));
        } else if (!strcmp(t, "divisibleby")) {
            if (!tv_isint(v) || !tv_isint(*a) || tv_asint(*a) == 0)
                return tmpl_rt_err(rt, STRATA_EINVAL, "divisibleby needs nonzero integers");
            *out = tv_asint(v) % tv_asint(*a) == 0;
        } else if ((rv = tv_cmp(v, *a, &c, 0)) != 0) {
            return tmpl_rt_err(rt, rv, "%s", strata_errdetail());
        } else if (t[0] == 'l' && (t[1] == 't' || t[1] == 'e') && t[2] != 's') {
            *out = t[1] == 't' ? c < 0 : c <= 0;
        } else if (!strcmp(t, "<") || !strcmp(t, "lessthan")) {
            *out = c < 0;
        } else if (!strcmp(t, "<=")) {
            *out = c <= 0;
        } else if (!strcmp(t, "ge") || !strcmp(t, ">=")) {
            *out = c >= 0;
        } else {
            *out = c > 0;
        }
    }
    return 0;
}
