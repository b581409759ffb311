/* strata perplexity — `strata perplexity MODEL.gguf FILE [--ctx N] [--stride N] [--ids]`: the
 * model's perplexity on a text (or raw id file) with the reference forward pass, under the window
 * rule tools/train_demo.py uses (tools/perplexity.h). */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/arena/model.h"
#include "common/tok/tok.h"
#include "launcher/cmd.h"
#include "tools/perplexity.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata perplexity MODEL.gguf FILE [--ctx N] [--stride N] [--ids]\n"
            "                         [--vocab TOK.gguf] [--threads N] [--json]\n"
            "\n"
            "Scores FILE with the model on the CPU (reference forward pass, float logits) and\n"
            "prints exp(mean negative log-likelihood). Windows of --ctx tokens begin every\n"
            "--stride tokens, each from an empty context; a window scores the tokens after its\n"
            "first that no earlier window scored (tools/train_demo.py uses the same rule).\n"
            "  --ctx N         window length (default 256)\n"
            "  --stride N      window step, 1..ctx (default: ctx, windows that do not overlap)\n"
            "  --ids           FILE holds raw little-endian uint32 token ids, as train_demo.py's\n"
            "                  heldout_ids.bin; otherwise FILE is text, tokenized without BOS\n"
            "  --vocab FILE    take the tokenizer from this GGUF (e.g. bpe-train's output) rather\n"
            "                  than from MODEL\n"
            "  --threads N     compute threads (default: the online CPUs)\n"
            "  --json          print one JSON line: perplexity, mean_nll, scored, windows, ctx,\n"
            "                  stride, seconds\n");
}


static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void progress(void *arg, size_t w, size_t n, double nll, uint64_t scored)
{
    if (w % 8 && w != n) return;
    fprintf(stderr, "\rwindow %zu/%zu: perplexity so far %.3f   %s", w, n,
            exp(nll / (double)scored), w == n ? "\n" : "");
}

static int run(int argc, char **argv)
{
    const char *pos[2], *vocab = NULL;
    int npos = 0;
    bool raw_ids = false, json = false;
    uint32_t stride = 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    struct ppl_opts o = {.ctx = 256, .n_threads = cpus > 0 ? (uint32_t)cpus : 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint32_t *num = NULL, min = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--ids")) {
            raw_ids = true;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--vocab") && i + 1 < argc) {
            vocab = argv[++i];
        } else if (!strcmp(a, "--ctx") && i + 1 < argc) {
            num = &o.ctx;
            min = 2;
        } else if (!strcmp(a, "--stride") && i + 1 < argc) {
            num = &stride;
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            num = &o.n_threads;
        } else if (a[0] == '-' || npos == 2) {
            fprintf(stderr, "strata perplexity: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        } else {
            pos[npos++] = a;
        }
        if (num && strata_cmd_parse_u32(argv[++i], a, min, num)) {
            fprintf(stderr, "strata perplexity: %s %s: give a whole number >= %u\n", a, argv[i],
                    min);
            return 2;
        }
    }
    if (npos != 2) {
        usage(stderr);
        return 2;
    }
    o.stride = stride ? stride : o.ctx;
    if (o.stride > o.ctx) {
        fprintf(stderr,
                "strata perplexity: --stride %u is above --ctx %u: tokens would be skipped\n",
                o.stride, o.ctx);
        return 2;
    }
    if (isatty(STDERR_FILENO) && !json) o.progress = progress;
    struct gguf_file *gf = NULL;
    struct model *m = NULL;
    struct tok *tk = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int status = 1, rv;
    const char *what = pos[0];
    if ((rv = gguf_open(pos[0], &gf)) != 0 || (rv = model_load(gf, &m)) != 0) goto fail;
    if (!raw_ids) {
        what = vocab ? vocab : pos[0];
        rv = vocab ? tok_load(vocab, NULL, &tk) : tok_from_gguf(gf, NULL, &tk);
        if (rv) goto fail;
    }
    what = pos[1];
    if ((rv = ppl_read_tokens(pos[1], raw_ids, tk, &ids, &n)) != 0) goto fail;
    double t0 = now_s();
    struct ppl_result r;
    what = "scoring";
    if ((rv = ppl_eval(m, ids, n, &o, &r)) != 0) goto fail;
    double dt = now_s() - t0;
    if (json)
        printf("{\"perplexity\": %.6f, \"mean_nll\": %.6f, \"scored\": %llu, \"windows\": %zu, "
               "\"tokens\": %zu, \"ctx\": %u, \"stride\": %u, \"seconds\": %.3f}\n",
               r.perplexity, r.nll / (double)r.scored, (unsigned long long)r.scored, r.n_windows, n,
               o.ctx, o.stride, dt);
    else
        printf("perplexity %.4f (mean NLL %.5f nats) over %llu scored of %zu tokens: %zu windows "
               "of %u, stride %u; %.1f s, %.0f tokens/s\n",
               r.perplexity, r.nll / (double)r.scored, (unsigned long long)r.scored, n, r.n_windows,
               o.ctx, o.stride, dt, (double)n / dt);
    status = 0;
fail:
    if (rv) status = strata_cmd_fail("perplexity", what, rv);
    free(ids);
    tok_fini(tk);
    model_fini(m);
    gguf_close(gf);
    return status;
}

const struct strata_cmd strata_cmd_perplexity = {
    "perplexity", "score a text with a model: perplexity over fixed windows", run};
