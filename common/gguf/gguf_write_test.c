/* gguf_write_test — the writer, checked through the reader: a file with every KV type read back
 * (default and 64-byte alignment, v2 header), 20,000 tensors found by name, the written file cut at
 * every header byte, writer misuse refused without leaving files, values copied at declaration, and
 * `strata gguf info` on the written file.
 */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/quant/qtype.h"
#include "launcher/cmd.h"
#include "tests/testutil.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char *tmp_path(const char *name)
{
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", test_tmpdir(), name);
    return p;
}

/* A file with every KV type, nested and empty arrays, empty strings and three tensors. */
static void write_everything(const char *path, uint32_t alignment)
{
    struct gguf_writer *w;
    ck_assert_int_eq(gguf_writer_open(path, alignment, &w), 0);
    ck_assert_int_eq(gguf_w_u32(w, "a.u32", 4000000000u), 0);
    ck_assert_int_eq(gguf_w_i32(w, "a.i32", -7), 0);
    ck_assert_int_eq(gguf_w_u64(w, "a.u64", 0xfedcba9876543210ull), 0);
    ck_assert_int_eq(gguf_w_f32(w, "a.f32", 1.5f), 0);
    ck_assert_int_eq(gguf_w_bool(w, "a.bool", true), 0);
    ck_assert_int_eq(gguf_w_str(w, "a.str", "hello"), 0);
    ck_assert_int_eq(gguf_w_str(w, "a.empty", ""), 0);
    ck_assert_int_eq(gguf_w_strn(w, "a.nul", "x\0y", 3), 0);
    struct gguf_value v = {.type = GGUF_UINT8, .u = 200};
    ck_assert_int_eq(gguf_w_value(w, "a.u8", &v), 0);
    v = (struct gguf_value){.type = GGUF_INT8, .i = -100};
    ck_assert_int_eq(gguf_w_value(w, "a.i8", &v), 0);
    v = (struct gguf_value){.type = GGUF_UINT16, .u = 65000};
    ck_assert_int_eq(gguf_w_value(w, "a.u16", &v), 0);
    v = (struct gguf_value){.type = GGUF_INT16, .i = -30000};
    ck_assert_int_eq(gguf_w_value(w, "a.i16", &v), 0);
    v = (struct gguf_value){.type = GGUF_INT64, .i = -5000000000ll};
    ck_assert_int_eq(gguf_w_value(w, "a.i64", &v), 0);
    v = (struct gguf_value){.type = GGUF_FLOAT64, .f = 3.141592653589793};
    ck_assert_int_eq(gguf_w_value(w, "a.f64", &v), 0);
    int32_t ints[] = {1, -2, 3};
    ck_assert_int_eq(gguf_w_arr(w, "arr.i32", GGUF_INT32, 3, ints), 0);
    float fl[] = {0.5f, -0.25f};
    ck_assert_int_eq(gguf_w_arr(w, "arr.f32", GGUF_FLOAT32, 2, fl), 0);
    uint8_t bools[] = {1, 0, 1};
    ck_assert_int_eq(gguf_w_arr(w, "arr.bool", GGUF_BOOL, 3, bools), 0);
    ck_assert_int_eq(gguf_w_arr(w, "arr.empty", GGUF_UINT64, 0, NULL), 0);
    const char *strs[] = {"alpha", "", "gamma"};
    ck_assert_int_eq(gguf_w_arr_str(w, "arr.str", 3, strs, NULL), 0);
    ck_assert_int_eq(gguf_w_arr_str(w, "arr.str_empty", 0, NULL, NULL), 0);
    /* [[1, 2], [], [["x"]]] is not one type; build [[1,2],[]] of uint16 and [[["x", ""]]]. */
    uint16_t u16s[] = {1, 2};
    struct gguf_value inner[2] = {{.type = GGUF_ARRAY}, {.type = GGUF_ARRAY}};
    inner[0].arr.type = GGUF_UINT16;
    inner[0].arr.n = 2;
    inner[0].arr.raw = (const uint8_t *)u16s;
    inner[1].arr.type = GGUF_UINT16;
    struct gguf_value outer = {.type = GGUF_ARRAY};
    outer.arr.type = GGUF_ARRAY;
    outer.arr.n = 2;
    outer.arr.items = inner;
    ck_assert_int_eq(gguf_w_value(w, "arr.nested", &outer), 0);
    struct gguf_value s2[2] = {{.type = GGUF_STRING, .str = {"x", 1}},
                               {.type = GGUF_STRING, .str = {"", 0}}};
    struct gguf_value l2 = {.type = GGUF_ARRAY}, l1 = {.type = GGUF_ARRAY},
                      l0 = {.type = GGUF_ARRAY};
    l2.arr.type = GGUF_STRING;
    l2.arr.n = 2;
    l2.arr.items = s2;
    l1.arr.type = GGUF_ARRAY;
    l1.arr.n = 1;
    l1.arr.items = &l2;
    l0.arr.type = GGUF_ARRAY;
    l0.arr.n = 1;
    l0.arr.items = &l1;
    ck_assert_int_eq(gguf_w_value(w, "arr.deep", &l0), 0);
    ck_assert_int_eq(gguf_w_u32(w, "a.u32", 1), STRATA_EEXIST);

    uint64_t ne0[] = {8};
    uint64_t ne1[] = {256, 3};
    uint64_t ne2[] = {4, 2, 3, 1};
    ck_assert_int_eq(gguf_w_tensor(w, "t.f32", QT_F32, 1, ne0), 0);
    ck_assert_int_eq(gguf_w_tensor(w, "t.q4k", QT_Q4_K, 2, ne1), 0);
    ck_assert_int_eq(gguf_w_tensor(w, "t.f16", QT_F16, 4, ne2), 0);
    ck_assert_int_eq(gguf_w_tensor(w, "t.f16", QT_F16, 1, ne0), STRATA_EEXIST);
    ck_assert_int_eq(gguf_writer_begin(w), 0);
    /* 32 + 432 + 48 bytes streamed in chunks of 7 that span tensors. */
    uint8_t data[32 + 432 + 48];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof data; i += 7)
        ck_assert_int_eq(gguf_writer_data(w, data + i, sizeof data - i < 7 ? sizeof data - i : 7),
                         0);
    ck_assert_int_eq(gguf_writer_data(w, data, 1), STRATA_EOVERFLOW);
    ck_assert_int_eq(gguf_writer_finish(w), 0);
    ck_assert_int_eq(access(path, F_OK), 0);
}

static void check_everything(const struct gguf_file *f)
{
    ck_assert_uint_eq(f->version, 3);
    uint64_t u64;
    uint32_t u32;
    int64_t i64;
    float f32;
    bool b;
    struct gguf_str s;
    ck_assert_int_eq(gguf_get_u32(f, "a.u32", &u32), 0);
    ck_assert_uint_eq(u32, 4000000000u);
    ck_assert_int_eq(gguf_get_i64(f, "a.i32", &i64), 0);
    ck_assert_int_eq(i64, -7);
    ck_assert_int_eq(gguf_get_u64(f, "a.i32", &u64), STRATA_EFORMAT);
    ck_assert_int_eq(gguf_get_u64(f, "a.u64", &u64), 0);
    ck_assert_uint_eq(u64, 0xfedcba9876543210ull);
    ck_assert_int_eq(gguf_get_u32(f, "a.u64", &u32), STRATA_EFORMAT);
    ck_assert_int_eq(gguf_get_i64(f, "a.u64", &i64), STRATA_EFORMAT);
    ck_assert_int_eq(gguf_get_f32(f, "a.f32", &f32), 0);
    ck_assert(f32 == 1.5f);
    ck_assert_int_eq(gguf_get_f32(f, "a.f64", &f32), 0);
    ck_assert(fabsf(f32 - 3.14159265f) < 1e-6f);
    ck_assert_int_eq(gguf_get_bool(f, "a.bool", &b), 0);
    ck_assert(b);
    ck_assert_int_eq(gguf_get_str(f, "a.str", &s), 0);
    ck_assert_uint_eq(s.len, 5);
    ck_assert(memcmp(s.ptr, "hello", 5) == 0);
    ck_assert_int_eq(gguf_get_str(f, "a.empty", &s), 0);
    ck_assert_uint_eq(s.len, 0);
    ck_assert_int_eq(gguf_get_str(f, "a.nul", &s), 0);
    ck_assert_uint_eq(s.len, 3);
    ck_assert(memcmp(s.ptr, "x\0y", 3) == 0);
    ck_assert_int_eq(gguf_get_str(f, "a.u32", &s), STRATA_EFORMAT);
    ck_assert_int_eq(gguf_get_u64(f, "a.u8", &u64), 0);
    ck_assert_uint_eq(u64, 200);
    ck_assert_int_eq(gguf_get_i64(f, "a.i8", &i64), 0);
    ck_assert_int_eq(i64, -100);
    ck_assert_int_eq(gguf_get_u64(f, "a.u16", &u64), 0);
    ck_assert_uint_eq(u64, 65000);
    ck_assert_int_eq(gguf_get_i64(f, "a.i16", &i64), 0);
    ck_assert_int_eq(i64, -30000);
    ck_assert_int_eq(gguf_get_i64(f, "a.i64", &i64), 0);
    ck_assert_int_eq(i64, -5000000000ll);
    ck_assert_int_eq(gguf_get_u64(f, "missing", &u64), STRATA_ENOENT);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "missing"));
    ck_assert_ptr_eq(gguf_find(f, "missing"), NULL);
    ck_assert_int_eq(gguf_find(f, "a.f64")->val.type, GGUF_FLOAT64);
    ck_assert(gguf_find(f, "a.f64")->val.f == 3.141592653589793);

    const struct gguf_value *a;
    ck_assert_int_eq(gguf_get_arr(f, "arr.i32", GGUF_INT32, &a), 0);
    ck_assert_uint_eq(a->arr.n, 3);
    ck_assert_int_eq(gguf_arr_i64(a, 1), -2);
    ck_assert(gguf_arr_f64(a, 2) == 3.0);
    ck_assert_int_eq(gguf_arr_i64(a, 3), 0); /* past the end */
    ck_assert_int_eq(gguf_get_arr(f, "arr.i32", GGUF_UINT32, &a), STRATA_EFORMAT);
    ck_assert_int_eq(gguf_get_arr(f, "arr.f32", GGUF_VTYPE_COUNT, &a), 0);
    ck_assert(gguf_arr_f64(a, 1) == -0.25);
    ck_assert_int_eq(gguf_get_arr(f, "arr.bool", GGUF_BOOL, &a), 0);
    ck_assert_uint_eq(gguf_arr_u64(a, 0) + gguf_arr_u64(a, 1) * 2 + gguf_arr_u64(a, 2) * 4, 5);
    ck_assert_int_eq(gguf_get_arr(f, "arr.empty", GGUF_UINT64, &a), 0);
    ck_assert_uint_eq(a->arr.n, 0);
    ck_assert_int_eq(gguf_get_arr(f, "arr.str", GGUF_STRING, &a), 0);
    ck_assert_uint_eq(a->arr.n, 3);
    ck_assert_uint_eq(gguf_arr_str(a, 1).len, 0);
    ck_assert(gguf_arr_str(a, 2).len == 5 && memcmp(gguf_arr_str(a, 2).ptr, "gamma", 5) == 0);
    ck_assert_ptr_eq(gguf_arr_str(a, 3).ptr, NULL);
    ck_assert_int_eq(gguf_get_arr(f, "arr.str_empty", GGUF_STRING, &a), 0);
    ck_assert_uint_eq(a->arr.n, 0);
    ck_assert_int_eq(gguf_get_arr(f, "arr.nested", GGUF_ARRAY, &a), 0);
    ck_assert_uint_eq(a->arr.n, 2);
    ck_assert_int_eq(a->arr.items[0].arr.type, GGUF_UINT16);
    ck_assert_uint_eq(gguf_arr_u64(&a->arr.items[0], 1), 2);
    ck_assert_uint_eq(a->arr.items[1].arr.n, 0);
    ck_assert_int_eq(gguf_get_arr(f, "arr.deep", GGUF_ARRAY, &a), 0);
    const struct gguf_value *l2 = &a->arr.items[0].arr.items[0];
    ck_assert_int_eq(l2->arr.type, GGUF_STRING);
    ck_assert_uint_eq(l2->arr.n, 2);
    ck_assert(gguf_arr_str(l2, 0).len == 1 && gguf_arr_str(l2, 0).ptr[0] == 'x');

    ck_assert_uint_eq(f->n_tensors, 3);
    const struct gguf_tensor *t = gguf_tensor_find(f, "t.q4k");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->type, QT_Q4_K);
    ck_assert_uint_eq(t->n_dims, 2);
    ck_assert_uint_eq(t->ne[0], 256);
    ck_assert_uint_eq(t->ne[1], 3);
    ck_assert_uint_eq(t->ne[2], 1);
    ck_assert_uint_eq(t->nbytes, 432);
    ck_assert_uint_eq(t->offset % f->alignment, 0);
    ck_assert_uint_eq(t->data[0], (uint8_t)(32 * 7 + 1));
    ck_assert_uint_eq(t->data[431], (uint8_t)((32 + 431) * 7 + 1));
    t = gguf_tensor_find(f, "t.f16");
    ck_assert_uint_eq(t->nbytes, 48);
    ck_assert_uint_eq(t->data[47], (uint8_t)((32 + 432 + 47) * 7 + 1));
    ck_assert_ptr_eq(gguf_tensor_find(f, "t.none"), NULL);
}

START_TEST(round_trip_every_type)
{
    const char *path = tmp_path("all.gguf");
    write_everything(path, 0);
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_uint_eq(f->alignment, 32);
    ck_assert_uint_eq(f->n_splits, 1);
    check_everything(f);
    gguf_close(f);

    path = tmp_path("all64.gguf");
    write_everything(path, 64);
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_uint_eq(f->alignment, 64);
    check_everything(f);
    gguf_close(f);
}
END_TEST

START_TEST(version_2_reads)
{
    const char *path = tmp_path("v2.gguf");
    write_everything(path, 0);
    size_t size;
    char *buf = test_read_file(path, &size);
    buf[4] = 2; /* v2 differs from v3 only in what big-endian files may claim */
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open_mem(buf, size, true, &f), 0);
    ck_assert_uint_eq(f->version, 2);
    ck_assert_uint_eq(f->n_tensors, 3);
    gguf_close(f);
    free(buf);
}
END_TEST

/* Big models hold ~20,000 tensors: names are found through the hash index, not a scan. */
START_TEST(twenty_thousand_tensors)
{
    enum { N = 20000 };
    const char *path = tmp_path("many.gguf");
    struct gguf_writer *w;
    ck_assert_int_eq(gguf_writer_open(path, 0, &w), 0);
    uint64_t ne[] = {32};
    char name[64];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", i / 3,
                 i % 3 == 0   ? "gate"
                 : i % 3 == 1 ? "up"
                              : "down");
        ck_assert_int_eq(gguf_w_tensor(w, name, QT_Q8_0, 1, ne), 0);
    }
    ck_assert_int_eq(gguf_w_tensor(w, "blk.0.ffn_up_exps.weight", QT_Q8_0, 1, ne), STRATA_EEXIST);
    ck_assert_int_eq(gguf_writer_begin(w), 0);
    static uint8_t data[N * 34];
    for (int i = 0; i < N; i++)
        memset(data + i * 34, i & 0xff, 34);
    ck_assert_int_eq(gguf_writer_data(w, data, sizeof data), 0);
    ck_assert_int_eq(gguf_writer_finish(w), 0);

    struct gguf_file *f;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_uint_eq(f->n_tensors, N);
    ck_assert_ptr_nonnull(f->index);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", i / 3,
                 i % 3 == 0   ? "gate"
                 : i % 3 == 1 ? "up"
                              : "down");
        const struct gguf_tensor *t = gguf_tensor_find(f, name);
        ck_assert_ptr_eq(t, &f->tensors[i]);
        ck_assert_uint_eq(t->data[33], (uint8_t)(i & 0xff));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("gguf: %d tensor lookups in %.2f ms\n", N,
           (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    ck_assert_ptr_eq(gguf_tensor_find(f, "blk.9999.ffn_up_exps.weight"), NULL);
    gguf_close(f);
}
END_TEST

/* A valid file cut at every byte of its header region (and a few in the data) fails cleanly. */
START_TEST(truncated_everywhere)
{
    const char *path = tmp_path("trunc.gguf");
    write_everything(path, 0);
    size_t size;
    char *full = test_read_file(path, &size);
    ck_assert_ptr_nonnull(full);
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open_mem(full, size, true, &f), 0);
    uint64_t header = f->header_bytes, data_end = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        uint64_t e = f->splits[0].data_off + f->tensors[i].offset + f->tensors[i].nbytes;
        if (e > data_end) data_end = e;
    }
    gguf_close(f);
    ck_assert_uint_gt(header, 400);
    int codes[STRATA_ENCODES_] = {0};
    for (size_t n = 0; n < data_end; n++) {
        if (n > header + 64 && n + 64 < data_end && n % 29) continue;
        uint8_t *buf = malloc(n ? n : 1);
        memcpy(buf, full, n);
        int rv = gguf_open_mem(buf, n, true, &f);
        if (rv == 0) ck_abort_msg("a file cut at %zu of %zu bytes was accepted", n, size);
        ck_assert_int_lt(rv, STRATA_ENCODES_);
        ck_assert_str_ne(strata_errdetail(), "");
        codes[rv]++;
        /* the header alone is what an arena keeps: it must parse without the data */
        if (n >= header) {
            ck_assert_int_eq(gguf_open_mem(buf, n, false, &f), 0);
            ck_assert_ptr_eq(f->tensors[0].data, NULL);
            gguf_close(f);
        }
        free(buf);
    }
    ck_assert_int_gt(codes[STRATA_ETRUNC], (int)header / 2);
    free(full);
}
END_TEST

START_TEST(writer_refuses_misuse)
{
    const char *path = tmp_path("misuse.gguf");
    struct gguf_writer *w;
    ck_assert_int_eq(gguf_writer_open(path, 48, &w), STRATA_EINVAL);
    ck_assert_int_eq(gguf_writer_open(path, 0, &w), 0);
    uint64_t bad[] = {100}, zero[] = {0}, ok[] = {512};
    ck_assert_int_eq(gguf_w_tensor(w, "q", QT_Q4_K, 1, bad), STRATA_EINVAL);
    ck_assert_int_eq(gguf_w_tensor(w, "z", QT_F32, 1, zero), STRATA_EINVAL);
    ck_assert_int_eq(gguf_w_tensor(w, "u", 4, 1, ok), STRATA_EINVAL);
    ck_assert_int_eq(gguf_w_tensor(w, "d", QT_F32, 5, ok), STRATA_EINVAL);
    ck_assert_int_eq(gguf_w_arr(w, "s", GGUF_STRING, 0, NULL), STRATA_EINVAL);
    uint8_t two = 2;
    ck_assert_int_eq(gguf_w_arr(w, "b", GGUF_BOOL, 1, &two), STRATA_EINVAL);
    ck_assert_int_eq(gguf_w_tensor(w, "q", QT_Q4_K, 1, ok), 0);
    /* a nested array one level too deep is refused, so the writer never makes a file it can't read
     */
    struct gguf_value lv[GGUF_MAX_DEPTH + 1];
    for (int d = 0; d <= GGUF_MAX_DEPTH; d++) {
        lv[d] = (struct gguf_value){.type = GGUF_ARRAY};
        lv[d].arr.type = d < GGUF_MAX_DEPTH ? GGUF_ARRAY : GGUF_UINT8;
        lv[d].arr.n = d < GGUF_MAX_DEPTH ? 1 : 0;
        lv[d].arr.items = d < GGUF_MAX_DEPTH ? &lv[d + 1] : NULL;
    }
    ck_assert_int_eq(gguf_w_value(w, "deep", &lv[0]), STRATA_EINVAL);
    ck_assert_int_eq(gguf_w_value(w, "deep", &lv[1]), 0);
    ck_assert_int_eq(gguf_writer_data(w, "x", 1), STRATA_ESTATE);
    ck_assert_int_eq(gguf_writer_begin(w), 0);
    ck_assert_int_eq(gguf_w_u32(w, "late", 1), STRATA_ESTATE);
    ck_assert_int_eq(gguf_w_tensor(w, "late", QT_F32, 1, ok), STRATA_ESTATE);
    uint8_t data[100] = {0};
    ck_assert_int_eq(gguf_writer_data(w, data, sizeof data), 0);
    ck_assert_int_eq(gguf_writer_finish(w), STRATA_ETRUNC); /* 100 of 288 bytes */
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "tensor q has 100 of its 288 bytes"));
    ck_assert_int_eq(access(path, F_OK), -1);
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    ck_assert_int_eq(access(tmp, F_OK), -1);

    ck_assert_int_eq(gguf_writer_open(path, 0, &w), 0);
    ck_assert_int_eq(gguf_w_u32(w, "x", 1), 0);
    gguf_writer_abort(w);
    ck_assert_int_eq(access(tmp, F_OK), -1);
    ck_assert_int_eq(access(path, F_OK), -1);
}
END_TEST

/* The writer's output is what ggml writes: same header layout, padded data, and the reader sees the
 * nested value gguf_w_value copied (not the caller's, which is freed first). */
START_TEST(writer_copies_values)
{
    const char *path = tmp_path("copy.gguf");
    struct gguf_writer *w;
    ck_assert_int_eq(gguf_writer_open(path, 0, &w), 0);
    char *heap = strdup("transient");
    struct gguf_value item = {.type = GGUF_STRING, .str = {heap, 9}};
    struct gguf_value arr = {.type = GGUF_ARRAY};
    arr.arr.type = GGUF_STRING;
    arr.arr.n = 1;
    arr.arr.items = &item;
    ck_assert_int_eq(gguf_w_value(w, "s", &arr), 0);
    memset(heap, 'X', 9);
    free(heap);
    ck_assert_int_eq(gguf_writer_finish(w), 0);
    size_t size;
    char *buf = test_read_file(path, &size);
    ck_assert_uint_eq(size, 96); /* 24 + (8+1) + 4 + (4+8) + (8+9) = 66, padded to 32 */
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open_mem(buf, size, true, &f), 0);
    const struct gguf_value *a;
    ck_assert_int_eq(gguf_get_arr(f, "s", GGUF_STRING, &a), 0);
    ck_assert(memcmp(gguf_arr_str(a, 0).ptr, "transient", 9) == 0);
    gguf_close(f);
    free(buf);
}
END_TEST

/* ---- strata gguf info ------------------------------------------------------------------------ */

extern const struct strata_cmd strata_cmd_gguf;

/* run_cmd runs `strata gguf ARGS` with stdout sent to out; returns its exit status. */
static int run_cmd(const char *out, int argc, char **argv)
{
    fflush(stdout);
    int saved = dup(1);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 1);
    close(fd);
    int rv = strata_cmd_gguf.run(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    return rv;
}

START_TEST(cmd_info)
{
    const char *path = tmp_path("cmd.gguf"), *out = tmp_path("cmd.out");
    write_everything(path, 0);
    char *json_args[] = {"gguf", "info", (char *)path, "--json", NULL};
    ck_assert_int_eq(run_cmd(out, 4, json_args), 0);
    json_error_t err;
    json_t *doc = json_load_file(out, JSON_ALLOW_NUL, &err); /* "a.nul" holds a NUL: valid JSON */
    ck_assert_msg(doc != NULL, "JSON does not parse: %s at line %d", err.text, err.line);
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "version")), 3);
    json_t *kv = json_object_get(doc, "kv");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(kv, "a.str"), "value")),
                     "hello");
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(kv, "a.i64"), "value")),
                     -5000000000ll);
    json_t *nested = json_object_get(json_object_get(kv, "arr.nested"), "value");
    ck_assert_int_eq(json_integer_value(json_array_get(json_array_get(nested, 0), 1)), 2);
    json_t *tensors = json_object_get(doc, "tensors");
    ck_assert_uint_eq(json_array_size(tensors), 3);
    json_t *t1 = json_array_get(tensors, 1);
    ck_assert_str_eq(json_string_value(json_object_get(t1, "name")), "t.q4k");
    ck_assert_str_eq(json_string_value(json_object_get(t1, "type")), "q4_K");
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(t1, "shape"), 1)), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(t1, "bytes")), 432);
    json_decref(doc);

    char *table_args[] = {"gguf", "info", (char *)path, NULL};
    ck_assert_int_eq(run_cmd(out, 3, table_args), 0);
    char *text = test_read_file(out, NULL);
    ck_assert_ptr_nonnull(strstr(text, "GGUF v3, alignment 32, 22 KV pairs, 3 tensors"));
    ck_assert_ptr_nonnull(strstr(text, "[256, 3]"));
    ck_assert_ptr_nonnull(strstr(text, "\"x\\x00y\""));
    free(text);

    /* long values are summarized in the table */
    const char *lpath = tmp_path("long.gguf");
    struct gguf_writer *w;
    ck_assert_int_eq(gguf_writer_open(lpath, 0, &w), 0);
    const char *toks[20];
    for (int i = 0; i < 20; i++)
        toks[i] = "tok";
    ck_assert_int_eq(gguf_w_arr_str(w, "tokenizer.ggml.tokens", 20, toks, NULL), 0);
    char longs[201];
    memset(longs, 'z', 200);
    longs[200] = '\0';
    ck_assert_int_eq(gguf_w_str(w, "tokenizer.chat_template", longs), 0);
    ck_assert_int_eq(gguf_writer_finish(w), 0);
    char *long_args[] = {"gguf", "info", (char *)lpath, NULL};
    ck_assert_int_eq(run_cmd(out, 3, long_args), 0);
    text = test_read_file(out, NULL);
    ck_assert_ptr_nonnull(strstr(text, "[20 strings]"));
    ck_assert_ptr_nonnull(strstr(text, "zzz\"... (200 bytes)"));
    free(text);

    char *usage_args[] = {"gguf", NULL};
    ck_assert_int_eq(run_cmd(out, 1, usage_args), 2);
    char *missing_args[] = {"gguf", "info", (char *)tmp_path("absent.gguf"), NULL};
    ck_assert_int_eq(run_cmd(out, 3, missing_args), 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gguf_write");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, round_trip_every_type);
    tcase_add_test(tc, version_2_reads);
    tcase_add_test(tc, twenty_thousand_tensors);
    tcase_add_test(tc, truncated_everywhere);
    tcase_add_test(tc, writer_refuses_misuse);
    tcase_add_test(tc, writer_copies_values);
    tcase_add_test(tc, cmd_info);
    suite_add_tcase(s, tc);
    return test_run(s);
}
