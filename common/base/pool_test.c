/* pool_test — every item of every loop runs exactly once, on up to n_threads threads, across many
 * back-to-back loops (workers spinning) and after idle gaps (workers asleep); each thread starts
 * on its own contiguous share. */
#include "common/base/pool.h"
#include "tests/testutil.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct count {
    _Atomic uint32_t *hits;
    _Atomic uint32_t seen_thread[8];
};

static void mark(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct count *c = ctx;
    ck_assert_uint_lt(lo, hi);
    atomic_fetch_add(&c->seen_thread[thread], 1);
    for (uint32_t i = lo; i < hi; i++)
        atomic_fetch_add(&c->hits[i], 1);
}

START_TEST(every_item_once)
{
    static const uint32_t sizes[] = {0, 1, 2, 7, 64, 1000, 4097};
    for (uint32_t th = 1; th <= 4; th++) {
        struct pool *p;
        ck_assert_int_eq(pool_start(th, &p), 0);
        ck_assert_uint_eq(pool_threads(p), th);
        for (int rep = 0; rep < 200; rep++) {
            const uint32_t n = sizes[rep % 7], grain = 1 + rep % 5;
            struct count c = {.hits = calloc(n + 1, sizeof(uint32_t))};
            pool_for(p, n, grain, mark, &c);
            for (uint32_t i = 0; i < n; i++)
                ck_assert_uint_eq(c.hits[i], 1);
            for (uint32_t t = th; t < 8; t++)
                ck_assert_uint_eq(c.seen_thread[t], 0);
            free((void *)c.hits);
            if (rep % 50 == 49) usleep(2 * POOL_SPIN_US); /* let the workers fall asleep */
        }
        pool_close(p);
    }
    pool_close(NULL);
}
END_TEST

static void slow(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    usleep(1000);
    mark(ctx, lo, hi, thread);
}

START_TEST(workers_share_the_items)
{
    /* 1 ms items on 2 threads: the worker must take some, whichever core it lands on */
    struct pool *p;
    ck_assert_int_eq(pool_start(2, &p), 0);
    struct count c = {.hits = calloc(64, sizeof(uint32_t))};
    pool_for(p, 64, 1, slow, &c);
    ck_assert_uint_gt(c.seen_thread[1], 0);
    ck_assert_uint_eq(c.seen_thread[0] + c.seen_thread[1], 64);
    free((void *)c.hits);
    pool_close(p);
}
END_TEST

struct firsts {
    _Atomic uint32_t first[3]; /* each thread's first item, + 1 (0: none yet) */
};

static void note_first(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct firsts *f = ctx;
    ck_assert_uint_lt(thread, 3);
    uint32_t none = 0;
    if (!atomic_compare_exchange_strong(&f->first[thread], &none, lo + 1)) return;
    /* Each thread holds its first item until all three have claimed one (or 10 s have gone by,
     * so a broken pool fails the assertions rather than hangs): whatever the scheduler does,
     * no thread can have run out of its own share and taken another's first. */
    for (int i = 0; i < 10000; i++) {
        if (atomic_load(&f->first[0]) && atomic_load(&f->first[1]) && atomic_load(&f->first[2]))
            break;
        usleep(1000);
    }
    (void)hi;
}

START_TEST(each_thread_starts_its_own_range)
{
    /* 3 threads, 96 items: the caller starts at item 0, the workers at 32 and 64, so each walks
     * consecutive items (a matmul thread's rows, its prefetch running on into the next). */
    struct pool *p;
    ck_assert_int_eq(pool_start(3, &p), 0);
    for (int rep = 0; rep < 20; rep++) {
        struct firsts f = {{0, 0, 0}};
        pool_for(p, 96, 1, note_first, &f);
        ck_assert_uint_eq(f.first[0], 1);
        ck_assert_uint_eq(f.first[1], 33);
        ck_assert_uint_eq(f.first[2], 65);
        if (rep % 4 == 3) usleep(20000); /* and after the workers have gone to sleep */
    }
    pool_close(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("pool");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, every_item_once);
    tcase_add_test(tc, workers_share_the_items);
    tcase_add_test(tc, each_thread_starts_its_own_range);
    suite_add_tcase(s, tc);
    return test_run(s);
}
