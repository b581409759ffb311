/* gvocab — a model's vocabulary as the bytes a grammar matches (common/grammar): each token's
 * decoded piece, a control token the reserved bytes of a grammar's <[id]>; unknown and unused
 * tokens get none, so no grammar allows them (stop ids are allowed by the sampler once the
 * grammar accepts). Pure; any thread. */
#ifndef STRATA_GVOCAB_H
#define STRATA_GVOCAB_H

#include <stdint.h>

struct gguf_file;
struct grammar_vocab;

/* gvocab_from_gguf builds the grammar vocabulary of the tokenizer in f's metadata, n_vocab ids
 * (the embedding's rows: ids past the tokenizer's get no bytes). *n_text (may be NULL) gets how
 * many tokens have bytes. Errors: the tokenizer's (its detail says so), STRATA_ENOMEM. Caller owns
 * *out (grammar_vocab_fini). */
int gvocab_from_gguf(const struct gguf_file *f, uint32_t n_vocab, struct grammar_vocab **out,
                     uint32_t *n_text);

#endif
