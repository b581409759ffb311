/* strata tokenize — text to token ids and back with a GGUF file's tokenizer (a vocabulary-only GGUF
 * is enough), and a throughput bench against a plain byte copy. */
#include "launcher/cmd.h"
#include "common/base/err.h"
#include "common/tok/tok.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: strata tokenize -m FILE.gguf [--pre NAME] [--bos] [--special] < text\n"
        "       strata tokenize -m FILE.gguf --detokenize [--special] < ids\n"
        "       strata tokenize -m FILE.gguf --bench TEXTFILE\n"
        "\n"
        "Reads all of stdin as one text and prints its token ids on one line, space separated.\n"
        "  -m, --model FILE   GGUF file whose tokenizer.ggml.* metadata to use\n"
        "  --pre NAME         override tokenizer.ggml.pre (the BPE pre-tokenizer)\n"
        "  --bos              prepend the BOS token (not added by default)\n"
        "  --special          parse control-token texts such as <|im_start|> in the input;\n"
        "                     with --detokenize, print control tokens as their text\n"
        "  --detokenize       read ids (space or comma separated) and print their text\n"
        "  --bench FILE       tokenize FILE repeatedly; print MB/s and tokens/s beside a\n"
        "                     plain byte copy of the same bytes\n");
}

static int read_all(FILE *f, struct tok_buf *b)
{
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        char *p = realloc(b->p, b->n + n + 1);
        if (!p) return strata_errf(STRATA_ENOMEM, "out of memory reading %zu bytes", b->n + n);
        b->p = p;
        memcpy(b->p + b->n, chunk, n);
        b->n += n;
        b->p[b->n] = '\0';
    }
    if (ferror(f)) return strata_errno(errno);
    if (!b->p) {
        b->p = calloc(1, 1);
        if (!b->p) return strata_errf(STRATA_ENOMEM, "out of memory");
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_ids(const char *s, struct tok_ids *ids)
{
    while (*s) {
        if (strchr(" \t\r\n,[]", *s)) {
            s++;
            continue;
        }
        char *e;
        errno = 0;
        long v = strtol(s, &e, 10);
        if (e == s || errno || v < 0 || v > INT32_MAX)
            return strata_errf(STRATA_EINVAL, "'%.20s' is not a token id: give decimal ids", s);
        int32_t *p = realloc(ids->v, (ids->n + 1) * sizeof *p);
        if (!p) return strata_errf(STRATA_ENOMEM, "out of memory");
        ids->v = p;
        ids->v[ids->n++] = (int32_t)v;
        s = e;
    }
    return 0;
}

static int bench(const struct tok *t, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        return strata_errf(strata_errno(e), "cannot open %s: %s", path, strerror(e));
    }
    struct tok_buf text = {0};
    int rv = read_all(f, &text);
    fclose(f);
    if (rv) return rv;
    char *copy = malloc(text.n + 1);
    if (!copy) {
        free(text.p);
        return strata_errf(STRATA_ENOMEM, "out of memory");
    }
    /* repeat each for at least a second so the figure is not one cold pass */
    double t0 = now_s(), el;
    int reps = 0;
    do {
        memcpy(copy, text.p, text.n);
        /* a compiler barrier on the copy, so the loop is not optimized away */
        __asm__ volatile("" : : "r"(copy) : "memory");
        reps++;
    } while ((el = now_s() - t0) < 1.0);
    double copy_mbs = (double)text.n * reps / el / 1e6;
    struct tok_ids ids = {0};
    int treps = 0;
    t0 = now_s();
    do {
        ids.n = 0;
        if ((rv = tok_encode(t, text.p, text.n, 0, &ids)) != 0) goto done;
        treps++;
    } while ((el = now_s() - t0) < 1.0);
    double tok_mbs = (double)text.n * treps / el / 1e6;
    double tok_ps = (double)ids.n * treps / el;
    struct tok_buf out = {0};
    int dreps = 0;
    t0 = now_s();
    do {
        out.n = 0;
        if ((rv = tok_decode(t, ids.v, ids.n, 0, &out)) != 0) break;
        dreps++;
    } while ((el = now_s() - t0) < 1.0);
    free(out.p);
    if (rv) goto done;
    printf("bench %s: %zu bytes, %zu tokens (%.2f bytes/token), pre-tokenizer %s\n", path, text.n,
           ids.n, ids.n ? (double)text.n / (double)ids.n : 0.0,
           tok_pre_name(t)[0] ? tok_pre_name(t) : "(sentencepiece)");
    printf("  tokenize    %9.2f MB/s  %12.0f tokens/s  (%d passes)\n", tok_mbs, tok_ps, treps);
    printf("  detokenize  %9.2f MB/s  %12.0f tokens/s  (%d passes)\n",
           (double)text.n * dreps / el / 1e6, (double)ids.n * dreps / el, dreps);
    printf("  byte copy   %9.2f MB/s  (memcpy; tokenize runs at %.3f%% of it)\n", copy_mbs,
           100.0 * tok_mbs / copy_mbs);
done:
    free(ids.v);
    free(copy);
    free(text.p);
    return rv;
}

static int run(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'}, {"pre", required_argument, NULL, 'p'},
        {"bos", no_argument, NULL, 'b'},         {"special", no_argument, NULL, 's'},
        {"detokenize", no_argument, NULL, 'd'},  {"bench", required_argument, NULL, 'B'},
        {"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0},
    };
    const char *model = NULL, *pre = NULL, *bench_file = NULL;
    bool bos = false, special = false, detok = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'p':
            pre = optarg;
            break;
        case 'b':
            bos = true;
            break;
        case 's':
            special = true;
            break;
        case 'd':
            detok = true;
            break;
        case 'B':
            bench_file = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!model || optind != argc) {
        fprintf(stderr, "strata tokenize: %s\n",
                model ? "unexpected argument" : "-m FILE.gguf is required");
        usage(stderr);
        return 2;
    }
    struct tok *t = NULL;
    int rv = tok_load(model, pre, &t);
    if (rv) return strata_cmd_fail("tokenize", model, rv);
    if (bench_file) {
        rv = bench(t, bench_file);
        tok_fini(t);
        return rv ? strata_cmd_fail("tokenize", "bench", rv) : 0;
    }
    struct tok_buf in = {0}, text = {0};
    struct tok_ids ids = {0};
    const char *what = "reading stdin";
    if ((rv = read_all(stdin, &in)) != 0) goto done;
    if (detok) {
        what = "detokenize";
        if ((rv = parse_ids(in.p, &ids)) != 0) goto done;
        rv = tok_decode(t, ids.v, ids.n,
                        TOK_DECODE_STRIP_PREFIX | (special ? TOK_DECODE_SPECIAL : 0), &text);
        if (rv == 0) fwrite(text.p, 1, text.n, stdout);
        goto done;
    }
    what = "tokenize";
    if (bos && tok_bos(t) < 0) {
        rv = strata_errf(STRATA_EINVAL, "--bos: %s has no tokenizer.ggml.bos_token_id", model);
        goto done;
    }
    if (bos) {
        if (!(ids.v = malloc(sizeof *ids.v))) {
            rv = strata_errf(STRATA_ENOMEM, "out of memory");
            goto done;
        }
        ids = (struct tok_ids){ids.v, 1, 1};
        ids.v[0] = tok_bos(t);
    }
    if ((rv = tok_encode(t, in.p, in.n, special ? TOK_PARSE_SPECIAL : 0, &ids)) != 0) goto done;
    for (size_t i = 0; i < ids.n; i++)
        printf(i ? " %d" : "%d", ids.v[i]);
    printf("\n");
done:
    free(in.p);
    free(text.p);
    free(ids.v);
    tok_fini(t);
    if (rv) return strata_cmd_fail("tokenize", what, rv);
    return fflush(stdout) == 0 ? 0 : strata_cmd_fail("tokenize", "stdout", strata_errno(errno));
}

const struct strata_cmd strata_cmd_tokenize = {
    "tokenize", "text to token ids and back, and a tokenizer bench", run};
