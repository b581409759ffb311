#include "kernels/cuda/attn.h"
#include "kernels/cuda/common.cuh"

/* Launch constants, tuned for an H200 (132 SMs, 228 KB shared memory and 64K registers per SM).
 * A CTA of AT_WARPS warps streams one kv head of one split; each warp takes AT_TILE keys per step
 * and keeps AT_STAGES steps of K and V rows in flight through cp.async, so the bytes in flight do
 * not cost registers: at head_dim 128 a CTA holds 48 KB of stages and 4 CTAs fit an SM (16 warps,
 * 128 KB requested at any time, well above what 4.8 TB/s needs to cover the HBM latency). */
#define AT_WARPS  4
#define AT_TILE   4 /* keys per warp step: 8 lanes copy each key's rows */
#define AT_STAGES 3
#define AT_SMS    132
#define AT_CWARPS 8 /* warps of the combine kernel */
#define AT_MAXHD  256

/* Everything a partial-attention CTA needs, passed by value. */
struct at_args {
    const float *q;
    int n_head;
    struct cu_kv kv;
    const int32_t *block_tables;
    int64_t bt_stride;
    const int32_t *q_seq, *kv_len;
    float *ws;  /* split records: acc [rec][head_dim], then (m, l) [rec][2] */
    float *out; /* written directly when there is one split */
    int chunk;  /* > 0: a row's splits are its keys in chunks of this many (cu_attention_rows) */
    int stride; /* records per (row, head) in ws */
};

/* cp16 copies 16 bytes global -> shared without passing through registers; nbytes 0 writes zeros
 * and reads nothing (the rows of keys past the range, so their weight 0 never meets garbage). */
__device__ __forceinline__ void cp16(float *dst, const float *src, int nbytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     (unsigned)__cvta_generic_to_shared(dst)),
                 "l"(__cvta_generic_to_global(src)), "r"(nbytes)
                 : "memory");
}

__device__ __forceinline__ void cp_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* cp_wait<N>: all but this thread's N most recent copy groups have landed. */
template <int N> __device__ __forceinline__ void cp_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ldv / stv: VW consecutive floats (VW 1, 2 or 4, aligned to 4 * VW bytes) as one access. */
template <int VW> __device__ __forceinline__ void ldv(float *d, const float *s)
{
    if constexpr (VW == 4) {
        float4 v = *(const float4 *)s;
        d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w;
    } else if constexpr (VW == 2) {
        float2 v = *(const float2 *)s;
        d[0] = v.x, d[1] = v.y;
    } else {
        d[0] = *s;
    }
}

template <int VW> __device__ __forceinline__ void stv(float *d, const float *s)
{
    if constexpr (VW == 4)
        *(float4 *)d = make_float4(s[0], s[1], s[2], s[3]);
    else if constexpr (VW == 2)
        *(float2 *)d = make_float2(s[0], s[1]);
    else
        *d = s[0];
}

/* reduce_scatter<R, R>(s): the sum over the warp's lanes of position L / (32 / R) of the R
 * values s[] (R a power of two <= 32), left in s[0] of lane L. Halving steps over lane bits 4,
 * 3, ..., 5 - log2 R (each lane keeps the low half of its values and adds its partner's high half,
 * which the partner arranged to be the same sums), then a plain butterfly over the lanes that hold
 * the same position. A template recursion, so that every index is a constant and s[] stays in
 * registers. */
template <int R, int N> __device__ __forceinline__ void reduce_scatter(float *s)
{
    if constexpr (N > 1) {
#pragma unroll
        for (int j = 0; j < N / 2; j++)
            s[j] += __shfl_xor_sync(0xffffffffu, s[j + N / 2], WARP / R * (N / 2));
        reduce_scatter<R, N / 2>(s);
    } else {
#pragma unroll
        for (int o = WARP / R / 2; o > 0; o /= 2)
            s[0] += __shfl_xor_sync(0xffffffffu, s[0], o);
    }
}

/* One CTA per (query row, kv head, group of up to GT of the q heads sharing it, split): the
 * attention of those heads over the split's keys, as (max m, sum l, acc = sum p * v) per head in
 * the workspace, or the normalized output when there is one split.
 *
 * Why this shape: decode is a stream of the KV cache, so each K and V row is read from memory once
 * per CTA and used for all GT heads of its GQA group (the q heads stay in registers). A lane owns
 * ND = head_dim / 32 dims of a row (VW-wide vectors at lane + 32 j, so every access of the warp is
 * contiguous and free of bank conflicts) and computes 4 keys x GT heads partial dot products per
 * step. Those R = 4 * GT partial sums are reduced across the warp by a butterfly reduce-scatter:
 * at each halving step a lane keeps one half of its sums and adds its partner's copy of it, so R
 * sums cost R - 1 shuffles instead of 5 R. The selects that step normally needs are folded into
 * the data: lane L computes position i of its sums for (key, head) = i ^ (L >> (3 - log2 GT)),
 * through its own row order (kx) and its own order of q heads in registers (hx), so every lane
 * keeps the low half and sends the high half. Afterwards lane L holds the score of key kx, head hx,
 * so one expf per lane covers the whole step, and the online softmax rescales the accumulators once
 * per step, not per key. The weights go through shared memory to the V pass, where each lane adds
 * p * v for its dims of all GT heads. Keys past the range are zero rows with score -inf.
 * At the end the warps' states merge in shared memory. Heads of a short last group (G not a power
 * of two) run with q = 0 and are not written. */
template <int GT, int ND>
__global__ void __launch_bounds__(AT_WARPS *WARP, GT *ND <= 32 ? 4 : 2)
    attn_partial(struct at_args a)
{
    pdl_enter();
    constexpr int HD = ND * WARP, VW = ND % 4 == 0 ? 4 : ND % 2 == 0 ? 2 : 1, NV = ND / VW;
    constexpr int R = AT_TILE * GT;          /* (key, head) scores of a step */
    constexpr int PW = GT < 4 ? GT : 4;      /* vector width reading GT weights */
    constexpr int STAGE = 2 * AT_TILE * HD;  /* a step's K rows, then its V rows */
    constexpr int SPAN = AT_TILE * AT_WARPS; /* keys per CTA step */
    static_assert(AT_TILE * 8 == WARP, "8 lanes copy each key of a step");
    static_assert(GT * HD + 2 * GT <= AT_STAGES * STAGE, "the merge reuses a warp's stages");
    extern __shared__ float4 at_smem[];

    const struct cu_kv kv = a.kv;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int G = a.n_head / kv.n_kv_head, ngrp = (G + GT - 1) / GT;
    const int64_t row = blockIdx.x / ((unsigned)kv.n_kv_head * ngrp);
    const int kvh = (int)(blockIdx.x / ngrp % kv.n_kv_head), g0 = (int)(blockIdx.x % ngrp) * GT;
    const int len = a.kv_len[row];
    /* the row's splits: gridDim.y of them, or its own chunks (the CTA then takes splits y,
     * y + gridDim.y, ...; those past the row's chunks exit) */
    const int n_split = a.chunk ? (len + a.chunk - 1) / a.chunk : (int)gridDim.y;
    const int stride = a.chunk ? a.stride : n_split;
    /* splits of whole CTA steps, so only the last split of a row ends inside one */
    const int per = a.chunk ? a.chunk : ((len + n_split - 1) / n_split + SPAN - 1) / SPAN * SPAN;
    for (int split = blockIdx.y; split < n_split; split += gridDim.y) {
        if (split > (int)blockIdx.y) __syncthreads(); /* the last split's merge read the stages */
        const int k0 = (int)min((int64_t)len, (int64_t)split * per), k1 = min(len, k0 + per);
        const int ntile = (k1 - k0 + AT_TILE - 1) / AT_TILE;
        const int nmine = ntile > warp ? (ntile - warp + AT_WARPS - 1) / AT_WARPS : 0;
        const int32_t *bt = a.block_tables + (int64_t)a.q_seq[row] * a.bt_stride;

        const int kx = lane >> 3;            /* the key of a step this lane copies and scores */
        const int hx = lane / (8 / GT) % GT; /* the head it scores */
        const int kfirst = k0 + warp * AT_TILE + kx; /* its key in step 0; step i adds i * SPAN */
        float *wsm = (float *)at_smem + warp * AT_STAGES * STAGE;

        /* row_of(i): the pool row (kv head kvh) of this lane's key in step i, -1 past the range.
         * The loop reads it a step ahead, so the block table's latency hides behind a step's
         * compute. */
        auto row_of = [&](int i) -> int64_t {
            const int k = kfirst + i * SPAN;
            if (k >= k1) return -1;
            const int b = k / kv.block_size;
            return ((int64_t)bt[b] * kv.n_kv_head + kvh) * kv.block_size + (k - b * kv.block_size);
        };
        /* Step i's rows go to stage i % AT_STAGES: the lane copies ND 16-byte chunks of its key's K
         * and V rows (8 lanes a row, 128 contiguous bytes per 8 lanes); past the range, zeros. */
        auto issue = [&](int i, int64_t r) {
            float *st = wsm + i % AT_STAGES * STAGE + kx * HD;
            const int64_t off = r < 0 ? 0 : r * HD;
            const int nb = r < 0 ? 0 : 16;
#pragma unroll
            for (int j = 0; j < ND; j++) {
                const int c = 4 * ((lane & 7) + 8 * j);
                cp16(st + c, kv.k + off + c, nb);
                cp16(st + AT_TILE * HD + c, kv.v + off + c, nb);
            }
        };
#pragma unroll
        for (int i = 0; i < AT_STAGES; i++) {
            if (i < nmine) issue(i, row_of(i));
            cp_commit();
        }

        /* q of this lane's dims, scaled, head order permuted by hx (see above) */
        const float scale = 1.0f / sqrtf((float)HD);
        float qp[GT][ND];
#pragma unroll
        for (int hp = 0; hp < GT; hp++) {
            const int g = g0 + (hp ^ hx);
            const float *qr = a.q + (row * a.n_head + kvh * G + g) * HD;
#pragma unroll
            for (int c = 0; c < ND; c++)
                qp[hp][c] = g < G ? qr[VW * (lane + WARP * (c / VW)) + c % VW] * scale : 0.0f;
        }

        float m = -INFINITY, l = 0.0f; /* of head hx */
        float acc[GT][ND];
#pragma unroll
        for (int h = 0; h < GT; h++)
#pragma unroll
            for (int c = 0; c < ND; c++)
                acc[h][c] = 0.0f;

        for (int i = 0; i < nmine; i++) {
            const int64_t next = i + AT_STAGES < nmine ? row_of(i + AT_STAGES) : -1;
            cp_wait<AT_STAGES - 1>();
            __syncwarp();
            float *st = wsm + i % AT_STAGES * STAGE;

            float s[R];
#pragma unroll
            for (int kp = 0; kp < AT_TILE; kp++) {
                float kr[ND];
#pragma unroll
                for (int j = 0; j < NV; j++)
                    ldv<VW>(kr + j * VW, st + (kp ^ kx) * HD + VW * (lane + WARP * j));
#pragma unroll
                for (int hp = 0; hp < GT; hp++) {
                    float d = 0.0f;
#pragma unroll
                    for (int c = 0; c < ND; c++)
                        d = fmaf(qp[hp][c], kr[c], d);
                    s[kp * GT + hp] = d;
                }
            }
            reduce_scatter<R, R>(s);

            /* Online softmax of head hx over the step's 4 keys (lanes xor 8, 16). Key 0 of a step
             * is always in range, so mn is finite; m = -inf on the first step gives corr = 0. */
            const float sc = kfirst + i * SPAN < k1 ? s[0] : -INFINITY;
            float tm = fmaxf(sc, __shfl_xor_sync(0xffffffffu, sc, 8));
            tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 16));
            const float mn = fmaxf(m, tm);
            const float corr = expf(m - mn), p = expf(sc - mn);
            float ps = p + __shfl_xor_sync(0xffffffffu, p, 8);
            ps += __shfl_xor_sync(0xffffffffu, ps, 16);
            l = l * corr + ps;
            m = mn;

            /* weights [key][head] and corrections [head] over the K rows, which are spent */
            __syncwarp();
            st[kx * GT + hx] = p;
            st[R + hx] = corr;
            __syncwarp();
            float cr[GT];
#pragma unroll
            for (int h = 0; h < GT; h += PW)
                ldv<PW>(cr + h, st + R + h);
#pragma unroll
            for (int h = 0; h < GT; h++)
#pragma unroll
                for (int c = 0; c < ND; c++)
                    acc[h][c] *= cr[h];
#pragma unroll
            for (int kk = 0; kk < AT_TILE; kk++) {
                float vr[ND], pk[GT];
#pragma unroll
                for (int j = 0; j < NV; j++)
                    ldv<VW>(vr + j * VW, st + (AT_TILE + kk) * HD + VW * (lane + WARP * j));
#pragma unroll
                for (int h = 0; h < GT; h += PW)
                    ldv<PW>(pk + h, st + kk * GT + h);
#pragma unroll
                for (int h = 0; h < GT; h++)
#pragma unroll
                    for (int c = 0; c < ND; c++)
                        acc[h][c] = fmaf(pk[h], vr[c], acc[h][c]);
            }
            __syncwarp(); /* the stage is free: step i + AT_STAGES refills it */
            if (i + AT_STAGES < nmine) issue(i + AT_STAGES, next);
            cp_commit();
        }

        /* merge the warps: each leaves acc [GT][HD], m [GT], l [GT] in its own stages */
        cp_wait<0>();
        __syncwarp();
#pragma unroll
        for (int h = 0; h < GT; h++)
#pragma unroll
            for (int j = 0; j < NV; j++)
                stv<VW>(wsm + h * HD + VW * (lane + WARP * j), acc[h] + j * VW);
        wsm[GT * HD + hx] = m;
        wsm[GT * HD + GT + hx] = l;
        __syncthreads();

        const float *base = (const float *)at_smem;
        const int64_t n_rec = (int64_t)gridDim.x / ngrp * G * stride; /* n_q * n_head * stride */
        for (int h = 0; h < GT && g0 + h < G; h++) {
            float M = -INFINITY, L = 0.0f, e[AT_WARPS];
#pragma unroll
            for (int w = 0; w < AT_WARPS; w++)
                M = fmaxf(M, base[w * AT_STAGES * STAGE + GT * HD + h]);
#pragma unroll
            for (int w = 0; w < AT_WARPS; w++) {
                const float *ww = base + w * AT_STAGES * STAGE;
                e[w] = ww[GT * HD + h] == -INFINITY ? 0.0f : expf(ww[GT * HD + h] - M);
                L += e[w] * ww[GT * HD + GT + h];
            }
            const int64_t rh = row * a.n_head + kvh * G + g0 + h;
            for (int d = threadIdx.x; d < HD; d += AT_WARPS * WARP) {
                float x = 0.0f;
#pragma unroll
                for (int w = 0; w < AT_WARPS; w++)
                    x += e[w] * base[w * AT_STAGES * STAGE + h * HD + d];
                if (n_split == 1)
                    a.out[rh * HD + d] = L > 0.0f ? x / L : 0.0f;
                else
                    a.ws[(rh * stride + split) * HD + d] = x;
            }
            if (n_split > 1 && threadIdx.x == 0) {
                float2 *ml = (float2 *)(a.ws + n_rec * HD);
                ml[rh * stride + split] = make_float2(M, L);
            }
        }
    }
}

/* One CTA per (row, q head): merge the splits' (m, l, acc) into the output. Warps take splits
 * round-robin, each lane a float4 of acc, so a row of 100+ splits (one sequence of a long context)
 * is read in a few dependent rounds from L2, where the partial kernel just left it. */
__global__ void __launch_bounds__(AT_CWARPS *WARP)
    attn_combine(int hd, int n_split_all, const float *ws, float *out, const int32_t *kv_len,
                 int n_head, int chunk)
{
    pdl_enter();
    __shared__ float sacc[AT_CWARPS][AT_MAXHD], sl[AT_CWARPS], smax[AT_CWARPS];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int64_t rh = blockIdx.x, n_rec = (int64_t)gridDim.x * n_split_all;
    /* chunked rows: the row's own split count, records n_split_all apart; one split wrote out */
    const int n_split = chunk ? (kv_len[rh / n_head] + chunk - 1) / chunk : n_split_all;
    if (n_split < 2) return;
    const float4 *acc = (const float4 *)(ws + rh * n_split_all * hd);
    const float2 *ml = (const float2 *)(ws + n_rec * hd) + rh * n_split_all;
    const int nc = hd / 4; /* float4s of a record */

    float M = -INFINITY;
    for (int s = threadIdx.x; s < n_split; s += AT_CWARPS * WARP)
        M = fmaxf(M, ml[s].x);
    M = warp_max(M);
    if (lane == 0) smax[warp] = M;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < AT_CWARPS; w++)
        M = fmaxf(M, smax[w]);

    float4 x[AT_MAXHD / 4 / WARP];
    float L = 0.0f;
#pragma unroll
    for (int j = 0; j < AT_MAXHD / 4 / WARP; j++)
        x[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (int s = warp; s < n_split; s += AT_CWARPS) {
        const float2 r = ml[s];
        const float e = r.x == -INFINITY ? 0.0f : expf(r.x - M);
        L += e * r.y;
#pragma unroll
        for (int j = 0; j < AT_MAXHD / 4 / WARP; j++) {
            const int c = lane + WARP * j;
            if (c < nc) {
                const float4 v = acc[(int64_t)s * nc + c];
                x[j].x += e * v.x, x[j].y += e * v.y, x[j].z += e * v.z, x[j].w += e * v.w;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < AT_MAXHD / 4 / WARP; j++) {
        const int c = lane + WARP * j;
        if (c < nc) *(float4 *)&sacc[warp][4 * c] = x[j];
    }
    if (lane == 0) sl[warp] = L;
    __syncthreads();
    L = 0.0f;
#pragma unroll
    for (int w = 0; w < AT_CWARPS; w++)
        L += sl[w];
    for (int d = threadIdx.x; d < hd; d += AT_CWARPS * WARP) {
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < AT_CWARPS; w++)
            a += sacc[w][d];
        out[rh * hd + d] = L > 0.0f ? a / L : 0.0f;
    }
}

extern "C" size_t cu_attn_workspace_bytes(int64_t n_q, int n_head, int head_dim, int n_split)
{
    return (size_t)n_q * n_head * n_split * (head_dim + 2) * sizeof(float);
}

extern "C" int cu_attn_splits(int64_t max_len, int64_t n_q, int n_head)
{
    /* The partial kernel runs n_q * n_kv_head CTAs per split. The kv head count is not known here,
     * so count GQA groups of 8 q heads (MHA then over-splits, which costs only workspace traffic).
     * Fill the 132 SMs 4 CTAs deep, the kernel's occupancy at head_dim <= 128, and no more: one
     * wave of equal CTAs ends together. Each split keeps >= 256 keys to amortize its start (the
     * dependent reads of kv_len, the block table, then the first rows) and its workspace record. */
    if (max_len < 1024) return 1;
    int64_t ctas = n_q * (n_head >= 8 ? n_head / 8 : 1);
    int64_t s = AT_SMS * 4 / ctas;
    if (s > max_len / 256) s = max_len / 256;
    return s < 1 ? 1 : (int)s;
}

template <int GT, int ND>
static int attn_launch(const struct at_args *a, int64_t n_q, int n_split, cudaStream_t s)
{
    const int ngrp = (a->n_head / a->kv.n_kv_head + GT - 1) / GT;
    const size_t smem = (size_t)AT_WARPS * AT_STAGES * 2 * AT_TILE * ND * WARP * sizeof(float);
    int rv;
    /* set outside a stream capture (a captured step ran once uncaptured first: the attribute
     * is already set) */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(s, &cs);
    if (smem > 48 * 1024 && cs == cudaStreamCaptureStatusNone &&
        (rv = cu_err(cudaFuncSetAttribute(
             attn_partial<GT, ND>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem))) != 0)
        return rv;
    dim3 grid((unsigned)(n_q * a->kv.n_kv_head * ngrp), (unsigned)n_split);
    cu_launch(attn_partial<GT, ND>, grid, AT_WARPS * WARP, smem, s, *a);
    return 0;
}

template <int GT>
static int attn_launch_hd(const struct at_args *a, int64_t n_q, int n_split, cudaStream_t s)
{
    typedef int (*launch_fn)(const struct at_args *, int64_t, int, cudaStream_t);
    static const launch_fn by_nd[] = {attn_launch<GT, 1>, attn_launch<GT, 2>, attn_launch<GT, 3>,
                                      attn_launch<GT, 4>, attn_launch<GT, 5>, attn_launch<GT, 6>,
                                      attn_launch<GT, 7>, attn_launch<GT, 8>};
    return by_nd[a->kv.head_dim / WARP - 1](a, n_q, n_split, s);
}

extern "C" int cu_attention(const float *q, int64_t n_q, int n_head, const struct cu_kv *kv,
                            const int32_t *block_tables, int64_t bt_stride, const int32_t *q_seq,
                            const int32_t *kv_len, int n_split, void *workspace, float *out,
                            void *stream)
{
    if (kv->head_dim % WARP || kv->head_dim > AT_MAXHD || kv->head_dim < WARP ||
        kv->n_kv_head < 1 || n_head % kv->n_kv_head || n_split < 1 || n_split > 65535)
        return strata_errf(STRATA_EINVAL,
                           "cu_attention: head_dim %d (multiple of 32, <= 256), "
                           "%d heads over %d kv heads, %d splits (1 to 65535)",
                           kv->head_dim, n_head, kv->n_kv_head, n_split);
    if (n_q == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    const struct at_args a = {
        q, n_head, *kv, block_tables, bt_stride, q_seq, kv_len, (float *)workspace, out, 0, 0};
    /* heads per CTA: the GQA group rounded up to a power of two, at most 8 (larger groups take
     * several CTAs, each reading the kv head again) */
    const int g = n_head / kv->n_kv_head;
    int rv = g == 1   ? attn_launch_hd<1>(&a, n_q, n_split, s)
             : g == 2 ? attn_launch_hd<2>(&a, n_q, n_split, s)
             : g <= 4 ? attn_launch_hd<4>(&a, n_q, n_split, s)
                      : attn_launch_hd<8>(&a, n_q, n_split, s);
    if (rv != 0) return rv;
    if (n_split > 1)
        cu_launch(attn_combine, (unsigned)(n_q * n_head), AT_CWARPS * WARP, 0, s, kv->head_dim,
                  n_split, (const float *)workspace, out, kv_len, n_head, 0);
    return cu_launch_check();
}

extern "C" size_t cu_attn_rows_workspace_bytes(int n_head, int head_dim, int64_t max_len)
{
    const int64_t mc = (max_len + CU_ATTN_ROW_CHUNK - 1) / CU_ATTN_ROW_CHUNK;
    return mc < 2 ? 0 : (size_t)CU_ATTN_ROWS_MAX * n_head * mc * (head_dim + 2) * sizeof(float);
}

extern "C" int cu_attention_rows(const float *q, int64_t n_q, int n_head, const struct cu_kv *kv,
                                 const int32_t *block_tables, int64_t bt_stride,
                                 const int32_t *q_seq, const int32_t *kv_len, int64_t max_len,
                                 void *workspace, float *out, void *stream)
{
    if (kv->head_dim % WARP || kv->head_dim > AT_MAXHD || kv->head_dim < WARP ||
        kv->n_kv_head < 1 || n_head % kv->n_kv_head || n_q < 0 || n_q > CU_ATTN_ROWS_MAX ||
        max_len < 1)
        return strata_errf(STRATA_EINVAL,
                           "cu_attention_rows: head_dim %d (multiple of 32, <= 256), %d heads over "
                           "%d kv heads, %lld rows (at most %d)",
                           kv->head_dim, n_head, kv->n_kv_head, (long long)n_q, CU_ATTN_ROWS_MAX);
    if (n_q == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    const int mc = (int)((max_len + CU_ATTN_ROW_CHUNK - 1) / CU_ATTN_ROW_CHUNK);
    const struct at_args a = {q,         n_head,
                              *kv,       block_tables,
                              bt_stride, q_seq,
                              kv_len,    (float *)workspace,
                              out,       CU_ATTN_ROW_CHUNK,
                              mc};
    const int g = n_head / kv->n_kv_head;
    const int gt = g == 1 ? 1 : g == 2 ? 2 : g <= 4 ? 4 : 8;
    /* chunk lanes from the row count only (a captured step keeps its grid): 4 CTAs an SM */
    const int64_t ctas = n_q * kv->n_kv_head * ((g + gt - 1) / gt);
    int64_t gy = (AT_SMS * 4 + ctas - 1) / ctas;
    if (gy > mc) gy = mc;
    int rv = gt == 1   ? attn_launch_hd<1>(&a, n_q, (int)gy, s)
             : gt == 2 ? attn_launch_hd<2>(&a, n_q, (int)gy, s)
             : gt == 4 ? attn_launch_hd<4>(&a, n_q, (int)gy, s)
                       : attn_launch_hd<8>(&a, n_q, (int)gy, s);
    if (rv != 0) return rv;
    if (mc > 1)
        cu_launch(attn_combine, (unsigned)(n_q * n_head), AT_CWARPS * WARP, 0, s, kv->head_dim, mc,
                  (const float *)workspace, out, kv_len, n_head, CU_ATTN_ROW_CHUNK);
    return cu_launch_check();
}
