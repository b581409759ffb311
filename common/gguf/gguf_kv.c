/* gguf_kv — GGUF values: the type table, scalar decoding, freeing, KV lookup by key, the typed
 * getters and the array accessors of gguf.h. Shared by the reader (gguf_read.c), which decodes
 * and frees what it parses, and the writer (gguf_write.c), which frees its copies.
 *
 * Getters convert between integer kinds only when the value fits and say so otherwise, because a
 * wrong hyperparameter is worse than a refused file; accessors are for loops over arr.n and
 * return 0 out of range rather than failing.
 */
#include "common/gguf/gguf_impl.h"
#include "common/base/err.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char *const vtype_names[GGUF_VTYPE_COUNT] = {
    "uint8", "int8",   "uint16", "int16",  "uint32", "int32",   "float32",
    "bool",  "string", "array",  "uint64", "int64",  "float64",
};
static const uint8_t vtype_sizes[GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *gguf_vtype_name(enum gguf_vtype t)
{
    return (unsigned)t < GGUF_VTYPE_COUNT ? vtype_names[t] : "?";
}

size_t gguf_vtype_size(enum gguf_vtype t)
{
    return (unsigned)t < GGUF_VTYPE_COUNT ? vtype_sizes[t] : 0;
}

void gguf_value_free(struct gguf_value *v, bool owned)
{
    if (v->type == GGUF_STRING && owned) free((void *)v->str.ptr);
    if (v->type != GGUF_ARRAY) return;
    if (v->arr.items)
        for (uint64_t i = 0; i < v->arr.n; i++)
            gguf_value_free(&v->arr.items[i], owned);
    free(v->arr.items);
    if (owned) free((void *)v->arr.raw);
    v->arr.items = NULL;
    v->arr.raw = NULL;
    v->arr.n = 0;
}

void gguf_decode_scalar(enum gguf_vtype t, uint64_t bits, struct gguf_value *v)
{
    v->type = t;
    switch (t) {
    case GGUF_INT8:
        v->i = (int8_t)bits;
        break;
    case GGUF_INT16:
        v->i = (int16_t)bits;
        break;
    case GGUF_INT32:
        v->i = (int32_t)bits;
        break;
    case GGUF_INT64:
        v->i = (int64_t)bits;
        break;
    case GGUF_FLOAT32: {
        float f;
        uint32_t b = (uint32_t)bits;
        memcpy(&f, &b, 4);
        v->f = f;
        break;
    }
    case GGUF_FLOAT64:
        memcpy(&v->f, &bits, 8);
        break;
    case GGUF_BOOL:
        v->b = bits != 0;
        break;
    default:
        v->u = bits;
        break;
    }
}

const struct gguf_kv *gguf_kv_find(const struct gguf_kv *kv, uint64_t n, const char *key)
{
    for (uint64_t i = 0; i < n; i++)
        if (strcmp(kv[i].key, key) == 0) return &kv[i];
    return NULL;
}

const struct gguf_kv *gguf_find(const struct gguf_file *f, const char *key)
{
    return gguf_kv_find(f->kv, f->n_kv, key);
}

/* get_kv finds key or sets a detail message naming it. */
static int get_kv(const struct gguf_file *f, const char *key, const struct gguf_kv **out)
{
    *out = gguf_find(f, key);
    if (!*out) return strata_errf(STRATA_ENOENT, "GGUF key %s is missing", key);
    return 0;
}

int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out)
{
    const struct gguf_kv *kv;
    int rv = get_kv(f, key, &kv);
    if (rv) return rv;
    if (gguf_vtype_signed(kv->val.type)) {
        *out = kv->val.i;
        return 0;
    }
    if (gguf_vtype_unsigned(kv->val.type) && kv->val.u <= (uint64_t)INT64_MAX) {
        *out = (int64_t)kv->val.u;
        return 0;
    }
    if (gguf_vtype_unsigned(kv->val.type))
        return strata_errf(STRATA_EFORMAT, "GGUF key %s is %" PRIu64 ", too large for int64", key,
                           kv->val.u);
    return strata_errf(STRATA_EFORMAT, "GGUF key %s has type %s; an integer was expected", key,
                       gguf_vtype_name(kv->val.type));
}

int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out)
{
    const struct gguf_kv *kv;
    int rv = get_kv(f, key, &kv);
    if (rv) return rv;
    if (gguf_vtype_unsigned(kv->val.type)) {
        *out = kv->val.u;
        return 0;
    }
    if (gguf_vtype_signed(kv->val.type) && kv->val.i >= 0) {
        *out = (uint64_t)kv->val.i;
        return 0;
    }
    if (gguf_vtype_signed(kv->val.type))
        return strata_errf(STRATA_EFORMAT,
                           "GGUF key %s is %" PRId64 "; a nonnegative value was expected", key,
                           kv->val.i);
    return strata_errf(STRATA_EFORMAT, "GGUF key %s has type %s; an integer was expected", key,
                       gguf_vtype_name(kv->val.type));
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out)
{
    uint64_t v;
    int rv = gguf_get_u64(f, key, &v);
    if (rv) return rv;
    if (v > UINT32_MAX)
        return strata_errf(STRATA_EFORMAT, "GGUF key %s is %" PRIu64 ", too large for uint32", key,
                           v);
    *out = (uint32_t)v;
    return 0;
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *out)
{
    const struct gguf_kv *kv;
    int rv = get_kv(f, key, &kv);
    if (rv) return rv;
    enum gguf_vtype t = kv->val.type;
    if (t == GGUF_FLOAT32 || t == GGUF_FLOAT64)
        *out = (float)kv->val.f;
    else if (gguf_vtype_signed(t))
        *out = (float)kv->val.i;
    else if (gguf_vtype_unsigned(t))
        *out = (float)kv->val.u;
    else
        return strata_errf(STRATA_EFORMAT, "GGUF key %s has type %s; a number was expected", key,
                           gguf_vtype_name(t));
    return 0;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out)
{
    const struct gguf_kv *kv;
    int rv = get_kv(f, key, &kv);
    if (rv) return rv;
    if (kv->val.type != GGUF_BOOL)
        return strata_errf(STRATA_EFORMAT, "GGUF key %s has type %s; a bool was expected", key,
                           gguf_vtype_name(kv->val.type));
    *out = kv->val.b;
    return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out)
{
    const struct gguf_kv *kv;
    int rv = get_kv(f, key, &kv);
    if (rv) return rv;
    if (kv->val.type != GGUF_STRING)
        return strata_errf(STRATA_EFORMAT, "GGUF key %s has type %s; a string was expected", key,
                           gguf_vtype_name(kv->val.type));
    *out = kv->val.str;
    return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem,
                 const struct gguf_value **out)
{
    const struct gguf_kv *kv;
    int rv = get_kv(f, key, &kv);
    if (rv) return rv;
    if (kv->val.type != GGUF_ARRAY)
        return strata_errf(STRATA_EFORMAT, "GGUF key %s has type %s; an array was expected", key,
                           gguf_vtype_name(kv->val.type));
    if (elem != GGUF_VTYPE_COUNT && kv->val.arr.type != elem)
        return strata_errf(STRATA_EFORMAT,
                           "GGUF key %s is an array of %s; an array of %s was expected", key,
                           gguf_vtype_name(kv->val.arr.type), gguf_vtype_name(elem));
    *out = &kv->val;
    return 0;
}

/* arr_elem decodes scalar element i of a; false when i is out of range or a holds no scalars. */
static bool arr_elem(const struct gguf_value *a, uint64_t i, struct gguf_value *v)
{
    if (a->type != GGUF_ARRAY || i >= a->arr.n || !a->arr.raw) return false;
    size_t n = gguf_vtype_size(a->arr.type);
    uint64_t bits = 0;
    memcpy(&bits, a->arr.raw + i * n, n);
    gguf_decode_scalar(a->arr.type, bits, v);
    return true;
}

/* The accessors convert between kinds as C does, except that a float outside the integer type's
 * range (or NaN) reads as 0 rather than being undefined behaviour. */
uint64_t gguf_arr_u64(const struct gguf_value *arr, uint64_t i)
{
    struct gguf_value v;
    if (!arr_elem(arr, i, &v)) return 0;
    if (v.type == GGUF_BOOL) return v.b;
    if (gguf_vtype_signed(v.type)) return (uint64_t)v.i;
    if (gguf_vtype_unsigned(v.type)) return v.u;
    return v.f >= 0 && v.f < 18446744073709551616.0 ? (uint64_t)v.f : 0;
}

int64_t gguf_arr_i64(const struct gguf_value *arr, uint64_t i)
{
    struct gguf_value v;
    if (!arr_elem(arr, i, &v)) return 0;
    if (v.type == GGUF_BOOL) return v.b;
    if (gguf_vtype_signed(v.type)) return v.i;
    if (gguf_vtype_unsigned(v.type)) return (int64_t)v.u;
    return v.f >= -9223372036854775808.0 && v.f < 9223372036854775808.0 ? (int64_t)v.f : 0;
}

double gguf_arr_f64(const struct gguf_value *arr, uint64_t i)
{
    struct gguf_value v;
    if (!arr_elem(arr, i, &v)) return 0;
    if (v.type == GGUF_BOOL) return v.b;
    if (gguf_vtype_signed(v.type)) return (double)v.i;
    if (gguf_vtype_unsigned(v.type)) return (double)v.u;
    return v.f;
}

struct gguf_str gguf_arr_str(const struct gguf_value *arr, uint64_t i)
{
    if (arr->type != GGUF_ARRAY || arr->arr.type != GGUF_STRING || i >= arr->arr.n)
        return (struct gguf_str){NULL, 0};
    return arr->arr.items[i].str;
}
