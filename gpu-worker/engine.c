#include "gpu-worker/engine.h"
#include "common/base/err.h"
#include "common/base/log.h"
#include "common/grammar/grammar.h"
#include "gpu-worker/backend.h"
#include "gpu-worker/gvocab.h"
#include "gpu-worker/kv.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A request. Fields marked (loop) belong to the decode thread once the request is queued; the
 * rest are shared and read or written under engine.mu. Only the decode thread frees a request. */
struct ereq {
    struct ereq *next; /* engine.all */
    char id[ENGINE_ID_MAX + 1];
    struct sample_params sp; /* n_logprobs set from logprobs/n_top */
    int32_t stop[ENGINE_MAX_STOP];
    uint32_t n_stop;
    bool logprobs;
    uint32_t max_new;   /* tokens this request may generate: max_tokens capped by the context */
    uint32_t gen_start; /* hist index of the first generated token (resumed ones included) */
    uint32_t n_prompt;  /* prompt ids as submitted */
    /* (loop) */
    int32_t *hist; /* prompt, then generated tokens: room for n_prompt + max_new */
    uint32_t n_hist;
    struct kv_seq seq;    /* hist[0 .. seq.n_tokens) are in the cache */
    uint32_t n_pub;       /* blocks of seq published to the prefix cache */
    uint64_t pub_key;     /* the last published block's key */
    uint32_t resv;        /* blocks reserved at admission: the sequence may grow to this many */
    uint32_t plan_blocks; /* blocks the window being planned takes for it */
    bool fresh;           /* admitted and no token sampled since: prefill timing runs */
    int32_t draft[ENGINE_MAX_DRAFT]; /* the window's drafts after hist[n_hist - 1] */
    uint32_t n_draft;
    struct spec_adapt spec; /* drafts to try next (spec.h) */
    struct kv_seq dseq; /* the draft model's KV of hist (and drafts): a prefix of hist */
    uint32_t n_admit;     /* n_hist at admission: positions below it are prefill */
    struct grammar_matcher *gm;  /* its grammar's state after the generated tokens, or NULL
                                    (loop once queued) */
    bool grammar_end;            /* finished STOP by a complete sentence, not a stop id */
    /* shared */
    enum { RQ_QUEUED, RQ_RUNNING, RQ_DONE } state;
    bool cancel;
    struct engine_token *out; /* generated tokens */
    uint32_t n_out, cap_out;
    enum engine_finish finish;
    int error;
    char error_msg[256];
    int64_t lease_end; /* ns, CLOCK_MONOTONIC */
    int64_t t_queued, t_admit, t_first, t_last;
    struct engine_timings tm;
};

/* One request's share of a window: hist[from .. from+n) fed (a decode step: hist[n_hist - 1]
 * and the request's drafts), then maybe tokens sampled: one, or with drafts the accepted ones
 * and the one after them. */
struct item {
    struct ereq *r;
    uint32_t from, n;
    bool sampled;
    bool pre; /* its grammar mask for the first sampled position is made during the pass */
    int err;  /* the sampler's error */
    uint32_t n_res;
    struct sample_result res[ENGINE_MAX_DRAFT + 1];
};

struct engine {
    const struct model *m;
    struct engine_opts o;
    struct kv_cache *kv; /* backend_kv(be): the sequences' block tables */
    struct backend *be;
    struct spec_draft *draft; /* the draft model's drafter, or NULL (loop) */
    struct spec_draft_item *ditems; /* (max_running) a window's drafting, scratch */
    uint32_t k_max;       /* drafts per request and window at most: spec_draft or spec_lookup */
    bool timing;          /* STRATA_DECODE_TIMING=1: a line per window on drafts */
    struct sample *smp;   /* the loop's sampler */
    struct sample *check; /* a one-token sampler that validates parameters at submit (under mu) */
    uint32_t bt;          /* positions per KV block */
    uint32_t n_ctx;
    pthread_t th;
    bool th_started;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    bool stop;
    struct ereq *all;      /* every request (queued, running, finished) */
    struct ereq **waiting; /* FIFO; preempted requests go back to the front */
    uint32_t n_waiting, cap_waiting;
    struct ereq **running; /* admission order: the last is the youngest (loop, counted under mu) */
    uint32_t n_running;
    uint32_t n_finished;
    /* (loop) window scratch */
    struct item *items;
    uint32_t n_items;
    struct backend_token *toks;
    float *logits; /* (max_running, n_vocab) */
    /* counters, under mu */
    _Atomic uint64_t epoch;
    struct engine_status st;
    struct backend_info info; /* refreshed by the loop (gauge) */
    bool fence;               /* a request started: land the tier's round before the window */
    /* The command slot: one command at a time from another thread, run by the loop between
     * windows; the caller waits for cmd_done. */
    enum { CMD_NONE, CMD_QUIESCE, CMD_RESIZE } cmd;
    uint64_t cmd_arg;
    int cmd_rv;
    char cmd_msg[256]; /* the error's detail, made on the decode thread */
    bool cmd_done;
    pthread_cond_t cmd_cv;
    /* grammars (under gv_mu): the vocabulary as bytes, built on the first grammar request, and
     * the recent grammars, whose tables their requests share */
    pthread_mutex_t gv_mu;
    struct grammar_vocab *gv;
    struct {
        char *text;
        struct grammar_matcher *proto;
        uint64_t used;
    } gc[ENGINE_GRAMMAR_CACHE];
    uint64_t gc_clock;
    uint32_t *allow; /* (loop) a mask with the stop ids added */
    /* the mask thread makes the window's first masks while the pass runs (under gmu: posted and
     * done count windows; items[] is the loop's and unchanged until done == posted) */
    pthread_t gth;
    bool gth_started, g_stop;
    pthread_mutex_t gmu;
    pthread_cond_t gcv;
    uint64_t g_posted, g_done;
    uint32_t *gmasks; /* (max_running, words): item i's mask */
    int *gerr;        /* (max_running) */
    uint64_t rate_tokens; /* tokens computed since rate_t0 */
    int64_t rate_t0;
    _Atomic uint64_t *routed; /* (n_layer, n_expert) tokens routed since start: engine_routed */
    uint32_t n_layer, n_expert;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double ms(int64_t ns)
{
    return (double)ns / 1e6;
}

static uint32_t blocks_for(const struct engine *e, uint32_t n_tokens)
{
    return (n_tokens + e->bt - 1) / e->bt;
}

/* route hands the window's routing to on_route: tokens per (layer, expert), as the heat counts. */
static void route(void *ctx, uint32_t layer, uint32_t expert, const uint32_t *tokens,
                  uint32_t n_tokens)
{
    const struct engine *e = ctx;
    (void)tokens;
    if (layer < e->n_layer && expert < e->n_expert)
        atomic_fetch_add_explicit(&e->routed[(size_t)layer * e->n_expert + expert], n_tokens,
                                  memory_order_relaxed);
    if (e->o.on_route) e->o.on_route(e->o.route_ctx, layer, expert, n_tokens);
}

static struct ereq *lookup(const struct engine *e, const char *id)
{
    /* O(n) scan: the table holds max_running + max_queue live requests plus finished ones for
     * one lease; fine below a few thousand. */
    for (struct ereq *r = e->all; r; r = r->next)
        if (strcmp(r->id, id) == 0) return r;
    return NULL;
}

static void req_free(struct engine *e, struct ereq *r)
{
    grammar_matcher_fini(r->gm);
    kv_seq_fini(e->kv, &r->seq);
    if (e->draft) spec_draft_release(e->draft, &r->dseq);
    free(r->hist);
    free(r->out);
    free(r);
}

/* ---- state changes (loop thread, under mu) --------------------------------------------------- */

static void remove_running(struct engine *e, struct ereq *r)
{
    for (uint32_t i = 0; i < e->n_running; i++)
        if (e->running[i] == r) {
            memmove(e->running + i, e->running + i + 1,
                    (e->n_running - i - 1) * sizeof *e->running);
            e->n_running--;
            return;
        }
}

static void remove_waiting(struct engine *e, struct ereq *r)
{
    for (uint32_t i = 0; i < e->n_waiting; i++)
        if (e->waiting[i] == r) {
            memmove(e->waiting + i, e->waiting + i + 1,
                    (e->n_waiting - i - 1) * sizeof *e->waiting);
            e->n_waiting--;
            return;
        }
}

/* finish ends r: its blocks go back (published ones stay cached), its tokens stay pollable. */
static void finish(struct engine *e, struct ereq *r, enum engine_finish why, int err)
{
    if (r->state == RQ_DONE) return;
    if (r->state == RQ_RUNNING)
        remove_running(e, r);
    else
        remove_waiting(e, r);
    kv_seq_fini(e->kv, &r->seq);
    if (e->draft) spec_draft_release(e->draft, &r->dseq);
    r->state = RQ_DONE;
    r->finish = why;
    r->t_last = now_ns();
    if (err) {
        r->error = err;
        snprintf(r->error_msg, sizeof r->error_msg, "%s: %s", strata_strerror(err),
                 strata_errdetail());
    }
    e->n_finished++;
}

/* preempt frees r's blocks and puts it at the head of the queue with its history, to be
 * recomputed (most of it from the prefix cache when its blocks were not evicted meanwhile). */
static void preempt(struct engine *e, struct ereq *r)
{
    remove_running(e, r);
    kv_seq_fini(e->kv, &r->seq);
    /* the draft model's pool holds the running sequences: this one catches up when it is back */
    if (e->draft) spec_draft_release(e->draft, &r->dseq);
    r->n_pub = 0;
    r->pub_key = KV_PREFIX_ROOT;
    r->resv = r->plan_blocks = 0;
    r->state = RQ_QUEUED;
    r->t_queued = now_ns();
    r->tm.n_preempted++;
    memmove(e->waiting + 1, e->waiting, e->n_waiting * sizeof *e->waiting);
    e->waiting[0] = r;
    e->n_waiting++;
    e->st.preemptions++;
    LOG_DEBUG("engine: preempted %s at %u positions", r->id, r->n_hist);
}

/* outstanding: blocks promised to running requests other than skip and not yet taken. */
static uint32_t outstanding(const struct engine *e, const struct ereq *skip)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < e->n_running; i++) {
        const struct ereq *q = e->running[i];
        uint32_t held = q->seq.n_blocks + q->plan_blocks;
        if (q != skip && q->resv > held) n += q->resv - held;
    }
    return n;
}

/* admit tries to start the head of the queue: attach its cached prefix, then reserve blocks for
 * its history plus a share of what it may still generate. */
static bool admit(struct engine *e, struct ereq *r)
{
    uint32_t n_blocks = 0;
    uint64_t key = KV_PREFIX_ROOT;
    /* At least the last position is computed: its logits pick the next token. */
    if (!e->o.no_prefix_cache && kv_prefix_attach(e->kv, &r->seq, r->hist, r->n_hist,
                                                  (r->n_hist - 1) / e->bt, &n_blocks, &key) != 0)
        return false;
    uint32_t left = r->max_new - (r->n_hist - r->n_prompt);
    uint64_t want = r->n_hist + ((uint64_t)left * e->o.reserve_pct + 99) / 100;
    uint32_t resv = blocks_for(e, want < e->n_ctx ? (uint32_t)want : e->n_ctx);
    const uint32_t total = kv_config_of(e->kv)->max_blocks;
    if (resv > total) resv = total;
    uint32_t avail = kv_blocks_free(e->kv), owed = outstanding(e, NULL);
    if (resv - n_blocks > (avail > owed ? avail - owed : 0)) {
        kv_seq_fini(e->kv, &r->seq);
        return false;
    }
    r->resv = resv;
    r->n_pub = n_blocks;
    r->pub_key = key;
    r->fresh = true;
    r->n_admit = r->n_hist;
    r->state = RQ_RUNNING;
    r->t_admit = now_ns();
    r->tm.queue_ms += ms(r->t_admit - r->t_queued);
    r->tm.n_prefilled += n_blocks * e->bt;
    r->tm.n_cached += n_blocks * e->bt;
    e->st.prefix_hits += n_blocks * e->bt;
    e->running[e->n_running++] = r;
    e->fence = true;
    return true;
}

/* sweep ends cancelled and lapsed requests, forgets finished ones whose lease lapsed and admits
 * from the queue. Returns whether anything changed. */
static bool sweep(struct engine *e)
{
    const int64_t now = now_ns();
    bool changed = false;
    for (struct ereq **p = &e->all; *p;) {
        struct ereq *r = *p;
        bool lapsed = now > r->lease_end;
        if (r->state != RQ_DONE && (r->cancel || lapsed)) {
            finish(e, r, ENGINE_FINISH_CANCELLED, 0);
            if (lapsed) e->st.lapsed++;
            changed = true;
        }
        if (r->state == RQ_DONE && lapsed) {
            *p = r->next;
            e->n_finished--;
            req_free(e, r);
            changed = true;
            continue;
        }
        p = &r->next;
    }
    while (e->n_waiting && e->n_running < e->o.max_running && admit(e, e->waiting[0])) {
        memmove(e->waiting, e->waiting + 1, (e->n_waiting - 1) * sizeof *e->waiting);
        e->n_waiting--;
        changed = true;
    }
    return changed;
}

/* ---- one window ------------------------------------------------------------------------------ */

static void unplan(struct engine *e, struct ereq *r, uint32_t *budget)
{
    for (uint32_t i = 0; i < e->n_items; i++)
        if (e->items[i].r == r) {
            *budget += e->items[i].n;
            memmove(e->items + i, e->items + i + 1, (e->n_items - i - 1) * sizeof *e->items);
            e->n_items--;
            return;
        }
}

/* plan_one adds n tokens of r to the window if the blocks they need can be had: within r's
 * reservation, or from blocks nobody has been promised, or by preempting the youngest running
 * request. Returns false when r itself was preempted or ended. */
static bool plan_one(struct engine *e, struct ereq *r, uint32_t n, uint32_t *budget)
{
    const uint32_t need = blocks_for(e, r->seq.n_tokens + n) - r->seq.n_blocks;
    for (;;) {
        uint32_t planned = 0;
        for (uint32_t i = 0; i < e->n_items; i++)
            planned += e->items[i].r->plan_blocks;
        uint32_t avail = kv_blocks_free(e->kv) - planned, owed = outstanding(e, r);
        if (need <= (avail > owed ? avail - owed : 0)) break;
        struct ereq *victim = e->running[e->n_running - 1];
        if (victim == r && e->n_running == 1) {
            strata_errf(STRATA_ENOSPC,
                        "request %s needs %u KV blocks at %u positions and the pool has %u: "
                        "raise the KV cache or lower max_tokens",
                        r->id, blocks_for(e, r->seq.n_tokens + n), r->seq.n_tokens + n,
                        kv_config_of(e->kv)->max_blocks);
            finish(e, r, ENGINE_FINISH_ERROR, STRATA_ENOSPC);
            return false;
        }
        unplan(e, victim, budget);
        victim->plan_blocks = 0;
        preempt(e, victim);
        if (victim == r) return false;
    }
    r->plan_blocks = need;
    e->items[e->n_items++] = (struct item){.r = r, .from = r->seq.n_tokens, .n = n};
    *budget -= n;
    return true;
}

/* drafts_for: how many drafts r verifies this window: its adaptive count, within what it may
 * still generate (one token is sampled after the drafts), its context and the window. Lookup
 * drafts now; the draft model's come in compute (draft_window), as many as asked. */
static uint32_t drafts_for(const struct engine *e, struct ereq *r, uint32_t budget)
{
    if (!e->k_max || budget < 2) return 0;
    const uint32_t gen = r->n_hist - r->n_prompt, left = r->max_new - gen;
    uint32_t k = spec_adapt_want(&r->spec);
    if (k + 1 > left) k = left - 1;
    if (k + 1 > budget) k = budget - 1;
    if (r->n_hist + k > e->n_ctx) k = e->n_ctx > r->n_hist ? e->n_ctx - r->n_hist : 0;
    if (!k || e->draft) return k;
    return spec_lookup(r->hist, r->n_hist, k, r->draft);
}

/* plan fills the window: a decode step for each request that has sampled its last token (with
 * its drafts), then prompt chunks, oldest request first, up to max_batch_tokens. */
static void plan(struct engine *e)
{
    uint32_t budget = e->o.max_batch_tokens;
    e->n_items = 0;
    for (uint32_t i = 0; i < e->n_running; i++)
        e->running[i]->plan_blocks = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < e->n_running && budget; i++) {
            struct ereq *r = e->running[i];
            uint32_t left = r->n_hist - r->seq.n_tokens;
            if ((pass == 0) != (left == 1)) continue;
            r->n_draft = left == 1 ? drafts_for(e, r, budget) : 0;
            if (!plan_one(e, r, left + r->n_draft < budget ? left + r->n_draft : budget, &budget))
                i--; /* r left the running list: the next one moved into slot i */
        }
}

static bool is_stop(const struct ereq *r, int32_t id)
{
    for (uint32_t i = 0; i < r->n_stop; i++)
        if (r->stop[i] == id) return true;
    return false;
}

/* ---- grammars ----------------------------------------------------------------------------------
 * A request with a grammar samples only the tokens its matcher's mask allows, plus its stop ids
 * once the grammar accepts (so a stop means a complete sentence); a sentence that nothing may
 * follow ends the request as a stop without a stop token. The mask is cached per matcher state. */

/* grammar_vocab_of builds the engine's grammar vocabulary once (gvocab). Any thread; takes
 * gv_mu. */
static int grammar_vocab_of(struct engine *e, const struct grammar_vocab **out)
{
    int rv = 0;
    pthread_mutex_lock(&e->gv_mu);
    if (!e->gv) rv = gvocab_from_gguf(e->m->gguf, e->m->hp.n_vocab, &e->gv, NULL);
    *out = e->gv;
    pthread_mutex_unlock(&e->gv_mu);
    return rv;
}

/* grammar_cached forks r's matcher from the cached tables of text; false when none are cached
 * (or they outgrew ENGINE_GRAMMAR_BYTES: the grammar then starts afresh). Under gv_mu. */
static bool grammar_cached(struct engine *e, const char *text, struct ereq *r)
{
    for (uint32_t i = 0; i < ENGINE_GRAMMAR_CACHE; i++)
        if (e->gc[i].text && strcmp(e->gc[i].text, text) == 0) {
            if (grammar_matcher_bytes(e->gc[i].proto) > ENGINE_GRAMMAR_BYTES) return false;
            e->gc[i].used = ++e->gc_clock;
            return grammar_matcher_fork(e->gc[i].proto, &r->gm) == 0;
        }
    return false;
}

/* grammar_compile gives r a matcher of q's grammar, sharing the tables of earlier requests of the
 * same text, and replays the generated tokens of a resumed request into it. Outside mu. */
static int grammar_compile(struct engine *e, const struct engine_req *q, struct ereq *r)
{
    const struct grammar_vocab *v;
    int rv = grammar_vocab_of(e, &v);
    if (rv) return rv;
    pthread_mutex_lock(&e->gv_mu);
    bool hit = grammar_cached(e, q->grammar, r);
    pthread_mutex_unlock(&e->gv_mu);
    if (!hit) { /* compiled outside the lock: a large grammar takes a while */
        struct grammar *g = NULL;
        struct grammar_matcher *proto = NULL;
        char *text = strdup(q->grammar);
        if (!text) rv = STRATA_ENOMEM;
        if (!rv && ((rv = grammar_parse(q->grammar, strlen(q->grammar), &g)) != 0 ||
                    (rv = grammar_matcher_init(g, v, &proto)) != 0)) {
            rv = strata_errf(rv, "request %s: %s", q->id, strata_errdetail());
            grammar_fini(g);
        }
        if (rv) {
            free(text);
            return rv;
        }
        grammar_matcher_adopt(proto, g);
        pthread_mutex_lock(&e->gv_mu);
        uint32_t slot = 0; /* the same text (outgrown, or compiled twice at once), else the LRU */
        for (uint32_t i = 0; i < ENGINE_GRAMMAR_CACHE; i++) {
            if (e->gc[i].text && !strcmp(e->gc[i].text, text)) {
                slot = i;
                break;
            }
            if (e->gc[i].used < e->gc[slot].used) slot = i;
        }
        free(e->gc[slot].text);
        grammar_matcher_fini(e->gc[slot].proto);
        e->gc[slot].text = text;
        e->gc[slot].proto = proto;
        e->gc[slot].used = ++e->gc_clock;
        rv = grammar_matcher_fork(proto, &r->gm);
        pthread_mutex_unlock(&e->gv_mu);
        if (rv) return rv;
    }
    for (uint32_t i = q->n_prompt - q->n_generated; i < q->n_prompt; i++)
        if (!is_stop(r, q->prompt[i]) && (rv = grammar_matcher_accept_token(r->gm, q->prompt[i])))
            return strata_errf(rv, "request %s: generated token %u (id %d) does not follow the "
                               "grammar: %s", q->id, i - (q->n_prompt - q->n_generated),
                               q->prompt[i], strata_errdetail());
    return 0;
}

/* grammar_allow points *allow at r's mask with its stop ids added when the grammar accepts: the
 * one the mask thread made for item `pre` during the pass, else (UINT32_MAX) made now. */
static int grammar_allow(struct engine *e, struct ereq *r, uint32_t pre, const uint32_t **allow)
{
    const size_t words = ((size_t)e->m->hp.n_vocab + 31) / 32;
    uint32_t *mask = pre != UINT32_MAX ? e->gmasks + pre * words : e->allow;
    int rv = pre != UINT32_MAX ? e->gerr[pre] : grammar_matcher_mask_into(r->gm, mask);
    if (rv)
        return strata_errf(rv, "request %s: the grammar's matcher failed", r->id);
    if (grammar_matcher_accepting(r->gm))
        for (uint32_t i = 0; i < r->n_stop; i++)
            mask[r->stop[i] >> 5] |= 1u << (r->stop[i] & 31);
    *allow = mask;
    return 0;
}

/* grammar_advance feeds a sampled token to r's matcher (a stop id ends the sentence instead). */
static int grammar_advance(struct ereq *r, int32_t id)
{
    if (is_stop(r, id)) return 0;
    int rv = grammar_matcher_accept_token(r->gm, id);
    return rv ? strata_errf(rv, "request %s: %s", r->id, strata_errdetail()) : 0;
}

/* grammar_ended: r's grammar is complete and nothing may follow. */
static bool grammar_ended(const struct ereq *r)
{
    return r->gm && grammar_matcher_done(r->gm);
}

/* mask_thread makes the posted window's masks: each item marked pre gets the mask of its
 * request's state now, which is the state its first sampled position is drawn in. */
static void *mask_thread(void *arg)
{
    struct engine *e = arg;
    const size_t words = ((size_t)e->m->hp.n_vocab + 31) / 32;
    pthread_mutex_lock(&e->gmu);
    for (;;) {
        while (!e->g_stop && e->g_done == e->g_posted) pthread_cond_wait(&e->gcv, &e->gmu);
        if (e->g_stop) break;
        const uint64_t gen = e->g_posted;
        pthread_mutex_unlock(&e->gmu);
        for (uint32_t i = 0; i < e->n_items; i++)
            if (e->items[i].pre)
                e->gerr[i] = grammar_matcher_mask_into(e->items[i].r->gm, e->gmasks + i * words);
        pthread_mutex_lock(&e->gmu);
        e->g_done = gen;
        pthread_cond_broadcast(&e->gcv);
    }
    pthread_mutex_unlock(&e->gmu);
    return NULL;
}

/* masks_post hands the window's first grammar masks to the mask thread; false when there are
 * none to make (no item samples under a grammar). */
static bool masks_post(struct engine *e)
{
    bool any = false;
    for (uint32_t i = 0; i < e->n_items; i++) {
        struct item *it = &e->items[i];
        it->pre = e->gth_started && it->sampled && it->r->gm;
        any |= it->pre;
    }
    if (!any) return false;
    pthread_mutex_lock(&e->gmu);
    e->g_posted++;
    pthread_cond_broadcast(&e->gcv);
    pthread_mutex_unlock(&e->gmu);
    return true;
}

static void masks_wait(struct engine *e)
{
    pthread_mutex_lock(&e->gmu);
    while (e->g_done != e->g_posted) pthread_cond_wait(&e->gcv, &e->gmu);
    pthread_mutex_unlock(&e->gmu);
}

/* draft_window has the draft model draft for the window's decode steps, all at once. When it
 * fails, the window goes without drafts (its answers are the same) and the drafter starts those
 * sequences over. */
static void draft_window(struct engine *e)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < e->n_items; i++) {
        struct ereq *r = e->items[i].r;
        if (r->n_draft)
            e->ditems[n++] = (struct spec_draft_item){
                .seq = &r->dseq, .hist = r->hist, .n_hist = r->n_hist, .k = r->n_draft};
    }
    if (!n) return;
    int rv = spec_draft_propose(e->draft, e->ditems, n);
    if (rv) LOG_WARN("engine: the draft model failed, a window without drafts: %s",
                     strata_errdetail());
    n = 0;
    for (uint32_t i = 0; i < e->n_items; i++) {
        struct item *it = &e->items[i];
        struct ereq *r = it->r;
        if (!r->n_draft) continue;
        if (!rv) {
            memcpy(r->draft, e->ditems[n++].out, r->n_draft * sizeof *r->draft);
            continue;
        }
        spec_draft_release(e->draft, &r->dseq);
        it->n -= r->n_draft;
        r->n_draft = 0;
    }
}

/* compute runs the window's forward pass and samples (outside the lock). Returns the error of
 * the pass, which ends every request of the window. */
static int compute(struct engine *e, uint32_t *n_tok)
{
    uint32_t n = 0, rows = 0;
    if (e->draft) draft_window(e);
    for (uint32_t i = 0; i < e->n_items; i++) {
        struct item *it = &e->items[i];
        struct ereq *r = it->r;
        it->sampled = it->from + it->n == r->n_hist + r->n_draft;
        it->n_res = 0;
        const uint32_t fed = it->n - r->n_draft; /* from hist; the drafts follow */
        for (uint32_t j = 0; j < it->n; j++)
            e->toks[n++] = (struct backend_token){
                &r->seq, j < fed ? r->hist[it->from + j] : r->draft[j - fed],
                it->sampled && j + 1 + r->n_draft >= it->n};
    }
    *n_tok = n;
    const bool posted = masks_post(e); /* made while the pass runs */
    int rv = backend_eval(e->be, e->toks, n, e->logits);
    if (posted) masks_wait(e);
    if (rv) return rv;
    for (uint32_t i = 0; i < e->n_items; i++) {
        struct item *it = &e->items[i];
        struct ereq *r = it->r;
        if (it->sampled) {
            /* Each position is sampled as plain decoding samples it (the draw is a function of
             * seed and position, the logits bit-exact); drafts count while they match. */
            const uint32_t d = r->n_draft, n0 = r->n_hist;
            for (uint32_t j = 0; j <= d; j++) {
                /* Penalties see the last generated tokens, those inside a resumed prompt too. */
                uint32_t w0 = r->n_hist - r->gen_start > ENGINE_PENALTY_WINDOW
                                  ? r->n_hist - ENGINE_PENALTY_WINDOW
                                  : r->gen_start;
                const float *lg = e->logits + (size_t)(rows + j) * e->m->hp.n_vocab;
                struct sample_result *res = &it->res[it->n_res];
                struct sample_params sp = r->sp;
                if (r->gm && (it->err = grammar_allow(e, r, j == 0 && it->pre ? i : UINT32_MAX,
                                                      &sp.allow)) != 0)
                    break;
                it->err = sample_token(e->smp, &sp, lg, r->hist + w0, r->n_hist - w0,
                                       r->n_hist, res);
                if (it->err || (r->gm && (it->err = grammar_advance(r, res->id)) != 0)) break;
                r->hist[r->n_hist++] = res->id;
                it->n_res++;
                if (j == d || res->id != r->draft[j] || is_stop(r, res->id) ||
                    r->n_hist - r->n_prompt == r->max_new || grammar_ended(r))
                    break;
            }
            rows += d + 1;
            /* the KV of rejected drafts goes: positions past the accepted ones */
            if (d && !it->err && r->seq.n_tokens > n0 + it->n_res - 1)
                kv_seq_resize(e->kv, &r->seq, n0 + it->n_res - 1);
            /* and the draft model's: it keeps the history and the accepted drafts */
            if (d && e->draft) spec_draft_keep(e->draft, &r->dseq, n0 + it->n_res - 1);
        }
        /* Full blocks go to the prefix cache; a block is full once the window wrote it (and
         * every draft in it was accepted). */
        while (!e->o.no_prefix_cache && (r->n_pub + 1) * e->bt <= r->seq.n_tokens) {
            r->pub_key = kv_prefix_publish(e->kv, &r->seq, r->n_pub, r->pub_key,
                                           r->hist + (size_t)r->n_pub * e->bt);
            r->n_pub++;
        }
    }
    return 0;
}


static void emit(struct engine *e, struct ereq *r, const struct sample_result *s, int64_t now,
                 uint32_t n_gen);

/* A window's speculative decoding, for the STRATA_DECODE_TIMING line. */
struct window_spec {
    uint32_t proposed, accepted; /* drafts verified, accepted */
    uint32_t passes, tokens;     /* decode steps and the tokens they sampled */
};

/* apply publishes the window's tokens and ends requests that stopped (under mu). */
static void apply(struct engine *e, int rv, uint32_t n_tok)
{
    const int64_t now = now_ns();
    struct window_spec ws = {0}, *w = &ws;
    e->st.windows++;
    e->rate_tokens += n_tok;
    if (now - e->rate_t0 >= 1000000000) {
        e->st.tokens_per_s = (double)e->rate_tokens * 1e9 / (double)(now - e->rate_t0);
        e->rate_tokens = 0;
        e->rate_t0 = now;
    }
    for (uint32_t i = 0; i < e->n_items; i++) {
        const struct item *it = &e->items[i];
        struct ereq *r = it->r;
        if (rv) {
            finish(e, r, ENGINE_FINISH_ERROR, rv);
            continue;
        }
        uint32_t end = it->from + it->n < r->n_admit ? it->from + it->n : r->n_admit;
        if (end > it->from) {
            r->tm.n_prefilled += end - it->from;
            e->st.tokens_prefilled += end - it->from;
        }
        if (!it->sampled) continue;
        if (r->n_draft) {
            const uint32_t acc = it->n_res ? it->n_res - 1 : 0;
            e->st.drafts_proposed += r->n_draft;
            e->st.drafts_accepted += acc;
            e->st.verify_passes++;
            r->tm.n_draft += r->n_draft;
            r->tm.n_draft_accepted += acc;
            w->proposed += r->n_draft;
            w->accepted += acc;
            spec_adapt_update(&r->spec, r->n_draft, acc);
        }
        if (it->from + 1 == r->n_hist - it->n_res) {
            e->st.decode_passes++;
            e->st.decode_tokens += it->n_res;
            r->tm.n_passes++;
            w->passes++;
            w->tokens += it->n_res;
        }
        /* the k-th token sits at hist[n_hist - n_res + k] */
        for (uint32_t k = 0; k < it->n_res && r->state == RQ_RUNNING; k++)
            emit(e, r, &it->res[k], now, r->n_hist - it->n_res + k + 1 - r->n_prompt);
        if (it->err && r->state == RQ_RUNNING) finish(e, r, ENGINE_FINISH_ERROR, it->err);
    }
    if (e->timing && e->k_max && !rv)
        LOG_INFO("spec window %llu: %u tokens, %u decode steps sampled %u tokens (%.2f a pass), "
                 "drafts %u accepted of %u (%.0f%%), %.2f accepted a step",
                 (unsigned long long)e->st.windows, n_tok, w->passes, w->tokens,
                 w->passes ? (double)w->tokens / w->passes : 0.0, w->accepted, w->proposed,
                 w->proposed ? 100.0 * w->accepted / w->proposed : 0.0,
                 w->passes ? (double)w->accepted / w->passes : 0.0);
}

/* emit publishes one sampled token of r, its n_gen-th generated, and ends r at a stop token or
 * its length (under mu). */
static void emit(struct engine *e, struct ereq *r, const struct sample_result *s, int64_t now,
                 uint32_t n_gen)
{
    {
        if (r->n_out == r->cap_out) {
            uint32_t cap = r->cap_out ? 2 * r->cap_out : 16;
            struct engine_token *o = realloc(r->out, (size_t)cap * sizeof *o);
            if (!o) {
                finish(e, r, ENGINE_FINISH_ERROR,
                       strata_errf(STRATA_ENOMEM, "out of memory for %u tokens", cap));
                return;
            }
            r->out = o;
            r->cap_out = cap;
        }
        struct engine_token *t = &r->out[r->n_out++];
        memset(t, 0, sizeof *t);
        t->id = s->id;
        if (r->logprobs) {
            t->logprob = s->logprob;
            t->n_top = s->n_top;
            memcpy(t->top, s->top, s->n_top * sizeof *s->top);
        }
        e->st.tokens_generated++;
        if (r->fresh) {
            r->fresh = false;
            r->tm.prefill_ms += ms(now - r->t_admit);
            if (!r->t_first) r->t_first = now;
        }
        if (is_stop(r, s->id))
            finish(e, r, ENGINE_FINISH_STOP, 0);
        else if (grammar_ended(r) && n_gen == r->n_hist - r->n_prompt) {
            r->grammar_end = true;
            finish(e, r, ENGINE_FINISH_STOP, 0);
        }
        else if (n_gen == r->max_new)
            finish(e, r, ENGINE_FINISH_LENGTH, 0);
    }
}

/* gauge copies the cache's counts for engine_status: the pool changes outside the lock during a
 * window, so other threads read this copy. */
static void gauge(struct engine *e)
{
    e->st.kv_blocks_total = kv_config_of(e->kv)->max_blocks;
    e->st.kv_blocks_free = kv_blocks_free(e->kv);
    e->st.kv_blocks_cached = kv_blocks_cached(e->kv);
    e->st.kv_blocks_used = e->st.kv_blocks_total - e->st.kv_blocks_free;
    if (e->be) backend_info(e->be, &e->info);
    if (e->draft) e->st.draft_passes = spec_draft_passes(e->draft);
}

static void notify(struct engine *e)
{
    atomic_fetch_add(&e->epoch, 1);
    if (e->o.on_window) e->o.on_window(e->o.window_ctx);
}

/* run_command runs the pending command on the decode thread, between windows (under mu on entry
 * and return; unlocked while it runs). */
static void run_command(struct engine *e)
{
    const int cmd = e->cmd;
    const uint64_t arg = e->cmd_arg;
    pthread_mutex_unlock(&e->mu);
    int rv = cmd == CMD_RESIZE ? backend_resize(e->be, arg) : backend_quiesce(e->be);
    pthread_mutex_lock(&e->mu);
    e->cmd_rv = rv;
    snprintf(e->cmd_msg, sizeof e->cmd_msg, "%s", rv ? strata_errdetail() : "");
    e->cmd_done = true;
    backend_info(e->be, &e->info);
    pthread_cond_broadcast(&e->cmd_cv);
}

static void *loop(void *arg)
{
    struct engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        if (e->stop) break;
        if (e->cmd != CMD_NONE && !e->cmd_done) run_command(e);
        bool changed = sweep(e);
        gauge(e);
        if (!e->n_running) {
            pthread_mutex_unlock(&e->mu);
            if (changed) notify(e);
            pthread_mutex_lock(&e->mu);
            if (e->stop) break;
            /* Idle: wake on submit or cancel, and often enough to end lapsed leases. */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += 50000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            if (e->cmd != CMD_NONE && !e->cmd_done) continue;
            if (e->all)
                pthread_cond_timedwait(&e->wake, &e->mu, &ts);
            else
                pthread_cond_wait(&e->wake, &e->mu);
            continue;
        }
        plan(e);
        uint32_t n_tok = 0;
        int rv = 0;
        if (e->n_items) {
            const int64_t t0 = now_ns();
            pthread_mutex_unlock(&e->mu);
            /* DESIGN 3.3's fence: a request start lands the adaptive tier's round in flight */
            if (e->fence && (rv = backend_quiesce(e->be)) == 0) e->fence = false;
            if (!rv) rv = compute(e, &n_tok);
            if (!rv) rv = backend_tick(e->be);
            /* and a failed window or round lands what the tier has in flight */
            if (rv) backend_quiesce(e->be);
            pthread_mutex_lock(&e->mu);
            e->st.window_s += (double)(now_ns() - t0) / 1e9;
            apply(e, rv, n_tok);
            gauge(e);
        }
        if (rv) LOG_ERROR("engine: a window of %u tokens failed: %s", n_tok, strata_errdetail());
        pthread_mutex_unlock(&e->mu);
        notify(e);
        pthread_mutex_lock(&e->mu);
    }
    /* a command that came too late gets an answer, not a hang */
    if (e->cmd != CMD_NONE && !e->cmd_done) {
        e->cmd_rv = STRATA_ESTATE;
        snprintf(e->cmd_msg, sizeof e->cmd_msg, "the engine is shutting down");
        e->cmd_done = true;
        pthread_cond_broadcast(&e->cmd_cv);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- API ------------------------------------------------------------------------------------- */

int engine_start(const struct model *m, const struct engine_opts *o, struct engine **out)
{
    struct engine *e = calloc(1, sizeof *e);
    if (!e) return strata_errf(STRATA_ENOMEM, "out of memory for the engine");
    int rv;
    e->m = m;
    e->o = *o;
    if (!e->o.max_running) e->o.max_running = 16;
    if (!e->o.max_queue) e->o.max_queue = 64;
    if (!e->o.max_batch_tokens) e->o.max_batch_tokens = 256;
    if (!e->o.reserve_pct) e->o.reserve_pct = 25;
    if (!e->o.orphan_timeout_ms) e->o.orphan_timeout_ms = 10000;
    if (e->o.max_batch_tokens < e->o.max_running)
        e->o.max_batch_tokens = e->o.max_running; /* room for every running request's step */
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->gv_mu, NULL);
    pthread_mutex_init(&e->gmu, NULL);
    pthread_cond_init(&e->gcv, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->wake, &ca);
    pthread_cond_init(&e->cmd_cv, NULL);
    pthread_condattr_destroy(&ca);
    struct backend_opts bo = o->backend;
    bo.n_threads = o->n_threads;
    bo.max_pass_tokens = e->o.max_batch_tokens;
    bo.n_ctx = o->n_ctx;
    bo.n_seq = e->o.max_running;
    bo.kv_blocks = o->kv_blocks;
    if ((rv = backend_start(m, &bo, &e->be)) != 0 ||
        (rv = sample_init(m->hp.n_vocab, &e->smp)) != 0 || (rv = sample_init(1, &e->check)) != 0)
        goto fail;
    e->kv = backend_kv(e->be);
    backend_info(e->be, &e->info);
    e->bt = kv_config_of(e->kv)->block_tokens;
    e->n_ctx = kv_config_of(e->kv)->n_ctx;
    e->n_layer = m->hp.n_layer;
    e->n_expert = m->hp.n_expert;
    if (e->n_expert && !(e->routed = calloc((size_t)e->n_layer * e->n_expert, sizeof *e->routed))) {
        rv = strata_errf(STRATA_ENOMEM, "engine: routing counts");
        goto fail;
    }
    backend_set_route(e->be, route, e);
    e->cap_waiting = e->o.max_queue + e->o.max_running;
    e->waiting = calloc(e->cap_waiting, sizeof *e->waiting);
    e->running = calloc(e->o.max_running, sizeof *e->running);
    e->items = calloc(e->o.max_running, sizeof *e->items);
    e->toks = calloc(e->o.max_batch_tokens, sizeof *e->toks);
    if (e->o.spec_lookup > ENGINE_MAX_DRAFT) e->o.spec_lookup = ENGINE_MAX_DRAFT;
    if (!e->o.spec_draft) e->o.spec_draft = 4;
    if (e->o.spec_draft > ENGINE_MAX_DRAFT) e->o.spec_draft = ENGINE_MAX_DRAFT;
    e->k_max = o->draft ? e->o.spec_draft : e->o.spec_lookup;
    e->st.spec = o->draft ? "draft" : e->k_max ? "lookup" : "off";
    const char *tv = getenv("STRATA_DECODE_TIMING");
    e->timing = tv && *tv && strcmp(tv, "0") != 0;
    if (o->draft) {
        const struct spec_draft_opts dopt = {.n_threads = e->o.n_threads,
                                             .n_ctx = e->n_ctx,
                                             .n_seq = e->o.max_running,
                                             .max_pass_tokens = e->o.max_batch_tokens};
        if ((rv = spec_draft_start(m, o->draft, &dopt, &e->draft)) != 0) goto fail;
        e->ditems = calloc(e->o.max_running, sizeof *e->ditems);
    }
    /* a row per sampled position: each decoding request's step and its drafts */
    e->logits = malloc((size_t)e->o.max_running * (1 + e->k_max) * m->hp.n_vocab *
                       sizeof *e->logits);
    e->allow = malloc(((size_t)m->hp.n_vocab + 31) / 32 * sizeof *e->allow);
    e->gmasks = malloc((size_t)e->o.max_running * ((m->hp.n_vocab + 31) / 32) * sizeof *e->gmasks);
    e->gerr = calloc(e->o.max_running, sizeof *e->gerr);
    if (!e->waiting || !e->running || !e->items || !e->toks || !e->logits || !e->allow ||
        !e->gmasks || !e->gerr || (o->draft && !e->ditems)) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for an engine of %u sequences",
                         e->o.max_running);
        goto fail;
    }
    e->rate_t0 = now_ns();
    /* without the mask thread (it did not start) masks are made after the pass */
    e->gth_started = pthread_create(&e->gth, NULL, mask_thread, e) == 0;
    int err = pthread_create(&e->th, NULL, loop, e);
    if (err) {
        rv = strata_errf(strata_errno(err), "cannot start the decode thread");
        goto fail;
    }
    e->th_started = true;
    *out = e;
    return 0;
fail:
    engine_close(e);
    return rv;
}

void engine_close(struct engine *e)
{
    if (!e) return;
    if (e->th_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_signal(&e->wake);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->th, NULL);
    }
    if (e->gth_started) {
        pthread_mutex_lock(&e->gmu);
        e->g_stop = true;
        pthread_cond_broadcast(&e->gcv);
        pthread_mutex_unlock(&e->gmu);
        pthread_join(e->gth, NULL);
    }
    while (e->all) {
        struct ereq *r = e->all;
        e->all = r->next;
        req_free(e, r);
    }
    spec_draft_close(e->draft);
    free(e->ditems);
    backend_close(e->be);
    sample_fini(e->smp);
    sample_fini(e->check);
    free(e->waiting);
    free(e->running);
    free(e->items);
    free(e->toks);
    free(e->logits);
    free(e->routed);
    free(e->allow);
    free(e->gmasks);
    free(e->gerr);
    for (uint32_t i = 0; i < ENGINE_GRAMMAR_CACHE; i++) {
        free(e->gc[i].text);
        grammar_matcher_fini(e->gc[i].proto);
    }
    grammar_vocab_fini(e->gv);
    pthread_mutex_destroy(&e->gv_mu);
    pthread_mutex_destroy(&e->gmu);
    pthread_cond_destroy(&e->gcv);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->wake);
    pthread_cond_destroy(&e->cmd_cv);
    free(e);
}

/* check_req validates what needs no lock. */
static int check_req(const struct engine *e, const struct engine_req *r)
{
    const uint32_t V = e->m->hp.n_vocab;
    size_t id_len = r->id ? strnlen(r->id, ENGINE_ID_MAX + 1) : 0;
    if (id_len == 0 || id_len > ENGINE_ID_MAX)
        return strata_errf(STRATA_EINVAL, "a request id must have 1 to %d bytes", ENGINE_ID_MAX);
    if (r->n_prompt == 0 || !r->prompt)
        return strata_errf(STRATA_EINVAL, "request %s has an empty prompt", r->id);
    if (r->n_prompt >= e->n_ctx)
        return strata_errf(STRATA_ELIMIT,
                           "request %s: a prompt of %u tokens leaves no room in the context of "
                           "%u: shorten it or raise the context",
                           r->id, r->n_prompt, e->n_ctx);
    const uint32_t pool = kv_config_of(e->kv)->max_blocks;
    if (blocks_for(e, r->n_prompt + 1) > pool)
        return strata_errf(STRATA_ELIMIT,
                           "request %s: a prompt of %u tokens needs %u KV blocks, the pool has "
                           "%u: shorten it or raise the KV cache",
                           r->id, r->n_prompt, blocks_for(e, r->n_prompt + 1), pool);
    if (r->n_generated > r->n_prompt || r->n_stop > ENGINE_MAX_STOP ||
        r->n_top > SAMPLE_MAX_LOGPROBS || (r->n_stop && !r->stop))
        return strata_errf(STRATA_EINVAL,
                           "request %s: n_generated %u (prompt %u), %u stop ids (at most %d), "
                           "n_top %u (at most %d)",
                           r->id, r->n_generated, r->n_prompt, r->n_stop, ENGINE_MAX_STOP, r->n_top,
                           SAMPLE_MAX_LOGPROBS);
    for (uint32_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || (uint32_t)r->prompt[i] >= V)
            return strata_errf(STRATA_EINVAL,
                               "request %s: prompt token %u is %d, outside the vocabulary of %u",
                               r->id, i, r->prompt[i], V);
    return 0;
}

static struct ereq *req_new(const struct engine *e, const struct engine_req *q)
{
    struct ereq *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    uint32_t room = e->n_ctx - q->n_prompt;
    r->max_new = q->max_tokens && q->max_tokens < room ? q->max_tokens : room;
    r->hist = malloc(((size_t)q->n_prompt + r->max_new) * sizeof *r->hist);
    spec_adapt_init(&r->spec, e->k_max);
    if (!r->hist) {
        free(r);
        return NULL;
    }
    memcpy(r->id, q->id, strlen(q->id) + 1);
    memcpy(r->hist, q->prompt, q->n_prompt * sizeof *r->hist);
    r->n_hist = r->n_prompt = q->n_prompt;
    r->gen_start = q->n_prompt - q->n_generated;
    r->sp = q->sp;
    r->sp.n_logprobs = q->logprobs ? q->n_top : 0;
    r->logprobs = q->logprobs;
    r->n_stop = q->n_stop;
    if (q->n_stop) memcpy(r->stop, q->stop, q->n_stop * sizeof *r->stop);
    kv_seq_init(&r->seq);
    r->pub_key = KV_PREFIX_ROOT;
    return r;
}

int engine_submit(struct engine *e, const struct engine_req *q)
{
    int rv = check_req(e, q);
    if (rv) return rv;
    /* the request is made and its grammar compiled before the lock: compiling takes a while */
    struct ereq *nr = req_new(e, q);
    if (!nr)
        return strata_errf(STRATA_ENOMEM, "out of memory for request %s of %u tokens", q->id,
                           q->n_prompt);
    if (q->grammar && (rv = grammar_compile(e, q, nr)) != 0) {
        req_free(e, nr);
        return rv;
    }
    const int64_t now = now_ns();
    pthread_mutex_lock(&e->mu);
    struct ereq *r = lookup(e, q->id);
    if (r) {
        r->lease_end = now + (int64_t)e->o.orphan_timeout_ms * 1000000;
        goto out;
    }
    const float zero = 0.0f;
    struct sample_result sr;
    struct sample_params sp = q->sp;
    sp.n_logprobs = 0;
    if ((rv = sample_token(e->check, &sp, &zero, NULL, 0, 0, &sr)) != 0) goto out;
    if (e->n_waiting >= e->o.max_queue) {
        rv = strata_errf(STRATA_EBUSY,
                         "request %s: %u requests are waiting (the queue's limit) behind %u "
                         "running: retry later or raise the queue",
                         q->id, e->n_waiting, e->n_running);
        goto out;
    }
    r = nr;
    nr = NULL;
    r->lease_end = now + (int64_t)e->o.orphan_timeout_ms * 1000000;
    r->t_queued = now;
    r->state = RQ_QUEUED;
    r->next = e->all;
    e->all = r;
    e->waiting[e->n_waiting++] = r;
    pthread_cond_signal(&e->wake);
out:
    pthread_mutex_unlock(&e->mu);
    if (nr) req_free(e, nr);
    return rv;
}

int engine_poll(struct engine *e, const char *id, uint32_t from, struct engine_update *out)
{
    pthread_mutex_lock(&e->mu);
    /* the clock is read under mu: read before, a request admitted (or its first token made)
     * while this waited for the lock had a later t_admit than now, and a negative prefill_ms
     * failed the client's whole poll */
    const int64_t now = now_ns();
    struct ereq *r = lookup(e, id);
    if (!r) {
        pthread_mutex_unlock(&e->mu);
        return strata_errf(STRATA_ENOENT,
                           "no request %s: never submitted, or forgotten after "
                           "its lease lapsed",
                           id);
    }
    r->lease_end = now + (int64_t)e->o.orphan_timeout_ms * 1000000;
    uint32_t n = from < r->n_out ? r->n_out - from : 0;
    if (n > out->cap) n = out->cap;
    if (n) memcpy(out->toks, r->out + from, n * sizeof *out->toks);
    out->n = n;
    out->n_total = r->n_out;
    out->finish = r->state == RQ_DONE && from + n >= r->n_out ? r->finish : ENGINE_FINISH_NONE;
    out->error = r->error;
    out->grammar_end = r->grammar_end;
    memcpy(out->error_msg, r->error_msg, sizeof out->error_msg);
    out->seed = r->sp.seed;
    out->t = r->tm;
    if (r->state == RQ_QUEUED) out->t.queue_ms += ms(now - r->t_queued);
    if (r->state == RQ_RUNNING && r->fresh) out->t.prefill_ms += ms(now - r->t_admit);
    if (r->t_first) out->t.decode_ms = ms((r->state == RQ_DONE ? r->t_last : now) - r->t_first);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int engine_cancel(struct engine *e, const char *id)
{
    pthread_mutex_lock(&e->mu);
    struct ereq *r = lookup(e, id);
    if (r) {
        r->cancel = true;
        pthread_cond_signal(&e->wake);
    }
    pthread_mutex_unlock(&e->mu);
    return r ? 0 : strata_errf(STRATA_ENOENT, "no request %s to cancel", id);
}

void engine_status(struct engine *e, struct engine_status *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    /* An idle engine's rate decays instead of keeping its last busy second's figure. */
    const int64_t idle = now_ns() - e->rate_t0;
    if (idle > 2000000000) out->tokens_per_s = (double)e->rate_tokens * 1e9 / (double)idle;
    out->running = e->n_running;
    out->queued = e->n_waiting;
    out->finished = e->n_finished;
    pthread_mutex_unlock(&e->mu);
}

int engine_routed(struct engine *e, uint64_t *out, uint32_t *n_layer, uint32_t *n_expert)
{
    *n_layer = e->n_layer;
    *n_expert = e->n_expert;
    if (!e->routed) return STRATA_EUNSUPPORTED;
    for (size_t i = 0; out && i < (size_t)e->n_layer * e->n_expert; i++)
        out[i] = atomic_load_explicit(&e->routed[i], memory_order_relaxed);
    return 0;
}

uint64_t engine_epoch(struct engine *e)
{
    return atomic_load(&e->epoch);
}

/* command queues cmd for the decode thread and waits until it has run; the error's detail is
 * carried back to this thread. */
static int command(struct engine *e, int cmd, uint64_t arg)
{
    pthread_mutex_lock(&e->mu);
    while (e->cmd != CMD_NONE)
        pthread_cond_wait(&e->cmd_cv, &e->mu);
    e->cmd = cmd;
    e->cmd_arg = arg;
    e->cmd_done = false;
    pthread_cond_signal(&e->wake);
    while (!e->cmd_done)
        pthread_cond_wait(&e->cmd_cv, &e->mu);
    int rv = e->cmd_rv;
    char msg[sizeof e->cmd_msg];
    memcpy(msg, e->cmd_msg, sizeof msg);
    e->cmd = CMD_NONE;
    pthread_cond_broadcast(&e->cmd_cv);
    pthread_mutex_unlock(&e->mu);
    return rv ? strata_errf(rv, "%s", msg) : 0;
}

int engine_quiesce(struct engine *e)
{
    return command(e, CMD_QUIESCE, 0);
}

int engine_resize(struct engine *e, uint64_t bytes)
{
    return command(e, CMD_RESIZE, bytes);
}

void engine_backend_info(struct engine *e, struct backend_info *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->info;
    pthread_mutex_unlock(&e->mu);
}
