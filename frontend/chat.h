/* chat — the command-line chat (`strata chat`, `strata-frontend chat`): reads lines, keeps the
 * conversation, renders it with the model's chat template, streams the answer as tokens come and
 * prints prefill and decode tok/s after each answer. An answer ends at an end-of-turn token, at
 * the model's stop strings (strata.stop) or at max_tokens. A conversation that outgrows the
 * context drops its oldest exchanges, and says so. `/reset` forgets the conversation, `/quit`
 * (or end of input) leaves.
 *
 * It talks to one worker directly through struct fe_backend (no HTTP); the model comes from the
 * worker's metadata, as for the HTTP frontend. Single-threaded; blocks on input and on the worker.
 */
#ifndef STRATA_CHAT_H
#define STRATA_CHAT_H

#include "frontend/fe.h"

#include <stdio.h>

#define CHAT_MAX_TOKENS 512 /* an answer's default length limit */

struct chat_opts {
    const char *chat_template; /* NULL: the model's */
    const char *system;        /* a system message to start each conversation with, or NULL */
    float temperature;         /* < 0: greedy */
    uint32_t max_tokens;       /* per answer; 0: CHAT_MAX_TOKENS (less where the context ends) */
    const char *worker_url;    /* where w is, for the model's name (fe_model_name); may be NULL */
    bool has_seed;
    uint64_t seed;
    FILE *in, *out; /* NULL: stdin, stdout */
    bool quiet;     /* no prompt marker and no statistics (scripts) */
};

/* chat_run holds a conversation on worker w until /quit or end of input. Returns 0, or the error
 * that made it stop (worker unreachable, model not buildable), after printing it to stderr. */
int chat_run(const struct chat_opts *o, const struct fe_backend *ops, void *w);

/* chat_main is the whole command: options (--worker URL | --arena NAME [--shm-dir DIR],
 * --chat-template, --system, --temperature, --max-tokens, --seed, --quiet, --help), then
 * chat_run. prog names the command in messages. Returns the exit status (0, 1, 2 for usage). */
int chat_main(const char *prog, int argc, char **argv);

#endif
