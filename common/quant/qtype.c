#include "common/quant/qtype.h"
#include "common/base/err.h"

#include <stdio.h>
#include <strings.h>

/* Sizes from ggml's block structs (ggml-common.h); removed ids (4, 5, 31-33, 36-38) stay empty. */
static const struct qtype_info table[QT_COUNT] = {
    [QT_F32] = {"f32", 1, 4, true},
    [QT_F16] = {"f16", 1, 2, true},
    [QT_Q4_0] = {"q4_0", 32, 18, true},
    [QT_Q4_1] = {"q4_1", 32, 20, true},
    [QT_Q5_0] = {"q5_0", 32, 22, true},
    [QT_Q5_1] = {"q5_1", 32, 24, true},
    [QT_Q8_0] = {"q8_0", 32, 34, true},
    [QT_Q8_1] = {"q8_1", 32, 36, false},
    [QT_Q2_K] = {"q2_K", 256, 84, true},
    [QT_Q3_K] = {"q3_K", 256, 110, true},
    [QT_Q4_K] = {"q4_K", 256, 144, true},
    [QT_Q5_K] = {"q5_K", 256, 176, true},
    [QT_Q6_K] = {"q6_K", 256, 210, true},
    [QT_Q8_K] = {"q8_K", 256, 292, false},
    [QT_IQ2_XXS] = {"iq2_xxs", 256, 66, false},
    [QT_IQ2_XS] = {"iq2_xs", 256, 74, false},
    [QT_IQ3_XXS] = {"iq3_xxs", 256, 98, false},
    [QT_IQ1_S] = {"iq1_s", 256, 50, false},
    [QT_IQ4_NL] = {"iq4_nl", 32, 18, true},
    [QT_IQ3_S] = {"iq3_s", 256, 110, false},
    [QT_IQ2_S] = {"iq2_s", 256, 82, false},
    [QT_IQ4_XS] = {"iq4_xs", 256, 136, true},
    [QT_I8] = {"i8", 1, 1, false},
    [QT_I16] = {"i16", 1, 2, false},
    [QT_I32] = {"i32", 1, 4, false},
    [QT_I64] = {"i64", 1, 8, false},
    [QT_F64] = {"f64", 1, 8, false},
    [QT_IQ1_M] = {"iq1_m", 256, 56, false},
    [QT_BF16] = {"bf16", 1, 2, true},
    [QT_TQ1_0] = {"tq1_0", 256, 54, false},
    [QT_TQ2_0] = {"tq2_0", 256, 66, false},
    [QT_MXFP4] = {"mxfp4", 32, 17, true},
};

const struct qtype_info *qtype_get(uint32_t type)
{
    if (type >= QT_COUNT || table[type].name == NULL) return NULL;
    return &table[type];
}

const char *qtype_name(uint32_t type)
{
    static _Thread_local char buf[24];
    const struct qtype_info *t = qtype_get(type);
    if (t) return t->name;
    snprintf(buf, sizeof buf, "type#%u", type);
    return buf;
}

int qtype_parse(const char *name)
{
    for (int i = 0; i < QT_COUNT; i++)
        if (table[i].name && strcasecmp(table[i].name, name) == 0) return i;
    return -1;
}

int qtype_row_bytes(uint32_t type, uint64_t n, uint64_t *out)
{
    const struct qtype_info *t = qtype_get(type);
    if (!t) return strata_errf(STRATA_EINVAL, "unknown tensor type %u", type);
    if (n % t->blck)
        return strata_errf(STRATA_EINVAL, "row of %llu elements is not a multiple of %s's block of %u",
                           (unsigned long long)n, t->name, t->blck);
    uint64_t blocks = n / t->blck;
    if (blocks > UINT64_MAX / t->bytes) return strata_errf(STRATA_EOVERFLOW, "row size overflows");
    *out = blocks * t->bytes;
    return 0;
}
