/* expf — the GPU's expf checked against the host's: strata_expf (expf.cuh) is glibc's expf, bit for
 * bit, so SiLU and the sigmoid gate on the GPU give the CPU backend's bits. That holds only where
 * the host's libm is glibc's table method (2.28 and later) and the device computes it as written;
 * cu_expf_check is the proof a worker takes at start (as cpu.c checks its vector copy), and the
 * GPU test runs it over every float.
 */
#ifndef STRATA_CUDA_EXPF_H
#define STRATA_CUDA_EXPF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cu_expf_sweep: y[i] = strata_expf(the float whose bits are first + i * step, mod 2^32), i < n,
 * into device memory y. Asynchronous on stream; 0 or a CUDA error. */
int cu_expf_sweep(uint32_t first, uint32_t step, int64_t n, float *y, void *stream);

/* cu_expf_check compares strata_expf on the current device with this host's libm expf on the
 * floats k * step (k < 2^32 / step: both signs, every exponent for a step up to 2^23, and inf,
 * NaN, zeros) and on the edges of glibc's special paths (+-88, overflow, underflow). NaN equals
 * any NaN. Blocking; allocates and frees its own buffers. Returns 0 with *n_bad set (and
 * *first_bad, the first input that differed, when *n_bad > 0), STRATA_EINVAL for a step that is
 * not a power of two, STRATA_ENOMEM, or a CUDA error. */
int cu_expf_check(uint32_t step, uint64_t *n_bad, float *first_bad);

#ifdef __cplusplus
}
#endif
#endif
