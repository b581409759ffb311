/* trace_test — the LRU replay and the popularity figures on synthetic traces with answers worked
 * out by hand, trace_push's checks, recording from a tiny fixture (uniform and zipf-skewed routers:
 * the skewed one must show it), independence from the thread count, and `strata trace`.
 * The policy replay: LRU and LFU against hand-worked rounds (with and without copy lag), static
 * equal to the profile's share on a stationary stream, Belady at or above every policy on a
 * drifting stream, and the demo model over tinyshakespeare when ../shared/data is there. */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/arena/model.h"
#include "launcher/cmd.h"
#include "common/tok/tok.h"
#include "tests/testutil.h"
#include "tools/fixture.h"
#include "tools/perplexity.h"
#include "tools/trace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const struct strata_cmd strata_cmd_trace;

static const char *tmp_path(const char *name)
{
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", test_tmpdir(), name);
    return buf;
}

/* one_layer builds a 1-layer trace with n_used experts per token from the list. */
static void one_layer(struct trace *t, uint32_t n_expert, uint32_t n_used, const uint16_t *sel,
                      size_t n_tokens)
{
    ck_assert_int_eq(trace_init(t, 1, n_expert, n_used), 0);
    for (size_t k = 0; k < n_tokens; k++)
        ck_assert_int_eq(trace_push(t, sel + k * n_used), 0);
}

START_TEST(test_lru_known)
{
    struct trace t;
    uint64_t acc;
    /* A B A C B A through 2 slots: only the second A hits. */
    const uint16_t s1[] = {0, 1, 0, 2, 1, 0};
    one_layer(&t, 4, 1, s1, 6);
    ck_assert_uint_eq(trace_lru(&t, 0, 2, &acc), 1);
    ck_assert_uint_eq(acc, 6);
    ck_assert_uint_eq(trace_lru(&t, 0, 3, &acc), 3); /* A, B, A all stay: hits at 3, 5, 6 */
    ck_assert_uint_eq(trace_lru(&t, 0, 0, &acc), 0);
    trace_fini(&t);
    /* A cycle one longer than the cache: LRU's worst case, never a hit. */
    uint16_t s2[12];
    for (int i = 0; i < 12; i++)
        s2[i] = (uint16_t)(i % 3);
    one_layer(&t, 8, 1, s2, 12);
    ck_assert_uint_eq(trace_lru(&t, 0, 2, &acc), 0);
    ck_assert_uint_eq(trace_lru(&t, 0, 3, &acc), 9);
    ck_assert_uint_eq(trace_lru(&t, 0, 8, &acc), 9); /* more slots than experts: only cold misses */
    trace_fini(&t);
    /* Two experts a token, taken in ascending order: {0,1} {2,3} {0,2}. 2 slots: {0,1} -> {2,3}
     * -> 0 evicts 2, then 2 evicts 3: no hit. 3 slots: {0,1,2} -> 3 evicts 0 -> 0 evicts 1 ->
     * 2 hits. */
    const uint16_t s3[] = {0, 1, 2, 3, 0, 2};
    one_layer(&t, 4, 2, s3, 3);
    ck_assert_uint_eq(trace_lru(&t, 0, 2, &acc), 0);
    ck_assert_uint_eq(acc, 6);
    ck_assert_uint_eq(trace_lru(&t, 0, 3, &acc), 1);
    trace_fini(&t);
}
END_TEST

static const struct trace_replay_opts replay_1 = {
    .window = 1, .lag = 0, .tier = {.every = 1, .swaps = 1, .decay = 1, .min_count = 1, .lead = 1}};

static uint64_t replay(const struct trace *t, enum trace_policy p, uint32_t slots,
                       const struct trace_replay_opts *o)
{
    uint64_t hits, acc;
    ck_assert_msg(trace_replay(t, p, slots, o, &hits, &acc) == 0, "%s: %s", trace_policy_name(p),
                  strata_errdetail());
    ck_assert_uint_eq(acc, t->n_tokens * t->n_layer * t->n_used);
    return hits;
}

START_TEST(test_replay_known)
{
    /* 1 layer of 4 experts, 2 slots filled evenly with {0, 1}; a round after every window moves
     * at most one expert. The sequence 2 2 0 3 3 1 2 3:
     * LRU, landing at once: 2 misses (2 for 0) | 2 hits | 0 misses (0 for 1: 1 unused) | 3
     * misses (3 for 2) | 3 hits | 1 misses (1 for 0) | 2 misses (2 for 3) | 3 misses: 2 hits.
     * LFU: 2 misses (2 for 0) | 2 hits | 0 misses (0 for 1) | 3 misses (1 use ties 0's: stays
     * out) | 3 misses (2 uses beat 0's 1: 3 for 0) | 1 misses (1 use loses to 2 and 3) | 2 hits
     * | 3 hits: 3 hits.
     * LRU with a lag of 1: the victim leaves at once and its replacement lands a window later, so
     * each expert arrives one window after the one it would have hit: no hit at all. */
    struct trace t;
    const uint16_t seq[] = {2, 2, 0, 3, 3, 1, 2, 3};
    one_layer(&t, 4, 1, seq, 8);
    ck_assert_uint_eq(replay(&t, TRACE_LRU, 2, &replay_1), 2);
    ck_assert_uint_eq(replay(&t, TRACE_LFU, 2, &replay_1), 3);
    struct trace_replay_opts lag = replay_1;
    lag.lag = 1;
    ck_assert_uint_eq(replay(&t, TRACE_LRU, 2, &lag), 0);
    /* Static holds the two hottest, 2 and 3 (3 uses each): 6 of 8. Without rounds every dynamic
     * policy keeps the even fill {0, 1}: 0 and 1 are used once each. */
    ck_assert_uint_eq(replay(&t, TRACE_STATIC, 2, &replay_1), 6);
    struct trace_replay_opts none = replay_1;
    none.tier.every = 0;
    for (int p = 0; p < TRACE_N_POLICY; p++)
        if (p != TRACE_STATIC) ck_assert_uint_eq(replay(&t, (enum trace_policy)p, 2, &none), 2);
    /* Belady, each round against the next uses: 2 misses (2, next at 1, for 1, next at 5) | 2
     * hits (3 for 2) | 0 hits (1 for 0, never used again) | 3 hits (2 at 6 loses to 1 at 5) |
     * 3 hits (2 for 3, next at 7) | 1 hits (3 for 1) | 2 hits | 3 hits: 7, at least the rest. */
    ck_assert_uint_eq(replay(&t, TRACE_BELADY, 2, &replay_1), 7);
    for (int p = 0; p < TRACE_N_POLICY; p++)
        ck_assert_uint_ge(replay(&t, TRACE_BELADY, 2, &replay_1),
                          replay(&t, (enum trace_policy)p, 2, &replay_1));
    /* Every slot: all hit from the start. */
    ck_assert_uint_eq(replay(&t, TRACE_LRU, 4, &replay_1), 8);
    uint64_t hits, acc;
    struct trace_replay_opts bad = replay_1;
    bad.window = 0;
    ck_assert_int_eq(trace_replay(&t, TRACE_LRU, 2, &bad, &hits, &acc), STRATA_EINVAL);
    ck_assert_int_eq(trace_replay(&t, TRACE_LRU, 5, &replay_1, &hits, &acc), STRATA_EINVAL);
    trace_fini(&t);
}
END_TEST

/* draw_token picks n_used distinct experts per layer from weights w (n_expert of them, shifted by
 * `shift` places), ascending, into sel. */
static void draw_token(struct test_rng *r, const double *w, uint32_t n_layer, uint32_t n_expert,
                       uint32_t n_used, uint32_t shift, uint16_t *sel)
{
    for (uint32_t l = 0; l < n_layer; l++) {
        uint16_t *s = sel + l * n_used;
        for (uint32_t j = 0; j < n_used;) {
            double u = test_unif(r), acc = 0;
            uint32_t e = 0;
            for (; e + 1 < n_expert; e++) {
                acc += w[e];
                if (u < acc) break;
            }
            e = (e + shift + l) % n_expert;
            bool dup = false;
            for (uint32_t k = 0; k < j; k++)
                dup |= s[k] == e;
            if (!dup) s[j++] = (uint16_t)e;
        }
        for (uint32_t a = 1; a < n_used; a++) /* insertion sort: n_used is small */
            for (uint32_t b = a; b && s[b - 1] > s[b]; b--) {
                uint16_t x = s[b];
                s[b] = s[b - 1];
                s[b - 1] = x;
            }
    }
}

static void zipf_weights(double *w, uint32_t n, double s)
{
    double sum = 0;
    for (uint32_t e = 0; e < n; e++)
        sum += w[e] = pow(e + 1, -s);
    for (uint32_t e = 0; e < n; e++)
        w[e] /= sum;
}

static int desc_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

START_TEST(test_replay_static_share)
{
    /* A stationary stream: every token draws one expert a layer from the same zipf(1.0) over 16
     * (rotated a place in layer 1). Static holds the trace's hottest experts, so its hit rate is
     * their share of the pairs, exactly, and within sampling noise of the profile's mass: the
     * top weights, each (layer, expert) drawn with w[e] / 2 of the pairs. */
    enum { NL = 2, NE = 16, NU = 1, NT = 20000 };
    struct test_rng r = {0x5eed};
    double w[NE];
    zipf_weights(w, NE, 1.0);
    struct trace t;
    ck_assert_int_eq(trace_init(&t, NL, NE, NU), 0);
    uint16_t sel[NL * NU];
    for (int k = 0; k < NT; k++) {
        draw_token(&r, w, NL, NE, NU, 0, sel);
        ck_assert_int_eq(trace_push(&t, sel), 0);
    }
    uint64_t all[NL * NE], total = (uint64_t)NT * NL * NU;
    for (uint32_t l = 0; l < NL; l++)
        trace_counts(&t, l, all + l * NE);
    qsort(all, NL * NE, sizeof *all, desc_u64);
    const struct trace_replay_opts o = {.window = 1, .lag = 1, .tier = TIER_OPTS_DEFAULT};
    for (uint32_t slots = 2; slots <= NL * NE; slots += 6) {
        uint64_t share = 0;
        for (uint32_t k = 0; k < slots; k++)
            share += all[k];
        ck_assert_uint_eq(replay(&t, TRACE_STATIC, slots, &o), share);
        double mass = 0; /* w descends, each weight twice: the top slots are w[0], w[0], w[1].. */
        for (uint32_t k = 0; k < slots; k++)
            mass += w[k / NL] / NL;
        ck_assert_msg(fabs((double)share / (double)total - mass) < 0.015,
                      "%u slots: static %.4f, profile %.4f", slots, (double)share / (double)total,
                      mass);
    }
    trace_fini(&t);
}
END_TEST

START_TEST(test_replay_chunk_rule)
{
    /* Prompt chunks of 32 tokens, 4 of 8 experts a token, the hot ones at 4, 5, .. (zipf 1.0
     * shifted by 4) while the even fill holds 0 and 1: every expert shows up in every chunk, so
     * counted once a chunk (the worker's rule) they all look alike and the tier never leaves the
     * cold fill; counted by their share of the chunk it sees the skew and comes near static. */
    enum { NE = 8, NU = 4, NT = 4096 };
    struct test_rng r = {0xc4a9};
    double w[NE];
    zipf_weights(w, NE, 1.0);
    struct trace t;
    ck_assert_int_eq(trace_init(&t, 1, NE, NU), 0);
    uint16_t sel[NU];
    for (int k = 0; k < NT; k++) {
        draw_token(&r, w, 1, NE, NU, 4, sel);
        ck_assert_int_eq(trace_push(&t, sel), 0);
    }
    struct trace_replay_opts o = {.window = 32, .lag = 1, .tier = TIER_OPTS_DEFAULT};
    const struct trace_replay_opts no_rounds = {.window = 32, .tier = {.every = 0}};
    const uint64_t once = replay(&t, TRACE_TIER, 2, &o),
                   fill = replay(&t, TRACE_LRU, 2, &no_rounds);
    o.chunk_share = true;
    const uint64_t share = replay(&t, TRACE_TIER, 2, &o), fixed = replay(&t, TRACE_STATIC, 2, &o);
    ck_assert_msg(once == fill && share > fixed * 9 / 10,
                  "tier once %llu (the fill %llu), share %llu, static %llu",
                  (unsigned long long)once, (unsigned long long)fill, (unsigned long long)share,
                  (unsigned long long)fixed);
    trace_fini(&t);
}
END_TEST

START_TEST(test_replay_belady_bound)
{
    /* A drifting stream: zipf(1.2) over 32 experts whose hot ones move by 5 places every 300
     * tokens, 3 layers, 4 experts a token. Belady with bypass bounds every policy at each size,
     * with and without a copy lag, decode windows and prompt chunks. */
    enum { NL = 3, NE = 32, NU = 4, NT = 3000 };
    struct test_rng r = {0xbe1ad7};
    double w[NE];
    zipf_weights(w, NE, 1.2);
    struct trace t;
    ck_assert_int_eq(trace_init(&t, NL, NE, NU), 0);
    uint16_t sel[NL * NU];
    for (int k = 0; k < NT; k++) {
        draw_token(&r, w, NL, NE, NU, (uint32_t)(k / 300) * 5, sel);
        ck_assert_int_eq(trace_push(&t, sel), 0);
    }
    const uint32_t sizes[] = {10, 24, 48};
    struct trace_replay_opts o = {.window = 1, .lag = 1, .tier = TIER_OPTS_DEFAULT};
    o.tier.swaps = 8;
    for (uint32_t lag = 0; lag <= 2; lag++)
        for (uint32_t window = 1; window <= 16; window *= 16)
            for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
                o.lag = lag;
                o.window = window;
                const uint64_t best = replay(&t, TRACE_BELADY, sizes[k], &o);
                for (int p = 0; p < TRACE_N_POLICY; p++) {
                    const uint64_t h = replay(&t, (enum trace_policy)p, sizes[k], &o);
                    ck_assert_msg(best >= h,
                                  "%u slots, lag %u, window %u: %s hits %llu > belady %llu",
                                  sizes[k], lag, window, trace_policy_name((enum trace_policy)p),
                                  (unsigned long long)h, (unsigned long long)best);
                }
            }
    trace_fini(&t);
}
END_TEST

START_TEST(test_replay_demo_text)
{
    /* The demo model over the first 2,000 tokens of tinyshakespeare (the text stays in
     * ../shared/data: skipped when it is absent), the defaults: Belady bounds every policy, the
     * tier beats LRU's rounds and does not beat the trace's own hottest set. */
    const char *text = test_data_path("text/tinyshakespeare.txt");
    if (!text) return;
    char model[1024];
    snprintf(model, sizeof model, "%s/models/demo.gguf", STRATA_SOURCE_DIR);
    struct gguf_file *g;
    struct model *m;
    struct tok *tk;
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(gguf_open(model, &g), 0);
    ck_assert_int_eq(model_load(g, &m), 0);
    ck_assert_int_eq(tok_from_gguf(g, NULL, &tk), 0);
    ck_assert_int_eq(ppl_read_tokens(text, false, tk, &ids, &n), 0);
    ck_assert_uint_ge(n, 2000);
    struct trace t;
    ck_assert_int_eq(trace_init(&t, m->hp.n_layer, m->hp.n_expert, m->hp.n_expert_used), 0);
    ck_assert_int_eq(trace_record(m, ids, 2000, 256, 2, &t), 0);
    const struct trace_replay_opts o = {.window = 1, .lag = 1, .tier = TIER_OPTS_DEFAULT};
    const uint32_t N = t.n_layer * t.n_expert;
    for (uint32_t pct = 10; pct <= 50; pct += 20) {
        const uint32_t slots = N * pct / 100;
        uint64_t h[TRACE_N_POLICY];
        for (int p = 0; p < TRACE_N_POLICY; p++)
            h[p] = replay(&t, (enum trace_policy)p, slots, &o);
        for (int p = 0; p < TRACE_N_POLICY; p++)
            ck_assert_uint_ge(h[TRACE_BELADY], h[p]);
        ck_assert_msg(h[TRACE_TIER] > h[TRACE_LRU] && h[TRACE_TIER] <= h[TRACE_STATIC],
                      "%u%%: tier %llu, lru %llu, static %llu", pct,
                      (unsigned long long)h[TRACE_TIER], (unsigned long long)h[TRACE_LRU],
                      (unsigned long long)h[TRACE_STATIC]);
    }
    trace_fini(&t);
    free(ids);
    tok_fini(tk);
    model_fini(m);
    gguf_close(g);
}
END_TEST

START_TEST(test_popularity)
{
    struct trace t;
    uint64_t c[4];
    const uint16_t even[] = {0, 1, 2, 3, 0, 1, 2, 3};
    one_layer(&t, 4, 1, even, 8);
    trace_counts(&t, 0, c);
    ck_assert(c[0] == 2 && c[1] == 2 && c[2] == 2 && c[3] == 2);
    ck_assert_double_eq_tol(trace_entropy(&t, 0), 2.0, 1e-12);
    trace_fini(&t);
    const uint16_t half[] = {1, 3, 1, 3};
    one_layer(&t, 4, 2, half, 2);
    trace_counts(&t, 0, c);
    ck_assert(c[0] == 0 && c[1] == 2 && c[2] == 0 && c[3] == 2);
    ck_assert_double_eq_tol(trace_entropy(&t, 0), 1.0, 1e-12);
    trace_fini(&t);
    const uint16_t one[] = {2, 2, 2};
    one_layer(&t, 4, 1, one, 3);
    ck_assert_double_eq_tol(trace_entropy(&t, 0), 0.0, 1e-12);
    trace_fini(&t);
    /* Two layers keep their own counts. */
    ck_assert_int_eq(trace_init(&t, 2, 4, 1), 0);
    const uint16_t tok[] = {3, 0};
    ck_assert_int_eq(trace_push(&t, tok), 0);
    trace_counts(&t, 1, c);
    ck_assert(c[0] == 1 && c[3] == 0);
    trace_fini(&t);
}
END_TEST

START_TEST(test_push_checks)
{
    struct trace t;
    ck_assert_int_eq(trace_init(&t, 1, 4, 5), STRATA_EINVAL);
    ck_assert_int_eq(trace_init(&t, 0, 4, 1), STRATA_EINVAL);
    ck_assert_int_eq(trace_init(&t, 1, 70000, 1), STRATA_EINVAL);
    ck_assert_int_eq(trace_init(&t, 1, 4, 2), 0);
    const uint16_t unsorted[] = {2, 1}, dup[] = {1, 1}, big[] = {1, 4}, ok[] = {0, 3};
    ck_assert_int_eq(trace_push(&t, unsorted), STRATA_EINVAL);
    ck_assert_int_eq(trace_push(&t, dup), STRATA_EINVAL);
    ck_assert_int_eq(trace_push(&t, big), STRATA_EINVAL);
    ck_assert_int_eq(trace_push(&t, ok), 0);
    ck_assert_uint_eq(t.n_tokens, 1);
    trace_fini(&t);
}
END_TEST

static void record(const char *name, double zipf, uint32_t threads, struct trace *t,
                   struct model **mout, struct gguf_file **gout)
{
    const char *path = tmp_path(name);
    struct fixture_opts o = {.type = "f32", .seed = 3, .zipf = zipf, .threads = 1};
    ck_assert_msg(fixture_write(&o, path) == 0, "fixture: %s", strata_errdetail());
    ck_assert_int_eq(gguf_open(path, gout), 0);
    ck_assert_int_eq(model_load(*gout, mout), 0);
    const struct model_hparams *hp = &(*mout)->hp;
    int32_t ids[96];
    for (int i = 0; i < 96; i++)
        ids[i] = (int32_t)((i * 131 + 7) % hp->n_vocab);
    ck_assert_int_eq(trace_init(t, hp->n_layer, hp->n_expert, hp->n_expert_used), 0);
    model_expert_fn before = (*mout)->expert_part;
    ck_assert_msg(trace_record(*mout, ids, 96, 40, threads, t) == 0, "trace_record: %s",
                  strata_errdetail());
    ck_assert_ptr_eq((void *)(*mout)->expert_part, (void *)before); /* m is left as it was */
    ck_assert_uint_eq(t->n_tokens, 96);
}

START_TEST(test_record)
{
    struct trace even, skew, skew2;
    struct model *m1, *m2;
    struct gguf_file *g1, *g2;
    record("uniform.gguf", 0, 2, &even, &m1, &g1);
    record("zipf.gguf", 2.0, 1, &skew, &m2, &g2);
    const double max_h = log2((double)even.n_expert);
    for (uint32_t l = 0; l < even.n_layer; l++) {
        uint64_t c[256], sum = 0;
        trace_counts(&even, l, c);
        for (uint32_t e = 0; e < even.n_expert; e++)
            sum += c[e];
        ck_assert_uint_eq(sum, 96 * even.n_used);
        /* A zipf(2) router piles tokens on few experts: lower entropy, more LRU hits. */
        double he = trace_entropy(&even, l), hs = trace_entropy(&skew, l);
        ck_assert_msg(hs < he - 0.3, "layer %u: entropy %.3f (zipf) vs %.3f (uniform)", l, hs, he);
        ck_assert(he <= max_h + 1e-9 && he > 0.5 * max_h);
        uint64_t acc, slots = even.n_expert / 4 ? even.n_expert / 4 : 1;
        ck_assert_uint_gt(trace_lru(&skew, l, (uint32_t)slots, &acc),
                          trace_lru(&even, l, (uint32_t)slots, &acc));
    }
    /* The routing does not depend on the thread count. */
    uint32_t nl = skew.n_layer, ne = skew.n_expert, nu = skew.n_used;
    ck_assert_int_eq(trace_init(&skew2, nl, ne, nu), 0);
    int32_t ids[96];
    for (int i = 0; i < 96; i++)
        ids[i] = (int32_t)((i * 131 + 7) % m2->hp.n_vocab);
    ck_assert_int_eq(trace_record(m2, ids, 96, 40, 3, &skew2), 0);
    ck_assert(memcmp(skew.sel, skew2.sel, 96 * (size_t)nl * nu * sizeof *skew.sel) == 0);
    ids[5] = (int32_t)m2->hp.n_vocab;
    ck_assert_int_eq(trace_record(m2, ids, 96, 40, 1, &skew2), STRATA_EINVAL);
    ck_assert_int_eq(trace_record(m2, ids, 4, 0, 1, &skew2), STRATA_EINVAL);
    trace_fini(&even);
    trace_fini(&skew);
    trace_fini(&skew2);
    model_fini(m1);
    model_fini(m2);
    gguf_close(g1);
    gguf_close(g2);
}
END_TEST

START_TEST(test_save_load)
{
    /* Round trips at one byte an id (64 experts) and two (300), the window kept; then files that
     * are not traces: another magic, cut short, a byte too many, an id out of order. */
    const uint32_t sizes[2] = {64, 300};
    for (int k = 0; k < 2; k++) {
        struct trace t, u;
        ck_assert_int_eq(trace_init(&t, 3, sizes[k], 4), 0);
        for (uint32_t i = 0; i < 50; i++) {
            uint16_t sel[12];
            for (uint32_t l = 0; l < 3; l++)
                for (uint32_t j = 0; j < 4; j++)
                    sel[l * 4 + j] = (uint16_t)((i * 7 + l * 3) % (sizes[k] - 4) + j * 1);
            ck_assert_int_eq(trace_push(&t, sel), 0);
        }
        ck_assert_int_eq(trace_save(&t, 37, tmp_path("rt.trace")), 0);
        uint32_t ctx = 0;
        ck_assert_int_eq(trace_load(tmp_path("rt.trace"), &u, &ctx), 0);
        ck_assert_uint_eq(ctx, 37);
        ck_assert(u.n_layer == 3 && u.n_expert == sizes[k] && u.n_used == 4 && u.n_tokens == 50);
        ck_assert(memcmp(t.sel, u.sel, 50 * 12 * sizeof *t.sel) == 0);
        trace_fini(&u);
        trace_fini(&t);
    }
    size_t len;
    char *raw = test_read_file(tmp_path("rt.trace"), &len); /* 300 experts: u16 ids */
    ck_assert_ptr_nonnull(raw);
    ck_assert_uint_eq(len, 36 + 50 * 12 * 2);
    struct trace u;
    struct {
        size_t keep;       /* bytes written */
        size_t at;         /* a byte changed, or SIZE_MAX */
        unsigned char was; /* its new value */
    } bad[] = {{len, 0, 'X'},
               {len - 1, SIZE_MAX, 0},
               {20, SIZE_MAX, 0},
               {len + 1, SIZE_MAX, 0},
               {len, 36 + 2, 0}}; /* the second id of the first row drops below the first */
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        FILE *f = fopen(tmp_path("bad.trace"), "wb");
        for (size_t i = 0; i < bad[b].keep; i++)
            fputc(i == bad[b].at ? bad[b].was : i < len ? (unsigned char)raw[i] : 0, f);
        fclose(f);
        ck_assert_msg(trace_load(tmp_path("bad.trace"), &u, NULL) == STRATA_EFORMAT, "case %zu", b);
        ck_assert_ptr_null(u.sel);
    }
    ck_assert_int_ne(trace_load(tmp_path("absent.trace"), &u, NULL), 0);
    free(raw);
}
END_TEST

START_TEST(test_reuse_known)
{
    /* A B A A C B (one layer, top-1): A is reused after 2 tokens and after 1, B after 4.
     * Independent picks with A's 3/6, B's 2/6: A's 2 gaps fall at 1 with probability 1/2, in
     * [2, 3] with 1/2 - 1/8, B's one gap at 1 with 1/3. */
    struct trace t;
    const uint16_t seq[] = {0, 1, 0, 0, 2, 1};
    one_layer(&t, 4, 1, seq, 6);
    uint64_t h[TRACE_REUSE_BUCKETS] = {0};
    double iid[TRACE_REUSE_BUCKETS] = {0}, sum = 0;
    trace_reuse(&t, 0, h, iid);
    ck_assert(h[0] == 1 && h[1] == 1 && h[2] == 1);
    for (int b = 3; b < TRACE_REUSE_BUCKETS; b++)
        ck_assert_uint_eq(h[b], 0);
    for (int b = 0; b < TRACE_REUSE_BUCKETS; b++)
        sum += iid[b];
    ck_assert_double_eq_tol(sum, 3.0, 1e-9); /* every gap somewhere, the last bucket open */
    ck_assert_double_eq_tol(iid[0], 2 * 0.5 + 1.0 / 3, 1e-9);
    ck_assert_double_eq_tol(iid[1], 2 * (0.5 - 0.125) + (2.0 / 3 - 8.0 / 27), 1e-9);
    trace_fini(&t);
    /* A stream that repeats each token's expert (locality beyond popularity): more reuse at 1
     * than independent picks of the same popularity would give. */
    uint16_t rep[64];
    for (int i = 0; i < 64; i++)
        rep[i] = (uint16_t)((i / 4) % 8);
    one_layer(&t, 8, 1, rep, 64);
    memset(h, 0, sizeof h);
    memset(iid, 0, sizeof iid);
    trace_reuse(&t, 0, h, iid);
    ck_assert_uint_eq(h[0], 48);
    ck_assert(iid[0] < 10.0);
    trace_fini(&t);
}
END_TEST

START_TEST(test_replay_learned)
{
    /* The benchmark MoE's routing (docs/benchmark-moe.md: 8 layers of 64 experts, top-8,
     * trained; scripts/train-moe.py traced 16,384 held-out tokens), replayed at 10/25/50% with
     * the defaults: Belady bounds every policy; the figures are printed (docs/cache.md's table). */
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/traces/benchmark-moe.trace", STRATA_SOURCE_DIR);
    struct trace t;
    uint32_t ctx;
    if (access(path, R_OK) != 0) {
        printf("SKIP learned routing: %s absent (scripts/train-moe-run makes it)\n", path);
        return;
    }
    ck_assert_msg(trace_load(path, &t, &ctx) == 0, "%s", strata_errdetail());
    ck_assert(t.n_layer == 8 && t.n_expert == 64 && t.n_used == 8 && t.n_tokens >= 4096);
    const struct trace_replay_opts o = {.window = 1, .lag = 1, .tier = TIER_OPTS_DEFAULT};
    const uint32_t N = t.n_layer * t.n_expert, pct[3] = {10, 25, 50};
    for (int k = 0; k < 3; k++) {
        const uint32_t slots = (N * pct[k] + 50) / 100;
        uint64_t h[TRACE_N_POLICY];
        printf("learned routing, %u%% (%u slots):", pct[k], slots);
        for (int p = 0; p < TRACE_N_POLICY; p++) {
            h[p] = replay(&t, (enum trace_policy)p, slots, &o);
            printf(" %s %.1f%%", trace_policy_name((enum trace_policy)p),
                   100.0 * (double)h[p] / (double)(t.n_tokens * t.n_layer * t.n_used));
        }
        printf("\n");
        for (int p = 0; p < TRACE_N_POLICY; p++)
            ck_assert_msg(h[TRACE_BELADY] >= h[p], "%u%%: %s %llu > belady %llu", pct[k],
                          trace_policy_name((enum trace_policy)p), (unsigned long long)h[p],
                          (unsigned long long)h[TRACE_BELADY]);
    }
    /* temporal locality beyond popularity: the next token reuses a layer's expert more often
     * than independent picks of the same popularity would (docs/cache.md: 19.3% against 15.8%) */
    uint64_t hist[TRACE_REUSE_BUCKETS] = {0};
    double iid[TRACE_REUSE_BUCKETS] = {0};
    for (uint32_t l = 0; l < t.n_layer; l++)
        trace_reuse(&t, l, hist, iid);
    ck_assert_msg((double)hist[0] > 1.1 * iid[0], "reuse at 1 token: %llu, independent %.0f",
                  (unsigned long long)hist[0], iid[0]);
    const char *cmd[] = {"trace", "--replay", path, "--json", "--sizes", "25"};
    ck_assert_int_eq(strata_cmd_trace.run(6, (char **)cmd), 0);
    trace_fini(&t);
}
END_TEST

START_TEST(test_command)
{
    struct fixture_opts o = {.type = "f32", .threads = 1};
    char model[1024], text[1024];
    snprintf(model, sizeof model, "%s", tmp_path("cmd.gguf"));
    snprintf(text, sizeof text, "%s", tmp_path("cmd.txt"));
    ck_assert_int_eq(fixture_write(&o, model), 0);
    FILE *f = fopen(text, "wb");
    fputs("The keeper climbed the hundred steps and lit the lamp.", f);
    fclose(f);
    const char *ok[] = {"trace", model, text, "--threads", "2"};
    ck_assert_int_eq(strata_cmd_trace.run(5, (char **)ok), 0);
    const char *js[] = {"trace", model, text, "--json", "--max-tokens", "5", "--ctx", "4"};
    ck_assert_int_eq(strata_cmd_trace.run(8, (char **)js), 0);
    const char *bad[] = {"trace", model, text, "--ctx", "0"};
    ck_assert_int_eq(strata_cmd_trace.run(5, (char **)bad), 2);
    const char *odd[] = {"trace", model, text, "--ids"}; /* text is not a whole number of ids */
    ck_assert_int_eq(strata_cmd_trace.run(4, (char **)odd), 1);
    const char *pol[] = {"trace", model,           text, "--sizes",  "5,100", "--lag",
                         "0",     "--adapt-every", "2",  "--window", "3",     "--chunk-rule",
                         "share", "--json"};
    ck_assert_int_eq(strata_cmd_trace.run(14, (char **)pol), 0);
    const char *bad_rule[] = {"trace", model, text, "--chunk-rule", "twice"};
    ck_assert_int_eq(strata_cmd_trace.run(5, (char **)bad_rule), 2);
    const char *bad_sizes[] = {"trace", model, text, "--sizes", "0,50"};
    ck_assert_int_eq(strata_cmd_trace.run(5, (char **)bad_sizes), 2);
    const char *bad_decay[] = {"trace", model, text, "--adapt-decay", "2"};
    ck_assert_int_eq(strata_cmd_trace.run(5, (char **)bad_decay), 2);
    /* --save, then --replay: the same report; --replay takes no model or text */
    const char *sv[] = {"trace", model, text, "--save", tmp_path("cmd.trace"), "--ctx", "8"};
    ck_assert_int_eq(strata_cmd_trace.run(7, (char **)sv), 0);
    struct trace t;
    uint32_t ctx;
    ck_assert_int_eq(trace_load(tmp_path("cmd.trace"), &t, &ctx), 0);
    ck_assert(ctx == 8 && t.n_tokens > 5);
    trace_fini(&t);
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", tmp_path("cmd.trace"));
    const char *rp[] = {"trace", "--replay", saved, "--sizes", "25"};
    ck_assert_int_eq(strata_cmd_trace.run(5, (char **)rp), 0);
    const char *rp_model[] = {"trace", model, "--replay", saved};
    ck_assert_int_eq(strata_cmd_trace.run(4, (char **)rp_model), 2);
    const char *rp_save[] = {"trace", "--replay", saved, "--save", saved};
    ck_assert_int_eq(strata_cmd_trace.run(5, (char **)rp_save), 2);
    const char *rp_bad[] = {"trace", "--replay", text}; /* not a trace */
    ck_assert_int_eq(strata_cmd_trace.run(3, (char **)rp_bad), 1);
    const char *help[] = {"trace", "--help"};
    ck_assert_int_eq(strata_cmd_trace.run(2, (char **)help), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("trace");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_lru_known);
    tcase_add_test(tc, test_replay_known);
    tcase_add_test(tc, test_replay_static_share);
    tcase_add_test(tc, test_replay_chunk_rule);
    tcase_add_test(tc, test_replay_belady_bound);
    tcase_add_test(tc, test_replay_demo_text);
    tcase_add_test(tc, test_popularity);
    tcase_add_test(tc, test_push_checks);
    tcase_add_test(tc, test_record);
    tcase_add_test(tc, test_save_load);
    tcase_add_test(tc, test_reuse_known);
    tcase_add_test(tc, test_command);
    suite_add_tcase(s, tc);
    /* 16,384 tokens through every policy at three sizes: seconds here, more under ASan */
    TCase *learned = tcase_create("learned");
    tcase_set_timeout(learned, 240);
    tcase_add_test(learned, test_replay_learned);
    suite_add_tcase(s, learned);
    return test_run(s);
}
