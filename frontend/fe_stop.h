/* fe_stop — stop strings matched on generated text as it streams in.
 *
 * The frontend ends a request when its detokenized text contains one of the client's stop strings
 * (OpenAI's `stop`). Text arrives in pieces, and a stop string may straddle two pieces, so the
 * matcher holds back the longest tail of the text that is a prefix of some stop string and
 * releases it once the next piece shows it is not one. On a match, the text before the stop is
 * released and the rest (the stop string and anything after it) is dropped, as OpenAI does.
 * A matcher belongs to one request and one thread; it copies the stop strings.
 */
#ifndef STRATA_FE_STOP_H
#define STRATA_FE_STOP_H

#include <stdbool.h>
#include <stddef.h>

#define FE_STOP_MAX       16 /* stop strings a request may give */
#define FE_STOP_MODEL_MAX 4  /* stop strings the model adds (fe_model's strata.stop) */
#define FE_STOP_CAP       (FE_STOP_MAX + FE_STOP_MODEL_MAX)

struct fe_stop {
    char *stop[FE_STOP_CAP];
    size_t stop_len[FE_STOP_CAP];
    size_t n_stop;
    char *held; /* [released by the last call | held back: a possible start of a stop string] */
    size_t held_len, held_cap;
    size_t rel_len; /* the front of held released by the last call (dropped by the next) */
    bool matched;
    int hit; /* the index in stop[] of the string that matched (valid once matched) */
};

/* fe_stop_init copies the n stop strings (n <= FE_STOP_CAP; empty strings are ignored).
 * STRATA_EINVAL for too many, STRATA_ENOMEM. On failure m holds nothing. */
int fe_stop_init(struct fe_stop *m, const char *const *stops, size_t n);

/* fe_stop_feed adds text[n] and sets *out and *out_len to the text that is now certain (a pointer
 * into m or to "", never NULL, valid until the next call). Returns true when a stop string matched:
 * *out is then the last text to show and the request should end. After a match every feed releases
 * nothing. */
bool fe_stop_feed(struct fe_stop *m, const char *text, size_t n, const char **out, size_t *out_len);

/* fe_stop_matched returns the stop string that matched (owned by m), or NULL before a match. */
const char *fe_stop_matched(const struct fe_stop *m);

/* fe_stop_flush releases what is held back (the text ended without a match). */
void fe_stop_flush(struct fe_stop *m, const char **out, size_t *out_len);

/* fe_stop_fini frees m; a zeroed m is fine. */
void fe_stop_fini(struct fe_stop *m);

#endif
