#include "tools/bench.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/arena/model.h"
#include "common/base/pool.h"
#include "kernels/cpu/cpu.h"

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

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int bench_run(const struct bench_opts *o, struct bench_result *out)
{
    struct gguf_file *gf = NULL;
    struct model *m = NULL;
    struct kv_cache *kv = NULL;
    struct backend *f = NULL;
    struct kv_seq s;
    int32_t *ids = NULL;
    float *logits = NULL;
    int rv;
    kv_seq_init(&s);
    memset(out, 0, sizeof *out);
    if (!o->prompt || !o->gen)
        return strata_errf(STRATA_EINVAL, "a benchmark needs --prompt and --gen of 1 or more");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    out->threads = o->threads ? o->threads : cpus > 0 ? (uint32_t)cpus : 1;
    out->isa = cpu_isa_name(cpu_isa());
    struct stat st;
    if (stat(o->model, &st) == 0) out->file_bytes = (uint64_t)st.st_size;
    if ((rv = gguf_open(o->model, &gf)) != 0 || (rv = model_load(gf, &m)) != 0) goto fail;
    const uint32_t V = m->hp.n_vocab, n_ctx = o->prompt + o->gen + 1;
    if (n_ctx > m->hp.n_ctx_train) {
        rv = strata_errf(STRATA_EINVAL,
                         "--prompt %u + --gen %u is past the model's context of %u: ask for less",
                         o->prompt, o->gen, m->hp.n_ctx_train);
        goto fail;
    }
    struct backend_opts bo = o->backend;
    bo.n_threads = out->threads;
    bo.max_pass_tokens = o->prompt;
    bo.n_ctx = n_ctx;
    bo.n_seq = 1;
    if ((rv = backend_start(m, &bo, &f)) != 0) goto fail;
    kv = backend_kv(f);
    ids = malloc((size_t)o->prompt * sizeof *ids);
    logits = malloc((size_t)V * sizeof *logits);
    if (!ids || !logits) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for %u prompt ids", o->prompt);
        goto fail;
    }
    for (uint32_t i = 0; i < o->prompt; i++)
        ids[i] = (int32_t)((i * 7919ull + 13) % V);
    /* warm-up: page the weights in (most experts are hit by 64 tokens), then start over */
    if ((rv = backend_prompt(f, &s, ids, o->prompt < 64 ? o->prompt : 64, 0, logits)) != 0) goto fail;
    for (uint32_t rep = 0; rep < (o->reps ? o->reps : 1); rep++) {
        if ((rv = kv_seq_resize(kv, &s, 0)) != 0) goto fail;
        struct backend_stats ps, ds;
        backend_reset_stats(f);
        double t0 = now_s();
        if ((rv = backend_prompt(f, &s, ids, o->prompt, 0, logits)) != 0) goto fail;
        double t1 = now_s();
        backend_get_stats(f, &ps);
        backend_reset_stats(f);
        for (uint32_t i = 0; i < o->gen; i++) {
            struct backend_token t = {&s, (int32_t)argmax(logits, V), true};
            if ((rv = backend_eval(f, &t, 1, logits)) != 0 || (rv = backend_tick(f)) != 0)
                goto fail;
        }
        double t2 = now_s();
        backend_get_stats(f, &ds);
        if (rep == 0 || t1 - t0 < out->prefill_s) {
            out->prefill_s = t1 - t0;
            out->prefill = ps;
        }
        if (rep == 0 || t2 - t1 < out->decode_s) {
            out->decode_s = t2 - t1;
            out->decode = ds;
        }
    }
    out->prefill_tok_s = o->prompt / out->prefill_s;
    out->decode_tok_s = o->gen / out->decode_s;
    out->decode_gbs = (double)out->decode.weight_bytes / out->decode_s / 1e9;
    backend_info(f, &out->info);
    rv = bench_read_gbs(out->threads, 256u << 20, &out->read_gbs);
fail:
    if (kv) kv_seq_fini(kv, &s);
    backend_close(f);
    model_fini(m);
    gguf_close(gf);
    free(ids);
    free(logits);
    return rv;
}
