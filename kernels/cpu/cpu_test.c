/* cpu_test — every fast kernel against its plain-C reference, compared with memcmp: matmul of
 * every weight type (quantized rows and raw random blocks that reach every level and scale the
 * format allows), on odd shapes (rows not a multiple of 8, 1..17 tokens around the direct path's
 * limit, token counts across the token tile, row sub-ranges, strided outputs, guard floats after
 * the output), attention over a paged cache
 * with odd head sizes, RoPE of both styles and RMSNorm, on each ISA this CPU has. */
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/ref/ops.h"
#include "kernels/ref/qdot.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint32_t types[] = {QT_F32,  QT_F16,  QT_BF16, QT_Q8_0,   QT_Q4_0,
                                 QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q2_K,   QT_Q3_K,
                                 QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_NL, QT_IQ4_XS, QT_MXFP4};
#define NTYPES ((int)(sizeof types / sizeof types[0]))

/* Offsets of the fp16 scale fields in a block (-1: none), patched in raw random blocks. */
static const struct {
    uint32_t type;
    int d, m;
} fields[] = {
    {QT_Q4_0, 0, -1}, {QT_Q4_1, 0, 2},    {QT_Q5_0, 0, -1},   {QT_Q5_1, 0, 2},
    {QT_Q8_0, 0, -1}, {QT_Q2_K, 80, 82},  {QT_Q3_K, 108, -1}, {QT_Q4_K, 0, 2},
    {QT_Q5_K, 0, 2},  {QT_Q6_K, 208, -1}, {QT_IQ4_NL, 0, -1}, {QT_IQ4_XS, 0, -1},
};

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static float gauss(void)
{
    double u = ((double)(next() >> 11) + 0.5) * 0x1p-53, v = (double)(next() >> 11) * 0x1p-53;
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* ISAs to test: every one this CPU runs besides the reference. */
static int isas(enum cpu_isa *out)
{
    int n = 0;
    if (cpu_isa_supported(CPU_AVX2)) out[n++] = CPU_AVX2;
    if (cpu_isa_supported(CPU_AVX512)) out[n++] = CPU_AVX512;
    if (!n) printf("SKIP cpu kernels: this CPU has neither AVX2 nor AVX-512\n");
    return n;
}

/* make_rows fills n_out rows of n_in weights of type t: quantized gaussians (with an offset when
 * shifted) or, when raw, random bytes with fp16 scales patched to finite values. */
static void make_rows(uint32_t t, uint32_t n_out, uint32_t n_in, bool raw, bool shifted, uint8_t *w,
                      uint64_t row_bytes)
{
    float *src = malloc((size_t)n_in * sizeof(float));
    for (uint32_t r = 0; r < n_out; r++) {
        uint8_t *row = w + r * row_bytes;
        if (!raw || t == QT_F32 || t == QT_F16 || t == QT_BF16) {
            for (uint32_t i = 0; i < n_in; i++)
                src[i] = gauss() * 0.05f + (shifted ? 0.2f : 0);
            ck_assert_int_eq(quant_quantize(t, src, row, n_in), 0);
            continue;
        }
        for (uint64_t i = 0; i < row_bytes; i++)
            row[i] = (uint8_t)next();
        const struct qtype_info *ti = qtype_get(t);
        /* MXFP4: an E8M0 exponent byte per block, kept near 2^-8 so sums stay finite, and one
         * block in 8 at the subnormal scales 0..2 (quant_e8m0_half's other branch) */
        for (uint32_t b = 0; t == QT_MXFP4 && b < n_in / ti->blck; b++)
            row[(size_t)b * ti->bytes] =
                (uint8_t)(next() % 8 == 0 ? next() % 3 : 112 + next() % 24);
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
            if (fields[f].type != t) continue;
            for (uint32_t b = 0; b < n_in / ti->blck; b++) {
                uint8_t *blk = row + (size_t)b * ti->bytes;
                uint16_t d = quant_f32_to_f16(gauss() * 0.01f),
                         m = quant_f32_to_f16(gauss() * 0.01f);
                memcpy(blk + fields[f].d, &d, 2);
                if (fields[f].m >= 0) memcpy(blk + fields[f].m, &m, 2);
            }
        }
    }
    free(src);
}

#define GUARD       8
#define GUARD_VALUE 12345.0f

/* check_matmul: rows [row0, row1) of n_out x n_in weights times n_tok tokens, each ISA vs ref. */
static void check_matmul(uint32_t t, uint32_t n_out, uint32_t n_in, uint32_t n_tok, uint32_t row0,
                         uint32_t row1, bool raw)
{
    enum cpu_isa isa[2];
    const int n_isa = isas(isa);
    uint64_t row_bytes;
    ck_assert_int_eq(qtype_row_bytes(t, n_in, &row_bytes), 0);
    uint8_t *w = malloc(row_bytes * n_out);
    make_rows(t, n_out, n_in, raw, n_tok % 2, w, row_bytes);
    const size_t act_stride = quant_act_bytes(t, n_in) + 40; /* not a multiple of 32 */
    float *x = malloc((size_t)n_tok * n_in * sizeof(float));
    for (size_t i = 0; i < (size_t)n_tok * n_in; i++)
        x[i] = gauss() * (i % 7 == 0 ? 30.0f : 1.0f);
    uint8_t *acts = calloc(n_tok, act_stride);
    ck_assert_int_eq(ops_quantize_acts(t, x, n_in, n_in, n_tok, acts, act_stride), 0);
    const size_t out_stride = n_out + 3, len = (size_t)n_tok * out_stride + GUARD;
    float *want = malloc(len * sizeof(float)), *got = malloc(len * sizeof(float));
    for (size_t i = 0; i < len; i++)
        want[i] = GUARD_VALUE;
    ops_matmul(t, w, row_bytes, n_in, row0, row1, acts, act_stride, n_tok, want, out_stride);
    for (int k = 0; k < n_isa; k++) {
        ck_assert_int_eq(cpu_isa_set(isa[k]), 0);
        for (size_t i = 0; i < len; i++)
            got[i] = GUARD_VALUE;
        cpu_matmul(t, w, row_bytes, n_in, row0, row1, acts, act_stride, n_tok, got, out_stride);
        for (uint32_t tok = 0; tok < n_tok; tok++)
            for (uint32_t r = 0; r < n_out + 3; r++) {
                const size_t i = tok * out_stride + r;
                ck_assert_msg(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                              "%s %s %s: %u x %u, %u tokens, rows [%u, %u): token %u row %u: "
                              "%.9g, reference %.9g",
                              cpu_isa_name(isa[k]), qtype_name(t), raw ? "raw" : "quantized", n_out,
                              n_in, n_tok, row0, row1, tok, r, got[i], want[i]);
            }
        for (size_t i = len - GUARD; i < len; i++)
            ck_assert(got[i] == GUARD_VALUE);
        /* cpu_qdot: one row, one token */
        const float q = cpu_qdot(t, n_in, w + row0 * row_bytes, acts);
        const float r = qdot_ref(t, n_in, w + row0 * row_bytes, acts);
        ck_assert_msg(memcmp(&q, &r, sizeof q) == 0, "%s cpu_qdot %s: %.9g vs %.9g",
                      cpu_isa_name(isa[k]), qtype_name(t), q, r);
    }
    free(w);
    free(x);
    free(acts);
    free(want);
    free(got);
}

START_TEST(matmul_equals_reference)
{
    const uint32_t t = types[_i];
    const bool k = qtype_get(t)->blck == 256;
    const uint32_t n_in = k ? 768 : 160;
    for (int raw = 0; raw < 2; raw++) {
        check_matmul(t, 13, n_in, 1, 0, 13, raw);       /* decode: one token, a partial row group */
        check_matmul(t, 21, n_in, 37, 3, 20, raw);      /* prompt chunk across the token tile */
        check_matmul(t, 8, k ? 256 : 32, 5, 0, 8, raw); /* one block per row */
        /* the direct path (1..16 tokens: decode, an expert's share of a decode window) and
         * the first count past it, on ranges that start and end inside a row group */
        for (uint32_t nt = 1; nt <= 17; nt++) {
            check_matmul(t, 29, n_in, nt, 5, 27, raw);
            check_matmul(t, 3, k ? 256 : 32, nt, 0, 3, raw);
        }
        /* 9..16 tokens go in two passes over chunks of 64 rows: ranges across chunk edges */
        check_matmul(t, 150, k ? 256 : 64, 9, 3, 147, raw);
        check_matmul(t, 150, k ? 256 : 64, 16, 61, 150, raw);
        /* the types whose direct path takes every count: passes of 7, 7 and 7 / 6 + 6 + 6 + 7
         * tokens over those chunks, and a prompt past the token tile */
        check_matmul(t, 150, k ? 256 : 64, 21, 3, 147, raw);
        check_matmul(t, 150, k ? 256 : 64, 25, 61, 150, raw);
        check_matmul(t, 70, n_in, 67, 1, 69, raw);
        check_matmul(t, 40, k ? 2560 : 1056, 1, 0, 40, raw); /* longer rows, 5 groups */
    }
    if (t == QT_F32) /* float rows of any length, one token (4 row groups a pass) or more */
        for (uint32_t nt = 1; nt <= 5; nt++)
            check_matmul(t, 41, 77, nt, 2, 39, false);
}
END_TEST

/* A paged KV view over random keys/values: block_tokens 16, so 32-key attention blocks straddle
 * cache blocks, and the head sits at an offset inside each row. The values are halves, so the same
 * cache as fp16 rows (an fp16 view: converted a block at a time, or widened on the reference path)
 * must give the same bits too. Each case is run on K rows and on K by columns (k_cols, the
 * store's layout), the columns also with block_tokens 12, whose blocks split the kernels' lane
 * groups of keys. */
START_TEST(attention_equals_reference)
{
    enum cpu_isa isa[3];
    const int n_simd = isas(isa);
    isa[n_simd] = CPU_REF; /* the fp16 view's widening; the float view's reference is `want` */
    static const uint32_t dims[][2] = {{64, 64}, {72, 40}, {13, 21}, {128, 128}};
    /* 130: a decode step's in-place blocks prefetch CPU_ATT_AHEAD blocks ahead for the first
     * ones (cpu_att_ahead), the rest the next block at once */
    static const uint32_t keys[] = {1, 7, 32, 33, 70, 130};
    /* floats: K then V of 2 heads; room for blocks of up to 32 positions */
    const uint32_t bt = 16, bt_max = 32, n_blocks = 8, row = 2 * 160;
    float *blocks[8], *wtab[8];
    uint16_t *hblocks[8];
    float *conv = malloc((size_t)n_blocks * bt_max * (128 + 128) * sizeof(float));
    for (uint32_t b = 0; b < n_blocks; b++) {
        blocks[b] = malloc((size_t)bt_max * row * 2 * sizeof(float));
        hblocks[b] = malloc((size_t)bt_max * row * 2 * sizeof(uint16_t));
        for (size_t i = 0; i < (size_t)bt_max * row * 2; i++) {
            hblocks[b][i] = quant_f32_to_f16(gauss());
            blocks[b][i] = quant_f16_to_f32(hblocks[b][i]);
        }
    }
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        /* layouts: K rows; K by columns in blocks of 16, 12, and 32 (the backend's: a decode
         * step's scores from the columns in place) */
        for (uint32_t lay = 0; lay < 4; lay++) {
            const uint32_t hd = dims[di][0], hv = dims[di][1],
                           vbt = lay == 2   ? 12
                                 : lay == 3 ? bt_max
                                            : bt;
            const struct ops_kv_view v = {.blocks = blocks,
                                          .block_tokens = vbt,
                                          .k_off = hd + 3,
                                          .v_off = (size_t)bt * row + hv + 1,
                                          .k_stride = row,
                                          .v_stride = row,
                                          .k_cols = lay > 0};
            struct ops_kv_view vh = v;
            vh.blocks = NULL, vh.hblocks = (const uint16_t *const *)hblocks, vh.wtab = wtab;
            vh.conv = conv;
            /* (tokens, heads) of one call: decode of a GQA group, prompt runs; strided apart */
            static const uint32_t shapes[][2] = {{1, 1}, {1, 4}, {3, 2}, {9, 4}, {16, 4}, {5, 3}};
            enum { QT = 4 * 130, QH = 130, OT = 4 * 131, OH = 131, NQ = 16 * 4 };
            static float q[NQ * QH], want[NQ * OH], got[NQ * OH];
            for (uint32_t d = 0; d < NQ * QH; d++)
                q[d] = gauss() * 2;
            const float sc = 1.0f / sqrtf((float)hd);
            /* gpt-oss's sliding windows (none, shorter than a block, one block, across blocks) and
             * sinks (one per head; large enough to matter) */
            static const uint32_t windows[] = {0, 5, 32, 40};
            static const float sink_vals[4] = {0.5f, -1.0f, 3.0f, 0.0f};
            for (size_t wi = 0; wi < 2 * sizeof windows / sizeof windows[0]; wi++) {
                for (size_t ki = 0; ki < sizeof keys / sizeof keys[0]; ki++)
                    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
                        const uint32_t nt = shapes[sh][0], nh = shapes[sh][1],
                                       win = windows[wi / 2];
                        const float *sinks = wi % 2 ? sink_vals : NULL;
                        if (keys[ki] + nt - 1 > n_blocks * vbt) continue;
                        for (int i = 0; i < NQ * OH; i++)
                            want[i] = GUARD_VALUE;
                        struct cpu_att_q a = {q,  QT, QH,       NULL, OT,   OH,
                                              nt, nh, keys[ki], win,  sinks};
                        for (uint32_t t = 0; t < nt; t++)
                            for (uint32_t h = 0; h < nh; h++)
                                ops_attention_ex(want + t * OT + h * OH, q + t * QT + h * QH, hd,
                                                 hv, sc, &v, cpu_att_lo(&a, t), keys[ki] + t,
                                                 sinks ? sinks[h] : -INFINITY);
                        for (int k = 0; k < 2 * n_simd + 1; k++) {
                            const bool f16 = k >= n_simd;
                            ck_assert_int_eq(cpu_isa_set(isa[f16 ? k - n_simd : k]), 0);
                            for (int i = 0; i < NQ * OH; i++)
                                got[i] = GUARD_VALUE;
                            a.out = got;
                            cpu_attention(&a, hd, hv, sc, f16 ? &vh : &v);
                            /* every output equal, the floats between and after them untouched */
                            ck_assert_msg(
                                memcmp(got, want, sizeof got) == 0,
                                "%s attention over an %s view (K %s, %u-key blocks), "
                                "head_dim %u/%u, %u keys, %u tokens x %u heads, window %u, "
                                "%s differs",
                                cpu_isa_name(cpu_isa()), f16 ? "fp16" : "fp32",
                                lay ? "by columns" : "rows", vbt, hd, hv, keys[ki], nt, nh, win,
                                sinks ? "sinks" : "no sinks");
                        }
                    }
            }
        }
    }
    for (uint32_t b = 0; b < n_blocks; b++) {
        free(blocks[b]);
        free(hblocks[b]);
    }
    free(conv);
}
END_TEST

/* MLA's rows (DeepSeek-V3: kv_lora_rank 512 + 64 rope dims, one cache row per position): keys
 * of 576 floats, the values the first 512 floats of the same rows, 16 heads sharing them (MQA);
 * decode (1 token) and a prompt run (4 tokens), keys within one block and across several. */
START_TEST(attention_mla_rows_equal_reference)
{
    enum cpu_isa isa[2];
    const int n_isa = isas(isa);
    enum { HD = 576, HV = 512, BT = 16, NB = 6, NH = 16, NT = 4 };
    float *blocks[NB];
    for (uint32_t b = 0; b < NB; b++) {
        blocks[b] = malloc((size_t)BT * HD * sizeof(float));
        for (size_t i = 0; i < (size_t)BT * HD; i++)
            blocks[b][i] = gauss();
    }
    const struct ops_kv_view v = {
        .blocks = blocks, .block_tokens = BT, .k_stride = HD, .v_stride = HD};
    static float q[NT * NH * HD], want[NT * NH * HV], got[NT * NH * HV];
    for (size_t d = 0; d < sizeof q / sizeof q[0]; d++)
        q[d] = gauss();
    const float sc = 1.3f / sqrtf(192.0f); /* mscale^2 / sqrt(key head), as fwd_mla's */
    static const uint32_t keys[] = {1, 9, 40, 93};
    for (size_t ki = 0; ki < sizeof keys / sizeof keys[0]; ki++)
        for (uint32_t nt = 1; nt <= NT; nt += NT - 1) {
            struct cpu_att_q a = {q, NH * HD, HD, NULL, NH * HV, HV, nt, NH, keys[ki], 0, NULL};
            for (uint32_t t = 0; t < nt; t++)
                for (uint32_t h = 0; h < NH; h++)
                    ops_attention(want + (t * NH + h) * HV, q + (t * NH + h) * HD, HD, HV, sc, &v,
                                  keys[ki] + t);
            for (int k = 0; k < n_isa; k++) {
                ck_assert_int_eq(cpu_isa_set(isa[k]), 0);
                memset(got, 0, sizeof got);
                a.out = got;
                cpu_attention(&a, HD, HV, sc, &v);
                ck_assert_msg(memcmp(got, want, (size_t)nt * NH * HV * sizeof(float)) == 0,
                              "%s MLA attention, %u keys, %u tokens x %u heads differs",
                              cpu_isa_name(isa[k]), keys[ki], nt, NH);
            }
        }
    for (uint32_t b = 0; b < NB; b++)
        free(blocks[b]);
}
END_TEST

START_TEST(rope_and_norm_equal_reference)
{
    enum cpu_isa isa[2];
    const int n_isa = isas(isa);
    static const uint32_t shapes[][3] = {{4, 64, 64}, {3, 128, 96}, {2, 40, 24}, {5, 18, 18}};
    static const uint32_t positions[] = {0, 7, 4099};
    float want[5 * 128], got[5 * 128];
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int neox = 0; neox < 2; neox++)
            for (size_t p = 0; p < 3; p++) {
                const uint32_t nh = shapes[s][0], hd = shapes[s][1], nr = shapes[s][2];
                for (uint32_t i = 0; i < nh * hd; i++)
                    want[i] = gauss();
                float x0[5 * 128];
                memcpy(x0, want, sizeof x0);
                ops_rope(want, nh, hd, nr, positions[p], 1e6f, neox);
                /* gpt-oss's YaRN: factor 32 over 4096 trained positions */
                float yw[5 * 128];
                struct ops_yarn y;
                ops_yarn_init(&y, nr, 4096, 150000.0f, 32.0f);
                memcpy(yw, x0, sizeof yw);
                ops_rope_yarn(yw, nh, hd, nr, positions[p], 150000.0f, neox, &y);
                for (int k = 0; k < n_isa; k++) {
                    ck_assert_int_eq(cpu_isa_set(isa[k]), 0);
                    memcpy(got, x0, sizeof got);
                    cpu_rope(got, nh, hd, nr, positions[p], 1e6f, neox);
                    ck_assert_msg(memcmp(got, want, nh * hd * sizeof(float)) == 0,
                                  "%s rope %u heads of %u (%u rotated), neox %d, pos %u differs",
                                  cpu_isa_name(isa[k]), nh, hd, nr, neox, positions[p]);
                    memcpy(got, x0, sizeof got);
                    cpu_rope_yarn(got, nh, hd, nr, positions[p], 150000.0f, neox, &y);
                    ck_assert_msg(memcmp(got, yw, nh * hd * sizeof(float)) == 0,
                                  "%s YaRN rope %u heads of %u (%u rotated), neox %d, pos %u "
                                  "differs",
                                  cpu_isa_name(isa[k]), nh, hd, nr, neox, positions[p]);
                }
            }
    static const uint32_t lens[] = {1, 7, 64, 1000, 2049};
    float *x = malloc(2049 * sizeof(float)), *wt = malloc(2049 * sizeof(float));
    float *a = malloc(2049 * sizeof(float)), *b = malloc(2049 * sizeof(float));
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
        for (uint32_t i = 0; i < lens[l]; i++) {
            x[i] = gauss() * 3;
            wt[i] = 1 + gauss() * 0.1f;
        }
        ops_rmsnorm(a, x, wt, lens[l], 1e-6f);
        for (int k = 0; k < n_isa; k++) {
            ck_assert_int_eq(cpu_isa_set(isa[k]), 0);
            cpu_rmsnorm(b, x, wt, lens[l], 1e-6f);
            ck_assert_msg(memcmp(a, b, lens[l] * sizeof(float)) == 0, "%s rmsnorm of %u differs",
                          cpu_isa_name(isa[k]), lens[l]);
        }
    }
    free(x);
    free(wt);
    free(a);
    free(b);
}
END_TEST

/* Activation quantization: rows of gaussians with spikes, ties of magnitude with both signs, an
 * all-zero block, values on rounding midpoints. */
START_TEST(quantize_acts_equal_reference)
{
    enum cpu_isa isa[2];
    const int n_isa = isas(isa);
    static const uint32_t wtypes[] = {QT_Q4_K, QT_Q8_0, QT_F32, QT_IQ4_XS, QT_Q4_0};
    const uint32_t n_in = 768, n_tok = 5;
    float *x = malloc((size_t)n_tok * 800 * sizeof(float));
    for (uint32_t i = 0; i < n_tok * 800; i++)
        x[i] = gauss() * (i % 13 == 0 ? 40.0f : 1.0f);
    for (uint32_t i = 0; i < 256; i++)
        x[800 + i] = 0.0f;             /* token 1: an all-zero block */
    for (uint32_t i = 0; i < 256; i++) /* token 2: a tie of magnitude, the first decides */
        x[2 * 800 + i] = gauss() * 0.1f;
    x[2 * 800 + 5] = 9.0f, x[2 * 800 + 9] = -9.0f;
    for (uint32_t i = 0; i < 256; i++) /* token 3: scale 1, levels on the midpoints */
        x[3 * 800 + i] = (float)((int)(i % 64) - 32) + 0.5f;
    x[3 * 800] = 127.0f, x[3 * 800 + 32] = 127.0f;
    const size_t stride = 3100; /* F32 activations: 768 floats */
    uint8_t *want = calloc(n_tok, stride), *got = calloc(n_tok, stride);
    for (size_t w = 0; w < sizeof wtypes / sizeof wtypes[0]; w++) {
        memset(want, 0xA5, n_tok * stride);
        ck_assert_int_eq(ops_quantize_acts(wtypes[w], x, 800, n_in, n_tok, want, stride), 0);
        for (int k = 0; k < n_isa; k++) {
            ck_assert_int_eq(cpu_isa_set(isa[k]), 0);
            memset(got, 0xA5, n_tok * stride);
            ck_assert_int_eq(cpu_quantize_acts(wtypes[w], x, 800, n_in, n_tok, got, stride), 0);
            ck_assert_msg(memcmp(got, want, n_tok * stride) == 0, "%s: activations for %s differ",
                          cpu_isa_name(isa[k]), qtype_name(wtypes[w]));
        }
    }
    free(x);
    free(want);
    free(got);
}
END_TEST

/* The vector expf of attention (16 lanes for AVX-512, 8 for AVX2; _i picks) against libm's on
 * every 256th float of [-110, 90] and the special values (where this libm is glibc's table method;
 * the sweep over all 2.2e9 floats of that range found no difference when it was written). */
START_TEST(vector_expf_equals_libm)
{
    const enum cpu_isa isa = _i ? CPU_AVX2 : CPU_AVX512;
    void (*const vexp)(const float *, float *, uint32_t) = _i ? cpu_expf_avx2 : cpu_expf_avx512;
    if (!cpu_isa_supported(isa)) {
        printf("SKIP vector expf: no %s\n", cpu_isa_name(isa));
        return;
    }
    const int ok = _i ? cpu_vexp2_ok() : cpu_vexp_ok();
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 28)
    ck_assert_msg(ok, "glibc's expf (table method since 2.28) and the %s vector copy differ",
                  cpu_isa_name(isa));
#else
    if (!ok) {
        printf("SKIP vector expf: this libm's expf is another algorithm\n");
        return;
    }
#endif
    enum { N = 1 << 14 };
    static float x[N], y[N], z[N];
    uint32_t n = 0;
    const float special[] = {-INFINITY, INFINITY, NAN, 0.0f, -0.0f, -103.5f, -104.0f, 88.8f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        x[n++] = special[i];
    for (int sign = 0; sign < 2; sign++)
        for (uint32_t bits = 0;; bits += 256) {
            const uint32_t u = bits | (uint32_t)sign << 31;
            float v;
            memcpy(&v, &u, 4);
            if (sign ? v < -110.0f : v > 90.0f) break;
            x[n++] = v;
            if (n < N) continue;
            vexp(x, y, n);
            /* one assertion per chunk: Check logs every assertion that passes */
            uint32_t bad = n;
            for (uint32_t i = 0; i < n && bad == n; i++) {
                const float e = expf(x[i]);
                if (memcmp(&e, &y[i], 4) != 0 && !(isnan(e) && isnan(y[i]))) bad = i;
            }
            ck_assert_msg(bad == n, "expf(%a) = %a, vector %a", x[bad % n], expf(x[bad % n]),
                          y[bad % n]);
            /* in place (the attention's softmax): the same bits, the special inputs included */
            memcpy(z, x, n * sizeof *x);
            vexp(z, z, n);
            ck_assert_msg(memcmp(z, y, n * sizeof *y) == 0, "expf in place differs");
            n = 0;
        }
    /* every length up to two vectors and a lane (the tail goes through a padded copy): each
     * element libm's, in place too, nothing past the end written */
    const float tail[] = {-INFINITY, 3.25f, NAN, -0.0f, 88.8f, -104.0f, 1.5f, -2.0f, 0.1f, 40.0f};
    for (uint32_t len = 1; len <= 33; len++) {
        for (uint32_t i = 0; i < len; i++)
            x[i] = tail[(i * 7 + len) % (sizeof tail / sizeof tail[0])];
        for (uint32_t i = 0; i < 40; i++)
            y[i] = z[i] = 12345.0f;
        memcpy(z, x, len * sizeof *x);
        vexp(x, y, len);
        vexp(z, z, len);
        for (uint32_t i = 0; i < 40; i++) {
            const float e = i < len ? expf(x[i]) : 12345.0f;
            ck_assert_msg((memcmp(&e, &y[i], 4) == 0 || (isnan(e) && isnan(y[i]))) &&
                              memcmp(&y[i], &z[i], 4) == 0,
                          "%s expf of %u floats: element %u is %a, in place %a, want %a",
                          cpu_isa_name(isa), len, i, y[i], z[i], e);
        }
    }
}
END_TEST

/* SwiGLU (both forms) on every ISA: gaussians of several widths, the range where expf leaves its
 * main path (|x| >= 88), +-inf, NaN, +-0, the clamp's edges; in place as the forward pass runs
 * it (out aliasing gate), lengths across the chunk boundary. */
START_TEST(swiglu_equals_reference)
{
    enum cpu_isa isa[2];
    const int n_isa = isas(isa);
    enum { N = 700 };
    static float g[N], u[N], want[N], got[N];
    const float special[] = {INFINITY, -INFINITY, NAN,     0.0f, -0.0f, 88.0f,  -88.0f, 88.8f,
                             -104.0f,  120.0f,    -120.0f, 7.0f, -7.0f, 6.999f, 1e-30f, -1e-30f};
    static const uint32_t lens[] = {1, 15, 256, 257, N};
    for (int form = 0; form < 2; form++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            const uint32_t n = lens[l];
            for (uint32_t i = 0; i < n; i++) {
                const float sc = i % 3 == 0 ? 1.0f : i % 3 == 1 ? 8.0f : 60.0f;
                g[i] = i % 5 == 4 ? special[(i / 5) % 16] : gauss() * sc;
                u[i] = i % 7 == 6 ? special[(i / 7 + 3) % 16] : gauss() * sc;
            }
            if (form)
                ops_swiglu_oai(want, g, u, n, 1.702f, 7.0f);
            else
                ops_swiglu(want, g, u, n);
            for (int k = 0; k < n_isa; k++) {
                ck_assert_int_eq(cpu_isa_set(isa[k]), 0);
                memcpy(got, g, n * sizeof *g);
                if (form)
                    cpu_swiglu_oai(got, got, u, n, 1.702f, 7.0f);
                else
                    cpu_swiglu(got, got, u, n);
                uint32_t bad = n;
                for (uint32_t i = 0; i < n && bad == n; i++)
                    if (memcmp(&got[i], &want[i], 4) != 0 && !(isnan(got[i]) && isnan(want[i])))
                        bad = i;
                ck_assert_msg(bad == n,
                              "%s swiglu%s of %u: element %u (gate %a, up %a) %a, "
                              "reference %a",
                              cpu_isa_name(isa[k]), form ? "_oai" : "", n, bad % n, g[bad % n],
                              u[bad % n], got[bad % n], want[bad % n]);
            }
        }
}
END_TEST

START_TEST(isa_choice)
{
    /* the reference is always there; an ISA the CPU lacks is refused by name */
    ck_assert_int_eq(cpu_isa_set(CPU_REF), 0);
    ck_assert_int_eq(cpu_isa(), CPU_REF);
    ck_assert_str_eq(cpu_isa_name(CPU_AVX512), "avx512");
    for (int i = CPU_AVX2; i <= CPU_AVX512; i++)
        ck_assert_int_eq(cpu_isa_set((enum cpu_isa)i) == 0, cpu_isa_supported((enum cpu_isa)i));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cpu");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 60); /* Debug + ASan */
    tcase_add_loop_test(tc, matmul_equals_reference, 0, NTYPES);
    tcase_add_test(tc, attention_equals_reference);
    tcase_add_test(tc, attention_mla_rows_equal_reference);
    tcase_add_test(tc, rope_and_norm_equal_reference);
    tcase_add_test(tc, quantize_acts_equal_reference);
    tcase_add_test(tc, swiglu_equals_reference);
    tcase_add_loop_test(tc, vector_expf_equals_libm, 0, 2);
    tcase_add_test(tc, isa_choice);
    suite_add_tcase(s, tc);
    return test_run(s);
}
