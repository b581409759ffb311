#include "common/base/pool.h"
#include "common/base/err.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

struct worker {
    struct pool *p;
    uint32_t index; /* 1..n_threads-1 */
};

/* A loop's description. Two slots, used by alternate loops: a worker late by a loop or more may
 * still read the older slot, but its claim on items fails because the generation moved on. */
struct job {
    _Atomic(pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic uint32_t n, grain;
};

/* A thread's share of a loop: the next item of its own contiguous range, on a line of its own.
 * (gen & 0xffffffff) << 32 | item, so a claim made for an older loop fails. */
struct cursor {
    _Alignas(64) _Atomic uint64_t next;
};

struct pool {
    uint32_t n_threads, started;
    pthread_t *th;
    struct worker *w;
    struct cursor *cur; /* n_threads of them */
    struct job jobs[2];
    _Atomic uint64_t gen;  /* loops started */
    _Atomic uint32_t done; /* items finished in the current loop */
    _Atomic uint32_t sleeping;
    _Atomic bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* range: thread t's share of a loop of n items in chunks of grain, [*lo, *hi): whole chunks, in
 * thread order, so each thread's items are consecutive (a matmul thread's rows follow each other,
 * and its prefetch past one item runs into the next). */
static void range(uint32_t n, uint32_t grain, uint32_t t, uint32_t threads, uint32_t *lo,
                  uint32_t *hi)
{
    const uint64_t chunks = (n + (uint64_t)grain - 1) / grain;
    const uint64_t c0 = chunks * t / threads, c1 = chunks * (t + 1) / threads;
    *lo = (uint32_t)(c0 * grain < n ? c0 * grain : n);
    *hi = (uint32_t)(c1 * grain < n ? c1 * grain : n);
}

/* work claims chunks of loop g, first from the calling thread's own range, then from the others'
 * (a thread that got a core to itself does the share of one that did not), until none is left
 * or another loop has started. */
static void work(struct pool *p, uint64_t g, uint32_t thread)
{
    struct job *j = &p->jobs[g & 1];
    const pool_fn fn = atomic_load(&j->fn);
    void *ctx = atomic_load(&j->ctx);
    const uint32_t n = atomic_load(&j->n), grain = atomic_load(&j->grain);
    const uint64_t tag = (g & 0xffffffffu) << 32;
    for (uint32_t k = 0; k < p->n_threads; k++) {
        const uint32_t owner = (thread + k) % p->n_threads;
        uint32_t start, end;
        range(n, grain, owner, p->n_threads, &start, &end);
        _Atomic uint64_t *c = &p->cur[owner].next;
        uint64_t v = atomic_load(c);
        for (;;) {
            if ((v & ~(uint64_t)0xffffffffu) != tag) return;
            const uint32_t lo = (uint32_t)v;
            if (lo >= end) break;
            const uint32_t hi = end - lo < grain ? end : lo + grain;
            if (!atomic_compare_exchange_weak(c, &v, tag | hi)) continue;
            fn(ctx, lo, hi, thread);
            atomic_fetch_add(&p->done, hi - lo);
            v = atomic_load(c);
        }
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct pool *p = w->p;
    uint64_t seen = 0;
    for (;;) {
        double t0 = now_us();
        for (uint32_t i = 1; atomic_load(&p->gen) == seen && !atomic_load(&p->stop); i++) {
            cpu_relax();
            if (i % 256 == 0 && now_us() - t0 > POOL_SPIN_US) break;
        }
        if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleeping, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load(&p->gen);
        work(p, seen, w->index);
    }
}
int pool_start(uint32_t n_threads, struct pool **out)
{
    int rv = 0;
    struct pool *p = calloc(1, sizeof *p);
    if (!p) return strata_errf(STRATA_ENOMEM, "out of memory for a thread pool");
    p->n_threads = n_threads ? n_threads : 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->th = calloc(p->n_threads, sizeof *p->th);
    p->w = calloc(p->n_threads, sizeof *p->w);
    p->cur = aligned_alloc(64, p->n_threads * sizeof *p->cur);
    if (!p->th || !p->w || !p->cur) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for %u threads", p->n_threads);
        goto fail;
    }
    for (uint32_t i = 1; i < p->n_threads; i++) {
        p->w[i] = (struct worker){p, i};
        int e = pthread_create(&p->th[i], NULL, worker_main, &p->w[i]);
        if (e) {
            rv = strata_errf(strata_errno(e),
                             "cannot start compute thread %u of %u: lower "
                             "--threads",
                             i + 1, p->n_threads);
            goto fail;
        }
        p->started++;
    }
    *out = p;
    return 0;
fail:
    pool_close(p);
    return rv;
}

void pool_close(struct pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i <= p->started; i++)
        pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->th);
    free(p->w);
    free(p->cur);
    free(p);
}

uint32_t pool_threads(const struct pool *p)
{
    return p->n_threads;
}

void pool_for(struct pool *p, uint32_t n, uint32_t grain, pool_fn fn, void *ctx)
{
    if (!grain) grain = 1;
    if (p->started == 0 || n <= grain) {
        if (n) fn(ctx, 0, n, 0);
        return;
    }
    const uint64_t g = atomic_load(&p->gen) + 1;
    struct job *j = &p->jobs[g & 1];
    atomic_store(&j->fn, fn);
    atomic_store(&j->ctx, ctx);
    atomic_store(&j->n, n);
    atomic_store(&j->grain, grain);
    atomic_store(&p->done, 0);
    for (uint32_t t = 0; t < p->n_threads; t++) {
        uint32_t lo, hi;
        range(n, grain, t, p->n_threads, &lo, &hi);
        atomic_store(&p->cur[t].next, (g & 0xffffffffu) << 32 | lo);
    }
    atomic_store(&p->gen, g);
    if (atomic_load(&p->sleeping)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    work(p, g, 0);
    /* only chunks already claimed remain: wait for them, not for every worker to check in */
    while (atomic_load(&p->done) < n)
        cpu_relax();
}
