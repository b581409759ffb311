/* tok — the tokenizer: byte-level BPE (GGUF `tokenizer.ggml.model` = "gpt2") with the pre-tokenizer
 * that `tokenizer.ggml.pre` names, SentencePiece BPE ("llama") with scores and byte fallback,
 * special and added tokens, detokenization and an incremental (streaming) decoder.
 *
 * A struct tok owns copies of everything it was built from (vocabulary, merges, compiled regexes),
 * so the GGUF object or arrays it came from may be freed after construction. After construction it
 * is immutable: any number of threads may encode and decode with one tok at once; each call
 * allocates its own scratch. Behaviour follows llama.cpp's llama-vocab (the test vectors come from
 * it).
 *
 * Input is bytes, not necessarily valid UTF-8. The rule for invalid UTF-8: a byte that does not
 * start a valid sequence is a character of its own that no regex class matches; byte-level BPE
 * encodes it through the GPT-2 byte map like any byte (lossless), SentencePiece through its <0xAB>
 * byte token (or the unknown token when the vocabulary has none). Nothing is ever dropped silently
 * except where the vocabulary cannot represent a byte at all.
 */
#ifndef STRATA_TOK_H
#define STRATA_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct tok;

/* Token types as GGUF stores them in tokenizer.ggml.token_type (llama.cpp's values). */
enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,      /* <s>, <|endoftext|>: parsed in text only with TOK_PARSE_SPECIAL */
    TOK_TYPE_USER_DEFINED = 4, /* added tokens: always matched whole, never split */
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6, /* SentencePiece <0xAB> */
};

enum tok_model {
    TOK_MODEL_BPE, /* "gpt2": byte-level BPE, merges by rank */
    TOK_MODEL_SPM, /* "llama": SentencePiece BPE, merges by score, byte fallback */
};

/* tok_config describes a tokenizer held in memory (tests, trainers). Arrays are read during
 * tok_new only. Lengths arrays may be NULL when the strings are NUL-terminated. */
struct tok_config {
    enum tok_model model;
    uint32_t n_vocab;
    const char *const *tokens; /* n_vocab token texts (BPE: in the GPT-2 byte-to-unicode form) */
    const size_t *token_lens;  /* or NULL */
    const float *scores;       /* n_vocab merge scores (SPM), or NULL for all 0 */
    const int32_t *types;      /* n_vocab enum tok_type, or NULL for all NORMAL */
    uint32_t n_merges;         /* BPE: merges "left right", rank = index */
    const char *const *merges;
    const size_t *merge_lens;       /* or NULL */
    const char *pre;                /* BPE pre-tokenizer name; NULL is "default" */
    int32_t bos_id, eos_id, unk_id; /* -1: none */
    bool add_bos, add_eos;          /* added by tok_encode with TOK_ADD_SPECIAL */
    bool add_space_prefix;          /* SPM: prepend "▁" to text that starts a fragment */
};

/* tok_new builds a tokenizer from cfg. STRATA_EINVAL for an inconsistent config (ids out of range,
 * a merge without a space), STRATA_EUNSUPPORTED for an unknown pre-tokenizer name (the detail lists
 * the known ones), STRATA_ENOMEM. Caller owns *out (tok_fini). */
int tok_new(const struct tok_config *cfg, struct tok **out);

/* tok_from_gguf builds the tokenizer stored in a GGUF file's metadata (tokenizer.ggml.*). pre, when
 * not NULL, overrides tokenizer.ggml.pre (the file object is read-only). Does not keep f. Errors as
 * tok_new, plus STRATA_ENOENT / STRATA_EFORMAT naming the missing or malformed key. */
int tok_from_gguf(const struct gguf_file *f, const char *pre, struct tok **out);

/* tok_load opens path, builds its tokenizer with tok_from_gguf and closes the file. */
int tok_load(const char *path, const char *pre, struct tok **out);

/* tok_fini releases t; NULL is fine. */
void tok_fini(struct tok *t);

/* Accessors. tok_token_text returns the stored text (not NUL-terminated) of id, NULL when out of
 * range. tok_pre_name is the pre-tokenizer in use ("" for SPM). */
uint32_t tok_n_vocab(const struct tok *t);
enum tok_model tok_model(const struct tok *t);
const char *tok_pre_name(const struct tok *t);
int32_t tok_bos(const struct tok *t);
int32_t tok_eos(const struct tok *t);
enum tok_type tok_token_type(const struct tok *t, int32_t id);
const char *tok_token_text(const struct tok *t, int32_t id, size_t *len);
/* tok_find returns the id of the token whose text is exactly s[0..len), or -1. */
int32_t tok_find(const struct tok *t, const char *s, size_t len);

/* tok_pre_names returns the known pre-tokenizer names, comma separated (static). */
const char *tok_pre_names(void);

/* A growable array of ids; zero-initialize, free(v) when done. */
struct tok_ids {
    int32_t *v;
    size_t n, cap;
};

/* A growable byte buffer; zero-initialize, free(p) when done. p is NUL-terminated after any
 * successful tok call that appended to it. */
struct tok_buf {
    char *p;
    size_t n, cap;
};

enum {
    TOK_ADD_SPECIAL = 1u << 0,   /* add BOS / EOS as the vocabulary's add_bos / add_eos say */
    TOK_PARSE_SPECIAL = 1u << 1, /* recognise CONTROL token texts (e.g. "<|im_start|>") in text */
};

/* tok_encode appends the ids of text[0..len) to out. USER_DEFINED tokens are always matched whole;
 * CONTROL and UNKNOWN token texts only with TOK_PARSE_SPECIAL (otherwise they are plain text), the
 * longest at a position first. STRATA_ENOMEM, STRATA_EINTERNAL (a regex engine failure). */
int tok_encode(const struct tok *t, const char *text, size_t len, unsigned flags,
               struct tok_ids *out);

enum {
    TOK_DECODE_SPECIAL = 1u << 0,      /* render CONTROL and UNKNOWN tokens as their text */
    TOK_DECODE_STRIP_PREFIX = 1u << 1, /* SPM with add_space_prefix: drop the leading space the
                                          encoder added (ids that start a text) */
};

/* tok_decode appends the text of ids to out: byte-level BPE through the GPT-2 unicode-to-byte map,
 * SPM with "▁" as space and <0xAB> tokens as bytes. The result may be invalid UTF-8 where the ids
 * are (use tok_stream for text shown to a person). STRATA_EINVAL for an id out of range. */
int tok_decode(const struct tok *t, const int32_t *ids, size_t n, unsigned flags,
               struct tok_buf *out);

/* tok_piece appends the bytes of one token (no prefix stripping). STRATA_EINVAL when out of range.
 */
int tok_piece(const struct tok *t, int32_t id, unsigned flags, struct tok_buf *out);

/* tok_stream: incremental decoding for streaming. Feed ids one at a time; it appends only complete,
 * valid UTF-8 and holds back a trailing partial sequence (at most 3 bytes) until the next piece
 * completes it. Bytes that can never form valid UTF-8 become U+FFFD, so the output is always valid
 * UTF-8. tok_stream_flush emits what is held (an incomplete sequence as U+FFFD). One stream per
 * sequence; not shared between threads. */
struct tok_stream {
    const struct tok *t;
    unsigned flags; /* TOK_DECODE_*; STRIP_PREFIX applies to the first non-empty piece */
    bool started;
    uint8_t n_hold;
    uint8_t hold[4];
};

void tok_stream_init(struct tok_stream *s, const struct tok *t, unsigned flags);
int tok_stream_feed(struct tok_stream *s, int32_t id, struct tok_buf *out);
int tok_stream_flush(struct tok_stream *s, struct tok_buf *out);

#endif
