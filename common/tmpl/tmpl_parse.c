/* tmpl_parse — builds the syntax tree from tokens, with Jinja2's grammar and precedence:
 * ternary < or < and < not < comparison < + - < ~ < * / // % < ** < unary minus < filters and tests
 * < postfix (attribute, subscript, call). Unknown filters and tests are compile errors unless
 * inside an `if`, where Jinja2 defers them to run time. */
#include "common/tmpl/tmpl_int.h"

#include "common/base/err.h"

#include <stdio.h>
#include <string.h>

struct ps {
    struct tmpl *t;
    struct tmpl_arena *a;
    const struct ttoken *tk;
    size_t i, n;
    int depth;
    int loops; /* for-loops around the current statement (break/continue are legal) */
    bool soft; /* inside an if: unknown filters and tests fail only when run */
};

static const struct ttoken *cur(struct ps *p)
{
    return &p->tk[p->i];
}

static const struct ttoken *peek(struct ps *p, size_t k)
{
    return &p->tk[p->i + k < p->n ? p->i + k : p->n - 1];
}

static bool tok_is(const struct ttoken *t, enum ttok type, const char *s)
{
    return t->t == type && (!s || (t->n == strlen(s) && memcmp(t->s, s, t->n) == 0));
}

static bool is_op(struct ps *p, const char *s)
{
    return tok_is(cur(p), TK_OP, s);
}

static bool is_name(struct ps *p, const char *s)
{
    return tok_is(cur(p), TK_NAME, s);
}

static bool accept_op(struct ps *p, const char *s)
{
    if (!is_op(p, s)) return false;
    p->i++;
    return true;
}

static bool accept_name(struct ps *p, const char *s)
{
    if (!is_name(p, s)) return false;
    p->i++;
    return true;
}

static const char *tok_desc(const struct ttoken *t, char *buf, size_t n)
{
    switch (t->t) {
    case TK_EOF:
        return "end of template";
    case TK_TEXT:
        return "template text";
    case TK_VAR_BEGIN:
        return "'{{'";
    case TK_VAR_END:
        return "'}}'";
    case TK_BLOCK_BEGIN:
        return "'{%'";
    case TK_BLOCK_END:
        return "'%}'";
    case TK_STRING:
        return "a string";
    default:
        snprintf(buf, n, "'%.*s'", (int)(t->n < 40 ? t->n : 40), t->s);
        return buf;
    }
}

static int unexpected(struct ps *p, const char *want)
{
    char b[64];
    return strata_errf(STRATA_EFORMAT, "line %d: expected %s, found %s", cur(p)->line, want,
                       tok_desc(cur(p), b, sizeof b));
}

static int expect_op(struct ps *p, const char *s)
{
    char w[16];
    snprintf(w, sizeof w, "'%s'", s);
    return accept_op(p, s) ? 0 : unexpected(p, w);
}

static int expect(struct ps *p, enum ttok t, const char *what)
{
    if (cur(p)->t != t) return unexpected(p, what);
    p->i++;
    return 0;
}

static struct tnode *mk(struct ps *p, enum tnode_kind k, int line)
{
    struct tnode *n = tmpl_arena_alloc(p->a, sizeof *n);
    if (n) {
        n->kind = k;
        n->line = line;
    }
    return n;
}

static char *tok_str(struct ps *p, const struct ttoken *t)
{
    char *s = tmpl_arena_alloc(p->a, t->n + 1);
    if (s) memcpy(s, t->s, t->n);
    return s;
}

/* vec: a growable array of node pointers during parsing, copied to the arena when done. */
struct vec {
    struct tnode **v;
    const char **names;
    size_t n, cap;
};

static int vec_push(struct ps *p, struct vec *v, struct tnode *n, const char *name)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        struct tnode **nv = tmpl_arena_alloc(p->a, cap * sizeof *nv);
        const char **nn = tmpl_arena_alloc(p->a, cap * sizeof *nn);
        if (!nv || !nn) return STRATA_ENOMEM;
        if (v->n) {
            memcpy(nv, v->v, v->n * sizeof *nv);
            memcpy(nn, v->names, v->n * sizeof *nn);
        }
        v->v = nv;
        v->names = nn;
        v->cap = cap;
    }
    v->v[v->n] = n;
    v->names[v->n++] = name;
    return 0;
}

static int enter(struct ps *p)
{
    if (++p->depth > p->t->lim.max_parse_depth)
        return strata_errf(STRATA_ELIMIT, "line %d: template nests deeper than %d", cur(p)->line,
                           p->t->lim.max_parse_depth);
    return 0;
}

static int expr(struct ps *p, bool condexpr, struct tnode **out);
static int unary(struct ps *p, bool filters, struct tnode **out);

/* call_args parses "(a, b, k=v)" into n->v / n->w+names; the '(' is current. */
static int call_args(struct ps *p, struct tnode *n)
{
    struct vec pos = {0}, kw = {0};
    int rv;
    if ((rv = expect_op(p, "(")) != 0) return rv;
    while (!is_op(p, ")")) {
        if (pos.n + kw.n && (rv = expect_op(p, ",")) != 0) return rv;
        if (is_op(p, ")")) break;
        if (is_op(p, "*") || is_op(p, "**"))
            return strata_errf(STRATA_EFORMAT,
                               "line %d: *args and **kwargs in calls are not "
                               "supported",
                               cur(p)->line);
        struct tnode *e;
        if (cur(p)->t == TK_NAME && tok_is(peek(p, 1), TK_OP, "=")) {
            const char *name = tok_str(p, cur(p));
            if (!name) return STRATA_ENOMEM;
            p->i += 2;
            if ((rv = expr(p, true, &e)) != 0) return rv;
            if ((rv = vec_push(p, &kw, e, name)) != 0) return rv;
        } else {
            if (kw.n)
                return strata_errf(STRATA_EFORMAT,
                                   "line %d: a positional argument follows a "
                                   "keyword argument",
                                   cur(p)->line);
            if ((rv = expr(p, true, &e)) != 0) return rv;
            if ((rv = vec_push(p, &pos, e, NULL)) != 0) return rv;
        }
    }
    p->i++;
    n->v = pos.v;
    n->n = pos.n;
    n->w = kw.v;
    n->names = kw.names;
    n->m = kw.n;
    return 0;
}

/* seq parses items up to the closing op (list, tuple contents, dict). */
static int seq(struct ps *p, const char *close, bool dict, struct tnode *n)
{
    struct vec keys = {0}, vals = {0};
    int rv;
    while (!is_op(p, close)) {
        if (keys.n && (rv = expect_op(p, ",")) != 0) return rv;
        if (is_op(p, close)) break;
        struct tnode *k, *v = NULL;
        if ((rv = expr(p, true, &k)) != 0) return rv;
        if (dict) {
            if ((rv = expect_op(p, ":")) != 0) return rv;
            if ((rv = expr(p, true, &v)) != 0) return rv;
            if ((rv = vec_push(p, &vals, v, NULL)) != 0) return rv;
        }
        if ((rv = vec_push(p, &keys, k, NULL)) != 0) return rv;
    }
    p->i++;
    n->v = keys.v;
    n->n = keys.n;
    n->w = vals.v;
    n->m = vals.n;
    return 0;
}

static int primary(struct ps *p, struct tnode **out)
{
    const struct ttoken *t = cur(p);
    struct tnode *n;
    int rv;
    if (t->t == TK_NAME) {
        p->i++;
        if (!(n = mk(p, E_CONST, t->line))) return STRATA_ENOMEM;
        if (tok_is(t, TK_NAME, "true") || tok_is(t, TK_NAME, "True"))
            n->val = tv_bool(true);
        else if (tok_is(t, TK_NAME, "false") || tok_is(t, TK_NAME, "False"))
            n->val = tv_bool(false);
        else if (tok_is(t, TK_NAME, "none") || tok_is(t, TK_NAME, "None"))
            n->val = tv_none();
        else {
            n->kind = E_NAME;
            if (!(n->s = tok_str(p, t))) return STRATA_ENOMEM;
            n->slen = t->n;
        }
    } else if (t->t == TK_STRING) {
        /* adjacent literals concatenate, as in Python */
        size_t len = 0, k;
        for (k = p->i; p->tk[k].t == TK_STRING; k++)
            len += p->tk[k].n;
        struct tstr *s = tv_newstr(p->a, NULL, len);
        if (!s || !(n = mk(p, E_CONST, t->line))) return STRATA_ENOMEM;
        len = 0;
        for (; p->i < k; p->i++) {
            memcpy(s->p + len, cur(p)->s, cur(p)->n);
            len += cur(p)->n;
        }
        n->val = tv_s(s);
    } else if (t->t == TK_INT || t->t == TK_FLOAT) {
        p->i++;
        if (!(n = mk(p, E_CONST, t->line))) return STRATA_ENOMEM;
        n->val = t->t == TK_INT ? tv_int(t->i) : tv_float(t->f);
    } else if (accept_op(p, "(")) {
        if (accept_op(p, ")")) {
            if (!(n = mk(p, E_TUPLE, t->line))) return STRATA_ENOMEM;
        } else {
            if ((rv = expr(p, true, &n)) != 0) return rv;
            if (is_op(p, ",")) {
                struct vec items = {0};
                if ((rv = vec_push(p, &items, n, NULL)) != 0) return rv;
                while (accept_op(p, ",") && !is_op(p, ")")) {
                    if ((rv = expr(p, true, &n)) != 0) return rv;
                    if ((rv = vec_push(p, &items, n, NULL)) != 0) return rv;
                }
                if (!(n = mk(p, E_TUPLE, t->line))) return STRATA_ENOMEM;
                n->v = items.v;
                n->n = items.n;
            }
            if ((rv = expect_op(p, ")")) != 0) return rv;
        }
    } else if (accept_op(p, "[")) {
        if (!(n = mk(p, E_LIST, t->line))) return STRATA_ENOMEM;
        if ((rv = seq(p, "]", false, n)) != 0) return rv;
    } else if (accept_op(p, "{")) {
        if (!(n = mk(p, E_DICT, t->line))) return STRATA_ENOMEM;
        if ((rv = seq(p, "}", true, n)) != 0) return rv;
    } else {
        return unexpected(p, "an expression");
    }
    *out = n;
    return 0;
}

static int subscript(struct ps *p, struct tnode *on, struct tnode **out)
{
    struct tnode *n = mk(p, E_ITEM, cur(p)->line);
    int rv;
    if (!n) return STRATA_ENOMEM;
    n->a = on;
    if (!is_op(p, ":") && (rv = expr(p, true, &n->b)) != 0) return rv;
    if (accept_op(p, ":")) {
        n->kind = E_SLICE;
        if (!is_op(p, ":") && !is_op(p, "]") && (rv = expr(p, true, &n->c)) != 0) return rv;
        if (accept_op(p, ":") && !is_op(p, "]") && (rv = expr(p, true, &n->d)) != 0) return rv;
    }
    *out = n;
    return expect_op(p, "]");
}

static int postfix(struct ps *p, struct tnode **node)
{
    int rv;
    for (;;) {
        int line = cur(p)->line;
        if (accept_op(p, ".")) {
            struct tnode *n = mk(p, E_ATTR, line);
            if (!n) return STRATA_ENOMEM;
            n->a = *node;
            if (cur(p)->t == TK_INT) { /* foo.0 is foo[0] */
                n->kind = E_ITEM;
                if (!(n->b = mk(p, E_CONST, line))) return STRATA_ENOMEM;
                n->b->val = tv_int(cur(p)->i);
            } else if (cur(p)->t == TK_NAME) {
                if (!(n->s = tok_str(p, cur(p)))) return STRATA_ENOMEM;
                n->slen = cur(p)->n;
            } else {
                return unexpected(p, "an attribute name");
            }
            p->i++;
            *node = n;
        } else if (accept_op(p, "[")) {
            if ((rv = subscript(p, *node, node)) != 0) return rv;
        } else if (is_op(p, "(")) {
            struct tnode *n = mk(p, E_CALL, line);
            if (!n) return STRATA_ENOMEM;
            n->a = *node;
            if ((rv = call_args(p, n)) != 0) return rv;
            *node = n;
        } else {
            return 0;
        }
    }
}

static int unknown(struct ps *p, struct tnode *n, const char *what)
{
    if (p->soft) {
        n->flag = true;
        return 0;
    }
    return strata_errf(STRATA_EFORMAT, "line %d: no %s named '%s'", n->line, what, n->s);
}

/* filters parses "| f(args)", "is [not] t arg" and calls after them. */
static int filters(struct ps *p, struct tnode **node)
{
    int rv;
    for (;;) {
        int line = cur(p)->line;
        if (accept_op(p, "|")) {
            struct tnode *n = mk(p, E_FILTER, line);
            if (!n) return STRATA_ENOMEM;
            if (cur(p)->t != TK_NAME) return unexpected(p, "a filter name");
            if (!(n->s = tok_str(p, cur(p)))) return STRATA_ENOMEM;
            p->i++;
            n->a = *node;
            if (is_op(p, "(") && (rv = call_args(p, n)) != 0) return rv;
            if (!tmpl_filter_exists(n->s) && (rv = unknown(p, n, "filter")) != 0) return rv;
            *node = n;
        } else if (accept_name(p, "is")) {
            struct tnode *n = mk(p, E_TEST, line);
            if (!n) return STRATA_ENOMEM;
            n->op = accept_name(p, "not");
            if (cur(p)->t != TK_NAME) return unexpected(p, "a test name");
            if (!(n->s = tok_str(p, cur(p)))) return STRATA_ENOMEM;
            p->i++;
            n->a = *node;
            const struct ttoken *t = cur(p);
            if (is_op(p, "(")) {
                if ((rv = call_args(p, n)) != 0) return rv;
            } else if ((t->t == TK_NAME || t->t == TK_STRING || t->t == TK_INT ||
                        t->t == TK_FLOAT || is_op(p, "[") || is_op(p, "{")) &&
                       !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and")) {
                if (is_name(p, "is"))
                    return strata_errf(STRATA_EFORMAT,
                                       "line %d: tests cannot be chained with "
                                       "'is'",
                                       t->line);
                struct tnode *arg;
                if ((rv = primary(p, &arg)) != 0 || (rv = postfix(p, &arg)) != 0) return rv;
                if (!(n->v = tmpl_arena_alloc(p->a, sizeof *n->v))) return STRATA_ENOMEM;
                n->v[0] = arg;
                n->n = 1;
            }
            if (!tmpl_test_exists(n->s) && (rv = unknown(p, n, "test")) != 0) return rv;
            *node = n;
        } else if (is_op(p, "(")) {
            struct tnode *n = mk(p, E_CALL, line);
            if (!n) return STRATA_ENOMEM;
            n->a = *node;
            if ((rv = call_args(p, n)) != 0) return rv;
            *node = n;
        } else {
            return 0;
        }
    }
}

static int unary(struct ps *p, bool with_filters, struct tnode **out)
{
    int rv, line = cur(p)->line;
    if ((rv = enter(p)) != 0) return rv;
    if (is_op(p, "-") || is_op(p, "+")) {
        struct tnode *n = mk(p, is_op(p, "-") ? E_NEG : E_POS, line);
        if (!n) return STRATA_ENOMEM;
        p->i++;
        if ((rv = unary(p, false, &n->a)) != 0) return rv;
        *out = n;
    } else if ((rv = primary(p, out)) != 0) {
        return rv;
    }
    if ((rv = postfix(p, out)) != 0) return rv;
    if (with_filters && (rv = filters(p, out)) != 0) return rv;
    p->depth--;
    return 0;
}

static int binop(struct ps *p, enum tbin op, struct tnode *a, struct tnode *b, struct tnode **out)
{
    struct tnode *n = mk(p, E_BIN, a->line);
    if (!n) return STRATA_ENOMEM;
    n->op = (int)op;
    n->a = a;
    n->b = b;
    *out = n;
    return 0;
}

static int power(struct ps *p, struct tnode **out)
{
    int rv = unary(p, true, out);
    while (!rv && accept_op(p, "**")) {
        struct tnode *r;
        if ((rv = unary(p, true, &r)) == 0) rv = binop(p, B_POW, *out, r, out);
    }
    return rv;
}

static int math2(struct ps *p, struct tnode **out)
{
    int rv = power(p, out);
    for (;;) {
        enum tbin op;
        if (rv) return rv;
        if (accept_op(p, "*"))
            op = B_MUL;
        else if (accept_op(p, "/"))
            op = B_DIV;
        else if (accept_op(p, "//"))
            op = B_FDIV;
        else if (accept_op(p, "%"))
            op = B_MOD;
        else
            return 0;
        struct tnode *r;
        if ((rv = power(p, &r)) == 0) rv = binop(p, op, *out, r, out);
    }
}

static int concat(struct ps *p, struct tnode **out)
{
    int rv = math2(p, out);
    while (!rv && accept_op(p, "~")) {
        struct tnode *r;
        if ((rv = math2(p, &r)) == 0) rv = binop(p, B_CAT, *out, r, out);
    }
    return rv;
}

static int math1(struct ps *p, struct tnode **out)
{
    int rv = concat(p, out);
    for (;;) {
        enum tbin op;
        if (rv) return rv;
        if (accept_op(p, "+"))
            op = B_ADD;
        else if (accept_op(p, "-"))
            op = B_SUB;
        else
            return 0;
        struct tnode *r;
        if ((rv = concat(p, &r)) == 0) rv = binop(p, op, *out, r, out);
    }
}

static int compare(struct ps *p, struct tnode **out)
{
    static const struct {
        const char *s;
        enum tcmp op;
    } cmps[] = {{"==", C_EQ}, {"!=", C_NE}, {"<", C_LT}, {"<=", C_LE}, {">", C_GT}, {">=", C_GE}};
    struct tnode *first;
    int rv = math1(p, &first);
    if (rv) return rv;
    struct vec opnds = {0};
    unsigned char ops[64];
    for (;;) {
        int op = -1;
        for (size_t k = 0; k < sizeof cmps / sizeof *cmps; k++)
            if (accept_op(p, cmps[k].s)) op = (int)cmps[k].op;
        if (op < 0 && accept_name(p, "in")) op = C_IN;
        if (op < 0 && is_name(p, "not") && tok_is(peek(p, 1), TK_NAME, "in")) {
            p->i += 2;
            op = C_NOTIN;
        }
        if (op < 0) break;
        if (opnds.n == 0 && (rv = vec_push(p, &opnds, first, NULL)) != 0) return rv;
        if (opnds.n > sizeof ops)
            return strata_errf(STRATA_ELIMIT, "line %d: more than %zu chained comparisons",
                               first->line, sizeof ops);
        ops[opnds.n - 1] = (unsigned char)op;
        struct tnode *r;
        if ((rv = math1(p, &r)) != 0 || (rv = vec_push(p, &opnds, r, NULL)) != 0) return rv;
    }
    if (opnds.n == 0) {
        *out = first;
        return 0;
    }
    struct tnode *n = mk(p, E_CMP, first->line);
    if (!n || !(n->ops = tmpl_arena_alloc(p->a, opnds.n))) return STRATA_ENOMEM;
    memcpy(n->ops, ops, opnds.n - 1);
    n->v = opnds.v;
    n->n = opnds.n;
    *out = n;
    return 0;
}

static int not_expr(struct ps *p, struct tnode **out)
{
    int line = cur(p)->line, rv;
    if (accept_name(p, "not")) {
        struct tnode *n = mk(p, E_NOT, line);
        if (!n) return STRATA_ENOMEM;
        if ((rv = enter(p)) != 0 || (rv = not_expr(p, &n->a)) != 0) return rv;
        p->depth--;
        *out = n;
        return 0;
    }
    return compare(p, out);
}

static int and_expr(struct ps *p, struct tnode **out)
{
    int rv = not_expr(p, out);
    while (!rv && accept_name(p, "and")) {
        struct tnode *r;
        if ((rv = not_expr(p, &r)) == 0) rv = binop(p, B_AND, *out, r, out);
    }
    return rv;
}

static int or_expr(struct ps *p, struct tnode **out)
{
    int rv = and_expr(p, out);
    while (!rv && accept_name(p, "or")) {
        struct tnode *r;
        if ((rv = and_expr(p, &r)) == 0) rv = binop(p, B_OR, *out, r, out);
    }
    return rv;
}

/* expr: a full expression; condexpr false stops before "if" (for-loop filters, if tests). */
static int expr(struct ps *p, bool condexpr, struct tnode **out)
{
    int rv;
    if ((rv = enter(p)) != 0 || (rv = or_expr(p, out)) != 0) return rv;
    while (condexpr && is_name(p, "if")) {
        struct tnode *n = mk(p, E_COND, cur(p)->line);
        if (!n) return STRATA_ENOMEM;
        p->i++;
        n->a = *out;
        if ((rv = or_expr(p, &n->b)) != 0) return rv;
        if (accept_name(p, "else") && (rv = expr(p, true, &n->c)) != 0) return rv;
        *out = n;
    }
    p->depth--;
    return 0;
}

/* tuple: "a" or "a, b, ..." (a tuple) up to a tag end, ')' or '='. */
static int tuple(struct ps *p, bool condexpr, struct tnode **out)
{
    int line = cur(p)->line, rv;
    if ((rv = expr(p, condexpr, out)) != 0 || !is_op(p, ",")) return rv;
    struct vec items = {0};
    if ((rv = vec_push(p, &items, *out, NULL)) != 0) return rv;
    while (accept_op(p, ",")) {
        if (cur(p)->t == TK_VAR_END || cur(p)->t == TK_BLOCK_END || is_op(p, ")") ||
            is_op(p, "=") || is_name(p, "if"))
            break;
        if ((rv = expr(p, condexpr, out)) != 0 || (rv = vec_push(p, &items, *out, NULL)) != 0)
            return rv;
    }
    struct tnode *n = mk(p, E_TUPLE, line);
    if (!n) return STRATA_ENOMEM;
    n->v = items.v;
    n->n = items.n;
    *out = n;
    return 0;
}

/* target: an assignment target: a name, "a, b" (unpacking) or, for set, "ns.attr". */
static int target(struct ps *p, bool attr, struct tnode **out)
{
    int line = cur(p)->line, rv;
    bool paren = accept_op(p, "(");
    struct vec names = {0};
    do {
        if (cur(p)->t != TK_NAME) return unexpected(p, "a variable name");
        struct tnode *n = mk(p, E_NAME, cur(p)->line);
        if (!n || !(n->s = tok_str(p, cur(p)))) return STRATA_ENOMEM;
        n->slen = cur(p)->n;
        p->i++;
        if (attr && names.n == 0 && !paren && accept_op(p, ".")) {
            struct tnode *a = mk(p, E_ATTR, line);
            if (!a) return STRATA_ENOMEM;
            if (cur(p)->t != TK_NAME) return unexpected(p, "an attribute name");
            a->a = n;
            if (!(a->s = tok_str(p, cur(p)))) return STRATA_ENOMEM;
            a->slen = cur(p)->n;
            p->i++;
            *out = a;
            return 0;
        }
        if ((rv = vec_push(p, &names, n, NULL)) != 0) return rv;
    } while (accept_op(p, ",") && cur(p)->t == TK_NAME);
    if (paren && (rv = expect_op(p, ")")) != 0) return rv;
    if (names.n == 1 && !paren) {
        *out = names.v[0];
        return 0;
    }
    struct tnode *n = mk(p, E_TUPLE, line);
    if (!n) return STRATA_ENOMEM;
    n->v = names.v;
    n->n = names.n;
    *out = n;
    return 0;
}

static int body(struct ps *p, const char *const *ends, int *which, struct vec *out, int open_line,
                const char *open);

static int block_end(struct ps *p)
{
    return expect(p, TK_BLOCK_END, "'%}'");
}

static int parse_body_into(struct ps *p, const char *const *ends, int *which, struct tnode ***v,
                           size_t *n, int line, const char *open)
{
    struct vec b = {0};
    int rv = body(p, ends, which, &b, line, open);
    *v = b.v;
    *n = b.n;
    return rv;
}

static int stmt_if(struct ps *p, int line, struct tnode **out)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    struct tnode *n = mk(p, S_IF, line);
    int which, rv;
    bool soft = p->soft;
    if (!n) return STRATA_ENOMEM;
    p->soft = true;
    if ((rv = expr(p, false, &n->a)) != 0 || (rv = block_end(p)) != 0) return rv;
    if ((rv = parse_body_into(p, ends, &which, &n->v, &n->n, line, "if")) != 0) return rv;
    if (which == 0) { /* elif: the else branch is one nested if */
        struct tnode *e;
        if ((rv = stmt_if(p, cur(p)->line, &e)) != 0) return rv;
        if (!(n->w = tmpl_arena_alloc(p->a, sizeof *n->w))) return STRATA_ENOMEM;
        n->w[0] = e;
        n->m = 1;
        p->soft = soft;
        *out = n;
        return 0;
    }
    if (which == 1) {
        static const char *const end[] = {"endif", NULL};
        if ((rv = block_end(p)) != 0) return rv;
        if ((rv = parse_body_into(p, end, &which, &n->w, &n->m, line, "if")) != 0) return rv;
    }
    p->soft = soft;
    *out = n;
    return block_end(p);
}

static int stmt_for(struct ps *p, int line, struct tnode **out)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    static const char *const end[] = {"endfor", NULL};
    struct tnode *n = mk(p, S_FOR, line);
    int which, rv;
    if (!n) return STRATA_ENOMEM;
    if ((rv = target(p, false, &n->a)) != 0) return rv;
    if (!accept_name(p, "in")) return unexpected(p, "'in'");
    if ((rv = tuple(p, false, &n->b)) != 0) return rv;
    if (accept_name(p, "if") && (rv = expr(p, true, &n->c)) != 0) return rv;
    if (is_name(p, "recursive"))
        return strata_errf(STRATA_EFORMAT, "line %d: recursive for-loops are not supported", line);
    if ((rv = block_end(p)) != 0) return rv;
    bool soft = p->soft;
    p->soft = false;
    p->loops++;
    rv = parse_body_into(p, ends, &which, &n->v, &n->n, line, "for");
    p->loops--;
    if (rv) return rv;
    if (which == 0) {
        if ((rv = block_end(p)) != 0) return rv;
        if ((rv = parse_body_into(p, end, &which, &n->w, &n->m, line, "for")) != 0) return rv;
    }
    p->soft = soft;
    *out = n;
    return block_end(p);
}

/* filter_chain parses "f1(args) | f2 ..." for {% filter %} and {% set x | f %}: E_FILTER nodes
 * whose innermost input (a) is NULL, standing for the rendered body. */
static int filter_chain(struct ps *p, struct tnode **out)
{
    struct tnode *chain = NULL;
    int rv;
    do {
        struct tnode *n = mk(p, E_FILTER, cur(p)->line);
        if (!n) return STRATA_ENOMEM;
        if (cur(p)->t != TK_NAME) return unexpected(p, "a filter name");
        if (!(n->s = tok_str(p, cur(p)))) return STRATA_ENOMEM;
        p->i++;
        if (is_op(p, "(") && (rv = call_args(p, n)) != 0) return rv;
        if (!tmpl_filter_exists(n->s) && (rv = unknown(p, n, "filter")) != 0) return rv;
        n->a = chain;
        chain = n;
    } while (accept_op(p, "|"));
    *out = chain;
    return 0;
}

static int stmt_set(struct ps *p, int line, struct tnode **out)
{
    static const char *const end[] = {"endset", NULL};
    struct tnode *n = mk(p, S_SET, line);
    int which, rv;
    if (!n) return STRATA_ENOMEM;
    if ((rv = target(p, true, &n->a)) != 0) return rv;
    if (accept_op(p, "=")) {
        if ((rv = tuple(p, true, &n->b)) != 0) return rv;
        *out = n;
        return block_end(p);
    }
    if (n->a->kind != E_NAME)
        return strata_errf(STRATA_EFORMAT, "line %d: a block set takes one variable name", line);
    n->kind = S_SETBLOCK;
    if (accept_op(p, "|") && (rv = filter_chain(p, &n->c)) != 0) return rv;
    if ((rv = block_end(p)) != 0) return rv;
    bool soft = p->soft;
    p->soft = false;
    if ((rv = parse_body_into(p, end, &which, &n->v, &n->n, line, "set")) != 0) return rv;
    p->soft = soft;
    *out = n;
    return block_end(p);
}

static int stmt_macro(struct ps *p, int line, struct tnode **out)
{
    static const char *const end[] = {"endmacro", NULL};
    struct tnode *n = mk(p, S_MACRO, line);
    int which, rv;
    if (!n) return STRATA_ENOMEM;
    if (cur(p)->t != TK_NAME) return unexpected(p, "a macro name");
    if (!(n->s = tok_str(p, cur(p)))) return STRATA_ENOMEM;
    p->i++;
    struct vec params = {0};
    if ((rv = expect_op(p, "(")) != 0) return rv;
    while (!accept_op(p, ")")) {
        if (params.n && (rv = expect_op(p, ",")) != 0) return rv;
        if (accept_op(p, ")")) break;
        if (cur(p)->t != TK_NAME) return unexpected(p, "a parameter name");
        const char *name = tok_str(p, cur(p));
        struct tnode *def = NULL;
        if (!name) return STRATA_ENOMEM;
        p->i++;
        if (accept_op(p, "=") && (rv = expr(p, true, &def)) != 0) return rv;
        if (!def && params.n && params.v[params.n - 1])
            return strata_errf(STRATA_EFORMAT,
                               "line %d: macro %s: a parameter without a default "
                               "follows one with a default",
                               line, n->s);
        if ((rv = vec_push(p, &params, def, name)) != 0) return rv;
    }
    n->w = params.v;
    n->names = params.names;
    n->m = params.n;
    if ((rv = block_end(p)) != 0) return rv;
    bool soft = p->soft;
    int loops = p->loops;
    p->soft = false;
    p->loops = 0;
    if ((rv = parse_body_into(p, end, &which, &n->v, &n->n, line, "macro")) != 0) return rv;
    p->soft = soft;
    p->loops = loops;
    *out = n;
    return block_end(p);
}

static int statement(struct ps *p, struct tnode **out, bool *inline_body, struct vec *into)
{
    const struct ttoken *t = cur(p);
    int line = t->line, rv;
    *out = NULL;
    *inline_body = false;
    if (t->t != TK_NAME) return unexpected(p, "a statement name");
    p->i++;
    if (tok_is(t, TK_NAME, "if")) return stmt_if(p, line, out);
    if (tok_is(t, TK_NAME, "for")) return stmt_for(p, line, out);
    if (tok_is(t, TK_NAME, "set")) return stmt_set(p, line, out);
    if (tok_is(t, TK_NAME, "macro")) return stmt_macro(p, line, out);
    if (tok_is(t, TK_NAME, "break") || tok_is(t, TK_NAME, "continue")) {
        if (!p->loops)
            return strata_errf(STRATA_EFORMAT, "line %d: '%.*s' outside a for-loop", line,
                               (int)t->n, t->s);
        if (!(*out = mk(p, t->s[0] == 'b' ? S_BREAK : S_CONTINUE, line))) return STRATA_ENOMEM;
        return block_end(p);
    }
    if (tok_is(t, TK_NAME, "generation")) {
        /* transformers' tag: marks assistant text for training masks; renders its body */
        static const char *const end[] = {"endgeneration", NULL};
        int which;
        *inline_body = true;
        if ((rv = block_end(p)) != 0 || (rv = body(p, end, &which, into, line, "generation")))
            return rv;
        return block_end(p);
    }
    if (tok_is(t, TK_NAME, "filter")) {
        static const char *const end[] = {"endfilter", NULL};
        struct tnode *n = mk(p, S_FILTERBLOCK, line);
        int which;
        bool soft = p->soft;
        if (!n) return STRATA_ENOMEM;
        if ((rv = filter_chain(p, &n->a)) != 0 || (rv = block_end(p)) != 0) return rv;
        p->soft = false;
        if ((rv = parse_body_into(p, end, &which, &n->v, &n->n, line, "filter")) != 0) return rv;
        p->soft = soft;
        *out = n;
        return block_end(p);
    }
    static const char *const loaders[] = {"include", "import", "from", "extends"};
    for (size_t k = 0; k < sizeof loaders / sizeof *loaders; k++)
        if (tok_is(t, TK_NAME, loaders[k]))
            return strata_errf(STRATA_EUNSUPPORTED,
                               "line %d: '%s' is not allowed: a chat "
                               "template cannot load other templates",
                               line, loaders[k]);
    return strata_errf(STRATA_EFORMAT, "line %d: unknown or unsupported tag '%.*s'", line,
                       (int)t->n, t->s);
}

/* body parses statements until a block tag named in ends (its index in *which, the name
 * consumed, the tag's rest still to parse) or, with ends NULL, the end of the template. */
static int body(struct ps *p, const char *const *ends, int *which, struct vec *out, int open_line,
                const char *open)
{
    int rv;
    if ((rv = enter(p)) != 0) return rv;
    for (;;) {
        const struct ttoken *t = cur(p);
        struct tnode *n = NULL;
        if (t->t == TK_EOF) {
            if (!ends) break;
            const char *want = ends[0];
            for (int k = 1; ends[k]; k++)
                want = ends[k];
            return strata_errf(STRATA_EFORMAT,
                               "line %d: unexpected end of template: the '%s' "
                               "opened on line %d needs '%s'",
                               t->line, open, open_line, want);
        }
        if (t->t == TK_TEXT) {
            p->i++;
            if (!(n = mk(p, S_TEXT, t->line))) return STRATA_ENOMEM;
            n->s = t->s;
            n->slen = t->n;
        } else if (t->t == TK_VAR_BEGIN) {
            p->i++;
            if (!(n = mk(p, S_OUT, t->line))) return STRATA_ENOMEM;
            if ((rv = tuple(p, true, &n->a)) != 0) return rv;
            if ((rv = expect(p, TK_VAR_END, "'}}'")) != 0) return rv;
        } else if (t->t == TK_BLOCK_BEGIN) {
            p->i++;
            for (int k = 0; ends && ends[k]; k++)
                if (is_name(p, ends[k])) {
                    *which = k;
                    p->i++;
                    p->depth--;
                    return 0;
                }
            bool inl;
            if ((rv = statement(p, &n, &inl, out)) != 0) return rv;
        } else {
            return unexpected(p, "text or a tag");
        }
        if (n && (rv = vec_push(p, out, n, NULL)) != 0) return rv;
    }
    p->depth--;
    return 0;
}

int tmpl_parse(struct tmpl *t, const struct ttoken *tok, size_t ntok)
{
    struct ps p = {.t = t, .a = &t->arena, .tk = tok, .n = ntok};
    struct vec b = {0};
    int rv = body(&p, NULL, NULL, &b, 0, "");
    if (rv) return rv == STRATA_ENOMEM ? strata_errf(rv, "template too large for memory") : rv;
    t->body = b.v;
    t->n = b.n;
    return 0;
}
