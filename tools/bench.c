#include "tools/bench.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/arena/arena.h"
#include "common/arena/model.h"
#include "common/base/pool.h"
#include "common/tok/tok.h"
#include "gpu-worker/spec.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ref/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define READ_CHUNK (1u << 20) /* bytes per work item of the read benchmark */

struct read_job {
    const uint64_t *buf;
    uint64_t sums[64][8]; /* per thread, a cache line each: the reads must not be optimized out */
};

static void read_chunks(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct read_job *j = ctx;
    const uint64_t *p = j->buf + (uint64_t)lo * (READ_CHUNK / 8);
    const uint64_t n = (uint64_t)(hi - lo) * (READ_CHUNK / 8);
    /* eight independent chains: the loads, not an add's latency, set the pace */
    uint64_t a[8] = {0};
    for (uint64_t i = 0; i < n; i += 8)
        for (int k = 0; k < 8; k++)
            a[k] += p[i + k];
    for (int k = 0; k < 8; k++)
        j->sums[thread % 64][k] += a[k];
}

int bench_read_gbs(uint32_t threads, uint64_t bytes, double *out)
{
    const uint32_t chunks = (uint32_t)(bytes / READ_CHUNK);
    int rv;
    struct pool *p = NULL;
    struct read_job *j = calloc(1, sizeof *j);
    uint64_t *buf = malloc((uint64_t)chunks * READ_CHUNK);
    if (!buf || !j) {
        rv = strata_errf(STRATA_ENOMEM, "no %llu MiB for the read-bandwidth buffer",
                         (unsigned long long)(bytes >> 20));
        goto fail;
    }
    memset(buf, 1, (uint64_t)chunks * READ_CHUNK); /* fault every page in first */
    if ((rv = pool_start(threads, &p)) != 0) goto fail;
    j->buf = buf;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        pool_for(p, chunks, 4, read_chunks, j);
        double gbs = (double)chunks * READ_CHUNK / (now_s() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    *out = best;
fail:
    pool_close(p);
    free(buf);
    free(j);
    return rv;
}

/* prompt_ids: the prompt, o->prompt synthetic ids or the tokens of o->prompt_text. */
static int prompt_ids(const struct bench_opts *o, const struct gguf_file *gf, uint32_t V,
                      struct tok_ids *ids)
{
    if (!o->prompt_text) {
        if (!(ids->v = malloc((size_t)o->prompt * sizeof *ids->v)))
            return strata_errf(STRATA_ENOMEM, "out of memory for %u prompt ids", o->prompt);
        for (uint32_t i = 0; i < o->prompt; i++)
            ids->v[i] = (int32_t)((i * 7919ull + 13) % V);
        ids->n = ids->cap = o->prompt;
        return 0;
    }
    struct tok *tk = NULL;
    size_t len = 0;
    char *text = NULL;
    FILE *fp = fopen(o->prompt_text, "rb");
    int rv = fp ? 0 : strata_errf(STRATA_ENOENT, "--prompt-text %s: cannot open it", o->prompt_text);
    if (!rv && !(text = malloc(1 << 20))) rv = STRATA_ENOMEM;
    if (!rv) len = fread(text, 1, (1 << 20) - 1, fp);
    if (!rv) rv = tok_from_gguf(gf, NULL, &tk);
    if (!rv) rv = tok_encode(tk, text, len, TOK_ADD_SPECIAL, ids);
    if (!rv && !ids->n) rv = strata_errf(STRATA_EINVAL, "--prompt-text %s has no tokens", o->prompt_text);
    if (fp) fclose(fp);
    free(text);
    tok_fini(tk);
    return rv;
}

static uint64_t xorshift(uint64_t *s);

/* open_model: the model of o->model's file, or of the arena o->arena (its metadata, its experts
 * the arena's blobs, registered and read over PCIe by a GPU backend as a worker's are); *bytes is
 * the file's size or the arena's. The caller closes *m, *gf and *ar in that order. */
static int open_model(const struct bench_opts *o, struct arena **ar, struct gguf_file **gf,
                      struct model **m, uint64_t *bytes)
{
    int rv;
    if (!o->arena) {
        struct stat st;
        if (stat(o->model, &st) == 0) *bytes = (uint64_t)st.st_size;
        if ((rv = gguf_open(o->model, gf)) != 0) return rv;
        return model_load(*gf, m);
    }
    rv = arena_open(o->shm_dir, o->arena, ar);
    if (rv == STRATA_ENOENT)
        return strata_errf(rv, "no arena named %s: start one with `strata-arena serve MODEL.gguf "
                               "--name %s`, or bench the file itself",
                           o->arena, o->arena);
    if (rv) return rv;
    *bytes = (*ar)->hdr->total_bytes;
    if ((rv = arena_meta(*ar, gf)) != 0) return rv;
    return model_load_arena(*ar, *gf, m);
}

int bench_run(const struct bench_opts *o, struct bench_result *out)
{
    struct gguf_file *gf = NULL, *dgf = NULL;
    struct model *m = NULL, *dm = NULL;
    struct kv_cache *kv = NULL;
    struct backend *f = NULL;
    struct spec_draft *sd = NULL;
    struct kv_seq s;
    struct tok_ids ids = {0};
    float *logits = NULL;
    int rv;
    kv_seq_init(&s);
    memset(out, 0, sizeof *out);
    if ((!o->prompt && !o->prompt_text) || !o->gen)
        return strata_errf(STRATA_EINVAL, "a benchmark needs --prompt and --gen of 1 or more");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    out->threads = o->threads ? o->threads : cpus > 0 ? (uint32_t)cpus : 1;
    out->isa = cpu_isa_name(cpu_isa());
    struct arena *ar = NULL;
    if ((rv = open_model(o, &ar, &gf, &m, &out->file_bytes)) != 0) goto fail;
    const uint32_t V = m->hp.n_vocab;
    if ((rv = prompt_ids(o, gf, V, &ids)) != 0) goto fail;
    const uint32_t n_prompt = (uint32_t)ids.n, n_ctx = n_prompt + o->gen + 1;
    out->prompt = n_prompt;
    if (n_ctx > m->hp.n_ctx_train) {
        rv = strata_errf(STRATA_EINVAL,
                         "a prompt of %u + --gen %u is past the model's context of %u: ask for less",
                         n_prompt, o->gen, m->hp.n_ctx_train);
        goto fail;
    }
    const uint32_t k_max = o->draft ? (o->draft_max ? o->draft_max : 4) : o->spec_lookup;
    if (k_max && o->decode_random) {
        rv = strata_errf(STRATA_EINVAL, "drafts need the greedy stream: leave out --decode-ids "
                                        "random with --draft or --spec-lookup");
        goto fail;
    }
    if (k_max > SPEC_MAX_DRAFT) {
        rv = strata_errf(STRATA_EINVAL, "%u drafts a pass: at most %d", k_max, SPEC_MAX_DRAFT);
        goto fail;
    }
    struct backend_opts bo = o->backend;
    bo.n_threads = out->threads;
    bo.max_pass_tokens = n_prompt > k_max + 1 ? n_prompt : k_max + 1;
    bo.n_ctx = n_ctx;
    bo.n_seq = 1;
    if ((rv = backend_start(m, &bo, &f)) != 0) goto fail;
    kv = backend_kv(f);
    if (o->draft) {
        const struct spec_draft_opts dopt = {.n_threads = out->threads, .n_ctx = n_ctx,
                                             .n_seq = 1, .max_pass_tokens = bo.max_pass_tokens};
        if ((rv = gguf_open(o->draft, &dgf)) != 0 || (rv = model_load(dgf, &dm)) != 0 ||
            (rv = spec_draft_start(m, dm, &dopt, &sd)) != 0)
            goto fail;
    }
    int32_t *grown = realloc(ids.v, ((size_t)n_ctx + 1) * sizeof *ids.v);
    logits = malloc((size_t)(1 + k_max) * V * sizeof *logits);
    if (grown) ids.v = grown;
    if (!grown || !logits) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for %u logits", V);
        goto fail;
    }
    /* warm-up, as llama-bench's: the whole prompt once, then start over, so the weights are paged
     * in and every scratch buffer and KV page the prompt needs is faulted in before the clock
     * starts (a server pays that once, at its first prompt that long; it was 8% of a 2048-token
     * prefill here, in the kernel's page clearing) */
    if ((rv = backend_prompt(f, &s, ids.v, n_prompt, 0, logits)) != 0) goto fail;
    for (uint32_t rep = 0; rep < (o->reps ? o->reps : 1); rep++) {
        if ((rv = kv_seq_resize(kv, &s, 0)) != 0) goto fail;
        struct backend_stats ps, ds;
        backend_reset_stats(f);
        double t0 = now_s();
        if ((rv = backend_prompt(f, &s, ids.v, n_prompt, 0, logits)) != 0) goto fail;
        double t1 = now_s();
        backend_get_stats(f, &ps);
        backend_reset_stats(f);
        struct backend_info before, after;
        backend_info(f, &before);
        /* the prefill's token, then gen more from decode passes (a draft model's time counts) */
        struct spec_seq ss = {.be = f, .sd = sd, .seq = &s};
        spec_adapt_init(&ss.ad, k_max);
        uint32_t n = n_prompt;
        uint64_t seed = 0x9e3779b97f4a7c15ull; /* the same ids every rep */
        for (uint32_t i = 0;; i++) {
            ids.v[n++] = o->decode_random ? (int32_t)(xorshift(&seed) % V)
                                          : (int32_t)ops_argmax(logits + (size_t)ss.row * V, V);
            if (i == o->gen) break;
            if (spec_seq_take(&ss, ids.v[n - 1])) continue;
            if ((rv = spec_seq_pass(&ss, ids.v, n, o->gen - i, n_ctx, bo.max_pass_tokens,
                                    logits)) != 0) {
                spec_seq_fini(&ss);
                goto fail;
            }
        }
        spec_seq_fini(&ss);
        double t2 = now_s();
        backend_get_stats(f, &ds);
        backend_info(f, &after);
        out->decode_hits = after.hits - before.hits;
        out->decode_misses = after.misses - before.misses;
        if (rep == 0 || t1 - t0 < out->prefill_s) {
            out->prefill_s = t1 - t0;
            out->prefill = ps;
        }
        if (rep == 0 || t2 - t1 < out->decode_s) {
            out->decode_s = t2 - t1;
            out->decode = ds;
            out->drafts_proposed = ss.proposed;
            out->drafts_accepted = ss.accepted;
            out->decode_passes = ss.passes;
        }
    }
    out->prefill_tok_s = n_prompt / out->prefill_s;
    out->decode_tok_s = o->gen / out->decode_s;
    out->decode_gbs = (double)out->decode.weight_bytes / out->decode_s / 1e9;
    backend_info(f, &out->info);
    rv = bench_read_gbs(out->threads, 256u << 20, &out->read_gbs);
fail:
    if (kv) kv_seq_fini(kv, &s);
    backend_close(f);
    spec_draft_close(sd);
    model_fini(dm);
    gguf_close(dgf);
    model_fini(m);
    gguf_close(gf);
    arena_close(ar);
    free(ids.v);
    free(logits);
    return rv;
}

/* ---- kernel and expert-step benchmarks ---- */

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* gaussians fills x with n normal values (Box-Muller on xorshift). */
static void gaussians(float *x, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++) {
        const double u = ((double)(xorshift(s) >> 11) + 0.5) * 0x1p-53;
        const double v = (double)(xorshift(s) >> 11) * 0x1p-53;
        x[i] = (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
    }
}

/* One matmul of a parallel loop: rows of w times n_tok activation rows. */
struct bench_task {
    uint32_t type, n_in, n_out;
    uint64_t row_bytes;
    const void *w;
    const uint8_t *acts;
    size_t act_stride;
    uint32_t n_tok;
    float *out;
    size_t out_stride;
};

/* Tasks shared out as the forward pass shares them (gpu-worker/fwd.c run_tasks): items of whole
 * rows, at least 32, about 16 items per thread, over all the tasks of one step. */
struct bench_tasks {
    const struct bench_task *t;
    uint32_t n, rows;
    uint32_t first[BENCH_MAX_TASKS + 1];
};

static void task_items(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct bench_tasks *r = ctx;
    (void)thread;
    uint32_t k = 0;
    for (uint32_t item = lo; item < hi; item++) {
        while (r->first[k + 1] <= item)
            k++;
        const struct bench_task *t = &r->t[k];
        const uint32_t r0 = (item - r->first[k]) * r->rows;
        const uint32_t r1 = t->n_out - r0 < r->rows ? t->n_out : r0 + r->rows;
        cpu_matmul(t->type, t->w, t->row_bytes, t->n_in, r0, r1, t->acts, t->act_stride,
                   t->n_tok, t->out, t->out_stride);
    }
}

static void run_tasks(struct pool *p, const struct bench_task *t, uint32_t n)
{
    struct bench_tasks r = {t, n, 0, {0}};
    uint64_t total = 0;
    for (uint32_t k = 0; k < n; k++)
        total += t[k].n_out;
    uint64_t rows = total / ((uint64_t)pool_threads(p) * 16);
    r.rows = (uint32_t)(rows < 32 ? 32 : (rows + 7) / 8 * 8);
    for (uint32_t k = 0; k < n; k++)
        r.first[k + 1] = r.first[k] + (t[k].n_out + r.rows - 1) / r.rows;
    pool_for(p, r.first[n], 1, task_items, &r);
}

static size_t act_stride_of(uint32_t wtype, uint32_t n_in)
{
    return (size_t)(quant_act_bytes(wtype, n_in) + 63) / 64 * 64;
}

int bench_matmul_gbs(uint32_t wtype, uint32_t n_in, uint32_t n_tok, uint32_t threads,
                     uint64_t bytes, double *out)
{
    const struct qtype_info *ti = qtype_get(wtype);
    uint64_t row_bytes = 0;
    if (!ti || !ti->computable || wtype == QT_F32 || wtype == QT_F16 || wtype == QT_BF16 ||
        !n_tok || n_tok > BENCH_MAX_TASKS || qtype_row_bytes(wtype, n_in, &row_bytes) ||
        n_in % ti->blck)
        return strata_errf(STRATA_EINVAL, "no matmul benchmark for %s rows of %u", qtype_name(wtype),
                           n_in);
    const uint32_t rows = (uint32_t)(bytes / row_bytes / 64 * 64), distinct = 64;
    const size_t as = act_stride_of(wtype, n_in);
    int rv = 0;
    struct pool *p = NULL;
    uint8_t *w = malloc((size_t)rows * row_bytes), *acts = malloc(as * n_tok);
    float *x = malloc(sizeof(float) * n_in * (distinct > n_tok ? distinct : n_tok));
    float *o = malloc(sizeof(float) * (size_t)rows * n_tok);
    if (!w || !acts || !x || !o) {
        rv = strata_errf(STRATA_ENOMEM, "no %llu MiB for the matmul benchmark",
                         (unsigned long long)(bytes >> 20));
        goto fail;
    }
    uint64_t seed = 0x9E3779B97F4A7C15ull ^ wtype;
    gaussians(x, (size_t)n_in * distinct, &seed);
    for (uint32_t r = 0; r < distinct; r++)
        if ((rv = quant_quantize(wtype, x + (size_t)r * n_in, w + r * row_bytes, n_in)) != 0)
            goto fail;
    for (uint32_t r = distinct; r < rows; r++) /* every page faulted in, rows repeat */
        memcpy(w + (size_t)r * row_bytes, w + (size_t)(r % distinct) * row_bytes, row_bytes);
    gaussians(x, (size_t)n_in * n_tok, &seed);
    if ((rv = cpu_quantize_acts(wtype, x, n_in, n_in, n_tok, acts, as)) != 0) goto fail;
    if ((rv = pool_start(threads, &p)) != 0) goto fail;
    const struct bench_task t = {wtype, n_in, rows, row_bytes, w, acts, as, n_tok, o, rows};
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        const double t0 = now_s();
        run_tasks(p, &t, 1);
        const double gbs = (double)rows * row_bytes / (now_s() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    *out = best;
fail:
    pool_close(p);
    free(w);
    free(acts);
    free(x);
    free(o);
    return rv;
}

/* The scratch of one expert-step run. */
struct xstep {
    struct pool *p;
    uint32_t E, F, K, n_expert, window, n_pairs;
    const struct model_mat *G, *U, *D;
    size_t sg, su, sd; /* activation strides for gate, up, down */
    float *x, *g, *u, *y, *moe, *pw;
    uint8_t *ag, *au, *pg, *pu, *hacts;
    uint32_t *ecount, *fill, *nth, *ptok, *tpair, *route;
    struct bench_task tasks[BENCH_MAX_TASKS];
};

static void xs_glu(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct xstep *s = ctx;
    (void)thread;
    for (uint32_t q = lo; q < hi; q++)
        ops_swiglu(s->g + (size_t)q * s->F, s->g + (size_t)q * s->F, s->u + (size_t)q * s->F, s->F);
    cpu_quantize_acts(s->D->type, s->g + (size_t)lo * s->F, s->F, s->F, hi - lo,
                      s->hacts + lo * s->sd, s->sd);
}

static void xs_combine(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct xstep *s = ctx;
    (void)thread;
    for (uint32_t t = lo; t < hi; t++) {
        float *o = s->moe + (size_t)t * s->E;
        memset(o, 0, s->E * sizeof(float));
        for (uint32_t i = 0; i < s->K; i++) {
            const uint32_t q = s->tpair[t * s->K + i];
            const float *y = s->y + (size_t)q * s->E;
            for (uint32_t d = 0; d < s->E; d++)
                o[d] += s->pw[q] * y[d];
        }
    }
}

/* xs_route draws each token's K distinct experts and lays the pairs out by expert, tokens
 * ascending within one expert, and each token's pairs in expert-id order (fwd's pair order). */
static void xs_route(struct xstep *s, uint64_t *seed)
{
    const uint32_t T = s->window, K = s->K;
    memset(s->ecount, 0, (s->n_expert + 1) * sizeof *s->ecount);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t i = 0; i < K; i++) {
            uint32_t e;
            bool dup;
            do {
                e = (uint32_t)(xorshift(seed) % s->n_expert);
                dup = false;
                for (uint32_t j = 0; j < i; j++)
                    dup |= s->route[t * K + j] == e;
            } while (dup);
            s->route[t * K + i] = e;
            s->ecount[e + 1]++;
        }
    for (uint32_t e = 0; e < s->n_expert; e++) {
        s->ecount[e + 1] += s->ecount[e];
        s->fill[e] = s->ecount[e];
    }
    for (uint32_t e = 0; e < s->n_expert; e++) /* expert by expert, tokens ascending */
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t i = 0; i < K; i++)
                if (s->route[t * K + i] == e) {
                    const uint32_t q = s->fill[e]++;
                    s->ptok[q] = t;
                    s->tpair[t * K + s->nth[t]++] = q;
                }
    memset(s->nth, 0, T * sizeof *s->nth);
    for (uint32_t q = 0; q < T * K; q++)
        s->pw[q] = 1.0f / (float)K;
}

struct xs_gather {
    const struct xstep *s;
    const uint8_t *src;
    uint8_t *dst;
    size_t stride;
};

static void xs_gather_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct xs_gather *j = ctx;
    (void)thread;
    for (uint32_t q = lo; q < hi; q++)
        memcpy(j->dst + q * j->stride, j->src + j->s->ptok[q] * j->stride, j->stride);
}

struct xs_quant {
    uint32_t type, n_in;
    const float *x;
    uint8_t *dst;
    size_t stride;
};

static void xs_quant_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct xs_quant *j = ctx;
    (void)thread;
    cpu_quantize_acts(j->type, j->x + (size_t)lo * j->n_in, j->n_in, j->n_in, hi - lo,
                      j->dst + lo * j->stride, j->stride);
}

/* One layer's experts: n_expert blobs of gate, up, down (pb[part] bytes each). */
struct xs_experts {
    const struct model_mat *G, *U, *D;
    uint64_t pb[3];
    uint8_t *ex;
};

/* xs_layer runs one layer's expert step; returns the expert bytes it read. */
static uint64_t xs_layer(struct xstep *s, const struct xs_experts *x)
{
    const uint32_t T = s->window, np = T * s->K;
    const uint64_t *pb = x->pb, blob = pb[0] + pb[1] + pb[2];
    const uint8_t *ex = x->ex;
    s->G = x->G;
    s->U = x->U;
    s->D = x->D;
    struct xs_quant qg = {s->G->type, s->E, s->x, s->ag, s->sg};
    pool_for(s->p, T, 16, xs_quant_rows, &qg);
    const bool same = quant_act_type(s->U->type) == quant_act_type(s->G->type);
    struct xs_gather gg = {s, s->ag, s->pg, s->sg};
    pool_for(s->p, np, 64, xs_gather_rows, &gg);
    if (!same) {
        struct xs_quant qu = {s->U->type, s->E, s->x, s->au, s->su};
        pool_for(s->p, T, 16, xs_quant_rows, &qu);
        struct xs_gather gu = {s, s->au, s->pu, s->su};
        pool_for(s->p, np, 64, xs_gather_rows, &gu);
    }
    const uint8_t *pu = same ? s->pg : s->pu;
    const size_t su = same ? s->sg : s->su;
    uint32_t nt = 0, hit = 0;
    for (uint32_t e = 0; e < s->n_expert; e++) {
        const uint32_t q0 = s->ecount[e], n = s->ecount[e + 1] - q0;
        if (!n) continue;
        const uint8_t *b = ex + e * blob;
        s->tasks[nt++] = (struct bench_task){s->G->type, s->E, s->F, s->G->row_bytes, b,
                                             s->pg + q0 * s->sg, s->sg, n, s->g + (size_t)q0 * s->F, s->F};
        s->tasks[nt++] = (struct bench_task){s->U->type, s->E, s->F, s->U->row_bytes, b + pb[0],
                                             pu + q0 * su, su, n, s->u + (size_t)q0 * s->F, s->F};
        hit++;
    }
    run_tasks(s->p, s->tasks, nt);
    pool_for(s->p, np, 8, xs_glu, s);
    nt = 0;
    for (uint32_t e = 0; e < s->n_expert; e++) {
        const uint32_t q0 = s->ecount[e], n = s->ecount[e + 1] - q0;
        if (n)
            s->tasks[nt++] = (struct bench_task){s->D->type, s->F, s->E, s->D->row_bytes,
                                                 ex + e * blob + pb[0] + pb[1],
                                                 s->hacts + q0 * s->sd, s->sd, n,
                                                 s->y + (size_t)q0 * s->E, s->E};
    }
    run_tasks(s->p, s->tasks, nt);
    pool_for(s->p, T, 4, xs_combine, s);
    return hit * blob;
}

/* act_stride_any: bytes of n activations in any form a weight type takes (Q8_0, Q8_K, F32). */
static size_t act_stride_any(uint32_t n)
{
    const size_t a = act_stride_of(QT_Q8_0, n), b = act_stride_of(QT_Q4_K, n),
                 c = act_stride_of(QT_F32, n);
    return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

int bench_experts(const struct bench_opts *o, uint32_t window, uint32_t n_expert,
                  struct bench_experts *out)
{
    struct gguf_file *gf = NULL;
    struct model *m = NULL;
    struct xstep s = {0};
    struct xs_experts *xl = NULL;
    uint32_t n_moe = 0;
    int rv;
    memset(out, 0, sizeof *out);
    uint64_t bytes = 0;
    struct arena *ar = NULL;
    if ((rv = open_model(o, &ar, &gf, &m, &bytes)) != 0) goto fail;
    const struct model_hparams *hp = &m->hp;
    if (!hp->n_expert || !window || n_expert < hp->n_expert_used ||
        2 * n_expert > BENCH_MAX_TASKS) {
        rv = strata_errf(STRATA_EINVAL,
                         "no expert benchmark for %s: %u experts of %u used, window %u, over %u",
                         o->model, hp->n_expert, hp->n_expert_used, window, n_expert);
        goto fail;
    }
    if (!(xl = calloc(hp->n_layer, sizeof *xl))) goto nomem;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const struct model_mat *P = m->layers[il].part;
        if (!P[MODEL_PART_GATE].n_out) continue; /* a dense layer */
        struct xs_experts *x = &xl[n_moe];
        x->G = &P[MODEL_PART_GATE];
        x->U = &P[MODEL_PART_UP];
        x->D = &P[MODEL_PART_DOWN];
        x->pb[0] = x->G->row_bytes * x->G->n_out;
        x->pb[1] = x->U->row_bytes * x->U->n_out;
        x->pb[2] = x->D->row_bytes * x->D->n_out;
        const uint64_t blob = x->pb[0] + x->pb[1] + x->pb[2];
        if (!(x->ex = malloc(blob * n_expert))) goto nomem;
        n_moe++;
        for (uint32_t e = 0; e < n_expert; e++)
            for (int part = 0; part < 3; part++)
                memcpy(x->ex + e * blob + (part > 0 ? x->pb[0] : 0) + (part > 1 ? x->pb[1] : 0),
                       model_expert_part(m, il, e % hp->n_expert, (enum model_part)part),
                       x->pb[part]);
    }
    s.E = hp->n_embd;
    s.F = hp->n_ff_exp;
    s.K = hp->n_expert_used;
    s.n_expert = n_expert;
    s.window = window;
    s.sg = s.su = act_stride_any(s.E);
    s.sd = act_stride_any(s.F);
    const size_t np = (size_t)window * s.K;
    s.x = malloc(sizeof(float) * window * s.E);
    s.g = malloc(sizeof(float) * np * s.F);
    s.u = malloc(sizeof(float) * np * s.F);
    s.y = malloc(sizeof(float) * np * s.E);
    s.moe = malloc(sizeof(float) * window * s.E);
    s.pw = malloc(sizeof(float) * np);
    s.ag = malloc(s.sg * window);
    s.au = malloc(s.su * window);
    s.pg = malloc(s.sg * np);
    s.pu = malloc(s.su * np);
    s.hacts = malloc(s.sd * np);
    s.ecount = calloc(n_expert + 1, sizeof *s.ecount);
    s.fill = calloc(n_expert, sizeof *s.fill);
    s.nth = calloc(window, sizeof *s.nth);
    s.ptok = calloc(np, sizeof *s.ptok);
    s.tpair = calloc(np, sizeof *s.tpair);
    s.route = calloc(np, sizeof *s.route);
    if (!s.x || !s.g || !s.u || !s.y || !s.moe || !s.pw || !s.ag || !s.au || !s.pg || !s.pu ||
        !s.hacts || !s.ecount || !s.fill || !s.nth || !s.ptok || !s.tpair || !s.route)
        goto nomem;
    uint64_t seed = 0x5EED0000ull + window;
    gaussians(s.x, (size_t)window * s.E, &seed);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if ((rv = pool_start(o->threads ? o->threads : cpus > 0 ? (uint32_t)cpus : 1, &s.p)) != 0)
        goto fail;
    out->window = window;
    out->n_expert = n_expert;
    out->layers = n_moe;
    for (uint32_t rep = 0; rep < (o->reps ? o->reps : 1) + 1; rep++) { /* rep 0 warms up */
        uint64_t bytes = 0, runs = 0;
        const double t0 = now_s();
        for (uint32_t l = 0; l < n_moe; l++) {
            xs_route(&s, &seed);
            bytes += xs_layer(&s, &xl[l]);
            for (uint32_t e = 0; e < n_expert; e++)
                runs += s.ecount[e + 1] > s.ecount[e];
        }
        const double dt = now_s() - t0;
        if (rep == 1 || (rep > 1 && bytes / dt > out->bytes / out->s)) {
            out->s = dt;
            out->bytes = bytes;
            out->hit = (double)runs / n_moe;
            out->tok_per_exp = (double)np * n_moe / runs;
        }
    }
    out->gbs = out->bytes / out->s / 1e9;
    goto fail;
nomem:
    rv = strata_errf(STRATA_ENOMEM, "out of memory for the expert benchmark of %s", o->model);
fail:
    pool_close(s.p);
    void *bufs[] = {s.x,      s.g,    s.u,   s.y,    s.moe,   s.pw,    s.ag,    s.au,
                    s.pg,     s.pu,   s.hacts, s.ecount, s.fill, s.nth, s.ptok, s.tpair,
                    s.route};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    for (uint32_t l = 0; l < n_moe; l++)
        free(xl[l].ex);
    free(xl);
    model_fini(m);
    gguf_close(gf);
    arena_close(ar);
    return rv;
}
