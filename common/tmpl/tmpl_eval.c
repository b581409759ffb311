/* tmpl_eval — expressions: names and scopes, attributes, subscripts and slices, Python's
 * operators, calls, filters and tests, with Jinja2's rules for undefined values (falsy, print "",
 * iterate empty; attribute access, subscripts, arithmetic and calls on them raise). */
#include "common/tmpl/tmpl_int.h"

#include "common/base/err.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tmpl_rt_err(struct trt *rt, int code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return strata_errf(code, "line %d: %s", rt->line, msg);
}

int tmpl_rt_oom(struct trt *rt)
{
    if (rt->arena.used + (1u << 20) < rt->arena.limit) return STRATA_ENOMEM;
    return tmpl_rt_err(rt, STRATA_ELIMIT,
                       "the template needs more than %zu bytes of memory: "
                       "raise max_memory",
                       rt->arena.limit);
}

struct tstr *tmpl_rt_str(struct trt *rt, const char *p, size_t n)
{
    return tv_newstr(&rt->arena, p, n);
}

int tmpl_rt_buf_str(struct trt *rt, struct tbuf *b, int rv, struct tv *out)
{
    if (!rv) {
        struct tstr *s = tmpl_rt_str(rt, b->p ? b->p : "", b->n);
        if (!s)
            rv = tmpl_rt_oom(rt);
        else
            *out = tv_s(s);
    }
    free(b->p);
    return rv;
}

int tmpl_rt_tostr(struct trt *rt, struct tv v, struct tstr **out)
{
    if (v.k == TV_STR) {
        *out = v.u.s;
        return 0;
    }
    struct tbuf b = {.limit = rt->t->lim.max_memory};
    int rv = tv_write(&b, v, 0);
    if (!rv && !(*out = tmpl_rt_str(rt, b.p, b.n))) rv = tmpl_rt_oom(rt);
    free(b.p);
    return rv;
}

int tmpl_rt_undefined(struct trt *rt, struct tv v)
{
    if (v.u.name) return tmpl_rt_err(rt, STRATA_EINVAL, "'%s' is undefined", v.u.name);
    return tmpl_rt_err(rt, STRATA_EINVAL, "a value is undefined");
}

int tmpl_rt_iter(struct trt *rt, struct tv v, struct tlist **out)
{
    struct tlist *l;
    switch (v.k) {
    case TV_UNDEF:
        l = tv_newlist(&rt->arena, 0);
        break;
    case TV_LIST:
        if ((l = tv_newlist(&rt->arena, v.u.l->n)) != NULL) {
            if (v.u.l->n) memcpy(l->v, v.u.l->v, v.u.l->n * sizeof *l->v);
            l->n = v.u.l->n;
        }
        break;
    case TV_DICT:
        if (v.u.d->ns) goto bad;
        if ((l = tv_newlist(&rt->arena, v.u.d->n)) != NULL) {
            if (v.u.d->n) memcpy(l->v, v.u.d->k, v.u.d->n * sizeof *l->v);
            l->n = v.u.d->n;
        }
        break;
    case TV_STR: {
        const struct tstr *s = v.u.s;
        if (!(l = tv_newlist(&rt->arena, tmpl_u8_len(s->p, s->n)))) break;
        for (size_t i = 0; i < s->n;) {
            uint32_t cp;
            size_t k = tmpl_u8_dec(s->p + i, s->n - i, &cp);
            struct tstr *c = tmpl_rt_str(rt, s->p + i, k);
            if (!c) return tmpl_rt_oom(rt);
            l->v[l->n++] = tv_s(c);
            i += k;
        }
        break;
    }
    default:
    bad:
        return tmpl_rt_err(rt, STRATA_EINVAL, "'%s' object is not iterable", tv_typename(v));
    }
    if (!l) return tmpl_rt_oom(rt);
    *out = l;
    return 0;
}

static int loop_attr(struct trt *rt, const struct tloop *lp, const char *name, struct tv *out)
{
    int64_t i = (int64_t)lp->i, n = (int64_t)lp->items->n;
    if (!strcmp(name, "index"))
        *out = tv_int(i + 1);
    else if (!strcmp(name, "index0"))
        *out = tv_int(i);
    else if (!strcmp(name, "revindex"))
        *out = tv_int(n - i);
    else if (!strcmp(name, "revindex0"))
        *out = tv_int(n - i - 1);
    else if (!strcmp(name, "first"))
        *out = tv_bool(i == 0);
    else if (!strcmp(name, "last"))
        *out = tv_bool(i == n - 1);
    else if (!strcmp(name, "length"))
        *out = tv_int(n);
    else if (!strcmp(name, "depth"))
        *out = tv_int(1); /* only recursive loops nest deeper */
    else if (!strcmp(name, "depth0"))
        *out = tv_int(0);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? lp->items->v[i - 1] : tv_undef("there is no previous item");
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < n ? lp->items->v[i + 1] : tv_undef("there is no next item");
    else
        *out = tv_undef(name);
    (void)rt;
    return 0;
}

int tmpl_rt_getattr(struct trt *rt, struct tv v, const char *name, size_t n, struct tv *out)
{
    switch (v.k) {
    case TV_UNDEF:
        return tmpl_rt_undefined(rt, v);
    case TV_DICT: {
        struct tv *x = tv_dict_gets(v.u.d, name, n);
        *out = x ? *x : tv_undef(name);
        return 0;
    }
    case TV_LOOP:
        return loop_attr(rt, v.u.loop, name, out);
    default:
        *out = tv_undef(name);
        return 0;
    }
}

/* ---- expressions ---- */

int tmpl_rt_eval(struct trt *rt, const struct tnode *n, struct tv *out);

struct tv tmpl_rt_lookup(struct trt *rt, const char *name, size_t n)
{
    for (struct tscope *s = rt->sc; s; s = s->parent) {
        struct tv *v = tv_dict_gets(&s->vars, name, n);
        if (v) return *v;
    }
    int fn = tmpl_global(name);
    if (fn >= 0) return (struct tv){.k = TV_FUNC, .u.fn = fn};
    return tv_undef(name);
}

int tmpl_rt_set(struct trt *rt, struct tscope *sc, const char *name, size_t n, struct tv v)
{
    struct tv *slot = tv_dict_gets(&sc->vars, name, n);
    if (slot) {
        *slot = v;
        return 0;
    }
    /* A loop scope emptied for the next iteration still holds last iteration's keys past n:
     * reuse the key when it is the same name, so iterations allocate nothing. */
    struct tdict *d = &sc->vars;
    if (d->n < d->cap && d->k[d->n].k == TV_STR && d->k[d->n].u.s->n == n &&
        memcmp(d->k[d->n].u.s->p, name, n) == 0) {
        d->v[d->n++] = v;
        return 0;
    }
    struct tstr *k = tmpl_rt_str(rt, name, n);
    if (!k || tv_dict_set(&rt->arena, &sc->vars, tv_s(k), v) != 0) return tmpl_rt_oom(rt);
    return 0;
}

/* index_of normalises a Python index into [0, n); false when out of range. */
static bool index_of(int64_t i, size_t n, size_t *out)
{
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

static int item(struct trt *rt, struct tv on, struct tv key, struct tv *out)
{
    size_t i;
    *out = tv_undef(NULL);
    switch (on.k) {
    case TV_UNDEF:
        return tmpl_rt_undefined(rt, on);
    case TV_LIST:
        if (tv_isint(key) && index_of(tv_asint(key), on.u.l->n, &i)) *out = on.u.l->v[i];
        return 0;
    case TV_STR: {
        const struct tstr *s = on.u.s;
        if (tv_isint(key) && index_of(tv_asint(key), tmpl_u8_len(s->p, s->n), &i)) {
            size_t a = tmpl_u8_off(s->p, s->n, i), b = tmpl_u8_off(s->p, s->n, i + 1);
            struct tstr *c = tmpl_rt_str(rt, s->p + a, b - a);
            if (!c) return tmpl_rt_oom(rt);
            *out = tv_s(c);
        }
        return 0;
    }
    case TV_DICT: {
        struct tv *x = tv_dict_get(on.u.d, key);
        if (x)
            *out = *x;
        else if (key.k == TV_STR)
            out->u.name = key.u.s->p;
        return 0;
    }
    case TV_LOOP:
        if (key.k == TV_STR) return loop_attr(rt, on.u.loop, key.u.s->p, out);
        return 0;
    default:
        return 0;
    }
}

/* slice_bounds: Python's slice.indices(len). */
static void slice_bounds(size_t len, const struct tv *st, const struct tv *sp, int64_t step,
                         int64_t *a, int64_t *b)
{
    int64_t n = (int64_t)len;
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? n - 1 : n;
    if (!st) {
        *a = step < 0 ? hi : lo;
    } else {
        *a = tv_asint(*st);
        if (*a < 0)
            *a = *a + n < lo ? lo : *a + n;
        else if (*a > hi)
            *a = hi;
    }
    if (!sp) {
        *b = step < 0 ? lo : hi;
    } else {
        *b = tv_asint(*sp);
        if (*b < 0)
            *b = *b + n < lo ? lo : *b + n;
        else if (*b > hi)
            *b = hi;
    }
}

static int slice(struct trt *rt, const struct tnode *n, struct tv *out)
{
    struct tv on, parts[3];
    const struct tnode *pn[3] = {n->b, n->c, n->d};
    int rv;
    if ((rv = tmpl_rt_eval(rt, n->a, &on)) != 0) return rv;
    for (int k = 0; k < 3; k++) {
        if (!pn[k]) continue;
        if ((rv = tmpl_rt_eval(rt, pn[k], &parts[k])) != 0) return rv;
        if (parts[k].k == TV_NONE)
            pn[k] = NULL;
        else if (!tv_isint(parts[k]))
            return tmpl_rt_err(rt, STRATA_EINVAL, "slice indices must be integers or None, not %s",
                               tv_typename(parts[k]));
    }
    int64_t step = pn[2] ? tv_asint(parts[2]) : 1, a, b;
    if (step == 0) return tmpl_rt_err(rt, STRATA_EINVAL, "slice step cannot be zero");
    if (on.k == TV_UNDEF) return tmpl_rt_undefined(rt, on);
    if (on.k != TV_LIST && on.k != TV_STR) {
        *out = tv_undef(NULL);
        return 0;
    }
    bool str = on.k == TV_STR;
    size_t len = str ? tmpl_u8_len(on.u.s->p, on.u.s->n) : on.u.l->n;
    slice_bounds(len, pn[0] ? &parts[0] : NULL, pn[1] ? &parts[1] : NULL, step, &a, &b);
    struct tbuf sb = {.limit = rt->t->lim.max_memory};
    struct tlist *l = str ? NULL : tv_newlist(&rt->arena, 0);
    if (!str && !l) return tmpl_rt_oom(rt);
    if (!str) l->tuple = on.u.l->tuple;
    for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
        if (str) {
            size_t o = tmpl_u8_off(on.u.s->p, on.u.s->n, (size_t)i);
            size_t e = tmpl_u8_off(on.u.s->p, on.u.s->n, (size_t)i + 1);
            rv = tbuf_add(&sb, on.u.s->p + o, e - o);
            /* a forward run of step 1 is one copy, not n scans */
            if (!rv && step == 1) {
                size_t end = tmpl_u8_off(on.u.s->p, on.u.s->n, (size_t)b);
                rv = tbuf_add(&sb, on.u.s->p + e, end - e);
                i = b;
            }
        } else {
            rv = tv_list_push(&rt->arena, l, on.u.l->v[i]) ? tmpl_rt_oom(rt) : 0;
        }
        if (rv) break;
    }
    if (!rv && str) {
        struct tstr *s = tmpl_rt_str(rt, sb.p ? sb.p : "", sb.n);
        if (!s)
            rv = tmpl_rt_oom(rt);
        else
            *out = tv_s(s);
    } else if (!rv) {
        *out = tv_l(l);
    }
    free(sb.p);
    return rv;
}

static int type_err(struct trt *rt, const char *op, struct tv a, struct tv b)
{
    if (a.k == TV_UNDEF) return tmpl_rt_undefined(rt, a);
    if (b.k == TV_UNDEF) return tmpl_rt_undefined(rt, b);
    return tmpl_rt_err(rt, STRATA_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                       tv_typename(a), tv_typename(b));
}

static int repeat(struct trt *rt, struct tv seq, int64_t times, struct tv *out)
{
    if (times < 0) times = 0;
    if (seq.k == TV_STR) {
        size_t n = seq.u.s->n;
        if (n && (uint64_t)times > rt->t->lim.max_memory / n)
            return tmpl_rt_err(rt, STRATA_ELIMIT,
                               "a string repeated %" PRId64 " times is larger "
                               "than max_memory",
                               times);
        struct tstr *s = tmpl_rt_str(rt, NULL, n * (size_t)times);
        if (!s) return tmpl_rt_oom(rt);
        for (int64_t i = 0; i < times; i++)
            memcpy(s->p + (size_t)i * n, seq.u.s->p, n);
        *out = tv_s(s);
        return 0;
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)times > rt->t->lim.max_memory / n / sizeof(struct tv))
        return tmpl_rt_err(rt, STRATA_ELIMIT,
                           "a list repeated %" PRId64 " times is larger than "
                           "max_memory",
                           times);
    struct tlist *l = tv_newlist(&rt->arena, n * (size_t)times);
    if (!l) return tmpl_rt_oom(rt);
    for (int64_t i = 0; i < times; i++)
        memcpy(l->v + (size_t)i * n, seq.u.l->v, n * sizeof *l->v);
    l->n = n * (size_t)times;
    l->tuple = seq.u.l->tuple;
    *out = tv_l(l);
    return 0;
}

static int arith(struct trt *rt, int op, struct tv a, struct tv b, struct tv *out)
{
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (op == B_ADD && a.k == TV_STR && b.k == TV_STR) {
        struct tstr *s = tmpl_rt_str(rt, NULL, a.u.s->n + b.u.s->n);
        if (!s) return tmpl_rt_oom(rt);
        memcpy(s->p, a.u.s->p, a.u.s->n);
        memcpy(s->p + a.u.s->n, b.u.s->p, b.u.s->n);
        *out = tv_s(s);
        return 0;
    }
    if (op == B_ADD && a.k == TV_LIST && b.k == TV_LIST && a.u.l->tuple == b.u.l->tuple) {
        struct tlist *l = tv_newlist(&rt->arena, a.u.l->n + b.u.l->n);
        if (!l) return tmpl_rt_oom(rt);
        if (a.u.l->n) memcpy(l->v, a.u.l->v, a.u.l->n * sizeof *l->v);
        if (b.u.l->n) memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof *l->v);
        l->n = a.u.l->n + b.u.l->n;
        l->tuple = a.u.l->tuple;
        *out = tv_l(l);
        return 0;
    }
    if (op == B_MUL && (a.k == TV_STR || a.k == TV_LIST) && tv_isint(b))
        return repeat(rt, a, tv_asint(b), out);
    if (op == B_MUL && (b.k == TV_STR || b.k == TV_LIST) && tv_isint(a))
        return repeat(rt, b, tv_asint(a), out);
    if (op == B_MOD && a.k == TV_STR) return tmpl_str_percent(rt, a.u.s, b, out);
    if (!tv_isnum(a) || !tv_isnum(b)) return type_err(rt, names[op], a, b);
    if (tv_isint(a) && tv_isint(b) && op != B_DIV) {
        int64_t x = tv_asint(a), y = tv_asint(b), r = 0;
        bool ovf = false;
        switch (op) {
        case B_ADD:
            ovf = __builtin_add_overflow(x, y, &r);
            break;
        case B_SUB:
            ovf = __builtin_sub_overflow(x, y, &r);
            break;
        case B_MUL:
            ovf = __builtin_mul_overflow(x, y, &r);
            break;
        case B_FDIV:
        case B_MOD:
            if (y == 0) return tmpl_rt_err(rt, STRATA_EINVAL, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) {
                ovf = op == B_FDIV;
                break;
            }
            r = op == B_FDIV ? x / y - ((x % y != 0) && ((x < 0) != (y < 0))) : ((x % y) + y) % y;
            break;
        case B_POW:
            if (y < 0) {
                *out = tv_float(pow((double)x, (double)y));
                return 0;
            }
            r = 1;
            for (int64_t k = 0; k < y && !ovf; k++) {
                ovf = __builtin_mul_overflow(r, x, &r);
                if (r == 0 || r == 1) break;
                if (r == -1) {
                    r = (y % 2) ? -1 : 1;
                    break;
                }
            }
            break;
        }
        if (ovf)
            return tmpl_rt_err(rt, STRATA_EOVERFLOW, "integer %s overflows 64 bits", names[op]);
        *out = tv_int(r);
        return 0;
    }
    double x = tv_asdbl(a), y = tv_asdbl(b), r;
    switch (op) {
    case B_ADD:
        r = x + y;
        break;
    case B_SUB:
        r = x - y;
        break;
    case B_MUL:
        r = x * y;
        break;
    case B_POW:
        r = pow(x, y);
        break;
    default:
        if (y == 0) return tmpl_rt_err(rt, STRATA_EINVAL, "float division by zero");
        if (op == B_DIV)
            r = x / y;
        else if (op == B_FDIV)
            r = floor(x / y);
        else {
            r = fmod(x, y);
            if (r != 0 && ((r < 0) != (y < 0))) r += y;
        }
    }
    *out = tv_float(r);
    return 0;
}

static int contains(struct trt *rt, struct tv hay, struct tv needle, bool *out)
{
    switch (hay.k) {
    case TV_UNDEF:
        *out = false;
        return 0;
    case TV_STR:
        if (needle.k != TV_STR)
            return tmpl_rt_err(rt, STRATA_EINVAL,
                               "'in <string>' requires string as left operand, "
                               "not %s",
                               tv_typename(needle));
        *out = needle.u.s->n == 0 ||
               memmem(hay.u.s->p, hay.u.s->n, needle.u.s->p, needle.u.s->n) != NULL;
        return 0;
    case TV_LIST:
        *out = false;
        for (size_t i = 0; i < hay.u.l->n && !*out; i++)
            *out = tv_eq(hay.u.l->v[i], needle, 0);
        return 0;
    case TV_DICT:
        if (hay.u.d->ns) break;
        *out = tv_dict_get(hay.u.d, needle) != NULL;
        return 0;
    default:
        break;
    }
    return tmpl_rt_err(rt, STRATA_EINVAL, "argument of type '%s' is not iterable",
                       tv_typename(hay));
}

static int compare1(struct trt *rt, int op, struct tv a, struct tv b, bool *r)
{
    int c, rv;
    switch (op) {
    case C_EQ:
        *r = tv_eq(a, b, 0);
        return 0;
    case C_NE:
        *r = !tv_eq(a, b, 0);
        return 0;
    case C_IN:
        return contains(rt, b, a, r);
    case C_NOTIN:
        if ((rv = contains(rt, b, a, r)) != 0) return rv;
        *r = !*r;
        return 0;
    default:
        if (a.k == TV_UNDEF || b.k == TV_UNDEF) return type_err(rt, "<", a, b);
        if ((rv = tv_cmp(a, b, &c, 0)) != 0) return tmpl_rt_err(rt, rv, "%s", strata_errdetail());
        *r = op == C_LT ? c < 0 : op == C_LE ? c <= 0 : op == C_GT ? c > 0 : c >= 0;
        return 0;
    }
}

/* eval_args evaluates a call's positional (n->v) and keyword (n->w) arguments. */
static int eval_args(struct trt *rt, const struct tnode *n, struct tv **args, struct tv **kwv)
{
    int rv;
    *args = *kwv = NULL;
    if (n->n && !(*args = tmpl_arena_alloc(&rt->arena, n->n * sizeof **args)))
        return tmpl_rt_oom(rt);
    if (n->m && !(*kwv = tmpl_arena_alloc(&rt->arena, n->m * sizeof **kwv))) return tmpl_rt_oom(rt);
    for (size_t i = 0; i < n->n; i++)
        if ((rv = tmpl_rt_eval(rt, n->v[i], &(*args)[i])) != 0) return rv;
    for (size_t i = 0; i < n->m; i++)
        if ((rv = tmpl_rt_eval(rt, n->w[i], &(*kwv)[i])) != 0) return rv;
    return 0;
}

static int call_value(struct trt *rt, struct tv f, struct tv *args, size_t n, const char **kwn,
                      struct tv *kwv, size_t m, struct tv *out)
{
    if (f.k == TV_MACRO) return tmpl_rt_call_macro(rt, f.u.m, args, n, kwn, kwv, m, out);
    if (f.k == TV_FUNC) return tmpl_call_global(rt, f.u.fn, args, n, kwn, kwv, m, out);
    if (f.k == TV_UNDEF) return tmpl_rt_undefined(rt, f);
    return tmpl_rt_err(rt, STRATA_EINVAL, "'%s' object is not callable", tv_typename(f));
}

static int call(struct trt *rt, const struct tnode *n, struct tv *out)
{
    struct tv *args, *kwv, f;
    int rv;
    if (n->a->kind == E_ATTR) {
        struct tv obj;
        bool found;
        if ((rv = tmpl_rt_eval(rt, n->a->a, &obj)) != 0) return rv;
        if (obj.k == TV_UNDEF) return tmpl_rt_undefined(rt, obj);
        if ((rv = eval_args(rt, n, &args, &kwv)) != 0) return rv;
        rt->line = n->line;
        rv = tmpl_method(rt, obj, n->a->s, args, n->n, n->names, kwv, n->m, out, &found);
        if (rv || found) return rv;
        if ((rv = tmpl_rt_getattr(rt, obj, n->a->s, n->a->slen, &f)) != 0) return rv;
        if (f.k == TV_UNDEF)
            return tmpl_rt_err(rt, STRATA_EINVAL, "'%s object' has no attribute '%s'",
                               tv_typename(obj), n->a->s);
        return call_value(rt, f, args, n->n, n->names, kwv, n->m, out);
    }
    if ((rv = tmpl_rt_eval(rt, n->a, &f)) != 0) return rv;
    if ((rv = eval_args(rt, n, &args, &kwv)) != 0) return rv;
    rt->line = n->line;
    return call_value(rt, f, args, n->n, n->names, kwv, n->m, out);
}

/* filter applies E_FILTER n; in a filter chain (block filter, set | f) the innermost input is *in.
 */
int tmpl_rt_filter(struct trt *rt, const struct tnode *n, const struct tv *in, struct tv *out)
{
    struct tv v, *args, *kwv;
    int rv = 0;
    if (!n->a)
        v = *in;
    else if (in)
        rv = tmpl_rt_filter(rt, n->a, in, &v);
    else
        rv = tmpl_rt_eval(rt, n->a, &v);
    if (rv) return rv;
    if ((rv = eval_args(rt, n, &args, &kwv)) != 0) return rv;
    rt->line = n->line;
    if (n->flag) return tmpl_rt_err(rt, STRATA_EINVAL, "no filter named '%s'", n->s);
    return tmpl_filter(rt, n->s, v, args, n->n, n->names, kwv, n->m, out);
}

int tmpl_rt_eval(struct trt *rt, const struct tnode *n, struct tv *out)
{
    struct tv a, b;
    int rv;
    bool r;
    rt->line = n->line;
    switch (n->kind) {
    case E_CONST:
        *out = n->val;
        return 0;
    case E_NAME:
        *out = tmpl_rt_lookup(rt, n->s, n->slen);
        return 0;
    case E_LIST:
    case E_TUPLE: {
        struct tlist *l = tv_newlist(&rt->arena, n->n);
        if (!l) return tmpl_rt_oom(rt);
        l->tuple = n->kind == E_TUPLE;
        for (size_t i = 0; i < n->n; i++)
            if ((rv = tmpl_rt_eval(rt, n->v[i], &l->v[l->n++])) != 0) return rv;
        *out = tv_l(l);
        return 0;
    }
    case E_DICT: {
        struct tdict *d = tv_newdict(&rt->arena, n->n);
        if (!d) return tmpl_rt_oom(rt);
        for (size_t i = 0; i < n->n; i++) {
            if ((rv = tmpl_rt_eval(rt, n->v[i], &a)) != 0 ||
                (rv = tmpl_rt_eval(rt, n->w[i], &b)) != 0)
                return rv;
            if (tv_dict_set(&rt->arena, d, a, b) != 0) return tmpl_rt_oom(rt);
        }
        *out = tv_d(d);
        return 0;
    }
    case E_ATTR:
        if ((rv = tmpl_rt_eval(rt, n->a, &a)) != 0) return rv;
        return tmpl_rt_getattr(rt, a, n->s, n->slen, out);
    case E_ITEM:
        if ((rv = tmpl_rt_eval(rt, n->a, &a)) != 0 || (rv = tmpl_rt_eval(rt, n->b, &b)) != 0)
            return rv;
        return item(rt, a, b, out);
    case E_SLICE:
        return slice(rt, n, out);
    case E_CALL:
        return call(rt, n, out);
    case E_FILTER:
        return tmpl_rt_filter(rt, n, NULL, out);
    case E_TEST: {
        struct tv *args, *kwv;
        if ((rv = tmpl_rt_eval(rt, n->a, &a)) != 0 || (rv = eval_args(rt, n, &args, &kwv)) != 0)
            return rv;
        rt->line = n->line;
        if (n->flag) return tmpl_rt_err(rt, STRATA_EINVAL, "no test named '%s'", n->s);
        if ((rv = tmpl_test(rt, n->s, a, args, n->n, &r)) != 0) return rv;
        *out = tv_bool(n->op ? !r : r);
        return 0;
    }
    case E_NEG:
    case E_POS:
        if ((rv = tmpl_rt_eval(rt, n->a, &a)) != 0) return rv;
        if (!tv_isnum(a))
            return a.k == TV_UNDEF ? tmpl_rt_undefined(rt, a)
                                   : tmpl_rt_err(rt, STRATA_EINVAL,
                                                 "bad operand type for unary "
                                                 "%c: '%s'",
                                                 n->kind == E_NEG ? '-' : '+', tv_typename(a));
        if (n->kind == E_POS)
            *out = tv_isint(a) ? tv_int(tv_asint(a)) : a;
        else if (a.k == TV_FLOAT)
            *out = tv_float(-a.u.f);
        else if (tv_asint(a) == INT64_MIN)
            return tmpl_rt_err(rt, STRATA_EOVERFLOW, "integer negation overflows 64 bits");
        else
            *out = tv_int(-tv_asint(a));
        return 0;
    case E_NOT:
        if ((rv = tmpl_rt_eval(rt, n->a, &a)) != 0) return rv;
        *out = tv_bool(!tv_truthy(a));
        return 0;
    case E_BIN:
        if ((rv = tmpl_rt_eval(rt, n->a, &a)) != 0) return rv;
        if (n->op == B_AND && !tv_truthy(a)) {
            *out = a;
            return 0;
        }
        if (n->op == B_OR && tv_truthy(a)) {
            *out = a;
            return 0;
        }
        if ((rv = tmpl_rt_eval(rt, n->b, &b)) != 0) return rv;
        rt->line = n->line;
        if (n->op == B_AND || n->op == B_OR) {
            *out = b;
            return 0;
        }
        if (n->op == B_CAT) {
            struct tstr *x, *y, *s;
            if ((rv = tmpl_rt_tostr(rt, a, &x)) != 0 || (rv = tmpl_rt_tostr(rt, b, &y)) != 0)
                return rv;
            if (!(s = tmpl_rt_str(rt, NULL, x->n + y->n))) return tmpl_rt_oom(rt);
            memcpy(s->p, x->p, x->n);
            memcpy(s->p + x->n, y->p, y->n);
            *out = tv_s(s);
            return 0;
        }
        return arith(rt, n->op, a, b, out);
    case E_CMP:
        if ((rv = tmpl_rt_eval(rt, n->v[0], &a)) != 0) return rv;
        for (size_t i = 1; i < n->n; i++) {
            if ((rv = tmpl_rt_eval(rt, n->v[i], &b)) != 0) return rv;
            rt->line = n->line;
            if ((rv = compare1(rt, n->ops[i - 1], a, b, &r)) != 0) return rv;
            if (!r) break;
            a = b;
        }
        *out = tv_bool(r);
        return 0;
    case E_COND:
        if ((rv = tmpl_rt_eval(rt, n->b, &a)) != 0) return rv;
        if (tv_truthy(a)) return tmpl_rt_eval(rt, n->a, out);
        if (n->c) return tmpl_rt_eval(rt, n->c, out);
        *out = tv_undef(NULL);
        return 0;
    default:
        return tmpl_rt_err(rt, STRATA_EINTERNAL, "node kind %d is not an expression", n->kind);
    }
}
