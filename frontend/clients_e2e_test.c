/* clients_e2e_test — the official clients against a real `strata serve` of a tiny fixture (CPU
 * backend, bit-exact, an API key): `@anthropic-ai/sdk` over /v1/messages (tests/e2e/anthropic.mjs:
 * whole, streamed, stop sequences, thinking, tools, count_tokens, cached tokens, errors) and the
 * `openai` package over /v1/responses and n > 1 chat choices (tests/e2e/responses.mjs).
 * The clients come from tests/e2e/clients/package-lock.json (`npm ci` into the build directory,
 * once per lockfile); skips with a message when node or npm are missing or the registry cannot be
 * reached. */
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static bool have(const char *prog)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

/* install puts the locked clients into dir/node_modules (npm ci), unless the same lockfile was
 * installed there before. Returns false when npm could not (offline, no registry). */
static bool install(const char *dir)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && cd %s && if ! cmp -s %s/tests/e2e/clients/package-lock.json "
             ".installed-lock 2>/dev/null || ! test -d node_modules/openai; then "
             "cp %s/tests/e2e/clients/package.json %s/tests/e2e/clients/package-lock.json . && "
             "timeout 180 npm ci --no-audit --no-fund --loglevel=error >npm.log 2>&1 && "
             "cp package-lock.json .installed-lock; fi",
             dir, dir, STRATA_SOURCE_DIR, STRATA_SOURCE_DIR, STRATA_SOURCE_DIR);
    return system(cmd) == 0;
}

START_TEST(official_clients)
{
    if (!have("node") || !have("npm") || !have("curl")) {
        printf("SKIP clients_e2e: node, npm and curl are needed (install nodejs, npm and curl)\n");
        return;
    }
    const char *build = getenv("STRATA_BUILD_DIR");
    ck_assert_msg(build != NULL, "STRATA_BUILD_DIR is not set (ctest sets it)");
    char nm[1024], cmd[4096];
    snprintf(nm, sizeof nm, "%s/e2e-clients", build);
    if (!install(nm)) {
        printf("SKIP clients_e2e: npm ci could not install tests/e2e/clients (is the registry "
               "reachable? see %s/npm.log)\n",
               nm);
        return;
    }
    const char *tmp = test_tmpdir();
    char model[600], run[600], shm[600], logs[600], log[700], port[16];
    snprintf(model, sizeof model, "%s/tiny.gguf", tmp);
    snprintf(run, sizeof run, "%s/run", tmp);
    snprintf(shm, sizeof shm, "%s/shm", tmp);
    snprintf(logs, sizeof logs, "%s/logs", tmp);
    snprintf(log, sizeof log, "%s/serve.log", tmp);
    ck_assert_int_eq(mkdir(run, 0700), 0);
    ck_assert_int_eq(mkdir(shm, 0700), 0);
    ck_assert_int_eq(mkdir(logs, 0700), 0);
    struct fixture_opts fo = {.type = "q8_0", .threads = 1};
    ck_assert_int_eq(fixture_write(&fo, model), 0);
    int p = test_free_ports(1);
    snprintf(port, sizeof port, "%d", p);
    char strata[600];
    snprintf(strata, sizeof strata, "%s/strata", build);
    char *argv[] = {strata,      "serve", model,           "--name",    "clients",
                    "--port",    port,    "--bit-exact",   "--threads", "1",
                    "--shm-dir", shm,     "--runtime-dir", run,         "--log-dir",
                    logs,        NULL};
    setenv("STRATA_API_KEY", "clients-key", 1); /* Check runs each test in a child of its own */
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    ck_assert_int_eq(posix_spawn(&pid, strata, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    snprintf(cmd, sizeof cmd,
             "for i in $(seq 600); do curl -sf http://127.0.0.1:%d/health >/dev/null && exit 0; "
             "sleep 0.1; done; exit 1",
             p);
    int up = system(cmd);
    int rv[2] = {-1, -1};
    static const char *const scripts[] = {"anthropic.mjs", "responses.mjs"};
    for (int i = 0; up == 0 && i < 2; i++) {
        snprintf(cmd, sizeof cmd,
                 "STRATA_PORT=%d STRATA_API_KEY=clients-key STRATA_NODE_MODULES=%s node "
                 "%s/tests/e2e/%s",
                 p, nm, STRATA_SOURCE_DIR, scripts[i]);
        rv[i] = system(cmd);
        fflush(stdout);
    }
    int st;
    kill(pid, SIGINT);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(up == 0, "strata serve never became ready; see %s and %s", log, logs);
    ck_assert_msg(rv[0] == 0, "tests/e2e/anthropic.mjs failed");
    ck_assert_msg(rv[1] == 0, "tests/e2e/responses.mjs failed");
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "strata serve: wait status %#x", st);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("clients_e2e");
    TCase *tc = tcase_create("clients");
    tcase_set_timeout(tc, 300); /* npm ci on a cold cache */
    tcase_add_test(tc, official_clients);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(suite());
}
