#include "gpu-worker/backend.h"
#include "arena-server/arena_build.h"
#include "common/arena/arena.h"
#include "common/arena/arena_layout.h"
#include "common/base/err.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Answers do not depend on the tier (DESIGN 3.4): the logits of every position of three
 * interleaved streams (prompt chunks and decode steps in shared windows), with the expert cache
 * at 1 slot, 10%, 50% and 100% of the experts, static or with an adaptive tier that swaps every
 * window, resized mid-run, from a GGUF file or an arena, equal byte for byte to the logits without
 * a cache. A copy hook that flips one byte of every copy must make them differ (the test sees a
 * bad copy), and --cache-verify must then refuse those copies and keep the logits exact. */

static uint32_t g_tick_errors; /* ticks that failed, where a test allows it (g_tick_fail_ok) */
static bool g_tick_fail_ok;

#define N_SEQ  3
#define N_STEP 12 /* windows: each stream feeds a chunk, then decodes */

struct env {
    char path[600];
    struct gguf_file *f;
    struct model *m;
    /* the arena of the same file, for the arena path */
    char shm[600];
    struct arena *a;
    struct gguf_file *meta;
    struct model *ma;
    uint32_t V, total;
    size_t n_rows; /* logits rows the script asks for */
    float *base;
};

/* script runs the same windows on b: step s gives stream q a chunk of (q + s) % 4 + 1 tokens
 * while it is in its prompt (the first 3 steps), then one decode token; every token asks for its
 * logits. resize_at: the step before which the cache is shrunk to 2 slots and grown back (0:
 * none). Writes every row into out (n_rows). */
static size_t script(struct env *e, struct backend *b, float *out, uint32_t resize_at,
                     uint64_t slot_bytes, uint32_t slots)
{
    struct kv_seq seq[N_SEQ];
    for (int q = 0; q < N_SEQ; q++)
        kv_seq_init(&seq[q]);
    struct backend_token t[64];
    size_t rows = 0;
    for (uint32_t s = 0; s < N_STEP; s++) {
        if (resize_at && s == resize_at) {
            ck_assert_msg(backend_resize(b, 2 * slot_bytes) == 0, "%s", strata_errdetail());
            struct backend_info bi;
            backend_info(b, &bi);
            ck_assert_uint_eq(bi.cache_slots, 2);
            ck_assert_uint_le(bi.resident, 2);
            ck_assert_msg(backend_resize(b, slots * slot_bytes) == 0, "%s", strata_errdetail());
        }
        uint32_t n = 0;
        for (int q = 0; q < N_SEQ; q++) {
            const uint32_t c = s < 3 ? (q + s) % 4 + 1 : 1;
            for (uint32_t j = 0; j < c; j++)
                t[n++] = (struct backend_token){
                    &seq[q], (int32_t)((s * 131u + q * 977u + j * 31u + 7) % e->V), out != NULL};
        }
        ck_assert_msg(backend_eval(b, t, n, out ? out + rows * e->V : NULL) == 0, "%s",
                      strata_errdetail());
        const int rv = backend_tick(b);
        if (g_tick_fail_ok && rv == STRATA_EIO)
            g_tick_errors++;
        else
            ck_assert_msg(rv == 0, "%s", strata_errdetail());
        rows += n;
    }
    for (int q = 0; q < N_SEQ; q++)
        kv_seq_fini(backend_kv(b), &seq[q]);
    return rows;
}

static struct backend *start(const struct model *m, const struct backend_opts *extra)
{
    struct backend_opts o = *extra;
    o.n_threads = 2;
    o.max_pass_tokens = 32;
    o.n_ctx = 64;
    o.n_seq = N_SEQ;
    struct backend *b;
    ck_assert_msg(backend_start(m, &o, &b) == 0, "%s", strata_errdetail());
    return b;
}

/* build_arena plans and builds the file's arena in this test's shm directory and opens it. */
static void build_arena(struct env *e)
{
    snprintf(e->shm, sizeof e->shm, "%s/shm", test_tmpdir());
    test_arena_build(e->f, e->path, e->shm, "cachetest", &e->a);
    ck_assert_int_eq(arena_meta(e->a, &e->meta), 0);
    ck_assert_msg(model_load_arena(e->a, e->meta, &e->ma) == 0, "%s", strata_errdetail());
}

static void env_open(struct env *e, const char *arch)
{
    snprintf(e->path, sizeof e->path, "%s/cache-%s.gguf", test_tmpdir(), arch);
    struct fixture_opts fo = {.arch = arch, .seed = 21, .zipf = 1.1};
    ck_assert_msg(fixture_write(&fo, e->path) == 0, "%s", strata_errdetail());
    ck_assert_int_eq(gguf_open(e->path, &e->f), 0);
    ck_assert_msg(model_load(e->f, &e->m) == 0, "%s", strata_errdetail());
    e->V = e->m->hp.n_vocab;
    e->total = 0; /* experts that exist: a dense layer (glm4moe) has none */
    for (uint32_t l = 0; l < e->m->hp.n_layer; l++)
        e->total += e->m->layers[l].dense ? 0 : e->m->hp.n_expert;
    struct backend_opts none = {0};
    struct backend *b = start(e->m, &none);
    e->n_rows = script(e, b, NULL, 0, 0, 0);
    backend_close(b);
    e->base = malloc(e->n_rows * e->V * sizeof(float));
    b = start(e->m, &none);
    script(e, b, e->base, 0, 0, 0);
    backend_close(b);
    build_arena(e);
}

static void env_close(struct env *e)
{
    free(e->base);
    model_fini(e->ma);
    gguf_close(e->meta);
    arena_close(e->a);
    char seg[300], p[1000];
    shm_name(seg, sizeof seg, "cachetest", "");
    snprintf(p, sizeof p, "%s/%s", e->shm, seg);
    unlink(p);
    rmdir(e->shm);
    model_fini(e->m);
    gguf_close(e->f);
    unlink(e->path);
}

/* run: the script with the cache of opts, compared with the baseline; returns the info. */
static struct backend_info run(struct env *e, const struct model *m, struct backend_opts *o,
                               uint32_t resize_at, bool want_equal, const char *what)
{
    float *got = malloc(e->n_rows * e->V * sizeof(float));
    struct backend *b = start(m, o);
    struct backend_info bi;
    backend_info(b, &bi);
    script(e, b, got, resize_at, bi.slot_bytes, bi.cache_slots);
    ck_assert_int_eq(backend_quiesce(b), 0); /* lands the copies still in flight */
    backend_info(b, &bi);
    size_t differ = 0;
    for (size_t r = 0; r < e->n_rows; r++)
        differ += memcmp(got + r * e->V, e->base + r * e->V, e->V * sizeof(float)) != 0;
    if (want_equal)
        ck_assert_msg(differ == 0, "%s: %zu of %zu logits rows differ from no cache", what, differ,
                      e->n_rows);
    else
        ck_assert_msg(differ > 0, "%s: a corrupted copy left every logit unchanged", what);
    backend_close(b);
    free(got);
    return bi;
}

static void flip_byte(void *ctx, uint32_t slot, uint8_t *dst, uint64_t bytes)
{
    dst[bytes / 3] ^= 0x10; /* a byte inside the gate or up part's blocks */
}

static void independence(const char *arch)
{
    struct env e;
    env_open(&e, arch);
    const struct tier_opts none = {0}, busy = {.every = 1, .swaps = 8, .decay = 0.9f,
                                               .min_count = 0.5f, .lead = 0.25f};
    struct tier_opts async = busy;
    async.async = true;
    /* copies held 2 ms each: without ASYNC_WAIT they land windows after they were posted */
    const struct copy_hooks stretch = {.hold_ms = 2};
    static const char *const modes[] = {"static", "blocking", "async", "async, no wait"};
    const uint32_t sizes[] = {1, (e.total + 9) / 10, e.total / 2, e.total};
    for (int model = 0; model < 2; model++) {
        const struct model *m = model ? e.ma : e.m;
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            for (int adapt = 0; adapt < 4; adapt++) {
                struct backend_opts o = {.expert_cache = {CACHE_SLOTS, sizes[i]},
                                         .tier = adapt == 0 ? none : adapt == 1 ? busy : async,
                                         .cache_verify = true,
                                         .copy_hooks = adapt == 3 ? &stretch : NULL};
                setenv("STRATA_ADAPT_ASYNC_WAIT", adapt == 3 ? "0" : "1", 1);
                char what[128];
                snprintf(what, sizeof what, "%s %s, %u slots, %s tier", arch,
                         model ? "arena" : "file", sizes[i], modes[adapt]);
                struct backend_info bi = run(&e, m, &o, adapt && i == 2 ? 5 : 0, true, what);
                ck_assert_uint_eq(bi.verify_failures, 0);
                ck_assert_uint_gt(bi.hits, 0);
                if (sizes[i] == e.total) ck_assert_uint_eq(bi.misses, 0);
                /* blocking and ASYNC_WAIT rounds land at fixed ticks; without the wait the
                 * windows a pick and its copies land in depend on timing */
                if ((adapt == 1 || adapt == 2) && sizes[i] < e.total / 2)
                    ck_assert_uint_gt(bi.swaps, 0);
                if (!adapt) ck_assert_uint_eq(bi.swaps, 0);
            }
    }
    /* a bad copy is seen: every copy with one byte flipped changes logits... */
    const struct copy_hooks corrupt = {.after_copy = flip_byte};
    struct backend_opts o = {.expert_cache = {CACHE_SLOTS, e.total}, .copy_hooks = &corrupt};
    run(&e, e.ma, &o, 0, false, "corrupted copies");
    /* ...and --cache-verify refuses each of them: every expert stays on the host tier */
    o.cache_verify = true;
    struct backend_info bi = run(&e, e.ma, &o, 0, true, "corrupted copies, verified");
    ck_assert_uint_eq(bi.verify_failures, e.total);
    ck_assert_uint_eq(bi.resident, 0);
    ck_assert_uint_eq(bi.hits, 0);
    env_close(&e);
}

/* Races of the async tier, made to happen with the copy engine's hooks. */
static int fail_every_third(void *ctx, uint32_t slot, uint64_t ticket)
{
    return ticket % 3 == 0 ? STRATA_EIO : 0;
}

static uint32_t g_posts;

static int refuse_every_fifth(void *ctx, uint32_t slot)
{
    return ++g_posts % 5 == 0 ? STRATA_EIO : 0;
}

struct fence_watch {
    bool in_fence;
    uint32_t waits_in_fence, waits;
};

static void fence_wait(void *ctx, uint64_t ticket)
{
    struct fence_watch *w = ctx;
    w->waits++;
    w->waits_in_fence += w->in_fence;
}

/* script_fenced: the script with a resize (shrink to 2 slots, grow back) before window 4 and a
 * quiesce (a request start's fence) before window 8, each counted as a fence by w. */
static struct backend_info run_fenced(struct env *e, struct backend_opts *o,
                                      struct fence_watch *w, const char *what)
{
    float *got = malloc(e->n_rows * e->V * sizeof(float));
    struct backend *b = start(e->m, o);
    struct backend_info bi;
    backend_info(b, &bi);
    struct kv_seq seq[N_SEQ];
    for (int q = 0; q < N_SEQ; q++)
        kv_seq_init(&seq[q]);
    struct backend_token t[64];
    size_t rows = 0;
    for (uint32_t s = 0; s < N_STEP; s++) {
        w->in_fence = true;
        if (s == 4) {
            ck_assert_msg(backend_resize(b, 2 * bi.slot_bytes) == 0, "%s", strata_errdetail());
            ck_assert_msg(backend_resize(b, bi.cache_slots * bi.slot_bytes) == 0, "%s",
                          strata_errdetail());
        }
        if (s == 8) ck_assert_int_eq(backend_quiesce(b), 0);
        w->in_fence = false;
        uint32_t n = 0;
        for (int q = 0; q < N_SEQ; q++) {
            const uint32_t c = s < 3 ? (q + s) % 4 + 1 : 1;
            for (uint32_t j = 0; j < c; j++)
                t[n++] = (struct backend_token){
                    &seq[q], (int32_t)((s * 131u + q * 977u + j * 31u + 7) % e->V), true};
        }
        ck_assert_msg(backend_eval(b, t, n, got + rows * e->V) == 0, "%s", strata_errdetail());
        ck_assert_msg(backend_tick(b) == 0, "%s", strata_errdetail());
        rows += n;
    }
    for (int q = 0; q < N_SEQ; q++)
        kv_seq_fini(backend_kv(b), &seq[q]);
    size_t differ = 0;
    for (size_t r = 0; r < e->n_rows; r++)
        differ += memcmp(got + r * e->V, e->base + r * e->V, e->V * sizeof(float)) != 0;
    ck_assert_msg(differ == 0, "%s: %zu of %zu logits rows differ from no cache", what, differ,
                  e->n_rows);
    backend_info(b, &bi);
    backend_close(b);
    free(got);
    return bi;
}

START_TEST(async_fences_failures_and_a_removed_fence)
{
    struct env e;
    env_open(&e, "qwen3moe");
    /* copies deferred until a wait (hook defer) and no tick waiting for them (ASYNC_WAIT=0),
     * picks at fixed ticks (inline): a round is in flight at every fence, whatever the timing,
     * and only the fences' waits land it */
    setenv("STRATA_ADAPT_ASYNC_WAIT", "0", 1);
    setenv("STRATA_ADAPT_PICK_INLINE", "1", 1);
    const struct tier_opts async = {.every = 1, .swaps = 8, .decay = 0.9f, .min_count = 0.5f,
                                    .lead = 0.25f, .async = true};
    const uint32_t n = (e.total + 3) / 4;
    struct fence_watch w = {0};
    const struct copy_hooks deferred = {.ctx = &w, .defer = true, .on_wait = fence_wait};
    /* min 0 and lead 0: every round moves experts, so one is in flight at each fence */
    struct tier_opts churn = async;
    churn.min_count = churn.lead = 0;
    struct backend_opts o = {.expert_cache = {CACHE_SLOTS, n}, .tier = churn,
                             .copy_hooks = &deferred, .cache_verify = true};
    struct backend_info bi = run_fenced(&e, &o, &w, "async, copies in flight across the fences");
    ck_assert_msg(w.waits_in_fence >= 2, "copies in flight at %u fences", w.waits_in_fence);
    ck_assert_uint_gt(bi.swaps, 0);
    /* shutdown is a fence too: the first window's round (its routed experts that are not
     * resident lead the unrouted residents) is still in flight when the backend closes */
    {
        w = (struct fence_watch){0};
        struct backend *b = start(e.m, &o);
        struct kv_seq q;
        kv_seq_init(&q);
        struct backend_token t[8];
        for (uint32_t j = 0; j < 8; j++)
            t[j] = (struct backend_token){&q, (int32_t)((j * 131u + 7) % e.V), false};
        ck_assert_int_eq(backend_eval(b, t, 8, NULL), 0);
        ck_assert_int_eq(backend_tick(b), 0);
        kv_seq_fini(backend_kv(b), &q);
        w.in_fence = true;
        backend_close(b);
        ck_assert_msg(w.waits_in_fence > 0, "no copy in flight at shutdown");
    }
    /* the same with the tier's own thread picking, and one copy posted per tick */
    unsetenv("STRATA_ADAPT_PICK_INLINE");
    setenv("STRATA_ADAPT_ASYNC_BATCH", "1", 1);
    w = (struct fence_watch){0};
    run_fenced(&e, &o, &w, "async, picked on its thread, one copy a tick");
    unsetenv("STRATA_ADAPT_ASYNC_BATCH");
    setenv("STRATA_ADAPT_PICK_INLINE", "1", 1);
    o.tier = async;
    /* copies held 30 ms after their bytes land, across the resize */
    const struct copy_hooks held = {.hold_ms = 30};
    o.copy_hooks = &held;
    bi = run(&e, e.m, &o, 4, true, "async, held copies across a resize");
    ck_assert_uint_gt(bi.swaps, 0);
    /* failed copies leave their experts on the host tier (slots poisoned), logits exact; the
     * tick after a round lands it (ASYNC_WAIT), so which copies fail does not depend on timing */
    setenv("STRATA_ADAPT_ASYNC_WAIT", "1", 1);
    const struct copy_hooks failing = {.fail = fail_every_third};
    o.copy_hooks = &failing;
    bi = run(&e, e.m, &o, 0, true, "async, every third copy failing");
    ck_assert_uint_gt(bi.swaps, 0);
    /* a failed round (a copy that cannot be posted): the tick reports it, the round's posted
     * copies land, the rest are dropped, and later rounds and every logit are as before */
    const struct copy_hooks refusing = {.refuse = refuse_every_fifth};
    o.copy_hooks = &refusing;
    g_tick_fail_ok = true;
    g_tick_errors = 0;
    g_posts = 0;
    bi = run(&e, e.m, &o, 0, true, "async, every fifth copy refused at posting");
    g_tick_fail_ok = false;
    ck_assert_uint_gt(g_tick_errors, 0);
    ck_assert_uint_gt(bi.swaps, 0);
    /* the suite sees a removed fence: a copy that overwrites a slot the next window still reads.
     * Deterministic: the tick after posting lands the round (ASYNC_WAIT=1) and the pick is at a
     * fixed tick */
    const struct copy_hooks unfenced = {.unfenced = true};
    o.copy_hooks = &unfenced;
    o.cache_verify = false;
    run(&e, e.m, &o, 0, false, "async without its fence, inline pick");
    /* the tier's thread posts while a window runs: window_sync makes each pass wait for that
     * posting before it reads a slot, so the copies are posted across a running window, fenced
     * on it: exact with the fence, with and without a waiting tick... */
    unsetenv("STRATA_ADAPT_PICK_INLINE");
    const struct copy_hooks sync = {.window_sync = true};
    o.copy_hooks = &sync;
    o.cache_verify = true;
    for (int wait = 0; wait < 2; wait++) {
        setenv("STRATA_ADAPT_ASYNC_WAIT", wait ? "1" : "0", 1);
        bi = run(&e, e.m, &o, 0, true, "async, posted by the tier's thread across a window");
        ck_assert_uint_gt(bi.swaps, 0);
    }
    /* ...and wrong when a copy does not wait for that window (the window wait removed), or is
     * posted before its victim leaves the table (the fence removed) */
    o.cache_verify = false;
    const struct copy_hooks no_wait = {.window_sync = true, .no_window_wait = true};
    o.copy_hooks = &no_wait;
    run(&e, e.m, &o, 0, false, "async without the window wait, the tier's thread");
    const struct copy_hooks unfenced_sync = {.window_sync = true, .unfenced = true};
    o.copy_hooks = &unfenced_sync;
    run(&e, e.m, &o, 0, false, "async without its fence, the tier's thread");
    env_close(&e);
}
END_TEST

/* ---- one budget (--slot-kv 1): KV blocks take slots through the fence ----------------------
 * The budget script: three streams whose prompts (7, 10 and 13 tokens a window for 3 windows)
 * and decode steps (16 more windows) hand out new KV blocks at windows 0, 2, 6 and 15, each
 * taking a slot from the cache mid-run, with the tier's rounds in flight. Every token's logits
 * are kept. */

#define B_STEPS 19

struct budget_watch {
    bool in_eval, in_fence;
    uint32_t waits_in_eval;  /* copies still in flight when a KV grow's fence waited for them */
    uint32_t waits_in_fence; /* ... when a resize, quiesce or close waited */
    uint32_t kv_grow_windows; /* windows whose pass took a slot for KV */
};

static void watch_wait(void *ctx, uint64_t ticket)
{
    struct budget_watch *w = ctx;
    w->waits_in_eval += w->in_eval;
    w->waits_in_fence += w->in_fence;
}

/* budget_script: resize_at (0: none) is the window before which the budget shrinks to what the
 * KV cache holds plus one slot and grows back to `slots`; quiesce_at, a request start's fence. */
static size_t budget_script(struct env *e, struct backend *b, float *out, struct budget_watch *w,
                            uint32_t resize_at, uint32_t quiesce_at)
{
    struct kv_seq seq[N_SEQ];
    for (int q = 0; q < N_SEQ; q++)
        kv_seq_init(&seq[q]);
    struct backend_token t[64];
    struct backend_info bi;
    backend_info(b, &bi);
    const uint32_t slots = bi.cache_slots;
    size_t rows = 0;
    for (uint32_t s = 0; s < B_STEPS; s++) {
        if (w) w->in_fence = true;
        if (resize_at && s == resize_at) {
            backend_info(b, &bi);
            const uint32_t kv = bi.kv_slots;
            ck_assert_uint_gt(kv, 0);
            /* below what the KV cache holds: refused, nothing changed */
            ck_assert_int_eq(backend_resize(b, (uint64_t)(kv - 1) * bi.slot_bytes), STRATA_EBUSY);
            ck_assert_msg(backend_resize(b, (uint64_t)(kv + 1) * bi.slot_bytes) == 0, "%s",
                          strata_errdetail());
            backend_info(b, &bi);
            ck_assert_uint_eq(bi.cache_slots, kv + 1);
            ck_assert_uint_eq(bi.kv_slots, kv); /* its blocks kept (moved below the cut) */
            ck_assert_uint_le(bi.resident, 1);
            ck_assert_msg(backend_resize(b, (uint64_t)slots * bi.slot_bytes) == 0, "%s",
                          strata_errdetail());
        }
        if (quiesce_at && s == quiesce_at) ck_assert_int_eq(backend_quiesce(b), 0);
        if (w) w->in_fence = false;
        uint32_t n = 0;
        for (int q = 0; q < N_SEQ; q++) {
            const uint32_t c = s < 3 ? 7 + 3 * (uint32_t)q : 1;
            for (uint32_t j = 0; j < c; j++)
                t[n++] = (struct backend_token){
                    &seq[q], (int32_t)((s * 151u + q * 613u + j * 29u + 3) % e->V), out != NULL};
        }
        backend_info(b, &bi);
        const uint32_t kv0 = bi.kv_slots;
        if (w) w->in_eval = true;
        ck_assert_msg(backend_eval(b, t, n, out ? out + rows * e->V : NULL) == 0, "%s",
                      strata_errdetail());
        if (w) w->in_eval = false;
        backend_info(b, &bi);
        if (w) w->kv_grow_windows += bi.kv_slots > kv0;
        ck_assert_msg(backend_tick(b) == 0, "%s", strata_errdetail());
        rows += n;
    }
    for (int q = 0; q < N_SEQ; q++)
        kv_seq_fini(backend_kv(b), &seq[q]);
    return rows;
}

/* budget_run: the budget script under o, its logits compared with base (rows of no cache). */
static struct backend_info budget_run(struct env *e, const struct model *m, struct backend_opts *o,
                                      const float *base, size_t n_rows, struct budget_watch *w,
                                      uint32_t resize_at, bool want_equal, const char *what)
{
    float *got = malloc(n_rows * e->V * sizeof(float));
    struct backend *b = start(m, o);
    budget_script(e, b, got, w, resize_at, resize_at ? resize_at + 3 : 0);
    struct backend_info bi;
    backend_info(b, &bi); /* before the last fence: what the windows' own fences landed */
    if (w) w->in_fence = true;
    ck_assert_int_eq(backend_quiesce(b), 0);
    if (w) w->in_fence = false;
    struct backend_info after;
    backend_info(b, &after);
    bi.verify_failures = after.verify_failures;
    size_t differ = 0;
    for (size_t r = 0; r < n_rows; r++)
        differ += memcmp(got + r * e->V, base + r * e->V, e->V * sizeof(float)) != 0;
    if (want_equal)
        ck_assert_msg(differ == 0, "%s: %zu of %zu logits rows differ from no cache", what, differ,
                      n_rows);
    else
        ck_assert_msg(differ > 0, "%s: every logit unchanged", what);
    backend_close(b);
    free(got);
    return bi;
}

static void one_budget(const char *arch, bool races)
{
    struct env e;
    env_open(&e, arch);
    /* the baseline: no cache, the KV cache in its own memory */
    struct backend_opts none = {0};
    struct backend *b = start(e.m, &none);
    const size_t n_rows = budget_script(&e, b, NULL, NULL, 0, 0);
    backend_close(b);
    float *base = malloc(n_rows * e.V * sizeof(float));
    b = start(e.m, &none);
    budget_script(&e, b, base, NULL, 0, 0);
    backend_close(b);
    const struct tier_opts busy = {.every = 1, .swaps = 8, .decay = 0.9f, .min_count = 0.5f,
                                   .lead = 0.25f};
    struct tier_opts async = busy;
    async.async = true;
    const uint32_t n = e.total * 3 / 4 + 1; /* KV takes up to 6 of them (2 blocks x 3 streams) */
    char what[160];
    /* every mode of the tier, from the file and the arena: exact, each slot's hash checked as it
     * turns resident and every resident's after each KV grow */
    static const char *const modes[] = {"static", "blocking", "async"};
    for (int model = 0; model < (races ? 2 : 1); model++) /* the arena with the races' arch */
        for (int mode = 0; mode < 3; mode++) {
            setenv("STRATA_ADAPT_ASYNC_WAIT", "1", 1);
            struct backend_opts o = {.expert_cache = {CACHE_SLOTS, n},
                                     .tier = mode == 0 ? (struct tier_opts){0}
                                             : mode == 1 ? busy
                                                         : async,
                                     .cache_verify = true,
                                     .slot_kv = true};
            struct budget_watch w = {0};
            snprintf(what, sizeof what, "%s %s, one budget of %u slots, %s tier", arch,
                     model ? "arena" : "file", n, modes[mode]);
            struct backend_info bi =
                budget_run(&e, model ? e.ma : e.m, &o, base, n_rows, &w, mode ? 8 : 0, true, what);
            ck_assert_uint_eq(bi.verify_failures, 0);
            ck_assert_uint_gt(bi.hits, 0);
            ck_assert_uint_ge(w.kv_grow_windows, 2); /* KV took slots mid-run, not only at start */
            ck_assert_uint_gt(bi.kv_slots, 0);
            if (mode) ck_assert_uint_gt(bi.swaps, 0);
        }
    if (!races) {
        free(base);
        env_close(&e);
        return;
    }
    /* the races, made to happen: every copy deferred until a wait, so a round is in flight at
     * each KV grow, and copies land only where a fence (or, with ASYNC_WAIT, a tick) waits */
    struct budget_watch w = {0};
    struct copy_hooks deferred = {.ctx = &w, .defer = true, .on_wait = watch_wait};
    struct backend_opts o = {.expert_cache = {CACHE_SLOTS, n}, .tier = async, .cache_verify = true,
                             .slot_kv = true, .copy_hooks = &deferred};
    setenv("STRATA_ADAPT_PICK_INLINE", "1", 1);
    for (int wait = 0; wait < 2; wait++) {
        setenv("STRATA_ADAPT_ASYNC_WAIT", wait ? "1" : "0", 1);
        w = (struct budget_watch){0};
        snprintf(what, sizeof what, "%s: copies in flight across the KV-grow fences (wait %d)",
                 arch, wait);
        struct backend_info bi = budget_run(&e, e.m, &o, base, n_rows, &w, 0, true, what);
        ck_assert_msg(w.waits_in_eval > 0, "%s: no copy was in flight at a KV grow", what);
        ck_assert_uint_eq(bi.verify_failures, 0);
        /* without a waiting tick only the KV grows' fences landed the rounds */
        ck_assert_uint_gt(bi.swaps, 0);
        /* and across the resize and quiesce fences */
        w = (struct budget_watch){0};
        snprintf(what, sizeof what, "%s: copies in flight across resize and quiesce (wait %d)",
                 arch, wait);
        bi = budget_run(&e, e.m, &o, base, n_rows, &w, 8, true, what);
        /* (with the tick's wait the round may have landed, or found no move, before them) */
        if (!wait) ck_assert_msg(w.waits_in_fence > 0, "%s: no copy was in flight at a fence", what);
        ck_assert_uint_eq(bi.verify_failures, 0);
    }
    /* failed copies: the experts stay on the host tier, their slots poisoned, logits exact */
    const struct copy_hooks failing = {.fail = fail_every_third};
    o.copy_hooks = &failing;
    snprintf(what, sizeof what, "%s: one budget, every third copy failing", arch);
    budget_run(&e, e.m, &o, base, n_rows, NULL, 8, true, what);
    /* the suite sees the KV-grow fence removed: the deferred copy of the round in flight lands
     * in the slot the KV cache just took, over K/V rows the next window reads */
    setenv("STRATA_ADAPT_ASYNC_WAIT", "1", 1);
    deferred.kv_unfenced = true;
    o.copy_hooks = &deferred;
    o.cache_verify = false;
    snprintf(what, sizeof what, "%s: one budget without the KV-grow fence", arch);
    budget_run(&e, e.m, &o, base, n_rows, NULL, 0, false, what);
    unsetenv("STRATA_ADAPT_PICK_INLINE");
    free(base);
    env_close(&e);
}

START_TEST(one_budget_races_qwen3moe)
{
    one_budget("qwen3moe", true);
}
END_TEST

START_TEST(one_budget_llama)
{
    one_budget("llama", false);
}
END_TEST

START_TEST(one_budget_olmoe)
{
    one_budget("olmoe", false);
}
END_TEST

START_TEST(one_budget_qwen2moe)
{
    one_budget("qwen2moe", false);
}
END_TEST

START_TEST(one_budget_gpt_oss)
{
    one_budget("gpt-oss", false);
}
END_TEST

/* STRATA_DECODE_TIMING=1: one line per window, with or without a cache: its parts, the tick and
 * fences, hits and misses (every routed pair of the window, one or the other), the adapt wait
 * and join, and the swaps that landed (summing to the backend's count). */
static void timing_lines(struct env *e, const struct backend_opts *o, bool cached)
{
    char path[700];
    snprintf(path, sizeof path, "%s/timing.log", test_tmpdir());
    fflush(stderr);
    const int saved = dup(2);
    FILE *log = fopen(path, "w");
    ck_assert_ptr_nonnull(log);
    dup2(fileno(log), 2);
    setenv("STRATA_DECODE_TIMING", "1", 1);
    struct backend *b = start(e->m, o);
    const size_t rows = script(e, b, NULL, 0, 0, 0);
    struct backend_info bi;
    backend_info(b, &bi);
    backend_close(b);
    unsetenv("STRATA_DECODE_TIMING");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(log);
    char *text = test_read_file(path, NULL);
    ck_assert_ptr_nonnull(text);
    const struct model_hparams *hp = &e->m->hp;
    uint32_t windows = 0;
    unsigned long long hits = 0, misses = 0, swaps = 0;
    for (const char *p = strstr(text, "window "); p; p = strstr(p + 1, "window ")) {
        unsigned w;
        double ms, at, de, ex, co, ou, tick, fence, wait, join;
        unsigned long long h, m, sw;
        if (sscanf(p,
                   "window %u: %lf ms (attention %lf, dense %lf, experts %lf, combine %lf, output "
                   "%lf), tick %lf ms, fence %lf ms, %llu hits %llu misses, adapt wait %lf join "
                   "%lf ms, %llu swaps/window",
                   &w, &ms, &at, &de, &ex, &co, &ou, &tick, &fence, &h, &m, &wait, &join,
                   &sw) != 14)
            continue;
        windows++;
        ck_assert_uint_eq(w, windows);
        ck_assert(ms >= at && ms >= ex && ex >= co && tick >= 0 && wait >= 0 && join >= 0);
        hits += h;
        misses += m;
        swaps += sw;
    }
    ck_assert_uint_eq(windows, N_STEP);
    ck_assert_uint_eq(hits + misses, cached ? rows * hp->n_expert_used * hp->n_layer : 0);
    ck_assert_uint_eq(hits, bi.hits);
    ck_assert_uint_eq(swaps, bi.swaps);
    if (cached) ck_assert_uint_gt(swaps, 0);
    free(text);
}

START_TEST(decode_timing_line_per_window)
{
    struct env e;
    env_open(&e, "qwen3moe");
    struct backend_opts none = {0};
    timing_lines(&e, &none, false);
    struct backend_opts o = {.expert_cache = {CACHE_SLOTS, (e.total + 3) / 4},
                             .tier = {.every = 1, .swaps = 8, .decay = 0.9f, .min_count = 0.5f,
                                      .lead = 0.25f, .async = true}};
    setenv("STRATA_ADAPT_ASYNC_WAIT", "1", 1);
    timing_lines(&e, &o, true);
    env_close(&e);
}
END_TEST

START_TEST(independent_of_the_cache_qwen3moe)
{
    independence("qwen3moe");
}
END_TEST

START_TEST(independent_of_the_cache_llama)
{
    independence("llama");
}
END_TEST

START_TEST(independent_of_the_cache_olmoe)
{
    independence("olmoe");
}
END_TEST

START_TEST(independent_of_the_cache_qwen2moe)
{
    independence("qwen2moe");
}
END_TEST

/* The tier's counts (DESIGN 3.3): a decode step and the drafts it verifies (every token asking
 * for logits) count each token's routed pairs, as one-token steps would; a prompt chunk counts
 * each of its experts once. Read from the round's counts with no decay. */
static float g_counts[64];

static void keep_counts(void *ctx, const float *counts)
{
    memcpy(g_counts, counts, *(const uint32_t *)ctx * sizeof *g_counts);
}

START_TEST(verify_windows_count_per_token)
{
    struct env e;
    env_open(&e, "qwen3moe");
    const struct model_hparams *hp = &e.m->hp;
    uint32_t cells = hp->n_layer * hp->n_expert;
    ck_assert_uint_le(cells, 64);
    struct backend_opts o = {.expert_cache = {CACHE_SLOTS, 2},
                             .tier = {.every = 1, .swaps = 0, .decay = 1.0f, .min_count = 1e9f,
                                      .lead = 1e9f},
                             .on_round = keep_counts,
                             .round_ctx = &cells};
    struct backend *b = start(e.m, &o);
    struct kv_seq seq;
    kv_seq_init(&seq);
    struct backend_token t[16];
    float *logits = malloc((size_t)16 * e.V * sizeof *logits);
    float before[64] = {0}; /* the counts do not decay: each window adds to them */
    for (int verify = 0; verify < 2; verify++) {
        for (uint32_t j = 0; j < 16; j++)
            t[j] = (struct backend_token){&seq, (int32_t)((j * 37u + 5) % e.V), verify || j == 15};
        ck_assert_int_eq(backend_eval(b, t, 16, logits), 0);
        ck_assert_int_eq(backend_tick(b), 0);
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            float sum = 0;
            uint32_t used = 0;
            for (uint32_t x = 0; x < hp->n_expert; x++) {
                const float c = g_counts[l * hp->n_expert + x] - before[l * hp->n_expert + x];
                sum += c;
                used += c > 0;
            }
            if (verify)
                ck_assert_float_eq(sum, 16.0f * hp->n_expert_used);
            else
                ck_assert_float_eq(sum, (float)used); /* each expert once */
        }
        memcpy(before, g_counts, sizeof before);
        ck_assert_int_eq(kv_seq_resize(backend_kv(b), &seq, 0), 0);
    }
    free(logits);
    kv_seq_fini(backend_kv(b), &seq);
    backend_close(b);
    env_close(&e);
}
END_TEST

/* gpt-oss: each blob holds its expert's three biases beside the matrices (six parts, their gaps:
 * the file's slot copies take eleven extents), from the arena and from the file alike. */
START_TEST(independent_of_the_cache_gpt_oss)
{
    independence("gpt-oss");
}
END_TEST

/* glm4moe: a dense layer without blobs before the MoE layers, the MTP layer's experts in the arena
 * but never read. */
START_TEST(independent_of_the_cache_glm4moe)
{
    independence("glm4moe");
}
END_TEST

/* deepseek2: MLA's layers around the same expert blobs. */
START_TEST(independent_of_the_cache_deepseek2)
{
    independence("deepseek2");
}
END_TEST

START_TEST(options_parse_and_refuse)
{
    struct backend_opts o = backend_opts_default();
    ck_assert_uint_eq(o.tier.every, 4);
    ck_assert_uint_eq(o.tier.swaps, 96);
    ck_assert_int_eq(backend_opt(&o, "expert-cache", "12GiB"), 0);
    ck_assert_int_eq(o.expert_cache.kind, CACHE_BYTES);
    ck_assert_int_eq(backend_opt(&o, "adapt-every", "0"), 0);
    ck_assert_uint_eq(o.tier.every, 0);
    ck_assert_int_eq(backend_opt(&o, "adapt-decay", "0.5"), 0);
    ck_assert_float_eq(o.tier.decay, 0.5f);
    ck_assert_int_eq(backend_opt(&o, "adapt-decay", "2"), STRATA_EINVAL);
    ck_assert_int_eq(backend_opt(&o, "adapt-swaps", "1.5"), STRATA_EINVAL);
    ck_assert_int_eq(backend_opt(&o, "cache-verify", "yes"), STRATA_EINVAL);
    ck_assert_int_eq(backend_opt(&o, "adapt-async", "1"), 0);
    ck_assert_int_eq(backend_opt(&o, "slot-kv", "1"), 0);
    ck_assert(o.slot_kv);
    ck_assert_int_eq(backend_opt(&o, "slot-kv", "2"), STRATA_EINVAL);
    ck_assert(o.tier.async);
    ck_assert_int_eq(backend_opt(&o, "kv-type", "f16"), 0);
    ck_assert_int_eq(backend_opt(&o, "backend", "tpu"), STRATA_EINVAL);
    ck_assert_int_eq(backend_opt(&o, "threads", "2"), STRATA_ENOENT);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("backend_cpu_cache");
    TCase *tc = tcase_create("cache");
    tcase_set_timeout(tc, 300); /* Debug + ASan builds run ~10x slower */
    tcase_add_test(tc, options_parse_and_refuse);
    tcase_add_test(tc, verify_windows_count_per_token);
    tcase_add_test(tc, async_fences_failures_and_a_removed_fence);
    tcase_add_test(tc, decode_timing_line_per_window);
    tcase_add_test(tc, one_budget_races_qwen3moe);
    tcase_add_test(tc, one_budget_gpt_oss);
    tcase_add_test(tc, independent_of_the_cache_qwen3moe);
    tcase_add_test(tc, independent_of_the_cache_gpt_oss);
    /* llama, olmoe and qwen2moe take qwen3moe's expert path with other dense parts */
    if (!test_matrix_short("backend_cpu_cache", "the llama, olmoe and qwen2moe cases")) {
        tcase_add_test(tc, one_budget_llama);
        tcase_add_test(tc, one_budget_olmoe);
        tcase_add_test(tc, one_budget_qwen2moe);
        tcase_add_test(tc, independent_of_the_cache_llama);
        tcase_add_test(tc, independent_of_the_cache_olmoe);
        tcase_add_test(tc, independent_of_the_cache_qwen2moe);
    }
    tcase_add_test(tc, independent_of_the_cache_glm4moe);
    tcase_add_test(tc, independent_of_the_cache_deepseek2);
    suite_add_tcase(s, tc);
    return test_run(s);
}
