#include "tools/grammar_bench.h"
#include "common/base/err.h"
#include "common/grammar/grammar.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(next(s) % n);
}

static uint64_t hash(const char *p, uint32_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h | 1;
}

int gbench_synthetic_vocab(uint32_t n, uint64_t seed, struct grammar_vocab **out)
{
    /* letters by English frequency, punctuation as code and JSON have it */
    static const char letters[] = "eeeeeeeeeeeettttttttaaaaaaaooooooiiiiiinnnnnnssssssrrrrrhhhhh"
                                  "lllldddcccuuummmwwffggyyppbbvkjxqz";
    static const char punct[] = "{}[]\":,.;()<>=-_/+*&|!?'#@$%\n\t ";
    const uint32_t cap_tab = 1u << 22;
    uint64_t *tab = calloc(cap_tab, sizeof *tab);
    char *blob = malloc((size_t)n * 16 + 256);
    const char **ptr = malloc((size_t)n * sizeof *ptr);
    uint32_t *len = malloc((size_t)n * sizeof *len);
    int rv = STRATA_ENOMEM;
    if (!tab || !blob || !ptr || !len || n < 256 || n > cap_tab / 4) goto out;
    size_t at = 0;
    uint32_t k = 0;
    for (; k < 256; k++) { /* the byte tokens */
        blob[at] = (char)k;
        ptr[k] = blob + at;
        len[k] = 1;
        at++;
    }
    while (k < n) {
        char t[16];
        uint32_t m = 0;
        const uint32_t form = below(&seed, 100);
        if (form < 70) { /* a word, most with a leading space, some capitalized */
            if (form < 45) t[m++] = ' ';
            const uint32_t wl = 2 + below(&seed, 6) + below(&seed, 5);
            for (uint32_t i = 0; i < wl && m < 15; i++)
                t[m++] = letters[below(&seed, sizeof letters - 1)];
            if (form >= 60) t[0] &= ~0x20; /* no leading space past 45 */
        } else if (form < 85) {            /* punctuation runs, JSON fragments */
            const uint32_t pl = 1 + below(&seed, 4);
            for (uint32_t i = 0; i < pl; i++)
                t[m++] = punct[below(&seed, sizeof punct - 1)];
        } else if (form < 93) { /* numbers */
            if (below(&seed, 2)) t[m++] = ' ';
            const uint32_t dl = 1 + below(&seed, 3);
            for (uint32_t i = 0; i < dl; i++)
                t[m++] = (char)('0' + below(&seed, 10));
        } else { /* code-like: a word and punctuation */
            const uint32_t wl = 1 + below(&seed, 6);
            for (uint32_t i = 0; i < wl; i++)
                t[m++] = letters[below(&seed, sizeof letters - 1)];
            t[m++] = punct[below(&seed, 12)];
        }
        uint64_t h = hash(t, m);
        uint32_t slot = (uint32_t)(h & (cap_tab - 1));
        bool dup = false;
        for (; tab[slot]; slot = (slot + 1) & (cap_tab - 1))
            if (tab[slot] == h) {
                dup = true;
                break;
            }
        if (dup) continue;
        tab[slot] = h;
        memcpy(blob + at, t, m);
        ptr[k] = blob + at;
        len[k++] = m;
        at += m;
    }
    rv = grammar_vocab_init(n, ptr, len, out);
out:
    free(tab);
    free(blob);
    free(ptr);
    free(len);
    return rv;
}

/* now_us: the thread's CPU time, so other load on the machine does not count */
static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int gbench_run(const struct grammar_vocab *v, const char *gbnf, uint32_t requests,
               uint32_t max_tokens, uint64_t seed, struct gbench_result *out)
{
    memset(out, 0, sizeof *out);
    struct grammar *g = NULL;
    int rv = grammar_parse(gbnf, strlen(gbnf), &g);
    if (rv) return rv;
    const uint32_t n = grammar_vocab_size(v), words = (n + 31) / 32;
    double *t = malloc(((size_t)requests * max_tokens + 1) * sizeof *t);
    uint32_t *mask = malloc((size_t)words * sizeof *mask);
    struct grammar_matcher *proto = NULL;
    if (!t || !mask || (rv = grammar_matcher_init(g, v, &proto)) != 0) {
        free(t);
        free(mask);
        grammar_fini(g);
        return rv ? rv : STRATA_ENOMEM;
    }
    uint32_t nt = 0;
    for (uint32_t r = 0; r < requests && rv == 0; r++) {
        struct grammar_matcher *m;
        if ((rv = grammar_matcher_fork(proto, &m)) != 0) break;
        for (uint32_t i = 0; i < max_tokens && !grammar_matcher_done(m); i++) {
            /* a complete sentence ends like a sampled stop token would, now and then */
            if (grammar_matcher_accepting(m) && below(&seed, 4) == 0) break;
            double t0 = now_us();
            rv = grammar_matcher_mask_into(m, mask);
            double t1 = now_us();
            if (rv) break;
            uint32_t count = 0;
            for (uint32_t w = 0; w < words; w++)
                count += (uint32_t)__builtin_popcount(mask[w]);
            if (count == 0) {
                rv = strata_errf(STRATA_EINVAL, "grammar bench: no token continues the grammar");
                break;
            }
            uint32_t pick = below(&seed, count), id = 0;
            for (uint32_t w = 0;; w++) {
                const uint32_t c = (uint32_t)__builtin_popcount(mask[w]);
                if (pick >= c) {
                    pick -= c;
                    continue;
                }
                uint32_t bits = mask[w];
                while (pick--)
                    bits &= bits - 1;
                id = w * 32 + (uint32_t)__builtin_ctz(bits);
                break;
            }
            double t2 = now_us();
            if ((rv = grammar_matcher_accept_token(m, (int32_t)id)) != 0) break;
            t[nt++] = (t1 - t0) + (now_us() - t2);
        }
        struct grammar_stats st;
        grammar_matcher_stats(m, &st);
        out->masks_built += st.masks_built;
        out->mask_hits += st.mask_hits;
        grammar_matcher_fini(m);
        out->requests++;
    }
    if (rv == 0 && nt) {
        double sum = 0;
        for (uint32_t i = 0; i < nt; i++)
            sum += t[i];
        qsort(t, nt, sizeof *t, cmp_d);
        out->tokens = nt;
        out->mean_us = sum / nt;
        out->p50_us = t[nt / 2];
        out->p99_us = t[(size_t)((nt - 1) * 0.99)];
        out->max_us = t[nt - 1];
    }
    free(t);
    free(mask);
    grammar_matcher_fini(proto);
    grammar_fini(g);
    return rv;
}
