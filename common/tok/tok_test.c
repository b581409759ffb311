#include "common/tok/tok.h"
#include "common/base/err.h"
#include "tests/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- vector files: texts split by "\n__ggml_vocab_test__\n", one line of ids per text ----------
 */

struct vec {
    char *inp, *outp;
    size_t n;
    const char **text;
    size_t *len;
    char **ids; /* one line each */
};

static const char sep[] = "\n__ggml_vocab_test__\n";

/* unescape rewrites s[0..*len) in place as llama-tokenize does before tokenizing (its default
 * escape processing: \n \r \t \\ \' \" \xHH); the pre/ vectors were made that way. */
static void unescape(char *s, size_t *len)
{
    size_t o = 0;
    for (size_t i = 0; i < *len; i++) {
        if (s[i] != '\\' || i + 1 >= *len) {
            s[o++] = s[i];
            continue;
        }
        char c = s[++i];
        unsigned x;
        if (c == 'n')
            s[o++] = '\n';
        else if (c == 'r')
            s[o++] = '\r';
        else if (c == 't')
            s[o++] = '\t';
        else if (c == '\\' || c == '\'' || c == '"')
            s[o++] = c;
        else if (c == 'x' && i + 2 < *len && sscanf(s + i + 1, "%2x", &x) == 1) {
            s[o++] = (char)x;
            i += 2;
        } else {
            s[o++] = '\\';
            s[o++] = c;
        }
    }
    *len = o;
}

static bool vec_load(const char *base, bool escapes, struct vec *v)
{
    char p[4096];
    memset(v, 0, sizeof *v);
    snprintf(p, sizeof p, "%s.inp", base);
    size_t il, ol;
    v->inp = test_read_file(p, &il);
    snprintf(p, sizeof p, "%s.out", base);
    v->outp = test_read_file(p, &ol);
    if (!v->inp || !v->outp) return false;
    size_t cap = 256;
    v->text = malloc(cap * sizeof *v->text);
    v->len = malloc(cap * sizeof *v->len);
    v->ids = malloc(cap * sizeof *v->ids);
    char *s = v->inp, *end = v->inp + il;
    while (s < end) {
        char *e = memmem(s, (size_t)(end - s), sep, sizeof sep - 1);
        if (!e) break; /* the file ends with a separator */
        v->text[v->n] = s;
        v->len[v->n] = (size_t)(e - s);
        if (escapes) unescape(s, &v->len[v->n]);
        v->n++;
        s = e + sizeof sep - 1;
    }
    char *line = v->outp;
    for (size_t i = 0; i < v->n; i++) {
        char *nl = strchr(line, '\n');
        if (!nl) return false;
        *nl = '\0';
        v->ids[i] = line;
        line = nl + 1;
    }
    return v->n > 0;
}

static void vec_free(struct vec *v)
{
    free(v->inp);
    free(v->outp);
    free(v->text);
    free(v->len);
    free(v->ids);
}

static bool ids_equal(const struct tok_ids *got, const char *want)
{
    size_t k = 0;
    char *e;
    for (;;) {
        long x = strtol(want, &e, 10);
        if (e == want) break;
        if (k >= got->n || got->v[k] != x) return false;
        k++;
        want = e;
    }
    return k == got->n;
}

static void print_ids(const char *what, const struct tok_ids *ids)
{
    printf("  %s:", what);
    for (size_t i = 0; i < ids->n; i++)
        printf(" %d", ids->v[i]);
    printf("\n");
}

/* run_vectors checks every case of base against t; returns the failures, prints the first few.
 * Also checks the round trip decode(encode(x)) == x. */
static int run_vectors(const struct tok *t, const char *base, bool escapes, const char *label,
                       int *n_cases, int *n_roundtrip)
{
    struct vec v;
    ck_assert_msg(vec_load(base, escapes, &v), "cannot read %s.inp/.out", base);
    int fail = 0;
    *n_roundtrip = 0;
    for (size_t i = 0; i < v.n; i++) {
        struct tok_ids ids = {0};
        ck_assert_int_eq(tok_encode(t, v.text[i], v.len[i], 0, &ids), 0);
        if (!ids_equal(&ids, v.ids[i])) {
            if (fail < 4) {
                printf("%s case %zu: \"%.*s\"\n  want:%s\n", label, i, (int)v.len[i], v.text[i],
                       v.ids[i]);
                print_ids("got ", &ids);
            }
            fail++;
        }
        struct tok_buf b = {0};
        ck_assert_int_eq(tok_decode(t, ids.v, ids.n, TOK_DECODE_STRIP_PREFIX, &b), 0);
        if (b.n == v.len[i] && memcmp(b.p ? b.p : "", v.text[i], v.len[i]) == 0)
            (*n_roundtrip)++;
        else
            printf("%s case %zu: round trip gave \"%.*s\"\n", label, i, (int)b.n, b.p ? b.p : "");
        free(b.p);
        free(ids.v);
    }
    *n_cases = (int)v.n;
    vec_free(&v);
    return fail;
}

static const char *const vocab_names[] = {"gpt-2", "llama-spm", "phi-3", "starcoder",
                                          "deepseek-coder"};

START_TEST(vocab_vectors)
{
    const char *name = vocab_names[_i];
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/ggml-vocab-%s.gguf", name);
    const char *path = test_data_path(rel);
    if (!path) return;
    char base[4096];
    snprintf(base, sizeof base, "%s", path);
    struct tok *t;
    int rv = tok_load(base, NULL, &t);
    ck_assert_msg(rv == 0, "tok_load %s: %s: %s", base, strata_strerror(rv), strata_errdetail());
    int n, rt;
    int fail = run_vectors(t, base, false, name, &n, &rt);
    printf("tok vectors %-16s %d/%d pass, round trip %d/%d\n", name, n - fail, n, rt, n);
    ck_assert_int_eq(fail, 0);
    ck_assert_int_eq(rt, n);
    tok_fini(t);
}
END_TEST

static const char *const pre_names[] = {
    "default",     "llama-bpe", "qwen2",     "qwen35", "deepseek-llm", "deepseek-coder",
    "deepseek-v3", "falcon",    "starcoder", "refact", "mpt",          "gpt-4o",
    "command-r",   "olmo",      "smollm",    "tekken", "kimi-k2",
};

START_TEST(pre_vectors)
{
    const char *name = pre_names[_i];
    const char *gpath = test_data_path("tokenizers/ggml-vocab-gpt-2.gguf");
    if (!gpath) return;
    char gguf[4096];
    snprintf(gguf, sizeof gguf, "%s", gpath);
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/pre/%s.inp", name);
    const char *ipath = test_data_path(rel);
    if (!ipath) return;
    char base[4096];
    snprintf(base, sizeof base, "%.*s", (int)(strlen(ipath) - 4), ipath);
    struct tok *t;
    int rv = tok_load(gguf, name, &t);
    ck_assert_msg(rv == 0, "tok_load pre %s: %s: %s", name, strata_strerror(rv),
                  strata_errdetail());
    ck_assert_str_eq(tok_pre_name(t), name);
    int n, rt;
    int fail = run_vectors(t, base, true, name, &n, &rt);
    printf("tok pre %-16s %d/%d pass, round trip %d/%d\n", name, n - fail, n, rt, n);
    ck_assert_int_eq(fail, 0);
    ck_assert_int_eq(rt, n);
    tok_fini(t);
}
END_TEST

/* ---- in-memory vocabularies ------------------------------------------------------------------ */

static struct tok *tiny_bpe(const char *pre, bool add_bos)
{
    /* "Ġ" is the GPT-2 character of the space byte */
    static const char *const toks[] = {"a",
                                       "b",
                                       "c",
                                       "\xC4\xA0",
                                       "ab",
                                       "abc",
                                       "\xC4\xA0"
                                       "a",
                                       "<|end|>",
                                       "<tool>"};
    static const int32_t types[] = {1, 1, 1, 1, 1, 1, 1, TOK_TYPE_CONTROL, TOK_TYPE_USER_DEFINED};
    static const char *const merges[] = {"a b", "ab c", "\xC4\xA0 a"};
    struct tok_config c = {.model = TOK_MODEL_BPE,
                           .n_vocab = 9,
                           .tokens = toks,
                           .types = types,
                           .n_merges = 3,
                           .merges = merges,
                           .pre = pre,
                           .bos_id = 7,
                           .eos_id = 7,
                           .unk_id = -1,
                           .add_bos = add_bos};
    struct tok *t = NULL;
    int rv = tok_new(&c, &t);
    ck_assert_msg(rv == 0, "tok_new: %s", strata_errdetail());
    return t;
}

static void expect_ids(const struct tok *t, const char *text, unsigned flags, const int32_t *want,
                       size_t n)
{
    struct tok_ids ids = {0};
    ck_assert_int_eq(tok_encode(t, text, strlen(text), flags, &ids), 0);
    ck_assert_msg(ids.n == n, "\"%s\": %zu ids, want %zu", text, ids.n, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(ids.v[i], want[i]);
    free(ids.v);
}

START_TEST(bpe_in_memory_merges_by_rank)
{
    struct tok *t = tiny_bpe("gpt-2", false);
    expect_ids(t, "abc", 0, (const int32_t[]){5}, 1);
    /* " abc": a+b (rank 0) before Ġ+a (rank 2), then ab+c: Ġ stays alone */
    expect_ids(t, "ab abc", 0, (const int32_t[]){4, 3, 5}, 3);
    expect_ids(t, " a", 0, (const int32_t[]){6}, 1);
    ck_assert_int_eq(tok_find(t, "abc", 3), 5);
    ck_assert_int_eq(tok_find(t, "xyz", 3), -1);
    tok_fini(t);
}
END_TEST

START_TEST(special_tokens_parse_flag)
{
    struct tok *t = tiny_bpe("gpt-2", true);
    /* CONTROL only with TOK_PARSE_SPECIAL; USER_DEFINED always, never split */
    expect_ids(t, "a<|end|>b", TOK_PARSE_SPECIAL, (const int32_t[]){0, 7, 1}, 3);
    struct tok_ids ids = {0};
    ck_assert_int_eq(tok_encode(t, "a<|end|>b", 9, 0, &ids), 0);
    for (size_t i = 0; i < ids.n; i++)
        ck_assert_int_ne(ids.v[i], 7);
    free(ids.v);
    expect_ids(t, "a<tool>ab", 0, (const int32_t[]){0, 8, 4}, 3);
    expect_ids(t, "ab", TOK_ADD_SPECIAL, (const int32_t[]){7, 4}, 2);
    struct tok_buf b = {0};
    ck_assert_int_eq(tok_decode(t, (const int32_t[]){7, 4, 8, 3}, 4, 0, &b), 0);
    ck_assert_str_eq(b.p, "ab<tool> ");
    b.n = 0;
    ck_assert_int_eq(tok_decode(t, (const int32_t[]){7, 4}, 2, TOK_DECODE_SPECIAL, &b), 0);
    ck_assert_str_eq(b.p, "<|end|>ab");
    ck_assert_int_eq(tok_decode(t, (const int32_t[]){9}, 1, 0, &b), STRATA_EINVAL);
    free(b.p);
    tok_fini(t);
}
END_TEST

START_TEST(unknown_pre_is_named)
{
    const char *toks[] = {"a"};
    struct tok_config c = {.model = TOK_MODEL_BPE,
                           .n_vocab = 1,
                           .tokens = toks,
                           .pre = "nope",
                           .bos_id = -1,
                           .eos_id = -1,
                           .unk_id = -1};
    struct tok *t = NULL;
    ck_assert_int_eq(tok_new(&c, &t), STRATA_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "'nope'"));
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "llama-bpe"));
    ck_assert_ptr_nonnull(strstr(tok_pre_names(), "kimi-k2"));
    c.pre = "gpt-2";
    c.bos_id = 3;
    ck_assert_int_eq(tok_new(&c, &t), STRATA_EINVAL);
    const char *bad_merge[] = {"ab"};
    c.bos_id = -1;
    c.n_merges = 1;
    c.merges = bad_merge;
    ck_assert_int_eq(tok_new(&c, &t), STRATA_EINVAL);
}
END_TEST

/* tiny_spm: <unk> <s> </s>, the 256 byte tokens, then a few pieces with scores; inner adds "i▁h",
 * a token with "▁" inside, which a merge can form across a space. */
static struct tok *tiny_spm(bool inner)
{
    static char bytes[256][8];
    const char *toks[266];
    int32_t types[266];
    float scores[266] = {0};
    toks[0] = "<unk>";
    types[0] = TOK_TYPE_UNKNOWN;
    toks[1] = "<s>";
    types[1] = TOK_TYPE_CONTROL;
    toks[2] = "</s>";
    types[2] = TOK_TYPE_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[3 + b] = bytes[b];
        types[3 + b] = TOK_TYPE_BYTE;
    }
    const char *pieces[] = {"\xE2\x96\x81", "h", "i", "\xE2\x96\x81h", "\xE2\x96\x81hi", "hi"};
    const float sc[] = {-1, -2, -2, -3, -1, -5};
    for (int i = 0; i < 6; i++) {
        toks[259 + i] = pieces[i];
        types[259 + i] = TOK_TYPE_NORMAL;
        scores[259 + i] = sc[i];
    }
    toks[265] = "i\xE2\x96\x81h";
    types[265] = TOK_TYPE_NORMAL;
    struct tok_config c = {.model = TOK_MODEL_SPM,
                           .n_vocab = inner ? 266 : 265,
                           .tokens = toks,
                           .types = types,
                           .scores = scores,
                           .bos_id = 1,
                           .eos_id = 2,
                           .unk_id = 0,
                           .add_bos = true,
                           .add_space_prefix = true};
    struct tok *t = NULL;
    ck_assert_int_eq(tok_new(&c, &t), 0);
    return t;
}

START_TEST(spm_scores_byte_fallback_prefix)
{
    struct tok *t = tiny_spm(false);
    expect_ids(t, "hi", 0, (const int32_t[]){263}, 1);
    expect_ids(t, "hi", TOK_ADD_SPECIAL, (const int32_t[]){1, 263}, 2);
    /* "é" is not a piece: its two bytes */
    expect_ids(t, "h\xC3\xA9", 0, (const int32_t[]){262, 3 + 0xC3, 3 + 0xA9}, 3);
    /* a control token in text resets the prefix: "▁" again after it */
    expect_ids(t, "hi</s>hi", TOK_PARSE_SPECIAL, (const int32_t[]){263, 2, 263}, 3);
    struct tok_buf b = {0};
    const int32_t ids[] = {1, 262, 3 + 0xC3, 3 + 0xA9, 259, 263};
    ck_assert_int_eq(tok_decode(t, ids, 6, TOK_DECODE_STRIP_PREFIX, &b), 0);
    ck_assert_str_eq(b.p, "h\xC3\xA9  hi");
    free(b.p);
    /* without "i▁h" the text splits at spaces; with it, "▁i▁h" merges ▁h then i+▁h across */
    expect_ids(t, "i h", 0, (const int32_t[]){259, 261, 262}, 3);
    tok_fini(t);
    t = tiny_spm(true);
    expect_ids(t, "i h", 0, (const int32_t[]){259, 265}, 2);
    tok_fini(t);
}
END_TEST

START_TEST(stream_holds_partial_utf8)
{
    struct tok *t = tiny_spm(false);
    /* 🦙 = F0 9F A6 99 as four byte tokens, then "▁hi" */
    const int32_t ids[] = {3 + 0xF0, 3 + 0x9F, 3 + 0xA6, 3 + 0x99, 263};
    struct tok_stream s;
    struct tok_buf b = {0};
    tok_stream_init(&s, t, 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(tok_stream_feed(&s, ids[i], &b), 0);
        ck_assert_uint_eq(b.n, 0); /* nothing until the character is complete */
    }
    ck_assert_int_eq(tok_stream_feed(&s, ids[3], &b), 0);
    ck_assert_str_eq(b.p, "\xF0\x9F\xA6\x99");
    ck_assert_int_eq(tok_stream_feed(&s, ids[4], &b), 0);
    ck_assert_str_eq(b.p, "\xF0\x9F\xA6\x99 hi");
    /* a byte that can never be valid becomes U+FFFD at once; a cut-off sequence at flush */
    ck_assert_int_eq(tok_stream_feed(&s, 3 + 0xFF, &b), 0);
    ck_assert_int_eq(tok_stream_feed(&s, 3 + 0xE2, &b), 0);
    ck_assert_str_eq(b.p, "\xF0\x9F\xA6\x99 hi\xEF\xBF\xBD");
    ck_assert_int_eq(tok_stream_flush(&s, &b), 0);
    ck_assert_str_eq(b.p, "\xF0\x9F\xA6\x99 hi\xEF\xBF\xBD\xEF\xBF\xBD");
    /* STRIP_PREFIX drops the encoder's leading space from the first piece only */
    b.n = 0;
    tok_stream_init(&s, t, TOK_DECODE_STRIP_PREFIX);
    ck_assert_int_eq(tok_stream_feed(&s, 1, &b), 0); /* <s>: empty, does not count */
    ck_assert_int_eq(tok_stream_feed(&s, 263, &b), 0);
    ck_assert_int_eq(tok_stream_feed(&s, 263, &b), 0);
    ck_assert_str_eq(b.p, "hi hi");
    free(b.p);
    tok_fini(t);
}
END_TEST

START_TEST(gpt2_stream_emoji_and_invalid_utf8)
{
    const char *path = test_data_path("tokenizers/ggml-vocab-gpt-2.gguf");
    if (!path) return;
    struct tok *t;
    ck_assert_int_eq(tok_load(path, NULL, &t), 0);
    ck_assert_str_eq(tok_pre_name(t), "gpt-2");
    ck_assert_int_eq(tok_bos(t), 50256);
    ck_assert_uint_eq(tok_n_vocab(t), 50257);
    const char text[] = "this is \xF0\x9F\xA6\x99.cpp \xE4\xBD\xA0\xE5\xA5\xBD";
    struct tok_ids ids = {0};
    ck_assert_int_eq(tok_encode(t, text, strlen(text), 0, &ids), 0);
    struct tok_stream s;
    struct tok_buf b = {0};
    tok_stream_init(&s, t, 0);
    int held = 0;
    for (size_t i = 0; i < ids.n; i++) {
        size_t before = b.n;
        ck_assert_int_eq(tok_stream_feed(&s, ids.v[i], &b), 0);
        held += b.n == before;
        /* what was emitted so far is always a prefix of the text and ends on a character */
        ck_assert_int_eq(memcmp(b.p, text, b.n), 0);
        ck_assert_int_ne((uint8_t)text[b.n] & 0xC0, 0x80);
    }
    ck_assert_int_gt(held, 0); /* the emoji is split across byte tokens in GPT-2 */
    ck_assert_int_eq(tok_stream_flush(&s, &b), 0);
    ck_assert_str_eq(b.p, text);
    free(ids.v);
    /* invalid UTF-8 goes through the byte map: lossless */
    const char bad[] = "\xFF\xFE ab\xC3 \xE4\xBD \x80x";
    ids = (struct tok_ids){0};
    ck_assert_int_eq(tok_encode(t, bad, sizeof bad - 1, 0, &ids), 0);
    b.n = 0;
    ck_assert_int_eq(tok_decode(t, ids.v, ids.n, 0, &b), 0);
    ck_assert_uint_eq(b.n, sizeof bad - 1);
    ck_assert_int_eq(memcmp(b.p, bad, b.n), 0);
    free(ids.v);
    free(b.p);
    tok_fini(t);
}
END_TEST

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0); /* Check forks: a failing test exits before a flush */
    Suite *s = suite_create("tok");
    TCase *tc = tcase_create("vectors");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, vocab_vectors, 0, (int)(sizeof vocab_names / sizeof vocab_names[0]));
    tcase_add_loop_test(tc, pre_vectors, 0, (int)(sizeof pre_names / sizeof pre_names[0]));
    suite_add_tcase(s, tc);
    TCase *tm = tcase_create("memory");
    tcase_add_test(tm, bpe_in_memory_merges_by_rank);
    tcase_add_test(tm, special_tokens_parse_flag);
    tcase_add_test(tm, unknown_pre_is_named);
    tcase_add_test(tm, spm_scores_byte_fallback_prefix);
    tcase_add_test(tm, stream_holds_partial_utf8);
    tcase_add_test(tm, gpt2_stream_emoji_and_invalid_utf8);
    suite_add_tcase(s, tm);
    return test_run(s);
}
