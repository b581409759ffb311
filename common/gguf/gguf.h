/* gguf — the GGUF v2/v3 reader (mmap) and the one GGUF writer every tool of strata uses.
 *
 * Reader: gguf_open() maps a file read-only (all splits of a `-00001-of-0000N.gguf` set) and parses
 * the header, every KV pair and every tensor info, checking everything a truncated or hostile file
 * can lie about: counts and string lengths against the bytes left, nesting depth, dimension products
 * that overflow, unknown KV or tensor types, offsets past the end or misaligned, duplicate keys and
 * tensor names. On failure it returns STRATA_EFORMAT / STRATA_ETRUNC / STRATA_EOVERFLOW /
 * STRATA_EUNSUPPORTED with strata_errdetail() saying exactly what and where (file, offset, key or
 * tensor). After a successful open the object is immutable and any thread may read it; strings and
 * scalar arrays point into the mapping, so they live until gguf_close().
 *
 * Writer: declare KV pairs and tensors, then stream each tensor's bytes in declaration order (so a
 * 17 GiB file never sits in memory); the writer pads to the alignment, checks every byte count and
 * renames a temporary file into place only when all was written.
 */
#ifndef STRATA_GGUF_H
#define STRATA_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define GGUF_MAGIC             0x46554747u /* "GGUF" little endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS          4
#define GGUF_MAX_DEPTH         8 /* nested arrays deeper than this are refused */

enum gguf_vtype {
    GGUF_UINT8 = 0,
    GGUF_INT8 = 1,
    GGUF_UINT16 = 2,
    GGUF_INT16 = 3,
    GGUF_UINT32 = 4,
    GGUF_INT32 = 5,
    GGUF_FLOAT32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_UINT64 = 10,
    GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
    GGUF_VTYPE_COUNT,
};

struct gguf_str {
    const char *ptr; /* into the mapping (or writer-owned); NOT NUL-terminated */
    uint64_t len;
};

struct gguf_value {
    enum gguf_vtype type;
    union {
        uint64_t u;          /* UINT8..UINT64 */
        int64_t i;           /* INT8..INT64 */
        double f;            /* FLOAT32, FLOAT64 */
        bool b;              /* BOOL */
        struct gguf_str str; /* STRING */
        struct {
            enum gguf_vtype type; /* element type */
            uint64_t n;           /* element count */
            const uint8_t *raw;   /* scalar elements: n packed little-endian values in the mapping */
            struct gguf_value *items; /* STRING and ARRAY elements: n parsed values (owned) */
        } arr;
    };
};

struct gguf_kv {
    char *key; /* NUL-terminated, owned */
    struct gguf_value val;
};

struct gguf_tensor {
    char *name;                  /* NUL-terminated, owned */
    uint32_t n_dims;             /* 1..4 */
    uint64_t ne[GGUF_MAX_DIMS];  /* ggml order: ne[0] is the row length; each >= 1; unused dims are 1 */
    uint32_t type;               /* enum qtype */
    uint64_t offset;             /* from the start of its split's data section */
    uint64_t nbytes;             /* exact size of the data */
    uint32_t split;              /* index of the split file holding the data */
    const uint8_t *data;         /* into the mapping; NULL from gguf_open_mem without check_data */
};

struct gguf_split {
    char *path;
    int fd;
    const uint8_t *map;   /* whole file, PROT_READ */
    uint64_t size;        /* file size */
    uint64_t data_off;    /* offset of the data section in the file */
    dev_t dev;
    ino_t ino;
    int64_t mtime_ns;
};

struct gguf_file {
    uint32_t version;             /* 2 or 3 */
    uint32_t alignment;           /* general.alignment or 32 */
    uint64_t n_kv;
    struct gguf_kv *kv;           /* the first split's KV pairs, in file order */
    uint64_t n_tensors;
    struct gguf_tensor *tensors;  /* all splits' tensor infos, in file order */
    uint32_t n_splits;
    struct gguf_split *splits;
    uint64_t header_bytes;        /* first split: bytes of header + KV + tensor infos (unpadded) */
    uint64_t *index;              /* private to gguf.c: hash slots (tensor index + 1, 0 = empty) */
    uint64_t index_mask;          /* slots - 1; with index NULL gguf_tensor_find scans instead */
};

/* ---- reader ---------------------------------------------------------------------------------- */

/* gguf_open maps and parses path. If the name ends in -00001-of-0000N.gguf all N splits are opened
 * (each checked: same split.count, its split.no, tensors unique across splits). Caller owns *out. */
int gguf_open(const char *path, struct gguf_file **out);

/* gguf_open_mem parses a buffer (no copy; the buffer must outlive the object). For the fuzzer and
 * for readers of the metadata a strata arena stores. Tensor data offsets are checked against size,
 * and for overlaps, only when check_data is true (an arena keeps the header without the data, and
 * its merged tensor infos of all splits repeat offsets); otherwise every tensor's data is NULL. */
int gguf_open_mem(const void *buf, size_t size, bool check_data, struct gguf_file **out);

/* gguf_close unmaps and frees; NULL is fine. */
void gguf_close(struct gguf_file *f);

/* gguf_find returns the KV pair named key, or NULL. O(n) scan: files hold < 100 pairs. */
const struct gguf_kv *gguf_find(const struct gguf_file *f, const char *key);

/* Typed getters. Integer getters accept any integer KV type whose value fits, else STRATA_EFORMAT;
 * a missing key is STRATA_ENOENT (detail set); *out is untouched on error. */
int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out);
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out);
int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out); /* any float or int */
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out);
/* gguf_get_str: the string (not NUL-terminated) and its length. */
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out);
/* gguf_get_arr: an array value of the given element type (GGUF_VTYPE_COUNT: any). */
int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem,
                 const struct gguf_value **out);

/* Array element accessors (no bounds check beyond an assert-free clamp: callers loop to arr.n). */
uint64_t gguf_arr_u64(const struct gguf_value *arr, uint64_t i); /* unsigned/bool elements */
int64_t gguf_arr_i64(const struct gguf_value *arr, uint64_t i);  /* any integer element */
double gguf_arr_f64(const struct gguf_value *arr, uint64_t i);   /* any numeric element */
struct gguf_str gguf_arr_str(const struct gguf_value *arr, uint64_t i);

/* gguf_tensor_find returns the tensor named name, or NULL (hash lookup). */
const struct gguf_tensor *gguf_tensor_find(const struct gguf_file *f, const char *name);

/* gguf_vtype_name: "uint8", ..., "array"; "?" when out of range. */
const char *gguf_vtype_name(enum gguf_vtype t);
/* gguf_vtype_size: bytes of a scalar type, 0 for STRING, ARRAY and unknown. */
size_t gguf_vtype_size(enum gguf_vtype t);

/* ---- writer ---------------------------------------------------------------------------------- */

struct gguf_writer;

/* gguf_writer_open starts a GGUF v3 file at path (written as path.tmp, renamed by
 * gguf_writer_finish). alignment: 0 for the default 32; others are written as general.alignment. */
int gguf_writer_open(const char *path, uint32_t alignment, struct gguf_writer **out);

/* KV setters: copy key and value. A repeated key is STRATA_EEXIST. Must precede gguf_writer_begin. */
int gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_w_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_w_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_w_f32(struct gguf_writer *w, const char *key, float v);
int gguf_w_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_w_str(struct gguf_writer *w, const char *key, const char *v);
int gguf_w_strn(struct gguf_writer *w, const char *key, const char *v, uint64_t len);
/* gguf_w_arr: an array of n scalar elements of type elem, packed little-endian in data. */
int gguf_w_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem, uint64_t n,
               const void *data);
/* gguf_w_arr_str: an array of n strings (each NUL-terminated, or with lens[i] when lens != NULL). */
int gguf_w_arr_str(struct gguf_writer *w, const char *key, uint64_t n, const char *const *strs,
                   const uint64_t *lens);
/* gguf_w_value copies any parsed value, nested arrays included (for tools that copy metadata). */
int gguf_w_value(struct gguf_writer *w, const char *key, const struct gguf_value *v);

/* gguf_w_tensor declares a tensor (dims in ggml order). Sizes are checked against the type's block. */
int gguf_w_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                  const uint64_t *ne);

/* gguf_writer_begin writes header, KV pairs and tensor infos; then tensor data follows. */
int gguf_writer_begin(struct gguf_writer *w);

/* gguf_writer_data appends bytes of the tensors in declaration order; a call may span tensors. The
 * writer inserts the alignment padding between tensors itself. */
int gguf_writer_data(struct gguf_writer *w, const void *buf, size_t n);

/* gguf_writer_finish checks every tensor was written in full, flushes, renames into place and frees
 * w. gguf_writer_abort removes the temporary file and frees w. Either accepts NULL. */
int gguf_writer_finish(struct gguf_writer *w);
void gguf_writer_abort(struct gguf_writer *w);

#endif
