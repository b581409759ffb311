/* The CPU backend: today's forward pass, behind backend.h's table.
 *
 * Kernels: kernels/cpu (AVX2 / AVX-512 when the CPU has them, equal bit for bit to kernels/ref).
 * Every matmul output is one row dot of one token, attention walks keys in fixed blocks, experts
 * are added to a token in expert-id order (kernels/ref/moe.h), and threads only split independent
 * rows or heads: bit-exact by construction for each KV type. The routed experts of a layer run as
 * one cpu_moe_ffn step over every expert (the GPU backend runs the same step for its misses).
 * A backend owns its scratch, its K/V storage (kv_store) and a pool of n_threads-1 threads.
 * gpt-oss's extras ride in the same steps, switched by the model's flags: q/k/v biases with the
 * others, YaRN in the RoPE (cpu_rope_yarn), windows and sinks in cpu_attention's query table
 * (att_items, sinks_of), the output and router biases (add_rows), and the expert biases and
 * clamped SwiGLU inside the expert step (cpu_moe_set_oss), whose blobs carry the biases.
 * Slot mode (the expert cache on the host and its tier) is backend_cpu_cache.c.
 */
#include "gpu-worker/backend_cpu_int.h"
#include "gpu-worker/fwd_mla.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/base/pool.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_mm.h"
#include "kernels/cpu/moe.h"
#include "kernels/ref/moe.h"
#include "kernels/ref/ops.h"
#include "kernels/ref/route.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double bcpu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int bcpu_env_flag(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static void widen_act(struct fwd *f, const struct model_mat *w)
{
    if (!w->n_in) return;
    size_t b = quant_act_bytes(w->type, w->n_in);
    if (b > f->act_stride) f->act_stride = b;
}

static size_t mla_act_bytes(const struct model_mat *w);

static int alloc_scratch(struct fwd *f)
{
    const struct model_hparams *hp = &f->m->hp;
    const size_t T = f->o.max_pass_tokens;
    f->n_ff = hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp;
    if (hp->n_ff_dense > f->n_ff) f->n_ff = hp->n_ff_dense;
    widen_act(f, &f->m->output);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const struct model_layer *L = &f->m->layers[l];
        const struct model_mat *mats[] = {&L->wq,       &L->wk,         &L->wv,
                                          &L->wo,       &L->router,     &L->part[0],
                                          &L->part[1],  &L->part[2],    &L->gate_shexp,
                                          &L->up_shexp, &L->down_shexp, &L->gate_inp_shexp,
                                          &L->ffn_gate, &L->ffn_up,     &L->ffn_down,
                                          &L->wq_a,     &L->wq_b,       &L->wkv_a};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            widen_act(f, mats[i]);
    }
    /* Round rows up to 64 bytes so each token's activations start on their own cache line. */
    f->act_stride = (f->act_stride + 63) & ~(size_t)63;
    size_t mla_acts_max = 0; /* MLA: a head's k_b / v_b input row, the widest of the layers */
    for (uint32_t l = 0; hp->mla && l < hp->n_layer; l++) {
        const struct model_layer *L = &f->m->layers[l];
        const size_t kb = mla_act_bytes(&L->k_b), vb = mla_act_bytes(&L->v_b);
        if (kb > mla_acts_max) mla_acts_max = kb;
        if (vb > mla_acts_max) mla_acts_max = vb;
    }
    const size_t E = hp->n_embd, K = hp->n_expert_used, P = T * (K ? K : 1);
    f->max_tasks = 3;
    struct {
        void **p;
        size_t bytes;
    } bufs[] = {
        {(void **)&f->x, T * E * sizeof(float)},
        {(void **)&f->xn, T * E * sizeof(float)},
        {(void **)&f->tmp, T * E * sizeof(float)},
        {(void **)&f->q, T * hp->n_head * hp->head_dim * sizeof(float)},
        {(void **)&f->k, T * hp->n_head_kv * hp->head_dim * sizeof(float)},
        {(void **)&f->v, T * hp->n_head_kv * hp->head_dim_v * sizeof(float)},
        {(void **)&f->att, T * hp->n_head * hp->head_dim_v * sizeof(float)},
        {(void **)&f->rlogit, T * hp->n_expert * sizeof(float)},
        {(void **)&f->rsel, hp->n_expert * sizeof(float)},
        {(void **)&f->mla_q, T * hp->n_head * hp->head_dim_qk * sizeof(float)},
        {(void **)&f->mla_qa, T * hp->n_lora_q * sizeof(float)},
        {(void **)&f->mla_o, T * hp->n_head * hp->head_dim_vo * sizeof(float)},
        {(void **)&f->mla_tasks, (hp->mla ? hp->n_head : 0) * sizeof(struct cpu_mm_task)},
        {(void **)&f->mla_first, (hp->mla ? hp->n_head + 1 : 0) * sizeof(uint32_t)},
        {(void **)&f->mla_acts, T * hp->n_head * mla_acts_max},
        {(void **)&f->sel, T * K * sizeof(int32_t)},
        {(void **)&f->selw, T * K * sizeof(float)},
        {(void **)&f->moe, T * E * sizeof(float)},
        {(void **)&f->g, T * f->n_ff * sizeof(float)},
        {(void **)&f->u, T * f->n_ff * sizeof(float)},
        {(void **)&f->y, P * E * sizeof(float)},
        {(void **)&f->shg, T * sizeof(float)},
        {(void **)&f->groups, (hp->n_expert ? hp->n_expert : 1) * sizeof(struct moe_group)},
        {(void **)&f->pair_idx, P * sizeof(int32_t)},
        {(void **)&f->rtok, T * sizeof(uint32_t)},
        {(void **)&f->acts[0], T * f->act_stride},
        {(void **)&f->acts[1], T * f->act_stride},
        {(void **)&f->acts[2], T * f->act_stride},
        {(void **)&f->tasks, f->max_tasks * sizeof(struct cpu_mm_task)},
        {(void **)&f->task_first, (f->max_tasks + 1) * sizeof(uint32_t)},
        {(void **)&f->pos, T * sizeof(uint32_t)},
        {(void **)&f->run_first, (T + 1) * sizeof(uint32_t)},
        {(void **)&f->seen, T * sizeof(struct kv_seq *)},
        {(void **)&f->seen_len, T * sizeof(uint32_t)},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i].p = malloc(bufs[i].bytes ? bufs[i].bytes : 1);
        if (!*bufs[i].p)
            return strata_errf(STRATA_ENOMEM,
                               "out of memory for forward scratch of %zu tokens: lower the batch "
                               "or chunk size",
                               T);
    }
    f->att_scratch_bytes =
        (kv_store_scratch_bytes(f->store, hp->head_dim, hp->head_dim_v) + 63) & ~(size_t)63;
    if (!(f->att_scratch = aligned_alloc(64, f->o.n_threads * f->att_scratch_bytes)))
        return strata_errf(STRATA_ENOMEM, "out of memory for attention scratch (%zu bytes)",
                           f->o.n_threads * f->att_scratch_bytes);
    int rv = cpu_moe_init((uint32_t)P, (uint32_t)E, hp->n_ff_exp, f->act_stride,
                          hp->n_expert ? hp->n_expert : 1, &f->moe_w);
    if (rv) return rv;
    /* gpt-oss: SwiGLU alpha and limit as llama.cpp's LLM_FFN_SWIGLU_OAI_MOE */
    const struct cpu_moe_oss oss = {hp->exp_bias, hp->glu_oai, 1.702f, 7.0f};
    cpu_moe_set_oss(f->moe_w, &oss);
    return 0;
}

static void cpu_close(void *impl);

static int cpu_start(const struct model *m, const struct backend_opts *o, struct kv_cache *kv,
                     void **out)
{
    struct fwd *f = calloc(1, sizeof *f);
    if (!f) return strata_errf(STRATA_ENOMEM, "out of memory for the forward pass");
    f->m = m;
    f->kv = kv;
    f->o = *o;
    ops_yarn_init(&f->yarn, m->hp.n_rot, m->hp.yarn_orig_ctx, m->hp.rope_theta, m->hp.yarn_factor);
    /* DeepSeek's YaRN leaves the RoPE's magnitude at 1 and puts mscale^2 into the attention
     * scale instead (hp.kq_scale), as llama.cpp's deepseek2 graph does */
    if (m->hp.mla) f->yarn.mscale = 1.0f;
    if (f->o.n_threads == 0) f->o.n_threads = 1;
    f->timing = bcpu_env_flag("STRATA_DECODE_TIMING", 0) != 0;
    int rv;
    if ((rv = kv_store_init(kv_config_of(kv), o->kv_type, &f->store)) != 0 ||
        (rv = alloc_scratch(f)) != 0 || (rv = pool_start(f->o.n_threads, &f->pool)) != 0 ||
        (rv = bcpu_cache_open(f)) != 0)
        goto fail;
    *out = f;
    return 0;
fail:
    cpu_close(f);
    return rv;
}

static void cpu_close(void *impl)
{
    struct fwd *f = impl;
    if (!f) return;
    pool_close(f->pool);
    void *bufs[] = {f->x,         f->xn,      f->tmp,       f->q,           f->k,          f->v,
                    f->att,       f->rlogit,  f->sel,       f->selw,        f->moe,        f->g,
                    f->u,         f->y,       f->shg,       f->groups,      f->pair_idx,   f->rtok,
                    f->acts[0],   f->acts[1], f->acts[2],   f->tasks,       f->task_first, f->pos,
                    f->run_first, f->seen,    f->seen_len,  f->att_scratch, f->rsel,       f->mla_q,
                    f->mla_qa,    f->mla_o,   f->mla_tasks, f->mla_first,   f->mla_acts};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    bcpu_cache_close(f);
    cpu_moe_fini(f->moe_w);
    kv_store_fini(f->store);
    free(f);
}

static void cpu_set_route(void *impl, backend_route_fn fn, void *ctx)
{
    struct fwd *f = impl;
    f->route = fn;
    f->route_ctx = ctx;
}

static void cpu_get_stats(const void *impl, struct backend_stats *out)
{
    const struct fwd *f = impl;
    *out = f->st;
}

static void cpu_reset_stats(void *impl)
{
    struct fwd *f = impl;
    memset(&f->st, 0, sizeof f->st);
}

/* ---- matmuls ------------------------------------------------------------------------------ */

/* run_tasks computes f->tasks[0..n) in one parallel loop (cpu_mm.h). */
static void run_tasks(struct fwd *f, uint32_t n)
{
    f->st.weight_bytes += cpu_mm_run(f->pool, f->tasks, n, f->task_first);
}

/* Quantization of n rows for the pool: rows [lo, hi) of src into dst. */
struct quant_job {
    uint32_t type, n_in;
    const float *x;
    size_t x_stride;
    uint8_t *dst;
    size_t dst_stride;
    _Atomic int rv;
};

static void quant_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct quant_job *j = ctx;
    int rv = cpu_quantize_acts(j->type, j->x + lo * j->x_stride, j->x_stride, j->n_in, hi - lo,
                               j->dst + lo * j->dst_stride, j->dst_stride);
    if (rv) atomic_store(&j->rv, rv);
}

/* quantize: activations of n rows of x for a matmul with w, into dst (rows of act_stride). */
static int quantize(struct fwd *f, const struct model_mat *w, const float *x, size_t x_stride,
                    uint32_t n, uint8_t *dst)
{
    struct quant_job j = {w->type, w->n_in, x, x_stride, dst, f->act_stride, 0};
    pool_for(f->pool, n, 16, quant_rows, &j);
    return atomic_load(&j.rv);
}

static struct cpu_mm_task task(struct fwd *f, const struct model_mat *w, const void *wdata,
                               const void *acts, uint32_t n_tok, float *out, size_t out_stride)
{
    return (struct cpu_mm_task){w->type, w->n_in,       w->n_out, w->row_bytes, wdata,
                                acts,    f->act_stride, n_tok,    out,          out_stride};
}

/* inputs_for: activations of x (n rows of w->n_in) for matrix w, reusing those already made for
 * `prev` when both quantize the same way. */
static int inputs_for(struct fwd *f, const struct model_mat *w, const struct model_mat *prev,
                      const uint8_t *prev_acts, const float *x, size_t x_stride, uint32_t n,
                      uint8_t *dst, const uint8_t **out)
{
    if (prev && quant_act_type(prev->type) == quant_act_type(w->type) && prev->n_in == w->n_in) {
        *out = prev_acts;
        return 0;
    }
    *out = dst;
    return quantize(f, w, x, x_stride, n, dst);
}

/* matmul: out (n_tok rows of out_stride floats) = W . x for n_tok rows of x (x_stride floats). */
static int matmul(struct fwd *f, const struct model_mat *w, const float *x, size_t x_stride,
                  uint32_t n_tok, float *out, size_t out_stride)
{
    int rv = quantize(f, w, x, x_stride, n_tok, f->acts[0]);
    if (rv) return rv;
    f->tasks[0] = task(f, w, w->data, f->acts[0], n_tok, out, out_stride);
    run_tasks(f, 1);
    return 0;
}

/* add_rows adds bias b (width floats) to each of n rows of x (gpt-oss's output and router
 * biases). */
static void add_rows(float *x, const float *b, uint32_t n, size_t width)
{
    for (uint32_t t = 0; t < n; t++)
        for (size_t i = 0; i < width; i++)
            x[t * width + i] += b[i];
}

/* ---- attention ----------------------------------------------------------------------------- */

/* Attention job: items are (run, KV head) pairs; a run is up to ATT_RUN consecutive tokens of
 * one sequence at consecutive positions (a prompt chunk), so they share each block of keys. */
#define ATT_RUN 16

struct att_job {
    struct fwd *f;
    const struct backend_token *toks;
    uint32_t layer;
    uint32_t n_runs;
    uint32_t split; /* items per (run, KV head): its query heads in that many parts */
};

/* sinks_of: the sink logits of query heads h.. of layer il (gpt-oss), NULL without sinks. */
static const float *sinks_of(const struct model *m, uint32_t il, uint32_t h)
{
    return m->layers[il].sinks ? m->layers[il].sinks + h : NULL;
}

/* att_split: parts to cut each (run, KV head) item's group of query heads into so that `items`
 * of them keep `threads` busy: a decode step has one item per KV head (4 for Qwen3-30B-A3B), and
 * on 16 threads attention took a fifth of it. The largest divisor of group up to what the threads
 * need; each query is computed on its own (cpu_attention), so the parts change no bit, only how
 * often a K/V block is read. */
static uint32_t att_split(uint32_t group, uint32_t items, uint32_t threads)
{
    const uint32_t want = (threads + items - 1) / items;
    uint32_t split = 1;
    for (uint32_t d = 2; d <= group && d <= want; d++)
        if (group % d == 0) split = d;
    return split;
}

static void att_items(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct att_job *j = ctx;
    struct fwd *f = j->f;
    const struct model_hparams *hp = &f->m->hp;
    const float scale = 1.0f / sqrtf((float)hp->head_dim);
    const uint32_t group = hp->n_head / hp->n_head_kv, heads = group / j->split;
    const size_t nq = (size_t)hp->n_head * hp->head_dim, no = (size_t)hp->n_head * hp->head_dim_v;
    for (uint32_t i = lo; i < hi; i++) {
        const uint32_t part = i % j->split, rg = i / j->split;
        const uint32_t r = rg / hp->n_head_kv, g = rg % hp->n_head_kv, h = g * group + part * heads;
        const uint32_t t0 = f->run_first[r], nt = f->run_first[r + 1] - t0;
        struct ops_kv_view view;
        kv_store_view_direct(f->store, j->toks[t0].seq, j->layer, g, hp->head_dim, hp->head_dim_v,
                             f->pos[t0] + nt,
                             f->att_scratch + (size_t)thread * f->att_scratch_bytes, &view);
        const struct cpu_att_q a = {f->q + t0 * nq + (size_t)h * hp->head_dim,
                                    nq,
                                    hp->head_dim,
                                    f->att + t0 * no + (size_t)h * hp->head_dim_v,
                                    no,
                                    hp->head_dim_v,
                                    nt,
                                    heads,
                                    f->pos[t0] + 1,
                                    f->m->layers[j->layer].swa ? hp->n_swa : 0,
                                    sinks_of(f->m, j->layer, h)};
        cpu_attention(&a, hp->head_dim, hp->head_dim_v, scale, &view);
    }
}

/* runs splits the batch into runs of one sequence's consecutive positions, at most ATT_RUN tokens
 * and CPU_ATT_MAXQ queries each; returns their count. */
static uint32_t runs(struct fwd *f, const struct backend_token *toks, uint32_t n)
{
    const uint32_t group = f->m->hp.n_head / f->m->hp.n_head_kv;
    uint32_t max = CPU_ATT_MAXQ / group < ATT_RUN ? CPU_ATT_MAXQ / group : ATT_RUN, nr = 0;
    if (!max) max = 1;
    for (uint32_t t = 0; t < n; t++)
        if (t == 0 || toks[t].seq != toks[t - 1].seq || f->pos[t] != f->pos[t - 1] + 1 ||
            t - f->run_first[nr - 1] == max)
            f->run_first[nr++] = t;
    f->run_first[nr] = n;
    return nr;
}

/* After the projections, per token (items): biases, q/k norms, RoPE, and the K/V store. */
struct qkv_job {
    struct fwd *f;
    const struct backend_token *toks;
    uint32_t layer;
};

static void qkv_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct qkv_job *j = ctx;
    struct fwd *f = j->f;
    const struct backend_token *toks = j->toks;
    const uint32_t il = j->layer;
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[il];
    const size_t nq = (size_t)hp->n_head * hp->head_dim, nk = (size_t)hp->n_head_kv * hp->head_dim,
                 nv = (size_t)hp->n_head_kv * hp->head_dim_v;
    for (uint32_t t = lo; t < hi; t++) {
        float *q = f->q + t * nq, *k = f->k + t * nk, *v = f->v + t * nv;
        if (L->bq) {
            for (size_t i = 0; i < nq; i++)
                q[i] += L->bq[i];
            for (size_t i = 0; i < nk; i++)
                k[i] += L->bk[i];
            for (size_t i = 0; i < nv; i++)
                v[i] += L->bv[i];
        }
        if (hp->qk_norm == MODEL_QK_NORM_HEAD) {
            for (uint32_t h = 0; h < hp->n_head; h++)
                cpu_rmsnorm(q + h * hp->head_dim, q + h * hp->head_dim, L->q_norm, hp->head_dim,
                            hp->rms_eps);
            for (uint32_t h = 0; h < hp->n_head_kv; h++)
                cpu_rmsnorm(k + h * hp->head_dim, k + h * hp->head_dim, L->k_norm, hp->head_dim,
                            hp->rms_eps);
        } else if (hp->qk_norm == MODEL_QK_NORM_FULL) {
            cpu_rmsnorm(q, q, L->q_norm, nq, hp->rms_eps);
            cpu_rmsnorm(k, k, L->k_norm, nk, hp->rms_eps);
        }
        const bool neox = hp->rope == MODEL_ROPE_NEOX;
        if (hp->yarn_factor > 1.0f) {
            /* YaRN (gpt-oss): the angles mixed per pair */
            cpu_rope_yarn(q, hp->n_head, hp->head_dim, hp->n_rot, f->pos[t], hp->rope_theta, neox,
                          &f->yarn);
            cpu_rope_yarn(k, hp->n_head_kv, hp->head_dim, hp->n_rot, f->pos[t], hp->rope_theta,
                          neox, &f->yarn);
        } else {
            cpu_rope(q, hp->n_head, hp->head_dim, hp->n_rot, f->pos[t], hp->rope_theta, neox);
            cpu_rope(k, hp->n_head_kv, hp->head_dim, hp->n_rot, f->pos[t], hp->rope_theta, neox);
        }
        kv_store_write(f->store, toks[t].seq, il, f->pos[t], k, v);
    }
}

/* ---- multi-head latent attention (deepseek2; the rows in fwd_mla.c) ------------------------- */

struct mla_job {
    struct fwd *f;
    const struct backend_token *toks;
    uint32_t layer, n_runs, chunk, n_chunks;
};

/* mla_rows, items = tokens: the queries' rope parts, the cached row (stored). */
static void mla_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct mla_job *j = ctx;
    struct fwd *f = j->f;
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[j->layer];
    const struct ops_yarn *y = hp->yarn_factor > 1.0f ? &f->yarn : NULL;
    const size_t nq = (size_t)hp->n_head * hp->head_dim, qk = (size_t)hp->n_head * hp->head_dim_qk;
    for (uint32_t t = lo; t < hi; t++) {
        mla_q_rope(hp, f->mla_q + t * qk, f->pos[t], y, f->q + t * nq);
        mla_kv_row(hp, L, f->k + t * hp->head_dim, f->pos[t], y);
        kv_store_write(f->store, j->toks[t].seq, j->layer, f->pos[t], f->k + t * hp->head_dim,
                       f->v);
    }
}

/* mla_att, items = (run, chunk of heads): MQA over the cached rows, the values being the rows'
 * first n_lora_kv floats (the view reads them in the K rows: the cache stores no V). */
static void mla_att(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct mla_job *j = ctx;
    struct fwd *f = j->f;
    const struct model_hparams *hp = &f->m->hp;
    const size_t nq = (size_t)hp->n_head * hp->head_dim, no = (size_t)hp->n_head * hp->head_dim_v;
    for (uint32_t i = lo; i < hi; i++) {
        const uint32_t r = i / j->n_chunks, h = i % j->n_chunks * j->chunk;
        const uint32_t nh = hp->n_head - h < j->chunk ? hp->n_head - h : j->chunk;
        const uint32_t t0 = f->run_first[r], nt = f->run_first[r + 1] - t0;
        struct ops_kv_view view;
        kv_store_view_direct(f->store, j->toks[t0].seq, j->layer, 0, hp->head_dim, 0,
                             f->pos[t0] + nt,
                             f->att_scratch + (size_t)thread * f->att_scratch_bytes, &view);
        view.v_off = view.k_off;
        view.v_stride = view.k_stride;
        const struct cpu_att_q a = {f->q + t0 * nq + (size_t)h * hp->head_dim,
                                    nq,
                                    hp->head_dim,
                                    f->att + t0 * no + (size_t)h * hp->head_dim_v,
                                    no,
                                    hp->head_dim_v,
                                    nt,
                                    nh,
                                    f->pos[t0] + 1,
                                    0,
                                    NULL};
        cpu_attention(&a, hp->head_dim, hp->head_dim_v, hp->kq_scale, &view);
    }
}

static uint32_t runs(struct fwd *f, const struct backend_token *toks, uint32_t n);

/* mla_act_bytes: a per-head input row's activations for w, rounded to a cache line. */
static size_t mla_act_bytes(const struct model_mat *w)
{
    return (quant_act_bytes(w->type, w->n_in) + 63) & ~(size_t)63;
}

/* mla_heads: for each of n tokens and each head h, out[t][h] (n_out floats at out + t*H*out_head
 * + h*out_head) = head h's matrix of w . x[t][h] (w->n_in floats at x + (t*H + h)*x_head): the
 * k_b absorption or the v_b output. F32 weights read the floats in place; others quantize them. */
static int mla_heads(struct fwd *f, const struct model_mat *w, const float *x, size_t x_head,
                     uint32_t n, float *out, size_t out_head)
{
    const uint32_t H = f->m->hp.n_head;
    const void *acts = x;
    size_t ab = x_head * sizeof(float);
    if (quant_act_type(w->type) != QT_F32) {
        ab = mla_act_bytes(w);
        struct quant_job j = {w->type, w->n_in, x, x_head, f->mla_acts, ab, 0};
        pool_for(f->pool, n * H, 16, quant_rows, &j);
        if (atomic_load(&j.rv)) return atomic_load(&j.rv);
        acts = f->mla_acts;
    }
    mla_head_tasks(w, H, acts, ab, n, out, H * out_head, out_head, f->mla_tasks);
    f->st.weight_bytes += cpu_mm_run(f->pool, f->mla_tasks, H, f->mla_first);
    return 0;
}

static int attention_mla(struct fwd *f, const struct backend_token *toks, uint32_t n, uint32_t il)
{
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[il];
    const size_t E = hp->n_embd, qk = (size_t)hp->n_head * hp->head_dim_qk;
    int rv;
    double t0 = bcpu_now_s();
    for (uint32_t t = 0; t < n; t++)
        cpu_rmsnorm(f->xn + t * E, f->x + t * E, L->attn_norm, E, hp->rms_eps);
    double t1 = bcpu_now_s();
    if (hp->n_lora_q) {
        if ((rv = matmul(f, &L->wq_a, f->xn, E, n, f->mla_qa, hp->n_lora_q))) return rv;
        for (uint32_t t = 0; t < n; t++)
            cpu_rmsnorm(f->mla_qa + t * hp->n_lora_q, f->mla_qa + t * hp->n_lora_q, L->q_a_norm,
                        hp->n_lora_q, hp->rms_eps);
        if ((rv = matmul(f, &L->wq_b, f->mla_qa, hp->n_lora_q, n, f->mla_q, qk))) return rv;
    } else if ((rv = matmul(f, &L->wq, f->xn, E, n, f->mla_q, qk))) {
        return rv;
    }
    if ((rv = matmul(f, &L->wkv_a, f->xn, E, n, f->k, hp->head_dim))) return rv;
    double t2 = bcpu_now_s();
    struct mla_job j = {f, toks, il, 0, 0, 0};
    pool_for(f->pool, n, 1, mla_rows, &j);
    if ((rv = mla_heads(f, &L->k_b, f->mla_q, hp->head_dim_qk, n, f->q, hp->head_dim))) return rv;
    /* every token's row is stored before any token attends (as attention()) */
    j.n_runs = runs(f, toks, n);
    uint32_t max_nt = 1;
    for (uint32_t r = 0; r < j.n_runs; r++)
        if (f->run_first[r + 1] - f->run_first[r] > max_nt)
            max_nt = f->run_first[r + 1] - f->run_first[r];
    /* chunks of heads for the threads: each query is computed on its own, so the split never
     * changes a bit */
    j.chunk = CPU_ATT_MAXQ / max_nt;
    const uint32_t share = (hp->n_head + f->o.n_threads - 1) / f->o.n_threads;
    if (j.chunk > share) j.chunk = share;
    if (j.chunk == 0) j.chunk = 1;
    j.n_chunks = (hp->n_head + j.chunk - 1) / j.chunk;
    pool_for(f->pool, j.n_runs * j.n_chunks, 1, mla_att, &j);
    if ((rv = mla_heads(f, &L->v_b, f->att, hp->head_dim_v, n, f->mla_o, hp->head_dim_vo)))
        return rv;
    double t3 = bcpu_now_s();
    if ((rv = matmul(f, &L->wo, f->mla_o, (size_t)hp->n_head * hp->head_dim_vo, n, f->tmp, E)))
        return rv;
    for (size_t i = 0; i < n * E; i++)
        f->x[i] += f->tmp[i];
    double t4 = bcpu_now_s();
    f->st.attention_s += (t1 - t0) + (t3 - t2);
    f->st.dense_s += (t2 - t1) + (t4 - t3);
    return 0;
}

static int attention(struct fwd *f, const struct backend_token *toks, uint32_t n, uint32_t il)
{
    if (f->m->hp.mla) return attention_mla(f, toks, n, il);
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[il];
    const size_t E = hp->n_embd, nq = (size_t)hp->n_head * hp->head_dim,
                 nk = (size_t)hp->n_head_kv * hp->head_dim,
                 nv = (size_t)hp->n_head_kv * hp->head_dim_v;
    int rv;
    double t0 = bcpu_now_s();
    for (uint32_t t = 0; t < n; t++)
        cpu_rmsnorm(f->xn + t * E, f->x + t * E, L->attn_norm, E, hp->rms_eps);
    double t1 = bcpu_now_s();
    const uint8_t *aq, *ak, *av;
    if ((rv = inputs_for(f, &L->wq, NULL, NULL, f->xn, E, n, f->acts[0], &aq)) ||
        (rv = inputs_for(f, &L->wk, &L->wq, aq, f->xn, E, n, f->acts[1], &ak)) ||
        (rv = inputs_for(f, &L->wv, &L->wk, ak, f->xn, E, n, f->acts[2], &av)))
        return rv;
    f->tasks[0] = task(f, &L->wq, L->wq.data, aq, n, f->q, nq);
    f->tasks[1] = task(f, &L->wk, L->wk.data, ak, n, f->k, nk);
    f->tasks[2] = task(f, &L->wv, L->wv.data, av, n, f->v, nv);
    run_tasks(f, 3);
    double t2 = bcpu_now_s();
    struct qkv_job qj = {f, toks, il};
    pool_for(f->pool, n, 4, qkv_rows, &qj);
    /* Every token's K/V of this layer is stored before any token attends: a prompt chunk's later
     * tokens see its earlier ones, and each sees only positions <= its own. */
    struct att_job j = {f, toks, il, runs(f, toks, n), 1};
    j.split =
        att_split(hp->n_head / hp->n_head_kv, j.n_runs * hp->n_head_kv, pool_threads(f->pool));
    pool_for(f->pool, j.n_runs * hp->n_head_kv * j.split, 1, att_items, &j);
    double t3 = bcpu_now_s();
    if ((rv = matmul(f, &L->wo, f->att, (size_t)hp->n_head * hp->head_dim_v, n, f->tmp, E)))
        return rv;
    if (L->bo) add_rows(f->tmp, L->bo, n, E);
    for (size_t i = 0; i < n * E; i++)
        f->x[i] += f->tmp[i];
    double t4 = bcpu_now_s();
    f->st.attention_s += (t1 - t0) + (t3 - t2);
    f->st.dense_s += (t2 - t1) + (t4 - t3);
    return 0;
}

/* ---- MoE ----------------------------------------------------------------------------------- */

/* route picks each token's experts and weights from its router logits, per the arch's gating:
 * DeepSeek-V3's (sigmoid, selection bias, scaling: glm4moe) through route_biased. */
static void route(struct fwd *f, uint32_t n, uint32_t il)
{
    const struct model_hparams *hp = &f->m->hp;
    const uint32_t E = hp->n_expert, K = hp->n_expert_used;
    const struct model_layer *L = &f->m->layers[il];
    const bool biased = hp->gating == MODEL_GATING_SIGMOID || L->exp_probs_b ||
                        hp->exp_scale != 1.0f || hp->n_group > 1;
    const struct route_opts ro = {E,
                                  K,
                                  hp->gating != MODEL_GATING_SIGMOID,
                                  L->exp_probs_b,
                                  hp->n_group,
                                  hp->n_group_used,
                                  hp->norm_topk,
                                  hp->exp_scale};
    for (uint32_t t = 0; t < n; t++) {
        float *p = f->rlogit + (size_t)t * E, *w = f->selw + (size_t)t * K;
        uint32_t *sel = (uint32_t *)(f->sel + (size_t)t * K); /* ids < n_expert fit both */
        if (biased) {
            route_biased(&ro, p, f->rsel, sel, w);
            continue;
        }
        if (hp->gating == MODEL_GATING_TOPK_SOFTMAX) {
            ops_topk(p, E, K, sel);
            for (uint32_t i = 0; i < K; i++)
                w[i] = p[sel[i]];
            ops_softmax(w, K);
            continue;
        }
        ops_softmax(p, E);
        ops_topk(p, E, K, sel);
        float sum = 0.0f;
        for (uint32_t i = 0; i < K; i++)
            sum += w[i] = p[sel[i]];
        if (hp->norm_topk)
            for (uint32_t i = 0; i < K; i++)
                w[i] /= sum;
    }
}

/* Expert parts for cpu_moe_ffn: from the expert's slot when the published table holds it, else
 * through the model's resolver (arena or file). */
struct part_ctx {
    const struct fwd *f;
    uint32_t layer;
};

static const void *expert_part(void *ctx, uint32_t expert, int part)
{
    const struct part_ctx *c = ctx;
    const struct fwd *f = c->f;
    const int32_t slot = f->cache ? cache_slot(f->cache, c->layer, expert) : CACHE_NONE;
    if (slot == CACHE_NONE) return model_expert_part(f->m, c->layer, expert, (enum model_part)part);
    return f->slots + (uint64_t)slot * f->cache->slot_bytes +
           f->m->layers[c->layer].blob.part_off[part];
}

/* count_layer: the layer's hits and misses, and its routed entries for the tier: a decode token
 * counts each pair, a prompt chunk each of its experts once. */
static void count_layer(struct fwd *f, uint32_t il, int n_groups)
{
    const uint32_t K = f->m->hp.n_expert_used;
    for (int g = 0; g < n_groups; g++) {
        const struct moe_group *gr = &f->groups[g];
        const uint32_t e = (uint32_t)gr->expert;
        const bool hit = cache_slot(f->cache, il, e) != CACHE_NONE;
        *(hit ? &f->hits : &f->misses) += (uint64_t)gr->count;
        if (!f->tier) continue;
        const uint32_t mark = il * f->m->hp.n_expert + e + 1;
        float n = 0;
        for (int32_t i = 0; i < gr->count; i++) {
            const uint32_t t = (uint32_t)f->pair_idx[gr->first + i] / K, c = f->chunk_of[t];
            if (c == UINT32_MAX) {
                n += 1;
            } else if (f->stamp[c] != mark) {
                f->stamp[c] = mark;
                n += 1;
            }
        }
        tier_count(f->tier, il, e, n);
    }
}

/* combine_rows: each token's expert outputs summed in expert-id order (moe_combine), items =
 * tokens. */
static void combine_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct fwd *f = ctx;
    moe_combine(f->y, f->sel, lo, hi, (int)f->m->hp.n_expert_used, f->m->hp.n_embd, f->moe);
}

/* report_routes calls the route hook per expert with the tokens of its pairs, ascending. */
static void report_routes(struct fwd *f, uint32_t il, int n_groups)
{
    const uint32_t K = f->m->hp.n_expert_used;
    for (int g = 0; g < n_groups; g++) {
        const struct moe_group *gr = &f->groups[g];
        for (int32_t i = 0; i < gr->count; i++)
            f->rtok[i] = (uint32_t)f->pair_idx[gr->first + i] / K;
        f->route(f->route_ctx, il, (uint32_t)gr->expert, f->rtok, (uint32_t)gr->count);
    }
}

static int routed_experts(struct fwd *f, uint32_t n, uint32_t il)
{
    const struct model *m = f->m;
    const struct model_hparams *hp = &m->hp;
    const struct model_layer *L = &m->layers[il];
    const int K = (int)hp->n_expert_used;
    /* One group per expert hit: the CPU's matmul takes any token count at the same bits. */
    const int ng = moe_group(f->sel, n, K, hp->n_expert, NULL, UINT32_MAX, f->groups, f->pair_idx);
    if (f->route) report_routes(f, il, ng);
    if (f->cache) count_layer(f, il, ng);
    const struct cpu_moe_parts parts = {
        {L->part[MODEL_PART_GATE].type, L->part[MODEL_PART_GATE].n_in,
         L->part[MODEL_PART_GATE].n_out, L->part[MODEL_PART_GATE].row_bytes},
        {L->part[MODEL_PART_UP].type, L->part[MODEL_PART_UP].n_in, L->part[MODEL_PART_UP].n_out,
         L->part[MODEL_PART_UP].row_bytes},
        {L->part[MODEL_PART_DOWN].type, L->part[MODEL_PART_DOWN].n_in,
         L->part[MODEL_PART_DOWN].n_out, L->part[MODEL_PART_DOWN].row_bytes},
    };
    struct part_ctx pc = {f, il};
    uint64_t bytes;
    int rv = cpu_moe_ffn(f->moe_w, f->pool, &parts, expert_part, &pc, f->groups, ng, f->pair_idx,
                         f->selw, n, K, f->xn, hp->n_embd, f->y, &bytes);
    if (rv) return rv;
    f->st.weight_bytes += bytes;
    const double t0 = f->timing ? bcpu_now_s() : 0;
    pool_for(f->pool, n, 4, combine_rows, f);
    if (f->timing) f->combine_s += bcpu_now_s() - t0;
    return 0;
}

/* swiglu_ffn adds down . (silu(gate . xn) * (up . xn)) to f->moe: the shared expert, scaled by
 * sigmoid(gate_inp . xn) when gate_inp is given (qwen2moe), or a dense layer's FFN (glm4moe). */
static int swiglu_ffn(struct fwd *f, uint32_t n, const struct model_mat *gate,
                      const struct model_mat *up, const struct model_mat *down,
                      const struct model_mat *gate_inp)
{
    const size_t E = f->m->hp.n_embd, F = gate->n_out;
    int rv;
    const uint8_t *ag, *au, *as = NULL;
    if ((rv = inputs_for(f, gate, NULL, NULL, f->xn, E, n, f->acts[0], &ag)) ||
        (rv = inputs_for(f, up, gate, ag, f->xn, E, n, f->acts[1], &au)) ||
        (gate_inp && (rv = inputs_for(f, gate_inp, up, au, f->xn, E, n, f->acts[2], &as))))
        return rv;
    f->tasks[0] = task(f, gate, gate->data, ag, n, f->g, F);
    f->tasks[1] = task(f, up, up->data, au, n, f->u, F);
    if (gate_inp) f->tasks[2] = task(f, gate_inp, gate_inp->data, as, n, f->shg, 1);
    run_tasks(f, gate_inp ? 3 : 2);
    for (uint32_t t = 0; t < n; t++)
        cpu_swiglu(f->g + t * F, f->g + t * F, f->u + t * F, F);
    if ((rv = matmul(f, down, f->g, F, n, f->y, E))) return rv;
    for (uint32_t t = 0; t < n; t++) {
        const float s = gate_inp ? 1.0f / (1.0f + expf(-f->shg[t])) : 1.0f;
        for (size_t d = 0; d < E; d++)
            f->moe[t * E + d] += s * f->y[t * E + d];
    }
    return 0;
}

static int shared_expert(struct fwd *f, uint32_t n, uint32_t il)
{
    const struct model_layer *L = &f->m->layers[il];
    return swiglu_ffn(f, n, &L->gate_shexp, &L->up_shexp, &L->down_shexp,
                      f->m->hp.shexp_gated ? &L->gate_inp_shexp : NULL);
}

static int moe(struct fwd *f, uint32_t n, uint32_t il)
{
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[il];
    const size_t E = hp->n_embd;
    int rv;
    double t0 = bcpu_now_s();
    for (uint32_t t = 0; t < n; t++)
        cpu_rmsnorm(f->xn + t * E, f->x + t * E, L->ffn_norm, E, hp->rms_eps);
    double t1 = bcpu_now_s();
    if (L->dense) {
        /* a leading dense layer (glm4moe): its FFN in the place of the experts */
        memset(f->moe, 0, n * E * sizeof *f->moe);
        if ((rv = swiglu_ffn(f, n, &L->ffn_gate, &L->ffn_up, &L->ffn_down, NULL))) return rv;
        for (size_t i = 0; i < n * E; i++)
            f->x[i] += f->moe[i];
        f->st.attention_s += t1 - t0;
        f->st.dense_s += bcpu_now_s() - t1;
        return 0;
    }
    if ((rv = matmul(f, &L->router, f->xn, E, n, f->rlogit, hp->n_expert))) return rv;
    if (L->router_b) add_rows(f->rlogit, L->router_b, n, hp->n_expert);
    route(f, n, il);
    double t2 = bcpu_now_s();
    if ((rv = routed_experts(f, n, il))) return rv;
    double t3 = bcpu_now_s();
    if (hp->n_ff_shexp && (rv = shared_expert(f, n, il))) return rv;
    for (size_t i = 0; i < n * E; i++)
        f->x[i] += f->moe[i];
    double t4 = bcpu_now_s();
    f->st.attention_s += t1 - t0;
    f->st.dense_s += (t2 - t1) + (t4 - t3);
    f->st.experts_s += t3 - t2;
    return 0;
}

/* grow assigns positions and grows each sequence of the batch; on error it restores them all. */
static int grow(struct fwd *f, const struct backend_token *toks, uint32_t n)
{
    uint32_t n_seen = 0;
    int rv = 0;
    /* O(n * sequences): a batch holds at most a few hundred sequences. */
    for (uint32_t t = 0; t < n; t++) {
        uint32_t s = 0;
        while (s < n_seen && f->seen[s] != toks[t].seq)
            s++;
        if (s == n_seen) {
            f->seen[n_seen] = toks[t].seq;
            f->seen_len[n_seen++] = toks[t].seq->n_tokens;
        }
        f->pos[t] = toks[t].seq->n_tokens;
        if ((rv = kv_seq_resize(f->kv, toks[t].seq, f->pos[t] + 1)) != 0) break;
    }
    if (!rv && f->seg_slot) rv = bcpu_kv_take_slots(f);
    if (!rv) rv = kv_store_reserve(f->store, kv_blocks_used_ever(f->kv));
    if (rv)
        for (uint32_t s = 0; s < n_seen; s++)
            kv_seq_resize(f->kv, f->seen[s], f->seen_len[s]);
    return rv;
}

/* mark_chunks: for the tier's counting, each token's prompt chunk (the first batch index of its
 * sequence when the sequence has several tokens in the batch, not all asking for logits) or
 * UINT32_MAX for a decode step. A sequence's tokens that all ask for logits are a decode step and
 * its drafts being verified: each counts, as decode tokens do (DESIGN 3.3).
 * O(n * sequences), as grow. */
static void mark_chunks(struct fwd *f, const struct backend_token *toks, uint32_t n)
{
    for (uint32_t t = 0; t < n; t++) {
        uint32_t first = t, count = 0;
        bool all_logits = true;
        for (uint32_t u = 0; u < n; u++)
            if (toks[u].seq == toks[t].seq) {
                if (!count) first = u;
                count++;
                all_logits &= toks[u].logits;
            }
        f->chunk_of[t] = count > 1 && !all_logits ? first : UINT32_MAX;
        f->stamp[t] = 0;
    }
}

/* cpu_eval: backend_eval has checked the count and the ids. */
static int cpu_eval(void *impl, const struct backend_token *toks, uint32_t n, float *logits)
{
    struct fwd *f = impl;
    const struct model *m = f->m;
    const struct model_hparams *hp = &m->hp;
    const size_t E = hp->n_embd;
    int rv;
    if ((rv = grow(f, toks, n)) != 0) return rv;
    if (f->picker_started && f->o.copy_hooks && f->o.copy_hooks->window_sync) bcpu_window_sync(f);
    const double t0 = bcpu_now_s();
    const uint64_t hits0 = f->hits, misses0 = f->misses;
    if (f->tier) mark_chunks(f, toks, n);
    for (uint32_t t = 0; t < n; t++) {
        const uint8_t *row =
            (const uint8_t *)m->token_embd.data + (uint64_t)toks[t].id * m->token_embd.row_bytes;
        if ((rv = quant_dequantize(m->token_embd.type, row, f->x + t * E, E)) != 0) goto fail;
    }
    for (uint32_t il = 0; il < hp->n_layer; il++)
        if ((rv = attention(f, toks, n, il)) || (rv = moe(f, n, il))) goto fail;
    const double t1 = bcpu_now_s();
    uint32_t n_out = 0;
    for (uint32_t t = 0; t < n; t++)
        if (toks[t].logits)
            cpu_rmsnorm(f->xn + n_out++ * E, f->x + t * E, m->output_norm, E, hp->rms_eps);
    if (n_out && (rv = matmul(f, &m->output, f->xn, E, n_out, logits, hp->n_vocab)) != 0) goto fail;
    const double t2 = bcpu_now_s();
    f->st.passes++;
    f->st.tokens += n;
    f->st.output_s += t2 - t1;
    f->st.total_s += t2 - t0;
    if (f->cache && !f->first_done) {
        const uint64_t pairs = f->hits - hits0 + f->misses - misses0;
        f->first_hit_rate = pairs ? (double)(f->hits - hits0) / (double)pairs : 0;
        f->first_done = true;
        LOG_INFO("expert cache: first window hit rate %.1f%% (%llu of %llu pairs from slots)",
                 100.0 * f->first_hit_rate, (unsigned long long)(f->hits - hits0),
                 (unsigned long long)pairs);
    }
    if (f->o.copy_hooks && f->o.copy_hooks->window_ms) {
        const uint32_t ms = f->o.copy_hooks->window_ms;
        nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000}, NULL);
    }
    return 0;
fail:
    for (uint32_t t = n; t-- > 0;)
        kv_seq_resize(f->kv, toks[t].seq, f->pos[t]);
    return rv;
}

const struct backend_ops backend_cpu_ops = {
    .name = "cpu",
    .start = cpu_start,
    .eval = cpu_eval,
    .set_route = cpu_set_route,
    .tick = bcpu_tick,
    .quiesce = bcpu_quiesce,
    .resize = bcpu_resize,
    .info = bcpu_info,
    .get_stats = cpu_get_stats,
    .reset_stats = cpu_reset_stats,
    .close = cpu_close,
};
