#include "gpu-worker/hybrid_plan.h"
#include "gpu-worker/backend.h"
#include "common/base/err.h"
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)

START_TEST(slot_budget_arithmetic)
{
    /* 10 GiB free, 700 MiB reserve, 3 GiB of weights/KV/scratch; slots of 3 MiB in chunks of 64 */
    struct hyb_budget b = {.vram_free = 10240 * MIB,
                           .reserve = 700 * MIB,
                           .fixed = 3072 * MIB,
                           .slot_bytes = 3 * MIB,
                           .n_total = 100000,
                           .chunk_slots = 64};
    /* room 6468 MiB: 2156 slots of 3 MiB; 33 chunks of 64 (192 MiB each, 2 MiB-aligned) take
     * 6336 MiB, a last chunk of 44 slots 132 MiB: 2156 slots, 6468 MiB exactly */
    ck_assert_uint_eq(hyb_auto_slots(&b), 2156);
    /* slots of 3 MiB + 1 byte: each chunk rounds up to the next 2 MiB, so fewer fit */
    b.slot_bytes = 3 * MIB + 1;
    const uint32_t n = hyb_auto_slots(&b);
    ck_assert_uint_lt(n, 2156);
    uint64_t used = (uint64_t)(n / 64) * hyb_chunk_bytes(b.slot_bytes, 64) +
                    hyb_chunk_bytes(b.slot_bytes, n % 64);
    ck_assert_uint_le(used, 6468 * MIB);
    used += hyb_chunk_bytes(b.slot_bytes, n % 64 + 1) - hyb_chunk_bytes(b.slot_bytes, n % 64);
    ck_assert_uint_gt(used, 6468 * MIB); /* one more does not fit */
    b.slot_bytes = 3 * MIB;
    /* capped at the experts there are; nothing when the fixed part alone does not fit */
    b.n_total = 96;
    ck_assert_uint_eq(hyb_auto_slots(&b), 96);
    b.fixed = 9600 * MIB;
    ck_assert_uint_eq(hyb_auto_slots(&b), 0);
    b.fixed = 3072 * MIB;
    b.n_total = 100000;
    /* a count or a size is taken as asked (capped at n_total) */
    struct cache_spec s = {CACHE_SLOTS, 5000};
    ck_assert_uint_eq(hyb_plan_slots(&s, &b), 5000);
    s = (struct cache_spec){CACHE_BYTES, 300 * MIB};
    ck_assert_uint_eq(hyb_plan_slots(&s, &b), 100);
    s = (struct cache_spec){CACHE_AUTO, 0};
    ck_assert_uint_eq(hyb_plan_slots(&s, &b), 2156);
    /* the re-check: 500 MiB free after allocating, 200 short of the reserve: whole tail chunks go
     * (the last partial chunk of 44 slots is 132 MiB, then a full one of 192) */
    ck_assert_uint_eq(hyb_shrink_to(2156, 500 * MIB, &b), 2156 - 44 - 64);
    ck_assert_uint_eq(hyb_shrink_to(2156, 700 * MIB, &b), 2156);
    ck_assert_uint_eq(hyb_shrink_to(10, 0, &b), 0);
}
END_TEST

/* a split's buffers, n pairs a side */
struct sides {
    struct moe_group g[64], hg[64], pg[64], mg[64];
    int32_t pi[64], hi[64], ppi[64], mi[64];
    struct hyb_split s;
};

static void sides_init(struct sides *x)
{
    x->s = (struct hyb_split){.hit_groups = x->hg,
                              .pcie_groups = x->pg,
                              .miss_groups = x->mg,
                              .hit_idx = x->hi,
                              .pcie_idx = x->ppi,
                              .miss_idx = x->mi};
}

START_TEST(split_hits_and_misses)
{
    /* 5 tokens top-2 over 6 experts; 1, 3, 4 resident */
    const int32_t ids[10] = {1, 0, 3, 1, 1, 5, 0, 1, 1, 3};
    const int32_t slot_of[6] = {CACHE_NONE, 7, CACHE_NONE, 2, 0, CACHE_NONE};
    struct sides x;
    sides_init(&x);
    const int ng = hyb_split_layer(ids, 5, 2, 6, slot_of, NULL, NULL, false, 2, x.g, x.pi, &x.s);
    ck_assert_int_eq(ng, 4); /* experts 0, 1, 3, 5 */
    /* hits: expert 1 (pairs 0, 3, 4, 7, 8) cut at 2, then expert 3 (pairs 2, 9) */
    ck_assert_int_eq(x.s.n_hit, 4);
    ck_assert_uint_eq(x.s.hit_pairs, 7);
    const int32_t hit_idx[7] = {0, 3, 4, 7, 8, 2, 9};
    ck_assert(memcmp(x.s.hit_idx, hit_idx, sizeof hit_idx) == 0);
    ck_assert_int_eq(x.s.hit_groups[0].expert, 1);
    ck_assert_int_eq(x.s.hit_groups[2].count, 1);
    ck_assert_int_eq(x.s.hit_groups[2].first, 4);
    ck_assert_int_eq(x.s.hit_groups[3].expert, 3);
    ck_assert_int_eq(x.s.hit_groups[3].first, 5);
    /* misses whole, contiguous from 0: expert 0 (pairs 1, 6), expert 5 (pair 5) */
    ck_assert_int_eq(x.s.n_miss, 2);
    ck_assert_uint_eq(x.s.miss_pairs, 3);
    const int32_t miss_idx[3] = {1, 6, 5};
    ck_assert(memcmp(x.s.miss_idx, miss_idx, sizeof miss_idx) == 0);
    ck_assert_int_eq(x.s.miss_groups[1].first, 2);
    ck_assert_int_eq(x.s.n_pcie, 0);
    /* every pair is on exactly one side */
    int seen[10] = {0};
    for (uint32_t i = 0; i < x.s.hit_pairs; i++)
        seen[x.s.hit_idx[i]]++;
    for (uint32_t i = 0; i < x.s.miss_pairs; i++)
        seen[x.s.miss_idx[i]]++;
    for (int p = 0; p < 10; p++)
        ck_assert_int_eq(seen[p], 1);
    /* the gather: GPU rows stay, miss rows come from the block after the P rows in miss order */
    int32_t rows[10];
    hyb_gather_index(&x.s, 10, rows);
    const int32_t want[10] = {0, 10, 2, 3, 4, 12, 11, 7, 8, 9};
    ck_assert(memcmp(rows, want, sizeof want) == 0);
    /* nothing resident: all misses; everything resident: all hits */
    int32_t none[6], all[6];
    for (int e = 0; e < 6; e++)
        none[e] = CACHE_NONE, all[e] = e;
    hyb_split_layer(ids, 5, 2, 6, none, NULL, NULL, false, 16, x.g, x.pi, &x.s);
    ck_assert_uint_eq(x.s.miss_pairs, 10);
    ck_assert_int_eq(x.s.n_hit, 0);
    hyb_split_layer(ids, 5, 2, 6, all, NULL, NULL, false, 16, x.g, x.pi, &x.s);
    ck_assert_uint_eq(x.s.hit_pairs, 10);
    ck_assert_int_eq(x.s.n_miss, 0);
}
END_TEST

START_TEST(pcie_share_choice)
{
    /* 6 tokens top-2 over 8 experts, nothing resident: pairs per expert 0:1 2:4 3:3 5:2 6:2 */
    const int32_t ids[12] = {2, 3, 2, 5, 3, 6, 2, 0, 2, 3, 5, 6};
    int32_t none[8];
    for (int e = 0; e < 8; e++)
        none[e] = CACHE_NONE;
    uint8_t ok[8];
    memset(ok, 1, sizeof ok);
    struct sides x;
    sides_init(&x);
    /* decode: ceil(0.5 * 5 misses) = 3, most pairs first: experts 2 (4), 3 (3), then 5 (2, the
     * lower id of the tie with 6) */
    struct hyb_pcie_rule r = {0.5f, 0, 0};
    hyb_split_layer(ids, 6, 2, 8, none, ok, &r, false, 16, x.g, x.pi, &x.s);
    ck_assert_int_eq(x.s.n_pcie, 3);
    ck_assert_int_eq(x.s.pcie_groups[0].expert, 2);
    ck_assert_int_eq(x.s.pcie_groups[1].expert, 3);
    ck_assert_int_eq(x.s.pcie_groups[2].expert, 5);
    ck_assert_int_eq(x.s.n_miss, 2);
    ck_assert_int_eq(x.s.miss_groups[0].expert, 0);
    ck_assert_int_eq(x.s.miss_groups[1].expert, 6);
    ck_assert_uint_eq(x.s.pcie_pairs + x.s.miss_pairs, 12);
    /* an expert the GPU cannot reach (not registered) stays on the CPU, the next one goes */
    ok[3] = 0;
    hyb_split_layer(ids, 6, 2, 8, none, ok, &r, false, 16, x.g, x.pi, &x.s);
    ck_assert_int_eq(x.s.n_pcie, 3);
    ck_assert_int_eq(x.s.pcie_groups[1].expert, 5);
    ck_assert_int_eq(x.s.pcie_groups[2].expert, 6);
    ok[3] = 1;
    /* frac 0 or no host_ok: none; frac 1: every miss */
    r.frac = 0;
    hyb_split_layer(ids, 6, 2, 8, none, ok, &r, false, 16, x.g, x.pi, &x.s);
    ck_assert_int_eq(x.s.n_pcie, 0);
    r.frac = 1;
    hyb_split_layer(ids, 6, 2, 8, none, NULL, &r, false, 16, x.g, x.pi, &x.s);
    ck_assert_int_eq(x.s.n_pcie, 0);
    hyb_split_layer(ids, 6, 2, 8, none, ok, &r, false, 16, x.g, x.pi, &x.s);
    ck_assert_int_eq(x.s.n_miss, 0);
    ck_assert_uint_eq(x.s.pcie_pairs, 12);
    /* prompt chunks: the threshold, not the fraction: experts with >= 3 pairs (2 and 3) */
    r = (struct hyb_pcie_rule){0.0f, 3, 0};
    hyb_split_layer(ids, 6, 2, 8, none, ok, &r, true, 2, x.g, x.pi, &x.s);
    ck_assert_uint_eq(x.s.pcie_pairs, 7);
    ck_assert_int_eq(x.s.n_pcie, 4); /* cut at 2 pairs: 2+2, 2+1 */
    ck_assert_int_eq(x.s.n_miss, 3);
    r.threshold = 0;
    hyb_split_layer(ids, 6, 2, 8, none, ok, &r, true, 16, x.g, x.pi, &x.s);
    ck_assert_int_eq(x.s.n_pcie, 0);
    /* capped at 2 experts a layer (staging slots): the two with the most pairs, either way */
    r = (struct hyb_pcie_rule){1.0f, 1, 2};
    hyb_split_layer(ids, 6, 2, 8, none, ok, &r, false, 16, x.g, x.pi, &x.s);
    ck_assert_int_eq(x.s.n_pcie, 2);
    ck_assert_int_eq(x.s.pcie_groups[0].expert, 2);
    ck_assert_int_eq(x.s.pcie_groups[1].expert, 3);
    hyb_split_layer(ids, 6, 2, 8, none, ok, &r, true, 16, x.g, x.pi, &x.s);
    ck_assert_int_eq(x.s.n_pcie, 2);
    ck_assert_uint_eq(x.s.pcie_pairs, 7);
    ck_assert_uint_eq(x.s.miss_pairs, 5);
}
END_TEST

START_TEST(registration_set_only_grows)
{
    enum hyb_pin p;
    ck_assert_int_eq(hyb_pin_parse("whole", &p), 0);
    ck_assert_int_eq(p, HYB_PIN_WHOLE);
    ck_assert_int_eq(hyb_pin_parse("need", &p), 0);
    ck_assert_int_eq(hyb_pin_parse("none", &p), 0);
    ck_assert_str_eq(hyb_pin_name(p), "none");
    ck_assert_int_eq(hyb_pin_parse("all", &p), STRATA_EINVAL);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "whole, need or none"));
    struct hyb_pinset s;
    ck_assert_int_eq(hyb_pinset_init(6, &s), 0);
    uint32_t b;
    ck_assert(!hyb_pinset_next(&s, &b));
    ck_assert(hyb_pinset_want(&s, 4));
    ck_assert(hyb_pinset_want(&s, 1));
    ck_assert(!hyb_pinset_want(&s, 4)); /* queued once */
    ck_assert(!hyb_pinset_want(&s, 9)); /* out of range */
    ck_assert(hyb_pinset_next(&s, &b));
    ck_assert_uint_eq(b, 4); /* oldest first */
    ck_assert(!hyb_pinset_has(&s, 4));
    hyb_pinset_done(&s, 4, true);
    ck_assert(hyb_pinset_has(&s, 4));
    ck_assert(!hyb_pinset_want(&s, 4)); /* registered stays registered */
    ck_assert(hyb_pinset_next(&s, &b));
    ck_assert_uint_eq(b, 1);
    hyb_pinset_done(&s, 1, false);
    ck_assert(!hyb_pinset_want(&s, 1)); /* a failure is not retried */
    ck_assert(!hyb_pinset_has(&s, 1));
    hyb_pinset_done(&s, 2, true); /* never queued: ignored */
    ck_assert(!hyb_pinset_has(&s, 2));
    ck_assert_uint_eq(s.registered, 1);
    ck_assert_uint_eq(s.failed, 1);
    /* every blob once: the queue never overflows */
    for (uint32_t i = 0; i < 6; i++)
        hyb_pinset_want(&s, i);
    int n = 0;
    while (hyb_pinset_next(&s, &b))
        hyb_pinset_done(&s, b, true), n++;
    ck_assert_int_eq(n, 4);
    ck_assert_uint_eq(s.registered, 5);
    hyb_pinset_fini(&s);
}
END_TEST

START_TEST(landing_gives_bad_copies_slots_back)
{
    struct cache *c;
    ck_assert_int_eq(cache_init(2, 4, 3, 4096, &c), 0);
    /* the start's fill takes slots when posting (0: layer 0 expert 1, 1: layer 1 expert 2) */
    cache_assign(c, 0, 0, 1);
    cache_assign(c, 1, 1, 2);
    ck_assert(hyb_land(c, 0, 0, 1, true));
    ck_assert(!hyb_land(c, 1, 1, 2, false)); /* its copy failed: the slot goes back */
    cache_publish(c);
    ck_assert_int_eq(cache_slot(c, 0, 1), 0);
    ck_assert_int_eq(cache_slot(c, 1, 2), CACHE_NONE);
    ck_assert_uint_eq(cache_resident(c), 1);
    ck_assert_int_eq(cache_free_slot(c), 1);
    /* a tier move into a slot freed when its victim left: a failure leaves it free, a later good
     * copy of another expert takes it, and a stale failure report does not evict that one */
    ck_assert(!hyb_land(c, 1, 0, 3, false));
    ck_assert_int_eq(cache_free_slot(c), 1);
    ck_assert(hyb_land(c, 1, 1, 0, true));
    ck_assert(!hyb_land(c, 1, 0, 3, false));
    cache_publish(c);
    ck_assert_int_eq(cache_slot(c, 1, 0), 1);
    ck_assert_uint_eq(cache_resident(c), 2);
    cache_fini(c);
}
END_TEST

/* One VRAM budget: K/V grows in granules; when the budget is full the slot pool gives back the
 * fewest whole tail chunks that make room, and says how much is missing with none left. */
START_TEST(kv_growth_takes_slots)
{
    /* 32 KiB blocks in 2 MiB granules: 64 blocks a granule */
    ck_assert_uint_eq(hyb_kv_granules(32 << 10, 2 * MIB, 0), 0);
    ck_assert_uint_eq(hyb_kv_granules(32 << 10, 2 * MIB, 1), 1);
    ck_assert_uint_eq(hyb_kv_granules(32 << 10, 2 * MIB, 64), 1);
    ck_assert_uint_eq(hyb_kv_granules(32 << 10, 2 * MIB, 65), 2);
    ck_assert_uint_eq(hyb_kv_granules(3 << 10, 2 * MIB, 1000), 2); /* 3000 KiB: 2 granules */
    uint64_t sh = 1;
    /* slots of 3 MiB in chunks of 16: each chunk 48 MiB. 1000 MiB budget, 900 held */
    const uint64_t cb = hyb_chunk_bytes(3 * MIB, 16);
    ck_assert_uint_eq(cb, 48 * MIB);
    /* a growth that fits takes nothing */
    ck_assert_uint_eq(hyb_kv_take(1000 * MIB, 900 * MIB, 100 * MIB, 40, 3 * MIB, 16, &sh), 40);
    ck_assert_uint_eq(sh, 0);
    /* 1 byte over: the tail chunk goes (40 slots in 3 chunks: 32 kept) */
    ck_assert_uint_eq(hyb_kv_take(1000 * MIB, 900 * MIB, 100 * MIB + 1, 40, 3 * MIB, 16, &sh), 32);
    ck_assert_uint_eq(sh, 0);
    /* 49 MiB over: two chunks */
    ck_assert_uint_eq(hyb_kv_take(1000 * MIB, 900 * MIB, 149 * MIB, 40, 3 * MIB, 16, &sh), 16);
    /* more than every chunk frees: none kept, the shortfall named */
    ck_assert_uint_eq(hyb_kv_take(1000 * MIB, 900 * MIB, 300 * MIB, 40, 3 * MIB, 16, &sh), 0);
    ck_assert_uint_eq(sh, 200 * MIB - 3 * 48 * MIB);
    /* no slots at all: the whole growth past the budget is short */
    ck_assert_uint_eq(hyb_kv_take(1000 * MIB, 990 * MIB, 20 * MIB, 0, 3 * MIB, 16, &sh), 0);
    ck_assert_uint_eq(sh, 10 * MIB);
    /* a pool of whole chunks within a room: 100 MiB holds 2 chunks of 48 MiB */
    ck_assert_uint_eq(hyb_slots_within(100 * MIB, 3 * MIB, 16, 1000), 32);
    ck_assert_uint_eq(hyb_slots_within(100 * MIB, 3 * MIB, 16, 20), 20);
    ck_assert_uint_eq(hyb_slots_within(47 * MIB, 3 * MIB, 16, 1000), 0);
}
END_TEST

START_TEST(options_parse)
{
    struct backend_opts o = backend_opts_default();
    /* the defaults chosen on the H200: registered whole, prompt chunks over PCIe where it wins */
    ck_assert_uint_eq(o.pin, HYB_PIN_WHOLE);
    ck_assert_uint_eq(o.pcie_threshold, BACKEND_PCIE_AUTO);
    ck_assert_float_eq(o.pcie_frac, 0.0f);
    ck_assert_int_eq(backend_opt(&o, "pin", "need"), 0);
    ck_assert_uint_eq(o.pin, HYB_PIN_NEED);
    ck_assert_int_eq(backend_opt(&o, "pin", "whole"), 0);
    ck_assert_uint_eq(o.pin, HYB_PIN_WHOLE);
    ck_assert_int_eq(backend_opt(&o, "pin", "some"), STRATA_EINVAL);
    ck_assert_uint_eq(o.pin, HYB_PIN_WHOLE);
    ck_assert_int_eq(backend_opt(&o, "pcie-frac", "0.25"), 0);
    ck_assert_float_eq(o.pcie_frac, 0.25f);
    ck_assert_int_eq(backend_opt(&o, "pcie-frac", "1.5"), STRATA_EINVAL);
    ck_assert_int_eq(backend_opt(&o, "pcie-threshold", "8"), 0);
    ck_assert_uint_eq(o.pcie_threshold, 8);
    ck_assert_int_eq(backend_opt(&o, "pcie-threshold", "-1"), STRATA_EINVAL);
    ck_assert_int_eq(backend_opt(&o, "pcie-threshold", "auto"), 0);
    ck_assert_uint_eq(o.gpu, 0);
    ck_assert_int_eq(backend_opt(&o, "gpu", "1"), 0);
    ck_assert_uint_eq(o.gpu, 1);
    ck_assert_int_eq(backend_opt(&o, "gpu", "-1"), STRATA_EINVAL);
    ck_assert_int_eq(backend_opt(&o, "gpu", "x"), STRATA_EINVAL);
    ck_assert_int_eq(backend_opt(&o, "vram-mib", "20480"), 0);
    ck_assert_uint_eq(o.vram_mib, 20480);
    ck_assert_int_eq(backend_opt(&o, "vram-mib", "1.5"), STRATA_EINVAL);
    ck_assert_uint_eq(o.pcie_threshold, BACKEND_PCIE_AUTO);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hybrid_plan");
    TCase *tc = tcase_create("hybrid_plan");
    tcase_add_test(tc, slot_budget_arithmetic);
    tcase_add_test(tc, split_hits_and_misses);
    tcase_add_test(tc, pcie_share_choice);
    tcase_add_test(tc, registration_set_only_grows);
    tcase_add_test(tc, landing_gives_bad_copies_slots_back);
    tcase_add_test(tc, kv_growth_takes_slots);
    tcase_add_test(tc, options_parse);
    suite_add_tcase(s, tc);
    return test_run(s);
}
