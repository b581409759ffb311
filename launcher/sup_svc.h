/* sup_svc — finding and reaching a running strata service by name, for `strata serve`, `strata
 * status` and `strata run --name`.
 *
 * A service lives in one runtime directory (docs/design.md §4: --runtime-dir, else
 * $XDG_RUNTIME_DIR/strata/NAME, else /tmp/strata-<uid>/NAME) holding the arena's control socket
 * `arena.ipc` (arena-server/arena_ctl.h), the workers' `worker-<n>.sock` (gpu-worker/worker.h)
 * and, while `strata serve` runs, its state file `serve.json` (supervisor pid, model, frontends and
 * workers with their pids). Nothing here creates a directory: a service that is not running is
 * STRATA_ENOENT. The functions that talk to a worker open nng sockets in the calling process, so
 * they must not run before a fork; any thread may call them.
 */
#ifndef STRATA_SUP_SVC_H
#define STRATA_SUP_SVC_H

#include "common/ipc/wclient.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SUP_SVC_URL_MAX    256
#define SUP_SVC_MAX_SOCKS  64 /* worker sockets looked at in one directory */
#define SUP_SVC_STATE_FILE "serve.json"

/* sup_svc_base writes the directory that holds every service's runtime directory
 * ($XDG_RUNTIME_DIR/strata or /tmp/strata-<uid>). STRATA_ELIMIT when it does not fit. */
int sup_svc_base(char *out, size_t cap);

/* sup_svc_dir writes service name's runtime directory: runtime_dir when given, else
 * sup_svc_base()/name. STRATA_EINVAL for a name that is not one path component, STRATA_ELIMIT. */
int sup_svc_dir(const char *runtime_dir, const char *name, char *out, size_t cap);

/* sup_svc_worker_url writes "ipc://DIR/worker-<i>.sock". STRATA_ELIMIT when too long for AF_UNIX.
 */
int sup_svc_worker_url(const char *dir, int i, char *out, size_t cap);

/* sup_svc_worker_urls lists the worker sockets in dir by their number, at most max of them, into
 * urls (each SUP_SVC_URL_MAX bytes) and returns how many in *n. A socket file may be stale (its
 * worker was killed): only a call tells. STRATA_ENOENT when dir does not exist. */
int sup_svc_worker_urls(const char *dir, char (*urls)[SUP_SVC_URL_MAX], int max, int *n);

/* sup_svc_find_worker writes the URL of the first worker socket in dir whose worker answers hello
 * within timeout_ms. STRATA_ENOENT (no directory or no worker answered: the detail says where it
 * looked and how to start one). */
int sup_svc_find_worker(const char *dir, int timeout_ms, char *url, size_t cap);

/* sup_svc_http_status sends `GET path HTTP/1.1` to host:port (an IPv4 or IPv6 literal or
 * "localhost") and writes the response's status code. Blocks up to timeout_ms in all. Returns 0,
 * STRATA_ETIMEDOUT, STRATA_EPROTO (not an HTTP response) or an errno error (ECONNREFUSED: nothing
 * listens yet). */
int sup_svc_http_status(const char *host, int port, const char *path, int timeout_ms, int *status);

/* What `strata run --name` asks a running service for. */
struct sup_svc_gen {
    const char *prompt; /* text, tokenized with the tokenizer of the worker's `meta` (BOS added,
                           special tokens parsed, as strata run does), or NULL with ids */
    const int32_t *ids; /* the prompt as token ids */
    size_t n_ids;
    uint32_t max_tokens; /* >= 1 */
    bool ignore_eos;     /* else the model's EOS ends it (and is the last id, as in strata run) */
    bool json;           /* print strata run's JSON line, else the text as it streams */
    uint32_t n_logprobs; /* alternatives per token in the JSON */
    struct wclient_sampling sampling; /* has_seed false: the worker picks one (printed) */
};

/* sup_svc_generate runs g on the worker at url with the restart-surviving stream of
 * common/ipc/wclient.h and prints what strata run prints: the text as it comes and a timing line on
 * stderr, or with json one line {"prompt_ids", "ids", "text", "top_logprobs", "seed",
 * "finish_reason"}. Blocks until the request ends. Returns 0, or the worker's, the tokenizer's or a
 * call's error (the detail says which). */
int sup_svc_generate(const char *url, const struct sup_svc_gen *g);

#endif
