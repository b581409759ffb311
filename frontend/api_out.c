/* api_out — the translated APIs' parse entry and named server-sent events. */
#include "frontend/api_out.h"

#include "common/base/err.h"

#include <stdlib.h>
#include <string.h>

unsigned api_parse_translated(enum api_kind kind, api_translate_fn translate, const char *body,
                              size_t len, uint32_t n_vocab, struct api_params *p,
                              struct api_error *e)
{
    json_t *in, *chat = NULL;
    unsigned st = api_load(body, len, &in, e);
    if (st == 0) st = translate(in, &chat, e);
    json_decref(in);
    if (st != 0) {
        memset(p, 0, sizeof *p);
        p->root = chat;
        return st;
    }
    return api_parse_root(kind, chat, n_vocab, p, e);
}

static int put(struct api_sse *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return strata_errf(STRATA_ENOMEM, "frontend: %zu bytes of events", cap);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

int api_sse_event(struct api_sse *b, const char *name, json_t *data)
{
    /* JSON_ENCODE_ANY: without it jansson dumps no scalar, which would read as out of memory */
    char *s = data ? json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(8))
                   : NULL;
    json_decref(data);
    if (!s) return strata_errf(STRATA_ENOMEM, "frontend: an event");
    int rv = 0;
    if (name && ((rv = put(b, "event: ", 7)) != 0 || (rv = put(b, name, strlen(name))) != 0 ||
                 (rv = put(b, "\n", 1)) != 0))
        goto out;
    if ((rv = put(b, "data: ", 6)) == 0 && (rv = put(b, s, strlen(s))) == 0) rv = put(b, "\n\n", 2);
out:
    free(s);
    return rv;
}

void api_sse_free(struct api_sse *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

json_t *api_str(const char *s, size_t n)
{
    json_t *j = api_lossy_string(s ? s : "", s ? n : 0);
    return j ? j : json_string("");
}
