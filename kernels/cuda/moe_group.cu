#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/router.cuh"

#define MG_THREADS CU_MOE_GROUP_MAX_EXPERTS /* a thread per expert for the scan */
#define MG_TILE    4096                     /* ids staged in shared memory per round */
#define RG_THREADS (RT_PER_LANE * WARP)     /* cu_router_group's CTA: a thread per expert */

/* scan2: the inclusive prefix sums over the CTA's NT threads of a and b (thread order). */
template <int NT> __device__ __forceinline__ void scan2(int *a, int *b, int (*wsum)[NT / WARP])
{
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
#pragma unroll
    for (int o = 1; o < WARP; o <<= 1) {
        const int x = __shfl_up_sync(0xffffffffu, *a, o), y = __shfl_up_sync(0xffffffffu, *b, o);
        if (lane >= o) *a += x, *b += y;
    }
    if (lane == WARP - 1) wsum[0][warp] = *a, wsum[1][warp] = *b;
    __syncthreads();
    if (warp == 0) {
        int x = lane < NT / WARP ? wsum[0][lane] : 0, y = lane < NT / WARP ? wsum[1][lane] : 0;
#pragma unroll
        for (int o = 1; o < WARP; o <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, x, o), v = __shfl_up_sync(0xffffffffu, y, o);
            if (lane >= o) x += u, y += v;
        }
        if (lane < NT / WARP) wsum[0][lane] = x, wsum[1][lane] = y;
    }
    __syncthreads();
    if (warp > 0) *a += wsum[0][warp - 1], *b += wsum[1][warp - 1];
}

/* group_body: the whole CTA (NT threads, at least n_expert) groups n pairs; ids may have been
 * written by this CTA before a __syncthreads. The layout does not depend on NT. */
template <int NT>
__device__ __forceinline__ void group_body(const int32_t *ids, int n, int n_expert,
                                           const uint8_t *mask, int max_pairs,
                                           struct moe_group *groups, int32_t *pair_idx,
                                           int32_t *n_groups)
{
    __shared__ int cnt[NT]; /* pairs per expert, then the next pair slot of each */
    __shared__ int wsum[2][NT / WARP];
    __shared__ int sid[MG_TILE];
    const int tid = threadIdx.x, lane = tid % WARP;
    cnt[tid] = 0;
    __syncthreads();
    for (int p = tid; p < n; p += NT) {
        const int e = ids[p];
        if (e >= 0 && e < n_expert && (!mask || mask[e])) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    const int c = cnt[tid], g = (c + max_pairs - 1) / max_pairs;
    int pc = c, pg = g;
    scan2<NT>(&pc, &pg, wsum);
    pc -= c, pg -= g; /* exclusive: this expert's first pair and first group */
    for (int j = 0; j < g; j++) {
        const int rest = c - j * max_pairs;
        groups[pg + j] =
            (struct moe_group){tid, pc + j * max_pairs, rest < max_pairs ? rest : max_pairs};
    }
    if (tid == NT - 1) *n_groups = pg + g;
    __syncthreads();
    cnt[tid] = pc;
    for (int t0 = 0; t0 < n; t0 += MG_TILE) {
        const int tn = n - t0 < MG_TILE ? n - t0 : MG_TILE;
        __syncthreads(); /* cnt published; the last round's sid read */
        for (int i = tid; i < tn; i += NT)
            sid[i] = ids[t0 + i];
        __syncthreads();
        if (tid >= WARP) continue; /* warps past the first wait at the next round's barrier */
        for (int b = 0; b < tn; b += WARP) {
            const int i = b + lane, e = i < tn ? sid[i] : -1;
            const bool ok = e >= 0 && e < n_expert && (!mask || mask[e]);
            const unsigned peers = __match_any_sync(0xffffffffu, ok ? e : -1);
            const int base = ok ? cnt[e] : 0;
            __syncwarp();
            if (ok) {
                pair_idx[base + __popc(peers & ((1u << lane) - 1))] = t0 + i;
                if (lane == __ffs(peers) - 1) cnt[e] = base + __popc(peers);
            }
            __syncwarp();
        }
    }
}

__global__ void __launch_bounds__(MG_THREADS)
    moe_group_k(const int32_t *ids, int n, int n_expert, const uint8_t *mask, int max_pairs,
                struct moe_group *groups, int32_t *pair_idx, int32_t *n_groups)
{
    pdl_enter();
    group_body<MG_THREADS>(ids, n, n_expert, mask, max_pairs, groups, pair_idx, n_groups);
}

/* Routing and grouping in one CTA of a thread per expert (at most 256): warp w routes tokens w,
 * w + 8, ... (router.cuh), then the CTA groups. */
__global__ void __launch_bounds__(RG_THREADS)
    route_group_k(const float *logits, int n_tok, int n_exp, int k, int mode, int renorm,
                  int32_t *ids, float *weights, const uint8_t *mask, int max_pairs,
                  struct moe_group *groups, int32_t *pair_idx, int32_t *n_groups)
{
    pdl_enter();
    for (int w = threadIdx.x / WARP; w < n_tok; w += RG_THREADS / WARP)
        router_token(logits, w, n_exp, k, mode, renorm, ids, weights);
    __syncthreads(); /* the picks, in global memory, are the block's to read */
    group_body<RG_THREADS>(ids, n_tok * k, n_exp, mask, max_pairs, groups, pair_idx, n_groups);
}

extern "C" int64_t cu_moe_max_groups(int64_t n_pairs, uint32_t n_expert, uint32_t max_pairs)
{
    const int64_t used = n_pairs < (int64_t)n_expert ? n_pairs : (int64_t)n_expert;
    const int64_t bound = n_pairs / (max_pairs ? max_pairs : 1) + used;
    return bound < n_pairs ? bound : n_pairs;
}

extern "C" int cu_moe_group(const int32_t *ids, int64_t n_tok, int k, uint32_t n_expert,
                            const uint8_t *mask, uint32_t max_pairs, struct moe_group *groups,
                            int32_t *pair_idx, int32_t *n_groups, void *stream)
{
    if (n_expert > CU_MOE_GROUP_MAX_EXPERTS || max_pairs == 0 || n_tok < 0 || k < 1 ||
        n_tok * k > INT32_MAX)
        return strata_errf(STRATA_EINVAL,
                           "cu_moe_group: %u experts (at most %d), runs of %u, %lld tokens top-%d",
                           n_expert, CU_MOE_GROUP_MAX_EXPERTS, max_pairs, (long long)n_tok, k);
    const int n = (int)(n_tok * k);
    /* runs as long as every pair are no cap (moe_group's UINT32_MAX) and keep the sums in int */
    const int mp = max_pairs >= (uint32_t)n ? (n > 0 ? n : 1) : (int)max_pairs;
    cu_launch(moe_group_k, 1, MG_THREADS, 0, (cudaStream_t)stream, ids, n, (int)n_expert, mask, mp,
              groups, pair_idx, n_groups);
    return cu_launch_check();
}

extern "C" int cu_router_group(const float *logits, int64_t n_tok, int n_exp, int k,
                               enum cu_router_mode mode, int renorm, int32_t *ids, float *weights,
                               const uint8_t *mask, uint32_t max_pairs, struct moe_group *groups,
                               int32_t *pair_idx, int32_t *n_groups, void *stream)
{
    if (n_tok < 1 || n_tok > CU_ROUTE_GROUP_MAX_TOKENS || n_exp < 1 || n_exp > RT_PER_LANE * WARP ||
        k < 1 || k > 16 || k > n_exp || max_pairs == 0)
        return strata_errf(STRATA_EINVAL,
                           "cu_router_group: %lld tokens (1..%d), %d experts (<= 256), top-%d",
                           (long long)n_tok, CU_ROUTE_GROUP_MAX_TOKENS, n_exp, k);
    const int n = (int)(n_tok * k);
    const int mp = max_pairs >= (uint32_t)n ? n : (int)max_pairs;
    cu_launch(route_group_k, 1, RG_THREADS, 0, (cudaStream_t)stream, logits, (int)n_tok, n_exp, k,
              (int)mode, renorm, ids, weights, mask, mp, groups, pair_idx, n_groups);
    return cu_launch_check();
}
