#include "common/quant/quant.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/expf.cuh"
#include "kernels/cuda/matvec.h"
#include "kernels/cuda/moe_ffn.h"
#include "kernels/cuda/moe_mma.h"
#include "kernels/cuda/mvq.cuh"
#include "kernels/cuda/qact.h"
#include "kernels/cuda/qact.cuh"
#include "kernels/cuda/rowsum.cuh"

/* 4 warps per block; tuned on an H200 at Qwen3-30B-A3B's expert shapes (2048 x 768). */
#define MF_WARPS 4

/* One part (gate, up or down) of every group's expert times the group's activation rows: the
 * activation row of pair p is row p / act_div (x by token: k; h by pair: 1); the result goes to
 * out[p * ld + r], times scale[p] when scale is set (the down part's routing weight). */
struct mf_task {
    const uint8_t *const *slot_ptr;
    const struct moe_group *groups;
    const int32_t *pair_idx;
    uint64_t off;      /* the part's offset in a blob */
    int nrows, ncols;  /* of the part */
    const void *act;   /* float rows (float parts) or cu_quantize_acts rows */
    int64_t arb;       /* bytes between activation rows */
    int act_div;
    float *out;
    int64_t ld;
    const float *scale;
    uint64_t off_up;         /* fused gate/up (GU): up's offset; out then gets silu(g) * u */
    const int32_t *n_groups; /* the group count in device memory (cu_moe_group), or NULL */
    int n_groups_host;       /* the count when n_groups is NULL */
    int n_slots;             /* slot_ptr's entries to stage before the wait (0: none) */
};

/* mf_swiglu: h = silu(g) * u as ops_swiglu, one IEEE step each (expf is glibc's, expf.cuh); the
 * one expression of both the SwiGLU kernel and the fused gate/up epilogue. */
__device__ __forceinline__ float mf_swiglu(float g, float u)
{
    return __fmul_rn(g / (1.0f + strata_expf(-g)), u);
}

/* mf_groups: how many groups this launch has (idle CTAs of a worst-case grid then exit). */
__device__ __forceinline__ int mf_groups(const struct mf_task &t)
{
    return t.n_groups ? *t.n_groups : t.n_groups_host;
}

/* ---- float parts: fp32 products, one warp per (row, group) ---------------------------------- */

template <int T>
__global__ void __launch_bounds__(MF_WARPS *WARP) moe_part_f(struct mf_task t)
{
    pdl_enter();
    const int64_t r = (int64_t)blockIdx.x * MF_WARPS + threadIdx.x / WARP;
    if (r >= t.nrows || (int)blockIdx.y >= mf_groups(t)) return;
    const int lane = threadIdx.x & (WARP - 1);
    const struct moe_group g = t.groups[blockIdx.y];
    const int64_t row_bytes = (int64_t)t.ncols / qt<T>::blck * qt<T>::bytes;
    const uint8_t *wrow = t.slot_ptr[g.expert] + t.off + r * row_bytes;
    float acc[CU_MOE_MAX_PAIRS];
#pragma unroll
    for (int b = 0; b < CU_MOE_MAX_PAIRS; b++) acc[b] = 0.0f;
    for (int c = lane; c < t.ncols / 8; c += WARP) {
        float v[8];
        deq8<T>(wrow, c, v);
#pragma unroll
        for (int b = 0; b < CU_MOE_MAX_PAIRS; b++) {
            if (b >= g.count) break;
            const int p = t.pair_idx[g.first + b];
            const float4 *xp = (const float4 *)((const uint8_t *)t.act + (p / t.act_div) * t.arb) + 2 * c;
            const float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
            acc[b] += v[0] * x0.x + v[1] * x0.y + v[2] * x0.z + v[3] * x0.w + v[4] * x1.x +
                      v[5] * x1.y + v[6] * x1.z + v[7] * x1.w;
        }
    }
#pragma unroll
    for (int b = 0; b < CU_MOE_MAX_PAIRS; b++) {
        if (b >= g.count) break;
        const float s = warp_sum(acc[b]);
        const int p = t.pair_idx[g.first + b];
        if (lane == 0) t.out[p * t.ld + r] = t.scale ? __fmul_rn(t.scale[p], s) : s;
    }
}

/* ---- quantized parts: matvec.cu's block dots, grouped ---------------------------------------- *
 *
 * The shape of matvec_q (see there: persistent warps, rows staged three chunks deep with cp.async,
 * LPB lanes per block, the terms summed in block order by one lane per activation row), with an
 * item = (group, row): each warp takes a contiguous run of items, so it meets few groups and loads a
 * group's slot, pairs and offsets only when the group changes. Lane b holds the group's pair b. */

#define MF_STAGES 3

template <int T, int B, bool GU>
__global__ void __launch_bounds__(MF_WARPS *WARP) moe_part_q(struct mf_task t)
{
    /* the slot table (constant over the pass) staged before the wait: after it, a group's
     * weights are one dependent load (its expert id) away, not two */
    __shared__ const uint8_t *slots[CU_MOE_SLOT_CACHE];
    pdl_trigger();
    for (int e = threadIdx.x; e < t.n_slots; e += MF_WARPS * WARP) slots[e] = t.slot_ptr[e];
    pdl_wait();
    __syncthreads();
    const int n_groups = mf_groups(t);
    using P = mvq<T>;
    constexpr int BYTES = qt<T>::bytes, BLK = qt<T>::blck, LPB = P::LPB, CB = P::CB;
    constexpr int BPP = WARP / LPB;
    constexpr int SPAN = CB * BYTES + 30;
    constexpr int BUF = SPAN / 16 + 3;
    constexpr int LOADS = (SPAN / 16 + 1 + WARP - 1) / WARP;
    static_assert(CB % BPP == 0 && CB % 4 == 0 && B <= WARP, "as matvec_q");
    __shared__ uint4 stage[MF_WARPS][MF_STAGES][BUF];
    __shared__ __align__(16) float terms[MF_WARPS][B][CB];

    const int warp = threadIdx.x / WARP, lane = threadIdx.x & (WARP - 1), p = lane % LPB;
    const int nb = t.ncols / BLK, n_chunks = (nb + CB - 1) / CB, ncols = t.ncols;
    const int64_t row_bytes = (int64_t)nb * BYTES, total = row_bytes * t.nrows;
    const int n_warps = gridDim.x * MF_WARPS, wid = blockIdx.x * MF_WARPS + warp;
    /* GU: gate and up of one type in one launch, items (group, 2 * row + part), so a warp takes
     * the gate row and then the up row of an item pair (runs of an even length) and writes
     * silu(gate) * up: the same row dots and SwiGLU as the separate launches, bit for bit */
    constexpr int NP = GU ? 2 : 1;
    const int rows = NP * t.nrows, n_items = n_groups * rows;
    const int per = ((n_items + n_warps - 1) / n_warps + NP - 1) / NP * NP;
    const int i_end = min(n_items, (wid + 1) * per);
    float *tw = terms[warp][0];
    const uint32_t lane_dst = (uint32_t)__cvta_generic_to_shared(stage[warp][0]) + 16 * lane;

    /* the copy-in side: item in_i, chunk in_c, its group's part base */
    int in_i = wid * per, in_c = 0, in_slot = 0, in_g = -1;
    const uint8_t *in_base = NULL, *in_base_up = NULL;
    auto issue = [&]() {
        if (in_i < i_end) {
            const int g = in_i / rows, v = in_i - g * rows, r = GU ? v >> 1 : v;
            if (g != in_g) {
                const int e = t.groups[g].expert;
                const uint8_t *blob = t.n_slots ? slots[e] : t.slot_ptr[e];
                in_g = g, in_base = blob + t.off;
                if (GU) in_base_up = blob + t.off_up;
            }
            const uint8_t *pbase = GU && (v & 1) ? in_base_up : in_base;
            const int64_t start = r * row_bytes + (int64_t)in_c * (CB * BYTES);
            const int64_t a0 = start & ~(int64_t)15;
            const int ncb = min(CB, nb - in_c * CB);
            const int n16 = (int)((start - a0 + ncb * BYTES + 15) >> 4);
            const uint32_t dst = lane_dst + in_slot * (BUF * 16);
#pragma unroll
            for (int l = 0; l < LOADS; l++)
                if (lane + WARP * l < n16)
                    cp_async16_tail(dst + 16 * WARP * l, pbase, a0 + 16 * (lane + WARP * l), total);
            if (++in_c == n_chunks) in_c = 0, in_i++;
        }
        asm volatile("cp.async.commit_group;\n" ::);
        in_slot = in_slot == MF_STAGES - 1 ? 0 : in_slot + 1;
    };
    issue();
    issue();
    int cur_g = -1, count = 0, my_pair = 0;
    float acc = 0.0f, gate = 0.0f;
    for (int i = wid * per, c = 0, slot = 0; i < i_end;) {
        issue();
        asm volatile("cp.async.wait_group 2;\n" ::);
        __syncwarp();
        const int g = i / rows, v = i - g * rows, r = GU ? v >> 1 : v;
        if (g != cur_g) {
            const struct moe_group grp = t.groups[g];
            cur_g = g, count = grp.count;
            my_pair = lane < count ? t.pair_idx[grp.first + lane] : 0;
        }
        const int c0 = c * CB, ncb = min(CB, nb - c0);
        const uint8_t *base =
            (const uint8_t *)stage[warp][slot] + ((r * row_bytes + (int64_t)c0 * BYTES) & 15);
#pragma unroll
        for (int k = 0; k < CB / BPP; k++) {
            const int cb = k * BPP + lane / LPB, ab = c0 + cb;
            const bool ok = cb < ncb;
            P part;
            if (ok) part.load(base + cb * BYTES, p);
#pragma unroll
            for (int b = 0; b < B; b++) {
                if (b >= count) break;
                const int pb = __shfl_sync(0xffffffffu, my_pair, b);
                const uint8_t *arow = (const uint8_t *)t.act + (pb / t.act_div) * t.arb;
                int is = 0, ms = 0;
                if (ok)
                    part.dot((const int8_t *)arow + ab * BLK,
                             (const int16_t *)(arow + ncols) + ab * (BLK / 16), p, &is, &ms);
#pragma unroll
                for (int o = 1; o < LPB; o <<= 1) {
                    is += __shfl_xor_sync(0xffffffffu, is, o);
                    ms += __shfl_xor_sync(0xffffffffu, ms, o);
                }
                if (ok && p == 0)
                    tw[b * CB + cb] =
                        part.value(__ldg((const float *)(arow + ncols + ncols / 8) + ab), is, ms);
            }
        }
        __syncwarp();
        if (lane < count) {
            const float *tl = tw + lane * CB;
            for (int j = 0; j < ncb; j++) acc = __fadd_rn(acc, tl[j]);
            if (c == n_chunks - 1) {
                if (!GU)
                    t.out[my_pair * t.ld + r] = t.scale ? __fmul_rn(t.scale[my_pair], acc) : acc;
                else if (!(v & 1))
                    gate = acc;
                else
                    t.out[my_pair * t.ld + r] = mf_swiglu(gate, acc);
                acc = 0.0f;
            }
        }
        if (++c == n_chunks) c = 0, i++;
        slot = slot == MF_STAGES - 1 ? 0 : slot + 1;
        __syncwarp();
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
}

static_assert(CU_MOE_MMA_PAIRS <= CU_MOE_MMA_TILE, "a group fits moe_mma's tile");

extern "C" bool cu_moe_mma_ok(const struct cu_moe_parts *parts)
{
    for (int i = 0; i < 3; i++)
        if (!cu_type_supported(parts->type[i]) || qtype_get(parts->type[i])->blck == 1)
            return false;
    return parts->type[CU_PART_GATE] == parts->type[CU_PART_UP];
}

/* h = silu(gate) * up for every pair of every group, as ops_swiglu (one IEEE step each; expf is
 * glibc's, expf.cuh). */
__global__ void moe_swiglu(const struct moe_group *groups, const int32_t *pair_idx, int n_ff,
                           float *h, const float *up, const int32_t *n_groups, int n_groups_host)
{
    pdl_enter();
    if ((int)blockIdx.x >= (n_groups ? *n_groups : n_groups_host)) return;
    const struct moe_group g = groups[blockIdx.x];
    for (int i = threadIdx.x; i < g.count * n_ff; i += blockDim.x) {
        const int64_t e = (int64_t)pair_idx[g.first + i / n_ff] * n_ff + i % n_ff;
        h[e] = mf_swiglu(h[e], up[e]);
    }
}

/* mc_order: token t's k outputs in ascending expert-id order (insertion sort: k <= 16). */
__device__ __forceinline__ void mc_order(const int32_t *ids, int64_t t, int k, int order[16])
{
    for (int j = 0; j < k; j++) order[j] = j;
    for (int a = 1; a < k; a++)
        for (int b = a; b > 0 && ids[t * k + order[b]] < ids[t * k + order[b - 1]]; b--) {
            int tmp = order[b];
            order[b] = order[b - 1], order[b - 1] = tmp;
        }
}

/* mc_sum: element d of token t's combine, the k outputs added in that order. */
__device__ __forceinline__ float mc_sum(const float *out, const int order[16], int64_t t, int k,
                                        int64_t n_embd, int64_t d)
{
    float s = 0.0f;
    for (int j = 0; j < k; j++) s += out[(t * k + order[j]) * n_embd + d];
    return s;
}

/* y[t] = the sum of token t's k outputs in expert-id order; with add, y[t] += that sum instead (the
 * residual add fused: the same two IEEE steps as a combine then cu_add); with norm_w, xn[t] =
 * RMSNorm(y[t]) as cu_rmsnorm computes a row of ROW_NORM_MIN or more (the same chunks and
 * cta_sum: 256 threads a token, rowsum.cuh's order). */
template <bool ADD, bool NORM, int QA = 0>
__global__ void __launch_bounds__(ROW_NORM_THREADS)
    moe_combine(const float *out, const int32_t *ids, int k, int64_t n_embd, float *y,
                const float *norm_w, float eps, float *xn, uint8_t *act, size_t arb)
{
    pdl_enter();
    __shared__ float red[ROW_NORM_THREADS / WARP];
    const int64_t t = blockIdx.x;
    int order[16];
    mc_order(ids, t, k, order);
    float ss = 0.0f;
    const int n_chunks = (int)((n_embd + ROW_NORM_THREADS - 1) / ROW_NORM_THREADS);
    for (int m = 0; m < n_chunks; m++) {
        const int64_t d = (int64_t)m * ROW_NORM_THREADS + threadIdx.x;
        float v = 0.0f;
        if (d < n_embd) {
            const float s = mc_sum(out, order, t, k, n_embd, d);
            v = ADD ? __fadd_rn(y[t * n_embd + d], s) : s;
            y[t * n_embd + d] = v;
        }
        if (NORM) {
            const float p = cta_sum<ROW_NORM_THREADS>(v * v, red);
            __syncthreads();
            ss = m ? ss + p : p;
        }
    }
    if (NORM) {
        const float scale = row_scale(ss, n_embd, eps);
        for (int64_t d = threadIdx.x; d < n_embd; d += ROW_NORM_THREADS)
            xn[t * n_embd + d] = y[t * n_embd + d] * scale * norm_w[d];
    }
    if (QA) { /* the normed row quantized for the next product, as cu_quantize_acts (qact.cuh) */
        __syncthreads();
        qact_row(xn + t * n_embd, n_embd, (uint32_t)QA, threadIdx.x / WARP, ROW_NORM_THREADS / WARP,
                 threadIdx.x % WARP, act + t * arb);
    }
}

/* moe_combine<true, true, QA> split over CTAs, grid (chunks, tokens): CTA c combines, adds and
 * norms elements 256c .. 256c + 255 of its token and (QA) quantizes their blocks; the chunk sums
 * meet through sync (rowsum.cuh), so the same bits. */
template <int QA>
__global__ void __launch_bounds__(ROW_NORM_THREADS)
    moe_combine_split(const float *out, const int32_t *ids, int k, int64_t n_embd, float *y,
                      const float *norm_w, float eps, float *xn, uint8_t *act, size_t arb,
                      struct row_sync *sync)
{
    pdl_trigger();
    __shared__ float red[ROW_NORM_THREADS / WARP];
    __shared__ __align__(16) float row[ROW_NORM_THREADS];
    const int c = blockIdx.x, tid = threadIdx.x;
    const int64_t t = blockIdx.y, d = (int64_t)c * ROW_NORM_THREADS + tid, e = t * n_embd + d;
    const bool in = d < n_embd;
    const float wv = in ? norm_w[d] : 0.0f; /* the pass's constants before the wait */
    pdl_wait();
    int order[16];
    mc_order(ids, t, k, order);
    float v = 0.0f;
    if (in) y[e] = v = __fadd_rn(y[e], mc_sum(out, order, t, k, n_embd, d));
    const float tot =
        row_split_sum(cta_sum<ROW_NORM_THREADS>(v * v, red), sync + t, c, (int)gridDim.x);
    const float o = v * row_scale(tot, n_embd, eps) * wv;
    if (in) xn[e] = o;
    if (!QA) return;
    row[tid] = in ? o : 0.0f;
    __syncthreads();
    qact_chunk(row, n_embd, (uint32_t)QA, c, tid / WARP, tid % WARP, act + t * arb);
}

/* The workspace: up's products, then the activations quantized for gate, for up (when its layout
 * differs) and for down, each region 256-byte aligned. */
struct mf_layout {
    size_t up, xg, xu, hd, total;
};

static struct mf_layout mf_layout(const struct cu_moe_parts *p, int64_t n_tok, int k)
{
    struct mf_layout l;
    const int64_t n_pairs = n_tok * k;
    size_t at = 0;
#define MF_TAKE(field, bytes) (l.field = at, at += ((size_t)(bytes) + 255) & ~(size_t)255)
    MF_TAKE(up, sizeof(float) * n_pairs * p->n_ff);
    MF_TAKE(xg, cu_act_row_bytes(p->type[CU_PART_GATE], p->n_embd) * n_tok);
    MF_TAKE(xu, quant_act_type(p->type[CU_PART_UP]) == quant_act_type(p->type[CU_PART_GATE])
                    ? 0
                    : cu_act_row_bytes(p->type[CU_PART_UP], p->n_embd) * n_tok);
    MF_TAKE(hd, cu_act_row_bytes(p->type[CU_PART_DOWN], p->n_ff) * n_pairs);
#undef MF_TAKE
    l.total = at;
    return l;
}

extern "C" size_t cu_moe_workspace_bytes(const struct cu_moe_parts *parts, int64_t n_tok, int k)
{
    return mf_layout(parts, n_tok, k).total;
}

/* run_part: one part of every group, on the float or the quantized kernel of its type. */
static void run_part(uint32_t type, struct mf_task t, int n_groups, int64_t n_tok, bool gu,
                     cudaStream_t s)
{
    if (qtype_get(type)->blck == 1) {
        dim3 grid((unsigned)((t.nrows + MF_WARPS - 1) / MF_WARPS), (unsigned)n_groups);
#define F(T) cu_launch(moe_part_f<T>, grid, MF_WARPS *WARP, 0, s, t)
        CU_TYPE_SWITCH(type, F)
#undef F
        return;
    }
    /* a row per warp where that fits one wave (8 CTAs of 4 warps per SM on the H200's 132 SMs):
     * a decode step's experts are only a few thousand rows, and each row a warp takes in turn
     * adds a memory latency */
    const int64_t items = (int64_t)n_groups * t.nrows * (gu ? 2 : 1),
                  ctas = (items + MF_WARPS - 1) / MF_WARPS;
    const unsigned grid = (unsigned)(ctas < 132 * 8 ? ctas : 132 * 8);
#define Q(T, B)                                                                                    \
    if (gu)                                                                                        \
        cu_launch(moe_part_q<T, B, true>, grid, MF_WARPS *WARP, 0, s, t);                          \
    else                                                                                           \
        cu_launch(moe_part_q<T, B, false>, grid, MF_WARPS *WARP, 0, s, t);
#define QB(T)                                                                                      \
    if (n_tok == 1) {                                                                              \
        Q(T, 1)                                                                                    \
    } else if (n_tok <= 4) {                                                                       \
        Q(T, 4)                                                                                    \
    } else {                                                                                       \
        Q(T, 16)                                                                                   \
    }
    switch (type) {
    case QT_Q8_0: QB(QT_Q8_0) break;
    case QT_Q5_0: QB(QT_Q5_0) break;
    case QT_Q4_K: QB(QT_Q4_K) break;
    case QT_Q5_K: QB(QT_Q5_K) break;
    case QT_Q6_K: QB(QT_Q6_K) break;
    case QT_Q2_K: QB(QT_Q2_K) break;
    case QT_Q3_K: QB(QT_Q3_K) break;
    case QT_IQ4_XS: QB(QT_IQ4_XS) break;
    case QT_IQ4_NL: QB(QT_IQ4_NL) break;
    default: break;
    }
#undef QB
#undef Q
}

/* moe_ffn: n_groups groups (d_n_groups NULL) or at most n_groups, the count in d_n_groups. */
static int moe_ffn(const struct cu_moe_parts *parts, const uint8_t *const *slot_ptr,
                   const struct moe_group *groups, int n_groups, const int32_t *d_n_groups,
                   const int32_t *pair_idx, const float *pair_w, int64_t n_tok, int k,
                   const float *x, float *h, void *ws, float *out, unsigned flags, void *stream)
{
    for (int i = 0; i < 3; i++) {
        const int64_t ncols = i == CU_PART_DOWN ? parts->n_ff : parts->n_embd;
        if (!cu_type_supported(parts->type[i]))
            return strata_errf(STRATA_EUNSUPPORTED, "expert part %d: %s is computed on the CPU", i,
                               qtype_name(parts->type[i]));
        if (cu_act_row_bytes(parts->type[i], ncols) == 0 || parts->off[i] % 16)
            return strata_errf(STRATA_EINVAL,
                               "expert part %d: %lld columns of %s at blob offset %llu (a whole "
                               "number of blocks, at a multiple of 16 bytes)", i, (long long)ncols,
                               qtype_name(parts->type[i]), (unsigned long long)parts->off[i]);
    }
    if (n_tok < 1 || k < 1 || n_tok * k > INT32_MAX / parts->n_ff)
        return strata_errf(STRATA_EINVAL, "cu_moe_ffn: %lld tokens top-%d", (long long)n_tok, k);
    if ((flags & CU_MOE_MMA) && !cu_moe_mma_ok(parts))
        return strata_errf(STRATA_EINVAL,
                           "cu_moe_ffn_dev: CU_MOE_MMA needs quantized parts and "
                           "gate and up of one type (%s, %s, %s)",
                           qtype_name(parts->type[0]), qtype_name(parts->type[1]),
                           qtype_name(parts->type[2]));
    if (n_groups == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    const struct mf_layout l = mf_layout(parts, n_tok, k);
    uint8_t *w = (uint8_t *)ws;
    const int64_t n_pairs = n_tok * k;
    const uint32_t tg = parts->type[CU_PART_GATE], tu = parts->type[CU_PART_UP],
                   td = parts->type[CU_PART_DOWN];
    int rv;
    /* h's rows of pairs on CPU experts are never written here; zeros keep the quantizer's input
     * defined (with every pair in a group there are none) */
    if (!(flags & CU_MOE_EVERY_PAIR) &&
        (rv = cu_err(cudaMemsetAsync(h, 0, sizeof(float) * n_pairs * parts->n_ff, s))) != 0)
        return rv;
    /* gate and up: x quantized once per activation layout (floats pass through), or given so */
    const void *xg = x, *xu = x;
    if (flags & CU_MOE_X_QUANTIZED) {
        if (qtype_get(tg)->blck == 1 || quant_act_type(tu) != quant_act_type(tg))
            return strata_errf(STRATA_EINVAL,
                               "cu_moe_ffn_dev: activations given quantized for "
                               "%s gate and %s up parts",
                               qtype_name(tg), qtype_name(tu));
    } else if (qtype_get(tg)->blck > 1) {
        if ((rv = cu_quantize_acts(tg, x, parts->n_embd, (int)n_tok, w + l.xg, s)) != 0) return rv;
        xg = w + l.xg;
    }
    if (qtype_get(tu)->blck > 1) {
        if (quant_act_type(tu) == quant_act_type(tg)) {
            xu = xg;
        } else {
            if ((rv = cu_quantize_acts(tu, x, parts->n_embd, (int)n_tok, w + l.xu, s)) != 0) return rv;
            xu = w + l.xu;
        }
    }
    float *up = (float *)(w + l.up);
    const int n_slots =
        d_n_groups && parts->n_slots <= CU_MOE_SLOT_CACHE ? (int)parts->n_slots : 0;
    struct mf_task t = {slot_ptr, groups, pair_idx, parts->off[CU_PART_GATE], (int)parts->n_ff,
                        (int)parts->n_embd, xg, (int64_t)cu_act_row_bytes(tg, parts->n_embd), k,
                        h, parts->n_ff, NULL, parts->off[CU_PART_UP], d_n_groups, n_groups,
                        n_slots};
    if (flags & CU_MOE_MMA) {
        /* prompt chunks: gate and up with SwiGLU, then down, on the tensor cores */
        struct cu_moe_mma_task mt = {slot_ptr, groups, pair_idx, parts->off[CU_PART_GATE],
                                     parts->off[CU_PART_UP], (int)parts->n_ff, (int)parts->n_embd,
                                     xg, (int64_t)cu_act_row_bytes(tg, parts->n_embd), k, h,
                                     parts->n_ff, NULL, d_n_groups, n_groups};
        cu_moe_mma(tg, &mt, true, s);
        if ((rv = cu_quantize_acts(td, h, parts->n_ff, (int)n_pairs, w + l.hd, s)) != 0) return rv;
        mt.off = parts->off[CU_PART_DOWN], mt.nrows = (int)parts->n_embd;
        mt.ncols = (int)parts->n_ff, mt.act = w + l.hd;
        mt.arb = (int64_t)cu_act_row_bytes(td, parts->n_ff), mt.act_div = 1;
        mt.out = out, mt.ld = parts->n_embd, mt.scale = pair_w;
        cu_moe_mma(td, &mt, false, s);
        return cu_launch_check();
    }
    if (tg == tu && qtype_get(tg)->blck > 1 && !(flags & CU_MOE_UNFUSED)) {
        /* one launch: gate and up rows side by side, SwiGLU in its epilogue */
        run_part(tg, t, n_groups, n_tok, true, s);
    } else {
        run_part(tg, t, n_groups, n_tok, false, s);
        t.off = parts->off[CU_PART_UP], t.act = xu;
        t.arb = (int64_t)cu_act_row_bytes(tu, parts->n_embd), t.out = up;
        run_part(tu, t, n_groups, n_tok, false, s);
        cu_launch(moe_swiglu, (unsigned)n_groups, 256, 0, s, groups, pair_idx, (int)parts->n_ff, h,
                  up, d_n_groups, n_groups);
    }
    /* down: h by pair, quantized for its type (floats pass through), scaled by the route weight */
    const void *hd = h;
    if (qtype_get(td)->blck > 1) {
        if ((rv = cu_quantize_acts(td, h, parts->n_ff, (int)n_pairs, w + l.hd, s)) != 0) return rv;
        hd = w + l.hd;
    }
    t.off = parts->off[CU_PART_DOWN], t.nrows = (int)parts->n_embd, t.ncols = (int)parts->n_ff;
    t.act = hd, t.arb = (int64_t)cu_act_row_bytes(td, parts->n_ff), t.act_div = 1, t.out = out;
    t.ld = parts->n_embd, t.scale = pair_w;
    run_part(td, t, n_groups, n_tok, false, s);
    return cu_launch_check();
}

extern "C" int cu_moe_ffn(const struct cu_moe_parts *parts, const uint8_t *const *slot_ptr,
                          const struct moe_group *groups, int n_groups, const int32_t *pair_idx,
                          const float *pair_w, int64_t n_tok, int k, const float *x, float *h,
                          void *ws, float *out, void *stream)
{
    return moe_ffn(parts, slot_ptr, groups, n_groups, NULL, pair_idx, pair_w, n_tok, k, x, h, ws,
                   out, CU_MOE_UNFUSED, stream);
}

extern "C" int cu_moe_ffn_dev(const struct cu_moe_parts *parts, const uint8_t *const *slot_ptr,
                              const struct moe_group *groups, const int32_t *n_groups,
                              int max_groups, const int32_t *pair_idx, const float *pair_w,
                              int64_t n_tok, int k, const float *x, float *h, void *ws, float *out,
                              unsigned flags, void *stream)
{
    if (!n_groups) return strata_errf(STRATA_EINVAL, "cu_moe_ffn_dev: no group count");
    return moe_ffn(parts, slot_ptr, groups, max_groups, n_groups, pair_idx, pair_w, n_tok, k, x,
                   h, ws, out, flags, stream);
}

extern "C" int cu_moe_combine(const float *out, const int32_t *ids, int64_t n_tok, int k,
                              int64_t n_embd, float *y, void *stream)
{
    if (k < 1 || k > 16) return strata_errf(STRATA_EINVAL, "cu_moe_combine: top-%d", k);
    cu_launch(moe_combine<false, false>, (unsigned)n_tok, ROW_NORM_THREADS, 0, (cudaStream_t)stream,
              out, ids, k, n_embd, y, nullptr, 0.0f, nullptr, nullptr, (size_t)0);
    return cu_launch_check();
}

extern "C" int cu_moe_combine_add(const float *out, const int32_t *ids, int64_t n_tok, int k,
                                  int64_t n_embd, float *x, void *stream)
{
    if (k < 1 || k > 16) return strata_errf(STRATA_EINVAL, "cu_moe_combine_add: top-%d", k);
    cu_launch(moe_combine<true, false>, (unsigned)n_tok, ROW_NORM_THREADS, 0, (cudaStream_t)stream,
              out, ids, k, n_embd, x, nullptr, 0.0f, nullptr, nullptr, (size_t)0);
    return cu_launch_check();
}

/* combine_norm: cu_moe_combine_add_norm(_q)'s launch, qa 0 (no activations), QT_Q8_0 or QT_Q8_K;
 * split over CTAs with sync where the grid fits (at most an SM a CTA), else one CTA a token. */
static void combine_norm(uint32_t qa, const float *out, const int32_t *ids, int64_t n_tok, int k,
                         int64_t n_embd, float *x, const float *norm_w, float eps, float *xn,
                         uint8_t *act, size_t arb, void *sync, cudaStream_t s)
{
    const int64_t chunks = (n_embd + ROW_NORM_THREADS - 1) / ROW_NORM_THREADS;
    struct row_sync *rs = (struct row_sync *)sync;
    const dim3 grid((unsigned)chunks, (unsigned)n_tok);
    const unsigned nt = ROW_NORM_THREADS, one = (unsigned)n_tok;
    if (sync && chunks <= ROW_SYNC_CHUNKS && n_tok * chunks <= cu_sm_count()) {
        if (qa == QT_Q8_0)
            cu_launch(moe_combine_split<QT_Q8_0>, grid, nt, 0, s, out, ids, k, n_embd, x, norm_w,
                      eps, xn, act, arb, rs);
        else if (qa == QT_Q8_K)
            cu_launch(moe_combine_split<QT_Q8_K>, grid, nt, 0, s, out, ids, k, n_embd, x, norm_w,
                      eps, xn, act, arb, rs);
        else
            cu_launch(moe_combine_split<0>, grid, nt, 0, s, out, ids, k, n_embd, x, norm_w, eps, xn,
                      act, arb, rs);
    } else if (qa == QT_Q8_0) {
        cu_launch(moe_combine<true, true, QT_Q8_0>, one, nt, 0, s, out, ids, k, n_embd, x, norm_w,
                  eps, xn, act, arb);
    } else if (qa == QT_Q8_K) {
        cu_launch(moe_combine<true, true, QT_Q8_K>, one, nt, 0, s, out, ids, k, n_embd, x, norm_w,
                  eps, xn, act, arb);
    } else {
        cu_launch(moe_combine<true, true>, one, nt, 0, s, out, ids, k, n_embd, x, norm_w, eps, xn,
                  act, arb);
    }
}

extern "C" int cu_moe_combine_add_norm(const float *out, const int32_t *ids, int64_t n_tok, int k,
                                       int64_t n_embd, float *x, const float *norm_w, float eps,
                                       float *xn, void *sync, void *stream)
{
    if (k < 1 || k > 16 || n_embd < ROW_NORM_MIN)
        return strata_errf(STRATA_EINVAL, "cu_moe_combine_add_norm: top-%d, rows of %lld (%d or more)",
                           k, (long long)n_embd, ROW_NORM_MIN);
    combine_norm(0, out, ids, n_tok, k, n_embd, x, norm_w, eps, xn, nullptr, 0, sync,
                 (cudaStream_t)stream);
    return cu_launch_check();
}

extern "C" int cu_moe_combine_add_norm_q(const float *out, const int32_t *ids, int64_t n_tok, int k,
                                         int64_t n_embd, float *x, const float *norm_w, float eps,
                                         float *xn, uint32_t wtype, void *act, void *sync,
                                         void *stream)
{
    const uint32_t at = quant_act_type(wtype);
    const size_t arb = cu_act_row_bytes(wtype, n_embd);
    if (k < 1 || k > 16 || n_embd < ROW_NORM_MIN || arb == 0 || (at != QT_Q8_0 && at != QT_Q8_K))
        return strata_errf(STRATA_EINVAL,
                           "cu_moe_combine_add_norm_q: top-%d, rows of %lld (%d or more), %s "
                           "activations",
                           k, (long long)n_embd, ROW_NORM_MIN, qtype_name(wtype));
    combine_norm(at, out, ids, n_tok, k, n_embd, x, norm_w, eps, xn, (uint8_t *)act, arb, sync,
                 (cudaStream_t)stream);
    return cu_launch_check();
}
