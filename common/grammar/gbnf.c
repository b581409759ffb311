/* gbnf — the GBNF parser and compiler: text to the byte-level grammar of grammar_int.h. */
#include "common/base/err.h"
#include "common/grammar/grammar_int.h"

#include <stdlib.h>
#include <string.h>

struct vec {
    uint32_t *v;
    uint32_t n, cap;
};

static int vec_push(struct vec *a, uint32_t x)
{
    if (a->n == a->cap) {
        uint32_t cap = a->cap ? 2 * a->cap : 8;
        uint32_t *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return STRATA_ENOMEM;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

struct rule {
    char *name;
    struct vec *alts; /* each a sequence of symbols without its SYM_END */
    uint32_t n_alts, cap_alts;
    bool defined;
    uint32_t line; /* first use or definition, for messages */
};

/* The named rules by name: open addressing, rule index + 1 (0: empty), at most half full. A
 * rule the compiler makes (a group, a repetition, a class) has a name for messages only and is
 * not in it, so a grammar's own rule may be called `group` or `star`. */
struct names {
    uint32_t *slot;
    uint32_t cap; /* a power of two, or 0 */
    uint32_t n;
};

struct parser {
    const char *s, *end, *p;
    uint32_t line;
    const char *line_start;
    struct rule *rules;
    uint32_t n_rules, cap_rules;
    uint64_t (*sets)[4];
    uint32_t n_sets, cap_sets;
    uint64_t n_syms;   /* symbols so far, against GRAMMAR_MAX_SYMS */
    uint32_t any_rule; /* the rule of `.`, UINT32_MAX until used */
    int depth;
    struct names names;
};

#define MAX_DEPTH 256 /* nested groups: the parser recurses */

static int fail(struct parser *ps, const char *what)
{
    return strata_errf(STRATA_EINVAL, "grammar line %u column %u: %s", ps->line,
                       (unsigned)(ps->p - ps->line_start) + 1, what);
}

static int add_rule(struct parser *ps, const char *name, size_t len, uint32_t *out)
{
    if (ps->n_rules == ps->cap_rules) {
        uint32_t cap = ps->cap_rules ? 2 * ps->cap_rules : 16;
        struct rule *r = realloc(ps->rules, (size_t)cap * sizeof *r);
        if (!r) return STRATA_ENOMEM;
        ps->rules = r;
        ps->cap_rules = cap;
    }
    if (ps->n_rules >= SYM_VAL(~0u)) return strata_errf(STRATA_ELIMIT, "grammar: too many rules");
    struct rule *r = &ps->rules[ps->n_rules];
    memset(r, 0, sizeof *r);
    if (!(r->name = malloc(len + 1))) return STRATA_ENOMEM;
    memcpy(r->name, name, len);
    r->name[len] = 0;
    r->line = ps->line;
    *out = ps->n_rules++;
    return 0;
}

static uint32_t name_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static int names_grow(struct parser *ps)
{
    struct names *t = &ps->names;
    const uint32_t cap = t->cap ? 2 * t->cap : 64;
    uint32_t *slot = calloc(cap, sizeof *slot);
    if (!slot) return STRATA_ENOMEM;
    for (uint32_t i = 0; i < t->cap; i++) {
        if (!t->slot[i]) continue;
        const char *nm = ps->rules[t->slot[i] - 1].name;
        uint32_t j = name_hash(nm, strlen(nm)) & (cap - 1);
        while (slot[j])
            j = (j + 1) & (cap - 1);
        slot[j] = t->slot[i];
    }
    free(t->slot);
    t->slot = slot;
    t->cap = cap;
    return 0;
}

/* rule_named: the rule called name, made (undefined) on first use. */
static int rule_named(struct parser *ps, const char *name, size_t len, uint32_t *out)
{
    struct names *t = &ps->names;
    int rv;
    if (2 * (t->n + 1) > t->cap && (rv = names_grow(ps)) != 0) return rv;
    uint32_t j = name_hash(name, len) & (t->cap - 1);
    for (; t->slot[j]; j = (j + 1) & (t->cap - 1)) {
        const char *nm = ps->rules[t->slot[j] - 1].name;
        if (strlen(nm) == len && memcmp(nm, name, len) == 0) {
            *out = t->slot[j] - 1;
            return 0;
        }
    }
    if ((rv = add_rule(ps, name, len, out)) != 0) return rv;
    t->slot[j] = *out + 1;
    t->n++;
    return 0;
}

/* new_alt appends an empty alternative to rule r and returns it. */
static struct vec *new_alt(struct parser *ps, uint32_t r)
{
    struct rule *ru = &ps->rules[r];
    if (ru->n_alts == ru->cap_alts) {
        uint32_t cap = ru->cap_alts ? 2 * ru->cap_alts : 2;
        struct vec *a = realloc(ru->alts, (size_t)cap * sizeof *a);
        if (!a) return NULL;
        ru->alts = a;
        ru->cap_alts = cap;
    }
    struct vec *a = &ru->alts[ru->n_alts++];
    memset(a, 0, sizeof *a);
    return a;
}

static int push_sym(struct parser *ps, struct vec *a, uint32_t s)
{
    if (++ps->n_syms > GRAMMAR_MAX_SYMS)
        return strata_errf(STRATA_ELIMIT,
                           "grammar: more than %u symbols once repetitions are "
                           "expanded: lower the repetition counts",
                           GRAMMAR_MAX_SYMS);
    return vec_push(a, s);
}

static int set_id(struct parser *ps, const uint64_t *set, uint32_t *out)
{
    for (uint32_t i = 0; i < ps->n_sets; i++)
        if (memcmp(ps->sets[i], set, 32) == 0) {
            *out = i;
            return 0;
        }
    if (ps->n_sets == ps->cap_sets) {
        uint32_t cap = ps->cap_sets ? 2 * ps->cap_sets : 16;
        uint64_t(*s)[4] = realloc(ps->sets, (size_t)cap * sizeof *s);
        if (!s) return STRATA_ENOMEM;
        ps->sets = s;
        ps->cap_sets = cap;
    }
    memcpy(ps->sets[ps->n_sets], set, 32);
    *out = ps->n_sets++;
    return 0;
}

static int byte_sym(struct parser *ps, unsigned lo, unsigned hi, uint32_t *out)
{
    uint64_t s[4] = {0};
    for (unsigned b = lo; b <= hi; b++)
        s[b >> 6] |= 1ull << (b & 63);
    uint32_t id;
    int rv = set_id(ps, s, &id);
    *out = SYM_TERM | id;
    return rv;
}

static int utf8_encode(uint32_t c, uint8_t *o)
{
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xc0 | c >> 6);
        o[1] = (uint8_t)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xe0 | c >> 12);
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
        o[2] = (uint8_t)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (uint8_t)(0xf0 | c >> 18);
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
    o[3] = (uint8_t)(0x80 | (c & 0x3f));
    return 4;
}

/* ---- lexing ---------------------------------------------------------------------------------- */

static void skip_space(struct parser *ps, bool newlines)
{
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == ' ' || c == '\t')
            ps->p++;
        else if (c == '#')
            while (ps->p < ps->end && *ps->p != '\n')
                ps->p++;
        else if (newlines && (c == '\r' || c == '\n')) {
            if (c == '\n') {
                ps->line++;
                ps->line_start = ps->p + 1;
            }
            ps->p++;
        } else
            break;
    }
}

static bool word_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static int hex(struct parser *ps, int n, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < n; i++, ps->p++) {
        if (ps->p >= ps->end) return fail(ps, "a \\x, \\u or \\U escape ends early");
        char c = *ps->p;
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return fail(ps, "a \\x, \\u or \\U escape needs hexadecimal digits");
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* read_char reads one character of a literal or class (an escape or a UTF-8 sequence). */
static int read_char(struct parser *ps, uint32_t *out)
{
    if (ps->p >= ps->end) return fail(ps, "unexpected end of the grammar");
    const uint8_t c = (uint8_t)*ps->p++;
    if (c == '\\') {
        if (ps->p >= ps->end) return fail(ps, "an escape ends the grammar");
        const char e = *ps->p++;
        int rv = 0;
        switch (e) {
        case 'x':
            rv = hex(ps, 2, out);
            break;
        case 'u':
            rv = hex(ps, 4, out);
            break;
        case 'U':
            rv = hex(ps, 8, out);
            break;
        case 'n':
            *out = '\n';
            break;
        case 'r':
            *out = '\r';
            break;
        case 't':
            *out = '\t';
            break;
        default:
            if ((unsigned char)e < 0x20 || (unsigned char)e >= 0x7f || word_char(e))
                return fail(ps, "unknown escape: use \\n \\r \\t \\xHH \\uHHHH \\UHHHHHHHH or "
                                "a backslash before punctuation");
            *out = (uint8_t)e;
        }
        if (rv) return rv;
        if (*out > 0x10ffff) return fail(ps, "a code point above U+10FFFF");
        return 0;
    }
    if (c < 0x80) {
        if (c == '\n') return fail(ps, "a newline inside a literal or class: write \\n");
        *out = c;
        return 0;
    }
    int n = c >= 0xc2 && c < 0xe0 ? 1 : c >= 0xe0 && c < 0xf0 ? 2 : c >= 0xf0 && c < 0xf5 ? 3 : -1;
    if (n < 0 || ps->end - ps->p < n) return fail(ps, "invalid UTF-8 in the grammar");
    uint32_t v = c & (0x3f >> n);
    for (int i = 0; i < n; i++) {
        uint8_t d = (uint8_t)*ps->p++;
        if ((d & 0xc0) != 0x80) return fail(ps, "invalid UTF-8 in the grammar");
        v = v << 6 | (d & 0x3f);
    }
    if ((n == 2 && v < 0x800) || (n == 3 && v < 0x10000) || (v >= 0xd800 && v < 0xe000) ||
        v > 0x10ffff)
        return fail(ps, "invalid UTF-8 in the grammar");
    *out = v;
    return 0;
}

/* ---- code point ranges to UTF-8 byte sequences ------------------------------------------------
 */

struct cp_range {
    uint32_t lo, hi;
};

/* utf8_seqs splits [lo, hi] (no surrogates, one encoded length or split here) into sequences of
 * byte ranges, each appended to rule r as an alternative (RE2's and Rust regex's method). */
static int utf8_seqs(struct parser *ps, uint32_t r, uint32_t lo, uint32_t hi)
{
    static const uint32_t max_of_len[] = {0x7f, 0x7ff, 0xffff, 0x10ffff};
    for (int i = 0; i < 3; i++)
        if (lo <= max_of_len[i] && hi > max_of_len[i]) {
            int rv = utf8_seqs(ps, r, lo, max_of_len[i]);
            return rv ? rv : utf8_seqs(ps, r, max_of_len[i] + 1, hi);
        }
    for (int i = 1; i < 4; i++) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                int rv = utf8_seqs(ps, r, lo, lo | m);
                return rv ? rv : utf8_seqs(ps, r, (lo | m) + 1, hi);
            }
            if ((hi & m) != m) {
                int rv = utf8_seqs(ps, r, lo, (hi & ~m) - 1);
                return rv ? rv : utf8_seqs(ps, r, hi & ~m, hi);
            }
        }
    }
    uint8_t a[4], b[4];
    const int n = utf8_encode(lo, a);
    utf8_encode(hi, b);
    struct vec *alt = new_alt(ps, r);
    if (!alt) return STRATA_ENOMEM;
    for (int i = 0; i < n; i++) {
        uint32_t s;
        int rv = byte_sym(ps, a[i], b[i], &s);
        if (rv || (rv = push_sym(ps, &ps->rules[r].alts[ps->rules[r].n_alts - 1], s))) return rv;
    }
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const struct cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* class_sym makes the symbol of a set of code point ranges: one byte set when it is all ASCII,
 * else a rule of the ASCII set and one alternative per UTF-8 sequence. */
static int class_sym(struct parser *ps, struct cp_range *rg, uint32_t n, bool negate, uint32_t *out)
{
    qsort(rg, n, sizeof *rg, cmp_range);
    /* normalize: merged, negated if asked, surrogates cut out */
    struct cp_range *m = malloc(((size_t)n + 2) * 2 * sizeof *m);
    if (!m) return STRATA_ENOMEM;
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (k && rg[i].lo <= m[k - 1].hi + 1) {
            if (rg[i].hi > m[k - 1].hi) m[k - 1].hi = rg[i].hi;
        } else
            m[k++] = rg[i];
    }
    if (negate) {
        struct cp_range *c = malloc(((size_t)k + 1) * sizeof *c);
        if (!c) {
            free(m);
            return STRATA_ENOMEM;
        }
        uint32_t nc = 0, next = 0;
        for (uint32_t i = 0; i < k; i++) {
            if (m[i].lo > next) c[nc++] = (struct cp_range){next, m[i].lo - 1};
            next = m[i].hi + 1;
        }
        if (next <= 0x10ffff) c[nc++] = (struct cp_range){next, 0x10ffff};
        memcpy(m, c, nc * sizeof *c);
        k = nc;
        free(c);
    }
    uint32_t k2 = 0;
    struct cp_range *f = m + n + 2; /* the second half of m */
    for (uint32_t i = 0; i < k; i++) {
        uint32_t lo = m[i].lo, hi = m[i].hi;
        if (lo < 0xd800 && hi > 0xdfff) {
            f[k2++] = (struct cp_range){lo, 0xd7ff};
            f[k2++] = (struct cp_range){0xe000, hi};
        } else if (lo >= 0xd800 && hi <= 0xdfff)
            continue;
        else if (lo >= 0xd800 && lo <= 0xdfff)
            f[k2++] = (struct cp_range){0xe000, hi};
        else if (hi >= 0xd800 && hi <= 0xdfff)
            f[k2++] = (struct cp_range){lo, 0xd7ff};
        else
            f[k2++] = m[i];
    }
    uint64_t ascii[4] = {0};
    bool wide = false;
    for (uint32_t i = 0; i < k2; i++) {
        for (uint32_t c = f[i].lo; c <= f[i].hi && c < 0x80; c++)
            ascii[c >> 6] |= 1ull << (c & 63);
        if (f[i].hi >= 0x80) wide = true;
    }
    int rv = 0;
    if (!wide) {
        uint32_t id;
        rv = set_id(ps, ascii, &id);
        *out = SYM_TERM | id;
    } else {
        uint32_t r, id;
        if ((rv = add_rule(ps, "class", 5, &r)) != 0) goto out;
        ps->rules[r].defined = true;
        if (ascii[0] | ascii[1]) {
            struct vec *alt = new_alt(ps, r);
            if (!alt) {
                rv = STRATA_ENOMEM;
                goto out;
            }
            if ((rv = set_id(ps, ascii, &id)) || (rv = push_sym(ps, alt, SYM_TERM | id))) goto out;
        }
        for (uint32_t i = 0; i < k2 && !rv; i++)
            if (f[i].hi >= 0x80) rv = utf8_seqs(ps, r, f[i].lo < 0x80 ? 0x80 : f[i].lo, f[i].hi);
        *out = SYM_RULE | r;
    }
out:
    free(m);
    return rv;
}

static int parse_class(struct parser *ps, uint32_t *out)
{
    bool negate = ps->p < ps->end && *ps->p == '^';
    if (negate) ps->p++;
    struct cp_range *rg = NULL;
    uint32_t n = 0, cap = 0;
    int rv = 0;
    while (true) {
        if (ps->p >= ps->end) {
            rv = fail(ps, "a character class is not closed: add ']'");
            goto out;
        }
        if (*ps->p == ']') {
            ps->p++;
            break;
        }
        uint32_t lo, hi;
        if ((rv = read_char(ps, &lo)) != 0) goto out;
        hi = lo;
        if (ps->end - ps->p >= 2 && ps->p[0] == '-' && ps->p[1] != ']') {
            ps->p++;
            if ((rv = read_char(ps, &hi)) != 0) goto out;
            if (hi < lo) {
                rv = fail(ps, "a character range ends below its start");
                goto out;
            }
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            struct cp_range *g = realloc(rg, ((size_t)cap + 2) * 2 * sizeof *g);
            if (!g) {
                rv = STRATA_ENOMEM;
                goto out;
            }
            rg = g;
        }
        rg[n++] = (struct cp_range){lo, hi};
    }
    if (!rg && !(rg = malloc(4 * sizeof *rg))) {
        rv = STRATA_ENOMEM;
        goto out;
    }
    rv = class_sym(ps, rg, n, negate, out);
out:
    free(rg);
    return rv;
}

/* ---- rules ----------------------------------------------------------------------------------- */

static int parse_alternates(struct parser *ps, uint32_t r, bool nested);

/* wrap makes a rule of the symbols seq[from..n) (one alternative) and leaves its reference. */
static int wrap(struct parser *ps, struct vec *seq, uint32_t from, uint32_t *item)
{
    if (seq->n - from == 1) {
        *item = seq->v[from];
        return 0;
    }
    uint32_t r;
    int rv = add_rule(ps, "group", 5, &r);
    if (rv) return rv;
    ps->rules[r].defined = true;
    struct vec *alt = new_alt(ps, r);
    if (!alt) return STRATA_ENOMEM;
    for (uint32_t i = from; i < seq->n; i++)
        if ((rv = push_sym(ps, alt, seq->v[i])) != 0) return rv;
    *item = SYM_RULE | r;
    return 0;
}

/* repeat_rule makes `R ::= item R | ` (star) or `R ::= item next | ` (one optional more). */
static int repeat_rule(struct parser *ps, uint32_t item, bool star, uint32_t next, uint32_t *out)
{
    uint32_t r = 0;
    int rv = add_rule(ps, star ? "star" : "opt", star ? 4 : 3, &r);
    if (rv) return rv;
    ps->rules[r].defined = true;
    struct vec *a = new_alt(ps, r);
    if (!a || (rv = push_sym(ps, a, item)) != 0) return a ? rv : STRATA_ENOMEM;
    uint32_t tail = star ? SYM_RULE | r : next;
    if (tail != SYM_END) {
        a = &ps->rules[r].alts[0];
        if ((rv = push_sym(ps, a, tail)) != 0) return rv;
    }
    if (!new_alt(ps, r)) return STRATA_ENOMEM;
    *out = SYM_RULE | r;
    return 0;
}

static int parse_count(struct parser *ps, uint64_t *out)
{
    uint64_t v = 0;
    const char *s = ps->p;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        v = v * 10 + (uint64_t)(*ps->p++ - '0');
        if (v > GRAMMAR_MAX_SYMS)
            return strata_errf(STRATA_ELIMIT, "grammar line %u: a repetition count above %u",
                               ps->line, GRAMMAR_MAX_SYMS);
    }
    if (ps->p == s) return fail(ps, "expected a number in {m,n}");
    *out = v;
    return 0;
}

/* postfix applies *, +, ? or {m,n} to the element seq[from..n). */
static int postfix(struct parser *ps, struct vec *seq, uint32_t from)
{
    const char op = *ps->p++;
    uint64_t lo = 0, hi = UINT64_MAX;
    int rv;
    if (op == '*')
        lo = 0;
    else if (op == '+')
        lo = 1;
    else if (op == '?')
        hi = 1;
    else {
        skip_space(ps, true);
        if ((rv = parse_count(ps, &lo)) != 0) return rv;
        skip_space(ps, true);
        hi = lo;
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            skip_space(ps, true);
            hi = UINT64_MAX;
            if (ps->p < ps->end && *ps->p != '}' && (rv = parse_count(ps, &hi)) != 0) return rv;
            skip_space(ps, true);
        }
        if (ps->p >= ps->end || *ps->p != '}') return fail(ps, "expected '}' after {m,n}");
        ps->p++;
        if (hi < lo) return fail(ps, "a repetition {m,n} with n below m");
    }
    uint32_t item;
    if ((rv = wrap(ps, seq, from, &item)) != 0) return rv;
    seq->n = from;
    for (uint64_t i = 0; i < lo; i++)
        if ((rv = push_sym(ps, seq, item)) != 0) return rv;
    if (hi == UINT64_MAX) {
        uint32_t star;
        if ((rv = repeat_rule(ps, item, true, 0, &star)) != 0) return rv;
        return push_sym(ps, seq, star);
    }
    uint32_t next = SYM_END;
    for (uint64_t i = lo; i < hi; i++)
        if ((rv = repeat_rule(ps, item, false, next, &next)) != 0) return rv;
    return next != SYM_END ? push_sym(ps, seq, next) : 0;
}

static int parse_sequence(struct parser *ps, uint32_t r, bool nested)
{
    struct vec *seq = new_alt(ps, r);
    if (!seq) return STRATA_ENOMEM;
    const uint32_t alt = ps->rules[r].n_alts - 1;
    uint32_t last = UINT32_MAX; /* where the last element starts */
    int rv = 0;
    while (ps->p < ps->end && rv == 0) {
        seq = &ps->rules[r].alts[alt]; /* new rules may move the rules array, not alts */
        const char c = *ps->p;
        const uint32_t start = seq->n;
        if (c == '"') {
            ps->p++;
            while (rv == 0) {
                if (ps->p >= ps->end) return fail(ps, "a literal is not closed: add '\"'");
                if (*ps->p == '"') {
                    ps->p++;
                    break;
                }
                uint32_t cp, s;
                uint8_t b[4];
                if ((rv = read_char(ps, &cp)) != 0) return rv;
                int n = utf8_encode(cp, b);
                for (int i = 0; i < n && rv == 0; i++)
                    if ((rv = byte_sym(ps, b[i], b[i], &s)) == 0) rv = push_sym(ps, seq, s);
            }
            if (seq->n == start) { /* "" matches the empty string: an element of no symbols */
                last = UINT32_MAX;
                skip_space(ps, nested);
                continue;
            }
        } else if (c == '[') {
            ps->p++;
            uint32_t s;
            if ((rv = parse_class(ps, &s)) == 0) rv = push_sym(ps, &ps->rules[r].alts[alt], s);
        } else if (c == '.') {
            ps->p++;
            if (ps->any_rule == UINT32_MAX) {
                struct cp_range all = {0, 0x10ffff};
                uint32_t s;
                struct cp_range *rg = malloc(4 * sizeof *rg);
                if (!rg) return STRATA_ENOMEM;
                rg[0] = all;
                rv = class_sym(ps, rg, 1, false, &s);
                free(rg);
                if (rv) return rv;
                ps->any_rule = s;
            }
            rv = push_sym(ps, &ps->rules[r].alts[alt], ps->any_rule);
        } else if (word_char(c)) {
            const char *w = ps->p;
            while (ps->p < ps->end && word_char(*ps->p))
                ps->p++;
            uint32_t id;
            if ((rv = rule_named(ps, w, (size_t)(ps->p - w), &id)) == 0)
                rv = push_sym(ps, &ps->rules[r].alts[alt], SYM_RULE | id);
        } else if (c == '(') {
            ps->p++;
            if (++ps->depth > MAX_DEPTH) return fail(ps, "groups nested too deep");
            uint32_t g;
            if ((rv = add_rule(ps, "group", 5, &g)) != 0) return rv;
            ps->rules[g].defined = true;
            skip_space(ps, true);
            if ((rv = parse_alternates(ps, g, true)) != 0) return rv;
            ps->depth--;
            if (ps->p >= ps->end || *ps->p != ')') return fail(ps, "expected ')'");
            ps->p++;
            rv = push_sym(ps, &ps->rules[r].alts[alt], SYM_RULE | g);
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == UINT32_MAX) return fail(ps, "a repetition operator without an element");
            rv = postfix(ps, &ps->rules[r].alts[alt], last);
            last = UINT32_MAX; /* x** is refused, as llama.cpp does */
            if (rv == 0) skip_space(ps, nested);
            continue;
        } else if (c == '<') { /* <[id]>: one control token, as its reserved bytes */
            uint64_t id;
            if (ps->end - ps->p < 2 || ps->p[1] != '[')
                return fail(ps, "a token reference is <[id]> (token names are not supported)");
            ps->p += 2;
            if ((rv = parse_count(ps, &id)) != 0) return rv;
            if (ps->end - ps->p < 2 || memcmp(ps->p, "]>", 2) != 0 || id >= GRAMMAR_MAX_TOKEN_ID)
                return fail(ps, "a token reference is <[id]> with an id below 2^21");
            ps->p += 2;
            char b[GRAMMAR_TOKEN_BYTES];
            grammar_token_bytes((int32_t)id, b);
            for (int i = 0; i < GRAMMAR_TOKEN_BYTES && rv == 0; i++) {
                uint32_t sy;
                if ((rv = byte_sym(ps, (uint8_t)b[i], (uint8_t)b[i], &sy)) == 0)
                    rv = push_sym(ps, &ps->rules[r].alts[alt], sy);
            }
        } else
            break;
        last = start;
        if (rv == 0) skip_space(ps, nested);
    }
    return rv;
}

static int parse_alternates(struct parser *ps, uint32_t r, bool nested)
{
    int rv = parse_sequence(ps, r, nested);
    while (rv == 0 && ps->p < ps->end && *ps->p == '|') {
        ps->p++;
        skip_space(ps, true);
        rv = parse_sequence(ps, r, nested);
    }
    return rv;
}

/* ---- checks and compilation ------------------------------------------------------------------ */

/* left_recursive finds a rule that can reach itself without consuming a byte. nullable[] is
 * computed to a fixpoint first. Returns the rule, or UINT32_MAX. */
static uint32_t left_recursive(const struct parser *ps, bool *nullable, uint8_t *mark,
                               uint32_t *stack)
{
    const uint32_t n = ps->n_rules;
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < n; r++) {
            if (nullable[r]) continue;
            for (uint32_t a = 0; a < ps->rules[r].n_alts && !nullable[r]; a++) {
                const struct vec *v = &ps->rules[r].alts[a];
                uint32_t i = 0;
                while (i < v->n && SYM_KIND(v->v[i]) == SYM_RULE && nullable[SYM_VAL(v->v[i])])
                    i++;
                if (i == v->n) nullable[r] = changed = true;
            }
        }
    }
    /* iterative DFS over "r may start with s" edges; mark: 0 new, 1 on the path, 2 done */
    for (uint32_t root = 0; root < n; root++) {
        if (mark[root]) continue;
        uint32_t sp = 0;
        stack[sp++] = root;
        mark[root] = 1;
        /* each frame's next edge is found by scanning again (a rule after a nullable one is
         * reached once that one is done): O(edges^2) at worst, fine for thousands of rules */
        while (sp) {
            const uint32_t r = stack[sp - 1];
            uint32_t next = UINT32_MAX;
            for (uint32_t a = 0; a < ps->rules[r].n_alts && next == UINT32_MAX; a++) {
                const struct vec *v = &ps->rules[r].alts[a];
                for (uint32_t i = 0; i < v->n && SYM_KIND(v->v[i]) == SYM_RULE; i++) {
                    const uint32_t s = SYM_VAL(v->v[i]);
                    if (mark[s] == 1) return s;
                    if (mark[s] == 0) {
                        next = s;
                        break;
                    }
                    if (!nullable[s]) break;
                }
            }
            if (next == UINT32_MAX) {
                mark[r] = 2;
                sp--;
            } else {
                mark[next] = 1;
                stack[sp++] = next;
            }
        }
    }
    return UINT32_MAX;
}

static int compile(struct parser *ps, uint32_t root, struct grammar *g)
{
    uint64_t n_sym = 0, n_alt = 0;
    for (uint32_t r = 0; r < ps->n_rules; r++) {
        n_alt += ps->rules[r].n_alts;
        for (uint32_t a = 0; a < ps->rules[r].n_alts; a++)
            n_sym += ps->rules[r].alts[a].n + 1;
    }
    g->sym = malloc((n_sym + 1) * sizeof *g->sym);
    g->alt_pos = malloc((n_alt + 1) * sizeof *g->alt_pos);
    g->rule_alt = malloc(((size_t)ps->n_rules + 1) * sizeof *g->rule_alt);
    g->set = malloc(((size_t)ps->n_sets + 1) * sizeof *g->set);
    if (!g->sym || !g->alt_pos || !g->rule_alt || !g->set) return STRATA_ENOMEM;
    uint32_t s = 0, al = 0;
    for (uint32_t r = 0; r < ps->n_rules; r++) {
        g->rule_alt[r] = al;
        for (uint32_t a = 0; a < ps->rules[r].n_alts; a++) {
            g->alt_pos[al++] = s;
            const struct vec *v = &ps->rules[r].alts[a];
            if (v->n) memcpy(g->sym + s, v->v, v->n * sizeof *v->v);
            s += v->n;
            g->sym[s++] = SYM_END;
        }
    }
    g->rule_alt[ps->n_rules] = al;
    g->n_sym = s;
    g->n_rules = ps->n_rules;
    if (ps->n_sets) memcpy(g->set, ps->sets, (size_t)ps->n_sets * sizeof *g->set);
    g->n_set = ps->n_sets;
    g->root = root;
    return 0;
}

/* parse_trigger reads a directive line after its '%': `trigger` or `trigger-start`, then literals
 * and token references <[id]> whose bytes, joined, are one trigger of a lazy grammar. */
static int parse_trigger(struct parser *ps, struct grammar *g)
{
    const char *w = ps->p;
    while (ps->p < ps->end && word_char(*ps->p))
        ps->p++;
    const size_t wl = (size_t)(ps->p - w);
    const bool start = wl == 13 && memcmp(w, "trigger-start", 13) == 0;
    if (!start && !(wl == 7 && memcmp(w, "trigger", 7) == 0))
        return fail(ps, "unknown directive: %trigger and %trigger-start are known");
    if (g->n_trig == GRAMMAR_MAX_TRIGGERS) return fail(ps, "too many triggers (at most 16)");
    struct grammar_trigger *t = &g->trig[g->n_trig];
    memset(t, 0, sizeof *t);
    t->start = start;
    skip_space(ps, false);
    int rv = 0;
    while (rv == 0 && ps->p < ps->end && *ps->p != '\n' && *ps->p != '\r') {
        uint8_t b[GRAMMAR_TOKEN_BYTES];
        int n = 0;
        if (*ps->p == '"') {
            ps->p++;
            for (;;) {
                if (ps->p >= ps->end) return fail(ps, "a literal is not closed: add '\"'");
                if (*ps->p == '"') {
                    ps->p++;
                    break;
                }
                uint32_t cp;
                if ((rv = read_char(ps, &cp)) != 0) return rv;
                n = utf8_encode(cp, b);
                if (t->len + (uint32_t)n > GRAMMAR_MAX_TRIGGER)
                    return fail(ps, "a trigger of more than 128 bytes");
                memcpy(t->b + t->len, b, (size_t)n);
                t->len += (uint32_t)n;
            }
        } else if (*ps->p == '<' && ps->end - ps->p > 1 && ps->p[1] == '[') {
            uint64_t id;
            ps->p += 2;
            if ((rv = parse_count(ps, &id)) != 0) return rv;
            if (ps->end - ps->p < 2 || memcmp(ps->p, "]>", 2) != 0 || id >= GRAMMAR_MAX_TOKEN_ID)
                return fail(ps, "a token reference is <[id]> with an id below 2^21");
            ps->p += 2;
            if (t->len + GRAMMAR_TOKEN_BYTES > GRAMMAR_MAX_TRIGGER)
                return fail(ps, "a trigger of more than 128 bytes");
            grammar_token_bytes((int32_t)id, (char *)t->b + t->len);
            t->len += GRAMMAR_TOKEN_BYTES;
        } else
            return fail(ps, "a trigger is literals and token references <[id]>");
        skip_space(ps, false);
    }
    if (!t->len) return fail(ps, "an empty trigger");
    g->n_trig++;
    return 0;
}

int grammar_parse(const char *text, size_t len, struct grammar **out)
{
    *out = NULL;
    if (len > GRAMMAR_MAX_BYTES)
        return strata_errf(STRATA_ELIMIT, "a grammar of %zu bytes: at most %u", len,
                           GRAMMAR_MAX_BYTES);
    struct parser ps = {.s = text,
                        .end = text + len,
                        .p = text,
                        .line = 1,
                        .line_start = text,
                        .any_rule = UINT32_MAX};
    struct grammar *g = calloc(1, sizeof *g);
    bool *nullable = NULL;
    uint8_t *mark = NULL;
    uint32_t *stack = NULL;
    int rv = g ? 0 : STRATA_ENOMEM;
    if (rv) goto out;
    skip_space(&ps, true);
    while (ps.p < ps.end) {
        if (*ps.p == '%') { /* a lazy grammar's trigger */
            ps.p++;
            if ((rv = parse_trigger(&ps, g)) != 0) goto out;
            skip_space(&ps, true);
            continue;
        }
        const char *w = ps.p;
        while (ps.p < ps.end && word_char(*ps.p))
            ps.p++;
        if (ps.p == w) {
            rv = fail(&ps, "expected a rule name");
            goto out;
        }
        uint32_t r;
        if ((rv = rule_named(&ps, w, (size_t)(ps.p - w), &r)) != 0) goto out;
        if (ps.rules[r].defined) {
            rv = strata_errf(STRATA_EINVAL, "grammar line %u: rule '%s' is defined twice", ps.line,
                             ps.rules[r].name);
            goto out;
        }
        ps.rules[r].defined = true;
        ps.rules[r].line = ps.line;
        skip_space(&ps, false);
        if (ps.end - ps.p < 3 || memcmp(ps.p, "::=", 3) != 0) {
            rv = fail(&ps, "expected '::=' after the rule name");
            goto out;
        }
        ps.p += 3;
        skip_space(&ps, true);
        if ((rv = parse_alternates(&ps, r, false)) != 0) goto out;
        if (ps.p < ps.end && *ps.p != '\n' && *ps.p != '\r') {
            rv = fail(&ps, *ps.p == ')' ? "unexpected ')'" : "unexpected character");
            goto out;
        }
        skip_space(&ps, true);
    }
    uint32_t root = UINT32_MAX;
    for (uint32_t i = 0; i < ps.n_rules; i++) {
        if (!ps.rules[i].defined) {
            rv = strata_errf(STRATA_EINVAL, "grammar line %u: rule '%s' is used but not defined",
                             ps.rules[i].line, ps.rules[i].name);
            goto out;
        }
        if (strcmp(ps.rules[i].name, "root") == 0) root = i;
    }
    if (root == UINT32_MAX) {
        rv = strata_errf(STRATA_EINVAL, "grammar: no rule 'root' (the start rule)");
        goto out;
    }
    nullable = calloc(ps.n_rules, sizeof *nullable);
    mark = calloc(ps.n_rules, 1);
    stack = malloc(ps.n_rules * sizeof *stack);
    if (!nullable || !mark || !stack) {
        rv = STRATA_ENOMEM;
        goto out;
    }
    const uint32_t lr = left_recursive(&ps, nullable, mark, stack);
    if (lr != UINT32_MAX) {
        rv = strata_errf(STRATA_EINVAL,
                         "grammar line %u: rule '%s' is left-recursive (it can reach itself "
                         "before matching a character; an empty item under * or + does too): "
                         "rewrite it with a repetition",
                         ps.rules[lr].line, ps.rules[lr].name);
        goto out;
    }
    rv = compile(&ps, root, g);
out:
    for (uint32_t i = 0; i < ps.n_rules; i++) {
        for (uint32_t a = 0; a < ps.rules[i].n_alts; a++)
            free(ps.rules[i].alts[a].v);
        free(ps.rules[i].alts);
        free(ps.rules[i].name);
    }
    free(ps.rules);
    free(ps.names.slot);
    free(ps.sets);
    free(nullable);
    free(mark);
    free(stack);
    if (rv) {
        grammar_fini(g);
        return rv;
    }
    *out = g;
    return 0;
}

void grammar_fini(struct grammar *g)
{
    if (!g) return;
    free(g->sym);
    free(g->alt_pos);
    free(g->rule_alt);
    free(g->set);
    free(g);
}

void grammar_token_bytes(int32_t id, char out[GRAMMAR_TOKEN_BYTES])
{
    out[0] = (char)0xff;
    out[1] = (char)(0x80 | ((id >> 14) & 0x7f));
    out[2] = (char)(0x80 | ((id >> 7) & 0x7f));
    out[3] = (char)(0x80 | (id & 0x7f));
}

uint32_t grammar_n_rules(const struct grammar *g)
{
    return g->n_rules;
}
