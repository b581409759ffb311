/* tok_bpe — byte-level BPE: the GPT-2 byte<->unicode map and the merge loop over one word.
 *
 * A word's symbols start as one per byte (the byte's GPT-2 character); adjacent pairs that have a
 * merge go into a min-heap by (rank, position), so a word of n bytes costs O(n log n), not the
 * O(n^2) of rescanning all pairs after each merge. A popped pair is applied only if both symbols
 * are still what they were when it was pushed (stale entries are skipped, as llama.cpp does).
 */
#include "common/tok/tok_impl.h"

#include "common/base/err.h"

#include <string.h>

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves; the other 68 bytes map in
 * order to U+0100 and up, so every byte has a visible, non-space character. */
static bool byte_is_self(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static unsigned byte_to_cp(unsigned b)
{
    if (byte_is_self(b)) return b;
    unsigned n = 0;
    for (unsigned k = 0; k < b; k++)
        n += !byte_is_self(k);
    return 256 + n;
}

int tok_bpe_byte_char(uint8_t b, char out[2])
{
    unsigned cp = byte_to_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

void tok_bpe_init(struct tok *t)
{
    for (unsigned cp = 0; cp < TOK_BYTE_CPS; cp++)
        t->cp_byte[cp] = -1;
    for (int b = 0; b < 256; b++) {
        char c[2];
        int n = tok_bpe_byte_char((uint8_t)b, c);
        t->byte_str[b] = tok_lookup(t, c, (size_t)n);
        t->cp_byte[byte_to_cp((unsigned)b)] = (int16_t)b;
    }
}

int tok_bpe_decode(const struct tok *t, const char *text, size_t len, struct tok_buf *out)
{
    int rv = tok_grow(&out->p, &out->cap, out->n + len + 1, 1);
    const uint8_t *p = (const uint8_t *)text;
    for (size_t i = 0; rv == 0 && i < len;) {
        int l = tok_utf8_len(p + i, len - i);
        unsigned cp = TOK_BYTE_CPS;
        if (l == 1)
            cp = p[i];
        else if (l == 2)
            cp = ((p[i] & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
        int b = cp < TOK_BYTE_CPS ? t->cp_byte[cp] : -1;
        if (l <= 0) l = 1;
        if (b >= 0) {
            char c = (char)b;
            rv = tok_buf_put(out, &c, 1);
        } else { /* a character outside the byte map (an odd vocabulary): keep it as it is */
            rv = tok_buf_put(out, p + i, (size_t)l);
        }
        i += (size_t)l;
    }
    return rv ? rv : tok_buf_put(out, "", 0);
}

struct bsym {
    int32_t id; /* string id, -1 when the text is not interned (it can never merge) */
    uint32_t start, len;
    int32_t prev, next;
};

struct bpair {
    uint32_t rank;
    int32_t left, right;
    int32_t lid, rid;
    uint32_t result;
};

static bool pair_less(const struct bpair *a, const struct bpair *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static const struct tok_merge *find_merge(const struct tok *t, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return NULL;
    uint64_t key = tok_merge_key(l, r);
    for (uint32_t h = tok_merge_slot(key, t->mt_mask);; h = (h + 1) & t->mt_mask) {
        if (t->mt[h].key == key) return &t->mt[h];
        if (!t->mt[h].key) return NULL;
    }
}

static int heap_push(const struct tok *t, struct tok_scratch *s, size_t *n, const struct bsym *sym,
                     int32_t left, int32_t right)
{
    if (left < 0 || right < 0) return 0;
    const struct tok_merge *m = find_merge(t, sym[left].id, sym[right].id);
    if (!m) return 0;
    int rv = tok_grow(&s->heap, &s->cap_heap, *n + 1, sizeof(struct bpair));
    if (rv) return rv;
    struct bpair *h = s->heap;
    struct bpair x = {m->rank, left, right, sym[left].id, sym[right].id, m->result};
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!pair_less(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
    return 0;
}

static struct bpair heap_pop(struct tok_scratch *s, size_t *n)
{
    struct bpair *h = s->heap;
    struct bpair top = h[0], x = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && pair_less(&h[c + 1], &h[c])) c++;
        if (!pair_less(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = x;
    return top;
}

/* emit_bytes: a symbol that is not a token falls back to one token per byte (llama.cpp skips a byte
 * the vocabulary cannot spell; a complete byte-level vocabulary spells all 256). */
static int emit_symbol(const struct tok *t, const uint8_t *w, const struct bsym *y,
                       struct tok_ids *out)
{
    if (y->id >= 0 && (uint32_t)y->id < t->n_vocab) return tok_ids_push(out, y->id);
    for (uint32_t k = y->start; k < y->start + y->len; k++) {
        int32_t id = t->byte_str[w[k]];
        if (id >= 0 && (uint32_t)id < t->n_vocab) {
            int rv = tok_ids_push(out, id);
            if (rv) return rv;
        }
    }
    return 0;
}

int tok_bpe_word(const struct tok *t, const uint8_t *w, size_t n, struct tok_scratch *s,
                 struct tok_ids *out)
{
    int rv;
    if (n == 0) return 0;
    if (n > INT32_MAX) return strata_errf(STRATA_ELIMIT, "tokenizer: a word of %zu bytes", n);
    if (t->pre->ignore_merges) {
        if ((rv = tok_grow(&s->bytes, &s->cap_bytes, 2 * n, 1)) != 0) return rv;
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            m += (size_t)tok_bpe_byte_char(w[i], (char *)s->bytes + m);
        int32_t id = tok_lookup(t, s->bytes, m);
        if (id >= 0 && (uint32_t)id < t->n_vocab) return tok_ids_push(out, id);
    }
    if ((rv = tok_grow(&s->sym, &s->cap_sym, n, sizeof(struct bsym))) != 0) return rv;
    struct bsym *sym = s->sym;
    for (size_t i = 0; i < n; i++)
        sym[i] = (struct bsym){t->byte_str[w[i]], (uint32_t)i, 1, (int32_t)i - 1,
                               i + 1 < n ? (int32_t)i + 1 : -1};
    size_t nh = 0;
    for (size_t i = 1; i < n; i++)
        if ((rv = heap_push(t, s, &nh, sym, (int32_t)i - 1, (int32_t)i)) != 0) return rv;
    while (nh) {
        struct bpair p = heap_pop(s, &nh);
        struct bsym *l = &sym[p.left], *r = &sym[p.right];
        if (!l->len || !r->len || l->next != p.right || l->id != p.lid || r->id != p.rid) continue;
        l->id = (int32_t)p.result;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = p.left;
        if ((rv = heap_push(t, s, &nh, sym, l->prev, p.left)) != 0) return rv;
        if ((rv = heap_push(t, s, &nh, sym, p.left, l->next)) != 0) return rv;
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        if ((rv = emit_symbol(t, w, &sym[i], out)) != 0) return rv;
    return 0;
}
