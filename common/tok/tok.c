/* tok — construction, string interning, special-token partition, encode/decode dispatch and the
 * streaming decoder. The merge loops live in tok_bpe.c and tok_spm.c, the regexes in tok_pre.c. */
#include "common/tok/tok_impl.h"

#include "common/base/err.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

int tok_grow(void *p, size_t *cap, size_t n, size_t sz)
{
    void **pp = p;
    if (n <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < n)
        c *= 2;
    void *q = realloc(*pp, c * sz);
    if (!q) return strata_errf(STRATA_ENOMEM, "tokenizer: out of memory growing to %zu items", c);
    *pp = q;
    *cap = c;
    return 0;
}

int tok_ids_push(struct tok_ids *out, int32_t id)
{
    int rv = tok_grow(&out->v, &out->cap, out->n + 1, sizeof *out->v);
    if (rv) return rv;
    out->v[out->n++] = id;
    return 0;
}

int tok_buf_put(struct tok_buf *b, const void *p, size_t n)
{
    int rv = tok_grow(&b->p, &b->cap, b->n + n + 1, 1);
    if (rv) return rv;
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

void tok_scratch_fini(struct tok_scratch *s)
{
    free(s->pieces);
    free(s->pieces2);
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mc);
    pcre2_jit_stack_free(s->js);
    free(s->bytes);
    free(s->sym);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

int tok_utf8_len(const uint8_t *p, size_t n)
{
    uint8_t b = p[0];
    if (b < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte (no overlongs, surrogates) */
    if (b < 0xC2)
        return -1;
    else if (b < 0xE0)
        need = 2;
    else if (b < 0xF0) {
        need = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b < 0xF5) {
        need = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else
        return -1;
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n) return 0;
        uint8_t c = p[k];
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return -1;
    }
    return need;
}

/* ---- string interning ----------------------------------------------------------------------- */

static uint32_t hash_str(const void *s, size_t len)
{
    return (uint32_t)XXH3_64bits(s, len);
}

int32_t tok_lookup(const struct tok *t, const void *s, size_t len)
{
    for (uint32_t h = hash_str(s, len) & t->ht_mask;; h = (h + 1) & t->ht_mask) {
        uint32_t v = t->ht[h];
        if (!v) return -1;
        const struct tok_span *sp = &t->str[v - 1];
        if (sp->len == len && memcmp(t->pool + sp->off, s, len) == 0) return (int32_t)(v - 1);
    }
}

/* Builder state: the pool and the string table grow while strings are interned. */
struct builder {
    struct tok *t;
    size_t pool_len, pool_cap, str_cap;
};

/* intern returns the id of s, adding it when new. replace: a repeated vocabulary text maps to the
 * later id (llama.cpp's token_to_id keeps the last). */
static int intern(struct builder *b, const char *s, size_t len, bool replace, int32_t *id)
{
    struct tok *t = b->t;
    int rv;
    if (len > UINT32_MAX || b->pool_len + len > UINT32_MAX)
        return strata_errf(STRATA_EOVERFLOW, "tokenizer: vocabulary text exceeds 4 GiB");
    uint32_t h = hash_str(s, len) & t->ht_mask;
    for (;; h = (h + 1) & t->ht_mask) {
        uint32_t v = t->ht[h];
        if (!v) break;
        const struct tok_span *sp = &t->str[v - 1];
        if (sp->len == len && memcmp(t->pool + sp->off, s, len) == 0) {
            if (!replace) {
                *id = (int32_t)(v - 1);
                return 0;
            }
            break;
        }
    }
    if ((rv = tok_grow(&t->pool, &b->pool_cap, b->pool_len + len + 1, 1)) != 0) return rv;
    if ((rv = tok_grow(&t->str, &b->str_cap, t->n_str + 1, sizeof *t->str)) != 0) return rv;
    memcpy(t->pool + b->pool_len, s, len);
    t->str[t->n_str] = (struct tok_span){(uint32_t)b->pool_len, (uint32_t)len};
    b->pool_len += len;
    t->ht[h] = t->n_str + 1;
    *id = (int32_t)t->n_str++;
    return 0;
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t c = 64;
    while (c < n)
        c *= 2;
    return c;
}

static int add_merge(struct builder *b, const char *m, size_t len, uint32_t rank)
{
    struct tok *t = b->t;
    /* llama.cpp splits at the first space after position 0, so a merge may start with a space */
    const char *sp = len > 1 ? memchr(m + 1, ' ', len - 1) : NULL;
    if (!sp)
        return strata_errf(STRATA_EINVAL,
                           "tokenizer: merge %u \"%.*s\" has no space: merges are \"left right\"",
                           rank, (int)(len > 64 ? 64 : len), m);
    size_t ll = (size_t)(sp - m), rl = len - ll - 1;
    int32_t l, r, res;
    int rv;
    if ((rv = intern(b, m, ll, false, &l)) != 0) return rv;
    if ((rv = intern(b, sp + 1, rl, false, &r)) != 0) return rv;
    char stack[256];
    char *cat = ll + rl <= sizeof stack ? stack : malloc(ll + rl);
    if (!cat) return strata_errf(STRATA_ENOMEM, "tokenizer: out of memory");
    memcpy(cat, m, ll);
    memcpy(cat + ll, sp + 1, rl);
    rv = intern(b, cat, ll + rl, false, &res);
    if (cat != stack) free(cat);
    if (rv) return rv;
    uint64_t key = tok_merge_key(l, r);
    uint32_t h = tok_merge_slot(key, t->mt_mask);
    while (t->mt[h].key && t->mt[h].key != key)
        h = (h + 1) & t->mt_mask;
    if (!t->mt[h].key) /* the first (lowest) rank of a repeated merge wins, as in llama.cpp */
        t->mt[h] = (struct tok_merge){key, rank, (uint32_t)res};
    return 0;
}

static int cmp_special(const void *a, const void *b, void *ctx)
{
    const struct tok *t = ctx;
    const struct tok_span *x = &t->str[*(const int32_t *)a], *y = &t->str[*(const int32_t *)b];
    uint8_t fx = (uint8_t)t->pool[x->off], fy = (uint8_t)t->pool[y->off];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1; /* longest first */
    return *(const int32_t *)a < *(const int32_t *)b ? -1 : 1;
}

static int build_special(struct tok *t)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        int32_t ty = t->types[i];
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN) &&
            t->str[i].len > 0)
            n++;
    }
    t->special = malloc((n ? n : 1) * sizeof *t->special);
    if (!t->special) return strata_errf(STRATA_ENOMEM, "tokenizer: out of memory");
    n = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        int32_t ty = t->types[i];
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN) &&
            t->str[i].len > 0 &&
            tok_lookup(t, t->pool + t->str[i].off, t->str[i].len) == (int32_t)i)
            t->special[n++] = (int32_t)i;
    }
    qsort_r(t->special, n, sizeof *t->special, cmp_special, t);
    uint32_t k = 0;
    for (int b = 0; b < 256; b++) {
        t->special_at[b] = k;
        while (k < n && (uint8_t)t->pool[t->str[t->special[k]].off] == b)
            k++;
    }
    t->special_at[256] = n;
    return 0;
}

static bool id_ok(int32_t id, uint32_t n)
{
    return id >= -1 && (id < 0 || (uint32_t)id < n);
}

int tok_new(const struct tok_config *cfg, struct tok **out)
{
    int rv;
    struct tok *t = NULL;
    if (!cfg->n_vocab || !cfg->tokens)
        return strata_errf(STRATA_EINVAL, "tokenizer: empty vocabulary");
    if (!id_ok(cfg->bos_id, cfg->n_vocab) || !id_ok(cfg->eos_id, cfg->n_vocab) ||
        !id_ok(cfg->unk_id, cfg->n_vocab))
        return strata_errf(
            STRATA_EINVAL,
            "tokenizer: bos %d / eos %d / unk %d outside the vocabulary of %u tokens", cfg->bos_id,
            cfg->eos_id, cfg->unk_id, cfg->n_vocab);
    if ((cfg->add_bos && cfg->bos_id < 0) || (cfg->add_eos && cfg->eos_id < 0))
        return strata_errf(STRATA_EINVAL, "tokenizer: add_bos/add_eos set but the token id is not");
    const struct tok_pre_def *pre = NULL;
    if (cfg->model == TOK_MODEL_BPE) {
        const char *name = cfg->pre ? cfg->pre : "default";
        if (!(pre = tok_pre_find(name)))
            return strata_errf(STRATA_EUNSUPPORTED,
                               "unknown pre-tokenizer '%s' (tokenizer.ggml.pre); known: %s; "
                               "pass one of them to override",
                               name, tok_pre_names());
    }
    if (!(t = calloc(1, sizeof *t))) return strata_errf(STRATA_ENOMEM, "tokenizer: out of memory");
    t->model = cfg->model;
    t->n_vocab = cfg->n_vocab;
    t->bos = cfg->bos_id;
    t->eos = cfg->eos_id;
    t->unk = cfg->unk_id;
    t->add_bos = cfg->add_bos;
    t->add_eos = cfg->add_eos;
    t->add_space_prefix = cfg->add_space_prefix;
    t->pre = pre;

    uint64_t n_merges = cfg->model == TOK_MODEL_BPE ? cfg->n_merges : 0;
    t->ht_mask = pow2_at_least(2 * ((uint64_t)cfg->n_vocab + 3 * n_merges)) - 1;
    t->mt_mask = pow2_at_least(2 * n_merges) - 1;
    t->ht = calloc((size_t)t->ht_mask + 1, sizeof *t->ht);
    t->mt = calloc((size_t)t->mt_mask + 1, sizeof *t->mt);
    t->types = malloc(cfg->n_vocab * sizeof *t->types);
    t->scores = malloc(cfg->n_vocab * sizeof *t->scores);
    if (!t->ht || !t->mt || !t->types || !t->scores) {
        rv = strata_errf(STRATA_ENOMEM, "tokenizer: out of memory for %u tokens", cfg->n_vocab);
        goto fail;
    }
    struct builder b = {.t = t};
    for (uint32_t i = 0; i < cfg->n_vocab; i++) {
        const char *s = cfg->tokens[i];
        if (!s) {
            rv = strata_errf(STRATA_EINVAL, "tokenizer: token %u has no text", i);
            goto fail;
        }
        size_t len = cfg->token_lens ? cfg->token_lens[i] : strlen(s);
        int32_t id;
        if ((rv = intern(&b, s, len, true, &id)) != 0) goto fail;
        t->types[i] = cfg->types ? cfg->types[i] : TOK_TYPE_NORMAL;
        t->scores[i] = cfg->scores ? cfg->scores[i] : 0.0f;
    }
    for (uint32_t i = 0; i < n_merges; i++) {
        const char *m = cfg->merges[i];
        if ((rv = add_merge(&b, m, cfg->merge_lens ? cfg->merge_lens[i] : strlen(m), i)) != 0)
            goto fail;
    }
    if ((rv = build_special(t)) != 0) goto fail;
    if (t->model == TOK_MODEL_BPE) {
        tok_bpe_init(t);
        if ((rv = tok_pre_compile(t)) != 0) goto fail;
    } else {
        tok_spm_init(t);
    }
    *out = t;
    return 0;
fail:
    tok_fini(t);
    return rv;
}

void tok_fini(struct tok *t)
{
    if (!t) return;
    for (int i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
    free(t->pool);
    free(t->str);
    free(t->types);
    free(t->scores);
    free(t->ht);
    free(t->mt);
    free(t->special);
    free(t);
}

uint32_t tok_n_vocab(const struct tok *t)
{
    return t->n_vocab;
}

enum tok_model tok_model(const struct tok *t)
{
    return t->model;
}

const char *tok_pre_name(const struct tok *t)
{
    return t->pre ? t->pre->name : "";
}

int32_t tok_bos(const struct tok *t)
{
    return t->bos;
}

int32_t tok_eos(const struct tok *t)
{
    return t->eos;
}

enum tok_type tok_token_type(const struct tok *t, int32_t id)
{
    return id >= 0 && (uint32_t)id < t->n_vocab ? (enum tok_type)t->types[id] : TOK_TYPE_UNDEFINED;
}

const char *tok_token_text(const struct tok *t, int32_t id, size_t *len)
{
    if (id < 0 || (uint32_t)id >= t->n_vocab) return NULL;
    *len = t->str[id].len;
    return t->pool + t->str[id].off;
}

int32_t tok_find(const struct tok *t, const char *s, size_t len)
{
    int32_t id = tok_lookup(t, s, len);
    return id >= 0 && (uint32_t)id < t->n_vocab ? id : -1;
}

/* ---- encode --------------------------------------------------------------------------------- */

static int encode_fragment(const struct tok *t, const char *text, size_t len, bool prev_special,
                           struct tok_scratch *s, struct tok_ids *out)
{
    if (len == 0) return 0;
    if (t->model == TOK_MODEL_SPM)
        return tok_spm_fragment(t, text, len, t->add_space_prefix && prev_special, s, out);
    int rv = tok_pre_split(t, text, len, s);
    for (size_t i = 0; rv == 0 && i < s->n_pieces; i++)
        rv = tok_bpe_word(t, (const uint8_t *)text + s->pieces[i].off, s->pieces[i].len, s, out);
    return rv;
}

/* match_special returns the longest special token allowed by flags at text[0..len), or -1. */
static int32_t match_special(const struct tok *t, const char *text, size_t len, unsigned flags)
{
    uint8_t c = (uint8_t)text[0];
    for (uint32_t k = t->special_at[c]; k < t->special_at[c + 1]; k++) {
        int32_t id = t->special[k];
        int32_t ty = t->types[id];
        if (ty != TOK_TYPE_USER_DEFINED && !(flags & TOK_PARSE_SPECIAL)) continue;
        const struct tok_span *sp = &t->str[id];
        if (sp->len <= len && memcmp(t->pool + sp->off, text, sp->len) == 0) return id;
    }
    return -1;
}

int tok_encode(const struct tok *t, const char *text, size_t len, unsigned flags,
               struct tok_ids *out)
{
    struct tok_scratch s = {0};
    int rv = 0;
    if ((flags & TOK_ADD_SPECIAL) && t->add_bos && (rv = tok_ids_push(out, t->bos)) != 0) goto done;
    size_t frag = 0, i = 0;
    bool prev_special = true; /* SPM: the text start counts as after a special token */
    while (i < len) {
        uint8_t c = (uint8_t)text[i];
        int32_t id = t->special_at[c] == t->special_at[c + 1]
                         ? -1
                         : match_special(t, text + i, len - i, flags);
        if (id < 0) {
            i++;
            continue;
        }
        if (i > frag) {
            if ((rv = encode_fragment(t, text + frag, i - frag, prev_special, &s, out)) != 0)
                goto done;
        }
        if ((rv = tok_ids_push(out, id)) != 0) goto done;
        prev_special = true;
        i += t->str[id].len;
        frag = i;
    }
    if (len > frag &&
        (rv = encode_fragment(t, text + frag, len - frag, prev_special, &s, out)) != 0)
        goto done;
    if ((flags & TOK_ADD_SPECIAL) && t->add_eos) rv = tok_ids_push(out, t->eos);
done:
    tok_scratch_fini(&s);
    return rv;
}

/* ---- decode --------------------------------------------------------------------------------- */

/* byte_token_value parses "<0xAB>"; -1 when text is not of that form. */
static int byte_token_value(const char *p, size_t n)
{
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = p[k];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

int tok_piece(const struct tok *t, int32_t id, unsigned flags, struct tok_buf *out)
{
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return strata_errf(STRATA_EINVAL, "token id %d is outside the vocabulary of %u tokens", id,
                           t->n_vocab);
    const char *p = t->pool + t->str[id].off;
    size_t n = t->str[id].len;
    switch (t->types[id]) {
    case TOK_TYPE_CONTROL:
    case TOK_TYPE_UNKNOWN:
        return (flags & TOK_DECODE_SPECIAL) ? tok_buf_put(out, p, n) : tok_buf_put(out, "", 0);
    case TOK_TYPE_USER_DEFINED:
        return tok_buf_put(out, p, n);
    case TOK_TYPE_UNUSED:
        return tok_buf_put(out, "", 0);
    case TOK_TYPE_BYTE: {
        int v = byte_token_value(p, n);
        if (v >= 0) {
            char c = (char)v;
            return tok_buf_put(out, &c, 1);
        }
        return tok_buf_put(out, p, n);
    }
    default:
        return t->model == TOK_MODEL_BPE ? tok_bpe_decode(t, p, n, out) : tok_spm_decode(p, n, out);
    }
}

static bool strips_prefix(const struct tok *t, unsigned flags)
{
    return (flags & TOK_DECODE_STRIP_PREFIX) && t->model == TOK_MODEL_SPM && t->add_space_prefix;
}

int tok_decode(const struct tok *t, const int32_t *ids, size_t n, unsigned flags,
               struct tok_buf *out)
{
    size_t start = out->n;
    bool strip = strips_prefix(t, flags);
    int rv = tok_buf_put(out, "", 0);
    for (size_t i = 0; rv == 0 && i < n; i++) {
        rv = tok_piece(t, ids[i], flags, out);
        if (rv == 0 && strip && out->n > start) {
            if (out->p[start] == ' ') {
                memmove(out->p + start, out->p + start + 1, out->n - start);
                out->n--;
            }
            strip = false;
        }
    }
    return rv;
}

/* ---- streaming decoder ---------------------------------------------------------------------- */

static const char replacement[] = "\xEF\xBF\xBD"; /* U+FFFD */

void tok_stream_init(struct tok_stream *s, const struct tok *t, unsigned flags)
{
    memset(s, 0, sizeof *s);
    s->t = t;
    s->flags = flags;
}

int tok_stream_feed(struct tok_stream *s, int32_t id, struct tok_buf *out)
{
    struct tok_buf tmp = {0};
    int rv = tok_buf_put(&tmp, s->hold, s->n_hold);
    size_t piece_at = tmp.n;
    if (rv == 0) rv = tok_piece(s->t, id, s->flags, &tmp);
    if (rv) goto done;
    size_t i = 0;
    if (!s->started && tmp.n > piece_at) {
        s->started = true;
        if (strips_prefix(s->t, s->flags) && tmp.p[piece_at] == ' ') {
            memmove(tmp.p + piece_at, tmp.p + piece_at + 1, tmp.n - piece_at);
            tmp.n--;
        }
    }
    s->n_hold = 0;
    rv = tok_buf_put(out, "", 0);
    while (rv == 0 && i < tmp.n) {
        int l = tok_utf8_len((const uint8_t *)tmp.p + i, tmp.n - i);
        if (l > 0) {
            rv = tok_buf_put(out, tmp.p + i, (size_t)l);
            i += (size_t)l;
        } else if (l == 0) { /* a valid start that the next piece may complete: hold it */
            s->n_hold = (uint8_t)(tmp.n - i);
            memcpy(s->hold, tmp.p + i, s->n_hold);
            break;
        } else {
            rv = tok_buf_put(out, replacement, 3);
            i++;
        }
    }
done:
    free(tmp.p);
    return rv;
}

int tok_stream_flush(struct tok_stream *s, struct tok_buf *out)
{
    int rv = s->n_hold ? tok_buf_put(out, replacement, 3) : tok_buf_put(out, "", 0);
    s->n_hold = 0;
    return rv;
}
