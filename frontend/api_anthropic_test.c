/* api_anthropic_test — Messages bodies translated into chat bodies (system, blocks, tools, tool
 * results, thinking, stop sequences), the errors and their shape, and answers rendered back: the
 * whole message and the stream's events in order, for every stop reason. */
#include "frontend/api_anthropic.h"

#include "frontend/api_test.h"
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>

/* translate runs the translation of body and returns the chat body (the test frees it). */
static json_t *translate(const char *body, unsigned want, const char *param)
{
    return api_test_translate(api_anthropic_translate, body, want, param);
}

START_TEST(translate_conversation)
{
    json_t *o = translate(
        "{\"model\":\"m\",\"max_tokens\":64,\"temperature\":0.5,\"top_k\":3,\"stream\":true,"
        "\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\"},{\"type\":\"text\",\"text\":"
        "\"Use tools.\"}],"
        "\"stop_sequences\":[\"END\"],\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},"
        "\"metadata\":{\"user_id\":\"u\"},"
        "\"messages\":["
        "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"Need the "
        "tool.\",\"signature\":\"x\"},{\"type\":\"text\",\"text\":\"Checking.\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"weather\",\"input\":{\"city\":"
        "\"Paris\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
        "\"content\":[{\"type\":\"text\",\"text\":\"18 C\"}]},{\"type\":\"text\",\"text\":"
        "\"And tomorrow?\"}]}],"
        "\"tools\":[{\"name\":\"weather\",\"description\":\"Weather of a city\","
        "\"input_schema\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}],"
        "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true}}",
        0, NULL);
    api_test_json_eq(
        o, "{\"model\":\"m\",\"max_tokens\":64,\"temperature\":0.5,\"top_k\":3,\"stream\":true,"
           "\"stop\":[\"END\"],\"chat_template_kwargs\":{\"enable_thinking\":true},"
           "\"messages\":["
           "{\"role\":\"system\",\"content\":\"Be brief.\\nUse tools.\"},"
           "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
           "{\"role\":\"assistant\",\"content\":\"Checking.\",\"reasoning_content\":\"Need the "
           "tool.\",\"tool_calls\":[{\"id\":\"toolu_1\",\"type\":\"function\",\"function\":"
           "{\"name\":\"weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
           "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"18 C\"},"
           "{\"role\":\"user\",\"content\":\"And tomorrow?\"}],"
           "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"weather\",\"description\":"
           "\"Weather of a city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
           "{\"type\":\"string\"}}}}}],"
           "\"tool_choice\":\"required\",\"parallel_tool_calls\":false}");
    json_decref(o);
    /* tool_choice words, thinking disabled */
    o = translate("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":"
                  "\"tool\",\"name\":\"weather\"},\"thinking\":{\"type\":\"disabled\"}}",
                  0, NULL);
    api_test_json_eq(json_object_get(o, "tool_choice"),
                     "{\"type\":\"function\",\"function\":{\"name\":\"weather\"}}");
    api_test_json_eq(json_object_get(o, "chat_template_kwargs"), "{\"enable_thinking\":false}");
    json_decref(o);
}
END_TEST

START_TEST(parse_whole_request)
{
    /* through api_parse_root: the chat checks and defaults apply to the translated body */
    const char *body = "{\"max_tokens\":10,\"stop_sequences\":[\"a\",\"b\"],\"temperature\":0,"
                       "\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":"
                       "[{\"type\":\"text\",\"text\":\"hi\"}]}],\"tools\":[{\"name\":\"t\","
                       "\"input_schema\":{\"type\":\"object\"}}]}";
    struct api_params p;
    struct api_error e;
    ck_assert_uint_eq(api_anthropic_parse(body, strlen(body), 100, &p, &e), 0);
    ck_assert_int_eq(p.kind, API_MESSAGES);
    ck_assert_int_eq(p.max_tokens, 10);
    ck_assert_uint_eq(p.n_stop, 2);
    ck_assert_str_eq(p.stop[1], "b");
    ck_assert(p.sampling.temperature == 0.0f);
    ck_assert_int_eq(json_array_size(p.messages), 2);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(p.messages, 1), "content")),
                     "hi");
    ck_assert_int_eq(json_array_size(p.tools), 1);
    ck_assert(p.parallel_tool_calls);
    api_params_free(&p);
    /* a chat check names the shared field */
    body = "{\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    ck_assert_uint_eq(api_anthropic_parse(body, strlen(body), 100, &p, &e), 400);
    ck_assert_str_eq(e.param, "max_tokens");
    api_params_free(&p);
    body = "{not json";
    ck_assert_uint_eq(api_anthropic_parse(body, strlen(body), 100, &p, &e), 400);
    api_params_free(&p);
}
END_TEST

START_TEST(translate_errors)
{
    static const struct {
        const char *body, *param;
    } cases[] = {
        {"{}", "messages"},
        {"{\"messages\":[]}", "messages"},
        {"{\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", "messages[0]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}",
         "messages[0].content[0]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\","
         "\"name\":\"b\",\"input\":{}}]}]}",
         "messages[0].content[0]"},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\","
         "\"input\":{}}]}]}",
         "messages[0].content[0]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}",
         "messages[0].content[0]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":7}]}", "messages[0].content"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_sequences\":[1]}",
         "stop_sequences"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"max\"}}",
         "thinking"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
         "\"bash_20250124\",\"name\":\"bash\"}]}",
         "tools"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":"
         "\"tool\"}}",
         "tool_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"system\":[{\"type\":\"image\"}]}",
         "system"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        translate(cases[i].body, 400, cases[i].param);
}
END_TEST

START_TEST(error_shape)
{
    static const struct {
        unsigned status;
        const char *type;
    } cases[] = {{400, "invalid_request_error"}, {401, "authentication_error"},
                 {404, "not_found_error"},       {413, "request_too_large"},
                 {429, "rate_limit_error"},      {500, "api_error"},
                 {503, "overloaded_error"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct api_error e;
        api_fail(&e, cases[i].status, "whatever", "p", "c", "bad \xff byte %u", cases[i].status);
        char *s = api_error_json_as(API_MESSAGES, &e);
        json_t *j = json_loads(s, 0, NULL);
        ck_assert_ptr_nonnull(j);
        ck_assert_str_eq(json_string_value(json_object_get(j, "type")), "error");
        json_t *err = json_object_get(j, "error");
        ck_assert_str_eq(json_string_value(json_object_get(err, "type")), cases[i].type);
        ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(err, "message")), "bad "));
        json_decref(j);
        free(s);
    }
}
END_TEST

static struct api_tool_call CALLS[] = {
    {"toolu_a", "weather", "{\"city\":\"Paris\"}"},
    {"toolu_b", "time", "not json"},
};

static struct api_answer an_answer(const struct api_params *p, enum api_finish finish)
{
    return api_test_answer("msg_1", p, finish);
}

START_TEST(whole_message)
{
    struct api_params p = {0};
    struct api_answer a = an_answer(&p, API_FINISH_TOOL_CALLS);
    a.tool_calls = CALLS;
    a.n_tool_calls = 2;
    json_t *m = api_anthropic_message(&a);
    api_test_json_eq(
        m, "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\","
           "\"content\":[{\"type\":\"thinking\",\"thinking\":\"Think.\",\"signature\":\"\"},"
           "{\"type\":\"text\",\"text\":\"Hello.\"},"
           "{\"type\":\"tool_use\",\"id\":\"toolu_a\",\"name\":\"weather\",\"input\":"
           "{\"city\":\"Paris\"}},"
           "{\"type\":\"tool_use\",\"id\":\"toolu_b\",\"name\":\"time\",\"input\":{}}],"
           "\"stop_reason\":\"tool_use\",\"stop_sequence\":null,"
           "\"usage\":{\"input_tokens\":4,\"output_tokens\":5,\"cache_read_input_tokens\":16,"
           "\"cache_creation_input_tokens\":0}}");
    json_decref(m);
    static const struct {
        enum api_finish f;
        const char *reason;
    } reasons[] = {{API_FINISH_STOP, "end_turn"},
                   {API_FINISH_LENGTH, "max_tokens"},
                   {API_FINISH_STOP_STR, "stop_sequence"}};
    for (size_t i = 0; i < 3; i++) {
        a = an_answer(&p, reasons[i].f);
        a.stop_sequence = reasons[i].f == API_FINISH_STOP_STR ? "END" : NULL;
        a.reasoning_len = 0;
        m = api_anthropic_message(&a);
        ck_assert_str_eq(json_string_value(json_object_get(m, "stop_reason")), reasons[i].reason);
        json_t *ss = json_object_get(m, "stop_sequence");
        if (a.stop_sequence)
            ck_assert_str_eq(json_string_value(ss), "END");
        else
            ck_assert(json_is_null(ss));
        ck_assert_int_eq(json_array_size(json_object_get(m, "content")), 1);
        json_decref(m);
    }
    /* an empty answer is one empty text block */
    a = an_answer(&p, API_FINISH_STOP);
    a.content_len = a.reasoning_len = 0;
    m = api_anthropic_message(&a);
    api_test_json_eq(json_object_get(m, "content"), "[{\"type\":\"text\",\"text\":\"\"}]");
    json_decref(m);
}
END_TEST

/* events splits an SSE buffer into its events, checking "event: NAME" equals data.type. */
static json_t *events(const struct api_sse *b)
{
    return api_test_events(b, false);
}

START_TEST(stream_events)
{
    struct api_params p = {0};
    struct api_answer a = an_answer(&p, API_FINISH_NONE);
    struct api_anthropic_stream s = {0};
    struct api_sse b = {0};
    ck_assert_int_eq(api_anthropic_delta(&s, &a, "Thi", 3, NULL, 0, &b), 0);
    ck_assert_int_eq(api_anthropic_delta(&s, &a, "nk.", 3, "Hel", 3, &b), 0);
    ck_assert_int_eq(api_anthropic_delta(&s, &a, NULL, 0, "lo.", 3, &b), 0);
    a.finish = API_FINISH_TOOL_CALLS;
    a.tool_calls = CALLS;
    a.n_tool_calls = 1;
    ck_assert_int_eq(api_anthropic_finish(&s, &a, &b), 0);
    json_t *ev = events(&b);
    static const char *const want[] = {"message_start",       "ping",
                                       "content_block_start", "content_block_delta",
                                       "content_block_delta", "content_block_stop",
                                       "content_block_start", "content_block_delta",
                                       "content_block_delta", "content_block_stop",
                                       "content_block_start", "content_block_delta",
                                       "content_block_stop",  "message_delta",
                                       "message_stop"};
    ck_assert_int_eq(json_array_size(ev), sizeof want / sizeof *want);
    for (size_t i = 0; i < json_array_size(ev); i++)
        ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, i), "type")),
                         want[i]);
    api_test_json_eq(json_object_get(json_object_get(json_array_get(ev, 0), "message"), "usage"),
                     "{\"input_tokens\":4,\"output_tokens\":0,\"cache_read_input_tokens\":16,"
                     "\"cache_creation_input_tokens\":0}");
    api_test_json_eq(json_array_get(ev, 2),
                     "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":"
                     "\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}");
    api_test_json_eq(json_array_get(ev, 4),
                     "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":"
                     "{\"type\":\"thinking_delta\",\"thinking\":\"nk.\"}}");
    api_test_json_eq(json_array_get(ev, 8),
                     "{\"type\":\"content_block_delta\",\"index\":1,\"delta\":"
                     "{\"type\":\"text_delta\",\"text\":\"lo.\"}}");
    api_test_json_eq(json_array_get(ev, 10),
                     "{\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":"
                     "\"tool_use\",\"id\":\"toolu_a\",\"name\":\"weather\",\"input\":{}}}");
    api_test_json_eq(json_array_get(ev, 11),
                     "{\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":"
                     "\"input_json_delta\",\"partial_json\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}");
    api_test_json_eq(json_array_get(ev, 13),
                     "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\","
                     "\"stop_sequence\":null},\"usage\":{\"input_tokens\":4,\"output_tokens\":5,"
                     "\"cache_read_input_tokens\":16,\"cache_creation_input_tokens\":0}}");
    json_decref(ev);
    /* an answer with no text still opens and closes the message; an error is one event */
    b.n = 0;
    s = (struct api_anthropic_stream){0};
    a = an_answer(&p, API_FINISH_LENGTH);
    ck_assert_int_eq(api_anthropic_finish(&s, &a, &b), 0);
    struct api_error e;
    api_fail(&e, 503, "x", NULL, NULL, "the worker stopped answering");
    ck_assert_int_eq(api_anthropic_error_event(&e, &b), 0);
    ev = events(&b);
    ck_assert_int_eq(json_array_size(ev), 5);
    ck_assert_str_eq(json_string_value(json_object_get(
                         json_object_get(json_array_get(ev, 2), "delta"), "stop_reason")),
                     "max_tokens");
    ck_assert_str_eq(
        json_string_value(json_object_get(json_object_get(json_array_get(ev, 4), "error"), "type")),
        "overloaded_error");
    json_decref(ev);
    api_sse_free(&b);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("api_anthropic");
    TCase *tc = tcase_create("messages");
    tcase_add_test(tc, translate_conversation);
    tcase_add_test(tc, parse_whole_request);
    tcase_add_test(tc, translate_errors);
    tcase_add_test(tc, error_shape);
    tcase_add_test(tc, whole_message);
    tcase_add_test(tc, stream_events);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(suite());
}
