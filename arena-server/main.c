/* strata-arena — holds every expert of a MoE model once in shared memory: options -> config ->
 * arena_serve_init/run/fini, plus the client subcommands of arena_cli.h. */
#include "arena-server/arena_cli.h"
#include "arena-server/arena_serve.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/ipc/ipc.h"

#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage_text[] =
    "usage: strata-arena <command> [options]\n"
    "\n"
    "  serve MODEL.gguf [--name NAME] [--shm-dir DIR] [--align 4k|2m] [--force] [--group]\n"
    "        [--profile PATH] [--runtime-dir DIR] [--threads N] [--profile-every SEC]\n"
    "        [--no-control]\n"
    "      build (or adopt) the arena of MODEL and serve it until SIGINT/SIGTERM or `stop`.\n"
    "      NAME defaults to the model's base name; segments are DIR/strata-<uid>-NAME[.state].\n"
    "      --align 2m pads every blob to 2 MiB (for hugetlbfs; the waste is printed).\n"
    "      --force removes the segments at exit even while workers still map them.\n"
    "      --group makes the segments readable by the group (0440/0660).\n"
    "  status NAME [--runtime-dir DIR]        ask the server for its status\n"
    "  stop NAME [--runtime-dir DIR] [--force] ask the server to shut down\n"
    "  inspect NAME [--shm-dir DIR] [--json]   print the layout (reads the segment directly)\n"
    "  verify NAME [--shm-dir DIR]             check every byte against the model file\n"
    "  bench MODEL.gguf [--shm-dir DIR] [--threads N] [--align 4k|2m] [--repeat N]\n"
    "                                          cold/warm build rate vs a sequential read\n";

/* A signal during init cancels a build in progress; after init it stops the server. */
static _Atomic int g_signaled;
static struct arena_server *_Atomic g_server;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&g_signaled, 1);
    struct arena_server *s = atomic_load(&g_server);
    if (s) arena_serve_stop(s, false);
}

static int serve_main(int argc, char **argv)
{
    static const struct option longs[] = {{"name", required_argument, NULL, 'n'},
                                          {"shm-dir", required_argument, NULL, 'd'},
                                          {"align", required_argument, NULL, 'a'},
                                          {"force", no_argument, NULL, 'f'},
                                          {"group", no_argument, NULL, 'g'},
                                          {"profile", required_argument, NULL, 'p'},
                                          {"runtime-dir", required_argument, NULL, 'r'},
                                          {"threads", required_argument, NULL, 't'},
                                          {"profile-every", required_argument, NULL, 'e'},
                                          {"no-control", no_argument, NULL, 'C'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    struct arena_serve_config cfg = {.control = true, .progress = true, .cancel = &g_signaled};
    int c, rv;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'n':
            cfg.name = optarg;
            break;
        case 'd':
            cfg.shm_dir = optarg;
            break;
        case 'a':
            if ((rv = arena_cli_parse_align(optarg, &cfg.align)) != 0) {
                fprintf(stderr, "strata-arena serve: %s\n", strata_errdetail());
                return 2;
            }
            break;
        case 'f':
            cfg.force = true;
            break;
        case 'g':
            cfg.group = true;
            break;
        case 'p':
            cfg.profile = optarg;
            break;
        case 'r':
            cfg.runtime_dir = optarg;
            break;
        case 't':
            cfg.threads = atoi(optarg);
            break;
        case 'e':
            cfg.profile_every_s = atoi(optarg);
            break;
        case 'C':
            cfg.control = false;
            break;
        case 'h':
            printf("%s", usage_text);
            return 0;
        default:
            fprintf(stderr, "%s", usage_text);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "strata-arena serve: expected one MODEL.gguf\n%s", usage_text);
        return 2;
    }
    cfg.model = argv[optind];
    strata_log_set_tag("arena");
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct arena_server *s = NULL;
    if ((rv = arena_serve_init(&cfg, &s)) != 0) {
        const char *d = strata_errdetail();
        fprintf(stderr, "strata-arena serve: %s%s%s\n", strata_strerror(rv), d[0] ? ": " : "", d);
        return 1;
    }
    atomic_store(&g_server, s);
    if (atomic_load(&g_signaled)) arena_serve_stop(s, false);
    rv = arena_serve_run(s);
    atomic_store(&g_server, NULL);
    ipc_stop_deadline("arena", 30);
    arena_serve_fini(s);
    return rv == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "%s", usage_text);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        printf("%s", usage_text);
        return 0;
    }
    if (strcmp(cmd, "serve") == 0) return serve_main(argc - 1, argv + 1);
    if (strcmp(cmd, "inspect") == 0) return arena_cli_inspect(argc - 1, argv + 1);
    if (strcmp(cmd, "verify") == 0) return arena_cli_verify(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return arena_cli_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "status") == 0) return arena_cli_status(argc - 1, argv + 1);
    if (strcmp(cmd, "stop") == 0) return arena_cli_stop(argc - 1, argv + 1);
    fprintf(stderr, "strata-arena: unknown command '%s'\n%s", cmd, usage_text);
    return 2;
}
