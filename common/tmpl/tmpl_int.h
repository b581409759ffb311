/* tmpl_int — the chat-template interpreter's internals, shared by common/tmpl_*.c only.
 *
 * A compiled template is a tree of struct tnode allocated in the template's own arena (immutable
 * after tmpl_compile, so one template may be rendered by several threads at once). A render
 * allocates every value in a second arena that is freed whole when the render ends: values have
 * no reference counts and cycles (a list appended to itself) cannot leak. The render arena's size
 * is the memory limit. Strings are UTF-8 byte strings; lengths, indexes and slices count code
 * points as Python does. Python semantics are the reference: Jinja2 3.1 as Hugging Face
 * transformers configures it (trim_blocks, lstrip_blocks, loopcontrols, keep_trailing_newline off).
 */
#ifndef STRATA_TMPL_INT_H
#define STRATA_TMPL_INT_H

#include "common/tmpl/tmpl.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* ---- arena ---- */
struct tmpl_chunk;
struct tmpl_arena {
    struct tmpl_chunk *head;
    size_t used;  /* bytes handed out, chunk headers included */
    size_t limit; /* tmpl_arena_alloc fails past this */
};
/* tmpl_arena_alloc returns n zeroed bytes (16-aligned), or NULL (limit or OOM). */
void *tmpl_arena_alloc(struct tmpl_arena *a, size_t n);
void tmpl_arena_free(struct tmpl_arena *a);

/* ---- growable malloc'd byte buffer with a size limit ---- */
struct tbuf {
    char *p;
    size_t n, cap, limit;
};
/* tbuf_add appends n bytes; returns STRATA_ELIMIT past limit, STRATA_ENOMEM. */
int tbuf_add(struct tbuf *b, const void *p, size_t n);
int tbuf_puts(struct tbuf *b, const char *s);
int tbuf_printf(struct tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- values ---- */
enum tv_kind {
    TV_UNDEF, /* u.name: the missing name, for messages (may be NULL) */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST, /* list or tuple */
    TV_DICT, /* dict or namespace() */
    TV_MACRO,
    TV_LOOP,
    TV_FUNC, /* a global function: u.fn is an enum tfn */
};

struct tstr {
    size_t n;
    char p[]; /* n bytes + NUL */
};
struct tv;
struct tlist {
    size_t n, cap;
    struct tv *v;
    bool tuple;
};
struct tdict { /* insertion-ordered; O(n) lookup: chat-template dicts hold a handful of keys */
    size_t n, cap;
    struct tv *k, *v;
    bool ns; /* a namespace(): the only object `set x.attr = ...` may change */
};
struct tnode;
struct tscope;
struct tmacro {
    const struct tnode *def;
    struct tscope *env; /* the scope it was defined in: names resolve there at call time */
};
struct tloop {
    struct tlist *items;
    size_t i;
};
struct tv {
    enum tv_kind k;
    union {
        bool b;
        int64_t i;
        double f;
        struct tstr *s;
        struct tlist *l;
        struct tdict *d;
        struct tmacro *m;
        struct tloop *loop;
        int fn;
        const char *name;
    } u;
};

enum tfn { TFN_RANGE, TFN_NAMESPACE, TFN_DICT, TFN_RAISE, TFN_STRFTIME };

#define TV_MAX_DEPTH 256 /* nesting that printing, comparing or serialising a value may reach */

struct tstr *tv_newstr(struct tmpl_arena *a, const char *p, size_t n);
struct tlist *tv_newlist(struct tmpl_arena *a, size_t cap);
struct tdict *tv_newdict(struct tmpl_arena *a, size_t cap);
int tv_list_push(struct tmpl_arena *a, struct tlist *l, struct tv v);
/* tv_dict_set inserts or replaces key k. */
int tv_dict_set(struct tmpl_arena *a, struct tdict *d, struct tv k, struct tv v);
/* tv_dict_get returns the value for k, or NULL. */
struct tv *tv_dict_get(const struct tdict *d, struct tv k);
struct tv *tv_dict_gets(const struct tdict *d, const char *k, size_t n);

static inline struct tv tv_undef(const char *name)
{
    return (struct tv){.k = TV_UNDEF, .u.name = name};
}
static inline struct tv tv_none(void)
{
    return (struct tv){.k = TV_NONE};
}
static inline struct tv tv_bool(bool b)
{
    return (struct tv){.k = TV_BOOL, .u.b = b};
}
static inline struct tv tv_int(int64_t i)
{
    return (struct tv){.k = TV_INT, .u.i = i};
}
static inline struct tv tv_float(double f)
{
    return (struct tv){.k = TV_FLOAT, .u.f = f};
}
static inline struct tv tv_s(struct tstr *s)
{
    return (struct tv){.k = TV_STR, .u.s = s};
}
static inline struct tv tv_l(struct tlist *l)
{
    return (struct tv){.k = TV_LIST, .u.l = l};
}
static inline struct tv tv_d(struct tdict *d)
{
    return (struct tv){.k = TV_DICT, .u.d = d};
}
/* ints and bools are Python ints */
static inline bool tv_isint(struct tv v)
{
    return v.k == TV_INT || v.k == TV_BOOL;
}
static inline int64_t tv_asint(struct tv v)
{
    return v.k == TV_BOOL ? (int64_t)v.u.b : v.u.i;
}
static inline bool tv_isnum(struct tv v)
{
    return v.k == TV_INT || v.k == TV_BOOL || v.k == TV_FLOAT;
}
static inline double tv_asdbl(struct tv v)
{
    return v.k == TV_FLOAT ? v.u.f : (double)tv_asint(v);
}

/* tv_truthy: Python truthiness; undefined is false. */
bool tv_truthy(struct tv v);
/* tv_eq: Python ==. */
bool tv_eq(struct tv a, struct tv b, int depth);
/* tv_cmp sets *r to <0, 0, >0 as Python's < would order a and b; STRATA_EINVAL when Python
 * raises TypeError (the detail names both types). */
int tv_cmp(struct tv a, struct tv b, int *r, int depth);
/* tv_typename: the Python type name, for messages. */
const char *tv_typename(struct tv v);
/* tv_write: str(v) into b (undefined prints ""); tv_repr: repr(v). */
int tv_write(struct tbuf *b, struct tv v, int depth);
int tv_repr(struct tbuf *b, struct tv v, int depth);
/* tv_write_float: Python's repr of a float. */
int tv_write_float(struct tbuf *b, double f);
/* tv_tojson: json.dumps(v, ensure_ascii=False, indent=indent (<0: None), sort_keys=False). */
int tv_tojson(struct tbuf *b, struct tv v, int indent, int level);
/* tv_from_json converts a jansson value (jansson's own depth limit applies). */
int tv_from_json(struct tmpl_arena *a, const json_t *j, struct tv *out);

/* UTF-8 helpers: code point count, byte offset of code point i, decode one. */
size_t tmpl_u8_len(const char *p, size_t n);
size_t tmpl_u8_off(const char *p, size_t n, size_t i);
size_t tmpl_u8_dec(const char *p, size_t n, uint32_t *cp);
int tmpl_u8_enc(char *out, uint32_t cp);
bool tmpl_u_isspace(uint32_t cp);

/* ---- lexer ---- */
enum ttok {
    TK_EOF,
    TK_TEXT,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING, /* unescaped */
    TK_INT,
    TK_FLOAT,
    TK_OP, /* text holds the operator: "//", "**", "==", "(", ... */
};
struct ttoken {
    enum ttok t;
    int line;
    const char *s; /* text (arena) */
    size_t n;
    int64_t i;
    double f;
};
/* tmpl_lex tokenizes src; token texts live in the arena, the array *out is malloc'd (caller
 * frees). Errors carry the line. */
int tmpl_lex(struct tmpl_arena *a, const char *src, size_t len, size_t max_tokens,
             struct ttoken **out, size_t *n);

/* ---- syntax tree ---- */
enum tnode_kind {
    /* expressions */
    E_CONST,  /* val */
    E_NAME,   /* s */
    E_LIST,   /* v[n] */
    E_TUPLE,  /* v[n] */
    E_DICT,   /* v[n] keys, w[n] values */
    E_ATTR,   /* a.s */
    E_ITEM,   /* a[b] */
    E_SLICE,  /* a[b:c:d], any of b c d NULL */
    E_CALL,   /* a(v[n], names[m]=w[m]) */
    E_FILTER, /* a | s(v, names=w); a NULL in a filter block; flag: unknown (fails when run) */
    E_TEST,   /* a is [not] s(v); op: 1 = negated; flag: unknown (fails when run) */
    E_NEG,
    E_POS,
    E_NOT,
    E_BIN,  /* a op b, op an enum tbin */
    E_CMP,  /* v[0] ops[0] v[1] ops[1] v[2] ... (Python chaining) */
    E_COND, /* a if b else c (c may be NULL) */
    /* statements */
    S_TEXT,        /* s[slen] */
    S_OUT,         /* {{ a }} */
    S_IF,          /* if a: v[n] else w[m] (elif = else holding one S_IF) */
    S_FOR,         /* for a in b [if c]: v[n] else w[m] */
    S_SET,         /* a = b; a is E_NAME, E_TUPLE of names or E_ATTR */
    S_SETBLOCK,    /* a = rendering of v[n] */
    S_MACRO,       /* s(names[m] = w[m] defaults, NULL where none): v[n] */
    S_FILTERBLOCK, /* render v[n], pipe through the E_FILTER chain a */
    S_BREAK,
    S_CONTINUE,
};
enum tbin { B_ADD, B_SUB, B_MUL, B_DIV, B_FDIV, B_MOD, B_POW, B_CAT, B_AND, B_OR };
enum tcmp { C_EQ, C_NE, C_LT, C_LE, C_GT, C_GE, C_IN, C_NOTIN };

struct tnode {
    enum tnode_kind kind;
    int line;
    int op;
    bool flag;
    struct tnode *a, *b, *c, *d;
    struct tnode **v;
    size_t n;
    struct tnode **w;
    size_t m;
    const char **names;
    unsigned char *ops;
    const char *s;
    size_t slen;
    struct tv val;
};

struct tmpl {
    struct tmpl_arena arena;
    struct tmpl_limits lim;
    struct tnode **body;
    size_t n;
    time_t now; /* strftime_now's time; (time_t)-1: the clock at render */
};

/* tmpl_parse builds t->body from tokens. */
int tmpl_parse(struct tmpl *t, const struct ttoken *tok, size_t ntok);

/* ---- runtime ---- */
struct tscope {
    struct tscope *parent;
    struct tdict vars;
};
struct trt {
    const struct tmpl *t;
    struct tmpl_arena arena;
    struct tbuf *out; /* where text goes now: the result or a macro's / block set's capture */
    struct tscope *root;
    struct tscope *sc; /* the innermost scope: where set assigns */
    uint64_t steps;
    int depth; /* macro calls in progress */
    int flow;  /* FLOW_BREAK / FLOW_CONTINUE while unwinding a loop body */
    int line;  /* line of the node being run, for messages */
};
enum { FLOW_NONE, FLOW_BREAK, FLOW_CONTINUE };

/* tmpl_rt_err sets the detail "line N: <msg>" and returns code. */
int tmpl_rt_err(struct trt *rt, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int tmpl_rt_oom(struct trt *rt);
struct tstr *tmpl_rt_str(struct trt *rt, const char *p, size_t n);
/* tmpl_rt_buf_str ends a build into b: when rv is 0, *out is b's bytes as a new string; b is freed
 * either way. Returns rv, or the error of copying b. */
int tmpl_rt_buf_str(struct trt *rt, struct tbuf *b, int rv, struct tv *out);
/* tmpl_rt_tostr: str(v) as a new string. */
int tmpl_rt_tostr(struct trt *rt, struct tv v, struct tstr **out);
/* tmpl_rt_iter: list(v) (dict keys, string characters); undefined is empty; else STRATA_EINVAL. */
int tmpl_rt_iter(struct trt *rt, struct tv v, struct tlist **out);
/* tmpl_rt_getattr: v.name / v[name] as Jinja2's environment.getattr. */
int tmpl_rt_getattr(struct trt *rt, struct tv v, const char *name, size_t n, struct tv *out);
/* tmpl_rt_eval evaluates expression node n (tmpl_eval.c). */
int tmpl_rt_eval(struct trt *rt, const struct tnode *n, struct tv *out);
/* tmpl_rt_lookup resolves a name through the scopes, then the globals; else undefined. */
struct tv tmpl_rt_lookup(struct trt *rt, const char *name, size_t n);
/* tmpl_rt_set binds name in scope sc. */
int tmpl_rt_set(struct trt *rt, struct tscope *sc, const char *name, size_t n, struct tv v);
/* tmpl_rt_filter applies E_FILTER n; in a filter chain the innermost input is *in (else NULL). */
int tmpl_rt_filter(struct trt *rt, const struct tnode *n, const struct tv *in, struct tv *out);
/* tmpl_rt_undefined: the error for using undefined value v. */
int tmpl_rt_undefined(struct trt *rt, struct tv v);
/* tmpl_rt_call_macro calls a macro with evaluated arguments (tmpl_run.c). */
int tmpl_rt_call_macro(struct trt *rt, struct tmacro *m, struct tv *args, size_t nargs,
                       const char **kwn, struct tv *kwv, size_t nkw, struct tv *out);

/* builtins (tmpl_builtin.c): exist reports whether a filter / test name is known at compile. */
bool tmpl_filter_exists(const char *name);
bool tmpl_test_exists(const char *name);
int tmpl_filter(struct trt *rt, const char *name, struct tv in, struct tv *args, size_t nargs,
                const char **kwn, struct tv *kwv, size_t nkw, struct tv *out);
int tmpl_test(struct trt *rt, const char *name, struct tv in, struct tv *args, size_t nargs,
              bool *out);
/* tmpl_method: obj.name(args); *found false when obj's type has no such method. */
int tmpl_method(struct trt *rt, struct tv obj, const char *name, struct tv *args, size_t nargs,
                const char **kwn, struct tv *kwv, size_t nkw, struct tv *out, bool *found);
int tmpl_global(const char *name);
/* string operations shared by filters and methods (tmpl_str.c) */
enum tcase { TCASE_UPPER, TCASE_LOWER, TCASE_CAPITALIZE, TCASE_TITLE_PY, TCASE_TITLE_JINJA };
int tmpl_str_case(struct trt *rt, const struct tstr *s, enum tcase mode, struct tv *out);
/* tmpl_str_strip: which 1 = left, 2 = right, 3 = both; chars NULL = whitespace. */
int tmpl_str_strip(struct trt *rt, const struct tstr *s, const struct tstr *chars, int which,
                   struct tv *out);
int tmpl_str_replace(struct trt *rt, const struct tstr *s, const struct tstr *old,
                     const struct tstr *new_, int64_t count, struct tv *out);
/* tmpl_str_percent: Python's `s % args` (%s %r %d %i %f %g %e %x %o %c %%). */
int tmpl_str_percent(struct trt *rt, const struct tstr *s, struct tv args, struct tv *out);
int tmpl_str_method(struct trt *rt, const struct tstr *s, const char *name, struct tv *args,
                    size_t nargs, const char **kwn, struct tv *kwv, size_t nkw, struct tv *out,
                    bool *found);
int tmpl_call_global(struct trt *rt, int fn, struct tv *args, size_t nargs, const char **kwn,
                     struct tv *kwv, size_t nkw, struct tv *out);

#endif
