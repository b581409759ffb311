/* mmq.cuh — the bit-exact tile of a prompt chunk's products on the int8 tensor cores, shared by
 * cu_matmul_q (matmul.cu) and moe_mma (moe_mma.cu).
 *
 * mmq<T, BN>::run: one CTA of MMQ_THREADS threads (4 warps of 16 rows) computes rows r0 .. r0 + 63
 * of a weight matrix of type T times BN activation rows (cu_quantize_acts rows, xrow[j] in shared
 * memory, the first nv of them present), block after block of the row, in qdot_ref's arithmetic:
 * per block each (row, token, sub-block) gets its exact int32 dot from mma.sync (m16n8k32 for
 * 32-element sub-blocks, m16n8k16 for the 16-element sub-blocks of Q2_K, Q3_K, Q6_K), the
 * sub-blocks' scales and mins are applied in integers, and the block's float term
 *   (dx * d) * isum - (dx * dmin) * msum
 * is added to the (row, token) sum with one IEEE step each: the same bits as qdot_ref and
 * cu_matvec whatever the tile. The pipeline is two stages deep: while the tensor cores take block
 * kb from shared memory, block kb + 1's activation blocks arrive by cp.async and its weights by
 * wide loads into registers (16-byte loads for Q4_K and Q5_K, word loads for Q6_K and Q8_0, whose
 * blocks are only 2-byte aligned; element by element through qdec.cuh for the other types), which
 * are decoded to int8 and stored into the other stage after the MMAs. Empty 8-token column tiles
 * (past nv) take no MMA. smem is mmq<T, BN>::SMEM bytes of dynamic shared memory (16-byte
 * aligned); weights must be 16-byte aligned. acc[n][i] is the sum of row r0 + row(i) and token
 * col(n, i).
 */
#ifndef STRATA_CUDA_MMQ_CUH
#define STRATA_CUDA_MMQ_CUH

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/qdec.cuh"

#define MMQ_BM      64
#define MMQ_THREADS 128

/* mmq_cp16 / mmq_cp4: cp.async of 16 / 4 bytes to shared dst, zeros when !ok (src then unread) */
__device__ __forceinline__ void mmq_cp16(void *dst, const void *src, bool ok)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(ok ? 16 : 0));
}

__device__ __forceinline__ void mmq_cp4(void *dst, const void *src, bool ok)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
                 "r"(ok ? 4 : 0));
}

/* mmq_ldw2: N words from a 2-byte aligned address, by aligned word loads and funnel shifts (when p
 * is not 4-byte aligned, the last two bytes by a 2-byte load: nothing past the range is read) */
template <int N> __device__ __forceinline__ void mmq_ldw2(const uint8_t *p, uint32_t *o)
{
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const int sh = (int)((uintptr_t)p & 2) * 8;
    uint32_t w[N + 1];
#pragma unroll
    for (int j = 0; j < N; j++)
        w[j] = __ldg(a + j);
    w[N] = sh ? __ldg((const uint16_t *)(a + N)) : 0u;
#pragma unroll
    for (int j = 0; j < N; j++)
        o[j] = __funnelshift_r(w[j], w[j + 1], sh);
}

/* wdec<T>: a block's elements as int8 words (4 elements each, qdec's integers) in NITEM items of
 * WORDS words: load(b, it, raw) reads item it's RAW words of the block at b, dec(raw, it, o)
 * makes its words, elements 4 * WORDS * it onward. Any type: a word at a time through qdec. */
template <int T> struct wdec {
    static constexpr int NITEM = qt<T>::blck / 4, RAW = 1, WORDS = 1;
    __device__ static void load(const uint8_t *b, int it, uint32_t *raw)
    {
        uint32_t v = 0;
#pragma unroll
        for (int j = 0; j < 4; j++)
            v |= (uint32_t)(uint8_t)qdec<T>::q(b, 4 * it + j) << (8 * j);
        raw[0] = v;
    }
    __device__ static void dec(const uint32_t *raw, int, uint32_t *o)
    {
        o[0] = raw[0];
    }
};

/* Q8_0: the 32 int8 at b + 2 */
template <> struct wdec<QT_Q8_0> {
    static constexpr int NITEM = 1, RAW = 8, WORDS = 8;
    __device__ static void load(const uint8_t *b, int, uint32_t *raw)
    {
        mmq_ldw2<8>(b + 2, raw);
    }
    __device__ static void dec(const uint32_t *raw, int, uint32_t *o)
    {
#pragma unroll
        for (int i = 0; i < 8; i++)
            o[i] = raw[i];
    }
};

/* Q4_K: item it = elements 64 it .. 64 it + 63, the low then the high nibbles of qs[32 it ..] */
template <> struct wdec<QT_Q4_K> {
    static constexpr int NITEM = 4, RAW = 8, WORDS = 16;
    __device__ static void load(const uint8_t *b, int it, uint32_t *raw)
    {
        const uint4 *q = (const uint4 *)(b + 16 + 32 * it);
        const uint4 u0 = __ldg(q), u1 = __ldg(q + 1);
        raw[0] = u0.x, raw[1] = u0.y, raw[2] = u0.z, raw[3] = u0.w;
        raw[4] = u1.x, raw[5] = u1.y, raw[6] = u1.z, raw[7] = u1.w;
    }
    __device__ static void dec(const uint32_t *raw, int, uint32_t *o)
    {
#pragma unroll
        for (int i = 0; i < 8; i++)
            o[i] = raw[i] & 0x0F0F0F0Fu, o[8 + i] = (raw[i] >> 4) & 0x0F0F0F0Fu;
    }
};

/* Q5_K: Q4_K's nibbles and bit 2 it (low) or 2 it + 1 (high) of qh[32] as bit 4 */
template <> struct wdec<QT_Q5_K> {
    static constexpr int NITEM = 4, RAW = 16, WORDS = 16;
    __device__ static void load(const uint8_t *b, int it, uint32_t *raw)
    {
        const uint4 *q = (const uint4 *)(b + 48 + 32 * it), *h = (const uint4 *)(b + 16);
        const uint4 u0 = __ldg(q), u1 = __ldg(q + 1), h0 = __ldg(h), h1 = __ldg(h + 1);
        raw[0] = u0.x, raw[1] = u0.y, raw[2] = u0.z, raw[3] = u0.w;
        raw[4] = u1.x, raw[5] = u1.y, raw[6] = u1.z, raw[7] = u1.w;
        raw[8] = h0.x, raw[9] = h0.y, raw[10] = h0.z, raw[11] = h0.w;
        raw[12] = h1.x, raw[13] = h1.y, raw[14] = h1.z, raw[15] = h1.w;
    }
    __device__ static void dec(const uint32_t *raw, int it, uint32_t *o)
    {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            o[i] = (raw[i] & 0x0F0F0F0Fu) | ((raw[8 + i] >> (2 * it)) & 0x01010101u) << 4;
            o[8 + i] = ((raw[i] >> 4) & 0x0F0F0F0Fu) | ((raw[8 + i] >> (2 * it + 1)) & 0x01010101u)
                                                           << 4;
        }
    }
};

/* Q6_K: item it = half it (128 elements): ql[64 it ..] and qh[32 it ..]; quarter k of the half
 * takes the low (k < 2) or high nibbles of ql's 32-byte row k & 1 and bits 2k, 2k + 1 of qh, - 32
 */
template <> struct wdec<QT_Q6_K> {
    static constexpr int NITEM = 2, RAW = 24, WORDS = 32;
    __device__ static void load(const uint8_t *b, int it, uint32_t *raw)
    {
        mmq_ldw2<16>(b + 64 * it, raw);
        mmq_ldw2<8>(b + 128 + 32 * it, raw + 16);
    }
    __device__ static void dec(const uint32_t *raw, int, uint32_t *o)
    {
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int l = 0; l < 8; l++) {
                const uint32_t q = raw[(k & 1) * 8 + l];
                const uint32_t lo = (k < 2 ? q : q >> 4) & 0x0F0F0F0Fu;
                const uint32_t hi = ((raw[16 + l] >> (2 * k)) & 0x03030303u) << 4;
                o[8 * k + l] = __vsub4(lo | hi, 0x20202020u);
            }
    }
};

template <int T, int BN> struct mmq {
    using D = qdec<T>;
    using W = wdec<T>;
    static constexpr int BLK = qt<T>::blck, BYTES = qt<T>::bytes, SUB = D::SUB, NSUB = BLK / SUB;
    static constexpr int NT = BN / 8,
                         LD = BLK + 16;   /* row pitch: fragment loads on distinct banks */
    static constexpr int NSUM = BLK / 16; /* the activations' int16 sums per block */
    static constexpr int NI = MMQ_BM * W::NITEM, IPT = (NI + MMQ_THREADS - 1) / MMQ_THREADS;
    static constexpr int NS = MMQ_BM * NSUB, SPT = (NS + MMQ_THREADS - 1) / MMQ_THREADS;
    struct __align__(16) stage
    {
        int8_t wq[MMQ_BM][LD];
        int8_t xq[BN][LD];
        int16_t xsum[BN][NSUM];
        float wd[MMQ_BM], wdm[MMQ_BM], xd[BN];
        int8_t wsc[MMQ_BM][NSUB], wmn[MMQ_BM][NSUB];
    };
    static constexpr size_t SMEM = 2 * sizeof(stage);

    /* the weights of block kb in registers: raw words, scales and mins, d and dmin */
    struct wregs {
        uint32_t raw[IPT][W::RAW];
        int sc[SPT], mn[SPT];
        float d, dmin;
    };

    __device__ static int row(int i)
    {
        return threadIdx.x / WARP * 16 + (threadIdx.x & 31) / 4 + (i >> 1) * 8;
    }
    __device__ static int col(int n, int i)
    {
        return 8 * n + 2 * (threadIdx.x & 3) + (i & 1);
    }

    __device__ static void load_x(stage &st, const uint8_t *const *xrow, int ncols, int kb,
                                  const uint8_t *dummy)
    {
        for (int i = threadIdx.x; i < BN * (BLK / 16); i += MMQ_THREADS) {
            const int j = i / (BLK / 16), c = i % (BLK / 16);
            const uint8_t *p = xrow[j];
            mmq_cp16(&st.xq[j][16 * c], p ? p + (int64_t)kb * BLK + 16 * c : dummy, p != NULL);
        }
        if constexpr (NSUM * 2 % 16 == 0) {
            for (int i = threadIdx.x; i < BN * (NSUM / 8); i += MMQ_THREADS) {
                const int j = i / (NSUM / 8), c = i % (NSUM / 8);
                const uint8_t *p = xrow[j];
                mmq_cp16(&st.xsum[j][8 * c],
                         p ? p + ncols + (int64_t)kb * NSUM * 2 + 16 * c : dummy, p != NULL);
            }
        } else {
            for (int i = threadIdx.x; i < BN * (NSUM / 2); i += MMQ_THREADS) {
                const int j = i / (NSUM / 2), c = i % (NSUM / 2);
                const uint8_t *p = xrow[j];
                mmq_cp4(&st.xsum[j][2 * c], p ? p + ncols + (int64_t)kb * NSUM * 2 + 4 * c : dummy,
                        p != NULL);
            }
        }
        for (int j = threadIdx.x; j < BN; j += MMQ_THREADS) {
            const uint8_t *p = xrow[j];
            mmq_cp4(&st.xd[j], p ? p + ncols + ncols / 8 + 4 * kb : dummy, p != NULL);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    }

    __device__ static void load_w(wregs &g, const uint8_t *w, int64_t row_bytes, int nrows, int r0,
                                  int kb)
    {
#pragma unroll
        for (int j = 0; j < IPT; j++) {
            const int i = threadIdx.x + MMQ_THREADS * j, r = i / W::NITEM;
            if ((NI % MMQ_THREADS == 0 || i < NI) && r0 + r < nrows)
                W::load(w + (int64_t)(r0 + r) * row_bytes + (int64_t)kb * BYTES, i % W::NITEM,
                        g.raw[j]);
            else
#pragma unroll
                for (int u = 0; u < W::RAW; u++)
                    g.raw[j][u] = 0;
        }
#pragma unroll
        for (int j = 0; j < SPT; j++) {
            const int i = threadIdx.x + MMQ_THREADS * j, r = i / NSUB;
            g.sc[j] = 0, g.mn[j] = 0;
            if ((NS % MMQ_THREADS == 0 || i < NS) && r0 + r < nrows)
                D::scales(w + (int64_t)(r0 + r) * row_bytes + (int64_t)kb * BYTES, i % NSUB,
                          &g.sc[j], &g.mn[j]);
        }
        g.d = 0.0f, g.dmin = 0.0f;
        if (threadIdx.x < MMQ_BM && r0 + (int)threadIdx.x < nrows)
            D::head(w + (int64_t)(r0 + threadIdx.x) * row_bytes + (int64_t)kb * BYTES, &g.d,
                    &g.dmin);
    }

    __device__ static void store_w(stage &st, const wregs &g)
    {
#pragma unroll
        for (int j = 0; j < IPT; j++) {
            const int i = threadIdx.x + MMQ_THREADS * j, r = i / W::NITEM, it = i % W::NITEM;
            if (NI % MMQ_THREADS == 0 || i < NI) {
                uint32_t o[W::WORDS];
                W::dec(g.raw[j], it, o);
                uint32_t *dst = (uint32_t *)&st.wq[r][4 * W::WORDS * it];
                if constexpr (W::WORDS % 4 == 0)
#pragma unroll
                    for (int u = 0; u < W::WORDS; u += 4)
                        *(uint4 *)(dst + u) = make_uint4(o[u], o[u + 1], o[u + 2], o[u + 3]);
                else
#pragma unroll
                    for (int u = 0; u < W::WORDS; u++)
                        dst[u] = o[u];
            }
        }
#pragma unroll
        for (int j = 0; j < SPT; j++) {
            const int i = threadIdx.x + MMQ_THREADS * j;
            if (NS % MMQ_THREADS == 0 || i < NS)
                st.wsc[i / NSUB][i % NSUB] = (int8_t)g.sc[j],
                                     st.wmn[i / NSUB][i % NSUB] = (int8_t)g.mn[j];
        }
        if (threadIdx.x < MMQ_BM) st.wd[threadIdx.x] = g.d, st.wdm[threadIdx.x] = g.dmin;
    }

    /* one block from stage st into acc; ntu: the 8-token column tiles with a token */
    __device__ static void compute(const stage &st, int ntu, float (&acc)[NT][4])
    {
        const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
        const int ra = threadIdx.x / WARP * 16 + g, rb = ra + 8;
        int isum[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                isum[n][i] = 0;
#pragma unroll
        for (int s = 0; s < NSUB; s++) {
            const int k0 = s * SUB + 4 * tq;
            const int sc0 = st.wsc[ra][s], sc1 = st.wsc[rb][s];
            uint32_t a[4];
            a[0] = *(const uint32_t *)&st.wq[ra][k0];
            a[1] = *(const uint32_t *)&st.wq[rb][k0];
            if constexpr (SUB == 32) {
                a[2] = *(const uint32_t *)&st.wq[ra][k0 + 16];
                a[3] = *(const uint32_t *)&st.wq[rb][k0 + 16];
            }
#pragma unroll
            for (int n = 0; n < NT; n++) {
                if (n >= ntu) break;
                int c[4];
                const int8_t *xr = st.xq[8 * n + g];
                if constexpr (SUB == 32) {
                    const uint32_t b[2] = {*(const uint32_t *)(xr + k0),
                                           *(const uint32_t *)(xr + k0 + 16)};
                    mma_k32(a, b, c);
                } else {
                    mma_k16(a, *(const uint32_t *)(xr + k0), c);
                }
                isum[n][0] += sc0 * c[0], isum[n][1] += sc0 * c[1];
                isum[n][2] += sc1 * c[2], isum[n][3] += sc1 * c[3];
            }
        }
        int mn0[D::MINS ? NSUB : 1], mn1[D::MINS ? NSUB : 1];
        if constexpr (D::MINS)
#pragma unroll
            for (int s = 0; s < NSUB; s++)
                mn0[s] = st.wmn[ra][s], mn1[s] = st.wmn[rb][s];
        const float d0 = st.wd[ra], d1 = st.wd[rb], m0 = st.wdm[ra], m1 = st.wdm[rb];
#pragma unroll
        for (int n = 0; n < NT; n++) {
            if (n >= ntu) break;
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int t = 8 * n + 2 * tq + c;
                int ms0 = 0, ms1 = 0;
                if constexpr (D::MINS)
#pragma unroll
                    for (int s = 0; s < NSUB; s++) {
                        int xs = 0;
#pragma unroll
                        for (int u = 0; u < SUB / 16; u++)
                            xs += st.xsum[t][s * (SUB / 16) + u];
                        ms0 += mn0[s] * xs, ms1 += mn1[s] * xs;
                    }
                const float dx = st.xd[t];
                acc[n][c] =
                    __fadd_rn(acc[n][c], __fsub_rn(__fmul_rn(__fmul_rn(dx, d0), (float)isum[n][c]),
                                                   __fmul_rn(__fmul_rn(dx, m0), (float)ms0)));
                acc[n][2 + c] = __fadd_rn(
                    acc[n][2 + c], __fsub_rn(__fmul_rn(__fmul_rn(dx, d1), (float)isum[n][2 + c]),
                                             __fmul_rn(__fmul_rn(dx, m1), (float)ms1)));
            }
        }
    }

    /* acc = rows r0 .. r0 + 63 of w (nb blocks a row, nrows rows) times the nv activation rows
     * xrow[0 .. nv) (shared memory; NULL past nv) */
    __device__ static void run(uint8_t *smem, const uint8_t *w, int nb, int nrows, int r0,
                               const uint8_t *const *xrow, int nv, float (&acc)[NT][4])
    {
        stage *st = (stage *)smem;
        const int ncols = nb * BLK, ntu = (nv + 7) / 8;
        const int64_t row_bytes = (int64_t)nb * BYTES;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[n][i] = 0.0f;
        wregs g;
        __syncthreads(); /* a previous run's stages are read */
        load_x(st[0], xrow, ncols, 0, w);
        load_w(g, w, row_bytes, nrows, r0, 0);
        store_w(st[0], g);
        for (int kb = 0; kb < nb; kb++) {
            const int cur = kb & 1;
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
            __syncthreads(); /* stage cur is complete; the other stage's last reads are done */
            const bool next = kb + 1 < nb;
            if (next) {
                load_x(st[cur ^ 1], xrow, ncols, kb + 1, w);
                load_w(g, w, row_bytes, nrows, r0, kb + 1);
            }
            compute(st[cur], ntu, acc);
            if (next) store_w(st[cur ^ 1], g);
        }
    }
};

#endif
