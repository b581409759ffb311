/* bpe_train — learns a byte-level BPE vocabulary (GPT-2's format) from text and writes it as a
 * vocabulary-only GGUF that tok_load reads: `strata bpe-train`.
 *
 * Text is split by the gpt-2 pre-tokenizer regex (the one common/tok applies for pre "gpt-2"), so
 * merges never cross a pre-token; each distinct pre-token ("word") is counted once, and merges
 * run over the word table with incremental pair counts and a lazy max-heap, so a megabyte of text
 * learns thousands of merges in well under a second. The most frequent pair is merged first; ties
 * go to the smaller (left, right) token ids, so the same input gives the same bytes. A merge whose
 * result is already a token is skipped: every token then has one merge making it, which is what
 * makes rank-order encoding (llama.cpp's and tok's) reproduce the training segmentation exactly.
 * Token ids: the 256 byte tokens in GPT-2's byte-to-unicode order, the merges' results, then the
 * CONTROL tokens <|endoftext|> (bos, padding), <|im_start|>, <|im_end|> (eos), then [PADn] UNUSED
 * tokens when the text ran out of pairs before the requested size. One thread uses a trainer.
 */
#ifndef STRATA_BPE_TRAIN_H
#define STRATA_BPE_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#define BPE_TRAIN_MIN_VOCAB 260     /* 256 bytes + 3 specials + one merge */
#define BPE_TRAIN_MAX_VOCAB 1048576 /* ids stay far below INT32_MAX */

struct bpe_train_opts {
    uint32_t n_vocab;   /* tokens in the output, specials included */
    const char *pre;    /* pre-tokenizer: "gpt-2" (or its alias "gpt2"); NULL is "gpt-2" */
    uint32_t min_count; /* pairs seen fewer times are never merged; 0 means 2 */
};

struct bpe_train_stats {
    uint64_t n_bytes;    /* text bytes added */
    uint64_t n_pieces;   /* pre-tokens in it */
    uint32_t n_words;    /* distinct pre-tokens */
    uint32_t n_merges;   /* merges learned */
    uint32_t n_pad;      /* [PADn] tokens added because pairs ran out */
    uint64_t n_tokens;   /* tokens the added text encodes to with the learned merges */
    uint64_t last_count; /* occurrences of the last pair merged */
};

struct bpe_train;

/* bpe_train_init checks o and prepares a trainer (compiles the pre-tokenizer regex). STRATA_EINVAL
 * for n_vocab outside [BPE_TRAIN_MIN_VOCAB, BPE_TRAIN_MAX_VOCAB], STRATA_EUNSUPPORTED for another
 * pre-tokenizer, STRATA_ENOMEM, STRATA_EINTERNAL (regex). Caller owns *out (bpe_train_fini). */
int bpe_train_init(const struct bpe_train_opts *o, struct bpe_train **out);

/* bpe_train_add splits text[0..len) into pre-tokens and counts them; call once per file (a file's
 * last pre-token never joins the next file's first). Any bytes (invalid UTF-8 included).
 * STRATA_ESTATE after bpe_train_learn, STRATA_ENOMEM, STRATA_EINTERNAL (regex engine). */
int bpe_train_add(struct bpe_train *t, const char *text, size_t len);

/* bpe_train_learn learns the merges from the words added so far. STRATA_ESTATE when called twice or
 * with no text added, STRATA_ENOMEM. */
int bpe_train_learn(struct bpe_train *t);

/* bpe_train_write writes the vocabulary-only GGUF (tokenizer.ggml.model "gpt2", pre "gpt-2",
 * tokens, token_type, merges, bos/eos/padding ids, add_bos_token false, a chatml
 * tokenizer.chat_template) to path, atomically. STRATA_ESTATE before bpe_train_learn, the GGUF
 * writer's errors. */
int bpe_train_write(const struct bpe_train *t, const char *path);

/* bpe_train_get_stats fills *out with what was added and learned so far. */
void bpe_train_get_stats(const struct bpe_train *t, struct bpe_train_stats *out);

/* bpe_train_fini releases t; NULL is fine. */
void bpe_train_fini(struct bpe_train *t);

#endif
