/* strata gguf — look inside a GGUF file (or split set): `strata gguf info FILE [--json]`.
 *
 * The table is for a person: long arrays are summarized ("[151936 strings]") and long strings cut.
 * --json is for a program: one document holding every KV pair (arrays of up to JSON_ARRAY_MAX
 * elements in full, longer ones as their type and count) and every tensor.
 */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/quant/qtype.h"
#include "launcher/cmd.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TABLE_STR_MAX  60   /* string values longer than this are cut in the table */
#define TABLE_ARR_MAX  8    /* arrays longer than this are shown as their type and count */
#define JSON_ARRAY_MAX 1024 /* arrays longer than this have no "value" in --json */

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: strata gguf info FILE [--json]\n\n"
        "Prints a GGUF file's version, alignment, KV pairs, tensors (name, type, shape, bytes,\n"
        "split, file offset) and bytes per type. For a split set give the -00001-of-0000N file.\n"
        "  --json   one JSON document: \"kv\" maps each key to {\"type\", \"value\"} (arrays:\n"
        "           {\"type\": \"array\", \"elem\", \"n\", \"value\"}, \"value\" left out past %d\n"
        "           elements), \"tensors\" lists {\"name\", \"type\", \"shape\", \"bytes\", "
        "\"split\",\n"
        "           \"offset\" (in the data section), \"file_offset\"}, \"totals\" bytes per "
        "type.\n",
        JSON_ARRAY_MAX);
}

/* put_str prints a string from the file: printable ASCII as is, other bytes escaped, cut at max. */
static void put_str(FILE *out, const char *s, uint64_t len, uint64_t max)
{
    fputc('"', out);
    for (uint64_t i = 0; i < len && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c >= 0x20 && c < 0x7f)
            fputc(c, out);
        else if (c == '\n')
            fputs("\\n", out);
        else
            fprintf(out, "\\x%02x", c);
    }
    fputc('"', out);
    if (len > max) fprintf(out, "... (%" PRIu64 " bytes)", len);
}

static void put_value(FILE *out, const struct gguf_value *v)
{
    switch (v->type) {
    case GGUF_STRING:
        put_str(out, v->str.ptr, v->str.len, TABLE_STR_MAX);
        return;
    case GGUF_BOOL:
        fputs(v->b ? "true" : "false", out);
        return;
    case GGUF_FLOAT32:
    case GGUF_FLOAT64:
        fprintf(out, "%.9g", v->f);
        return;
    case GGUF_INT8:
    case GGUF_INT16:
    case GGUF_INT32:
    case GGUF_INT64:
        fprintf(out, "%" PRId64, v->i);
        return;
    case GGUF_ARRAY:
        break;
    default:
        fprintf(out, "%" PRIu64, v->u);
        return;
    }
    if (v->arr.n > TABLE_ARR_MAX) {
        fprintf(out, "[%" PRIu64 " %s%s]", v->arr.n, gguf_vtype_name(v->arr.type),
                v->arr.type == GGUF_ARRAY    ? "s"
                : v->arr.type == GGUF_STRING ? "s"
                                             : "");
        return;
    }
    fputc('[', out);
    for (uint64_t i = 0; i < v->arr.n; i++) {
        if (i) fputs(", ", out);
        if (v->arr.items) {
            put_value(out, &v->arr.items[i]);
        } else if (v->arr.type == GGUF_FLOAT32 || v->arr.type == GGUF_FLOAT64) {
            fprintf(out, "%.9g", gguf_arr_f64(v, i));
        } else if (v->arr.type == GGUF_INT8 || v->arr.type == GGUF_INT16 ||
                   v->arr.type == GGUF_INT32 || v->arr.type == GGUF_INT64) {
            fprintf(out, "%" PRId64, gguf_arr_i64(v, i));
        } else if (v->arr.type == GGUF_BOOL) {
            fputs(gguf_arr_u64(v, i) ? "true" : "false", out);
        } else {
            fprintf(out, "%" PRIu64, gguf_arr_u64(v, i));
        }
    }
    fputc(']', out);
}

static void put_shape(FILE *out, const struct gguf_tensor *t, int width)
{
    char buf[128];
    int n = snprintf(buf, sizeof buf, "[");
    for (uint32_t d = 0; d < t->n_dims; d++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%" PRIu64, d ? ", " : "", t->ne[d]);
    snprintf(buf + n, sizeof buf - (size_t)n, "]");
    fprintf(out, "%-*s", width, buf);
}

static void print_table(FILE *out, const char *path, const struct gguf_file *f)
{
    fprintf(out,
            "%s: GGUF v%u, alignment %u, %" PRIu64 " KV pairs, %" PRIu64 " tensors, %u split%s\n",
            path, f->version, f->alignment, f->n_kv, f->n_tensors, f->n_splits,
            f->n_splits == 1 ? "" : "s");
    for (uint32_t s = 0; s < f->n_splits; s++)
        fprintf(out, "  split %u: %s (%" PRIu64 " bytes, data at %" PRIu64 ")\n", s,
                f->splits[s].path, f->splits[s].size, f->splits[s].data_off);
    fprintf(out, "\n%-40s %-8s %s\n", "key", "type", "value");
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        fprintf(out, "%-40s %-8s ", kv->key, gguf_vtype_name(kv->val.type));
        put_value(out, &kv->val);
        fputc('\n', out);
    }
    fprintf(out, "\n%-48s %-8s %-26s %14s %5s %14s\n", "tensor", "type", "shape", "bytes", "split",
            "offset");
    uint64_t bytes[QT_COUNT] = {0}, count[QT_COUNT] = {0}, total = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        fprintf(out, "%-48s %-8s ", t->name, qtype_name(t->type));
        put_shape(out, t, 26);
        fprintf(out, " %14" PRIu64 " %5u %14" PRIu64 "\n", t->nbytes, t->split,
                f->splits[t->split].data_off + t->offset);
        bytes[t->type] += t->nbytes;
        count[t->type]++;
        total += t->nbytes;
    }
    fprintf(out, "\n%-8s %8s %16s\n", "type", "tensors", "bytes");
    for (uint32_t q = 0; q < QT_COUNT; q++)
        if (count[q])
            fprintf(out, "%-8s %8" PRIu64 " %16" PRIu64 "\n", qtype_name(q), count[q], bytes[q]);
    fprintf(out, "%-8s %8" PRIu64 " %16" PRIu64 " (%.2f GiB)\n", "total", f->n_tensors, total,
            (double)total / (1024.0 * 1024 * 1024));
}

/* json_str makes a JSON string of bytes from the file; bytes that are not UTF-8 become '?' so a
 * broken tokenizer entry cannot make the whole document fail. */
static json_t *json_str(const char *s, uint64_t len)
{
    json_t *j = json_stringn(s, len);
    if (j) return j;
    char *c = malloc(len ? len : 1);
    if (!c) return NULL;
    for (uint64_t i = 0; i < len; i++)
        c[i] = (unsigned char)s[i] < 0x80 && s[i] ? s[i] : '?';
    j = json_stringn(c, len);
    free(c);
    return j;
}

static json_t *json_real_or_null(double d)
{
    return isfinite(d) ? json_real(d) : json_null();
}

/* json_value is the bare value: a number, string, bool or list. */
static json_t *json_value(const struct gguf_value *v)
{
    switch (v->type) {
    case GGUF_STRING:
        return json_str(v->str.ptr, v->str.len);
    case GGUF_BOOL:
        return json_boolean(v->b);
    case GGUF_FLOAT32:
    case GGUF_FLOAT64:
        return json_real_or_null(v->f);
    case GGUF_INT8:
    case GGUF_INT16:
    case GGUF_INT32:
    case GGUF_INT64:
        return json_integer(v->i);
    case GGUF_ARRAY:
        break;
    default:
        return v->u <= INT64_MAX ? json_integer((json_int_t)v->u) : json_real((double)v->u);
    }
    json_t *a = json_array();
    for (uint64_t i = 0; a && i < v->arr.n; i++) {
        json_t *e;
        enum gguf_vtype t = v->arr.type;
        if (v->arr.items)
            e = json_value(&v->arr.items[i]);
        else if (t == GGUF_FLOAT32 || t == GGUF_FLOAT64)
            e = json_real_or_null(gguf_arr_f64(v, i));
        else if (t == GGUF_BOOL)
            e = json_boolean(gguf_arr_u64(v, i));
        else if (t == GGUF_UINT64 && gguf_arr_u64(v, i) > INT64_MAX)
            e = json_real((double)gguf_arr_u64(v, i));
        else
            e = json_integer(gguf_arr_i64(v, i));
        if (json_array_append_new(a, e) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static json_t *json_kv(const struct gguf_value *v)
{
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string(gguf_vtype_name(v->type)));
    if (v->type == GGUF_ARRAY) {
        json_object_set_new(o, "elem", json_string(gguf_vtype_name(v->arr.type)));
        json_object_set_new(o, "n", json_integer((json_int_t)v->arr.n));
        if (v->arr.n > JSON_ARRAY_MAX) return o;
    }
    json_t *val = json_value(v);
    if (!val || json_object_set_new(o, "value", val) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static int print_json(FILE *out, const char *path, const struct gguf_file *f)
{
    json_t *doc = json_object(), *kv = json_object(), *tensors = json_array(),
           *splits = json_array();
    json_t *totals = json_object();
    int rv = 0;
    json_object_set_new(doc, "file", json_string(path));
    json_object_set_new(doc, "version", json_integer(f->version));
    json_object_set_new(doc, "alignment", json_integer(f->alignment));
    for (uint32_t s = 0; s < f->n_splits; s++) {
        json_t *o = json_object();
        json_object_set_new(o, "path", json_str(f->splits[s].path, strlen(f->splits[s].path)));
        json_object_set_new(o, "size", json_integer((json_int_t)f->splits[s].size));
        json_object_set_new(o, "data_offset", json_integer((json_int_t)f->splits[s].data_off));
        json_array_append_new(splits, o);
    }
    for (uint64_t i = 0; i < f->n_kv && !rv; i++) {
        json_t *o = json_kv(&f->kv[i].val);
        if (!o || json_object_set_new(kv, f->kv[i].key, o) != 0)
            rv = strata_errf(STRATA_ENOMEM, "cannot build the JSON of key %s", f->kv[i].key);
    }
    uint64_t bytes[QT_COUNT] = {0}, count[QT_COUNT] = {0}, total = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        json_t *o = json_object(), *shape = json_array();
        for (uint32_t d = 0; d < t->n_dims; d++)
            json_array_append_new(shape, json_integer((json_int_t)t->ne[d]));
        json_object_set_new(o, "name", json_str(t->name, strlen(t->name)));
        json_object_set_new(o, "type", json_string(qtype_name(t->type)));
        json_object_set_new(o, "shape", shape);
        json_object_set_new(o, "bytes", json_integer((json_int_t)t->nbytes));
        json_object_set_new(o, "split", json_integer(t->split));
        json_object_set_new(o, "offset", json_integer((json_int_t)t->offset));
        json_object_set_new(o, "file_offset",
                            json_integer((json_int_t)(f->splits[t->split].data_off + t->offset)));
        json_array_append_new(tensors, o);
        bytes[t->type] += t->nbytes;
        count[t->type]++;
        total += t->nbytes;
    }
    for (uint32_t q = 0; q < QT_COUNT; q++) {
        if (!count[q]) continue;
        json_t *o = json_object();
        json_object_set_new(o, "tensors", json_integer((json_int_t)count[q]));
        json_object_set_new(o, "bytes", json_integer((json_int_t)bytes[q]));
        json_object_set_new(totals, qtype_name(q), o);
    }
    json_object_set_new(totals, "total", json_integer((json_int_t)total));
    json_object_set_new(doc, "splits", splits);
    json_object_set_new(doc, "kv", kv);
    json_object_set_new(doc, "tensors", tensors);
    json_object_set_new(doc, "totals", totals);
    if (!rv && (json_dumpf(doc, out, JSON_INDENT(1) | JSON_PRESERVE_ORDER) != 0 ||
                fputc('\n', out) == EOF))
        rv = strata_errf(STRATA_EIO, "cannot write the JSON document");
    json_decref(doc);
    return rv;
}

static int run(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "info") != 0) {
        fprintf(stderr, "strata gguf: unknown subcommand '%s'\n", argv[1]);
        usage(stderr);
        return 2;
    }
    const char *path = NULL;
    bool json = false;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "strata gguf info: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    struct gguf_file *f;
    int rv = gguf_open(path, &f);
    if (rv) return strata_cmd_fail("gguf", "cannot read the file", rv);
    if (json)
        rv = print_json(stdout, path, f);
    else
        print_table(stdout, path, f);
    gguf_close(f);
    if (!rv && fflush(stdout) != 0) rv = strata_errf(STRATA_EIO, "cannot write to stdout");
    return rv ? strata_cmd_fail("gguf", "info", rv) : 0;
}

const struct strata_cmd strata_cmd_gguf = {"gguf",
                                           "look inside a GGUF file: gguf info FILE [--json]", run};
