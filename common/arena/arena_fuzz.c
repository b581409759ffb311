/* arena_fuzz — arena_check on arbitrary images, then every accessor a reader uses on the images it
 * accepts: a segment left by another version or a corrupted file must never crash a worker. The
 * seed corpus holds a real (small) arena image. */
#include "common/arena/arena.h"
#include "common/gguf/gguf.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Copy to an aligned buffer: a mapping is page-aligned, fuzzer inputs are not. */
    uint8_t *img = aligned_alloc(4096, (size + 4095) / 4096 * 4096 + 4096);
    if (!img) return 0;
    memcpy(img, data, size);
    if (arena_check(img, size) == 0) {
        struct arena a;
        char name[256];
        volatile uint64_t sink = 0;
        arena_view(img, size, &a);
        for (uint32_t l = 0; l < a.hdr->n_layers; l++) {
            const struct arena_layer *L = arena_layer_get(&a, l);
            for (uint32_t e = 0; e < a.hdr->n_expert; e++) {
                const uint8_t *b = arena_blob_at(&a, l, e);
                if (b && L->blob_bytes) sink += b[0] + b[L->blob_bytes - 1];
                sink += arena_blob_hash(&a, l, e);
                for (uint32_t p = 0; p < L->n_parts; p++)
                    if (arena_part_name(&a, &a.parts[L->part_first + p], e, name, sizeof name) == 0)
                        sink += strlen(name);
            }
        }
        for (uint64_t i = 0; i < a.hdr->n_dense; i++) {
            const struct arena_tensor *t = &a.dense[i];
            sink += strlen(arena_str(&a, t->name_off));
            if (t->bytes) sink += img[t->offset] + img[t->offset + t->bytes - 1];
        }
        struct gguf_file *meta = NULL;
        if (arena_meta(&a, &meta) == 0) gguf_close(meta);
        (void)sink;
    }
    free(img);
    return 0;
}
