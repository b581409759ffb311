/* strata bench-grammar — `strata bench-grammar [MODEL.gguf] [--schema FILE.json] [--requests N]
 * [--tokens N] [--vocab N] [--threads N]`: what a grammar costs per generated token (the mask
 * over the vocabulary and feeding the token: tools/grammar_bench.h), printed beside the model's
 * decode step from `strata bench`'s measurement. */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/grammar/grammar.h"
#include "gpu-worker/gvocab.h"
#include "launcher/cmd.h"
#include "tools/bench.h"
#include "tools/grammar_bench.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A tool-call-like object: strings, numbers, an enum, a nested object, an array. */
static const char EXAMPLE[] =
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": "
    "\"integer\"}, \"role\": {\"enum\": [\"admin\", \"user\", \"guest\"]}, \"tags\": {\"type\": "
    "\"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 4}, \"address\": {\"type\": "
    "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"zip\": {\"type\": "
    "\"string\", \"maxLength\": 10}}, \"required\": [\"city\"]}, \"score\": {\"type\": "
    "\"number\"}}, \"required\": [\"name\", \"age\", \"role\"]}";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: strata bench-grammar [MODEL.gguf] [--schema FILE.json] [--requests N]\n"
            "                            [--tokens N] [--vocab N] [--threads N]\n"
            "\n"
            "Times grammar-constrained sampling per token: the token mask of the grammar's state\n"
            "and feeding the chosen token, over --requests answers (default 20) of at most\n"
            "--tokens tokens (default 200), each with its own matcher on the grammar's shared\n"
            "tables, as the worker makes one per request. The vocabulary is MODEL's (a synthetic "
            "one of its size when most of its\n"
            "tokens have no text, as fixtures), or without MODEL a synthetic one of --vocab\n"
            "tokens (default 151936, Qwen3's). With MODEL its decode step is measured too\n"
            "(`strata bench`, 32 steps) and printed beside.\n"
            "  --schema FILE  a JSON schema (default: an object of strings, numbers, an enum, a\n"
            "                 nested object and an array)\n");
}

static int run(int argc, char **argv)
{
    const char *model = NULL, *schema_path = NULL;
    uint32_t requests = 20, tokens = 200, n_vocab = 151936, threads = 0;
    int rv;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--schema") && i + 1 < argc) {
            schema_path = argv[++i];
        } else if (!strcmp(a, "--requests") && i + 1 < argc) {
            if ((rv = strata_cmd_parse_u32(argv[++i], a, 1, &requests)) != 0) goto bad;
        } else if (!strcmp(a, "--tokens") && i + 1 < argc) {
            if ((rv = strata_cmd_parse_u32(argv[++i], a, 1, &tokens)) != 0) goto bad;
        } else if (!strcmp(a, "--vocab") && i + 1 < argc) {
            if ((rv = strata_cmd_parse_u32(argv[++i], a, 256, &n_vocab)) != 0) goto bad;
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            if ((rv = strata_cmd_parse_u32(argv[++i], a, 1, &threads)) != 0) goto bad;
        } else if (a[0] != '-' && !model) {
            model = a;
        } else {
            fprintf(stderr, "strata bench-grammar: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    json_error_t je;
    json_t *schema =
        schema_path ? json_load_file(schema_path, 0, &je) : json_loads(EXAMPLE, 0, &je);
    if (!schema) {
        fprintf(stderr, "strata bench-grammar: %s: %s (line %d)\n",
                schema_path ? schema_path : "the example", je.text, je.line);
        return 1;
    }
    char *gbnf = NULL;
    rv = grammar_from_schema(schema, &gbnf);
    json_decref(schema);
    if (rv) return strata_cmd_fail("bench-grammar", "the schema", rv);
    struct grammar_vocab *v = NULL;
    struct bench_result br = {0};
    const char *vocab_kind = "synthetic, shaped as byte-level BPE";
    if (model) {
        struct bench_opts o = {.model = model,
                               .threads = threads,
                               .prompt = 32,
                               .gen = 32,
                               .reps = 1,
                               .backend = backend_opts_default()};
        struct gguf_file *f = NULL;
        uint32_t n_text = 0;
        if ((rv = bench_run(&o, &br)) != 0 || (rv = gguf_open(model, &f)) != 0) {
            free(gbnf);
            return strata_cmd_fail("bench-grammar", model, rv);
        }
        const struct gguf_kv *kv = gguf_find(f, "tokenizer.ggml.tokens");
        n_vocab = kv ? (uint32_t)kv->val.arr.n : 0;
        rv = gvocab_from_gguf(f, n_vocab, &v, &n_text);
        gguf_close(f);
        if (rv) {
            free(gbnf);
            return strata_cmd_fail("bench-grammar", "the model's vocabulary", rv);
        }
        if (n_text >= n_vocab / 2) {
            vocab_kind = "the model's";
        } else { /* a fixture: a few hundred real tokens, padded */
            grammar_vocab_fini(v);
            v = NULL;
        }
    }
    if (!v && (rv = gbench_synthetic_vocab(n_vocab, 1, &v)) != 0) {
        free(gbnf);
        return strata_cmd_fail("bench-grammar", "the synthetic vocabulary", rv);
    }
    struct gbench_result r;
    rv = gbench_run(v, gbnf, requests, tokens, 7, &r);
    free(gbnf);
    grammar_vocab_fini(v);
    if (rv) return strata_cmd_fail("bench-grammar", "the run", rv);
    printf("grammar: JSON schema %s\n", schema_path ? schema_path : "(the built-in example)");
    printf("vocabulary: %u tokens (%s)\n", n_vocab, vocab_kind);
    printf("mask + feed per token (CPU time): mean %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us\n"
           "  over %u tokens of %u answers, a matcher each on shared tables: %llu trie walks, "
           "%llu masks from the cache\n",
           r.mean_us, r.p50_us, r.p99_us, r.max_us, r.tokens, r.requests,
           (unsigned long long)r.masks_built, (unsigned long long)r.mask_hits);
    if (model) {
        const double step_us = 1e6 / br.decode_tok_s;
        printf("decode step of %s: %.1f us (%.1f tok/s, %u threads, %s): the grammar adds %.2f%%\n",
               model, step_us, br.decode_tok_s, br.threads, br.isa, 100.0 * r.mean_us / step_us);
    }
    return 0;
bad:
    fprintf(stderr, "strata bench-grammar: %s\n", strata_errdetail());
    return 2;
}

const struct strata_cmd strata_cmd_bench_grammar = {
    "bench-grammar", "grammar mask cost per token beside a model's decode step", run};
