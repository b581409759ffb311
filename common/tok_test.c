#include "common/tok.h"
#include "common/err.h"
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
    tok_free(t);
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
    tok_free(t);
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
    return test_run(s);
}
