#include "tools/bpe_train.h"

#include "common/base/err.h"
#include "common/gguf/gguf.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <xxhash.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The regex common/tok/tok_pre.c applies for pre "gpt-2" (llama.cpp's gpt2 split). It is repeated
 * here because tok exposes encoding, not splitting; bpe_train_test checks that tok encodes the
 * training text into exactly as many tokens as the trainer's own segmentation, which fails if the
 * two splits ever differ. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"

static const char *const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
enum { SP_EOT, SP_IM_START, SP_IM_END, N_SPECIAL };

#define TYPE_NORMAL  1 /* llama.cpp's token types, as tokenizer.ggml.token_type stores them */
#define TYPE_CONTROL 3
#define TYPE_UNUSED  5

/* chatml, as Qwen2.5 and Qwen3 instruct models speak it (no tools). */
static const char chat_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

/* ---- a set of byte strings with dense ids ---------------------------------------------------- */

struct strset {
    uint8_t *pool; /* the strings, back to back */
    size_t pool_n, pool_cap;
    size_t *off;
    uint32_t *len;
    uint64_t *count; /* per string: occurrences (words) */
    uint32_t n, cap;
    uint32_t *ht; /* id + 1; 0 = empty; ht_mask + 1 slots, at most half full */
    uint32_t ht_mask;
};

static void strset_fini(struct strset *s)
{
    free(s->pool);
    free(s->off);
    free(s->len);
    free(s->count);
    free(s->ht);
}

static uint32_t *strset_slot(const struct strset *s, const void *p, uint32_t len)
{
    uint32_t i = (uint32_t)XXH3_64bits(p, len) & s->ht_mask;
    for (;; i = (i + 1) & s->ht_mask) {
        uint32_t id = s->ht[i];
        if (!id) return &s->ht[i];
        id--;
        if (s->len[id] == len && memcmp(s->pool + s->off[id], p, len) == 0) return &s->ht[i];
    }
}

/* strset_find: the id of p[0..len), or -1. */
static int32_t strset_find(const struct strset *s, const void *p, uint32_t len)
{
    if (!s->ht) return -1;
    uint32_t id = *strset_slot(s, p, len);
    return id ? (int32_t)(id - 1) : -1;
}

static int strset_rehash(struct strset *s, uint32_t slots)
{
    uint32_t *ht = calloc(slots, sizeof *ht);
    if (!ht) return strata_errf(STRATA_ENOMEM, "out of memory for a hash of %u slots", slots);
    free(s->ht);
    s->ht = ht;
    s->ht_mask = slots - 1;
    for (uint32_t id = 0; id < s->n; id++)
        *strset_slot(s, s->pool + s->off[id], s->len[id]) = id + 1;
    return 0;
}

/* strset_add finds p[0..len) or appends it; *id is its id either way. */
static int strset_add(struct strset *s, const void *p, uint32_t len, uint32_t *id)
{
    int rv;
    if (!s->ht && (rv = strset_rehash(s, 1024)) != 0) return rv;
    uint32_t *slot = strset_slot(s, p, len);
    if (*slot) {
        *id = *slot - 1;
        return 0;
    }
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 1024;
        size_t *off = realloc(s->off, cap * sizeof *off);
        if (off) s->off = off;
        uint32_t *ln = realloc(s->len, cap * sizeof *ln);
        if (ln) s->len = ln;
        uint64_t *cnt = realloc(s->count, cap * sizeof *cnt);
        if (cnt) s->count = cnt;
        if (!off || !ln || !cnt)
            return strata_errf(STRATA_ENOMEM, "out of memory for %u strings", cap);
        s->cap = cap;
    }
    if (s->pool_n + len > s->pool_cap) {
        size_t cap = s->pool_cap ? s->pool_cap : 65536;
        while (cap < s->pool_n + len)
            cap *= 2;
        uint8_t *pool = realloc(s->pool, cap);
        if (!pool) return strata_errf(STRATA_ENOMEM, "out of memory for %zu bytes", cap);
        s->pool = pool;
        s->pool_cap = cap;
    }
    memcpy(s->pool + s->pool_n, p, len);
    s->off[s->n] = s->pool_n;
    s->len[s->n] = len;
    s->count[s->n] = 0;
    s->pool_n += len;
    *slot = ++s->n;
    *id = s->n - 1;
    if ((uint64_t)s->n * 2 > s->ht_mask) return strset_rehash(s, (s->ht_mask + 1) * 2);
    return 0;
}

/* ---- the trainer ------------------------------------------------------------------------------
 */

struct bpe_train {
    uint32_t n_vocab, min_count;
    pcre2_code *re;
    pcre2_match_data *md;
    struct strset words;     /* distinct pre-tokens and their counts */
    struct strset toks;      /* learned tokens' bytes; the id is the token id */
    int32_t *mleft, *mright; /* merge i joins tokens mleft[i] and mright[i] */
    uint32_t n_merges, cap_merges;
    bool learned;
    struct bpe_train_stats st;
};

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100 upwards
 * in byte order; the vocabulary lists the printable ones first. */
static bool gpt2_printable(unsigned b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

static unsigned gpt2_cp(unsigned b)
{
    if (gpt2_printable(b)) return b;
    unsigned k = 0;
    for (unsigned i = 0; i < b; i++)
        k += !gpt2_printable(i);
    return 256 + k;
}

/* gpt2_text writes the GPT-2 form of p[0..len) (UTF-8, at most 2 bytes a byte) to out. */
static size_t gpt2_text(const uint8_t *p, uint32_t len, char *out)
{
    size_t n = 0;
    for (uint32_t i = 0; i < len; i++) {
        unsigned cp = gpt2_cp(p[i]);
        if (cp < 0x80) {
            out[n++] = (char)cp;
        } else {
            out[n++] = (char)(0xC0 | (cp >> 6));
            out[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return n;
}

int bpe_train_init(const struct bpe_train_opts *o, struct bpe_train **out)
{
    int rv;
    *out = NULL;
    if (o->n_vocab < BPE_TRAIN_MIN_VOCAB || o->n_vocab > BPE_TRAIN_MAX_VOCAB)
        return strata_errf(STRATA_EINVAL, "a vocabulary of %u tokens: give %u to %u", o->n_vocab,
                           BPE_TRAIN_MIN_VOCAB, BPE_TRAIN_MAX_VOCAB);
    if (o->pre && strcmp(o->pre, "gpt-2") != 0 && strcmp(o->pre, "gpt2") != 0)
        return strata_errf(STRATA_EUNSUPPORTED,
                           "pre-tokenizer '%s': bpe-train knows only 'gpt-2' (alias 'gpt2')",
                           o->pre);
    struct bpe_train *t = calloc(1, sizeof *t);
    if (!t) return strata_errf(STRATA_ENOMEM, "out of memory");
    t->n_vocab = o->n_vocab;
    t->min_count = o->min_count ? o->min_count : 2;
    int err;
    PCRE2_SIZE at;
    t->re = pcre2_compile((PCRE2_SPTR)RE_GPT2, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
    if (!t->re) {
        rv =
            strata_errf(STRATA_EINTERNAL, "the gpt-2 regex does not compile (PCRE2 error %d)", err);
        goto fail;
    }
    /* JIT is an optional speed-up: the interpreter gives the same matches. */
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);
    t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!t->md) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory");
        goto fail;
    }
    /* Byte tokens first, in GPT-2's order: printable bytes, then the rest. */
    for (int pass = 0; pass < 2; pass++)
        for (unsigned b = 0; b < 256; b++)
            if (gpt2_printable(b) == (pass == 0)) {
                uint8_t c = (uint8_t)b;
                uint32_t id;
                if ((rv = strset_add(&t->toks, &c, 1, &id)) != 0) goto fail;
            }
    *out = t;
    return 0;
fail:
    bpe_train_fini(t);
    return rv;
}

static int add_word(struct bpe_train *t, const char *p, size_t len)
{
    if (len > UINT32_MAX)
        return strata_errf(STRATA_EOVERFLOW, "a pre-token of %zu bytes: split the text", len);
    uint32_t id;
    int rv = strset_add(&t->words, p, (uint32_t)len, &id);
    if (rv) return rv;
    t->words.count[id]++;
    t->st.n_pieces++;
    return 0;
}

int bpe_train_add(struct bpe_train *t, const char *text, size_t len)
{
    if (t->learned) return strata_errf(STRATA_ESTATE, "text added after the merges were learned");
    size_t start = 0;
    int rv;
    while (start < len) {
        size_t ms = len, me = len;
        int rc = pcre2_match(t->re, (PCRE2_SPTR)text, len, start, 0, t->md, NULL);
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
            ms = ov[0];
            me = ov[1];
            if (me == ms)
                return strata_errf(STRATA_EINTERNAL, "the gpt-2 regex matched nothing at byte %zu",
                                   ms);
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            return strata_errf(STRATA_EINTERNAL, "PCRE2 error %d at byte %zu", rc, start);
        }
        /* Text no alternative matches (invalid UTF-8) is a piece of its own, as tok does. */
        if (ms > start && (rv = add_word(t, text + start, ms - start)) != 0) return rv;
        if (me > ms && (rv = add_word(t, text + ms, me - ms)) != 0) return rv;
        start = me;
    }
    t->st.n_bytes += len;
    return 0;
}

/* ---- learning ---------------------------------------------------------------------------------
 */

#define NO_WORD UINT32_MAX

struct pair {
    int32_t a, b;  /* left and right token */
    int64_t count; /* occurrences over all words, weighted by word count */
    uint32_t *w;   /* words that held the pair when it was counted (may be stale) */
    uint32_t nw, capw;
    uint32_t last_w; /* last word appended + 1: a word's pairs are counted together */
    uint32_t stamp;  /* merge step that last raised the count */
    bool done;       /* merged, or skipped because its result was already a token */
};

struct heapent {
    int64_t count;
    uint32_t pair;
};

struct learn {
    struct pair *p;
    uint32_t np, capp;
    uint32_t *ht; /* pair index + 1 by (a, b) */
    uint32_t ht_mask;
    struct heapent *heap;
    size_t nh, caph;
    int32_t *sym;   /* every word's current tokens, back to back */
    size_t *soff;   /* per word */
    uint32_t *slen; /* per word */
    uint32_t *wstamp;
    uint32_t *touched;
    size_t nt, capt;
};

static void learn_fini(struct learn *L)
{
    for (uint32_t i = 0; i < L->np; i++)
        free(L->p[i].w);
    free(L->p);
    free(L->ht);
    free(L->heap);
    free(L->sym);
    free(L->soff);
    free(L->slen);
    free(L->wstamp);
    free(L->touched);
}

static uint32_t pair_hash(int32_t a, int32_t b, uint32_t mask)
{
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    return (uint32_t)((k * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static uint32_t *pair_slot(const struct learn *L, int32_t a, int32_t b)
{
    for (uint32_t i = pair_hash(a, b, L->ht_mask);; i = (i + 1) & L->ht_mask) {
        uint32_t k = L->ht[i];
        if (!k || (L->p[k - 1].a == a && L->p[k - 1].b == b)) return &L->ht[i];
    }
}

static int pair_rehash(struct learn *L, uint32_t slots)
{
    uint32_t *ht = calloc(slots, sizeof *ht);
    if (!ht) return strata_errf(STRATA_ENOMEM, "out of memory for %u pair slots", slots);
    free(L->ht);
    L->ht = ht;
    L->ht_mask = slots - 1;
    for (uint32_t i = 0; i < L->np; i++)
        *pair_slot(L, L->p[i].a, L->p[i].b) = i + 1;
    return 0;
}

/* pair_add adds delta to pair (a, b), creating it, and notes word w (NO_WORD: none); *idx gets
 * the pair's index. */
static int pair_add(struct learn *L, int32_t a, int32_t b, int64_t delta, uint32_t w, uint32_t *idx)
{
    int rv;
    uint32_t *slot = pair_slot(L, a, b);
    if (!*slot) {
        if (L->np == L->capp) {
            uint32_t cap = L->capp * 2;
            struct pair *p = realloc(L->p, cap * sizeof *p);
            if (!p) return strata_errf(STRATA_ENOMEM, "out of memory for %u pairs", cap);
            L->p = p;
            L->capp = cap;
        }
        L->p[L->np] = (struct pair){.a = a, .b = b};
        *slot = ++L->np;
        if ((uint64_t)L->np * 2 > L->ht_mask) {
            if ((rv = pair_rehash(L, (L->ht_mask + 1) * 2)) != 0) return rv;
            slot = pair_slot(L, a, b);
        }
    }
    struct pair *p = &L->p[*slot - 1];
    *idx = *slot - 1;
    p->count += delta;
    if (w != NO_WORD && p->last_w != w + 1) {
        if (p->nw == p->capw) {
            uint32_t cap = p->capw ? p->capw * 2 : 4;
            uint32_t *nw = realloc(p->w, cap * sizeof *nw);
            if (!nw) return strata_errf(STRATA_ENOMEM, "out of memory for a word list");
            p->w = nw;
            p->capw = cap;
        }
        p->w[p->nw++] = w;
        p->last_w = w + 1;
    }
    return 0;
}

/* Heap order: more occurrences first, then smaller (left, right) ids, so ties are deterministic. */
static bool heap_before(const struct learn *L, struct heapent x, struct heapent y)
{
    if (x.count != y.count) return x.count > y.count;
    const struct pair *px = &L->p[x.pair], *py = &L->p[y.pair];
    return px->a != py->a ? px->a < py->a : px->b < py->b;
}

static int heap_push(struct learn *L, uint32_t pair)
{
    if (L->nh == L->caph) {
        size_t cap = L->caph ? L->caph * 2 : 4096;
        struct heapent *h = realloc(L->heap, cap * sizeof *h);
        if (!h) return strata_errf(STRATA_ENOMEM, "out of memory for a heap of %zu", cap);
        L->heap = h;
        L->caph = cap;
    }
    struct heapent e = {L->p[pair].count, pair};
    size_t i = L->nh++;
    while (i > 0 && heap_before(L, e, L->heap[(i - 1) / 2])) {
        L->heap[i] = L->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    L->heap[i] = e;
    return 0;
}

static struct heapent heap_pop(struct learn *L)
{
    struct heapent top = L->heap[0], e = L->heap[--L->nh];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= L->nh) break;
        if (c + 1 < L->nh && heap_before(L, L->heap[c + 1], L->heap[c])) c++;
        if (!heap_before(L, L->heap[c], e)) break;
        L->heap[i] = L->heap[c];
        i = c;
    }
    if (L->nh) L->heap[i] = e;
    return top;
}

/* merge_word replaces every (a, b) in word w, left to right, by c and updates the pair counts:
 * the old word's pairs are taken out and the new word's put in; pairs holding c are new and go
 * on the touched list to be pushed on the heap. */
static int merge_word(struct learn *L, uint32_t w, int64_t cnt, int32_t a, int32_t b, int32_t c,
                      uint32_t stamp)
{
    int32_t *s = L->sym + L->soff[w];
    uint32_t n = L->slen[w], j = 0, idx;
    int rv;
    bool found = false;
    for (uint32_t i = 0; i + 1 < n && !found; i++)
        found = s[i] == a && s[i + 1] == b;
    if (!found) return 0;
    for (uint32_t i = 0; i + 1 < n; i++)
        if ((rv = pair_add(L, s[i], s[i + 1], -cnt, NO_WORD, &idx)) != 0) return rv;
    for (uint32_t i = 0; i < n;) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            s[j++] = c;
            i += 2;
        } else {
            s[j++] = s[i++];
        }
    }
    L->slen[w] = n = j;
    for (uint32_t i = 0; i + 1 < n; i++) {
        bool new_pair = s[i] == c || s[i + 1] == c;
        if ((rv = pair_add(L, s[i], s[i + 1], cnt, new_pair ? w : NO_WORD, &idx)) != 0) return rv;
        if (!new_pair || L->p[idx].stamp == stamp) continue;
        L->p[idx].stamp = stamp;
        if (L->nt == L->capt) {
            size_t cap = L->capt ? L->capt * 2 : 1024;
            uint32_t *t = realloc(L->touched, cap * sizeof *t);
            if (!t) return strata_errf(STRATA_ENOMEM, "out of memory");
            L->touched = t;
            L->capt = cap;
        }
        L->touched[L->nt++] = idx;
    }
    return 0;
}

static int learn_init(struct bpe_train *t, struct learn *L)
{
    const struct strset *W = &t->words;
    size_t total = 0;
    for (uint32_t w = 0; w < W->n; w++)
        total += W->len[w];
    L->capp = 4096;
    L->p = malloc(L->capp * sizeof *L->p);
    L->sym = malloc((total ? total : 1) * sizeof *L->sym);
    L->soff = malloc(W->n * sizeof *L->soff);
    L->slen = malloc(W->n * sizeof *L->slen);
    L->wstamp = calloc(W->n, sizeof *L->wstamp);
    if (!L->p || !L->sym || !L->soff || !L->slen || !L->wstamp)
        return strata_errf(STRATA_ENOMEM, "out of memory for %u words of %zu bytes", W->n, total);
    int rv;
    if ((rv = pair_rehash(L, 8192)) != 0) return rv;
    size_t at = 0;
    for (uint32_t w = 0; w < W->n; w++) {
        const uint8_t *p = W->pool + W->off[w];
        L->soff[w] = at;
        L->slen[w] = W->len[w];
        for (uint32_t i = 0; i < W->len[w]; i++)
            L->sym[at + i] = strset_find(&t->toks, p + i, 1);
        for (uint32_t i = 0, idx; i + 1 < W->len[w]; i++)
            if ((rv = pair_add(L, L->sym[at + i], L->sym[at + i + 1], (int64_t)W->count[w], w,
                               &idx)) != 0)
                return rv;
        at += W->len[w];
    }
    for (uint32_t i = 0; i < L->np; i++)
        if (L->p[i].count >= t->min_count && (rv = heap_push(L, i)) != 0) return rv;
    return 0;
}

static int add_merge(struct bpe_train *t, int32_t a, int32_t b)
{
    if (t->n_merges == t->cap_merges) {
        uint32_t cap = t->cap_merges ? t->cap_merges * 2 : 1024;
        int32_t *l = realloc(t->mleft, cap * sizeof *l);
        if (l) t->mleft = l;
        int32_t *r = realloc(t->mright, cap * sizeof *r);
        if (r) t->mright = r;
        if (!l || !r) return strata_errf(STRATA_ENOMEM, "out of memory for %u merges", cap);
        t->cap_merges = cap;
    }
    t->mleft[t->n_merges] = a;
    t->mright[t->n_merges++] = b;
    return 0;
}

int bpe_train_learn(struct bpe_train *t)
{
    if (t->learned) return strata_errf(STRATA_ESTATE, "the merges were already learned");
    if (!t->words.n) return strata_errf(STRATA_ESTATE, "no text to learn from: add some first");
    struct learn L = {0};
    uint8_t *buf = NULL;
    size_t buf_cap = 0;
    int rv;
    if ((rv = learn_init(t, &L)) != 0) goto fail;
    const uint32_t target = t->n_vocab - N_SPECIAL;
    uint32_t stamp = 0;
    while (t->toks.n < target && L.nh) {
        struct heapent top = heap_pop(&L);
        struct pair *p = &L.p[top.pair];
        if (p->done) continue;
        if (top.count != p->count) { /* stale: the count fell since this entry was pushed */
            if (p->count >= t->min_count && (rv = heap_push(&L, top.pair)) != 0) goto fail;
            continue;
        }
        p->done = true;
        const int32_t a = p->a, b = p->b;
        const uint32_t la = t->toks.len[a], lb = t->toks.len[b];
        if (la + lb > buf_cap) {
            buf_cap = 2 * (la + lb);
            uint8_t *nb = realloc(buf, buf_cap);
            if (!nb) {
                rv = strata_errf(STRATA_ENOMEM, "out of memory");
                goto fail;
            }
            buf = nb;
        }
        memcpy(buf, t->toks.pool + t->toks.off[a], la);
        memcpy(buf + la, t->toks.pool + t->toks.off[b], lb);
        if (strset_find(&t->toks, buf, la + lb) >= 0) continue;
        uint32_t c;
        if ((rv = strset_add(&t->toks, buf, la + lb, &c)) != 0 || (rv = add_merge(t, a, b)) != 0)
            goto fail;
        t->st.last_count = (uint64_t)top.count;
        /* The word list is taken out of the pair: merge_word may grow the pair array. */
        uint32_t *wl = p->w, nwl = p->nw;
        p->w = NULL;
        p->nw = p->capw = 0;
        stamp++;
        L.nt = 0;
        for (uint32_t i = 0; i < nwl; i++) {
            uint32_t w = wl[i];
            if (L.wstamp[w] == stamp) continue;
            L.wstamp[w] = stamp;
            if ((rv = merge_word(&L, w, (int64_t)t->words.count[w], a, b, (int32_t)c, stamp))) {
                free(wl);
                goto fail;
            }
        }
        free(wl);
        for (size_t i = 0; i < L.nt; i++)
            if (L.p[L.touched[i]].count >= t->min_count && (rv = heap_push(&L, L.touched[i])))
                goto fail;
    }
    t->st.n_tokens = 0;
    for (uint32_t w = 0; w < t->words.n; w++)
        t->st.n_tokens += t->words.count[w] * L.slen[w];
    t->st.n_merges = t->n_merges;
    t->st.n_pad = target - t->toks.n;
    t->learned = true;
fail:
    free(buf);
    learn_fini(&L);
    return rv;
}

/* ---- output -----------------------------------------------------------------------------------
 */

int bpe_train_write(const struct bpe_train *t, const char *path)
{
    if (!t->learned) return strata_errf(STRATA_ESTATE, "nothing to write: learn the merges first");
    const uint32_t n_learned = t->toks.n, n = t->n_vocab;
    struct gguf_writer *w = NULL;
    char **toks = calloc(n, sizeof *toks), **merges = calloc(t->n_merges + 1, sizeof *merges);
    uint64_t *tlen = calloc(n, sizeof *tlen), *mlen = calloc(t->n_merges + 1, sizeof *mlen);
    int32_t *types = calloc(n, sizeof *types);
    int rv;
    if (!toks || !merges || !tlen || !mlen || !types) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for %u tokens", n);
        goto fail;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len = i < n_learned ? t->toks.len[i] : 32;
        if (!(toks[i] = malloc(2 * (size_t)len + 1))) {
            rv = strata_errf(STRATA_ENOMEM, "out of memory for token %u", i);
            goto fail;
        }
        if (i < n_learned) {
            tlen[i] = gpt2_text(t->toks.pool + t->toks.off[i], len, toks[i]);
            types[i] = TYPE_NORMAL;
        } else if (i < n_learned + N_SPECIAL) {
            tlen[i] = (uint64_t)snprintf(toks[i], 2 * len + 1, "%s", specials[i - n_learned]);
            types[i] = TYPE_CONTROL;
        } else {
            tlen[i] = (uint64_t)snprintf(toks[i], 2 * len + 1, "[PAD%u]", i);
            types[i] = TYPE_UNUSED;
        }
    }
    for (uint32_t m = 0; m < t->n_merges; m++) {
        const int32_t l = t->mleft[m], r = t->mright[m];
        if (!(merges[m] = malloc(tlen[l] + 1 + tlen[r]))) {
            rv = strata_errf(STRATA_ENOMEM, "out of memory for merge %u", m);
            goto fail;
        }
        memcpy(merges[m], toks[l], tlen[l]);
        merges[m][tlen[l]] = ' ';
        memcpy(merges[m] + tlen[l] + 1, toks[r], tlen[r]);
        mlen[m] = tlen[l] + 1 + tlen[r];
    }
    char desc[160];
    snprintf(desc, sizeof desc,
             "byte-level BPE learned by strata bpe-train from %llu bytes (%u merges)",
             (unsigned long long)t->st.n_bytes, t->n_merges);
    if ((rv = gguf_writer_open(path, 0, &w)) != 0 ||
        (rv = gguf_w_str(w, "general.name", "strata bpe-train vocabulary")) != 0 ||
        (rv = gguf_w_str(w, "general.description", desc)) != 0 ||
        (rv = gguf_w_str(w, "tokenizer.ggml.model", "gpt2")) != 0 ||
        (rv = gguf_w_str(w, "tokenizer.ggml.pre", "gpt-2")) != 0 ||
        (rv = gguf_w_arr_str(w, "tokenizer.ggml.tokens", n, (const char *const *)toks, tlen)) !=
            0 ||
        (rv = gguf_w_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, n, types)) != 0 ||
        (rv = gguf_w_arr_str(w, "tokenizer.ggml.merges", t->n_merges, (const char *const *)merges,
                             mlen)) != 0 ||
        (rv = gguf_w_u32(w, "tokenizer.ggml.bos_token_id", n_learned + SP_EOT)) != 0 ||
        (rv = gguf_w_u32(w, "tokenizer.ggml.eos_token_id", n_learned + SP_IM_END)) != 0 ||
        (rv = gguf_w_u32(w, "tokenizer.ggml.padding_token_id", n_learned + SP_EOT)) != 0 ||
        (rv = gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false)) != 0 ||
        (rv = gguf_w_str(w, "tokenizer.chat_template", chat_template)) != 0 ||
        (rv = gguf_writer_begin(w)) != 0)
        goto fail;
    rv = gguf_writer_finish(w);
    w = NULL;
fail:
    gguf_writer_abort(w);
    for (uint32_t i = 0; toks && i < n; i++)
        free(toks[i]);
    for (uint32_t m = 0; merges && m < t->n_merges; m++)
        free(merges[m]);
    free(toks);
    free(merges);
    free(tlen);
    free(mlen);
    free(types);
    return rv;
}

void bpe_train_get_stats(const struct bpe_train *t, struct bpe_train_stats *out)
{
    *out = t->st;
    out->n_words = t->words.n;
}

void bpe_train_fini(struct bpe_train *t)
{
    if (!t) return;
    pcre2_match_data_free(t->md);
    pcre2_code_free(t->re);
    strset_fini(&t->words);
    strset_fini(&t->toks);
    free(t->mleft);
    free(t->mright);
    free(t);
}
