/* The CUDA backend: the whole forward pass on one GPU, every routed expert resident in VRAM, or,
 * when they do not all fit (or --expert-cache asks for fewer), the hybrid of hybrid_cuda.h: the
 * hottest experts in VRAM slots, the rest computed by the CPU at the same time; the hybrid takes
 * only the routed-expert step (moe()), the rest of the pass is the same.
 *
 * At start the dense weights (embeddings, attention, norms, routers, shared experts, output) are
 * uploaded once, every expert blob is copied into its own VRAM slot (the arena's blob layout, parts
 * at model_blob_layout's offsets, so the hybrid's expert cache can later reuse the slots), and the
 * K/V storage is one device pool per layer indexed by block id in attn.h's layout (f16 or f32;
 * the bookkeeping is kv.h's, shared with the CPU); with the hybrid it is mapped on demand
 * (kv_vram_cuda.h) inside one VRAM budget with the expert slots, a growth past the budget taking
 * slots back through the hybrid's fence. A VRAM plan (weights, KV, experts, scratch,
 * free after --vram-reserve-mib) is logged; a plan that does not fit, a dense tensor or expert part
 * of a type the kernels lack, or a model shape they do not take is refused by name at start.
 * A pass follows backend_cpu.c's order of operations layer by layer. Products run on cu_matvec in
 * runs of at most 16 tokens (its exact integer block dots: the same bits for any batch), attention
 * split by each row's own length (attn_plain.h for f16 KV, attn.h's cu_attention_rows for f32
 * unless STRATA_CUDA_ATTN=plain), and every glue kernel computes each row from that row alone, so a
 * token's logits are the same bits whatever the batch, the chunking or decode vs re-prefill
 * (DESIGN 3.4) for each KV type. Against the CPU backend the logits differ within the tolerances
 * of docs/cuda.md (the GPU's expf, sin/cos, fp32 float products).
 * Host round trips in a pass: the inputs go up once, the logits (and the layers' group counts, for
 * the stats) come down at the end. The routed pairs are grouped on the device (cu_moe_group, the
 * same layout as moe_group) into cu_moe_ffn_dev's fixed worst-case grid; only with a route hook
 * set do the router's picks come down (pinned) so the host groups them and calls the hook.
 * CUDA graphs: a pass of 1..16 tokens that all ask for logits, grouped on the device, is captured
 * once per token count and replayed after (STRATA_CUDA_GRAPH=0 turns that off); the block tables
 * go up at a fixed stride (max_bt) so the captured launches read them in place.
 * Stats: passes, tokens, total_s, weight_bytes; with STRATA_DECODE_TIMING=1 (graphs then off) CUDA
 * events between the phases give attention_s, dense_s, experts_s and output_s, and each tick logs
 * its window's times. Threads: the decode thread only (each entry point sets the device, --gpu),
 * one stream.
 */
#include "gpu-worker/backend.h"
#include "gpu-worker/hybrid_cuda.h"
#include "gpu-worker/hybrid_plan.h"
#include "gpu-worker/kv_vram_cuda.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/quant/quant.h"
#include "common/quant/qtype.h"
#include "kernels/cuda/attn.h"
#include "kernels/cuda/attn_plain.h"
#include "kernels/cuda/expf.h"
#include "kernels/cuda/glue.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matvec.h"
#include "kernels/cuda/moe_ffn.h"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/qact.h"
#include "kernels/cuda/router.h"
#include "kernels/ref/moe.h"

#include <cuda_runtime_api.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VRAM_RESERVE_MIB 700 /* --vram-reserve-mib default: the CUDA context, cuBLAS-free slack */
#define MM_ROWS          CU_MATVEC_MAX_ACT /* tokens one cu_matvec launch takes */
#define GRAPH_MAX_TOKENS 16 /* decode steps of 1..16 tokens replay a captured graph */

/* A weight matrix in VRAM: the model_mat's shape with a device pointer. */
struct dmat {
    const void *d;
    uint32_t type, n_in, n_out;
    uint64_t row_bytes;
};

struct dlayer {
    float *attn_norm, *ffn_norm, *q_norm, *k_norm, *bq, *bk,
        *bv; /* NULL where the model has none */
    struct dmat wq, wk, wv, wo, router, gate_sh, up_sh, down_sh, gate_inp_sh;
    const uint8_t *const *slots; /* device array of n_expert blob addresses */
    struct cu_moe_parts parts;
    uint64_t group_bytes; /* weight bytes one group of this layer streams (its three parts) */
    /* wq, wk (and wv) of one type lie in one allocation, row after row: qkv views them as one
     * matrix, so a one-token pass makes q, k (and v) in one launch. n_cat: 3, 2 or 0 (apart). */
    struct dmat qkv;
    int n_cat;
};

/* The phases of STRATA_DECODE_TIMING, as backend_stats counts them. */
enum phase { PH_ATTN, PH_DENSE, PH_EXPERTS, PH_OUTPUT, PH_COUNT /* the pass's end */ };
#define MAX_MARKS 1024 /* events of one timed pass */

/* A captured decode step: n tokens, every one asking for logits. The first pass of a shape runs
 * uncaptured (it sets the kernels' lazy state: modules, occupancy, attributes), the second is
 * captured, every later one replays. */
struct step_graph {
    bool seen;
    cudaGraphExec_t exec;
    uint64_t dense_bytes; /* the weight bytes its products stream besides the routed experts */
};

struct cuda_be {
    const struct model *m;
    struct kv_cache *kv;
    struct backend_opts o;
    cudaStream_t s;
    struct backend_stats st;
    backend_route_fn route;
    void *route_ctx;
    char device[64];
    bool attn_plain_f32; /* STRATA_CUDA_ATTN=plain: the plain kernel for f32 KV too */
    bool expf_exact;     /* the GPU's expf gave libm's bits on the start-up sweep */
    bool unfused;        /* STRATA_CUDA_FUSE=0: the MoE layer's separate launches (a diagnostic) */
    bool matvec_chunks;  /* STRATA_CUDA_MATMUL_Q=0: prompt chunks as 16-row matvecs (a diagnostic) */
    bool pdl; /* all-resident passes launch with programmatic dependent launch (sm_90 and later;
               * STRATA_CUDA_PDL=0: off, a diagnostic) */
    void **allocs;       /* every cudaMalloc, freed at close */
    uint32_t n_allocs, cap_allocs;
    struct dlayer *L;
    struct dmat embd, output;
    float *output_norm;
    uint64_t weight_bytes, expert_bytes, kv_bytes, scratch_bytes, slot_bytes;
    uint64_t pairs; /* routed (token, expert) pairs computed, all from slots */
    /* KV: per layer, K then V pools of pool_blocks blocks */
    uint8_t *kv_pool;
    uint64_t kv_layer_bytes; /* one layer's K pool (V the same) */
    uint32_t pool_blocks, block_tokens, max_bt;
    /* device scratch, rows of T = max_pass_tokens tokens or T*K pairs */
    float *x, *xn, *tmp, *q, *k, *v, *qkv1, *att, *rlogit, *selw, *moe, *g, *u, *y, *h, *shg, *xo,
        *logits;
    int32_t *sel, *d_in, *d_pair_idx;
    struct moe_group *d_groups;
    uint8_t *acts[3];
    size_t act_stride;
    void *moe_ws;
    void *row_sync; /* the split norms' meeting points (cu_row_sync_bytes), or NULL:
                     * STRATA_CUDA_SPLIT=0 norms a row in one CTA (the same bits; a diagnostic) */
    /* pinned host mirrors */
    int32_t *h_in, *h_sel, *h_pair_idx, *h_ng;
    struct moe_group *h_groups;
    /* grouping on the device: each layer's group count, the bound on a pass's groups */
    int32_t *d_ng;
    bool dev_grouped; /* this pass grouped every layer on the device (no route hook) */
    bool xn_ready;    /* xn already holds the norm the next step takes (a fused add made it) */
    bool xn_q;        /* acts[0] holds xn quantized for the next layer's wq (the combine made it) */
    bool xn_moe_q;    /* acts[1] holds xn quantized for the experts' gate (the norm after wo) */
    /* attention: the split records of CU_ATTN_MAX_ROWS rows, and the longest row (n_ctx) */
    void *attn_ws;
    int64_t attn_max_len;
    /* CUDA graphs of decode steps (STRATA_CUDA_GRAPH=0: off), by token count */
    bool graphs_on;
    struct step_graph graph[GRAPH_MAX_TOKENS + 1];
    uint64_t graph_replays, graph_captures;
    double mem_gbs; /* copy bandwidth measured at start: the decode roofline */
    /* STRATA_DECODE_TIMING: events between the phases of a pass (graphs off) */
    bool timing;
    cudaEvent_t ev[MAX_MARKS];
    uint8_t ev_phase[MAX_MARKS];
    uint32_t n_ev;
    struct backend_stats tick_st; /* the stats at the last tick (each window's own times) */
    uint64_t window;
    /* host scratch */
    uint32_t *pos, *rtok, *seen_len;
    struct kv_seq **seen;
    /* the hybrid (hybrid_cuda.h): NULL when every expert is resident */
    struct hyb *hyb;
    struct cu_moe_parts *parts; /* (n_layer) each layer's, for the hybrid */
    uint32_t *chunk_of;         /* (T) a token's prompt chunk (its sequence), or UINT32_MAX */
    uint32_t n_slots;
    bool force_hybrid; /* STRATA_CUDA_HYBRID=1 */
    /* the device (--gpu), and one VRAM budget for K/V and the slots: with the hybrid, K/V is
     * mapped on demand (kv_vram_cuda.h) and a growth past the budget takes slots back */
    int dev;
    struct kv_vram *kvv; /* NULL: the whole K/V pool allocated at start */
    uint64_t budget;     /* --vram-mib, or all that was free after the reserve */
    uint64_t fixed; /* weights, scratch and the hybrid's buffers: what is neither K/V nor slots */
    uint64_t kv_grows;
    uint32_t kv_took; /* slots K/V growth took back */
};

/* The packed per-pass inputs (d_in / h_in), in units of T int32: ids, positions, KV slots, each
 * token's sequence index, its key count, the rows asking for logits, then block tables. */
enum { IN_IDS, IN_POS, IN_SLOT, IN_QSEQ, IN_KVLEN, IN_OUTROWS, IN_BT };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int ck(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    return strata_errf(STRATA_ECUDAERR | (int)e, "CUDA: %s: %s", what, cudaGetErrorString(e));
}

static double gib(uint64_t b)
{
    return (double)b / (1u << 30);
}

/* dalloc: bytes of VRAM (at least 1), remembered for close. */
static int dalloc(struct cuda_be *c, size_t bytes, void **out)
{
    if (c->n_allocs == c->cap_allocs) {
        uint32_t cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
        void **a = realloc(c->allocs, cap * sizeof *a);
        if (!a) return strata_errf(STRATA_ENOMEM, "out of memory for the VRAM table");
        c->allocs = a, c->cap_allocs = cap;
    }
    int rv = ck(cudaMalloc(out, bytes ? bytes : 1), "cudaMalloc");
    if (rv)
        return strata_errf(STRATA_ENOSPC,
                           "CUDA: cannot allocate %.1f MiB of VRAM (%s): lower "
                           "--ctx or --seqs, raise nothing else on this GPU, or use --backend cpu",
                           (double)bytes / (1 << 20), strata_errdetail());
    c->allocs[c->n_allocs++] = *out;
    return 0;
}

static int upload(struct cuda_be *c, const void *src, size_t bytes, void **out)
{
    int rv = dalloc(c, bytes, out);
    if (rv) return rv;
    return ck(cudaMemcpy(*out, src, bytes, cudaMemcpyHostToDevice), "upload");
}

static int upload_vec(struct cuda_be *c, const float *src, size_t n, float **out)
{
    if (!src) return *out = NULL, 0;
    c->weight_bytes += n * sizeof(float);
    return upload(c, src, n * sizeof(float), (void **)out);
}

static int upload_mat(struct cuda_be *c, const struct model_mat *w, struct dmat *out)
{
    *out = (struct dmat){NULL, w->type, w->n_in, w->n_out, w->row_bytes};
    if (!w->data) return 0;
    c->weight_bytes += w->n_out * w->row_bytes;
    return upload(c, w->data, w->n_out * w->row_bytes, (void **)&out->d);
}

/* upload_qkv: wq, wk and wv; those of wq's type and row size (wk, then wv) go up in one
 * allocation after wq's rows, viewed together as D->qkv. */
static int upload_qkv(struct cuda_be *c, const struct model_layer *L, struct dlayer *D)
{
    const struct model_mat *m[3] = {&L->wq, &L->wk, &L->wv};
    struct dmat *d[3] = {&D->wq, &D->wk, &D->wv};
    int n = 1;
    while (n < 3 && m[n]->data && m[n]->type == m[0]->type && m[n]->row_bytes == m[0]->row_bytes &&
           m[n]->n_in == m[0]->n_in)
        n++;
    if (!m[0]->data || n == 1) {
        D->n_cat = 0;
        int rv;
        for (int i = 0; i < 3; i++)
            if ((rv = upload_mat(c, m[i], d[i]))) return rv;
        return 0;
    }
    uint64_t rows = 0;
    for (int i = 0; i < n; i++)
        rows += m[i]->n_out;
    uint8_t *buf;
    int rv = dalloc(c, rows * m[0]->row_bytes, (void **)&buf);
    for (int i = 0, at = 0; !rv && i < n; at += (int)m[i]->n_out, i++) {
        *d[i] = (struct dmat){buf + (uint64_t)at * m[0]->row_bytes, m[i]->type, m[i]->n_in,
                              m[i]->n_out, m[i]->row_bytes};
        c->weight_bytes += m[i]->n_out * m[i]->row_bytes;
        rv = ck(cudaMemcpy((void *)d[i]->d, m[i]->data, m[i]->n_out * m[i]->row_bytes,
                           cudaMemcpyHostToDevice),
                "upload");
    }
    D->qkv = (struct dmat){buf, m[0]->type, m[0]->n_in, (uint32_t)rows, m[0]->row_bytes};
    D->n_cat = n;
    for (int i = n; !rv && i < 3; i++)
        rv = upload_mat(c, m[i], d[i]);
    return rv;
}

/* ---- what the kernels take: refused by name at start -------------------------------------- */

/* check_mat: a dense matrix the products compute with (type and row length). */
static int check_mat(const struct model_mat *w, const char *name)
{
    if (!w->n_in) return 0;
    if (!cu_type_supported(w->type) || cu_act_row_bytes(w->type, w->n_in) == 0) {
        /* the PATTERN of --tensor-type: the name without blk.N. and .weight */
        const char *p = strncmp(name, "blk.", 4) == 0 ? strchr(name + 4, '.') + 1 : name;
        char pattern[64];
        snprintf(pattern, sizeof pattern, "%.*s", (int)strcspn(p, "."), p);
        return strata_errf(
            STRATA_EUNSUPPORTED,
            "the CUDA backend has no kernel for tensor %s: %s, %u columns (its "
            "types: f32 f16 bf16 q8_0 q5_0 q4_K q5_K q6_K): requantize it with `strata "
            "quantize IN.gguf OUT.gguf TYPE --tensor-type %s=q4_K` (or q8_0), or run "
            "it with --backend cpu",
            name, qtype_name(w->type), w->n_in, pattern);
    }
    return 0;
}

static int check_model(const struct model *m)
{
    const struct model_hparams *hp = &m->hp;
    int rv;
    /* glm4moe's and deepseek2's routing, layer kinds and MLA have no CUDA kernels yet */
    if (hp->arch == MODEL_ARCH_GLM4MOE || hp->arch == MODEL_ARCH_DEEPSEEK2)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "the CUDA backend has no kernels for %s (%ssigmoid routing with a "
                           "selection bias, leading dense layers, an ungated shared expert): use "
                           "--backend cpu",
                           model_arch_name(hp->arch),
                           hp->mla ? "multi-head latent attention, " : "");
    /* gpt-oss's features have no CUDA kernels yet: refused by name, never run without them */
    const char *oss = hp->attn_sinks           ? "attention sinks"
                      : hp->n_swa              ? "sliding-window attention"
                      : hp->attn_out_bias      ? "an attention output bias"
                      : hp->router_bias        ? "a router bias"
                      : hp->exp_bias           ? "expert biases"
                      : hp->glu_oai            ? "the clamped SwiGLU"
                      : hp->yarn_factor > 1.0f ? "YaRN RoPE"
                                               : NULL;
    if (oss)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "the CUDA backend has no kernels for %s (%s): use --backend cpu", oss,
                           model_arch_name(hp->arch));
    if (hp->head_dim != hp->head_dim_v || hp->head_dim % 32 || hp->head_dim > 256)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "the CUDA backend's attention takes key and value heads of one size, a "
                           "multiple of 32 up to 256; this model has %u and %u: use --backend cpu",
                           hp->head_dim, hp->head_dim_v);
    if (hp->n_expert > 256 || hp->n_expert_used > 16 || hp->n_expert_used == 0)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "the CUDA router takes up to 256 experts and top-1..16; this model has "
                           "%u experts, top-%u: use --backend cpu",
                           hp->n_expert, hp->n_expert_used);
    if ((rv = check_mat(&m->token_embd, "token_embd.weight")) ||
        (rv = check_mat(&m->output, "output.weight")))
        return rv;
    if (hp->n_embd % 8)
        return strata_errf(STRATA_EUNSUPPORTED, "n_embd %u: the CUDA backend takes multiples of 8",
                           hp->n_embd);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        const struct {
            const struct model_mat *w;
            const char *name;
        } mats[] = {{&L->wq, "attn_q"},
                    {&L->wk, "attn_k"},
                    {&L->wv, "attn_v"},
                    {&L->wo, "attn_output"},
                    {&L->router, "ffn_gate_inp"},
                    {&L->gate_shexp, "ffn_gate_shexp"},
                    {&L->up_shexp, "ffn_up_shexp"},
                    {&L->down_shexp, "ffn_down_shexp"},
                    {&L->gate_inp_shexp, "ffn_gate_inp_shexp"},
                    {&L->part[MODEL_PART_GATE], "ffn_gate_exps"},
                    {&L->part[MODEL_PART_UP], "ffn_up_exps"},
                    {&L->part[MODEL_PART_DOWN], "ffn_down_exps"}};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%u.%s.weight", l, mats[i].name);
            if ((rv = check_mat(mats[i].w, name))) return rv;
        }
    }
    return 0;
}

/* ---- start ---------------------------------------------------------------------------------- */

static void widen_act(struct cuda_be *c, const struct model_mat *w)
{
    if (!w->n_in) return;
    size_t b = cu_act_row_bytes(w->type, w->n_in);
    if (b > c->act_stride) c->act_stride = b;
}

static int upload_experts(struct cuda_be *c, uint64_t slot_bytes)
{
    const struct model *m = c->m;
    const struct model_hparams *hp = &m->hp;
    const uint64_t n_slots = (uint64_t)hp->n_layer * hp->n_expert;
    uint8_t *base;
    const uint8_t **ptrs = malloc(n_slots * sizeof *ptrs);
    if (!ptrs) return strata_errf(STRATA_ENOMEM, "out of memory for the slot table");
    int rv = dalloc(c, n_slots * slot_bytes, (void **)&base);
    for (uint32_t l = 0; !rv && l < hp->n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        for (uint32_t e = 0; !rv && e < hp->n_expert; e++) {
            uint8_t *dst = base + ((uint64_t)l * hp->n_expert + e) * slot_bytes;
            ptrs[(uint64_t)l * hp->n_expert + e] = dst;
            const uint8_t *blob = model_expert_blob(m, l, e);
            if (blob) {
                rv = ck(cudaMemcpy(dst, blob, L->blob.bytes, cudaMemcpyHostToDevice), "expert");
                continue;
            }
            /* a GGUF file: its parts lie apart, copied into the blob layout */
            for (int p = 0; !rv && p < MODEL_PART_COUNT; p++)
                rv = ck(cudaMemcpy(dst + L->blob.part_off[p],
                                   model_expert_part(m, l, e, (enum model_part)p),
                                   L->part[p].n_out * L->part[p].row_bytes, cudaMemcpyHostToDevice),
                        "expert part");
        }
    }
    const uint8_t **d_ptrs = NULL;
    if (!rv) rv = upload(c, ptrs, n_slots * sizeof *ptrs, (void **)&d_ptrs);
    for (uint32_t l = 0; !rv && l < hp->n_layer; l++)
        c->L[l].slots = (const uint8_t *const *)(d_ptrs + (uint64_t)l * hp->n_expert);
    free(ptrs);
    return rv;
}

static void cuda_close(void *impl);

/* copy_gbs measures the device's copy bandwidth (bytes read plus bytes written per second, the
 * figure a weight stream is held to) on two transient 256 MiB buffers; 0 when they do not fit. */
static double copy_gbs(cudaStream_t s)
{
    const size_t bytes = (size_t)256 << 20;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float best = 0;
    if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess &&
        cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
        for (int i = 0; i < 6; i++) {
            float ms = 0;
            cudaEventRecord(e0, s);
            cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s);
            cudaEventRecord(e1, s);
            if (cudaEventSynchronize(e1) != cudaSuccess ||
                cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
                break;
            const float gbs = (float)(2.0 * bytes / (ms * 1e-3) / 1e9);
            if (i > 0 && gbs > best) best = gbs; /* the first warms up */
        }
    }
    cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return best;
}

static int cuda_start(const struct model *m, const struct backend_opts *o, struct kv_cache *kv,
                      void **out)
{
    const struct model_hparams *hp = &m->hp;
    int rv;
    if ((rv = check_model(m)) != 0) return rv;
    struct cuda_be *c = calloc(1, sizeof *c);
    if (!c) return strata_errf(STRATA_ENOMEM, "out of memory for the CUDA backend");
    c->m = m;
    c->kv = kv;
    c->o = *o;
    const char *ap = getenv("STRATA_CUDA_ATTN");
    c->attn_plain_f32 = ap && strcmp(ap, "plain") == 0;
    const char *gr = getenv("STRATA_CUDA_GRAPH"), *tm = getenv("STRATA_DECODE_TIMING");
    c->timing = tm && *tm && strcmp(tm, "0") != 0;
    const char *fu = getenv("STRATA_CUDA_FUSE");
    c->unfused = fu && strcmp(fu, "0") == 0;
    const char *mq = getenv("STRATA_CUDA_MATMUL_Q");
    c->matvec_chunks = mq && strcmp(mq, "0") == 0;
    c->graphs_on = !(gr && strcmp(gr, "0") == 0) && !c->timing;
    const uint32_t T = o->max_pass_tokens, K = hp->n_expert_used, E = hp->n_embd;
    const struct kv_config *kc = kv_config_of(kv);
    struct cudaDeviceProp prop;
    int n_dev = 0;
    c->dev = (int)o->gpu;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess) n_dev = 0;
    cudaGetLastError();
    if (n_dev > 0 && c->dev >= n_dev) {
        rv = strata_errf(STRATA_EINVAL, "--gpu %d: CUDA sees %d device%s here (0 to %d)", c->dev,
                         n_dev, n_dev == 1 ? "" : "s", n_dev - 1);
        goto fail;
    }
    if ((rv = ck(cudaSetDevice(c->dev), "cudaSetDevice")) ||
        (rv = ck(cudaGetDeviceProperties(&prop, c->dev), "cudaGetDeviceProperties")) ||
        (rv = ck(cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking), "cudaStreamCreate")))
        goto fail;
    snprintf(c->device, sizeof c->device, "%.40s (sm_%d%d, gpu %d)", prop.name, prop.major,
             prop.minor, c->dev);
    const char *pd = getenv("STRATA_CUDA_PDL");
    c->pdl = prop.major >= 9 && !(pd && strcmp(pd, "0") == 0);
    /* SiLU's expf must be the host libm's for the CPU's bits: 2M floats, a few ms */
    uint64_t expf_bad;
    float expf_x = 0;
    if ((rv = cu_expf_check(1u << 11, &expf_bad, &expf_x)) != 0) goto fail;
    c->expf_exact = expf_bad == 0;
    if (expf_bad)
        LOG_WARN("the GPU's expf differs from this host's libm on %llu of 2M floats (first "
                 "expf(%a)): answers are not bit-exact, and --bit-exact refuses to start",
                 (unsigned long long)expf_bad, expf_x);
    c->mem_gbs = copy_gbs(c->s);
    if (!(c->L = calloc(hp->n_layer, sizeof *c->L))) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for the CUDA layer table");
        goto fail;
    }
    /* ---- the plan, before any allocation ---- */
    uint64_t slot_bytes = 0, dense = m->token_embd.n_out * m->token_embd.row_bytes;
    if (m->output.data != m->token_embd.data) dense += m->output.n_out * m->output.row_bytes;
    widen_act(c, &m->output);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        const struct model_mat *mats[] = {&L->wq,       &L->wk,         &L->wv,
                                          &L->wo,       &L->router,     &L->gate_shexp,
                                          &L->up_shexp, &L->down_shexp, &L->gate_inp_shexp};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            dense += mats[i]->n_out * mats[i]->row_bytes;
            widen_act(c, mats[i]);
        }
        dense += (uint64_t)(4 * E + 2 * hp->n_head * hp->head_dim) * sizeof(float);
        uint64_t sb = (L->blob.bytes + 255) & ~(uint64_t)255;
        if (sb > slot_bytes) slot_bytes = sb;
    }
    c->act_stride = (c->act_stride + 255) & ~(size_t)255;
    c->slot_bytes = slot_bytes;
    const uint32_t n_total = hp->n_layer * hp->n_expert;
    c->block_tokens = kc->block_tokens;
    c->pool_blocks = kc->max_blocks;
    c->max_bt = (kc->n_ctx + kc->block_tokens - 1) / kc->block_tokens;
    const size_t elem = o->kv_type == KV_F16 ? 2 : 4;
    c->kv_layer_bytes = (uint64_t)c->pool_blocks * kc->block_tokens * kc->k_dim * elem;
    c->kv_bytes = 2 * c->kv_layer_bytes * hp->n_layer;
    c->expert_bytes = slot_bytes * hp->n_layer * hp->n_expert;
    const uint32_t F = hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp;
    const size_t P = (size_t)T * K, NQ = (size_t)hp->n_head * hp->head_dim,
                 NK = (size_t)hp->n_head_kv * hp->head_dim;
    /* STRATA_CUDA_SLOTS=0: the expert kernels read each slot address after their wait (the same
     * bits; a diagnostic) */
    const char *ss = getenv("STRATA_CUDA_SLOTS");
    const bool stage_slots = !(ss && strcmp(ss, "0") == 0);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        c->L[l].parts =
            (struct cu_moe_parts){{L->part[0].type, L->part[1].type, L->part[2].type},
                                  {L->blob.part_off[0], L->blob.part_off[1], L->blob.part_off[2]},
                                  E,
                                  hp->n_ff_exp,
                                  stage_slots ? hp->n_expert : 0};
        for (int p = 0; p < MODEL_PART_COUNT; p++)
            c->L[l].group_bytes += L->part[p].n_out * L->part[p].row_bytes;
    }
    c->attn_max_len = kc->n_ctx;
    size_t moe_ws = 0; /* layers differ in part types (q4_k_m's Q6_K downs): the widest */
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const size_t b = cu_moe_workspace_bytes(&c->L[l].parts, T, (int)K);
        if (b > moe_ws) moe_ws = b;
    }
    /* the attention's split records: attn_plain's or attn.cu's rows kernel (f32 KV) */
    size_t attn_ws = cu_attn_plain_workspace_bytes((int)hp->n_head, (int)hp->head_dim, kc->n_ctx);
    if (cu_attn_rows_workspace_bytes((int)hp->n_head, (int)hp->head_dim, kc->n_ctx) > attn_ws)
        attn_ws = cu_attn_rows_workspace_bytes((int)hp->n_head, (int)hp->head_dim, kc->n_ctx);
    struct {
        void **p;
        size_t bytes;
    } bufs[] = {
        {(void **)&c->x, (size_t)T * E * 4},
        {(void **)&c->xn, (size_t)T * E * 4},
        {(void **)&c->tmp, (size_t)T * E * 4},
        {(void **)&c->q, T * NQ * 4},
        {(void **)&c->k, T * NK * 4},
        {(void **)&c->v, T * NK * 4},
        {(void **)&c->qkv1, (NQ + 2 * NK) * 4},
        {(void **)&c->att, T * NQ * 4},
        {(void **)&c->rlogit, (size_t)T * hp->n_expert * 4},
        {(void **)&c->selw, P * 4},
        {(void **)&c->sel, P * 4},
        {(void **)&c->moe, (size_t)T * E * 4},
        {(void **)&c->g, (size_t)T * F * 4},
        {(void **)&c->u, (size_t)T * F * 4},
        {(void **)&c->y, P * E * 4},
        {(void **)&c->h, P * hp->n_ff_exp * 4},
        {(void **)&c->shg, (size_t)T * 4},
        {(void **)&c->xo, (size_t)T * E * 4},
        {(void **)&c->logits, (size_t)T * hp->n_vocab * 4},
        {(void **)&c->d_in, ((size_t)IN_BT * T + (size_t)T * c->max_bt) * 4},
        {(void **)&c->d_pair_idx, P * 4},
        {(void **)&c->d_groups, P * sizeof(struct moe_group)},
        {(void **)&c->acts[0], T * c->act_stride},
        {(void **)&c->acts[1], T * c->act_stride},
        {(void **)&c->acts[2], T * c->act_stride},
        {(void **)&c->moe_ws, moe_ws},
        {(void **)&c->d_ng, (size_t)hp->n_layer * 4},
        {(void **)&c->attn_ws, attn_ws},
        {&c->row_sync, cu_row_sync_bytes(T)},
    };
    const size_t n_bufs = sizeof bufs / sizeof bufs[0];
    for (size_t i = 0; i < n_bufs; i++) /* cudaMalloc rounds each to 256 bytes or more */
        c->scratch_bytes += (bufs[i].bytes + 255) & ~(size_t)255;
    size_t vfree = 0, vtotal = 0;
    if ((rv = ck(cudaMemGetInfo(&vfree, &vtotal), "cudaMemGetInfo"))) goto fail;
    const uint64_t reserve =
        (uint64_t)(o->vram_reserve_mib ? o->vram_reserve_mib : VRAM_RESERVE_MIB) << 20;
    uint64_t need = dense + c->kv_bytes + c->expert_bytes + c->scratch_bytes;
    uint64_t avail = vfree > reserve ? vfree - reserve : 0;
    if (o->vram_mib && ((uint64_t)o->vram_mib << 20) < avail) avail = (uint64_t)o->vram_mib << 20;
    c->budget = avail;
    /* STRATA_CUDA_HYBRID=1: the hybrid's path even with every expert in a slot (tests: its hits
     * against the all-resident path) */
    const char *force = getenv("STRATA_CUDA_HYBRID");
    c->force_hybrid = force && atoi(force) != 0;
    /* The expert cache: every expert resident when --expert-cache asks for all (or auto and they
     * fit); otherwise the hybrid takes the slots there are and the CPU computes the rest. */
    c->n_slots = o->expert_cache.kind == CACHE_AUTO && need <= avail
                     ? n_total
                     : cache_spec_slots(&o->expert_cache, slot_bytes, n_total, n_total);
    const bool want_hybrid = (o->expert_cache.kind == CACHE_AUTO && need > avail) ||
                             c->n_slots < n_total || c->force_hybrid;
    /* With the hybrid, K/V starts at one granule a region and grows on demand inside the same
     * budget as the slots (STRATA_KV_GROW=0: the whole pool at start, as without the hybrid) */
    const char *kg = getenv("STRATA_KV_GROW");
    if (want_hybrid && !(kg && strcmp(kg, "0") == 0)) {
        const uint64_t block_bytes = (uint64_t)kc->block_tokens * kc->k_dim * elem;
        rv = kv_vram_open(c->dev, 2 * hp->n_layer, block_bytes, c->pool_blocks, 1, &c->kvv);
        if (rv) {
            /* no virtual memory management here (or the driver refuses a mapping): the pool
             * as without the hybrid */
            LOG_WARN("cuda: %s: the K/V pool is allocated whole at start", strata_errdetail());
            c->kvv = NULL;
            rv = 0;
        } else {
            c->kv_layer_bytes = kv_vram_stride(c->kvv);
            c->kv_bytes = kv_vram_bytes(c->kvv);
        }
    }
    if (o->expert_cache.kind == CACHE_AUTO && want_hybrid) {
        const uint64_t fixed = dense + c->kv_bytes + c->scratch_bytes + hyb_device_bytes(m, T);
        const struct hyb_budget bud = {.vram_free = avail + reserve,
                                       .reserve = reserve,
                                       .fixed = fixed,
                                       .slot_bytes = slot_bytes,
                                       .n_total = n_total,
                                       .chunk_slots = HYB_CHUNK_SLOTS};
        c->n_slots = hyb_auto_slots(&bud);
    }
    c->fixed = dense + c->scratch_bytes;
    if (want_hybrid) {
        const uint32_t nch = (c->n_slots + HYB_CHUNK_SLOTS - 1) / HYB_CHUNK_SLOTS;
        c->expert_bytes = nch * hyb_chunk_bytes(slot_bytes, HYB_CHUNK_SLOTS);
        c->fixed += hyb_device_bytes(m, T);
        need = c->fixed + c->kv_bytes + c->expert_bytes;
        LOG_INFO("cuda: expert cache of %u of %u experts in VRAM (%.2f GiB), the rest computed "
                 "on the CPU from host memory; K/V %s",
                 c->n_slots, n_total, gib(c->expert_bytes),
                 c->kvv ? "grows on demand, taking slots back when the budget is full"
                        : "allocated whole");
    }
    LOG_INFO("cuda: %s, %.1f GiB free of %.1f: weights %.2f GiB, KV %.2f GiB (%u blocks of %u "
             "positions, %s), experts %.2f GiB (%u x %u experts, slots of %.2f MiB), scratch "
             "%.2f GiB for %u tokens a pass; %.2f GiB left after the %.0f MiB reserve",
             c->device, gib(vfree), gib(vtotal), gib(dense), gib(c->kv_bytes), c->pool_blocks,
             kc->block_tokens, kv_type_name(o->kv_type), gib(c->expert_bytes), hp->n_layer,
             hp->n_expert, (double)slot_bytes / (1 << 20), gib(c->scratch_bytes), T,
             need <= avail ? gib(avail - need) : 0.0, (double)reserve / (1 << 20));
    if (need > avail) {
        rv = strata_errf(STRATA_ENOSPC,
                         "the CUDA backend needs %.2f GiB of VRAM (weights %.2f, KV %.2f, experts "
                         "%.2f, scratch %.2f) and %s has %.2f GiB free after the %.0f MiB "
                         "reserve: lower --ctx or --seqs (KV), give a smaller --expert-cache (or "
                         "auto: the experts that do not fit are computed on the CPU), pass a "
                         "smaller --vram-reserve-mib, or use --backend cpu",
                         gib(need), gib(dense), gib(c->kv_bytes), gib(c->expert_bytes),
                         gib(c->scratch_bytes), c->device, gib(avail), (double)reserve / (1 << 20));
        goto fail;
    }
    /* ---- uploads ---- */
    if ((rv = upload_mat(c, &m->token_embd, &c->embd))) goto fail;
    if (m->output.data == m->token_embd.data)
        c->output = c->embd;
    else if ((rv = upload_mat(c, &m->output, &c->output)))
        goto fail;
    if ((rv = upload_vec(c, m->output_norm, E, &c->output_norm))) goto fail;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        struct dlayer *D = &c->L[l];
        const size_t qn = hp->qk_norm == MODEL_QK_NORM_FULL ? NQ : hp->head_dim,
                     kn = hp->qk_norm == MODEL_QK_NORM_FULL ? NK : hp->head_dim;
        if ((rv = upload_vec(c, L->attn_norm, E, &D->attn_norm)) ||
            (rv = upload_vec(c, L->ffn_norm, E, &D->ffn_norm)) ||
            (rv = upload_vec(c, L->q_norm, qn, &D->q_norm)) ||
            (rv = upload_vec(c, L->k_norm, kn, &D->k_norm)) ||
            (rv = upload_vec(c, L->bq, NQ, &D->bq)) || (rv = upload_vec(c, L->bk, NK, &D->bk)) ||
            (rv = upload_vec(c, L->bv, NK, &D->bv)) || (rv = upload_qkv(c, L, D)) ||
            (rv = upload_mat(c, &L->wo, &D->wo)) || (rv = upload_mat(c, &L->router, &D->router)) ||
            (rv = upload_mat(c, &L->gate_shexp, &D->gate_sh)) ||
            (rv = upload_mat(c, &L->up_shexp, &D->up_sh)) ||
            (rv = upload_mat(c, &L->down_shexp, &D->down_sh)) ||
            (rv = upload_mat(c, &L->gate_inp_shexp, &D->gate_inp_sh)))
            goto fail;
    }
    const bool hybrid = want_hybrid;
    if (!hybrid && (rv = upload_experts(c, slot_bytes))) goto fail;
    if (c->kvv)
        c->kv_pool = kv_vram_base(c->kvv);
    else if ((rv = dalloc(c, c->kv_bytes, (void **)&c->kv_pool)))
        goto fail;
    for (size_t i = 0; i < n_bufs; i++)
        if ((rv = dalloc(c, bufs[i].bytes, bufs[i].p))) goto fail;
    const char *sp = getenv("STRATA_CUDA_SPLIT");
    if ((rv = ck(cudaMemset(c->row_sync, 0, cu_row_sync_bytes(T)), "row sync"))) goto fail;
    if (sp && strcmp(sp, "0") == 0) c->row_sync = NULL;
    if (hybrid) {
        if (!(c->parts = malloc(hp->n_layer * sizeof *c->parts)) ||
            !(c->chunk_of = malloc(T * sizeof *c->chunk_of))) {
            rv = strata_errf(STRATA_ENOMEM, "out of memory for the hybrid's tables");
            goto fail;
        }
        for (uint32_t l = 0; l < hp->n_layer; l++)
            c->parts[l] = c->L[l].parts;
        if ((rv = hyb_start(m, o, c->parts, c->s, c->n_slots, slot_bytes, reserve, &c->hyb)))
            goto fail;
    }
    /* the attention's merge counters start at zero (its calls leave them so) */
    if ((rv = ck(cudaMemset(c->attn_ws, 0, attn_ws ? attn_ws : 1), "cudaMemset"))) goto fail;
    if ((rv = ck(cudaMallocHost((void **)&c->h_in, ((size_t)IN_BT * T + (size_t)T * c->max_bt) * 4),
                 "cudaMallocHost")) ||
        (rv = ck(cudaMallocHost((void **)&c->h_sel, P * 4), "cudaMallocHost")) ||
        (rv = ck(cudaMallocHost((void **)&c->h_pair_idx, P * 4), "cudaMallocHost")) ||
        (rv = ck(cudaMallocHost((void **)&c->h_ng, (size_t)hp->n_layer * 4), "cudaMallocHost")) ||
        (rv = ck(cudaMallocHost((void **)&c->h_groups, P * sizeof(struct moe_group)),
                 "cudaMallocHost")))
        goto fail;
    for (uint32_t i = 0; c->timing && i < MAX_MARKS; i++)
        if ((rv = ck(cudaEventCreate(&c->ev[i]), "cudaEventCreate"))) goto fail;
    if (!(c->pos = malloc(T * sizeof *c->pos)) || !(c->rtok = malloc(T * sizeof *c->rtok)) ||
        !(c->seen_len = malloc(T * sizeof *c->seen_len)) ||
        !(c->seen = malloc(T * sizeof *c->seen))) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for a batch of %u tokens", T);
        goto fail;
    }
    *out = c;
    return 0;
fail:
    cuda_close(c);
    return rv;
}

static void cuda_close(void *impl)
{
    struct cuda_be *c = impl;
    if (!c) return;
    cudaSetDevice(c->dev);
    if (c->s) cudaStreamSynchronize(c->s);
    hyb_close(c->hyb);
    kv_vram_close(c->kvv);
    free(c->parts);
    free(c->chunk_of);
    for (uint32_t i = 0; i < c->n_allocs; i++)
        cudaFree(c->allocs[i]);
    cudaFreeHost(c->h_in);
    cudaFreeHost(c->h_sel);
    cudaFreeHost(c->h_pair_idx);
    cudaFreeHost(c->h_groups);
    cudaFreeHost(c->h_ng);
    for (uint32_t i = 0; i <= GRAPH_MAX_TOKENS; i++)
        if (c->graph[i].exec) cudaGraphExecDestroy(c->graph[i].exec);
    for (uint32_t i = 0; i < MAX_MARKS; i++)
        if (c->ev[i]) cudaEventDestroy(c->ev[i]);
    if (c->s) cudaStreamDestroy(c->s);
    free(c->allocs);
    free(c->L);
    free(c->pos);
    free(c->rtok);
    free(c->seen_len);
    free(c->seen);
    free(c);
}

/* ---- a pass --------------------------------------------------------------------------------- */

/* mark ends the pass's current phase here and starts phase ph (STRATA_DECODE_TIMING: an event
 * on the stream; the time between two events goes to the phase the first one began). */
static void mark(struct cuda_be *c, enum phase ph)
{
    if (!c->timing || c->n_ev == MAX_MARKS) return;
    if (c->n_ev && c->ev_phase[c->n_ev - 1] == ph) return;
    cudaEventRecord(c->ev[c->n_ev], c->s);
    c->ev_phase[c->n_ev++] = (uint8_t)ph;
}

/* timing_done adds a synchronized pass's phase times to the stats. */
static void timing_done(struct cuda_be *c)
{
    double *to[PH_COUNT] = {&c->st.attention_s, &c->st.dense_s, &c->st.experts_s, &c->st.output_s};
    for (uint32_t i = 0; i + 1 < c->n_ev; i++) {
        float ms = 0;
        if (c->ev_phase[i] >= PH_COUNT) continue;
        if (cudaEventElapsedTime(&ms, c->ev[i], c->ev[i + 1]) == cudaSuccess)
            *to[c->ev_phase[i]] += 1e-3 * ms;
    }
    c->n_ev = 0;
}

/* mm: y (n rows of w->n_out floats) = W . x (n rows of w->n_in floats), in launches of up to 16
 * tokens over activations quantized once into acts (T * act_stride bytes). prev: a matrix of
 * the same type and width whose activations of this x acts already holds (not made again), or
 * NULL. Float weights take x itself. */
static int mm(struct cuda_be *c, const struct dmat *w, const float *x, uint32_t n, float *y,
              uint8_t *acts, const struct dmat *prev)
{
    const size_t arb = cu_act_row_bytes(w->type, w->n_in);
    const bool is_float = qtype_get(w->type)->blck == 1;
    const void *a = is_float ? (const void *)x : acts;
    int rv;
    if (!is_float && !prev && (rv = cu_quantize_acts(w->type, x, w->n_in, (int)n, acts, c->s)))
        return rv;
    if (!is_float && n > MM_ROWS && !c->matvec_chunks) {
        /* a prompt chunk: one int8 tensor-core launch, the same bits as the 16-row matvecs */
        if ((rv = cu_matmul_q(w->type, w->d, w->n_in, w->n_out, acts, n, y, c->s))) return rv;
        c->st.weight_bytes += w->n_out * w->row_bytes;
        return 0;
    }
    for (uint32_t i = 0; i < n; i += MM_ROWS) {
        const uint32_t r = n - i < MM_ROWS ? n - i : MM_ROWS;
        if ((rv = cu_matvec(w->type, w->d, w->n_in, w->n_out, (const uint8_t *)a + i * arb, (int)r,
                            y + (size_t)i * w->n_out, c->s)))
            return rv;
        c->st.weight_bytes += w->n_out * w->row_bytes;
    }
    return 0;
}

static int attention(struct cuda_be *c, uint32_t n, uint32_t il, uint32_t bt_stride)
{
    const struct model_hparams *hp = &c->m->hp;
    const struct dlayer *D = &c->L[il];
    const int32_t T = (int32_t)c->o.max_pass_tokens;
    const int32_t *d_pos = c->d_in + IN_POS * T, *d_slot = c->d_in + IN_SLOT * T,
                  *d_qseq = c->d_in + IN_QSEQ * T, *d_kvlen = c->d_in + IN_KVLEN * T,
                  *d_bt = c->d_in + IN_BT * T;
    const size_t E = hp->n_embd, NQ = (size_t)hp->n_head * hp->head_dim,
                 NK = (size_t)hp->n_head_kv * hp->head_dim;
    const bool f16 = c->o.kv_type == KV_F16;
    uint8_t *kp = c->kv_pool + 2 * il * c->kv_layer_bytes, *vp = kp + c->kv_layer_bytes;
    int rv;
    mark(c, PH_ATTN);
    if (!c->xn_ready && (rv = cu_rmsnorm(c->x, D->attn_norm, c->xn, n, E, hp->rms_eps, c->s)))
        return rv;
    c->xn_ready = false;
    /* the previous layer's combine quantized xn for wq (q/k/v) in its launch */
    const bool q_ready = c->xn_q;
    c->xn_q = false;
    mark(c, PH_DENSE);
    float *q = c->q, *k = c->k, *v = c->v;
    if (n == 1 && D->n_cat) {
        /* one token: q, k (and v) rows in one launch, the same row dots */
        q = c->qkv1, k = q + NQ;
        if ((rv = mm(c, &D->qkv, c->xn, 1, q, c->acts[0], q_ready ? &D->qkv : NULL))) return rv;
        /* v of another type quantizes alike (Q4_K and Q6_K: Q8_K): q's activations serve it */
        const bool va = qtype_get(D->wv.type)->blck > 1 &&
                        quant_act_type(D->wv.type) == quant_act_type(D->qkv.type);
        if (D->n_cat == 3)
            v = k + NK;
        else if ((rv = mm(c, &D->wv, c->xn, 1, v, va ? c->acts[0] : c->acts[1],
                          va ? &D->qkv : NULL)))
            return rv;
    } else {
        if ((rv = mm(c, &D->wq, c->xn, n, q, c->acts[0], q_ready ? &D->wq : NULL))) return rv;
        /* k and v reuse q's activations when they quantize alike (acts[0] is still x's) */
        const bool kq = D->wk.type == D->wq.type, vq = D->wv.type == D->wq.type,
                   vk = D->wv.type == D->wk.type;
        if ((rv = mm(c, &D->wk, c->xn, n, k, kq ? c->acts[0] : c->acts[1], kq ? &D->wq : NULL)) ||
            (rv = mm(c, &D->wv, c->xn, n, v,
                     vq          ? c->acts[0]
                     : vk && !kq ? c->acts[1]
                                 : c->acts[2],
                     vq          ? &D->wq
                     : vk && !kq ? &D->wk
                                 : NULL)))
            return rv;
    }
    mark(c, PH_ATTN);
    if (D->bq &&
        ((rv = cu_add_rows(q, D->bq, n, NQ, c->s)) || (rv = cu_add_rows(k, D->bk, n, NK, c->s)) ||
         (rv = cu_add_rows(v, D->bv, n, NK, c->s))))
        return rv;
    if (hp->qk_norm == MODEL_QK_NORM_FULL &&
        ((rv = cu_rmsnorm(q, D->q_norm, q, n, NQ, hp->rms_eps, c->s)) ||
         (rv = cu_rmsnorm(k, D->k_norm, k, n, NK, hp->rms_eps, c->s))))
        return rv;
    const int neox = hp->rope == MODEL_ROPE_NEOX;
    const bool head_norm = hp->qk_norm == MODEL_QK_NORM_HEAD;
    if (!c->unfused) { /* per-head norms, RoPE and the K/V store in one launch */
        if ((rv = cu_qk_rope_store(q, k, v, head_norm ? D->q_norm : NULL,
                                   head_norm ? D->k_norm : NULL, d_pos, d_slot, n, hp->n_head,
                                   hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_theta, neox,
                                   hp->rms_eps, f16, c->block_tokens, kp, vp, c->s)))
            return rv;
    } else if ((head_norm && ((rv = cu_rmsnorm(q, D->q_norm, q, (int64_t)n * hp->n_head,
                                               hp->head_dim, hp->rms_eps, c->s)) ||
                              (rv = cu_rmsnorm(k, D->k_norm, k, (int64_t)n * hp->n_head_kv,
                                               hp->head_dim, hp->rms_eps, c->s)))) ||
               (rv = cu_rope(q, d_pos, n, hp->n_head, hp->head_dim, hp->n_rot, hp->rope_theta, neox,
                             c->s)) ||
               (rv = cu_rope(k, d_pos, n, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_theta,
                             neox, c->s)) ||
               (rv = cu_kv_store(k, v, d_slot, n, hp->n_head_kv, hp->head_dim, c->block_tokens, f16,
                                 kp, vp, c->s))) {
        return rv;
    }
    /* every token's K/V of the layer is stored before any attends (a chunk sees itself causally);
     * a row's splits come from its own length, so its sums never depend on the batch */
    if ((f16 || c->attn_plain_f32) && n >= CU_ATTN_TILES_MIN_ROWS &&
        cu_attn_tiles_ok((int)hp->n_head, (int)hp->n_head_kv, (int)hp->head_dim, f16)) {
        /* a prompt chunk: attn_plain's bits, each chunk of keys read once for a tile of rows */
        rv = cu_attention_tiles(q, n, hp->n_head, kp, vp, f16, c->block_tokens, hp->n_head_kv,
                                hp->head_dim, d_bt, bt_stride, d_qseq, d_kvlen, c->att, c->s);
    } else if (f16 || c->attn_plain_f32) {
        for (uint32_t i = 0; !rv && i < n; i += CU_ATTN_MAX_ROWS) {
            const uint32_t r = n - i < CU_ATTN_MAX_ROWS ? n - i : CU_ATTN_MAX_ROWS;
            rv =
                cu_attention_plain(q + i * NQ, r, hp->n_head, kp, vp, f16, c->block_tokens,
                                   hp->n_head_kv, hp->head_dim, d_bt, bt_stride, d_qseq + i,
                                   d_kvlen + i, c->attn_max_len, c->attn_ws, c->att + i * NQ, c->s);
        }
    } else {
        const struct cu_kv kv = {(const float *)kp, (const float *)vp, (int)c->block_tokens,
                                 (int)hp->n_head_kv, (int)hp->head_dim};
        for (uint32_t i = 0; !rv && i < n; i += CU_ATTN_ROWS_MAX) {
            const uint32_t r = n - i < CU_ATTN_ROWS_MAX ? n - i : CU_ATTN_ROWS_MAX;
            rv = cu_attention_rows(q + i * NQ, r, hp->n_head, &kv, d_bt, bt_stride, d_qseq + i,
                                   d_kvlen + i, c->attn_max_len, c->attn_ws, c->att + i * NQ, c->s);
        }
    }
    if (rv) return rv;
    mark(c, PH_DENSE);
    if ((rv = mm(c, &D->wo, c->att, n, c->tmp, c->acts[0], NULL))) return rv;
    if (c->unfused) return cu_add(c->x, c->tmp, (int64_t)n * E, c->s);
    /* the residual add and the MoE step's norm in one launch (the same bits); with the experts
     * grouped on the device, the normed rows quantized for their gate in it too */
    c->xn_ready = true;
    const uint32_t tg = D->parts.type[CU_PART_GATE];
    if (c->dev_grouped && E >= CU_ROW_NORM_MIN && qtype_get(tg)->blck > 1 &&
        quant_act_type(D->parts.type[CU_PART_UP]) == quant_act_type(tg) &&
        cu_act_row_bytes(tg, E) <= c->act_stride) {
        c->xn_moe_q = true;
        return cu_add_rmsnorm_q(c->x, c->tmp, D->ffn_norm, c->xn, n, E, hp->rms_eps, tg, c->acts[1],
                                c->row_sync, c->s);
    }
    return cu_add_rmsnorm(c->x, c->tmp, D->ffn_norm, c->xn, n, E, hp->rms_eps, c->s);
}

/* report_routes calls the route hook once per expert with its tokens, ascending (an expert with
 * more than CU_MOE_MAX_PAIRS pairs spans consecutive groups). */
static void report_routes(struct cuda_be *c, uint32_t il, int ng)
{
    const uint32_t K = c->m->hp.n_expert_used;
    for (int g = 0; g < ng;) {
        const int32_t e = c->h_groups[g].expert;
        uint32_t nt = 0;
        for (; g < ng && c->h_groups[g].expert == e; g++)
            for (int32_t i = 0; i < c->h_groups[g].count; i++)
                c->rtok[nt++] = (uint32_t)c->h_pair_idx[c->h_groups[g].first + i] / K;
        c->route(c->route_ctx, il, (uint32_t)e, c->rtok, nt);
    }
}

static int moe_hybrid(struct cuda_be *c, uint32_t n, uint32_t il);

/* moe_host_groups: the router's picks grouped on the host (moe_group), where the route hook sees
 * them: one stream sync. The groups go back up for cu_moe_ffn. */
static int moe_host_groups(struct cuda_be *c, uint32_t n, uint32_t il)
{
    const struct model_hparams *hp = &c->m->hp;
    const struct dlayer *D = &c->L[il];
    const int K = (int)hp->n_expert_used;
    int rv;
    if ((rv = ck(cudaMemcpyAsync(c->h_sel, c->sel, (size_t)n * K * 4, cudaMemcpyDeviceToHost, c->s),
                 "routes down")) ||
        (rv = ck(cudaStreamSynchronize(c->s), "router")))
        return rv;
    const int ng =
        moe_group(c->h_sel, n, K, hp->n_expert, NULL, CU_MOE_MAX_PAIRS, c->h_groups, c->h_pair_idx);
    if (c->route) report_routes(c, il, ng);
    if ((rv = ck(cudaMemcpyAsync(c->d_groups, c->h_groups, (size_t)ng * sizeof *c->h_groups,
                                 cudaMemcpyHostToDevice, c->s),
                 "groups up")) ||
        (rv = ck(cudaMemcpyAsync(c->d_pair_idx, c->h_pair_idx, (size_t)n * K * 4,
                                 cudaMemcpyHostToDevice, c->s),
                 "pairs up")) ||
        (rv = cu_moe_ffn(&D->parts, D->slots, c->d_groups, ng, c->d_pair_idx, c->selw, n, K, c->xn,
                         c->h, c->moe_ws, c->y, c->s)))
        return rv;
    c->st.weight_bytes += (uint64_t)ng * D->group_bytes;
    return 0;
}

/* moe_dev_groups: the same groups made on the device (cu_moe_group), the count left in d_ng for
 * cu_moe_ffn_dev's fixed grid: no host round trip (the weight bytes are counted after the pass). */
static int moe_dev_groups(struct cuda_be *c, uint32_t n, uint32_t il, bool grouped)
{
    const struct model_hparams *hp = &c->m->hp;
    const struct dlayer *D = &c->L[il];
    const int K = (int)hp->n_expert_used;
    /* a prompt chunk's groups (up to 32 pairs) on the int8 tensor cores, the same bits */
    const bool mma = !grouped && !c->unfused && !c->matvec_chunks && cu_moe_mma_ok(&D->parts);
    const uint32_t mp = mma ? CU_MOE_MMA_PAIRS : CU_MOE_MAX_PAIRS;
    const int64_t max_groups = cu_moe_max_groups((int64_t)n * K, hp->n_expert, mp);
    int rv;
    if ((!grouped && (rv = cu_moe_group(c->sel, n, K, hp->n_expert, NULL, mp, c->d_groups,
                                        c->d_pair_idx, c->d_ng + il, c->s))) ||
        (rv = cu_moe_ffn_dev(&D->parts, D->slots, c->d_groups, c->d_ng + il, (int)max_groups,
                             c->d_pair_idx, c->selw, n, K,
                             c->xn_moe_q ? (const float *)c->acts[1] : c->xn, c->h, c->moe_ws, c->y,
                             CU_MOE_EVERY_PAIR | (c->unfused ? CU_MOE_UNFUSED : 0) |
                                 (c->xn_moe_q ? CU_MOE_X_QUANTIZED : 0) | (mma ? CU_MOE_MMA : 0),
                             c->s)))
        return rv;
    c->xn_moe_q = false;
    return 0;
}

static int moe(struct cuda_be *c, uint32_t n, uint32_t il)
{
    const struct model_hparams *hp = &c->m->hp;
    const struct dlayer *D = &c->L[il];
    const size_t E = hp->n_embd;
    const int K = (int)hp->n_expert_used;
    int rv;
    mark(c, PH_ATTN);
    if (!c->xn_ready && (rv = cu_rmsnorm(c->x, D->ffn_norm, c->xn, n, E, hp->rms_eps, c->s)))
        return rv;
    c->xn_ready = false;
    mark(c, PH_DENSE);
    if ((rv = mm(c, &D->router, c->xn, n, c->rlogit, c->acts[0], NULL))) return rv;
    const bool topk_first = hp->gating == MODEL_GATING_TOPK_SOFTMAX;
    const enum cu_router_mode mode = topk_first ? CU_ROUTER_TOPK_SOFTMAX : CU_ROUTER_SOFTMAX_TOPK;
    /* a decode step's few tokens: the picks and their groups in one launch */
    const bool route_group = c->dev_grouped && !c->unfused && n <= CU_ROUTE_GROUP_MAX_TOKENS;
    if (route_group
            ? (rv = cu_router_group(
                   c->rlogit, n, (int)hp->n_expert, K, mode, !topk_first && hp->norm_topk, c->sel,
                   c->selw, NULL, CU_MOE_MAX_PAIRS, c->d_groups, c->d_pair_idx, c->d_ng + il, c->s))
            : (rv = cu_router_topk(c->rlogit, n, (int)hp->n_expert, K, mode,
                                   !topk_first && hp->norm_topk, c->sel, c->selw, c->s)))
        return rv;
    if (c->hyb) return moe_hybrid(c, n, il); /* not every expert resident */
    mark(c, PH_EXPERTS);
    if ((rv = c->dev_grouped ? moe_dev_groups(c, n, il, route_group) : moe_host_groups(c, n, il)))
        return rv;
    /* no shared expert: the combine adds into the residual itself and norms the row for the next
     * step, the next layer's attention or the output (the same bits as the separate launches) */
    if (!hp->n_ff_shexp && !c->unfused && E >= CU_ROW_NORM_MIN) {
        const float *next = il + 1 < hp->n_layer ? c->L[il + 1].attn_norm : c->output_norm;
        c->xn_ready = true;
        /* the next layer's q/k/v activations made in the same launch */
        const uint32_t tq = il + 1 < hp->n_layer ? c->L[il + 1].wq.type : QT_F32;
        const uint32_t aq = quant_act_type(tq);
        if (il + 1 < hp->n_layer && (aq == QT_Q8_0 || aq == QT_Q8_K)) {
            c->xn_q = true;
            return cu_moe_combine_add_norm_q(c->y, c->sel, n, K, E, c->x, next, hp->rms_eps, c->xn,
                                             tq, c->acts[0], c->row_sync, c->s);
        }
        return cu_moe_combine_add_norm(c->y, c->sel, n, K, E, c->x, next, hp->rms_eps, c->xn,
                                       c->row_sync, c->s);
    }
    if (!hp->n_ff_shexp && !c->unfused)
        return cu_moe_combine_add(c->y, c->sel, n, K, E, c->x, c->s);
    if ((rv = cu_moe_combine(c->y, c->sel, n, K, E, c->moe, c->s))) return rv;
    if (hp->n_ff_shexp) {
        const size_t F = D->gate_sh.n_out;
        const bool uq = D->up_sh.type == D->gate_sh.type;
        mark(c, PH_DENSE);
        if ((rv = mm(c, &D->gate_sh, c->xn, n, c->g, c->acts[0], NULL)) ||
            (rv = mm(c, &D->up_sh, c->xn, n, c->u, uq ? c->acts[0] : c->acts[1],
                     uq ? &D->gate_sh : NULL)) ||
            (rv = mm(c, &D->gate_inp_sh, c->xn, n, c->shg, c->acts[2], NULL)) ||
            (rv = cu_swiglu(c->g, c->u, c->g, (int64_t)n * F, c->s)) ||
            (rv = mm(c, &D->down_sh, c->g, n, c->y, c->acts[0], NULL)) ||
            (rv = cu_gate_add(c->moe, c->y, c->shg, n, E, c->s)))
            return rv;
    }
    mark(c, PH_EXPERTS);
    return cu_add(c->x, c->moe, (int64_t)n * E, c->s);
}

/* ---- the hybrid's MoE step (hybrid_cuda.h) ------------------------------------------------- */

/* shared_expert: the shared expert's (qwen2moe) output before its gate, into out (n rows of
 * n_embd), and its gate logit into shg: moe()'s own steps, on another output buffer. */
static int shared_expert(struct cuda_be *c, uint32_t n, uint32_t il, float *out)
{
    const struct dlayer *D = &c->L[il];
    const size_t F = D->gate_sh.n_out;
    const bool uq = D->up_sh.type == D->gate_sh.type;
    int rv;
    if ((rv = mm(c, &D->gate_sh, c->xn, n, c->g, c->acts[0], NULL)) ||
        (rv = mm(c, &D->up_sh, c->xn, n, c->u, uq ? c->acts[0] : c->acts[1],
                 uq ? &D->gate_sh : NULL)) ||
        (rv = mm(c, &D->gate_inp_sh, c->xn, n, c->shg, c->acts[2], NULL)) ||
        (rv = cu_swiglu(c->g, c->u, c->g, (int64_t)n * F, c->s)) ||
        (rv = mm(c, &D->down_sh, c->g, n, out, c->acts[0], NULL)))
        return rv;
    return 0;
}

/* hybrid_pass tells the hybrid which tokens of the pass are a prompt chunk's: those of a sequence
 * with several tokens in the pass (the inputs' sequence indices, h_in's IN_QSEQ row). */
static void hybrid_pass(struct cuda_be *c, uint32_t n)
{
    const int32_t *qseq = c->h_in + IN_QSEQ * c->o.max_pass_tokens;
    for (uint32_t t = 0; t < n; t++) {
        uint32_t many = 0;
        for (uint32_t u = 0; u < n && many < 2; u++)
            many += qseq[u] == qseq[t];
        c->chunk_of[t] = many > 1 ? (uint32_t)qseq[t] : UINT32_MAX;
    }
    hyb_pass(c->hyb, c->chunk_of, n);
}

/* moe_hybrid: layer il's routed step when not every expert is resident, from the router's picks
 * on the device: they come down with the CPU's inputs (one stream sync), the hits are queued on
 * the GPU with the shared expert behind them, the CPU computes the misses meanwhile, then the
 * combine, the shared expert's gated add and the residual. */
static int moe_hybrid(struct cuda_be *c, uint32_t n, uint32_t il)
{
    const struct model_hparams *hp = &c->m->hp;
    const size_t E = hp->n_embd;
    const int K = (int)hp->n_expert_used;
    const struct hyb_io io = {c->s, c->xn, c->sel, c->selw, c->h, c->moe_ws, c->y, c->moe};
    int rv;
    if (il == 0) hybrid_pass(c, n);
    if ((rv = ck(cudaMemcpyAsync(c->h_sel, c->sel, (size_t)n * K * 4, cudaMemcpyDeviceToHost, c->s),
                 "routes down")) ||
        (rv = hyb_stage(c->hyb, &io, n)) || (rv = ck(cudaStreamSynchronize(c->s), "router")) ||
        (rv = hyb_moe_start(c->hyb, &io, il, n, c->h_sel, c->route, c->route_ctx, &c->st)))
        return rv;
    /* tmp is free until the next layer's attention */
    if (hp->n_ff_shexp && (rv = shared_expert(c, n, il, c->tmp))) return rv;
    if ((rv = hyb_moe_finish(c->hyb, &io, il, n, &c->st))) return rv;
    if (hp->n_ff_shexp && (rv = cu_gate_add(c->moe, c->tmp, c->shg, n, E, c->s))) return rv;
    return cu_add(c->x, c->moe, (int64_t)n * E, c->s);
}

static uint64_t kv_vram_bytes_of(const struct cuda_be *c)
{
    return c->kvv ? kv_vram_bytes(c->kvv) : c->kv_bytes;
}

/* vram_held: the VRAM the backend holds now, K/V and slots included */
static uint64_t vram_held(const struct cuda_be *c)
{
    return c->fixed + (c->kvv ? kv_vram_bytes(c->kvv) : c->kv_bytes) +
           (c->hyb ? hyb_vram_bytes(c->hyb) : c->expert_bytes);
}

/* kv_need: K/V storage for block ids below `blocks`: mapped now if it is not, inside the budget;
 * when the budget is full the expert cache gives back whole chunks of slots first, through its
 * fence (the round in flight lands, the slots leave the table, which is republished, the windows
 * that read the old one finish, then the memory is freed) */
static int kv_need(struct cuda_be *c, uint32_t blocks)
{
    const uint64_t grow = kv_vram_grow_bytes(c->kvv, blocks);
    if (!grow) return 0;
    uint64_t shortfall = 0;
    const uint32_t slots = c->hyb ? hyb_slots(c->hyb) : 0;
    const uint32_t keep = hyb_kv_take(c->budget, vram_held(c), grow, slots, c->slot_bytes,
                                      HYB_CHUNK_SLOTS, &shortfall);
    if (shortfall)
        return strata_errf(STRATA_ENOSPC,
                           "K/V needs %.2f GiB more VRAM and the %.2f GiB budget has no room with "
                           "every expert slot given back: lower --ctx or --max-seqs, or raise "
                           "--vram-mib",
                           gib(grow), gib(c->budget));
    int rv;
    if (keep < slots) {
        if ((rv = hyb_resize(c->hyb, (uint64_t)keep * c->slot_bytes))) return rv;
        c->kv_took += slots - keep;
        LOG_INFO("cuda: K/V grows by %.2f GiB for %u blocks: the expert cache gives back %u slots "
                 "(%u left)",
                 gib(grow), blocks, slots - keep, keep);
    }
    if ((rv = kv_vram_grow(c->kvv, blocks))) return rv;
    c->kv_bytes = kv_vram_bytes(c->kvv);
    c->kv_grows++;
    return 0;
}

/* grow assigns positions and grows each sequence of the batch; on error it restores them all.
 * K/V storage covers every block id handed out: the whole pool, or mapped on demand (kv_need). */
static int grow(struct cuda_be *c, const struct backend_token *toks, uint32_t n, uint32_t *n_seen)
{
    int rv = 0;
    *n_seen = 0;
    /* O(n * sequences): a batch holds at most a few hundred sequences. */
    for (uint32_t t = 0; t < n; t++) {
        uint32_t s = 0;
        while (s < *n_seen && c->seen[s] != toks[t].seq)
            s++;
        if (s == *n_seen) {
            c->seen[*n_seen] = toks[t].seq;
            c->seen_len[(*n_seen)++] = toks[t].seq->n_tokens;
        }
        c->h_in[IN_QSEQ * c->o.max_pass_tokens + t] = (int32_t)s;
        c->pos[t] = toks[t].seq->n_tokens;
        if ((rv = kv_seq_resize(c->kv, toks[t].seq, c->pos[t] + 1)) != 0) break;
    }
    if (!rv && c->kvv) rv = kv_need(c, kv_blocks_used_ever(c->kv));
    if (rv)
        for (uint32_t s = 0; s < *n_seen; s++)
            kv_seq_resize(c->kv, c->seen[s], c->seen_len[s]);
    return rv;
}

/* issue_pass puts a pass on the stream once its inputs are up (d_in): embeddings, the layers,
 * then the output rows' logits into c->logits. With every MoE layer grouped on the device it has
 * no host round trip and fixed launch shapes for a given n, so it can be captured as a graph. */
static int issue_pass(struct cuda_be *c, uint32_t n, uint32_t n_out)
{
    const struct model_hparams *hp = &c->m->hp;
    const uint32_t T = c->o.max_pass_tokens, E = hp->n_embd;
    int rv;
    c->xn_ready = c->xn_q = c->xn_moe_q = false;
    mark(c, PH_ATTN);
    if ((rv = cu_embed_rows(c->embd.type, c->embd.d, c->embd.row_bytes, c->d_in + IN_IDS * T, n, E,
                            c->x, c->s)))
        return rv;
    for (uint32_t il = 0; il < hp->n_layer; il++)
        if ((rv = attention(c, n, il, c->max_bt)) || (rv = moe(c, n, il))) return rv;
    mark(c, PH_OUTPUT);
    if (n_out && ((!c->xn_ready &&
                   (rv = cu_rmsnorm(c->x, c->output_norm, c->xn, n, E, hp->rms_eps, c->s))) ||
                  (rv = cu_gather_rows(c->xn, c->d_in + IN_OUTROWS * T, n_out, E, c->xo, c->s)) ||
                  (rv = mm(c, &c->output, c->xo, n_out, c->logits, c->acts[0], NULL))))
        return rv;
    return 0;
}

/* capture records issue_pass for n tokens into graph[n]; on any failure the capture is abandoned
 * and graphs are turned off for this backend (the pass then runs uncaptured). */
static int capture(struct cuda_be *c, uint32_t n)
{
    struct step_graph *g = &c->graph[n];
    const uint64_t w0 = c->st.weight_bytes;
    cudaGraph_t graph = NULL;
    int rv = ck(cudaStreamBeginCapture(c->s, cudaStreamCaptureModeThreadLocal), "begin capture");
    if (!rv) {
        rv = issue_pass(c, n, n);
        const int erv = ck(cudaStreamEndCapture(c->s, &graph), "end capture");
        if (!rv) rv = erv;
    }
    if (!rv) rv = ck(cudaGraphInstantiate(&g->exec, graph, 0), "graph instantiate");
    if (graph) cudaGraphDestroy(graph);
    g->dense_bytes = c->st.weight_bytes - w0;
    c->st.weight_bytes = w0;
    if (rv) {
        LOG_WARN("cuda: a decode step of %u tokens could not be captured as a CUDA graph (%s): "
                 "graphs are off for this worker",
                 n, strata_errdetail());
        cudaGetLastError();
        g->exec = NULL;
        c->graphs_on = false;
        return rv;
    }
    c->graph_captures++;
    return 0;
}

static int cuda_eval(void *impl, const struct backend_token *toks, uint32_t n, float *logits)
{
    struct cuda_be *c = impl;
    const struct model_hparams *hp = &c->m->hp;
    const uint32_t T = c->o.max_pass_tokens, bs = c->block_tokens, BT = c->max_bt;
    uint32_t n_seen;
    bool pdl_was = false;
    int rv;
    cudaSetDevice(c->dev);
    if ((rv = grow(c, toks, n, &n_seen)) != 0) return rv;
    const double t0 = now_s();
    int32_t *in = c->h_in;
    uint32_t n_out = 0;
    for (uint32_t t = 0; t < n; t++) {
        const struct kv_seq *sq = toks[t].seq;
        in[IN_IDS * T + t] = toks[t].id;
        in[IN_POS * T + t] = (int32_t)c->pos[t];
        in[IN_SLOT * T + t] = (int32_t)(sq->blocks[c->pos[t] / bs] * bs + c->pos[t] % bs);
        in[IN_KVLEN * T + t] = (int32_t)c->pos[t] + 1;
        if (toks[t].logits) in[IN_OUTROWS * T + n_out++] = (int32_t)t;
    }
    /* block tables at a fixed stride (what a captured step reads); past a sequence's blocks the
     * entries are never read, so only up to the last sequence's blocks go up */
    for (uint32_t s = 0; s < n_seen; s++)
        memcpy(in + IN_BT * T + s * BT, c->seen[s]->blocks, c->seen[s]->n_blocks * sizeof(int32_t));
    const size_t in_bytes =
        ((size_t)IN_BT * T + (size_t)(n_seen - 1) * BT + c->seen[n_seen - 1]->n_blocks) * 4;
    /* the hybrid syncs every layer (misses on the CPU): no device grouping, no graph */
    c->dev_grouped = !c->route && !c->hyb;
    const bool graph = c->graphs_on && c->dev_grouped && n <= GRAPH_MAX_TOKENS && n_out == n;
    if ((rv =
             ck(cudaMemcpyAsync(c->d_in, in, in_bytes, cudaMemcpyHostToDevice, c->s), "inputs up")))
        goto fail;
    /* an all-resident pass's launches overlap each one's start with the tail of the one ahead */
    pdl_was = cu_set_pdl(c->pdl && c->dev_grouped);
    if (graph && !c->graph[n].exec && c->graph[n].seen) capture(c, n);
    if (graph) c->graph[n].seen = true;
    if (graph && c->graph[n].exec) {
        if ((rv = ck(cudaGraphLaunch(c->graph[n].exec, c->s), "graph launch"))) goto fail;
        c->st.weight_bytes += c->graph[n].dense_bytes;
        c->graph_replays++;
    } else if ((rv = issue_pass(c, n, n_out))) {
        goto fail;
    }
    cu_set_pdl(pdl_was);
    if (c->dev_grouped && (rv = ck(cudaMemcpyAsync(c->h_ng, c->d_ng, hp->n_layer * sizeof *c->h_ng,
                                                   cudaMemcpyDeviceToHost, c->s),
                                   "group counts down")))
        goto fail;
    if (n_out &&
        (rv = ck(cudaMemcpyAsync(logits, c->logits, (size_t)n_out * hp->n_vocab * sizeof(float),
                                 cudaMemcpyDeviceToHost, c->s),
                 "logits down")))
        goto fail;
    mark(c, PH_COUNT); /* the end of the last phase */
    if ((rv = ck(cudaStreamSynchronize(c->s), "the pass"))) goto fail;
    if (c->dev_grouped)
        for (uint32_t l = 0; l < hp->n_layer; l++)
            c->st.weight_bytes += (uint64_t)c->h_ng[l] * c->L[l].group_bytes;
    if (c->timing) timing_done(c);
    c->pairs += (uint64_t)n * hp->n_expert_used * hp->n_layer;
    c->st.passes++;
    c->st.tokens += n;
    c->st.total_s += now_s() - t0;
    return 0;
fail:
    cu_set_pdl(pdl_was);
    cudaStreamSynchronize(c->s);
    c->n_ev = 0;
    for (uint32_t t = n; t-- > 0;)
        kv_seq_resize(c->kv, toks[t].seq, c->pos[t]);
    return rv;
}

/* ---- the rest of the table ------------------------------------------------------------------ */

/* cuda_available asks the NVIDIA kernel driver, not CUDA: CUDA does not survive fork() once
 * initialized, and a test runner (Check) asks in its parent and forks a child per case. A device
 * the driver lists but CUDA cannot use (CUDA_VISIBLE_DEVICES="") is reported by cuda_start. */
static bool cuda_available(void)
{
    static const char *const where[] = {"/proc/driver/nvidia/gpus/*", "/dev/nvidia[0-9]*"};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        glob_t g;
        const bool found = glob(where[i], 0, NULL, &g) == 0 && g.gl_pathc > 0;
        globfree(&g);
        if (found) return true;
    }
    return false;
}

static void cuda_set_route(void *impl, backend_route_fn fn, void *ctx)
{
    struct cuda_be *c = impl;
    c->route = fn;
    c->route_ctx = ctx;
}

static int cuda_tick(void *impl)
{
    struct cuda_be *c = impl;
    cudaSetDevice(c->dev);
    c->window++;
    if (c->timing) {
        const struct backend_stats *st = &c->st, *p = &c->tick_st;
        const double s = st->total_s - p->total_s;
        const uint64_t w = st->weight_bytes - p->weight_bytes;
        LOG_INFO("window %llu: %.2f ms (attention %.2f, dense %.2f, experts %.2f, output %.2f), "
                 "%llu tokens, %.1f MiB of weights: %.0f GB/s",
                 (unsigned long long)c->window, 1e3 * s, 1e3 * (st->attention_s - p->attention_s),
                 1e3 * (st->dense_s - p->dense_s), 1e3 * (st->experts_s - p->experts_s),
                 1e3 * (st->output_s - p->output_s), (unsigned long long)(st->tokens - p->tokens),
                 (double)w / (1 << 20), s > 0 ? (double)w / s / 1e9 : 0.0);
        c->tick_st = *st;
    }
    return c->hyb ? hyb_tick(c->hyb) : 0;
}

static int cuda_quiesce(void *impl)
{
    struct cuda_be *c = impl;
    cudaSetDevice(c->dev);
    int rv = c->hyb ? hyb_quiesce(c->hyb) : 0;
    if (!rv) rv = ck(cudaStreamSynchronize(c->s), "quiesce");
    return rv;
}

static int cuda_resize(void *impl, uint64_t bytes)
{
    struct cuda_be *c = impl;
    cudaSetDevice(c->dev);
    if (c->hyb) {
        /* the slots get what the budget leaves beside K/V and the rest (K/V is kept) */
        const uint64_t other = vram_held(c) - hyb_vram_bytes(c->hyb);
        const uint32_t fit = hyb_slots_within(c->budget > other ? c->budget - other : 0,
                                              c->slot_bytes, HYB_CHUNK_SLOTS, UINT32_MAX);
        if (bytes / c->slot_bytes > fit) {
            LOG_INFO("cuda: the vram op asks for %.2f GiB of slots; the %.2f GiB budget holds %u "
                     "slots beside K/V's %.2f GiB",
                     gib(bytes), gib(c->budget), fit, gib(kv_vram_bytes_of(c)));
            bytes = (uint64_t)fit * c->slot_bytes;
        }
        return hyb_resize(c->hyb, bytes);
    }
    return strata_errf(STRATA_EUNSUPPORTED,
                       "this CUDA backend holds every expert resident: start it with "
                       "--expert-cache N (fewer than all experts) to have a cache to resize");
}

static void cuda_info(const void *impl, struct backend_info *out)
{
    const struct cuda_be *c = impl;
    *out = (struct backend_info){
        .name = "cuda",
        .kv_type = c->o.kv_type,
        .kv_bytes = c->kv_bytes,
        .kv_pos_bytes = kv_pos_bytes(kv_config_of(c->kv), c->o.kv_type),
        .bit_exact = c->expf_exact,
        .cache_slots = c->m->hp.n_layer * c->m->hp.n_expert,
        .slot_bytes = c->slot_bytes,
        .resident = c->m->hp.n_layer * c->m->hp.n_expert,
        .hits = c->pairs,
        .first_hit_rate = 1.0,
        .graph_replays = c->graph_replays,
        .mem_gbs = c->mem_gbs,
    };
    snprintf(out->device, sizeof out->device, "%s", c->device);
    out->kv_bytes = kv_vram_bytes_of(c);
    out->vram_bytes = vram_held(c);
    out->vram_budget = c->budget;
    out->kv_grows = c->kv_grows;
    out->kv_took_slots = c->kv_took;
    if (c->hyb) hyb_info(c->hyb, out);
}

static void cuda_get_stats(const void *impl, struct backend_stats *out)
{
    const struct cuda_be *c = impl;
    *out = c->st;
}

static void cuda_reset_stats(void *impl)
{
    struct cuda_be *c = impl;
    memset(&c->st, 0, sizeof c->st);
    memset(&c->tick_st, 0, sizeof c->tick_st);
}

const struct backend_ops backend_cuda_ops = {
    .name = "cuda",
    .available = cuda_available,
    .start = cuda_start,
    .eval = cuda_eval,
    .set_route = cuda_set_route,
    .tick = cuda_tick,
    .quiesce = cuda_quiesce,
    .resize = cuda_resize,
    .info = cuda_info,
    .get_stats = cuda_get_stats,
    .reset_stats = cuda_reset_stats,
    .close = cuda_close,
};
