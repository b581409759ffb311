#include "kernels/cuda/attn.h"
#include "kernels/cuda/common.cuh"

#define AT_MAXD (256 / WARP) /* head dims per lane in the value phase */

/* Each block: one (query row, KV head, split of the key range), one warp per query head of that KV
 * head's group (GQA), so the group's warps walk the same keys together and each K/V row comes from
 * HBM once and from L1 for the other heads. A warp keeps an online softmax (max m, sum l,
 * acc = sum p * v) over its keys and writes its split's partial result: acc[head_dim], m, l.
 * Scores: 4 keys per warp step, 8 lanes per key, each lane a contiguous 1/8 of the head (16 floats
 * at head_dim 128), so a key's reduction is 3 shuffles and 4 keys' loads are in flight at once.
 * Values: each lane owns dims lane + 32i across the 4 keys. */
__global__ void attn_partial(const float *q, int n_head, struct cu_kv kv, const int32_t *block_tables,
                             int64_t bt_stride, const int32_t *q_seq, const int32_t *kv_len,
                             int n_split, float *ws)
{
    const int kvh = blockIdx.x, split = blockIdx.y;
    const int64_t row = blockIdx.z;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x & (WARP - 1);
    const int group = n_head / kv.n_kv_head;
    const int h = kvh * group + warp;
    const int hd = kv.head_dim, nd = hd / WARP;
    const int len = kv_len[row];
    const int per = (len + n_split - 1) / n_split;
    const int k0 = split * per, k1 = min(len, k0 + per);
    const int32_t *bt = block_tables + (int64_t)q_seq[row] * bt_stride;
    const float scale = rsqrtf((float)hd);
    const float *qr = q + (row * n_head + h) * hd;

    const int grp = lane >> 3, sub = lane & 7, per_lane = hd / 8;
    float qs[32]; /* this lane's slice of q for the score phase */
#pragma unroll
    for (int i = 0; i < 32; i++) qs[i] = i < per_lane ? qr[sub * per_lane + i] * scale : 0.0f;
    float acc[AT_MAXD];
#pragma unroll
    for (int i = 0; i < AT_MAXD; i++) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int p0 = k0; p0 < k1; p0 += 4) {
        const int p = min(p0 + grp, k1 - 1); /* past the end: a valid key, weighted 0 below */
        int64_t blk = bt[p / kv.block_size];
        const float *kp =
            kv.k + ((blk * kv.n_kv_head + kvh) * kv.block_size + p % kv.block_size) * hd + sub * per_lane;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i += 4) {
            if (i < per_lane) {
                float4 k4 = __ldg((const float4 *)(kp + i));
                s += qs[i] * k4.x + qs[i + 1] * k4.y + qs[i + 2] * k4.z + qs[i + 3] * k4.w;
            }
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        float s4[4];
#pragma unroll
        for (int g = 0; g < 4; g++) s4[g] = p0 + g < k1 ? __shfl_sync(0xffffffffu, s, g * 8) : -INFINITY;
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
            int64_t bg = bt[pg / kv.block_size];
            const float *vp = kv.v + ((bg * kv.n_kv_head + kvh) * kv.block_size + pg % kv.block_size) * hd;
#pragma unroll
            for (int i = 0; i < AT_MAXD; i++)
                if (i < nd) acc[i] += pw[g] * __ldg(vp + lane + i * WARP);
        }
        m = mn;
    }
    float *out = ws + ((row * n_head + h) * n_split + split) * (hd + 2);
#pragma unroll
    for (int i = 0; i < AT_MAXD; i++)
        if (i < nd) out[lane + i * WARP] = acc[i];
    if (lane == 0) out[hd] = m, out[hd + 1] = l;
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
    /* Enough blocks (one per KV head group; 4 groups here is typical) to fill 132 SMs a few
     * times over, each with >= 256 keys to stream. */
    int64_t blocks = n_q * (n_head / 8 > 0 ? n_head / 8 : 1);
    int s = 1;
    while (s < 64 && blocks * s < 4 * 132 && max_len / (s * 2) >= 256) s *= 2;
    return s;
}

extern "C" int cu_attention(const float *q, int64_t n_q, int n_head, const struct cu_kv *kv,
                            const int32_t *block_tables, int64_t bt_stride, const int32_t *q_seq,
                            const int32_t *kv_len, int n_split, void *workspace, float *out,
                            void *stream)
{
    if (kv->head_dim % WARP || kv->head_dim > 256 || n_head % kv->n_kv_head || n_split < 1 ||
        n_head / kv->n_kv_head > 32)
        return strata_errf(STRATA_EINVAL, "cu_attention: head_dim %d (multiple of 32, <= 256), "
                           "%d heads over %d kv heads, %d splits", kv->head_dim, n_head,
                           kv->n_kv_head, n_split);
    cudaStream_t s = (cudaStream_t)stream;
    float *ws = (float *)workspace;
    dim3 g1((unsigned)kv->n_kv_head, (unsigned)n_split, (unsigned)n_q);
    attn_partial<<<g1, (n_head / kv->n_kv_head) * WARP, 0, s>>>(q, n_head, *kv, block_tables,
                                                                 bt_stride, q_seq, kv_len, n_split, ws);
    attn_combine<<<(unsigned)(n_q * n_head), 128, 0, s>>>(n_head, kv->head_dim, n_split, ws, out);
    return cu_launch_check();
}
