/* grammar_int — the compiled grammar shared by the parser (gbnf.c) and the matcher (match.c).
 *
 * Symbols are uint32: SYM_END closes an alternative, SYM_TERM | s matches one byte of set s,
 * SYM_RULE | r expands rule r. Rule r's alternatives start at sym[alt_pos[a]] for a in
 * rule_alt[r] .. rule_alt[r + 1) and each runs to its SYM_END. Immutable once compiled.
 */
#ifndef STRATA_GRAMMAR_INT_H
#define STRATA_GRAMMAR_INT_H

#include "common/grammar/grammar.h"

#define SYM_END          0u
#define SYM_TERM         0x40000000u
#define SYM_RULE         0x80000000u
#define SYM_KIND(s)      ((s)&0xc0000000u)
#define SYM_VAL(s)       ((s)&0x3fffffffu)
#define GRAMMAR_MAX_SYMS (1u << 22) /* symbols after expanding repetitions */

/* A lazy grammar's trigger: bytes whose first appearance in the output turns the grammar on,
 * matched from the trigger's first byte (%trigger), or only where every byte before it is a blank
 * (%trigger-start). */
#define GRAMMAR_MAX_TRIGGER  128 /* bytes of one trigger */
#define GRAMMAR_MAX_TRIGGERS 16

struct grammar_trigger {
    uint8_t b[GRAMMAR_MAX_TRIGGER];
    uint32_t len;
    bool start;
};

struct grammar {
    struct grammar_trigger trig[GRAMMAR_MAX_TRIGGERS];
    uint32_t n_trig; /* 0: not lazy */
    uint32_t *sym;
    uint32_t n_sym;
    uint32_t *alt_pos;  /* (n_alt) */
    uint32_t *rule_alt; /* (n_rules + 1) */
    uint32_t n_rules;
    uint64_t (*set)[4]; /* (n_set) byte sets, bit b of word b / 64 */
    uint32_t n_set;
    uint32_t root;
};

static inline bool set_has(const uint64_t *s, unsigned b)
{
    return (s[b >> 6] >> (b & 63)) & 1;
}

#endif
