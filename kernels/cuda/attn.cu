#include "kernels/cuda/attn.h"
#include "kernels/cuda/common.cuh"

#define AT_WARPS 4
#define AT_MAXD  (256 / WARP) /* head dims per lane */

/* Each block: one (query row, head, split). Its warps take keys round-robin, keep an online softmax
 * (max m, sum l, acc = sum p * v) per warp, then merge the warps in shared memory and write the
 * split's partial result: acc[head_dim], m, l. */
__global__ void __launch_bounds__(AT_WARPS *WARP)
    attn_partial(const float *q, int n_head, struct cu_kv kv, const int32_t *block_tables,
                 int64_t bt_stride, const int32_t *q_seq, const int32_t *kv_len, int n_split,
                 float *ws)
{
    const int h = blockIdx.x, split = blockIdx.y;
    const int64_t row = blockIdx.z;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x & (WARP - 1);
    const int hd = kv.head_dim, nd = hd / WARP;
    const int kvh = h / (n_head / kv.n_kv_head);
    const int len = kv_len[row];
    const int per = (len + n_split - 1) / n_split;
    const int k0 = split * per, k1 = min(len, k0 + per);
    const int32_t *bt = block_tables + (int64_t)q_seq[row] * bt_stride;
    const float scale = rsqrtf((float)hd);

    float acc[AT_MAXD];
    const float *qr = q + (row * n_head + h) * hd;
#pragma unroll
    for (int i = 0; i < AT_MAXD; i++) acc[i] = 0.0f;
    /* Scores: 4 keys per warp step, 8 lanes per key, each lane a contiguous 1/8 of the head
     * (16 floats at head_dim 128), so a key's reduction is 3 shuffles and 4 keys' loads are in
     * flight at once. Values: each lane owns dims lane + 32i across the 4 keys. */
    const int grp = lane >> 3, sub = lane & 7, per_lane = hd / 8;
    float qs[32]; /* this lane's slice of q for the score phase */
#pragma unroll
    for (int i = 0; i < 32; i++) qs[i] = i < per_lane ? qr[sub * per_lane + i] * scale : 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int p0 = k0 + warp * 4; p0 < k1; p0 += AT_WARPS * 4) {
        int p = p0 + grp;
        float sc = -INFINITY;
        if (p < k1) {
            int64_t blk = bt[p / kv.block_size];
            const float *kp = kv.k + ((blk * kv.n_kv_head + kvh) * kv.block_size + p % kv.block_size) * hd +
                              sub * per_lane;
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < 32; i += 4) {
                if (i < per_lane) {
                    float4 kv4 = *(const float4 *)(kp + i);
                    s += qs[i] * kv4.x + qs[i + 1] * kv4.y + qs[i + 2] * kv4.z + qs[i + 3] * kv4.w;
                }
            }
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            s += __shfl_xor_sync(0xffffffffu, s, 4);
            sc = s;
        } else {
            /* keep the shuffles convergent */
            float s = 0.0f;
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            s += __shfl_xor_sync(0xffffffffu, s, 4);
        }
        float s4[4];
#pragma unroll
        for (int g = 0; g < 4; g++) s4[g] = __shfl_sync(0xffffffffu, sc, g * 8);
        float mn = fmaxf(fmaxf(fmaxf(m, s4[0]), fmaxf(s4[1], s4[2])), s4[3]);
        float corr = expf(m - mn);
        float pw[4];
#pragma unroll
        for (int g = 0; g < 4; g++) pw[g] = p0 + g < k1 ? expf(s4[g] - mn) : 0.0f;
        l = l * corr + pw[0] + pw[1] + pw[2] + pw[3];
#pragma unroll
        for (int i = 0; i < AT_MAXD; i++) acc[i] *= corr;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            if (p0 + g >= k1) break;
            int pg = p0 + g;
            int64_t blk = bt[pg / kv.block_size];
            const float *vp =
                kv.v + ((blk * kv.n_kv_head + kvh) * kv.block_size + pg % kv.block_size) * hd;
#pragma unroll
            for (int i = 0; i < AT_MAXD; i++)
                if (i < nd) acc[i] += pw[g] * vp[lane + i * WARP];
        }
        m = mn;
    }
    __shared__ float sm[AT_WARPS], sl[AT_WARPS], sacc[AT_WARPS][256];
    if (lane == 0) sm[warp] = m, sl[warp] = l;
#pragma unroll
    for (int i = 0; i < AT_MAXD; i++)
        if (i < nd) sacc[warp][lane + i * WARP] = acc[i];
    __syncthreads();
    if (warp != 0) return;
    float M = -INFINITY;
    for (int w = 0; w < AT_WARPS; w++) M = fmaxf(M, sm[w]);
    float L = 0.0f;
    float *out = ws + ((row * n_head + h) * n_split + split) * (hd + 2);
    for (int w = 0; w < AT_WARPS; w++) L += sm[w] == -INFINITY ? 0.0f : sl[w] * expf(sm[w] - M);
#pragma unroll
    for (int i = 0; i < AT_MAXD; i++) {
        if (i >= nd) break;
        float a = 0.0f;
        for (int w = 0; w < AT_WARPS; w++)
            if (sm[w] != -INFINITY) a += sacc[w][lane + i * WARP] * expf(sm[w] - M);
        out[lane + i * WARP] = a;
    }
    if (lane == 0) out[hd] = M, out[hd + 1] = L;
}

/* One block per (row, head): merge the splits. */
__global__ void attn_combine(int n_head, int hd, int n_split, const float *ws, float *out)
{
    const int64_t rh = blockIdx.x; /* row * n_head + head */
    const float *p = ws + rh * n_split * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, p[s * (hd + 2) + hd]);
    float L = 0.0f;
    for (int s = 0; s < n_split; s++) {
        float ms = p[s * (hd + 2) + hd];
        if (ms != -INFINITY) L += p[s * (hd + 2) + hd + 1] * expf(ms - M);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < n_split; s++) {
            float ms = p[s * (hd + 2) + hd];
            if (ms != -INFINITY) a += p[s * (hd + 2) + d] * expf(ms - M);
        }
        out[rh * hd + d] = L > 0.0f ? a / L : 0.0f;
    }
}

extern "C" size_t cu_attn_workspace_bytes(int64_t n_q, int n_head, int head_dim, int n_split)
{
    return (size_t)n_q * n_head * n_split * (head_dim + 2) * sizeof(float);
}

extern "C" int cu_attn_splits(int64_t max_len, int64_t n_q, int n_head)
{
    /* Enough blocks to fill 132 SMs a few times over, each with >= 256 keys to stream. */
    int64_t blocks = n_q * n_head;
    int s = 1;
    while (s < 64 && blocks * s < 4 * 132 && max_len / (s * 2) >= 256) s *= 2;
    return s;
}

extern "C" int cu_attention(const float *q, int64_t n_q, int n_head, const struct cu_kv *kv,
                            const int32_t *block_tables, int64_t bt_stride, const int32_t *q_seq,
                            const int32_t *kv_len, int n_split, void *workspace, float *out,
                            void *stream)
{
    if (kv->head_dim % WARP || kv->head_dim > 256 || n_head % kv->n_kv_head || n_split < 1)
        return strata_errf(STRATA_EINVAL, "cu_attention: head_dim %d (multiple of 32, <= 256), "
                           "%d heads over %d kv heads, %d splits", kv->head_dim, n_head,
                           kv->n_kv_head, n_split);
    cudaStream_t s = (cudaStream_t)stream;
    float *ws = (float *)workspace;
    dim3 g1((unsigned)n_head, (unsigned)n_split, (unsigned)n_q);
    attn_partial<<<g1, AT_WARPS * WARP, 0, s>>>(q, n_head, *kv, block_tables, bt_stride, q_seq,
                                                 kv_len, n_split, ws);
    attn_combine<<<(unsigned)(n_q * n_head), 128, 0, s>>>(n_head, kv->head_dim, n_split, ws, out);
    return cu_launch_check();
}
