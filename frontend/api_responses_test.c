/* api_responses_test — Responses bodies translated into chat bodies (instructions, input items,
 * function tools, reasoning, text.format, logprobs), the refusals of a stateless server, and
 * answers rendered back: the whole response and the stream's events with their sequence numbers. */
#include "frontend/api_responses.h"

#include "frontend/api_test.h"
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>

/* translate runs the translation of body; the chat body comes without its echo of the request
 * (checked apart). */
static json_t *translate(const char *body, unsigned want, const char *param)
{
    json_t *out = api_test_translate(api_responses_translate, body, want, param);
    if (out)
        json_object_del(out, "x-strata-responses"); /* the echo of the request, checked below */
    return out;
}

START_TEST(translate_items)
{
    json_t *o = translate(
        "{\"model\":\"m\",\"instructions\":\"Be brief.\",\"max_output_tokens\":50,"
        "\"temperature\":0.2,\"stream\":true,\"reasoning\":{\"effort\":\"low\"},"
        "\"top_logprobs\":2,\"include\":[\"message.output_text.logprobs\"],\"store\":true,"
        "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"w\",\"schema\":{\"type\":"
        "\"object\"},\"strict\":true}},"
        "\"input\":["
        "{\"role\":\"developer\",\"content\":\"Use tools.\"},"
        "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":"
        "\"Weather in \"},{\"type\":\"input_text\",\"text\":\"Paris and Rome?\"}]},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":"
        "\"reasoning_text\",\"text\":\"Two calls.\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"weather\",\"arguments\":"
        "\"{\\\"city\\\":\\\"Paris\\\"}\"},"
        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"weather\",\"arguments\":"
        "\"{\\\"city\\\":\\\"Rome\\\"}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"18 C\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":\"21 C\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Warm.\"}]}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"weather\",\"description\":\"d\","
        "\"parameters\":{\"type\":\"object\"},\"strict\":true}],"
        "\"tool_choice\":{\"type\":\"function\",\"name\":\"weather\"},"
        "\"parallel_tool_calls\":false}",
        0, NULL);
    api_test_json_eq(
        o,
        "{\"model\":\"m\",\"max_tokens\":50,\"temperature\":0.2,\"stream\":true,"
        "\"reasoning_effort\":\"low\",\"logprobs\":true,\"top_logprobs\":2,"
        "\"parallel_tool_calls\":false,"
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"w\",\"schema\":"
        "{\"type\":\"object\"},\"strict\":true}},"
        "\"messages\":["
        "{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"system\",\"content\":\"Use tools.\"},"
        "{\"role\":\"user\",\"content\":\"Weather in Paris and Rome?\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"Two calls.\","
        "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"weather\","
        "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},{\"id\":\"c2\",\"type\":\"function\","
        "\"function\":{\"name\":\"weather\",\"arguments\":\"{\\\"city\\\":\\\"Rome\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"18 C\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"21 C\"},"
        "{\"role\":\"assistant\",\"content\":\"Warm.\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"weather\",\"description\":"
        "\"d\",\"parameters\":{\"type\":\"object\"},\"strict\":true}}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"weather\"}}}");
    json_decref(o);
    o = translate("{\"input\":\"Hi\",\"tools\":[],\"tool_choice\":\"none\"}", 0, NULL);
    /* no tools is no 'tools' (the chat API refuses an empty list) */
    api_test_json_eq(o, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                        "\"tool_choice\":\"none\"}");
    json_decref(o);
}
END_TEST

START_TEST(translate_errors)
{
    static const struct {
        const char *body, *param;
    } cases[] = {
        {"{}", "input"},
        {"{\"input\":[]}", "input"},
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id"},
        {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_1\"}]}", "input[0]"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":"
         "\"x\"}]}]}",
         "input[0].content"},
        {"{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input[0]"},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"n\"}]}", "input[0]"},
        {"{\"input\":[{\"type\":\"function_call_output\",\"output\":\"x\"}]}", "input[0]"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools"},
        {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens"},
        {"{\"input\":\"x\",\"instructions\":3}", "instructions"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "text.format"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        translate(cases[i].body, 400, cases[i].param);
    /* a chat check on the translated body */
    struct api_params p;
    struct api_error e;
    const char *body = "{\"input\":\"x\",\"temperature\":5}";
    ck_assert_uint_eq(api_responses_parse(body, strlen(body), 100, &p, &e), 400);
    ck_assert_str_eq(e.param, "temperature");
    api_params_free(&p);
}
END_TEST

static struct api_tool_call CALLS[] = {{"call_a", "weather", "{\"city\":\"Paris\"}"}};

/* with_request parses body into p, for the answers' echo of the request. */
static void with_request(const char *body, struct api_params *p)
{
    struct api_error e;
    ck_assert_uint_eq(api_responses_parse(body, strlen(body), 100, p, &e), 0);
}

static struct api_answer an_answer(const struct api_params *p, enum api_finish finish)
{
    return api_test_answer("resp_r1", p, finish);
}

START_TEST(whole_response)
{
    struct api_params p;
    with_request("{\"input\":\"x\",\"instructions\":\"I\",\"temperature\":0,\"tools\":[{\"type\":"
                 "\"function\",\"name\":\"weather\"}]}",
                 &p);
    struct api_answer a = an_answer(&p, API_FINISH_TOOL_CALLS);
    a.tool_calls = CALLS;
    a.n_tool_calls = 1;
    json_t *r = api_responses_object(&a);
    api_test_json_eq(
        json_object_get(r, "output"),
        "[{\"id\":\"rs_r1_0\",\"type\":\"reasoning\",\"summary\":[],\"status\":"
        "\"completed\",\"content\":[{\"type\":\"reasoning_text\",\"text\":\"Think.\"}]},"
        "{\"id\":\"msg_r1_0\",\"type\":\"message\",\"status\":\"completed\",\"role\":"
        "\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hello.\","
        "\"annotations\":[],\"logprobs\":[]}]},"
        "{\"id\":\"fc_r1_0\",\"type\":\"function_call\",\"status\":\"completed\","
        "\"call_id\":\"call_a\",\"name\":\"weather\",\"arguments\":"
        "\"{\\\"city\\\":\\\"Paris\\\"}\"}]");
    api_test_json_eq(json_object_get(r, "usage"),
                     "{\"input_tokens\":20,\"input_tokens_details\":{\"cached_tokens\":16},"
                     "\"output_tokens\":5,\"output_tokens_details\":{\"reasoning_tokens\":0},"
                     "\"total_tokens\":25}");
    ck_assert_str_eq(json_string_value(json_object_get(r, "object")), "response");
    ck_assert_str_eq(json_string_value(json_object_get(r, "status")), "completed");
    ck_assert_str_eq(json_string_value(json_object_get(r, "instructions")), "I");
    ck_assert_str_eq(json_string_value(json_object_get(r, "tool_choice")), "auto");
    ck_assert(json_is_null(json_object_get(r, "max_output_tokens")));
    ck_assert_int_eq(json_array_size(json_object_get(r, "tools")), 1);
    ck_assert(json_real_value(json_object_get(r, "temperature")) == 0.0);
    ck_assert(json_is_false(json_object_get(r, "store")));
    json_decref(r);
    a = an_answer(&p, API_FINISH_LENGTH);
    a.reasoning_len = 0;
    r = api_responses_object(&a);
    ck_assert_str_eq(json_string_value(json_object_get(r, "status")), "incomplete");
    api_test_json_eq(json_object_get(r, "incomplete_details"),
                     "{\"reason\":\"max_output_tokens\"}");
    ck_assert_int_eq(json_array_size(json_object_get(r, "output")), 1);
    json_decref(r);
    api_params_free(&p);
}
END_TEST

/* events splits an SSE buffer, checking "event: NAME" equals data.type and that the sequence
 * numbers count from 0 without a gap. */
static json_t *events(const struct api_sse *b)
{
    return api_test_events(b, true);
}

static const char *type_at(json_t *ev, size_t i)
{
    return json_string_value(json_object_get(json_array_get(ev, i), "type"));
}

START_TEST(stream_events)
{
    struct api_params p;
    with_request("{\"input\":\"x\",\"stream\":true}", &p);
    struct api_answer a = an_answer(&p, API_FINISH_NONE);
    struct api_responses_stream s = {0};
    struct api_sse b = {0};
    ck_assert_int_eq(api_responses_delta(&s, &a, "Thi", 3, NULL, 0, &b), 0);
    ck_assert_int_eq(api_responses_delta(&s, &a, "nk.", 3, "Hel", 3, &b), 0);
    ck_assert_int_eq(api_responses_delta(&s, &a, NULL, 0, "lo.", 3, &b), 0);
    a.finish = API_FINISH_TOOL_CALLS;
    a.tool_calls = CALLS;
    a.n_tool_calls = 1;
    ck_assert_int_eq(api_responses_finish(&s, &a, &b), 0);
    json_t *ev = events(&b);
    static const char *const want[] = {
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    };
    ck_assert_int_eq(json_array_size(ev), sizeof want / sizeof *want);
    for (size_t i = 0; i < json_array_size(ev); i++)
        ck_assert_str_eq(type_at(ev, i), want[i]);
    json_t *created = json_object_get(json_array_get(ev, 0), "response");
    ck_assert_str_eq(json_string_value(json_object_get(created, "status")), "in_progress");
    ck_assert(json_is_null(json_object_get(created, "usage")));
    api_test_json_eq(json_array_get(ev, 12),
                     "{\"type\":\"response.output_text.delta\",\"sequence_number\":12,\"item_id\":"
                     "\"msg_r1_0\",\"output_index\":1,\"content_index\":0,\"delta\":\"lo.\","
                     "\"logprobs\":[]}");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, 13), "text")), "Hello.");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, 6), "text")), "Think.");
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(ev, 17), "output_index")),
                     2);
    /* the final response holds every item whole, with the usage */
    json_t *done = json_object_get(json_array_get(ev, 20), "response");
    struct api_answer whole = an_answer(&p, API_FINISH_TOOL_CALLS);
    whole.tool_calls = CALLS;
    whole.n_tool_calls = 1;
    json_t *w = api_responses_object(&whole);
    ck_assert(json_equal(json_object_get(done, "output"), json_object_get(w, "output")));
    ck_assert(json_equal(json_object_get(done, "usage"), json_object_get(w, "usage")));
    json_decref(w);
    json_decref(ev);
    api_responses_stream_fini(&s);
    /* max tokens: response.incomplete; an empty answer is an empty message; errors are events */
    b.n = 0;
    a = an_answer(&p, API_FINISH_LENGTH);
    ck_assert_int_eq(api_responses_finish(&s, &a, &b), 0);
    struct api_error e;
    api_fail(&e, 500, "server_error", NULL, "worker_error", "the worker failed");
    ck_assert_int_eq(api_responses_error_event(&s, &e, &b), 0);
    ev = events(&b);
    ck_assert_int_eq(json_array_size(ev), 9);
    ck_assert_str_eq(type_at(ev, 2), "response.output_item.added");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, 4), "text")), "");
    ck_assert_str_eq(type_at(ev, 7), "response.incomplete");
    ck_assert_str_eq(type_at(ev, 8), "error");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, 8), "code")),
                     "worker_error");
    json_decref(ev);
    api_responses_stream_fini(&s);
    api_sse_free(&b);
    api_params_free(&p);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("api_responses");
    TCase *tc = tcase_create("responses");
    tcase_add_test(tc, translate_items);
    tcase_add_test(tc, translate_errors);
    tcase_add_test(tc, whole_response);
    tcase_add_test(tc, stream_events);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(suite());
}
