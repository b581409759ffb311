/* messages_test — what a newcomer reads when a command cannot do what was asked: each message names
 * what happened once, in full, and the command that fixes it. Runs the built `strata` as a user
 * types it. */
#include "tests/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* output runs `strata ARGS` (stdout and stderr) and returns what it printed; *rc its exit status.
 */
static char *output(const char *args, int *rc)
{
    const char *build = getenv("STRATA_BUILD_DIR");
    ck_assert_msg(build != NULL, "STRATA_BUILD_DIR is not set (ctest sets it)");
    char cmd[2048], path[600];
    snprintf(path, sizeof path, "%s/out.txt", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s/strata %s > %s 2>&1", build, args, path);
    int st = system(cmd);
    *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    char *s = test_read_file(path, NULL);
    ck_assert_ptr_nonnull(s);
    return s;
}

static int count_of(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

START_TEST(chat_without_a_service)
{
    char args[1024];
    int rc;
    snprintf(args, sizeof args, "chat --arena nosuch --shm-dir %s", test_tmpdir());
    char *s = output(args, &rc);
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(count_of(s, "'nosuch'") == 1, "the name is not said once: %s", s);
    ck_assert_msg(strstr(s, test_tmpdir()), "the segment's path is cut: %s", s);
    ck_assert_msg(strstr(s, "is running"), "no reason given: %s", s);
    ck_assert_msg(strstr(s, "strata serve"), "does not suggest strata serve: %s", s);
    free(s);
}
END_TEST

START_TEST(run_on_a_missing_file)
{
    int rc;
    char *s = output("run nosuch.gguf -p hi", &rc);
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(count_of(s, "nosuch.gguf") == 1, "the file is named more than once: %s", s);
    ck_assert_msg(count_of(s, "No such file or directory") == 1, "the cause repeats: %s", s);
    ck_assert_msg(strstr(s, "models/demo.gguf"), "no hint at the demo model: %s", s);
    free(s);
}
END_TEST

START_TEST(serve_help_on_the_backend)
{
    int rc;
    char *s = output("serve --help", &rc);
    ck_assert_int_eq(rc, 0);
    ck_assert_ptr_nonnull(strstr(s, "--cpu"));
    ck_assert_msg(!strstr(s, "the only one of this build"), "--cpu's line depends on the build");
    free(s);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("messages");
    TCase *tc = tcase_create("commands");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, chat_without_a_service);
    tcase_add_test(tc, run_on_a_missing_file);
    tcase_add_test(tc, serve_help_on_the_backend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(suite());
}
