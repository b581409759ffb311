#include "common/base/err.h"
#include "common/ipc/msg.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* build_request makes a request carrying one field of every kind the builder packs. */
static void build_request(void **buf, size_t *len)
{
    static const int32_t toks[] = {1, -2, 150000, INT32_MAX};
    static const int64_t ids[] = {INT64_MIN, 0, INT64_MAX};
    struct msg_builder b;
    msg_begin_request(&b, "submit");
    msg_key(&b, "prompt");
    msg_pack_str(&b, "hello");
    msg_key(&b, "nul");
    msg_pack_strn(&b, "a\0b", 3);
    msg_key(&b, "max_tokens");
    msg_pack_i64(&b, 256);
    msg_key(&b, "neg");
    msg_pack_i64(&b, -7);
    msg_key(&b, "seed");
    msg_pack_u64(&b, UINT64_MAX);
    msg_key(&b, "temperature");
    msg_pack_f64(&b, 0.75);
    msg_key(&b, "stream");
    msg_pack_bool(&b, true);
    msg_key(&b, "none");
    msg_pack_nil(&b);
    msg_key(&b, "blob");
    msg_pack_bin(&b, "\x00\x01\x02", 3);
    msg_key(&b, "tokens");
    msg_pack_i32s(&b, toks, 4);
    msg_key(&b, "ids");
    msg_pack_i64s(&b, ids, 3);
    msg_key(&b, "opts");
    msg_pack_map(&b, 1);
    msg_pack_str(&b, "top_k");
    msg_pack_i64(&b, 40);
    msg_key(&b, "empty");
    msg_pack_array(&b, 0);
    ck_assert_int_eq(msg_finish(&b, buf, len), 0);
}

START_TEST(request_round_trip)
{
    void *buf;
    size_t len;
    build_request(&buf, &len);
    ck_assert_int_eq(msg_precheck(buf, len, MSG_MAX_DEPTH), 0);

    struct msg m;
    ck_assert_int_eq(msg_decode(buf, len, &m), 0);
    ck_assert_str_eq(m.op, "submit");
    ck_assert_int_eq(m.v, MSG_VERSION);
    /* 2 envelope keys + 13 fields: more than a fixmap holds, so the patched map32 count is used */
    ck_assert_uint_eq(m.root.via.map.size, 15);

    const char *s;
    size_t sl;
    ck_assert_int_eq(msg_get_str(&m, NULL, "prompt", 100, &s, &sl), 0);
    ck_assert_str_eq(s, "hello");
    ck_assert_uint_eq(sl, 5);
    ck_assert_int_eq(msg_get_str(&m, NULL, "nul", 100, &s, &sl), 0);
    ck_assert_uint_eq(sl, 3);
    ck_assert_int_eq(memcmp(s, "a\0b", 4), 0);

    int64_t i;
    ck_assert_int_eq(msg_get_i64(&m, NULL, "max_tokens", 0, 65536, &i), 0);
    ck_assert_int_eq(i, 256);
    ck_assert_int_eq(msg_get_i64(&m, NULL, "neg", -10, 10, &i), 0);
    ck_assert_int_eq(i, -7);
    uint64_t u;
    ck_assert_int_eq(msg_get_u64(&m, NULL, "seed", UINT64_MAX, &u), 0);
    ck_assert_uint_eq(u, UINT64_MAX);
    double d;
    ck_assert_int_eq(msg_get_f64(&m, NULL, "temperature", 0, 2, &d), 0);
    ck_assert_double_eq(d, 0.75);
    ck_assert_int_eq(msg_get_f64(&m, NULL, "max_tokens", 0, 1000, &d), 0); /* ints are numbers */
    ck_assert_double_eq(d, 256);
    bool bl = false;
    ck_assert_int_eq(msg_get_bool(&m, NULL, "stream", &bl), 0);
    ck_assert(bl);
    const void *p;
    ck_assert_int_eq(msg_get_bin(&m, NULL, "blob", 3, &p, &sl), 0);
    ck_assert_uint_eq(sl, 3);
    ck_assert_int_eq(memcmp(p, "\x00\x01\x02", 3), 0);

    const int32_t *t32;
    uint32_t n;
    ck_assert_int_eq(msg_get_i32s(&m, NULL, "tokens", 8, INT32_MIN, INT32_MAX, &t32, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(t32[1], -2);
    ck_assert_int_eq(t32[3], INT32_MAX);
    const int64_t *t64;
    ck_assert_int_eq(msg_get_i64s(&m, NULL, "ids", 8, INT64_MIN, INT64_MAX, &t64, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert(t64[0] == INT64_MIN && t64[2] == INT64_MAX);
    ck_assert_int_eq(msg_get_i32s(&m, NULL, "empty", 8, 0, 1, &t32, &n), 0);
    ck_assert_uint_eq(n, 0);

    const msgpack_object *opts;
    ck_assert_int_eq(msg_get_map(&m, NULL, "opts", &opts), 0);
    ck_assert_int_eq(msg_get_i64(&m, opts, "top_k", 0, 100, &i), 0);
    ck_assert_int_eq(i, 40);

    /* a missing key leaves the default and says which key */
    i = 99;
    ck_assert_int_eq(msg_get_i64(&m, NULL, "absent", 0, 100, &i), STRATA_ENOENT);
    ck_assert_int_eq(i, 99);
    ck_assert_str_eq(strata_errdetail(), "field 'absent': missing");
    ck_assert_int_eq(msg_reply_status(&m), STRATA_EPROTO);
    msg_free(&m);
    msg_free(&m); /* twice is harmless */
    free(buf);
}
END_TEST

START_TEST(accessors_name_key_and_problem)
{
    struct msg_builder b;
    msg_begin_request(&b, "submit");
    msg_key(&b, "max_tokens");
    msg_pack_str(&b, "12");
    msg_key(&b, "n");
    msg_pack_i64(&b, -5);
    msg_key(&b, "big");
    msg_pack_u64(&b, UINT64_MAX);
    msg_key(&b, "nan");
    msg_pack_f64(&b, NAN);
    msg_key(&b, "toks");
    msg_pack_array(&b, 3);
    msg_pack_i64(&b, 1);
    msg_pack_i64(&b, 2);
    msg_pack_str(&b, "x");
    msg_key(&b, "long");
    msg_pack_str(&b, "0123456789");
    msg_key(&b, "unknown_key_from_a_newer_client");
    msg_pack_map(&b, 0);
    void *buf;
    size_t len;
    ck_assert_int_eq(msg_finish(&b, &buf, &len), 0);
    struct msg m;
    ck_assert_int_eq(msg_decode(buf, len, &m), 0);

    uint64_t u;
    int64_t i;
    double d;
    bool bl;
    const char *s;
    const int32_t *t;
    uint32_t n;
    const msgpack_object *o;
    ck_assert_int_eq(msg_get_u64(&m, NULL, "max_tokens", UINT64_MAX, &u), STRATA_EPROTO);
    ck_assert_str_eq(strata_errdetail(),
                     "field 'max_tokens': expected a non-negative integer, got string");
    ck_assert_int_eq(msg_get_u64(&m, NULL, "n", 100, &u), STRATA_EPROTO);
    ck_assert_str_eq(strata_errdetail(), "field 'n': expected a non-negative integer, got -5");
    ck_assert_int_eq(msg_get_i64(&m, NULL, "n", 0, 10, &i), STRATA_EPROTO);
    ck_assert_str_eq(strata_errdetail(), "field 'n': expected an integer in [0, 10], got -5");
    ck_assert_int_eq(msg_get_i64(&m, NULL, "big", INT64_MIN, INT64_MAX, &i), STRATA_EPROTO);
    ck_assert_int_eq(msg_get_u64(&m, NULL, "big", 1000, &u), STRATA_EPROTO);
    ck_assert_int_eq(msg_get_f64(&m, NULL, "nan", -INFINITY, INFINITY, &d), STRATA_EPROTO);
    ck_assert_int_eq(msg_get_f64(&m, NULL, "big", 0, 2, &d), STRATA_EPROTO);
    ck_assert_int_eq(msg_get_bool(&m, NULL, "n", &bl), STRATA_EPROTO);
    ck_assert_str_eq(strata_errdetail(), "field 'n': expected a bool, got negative integer");
    ck_assert_int_eq(msg_get_i32s(&m, NULL, "toks", 8, 0, 10, &t, &n), STRATA_EPROTO);
    ck_assert_str_eq(strata_errdetail(),
                     "field 'toks': expected an integer in [0, 10], got string (item 2)");
    ck_assert_int_eq(msg_get_i32s(&m, NULL, "toks", 2, 0, 10, &t, &n), STRATA_EPROTO);
    ck_assert_int_eq(msg_get_str(&m, NULL, "long", 9, &s, NULL), STRATA_EPROTO);
    ck_assert_int_eq(msg_get_str(&m, NULL, "long", 10, &s, NULL), 0);
    ck_assert_int_eq(msg_get_map(&m, NULL, "toks", &o), STRATA_EPROTO);
    ck_assert_int_eq(msg_get_arr(&m, NULL, "long", 9, &o, &n), STRATA_EPROTO);
    /* looking up a key inside something that is not a map */
    ck_assert_int_eq(msg_get_arr(&m, NULL, "toks", 9, &o, &n), 0);
    ck_assert_int_eq(msg_get_i64(&m, &o[0], "k", 0, 1, &i), STRATA_EPROTO);
    msg_free(&m);
    free(buf);
}
END_TEST

START_TEST(error_reply_round_trip)
{
    void *buf;
    size_t len;
    struct msg m;
    ck_assert_int_eq(msg_error_reply(STRATA_EBUSY, "queue full: 64 requests", &buf, &len), 0);
    ck_assert_int_eq(msg_decode(buf, len, &m), 0);
    ck_assert_ptr_null(m.op);
    ck_assert(!m.ok);
    ck_assert_int_eq(msg_reply_status(&m), STRATA_EBUSY);
    ck_assert_str_eq(strata_errdetail(), "queue full: 64 requests");
    msg_free(&m);
    free(buf);

    /* no message: the code's description travels */
    ck_assert_int_eq(msg_error_reply(STRATA_ENNGERR | 5, NULL, &buf, &len), 0);
    ck_assert_int_eq(msg_decode(buf, len, &m), 0);
    ck_assert_int_eq(msg_reply_status(&m), STRATA_ENNGERR | 5);
    ck_assert_str_eq(m.err_message, strata_strerror(STRATA_ENNGERR | 5));
    msg_free(&m);
    free(buf);

    struct msg_builder b;
    msg_begin_reply(&b);
    msg_key(&b, "n");
    msg_pack_i64(&b, 3);
    ck_assert_int_eq(msg_finish(&b, &buf, &len), 0);
    void *again;
    size_t again_len;
    ck_assert_int_eq(msg_finish(&b, &again, &again_len), STRATA_EINVAL); /* already released */
    ck_assert_int_eq(msg_decode(buf, len, &m), 0);
    ck_assert(m.ok);
    ck_assert_int_eq(msg_reply_status(&m), 0);
    msg_free(&m);
    free(buf);
}
END_TEST

/* decode_raw decodes hand-made bytes and returns the code. */
static int decode_raw(const char *bytes, size_t len)
{
    struct msg m;
    int rv = msg_decode(bytes, len, &m);
    msg_free(&m);
    return rv;
}

START_TEST(envelope_is_checked)
{
    /* {"op": "x"} without "v" */
    ck_assert_int_eq(decode_raw("\x81\xa2op\xa1x", 6), STRATA_EPROTO);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "field 'v': missing"));
    /* {"v": 9, "op": "x"}: a future version */
    ck_assert_int_eq(decode_raw("\x82\xa1v\x09\xa2op\xa1x", 9), STRATA_EPROTO);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "versions 1..1"));
    /* {"v": 1}: neither op nor ok */
    ck_assert_int_eq(decode_raw("\x81\xa1v\x01", 4), STRATA_EPROTO);
    /* {"v": 1, "op": 5} */
    ck_assert_int_eq(decode_raw("\x82\xa1v\x01\xa2op\x05", 8), STRATA_EPROTO);
    /* {"v": 1, "ok": false} without "error" */
    ck_assert_int_eq(decode_raw("\x82\xa1v\x01\xa2ok\xc2", 8), STRATA_EPROTO);
    /* {"v": 1, "ok": false, "error": {"code": 0}}: a zero code would read as success */
    ck_assert_int_eq(decode_raw("\x83\xa1v\x01\xa2ok\xc2\xa5"
                                "error\x81\xa4"
                                "code\x00",
                                21),
                     STRATA_EPROTO);
    /* {"v": 1, "ok": false, "error": {"code": 4}}: the message is optional */
    ck_assert_int_eq(decode_raw("\x83\xa1v\x01\xa2ok\xc2\xa5"
                                "error\x81\xa4"
                                "code\x04",
                                21),
                     0);
}
END_TEST

START_TEST(precheck_rejects_lies)
{
    void *buf;
    size_t len;
    build_request(&buf, &len);
    /* every strict prefix is truncated, never accepted and never read past */
    for (size_t n = 0; n < len; n++) {
        char *copy = malloc(n ? n : 1);
        memcpy(copy, buf, n);
        int rv = msg_precheck(copy, n, MSG_MAX_DEPTH);
        ck_assert_msg(rv == STRATA_ETRUNC, "prefix of %zu bytes: %d", n, rv);
        free(copy);
    }
    /* trailing bytes */
    char *longer = malloc(len + 1);
    memcpy(longer, buf, len);
    longer[len] = 0;
    ck_assert_int_eq(msg_precheck(longer, len + 1, MSG_MAX_DEPTH), STRATA_EFORMAT);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "trailing"));
    free(longer);
    free(buf);

    /* top level not a map */
    ck_assert_int_eq(msg_precheck("\x92\x01\x02", 3, 8), STRATA_EFORMAT);
    ck_assert_int_eq(msg_precheck("\x01", 1, 8), STRATA_EFORMAT);
    /* map32 claiming 2^32-1 entries in 5 bytes */
    ck_assert_int_eq(msg_precheck("\xdf\xff\xff\xff\xff", 5, 8), STRATA_ETRUNC);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "declares"));
    /* array32 inside a map claiming more items than bytes */
    ck_assert_int_eq(msg_precheck("\x81\xa1"
                                  "a\xdd\x00\x01\x00\x00\x01",
                                  9, 8),
                     STRATA_ETRUNC);
    /* str32 claiming 4 GiB */
    ck_assert_int_eq(msg_precheck("\x81\xa1"
                                  "a\xdb\xff\xff\xff\xff",
                                  8, 8),
                     STRATA_ETRUNC);
    /* bin16 and ext32 lying about their length */
    ck_assert_int_eq(msg_precheck("\x81\xa1"
                                  "a\xc5\x00\x09xx",
                                  8, 8),
                     STRATA_ETRUNC);
    ck_assert_int_eq(msg_precheck("\x81\xa1"
                                  "a\xc9\x00\x00\x00\x02\x01x",
                                  10, 8),
                     STRATA_ETRUNC);
    ck_assert_int_eq(msg_precheck("\x81\xa1"
                                  "a\xc9\x00\x00\x00\x01\x01x",
                                  10, 8),
                     0);
    /* fixext, float and int sizes */
    ck_assert_int_eq(msg_precheck("\x81\xa1"
                                  "a\xd8\x01"
                                  "0123456789abcdef",
                                  21, 8),
                     0);
    ck_assert_int_eq(msg_precheck("\x81\xa1"
                                  "a\xd8\x01"
                                  "0123456789abcde",
                                  20, 8),
                     STRATA_ETRUNC);
    ck_assert_int_eq(msg_precheck("\x81\xa1"
                                  "a\xcb\x00\x00\x00\x00\x00\x00\x00",
                                  11, 8),
                     STRATA_ETRUNC);
    ck_assert_int_eq(msg_precheck("\x81\xa1"
                                  "a\xd3\x00\x00\x00\x00\x00\x00\x00\x01",
                                  12, 8),
                     0);
    /* the reserved byte */
    ck_assert_int_eq(msg_precheck("\x81\xa1"
                                  "a\xc1",
                                  4, 8),
                     STRATA_EFORMAT);

    /* depth: {"a": [[1]]} is depth 3 */
    const char *deep = "\x81\xa1"
                       "a\x91\x91\x01";
    ck_assert_int_eq(msg_precheck(deep, 6, 3), 0);
    ck_assert_int_eq(msg_precheck(deep, 6, 2), STRATA_ELIMIT);
    /* a message nested far deeper than the decoder allows is refused before unpacking */
    char nest[64];
    nest[0] = (char)0x81;
    nest[1] = (char)0xa1;
    nest[2] = 'a';
    for (int k = 3; k < 63; k++)
        nest[k] = (char)0x91;
    nest[63] = 0x01;
    ck_assert_int_eq(decode_raw(nest, sizeof nest), STRATA_ELIMIT);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("msg");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, request_round_trip);
    tcase_add_test(tc, accessors_name_key_and_problem);
    tcase_add_test(tc, error_reply_round_trip);
    tcase_add_test(tc, envelope_is_checked);
    tcase_add_test(tc, precheck_rejects_lies);
    suite_add_tcase(s, tc);
    return test_run(s);
}
