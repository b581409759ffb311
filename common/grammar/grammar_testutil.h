/* grammar_testutil — the checks the grammar suites share (grammar_test, gbnf_test, schema_test):
 * parse or compile a grammar that must be accepted, refuse one with its code and detail, and ask
 * whether a text is a whole sentence. Test code only: each helper fails the running Check test. */
#ifndef STRATA_GRAMMAR_TESTUTIL_H
#define STRATA_GRAMMAR_TESTUTIL_H

#include "common/base/err.h"
#include "common/grammar/grammar.h"

#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* gt_parse_ok: text's grammar (the test fails if it is refused). */
static inline struct grammar *gt_parse_ok(const char *text)
{
    struct grammar *g = NULL;
    int rv = grammar_parse(text, strlen(text), &g);
    ck_assert_msg(rv == 0, "parse failed: %s\n%.200s", strata_errdetail(), text);
    return g;
}

/* gt_parse_fails: text[0..n) is refused with code, a detail holding want, and no grammar. */
static inline void gt_parse_fails(const char *text, size_t n, int code, const char *want)
{
    struct grammar *g = (struct grammar *)&g; /* must be cleared */
    int rv = grammar_parse(text, n, &g);
    ck_assert_msg(rv == code, "%.80s: rv %d (%s), want %d", text, rv, strata_errdetail(), code);
    ck_assert_msg(strstr(strata_errdetail(), want), "%.80s: detail '%s', want '%s'", text,
                  strata_errdetail(), want);
    ck_assert_ptr_null(g);
}

/* gt_schema_ok: the grammar JSON Schema src compiles to, parsed (its GBNF must parse). */
static inline struct grammar *gt_schema_ok(const char *src)
{
    json_error_t je;
    json_t *s = json_loads(src, JSON_DECODE_ANY, &je);
    ck_assert_msg(s != NULL, "bad test JSON: %s", je.text);
    char *gbnf = NULL;
    ck_assert_msg(grammar_from_schema(s, &gbnf) == 0, "%s: %s", src, strata_errdetail());
    json_decref(s);
    struct grammar *g = NULL;
    ck_assert_msg(grammar_parse(gbnf, strlen(gbnf), &g) == 0, "%s\n%s", strata_errdetail(), gbnf);
    free(gbnf);
    return g;
}

/* gt_schema_fails_json: schema s is refused with STRATA_EINVAL, a detail holding want, no text. */
static inline void gt_schema_fails_json(const json_t *s, const char *want)
{
    char *gbnf = (char *)&gbnf; /* must be cleared */
    ck_assert_int_eq(grammar_from_schema(s, &gbnf), STRATA_EINVAL);
    ck_assert_msg(strstr(strata_errdetail(), want), "detail '%s', want '%s'", strata_errdetail(),
                  want);
    ck_assert_ptr_null(gbnf);
}

/* gt_schema_fails: gt_schema_fails_json of the JSON text src. */
static inline void gt_schema_fails(const char *src, const char *want)
{
    json_t *s = json_loads(src, JSON_DECODE_ANY, NULL);
    ck_assert_msg(s != NULL, "bad test JSON: %s", src);
    gt_schema_fails_json(s, want);
    json_decref(s);
}

/* gt_matches: the whole of s[0..n) is a sentence of g. */
static inline bool gt_matches(const struct grammar *g, const char *s, size_t n)
{
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    bool ok = grammar_matcher_feed(m, s, n) == 0 && grammar_matcher_accepting(m);
    grammar_matcher_fini(m);
    return ok;
}

#define YES(g, s) ck_assert_msg(gt_matches(g, s, strlen(s)), "should match: %s", s)
#define NO(g, s)  ck_assert_msg(!gt_matches(g, s, strlen(s)), "should not match: %s", s)

#endif
