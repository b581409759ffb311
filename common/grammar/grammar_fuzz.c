/* grammar_fuzz — arbitrary bytes as GBNF (first byte even) or as a JSON schema (odd): parsing must
 * fail cleanly or give a grammar whose matcher survives the rest of the input fed as bytes and
 * masks over a small vocabulary; a schema that compiles must give GBNF that parses. */
#include "common/base/err.h"
#include "common/grammar/grammar.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static struct grammar_vocab *vocab(void)
{
    static struct grammar_vocab *v;
    if (v) return v;
    static const char *toks[] = {"",     "{",    "}",    "\"",   "a",   "\":", "1",
                                 " ",    "\xc3", "\xa9", "true", ",\"", "[",   "]",
                                 "null", "-",    "0.5",  "\\n",  "ab",  "\n"};
    uint32_t lens[sizeof toks / sizeof *toks];
    for (size_t i = 0; i < sizeof toks / sizeof *toks; i++)
        lens[i] = (uint32_t)strlen(toks[i]);
    if (grammar_vocab_init(sizeof toks / sizeof *toks, toks, lens, &v)) abort();
    return v;
}

static void exercise(const struct grammar *g, const uint8_t *p, size_t n)
{
    struct grammar_matcher *m;
    if (grammar_matcher_init(g, vocab(), &m)) return;
    for (size_t i = 0; i < n && i < 64; i++) {
        uint32_t mask[1];
        if (grammar_matcher_mask_into(m, mask)) break;
        /* take the input's byte as a token choice among the allowed, else feed it as a byte */
        uint32_t t = p[i] % grammar_vocab_size(vocab());
        if ((mask[t >> 5] >> (t & 31)) & 1) {
            if (grammar_matcher_accept_token(m, (int32_t)t)) abort(); /* the mask allowed it */
        } else if (grammar_matcher_feed(m, p + i, 1) == STRATA_ENOMEM)
            break;
        (void)grammar_matcher_accepting(m);
        (void)grammar_matcher_done(m);
    }
    grammar_matcher_fini(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 1 << 14) return 0;
    struct grammar *g = NULL;
    if (data[0] % 2 == 0) {
        if (grammar_parse((const char *)data + 1, size - 1, &g) == 0) exercise(g, data, size);
        grammar_fini(g);
        return 0;
    }
    json_t *s = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, NULL);
    char *gbnf = NULL;
    if (s && grammar_from_schema(s, &gbnf) == 0) {
        if (grammar_parse(gbnf, strlen(gbnf), &g) != 0 && strata_errdetail()[0] &&
            !strstr(strata_errdetail(), "symbols"))
            abort(); /* the schema compiler wrote GBNF its own parser refuses */
        if (g) exercise(g, data, size);
        grammar_fini(g);
    }
    free(gbnf);
    json_decref(s);
    return 0;
}
