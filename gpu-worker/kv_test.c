#include "gpu-worker/kv.h"
#include "common/base/err.h"
#include "gpu-worker/kv_store.h"
#include "common/quant/quant.h"
#include "tests/testutil.h"

#include <string.h>

static const struct kv_config cfg = {.n_layer = 2,
                                     .k_dim = 8,
                                     .v_dim = 4,
                                     .v_head = 2,
                                     .block_tokens = 4,
                                     .n_ctx = 20,
                                     .max_blocks = 6};

/* The bookkeeping holds no data: these tests keep rows in a host store beside it, as a backend
 * does, reserving storage for the ids handed out. */

/* put writes position p of layer l of s: K[i] = k0 + i, V[i] = v0 - i. */
static void put(struct kv_cache *kv, struct kv_store *st, struct kv_seq *s, uint32_t l, uint32_t p,
                float k0, float v0)
{
    ck_assert_int_eq(kv_store_reserve(st, kv_blocks_used_ever(kv)), 0);
    float k[8], v[4];
    for (uint32_t i = 0; i < 8; i++)
        k[i] = k0 + (float)i;
    for (uint32_t i = 0; i < 4; i++)
        v[i] = v0 - (float)i;
    kv_store_write(st, s, l, p, k, v);
}

/* k_at reads K[i] of position p of layer l of s through the attention view (head i / 4). */
static float k_at(const struct kv_store *st, const struct kv_seq *s, uint32_t l, uint32_t p,
                  uint32_t i)
{
    static _Alignas(64) unsigned char scratch[1 << 14];
    ck_assert_uint_le(kv_store_scratch_bytes(st, 4, 2), sizeof scratch);
    struct ops_kv_view v;
    kv_store_view(st, s, l, i / 4, 4, 2, s->n_tokens, scratch, &v);
    return v.blocks[p / 4][ops_kv_k_at(&v, p % 4, i % 4)];
}

START_TEST(rows_stay_put_across_growth)
{
    /* _i: the KV type; the values are integers fp16 holds exactly */
    const enum kv_type type = (enum kv_type)_i;
    struct kv_cache *kv;
    struct kv_store *st;
    ck_assert_int_eq(kv_init(&cfg, &kv), 0);
    ck_assert_int_eq(kv_store_init(&cfg, type, &st), 0);
    struct kv_seq s;
    kv_seq_init(&s);
    ck_assert_int_eq(kv_seq_resize(kv, &s, 3), 0);
    ck_assert_uint_eq(s.n_blocks, 1);
    for (uint32_t p = 0; p < 3; p++)
        for (uint32_t l = 0; l < 2; l++)
            put(kv, st, &s, l, p, 100.0f * l + 10 * p, -100.0f * l - 10 * p);
    ck_assert_int_eq(kv_seq_resize(kv, &s, 9), 0);
    ck_assert_uint_eq(s.n_blocks, 3);
    ck_assert_uint_eq(kv_blocks_free(kv), 3);
    ck_assert_uint_eq(kv_blocks_used_ever(kv), 3);
    for (uint32_t p = 3; p < 9; p++)
        for (uint32_t l = 0; l < 2; l++)
            put(kv, st, &s, l, p, 100.0f * l + 10 * p, -100.0f * l - 10 * p);
    /* Storage is made per block id used, in the type's size: 2 layers x 4 positions x 12. */
    ck_assert_uint_eq(kv_store_bytes(st), 3u * 2 * 4 * 12 * (type == KV_F16 ? 2 : 4));
    ck_assert_uint_eq(kv_pos_bytes(&cfg, type), 2u * 12 * (type == KV_F16 ? 2 : 4));
    /* Through the attention view, every row reads back what was written, K and V apart. */
    static _Alignas(64) unsigned char scratch[1 << 14];
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t h = 0; h < 2; h++) {
            struct ops_kv_view v;
            kv_store_view(st, &s, l, h, 4, 2, 9, scratch, &v);
            for (uint32_t p = 0; p < 9; p++) {
                const float *vr = v.blocks[p / 4] + v.v_off + (p % 4) * v.v_stride;
                ck_assert_float_eq(v.blocks[p / 4][ops_kv_k_at(&v, p % 4, 1)],
                                   100.0f * l + 10 * p + h * 4 + 1);
                ck_assert_float_eq(vr[1], -100.0f * l - 10 * p - h * 2 - 1);
            }
            /* the direct view: an fp32 store's is the same view, an fp16 store's its halves in
             * place (what cpu_attention reads) */
            struct ops_kv_view d;
            kv_store_view_direct(st, &s, l, h, 4, 2, 9, scratch, &d);
            ck_assert(type == KV_F16 ? d.hblocks && !d.blocks : d.blocks && !d.hblocks);
            /* K by columns: head h's keys of a block are its [4][block_tokens] array */
            ck_assert(d.k_cols && v.k_cols);
            ck_assert_uint_eq(d.k_off, (size_t)h * 4 * 4);
            /* V head by head: head h's rows of a block after K, [4][2] */
            ck_assert_uint_eq(d.v_off, 4 * 8 + (size_t)h * 4 * 2);
            ck_assert_uint_eq(d.v_stride, 2);
            for (uint32_t p = 0; p < 9; p++) {
                const size_t ko = ops_kv_k_at(&d, p % 4, 1), vo = d.v_off + (p % 4) * d.v_stride;
                const float kf =
                    type == KV_F16 ? quant_f16_to_f32(d.hblocks[p / 4][ko]) : d.blocks[p / 4][ko];
                const float vf = type == KV_F16 ? quant_f16_to_f32(d.hblocks[p / 4][vo + 1])
                                                : d.blocks[p / 4][vo + 1];
                ck_assert_float_eq(kf, 100.0f * l + 10 * p + h * 4 + 1);
                ck_assert_float_eq(vf, -100.0f * l - 10 * p - h * 2 - 1);
            }
        }
    kv_seq_fini(kv, &s);
    ck_assert_uint_eq(kv_blocks_free(kv), 6);
    kv_store_fini(st);
    kv_fini(kv);
}
END_TEST

START_TEST(f16_rounds_to_nearest_even)
{
    struct kv_cache *kv;
    struct kv_store *st;
    ck_assert_int_eq(kv_init(&cfg, &kv), 0);
    ck_assert_int_eq(kv_store_init(&cfg, KV_F16, &st), 0);
    struct kv_seq s;
    kv_seq_init(&s);
    ck_assert_int_eq(kv_seq_resize(kv, &s, 1), 0);
    /* 1 + 2^-11 is halfway between 1 and the next fp16 (1 + 2^-10): ties go to even, 1 */
    put(kv, st, &s, 0, 0, 1.0f + 1.0f / 2048, 0);
    ck_assert_float_eq(k_at(st, &s, 0, 0, 0), 1.0f);
    ck_assert_float_eq(k_at(st, &s, 0, 0, 1), 2.0f);
    kv_seq_fini(kv, &s);
    kv_store_fini(st);
    kv_fini(kv);
    ck_assert_int_eq(kv_type_parse("f16", &(enum kv_type){KV_F32}), 0);
    enum kv_type t;
    ck_assert_int_eq(kv_type_parse("q8_0", &t), STRATA_EINVAL);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "f32 or f16"));
}
END_TEST

START_TEST(limits_are_refused_and_leave_the_sequence_alone)
{
    struct kv_cache *kv;
    ck_assert_int_eq(kv_init(&cfg, &kv), 0);
    struct kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    ck_assert_int_eq(kv_seq_resize(kv, &a, 21), STRATA_ELIMIT);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "context of 20"));
    ck_assert_uint_eq(a.n_tokens, 0);
    ck_assert_int_eq(kv_seq_resize(kv, &a, 20), 0); /* 5 blocks */
    ck_assert_int_eq(kv_seq_resize(kv, &b, 5), STRATA_ENOSPC);
    ck_assert_uint_eq(b.n_tokens, 0);
    ck_assert_uint_eq(b.n_blocks, 0);
    /* Shrinking returns blocks: re-prefill from the middle. */
    ck_assert_int_eq(kv_seq_resize(kv, &a, 8), 0);
    ck_assert_uint_eq(a.n_blocks, 2);
    ck_assert_int_eq(kv_seq_resize(kv, &b, 16), 0);
    ck_assert_uint_eq(kv_blocks_free(kv), 0);
    kv_seq_fini(kv, &a);
    kv_seq_fini(kv, &b);
    kv_fini(kv);
    struct kv_config bad = cfg;
    bad.block_tokens = 0;
    ck_assert_int_eq(kv_init(&bad, &kv), STRATA_EINVAL);
    kv_fini(NULL);
}
END_TEST

/* fill writes a mark of (tag, pos) into every K row of s from position from. */
static void fill(struct kv_cache *kv, struct kv_store *st, struct kv_seq *s, uint32_t from,
                 float tag)
{
    for (uint32_t p = from; p < s->n_tokens; p++)
        for (uint32_t l = 0; l < 2; l++)
            put(kv, st, s, l, p, tag + p, 0);
}

START_TEST(prefix_blocks_are_shared_by_reference_and_evicted_last_released_last)
{
    struct kv_cache *kv;
    struct kv_store *st;
    ck_assert_int_eq(kv_init(&cfg, &kv), 0);
    ck_assert_int_eq(kv_store_init(&cfg, KV_F32, &st), 0);
    const int32_t ids[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    struct kv_seq a, b, c;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    ck_assert_int_eq(kv_seq_resize(kv, &a, 10), 0); /* blocks 0, 1 full; block 2 partial */
    fill(kv, st, &a, 0, 1000.0f);
    uint64_t k0 = kv_prefix_publish(kv, &a, 0, KV_PREFIX_ROOT, ids);
    uint64_t k1 = kv_prefix_publish(kv, &a, 1, k0, ids + 4);
    ck_assert_uint_eq(k0, kv_prefix_hash(KV_PREFIX_ROOT, ids, 4));
    ck_assert(k1 != k0);
    ck_assert_uint_eq(kv_blocks_free(kv), 3);
    ck_assert_uint_eq(kv_blocks_cached(kv), 0); /* held by a: not free */

    /* b shares both blocks (no new block taken) and reads a's rows. */
    uint32_t n;
    uint64_t key;
    ck_assert_int_eq(kv_prefix_attach(kv, &b, ids, 12, 8, &n, &key), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(key, k1);
    ck_assert_uint_eq(b.n_tokens, 8);
    ck_assert_uint_eq(b.blocks[1], a.blocks[1]);
    ck_assert_float_eq(k_at(st, &b, 1, 6, 0), 1006.0f);
    ck_assert_uint_eq(kv_blocks_free(kv), 3);
    /* A different second block matches only the first; max_blocks caps the match. */
    int32_t other[8] = {1, 2, 3, 4, 5, 6, 7, 99};
    ck_assert_int_eq(kv_prefix_attach(kv, &c, other, 8, 8, &n, &key), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(key, k0);
    ck_assert_int_eq(kv_prefix_attach(kv, &c, ids, 8, 8, &n, &key), STRATA_EINVAL);
    kv_seq_fini(kv, &c);
    ck_assert_int_eq(kv_prefix_attach(kv, &c, ids, 8, 1, &n, &key), 0);
    ck_assert_uint_eq(n, 1);
    kv_seq_fini(kv, &c);

    /* Released by both, the published blocks stay cached and count as free; a's private third
     * block goes back to the pool. */
    kv_seq_fini(kv, &a);
    ck_assert_uint_eq(kv_blocks_cached(kv), 0);
    kv_seq_fini(kv, &b);
    ck_assert_uint_eq(kv_blocks_cached(kv), 2);
    ck_assert_uint_eq(kv_blocks_free(kv), 6);
    ck_assert_int_eq(kv_prefix_attach(kv, &b, ids, 12, 8, &n, &key), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_float_eq(k_at(st, &b, 0, 3, 0), 1003.0f);
    kv_seq_fini(kv, &b);

    /* Taking the whole pool evicts the cache: the block released first (block 1 of b's table is
     * released before block 0, so block 1 goes first) and then the other. */
    ck_assert_int_eq(kv_seq_resize(kv, &a, 20), 0); /* 5 blocks: 4 never used + 1 evicted */
    ck_assert_uint_eq(kv_blocks_cached(kv), 1);
    ck_assert_int_eq(kv_prefix_attach(kv, &b, ids, 12, 8, &n, &key), 0);
    ck_assert_uint_eq(n, 1);
    kv_seq_fini(kv, &b);
    ck_assert_int_eq(kv_seq_resize(kv, &c, 4), 0);
    ck_assert_uint_eq(kv_blocks_cached(kv), 0);
    ck_assert_uint_eq(kv_blocks_free(kv), 0);
    ck_assert_int_eq(kv_prefix_attach(kv, &b, ids, 12, 8, &n, &key), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(key, KV_PREFIX_ROOT);
    kv_seq_fini(kv, &a);
    kv_seq_fini(kv, &b);
    kv_seq_fini(kv, &c);
    ck_assert_uint_eq(kv_blocks_free(kv), 6);
    kv_store_fini(st);
    kv_fini(kv);
}
END_TEST

START_TEST(a_duplicate_prefix_stays_private)
{
    struct kv_cache *kv;
    struct kv_store *st;
    ck_assert_int_eq(kv_init(&cfg, &kv), 0);
    ck_assert_int_eq(kv_store_init(&cfg, KV_F32, &st), 0);
    const int32_t ids[4] = {7, 7, 7, 7};
    struct kv_seq a, b, c;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    ck_assert_int_eq(kv_seq_resize(kv, &a, 4), 0);
    ck_assert_int_eq(kv_seq_resize(kv, &b, 4), 0);
    fill(kv, st, &a, 0, 100.0f);
    fill(kv, st, &b, 0, 200.0f);
    uint64_t ka = kv_prefix_publish(kv, &a, 0, KV_PREFIX_ROOT, ids);
    ck_assert_uint_eq(kv_prefix_publish(kv, &b, 0, KV_PREFIX_ROOT, ids), ka);
    ck_assert_uint_eq(kv_prefix_publish(kv, &a, 0, KV_PREFIX_ROOT, ids), ka);
    kv_seq_fini(kv, &b); /* private: straight back to the pool */
    ck_assert_uint_eq(kv_blocks_cached(kv), 0);
    uint32_t n;
    uint64_t key;
    ck_assert_int_eq(kv_prefix_attach(kv, &c, ids, 4, 8, &n, &key), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_float_eq(k_at(st, &c, 0, 2, 0), 102.0f);
    kv_seq_fini(kv, &a);
    kv_seq_fini(kv, &c);
    ck_assert_uint_eq(kv_blocks_cached(kv), 1);
    kv_store_fini(st);
    kv_fini(kv);
}
END_TEST

/* One budget: the pool is set to what a budget holds; it shrinks only past the blocks no sequence
 * holds (cached ones leave the prefix cache), and grows back to the configured size. */
START_TEST(the_pool_follows_its_budget)
{
    struct kv_cache *kv;
    ck_assert_int_eq(kv_init(&cfg, &kv), 0);
    ck_assert_uint_eq(kv_blocks_cap(kv), 6);
    ck_assert_int_eq(kv_set_max_blocks(kv, 3), 0);
    ck_assert_uint_eq(kv_config_of(kv)->max_blocks, 3);
    ck_assert_uint_eq(kv_blocks_free(kv), 3);
    struct kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    ck_assert_int_eq(kv_seq_resize(kv, &a, 8), 0); /* blocks 0, 1 */
    ck_assert_int_eq(kv_seq_resize(kv, &b, 8), STRATA_ENOSPC); /* one block left of 3 */
    ck_assert_int_eq(kv_set_max_blocks(kv, 7), STRATA_EINVAL);
    ck_assert_int_eq(kv_set_max_blocks(kv, 6), 0);
    ck_assert_int_eq(kv_seq_resize(kv, &b, 12), 0); /* blocks 2, 3, 4 */
    ck_assert_uint_eq(kv_blocks_used_ever(kv), 5);
    /* b's blocks are held: the pool cannot shrink below them */
    ck_assert_int_eq(kv_set_max_blocks(kv, 2), STRATA_EBUSY);
    ck_assert_uint_eq(kv_config_of(kv)->max_blocks, 6);
    ck_assert_uint_eq(kv_blocks_used_ever(kv), 5);
    /* b's first block published, then b released: block 2 is cached, 3 and 4 free */
    const int32_t ids[4] = {1, 2, 3, 4};
    kv_prefix_publish(kv, &b, 0, KV_PREFIX_ROOT, ids);
    kv_seq_fini(kv, &b);
    ck_assert_uint_eq(kv_blocks_cached(kv), 1);
    ck_assert_int_eq(kv_set_max_blocks(kv, 2), 0);
    ck_assert_uint_eq(kv_blocks_cached(kv), 0); /* the cached block was past the cut */
    ck_assert_uint_eq(kv_blocks_used_ever(kv), 2);
    ck_assert_uint_eq(kv_blocks_free(kv), 0);
    uint32_t n;
    uint64_t key;
    ck_assert_int_eq(kv_prefix_attach(kv, &b, ids, 4, 1, &n, &key), 0);
    ck_assert_uint_eq(n, 0);
    /* grown back, the trimmed ids are handed out again, lowest first */
    ck_assert_int_eq(kv_set_max_blocks(kv, 6), 0);
    ck_assert_int_eq(kv_seq_resize(kv, &b, 4), 0);
    ck_assert_uint_eq(b.blocks[0], 2);
    /* kv_trim alone keeps the pool's size */
    kv_seq_fini(kv, &b);
    ck_assert_int_eq(kv_trim(kv, 2), 0);
    ck_assert_uint_eq(kv_blocks_used_ever(kv), 2);
    ck_assert_uint_eq(kv_blocks_free(kv), 4);
    kv_seq_fini(kv, &a);
    kv_fini(kv);
}
END_TEST

/* Segment mode: the rows live in memory lent in segments; a segment moved (bytes copied, its
 * new address given) keeps every row; ids past the segments are refused. */
START_TEST(rows_in_lent_segments)
{
    struct kv_cache *kv;
    ck_assert_int_eq(kv_init(&cfg, &kv), 0);
    struct kv_store *st;
    ck_assert_int_eq(kv_store_init(&cfg, KV_F32, &st), 0);
    /* a piece (one block's layer) is 4 * (8 + 4) floats = 192 bytes, 64-aligned: 3 in 600 bytes */
    ck_assert_int_eq(kv_store_use_segments(st, 100), STRATA_EINVAL);
    ck_assert_int_eq(kv_store_use_segments(st, 600), 0);
    ck_assert_int_eq(kv_store_use_segments(st, 600), STRATA_ESTATE);
    ck_assert_uint_eq(kv_store_segments_for(st, 1), 1); /* 2 pieces */
    ck_assert_uint_eq(kv_store_segments_for(st, 2), 2); /* 4 pieces */
    ck_assert_uint_eq(kv_store_segments_for(st, 3), 2);
    ck_assert_uint_eq(kv_store_blocks_in(st, 2), 3);
    static _Alignas(64) uint8_t mem[2][640], moved[640];
    struct kv_seq s;
    kv_seq_init(&s);
    ck_assert_int_eq(kv_seq_resize(kv, &s, 12), 0); /* 3 blocks */
    ck_assert_int_eq(kv_store_reserve(st, 3), STRATA_ENOSPC);
    kv_store_set_segment(st, 0, mem[0]);
    kv_store_set_segment(st, 1, mem[1]);
    ck_assert_uint_eq(kv_store_segments(st), 2);
    ck_assert_uint_eq(kv_store_bytes(st), 1200);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t p = 0; p < 12; p++)
            put(kv, st, &s, l, p, (float)(100 * l + p), (float)p);
    memcpy(moved, mem[1], sizeof moved);
    memset(mem[1], 0xa5, sizeof mem[1]);
    kv_store_set_segment(st, 1, moved);
    ck_assert_ptr_eq(kv_store_segment(st, 1), moved);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t p = 0; p < 12; p++)
            for (uint32_t i = 0; i < 8; i++)
                ck_assert_float_eq(k_at(st, &s, l, p, i), (float)(100 * l + p + i));
    kv_seq_fini(kv, &s);
    ck_assert_int_eq(kv_trim(kv, 1), 0);
    kv_store_drop_segments(st, kv_store_segments_for(st, 1));
    ck_assert_uint_eq(kv_store_segments(st), 1);
    kv_store_fini(st);
    kv_fini(kv);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv");
    TCase *tc = tcase_create("kv");
    tcase_add_loop_test(tc, rows_stay_put_across_growth, KV_F32, KV_F16 + 1);
    tcase_add_test(tc, f16_rounds_to_nearest_even);
    tcase_add_test(tc, limits_are_refused_and_leave_the_sequence_alone);
    tcase_add_test(tc, prefix_blocks_are_shared_by_reference_and_evicted_last_released_last);
    tcase_add_test(tc, a_duplicate_prefix_stays_private);
    tcase_add_test(tc, the_pool_follows_its_budget);
    tcase_add_test(tc, rows_in_lent_segments);
    suite_add_tcase(s, tc);
    return test_run(s);
}
