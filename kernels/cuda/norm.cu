#include "kernels/cuda/common.cuh"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/qact.cuh"
#include "kernels/cuda/qact.h"
#include "common/quant/quant.h"
#include "kernels/cuda/rowsum.cuh"

#define NORM_WARPS 4

__global__ void rmsnorm_kernel(const float *x, const float *w, float *y, int64_t rows,
                               int64_t width, float eps)
{
    pdl_enter();
    int64_t r = (int64_t)blockIdx.x * NORM_WARPS + threadIdx.x / WARP;
    int lane = threadIdx.x & (WARP - 1);
    if (r >= rows) return;
    const float *xr = x + r * width;
    float s = 0.0f;
    for (int64_t i = lane; i < width; i += WARP) s += xr[i] * xr[i];
    s = warp_sum(s);
    float scale = 1.0f / sqrtf(s / (float)width + eps);
    float *yr = y + r * width;
    for (int64_t i = lane; i < width; i += WARP) yr[i] = xr[i] * scale * w[i];
}

/* Wide rows (the hidden state): a CTA of ROW_NORM_THREADS threads per row, so one decode row is
 * not one warp's chain of dependent loads. The sum: rowsum.cuh's chunk order (fixed by the width
 * alone: the same bits for any row count, and as rmsnorm_split's). With y, x += y first (the
 * residual add, __fadd_rn as cu_add) and the sum is of the new x. With QA (QT_Q8_0 or QT_Q8_K),
 * the normed row is then quantized into act (rows arb bytes apart) as cu_quantize_acts does. */
template <bool ADD, int QA>
__global__ void __launch_bounds__(ROW_NORM_THREADS)
    rmsnorm_wide(float *x, const float *y, const float *w, float *out, int64_t width, float eps,
                 uint8_t *act, size_t arb)
{
    pdl_trigger();
    __shared__ float red[ROW_MAXV * ROW_NORM_THREADS / WARP];
    __shared__ __align__(16) float row[QA ? ROW_MAXV * ROW_NORM_THREADS : 1];
    const int64_t r = blockIdx.x;
    const int tid = threadIdx.x;
    const int n_chunks = (int)((width + ROW_NORM_THREADS - 1) / ROW_NORM_THREADS);
    float *xr = x + r * width, *yr = out + r * width;
    if (width > ROW_MAXV * ROW_NORM_THREADS) { /* wider rows: chunk by chunk */
        pdl_wait();
        float s = 0.0f;
        for (int m = 0; m < n_chunks; m++) {
            const int64_t i = (int64_t)m * ROW_NORM_THREADS + tid;
            float v = 0.0f;
            if (i < width) {
                v = xr[i];
                if (ADD) xr[i] = v = __fadd_rn(v, y[r * width + i]);
            }
            const float p = cta_sum<ROW_NORM_THREADS>(v * v, red);
            __syncthreads();
            s = m ? s + p : p;
        }
        const float scale = row_scale(s, width, eps);
        for (int64_t i = tid; i < width; i += ROW_NORM_THREADS)
            yr[i] = xr[i] * scale * w[i];
        if (QA) { /* the row, written by the whole CTA, read back by its warps */
            __syncthreads();
            qact_row(yr, width, (uint32_t)QA, tid / WARP, ROW_NORM_THREADS / WARP, tid % WARP,
                     act + r * arb);
        }
        return;
    }
    /* a thread's elements (at most ROW_MAXV) loaded at once, so the row costs one memory latency,
     * not one per element; the norm's weights before the wait (the pass's constants). The same
     * expressions in the same order as the loop above. */
    float wv[ROW_MAXV], v[ROW_MAXV], a[ROW_MAXV];
#pragma unroll
    for (int m = 0; m < ROW_MAXV; m++) {
        const int64_t i = tid + (int64_t)m * ROW_NORM_THREADS;
        wv[m] = i < width ? w[i] : 0.0f;
    }
    pdl_wait();
#pragma unroll
    for (int m = 0; m < ROW_MAXV; m++) {
        const int64_t i = tid + (int64_t)m * ROW_NORM_THREADS;
        v[m] = i < width ? xr[i] : 0.0f;
        a[m] = ADD && i < width ? y[r * width + i] : 0.0f;
    }
    float sq[ROW_MAXV];
#pragma unroll
    for (int m = 0; m < ROW_MAXV; m++) {
        const int64_t i = tid + (int64_t)m * ROW_NORM_THREADS;
        if (i < width && ADD) xr[i] = v[m] = __fadd_rn(v[m], a[m]);
        sq[m] = v[m] * v[m];
    }
    const float scale =
        row_scale(row_chunks_sum<ROW_NORM_THREADS>(sq, n_chunks, red), width, eps);
#pragma unroll
    for (int m = 0; m < ROW_MAXV; m++) {
        const int64_t i = tid + (int64_t)m * ROW_NORM_THREADS;
        if (i < width) {
            const float o = v[m] * scale * wv[m];
            yr[i] = o;
            if (QA) row[i] = o;
        }
    }
    if (QA) { /* the normed row, staged in shared memory, quantized by the CTA's warps */
        __syncthreads();
        qact_row(row, width, (uint32_t)QA, tid / WARP, ROW_NORM_THREADS / WARP, tid % WARP,
                 act + r * arb);
    }
}

/* A wide row split over CTAs, grid (chunks, rows): CTA c adds and norms elements 256c .. 256c + 255
 * (one a thread) and quantizes their blocks; the chunk sums meet through sync (rowsum.cuh), so the
 * bits are rmsnorm_wide<true, QA>'s. */
template <int QA>
__global__ void __launch_bounds__(ROW_NORM_THREADS)
    rmsnorm_split(float *x, const float *y, const float *w, float *out, int64_t width, float eps,
                  uint8_t *act, size_t arb, struct row_sync *sync)
{
    pdl_trigger();
    __shared__ float red[ROW_NORM_THREADS / WARP];
    __shared__ __align__(16) float row[ROW_NORM_THREADS];
    const int c = blockIdx.x, tid = threadIdx.x;
    const int64_t r = blockIdx.y, i = (int64_t)c * ROW_NORM_THREADS + tid, e = r * width + i;
    const bool in = i < width;
    const float wv = in ? w[i] : 0.0f; /* the pass's constants before the wait */
    pdl_wait();
    float v = 0.0f;
    if (in) x[e] = v = __fadd_rn(x[e], y[e]);
    const float tot =
        row_split_sum(cta_sum<ROW_NORM_THREADS>(v * v, red), sync + r, c, (int)gridDim.x);
    const float scale = row_scale(tot, width, eps);
    const float o = v * scale * wv;
    if (in) out[e] = o;
    row[tid] = in ? o : 0.0f;
    __syncthreads();
    qact_chunk(row, width, (uint32_t)QA, c, tid / WARP, tid % WARP, act + r * arb);
}

extern "C" size_t cu_row_sync_bytes(int64_t rows)
{
    return sizeof(struct row_sync) * (size_t)(rows > 0 ? rows : 1);
}

/* Narrow rows with the residual add: rmsnorm_kernel's expressions after x += y. */
__global__ void add_rmsnorm_kernel(float *x, const float *y, const float *w, float *out,
                                   int64_t rows, int64_t width, float eps)
{
    pdl_enter();
    int64_t r = (int64_t)blockIdx.x * NORM_WARPS + threadIdx.x / WARP;
    int lane = threadIdx.x & (WARP - 1);
    if (r >= rows) return;
    float *xr = x + r * width;
    for (int64_t i = lane; i < width; i += WARP) xr[i] = __fadd_rn(xr[i], y[r * width + i]);
    __syncwarp();
    float s = 0.0f;
    for (int64_t i = lane; i < width; i += WARP) s += xr[i] * xr[i];
    s = warp_sum(s);
    float scale = 1.0f / sqrtf(s / (float)width + eps);
    float *yr = out + r * width;
    for (int64_t i = lane; i < width; i += WARP) yr[i] = xr[i] * scale * w[i];
}

extern "C" int cu_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t width,
                          float eps, void *stream)
{
    if (rows <= 0 || width <= 0) return strata_errf(STRATA_EINVAL, "cu_rmsnorm: empty shape");
    if (width >= ROW_NORM_MIN) {
        cu_launch(rmsnorm_wide<false, 0>, (unsigned)rows, ROW_NORM_THREADS, 0, (cudaStream_t)stream,
                  (float *)x, nullptr, w, y, width, eps, nullptr, (size_t)0);
        return cu_launch_check();
    }
    dim3 grid((unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS));
    cu_launch(rmsnorm_kernel, grid, NORM_WARPS * WARP, 0, (cudaStream_t)stream, x, w, y, rows,
              width, eps);
    return cu_launch_check();
}

extern "C" int cu_add_rmsnorm(float *x, const float *y, const float *w, float *out, int64_t rows,
                              int64_t width, float eps, void *stream)
{
    if (rows <= 0 || width <= 0) return strata_errf(STRATA_EINVAL, "cu_add_rmsnorm: empty shape");
    cudaStream_t s = (cudaStream_t)stream;
    if (width >= ROW_NORM_MIN)
        cu_launch(rmsnorm_wide<true, 0>, (unsigned)rows, ROW_NORM_THREADS, 0, s, x, y, w, out,
                  width, eps, nullptr, (size_t)0);
    else
        cu_launch(add_rmsnorm_kernel, (unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS),
                  NORM_WARPS * WARP, 0, s, x, y, w, out, rows, width, eps);
    return cu_launch_check();
}

extern "C" int cu_add_rmsnorm_q(float *x, const float *y, const float *w, float *out, int64_t rows,
                                int64_t width, float eps, uint32_t wtype, void *act, void *sync,
                                void *stream)
{
    const uint32_t at = quant_act_type(wtype);
    const size_t arb = cu_act_row_bytes(wtype, width);
    if (rows <= 0 || width < ROW_NORM_MIN || arb == 0 || (at != QT_Q8_0 && at != QT_Q8_K))
        return strata_errf(STRATA_EINVAL,
                           "cu_add_rmsnorm_q: %lld rows of %lld (%d or more) for %s activations",
                           (long long)rows, (long long)width, ROW_NORM_MIN, qtype_name(wtype));
    cudaStream_t s = (cudaStream_t)stream;
    const int64_t chunks = (width + ROW_NORM_THREADS - 1) / ROW_NORM_THREADS;
    if (sync && chunks <= ROW_SYNC_CHUNKS && rows * chunks <= cu_sm_count()) {
        const dim3 grid((unsigned)chunks, (unsigned)rows);
        struct row_sync *rs = (struct row_sync *)sync;
        if (at == QT_Q8_0)
            cu_launch(rmsnorm_split<QT_Q8_0>, grid, ROW_NORM_THREADS, 0, s, x, y, w, out, width,
                      eps, (uint8_t *)act, arb, rs);
        else
            cu_launch(rmsnorm_split<QT_Q8_K>, grid, ROW_NORM_THREADS, 0, s, x, y, w, out, width,
                      eps, (uint8_t *)act, arb, rs);
    } else if (at == QT_Q8_0)
        cu_launch(rmsnorm_wide<true, QT_Q8_0>, (unsigned)rows, ROW_NORM_THREADS, 0, s, x, y, w, out,
                  width, eps, (uint8_t *)act, arb);
    else
        cu_launch(rmsnorm_wide<true, QT_Q8_K>, (unsigned)rows, ROW_NORM_THREADS, 0, s, x, y, w, out,
                  width, eps, (uint8_t *)act, arb);
    return cu_launch_check();
}

/* One thread per rotated pair; grid (pairs, heads, tokens). */
__global__ void rope_kernel(float *x, const int32_t *pos, int n_head, int head_dim, int n_rot,
                            float step, int neox)
{
    pdl_enter();
    int i = blockIdx.x * blockDim.x + threadIdx.x; /* pair index < n_rot / 2 */
    if (i >= n_rot / 2) return;
    int h = blockIdx.y;
    int64_t t = blockIdx.z;
    float *v = x + (t * n_head + h) * head_dim;
    /* pos * step^i by repeated multiplication, as ggml and kernels/ref/ops.c build it */
    float theta = (float)pos[t];
    for (int j = 0; j < i; j++) theta *= step;
    float c, s;
    sincosf(theta, &s, &c);
    int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
    float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
}

extern "C" int cu_rope(float *x, const int32_t *pos, int64_t n_tok, int n_head, int head_dim,
                       int n_rot, float base, int neox, void *stream)
{
    if (n_tok <= 0 || n_head <= 0 || n_rot <= 0 || n_rot > head_dim || n_rot % 2)
        return strata_errf(STRATA_EINVAL, "cu_rope: n_rot %d of head_dim %d", n_rot, head_dim);
    dim3 grid((unsigned)((n_rot / 2 + 63) / 64), (unsigned)n_head, (unsigned)n_tok);
    /* The step is computed by the host's powf, the one the CPU reference uses: a 1-ulp difference
     * in it grows to 4e-3 rad at position 40K. */
    const float step = powf(base, -2.0f / (float)n_rot);
    cu_launch(rope_kernel, grid, 64, 0, (cudaStream_t)stream, x, pos, n_head, head_dim, n_rot, step,
              neox);
    return cu_launch_check();
}

template <typename E> __device__ __forceinline__ E kv_elem(float x);
template <> __device__ __forceinline__ float kv_elem<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ __half kv_elem<__half>(float x)
{
    return __float2half_rn(x);
}

/* One warp per head row of a token: q heads, k heads, then v heads. A q or k row is normed (when
 * weights are given: rmsnorm_kernel's expressions) and rotated (rope_kernel's) in place through
 * memory the warp alone touches; k and v rows then go to the pool as cu_kv_store writes them. */
template <typename E>
__global__ void __launch_bounds__(NORM_WARPS *WARP)
    qk_rope_store(float *q, float *k, const float *v, const float *qw, const float *kw,
                  const int32_t *pos, const int32_t *slot, int64_t n_tok, int n_head, int n_kv,
                  int hd, int n_rot, float step, int neox, float eps, int block_size, E *kp, E *vp)
{
    pdl_enter();
    const int rows = n_head + 2 * n_kv;
    const int64_t w = (int64_t)blockIdx.x * NORM_WARPS + threadIdx.x / WARP;
    if (w >= n_tok * rows) return;
    const int lane = threadIdx.x & (WARP - 1);
    const int64_t t = w / rows;
    const int j = (int)(w % rows);
    const bool is_q = j < n_head, is_v = j >= n_head + n_kv;
    const int h = is_q ? j : is_v ? j - n_head - n_kv : j - n_head;
    float *row = is_q ? q + (t * n_head + h) * hd : k + (t * n_kv + h) * hd;
    if (!is_v) {
        const float *nw = is_q ? qw : kw;
        if (nw) {
            float s = 0.0f;
            for (int i = lane; i < hd; i += WARP) s += row[i] * row[i];
            s = warp_sum(s);
            const float scale = 1.0f / sqrtf(s / (float)hd + eps);
            for (int i = lane; i < hd; i += WARP) row[i] = row[i] * scale * nw[i];
            __syncwarp();
        }
        for (int i = lane; i < n_rot / 2; i += WARP) {
            float theta = (float)pos[t];
            for (int jj = 0; jj < i; jj++) theta *= step;
            float c, sn;
            sincosf(theta, &sn, &c);
            const int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
            const float x0 = row[a], x1 = row[b];
            row[a] = x0 * c - x1 * sn;
            row[b] = x0 * sn + x1 * c;
        }
        __syncwarp();
        if (is_q) return;
    }
    const float *src = is_v ? v + (t * n_kv + h) * hd : row;
    E *pool = is_v ? vp : kp;
    const int64_t b = slot[t] / block_size, o = slot[t] % block_size;
    E *dst = pool + ((b * n_kv + h) * block_size + o) * hd;
    for (int i = lane; i < hd; i += WARP) dst[i] = kv_elem<E>(src[i]);
}

extern "C" int cu_qk_rope_store(float *q, float *k, const float *v, const float *q_norm,
                                const float *k_norm, const int32_t *pos, const int32_t *slot,
                                int64_t n_tok, int n_head, int n_kv_head, int head_dim, int n_rot,
                                float base, int neox, float eps, int f16, int block_size,
                                void *k_pool, void *v_pool, void *stream)
{
    if (n_tok <= 0 || n_head <= 0 || n_kv_head <= 0 || n_rot <= 0 || n_rot > head_dim ||
        n_rot % 2 || block_size < 1)
        return strata_errf(STRATA_EINVAL, "cu_qk_rope_store: n_rot %d of head_dim %d, %d/%d heads",
                           n_rot, head_dim, n_head, n_kv_head);
    const int64_t warps = n_tok * (n_head + 2 * n_kv_head);
    const unsigned grid = (unsigned)((warps + NORM_WARPS - 1) / NORM_WARPS);
    const float step = powf(base, -2.0f / (float)n_rot); /* as cu_rope: the host's powf */
    cudaStream_t s = (cudaStream_t)stream;
    if (f16)
        cu_launch(qk_rope_store<__half>, grid, NORM_WARPS * WARP, 0, s, q, k, v, q_norm, k_norm,
                  pos, slot, n_tok, n_head, n_kv_head, head_dim, n_rot, step, neox, eps, block_size,
                  (__half *)k_pool, (__half *)v_pool);
    else
        cu_launch(qk_rope_store<float>, grid, NORM_WARPS * WARP, 0, s, q, k, v, q_norm, k_norm, pos,
                  slot, n_tok, n_head, n_kv_head, head_dim, n_rot, step, neox, eps, block_size,
                  (float *)k_pool, (float *)v_pool);
    return cu_launch_check();
}
