/* strata-worker — serves a MoE model's forward pass and sampling over NNG to frontends: options ->
 * struct worker_config -> worker_init/run/fini. */
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/ipc/ipc.h"
#include "gpu-worker/backend.h"
#include "gpu-worker/worker.h"

#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: strata-worker (--arena NAME | --model FILE.gguf) [options]\n"
    "\n"
    "  --arena NAME         serve the arena NAME built by `strata-arena serve` (registers in it)\n"
    "  --model FILE.gguf    serve a GGUF file without an arena (no registry, no shared heat)\n"
    "  --shm-dir DIR        the arena's shared-memory directory (default /dev/shm)\n"
    "  --runtime-dir DIR    socket directory (default $XDG_RUNTIME_DIR/strata/NAME); the socket\n"
    "                       is DIR/worker-<n>.sock with the first free n\n"
    "  --threads N          threads of the forward pass (default 1)\n"
    "  --orphan-timeout S   cancel a request nobody polled for S seconds (default 10)\n"
    "  --max-seqs N         requests decoded at once (default 16)\n"
    "  --max-queue N        requests waiting before submit answers busy (default 64)\n"
    "  --ctx N              positions per request (default: the model's context length)\n"
    "  --spec-lookup N      speculative decoding by prompt lookup: verify up to N (<= 8) drafts\n"
    "                       from each request's own history per window (fewer while few are\n"
    "                       accepted); answers are unchanged\n"
    "  --draft FILE.gguf    speculative decoding with a draft model: a small model of the same\n"
    "                       vocabulary (any architecture), run on the CPU beside this one,\n"
    "                       drafts for every request; replaces --spec-lookup\n"
    "  --draft-max N        the draft model's drafts per request and window (default 4, <= 8)\n"
    BACKEND_OPTS_USAGE
    "  --bit-exact          refuse to start unless answers depend only on the model and the\n"
    "                       token history (the CPU backend always can)\n"
    "Serves in the foreground until SIGINT or SIGTERM; the protocol is docs/protocol.md.\n";

/* A signal during init is remembered so the worker stops as soon as it is up. */
static _Atomic int g_signaled;
static struct worker *_Atomic g_worker;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&g_signaled, 1);
    struct worker *w = atomic_load(&g_worker);
    if (w) worker_stop(w);
}

/* num parses a non-negative int option or exits with a usage error. */
static int num(const char *opt, const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end != 0 || v < 0 || v > 1 << 30) {
        fprintf(stderr, "strata-worker: --%s %s: expected a non-negative integer\n", opt, s);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv)
{
    static const struct option longs[] = {{"arena", required_argument, NULL, 'a'},
                                          {"model", required_argument, NULL, 'm'},
                                          {"shm-dir", required_argument, NULL, 'd'},
                                          {"runtime-dir", required_argument, NULL, 'r'},
                                          {"threads", required_argument, NULL, 't'},
                                          {"orphan-timeout", required_argument, NULL, 'o'},
                                          {"max-seqs", required_argument, NULL, 's'},
                                          {"max-queue", required_argument, NULL, 'q'},
                                          {"ctx", required_argument, NULL, 'c'},
                                          {"bit-exact", no_argument, NULL, 'b'},
                                          {"backend", required_argument, NULL, 'B'},
                                          {"kv-type", required_argument, NULL, 'B'},
                                          {"expert-cache", required_argument, NULL, 'B'},
                                          {"adapt-every", required_argument, NULL, 'B'},
                                          {"adapt-swaps", required_argument, NULL, 'B'},
                                          {"adapt-decay", required_argument, NULL, 'B'},
                                          {"adapt-min", required_argument, NULL, 'B'},
                                          {"adapt-lead", required_argument, NULL, 'B'},
                                          {"cache-verify", required_argument, NULL, 'B'},
        {"adapt-async", required_argument, NULL, 'B'},
        {"slot-kv", required_argument, NULL, 'B'},
        {"pin", required_argument, NULL, 'B'},
        {"pcie-frac", required_argument, NULL, 'B'},
        {"pcie-threshold", required_argument, NULL, 'B'},
        {"vram-mib", required_argument, NULL, 'B'},
        {"gpu", required_argument, NULL, 'B'},
        {"vram-reserve-mib", required_argument, NULL, 'B'},
        {"spec-lookup", required_argument, NULL, 'S'},
        {"draft", required_argument, NULL, 'D'},
        {"draft-max", required_argument, NULL, 'K'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    struct worker_config cfg = {.backend = backend_opts_default()};
    int c, li;
    strata_log_set_tag("worker");
    while ((c = getopt_long(argc, argv, "h", longs, &li)) != -1) {
        switch (c) {
        case 'a':
            cfg.arena = optarg;
            break;
        case 'm':
            cfg.model = optarg;
            break;
        case 'd':
            cfg.shm_dir = optarg;
            break;
        case 'r':
            cfg.runtime_dir = optarg;
            break;
        case 't':
            cfg.threads = num("threads", optarg);
            break;
        case 'o':
            cfg.orphan_timeout_s = num("orphan-timeout", optarg);
            break;
        case 's':
            cfg.max_seqs = num("max-seqs", optarg);
            break;
        case 'q':
            cfg.max_queue = num("max-queue", optarg);
            break;
        case 'c':
            cfg.ctx = num("ctx", optarg);
            break;
        case 'b':
            cfg.bit_exact = true;
            break;
        case 'S':
            cfg.spec_lookup = num("spec-lookup", optarg);
            break;
        case 'D':
            cfg.draft = optarg;
            break;
        case 'K':
            cfg.draft_max = num("draft-max", optarg);
            break;
        case 'B': /* the backend's own options (backend.h) */
            if (backend_opt(&cfg.backend, longs[li].name, optarg) != 0) {
                fprintf(stderr, "strata-worker: %s\n", strata_errdetail());
                return 2;
            }
            break;
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        default:
            fputs(usage_text, stderr);
            return 2;
        }
    }
    if (optind < argc || !cfg.arena == !cfg.model) {
        fputs(usage_text, stderr);
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct worker *w;
    int rv = worker_init(&cfg, &w);
    if (rv != 0) {
        fprintf(stderr, "strata-worker: %s: %s\n", strata_strerror(rv), strata_errdetail());
        return 1;
    }
    atomic_store(&g_worker, w);
    if (atomic_load(&g_signaled)) worker_stop(w);
    printf("%s\n", worker_url(w));
    fflush(stdout);
    worker_run(w);
    atomic_store(&g_worker, NULL);
    /* a GPU's teardown (unpinning tens of GB, freeing VRAM) takes seconds, not 20; CI twice saw a
     * CPU worker that had been SIGSTOPped mid-stream and continued not exit within 30 s of
     * SIGTERM (fe_e2e_test failover_same_backend_and_kv_type; cause not found): its state is the
     * arena's or lost with it either way, so a stuck teardown exits sooner */
    ipc_stop_deadline("worker", 20);
    worker_fini(w);
    return 0;
}
