/* strata fixture — write a GGUF MoE model with random weights (tools/fixture.h). */
#include "common/base/err.h"
#include "launcher/cmd.h"
#include "tools/fixture.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: strata fixture --arch ARCH [--shape NAME] [--type T | --mix q4_k_m] [--seed N]\n"
        "                      [--router uniform|zipf:S] [--vocab FILE.gguf] [--old-layout]\n"
        "                      [--tied] [--no-bias] [--fast | --float] [--threads N] -o FILE.gguf\n"
        "\n"
        "Writes a MoE model with random weights and the tensor names, shapes and metadata of\n"
        "real llama.cpp files of the architecture.\n"
        "  --arch ARCH        qwen3moe (default), llama (Mixtral), olmoe, qwen2moe, gpt-oss,\n"
        "                     glm4moe (GLM-4.5)\n"
        "  --shape NAME       tiny (default, ~2-17 MB), qwen3-mini (~0.7 GB at q4_k_m),\n"
        "                     qwen3-30b-a3b (~17 GiB at q4_k_m); gpt-oss: gpt-oss-mini\n"
        "                     (~0.9 GB at mxfp4_moe), gpt-oss-20b, gpt-oss-120b\n"
        "                     glm4moe: glm4-mini (~0.9 GB at q4_k_m), glm4.5-air, glm4.5\n"
        "  --type T           every weight matrix in T (f32, f16, bf16, q8_0, q4_k, mxfp4, ...),\n"
        "                     or mxfp4_moe: experts MXFP4, other matrices q8_0 (llama.cpp's)\n"
        "  --mix q4_k_m       llama.cpp's Q4_K_M mix (default)\n"
        "  --seed N           RNG seed (default 0); the bytes depend only on the options\n"
        "  --router R         uniform (default) or zipf:S: expert popularity ~ rank^-S per layer\n"
        "  --vocab FILE       copy tokenizer.* from FILE (default: a built-in byte-level BPE)\n"
        "  --old-layout       llama: one 2-D tensor per expert (blk.N.ffn_gate.E.weight)\n"
        "  --tied             no output.weight (llama, qwen3moe)\n"
        "  --no-bias          no attn_q/k/v.bias (qwen2moe: llama.cpp takes them as optional)\n"
        "  --fast / --float   random quantized blocks / quantized floats (default: blocks for\n"
        "                     qwen3-mini and larger, floats for tiny)\n"
        "  --threads N        generator threads (default: one per CPU, at most 8)\n"
        "  -o FILE            output path (written as FILE.tmp, renamed when complete)\n");
}

static int run(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"arch", required_argument, NULL, 'a'},    {"shape", required_argument, NULL, 's'},
        {"type", required_argument, NULL, 't'},    {"mix", required_argument, NULL, 'm'},
        {"seed", required_argument, NULL, 'S'},    {"router", required_argument, NULL, 'r'},
        {"vocab", required_argument, NULL, 'v'},   {"old-layout", no_argument, NULL, 'L'},
        {"tied", no_argument, NULL, 'T'},          {"no-bias", no_argument, NULL, 'B'},
        {"fast", no_argument, NULL, 'F'},          {"float", no_argument, NULL, 'f'},
        {"threads", required_argument, NULL, 'j'}, {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    struct fixture_opts o = {0};
    const char *out = NULL;
    char *end;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'a':
            o.arch = optarg;
            break;
        case 's':
            o.shape = optarg;
            break;
        case 't':
            o.type = optarg;
            break;
        case 'm':
            if (strcmp(optarg, "q4_k_m") != 0)
                return strata_cmd_fail("fixture", optarg,
                                       strata_errf(STRATA_EINVAL, "--mix knows q4_k_m only"));
            o.type = optarg;
            break;
        case 'S':
            o.seed = strtoull(optarg, &end, 0);
            if (*end)
                return strata_cmd_fail("fixture", optarg,
                                       strata_errf(STRATA_EINVAL, "--seed takes an integer"));
            break;
        case 'r':
            if (strcmp(optarg, "uniform") == 0) {
                o.zipf = 0;
            } else if (strncmp(optarg, "zipf:", 5) == 0) {
                o.zipf = strtod(optarg + 5, &end);
                if (*end || o.zipf <= 0)
                    return strata_cmd_fail(
                        "fixture", optarg,
                        strata_errf(STRATA_EINVAL, "zipf:S takes S > 0, e.g. zipf:1.1"));
            } else {
                return strata_cmd_fail("fixture", optarg,
                                       strata_errf(STRATA_EINVAL, "--router is uniform or zipf:S"));
            }
            break;
        case 'v':
            o.vocab = optarg;
            break;
        case 'L':
            o.old_layout = true;
            break;
        case 'T':
            o.tied = true;
            break;
        case 'B':
            o.no_bias = true;
            break;
        case 'F':
            o.mode = FIXTURE_BLOCKS;
            break;
        case 'f':
            o.mode = FIXTURE_FLOAT;
            break;
        case 'j':
            o.threads = (int)strtol(optarg, &end, 10);
            if (*end || o.threads < 1)
                return strata_cmd_fail("fixture", optarg,
                                       strata_errf(STRATA_EINVAL, "--threads takes a count >= 1"));
            break;
        case 'o':
            out = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!out || optind != argc) {
        usage(stderr);
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rv = fixture_write(&o, out);
    if (rv) return strata_cmd_fail("fixture", out, rv);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    struct stat st;
    double mib = stat(out, &st) == 0 ? (double)st.st_size / (1024.0 * 1024.0) : 0.0;
    printf("wrote %s: %.1f MiB in %.2f s (%.0f MiB/s)\n", out, mib, s, s > 0 ? mib / s : 0.0);
    return 0;
}

const struct strata_cmd strata_cmd_fixture = {
    "fixture", "write a MoE GGUF with random weights and real shapes (tests, benchmarks)", run};
