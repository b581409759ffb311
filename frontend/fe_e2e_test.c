/* fe_e2e_test — the real processes end to end: strata-worker on a tiny fixture, strata-frontend in
 * front of it (plus one limited to one request at a time and one whose worker does not exist),
 * then the official `openai` npm client (tests/e2e/openai.mjs), curl over every error path
 * (tests/e2e/errors.sh) and a 2-second load of 4 clients (tests/e2e/loadtest.mjs). Skips with a
 * message when node, npm or curl are missing, or when npm cannot install the client. */
#include "common/err.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

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

/* spawn starts argv with stdout and stderr to log; returns the pid. */
static pid_t spawn(char *const argv[], const char *log)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    ck_assert_int_eq(posix_spawn(&pid, argv[0], &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

static void stop(pid_t pid)
{
    int st;
    kill(pid, SIGTERM);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
}

/* port_of waits for "listening on port N" in a frontend's log. */
static int port_of(const char *log)
{
    for (int i = 0; i < 200; i++) {
        char *s = test_read_file(log, NULL);
        const char *p = s ? strstr(s, "listening on port ") : NULL;
        int port = p ? atoi(p + 18) : 0;
        free(s);
        if (port) return port;
        usleep(50 * 1000);
    }
    ck_abort_msg("no port in %s", log);
    return 0;
}

START_TEST(openai_and_errors)
{
    if (!have("node") || !have("npm") || !have("curl")) {
        printf("SKIP fe_e2e: node, npm and curl are needed (install nodejs and curl)\n");
        return;
    }
    const char *build = getenv("STRATA_BUILD_DIR");
    ck_assert_msg(build != NULL, "STRATA_BUILD_DIR is not set (ctest sets it)");
    char cmd[4096], nm[1024];
    snprintf(nm, sizeof nm, "%s/e2e", build);
    snprintf(cmd, sizeof cmd,
             "test -d %s/node_modules/openai || (mkdir -p %s && cd %s && npm install --silent "
             "--no-audit --no-fund openai >npm.log 2>&1)",
             nm, nm, nm);
    if (system(cmd) != 0) {
        printf("SKIP fe_e2e: npm could not install the openai client (see %s/npm.log)\n", nm);
        return;
    }
    const char *tmp = test_tmpdir();
    char model[512], rt[512], url[600], wlog[512], flog[512], f2log[512], f3log[512], none[600];
    snprintf(model, sizeof model, "%s/tiny.gguf", tmp);
    snprintf(rt, sizeof rt, "%s/rt", tmp);
    snprintf(url, sizeof url, "ipc://%s/worker-0.sock", rt);
    snprintf(none, sizeof none, "ipc://%s/none.sock", rt);
    snprintf(wlog, sizeof wlog, "%s/worker.log", tmp);
    snprintf(flog, sizeof flog, "%s/frontend.log", tmp);
    snprintf(f2log, sizeof f2log, "%s/frontend2.log", tmp);
    snprintf(f3log, sizeof f3log, "%s/frontend3.log", tmp);
    struct fixture_opts fo = {.threads = 1};
    ck_assert_int_eq(fixture_write(&fo, model), 0);
    ck_assert_int_eq(mkdir(rt, 0700), 0);

    char worker[600], frontend[600];
    snprintf(worker, sizeof worker, "%s/strata-worker", build);
    snprintf(frontend, sizeof frontend, "%s/strata-frontend", build);
    char *wargv[] = {worker, "--model", model, "--runtime-dir", rt, "--ctx", "256", NULL};
    pid_t wpid = spawn(wargv, wlog);
    char *fargv[] = {frontend,  "--worker",     url,  "--port",     "0",     "--api-key",
                     "e2e-key", "--max-tokens", "64", "--max-body", "65536", NULL};
    pid_t fpid = spawn(fargv, flog);
    char *f3argv[] = {frontend, "--worker", url, "--port", "0", "--max-active", "1", NULL};
    pid_t f3pid = spawn(f3argv, f3log);
    char *f2argv[] = {frontend, "--worker", none, "--port", "0", NULL};
    pid_t f2pid = spawn(f2argv, f2log);
    int port = port_of(flog), port2 = port_of(f2log), port3 = port_of(f3log);

    /* ready once the worker answered */
    snprintf(cmd, sizeof cmd,
             "for i in $(seq 100); do curl -sf http://127.0.0.1:%d/health >/dev/null && exit 0; "
             "sleep 0.1; done; exit 1",
             port);
    ck_assert_msg(system(cmd) == 0, "the frontend never became ready; see %s and %s", flog, wlog);
    snprintf(cmd, sizeof cmd,
             "STRATA_PORT=%d STRATA_API_KEY=e2e-key STRATA_NODE_MODULES=%s node "
             "%s/tests/e2e/openai.mjs",
             port, nm, STRATA_SOURCE_DIR);
    int node_rv = system(cmd);
    snprintf(cmd, sizeof cmd,
             "PORT=%d KEY=e2e-key NOWORKER_PORT=%d BUSY_PORT=%d bash %s/tests/e2e/errors.sh", port,
             port2, port3, STRATA_SOURCE_DIR);
    int curl_rv = system(cmd);
    /* a short load: 4 streaming clients for 2 s, every request must succeed */
    snprintf(cmd, sizeof cmd,
             "node %s/tests/e2e/loadtest.mjs --port %d --key e2e-key --clients 4 --seconds 2 "
             "--max-tokens 32 --header",
             STRATA_SOURCE_DIR, port);
    int load_rv = system(cmd);
    stop(f3pid);
    stop(f2pid);
    stop(fpid);
    stop(wpid);
    ck_assert_msg(node_rv == 0, "tests/e2e/openai.mjs failed");
    ck_assert_msg(curl_rv == 0, "tests/e2e/errors.sh failed");
    ck_assert_msg(load_rv == 0, "tests/e2e/loadtest.mjs saw errors");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fe_e2e");
    TCase *tc = tcase_create("processes");
    tcase_set_timeout(tc, 240); /* npm install on a cold cache */
    tcase_add_test(tc, openai_and_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(suite());
}
