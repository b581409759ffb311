/* strata quantize — `strata quantize IN.gguf OUT.gguf TYPE [--pure] [--threads N]`, as
 * llama-quantize: options -> quantize_opts -> quantize_file (tools/quantize.h). */
#include "common/base/err.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "launcher/cmd.h"
#include "tools/quantize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: strata quantize IN.gguf OUT.gguf TYPE [--pure] [--threads N]\n"
        "                       [--tensor-type PATTERN=TYPE]... [--override-kv "
        "KEY=TYPE:VALUE]...\n\n"
        "Rewrites IN with every weight matrix (2-D and 3-D tensors named *.weight) in TYPE, byte "
        "for\n"
        "byte as llama-quantize without an importance matrix. TYPE: f32 f16 bf16 q8_0 q4_0 q4_1 "
        "q5_0\n"
        "q5_1 q2_K q3_K q4_K q5_K q6_K iq4_nl iq4_xs. Sources of any of these types are "
        "dequantized\n"
        "first. Other tensors and all metadata are copied; general.file_type and\n"
        "general.quantization_version are set. Prints what it did to each tensor.\n"
        "  --pure       no exceptions: without it, 1-D tensors, norms and routers (ffn_gate_inp)\n"
        "               become f32; with it 1-D tensors and routers are kept as they are (as\n"
        "               llama-quantize, which never quantizes a router)\n"
        "  --threads N  threads over rows (default: all CPUs)\n"
        "  --override-kv KEY=TYPE:VALUE\n"
        "               set metadata KEY (TYPE int, float, bool or str), replacing or adding it;\n"
        "               with TYPE copy every tensor is kept byte for byte (metadata edits only)\n"
        "  --tensor-type PATTERN=TYPE\n"
        "               weight matrices whose name contains PATTERN get TYPE (e.g. _exps=q4_K)\n"
        "A row length that TYPE's block does not divide falls back as llama.cpp does: q2_K, q3_K,\n"
        "iq4_xs -> iq4_nl, q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, and f16 when 32 does not "
        "divide it.\n");
}

static int run(int argc, char **argv)
{
    const char *pos[3];
    int npos = 0;
    struct quantize_opts o = {.report = stdout};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--pure") == 0) {
            o.pure = true;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 256) {
                fprintf(stderr, "strata quantize: --threads %s: give a number from 1 to 256\n",
                        argv[i]);
                return 2;
            }
            o.threads = (int)n;
        } else if (strcmp(argv[i], "--override-kv") == 0 && i + 1 < argc) {
            if (o.n_kv == QUANTIZE_MAX_KV) {
                fprintf(stderr, "strata quantize: at most %d --override-kv\n", QUANTIZE_MAX_KV);
                return 2;
            }
            if (quantize_kv_parse(argv[++i], &o.kv[o.n_kv]) != 0) {
                fprintf(stderr, "strata quantize: --override-kv %s\n", strata_errdetail());
                return 2;
            }
            o.n_kv++;
        } else if (strcmp(argv[i], "--tensor-type") == 0 && i + 1 < argc) {
            char *eq = strchr(argv[++i], '=');
            int t = eq ? qtype_parse(eq + 1) : -1;
            if (!eq || eq == argv[i] || t < 0 || !quant_can_quantize((uint32_t)t) ||
                o.n_overrides == QUANTIZE_MAX_OVERRIDES) {
                fprintf(stderr, "strata quantize: --tensor-type %s: give PATTERN=TYPE with a type "
                                "strata quantizes to (at most %d)\n", argv[i], QUANTIZE_MAX_OVERRIDES);
                return 2;
            }
            *eq = '\0';
            o.overrides[o.n_overrides++] = (struct quantize_override){argv[i], (uint32_t)t};
        } else if (argv[i][0] == '-' || npos == 3) {
            fprintf(stderr, "strata quantize: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            pos[npos++] = argv[i];
        }
    }
    if (npos != 3) {
        usage(stderr);
        return 2;
    }
    int type = qtype_parse(pos[2]);
    o.copy = strcasecmp(pos[2], "copy") == 0;
    o.mxfp4_moe = strcasecmp(pos[2], "mxfp4_moe") == 0;
    if (o.mxfp4_moe) type = QT_Q8_0;
    if (!o.copy && (type < 0 || !quant_can_quantize((uint32_t)type))) {
        fprintf(stderr,
                "strata quantize: '%s' is not a type strata quantizes to; pick f32, f16, bf16, "
                "q8_0, q4_0, "
                "q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs, mxfp4, "
                "mxfp4_moe (or copy)\n",
                pos[2]);
        return 2;
    }
    o.type = o.copy ? 0 : (uint32_t)type;
    int rv = quantize_file(pos[0], pos[1], &o, NULL);
    if (rv) return strata_cmd_fail("quantize", "nothing written", rv);
    return 0;
}

const struct strata_cmd strata_cmd_quantize = {
    "quantize", "quantize a GGUF file's weights (as llama-quantize)", run};
