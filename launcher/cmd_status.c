/* strata status — what runs: for each service (one runtime directory, see launcher/sup_svc.h) the
 * arena server's answer to `status` on its control socket, each worker's `status` op (workers are
 * found in the arena's registry and as worker-<n>.sock files, so workers without an arena show
 * too) and, under `strata serve`, its frontends with their /health. A table, or with --json one
 * JSON object per service: {"name", "dir", "serve", "arena", "workers": [{"pid", "endpoint",
 * "running", "queued", "tok_s", "cache_slots", ...}], "frontends"}. A worker or arena that does
 * not answer is listed with its "error".
 */
#include "arena-server/arena_ctl.h"
#include "common/arena/arena.h"
#include "common/base/err.h"
#include "common/ipc/msg.h"
#include "common/ipc/wclient.h"
#include "frontend/fe_status.h"
#include "launcher/cmd.h"
#include "launcher/sup_svc.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CALL_TIMEOUT_MS 2000
#define MAX_SERVICES    64

static void usage(FILE *out)
{
    fprintf(out, "usage: strata status [NAME] [--runtime-dir DIR] [--json]\n\n"
                 "Shows the arena, workers and frontends of service NAME (default: every service\n"
                 "in $XDG_RUNTIME_DIR/strata): memory, queues, tokens per second, cache.\n"
                 "  --runtime-dir DIR  the service's socket directory (as given to strata serve)\n"
                 "  --json             one JSON object per service\n");
}

/* to_json converts a decoded msgpack value (an arena status reply) to jansson. */
static json_t *to_json(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_BOOLEAN:
        return json_boolean(o->via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return json_integer((json_int_t)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return json_integer((json_int_t)o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return json_real(o->via.f64);
    case MSGPACK_OBJECT_STR:
        return json_stringn(o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_ARRAY: {
        json_t *a = json_array();
        for (uint32_t i = 0; i < o->via.array.size; i++)
            json_array_append_new(a, to_json(&o->via.array.ptr[i]));
        return a;
    }
    case MSGPACK_OBJECT_MAP: {
        json_t *m = json_object();
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (kv->key.type != MSGPACK_OBJECT_STR) continue;
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)kv->key.via.str.size, kv->key.via.str.ptr);
            json_object_set_new(m, key, to_json(&kv->val));
        }
        return m;
    }
    default:
        return json_null();
    }
}

static json_t *error_json(int rv)
{
    const char *d = strata_errdetail();
    char buf[512];
    snprintf(buf, sizeof buf, "%s%s%s", strata_strerror(rv), d[0] ? ": " : "", d);
    return json_string(buf);
}

/* arena_json asks the arena server for its status; adds the endpoints of its registered workers
 * to urls. NULL when no arena server runs there. */
static json_t *arena_json(const char *dir, const char *name, json_t *urls)
{
    struct msg reply;
    int rv = arena_ctl_request(dir, name, "status", false, CALL_TIMEOUT_MS, &reply);
    if (rv == STRATA_ENOENT) return NULL;
    if (rv) return json_pack("{s:o}", "error", error_json(rv));
    json_t *a = to_json(&reply.root);
    msg_free(&reply);
    json_object_del(a, "v");
    json_object_del(a, "ok");
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(a, "workers"), i, w)
    {
        json_t *ep = json_object_get(w, "endpoint");
        if (json_is_string(ep) && json_is_true(json_object_get(w, "alive")))
            json_array_append(urls, ep);
    }
    return a;
}

static json_t *worker_json(const char *url)
{
    struct wclient_opts wo = {.timeout_ms = CALL_TIMEOUT_MS};
    struct wclient *c;
    struct wclient_hello h;
    struct wclient_status s;
    int rv = wclient_open(url, &wo, &c);
    if (!rv && (rv = wclient_hello(c, &h)) == 0) rv = wclient_status(c, &s);
    wclient_close(c);
    if (rv) return json_pack("{s:s, s:o}", "endpoint", url, "error", error_json(rv));
    json_t *w = fe_worker_json(&h, &s); /* the same fields as the frontend's GET /status */
    json_object_set_new(w, "endpoint", json_string(url));
    json_object_update_new(
        w, json_pack("{s:s, s:I, s:I, s:f}", "spec", s.spec[0] ? s.spec : "off", "drafts_proposed",
                     (json_int_t)s.drafts_proposed, "drafts_accepted",
                     (json_int_t)s.drafts_accepted, "tokens_per_pass",
                     s.decode_passes ? (double)s.decode_tokens / (double)s.decode_passes : 0.0));
    return w;
}

/* serve_json reads serve.json when its supervisor still runs, and probes each frontend. */
static json_t *serve_json(const char *dir, json_t **frontends)
{
    char path[700];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, SUP_SVC_STATE_FILE) >= sizeof path)
        return NULL;
    json_t *st = json_load_file(path, 0, NULL);
    json_int_t pid = json_integer_value(json_object_get(st, "pid"));
    if (!st || pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno != EPERM)) {
        json_decref(st);
        return NULL;
    }
    *frontends = json_incref(json_object_get(st, "frontends"));
    size_t i;
    json_t *f;
    json_array_foreach(*frontends, i, f)
    {
        char host[256];
        int port = 0, status = 0;
        const char *url = json_string_value(json_object_get(f, "url"));
        if (!url || sscanf(url, "http://%255[^:]:%d", host, &port) != 2) continue;
        int rv = sup_svc_http_status(host, port, "/health", CALL_TIMEOUT_MS, &status);
        if (rv)
            json_object_set_new(f, "error", error_json(rv));
        else
            json_object_set_new(f, "health", json_integer(status));
    }
    json_t *s = json_pack("{s:O, s:O}", "pid", json_object_get(st, "pid"), "model",
                          json_object_get(st, "model"));
    json_decref(st);
    return s;
}

/* service_json gathers everything about the service in dir; NULL when nothing answers there. */
static json_t *service_json(const char *dir, const char *name)
{
    json_t *urls = json_array(), *workers = json_array(), *frontends = NULL;
    json_t *arena = arena_json(dir, name, urls);
    char socks[SUP_SVC_MAX_SOCKS][SUP_SVC_URL_MAX];
    int n = 0;
    sup_svc_worker_urls(dir, socks, SUP_SVC_MAX_SOCKS, &n);
    for (int i = 0; i < n; i++) {
        bool seen = false;
        size_t k;
        json_t *u;
        json_array_foreach(urls, k, u) seen |= strcmp(json_string_value(u), socks[i]) == 0;
        if (!seen) json_array_append_new(urls, json_string(socks[i]));
    }
    size_t k;
    json_t *u;
    bool any_worker = false;
    json_array_foreach(urls, k, u)
    {
        json_t *w = worker_json(json_string_value(u));
        /* a socket file whose worker is gone is noise unless the arena still lists it */
        any_worker |= json_object_get(w, "error") == NULL;
        json_array_append_new(workers, w);
    }
    json_decref(urls);
    json_t *serve = serve_json(dir, &frontends);
    if (!arena && !any_worker && !serve) {
        json_decref(workers);
        return NULL;
    }
    /* with --runtime-dir the directory's name need not be the service's: the arena knows it */
    const char *an = json_string_value(json_object_get(arena, "name"));
    return json_pack("{s:s, s:s, s:o, s:o, s:o, s:o}", "name", an ? an : name, "dir", dir, "serve",
                     serve ? serve : json_null(), "arena", arena ? arena : json_null(), "workers",
                     workers, "frontends", frontends ? frontends : json_array());
}

static void fmt_dur(double s, char *buf, size_t n)
{
    if (s < 60)
        snprintf(buf, n, "%.0fs", s);
    else if (s < 3600)
        snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(buf, n, "%dh%02dm", (int)s / 3600, (int)s / 60 % 60);
}

static double num(const json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

static void print_table(const json_t *svc)
{
    const json_t *serve = json_object_get(svc, "serve"), *arena = json_object_get(svc, "arena");
    char up[32];
    printf("service '%s' (%s)", json_string_value(json_object_get(svc, "name")),
           json_string_value(json_object_get(svc, "dir")));
    if (json_is_object(serve))
        printf(", supervised by strata serve (pid %lld)",
               (long long)json_integer_value(json_object_get(serve, "pid")));
    printf("\n");
    if (!json_is_object(arena)) {
        printf("  arena      not running\n");
    } else if (json_object_get(arena, "error")) {
        printf("  arena      no answer: %s\n", json_string_value(json_object_get(arena, "error")));
    } else {
        fmt_dur(num(arena, "uptime_s"), up, sizeof up);
        printf("  arena      pid %lld, %.2f GiB, %s in %.2f s, up %s, %lld layers x %lld experts, "
               "heat %lld, %lld worker registrations\n"
               "             model %s\n",
               (long long)num(arena, "pid"), num(arena, "size") / 1073741824.0,
               json_is_true(json_object_get(arena, "adopted")) ? "adopted" : "built",
               num(arena, "load_s"), up, (long long)num(arena, "n_layers"),
               (long long)num(arena, "n_expert"), (long long)num(arena, "heat_total"),
               (long long)num(arena, "registrations"),
               json_string_value(json_object_get(arena, "model")));
    }
    const json_t *ws = json_object_get(svc, "workers");
    if (json_array_size(ws)) {
        printf("  %-8s %-9s %-9s %-8s %-11s %8s %9s %8s %-11s %-7s %s\n", "WORKER", "BACKEND",
               "RUNNING", "QUEUED", "KV BLOCKS", "TOK/S", "PREFILL/S", "REQS", "CACHE", "UP",
               "ENDPOINT");
        size_t i;
        json_t *w;
        json_array_foreach(ws, i, w)
        {
            const char *ep = json_string_value(json_object_get(w, "endpoint"));
            if (json_object_get(w, "error")) {
                printf("  %-8s no answer: %s (%s)\n", "-",
                       json_string_value(json_object_get(w, "error")), ep);
                continue;
            }
            char run[24], q[24], kv[24], cache[48], be[40];
            snprintf(be, sizeof be, "%s/%s", json_string_value(json_object_get(w, "backend")),
                     json_string_value(json_object_get(w, "kv_type")));
            snprintf(run, sizeof run, "%d/%d", (int)num(w, "running"), (int)num(w, "max_seqs"));
            snprintf(q, sizeof q, "%d/%d", (int)num(w, "queued"), (int)num(w, "max_queue"));
            snprintf(kv, sizeof kv, "%d/%d", (int)num(w, "kv_blocks_used"),
                     (int)num(w, "kv_blocks_total"));
            if (num(w, "cache_slots") > 0)
                snprintf(cache, sizeof cache, "%d %.0f%% %dsw", (int)num(w, "cache_slots"),
                         100 * num(w, "cache_hit_rate"), (int)num(w, "cache_swaps"));
            else
                snprintf(cache, sizeof cache, "-");
            fmt_dur(num(w, "uptime_s"), up, sizeof up);
            printf("  %-8d %-9s %-9s %-8s %-11s %8.1f %9.1f %8lld %-11s %-7s %s\n",
                   (int)num(w, "pid"), be, run, q, kv,
                   num(w, "tok_s"), num(w, "prefill_tok_s"), (long long)num(w, "requests"), cache,
                   up, ep);
            const char *spec = json_string_value(json_object_get(w, "spec"));
            if (spec && strcmp(spec, "off") != 0)
                printf("  %-8s drafts (%s): %lld of %lld accepted (%.0f%%), %.2f tokens a decode "
                       "pass\n",
                       "", spec, (long long)num(w, "drafts_accepted"),
                       (long long)num(w, "drafts_proposed"),
                       num(w, "drafts_proposed") > 0
                           ? 100 * num(w, "drafts_accepted") / num(w, "drafts_proposed")
                           : 0.0,
                       num(w, "tokens_per_pass"));
        }
    } else {
        printf("  workers    none\n");
    }
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(svc, "frontends"), i, f)
    {
        const json_t *err = json_object_get(f, "error");
        printf("  frontend   %s pid %lld: %s%s\n", json_string_value(json_object_get(f, "url")),
               (long long)num(f, "pid"), err ? "no answer: " : "",
               err                       ? json_string_value(err)
               : num(f, "health") == 200 ? "ready"
                                         : "not ready (no worker answered yet)");
    }
}

static int run(int argc, char **argv)
{
    static const struct option longs[] = {{"runtime-dir", required_argument, NULL, 'r'},
                                          {"json", no_argument, NULL, 'j'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    const char *runtime_dir = NULL;
    bool as_json = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'r':
            runtime_dir = optarg;
            break;
        case 'j':
            as_json = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc - 1) {
        usage(stderr);
        return 2;
    }
    const char *name = optind < argc ? argv[optind] : NULL;
    char dirs[MAX_SERVICES][512], names[MAX_SERVICES][256], base[512];
    int n = 0, rv;
    if (name || runtime_dir) {
        if (!name) name = strrchr(runtime_dir, '/') ? strrchr(runtime_dir, '/') + 1 : runtime_dir;
        if ((rv = sup_svc_dir(runtime_dir, name, dirs[0], sizeof dirs[0])) != 0)
            return strata_cmd_fail("status", "runtime directory", rv);
        snprintf(names[0], sizeof names[0], "%s", name);
        n = 1;
    } else {
        if ((rv = sup_svc_base(base, sizeof base)) != 0)
            return strata_cmd_fail("status", "runtime directory", rv);
        DIR *d = opendir(base);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL && n < MAX_SERVICES) {
            struct stat st;
            if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof names[0]) continue;
            snprintf(names[n], sizeof names[n], "%s", e->d_name);
            if ((size_t)snprintf(dirs[n], sizeof dirs[n], "%s/%s", base, e->d_name) <
                    sizeof dirs[n] &&
                stat(dirs[n], &st) == 0 && S_ISDIR(st.st_mode))
                n++;
        }
        if (d) closedir(d);
    }
    int found = 0;
    for (int i = 0; i < n; i++) {
        json_t *svc = service_json(dirs[i], names[i]);
        if (!svc) continue;
        if (as_json) {
            char *s = json_dumps(svc, JSON_COMPACT);
            if (s) puts(s);
            free(s);
        } else {
            if (found) printf("\n");
            print_table(svc);
        }
        json_decref(svc);
        found++;
    }
    if (!found) {
        if (name)
            fprintf(stderr, "strata status: '%s' is not running (nothing answers in %s)\n", name,
                    dirs[0]);
        else
            fprintf(stderr, "strata status: no strata service runs (none in %s)\n", base);
        return 1;
    }
    return 0;
}

const struct strata_cmd strata_cmd_status = {
    "status", "show the arena, workers and frontends that run, with their figures", run};
