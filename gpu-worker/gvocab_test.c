/* gvocab_test — a model's vocabulary as grammar bytes, from a small SentencePiece tokenizer
 * written here with one token of each type: text tokens give their pieces (a byte token its byte,
 * "▁" a space), control tokens the reserved bytes of <[id]>, unknown and unused tokens nothing, a
 * piece with a byte no UTF-8 text has nothing (it could spell a control token), ids past the
 * tokenizer nothing; checked through the masks of grammars, and the count of tokens with bytes.
 * Also the demo model's tokenizer, and a file without a tokenizer. */
#include "gpu-worker/gvocab.h"

#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/grammar/grammar.h"
#include "common/tok/tok.h"
#include "tests/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the vocabulary: text, type (enum tok_type) */
static const struct {
    const char *text;
    int32_t type;
} VOCAB[] = {
    {"<unk>", 2},  /* 0 unknown: no bytes */
    {"<s>", 3},    /* 1 control */
    {"</s>", 3},   /* 2 control */
    {"<0xFF>", 6}, /* 3 byte 0xFF: no UTF-8 has it, dropped */
    {"<0x41>", 6}, /* 4 byte 'A' */
    {"a", 1},      /* 5 */
    {"\xe2\x96\x81"
     "b",
     1},                     /* 6 "▁b": " b" */
    {"<tool>", 4},           /* 7 user-defined: its text */
    {"x", 5},                /* 8 unused: no bytes */
    {"é", 1},                /* 9 */
    {"\xc3", 1},             /* 10 half a character: bytes a grammar can still continue */
    {"\xff\x80\x80\x81", 1}, /* 11 a text token spelling control token 1's bytes: dropped */
    {"", 0},                 /* 12 undefined and empty */
};
#define N_TOK  (sizeof VOCAB / sizeof *VOCAB)
#define N_TEXT 8 /* 1, 2, 4, 5, 6, 7, 9, 10 */

static char g_path[600];

static void write_vocab(const char *path, bool with_tokenizer)
{
    struct gguf_writer *w;
    ck_assert_int_eq(gguf_writer_open(path, 0, &w), 0);
    ck_assert_int_eq(gguf_w_str(w, "general.architecture", "llama"), 0);
    if (with_tokenizer) {
        const char *texts[N_TOK];
        float scores[N_TOK];
        int32_t types[N_TOK];
        for (size_t i = 0; i < N_TOK; i++) {
            texts[i] = VOCAB[i].text;
            scores[i] = -(float)i;
            types[i] = VOCAB[i].type;
        }
        ck_assert_int_eq(gguf_w_str(w, "tokenizer.ggml.model", "llama"), 0);
        ck_assert_int_eq(gguf_w_arr_str(w, "tokenizer.ggml.tokens", N_TOK, texts, NULL), 0);
        ck_assert_int_eq(gguf_w_arr(w, "tokenizer.ggml.scores", GGUF_FLOAT32, N_TOK, scores), 0);
        ck_assert_int_eq(gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, N_TOK, types), 0);
    }
    ck_assert_int_eq(gguf_writer_begin(w), 0);
    ck_assert_int_eq(gguf_writer_finish(w), 0);
}

/* mask_of: the tokens grammar gbnf allows first, as a bitset over n ids (n <= 64). */
static uint64_t mask_of(const struct grammar_vocab *v, const char *gbnf)
{
    struct grammar *g;
    ck_assert_msg(grammar_parse(gbnf, strlen(gbnf), &g) == 0, "%s", strata_errdetail());
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, v, &m), 0);
    uint32_t mask[2] = {0, 0};
    ck_assert_int_eq(grammar_matcher_mask_into(m, mask), 0);
    grammar_matcher_fini(m);
    grammar_fini(g);
    return mask[0] | (uint64_t)mask[1] << 32;
}

#define BIT(i) (1ull << (i))

START_TEST(every_token_type_gets_its_bytes)
{
    write_vocab(g_path, true);
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open(g_path, &f), 0);
    struct grammar_vocab *v;
    uint32_t n_text = 0;
    ck_assert_msg(gvocab_from_gguf(f, N_TOK, &v, &n_text) == 0, "%s", strata_errdetail());
    ck_assert_uint_eq(grammar_vocab_size(v), N_TOK);
    ck_assert_uint_eq(n_text, N_TEXT);
    /* text: a byte token is its byte, "▁" a space, a user-defined token its text */
    ck_assert_uint_eq(mask_of(v, "root ::= \"A\" | \" b\" | \"a\"\n"), BIT(4) | BIT(5) | BIT(6));
    ck_assert_uint_eq(mask_of(v, "root ::= \"<tool>\"\n"), BIT(7));
    ck_assert_uint_eq(mask_of(v, "root ::= \"é\"\n"), BIT(9) | BIT(10)); /* 10 begins it */
    /* any text: every token with text bytes, never a control, dropped or empty one */
    ck_assert_uint_eq(mask_of(v, "root ::= .*\n"),
                      BIT(4) | BIT(5) | BIT(6) | BIT(7) | BIT(9) | BIT(10));
    /* a control token only through its reference; token 11's look-alike bytes were dropped */
    ck_assert_uint_eq(mask_of(v, "root ::= <[1]>\n"), BIT(1));
    ck_assert_uint_eq(mask_of(v, "root ::= <[2]> | <[0]> | <[8]>\n"), BIT(2));
    grammar_vocab_fini(v);

    /* ids past the tokenizer (an embedding with spare rows) have no bytes */
    ck_assert_int_eq(gvocab_from_gguf(f, 40, &v, &n_text), 0);
    ck_assert_uint_eq(grammar_vocab_size(v), 40);
    ck_assert_uint_eq(n_text, N_TEXT);
    ck_assert_uint_eq(mask_of(v, "root ::= .* | <[20]>\n"),
                      BIT(4) | BIT(5) | BIT(6) | BIT(7) | BIT(9) | BIT(10));
    grammar_vocab_fini(v);
    /* fewer ids than the tokenizer: the first ones; n_text may be NULL */
    ck_assert_int_eq(gvocab_from_gguf(f, 5, &v, NULL), 0);
    ck_assert_uint_eq(grammar_vocab_size(v), 5);
    ck_assert_uint_eq(mask_of(v, "root ::= \"A\" | <[1]>\n"), BIT(1) | BIT(4));
    grammar_vocab_fini(v);
    gguf_close(f);
}
END_TEST

START_TEST(a_file_without_a_tokenizer_is_refused)
{
    char path[700];
    snprintf(path, sizeof path, "%s/no-tok.gguf", test_tmpdir());
    write_vocab(path, false);
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    struct grammar_vocab *v = (struct grammar_vocab *)&v;
    uint32_t n_text = 99;
    int rv = gvocab_from_gguf(f, 10, &v, &n_text);
    ck_assert_int_ne(rv, 0);
    ck_assert_ptr_null(v);
    ck_assert_uint_eq(n_text, 99);
    ck_assert_msg(strstr(strata_errdetail(), "a grammar needs the model's tokenizer: ") &&
                      strstr(strata_errdetail(), "tokenizer.ggml.model"),
                  "%s", strata_errdetail());
    gguf_close(f);
    unlink(path);
}
END_TEST

/* The bundled demo tokenizer (byte-level BPE): a text token's bytes are its decoded piece, so the
 * mask of a literal is exactly the text tokens whose pieces begin it. */
START_TEST(the_demo_tokenizer)
{
    const char *path = STRATA_SOURCE_DIR "/models/demo-tokenizer.gguf";
    if (access(path, R_OK) != 0) {
        printf("SKIP: %s is not there\n", path);
        return;
    }
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    const struct gguf_value *toks;
    ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &toks), 0);
    const uint32_t n = (uint32_t)toks->arr.n;
    struct grammar_vocab *v;
    uint32_t n_text;
    ck_assert_msg(gvocab_from_gguf(f, n, &v, &n_text) == 0, "%s", strata_errdetail());
    ck_assert_uint_gt(n_text, n / 2);
    ck_assert_uint_le(n_text, n);
    const char *lit = "Hello, world";
    char gbnf[64];
    snprintf(gbnf, sizeof gbnf, "root ::= \"%s\"\n", lit);
    struct grammar *g;
    ck_assert_int_eq(grammar_parse(gbnf, strlen(gbnf), &g), 0);
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, v, &m), 0);
    uint32_t *mask = calloc((n + 31) / 32, sizeof *mask);
    ck_assert_int_eq(grammar_matcher_mask_into(m, mask), 0);
    struct tok *t;
    ck_assert_int_eq(tok_from_gguf(f, NULL, &t), 0);
    struct tok_buf b = {0};
    uint32_t allowed = 0;
    for (uint32_t i = 0; i < n; i++) {
        const enum tok_type ty = tok_token_type(t, (int32_t)i);
        b.n = 0;
        ck_assert_int_eq(tok_piece(t, (int32_t)i, 0, &b), 0);
        const bool want = ty != TOK_TYPE_CONTROL && ty != TOK_TYPE_UNKNOWN &&
                          ty != TOK_TYPE_UNUSED && b.n > 0 && b.n <= strlen(lit) &&
                          memcmp(b.p, lit, b.n) == 0;
        const bool got = (mask[i / 32] >> (i % 32)) & 1;
        ck_assert_msg(got == want, "token %u '%.*s' (type %d): in the mask %d", i, (int)b.n,
                      b.p ? b.p : "", ty, got);
        allowed += got;
    }
    ck_assert_uint_ge(allowed, 2); /* "H" and more */
    free(b.p);
    tok_fini(t);
    free(mask);
    grammar_matcher_fini(m);
    grammar_fini(g);
    grammar_vocab_fini(v);
    gguf_close(f);
}
END_TEST

int main(void)
{
    snprintf(g_path, sizeof g_path, "%s/vocab.gguf", test_tmpdir());
    Suite *s = suite_create("gvocab");
    TCase *tc = tcase_create("gvocab");
    tcase_add_test(tc, every_token_type_gets_its_bytes);
    tcase_add_test(tc, a_file_without_a_tokenizer_is_refused);
    tcase_add_test(tc, the_demo_tokenizer);
    suite_add_tcase(s, tc);
    return test_run(s);
}
