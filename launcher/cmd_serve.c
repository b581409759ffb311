/* strata serve — the whole system in one command: the arena, N workers and M HTTP frontends,
 * started in that order (each waits for the one before to answer), supervised (a dead child is
 * restarted with backoff: launcher/supervise.h) and stopped in the reverse order on Ctrl-C or
 * SIGTERM. Without --keep-arena the arena removes its segments when it stops (no worker maps them
 * any more) and serve removes the sockets its children left behind; with it the arena keeps
 * running, and the next `strata serve` of the same name uses it without reading the model again.
 * An arena server that already runs under the name is used, never stopped.
 * Children are the sibling binaries of this one (strata-arena, strata-worker, strata-frontend).
 * While it runs, serve keeps <runtime dir>/serve.json (its pid, the model, each child's pid and
 * address) for `strata status`.
 */
#include "arena-server/arena_ctl.h"
#include "arena-server/arena_serve.h"
#include "common/base/err.h"
#include "common/ipc/ipc.h"
#include "common/base/log.h"
#include "common/base/own.h"
#include "common/ipc/msg.h"
#include "common/arena/shm.h"
#include "common/ipc/wclient.h"
#include "launcher/cmd.h"
#include "launcher/gpus.h"
#include "launcher/sup_svc.h"
#include "launcher/supervise.h"

#include <errno.h>
#include <getopt.h>
#include <glob.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_WORKERS   16
#define MAX_FRONTENDS 16
#define MAX_EXTRA     32 /* --worker-arg / --frontend-arg values */
#define ARGV_MAX      (40 + 2 * MAX_WORKERS + MAX_EXTRA)

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: strata serve [MODEL.gguf] [options]\n\n"
        "Starts the arena, the workers and the HTTP frontends of MODEL and keeps them running\n"
        "(a dead worker or frontend is restarted with backoff) until Ctrl-C or SIGTERM, then\n"
        "stops them in order: frontends, workers, arena. Without MODEL: the bundled demo model\n"
        "(models/demo.gguf).\n"
        "  --name NAME          arena and service name (default: the model's base name)\n"
        "  --port P             HTTP port of the first frontend (default 8080); frontend i\n"
        "                       listens on P+i\n"
        "  --host ADDR          HTTP bind address (default 127.0.0.1)\n"
        "  --workers N          workers on the arena (default 1; one per GPU with GPUs)\n"
        "  --frontends N        HTTP frontends (default 1; 0: workers only, for `strata run\n"
        "                       --name`)\n"
        "  --gpus LIST          one CUDA worker per GPU of LIST (e.g. 0,1; \"all\"); the\n"
        "                       default when this build has CUDA and the machine GPUs\n"
        "  --cpu                the CPU backend, even with GPUs present\n"
        "  --bit-exact          answers depend only on the model and the token history\n"
        "  --threads N          forward-pass threads per worker (default: CPUs / workers)\n"
        "  --ctx N              positions per request (default: the model's)\n"
        "  --max-seqs N         requests one worker decodes at once (default 16)\n"
        "  --max-queue N        requests waiting per worker before it answers busy\n"
        "  --orphan-timeout S   a worker cancels a request nobody polled for S seconds\n"
        "  --spec-lookup N      speculative decoding: workers verify up to N (<= 8) drafts per\n"
        "                       request and window by prompt lookup (answers unchanged)\n"
        "  --draft FILE.gguf    speculative decoding with a draft model of the same vocabulary\n"
        "                       (on the CPU, in every worker); --draft-max N drafts (default 4)\n"
        "  --api-key-file FILE  frontends require `Authorization: Bearer KEY`, KEY the first\n"
        "                       line of FILE (mode 600); $STRATA_API_KEY does the same, and\n"
        "                       --api-key KEY too, but every local user can read it in `ps`\n"
        "  --chat-template T    frontends use template NAME|FILE instead of the model's\n"
        "  --worker-arg ARG     pass ARG to every strata-worker (repeat for more)\n"
        "  --frontend-arg ARG   pass ARG to every strata-frontend (repeat for more)\n"
        "  --shm-dir DIR        shared-memory directory of the arena (default /dev/shm)\n"
        "  --runtime-dir DIR    socket directory (default $XDG_RUNTIME_DIR/strata/NAME)\n"
        "  --log-dir DIR        each process's output to DIR/<process>.log, not this terminal\n"
        "  --keep-arena         leave the arena running at exit (the next serve adopts it)\n"
        "  --backoff-max S      longest delay before restarting a child (default 30)\n"
        "  --stop-timeout S     SIGTERM to SIGKILL when stopping a child (default 10)\n");
}

struct serve_opts {
    const char *model, *name, *host, *shm_dir, *runtime_dir, *log_dir, *api_key, *chat_template;
    const char *gpus_list; /* --gpus; NULL: every GPU when there are, else the CPU */
    bool cpu, workers_set;
    int port, n_workers, n_frontends, threads, ctx, max_seqs, max_queue, orphan_timeout;
    int backoff_max_s, stop_timeout_s, spec_lookup, draft_max;
    const char *draft;
    bool bit_exact, keep_arena;
    const char *worker_args[MAX_EXTRA], *frontend_args[MAX_EXTRA];
    int n_worker_args, n_frontend_args;
};

/* A serve in progress: what the children are and where they answer. */
struct serve {
    struct serve_opts o;
    char model[PATH_MAX], name[SHM_NAME_MAX + 1], dir[512], bindir[PATH_MAX];
    struct sup *sup;
    int arena; /* child index, or -1 when an arena server was already running */
    int32_t arena_pid;
    int workers[MAX_WORKERS], frontends[MAX_FRONTENDS];
    char worker_url[MAX_WORKERS][SUP_SVC_URL_MAX];
    int gpus[GPUS_MAX], n_gpus; /* worker i runs on GPU gpus[i] (n_gpus 0: all on the CPU) */
};

enum {
    O_NAME = 256,
    O_PORT,
    O_HOST,
    O_WORKERS,
    O_FRONTENDS,
    O_CPU,
    O_GPUS,
    O_BITEXACT,
    O_THREADS,
    O_CTX,
    O_MAXSEQS,
    O_MAXQUEUE,
    O_ORPHAN,
    O_APIKEY,
    O_APIKEYFILE,
    O_TEMPLATE,
    O_WARG,
    O_FARG,
    O_SHM,
    O_RUNTIME,
    O_LOGDIR,
    O_KEEP,
    O_BACKOFF,
    O_STOPTO,
    O_SPEC,
    O_DRAFT,
    O_DRAFTMAX,
    O_HELP
};

static int parse_int(const char *s, const char *opt, int min, int max, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return strata_errf(STRATA_EINVAL, "%s '%s': expected an integer in %d..%d", opt, s, min,
                           max);
    *out = (int)v;
    return 0;
}

/* parse_args returns 0, 2 for a usage error (message printed), or -1 after --help. */
static int parse_args(int argc, char **argv, struct serve_opts *o)
{
    static const struct option longs[] = {
        {"name", required_argument, NULL, O_NAME},
        {"port", required_argument, NULL, O_PORT},
        {"host", required_argument, NULL, O_HOST},
        {"workers", required_argument, NULL, O_WORKERS},
        {"frontends", required_argument, NULL, O_FRONTENDS},
        {"cpu", no_argument, NULL, O_CPU},
        {"gpus", required_argument, NULL, O_GPUS},
        {"bit-exact", no_argument, NULL, O_BITEXACT},
        {"threads", required_argument, NULL, O_THREADS},
        {"ctx", required_argument, NULL, O_CTX},
        {"max-seqs", required_argument, NULL, O_MAXSEQS},
        {"max-queue", required_argument, NULL, O_MAXQUEUE},
        {"orphan-timeout", required_argument, NULL, O_ORPHAN},
        {"api-key", required_argument, NULL, O_APIKEY},
        {"api-key-file", required_argument, NULL, O_APIKEYFILE},
        {"chat-template", required_argument, NULL, O_TEMPLATE},
        {"worker-arg", required_argument, NULL, O_WARG},
        {"frontend-arg", required_argument, NULL, O_FARG},
        {"shm-dir", required_argument, NULL, O_SHM},
        {"runtime-dir", required_argument, NULL, O_RUNTIME},
        {"log-dir", required_argument, NULL, O_LOGDIR},
        {"keep-arena", no_argument, NULL, O_KEEP},
        {"backoff-max", required_argument, NULL, O_BACKOFF},
        {"stop-timeout", required_argument, NULL, O_STOPTO},
        {"spec-lookup", required_argument, NULL, O_SPEC},
        {"draft", required_argument, NULL, O_DRAFT},
        {"draft-max", required_argument, NULL, O_DRAFTMAX},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    *o = (struct serve_opts){
        .port = 8080, .n_workers = 1, .n_frontends = 1, .backoff_max_s = 30, .stop_timeout_s = 10};
    optind = 1;
    int c, rv = 0;
    while (rv == 0 && (c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case O_NAME:
            o->name = optarg;
            break;
        case O_PORT:
            rv = parse_int(optarg, "--port", 1, 65535, &o->port);
            break;
        case O_HOST:
            o->host = optarg;
            break;
        case O_WORKERS:
            rv = parse_int(optarg, "--workers", 1, MAX_WORKERS, &o->n_workers);
            o->workers_set = true;
            break;
        case O_FRONTENDS:
            rv = parse_int(optarg, "--frontends", 0, MAX_FRONTENDS, &o->n_frontends);
            break;
        case O_CPU:
            o->cpu = true;
            break;
        case O_GPUS:
            o->gpus_list = optarg;
            break;
        case O_BITEXACT:
            o->bit_exact = true;
            break;
        case O_THREADS:
            rv = parse_int(optarg, "--threads", 1, 1024, &o->threads);
            break;
        case O_CTX:
            rv = parse_int(optarg, "--ctx", 1, 1 << 30, &o->ctx);
            break;
        case O_MAXSEQS:
            rv = parse_int(optarg, "--max-seqs", 1, 1 << 20, &o->max_seqs);
            break;
        case O_MAXQUEUE:
            rv = parse_int(optarg, "--max-queue", 1, 1 << 20, &o->max_queue);
            break;
        case O_ORPHAN:
            rv = parse_int(optarg, "--orphan-timeout", 1, 1 << 20, &o->orphan_timeout);
            break;
        case O_APIKEY:
            o->api_key = optarg;
            LOG_WARN("--api-key puts the key on the command line, where every local user can "
                     "read it (ps): use --api-key-file FILE or $STRATA_API_KEY");
            break;
        case O_APIKEYFILE: {
            static char key[512];
            if ((rv = own_read_key(optarg, key, sizeof key)) == 0) o->api_key = key;
            break;
        }
        case O_TEMPLATE:
            o->chat_template = optarg;
            break;
        case O_WARG:
        case O_FARG: {
            int *n = c == O_WARG ? &o->n_worker_args : &o->n_frontend_args;
            if (*n == MAX_EXTRA) {
                rv = strata_errf(STRATA_ELIMIT, "at most %d --worker-arg and --frontend-arg each",
                                 MAX_EXTRA);
                break;
            }
            (c == O_WARG ? o->worker_args : o->frontend_args)[(*n)++] = optarg;
            break;
        }
        case O_SHM:
            o->shm_dir = optarg;
            break;
        case O_RUNTIME:
            o->runtime_dir = optarg;
            break;
        case O_LOGDIR:
            o->log_dir = optarg;
            break;
        case O_KEEP:
            o->keep_arena = true;
            break;
        case O_BACKOFF:
            rv = parse_int(optarg, "--backoff-max", 1, 3600, &o->backoff_max_s);
            break;
        case O_STOPTO:
            rv = parse_int(optarg, "--stop-timeout", 1, 3600, &o->stop_timeout_s);
            break;
        case O_SPEC:
            rv = parse_int(optarg, "--spec-lookup", 0, 8, &o->spec_lookup);
            break;
        case O_DRAFT: {
            static char draft[PATH_MAX];
            /* workers may start in another directory */
            o->draft = realpath(optarg, draft) ? draft : optarg;
            break;
        }
        case O_DRAFTMAX:
            rv = parse_int(optarg, "--draft-max", 1, 8, &o->draft_max);
            break;
        case 'h':
        case O_HELP:
            usage(stdout);
            return -1;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (rv) {
        fprintf(stderr, "strata serve: %s\n", strata_errdetail());
        return 2;
    }
    if (optind < argc - 1) {
        fprintf(stderr, "strata serve: give at most one MODEL.gguf\n");
        usage(stderr);
        return 2;
    }
    if (optind == argc - 1) o->model = argv[optind];
    if (o->port + o->n_frontends - 1 > 65535) {
        fprintf(stderr, "strata serve: --port %d with %d frontends runs past port 65535\n", o->port,
                o->n_frontends);
        return 2;
    }
    return 0;
}

/* demo_model finds the bundled demo model: models/ of the source tree this binary was built
 * from, or ../models and ../share/strata/models beside the binary (an installed tree). */
static int demo_model(const char *bindir, char *out, size_t cap)
{
    static const char *const prefer[] = {"demo.gguf"};
    const char *const dirs[][2] = {{STRATA_SOURCE_DIR, "/models"},
                                   {bindir, "/../models"},
                                   {bindir, "/../share/strata/models"}};
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        for (size_t i = 0; i < sizeof prefer / sizeof prefer[0]; i++) {
            int n = snprintf(out, cap, "%s%s/%s", dirs[d][0], dirs[d][1], prefer[i]);
            if (n > 0 && (size_t)n < cap && access(out, R_OK) == 0) return 0;
        }
    }
    return strata_errf(STRATA_ENOENT,
                       "no MODEL given and the bundled demo model is not there (looked for "
                       "demo.gguf in %s/models; models/MODEL.md says how it is built): pass a "
                       "GGUF file, e.g. `strata fixture -o /tmp/tiny.gguf && strata serve "
                       "/tmp/tiny.gguf`",
                       STRATA_SOURCE_DIR);
}

/* log_path writes DIR/<child>.log, or returns NULL without --log-dir. */
static const char *log_path(const struct serve *sv, const char *child, char *buf, size_t cap)
{
    if (!sv->o.log_dir) return NULL;
    snprintf(buf, cap, "%s/%s.log", sv->o.log_dir, child);
    return buf;
}

/* child_pid is child idx's pid, 0 for one not added yet (idx -1). */
static int child_pid(const struct serve *sv, int idx)
{
    return idx < 0 ? 0 : (int)sup_pid(sv->sup, idx);
}

/* write_state rewrites serve.json (atomically: a reader never sees half of it). */
static void write_state(struct serve *sv)
{
    json_t *ws = json_array(), *fs = json_array();
    for (int i = 0; i < sv->o.n_workers; i++)
        json_array_append_new(ws, json_pack("{s:s, s:i}", "endpoint", sv->worker_url[i], "pid",
                                            child_pid(sv, sv->workers[i])));
    for (int i = 0; i < sv->o.n_frontends; i++) {
        char url[300];
        snprintf(url, sizeof url, "http://%s:%d", sv->o.host ? sv->o.host : "127.0.0.1",
                 sv->o.port + i);
        json_array_append_new(
            fs, json_pack("{s:s, s:i}", "url", url, "pid", child_pid(sv, sv->frontends[i])));
    }
    json_t *st = json_pack("{s:i, s:s, s:s, s:i, s:b, s:o, s:o}", "pid", (int)getpid(), "name",
                           sv->name, "model", sv->model, "arena_pid",
                           sv->arena >= 0 ? child_pid(sv, sv->arena) : sv->arena_pid, "arena_owned",
                           sv->arena >= 0, "workers", ws, "frontends", fs);
    char path[600], tmp[620];
    snprintf(path, sizeof path, "%s/%s", sv->dir, SUP_SVC_STATE_FILE);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (st && json_dump_file(st, tmp, JSON_COMPACT) == 0 && rename(tmp, path) == 0) {
        json_decref(st);
        return;
    }
    LOG_WARN("cannot write %s: %s; `strata status` will not list the frontends", path,
             strerror(errno));
    json_decref(st);
}

static void on_spawn(void *ctx, int idx, pid_t pid)
{
    struct serve *sv = ctx;
    (void)idx;
    (void)pid;
    write_state(sv);
}

static int arena_ready(void *ctx)
{
    struct serve *sv = ctx;
    struct msg reply;
    int rv = arena_ctl_request(sv->dir, sv->name, "status", false, 1000, &reply);
    if (rv) return rv;
    int64_t pid = 0;
    msg_get_i64(&reply, NULL, "pid", 0, INT32_MAX, &pid);
    sv->arena_pid = (int32_t)pid;
    msg_free(&reply);
    return 0;
}

struct worker_probe {
    struct serve *sv;
    int i;
};

/* worker_ready: worker i answers hello on its socket, and it is our child, not a stray worker. */
static int worker_ready(void *ctx)
{
    struct worker_probe *p = ctx;
    struct wclient_opts wo = {.timeout_ms = 500};
    struct wclient *c;
    struct wclient_hello h;
    int rv = wclient_open(p->sv->worker_url[p->i], &wo, &c);
    if (rv) return rv;
    rv = wclient_hello(c, &h);
    wclient_close(c);
    if (rv) return rv;
    return h.pid == sup_pid(p->sv->sup, p->sv->workers[p->i]) ? 0 : STRATA_EBUSY;
}

struct frontend_probe {
    struct serve *sv;
    int port;
};

static int frontend_ready(void *ctx)
{
    struct frontend_probe *p = ctx;
    int status = 0;
    int rv = sup_svc_http_status(p->sv->o.host ? p->sv->o.host : "127.0.0.1", p->port, "/health",
                                 1000, &status);
    return rv ? rv : status == 200 ? 0 : STRATA_EBUSY;
}

/* argv_push appends to a NULL-terminated argv of at most ARGV_MAX - 1 entries. */
static void argv_push(char **argv, int *n, const char *s)
{
    if (*n < ARGV_MAX - 1) argv[(*n)++] = (char *)s;
    argv[*n] = NULL;
}

/* argv_opt appends "OPT VAL" when VAL is set; an option left out takes the child's default. */
static void argv_opt(char **argv, int *n, const char *opt, const char *val)
{
    if (!val) return;
    argv_push(argv, n, opt);
    argv_push(argv, n, val);
}

/* argv_arena appends what the arena server and the workers must agree on: the arena's name (under
 * NAME_OPT, "--name" for the server, "--arena" for a worker) and the directories of its files. */
static void argv_arena(char **argv, int *n, const struct serve *sv, const char *name_opt)
{
    argv_opt(argv, n, name_opt, sv->name);
    argv_opt(argv, n, "--runtime-dir", sv->dir);
    argv_opt(argv, n, "--shm-dir", sv->o.shm_dir);
}

/* start_child adds child NAME (stopped at STAGE, restarted when it dies unless it exits with
 * fatal_status, logging to its own file) and spawns it; its index goes to *idx. */
static int start_child(struct serve *sv, const char *name, char **argv, char **env, int stage,
                       int fatal_status, int *idx)
{
    char logb[600];
    struct sup_child_opts co = {.name = name,
                                .argv = argv,
                                .env = env,
                                .log = log_path(sv, name, logb, sizeof logb),
                                .stage = stage,
                                .restart = true,
                                .fatal_status = fatal_status};
    int rv = sup_add(sv->sup, &co, idx);
    return rv ? rv : sup_start(sv->sup, *idx);
}

/* check_arena looks for an arena server already running under the name: 0 and sv->arena_pid
 * when one answers for the same model, STRATA_ENOENT when none does, STRATA_EEXIST when it serves
 * another model. */
static int check_arena(struct serve *sv)
{
    struct msg reply;
    int rv = arena_ctl_request(sv->dir, sv->name, "status", false, 1000, &reply);
    if (rv) return STRATA_ENOENT; /* no socket, or a stale one: a new server will clean it */
    const char *model = NULL;
    size_t len = 0;
    int64_t pid = 0;
    msg_get_i64(&reply, NULL, "pid", 0, INT32_MAX, &pid);
    rv = msg_get_str(&reply, NULL, "model", PATH_MAX, &model, &len);
    if (rv == 0 && (len != strlen(sv->model) || memcmp(model, sv->model, len) != 0)) {
        rv = strata_errf(STRATA_EEXIST,
                         "arena '%s' is already served by pid %lld for another model (%.*s): "
                         "pass another --name, or stop it with `strata-arena stop %s`",
                         sv->name, (long long)pid, (int)len, model, sv->name);
    } else {
        sv->arena_pid = (int32_t)pid;
        rv = 0;
    }
    msg_free(&reply);
    return rv;
}

static int start_arena(struct serve *sv)
{
    char bin[PATH_MAX + 16];
    snprintf(bin, sizeof bin, "%s/strata-arena", sv->bindir);
    char *argv[ARGV_MAX];
    int n = 0;
    argv_push(argv, &n, bin);
    argv_push(argv, &n, "serve");
    argv_push(argv, &n, sv->model);
    argv_arena(argv, &n, sv, "--name");
    /* strata-arena exits 1 only when it cannot start (a planted segment, no room, a bad model):
     * starting it again would fail the same way */
    int rv = start_child(sv, "arena", argv, NULL, 0, 1, &sv->arena);
    if (rv) return rv;
    LOG_INFO("arena '%s': starting (pid %d); a model read for the first time takes a while",
             sv->name, (int)sup_pid(sv->sup, sv->arena));
    return sup_wait_ready(sv->sup, sv->arena, arena_ready, sv, -1);
}

static int start_worker(struct serve *sv, int i)
{
    char bin[PATH_MAX + 16], cname[32], num[8][16];
    snprintf(bin, sizeof bin, "%s/strata-worker", sv->bindir);
    snprintf(cname, sizeof cname, "worker-%d", i);
    char *argv[ARGV_MAX];
    int n = 0;
    argv_push(argv, &n, bin);
    argv_arena(argv, &n, sv, "--arena");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = sv->o.threads ? sv->o.threads : (int)(ncpu > 0 ? ncpu : 1) / sv->o.n_workers;
    const struct {
        const char *opt;
        int v;
    } nums[] = {{"--threads", threads > 0 ? threads : 1},
                {"--ctx", sv->o.ctx},
                {"--max-seqs", sv->o.max_seqs},
                {"--max-queue", sv->o.max_queue},
                {"--orphan-timeout", sv->o.orphan_timeout},
                {"--spec-lookup", sv->o.spec_lookup},
                {"--draft-max", sv->o.draft_max}};
    for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
        if (!nums[k].v) continue;
        snprintf(num[k], sizeof num[k], "%d", nums[k].v);
        argv_opt(argv, &n, nums[k].opt, num[k]);
    }
    if (sv->o.bit_exact) argv_push(argv, &n, "--bit-exact");
    /* a GPU worker sees only its GPU, as device 0, numbered as the driver numbers them */
    char vis[48];
    char *env[] = {vis, "CUDA_DEVICE_ORDER=PCI_BUS_ID", NULL};
    argv_opt(argv, &n, "--backend", sv->n_gpus ? "cuda" : "cpu");
    if (sv->n_gpus) snprintf(vis, sizeof vis, "CUDA_VISIBLE_DEVICES=%d", sv->gpus[i]);
    argv_opt(argv, &n, "--draft", sv->o.draft);
    for (int k = 0; k < sv->o.n_worker_args; k++)
        argv_push(argv, &n, sv->o.worker_args[k]);
    int rv = start_child(sv, cname, argv, sv->n_gpus ? env : NULL, 1, 0, &sv->workers[i]);
    if (rv) return rv;
    struct worker_probe p = {sv, i};
    return sup_wait_ready(sv->sup, sv->workers[i], worker_ready, &p, -1);
}

static int start_frontend(struct serve *sv, int i)
{
    char bin[PATH_MAX + 16], cname[32], port[16];
    snprintf(bin, sizeof bin, "%s/strata-frontend", sv->bindir);
    snprintf(cname, sizeof cname, "frontend-%d", i);
    snprintf(port, sizeof port, "%d", sv->o.port + i);
    char *argv[ARGV_MAX];
    int n = 0;
    argv_push(argv, &n, bin);
    argv_opt(argv, &n, "--port", port);
    argv_opt(argv, &n, "--host", sv->o.host);
    for (int w = 0; w < sv->o.n_workers; w++)
        argv_opt(argv, &n, "--worker", sv->worker_url[w]);
    argv_opt(argv, &n, "--chat-template", sv->o.chat_template);
    for (int k = 0; k < sv->o.n_frontend_args; k++)
        argv_push(argv, &n, sv->o.frontend_args[k]);
    int rv = start_child(sv, cname, argv, NULL, 2, 0, &sv->frontends[i]);
    if (rv) return rv;
    struct frontend_probe p = {sv, sv->o.port + i};
    return sup_wait_ready(sv->sup, sv->frontends[i], frontend_ready, &p, -1);
}

/* check_free_workers refuses to start when a worker not ours already answers on one of the socket
 * paths ours will take (it would get our requests and ours would take another path). */
static int check_free_workers(struct serve *sv)
{
    for (int i = 0; i < sv->o.n_workers; i++) {
        char path[SUP_SVC_URL_MAX];
        snprintf(path, sizeof path, "%s", sv->worker_url[i] + strlen("ipc://"));
        if (access(path, F_OK) != 0) continue;
        struct wclient_opts wo = {.timeout_ms = 500};
        struct wclient *c;
        struct wclient_hello h;
        if (wclient_open(sv->worker_url[i], &wo, &c) != 0) continue;
        int rv = wclient_hello(c, &h);
        wclient_close(c);
        if (rv == 0)
            return strata_errf(STRATA_EBUSY,
                               "a worker (pid %d) already serves %s: stop it, or serve under "
                               "another --name or --runtime-dir",
                               (int)h.pid, sv->worker_url[i]);
    }
    return 0;
}

/* cleanup removes what killed children may have left: socket files (each server removes its own
 * on a clean stop; their .lock files stay, see docs/protocol.md), the state file and, without
 * --keep-arena, segments of an arena we ran (the arena removes them itself unless it was killed).
 */
static void cleanup(struct serve *sv, bool arena_gone)
{
    char pat[600], path[600];
    glob_t g;
    snprintf(pat, sizeof pat, "%s/worker-*.sock", sv->dir);
    if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++)
            unlink(g.gl_pathv[i]);
        globfree(&g);
    }
    snprintf(path, sizeof path, "%s/%s", sv->dir, SUP_SVC_STATE_FILE);
    unlink(path);
    if (!arena_gone) return;
    snprintf(path, sizeof path, "%s/arena.ipc", sv->dir);
    unlink(path);
    char seg[300];
    if (shm_name(seg, sizeof seg, sv->name, "") == 0) shm_remove(sv->o.shm_dir, seg);
    if (shm_name(seg, sizeof seg, sv->name, ARENA_STATE_SUFFIX) == 0)
        shm_remove(sv->o.shm_dir, seg);
}

static int serve_main(struct serve *sv)
{
    const char *what = "setup";
    int rv;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return strata_cmd_fail("serve", "finding strata-arena", strata_errno(errno));
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    *slash = '\0';
    snprintf(sv->bindir, sizeof sv->bindir, "%s", exe);
    for (int i = 0; i < MAX_WORKERS; i++)
        sv->workers[i] = -1;
    for (int i = 0; i < MAX_FRONTENDS; i++)
        sv->frontends[i] = -1;
    sv->arena = -1;

    what = "model";
    char given[PATH_MAX];
    if (sv->o.model)
        snprintf(given, sizeof given, "%s", sv->o.model);
    else if ((rv = demo_model(sv->bindir, given, sizeof given)) != 0)
        goto fail;
    if (!realpath(given, sv->model)) {
        rv = strata_errf(strata_errno(errno), "%s: %s", given, strerror(errno));
        goto fail;
    }
    if (sv->o.name) {
        if ((rv = shm_check_name(sv->o.name)) != 0) goto fail;
        snprintf(sv->name, sizeof sv->name, "%s", sv->o.name);
    } else if ((rv = arena_default_name(sv->model, sv->name, sizeof sv->name)) != 0) {
        goto fail;
    }
    what = "GPUs";
    if ((rv = gpus_plan(sv->o.gpus_list, sv->o.cpu, gpus_have_cuda(), gpus_count(), sv->gpus,
                        &sv->n_gpus)) != 0)
        goto fail;
    if (sv->n_gpus) {
        if (sv->o.workers_set && sv->o.n_workers != sv->n_gpus) {
            rv = strata_errf(STRATA_EINVAL,
                             "--workers %d with %d GPUs: serve runs one worker per GPU; drop "
                             "--workers, or choose the GPUs with --gpus",
                             sv->o.n_workers, sv->n_gpus);
            goto fail;
        }
        sv->o.n_workers = sv->n_gpus;
    }
    what = "runtime directory";
    if ((rv = ipc_runtime_dir(sv->o.runtime_dir, sv->name, sv->dir, sizeof sv->dir)) != 0)
        goto fail;
    for (int i = 0; i < sv->o.n_workers; i++)
        if ((rv = sup_svc_worker_url(sv->dir, i, sv->worker_url[i], SUP_SVC_URL_MAX)) != 0)
            goto fail;
    const char *bins[] = {"strata-arena", "strata-worker",
                          sv->o.n_frontends ? "strata-frontend" : NULL};
    for (size_t i = 0; i < sizeof bins / sizeof bins[0] && bins[i]; i++) {
        char p[PATH_MAX + 32];
        snprintf(p, sizeof p, "%s/%s", sv->bindir, bins[i]);
        if (access(p, X_OK) != 0) {
            what = "binaries";
            rv = strata_errf(STRATA_ENOENT, "%s is missing: build it (cmake --build %s)", p,
                             sv->bindir);
            goto fail;
        }
    }

    /* Before any nng use: nng's threads must inherit the blocked signals. */
    struct sup_opts so = {.backoff_max_ms = sv->o.backoff_max_s * 1000,
                          .stop_timeout_ms = sv->o.stop_timeout_s * 1000,
                          .on_spawn = on_spawn,
                          .spawn_ctx = sv};
    if ((rv = sup_init(&so, &sv->sup)) != 0) goto fail;

    what = "arena";
    rv = check_arena(sv);
    if (rv == 0)
        LOG_INFO("arena '%s' is already served by pid %d: using it (it stays when serve stops)",
                 sv->name, (int)sv->arena_pid);
    else if (rv != STRATA_ENOENT || (rv = start_arena(sv)) != 0)
        goto fail;
    what = "workers";
    if ((rv = check_free_workers(sv)) != 0) goto fail;
    for (int i = 0; i < sv->o.n_workers; i++)
        if ((rv = start_worker(sv, i)) != 0) goto fail;
    what = "frontends";
    for (int i = 0; i < sv->o.n_frontends; i++)
        if ((rv = start_frontend(sv, i)) != 0) goto fail;
    write_state(sv);
    char on[96] = "the CPU";
    if (sv->n_gpus) {
        int k = snprintf(on, sizeof on, "GPU");
        for (int i = 0; i < sv->n_gpus && k < (int)sizeof on; i++)
            k += snprintf(on + k, sizeof on - (size_t)k, "%s%d", i ? "," : " ", sv->gpus[i]);
    }
    LOG_INFO("workers on %s (%s backend)", on, sv->n_gpus ? "cuda" : "cpu");
    if (sv->o.n_frontends)
        LOG_INFO("serving '%s': %d worker%s, OpenAI API at http://%s:%d/v1%s; Ctrl-C stops it",
                 sv->name, sv->o.n_workers, sv->o.n_workers == 1 ? "" : "s",
                 sv->o.host ? sv->o.host : "127.0.0.1", sv->o.port,
                 sv->o.n_frontends > 1 ? " (and the next ports)" : "");
    else
        LOG_INFO("serving '%s': %d worker%s, no frontend (`strata run --name %s -p ...` uses "
                 "them); Ctrl-C stops it",
                 sv->name, sv->o.n_workers, sv->o.n_workers == 1 ? "" : "s", sv->name);
    what = "supervision";
    rv = sup_run(sv->sup, -1);
fail:;
    int status = rv == 0 || rv == STRATA_ECANCELED ? 0 : 1;
    if (status) strata_cmd_fail("serve", what, rv);
    if (sv->sup) {
        bool arena_gone = sv->arena >= 0 && !sv->o.keep_arena;
        if (sv->arena >= 0 && sv->o.keep_arena && sup_pid(sv->sup, sv->arena)) {
            LOG_INFO("leaving arena '%s' running (pid %d): `strata-arena stop %s` removes it",
                     sv->name, (int)sup_pid(sv->sup, sv->arena), sv->name);
            sup_detach(sv->sup, sv->arena);
        }
        sup_stop_all(sv->sup);
        cleanup(sv, arena_gone);
        sup_fini(sv->sup);
        LOG_INFO("'%s' stopped", sv->name);
    }
    return status;
}

static int run(int argc, char **argv)
{
    struct serve *sv = calloc(1, sizeof *sv);
    if (!sv) return strata_cmd_fail("serve", "setup", STRATA_ENOMEM);
    int rv = parse_args(argc, argv, &sv->o);
    if (rv) {
        free(sv);
        return rv < 0 ? 0 : rv;
    }
    strata_log_set_tag("serve");
    /* The frontends read the key from their environment, which only our uid can read
     * (/proc/PID/environ), never from their command line, which every user can (ps). */
    if (sv->o.api_key && setenv("STRATA_API_KEY", sv->o.api_key, 1) != 0) {
        free(sv);
        return strata_cmd_fail("serve", "setup", strata_errno(errno));
    }
    rv = serve_main(sv);
    free(sv);
    return rv;
}

const struct strata_cmd strata_cmd_serve = {"serve", "run the arena, workers and HTTP frontends",
                                            run};
