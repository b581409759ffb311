/* schema_test — JSON Schema to GBNF feature by feature (grammar_test.c checks random outputs
 * against a validator): enums and consts, required and optional members in order, nested objects,
 * arrays with minItems/maxItems and tuples, additionalProperties, local $refs and recursion
 * through them, string lengths and formats, UTF-8 in names and values; and bad schemas: a clear
 * STRATA_EINVAL naming the path, never a crash or a grammar that its own parser refuses, for
 * schemas nested 10,000 deep directly or through $refs, and $ref cycles without a value. */
#include "common/base/err.h"
#include "common/grammar/grammar.h"
#include "common/grammar/grammar_testutil.h"
#include "tests/testutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

START_TEST(enums_and_consts)
{
    struct grammar *g = gt_schema_ok("{\"enum\": [\"red\", 3, null, true, [1], {\"a\": \"é\"}, "
                                "\"日本\"]}");
    YES(g, "\"red\"");
    YES(g, "3");
    YES(g, "null");
    YES(g, "true");
    YES(g, "[1]");
    YES(g, "{\"a\":\"é\"}");
    YES(g, "\"日本\"");
    NO(g, "\"Red\"");
    NO(g, "4");
    NO(g, "false");
    NO(g, "\"日\"");
    grammar_fini(g);
    g = gt_schema_ok("{\"const\": \"a\\\"b\\\\c\\n\"}");
    YES(g, "\"a\\\"b\\\\c\\n\"");
    NO(g, "\"a\"");
    grammar_fini(g);
    gt_schema_fails("{\"enum\": []}", "#: 'enum' must be a non-empty array");
    gt_schema_fails("{\"enum\": \"a\"}", "'enum' must be a non-empty array");
}
END_TEST

START_TEST(objects_required_optional_nested)
{
    struct grammar *g = gt_schema_ok(
        "{\"type\": \"object\", \"properties\": {"
        "\"id\": {\"type\": \"integer\"}, \"név\": {\"type\": \"string\"},"
        "\"inner\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"}}, "
        "\"required\": [\"x\"], \"additionalProperties\": false}},"
        "\"required\": [\"id\", \"inner\"]}");
    YES(g, "{\"id\": 1, \"inner\": {\"x\": 2.5}}");
    YES(g, "{\"id\":-7,\"név\":\"\",\"inner\":{\"x\":1e3}}");
    NO(g, "{\"inner\": {\"x\": 1}}");                      /* id is required */
    NO(g, "{\"id\": 1}");                                  /* inner too */
    NO(g, "{\"id\": 1, \"inner\": {}}");                   /* and inner's x */
    NO(g, "{\"inner\": {\"x\": 1}, \"id\": 1}");           /* members come in the schema's order */
    NO(g, "{\"id\": 1, \"inner\": {\"x\": 1, \"y\": 2}}"); /* no other members */
    NO(g, "{\"id\": 1.5, \"inner\": {\"x\": 1}}");         /* integer */
    NO(g, "{\"id\": 1,, \"inner\": {\"x\": 1}}");
    grammar_fini(g);
    /* every member optional: the empty object, any subset in order */
    g = gt_schema_ok("{\"properties\": {\"a\": {\"type\": \"boolean\"}, \"b\": {\"type\": \"null\"}}}");
    YES(g, "{}");
    YES(g, "{\"b\": null}");
    YES(g, "{\"a\": false, \"b\": null}");
    NO(g, "{,\"b\": null}");
    NO(g, "{\"a\": false,}");
    grammar_fini(g);
    gt_schema_fails("{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": \"a\"}",
          "'required' must be an array of names");
    gt_schema_fails("{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [1]}",
          "'required' must be an array of names");
    gt_schema_fails("{\"type\": \"object\", \"properties\": []}", "'properties' must be an object");
    gt_schema_fails("{\"properties\": {\"a\": {\"properties\": {\"b\": {\"type\": \"nope\"}}}}}",
          "JSON schema at #/properties/a/properties/b: unknown type 'nope'");
}
END_TEST

START_TEST(additional_properties)
{
    struct grammar *g = gt_schema_ok("{\"type\": \"object\", \"additionalProperties\": "
                                "{\"type\": \"integer\"}}");
    YES(g, "{}");
    YES(g, "{\"a\": 1, \"ü\": -2}");
    NO(g, "{\"a\": \"x\"}");
    NO(g, "{\"a\": 1,}");
    grammar_fini(g);
    g = gt_schema_ok("{\"type\": \"object\", \"additionalProperties\": false}");
    YES(g, "{}");
    YES(g, "{ }");
    NO(g, "{\"a\": 1}");
    grammar_fini(g);
    g = gt_schema_ok("{\"type\": \"object\"}"); /* any object */
    YES(g, "{\"a\": [1, {\"b\": null}]}");
    NO(g, "[]");
    grammar_fini(g);
}
END_TEST

START_TEST(arrays_and_bounds)
{
    struct grammar *g = gt_schema_ok("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, "
                                "\"minItems\": 2, \"maxItems\": 3}");
    NO(g, "[]");
    NO(g, "[1]");
    YES(g, "[1, 2]");
    YES(g, "[1,2,3]");
    NO(g, "[1, 2, 3, 4]");
    NO(g, "[1, \"2\"]");
    grammar_fini(g);
    g = gt_schema_ok("{\"type\": \"array\", \"maxItems\": 0}");
    YES(g, "[]");
    NO(g, "[1]");
    grammar_fini(g);
    g = gt_schema_ok("{\"type\": \"array\", \"minItems\": 1}");
    NO(g, "[]");
    YES(g, "[{}, [], \"x\", 1.5, null]");
    grammar_fini(g);
    g = gt_schema_ok("{\"prefixItems\": [{\"type\": \"string\"}, {\"enum\": [1, 2]}]}");
    YES(g, "[\"a\", 2]");
    NO(g, "[\"a\"]");
    NO(g, "[\"a\", 3]");
    NO(g, "[\"a\", 1, 1]");
    grammar_fini(g);
    g = gt_schema_ok("{\"items\": [{\"type\": \"boolean\"}]}"); /* draft 4-7 tuples */
    YES(g, "[true]");
    NO(g, "[true, true]");
    grammar_fini(g);
    gt_schema_fails("{\"type\": \"array\", \"minItems\": -1}", "'minItems' must be an integer in [0, 10000]");
    gt_schema_fails("{\"type\": \"array\", \"maxItems\": 10001}", "'maxItems' must be an integer");
    gt_schema_fails("{\"type\": \"array\", \"maxItems\": 1.5}", "'maxItems' must be an integer");
    gt_schema_fails("{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}",
          "maxItems 2 is below minItems 3");
    gt_schema_fails("{\"type\": \"array\", \"prefixItems\": {}}", "'prefixItems' must be an array");
    /* the largest bounds compile to a grammar that parses */
    grammar_fini(gt_schema_ok("{\"type\": \"array\", \"minItems\": 10000, \"maxItems\": 10000}"));
}
END_TEST

START_TEST(strings_and_formats)
{
    struct grammar *g = gt_schema_ok("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}");
    NO(g, "\"a\"");
    YES(g, "\"ab\"");
    YES(g, "\"日本語\""); /* characters, not bytes */
    YES(g, "\"\\n\\u00e9\"");
    NO(g, "\"abcd\"");
    grammar_fini(g);
    g = gt_schema_ok("{\"type\": \"string\", \"format\": \"date-time\"}");
    YES(g, "\"2026-12-02T06:40:00Z\"");
    YES(g, "\"2026-01-31T23:59:59.123+05:30\"");
    NO(g, "\"2026-13-02T06:40:00Z\"");
    NO(g, "\"2026-12-02 06:40:00Z\"");
    grammar_fini(g);
    g = gt_schema_ok("{\"type\": \"string\", \"format\": \"uuid\"}");
    YES(g, "\"123e4567-e89b-12d3-a456-426614174000\"");
    NO(g, "\"123e4567e89b12d3a456426614174000\"");
    grammar_fini(g);
    /* a string never holds a raw control character or an unpaired quote */
    g = gt_schema_ok("{\"type\": \"string\"}");
    NO(g, "\"a\nb\"");
    NO(g, "\"a\"b\"");
    YES(g, "\"a\\\"b\"");
    grammar_fini(g);
    gt_schema_fails("{\"type\": \"string\", \"pattern\": \"^[a-z]+$\"}", "'pattern' is not supported");
    gt_schema_fails("{\"type\": \"string\", \"minLength\": 5, \"maxLength\": 4}", "maxLength 4 is below");
}
END_TEST

START_TEST(types_and_combinators)
{
    struct grammar *g = gt_schema_ok("{\"type\": [\"integer\", \"null\"]}");
    YES(g, "12");
    YES(g, "null");
    NO(g, "\"12\"");
    grammar_fini(g);
    g = gt_schema_ok("{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"array\", \"maxItems\": 1}]}");
    YES(g, "\"x\"");
    YES(g, "[3]");
    NO(g, "[3, 4]");
    grammar_fini(g);
    g = gt_schema_ok("{\"type\": \"integer\", \"minimum\": 0}");
    YES(g, "0");
    NO(g, "-1");
    NO(g, "01");
    grammar_fini(g);
    g = gt_schema_ok("true");
    YES(g, "[1, {\"a\": \"b\"}]");
    grammar_fini(g);
    gt_schema_fails("{\"type\": []}", "'type' is an empty array");
    gt_schema_fails("{\"type\": [\"string\", 3]}", "'type' must be a string or an array of strings");
    gt_schema_fails("{\"type\": 3}", "'type' must be a string");
    gt_schema_fails("{\"anyOf\": []}", "'anyOf' must be a non-empty array of schemas");
    gt_schema_fails("{\"oneOf\": {}}", "'oneOf' must be a non-empty array");
    gt_schema_fails("{\"allOf\": [{}, {}]}", "'allOf' is supported with one schema only");
    gt_schema_fails("3", "a schema must be an object or a boolean");
    gt_schema_fails("{\"anyOf\": [{\"type\": \"string\"}, false]}", "#/anyOf/1: the schema false");
}
END_TEST

START_TEST(refs_and_recursion)
{
    /* a tree: recursion through a value is fine */
    struct grammar *g = gt_schema_ok(
        "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {"
        "\"v\": {\"type\": \"integer\"}, \"kids\": {\"type\": \"array\", \"items\": "
        "{\"$ref\": \"#/$defs/node\"}}}, \"required\": [\"v\"]}}, \"$ref\": \"#/$defs/node\"}");
    YES(g, "{\"v\": 1}");
    YES(g, "{\"v\": 1, \"kids\": [{\"v\": 2, \"kids\": [{\"v\": 3}]}, {\"v\": 4}]}");
    NO(g, "{\"v\": 1, \"kids\": [{}]}");
    grammar_fini(g);
    /* "#" is the whole schema; definitions and escaped pointer keys resolve */
    g = gt_schema_ok("{\"type\": \"array\", \"items\": {\"anyOf\": [{\"type\": \"integer\"}, "
                "{\"$ref\": \"#\"}]}}");
    YES(g, "[1, [2, [[]]], 3]");
    NO(g, "[1, [\"x\"]]");
    grammar_fini(g);
    g = gt_schema_ok("{\"definitions\": {\"a/b\": {\"const\": 1}, \"c~d\": {\"const\": 2}}, "
                "\"prefixItems\": [{\"$ref\": \"#/definitions/a~1b\"}, "
                "{\"$ref\": \"#/definitions/c~0d\"}]}");
    YES(g, "[1, 2]");
    NO(g, "[2, 1]");
    grammar_fini(g);
    /* references chained through $ref and combinators, a value at the end */
    g = gt_schema_ok("{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/b\"}, \"b\": {\"anyOf\": [{\"$ref\": "
                "\"#/$defs/c\"}]}, \"c\": {\"type\": \"boolean\"}}, \"$ref\": \"#/$defs/a\"}");
    YES(g, "true");
    NO(g, "1");
    grammar_fini(g);

    gt_schema_fails("{\"$ref\": 3}", "'$ref' must be a string");
    gt_schema_fails("{\"$ref\": \"#/$defs/x/y\", \"$defs\": {\"x\": {}}}", "does not resolve");
    /* cycles that never reach a value: refused as schemas, not left to the GBNF parser */
    gt_schema_fails("{\"$ref\": \"#\"}", "refers back to itself before any value");
    gt_schema_fails("{\"anyOf\": [{\"$ref\": \"#\"}, {\"type\": \"null\"}]}", "refers back to itself");
    gt_schema_fails("{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/b\"}, \"b\": {\"allOf\": [{\"$ref\": "
          "\"#/$defs/a\"}]}}, \"$ref\": \"#/$defs/a\"}",
          "'$ref' \"#/$defs/a\" refers back to itself");
}
END_TEST

/* nested builds {"type": "array", "items": ...} n deep (wrap in "anyOf" when any). */
static json_t *nested(int n, bool any)
{
    json_t *s = json_pack("{s:s}", "type", "integer");
    for (int i = 0; i < n; i++)
        s = any ? json_pack("{s:[o]}", "anyOf", s)
                : json_pack("{s:s, s:o}", "type", "array", "items", s);
    return s;
}

START_TEST(deep_schemas_are_refused)
{
    json_t *s = nested(60, false);
    char *gbnf = NULL;
    ck_assert_int_eq(grammar_from_schema(s, &gbnf), 0);
    free(gbnf);
    json_decref(s);
    s = nested(10000, false);
    gt_schema_fails_json(s, "schemas nested deeper than 64");
    json_decref(s);
    s = nested(10000, true);
    gt_schema_fails_json(s, "nested deeper than");
    json_decref(s);
    /* allOf of one schema adds no rule, still a level */
    s = json_pack("{s:s}", "type", "null");
    for (int i = 0; i < 10000; i++)
        s = json_pack("{s:[o]}", "allOf", s);
    gt_schema_fails_json(s, "nested deeper than");
    json_decref(s);
    /* 10,000 definitions each holding the next by $ref: each starts a rule, the C stack does not
     * start again */
    json_t *defs = json_object();
    for (int i = 0; i < 10000; i++) {
        char k[32], ref[48];
        snprintf(k, sizeof k, "d%d", i);
        snprintf(ref, sizeof ref, "#/$defs/d%d", i + 1);
        json_object_set_new(defs, k,
                            i + 1 < 10000
                                ? json_pack("{s:s, s:{s:s}}", "type", "array", "items", "$ref", ref)
                                : json_pack("{s:s}", "type", "null"));
    }
    s = json_pack("{s:o, s:s}", "$defs", defs, "$ref", "#/$defs/d0");
    gt_schema_fails_json(s, "counting those reached through '$ref'");
    json_decref(s);
}
END_TEST

START_TEST(several_schemas_share_primitives)
{
    json_t *a = json_loads("{\"type\": \"string\"}", 0, NULL);
    json_t *b = json_loads("{\"$ref\": \"#/$defs/x\", \"$defs\": {\"x\": {\"type\": "
                           "\"integer\"}}}",
                           0, NULL);
    const json_t *ss[] = {a, b};
    const char *names[] = {"args-0", "args-1"};
    char *gbnf = NULL;
    ck_assert_msg(grammar_from_schemas(ss, names, 2, &gbnf) == 0, "%s", strata_errdetail());
    /* one definition of each primitive, the caller's root on top */
    const char *p = strstr(gbnf, "\nstring ::=");
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_null(strstr(p + 1, "\nstring ::="));
    size_t n = strlen(gbnf) + 64;
    char *full = malloc(n);
    snprintf(full, n, "root ::= args-0 \"|\" args-1\n%s", gbnf);
    struct grammar *g = NULL;
    ck_assert_msg(grammar_parse(full, strlen(full), &g) == 0, "%s", strata_errdetail());
    YES(g, "\"s\"|12");
    NO(g, "12|\"s\"");
    grammar_fini(g);
    free(full);
    free(gbnf);
    /* $refs are local to their schema: the second's "#" is not the first's */
    json_t *c =
        json_loads("{\"type\": \"array\", \"items\": {\"$ref\": \"#\"}, \"maxItems\": 1}", 0, NULL);
    const json_t *ss2[] = {c, b};
    ck_assert_int_eq(grammar_from_schemas(ss2, names, 2, &gbnf), 0);
    free(gbnf);
    json_decref(a);
    json_decref(b);
    json_decref(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("schema");
    TCase *tc = tcase_create("schema");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, enums_and_consts);
    tcase_add_test(tc, objects_required_optional_nested);
    tcase_add_test(tc, additional_properties);
    tcase_add_test(tc, arrays_and_bounds);
    tcase_add_test(tc, strings_and_formats);
    tcase_add_test(tc, types_and_combinators);
    tcase_add_test(tc, refs_and_recursion);
    tcase_add_test(tc, deep_schemas_are_refused);
    tcase_add_test(tc, several_schemas_share_primitives);
    suite_add_tcase(s, tc);
    return test_run(s);
}
