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
    unsigned *cnt;  /* per (row, head): its chunks done (zero between launches) */
    float *out;
};

/* merge_row: the CTA merges row-head rh's n_chunks records in chunk order, each thread one or two
 * dims (every sum sequential, so the bits depend on the row's length only); the records were
 * written by other CTAs, so they are read from L2 (__ldcg). */
__device__ __forceinline__ void merge_row(const struct ap_args &a, int64_t rh, int n_chunks,
                                          int64_t n_rh)
{
    const int hd = a.hd, tid = threadIdx.x;
    const float2 *ml = (const float2 *)(a.ws + n_rh * a.max_chunks * hd) + rh * a.max_chunks;
    const float *acc = a.ws + rh * a.max_chunks * hd;
    float M = -INFINITY;
    for (int c = 0; c < n_chunks; c++)
        M = fmaxf(M, __ldcg(&ml[c]).x);
    float L = 0.0f, x0 = 0.0f, x1 = 0.0f;
#pragma unroll 4
    for (int c = 0; c < n_chunks; c++) {
        const float2 r = __ldcg(&ml[c]);
        const float e = expf(r.x - M); /* every chunk has a key: r.x is finite */
        L = fmaf(e, r.y, L);
        if (tid < hd) x0 = fmaf(e, __ldcg(&acc[(int64_t)c * hd + tid]), x0);
        if (tid + AP_THREADS < hd)
            x1 = fmaf(e, __ldcg(&acc[(int64_t)c * hd + tid + AP_THREADS]), x1);
    }
    float *o = a.out + rh * hd;
    if (tid < hd) o[tid] = x0 / L;
    if (tid + AP_THREADS < hd) o[tid + AP_THREADS] = x1 / L;
}

/* ldv<VPL>: VPL consecutive elements of a K/V row as floats, in one access where they fill 8 or 16
 * aligned bytes. */
template <int VPL> __device__ __forceinline__ void ldv(const __half *p, float *v)
{
    if constexpr (VPL == 4) {
        const uint2 u = *(const uint2 *)p;
        const float2 a = __half22float2(*(const __half2 *)&u.x),
                     b = __half22float2(*(const __half2 *)&u.y);
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    } else if constexpr (VPL == 8) {
        const uint4 u = *(const uint4 *)p;
        const __half2 *h = (const __half2 *)&u;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __half22float2(h[i]);
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < VPL; i++)
            v[i] = __half2float(p[i]);
    }
}

template <int VPL> __device__ __forceinline__ void ldv(const float *p, float *v)
{
    if constexpr (VPL % 4 == 0) {
#pragma unroll
        for (int i = 0; i < VPL; i += 4) {
            const float4 f = *(const float4 *)(p + i);
            v[i] = f.x, v[i + 1] = f.y, v[i + 2] = f.z, v[i + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < VPL; i++)
            v[i] = p[i];
    }
}

/* CTA (row * n_head + h, y) takes chunks y, y + gridDim.y, ... of its row; a chunk is one tile of
 * CU_ATTN_CHUNK keys: thread j scores key j (its row's offset kept in shared memory), the chunk's
 * max and sum over the CTA, then warp w adds p * v over keys [32w, 32w + 32) of the chunk, each
 * lane VPL dims, and the warps' sums are added in warp order. */
template <typename E, int VPL>
__global__ void __launch_bounds__(AP_THREADS) attn_chunks(struct ap_args a)
{
    pdl_enter();
    constexpr int HD = VPL * WARP;
    static_assert(CU_ATTN_CHUNK == AP_THREADS, "a thread per key of a chunk");
    __shared__ __align__(16) float qs[HD];
    __shared__ float ps[AP_THREADS];
    __shared__ int64_t offs[AP_THREADS];
    __shared__ float red_m[AP_WARPS], red_s[AP_WARPS];
    __shared__ float vacc[AP_WARPS][HD];
    __shared__ int last;
    const E *kp = (const E *)a.k, *vp = (const E *)a.v;
    const int64_t rh = blockIdx.x, row = rh / a.n_head;
    const int h = (int)(rh % a.n_head), g = h / (a.n_head / a.n_kv_head), tid = threadIdx.x;
    const int warp = tid / WARP, lane = tid % WARP;
    const int bs = a.bs, len = a.kv_len[row];
    const int n_chunks = (len + CU_ATTN_CHUNK - 1) / CU_ATTN_CHUNK;
    if ((int)blockIdx.y >= n_chunks) return;
    const int32_t *tab = a.bt + (int64_t)a.q_seq[row] * a.bt_stride;
    for (int d = tid; d < HD; d += AP_THREADS)
        qs[d] = a.q[rh * HD + d];
    __syncthreads();
    for (int ch = blockIdx.y; ch < n_chunks; ch += gridDim.y) {
        const int k0 = ch * CU_ATTN_CHUNK, n = min(CU_ATTN_CHUNK, len - k0);
        float s = -INFINITY;
        if (tid < n) {
            const int j = k0 + tid;
            const int64_t off = (((int64_t)tab[j / bs] * a.n_kv_head + g) * bs + j % bs) * HD;
            offs[tid] = off;
            const E *kr = kp + off;
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < HD; d += 8)
                dot = dot8(qs + d, kr + d, dot);
            s = dot * a.scale;
        }
        const float m = block_max(s, red_m); /* its barrier publishes offs */
        const float p = tid < n ? expf(s - m) : 0.0f;
        ps[tid] = p;
        const float l = block_sum(p, red_s); /* and this one ps */
        float acc[VPL];
#pragma unroll
        for (int i = 0; i < VPL; i++)
            acc[i] = 0.0f;
        const int kb = warp * WARP, ke = min(n, kb + WARP);
#pragma unroll 8
        for (int jj = kb; jj < ke; jj++) {
            float v[VPL];
            ldv<VPL>(vp + offs[jj] + lane * VPL, v);
            const float pj = ps[jj];
#pragma unroll
            for (int i = 0; i < VPL; i++)
                acc[i] = fmaf(pj, v[i], acc[i]);
        }
#pragma unroll
        for (int i = 0; i < VPL; i++)
            vacc[warp][lane * VPL + i] = acc[i];
        __syncthreads();
        const int64_t rec = rh * a.max_chunks + ch;
        for (int d = tid; d < HD; d += AP_THREADS) {
            float x = vacc[0][d];
#pragma unroll
            for (int w = 1; w < AP_WARPS; w++)
                x += vacc[w][d];
            if (n_chunks == 1)
                a.out[rh * HD + d] = x / l;
            else
                a.ws[rec * HD + d] = x;
        }
        if (n_chunks > 1) {
            if (tid == 0) {
                float2 *ml = (float2 *)(a.ws + (int64_t)gridDim.x * a.max_chunks * HD);
                ml[rec] = make_float2(m, l);
            }
            /* the CTA that ends the row's last chunk merges them all (threadFenceReduction's
             * pattern): the records are out before the count says so */
            __threadfence();
            __syncthreads();
            if (tid == 0) last = atomicAdd(&a.cnt[rh], 1u) == (unsigned)(n_chunks - 1);
            __syncthreads();
            if (last) {
                __threadfence();
                merge_row(a, rh, n_chunks, gridDim.x);
                if (tid == 0) a.cnt[rh] = 0; /* for the next launch */
            }
        }
        __syncthreads(); /* the next chunk rewrites offs, ps, red_* and vacc */
    }
}

static int max_chunks(int64_t max_len)
{
    return (int)((max_len + CU_ATTN_CHUNK - 1) / CU_ATTN_CHUNK);
}

extern "C" size_t cu_attn_plain_workspace_bytes(int n_head, int head_dim, int64_t max_len)
{
    const int mc = max_chunks(max_len);
    return mc < 2 ? 0
                  : (size_t)CU_ATTN_MAX_ROWS * n_head * mc * (head_dim + 2) * sizeof(float) +
                        (size_t)CU_ATTN_MAX_ROWS * n_head * sizeof(unsigned);
}

extern "C" int cu_attention_plain(const float *q, int64_t n_q, int n_head, const void *k,
                                  const void *v, int f16, int block_size, int n_kv_head,
                                  int head_dim, const int32_t *block_tables, int64_t bt_stride,
                                  const int32_t *q_seq, const int32_t *kv_len, int64_t max_len,
                                  void *workspace, float *out, void *stream)
{
    if (head_dim < WARP || head_dim % WARP || head_dim > AP_MAXHD || n_kv_head < 1 ||
        n_head % n_kv_head || block_size < 1 || n_q < 0 || n_q > CU_ATTN_MAX_ROWS || max_len < 1)
        return strata_errf(STRATA_EINVAL,
                           "cu_attention_plain: head_dim %d (a multiple of 32 up to 256), %d heads "
                           "over %d kv heads, blocks of %d, %lld rows (at most %d)",
                           head_dim, n_head, n_kv_head, block_size, (long long)n_q,
                           CU_ATTN_MAX_ROWS);
    if (n_q == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    const int mc = max_chunks(max_len);
    struct ap_args a = {q,          k,
                        v,          n_head,
                        block_size, n_kv_head,
                        head_dim,   block_tables,
                        bt_stride,  q_seq,
                        kv_len,     1.0f / sqrtf((float)head_dim),
                        mc,         (float *)workspace,
                        NULL,       out};
    /* the grid: the rows' heads times enough chunk lanes to fill the GPU, from the row count only
     * (so a captured step replays the same grid for any lengths) */
    const int64_t rhs = n_q * n_head;
    int64_t gy = (AP_CTAS + rhs - 1) / rhs;
    if (gy > mc) gy = mc;
    const dim3 grid((unsigned)rhs, (unsigned)gy);
    /* the counters after the records of CU_ATTN_MAX_ROWS rows */
    if (mc > 1)
        a.cnt = (unsigned *)((float *)workspace +
                             (int64_t)CU_ATTN_MAX_ROWS * n_head * mc * (head_dim + 2));
#define AC(E, V) cu_launch(attn_chunks<E, V>, grid, AP_THREADS, 0, s, a)
#define AC_HD(E)                                                                                   \
    switch (head_dim / WARP) {                                                                     \
    case 1:                                                                                        \
        AC(E, 1);                                                                                  \
        break;                                                                                     \
    case 2:                                                                                        \
        AC(E, 2);                                                                                  \
        break;                                                                                     \
    case 3:                                                                                        \
        AC(E, 3);                                                                                  \
        break;                                                                                     \
    case 4:                                                                                        \
        AC(E, 4);                                                                                  \
        break;                                                                                     \
    case 5:                                                                                        \
        AC(E, 5);                                                                                  \
        break;                                                                                     \
    case 6:                                                                                        \
        AC(E, 6);                                                                                  \
        break;                                                                                     \
    case 7:                                                                                        \
        AC(E, 7);                                                                                  \
        break;                                                                                     \
    default:                                                                                       \
        AC(E, 8);                                                                                  \
        break;                                                                                     \
    }
    if (f16) {
        AC_HD(__half)
    } else {
        AC_HD(float)
    }
#undef AC_HD
#undef AC
    return cu_launch_check();
}
