/* strata bench — `strata bench MODEL.gguf [--threads N] [--prompt N] [--gen N] [--json]
 * [--llama]`: prefill and decode speed of the CPU forward pass, where the time goes, the weight
 * bandwidth reached against the machine's read bandwidth (tools/bench.h), and with --llama the
 * same run through llama.cpp (node-llama-cpp, tools/bench_llama.mjs) side by side. */
#include "common/base/err.h"
#include "launcher/cmd.h"
#include "common/quant/qtype.h"
#include "kernels/cpu/cpu.h"
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
            "usage: strata bench MODEL.gguf|--arena NAME [--threads N] [--prompt N] [--gen N] [--reps N]\n"
            "                    [--json] [--llama] [--nlc DIR] [--rounds N] [--kernels]\n"
            "                    [--experts] [--sweep]\n"
            "       strata bench --kernels [--threads N]\n"
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
            "  --decode-ids greedy|random  decode steps feed the greedy pick (default) or seeded\n"
            "                random ids, as llama-bench's tg does (a random-weight model's\n"
            "                greedy stream repeats, and with it the experts it routes to)\n"
            "  --arena NAME  bench the model of a running arena (strata-arena serve --name NAME)\n"
            "                instead of a file, its experts read from the arena's blobs as a\n"
            "                worker's are (registered for --pin and the PCIe share)\n"
            "  --shm-dir D   the arena's directory (default /dev/shm)\n"
            "  --prompt-text FILE  the prompt is FILE's text (tokenized), not --prompt ids\n"
            "  --spec-lookup N     decode with up to N (<= 8) prompt-lookup drafts a pass\n"
            "  --draft FILE.gguf   decode with this draft model's drafts (same vocabulary)\n"
            "  --draft-max N       its drafts a pass (default 4, <= 8)\n"
            "  --llama       also run llama.cpp on the same file, threads and lengths through\n"
            "                node-llama-cpp, side by side (with STRATA_CPU=avx2 on an AVX-512\n"
            "                machine, its AVX2 variant: both sides run AVX2 code)\n"
            BACKEND_OPTS_USAGE
            "  --nlc DIR     where `npm install --prefix DIR " NLC_PACKAGE "` put the package\n"
            "                (default: $STRATA_NLC, else build/nlc under the source tree)\n"
            "  --rounds N    N rounds, strata then llama.cpp in each (default 1); the best of\n"
            "                every round is shown, with the load average over them (each\n"
            "                round's figures go to stderr as it ends)\n"
            "  --kernels     also time the quantized products alone (Q4_K, Q5_K, Q6_K, Q8_0,\n"
            "                Q4_0, IQ4_XS, MXFP4; 1, 2, 4, 8, 16 tokens) in GB/s against the read\n"
            "                bandwidth\n"
            "  --experts     also time the expert step of decode windows of 8, 16, 32, 64 tokens\n"
            "                routed over 128 experts (copies of the file's), in GB/s\n"
            "  --sweep       also decode at 1, 2 and all threads: weight MiB a token, GB/s and\n"
            "                the share of the read bandwidth of the same threads, with the load\n"
            "STRATA_CPU=ref|avx2|avx512 picks the kernels (default: the best this CPU has).\n");
}


/* The llama.cpp side: its JSON line parsed, or why there is none. */
struct peer {
    bool ok;
    bool haswell; /* llama.cpp ran its haswell (AVX2) CPU variant, as strata's kernels */
    double prefill_tok_s, decode_tok_s, prefill_s, decode_s;
    char why[4400];
};

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* haswell_only makes tmp (a new directory) a copy of node-llama-cpp's install dir, hard-linked
 * where it can be, holding only ggml's haswell CPU variant (AVX2, FMA, F16C): ggml loads the best
 * variant the CPU runs, so with strata's kernels forced to AVX2 on an AVX-512 machine llama.cpp
 * would still run AVX-512 code. Returns 0, or -1 with why (tmp removed). */
static int haswell_only(const char *dir, char *tmp, size_t cap, char *why, size_t why_cap)
{
    const char *base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmp, cap, "%s/strata-bench-nlc-XXXXXX", base);
    if (strchr(tmp, '\'') || !mkdtemp(tmp)) {
        snprintf(why, why_cap, "cannot make a directory in %s for llama.cpp's AVX2 variant", base);
        return -1;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "{ cp -al '%s/.' '%s/' 2>/dev/null || cp -a '%s/.' '%s/'; } && "
             "find '%s' -name 'libggml-cpu-*.so' ! -name 'libggml-cpu-haswell.so' -delete && "
             "test -n \"$(find '%s' -name libggml-cpu-haswell.so)\"",
             dir, tmp, dir, tmp, tmp, tmp);
    if (system(cmd) == 0) return 0;
    snprintf(why, why_cap,
             "node-llama-cpp in %s has no libggml-cpu-haswell.so (or it could not be copied to "
             "%s): llama.cpp would not run AVX2 code as strata does; unset STRATA_CPU to compare "
             "both at their best",
             dir, base);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "strata bench: could not remove %s\n", tmp);
    return -1;
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
    /* strata forced to AVX2 on an AVX-512 machine: llama.cpp on AVX2 too */
    char tmp[sizeof dir] = "";
    if (cpu_isa() == CPU_AVX2 && cpu_isa_supported(CPU_AVX512)) {
        if (haswell_only(dir, tmp, sizeof tmp, p->why, sizeof p->why) != 0) return;
        snprintf(dir, sizeof dir, "%s", tmp);
        p->haswell = true;
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
    if (tmp[0]) {
        char rm[1200];
        snprintf(rm, sizeof rm, "rm -rf '%s'", tmp);
        if (system(rm) != 0) fprintf(stderr, "strata bench: could not remove %s\n", tmp);
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
                  const struct peer *p, bool asked, const double load[2], uint32_t rounds)
{
    printf("strata bench %s: %.0f MiB, %s backend (%s), KV %s, load average %.2f", model,
           (double)r->file_bytes / (1 << 20), r->info.name, r->info.device,
           kv_type_name(r->info.kv_type), load[0]);
    if (rounds > 1)
        printf("-%.2f over %u rounds%s, best of each", load[1], rounds,
               asked ? " (strata and llama.cpp alternating)" : "");
    printf("\n");
    printf("\n  %-22s %16s %16s\n", "", "strata", asked ? "llama.cpp" : "");
    char a[64], b[64];
    snprintf(a, sizeof a, "prefill (%u tokens)", r->prompt);
    printf("  %-22s %10.1f tok/s", a, r->prefill_tok_s);
    if (p->ok)
        printf(" %10.1f tok/s  (%.2fx)", p->prefill_tok_s, r->prefill_tok_s / p->prefill_tok_s);
    snprintf(b, sizeof b, "decode (%u tokens)", o->gen);
    printf("\n  %-22s %10.1f tok/s", b, r->decode_tok_s);
    if (p->ok) printf(" %10.1f tok/s  (%.2fx)", p->decode_tok_s, r->decode_tok_s / p->decode_tok_s);
    printf("\n");
    if (o->draft || o->spec_lookup)
        printf("  %-22s %u of %u accepted (%.0f%%), %.2f tokens a decode pass\n",
               o->draft ? "draft-model drafts" : "prompt-lookup drafts",
               (unsigned)r->drafts_accepted, (unsigned)r->drafts_proposed,
               r->drafts_proposed ? 100.0 * r->drafts_accepted / r->drafts_proposed : 0.0,
               r->decode_passes ? (double)o->gen / r->decode_passes : 0.0);
    if (asked && !p->ok) printf("  llama.cpp: %s\n", p->why);
    if (p->ok && p->haswell)
        printf("  llama.cpp ran ggml's haswell CPU variant (AVX2), as strata's kernels "
               "(STRATA_CPU=avx2 on an AVX-512 machine)\n");
    const struct backend_stats *P = &r->prefill, *D = &r->decode;
    printf("\n  %-22s %18s %18s\n", "where the time goes", "prefill", "decode");
    row("attention", P->attention_s, P->total_s, D->attention_s, D->total_s);
    row("dense matmuls", P->dense_s, P->total_s, D->dense_s, D->total_s);
    row("routed experts", P->experts_s, P->total_s, D->experts_s, D->total_s);
    row("output", P->output_s, P->total_s, D->output_s, D->total_s);
    row("other", P->total_s - P->attention_s - P->dense_s - P->experts_s - P->output_s, P->total_s,
        D->total_s - D->attention_s - D->dense_s - D->experts_s - D->output_s, D->total_s);
    const double per_tok = D->tokens ? (double)D->weight_bytes / D->tokens : 0;
    if (r->info.mem_gbs > 0) /* a GPU: its memory's copy bandwidth is the roofline */
        printf("\n  decode streams %.1f MiB of weights per token: %.1f GB/s, %.1f%% of the %.0f "
               "GB/s this GPU copies at (the roofline: %.0f tok/s)\n",
               per_tok / (1 << 20), r->decode_gbs, 100 * r->decode_gbs / r->info.mem_gbs,
               r->info.mem_gbs, per_tok > 0 ? r->info.mem_gbs * 1e9 / per_tok : 0.0);
    else
        printf("\n  decode streams %.1f MiB of weights per token: %.1f GB/s, %.0f%% of the %.1f "
               "GB/s this machine reads with %u threads\n",
               per_tok / (1 << 20), r->decode_gbs, 100 * r->decode_gbs / r->read_gbs, r->read_gbs,
               r->threads);
    const struct backend_info *I = &r->info;
    if (I->cache_slots && I->hits + I->misses)
        printf("  expert cache: %u slots, %u experts resident, hit rate %.1f%% of %llu routed "
               "pairs (misses computed from host memory, read at up to %.1f GB/s here)\n",
               I->cache_slots, I->resident, 100.0 * (double)I->hits / (double)(I->hits + I->misses),
               (unsigned long long)(I->hits + I->misses), r->read_gbs);
    if (I->cache_slots && r->decode_hits + r->decode_misses)
        printf("  decode alone: hit rate %.1f%% of %llu routed pairs (%s ids)\n",
               100.0 * (double)r->decode_hits / (double)(r->decode_hits + r->decode_misses),
               (unsigned long long)(r->decode_hits + r->decode_misses),
               o->decode_random ? "random" : "greedy");
    if (D->tokens && D->host_bytes + D->pcie_bytes) {
        /* the hybrid's decode bound: the CPU reads its misses from host RAM while the GPU reads
         * its PCIe share, side by side; the hits from VRAM are far faster than either */
        const double host = (double)D->host_bytes / D->tokens,
                     pcie = (double)D->pcie_bytes / D->tokens;
        const double t_host = r->read_gbs > 0 ? host / (r->read_gbs * 1e9) : 0,
                     t_pcie = I->pcie_gbs > 0 ? pcie / (I->pcie_gbs * 1e9) : 0;
        const double bound = 1.0 / (t_host > t_pcie ? t_host : t_pcie);
        printf("  hybrid decode: %.1f MiB a token from host RAM (CPU), %.1f MiB over PCIe (%.1f "
               "GB/s measured): roofline %.0f tok/s, %.0f%% reached\n",
               host / (1 << 20), pcie / (1 << 20), I->pcie_gbs, bound,
               100 * r->decode_tok_s / bound);
    }
}

static const uint32_t kernel_types[] = {QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_Q8_0,
                                        QT_Q4_0, QT_IQ4_XS, QT_MXFP4};
#define N_KTYPES (sizeof kernel_types / sizeof kernel_types[0])
static const uint32_t kernel_tokens[] = {1, 2, 4, 8, 16};
#define N_KTOKENS (sizeof kernel_tokens / sizeof kernel_tokens[0])
#define KERNEL_N_IN 2048 /* row length of the kernel table's matrices */

/* kernels_table prints the quantized products' weight bandwidth against the read bandwidth. */
static int kernels_table(uint32_t threads, bool json)
{
    double read = 0, g[N_KTYPES][N_KTOKENS];
    int rv = bench_read_gbs(threads, 256u << 20, &read);
    for (size_t i = 0; !rv && i < N_KTYPES; i++)
        for (size_t k = 0; !rv && k < N_KTOKENS; k++)
            rv = bench_matmul_gbs(kernel_types[i], KERNEL_N_IN, kernel_tokens[k], threads,
                                  256u << 20, &g[i][k]);
    if (rv) return rv;
    double load[1] = {0};
    getloadavg(load, 1);
    if (json) {
        printf("{\"kernels\": {\"threads\": %u, \"isa\": \"%s\", \"read_gbs\": %.2f, \"load\": %.2f",
               threads, cpu_isa_name(cpu_isa()), read, load[0]);
        for (size_t i = 0; i < N_KTYPES; i++) {
            printf(", \"%s\": [", qtype_name(kernel_types[i]));
            for (size_t k = 0; k < N_KTOKENS; k++)
                printf("%s%.2f", k ? ", " : "", g[i][k]);
            printf("]");
        }
        printf("}}\n");
        return 0;
    }
    printf("\nquantized products alone: 256 MiB matrices, rows of %u, %u threads, %s kernels, load "
           "average %.2f\n  weight GB/s (%% of the %.1f GB/s this machine reads)\n\n  %-8s",
           KERNEL_N_IN, threads, cpu_isa_name(cpu_isa()), load[0], read, "type");
    for (size_t k = 0; k < N_KTOKENS; k++)
        printf("   %u token%s    ", kernel_tokens[k], kernel_tokens[k] > 1 ? "s" : " ");
    printf("\n");
    for (size_t i = 0; i < N_KTYPES; i++) {
        printf("  %-8s", qtype_name(kernel_types[i]));
        for (size_t k = 0; k < N_KTOKENS; k++)
            printf(" %6.1f (%3.0f%%)", g[i][k], 100 * g[i][k] / read);
        printf("\n");
    }
    return 0;
}

static const uint32_t expert_windows[] = {8, 16, 32, 64};
#define EXPERT_POOL 128 /* experts a window is routed over: the qwen3-30b-a3b class */

/* experts_table prints the expert step of decode windows against the read bandwidth. */
static int experts_table(const struct bench_opts *o, uint32_t threads, bool json)
{
    struct bench_experts x[4];
    double read = 0;
    int rv = bench_read_gbs(threads, 256u << 20, &read);
    for (size_t i = 0; !rv && i < 4; i++)
        rv = bench_experts(o, expert_windows[i], EXPERT_POOL, &x[i]);
    if (rv) return rv;
    double load[1] = {0};
    getloadavg(load, 1);
    if (json) {
        printf("{\"experts\": {\"threads\": %u, \"isa\": \"%s\", \"read_gbs\": %.2f, \"load\": %.2f, "
               "\"windows\": [",
               threads, cpu_isa_name(cpu_isa()), read, load[0]);
        for (size_t i = 0; i < 4; i++)
            printf("%s{\"window\": %u, \"gbs\": %.2f, \"s\": %.5f, \"experts_run\": %.1f}",
                   i ? ", " : "", x[i].window, x[i].gbs, x[i].s, x[i].hit);
        printf("]}}\n");
        return 0;
    }
    printf("\nexpert step of a decode window: each token to %u of %u experts (copies of this file's),"
           "\n%u layers, %u threads, %s kernels, load average %.2f\n\n"
           "  %-8s %12s %14s %10s %10s\n",
           x[0].window ? (uint32_t)(x[0].tok_per_exp * x[0].hit / x[0].window + 0.5) : 0,
           EXPERT_POOL, x[0].layers, threads, cpu_isa_name(cpu_isa()), load[0], "window",
           "experts run", "tokens/expert", "time", "GB/s");
    for (size_t i = 0; i < 4; i++)
        printf("  %-8u %12.1f %14.2f %8.2f ms %10.1f  (%.0f%% of the %.1f GB/s read)\n",
               x[i].window, x[i].hit, x[i].tok_per_exp, 1e3 * x[i].s, x[i].gbs,
               100 * x[i].gbs / read, read);
    return 0;
}

static double load_now(void)
{
    double l[1] = {0};
    getloadavg(l, 1);
    return l[0];
}

/* note_load widens [load[0], load[1]] to the 1-minute load average now. */
static void note_load(double load[2])
{
    const double l = load_now();
    if (l < load[0]) load[0] = l;
    if (l > load[1]) load[1] = l;
}

/* keep_best: the faster prefill and the faster decode of *best and *r (each with its breakdown),
 * and the higher read bandwidth: the roofline is the best this machine showed. */
static void keep_best(struct bench_result *best, const struct bench_result *r)
{
    if (r->prefill_tok_s > best->prefill_tok_s) {
        best->prefill_s = r->prefill_s;
        best->prefill_tok_s = r->prefill_tok_s;
        best->prefill = r->prefill;
    }
    if (r->decode_tok_s > best->decode_tok_s) {
        best->decode_s = r->decode_s;
        best->decode_tok_s = r->decode_tok_s;
        best->decode = r->decode;
        best->decode_gbs = r->decode_gbs;
    }
    if (r->read_gbs > best->read_gbs) best->read_gbs = r->read_gbs;
}

/* sweep_table prints decode at 1, 2 and all (cpus) threads against the read bandwidth of the
 * same threads, each row with the load average it ran under. */
static int sweep_table(const struct bench_opts *o, uint32_t cpus, bool json)
{
    const uint32_t want[3] = {1, 2, cpus};
    uint32_t n = 0, th[3];
    for (int i = 0; i < 3; i++)
        if (want[i] <= cpus && (!n || want[i] > th[n - 1])) th[n++] = want[i];
    if (!json)
        printf("\ndecode by threads (%s kernels; %u prompt tokens, %u steps, best of %u)\n\n"
               "  %-8s %6s %10s %12s %9s %10s %8s\n",
               cpu_isa_name(cpu_isa()), o->prompt, o->gen, o->reps ? o->reps : 1, "threads", "load",
               "decode", "MiB/token", "GB/s", "read GB/s", "share");
    else
        printf("{\"sweep\": [");
    for (uint32_t i = 0; i < n; i++) {
        struct bench_opts so = *o;
        struct bench_result r;
        so.threads = th[i];
        const double l0 = load_now();
        int rv = bench_run(&so, &r);
        if (rv) return rv;
        const double l = (l0 + load_now()) / 2;
        const double mib = r.decode.tokens ? (double)r.decode.weight_bytes / r.decode.tokens / (1 << 20) : 0;
        if (json)
            printf("%s{\"threads\": %u, \"load\": %.2f, \"decode_tok_s\": %.2f, \"mib_per_token\": "
                   "%.2f, \"decode_gbs\": %.2f, \"read_gbs\": %.2f}",
                   i ? ", " : "", th[i], l, r.decode_tok_s, mib, r.decode_gbs, r.read_gbs);
        else
            printf("  %-8u %6.2f %6.1f tok/s %12.1f %9.1f %10.1f %7.0f%%\n", th[i], l, r.decode_tok_s,
                   mib, r.decode_gbs, r.read_gbs, 100 * r.decode_gbs / r.read_gbs);
    }
    if (json) printf("]}\n");
    return 0;
}

/* extra_tables: --kernels, --experts and --sweep after the model's figures; 0, or 1 when one
 * failed. */
static int extra_tables(const struct bench_opts *o, uint32_t threads, bool kernels, bool experts,
                        bool sweep, bool json)
{
    int rv;
    if (sweep) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        if ((rv = sweep_table(o, cpus > 0 ? (uint32_t)cpus : 1, json)) != 0)
            return strata_cmd_fail("bench", o->model, rv);
    }
    if (kernels && (rv = kernels_table(threads, json)) != 0)
        return strata_cmd_fail("bench", "kernels", rv);
    if (experts && (rv = experts_table(o, threads, json)) != 0)
        return strata_cmd_fail("bench", o->model, rv);
    return 0;
}

static int run(int argc, char **argv)
{
    const char *model = NULL, *nlc = NULL;
    bool json = false, llama = false, kernels = false, experts = false, sweep = false;
    int rv;
    uint32_t rounds = 1;
    struct bench_opts o = {.prompt = 512, .gen = 64, .reps = 3, .backend = backend_opts_default()};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint32_t *num = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--kernels")) {
            kernels = true;
        } else if (!strcmp(a, "--experts")) {
            experts = true;
        } else if (!strcmp(a, "--sweep")) {
            sweep = true;
        } else if (!strcmp(a, "--llama")) {
            llama = true;
        } else if (!strcmp(a, "--nlc") && i + 1 < argc) {
            nlc = argv[++i];
        } else if (!strcmp(a, "--decode-ids") && i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(v, "greedy") && strcmp(v, "random")) {
                fprintf(stderr, "strata bench: --decode-ids %s: give greedy or random\n", v);
                return 2;
            }
            o.decode_random = !strcmp(v, "random");
        } else if (!strcmp(a, "--arena") && i + 1 < argc) {
            o.arena = argv[++i];
        } else if (!strcmp(a, "--shm-dir") && i + 1 < argc) {
            o.shm_dir = argv[++i];
        } else if (!strcmp(a, "--prompt-text") && i + 1 < argc) {
            o.prompt_text = argv[++i];
        } else if (!strcmp(a, "--draft") && i + 1 < argc) {
            o.draft = argv[++i];
        } else if (!strcmp(a, "--spec-lookup") && i + 1 < argc) {
            num = &o.spec_lookup;
        } else if (!strcmp(a, "--draft-max") && i + 1 < argc) {
            num = &o.draft_max;
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            num = &o.threads;
        } else if (!strcmp(a, "--prompt") && i + 1 < argc) {
            num = &o.prompt;
        } else if (!strcmp(a, "--gen") && i + 1 < argc) {
            num = &o.gen;
        } else if (!strcmp(a, "--rounds") && i + 1 < argc) {
            num = &rounds;
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
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const uint32_t threads = o.threads ? o.threads : cpus > 0 ? (uint32_t)cpus : 1;
    if (!model && kernels) {
        if ((rv = kernels_table(threads, json)) != 0) return strata_cmd_fail("bench", "kernels", rv);
        return 0;
    }
    if (o.arena && model) {
        fprintf(stderr, "strata bench: give MODEL.gguf or --arena NAME, not both\n");
        return 2;
    }
    if (o.arena && llama) {
        fprintf(stderr, "strata bench: --llama reads a file: bench the file itself beside it\n");
        return 2;
    }
    if (!model && o.arena) model = o.arena;
    if (!model) {
        usage(stderr);
        return 2;
    }
    o.model = model;
    struct bench_result r = {0};
    struct peer p = {0};
    double load[2] = {1e9, 0}; /* lowest and highest load average seen over the rounds */
    for (uint32_t k = 0; k < rounds; k++) {
        struct bench_result rk;
        struct peer pk = {0};
        note_load(load);
        if ((rv = bench_run(&o, &rk)) != 0) return strata_cmd_fail("bench", model, rv);
        note_load(load);
        if (k == 0)
            r = rk;
        else
            keep_best(&r, &rk);
        if (rounds > 1)
            fprintf(stderr, "round %u: strata prefill %.1f tok/s, decode %.1f tok/s (%.1f GB/s), load %.2f\n",
                    k + 1, rk.prefill_tok_s, rk.decode_tok_s, rk.decode_gbs, load_now());
        if (!llama) continue;
        run_llama(model, nlc, rk.threads, rk.prompt, o.gen, o.reps, &pk);
        note_load(load);
        if (rounds > 1 && pk.ok)
            fprintf(stderr, "round %u: llama.cpp prefill %.1f tok/s, decode %.1f tok/s, load %.2f\n",
                    k + 1, pk.prefill_tok_s, pk.decode_tok_s, load_now());
        if (!pk.ok) {
            if (!p.ok) p = pk;
            continue;
        }
        if (!p.ok) {
            p = pk;
            continue;
        }
        p.prefill_tok_s = pk.prefill_tok_s > p.prefill_tok_s ? pk.prefill_tok_s : p.prefill_tok_s;
        p.decode_tok_s = pk.decode_tok_s > p.decode_tok_s ? pk.decode_tok_s : p.decode_tok_s;
    }
    if (!json) {
        table(model, &o, &r, &p, llama, load, rounds);
        return extra_tables(&o, threads, kernels, experts, sweep, false);
    }
    printf("{\"model\": \"%s\", \"threads\": %u, \"isa\": \"%s\", \"prompt\": %u, \"gen\": %u, "
           "\"reps\": %u, "
           "\"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"read_gbs\": %.2f, "
           "\"decode_gbs\": %.2f, \"load\": %.2f, \"load_max\": %.2f, \"rounds\": %u, ",
           model, r.threads, r.isa, r.prompt, o.gen, o.reps, r.prefill_tok_s, r.decode_tok_s,
           r.read_gbs, r.decode_gbs, load[0], load[1], rounds);
    breakdown_json(stdout, "prefill", &r.prefill);
    printf(", ");
    breakdown_json(stdout, "decode", &r.decode);
    printf(", \"spec\": \"%s\", \"draft_n\": %llu, \"draft_n_accepted\": %llu, "
           "\"decode_passes\": %llu",
           o.draft ? "draft" : o.spec_lookup ? "lookup" : "off",
           (unsigned long long)r.drafts_proposed, (unsigned long long)r.drafts_accepted,
           (unsigned long long)r.decode_passes);
    if (p.ok)
        printf(", \"llama\": {\"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"cpu_variant\": "
               "\"%s\"}",
               p.prefill_tok_s, p.decode_tok_s, p.haswell ? "haswell" : "best");
    printf("}\n");
    return extra_tables(&o, threads, kernels, experts, sweep, true);
}

const struct strata_cmd strata_cmd_bench = {
    "bench", "prefill and decode speed on the CPU, beside llama.cpp with --llama", run};
