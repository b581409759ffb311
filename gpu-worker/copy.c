/* The copy engine: the queue, tickets, fences and hooks every backend shares, the copy thread
 * that drives a backend, and the host backend (memcpy into a host slot pool). */
#include "gpu-worker/copy.h"
#include "common/arena/model.h"
#include "common/base/err.h"

#include <xxhash.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct job {
    uint64_t ticket, after;
    uint32_t slot, n;
    struct copy_extent x[COPY_MAX_EXTENTS];
    int rv;        /* issue's result (or the fail hook's) */
    double busy_s; /* time in issue and finish */
    struct job *next;
};

struct copy_engine {
    struct copy_backend be;
    uint64_t slot_bytes;
    uint32_t n_slots;
    struct copy_hooks hooks;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* work posted, a window done, a release, stop */
    pthread_cond_t done_cv;  /* a copy completed */
    struct job *head, *tail; /* FIFO of copies not yet issued */
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

/* span: the bytes of the slot a job's extents reach, from its start */
static uint64_t span(const struct job *j)
{
    uint64_t end = 0;
    for (uint32_t i = 0; i < j->n; i++)
        if (j->x[i].dst_off + j->x[i].bytes > end) end = j->x[i].dst_off + j->x[i].bytes;
    return end;
}

/* issue: the fail hook's verdict, else the backend starts the copy (outside the lock) */
static void issue(struct copy_engine *ce, struct job *j, uint32_t lane, int thread_rv)
{
    const double t0 = now_s();
    j->rv = thread_rv        ? thread_rv
            : ce->hooks.fail ? ce->hooks.fail(ce->hooks.ctx, j->slot, j->ticket)
                             : 0;
    if (!j->rv) j->rv = ce->be.issue(ce->be.ctx, lane, j->slot, j->x, j->n, j->after);
    j->busy_s = now_s() - t0;
}

/* finish: the backend's wait (outside the lock), the hold, then the completion under the lock */
static void finish(struct copy_engine *ce, struct job *j, uint32_t lane)
{
    const double t0 = now_s();
    if (!j->rv) j->rv = ce->be.finish(ce->be.ctx, lane, j->slot, span(j), &ce->hooks);
    j->busy_s += now_s() - t0;
    if (ce->hooks.hold_ms) {
        struct timespec ts = {ce->hooks.hold_ms / 1000, (long)(ce->hooks.hold_ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < j->n; i++)
        bytes += j->x[i].bytes;
    pthread_mutex_lock(&ce->mu);
    ce->result[j->ticket % RESULTS] = j->rv;
    ce->completed = j->ticket;
    if (j->rv) {
        ce->st.failed++;
    } else {
        ce->st.copies++;
        ce->st.bytes += bytes;
    }
    ce->st.busy_s += j->busy_s;
    pthread_cond_broadcast(&ce->done_cv);
    pthread_mutex_unlock(&ce->mu);
}

/* run: the copy thread. It issues the head of the queue while it is runnable and a lane is free,
 * else finishes the oldest copy issued; copies are issued and finished in ticket order, so they
 * complete in it. Decided under the lock, copied outside it. */
static void *run(void *arg)
{
    struct copy_engine *ce = arg;
    const int thread_rv = ce->be.thread_start ? ce->be.thread_start(ce->be.ctx) : 0;
    struct job *fl[COPY_MAX_LANES];
    uint32_t first = 0, n_fl = 0;
    pthread_mutex_lock(&ce->mu);
    for (;;) {
        struct job *j = ce->head;
        if (j && n_fl < ce->be.lanes && runnable(ce, j)) {
            ce->head = j->next;
            if (!ce->head) ce->tail = NULL;
            pthread_mutex_unlock(&ce->mu);
            const uint32_t lane = (first + n_fl) % ce->be.lanes;
            issue(ce, j, lane, thread_rv);
            fl[lane] = j;
            n_fl++;
            pthread_mutex_lock(&ce->mu);
            continue;
        }
        if (n_fl) {
            pthread_mutex_unlock(&ce->mu);
            struct job *f = fl[first];
            finish(ce, f, first);
            free(f);
            first = (first + 1) % ce->be.lanes;
            n_fl--;
            pthread_mutex_lock(&ce->mu);
            continue;
        }
        if (ce->stop && !j) break;
        pthread_cond_wait(&ce->cv, &ce->mu);
    }
    pthread_mutex_unlock(&ce->mu);
    return NULL;
}

int copy_start_backend(const struct copy_backend *be, uint64_t slot_bytes, uint32_t n_slots,
                       const struct copy_hooks *hooks, struct copy_engine **out)
{
    if (be->lanes < 1 || be->lanes > COPY_MAX_LANES) {
        if (be->close) be->close(be->ctx);
        return strata_errf(STRATA_EINVAL, "a copy backend with %u lanes (1 to %d)", be->lanes,
                           COPY_MAX_LANES);
    }
    struct copy_engine *ce = calloc(1, sizeof *ce);
    if (ce) ce->result = calloc(RESULTS, sizeof *ce->result);
    if (!ce || !ce->result) {
        free(ce);
        if (be->close) be->close(be->ctx);
        return strata_errf(STRATA_ENOMEM, "out of memory for the copy engine");
    }
    ce->be = *be;
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
        if (be->close) be->close(be->ctx);
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
    if (ce->be.close) ce->be.close(ce->be.ctx);
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
    /* the copy thread looks only at the head: wake it only when that changes what it may do */
    if (ce->head == j && runnable(ce, j)) pthread_cond_signal(&ce->cv);
    pthread_mutex_unlock(&ce->mu);
    return 0;
}

int copy_window_done(struct copy_engine *ce, uint64_t w)
{
    int rv = 0;
    pthread_mutex_lock(&ce->mu);
    if (w > ce->window_done) {
        /* the backend's mark first: a copy the thread takes after this sees it */
        if (ce->be.window) rv = ce->be.window(ce->be.ctx, w);
        if (!rv) ce->window_done = w;
        if (!rv && ce->head && runnable(ce, ce->head)) pthread_cond_signal(&ce->cv);
    }
    pthread_mutex_unlock(&ce->mu);
    return rv;
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

void copy_wait_all(struct copy_engine *ce)
{
    pthread_mutex_lock(&ce->mu);
    const uint64_t last = ce->next_ticket - 1;
    pthread_mutex_unlock(&ce->mu);
    if (last) copy_wait(ce, last);
}

void copy_get_stats(struct copy_engine *ce, struct copy_stats *out)
{
    pthread_mutex_lock(&ce->mu);
    *out = ce->st;
    pthread_mutex_unlock(&ce->mu);
}

/* ---- the host backend: one lane, the copy made at issue ---------------------------------------
 */

struct host {
    uint8_t *slots;
    uint64_t slot_bytes;
};

static int host_issue(void *ctx, uint32_t lane, uint32_t slot, const struct copy_extent *x,
                      uint32_t n, uint64_t after)
{
    const struct host *hb = ctx;
    uint8_t *dst = hb->slots + (uint64_t)slot * hb->slot_bytes;
    for (uint32_t i = 0; i < n; i++) {
        if (x[i].src)
            memcpy(dst + x[i].dst_off, x[i].src, x[i].bytes);
        else
            memset(dst + x[i].dst_off, x[i].fill, x[i].bytes);
    }
    return 0;
}

static int host_finish(void *ctx, uint32_t lane, uint32_t slot, uint64_t span,
                       const struct copy_hooks *hk)
{
    const struct host *hb = ctx;
    if (hk->after_copy)
        hk->after_copy(hk->ctx, slot, hb->slots + (uint64_t)slot * hb->slot_bytes, span);
    return 0;
}

int copy_start(uint8_t *slots, uint64_t slot_bytes, uint32_t n_slots,
               const struct copy_hooks *hooks, struct copy_engine **out)
{
    struct host *hb = malloc(sizeof *hb);
    if (!hb) return strata_errf(STRATA_ENOMEM, "out of memory for the copy engine");
    *hb = (struct host){slots, slot_bytes};
    const struct copy_backend be = {
        .ctx = hb, .lanes = 1, .issue = host_issue, .finish = host_finish, .close = free};
    return copy_start_backend(&be, slot_bytes, n_slots, hooks, out);
}

/* ---- blobs --------------------------------------------------------------------------------------
 */

uint32_t copy_blob_extents(const struct model *m, uint32_t l, uint32_t e, struct copy_extent *x)
{
    const struct model_layer *L = &m->layers[l];
    const uint8_t *blob = model_expert_blob(m, l, e);
    if (blob) {
        x[0] = (struct copy_extent){.src = blob, .bytes = L->blob.bytes};
        return 1;
    }
    uint32_t n = 0;
    uint64_t at = 0;
    /* blob order: each part, then its bias when the experts have them (gpt-oss) */
    const bool bias = m->hp.exp_bias;
    for (int i = 0; i < (bias ? MODEL_BLOB_PARTS : MODEL_PART_COUNT); i++) {
        const int p = bias ? (i % 2 ? MODEL_PART_BIAS : 0) + i / 2 : i;
        const struct model_mat *pm = &L->part[p % MODEL_PART_COUNT];
        const uint64_t off = L->blob.part_off[p], bytes = p >= MODEL_PART_BIAS
                                                              ? pm->n_out * sizeof(float)
                                                              : pm->row_bytes * pm->n_out;
        if (off > at) x[n++] = (struct copy_extent){.bytes = off - at, .dst_off = at};
        x[n++] = (struct copy_extent){
            .src = model_expert_part(m, l, e, (enum model_part)p), .bytes = bytes, .dst_off = off};
        at = off + bytes;
    }
    return n;
}

uint64_t copy_blob_hash(const struct model *m, uint32_t l, uint32_t e)
{
    if (model_expert_blob(m, l, e)) return model_expert_blob_hash(m, l, e);
    struct copy_extent x[COPY_MAX_EXTENTS];
    const uint32_t n = copy_blob_extents(m, l, e, x);
    XXH3_state_t *st = XXH3_createState();
    if (!st) return 0;
    XXH3_64bits_reset(st);
    static const uint8_t zeros[4096];
    for (uint32_t i = 0; i < n; i++)
        for (uint64_t done = 0; done < x[i].bytes;) {
            const uint64_t c = x[i].src                           ? x[i].bytes - done
                               : x[i].bytes - done < sizeof zeros ? x[i].bytes - done
                                                                  : sizeof zeros;
            XXH3_64bits_update(st, x[i].src ? (const uint8_t *)x[i].src + done : zeros, c);
            done += c;
        }
    const uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}
