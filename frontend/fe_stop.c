/* fe_stop — stop strings on streamed text: hold back a possible prefix, cut at a match. */
#include "frontend/fe_stop.h"

#include "common/base/err.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int fe_stop_init(struct fe_stop *m, const char *const *stops, size_t n)
{
    memset(m, 0, sizeof *m);
    if (n > FE_STOP_CAP)
        return strata_errf(STRATA_EINVAL, "%zu stop strings: at most %d are supported", n,
                           FE_STOP_CAP);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(stops[i]);
        if (len == 0) continue;
        if (!(m->stop[m->n_stop] = strdup(stops[i]))) {
            fe_stop_fini(m);
            return strata_errf(STRATA_ENOMEM, "stop string of %zu bytes", len);
        }
        m->stop_len[m->n_stop++] = len;
    }
    return 0;
}

bool fe_stop_feed(struct fe_stop *m, const char *text, size_t n, const char **out, size_t *out_len)
{
    *out = "";
    *out_len = 0;
    if (m->matched) return true;
    /* drop what the previous call released (it sat in front of the held tail) */
    if (m->rel_len) {
        memmove(m->held, m->held + m->rel_len, m->held_len - m->rel_len);
        m->held_len -= m->rel_len;
        m->rel_len = 0;
    }
    if (m->held_len + n > m->held_cap) {
        size_t cap = m->held_cap ? m->held_cap : 256;
        while (cap < m->held_len + n)
            cap *= 2;
        char *p = realloc(m->held, cap);
        if (!p) {
            /* out of memory: release everything unmatched rather than lose text */
            *out = text;
            *out_len = n;
            return false;
        }
        m->held = p;
        m->held_cap = cap;
    }
    if (n) memcpy(m->held + m->held_len, text, n); /* held is NULL until the first bytes */
    m->held_len += n;
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < m->n_stop; i++) {
        const char *hit = m->held_len /* held is NULL until the first bytes */
                              ? memmem(m->held, m->held_len, m->stop[i], m->stop_len[i])
                              : NULL;
        if (hit && (size_t)(hit - m->held) < best) {
            best = (size_t)(hit - m->held);
            m->hit = (int)i;
        }
    }
    if (best != SIZE_MAX) {
        m->matched = true;
        *out = m->held;
        *out_len = best;
        return true;
    }
    /* the longest tail that some stop string begins with stays held */
    size_t keep = 0;
    for (size_t i = 0; i < m->n_stop; i++) {
        size_t k = m->stop_len[i] - 1 < m->held_len ? m->stop_len[i] - 1 : m->held_len;
        for (; k > keep; k--)
            if (memcmp(m->held + m->held_len - k, m->stop[i], k) == 0) break;
        if (k > keep) keep = k;
    }
    m->rel_len = m->held_len - keep;
    *out = m->held ? m->held : ""; /* never NULL: callers pass it on to fwrite and memcpy */
    *out_len = m->rel_len;
    return false;
}

const char *fe_stop_matched(const struct fe_stop *m)
{
    return m->matched ? m->stop[m->hit] : NULL;
}

void fe_stop_flush(struct fe_stop *m, const char **out, size_t *out_len)
{
    if (m->matched) {
        *out = "";
        *out_len = 0;
        return;
    }
    if (m->rel_len) {
        memmove(m->held, m->held + m->rel_len, m->held_len - m->rel_len);
        m->held_len -= m->rel_len;
    }
    m->rel_len = m->held_len;
    *out = m->held ? m->held : "";
    *out_len = m->held_len;
}

void fe_stop_fini(struct fe_stop *m)
{
    for (size_t i = 0; i < m->n_stop; i++)
        free(m->stop[i]);
    free(m->held);
    memset(m, 0, sizeof *m);
}
