/* tok_gguf — building a tokenizer from GGUF metadata (tokenizer.ggml.*), defaults as llama.cpp's.
 */
#include "common/tok/tok_impl.h"

#include "common/base/err.h"
#include "common/gguf/gguf.h"

#include <stdlib.h>
#include <string.h>

/* get_id reads an optional token id key; absent keeps *id. */
static int get_id(const struct gguf_file *f, const char *key, uint32_t n_vocab, int32_t *id)
{
    uint32_t v;
    int rv = gguf_get_u32(f, key, &v);
    if (rv == STRATA_ENOENT) return 0;
    if (rv) return rv;
    if (v >= n_vocab)
        return strata_errf(STRATA_EFORMAT, "%s = %u is outside the vocabulary of %u tokens", key, v,
                           n_vocab);
    *id = (int32_t)v;
    return 0;
}

static int get_flag(const struct gguf_file *f, const char *key, bool *b)
{
    int rv = gguf_get_bool(f, key, b);
    return rv == STRATA_ENOENT ? 0 : rv;
}

int tok_from_gguf(const struct gguf_file *f, const char *pre, struct tok **out)
{
    struct tok_config c = {.bos_id = -1, .eos_id = -1, .unk_id = -1};
    const struct gguf_value *tokens, *scores = NULL, *types = NULL, *merges = NULL;
    struct gguf_str model, pre_str;
    char pre_buf[64];
    const char **strs = NULL, **mstrs = NULL;
    size_t *lens = NULL, *mlens = NULL;
    float *sc = NULL;
    int32_t *ty = NULL;
    int rv;

    if ((rv = gguf_get_str(f, "tokenizer.ggml.model", &model)) != 0) goto fail;
    if (model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0) {
        c.model = TOK_MODEL_BPE;
    } else if (model.len == 5 && memcmp(model.ptr, "llama", 5) == 0) {
        c.model = TOK_MODEL_SPM;
    } else {
        rv = strata_errf(STRATA_EUNSUPPORTED,
                         "tokenizer.ggml.model = '%.*s': strata supports 'gpt2' (byte-level BPE) "
                         "and 'llama' (SentencePiece)",
                         (int)(model.len > 64 ? 64 : model.len), model.ptr);
        goto fail;
    }
    if ((rv = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &tokens)) != 0) goto fail;
    uint64_t n = tokens->arr.n;
    if (n == 0 || n > INT32_MAX) {
        rv = strata_errf(STRATA_EFORMAT, "tokenizer.ggml.tokens has %llu entries",
                         (unsigned long long)n);
        goto fail;
    }
    rv = gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_VTYPE_COUNT, &scores);
    if (rv && rv != STRATA_ENOENT) goto fail;
    rv = gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_VTYPE_COUNT, &types);
    if (rv && rv != STRATA_ENOENT) goto fail;
    if ((scores && (scores->arr.n != n || !gguf_vtype_size(scores->arr.type))) ||
        (types && (types->arr.n != n || !gguf_vtype_size(types->arr.type)))) {
        rv = strata_errf(STRATA_EFORMAT,
                         "tokenizer.ggml.scores / token_type: %llu / %llu numbers expected %llu",
                         scores ? (unsigned long long)scores->arr.n : 0ull,
                         types ? (unsigned long long)types->arr.n : 0ull, (unsigned long long)n);
        goto fail;
    }
    strs = malloc(n * sizeof *strs);
    lens = malloc(n * sizeof *lens);
    sc = scores ? malloc(n * sizeof *sc) : NULL;
    ty = types ? malloc(n * sizeof *ty) : NULL;
    if (!strs || !lens || (scores && !sc) || (types && !ty)) {
        rv = strata_errf(STRATA_ENOMEM, "tokenizer: out of memory for %llu tokens",
                         (unsigned long long)n);
        goto fail;
    }
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s = gguf_arr_str(tokens, i);
        strs[i] = s.ptr;
        lens[i] = s.len;
        if (sc) sc[i] = (float)gguf_arr_f64(scores, i);
        if (ty) ty[i] = (int32_t)gguf_arr_i64(types, i);
    }
    c.n_vocab = (uint32_t)n;
    c.tokens = strs;
    c.token_lens = lens;
    c.scores = sc;
    c.types = ty;

    if (c.model == TOK_MODEL_BPE) {
        if ((rv = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_STRING, &merges)) != 0) goto fail;
        if (merges->arr.n > UINT32_MAX) {
            rv = strata_errf(STRATA_EFORMAT, "tokenizer.ggml.merges has %llu entries",
                             (unsigned long long)merges->arr.n);
            goto fail;
        }
        c.n_merges = (uint32_t)merges->arr.n;
        mstrs = malloc((c.n_merges ? c.n_merges : 1) * sizeof *mstrs);
        mlens = malloc((c.n_merges ? c.n_merges : 1) * sizeof *mlens);
        if (!mstrs || !mlens) {
            rv = strata_errf(STRATA_ENOMEM, "tokenizer: out of memory for %u merges", c.n_merges);
            goto fail;
        }
        for (uint32_t i = 0; i < c.n_merges; i++) {
            struct gguf_str s = gguf_arr_str(merges, i);
            mstrs[i] = s.ptr;
            mlens[i] = s.len;
        }
        c.merges = mstrs;
        c.merge_lens = mlens;
        if (!pre) {
            rv = gguf_get_str(f, "tokenizer.ggml.pre", &pre_str);
            if (rv == STRATA_ENOENT) {
                pre = "default";
            } else if (rv) {
                goto fail;
            } else {
                size_t l = pre_str.len < sizeof pre_buf - 1 ? pre_str.len : sizeof pre_buf - 1;
                memcpy(pre_buf, pre_str.ptr, l);
                pre_buf[l] = '\0';
                pre = pre_buf;
            }
        }
        c.pre = pre;
        const struct tok_pre_def *d = tok_pre_find(pre);
        c.add_bos = d && d->add_bos;
    } else {
        /* llama.cpp's SentencePiece defaults: <unk> 0, <s> 1, </s> 2, BOS added, space prefix */
        c.unk_id = 0;
        c.bos_id = n > 1 ? 1 : -1;
        c.eos_id = n > 2 ? 2 : -1;
        c.add_bos = c.bos_id >= 0;
        c.add_space_prefix = true;
    }
    if ((rv = get_id(f, "tokenizer.ggml.bos_token_id", c.n_vocab, &c.bos_id)) != 0 ||
        (rv = get_id(f, "tokenizer.ggml.eos_token_id", c.n_vocab, &c.eos_id)) != 0 ||
        (rv = get_id(f, "tokenizer.ggml.unknown_token_id", c.n_vocab, &c.unk_id)) != 0 ||
        (rv = get_flag(f, "tokenizer.ggml.add_bos_token", &c.add_bos)) != 0 ||
        (rv = get_flag(f, "tokenizer.ggml.add_eos_token", &c.add_eos)) != 0 ||
        (rv = get_flag(f, "tokenizer.ggml.add_space_prefix", &c.add_space_prefix)) != 0)
        goto fail;
    if (c.add_bos && c.bos_id < 0) c.add_bos = false; /* llama.cpp refuses; nothing to add */
    if (c.add_eos && c.eos_id < 0) c.add_eos = false;
    rv = tok_new(&c, out);
fail:
    free(strs);
    free(lens);
    free(sc);
    free(ty);
    free(mstrs);
    free(mlens);
    return rv;
}

int tok_load(const char *path, const char *pre, struct tok **out)
{
    struct gguf_file *f = NULL;
    int rv = gguf_open(path, &f);
    if (rv) return rv;
    rv = tok_from_gguf(f, pre, out);
    gguf_close(f);
    return rv;
}
