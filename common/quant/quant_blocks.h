/* quant_blocks — the byte layouts of ggml's quant blocks, shared by the quantizers
 * (common/quant*.c), the reference dot products (kernels/ref/qdot.c) and, later, the SIMD and CUDA
 * kernels.
 *
 * Each struct is one block exactly as GGUF stores it (ggml-common.h's block_*): little-endian, no
 * padding (the static asserts below check every size against the type table in qtype.c). fp16
 * fields are raw IEEE half bits (quant_f16_to_f32). Q8_K is not a weight format of GGUF files: it
 * is the activation layout for dot products with 256-element weight types (quant_activations).
 *
 * Also the family entry points that quant.c dispatches to (quant_k.c: the K-quants; quant_iq.c:
 * IQ4_NL and IQ4_XS; quant_mx.c: MXFP4): not for use outside common/quant*.c. They take a count
 * of blocks, not of elements, and cannot fail; quant.c checks types and lengths first.
 */
#ifndef STRATA_QUANT_BLOCKS_H
#define STRATA_QUANT_BLOCKS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define QK_LEGACY 32  /* elements of a Q4_0..Q8_0 and IQ4_NL block */
#define QK_K      256 /* elements of a K-quant / IQ4_XS super-block */

struct blk_q4_0 {
    uint16_t d;     /* scale: w = d * (q - 8) */
    uint8_t qs[16]; /* element j in the low nibble of qs[j], element j+16 in the high nibble */
};
struct blk_q4_1 {
    uint16_t d, m;  /* w = d * q + m */
    uint8_t qs[16]; /* as q4_0 */
};
struct blk_q5_0 {
    uint16_t d;     /* w = d * (q - 16) */
    uint8_t qh[4];  /* bit j: 5th bit of element j (little-endian uint32) */
    uint8_t qs[16]; /* low 4 bits, as q4_0 */
};
struct blk_q5_1 {
    uint16_t d, m; /* w = d * q + m */
    uint8_t qh[4];
    uint8_t qs[16];
};
struct blk_q8_0 {
    uint16_t d; /* w = d * q */
    int8_t qs[32];
};
struct blk_q2_K {
    uint8_t scales[16]; /* per 16 elements: scale in the low nibble, min in the high nibble */
    /* 2 bits each; byte l of each 32-byte group holds elements l, l+32, l+64, l+96 of its 128 */
    uint8_t qs[64];
    uint16_t d, dmin; /* w = d * sc * q - dmin * m */
};
struct blk_q3_K {
    uint8_t hmask[32];  /* high bit: element j at bit j/32 of hmask[j%32]; clear means q - 4 */
    uint8_t qs[64];     /* low 2 bits, as q2_K */
    uint8_t scales[12]; /* 16 6-bit scales, biased by 32 */
    uint16_t d;         /* w = d * (sc - 32) * q */
};
struct blk_q4_K {
    uint16_t d, dmin;   /* w = d * sc * q - dmin * m, per 32 elements */
    uint8_t scales[12]; /* 8 6-bit scales and 8 6-bit mins (quant_k4_scale_min) */
    uint8_t qs[128];    /* 64 elements per 32 bytes: low nibbles first, then high nibbles */
};
struct blk_q5_K {
    uint16_t d, dmin;
    uint8_t scales[12];
    /* 5th bits: element 64g + j at bit 2g of qh[j], element 64g + 32 + j at bit 2g + 1 */
    uint8_t qh[32];
    uint8_t qs[128];
};
struct blk_q6_K {
    uint8_t ql[128];   /* low 4 bits */
    uint8_t qh[64];    /* high 2 bits */
    int8_t scales[16]; /* per 16 elements */
    uint16_t d;        /* w = d * sc * (q - 32) */
};
struct blk_q8_K {
    float d; /* x = d * q */
    int8_t qs[256];
    int16_t bsums[16]; /* sum of each 16 consecutive qs, for the min terms of K-quant dots */
};
struct blk_iq4_nl {
    uint16_t d;     /* w = d * quant_iq4nl_values[q] */
    uint8_t qs[16]; /* as q4_0 */
};
/* MXFP4 (OCP microscaling): 32 e2m1 values sharing one power-of-two scale. The levels below are
 * the e2m1 values doubled (integers), so w = 2^(e - 128) * quant_mxfp4_values[q]
 * (quant_e8m0_half(e)): the integer form every kernel computes with. */
struct blk_mxfp4 {
    uint8_t e;      /* E8M0 scale exponent: the block's scale is 2^(e - 127) */
    uint8_t qs[16]; /* 4-bit codes (sign bit 3, e2m1 magnitude bits 0-2), as q4_0 */
};
struct blk_iq4_xs {
    uint16_t d;
    uint16_t scales_h;   /* high 2 bits of the 8 6-bit scales */
    uint8_t scales_l[4]; /* low 4 bits, two per byte */
    uint8_t qs[128];     /* per 32 elements 16 bytes, as q4_0 */
};

_Static_assert(sizeof(struct blk_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(struct blk_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(struct blk_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(struct blk_q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(struct blk_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(struct blk_q2_K) == 84, "q2_K block");
_Static_assert(sizeof(struct blk_q3_K) == 110, "q3_K block");
_Static_assert(sizeof(struct blk_q4_K) == 144, "q4_K block");
_Static_assert(sizeof(struct blk_q5_K) == 176, "q5_K block");
_Static_assert(sizeof(struct blk_q6_K) == 210, "q6_K block");
_Static_assert(sizeof(struct blk_q8_K) == 292, "q8_K block");
_Static_assert(sizeof(struct blk_iq4_nl) == 18, "iq4_nl block");
_Static_assert(sizeof(struct blk_iq4_xs) == 136, "iq4_xs block");
_Static_assert(sizeof(struct blk_mxfp4) == 17, "mxfp4 block");

/* The 16 levels of IQ4_NL / IQ4_XS (ggml's kvalues_iq4nl). */
extern const int8_t quant_iq4nl_values[16];

/* The 16 e2m1 codes of MXFP4 as doubled integers (ggml's kvalues_mxfp4): code 8 is -0. */
extern const int8_t quant_mxfp4_values[16];

/* quant_e8m0_half returns 2^(e - 128), half an E8M0 scale, exactly (ggml's
 * GGML_E8M0_TO_FP32_HALF): subnormal floats for e < 2. */
static inline float quant_e8m0_half(uint8_t e)
{
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* quant_k4_scale_min unpacks the 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block. */
static inline void quant_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* quant_k3_scales unpacks the 16 6-bit scales of a Q3_K block, still biased by 32. */
static inline void quant_k3_scales(const uint8_t *s, int8_t out[16])
{
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
        int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)(lo | (hi << 4));
    }
}

/* quant_nearest_int rounds to nearest, ties to even, as ggml's nearest_int does (the magic-number
 * add; |f| must stay below 2^22, which every caller's clamped range guarantees). */
static inline int quant_nearest_int(float f)
{
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* quant_amax_signed returns the element of largest magnitude (the first one on ties), 0 for none:
 * the scale searches divide by it with its sign, as ggml's do. */
static inline float quant_amax_signed(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* Family entry points (see the header comment). src/dst are nb blocks and nb * block-size floats.
 */
void quant_k_dequantize(uint32_t type, const void *src, float *dst, int64_t nb);
void quant_k_quantize(uint32_t type, const float *src, void *dst, int64_t nb);
void quant_iq_dequantize(uint32_t type, const void *src, float *dst, int64_t nb);
void quant_iq_quantize(uint32_t type, const float *src, void *dst, int64_t nb);
void quant_mxfp4_dequantize(const struct blk_mxfp4 *src, float *dst, int64_t nb);
void quant_mxfp4_quantize(const float *src, struct blk_mxfp4 *dst, int64_t nb);
/* quant_q8_K quantizes nb super-blocks of activations (ggml's quantize_row_q8_K_ref). */
void quant_q8_K(const float *src, struct blk_q8_K *dst, int64_t nb);

#endif
