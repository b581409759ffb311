/* strata-kbench — GB/s of the CUDA kernels at the shapes of the qwen3-30b-a3b fixture, against the
 * memory roofline (the device's measured copy bandwidth and its datasheet figure). Outside the main
 * build's tests, as llm.c's dev/cuda: scripts/gpu-check runs the parity tests (kernels_gputest)
 * first and this only after they pass; weights are rotated over enough copies to exceed the L2
 * cache so every repeat streams from HBM.  Usage: strata-kbench [--peak-gbs 4800] [--reps N]
 * [--matvec|--matmul|--matmul-q TYPE ROWS COLS N]: one case (a profiler's). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "kernels/cuda/attn.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matvec.h"
#include "kernels/cuda/moe_ffn.h"
#include "kernels/cuda/qact.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t rng = 7;
static float frand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

static double copy_gbs(void)
{
    size_t n = (size_t)2 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e0, 0);
    for (int i = 0; i < 5; i++) CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaFree(a), cudaFree(b);
    return 2.0 * n * 5 / (ms * 1e-3) / 1e9; /* read + write */
}

/* A weight matrix quantized once on the host, then replicated on the device. */
static void *make_weights(uint32_t type, int64_t nrows, int64_t ncols, int copies, uint64_t *bytes)
{
    uint64_t rb;
    qtype_row_bytes(type, ncols, &rb);
    *bytes = rb * nrows;
    unsigned char *h = malloc(*bytes);
    float *src = malloc(sizeof(float) * ncols);
    /* 64 distinct quantized rows, tiled: the values do not change the timing, and quantizing a
     * 151,936-row K-quant matrix on the host would take longer than the benchmark. */
    for (int64_t r = 0; r < nrows; r++) {
        if (r < 64) {
            for (int64_t i = 0; i < ncols; i++) src[i] = frand();
            quant_quantize(type, src, h + r * rb, ncols);
        } else {
            memcpy(h + r * rb, h + (r % 64) * rb, rb);
        }
    }
    unsigned char *d;
    const uint64_t stride = (*bytes + 255) & ~(uint64_t)255;
    CK(cudaMalloc((void **)&d, stride * copies));
    for (int c = 0; c < copies; c++) CK(cudaMemcpy(d + stride * c, h, *bytes, cudaMemcpyHostToDevice));
    free(h), free(src);
    return d;
}

static int reps = 50;

static void bench_matvec(uint32_t type, int64_t nrows, int64_t ncols, int n_act, double roof)
{
    uint64_t bytes, rb;
    qtype_row_bytes(type, ncols, &rb);
    int copies = (int)(300e6 / (double)(rb * nrows)) + 1; /* 5x the 60 MB L2 */
    unsigned char *w = make_weights(type, nrows, ncols, copies, &bytes);
    const uint64_t stride = (bytes + 255) & ~(uint64_t)255; /* copies stay 16-byte aligned */
    const size_t arb = cu_act_row_bytes(type, ncols);
    float *hx = malloc(sizeof(float) * ncols * n_act), *x, *y;
    void *act;
    for (int64_t i = 0; i < ncols * n_act; i++) hx[i] = frand();
    CK(cudaMalloc((void **)&x, sizeof(float) * ncols * n_act));
    CK(cudaMalloc(&act, arb * n_act));
    CK(cudaMalloc((void **)&y, sizeof(float) * nrows * n_act));
    CK(cudaMemcpy(x, hx, sizeof(float) * ncols * n_act, cudaMemcpyHostToDevice));
    if (cu_quantize_acts(type, x, ncols, n_act, act, NULL) != 0) exit(1);
    for (int c = 0; c < copies; c++)
        if (cu_matvec(type, w + stride * c, ncols, nrows, act, n_act, y, NULL) != 0) exit(1);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < reps; i++)
        cu_matvec(type, w + stride * (i % copies), ncols, nrows, act, n_act, y, NULL);
    cudaEventRecord(e1, 0);
    CK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    double us = ms * 1e3 / reps;
    double gbs = (bytes + (double)arb * n_act + 4.0 * nrows * n_act) / (us * 1e-6) / 1e9;
    printf("| matvec | %-5s | %6lld x %-5lld | %2d | %9.2f | %7.0f | %5.1f%% |\n", qtype_name(type),
           (long long)nrows, (long long)ncols, n_act, us, gbs, 100.0 * gbs / roof);
    cudaFree(w), cudaFree(x), cudaFree(act), cudaFree(y), free(hx);
}

/* bench_matmul: a prompt chunk's product, fp16 WMMA (cu_matmul) or, with exact, the bit-exact
 * int8 tensor-core path (cu_quantize_acts + cu_matmul_q, both timed). */
static void bench_matmul(uint32_t type, int64_t nrows, int64_t ncols, int64_t ntok, int exact)
{
    uint64_t bytes;
    unsigned char *w = make_weights(type, nrows, ncols, 1, &bytes);
    float *x, *y;
    void *act;
    CK(cudaMalloc((void **)&x, sizeof(float) * ncols * ntok));
    CK(cudaMalloc((void **)&y, sizeof(float) * nrows * ntok));
    CK(cudaMalloc(&act, cu_act_row_bytes(type, ncols) * ntok + 16));
    float *hx = malloc(sizeof(float) * ncols * ntok);
    for (int64_t i = 0; i < ncols * ntok; i++) hx[i] = frand();
    CK(cudaMemcpy(x, hx, sizeof(float) * ncols * ntok, cudaMemcpyHostToDevice));
    free(hx);
#define RUN()                                                                                      \
    (exact ? cu_quantize_acts(type, x, ncols, (int)ntok, act, NULL) ||                             \
                 cu_matmul_q(type, w, ncols, nrows, act, ntok, y, NULL)                            \
           : cu_matmul(type, w, ncols, nrows, x, ntok, y, NULL))
    if (RUN() != 0) exit(1);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < 10; i++) RUN();
#undef RUN
    cudaEventRecord(e1, 0);
    CK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    double s = ms * 1e-3 / 10;
    printf("| %s | %-5s | %6lld x %-5lld | %4lld tok | %9.1f us | %6.1f TFLOP/s |\n",
           exact ? "matmul_q (exact)" : "matmul (fp16)", qtype_name(type), (long long)nrows,
           (long long)ncols, (long long)ntok, s * 1e6, 2.0 * nrows * ncols * ntok / s / 1e12);
    cudaFree(w), cudaFree(x), cudaFree(y), cudaFree(act);
}

static void bench_attn(int64_t ctx, int n_seq, double roof)
{
    const int n_head = 32, n_kv = 4, hd = 128, bs = 16;
    int64_t nb = (ctx + bs - 1) / bs;
    size_t kv_floats = (size_t)n_seq * nb * n_kv * bs * hd;
    float *k, *v, *q, *o;
    CK(cudaMalloc((void **)&k, kv_floats * 4));
    CK(cudaMalloc((void **)&v, kv_floats * 4));
    CK(cudaMemset(k, 0, kv_floats * 4));
    CK(cudaMemset(v, 0, kv_floats * 4));
    CK(cudaMalloc((void **)&q, (size_t)n_seq * n_head * hd * 4));
    CK(cudaMemset(q, 0, (size_t)n_seq * n_head * hd * 4));
    CK(cudaMalloc((void **)&o, (size_t)n_seq * n_head * hd * 4));
    int32_t *bt = malloc(sizeof(int32_t) * n_seq * nb), *seq = malloc(sizeof(int32_t) * n_seq),
            *len = malloc(sizeof(int32_t) * n_seq);
    for (int s = 0; s < n_seq; s++) {
        for (int64_t b = 0; b < nb; b++) bt[s * nb + b] = (int32_t)(s * nb + b);
        seq[s] = s, len[s] = (int32_t)ctx;
    }
    int32_t *dbt, *dseq, *dlen;
    CK(cudaMalloc((void **)&dbt, sizeof(int32_t) * n_seq * nb));
    CK(cudaMalloc((void **)&dseq, sizeof(int32_t) * n_seq));
    CK(cudaMalloc((void **)&dlen, sizeof(int32_t) * n_seq));
    cudaMemcpy(dbt, bt, sizeof(int32_t) * n_seq * nb, cudaMemcpyHostToDevice);
    cudaMemcpy(dseq, seq, sizeof(int32_t) * n_seq, cudaMemcpyHostToDevice);
    cudaMemcpy(dlen, len, sizeof(int32_t) * n_seq, cudaMemcpyHostToDevice);
    struct cu_kv kv = {k, v, bs, n_kv, hd};
    int split = cu_attn_splits(ctx, n_seq, n_head);
    void *ws;
    CK(cudaMalloc(&ws, cu_attn_workspace_bytes(n_seq, n_head, hd, split)));
    cu_attention(q, n_seq, n_head, &kv, dbt, nb, dseq, dlen, split, ws, o, NULL);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < reps; i++)
        cu_attention(q, n_seq, n_head, &kv, dbt, nb, dseq, dlen, split, ws, o, NULL);
    cudaEventRecord(e1, 0);
    CK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    double us = ms * 1e3 / reps;
    double gbs = 2.0 * kv_floats * 4 / (us * 1e-6) / 1e9;
    printf("| attention decode | ctx %6lld | %2d seqs | %2d splits | %9.2f us | %7.0f GB/s | %5.1f%% |\n",
           (long long)ctx, n_seq, split, us, gbs, 100.0 * gbs / roof);
    cudaFree(k), cudaFree(v), cudaFree(q), cudaFree(o), cudaFree(ws), cudaFree(dbt), cudaFree(dseq),
        cudaFree(dlen);
    free(bt), free(seq), free(len);
}

/* One MoE layer of qwen3-30b-a3b (128 experts of 2048 x 768, q4_k_m: gate/up Q4_K, down Q6_K),
 * every expert resident, n_tok tokens routed top-8 to distinct experts (8 per token, spread so a
 * batch hits min(128, 8 n_tok) experts): GB/s over the hit experts' bytes. */
static void bench_moe(int n_tok, double roof)
{
    const int n_exp = 128, k = 8;
    const int64_t n_embd = 2048, n_ff = 768;
    struct cu_moe_parts parts = {{QT_Q4_K, QT_Q4_K, QT_Q6_K}, {0, 0, 0}, n_embd, n_ff, n_exp};
    uint64_t psz[3], off = 0;
    for (int p = 0; p < 3; p++) {
        uint64_t rb;
        qtype_row_bytes(parts.type[p], p == CU_PART_DOWN ? n_ff : n_embd, &rb);
        psz[p] = rb * (p == CU_PART_DOWN ? n_embd : n_ff);
        parts.off[p] = off, off = (off + psz[p] + 255) / 256 * 256;
    }
    /* blobs: n_exp copies of one random expert (the values do not change the timing) */
    uint8_t *blobs;
    CK(cudaMalloc((void **)&blobs, off * n_exp));
    for (int p = 0; p < 3; p++) {
        uint64_t b;
        uint8_t *w = make_weights(parts.type[p], p == CU_PART_DOWN ? n_embd : n_ff,
                                  p == CU_PART_DOWN ? n_ff : n_embd, 1, &b);
        for (int e = 0; e < n_exp; e++)
            CK(cudaMemcpy(blobs + e * off + parts.off[p], w, b, cudaMemcpyDeviceToDevice));
        cudaFree(w);
    }
    const uint8_t *slot[128];
    uint8_t resident[128];
    for (int e = 0; e < n_exp; e++) slot[e] = blobs + e * off, resident[e] = 1;
    int32_t ids[16 * 8], pair_idx[16 * 8];
    float pw[16 * 8];
    for (int t = 0; t < n_tok; t++)
        for (int j = 0; j < k; j++) ids[t * k + j] = (t * 8 + j * 16 + t / 2) % n_exp, pw[t * k + j] = 0.125f;
    struct moe_group groups[16 * 8];
    int ng = moe_group(ids, n_tok, k, (uint32_t)n_exp, resident, CU_MOE_MAX_PAIRS, groups, pair_idx);
    const uint8_t **dslot;
    struct moe_group *dg;
    int32_t *dpi;
    float *dpw, *x, *h, *out;
    void *ws;
    CK(cudaMalloc(&ws, cu_moe_workspace_bytes(&parts, n_tok, k)));
    CK(cudaMalloc((void **)&dslot, sizeof slot));
    CK(cudaMalloc((void **)&dg, sizeof(groups[0]) * ng));
    CK(cudaMalloc((void **)&dpi, sizeof(int32_t) * n_tok * k));
    CK(cudaMalloc((void **)&dpw, sizeof(float) * n_tok * k));
    CK(cudaMalloc((void **)&x, sizeof(float) * n_tok * n_embd));
    CK(cudaMalloc((void **)&h, sizeof(float) * n_tok * k * n_ff));
    CK(cudaMalloc((void **)&out, sizeof(float) * n_tok * k * n_embd));
    CK(cudaMemcpy(dslot, slot, sizeof slot, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dg, groups, sizeof(groups[0]) * ng, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpi, pair_idx, sizeof(int32_t) * n_tok * k, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpw, pw, sizeof(float) * n_tok * k, cudaMemcpyHostToDevice));
    float *hx = malloc(sizeof(float) * n_tok * n_embd);
    for (int64_t i = 0; i < n_tok * n_embd; i++) hx[i] = frand();
    CK(cudaMemcpy(x, hx, sizeof(float) * n_tok * n_embd, cudaMemcpyHostToDevice));
    free(hx);
    if (cu_moe_ffn(&parts, dslot, dg, ng, dpi, dpw, n_tok, k, x, h, ws, out, NULL) != 0) exit(1);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < reps; i++) cu_moe_ffn(&parts, dslot, dg, ng, dpi, dpw, n_tok, k, x, h, ws, out, NULL);
    cudaEventRecord(e1, 0);
    CK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    const double us = ms * 1e3 / reps, bytes = (double)ng * (psz[0] + psz[1] + psz[2]);
    printf("| moe_ffn (q4_k_m, 2048x768 experts) | %2d tok | %3d experts | %9.2f us | %7.0f GB/s | "
           "%5.1f%% |\n", n_tok, ng, us, bytes / (us * 1e-6) / 1e9, 100.0 * bytes / (us * 1e-6) / 1e9 / roof);
    cudaFree(blobs), cudaFree(dslot), cudaFree(dg), cudaFree(dpi), cudaFree(dpw), cudaFree(x),
        cudaFree(h), cudaFree(out), cudaFree(ws);
}

int main(int argc, char **argv)
{
    double peak = 4800;
    /* --matvec TYPE ROWS COLS ACT, --matmul / --matmul-q TYPE ROWS COLS TOKENS: that case alone */
    const char *one = NULL, *mode = NULL;
    int64_t one_rows = 0, one_cols = 0;
    int one_act = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--peak-gbs") == 0 && i + 1 < argc) peak = atof(argv[++i]);
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        if ((strcmp(argv[i], "--matvec") == 0 || strcmp(argv[i], "--matmul") == 0 ||
             strcmp(argv[i], "--matmul-q") == 0) &&
            i + 4 < argc) {
            mode = argv[i];
            one = argv[i + 1], one_rows = atoll(argv[i + 2]), one_cols = atoll(argv[i + 3]);
            one_act = atoi(argv[i + 4]);
            i += 4;
        }
    }
    if (one) {
        int t = qtype_parse(one);
        if (t < 0 || !cu_type_supported((uint32_t)t)) {
            fprintf(stderr, "strata-kbench: no GPU type named %s\n", one);
            return 2;
        }
        if (strcmp(mode, "--matvec") == 0)
            bench_matvec((uint32_t)t, one_rows, one_cols, one_act, copy_gbs());
        else
            bench_matmul((uint32_t)t, one_rows, one_cols, one_act, strcmp(mode, "--matmul-q") == 0);
        return 0;
    }
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    double copy = copy_gbs();
    printf("device %s, %d SMs, L2 %d MiB; datasheet %.0f GB/s, measured copy %.0f GB/s (roofline "
           "below: the measured copy)\n\n", p.name, p.multiProcessorCount, p.l2CacheSize >> 20,
           peak, copy);
    printf("| kernel | type | rows x cols | act | us | GB/s | of roofline |\n|---|---|---|---|---|---|---|\n");
    const int64_t shapes[][2] = {{4096, 2048}, {2048, 4096}, {512, 2048}, {768, 2048}, {2048, 768},
                                 {151936, 2048}};
    const uint32_t types[] = {QT_Q4_K, QT_Q6_K, QT_Q8_0, QT_Q5_0, QT_F16, QT_BF16, QT_F32};
    const int acts[] = {1, 4, 16};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t a = 0; a < 3; a++) {
                if (types[t] == QT_F32 && shapes[s][0] == 151936 && acts[a] > 1) continue;
                bench_matvec(types[t], shapes[s][0], shapes[s][1], acts[a], copy);
            }
    /* the types of Q2_K .. Q5_K_M and IQ4 files: the output matrix, a dense one, an expert part */
    const uint32_t more[] = {QT_Q5_K, QT_Q3_K, QT_Q2_K, QT_IQ4_XS, QT_IQ4_NL};
    for (size_t t = 0; t < sizeof more / sizeof more[0]; t++)
        for (size_t s = 0; s < 3; s++)
            for (size_t a = 0; a < 3; a++) {
                const int64_t sh[3][2] = {{151936, 2048}, {4096, 2048}, {768, 2048}};
                bench_matvec(more[t], sh[s][0], sh[s][1], acts[a], copy);
            }
    printf("\n");
    for (size_t t = 0; t < 4; t++) bench_matmul(types[t], 4096, 2048, 512, 0);
    for (size_t t = 0; t < 4; t++) bench_matmul(types[t], 4096, 2048, 512, 1);
    for (size_t t = 0; t < sizeof more / sizeof more[0]; t++)
        bench_matmul(more[t], 4096, 2048, 512, 1);
    printf("\n");
    bench_attn(4096, 1, copy);
    bench_attn(4096, 16, copy);
    bench_attn(32768, 1, copy);
    bench_attn(32768, 16, copy);
    printf("\n");
    bench_moe(1, copy);
    bench_moe(16, copy);
    return 0;
}
