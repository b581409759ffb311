/* fe_e2e_test — the real processes end to end: strata-worker on a tiny fixture, strata-frontend in
 * front of it (plus one limited to one request at a time and one whose worker does not exist),
 * then the official `openai` npm client (tests/e2e/openai.mjs), curl over every error path
 * (tests/e2e/errors.sh), a 2-second load of 4 clients (tests/e2e/loadtest.mjs), and a worker
 * killed and restarted under a running stream. Skips with a
 * message when node, npm or curl are missing, or when npm cannot install the client.
 * Then the README's demo: `strata chat` with models/demo.gguf for more turns than its context
 * holds, and the API's end of turn with it. Last, three workers of two KV types: a stream whose
 * worker stops answering moves only to the one of its own kind. */
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

/* stop sends SIGTERM and waits up to 30 s for pid to exit (then kills it and fails the test: a
 * process that hangs on its way out is a bug, not something to wait for). */
static void stop(pid_t pid)
{
    int st;
    kill(pid, SIGTERM);
    ck_assert_msg(test_wait_exit(pid, 30, &st), "pid %d did not exit within 30 s of SIGTERM",
                  (int)pid);
    if (WIFEXITED(st) && WEXITSTATUS(st) != 0)
        fprintf(stderr, "note: pid %d exited with status %d after SIGTERM (1: its stop deadline)\n",
                (int)pid, WEXITSTATUS(st));
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

/* The restarted stream's length: long enough that the kill after 50 events lands mid-stream in the
 * optimized build, short enough for a sanitized build on a loaded 2-core
 * machine (~27 tok/s under ASan+UBSan: two 3,000-token runs took 4 minutes there). */
#ifdef __SANITIZE_ADDRESS__ /* gcc -fsanitize=address */
#define RESTART_TOKENS 400
#else
#define RESTART_TOKENS 3000
#endif

/* restart_mid_stream kills the worker (SIGKILL) while a RESTART_TOKENS-token greedy stream runs
 * and starts a new one: the stream must end normally with the text of an undisturbed run (the CPU
 * backend is bit-exact, and the frontend's client resubmits what it had). */
static void restart_mid_stream(int port, pid_t *wpid, char *const wargv[], const char *wlog)
{
    char out[512], whole[512], cmd[2048], wlog2[600];
    snprintf(out, sizeof out, "%s/restart.sse", test_tmpdir());
    snprintf(whole, sizeof whole, "%s/whole.json", test_tmpdir());
    snprintf(wlog2, sizeof wlog2, "%s.2", wlog);
    snprintf(cmd, sizeof cmd,
             "curl -sN -d '{\"prompt\":\"The weather\",\"max_tokens\":%d,\"temperature\":0,"
             "\"stream\":true}' http://127.0.0.1:%d/v1/completions > %s",
             RESTART_TOKENS, port, out);
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
             "sleep 0.1; done; curl -s -d '{\"prompt\":\"The weather\",\"max_tokens\":%d,"
             "\"temperature\":0}' http://127.0.0.1:%d/v1/completions > %s",
             port, RESTART_TOKENS, port, whole);
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

/* count_of counts the occurrences of needle in s. */
static int count_of(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; p && (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* The README's demo: `strata chat` with the bundled model for more turns than its context holds
 * (the worker's --ctx 160), greedy. Every turn must end by itself at the blank line between
 * speeches (the model's strata.stop), none at the length limit; the oldest exchanges are dropped
 * and the user told; the banner names the model by its arena (general.name is a converter's
 * placeholder). Then the HTTP API: a chat request without max_tokens ends with finish_reason
 * "stop", and /v1/models says "demo". */
START_TEST(demo_chat_keeps_going)
{
    const char *build = getenv("STRATA_BUILD_DIR");
    ck_assert_msg(build != NULL, "STRATA_BUILD_DIR is not set (ctest sets it)");
    const char *tmp = test_tmpdir();
    char model[600], rt[600], wlog[600], flog[600], url[700], worker[600], frontend[600];
    char cmd[4096], out[600], in[600];
    snprintf(model, sizeof model, "%s/models/demo.gguf", STRATA_SOURCE_DIR);
    snprintf(rt, sizeof rt, "%s/demo", tmp); /* named as strata serve names it: the file's base */
    snprintf(wlog, sizeof wlog, "%s/demo-worker.log", tmp);
    snprintf(flog, sizeof flog, "%s/demo-frontend.log", tmp);
    snprintf(url, sizeof url, "ipc://%s/worker-0.sock", rt);
    snprintf(worker, sizeof worker, "%s/strata-worker", build);
    snprintf(frontend, sizeof frontend, "%s/strata-frontend", build);
    snprintf(out, sizeof out, "%s/chat.out", tmp);
    snprintf(in, sizeof in, "%s/chat.in", tmp);
    ck_assert_int_eq(mkdir(rt, 0700), 0);
    char *wargv[] = {worker, "--model", model, "--runtime-dir", rt, "--ctx", "160", NULL};
    pid_t wpid = spawn(wargv, wlog);
    FILE *f = fopen(in, "w");
    ck_assert_ptr_nonnull(f);
    static const char *const lines[] = {"ROMEO:",  "What light through yonder window breaks?",
                                        "JULIET:", "Who is there?",
                                        "ROMEO:",  "A friend, sweet lady.",
                                        "JULIET:", "Then come in."};
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
        fprintf(f, "%s\n", lines[i]);
    fclose(f);
    /* the chat retries nothing: wait for the worker's socket first */
    snprintf(cmd, sizeof cmd,
             "for i in $(seq 300); do test -S %s/worker-0.sock && exit 0; sleep 0.1; done; exit 1",
             rt);
    ck_assert_msg(system(cmd) == 0, "the worker never listened; see %s", wlog);
    snprintf(cmd, sizeof cmd, "%s/strata chat --worker %s --temperature 0 < %s > %s 2>&1", build,
             url, in, out);
    int chat_rv = system(cmd);
    char *talk = test_read_file(out, NULL);
    ck_assert_ptr_nonnull(talk);
    printf("%s", talk);
    fflush(stdout);
    ck_assert_msg(chat_rv == 0, "strata chat failed");
    ck_assert_msg(strstr(talk, "demo (160 tokens of context)"),
                  "the banner does not name the demo");
    ck_assert_int_eq(count_of(talk, "[prompt "), 8); /* every turn answered, the second included */
    ck_assert_msg(!strstr(talk, "length limit"), "a turn ran to the length limit");
    ck_assert_msg(strstr(talk, "the oldest"), "the chat did not say it dropped old turns");
    ck_assert_msg(!strstr(talk, "chat:"), "the chat reported an error");
    free(talk);

    char *fargv[] = {frontend, "--worker", url, "--port", "0", NULL};
    pid_t fpid = spawn(fargv, flog);
    int port = port_of(flog);
    char resp[600], models[600];
    snprintf(resp, sizeof resp, "%s/demo-chat.json", tmp);
    snprintf(models, sizeof models, "%s/demo-models.json", tmp);
    snprintf(cmd, sizeof cmd,
             "for i in $(seq 100); do curl -sf http://127.0.0.1:%d/health >/dev/null && break; "
             "sleep 0.1; done; curl -s http://127.0.0.1:%d/v1/models > %s && curl -s -d "
             "'{\"messages\":[{\"role\":\"user\",\"content\":\"ROMEO:\"}],"
             "\"temperature\":0}' http://127.0.0.1:%d/v1/chat/completions > %s",
             port, port, models, port, resp);
    ck_assert_int_eq(system(cmd), 0);
    json_t *r = json_load_file(resp, 0, NULL), *ms = json_load_file(models, 0, NULL);
    json_t *c = json_array_get(json_object_get(r, "choices"), 0);
    const char *fin = json_string_value(json_object_get(c, "finish_reason"));
    ck_assert_msg(fin && strcmp(fin, "stop") == 0, "finish_reason %s, want stop (see %s)",
                  fin ? fin : "(none)", resp);
    const char *id =
        json_string_value(json_object_get(json_array_get(json_object_get(ms, "data"), 0), "id"));
    ck_assert_msg(id && strcmp(id, "demo") == 0, "/v1/models says %s", id ? id : "(nothing)");
    json_decref(r);
    json_decref(ms);
    stop(fpid);
    stop(wpid);
}
END_TEST

/* wait_file waits up to 10 s for path to exist. */
static void wait_file(const char *path)
{
    for (int i = 0; i < 200 && access(path, F_OK) != 0; i++)
        usleep(50 * 1000);
    ck_assert_msg(access(path, F_OK) == 0, "%s never appeared", path);
}

/* Three real workers: f32, f16, f32. A long stream starts on the first; the first is stopped
 * (SIGSTOP: its calls time out) mid-stream: the frontend must move the stream to the third (same
 * backend and KV type), never to the second, although the second comes first in its list. */
START_TEST(failover_same_backend_and_kv_type)
{
    if (!have("curl")) {
        printf("SKIP fe_e2e failover: curl is needed\n");
        return;
    }
    const char *build = getenv("STRATA_BUILD_DIR");
    ck_assert_msg(build != NULL, "STRATA_BUILD_DIR is not set (ctest sets it)");
    const char *tmp = test_tmpdir();
    char model[512], rt[512], worker[600], frontend[600], cmd[2048], out[600], st[600];
    char urls[3][700], socks[3][600], logs[3][600], flog[600];
    snprintf(model, sizeof model, "%s/kind.gguf", tmp);
    snprintf(rt, sizeof rt, "%s/rt-kind", tmp);
    snprintf(worker, sizeof worker, "%s/strata-worker", build);
    snprintf(frontend, sizeof frontend, "%s/strata-frontend", build);
    snprintf(out, sizeof out, "%s/kind.sse", tmp);
    snprintf(st, sizeof st, "%s/kind-status.json", tmp);
    snprintf(flog, sizeof flog, "%s/kind-frontend.log", tmp);
    struct fixture_opts fo = {.threads = 1};
    ck_assert_int_eq(fixture_write(&fo, model), 0);
    ck_assert_int_eq(mkdir(rt, 0700), 0);
    static const char *const kinds[3] = {"f32", "f16", "f32"};
    pid_t w[3];
    for (int i = 0; i < 3; i++) { /* one after the other: each takes the first free socket */
        snprintf(socks[i], sizeof socks[i], "%s/worker-%d.sock", rt, i);
        snprintf(urls[i], sizeof urls[i], "ipc://%s/worker-%d.sock", rt, i);
        snprintf(logs[i], sizeof logs[i], "%s/kind-worker-%d.log", tmp, i);
        char *wargv[] = {worker, "--model", model, "--runtime-dir", rt, "--kv-type",
                         (char *)kinds[i], "--threads", "1", NULL};
        w[i] = spawn(wargv, logs[i]);
        wait_file(socks[i]);
    }
    char *fargv[] = {frontend, "--worker", urls[0], "--worker", urls[1], "--worker", urls[2],
                     "--port", "0", "--failover-ms", "500", NULL};
    pid_t fpid = spawn(fargv, flog);
    int port = port_of(flog);
    /* ready, and every worker's hello seen */
    snprintf(cmd, sizeof cmd,
             "for i in $(seq 100); do curl -s http://127.0.0.1:%d/status > %s; "
             "test $(grep -o '\"ready\":true' %s | wc -l) -ge 4 && exit 0; sleep 0.1; done; exit 1",
             port, st, st);
    ck_assert_msg(system(cmd) == 0, "the frontend never saw its three workers; see %s", flog);
    snprintf(cmd, sizeof cmd,
             "curl -sN -d '{\"prompt\":\"The weather\",\"max_tokens\":%d,\"temperature\":0,"
             "\"stream\":true}' http://127.0.0.1:%d/v1/completions > %s",
             RESTART_TOKENS, port, out);
    char *sh[] = {"/bin/sh", "-c", cmd, NULL};
    pid_t curl = spawn(sh, "/dev/null");
    bool done;
    int events = 0;
    for (int i = 0; i < 1000 && events < 30; i++) {
        usleep(10 * 1000);
        free(sse_text(out, &done, &events, NULL));
    }
    ck_assert_int_ge(events, 30);
    const int at = events;
    kill(w[0], SIGSTOP);
    int cst;
    ck_assert_int_eq(waitpid(curl, &cst, 0), curl);
    kill(w[0], SIGCONT);
    size_t len;
    free(sse_text(out, &done, &events, &len));
    char *sse = test_read_file(out, NULL);
    ck_assert_msg(done, "the stream did not end with [DONE]");
    ck_assert_msg(!strstr(sse, "\"error\""), "the stream has an error: %.300s", strstr(sse, "\"error\""));
    free(sse);
    snprintf(cmd, sizeof cmd, "curl -s http://127.0.0.1:%d/status > %s", port, st);
    ck_assert_int_eq(system(cmd), 0);
    json_t *j = json_load_file(st, 0, NULL), *ws = json_object_get(j, "workers");
    ck_assert_int_eq(json_array_size(ws), 3);
    json_int_t req[3];
    for (int i = 0; i < 3; i++) {
        json_t *wk = json_array_get(ws, (size_t)i);
        ck_assert_str_eq(json_string_value(json_object_get(wk, "kv_type")), kinds[i]);
        ck_assert_str_eq(json_string_value(json_object_get(wk, "backend")), "cpu");
        req[i] = json_integer_value(json_object_get(wk, "routed_requests"));
    }
    json_decref(j);
    ck_assert_msg(req[0] == 1 && req[1] == 0 && req[2] == 1,
                  "streams routed to the f32, f16, f32 workers: %lld %lld %lld, want 1 0 1",
                  (long long)req[0], (long long)req[1], (long long)req[2]);
    printf("ok - a stream of %zu bytes moved from the stopped f32 worker to the other f32 one, "
           "past the f16 one, after %d of %d events\n",
           len, at, events);
    stop(fpid);
    for (int i = 0; i < 3; i++)
        stop(w[i]);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fe_e2e");
    TCase *tc = tcase_create("processes");
    tcase_set_timeout(tc, 240); /* npm install on a cold cache */
    tcase_add_test(tc, openai_and_errors);
    tcase_add_test(tc, demo_chat_keeps_going);
    tcase_add_test(tc, failover_same_backend_and_kv_type);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(suite());
}
