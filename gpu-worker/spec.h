/* spec — speculative decoding's drafters: prompt lookup (n-gram match in a sequence's own
 * history) and a draft model (a small model of the target's vocabulary on the CPU backend, with
 * its own KV cache), the adaptive draft count both use, and spec_seq: one sequence decoded with
 * drafts outside the engine (`strata run`, `strata bench`).
 *
 * The drafts of a window are verified by the target in one pass (engine.c, `strata run`, bench):
 * each position is sampled exactly as plain decoding samples it, and drafts count while they
 * match, so drafts change the speed, never the text. The draft model proposes greedily (argmax of
 * its logits, lowest id on a tie); its KV holds a sequence's history and the drafts it fed, and
 * after a verification spec_draft_keep drops the rejected ones.
 * Threads: a spec_draft belongs to one thread at a time (the decode thread); spec_lookup is
 * pure, a spec_adapt belongs to its sequence.
 */
#ifndef STRATA_SPEC_H
#define STRATA_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/arena/model.h"
#include "gpu-worker/kv.h"

#define SPEC_MAX_DRAFT 8 /* drafts verified per sequence and window */
#define SPEC_REST      8 /* decode steps without drafts after a single draft was rejected, */
#define SPEC_REST_MAX  64 /* doubled at each rest in a row, up to this */

/* spec_lookup drafts up to k tokens after hist[0..n) by prompt lookup: the most recent earlier
 * occurrence of the history's last 3 (else 2, else 1) tokens, and what followed it. Returns the
 * count written to out (0: no match). O(n) per call, beside a pass that reads every weight. */
uint32_t spec_lookup(const int32_t *hist, uint32_t n, uint32_t k, int32_t *out);

/* The adaptive draft count of one sequence: one more (up to max) after a step whose drafts were
 * all accepted, half after one whose drafts all were rejected; when a single draft is rejected
 * the sequence rests SPEC_REST steps without drafts (a draft that is never right costs a wider
 * pass each step, and a draft model its catching up), then tries one again; rests in a row
 * double, up to SPEC_REST_MAX, until a draft is accepted. spec_adapt_init first. */
struct spec_adapt {
    uint32_t k, max;
    uint32_t rest;     /* steps still to go without drafts */
    uint32_t next_rest; /* the next rest's length */
};

void spec_adapt_init(struct spec_adapt *a, uint32_t max);

/* spec_adapt_want: drafts to try this decode step (0 while resting: the step counts). */
uint32_t spec_adapt_want(struct spec_adapt *a);

/* spec_adapt_update: accepted of proposed drafts were accepted (proposed 0: nothing learnt). */
void spec_adapt_update(struct spec_adapt *a, uint32_t proposed, uint32_t accepted);

/* spec_vocab_check refuses a draft model whose vocabulary is not the target's: another size, or
 * (when both files carry tokenizer.ggml.tokens) another token at some id. STRATA_EINVAL with a
 * message naming both sizes or the first differing id. */
int spec_vocab_check(const struct model *target, const struct model *draft);

struct spec_draft_opts {
    uint32_t n_threads;       /* CPU threads of the draft's passes; 0 means 1 */
    uint32_t n_ctx;           /* positions per sequence (the target's context) */
    uint32_t n_seq;           /* sequences drafted for at once (the KV pool holds them all) */
    uint32_t max_pass_tokens; /* tokens of one draft pass (catching a sequence up); 0: 256 */
};

struct spec_draft;

/* spec_draft_start checks dm's vocabulary against target's (spec_vocab_check) and starts the
 * CPU backend on dm (borrowed: it must outlive the drafter). Errors: STRATA_EINVAL, the
 * backend's. Caller owns *out (spec_draft_close). */
int spec_draft_start(const struct model *target, const struct model *dm,
                     const struct spec_draft_opts *o, struct spec_draft **out);

/* spec_draft_close frees; every sequence must have been released with spec_draft_release. */
void spec_draft_close(struct spec_draft *d);

/* One sequence's share of spec_draft_propose. */
struct spec_draft_item {
    struct kv_seq *seq;   /* the sequence's block table in the drafter's KV (zeroed at first) */
    const int32_t *hist;  /* the sequence's tokens; its KV in seq must be a prefix of them */
    uint32_t n_hist;      /* >= 1 */
    uint32_t k;           /* drafts wanted, 1..SPEC_MAX_DRAFT */
    int32_t out[SPEC_MAX_DRAFT]; /* the drafts after hist */
};

/* spec_draft_propose catches each item's sequence up with its history (in passes of at most
 * max_pass_tokens, the items batched), then drafts k tokens for each: k passes, each item fed its
 * last token or draft. Afterwards seq holds hist and the first k - 1 drafts. Errors: the
 * backend's (STRATA_ENOSPC, STRATA_ELIMIT past the context); on error sequences may hold fewer
 * positions, never wrong ones. */
int spec_draft_propose(struct spec_draft *d, struct spec_draft_item *items, uint32_t n);

/* spec_draft_keep shrinks seq to at most n positions: after a verification, n is the history's
 * length before the window plus the drafts accepted. */
void spec_draft_keep(struct spec_draft *d, struct kv_seq *seq, uint32_t n);

/* spec_draft_release frees seq's blocks (the sequence ended). */
void spec_draft_release(struct spec_draft *d, struct kv_seq *seq);

/* spec_draft_passes: forward passes the drafter ran (its cost, for status). */
uint64_t spec_draft_passes(const struct spec_draft *d);

struct backend;

/* One sequence decoded with drafts outside the engine (`strata run`, bench): after each sampled
 * token, spec_seq_pass feeds it and up to k drafts in one pass, a row of logits each; the caller
 * samples the next position from row `row` and calls spec_seq_take with what it sampled: while
 * the drafts match, the next row holds the next position's logits and no pass is needed. */
struct spec_seq {
    struct backend *be;     /* the target's backend */
    struct spec_draft *sd;  /* the draft model, or NULL: prompt lookup */
    struct kv_seq *seq;     /* the sequence in be's KV */
    struct kv_seq dseq;     /* its KV in the draft model's (zeroed at first) */
    struct spec_adapt ad;   /* drafts to try (spec_adapt_init; max 0: plain decoding) */
    int32_t drafts[SPEC_MAX_DRAFT];
    uint32_t n_drafts, row; /* the last pass's drafts; row: the logits row to sample next */
    uint64_t proposed, accepted, passes; /* totals */
};

/* spec_seq_take: id was sampled from row; returns whether the next row holds the logits of the
 * position after it (the draft there was id), else a pass is due. */
bool spec_seq_take(struct spec_seq *s, int32_t id);

/* spec_seq_pass runs the pass after hist[0..n) (its last token not fed yet): drops the KV of the
 * last pass's rejected drafts in both models, drafts up to k (adapted to the last pass; within
 * `left` tokens still to sample, n_ctx and max_pass tokens a pass) and evaluates the token and its
 * drafts into rows of logits ((1 + k_max) rows of n_vocab). Sets row 0. Errors: the backends'. */
int spec_seq_pass(struct spec_seq *s, const int32_t *hist, uint32_t n, uint32_t left,
                  uint32_t n_ctx, uint32_t max_pass, float *logits);

/* spec_seq_fini releases the draft model's KV of the sequence. */
void spec_seq_fini(struct spec_seq *s);

#endif
