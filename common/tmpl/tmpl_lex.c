/* tmpl_lex — splits a Jinja template into text and tag tokens, applying Jinja2's whitespace
 * control exactly as its lexer does: `-` on a tag strips all whitespace on that side,
 * trim_blocks drops the one newline after a block or comment tag, lstrip_blocks drops the spaces
 * and tabs between a line start and a block or comment tag. Newlines are normalised to "\n" and
 * one trailing newline of the template is dropped (keep_trailing_newline=False). */
#include "common/tmpl/tmpl_int.h"

#include "common/base/err.h"

#include <stdlib.h>
#include <string.h>

struct lx {
    struct tmpl_arena *a;
    const char *s;
    size_t n, pos;
    int line;
    struct ttoken *v;
    size_t nv, cap, max;
    bool line_starting; /* the previous token ended a line: lstrip_blocks may apply */
};

static int lx_err(struct lx *l, const char *what)
{
    return strata_errf(STRATA_EFORMAT, "line %d: %s", l->line, what);
}

static int emit(struct lx *l, enum ttok t, const char *s, size_t n, int line)
{
    if (l->nv == l->max)
        return strata_errf(STRATA_ELIMIT, "template has more than %zu tokens: raise max_source",
                           l->max);
    if (l->nv == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        struct ttoken *v = realloc(l->v, cap * sizeof *v);
        if (!v) return STRATA_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->nv++] = (struct ttoken){.t = t, .line = line, .s = s, .n = n};
    return 0;
}

static size_t count_nl(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

/* ws_before returns how many bytes of whitespace end s[0..n). */
static size_t ws_before(const char *s, size_t n)
{
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xc0) == 0x80)
            st--;
        uint32_t cp;
        tmpl_u8_dec(s + st, end - st, &cp);
        if (!tmpl_u_isspace(cp)) break;
        end = st;
    }
    return n - end;
}

/* ws_after returns how many bytes of whitespace start s[0..n). */
static size_t ws_after(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = tmpl_u8_dec(s + i, n - i, &cp);
        if (!tmpl_u_isspace(cp)) break;
        i += k;
    }
    return i;
}

/* text emits the data before a tag opening with sign ('-', '+' or other) of kind c ('{', '%',
 * '#'), after the opening tag's whitespace control. */
static int text(struct lx *l, size_t from, size_t to, char sign, char c)
{
    const char *t = l->s + from;
    size_t n = to - from;
    if (sign == '-') {
        n -= ws_before(t, n);
    } else if (sign != '+' && c != '{') {
        size_t lpos = n;
        while (lpos > 0 && t[lpos - 1] != '\n')
            lpos--;
        if ((lpos > 0 || l->line_starting) && lpos < n && ws_after(t + lpos, n - lpos) == n - lpos)
            n = lpos;
    }
    int rv = n ? emit(l, TK_TEXT, t, n, l->line) : 0;
    l->line += (int)count_nl(l->s + from, to - from);
    return rv;
}

/* tag_end consumes what follows a closing tag: all whitespace after `-`, one newline after a
 * block or comment tag (trim_blocks) unless `+`. */
static void tag_end(struct lx *l, char sign, bool block)
{
    size_t k = 0;
    if (sign == '-')
        k = ws_after(l->s + l->pos, l->n - l->pos);
    else if (sign != '+' && block && l->pos < l->n && l->s[l->pos] == '\n')
        k = 1;
    l->line += (int)count_nl(l->s + l->pos, k);
    l->pos += k;
    l->line_starting = k > 0 && l->s[l->pos - 1] == '\n';
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* string lexes a quoted literal at l->pos and decodes Python's escapes (Jinja2 runs the literal
 * through "unicode-escape"); an unknown escape keeps its backslash as Python does. */
static int string(struct lx *l)
{
    char q = l->s[l->pos];
    int line = l->line;
    size_t i = l->pos + 1, end;
    for (end = i; end < l->n && l->s[end] != q; end++)
        if (l->s[end] == '\\') end++;
    if (end >= l->n) return lx_err(l, "unterminated string literal");
    char *o = tmpl_arena_alloc(l->a, end - i + 1);
    if (!o) return STRATA_ENOMEM;
    size_t k = 0;
    while (i < end) {
        char c = l->s[i++];
        if (c != '\\') {
            o[k++] = c;
            continue;
        }
        char e = l->s[i++];
        int digits = 0, base = 16;
        switch (e) {
        case 'n':
            o[k++] = '\n';
            break;
        case 't':
            o[k++] = '\t';
            break;
        case 'r':
            o[k++] = '\r';
            break;
        case 'a':
            o[k++] = '\a';
            break;
        case 'b':
            o[k++] = '\b';
            break;
        case 'f':
            o[k++] = '\f';
            break;
        case 'v':
            o[k++] = '\v';
            break;
        case '\\':
            o[k++] = '\\';
            break;
        case '\'':
            o[k++] = '\'';
            break;
        case '"':
            o[k++] = '"';
            break;
        case '\n':
            break;
        case 'x':
            digits = 2;
            break;
        case 'u':
            digits = 4;
            break;
        case 'U':
            digits = 8;
            break;
        default:
            if (e >= '0' && e <= '7') {
                base = 8;
                digits = 3;
                i--;
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
        if (!digits) continue;
        uint32_t cp = 0;
        int got = 0;
        for (; got < digits && i < end; got++, i++) {
            int h = hexval(l->s[i]);
            if (h < 0 || h >= base) break;
            cp = cp * (uint32_t)base + (uint32_t)h;
        }
        if ((base == 16 && got != digits) || (base == 8 && got == 0) || cp > 0x10ffff)
            return lx_err(l, "bad \\x, \\u or \\U escape in a string literal");
        k += (size_t)tmpl_u8_enc(o + k, cp); /* an escape is never shorter than its UTF-8 */
    }
    int rv = emit(l, TK_STRING, o, k, line);
    l->line += (int)count_nl(l->s + l->pos, end + 1 - l->pos);
    l->pos = end + 1;
    return rv;
}

static bool isdig(char c)
{
    return c >= '0' && c <= '9';
}

/* digits scans \d(_?\d)* from i; returns the end. */
static size_t digits(const char *s, size_t n, size_t i)
{
    while (i < n && (isdig(s[i]) ||
                     (s[i] == '_' && i + 1 < n && isdig(s[i + 1]) && i > 0 && isdig(s[i - 1]))))
        i++;
    return i;
}

static int number(struct lx *l)
{
    const char *s = l->s;
    size_t st = l->pos, i = digits(s, l->n, st);
    bool flt = false;
    bool after_dot = st > 0 && s[st - 1] == '.';
    if (!after_dot && i + 1 < l->n && s[i] == '.' && isdig(s[i + 1])) {
        flt = true;
        i = digits(s, l->n, i + 1);
    }
    if (!after_dot && i < l->n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < l->n && (s[j] == '+' || s[j] == '-')) j++;
        if (j < l->n && isdig(s[j])) {
            flt = true;
            i = digits(s, l->n, j);
        }
    }
    char buf[64];
    size_t k = 0;
    for (size_t j = st; j < i && k < sizeof buf - 1; j++)
        if (s[j] != '_') buf[k++] = s[j];
    buf[k] = 0;
    if (i - st >= sizeof buf - 1) return lx_err(l, "number literal too long");
    int rv = emit(l, flt ? TK_FLOAT : TK_INT, s + st, i - st, l->line);
    if (rv) return rv;
    struct ttoken *t = &l->v[l->nv - 1];
    if (flt) {
        t->f = strtod(buf, NULL);
    } else {
        char *end;
        unsigned long long v = strtoull(buf, &end, 10);
        if (v > INT64_MAX) return lx_err(l, "integer literal does not fit in 64 bits");
        t->i = (int64_t)v;
    }
    l->pos = i;
    return 0;
}

static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">="};

/* inside lexes the inside of a {{ }} or {% %} tag up to its end. */
static int inside(struct lx *l, bool block)
{
    int depth = 0, rv;
    const char *s = l->s;
    for (;;) {
        while (l->pos < l->n && (s[l->pos] == ' ' || s[l->pos] == '\t' || s[l->pos] == '\n' ||
                                 s[l->pos] == '\r' || s[l->pos] == '\f' || s[l->pos] == '\v')) {
            l->line += s[l->pos] == '\n';
            l->pos++;
        }
        if (l->pos >= l->n)
            return lx_err(l, block ? "unexpected end of template: a '{%' has no '%}'"
                                   : "unexpected end of template: a '{{' has no '}}'");
        const char *p = s + l->pos;
        size_t left = l->n - l->pos;
        char sign = (*p == '-' || (block && *p == '+')) ? *p : 0;
        const char *e = p + (sign != 0);
        if (depth == 0 && (size_t)(e - p) + 2 <= left && e[0] == (block ? '%' : '}') &&
            e[1] == '}') {
            if ((rv = emit(l, block ? TK_BLOCK_END : TK_VAR_END, p, 0, l->line)) != 0) return rv;
            l->pos += (size_t)(e - p) + 2;
            tag_end(l, sign, block);
            return 0;
        }
        char c = *p;
        if (c == '\'' || c == '"') {
            if ((rv = string(l)) != 0) return rv;
        } else if (isdig(c)) {
            if ((rv = number(l)) != 0) return rv;
        } else if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            size_t i = 1;
            while (i < left && (p[i] == '_' || isdig(p[i]) || (p[i] >= 'a' && p[i] <= 'z') ||
                                (p[i] >= 'A' && p[i] <= 'Z')))
                i++;
            if ((rv = emit(l, TK_NAME, p, i, l->line)) != 0) return rv;
            l->pos += i;
        } else {
            size_t len = 0;
            for (size_t k = 0; k < sizeof ops2 / sizeof *ops2; k++)
                if (left >= 2 && memcmp(p, ops2[k], 2) == 0) len = 2;
            if (!len && strchr("+-*/%~<>=.,:|()[]{}", c)) len = 1;
            if (!len)
                return strata_errf(STRATA_EFORMAT, "line %d: unexpected character '%c' in a tag",
                                   l->line, c);
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            if ((rv = emit(l, TK_OP, p, len, l->line)) != 0) return rv;
            l->pos += len;
        }
    }
}

/* raw handles {% raw %}...{% endraw %} once "raw" has been seen after a '{%'; true when it did. */
static int raw(struct lx *l, bool *done)
{
    const char *s = l->s;
    size_t i = l->pos;
    while (i < l->n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n'))
        i++;
    *done = false;
    if (l->n - i < 3 || memcmp(s + i, "raw", 3) != 0) return 0;
    i += 3;
    while (i < l->n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n'))
        i++;
    char sign = i < l->n && (s[i] == '-' || s[i] == '+') ? s[i++] : 0;
    if (l->n - i < 2 || s[i] != '%' || s[i + 1] != '}') return 0;
    *done = true;
    l->line += (int)count_nl(s + l->pos, i + 2 - l->pos);
    l->pos = i + 2;
    tag_end(l, sign, true);
    for (size_t j = l->pos; j + 1 < l->n; j++) {
        if (s[j] != '{' || s[j + 1] != '%') continue;
        size_t k = j + 2;
        char osign = k < l->n && (s[k] == '-' || s[k] == '+') ? s[k++] : 0;
        while (k < l->n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n'))
            k++;
        if (l->n - k < 6 || memcmp(s + k, "endraw", 6) != 0) continue;
        k += 6;
        while (k < l->n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n'))
            k++;
        char csign = k < l->n && (s[k] == '-' || s[k] == '+') ? s[k++] : 0;
        if (l->n - k < 2 || s[k] != '%' || s[k + 1] != '}') continue;
        int rv = text(l, l->pos, j, osign, '%');
        if (rv) return rv;
        l->line += (int)count_nl(s + j, k + 2 - j);
        l->pos = k + 2;
        tag_end(l, csign, true);
        return 0;
    }
    return lx_err(l, "a {% raw %} has no {% endraw %}");
}

int tmpl_lex(struct tmpl_arena *a, const char *src, size_t len, size_t max_tokens,
             struct ttoken **out, size_t *nout)
{
    struct lx l = {.a = a, .line = 1, .max = max_tokens, .line_starting = true};
    int rv;
    char *s = tmpl_arena_alloc(a, len + 1);
    if (!s) return STRATA_ENOMEM;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[l.n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[l.n++] = src[i];
        }
    }
    if (l.n && s[l.n - 1] == '\n') l.n--;
    l.s = s;
    while (l.pos < l.n) {
        const char *open = NULL;
        for (size_t i = l.pos; i + 1 < l.n; i++)
            if (s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')) {
                open = s + i;
                break;
            }
        if (!open) {
            if ((rv = text(&l, l.pos, l.n, 0, '{')) != 0) goto fail;
            break;
        }
        size_t at = (size_t)(open - s);
        char kind = open[1];
        char sign = at + 2 < l.n && (s[at + 2] == '-' || s[at + 2] == '+') ? s[at + 2] : 0;
        if ((rv = text(&l, l.pos, at, sign, kind)) != 0) goto fail;
        l.pos = at + 2 + (sign != 0);
        if (kind == '#') {
            const char *end = NULL;
            for (size_t i = l.pos; i + 1 < l.n; i++)
                if (s[i] == '#' && s[i + 1] == '}') {
                    end = s + i;
                    break;
                }
            if (!end) {
                rv = lx_err(&l, "a '{#' comment has no '#}'");
                goto fail;
            }
            size_t e = (size_t)(end - s);
            char csign = e > l.pos && (s[e - 1] == '-' || s[e - 1] == '+') ? s[e - 1] : 0;
            l.line += (int)count_nl(s + l.pos, e + 2 - l.pos);
            l.pos = e + 2;
            tag_end(&l, csign, true);
            continue;
        }
        if (kind == '%') {
            bool done;
            if ((rv = raw(&l, &done)) != 0) goto fail;
            if (done) continue;
        }
        if ((rv = emit(&l, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, open, 2, l.line)) != 0)
            goto fail;
        if ((rv = inside(&l, kind == '%')) != 0) goto fail;
    }
    if ((rv = emit(&l, TK_EOF, "", 0, l.line)) != 0) goto fail;
    *out = l.v;
    *nout = l.nv;
    return 0;
fail:
    free(l.v);
    return rv;
}
