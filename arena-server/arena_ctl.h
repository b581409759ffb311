/* arena_ctl — the arena-server's control socket (ipc:// in the runtime directory, see common/ipc/ipc.h)
 * and its client side.
 *
 * Ops: "status" (model, fingerprint, sizes, load time, counters, the worker registry with liveness
 * and heartbeat age), "inspect" (the layout per layer; `strata-arena inspect` reads the segment for
 * the blob-level view), "shutdown" {force} (answers, then makes arena_serve_run return). Handlers
 * run on nng's threads and only read the server, except shutdown which sets its stop flag.
 * The socket is `arena.ipc` in $XDG_RUNTIME_DIR/strata/NAME/ (or --runtime-dir).
 */
#ifndef STRATA_ARENA_CTL_H
#define STRATA_ARENA_CTL_H

#include "common/ipc/msg.h"

#include <stdbool.h>
#include <stddef.h>

struct arena_server;
struct arena_ctl;

/* arena_ctl_url makes the runtime directory of arena name (runtime_dir NULL: the default) and
 * writes the control socket's URL to out. Errors of ipc_runtime_dir / ipc_url. */
int arena_ctl_url(const char *runtime_dir, const char *name, char *out, size_t cap);

/* arena_ctl_start serves s's control socket. STRATA_EBUSY when another process serves it. */
int arena_ctl_start(struct arena_server *s, struct arena_ctl **out);

/* arena_ctl_stop closes the socket (no handler runs after it returns) and frees; NULL is fine. */
void arena_ctl_stop(struct arena_ctl *c);

/* arena_ctl_request sends op (with "force" when force) to arena name's server and waits at most
 * timeout_ms for the reply (msg_free it). STRATA_ENOENT when no server has a socket there,
 * STRATA_ETIMEDOUT when it does not answer, or the server's error. Opens nng: not before a fork. */
int arena_ctl_request(const char *runtime_dir, const char *name, const char *op, bool force,
                      int timeout_ms, struct msg *reply);

#endif
