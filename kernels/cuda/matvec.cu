#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mvq.cuh"
#include "kernels/cuda/matvec.h"
#include "kernels/cuda/qact.h"

/* 4 warps per block. Tuned on an H200 (132 SMs, 4.8 TB/s HBM3e) at the 2048-4096 wide shapes of
 * Qwen3-30B-A3B. */
#define MV_WARPS 4

/* ---- float weights: fp32 products, one warp per output row ---------------------------------- */

/* The warp's lanes stride over 8-element chunks of one weight row; each lane keeps a partial sum
 * per activation row; the warp then reduces them. */
template <int T, int B>
__global__ void __launch_bounds__(MV_WARPS *WARP)
    matvec_f(const uint8_t *w, int64_t row_bytes, int64_t ncols, int64_t nrows, const float *x,
             int n_act, float *y)
{
    pdl_enter();
    const int64_t row = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x / WARP);
    if (row >= nrows) return;
    const uint8_t *wrow = w + row * row_bytes;
    const int lane = threadIdx.x & (WARP - 1);
    float acc[B];
#pragma unroll
    for (int b = 0; b < B; b++) acc[b] = 0.0f;
    for (int64_t c = lane; c < ncols / 8; c += WARP) {
        float v[8];
        deq8<T>(wrow, c, v);
#pragma unroll
        for (int b = 0; b < B; b++) {
            if (b < n_act) {
                const float4 *xp = (const float4 *)(x + b * ncols + c * 8);
                float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
                acc[b] += v[0] * x0.x + v[1] * x0.y + v[2] * x0.z + v[3] * x0.w + v[4] * x1.x +
                          v[5] * x1.y + v[6] * x1.z + v[7] * x1.w;
            }
        }
    }
#pragma unroll
    for (int b = 0; b < B; b++) {
        float s = warp_sum(acc[b]);
        if (b < n_act && lane == 0) y[b * nrows + row] = s;
    }
}

/* ---- quantized weights: integer block dots, bit-identical to qdot_ref ----------------------- *
 *
 * Why this shape: at 0.56-1.06 bytes per weight, loads of 2-8 bytes (the blocks are only 2-byte
 * aligned) held these kernels at 21-55% of the H200's bandwidth: too few bytes in flight per load
 * instruction; one-shot CTAs that staged one row each stopped at 48-65%, waiting out a memory
 * latency each, and a CTA-wide pipeline with 64-bit item arithmetic was issue-bound (Nsight: 0.7
 * warps issued per scheduler cycle at 28% of DRAM bandwidth). So: persistent CTAs (one wave) of
 * independent warps (no CTA barrier); each warp streams chunks of CB blocks of its rows into shared
 * memory with 16-byte cp.async copies that bypass L1, three chunks deep (two in flight while one is
 * decoded), with 32-bit counters. Activations (int8, reused by every row) stay in L1.
 * LPB lanes share one weight block, each taking a slice whose activation bytes are 16-byte aligned;
 * their partial integer sums meet by shuffles and the first lane of the group computes the block's
 * float term as qdot_ref does. The reference adds those terms block after block, a serial chain per
 * (row, activation row): the terms go to the warp's shared memory and lane b adds activation row
 * b's terms in order. */

#define MV_STAGES 3 /* row chunks per warp: two in flight while one is decoded */

/* mv_cursor walks a warp's items: batches of R rows (first, first + n_warps, ... in batch units),
 * each chunk by chunk, the batch's rows one after the other within a chunk. */
struct mv_cursor {
    int batch, c, r;
    __device__ __forceinline__ int row(int R) const { return batch * R + r; }
    __device__ __forceinline__ void next(int R, int nrows, int n_chunks, int n_warps)
    {
        if (++r == R || batch * R + r >= nrows) {
            r = 0;
            if (++c == n_chunks) c = 0, batch += n_warps;
        }
    }
};

/* R (1..RMAX, uniform): rows whose chains one warp runs side by side (lane r + R b sums row r of
 * the batch for activation row b). With one activation row the chain is the serial part, so 4 rows
 * share its instructions where every warp has at least 4 rows; with more, the activation rows do.
 * RI (a power of two dividing R): rows per item where a row is a few blocks (Q4_K at 2048 columns
 * is 8 of a 16-block chunk): one copy, one wait and one loop step serve RI rows. */
template <int T, int B>
__global__ void __launch_bounds__(MV_WARPS *WARP, B == 1 ? mvq<T>::MINB : 1)
    matvec_q(const uint8_t *w, int nb, int nrows, const uint8_t *act, int arb, int n_act, float *y,
             int R, int RI)
{
    pdl_trigger(); /* the weights are the pass's constants: their first chunks are copied in
                    * before the wait for the kernel ahead (which makes the activations) */
    using P = mvq<T>;
    constexpr int BYTES = qt<T>::bytes, BLK = qt<T>::blck, LPB = P::LPB;
    constexpr int CB = B == 1 ? P::CB1 : P::CB, RMAX = B == 1 ? 4 : 1;
    constexpr int BPP = WARP / LPB;       /* blocks per pass of the warp */
    constexpr int SPAN = CB * BYTES + 30; /* staged bytes at most (alignment on both ends) */
    constexpr int BUF = SPAN / 16 + 3;    /* uint4s, with slack for ld_words' extra word */
    constexpr int LOADS = (SPAN / 16 + 1 + WARP - 1) / WARP;
    static_assert(CB % BPP == 0 && CB % 4 == 0, "passes cover a chunk; terms read as float4");
    static_assert(RMAX * B <= WARP, "one lane per chain");
    __shared__ uint4 stage[MV_WARPS][MV_STAGES][BUF];
    __shared__ __align__(16) float terms[MV_WARPS][B * RMAX][CB];

    const int warp = threadIdx.x / WARP, lane = threadIdx.x & (WARP - 1), p = lane % LPB;
    const int n_warps = gridDim.x * MV_WARPS;
    const int n_chunks = (nb + CB - 1) / CB, ncols = nb * BLK;
    const int64_t row_bytes = (int64_t)nb * BYTES, total = row_bytes * nrows;
    /* one chunk per row and rows 16-byte aligned (the usual shapes): a row is copied with the
     * same n16 loads every time, no alignment or bounds arithmetic */
    const bool whole_rows = n_chunks == 1 && (row_bytes & 15) == 0;
    const int row16 = (int)(row_bytes >> 4);
    float *tw = terms[warp][0];

    const uint32_t lane_dst = (uint32_t)__cvta_generic_to_shared(stage[warp][0]) + 16 * lane;
    const int my_r = lane % R, my_b = lane / R; /* this lane's chain */
    float acc = 0.0f;

    /* decode: the terms of one staged item, ncb blocks from block c0 of row (and, with RI > 1,
     * the next rows: block cb is block cb & nb_mask of row + (cb >> nb_log)), into terms row r */
    const int nb_log = RI > 1 ? __ffs(nb) - 1 : 16, nb_mask = RI > 1 ? nb - 1 : 0xFFFF;
    auto decode = [&](int slot, int row, int c0, int ncb, int r) {
        const uint8_t *base =
            (const uint8_t *)stage[warp][slot] + ((row * row_bytes + (int64_t)c0 * BYTES) & 15);
#pragma unroll
        for (int k = 0; k < CB / BPP; k++) {
            const int cb = k * BPP + lane / LPB, rin = cb >> nb_log;
            const int ab = c0 + (cb & nb_mask); /* ab: block within its row */
            const bool ok = cb < ncb && row + rin < nrows;
            float *trow = tw + (r + rin) * CB;
            P part;
            if (ok) part.load(base + cb * BYTES, p);
#pragma unroll
            for (int b = 0; b < B; b++) {
                if (b >= n_act) break;
                const uint8_t *arow = act + b * arb;
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
                    trow[b * R * CB + (ab - c0)] =
                        part.value(__ldg((const float *)(arow + ncols + ncols / 8) + ab), is, ms);
            }
        }
    };
    /* chains: the batch's rows have the terms of chunk c: each chain lane adds them in order */
    auto chains = [&](int batch, int c, int ncb) {
        __syncwarp();
        const int crow = batch * R + my_r;
        if (lane < R * n_act && crow < nrows) {
            const float *t = tw + lane * CB;
            if (ncb == CB) {
#pragma unroll
                for (int j = 0; j < CB; j += 4) {
                    const float4 v = *(const float4 *)(t + j);
                    acc = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(acc, v.x), v.y), v.z), v.w);
                }
            } else {
                for (int j = 0; j < ncb; j++) acc = __fadd_rn(acc, t[j]);
            }
            if (c == n_chunks - 1) {
                y[(int64_t)my_b * nrows + crow] = acc;
                acc = 0.0f;
            }
        }
    };

    const int first = (int)blockIdx.x * MV_WARPS + warp; /* the warp's first batch */
    if (whole_rows) {
        /* Rows batch * R + r of batches first, first + n_warps, ...: RI rows (contiguous, so one
         * copy) are one item. */
        const uint8_t *wl = w + 16 * lane;
        int in_batch = first, in_r = 0, in_slot = 0;
        auto issue = [&]() {
            const int row = in_batch * R + in_r;
            if (row < nrows) {
                const int n16 = min(RI, nrows - row) * row16;
                const uint8_t *src = wl + row * row_bytes;
                const uint32_t dst = lane_dst + in_slot * (BUF * 16);
#pragma unroll
                for (int l = 0; l < LOADS; l++)
                    if (lane + WARP * l < n16) cp_async16(dst + 16 * WARP * l, src + 16 * WARP * l);
                if ((in_r += RI) == R) in_r = 0, in_batch += n_warps;
            }
            asm volatile("cp.async.commit_group;\n" ::);
            in_slot = in_slot == MV_STAGES - 1 ? 0 : in_slot + 1;
        };
        issue();
        issue();
        pdl_wait();
        for (int batch = first, r = 0, slot = 0; batch * R + r < nrows;) {
            issue(); /* into the slot of the previous item, decoded before the last __syncwarp */
            asm volatile("cp.async.wait_group 2;\n" ::);
            __syncwarp();
            const int row = batch * R + r;
            decode(slot, row, 0, RI * nb, r);
            if (r + RI == R || row + RI >= nrows) chains(batch, 0, nb);
            if ((r += RI) == R) r = 0, batch += n_warps;
            slot = slot == MV_STAGES - 1 ? 0 : slot + 1;
            __syncwarp(); /* the terms and this slot are rewritten next */
        }
    } else {
        mv_cursor in = {first, 0, 0}; /* the next item to copy in */
        int in_slot = 0;
        auto issue = [&]() {
            const int row = in.row(R);
            if (row < nrows) {
                const int64_t start = row * row_bytes + (int64_t)in.c * (CB * BYTES);
                const int64_t a0 = start & ~(int64_t)15;
                const int ncb = min(CB, nb - in.c * CB);
                const int n16 = (int)((start - a0 + ncb * BYTES + 15) >> 4);
                const uint32_t dst = lane_dst + in_slot * (BUF * 16);
#pragma unroll
                for (int l = 0; l < LOADS; l++)
                    if (lane + WARP * l < n16)
                        cp_async16_tail(dst + 16 * WARP * l, w, a0 + 16 * (lane + WARP * l), total);
                in.next(R, nrows, n_chunks, n_warps);
            }
            asm volatile("cp.async.commit_group;\n" ::);
            in_slot = in_slot == MV_STAGES - 1 ? 0 : in_slot + 1;
        };
        issue();
        issue();
        pdl_wait();
        mv_cursor at = {first, 0, 0}; /* the item decoded next */
        for (int slot = 0; at.row(R) < nrows;) {
            issue();
            asm volatile("cp.async.wait_group 2;\n" ::);
            __syncwarp();
            const int row = at.row(R), c0 = at.c * CB, ncb = min(CB, nb - c0);
            decode(slot, row, c0, ncb, at.r);
            if (at.r == R - 1 || row == nrows - 1) chains(at.batch, at.c, ncb);
            at.next(R, nrows, n_chunks, n_warps);
            slot = slot == MV_STAGES - 1 ? 0 : slot + 1;
            __syncwarp();
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
}

extern "C" bool cu_type_supported(uint32_t type)
{
    switch (type) {
    case QT_F32: case QT_F16: case QT_BF16: case QT_Q8_0: case QT_Q5_0: case QT_Q4_K: case QT_Q5_K:
    case QT_Q6_K: case QT_Q2_K: case QT_Q3_K: case QT_IQ4_XS: case QT_IQ4_NL:
        return true;
    default:
        return false;
    }
}

/* The activation count is specialized in steps so small batches keep few registers and little
 * shared memory. */
template <int T, int B>
static void launch_f(const uint8_t *w, int64_t ncols, int64_t nrows, const float *x, int n_act,
                     float *y, cudaStream_t s)
{
    const unsigned grid = (unsigned)((nrows + MV_WARPS - 1) / MV_WARPS);
    cu_launch(matvec_f<T, B>, grid, MV_WARPS * WARP, 0, s, w, ncols / qt<T>::blck * qt<T>::bytes,
              ncols, nrows, x, n_act, y);
}

/* launch_q: one wave of persistent CTAs (as many as fit on the device at once), fewer when
 * there are fewer rows. */
template <int T, int B>
static void launch_q(const uint8_t *w, int64_t ncols, int64_t nrows, const uint8_t *act,
                     int n_act, float *y, cudaStream_t s)
{
    static int wave; /* CTAs per wave, per instantiation; a benign race computes it twice */
    if (wave == 0) {
        int dev = 0, sms = 0, per_sm = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, matvec_q<T, B>, MV_WARPS * WARP, 0);
        wave = sms * (per_sm > 0 ? per_sm : 1);
    }
    /* RI: whole rows of a power-of-two block count share an item, as many as fit a chunk;
     * R: 4-row chains where every warp of a full wave gets at least 4 rows */
    constexpr int CB = B == 1 ? mvq<T>::CB1 : mvq<T>::CB, RMAX = B == 1 ? 4 : 1;
    const int64_t nb = ncols / qt<T>::blck;
    int RI = 1;
    if (nb * qt<T>::bytes % 16 == 0 && (nb & (nb - 1)) == 0)
        while (RI * 2 * nb <= CB && RI * 2 <= RMAX) RI *= 2;
    const int R = B == 1 && nrows >= 4 * MV_WARPS * (int64_t)wave ? 4 : RI;
    const int64_t ctas = (nrows + R * MV_WARPS - 1) / (R * MV_WARPS);
    const unsigned grid = (unsigned)(ctas < wave ? ctas : wave);
    cu_launch(matvec_q<T, B>, grid, MV_WARPS * WARP, 0, s, w, (int)nb, (int)nrows, act,
              (int)cu_act_row_bytes(T, ncols), n_act, y, R, RI);
}

template <int T>
static void launch(const void *w, int64_t ncols, int64_t nrows, const void *act, int n_act,
                   float *y, cudaStream_t s)
{
    const uint8_t *wp = (const uint8_t *)w;
    if constexpr (qt<T>::blck == 1) {
        const float *x = (const float *)act;
        if (n_act == 1) launch_f<T, 1>(wp, ncols, nrows, x, n_act, y, s);
        else if (n_act <= 4) launch_f<T, 4>(wp, ncols, nrows, x, n_act, y, s);
        else launch_f<T, 16>(wp, ncols, nrows, x, n_act, y, s);
    } else {
        const uint8_t *a = (const uint8_t *)act;
        if (n_act == 1) launch_q<T, 1>(wp, ncols, nrows, a, n_act, y, s);
        else if (n_act <= 4) launch_q<T, 4>(wp, ncols, nrows, a, n_act, y, s);
        else launch_q<T, 16>(wp, ncols, nrows, a, n_act, y, s);
    }
}

extern "C" int cu_matvec(uint32_t type, const void *w, int64_t ncols, int64_t nrows, const void *act,
                         int n_act, float *y, void *stream)
{
    if (!cu_type_supported(type))
        return strata_errf(STRATA_EUNSUPPORTED, "%s weights are computed on the CPU, not the GPU",
                           qtype_name(type));
    const struct qtype_info *ti = qtype_get(type);
    int64_t blk = ti->blck < 8 ? 8 : ti->blck;
    if (n_act < 1 || n_act > CU_MATVEC_MAX_ACT || ncols <= 0 || nrows <= 0 || ncols % blk ||
        (uintptr_t)w % 16 || nrows > INT32_MAX || ncols > INT32_MAX / 2)
        return strata_errf(STRATA_EINVAL,
                           "cu_matvec: n_act %d (1..16), %lld rows of %lld columns (a multiple of "
                           "%lld, both below 2^30), weights at %p (16-byte aligned)", n_act,
                           (long long)nrows, (long long)ncols, (long long)blk, w);
    cudaStream_t s = (cudaStream_t)stream;
#define L(T) launch<T>(w, ncols, nrows, act, n_act, y, s)
    CU_TYPE_SWITCH(type, L)
#undef L
    return cu_launch_check();
}
