/* quantize — see quantize.h. One pass over the input's tensors in file order: decide each output
 * type, declare everything to the writer, then stream each tensor's data, converting it chunk by
 * chunk on a few threads. */
#include "tools/quantize.h"
#include "common/base/err.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Output bytes converted per chunk: bounds memory (a 3-D expert tensor can be several GiB) while
 * keeping each thread's share large enough that thread start-up does not show. */
#define CHUNK_BYTES   (64u << 20)
#define MIN_ROWS_EACH 16 /* fewer rows per thread than this: convert on the caller's thread */
#define MAX_THREADS   256

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* fallback is llama.cpp's replacement for a type whose block does not divide the row length. */
static uint32_t fallback(uint32_t type, uint64_t ne0)
{
    if (ne0 % qtype_get(type)->blck == 0) return type;
    uint32_t f = QT_F16;
    switch (type) {
    case QT_Q2_K:
    case QT_Q3_K:
    case QT_IQ4_XS:
        f = QT_IQ4_NL;
        break;
    case QT_Q4_K:
        f = QT_Q5_0;
        break;
    case QT_Q5_K:
        f = QT_Q5_1;
        break;
    case QT_Q6_K:
        f = QT_Q8_0;
        break;
    default:
        break;
    }
    return ne0 % qtype_get(f)->blck == 0 ? f : QT_F16;
}

/* override_of: index of the first override whose pattern is in name, or -1. */
static int override_of(const char *name, const struct quantize_opts *opts)
{
    for (int i = 0; i < opts->n_overrides; i++)
        if (strstr(name, opts->overrides[i].pattern)) return i;
    return -1;
}

uint32_t quantize_choose(const struct gguf_tensor *t, const struct quantize_opts *opts,
                         const char **reason)
{
    *reason = "";
    uint32_t out = opts->type;
    if (opts->copy) {
        *reason = "copy";
        return t->type;
    }
    if (t->n_dims == 1) {
        const struct qtype_info *ti = qtype_get(t->type);
        if (opts->pure || !ti || !ti->computable) {
            *reason = "1-D: kept";
            return t->type;
        }
        *reason = "1-D: f32";
        out = QT_F32;
    } else if (t->n_dims > 3 || !ends_with(t->name, ".weight")) {
        *reason = "not a weight matrix: kept";
        return t->type;
    } else if (opts->pure && strstr(t->name, "ffn_gate_inp.weight")) {
        /* llama-quantize never quantizes a router, --pure or not: routing precision decides which
         * experts run, so a quantized router changes the answer more than its bytes save */
        *reason = "router: kept";
        return t->type;
    } else if (opts->mxfp4_moe && t->n_dims == 3) {
        out = QT_MXFP4;
        *reason = "experts: mxfp4";
    } else if (override_of(t->name, opts) >= 0) {
        out = opts->overrides[override_of(t->name, opts)].type;
        *reason = "--tensor-type";
    } else if (!opts->pure && strstr(t->name, "norm")) {
        *reason = "norm: f32";
        out = QT_F32;
    } else if (!opts->pure &&
               (strstr(t->name, "ffn_gate_inp.") || strstr(t->name, "ffn_gate_inp_shexp."))) {
        *reason = "router: f32";
        out = QT_F32;
    }
    if (fallback(out, t->ne[0]) != out) { /* the target's (or an override's) block must fit */
        out = fallback(out, t->ne[0]);
        *reason = out == QT_F16 ? "row not a multiple of 32: f16" : "row not a multiple of 256: fallback";
    }
    if (out == t->type && !**reason) *reason = "already this type: copied";
    return out;
}

uint32_t quantize_ftype(uint32_t type)
{
    switch (type) {
    case QT_F32:
        return 0;
    case QT_F16:
        return 1;
    case QT_Q4_0:
        return 2;
    case QT_Q4_1:
        return 3;
    case QT_Q8_0:
        return 7;
    case QT_Q5_0:
        return 8;
    case QT_Q5_1:
        return 9;
    case QT_Q2_K:
        return 10;
    case QT_Q3_K:
        return 12;
    case QT_Q4_K:
        return 15;
    case QT_Q5_K:
        return 17;
    case QT_Q6_K:
        return 18;
    case QT_IQ4_NL:
        return 25;
    case QT_IQ4_XS:
        return 30;
    case QT_MXFP4:
        return 38;
    default:
        return 32; /* BF16, the only other target quant_can_quantize accepts */
    }
}

/* ---- conversion ------------------------------------------------------------------------------ */

struct slice {
    uint32_t from, to;
    int64_t ne0;
    const uint8_t *src; /* first row of this slice */
    uint8_t *dst;
    uint64_t src_row, dst_row; /* bytes per row */
    int64_t rows;
    int rv;
};

static void *convert(void *arg)
{
    struct slice *s = arg;
    float *buf = malloc((size_t)s->ne0 * sizeof(float));
    if (!buf) {
        s->rv = STRATA_ENOMEM;
        return NULL;
    }
    for (int64_t r = 0; r < s->rows && !s->rv; r++) {
        s->rv = quant_dequantize(s->from, s->src + (uint64_t)r * s->src_row, buf, s->ne0);
        if (!s->rv) s->rv = quant_quantize(s->to, buf, s->dst + (uint64_t)r * s->dst_row, s->ne0);
    }
    free(buf);
    return NULL;
}

/* convert_rows converts rows rows starting at src into dst on up to nthreads threads. */
static int convert_rows(const struct slice *whole, int nthreads)
{
    struct slice s[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int n = (int)(whole->rows / MIN_ROWS_EACH);
    if (n > nthreads) n = nthreads;
    if (n < 1) n = 1;
    int started = 0, rv = 0;
    for (int i = 0; i < n; i++) {
        int64_t r0 = whole->rows * i / n, r1 = whole->rows * (i + 1) / n;
        s[i] = *whole;
        s[i].src += (uint64_t)r0 * whole->src_row;
        s[i].dst += (uint64_t)r0 * whole->dst_row;
        s[i].rows = r1 - r0;
        s[i].rv = 0;
    }
    if (n == 1) {
        convert(&s[0]);
        started = 0;
        rv = s[0].rv;
    } else {
        for (started = 0; started < n; started++)
            if (pthread_create(&tid[started], NULL, convert, &s[started]) != 0) break;
        /* a thread that would not start: its rows are done here instead */
        for (int i = started; i < n; i++)
            convert(&s[i]);
        for (int i = 0; i < started; i++)
            pthread_join(tid[i], NULL);
        for (int i = 0; i < n && !rv; i++)
            rv = s[i].rv;
    }
    if (rv == STRATA_ENOMEM)
        return strata_errf(rv, "no memory for a row of %lld floats", (long long)whole->ne0);
    if (rv)
        return strata_errf(STRATA_EINTERNAL,
                           "converting %s to %s failed (%s) after its checks passed",
                           qtype_name(whole->from), qtype_name(whole->to), strata_strerror(rv));
    return 0;
}

/* write_tensor streams tensor t converted to type to into w, CHUNK_BYTES of output at a time. */
static int write_tensor(struct gguf_writer *w, const struct gguf_tensor *t, uint32_t to,
                        int nthreads, uint8_t **chunk, size_t *chunk_cap)
{
    if (to == t->type) return gguf_writer_data(w, t->data, t->nbytes);
    const int64_t ne0 = (int64_t)t->ne[0];
    const int64_t rows = (int64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
    uint64_t src_row = 0, dst_row = 0;
    int rv = qtype_row_bytes(t->type, (uint64_t)ne0, &src_row);
    if (!rv) rv = qtype_row_bytes(to, (uint64_t)ne0, &dst_row);
    if (rv) return rv;
    int64_t per_chunk = (int64_t)(CHUNK_BYTES / dst_row);
    if (per_chunk < 1) per_chunk = 1;
    if (per_chunk > rows) per_chunk = rows;
    size_t need = (size_t)(per_chunk * dst_row);
    if (need > *chunk_cap) {
        uint8_t *p = realloc(*chunk, need);
        if (!p)
            return strata_errf(STRATA_ENOMEM, "no memory for a %zu-byte conversion buffer", need);
        *chunk = p;
        *chunk_cap = need;
    }
    for (int64_t r = 0; r < rows; r += per_chunk) {
        struct slice s = {
            .from = t->type,
            .to = to,
            .ne0 = ne0,
            .src = t->data + (uint64_t)r * src_row,
            .dst = *chunk,
            .src_row = src_row,
            .dst_row = dst_row,
            .rows = rows - r < per_chunk ? rows - r : per_chunk,
        };
        if ((rv = convert_rows(&s, nthreads)) != 0) return rv;
        if ((rv = gguf_writer_data(w, *chunk, (size_t)((uint64_t)s.rows * dst_row))) != 0)
            return rv;
    }
    return 0;
}

int quantize_kv_parse(char *text, struct quantize_kv *out)
{
    char *eq = strchr(text, '='), *colon = eq ? strchr(eq + 1, ':') : NULL, *end;
    if (!eq || eq == text || !colon)
        return strata_errf(STRATA_EINVAL,
                           "'%s' is not KEY=TYPE:VALUE (TYPE int, float, bool or str)", text);
    *eq = '\0';
    const char *type = eq + 1, *v = colon + 1;
    size_t tl = (size_t)(colon - type);
    out->key = text;
    if (tl == 3 && memcmp(type, "str", 3) == 0) {
        out->val = (struct gguf_value){.type = GGUF_STRING, .str = {v, strlen(v)}};
    } else if (tl == 4 && memcmp(type, "bool", 4) == 0 &&
               (strcmp(v, "true") == 0 || strcmp(v, "false") == 0)) {
        out->val = (struct gguf_value){.type = GGUF_BOOL, .b = v[0] == 't'};
    } else if (tl == 3 && memcmp(type, "int", 3) == 0) {
        long long n = strtoll(v, &end, 10);
        if (!*v || *end || n < INT32_MIN || n > INT32_MAX) goto bad;
        out->val = (struct gguf_value){.type = GGUF_INT32, .i = n};
    } else if (tl == 5 && memcmp(type, "float", 5) == 0) {
        double d = strtod(v, &end);
        if (!*v || *end) goto bad;
        out->val = (struct gguf_value){.type = GGUF_FLOAT32, .f = d};
    } else {
        goto bad;
    }
    return 0;
bad:
    *eq = '=';
    return strata_errf(STRATA_EINVAL,
                       "'%s': TYPE:VALUE must be int:N (32-bit), float:X, bool:true|false or "
                       "str:TEXT",
                       text);
}

static const struct quantize_kv *kv_override(const struct quantize_opts *o, const char *key)
{
    for (int i = 0; i < o->n_kv; i++)
        if (strcmp(o->kv[i].key, key) == 0) return &o->kv[i];
    return NULL;
}

/* copy_kv copies the metadata with the overrides, rewriting the file type and quantization
 * version (unless copying). */
static int copy_kv(struct gguf_writer *w, const struct gguf_file *f, const struct quantize_opts *o)
{
    bool had_ftype = o->copy, had_qver = o->copy;
    uint32_t type = o->type;
    int rv = 0;
    for (uint64_t i = 0; i < f->n_kv && !rv; i++) {
        const char *key = f->kv[i].key;
        const struct quantize_kv *ov = kv_override(o, key);
        if (ov) {
            rv = gguf_w_value(w, key, &ov->val);
        } else if (o->copy) {
            if (strncmp(key, "split.", 6) != 0 && strcmp(key, "general.alignment") != 0)
                rv = gguf_w_value(w, key, &f->kv[i].val);
        } else if (strcmp(key, "general.file_type") == 0) {
            rv = gguf_w_u32(w, key, quantize_ftype(o->mxfp4_moe ? QT_MXFP4 : type));
            had_ftype = true;
        } else if (strcmp(key, "general.quantization_version") == 0) {
            rv = gguf_w_u32(w, key, 2);
            had_qver = true;
        } else if (strncmp(key, "split.", 6) != 0 && strcmp(key, "general.alignment") != 0) {
            rv = gguf_w_value(w, key, &f->kv[i].val);
        }
    }
    if (!rv && !had_qver) rv = gguf_w_u32(w, "general.quantization_version", 2);
    if (!rv && !had_ftype)
        rv = gguf_w_u32(w, "general.file_type", quantize_ftype(o->mxfp4_moe ? QT_MXFP4 : type));
    for (int i = 0; i < o->n_kv && !rv; i++)
        if (!gguf_find(f, o->kv[i].key)) rv = gguf_w_value(w, o->kv[i].key, &o->kv[i].val);
    return rv;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int quantize_file(const char *in_path, const char *out_path, const struct quantize_opts *opts,
                  struct quantize_totals *totals)
{
    struct gguf_file *f = NULL;
    struct gguf_writer *w = NULL;
    uint32_t *to = NULL;
    const char **why = NULL;
    uint8_t *chunk = NULL;
    size_t chunk_cap = 0;
    struct quantize_totals tot = {0};
    const double t0 = now_s();
    int rv;
    if (!opts->copy && !quant_can_quantize(opts->type))
        return strata_errf(
            STRATA_EUNSUPPORTED,
            "cannot quantize to %s: pick f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, "
            "q4_K, q5_K, q6_K, iq4_nl or iq4_xs",
            qtype_name(opts->type));
    int nthreads = opts->threads > 0 ? opts->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nthreads < 1) nthreads = 1;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    if ((rv = gguf_open(in_path, &f)) != 0) goto fail;
    to = calloc(f->n_tensors + 1, sizeof *to);
    why = calloc(f->n_tensors + 1, sizeof *why);
    if (!to || !why) {
        rv = strata_errf(STRATA_ENOMEM, "no memory for %llu tensor plans",
                         (unsigned long long)f->n_tensors);
        goto fail;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        to[i] = quantize_choose(t, opts, &why[i]);
        const struct qtype_info *ti = qtype_get(t->type);
        if (to[i] != t->type && (!ti || !ti->computable)) {
            rv = strata_errf(STRATA_EUNSUPPORTED,
                             "%s: tensor %s is %s, which strata cannot dequantize: convert it with "
                             "llama-quantize, or start from an F32/F16/BF16 file",
                             in_path, t->name, qtype_name(t->type));
            goto fail;
        }
    }
    if ((rv = gguf_writer_open(out_path, f->alignment, &w)) != 0) goto fail;
    if ((rv = copy_kv(w, f, opts)) != 0) goto fail;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        if ((rv = gguf_w_tensor(w, t->name, to[i], t->n_dims, t->ne)) != 0) goto fail;
    }
    if ((rv = gguf_writer_begin(w)) != 0) goto fail;
    if (opts->report)
        fprintf(opts->report, "%-44s %-7s %-7s %14s %14s  %s\n", "tensor", "from", "to",
                "bytes before", "bytes after", "note");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        uint64_t out_bytes = 0;
        if ((rv = write_tensor(w, t, to[i], nthreads, &chunk, &chunk_cap)) != 0) goto fail;
        uint64_t nel = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        qtype_row_bytes(to[i], nel, &out_bytes);
        tot.bytes_in += t->nbytes;
        tot.bytes_out += out_bytes;
        tot.n_converted += to[i] != t->type;
        tot.n_tensors++;
        if (opts->report) {
            char from[16]; /* qtype_name's buffer for an unknown id is reused by the next call */
            snprintf(from, sizeof from, "%s", qtype_name(t->type));
            fprintf(opts->report, "%-44s %-7s %-7s %14llu %14llu  %s\n", t->name, from,
                    qtype_name(to[i]), (unsigned long long)t->nbytes, (unsigned long long)out_bytes,
                    why[i]);
        }
    }
    rv = gguf_writer_finish(w);
    w = NULL;
    if (rv) goto fail;
    if (opts->report) {
        double dt = now_s() - t0;
        char to_what[64];
        if (opts->copy)
            snprintf(to_what, sizeof to_what, "copied, metadata edited");
        else
            snprintf(to_what, sizeof to_what, "converted to %s (file type %u)",
                     opts->mxfp4_moe ? "mxfp4_moe" : qtype_name(opts->type),
                     quantize_ftype(opts->mxfp4_moe ? QT_MXFP4 : opts->type));
        fprintf(opts->report,
                "%u tensors, %u %s on %d threads: %.2f MiB -> %.2f MiB (%.1f%%) in %.2f s\n",
                tot.n_tensors, tot.n_converted, to_what, nthreads, (double)tot.bytes_in / 1048576,
                (double)tot.bytes_out / 1048576,
                tot.bytes_in ? 100.0 * (double)tot.bytes_out / (double)tot.bytes_in : 100.0, dt);
    }
    if (totals) *totals = tot;
fail:
    gguf_writer_abort(w);
    gguf_close(f);
    free(chunk);
    free(to);
    free(why);
    return rv;
}
