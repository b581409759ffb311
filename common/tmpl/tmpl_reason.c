/* tmpl_reason — the reasoning/answer splitter: a small state machine over a held-back buffer.
 * See tmpl_reason.h. */
#include "common/tmpl/tmpl_reason.h"

#include "common/base/err.h"

#include <stdlib.h>
#include <string.h>

enum {
    ST_START,        /* think style: before "<think>", which may follow whitespace */
    ST_THINK_LSTRIP, /* just inside the reasoning: drop whitespace */
    ST_THINK,        /* inside the reasoning, until "</think>" */
    ST_CONTENT_LSTRIP,
    ST_CONTENT, /* everything is content */
    ST_HEADER,  /* channel style: "<|start|>assistant<|channel|>NAME" up to "<|message|>" */
    ST_BODY,    /* channel style: a message body, until an end marker */
};

#define HEADER_MAX 256 /* a header longer than this is not one: the text is plain content */

static const char OPEN[] = "<think>", CLOSE[] = "</think>", MESSAGE[] = "<|message|>";
static const char *const BODY_END[] = {"<|end|>", "<|return|>", "<|call|>", "<|start|>"};

static bool is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static int put(char **p, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *len + n + 1)
            c *= 2;
        char *q = realloc(*p, c);
        if (!q) return STRATA_ENOMEM;
        *p = q;
        *cap = c;
    }
    if (n) memcpy(*p + *len, s, n);
    *len += n;
    (*p)[*len] = 0;
    return 0;
}

static int emit(struct tmpl_reason_out *o, bool reasoning, const char *s, size_t n)
{
    if (reasoning) return put(&o->reasoning, &o->reasoning_len, &o->reasoning_cap, s, n);
    return put(&o->content, &o->content_len, &o->content_cap, s, n);
}

void tmpl_reason_out_free(struct tmpl_reason_out *o)
{
    free(o->content);
    free(o->reasoning);
    *o = (struct tmpl_reason_out){0};
}

enum tmpl_reason_style tmpl_reason_style_of(const char *src, size_t n)
{
    if (memmem(src, n, "<|channel|>", 11)) return TMPL_REASON_CHANNEL;
    if (memmem(src, n, OPEN, 7) || memmem(src, n, CLOSE, 8)) return TMPL_REASON_THINK;
    return TMPL_REASON_NONE;
}

bool tmpl_reason_prompt_opens(enum tmpl_reason_style style, const char *p, size_t n)
{
    while (n > 0 && is_ws(p[n - 1]))
        n--;
    const char *tag = style == TMPL_REASON_THINK     ? OPEN
                      : style == TMPL_REASON_CHANNEL ? "<|channel|>analysis<|message|>"
                                                     : NULL;
    size_t k = tag ? strlen(tag) : 0;
    return tag && n >= k && memcmp(p + n - k, tag, k) == 0;
}

void tmpl_reason_init(struct tmpl_reason_stream *s, enum tmpl_reason_style style, bool in_reasoning)
{
    *s = (struct tmpl_reason_stream){.style = style};
    if (style == TMPL_REASON_THINK)
        s->state = in_reasoning ? ST_THINK_LSTRIP : ST_START;
    else if (style == TMPL_REASON_CHANNEL)
        s->state = in_reasoning ? ST_BODY : ST_HEADER;
    else
        s->state = ST_CONTENT;
    s->to_reasoning = in_reasoning;
}

/* partial returns the length of the longest suffix of p[n] that is a proper prefix of tag. */
static size_t partial(const char *p, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t k = n < t - 1 ? n : t - 1; k > 0; k--)
        if (memcmp(p + n - k, tag, k) == 0) return k;
    return 0;
}

/* step consumes a prefix of the pending bytes; false when it needs more input. */
static int step(struct tmpl_reason_stream *s, struct tmpl_reason_out *o, bool final, bool *more)
{
    char *p = s->pend;
    size_t n = s->pend_len, used = 0;
    int rv = 0;
    *more = false;
    switch (s->state) {
    case ST_START: {
        size_t ws = 0;
        while (ws < n && is_ws(p[ws]))
            ws++;
        size_t rest = n - ws, k = rest < 7 ? rest : 7;
        if (memcmp(p + ws, OPEN, k) != 0 || (final && rest < 7)) {
            s->state = ST_CONTENT;
        } else if (rest >= 7) {
            used = ws + 7;
            s->state = ST_THINK_LSTRIP;
        } else {
            *more = true;
        }
        break;
    }
    case ST_THINK_LSTRIP:
    case ST_CONTENT_LSTRIP:
        while (used < n && is_ws(p[used]))
            used++;
        if (used < n)
            s->state = s->state == ST_THINK_LSTRIP ? ST_THINK : ST_CONTENT;
        else
            *more = true;
        break;
    case ST_THINK: {
        const char *hit = memmem(p, n, CLOSE, 8);
        if (hit) {
            rv = emit(o, true, p, (size_t)(hit - p));
            used = (size_t)(hit - p) + 8;
            s->state = ST_CONTENT_LSTRIP;
        } else {
            used = n - (final ? 0 : partial(p, n, CLOSE));
            rv = emit(o, true, p, used);
            *more = true;
        }
        break;
    }
    case ST_CONTENT:
        rv = emit(o, false, p, n);
        used = n;
        *more = true;
        break;
    case ST_HEADER: {
        const char *hit = memmem(p, n, MESSAGE, 11);
        if (hit) {
            s->to_reasoning = memmem(p, (size_t)(hit - p), "<|channel|>analysis", 19) != NULL;
            used = (size_t)(hit - p) + 11;
            s->state = ST_BODY;
        } else if (n >= HEADER_MAX || (n >= 2 && memcmp(p, "<|", 2) != 0) ||
                   (n == 1 && p[0] != '<') || final) {
            s->state = ST_CONTENT; /* not harmony markup: plain text */
        } else {
            *more = true;
        }
        break;
    }
    case ST_BODY: {
        const char *first = NULL;
        size_t flen = 0, keep = 0;
        for (size_t i = 0; i < sizeof BODY_END / sizeof *BODY_END; i++) {
            const char *h = memmem(p, n, BODY_END[i], strlen(BODY_END[i]));
            if (h && (!first || h < first)) {
                first = h;
                flen = strlen(BODY_END[i]);
            }
            size_t k = partial(p, n, BODY_END[i]);
            if (k > keep) keep = k;
        }
        if (first) {
            rv = emit(o, s->to_reasoning, p, (size_t)(first - p));
            /* "<|start|>" begins the next header: leave it there */
            used = (size_t)(first - p) + (memcmp(first, "<|start|>", 9) == 0 ? 0 : flen);
            s->state = ST_HEADER;
        } else {
            used = n - (final ? 0 : keep);
            rv = emit(o, s->to_reasoning, p, used);
            *more = true;
        }
        break;
    }
    }
    memmove(s->pend, s->pend + used, n - used);
    s->pend_len = n - used;
    return rv;
}

static int run(struct tmpl_reason_stream *s, struct tmpl_reason_out *o, bool final)
{
    bool more = false;
    int rv = 0;
    /* each step either consumes bytes, changes state, or asks for more: this ends */
    while (!rv && !more)
        rv = step(s, o, final, &more);
    return rv;
}

int tmpl_reason_feed(struct tmpl_reason_stream *s, const char *text, size_t n,
                     struct tmpl_reason_out *o)
{
    int rv = put(&s->pend, &s->pend_len, &s->pend_cap, text, n);
    if (rv) return rv;
    /* make sure both outputs exist, so callers can read them as strings */
    if ((rv = emit(o, false, "", 0)) != 0 || (rv = emit(o, true, "", 0)) != 0) return rv;
    return run(s, o, false);
}

int tmpl_reason_finish(struct tmpl_reason_stream *s, struct tmpl_reason_out *o)
{
    int rv = tmpl_reason_feed(s, "", 0, o);
    if (!rv) rv = run(s, o, true);
    free(s->pend);
    s->pend = NULL;
    s->pend_len = s->pend_cap = 0;
    return rv;
}

int tmpl_reason_split(enum tmpl_reason_style style, bool in_reasoning, const char *text, size_t n,
                      char **content, char **reasoning)
{
    struct tmpl_reason_stream s;
    struct tmpl_reason_out o = {0};
    int rv;
    tmpl_reason_init(&s, style, in_reasoning);
    if ((rv = tmpl_reason_feed(&s, text, n, &o)) != 0) {
        free(s.pend);
        goto fail;
    }
    if ((rv = tmpl_reason_finish(&s, &o)) != 0) goto fail;
    while (o.reasoning_len > 0 && is_ws(o.reasoning[o.reasoning_len - 1]))
        o.reasoning[--o.reasoning_len] = 0;
    *content = o.content;
    *reasoning = o.reasoning;
    return 0;
fail:
    tmpl_reason_out_free(&o);
    return rv;
}
