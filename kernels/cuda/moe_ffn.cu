#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_ffn.h"

#define MF_WARPS 4
#define MF_PAIRS 8 /* pairs per pass over a weight row */

/* dot of one weight row with up to MF_PAIRS gathered activation rows. */
template <int T>
__device__ __forceinline__ void gather_dot(const uint8_t *wrow, int64_t ncols, const float *x,
                                           int64_t ldx, const int32_t *rows, int n, float acc[MF_PAIRS])
{
    const int lane = threadIdx.x & (WARP - 1);
    for (int64_t c = lane; c < ncols / 8; c += WARP) {
        float v[8];
        deq8<T>(wrow, c, v);
#pragma unroll
        for (int b = 0; b < MF_PAIRS; b++) {
            if (b < n) {
                const float4 *xp = (const float4 *)(x + rows[b] * ldx + c * 8);
                float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
                acc[b] += v[0] * x0.x + v[1] * x0.y + v[2] * x0.z + v[3] * x0.w + v[4] * x1.x +
                          v[5] * x1.y + v[6] * x1.z + v[7] * x1.w;
            }
        }
    }
#pragma unroll
    for (int b = 0; b < MF_PAIRS; b++) acc[b] = warp_sum(acc[b]);
}

__device__ void row_dot(uint32_t type, const uint8_t *wrow, int64_t ncols, const float *x,
                        int64_t ldx, const int32_t *rows, int n, float acc[MF_PAIRS])
{
#pragma unroll
    for (int b = 0; b < MF_PAIRS; b++) acc[b] = 0.0f;
#define D(T) gather_dot<T>(wrow, ncols, x, ldx, rows, n, acc)
    CU_TYPE_SWITCH(type, D)
#undef D
}

__device__ __forceinline__ int64_t part_row_bytes(uint32_t type, int64_t ncols)
{
    switch (type) {
    case QT_F32: return ncols * 4;
    case QT_F16: case QT_BF16: return ncols * 2;
    case QT_Q8_0: return ncols / 32 * 34;
    case QT_Q5_0: return ncols / 32 * 22;
    case QT_Q4_K: return ncols / 256 * 144;
    default: return ncols / 256 * 210; /* Q6_K */
    }
}

/* grid (n_ff / MF_WARPS, n_groups): one warp per n_ff row of one expert, all its pairs. */
__global__ void __launch_bounds__(MF_WARPS *WARP)
    moe_gate_up(struct cu_moe_parts p, const uint8_t *const *slot_ptr, const struct cu_moe_group *groups,
                const int32_t *pair_idx, int k, const float *x, float *h)
{
    const int64_t r = (int64_t)blockIdx.x * MF_WARPS + threadIdx.x / WARP;
    if (r >= p.n_ff) return;
    const struct cu_moe_group g = groups[blockIdx.y];
    const uint8_t *blob = slot_ptr[g.expert];
    const uint8_t *grow = blob + p.off[CU_PART_GATE] + r * part_row_bytes(p.type[0], p.n_embd);
    const uint8_t *urow = blob + p.off[CU_PART_UP] + r * part_row_bytes(p.type[1], p.n_embd);
    for (int b0 = 0; b0 < g.count; b0 += MF_PAIRS) {
        int n = min(MF_PAIRS, g.count - b0);
        int32_t toks[MF_PAIRS];
#pragma unroll
        for (int b = 0; b < MF_PAIRS; b++) toks[b] = b < n ? pair_idx[g.first + b0 + b] / k : 0;
        float ga[MF_PAIRS], ua[MF_PAIRS];
        row_dot(p.type[0], grow, p.n_embd, x, p.n_embd, toks, n, ga);
        row_dot(p.type[1], urow, p.n_embd, x, p.n_embd, toks, n, ua);
        if ((threadIdx.x & (WARP - 1)) == 0) {
            for (int b = 0; b < n; b++) {
                float s = ga[b] / (1.0f + expf(-ga[b]));
                h[(int64_t)pair_idx[g.first + b0 + b] * p.n_ff + r] = s * ua[b];
            }
        }
    }
}

/* grid (n_embd / MF_WARPS, n_groups): one warp per output dim, down row times each pair's h. */
__global__ void __launch_bounds__(MF_WARPS *WARP)
    moe_down(struct cu_moe_parts p, const uint8_t *const *slot_ptr, const struct cu_moe_group *groups,
             const int32_t *pair_idx, const float *pair_w, const float *h, float *out)
{
    const int64_t r = (int64_t)blockIdx.x * MF_WARPS + threadIdx.x / WARP;
    if (r >= p.n_embd) return;
    const struct cu_moe_group g = groups[blockIdx.y];
    const uint8_t *drow =
        slot_ptr[g.expert] + p.off[CU_PART_DOWN] + r * part_row_bytes(p.type[2], p.n_ff);
    for (int b0 = 0; b0 < g.count; b0 += MF_PAIRS) {
        int n = min(MF_PAIRS, g.count - b0);
        int32_t pairs[MF_PAIRS];
#pragma unroll
        for (int b = 0; b < MF_PAIRS; b++) pairs[b] = b < n ? pair_idx[g.first + b0 + b] : 0;
        float acc[MF_PAIRS];
        row_dot(p.type[2], drow, p.n_ff, h, p.n_ff, pairs, n, acc);
        if ((threadIdx.x & (WARP - 1)) == 0)
            for (int b = 0; b < n; b++) out[(int64_t)pairs[b] * p.n_embd + r] = pair_w[pairs[b]] * acc[b];
    }
}

__global__ void moe_combine(const float *out, const int32_t *ids, int k, int64_t n_embd, float *y)
{
    const int64_t t = blockIdx.x;
    int order[16];
    for (int j = 0; j < k; j++) order[j] = j;
    for (int a = 1; a < k; a++) /* insertion sort by expert id: k <= 16 */
        for (int b = a; b > 0 && ids[t * k + order[b]] < ids[t * k + order[b - 1]]; b--) {
            int tmp = order[b];
            order[b] = order[b - 1], order[b - 1] = tmp;
        }
    for (int64_t d = threadIdx.x; d < n_embd; d += blockDim.x) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += out[(t * k + order[j]) * n_embd + d];
        y[t * n_embd + d] = s;
    }
}

extern "C" int cu_moe_group(const int32_t *ids, int64_t n_tok, int k, const uint8_t *resident,
                            struct cu_moe_group *groups, int32_t *pair_idx)
{
    /* O(pairs^2) selection by expert id: fine for decode batches (<= 16 tokens x 8) and chunks
     * of a few hundred tokens; a counting sort would replace it for long prompt chunks. */
    int64_t n = n_tok * k, placed = 0;
    int n_groups = 0;
    int32_t last = -1;
    for (;;) {
        int32_t next = 0x7fffffff;
        for (int64_t i = 0; i < n; i++)
            if (ids[i] > last && ids[i] < next && resident[ids[i]]) next = ids[i];
        if (next == 0x7fffffff) break;
        groups[n_groups] = (struct cu_moe_group){next, (int32_t)placed, 0};
        for (int64_t i = 0; i < n; i++)
            if (ids[i] == next) pair_idx[placed++] = (int32_t)i, groups[n_groups].count++;
        n_groups++;
        last = next;
    }
    return n_groups;
}

extern "C" int cu_moe_ffn(const struct cu_moe_parts *parts, const uint8_t *const *slot_ptr,
                          const struct cu_moe_group *groups, int n_groups, const int32_t *pair_idx,
                          const float *pair_w, int k, const float *x, float *h, float *out,
                          void *stream)
{
    for (int i = 0; i < 3; i++) {
        const struct qtype_info *ti = qtype_get(parts->type[i]);
        int64_t ncols = i == CU_PART_DOWN ? parts->n_ff : parts->n_embd;
        if (!ti || !(parts->type[i] == QT_F32 || parts->type[i] == QT_F16 ||
                     parts->type[i] == QT_BF16 || parts->type[i] == QT_Q8_0 ||
                     parts->type[i] == QT_Q5_0 || parts->type[i] == QT_Q4_K ||
                     parts->type[i] == QT_Q6_K))
            return strata_errf(STRATA_EUNSUPPORTED, "expert part %d: %s is computed on the CPU", i,
                               qtype_name(parts->type[i]));
        if (ncols % (ti->blck < 8 ? 8 : ti->blck))
            return strata_errf(STRATA_EINVAL, "expert part %d: %lld columns", i, (long long)ncols);
    }
    if (n_groups == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    dim3 g1((unsigned)((parts->n_ff + MF_WARPS - 1) / MF_WARPS), (unsigned)n_groups);
    moe_gate_up<<<g1, MF_WARPS * WARP, 0, s>>>(*parts, slot_ptr, groups, pair_idx, k, x, h);
    dim3 g2((unsigned)((parts->n_embd + MF_WARPS - 1) / MF_WARPS), (unsigned)n_groups);
    moe_down<<<g2, MF_WARPS * WARP, 0, s>>>(*parts, slot_ptr, groups, pair_idx, pair_w, h, out);
    return cu_launch_check();
}

extern "C" int cu_moe_combine(const float *out, const int32_t *ids, int64_t n_tok, int k,
                              int64_t n_embd, float *y, void *stream)
{
    if (k < 1 || k > 16) return strata_errf(STRATA_EINVAL, "cu_moe_combine: top-%d", k);
    moe_combine<<<(unsigned)n_tok, 256, 0, (cudaStream_t)stream>>>(out, ids, k, n_embd, y);
    return cu_launch_check();
}
