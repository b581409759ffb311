#include "gpu-worker/fwd.h"
#include "common/err.h"
#include "common/qtype.h"
#include "common/quant.h"
#include "kernels/ref/ops.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- thread pool ----------------------------------------------------------------------------
 * pool_for splits [0, n) into n_threads contiguous ranges, one per thread, the caller running the
 * first. Work items are independent output rows or heads, so the split never changes a result. */

typedef void (*pool_fn)(void *ctx, uint32_t lo, uint32_t hi);

struct pool {
    pthread_t *th;
    uint32_t n_th; /* threads besides the caller */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;     /* bumped per job; a worker runs each generation once */
    uint32_t running; /* workers still on the current job */
    bool stop;
    pool_fn fn;
    void *ctx;
    uint32_t n_items;
};

struct pool_arg {
    struct pool *p;
    uint32_t index; /* 1..n_th */
};

static void range(uint32_t n, uint32_t parts, uint32_t i, uint32_t *lo, uint32_t *hi)
{
    *lo = (uint32_t)((uint64_t)n * i / parts);
    *hi = (uint32_t)((uint64_t)n * (i + 1) / parts);
}

static void *pool_main(void *arg)
{
    struct pool_arg *a = arg;
    struct pool *p = a->p;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen && !p->stop) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->gen;
        pool_fn fn = p->fn;
        void *ctx = p->ctx;
        uint32_t lo, hi;
        range(p->n_items, p->n_th + 1, a->index, &lo, &hi);
        pthread_mutex_unlock(&p->mu);
        if (lo < hi) fn(ctx, lo, hi);
        pthread_mutex_lock(&p->mu);
        if (--p->running == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

static void pool_for(struct pool *p, uint32_t n, pool_fn fn, void *ctx)
{
    /* Below a few items per thread the wake-up costs more than the work. */
    if (p->n_th == 0 || n < 2 * (p->n_th + 1)) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->running = p->n_th;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    uint32_t lo, hi;
    range(n, p->n_th + 1, 0, &lo, &hi);
    fn(ctx, lo, hi);
    pthread_mutex_lock(&p->mu);
    while (p->running) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

static void pool_stop(struct pool *p, struct pool_arg *args, uint32_t started)
{
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < started; i++) pthread_join(p->th[i], NULL);
    free(args);
    free(p->th);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
}

/* ---- the pass ------------------------------------------------------------------------------- */

struct fwd {
    const struct model *m;
    struct kv_cache *kv;
    struct fwd_opts o;
    struct pool pool;
    struct pool_arg *pool_args;
    size_t act_stride; /* bytes per token of quantized activations: the widest any matrix needs */
    uint32_t n_ff;     /* widest FFN hidden width (routed or shared expert) */
    /* Scratch, rows of max_tokens tokens: */
    float *x;        /* (T, n_embd) residual stream */
    float *xn;       /* (T, n_embd) normalized input of a block */
    float *tmp;      /* (T, n_embd) a block's output before the residual add */
    float *q, *k, *v; /* (T, n_head*head_dim), (T, k_dim), (T, v_dim) */
    float *att;      /* (T, n_head*head_dim_v) */
    float *rlogit;   /* (T, n_expert) router logits, then probabilities */
    uint32_t *sel;   /* (T, n_expert_used) selected experts */
    float *selw;     /* (T, n_expert_used) their weights */
    float *moe;      /* (T, n_embd) sum of expert outputs */
    float *gx;       /* (T, n_embd) inputs gathered for one expert */
    float *g, *u;    /* (T, n_ff) */
    float *y;        /* (T, n_embd) */
    float *shg;      /* (T) shared expert gate logit */
    uint32_t *tok;   /* (T) tokens routed to one expert */
    float *tokw;     /* (T) their routing weights */
    uint8_t *acts;   /* (T, act_stride) */
    uint32_t *pos;   /* (T) positions */
    struct fwd_token *chunk; /* (T) fwd_prompt's batch */
    struct kv_seq **seen;    /* (T) sequences of the batch being grown */
    uint32_t *seen_len;      /* (T) their lengths before */
};

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
    const size_t T = f->o.max_tokens;
    f->n_ff = hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp;
    widen_act(f, &f->m->output);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const struct model_layer *L = &f->m->layers[l];
        const struct model_mat *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->router,
                                          &L->part[0], &L->part[1], &L->part[2], &L->gate_shexp,
                                          &L->up_shexp, &L->down_shexp, &L->gate_inp_shexp};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) widen_act(f, mats[i]);
    }
    /* Round rows up to 64 bytes so each token's activations start on their own cache line. */
    f->act_stride = (f->act_stride + 63) & ~(size_t)63;
    const size_t E = hp->n_embd, K = hp->n_expert_used;
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
        {(void **)&f->gx, T * E * sizeof(float)},
        {(void **)&f->g, T * f->n_ff * sizeof(float)},
        {(void **)&f->u, T * f->n_ff * sizeof(float)},
        {(void **)&f->y, T * E * sizeof(float)},
        {(void **)&f->shg, T * sizeof(float)},
        {(void **)&f->tok, T * sizeof(uint32_t)},
        {(void **)&f->tokw, T * sizeof(float)},
        {(void **)&f->acts, T * f->act_stride},
        {(void **)&f->pos, T * sizeof(uint32_t)},
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
    if (o->max_tokens == 0)
        return strata_errf(STRATA_EINVAL, "max_tokens per forward pass must be positive");
    struct fwd *f = calloc(1, sizeof *f);
    if (!f) return strata_errf(STRATA_ENOMEM, "out of memory for the forward pass");
    f->m = m;
    f->kv = kv;
    f->o = *o;
    if (f->o.n_threads == 0) f->o.n_threads = 1;
    int rv;
    struct pool *p = &f->pool;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->th = calloc(f->o.n_threads, sizeof *p->th);
    f->pool_args = calloc(f->o.n_threads, sizeof *f->pool_args);
    if (!p->th || !f->pool_args) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for %u threads", f->o.n_threads);
        goto fail;
    }
    if ((rv = alloc_scratch(f)) != 0) goto fail;
    for (uint32_t i = 0; i + 1 < f->o.n_threads; i++) {
        f->pool_args[i] = (struct pool_arg){p, i + 1};
        int e = pthread_create(&p->th[i], NULL, pool_main, &f->pool_args[i]);
        if (e) {
            rv = strata_errf(strata_errno(e), "cannot start compute thread %u of %u", i + 2,
                             f->o.n_threads);
            goto fail;
        }
        p->n_th++;
    }
    *out = f;
    return 0;
fail:
    fwd_close(f);
    return rv;
}

void fwd_close(struct fwd *f)
{
    if (!f) return;
    pool_stop(&f->pool, f->pool_args, f->pool.n_th);
    void *bufs[] = {f->x,    f->xn,   f->tmp,  f->q,   f->k,    f->v,     f->att,
                    f->rlogit, f->sel, f->selw, f->moe, f->gx,   f->g,     f->u,
                    f->y,    f->shg,  f->tok,  f->tokw, f->acts, f->pos,  f->chunk,
                    f->seen, f->seen_len};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(f);
}

/* A matmul job for the pool: rows split across threads. */
struct mm_job {
    const struct model_mat *w;
    const void *wdata;
    const void *acts;
    size_t act_stride;
    uint32_t n_tok;
    float *out;
    size_t out_stride;
};

static void mm_rows(void *ctx, uint32_t lo, uint32_t hi)
{
    const struct mm_job *j = ctx;
    ops_matmul(j->w->type, j->wdata, j->w->row_bytes, j->w->n_in, lo, hi, j->acts, j->act_stride,
               j->n_tok, j->out, j->out_stride);
}

/* matmul: out (n_tok rows of out_stride floats) = W . x for n_tok rows of x (x_stride floats).
 * wdata: w->data, or an expert part from the resolver. */
static int matmul(struct fwd *f, const struct model_mat *w, const void *wdata, const float *x,
                  size_t x_stride, uint32_t n_tok, float *out, size_t out_stride)
{
    int rv = ops_quantize_acts(w->type, x, x_stride, w->n_in, n_tok, f->acts, f->act_stride);
    if (rv) return rv;
    struct mm_job j = {w, wdata, f->acts, f->act_stride, n_tok, out, out_stride};
    pool_for(&f->pool, w->n_out, mm_rows, &j);
    return 0;
}

/* Attention job: items are (token, head) pairs. */
struct att_job {
    struct fwd *f;
    const struct fwd_token *toks;
    uint32_t layer;
};

static void att_items(void *ctx, uint32_t lo, uint32_t hi)
{
    const struct att_job *j = ctx;
    struct fwd *f = j->f;
    const struct model_hparams *hp = &f->m->hp;
    const float scale = 1.0f / sqrtf((float)hp->head_dim);
    const uint32_t group = hp->n_head / hp->n_head_kv;
    for (uint32_t i = lo; i < hi; i++) {
        uint32_t t = i / hp->n_head, h = i % hp->n_head;
        struct ops_kv_view view;
        kv_view(f->kv, j->toks[t].seq, j->layer, h / group, hp->head_dim, hp->head_dim_v, &view);
        ops_attention(f->att + ((size_t)t * hp->n_head + h) * hp->head_dim_v,
                      f->q + ((size_t)t * hp->n_head + h) * hp->head_dim, hp->head_dim,
                      hp->head_dim_v, scale, &view, f->pos[t] + 1);
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
    for (uint32_t t = 0; t < n; t++) ops_rmsnorm(f->xn + t * E, f->x + t * E, L->attn_norm, E,
                                                 hp->rms_eps);
    if ((rv = matmul(f, &L->wq, L->wq.data, f->xn, E, n, f->q, nq)) ||
        (rv = matmul(f, &L->wk, L->wk.data, f->xn, E, n, f->k, nk)) ||
        (rv = matmul(f, &L->wv, L->wv.data, f->xn, E, n, f->v, nv)))
        return rv;
    for (uint32_t t = 0; t < n; t++) {
        float *q = f->q + t * nq, *k = f->k + t * nk, *v = f->v + t * nv;
        if (L->bq) {
            for (size_t i = 0; i < nq; i++) q[i] += L->bq[i];
            for (size_t i = 0; i < nk; i++) k[i] += L->bk[i];
            for (size_t i = 0; i < nv; i++) v[i] += L->bv[i];
        }
        if (hp->qk_norm == MODEL_QK_NORM_HEAD) {
            for (uint32_t h = 0; h < hp->n_head; h++)
                ops_rmsnorm(q + h * hp->head_dim, q + h * hp->head_dim, L->q_norm, hp->head_dim,
                            hp->rms_eps);
            for (uint32_t h = 0; h < hp->n_head_kv; h++)
                ops_rmsnorm(k + h * hp->head_dim, k + h * hp->head_dim, L->k_norm, hp->head_dim,
                            hp->rms_eps);
        } else if (hp->qk_norm == MODEL_QK_NORM_FULL) {
            ops_rmsnorm(q, q, L->q_norm, nq, hp->rms_eps);
            ops_rmsnorm(k, k, L->k_norm, nk, hp->rms_eps);
        }
        const bool neox = hp->rope == MODEL_ROPE_NEOX;
        ops_rope(q, hp->n_head, hp->head_dim, hp->n_rot, f->pos[t], hp->rope_theta, neox);
        ops_rope(k, hp->n_head_kv, hp->head_dim, hp->n_rot, f->pos[t], hp->rope_theta, neox);
        memcpy(kv_k(f->kv, toks[t].seq, il, f->pos[t]), k, nk * sizeof(float));
        memcpy(kv_v(f->kv, toks[t].seq, il, f->pos[t]), v, nv * sizeof(float));
    }
    /* Every token's K/V of this layer is stored before any token attends: a prompt chunk's later
     * tokens see its earlier ones, and each sees only positions <= its own. */
    struct att_job j = {f, toks, il};
    pool_for(&f->pool, n * hp->n_head, att_items, &j);
    if ((rv = matmul(f, &L->wo, L->wo.data, f->att, (size_t)hp->n_head * hp->head_dim_v, n,
                     f->tmp, E)))
        return rv;
    for (size_t i = 0; i < n * E; i++) f->x[i] += f->tmp[i];
    return 0;
}

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
            for (uint32_t i = 0; i < K; i++) w[i] = p[sel[i]];
            ops_softmax(w, K);
            continue;
        }
        ops_softmax(p, E);
        ops_topk(p, E, K, sel);
        float sum = 0.0f;
        for (uint32_t i = 0; i < K; i++) sum += w[i] = p[sel[i]];
        if (hp->norm_topk)
            for (uint32_t i = 0; i < K; i++) w[i] /= sum;
    }
}

/* swiglu_ffn: y (n rows of n_embd) = down(silu(gate x) * up x) for the n rows of x in f->gx. */
static int swiglu_ffn(struct fwd *f, const struct model_mat *gate, const void *gd,
                      const struct model_mat *up, const void *ud, const struct model_mat *down,
                      const void *dd, uint32_t n)
{
    const size_t E = f->m->hp.n_embd, F = gate->n_out;
    int rv;
    if ((rv = matmul(f, gate, gd, f->gx, E, n, f->g, F)) ||
        (rv = matmul(f, up, ud, f->gx, E, n, f->u, F)))
        return rv;
    for (uint32_t t = 0; t < n; t++) ops_swiglu(f->g + t * F, f->g + t * F, f->u + t * F, F);
    return matmul(f, down, dd, f->g, F, n, f->y, E);
}

static int moe(struct fwd *f, uint32_t n, uint32_t il)
{
    const struct model *m = f->m;
    const struct model_hparams *hp = &m->hp;
    const struct model_layer *L = &m->layers[il];
    const size_t E = hp->n_embd, K = hp->n_expert_used;
    int rv;
    for (uint32_t t = 0; t < n; t++) ops_rmsnorm(f->xn + t * E, f->x + t * E, L->ffn_norm, E,
                                                 hp->rms_eps);
    if ((rv = matmul(f, &L->router, L->router.data, f->xn, E, n, f->rlogit, hp->n_expert)))
        return rv;
    route(f, n);
    memset(f->moe, 0, n * E * sizeof(float));
    /* One pass per expert over the tokens routed to it; experts in id order, so each token's sum
     * is taken in expert-id order whatever else is in the batch. */
    for (uint32_t e = 0; e < hp->n_expert; e++) {
        uint32_t nt = 0;
        for (uint32_t t = 0; t < n; t++)
            for (size_t i = 0; i < K; i++)
                if (f->sel[t * K + i] == e) {
                    f->tok[nt] = t;
                    f->tokw[nt++] = f->selw[t * K + i];
                }
        if (!nt) continue;
        for (uint32_t i = 0; i < nt; i++)
            memcpy(f->gx + i * E, f->xn + f->tok[i] * E, E * sizeof(float));
        if ((rv = swiglu_ffn(f, &L->part[MODEL_PART_GATE],
                             model_expert_part(m, il, e, MODEL_PART_GATE), &L->part[MODEL_PART_UP],
                             model_expert_part(m, il, e, MODEL_PART_UP),
                             &L->part[MODEL_PART_DOWN],
                             model_expert_part(m, il, e, MODEL_PART_DOWN), nt)))
            return rv;
        for (uint32_t i = 0; i < nt; i++) {
            float *o = f->moe + f->tok[i] * E;
            const float *y = f->y + i * E;
            for (size_t d = 0; d < E; d++) o[d] += f->tokw[i] * y[d];
        }
    }
    if (hp->n_ff_shexp) {
        memcpy(f->gx, f->xn, n * E * sizeof(float));
        if ((rv = swiglu_ffn(f, &L->gate_shexp, L->gate_shexp.data, &L->up_shexp,
                             L->up_shexp.data, &L->down_shexp, L->down_shexp.data, n)) ||
            (rv = matmul(f, &L->gate_inp_shexp, L->gate_inp_shexp.data, f->xn, E, n, f->shg, 1)))
            return rv;
        for (uint32_t t = 0; t < n; t++) {
            const float s = 1.0f / (1.0f + expf(-f->shg[t]));
            for (size_t d = 0; d < E; d++) f->moe[t * E + d] += s * f->y[t * E + d];
        }
    }
    for (size_t i = 0; i < n * E; i++) f->x[i] += f->moe[i];
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
        while (s < n_seen && f->seen[s] != toks[t].seq) s++;
        if (s == n_seen) {
            f->seen[n_seen] = toks[t].seq;
            f->seen_len[n_seen++] = toks[t].seq->n_tokens;
        }
        f->pos[t] = toks[t].seq->n_tokens;
        if ((rv = kv_seq_resize(f->kv, toks[t].seq, f->pos[t] + 1)) != 0) break;
    }
    if (rv)
        for (uint32_t s = 0; s < n_seen; s++) kv_seq_resize(f->kv, f->seen[s], f->seen_len[s]);
    return rv;
}

int fwd_eval(struct fwd *f, const struct fwd_token *toks, uint32_t n, float *logits)
{
    const struct model *m = f->m;
    const struct model_hparams *hp = &m->hp;
    const size_t E = hp->n_embd;
    int rv;
    if (n == 0 || n > f->o.max_tokens)
        return strata_errf(STRATA_EINVAL, "a forward pass of %u tokens: it takes 1..%u", n,
                           f->o.max_tokens);
    for (uint32_t t = 0; t < n; t++)
        if (toks[t].id < 0 || (uint32_t)toks[t].id >= hp->n_vocab)
            return strata_errf(STRATA_EINVAL, "token id %d is outside the vocabulary of %u",
                               toks[t].id, hp->n_vocab);
    if ((rv = grow(f, toks, n)) != 0) return rv;
    for (uint32_t t = 0; t < n; t++) {
        const uint8_t *row = (const uint8_t *)m->token_embd.data +
                             (uint64_t)toks[t].id * m->token_embd.row_bytes;
        if ((rv = quant_dequantize(m->token_embd.type, row, f->x + t * E, E)) != 0) goto fail;
    }
    for (uint32_t il = 0; il < hp->n_layer; il++)
        if ((rv = attention(f, toks, n, il)) || (rv = moe(f, n, il))) goto fail;
    uint32_t n_out = 0;
    for (uint32_t t = 0; t < n; t++)
        if (toks[t].logits)
            ops_rmsnorm(f->xn + n_out++ * E, f->x + t * E, m->output_norm, E, hp->rms_eps);
    if (n_out && (rv = matmul(f, &m->output, m->output.data, f->xn, E, n_out, logits,
                              hp->n_vocab)) != 0)
        goto fail;
    return 0;
fail:
    for (uint32_t t = n; t-- > 0;) kv_seq_resize(f->kv, toks[t].seq, f->pos[t]);
    return rv;
}

int fwd_prompt(struct fwd *f, struct kv_seq *s, const int32_t *ids, uint32_t n, uint32_t chunk,
               float *logits)
{
    if (chunk == 0 || chunk > f->o.max_tokens) chunk = f->o.max_tokens;
    for (uint32_t i = 0; i < n; i += chunk) {
        uint32_t c = n - i < chunk ? n - i : chunk;
        for (uint32_t j = 0; j < c; j++)
            f->chunk[j] = (struct fwd_token){s, ids[i + j], logits && i + j == n - 1};
        int rv = fwd_eval(f, f->chunk, c, logits);
        if (rv) return rv;
    }
    return 0;
}
