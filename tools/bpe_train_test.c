/* bpe_train_test — learn a vocabulary from a small text, load it with tok_load and check:
 * byte-level round trips, frequent words became one token, tok's encoding of the training text has
 * exactly as many tokens as the trainer's own segmentation (same split, same merges), specials,
 * padding, identical bytes for identical input, errors, and `strata bpe-train` itself. */
#include "common/base/err.h"
#include "common/tok/tok.h"
#include "launcher/cmd.h"
#include "tests/testutil.h"
#include "tools/bpe_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const struct strata_cmd strata_cmd_bpe_train;

/* Written for this test: repeated words so merges have something to find, digits, punctuation,
 * runs of spaces and newlines, and non-ASCII letters. */
static const char sample[] =
    "The river ran under the old bridge, and the children ran along the bank to see the boats.\n"
    "Every morning the baker opened the shop at six, and every evening the baker closed it at "
    "nine.\n"
    "The boats came back with fish, and the fish went to the market, and the market was loud.\n"
    "  Indented line:   three spaces,\ttabs\tand  the   end.\n"
    "Numbers: 12, 345, 6789 and 2024-11-29; prices like $3.50 or 7%.\n"
    "Na\xc3\xafve caf\xc3\xa9 d\xc3\xa9j\xc3\xa0 vu \xe2\x80\x94 \xce\xb1\xce\xb2\xce\xb3 and the "
    "end of the story, and the end of the day.\n";

static char path_in_tmp[512];

static const char *tmp_path(const char *name)
{
    snprintf(path_in_tmp, sizeof path_in_tmp, "%s/%s", test_tmpdir(), name);
    return path_in_tmp;
}

/* train writes a vocabulary of n_vocab tokens learned from text (repeated reps times, as separate
 * adds) to path and returns its stats. */
static struct bpe_train_stats train(const char *text, size_t len, int reps, uint32_t n_vocab,
                                    const char *path)
{
    struct bpe_train_opts o = {.n_vocab = n_vocab};
    struct bpe_train *t;
    ck_assert_int_eq(bpe_train_init(&o, &t), 0);
    for (int i = 0; i < reps; i++)
        ck_assert_int_eq(bpe_train_add(t, text, len), 0);
    ck_assert_int_eq(bpe_train_learn(t), 0);
    ck_assert_msg(bpe_train_write(t, path) == 0, "write: %s", strata_errdetail());
    struct bpe_train_stats st;
    bpe_train_get_stats(t, &st);
    bpe_train_fini(t);
    return st;
}

static void check_round_trip(const struct tok *tk, const char *text, size_t len)
{
    struct tok_ids ids = {0};
    struct tok_buf out = {0};
    ck_assert_int_eq(tok_encode(tk, text, len, 0, &ids), 0);
    ck_assert_int_eq(tok_decode(tk, ids.v, ids.n, 0, &out), 0);
    ck_assert_uint_eq(out.n, len);
    ck_assert(memcmp(out.p, text, len) == 0);
    free(ids.v);
    free(out.p);
}

static size_t n_tokens(const struct tok *tk, const char *text)
{
    struct tok_ids ids = {0};
    ck_assert_int_eq(tok_encode(tk, text, strlen(text), 0, &ids), 0);
    free(ids.v);
    return ids.n;
}

START_TEST(test_learn_and_load)
{
    const char *path = tmp_path("small.gguf");
    struct bpe_train_stats st = train(sample, sizeof sample - 1, 5, 400, path);
    ck_assert_uint_eq(st.n_bytes, 5 * (sizeof sample - 1));
    ck_assert_uint_eq(st.n_merges, 400 - 256 - 3);
    ck_assert_uint_eq(st.n_pad, 0);
    ck_assert_uint_gt(st.n_words, 50);
    struct tok *tk;
    ck_assert_msg(tok_load(path, NULL, &tk) == 0, "tok_load: %s", strata_errdetail());
    ck_assert_uint_eq(tok_n_vocab(tk), 400);
    ck_assert_str_eq(tok_pre_name(tk), "gpt-2");
    ck_assert_int_eq(tok_model(tk), TOK_MODEL_BPE);
    /* tok splits and merges the training text exactly as the trainer did. */
    struct tok_ids ids = {0};
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(tok_encode(tk, sample, sizeof sample - 1, 0, &ids), 0);
    ck_assert_uint_eq(ids.n, st.n_tokens);
    ck_assert_uint_lt(ids.n, st.n_bytes / 2); /* merges did compress */
    free(ids.v);
    /* Frequent words are one token, with their leading space. */
    const char *words[] = {" the", " and", "The", " baker", " market", " boats"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        ck_assert_msg(n_tokens(tk, words[i]) == 1, "'%s' is %zu tokens", words[i],
                      n_tokens(tk, words[i]));
    /* Round trips: the sample, unseen text, every byte value, invalid UTF-8. */
    check_round_trip(tk, sample, sizeof sample - 1);
    const char unseen[] = "Zebra quartz {json: [1, 2]} \xf0\x9f\x98\x80 \xff\xfe\x80 end";
    check_round_trip(tk, unseen, sizeof unseen - 1);
    char all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (char)i;
    check_round_trip(tk, all, sizeof all);
    /* Specials: control tokens, matched whole only when asked. */
    int32_t eot = tok_find(tk, "<|endoftext|>", 13), ims = tok_find(tk, "<|im_start|>", 12),
            ime = tok_find(tk, "<|im_end|>", 10);
    ck_assert_int_eq(eot, 397);
    ck_assert_int_eq(ims, 398);
    ck_assert_int_eq(ime, 399);
    ck_assert_int_eq(tok_token_type(tk, ims), TOK_TYPE_CONTROL);
    ck_assert_int_eq(tok_bos(tk), eot);
    ck_assert_int_eq(tok_eos(tk), ime);
    struct tok_ids sp = {0};
    ck_assert_int_eq(tok_encode(tk, "<|im_start|>user", 16, TOK_PARSE_SPECIAL, &sp), 0);
    ck_assert_int_eq(sp.v[0], ims);
    ck_assert_uint_ge(sp.n, 2);
    sp.n = 0;
    ck_assert_int_eq(tok_encode(tk, "<|im_start|>", 12, 0, &sp), 0);
    ck_assert_uint_gt(sp.n, 1); /* plain text without TOK_PARSE_SPECIAL */
    free(sp.v);
    /* Byte tokens come first in GPT-2's order: '!' is id 0, byte 0 (U+0100) id 188. */
    size_t len;
    const char *s = tok_token_text(tk, 0, &len);
    ck_assert(len == 1 && s[0] == '!');
    s = tok_token_text(tk, 188, &len);
    ck_assert(len == 2 && memcmp(s, "\xc4\x80", 2) == 0);
    tok_fini(tk);
}
END_TEST

START_TEST(test_deterministic)
{
    char a[512], b[512];
    snprintf(a, sizeof a, "%s", tmp_path("det-a.gguf"));
    snprintf(b, sizeof b, "%s", tmp_path("det-b.gguf"));
    train(sample, sizeof sample - 1, 3, 350, a);
    train(sample, sizeof sample - 1, 3, 350, b);
    size_t la, lb;
    char *fa = test_read_file(a, &la), *fb = test_read_file(b, &lb);
    ck_assert_ptr_nonnull(fa);
    ck_assert_ptr_nonnull(fb);
    ck_assert_uint_eq(la, lb);
    ck_assert(memcmp(fa, fb, la) == 0);
    free(fa);
    free(fb);
}
END_TEST

START_TEST(test_padding)
{
    /* Ten distinct words cannot give 2,000 merges: the rest is [PADn] unused tokens. */
    const char *path = tmp_path("pad.gguf");
    const char text[] = "one two three four five six seven eight nine ten ";
    struct bpe_train_stats st = train(text, sizeof text - 1, 4, 2048, path);
    ck_assert_uint_gt(st.n_pad, 1000);
    ck_assert_uint_eq(256 + st.n_merges + 3 + st.n_pad, 2048);
    struct tok *tk;
    ck_assert_int_eq(tok_load(path, NULL, &tk), 0);
    ck_assert_uint_eq(tok_n_vocab(tk), 2048);
    ck_assert_int_eq(tok_token_type(tk, 2047), TOK_TYPE_UNUSED);
    ck_assert_uint_eq(n_tokens(tk, " seven"), 1);
    tok_fini(tk);
}
END_TEST

START_TEST(test_errors)
{
    struct bpe_train *t;
    struct bpe_train_opts o = {.n_vocab = 100};
    ck_assert_int_eq(bpe_train_init(&o, &t), STRATA_EINVAL);
    ck_assert_ptr_null(t);
    o.n_vocab = 1000;
    o.pre = "llama3";
    ck_assert_int_eq(bpe_train_init(&o, &t), STRATA_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "llama3"));
    o.pre = "gpt2";
    ck_assert_int_eq(bpe_train_init(&o, &t), 0);
    ck_assert_int_eq(bpe_train_learn(t), STRATA_ESTATE);
    ck_assert_int_eq(bpe_train_write(t, tmp_path("never.gguf")), STRATA_ESTATE);
    ck_assert_int_eq(bpe_train_add(t, "a b a b", 7), 0);
    ck_assert_int_eq(bpe_train_learn(t), 0);
    ck_assert_int_eq(bpe_train_add(t, "more", 4), STRATA_ESTATE);
    ck_assert_int_eq(bpe_train_learn(t), STRATA_ESTATE);
    ck_assert_int_ne(bpe_train_write(t, "/nonexistent-dir/x.gguf"), 0);
    bpe_train_fini(t);
}
END_TEST

static int run_cmd(int argc, const char **argv)
{
    return strata_cmd_bpe_train.run(argc, (char **)argv);
}

START_TEST(test_command)
{
    char in[512], out[512];
    snprintf(in, sizeof in, "%s", tmp_path("cmd.txt"));
    snprintf(out, sizeof out, "%s", tmp_path("cmd.gguf"));
    FILE *f = fopen(in, "wb");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 4; i++)
        fputs(sample, f);
    fclose(f);
    const char *ok[] = {"bpe-train", "--vocab", "300", "--pre", "gpt-2", "-o", out, in};
    ck_assert_int_eq(run_cmd(8, ok), 0);
    struct tok *tk;
    ck_assert_int_eq(tok_load(out, NULL, &tk), 0);
    ck_assert_uint_eq(tok_n_vocab(tk), 300);
    tok_fini(tk);
    const char *help[] = {"bpe-train", "--help"};
    ck_assert_int_eq(run_cmd(2, help), 0);
    const char *no_out[] = {"bpe-train", "--vocab", "300", in};
    ck_assert_int_eq(run_cmd(4, no_out), 2);
    const char *bad_vocab[] = {"bpe-train", "--vocab", "lots", "-o", out, in};
    ck_assert_int_eq(run_cmd(6, bad_vocab), 2);
    const char *missing[] = {"bpe-train", "--vocab", "300", "-o", out, "/nonexistent/text"};
    ck_assert_int_eq(run_cmd(6, missing), 1);
}
END_TEST

/* The demo model's vocabulary: tinyshakespeare, 4,096 tokens. */
START_TEST(test_shakespeare)
{
    const char *src = test_data_path("text/tinyshakespeare.txt");
    if (!src) return;
    size_t len;
    char *text = test_read_file(src, &len);
    ck_assert_ptr_nonnull(text);
    const char *path = tmp_path("shakespeare.gguf");
    struct bpe_train_stats st = train(text, len, 1, 4096, path);
    ck_assert_uint_eq(st.n_pad, 0);
    struct tok *tk;
    ck_assert_int_eq(tok_load(path, NULL, &tk), 0);
    struct tok_ids ids = {0};
    ck_assert_int_eq(tok_encode(tk, text, len, 0, &ids), 0);
    ck_assert_uint_eq(ids.n, st.n_tokens);
    ck_assert_uint_lt(ids.n, len / 3); /* > 3 bytes a token */
    const char *words[] = {" the", " KING", " Romeo", "First", " thou"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        ck_assert_msg(n_tokens(tk, words[i]) == 1, "'%s' is %zu tokens", words[i],
                      n_tokens(tk, words[i]));
    struct tok_buf back = {0};
    ck_assert_int_eq(tok_decode(tk, ids.v, ids.n, 0, &back), 0);
    ck_assert_uint_eq(back.n, len);
    ck_assert(memcmp(back.p, text, len) == 0);
    free(back.p);
    free(ids.v);
    tok_fini(tk);
    free(text);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bpe_train");
    TCase *tc = tcase_create("bpe_train");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_learn_and_load);
    tcase_add_test(tc, test_deterministic);
    tcase_add_test(tc, test_padding);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_command);
    tcase_add_test(tc, test_shakespeare);
    suite_add_tcase(s, tc);
    return test_run(s);
}
