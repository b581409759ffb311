/* strata bpe-train — `strata bpe-train --vocab N [--pre gpt-2] -o OUT.gguf FILE...`: learns a
 * byte-level BPE from text files and writes a vocabulary-only GGUF (tools/bpe_train.h). */
#include "common/base/err.h"
#include "launcher/cmd.h"
#include "tools/bpe_train.h"
#include "tools/perplexity.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: strata bpe-train --vocab N [--pre gpt-2] [--min-count N] -o OUT.gguf FILE...\n"
        "\n"
        "Learns a byte-level BPE (GPT-2's byte-to-unicode tokens, merges inside the gpt-2\n"
        "pre-tokenizer's pieces only) from the files and writes a vocabulary-only GGUF that\n"
        "strata tokenize, strata run and the frontend read: N tokens in all, the 256 byte\n"
        "tokens, the merges, then <|endoftext|> (bos), <|im_start|>, <|im_end|> (eos) as\n"
        "control tokens and a chatml chat template. The same files give the same bytes.\n"
        "  --vocab N       tokens in the output, specials included (%u to %u; 2048-8192 suit a\n"
        "                  small model)\n"
        "  --pre NAME      pre-tokenizer: gpt-2 (the default; gpt2 is accepted)\n"
        "  --min-count N   never merge a pair seen fewer than N times (default 2); when the\n"
        "                  text runs out of pairs, [PADn] unused tokens fill the vocabulary\n"
        "  -o FILE         the GGUF to write\n",
        BPE_TRAIN_MIN_VOCAB, BPE_TRAIN_MAX_VOCAB);
}

static int parse_u32(const char *s, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || errno || v > UINT32_MAX) return 1;
    *out = (uint32_t)v;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int run(int argc, char **argv)
{
    struct bpe_train_opts o = {0};
    const char *outp = NULL;
    const char **files = calloc((size_t)argc, sizeof *files);
    int n_files = 0, status = 1, rv;
    struct bpe_train *t = NULL;
    char *text = NULL;
    if (!files) return strata_cmd_fail("bpe-train", "starting", STRATA_ENOMEM);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            status = 0;
            goto out;
        } else if (!strcmp(a, "--vocab") && i + 1 < argc) {
            if (parse_u32(argv[++i], &o.n_vocab)) {
                fprintf(stderr, "strata bpe-train: --vocab %s: give a token count\n", argv[i]);
                status = 2;
                goto out;
            }
        } else if (!strcmp(a, "--min-count") && i + 1 < argc) {
            if (parse_u32(argv[++i], &o.min_count) || o.min_count == 0) {
                fprintf(stderr, "strata bpe-train: --min-count %s: give a count of 1 or more\n",
                        argv[i]);
                status = 2;
                goto out;
            }
        } else if (!strcmp(a, "--pre") && i + 1 < argc) {
            o.pre = argv[++i];
        } else if (!strcmp(a, "-o") && i + 1 < argc) {
            outp = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "strata bpe-train: unknown option '%s'\n", a);
            usage(stderr);
            status = 2;
            goto out;
        } else {
            files[n_files++] = a;
        }
    }
    if (!o.n_vocab || !outp || !n_files) {
        fprintf(stderr, "strata bpe-train: --vocab, -o and at least one text file are needed\n");
        usage(stderr);
        status = 2;
        goto out;
    }
    double t0 = now_s();
    if ((rv = bpe_train_init(&o, &t)) != 0) {
        status = strata_cmd_fail("bpe-train", "bad options", rv);
        goto out;
    }
    for (int i = 0; i < n_files; i++) {
        size_t len = 0;
        if ((rv = ppl_read_file(files[i], &text, &len)) != 0 ||
            (rv = bpe_train_add(t, text, len)) != 0) {
            status = strata_cmd_fail("bpe-train", files[i], rv);
            goto out;
        }
        free(text);
        text = NULL;
    }
    double t1 = now_s();
    if ((rv = bpe_train_learn(t)) != 0) {
        status = strata_cmd_fail("bpe-train", "learning the merges", rv);
        goto out;
    }
    double t2 = now_s();
    if ((rv = bpe_train_write(t, outp)) != 0) {
        status = strata_cmd_fail("bpe-train", outp, rv);
        goto out;
    }
    struct bpe_train_stats st;
    bpe_train_get_stats(t, &st);
    printf("%llu bytes, %llu pre-tokens, %u distinct (read and split in %.2f s)\n",
           (unsigned long long)st.n_bytes, (unsigned long long)st.n_pieces, st.n_words, t1 - t0);
    printf("%u merges in %.2f s; the last merged pair occurred %llu times\n", st.n_merges, t2 - t1,
           (unsigned long long)st.last_count);
    if (st.n_pad)
        printf("the text ran out of pairs seen %u+ times: %u [PADn] tokens fill the vocabulary\n",
               o.min_count ? o.min_count : 2, st.n_pad);
    printf("the text is %llu tokens: %.2f bytes a token\n", (unsigned long long)st.n_tokens,
           st.n_tokens ? (double)st.n_bytes / (double)st.n_tokens : 0.0);
    printf("wrote %s: %u tokens\n", outp, o.n_vocab);
    status = 0;
out:
    free(text);
    bpe_train_fini(t);
    free(files);
    return status;
}

const struct strata_cmd strata_cmd_bpe_train = {
    "bpe-train", "learn a byte-level BPE vocabulary from text files", run};
