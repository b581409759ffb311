#include "kernels/cuda/attn_plain.h"
#include "kernels/cuda/common.cuh"

#include <cuda_fp16.h>

/* 128 threads, tiles of 128 keys: a thread per key of a tile; 4 warps. */
#define AP_THREADS 128
#define AP_WARPS   (AP_THREADS / WARP)
#define AP_MAXHD   256
#define AP_CTAS    2048 /* CTAs a launch aims at: 132 SMs, up to 16 of these CTAs each */

__device__ __forceinline__ float ld_elem(const float *p)
{
    return *p;
}

__device__ __forceinline__ float ld_elem(const __half *p)
{
    return __half2float(*p);
}

/* dot8: the running dot plus 8 consecutive elements of a key row (16-byte aligned), fmaf in
 * element order. */
__device__ __forceinline__ float dot8(const float *qs, const __half *kr, float dot)
{
    const uint4 u = *(const uint4 *)kr;
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = __half22float2(h[i]);
        dot = fmaf(qs[2 * i], f.x, dot);
        dot = fmaf(qs[2 * i + 1], f.y, dot);
    }
    return dot;
}

__device__ __forceinline__ float dot8(const float *qs, const float *kr, float dot)
{
    const float4 a = *(const float4 *)kr, b = *(const float4 *)(kr + 4);
    dot = fmaf(qs[0], a.x, dot), dot = fmaf(qs[1], a.y, dot);
    dot = fmaf(qs[2], a.z, dot), dot = fmaf(qs[3], a.w, dot);
    dot = fmaf(qs[4], b.x, dot), dot = fmaf(qs[5], b.y, dot);
    dot = fmaf(qs[6], b.z, dot), dot = fmaf(qs[7], b.w, dot);
    return dot;
}

/* block_max / block_sum: every thread gets the CTA's max / sum, reduced in a fixed order (warp
 * butterflies, then the warps' values in warp order). red holds AP_WARPS floats. */
__device__ __forceinline__ float block_max(float x, float *red)
{
    x = warp_max(x);
    if ((threadIdx.x & (WARP - 1)) == 0) red[threadIdx.x / WARP] = x;
    __syncthreads();
    float m = red[0];
#pragma unroll
    for (int w = 1; w < AP_WARPS; w++)
        m = fmaxf(m, red[w]);
    return m;
}

__device__ __forceinline__ float block_sum(float x, float *red)
{
    x = warp_sum(x);
    if ((threadIdx.x & (WARP - 1)) == 0) red[threadIdx.x / WARP] = x;
    __syncthreads();
    float s = red[0];
#pragma unroll
    for (int w = 1; w < AP_WARPS; w++)
        s += red[w];
    return s;
}

struct ap_args {
    const float *q;
    const void *k, *v; /* the layer's pools, E elements */
    int n_head, bs, n_kv_head, hd;
    const int32_t *bt;
    int64_t bt_stride;
    const int32_t *q_seq, *kv_len;
    float scale;
    int max_chunks; /* records per (row, head) in ws */
    float *ws;      /* acc [rh][max_chunks][hd], then (m, l) [rh][max_chunks] */
    float *out;
};

/* CTA (row * n_head + h, y) takes chunks y, y + gridDim.y, ... of its row: within a chunk the
 * online softmax over tiles of 128 keys, as the unsplit kernel had it over the whole row. */
template <typename E> __global__ void __launch_bounds__(AP_THREADS) attn_chunks(struct ap_args a)
{
    __shared__ __align__(16) float qs[AP_MAXHD];
    __shared__ float ps[AP_THREADS];
    __shared__ float red_m[AP_WARPS], red_s[AP_WARPS];
    const E *kp = (const E *)a.k, *vp = (const E *)a.v;
    const int64_t rh = blockIdx.x, row = rh / a.n_head;
    const int h = (int)(rh % a.n_head), g = h / (a.n_head / a.n_kv_head), tid = threadIdx.x;
    const int hd = a.hd, bs = a.bs, len = a.kv_len[row];
    const int n_chunks = (len + CU_ATTN_CHUNK - 1) / CU_ATTN_CHUNK;
    if ((int)blockIdx.y >= n_chunks) return;
    const int32_t *tab = a.bt + (int64_t)a.q_seq[row] * a.bt_stride;
    for (int d = tid; d < hd; d += AP_THREADS)
        qs[d] = a.q[rh * hd + d];
    __syncthreads();
    for (int ch = blockIdx.y; ch < n_chunks; ch += gridDim.y) {
        const int k0 = ch * CU_ATTN_CHUNK, k1 = min(len, k0 + CU_ATTN_CHUNK);
        float m = -INFINITY, l = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
        for (int start = k0; start < k1; start += AP_THREADS) {
            const int j = start + tid;
            float s = -INFINITY;
            if (j < k1) {
                const E *kr = kp + (((int64_t)tab[j / bs] * a.n_kv_head + g) * bs + j % bs) * hd;
                float dot = 0.0f;
                for (int d = 0; d < hd; d += 8)
                    dot = dot8(qs + d, kr + d, dot);
                s = dot * a.scale;
            }
            const float m_new = fmaxf(m, block_max(s, red_m));
            const float corr = expf(m - m_new);
            const float p = j < k1 ? expf(s - m_new) : 0.0f;
            ps[tid] = p;
            l = l * corr + block_sum(p, red_s); /* block_sum's barrier also publishes ps */
            acc0 *= corr, acc1 *= corr;
            const int n = k1 - start < AP_THREADS ? k1 - start : AP_THREADS;
#pragma unroll 8
            for (int jj = 0; jj < n; jj++) {
                const int key = start + jj;
                const E *vr =
                    vp + (((int64_t)tab[key / bs] * a.n_kv_head + g) * bs + key % bs) * hd;
                if (tid < hd) acc0 = fmaf(ps[jj], ld_elem(vr + tid), acc0);
                if (tid + AP_THREADS < hd)
                    acc1 = fmaf(ps[jj], ld_elem(vr + tid + AP_THREADS), acc1);
            }
            m = m_new;
            __syncthreads(); /* ps and red_* are rewritten by the next tile */
        }
        if (n_chunks == 1) {
            float *o = a.out + rh * hd;
            if (tid < hd) o[tid] = l > 0.0f ? acc0 / l : 0.0f;
            if (tid + AP_THREADS < hd) o[tid + AP_THREADS] = l > 0.0f ? acc1 / l : 0.0f;
        } else {
            const int64_t rec = rh * a.max_chunks + ch;
            float *o = a.ws + rec * hd;
            if (tid < hd) o[tid] = acc0;
            if (tid + AP_THREADS < hd) o[tid + AP_THREADS] = acc1;
            if (tid == 0) {
                float2 *ml = (float2 *)(a.ws + (int64_t)gridDim.x * a.max_chunks * hd);
                ml[rec] = make_float2(m, l);
            }
        }
    }
}

/* One CTA per (row, head) of more than one chunk: the chunks' records merged in chunk order, each
 * thread one or two dims (every sum sequential, so the bits depend on the row's length only). */
__global__ void __launch_bounds__(AP_THREADS) attn_merge(struct ap_args a)
{
    const int64_t rh = blockIdx.x, row = rh / a.n_head;
    const int hd = a.hd, tid = threadIdx.x, len = a.kv_len[row];
    const int n_chunks = (len + CU_ATTN_CHUNK - 1) / CU_ATTN_CHUNK;
    if (n_chunks < 2) return;
    const float2 *ml =
        (const float2 *)(a.ws + (int64_t)gridDim.x * a.max_chunks * hd) + rh * a.max_chunks;
    const float *acc = a.ws + rh * a.max_chunks * hd;
    float M = -INFINITY;
    for (int c = 0; c < n_chunks; c++)
        M = fmaxf(M, ml[c].x);
    float L = 0.0f, x0 = 0.0f, x1 = 0.0f;
#pragma unroll 4
    for (int c = 0; c < n_chunks; c++) {
        const float2 r = ml[c];
        const float e = expf(r.x - M); /* every chunk has a key: r.x is finite */
        L = fmaf(e, r.y, L);
        if (tid < hd) x0 = fmaf(e, acc[(int64_t)c * hd + tid], x0);
        if (tid + AP_THREADS < hd) x1 = fmaf(e, acc[(int64_t)c * hd + tid + AP_THREADS], x1);
    }
    float *o = a.out + rh * hd;
    if (tid < hd) o[tid] = x0 / L;
    if (tid + AP_THREADS < hd) o[tid + AP_THREADS] = x1 / L;
}

static int max_chunks(int64_t max_len)
{
    return (int)((max_len + CU_ATTN_CHUNK - 1) / CU_ATTN_CHUNK);
}

extern "C" size_t cu_attn_plain_workspace_bytes(int n_head, int head_dim, int64_t max_len)
{
    const int mc = max_chunks(max_len);
    return mc < 2 ? 0 : (size_t)CU_ATTN_MAX_ROWS * n_head * mc * (head_dim + 2) * sizeof(float);
}

extern "C" int cu_attention_plain(const float *q, int64_t n_q, int n_head, const void *k,
                                  const void *v, int f16, int block_size, int n_kv_head,
                                  int head_dim, const int32_t *block_tables, int64_t bt_stride,
                                  const int32_t *q_seq, const int32_t *kv_len, int64_t max_len,
                                  void *workspace, float *out, void *stream)
{
    if (head_dim < 8 || head_dim % 8 || head_dim > AP_MAXHD || n_kv_head < 1 ||
        n_head % n_kv_head || block_size < 1 || n_q < 0 || n_q > CU_ATTN_MAX_ROWS || max_len < 1)
        return strata_errf(STRATA_EINVAL,
                           "cu_attention_plain: head_dim %d (a multiple of 8 up to 256), %d heads "
                           "over %d kv heads, blocks of %d, %lld rows (at most %d)",
                           head_dim, n_head, n_kv_head, block_size, (long long)n_q,
                           CU_ATTN_MAX_ROWS);
    if (n_q == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    const int mc = max_chunks(max_len);
    const struct ap_args a = {q,          k,
                              v,          n_head,
                              block_size, n_kv_head,
                              head_dim,   block_tables,
                              bt_stride,  q_seq,
                              kv_len,     1.0f / sqrtf((float)head_dim),
                              mc,         (float *)workspace,
                              out};
    /* the grid: the rows' heads times enough chunk lanes to fill the GPU, from the row count only
     * (so a captured step replays the same grid for any lengths) */
    const int64_t rhs = n_q * n_head;
    int64_t gy = (AP_CTAS + rhs - 1) / rhs;
    if (gy > mc) gy = mc;
    const dim3 grid((unsigned)rhs, (unsigned)gy);
    if (f16)
        attn_chunks<__half><<<grid, AP_THREADS, 0, s>>>(a);
    else
        attn_chunks<float><<<grid, AP_THREADS, 0, s>>>(a);
    if (mc > 1) attn_merge<<<(unsigned)rhs, AP_THREADS, 0, s>>>(a);
    return cu_launch_check();
}
