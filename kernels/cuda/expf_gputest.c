/* The GPU's expf (strata_expf, expf.cuh) against this host's libm on every one of the 2^32 floats
 * (STRATA_EXPF_STEP=2^k for every 2^k-th, when a quicker run will do), and the start-up check the
 * CUDA backend runs (cu_expf_check). NaN equals any NaN. Needs a GPU: label "gpu". */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/base/err.h"
#include "common/base/pool.h"
#include "kernels/cuda/expf.h"
#include "tests/testutil.h"

enum { CHUNK = 1 << 26 };

struct cmp {
    uint32_t first, step;
    const float *y;
    uint64_t bad[256]; /* per pool thread */
    uint32_t bad_at[256];
};

static void cmp_range(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct cmp *c = ctx;
    for (uint32_t i = lo; i < hi; i++) {
        const uint32_t u = c->first + i * c->step;
        float x;
        memcpy(&x, &u, 4);
        const float e = expf(x);
        if (memcmp(&e, &c->y[i], 4) != 0 && !(isnan(e) && isnan(c->y[i]))) {
            if (!c->bad[thread]) c->bad_at[thread] = u;
            c->bad[thread]++;
        }
    }
}

START_TEST(every_float_equals_libm)
{
    const char *st = getenv("STRATA_EXPF_STEP");
    const uint32_t step = st ? (uint32_t)strtoul(st, NULL, 0) : 1;
    ck_assert_msg(step && !(step & (step - 1)), "STRATA_EXPF_STEP=%s: a power of two", st);
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    struct pool *p;
    ck_assert_int_eq(pool_start(nc < 1 ? 1 : nc > 256 ? 256 : (uint32_t)nc, &p), 0);
    float *d, *h;
    ck_assert_int_eq(cudaMalloc((void **)&d, CHUNK * sizeof(float)), cudaSuccess);
    ck_assert_int_eq(cudaMallocHost((void **)&h, CHUNK * sizeof(float)), cudaSuccess);
    static struct cmp c;
    const uint64_t total = (1ull << 32) / step;
    uint64_t bad = 0;
    uint32_t bad_at = 0;
    const double t0 = clock() / (double)CLOCKS_PER_SEC;
    struct timespec w0, w1;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    for (uint64_t k = 0; k < total; k += CHUNK) {
        const uint32_t n = (uint32_t)(total - k < CHUNK ? total - k : CHUNK);
        memset(&c, 0, sizeof c);
        c.first = (uint32_t)(k * step);
        c.step = step;
        c.y = h;
        ck_assert_int_eq(cu_expf_sweep(c.first, step, n, d, NULL), 0);
        ck_assert_int_eq(cudaMemcpy(h, d, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost),
                         cudaSuccess);
        pool_for(p, n, 1 << 16, cmp_range, &c);
        for (uint32_t t = 0; t < pool_threads(p); t++) {
            if (c.bad[t] && !bad) bad_at = c.bad_at[t];
            bad += c.bad[t];
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &w1);
    printf("expf: %llu floats (every %u-th) on the GPU against libm, %llu differ, %.1f s (%u "
           "host threads, %.0f s CPU)\n",
           (unsigned long long)total, step, (unsigned long long)bad,
           (double)(w1.tv_sec - w0.tv_sec) + (w1.tv_nsec - w0.tv_nsec) * 1e-9, pool_threads(p),
           clock() / (double)CLOCKS_PER_SEC - t0);
    float x;
    memcpy(&x, &bad_at, 4);
    ck_assert_msg(bad == 0, "%llu floats differ, the first expf(%a) = %a", (unsigned long long)bad,
                  x, expf(x));
    cudaFreeHost(h);
    cudaFree(d);
    pool_close(p);
}
END_TEST

START_TEST(startup_check_passes)
{
    uint64_t bad = 1;
    float x = 0;
    ck_assert_int_eq(cu_expf_check(1u << 11, &bad, &x), 0);
    ck_assert_msg(bad == 0, "%llu differ, the first at %a", (unsigned long long)bad, x);
    ck_assert_int_eq(cu_expf_check(3, &bad, &x), STRATA_EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("expf_gpu");
    TCase *tc = tcase_create("expf_gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, startup_check_passes);
    tcase_add_test(tc, every_float_equals_libm);
    suite_add_tcase(s, tc);
    return test_run(s);
}
