#include "kernels/cuda/common.cuh"
#include "kernels/cuda/norm.h"

#define NORM_WARPS 4

__global__ void rmsnorm_kernel(const float *x, const float *w, float *y, int64_t rows,
                               int64_t width, float eps)
{
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

extern "C" int cu_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t width,
                          float eps, void *stream)
{
    if (rows <= 0 || width <= 0) return strata_errf(STRATA_EINVAL, "cu_rmsnorm: empty shape");
    dim3 grid((unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS));
    rmsnorm_kernel<<<grid, NORM_WARPS * WARP, 0, (cudaStream_t)stream>>>(x, w, y, rows, width, eps);
    return cu_launch_check();
}

/* One thread per rotated pair; grid (pairs, heads, tokens). */
__global__ void rope_kernel(float *x, const int32_t *pos, int n_head, int head_dim, int n_rot,
                            float step, int neox)
{
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
    rope_kernel<<<grid, 64, 0, (cudaStream_t)stream>>>(x, pos, n_head, head_dim, n_rot, step, neox);
    return cu_launch_check();
}
