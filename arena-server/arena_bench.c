/* arena_bench — `strata-arena bench`: the arena build rate against a plain sequential read of the
 * same file, cold (source pages evicted first) and warm. The goal is a cold build at >= 0.8 of the
 * cold sequential read: building must cost little more than reading the model once. Declared in
 * arena_cli.h. */
#include "arena-server/arena_build.h"
#include "arena-server/arena_cli.h"
#include "arena-server/arena_fingerprint.h"
#include "common/arena/arena_layout.h"
#include "arena-server/arena_space.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/arena/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GiB(x)     ((x) / 1073741824.0)
#define READ_CHUNK (16u << 20)
#define MAX_ROUNDS 50

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* evict drops the model's pages from the page cache (fsync first: dirty pages cannot be dropped).
 */
static void evict(const struct gguf_file *f)
{
    for (uint32_t i = 0; i < f->n_splits; i++) {
        int fd = open(f->splits[i].path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

/* seq_read reads every split front to back in READ_CHUNK pieces; returns bytes, sets *secs. */
static int seq_read(const struct gguf_file *f, uint8_t *buf, uint64_t *bytes, double *secs)
{
    double t0 = now_s();
    *bytes = 0;
    for (uint32_t i = 0; i < f->n_splits; i++) {
        int fd = open(f->splits[i].path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return strata_errf(strata_errno(errno), "open %s: %s", f->splits[i].path,
                               strerror(errno));
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        ssize_t r;
        while ((r = read(fd, buf, READ_CHUNK)) > 0)
            *bytes += (uint64_t)r;
        close(fd);
        if (r < 0) return strata_errf(strata_errno(errno), "read %s", f->splits[i].path);
    }
    *secs = now_s() - t0;
    return 0;
}

/* build_once builds the whole arena into a fresh temporary segment and removes it; *total_s is
 * the wall time from creating the segment (allocation included) to the last hash. */
static int build_once(const struct arena_layout *L, const struct gguf_file *f, const char *shm_dir,
                      int threads, bool keep_cache, struct arena_build_stats *st, double *total_s)
{
    char seg[128];
    struct shm_seg s;
    struct arena_space sp;
    int rv;
    if ((rv = arena_space_read(shm_dir, &sp)) != 0) return rv;
    if ((rv = arena_space_check(shm_dir, L->hdr.total_bytes, &sp)) != 0) return rv;
    snprintf(seg, sizeof seg, "strata-%u-bench-%d", (unsigned)getuid(), (int)getpid());
    struct arena_build_opts o = {.threads = threads, .keep_cache = keep_cache};
    double t0 = now_s();
    rv = arena_build_create(L, f, shm_dir, seg, &o, &s, st);
    *total_s = now_s() - t0;
    if (rv != 0) return rv;
    shm_close(&s);
    shm_remove(shm_dir, seg);
    return 0;
}

/* A round: a cold sequential read, then a cold build. */
struct round {
    uint64_t read_b;
    double read_s, total_s, ratio; /* ratio: build rate / read rate */
    struct arena_build_stats build;
};

static int by_ratio(const void *a, const void *b)
{
    double x = ((const struct round *)a)->ratio, y = ((const struct round *)b)->ratio;
    return (x > y) - (x < y);
}

static void row(const char *what, uint64_t bytes, double s, double ref)
{
    double r = s > 0 ? GiB(bytes) / s : 0;
    printf("%-30s %8.2f %8.3f %8.2f", what, GiB(bytes), s, r);
    if (ref > 0) printf(" %8.2f", r / ref);
    printf("\n");
}

int arena_cli_bench(int argc, char **argv)
{
    static const char usage[] =
        "usage: strata-arena bench MODEL.gguf [--shm-dir DIR] [--threads N] [--align 4k|2m]\n"
        "                          [--repeat N]\n"
        "Measures the arena build (read phase, then with hashing) cold and warm against a\n"
        "sequential read of the file; prints a table. Needs free space for one arena.\n"
        "--repeat N measures the cold read and build N times in turn (1 to 50, default 1) and\n"
        "shows the round of median ratio: use it on a machine shared with other work.\n";
    static const struct option longs[] = {
        {"shm-dir", required_argument, NULL, 'd'}, {"threads", required_argument, NULL, 't'},
        {"align", required_argument, NULL, 'a'},   {"repeat", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    const char *shm_dir = NULL;
    int threads = 0, repeat = 1, c, rv;
    uint64_t align = ARENA_ALIGN_SMALL;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        if (c == 'd')
            shm_dir = optarg;
        else if (c == 't')
            threads = atoi(optarg);
        else if (c == 'r') {
            repeat = atoi(optarg);
            if (repeat < 1 || repeat > MAX_ROUNDS) {
                fprintf(stderr, "strata-arena bench: --repeat %s: give 1 to %d rounds\n", optarg,
                        MAX_ROUNDS);
                return 2;
            }
        } else if (c == 'a') {
            if (arena_cli_parse_align(optarg, &align) != 0) {
                fprintf(stderr, "strata-arena bench: %s\n", strata_errdetail());
                return 2;
            }
        } else if (c == 'h') {
            printf("%s", usage);
            return 0;
        } else {
            fprintf(stderr, "%s", usage);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    struct gguf_file *f = NULL;
    struct arena_layout *L = NULL;
    uint8_t *buf = malloc(READ_CHUNK);
    struct round rounds[MAX_ROUNDS];
    uint64_t warm_b;
    double warm_s;
    struct arena_build_stats wb;
    double wb_total;
    if (!buf) return 1;
    if ((rv = gguf_open(argv[optind], &f)) != 0) goto fail;
    if ((rv = arena_layout_plan(f, align, argv[optind], &L)) != 0) goto fail;
    for (int i = 0; i < repeat; i++) {
        struct round *r = &rounds[i];
        evict(f);
        if ((rv = seq_read(f, buf, &r->read_b, &r->read_s)) != 0) goto fail;
        evict(f);
        if ((rv = build_once(L, f, shm_dir, threads, false, &r->build, &r->total_s)) != 0)
            goto fail;
        r->ratio = r->total_s > 0 && r->read_s > 0 && r->read_b > 0
                       ? (double)r->build.bytes_read / r->total_s / (r->read_b / r->read_s)
                       : 0;
    }
    qsort(rounds, (size_t)repeat, sizeof rounds[0], by_ratio);
    const struct round *med = &rounds[(repeat - 1) / 2];
    uint64_t cold_b = med->read_b;
    double cold_s = med->read_s, cb_total = med->total_s;
    const struct arena_build_stats cb = med->build;
    /* The cold build dropped the pages: one untimed read brings them back for the warm rows. */
    if ((rv = seq_read(f, buf, &warm_b, &warm_s)) != 0) goto fail;
    if ((rv = seq_read(f, buf, &warm_b, &warm_s)) != 0) goto fail;
    if ((rv = build_once(L, f, shm_dir, threads, true, &wb, &wb_total)) != 0) goto fail;

    double ref = cold_s > 0 ? GiB(cold_b) / cold_s : 0;
    printf("model %s: %.2f GiB file, arena %.2f GiB, %d threads, align %llu\n", argv[optind],
           GiB(cold_b), GiB(L->hdr.total_bytes), cb.threads, (unsigned long long)align);
    printf("%-30s %8s %8s %8s %8s\n", "", "GiB", "s", "GiB/s", "vs cold");
    row("cold sequential read", cold_b, cold_s, ref);
    row("cold build: read + allocate", cb.bytes_read, cb.read_s, ref);
    row("cold build: + hash", cb.bytes_read, cb.read_s + cb.hash_s, ref);
    row("cold build: all", cb.bytes_read, cb_total, ref);
    row("warm sequential read", warm_b, warm_s, 0);
    row("warm build: read + allocate", wb.bytes_read, wb.read_s, 0);
    row("warm build: + hash", wb.bytes_read, wb.read_s + wb.hash_s, 0);
    row("warm build: all", wb.bytes_read, wb_total, 0);
    printf("allocation (one thread, while the others read): cold %.3f s, warm %.3f s\n",
           cb.reserve_s, wb.reserve_s);
    printf("cold build (all) / cold read = %.2f (goal >= 0.8)", med->ratio);
    if (repeat > 1) {
        printf("; the median of %d rounds:", repeat);
        double best_read = rounds[0].read_s, best_build = rounds[0].total_s;
        for (int i = 0; i < repeat; i++) {
            printf(" %.2f", rounds[i].ratio);
            if (rounds[i].read_s < best_read) best_read = rounds[i].read_s;
            if (rounds[i].total_s < best_build) best_build = rounds[i].total_s;
        }
        /* The fastest of each is the least disturbed by other work on the machine. */
        printf("\nbest of %d: cold read %.3f s, cold build (all) %.3f s, ratio %.2f", repeat,
               best_read, best_build,
               (double)cb.bytes_read / best_build / ((double)cold_b / best_read));
    }
    printf("\n");
fail:
    if (rv != 0)
        fprintf(stderr, "strata-arena bench: %s: %s\n", strata_strerror(rv), strata_errdetail());
    arena_layout_fini(L);
    gguf_close(f);
    free(buf);
    return rv ? 1 : 0;
}
