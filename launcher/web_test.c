/* web_test — the web pages in a real browser: `strata serve` of the bundled demo model (an API key,
 * a 64 KiB body limit so a paste can be too large), then tests/web/browser.mjs drives Debian's
 * chromium through playwright-core (npm ci of tests/web/package-lock.json into the build folder):
 * chat streamed and stopped, markdown kept safe, an oversized paste's 413, the monitor's plots and
 * heat map, the frontend killed -9 under both pages and restarted. Screenshots are written to
 * $STRATA_BUILD_DIR/web-shots on every run. With STRATA_WEB_SOAK_S=N (scripts/check-full) the page
 * also stays open N seconds under load and neither side may grow.
 * Skips with a message when chromium, node or npm is missing, or npm cannot install the package.
 */
#include "launcher/sup_svc.h"
#include "tests/testutil.h"

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

/* node_limit_s: the browser script's own time limit, inside Check's (the suite's below): a script
 * that hangs is ended while this test can still stop serve, whose children would outlive it. */
static int node_limit_s(const char *soak)
{
    return (int)(180 * test_slowdown()) + (soak ? atoi(soak) : 0);
}

START_TEST(browser)
{
    const char *chromium =
        getenv("STRATA_CHROMIUM") ? getenv("STRATA_CHROMIUM") : "/usr/bin/chromium";
    if (access(chromium, X_OK) != 0 || !have("node") || !have("npm")) {
        printf("SKIP web_test: chromium (%s), node and npm are needed (scripts/deps.sh installs "
               "them)\n",
               chromium);
        return;
    }
    const char *build = getenv("STRATA_BUILD_DIR");
    ck_assert_msg(build != NULL, "STRATA_BUILD_DIR is not set (ctest sets it)");
    char cmd[4096], nm[1024], shots[1024];
    snprintf(nm, sizeof nm, "%s/web-e2e", build);
    snprintf(shots, sizeof shots, "%s/web-shots", build);
    /* npm ci again only when the lockfile changed */
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s %s && cd %s && (cmp -s %s/tests/web/package-lock.json package-lock.json "
             "&& test -d node_modules/playwright-core || (cp %s/tests/web/package.json "
             "%s/tests/web/package-lock.json . && npm ci --no-audit --no-fund >npm.log 2>&1))",
             nm, shots, nm, STRATA_SOURCE_DIR, STRATA_SOURCE_DIR, STRATA_SOURCE_DIR);
    if (system(cmd) != 0) {
        printf("SKIP web_test: npm ci could not install playwright-core (see %s/npm.log)\n", nm);
        return;
    }
    /* the runtime directory is named "demo": the model has no general.name, and the frontend
     * names it after the directory */
    const char *tmp = test_tmpdir();
    char dir[700], shm[760], key[760], logs[760], state[800], slog[800], model[700];
    snprintf(dir, sizeof dir, "%s/demo", tmp);
    snprintf(shm, sizeof shm, "%s/shm", tmp);
    snprintf(key, sizeof key, "%s/key", tmp);
    snprintf(logs, sizeof logs, "%s/logs", tmp);
    snprintf(state, sizeof state, "%s/%s", dir, SUP_SVC_STATE_FILE);
    snprintf(slog, sizeof slog, "%s/serve.log", logs);
    snprintf(model, sizeof model, "%s/models/demo.gguf", STRATA_SOURCE_DIR);
    ck_assert_int_eq(mkdir(shm, 0700), 0);
    ck_assert_int_eq(mkdir(logs, 0700), 0);
    int fd = open(key, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "web-test-key\n", 13), 13);
    close(fd);
    int port = test_free_ports(1);
    char sport[16], strata[1024];
    snprintf(sport, sizeof sport, "%d", port);
    snprintf(strata, sizeof strata, "%s/strata", build);
    const char *argv[] = {
        strata, "serve",          model,        "--name",         "webtest", "--port",
        sport,  "--shm-dir",      shm,          "--runtime-dir",  dir,       "--log-dir",
        logs,   "--threads",      "1",          "--api-key-file", key,       "--backoff-max",
        "1",    "--frontend-arg", "--max-body", "--frontend-arg", "65536",   NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, slog, O_WRONLY | O_CREAT | O_APPEND, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    ck_assert_int_eq(posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    int status = 0;
    for (int i = 0; i < 600 && status != 200; i++) {
        int st;
        ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "strata serve exited; see %s", slog);
        if (sup_svc_http_status("127.0.0.1", port, "/health", 1000, &status) != 0) status = 0;
        if (status != 200) nanosleep(&(struct timespec){0, 100 * 1000000}, NULL);
    }
    ck_assert_msg(status == 200, "strata serve did not come up; see %s", slog);
    const char *soak = getenv("STRATA_WEB_SOAK_S");
    snprintf(cmd, sizeof cmd,
             "STRATA_URL=http://127.0.0.1:%d STRATA_API_KEY=web-test-key STRATA_NODE_MODULES=%s "
             "STRATA_SHOTS=%s STRATA_STATE=%s STRATA_CHROMIUM=%s STRATA_SOAK_S=%s timeout %d node "
             "%s/tests/web/browser.mjs",
             port, nm, shots, state, chromium, soak ? soak : "0", node_limit_s(soak),
             STRATA_SOURCE_DIR);
    int node_rv = system(cmd);
    kill(pid, SIGINT);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(node_rv == 0, "tests/web/browser.mjs failed; serve's logs are in %s", logs);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "strata serve: wait status %#x", st);
    printf("web_test: screenshots in %s\n", shots);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("web");
    TCase *tc = tcase_create("browser");
    const char *soak = getenv("STRATA_WEB_SOAK_S");
    /* npm ci on a cold cache, the script's limit, a soak (Check multiplies by its
     * CK_TIMEOUT_MULTIPLIER, as node_limit_s by STRATA_TEST_SLOWDOWN) */
    tcase_set_timeout(tc, 300 + (soak ? atoi(soak) : 0));
    tcase_add_test(tc, browser);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(suite());
}
