/* gguf_fuzz — the GGUF reader on arbitrary bytes, data offsets checked against the input's size.
 *
 * Beyond "no crash": an accepted input must keep the reader's promises, so every tensor is found by
 * name, its first and last data bytes are read (out of bounds under ASan if a check were missing),
 * and every array element is read through the accessors. Each input is also parsed as bare
 * metadata (check_data false), which must accept whatever the full check accepts.
 */
#include "common/gguf/gguf.h"

#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;

static void touch_value(const struct gguf_value *v)
{
    if (v->type == GGUF_STRING && v->str.len) sink += (uint8_t)v->str.ptr[v->str.len - 1];
    if (v->type != GGUF_ARRAY) return;
    for (uint64_t i = 0; i < v->arr.n; i++) {
        if (v->arr.items) {
            touch_value(&v->arr.items[i]);
        } else {
            sink += gguf_arr_u64(v, i) + (uint64_t)gguf_arr_i64(v, i);
            sink += gguf_arr_f64(v, i) > 0;
        }
    }
}

/* check exercises an open file; data is read only where the reader checked it. */
static void check(const struct gguf_file *f)
{
    for (uint64_t i = 0; i < f->n_kv; i++) {
        if (gguf_find(f, f->kv[i].key) != &f->kv[i]) abort();
        touch_value(&f->kv[i].val);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        if (gguf_tensor_find(f, t->name) != t) abort();
        if (t->data) sink += t->data[0] + t->data[t->nbytes - 1];
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gguf_file *f, *meta;
    int full = gguf_open_mem(data, size, true, &f);
    /* what parses with its data must parse as bare metadata too (the arena's view) */
    int bare = gguf_open_mem(data, size, false, &meta);
    if (full == 0 && bare != 0) abort();
    if (full == 0) {
        check(f);
        gguf_close(f);
    }
    if (bare == 0) {
        check(meta);
        gguf_close(meta);
    }
    return 0;
}
