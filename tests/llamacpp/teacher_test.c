/* teacher_test — `strata run --teacher`, which the llama.cpp parity stage (run.sh) rests on: fed
 * strata's own greedy output, every step's argmax is the fed token and its logit the top one;
 * step 0 does not depend on the continuation; a token that is not the argmax is reported below the
 * top; the scores do not change with threads or chunking; bad ids and a short context are errors.
 * On a tiny q8_0 qwen3moe fixture; the command's stdout is captured into a file. */
#include "launcher/cmd.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const struct strata_cmd strata_cmd_run;

#define PROMPT      "1,17,300,42,99,7,256,128"
#define N_STEPS     12
#define N_STEPS_STR "12"

static char model[1024];

static void write_model(void)
{
    snprintf(model, sizeof model, "%s/teacher.gguf", test_tmpdir());
    struct fixture_opts fo = {.arch = "qwen3moe", .type = "q8_0", .threads = 1};
    ck_assert_int_eq(fixture_write(&fo, model), 0);
}

/* run_cmd runs `strata run MODEL args...` with stdout in a file; returns the exit status and, on
 * 0, the parsed JSON line in *out. */
static int run_cmd(json_t **out, int argc, const char **args)
{
    const char *argv[16] = {"run", model};
    ck_assert_int_le(argc + 2, 16);
    memcpy(argv + 2, args, (size_t)argc * sizeof *args);
    char path[1100];
    snprintf(path, sizeof path, "%s/stdout.json", test_tmpdir());
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert(saved >= 0 && fd >= 0);
    dup2(fd, STDOUT_FILENO);
    close(fd);
    int status = strata_cmd_run.run(argc + 2, (char **)argv);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    if (status == 0 && out) {
        json_error_t err;
        *out = json_load_file(path, 0, &err);
        ck_assert_msg(*out != NULL, "strata run printed no JSON: %s", err.text);
    }
    return status;
}

/* greedy_ids returns strata's greedy continuation of PROMPT as "a,b,c" (malloc'd). */
static char *greedy_ids(void)
{
    json_t *o;
    const char *args[] = {"--ids", PROMPT,      "--temp",       "0",
                          "-n",    N_STEPS_STR, "--ignore-eos", "--json"};
    ck_assert_int_eq(run_cmd(&o, 8, args), 0);
    json_t *ids = json_object_get(o, "ids");
    ck_assert_uint_eq(json_array_size(ids), N_STEPS);
    char *s = calloc(N_STEPS, 12);
    for (size_t i = 0; i < N_STEPS; i++)
        sprintf(s + strlen(s), "%s%lld", i ? "," : "",
                (long long)json_integer_value(json_array_get(ids, i)));
    json_decref(o);
    return s;
}

static double num(json_t *step, const char *key)
{
    json_t *v = json_object_get(step, key);
    ck_assert_msg(json_is_number(v), "step has no number '%s'", key);
    return json_number_value(v);
}

START_TEST(test_own_greedy_output)
{
    write_model();
    char *ids = greedy_ids();
    json_t *o;
    const char *args[] = {"--ids", PROMPT, "--teacher", ids};
    ck_assert_int_eq(run_cmd(&o, 4, args), 0);
    json_t *steps = json_object_get(o, "steps"), *teacher = json_object_get(o, "teacher_ids");
    ck_assert_uint_eq(json_array_size(steps), N_STEPS);
    ck_assert_uint_eq(json_array_size(teacher), N_STEPS);
    ck_assert_uint_eq(json_array_size(json_object_get(o, "prompt_ids")), 8);
    for (size_t i = 0; i < N_STEPS; i++) {
        json_t *s = json_array_get(steps, i);
        json_int_t id = json_integer_value(json_object_get(s, "id"));
        ck_assert_int_eq(id, json_integer_value(json_array_get(teacher, i)));
        ck_assert_int_eq(json_integer_value(json_object_get(s, "argmax")), id);
        ck_assert(num(s, "logit") == num(s, "top_logit"));
        ck_assert(num(s, "min_logit") < num(s, "top_logit"));
    }
    json_decref(o);
    free(ids);
}
END_TEST

START_TEST(test_other_token)
{
    write_model();
    char *ids = greedy_ids();
    json_t *good, *bad;
    const char *args[] = {"--ids", PROMPT, "--teacher", ids};
    ck_assert_int_eq(run_cmd(&good, 4, args), 0);
    json_t *g0 = json_array_get(json_object_get(good, "steps"), 0);
    int argmax = (int)json_integer_value(json_object_get(g0, "argmax"));
    char other[64];
    snprintf(other, sizeof other, "%d,5", (argmax + 1) % 512);
    const char *args2[] = {"--ids", PROMPT, "--teacher", other};
    ck_assert_int_eq(run_cmd(&bad, 4, args2), 0);
    json_t *steps = json_object_get(bad, "steps");
    ck_assert_uint_eq(json_array_size(steps), 2);
    json_t *b0 = json_array_get(steps, 0);
    /* step 0 is the prompt's logits whatever follows */
    ck_assert_int_eq(json_integer_value(json_object_get(b0, "argmax")), argmax);
    ck_assert(num(b0, "top_logit") == num(g0, "top_logit"));
    ck_assert(num(b0, "min_logit") == num(g0, "min_logit"));
    ck_assert(num(b0, "logit") < num(b0, "top_logit"));
    ck_assert(num(b0, "logit") >= num(b0, "min_logit"));
    json_decref(good);
    json_decref(bad);
    free(ids);
}
END_TEST

START_TEST(test_threads_and_chunks)
{
    write_model();
    char *ids = greedy_ids();
    json_t *a, *b;
    const char *args[] = {"--ids", PROMPT, "--teacher", ids, "--threads", "1", "--chunk", "3"};
    const char *args2[] = {"--ids", PROMPT, "--teacher", ids, "--threads", "3"};
    ck_assert_int_eq(run_cmd(&a, 8, args), 0);
    ck_assert_int_eq(run_cmd(&b, 6, args2), 0);
    ck_assert(json_equal(a, b));
    json_decref(a);
    json_decref(b);
    free(ids);
}
END_TEST

START_TEST(test_errors)
{
    write_model();
    const char *beyond[] = {"--ids", "1", "--teacher", "3,512"};
    ck_assert_int_eq(run_cmd(NULL, 4, beyond), 1);
    const char *junk[] = {"--ids", "1", "--teacher", "3,x"};
    ck_assert_int_eq(run_cmd(NULL, 4, junk), 1);
    const char *empty[] = {"--ids", "1", "--teacher", ""};
    ck_assert_int_eq(run_cmd(NULL, 4, empty), 1);
    /* prompt 2 + teacher 3: 4 positions are fed, the last id only scored */
    const char *fits[] = {"--ids", "1,2", "--teacher", "3,4,5", "--ctx", "4"};
    ck_assert_int_eq(run_cmd(NULL, 6, fits), 0);
    const char *short_ctx[] = {"--ids", "1,2", "--teacher", "3,4,5", "--ctx", "3"};
    ck_assert_int_eq(run_cmd(NULL, 6, short_ctx), 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("teacher");
    TCase *tc = tcase_create("run --teacher");
    tcase_set_timeout(tc, 30); /* a fixture and a few 20-token passes; Debug + ASan is slower */
    tcase_add_test(tc, test_own_greedy_output);
    tcase_add_test(tc, test_other_token);
    tcase_add_test(tc, test_threads_and_chunks);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return test_run(s);
}
