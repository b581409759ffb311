#include "common/err.h"
#include "common/gguf.h"
#include "common/qtype.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    struct gguf_value s2[2] = {{.type = GGUF_STRING, .str = {"x", 1}}, {.type = GGUF_STRING, .str = {"", 0}}};
    struct gguf_value l2 = {.type = GGUF_ARRAY}, l1 = {.type = GGUF_ARRAY}, l0 = {.type = GGUF_ARRAY};
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
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof data; i += 7)
        ck_assert_int_eq(gguf_writer_data(w, data + i, sizeof data - i < 7 ? sizeof data - i : 7), 0);
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

int main(void)
{
    Suite *s = suite_create("gguf");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, round_trip_every_type);
    suite_add_tcase(s, tc);
    return test_run(s);
}
