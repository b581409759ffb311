/* gguf_impl — what the GGUF module's files share: gguf_read.c (the reader), gguf_kv.c (values,
 * KV lookup, typed getters) and gguf_write.c (the writer); not for other modules (they use
 * common/gguf/gguf.h).
 *
 * Ownership of values differs by side: the reader's strings and scalar arrays point into the
 * mapping and only array items are allocated; the writer owns deep copies of everything. Hence
 * gguf_value_free takes who owns what. The name index is open addressing over an array of structs
 * whose first member is `char *name` (struct gguf_kv, struct gguf_tensor), load <= 1/2; it is
 * built while parsing or declaring and read-only afterwards. Integers in a file are little endian
 * and strata only runs on little-endian hosts, so bits are copied as they are.
 */
#ifndef STRATA_GGUF_IMPL_H
#define STRATA_GGUF_IMPL_H

#include "common/gguf/gguf.h"

/* ---- name index (gguf_read.c) ---------------------------------------------------------------- */

struct gguf_nidx {
    uint64_t *slot; /* entry index + 1; 0 = empty */
    uint64_t mask;  /* slots - 1 */
};

/* gguf_nidx_reserve makes room for n names in x (load <= 1/2), rehashing the entries [0, have) of
 * base (stride bytes apart). STRATA_ENOMEM leaves x as it was. */
int gguf_nidx_reserve(struct gguf_nidx *x, const void *base, size_t stride, uint64_t have,
                      uint64_t n);

/* gguf_nidx_add adds entry i of base (room reserved) and returns -1, or, leaving x unchanged, the
 * index of the entry already holding that name. */
int64_t gguf_nidx_add(struct gguf_nidx *x, const void *base, size_t stride, uint64_t i);

/* ---- values (gguf_kv.c) ---------------------------------------------------------------------- */

/* gguf_value_free frees what v owns: array items always; strings and scalar arrays too when owned
 * (the writer's copies). An array is left empty (n = 0). */
void gguf_value_free(struct gguf_value *v, bool owned);

/* gguf_decode_scalar turns the little-endian bits of a scalar of type t into v (bool: nonzero). */
void gguf_decode_scalar(enum gguf_vtype t, uint64_t bits, struct gguf_value *v);

/* gguf_kv_find returns the pair named key among kv[0, n), or NULL. O(n): files hold < 100 pairs. */
const struct gguf_kv *gguf_kv_find(const struct gguf_kv *kv, uint64_t n, const char *key);

static inline bool gguf_vtype_signed(enum gguf_vtype t)
{
    return t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64;
}

static inline bool gguf_vtype_unsigned(enum gguf_vtype t)
{
    return t == GGUF_UINT8 || t == GGUF_UINT16 || t == GGUF_UINT32 || t == GGUF_UINT64;
}

static inline uint64_t gguf_round_up(uint64_t x, uint64_t align)
{
    return (x + align - 1) / align * align;
}

#endif
