/* fe_stop_test — stop strings over text cut at every possible point. */
#include "frontend/fe_stop.h"

#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>

/* run feeds text in pieces of `step` bytes and returns what was released (static buffer); *hit
 * tells whether a stop matched. */
static const char *run(const char *const *stops, size_t n, const char *text, size_t step, bool *hit)
{
    static char out[1024];
    struct fe_stop m;
    const char *rel;
    size_t rl, len = strlen(text);
    out[0] = '\0';
    ck_assert_int_eq(fe_stop_init(&m, stops, n), 0);
    *hit = false;
    for (size_t at = 0; at < len && !*hit; at += step) {
        size_t k = len - at < step ? len - at : step;
        *hit = fe_stop_feed(&m, text + at, k, &rel, &rl);
        strncat(out, rel, rl);
        /* what is released never runs into a stop string that is still possible */
        ck_assert(!stops[0][0] || !strstr(out, stops[0]));
    }
    if (!*hit) {
        fe_stop_flush(&m, &rel, &rl);
        strncat(out, rel, rl);
    }
    fe_stop_fini(&m);
    return out;
}

START_TEST(every_cut)
{
    static const struct {
        const char *stops[3];
        size_t n;
        const char *text, *want;
        bool hit;
    } cases[] = {
        {{"world"}, 1, "hello world, again", "hello ", true},
        {{"aab"}, 1, "xaaab tail", "xa", true}, /* a partial match that restarts */
        {{"END", "\n\n"}, 2, "one\ntwo\n\nthree END", "one\ntwo", true}, /* the earliest wins */
        {{"END", "ENDING"}, 2, "the ENDING", "the ", true},
        {{"zzz"}, 1, "no stop here zz", "no stop here zz", false}, /* a held tail is flushed */
        {{"é!"}, 1, "café é!", "café ", true},                     /* UTF-8 stop strings */
        {{""}, 1, "empty stops are ignored", "empty stops are ignored", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (size_t step = 1; step <= strlen(cases[i].text); step++) {
            bool hit;
            const char *got = run(cases[i].stops, cases[i].n, cases[i].text, step, &hit);
            ck_assert_msg(strcmp(got, cases[i].want) == 0 && hit == cases[i].hit,
                          "case %zu step %zu: got '%s' hit %d", i, step, got, hit);
        }
}
END_TEST

START_TEST(after_match_and_limits)
{
    const char *stops[FE_STOP_CAP + 1];
    for (int i = 0; i <= FE_STOP_CAP; i++)
        stops[i] = "x";
    struct fe_stop m;
    ck_assert_int_ne(fe_stop_init(&m, stops, FE_STOP_CAP + 1), 0);
    ck_assert_int_eq(fe_stop_init(&m, stops, 1), 0);
    const char *rel;
    size_t rl;
    ck_assert(fe_stop_feed(&m, "abxcd", 5, &rel, &rl));
    ck_assert_uint_eq(rl, 2);
    ck_assert(fe_stop_feed(&m, "more", 4, &rel, &rl)); /* nothing after a match */
    ck_assert_uint_eq(rl, 0);
    fe_stop_flush(&m, &rel, &rl);
    ck_assert_uint_eq(rl, 0);
    fe_stop_fini(&m);
    /* no stop strings: everything passes at once */
    ck_assert_int_eq(fe_stop_init(&m, NULL, 0), 0);
    ck_assert(!fe_stop_feed(&m, "abc", 3, &rel, &rl));
    ck_assert_uint_eq(rl, 3);
    fe_stop_fini(&m);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fe_stop");
    TCase *tc = tcase_create("match");
    tcase_add_test(tc, every_cut);
    tcase_add_test(tc, after_match_and_limits);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(suite());
}
