/* api_test — the fixtures that the tests of the translated APIs (api_anthropic_test.c,
 * api_responses_test.c) share: a translation run against the status it should give, and a
 * comparison with the JSON expected, the answer their renderers start from and a splitter of the
 * events they stream. For tests only (it
 * asserts with Check). */
#ifndef STRATA_API_TEST_H
#define STRATA_API_TEST_H

#include "frontend/api_out.h"

#include <check.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* api_test_translate runs translate over body, checks its status (want) and, when param is not
 * NULL, the error's param; returns the chat body (the test frees it), NULL on an error. */
static inline json_t *api_test_translate(api_translate_fn translate, const char *body,
                                         unsigned want, const char *param)
{
    json_error_t je;
    json_t *in = json_loads(body, 0, &je), *out = NULL;
    ck_assert_msg(in != NULL, "bad test JSON: %s", je.text);
    struct api_error e = {0};
    unsigned st = translate(in, &out, &e);
    ck_assert_msg(st == want, "status %u, want %u: %s", st, want, e.message);
    if (param) ck_assert_str_eq(e.param, param);
    json_decref(in);
    if (st != 0) {
        json_decref(out);
        return NULL;
    }
    return out;
}

/* api_test_json_eq asserts that got equals the JSON text want. */
static inline void api_test_json_eq(json_t *got, const char *want)
{
    json_error_t je;
    json_t *w = json_loads(want, 0, &je);
    ck_assert_msg(w != NULL, "bad expected JSON: %s", je.text);
    char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
    ck_assert_msg(json_equal(got, w), "got %s", g);
    free(g);
    json_decref(w);
}

/* api_test_events splits an SSE buffer into its events' data, checking that "event: NAME" is
 * followed by data whose type is NAME; numbered: each has sequence_number counting from 0. */
static inline json_t *api_test_events(const struct api_sse *b, bool numbered)
{
    json_t *list = json_array();
    for (const char *p = b->p; p && *p;) {
        ck_assert_msg(strncmp(p, "event: ", 7) == 0, "not an event: %.40s", p);
        const char *nl = strchr(p, '\n');
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(nl - p - 7), p + 7);
        ck_assert(strncmp(nl + 1, "data: ", 6) == 0);
        const char *end = strstr(nl, "\n\n");
        json_t *d = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
        ck_assert_ptr_nonnull(d);
        ck_assert_str_eq(json_string_value(json_object_get(d, "type")), name);
        if (numbered)
            ck_assert_int_eq(json_integer_value(json_object_get(d, "sequence_number")),
                             json_array_size(list));
        json_array_append_new(list, d);
        p = end + 2;
    }
    return list;
}

/* api_test_answer: the answer the renderers' tests start from (id, the request p, finish). */
static inline struct api_answer api_test_answer(const char *id, const struct api_params *p,
                                                enum api_finish finish)
{
    return (struct api_answer){.id = id,
                               .model = "m",
                               .created = 7,
                               .p = p,
                               .n_prompt = 20,
                               .n_cached = 16,
                               .n_gen = 5,
                               .content = "Hello.",
                               .content_len = 6,
                               .reasoning = "Think.",
                               .reasoning_len = 6,
                               .finish = finish};
}

#endif
