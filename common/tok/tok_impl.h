/* tok_impl — what the tokenizer's files (tok.c, tok_bpe.c, tok_spm.c, tok_pre.c, tok_gguf.c) share;
 * not for other modules (they use common/tok/tok.h).
 *
 * Strings are interned: every vocabulary token, and for BPE every merge operand and merge result
 * that is not a token, has a string id. Ids below n_vocab are tokens (so a BPE symbol is one int
 * and a merge is a lookup of an id pair). All tables are built once by tok_new and read-only
 * afterwards.
 */
#ifndef STRATA_TOK_IMPL_H
#define STRATA_TOK_IMPL_H

#include "common/tok/tok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define TOK_MAX_RE   6          /* regexes per pre-tokenizer (deepseek-llm uses 6) */
#define TOK_BYTE_CPS (256 + 68) /* code points of the GPT-2 byte map: U+0000..U+0143 */

struct tok_span {
    uint32_t off, len; /* into tok.pool */
};

struct tok_merge {
    uint64_t key; /* (left string id + 1) << 32 | (right string id + 1); 0 = empty slot */
    uint32_t rank;
    uint32_t result; /* string id of left+right */
};

/* A pre-tokenizer: the regexes applied in turn (each splits every piece the previous one made,
 * keeping unmatched gaps as pieces, as llama.cpp's unicode_regex_split does) and its rules. */
struct tok_pre_def {
    const char *name;
    const char *re[TOK_MAX_RE];
    bool ignore_merges; /* a word that is a whole vocabulary token skips the merges */
    bool add_bos;       /* default for tokenizer.ggml.add_bos_token */
};

struct tok {
    enum tok_model model;
    uint32_t n_vocab;
    uint32_t n_str; /* interned strings: tokens first, then merge-only strings */
    char *pool;
    struct tok_span *str; /* n_str */
    int32_t *types;       /* n_vocab */
    float *scores;        /* n_vocab */
    uint32_t *ht;         /* string hash: string id + 1, 0 = empty; ht_mask + 1 slots */
    uint32_t ht_mask;
    struct tok_merge *mt; /* BPE merges by id pair; mt_mask + 1 slots */
    uint32_t mt_mask;
    int32_t byte_str[256]; /* BPE: string id of byte b's GPT-2 character; SPM: token of byte b */
    int16_t
        cp_byte[TOK_BYTE_CPS]; /* BPE: the byte a code point of the byte map stands for, or -1 */
    int32_t *special; /* ids of CONTROL/USER_DEFINED/UNKNOWN tokens by first byte, longest first */
    uint32_t special_at[257]; /* special[special_at[b] .. special_at[b+1]) start with byte b */
    int32_t bos, eos, unk;
    bool add_bos, add_eos, add_space_prefix;
    bool spm_segments; /* SPM: no token has "▁" inside, so text splits at spaces (tok_spm.c) */
    const struct tok_pre_def *pre;
    pcre2_code *re[TOK_MAX_RE];
    int n_re;
};

static inline uint64_t tok_merge_key(int32_t l, int32_t r)
{
    return ((uint64_t)(uint32_t)(l + 1) << 32) | (uint32_t)(r + 1);
}

/* tok_merge_slot: the first slot to probe for key (a multiplicative hash of the id pair). */
static inline uint32_t tok_merge_slot(uint64_t key, uint32_t mask)
{
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

/* A piece of the input: bytes [off, off + len). */
struct tok_piece {
    size_t off, len;
};

/* Per-call scratch, grown as needed and freed by tok_scratch_fini. */
struct tok_scratch {
    struct tok_piece *pieces, *pieces2;
    size_t n_pieces, cap_pieces, cap_pieces2;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    uint8_t *bytes; /* encoded word / escaped text */
    size_t cap_bytes;
    void *sym; /* symbols of the BPE/SPM merge loop */
    size_t cap_sym;
    void *heap;
    size_t cap_heap;
};

void tok_scratch_fini(struct tok_scratch *s);
/* tok_grow makes *p hold at least n elements of size sz (doubling); STRATA_ENOMEM. */
int tok_grow(void *p, size_t *cap, size_t n, size_t sz);

/* tok_utf8_len: length of the valid UTF-8 sequence at p (1..4); 0 when the n bytes are a valid but
 * incomplete prefix; -1 when p[0] does not start a valid sequence. */
int tok_utf8_len(const uint8_t *p, size_t n);

/* tok_lookup returns the string id of s[0..len) (a token when < n_vocab), or -1. */
int32_t tok_lookup(const struct tok *t, const void *s, size_t len);

int tok_ids_push(struct tok_ids *out, int32_t id);
int tok_buf_put(struct tok_buf *b, const void *p, size_t n);

/* tok_pre_find returns the pre-tokenizer named name, or NULL. */
const struct tok_pre_def *tok_pre_find(const char *name);
/* tok_pre_compile compiles t->pre's regexes into t->re (PCRE2, UTF + UCP, JIT when available). */
int tok_pre_compile(struct tok *t);
/* tok_pre_split splits text[0..len) into pieces (s->pieces, s->n_pieces). */
int tok_pre_split(const struct tok *t, const char *text, size_t len, struct tok_scratch *s);

/* tok_bpe_init builds the GPT-2 byte map entries of t (byte_str). */
void tok_bpe_init(struct tok *t);
/* tok_bpe_byte_char writes byte b's GPT-2 character (UTF-8, 1-2 bytes) to out; returns its length.
 */
int tok_bpe_byte_char(uint8_t b, char out[2]);
/* tok_bpe_word appends the ids of one pre-tokenized word (raw bytes). */
int tok_bpe_word(const struct tok *t, const uint8_t *w, size_t n, struct tok_scratch *s,
                 struct tok_ids *out);
/* tok_bpe_decode appends the bytes a byte-level token text stands for. */
int tok_bpe_decode(const struct tok *t, const char *text, size_t len, struct tok_buf *out);

/* tok_spm_init finds the byte tokens (<0xAB>) of t (byte_str). */
void tok_spm_init(struct tok *t);
/* tok_spm_fragment appends the ids of one text fragment; prefix says to prepend "▁". */
int tok_spm_fragment(const struct tok *t, const char *text, size_t len, bool prefix,
                     struct tok_scratch *s, struct tok_ids *out);
/* tok_spm_decode appends a normal SPM token's text with "▁" as space. */
int tok_spm_decode(const char *text, size_t len, struct tok_buf *out);

#endif
