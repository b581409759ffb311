#include "gpu-worker/copy.h"
#include "common/base/err.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct job {
    uint64_t ticket, after;
    uint32_t slot, n;
    struct copy_extent x[COPY_MAX_EXTENTS];
    struct job *next;
};

struct copy_engine {
    uint8_t *slots;
    uint64_t slot_bytes;
    uint32_t n_slots;
    struct copy_hooks hooks;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* work posted, a window done, stop */
    pthread_cond_t done_cv;  /* a copy completed */
    struct job *head, *tail; /* FIFO */
    uint64_t next_ticket;    /* the next ticket handed out (from 1) */
    uint64_t completed;      /* tickets below or equal completed */
    int *result;             /* ring of results by ticket, RESULTS deep */
    uint64_t window_done;
    uint64_t released; /* hooks.defer: tickets up to it may start (waited for) */
    bool stop;
    struct copy_stats st;
};

#define RESULTS 4096 /* results kept for copy_done; a ticket older than this reads as 0 */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* runnable: whether job j may start now (its window finished, and released when deferred). */
static bool runnable(const struct copy_engine *ce, const struct job *j)
{
    return j->after <= ce->window_done && !(ce->hooks.defer && j->ticket > ce->released);
}

static void *run(void *arg)
{
    struct copy_engine *ce = arg;
    pthread_mutex_lock(&ce->mu);
    for (;;) {
        struct job *j = ce->head;
        if (!j || !runnable(ce, j)) {
            if (ce->stop && !j) break;
            pthread_cond_wait(&ce->cv, &ce->mu);
            continue;
        }
        ce->head = j->next;
        if (!ce->head) ce->tail = NULL;
        pthread_mutex_unlock(&ce->mu);
        /* decided under the lock; the copy runs outside it */
        int rv = ce->hooks.fail ? ce->hooks.fail(ce->hooks.ctx, j->slot, j->ticket) : 0;
        uint64_t bytes = 0;
        double t0 = now_s();
        uint8_t *dst = ce->slots + (uint64_t)j->slot * ce->slot_bytes;
        if (rv == 0) {
            for (uint32_t i = 0; i < j->n; i++) {
                if (j->x[i].src)
                    memcpy(dst + j->x[i].dst_off, j->x[i].src, j->x[i].bytes);
                else
                    memset(dst + j->x[i].dst_off, 0, j->x[i].bytes);
                bytes += j->x[i].bytes;
            }
            if (ce->hooks.after_copy) ce->hooks.after_copy(ce->hooks.ctx, j->slot, dst, bytes);
        }
        double t1 = now_s();
        if (ce->hooks.hold_ms) {
            struct timespec ts = {ce->hooks.hold_ms / 1000,
                                  (long)(ce->hooks.hold_ms % 1000) * 1000000};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&ce->mu);
        ce->result[j->ticket % RESULTS] = rv;
        ce->completed = j->ticket;
        if (rv) {
            ce->st.failed++;
        } else {
            ce->st.copies++;
            ce->st.bytes += bytes;
        }
        ce->st.busy_s += t1 - t0;
        pthread_cond_broadcast(&ce->done_cv);
        free(j);
    }
    pthread_mutex_unlock(&ce->mu);
    return NULL;
}

int copy_start(uint8_t *slots, uint64_t slot_bytes, uint32_t n_slots,
               const struct copy_hooks *hooks, struct copy_engine **out)
{
    struct copy_engine *ce = calloc(1, sizeof *ce);
    if (ce) ce->result = calloc(RESULTS, sizeof *ce->result);
    if (!ce || !ce->result) {
        if (ce) free(ce);
        return strata_errf(STRATA_ENOMEM, "out of memory for the copy engine");
    }
    ce->slots = slots;
    ce->slot_bytes = slot_bytes;
    ce->n_slots = n_slots;
    if (hooks) ce->hooks = *hooks;
    ce->next_ticket = 1;
    pthread_mutex_init(&ce->mu, NULL);
    pthread_cond_init(&ce->cv, NULL);
    pthread_cond_init(&ce->done_cv, NULL);
    int err = pthread_create(&ce->th, NULL, run, ce);
    if (err) {
        pthread_mutex_destroy(&ce->mu);
        pthread_cond_destroy(&ce->cv);
        pthread_cond_destroy(&ce->done_cv);
        free(ce->result);
        free(ce);
        return strata_errf(strata_errno(err), "cannot start the copy thread");
    }
    *out = ce;
    return 0;
}

void copy_close(struct copy_engine *ce)
{
    if (!ce) return;
    pthread_mutex_lock(&ce->mu);
    ce->stop = true;
    ce->window_done = UINT64_MAX; /* nothing reads slots any more: release every fence */
    ce->released = UINT64_MAX;
    pthread_cond_signal(&ce->cv);
    pthread_mutex_unlock(&ce->mu);
    pthread_join(ce->th, NULL);
    pthread_mutex_destroy(&ce->mu);
    pthread_cond_destroy(&ce->cv);
    pthread_cond_destroy(&ce->done_cv);
    free(ce->result);
    free(ce);
}

int copy_post(struct copy_engine *ce, uint32_t slot, const struct copy_extent *x, uint32_t n,
              uint64_t after_window, uint64_t *ticket)
{
    if (slot >= ce->n_slots || n > COPY_MAX_EXTENTS)
        return strata_errf(STRATA_EINVAL, "copy into slot %u of %u with %u extents", slot,
                           ce->n_slots, n);
    for (uint32_t i = 0; i < n; i++)
        if (x[i].dst_off > ce->slot_bytes || x[i].bytes > ce->slot_bytes - x[i].dst_off)
            return strata_errf(STRATA_EINVAL,
                               "copy extent of %llu bytes at %llu falls outside a slot of %llu",
                               (unsigned long long)x[i].bytes, (unsigned long long)x[i].dst_off,
                               (unsigned long long)ce->slot_bytes);
    int rv = ce->hooks.refuse ? ce->hooks.refuse(ce->hooks.ctx, slot) : 0;
    if (rv) return strata_errf(rv, "the copy into slot %u was refused (a test hook)", slot);
    struct job *j = calloc(1, sizeof *j);
    if (!j) return strata_errf(STRATA_ENOMEM, "out of memory for a copy");
    j->slot = slot;
    j->n = n;
    j->after = after_window;
    memcpy(j->x, x, n * sizeof *x);
    pthread_mutex_lock(&ce->mu);
    j->ticket = *ticket = ce->next_ticket++;
    *(ce->tail ? &ce->tail->next : &ce->head) = j;
    ce->tail = j;
    /* the copy thread waits only on the head: wake it only when that changes what it may do */
    if (ce->head == j && runnable(ce, j)) pthread_cond_signal(&ce->cv);
    pthread_mutex_unlock(&ce->mu);
    return 0;
}

void copy_window_done(struct copy_engine *ce, uint64_t w)
{
    pthread_mutex_lock(&ce->mu);
    if (w > ce->window_done) {
        ce->window_done = w;
        if (ce->head && runnable(ce, ce->head)) pthread_cond_signal(&ce->cv);
    }
    pthread_mutex_unlock(&ce->mu);
}

bool copy_done(struct copy_engine *ce, uint64_t ticket, int *rv)
{
    pthread_mutex_lock(&ce->mu);
    bool done = ticket <= ce->completed;
    if (done && rv) *rv = ce->result[ticket % RESULTS];
    pthread_mutex_unlock(&ce->mu);
    return done;
}

int copy_wait(struct copy_engine *ce, uint64_t ticket)
{
    pthread_mutex_lock(&ce->mu);
    if (ticket > ce->completed && ce->hooks.on_wait) {
        /* the test's hook sees a copy in flight across the wait (and may not call back in) */
        pthread_mutex_unlock(&ce->mu);
        ce->hooks.on_wait(ce->hooks.ctx, ticket);
        pthread_mutex_lock(&ce->mu);
    }
    if (ticket > ce->released) {
        ce->released = ticket;
        pthread_cond_signal(&ce->cv);
    }
    while (ticket > ce->completed)
        pthread_cond_wait(&ce->done_cv, &ce->mu);
    int rv = ce->result[ticket % RESULTS];
    pthread_mutex_unlock(&ce->mu);
    return rv;
}

void copy_get_stats(struct copy_engine *ce, struct copy_stats *out)
{
    pthread_mutex_lock(&ce->mu);
    *out = ce->st;
    pthread_mutex_unlock(&ce->mu);
}
