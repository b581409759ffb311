#include "kernels/cuda/common.cuh"
#include "kernels/cuda/expf.cuh"
#include "kernels/cuda/glue.h"
#include "kernels/cuda/matvec.h"

#include <cuda_fp16.h>

thread_local bool cu_pdl_on;

extern "C" bool cu_set_pdl(bool on)
{
    const bool was = cu_pdl_on;
    cu_pdl_on = on;
    return was;
}

/* Elementwise kernels: 256 threads, a grid-stride loop over at most 132 * 16 CTAs (the H200's
 * SMs, 16 CTAs deep): these steps move a few MB, so launch latency, not the grid, bounds them. */
#define GL_THREADS 256

static unsigned grid_for(int64_t n)
{
    int64_t b = (n + GL_THREADS - 1) / GL_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 132 * 16 ? 132 * 16 : b);
}

template <int T>
__global__ void embed_rows(const uint8_t *table, uint64_t row_bytes, const int32_t *ids,
                           int64_t n_embd, float *out)
{
    pdl_enter();
    const int64_t t = blockIdx.x;
    const uint8_t *row = table + (uint64_t)ids[t] * row_bytes;
    for (int64_t c = threadIdx.x; c < n_embd / 8; c += blockDim.x) {
        float v[8];
        deq8<T>(row, c, v);
#pragma unroll
        for (int i = 0; i < 8; i++) out[t * n_embd + 8 * c + i] = v[i];
    }
}

extern "C" int cu_embed_rows(uint32_t wtype, const void *table, uint64_t row_bytes,
                             const int32_t *ids, int64_t n_tok, int64_t n_embd, float *out,
                             void *stream)
{
    if (!cu_type_supported(wtype))
        return strata_errf(STRATA_EUNSUPPORTED, "cu_embed_rows: %s rows are dequantized on the CPU",
                           qtype_name(wtype));
    if (n_embd % 8 || n_embd % qtype_get(wtype)->blck)
        return strata_errf(STRATA_EINVAL, "cu_embed_rows: rows of %lld %s elements",
                           (long long)n_embd, qtype_name(wtype));
    if (n_tok == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
#define F(T)                                                                                       \
    cu_launch(embed_rows<T>, (unsigned)n_tok, GL_THREADS, 0, s, (const uint8_t *)table, row_bytes, \
              ids, n_embd, out)
    CU_TYPE_SWITCH(wtype, F)
#undef F
    return cu_launch_check();
}

__global__ void add_rows(float *x, const float *b, int64_t n, int64_t width)
{
    pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], b[i % width]);
}

extern "C" int cu_add_rows(float *x, const float *b, int64_t rows, int64_t width, void *stream)
{
    if (rows * width == 0) return 0;
    cu_launch(add_rows, grid_for(rows * width), GL_THREADS, 0, (cudaStream_t)stream, x, b,
              rows * width, width);
    return cu_launch_check();
}

__global__ void add_vec(float *x, const float *y, int64_t n)
{
    pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], y[i]);
}

extern "C" int cu_add(float *x, const float *y, int64_t n, void *stream)
{
    if (n == 0) return 0;
    cu_launch(add_vec, grid_for(n), GL_THREADS, 0, (cudaStream_t)stream, x, y, n);
    return cu_launch_check();
}

template <typename E> __device__ __forceinline__ E to_elem(float x);
template <> __device__ __forceinline__ float to_elem<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ __half to_elem<__half>(float x)
{
    return __float2half_rn(x);
}

/* One CTA per token; threads over its n_kv_head * head_dim elements of K, then of V. */
template <typename E>
__global__ void kv_store(const float *k, const float *v, const int32_t *slot, int n_kv_head,
                         int head_dim, int block_size, E *kp, E *vp)
{
    pdl_enter();
    const int64_t t = blockIdx.x, width = (int64_t)n_kv_head * head_dim;
    const int64_t b = slot[t] / block_size, o = slot[t] % block_size;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
        const int64_t h = i / head_dim, d = i % head_dim;
        const int64_t at = ((b * n_kv_head + h) * block_size + o) * head_dim + d;
        kp[at] = to_elem<E>(k[t * width + i]);
        vp[at] = to_elem<E>(v[t * width + i]);
    }
}

extern "C" int cu_kv_store(const float *k, const float *v, const int32_t *slot, int64_t n_tok,
                           int n_kv_head, int head_dim, int block_size, int f16, void *k_pool,
                           void *v_pool, void *stream)
{
    if (n_kv_head < 1 || head_dim < 1 || block_size < 1)
        return strata_errf(STRATA_EINVAL, "cu_kv_store: %d kv heads of %d, blocks of %d",
                           n_kv_head, head_dim, block_size);
    if (n_tok == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (f16)
        cu_launch(kv_store<__half>, (unsigned)n_tok, GL_THREADS, 0, s, k, v, slot, n_kv_head,
                  head_dim, block_size, (__half *)k_pool, (__half *)v_pool);
    else
        cu_launch(kv_store<float>, (unsigned)n_tok, GL_THREADS, 0, s, k, v, slot, n_kv_head,
                  head_dim, block_size, (float *)k_pool, (float *)v_pool);
    return cu_launch_check();
}

/* ops_silu's expression: x / (1 + expf(-x)), then one rounded product. */
__global__ void swiglu(const float *g, const float *u, float *out, int64_t n)
{
    pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float x = g[i];
        out[i] = __fmul_rn(__fdiv_rn(x, __fadd_rn(1.0f, strata_expf(-x))), u[i]);
    }
}

extern "C" int cu_swiglu(const float *g, const float *u, float *out, int64_t n, void *stream)
{
    if (n == 0) return 0;
    cu_launch(swiglu, grid_for(n), GL_THREADS, 0, (cudaStream_t)stream, g, u, out, n);
    return cu_launch_check();
}

__global__ void gate_add(float *y, const float *s, const float *gate, int64_t n, int64_t width)
{
    pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float sg = __fdiv_rn(1.0f, __fadd_rn(1.0f, strata_expf(-gate[i / width])));
        y[i] = __fadd_rn(y[i], __fmul_rn(sg, s[i]));
    }
}

extern "C" int cu_gate_add(float *y, const float *s, const float *gate, int64_t n_tok,
                           int64_t width, void *stream)
{
    if (n_tok * width == 0) return 0;
    cu_launch(gate_add, grid_for(n_tok * width), GL_THREADS, 0, (cudaStream_t)stream, y, s, gate,
              n_tok * width, width);
    return cu_launch_check();
}

__global__ void gather_rows(const float *x, const int32_t *rows, int64_t width, float *out)
{
    pdl_enter();
    const int64_t i = blockIdx.x;
    for (int64_t d = threadIdx.x; d < width; d += blockDim.x)
        out[i * width + d] = x[(int64_t)rows[i] * width + d];
}

extern "C" int cu_gather_rows(const float *x, const int32_t *rows, int64_t n, int64_t width,
                              float *out, void *stream)
{
    if (n == 0) return 0;
    cu_launch(gather_rows, (unsigned)n, GL_THREADS, 0, (cudaStream_t)stream, x, rows, width, out);
    return cu_launch_check();
}
