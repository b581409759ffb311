/* tmpl_run — compiles templates and renders them: statements, loops, macro calls, output
 * capture, and the step, depth, output and memory limits. */
#include "common/tmpl/tmpl_int.h"

#include "common/base/err.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tmpl_limits_default(struct tmpl_limits *l)
{
    *l = (struct tmpl_limits){
        .max_source = 1u << 20,
        .max_parse_depth = 100,
        .max_steps = 1000000,
        .max_call_depth = 64,
        .max_output = 4u << 20,
        .max_memory = 64u << 20,
    };
}

int tmpl_compile(const char *src, size_t len, const struct tmpl_limits *lim, struct tmpl **out)
{
    struct ttoken *tok = NULL;
    size_t ntok;
    int rv;
    struct tmpl *t = calloc(1, sizeof *t);
    if (!t) return STRATA_ENOMEM;
    if (lim)
        t->lim = *lim;
    else
        tmpl_limits_default(&t->lim);
    t->now = (time_t)-1;
    if (len > t->lim.max_source) {
        rv = strata_errf(STRATA_ELIMIT,
                         "template is %zu bytes, the limit is %zu: raise "
                         "max_source",
                         len, t->lim.max_source);
        goto fail;
    }
    /* every byte of source yields at most a few tokens and nodes */
    t->arena.limit = 64 * len + (1u << 20);
    if ((rv = tmpl_lex(&t->arena, src, len, len + 16, &tok, &ntok)) != 0) goto fail;
    if ((rv = tmpl_parse(t, tok, ntok)) != 0) goto fail;
    free(tok);
    *out = t;
    return 0;
fail:
    free(tok);
    tmpl_fini(t);
    return rv;
}

void tmpl_set_now(struct tmpl *t, time_t now)
{
    t->now = now;
}

void tmpl_fini(struct tmpl *t)
{
    if (!t) return;
    tmpl_arena_free(&t->arena);
    free(t);
}

/* ---- statements ---- */

static int run(struct trt *rt, struct tnode *const *v, size_t n);

static int write_out(struct trt *rt, struct tv v)
{
    if (v.k == TV_STR) return tbuf_add(rt->out, v.u.s->p, v.u.s->n);
    return tv_write(rt->out, v, 0);
}

static int assign(struct trt *rt, const struct tnode *target, struct tv v)
{
    int rv;
    if (target->kind == E_NAME) return tmpl_rt_set(rt, rt->sc, target->s, target->slen, v);
    if (target->kind == E_ATTR) {
        struct tv ns = tmpl_rt_lookup(rt, target->a->s, target->a->slen);
        if (ns.k != TV_DICT || !ns.u.d->ns)
            return tmpl_rt_err(rt, STRATA_EINVAL,
                               "cannot assign attribute on non-namespace "
                               "object '%s'",
                               target->a->s);
        struct tstr *k = tmpl_rt_str(rt, target->s, target->slen);
        if (!k || tv_dict_set(&rt->arena, ns.u.d, tv_s(k), v) != 0) return tmpl_rt_oom(rt);
        return 0;
    }
    struct tlist *l;
    if (v.k == TV_UNDEF) return tmpl_rt_undefined(rt, v);
    if ((rv = tmpl_rt_iter(rt, v, &l)) != 0) return rv;
    if (l->n != target->n)
        return tmpl_rt_err(rt, STRATA_EINVAL, "cannot unpack %zu values into %zu names", l->n,
                           target->n);
    for (size_t i = 0; i < l->n; i++)
        if ((rv = assign(rt, target->v[i], l->v[i])) != 0) return rv;
    return 0;
}

/* capture runs a body with its output going to a fresh buffer; returns it as a string. */
static int capture(struct trt *rt, struct tnode *const *v, size_t n, struct tv *out)
{
    struct tbuf b = {.limit = rt->t->lim.max_output}, *saved = rt->out;
    rt->out = &b;
    int rv = run(rt, v, n);
    rt->out = saved;
    return tmpl_rt_buf_str(rt, &b, rv, out);
}

static int step(struct trt *rt)
{
    if (++rt->steps > rt->t->lim.max_steps)
        return tmpl_rt_err(rt, STRATA_ELIMIT,
                           "the template ran more than %" PRIu64 " steps "
                           "(loop iterations, macro calls, statements): raise max_steps",
                           rt->t->lim.max_steps);
    return 0;
}

static struct tscope *push_scope(struct trt *rt, struct tscope *parent)
{
    struct tscope *s = tmpl_arena_alloc(&rt->arena, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

static int run_for(struct trt *rt, const struct tnode *n)
{
    struct tv it;
    struct tlist *items;
    int rv;
    if ((rv = tmpl_rt_eval(rt, n->b, &it)) != 0 || (rv = tmpl_rt_iter(rt, it, &items)) != 0)
        return rv;
    struct tscope *outer = rt->sc, *inner = push_scope(rt, outer);
    if (!inner) return tmpl_rt_oom(rt);
    /* Each iteration starts with no variables of its own (Jinja2 forgets an iteration's sets);
     * the one scope is emptied rather than reallocated, so long loops need no memory. */
    rt->sc = inner;
    if (n->c) { /* for x in xs if cond: filter first, so loop.length counts what is run */
        size_t k = 0;
        for (size_t i = 0; i < items->n; i++) {
            struct tv keep;
            if ((rv = step(rt)) != 0) goto out;
            inner->vars.n = 0;
            if ((rv = assign(rt, n->a, items->v[i])) != 0 ||
                (rv = tmpl_rt_eval(rt, n->c, &keep)) != 0)
                goto out;
            if (tv_truthy(keep)) items->v[k++] = items->v[i];
        }
        items->n = k;
    }
    struct tloop *lp = tmpl_arena_alloc(&rt->arena, sizeof *lp);
    if (!lp) {
        rv = tmpl_rt_oom(rt);
        goto out;
    }
    lp->items = items;
    for (lp->i = 0; lp->i < items->n; lp->i++) {
        if ((rv = step(rt)) != 0) goto out;
        inner->vars.n = 0;
        if ((rv = assign(rt, n->a, items->v[lp->i])) != 0) goto out;
        if ((rv = tmpl_rt_set(rt, rt->sc, "loop", 4, (struct tv){.k = TV_LOOP, .u.loop = lp})) != 0)
            goto out;
        if ((rv = run(rt, n->v, n->n)) != 0) goto out;
        int flow = rt->flow;
        rt->flow = FLOW_NONE;
        if (flow == FLOW_BREAK) break;
    }
    if (items->n == 0 && n->m) {
        inner->vars.n = 0;
        rv = run(rt, n->w, n->m);
    }
out:
    rt->sc = outer;
    return rv;
}

int tmpl_rt_call_macro(struct trt *rt, struct tmacro *m, struct tv *args, size_t nargs,
                       const char **kwn, struct tv *kwv, size_t nkw, struct tv *out)
{
    const struct tnode *def = m->def;
    struct tscope *saved = rt->sc;
    int rv;
    if (rt->depth >= rt->t->lim.max_call_depth)
        return tmpl_rt_err(rt, STRATA_ELIMIT,
                           "macro '%s' nests calls deeper than %d: a runaway "
                           "recursion, or raise max_call_depth",
                           def->s, rt->t->lim.max_call_depth);
    if ((rv = step(rt)) != 0) return rv;
    struct tscope *sc = push_scope(rt, m->env);
    struct tlist *varargs = tv_newlist(&rt->arena, 0);
    struct tdict *kwargs = tv_newdict(&rt->arena, 0);
    if (!sc || !varargs || !kwargs) return tmpl_rt_oom(rt);
    varargs->tuple = true;
    rt->sc = sc;
    rt->depth++;
    for (size_t p = 0; p < def->m; p++) {
        struct tv v = tv_undef(def->names[p]);
        bool have = p < nargs;
        if (have) v = args[p];
        for (size_t k = 0; k < nkw; k++)
            if (!strcmp(kwn[k], def->names[p])) {
                if (have) {
                    rv = tmpl_rt_err(rt, STRATA_EINVAL,
                                     "macro '%s' got multiple values for "
                                     "argument '%s'",
                                     def->s, def->names[p]);
                    goto out;
                }
                v = kwv[k];
                have = true;
            }
        if (!have && def->w[p] && (rv = tmpl_rt_eval(rt, def->w[p], &v)) != 0) goto out;
        if ((rv = tmpl_rt_set(rt, sc, def->names[p], strlen(def->names[p]), v)) != 0) goto out;
    }
    for (size_t i = def->m; i < nargs; i++)
        if (tv_list_push(&rt->arena, varargs, args[i]) != 0) {
            rv = tmpl_rt_oom(rt);
            goto out;
        }
    for (size_t k = 0; k < nkw; k++) {
        bool param = false;
        for (size_t p = 0; p < def->m; p++)
            param |= !strcmp(kwn[k], def->names[p]);
        struct tstr *key = tmpl_rt_str(rt, kwn[k], strlen(kwn[k]));
        if (!key || (!param && tv_dict_set(&rt->arena, kwargs, tv_s(key), kwv[k]) != 0)) {
            rv = tmpl_rt_oom(rt);
            goto out;
        }
    }
    if ((rv = tmpl_rt_set(rt, sc, "varargs", 7, tv_l(varargs))) != 0 ||
        (rv = tmpl_rt_set(rt, sc, "kwargs", 6, tv_d(kwargs))) != 0)
        goto out;
    rv = capture(rt, def->v, def->n, out);
out:
    rt->depth--;
    rt->sc = saved;
    return rv;
}

static int run1(struct trt *rt, const struct tnode *n)
{
    struct tv v;
    int rv;
    rt->line = n->line;
    switch (n->kind) {
    case S_TEXT:
        return tbuf_add(rt->out, n->s, n->slen);
    case S_OUT:
        if ((rv = tmpl_rt_eval(rt, n->a, &v)) != 0) return rv;
        return write_out(rt, v);
    case S_IF:
        if ((rv = tmpl_rt_eval(rt, n->a, &v)) != 0) return rv;
        return tv_truthy(v) ? run(rt, n->v, n->n) : run(rt, n->w, n->m);
    case S_FOR:
        return run_for(rt, n);
    case S_SET:
        if ((rv = tmpl_rt_eval(rt, n->b, &v)) != 0) return rv;
        rt->line = n->line;
        return assign(rt, n->a, v);
    case S_SETBLOCK:
        if ((rv = capture(rt, n->v, n->n, &v)) != 0) return rv;
        if (n->c) {
            struct tv in = v;
            if ((rv = tmpl_rt_filter(rt, n->c, &in, &v)) != 0) return rv;
        }
        return assign(rt, n->a, v);
    case S_FILTERBLOCK: {
        struct tv in;
        if ((rv = capture(rt, n->v, n->n, &in)) != 0) return rv;
        if ((rv = tmpl_rt_filter(rt, n->a, &in, &v)) != 0) return rv;
        return write_out(rt, v);
    }
    case S_MACRO: {
        struct tmacro *m = tmpl_arena_alloc(&rt->arena, sizeof *m);
        if (!m) return tmpl_rt_oom(rt);
        m->def = n;
        m->env = rt->sc;
        return tmpl_rt_set(rt, rt->sc, n->s, strlen(n->s), (struct tv){.k = TV_MACRO, .u.m = m});
    }
    case S_BREAK:
        rt->flow = FLOW_BREAK;
        return 0;
    case S_CONTINUE:
        rt->flow = FLOW_CONTINUE;
        return 0;
    default:
        return tmpl_rt_err(rt, STRATA_EINTERNAL, "node kind %d is not a statement", n->kind);
    }
}

static int run(struct trt *rt, struct tnode *const *v, size_t n)
{
    int rv;
    for (size_t i = 0; i < n && rt->flow == FLOW_NONE; i++)
        if ((rv = step(rt)) != 0 || (rv = run1(rt, v[i])) != 0) return rv;
    return 0;
}

int tmpl_render_json(const struct tmpl *t, const json_t *vars, char **out, size_t *len)
{
    struct tbuf b = {.limit = t->lim.max_output};
    struct trt rt = {.t = t, .out = &b, .line = 1};
    int rv;
    rt.arena.limit = t->lim.max_memory;
    if (!json_is_object(vars)) {
        rv = strata_errf(STRATA_EINVAL, "template variables must be a JSON object");
        goto fail;
    }
    if (!(rt.root = push_scope(&rt, NULL))) {
        rv = tmpl_rt_oom(&rt);
        goto fail;
    }
    rt.sc = rt.root;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vars, key, val)
    {
        struct tv v;
        if (tv_from_json(&rt.arena, val, &v) != 0) {
            rv = tmpl_rt_oom(&rt);
            goto fail;
        }
        if ((rv = tmpl_rt_set(&rt, rt.root, key, strlen(key), v)) != 0) goto fail;
    }
    if ((rv = run(&rt, t->body, t->n)) != 0) goto fail;
    if (!b.p && (rv = tbuf_add(&b, "", 0)) != 0) goto fail;
    tmpl_arena_free(&rt.arena);
    *out = b.p;
    *len = b.n;
    return 0;
fail:
    if (strncmp(strata_errdetail(), "line ", 5) != 0) {
        char d[512];
        snprintf(d, sizeof d, "%s",
                 strata_errdetail()[0] ? strata_errdetail() : strata_strerror(rv));
        strata_errf(rv, "line %d: %s", rt.line, d);
    }
    tmpl_arena_free(&rt.arena);
    free(b.p);
    return rv;
}
