/* match — the matcher: hash-consed parse stacks, interned stack sets as lazily built automaton
 * states, and token masks from a preorder walk of the vocabulary's byte trie. */
#include "common/base/err.h"
#include "common/grammar/grammar_int.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKEN_BYTES 1024       /* longer tokens never match (none in real vocabularies) */
#define MAX_NODES       (1u << 22) /* stack nodes per matcher */
#define MAX_STATES      (1u << 17) /* automaton states per matcher (1 KiB of transitions each) */
#define MAX_MASKS       512        /* cached masks per matcher (n_vocab / 8 bytes each) */
/* stacks one step visits: the suites' grammars visit under 1,024; an enum of N values visits N at
 * its start; ("a"?){1000000} visits a million a byte (seconds each, and a mask walks a step per
 * trie node) */
#define MAX_STEP_STACKS (1u << 16)

/* ---- the vocabulary trie --------------------------------------------------------------------- */

struct grammar_vocab {
    uint32_t n_vocab;
    uint32_t n_nodes;
    uint32_t max_depth;
    uint8_t *byte;   /* (n_nodes) the edge into the node, nodes in preorder */
    uint16_t *depth; /* (n_nodes) 1 for the root's children */
    uint32_t *end;   /* (n_nodes) the node after its subtree */
    uint32_t *tok0;  /* (n_nodes + 1) tokens ending at node i: ids[tok0[i] .. tok0[i + 1]) */
    int32_t *ids;
    char *blob;    /* every token's bytes */
    uint64_t *off; /* (n_vocab + 1) token i is blob[off[i] .. off[i + 1]) */
};

struct tok_key {
    const uint8_t *p;
    uint32_t len;
    int32_t id;
};

static int key_cmp(const void *a, const void *b)
{
    const struct tok_key *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int grammar_vocab_init(uint32_t n_vocab, const char *const *bytes, const uint32_t *lens,
                       struct grammar_vocab **out)
{
    *out = NULL;
    struct grammar_vocab *v = calloc(1, sizeof *v);
    struct tok_key *k = malloc(((size_t)n_vocab + 1) * sizeof *k);
    uint32_t *open = NULL;
    int rv = STRATA_ENOMEM;
    if (!v || !k) goto out;
    v->n_vocab = n_vocab;
    uint64_t total = 0, n_keys = 0;
    for (uint32_t i = 0; i < n_vocab; i++)
        total += lens[i];
    v->off = malloc(((size_t)n_vocab + 1) * sizeof *v->off);
    v->blob = malloc(total + 1);
    if (!v->off || !v->blob) goto out;
    total = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        v->off[i] = total;
        if (lens[i]) memcpy(v->blob + total, bytes[i], lens[i]);
        total += lens[i];
        if (lens[i] && lens[i] <= MAX_TOKEN_BYTES)
            k[n_keys++] = (struct tok_key){(const uint8_t *)bytes[i], lens[i], (int32_t)i};
    }
    v->off[n_vocab] = total;
    qsort(k, n_keys, sizeof *k, key_cmp);
    /* at most one node per token byte */
    uint64_t cap = 1;
    for (uint64_t i = 0; i < n_keys; i++)
        cap += k[i].len;
    v->byte = malloc(cap);
    v->depth = malloc(cap * sizeof *v->depth);
    v->end = malloc(cap * sizeof *v->end);
    v->tok0 = malloc((cap + 1) * sizeof *v->tok0);
    v->ids = malloc((n_keys + 1) * sizeof *v->ids);
    open = malloc((MAX_TOKEN_BYTES + 1) * sizeof *open); /* the path: node at each depth */
    if (!v->byte || !v->depth || !v->end || !v->tok0 || !v->ids || !open) goto out;
    uint32_t n = 0, n_ids = 0, path = 0; /* path: depth of the path's last node */
    for (uint64_t i = 0; i < n_keys; i++) {
        uint32_t lcp = 0;
        if (i) {
            const uint32_t m = k[i].len < k[i - 1].len ? k[i].len : k[i - 1].len;
            while (lcp < m && k[i].p[lcp] == k[i - 1].p[lcp])
                lcp++;
        }
        if (lcp > path) lcp = path;
        for (uint32_t d = lcp; d < k[i].len; d++) {
            v->byte[n] = k[i].p[d];
            v->depth[n] = (uint16_t)(d + 1);
            v->tok0[n] = n_ids;
            open[d + 1] = n;
            n++;
        }
        path = k[i].len;
        if (path > v->max_depth) v->max_depth = path;
        v->ids[n_ids++] = k[i].id; /* sorted order: it ends at the path's last node */
    }
    v->tok0[n] = n_ids;
    v->n_nodes = n;
    /* subtree ends: a node's subtree closes at the next node no deeper than it */
    uint32_t sp = 0;
    for (uint32_t i = 0; i < n; i++) {
        while (sp && v->depth[open[sp - 1]] >= v->depth[i])
            v->end[open[--sp]] = i;
        open[sp++] = i;
    }
    while (sp)
        v->end[open[--sp]] = n;
    *out = v;
    v = NULL;
    rv = 0;
out:
    free(k);
    free(open);
    grammar_vocab_fini(v);
    return rv;
}

void grammar_vocab_fini(struct grammar_vocab *v)
{
    if (!v) return;
    free(v->byte);
    free(v->depth);
    free(v->end);
    free(v->tok0);
    free(v->ids);
    free(v->blob);
    free(v->off);
    free(v);
}

uint32_t grammar_vocab_size(const struct grammar_vocab *v)
{
    return v->n_vocab;
}

/* ---- the matcher ----------------------------------------------------------------------------- */

struct node {
    uint32_t pos;    /* the stack's top: the next symbol */
    uint32_t parent; /* the rest of the stack (node id), 0 for none */
};

/* A state: the set of stacks whose top is a byte set (sorted node ids) and whether the empty
 * stack (the whole sentence matched) is in it. State 0 is the dead state. */
struct state {
    uint32_t off, n; /* elems[off .. off + n) */
    bool accept;
    int32_t *trans; /* (256) next state per byte, -1 not computed yet; NULL until needed */
    uint32_t *mask; /* cached mask, or NULL */
};

/* The automaton of one grammar over one vocabulary: stacks, states, transitions and masks. Shared
 * by the matchers forked from one another (one per request of the same grammar), under mu. */
struct automaton {
    pthread_mutex_t mu;
    uint32_t refs;         /* matchers sharing it */
    struct grammar *owned; /* freed with the automaton (grammar_matcher_adopt), or NULL */
    const struct grammar *g;
    const struct grammar_vocab *v;
    struct node *nodes;
    uint32_t *stamp; /* per node: the expansion generation that last visited it */
    uint32_t n_nodes, cap_nodes, cap_stamp;
    uint32_t *node_tab; /* open addressing: node ids, 0 empty */
    uint32_t node_tab_cap;
    struct state *states;
    uint32_t n_states, cap_states;
    uint32_t *elems;
    uint32_t n_elems, cap_elems;
    uint32_t *state_tab;
    uint32_t state_tab_cap;
    uint32_t gen;
    uint32_t start; /* the state before any byte */
    /* scratch of one expansion */
    uint32_t *out;
    uint32_t n_out, cap_out;
    struct node *work;
    uint32_t n_work, cap_work;
    uint32_t visits; /* stacks this expansion visited, against MAX_STEP_STACKS */
    bool accept;
    int err; /* the first table failure (ENOMEM, ELIMIT); the matcher is unusable after */
    uint32_t n_masks;
    uint32_t *walk; /* (max_depth + 1) states along the trie path */
    /* a lazy grammar's masks before its trigger, by where the free text stands (a matcher's
     * tail and blank) */
    struct lazy_mask {
        uint8_t tail[GRAMMAR_MAX_TRIGGER];
        uint32_t n_tail;
        bool blank;
        uint32_t *mask;
    } * lm;
    uint32_t n_lm;
};

/* A matcher of a lazy grammar starts pending: the text is free until a trigger appears in it, and
 * the state of the free text is its tail (the longest suffix that may begin a trigger) and whether
 * every byte before that tail is a blank (for %trigger-start). */
struct grammar_matcher {
    struct automaton *a;
    uint32_t cur; /* the current state */
    uint64_t masks_built, mask_hits;
    bool pending;
    bool blank;
    uint32_t n_tail;
    uint8_t tail[GRAMMAR_MAX_TRIGGER];
};

#define MAX_LAZY_MASKS 64

static uint64_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

static bool grow(void **p, uint32_t *cap, uint32_t need, size_t size)
{
    if (need <= *cap) return true;
    uint32_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static uint32_t node_hash(uint32_t pos, uint32_t parent)
{
    return (uint32_t)mix((uint64_t)pos << 32 | parent);
}

static bool node_rehash(struct automaton *m, uint32_t cap)
{
    uint32_t *t = calloc(cap, sizeof *t);
    if (!t) return false;
    for (uint32_t i = 1; i < m->n_nodes; i++) {
        uint32_t h = node_hash(m->nodes[i].pos, m->nodes[i].parent) & (cap - 1);
        while (t[h])
            h = (h + 1) & (cap - 1);
        t[h] = i;
    }
    free(m->node_tab);
    m->node_tab = t;
    m->node_tab_cap = cap;
    return true;
}

/* intern returns the node (pos, parent), made on first use; 0 on failure (m->err set). */
static uint32_t intern(struct automaton *m, uint32_t pos, uint32_t parent)
{
    uint32_t h = node_hash(pos, parent) & (m->node_tab_cap - 1);
    for (uint32_t id; (id = m->node_tab[h]) != 0; h = (h + 1) & (m->node_tab_cap - 1))
        if (m->nodes[id].pos == pos && m->nodes[id].parent == parent) return id;
    if (m->n_nodes >= MAX_NODES) {
        m->err = strata_errf(STRATA_ELIMIT,
                             "grammar: more than %u parse stacks: the grammar or "
                             "the output is too deeply nested",
                             MAX_NODES);
        return 0;
    }
    if (!grow((void **)&m->nodes, &m->cap_nodes, m->n_nodes + 1, sizeof *m->nodes) ||
        !grow((void **)&m->stamp, &m->cap_stamp, m->n_nodes + 1, sizeof *m->stamp)) {
        m->err = STRATA_ENOMEM;
        return 0;
    }
    const uint32_t id = m->n_nodes++;
    m->nodes[id] = (struct node){pos, parent};
    m->stamp[id] = 0;
    m->node_tab[h] = id;
    if (2 * m->n_nodes > m->node_tab_cap && !node_rehash(m, 2 * m->node_tab_cap)) {
        m->err = STRATA_ENOMEM;
        return 0;
    }
    return id;
}

static int cmp_u32(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static uint32_t state_hash(const uint32_t *e, uint32_t n, bool accept)
{
    uint64_t h = accept ? 0x9e3779b97f4a7c15ull : 1;
    for (uint32_t i = 0; i < n; i++)
        h = mix(h ^ e[i]);
    return (uint32_t)h;
}

static bool state_rehash(struct automaton *m, uint32_t cap)
{
    uint32_t *t = calloc(cap, sizeof *t);
    if (!t) return false;
    for (uint32_t i = 1; i < m->n_states; i++) {
        const struct state *s = &m->states[i];
        uint32_t h = state_hash(m->elems + s->off, s->n, s->accept) & (cap - 1);
        while (t[h])
            h = (h + 1) & (cap - 1);
        t[h] = i;
    }
    free(m->state_tab);
    m->state_tab = t;
    m->state_tab_cap = cap;
    return true;
}

/* state_of interns the set m->out[0..n_out) (sorted here) with m->accept. 0 for the empty set
 * without accept (dead), and on failure (m->err set). */
static uint32_t state_of(struct automaton *m)
{
    if (m->n_out == 0 && !m->accept) return 0;
    if (m->n_out > 1) qsort(m->out, m->n_out, sizeof *m->out, cmp_u32);
    const uint32_t n = m->n_out;
    uint32_t h = state_hash(m->out, n, m->accept) & (m->state_tab_cap - 1);
    for (uint32_t id; (id = m->state_tab[h]) != 0; h = (h + 1) & (m->state_tab_cap - 1)) {
        const struct state *s = &m->states[id];
        if (s->n == n && s->accept == m->accept &&
            (n == 0 || memcmp(m->elems + s->off, m->out, n * sizeof *m->out) == 0))
            return id;
    }
    if (m->n_states >= MAX_STATES) {
        m->err = strata_errf(STRATA_ELIMIT,
                             "grammar: more than %u matcher states: simplify the "
                             "grammar",
                             MAX_STATES);
        return 0;
    }
    if (!grow((void **)&m->states, &m->cap_states, m->n_states + 1, sizeof *m->states) ||
        !grow((void **)&m->elems, &m->cap_elems, m->n_elems + n, sizeof *m->elems)) {
        m->err = STRATA_ENOMEM;
        return 0;
    }
    const uint32_t id = m->n_states++;
    m->states[id] = (struct state){.off = m->n_elems, .n = n, .accept = m->accept};
    if (n) memcpy(m->elems + m->n_elems, m->out, n * sizeof *m->out);
    m->n_elems += n;
    m->state_tab[h] = id;
    if (2 * m->n_states > m->state_tab_cap && !state_rehash(m, 2 * m->state_tab_cap)) {
        m->err = STRATA_ENOMEM;
        return 0;
    }
    return id;
}

static bool push_work(struct automaton *m, uint32_t pos, uint32_t parent)
{
    if (!grow((void **)&m->work, &m->cap_work, m->n_work + 1, sizeof *m->work)) {
        m->err = STRATA_ENOMEM;
        return false;
    }
    m->work[m->n_work++] = (struct node){pos, parent};
    return true;
}

/* expand closes the work list: every stack is followed through rule entries and ends of
 * alternatives to the byte sets at its top, collected in m->out once each (the generation
 * stamps), the empty stack as m->accept. Iterative: a deep grammar cannot overflow the C stack. */
static void expand(struct automaton *m)
{
    const struct grammar *g = m->g;
    while (m->n_work && !m->err) {
        struct node w = m->work[--m->n_work];
        while (g->sym[w.pos] == SYM_END && w.parent)
            w = m->nodes[w.parent];
        if (g->sym[w.pos] == SYM_END) {
            m->accept = true;
            continue;
        }
        const uint32_t x = intern(m, w.pos, w.parent);
        if (!x || m->stamp[x] == m->gen) continue;
        m->stamp[x] = m->gen;
        if (++m->visits > MAX_STEP_STACKS) {
            m->err = strata_errf(STRATA_ELIMIT,
                                 "grammar: a step through more than %u parse stacks: the grammar "
                                 "is too ambiguous (an optional item repeated, or more than "
                                 "%u alternatives at one place): simplify it",
                                 MAX_STEP_STACKS, MAX_STEP_STACKS);
            return;
        }
        const uint32_t s = g->sym[w.pos];
        if (SYM_KIND(s) == SYM_TERM) {
            if (!grow((void **)&m->out, &m->cap_out, m->n_out + 1, sizeof *m->out)) {
                m->err = STRATA_ENOMEM;
                return;
            }
            m->out[m->n_out++] = x;
            continue;
        }
        const uint32_t r = SYM_VAL(s);
        const uint32_t cont =
            g->sym[w.pos + 1] == SYM_END ? w.parent : intern(m, w.pos + 1, w.parent);
        if (m->err) return;
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
            if (!push_work(m, g->alt_pos[a], cont)) return;
    }
}

static void begin(struct automaton *m)
{
    m->n_out = m->n_work = m->visits = 0;
    m->accept = false;
    if (++m->gen == 0) { /* wrapped: old stamps could read as current */
        memset(m->stamp, 0, (size_t)m->n_nodes * sizeof *m->stamp);
        m->gen = 1;
    }
}

/* step: the state after byte b from state s (0: dead, or m->err). Cached per (state, byte). */
static uint32_t step(struct automaton *m, uint32_t s, uint8_t b)
{
    if (s == 0) return 0;
    struct state *st = &m->states[s];
    if (st->trans && st->trans[b] >= 0) return (uint32_t)st->trans[b];
    if (!st->trans) {
        if (!(st->trans = malloc(256 * sizeof *st->trans))) {
            m->err = STRATA_ENOMEM;
            return 0;
        }
        memset(st->trans, 0xff, 256 * sizeof *st->trans);
    }
    begin(m);
    const struct grammar *g = m->g;
    for (uint32_t i = 0; i < st->n; i++) {
        const struct node nd = m->nodes[m->elems[st->off + i]];
        if (set_has(g->set[SYM_VAL(g->sym[nd.pos])], b) && !push_work(m, nd.pos + 1, nd.parent))
            return 0;
    }
    expand(m);
    if (m->err) return 0;
    const uint32_t next = state_of(m);
    if (m->err) return 0;
    m->states[s].trans[b] = (int32_t)next; /* states may have moved */
    return next;
}

static void automaton_release(struct automaton *m)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    const uint32_t refs = --m->refs;
    pthread_mutex_unlock(&m->mu);
    if (refs) return;
    for (uint32_t i = 0; i < m->n_states; i++) {
        free(m->states[i].trans);
        free(m->states[i].mask);
    }
    free(m->states);
    free(m->nodes);
    free(m->stamp);
    free(m->node_tab);
    free(m->state_tab);
    free(m->elems);
    free(m->out);
    free(m->work);
    free(m->walk);
    for (uint32_t i = 0; i < m->n_lm; i++)
        free(m->lm[i].mask);
    free(m->lm);
    grammar_fini(m->owned);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

int grammar_matcher_init(const struct grammar *g, const struct grammar_vocab *v,
                         struct grammar_matcher **out)
{
    *out = NULL;
    struct grammar_matcher *mt = calloc(1, sizeof *mt);
    struct automaton *m = calloc(1, sizeof *m);
    if (!mt || !m) {
        free(mt);
        free(m);
        return STRATA_ENOMEM;
    }
    pthread_mutex_init(&m->mu, NULL);
    m->refs = 1;
    mt->a = m;
    m->g = g;
    m->v = v;
    m->n_nodes = 1; /* node 0: the empty stack */
    m->n_states = 1;
    if (!grow((void **)&m->nodes, &m->cap_nodes, 1, sizeof *m->nodes) ||
        !grow((void **)&m->stamp, &m->cap_stamp, 1, sizeof *m->stamp) ||
        !grow((void **)&m->states, &m->cap_states, 1, sizeof *m->states) ||
        !(m->node_tab = calloc(1024, sizeof *m->node_tab)) ||
        !(m->state_tab = calloc(1024, sizeof *m->state_tab)) ||
        (v && !(m->walk = malloc(((size_t)v->max_depth + 1) * sizeof *m->walk)))) {
        grammar_matcher_fini(mt);
        return STRATA_ENOMEM;
    }
    m->node_tab_cap = m->state_tab_cap = 1024;
    m->states[0] = (struct state){0};
    begin(m);
    for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
        if (!push_work(m, g->alt_pos[a], 0)) break;
    expand(m);
    if (!m->err) m->start = state_of(m);
    if (m->err) {
        int rv = m->err;
        grammar_matcher_fini(mt);
        return rv;
    }
    mt->cur = m->start;
    mt->pending = g->n_trig > 0;
    mt->blank = true;
    *out = mt;
    return 0;
}

int grammar_matcher_fork(struct grammar_matcher *proto, struct grammar_matcher **out)
{
    *out = NULL;
    struct grammar_matcher *mt = calloc(1, sizeof *mt);
    if (!mt) return STRATA_ENOMEM;
    struct automaton *m = proto->a;
    pthread_mutex_lock(&m->mu);
    m->refs++;
    pthread_mutex_unlock(&m->mu);
    mt->a = m;
    mt->cur = m->start;
    mt->pending = m->g->n_trig > 0;
    mt->blank = true;
    *out = mt;
    return 0;
}

void grammar_matcher_adopt(struct grammar_matcher *m, struct grammar *g)
{
    m->a->owned = g;
}

size_t grammar_matcher_bytes(struct grammar_matcher *mt)
{
    struct automaton *m = mt->a;
    pthread_mutex_lock(&m->mu);
    if (m->err) {
        pthread_mutex_unlock(&m->mu);
        return SIZE_MAX;
    }
    size_t n = (size_t)m->cap_nodes * (sizeof *m->nodes + sizeof *m->stamp) +
               (size_t)m->cap_states * sizeof *m->states + (size_t)m->cap_elems * 4 +
               (size_t)(m->node_tab_cap + m->state_tab_cap) * 4;
    for (uint32_t i = 0; i < m->n_states; i++)
        n += m->states[i].trans ? 1024 : 0;
    if (m->v) n += (size_t)(m->n_masks + m->n_lm) * ((m->v->n_vocab + 31) / 32) * 4;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void grammar_matcher_fini(struct grammar_matcher *m)
{
    if (!m) return;
    automaton_release(m->a);
    free(m);
}

/* ---- lazy grammars: free text until a trigger ------------------------------------------------ */

/* The bytes scanned: a matcher's tail, then new bytes. */
struct scan {
    const uint8_t *tail;
    uint32_t n_tail;
    const uint8_t *p;
    size_t n;
};

static inline uint8_t cat(const struct scan *s, size_t i)
{
    return i < s->n_tail ? s->tail[i] : s->p[i - s->n_tail];
}

static bool is_blank(uint8_t c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* lazy_find: where the first trigger to complete in s starts (the earliest start of those that
 * complete at the same byte), SIZE_MAX when none does. blank: every byte before s is a blank. */
static size_t lazy_find(const struct grammar *g, const struct scan *s, bool blank)
{
    const size_t total = s->n_tail + s->n;
    size_t first_nb = SIZE_MAX; /* the first byte of s that is not a blank */
    for (size_t i = 0; i < total; i++) {
        const uint8_t c = cat(s, i);
        if (first_nb == SIZE_MAX && !is_blank(c)) first_nb = i;
        size_t best = SIZE_MAX;
        for (uint32_t k = 0; k < g->n_trig; k++) {
            const struct grammar_trigger *t = &g->trig[k];
            if (c != t->b[t->len - 1] || i + 1 < t->len) continue;
            const size_t st = i + 1 - t->len;
            if (t->start && !(blank && (first_nb == SIZE_MAX || first_nb >= st))) continue;
            uint32_t j = 0;
            while (j + 1 < t->len && cat(s, st + j) == t->b[j])
                j++;
            if (j + 1 == t->len && st < best) best = st;
        }
        if (best != SIZE_MAX) return best;
    }
    return SIZE_MAX;
}

/* lazy_tail moves mt's free-text state past s (in which no trigger completed). */
static void lazy_tail(struct grammar_matcher *mt, const struct grammar *g, const struct scan *s)
{
    const size_t total = s->n_tail + s->n;
    uint32_t keep = 0;
    for (uint32_t k = 0; k < g->n_trig; k++) /* a tail shorter than the longest trigger */
        if (g->trig[k].len - 1 > keep) keep = g->trig[k].len - 1;
    if (keep > total) keep = (uint32_t)total;
    for (; keep; keep--) {
        const size_t from = total - keep;
        bool prefix = false;
        for (uint32_t k = 0; k < g->n_trig && !prefix; k++) {
            const struct grammar_trigger *t = &g->trig[k];
            if (keep >= t->len) continue;
            uint32_t j = 0;
            while (j < keep && cat(s, from + j) == t->b[j])
                j++;
            prefix = j == keep;
        }
        if (prefix) break;
    }
    const size_t from = total - keep;
    for (size_t i = 0; i < from && mt->blank; i++)
        mt->blank = is_blank(cat(s, i));
    uint8_t t[GRAMMAR_MAX_TRIGGER];
    for (uint32_t j = 0; j < keep; j++)
        t[j] = cat(s, from + j);
    memcpy(mt->tail, t, keep);
    mt->n_tail = keep;
}

/* lazy_start: the state after s[from..) from the grammar's start, 0 when it does not continue it
 * (under mu). */
static uint32_t lazy_start(struct automaton *m, const struct scan *s, size_t from)
{
    const size_t total = s->n_tail + s->n;
    uint32_t q = m->err ? 0 : m->start;
    for (size_t i = from; i < total && q; i++)
        q = step(m, q, cat(s, i));
    return q;
}

/* lazy_feed: the free text goes on with p[0..n); a trigger turns the grammar on, fed from it. */
static int lazy_feed(struct grammar_matcher *mt, const uint8_t *p, size_t n)
{
    struct automaton *m = mt->a;
    const struct scan s = {mt->tail, mt->n_tail, p, n};
    const size_t st = lazy_find(m->g, &s, mt->blank);
    if (st == SIZE_MAX) {
        lazy_tail(mt, m->g, &s);
        return 0;
    }
    pthread_mutex_lock(&m->mu);
    const uint32_t q = lazy_start(m, &s, st);
    const int rv = m->err;
    pthread_mutex_unlock(&m->mu);
    if (rv) return rv;
    if (!q)
        return strata_errf(STRATA_EINVAL,
                           "the text after the trigger does not continue the grammar");
    mt->pending = false;
    mt->cur = q;
    return 0;
}

/* lazy_mask_of: the mask of a pending matcher: every token with bytes, but for those that would
 * complete a trigger and go on in a way the grammar refuses; cached per free-text state (under
 * mu). */
static const uint32_t *lazy_mask_of(struct automaton *m, struct grammar_matcher *mt)
{
    const struct grammar_vocab *v = m->v;
    if (m->err || !v) return NULL;
    for (uint32_t i = 0; i < m->n_lm; i++)
        if (m->lm[i].n_tail == mt->n_tail && m->lm[i].blank == mt->blank &&
            memcmp(m->lm[i].tail, mt->tail, mt->n_tail) == 0) {
            mt->mask_hits++;
            return m->lm[i].mask;
        }
    if (m->n_lm == MAX_LAZY_MASKS) {
        for (uint32_t i = 0; i < m->n_lm; i++)
            free(m->lm[i].mask);
        m->n_lm = 0;
    }
    if (!m->lm && !(m->lm = calloc(MAX_LAZY_MASKS, sizeof *m->lm))) return NULL;
    uint32_t *mask = calloc((v->n_vocab + 31) / 32, sizeof *mask);
    if (!mask) return NULL;
    for (uint32_t id = 0; id < v->n_vocab; id++) {
        const uint64_t len = v->off[id + 1] - v->off[id];
        if (!len || len > MAX_TOKEN_BYTES) continue;
        const uint8_t *tb = (const uint8_t *)v->blob + v->off[id];
        bool may = false; /* a trigger can only complete on its last byte, in the token */
        for (uint32_t k = 0; k < m->g->n_trig && !may; k++)
            may = memchr(tb, m->g->trig[k].b[m->g->trig[k].len - 1], len) != NULL;
        if (!may) {
            mask[id >> 5] |= 1u << (id & 31);
            continue;
        }
        const struct scan s = {mt->tail, mt->n_tail, tb, len};
        const size_t st = lazy_find(m->g, &s, mt->blank);
        if (st != SIZE_MAX && !lazy_start(m, &s, st)) {
            if (m->err) {
                free(mask);
                return NULL;
            }
            continue;
        }
        mask[id >> 5] |= 1u << (id & 31);
    }
    struct lazy_mask *e = &m->lm[m->n_lm++];
    memcpy(e->tail, mt->tail, mt->n_tail);
    e->n_tail = mt->n_tail;
    e->blank = mt->blank;
    e->mask = mask;
    mt->masks_built++;
    return mask;
}

bool grammar_matcher_pending(const struct grammar_matcher *m)
{
    return m->pending;
}

int grammar_matcher_feed(struct grammar_matcher *mt, const void *p, size_t n)
{
    if (mt->pending) return lazy_feed(mt, p, n);
    struct automaton *m = mt->a;
    pthread_mutex_lock(&m->mu);
    uint32_t s = m->err ? 0 : mt->cur;
    for (size_t i = 0; i < n && s; i++)
        s = step(m, s, ((const uint8_t *)p)[i]);
    int rv = m->err;
    pthread_mutex_unlock(&m->mu);
    if (rv) return rv;
    if (!s) return strata_errf(STRATA_EINVAL, "the text does not continue the grammar");
    mt->cur = s;
    return 0;
}

int grammar_matcher_accept_token(struct grammar_matcher *mt, int32_t id)
{
    const struct grammar_vocab *v = mt->a->v;
    if (!v || id < 0 || (uint32_t)id >= v->n_vocab)
        return strata_errf(STRATA_EINVAL, "token %d is outside the grammar's vocabulary", id);
    const uint64_t len = v->off[id + 1] - v->off[id];
    if (len == 0)
        return strata_errf(STRATA_EINVAL, "token %d has no text: the grammar cannot match it", id);
    int rv = grammar_matcher_feed(mt, v->blob + v->off[id], len);
    return rv == STRATA_EINVAL ? strata_errf(rv, "token %d does not continue the grammar", id) : rv;
}

/* A state's fields below are written once, when it is made: read without the lock. The states
 * array may move when another matcher adds one, so it is read under the lock. */
bool grammar_matcher_accepting(const struct grammar_matcher *mt)
{
    if (mt->pending) return true; /* free text may end anywhere */
    struct automaton *m = mt->a;
    pthread_mutex_lock(&m->mu);
    bool r = m->states[mt->cur].accept;
    pthread_mutex_unlock(&m->mu);
    return r;
}

bool grammar_matcher_done(const struct grammar_matcher *mt)
{
    if (mt->pending) return false;
    struct automaton *m = mt->a;
    pthread_mutex_lock(&m->mu);
    bool r = m->states[mt->cur].accept && m->states[mt->cur].n == 0;
    pthread_mutex_unlock(&m->mu);
    return r;
}

/* mask_of returns state cur's mask, walking the trie when it has none (under mu). */
static const uint32_t *mask_of(struct automaton *m, uint32_t cur, struct grammar_matcher *mt)
{
    const struct grammar_vocab *v = m->v;
    if (m->err || !v) return NULL;
    if (m->states[cur].mask) {
        mt->mask_hits++;
        return m->states[cur].mask;
    }
    if (m->n_masks >= MAX_MASKS) { /* forget them all: states recur within a short span */
        for (uint32_t i = 0; i < m->n_states; i++) {
            free(m->states[i].mask);
            m->states[i].mask = NULL;
        }
        m->n_masks = 0;
    }
    uint32_t *mask = calloc((v->n_vocab + 31) / 32, sizeof *mask);
    if (!mask) return NULL;
    uint32_t *walk = m->walk;
    walk[0] = cur;
    for (uint32_t i = 0; i < v->n_nodes;) {
        const uint32_t d = v->depth[i];
        const uint32_t s = step(m, walk[d - 1], v->byte[i]);
        if (m->err) {
            free(mask);
            return NULL;
        }
        if (!s) {
            i = v->end[i];
            continue;
        }
        walk[d] = s;
        for (uint32_t t = v->tok0[i]; t < v->tok0[i + 1]; t++)
            mask[v->ids[t] >> 5] |= 1u << (v->ids[t] & 31);
        i = m->states[s].n ? i + 1 : v->end[i]; /* accept only: nothing may follow */
    }
    m->states[cur].mask = mask;
    m->n_masks++;
    mt->masks_built++;
    return mask;
}

int grammar_matcher_mask_into(struct grammar_matcher *mt, uint32_t *dst)
{
    struct automaton *m = mt->a;
    pthread_mutex_lock(&m->mu);
    const uint32_t *mask = mt->pending ? lazy_mask_of(m, mt) : mask_of(m, mt->cur, mt);
    if (mask) memcpy(dst, mask, ((size_t)m->v->n_vocab + 31) / 32 * sizeof *mask);
    int rv = mask ? 0 : m->err ? m->err : STRATA_ENOMEM;
    pthread_mutex_unlock(&m->mu);
    return rv;
}

void grammar_matcher_stats(const struct grammar_matcher *mt, struct grammar_stats *out)
{
    struct automaton *m = mt->a;
    pthread_mutex_lock(&m->mu);
    *out = (struct grammar_stats){.states = m->n_states,
                                  .stacks = m->n_nodes,
                                  .masks_built = mt->masks_built,
                                  .mask_hits = mt->mask_hits};
    pthread_mutex_unlock(&m->mu);
}
