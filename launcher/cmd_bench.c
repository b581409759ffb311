/* strata bench — `strata bench MODEL.gguf [--threads N] [--prompt N] [--gen N] [--json]
 * [--llama]`: prefill and decode speed of the CPU forward pass, where the time goes, the weight
 * bandwidth reached against the machine's read bandwidth (tools/bench.h), and with --llama the
 * same run through llama.cpp (node-llama-cpp, tools/bench_llama.mjs) side by side. */
#include "common/base/err.h"
#include "launcher/cmd.h"
#include "tools/bench.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NLC_PACKAGE "node-llama-cpp@3.21.1"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata bench MODEL.gguf [--threads N] [--prompt N] [--gen N] [--reps N]\n"
            "                    [--json] [--llama] [--nlc DIR]\n"
            "\n"
            "Times a prompt of --prompt tokens in one chunk (prefill) and --gen greedy decode\n"
            "steps on the CPU, after a warm-up pass, and prints tokens/s, where the time goes and\n"
            "the weight bandwidth of decode against this machine's streaming-read bandwidth.\n"
            "  --threads N   compute threads (default: the online CPUs)\n"
            "  --prompt N    prompt tokens (default 512)\n"
            "  --gen N       decode steps (default 64)\n"
            "  --reps N      runs; the best of each phase is shown (default 3): other work on\n"
            "                the machine only slows a run down\n"
            "  --json        one JSON line: prefill_tok_s, decode_tok_s, the breakdowns, ...\n"
            "  --llama       also run llama.cpp on the same file, threads and lengths through\n"
            "                node-llama-cpp, side by side\n"
            BACKEND_OPTS_USAGE
            "  --nlc DIR     where `npm install --prefix DIR " NLC_PACKAGE "` put the package\n"
            "                (default: $STRATA_NLC, else build/nlc under the source tree)\n"
            "STRATA_CPU=ref|avx2|avx512 picks the kernels (default: the best this CPU has).\n");
}


/* The llama.cpp side: its JSON line parsed, or why there is none. */
struct peer {
    bool ok;
    double prefill_tok_s, decode_tok_s, prefill_s, decode_s;
    char why[4400];
};

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void run_llama(const char *model, const char *nlc, uint32_t threads, uint32_t prompt,
                      uint32_t gen, uint32_t reps, struct peer *p)
{
    char dir[1024], pkg[1200], cmd[4096];
    if (nlc)
        snprintf(dir, sizeof dir, "%s", nlc);
    else if (getenv("STRATA_NLC"))
        snprintf(dir, sizeof dir, "%s", getenv("STRATA_NLC"));
    else
        snprintf(dir, sizeof dir, "%s/build/nlc", STRATA_SOURCE_DIR);
    snprintf(pkg, sizeof pkg, "%s/node_modules/node-llama-cpp", dir);
    if (system("node --version >/dev/null 2>&1") != 0) {
        snprintf(p->why, sizeof p->why,
                 "node is not installed: install Node.js 18+ (apt-get install nodejs npm), then "
                 "npm install --prefix %s " NLC_PACKAGE,
                 dir);
        return;
    }
    if (!is_dir(pkg)) {
        snprintf(p->why, sizeof p->why,
                 "node-llama-cpp is not in %s: npm install --prefix %s " NLC_PACKAGE
                 " (or pass --nlc DIR)",
                 dir, dir);
        return;
    }
    if (strchr(model, '\'') || strchr(dir, '\'')) {
        snprintf(p->why, sizeof p->why, "paths with a single quote are not passed to node");
        return;
    }
    snprintf(cmd, sizeof cmd, "STRATA_NLC='%s' node '%s/tools/bench_llama.mjs' '%s' %u %u %u %u",
             dir, STRATA_SOURCE_DIR, model, threads, prompt, gen, reps);
    FILE *f = popen(cmd, "r");
    char line[4096] = "";
    json_t *j = NULL;
    if (f) {
        while (fgets(line, sizeof line, f))
            if (line[0] == '{') break;
        while (getc(f) != EOF)
            continue;
        int st = pclose(f);
        if (st == 0 && line[0] == '{') j = json_loads(line, 0, NULL);
    }
    if (!j) {
        snprintf(p->why, sizeof p->why, "node-llama-cpp gave no timings: run `%s` to see why", cmd);
        return;
    }
    p->prefill_tok_s = json_number_value(json_object_get(j, "prefill_tok_s"));
    p->decode_tok_s = json_number_value(json_object_get(j, "decode_tok_s"));
    p->prefill_s = json_number_value(json_object_get(j, "prefill_s"));
    p->decode_s = json_number_value(json_object_get(j, "decode_s"));
    p->ok = true;
    json_decref(j);
}

static void breakdown_json(FILE *out, const char *name, const struct backend_stats *s)
{
    fprintf(out,
            "\"%s\": {\"total_s\": %.4f, \"attention_s\": %.4f, \"dense_s\": %.4f, "
            "\"experts_s\": %.4f, \"output_s\": %.4f, \"weight_bytes\": %llu}",
            name, s->total_s, s->attention_s, s->dense_s, s->experts_s, s->output_s,
            (unsigned long long)s->weight_bytes);
}

static void row(const char *what, double a, double at, double b, double bt)
{
    printf("  %-22s %8.3f s %5.1f%%   %8.3f s %5.1f%%\n", what, a, at > 0 ? 100 * a / at : 0, b,
           bt > 0 ? 100 * b / bt : 0);
}

static void table(const char *model, const struct bench_opts *o, const struct bench_result *r,
                  const struct peer *p, bool asked, double load)
{
    printf("strata bench %s: %.0f MiB, %s backend (%s), KV %s, load average %.2f\n", model,
           (double)r->file_bytes / (1 << 20), r->info.name, r->info.device,
           kv_type_name(r->info.kv_type), load);
    printf("\n  %-22s %16s %16s\n", "", "strata", asked ? "llama.cpp" : "");
    char a[64], b[64];
    snprintf(a, sizeof a, "prefill (%u tokens)", o->prompt);
    printf("  %-22s %10.1f tok/s", a, r->prefill_tok_s);
    if (p->ok)
        printf(" %10.1f tok/s  (%.2fx)", p->prefill_tok_s, r->prefill_tok_s / p->prefill_tok_s);
    snprintf(b, sizeof b, "decode (%u tokens)", o->gen);
    printf("\n  %-22s %10.1f tok/s", b, r->decode_tok_s);
    if (p->ok) printf(" %10.1f tok/s  (%.2fx)", p->decode_tok_s, r->decode_tok_s / p->decode_tok_s);
    printf("\n");
    if (asked && !p->ok) printf("  llama.cpp: %s\n", p->why);
    const struct backend_stats *P = &r->prefill, *D = &r->decode;
    printf("\n  %-22s %18s %18s\n", "where the time goes", "prefill", "decode");
    row("attention", P->attention_s, P->total_s, D->attention_s, D->total_s);
    row("dense matmuls", P->dense_s, P->total_s, D->dense_s, D->total_s);
    row("routed experts", P->experts_s, P->total_s, D->experts_s, D->total_s);
    row("output", P->output_s, P->total_s, D->output_s, D->total_s);
    row("other", P->total_s - P->attention_s - P->dense_s - P->experts_s - P->output_s, P->total_s,
        D->total_s - D->attention_s - D->dense_s - D->experts_s - D->output_s, D->total_s);
    const double per_tok = D->tokens ? (double)D->weight_bytes / D->tokens : 0;
    printf("\n  decode streams %.1f MiB of weights per token: %.1f GB/s, %.0f%% of the %.1f GB/s "
           "this machine reads with %u threads\n",
           per_tok / (1 << 20), r->decode_gbs, 100 * r->decode_gbs / r->read_gbs, r->read_gbs,
           r->threads);
}

static int run(int argc, char **argv)
{
    const char *model = NULL, *nlc = NULL;
    bool json = false, llama = false;
    int rv;
    struct bench_opts o = {.prompt = 512, .gen = 64, .reps = 3, .backend = backend_opts_default()};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint32_t *num = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--llama")) {
            llama = true;
        } else if (!strcmp(a, "--nlc") && i + 1 < argc) {
            nlc = argv[++i];
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            num = &o.threads;
        } else if (!strcmp(a, "--prompt") && i + 1 < argc) {
            num = &o.prompt;
        } else if (!strcmp(a, "--gen") && i + 1 < argc) {
            num = &o.gen;
        } else if (!strcmp(a, "--reps") && i + 1 < argc) {
            num = &o.reps;
        } else if (a[0] == '-' && a[1] == '-' && i + 1 < argc &&
                   (rv = backend_opt(&o.backend, a + 2, argv[i + 1])) != STRATA_ENOENT) {
            if (rv) {
                fprintf(stderr, "strata bench: %s\n", strata_errdetail());
                return 2;
            }
            i++;
        } else if (a[0] == '-' || model) {
            fprintf(stderr, "strata bench: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        } else {
            model = a;
        }
        if (num && strata_cmd_parse_u32(argv[++i], a, 1, num)) {
            fprintf(stderr, "strata bench: %s %s: give a whole number >= 1\n", a, argv[i]);
            return 2;
        }
    }
    if (!model) {
        usage(stderr);
        return 2;
    }
    o.model = model;
    struct bench_result r;
    rv = bench_run(&o, &r);
    if (rv) return strata_cmd_fail("bench", model, rv);
    struct peer p = {0};
    if (llama) run_llama(model, nlc, r.threads, o.prompt, o.gen, o.reps, &p);
    double load[1] = {0};
    getloadavg(load, 1);
    if (!json) {
        table(model, &o, &r, &p, llama, load[0]);
        return 0;
    }
    printf("{\"model\": \"%s\", \"threads\": %u, \"isa\": \"%s\", \"prompt\": %u, \"gen\": %u, "
           "\"reps\": %u, "
           "\"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"read_gbs\": %.2f, "
           "\"decode_gbs\": %.2f, \"load\": %.2f, ",
           model, r.threads, r.isa, o.prompt, o.gen, o.reps, r.prefill_tok_s, r.decode_tok_s,
           r.read_gbs, r.decode_gbs, load[0]);
    breakdown_json(stdout, "prefill", &r.prefill);
    printf(", ");
    breakdown_json(stdout, "decode", &r.decode);
    if (p.ok)
        printf(", \"llama\": {\"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f}", p.prefill_tok_s,
               p.decode_tok_s);
    printf("}\n");
    return 0;
}

const struct strata_cmd strata_cmd_bench = {
    "bench", "prefill and decode speed on the CPU, beside llama.cpp with --llama", run};
