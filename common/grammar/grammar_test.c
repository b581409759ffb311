/* grammar_test — GBNF parsing and matching, JSON Schema compilation checked by an independent
 * validator over seeded random walks, and every mask checked token by token against feeding the
 * token's bytes to a fresh matcher. */
#include "common/base/err.h"
#include "common/grammar/grammar.h"
#include "common/grammar/grammar_testutil.h"
#include "tests/testutil.h"

#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static bool prefix_ok(const struct grammar *g, const char *s)
{
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    bool ok = grammar_matcher_feed(m, s, strlen(s)) == 0;
    grammar_matcher_fini(m);
    return ok;
}

START_TEST(gbnf_matches_as_llama_cpp)
{
    struct grammar *g = gt_parse_ok("# a comment\n"
                                 "root ::= greeting (\" \" name)? \"!\"{1,3}  # trailing\n"
                                 "greeting ::= \"hi\" | \"hello\"\n"
                                 "name ::= [A-Z] [a-z]* | \"\\\"\" [^\"]+ \"\\\"\"\n");
    YES(g, "hi!");
    YES(g, "hello Bob!!!");
    YES(g, "hi \"x y\"!");
    NO(g, "hi");
    NO(g, "hi!!!!");
    NO(g, "hello bob!");
    NO(g, "hi \"\"!");
    ck_assert(prefix_ok(g, "hello B"));
    ck_assert(!prefix_ok(g, "hex"));
    grammar_fini(g);

    /* groups over lines, repetition counts, escapes */
    g = gt_parse_ok("root ::= (\n  \"a\" |\n  \"b\"\n){2,} x{0,2} [\\x30-\\x39] \"\\n\"\n"
                 "x ::= \"-\"\n");
    YES(g, "ab0\n");
    YES(g, "aaa--9\n");
    NO(g, "a0\n");
    NO(g, "ab---1\n");
    grammar_fini(g);
}
END_TEST

START_TEST(gbnf_handles_utf8)
{
    struct grammar *g = gt_parse_ok("root ::= [α-ω]+ . [^a-z]\n");
    YES(g, "αβγxé");
    YES(g, "ω\xf0\x9f\x98\x80"
           "0");
    NO(g, "αβγxa");
    NO(g, "abc");
    /* a character fed a byte at a time, as tokens split it */
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    const char *s = "λ";
    ck_assert_int_eq(grammar_matcher_feed(m, s, 1), 0);
    ck_assert(!grammar_matcher_accepting(m));
    ck_assert_int_eq(grammar_matcher_feed(m, s + 1, 1), 0);
    ck_assert_int_eq(grammar_matcher_feed(m, "\xff", 1), STRATA_EINVAL); /* never UTF-8 */
    ck_assert_int_eq(grammar_matcher_feed(m, "z0", 2), 0);
    ck_assert(grammar_matcher_accepting(m));
    grammar_matcher_fini(m);
    grammar_fini(g);
}
END_TEST

static void parse_fails(const char *text, const char *want)
{
    gt_parse_fails(text, strlen(text), STRATA_EINVAL, want);
}

START_TEST(gbnf_errors_say_where)
{
    parse_fails("root ::= foo\n", "rule 'foo' is used but not defined");
    parse_fails("start ::= \"a\"\n", "no rule 'root'");
    parse_fails("root ::= root \"a\" | \"b\"\n", "left-recursive");
    parse_fails("root ::= x\nx ::= \"a\"? root\n", "left-recursive");
    parse_fails("root ::= (\"\")*\n", "left-recursive");
    parse_fails("root ::= \"a\"\n\nx ::= \"abc\n", "line 3");
    parse_fails("root ::= [a-\n", "line 1");
    parse_fails("root ::= \"a\" )\n", "unexpected ')'");
    parse_fails("root ::= \"\\q\"\n", "unknown escape");
    parse_fails("root ::= \"a\"\nroot ::= \"b\"\n", "defined twice");
    parse_fails("root ::= * \"a\"\n", "repetition operator without");
    parse_fails("root ::= \"a\"{3,2}\n", "n below m");
    parse_fails("root = \"a\"\n", "'::='");
}
END_TEST

/* ---- a small vocabulary and random walks ------------------------------------------------------
 */

struct vocab {
    uint32_t n;
    char *tok[512];
    uint32_t len[512];
    struct grammar_vocab *v;
};

static void vocab_make(struct vocab *vc, uint64_t seed)
{
    static const char *useful[] = {"{\"",  "\":",   "\",", "\"}",   ", \"", "true", "false",
                                   "null", "[{",    "}]",  "0.",    "e+",   "é",    "\xc3",
                                   "\xa9", "\\u00", "\\n", "2024-", "-0",   "12",   "T1",
                                   ":0",   "\"\n",  " \"", "},"};
    struct test_rng r = {seed};
    vc->n = 0;
    vc->tok[vc->n] = strdup(""); /* a control token: no bytes */
    vc->len[vc->n++] = 0;
    for (int c = 0x20; c < 0x7f; c++) {
        vc->tok[vc->n] = malloc(2);
        vc->tok[vc->n][0] = (char)c;
        vc->len[vc->n++] = 1;
    }
    vc->tok[vc->n] = strdup("\n");
    vc->len[vc->n++] = 1;
    for (size_t i = 0; i < sizeof useful / sizeof *useful; i++) {
        vc->tok[vc->n] = strdup(useful[i]);
        vc->len[vc->n++] = (uint32_t)strlen(useful[i]);
    }
    static const char alpha[] = "abcdeflnrstu0123456789{}[]\":, -.e";
    while (vc->n < 400) {
        uint32_t len = 2 + (uint32_t)(test_unif(&r) * 5);
        char *t = malloc(len + 1);
        for (uint32_t i = 0; i < len; i++)
            t[i] = alpha[(size_t)(test_unif(&r) * (sizeof alpha - 1))];
        vc->tok[vc->n] = t;
        vc->len[vc->n++] = len;
    }
    ck_assert_int_eq(grammar_vocab_init(vc->n, (const char *const *)vc->tok, vc->len, &vc->v), 0);
}

static void vocab_free(struct vocab *vc)
{
    for (uint32_t i = 0; i < vc->n; i++)
        free(vc->tok[i]);
    grammar_vocab_fini(vc->v);
}

static bool bit(const uint32_t *m, uint32_t i)
{
    return (m[i >> 5] >> (i & 31)) & 1;
}

/* walk generates a random sentence (or prefix, when steps run out) of g through masks into out;
 * for the first `check` steps, every mask bit is compared with feeding that token to a matcher of
 * the text so far.
 * Returns whether it ended accepting. */
static bool walk(const struct grammar *g, struct vocab *vc, struct test_rng *r, uint32_t check,
                 uint32_t max_steps, char *out, size_t cap, int32_t *ids, uint32_t *n_ids)
{
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, vc->v, &m), 0);
    size_t n = 0;
    *n_ids = 0;
    bool ended = false;
    for (uint32_t step = 0; step < max_steps; step++) {
        if (grammar_matcher_done(m) || (grammar_matcher_accepting(m) && test_unif(r) < 0.3)) {
            ended = true;
            break;
        }
        uint32_t mask[16];
        ck_assert_int_eq(grammar_matcher_mask_into(m, mask), 0);
        uint32_t allowed[512], na = 0;
        for (uint32_t t = 0; t < vc->n; t++) {
            if (step < check) {
                struct grammar_matcher *c;
                ck_assert_int_eq(grammar_matcher_init(g, vc->v, &c), 0);
                bool ok = grammar_matcher_feed(c, out, n) == 0 && vc->len[t] &&
                          grammar_matcher_feed(c, vc->tok[t], vc->len[t]) == 0;
                grammar_matcher_fini(c);
                ck_assert_msg(ok == bit(mask, t), "after '%.*s' token %u '%.*s': mask %d, feed %d",
                              (int)n, out, t, (int)vc->len[t], vc->tok[t], bit(mask, t), ok);
            }
            if (bit(mask, t)) allowed[na++] = t;
        }
        ck_assert_msg(na > 0, "no token allowed after '%.*s'", (int)n, out);
        /* favour short tokens that close things, so walks end */
        uint32_t t = allowed[(size_t)(test_unif(r) * na)];
        ck_assert_int_eq(grammar_matcher_accept_token(m, (int32_t)t), 0);
        ck_assert_uint_lt(n + vc->len[t], cap);
        memcpy(out + n, vc->tok[t], vc->len[t]);
        n += vc->len[t];
        ids[(*n_ids)++] = (int32_t)t;
    }
    out[n] = 0;
    if (!ended) ended = grammar_matcher_accepting(m) && grammar_matcher_done(m);
    grammar_matcher_fini(m);
    return ended;
}

START_TEST(masks_equal_feeding_each_token)
{
    struct vocab vc;
    vocab_make(&vc, 7);
    const char *grammars[] = {
        grammar_json_object(),
        "root ::= \"<\" [a-zé]{1,4} (\",\" [0-9]+)* \">\" | \"x\" .\n",
    };
    struct test_rng r = {11};
    char out[1 << 14];
    int32_t ids[4096];
    for (size_t k = 0; k < sizeof grammars / sizeof *grammars; k++) {
        struct grammar *g = gt_parse_ok(grammars[k]);
        for (int i = 0; i < 6; i++) {
            uint32_t n_ids;
            walk(g, &vc, &r, 30, 30, out, sizeof out, ids, &n_ids);
            /* a matcher rebuilt from the tokens is in the same state: same next mask */
            struct grammar_matcher *a, *b;
            ck_assert_int_eq(grammar_matcher_init(g, vc.v, &a), 0);
            ck_assert_int_eq(grammar_matcher_init(g, vc.v, &b), 0);
            for (uint32_t j = 0; j < n_ids; j++) {
                ck_assert_int_eq(grammar_matcher_accept_token(a, ids[j]), 0);
                uint32_t scratch[16]; /* a walks its tables as generation does, b does not */
                ck_assert_int_eq(grammar_matcher_mask_into(a, scratch), 0);
            }
            ck_assert_int_eq(grammar_matcher_feed(b, out, strlen(out)), 0);
            uint32_t ma[16], mb[16];
            ck_assert_int_eq(grammar_matcher_mask_into(a, ma), 0);
            ck_assert_int_eq(grammar_matcher_mask_into(b, mb), 0);
            ck_assert_mem_eq(ma, mb, (vc.n + 31) / 32 * 4);
            ck_assert_int_eq(grammar_matcher_accepting(a), grammar_matcher_accepting(b));
            /* a matcher forked from a shares its tables, and starts at the beginning */
            struct grammar_matcher *c;
            uint32_t mc[16];
            ck_assert_int_eq(grammar_matcher_fork(a, &c), 0);
            ck_assert_int_eq(grammar_matcher_feed(c, out, strlen(out)), 0);
            ck_assert_int_eq(grammar_matcher_mask_into(c, mc), 0);
            ck_assert_mem_eq(mc, mb, (vc.n + 31) / 32 * 4);
            grammar_matcher_fini(c);
            grammar_matcher_fini(a);
            grammar_matcher_fini(b);
        }
        grammar_fini(g);
    }
    /* the control token (no bytes) is never in a mask, and is refused */
    struct grammar *g = gt_parse_ok(grammar_json_object());
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, vc.v, &m), 0);
    uint32_t mk[16];
    ck_assert_int_eq(grammar_matcher_mask_into(m, mk), 0);
    ck_assert(!bit(mk, 0));
    ck_assert_int_eq(grammar_matcher_accept_token(m, 0), STRATA_EINVAL);
    grammar_matcher_fini(m);
    grammar_fini(g);
    vocab_free(&vc);
}
END_TEST

START_TEST(token_references_match_control_tokens_only)
{
    char ctrl[GRAMMAR_TOKEN_BYTES];
    grammar_token_bytes(2, ctrl);
    const char *toks[] = {"a", "b", ctrl, "ab", "<x>"};
    uint32_t lens[] = {1, 1, GRAMMAR_TOKEN_BYTES, 2, 3};
    struct grammar_vocab *v;
    ck_assert_int_eq(grammar_vocab_init(5, toks, lens, &v), 0);
    struct grammar *g = gt_parse_ok("root ::= \"a\" <[2]> (\"b\" | .)\n");
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, v, &m), 0);
    ck_assert_int_eq(grammar_matcher_accept_token(m, 0), 0);
    uint32_t mask[1];
    ck_assert_int_eq(grammar_matcher_mask_into(m, mask), 0);
    ck_assert_uint_eq(mask[0], 1u << 2); /* only the control token; no text spells it */
    ck_assert_int_eq(grammar_matcher_accept_token(m, 2), 0);
    ck_assert_int_eq(grammar_matcher_mask_into(m, mask), 0);
    ck_assert_uint_eq(mask[0], (1u << 0) | (1u << 1)); /* "." is a character, never the token */
    ck_assert_int_eq(grammar_matcher_accept_token(m, 1), 0);
    ck_assert(grammar_matcher_done(m));
    grammar_matcher_fini(m);
    grammar_fini(g);
    grammar_vocab_fini(v);
    parse_fails("root ::= <eos>\n", "token names are not supported");
    parse_fails("root ::= <[3000000]>\n", "below 2^21");
}
END_TEST

/* ---- lazy grammars ----------------------------------------------------------------------------
 */

static const char LAZY[] =
    "%trigger \"{\\\"\"\n"
    "%trigger-start \"[\"\n"
    "root ::= \"{\\\"\" [a-z]+ \"\\\": \" [0-9]+ \"}\" | \"[\" [0-9]+ \"]\"\n";

/* lazy_trigger_at: where LAZY's first trigger starts in s[0..n), n when none does. */
static size_t lazy_trigger_at(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\n'))
        i++;
    if (i < n && s[i] == '[') return i;
    for (size_t k = 0; k + 1 < n; k++)
        if (s[k] == '{' && s[k + 1] == '"') return k;
    return n;
}

START_TEST(lazy_grammars_are_free_until_a_trigger)
{
    struct grammar *g = gt_parse_ok(LAZY);
    /* the same rules without the triggers: what the text from a trigger on must match */
    struct grammar *strict = gt_parse_ok(strchr(strchr(LAZY, '\n') + 1, '\n') + 1);
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    ck_assert(grammar_matcher_pending(m) && grammar_matcher_accepting(m));
    ck_assert(!grammar_matcher_done(m));
    const char *free_text = "any text [1] {x} \"{";
    ck_assert_int_eq(grammar_matcher_feed(m, free_text, strlen(free_text)), 0);
    ck_assert(grammar_matcher_pending(m));
    ck_assert_int_eq(grammar_matcher_feed(m, "\"1", 2), STRATA_EINVAL); /* {"1 is no call */
    ck_assert(grammar_matcher_pending(m));                              /* left as it was */
    ck_assert_int_eq(grammar_matcher_feed(m, "\"ab", 3), 0);
    ck_assert(!grammar_matcher_pending(m) && !grammar_matcher_accepting(m));
    ck_assert_int_eq(grammar_matcher_feed(m, "\": 12}", 6), 0);
    ck_assert(grammar_matcher_done(m));
    grammar_matcher_fini(m);
    /* %trigger-start: only after blanks */
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    ck_assert_int_eq(grammar_matcher_feed(m, " \n[3", 4), 0);
    ck_assert(!grammar_matcher_pending(m));
    ck_assert_int_eq(grammar_matcher_feed(m, "x", 1), STRATA_EINVAL);
    grammar_matcher_fini(m);
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    ck_assert_int_eq(grammar_matcher_feed(m, "a [x", 4), 0);
    ck_assert(grammar_matcher_pending(m));
    grammar_matcher_fini(m);

    /* random walks over a vocabulary: every mask is what feeding each token says, and the text
     * from the first trigger on is always a prefix of the grammar's language */
    struct vocab vc;
    vocab_make(&vc, 3);
    struct grammar_matcher *proto;
    ck_assert_int_eq(grammar_matcher_init(g, vc.v, &proto), 0);
    struct test_rng r = {5};
    static char out[1 << 14];
    int32_t ids[512];
    int triggered = 0, done = 0, free_before = 0;
    for (int w = 0; w < 40; w++) {
        ck_assert_int_eq(grammar_matcher_fork(proto, &m), 0);
        size_t n = 0;
        uint32_t n_ids = 0;
        for (uint32_t step = 0; step < 300 && !grammar_matcher_done(m); step++) {
            uint32_t mask[16], allowed[512], na = 0;
            ck_assert_int_eq(grammar_matcher_mask_into(m, mask), 0);
            const bool check = step < 4 || (n && (out[n - 1] == '{' || out[n - 1] == ' '));
            for (uint32_t t = 0; t < vc.n; t++) {
                if (check) {
                    struct grammar_matcher *c;
                    ck_assert_int_eq(grammar_matcher_fork(proto, &c), 0);
                    bool ok = grammar_matcher_feed(c, out, n) == 0 && vc.len[t] &&
                              grammar_matcher_feed(c, vc.tok[t], vc.len[t]) == 0;
                    grammar_matcher_fini(c);
                    ck_assert_msg(ok == bit(mask, t), "after '%.*s' token '%.*s': mask %d", (int)n,
                                  out, (int)vc.len[t], vc.tok[t], bit(mask, t));
                }
                if (bit(mask, t)) allowed[na++] = t;
            }
            ck_assert_uint_gt(na, 0);
            const uint32_t t = allowed[(size_t)(test_unif(&r) * na)];
            ck_assert_int_eq(grammar_matcher_accept_token(m, (int32_t)t), 0);
            memcpy(out + n, vc.tok[t], vc.len[t]);
            n += vc.len[t];
            ids[n_ids++] = (int32_t)t;
        }
        const size_t at = lazy_trigger_at(out, n);
        ck_assert_int_eq(at < n, !grammar_matcher_pending(m));
        if (at < n) {
            struct grammar_matcher *c;
            ck_assert_int_eq(grammar_matcher_init(strict, NULL, &c), 0);
            ck_assert_msg(grammar_matcher_feed(c, out + at, n - at) == 0, "not a call: '%.*s'",
                          (int)(n - at), out + at);
            ck_assert_int_eq(grammar_matcher_done(c), grammar_matcher_done(m));
            grammar_matcher_fini(c);
            triggered++;
            free_before += at > 0;
            done += grammar_matcher_done(m);
        }
        /* rebuilt from its tokens, a matcher is in the same state */
        struct grammar_matcher *b;
        ck_assert_int_eq(grammar_matcher_fork(proto, &b), 0);
        for (uint32_t j = 0; j < n_ids; j++)
            ck_assert_int_eq(grammar_matcher_accept_token(b, ids[j]), 0);
        uint32_t ma[16], mb[16];
        ck_assert_int_eq(grammar_matcher_mask_into(m, ma), 0);
        ck_assert_int_eq(grammar_matcher_mask_into(b, mb), 0);
        ck_assert_mem_eq(ma, mb, (vc.n + 31) / 32 * 4);
        ck_assert_int_eq(grammar_matcher_pending(b), grammar_matcher_pending(m));
        grammar_matcher_fini(b);
        grammar_matcher_fini(m);
    }
    ck_assert_int_gt(triggered, 3);
    ck_assert_int_gt(free_before, 0);
    ck_assert_int_gt(done, 0);
    grammar_matcher_fini(proto);
    vocab_free(&vc);
    grammar_fini(strict);
    grammar_fini(g);
    parse_fails("%bogus \"x\"\nroot ::= \"x\"\n", "unknown directive");
    parse_fails("%trigger\nroot ::= \"x\"\n", "an empty trigger");
    parse_fails("%trigger x\nroot ::= \"x\"\n", "literals and token references");
}
END_TEST

/* ---- JSON Schema: an independent validator ----------------------------------------------------
 */

static const json_t *vroot;

static size_t utf8_count(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

static bool valid(const json_t *s, const json_t *v);

static bool valid_type(const char *t, const json_t *v)
{
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer")) return json_is_integer(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    return false;
}

static bool valid(const json_t *s, const json_t *v)
{
    if (!s || json_is_true(s)) return true;
    const json_t *x;
    if ((x = json_object_get(s, "$ref"))) {
        const char *ref = json_string_value(x);
        if (!strcmp(ref, "#")) return valid(vroot, v);
        const char *name = strrchr(ref, '/') + 1;
        return valid(json_object_get(json_object_get(vroot, "$defs"), name), v);
    }
    if ((x = json_object_get(s, "const")) && !json_equal(x, (json_t *)v)) return false;
    if ((x = json_object_get(s, "enum"))) {
        bool any = false;
        for (size_t i = 0; i < json_array_size(x); i++)
            any |= json_equal(json_array_get(x, i), (json_t *)v);
        if (!any) return false;
    }
    if ((x = json_object_get(s, "anyOf"))) {
        bool any = false;
        for (size_t i = 0; i < json_array_size(x); i++)
            any |= valid(json_array_get(x, i), v);
        if (!any) return false;
    }
    if ((x = json_object_get(s, "type"))) {
        bool any = false;
        if (json_is_string(x)) any = valid_type(json_string_value(x), v);
        for (size_t i = 0; json_is_array(x) && i < json_array_size(x); i++)
            any |= valid_type(json_string_value(json_array_get(x, i)), v);
        if (!any) return false;
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties"),
                     *req = json_object_get(s, "required");
        for (size_t i = 0; i < json_array_size(req); i++)
            if (!json_object_get(v, json_string_value(json_array_get(req, i)))) return false;
        const char *k;
        json_t *val;
        json_object_foreach((json_t *)v, k, val)
        {
            const json_t *ps = props ? json_object_get(props, k) : NULL;
            if (ps ? !valid(ps, val)
                   : props && json_is_false(json_object_get(s, "additionalProperties")))
                return false;
            if (!props && json_is_object(json_object_get(s, "additionalProperties")) &&
                !valid(json_object_get(s, "additionalProperties"), val))
                return false;
        }
    }
    if (json_is_array(v)) {
        const json_t *it = json_object_get(s, "items");
        const json_t *lo = json_object_get(s, "minItems"), *hi = json_object_get(s, "maxItems");
        if (lo && json_array_size(v) < (size_t)json_integer_value(lo)) return false;
        if (hi && json_array_size(v) > (size_t)json_integer_value(hi)) return false;
        for (size_t i = 0; it && i < json_array_size(v); i++)
            if (!valid(it, json_array_get(v, i))) return false;
    }
    if (json_is_string(v)) {
        const json_t *lo = json_object_get(s, "minLength"), *hi = json_object_get(s, "maxLength");
        size_t n = utf8_count(json_string_value(v));
        if (lo && n < (size_t)json_integer_value(lo)) return false;
        if (hi && n > (size_t)json_integer_value(hi)) return false;
        const char *f = json_string_value(json_object_get(s, "format"));
        if (f && !strcmp(f, "date") && strlen(json_string_value(v)) != 10) return false;
        if (f && !strcmp(f, "uuid") && strlen(json_string_value(v)) != 36) return false;
    }
    if (json_is_integer(v) && (x = json_object_get(s, "minimum")) &&
        json_integer_value(v) < json_number_value(x))
        return false;
    return true;
}

static const char *schemas[] = {
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 8}, "
    "\"age\": {\"type\": \"integer\", \"minimum\": 0}, \"tags\": {\"type\": \"array\", \"items\": "
    "{\"enum\": [\"a\", \"b\", 3, null]}, \"minItems\": 1, \"maxItems\": 3}, \"ok\": {\"type\": "
    "\"boolean\"}}, \"required\": [\"name\", \"tags\"], \"additionalProperties\": false}",
    "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": "
    "\"number\"}, \"next\": {\"anyOf\": [{\"$ref\": \"#/$defs/node\"}, {\"type\": \"null\"}]}}, "
    "\"required\": [\"v\", \"next\"]}}, \"$ref\": \"#/$defs/node\"}",
    "{\"type\": \"array\", \"items\": {\"type\": [\"string\", \"null\"], \"format\": \"date\"}, "
    "\"maxItems\": 2}",
    "{\"anyOf\": [{\"const\": {\"k\": [1, 2]}}, {\"type\": \"string\", \"minLength\": 2, "
    "\"maxLength\": 3}, {\"type\": \"object\", \"additionalProperties\": {\"type\": "
    "\"integer\"}}]}",
    "{\"type\": \"object\", \"properties\": {\"id\": {\"type\": \"string\", \"format\": \"uuid\"}, "
    "\"at\": {\"type\": \"string\", \"format\": \"date-time\"}, \"x\": {}}}",
};

START_TEST(schema_outputs_validate)
{
    struct vocab vc;
    vocab_make(&vc, 3);
    const char *src = schemas[_i];
    json_t *schema = json_loads(src, 0, NULL);
    ck_assert_ptr_nonnull(schema);
    vroot = schema;
    char *gbnf;
    ck_assert_msg(grammar_from_schema(schema, &gbnf) == 0, "%s", strata_errdetail());
    struct grammar *g = gt_parse_ok(gbnf);
    struct test_rng r = {100 + (uint64_t)_i};
    char out[1 << 15];
    int32_t ids[4096];
    int finished = 0;
    for (int i = 0; i < 40; i++) {
        uint32_t n_ids;
        if (!walk(g, &vc, &r, i < 2 ? 40 : 0, 2000, out, sizeof out, ids, &n_ids)) continue;
        json_error_t je;
        json_t *v = json_loads(out, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        ck_assert_msg(v, "schema %d: not JSON (%s): %s\ngrammar:\n%s", _i, je.text, out, gbnf);
        ck_assert_msg(valid(schema, v), "schema %d: invalid: %s", _i, out);
        json_decref(v);
        finished++;
    }
    ck_assert_int_ge(finished, 10);
    grammar_fini(g);
    free(gbnf);
    json_decref(schema);
    vocab_free(&vc);
}
END_TEST

START_TEST(schema_accepts_and_refuses)
{
    json_t *s = json_loads(schemas[0], 0, NULL);
    char *gbnf;
    ck_assert_int_eq(grammar_from_schema(s, &gbnf), 0);
    struct grammar *g = gt_parse_ok(gbnf);
    YES(g, "{\"name\": \"bo\", \"tags\": [\"a\", 3]}");
    YES(g, "{\"name\":\"\",\"age\":41,\"tags\":[null],\"ok\":true}");
    NO(g, "{\"tags\": [\"a\"]}");                               /* name is required */
    NO(g, "{\"name\": \"bo\", \"tags\": []}");                  /* minItems */
    NO(g, "{\"name\": \"bo\", \"tags\": [1]}");                 /* enum */
    NO(g, "{\"name\": \"bo\", \"tags\": [\"a\"], \"z\": 1}");   /* additionalProperties */
    NO(g, "{\"name\": \"toolongname\", \"tags\": [\"a\"]}");    /* maxLength */
    NO(g, "{\"name\": \"b\", \"age\": -1, \"tags\": [\"a\"]}"); /* minimum 0 */
    grammar_fini(g);
    free(gbnf);
    json_decref(s);
}
END_TEST

START_TEST(schema_errors_name_the_path)
{
    gt_schema_fails("{\"type\": \"strin\"}", "unknown type 'strin'");
    gt_schema_fails("{\"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"^a\"}}}",
                 "#/properties/a: 'pattern' is not supported");
    gt_schema_fails("{\"$ref\": \"#/$defs/nope\"}", "does not resolve");
    gt_schema_fails("{\"$ref\": \"http://x/s.json\"}", "only local references");
    gt_schema_fails("{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}", "below minItems");
    gt_schema_fails("{\"type\": \"object\", \"properties\": {}, \"required\": [\"a\"]}",
                 "not in 'properties'");
    gt_schema_fails("false", "accepts nothing");
    gt_schema_fails("{\"type\": \"object\", \"properties\": {\"a\": 3}}", "#/properties/a");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grammar");
    TCase *tc = tcase_create("grammar");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, gbnf_matches_as_llama_cpp);
    tcase_add_test(tc, gbnf_handles_utf8);
    tcase_add_test(tc, gbnf_errors_say_where);
    tcase_add_test(tc, masks_equal_feeding_each_token);
    tcase_add_test(tc, token_references_match_control_tokens_only);
    tcase_add_test(tc, lazy_grammars_are_free_until_a_trigger);
    tcase_add_loop_test(tc, schema_outputs_validate, 0, (int)(sizeof schemas / sizeof *schemas));
    tcase_add_test(tc, schema_accepts_and_refuses);
    tcase_add_test(tc, schema_errors_name_the_path);
    suite_add_tcase(s, tc);
    return test_run(s);
}
