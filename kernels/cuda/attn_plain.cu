#include "kernels/cuda/attn_plain.h"
#include "kernels/cuda/common.cuh"

#include <cuda_fp16.h>

/* 128 threads, tiles of 128 keys: a thread per key of a tile; 4 warps. Not tuned yet. */
#define AP_THREADS 128
#define AP_WARPS   (AP_THREADS / WARP)
#define AP_MAXHD   256

__device__ __forceinline__ float ld_elem(const float *p)
{
    return *p;
}

__device__ __forceinline__ float ld_elem(const __half *p)
{
    return __half2float(*p);
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
    for (int w = 1; w < AP_WARPS; w++) m = fmaxf(m, red[w]);
    return m;
}

__device__ __forceinline__ float block_sum(float x, float *red)
{
    x = warp_sum(x);
    if ((threadIdx.x & (WARP - 1)) == 0) red[threadIdx.x / WARP] = x;
    __syncthreads();
    float s = red[0];
#pragma unroll
    for (int w = 1; w < AP_WARPS; w++) s += red[w];
    return s;
}

template <typename E>
__global__ void __launch_bounds__(AP_THREADS)
    attn_plain(const float *q, int n_head, const E *kp, const E *vp, int bs, int n_kv_head, int hd,
               const int32_t *bt, int64_t bt_stride, const int32_t *q_seq, const int32_t *kv_len,
               float scale, float *out)
{
    __shared__ float qs[AP_MAXHD];
    __shared__ float ps[AP_THREADS];
    __shared__ float red_m[AP_WARPS], red_s[AP_WARPS];
    const int64_t row = blockIdx.x / n_head;
    const int h = blockIdx.x % n_head, g = h / (n_head / n_kv_head), tid = threadIdx.x;
    const int len = kv_len[row];
    const int32_t *tab = bt + (int64_t)q_seq[row] * bt_stride;
    for (int d = tid; d < hd; d += AP_THREADS) qs[d] = q[(row * n_head + h) * hd + d];
    __syncthreads();
    float m = -INFINITY, l = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
    for (int start = 0; start < len; start += AP_THREADS) {
        const int j = start + tid;
        float s = -INFINITY;
        if (j < len) {
            const E *kr = kp + (((int64_t)tab[j / bs] * n_kv_head + g) * bs + j % bs) * hd;
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot = fmaf(qs[d], ld_elem(kr + d), dot);
            s = dot * scale;
        }
        const float m_new = fmaxf(m, block_max(s, red_m));
        const float corr = expf(m - m_new);
        const float p = j < len ? expf(s - m_new) : 0.0f;
        ps[tid] = p;
        l = l * corr + block_sum(p, red_s); /* block_sum's barrier also publishes ps */
        acc0 *= corr, acc1 *= corr;
        const int n = len - start < AP_THREADS ? len - start : AP_THREADS;
        for (int jj = 0; jj < n; jj++) {
            const int key = start + jj;
            const E *vr = vp + (((int64_t)tab[key / bs] * n_kv_head + g) * bs + key % bs) * hd;
            if (tid < hd) acc0 = fmaf(ps[jj], ld_elem(vr + tid), acc0);
            if (tid + AP_THREADS < hd) acc1 = fmaf(ps[jj], ld_elem(vr + tid + AP_THREADS), acc1);
        }
        m = m_new;
        __syncthreads(); /* ps and red_* are rewritten by the next tile */
    }
    float *o = out + (row * n_head + h) * hd;
    if (tid < hd) o[tid] = l > 0.0f ? acc0 / l : 0.0f;
    if (tid + AP_THREADS < hd) o[tid + AP_THREADS] = l > 0.0f ? acc1 / l : 0.0f;
}

extern "C" int cu_attention_plain(const float *q, int64_t n_q, int n_head, const void *k,
                                  const void *v, int f16, int block_size, int n_kv_head,
                                  int head_dim, const int32_t *block_tables, int64_t bt_stride,
                                  const int32_t *q_seq, const int32_t *kv_len, float *out,
                                  void *stream)
{
    if (head_dim < 1 || head_dim > AP_MAXHD || n_kv_head < 1 || n_head % n_kv_head ||
        block_size < 1)
        return strata_errf(STRATA_EINVAL,
                           "cu_attention_plain: head_dim %d (1..256), %d heads over %d kv heads, "
                           "blocks of %d", head_dim, n_head, n_kv_head, block_size);
    if (n_q == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    const float scale = 1.0f / sqrtf((float)head_dim);
    const unsigned grid = (unsigned)(n_q * n_head);
    if (f16)
        attn_plain<__half><<<grid, AP_THREADS, 0, s>>>(q, n_head, (const __half *)k,
                                                       (const __half *)v, block_size, n_kv_head,
                                                       head_dim, block_tables, bt_stride, q_seq,
                                                       kv_len, scale, out);
    else
        attn_plain<float><<<grid, AP_THREADS, 0, s>>>(q, n_head, (const float *)k,
                                                      (const float *)v, block_size, n_kv_head,
                                                      head_dim, block_tables, bt_stride, q_seq,
                                                      kv_len, scale, out);
    return cu_launch_check();
}
