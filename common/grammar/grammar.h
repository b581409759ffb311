/* grammar — grammars that constrain sampling: GBNF (the dialect llama-server accepts in `grammar`),
 * JSON Schema compiled to GBNF, an incremental matcher over bytes, and the per-step token mask.
 *
 * A GBNF text is parsed and compiled (grammar_parse) into a byte-level pushdown grammar: character
 * classes become UTF-8 byte sequences, repetitions become rules, so a token whose bytes end inside
 * a character or span several symbols is matched as it is. Left recursion is refused. A compiled
 * grammar is immutable and may be shared by threads.
 * A matcher (one per sequence, one thread at a time) holds the set of parse stacks after the bytes
 * fed so far. Stacks are hash-consed, and sets of them are interned as the states of a lazily built
 * automaton whose transitions are cached, so the same state reached twice costs a lookup. The mask
 * of a state — which tokens of a vocabulary may come next — is a walk of the vocabulary's byte trie
 * (grammar_vocab) in preorder that skips the subtree of every dead prefix; masks are cached per
 * state, and shared by the matchers forked from one another (requests of the same grammar). A
 * matcher rebuilt from the tokens already generated (a resumed stream) is in the same state as the
 * one that generated them: the state is a function of the bytes.
 */
#ifndef STRATA_GRAMMAR_H
#define STRATA_GRAMMAR_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRAMMAR_MAX_BYTES (1u << 20) /* longest GBNF text accepted */

struct grammar;

/* grammar_parse compiles the GBNF text gbnf[0..len) (rule `root` is the start). STRATA_EINVAL with
 * a detail naming the line, column and what is wrong (a syntax error, an undefined rule, no root,
 * left recursion), STRATA_ELIMIT for a text or expansion past the limits, STRATA_ENOMEM. Caller
 * owns *out (grammar_fini). */
int grammar_parse(const char *gbnf, size_t len, struct grammar **out);
void grammar_fini(struct grammar *g);

/* grammar_n_rules: rules after compilation (repetitions and classes add some); for tests. */
uint32_t grammar_n_rules(const struct grammar *g);

/* grammar_from_schema writes a GBNF grammar (malloc'd, NUL-terminated) that accepts exactly the
 * JSON texts valid under schema, in the subset: type (one or several), properties, required,
 * additionalProperties (false, or a schema for objects without properties), enum, const, items,
 * prefixItems, minItems/maxItems, minLength/maxLength, anyOf/oneOf, allOf of one schema, local $ref
 * (#/$defs/..., #/definitions/..., #) and the formats date, time, date-time, uuid. Object members
 * come in the order of `properties`; optional ones may be left out. Whitespace between tokens is
 * bounded, as llama.cpp does, so a model cannot loop on it. schema NULL or true: any JSON value.
 * STRATA_EINVAL with a detail naming the schema path for anything else (pattern, an unknown type,
 * a $ref that does not resolve, min above max, a $ref that reaches itself again before any value,
 * nesting past 64, or 256 through $refs), STRATA_ENOMEM. */
int grammar_from_schema(const json_t *schema, char **gbnf);

/* grammar_from_schemas compiles n schemas into one GBNF text (malloc'd) where rule names[i]
 * accepts schemas[i] and the primitive rules are shared; no `root` unless a name is "root". For
 * grammars that embed JSON in other text (tool calls): the caller adds `root`. Names must be GBNF
 * rule names other than rN and the primitives (space, string, char, value, object, array,
 * number, integer, boolean, null, ...): prefer "args-0", "args-1"... Errors as
 * grammar_from_schema. */
int grammar_from_schemas(const json_t *const *schemas, const char *const *names, size_t n,
                         char **gbnf);

/* grammar_json_object: GBNF for any JSON object (response_format json_object). Static. */
const char *grammar_json_object(void);

/* Control tokens (a template's markers, [TOOL_CALLS], <|channel|>) are matched by a GBNF token
 * reference <[id]>, compiled to reserved bytes: 0xFF and the id in three bytes. No UTF-8 text has
 * a byte 0xF8..0xFF, so no character class or literal matches them, and a vocabulary gives them
 * only to its control tokens (a text token with such a byte never matches). */
#define GRAMMAR_TOKEN_BYTES  4
#define GRAMMAR_MAX_TOKEN_ID (1 << 21)

/* grammar_token_bytes: the bytes that stand for control token id (below GRAMMAR_MAX_TOKEN_ID). */
void grammar_token_bytes(int32_t id, char out[GRAMMAR_TOKEN_BYTES]);

/* A vocabulary as bytes: token i is bytes[i][0..lens[i]); a token of length 0 (ends of turn) is
 * never allowed by a mask; a control token a grammar may name has grammar_token_bytes. Built once
 * per model; immutable after, any thread. */
struct grammar_vocab;

int grammar_vocab_init(uint32_t n_vocab, const char *const *bytes, const uint32_t *lens,
                       struct grammar_vocab **out);
void grammar_vocab_fini(struct grammar_vocab *v);
uint32_t grammar_vocab_size(const struct grammar_vocab *v);

struct grammar_matcher;

/* grammar_matcher_init starts a matcher of g over v (both borrowed; they must outlive it) at the
 * start of the grammar. v may be NULL for a matcher fed only bytes. STRATA_ENOMEM, STRATA_ELIMIT (a
 * step through more parse stacks than the matcher allows: a grammar too ambiguous). */
int grammar_matcher_init(const struct grammar *g, const struct grammar_vocab *v,
                         struct grammar_matcher **out);
void grammar_matcher_fini(struct grammar_matcher *m);

/* grammar_matcher_feed advances over bytes p[0..n). Returns 0, or STRATA_EINVAL when the bytes
 * are not a prefix of the language from here (the state is then left as it was before the call),
 * STRATA_ELIMIT when the matcher's tables outgrow their limit, STRATA_ENOMEM. */
int grammar_matcher_feed(struct grammar_matcher *m, const void *p, size_t n);

/* grammar_matcher_accept_token feeds token id's bytes (the matcher needs a vocabulary). A token of
 * length 0 is refused (STRATA_EINVAL). */
int grammar_matcher_accept_token(struct grammar_matcher *m, int32_t id);

/* A lazy grammar (llama-server's grammar_lazy) begins with directive lines naming its triggers:
 *     %trigger "<tool_call>"          a text (literals and token references <[id]>, joined)
 *     %trigger-start "{"              the same, only where every byte before it is a blank
 * Its matcher starts pending: the text is free (every token with bytes is allowed, and the end)
 * until a trigger appears in it; the grammar then holds the text from the trigger's first byte
 * on, so `root` begins with the trigger. While pending, a token that would complete a trigger and
 * go on with bytes the grammar refuses is masked out, so the text after a trigger always
 * continues the grammar. The pending state is a function of the bytes, like the rest.
 * grammar_matcher_pending: no trigger yet. */
bool grammar_matcher_pending(const struct grammar_matcher *m);

/* grammar_matcher_accepting: the bytes so far are a sentence of the grammar. */
bool grammar_matcher_accepting(const struct grammar_matcher *m);

/* grammar_matcher_done: accepting, and no byte can follow. */
bool grammar_matcher_done(const struct grammar_matcher *m);

/* grammar_matcher_mask_into writes the tokens allowed next into dst as a bitset of n_vocab bits
 * (bit i of word i / 32). Tokens that would complete the sentence are in it; stop tokens are not
 * (they have no bytes: the caller allows them when grammar_matcher_accepting). STRATA_ENOMEM, or
 * STRATA_ELIMIT past the table limits (the matcher is unusable then). */
int grammar_matcher_mask_into(struct grammar_matcher *m, uint32_t *dst);

/* grammar_matcher_fork makes a matcher at the start of proto's grammar that shares proto's
 * tables (states, transitions, masks), so a grammar used by many requests walks each state's
 * mask once. Matchers sharing tables may be used from different threads (the tables are under a
 * lock); each one by one thread at a time. STRATA_ENOMEM. */
int grammar_matcher_fork(struct grammar_matcher *proto, struct grammar_matcher **out);

/* grammar_matcher_adopt hands g (the grammar m was made with) to m's tables: it is freed with the
 * last matcher that shares them. */
void grammar_matcher_adopt(struct grammar_matcher *m, struct grammar *g);

/* grammar_matcher_bytes: the memory m's tables hold (for a cache's budget); SIZE_MAX once they
 * failed (a limit or out of memory): make new ones. */
size_t grammar_matcher_bytes(struct grammar_matcher *m);

struct grammar_stats {
    uint32_t states;      /* automaton states interned */
    uint32_t stacks;      /* distinct stack nodes */
    uint64_t masks_built; /* trie walks (and a lazy grammar's vocabulary scans) */
    uint64_t mask_hits;   /* masks answered from the cache */
};
void grammar_matcher_stats(const struct grammar_matcher *m, struct grammar_stats *out);

#endif
