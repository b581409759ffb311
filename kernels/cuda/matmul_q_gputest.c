/* cu_matmul_q, the bit-exact product for prompt chunks, against qdot_ref: for every quantized GPU
 * type and chunks of 1 to 512 tokens (tile edges on both sides: rows not a multiple of 64, tokens
 * not a multiple of 32), every output equal to qdot_ref's bytes and to cu_matvec's for the same
 * rows. Needs a GPU: label "gpu". */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matvec.h"
#include "kernels/cuda/qact.h"
#include "kernels/ref/qdot.h"
#include "tests/testutil.h"

static const uint32_t types[] = {QT_Q8_0, QT_Q5_0, QT_Q4_K,   QT_Q5_K,  QT_Q6_K,
                                 QT_Q2_K, QT_Q3_K, QT_IQ4_XS, QT_IQ4_NL};

static uint64_t rng = 777;
static float frand(void) /* uniform in [-1, 1) */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

START_TEST(matmul_q_equals_qdot_ref)
{
    const uint32_t t = types[_i];
    const int64_t shapes[][2] = {{256, 70}, {512, 129}, {2048, 64}}; /* cols, rows */
    const int toks[] = {1, 5, 17, 32, 33, 64, 100, 512}; /* 32- and 64-token tiles */
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t ncols = shapes[si][0], nrows = shapes[si][1];
        uint64_t rb;
        ck_assert_int_eq(qtype_row_bytes(t, ncols, &rb), 0);
        uint8_t *w = malloc(rb * nrows);
        float *src = malloc(sizeof(float) * ncols);
        for (int64_t r = 0; r < nrows; r++) {
            for (int64_t i = 0; i < ncols; i++)
                src[i] = frand() * (r % 7 == 3 ? 100.0f : 1.0f);
            ck_assert_int_eq(quant_quantize(t, src, w + r * rb, ncols), 0);
        }
        void *dw;
        ck_assert_int_eq(cudaMalloc(&dw, rb * nrows), cudaSuccess);
        ck_assert_int_eq(cudaMemcpy(dw, w, rb * nrows, cudaMemcpyHostToDevice), cudaSuccess);
        const size_t arb = cu_act_row_bytes(t, ncols);
        uint8_t *hact = malloc(quant_act_bytes(t, ncols));
        for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
            const int n = toks[ti];
            if (ncols == 2048 && n > 100) continue; /* the reference is slow on purpose */
            float *x = malloc(sizeof(float) * ncols * n), *dx, *dy, *dy16;
            for (int64_t i = 0; i < ncols * n; i++)
                x[i] = frand();
            for (int64_t i = 0; i < ncols && n > 1; i++)
                x[ncols + i] = 0.0f; /* an all-zero row */
            void *dact;
            ck_assert_int_eq(cudaMalloc((void **)&dx, sizeof(float) * ncols * n), cudaSuccess);
            ck_assert_int_eq(cudaMemcpy(dx, x, sizeof(float) * ncols * n, cudaMemcpyHostToDevice),
                             cudaSuccess);
            ck_assert_int_eq(cudaMalloc(&dact, arb * n), cudaSuccess);
            ck_assert_int_eq(cudaMalloc((void **)&dy, sizeof(float) * nrows * n + 256),
                             cudaSuccess);
            ck_assert_int_eq(cudaMemset(dy, 0xA5, sizeof(float) * nrows * n + 256), cudaSuccess);
            ck_assert_int_eq(cudaMalloc((void **)&dy16, sizeof(float) * nrows * n), cudaSuccess);
            ck_assert_int_eq(cu_quantize_acts(t, dx, ncols, n, dact, NULL), 0);
            ck_assert_int_eq(cu_matmul_q(t, dw, ncols, nrows, dact, n, dy, NULL), 0);
            for (int b = 0; b < n; b += 16)
                ck_assert_int_eq(cu_matvec(t, dw, ncols, nrows, (uint8_t *)dact + b * arb,
                                           n - b < 16 ? n - b : 16, dy16 + (int64_t)b * nrows,
                                           NULL),
                                 0);
            ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
            uint8_t *y = malloc(sizeof(float) * nrows * n + 256);
            float *y16 = malloc(sizeof(float) * nrows * n);
            cudaMemcpy(y, dy, sizeof(float) * nrows * n + 256, cudaMemcpyDeviceToHost);
            cudaMemcpy(y16, dy16, sizeof(float) * nrows * n, cudaMemcpyDeviceToHost);
            for (int i = 0; i < 256; i++)
                ck_assert_msg(y[sizeof(float) * nrows * n + i] == 0xA5, "guard byte %d written", i);
            for (int b = 0; b < n; b++) {
                ck_assert_int_eq(quant_activations(t, x + b * ncols, hact, ncols), 0);
                int64_t bad = -1;
                float got = 0, ref = 0;
                for (int64_t r = 0; r < nrows && bad < 0; r++) {
                    ref = qdot_ref(t, ncols, w + r * rb, hact);
                    memcpy(&got, y + sizeof(float) * (b * nrows + r), 4);
                    if (memcmp(&got, &ref, 4) != 0 || memcmp(&got, &y16[b * nrows + r], 4) != 0)
                        bad = r;
                }
                ck_assert_msg(bad < 0,
                              "%s %lld x %lld, %d tokens, token %d row %lld: %.9g, "
                              "qdot_ref %.9g, matvec %.9g",
                              qtype_name(t), (long long)nrows, (long long)ncols, n, b,
                              (long long)bad, got, ref, bad < 0 ? 0.0f : y16[b * nrows + bad]);
            }
            free(x), free(y), free(y16), cudaFree(dx), cudaFree(dact), cudaFree(dy), cudaFree(dy16);
        }
        free(w), free(src), free(hact), cudaFree(dw);
    }
}
END_TEST

START_TEST(matmul_q_refuses)
{
    ck_assert_int_eq(cu_matmul_q(QT_F16, NULL, 256, 1, NULL, 1, NULL, NULL), STRATA_EUNSUPPORTED);
    ck_assert_int_eq(cu_matmul_q(QT_Q4_1, NULL, 256, 1, NULL, 1, NULL, NULL), STRATA_EUNSUPPORTED);
    ck_assert_int_eq(cu_matmul_q(QT_Q4_K, NULL, 100, 1, NULL, 1, NULL, NULL), STRATA_EINVAL);
    /* the weights are read by 16-byte loads */
    ck_assert_int_eq(cu_matmul_q(QT_Q4_K, (const uint8_t *)NULL + 8, 256, 1, NULL, 1, NULL, NULL),
                     STRATA_EINVAL);
}
END_TEST

int main(void)
{
    setenv("CK_FORK", "no", 1); /* CUDA does not survive fork() */
    int n;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA device: the GPU tests need one (run scripts/gpu-check on a GPU machine)\n");
        return 1;
    }
    Suite *s = suite_create("matmul_q");
    TCase *tc = tcase_create("matmul_q");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, matmul_q_equals_qdot_ref, 0, (int)(sizeof types / sizeof types[0]));
    tcase_add_test(tc, matmul_q_refuses);
    suite_add_tcase(s, tc);
    return test_run(s);
}
