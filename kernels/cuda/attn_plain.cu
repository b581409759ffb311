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

/* ---- prompt chunks: a tile of rows and heads over each chunk of keys ------------------------ */

#define AT_Q       64 /* queries (row, q head) of a CTA: 64 / G rows times a kv head's G heads */
#define AT_WARPS   8
#define AT_THREADS (AT_WARPS * WARP)
#define AT_QPW     (AT_Q / AT_WARPS)

struct at_args {
    const float *q;
    const void *k, *v;
    int n_q, n_head, bs, n_kv_head;
    const int32_t *bt;
    int64_t bt_stride;
    const int32_t *q_seq, *kv_len;
    float scale;
    float *out;
};

/* the tile's queries, one chunk's keys and values. K rows have 16 bytes of pad, so a quarter
 * warp's 16-byte loads of 8 keys fall on distinct banks. */
template <typename E, int VPL> struct at_smem {
    static constexpr int HD = VPL * WARP, KLD = HD + 16 / (int)sizeof(E);
    float qs[AT_Q][HD];
    E ks[CU_ATTN_CHUNK][KLD];
    E vs[CU_ATTN_CHUNK][HD];
    int rseq[AT_Q], rlen[AT_Q];
};

/* at_load: keys (and values) k0 .. k0 + n - 1 of kv head g of the sequence with block table tab */
template <typename E, int VPL>
__device__ __forceinline__ void at_load(at_smem<E, VPL> &sm, const struct at_args &a,
                                        const int32_t *tab, int g, int k0, int n, bool with_v)
{
    constexpr int HD = VPL * WARP, V16 = HD * (int)sizeof(E) / 16;
    const E *kp = (const E *)a.k, *vp = (const E *)a.v;
    for (int i = threadIdx.x; i < n * V16; i += AT_THREADS) {
        const int j = i / V16, c = i % V16, p = k0 + j;
        const int64_t off = (((int64_t)tab[p / a.bs] * a.n_kv_head + g) * a.bs + p % a.bs) * HD;
        ((uint4 *)&sm.ks[j][0])[c] = ((const uint4 *)(kp + off))[c];
        if (with_v) ((uint4 *)&sm.vs[j][0])[c] = ((const uint4 *)(vp + off))[c];
    }
}

/* at_scores: this lane's key of each quarter of the chunk (32 w + lane, -inf past nk) scored
 * against query row qr as attn_chunks scores a key, and their max */
template <typename E, int VPL>
__device__ __forceinline__ float at_scores(const at_smem<E, VPL> &sm, const float *qr, int nk,
                                           float scale, float s[4])
{
    constexpr int HD = VPL * WARP;
    const int lane = threadIdx.x % WARP;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const int j = 32 * w + lane;
        s[w] = -INFINITY;
        if (j < nk) {
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < HD; d += 8)
                dot = dot8(qr + d, &sm.ks[j][d], dot);
            s[w] = dot * scale;
        }
        m = fmaxf(m, warp_max(s[w]));
    }
    return m;
}

/* CTA (x, g): rows AT_Q / G x .. of the call, kv head g's G q heads; warp w the queries w, w + 8,
 * ... (query i: row i / G, head g G + i % G). For each sequence among the rows, two passes over
 * its chunks of keys (the tile's longest row's): the first takes each query's max over its keys
 * (the max of attn_chunks' chunk maxima: merge_row's M); the second recomputes each chunk's
 * record as attn_chunks does (scores, max, p = expf(s - m), the sum by warp butterflies and then
 * quarters in order, p * v by quarters in key order, the quarters added in order) and folds it
 * into the query's sums in chunk order as merge_row does (or, for a row of one chunk, writes x / l
 * as attn_chunks does): each output the same bits as cu_attention_plain's. */
template <typename E, int VPL>
__global__ void __launch_bounds__(AT_THREADS) attn_tiles(struct at_args a)
{
    pdl_enter();
    using S = at_smem<E, VPL>;
    constexpr int HD = VPL * WARP;
    extern __shared__ __align__(16) uint8_t at_raw[];
    S &sm = *(S *)at_raw;
    const int G = a.n_head / a.n_kv_head, rpt = AT_Q / G, g = blockIdx.y;
    const int row0 = blockIdx.x * rpt, nr = min(rpt, a.n_q - row0);
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    for (int i = threadIdx.x; i < nr * G * HD; i += AT_THREADS) {
        const int qi = i / HD, d = i % HD;
        sm.qs[qi][d] = a.q[((int64_t)(row0 + qi / G) * a.n_head + g * G + qi % G) * HD + d];
    }
    for (int r = threadIdx.x; r < nr; r += AT_THREADS)
        sm.rseq[r] = a.q_seq[row0 + r], sm.rlen[r] = a.kv_len[row0 + r];
    __syncthreads();
    for (int si = 0; si < nr; si++) {
        const int seq = sm.rseq[si];
        bool seen = false;
        int maxlen = 0;
        for (int r = 0; r < nr; r++) {
            if (sm.rseq[r] != seq) continue;
            seen |= r < si;
            maxlen = max(maxlen, sm.rlen[r]);
        }
        if (seen) continue; /* this sequence's rows are done */
        const int32_t *tab = a.bt + (int64_t)seq * a.bt_stride;
        const int nch = (maxlen + CU_ATTN_CHUNK - 1) / CU_ATTN_CHUNK;
        float M[AT_QPW], L[AT_QPW], X[AT_QPW][VPL];
#pragma unroll
        for (int u = 0; u < AT_QPW; u++) {
            M[u] = -INFINITY, L[u] = 0.0f;
#pragma unroll
            for (int i = 0; i < VPL; i++)
                X[u][i] = 0.0f;
        }
        for (int pass = 0; pass < 2; pass++)
            for (int ch = 0; ch < nch; ch++) {
                const int k0 = ch * CU_ATTN_CHUNK;
                __syncthreads(); /* the previous chunk's keys are read */
                at_load<E, VPL>(sm, a, tab, g, k0, min(CU_ATTN_CHUNK, maxlen - k0), pass == 1);
                __syncthreads();
#pragma unroll
                for (int u = 0; u < AT_QPW; u++) {
                    const int qi = warp + AT_WARPS * u, r = qi / G;
                    if (qi >= nr * G || sm.rseq[r] != seq || sm.rlen[r] <= k0) continue;
                    const int len = sm.rlen[r], nk = min(CU_ATTN_CHUNK, len - k0);
                    float s[4];
                    const float m = at_scores<E, VPL>(sm, sm.qs[qi], nk, a.scale, s);
                    if (pass == 0) {
                        M[u] = fmaxf(M[u], m);
                        continue;
                    }
                    float p[4], l = 0.0f, x[VPL];
#pragma unroll
                    for (int w = 0; w < 4; w++) {
                        p[w] = 32 * w + lane < nk ? expf(s[w] - m) : 0.0f;
                        const float lw = warp_sum(p[w]);
                        l = w ? l + lw : lw;
                    }
#pragma unroll
                    for (int w = 0; w < 4; w++) {
                        float acc[VPL];
#pragma unroll
                        for (int i = 0; i < VPL; i++)
                            acc[i] = 0.0f;
                        const int ke = min(nk - 32 * w, WARP);
                        for (int jj = 0; jj < ke; jj++) {
                            const float pj = __shfl_sync(0xffffffffu, p[w], jj);
                            float v[VPL];
                            ldv<VPL>(&sm.vs[32 * w + jj][lane * VPL], v);
#pragma unroll
                            for (int i = 0; i < VPL; i++)
                                acc[i] = fmaf(pj, v[i], acc[i]);
                        }
#pragma unroll
                        for (int i = 0; i < VPL; i++)
                            x[i] = w ? x[i] + acc[i] : acc[i];
                    }
                    float *o = a.out + ((int64_t)(row0 + r) * a.n_head + g * G + qi % G) * HD;
                    if (len <= CU_ATTN_CHUNK) {
#pragma unroll
                        for (int i = 0; i < VPL; i++)
                            o[lane * VPL + i] = x[i] / l;
                        continue;
                    }
                    const float e = expf(m - M[u]);
                    L[u] = fmaf(e, l, L[u]);
#pragma unroll
                    for (int i = 0; i < VPL; i++)
                        X[u][i] = fmaf(e, x[i], X[u][i]);
                    if (ch == (len - 1) / CU_ATTN_CHUNK) /* the row's last chunk */
#pragma unroll
                        for (int i = 0; i < VPL; i++)
                            o[lane * VPL + i] = X[u][i] / L[u];
                }
            }
    }
}

template <typename E, int VPL> static size_t at_bytes(void)
{
    return sizeof(at_smem<E, VPL>);
}

static size_t at_smem_bytes(int f16, int head_dim)
{
#define AB(V) (f16 ? at_bytes<__half, V>() : at_bytes<float, V>())
    switch (head_dim / WARP) {
    case 1: return AB(1);
    case 2: return AB(2);
    case 3: return AB(3);
    case 4: return AB(4);
    case 5: return AB(5);
    case 6: return AB(6);
    case 7: return AB(7);
    default: return AB(8);
    }
#undef AB
}

extern "C" bool cu_attn_tiles_ok(int n_head, int n_kv_head, int head_dim, int f16)
{
    return head_dim >= WARP && head_dim % WARP == 0 && head_dim <= AP_MAXHD && n_kv_head >= 1 &&
           n_head % n_kv_head == 0 && AT_Q % (n_head / n_kv_head) == 0 &&
           at_smem_bytes(f16, head_dim) <= 227 * 1024;
}

template <typename E, int VPL>
static void at_launch(dim3 grid, const struct at_args &a, cudaStream_t s)
{
    static const bool attr = cudaFuncSetAttribute(attn_tiles<E, VPL>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)sizeof(at_smem<E, VPL>)) == cudaSuccess;
    (void)attr;
    cu_launch(attn_tiles<E, VPL>, grid, AT_THREADS, sizeof(at_smem<E, VPL>), s, a);
}

extern "C" int cu_attention_tiles(const float *q, int64_t n_q, int n_head, const void *k,
                                  const void *v, int f16, int block_size, int n_kv_head,
                                  int head_dim, const int32_t *block_tables, int64_t bt_stride,
                                  const int32_t *q_seq, const int32_t *kv_len, float *out,
                                  void *stream)
{
    if (!cu_attn_tiles_ok(n_head, n_kv_head, head_dim, f16) || block_size < 1 || n_q < 0 ||
        n_q > INT32_MAX)
        return strata_errf(STRATA_EINVAL,
                           "cu_attention_tiles: head_dim %d, %d heads over %d kv heads (a divisor "
                           "of %d a kv head), blocks of %d, %lld rows",
                           head_dim, n_head, n_kv_head, AT_Q, block_size, (long long)n_q);
    if (n_q == 0) return 0;
    const int rpt = AT_Q / (n_head / n_kv_head);
    const struct at_args a = {q,        k,           v,
                              (int)n_q, n_head,      block_size,
                              n_kv_head, block_tables, bt_stride,
                              q_seq,    kv_len,      1.0f / sqrtf((float)head_dim),
                              out};
    const dim3 grid((unsigned)((n_q + rpt - 1) / rpt), (unsigned)n_kv_head);
    cudaStream_t s = (cudaStream_t)stream;
#define AT(E)                                                                                      \
    switch (head_dim / WARP) {                                                                     \
    case 1: at_launch<E, 1>(grid, a, s); break;                                                    \
    case 2: at_launch<E, 2>(grid, a, s); break;                                                    \
    case 3: at_launch<E, 3>(grid, a, s); break;                                                    \
    case 4: at_launch<E, 4>(grid, a, s); break;                                                    \
    case 5: at_launch<E, 5>(grid, a, s); break;                                                    \
    case 6: at_launch<E, 6>(grid, a, s); break;                                                    \
    case 7: at_launch<E, 7>(grid, a, s); break;                                                    \
    default: at_launch<E, 8>(grid, a, s); break;                                                   \
    }
    if (f16) {
        AT(__half)
    } else {
        AT(float)
    }
#undef AT
    return cu_launch_check();
}
