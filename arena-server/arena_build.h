/* arena_build — creates an arena segment and fills it from the GGUF file(s): tables, tensor data,
 * blob hashes.
 *
 * Data moves with large preadv() calls (chunks of up to chunk_bytes of contiguous file range,
 * scattered straight into the mapping by the iovec) on several threads that take chunks in file
 * order, and posix_fadvise(DONTNEED) drops the source pages behind each chunk so the page cache
 * does not hold a second copy of the model. Then every blob's XXH3_64bits is computed, also in
 * parallel. The segment is created sparse and allocated in 2 MiB blocks by one allocator thread
 * that walks the chunks in the readers' order, ahead of them; a reader waits only for blocks its
 * chunk lands in that are not allocated yet. So the allocation overlaps the reads instead of
 * preceding all of them (the tables' blocks are allocated first, any block no read lands in last).
 * No byte is touched before its block is allocated: a shm directory that fills up during the build
 * gives STRATA_ENOSPC, never a SIGBUS. The caller publishes the segment
 * (state READY) afterwards. arena_build_create blocks until done; when asked it shows its
 * progress on stderr (a bar on a terminal, a line every 5 s elsewhere).
 */
#ifndef STRATA_ARENA_BUILD_H
#define STRATA_ARENA_BUILD_H

#include "common/arena/arena_layout.h"
#include "common/arena/shm.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct gguf_file;

struct arena_build_opts {
    int threads;               /* reader threads; 0: min(8, online CPUs) */
    uint64_t chunk_bytes;      /* bytes per read; 0: 8 MiB */
    bool progress;             /* on stderr: a bar on a terminal, else a line every 5 s */
    bool keep_cache;           /* do not drop source pages (benchmarks of a warm build) */
    const _Atomic int *cancel; /* when non-NULL and set (e.g. by a signal handler), the build stops
                                  with STRATA_ECANCELED */
    uint64_t fail_reserve;     /* tests: the fail_reserve-th block allocation fails as in a full
                                  shm directory; 0: none does */
};

struct arena_build_stats {
    uint64_t bytes_read; /* tensor bytes read from the GGUF file(s) */
    uint64_t reads;      /* preadv calls */
    double read_s;       /* wall time of the data phase (allocation included) */
    double reserve_s;    /* time spent allocating the segment (mostly while the reads ran) */
    double hash_s;       /* wall time of the hash phase */
    int threads;
};

/* arena_build_create creates segment tmpname in dir (NULL: /dev/shm) of L->hdr.total_bytes, writes
 * L's tables into it, reads every tensor into place from f's files and stores every blob's hash.
 * On success *seg is the segment mapped read-write, every byte allocated, its header's state still
 * BUILDING; the caller publishes it. The caller compares the size with the free space first
 * (arena_space_check), so that a directory too small is refused before anything is allocated;
 * STRATA_ENOSPC here means the space went during the build. Returns 0, STRATA_EEXIST, STRATA_ENOSPC
 * (detail: how much is needed, allocated and free, and what to do), STRATA_EIO / errno codes
 * (detail: file, offset), STRATA_ETRUNC when a file is shorter than its tensors claim or
 * STRATA_ECANCELED. On failure the segment is removed and *seg is closed. */
int arena_build_create(const struct arena_layout *L, const struct gguf_file *f, const char *dir,
                       const char *tmpname, const struct arena_build_opts *opts,
                       struct shm_seg *seg, struct arena_build_stats *stats);

/* arena_build_hash_blob returns XXH3_64bits of blob (l, e) of an image laid out by any plan (used
 * by fill and by verify). */
uint64_t arena_build_hash_blob(const struct arena *a, uint32_t l, uint32_t e);

#endif
