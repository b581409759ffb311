#include "arena-server/arena_build.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* 8 MiB: the readers take chunks in turn, so the device sees one stream per reader, each a chunk
 * from the next. Cold, on a virtio disk, two readers of 32 MiB chunks read 0.67 GiB in 0.34-0.56 s,
 * of 8 MiB chunks in 0.24-0.30 s, as fast as one sequential reader. */
#define DEFAULT_CHUNK (8ull << 20)
#define GAP_MAX                                                                                    \
    (64u << 10)         /* file padding up to this is read into a scratch buffer, so               \
                           that alignment gaps between tensors do not split a read */
#define IOV_CAP    1024 /* IOV_MAX on Linux */
#define HASH_BATCH 16   /* blobs a hash thread claims at once */
/* Allocation unit of the segment: a huge page (so a hugetlbfs block is one page), and small, so
 * that a reader waiting for the allocator waits for little more than the pages of its own read. */
#define BLOCK (2ull << 20)

enum { BLK_FREE, BLK_DONE, BLK_FAILED };

/* A chunk: len bytes of one file from src, feeding extents from ext_first (skip bytes into it). */
struct chunk {
    uint64_t src, len;
    uint64_t ext_first, skip;
    uint32_t split;
};

struct job {
    const struct arena_layout *L;
    const struct gguf_file *f;
    const char *dir;           /* shm directory of seg */
    const struct shm_seg *seg; /* the segment being built */
    uint8_t *img;              /* seg->map */
    int *fds;
    struct chunk *chunks;
    uint64_t n_chunks;
    bool keep_cache;
    const _Atomic int *cancel;
    _Atomic uint64_t next; /* next chunk (or blob batch in the hash phase) to claim */
    _Atomic uint64_t done; /* bytes read so far */
    _Atomic uint64_t reads;
    int running;             /* threads not yet finished, under err_mu */
    pthread_cond_t finished; /* signalled when running drops to 0 */
    _Atomic int err;         /* first error, 0 if none */
    pthread_mutex_t err_mu;
    char err_detail[1024];
    struct arena view;    /* for the hash phase */
    _Atomic uint8_t *blk; /* per BLOCK of the segment: BLK_*, written by one thread at a time */
    uint64_t n_blk;
    pthread_mutex_t blk_mu;  /* orders block and error updates against the readers' waits */
    pthread_cond_t blk_done; /* broadcast when a block leaves BLK_FREE or an error is set */
    uint64_t fail_reserve;   /* opts->fail_reserve */
    uint64_t n_reserve;      /* block allocations so far (one thread at a time makes them) */
    double reserve_s;        /* time in them */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void set_err(struct job *j, int rv)
{
    int zero = 0;
    pthread_mutex_lock(&j->err_mu);
    if (atomic_compare_exchange_strong(&j->err, &zero, rv))
        snprintf(j->err_detail, sizeof j->err_detail, "%s", strata_errdetail());
    pthread_mutex_unlock(&j->err_mu);
    pthread_mutex_lock(&j->blk_mu); /* readers waiting for a block give up */
    pthread_cond_broadcast(&j->blk_done);
    pthread_mutex_unlock(&j->blk_mu);
}

static void thread_done(struct job *j)
{
    pthread_mutex_lock(&j->err_mu);
    if (--j->running == 0) pthread_cond_signal(&j->finished);
    pthread_mutex_unlock(&j->err_mu);
}

/* reserve_block allocates block b and wakes the readers waiting for it. A failure is recorded
 * before the block is marked failed, so a waiter reports it and not an error of its own. */
static int reserve_block(struct job *j, uint64_t b)
{
    uint64_t off = b * BLOCK, len = j->seg->size - off < BLOCK ? j->seg->size - off : BLOCK;
    /* The test hook asks for the block at an offset past the largest file size: the kernel
     * refuses that (EFBIG) before the file system allocates anything, and shm_reserve reports it
     * as a full directory, so the test takes the real failure path. */
    if (++j->n_reserve == j->fail_reserve) off = INT64_MAX - len / 2;
    double t0 = now_s();
    int rv = shm_reserve(j->dir, j->seg, off, len);
    j->reserve_s += now_s() - t0;
    if (rv != 0) set_err(j, rv);
    pthread_mutex_lock(&j->blk_mu);
    atomic_store(&j->blk[b], rv == 0 ? BLK_DONE : BLK_FAILED);
    pthread_cond_broadcast(&j->blk_done);
    pthread_mutex_unlock(&j->blk_mu);
    return rv;
}

/* reserve_range allocates the free blocks under [off, off + len). */
static int reserve_range(struct job *j, uint64_t off, uint64_t len)
{
    for (uint64_t b = off / BLOCK; len > 0 && b <= (off + len - 1) / BLOCK; b++) {
        int rv = atomic_load(&j->blk[b]) == BLK_FREE ? reserve_block(j, b) : 0;
        if (rv != 0) return rv;
    }
    return 0;
}

/* await_blocks waits until every block under the n image ranges of v (entries pointing at skip are
 * not in the image) is allocated. Returns the build's first error when it fails meanwhile. */
static int await_blocks(struct job *j, const struct iovec *v, int n, const uint8_t *skip)
{
    for (int i = 0; i < n; i++) {
        if (v[i].iov_base == skip || v[i].iov_len == 0) continue;
        uint64_t off = (uint64_t)((uint8_t *)v[i].iov_base - j->img);
        for (uint64_t b = off / BLOCK; b <= (off + v[i].iov_len - 1) / BLOCK; b++) {
            if (atomic_load(&j->blk[b]) == BLK_DONE) continue;
            pthread_mutex_lock(&j->blk_mu);
            while (atomic_load(&j->blk[b]) == BLK_FREE && atomic_load(&j->err) == 0)
                pthread_cond_wait(&j->blk_done, &j->blk_mu);
            pthread_mutex_unlock(&j->blk_mu);
            if (atomic_load(&j->blk[b]) != BLK_DONE) return atomic_load(&j->err);
        }
    }
    return 0;
}

/* plan_chunks groups the sorted extents into reads of up to chunk bytes of contiguous file range.
 */
static int plan_chunks(struct job *j, uint64_t chunk)
{
    const struct arena_layout *L = j->L;
    uint64_t cap = 0;
    struct chunk *cur = NULL;
    uint32_t n_iov = 0;
    for (uint64_t i = 0; i < L->n_ext; i++) {
        const struct arena_extent *x = &L->ext[i];
        uint64_t off = 0;
        while (off < x->len) {
            uint64_t pos = x->src + off;
            if (cur && cur->split == x->split && pos >= cur->src + cur->len &&
                pos - (cur->src + cur->len) <= GAP_MAX && n_iov + 2 <= IOV_CAP) {
                uint64_t gap = pos - (cur->src + cur->len);
                if (cur->len + gap < chunk) {
                    uint64_t piece = x->len - off;
                    if (piece > chunk - cur->len - gap) piece = chunk - cur->len - gap;
                    cur->len += gap + piece;
                    n_iov += gap ? 2 : 1;
                    off += piece;
                    continue;
                }
            }
            if (j->n_chunks == cap) {
                cap = cap ? cap * 2 : 1024;
                struct chunk *c = realloc(j->chunks, cap * sizeof *c);
                if (!c) return STRATA_ENOMEM;
                j->chunks = c;
            }
            cur = &j->chunks[j->n_chunks++];
            uint64_t piece = x->len - off < chunk ? x->len - off : chunk;
            *cur = (struct chunk){
                .src = pos, .len = piece, .ext_first = i, .skip = off, .split = x->split};
            n_iov = 1;
            off += piece;
        }
    }
    return 0;
}

/* chunk_iov rebuilds c's iovec (at most IOV_CAP entries) from its extents as plan_chunks grouped
 * them, file padding going to scratch; returns the number of entries. */
static int chunk_iov(const struct job *j, const struct chunk *c, uint8_t *scratch,
                     struct iovec *iov)
{
    const struct arena_layout *L = j->L;
    int n = 0;
    uint64_t left = c->len, pos = c->src, skip = c->skip;
    for (uint64_t i = c->ext_first; left > 0 && i < L->n_ext; i++) {
        const struct arena_extent *x = &L->ext[i];
        if (x->len == 0) continue;
        uint64_t at = x->src + skip;
        if (at > pos) { /* alignment padding between tensors */
            iov[n++] = (struct iovec){scratch, at - pos};
            left -= at - pos;
            pos = at;
        }
        uint64_t take = x->len - skip < left ? x->len - skip : left;
        iov[n++] = (struct iovec){j->img + x->dst + skip, take};
        left -= take;
        pos += take;
        skip = 0;
    }
    return n;
}

/* alloc_main allocates the blocks the chunks land in, in the order the readers take the chunks.
 * One thread allocates ahead of the readers rather than each reader before its own read: tmpfs
 * serializes fallocate on a file (the inode lock, whose waiters spin), so readers allocating
 * would mostly wait for each other instead of reading. */
static void *alloc_main(void *arg)
{
    struct job *j = arg;
    struct iovec *iov = malloc(IOV_CAP * sizeof *iov);
    if (!iov) set_err(j, STRATA_ENOMEM);
    for (uint64_t i = 0; iov && i < j->n_chunks && atomic_load(&j->err) == 0; i++) {
        int n = chunk_iov(j, &j->chunks[i], NULL, iov), rv = 0;
        for (int k = 0; k < n && rv == 0; k++) {
            uint8_t *at = iov[k].iov_base; /* NULL: file padding */
            if (at) rv = reserve_range(j, (uint64_t)(at - j->img), iov[k].iov_len);
        }
    }
    free(iov);
    return NULL;
}

/* read_chunk waits for the blocks c lands in and reads it. */
static int read_chunk(struct job *j, const struct chunk *c, uint8_t *scratch)
{
    static _Thread_local struct iovec iov[IOV_CAP];
    int n = chunk_iov(j, c, scratch, iov);
    int rv = await_blocks(j, iov, n, scratch);
    if (rv != 0) return rv;
    int fd = j->fds[c->split];
    struct iovec *v = iov;
    uint64_t off = c->src, want = c->len;
    while (want > 0) {
        ssize_t r = preadv(fd, v, n < IOV_CAP ? n : IOV_CAP, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return strata_errf(strata_errno(errno), "read of %llu bytes at offset %llu of %s: %s",
                               (unsigned long long)want, (unsigned long long)off,
                               j->f->splits[c->split].path, strerror(errno));
        if (r == 0)
            return strata_errf(STRATA_ETRUNC, "%s ends at %llu, before its tensor data",
                               j->f->splits[c->split].path, (unsigned long long)off);
        atomic_fetch_add_explicit(&j->reads, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&j->done, (uint64_t)r, memory_order_relaxed);
        off += (uint64_t)r;
        want -= (uint64_t)r;
        while (r > 0 && n > 0) {
            if ((size_t)r >= v->iov_len) {
                r -= (ssize_t)v->iov_len;
                v++;
                n--;
            } else {
                v->iov_base = (uint8_t *)v->iov_base + r;
                v->iov_len -= (size_t)r;
                r = 0;
            }
        }
    }
    if (!j->keep_cache) posix_fadvise(fd, (off_t)c->src, (off_t)c->len, POSIX_FADV_DONTNEED);
    return 0;
}

static void *read_main(void *arg)
{
    struct job *j = arg;
    uint8_t *scratch = malloc(GAP_MAX);
    if (!scratch) set_err(j, STRATA_ENOMEM);
    while (scratch && atomic_load(&j->err) == 0) {
        uint64_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n_chunks) break;
        if (j->cancel && atomic_load(j->cancel)) {
            set_err(j, strata_errf(STRATA_ECANCELED, "build canceled"));
            break;
        }
        int rv = read_chunk(j, &j->chunks[i], scratch);
        if (rv != 0) set_err(j, rv);
    }
    free(scratch);
    thread_done(j);
    return NULL;
}

uint64_t arena_build_hash_blob(const struct arena *a, uint32_t l, uint32_t e)
{
    const uint8_t *b = arena_blob_at(a, l, e);
    return b ? XXH3_64bits(b, a->layers[l].blob_bytes) : 0;
}

static void *hash_main(void *arg)
{
    struct job *j = arg;
    const struct arena_header *h = j->view.hdr;
    uint64_t n = (uint64_t)h->n_layers * h->n_expert;
    uint64_t *out = (uint64_t *)(j->img + h->hashes_off);
    for (;;) {
        uint64_t first = atomic_fetch_add(&j->next, HASH_BATCH);
        if (first >= n) break;
        for (uint64_t i = first; i < n && i < first + HASH_BATCH; i++) {
            uint32_t l = (uint32_t)(i / h->n_expert), e = (uint32_t)(i % h->n_expert);
            out[i] = arena_build_hash_blob(&j->view, l, e);
            atomic_fetch_add_explicit(&j->done, j->view.layers[l].blob_bytes, memory_order_relaxed);
        }
    }
    thread_done(j);
    return NULL;
}

#define LINE_EVERY_S 5.0 /* progress without a terminal: one line this often (logs, journald) */

/* draw_bar redraws the bar on a terminal; elsewhere it prints a line every LINE_EVERY_S (and the
 * last one), since a log keeps every redraw. *last: when the previous line went out. */
static void draw_bar(const char *what, uint64_t done, uint64_t total, double t0, double *last,
                     bool final)
{
    double frac = total ? (double)done / total : 1.0, now = now_s(), dt = now - t0;
    double gib = done / 1073741824.0, rate = dt > 0 ? gib / dt : 0.0;
    if (!isatty(STDERR_FILENO)) {
        if (!final && now - *last < LINE_EVERY_S) return;
        *last = now;
        fprintf(stderr, "%s: %3.0f%% %.1f/%.1f GiB %.2f GiB/s %.0f s\n", what, frac * 100, gib,
                total / 1073741824.0, rate, dt);
        return;
    }
    int fill = (int)(frac * 30);
    char bar[31];
    memset(bar, '=', (size_t)fill);
    memset(bar + fill, ' ', (size_t)(30 - fill));
    bar[30] = '\0';
    fprintf(stderr, "\r%s [%s] %3.0f%% %.1f/%.1f GiB %.2f GiB/s ", what, bar, frac * 100, gib,
            total / 1073741824.0, rate);
    if (final) fputc('\n', stderr);
}

/* run_phase runs fn on n threads and, while they work, redraws the progress bar. */
static int run_phase(struct job *j, void *(*fn)(void *), int n, bool progress, const char *what,
                     uint64_t total)
{
    pthread_t th[64];
    double t0 = now_s(), last = t0;
    atomic_store(&j->next, 0);
    atomic_store(&j->done, 0);
    j->running = n;
    int started = 0;
    for (; started < n; started++)
        if (pthread_create(&th[started], NULL, fn, j) != 0) break;
    pthread_mutex_lock(&j->err_mu);
    j->running -= n - started;
    while (j->running > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000; /* redraw the bar ten times a second */
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&j->finished, &j->err_mu, &ts);
        if (progress) draw_bar(what, atomic_load(&j->done), total, t0, &last, false);
    }
    pthread_mutex_unlock(&j->err_mu);
    if (started == 0) return strata_errf(STRATA_ENOMEM, "cannot start a thread");
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (progress) draw_bar(what, atomic_load(&j->done), total, t0, &last, true);
    int rv = atomic_load(&j->err);
    if (rv != 0) return strata_errf(rv, "%s", j->err_detail);
    return 0;
}

/* fill is arena_build_create on a created segment. */
static int fill(const struct arena_layout *L, const struct gguf_file *f, const char *dir,
                const struct shm_seg *seg, const struct arena_build_opts *opts,
                struct arena_build_stats *stats)
{
    int rv = 0;
    struct job j = {.L = L,
                    .f = f,
                    .dir = dir,
                    .seg = seg,
                    .img = seg->map,
                    .keep_cache = opts->keep_cache,
                    .cancel = opts->cancel,
                    .fail_reserve = opts->fail_reserve};
    pthread_mutex_init(&j.err_mu, NULL);
    pthread_cond_init(&j.finished, NULL);
    pthread_mutex_init(&j.blk_mu, NULL);
    pthread_cond_init(&j.blk_done, NULL);
    int n = opts->threads;
    if (n <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus < 1 ? 1 : cpus > 8 ? 8 : (int)cpus;
    }
    if (n > 64) n = 64;
    memset(stats, 0, sizeof *stats);
    stats->threads = n;
    j.n_blk = (seg->size + BLOCK - 1) / BLOCK;
    j.blk = calloc(j.n_blk, sizeof *j.blk);
    j.fds = calloc(f->n_splits, sizeof *j.fds);
    if (!j.blk || !j.fds) {
        rv = STRATA_ENOMEM;
        goto out;
    }
    for (uint32_t s = 0; s < f->n_splits; s++)
        j.fds[s] = -1;
    for (uint32_t s = 0; s < f->n_splits; s++) {
        j.fds[s] = open(f->splits[s].path, O_RDONLY | O_CLOEXEC);
        if (j.fds[s] < 0) {
            rv =
                strata_errf(strata_errno(errno), "open %s: %s", f->splits[s].path, strerror(errno));
            goto out;
        }
        posix_fadvise(j.fds[s], 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    if ((rv = plan_chunks(&j, opts->chunk_bytes ? opts->chunk_bytes : DEFAULT_CHUNK)) != 0)
        goto out;

    double t0 = now_s();
    /* The tables (and the blob hashes, written after the reads) lie before the dense region. */
    if ((rv = reserve_range(&j, 0, L->hdr.dense_off)) != 0) goto out;
    arena_layout_write_tables(L, j.img);
    uint64_t total = 0;
    for (uint64_t i = 0; i < j.n_chunks; i++)
        total += j.chunks[i].len;
    pthread_t alloc;
    if (pthread_create(&alloc, NULL, alloc_main, &j) != 0) {
        rv = strata_errf(STRATA_ENOMEM, "cannot start a thread");
        goto out;
    }
    rv = run_phase(&j, read_main, n, opts->progress, "reading", total);
    pthread_join(alloc, NULL);
    /* Readers may touch any page, so a block no read landed in is allocated too. The layouts of
     * arena_layout.c leave none (padding never spans a whole block): this is a scan. */
    if (rv != 0 || (rv = reserve_range(&j, 0, seg->size)) != 0) goto out;
    stats->bytes_read = atomic_load(&j.done);
    stats->reads = atomic_load(&j.reads);
    stats->read_s = now_s() - t0;
    stats->reserve_s = j.reserve_s;

    t0 = now_s();
    arena_view(j.img, L->hdr.total_bytes, &j.view);
    if ((rv = run_phase(&j, hash_main, n, opts->progress, "hashing", L->blob_bytes_sum)) != 0)
        goto out;
    stats->hash_s = now_s() - t0;
out:
    if (j.fds)
        for (uint32_t s = 0; s < f->n_splits; s++)
            if (j.fds[s] >= 0) close(j.fds[s]);
    free(j.fds);
    free(j.chunks);
    free(j.blk);
    pthread_cond_destroy(&j.blk_done);
    pthread_mutex_destroy(&j.blk_mu);
    pthread_cond_destroy(&j.finished);
    pthread_mutex_destroy(&j.err_mu);
    return rv;
}

int arena_build_create(const struct arena_layout *L, const struct gguf_file *f, const char *dir,
                       const char *tmpname, const struct arena_build_opts *opts,
                       struct shm_seg *seg, struct arena_build_stats *stats)
{
    int rv;
    *seg = (struct shm_seg)SHM_SEG_INIT;
    if ((rv = shm_create_sparse(dir, tmpname, L->hdr.total_bytes, seg)) != 0) return rv;
    if ((rv = fill(L, f, dir, seg, opts, stats)) != 0) {
        shm_close(seg);
        shm_remove(dir, tmpname);
    }
    return rv;
}
