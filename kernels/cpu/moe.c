#include "kernels/cpu/moe.h"
#include "common/base/err.h"
#include "common/base/pool.h"
#include "common/quant/quant.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_mm.h"
#include "kernels/ref/ops.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct cpu_moe {
    uint32_t max_pairs, max_groups, n_embd, n_ff;
    struct cpu_moe_oss oss;
    size_t act_stride;
    uint8_t *acts[2];          /* (max_pairs tokens, act_stride): x quantized for gate, for up */
    uint8_t *pacts[2];         /* (max_pairs, act_stride): gathered per pair in group order */
    uint8_t *hacts;            /* (max_pairs, act_stride): SwiGLU outputs quantized for down */
    float *g, *u;              /* (max_pairs, n_ff) gate and up outputs, then h in g */
    float *y;                  /* (max_pairs, n_embd) down outputs in group order */
    uint32_t *row_grp;         /* (max_pairs) each group-order row's group */
    const float **bias;        /* (3 * max_groups) each group's gate, up, down biases */
    struct cpu_mm_task *tasks; /* (2 * max_groups) */
    uint32_t *first;           /* (2 * max_groups + 1) */
};

int cpu_moe_init(uint32_t max_pairs, uint32_t n_embd, uint32_t n_ff, size_t act_stride,
                 uint32_t max_groups, struct cpu_moe **out)
{
    struct cpu_moe *w = calloc(1, sizeof *w);
    if (!w) return strata_errf(STRATA_ENOMEM, "out of memory for the expert step");
    *w = (struct cpu_moe){.max_pairs = max_pairs,
                          .max_groups = max_groups,
                          .n_embd = n_embd,
                          .n_ff = n_ff,
                          .act_stride = act_stride};
    const size_t P = max_pairs ? max_pairs : 1;
    struct {
        void **p;
        size_t bytes;
    } bufs[] = {
        {(void **)&w->acts[0], P * act_stride},
        {(void **)&w->acts[1], P * act_stride},
        {(void **)&w->pacts[0], P * act_stride},
        {(void **)&w->pacts[1], P * act_stride},
        {(void **)&w->hacts, P * act_stride},
        {(void **)&w->g, P * n_ff * sizeof(float)},
        {(void **)&w->u, P * n_ff * sizeof(float)},
        {(void **)&w->y, P * n_embd * sizeof(float)},
        {(void **)&w->row_grp, P * sizeof(uint32_t)},
        {(void **)&w->bias, 3 * (size_t)(max_groups ? max_groups : 1) * sizeof(float *)},
        {(void **)&w->tasks,
         2 * (size_t)(max_groups ? max_groups : 1) * sizeof(struct cpu_mm_task)},
        {(void **)&w->first, (2 * (size_t)max_groups + 1) * sizeof(uint32_t)},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i].p = malloc(bufs[i].bytes ? bufs[i].bytes : 1))) {
            cpu_moe_fini(w);
            return strata_errf(STRATA_ENOMEM,
                               "out of memory for expert scratch of %u pairs: lower the batch "
                               "or chunk size",
                               max_pairs);
        }
    *out = w;
    return 0;
}

void cpu_moe_set_oss(struct cpu_moe *w, const struct cpu_moe_oss *o)
{
    w->oss = *o;
}

void cpu_moe_fini(struct cpu_moe *w)
{
    if (!w) return;
    void *bufs[] = {w->acts[0], w->acts[1], w->pacts[0], w->pacts[1], w->hacts,   w->g,
                    w->u,       w->y,       w->tasks,    w->first,    w->row_grp, (void *)w->bias};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(w);
}

/* The job the pool's loops share: one step's arguments. */
struct job {
    struct cpu_moe *w;
    const struct cpu_moe_parts *parts;
    const int32_t *pair_idx;
    const float *pair_w;
    int k;
    const float *x;
    size_t x_stride;
    const struct cpu_moe_part *qpart; /* quant_rows: the part x is quantized for */
    const uint8_t *src;               /* gather: token rows */
    uint8_t *dst;                     /* gather: pair rows */
    size_t bytes;                     /* gather: bytes of a row */
    float *out;
    _Atomic int rv;
};

static void quant_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct job *j = ctx;
    const struct cpu_moe_part *p = j->qpart;
    int rv = cpu_quantize_acts(p->type, j->x + lo * j->x_stride, j->x_stride, p->n_in, hi - lo,
                               j->dst + lo * j->w->act_stride, j->w->act_stride);
    if (rv) atomic_store(&j->rv, rv);
}

static void gather_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct job *j = ctx;
    const size_t s = j->w->act_stride;
    for (uint32_t i = lo; i < hi; i++)
        memcpy(j->dst + i * s, j->src + (size_t)(j->pair_idx[i] / j->k) * s, j->bytes);
}

/* SwiGLU of the pairs and its quantization for down. */
static void glu_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    struct job *j = ctx;
    struct cpu_moe *w = j->w;
    const struct cpu_moe_oss *pt = &w->oss;
    const uint32_t F = j->parts->down.n_in;
    for (uint32_t i = lo; i < hi; i++) {
        float *g = w->g + (size_t)i * F, *u = w->u + (size_t)i * F;
        if (pt->bias) {
            const float *bg = w->bias[3 * w->row_grp[i]], *bu = w->bias[3 * w->row_grp[i] + 1];
            for (uint32_t c = 0; c < F; c++) {
                g[c] += bg[c];
                u[c] += bu[c];
            }
        }
        if (pt->glu_oai)
            cpu_swiglu_oai(g, g, u, F, pt->alpha, pt->limit);
        else
            cpu_swiglu(g, g, u, F);
    }
    int rv = cpu_quantize_acts(j->parts->down.type, w->g + (size_t)lo * F, F, F, hi - lo,
                               w->hacts + lo * w->act_stride, w->act_stride);
    if (rv) atomic_store(&j->rv, rv);
}

/* Each pair's down output, weighted, to its row of out. */
static void scatter_rows(void *ctx, uint32_t lo, uint32_t hi, uint32_t thread)
{
    const struct job *j = ctx;
    const size_t E = j->parts->down.n_out;
    for (uint32_t i = lo; i < hi; i++) {
        const int32_t p = j->pair_idx[i];
        const float wt = j->pair_w[p], *y = j->w->y + (size_t)i * E;
        float *o = j->out + (size_t)p * E;
        if (j->w->oss.bias) {
            const float *b = j->w->bias[3 * j->w->row_grp[i] + 2];
            for (size_t d = 0; d < E; d++)
                o[d] = wt * (y[d] + b[d]);
            continue;
        }
        for (size_t d = 0; d < E; d++)
            o[d] = wt * y[d];
    }
}

static struct cpu_mm_task mm(const struct cpu_moe_part *p, const void *wdata, const void *acts,
                             size_t act_stride, uint32_t n_tok, float *out, size_t out_stride)
{
    return (struct cpu_mm_task){p->type, p->n_in,    p->n_out, p->row_bytes, wdata,
                                acts,    act_stride, n_tok,    out,          out_stride};
}

int cpu_moe_ffn(struct cpu_moe *w, struct pool *pool, const struct cpu_moe_parts *parts,
                cpu_moe_part_fn part, void *ctx, const struct moe_group *groups, int n_groups,
                const int32_t *pair_idx, const float *pair_w, uint32_t n_tok, int k, const float *x,
                size_t x_stride, float *out, uint64_t *weight_bytes)
{
    const size_t F = parts->gate.n_out, E = parts->down.n_out, s = w->act_stride;
    uint32_t n_pairs = 0;
    for (int g = 0; g < n_groups; g++)
        n_pairs += (uint32_t)groups[g].count;
    if (weight_bytes) *weight_bytes = 0;
    if (!n_pairs) return 0;
    if (n_pairs > w->max_pairs || n_tok > w->max_pairs || (uint32_t)n_groups > w->max_groups ||
        F > w->n_ff || E > w->n_embd)
        return strata_errf(STRATA_EINVAL,
                           "expert step of %u pairs in %d groups (%u tokens): the scratch holds "
                           "%u pairs, %u groups",
                           n_pairs, n_groups, n_tok, w->max_pairs, w->max_groups);
    /* moe_group lays the groups' pairs out back to back: pair_idx from groups[0].first on. */
    const int32_t *pidx = pair_idx + groups[0].first;
    struct job j = {w, parts, pidx, pair_w, k, x, x_stride, &parts->gate, NULL, NULL, 0, out, 0};
    /* x quantized per token for gate, and for up when up quantizes another way */
    const bool up_apart = quant_act_type(parts->up.type) != quant_act_type(parts->gate.type);
    j.dst = w->acts[0];
    pool_for(pool, n_tok, 16, quant_rows, &j);
    if (up_apart) {
        j.dst = w->acts[1];
        j.qpart = &parts->up;
        pool_for(pool, n_tok, 16, quant_rows, &j);
    }
    if (atomic_load(&j.rv)) return atomic_load(&j.rv);
    j.src = w->acts[0];
    j.dst = w->pacts[0];
    j.bytes = quant_act_bytes(parts->gate.type, parts->gate.n_in);
    pool_for(pool, n_pairs, 64, gather_rows, &j);
    if (up_apart) {
        j.src = w->acts[1];
        j.dst = w->pacts[1];
        j.bytes = quant_act_bytes(parts->up.type, parts->up.n_in);
        pool_for(pool, n_pairs, 64, gather_rows, &j);
    }
    const uint8_t *pu = up_apart ? w->pacts[1] : w->pacts[0];
    uint32_t nt = 0;
    uint64_t bytes = 0;
    for (int g = 0; g < n_groups; g++) {
        const uint32_t e = (uint32_t)groups[g].expert, c = (uint32_t)groups[g].count,
                       i0 = (uint32_t)(groups[g].first - groups[0].first);
        w->tasks[nt++] =
            mm(&parts->gate, part(ctx, e, 0), w->pacts[0] + i0 * s, s, c, w->g + i0 * F, F);
        w->tasks[nt++] = mm(&parts->up, part(ctx, e, 1), pu + i0 * s, s, c, w->u + i0 * F, F);
        for (uint32_t i = i0; i < i0 + c; i++)
            w->row_grp[i] = (uint32_t)g;
        for (int b = 0; w->oss.bias && b < 3; b++)
            w->bias[3 * g + b] = part(ctx, e, 3 + b);
    }
    bytes += cpu_mm_run(pool, w->tasks, nt, w->first);
    /* a decode step's few pairs go one or two to a thread: SwiGLU's expf and the quantization
     * ran on one thread while the others waited */
    const uint32_t per = n_pairs / pool_threads(pool);
    pool_for(pool, n_pairs, per < 1 ? 1 : per > 8 ? 8 : per, glu_rows, &j);
    if (atomic_load(&j.rv)) return atomic_load(&j.rv);
    nt = 0;
    for (int g = 0; g < n_groups; g++) {
        const uint32_t e = (uint32_t)groups[g].expert, c = (uint32_t)groups[g].count,
                       i0 = (uint32_t)(groups[g].first - groups[0].first);
        w->tasks[nt++] =
            mm(&parts->down, part(ctx, e, 2), w->hacts + i0 * s, s, c, w->y + i0 * E, E);
    }
    bytes += cpu_mm_run(pool, w->tasks, nt, w->first);
    pool_for(pool, n_pairs, 16, scatter_rows, &j);
    if (weight_bytes) *weight_bytes = bytes;
    return 0;
}
