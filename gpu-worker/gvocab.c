#include "gpu-worker/gvocab.h"
#include "common/base/err.h"
#include "common/grammar/grammar.h"
#include "common/tok/tok.h"

#include <stdlib.h>
#include <string.h>

static int append(struct tok_buf *b, const char *p, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 4096;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return STRATA_ENOMEM;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

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
            ty == TOK_TYPE_UNDEFINED) {
            rv = tok_piece(t, (int32_t)i, 0, &b);
            /* a byte no UTF-8 text has: such a token could spell a control token's bytes */
            for (size_t k = off[i]; rv == 0 && k < b.n; k++)
                if ((unsigned char)b.p[k] >= 0xf8) b.n = off[i];
        } else if (ty == TOK_TYPE_CONTROL && i < GRAMMAR_MAX_TOKEN_ID) {
            char cb[GRAMMAR_TOKEN_BYTES];
            grammar_token_bytes((int32_t)i, cb);
            rv = append(&b, cb, sizeof cb);
        }
        len[i] = (uint32_t)(b.n - off[i]);
        texts += len[i] > 0;
    }
    /* no text at all leaves b.p NULL, and NULL + 0 is undefined in C: every length is 0 then */
    for (uint32_t i = 0; rv == 0 && i < n_vocab; i++)
        ptr[i] = b.p ? b.p + off[i] : "";
    if (rv == 0) rv = grammar_vocab_init(n_vocab, ptr, len, out);
    if (rv == 0 && n_text) *n_text = texts;
    tok_fini(t);
    free(b.p);
    free(off);
    free(ptr);
    free(len);
    return rv;
}
