/* strata-frontend — the OpenAI-compatible HTTP API (default) or, as `strata-frontend chat`, the
 * command-line chat. Options -> struct fe_opts -> fe_init / fe_start / wait for a signal / fe_fini.
 */
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/ipc/ipc.h"
#include "common/base/own.h"
#include "frontend/chat.h"
#include "frontend/fe.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *to)
{
    fprintf(
        to,
        "usage: strata-frontend (--worker URL... | --arena NAME) [options]\n"
        "       strata-frontend chat --help\n"
        "Serve the OpenAI-compatible API (docs/api.md) in front of strata workers.\n"
        "  --worker URL          a worker's socket (repeat for several)\n"
        "  --arena NAME          every live worker registered in arena NAME (re-read every "
        "second)\n"
        "  --shm-dir DIR         where the arena lives (default /dev/shm)\n"
        "  --host ADDR           address to bind (default 127.0.0.1)\n"
        "  --port N              port (default 8080; 0 picks a free one and prints it)\n"
        "  --api-key-file FILE   require 'Authorization: Bearer KEY', KEY the file's first line\n"
        "                        (or set $STRATA_API_KEY; --api-key KEY works too, but every\n"
        "                        local user can read it in `ps`)\n"
        "  --threads N           HTTP threads (default 4)\n"
        "  --conn-limit N        open connections at most (default 256)\n"
        "  --timeout S           idle connection timeout in seconds (default 60)\n"
        "  --request-timeout S   a request's head and body must arrive within S (default 30)\n"
        "  --max-body BYTES      request body limit (default 8388608)\n"
        "  --max-tokens N        most tokens one request may ask for (default: the context)\n"
        "  --max-active N        generations in flight; more get 429 (default 64)\n"
        "  --chat-template SPEC  a built-in template name or a Jinja file (default: the model's)\n"
        "  --alias NAME          the model name /v1/models reports\n"
        "  --worker-wait-ms MS   a request that finds no worker ready (one restarting) waits\n"
        "                        this long for one before its 503 (default 10000; 0: none)\n"
        "  --failover-ms MS      a worker silent this long (past a poll's 1 s wait) is down: its\n"
        "                        streams move to another worker (default 1500)\n"
        "  --log LEVEL           error, warn, info, debug, trace\n");
}

static long num(const char *opt, const char *s, long min, long max)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < min || v > max) {
        fprintf(stderr, "strata-frontend: --%s %s: expected an integer in [%ld, %ld]\n", opt, s,
                min, max);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "chat") == 0)
        return chat_main("strata-frontend chat", argc - 1, argv + 1);
    static const struct option lo[] = {{"worker", 1, 0, 'w'},
                                       {"arena", 1, 0, 'a'},
                                       {"shm-dir", 1, 0, 'd'},
                                       {"host", 1, 0, 'H'},
                                       {"port", 1, 0, 'p'},
                                       {"api-key", 1, 0, 'k'},
                                       {"api-key-file", 1, 0, 'K'},
                                       {"threads", 1, 0, 't'},
                                       {"conn-limit", 1, 0, 'c'},
                                       {"timeout", 1, 0, 'T'},
                                       {"request-timeout", 1, 0, 'R'},
                                       {"max-body", 1, 0, 'b'},
                                       {"max-tokens", 1, 0, 'm'},
                                       {"max-active", 1, 0, 'A'},
                                       {"chat-template", 1, 0, 'C'},
                                       {"alias", 1, 0, 'n'},
                                       {"failover-ms", 1, 0, 'F'},
                                       {"worker-wait-ms", 1, 0, 'W'},
                                       {"log", 1, 0, 'l'},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    static char key[512];
    struct fe_opts o = {.port = 8080, .api_key = getenv("STRATA_API_KEY")};
    const char *workers[32], *arena = NULL, *shm_dir = NULL;
    int n_workers = 0, c, idx, rv;
    enum strata_log_level lvl;
    strata_log_set_tag("frontend");
    while ((c = getopt_long(argc, argv, "", lo, &idx)) != -1) {
        switch (c) {
        case 'w':
            if (n_workers == 32) {
                fprintf(stderr, "strata-frontend: at most 32 --worker\n");
                return 2;
            }
            workers[n_workers++] = optarg;
            break;
        case 'a':
            arena = optarg;
            break;
        case 'd':
            shm_dir = optarg;
            break;
        case 'H':
            o.host = optarg;
            break;
        case 'p':
            o.port = (int)num("port", optarg, 0, 65535);
            break;
        case 'k':
            o.api_key = optarg;
            LOG_WARN("--api-key puts the key on the command line, where every local user can "
                     "read it (ps): use --api-key-file FILE or $STRATA_API_KEY");
            break;
        case 'K':
            if ((rv = own_read_key(optarg, key, sizeof key)) != 0) {
                fprintf(stderr, "strata-frontend: --api-key-file: %s\n", strata_errdetail());
                return 2;
            }
            o.api_key = key;
            break;
        case 'W':
            o.worker_wait_ms = (int)num("worker-wait-ms", optarg, 0, 600000);
            if (!o.worker_wait_ms) o.worker_wait_ms = -1;
            break;
        case 'R':
            o.request_timeout_s = (unsigned)num("request-timeout", optarg, 1, 86400);
            break;
        case 't':
            o.threads = (int)num("threads", optarg, 1, 256);
            break;
        case 'c':
            o.conn_limit = (unsigned)num("conn-limit", optarg, 1, 1000000);
            break;
        case 'T':
            o.timeout_s = (unsigned)num("timeout", optarg, 1, 86400);
            break;
        case 'b':
            o.max_body = (size_t)num("max-body", optarg, 1024, 1L << 30);
            break;
        case 'm':
            o.max_tokens = (uint32_t)num("max-tokens", optarg, 1, WCLIENT_MAX_TOKENS);
            break;
        case 'A':
            o.max_active = (uint32_t)num("max-active", optarg, 1, 100000);
            break;
        case 'C':
            o.chat_template = optarg;
            break;
        case 'n':
            o.model_alias = optarg;
            break;
        case 'F':
            o.failover_ms = (int)num("failover-ms", optarg, 100, 600000);
            break;
        case 'l':
            if (strata_log_parse_level(optarg, &lvl) != 0) {
                fprintf(stderr,
                        "strata-frontend: --log %s: use error, warn, info, debug or trace\n",
                        optarg);
                return 2;
            }
            strata_log_set_level(lvl);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc || (!n_workers && !arena)) {
        fprintf(stderr, "strata-frontend: give --worker URL (one or more) or --arena NAME\n");
        usage(stderr);
        return 2;
    }
    /* signals are taken synchronously by sigwait below, so every thread must block them */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct fe *f = NULL;
    if ((rv = fe_init(&o, &f)) != 0) goto fail;
    for (int i = 0; i < n_workers; i++)
        if ((rv = fe_add_worker_url(f, workers[i])) != 0) goto fail;
    if (arena && (rv = fe_add_workers_arena(f, shm_dir, arena)) != 0) goto fail;
    if ((rv = fe_start(f)) != 0) goto fail;
    LOG_INFO("listening on http://%s:%d", o.host ? o.host : "127.0.0.1", fe_port(f));
    printf("strata-frontend: listening on port %d\n", fe_port(f));
    fflush(stdout);
    int sig;
    sigwait(&sigs, &sig);
    LOG_INFO("signal %d: stopping", sig);
    /* a frontend has nothing to save (its streams are cancelled, its workers keep their state):
     * 10 s bounds a stop stuck in nng */
    ipc_stop_deadline("frontend", 10);
    fe_fini(f);
    return 0;
fail:
    fprintf(stderr, "strata-frontend: %s: %s\n", strata_strerror(rv), strata_errdetail());
    fe_fini(f);
    return 1;
}
