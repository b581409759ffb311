/* serve_tools_test — tool calls and structured output with the official `openai` npm client
 * (tests/e2e/tools.mjs, installed by `npm ci` from tests/e2e/tools/package-lock.json into the
 * build directory) against a real `strata serve` of a random-weight fixture, then curl over the
 * error cases (tests/e2e/tools_errors.sh). Skips with a message when node, npm or curl are
 * missing or npm cannot reach its registry. */
#include "common/base/err.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static bool have(const char *prog)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

START_TEST(openai_client_tools_and_formats)
{
    if (!have("node") || !have("npm") || !have("curl")) {
        printf("SKIP serve_tools: node, npm and curl are needed (install nodejs and curl)\n");
        return;
    }
    const char *build = getenv("STRATA_BUILD_DIR");
    ck_assert_msg(build != NULL, "STRATA_BUILD_DIR is not set (ctest sets it)");
    char cmd[8192], nm[512];
    snprintf(nm, sizeof nm, "%.400s/e2e-tools", build);
    /* npm ci from the committed lockfile, once per build directory */
    snprintf(cmd, sizeof cmd,
             "test -d %s/node_modules/openai || (mkdir -p %s && cp %s/tests/e2e/tools/package.json "
             "%s/tests/e2e/tools/package-lock.json %s/ && cd %s && timeout 120 npm ci --silent "
             "--fetch-retries=1 --fetch-timeout=20000 "
             "--no-audit --no-fund >npm.log 2>&1)",
             nm, nm, STRATA_SOURCE_DIR, STRATA_SOURCE_DIR, nm, nm);
    if (system(cmd) != 0) {
        printf("SKIP serve_tools: npm ci could not install the openai client (see %s/npm.log)\n",
               nm);
        return;
    }
    const char *tmp = test_tmpdir();
    char model[600], run[600], shm[600], logs[600], log[700], port[16];
    snprintf(model, sizeof model, "%s/tools.gguf", tmp);
    snprintf(run, sizeof run, "%s/run", tmp);
    snprintf(shm, sizeof shm, "%s/shm", tmp);
    snprintf(logs, sizeof logs, "%s/logs", tmp);
    snprintf(log, sizeof log, "%s/serve.log", logs);
    mkdir(shm, 0700);
    mkdir(logs, 0700);
    struct fixture_opts fo = {.seed = 5, .threads = 1};
    ck_assert_int_eq(fixture_write(&fo, model), 0);
    const int p = 20000 + (int)(getpid() * 7919u % 40000u);
    snprintf(port, sizeof port, "%d", p);
    char strata[600];
    snprintf(strata, sizeof strata, "%.500s/strata", build);
    char *argv[] = {
        strata, "serve",       model, "--name",    "tools", "--port",        port, "--workers",
        "1",    "--frontends", "1",   "--shm-dir", shm,     "--runtime-dir", run,  "--log-dir",
        logs,   "--threads",   "1",   NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    ck_assert_int_eq(posix_spawn(&pid, argv[0], &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    snprintf(cmd, sizeof cmd,
             "for i in $(seq 600); do curl -sf http://127.0.0.1:%d/health >/dev/null && exit 0; "
             "sleep 0.1; done; exit 1",
             p);
    int up = system(cmd);
    int node_rv = -1, curl_rv = -1;
    if (up == 0) {
        snprintf(cmd, sizeof cmd,
                 "STRATA_PORT=%d STRATA_NODE_MODULES=%s node %s/tests/e2e/tools.mjs", p, nm,
                 STRATA_SOURCE_DIR);
        node_rv = system(cmd);
        snprintf(cmd, sizeof cmd, "PORT=%d bash %s/tests/e2e/tools_errors.sh", p,
                 STRATA_SOURCE_DIR);
        curl_rv = system(cmd);
    }
    kill(pid, SIGINT);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(up == 0, "strata serve did not come up; see %s", log);
    ck_assert_msg(node_rv == 0, "tests/e2e/tools.mjs failed; see %s", log);
    ck_assert_msg(curl_rv == 0, "tests/e2e/tools_errors.sh failed");
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "strata serve: wait status %#x", st);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("serve_tools");
    TCase *tc = tcase_create("openai");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, openai_client_tools_and_formats);
    suite_add_tcase(s, tc);
    return test_run(s);
}
