/* api_out_test — the translated APIs' shared parts on their own: the parse entry with translators
 * that succeed, fail with and without a body, and hand over a chat body the chat parser refuses;
 * server-sent events byte for byte (named and not, many in one buffer, growth, data that holds
 * newlines); api_str on bytes that are not UTF-8. */
#include "frontend/api_out.h"

#include "common/base/err.h"
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>

/* translators for the parse entry: what each does is its name */
static unsigned tr_to_chat(json_t *in, json_t **out, struct api_error *e)
{
    json_t *q = json_object_get(in, "q");
    if (!json_is_string(q)) return api_fail(e, 400, "invalid_request_error", "q", NULL, "no q");
    *out = json_pack("{s:[{s:s, s:O}], s:i}", "messages", "role", "user", "content", q,
                     "max_tokens", 9);
    return 0;
}

static unsigned tr_fail_with_body(json_t *in, json_t **out, struct api_error *e)
{
    *out = json_pack("{s:s}", "half", "done"); /* made before it failed: the caller frees it */
    return api_fail(e, 422, "invalid_request_error", "x", NULL, "x is wrong");
}

static unsigned tr_bad_chat(json_t *in, json_t **out, struct api_error *e)
{
    *out = json_pack("{s:i}", "messages", 3);
    return 0;
}

static int g_calls;

static unsigned tr_counting(json_t *in, json_t **out, struct api_error *e)
{
    g_calls++;
    return tr_to_chat(in, out, e);
}

static unsigned parse(api_translate_fn tr, const char *body, struct api_params *p,
                      struct api_error *e)
{
    memset(e, 0, sizeof *e);
    return api_parse_translated(API_MESSAGES, tr, body, strlen(body), 1000, p, e);
}

START_TEST(parse_translated)
{
    struct api_params p;
    struct api_error e;
    ck_assert_uint_eq(parse(tr_to_chat, "{\"q\": \"hi\"}", &p, &e), 0);
    ck_assert_int_eq(p.kind, API_MESSAGES);
    ck_assert_uint_eq(json_array_size(p.messages), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(p.messages, 0), "content")),
                     "hi");
    ck_assert_uint_eq(p.max_tokens, 9);
    api_params_free(&p);

    /* the translator's own error, with and without a half-made body (freed with p) */
    ck_assert_uint_eq(parse(tr_to_chat, "{\"r\": 1}", &p, &e), 400);
    ck_assert_str_eq(e.param, "q");
    ck_assert_ptr_null(p.root);
    api_params_free(&p);
    ck_assert_uint_eq(parse(tr_fail_with_body, "{}", &p, &e), 422);
    ck_assert_str_eq(e.message, "x is wrong");
    ck_assert_ptr_nonnull(p.root);
    api_params_free(&p);

    /* a translation the chat parser refuses fails as a chat body would */
    ck_assert_uint_eq(parse(tr_bad_chat, "{}", &p, &e), 400);
    ck_assert_str_eq(e.param, "messages");
    api_params_free(&p);

    /* bodies that are not a JSON object never reach the translator */
    static const char *const bad[] = {"", "{", "[1, 2]", "\"s\"", "{\"q\": \"a\"} x", "nul"};
    g_calls = 0;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_msg(parse(tr_counting, bad[i], &p, &e) == 400, "'%s' accepted", bad[i]);
        ck_assert_msg(strstr(e.message, "JSON"), "'%s': %s", bad[i], e.message);
        ck_assert_ptr_null(p.root);
        api_params_free(&p);
    }
    ck_assert_int_eq(g_calls, 0);
    /* a body with a NUL inside is cut by its length, not its first NUL */
    memset(&e, 0, sizeof e);
    ck_assert_uint_eq(
        api_parse_translated(API_MESSAGES, tr_to_chat, "{\"q\": \"a\"}\0junk", 10, 1000, &p, &e),
        0);
    api_params_free(&p);
}
END_TEST

START_TEST(sse_events_byte_for_byte)
{
    struct api_sse b = {0};
    ck_assert_int_eq(api_sse_event(&b, "ping", json_pack("{s:s}", "type", "ping")), 0);
    ck_assert_str_eq(b.p, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    ck_assert_uint_eq(b.n, strlen(b.p));
    /* no name: a data line only; reals at 8 digits; text with newlines stays on its line */
    ck_assert_int_eq(
        api_sse_event(&b, NULL, json_pack("{s:f, s:s}", "p", 0.1, "text", "a\nb\r\n\nc")), 0);
    ck_assert_str_eq(b.p, "event: ping\ndata: {\"type\":\"ping\"}\n\n"
                          "data: {\"p\":0.1,\"text\":\"a\\nb\\r\\n\\nc\"}\n\n");
    /* any JSON value is data, not only objects */
    ck_assert_int_eq(api_sse_event(&b, "n", json_integer(3)), 0);
    static const char tail[] = "event: n\ndata: 3\n\n";
    ck_assert(b.n > sizeof tail && strcmp(b.p + b.n - (sizeof tail - 1), tail) == 0);
    api_sse_free(&b);
    ck_assert_ptr_null(b.p);
    ck_assert_uint_eq(b.n, 0);
    ck_assert_uint_eq(b.cap, 0);

    /* no data (a failed json_pack upstream): STRATA_ENOMEM and nothing written */
    ck_assert_int_eq(api_sse_event(&b, "x", NULL), STRATA_ENOMEM);
    ck_assert_uint_eq(b.n, 0);

    /* growth: events past the first 1 KiB, many of them, each intact and in order */
    char big[5000];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = 0;
    for (int i = 0; i < 200; i++)
        ck_assert_int_eq(
            api_sse_event(&b, "d", json_pack("{s:i, s:s}", "i", i, "s", i % 50 == 0 ? big : "")),
            0);
    ck_assert_uint_eq(strlen(b.p), b.n);
    ck_assert_uint_le(b.n + 1, b.cap);
    const char *p = b.p;
    for (int i = 0; i < 200; i++) {
        char head[64];
        int hn = snprintf(head, sizeof head, "event: d\ndata: {\"i\":%d,\"s\":\"", i);
        ck_assert_msg(strncmp(p, head, (size_t)hn) == 0, "event %d: %.40s", i, p);
        p += hn;
        if (i % 50 == 0) {
            ck_assert_int_eq(strspn(p, "z"), sizeof big - 1);
            p += sizeof big - 1;
        }
        ck_assert_int_eq(strncmp(p, "\"}\n\n", 4), 0);
        p += 4;
    }
    ck_assert_ptr_eq(p, b.p + b.n);
    api_sse_free(&b);
}
END_TEST

START_TEST(api_str_takes_any_bytes)
{
    json_t *s = api_str(NULL, 5);
    ck_assert_str_eq(json_string_value(s), "");
    json_decref(s);
    s = api_str("héllo", 6);
    ck_assert_str_eq(json_string_value(s), "héllo");
    json_decref(s);
    /* a character cut by the length, and a byte that is never UTF-8: U+FFFD each */
    s = api_str("é", 1);
    ck_assert_str_eq(json_string_value(s), "\xef\xbf\xbd");
    json_decref(s);
    s = api_str("a\xff"
                "b\xc3",
                4);
    ck_assert_str_eq(json_string_value(s), "a\xef\xbf\xbd"
                                           "b\xef\xbf\xbd");
    json_decref(s);
    /* a NUL inside is kept: the length says where the text ends */
    s = api_str("a\0b", 3);
    ck_assert_uint_eq(json_string_length(s), 3);
    ck_assert_int_eq(memcmp(json_string_value(s), "a\0b", 3), 0);
    json_decref(s);
    s = api_str("abc", 0);
    ck_assert_str_eq(json_string_value(s), "");
    json_decref(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("api_out");
    TCase *tc = tcase_create("api_out");
    tcase_add_test(tc, parse_translated);
    tcase_add_test(tc, sse_events_byte_for_byte);
    tcase_add_test(tc, api_str_takes_any_bytes);
    suite_add_tcase(s, tc);
    return test_run(s);
}
