#include "tools/fixture_vocab.h"

#include "common/base/err.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Merges learned from the sample. 200 keeps the built-in vocabulary (459 tokens) inside the tiny
 * shape's 512 rows while covering the frequent English words, so a tokenizer test sees real
 * multi-byte merges. */
#define N_MERGES 200
#define N_BASE   256
#define MAX_TOK  (N_BASE + N_MERGES)

/* The training text: plain English prose written for this purpose (no third-party text), so the
 * merges are frequent English pieces (" the", "ing", " and") and stay the same forever. */
static const char sample[] =
    "The lighthouse stood at the end of the long stone pier, and every evening the keeper climbed "
    "the hundred and twelve steps to light the lamp. He had done this for thirty years, in summer "
    "and in winter, when the sea was calm and when the waves broke over the rail. The ships that "
    "passed in the night never saw him, but they saw the light, and that was the point of it.\n"
    "In the morning he wrote the weather in a book: the wind, the height of the waves, the number "
    "of ships he had counted, and anything else that seemed worth remembering. Some of the pages "
    "were only a line long. Others ran on for several pages, when a storm had kept him awake and "
    "there was nothing to do but listen to the water and the glass rattling in the frames.\n"
    "His daughter lived in the town across the bay. She was learning to build computers, and on "
    "Sundays she rowed out with bread, oranges and questions. She asked him how the lamp turned, "
    "how the clockwork was wound, and why the lens was made of so many rings of glass. He showed "
    "her the gears and the weights and the little brass governor that kept the beam turning at "
    "the same speed, whatever the weather was doing outside.\n"
    "\"It is a machine for being predictable,\" she said one afternoon. \"Everything about it is "
    "designed so that a sailor who has never met you can count the flashes and know exactly where "
    "he is.\" The keeper thought about that for a long time. He had never thought of himself as "
    "part of a machine, but he supposed she was right: the lamp, the lens, the gears, the book "
    "and the man were all working together to say the same thing, again and again, every ten "
    "seconds, to anyone who was looking.\n"
    "Years later, when the light was automated and the keeper had moved into the town, she wrote "
    "programs that did much the same thing. They answered questions from strangers, quickly and "
    "in the same way every time, and the people who used them rarely thought about how they "
    "worked. She kept his weather book on her desk. When a program behaved strangely, she would "
    "open it at a random page, read about the wind and the waves on a night forty years before, "
    "and then go back to her work, looking for the one gear that was turning at the wrong speed.\n"
    "There are 7 days in a week, 12 months in a year, and 365 or 366 days in a year; 2 + 2 = 4.\n";

static const char *const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
#define N_SPECIAL   3
#define TOK_NORMAL  1 /* llama.cpp's LLAMA_TOKEN_TYPE_NORMAL */
#define TOK_CONTROL 3
#define TOK_UNUSED  5

/* The chatml template Qwen2.5 and Qwen3 instruct models speak, without tools. */
static const char chat_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' "
    "}}{% endif %}";

struct word {
    uint16_t *sym; /* token ids */
    uint32_t n;
    uint32_t count;
    const char *text; /* into sample */
    uint32_t len;
};

struct bpe {
    uint32_t n_tok;
    uint8_t *bytes[MAX_TOK]; /* raw bytes of each token */
    uint32_t len[MAX_TOK];
    uint16_t mleft[N_MERGES], mright[N_MERGES];
    uint32_t n_merges;
    struct word *words;
    uint32_t n_words;
};

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100 upwards in
 * byte order. order[i] is the byte of token i (printable ranges first, as the vocabulary lists
 * them); cp[b] is the code point byte b is written as. */
static void byte_tables(uint8_t order[256], uint32_t cp[256])
{
    bool printable[256] = {false};
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; b++)
        printable[b] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    for (uint32_t b = 0; b < 256; b++) {
        if (printable[b]) {
            order[n++] = (uint8_t)b;
            cp[b] = b;
        }
    }
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; b++) {
        if (!printable[b]) {
            order[n++] = (uint8_t)b;
            cp[b] = 256 + extra++;
        }
    }
}

static int char_class(char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return 0;
    if (c >= '0' && c <= '9') return 1;
    if (c == ' ' || c == '\n') return 2;
    return 3;
}

/* split_words: GPT-2-like pre-tokenization (an optional leading space, then a run of letters,
 * digits, whitespace or punctuation), counting each distinct word. */
static int split_words(struct bpe *b, const uint16_t tok_of_byte[256])
{
    size_t n = sizeof sample - 1;
    b->words = calloc(n, sizeof *b->words);
    if (!b->words) return strata_errf(STRATA_ENOMEM, "fixture vocab: %zu words", n);
    for (size_t p = 0; p < n;) {
        size_t start = p;
        if (sample[p] == ' ' && p + 1 < n && char_class(sample[p + 1]) != 2) p++;
        int cls = char_class(sample[p]);
        while (p < n && char_class(sample[p]) == cls)
            p++;
        uint32_t len = (uint32_t)(p - start);
        struct word *w = NULL;
        for (uint32_t i = 0; i < b->n_words && !w; i++)
            if (b->words[i].len == len && memcmp(b->words[i].text, sample + start, len) == 0)
                w = &b->words[i];
        if (w) {
            w->count++;
            continue;
        }
        w = &b->words[b->n_words++];
        w->text = sample + start;
        w->len = len;
        w->count = 1;
        w->n = len;
        w->sym = malloc(len * sizeof *w->sym);
        if (!w->sym) return strata_errf(STRATA_ENOMEM, "fixture vocab: word of %u bytes", len);
        for (uint32_t i = 0; i < len; i++)
            w->sym[i] = tok_of_byte[(uint8_t)sample[start + i]];
    }
    return 0;
}

/* learn: the classic BPE loop. Ties go to the smallest (left, right) pair so the result never
 * depends on iteration order. */
static int learn(struct bpe *b)
{
    uint32_t *counts = malloc((size_t)MAX_TOK * MAX_TOK * sizeof *counts);
    if (!counts) return strata_errf(STRATA_ENOMEM, "fixture vocab: pair counts");
    while (b->n_merges < N_MERGES) {
        memset(counts, 0, (size_t)MAX_TOK * MAX_TOK * sizeof *counts);
        for (uint32_t i = 0; i < b->n_words; i++) {
            const struct word *w = &b->words[i];
            for (uint32_t j = 0; j + 1 < w->n; j++)
                counts[(size_t)w->sym[j] * MAX_TOK + w->sym[j + 1]] += w->count;
        }
        size_t best = 0;
        for (size_t k = 1; k < (size_t)MAX_TOK * MAX_TOK; k++)
            if (counts[k] > counts[best]) best = k;
        if (counts[best] == 0) break; /* every word is one token */
        uint16_t l = (uint16_t)(best / MAX_TOK), r = (uint16_t)(best % MAX_TOK);
        uint16_t t = (uint16_t)b->n_tok;
        b->len[t] = b->len[l] + b->len[r];
        b->bytes[t] = malloc(b->len[t]);
        if (!b->bytes[t]) {
            free(counts);
            return strata_errf(STRATA_ENOMEM, "fixture vocab: token of %u bytes", b->len[t]);
        }
        memcpy(b->bytes[t], b->bytes[l], b->len[l]);
        memcpy(b->bytes[t] + b->len[l], b->bytes[r], b->len[r]);
        b->n_tok++;
        b->mleft[b->n_merges] = l;
        b->mright[b->n_merges] = r;
        b->n_merges++;
        for (uint32_t i = 0; i < b->n_words; i++) {
            struct word *w = &b->words[i];
            uint32_t o = 0;
            for (uint32_t j = 0; j < w->n; j++) {
                if (j + 1 < w->n && w->sym[j] == l && w->sym[j + 1] == r) {
                    w->sym[o++] = t;
                    j++;
                } else {
                    w->sym[o++] = w->sym[j];
                }
            }
            w->n = o;
        }
    }
    free(counts);
    return 0;
}

/* utf8: the byte-level text of raw bytes, as GPT-2 vocabularies store tokens. Returns a malloc'd
 * NUL-terminated string. */
static char *utf8(const uint8_t *raw, uint32_t len, const uint32_t cp[256])
{
    char *s = malloc((size_t)len * 2 + 1), *p = s;
    if (!s) return NULL;
    for (uint32_t i = 0; i < len; i++) {
        uint32_t c = cp[raw[i]];
        if (c < 0x80) {
            *p++ = (char)c;
        } else {
            *p++ = (char)(0xC0 | (c >> 6));
            *p++ = (char)(0x80 | (c & 0x3F));
        }
    }
    *p = '\0';
    return s;
}

int fixture_vocab_write(struct gguf_writer *w, uint32_t n_vocab)
{
    struct bpe b = {0};
    char **toks = NULL, **merges = NULL;
    int32_t *types = NULL;
    uint8_t order[256];
    uint32_t cp[256];
    uint16_t tok_of_byte[256];
    int rv;

    byte_tables(order, cp);
    for (uint32_t i = 0; i < N_BASE; i++) {
        tok_of_byte[order[i]] = (uint16_t)i;
        b.len[i] = 1;
        b.bytes[i] = malloc(1);
        if (!b.bytes[i]) {
            rv = strata_errf(STRATA_ENOMEM, "fixture vocab: byte tokens");
            goto fail;
        }
        b.bytes[i][0] = order[i];
        b.n_tok = i + 1;
    }
    if ((rv = split_words(&b, tok_of_byte)) != 0 || (rv = learn(&b)) != 0) goto fail;

    uint32_t n_builtin = b.n_tok + N_SPECIAL;
    if (n_vocab < n_builtin) {
        rv = strata_errf(STRATA_EINVAL,
                         "fixture vocab: %u tokens asked, the built-in vocabulary has %u: use a "
                         "shape with a larger vocabulary or pass --vocab",
                         n_vocab, n_builtin);
        goto fail;
    }
    toks = calloc(n_vocab, sizeof *toks);
    types = calloc(n_vocab, sizeof *types);
    merges = calloc(b.n_merges ? b.n_merges : 1, sizeof *merges);
    if (!toks || !types || !merges) {
        rv = strata_errf(STRATA_ENOMEM, "fixture vocab: %u tokens", n_vocab);
        goto fail;
    }
    for (uint32_t i = 0; i < n_vocab; i++) {
        if (i < b.n_tok) {
            toks[i] = utf8(b.bytes[i], b.len[i], cp);
            types[i] = TOK_NORMAL;
        } else if (i < n_builtin) {
            toks[i] = strdup(specials[i - b.n_tok]);
            types[i] = TOK_CONTROL;
        } else {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%u]", i);
            toks[i] = strdup(pad);
            types[i] = TOK_UNUSED;
        }
        if (!toks[i]) {
            rv = strata_errf(STRATA_ENOMEM, "fixture vocab: token %u", i);
            goto fail;
        }
    }
    for (uint32_t m = 0; m < b.n_merges; m++) {
        const char *l = toks[b.mleft[m]], *r = toks[b.mright[m]];
        size_t n = strlen(l) + strlen(r) + 2;
        if (!(merges[m] = malloc(n))) {
            rv = strata_errf(STRATA_ENOMEM, "fixture vocab: merge %u", m);
            goto fail;
        }
        snprintf(merges[m], n, "%s %s", l, r);
    }

    uint32_t eot = b.n_tok, im_end = b.n_tok + 2;
    if ((rv = gguf_w_str(w, "tokenizer.ggml.model", "gpt2")) != 0 ||
        (rv = gguf_w_str(w, "tokenizer.ggml.pre", "qwen2")) != 0 ||
        (rv = gguf_w_arr_str(w, "tokenizer.ggml.tokens", n_vocab, (const char *const *)toks,
                             NULL)) != 0 ||
        (rv = gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, n_vocab, types)) != 0 ||
        (rv = gguf_w_arr_str(w, "tokenizer.ggml.merges", b.n_merges, (const char *const *)merges,
                             NULL)) != 0 ||
        (rv = gguf_w_u32(w, "tokenizer.ggml.eos_token_id", im_end)) != 0 ||
        (rv = gguf_w_u32(w, "tokenizer.ggml.padding_token_id", eot)) != 0 ||
        (rv = gguf_w_u32(w, "tokenizer.ggml.bos_token_id", eot)) != 0 ||
        (rv = gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false)) != 0 ||
        (rv = gguf_w_str(w, "tokenizer.chat_template", chat_template)) != 0)
        goto fail;

fail:
    for (uint32_t i = 0; toks && i < n_vocab; i++)
        free(toks[i]);
    for (uint32_t m = 0; merges && m < b.n_merges; m++)
        free(merges[m]);
    free(toks);
    free(types);
    free(merges);
    for (uint32_t i = 0; i < b.n_tok; i++)
        free(b.bytes[i]);
    for (uint32_t i = 0; i < b.n_words; i++)
        free(b.words[i].sym);
    free(b.words);
    return rv;
}
