/* schema — JSON Schema to GBNF, after llama.cpp's json-schema-to-grammar: one rule per schema
 * node, shared primitive rules, bounded whitespace. */
#include "common/base/err.h"
#include "common/grammar/grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH  64    /* nested schemas (a $ref is a rule, not a level) */
#define MAX_NEST   256   /* nested schemas through $refs too: the compiler recurses */
#define MAX_REPEAT 10000 /* minItems, maxItems, minLength, maxLength */

struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void sb_putn(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_putn(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_putn(b, big, (size_t)n);
    free(big);
}

/* sb_literal writes bytes as a GBNF string literal. */
static void sb_literal(struct sbuf *b, const char *s, size_t n)
{
    sb_putn(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_putn(b, e, 2);
        } else if (c < 0x20 || c == 0x7f)
            sb_printf(b, "\\x%02X", c);
        else
            sb_putn(b, s + i, 1);
    }
    sb_putn(b, "\"", 1);
}

enum prim {
    P_SPACE = 1 << 0,
    P_STRING = 1 << 1,
    P_NUMBER = 1 << 2,
    P_INTEGER = 1 << 3,
    P_BOOLEAN = 1 << 4,
    P_NULL = 1 << 5,
    P_VALUE = 1 << 6, /* value, object, array and all of the above */
    P_DATE = 1 << 7,
    P_TIME = 1 << 8,
    P_UUID = 1 << 9,
    P_CHAR = 1 << 10,
    P_UINT = 1 << 11,
};

static const struct {
    unsigned bit, needs;
    const char *text;
} PRIMS[] = {
    {P_SPACE, 0, "space ::= | \" \" | \"\\n\"{1,2} [ \\t]{0,20}\n"},
    {P_CHAR, 0,
     "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\/bfnrt] | \"u\" hex-code)\n"
     "hex-code ::= [0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}\n"},
    {P_STRING, P_SPACE | P_CHAR, "string ::= \"\\\"\" char* \"\\\"\" space\n"},
    {P_INTEGER, P_SPACE,
     "integral-part ::= [0] | [1-9] [0-9]{0,15}\ninteger ::= (\"-\"? integral-part) space\n"},
    {P_UINT, P_SPACE | P_INTEGER, "uinteger ::= integral-part space\n"},
    {P_NUMBER, P_SPACE | P_INTEGER,
     "decimal-part ::= [0-9]{1,16}\nnumber ::= (\"-\"? integral-part) (\".\" decimal-part)? "
     "([eE] [-+]? [0-9]{1,2})? space\n"},
    {P_BOOLEAN, P_SPACE, "boolean ::= (\"true\" | \"false\") space\n"},
    {P_NULL, P_SPACE, "null ::= \"null\" space\n"},
    {P_VALUE, P_STRING | P_NUMBER | P_BOOLEAN | P_NULL,
     "value ::= object | array | string | number | boolean | null\n"
     "object ::= \"{\" space ( string \":\" space value (\",\" space string \":\" space value)* "
     ")? \"}\" space\n"
     "array ::= \"[\" space ( value (\",\" space value)* )? \"]\" space\n"},
    {P_DATE, 0,
     "date ::= [0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [1-2] [0-9] | "
     "\"3\" [0-1] )\n"},
    {P_TIME, 0,
     "time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" "
     "[0-9]{3} )? ( \"Z\" | ( \"+\" | \"-\" ) ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n"},
    {P_UUID, 0,
     "uuid ::= [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} "
     "\"-\" [0-9a-fA-F]{12}\n"},
};

struct ref {
    char *ref;
    unsigned rule;
};

struct gen {
    const json_t *root;
    struct sbuf rules;
    unsigned prims; /* primitive rules used */
    unsigned n_rules;
    struct ref *refs;
    size_t n_refs;
    int depth;
    int nest; /* expr calls open: bounds the C stack, which depth does not through $refs */
    /* The $refs being expanded, outermost first; those from bare_from on were reached without a
     * value begun since (only $ref, anyOf, oneOf and allOf between): a reference back to one of
     * them would be a rule that reaches itself before matching anything. */
    const char **open;
    size_t n_open, cap_open, bare_from;
};

static unsigned use(struct gen *g, unsigned bits)
{
    g->prims |= bits;
    return bits;
}

static int bad(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const char *path, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return strata_errf(STRATA_EINVAL, "JSON schema at %s: %s", path, msg);
}

static int node(struct gen *g, const json_t *s, const char *path, unsigned *rule);

/* child makes the rule of s's member at path/key. */
static int child(struct gen *g, const json_t *s, const char *path, const char *key, unsigned *rule)
{
    char p[512];
    if (snprintf(p, sizeof p, "%s/%s", path, key) >= (int)sizeof p) p[sizeof p - 2] = '~';
    return node(g, s, p, rule);
}

/* resolve follows a local JSON pointer ("#", "#/$defs/a", "#/definitions/a/properties/b"). */
static const json_t *resolve(const struct gen *g, const char *ref)
{
    if (ref[0] != '#') return NULL;
    const json_t *at = g->root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        p++;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char key[256];
        size_t k = 0;
        for (size_t i = 0; i < n && k + 1 < sizeof key; i++) {
            if (p[i] == '~' && i + 1 < n && (p[i + 1] == '0' || p[i + 1] == '1')) {
                key[k++] = p[i + 1] == '0' ? '~' : '/';
                i++;
            } else
                key[k++] = p[i];
        }
        key[k] = 0;
        if (json_is_object(at))
            at = json_object_get(at, key);
        else if (json_is_array(at)) {
            char *end;
            unsigned long i = strtoul(key, &end, 10);
            at = *key && !*end ? json_array_get(at, i) : NULL;
        } else
            at = NULL;
        p += n;
    }
    return *p ? NULL : at;
}

static int get_count(const json_t *s, const char *key, const char *path, long long dflt,
                     long long *out)
{
    const json_t *v = json_object_get(s, key);
    *out = dflt;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > MAX_REPEAT)
        return bad(path, "'%s' must be an integer in [0, %d]", key, MAX_REPEAT);
    *out = json_integer_value(v);
    return 0;
}

/* repeat writes `item{m,M}` as GBNF (M < 0: unbounded) with sep between items. */
static void repeat(struct sbuf *b, const char *item, const char *sep, long long m, long long M)
{
    if (M == 0) return;
    if (m == 0) {
        sb_printf(b, "( %s ( %s %s )", item, sep, item);
        if (M < 0)
            sb_printf(b, "* )?");
        else
            sb_printf(b, "{0,%lld} )?", M - 1);
        return;
    }
    sb_printf(b, "%s ( %s %s )", item, sep, item);
    if (M < 0)
        sb_printf(b, "{%lld,}", m - 1);
    else
        sb_printf(b, "{%lld,%lld}", m - 1, M - 1);
}

static int object_body(struct gen *g, const json_t *s, const char *path, struct sbuf *e)
{
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *add = json_object_get(s, "additionalProperties");
    int rv;
    if (props && !json_is_object(props)) return bad(path, "'properties' must be an object");
    if (req && !json_is_array(req)) return bad(path, "'required' must be an array of names");
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        const char *k = json_string_value(json_array_get(req, i));
        if (!k) return bad(path, "'required' must be an array of names");
        if (!props || !json_object_get(props, k))
            return bad(path, "'required' names '%s', which is not in 'properties'", k);
    }
    use(g, P_SPACE);
    if (!props || json_object_size(props) == 0) {
        if (json_is_false(add)) {
            sb_printf(e, "\"{\" space \"}\" space");
            return 0;
        }
        unsigned vr = 0;
        if (json_is_object(add)) {
            if ((rv = child(g, add, path, "additionalProperties", &vr)) != 0) return rv;
            use(g, P_STRING);
            char item[64];
            snprintf(item, sizeof item, "string \":\" space r%u", vr);
            sb_printf(e, "\"{\" space ");
            repeat(e, item, "\",\" space", 0, -1);
            sb_printf(e, " \"}\" space");
            return 0;
        }
        use(g, P_VALUE);
        sb_printf(e, "object");
        return 0;
    }
    /* kv rules, then start_i / after_i over the properties in their order */
    const size_t n = json_object_size(props);
    unsigned *kv = malloc(n * sizeof *kv);
    bool *required = calloc(n, sizeof *required);
    if (!kv || !required) {
        free(kv);
        free(required);
        return STRATA_ENOMEM;
    }
    size_t i = 0;
    const char *key;
    json_t *ps;
    rv = 0;
    json_object_foreach((json_t *)props, key, ps)
    {
        unsigned vr;
        char p[512];
        if (snprintf(p, sizeof p, "%s/properties", path) >= (int)sizeof p) p[sizeof p - 2] = '~';
        if ((rv = child(g, ps, p, key, &vr)) != 0) break;
        for (size_t j = 0; req && j < json_array_size(req); j++)
            if (strcmp(json_string_value(json_array_get(req, j)), key) == 0) required[i] = true;
        kv[i] = g->n_rules++;
        sb_printf(&g->rules, "r%u ::= ", kv[i]);
        json_t *ks = json_string(key);
        char *q = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!q) {
            rv = STRATA_ENOMEM;
            break;
        }
        sb_literal(&g->rules, q, strlen(q));
        free(q);
        sb_printf(&g->rules, " space \":\" space r%u\n", vr);
        i++;
    }
    if (rv == 0) {
        /* after_i: something came before, so each further member has its comma */
        const unsigned after0 = g->n_rules;
        g->n_rules += (unsigned)n + 1;
        for (size_t j = 0; j < n; j++)
            sb_printf(&g->rules, "r%u ::= (\",\" space r%u)%s r%u\n", after0 + (unsigned)j, kv[j],
                      required[j] ? "" : "?", after0 + (unsigned)j + 1);
        sb_printf(&g->rules, "r%u ::= \"\"\n", after0 + (unsigned)n);
        /* start_i: nothing yet; an optional member may be skipped */
        const unsigned start0 = g->n_rules;
        g->n_rules += (unsigned)n + 1;
        for (size_t j = 0; j < n; j++) {
            sb_printf(&g->rules, "r%u ::= r%u r%u", start0 + (unsigned)j, kv[j],
                      after0 + (unsigned)j + 1);
            if (!required[j]) sb_printf(&g->rules, " | r%u", start0 + (unsigned)j + 1);
            sb_printf(&g->rules, "\n");
        }
        sb_printf(&g->rules, "r%u ::= \"\"\n", start0 + (unsigned)n);
        sb_printf(e, "\"{\" space r%u \"}\" space", start0);
    }
    free(kv);
    free(required);
    return rv;
}

static int array_body(struct gen *g, const json_t *s, const char *path, struct sbuf *e)
{
    const json_t *items = json_object_get(s, "items");
    const json_t *prefix = json_object_get(s, "prefixItems");
    int rv;
    use(g, P_SPACE);
    if (json_is_array(items) && !prefix) prefix = items; /* draft 4-7 tuples */
    if (prefix) {
        if (!json_is_array(prefix)) return bad(path, "'prefixItems' must be an array of schemas");
        sb_printf(e, "\"[\" space");
        for (size_t i = 0; i < json_array_size(prefix); i++) {
            unsigned r;
            char key[48];
            snprintf(key, sizeof key, "prefixItems/%zu", i);
            if ((rv = child(g, json_array_get(prefix, i), path, key, &r)) != 0) return rv;
            sb_printf(e, "%s r%u", i ? " \",\" space" : "", r);
        }
        sb_printf(e, " \"]\" space");
        return 0;
    }
    long long m, M;
    if ((rv = get_count(s, "minItems", path, 0, &m)) ||
        (rv = get_count(s, "maxItems", path, -1, &M)))
        return rv;
    if (M >= 0 && M < m) return bad(path, "maxItems %lld is below minItems %lld", M, m);
    char item[32];
    if (items && !json_is_true(items)) {
        unsigned r;
        if ((rv = child(g, items, path, "items", &r)) != 0) return rv;
        snprintf(item, sizeof item, "r%u", r);
    } else {
        use(g, P_VALUE);
        snprintf(item, sizeof item, "value");
    }
    sb_printf(e, "\"[\" space ");
    repeat(e, item, "\",\" space", m, M);
    sb_printf(e, " \"]\" space");
    return 0;
}

static int string_body(struct gen *g, const json_t *s, const char *path, struct sbuf *e)
{
    if (json_object_get(s, "pattern"))
        return bad(path, "'pattern' is not supported: use enum, format or a grammar");
    const char *fmt = json_string_value(json_object_get(s, "format"));
    use(g, P_SPACE);
    if (fmt && strcmp(fmt, "date") == 0)
        sb_printf(e, "\"\\\"\" date \"\\\"\" space"), use(g, P_DATE);
    else if (fmt && strcmp(fmt, "time") == 0)
        sb_printf(e, "\"\\\"\" time \"\\\"\" space"), use(g, P_TIME);
    else if (fmt && strcmp(fmt, "date-time") == 0)
        sb_printf(e, "\"\\\"\" date \"T\" time \"\\\"\" space"), use(g, P_DATE | P_TIME);
    else if (fmt && strcmp(fmt, "uuid") == 0)
        sb_printf(e, "\"\\\"\" uuid \"\\\"\" space"), use(g, P_UUID);
    else {
        long long m, M;
        int rv;
        if ((rv = get_count(s, "minLength", path, 0, &m)) ||
            (rv = get_count(s, "maxLength", path, -1, &M)))
            return rv;
        if (M >= 0 && M < m) return bad(path, "maxLength %lld is below minLength %lld", M, m);
        if (m == 0 && M < 0) {
            use(g, P_STRING);
            sb_printf(e, "string");
        } else {
            use(g, P_CHAR);
            sb_printf(e, "\"\\\"\" char{%lld,", m);
            if (M >= 0) sb_printf(e, "%lld", M);
            sb_printf(e, "} \"\\\"\" space");
        }
    }
    return 0;
}

static int typed_body(struct gen *g, const json_t *s, const char *t, const char *path,
                      struct sbuf *e);

/* typed writes the expression of s read as type t: a value begins with a character (a brace, a
 * quote, a digit...), so the $refs open are no longer bare under it. */
static int typed(struct gen *g, const json_t *s, const char *t, const char *path, struct sbuf *e)
{
    const size_t saved = g->bare_from;
    g->bare_from = g->n_open;
    int rv = typed_body(g, s, t, path, e);
    g->bare_from = saved;
    return rv;
}

static int typed_body(struct gen *g, const json_t *s, const char *t, const char *path,
                      struct sbuf *e)
{
    if (strcmp(t, "object") == 0) return object_body(g, s, path, e);
    if (strcmp(t, "array") == 0) return array_body(g, s, path, e);
    if (strcmp(t, "string") == 0) return string_body(g, s, path, e);
    if (strcmp(t, "integer") == 0) {
        const json_t *lo = json_object_get(s, "minimum");
        const bool nonneg = json_is_number(lo) && json_number_value(lo) >= 0;
        use(g, nonneg ? P_UINT | P_INTEGER | P_SPACE : P_INTEGER | P_SPACE);
        sb_printf(e, nonneg ? "uinteger" : "integer");
        return 0;
    }
    if (strcmp(t, "number") == 0)
        return sb_printf(e, "number"), use(g, P_NUMBER | P_INTEGER | P_SPACE), 0;
    if (strcmp(t, "boolean") == 0) return sb_printf(e, "boolean"), use(g, P_BOOLEAN | P_SPACE), 0;
    if (strcmp(t, "null") == 0) return sb_printf(e, "null"), use(g, P_NULL | P_SPACE), 0;
    return bad(path,
               "unknown type '%s': use object, array, string, integer, number, boolean or "
               "null",
               t);
}

/* alternatives writes ( r1 | r2 ... ) for the schemas of array list. */
static int alternatives(struct gen *g, const json_t *list, const char *path, const char *kw,
                        struct sbuf *e)
{
    if (!json_is_array(list) || json_array_size(list) == 0)
        return bad(path, "'%s' must be a non-empty array of schemas", kw);
    sb_printf(e, "(");
    for (size_t i = 0; i < json_array_size(list); i++) {
        unsigned r;
        char key[32];
        snprintf(key, sizeof key, "%s/%zu", kw, i);
        int rv = child(g, json_array_get(list, i), path, key, &r);
        if (rv) return rv;
        sb_printf(e, "%s r%u", i ? " |" : "", r);
    }
    sb_printf(e, " )");
    return 0;
}

static int literal_value(struct gen *g, const json_t *v, struct sbuf *e)
{
    char *q = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!q) return STRATA_ENOMEM;
    sb_literal(e, q, strlen(q));
    free(q);
    use(g, P_SPACE);
    return 0;
}

static int expr_body(struct gen *g, const json_t *s, const char *path, struct sbuf *e);

static int expr(struct gen *g, const json_t *s, const char *path, struct sbuf *e)
{
    if (++g->nest > MAX_NEST) {
        g->nest--;
        return bad(path, "schemas nested deeper than %d (counting those reached through '$ref')",
                   MAX_NEST);
    }
    int rv = expr_body(g, s, path, e);
    g->nest--;
    return rv;
}

static int expr_body(struct gen *g, const json_t *s, const char *path, struct sbuf *e)
{
    int rv;
    if (!s || json_is_true(s)) {
        use(g, P_VALUE);
        sb_printf(e, "value");
        return 0;
    }
    if (json_is_false(s)) return bad(path, "the schema false accepts nothing");
    if (!json_is_object(s)) return bad(path, "a schema must be an object or a boolean");
    const json_t *v;
    if ((v = json_object_get(s, "$ref"))) {
        const char *ref = json_string_value(v);
        if (!ref) return bad(path, "'$ref' must be a string");
        for (size_t i = g->bare_from; i < g->n_open; i++)
            if (strcmp(g->open[i], ref) == 0)
                return bad(path,
                           "'$ref' \"%s\" refers back to itself before any value (through "
                           "$ref, anyOf, oneOf or allOf only): such a schema has no instance",
                           ref);
        for (size_t i = 0; i < g->n_refs; i++)
            if (strcmp(g->refs[i].ref, ref) == 0) return sb_printf(e, "r%u", g->refs[i].rule), 0;
        const json_t *target = resolve(g, ref);
        if (!target)
            return bad(path,
                       "'$ref' \"%s\" does not resolve: only local references "
                       "(\"#/$defs/name\") are supported",
                       ref);
        struct ref *nr = realloc(g->refs, (g->n_refs + 1) * sizeof *nr);
        if (!nr) return STRATA_ENOMEM;
        g->refs = nr;
        const unsigned rule = g->n_rules++;
        if (!(nr[g->n_refs].ref = strdup(ref))) return STRATA_ENOMEM;
        nr[g->n_refs++].rule = rule;
        if (g->n_open == g->cap_open) {
            const size_t cap = g->cap_open ? 2 * g->cap_open : 8;
            const char **o = realloc(g->open, cap * sizeof *o);
            if (!o) return STRATA_ENOMEM;
            g->open = o;
            g->cap_open = cap;
        }
        g->open[g->n_open++] = nr[g->n_refs - 1].ref;
        struct sbuf body = {0};
        const int saved = g->depth;
        g->depth = 0; /* a reference starts a rule of its own: recursion is through rules */
        rv = expr(g, target, ref, &body);
        g->depth = saved;
        g->n_open--;
        if (rv == 0) sb_printf(&g->rules, "r%u ::= %s\n", rule, body.p ? body.p : "\"\"");
        rv = rv ? rv : body.oom ? STRATA_ENOMEM : 0;
        free(body.p);
        if (rv) return rv;
        sb_printf(e, "r%u", rule);
        return 0;
    }
    if ((v = json_object_get(s, "const"))) return literal_value(g, v, e);
    if ((v = json_object_get(s, "enum"))) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return bad(path, "'enum' must be a non-empty array");
        sb_printf(e, "(");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) sb_printf(e, " |");
            sb_printf(e, " ");
            if ((rv = literal_value(g, json_array_get(v, i), e)) != 0) return rv;
        }
        sb_printf(e, " ) space");
        return 0;
    }
    if ((v = json_object_get(s, "anyOf"))) return alternatives(g, v, path, "anyOf", e);
    if ((v = json_object_get(s, "oneOf"))) return alternatives(g, v, path, "oneOf", e);
    if ((v = json_object_get(s, "allOf"))) {
        if (!json_is_array(v) || json_array_size(v) != 1)
            return bad(path, "'allOf' is supported with one schema only: merge them");
        return expr(g, json_array_get(v, 0), path, e);
    }
    v = json_object_get(s, "type");
    if (json_is_string(v)) return typed(g, s, json_string_value(v), path, e);
    if (json_is_array(v)) {
        if (json_array_size(v) == 0) return bad(path, "'type' is an empty array");
        sb_printf(e, "(");
        for (size_t i = 0; i < json_array_size(v); i++) {
            const char *t = json_string_value(json_array_get(v, i));
            if (!t) return bad(path, "'type' must be a string or an array of strings");
            sb_printf(e, "%s ", i ? " |" : "");
            if ((rv = typed(g, s, t, path, e)) != 0) return rv;
        }
        sb_printf(e, " )");
        return 0;
    }
    if (v) return bad(path, "'type' must be a string or an array of strings");
    if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties"))
        return typed(g, s, "object", path, e);
    if (json_object_get(s, "items") || json_object_get(s, "prefixItems"))
        return typed(g, s, "array", path, e);
    use(g, P_VALUE);
    sb_printf(e, "value");
    return 0;
}

/* node makes rule rN for s and returns N. */
static int node(struct gen *g, const json_t *s, const char *path, unsigned *rule)
{
    if (++g->depth > MAX_DEPTH) return bad(path, "schemas nested deeper than %d", MAX_DEPTH);
    struct sbuf e = {0};
    const int saved = g->depth;
    int rv = expr(g, s, path, &e);
    g->depth = saved - 1;
    if (rv == 0 && e.oom) rv = STRATA_ENOMEM;
    if (rv == 0) {
        *rule = g->n_rules++;
        sb_printf(&g->rules, "r%u ::= %s\n", *rule, e.p ? e.p : "\"\"");
    }
    free(e.p);
    return rv;
}

int grammar_from_schemas(const json_t *const *schemas, const char *const *names, size_t n,
                         char **gbnf)
{
    *gbnf = NULL;
    struct gen g = {0};
    struct sbuf out = {0};
    int rv = 0;
    for (size_t i = 0; i < n && rv == 0; i++) {
        unsigned root = 0;
        g.root = schemas[i];
        g.depth = 0;
        /* a $ref is local to its schema: the next one starts a table of its own */
        for (size_t k = 0; k < g.n_refs; k++)
            free(g.refs[k].ref);
        g.n_refs = 0;
        if ((rv = node(&g, schemas[i], "#", &root)) == 0)
            sb_printf(&out, "%s ::= r%u\n", names[i], root);
    }
    if (rv == 0) {
        /* a primitive's needs are listed before it is, so one pass in table order settles them */
        for (int i = (int)(sizeof PRIMS / sizeof *PRIMS) - 1; i >= 0; i--)
            if (g.prims & PRIMS[i].bit) g.prims |= PRIMS[i].needs;
        for (size_t i = 0; i < sizeof PRIMS / sizeof *PRIMS; i++)
            if (g.prims & PRIMS[i].bit) sb_printf(&out, "%s", PRIMS[i].text);
        if (g.rules.p) sb_putn(&out, g.rules.p, g.rules.n);
        if (out.oom || g.rules.oom) rv = STRATA_ENOMEM;
    }
    for (size_t i = 0; i < g.n_refs; i++)
        free(g.refs[i].ref);
    free(g.refs);
    free(g.open);
    free(g.rules.p);
    if (rv) {
        free(out.p);
        return rv;
    }
    *gbnf = out.p;
    return 0;
}

int grammar_from_schema(const json_t *schema, char **gbnf)
{
    const char *root = "root";
    return grammar_from_schemas(&schema, &root, 1, gbnf);
}

const char *grammar_json_object(void)
{
    return "root ::= object\n"
           "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\") space\n"
           "object ::= \"{\" space ( string \":\" space value (\",\" space string \":\" space "
           "value)* )? \"}\" space\n"
           "array ::= \"[\" space ( value (\",\" space value)* )? \"]\" space\n"
           "string ::= \"\\\"\" char* \"\\\"\" space\n"
           "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\/bfnrt] | \"u\" hex-code)\n"
           "hex-code ::= [0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}\n"
           "number ::= (\"-\"? integral-part) (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})? "
           "space\n"
           "integral-part ::= [0] | [1-9] [0-9]{0,15}\n"
           "space ::= | \" \" | \"\\n\"{1,2} [ \\t]{0,20}\n";
}
