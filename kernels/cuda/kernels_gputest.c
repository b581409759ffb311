/* GPU parity: every CUDA kernel against its plain-C reference on seeded random inputs and odd
 * shapes, with guard bytes after every device output (a kernel that writes one element too many
 * fails). Tolerances are stated per kernel beside its test. Needs a GPU: label "gpu". */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/err.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "common/quant/quant_blocks.h"
#include "common/base/pool.h"
#include "kernels/cpu/moe.h"
#include "kernels/cuda/attn.h"
#include "kernels/cuda/attn_plain.h"
#include "kernels/cuda/glue.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matvec.h"
#include "kernels/cuda/moe_ffn.h"
#include "kernels/cuda/moe_group.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/qact.h"
#include "kernels/cuda/router.h"
#include "kernels/ref/ops.h"
#include "kernels/ref/qdot.h"
#include "tests/testutil.h"

#define GUARD 64 /* guard floats after each output */
#define GUARD_BYTE 0xA5

static uint64_t rng = 12345;
static float frand(void) /* uniform in [-1, 1) */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

static void *dev_upload(const void *h, size_t n)
{
    void *d;
    ck_assert_int_eq(cudaMalloc(&d, n), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

/* dev_out: n floats with GUARD guard floats after them, the guard filled with GUARD_BYTE. */
static float *dev_out(size_t n)
{
    float *d;
    ck_assert_int_eq(cudaMalloc((void **)&d, (n + GUARD) * sizeof(float)), cudaSuccess);
    ck_assert_int_eq(cudaMemset(d, GUARD_BYTE, (n + GUARD) * sizeof(float)), cudaSuccess);
    return d;
}

/* fetch: copy n floats back and check the guard is intact. */
static float *fetch(const float *d, size_t n)
{
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    unsigned char *h = malloc((n + GUARD) * sizeof(float));
    ck_assert_int_eq(cudaMemcpy(h, d, (n + GUARD) * sizeof(float), cudaMemcpyDeviceToHost),
                     cudaSuccess);
    for (size_t i = n * sizeof(float); i < (n + GUARD) * sizeof(float); i++)
        ck_assert_msg(h[i] == GUARD_BYTE, "guard byte %zu after the output was overwritten",
                      i - n * sizeof(float));
    return (float *)h;
}

/* random_weights: nrows x ncols random floats quantized to type; *deq gets their dequantization
 * (what the reference multiplies). */
static void *random_weights(uint32_t type, int64_t nrows, int64_t ncols, float **deq)
{
    uint64_t rb;
    ck_assert_int_eq(qtype_row_bytes(type, ncols, &rb), 0);
    unsigned char *w = malloc(rb * nrows);
    float *src = malloc(sizeof(float) * ncols);
    *deq = malloc(sizeof(float) * ncols * nrows);
    for (int64_t r = 0; r < nrows; r++) {
        for (int64_t i = 0; i < ncols; i++) src[i] = frand();
        ck_assert_int_eq(quant_quantize(type, src, w + r * rb, ncols), 0);
        ck_assert_int_eq(quant_dequantize(type, w + r * rb, *deq + r * ncols, ncols), 0);
    }
    free(src);
    return w;
}

static double ref_dot(const float *a, const float *b, int64_t n, double *absdot)
{
    double s = 0, sa = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i], sa += fabs((double)a[i] * b[i]);
    if (absdot) *absdot = sa;
    return s;
}

/* Types after the first N_FIRST_TYPES (Q5_K, then Q2_K, Q3_K, IQ4_XS, IQ4_NL) run their cases
 * after every other test: the tests share one random stream, so the earlier cases keep the data
 * they passed with on the H200 before these types were added. */
static const uint32_t gpu_types[] = {QT_F32,  QT_F16,  QT_BF16, QT_Q8_0,   QT_Q5_0,  QT_Q4_K,
                                     QT_Q6_K, QT_Q5_K, QT_Q2_K, QT_Q3_K, QT_IQ4_XS, QT_IQ4_NL};
#define N_GPU_TYPES   (int)(sizeof gpu_types / sizeof gpu_types[0])
#define N_FIRST_TYPES 7

/* acts_equal: the GPU's activation rows (qact.h layout) against quant_activations' bytes of the
 * same floats: every q and every scale equal (Q8_0's fp16 scale compared widened), and the sums of
 * 16 those of the q. */
static void acts_equal(uint32_t wtype, const float *x, int64_t n, int na, const uint8_t *gpu)
{
    const uint32_t at = quant_act_type(wtype);
    const int blk = at == QT_Q8_0 ? 32 : 256;
    const size_t arb = cu_act_row_bytes(wtype, n);
    unsigned char *host = malloc(quant_act_bytes(wtype, n));
    for (int r = 0; r < na; r++) {
        ck_assert_int_eq(quant_activations(wtype, x + r * n, host, n), 0);
        const uint8_t *g = gpu + r * arb;
        for (int64_t b = 0; b < n / blk; b++) {
            const int8_t *hq;
            float hd;
            if (at == QT_Q8_0) {
                const struct blk_q8_0 *h = (const struct blk_q8_0 *)host + b;
                hq = h->qs, hd = quant_f16_to_f32(h->d);
            } else {
                const struct blk_q8_K *h = (const struct blk_q8_K *)host + b;
                hq = h->qs, hd = h->d;
            }
            float gd;
            memcpy(&gd, g + n + n / 8 + 4 * b, 4);
            ck_assert_msg(memcmp(&gd, &hd, 4) == 0, "%s acts row %d block %lld: scale %g vs %g",
                          qtype_name(wtype), r, (long long)b, gd, hd);
            ck_assert_msg(memcmp(g + b * blk, hq, blk) == 0, "%s acts row %d block %lld: q differ",
                          qtype_name(wtype), r, (long long)b);
            for (int i = 0; i < blk / 16; i++) {
                int16_t gs, hs = 0;
                memcpy(&gs, g + n + 2 * (b * blk / 16 + i), 2);
                for (int j = 0; j < 16; j++) hs += hq[16 * i + j];
                ck_assert_msg(gs == hs, "%s acts row %d block %lld: sum %d is %d, not %d",
                              qtype_name(wtype), r, (long long)b, i, gs, hs);
            }
        }
    }
    free(host);
}

/* random_acts: na rows of n floats in [-1, 1), with the cases the quantizers branch on: an
 * all-zero 256-element block (row 1), the largest magnitude twice with both signs (row 2, the
 * first one sets the sign), and values on rounding half-steps (row 3). */
static float *random_acts(int64_t n, int na)
{
    float *x = malloc(sizeof(float) * n * na);
    for (int64_t i = 0; i < n * na; i++) x[i] = frand();
    if (na > 1)
        for (int64_t i = 0; i < 256 && i < n; i++) x[n + i] = 0.0f;
    if (na > 2) x[2 * n + 3] = -1.5f, x[2 * n + 10] = 1.5f;
    if (na > 3)
        for (int64_t i = 0; i < n; i++) x[3 * n + i] = (float)((i * 37) % 255 - 127) / 254.0f;
    return x;
}

/* matvec, quantized weights: the GPU quantizes the activations exactly as quant_activations and
 * its products equal qdot_ref bit for bit (same integer dots, same float steps, blocks summed in
 * row order), so the check is equality. Float weights: fp32 products of the exact weights, the
 * only error the summation order: |y - ref| <= 1e-5 * sum|w_i x_i| + 1e-6. Shapes cover one block,
 * partial staging chunks (768, 2560 columns), long rows, and enough rows (17,011) that one
 * activation row takes the 4-rows-per-warp chains. */
START_TEST(matvec_matches_reference)
{
    const int64_t shapes[][2] = {{256, 1},   {512, 37}, {768, 64},    {2048, 129},
                                 {2560, 33}, {4096, 9}, {512, 8193}, {2560, 17011}};
    const int acts[] = {1, 3, 4, 7, 16};
    { /* one type a loop iteration (_i indexes gpu_types) */
        uint32_t t = gpu_types[_i];
        const bool quantized = qtype_get(t)->blck > 1;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int64_t ncols = shapes[si][0], nrows = shapes[si][1];
            float *deq;
            void *w = random_weights(t, nrows, ncols, &deq);
            uint64_t rb;
            qtype_row_bytes(t, ncols, &rb);
            void *dw = dev_upload(w, rb * nrows);
            const size_t arb = cu_act_row_bytes(t, ncols);
            unsigned char *hact = malloc(quant_act_bytes(t, ncols));
            for (size_t ai = 0; ai < sizeof acts / sizeof acts[0]; ai++) {
                int na = acts[ai];
                if (nrows > 10000 && na > 3) continue; /* the reference is slow on purpose */
                float *x = random_acts(ncols, na);
                float *dx = dev_upload(x, sizeof(float) * ncols * na);
                void *dact;
                ck_assert_int_eq(cudaMalloc(&dact, arb * na), cudaSuccess);
                ck_assert_int_eq(cu_quantize_acts(t, dx, ncols, na, dact, NULL), 0);
                float *dy = dev_out(nrows * na);
                ck_assert_int_eq(cu_matvec(t, dw, ncols, nrows, dact, na, dy, NULL), 0);
                float *y = fetch(dy, nrows * na);
                if (quantized) {
                    uint8_t *gact = malloc(arb * na);
                    ck_assert_int_eq(cudaMemcpy(gact, dact, arb * na, cudaMemcpyDeviceToHost), 0);
                    acts_equal(t, x, ncols, na, gact);
                    free(gact);
                }
                for (int b = 0; b < na; b++) {
                    if (quantized) ck_assert_int_eq(quant_activations(t, x + b * ncols, hact, ncols), 0);
                    for (int64_t r = 0; r < nrows; r++) {
                        float got = y[b * nrows + r];
                        if (quantized) {
                            float ref = qdot_ref(t, ncols, (uint8_t *)w + r * rb, hact);
                            ck_assert_msg(memcmp(&got, &ref, 4) == 0,
                                          "%s %lldx%lld act %d/%d row %lld: %.9g vs qdot_ref %.9g",
                                          qtype_name(t), (long long)nrows, (long long)ncols, b, na,
                                          (long long)r, got, ref);
                        } else {
                            double ad, ref = ref_dot(deq + r * ncols, x + b * ncols, ncols, &ad);
                            ck_assert_msg(fabs(got - ref) <= 1e-5 * ad + 1e-6,
                                          "%s %lldx%lld act %d row %lld: %g vs %g", qtype_name(t),
                                          (long long)nrows, (long long)ncols, b, (long long)r, got,
                                          ref);
                        }
                    }
                }
                free(y), free(x), cudaFree(dx), cudaFree(dact), cudaFree(dy);
            }
            free(hact), free(w), free(deq), cudaFree(dw);
        }
    }
}
END_TEST

START_TEST(matvec_refuses_cpu_types)
{
    ck_assert_int_eq(cu_matvec(QT_Q4_1, NULL, 256, 1, NULL, 1, NULL, NULL), STRATA_EUNSUPPORTED);
    ck_assert_int_eq(cu_matvec(QT_Q4_K, NULL, 100, 1, NULL, 1, NULL, NULL), STRATA_EINVAL);
    ck_assert_int_eq(cu_matvec(QT_Q8_0, NULL, 64, 1, NULL, 17, NULL, NULL), STRATA_EINVAL);
    ck_assert_int_eq(cu_matvec(QT_Q8_0, (void *)8, 64, 1, NULL, 1, NULL, NULL), STRATA_EINVAL);
    ck_assert_int_eq(cu_quantize_acts(QT_Q4_1, NULL, 256, 1, NULL, NULL), STRATA_EUNSUPPORTED);
    ck_assert_int_eq(cu_quantize_acts(QT_Q4_K, NULL, 128, 1, NULL, NULL), STRATA_EINVAL);
    /* 512 int8, 32 int16 sums and 2 float scales, padded to 16 bytes; floats stay floats */
    ck_assert_uint_eq(cu_act_row_bytes(QT_Q4_K, 512), 592);
    ck_assert_uint_eq(cu_act_row_bytes(QT_Q8_0, 64), 80);
    ck_assert_uint_eq(cu_act_row_bytes(QT_F16, 64), 256);
}
END_TEST

/* matmul: activations rounded to fp16 (relative 2^-11 each), weights rounded to fp16 too (they
 * are exact in fp16 only for the quantized types' small integers times scales): bound
 * |y - ref| <= 2e-3 * sum|w_i x_i| + 1e-4. */
START_TEST(matmul_matches_reference)
{
    const int64_t shapes[][3] = {{256, 64, 64}, {512, 100, 37}, {2048, 129, 130}, {768, 64, 16}};
    { /* one type a loop iteration (_i indexes gpu_types) */
        uint32_t t = gpu_types[_i];
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int64_t ncols = shapes[si][0], nrows = shapes[si][1], ntok = shapes[si][2];
            float *deq;
            void *w = random_weights(t, nrows, ncols, &deq);
            uint64_t rb;
            qtype_row_bytes(t, ncols, &rb);
            void *dw = dev_upload(w, rb * nrows);
            float *x = malloc(sizeof(float) * ncols * ntok);
            for (int64_t i = 0; i < ncols * ntok; i++) x[i] = frand();
            float *dx = dev_upload(x, sizeof(float) * ncols * ntok);
            float *dy = dev_out(nrows * ntok);
            ck_assert_int_eq(cu_matmul(t, dw, ncols, nrows, dx, ntok, dy, NULL), 0);
            float *y = fetch(dy, nrows * ntok);
            for (int64_t m = 0; m < ntok; m++)
                for (int64_t r = 0; r < nrows; r++) {
                    double ad, ref = ref_dot(deq + r * ncols, x + m * ncols, ncols, &ad);
                    ck_assert_msg(fabs(y[m * nrows + r] - ref) <= 2e-3 * ad + 1e-4,
                                  "%s tok %lld row %lld: %g vs %g", qtype_name(t), (long long)m,
                                  (long long)r, y[m * nrows + r], ref);
                }
            free(y), free(x), free(w), free(deq), cudaFree(dx), cudaFree(dy), cudaFree(dw);
        }
    }
}
END_TEST

/* rmsnorm: the reference sums squares in double, the GPU in float per lane then a tree:
 * relative 1e-5. Per-head rows (q/k norms) are the same kernel with width = head_dim. */
START_TEST(rmsnorm_matches_reference)
{
    const int64_t shapes[][2] = {{1, 2048}, {37, 128}, {5, 4096}, {130, 64}, {3, 100}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si][0], width = shapes[si][1];
        float *x = malloc(sizeof(float) * rows * width), *w = malloc(sizeof(float) * width);
        for (int64_t i = 0; i < rows * width; i++) x[i] = 3.0f * frand();
        for (int64_t i = 0; i < width; i++) w[i] = frand();
        float *dx = dev_upload(x, sizeof(float) * rows * width), *dw = dev_upload(w, sizeof(float) * width);
        float *dy = dev_out(rows * width);
        ck_assert_int_eq(cu_rmsnorm(dx, dw, dy, rows, width, 1e-6f, NULL), 0);
        float *y = fetch(dy, rows * width);
        float *ref = malloc(sizeof(float) * width);
        for (int64_t r = 0; r < rows; r++) {
            ops_rmsnorm(ref, x + r * width, w, (uint32_t)width, 1e-6f);
            for (int64_t i = 0; i < width; i++)
                ck_assert_msg(fabsf(y[r * width + i] - ref[i]) <= 1e-5f * fabsf(ref[i]) + 1e-6f,
                              "rmsnorm %lldx%lld [%lld][%lld]: %g vs %g", (long long)rows,
                              (long long)width, (long long)r, (long long)i, y[r * width + i], ref[i]);
        }
        /* the residual add fused: x + r, then the norm, the bits of cu_add then cu_rmsnorm */
        float *r = malloc(sizeof(float) * rows * width);
        for (int64_t i = 0; i < rows * width; i++) r[i] = frand();
        float *dr = dev_upload(r, sizeof(float) * rows * width);
        float *dx1 = dev_upload(x, sizeof(float) * rows * width), *dx2 = dev_upload(x, sizeof(float) * rows * width);
        float *dy1 = dev_out(rows * width), *dy2 = dev_out(rows * width);
        ck_assert_int_eq(cu_add(dx1, dr, rows * width, NULL), 0);
        ck_assert_int_eq(cu_rmsnorm(dx1, dw, dy1, rows, width, 1e-6f, NULL), 0);
        ck_assert_int_eq(cu_add_rmsnorm(dx2, dr, dw, dy2, rows, width, 1e-6f, NULL), 0);
        float *y1 = fetch(dy1, rows * width), *y2 = fetch(dy2, rows * width);
        float *hx1 = malloc(sizeof(float) * rows * width), *hx2 = malloc(sizeof(float) * rows * width);
        cudaMemcpy(hx1, dx1, sizeof(float) * rows * width, cudaMemcpyDeviceToHost);
        cudaMemcpy(hx2, dx2, sizeof(float) * rows * width, cudaMemcpyDeviceToHost);
        ck_assert_msg(memcmp(hx1, hx2, sizeof(float) * rows * width) == 0 &&
                          memcmp(y1, y2, sizeof(float) * rows * width) == 0,
                      "add_rmsnorm %lldx%lld differs from cu_add then cu_rmsnorm", (long long)rows,
                      (long long)width);
        free(r), free(y1), free(y2), free(hx1), free(hx2);
        cudaFree(dr), cudaFree(dx1), cudaFree(dx2), cudaFree(dy1), cudaFree(dy2);
        free(x), free(w), free(y), free(ref), cudaFree(dx), cudaFree(dw), cudaFree(dy);
    }
}
END_TEST

/* cu_qk_rope_store against its three steps (cu_rmsnorm per head, cu_rope, cu_kv_store) on the
 * same inputs: q, k and both pools within 1e-5 of |x| + 1 (the same expressions; the count of
 * bit-equal elements is printed), NeoX and normal RoPE, with and without head norms, f16 and f32
 * pools, tokens scattered over blocks. */
START_TEST(qk_rope_store_matches_its_steps)
{
    const int n_tok = 5, n_head = 8, n_kv = 2, hd = 128, bs = 16, n_blocks = 8;
    const int32_t pos[5] = {0, 1, 17, 300, 40000}, slot[5] = {3, 17, 40, 127, 64};
    const size_t NQ = (size_t)n_tok * n_head * hd, NK = (size_t)n_tok * n_kv * hd;
    const size_t pool = (size_t)n_blocks * n_kv * bs * hd;
    float *q = malloc(4 * NQ), *k = malloc(4 * NK), *v = malloc(4 * NK), *w = malloc(4 * 2 * hd);
    for (size_t i = 0; i < NQ; i++) q[i] = 2.0f * frand();
    for (size_t i = 0; i < NK; i++) k[i] = 2.0f * frand(), v[i] = frand();
    for (int i = 0; i < 2 * hd; i++) w[i] = 1.0f + 0.5f * frand();
    float *dw = dev_upload(w, 4 * 2 * hd);
    int32_t *dpos = dev_upload(pos, sizeof pos), *dslot = dev_upload(slot, sizeof slot);
    for (int c = 0; c < 8; c++) {
        const int neox = c & 1, norm = (c >> 1) & 1, f16 = (c >> 2) & 1, es = f16 ? 2 : 4;
        float *q1 = dev_upload(q, 4 * NQ), *k1 = dev_upload(k, 4 * NK), *v1 = dev_upload(v, 4 * NK);
        float *q2 = dev_upload(q, 4 * NQ), *k2 = dev_upload(k, 4 * NK);
        void *kp1, *vp1, *kp2, *vp2;
        cudaMalloc(&kp1, es * pool), cudaMalloc(&vp1, es * pool), cudaMalloc(&kp2, es * pool),
            cudaMalloc(&vp2, es * pool);
        cudaMemset(kp1, 0, es * pool), cudaMemset(vp1, 0, es * pool), cudaMemset(kp2, 0, es * pool),
            cudaMemset(vp2, 0, es * pool);
        if (norm) {
            ck_assert_int_eq(cu_rmsnorm(q1, dw, q1, (int64_t)n_tok * n_head, hd, 1e-6f, NULL), 0);
            ck_assert_int_eq(cu_rmsnorm(k1, dw + hd, k1, (int64_t)n_tok * n_kv, hd, 1e-6f, NULL), 0);
        }
        ck_assert_int_eq(cu_rope(q1, dpos, n_tok, n_head, hd, hd, 1e6f, neox, NULL), 0);
        ck_assert_int_eq(cu_rope(k1, dpos, n_tok, n_kv, hd, hd, 1e6f, neox, NULL), 0);
        ck_assert_int_eq(cu_kv_store(k1, v1, dslot, n_tok, n_kv, hd, bs, f16, kp1, vp1, NULL), 0);
        ck_assert_int_eq(cu_qk_rope_store(q2, k2, v1, norm ? dw : NULL, norm ? dw + hd : NULL, dpos,
                                          dslot, n_tok, n_head, n_kv, hd, hd, 1e6f, neox, 1e-6f,
                                          f16, bs, kp2, vp2, NULL), 0);
        ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
        struct {
            const void *a, *b;
            size_t n;
            int half;
        } cmp[] = {{q1, q2, NQ, 0}, {k1, k2, NK, 0}, {kp1, kp2, pool, f16}, {vp1, vp2, pool, f16}};
        size_t same = 0, total = 0;
        for (int i = 0; i < 4; i++) {
            uint8_t *a = malloc(4 * cmp[i].n), *b = malloc(4 * cmp[i].n);
            const size_t eb = cmp[i].half ? 2 : 4;
            cudaMemcpy(a, cmp[i].a, eb * cmp[i].n, cudaMemcpyDeviceToHost);
            cudaMemcpy(b, cmp[i].b, eb * cmp[i].n, cudaMemcpyDeviceToHost);
            for (size_t e = 0; e < cmp[i].n; e++) {
                float x, y;
                if (cmp[i].half) {
                    x = quant_f16_to_f32(((uint16_t *)a)[e]), y = quant_f16_to_f32(((uint16_t *)b)[e]);
                } else {
                    x = ((float *)a)[e], y = ((float *)b)[e];
                }
                same += memcmp(a + eb * e, b + eb * e, eb) == 0, total++;
                ck_assert_msg(fabsf(x - y) <= 1e-5f * (fabsf(x) + 1.0f) + (cmp[i].half ? 1e-3f * fabsf(x) : 0),
                              "qk_rope_store case %d array %d element %zu: %g vs %g", c, i, e, x, y);
            }
            free(a), free(b);
        }
        printf("qk_rope_store neox %d norm %d f16 %d: %zu of %zu elements bit-equal\n", neox, norm,
               f16, same, total);
        cudaFree(q1), cudaFree(k1), cudaFree(v1), cudaFree(q2), cudaFree(k2);
        cudaFree(kp1), cudaFree(vp1), cudaFree(kp2), cudaFree(vp2);
    }
    free(q), free(k), free(v), free(w);
    cudaFree(dw), cudaFree(dpos), cudaFree(dslot);
}
END_TEST

/* rope: same angle construction as the reference; sin/cos of the GPU's libm may differ by 2 ulp,
 * times positions up to 40K: absolute 2e-3 on unit-scale inputs. */
START_TEST(rope_matches_reference)
{
    const int n_head = 6, head_dim = 128;
    const int rots[] = {128, 64};
    const int32_t pos[] = {0, 1, 17, 511, 4095, 40000};
    const int n_tok = 6;
    for (int neox = 0; neox < 2; neox++)
        for (int ri = 0; ri < 2; ri++) {
            size_t n = (size_t)n_tok * n_head * head_dim;
            float *x = malloc(sizeof(float) * n);
            for (size_t i = 0; i < n; i++) x[i] = frand();
            float *dx = dev_out(n);
            cudaMemcpy(dx, x, sizeof(float) * n, cudaMemcpyHostToDevice);
            int32_t *dp = dev_upload(pos, sizeof pos);
            ck_assert_int_eq(cu_rope(dx, dp, n_tok, n_head, head_dim, rots[ri], 1e6f, neox, NULL), 0);
            float *y = fetch(dx, n);
            for (int t = 0; t < n_tok; t++)
                ops_rope(x + (size_t)t * n_head * head_dim, n_head, head_dim, rots[ri], pos[t], 1e6f,
                         neox);
            for (size_t i = 0; i < n; i++)
                ck_assert_msg(fabsf(y[i] - x[i]) <= 2e-3f, "rope neox=%d n_rot=%d [%zu]: %g vs %g",
                              neox, rots[ri], i, y[i], x[i]);
            free(x), free(y), cudaFree(dx), cudaFree(dp);
        }
}
END_TEST

/* router: same experts chosen (ties to the lower id in both), weights within 1e-5 relative. */
START_TEST(router_matches_reference)
{
    const int cfg[][3] = {{128, 8, 0}, {64, 8, 1}, {8, 2, 1}, {60, 4, 0}, {256, 16, 1}};
    const int n_tok = 33;
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++)
        for (int mode = 0; mode < 2; mode++) {
            int n_exp = cfg[ci][0], k = cfg[ci][1], renorm = cfg[ci][2];
            float *l = malloc(sizeof(float) * n_tok * n_exp);
            for (int i = 0; i < n_tok * n_exp; i++) l[i] = 4.0f * frand();
            l[3] = l[4]; /* a tie */
            float *dl = dev_upload(l, sizeof(float) * n_tok * n_exp);
            int32_t *di;
            ck_assert_int_eq(cudaMalloc((void **)&di, sizeof(int32_t) * n_tok * k), cudaSuccess);
            float *dw = dev_out((size_t)n_tok * k);
            ck_assert_int_eq(cu_router_topk(dl, n_tok, n_exp, k, mode, renorm, di, dw, NULL), 0);
            float *w = fetch(dw, (size_t)n_tok * k);
            int32_t *ids = malloc(sizeof(int32_t) * n_tok * k);
            cudaMemcpy(ids, di, sizeof(int32_t) * n_tok * k, cudaMemcpyDeviceToHost);
            for (int t = 0; t < n_tok; t++) {
                float p[256], rw[16];
                uint32_t idx[16];
                memcpy(p, l + t * n_exp, sizeof(float) * n_exp);
                if (mode == CU_ROUTER_SOFTMAX_TOPK) ops_softmax(p, n_exp);
                ops_topk(p, n_exp, k, idx);
                float sum = 0;
                for (int j = 0; j < k; j++) rw[j] = p[idx[j]], sum += rw[j];
                if (mode == CU_ROUTER_TOPK_SOFTMAX) ops_softmax(rw, k);
                else if (renorm)
                    for (int j = 0; j < k; j++) rw[j] /= sum;
                for (int j = 0; j < k; j++) {
                    ck_assert_int_eq(ids[t * k + j], (int32_t)idx[j]);
                    ck_assert_msg(fabsf(w[t * k + j] - rw[j]) <= 1e-5f * rw[j] + 1e-7f,
                                  "router mode %d tok %d j %d: %g vs %g", mode, t, j, w[t * k + j], rw[j]);
                }
            }
            free(l), free(w), free(ids), cudaFree(dl), cudaFree(di), cudaFree(dw);
        }
}
END_TEST

/* attention: decode rows (one per sequence, several splits) and a causal prompt chunk, GQA,
 * against ops_attention over the same paged cache; relative 1e-4 of the output scale. */
START_TEST(attention_matches_reference)
{
    const int n_head = 8, n_kv = 2, hd = 128, bs = 16;
    const int lens[] = {1, 15, 16, 17, 300, 2500};
    const int n_seq = 6, max_blocks = (2500 + bs - 1) / bs;
    const int n_blocks = n_seq * max_blocks;
    size_t blk_floats = (size_t)n_kv * bs * hd;
    /* K and V pools in one allocation, so the reference's view reaches V at a fixed offset from
     * each K block (v_off) */
    float *k = malloc(sizeof(float) * 2 * n_blocks * blk_floats), *v = k + n_blocks * blk_floats;
    for (size_t i = 0; i < n_blocks * blk_floats; i++) k[i] = frand(), v[i] = frand();
    /* block tables: a shuffled assignment so logical order differs from physical order */
    int32_t *bt = malloc(sizeof(int32_t) * n_seq * max_blocks);
    for (int i = 0; i < n_seq * max_blocks; i++) bt[i] = (i * 7919) % n_blocks;
    float *q = malloc(sizeof(float) * n_seq * n_head * hd);
    for (int i = 0; i < n_seq * n_head * hd; i++) q[i] = 2.0f * frand();
    int32_t seq[6], len[6];
    for (int s = 0; s < n_seq; s++) seq[s] = s, len[s] = lens[s];
    float *dk = dev_upload(k, sizeof(float) * n_blocks * blk_floats);
    float *dv = dev_upload(v, sizeof(float) * n_blocks * blk_floats);
    int32_t *dbt = dev_upload(bt, sizeof(int32_t) * n_seq * max_blocks);
    float *dq = dev_upload(q, sizeof(float) * n_seq * n_head * hd);
    int32_t *dseq = dev_upload(seq, sizeof seq), *dlen = dev_upload(len, sizeof len);
    struct cu_kv kv = {dk, dv, bs, n_kv, hd};
    float **blocks = malloc(sizeof(float *) * n_blocks);
    const int splits[] = {1, 3, 8};
    for (int si = 0; si < 3; si++) {
        void *ws;
        cudaMalloc(&ws, cu_attn_workspace_bytes(n_seq, n_head, hd, splits[si]));
        float *dout = dev_out((size_t)n_seq * n_head * hd);
        ck_assert_int_eq(cu_attention(dq, n_seq, n_head, &kv, dbt, max_blocks, dseq, dlen, splits[si],
                                      ws, dout, NULL), 0);
        float *out = fetch(dout, (size_t)n_seq * n_head * hd);
        for (int s = 0; s < n_seq; s++)
            for (int h = 0; h < n_head; h++) {
                int kvh = h / (n_head / n_kv);
                for (int b = 0; b < max_blocks; b++) blocks[b] = k + (size_t)bt[s * max_blocks + b] * blk_floats;
                float ref[128];
                struct ops_kv_view view = {.blocks = (float *const *)blocks,
                                           .block_tokens = bs,
                                           .k_off = (size_t)kvh * bs * hd,
                                           .v_off = (size_t)n_blocks * blk_floats +
                                                    (size_t)kvh * bs * hd,
                                           .k_stride = hd,
                                           .v_stride = hd};
                ops_attention(ref, q + (s * n_head + h) * hd, hd, hd, 1.0f / sqrtf((float)hd), &view,
                              lens[s]);
                for (int d = 0; d < hd; d++)
                    ck_assert_msg(fabsf(out[(s * n_head + h) * hd + d] - ref[d]) <= 1e-4f,
                                  "attention split %d seq %d head %d dim %d: %g vs %g", splits[si], s,
                                  h, d, out[(s * n_head + h) * hd + d], ref[d]);
            }
        free(out), cudaFree(dout), cudaFree(ws);
    }
    /* A causal prompt chunk: 40 tokens of sequence 5 at positions 100..139. */
    const int n_q = 40, p0 = 100;
    int32_t cseq[40], clen[40];
    for (int i = 0; i < n_q; i++) cseq[i] = 5, clen[i] = p0 + i + 1;
    float *cq = malloc(sizeof(float) * n_q * n_head * hd);
    for (int i = 0; i < n_q * n_head * hd; i++) cq[i] = frand();
    float *dcq = dev_upload(cq, sizeof(float) * n_q * n_head * hd);
    int32_t *dcseq = dev_upload(cseq, sizeof cseq), *dclen = dev_upload(clen, sizeof clen);
    void *ws;
    cudaMalloc(&ws, cu_attn_workspace_bytes(n_q, n_head, hd, 1));
    float *dout = dev_out((size_t)n_q * n_head * hd);
    ck_assert_int_eq(cu_attention(dcq, n_q, n_head, &kv, dbt, max_blocks, dcseq, dclen, 1, ws, dout,
                                  NULL), 0);
    float *out = fetch(dout, (size_t)n_q * n_head * hd);
    for (int b = 0; b < max_blocks; b++) blocks[b] = k + (size_t)bt[5 * max_blocks + b] * blk_floats;
    for (int i = 0; i < n_q; i++)
        for (int h = 0; h < n_head; h++) {
            int kvh = h / (n_head / n_kv);
            struct ops_kv_view view = {.blocks = (float *const *)blocks,
                                       .block_tokens = bs,
                                       .k_off = (size_t)kvh * bs * hd,
                                       .v_off =
                                           (size_t)n_blocks * blk_floats + (size_t)kvh * bs * hd,
                                       .k_stride = hd,
                                       .v_stride = hd};
            float ref[128];
            ops_attention(ref, cq + (i * n_head + h) * hd, hd, hd, 1.0f / sqrtf((float)hd), &view,
                          clen[i]);
            for (int d = 0; d < hd; d++)
                ck_assert_msg(fabsf(out[(i * n_head + h) * hd + d] - ref[d]) <= 1e-4f,
                              "prefill attention tok %d head %d dim %d", i, h, d);
        }
    free(out), free(cq), free(k), free(bt), free(q), free(blocks);
    cudaFree(dout), cudaFree(ws), cudaFree(dcq), cudaFree(dcseq), cudaFree(dclen), cudaFree(dk),
        cudaFree(dv), cudaFree(dbt), cudaFree(dq), cudaFree(dseq), cudaFree(dlen);
}
END_TEST

/* The attention kernels that split each row by its own length: attn_plain.cu over fp32 and fp16
 * pools and attn.cu's cu_attention_rows over fp32, against ops_attention on the same
 * (half-rounded, for fp16) keys and values, within 1e-4; rows at and around the chunk edges (128
 * and 256 keys) and a long one (5000: many chunks, more than a batch's grid has lanes for).
 * Each row's output is the same bits computed alone, in the batch of seven and in one of 16. */
enum { AK_PLAIN_F32, AK_PLAIN_F16, AK_ROWS_F32 };

static int attn_rows_call(int kind, const float *q, int n_q, int n_head, const void *k,
                          const void *v, int bs, int n_kv, int hd, const int32_t *bt, int bt_stride,
                          const int32_t *seq, const int32_t *len, int max_len, void *ws, float *out)
{
    if (kind == AK_ROWS_F32) {
        const struct cu_kv kv = {k, v, bs, n_kv, hd};
        return cu_attention_rows(q, n_q, n_head, &kv, bt, bt_stride, seq, len, max_len, ws, out,
                                 NULL);
    }
    return cu_attention_plain(q, n_q, n_head, k, v, kind == AK_PLAIN_F16, bs, n_kv, hd, bt,
                              bt_stride, seq, len, max_len, ws, out, NULL);
}

START_TEST(attention_rows_match_reference)
{
    const int n_head = 8, n_kv = 2, hd = 128, bs = 16;
    const int lens[] = {1, 128, 129, 255, 256, 257, 5000}; /* chunks of 128 (plain), 256 (rows) */
    const int n_seq = 7, max_len = 5000, max_blocks = (max_len + bs - 1) / bs;
    const int n_blocks = n_seq * max_blocks;
    const size_t blk = (size_t)n_kv * bs * hd, pool = (size_t)n_blocks * blk;
    const char *names[] = {"plain f32", "plain f16", "rows f32"};
    float *kvf = malloc(sizeof(float) * 2 * pool); /* K then V: the reference's v_off reaches V */
    for (size_t i = 0; i < 2 * pool; i++) kvf[i] = frand();
    int32_t *bt = malloc(sizeof(int32_t) * n_seq * max_blocks);
    for (int i = 0; i < n_seq * max_blocks; i++) bt[i] = (i * 7919) % n_blocks;
    float *q = malloc(sizeof(float) * CU_ATTN_MAX_ROWS * n_head * hd);
    for (int i = 0; i < n_seq * n_head * hd; i++) q[i] = 2.0f * frand();
    int32_t seq[CU_ATTN_MAX_ROWS], len[CU_ATTN_MAX_ROWS];
    for (int r = 0; r < CU_ATTN_MAX_ROWS; r++) { /* rows 7..15: the seven again, in turn */
        seq[r] = r % n_seq, len[r] = lens[r % n_seq];
        memcpy(q + r * n_head * hd, q + (r % n_seq) * n_head * hd, sizeof(float) * n_head * hd);
    }
    int32_t *dbt = dev_upload(bt, sizeof(int32_t) * n_seq * max_blocks);
    float *dq = dev_upload(q, sizeof(float) * CU_ATTN_MAX_ROWS * n_head * hd);
    int32_t *dseq = dev_upload(seq, sizeof seq), *dlen = dev_upload(len, sizeof len);
    size_t wsb = cu_attn_plain_workspace_bytes(n_head, hd, max_len);
    if (cu_attn_rows_workspace_bytes(n_head, hd, max_len) > wsb)
        wsb = cu_attn_rows_workspace_bytes(n_head, hd, max_len);
    void *ws;
    ck_assert_int_eq(cudaMalloc(&ws, wsb), cudaSuccess);
    ck_assert_int_eq(cudaMemset(ws, 0, wsb), cudaSuccess); /* the merge counters start at zero */
    float **blocks = malloc(sizeof(float *) * n_blocks);
    uint16_t *half = malloc(sizeof(uint16_t) * 2 * pool);
    const int kinds[] = {AK_PLAIN_F32, AK_ROWS_F32, AK_PLAIN_F16}; /* f16 last: it rounds kvf */
    for (int ki = 0; ki < 3; ki++) {
        const int kind = kinds[ki], f16 = kind == AK_PLAIN_F16;
        if (f16)
            for (size_t i = 0; i < 2 * pool; i++) { /* the reference reads what the pool holds */
                half[i] = quant_f32_to_f16(kvf[i]);
                kvf[i] = quant_f16_to_f32(half[i]);
            }
        void *dk = f16 ? dev_upload(half, 2 * pool) : dev_upload(kvf, 4 * pool);
        void *dv = f16 ? dev_upload(half + pool, 2 * pool) : dev_upload(kvf + pool, 4 * pool);
        float *dout = dev_out((size_t)n_seq * n_head * hd);
        ck_assert_int_eq(attn_rows_call(kind, dq, n_seq, n_head, dk, dv, bs, n_kv, hd, dbt,
                                        max_blocks, dseq, dlen, max_len, ws, dout), 0);
        float *out = fetch(dout, (size_t)n_seq * n_head * hd);
        for (int s = 0; s < n_seq; s++) {
            for (int h = 0; h < n_head; h++) {
                const int kvh = h / (n_head / n_kv);
                for (int b = 0; b < max_blocks; b++)
                    blocks[b] = kvf + (size_t)bt[s * max_blocks + b] * blk;
                float ref[128];
                struct ops_kv_view view = {.blocks = (float *const *)blocks,
                                           .block_tokens = bs,
                                           .k_off = (size_t)kvh * bs * hd,
                                           .v_off = pool + (size_t)kvh * bs * hd,
                                           .k_stride = hd,
                                           .v_stride = hd};
                ops_attention(ref, q + (s * n_head + h) * hd, hd, hd, 1.0f / sqrtf((float)hd),
                              &view, lens[s]);
                for (int d = 0; d < hd; d++)
                    ck_assert_msg(fabsf(out[(s * n_head + h) * hd + d] - ref[d]) <= 1e-4f,
                                  "attention %s, %d keys, head %d dim %d: %g vs %g", names[kind],
                                  lens[s], h, d, out[(s * n_head + h) * hd + d], ref[d]);
            }
            /* alone: another grid (more chunk lanes), the same bits */
            float *d1 = dev_out((size_t)n_head * hd);
            ck_assert_int_eq(attn_rows_call(kind, dq + s * n_head * hd, 1, n_head, dk, dv, bs, n_kv,
                                            hd, dbt, max_blocks, dseq + s, dlen + s, max_len, ws,
                                            d1), 0);
            float *o1 = fetch(d1, (size_t)n_head * hd);
            ck_assert_msg(memcmp(o1, out + s * n_head * hd, sizeof(float) * n_head * hd) == 0,
                          "attention %s, %d keys: alone differs from in the batch", names[kind],
                          lens[s]);
            free(o1), cudaFree(d1);
        }
        /* 16 rows: fewer chunk lanes than the 5000-key row's 20 chunks, so its CTAs loop */
        float *d16 = dev_out((size_t)CU_ATTN_MAX_ROWS * n_head * hd);
        ck_assert_int_eq(attn_rows_call(kind, dq, CU_ATTN_MAX_ROWS, n_head, dk, dv, bs, n_kv, hd,
                                        dbt, max_blocks, dseq, dlen, max_len, ws, d16), 0);
        float *o16 = fetch(d16, (size_t)CU_ATTN_MAX_ROWS * n_head * hd);
        for (int r = 0; r < CU_ATTN_MAX_ROWS; r++)
            ck_assert_msg(memcmp(o16 + r * n_head * hd, out + (r % n_seq) * n_head * hd,
                                 sizeof(float) * n_head * hd) == 0,
                          "attention %s, %d keys: row %d of 16 differs", names[kind], len[r], r);
        if (kind != AK_ROWS_F32) {
            /* a prompt chunk's tiles: the 16 rows (seven sequences in one tile), then 300 rows of
             * the 5000-key sequence (lengths 4701 .. 5000, a part-filled last tile): the bits of
             * cu_attention_plain taking them 16 at a time */
            ck_assert(cu_attn_tiles_ok(n_head, n_kv, hd, f16));
            float *dt = dev_out((size_t)CU_ATTN_MAX_ROWS * n_head * hd);
            ck_assert_int_eq(cu_attention_tiles(dq, CU_ATTN_MAX_ROWS, n_head, dk, dv, f16, bs, n_kv,
                                                hd, dbt, max_blocks, dseq, dlen, dt, NULL), 0);
            float *ot = fetch(dt, (size_t)CU_ATTN_MAX_ROWS * n_head * hd);
            ck_assert_msg(memcmp(ot, o16, sizeof(float) * CU_ATTN_MAX_ROWS * n_head * hd) == 0,
                          "attention %s: the tiles differ from the rows kernel", names[kind]);
            free(ot), cudaFree(dt);
            enum { NC = 300 };
            float *qc = malloc(sizeof(float) * NC * n_head * hd);
            int32_t cseq[NC], clen[NC];
            for (int i = 0; i < NC * n_head * hd; i++) qc[i] = 2.0f * frand();
            for (int r = 0; r < NC; r++) cseq[r] = 6, clen[r] = 4701 + r;
            float *dqc = dev_upload(qc, sizeof(float) * NC * n_head * hd);
            int32_t *dcs = dev_upload(cseq, sizeof cseq), *dcl = dev_upload(clen, sizeof clen);
            float *dpr = dev_out((size_t)NC * n_head * hd), *dti = dev_out((size_t)NC * n_head * hd);
            for (int r = 0; r < NC; r += CU_ATTN_MAX_ROWS)
                ck_assert_int_eq(attn_rows_call(kind, dqc + r * n_head * hd,
                                                NC - r < CU_ATTN_MAX_ROWS ? NC - r : CU_ATTN_MAX_ROWS,
                                                n_head, dk, dv, bs, n_kv, hd, dbt, max_blocks,
                                                dcs + r, dcl + r, max_len, ws,
                                                dpr + r * n_head * hd), 0);
            ck_assert_int_eq(cu_attention_tiles(dqc, NC, n_head, dk, dv, f16, bs, n_kv, hd, dbt,
                                                max_blocks, dcs, dcl, dti, NULL), 0);
            float *opr = fetch(dpr, (size_t)NC * n_head * hd), *oti = fetch(dti, (size_t)NC * n_head * hd);
            for (int r = 0; r < NC; r++)
                ck_assert_msg(memcmp(opr + r * n_head * hd, oti + r * n_head * hd,
                                     sizeof(float) * n_head * hd) == 0,
                              "attention %s: chunk row %d (%d keys), the tiles differ", names[kind],
                              r, clen[r]);
            free(qc), free(opr), free(oti);
            cudaFree(dqc), cudaFree(dcs), cudaFree(dcl), cudaFree(dpr), cudaFree(dti);
        }
        free(o16), cudaFree(d16);
        free(out), cudaFree(dout), cudaFree(dk), cudaFree(dv);
    }
    ck_assert_int_eq(cu_attention_plain(dq, CU_ATTN_MAX_ROWS + 1, n_head, NULL, NULL, 1, bs, n_kv,
                                        hd, dbt, max_blocks, dseq, dlen, max_len, ws, NULL, NULL),
                     STRATA_EINVAL);
    free(kvf), free(half), free(bt), free(q), free(blocks);
    cudaFree(ws), cudaFree(dbt), cudaFree(dq), cudaFree(dseq), cudaFree(dlen);
}
END_TEST

/* Expert FFN from a slot table: 16 experts, 10 resident, top-4 routing of 1, 3, 20 and 70 tokens
 * (20 and 70: every token also routed to expert 3, whose 20 pairs take two groups of 16 and whose
 * 70 take two groups of the tensor cores' 64, one part-filled); pairs on missing experts
 * are computed by the CPU and copied in before the combine, as the worker does. The reference is
 * the CPU backend's own expert step, cpu_moe_ffn (kernels/cpu/moe.h) over every pair: activations
 * by cpu_quantize_acts, one qdot_ref-equal row dot per output, ops_swiglu. Quantized parts are
 * the same numbers on the GPU (integer block dots, glibc's expf in SiLU, the same quantized h), so
 * a mix of three quantized parts must give the CPU's bytes (memcmp); float parts sum in another
 * order: a float down within 1e-4 * sum|terms of the down dot| + 1e-6; float gate/up before a
 * quantized down: h within 1e-4 of its row's largest, out qdot_ref over the GPU's h bit for bit
 * (h's quantization may land a step from the CPU's at a tie). Mixes after the first five run
 * after every other test (the shared random stream): each quantized type on all three parts, and
 * the K-quant and IQ4 types mixed. */
/* The reference's expert parts: slices of the host copy of the blobs. */
struct blob_ctx {
    const uint8_t *blobs;
    uint64_t blob_bytes;
    const uint64_t *off;
};

static const void *blob_part(void *ctx, uint32_t e, int part)
{
    const struct blob_ctx *c = ctx;
    return c->blobs + e * c->blob_bytes + c->off[part];
}

static const uint32_t mixes[][3] = {
    {QT_Q4_K, QT_Q4_K, QT_Q6_K},    {QT_Q8_0, QT_Q8_0, QT_Q8_0},  {QT_F16, QT_BF16, QT_Q5_0},
    {QT_Q5_0, QT_Q4_K, QT_F32},     {QT_Q5_K, QT_Q4_K, QT_Q5_K},  {QT_Q5_0, QT_Q5_0, QT_Q5_0},
    {QT_Q4_K, QT_Q4_K, QT_Q4_K},    {QT_Q5_K, QT_Q5_K, QT_Q5_K},  {QT_Q6_K, QT_Q6_K, QT_Q6_K},
    {QT_Q2_K, QT_Q2_K, QT_Q2_K},    {QT_Q3_K, QT_Q3_K, QT_Q3_K},  {QT_IQ4_XS, QT_IQ4_XS, QT_IQ4_XS},
    {QT_IQ4_NL, QT_IQ4_NL, QT_IQ4_NL}, {QT_Q3_K, QT_Q2_K, QT_IQ4_XS}, {QT_IQ4_NL, QT_IQ4_XS, QT_Q3_K}};
#define N_MIXES       (int)(sizeof mixes / sizeof mixes[0])
#define N_FIRST_MIXES 5

START_TEST(moe_ffn_matches_reference)
{
    const int n_exp = 16, k = 4, toks[] = {1, 3, 20, 70};
    const int64_t n_embd = 512, n_ff = 256;
    { /* one mix a loop iteration (_i indexes mixes) */
        const int mi = _i;
        const bool exact = qtype_get(mixes[mi][0])->blck > 1 && qtype_get(mixes[mi][1])->blck > 1 &&
                           qtype_get(mixes[mi][2])->blck > 1;
        struct cu_moe_parts parts = {{mixes[mi][0], mixes[mi][1], mixes[mi][2]}, {0, 0, 0}, n_embd,
                                     n_ff, (uint32_t)n_exp}; /* the dev steps stage the slots */
        float *deq[16][3];
        uint64_t psz[3], rb[3], off = 0;
        for (int p = 0; p < 3; p++) {
            qtype_row_bytes(parts.type[p], p == CU_PART_DOWN ? n_ff : n_embd, &rb[p]);
            psz[p] = rb[p] * (p == CU_PART_DOWN ? n_embd : n_ff);
            parts.off[p] = off;
            off = (off + psz[p] + 255) / 256 * 256;
        }
        uint64_t blob_bytes = off;
        uint8_t *blobs = calloc(n_exp, blob_bytes);
        for (int e = 0; e < n_exp; e++)
            for (int p = 0; p < 3; p++) {
                int64_t rows = p == CU_PART_DOWN ? n_embd : n_ff, cols = p == CU_PART_DOWN ? n_ff : n_embd;
                void *w = random_weights(parts.type[p], rows, cols, &deq[e][p]);
                memcpy(blobs + e * blob_bytes + parts.off[p], w, psz[p]);
                free(w);
            }
        uint8_t *dblobs = dev_upload(blobs, n_exp * blob_bytes);
        uint8_t resident[16];
        const uint8_t *slot[16];
        for (int e = 0; e < n_exp; e++) {
            resident[e] = (e % 3) != 1;
            slot[e] = resident[e] ? dblobs + e * blob_bytes : NULL;
        }
        const uint8_t **dslot = dev_upload(slot, sizeof slot);
        for (int ti = 0; ti < 4; ti++) {
            const int n_tok = toks[ti], n_pairs = n_tok * k;
            int32_t ids[280], pair_idx[280];
            float pw[280], *x = malloc(sizeof(float) * n_tok * n_embd);
            for (int t = 0; t < n_tok; t++)
                for (int j = 0; j < k; j++) {
                    ids[t * k + j] = n_tok >= 20 ? (j == 0 ? 3 : 4 + (t + 3 * j) % 12) : (t * 5 + j * 3) % n_exp;
                    pw[t * k + j] = 0.1f + 0.2f * j;
                }
            for (int64_t i = 0; i < n_tok * n_embd; i++) x[i] = frand();
            struct moe_group groups[280];
            int ng = moe_group(ids, n_tok, k, (uint32_t)n_exp, resident, CU_MOE_MAX_PAIRS, groups, pair_idx);
            for (int g = 0; g < ng; g++) {
                ck_assert_int_le(groups[g].count, CU_MOE_MAX_PAIRS);
                if (g) ck_assert_int_le(groups[g - 1].expert, groups[g].expert);
            }
            /* reference per pair: the CPU's expert step over every pair */
            float *ref = malloc(sizeof(float) * n_pairs * n_embd), *h = malloc(sizeof(float) * n_ff);
            {
                struct moe_group all[280];
                int32_t all_idx[280];
                int n_all = moe_group(ids, n_tok, k, (uint32_t)n_exp, NULL, UINT32_MAX, all, all_idx);
                const struct cpu_moe_parts cp = {
                    {parts.type[0], (uint32_t)n_embd, (uint32_t)n_ff, rb[0]},
                    {parts.type[1], (uint32_t)n_embd, (uint32_t)n_ff, rb[1]},
                    {parts.type[2], (uint32_t)n_ff, (uint32_t)n_embd, rb[2]}};
                struct blob_ctx bc = {blobs, blob_bytes, parts.off};
                size_t stride = 0;
                for (int p = 0; p < 3; p++) {
                    size_t b = quant_act_bytes(parts.type[p], p == CU_PART_DOWN ? n_ff : n_embd);
                    if (b > stride) stride = b;
                }
                stride = (stride + 63) & ~(size_t)63;
                struct pool *pl;
                struct cpu_moe *cm;
                ck_assert_int_eq(pool_start(2, &pl), 0);
                ck_assert_int_eq(cpu_moe_init((uint32_t)n_pairs, (uint32_t)n_embd, (uint32_t)n_ff,
                                              stride, (uint32_t)n_exp, &cm), 0);
                ck_assert_int_eq(cpu_moe_ffn(cm, pl, &cp, blob_part, &bc, all, n_all, all_idx, pw,
                                             (uint32_t)n_tok, k, x, (size_t)n_embd, ref, NULL), 0);
                cpu_moe_fini(cm);
                pool_close(pl);
            }
            double *refabs = malloc(sizeof(double) * n_pairs * n_embd); /* pw * sum|down_i h_i| */
            float *href = malloc(sizeof(float) * n_pairs * n_ff); /* the reference's h by pair */
            float *gate = malloc(sizeof(float) * n_ff), *up = malloc(sizeof(float) * n_ff);
            uint8_t *ax = malloc(quant_act_bytes(QT_F32, n_embd) + quant_act_bytes(QT_F32, n_ff));
            /* the tolerance's scale: pw * sum|down_i h_i|, h from the reference's own gate and up */
            for (int pi = 0; pi < n_pairs; pi++) {
                int e = ids[pi], t = pi / k;
                const uint8_t *blob = blobs + e * blob_bytes;
                ck_assert_int_eq(quant_activations(parts.type[0], x + t * n_embd, ax, n_embd), 0);
                for (int64_t r = 0; r < n_ff; r++)
                    gate[r] = qdot_ref(parts.type[0], n_embd, blob + parts.off[0] + r * rb[0], ax);
                ck_assert_int_eq(quant_activations(parts.type[1], x + t * n_embd, ax, n_embd), 0);
                for (int64_t r = 0; r < n_ff; r++)
                    up[r] = qdot_ref(parts.type[1], n_embd, blob + parts.off[1] + r * rb[1], ax);
                ops_swiglu(h, gate, up, n_ff);
                memcpy(href + pi * n_ff, h, sizeof(float) * n_ff);
                for (int64_t d = 0; d < n_embd; d++) {
                    double ad;
                    ref_dot(deq[e][2] + d * n_ff, h, n_ff, &ad);
                    refabs[pi * n_embd + d] = pw[pi] * ad;
                }
            }
            struct moe_group *dg = dev_upload(groups, sizeof(groups[0]) * (ng ? ng : 1));
            int32_t *dpi = dev_upload(pair_idx, sizeof(int32_t) * n_pairs);
            int32_t *dids = dev_upload(ids, sizeof(int32_t) * n_pairs);
            float *dpw = dev_upload(pw, sizeof(float) * n_pairs);
            float *dx = dev_upload(x, sizeof(float) * n_tok * n_embd);
            float *dh;
            void *ws;
            ck_assert_int_eq(cudaMalloc((void **)&dh, sizeof(float) * n_pairs * n_ff), cudaSuccess);
            ck_assert_int_eq(cudaMalloc(&ws, cu_moe_workspace_bytes(&parts, n_tok, k)), cudaSuccess);
            float *dout = dev_out((size_t)n_pairs * n_embd);
            ck_assert_int_eq(cu_moe_ffn(&parts, dslot, dg, ng, dpi, dpw, n_tok, k, dx, dh, ws, dout,
                                        NULL), 0);
            float *out = fetch(dout, (size_t)n_pairs * n_embd);
            float *hg = malloc(sizeof(float) * n_pairs * n_ff); /* the GPU's h */
            ck_assert_int_eq(cudaMemcpy(hg, dh, sizeof(float) * n_pairs * n_ff,
                                        cudaMemcpyDeviceToHost), cudaSuccess);
            {   /* the device-grouped step: the same bits from cu_moe_group's groups */
                uint8_t *dres = dev_upload(resident, sizeof resident);
                const int64_t mg = cu_moe_max_groups(n_pairs, (uint32_t)n_exp, CU_MOE_MAX_PAIRS);
                struct moe_group *dg2;
                int32_t *dpi2, *dng;
                ck_assert_int_eq(cudaMalloc((void **)&dg2, sizeof(struct moe_group) * mg), cudaSuccess);
                ck_assert_int_eq(cudaMalloc((void **)&dpi2, 4 * n_pairs), cudaSuccess);
                ck_assert_int_eq(cudaMalloc((void **)&dng, 4), cudaSuccess);
                float *dout2 = dev_out((size_t)n_pairs * n_embd);
                ck_assert_int_eq(cudaMemcpy(dout2, dout, sizeof(float) * n_pairs * n_embd,
                                            cudaMemcpyDeviceToDevice), cudaSuccess);
                ck_assert_int_eq(cu_moe_group(dids, n_tok, k, (uint32_t)n_exp, dres, CU_MOE_MAX_PAIRS,
                                              dg2, dpi2, dng, NULL), 0);
                const unsigned flags[] = {0, CU_MOE_UNFUSED}; /* gate/up fused, then not */
                for (int fi = 0; fi < 2; fi++) {
                    ck_assert_int_eq(cu_moe_ffn_dev(&parts, dslot, dg2, dng, (int)mg, dpi2, dpw, n_tok,
                                                    k, dx, dh, ws, dout2, flags[fi], NULL), 0);
                    float *out2 = fetch(dout2, (size_t)n_pairs * n_embd);
                    ck_assert_msg(memcmp(out, out2, sizeof(float) * n_pairs * n_embd) == 0,
                                  "moe mix %d, %d tokens: cu_moe_ffn_dev (flags %u) differs from "
                                  "cu_moe_ffn", (int)mi, n_tok, flags[fi]);
                    free(out2);
                }
                if (cu_moe_mma_ok(&parts)) {
                    /* prompt chunks: groups of up to 64 pairs on the tensor cores, with x given
                     * as floats and given quantized, the same bits again */
                    const int64_t mg3 =
                        cu_moe_max_groups(n_pairs, (uint32_t)n_exp, CU_MOE_MMA_PAIRS);
                    struct moe_group *dg3;
                    int32_t *dpi3, *dng3;
                    void *dxq;
                    ck_assert_int_eq(cudaMalloc((void **)&dg3, sizeof(struct moe_group) * mg3),
                                     cudaSuccess);
                    ck_assert_int_eq(cudaMalloc((void **)&dpi3, 4 * n_pairs), cudaSuccess);
                    ck_assert_int_eq(cudaMalloc((void **)&dng3, 4), cudaSuccess);
                    ck_assert_int_eq(
                        cudaMalloc(&dxq, cu_act_row_bytes(parts.type[0], n_embd) * n_tok),
                        cudaSuccess);
                    ck_assert_int_eq(cu_quantize_acts(parts.type[0], dx, n_embd, n_tok, dxq, NULL),
                                     0);
                    ck_assert_int_eq(cu_moe_group(dids, n_tok, k, (uint32_t)n_exp, dres,
                                                  CU_MOE_MMA_PAIRS, dg3, dpi3, dng3, NULL),
                                     0);
                    for (int fi = 0; fi < 2; fi++) {
                        ck_assert_int_eq(cudaMemcpy(dout2, dout, sizeof(float) * n_pairs * n_embd,
                                                    cudaMemcpyDeviceToDevice),
                                         cudaSuccess);
                        ck_assert_int_eq(cudaMemset(dh, 0, sizeof(float) * n_pairs * n_ff),
                                         cudaSuccess);
                        ck_assert_int_eq(
                            cu_moe_ffn_dev(&parts, dslot, dg3, dng3, (int)mg3, dpi3, dpw, n_tok, k,
                                           fi ? (const float *)dxq : dx, dh, ws, dout2,
                                           CU_MOE_MMA | (fi ? CU_MOE_X_QUANTIZED : 0), NULL),
                            0);
                        float *out3 = fetch(dout2, (size_t)n_pairs * n_embd);
                        ck_assert_msg(memcmp(out, out3, sizeof(float) * n_pairs * n_embd) == 0,
                                      "moe mix %d, %d tokens: the tensor-core groups (x %s) differ "
                                      "from cu_moe_ffn",
                                      (int)mi, n_tok, fi ? "quantized" : "floats");
                        free(out3);
                    }
                    cudaFree(dg3), cudaFree(dpi3), cudaFree(dng3), cudaFree(dxq);
                } else {
                    ck_assert_int_eq(cu_moe_ffn_dev(&parts, dslot, dg2, dng, (int)mg, dpi2, dpw,
                                                    n_tok, k, dx, dh, ws, dout2, CU_MOE_MMA, NULL),
                                     STRATA_EINVAL);
                }
                cudaFree(dout2), cudaFree(dres), cudaFree(dg2), cudaFree(dpi2), cudaFree(dng);
            }
            /* float gate or up, quantized down: h is the float products' (within 1e-4 of its row's
             * largest), and its quantization for down may then land one step away from the CPU's
             * at a rounding tie, so out is checked against qdot_ref over the GPU's own h, bit for
             * bit (rather than within a tolerance a flipped step of h can exceed) */
            const bool hq = !exact && qtype_get(parts.type[CU_PART_DOWN])->blck > 1;
            int flips = 0;
            uint8_t *ah = malloc(quant_act_bytes(parts.type[CU_PART_DOWN], n_ff)),
                    *ar = malloc(quant_act_bytes(parts.type[CU_PART_DOWN], n_ff));
            for (int pi = 0; hq && pi < n_pairs; pi++) {
                if (!resident[ids[pi]]) continue;
                const float *hr = href + pi * n_ff, *hp = hg + pi * n_ff;
                float hmax = 0.0f;
                for (int64_t i = 0; i < n_ff; i++) hmax = fmaxf(hmax, fabsf(hr[i]));
                for (int64_t i = 0; i < n_ff; i++)
                    ck_assert_msg(fabsf(hp[i] - hr[i]) <= 1e-4f * hmax + 1e-6f,
                                  "moe mix %d, %d tokens, pair %d: h[%lld] %.9g, the CPU's %.9g",
                                  (int)mi, n_tok, pi, (long long)i, hp[i], hr[i]);
                ck_assert_int_eq(quant_activations(parts.type[CU_PART_DOWN], hp, ah, n_ff), 0);
                ck_assert_int_eq(quant_activations(parts.type[CU_PART_DOWN], hr, ar, n_ff), 0);
                for (int64_t i = 0; i < n_ff; i++) flips += ((int8_t *)ah)[i] != ((int8_t *)ar)[i];
                const uint8_t *dw = blobs + ids[pi] * blob_bytes + parts.off[CU_PART_DOWN];
                for (int64_t d = 0; d < n_embd; d++) {
                    const float want =
                        pw[pi] * qdot_ref(parts.type[CU_PART_DOWN], n_ff, dw + d * rb[2], ah);
                    ck_assert_msg(memcmp(&out[pi * n_embd + d], &want, 4) == 0,
                                  "moe mix %d, %d tokens, pair %d dim %lld: %.9g, qdot_ref over "
                                  "the GPU's h %.9g", (int)mi, n_tok, pi, (long long)d,
                                  out[pi * n_embd + d], want);
                }
            }
            if (flips)
                printf("moe mix %d, %d tokens: %d of h's quantized elements a step from the CPU's "
                       "(float gate/up sums)\n", (int)mi, n_tok, flips);
            free(ah), free(ar);
            for (int pi = 0; !hq && pi < n_pairs; pi++) {
                if (!resident[ids[pi]]) continue;
                for (int64_t d = 0; exact && d < n_embd; d++)
                    ck_assert_msg(memcmp(&out[pi * n_embd + d], &ref[pi * n_embd + d], 4) == 0,
                                  "moe mix %s %s %s, %d tokens, pair %d dim %lld: %.9g, the CPU's "
                                  "%.9g", qtype_name(mixes[mi][0]), qtype_name(mixes[mi][1]),
                                  qtype_name(mixes[mi][2]), n_tok, pi, (long long)d,
                                  out[pi * n_embd + d], ref[pi * n_embd + d]);
                for (int64_t d = 0; d < n_embd; d++)
                    ck_assert_msg(fabs(out[pi * n_embd + d] - ref[pi * n_embd + d]) <=
                                      1e-4 * refabs[pi * n_embd + d] + 1e-6,
                                  "moe mix %d, %d tokens, pair %d dim %lld: %g vs %g", (int)mi, n_tok, pi,
                                  (long long)d, out[pi * n_embd + d], ref[pi * n_embd + d]);
            }
            /* the CPU's pairs copied in, then the combine in expert-id order */
            for (int pi = 0; pi < n_pairs; pi++)
                if (!resident[ids[pi]])
                    cudaMemcpy(dout + pi * n_embd, ref + pi * n_embd, sizeof(float) * n_embd,
                               cudaMemcpyHostToDevice);
            float *dy = dev_out((size_t)n_tok * n_embd);
            ck_assert_int_eq(cu_moe_combine(dout, dids, n_tok, k, n_embd, dy, NULL), 0);
            float *y = fetch(dy, (size_t)n_tok * n_embd);
            {   /* the combine with the residual add fused: x + the combine, bit for bit */
                float *dxr = dev_upload(x, sizeof(float) * n_tok * n_embd);
                ck_assert_int_eq(cu_moe_combine_add(dout, dids, n_tok, k, n_embd, dxr, NULL), 0);
                float *xr = malloc(sizeof(float) * n_tok * n_embd);
                ck_assert_int_eq(cudaMemcpy(xr, dxr, sizeof(float) * n_tok * n_embd,
                                            cudaMemcpyDeviceToHost), cudaSuccess);
                for (int64_t i = 0; i < n_tok * n_embd; i++) {
                    const float want = x[i] + y[i];
                    ck_assert_msg(memcmp(&xr[i], &want, 4) == 0, "combine_add %lld: %g vs %g",
                                  (long long)i, xr[i], want);
                }
                free(xr), cudaFree(dxr);
            }
            /* The combine is exact: the pairs' float outputs added in ascending expert-id order. */
            for (int pi = 0; pi < n_pairs; pi++)
                if (!resident[ids[pi]]) memcpy(out + pi * n_embd, ref + pi * n_embd, sizeof(float) * n_embd);
            for (int t = 0; t < n_tok; t++)
                for (int64_t d = 0; d < n_embd; d++) {
                    float sum = 0.0f;
                    for (int e = 0; e < n_exp; e++)
                        for (int j = 0; j < k; j++)
                            if (ids[t * k + j] == e) sum += out[(t * k + j) * n_embd + d];
                    ck_assert_msg(y[t * n_embd + d] == sum, "combine tok %d dim %lld: %g vs %g", t,
                                  (long long)d, y[t * n_embd + d], sum);
                }
            free(x), free(ref), free(refabs), free(href), free(hg), free(h), free(gate), free(up);
            free(ax), free(out), free(y);
            cudaFree(dg), cudaFree(dpi), cudaFree(dids), cudaFree(dpw), cudaFree(dx), cudaFree(dh),
                cudaFree(ws), cudaFree(dout), cudaFree(dy);
        }
        for (int e = 0; e < n_exp; e++)
            for (int p = 0; p < 3; p++) free(deq[e][p]);
        free(blobs), cudaFree(dblobs), cudaFree(dslot);
    }
}
END_TEST

/* Device grouping against moe_group, byte for byte: the group count, every group, every pair index
 * and the untouched tail of both arrays (both start as the same fill). Routings: random distinct
 * experts per token, every pair on one expert (runs cut at max_pairs), one expert in every token,
 * ties of equal ids in lanes of one warp, ids out of range, a mask, top-k 1..16 over 1..16 tokens,
 * and prompt-sized batches over several of the kernel's tiles. */
static uint32_t urand(uint32_t n)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((rng >> 33) % n);
}

static void group_case(const int32_t *ids, int n_tok, int k, uint32_t n_exp, const uint8_t *mask,
                       uint32_t max_pairs, const char *what)
{
    const int n = n_tok * k;
    const int64_t mg = cu_moe_max_groups(n, n_exp, max_pairs);
    struct moe_group *hg = malloc(sizeof *hg * (n + 1)), *gg = malloc(sizeof *gg * (n + 1));
    int32_t *hp = malloc(4 * (n + 1)), *gp = malloc(4 * (n + 1));
    memset(hg, 0xA5, sizeof *hg * (n + 1)), memset(hp, 0xA5, 4 * (n + 1));
    const int ng = moe_group(ids, n_tok, k, n_exp, mask, max_pairs, hg, hp);
    ck_assert_msg(ng <= mg, "%s: %d groups above the bound %lld", what, ng, (long long)mg);
    struct moe_group *dg = dev_upload(hg, sizeof *hg * (n + 1));
    int32_t *dp = dev_upload(hp, 4 * (n + 1)), *dids = dev_upload(ids, 4 * (n ? n : 1)), *dng;
    uint8_t *dmask = mask ? dev_upload(mask, n_exp) : NULL;
    ck_assert_int_eq(cudaMemset(dg, 0xA5, sizeof *hg * (n + 1)), cudaSuccess);
    ck_assert_int_eq(cudaMemset(dp, 0xA5, 4 * (n + 1)), cudaSuccess);
    ck_assert_int_eq(cudaMalloc((void **)&dng, 4), cudaSuccess);
    ck_assert_int_eq(cudaMemset(dng, 0xff, 4), cudaSuccess);
    ck_assert_int_eq(cu_moe_group(dids, n_tok, k, n_exp, dmask, max_pairs, dg, dp, dng, NULL), 0);
    int32_t gng;
    ck_assert_int_eq(cudaMemcpy(&gng, dng, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(gg, dg, sizeof *gg * (n + 1), cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(gp, dp, 4 * (n + 1), cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_msg(gng == ng, "%s (%d tokens top-%d): %d groups, moe_group %d", what, n_tok, k, gng,
                  ng);
    ck_assert_msg(memcmp(gg, hg, sizeof *hg * (n + 1)) == 0, "%s (%d tokens top-%d): groups differ",
                  what, n_tok, k);
    ck_assert_msg(memcmp(gp, hp, 4 * (n + 1)) == 0, "%s (%d tokens top-%d): pair_idx differs", what,
                  n_tok, k);
    cudaFree(dg), cudaFree(dp), cudaFree(dids), cudaFree(dng), cudaFree(dmask);
    free(hg), free(gg), free(hp), free(gp);
}

START_TEST(moe_group_matches_moe_group)
{
    enum { MAXN = 2048 * 16 };
    int32_t *ids = malloc(4 * MAXN);
    uint8_t mask[256];
    for (int e = 0; e < 256; e++) mask[e] = (e * 7) % 5 != 0;
    const uint32_t exps[] = {16, 128, 256};
    for (size_t ei = 0; ei < 3; ei++) {
        const uint32_t n_exp = exps[ei];
        for (int k = 1; k <= 16; k++)
            for (int t = 1; t <= 16; t++) {
                for (int i = 0; i < t; i++) /* k distinct experts per token */
                    for (int j = 0; j < k; j++) {
                        int32_t e;
                        int dup;
                        do {
                            e = (int32_t)urand(n_exp), dup = 0;
                            for (int jj = 0; jj < j; jj++) dup |= ids[i * k + jj] == e;
                        } while (dup);
                        ids[i * k + j] = e;
                    }
                group_case(ids, t, k, n_exp, NULL, CU_MOE_MAX_PAIRS, "random");
                group_case(ids, t, k, n_exp, mask, CU_MOE_MAX_PAIRS, "random, masked");
                for (int i = 0; i < t; i++) ids[i * k] = 5; /* expert 5 in every token */
                for (int i = 0; i < t; i++)
                    for (int j = 1; j < k; j++)
                        if (ids[i * k + j] == 5) ids[i * k + j] = ids[i * k];
                group_case(ids, t, k, n_exp, NULL, CU_MOE_MAX_PAIRS, "expert 5 in every token");
                for (int i = 0; i < t * k; i++) ids[i] = (int32_t)n_exp - 1; /* all pairs, one */
                group_case(ids, t, k, n_exp, NULL, CU_MOE_MAX_PAIRS, "one expert");
                group_case(ids, t, k, n_exp, NULL, 1, "one expert, runs of 1");
                for (int i = 0; i < t * k; i++) ids[i] = (int32_t)(i % 3); /* ties across lanes */
                group_case(ids, t, k, n_exp, NULL, 3, "three experts, runs of 3");
                for (int i = 0; i < t * k; i++) /* out of range: skipped */
                    ids[i] = i % 4 == 0 ? -1 : i % 4 == 1 ? (int32_t)n_exp : (int32_t)urand(n_exp);
                group_case(ids, t, k, n_exp, NULL, CU_MOE_MAX_PAIRS, "ids out of range");
            }
    }
    /* prompt chunks: several tiles of staged ids; no cap on the runs (the CPU's UINT32_MAX) */
    const int big[][2] = {{512, 8}, {600, 8}, {2048, 16}};
    for (int bi = 0; bi < 3; bi++) {
        const int t = big[bi][0], k = big[bi][1];
        for (int i = 0; i < t * k; i++) ids[i] = (int32_t)(urand(8) == 0 ? 3 : urand(128));
        group_case(ids, t, k, 128, NULL, CU_MOE_MAX_PAIRS, "prompt chunk");
        group_case(ids, t, k, 128, mask, UINT32_MAX, "prompt chunk, masked, no cap");
    }
    group_case(ids, 0, 8, 128, NULL, CU_MOE_MAX_PAIRS, "no tokens");
    free(ids);
}
END_TEST

/* The combine with the residual add and the next norm fused, against cu_moe_combine_add then
 * cu_rmsnorm, bit for bit, one CTA a token and split over CTAs (rows of 2048 and 4096, top-8 over
 * 3 tokens). */
START_TEST(moe_combine_add_norm_matches_its_steps)
{
    const int64_t widths[] = {2048, 4096};
    const int n_tok = 3, k = 8;
    void *sync;
    ck_assert_int_eq(cudaMalloc(&sync, cu_row_sync_bytes(n_tok)), cudaSuccess);
    ck_assert_int_eq(cudaMemset(sync, 0, cu_row_sync_bytes(n_tok)), cudaSuccess);
    for (int wi = 0; wi < 2; wi++) {
        const int64_t E = widths[wi];
        float *out = malloc(sizeof(float) * n_tok * k * E), *x = malloc(sizeof(float) * n_tok * E);
        float *w = malloc(sizeof(float) * E);
        int32_t ids[24];
        for (int i = 0; i < n_tok * k; i++) ids[i] = (i * 37 + 11) % 128;
        for (int64_t i = 0; i < n_tok * k * E; i++) out[i] = 0.1f * frand();
        for (int64_t i = 0; i < n_tok * E; i++) x[i] = frand();
        for (int64_t i = 0; i < E; i++) w[i] = 1.0f + 0.3f * frand();
        float *dout = dev_upload(out, sizeof(float) * n_tok * k * E), *dw = dev_upload(w, sizeof(float) * E);
        int32_t *dids = dev_upload(ids, sizeof ids);
        float *dx1 = dev_upload(x, sizeof(float) * n_tok * E), *dx2 = dev_upload(x, sizeof(float) * n_tok * E);
        float *dn1 = dev_out((size_t)n_tok * E), *dn2 = dev_out((size_t)n_tok * E);
        ck_assert_int_eq(cu_moe_combine_add(dout, dids, n_tok, k, E, dx1, NULL), 0);
        ck_assert_int_eq(cu_rmsnorm(dx1, dw, dn1, n_tok, E, 1e-6f, NULL), 0);
        float *n1 = fetch(dn1, (size_t)n_tok * E);
        float *x1 = malloc(sizeof(float) * n_tok * E), *x2 = malloc(sizeof(float) * n_tok * E);
        cudaMemcpy(x1, dx1, sizeof(float) * n_tok * E, cudaMemcpyDeviceToHost);
        for (int v = 0; v < 2; v++) { /* one CTA a token, then split over CTAs */
            ck_assert_int_eq(cudaMemcpy(dx2, x, sizeof(float) * n_tok * E, cudaMemcpyHostToDevice),
                             cudaSuccess);
            ck_assert_int_eq(cu_moe_combine_add_norm(dout, dids, n_tok, k, E, dx2, dw, 1e-6f, dn2,
                                                     v ? sync : NULL, NULL),
                             0);
            float *n2 = fetch(dn2, (size_t)n_tok * E);
            cudaMemcpy(x2, dx2, sizeof(float) * n_tok * E, cudaMemcpyDeviceToHost);
            ck_assert_msg(memcmp(x1, x2, sizeof(float) * n_tok * E) == 0,
                          "combine_add_norm %lld (%s): x differs", (long long)E,
                          v ? "split" : "one CTA");
            ck_assert_msg(memcmp(n1, n2, sizeof(float) * n_tok * E) == 0,
                          "combine_add_norm %lld (%s): the norm differs", (long long)E,
                          v ? "split" : "one CTA");
            free(n2);
        }
        free(out), free(x), free(w), free(n1), free(x1), free(x2);
        cudaFree(dout), cudaFree(dw), cudaFree(dids), cudaFree(dx1), cudaFree(dx2), cudaFree(dn1), cudaFree(dn2);
    }
    cudaFree(sync);
    ck_assert_int_eq(
        cu_moe_combine_add_norm(NULL, NULL, 1, 8, 512, NULL, NULL, 1e-6f, NULL, NULL, NULL),
        STRATA_EINVAL);
}
END_TEST

/* The fused quantizations: cu_add_rmsnorm_q against cu_add_rmsnorm then cu_quantize_acts, and
 * cu_moe_combine_add_norm_q against cu_moe_combine_add_norm then cu_quantize_acts, byte for byte
 * (x, the normed rows, every activation byte and the guard after them), for Q8_K (Q4_K weights)
 * and Q8_0 (Q8_0 weights) activations, 1, 3 and 16 rows (row 0 all zeros: the all-zero blocks) of
 * 2048, 2880 (Q8_0: a last chunk of 64), 4096 and 5120 (wider than a CTA's registers); each with
 * one CTA a row and split over CTAs (sync given: where the grid fits, a CTA per 256 elements), the
 * split form twice on one sync (its counters reused); narrow rows and float weights refused. */
START_TEST(fused_quantize_matches_its_steps)
{
    const int64_t widths[] = {2048, 2880, 4096, 5120};
    const int rows_of[] = {1, 3, 16}, k = 8;
    const uint32_t wtypes[] = {QT_Q4_K, QT_Q8_0};
    void *sync;
    ck_assert_int_eq(cudaMalloc(&sync, cu_row_sync_bytes(16)), cudaSuccess);
    ck_assert_int_eq(cudaMemset(sync, 0, cu_row_sync_bytes(16)), cudaSuccess);
    int cases = 0;
    for (int wi = 0; wi < 4; wi++)
        for (int ri = 0; ri < 3; ri++)
            for (int ti = 0; ti < 2; ti++) {
                const int64_t E = widths[wi];
                const int n = rows_of[ri];
                const uint32_t wt = wtypes[ti];
                const size_t arb = cu_act_row_bytes(wt, E), af = arb * n / sizeof(float);
                if (arb == 0) continue; /* Q8_K rows are whole 256-blocks */
                float *x = malloc(sizeof(float) * n * E), *r = malloc(sizeof(float) * n * k * E);
                float *w = malloc(sizeof(float) * E);
                int32_t ids[16 * 8];
                for (int i = 0; i < n * k; i++)
                    ids[i] = (i * 37 + 11) % 128;
                for (int64_t i = 0; i < n * E; i++)
                    x[i] = i < E ? 0.0f : 2.0f * frand();
                for (int64_t i = 0; i < n * k * E; i++)
                    r[i] = i < k * E ? 0.0f : 0.2f * frand();
                for (int64_t i = 0; i < E; i++)
                    w[i] = 1.0f + 0.3f * frand();
                float *dw = dev_upload(w, sizeof(float) * E);
                float *dr = dev_upload(r, sizeof(float) * n * k * E);
                int32_t *dids = dev_upload(ids, sizeof(int32_t) * n * k);
                for (int op = 0; op < 2; op++) {
                    float *dx1 = dev_upload(x, sizeof(float) * n * E);
                    float *dy1 = dev_out((size_t)n * E), *da1 = dev_out(af);
                    if (op == 0)
                        ck_assert_int_eq(cu_add_rmsnorm(dx1, dr, dw, dy1, n, E, 1e-6f, NULL), 0);
                    else
                        ck_assert_int_eq(
                            cu_moe_combine_add_norm(dr, dids, n, k, E, dx1, dw, 1e-6f, dy1, NULL,
                                                    NULL),
                            0);
                    ck_assert_int_eq(cu_quantize_acts(wt, dy1, E, n, da1, NULL), 0);
                    float *y1 = fetch(dy1, (size_t)n * E), *a1 = fetch(da1, af);
                    float *x1 = malloc(sizeof(float) * n * E), *x2 = malloc(sizeof(float) * n * E);
                    cudaMemcpy(x1, dx1, sizeof(float) * n * E, cudaMemcpyDeviceToHost);
                    for (int v = 0; v < 3; v++) { /* one CTA a row, split, split again */
                        void *sy = v ? sync : NULL;
                        float *dx2 = dev_upload(x, sizeof(float) * n * E);
                        float *dy2 = dev_out((size_t)n * E), *da2 = dev_out(af);
                        if (op == 0)
                            ck_assert_int_eq(
                                cu_add_rmsnorm_q(dx2, dr, dw, dy2, n, E, 1e-6f, wt, da2, sy, NULL),
                                0);
                        else
                            ck_assert_int_eq(cu_moe_combine_add_norm_q(dr, dids, n, k, E, dx2, dw,
                                                                       1e-6f, dy2, wt, da2, sy,
                                                                       NULL),
                                             0);
                        float *y2 = fetch(dy2, (size_t)n * E), *a2 = fetch(da2, af);
                        cudaMemcpy(x2, dx2, sizeof(float) * n * E, cudaMemcpyDeviceToHost);
                        const char *what = op == 0 ? "add_rmsnorm_q" : "combine_add_norm_q";
                        ck_assert_msg(memcmp(x1, x2, sizeof(float) * n * E) == 0 &&
                                          memcmp(y1, y2, sizeof(float) * n * E) == 0,
                                      "%s %s %d x %lld (%s): x or the norm differs", what,
                                      qtype_name(wt), n, (long long)E, v ? "split" : "one CTA");
                        ck_assert_msg(memcmp(a1, a2, arb * n) == 0,
                                      "%s %s %d x %lld (%s): the activations differ from "
                                      "cu_quantize_acts'",
                                      what, qtype_name(wt), n, (long long)E,
                                      v ? "split" : "one CTA");
                        free(y2), free(a2);
                        cudaFree(dx2), cudaFree(dy2), cudaFree(da2);
                        cases++;
                    }
                    free(y1), free(a1), free(x1), free(x2);
                    cudaFree(dx1), cudaFree(dy1), cudaFree(da1);
                }
                free(x), free(r), free(w);
                cudaFree(dw), cudaFree(dr), cudaFree(dids);
            }
    cudaFree(sync);
    ck_assert_int_eq(
        cu_add_rmsnorm_q(NULL, NULL, NULL, NULL, 1, 512, 1e-6f, QT_Q4_K, NULL, NULL, NULL),
        STRATA_EINVAL);
    ck_assert_int_eq(
        cu_add_rmsnorm_q(NULL, NULL, NULL, NULL, 1, 2048, 1e-6f, QT_F16, NULL, NULL, NULL),
        STRATA_EINVAL);
    ck_assert_int_eq(cu_moe_combine_add_norm_q(NULL, NULL, 1, 8, 2048, NULL, NULL, 1e-6f, NULL,
                                               QT_F32, NULL, NULL, NULL),
                     STRATA_EINVAL);
    printf("fused quantize: %d cases byte-equal to their two steps\n", cases);
}
END_TEST

/* cu_router_group against cu_router_topk then cu_moe_group, bit for bit: ids, weights, groups,
 * pair_idx and the count, both router modes, 1..32 tokens, 128 and 256 experts top-8 and 64 top-4
 * (some logits tied so ties go to the lower id in both). */
START_TEST(router_group_matches_its_steps)
{
    const int shapes[][2] = {{128, 8}, {64, 4}, {256, 8}};
    for (int si = 0; si < 3; si++) {
        const int n_exp = shapes[si][0], k = shapes[si][1];
        for (int mode = 0; mode < 2; mode++)
            for (int t = 1; t <= CU_ROUTE_GROUP_MAX_TOKENS; t += t < 4 ? 1 : 7) {
                float *lg = malloc(sizeof(float) * t * n_exp);
                for (int i = 0; i < t * n_exp; i++) lg[i] = i % 5 == 0 ? 0.5f : 3.0f * frand();
                float *dl = dev_upload(lg, sizeof(float) * t * n_exp);
                const int n = t * k;
                int32_t *ids1, *ids2, *pi1, *pi2, *ng1, *ng2;
                float *w1, *w2;
                struct moe_group *g1, *g2;
                cudaMalloc((void **)&ids1, 4 * n), cudaMalloc((void **)&ids2, 4 * n);
                cudaMalloc((void **)&pi1, 4 * n), cudaMalloc((void **)&pi2, 4 * n);
                cudaMalloc((void **)&w1, 4 * n), cudaMalloc((void **)&w2, 4 * n);
                cudaMalloc((void **)&ng1, 4), cudaMalloc((void **)&ng2, 4);
                cudaMalloc((void **)&g1, sizeof *g1 * n), cudaMalloc((void **)&g2, sizeof *g2 * n);
                cudaMemset(pi1, 0, 4 * n), cudaMemset(pi2, 0, 4 * n);
                cudaMemset(g1, 0, sizeof *g1 * n), cudaMemset(g2, 0, sizeof *g2 * n);
                ck_assert_int_eq(cu_router_topk(dl, t, n_exp, k, (enum cu_router_mode)mode, 1, ids1,
                                                w1, NULL), 0);
                ck_assert_int_eq(cu_moe_group(ids1, t, k, n_exp, NULL, CU_MOE_MAX_PAIRS, g1, pi1,
                                              ng1, NULL), 0);
                ck_assert_int_eq(cu_router_group(dl, t, n_exp, k, (enum cu_router_mode)mode, 1,
                                                 ids2, w2, NULL, CU_MOE_MAX_PAIRS, g2, pi2, ng2,
                                                 NULL), 0);
                ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
                const struct {
                    const void *a, *b;
                    size_t bytes;
                    const char *what;
                } cmp[] = {{ids1, ids2, 4 * (size_t)n, "ids"},     {w1, w2, 4 * (size_t)n, "weights"},
                           {pi1, pi2, 4 * (size_t)n, "pair_idx"},  {ng1, ng2, 4, "count"},
                           {g1, g2, sizeof *g1 * (size_t)n, "groups"}};
                for (int i = 0; i < 5; i++) {
                    uint8_t *a = malloc(cmp[i].bytes), *b = malloc(cmp[i].bytes);
                    cudaMemcpy(a, cmp[i].a, cmp[i].bytes, cudaMemcpyDeviceToHost);
                    cudaMemcpy(b, cmp[i].b, cmp[i].bytes, cudaMemcpyDeviceToHost);
                    ck_assert_msg(memcmp(a, b, cmp[i].bytes) == 0,
                                  "router_group %d experts top-%d mode %d, %d tokens: %s differ",
                                  n_exp, k, mode, t, cmp[i].what);
                    free(a), free(b);
                }
                free(lg);
                cudaFree(dl), cudaFree(ids1), cudaFree(ids2), cudaFree(pi1), cudaFree(pi2);
                cudaFree(w1), cudaFree(w2), cudaFree(ng1), cudaFree(ng2), cudaFree(g1), cudaFree(g2);
            }
    }
    ck_assert_int_eq(cu_router_group(NULL, CU_ROUTE_GROUP_MAX_TOKENS + 1, 128, 8,
                                     CU_ROUTER_SOFTMAX_TOPK, 1, NULL, NULL, NULL, 16, NULL, NULL,
                                     NULL, NULL),
                     STRATA_EINVAL);
}
END_TEST

START_TEST(moe_ffn_refuses_bad_parts)
{
    struct cu_moe_parts parts = {{QT_Q4_K, QT_Q4_1, QT_Q6_K}, {0, 256, 512}, 512, 256, 0};
    ck_assert_int_eq(cu_moe_ffn(&parts, NULL, NULL, 0, NULL, NULL, 1, 8, NULL, NULL, NULL, NULL, NULL),
                     STRATA_EUNSUPPORTED);
    parts.type[1] = QT_Q4_K, parts.off[1] = 250; /* not a multiple of 16 */
    ck_assert_int_eq(cu_moe_ffn(&parts, NULL, NULL, 0, NULL, NULL, 1, 8, NULL, NULL, NULL, NULL, NULL),
                     STRATA_EINVAL);
    parts.off[1] = 256, parts.n_embd = 500; /* not whole Q4_K blocks */
    ck_assert_int_eq(cu_moe_ffn(&parts, NULL, NULL, 0, NULL, NULL, 1, 8, NULL, NULL, NULL, NULL, NULL),
                     STRATA_EINVAL);
}
END_TEST

int main(void)
{
    /* No fork: CUDA does not survive fork() once initialized, and one process keeps one context. */
    setenv("CK_FORK", "no", 1);
    int n;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA device: the GPU tests need one (run scripts/gpu-check on a GPU machine)\n");
        return 1;
    }
    Suite *s = suite_create("cuda kernels");
    TCase *tc = tcase_create("parity");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, matvec_matches_reference, 0, N_FIRST_TYPES);
    tcase_add_test(tc, matvec_refuses_cpu_types);
    tcase_add_loop_test(tc, matmul_matches_reference, 0, N_FIRST_TYPES);
    tcase_add_test(tc, rmsnorm_matches_reference);
    tcase_add_test(tc, rope_matches_reference);
    tcase_add_test(tc, qk_rope_store_matches_its_steps);
    tcase_add_test(tc, router_matches_reference);
    tcase_add_test(tc, attention_matches_reference);
    tcase_add_test(tc, attention_rows_match_reference);
    tcase_add_test(tc, moe_ffn_refuses_bad_parts);
    tcase_add_test(tc, moe_combine_add_norm_matches_its_steps);
    tcase_add_test(tc, moe_group_matches_moe_group);
    tcase_add_test(tc, router_group_matches_its_steps);
    tcase_add_loop_test(tc, matvec_matches_reference, N_FIRST_TYPES, N_FIRST_TYPES + 1); /* Q5_K */
    tcase_add_loop_test(tc, matmul_matches_reference, N_FIRST_TYPES, N_FIRST_TYPES + 1);
    /* after Q5_K, as they were added: Q2_K, Q3_K, IQ4_XS, IQ4_NL */
    tcase_add_loop_test(tc, matvec_matches_reference, N_FIRST_TYPES + 1, N_GPU_TYPES);
    tcase_add_loop_test(tc, matmul_matches_reference, N_FIRST_TYPES + 1, N_GPU_TYPES);
    suite_add_tcase(s, tc);
    /* cases of their own, so CK_RUN_CASE=moe or fused runs one alone: the MoE mixes (the first
     * five, then those added with Q2_K .. IQ4_NL), the fused quantizations */
    TCase *tm = tcase_create("moe");
    tcase_set_timeout(tm, 300);
    /* STRATA_TEST_MIX=i: mix i alone (for compute-sanitizer runs) */
    const char *one = getenv("STRATA_TEST_MIX");
    const int m0 = one ? atoi(one) : 0;
    tcase_add_loop_test(tm, moe_ffn_matches_reference, one ? m0 : 0, one ? m0 + 1 : N_MIXES);
    suite_add_tcase(s, tm);
    TCase *tf = tcase_create("fused");
    tcase_set_timeout(tf, 60);
    tcase_add_test(tf, fused_quantize_matches_its_steps);
    suite_add_tcase(s, tf);
    return test_run(s);
}
