/* fe_status_test — a worker's part of GET /status (and `strata status`) on its own: exactly the
 * keys docs/api.md lists, with their values; hello or status missing; names that are not UTF-8
 * and figures that are not finite (neither may drop the keys beside them); the vram object; and
 * fe_status_watch: vram and heat read only while /status is watched, the old heat freed when the
 * new one lands. (fe_test checks GET /status end to end.) */
#include "frontend/fe_status.h"

#include "common/base/err.h"
#include "frontend/fe_int.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const HELLO_KEYS[] = {"model", "arch",  "backend",  "kv_type",
                                         "pid",   "n_ctx", "max_seqs", "bit_exact"};
static const char *const STATUS_KEYS[] = {
    "running",          "queued",         "max_queue",      "kv_blocks_used",
    "kv_blocks_total",  "tok_s",          "prefill_tok_s",  "windows",
    "tokens_generated", "prompt_tokens",  "prefix_hits",    "requests",
    "cache_slots",      "cache_bytes",    "cache_hit_rate", "cache_hits",
    "cache_misses",     "cache_resident", "cache_swaps",    "cache_copy_gibs",
    "cache_copy_bytes", "adapt_wait_s",   "uptime_s",       "window_s",
    "monitor_s"};

#define N_OF(a) (sizeof a / sizeof *a)

static struct wclient_hello hello(void)
{
    struct wclient_hello h = {.n_ctx = 2048, .max_seqs = 4, .pid = 4242, .bit_exact = true};
    strcpy(h.model, "démo");
    strcpy(h.arch, "qwen3moe");
    strcpy(h.backend, "cpu");
    strcpy(h.kv_type, "f32");
    return h;
}

static struct wclient_status status(void)
{
    struct wclient_status s = {.running = 2,
                               .queued = 1,
                               .max_queue = 64,
                               .kv_blocks_used = 10,
                               .kv_blocks_total = 128,
                               .tok_s = 12.5,
                               .prefill_tok_s = 300.25,
                               .windows = 5000000000ull,
                               .tokens_generated = 77,
                               .prompt_tokens = 99,
                               .prefix_hits = 16,
                               .requests = 3,
                               .cache_slots = 40,
                               .cache_bytes = 1ull << 33,
                               .cache_hit_rate = 0.75,
                               .cache_hits = 30,
                               .cache_misses = 10,
                               .cache_resident = 38,
                               .cache_swaps = 6,
                               .cache_copy_gibs = 20.5,
                               .adapt_wait_s = 0.125,
                               .uptime_s = 60,
                               .window_s = 30.5,
                               .monitor_s = 0.01,
                               .copy_bytes = 123456789};
    return s;
}

static void has_keys(const json_t *w, const char *const *keys, size_t n, bool want)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg((json_object_get(w, keys[i]) != NULL) == want, "key %s %s", keys[i],
                      want ? "missing" : "present");
}

START_TEST(worker_json_has_the_documented_keys)
{
    struct wclient_hello h = hello();
    struct wclient_status s = status();
    json_t *w = fe_worker_json(&h, &s);
    ck_assert_ptr_nonnull(w);
    has_keys(w, HELLO_KEYS, N_OF(HELLO_KEYS), true);
    has_keys(w, STATUS_KEYS, N_OF(STATUS_KEYS), true);
    ck_assert_uint_eq(json_object_size(w), N_OF(HELLO_KEYS) + N_OF(STATUS_KEYS));
    ck_assert_str_eq(json_string_value(json_object_get(w, "model")), "démo");
    ck_assert_int_eq(json_integer_value(json_object_get(w, "pid")), 4242);
    ck_assert(json_is_true(json_object_get(w, "bit_exact")));
    ck_assert_int_eq(json_integer_value(json_object_get(w, "windows")), 5000000000ll);
    ck_assert_int_eq(json_integer_value(json_object_get(w, "cache_bytes")), 1ll << 33);
    ck_assert_int_eq(json_integer_value(json_object_get(w, "cache_copy_bytes")), 123456789);
    ck_assert(json_real_value(json_object_get(w, "prefill_tok_s")) == 300.25);
    ck_assert(json_real_value(json_object_get(w, "cache_hit_rate")) == 0.75);
    /* hello's names stand for an older worker's empty ones; a newer status's win */
    ck_assert_str_eq(json_string_value(json_object_get(w, "backend")), "cpu");
    json_decref(w);
    strcpy(s.backend, "cuda");
    strcpy(s.kv_type, "f16");
    w = fe_worker_json(&h, &s);
    ck_assert_str_eq(json_string_value(json_object_get(w, "backend")), "cuda");
    ck_assert_str_eq(json_string_value(json_object_get(w, "kv_type")), "f16");
    json_decref(w);

    /* not read yet: the part's keys are left out */
    w = fe_worker_json(NULL, NULL);
    ck_assert_uint_eq(json_object_size(w), 0);
    json_decref(w);
    w = fe_worker_json(&h, NULL);
    ck_assert_uint_eq(json_object_size(w), N_OF(HELLO_KEYS));
    json_decref(w);
    w = fe_worker_json(NULL, &s);
    has_keys(w, HELLO_KEYS + 4, N_OF(HELLO_KEYS) - 4, false);
    ck_assert_str_eq(json_string_value(json_object_get(w, "backend")), "cuda");
    json_decref(w);
}
END_TEST

/* A model name that is not UTF-8 (general.name is a GGUF's bytes) and rates that are not finite
 * (a division by a zero time) keep every key: the bytes become U+FFFD, the figures 0. */
START_TEST(odd_values_keep_every_key)
{
    struct wclient_hello h = hello();
    strcpy(h.model, "bad\xff\xc3");
    struct wclient_status s = status();
    s.tok_s = NAN;
    s.cache_copy_gibs = INFINITY;
    s.uptime_s = -INFINITY;
    json_t *w = fe_worker_json(&h, &s);
    has_keys(w, HELLO_KEYS, N_OF(HELLO_KEYS), true);
    has_keys(w, STATUS_KEYS, N_OF(STATUS_KEYS), true);
    ck_assert_str_eq(json_string_value(json_object_get(w, "model")), "bad\xef\xbf\xbd\xef\xbf\xbd");
    ck_assert(json_real_value(json_object_get(w, "tok_s")) == 0);
    ck_assert(json_real_value(json_object_get(w, "cache_copy_gibs")) == 0);
    ck_assert(json_real_value(json_object_get(w, "uptime_s")) == 0);
    ck_assert(json_real_value(json_object_get(w, "window_s")) == 30.5);
    char *text = json_dumps(w, JSON_COMPACT);
    ck_assert_ptr_nonnull(text);
    free(text);
    json_decref(w);
    /* a name filling its whole array without a NUL is read to the array's end */
    memset(h.model, 'm', sizeof h.model);
    w = fe_worker_json(&h, NULL);
    ck_assert_uint_eq(json_string_length(json_object_get(w, "model")), sizeof h.model);
    json_decref(w);
}
END_TEST

START_TEST(vram_json)
{
    struct wclient_vram v = {.total_bytes = 150ull << 30,
                             .free_bytes = 1,
                             .weights_bytes = 2,
                             .kv_bytes = 3,
                             .cache_bytes = 4,
                             .cache_slots = 5};
    json_t *j = fe_vram_json(&v);
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    ck_assert_str_eq(s, "{\"cache_bytes\":4,\"cache_slots\":5,\"free_bytes\":1,\"kv_bytes\":3,"
                        "\"total_bytes\":161061273600,\"weights_bytes\":2}");
    free(s);
    json_decref(j);
}
END_TEST

/* a fake worker's vram and heat, counting calls */
static int g_vram_calls, g_heat_calls;
static bool g_heat_fails;

static int fake_vram(void *w, struct wclient_vram *out)
{
    g_vram_calls++;
    *out = (struct wclient_vram){.total_bytes = 100, .cache_slots = (uint32_t)g_vram_calls};
    return 0;
}

static int fake_heat(void *w, struct wclient_heat *out)
{
    g_heat_calls++;
    if (g_heat_fails) return STRATA_EUNSUPPORTED;
    out->n_layer = 2;
    out->n_expert = 3;
    out->counts = malloc(6 * sizeof *out->counts);
    for (int i = 0; i < 6; i++)
        out->counts[i] = (uint64_t)(g_heat_calls * 10 + i);
    return 0;
}

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

START_TEST(watch_reads_only_while_watched)
{
    static struct fe f; /* large: not on the stack */
    memset(&f, 0, sizeof f);
    pthread_mutex_init(&f.mu, NULL);
    static const struct fe_backend ops = {.vram = fake_vram, .heat = fake_heat};
    struct fe_worker *wk = &f.workers[0];
    wk->ops = &ops;
    g_vram_calls = g_heat_calls = 0;
    /* never watched: nothing asked */
    fe_status_watch(&f, wk);
    ck_assert_int_eq(g_vram_calls + g_heat_calls, 0);
    ck_assert(!wk->has_vram);
    /* watched longer ago than FE_STATUS_WATCH_MS: nothing asked either */
    atomic_store(&f.status_seen_ns, mono_ns() - (int64_t)(FE_STATUS_WATCH_MS + 1000) * 1000000);
    fe_status_watch(&f, wk);
    ck_assert_int_eq(g_vram_calls + g_heat_calls, 0);
    /* watched "now" (a read an hour ahead is recent whatever the machine's load) */
    atomic_store(&f.status_seen_ns, mono_ns() + 3600ll * 1000000000);
    fe_status_watch(&f, wk);
    ck_assert_int_eq(g_vram_calls, 1);
    ck_assert_int_eq(g_heat_calls, 1);
    ck_assert(wk->has_vram);
    ck_assert_uint_eq(wk->vram.cache_slots, 1);
    ck_assert_uint_eq(wk->heat.n_layer, 2);
    ck_assert_uint_eq(wk->heat.counts[5], 15);
    /* the next read replaces the heat (the old counts are freed: LeakSanitizer would say) */
    fe_status_watch(&f, wk);
    ck_assert_uint_eq(wk->heat.counts[5], 25);
    ck_assert_uint_eq(wk->vram.cache_slots, 2);
    /* a failed heat read keeps the last one */
    g_heat_fails = true;
    fe_status_watch(&f, wk);
    g_heat_fails = false;
    ck_assert_uint_eq(wk->heat.counts[0], 20);
    ck_assert_uint_eq(wk->vram.cache_slots, 3);
    /* a backend without vram or heat is not asked */
    static const struct fe_backend none = {0};
    struct fe_worker *w2 = &f.workers[1];
    w2->ops = &none;
    fe_status_watch(&f, w2);
    ck_assert(!w2->has_vram);
    ck_assert_ptr_null(w2->heat.counts);
    wclient_heat_free(&wk->heat);
    pthread_mutex_destroy(&f.mu);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fe_status");
    TCase *tc = tcase_create("fe_status");
    tcase_add_test(tc, worker_json_has_the_documented_keys);
    tcase_add_test(tc, odd_values_keep_every_key);
    tcase_add_test(tc, vram_json);
    tcase_add_test(tc, watch_reads_only_while_watched);
    suite_add_tcase(s, tc);
    return test_run(s);
}
