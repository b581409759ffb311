/* gbnf_test — the GBNF parser's edges (grammar_test.c has its main paths): empty and maximal
 * texts, UTF-8 in literals and classes at every encoded length, escapes, repetition bounds, deep
 * nesting and recursion, rule names the compiler also uses, triggers, and bad input: every
 * malformed grammar is refused with its code and a detail saying what and where, in bounded time
 * and memory. */
#include "common/base/err.h"
#include "common/grammar/grammar.h"
#include "common/grammar/grammar_testutil.h"
#include "tests/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* fails: text is refused with code and a detail holding want. */
static void fails(const char *text, int code, const char *want)
{
    gt_parse_fails(text, strlen(text), code, want);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

START_TEST(empty_and_trivial_grammars)
{
    fails("", STRATA_EINVAL, "no rule 'root'");
    fails("# only a comment\n\n   \n", STRATA_EINVAL, "no rule 'root'");
    /* the empty sentence: accepted at once, and nothing may follow */
    struct grammar *g = gt_parse_ok("root ::= \"\"");
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    ck_assert(grammar_matcher_accepting(m));
    ck_assert(grammar_matcher_done(m));
    ck_assert_int_eq(grammar_matcher_feed(m, "a", 1), STRATA_EINVAL);
    ck_assert(grammar_matcher_done(m)); /* left as it was */
    grammar_matcher_fini(m);
    grammar_fini(g);
    /* an empty alternative, no final newline, CRLF lines; after '|' the rule goes on */
    g = gt_parse_ok("root ::= | x\r\nx ::= \"x\" |\r\n  \"y\" \"z\"");
    YES(g, "yz");
    YES(g, "");
    YES(g, "x");
    NO(g, "xx");
    grammar_fini(g);
    /* accepting and done differ under a repetition */
    g = gt_parse_ok("root ::= \"a\"+");
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    ck_assert(!grammar_matcher_accepting(m));
    ck_assert_int_eq(grammar_matcher_feed(m, "aa", 2), 0);
    ck_assert(grammar_matcher_accepting(m));
    ck_assert(!grammar_matcher_done(m));
    ck_assert_int_eq(grammar_matcher_feed(m, "", 0), 0);
    grammar_matcher_fini(m);
    grammar_fini(g);
}
END_TEST

START_TEST(utf8_literals_and_classes)
{
    /* literals: raw UTF-8 and every escape give the same bytes */
    struct grammar *g = gt_parse_ok("root ::= \"日本\" \"\\u00e9\\U0001F600\\x41\\t\" \"\\\"\\\\\"\n");
    YES(g, "日本é\xf0\x9f\x98\x80"
           "A\t\"\\");
    NO(g, "日本e\xf0\x9f\x98\x80"
          "A\t\"\\");
    grammar_fini(g);
    /* a class spanning 1-, 2-, 3- and 4-byte characters, and its complement */
    g = gt_parse_ok("root ::= [\\x7e-\\U00010001]+\n");
    YES(g, "~\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf\xf0\x90\x80\x80\xf0\x90\x80\x81");
    NO(g, "}");
    NO(g, "\xf0\x90\x80\x82");
    NO(g, "\xed\xa0\x80"); /* a surrogate's bytes are no character */
    NO(g, "\xc0\xbe");     /* an overlong '>' neither */
    grammar_fini(g);
    g = gt_parse_ok("root ::= [^a-zé]\n");
    YES(g, "A");
    YES(g, "è");
    YES(g, "\xf4\x8f\xbf\xbf"); /* U+10FFFF */
    NO(g, "é");
    NO(g, "q");
    NO(g, "\xf4\x90\x80\x80"); /* above U+10FFFF */
    grammar_fini(g);
    /* ']' , '-' and '^' as members; a class of one multi-byte character */
    g = gt_parse_ok("root ::= [\\]a^-]* [ж]\n");
    YES(g, "]^-aж");
    NO(g, "b");
    grammar_fini(g);
    /* a token split inside a character: fed byte by byte it matches the same */
    g = gt_parse_ok("root ::= [α-ω] \"✓\"\n");
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    const char *s = "λ✓";
    for (size_t i = 0; i < strlen(s); i++) {
        ck_assert(!grammar_matcher_accepting(m));
        ck_assert_int_eq(grammar_matcher_feed(m, s + i, 1), 0);
    }
    ck_assert(grammar_matcher_done(m));
    grammar_matcher_fini(m);
    grammar_fini(g);

    fails("root ::= \"\xff\"\n", STRATA_EINVAL, "invalid UTF-8 in the grammar");
    fails("root ::= \"\xc3\"\n", STRATA_EINVAL, "invalid UTF-8 in the grammar");
    fails("root ::= \"\xe0\x80\x80\"\n", STRATA_EINVAL, "invalid UTF-8"); /* overlong */
    fails("root ::= [\xed\xa0\x80]\n", STRATA_EINVAL, "invalid UTF-8");   /* a surrogate */
    fails("root ::= \"\\U00110000\"\n", STRATA_EINVAL, "above U+10FFFF");
    fails("root ::= \"\\u12\"\n", STRATA_EINVAL, "hexadecimal digits");
    fails("root ::= \"\\x4", STRATA_EINVAL, "escape ends early");
    fails("root ::= \"a\nb\"\n", STRATA_EINVAL, "a newline inside a literal");
    fails("root ::= [z-a]\n", STRATA_EINVAL, "line 1");
    fails("root ::= [abc\n", STRATA_EINVAL, "line 1");
}
END_TEST

START_TEST(repetition_bounds)
{
    struct grammar *g = gt_parse_ok("root ::= \"a\"{0} \"b\"{2} \"c\"{1,3} \"d\"{ 2 , } \"e\"{0,1}\n");
    YES(g, "bbcdd");
    YES(g, "bbcccdddde");
    NO(g, "abbcdd");
    NO(g, "bcdd");
    NO(g, "bbccccdd");
    NO(g, "bbcd");
    NO(g, "bbcddee");
    grammar_fini(g);
    /* {0,0} of a group is the empty sentence; a bound on a nested repetition */
    g = gt_parse_ok("root ::= (\"x\" \"y\"){0,0} (\"a\"{2}){2,3}\n");
    YES(g, "aaaa");
    YES(g, "aaaaaa");
    NO(g, "aaaaa");
    NO(g, "xyaaaa");
    grammar_fini(g);
    /* an exact count of 10,000 takes 10,000 and not one more */
    g = gt_parse_ok("root ::= \"a\"{10000}\n");
    static char a[10002];
    memset(a, 'a', sizeof a - 1);
    ck_assert(gt_matches(g, a, 10000));
    ck_assert(!gt_matches(g, a, 9999));
    ck_assert(!gt_matches(g, a, 10001));
    grammar_fini(g);

    fails("root ::= \"a\"{,3}\n", STRATA_EINVAL, "expected a number in {m,n}");
    fails("root ::= \"a\"{2\n", STRATA_EINVAL, "expected '}'");
    fails("root ::= \"a\"{3,2}\n", STRATA_EINVAL, "n below m");
    fails("root ::= \"a\"{x}\n", STRATA_EINVAL, "line 1 column");
    /* counts past the expansion limit, even ones that overflow 64 bits, are a limit */
    fails("root ::= \"a\"{5000000}\n", STRATA_ELIMIT, "a repetition count above");
    fails("root ::= \"a\"{99999999999999999999999}\n", STRATA_ELIMIT, "repetition count");
    fails("root ::= \"a\"{1,99999999999999999999999}\n", STRATA_ELIMIT, "repetition count");
    /* nested counts do not multiply: each level is a rule of 2,000 references */
    g = gt_parse_ok("root ::= ((\"ab\"{2000}){2000}){2000}\n");
    ck_assert_uint_lt(grammar_n_rules(g), 100);
    ck_assert(!gt_matches(g, "abab", 4));
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    for (int i = 0; i < 5000; i++)
        ck_assert_int_eq(grammar_matcher_feed(m, "ab", 2), 0);
    ck_assert(!grammar_matcher_accepting(m));
    grammar_matcher_fini(m);
    grammar_fini(g);
    /* one level past the limit is refused, not expanded */
    fails("root ::= \"a\"{4000000} \"b\"{4000000}\n", STRATA_ELIMIT, "symbols");
}
END_TEST

START_TEST(nesting_and_recursion)
{
    /* groups nested 200 deep parse; 10,000 deep are refused (the parser recurses) */
    static char t[40000];
    int n = snprintf(t, sizeof t, "root ::= ");
    for (int i = 0; i < 200; i++)
        t[n++] = '(';
    n += snprintf(t + n, sizeof t - n, "\"a\"");
    for (int i = 0; i < 200; i++)
        t[n++] = ')';
    t[n] = 0;
    struct grammar *g = gt_parse_ok(t);
    YES(g, "a");
    grammar_fini(g);
    n = snprintf(t, sizeof t, "root ::= ");
    for (int i = 0; i < 10000; i++)
        t[n++] = '(';
    t[n] = 0;
    fails(t, STRATA_EINVAL, "groups nested too deep");

    /* right recursion is fine, and a sentence 10,000 levels deep matches */
    g = gt_parse_ok("root ::= \"(\" root \")\" | \"x\"\n");
    static char s[20002];
    for (int i = 0; i < 10000; i++) {
        s[i] = '(';
        s[10001 + i] = ')';
    }
    s[10000] = 'x';
    ck_assert(gt_matches(g, s, 20001));
    ck_assert(!gt_matches(g, s, 20000));
    grammar_fini(g);
    /* mutual recursion through several rules */
    g = gt_parse_ok("root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= list | "
                 "[0-9]+\n");
    YES(g, "[]");
    YES(g, "[1,[2,[]],[[33]]]");
    NO(g, "[1,]");
    grammar_fini(g);

    /* rules that reach themselves before any character, directly or not */
    fails("root ::= root\n", STRATA_EINVAL, "rule 'root' is left-recursive");
    fails("root ::= a\na ::= b\nb ::= a\n", STRATA_EINVAL, "left-recursive");
    fails("root ::= x root | \"a\"\nx ::= \"b\"?\n", STRATA_EINVAL, "left-recursive");
    fails("root ::= (\"a\"* root)\n", STRATA_EINVAL, "left-recursive");
    fails("root ::= \"a\" x\nx ::= (\"\"|\"b\")+\n", STRATA_EINVAL, "left-recursive");
    fails("root ::= (x{0,3})*\nx ::= \"\"\n", STRATA_EINVAL, "left-recursive");
    /* the message says where the rule was defined */
    fails("root ::= \"a\" x\n\nx ::= y \"b\"\ny ::= x\n", STRATA_EINVAL, "line 3");
}
END_TEST

/* The compiler names its own rules group, star, opt and class in messages; a grammar's rules of
 * those names are its own. */
START_TEST(rules_named_as_generated_ones)
{
    struct grammar *g =
        gt_parse_ok("root ::= (\"a\" \"b\") group star opt class\n"
                 "group ::= \"g\"\nstar ::= \"s\"*\nopt ::= \"o\"?\nclass ::= [é-ë]\n");
    YES(g, "abgssoê");
    YES(g, "abgé");
    NO(g, "abé");
    grammar_fini(g);
    g = gt_parse_ok("root ::= \"x\"* star\nstar ::= \"y\"\n");
    YES(g, "xxy");
    NO(g, "xx");
    grammar_fini(g);
}
END_TEST

START_TEST(syntax_errors_say_where)
{
    fails("root ::= \"a\"\nfoo ::= \"b\" bar\n", STRATA_EINVAL,
          "grammar line 2: rule 'bar' is used but not defined");
    fails("root ::= \"a\"\n  x ::= \"b\"\nx ::= \"c\"\n", STRATA_EINVAL,
          "line 3: rule 'x' is defined twice");
    fails("root ::= \"a\"\nroot ::=\n", STRATA_EINVAL, "defined twice");
    fails("root ::= \"a\" ]\n", STRATA_EINVAL, "line 1 column 14: unexpected character");
    fails("root ::= (\"a\"\n", STRATA_EINVAL, "expected ')'");
    fails("root ::= \"abc\n", STRATA_EINVAL, "line 1");
    fails("root ::= \"abc", STRATA_EINVAL, "not closed");
    fails("root\n", STRATA_EINVAL, "'::='");
    fails("::= \"a\"\n", STRATA_EINVAL, "expected a rule name");
    fails("root ::= + \"a\"\n", STRATA_EINVAL, "repetition operator without");
    fails("root ::= \"a\" | * \n", STRATA_EINVAL, "repetition operator without");
    fails("root ::= <[2097152]>\n", STRATA_EINVAL, "below 2^21");
    fails("root ::= <[12\n", STRATA_EINVAL, "<[id]>");
    /* a NUL inside the text is a character like any other: refused where it is */
    gt_parse_fails("root ::= \"a\"\0\n", 14, STRATA_EINVAL, "line 1 column 13");
    /* the size limit */
    char *big = malloc(GRAMMAR_MAX_BYTES + 2);
    memset(big, ' ', GRAMMAR_MAX_BYTES + 1);
    big[GRAMMAR_MAX_BYTES + 1] = 0;
    memcpy(big, "root ::= \"a\"\n", 13);
    gt_parse_fails(big, GRAMMAR_MAX_BYTES + 1, STRATA_ELIMIT, "at most");
    struct grammar *g = NULL;
    ck_assert_int_eq(grammar_parse(big, GRAMMAR_MAX_BYTES, &g), 0); /* the limit itself is fine */
    grammar_fini(g);
    free(big);
}
END_TEST

START_TEST(trigger_errors)
{
    fails("%trig \"a\"\nroot ::= \"a\"\n", STRATA_EINVAL, "unknown directive");
    fails("%trigger\nroot ::= \"a\"\n", STRATA_EINVAL, "an empty trigger");
    fails("%trigger x\nroot ::= \"a\"\n", STRATA_EINVAL, "literals and token references");
    char t[400];
    int n = snprintf(t, sizeof t, "%%trigger \"");
    for (int i = 0; i < 129; i++)
        t[n++] = 'x';
    snprintf(t + n, sizeof t - n, "\"\nroot ::= \"x\"\n");
    fails(t, STRATA_EINVAL, "more than 128 bytes");
    static char many[2000];
    n = 0;
    for (int i = 0; i < 17; i++)
        n += snprintf(many + n, sizeof many - n, "%%trigger \"t%d\"\n", i);
    snprintf(many + n, sizeof many - n, "root ::= \"t\" [0-9]+\n");
    fails(many, STRATA_EINVAL, "too many triggers (at most 16)");
    /* 16 is fine */
    many[0] = 0;
    n = 0;
    for (int i = 0; i < 16; i++)
        n += snprintf(many + n, sizeof many - n, "%%trigger \"t%d\"\n", i);
    snprintf(many + n, sizeof many - n, "root ::= \"t\" [0-9]+\n");
    grammar_fini(gt_parse_ok(many));
}
END_TEST

/* Large grammars compile in time linear in their size: 20,000 rules referencing each other,
 * 20,000 distinct classes. Bounded generously (scaled by test_slowdown): a quadratic name lookup
 * took minutes here. */
START_TEST(large_grammars_parse_in_bounded_time)
{
    const int n = 20000;
    size_t cap = (size_t)n * 64;
    char *t = malloc(cap);
    size_t k = (size_t)snprintf(t, cap, "root ::= r0\n");
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(t + k, cap - k, "r%d ::= \"%c\" r%d | \"x\"{0,3} [%c-%c]\n", i,
                              'a' + i % 26, i + 1 < n ? i + 1 : 0, 'a' + i % 20,
                              'a' + i % 20 + i % 6);
    double t0 = now_s();
    struct grammar *g = NULL;
    ck_assert_msg(grammar_parse(t, k, &g) == 0, "%s", strata_errdetail());
    ck_assert_uint_ge(grammar_n_rules(g), (uint32_t)n);
    YES(g, "abcxd");
    grammar_fini(g);
    double dt = now_s() - t0;
    ck_assert_msg(dt < 10 * test_slowdown(), "%d rules took %.1f s", n, dt);

    /* as many distinct classes of one rule */
    k = (size_t)snprintf(t, cap, "root ::=");
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(t + k, cap - k, " [\\u%04X-\\u%04X]?", 0x100 + i, 0x100 + 2 * i);
    k += (size_t)snprintf(t + k, cap - k, "\n");
    t0 = now_s();
    ck_assert_msg(grammar_parse(t, k, &g) == 0, "%s", strata_errdetail());
    grammar_fini(g);
    dt = now_s() - t0;
    ck_assert_msg(dt < 10 * test_slowdown(), "%d classes took %.1f s", n, dt);
    free(t);
}
END_TEST

/* A grammar whose every step would visit a huge set of parse stacks is refused by the matcher
 * (STRATA_ELIMIT) instead of taking seconds a byte; large allowed ones, an optional item repeated
 * 20,000 times and 60,000 alternatives at one place, still match. */
START_TEST(matching_work_is_bounded)
{
    struct grammar *g = gt_parse_ok("root ::= (\"a\"?){1000000}\n");
    struct grammar_matcher *m = (struct grammar_matcher *)&m;
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), STRATA_ELIMIT);
    ck_assert_msg(strstr(strata_errdetail(), "parse stacks: the grammar is too ambiguous"), "%s",
                  strata_errdetail());
    ck_assert_ptr_null(m);
    grammar_fini(g);

    g = gt_parse_ok("root ::= (\"a\"?){20000} \"b\"\n");
    ck_assert_int_eq(grammar_matcher_init(g, NULL, &m), 0);
    ck_assert_int_eq(grammar_matcher_feed(m, "aaa", 3), 0);
    ck_assert_int_eq(grammar_matcher_feed(m, "b", 1), 0);
    ck_assert(grammar_matcher_done(m));
    grammar_matcher_fini(m);
    grammar_fini(g);

    const int n = 60000;
    char *t = malloc((size_t)n * 12 + 32);
    size_t k = (size_t)sprintf(t, "root ::= \"w\"");
    for (int i = 0; i < n; i++)
        k += (size_t)sprintf(t + k, "%s\"%d\"", i ? " | " : " (", i);
    sprintf(t + k, ")\n");
    g = gt_parse_ok(t);
    ck_assert(gt_matches(g, "w59999", 6));
    ck_assert(gt_matches(g, "w0", 2));
    ck_assert(!gt_matches(g, "w60000", 6));
    grammar_fini(g);
    free(t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gbnf");
    TCase *tc = tcase_create("gbnf");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, empty_and_trivial_grammars);
    tcase_add_test(tc, utf8_literals_and_classes);
    tcase_add_test(tc, repetition_bounds);
    tcase_add_test(tc, nesting_and_recursion);
    tcase_add_test(tc, rules_named_as_generated_ones);
    tcase_add_test(tc, syntax_errors_say_where);
    tcase_add_test(tc, trigger_errors);
    tcase_add_test(tc, large_grammars_parse_in_bounded_time);
    tcase_add_test(tc, matching_work_is_bounded);
    suite_add_tcase(s, tc);
    return test_run(s);
}
