/* qtype — the ggml tensor types: ids as GGUF stores them, block sizes, bytes per block, names.
 *
 * The table knows every type a GGUF file may hold, so the reader can size any tensor; `computable`
 * marks the ones strata dequantizes and computes with (quant.h). Immutable; any thread.
 */
#ifndef STRATA_QTYPE_H
#define STRATA_QTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum qtype {
    QT_F32 = 0,
    QT_F16 = 1,
    QT_Q4_0 = 2,
    QT_Q4_1 = 3,
    QT_Q5_0 = 6,
    QT_Q5_1 = 7,
    QT_Q8_0 = 8,
    QT_Q8_1 = 9,
    QT_Q2_K = 10,
    QT_Q3_K = 11,
    QT_Q4_K = 12,
    QT_Q5_K = 13,
    QT_Q6_K = 14,
    QT_Q8_K = 15,
    QT_IQ2_XXS = 16,
    QT_IQ2_XS = 17,
    QT_IQ3_XXS = 18,
    QT_IQ1_S = 19,
    QT_IQ4_NL = 20,
    QT_IQ3_S = 21,
    QT_IQ2_S = 22,
    QT_IQ4_XS = 23,
    QT_I8 = 24,
    QT_I16 = 25,
    QT_I32 = 26,
    QT_I64 = 27,
    QT_F64 = 28,
    QT_IQ1_M = 29,
    QT_BF16 = 30,
    QT_TQ1_0 = 34,
    QT_TQ2_0 = 35,
    QT_MXFP4 = 39,
    QT_COUNT = 40, /* one past the largest id */
};

struct qtype_info {
    const char *name;  /* "q4_K" style as ggml prints it; NULL for an unassigned id */
    uint32_t blck;     /* elements per block */
    uint32_t bytes;    /* bytes per block */
    bool computable;   /* strata has a dequantizer and dot product for it */
};

/* qtype_get returns the info for a type id, or NULL for an id no ggml type has. */
const struct qtype_info *qtype_get(uint32_t type);

/* qtype_name returns the type's name, or "type#N" for an unknown id (static buffer per thread). */
const char *qtype_name(uint32_t type);

/* qtype_parse finds a type by name, case-insensitive ("q4_k", "Q4_K", "f16"); -1 when unknown. */
int qtype_parse(const char *name);

/* qtype_row_bytes sets *out to the bytes of a row of n elements. Returns STRATA_EINVAL for an
 * unknown type or n not a multiple of the block size, STRATA_EOVERFLOW on overflow. */
int qtype_row_bytes(uint32_t type, uint64_t n, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
