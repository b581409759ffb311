/* arena_build — fills a planned arena image from the GGUF file(s): tables, tensor data, blob
 * hashes.
 *
 * Data moves with large preadv() calls (chunks of up to chunk_bytes of contiguous file range,
 * scattered straight into the mapping by the iovec) on several threads that take chunks in file
 * order, and posix_fadvise(DONTNEED) drops the source pages behind each chunk so the page cache
 * does not hold a second copy of the model. Then every blob's XXH3_64bits is computed, also in
 * parallel. The caller owns the image and publishes it (state READY) afterwards.
 * arena_build_fill blocks until done; it prints a progress bar on stderr when asked.
 */
#ifndef STRATA_ARENA_BUILD_H
#define STRATA_ARENA_BUILD_H

#include "arena-server/arena_layout.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct gguf_file;

struct arena_build_opts {
    int threads;               /* reader threads; 0: min(8, online CPUs) */
    uint64_t chunk_bytes;      /* bytes per read; 0: 32 MiB */
    bool progress;             /* draw a progress bar on stderr */
    bool keep_cache;           /* do not drop source pages (benchmarks of a warm build) */
    const _Atomic int *cancel; /* when non-NULL and set (e.g. by a signal handler), the build stops
                                  with STRATA_ECANCELED */
};

struct arena_build_stats {
    uint64_t bytes_read; /* tensor bytes read from the GGUF file(s) */
    uint64_t reads;      /* preadv calls */
    double read_s;       /* wall time of the data phase */
    double hash_s;       /* wall time of the hash phase */
    int threads;
};

/* arena_build_fill writes L's tables into img (L->hdr.total_bytes, zero-filled, writable), reads
 * every tensor into place from f's files and stores every blob's hash. The header's state stays
 * BUILDING. Returns 0, STRATA_EIO / errno codes (detail: file, offset) or STRATA_ETRUNC when a file
 * is shorter than its tensors claim. */
int arena_build_fill(const struct arena_layout *L, const struct gguf_file *f, uint8_t *img,
                     const struct arena_build_opts *opts, struct arena_build_stats *stats);

/* arena_build_hash_blob returns XXH3_64bits of blob (l, e) of an image laid out by any plan (used
 * by fill and by verify). */
uint64_t arena_build_hash_blob(const struct arena *a, uint32_t l, uint32_t e);

#endif
