/* fe_status — GET /status: the frontend's and its workers' figures as one JSON object, for the
 * monitor page (frontend/web/monitor.js, polling once a second) and `strata status`, which builds
 * each worker's part with the same fe_worker_json. The shape is docs/api.md's "Status".
 *
 * The handler never calls a worker: it answers from what the monitor thread read last (hello and
 * status every monitor_ms; vram and the routing heat too while someone read /status within the
 * last FE_STATUS_WATCH_MS), so a slow or dead worker cannot hold a page's request. Threads: the
 * handler runs on HTTP threads and copies under f->mu; fe_status_watch runs on the monitor thread.
 */
#ifndef STRATA_FE_STATUS_H
#define STRATA_FE_STATUS_H

#include "common/ipc/wclient.h"

#include <jansson.h>

struct fe;
struct fe_worker;
struct http_req;

/* fe_worker_json: one worker's hello and status as a JSON object (new reference; NULL on ENOMEM).
 * h or s may be NULL (not read yet): their keys are left out. */
json_t *fe_worker_json(const struct wclient_hello *h, const struct wclient_status *s);

/* fe_vram_json: a vram reply as {"total_bytes", "free_bytes", "weights_bytes", ...}. */
json_t *fe_vram_json(const struct wclient_vram *v);

/* fe_status_watch reads wk's vram and heat when /status was read recently (monitor thread,
 * without f->mu while calling; stores under it). */
void fe_status_watch(struct fe *f, struct fe_worker *wk);

/* fe_status_http answers GET /status. */
void fe_status_http(struct fe *f, struct http_req *r);

#endif
