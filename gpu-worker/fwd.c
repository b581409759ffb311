#include "gpu-worker/fwd.h"
#include "common/base/err.h"
#include "common/base/pool.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ref/ops.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Weight rows per work item: whole 8-row kernel groups, at least MM_ROWS_MIN so a claim amortizes
 * the prefetch ramp at its start, and about MM_ITEMS_PER_THREAD items per thread on a big matrix
 * so a thread slowed by a busy core is made up for by the others. */
#define MM_ROWS_MIN         32
#define MM_ITEMS_PER_THREAD 16

/* One matrix times a set of tokens' activations, for the task runner. */
struct mm_task {
    const struct model_mat *w;
    const void *wdata; /* w->data, or an expert part from the resolver */
    const void *acts;
    size_t act_stride;
    uint32_t n_tok;
    float *out;
    size_t out_stride;
};

struct fwd {
    const struct model *m;
    struct kv_cache *kv;
    struct fwd_opts o;
    struct pool *pool;
    struct fwd_stats st;
    fwd_route_fn route; /* fwd_set_route's hook, or NULL */
    void *route_ctx;
    size_t act_stride; /* bytes per token of quantized activations: the widest any matrix needs */
    uint32_t n_ff;     /* widest FFN hidden width (routed or shared expert) */
    uint32_t max_tasks;
    /* Scratch, rows of max_pass_tokens tokens (T) or of routed (token, expert) pairs (T*K): */
    float *x;                /* (T, n_embd) residual stream */
    float *xn;               /* (T, n_embd) normalized input of a block */
    float *tmp;              /* (T, n_embd) a block's output before the residual add */
    float *q, *k, *v;        /* (T, n_head*head_dim), (T, k_dim), (T, v_dim) */
    float *att;              /* (T, n_head*head_dim_v) */
    float *rlogit;           /* (T, n_expert) router logits, then probabilities */
    uint32_t *sel;           /* (T, n_expert_used) selected experts */
    float *selw;             /* (T, n_expert_used) their weights */
    float *moe;              /* (T, n_embd) sum of expert outputs */
    float *g, *u;            /* (T*K, n_ff) gate and up outputs, then the SwiGLU product in g */
    float *y;                /* (T*K, n_embd) expert (or shared expert) outputs */
    float *shg;              /* (T) shared expert gate logit */
    uint32_t *ptok;          /* (T*K) pairs by expert id, then token: the token */
    float *pw;               /* (T*K) its routing weight */
    uint32_t *ecount;        /* (n_expert + 1) pairs per expert, then offsets */
    uint32_t *tpair;         /* (T*K) each token's pairs, in expert-id order */
    uint8_t *acts[3];        /* (T, act_stride) each: quantized inputs of up to three matrices */
    uint8_t *pacts[2];       /* (T*K, act_stride): expert inputs (gate, up), gathered per pair */
    uint8_t *hacts;          /* (T*K, act_stride): SwiGLU outputs quantized for down */
    struct mm_task *tasks;   /* (max_tasks) */
    uint32_t *task_first;    /* (max_tasks + 1) first work item of each task */
    uint32_t *pos;           /* (T) positions */
    uint32_t *run_first;     /* (T + 1) first token of each attention run, then n */
    struct fwd_token *chunk; /* (T) fwd_prompt's batch */
    struct kv_seq **seen;    /* (T) sequences of the batch being grown */
    uint32_t *seen_len;      /* (T) their lengths before */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void fwd_kv_config(const struct model *m, uint32_t n_ctx, uint32_t n_seq, struct kv_config *out)
{
    const struct model_hparams *hp = &m->hp;
    if (n_ctx == 0) n_ctx = hp->n_ctx_train;
    out->n_layer = hp->n_layer;
    out->k_dim = hp->n_head_kv * hp->head_dim;
    out->v_dim = hp->n_head_kv * hp->head_dim_v;
    out->block_tokens = FWD_KV_BLOCK;
    out->n_ctx = n_ctx;
    out->max_blocks = (n_ctx + FWD_KV_BLOCK - 1) / FWD_KV_BLOCK * (n_seq ? n_seq : 1);
}

static void widen_act(struct fwd *f, const struct model_mat *w)
{
    if (!w->n_in) return;
    size_t b = quant_act_bytes(w->type, w->n_in);
    if (b > f->act_stride) f->act_stride = b;
}

static int alloc_scratch(struct fwd *f)
{
    const struct model_hparams *hp = &f->m->hp;
    const size_t T = f->o.max_pass_tokens;
    f->n_ff = hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp;
    widen_act(f, &f->m->output);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const struct model_layer *L = &f->m->layers[l];
        const struct model_mat *mats[] = {&L->wq,       &L->wk,         &L->wv,
                                          &L->wo,       &L->router,     &L->part[0],
                                          &L->part[1],  &L->part[2],    &L->gate_shexp,
                                          &L->up_shexp, &L->down_shexp, &L->gate_inp_shexp};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            widen_act(f, mats[i]);
    }
    /* Round rows up to 64 bytes so each token's activations start on their own cache line. */
    f->act_stride = (f->act_stride + 63) & ~(size_t)63;
    const size_t E = hp->n_embd, K = hp->n_expert_used, P = T * (K ? K : 1);
    f->max_tasks = 2 * hp->n_expert + 3;
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
        {(void **)&f->sel, T * K * sizeof(uint32_t)},
        {(void **)&f->selw, T * K * sizeof(float)},
        {(void **)&f->moe, T * E * sizeof(float)},
        {(void **)&f->g, P * f->n_ff * sizeof(float)},
        {(void **)&f->u, P * f->n_ff * sizeof(float)},
        {(void **)&f->y, P * E * sizeof(float)},
        {(void **)&f->shg, T * sizeof(float)},
        {(void **)&f->ptok, P * sizeof(uint32_t)},
        {(void **)&f->pw, P * sizeof(float)},
        {(void **)&f->ecount, (hp->n_expert + 1) * sizeof(uint32_t)},
        {(void **)&f->tpair, P * sizeof(uint32_t)},
        {(void **)&f->acts[0], T * f->act_stride},
        {(void **)&f->acts[1], T * f->act_stride},
        {(void **)&f->acts[2], T * f->act_stride},
        {(void **)&f->pacts[0], P * f->act_stride},
        {(void **)&f->pacts[1], P * f->act_stride},
        {(void **)&f->hacts, P * f->act_stride},
        {(void **)&f->tasks, f->max_tasks * sizeof(struct mm_task)},
        {(void **)&f->task_first, (f->max_tasks + 1) * sizeof(uint32_t)},
        {(void **)&f->pos, T * sizeof(uint32_t)},
        {(void **)&f->run_first, (T + 1) * sizeof(uint32_t)},
        {(void **)&f->chunk, T * sizeof(struct fwd_token)},
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
    return 0;
}

int fwd_start(const struct model *m, struct kv_cache *kv, const struct fwd_opts *o,
              struct fwd **out)
{
    const struct kv_config *kc = kv_config_of(kv);
    const struct model_hparams *hp = &m->hp;
    if (kc->n_layer != hp->n_layer || kc->k_dim != hp->n_head_kv * hp->head_dim ||
        kc->v_dim != hp->n_head_kv * hp->head_dim_v)
        return strata_errf(STRATA_EINVAL,
                           "KV cache of %u layers, k_dim %u, v_dim %u does not fit the model "
                           "(%u layers, %u, %u): make it with fwd_kv_config",
                           kc->n_layer, kc->k_dim, kc->v_dim, hp->n_layer,
                           hp->n_head_kv * hp->head_dim, hp->n_head_kv * hp->head_dim_v);
    if (o->max_pass_tokens == 0)
        return strata_errf(STRATA_EINVAL, "max_pass_tokens (tokens per forward pass) must be positive");
    struct fwd *f = calloc(1, sizeof *f);
    if (!f) return strata_errf(STRATA_ENOMEM, "out of memory for the forward pass");
    f->m = m;
    f->kv = kv;
    f->o = *o;
    if (f->o.n_threads == 0) f->o.n_threads = 1;
    int rv;
    if ((rv = alloc_scratch(f)) != 0 || (rv = pool_start(f->o.n_threads, &f->pool)) != 0) goto fail;
    *out = f;
    return 0;
fail:
    fwd_close(f);
    return rv;
}

void fwd_close(struct fwd *f)
{
    if (!f) return;
    pool_close(f->pool);
    void *bufs[] = {f->x,     f->xn,      f->tmp,        f->q,       f->k,         f->v,
                    f->att,   f->rlogit,  f->sel,        f->selw,    f->moe,       f->g,
                    f->u,     f->y,       f->shg,        f->ptok,    f->pw,        f->ecount,
                    f->tpair, f->acts[0], f->acts[1],    f->acts[2], f->pacts[0],  f->pacts[1],
                    f->hacts, f->tasks,   f->task_first, f->pos,     f->run_first, f->chunk,
                    f->seen,  f->seen_len};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(f);
}

void fwd_set_route(struct fwd *f, fwd_route_fn fn, void *ctx)
{
    f->route = fn;
    f->route_ctx = ctx;
}

void fwd_get_stats(const struct fwd *f, struct fwd_stats *out)
{
    *out = f->st;
}

void fwd_reset_stats(struct fwd *f)
{
    memset(&f->st, 0, sizeof f->st);
}

/* ---- matmuls ------------------------------------------------------------------------------
 * A step's matrices (q, k and v; or gate and up of every expert hit) go to the pool as one loop
 * over chunks of MM_ROWS rows of all of them, so threads stream distinct rows and a decode step
 * pays one wake-up per step rather than one per matrix. */

struct mm_run {
    const struct mm_task *t;
    const uint32_t *first; /* first item of each task, then the total */
    uint32_t n;
    uint32_t rows; /* rows per item */
};

static void mm_items(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct mm_run *r = ctx;
    uint32_t k = 0;
    for (uint32_t item = lo; item < hi; item++) {
        while (r->first[k + 1] <= item)
            k++;
        const struct mm_task *t = &r->t[k];
        const uint32_t r0 = (item - r->first[k]) * r->rows;
        const uint32_t r1 = t->w->n_out - r0 < r->rows ? t->w->n_out : r0 + r->rows;
        cpu_matmul(t->w->type, t->wdata, t->w->row_bytes, t->w->n_in, r0, r1, t->acts,
                   t->act_stride, t->n_tok, t->out, t->out_stride);
    }
}

/* run_tasks computes f->tasks[0..n) in one parallel loop. */
static void run_tasks(struct fwd *f, uint32_t n)
{
    uint64_t total = 0;
    for (uint32_t k = 0; k < n; k++)
        total += f->tasks[k].w->n_out;
    uint64_t rows = total / ((uint64_t)pool_threads(f->pool) * MM_ITEMS_PER_THREAD);
    rows = rows < MM_ROWS_MIN ? MM_ROWS_MIN : (rows + 7) / 8 * 8;
    f->task_first[0] = 0;
    for (uint32_t k = 0; k < n; k++) {
        const struct model_mat *w = f->tasks[k].w;
        f->task_first[k + 1] = f->task_first[k] + (uint32_t)((w->n_out + rows - 1) / rows);
        f->st.weight_bytes += w->row_bytes * w->n_out;
    }
    struct mm_run r = {f->tasks, f->task_first, n, (uint32_t)rows};
    pool_for(f->pool, f->task_first[n], 1, mm_items, &r);
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

static struct mm_task task(struct fwd *f, const struct model_mat *w, const void *wdata,
                           const void *acts, uint32_t n_tok, float *out, size_t out_stride)
{
    return (struct mm_task){w, wdata, acts, f->act_stride, n_tok, out, out_stride};
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

/* ---- attention ----------------------------------------------------------------------------- */

/* Attention job: items are (run, KV head) pairs; a run is up to ATT_RUN consecutive tokens of
 * one sequence at consecutive positions (a prompt chunk), so they share each block of keys. */
#define ATT_RUN 16

struct att_job {
    struct fwd *f;
    const struct fwd_token *toks;
    uint32_t layer;
    uint32_t n_runs;
};

static void att_items(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct att_job *j = ctx;
    struct fwd *f = j->f;
    const struct model_hparams *hp = &f->m->hp;
    const float scale = 1.0f / sqrtf((float)hp->head_dim);
    const uint32_t group = hp->n_head / hp->n_head_kv;
    const size_t nq = (size_t)hp->n_head * hp->head_dim, no = (size_t)hp->n_head * hp->head_dim_v;
    for (uint32_t i = lo; i < hi; i++) {
        const uint32_t r = i / hp->n_head_kv, g = i % hp->n_head_kv, h = g * group;
        const uint32_t t0 = f->run_first[r], nt = f->run_first[r + 1] - t0;
        struct ops_kv_view view;
        kv_view(f->kv, j->toks[t0].seq, j->layer, g, hp->head_dim, hp->head_dim_v, &view);
        const struct cpu_att_q a = {f->q + t0 * nq + (size_t)h * hp->head_dim,
                                    nq,
                                    hp->head_dim,
                                    f->att + t0 * no + (size_t)h * hp->head_dim_v,
                                    no,
                                    hp->head_dim_v,
                                    nt,
                                    group,
                                    f->pos[t0] + 1};
        cpu_attention(&a, hp->head_dim, hp->head_dim_v, scale, &view);
    }
}

/* runs splits the batch into runs of one sequence's consecutive positions, at most ATT_RUN tokens
 * and CPU_ATT_MAXQ queries each; returns their count. */
static uint32_t runs(struct fwd *f, const struct fwd_token *toks, uint32_t n)
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
    const struct fwd_token *toks;
    uint32_t layer;
};

static void qkv_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct qkv_job *j = ctx;
    struct fwd *f = j->f;
    const struct fwd_token *toks = j->toks;
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
        cpu_rope(q, hp->n_head, hp->head_dim, hp->n_rot, f->pos[t], hp->rope_theta, neox);
        cpu_rope(k, hp->n_head_kv, hp->head_dim, hp->n_rot, f->pos[t], hp->rope_theta, neox);
        memcpy(kv_k(f->kv, toks[t].seq, il, f->pos[t]), k, nk * sizeof(float));
        memcpy(kv_v(f->kv, toks[t].seq, il, f->pos[t]), v, nv * sizeof(float));
    }
}

static int attention(struct fwd *f, const struct fwd_token *toks, uint32_t n, uint32_t il)
{
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[il];
    const size_t E = hp->n_embd, nq = (size_t)hp->n_head * hp->head_dim,
                 nk = (size_t)hp->n_head_kv * hp->head_dim,
                 nv = (size_t)hp->n_head_kv * hp->head_dim_v;
    int rv;
    double t0 = now_s();
    for (uint32_t t = 0; t < n; t++)
        cpu_rmsnorm(f->xn + t * E, f->x + t * E, L->attn_norm, E, hp->rms_eps);
    double t1 = now_s();
    const uint8_t *aq, *ak, *av;
    if ((rv = inputs_for(f, &L->wq, NULL, NULL, f->xn, E, n, f->acts[0], &aq)) ||
        (rv = inputs_for(f, &L->wk, &L->wq, aq, f->xn, E, n, f->acts[1], &ak)) ||
        (rv = inputs_for(f, &L->wv, &L->wk, ak, f->xn, E, n, f->acts[2], &av)))
        return rv;
    f->tasks[0] = task(f, &L->wq, L->wq.data, aq, n, f->q, nq);
    f->tasks[1] = task(f, &L->wk, L->wk.data, ak, n, f->k, nk);
    f->tasks[2] = task(f, &L->wv, L->wv.data, av, n, f->v, nv);
    run_tasks(f, 3);
    double t2 = now_s();
    struct qkv_job qj = {f, toks, il};
    pool_for(f->pool, n, 4, qkv_rows, &qj);
    /* Every token's K/V of this layer is stored before any token attends: a prompt chunk's later
     * tokens see its earlier ones, and each sees only positions <= its own. */
    struct att_job j = {f, toks, il, runs(f, toks, n)};
    pool_for(f->pool, j.n_runs * hp->n_head_kv, 1, att_items, &j);
    double t3 = now_s();
    if ((rv = matmul(f, &L->wo, f->att, (size_t)hp->n_head * hp->head_dim_v, n, f->tmp, E)))
        return rv;
    for (size_t i = 0; i < n * E; i++)
        f->x[i] += f->tmp[i];
    double t4 = now_s();
    f->st.attention_s += (t1 - t0) + (t3 - t2);
    f->st.dense_s += (t2 - t1) + (t4 - t3);
    return 0;
}

/* ---- MoE ----------------------------------------------------------------------------------- */

/* route picks each token's experts and weights from its router logits, per the arch's gating. */
static void route(struct fwd *f, uint32_t n)
{
    const struct model_hparams *hp = &f->m->hp;
    const uint32_t E = hp->n_expert, K = hp->n_expert_used;
    for (uint32_t t = 0; t < n; t++) {
        float *p = f->rlogit + (size_t)t * E, *w = f->selw + (size_t)t * K;
        uint32_t *sel = f->sel + (size_t)t * K;
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

/* pair_order lays out the (token, expert) pairs by expert id, tokens in batch order within an
 * expert (the order the reference adds them in); ecount[e] becomes expert e's first pair. */
static uint32_t pair_order(struct fwd *f, uint32_t n)
{
    const uint32_t NE = f->m->hp.n_expert, K = f->m->hp.n_expert_used;
    memset(f->ecount, 0, (NE + 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < n * K; i++)
        f->ecount[f->sel[i] + 1]++;
    for (uint32_t e = 0; e < NE; e++)
        f->ecount[e + 1] += f->ecount[e];
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = 0; i < K; i++) {
            const uint32_t e = f->sel[t * K + i];
            /* ecount[e] walks forward as pairs land; shifted back below */
            f->tpair[t * K + i] = f->ecount[e];
            f->ptok[f->ecount[e]] = t;
            f->pw[f->ecount[e]++] = f->selw[t * K + i];
        }
    /* pairs are in expert order, so a token's pairs sorted by index are in expert-id order */
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = 1; i < K; i++)
            for (uint32_t j = i; j > 0 && f->tpair[t * K + j - 1] > f->tpair[t * K + j]; j--) {
                const uint32_t x = f->tpair[t * K + j];
                f->tpair[t * K + j] = f->tpair[t * K + j - 1];
                f->tpair[t * K + j - 1] = x;
            }
    for (uint32_t e = NE; e > 0; e--)
        f->ecount[e] = f->ecount[e - 1];
    f->ecount[0] = 0;
    return n * K;
}

/* SwiGLU of the pairs and its quantization for down, items = pairs. */
struct glu_job {
    struct fwd *f;
    const struct model_mat *down;
    uint32_t F;
    _Atomic int rv;
};

static void glu_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct glu_job *j = ctx;
    struct fwd *f = j->f;
    for (uint32_t p = lo; p < hi; p++)
        ops_swiglu(f->g + (size_t)p * j->F, f->g + (size_t)p * j->F, f->u + (size_t)p * j->F, j->F);
    int rv = cpu_quantize_acts(j->down->type, f->g + (size_t)lo * j->F, j->F, j->F, hi - lo,
                               f->hacts + lo * f->act_stride, f->act_stride);
    if (rv) atomic_store(&j->rv, rv);
}

/* Gathering token rows of quantized activations into pair order, items = pairs. */
struct gather_job {
    struct fwd *f;
    const uint8_t *src;
    uint8_t *dst;
    size_t bytes;
};

static void gather_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct gather_job *j = ctx;
    const size_t s = j->f->act_stride;
    for (uint32_t p = lo; p < hi; p++)
        memcpy(j->dst + p * s, j->src + j->f->ptok[p] * s, j->bytes);
}

static void gather(struct fwd *f, const uint8_t *src, uint8_t *dst, uint32_t n_pairs, size_t bytes)
{
    struct gather_job j = {f, src, dst, bytes};
    pool_for(f->pool, n_pairs, 64, gather_rows, &j);
}

/* The weighted sum of each token's expert outputs, items = tokens; each token adds its pairs in
 * expert-id order, from zero, as the reference does. */
static void combine_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct fwd *f = ctx;
    const size_t E = f->m->hp.n_embd, K = f->m->hp.n_expert_used;
    for (uint32_t t = lo; t < hi; t++) {
        float *o = f->moe + t * E;
        memset(o, 0, E * sizeof(float));
        for (size_t i = 0; i < K; i++) {
            const uint32_t p = f->tpair[t * K + i];
            const float *y = f->y + p * E, w = f->pw[p];
            for (size_t d = 0; d < E; d++)
                o[d] += w * y[d];
        }
    }
}

static int routed_experts(struct fwd *f, uint32_t n, uint32_t il)
{
    const struct model *m = f->m;
    const struct model_hparams *hp = &m->hp;
    const struct model_layer *L = &m->layers[il];
    const struct model_mat *G = &L->part[MODEL_PART_GATE], *U = &L->part[MODEL_PART_UP],
                           *D = &L->part[MODEL_PART_DOWN];
    const size_t E = hp->n_embd, F = G->n_out;
    int rv;
    const uint32_t n_pairs = pair_order(f, n);
    if (f->route)
        for (uint32_t e = 0; e < hp->n_expert; e++) {
            const uint32_t p0 = f->ecount[e], np = f->ecount[e + 1] - p0;
            if (np) f->route(f->route_ctx, il, e, f->ptok + p0, np);
        }
    const uint8_t *ag, *au;
    if ((rv = inputs_for(f, G, NULL, NULL, f->xn, E, n, f->acts[0], &ag)) ||
        (rv = inputs_for(f, U, G, ag, f->xn, E, n, f->acts[1], &au)))
        return rv;
    gather(f, ag, f->pacts[0], n_pairs, quant_act_bytes(G->type, E));
    if (au != ag) gather(f, au, f->pacts[1], n_pairs, quant_act_bytes(U->type, E));
    const uint8_t *pu = au != ag ? f->pacts[1] : f->pacts[0];
    uint32_t nt = 0;
    for (uint32_t e = 0; e < hp->n_expert; e++) {
        const uint32_t p0 = f->ecount[e], np = f->ecount[e + 1] - p0;
        if (!np) continue;
        f->tasks[nt++] = task(f, G, model_expert_part(m, il, e, MODEL_PART_GATE),
                              f->pacts[0] + p0 * f->act_stride, np, f->g + p0 * F, F);
        f->tasks[nt++] = task(f, U, model_expert_part(m, il, e, MODEL_PART_UP),
                              pu + p0 * f->act_stride, np, f->u + p0 * F, F);
    }
    run_tasks(f, nt);
    struct glu_job gj = {f, D, (uint32_t)F, 0};
    pool_for(f->pool, n_pairs, 8, glu_rows, &gj);
    if ((rv = atomic_load(&gj.rv))) return rv;
    nt = 0;
    for (uint32_t e = 0; e < hp->n_expert; e++) {
        const uint32_t p0 = f->ecount[e], np = f->ecount[e + 1] - p0;
        if (np)
            f->tasks[nt++] = task(f, D, model_expert_part(m, il, e, MODEL_PART_DOWN),
                                  f->hacts + p0 * f->act_stride, np, f->y + p0 * E, E);
    }
    run_tasks(f, nt);
    pool_for(f->pool, n, 4, combine_rows, f);
    return 0;
}

static int shared_expert(struct fwd *f, uint32_t n, uint32_t il)
{
    const struct model_layer *L = &f->m->layers[il];
    const size_t E = f->m->hp.n_embd, F = L->gate_shexp.n_out;
    int rv;
    const uint8_t *ag, *au, *as;
    if ((rv = inputs_for(f, &L->gate_shexp, NULL, NULL, f->xn, E, n, f->acts[0], &ag)) ||
        (rv = inputs_for(f, &L->up_shexp, &L->gate_shexp, ag, f->xn, E, n, f->acts[1], &au)) ||
        (rv = inputs_for(f, &L->gate_inp_shexp, &L->up_shexp, au, f->xn, E, n, f->acts[2], &as)))
        return rv;
    f->tasks[0] = task(f, &L->gate_shexp, L->gate_shexp.data, ag, n, f->g, F);
    f->tasks[1] = task(f, &L->up_shexp, L->up_shexp.data, au, n, f->u, F);
    f->tasks[2] = task(f, &L->gate_inp_shexp, L->gate_inp_shexp.data, as, n, f->shg, 1);
    run_tasks(f, 3);
    for (uint32_t t = 0; t < n; t++)
        ops_swiglu(f->g + t * F, f->g + t * F, f->u + t * F, F);
    if ((rv = matmul(f, &L->down_shexp, f->g, F, n, f->y, E))) return rv;
    for (uint32_t t = 0; t < n; t++) {
        const float s = 1.0f / (1.0f + expf(-f->shg[t]));
        for (size_t d = 0; d < E; d++)
            f->moe[t * E + d] += s * f->y[t * E + d];
    }
    return 0;
}

static int moe(struct fwd *f, uint32_t n, uint32_t il)
{
    const struct model_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[il];
    const size_t E = hp->n_embd;
    int rv;
    double t0 = now_s();
    for (uint32_t t = 0; t < n; t++)
        cpu_rmsnorm(f->xn + t * E, f->x + t * E, L->ffn_norm, E, hp->rms_eps);
    double t1 = now_s();
    if ((rv = matmul(f, &L->router, f->xn, E, n, f->rlogit, hp->n_expert))) return rv;
    route(f, n);
    double t2 = now_s();
    if ((rv = routed_experts(f, n, il))) return rv;
    double t3 = now_s();
    if (hp->n_ff_shexp && (rv = shared_expert(f, n, il))) return rv;
    for (size_t i = 0; i < n * E; i++)
        f->x[i] += f->moe[i];
    double t4 = now_s();
    f->st.attention_s += t1 - t0;
    f->st.dense_s += (t2 - t1) + (t4 - t3);
    f->st.experts_s += t3 - t2;
    return 0;
}

/* grow assigns positions and grows each sequence of the batch; on error it restores them all. */
static int grow(struct fwd *f, const struct fwd_token *toks, uint32_t n)
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
    if (rv)
        for (uint32_t s = 0; s < n_seen; s++)
            kv_seq_resize(f->kv, f->seen[s], f->seen_len[s]);
    return rv;
}

int fwd_eval(struct fwd *f, const struct fwd_token *toks, uint32_t n, float *logits)
{
    const struct model *m = f->m;
    const struct model_hparams *hp = &m->hp;
    const size_t E = hp->n_embd;
    int rv;
    if (n == 0 || n > f->o.max_pass_tokens)
        return strata_errf(STRATA_EINVAL, "a forward pass of %u tokens: it takes 1..%u", n,
                           f->o.max_pass_tokens);
    for (uint32_t t = 0; t < n; t++)
        if (toks[t].id < 0 || (uint32_t)toks[t].id >= hp->n_vocab)
            return strata_errf(STRATA_EINVAL, "token id %d is outside the vocabulary of %u",
                               toks[t].id, hp->n_vocab);
    if ((rv = grow(f, toks, n)) != 0) return rv;
    const double t0 = now_s();
    for (uint32_t t = 0; t < n; t++) {
        const uint8_t *row =
            (const uint8_t *)m->token_embd.data + (uint64_t)toks[t].id * m->token_embd.row_bytes;
        if ((rv = quant_dequantize(m->token_embd.type, row, f->x + t * E, E)) != 0) goto fail;
    }
    for (uint32_t il = 0; il < hp->n_layer; il++)
        if ((rv = attention(f, toks, n, il)) || (rv = moe(f, n, il))) goto fail;
    const double t1 = now_s();
    uint32_t n_out = 0;
    for (uint32_t t = 0; t < n; t++)
        if (toks[t].logits)
            cpu_rmsnorm(f->xn + n_out++ * E, f->x + t * E, m->output_norm, E, hp->rms_eps);
    if (n_out && (rv = matmul(f, &m->output, f->xn, E, n_out, logits, hp->n_vocab)) != 0) goto fail;
    const double t2 = now_s();
    f->st.passes++;
    f->st.tokens += n;
    f->st.output_s += t2 - t1;
    f->st.total_s += t2 - t0;
    return 0;
fail:
    for (uint32_t t = n; t-- > 0;)
        kv_seq_resize(f->kv, toks[t].seq, f->pos[t]);
    return rv;
}

int fwd_prompt(struct fwd *f, struct kv_seq *s, const int32_t *ids, uint32_t n, uint32_t chunk,
               float *logits)
{
    if (chunk == 0 || chunk > f->o.max_pass_tokens) chunk = f->o.max_pass_tokens;
    for (uint32_t i = 0; i < n; i += chunk) {
        uint32_t c = n - i < chunk ? n - i : chunk;
        for (uint32_t j = 0; j < c; j++)
            f->chunk[j] = (struct fwd_token){s, ids[i + j], logits && i + j == n - 1};
        int rv = fwd_eval(f, f->chunk, c, logits);
        if (rv) return rv;
    }
    return 0;
}
