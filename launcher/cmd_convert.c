/* strata convert — a Hugging Face MoE checkpoint to GGUF: `strata convert DIR OUT.gguf`. */
#include "common/base/err.h"
#include "common/quant/qtype.h"
#include "launcher/cmd.h"
#include "tools/convert.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata convert DIR OUT.gguf [--type f32|f16|q8_0] [--vocab TOKENIZER.gguf]\n\n"
            "Converts a Hugging Face checkpoint (DIR/config.json and DIR/*.safetensors) of\n"
            "Qwen3MoeForCausalLM, MixtralForCausalLM, OlmoeForCausalLM or Qwen2MoeForCausalLM to\n"
            "a GGUF with llama.cpp's names and keys. Weight matrices get --type (default f32);\n"
            "norms, biases and routers stay f32. --vocab copies the tokenizer.* keys of a GGUF\n"
            "(e.g. from strata bpe-train); without it the model runs only with --ids.\n");
}

static int run(int argc, char **argv)
{
    struct convert_opts o = {.type = QT_F32};
    const char *pos[2];
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--type") == 0 && i + 1 < argc) {
            int t = qtype_parse(argv[++i]);
            if (t != QT_F32 && t != QT_F16 && t != QT_Q8_0) {
                fprintf(stderr, "strata convert: --type %s: use f32, f16 or q8_0\n", argv[i]);
                return 2;
            }
            o.type = (uint32_t)t;
        } else if (strcmp(argv[i], "--vocab") == 0 && i + 1 < argc) {
            o.vocab = argv[++i];
        } else if (argv[i][0] != '-' && n_pos < 2) {
            pos[n_pos++] = argv[i];
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (n_pos != 2) {
        usage(stderr);
        return 2;
    }
    o.dir = pos[0];
    o.out = pos[1];
    int rv = convert_hf(&o);
    if (rv) return strata_cmd_fail("convert", o.dir, rv);
    return 0;
}

const struct strata_cmd strata_cmd_convert = {"convert", "convert a Hugging Face MoE checkpoint "
                                              "to GGUF", run};
