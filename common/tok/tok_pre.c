/* tok_pre — the BPE pre-tokenizers: per tokenizer.ggml.pre name, the split regexes (facts from
 * llama.cpp's llama-vocab.cpp, which took them from each model's tokenizer.json) and their rules.
 *
 * Splitting follows llama.cpp's unicode_regex_split: the regexes run in order; each one runs over
 * every piece the previous one produced, with the piece as the whole subject (so lookarounds and $
 * see the piece's edges), and both its matches and the unmatched gaps between them become pieces.
 * Where llama.cpp replaces a regex by hand-written code (gpt2, llama3, qwen2, kimi-k2) or runs it
 * on a text whose non-ASCII characters were collapsed to one byte per Unicode category (gpt-4o,
 * tekken), the regex here is written to do what that code does: the vectors come from it.
 */
#include "common/tok/tok_impl.h"

#include "common/base/err.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_GPT2      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                                  \
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"       \
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"            \
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN35                                                                                  \
    CONTRACTIONS                                                                                   \
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"           \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* llama.cpp runs gpt-4o's and tekken's [\p{Lu}...]*[\p{Ll}...]+ as "letters that are not a-z" then
 * "letters that are not A-Z" over collapsed text, where every non-ASCII letter is both. */
#define UPPER "[^\\P{L}a-z]"
#define LOWER "[^\\P{L}A-Z]"
#define RE_GPT4O                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?" UPPER "*" LOWER "+" CONTRACTIONS "?"                                  \
    "|[^\\r\\n\\p{L}\\p{N}]?" UPPER "+" LOWER "*" CONTRACTIONS "?"                                 \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_TEKKEN                                                                                  \
    "[^\\r\\n\\p{L}\\p{N}]?" UPPER "*" LOWER "+|[^\\r\\n\\p{L}\\p{N}]?" UPPER "+" LOWER "*"        \
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* kimi-k2: llama.cpp's hand-written version of Moonshot's pattern: Han runs; letter runs without
 * Han (no case split, no marks); digits by three; the rest as in llama3. */
#define RE_KIMI_K2                                                                                 \
    "\\p{Han}+|[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}\\p{Han}]+" CONTRACTIONS "?"                          \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_DEEPSEEK3                                                                               \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?"           \
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* deepseek-llm's cased-letter list, as code points (the source lists the characters) */
#define DEEPSEEK_LETTERS                                                                           \
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{"    \
    "293}"                                                                                         \
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}"          \
    "\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{"    \
    "52F}"                                                                                         \
    "\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{"     \
    "1CBA}"                                                                                        \
    "\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{"   \
    "1F15}"                                                                                        \
    "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{"    \
    "1F5B}"                                                                                        \
    "\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{"    \
    "1FC4}"                                                                                        \
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{"   \
    "1FF4}"                                                                                        \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{"     \
    "2124}"                                                                                        \
    "\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}"         \
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}"         \
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{"    \
    "A76F}"                                                                                        \
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{"   \
    "FB17}"                                                                                        \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"             \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"         \
    "\\x{1E900}-\\x{1E943}"
#define CJK_HANGUL "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

static const struct tok_pre_def pre_defs[] = {
    {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, false, false},
    {"gpt-2", {RE_GPT2}, false, false},
    {"phi-2", {RE_GPT2}, false, false},
    {"mpt", {RE_GPT2}, false, false},
    {"olmo", {RE_GPT2}, false, false},
    {"jais", {RE_GPT2}, false, false},
    {"llama3", {RE_LLAMA3}, true, true},
    {"llama-v3", {RE_LLAMA3}, true, true},
    {"llama-bpe", {RE_LLAMA3}, true, true},
    {"falcon3", {RE_LLAMA3}, true, true},
    {"pixtral", {RE_LLAMA3}, true, true},
    {"dbrx", {RE_LLAMA3}, false, false},
    {"smaug-bpe", {RE_LLAMA3}, false, false},
    {"chatglm-bpe", {RE_LLAMA3}, false, false},
    {"glm4", {RE_LLAMA3}, false, false},
    {"qwen2", {RE_QWEN2}, false, false},
    {"deepseek-r1-qwen", {RE_QWEN2}, false, false},
    {"stablelm2", {RE_QWEN2}, false, false},
    {"megrez", {RE_QWEN2}, false, false},
    {"qwen35", {RE_QWEN35}, false, false},
    {"deepseek-llm",
     {"[\\r\\n]", "\\s?[" DEEPSEEK_LETTERS "]+",
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
      "\\s+$", CJK_HANGUL, "\\p{N}+"},
     false,
     false},
    {"deepseek-coder",
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", CJK_HANGUL, "\\p{N}"},
     false,
     false},
    {"deepseek-v3",
     {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+", RE_DEEPSEEK3},
     false,
     false},
    {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false},
    {"starcoder", {"\\p{N}", RE_GPT2}, false, false},
    {"refact", {"\\p{N}", RE_GPT2}, false, false},
    {"command-r", {"\\p{N}", RE_GPT2}, false, false},
    {"smollm", {"\\p{N}", RE_GPT2}, false, false},
    {"codeshell", {"\\p{N}", RE_GPT2}, false, false},
    {"exaone", {"\\p{N}", RE_GPT2}, false, false},
    {"gpt-4o", {RE_GPT4O}, false, false},
    {"llama4", {RE_GPT4O}, false, false},
    {"tekken", {RE_TEKKEN}, true, true},
    {"kimi-k2", {RE_KIMI_K2}, false, false},
};

#define N_PRE (sizeof pre_defs / sizeof pre_defs[0])

const struct tok_pre_def *tok_pre_find(const char *name)
{
    for (size_t i = 0; i < N_PRE; i++)
        if (strcmp(pre_defs[i].name, name) == 0) return &pre_defs[i];
    return NULL;
}

static char pre_names[1024];
static pthread_once_t pre_names_once = PTHREAD_ONCE_INIT;

static void fill_pre_names(void)
{
    size_t n = 0;
    for (size_t i = 0; i < N_PRE; i++)
        n += (size_t)snprintf(pre_names + n, sizeof pre_names - n, "%s%s", i ? ", " : "",
                              pre_defs[i].name);
}

const char *tok_pre_names(void)
{
    pthread_once(&pre_names_once, fill_pre_names);
    return pre_names;
}

int tok_pre_compile(struct tok *t)
{
    for (int i = 0; i < TOK_MAX_RE && t->pre->re[i]; i++) {
        int err;
        PCRE2_SIZE at;
        pcre2_code *re =
            pcre2_compile((PCRE2_SPTR)t->pre->re[i], PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY,
                          &err, &at, NULL);
        if (!re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            return strata_errf(STRATA_EINTERNAL, "pre-tokenizer %s regex %d at offset %zu: %s",
                               t->pre->name, i, (size_t)at, (const char *)msg);
        }
        /* JIT is several times faster; without it (a platform PCRE2 lacks) the interpreter runs */
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        t->re[t->n_re++] = re;
    }
    return 0;
}

static int push_piece(struct tok_piece **v, size_t *cap, size_t *n, size_t off, size_t len)
{
    int rv = tok_grow(v, cap, *n + 1, sizeof **v);
    if (rv) return rv;
    (*v)[(*n)++] = (struct tok_piece){off, len};
    return 0;
}

/* split_piece runs re over text[off, off + len) and appends matches and gaps to s->pieces2. */
static int split_piece(const pcre2_code *re, const char *text, size_t off, size_t len,
                       struct tok_scratch *s, size_t *n2)
{
    const PCRE2_SPTR subj = (PCRE2_SPTR)text + off;
    size_t pos = 0, gap = 0;
    int rv;
    while (pos <= len) {
        int rc = pcre2_match(re, subj, len, pos, 0, s->md, s->mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return strata_errf(rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT ||
                                       rc == PCRE2_ERROR_HEAPLIMIT
                                   ? STRATA_ELIMIT
                                   : STRATA_EINTERNAL,
                               "pre-tokenizer regex on a piece of %zu bytes: %s", len,
                               (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t ms = ov[0], me = ov[1];
        if (ms > gap && (rv = push_piece(&s->pieces2, &s->cap_pieces2, n2, off + gap, ms - gap)))
            return rv;
        gap = ms;
        if (me > ms) {
            if ((rv = push_piece(&s->pieces2, &s->cap_pieces2, n2, off + ms, me - ms)) != 0)
                return rv;
            gap = pos = me;
        } else { /* an empty match cuts but makes no piece; step over one character */
            if (ms >= len) break;
            pos = ms + 1;
            while (pos < len && (subj[pos] & 0xC0) == 0x80)
                pos++;
        }
    }
    if (gap < len) return push_piece(&s->pieces2, &s->cap_pieces2, n2, off + gap, len - gap);
    return 0;
}

int tok_pre_split(const struct tok *t, const char *text, size_t len, struct tok_scratch *s)
{
    int rv;
    if (!s->md) {
        s->md = pcre2_match_data_create(16, NULL);
        s->mc = pcre2_match_context_create(NULL);
        /* the default 32 KiB JIT stack overflows on long runs of one class (64 KiB of spaces) */
        s->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
        if (!s->md || !s->mc || !s->js)
            return strata_errf(STRATA_ENOMEM, "tokenizer: out of memory for regex match data");
        pcre2_jit_stack_assign(s->mc, NULL, s->js);
    }
    s->n_pieces = 0;
    if ((rv = push_piece(&s->pieces, &s->cap_pieces, &s->n_pieces, 0, len)) != 0) return rv;
    for (int r = 0; r < t->n_re; r++) {
        size_t n2 = 0;
        for (size_t i = 0; i < s->n_pieces; i++)
            if ((rv = split_piece(t->re[r], text, s->pieces[i].off, s->pieces[i].len, s, &n2)))
                return rv;
        struct tok_piece *tp = s->pieces;
        size_t tc = s->cap_pieces;
        s->pieces = s->pieces2;
        s->cap_pieces = s->cap_pieces2;
        s->pieces2 = tp;
        s->cap_pieces2 = tc;
        s->n_pieces = n2;
    }
    return 0;
}
