/* tok_spm — SentencePiece BPE as llama.cpp runs it: spaces become "▁" (and one is prepended to a
 * fragment that starts the text or follows a special token, when add_space_prefix says so), symbols
 * start as UTF-8 characters, the adjacent pair whose concatenation is the vocabulary token with the
 * highest score merges first (leftmost on ties), and a final symbol that is not a token is spelled
 * with byte tokens <0xAB> (byte fallback). Heap of candidate pairs: O(n log n) per fragment.
 */
#include "common/tok/tok_impl.h"

#include "common/base/err.h"

#include <stdio.h>
#include <string.h>

static const char space_mark[] = "\xE2\x96\x81"; /* U+2581 "▁" */

/* A fragment splits into independent segments before each "▁" that follows another character,
 * when no token has a "▁" after its leading run of them: then no token can span such a boundary, so
 * merging each segment alone gives the same result with a heap of a word, not of the whole text. */
static bool segments_are_safe(const struct tok *t)
{
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        const char *p = t->pool + t->str[i].off;
        size_t n = t->str[i].len, k = 0;
        while (k + 3 <= n && memcmp(p + k, space_mark, 3) == 0)
            k += 3;
        if (n - k >= 3 && memmem(p + k, n - k, space_mark, 3)) return false;
    }
    return true;
}

void tok_spm_init(struct tok *t)
{
    t->spm_segments = segments_are_safe(t);
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = tok_lookup(t, hex, 6);
        if (id < 0) { /* llama.cpp falls back to the byte itself as a token */
            char c = (char)b;
            id = tok_lookup(t, &c, 1);
        }
        t->byte_str[b] = id;
    }
}

struct ssym {
    uint32_t start, len;
    int32_t prev, next;
};

struct spair {
    float score;
    int32_t left, right;
    uint32_t size;
};

static bool pair_before(const struct spair *a, const struct spair *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int try_pair(const struct tok *t, struct tok_scratch *s, size_t *n, const struct ssym *sym,
                    int32_t left, int32_t right)
{
    if (left < 0 || right < 0) return 0;
    uint32_t size = sym[left].len + sym[right].len;
    int32_t id = tok_lookup(t, (const uint8_t *)s->bytes + sym[left].start, size);
    if (id < 0 || (uint32_t)id >= t->n_vocab) return 0;
    int rv = tok_grow(&s->heap, &s->cap_heap, *n + 1, sizeof(struct spair));
    if (rv) return rv;
    struct spair *h = s->heap;
    struct spair x = {t->scores[id], left, right, size};
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!pair_before(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
    return 0;
}

static struct spair pop_pair(struct tok_scratch *s, size_t *n)
{
    struct spair *h = s->heap;
    struct spair top = h[0], x = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && pair_before(&h[c + 1], &h[c])) c++;
        if (!pair_before(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = x;
    return top;
}

static int emit(const struct tok *t, const uint8_t *text, const struct ssym *y, struct tok_ids *out)
{
    int32_t id = tok_lookup(t, text + y->start, y->len);
    if (id >= 0 && (uint32_t)id < t->n_vocab) return tok_ids_push(out, id);
    for (uint32_t k = y->start; k < y->start + y->len; k++) {
        id = t->byte_str[text[k]];
        if (id < 0 || (uint32_t)id >= t->n_vocab) id = t->unk;
        if (id >= 0) {
            int rv = tok_ids_push(out, id);
            if (rv) return rv;
        }
    }
    return 0;
}

/* merge_segment runs the merges over e[a, b) and appends its ids. */
static int merge_segment(const struct tok *t, const uint8_t *e, size_t a, size_t b,
                         struct tok_scratch *s, struct tok_ids *out)
{
    int rv;
    struct ssym *sym = s->sym;
    int32_t n_sym = 0;
    for (size_t i = a; i < b;) {
        int l = tok_utf8_len(e + i, b - i);
        if (l <= 0) l = 1; /* an invalid byte is a symbol of its own; byte fallback spells it */
        sym[n_sym] = (struct ssym){(uint32_t)i, (uint32_t)l, n_sym - 1, n_sym + 1};
        n_sym++;
        i += (size_t)l;
    }
    sym[n_sym - 1].next = -1;
    size_t nh = 0;
    for (int32_t i = 1; i < n_sym; i++)
        if ((rv = try_pair(t, s, &nh, sym, i - 1, i)) != 0) return rv;
    while (nh) {
        struct spair p = pop_pair(s, &nh);
        struct ssym *l = &sym[p.left], *r = &sym[p.right];
        if (!l->len || !r->len || l->next != p.right || l->len + r->len != p.size) continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = p.left;
        if ((rv = try_pair(t, s, &nh, sym, l->prev, p.left)) != 0) return rv;
        if ((rv = try_pair(t, s, &nh, sym, p.left, l->next)) != 0) return rv;
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        if ((rv = emit(t, e, &sym[i], out)) != 0) return rv;
    return 0;
}

int tok_spm_fragment(const struct tok *t, const char *text, size_t len, bool prefix,
                     struct tok_scratch *s, struct tok_ids *out)
{
    int rv;
    if (len > (UINT32_MAX - 3) / 3)
        return strata_errf(STRATA_ELIMIT, "tokenizer: a text of %zu bytes is too long", len);
    if ((rv = tok_grow(&s->bytes, &s->cap_bytes, 3 * len + 3, 1)) != 0) return rv;
    uint8_t *e = s->bytes;
    size_t m = 0;
    if (prefix) {
        memcpy(e, space_mark, 3);
        m = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(e + m, space_mark, 3);
            m += 3;
        } else {
            e[m++] = (uint8_t)text[i];
        }
    }
    if ((rv = tok_grow(&s->sym, &s->cap_sym, m, sizeof(struct ssym))) != 0) return rv;
    for (size_t a = 0; a < m;) {
        size_t b = m;
        if (t->spm_segments) { /* up to the next "▁" that follows another character */
            b = a;
            while (b < m && b + 3 <= m && memcmp(e + b, space_mark, 3) == 0)
                b += 3;
            const uint8_t *nx = b < m ? memmem(e + b, m - b, space_mark, 3) : NULL;
            b = nx ? (size_t)(nx - e) : m;
        }
        if ((rv = merge_segment(t, e, a, b, s, out)) != 0) return rv;
        a = b;
    }
    return 0;
}

int tok_spm_decode(const char *text, size_t len, struct tok_buf *out)
{
    int rv = tok_grow(&out->p, &out->cap, out->n + len + 1, 1);
    size_t i = 0;
    while (rv == 0 && i < len) {
        const char *m = len - i >= 3 ? memmem(text + i, len - i, space_mark, 3) : NULL;
        size_t upto = m ? (size_t)(m - text) : len;
        rv = tok_buf_put(out, text + i, upto - i);
        if (rv == 0 && m) rv = tok_buf_put(out, " ", 1);
        i = m ? upto + 3 : len;
    }
    return rv ? rv : tok_buf_put(out, "", 0);
}
