/* fe_e2e_test — the real processes end to end: strata-worker on a tiny fixture, strata-frontend in
 * front of it (plus one limited to one request at a time and one whose worker does not exist),
 * then the official `openai` npm client (tests/e2e/openai.mjs), curl over every error path
 * (tests/e2e/errors.sh), a 2-second load of 4 clients (tests/e2e/loadtest.mjs), and a worker
 * killed and restarted under a running stream. Skips with a
 * message when node, npm or curl are missing, or when npm cannot install the client. */
#include "common/base/err.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <fcntl.h>
#include <jansson.h>
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

/* sse_text concatenates choices[0].text of a completion stream saved in path; *done: [DONE] came.
 */
static char *sse_text(const char *path, bool *done, int *events, size_t *len)
{
    char *s = test_read_file(path, NULL), *out = calloc(1, 1);
    size_t n = 0;
    *done = false;
    *events = 0;
    for (char *p = s; p && (p = strstr(p, "data: ")) != NULL; p += 6) {
        if (strncmp(p + 6, "[DONE]", 6) == 0) *done = true;
        json_t *c = json_loads(p + 6, JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL, NULL);
        json_t *t = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "text");
        if (json_is_string(t)) { /* the text may hold NULs (\u0000): copy by length */
            out = realloc(out, n + json_string_length(t) + 1);
            memcpy(out + n, json_string_value(t), json_string_length(t));
            n += json_string_length(t);
        }
        *events += c != NULL;
        json_decref(c);
    }
    free(s);
    if (len) *len = n;
    return out;
}

/* restart_mid_stream kills the worker (SIGKILL) while a 3000-token greedy stream runs and starts
 * a new one: the stream must end normally with the text of an undisturbed run (the CPU backend
 * is bit-exact, and the frontend's client resubmits what it had). */
static void restart_mid_stream(int port, pid_t *wpid, char *const wargv[], const char *wlog)
{
    char out[512], whole[512], cmd[2048], wlog2[600];
    const char *body = "{\\\"prompt\\\":\\\"The weather\\\",\\\"max_tokens\\\":3000,"
                       "\\\"temperature\\\":0,\\\"stream\\\":true}";
    snprintf(out, sizeof out, "%s/restart.sse", test_tmpdir());
    snprintf(whole, sizeof whole, "%s/whole.json", test_tmpdir());
    snprintf(wlog2, sizeof wlog2, "%s.2", wlog);
    snprintf(cmd, sizeof cmd, "curl -sN -d \"%s\" http://127.0.0.1:%d/v1/completions > %s", body,
             port, out);
    char *sh[] = {"/bin/sh", "-c", cmd, NULL};
    pid_t curl = spawn(sh, "/dev/null");
    bool done;
    int events = 0;
    for (int i = 0; i < 1000 && events < 50; i++) {
        usleep(10 * 1000);
        free(sse_text(out, &done, &events, NULL));
    }
    ck_assert_int_ge(events, 50);
    kill(*wpid, SIGKILL);
    ck_assert_int_eq(waitpid(*wpid, NULL, 0), *wpid);
    free(sse_text(out, &done, &events, NULL));
    printf("worker killed after %d events%s\n", events,
           done ? " (the stream had already ended: nothing was resumed)" : "");
    fflush(stdout);
    *wpid = spawn(wargv, wlog2);
    int st;
    ck_assert_int_eq(waitpid(curl, &st, 0), curl);
    size_t slen;
    char *streamed = sse_text(out, &done, &events, &slen);
    ck_assert_msg(done, "the stream did not end with [DONE]");
    /* the monitor may have seen the worker down: wait until it is ready again */
    snprintf(cmd, sizeof cmd,
             "for i in $(seq 100); do curl -sf http://127.0.0.1:%d/health >/dev/null && break; "
             "sleep 0.1; done; curl -s -d '{\"prompt\":\"The weather\",\"max_tokens\":3000,"
             "\"temperature\":0}' http://127.0.0.1:%d/v1/completions > %s",
             port, port, whole);
    ck_assert_int_eq(system(cmd), 0);
    json_t *w = json_load_file(whole, JSON_ALLOW_NUL, NULL);
    json_t *text = json_object_get(json_array_get(json_object_get(w, "choices"), 0), "text");
    ck_assert_msg(json_is_string(text), "no text in %s", whole);
    size_t tlen = json_string_length(text);
    ck_assert_msg(slen == tlen && memcmp(streamed, json_string_value(text), tlen) == 0,
                  "the resumed stream (%zu bytes) differs from an undisturbed run (%zu bytes)",
                  slen, tlen);
    printf("ok - a stream across a worker restart equals an undisturbed run (%zu bytes)\n", tlen);
    fflush(stdout);
    json_decref(w);
    free(streamed);
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
    char *wargv[] = {worker, "--model", model, "--runtime-dir", rt, NULL};
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
    restart_mid_stream(port3, &wpid, wargv, wlog);
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
