#include "gpu-worker/gvocab.h"
#include "common/base/err.h"
#include "common/grammar/grammar.h"
#include "common/tok/tok.h"

#include <stdlib.h>

int gvocab_from_gguf(const struct gguf_file *f, uint32_t n_vocab, struct grammar_vocab **out,
                     uint32_t *n_text)
{
    *out = NULL;
    struct tok *t = NULL;
    struct tok_buf b = {0};
    uint64_t *off = malloc(((size_t)n_vocab + 1) * sizeof *off);
    const char **ptr = malloc(((size_t)n_vocab + 1) * sizeof *ptr);
    uint32_t *len = calloc((size_t)n_vocab + 1, sizeof *len), texts = 0;
    int rv = off && ptr && len ? 0 : STRATA_ENOMEM;
    if (rv == 0 && (rv = tok_from_gguf(f, NULL, &t)) != 0)
        rv = strata_errf(rv, "a grammar needs the model's tokenizer: %s", strata_errdetail());
    for (uint32_t i = 0; rv == 0 && i < n_vocab; i++) {
        off[i] = b.n;
        const enum tok_type ty =
            i < tok_n_vocab(t) ? tok_token_type(t, (int32_t)i) : TOK_TYPE_UNUSED;
        if (ty == TOK_TYPE_NORMAL || ty == TOK_TYPE_BYTE || ty == TOK_TYPE_USER_DEFINED ||
            ty == TOK_TYPE_UNDEFINED)
            rv = tok_piece(t, (int32_t)i, 0, &b);
        len[i] = (uint32_t)(b.n - off[i]);
        texts += len[i] > 0;
    }
    for (uint32_t i = 0; rv == 0 && i < n_vocab; i++)
        ptr[i] = b.p + off[i];
    if (rv == 0) rv = grammar_vocab_init(n_vocab, ptr, len, out);
    if (rv == 0 && n_text) *n_text = texts;
    tok_fini(t);
    free(b.p);
    free(off);
    free(ptr);
    free(len);
    return rv;
}
