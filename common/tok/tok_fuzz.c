/* tok_fuzz — tokenizes arbitrary bytes (invalid UTF-8 included) with small vocabularies built in
 * memory, then detokenizes them. The first input byte picks the model, the pre-tokenizer and the
 * flags; the rest is the text. Checked, beyond not crashing:
 *  - byte-level BPE whose vocabulary spells all 256 bytes is lossless: decode(encode(x)) == x, for
 *    any bytes (invalid UTF-8 goes through the byte map like any byte);
 *  - every id is inside the vocabulary;
 *  - the streaming decoder's output is valid UTF-8 and, for valid input, equals the text. */
#include "common/tok/tok_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const pres[] = {"gpt-2",   "default", "llama-bpe", "deepseek-llm",
                                   "kimi-k2", "tekken",  "gpt-4o",    "qwen35"};
#define N_PRES (sizeof pres / sizeof pres[0])

static struct tok *bpe[N_PRES], *spm;

static struct tok *make_bpe(const char *pre)
{
    static char chars[256][3];
    const char *toks[256 + 8];
    int32_t types[256 + 8];
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) {
        tok_bpe_byte_char((uint8_t)b, chars[b]);
        toks[n] = chars[b];
        types[n++] = TOK_TYPE_NORMAL;
    }
    const char *extra[] = {"th", "the", "\xC4\xA0the", "in", "ing", "<|eot|>", "<tool>"};
    const int32_t xt[] = {1, 1, 1, 1, 1, TOK_TYPE_CONTROL, TOK_TYPE_USER_DEFINED};
    for (int i = 0; i < 7; i++) {
        toks[n] = extra[i];
        types[n++] = xt[i];
    }
    const char *merges[] = {"t h", "th e", "\xC4\xA0 the", "i n", "in g"};
    struct tok_config c = {.model = TOK_MODEL_BPE,
                           .n_vocab = n,
                           .tokens = toks,
                           .types = types,
                           .n_merges = 5,
                           .merges = merges,
                           .pre = pre,
                           .bos_id = 261,
                           .eos_id = 261,
                           .unk_id = -1};
    struct tok *t = NULL;
    if (tok_new(&c, &t) != 0) abort();
    return t;
}

static struct tok *make_spm(void)
{
    static char bytes[256][8];
    const char *toks[3 + 256 + 5];
    int32_t types[3 + 256 + 5];
    float scores[3 + 256 + 5] = {0};
    const char *head[] = {"<unk>", "<s>", "</s>"};
    const int32_t ht[] = {TOK_TYPE_UNKNOWN, TOK_TYPE_CONTROL, TOK_TYPE_CONTROL};
    uint32_t n = 0;
    for (int i = 0; i < 3; i++) {
        toks[n] = head[i];
        types[n++] = ht[i];
    }
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[n] = bytes[b];
        types[n++] = TOK_TYPE_BYTE;
    }
    const char *pieces[] = {"\xE2\x96\x81", "\xE2\x96\x81t", "he", "\xE2\x96\x81the", "e"};
    for (int i = 0; i < 5; i++) {
        toks[n] = pieces[i];
        scores[n] = -(float)i;
        types[n++] = TOK_TYPE_NORMAL;
    }
    struct tok_config c = {.model = TOK_MODEL_SPM,
                           .n_vocab = n,
                           .tokens = toks,
                           .types = types,
                           .scores = scores,
                           .bos_id = 1,
                           .eos_id = 2,
                           .unk_id = 0,
                           .add_bos = true,
                           .add_space_prefix = true};
    struct tok *t = NULL;
    if (tok_new(&c, &t) != 0) abort();
    return t;
}

static bool valid_utf8(const char *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        int l = tok_utf8_len((const uint8_t *)p + i, n - i);
        if (l <= 0) return false;
        i += (size_t)l;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (!spm) {
        for (size_t i = 0; i < N_PRES; i++)
            bpe[i] = make_bpe(pres[i]);
        spm = make_spm();
    }
    uint8_t sel = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    bool is_spm = (sel & 0x0F) >= N_PRES;
    const struct tok *t = is_spm ? spm : bpe[sel & 0x0F];
    unsigned flags = ((sel & 0x10) ? TOK_PARSE_SPECIAL : 0) | ((sel & 0x20) ? TOK_ADD_SPECIAL : 0);

    struct tok_ids ids = {0};
    if (tok_encode(t, text, len, flags, &ids) != 0) abort();
    for (size_t i = 0; i < ids.n; i++)
        if (ids.v[i] < 0 || (uint32_t)ids.v[i] >= tok_n_vocab(t)) abort();

    struct tok_buf b = {0};
    if (tok_decode(t, ids.v, ids.n, TOK_DECODE_STRIP_PREFIX | TOK_DECODE_SPECIAL, &b) != 0) abort();
    if (!is_spm && (b.n != len || memcmp(b.p, text, len) != 0)) abort();

    struct tok_stream s;
    struct tok_buf sb = {0};
    tok_stream_init(&s, t, TOK_DECODE_STRIP_PREFIX | TOK_DECODE_SPECIAL);
    for (size_t i = 0; i < ids.n; i++)
        if (tok_stream_feed(&s, ids.v[i], &sb) != 0) abort();
    if (tok_stream_flush(&s, &sb) != 0) abort();
    if (!valid_utf8(sb.p ? sb.p : "", sb.n)) abort();
    if (valid_utf8(b.p, b.n) && (sb.n != b.n || memcmp(sb.p ? sb.p : "", b.p, b.n) != 0)) abort();

    free(sb.p);
    free(b.p);
    free(ids.v);
    return 0;
}
