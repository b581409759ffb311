/* arena_layout — plans an arena from a parsed GGUF: which tensors are experts, the blobs they form,
 * every table of common/arena/arena.h and the list of copies that fill the segment.
 *
 * Expert tensors are recognised generically: `blk.N.<x>_exps.weight|bias` whose last dimension is
 * the expert count (3-D weights, 2-D biases, fused gate_up), and the old Mixtral per-expert 2-D
 * tensors `blk.N.ffn_{gate,up,down}.E.weight`. A blob is one expert's share of each of its layer's
 * expert tensors in the order gate, gate_up, up, down, others by name (weights before biases), each
 * part 256-byte aligned, in the tensor's own type. Every other tensor is dense.
 * Pure computation over the gguf_file (reads no tensor data); the plan is immutable once made and
 * any thread may read it.
 */
#ifndef STRATA_ARENA_LAYOUT_H
#define STRATA_ARENA_LAYOUT_H

#include "common/arena/arena.h"

#include <stdint.h>

struct gguf_file;

/* One contiguous copy: len bytes at file offset src of split `split` go to segment offset dst. */
struct arena_extent {
    uint64_t src;
    uint64_t len;
    uint64_t dst;
    uint32_t split;
};

struct arena_layout {
    struct arena_header hdr;    /* complete but for state and built_ns */
    uint8_t *meta;              /* hdr.meta_bytes of GGUF metadata */
    char *strings;              /* hdr.strings_bytes */
    struct arena_tensor *dense; /* hdr.n_dense */
    struct arena_layer *layers; /* hdr.n_layers */
    struct arena_part *parts;   /* hdr.n_parts */
    struct arena_extent *ext;   /* every copy, sorted by (split, src) */
    uint64_t n_ext;
    uint64_t blob_bytes_sum; /* sum of blob_bytes over all blobs (the data, unpadded) */
};

/* arena_layout_plan plans the arena of f with blob alignment align (a power of two >= 4096).
 * model_path is stored for `verify`. STRATA_EFORMAT / STRATA_EUNSUPPORTED when expert tensors are
 * inconsistent (wrong expert dimension, a missing or mistyped per-expert tensor), with the tensor's
 * name in the detail. Caller frees with arena_layout_fini. */
int arena_layout_plan(const struct gguf_file *f, uint64_t align, const char *model_path,
                      struct arena_layout **out);

/* arena_layout_fini frees a plan; NULL is fine. */
void arena_layout_fini(struct arena_layout *L);

/* arena_layout_write_tables writes the header (state BUILDING), the metadata and every table into
 * img (hdr.total_bytes, zero-filled). Tensor data is the caller's (arena_build). */
void arena_layout_write_tables(const struct arena_layout *L, uint8_t *img);

#endif
