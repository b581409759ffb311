/* trace_fuzz — the trace file reader (trace_read, `strata trace --replay`) on arbitrary bytes.
 *
 * Beyond "no crash": an accepted input must keep the reader's promises, so every id is below
 * n_expert and each (token, layer)'s ids ascend, the input's size is exactly the header's count
 * of ids, and writing the trace back gives the input's bytes.
 */
#include "tools/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0; /* fmemopen refuses an empty buffer */
    FILE *f = fmemopen((void *)data, size, "rb");
    if (!f) return 0;
    struct trace t;
    uint32_t ctx = 0;
    const int rv = trace_read(f, "input", &t, &ctx);
    fclose(f);
    if (rv) return 0;
    const size_t per = (size_t)t.n_layer * t.n_used, w = t.n_expert <= 256 ? 1 : 2;
    if (size != 36 + t.n_tokens * per * w) abort();
    for (uint64_t k = 0; k < t.n_tokens * t.n_layer; k++)
        for (uint32_t i = 0; i < t.n_used; i++) {
            const uint16_t e = t.sel[k * t.n_used + i];
            if (e >= t.n_expert || (i && e <= t.sel[k * t.n_used + i - 1])) abort();
        }
    char path[64];
    snprintf(path, sizeof path, "/tmp/trace_fuzz-%d.trace", (int)getpid());
    if (trace_save(&t, ctx, path) == 0) {
        FILE *g = fopen(path, "rb");
        unsigned char *back = malloc(size + 1);
        if (!g || !back || fread(back, 1, size + 1, g) != size || memcmp(back, data, size) != 0)
            abort();
        fclose(g);
        free(back);
    }
    unlink(path);
    trace_fini(&t);
    return 0;
}
