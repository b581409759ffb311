/* gguf_kv_test — the typed getters, array accessors and type table of gguf_kv.c on values built
 * in memory (no file): which conversions are accepted, the message of each refusal, *out left
 * untouched on error, and the accessors' out-of-range rules (0, never undefined behaviour).
 */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static struct gguf_kv kv_u(const char *key, enum gguf_vtype t, uint64_t u)
{
    return (struct gguf_kv){(char *)key, {.type = t, .u = u}};
}

static struct gguf_kv kv_i(const char *key, enum gguf_vtype t, int64_t i)
{
    return (struct gguf_kv){(char *)key, {.type = t, .i = i}};
}

/* refused checks rv is code and the detail message holds msg. */
static void refused(int rv, int code, const char *msg)
{
    ck_assert_msg(rv == code && strstr(strata_errdetail(), msg), "got %d '%s', want %d with '%s'",
                  rv, strata_errdetail(), code, msg);
}

START_TEST(getters_convert_only_what_fits)
{
    static const uint8_t raw[] = {1, 2, 3};
    struct gguf_kv kv[] = {
        kv_u("u8", GGUF_UINT8, 200),
        kv_i("i8", GGUF_INT8, -1),
        kv_u("u32max", GGUF_UINT32, UINT32_MAX),
        kv_u("big", GGUF_UINT64, UINT64_C(1) << 63),
        kv_u("u33", GGUF_UINT64, UINT64_C(1) << 32),
        kv_i("neg", GGUF_INT64, -5),
        {"f64", {.type = GGUF_FLOAT64, .f = 0.25}},
        {"yes", {.type = GGUF_BOOL, .b = true}},
        {"s", {.type = GGUF_STRING, .str = {"abc", 3}}},
        {"arr", {.type = GGUF_ARRAY, .arr = {.type = GGUF_UINT8, .n = 3, .raw = raw}}},
    };
    struct gguf_file f = {.n_kv = sizeof kv / sizeof kv[0], .kv = kv};
    uint64_t u64 = 7;
    uint32_t u32 = 7;
    int64_t i64 = 7;
    float f32 = 7;
    bool b = false;
    struct gguf_str s = {0};
    const struct gguf_value *a = NULL;

    ck_assert_ptr_eq(gguf_find(&f, "neg"), &kv[5]);
    ck_assert_ptr_null(gguf_find(&f, "ne"));

    ck_assert_int_eq(gguf_get_i64(&f, "u8", &i64), 0);
    ck_assert_int_eq(i64, 200);
    ck_assert_int_eq(gguf_get_u32(&f, "u32max", &u32), 0);
    ck_assert_uint_eq(u32, UINT32_MAX);
    ck_assert_int_eq(gguf_get_u64(&f, "big", &u64), 0);
    ck_assert_uint_eq(u64, UINT64_C(1) << 63);

    /* every refusal leaves *out as it was */
    i64 = 7, u64 = 7, u32 = 7;
    refused(gguf_get_i64(&f, "big", &i64), STRATA_EFORMAT,
            "GGUF key big is 9223372036854775808, too large for int64");
    refused(gguf_get_u64(&f, "i8", &u64), STRATA_EFORMAT,
            "GGUF key i8 is -1; a nonnegative value was expected");
    refused(gguf_get_u32(&f, "u33", &u32), STRATA_EFORMAT,
            "GGUF key u33 is 4294967296, too large for uint32");
    refused(gguf_get_u32(&f, "neg", &u32), STRATA_EFORMAT, "a nonnegative value was expected");
    refused(gguf_get_i64(&f, "s", &i64), STRATA_EFORMAT,
            "GGUF key s has type string; an integer was expected");
    refused(gguf_get_u64(&f, "f64", &u64), STRATA_EFORMAT, "has type float64");
    refused(gguf_get_u64(&f, "absent", &u64), STRATA_ENOENT, "GGUF key absent is missing");
    ck_assert_int_eq(i64, 7);
    ck_assert_uint_eq(u64, 7);
    ck_assert_uint_eq(u32, 7);

    ck_assert_int_eq(gguf_get_f32(&f, "neg", &f32), 0);
    ck_assert(f32 == -5.0f);
    ck_assert_int_eq(gguf_get_f32(&f, "u8", &f32), 0);
    ck_assert(f32 == 200.0f);
    ck_assert_int_eq(gguf_get_f32(&f, "f64", &f32), 0);
    ck_assert(f32 == 0.25f);
    refused(gguf_get_f32(&f, "yes", &f32), STRATA_EFORMAT,
            "GGUF key yes has type bool; a number was expected");
    ck_assert(f32 == 0.25f);

    ck_assert_int_eq(gguf_get_bool(&f, "yes", &b), 0);
    ck_assert(b);
    b = false;
    refused(gguf_get_bool(&f, "u8", &b), STRATA_EFORMAT, "has type uint8; a bool was expected");
    ck_assert(!b);

    ck_assert_int_eq(gguf_get_str(&f, "s", &s), 0);
    ck_assert(s.len == 3 && memcmp(s.ptr, "abc", 3) == 0);
    refused(gguf_get_str(&f, "arr", &s), STRATA_EFORMAT, "has type array; a string was expected");

    ck_assert_int_eq(gguf_get_arr(&f, "arr", GGUF_VTYPE_COUNT, &a), 0);
    ck_assert_ptr_eq(a, &kv[9].val);
    a = NULL;
    refused(gguf_get_arr(&f, "arr", GGUF_INT32, &a), STRATA_EFORMAT,
            "GGUF key arr is an array of uint8; an array of int32 was expected");
    refused(gguf_get_arr(&f, "s", GGUF_VTYPE_COUNT, &a), STRATA_EFORMAT, "an array was expected");
    ck_assert_ptr_null(a);
}
END_TEST

/* The accessors decode little-endian elements and convert as C does, except that a float outside
 * the integer type's range (or NaN) reads as 0; out of range or a non-scalar array reads as 0. */
START_TEST(accessors_decode_and_clamp)
{
    float fl[] = {1e30f, -1.0f, NAN, 3.75f, -1e30f};
    struct gguf_value fa = {.type = GGUF_ARRAY, .arr = {.type = GGUF_FLOAT32, .n = 5}};
    fa.arr.raw = (const uint8_t *)fl;
    ck_assert_uint_eq(gguf_arr_u64(&fa, 0), 0);
    ck_assert_uint_eq(gguf_arr_u64(&fa, 1), 0);
    ck_assert_uint_eq(gguf_arr_u64(&fa, 2), 0);
    ck_assert_uint_eq(gguf_arr_u64(&fa, 3), 3);
    ck_assert_int_eq(gguf_arr_i64(&fa, 0), 0);
    ck_assert_int_eq(gguf_arr_i64(&fa, 1), -1);
    ck_assert_int_eq(gguf_arr_i64(&fa, 2), 0);
    ck_assert_int_eq(gguf_arr_i64(&fa, 4), 0);
    ck_assert(gguf_arr_f64(&fa, 3) == 3.75);
    ck_assert(isnan(gguf_arr_f64(&fa, 2)));
    ck_assert(gguf_arr_f64(&fa, 5) == 0); /* past the end */

    /* sign extension of narrow elements: 0xff is -1 as int8 and 255 as uint8 */
    static const uint8_t ff[] = {0xff, 0x7f};
    struct gguf_value i8 = {.type = GGUF_ARRAY, .arr = {.type = GGUF_INT8, .n = 2, .raw = ff}};
    struct gguf_value u8 = {.type = GGUF_ARRAY, .arr = {.type = GGUF_UINT8, .n = 2, .raw = ff}};
    ck_assert_int_eq(gguf_arr_i64(&i8, 0), -1);
    ck_assert(gguf_arr_f64(&i8, 0) == -1.0);
    ck_assert_uint_eq(gguf_arr_u64(&i8, 0), UINT64_MAX);
    ck_assert_int_eq(gguf_arr_i64(&u8, 0), 255);
    ck_assert_int_eq(gguf_arr_i64(&i8, 1), 127);

    uint64_t big[] = {UINT64_MAX};
    struct gguf_value u64 = {.type = GGUF_ARRAY, .arr = {.type = GGUF_UINT64, .n = 1}};
    u64.arr.raw = (const uint8_t *)big;
    ck_assert_uint_eq(gguf_arr_u64(&u64, 0), UINT64_MAX);
    ck_assert(gguf_arr_f64(&u64, 0) == 18446744073709551616.0);

    static const uint8_t bools[] = {0, 1};
    struct gguf_value ba = {.type = GGUF_ARRAY, .arr = {.type = GGUF_BOOL, .n = 2, .raw = bools}};
    ck_assert_uint_eq(gguf_arr_u64(&ba, 1), 1);
    ck_assert_int_eq(gguf_arr_i64(&ba, 0), 0);
    ck_assert(gguf_arr_f64(&ba, 1) == 1.0);

    struct gguf_value items[] = {{.type = GGUF_STRING, .str = {"x", 1}},
                                 {.type = GGUF_STRING, .str = {"", 0}}};
    struct gguf_value sa = {.type = GGUF_ARRAY, .arr = {.type = GGUF_STRING, .n = 2}};
    sa.arr.items = items;
    ck_assert(gguf_arr_str(&sa, 0).len == 1 && gguf_arr_str(&sa, 0).ptr[0] == 'x');
    ck_assert_ptr_null(gguf_arr_str(&sa, 2).ptr);
    ck_assert_uint_eq(gguf_arr_u64(&sa, 0), 0); /* strings have no scalar value */
    ck_assert_ptr_null(gguf_arr_str(&u8, 0).ptr);
    struct gguf_value scalar = {.type = GGUF_UINT32, .u = 5};
    ck_assert_uint_eq(gguf_arr_u64(&scalar, 0), 0); /* not an array */
    ck_assert_ptr_null(gguf_arr_str(&scalar, 0).ptr);
}
END_TEST

START_TEST(type_table)
{
    ck_assert_str_eq(gguf_vtype_name(GGUF_UINT8), "uint8");
    ck_assert_str_eq(gguf_vtype_name(GGUF_ARRAY), "array");
    ck_assert_str_eq(gguf_vtype_name(GGUF_FLOAT64), "float64");
    ck_assert_str_eq(gguf_vtype_name(GGUF_VTYPE_COUNT), "?");
    ck_assert_str_eq(gguf_vtype_name((enum gguf_vtype) - 1), "?");
    static const size_t sizes[GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    for (int t = 0; t < GGUF_VTYPE_COUNT; t++)
        ck_assert_uint_eq(gguf_vtype_size((enum gguf_vtype)t), sizes[t]);
    ck_assert_uint_eq(gguf_vtype_size(GGUF_VTYPE_COUNT), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gguf_kv");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, getters_convert_only_what_fits);
    tcase_add_test(tc, accessors_decode_and_clamp);
    tcase_add_test(tc, type_table);
    suite_add_tcase(s, tc);
    return test_run(s);
}
