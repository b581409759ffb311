#include "gpu-worker/backend.h"
#include "arena-server/arena_build.h"
#include "common/arena/arena.h"
#include "common/arena/arena_layout.h"
#include "common/base/err.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The CUDA hybrid (hot experts in VRAM slots, misses on the CPU at the same time) against the CUDA
 * backend with every expert resident: the logits of every position of three interleaved streams
 * (prompt chunks and decode steps in shared windows) must be equal byte for byte (DESIGN 3.4)
 * with the cache at 0%, 10%, 50% and 100% of the experts (100% forced through the hybrid's path
 * with STRATA_CUDA_HYBRID=1), static or with an adaptive tier swapping every window (blocking,
 * async, async with copies held across windows), resized mid-stream (the `vram` op), from a GGUF
 * file or an arena. The copy engine's hooks on real streams: a removed fence and a flipped byte
 * must change the logits; failed copies must not. On a mismatch the case prints how far apart the
 * logits are (the largest difference over the row's range), to tell a wrong expert from an ulp. */

#define N_SEQ  3
#define N_STEP 12

struct env {
    char path[600];
    struct gguf_file *f;
    struct model *m;
    char shm[600];
    struct arena *a;
    struct gguf_file *meta;
    struct model *ma;
    uint32_t V, total;
    size_t n_rows;
    float *base;
};

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
            /* give most slots back mid-stream, then take more than before */
            ck_assert_msg(backend_resize(b, 2 * slot_bytes) == 0, "%s", strata_errdetail());
            struct backend_info bi;
            backend_info(b, &bi);
            ck_assert_uint_eq(bi.cache_slots, 2);
            ck_assert_uint_le(bi.resident, 2);
            ck_assert_msg(backend_resize(b, slots * slot_bytes) == 0, "%s", strata_errdetail());
            backend_info(b, &bi);
            ck_assert_uint_eq(bi.cache_slots, slots);
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
        ck_assert_msg(backend_tick(b) == 0, "%s", strata_errdetail());
        rows += n;
    }
    for (int q = 0; q < N_SEQ; q++)
        kv_seq_fini(backend_kv(b), &seq[q]);
    return rows;
}

static struct backend *start(const struct model *m, const struct backend_opts *extra)
{
    struct backend_opts o = *extra;
    o.name = "cuda";
    o.n_threads = 2;
    o.max_pass_tokens = 32;
    o.n_ctx = 64;
    o.n_seq = N_SEQ;
    struct backend *b;
    ck_assert_msg(backend_start(m, &o, &b) == 0, "%s", strata_errdetail());
    return b;
}

static void build_arena(struct env *e)
{
    snprintf(e->shm, sizeof e->shm, "%s/shm", test_tmpdir());
    mkdir(e->shm, 0700);
    struct arena_layout *L;
    ck_assert_msg(arena_layout_plan(e->f, ARENA_ALIGN_SMALL, e->path, &L) == 0, "%s",
                  strata_errdetail());
    char seg[300], tmp[320];
    shm_name(seg, sizeof seg, "hybtest", "");
    snprintf(tmp, sizeof tmp, "%s.tmp", seg);
    struct shm_seg s;
    struct arena_build_stats st;
    struct arena_build_opts bo = {.threads = 1};
    ck_assert_msg(arena_build_create(L, e->f, e->shm, tmp, &bo, &s, &st) == 0, "%s",
                  strata_errdetail());
    atomic_store_explicit(&((struct arena_header *)s.map)->state, ARENA_READY,
                          memory_order_release);
    ck_assert_int_eq(shm_publish(e->shm, &s, tmp, seg, 0400), 0);
    shm_close(&s);
    arena_layout_fini(L);
    ck_assert_int_eq(arena_open(e->shm, "hybtest", &e->a), 0);
    ck_assert_int_eq(arena_meta(e->a, &e->meta), 0);
    ck_assert_msg(model_load_arena(e->a, e->meta, &e->ma) == 0, "%s", strata_errdetail());
}

static void env_open(struct env *e, const char *arch, const char *type)
{
    snprintf(e->path, sizeof e->path, "%s/hyb-%s.gguf", test_tmpdir(), arch);
    struct fixture_opts fo = {.arch = arch, .type = type, .seed = 21, .zipf = 1.1};
    ck_assert_msg(fixture_write(&fo, e->path) == 0, "%s", strata_errdetail());
    ck_assert_int_eq(gguf_open(e->path, &e->f), 0);
    ck_assert_msg(model_load(e->f, &e->m) == 0, "%s", strata_errdetail());
    e->V = e->m->hp.n_vocab;
    e->total = e->m->hp.n_layer * e->m->hp.n_expert;
    unsetenv("STRATA_CUDA_HYBRID");
    struct backend_opts all = {0}; /* auto: every expert resident, the all-resident path */
    struct backend *b = start(e->m, &all);
    struct backend_info bi;
    backend_info(b, &bi);
    ck_assert_uint_eq(bi.cache_slots, e->total);
    e->n_rows = script(e, b, NULL, 0, 0, 0);
    backend_close(b);
    e->base = malloc(e->n_rows * e->V * sizeof(float));
    b = start(e->m, &all);
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
    shm_name(seg, sizeof seg, "hybtest", "");
    snprintf(p, sizeof p, "%s/%s", e->shm, seg);
    unlink(p);
    rmdir(e->shm);
    model_fini(e->m);
    gguf_close(e->f);
    unlink(e->path);
}

static struct backend_info run(struct env *e, const struct model *m, struct backend_opts *o,
                               uint32_t resize_at, bool want_equal, const char *what)
{
    float *got = malloc(e->n_rows * e->V * sizeof(float));
    struct backend *b = start(m, o);
    struct backend_info bi;
    backend_info(b, &bi);
    script(e, b, got, resize_at, bi.slot_bytes, bi.cache_slots);
    ck_assert_int_eq(backend_quiesce(b), 0);
    backend_info(b, &bi);
    size_t differ = 0;
    double worst = 0;
    for (size_t r = 0; r < e->n_rows; r++) {
        const float *g = got + r * e->V, *w = e->base + r * e->V;
        if (memcmp(g, w, e->V * sizeof(float)) == 0) continue;
        differ++;
        float lo = w[0], hi = w[0];
        double d = 0;
        for (uint32_t i = 0; i < e->V; i++) {
            lo = fminf(lo, w[i]), hi = fmaxf(hi, w[i]);
            d = fmax(d, fabs((double)g[i] - w[i]));
        }
        worst = fmax(worst, d / (hi - lo > 0 ? hi - lo : 1));
    }
    printf("%s: %u slots, %llu hits %llu misses, %llu swaps: %zu of %zu rows differ (largest "
           "difference %.3g of the range)\n",
           what, bi.cache_slots, (unsigned long long)bi.hits, (unsigned long long)bi.misses,
           (unsigned long long)bi.swaps, differ, e->n_rows, worst);
    fflush(stdout);
    if (want_equal)
        ck_assert_msg(differ == 0,
                      "%s: %zu of %zu logits rows differ from all-resident (largest %.3g of the "
                      "range)",
                      what, differ, e->n_rows, worst);
    else
        ck_assert_msg(differ > 0, "%s: the logits did not change", what);
    backend_close(b);
    free(got);
    return bi;
}

static void flip_byte(void *ctx, uint32_t slot, uint8_t *dst, uint64_t bytes)
{
    dst[bytes / 3] ^= 0x10;
}

static int fail_every_third(void *ctx, uint32_t slot, uint64_t ticket)
{
    return ticket % 3 == 0 ? STRATA_EIO : 0;
}

static void independence(const char *arch, const char *type)
{
    struct env e;
    env_open(&e, arch, type);
    const struct tier_opts none = {0}, busy = {.every = 1,
                                               .swaps = 8,
                                               .decay = 0.9f,
                                               .min_count = 0.5f,
                                               .lead = 0.25f};
    struct tier_opts async = busy;
    async.async = true;
    const struct copy_hooks stretch = {.hold_ms = 2};
    static const char *const modes[] = {"static", "blocking", "async", "async, held"};
    const uint32_t sizes[] = {0, (e.total + 9) / 10, e.total / 2, e.total};
    for (int model = 0; model < 2; model++) {
        const struct model *m = model ? e.ma : e.m;
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            for (int adapt = 0; adapt < 4; adapt++) {
                if (sizes[i] == 0 && adapt) continue; /* no slot to adapt */
                struct backend_opts o = {.expert_cache = {CACHE_SLOTS, sizes[i]},
                                         .tier = adapt == 0   ? none
                                                 : adapt == 1 ? busy
                                                              : async,
                                         .copy_hooks = adapt == 3 ? &stretch : NULL,
                                         .pin = model ? 1 : 0};
                setenv("STRATA_CUDA_HYBRID", "1", 1);
                setenv("STRATA_ADAPT_ASYNC_WAIT", adapt == 3 ? "0" : "1", 1);
                char what[160];
                snprintf(what, sizeof what, "%s %s %s, %u slots, %s tier", arch,
                         type ? type : "q4_k_m", model ? "arena" : "file", sizes[i], modes[adapt]);
                struct backend_info bi = run(&e, m, &o, adapt && i == 2 ? 5 : 0, true, what);
                if (sizes[i]) ck_assert_uint_gt(bi.hits, 0);
                if (sizes[i] == e.total) ck_assert_uint_eq(bi.misses, 0);
                if (sizes[i] == 0) ck_assert_uint_eq(bi.hits, 0);
                if ((adapt == 1 || adapt == 2) && sizes[i] < e.total / 2)
                    ck_assert_uint_gt(bi.swaps, 0);
                if (!adapt) ck_assert_uint_eq(bi.swaps, 0);
            }
    }
    unsetenv("STRATA_CUDA_HYBRID");
    env_close(&e);
}

START_TEST(independent_of_the_cache_qwen3moe)
{
    independence("qwen3moe", NULL);
}
END_TEST

START_TEST(independent_of_the_cache_llama)
{
    independence("llama", NULL);
}
END_TEST

START_TEST(independent_of_the_cache_olmoe)
{
    independence("olmoe", "q5_0");
}
END_TEST

START_TEST(independent_of_the_cache_qwen2moe)
{
    independence("qwen2moe", "q8_0");
}
END_TEST

/* The copy engine's races on real streams: held copies across a resize, failing copies, a flipped
 * byte, and the removed fence, which must be seen. */
START_TEST(copy_races_on_streams)
{
    struct env e;
    env_open(&e, "qwen3moe", NULL);
    setenv("STRATA_ADAPT_ASYNC_WAIT", "0", 1);
    const struct tier_opts async = {
        .every = 1, .swaps = 8, .decay = 0.9f, .min_count = 0.5f, .lead = 0.25f, .async = true};
    const uint32_t n = (e.total + 3) / 4;
    const struct copy_hooks held = {.hold_ms = 30};
    struct backend_opts o = {.expert_cache = {CACHE_SLOTS, n}, .tier = async, .copy_hooks = &held};
    struct backend_info bi = run(&e, e.ma, &o, 4, true, "async, held copies across a resize");
    ck_assert_uint_gt(bi.swaps, 0);
    const struct copy_hooks failing = {.fail = fail_every_third};
    o.copy_hooks = &failing;
    bi = run(&e, e.m, &o, 0, true, "async, every third copy failing");
    ck_assert_uint_gt(bi.swaps, 0);
    const struct copy_hooks corrupt = {.after_copy = flip_byte};
    struct backend_opts oc = {.expert_cache = {CACHE_SLOTS, e.total / 2}, .copy_hooks = &corrupt};
    run(&e, e.ma, &oc, 0, false, "corrupted copies");
    oc.cache_verify = true;
    bi = run(&e, e.ma, &oc, 0, true, "corrupted copies, verified");
    ck_assert_uint_eq(bi.verify_failures, e.total); /* each expert tried once, all refused */
    ck_assert_uint_eq(bi.hits, 0);
    const struct copy_hooks unfenced = {.unfenced = true};
    o.copy_hooks = &unfenced;
    run(&e, e.m, &o, 0, false, "async without its fence");
    unsetenv("STRATA_ADAPT_ASYNC_WAIT");
    env_close(&e);
}
END_TEST

/* The PCIe share: missed experts computed by the GPU from registered host memory, same bits. */
START_TEST(pcie_share_same_bits)
{
    struct env e;
    env_open(&e, "qwen3moe", NULL);
    struct backend_opts o = {.expert_cache = {CACHE_SLOTS, e.total / 10},
                             .pin = 1,
                             .pcie_frac = 0.5f,
                             .pcie_threshold = 2};
    static const char *const what[] = {"pcie share 0.5, threshold 2, zero-copy",
                                       "pcie share 0.5, threshold 2, staging",
                                       "pcie share 0.5, threshold auto, zero-copy"};
    for (int stage = 0; stage < 3; stage++) {
        /* the switch: read through mapped memory, or copied into staging slots first */
        setenv("STRATA_PCIE_MODE", stage == 1 ? "stage" : "zero", 1);
        if (stage == 2) o.pcie_threshold = BACKEND_PCIE_AUTO;
        struct backend_info bi = run(&e, e.ma, &o, 0, true, what[stage]);
        printf("pcie share: %llu of %llu missed pairs over PCIe\n",
               (unsigned long long)bi.pcie_pairs, (unsigned long long)bi.misses);
        ck_assert_uint_gt(bi.pcie_pairs, 0); /* the registration thread had the whole script */
        ck_assert_uint_lt(bi.pcie_pairs, bi.misses);
    }
    unsetenv("STRATA_PCIE_MODE");
    env_close(&e);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hybrid");
    TCase *tc = tcase_create("hybrid");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, independent_of_the_cache_qwen3moe);
    tcase_add_test(tc, copy_races_on_streams);
    tcase_add_test(tc, pcie_share_same_bits);
    tcase_add_test(tc, independent_of_the_cache_llama);
    tcase_add_test(tc, independent_of_the_cache_olmoe);
    tcase_add_test(tc, independent_of_the_cache_qwen2moe);
    suite_add_tcase(s, tc);
    return test_run(s);
}
