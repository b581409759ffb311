#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/expf.cuh"
#include "kernels/cuda/expf.h"

__global__ void expf_sweep(uint32_t first, uint32_t step, int64_t n, float *y)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = strata_expf(__uint_as_float(first + (uint32_t)i * step));
}

extern "C" int cu_expf_sweep(uint32_t first, uint32_t step, int64_t n, float *y, void *stream)
{
    if (n <= 0) return 0;
    const int64_t b = (n + 255) / 256;
    expf_sweep<<<(unsigned)(b > 132 * 16 ? 132 * 16 : b), 256, 0, (cudaStream_t)stream>>>(
        first, step, n, y);
    return cu_launch_check();
}

/* compare: mismatches of y (the GPU's) against libm on the n inputs first + i * step. */
static uint64_t compare(uint32_t first, uint32_t step, int64_t n, const float *y, float *first_bad,
                        uint64_t bad)
{
    for (int64_t i = 0; i < n; i++) {
        const uint32_t u = first + (uint32_t)i * step;
        float x;
        memcpy(&x, &u, 4);
        const float e = expf(x);
        if (memcmp(&e, &y[i], 4) != 0 && !(isnan(e) && isnan(y[i]))) {
            if (!bad) *first_bad = x;
            bad++;
        }
    }
    return bad;
}

extern "C" int cu_expf_check(uint32_t step, uint64_t *n_bad, float *first_bad)
{
    if (step == 0 || (step & (step - 1)))
        return strata_errf(STRATA_EINVAL, "expf check: step %u is not a power of two", step);
    enum { CHUNK = 1 << 20 };
    /* glibc's branch points: |x| = 88 (0x42b00000), log(2^128), log(2^-150), log(2^-149) */
    static const uint32_t edges[] = {0x42b00000u, 0xc2b00000u, 0x42b17217u, 0xc2cff1b4u,
                                     0xc2ce8ecfu};
    const int64_t total = (int64_t)((1ull << 32) / step);
    float *d = NULL, *h = (float *)malloc(CHUNK * sizeof(float));
    int rv = h ? cu_err(cudaMalloc((void **)&d, CHUNK * sizeof(float))) : STRATA_ENOMEM;
    uint64_t bad = 0;
    for (int64_t k = 0; !rv && k < total; k += CHUNK) {
        const int64_t n = total - k < CHUNK ? total - k : CHUNK;
        const uint32_t first = (uint32_t)((uint64_t)k * step);
        if (!(rv = cu_expf_sweep(first, step, n, d, NULL)) &&
            !(rv = cu_err(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost))))
            bad = compare(first, step, n, h, first_bad, bad);
    }
    for (size_t i = 0; !rv && i < sizeof edges / sizeof edges[0]; i++)
        if (!(rv = cu_expf_sweep(edges[i] - 4, 1, 9, d, NULL)) &&
            !(rv = cu_err(cudaMemcpy(h, d, 9 * sizeof(float), cudaMemcpyDeviceToHost))))
            bad = compare(edges[i] - 4, 1, 9, h, first_bad, bad);
    cudaFree(d);
    free(h);
    if (rv == STRATA_ENOMEM) return strata_errf(rv, "out of memory for the expf check");
    if (rv) return strata_errf(rv, "the expf check on the GPU failed");
    *n_bad = bad;
    return 0;
}
