/* service_fuzz — the worker's message decoders on arbitrary bytes: the envelope (msg_decode), then
 * submit's, poll's and cancel's field validation, whatever the op says, so every field check is
 * reachable. Nothing may crash, read out of bounds or leak; an accepted submit must hold what the
 * limits promise the engine. */
#include "common/ipc/msg.h"
#include "gpu-worker/service.h"

#include <stdint.h>
#include <stdlib.h>

#define FUZZ_VOCAB 1000
#define FUZZ_CTX   512

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct msg m;
    if (msg_decode(data, size, &m) != 0) return 0;
    struct service_submit sub;
    if (service_parse_submit(&m, FUZZ_VOCAB, FUZZ_CTX, &sub) == 0) {
        const struct engine_req *r = &sub.req;
        if (!r->id || !r->id[0] || r->n_prompt == 0 || r->n_prompt >= FUZZ_CTX ||
            r->max_tokens == 0 || r->n_stop > WCLIENT_MAX_STOP || r->n_generated > r->n_prompt ||
            r->n_top > WCLIENT_MAX_TOP)
            abort();
        for (uint32_t i = 0; i < r->n_prompt; i++)
            if (r->prompt[i] < 0 || r->prompt[i] >= FUZZ_VOCAB) abort();
        for (uint32_t i = 0; i < r->n_stop; i++)
            if (r->stop[i] < 0 || r->stop[i] >= FUZZ_VOCAB) abort();
    }
    struct service_poll p;
    if (service_parse_poll(&m, &p) == 0) {
        if (p.n == 0 || p.n > WCLIENT_POLL_MAX_IDS || p.wait_ms < 0 ||
            p.wait_ms > WCLIENT_POLL_WAIT_MAX_MS)
            abort();
        for (uint32_t i = 0; i < p.n; i++)
            if (!p.ids[i][0]) abort();
    }
    const char *ids[WCLIENT_POLL_MAX_IDS];
    uint32_t n;
    if (service_parse_ids(&m, ids, &n) == 0 && (n == 0 || n > WCLIENT_POLL_MAX_IDS)) abort();
    msg_free(&m);
    return 0;
}
