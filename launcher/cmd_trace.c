/* strata trace — `strata trace MODEL.gguf FILE [--json]`: records the model's routing over a text
 * and prints per-layer expert popularity, what a per-layer LRU expert cache of 25% and 50% of the
 * experts would hit replaying it, and each cache policy's hit rate replayed per window under the
 * tier's swap budget and copy lag at several cache sizes (tools/trace.h). */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/arena/model.h"
#include "common/tok/tok.h"
#include "gpu-worker/backend.h"
#include "launcher/cmd.h"
#include "tools/perplexity.h"
#include "tools/trace.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_TOP 3 /* experts named per layer in the table */

static const uint32_t cache_pct[] = {25, 50};
#define N_CACHE (sizeof cache_pct / sizeof cache_pct[0])

#define MAX_SIZES 8 /* --sizes entries */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata trace MODEL.gguf FILE [--json] [--ids] [--vocab TOK.gguf] [--ctx N]\n"
            "                    [--max-tokens N] [--threads N] [--save TRACE] [--sizes P,P,..]\n"
            "                    [--window N] [--lag N] [--adapt-every N] [--adapt-swaps N]\n"
            "                    [--adapt-decay F] [--adapt-min F] [--adapt-lead F]\n"
            "                    [--chunk-rule once|share]\n"
            "       strata trace --replay TRACE [the same analysis options]\n"
            "\n"
            "Runs FILE through the model on the CPU in windows of --ctx tokens, records which experts\n"
            "each layer routes every token to, and prints per layer: the entropy of the expert\n"
            "popularity (bits; log2(experts) is perfectly even), the most used experts and their\n"
            "share, and the hit rate of an LRU cache holding 25%% and 50%% of the layer's experts\n"
            "that replays the accesses in order, starting empty (even random routing gives about\n"
            "25%% and 50%%; more means locality a cache can use), and the reuse distances (tokens\n"
            "since the layer last picked the expert) beside those of a stream with the same\n"
            "popularity and no temporal order.\n"
            "Then it replays the trace per window through one pool of slots over all layers, as the\n"
            "worker runs its cache: rounds every --adapt-every windows of at most --adapt-swaps\n"
            "moves, a move picked after window W usable from window W+1+lag, under each policy:\n"
            "the adaptive tier's rule (tier_round, exactly the worker's), LRU, LFU, static (the\n"
            "trace's hottest experts, fixed) and Belady (offline, with bypass: the upper bound),\n"
            "and prints their hit rates per cache size.\n"
            "  --ids           FILE holds raw little-endian uint32 token ids; otherwise text\n"
            "  --vocab FILE    take the tokenizer from this GGUF rather than from MODEL\n"
            "  --ctx N         tokens per window, each from an empty context (default 256)\n"
            "  --max-tokens N  trace only the first N tokens\n"
            "  --save TRACE    also write the routing to TRACE (the trace file of tools/trace.h)\n"
            "  --replay TRACE  analyse a saved trace (strata trace --save, scripts/train-moe.py)\n"
            "                  instead of recording one: no model, no text\n"
            "  --threads N     compute threads (default: the online CPUs)\n"
            "  --sizes P,..    cache sizes in %% of all (layer, expert)s (default 10,25,50)\n"
            "  --window N      tokens a replayed window: 1 decode steps (default), more prompt\n"
            "                  chunks (each expert of a chunk counts once for the tier)\n"
            "  --lag N         windows a copy takes to land (default 1, the async tier; 0 blocking)\n"
            "  --chunk-rule R  how the tier counts an expert of a prompt chunk: once (default, the\n"
            "                  worker's rule) or share (its share of the chunk's tokens, at most 1)\n"
            "  --adapt-*       the tier's options, as the worker's (every 4, swaps 96, decay 0.7,\n"
            "                  min 2.0, lead 1.5)\n"
            "  --json          one JSON object: sizes, per layer counts, entropy and hit rates\n");
}


static uint32_t slots_for(uint32_t n_expert, uint32_t pct)
{
    uint32_t s = (n_expert * pct + 50) / 100;
    return s ? s : 1;
}

/* top_experts writes the N_TOP most used experts of counts (ties to the lower id) to top. */
static void top_experts(const uint64_t *counts, uint32_t n_expert, uint32_t top[N_TOP])
{
    for (uint32_t k = 0; k < N_TOP; k++) {
        top[k] = UINT32_MAX;
        for (uint32_t e = 0; e < n_expert; e++) {
            bool taken = false;
            for (uint32_t j = 0; j < k; j++)
                taken |= top[j] == e;
            if (!taken && (top[k] == UINT32_MAX || counts[e] > counts[top[k]])) top[k] = e;
        }
    }
}

struct replay_cfg {
    struct trace_replay_opts o;
    uint32_t pct[MAX_SIZES], n_sizes;
};

/* replay prints (or adds to root as "replay") every policy's hit rate at every size of cfg. */
static int replay(const struct trace *t, const struct replay_cfg *cfg, json_t *root)
{
    const uint32_t N = t->n_layer * t->n_expert;
    double rate[TRACE_N_POLICY][MAX_SIZES];
    uint32_t slots[MAX_SIZES];
    int rv;
    for (uint32_t k = 0; k < cfg->n_sizes; k++) {
        slots[k] = slots_for(N, cfg->pct[k]);
        for (int p = 0; p < TRACE_N_POLICY; p++) {
            uint64_t hits, acc;
            if ((rv = trace_replay(t, (enum trace_policy)p, slots[k], &cfg->o, &hits, &acc)) != 0)
                return rv;
            rate[p][k] = acc ? (double)hits / (double)acc : 0;
        }
    }
    const struct tier_opts *to = &cfg->o.tier;
    if (root) {
        json_t *r = json_pack("{s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:s}", "window", (int)cfg->o.window,
                              "lag", (int)cfg->o.lag, "every", (int)to->every, "swaps",
                              (int)to->swaps, "decay", (double)to->decay, "min",
                              (double)to->min_count, "lead", (double)to->lead, "chunk_rule",
                              cfg->o.chunk_share ? "share" : "once");
        json_t *sizes = json_array();
        if (!r || !sizes || json_object_set_new(r, "sizes", sizes) ||
            json_object_set_new(root, "replay", r)) {
            json_decref(r);
            return strata_errf(STRATA_ENOMEM, "out of memory for the JSON report");
        }
        for (uint32_t k = 0; k < cfg->n_sizes; k++) {
            json_t *sj = json_pack("{s:i, s:i}", "pct", (int)cfg->pct[k], "slots", (int)slots[k]);
            for (int p = 0; p < TRACE_N_POLICY && sj; p++)
                json_object_set_new(sj, trace_policy_name((enum trace_policy)p),
                                    json_real(rate[p][k]));
            if (!sj || json_array_append_new(sizes, sj))
                return strata_errf(STRATA_ENOMEM, "out of memory for the JSON report");
        }
        return 0;
    }
    printf("\nhit rates replayed per window (%u token%s a window, copies land %u window%s late; "
           "rounds every %u windows of at most %u moves; tier: decay %.2f, min %.2f, lead %.2f%s)\n",
           cfg->o.window, cfg->o.window == 1 ? "" : "s", cfg->o.lag, cfg->o.lag == 1 ? "" : "s",
           to->every, to->swaps, (double)to->decay, (double)to->min_count, (double)to->lead,
           cfg->o.window == 1 ? "" : cfg->o.chunk_share ? ", chunks by share" : ", chunks once");
    printf("%-8s", "policy");
    for (uint32_t k = 0; k < cfg->n_sizes; k++) {
        char label[32];
        snprintf(label, sizeof label, "%u%% (%u)", cfg->pct[k], slots[k]);
        printf("  %13s", label);
    }
    printf("\n");
    for (int p = 0; p < TRACE_N_POLICY; p++) {
        printf("%-8s", trace_policy_name((enum trace_policy)p));
        for (uint32_t k = 0; k < cfg->n_sizes; k++)
            printf("  %12.1f%%", 100.0 * rate[p][k]);
        printf("\n");
    }
    return 0;
}

static int report(const struct trace *t, uint32_t ctx, bool json, const struct replay_cfg *cfg)
{
    const double total = (double)t->n_tokens * t->n_used;
    uint64_t *counts = malloc(t->n_expert * sizeof *counts);
    uint64_t all_hits[N_CACHE] = {0}, all_acc[N_CACHE] = {0};
    json_t *root = NULL, *layers = NULL;
    if (!counts) return strata_errf(STRATA_ENOMEM, "out of memory");
    if (json) {
        root = json_pack("{s:I, s:i, s:i, s:i, s:i}", "tokens", (json_int_t)t->n_tokens, "n_layer",
                         (int)t->n_layer, "n_expert", (int)t->n_expert, "n_used", (int)t->n_used,
                         "ctx", (int)ctx);
        layers = json_array();
        if (!root || !layers || json_object_set_new(root, "layers", layers)) {
            json_decref(root);
            free(counts);
            return strata_errf(STRATA_ENOMEM, "out of memory for the JSON report");
        }
    } else {
        printf("%llu tokens, %u layers of %u experts, %u per token (windows of %u tokens)\n\n",
               (unsigned long long)t->n_tokens, t->n_layer, t->n_expert, t->n_used, ctx);
        char ent[32];
        snprintf(ent, sizeof ent, "entropy bits (of %.2f)", log2((double)t->n_expert));
        printf("%5s  %22s  %-36s  ", "layer", ent, "most used experts (share)");
        for (size_t c = 0; c < N_CACHE; c++) {
            char label[32];
            snprintf(label, sizeof label, "LRU %u%% (%u)", cache_pct[c],
                     slots_for(t->n_expert, cache_pct[c]));
            printf("  %12s", label);
        }
        printf("\n");
    }
    for (uint32_t l = 0; l < t->n_layer; l++) {
        trace_counts(t, l, counts);
        double h = trace_entropy(t, l), rate[N_CACHE];
        for (size_t c = 0; c < N_CACHE; c++) {
            uint64_t acc, hits = trace_lru(t, l, slots_for(t->n_expert, cache_pct[c]), &acc);
            rate[c] = acc ? (double)hits / (double)acc : 0;
            all_hits[c] += hits;
            all_acc[c] += acc;
        }
        if (json) {
            json_t *cj = json_array(),
                   *lj = json_pack("{s:i, s:f}", "layer", (int)l, "entropy_bits", h);
            for (uint32_t e = 0; e < t->n_expert && cj; e++)
                json_array_append_new(cj, json_integer((json_int_t)counts[e]));
            if (lj && cj) {
                json_object_set_new(lj, "counts", cj);
                for (size_t c = 0; c < N_CACHE; c++) {
                    char key[32];
                    snprintf(key, sizeof key, "lru_%u", cache_pct[c]);
                    json_object_set_new(lj, key, json_real(rate[c]));
                }
                json_array_append_new(layers, lj);
            } else {
                json_decref(cj);
                json_decref(lj);
            }
            continue;
        }
        uint32_t top[N_TOP];
        top_experts(counts, t->n_expert, top);
        printf("%5u  %22.3f  ", l, h);
        for (int k = 0; k < N_TOP; k++)
            printf(" e%-3u %5.1f%%", top[k],
                   total > 0 ? 100.0 * (double)counts[top[k]] / total : 0);
        printf("  ");
        for (size_t c = 0; c < N_CACHE; c++)
            printf("  %11.1f%%", 100.0 * rate[c]);
        printf("\n");
    }
    uint64_t hist[TRACE_REUSE_BUCKETS] = {0};
    double iid[TRACE_REUSE_BUCKETS] = {0}, reused = 0;
    for (uint32_t l = 0; l < t->n_layer; l++)
        trace_reuse(t, l, hist, iid);
    for (int b = 0; b < TRACE_REUSE_BUCKETS; b++)
        reused += (double)hist[b];
    int rv = 0;
    if (json) {
        json_t *rj = json_object(), *bj = json_array(), *tj = json_array(), *ij = json_array();
        for (int b = 0; b < TRACE_REUSE_BUCKETS && bj && tj && ij; b++) {
            json_array_append_new(bj, json_integer((json_int_t)1 << b));
            json_array_append_new(tj, json_real(reused > 0 ? (double)hist[b] / reused : 0));
            json_array_append_new(ij, json_real(reused > 0 ? iid[b] / reused : 0));
        }
        if (rj) {
            json_object_set_new(rj, "from", bj);
            json_object_set_new(rj, "trace", tj);
            json_object_set_new(rj, "iid", ij);
            json_object_set_new(root, "reuse", rj);
        } else {
            json_decref(bj);
            json_decref(tj);
            json_decref(ij);
        }
        for (size_t c = 0; c < N_CACHE; c++) {
            char key[32];
            snprintf(key, sizeof key, "lru_%u", cache_pct[c]);
            json_object_set_new(
                root, key, json_real(all_acc[c] ? (double)all_hits[c] / (double)all_acc[c] : 0));
        }
        if ((rv = replay(t, cfg, root)) != 0) {
            json_decref(root);
            free(counts);
            return rv;
        }
        char *s = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(9));
        if (s) printf("%s\n", s);
        free(s);
        json_decref(root);
    } else {
        printf("%5s  %22s  %36s  ", "all", "", "");
        for (size_t c = 0; c < N_CACHE; c++)
            printf("  %11.1f%%", all_acc[c] ? 100.0 * (double)all_hits[c] / (double)all_acc[c] : 0);
        printf("\n\nreuse distance, tokens since the layer last picked the expert (share of "
               "reuses)\n");
        printf("%-26s", "from");
        for (int b = 0; b < TRACE_REUSE_BUCKETS; b++)
            printf(" %6llu%s", 1ull << b, b + 1 < TRACE_REUSE_BUCKETS ? "" : "+");
        printf("\n%-26s", "this trace");
        for (int b = 0; b < TRACE_REUSE_BUCKETS; b++)
            printf(" %6.1f%%", reused > 0 ? 100.0 * (double)hist[b] / reused : 0);
        printf("\n%-26s", "same popularity, no order");
        for (int b = 0; b < TRACE_REUSE_BUCKETS; b++)
            printf(" %6.1f%%", reused > 0 ? 100.0 * iid[b] / reused : 0);
        printf("\n");
        rv = replay(t, cfg, NULL);
    }
    free(counts);
    return rv;
}

/* parse_sizes reads --sizes "P,P,.." (each 1..100) into cfg. */
static int parse_sizes(const char *s, struct replay_cfg *cfg)
{
    cfg->n_sizes = 0;
    for (const char *p = s;;) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 100 || cfg->n_sizes == MAX_SIZES || (*end && *end != ','))
            return strata_errf(STRATA_EINVAL,
                               "--sizes %s: give up to %d percentages from 1 to 100, "
                               "comma-separated (10,25,50)",
                               s, MAX_SIZES);
        cfg->pct[cfg->n_sizes++] = (uint32_t)v;
        if (!*end) return 0;
        p = end + 1;
    }
}

static int run(int argc, char **argv)
{
    const char *pos[2], *vocab = NULL, *save = NULL, *load = NULL;
    int npos = 0;
    bool raw_ids = false, json = false;
    uint32_t ctx = 256, max_tokens = 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t threads = cpus > 0 ? (uint32_t)cpus : 1;
    struct replay_cfg cfg = {.o = {.window = 1, .lag = 1, .tier = TIER_OPTS_DEFAULT},
                             .pct = {10, 25, 50},
                             .n_sizes = 3};
    struct backend_opts bo = {.tier = TIER_OPTS_DEFAULT};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint32_t *num = NULL, min = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--ids")) {
            raw_ids = true;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--vocab") && i + 1 < argc) {
            vocab = argv[++i];
        } else if (!strcmp(a, "--save") && i + 1 < argc) {
            save = argv[++i];
        } else if (!strcmp(a, "--replay") && i + 1 < argc) {
            load = argv[++i];
        } else if (!strcmp(a, "--ctx") && i + 1 < argc) {
            num = &ctx;
        } else if (!strcmp(a, "--max-tokens") && i + 1 < argc) {
            num = &max_tokens;
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            num = &threads;
        } else if (!strcmp(a, "--window") && i + 1 < argc) {
            num = &cfg.o.window;
        } else if (!strcmp(a, "--lag") && i + 1 < argc) {
            num = &cfg.o.lag;
            min = 0;
        } else if (!strcmp(a, "--sizes") && i + 1 < argc) {
            if (parse_sizes(argv[++i], &cfg)) {
                fprintf(stderr, "strata trace: %s\n", strata_errdetail());
                return 2;
            }
        } else if (!strcmp(a, "--chunk-rule") && i + 1 < argc) {
            const char *r = argv[++i];
            if (strcmp(r, "once") && strcmp(r, "share")) {
                fprintf(stderr, "strata trace: --chunk-rule %s: give once or share\n", r);
                return 2;
            }
            cfg.o.chunk_share = r[0] == 's';
        } else if (!strncmp(a, "--adapt-", 8) && i + 1 < argc) {
            /* the worker's own parser, so the ranges are the worker's */
            const int rv = backend_opt(&bo, a + 2, argv[++i]);
            if (rv) {
                fprintf(stderr, "strata trace: %s\n",
                        rv == STRATA_ENOENT ? "unknown --adapt- option" : strata_errdetail());
                return 2;
            }
        } else if (a[0] == '-' || npos == 2) {
            fprintf(stderr, "strata trace: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        } else {
            pos[npos++] = a;
        }
        if (num && strata_cmd_parse_u32(argv[++i], a, min, num)) {
            fprintf(stderr, "strata trace: %s %s: give a whole number >= %u\n", a, argv[i], min);
            return 2;
        }
    }
    if (npos != (load ? 0 : 2) || (load && save)) {
        if (load) fprintf(stderr, "strata trace: --replay takes no model, text or --save\n");
        usage(stderr);
        return 2;
    }
    cfg.o.tier = bo.tier;
    struct gguf_file *gf = NULL;
    struct model *m = NULL;
    struct tok *tk = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    struct trace t = {0};
    int status, rv;
    const char *what = load ? load : pos[0];
    if (load) {
        if ((rv = trace_load(load, &t, &ctx)) == 0) rv = report(&t, ctx, json, &cfg);
        goto fail;
    }
    if ((rv = gguf_open(pos[0], &gf)) != 0 || (rv = model_load(gf, &m)) != 0) goto fail;
    if (!raw_ids) {
        what = vocab ? vocab : pos[0];
        if ((rv = vocab ? tok_load(vocab, NULL, &tk) : tok_from_gguf(gf, NULL, &tk)) != 0)
            goto fail;
    }
    what = pos[1];
    if ((rv = ppl_read_tokens(pos[1], raw_ids, tk, &ids, &n)) != 0) goto fail;
    if (max_tokens && n > max_tokens) n = max_tokens;
    what = "tracing";
    if ((rv = trace_init(&t, m->hp.n_layer, m->hp.n_expert, m->hp.n_expert_used)) != 0 ||
        (rv = trace_record(m, ids, n, ctx, threads, &t)) != 0)
        goto fail;
    what = save;
    if (save && (rv = trace_save(&t, ctx, save)) != 0) goto fail;
    what = "tracing";
    rv = report(&t, ctx, json, &cfg);
fail:
    status = rv ? strata_cmd_fail("trace", what, rv) : 0;
    trace_fini(&t);
    free(ids);
    tok_fini(tk);
    model_fini(m);
    gguf_close(gf);
    return status;
}

const struct strata_cmd strata_cmd_trace = {
    "trace", "record expert routing over a text: popularity and each cache policy's hit rates", run};
