/* grammar_bench_test — the synthetic vocabulary is distinct tokens of the asked count with the 256
 * bytes first, and a bench run generates sentences and counts its mask walks and cache hits. */
#include "common/grammar/grammar.h"
#include "tests/testutil.h"
#include "tools/grammar_bench.h"

#include <check.h>
#include <string.h>

START_TEST(synthetic_vocabulary_and_a_run)
{
    struct grammar_vocab *v;
    ck_assert_int_eq(gbench_synthetic_vocab(5000, 1, &v), 0);
    ck_assert_uint_eq(grammar_vocab_size(v), 5000);
    /* the 256 byte tokens come first (id = byte), so any text can be written token by token */
    struct grammar *g;
    const char *gbnf = "root ::= \"{\" [a-z ]* \"}\"\n";
    ck_assert_int_eq(grammar_parse(gbnf, strlen(gbnf), &g), 0);
    struct grammar_matcher *m;
    ck_assert_int_eq(grammar_matcher_init(g, v, &m), 0);
    uint32_t mask[(5000 + 31) / 32];
    ck_assert_int_eq(grammar_matcher_mask_into(m, mask), 0);
    ck_assert((mask['{' >> 5] >> ('{' & 31)) & 1);
    ck_assert(!((mask['a' >> 5] >> ('a' & 31)) & 1));
    grammar_matcher_fini(m);
    grammar_fini(g);
    struct gbench_result r;
    ck_assert_int_eq(gbench_run(v, "root ::= \"[\" [0-9]+ (\",\" [0-9]+)* \"]\"\n", 8, 50, 3, &r),
                     0);
    ck_assert_uint_eq(r.requests, 8);
    ck_assert_uint_gt(r.tokens, 8);
    ck_assert_uint_eq(r.masks_built + r.mask_hits, r.tokens);
    ck_assert_uint_gt(r.mask_hits, 0); /* later answers find the first ones' masks */
    ck_assert(r.mean_us > 0 && r.p50_us <= r.p99_us && r.p99_us <= r.max_us);
    ck_assert_int_ne(gbench_run(v, "root ::= (", 1, 10, 1, &r), 0);
    grammar_vocab_fini(v);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grammar_bench");
    TCase *tc = tcase_create("bench");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, synthetic_vocabulary_and_a_run);
    suite_add_tcase(s, tc);
    return test_run(s);
}
