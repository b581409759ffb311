#include "tools/trace.h"

#include "common/base/err.h"
#include "gpu-worker/backend.h"
#include "gpu-worker/kv.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int trace_init(struct trace *t, uint32_t n_layer, uint32_t n_expert, uint32_t n_used)
{
    memset(t, 0, sizeof *t);
    if (!n_layer || !n_expert || !n_used || n_expert > UINT16_MAX || n_used > n_expert)
        return strata_errf(STRATA_EINVAL,
                           "a trace of %u layers, %u experts, %u per token: need at least one "
                           "of each, at most 65535 experts and no more used than there are",
                           n_layer, n_expert, n_used);
    t->n_layer = n_layer;
    t->n_expert = n_expert;
    t->n_used = n_used;
    return 0;
}

void trace_fini(struct trace *t)
{
    free(t->sel);
    t->sel = NULL;
    t->n_tokens = t->cap = 0;
}

int trace_push(struct trace *t, const uint16_t *sel)
{
    const size_t per = (size_t)t->n_layer * t->n_used;
    for (uint32_t l = 0; l < t->n_layer; l++)
        for (uint32_t i = 0; i < t->n_used; i++) {
            uint16_t e = sel[l * t->n_used + i];
            if (e >= t->n_expert || (i && e <= sel[l * t->n_used + i - 1]))
                return strata_errf(STRATA_EINVAL,
                                   "token %llu, layer %u: expert %u at place %u is out of range "
                                   "(%u experts) or not above the one before",
                                   (unsigned long long)t->n_tokens, l, e, i, t->n_expert);
        }
    if (t->n_tokens == t->cap) {
        uint64_t cap = t->cap ? t->cap * 2 : 1024;
        uint16_t *p = realloc(t->sel, cap * per * sizeof *p);
        if (!p)
            return strata_errf(STRATA_ENOMEM, "out of memory for a trace of %llu tokens",
                               (unsigned long long)cap);
        t->sel = p;
        t->cap = cap;
    }
    memcpy(t->sel + t->n_tokens * per, sel, per * sizeof *sel);
    t->n_tokens++;
    return 0;
}

/* ---- the trace file --------------------------------------------------------------------------
 */

static const char trace_magic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'T', 'R'};
#define TRACE_VERSION 1u
#define TRACE_HEADER  36 /* magic, version, n_layer, n_expert, n_used, ctx, n_tokens */

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int trace_save(const struct trace *t, uint32_t ctx, const char *path)
{
    unsigned char h[TRACE_HEADER], buf[4096];
    memcpy(h, trace_magic, 8);
    put_le(h + 8, TRACE_VERSION, 4);
    put_le(h + 12, t->n_layer, 4);
    put_le(h + 16, t->n_expert, 4);
    put_le(h + 20, t->n_used, 4);
    put_le(h + 24, ctx, 4);
    put_le(h + 28, t->n_tokens, 8);
    FILE *f = fopen(path, "wb");
    if (!f) return strata_errf(strata_errno(errno), "%s: %s", path, strerror(errno));
    const int w = t->n_expert <= 256 ? 1 : 2;
    const uint64_t n = t->n_tokens * t->n_layer * t->n_used;
    bool ok = fwrite(h, 1, sizeof h, f) == sizeof h;
    for (uint64_t i = 0; ok && i < n;) {
        size_t k = 0;
        for (; k + (size_t)w <= sizeof buf && i < n; k += (size_t)w, i++)
            put_le(buf + k, t->sel[i], w);
        ok = fwrite(buf, 1, k, f) == k;
    }
    if (fclose(f) != 0) ok = false;
    return ok ? 0 : strata_errf(STRATA_EIO, "%s: writing the trace failed", path);
}

int trace_read(FILE *f, const char *name, struct trace *t, uint32_t *ctx)
{
    memset(t, 0, sizeof *t);
    unsigned char h[TRACE_HEADER];
    uint16_t *sel = NULL;
    unsigned char *raw = NULL;
    int rv = 0;
    if (fread(h, 1, sizeof h, f) != sizeof h || memcmp(h, trace_magic, 8) != 0 ||
        get_le(h + 8, 4) != TRACE_VERSION) {
        rv = strata_errf(STRATA_EFORMAT, "%s: not a strata trace (version %u)", name,
                         TRACE_VERSION);
        goto out;
    }
    const uint32_t L = (uint32_t)get_le(h + 12, 4), E = (uint32_t)get_le(h + 16, 4),
                   U = (uint32_t)get_le(h + 20, 4);
    const uint64_t n_tok = get_le(h + 28, 8);
    if ((uint64_t)L * U > TRACE_MAX_PER_TOKEN) {
        rv = strata_errf(STRATA_EFORMAT, "%s: %u layers of %u picks a token: more than a model has",
                         name, L, U);
        goto out;
    }
    if ((rv = trace_init(t, L, E, U)) != 0) {
        rv = strata_errf(STRATA_EFORMAT, "%s: %s", name, strata_errdetail());
        goto out;
    }
    const size_t per = (size_t)L * U, w = E <= 256 ? 1 : 2;
    sel = malloc(per * sizeof *sel);
    raw = malloc(per * w);
    if (!sel || !raw) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory reading %s", name);
        goto out;
    }
    for (uint64_t k = 0; k < n_tok; k++) {
        if (fread(raw, w, per, f) != per) {
            rv = strata_errf(STRATA_EFORMAT, "%s: cut short at token %llu of %llu", name,
                             (unsigned long long)k, (unsigned long long)n_tok);
            goto out;
        }
        for (size_t i = 0; i < per; i++)
            sel[i] = (uint16_t)get_le(raw + i * w, (int)w);
        if ((rv = trace_push(t, sel)) != 0) {
            rv = strata_errf(rv == STRATA_EINVAL ? STRATA_EFORMAT : rv, "%s: %s", name,
                             strata_errdetail());
            goto out;
        }
    }
    if (fgetc(f) != EOF) {
        rv = strata_errf(STRATA_EFORMAT, "%s: bytes after the %llu tokens its header names", name,
                         (unsigned long long)n_tok);
        goto out;
    }
    if (ctx) *ctx = (uint32_t)get_le(h + 24, 4);
out:
    if (rv) trace_fini(t);
    free(sel);
    free(raw);
    return rv;
}

int trace_load(const char *path, struct trace *t, uint32_t *ctx)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) return strata_errf(strata_errno(errno), "%s: %s", path, strerror(errno));
    const int rv = trace_read(f, path, t, ctx);
    fclose(f);
    return rv;
}

/* ---- recording --------------------------------------------------------------------------------
 */

/* Passes of at most TRACE_CHUNK tokens of a window: its tokens share each expert's weight reads,
 * and the forward pass's scratch stays near 50 MB for Qwen3-30B-A3B's shapes. */
#define TRACE_CHUNK 256

struct rec {
    uint32_t n_layer, n_used;
    uint16_t *sel; /* (TRACE_CHUNK, n_layer, n_used) the pass's picks, in the order reported */
    uint32_t *got; /* (TRACE_CHUNK, n_layer) picks reported; may pass n_used, which trace_record
                      reports */
};

/* route notes the pass's picks. The forward pass reports a layer's experts in ascending id order,
 * so each token's picks of a layer land sorted, as trace_push wants them. */
static void route(void *ctx, uint32_t layer, uint32_t expert, const uint32_t *tokens,
                  uint32_t n_tokens)
{
    struct rec *r = ctx;
    for (uint32_t i = 0; i < n_tokens; i++) {
        const size_t k = (size_t)tokens[i] * r->n_layer + layer;
        if (r->got[k] < r->n_used) r->sel[k * r->n_used + r->got[k]] = (uint16_t)expert;
        r->got[k]++;
    }
}

int trace_record(const struct model *m, const int32_t *ids, size_t n, uint32_t ctx,
                 uint32_t n_threads, struct trace *t)
{
    const struct model_hparams *hp = &m->hp;
    if (!ctx) return strata_errf(STRATA_EINVAL, "a trace window of 0 tokens");
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= hp->n_vocab)
            return strata_errf(STRATA_EINVAL, "token %zu is id %d, outside the vocabulary of %u", i,
                               ids[i], hp->n_vocab);
    const uint32_t chunk = ctx < TRACE_CHUNK ? ctx : TRACE_CHUNK;
    struct rec r = {.n_layer = hp->n_layer, .n_used = hp->n_expert_used};
    r.sel = malloc((size_t)chunk * hp->n_layer * hp->n_expert_used * sizeof *r.sel);
    r.got = malloc((size_t)chunk * hp->n_layer * sizeof *r.got);
    struct backend_token *toks = malloc(chunk * sizeof *toks);
    struct kv_cache *kv = NULL;
    struct backend *f = NULL;
    struct kv_seq seq;
    kv_seq_init(&seq);
    int rv = 0;
    if (!r.sel || !r.got || !toks) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for trace passes of %u tokens", chunk);
        goto fail;
    }
    struct backend_opts bo = {
        .n_threads = n_threads, .max_pass_tokens = chunk, .n_ctx = ctx, .n_seq = 1};
    if ((rv = backend_start(m, &bo, &f)) != 0) goto fail;
    kv = backend_kv(f);
    backend_set_route(f, route, &r);
    for (size_t i = 0; i < n;) {
        if (i % ctx == 0) {
            kv_seq_fini(kv, &seq);
            kv_seq_init(&seq);
        }
        /* A pass stops at the window's end: the next window starts from an empty context. */
        const size_t left = ctx - i % ctx < n - i ? ctx - i % ctx : n - i;
        const uint32_t c = left < chunk ? (uint32_t)left : chunk;
        /* No logits are asked for: the routing is all a trace needs. */
        for (uint32_t j = 0; j < c; j++)
            toks[j] = (struct backend_token){&seq, ids[i + j], false};
        memset(r.got, 0, (size_t)c * hp->n_layer * sizeof *r.got);
        if ((rv = backend_eval(f, toks, c, NULL)) != 0) goto fail;
        for (uint32_t j = 0; j < c; j++) {
            for (uint32_t l = 0; l < hp->n_layer; l++)
                if (r.got[(size_t)j * hp->n_layer + l] != hp->n_expert_used) {
                    rv = strata_errf(STRATA_EINTERNAL,
                                     "token %zu, layer %u: the forward pass reported %u experts, "
                                     "expected %u: its routing hook broke its contract",
                                     i + j, l, r.got[(size_t)j * hp->n_layer + l],
                                     hp->n_expert_used);
                    goto fail;
                }
            if ((rv = trace_push(t, r.sel + (size_t)j * hp->n_layer * hp->n_expert_used)) != 0)
                goto fail;
        }
        i += c;
    }
fail:
    kv_seq_fini(kv, &seq);
    backend_close(f);
    free(r.sel);
    free(r.got);
    free(toks);
    return rv;
}

/* ---- analysis ---------------------------------------------------------------------------------
 */

void trace_counts(const struct trace *t, uint32_t layer, uint64_t *out)
{
    memset(out, 0, t->n_expert * sizeof *out);
    const size_t per = (size_t)t->n_layer * t->n_used;
    for (uint64_t k = 0; k < t->n_tokens; k++)
        for (uint32_t i = 0; i < t->n_used; i++)
            out[t->sel[k * per + (size_t)layer * t->n_used + i]]++;
}

double trace_entropy(const struct trace *t, uint32_t layer)
{
    uint64_t *c = malloc(t->n_expert * sizeof *c);
    if (!c) return NAN;
    trace_counts(t, layer, c);
    double total = (double)t->n_tokens * t->n_used, h = 0;
    for (uint32_t e = 0; e < t->n_expert && total > 0; e++)
        if (c[e]) h -= (double)c[e] / total * log2((double)c[e] / total);
    free(c);
    return h;
}

void trace_reuse(const struct trace *t, uint32_t layer, uint64_t hist[TRACE_REUSE_BUCKETS],
                 double iid[TRACE_REUSE_BUCKETS])
{
    /* last[e]: 1 + the token that last picked e, 0 before its first pick */
    uint64_t *last = calloc(t->n_expert, sizeof *last);
    if (!last) return;
    const size_t per = (size_t)t->n_layer * t->n_used;
    for (uint64_t k = 0; k < t->n_tokens; k++)
        for (uint32_t i = 0; i < t->n_used; i++) {
            const uint16_t e = t->sel[k * per + (size_t)layer * t->n_used + i];
            if (last[e]) {
                const uint64_t d = k + 1 - last[e];
                int b = 0;
                while (b + 1 < TRACE_REUSE_BUCKETS && d >= (2ull << b))
                    b++;
                hist[b]++;
            }
            last[e] = k + 1;
        }
    trace_counts(t, layer, last);
    for (uint32_t e = 0; e < t->n_expert; e++) {
        if (last[e] < 2) continue;
        const double q = 1.0 - (double)last[e] / (double)t->n_tokens;
        for (int b = 0; b < TRACE_REUSE_BUCKETS; b++) {
            const double a = (double)(1ull << b), z = (double)(2ull << b) - 1;
            const double share =
                b + 1 < TRACE_REUSE_BUCKETS ? pow(q, a - 1) - pow(q, z) : pow(q, a - 1);
            iid[b] += (double)(last[e] - 1) * share;
        }
    }
    free(last);
}

uint64_t trace_lru(const struct trace *t, uint32_t layer, uint32_t slots, uint64_t *accesses)
{
    /* last[e]: the access time of expert e if it is cached, 0 if not. O(n_expert) per miss:
     * fine for the hundreds of experts a layer has. */
    uint64_t *last = calloc(t->n_expert, sizeof *last), clock = 0, hits = 0;
    uint32_t held = 0;
    const size_t per = (size_t)t->n_layer * t->n_used;
    *accesses = t->n_tokens * t->n_used;
    if (!last || !slots) {
        free(last);
        return 0;
    }
    for (uint64_t k = 0; k < t->n_tokens; k++)
        for (uint32_t i = 0; i < t->n_used; i++) {
            uint16_t e = t->sel[k * per + (size_t)layer * t->n_used + i];
            if (last[e]) {
                hits++;
            } else if (held < slots) {
                held++;
            } else {
                uint32_t victim = 0;
                uint64_t oldest = UINT64_MAX;
                for (uint32_t x = 0; x < t->n_expert; x++)
                    if (last[x] && last[x] < oldest) {
                        oldest = last[x];
                        victim = x;
                    }
                last[victim] = 0;
            }
            last[e] = ++clock;
        }
    free(last);
    return hits;
}

/* ---- replay -----------------------------------------------------------------------------------
 */

const char *trace_policy_name(enum trace_policy p)
{
    static const char *const names[TRACE_N_POLICY] = {"tier", "lru", "lfu", "static", "belady"};
    return p < TRACE_N_POLICY ? names[p] : "?";
}

/* A trace cut into windows: each window's distinct (layer, expert)s (x = l * n_expert + e) with
 * the pairs routed to them, and for Belady each x's windows of use, ascending, with the pairs
 * of its uses summed up to each. */
struct windows {
    uint32_t n, N;     /* windows; n_layer * n_expert */
    uint64_t *off;     /* (n + 1) window w's entries are ent[off[w] .. off[w + 1]) */
    uint32_t *ent;     /* x */
    uint32_t *pairs;   /* pairs of entry i */
    uint64_t *use_off; /* (N + 1) x's windows are use[use_off[x] .. use_off[x + 1]) */
    uint32_t *use;
    uint64_t *cum; /* (uses + 1) pairs of all uses before use i, over the whole use[] array */
};

static void windows_fini(struct windows *w)
{
    free(w->off);
    free(w->ent);
    free(w->pairs);
    free(w->use_off);
    free(w->use);
    free(w->cum);
}

static int windows_init(const struct trace *t, uint32_t window, struct windows *w)
{
    memset(w, 0, sizeof *w);
    const size_t per = (size_t)t->n_layer * t->n_used;
    const uint64_t n = (t->n_tokens + window - 1) / window, max_ent = t->n_tokens * per;
    if (n > UINT32_MAX)
        return strata_errf(STRATA_EINVAL, "a replay of %llu windows: at most 2^32 - 1",
                           (unsigned long long)n);
    w->n = (uint32_t)n;
    w->N = t->n_layer * t->n_expert;
    w->off = malloc((n + 1) * sizeof *w->off);
    w->ent = malloc((max_ent ? max_ent : 1) * sizeof *w->ent);
    w->pairs = malloc((max_ent ? max_ent : 1) * sizeof *w->pairs);
    w->use_off = calloc((size_t)w->N + 1, sizeof *w->use_off);
    uint32_t *slot_of = malloc((size_t)w->N * sizeof *slot_of); /* x's entry in this window */
    uint64_t *stamp = calloc(w->N, sizeof *stamp);              /* window + 1 that last saw x */
    int rv = 0;
    if (!w->off || !w->ent || !w->pairs || !w->use_off || !slot_of || !stamp) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for a replay of %llu tokens",
                         (unsigned long long)t->n_tokens);
        goto fail;
    }
    uint64_t m = 0;
    for (uint32_t i = 0; i < w->n; i++) {
        w->off[i] = m;
        const uint64_t end =
            (uint64_t)(i + 1) * window < t->n_tokens ? (uint64_t)(i + 1) * window : t->n_tokens;
        for (uint64_t k = (uint64_t)i * window; k < end; k++)
            for (uint32_t l = 0; l < t->n_layer; l++)
                for (uint32_t j = 0; j < t->n_used; j++) {
                    const uint32_t x =
                        l * t->n_expert + t->sel[k * per + (size_t)l * t->n_used + j];
                    if (stamp[x] != (uint64_t)i + 1) {
                        stamp[x] = (uint64_t)i + 1;
                        slot_of[x] = (uint32_t)m;
                        w->ent[m] = x;
                        w->pairs[m++] = 0;
                        w->use_off[x + 1]++;
                    }
                    w->pairs[slot_of[x]]++;
                }
    }
    w->off[w->n] = m;
    for (uint32_t x = 0; x < w->N; x++)
        w->use_off[x + 1] += w->use_off[x];
    w->use = malloc((m ? m : 1) * sizeof *w->use);
    w->cum = malloc((m + 1) * sizeof *w->cum);
    if (!w->use || !w->cum) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for a replay of %llu tokens",
                         (unsigned long long)t->n_tokens);
        goto fail;
    }
    memset(stamp, 0, (size_t)w->N * sizeof *stamp); /* now: x's uses filled so far */
    for (uint32_t i = 0; i < w->n; i++)
        for (uint64_t k = w->off[i]; k < w->off[i + 1]; k++) {
            const uint32_t x = w->ent[k];
            w->use[w->use_off[x] + stamp[x]] = i;
            w->cum[w->use_off[x] + stamp[x]++ + 1] = w->pairs[k];
        }
    w->cum[0] = 0;
    for (uint64_t k = 0; k < m; k++)
        w->cum[k + 1] += w->cum[k];
fail:
    free(slot_of);
    free(stamp);
    if (rv) windows_fini(w);
    return rv;
}

/* first_use: the index in use[] of x's first use at or after window from (x's end if none). */
static uint64_t first_use(const struct windows *w, uint32_t x, uint32_t from)
{
    uint64_t lo = w->use_off[x], hi = w->use_off[x + 1];
    while (lo < hi) {
        const uint64_t mid = lo + (hi - lo) / 2;
        if (w->use[mid] < from)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* belady_key ranks x by its future from window from: first the pairs it takes in the windows
 * [from, until) (the ones a pick now decides: until the next round's moves can land), then the
 * nearest next use after them, Belady's rule; -INFINITY when x is never used again. With one
 * access a window and a round after each, it is Belady's rule exactly. */
static double belady_key(const struct windows *w, uint32_t x, uint32_t from, uint32_t until)
{
    const uint64_t a = first_use(w, x, from), b = first_use(w, x, until);
    if (a == w->use_off[x + 1]) return -INFINITY;
    const uint32_t next = b < w->use_off[x + 1] ? w->use[b] : UINT32_MAX;
    /* pairs in the horizon count first; 2^33 > any window index keeps the order lexicographic
     * (exact in a double up to 2^20 pairs a horizon) */
    return (double)(w->cum[b] - w->cum[a]) * 8589934592.0 - (double)next;
}

/* The baselines' pick: non-residents by want[] descending replace residents by keep[] ascending
 * (ties to the lower x) while the candidate's want beats the victim's keep; free slots first.
 * want[x] = -INFINITY: x is no candidate. */
struct greedy {
    double *want, *keep;
    uint32_t *cand, *vict;
};

static int by_want(const void *a, const void *b, void *ctx)
{
    const double *v = ctx;
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (v[x] != v[y]) return v[x] > v[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int by_keep(const void *a, const void *b, void *ctx)
{
    const double *v = ctx;
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (v[x] != v[y]) return v[x] < v[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static uint32_t greedy_pick(struct greedy *g, const struct cache *c, uint32_t swaps,
                            struct tier_move *moves)
{
    const uint32_t N = c->n_layer * c->n_expert;
    uint32_t nc = 0, nv = 0, n = 0, next_free = 0;
    for (uint32_t x = 0; x < N; x++)
        if (c->work[x] == CACHE_NONE && g->want[x] > -INFINITY) g->cand[nc++] = x;
    for (uint32_t s = 0; s < c->n_slots; s++)
        if (c->owner[s] != CACHE_NONE) g->vict[nv++] = (uint32_t)c->owner[s];
    qsort_r(g->cand, nc, sizeof *g->cand, by_want, g->want);
    qsort_r(g->vict, nv, sizeof *g->vict, by_keep, g->keep);
    for (uint32_t k = 0, v = 0; k < nc && n < swaps; k++) {
        const uint32_t x = g->cand[k];
        while (next_free < c->n_slots && c->owner[next_free] != CACHE_NONE)
            next_free++;
        if (next_free < c->n_slots) {
            moves[n++] =
                (struct tier_move){x / c->n_expert, x % c->n_expert, next_free++, CACHE_NONE};
            continue;
        }
        if (v == nv || !(g->want[x] > g->keep[g->vict[v]])) break;
        const uint32_t y = g->vict[v++];
        moves[n++] =
            (struct tier_move){x / c->n_expert, x % c->n_expert, (uint32_t)c->work[y], (int32_t)y};
    }
    return n;
}

/* win_tokens: the tokens of window i (the last may be short). */
static uint32_t win_tokens(const struct trace *t, const struct trace_replay_opts *o, uint32_t i)
{
    const uint64_t left = t->n_tokens - (uint64_t)i * o->window;
    return left < o->window ? (uint32_t)left : o->window;
}

int trace_replay(const struct trace *t, enum trace_policy p, uint32_t slots,
                 const struct trace_replay_opts *o, uint64_t *hits, uint64_t *accesses)
{
    const uint32_t N = t->n_layer * t->n_expert;
    *hits = 0;
    *accesses = t->n_tokens * t->n_layer * t->n_used;
    if (!o->window || slots > N || p >= TRACE_N_POLICY)
        return strata_errf(STRATA_EINVAL,
                           "a replay of %u slots over %u experts in windows of %u tokens: give a "
                           "window of at least 1 token and at most one slot per expert",
                           slots, N, o->window);
    struct windows w;
    int rv = windows_init(t, o->window, &w);
    if (rv) return rv;
    struct cache *c = NULL;
    struct tier *tr = NULL;
    struct greedy g = {0};
    uint32_t *order = malloc((size_t)N * sizeof *order);
    uint64_t *heat = p == TRACE_STATIC ? calloc(N, sizeof *heat) : NULL;
    double *last = calloc(N, sizeof *last), *freq = calloc(N, sizeof *freq);
    struct tier_move *moves = malloc(((size_t)o->tier.swaps + 1) * sizeof *moves);
    g.want = malloc((size_t)N * sizeof *g.want);
    g.keep = malloc((size_t)N * sizeof *g.keep);
    g.cand = malloc((size_t)N * sizeof *g.cand);
    g.vict = malloc((size_t)N * sizeof *g.vict);
    if (!order || (p == TRACE_STATIC && !heat) || !last || !freq || !moves || !g.want || !g.keep ||
        !g.cand || !g.vict) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for a replay over %u experts", N);
        goto fail;
    }
    if ((rv = cache_init(t->n_layer, t->n_expert, slots, 1, &c)) != 0 ||
        (rv = tier_init(t->n_layer, t->n_expert, &o->tier, &tr)) != 0)
        goto fail;
    /* The start: a worker without heat fills evenly; static fills from the whole trace's heat. */
    if (heat)
        for (uint64_t k = 0; k < w.off[w.n]; k++)
            heat[w.ent[k]] += w.pairs[k];
    if ((rv = cache_fill_order(t->n_layer, t->n_expert, heat, order)) != 0) goto fail;
    for (uint32_t s = 0; s < slots; s++)
        cache_assign(c, s, order[s] / t->n_expert, order[s] % t->n_expert);
    cache_publish(c);
    uint32_t n_pend = 0, land_at = 0;
    for (uint32_t i = 0; i < w.n; i++) {
        for (uint64_t k = w.off[i]; k < w.off[i + 1]; k++) {
            const uint32_t x = w.ent[k];
            if (c->pub[x] != CACHE_NONE) *hits += w.pairs[k];
            /* The worker's count: each decode pair, or once per expert of a prompt chunk (or,
             * with chunk_share, its share of the chunk's tokens). */
            const float cnt = o->window == 1   ? (float)w.pairs[k]
                              : o->chunk_share ? (float)w.pairs[k] / (float)win_tokens(t, o, i)
                                               : 1;
            tier_count(tr, x / t->n_expert, x % t->n_expert, cnt);
            last[x] = i + 1;
            freq[x] += w.pairs[k];
        }
        /* The tick after window i: land what is due, then maybe a round (none while one is in
         * flight, as the worker's async tier). */
        if (p == TRACE_STATIC) continue;
        if (n_pend && land_at == i) {
            for (uint32_t m = 0; m < n_pend; m++)
                cache_assign(c, moves[m].slot, moves[m].layer, moves[m].expert);
            cache_publish(c);
            n_pend = 0;
        }
        if (n_pend || !tier_window(tr)) continue;
        uint32_t n = 0;
        if (p == TRACE_TIER) {
            n = tier_round(tr, c, moves, o->tier.swaps);
        } else {
            for (uint32_t x = 0; x < N; x++) {
                const bool res = c->work[x] != CACHE_NONE;
                double v;
                if (p == TRACE_LRU) {
                    v = last[x];
                } else if (p == TRACE_LFU) {
                    v = freq[x];
                } else {
                    /* a victim is gone from the next window on; a candidate arrives lag later;
                     * both count to the window the next round's moves could land in */
                    const uint32_t until = i + 1 + o->lag + o->tier.every;
                    v = belady_key(&w, x, res ? i + 1 : i + 1 + o->lag, until);
                }
                /* LRU and LFU admit what was used at all; Belady what is used again (bypass) */
                const bool used = p == TRACE_BELADY ? v > -INFINITY : v > 0;
                g.keep[x] = v;
                g.want[x] = !res && used ? v : -INFINITY;
            }
            n = greedy_pick(&g, c, o->tier.swaps, moves);
        }
        for (uint32_t m = 0; m < n; m++)
            if (moves[m].victim != CACHE_NONE) cache_evict(c, moves[m].slot);
        if (o->lag == 0) {
            for (uint32_t m = 0; m < n; m++)
                cache_assign(c, moves[m].slot, moves[m].layer, moves[m].expert);
        } else {
            n_pend = n;
            land_at = i + o->lag;
        }
        cache_publish(c);
    }
fail:
    windows_fini(&w);
    cache_fini(c);
    tier_fini(tr);
    free(order);
    free(heat);
    free(last);
    free(freq);
    free(moves);
    free(g.want);
    free(g.keep);
    free(g.cand);
    free(g.vict);
    return rv;
}
