/* gguf_read_test — the reader on hand-built files: one crafted file per check (error code and
 * message), bare metadata without data, messages that name the file, split sets of three and their
 * errors, and the golden files of ../shared/data when present. Round trips through the writer are
 * in gguf_write_test.c.
 */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/quant/qtype.h"
#include "tests/testutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char *tmp_path(const char *name)
{
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", test_tmpdir(), name);
    return p;
}

/* ---- hand-built files: one per check of the reader ------------------------------------------- */

struct bb {
    uint8_t b[2048];
    size_t n;
};

static void put(struct bb *b, const void *p, size_t n)
{
    ck_assert_uint_le(b->n + n, sizeof b->b);
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void put_u32(struct bb *b, uint32_t v)
{
    put(b, &v, 4);
}
static void put_u64(struct bb *b, uint64_t v)
{
    put(b, &v, 8);
}
static void put_str(struct bb *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_hdr(struct bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    put_u32(b, GGUF_MAGIC);
    put_u32(b, version);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}
static void put_kv_u32(struct bb *b, const char *key, uint32_t v)
{
    put_str(b, key);
    put_u32(b, GGUF_UINT32);
    put_u32(b, v);
}
/* put_tinfo: name, dims, type, offset */
static void put_tinfo(struct bb *b, const char *name, uint32_t n_dims, const int64_t *ne,
                      uint32_t type, uint64_t offset)
{
    put_str(b, name);
    put_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        put_u64(b, (uint64_t)ne[d]);
    put_u32(b, type);
    put_u64(b, offset);
}
static void pad_data(struct bb *b, size_t data_bytes)
{
    while (b->n % 32)
        b->b[b->n++] = 0;
    ck_assert_uint_le(b->n + data_bytes, sizeof b->b);
    memset(b->b + b->n, 0x5a, data_bytes);
    b->n += data_bytes;
}

/* One tensor 'w' of the given shape and type at offset, then data_bytes of data. */
static void one_tensor(struct bb *b, uint32_t n_dims, const int64_t *ne, uint32_t type,
                       uint64_t offset, size_t data_bytes)
{
    put_hdr(b, 3, 1, 0);
    put_tinfo(b, "w", n_dims, ne, type, offset);
    pad_data(b, data_bytes);
}

struct bad {
    const char *what;
    int code;
    const char *msg;
};

static const struct bad bad_cases[] = {
    {"short header", STRATA_ETRUNC, "10 bytes is too short for a GGUF header"},
    {"bad magic", STRATA_EFORMAT, "not a GGUF file"},
    {"version 1", STRATA_EUNSUPPORTED, "GGUF version 1 is not supported"},
    {"big endian", STRATA_EUNSUPPORTED, "big-endian GGUF file"},
    {"version 4", STRATA_EUNSUPPORTED, "GGUF version 4 is not supported"},
    {"hostile KV count", STRATA_ETRUNC, "offset 16: header declares 1152921504606846976 KV pairs"},
    {"hostile tensor count", STRATA_ETRUNC,
     "offset 8: header declares 1152921504606846976 tensors"},
    {"key past the end", STRATA_ETRUNC, "offset 24: key of KV #0 claims 1000 bytes"},
    {"empty key", STRATA_EFORMAT, "offset 24: key of KV #0 is empty"},
    {"NUL in key", STRATA_EFORMAT, "key of KV #0 ('a?b') contains a NUL byte"},
    {"duplicate key", STRATA_EFORMAT, "duplicate key: KV 'k' repeats KV #0"},
    {"unknown KV type", STRATA_EFORMAT, "KV 'k' has unknown value type 13"},
    {"unknown element type", STRATA_EFORMAT, "array of KV 'k' has unknown element type 99"},
    {"nested too deep", STRATA_EFORMAT, "arrays of KV 'k' nest deeper than 8 levels"},
    {"hostile array count", STRATA_ETRUNC, "declares 1152921504606846976 uint32 elements"},
    {"hostile string array count", STRATA_ETRUNC, "declares 1152921504606846976 string elements"},
    {"bool 2", STRATA_EFORMAT, "bool KV 'k' is 2, not 0 or 1"},
    {"bool element 5", STRATA_EFORMAT, "bool element 1 of KV 'k' is 5"},
    {"string past the end", STRATA_ETRUNC, "string of KV 'k' claims 99 bytes"},
    {"value past the end", STRATA_ETRUNC, "value of KV 'k' needs 8 bytes"},
    {"alignment type", STRATA_EFORMAT,
     "offset 24: general.alignment has type uint64; it must be uint32"},
    {"alignment 0", STRATA_EFORMAT,
     "offset 24: general.alignment is 0; it must be a nonzero power of two"},
    {"alignment 48", STRATA_EFORMAT, "general.alignment is 48; it must be a nonzero power of two"},
    {"empty tensor name", STRATA_EFORMAT, "name of tensor #0 is empty"},
    {"5 dims", STRATA_EFORMAT, "tensor 'w' has 5 dimensions; it must have 1 to 4"},
    {"0 dims", STRATA_EFORMAT, "tensor 'w' has 0 dimensions"},
    {"dim 0", STRATA_EFORMAT, "tensor 'w' dimension 0 is 0; it must be >= 1"},
    {"negative dim", STRATA_EFORMAT, "tensor 'w' dimension 1 is -5; it must be >= 1"},
    {"element overflow", STRATA_EOVERFLOW,
     "tensor 'w' element count overflows int64 at dimension 1"},
    {"unknown tensor type", STRATA_EUNSUPPORTED, "tensor 'w' has unknown tensor type 4"},
    {"partial block", STRATA_EFORMAT,
     "tensor 'w' row length 100 is not a multiple of the q4_K block size 256"},
    {"byte overflow", STRATA_EOVERFLOW,
     "tensor 'w' byte size (4611686018427387904 f32 blocks) overflows int64"},
    {"misaligned offset", STRATA_EFORMAT,
     "tensor 'w' data offset 8 is not a multiple of the alignment 32"},
    {"offset overflow", STRATA_EOVERFLOW,
     "tensor 'w' data offset 9223372036854775776 + 256 bytes overflows int64"},
    {"data past end", STRATA_ETRUNC,
     "tensor 'w' data [96, 352) lies past the end of the file (192 bytes)"},
    {"overlap", STRATA_EFORMAT, "tensor 'b' data [128, 192) overlaps tensor 'a' data [96, 160)"},
    {"duplicate tensor", STRATA_EFORMAT,
     "duplicate tensor name 'a' (tensor #1 here; first seen as tensor #0"},
    {"tensor info cut", STRATA_ETRUNC, "shape, type and offset of tensor 'w' needs 28 bytes"},
};

static void build_bad(int k, struct bb *b)
{
    int64_t ne1[] = {64}, ne2[] = {256, 2};
    b->n = 0;
    switch (k) {
    case 0:
        put_hdr(b, 3, 0, 0), b->n = 10;
        break;
    case 1:
        put_hdr(b, 3, 0, 0), b->b[0] = 'X';
        break;
    case 2:
        put_hdr(b, 1, 0, 0);
        break;
    case 3:
        put_hdr(b, 0x03000000, 0, 0);
        break;
    case 4:
        put_hdr(b, 4, 0, 0);
        break;
    case 5:
        put_hdr(b, 3, 0, 1ull << 60);
        break;
    case 6:
        put_hdr(b, 3, 1ull << 60, 0);
        break;
    case 7:
        put_hdr(b, 3, 0, 1), put_u64(b, 1000), put_u64(b, 0);
        break;
    case 8:
        put_hdr(b, 3, 0, 1), put_str(b, ""), put_u32(b, GGUF_UINT8), put_u32(b, 0);
        break;
    case 9:
        put_hdr(b, 3, 0, 1), put_u64(b, 3), put(b, "a\0b", 3), put_u32(b, GGUF_UINT8),
            put_u32(b, 0);
        break;
    case 10:
        put_hdr(b, 3, 0, 2), put_kv_u32(b, "k", 1), put_kv_u32(b, "k", 2);
        break;
    case 11:
        put_hdr(b, 3, 0, 1), put_str(b, "k"), put_u32(b, 13), put_u64(b, 0);
        break;
    case 12:
        put_hdr(b, 3, 0, 1), put_str(b, "k"), put_u32(b, GGUF_ARRAY), put_u32(b, 99), put_u64(b, 0);
        break;
    case 13:
        put_hdr(b, 3, 0, 1), put_str(b, "k"), put_u32(b, GGUF_ARRAY);
        for (int d = 0; d < GGUF_MAX_DEPTH; d++)
            put_u32(b, GGUF_ARRAY), put_u64(b, 1);
        put_u32(b, GGUF_UINT8), put_u64(b, 0);
        break;
    case 14:
        put_hdr(b, 3, 0, 1), put_str(b, "k"), put_u32(b, GGUF_ARRAY), put_u32(b, GGUF_UINT32),
            put_u64(b, 1ull << 60);
        break;
    case 15:
        put_hdr(b, 3, 0, 1), put_str(b, "k"), put_u32(b, GGUF_ARRAY), put_u32(b, GGUF_STRING),
            put_u64(b, 1ull << 60);
        break;
    case 16:
        put_hdr(b, 3, 0, 1), put_str(b, "k"), put_u32(b, GGUF_BOOL), put(b, "\2", 1);
        break;
    case 17:
        put_hdr(b, 3, 0, 1), put_str(b, "k"), put_u32(b, GGUF_ARRAY), put_u32(b, GGUF_BOOL),
            put_u64(b, 2), put(b, "\1\5", 2);
        break;
    case 18:
        put_hdr(b, 3, 0, 1), put_str(b, "k"), put_u32(b, GGUF_STRING), put_u64(b, 99),
            put(b, "abc", 3);
        break;
    case 19:
        put_hdr(b, 3, 0, 1), put_str(b, "k"), put_u32(b, GGUF_INT64), put_u32(b, 1);
        break;
    case 20:
        put_hdr(b, 3, 0, 1), put_str(b, "general.alignment"), put_u32(b, GGUF_UINT64),
            put_u64(b, 32);
        break;
    case 21:
        put_hdr(b, 3, 0, 1), put_kv_u32(b, "general.alignment", 0);
        break;
    case 22:
        put_hdr(b, 3, 0, 1), put_kv_u32(b, "general.alignment", 48);
        break;
    case 23:
        put_hdr(b, 3, 1, 0), put_tinfo(b, "", 1, ne1, 0, 0), pad_data(b, 256);
        break;
    case 24: {
        int64_t ne[5] = {1, 1, 1, 1, 1};
        one_tensor(b, 5, ne, QT_F32, 0, 4);
        break;
    }
    case 25:
        one_tensor(b, 0, ne1, QT_F32, 0, 256);
        break;
    case 26: {
        int64_t ne[] = {0};
        one_tensor(b, 1, ne, QT_F32, 0, 0);
        break;
    }
    case 27: {
        int64_t ne[] = {4, -5};
        one_tensor(b, 2, ne, QT_F32, 0, 0);
        break;
    }
    case 28: {
        int64_t ne[] = {1ll << 32, 1ll << 32};
        one_tensor(b, 2, ne, QT_F32, 0, 0);
        break;
    }
    case 29:
        one_tensor(b, 1, ne1, 4, 0, 256);
        break;
    case 30: {
        int64_t ne[] = {100};
        one_tensor(b, 1, ne, QT_Q4_K, 0, 0);
        break;
    }
    case 31: {
        int64_t ne[] = {1ll << 62};
        one_tensor(b, 1, ne, QT_F32, 0, 0);
        break;
    }
    case 32:
        one_tensor(b, 1, ne1, QT_F32, 8, 264);
        break;
    case 33:
        one_tensor(b, 1, ne1, QT_F32, (1ull << 63) - 32, 0);
        break;
    case 34:
        one_tensor(b, 1, ne1, QT_F32, 32, 128);
        break;
    case 35: {
        int64_t n16[] = {16};
        put_hdr(b, 3, 2, 0), put_tinfo(b, "a", 1, n16, QT_F32, 0),
            put_tinfo(b, "b", 1, n16, QT_F32, 32);
        pad_data(b, 128);
        break;
    }
    case 36:
        put_hdr(b, 3, 2, 0), put_tinfo(b, "a", 2, ne2, QT_F32, 0),
            put_tinfo(b, "a", 1, ne1, QT_F32, 2048), pad_data(b, 0);
        break;
    case 37:
        put_hdr(b, 3, 1, 0), put_str(b, "w"), put_u32(b, 2), put_u64(b, 4), put_u64(b, 4),
            put_u32(b, 0), put(b, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 18);
        b->n -= 14;
        break;
    default:
        ck_abort();
    }
}

START_TEST(each_check_has_its_error)
{
    struct bb b;
    build_bad(_i, &b);
    /* an exact-size heap copy, so a read past the end is caught by ASan */
    uint8_t *buf = malloc(b.n ? b.n : 1);
    memcpy(buf, b.b, b.n);
    struct gguf_file *f = NULL;
    int rv = gguf_open_mem(buf, b.n, true, &f);
    if (rv != bad_cases[_i].code || !strstr(strata_errdetail(), bad_cases[_i].msg))
        ck_abort_msg("case '%s': got %d (%s) '%s', want %d '%s'", bad_cases[_i].what, rv,
                     strata_strerror(rv), strata_errdetail(), bad_cases[_i].code,
                     bad_cases[_i].msg);
    ck_assert_ptr_eq(f, NULL);
    free(buf);
}
END_TEST

/* An arena's metadata holds the tensor infos of all splits, whose offsets overlap: without the
 * data, offsets are not checked for overlap. */
START_TEST(metadata_without_data)
{
    struct bb b;
    build_bad(35, &b);
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open_mem(b.b, b.n, false, &f), 0);
    ck_assert_uint_eq(f->n_tensors, 2);
    ck_assert_ptr_eq(gguf_tensor_find(f, "b")->data, NULL);
    gguf_close(f);
}
END_TEST

START_TEST(messages_name_the_file)
{
    struct bb b;
    build_bad(34, &b);
    const char *path = tmp_path("past-end.gguf");
    FILE *fp = fopen(path, "wb");
    ck_assert_uint_eq(fwrite(b.b, 1, b.n, fp), b.n);
    fclose(fp);
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open(path, &f), STRATA_ETRUNC);
    char want[1200];
    snprintf(want, sizeof want,
             "%s: tensor 'w' data [96, 352) lies past the end of the file (192 bytes)", path);
    ck_assert_str_eq(strata_errdetail(), want);
    ck_assert_int_eq(gguf_open(tmp_path("nope.gguf"), &f), STRATA_ESYSERR | ENOENT);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "nope.gguf: cannot open"));
}
END_TEST

/* ---- split sets ------------------------------------------------------------------------------ */

struct split_spec {
    int no, count, total; /* the split.* values written; -1 leaves the key out */
    const char *names[2]; /* its tensors (f32 [8]), NULL-terminated */
};

static void write_split(const char *dir, int k, int of, const struct split_spec *sp)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/m-%05d-of-%05d.gguf", dir, (k + 1) % 100000, of % 100000);
    struct gguf_writer *w;
    ck_assert_int_eq(gguf_writer_open(path, 0, &w), 0);
    if (k == 0) ck_assert_int_eq(gguf_w_str(w, "general.architecture", "qwen3moe"), 0);
    if (sp->no >= 0) {
        struct gguf_value v = {.type = GGUF_UINT16, .u = (uint64_t)sp->no};
        ck_assert_int_eq(gguf_w_value(w, "split.no", &v), 0);
        v.u = (uint64_t)sp->count;
        ck_assert_int_eq(gguf_w_value(w, "split.count", &v), 0);
        ck_assert_int_eq(gguf_w_i32(w, "split.tensors.count", sp->total), 0);
    }
    uint64_t ne[] = {8};
    int n = 0;
    for (; n < 2 && sp->names[n]; n++)
        ck_assert_int_eq(gguf_w_tensor(w, sp->names[n], QT_F32, 1, ne), 0);
    ck_assert_int_eq(gguf_writer_begin(w), 0);
    for (int t = 0; t < n; t++) {
        float v[8];
        for (int e = 0; e < 8; e++)
            v[e] = (float)(k * 100 + t * 10 + e);
        ck_assert_int_eq(gguf_writer_data(w, v, sizeof v), 0);
    }
    ck_assert_int_eq(gguf_writer_finish(w), 0);
}

/* split_case writes a set of 3 (splits[k] for each k < written) in its own directory and opens it.
 */
static int split_case(const char *name, const struct split_spec *splits, int written,
                      struct gguf_file **f)
{
    char dir[1100], path[1200];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    for (int k = 0; k < written; k++)
        write_split(dir, k, 3, &splits[k]);
    snprintf(path, sizeof path, "%s/m-00001-of-00003.gguf", dir);
    *f = NULL;
    return gguf_open(path, f);
}

START_TEST(split_set_of_three)
{
    const struct split_spec ok[3] = {
        {0, 3, 4, {"a", NULL}}, {1, 3, 4, {"b", "c"}}, {2, 3, 4, {"d", NULL}}};
    struct gguf_file *f;
    ck_assert_int_eq(split_case("ok", ok, 3, &f), 0);
    ck_assert_uint_eq(f->n_splits, 3);
    ck_assert_uint_eq(f->n_tensors, 4);
    ck_assert_ptr_nonnull(gguf_find(f, "general.architecture")); /* the first split's KV pairs */
    const char *names[] = {"a", "b", "c", "d"};
    const int split_of[] = {0, 1, 1, 2}, index_in[] = {0, 0, 1, 0};
    for (int i = 0; i < 4; i++) {
        const struct gguf_tensor *t = gguf_tensor_find(f, names[i]);
        ck_assert_ptr_nonnull(t);
        ck_assert_uint_eq(t->split, split_of[i]);
        float v;
        memcpy(&v, t->data + 4 * 7, 4);
        ck_assert(v == (float)(split_of[i] * 100 + index_in[i] * 10 + 7));
        ck_assert(t->data >= f->splits[t->split].map &&
                  t->data + t->nbytes <= f->splits[t->split].map + f->splits[t->split].size);
    }
    ck_assert_ptr_nonnull(strstr(f->splits[2].path, "m-00003-of-00003.gguf"));
    gguf_close(f);

    /* the second file of a set is not a model by itself */
    char path[1200];
    snprintf(path, sizeof path, "%s/ok/m-00002-of-00003.gguf", test_tmpdir());
    ck_assert_int_eq(gguf_open(path, &f), STRATA_EINVAL);
    ck_assert_ptr_nonnull(
        strstr(strata_errdetail(), "is one split of a set of 3: open the set's first file"));
}
END_TEST

START_TEST(split_set_errors)
{
    struct gguf_file *f;
    const struct split_spec ok[3] = {
        {0, 3, 4, {"a", NULL}}, {1, 3, 4, {"b", "c"}}, {2, 3, 4, {"d", NULL}}};
    ck_assert_int_eq(split_case("missing", ok, 2, &f), STRATA_ESYSERR | ENOENT);
    ck_assert_ptr_nonnull(
        strstr(strata_errdetail(), "m-00003-of-00003.gguf: split 3 of 3 is missing"));

    const struct split_spec count[3] = {
        {0, 3, 4, {"a", NULL}}, {1, 2, 4, {"b", "c"}}, {2, 3, 4, {"d", NULL}}};
    ck_assert_int_eq(split_case("count", count, 3, &f), STRATA_EFORMAT);
    ck_assert_ptr_nonnull(
        strstr(strata_errdetail(),
               "m-00002-of-00003.gguf: split.count is 2 but the file name says 3 splits"));

    const struct split_spec no[3] = {
        {0, 3, 4, {"a", NULL}}, {0, 3, 4, {"b", "c"}}, {2, 3, 4, {"d", NULL}}};
    ck_assert_int_eq(split_case("no", no, 3, &f), STRATA_EFORMAT);
    ck_assert_ptr_nonnull(
        strstr(strata_errdetail(), "split.no is 0 but the file name says split 2"));

    const struct split_spec total[3] = {
        {0, 3, 5, {"a", NULL}}, {1, 3, 5, {"b", "c"}}, {2, 3, 5, {"d", NULL}}};
    ck_assert_int_eq(split_case("total", total, 3, &f), STRATA_EFORMAT);
    ck_assert_ptr_nonnull(
        strstr(strata_errdetail(), "split.tensors.count is 5 but the 3 splits hold 4 tensors"));

    const struct split_spec disagree[3] = {
        {0, 3, 4, {"a", NULL}}, {1, 3, 4, {"b", "c"}}, {2, 3, 3, {"d", NULL}}};
    ck_assert_int_eq(split_case("disagree", disagree, 3, &f), STRATA_EFORMAT);
    ck_assert_ptr_nonnull(
        strstr(strata_errdetail(), "split.tensors.count is 3 but the first split says 4"));

    const struct split_spec nokeys[3] = {
        {0, 3, 4, {"a", NULL}}, {-1, 0, 0, {"b", "c"}}, {2, 3, 4, {"d", NULL}}};
    ck_assert_int_eq(split_case("nokeys", nokeys, 3, &f), STRATA_EFORMAT);
    ck_assert_ptr_nonnull(
        strstr(strata_errdetail(), "m-00002-of-00003.gguf: split file lacks the key split.no"));

    /* split.no of the wrong type: the getter's own message, prefixed with the file */
    ck_assert_int_eq(split_case("signed",
                                (const struct split_spec[3]){{0, 3, 4, {"a", NULL}},
                                                             {1, 3, -4, {"b", "c"}},
                                                             {2, 3, 4, {"d", NULL}}},
                                3, &f),
                     STRATA_EFORMAT);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(),
                                 "m-00002-of-00003.gguf: GGUF key split.tensors.count is -4; a "
                                 "nonnegative value was expected"));

    const struct split_spec dup[3] = {
        {0, 3, 4, {"a", NULL}}, {1, 3, 4, {"b", "c"}}, {2, 3, 4, {"a", NULL}}};
    ck_assert_int_eq(split_case("dup", dup, 3, &f), STRATA_EFORMAT);
    ck_assert_ptr_nonnull(
        strstr(strata_errdetail(),
               "duplicate tensor name 'a' (tensor #0 here; first seen as tensor #0 of split 1)"));
    ck_assert_ptr_eq(f, NULL);
}
END_TEST

/* ---- real files ------------------------------------------------------------------------------ */

START_TEST(golden_files)
{
    static const char *types[] = {"f16",  "bf16", "q8_0", "q4_0", "q4_1", "q5_0",   "q5_1",
                                  "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "quant/golden-%s.gguf", types[i]);
        const char *path = test_data_path(rel);
        if (!path) return;
        struct gguf_file *f;
        ck_assert_msg(gguf_open(path, &f) == 0, "%s: %s", rel, strata_errdetail());
        struct gguf_str gt;
        ck_assert_int_eq(gguf_get_str(f, "golden.type", &gt), 0);
        char tname[16];
        snprintf(tname, sizeof tname, "%.*s", (int)gt.len, gt.ptr);
        const struct gguf_tensor *q = gguf_tensor_find(f, "quant"),
                                 *d = gguf_tensor_find(f, "dequant");
        ck_assert_ptr_nonnull(q);
        ck_assert_ptr_nonnull(d);
        ck_assert_int_eq((int)q->type, qtype_parse(tname));
        ck_assert_int_eq(qtype_parse(tname), qtype_parse(types[i]));
        ck_assert_uint_eq(q->n_dims, 2);
        ck_assert_uint_eq(q->ne[0], 256);
        ck_assert_uint_eq(q->ne[1], 256);
        uint64_t row;
        ck_assert_int_eq(qtype_row_bytes(q->type, 256, &row), 0);
        ck_assert_uint_eq(q->nbytes, row * 256);
        ck_assert_uint_eq(d->type, QT_F32);
        ck_assert_uint_eq(d->ne[0] * d->ne[1], 65536);
        ck_assert_uint_eq(d->nbytes, 262144);
        ck_assert(d->data + d->nbytes <= f->splits[0].map + f->splits[0].size);
        gguf_close(f);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gguf_read");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, each_check_has_its_error, 0,
                        (int)(sizeof bad_cases / sizeof bad_cases[0]));
    tcase_add_test(tc, metadata_without_data);
    tcase_add_test(tc, messages_name_the_file);
    tcase_add_test(tc, split_set_of_three);
    tcase_add_test(tc, split_set_errors);
    tcase_add_test(tc, golden_files);
    suite_add_tcase(s, tc);
    return test_run(s);
}
