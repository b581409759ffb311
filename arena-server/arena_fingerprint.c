#include "arena-server/arena_fingerprint.h"
#include "common/arena/arena.h"
#include "common/gguf/gguf.h"

#include <stdio.h>
#define XXH_STATIC_LINKING_ONLY /* a state on the stack: nothing to allocate or fail */
#include <xxhash.h>

uint64_t arena_fingerprint(const struct gguf_file *f, uint64_t align)
{
    /* Fields are hashed as fixed-width values so the fingerprint does not depend on padding. */
    uint64_t head[4] = {ARENA_VERSION_MAJOR, ARENA_VERSION_MINOR, align, f->n_splits};
    XXH3_state_t state, *st = &state;
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, head, sizeof head);
    for (uint32_t i = 0; i < f->n_splits; i++) {
        const struct gguf_split *s = &f->splits[i];
        uint64_t v[4] = {s->size, (uint64_t)s->mtime_ns, (uint64_t)s->ino, (uint64_t)s->dev};
        XXH3_64bits_update(st, v, sizeof v);
    }
    XXH3_64bits_update(st, f->splits[0].map, f->header_bytes);
    return XXH3_64bits_digest(st);
}

void arena_fingerprint_hex(uint64_t fp, char buf[17])
{
    snprintf(buf, 17, "%016llx", (unsigned long long)fp);
}
