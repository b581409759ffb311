/* perplexity — a model's perplexity on a token sequence, computed with the plain-C reference
 * forward pass (gpu-worker/fwd.h): `strata perplexity`.
 *
 * The window rule is tools/train_demo.py's, so the two figures compare: windows begin at tokens 0,
 * stride, 2*stride, ...; window [b, e = min(b + ctx, n)) is evaluated from an empty context; it
 * scores the tokens at [max(b + 1, end of the previous window), e), each predicted from the
 * window's tokens before it. The last window is the first to reach n. With stride == ctx the
 * windows do not overlap and each scores ctx - 1 tokens; with stride < ctx every token but the
 * first is scored once. Perplexity = exp(total NLL / scored tokens); NLLs are summed in double over
 * the float logits the forward pass gives. The model is borrowed; the caller's thread blocks; the
 * forward pass uses n_threads threads.
 */
#ifndef STRATA_PERPLEXITY_H
#define STRATA_PERPLEXITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/arena/model.h"

struct tok;

struct ppl_window {
    size_t begin, end; /* the tokens the model sees: [begin, end) */
    size_t first;      /* the first scored token; the window scores [first, end) */
};

struct ppl_opts {
    uint32_t ctx;       /* window length, >= 2 */
    uint32_t stride;    /* 1..ctx */
    uint32_t n_threads; /* forward-pass threads; 0 means 1 */
    /* progress, when not NULL, is called after each window with the running totals. */
    void (*progress)(void *arg, size_t window, size_t n_windows, double nll, uint64_t scored);
    void *arg;
};

struct ppl_result {
    double nll;        /* total negative log-likelihood, nats */
    uint64_t scored;   /* tokens scored */
    size_t n_windows;  /* windows evaluated */
    double perplexity; /* exp(nll / scored) */
};

/* ppl_read_file reads a whole file into a malloc'd buffer (NUL-terminated; *len excludes the NUL).
 * Errors: errno codes (the detail names the path), STRATA_ENOMEM. */
int ppl_read_file(const char *path, char **buf, size_t *len);

/* ppl_read_tokens reads the token sequence to score from path: with raw_ids, raw little-endian
 * uint32 ids (what train_demo.py reads and writes as heldout_ids.bin); otherwise text, encoded by
 * tk with no BOS and no special-token parsing, as the training ids were made. Caller frees *ids.
 * STRATA_EFORMAT for a raw file whose size is not a multiple of 4 or an id above INT32_MAX, the
 * reader's and tokenizer's errors. */
int ppl_read_tokens(const char *path, bool raw_ids, const struct tok *tk, int32_t **ids, size_t *n);

/* ppl_windows writes the windows of a sequence of n tokens (at most max of them to out, which may
 * be NULL) and returns how many there are: 0 when n < 2. ctx and stride as in ppl_opts. */
size_t ppl_windows(size_t n, uint32_t ctx, uint32_t stride, struct ppl_window *out, size_t max);

/* ppl_eval scores ids[0..n) with m. STRATA_EINVAL for ctx < 2, a stride outside 1..ctx, fewer than
 * 2 tokens or an id outside the vocabulary (the detail names it and its position); the forward
 * pass's errors (STRATA_ENOMEM, quant errors). */
int ppl_eval(const struct model *m, const int32_t *ids, size_t n, const struct ppl_opts *o,
             struct ppl_result *out);

#endif
