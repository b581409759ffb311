#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/quant/qtype.h"
#include "common/quant/quant.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- helpers --------------------------------------------------------------------------------- */

static const char *tmp_path(const char *name)
{
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", test_tmpdir(), name);
    return buf;
}

static struct gguf_file *write_open(const struct fixture_opts *o, const char *name)
{
    const char *p = tmp_path(name);
    int rv = fixture_write(o, p);
    ck_assert_msg(rv == 0, "fixture_write %s: %s: %s", name, strata_strerror(rv),
                  strata_errdetail());
    struct gguf_file *f = NULL;
    rv = gguf_open(p, &f);
    ck_assert_msg(rv == 0, "gguf_open %s: %s: %s", name, strata_strerror(rv), strata_errdetail());
    return f;
}

static uint64_t file_hash(const char *path)
{
    size_t n = 0;
    char *b = test_read_file(path, &n);
    ck_assert_ptr_nonnull(b);
    uint64_t h = XXH64(b, n, 0);
    free(b);
    return h;
}

static uint32_t get_u32(const struct gguf_file *f, const char *key)
{
    uint32_t v = 0;
    int rv = gguf_get_u32(f, key, &v);
    ck_assert_msg(rv == 0, "key %s: %s", key, strata_strerror(rv));
    return v;
}

static void check_str(const struct gguf_file *f, const char *key, const char *want)
{
    struct gguf_str s;
    ck_assert_msg(gguf_get_str(f, key, &s) == 0, "key %s missing", key);
    ck_assert_msg(s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0, "key %s: %.*s, want %s",
                  key, (int)s.len, s.ptr, want);
}

/* expect checks one tensor's presence, shape and type; returns it. */
static const struct gguf_tensor *expect(const struct gguf_file *f, const char *name, uint32_t type,
                                        uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2)
{
    const struct gguf_tensor *t = gguf_tensor_find(f, name);
    ck_assert_msg(t != NULL, "tensor %s missing", name);
    ck_assert_msg(t->n_dims == n_dims, "%s: %u dims, want %u", name, t->n_dims, n_dims);
    uint64_t ne[3] = {ne0, ne1, ne2};
    for (uint32_t d = 0; d < n_dims; d++)
        ck_assert_msg(t->ne[d] == ne[d], "%s: ne[%u] = %llu, want %llu", name, d,
                      (unsigned long long)t->ne[d], (unsigned long long)ne[d]);
    ck_assert_msg(t->type == type, "%s: type %s, want %s", name, qtype_name(t->type),
                  qtype_name(type));
    return t;
}

enum arch { QWEN3MOE, LLAMA, OLMOE, QWEN2MOE };
static const char *const arch_name[] = {"qwen3moe", "llama", "olmoe", "qwen2moe"};

/* What a reader of the file expects, written from llama.cpp's loaders (src/models/<arch>.cpp)
 * and llama-quant.cpp's Q4_K_M rules, independently of tools/fixture.c. */
struct want {
    enum arch arch;
    const char *type;  /* NULL: q4_k_m */
    const char *shape; /* NULL: tiny */
    bool old_layout, tied;
};

static uint32_t want_type(const struct want *w, const char *role, uint32_t layer, uint32_t n_layer,
                          uint32_t n_expert)
{
    if (w->type) return (uint32_t)qtype_parse(w->type);
    bool more = layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
    if (strcmp(role, "output") == 0) return QT_Q6_K;
    if (strcmp(role, "attn_v") == 0) return n_expert == 8 ? QT_Q8_0 : more ? QT_Q6_K : QT_Q4_K;
    if (strcmp(role, "attn_k") == 0) return n_expert == 8 ? QT_Q8_0 : QT_Q4_K;
    if (strcmp(role, "attn_output") == 0) return n_expert == 8 ? QT_Q5_K : QT_Q4_K;
    if (strcmp(role, "ffn_down") == 0) return more ? QT_Q6_K : QT_Q4_K;
    return QT_Q4_K;
}

static void check_model(const struct gguf_file *f, const struct want *w)
{
    const char *a = arch_name[w->arch];
    char k[160];
#define K(suffix) (snprintf(k, sizeof k, "%s." suffix, a), k)
    check_str(f, "general.architecture", a);
    ck_assert_ptr_nonnull(gguf_find(f, "general.name"));
    ck_assert_uint_eq(get_u32(f, "general.quantization_version"), 2);
    uint32_t ftype = get_u32(f, "general.file_type");
    if (!w->type) ck_assert_uint_eq(ftype, 15); /* LLAMA_FTYPE_MOSTLY_Q4_K_M */
    uint32_t L = get_u32(f, K("block_count")), E = get_u32(f, K("embedding_length"));
    uint32_t H = get_u32(f, K("attention.head_count")),
             HKV = get_u32(f, K("attention.head_count_kv"));
    uint32_t X = get_u32(f, K("expert_count")), XU = get_u32(f, K("expert_used_count"));
    uint32_t FF = get_u32(f, K("feed_forward_length"));
    ck_assert_uint_gt(get_u32(f, K("context_length")), 0);
    float eps = 0, base = 0;
    ck_assert_int_eq(gguf_get_f32(f, K("attention.layer_norm_rms_epsilon"), &eps), 0);
    ck_assert_int_eq(gguf_get_f32(f, K("rope.freq_base"), &base), 0);
    ck_assert(eps > 0 && eps < 1e-4f && base >= 10000.0f);
    struct fixture_hparams hp;
    ck_assert_int_eq(fixture_hparams(a, w->shape, &hp), 0);
    ck_assert_uint_eq(L, hp.n_layer);
    ck_assert_uint_eq(E, hp.n_embd);
    ck_assert_uint_eq(X, hp.n_expert);
    ck_assert_uint_eq(XU, hp.n_expert_used);

    uint32_t hd = E / H;
    if (w->arch == QWEN3MOE || w->arch == LLAMA) {
        hd = get_u32(f, K("attention.key_length"));
        ck_assert_uint_eq(get_u32(f, K("attention.value_length")), hd);
        if (!w->shape) ck_assert_uint_ne(hd, E / H); /* the tiny shape exercises key_length */
    } else {
        ck_assert_ptr_null(gguf_find(f, K("attention.key_length")));
    }
    if (w->arch == OLMOE) ck_assert_uint_eq(HKV, H);
    uint32_t F = FF, S = 0;
    if (w->arch == QWEN3MOE || w->arch == QWEN2MOE) F = get_u32(f, K("expert_feed_forward_length"));
    if (w->arch == QWEN2MOE) S = get_u32(f, K("expert_shared_feed_forward_length"));
    if (w->arch == LLAMA) ck_assert_uint_eq(get_u32(f, K("rope.dimension_count")), hd);
#undef K

    const struct gguf_value *toks;
    ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &toks), 0);
    uint64_t V = toks->arr.n;
    if (w->arch == LLAMA) ck_assert_uint_eq(get_u32(f, "llama.vocab_size"), V);

    uint64_t n = 0;
    char nm[128];
#define T(type, nd, a0, a1, a2, ...)                                                               \
    (snprintf(nm, sizeof nm, __VA_ARGS__), n++, expect(f, nm, type, nd, a0, a1, a2))
    uint32_t wf = w->type ? want_type(w, "", 0, L, X) : 0;
    T(w->type ? wf : (w->tied ? QT_Q6_K : QT_Q4_K), 2, E, V, 1, "token_embd.weight");
    T(QT_F32, 1, E, 1, 1, "output_norm.weight");
    if (!w->tied)
        T(want_type(w, "output", 0, L, X), 2, E, V, 1, "output.weight");
    else
        ck_assert_ptr_null(gguf_tensor_find(f, "output.weight"));
    for (uint32_t l = 0; l < L; l++) {
        T(QT_F32, 1, E, 1, 1, "blk.%u.attn_norm.weight", l);
        T(want_type(w, "attn_q", l, L, X), 2, E, H * hd, 1, "blk.%u.attn_q.weight", l);
        T(want_type(w, "attn_k", l, L, X), 2, E, HKV * hd, 1, "blk.%u.attn_k.weight", l);
        T(want_type(w, "attn_v", l, L, X), 2, E, HKV * hd, 1, "blk.%u.attn_v.weight", l);
        T(want_type(w, "attn_output", l, L, X), 2, H * hd, E, 1, "blk.%u.attn_output.weight", l);
        if (w->arch == QWEN2MOE) {
            T(QT_F32, 1, H * hd, 1, 1, "blk.%u.attn_q.bias", l);
            T(QT_F32, 1, HKV * hd, 1, 1, "blk.%u.attn_k.bias", l);
            T(QT_F32, 1, HKV * hd, 1, 1, "blk.%u.attn_v.bias", l);
        }
        if (w->arch == QWEN3MOE) {
            T(QT_F32, 1, hd, 1, 1, "blk.%u.attn_q_norm.weight", l);
            T(QT_F32, 1, hd, 1, 1, "blk.%u.attn_k_norm.weight", l);
        }
        if (w->arch == OLMOE) {
            T(QT_F32, 1, H * hd, 1, 1, "blk.%u.attn_q_norm.weight", l);
            T(QT_F32, 1, HKV * hd, 1, 1, "blk.%u.attn_k_norm.weight", l);
        }
        T(QT_F32, 1, E, 1, 1, "blk.%u.ffn_norm.weight", l);
        T(QT_F32, 2, E, X, 1, "blk.%u.ffn_gate_inp.weight", l);
        if (w->old_layout) {
            for (uint32_t e = 0; e < X; e++) {
                T(want_type(w, "ffn_gate", l, L, X), 2, E, F, 1, "blk.%u.ffn_gate.%u.weight", l, e);
                T(want_type(w, "ffn_up", l, L, X), 2, E, F, 1, "blk.%u.ffn_up.%u.weight", l, e);
                T(want_type(w, "ffn_down", l, L, X), 2, F, E, 1, "blk.%u.ffn_down.%u.weight", l, e);
            }
            ck_assert_ptr_null(gguf_tensor_find(f, "blk.0.ffn_gate_exps.weight"));
        } else {
            T(want_type(w, "ffn_gate", l, L, X), 3, E, F, X, "blk.%u.ffn_gate_exps.weight", l);
            T(want_type(w, "ffn_up", l, L, X), 3, E, F, X, "blk.%u.ffn_up_exps.weight", l);
            T(want_type(w, "ffn_down", l, L, X), 3, F, E, X, "blk.%u.ffn_down_exps.weight", l);
        }
        if (w->arch == QWEN2MOE) {
            T(QT_F32, 1, E, 1, 1, "blk.%u.ffn_gate_inp_shexp.weight", l);
            T(want_type(w, "ffn_gate", l, L, X), 2, E, S, 1, "blk.%u.ffn_gate_shexp.weight", l);
            T(want_type(w, "ffn_up", l, L, X), 2, E, S, 1, "blk.%u.ffn_up_shexp.weight", l);
            T(want_type(w, "ffn_down", l, L, X), 2, S, E, 1, "blk.%u.ffn_down_shexp.weight", l);
        }
    }
#undef T
    ck_assert_uint_eq(f->n_tensors, n); /* nothing else */
}

static void write_check(const struct want *w, const char *file)
{
    struct fixture_opts o = {.arch = arch_name[w->arch],
                             .type = w->type,
                             .shape = w->shape,
                             .seed = 7,
                             .old_layout = w->old_layout,
                             .tied = w->tied};
    struct gguf_file *f = write_open(&o, file);
    check_model(f, w);
    gguf_close(f);
    unlink(tmp_path(file));
}

/* ---- architectures and types ----------------------------------------------------------------- */

START_TEST(qwen3moe_types)
{
    static const char *types[] = {"f32", "q8_0", "q4_k", NULL};
    for (int i = 0; i < 4; i++)
        write_check(&(struct want){.arch = QWEN3MOE, .type = types[i]}, "qwen3moe.gguf");
    write_check(&(struct want){.arch = QWEN3MOE, .type = NULL, .tied = true}, "qwen3moe-tied.gguf");
}
END_TEST

START_TEST(llama_layouts)
{
    write_check(&(struct want){.arch = LLAMA, .type = NULL}, "mixtral.gguf");
    write_check(&(struct want){.arch = LLAMA, .type = "f32", .old_layout = true},
                "mixtral-old-f32.gguf");
    write_check(&(struct want){.arch = LLAMA, .type = NULL, .old_layout = true},
                "mixtral-old.gguf");
}
END_TEST

START_TEST(olmoe_and_qwen2moe)
{
    write_check(&(struct want){.arch = OLMOE, .type = "q8_0"}, "olmoe.gguf");
    write_check(&(struct want){.arch = OLMOE, .type = NULL}, "olmoe-mix.gguf");
    write_check(&(struct want){.arch = QWEN2MOE, .type = "f32"}, "qwen2moe.gguf");
    write_check(&(struct want){.arch = QWEN2MOE, .type = NULL}, "qwen2moe-mix.gguf");
}
END_TEST

START_TEST(bad_options_are_refused)
{
    const char *p = tmp_path("bad.gguf");
    struct fixture_opts o = {.arch = "gpt5moe"};
    ck_assert_int_eq(fixture_write(&o, p), STRATA_EINVAL);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "gpt5moe"));
    o = (struct fixture_opts){.type = "iq2_xxs"};
    ck_assert_int_eq(fixture_write(&o, p), STRATA_EINVAL);
    o = (struct fixture_opts){.old_layout = true};
    ck_assert_int_eq(fixture_write(&o, p), STRATA_EINVAL);
    o = (struct fixture_opts){.arch = "olmoe", .tied = true};
    ck_assert_int_eq(fixture_write(&o, p), STRATA_EINVAL);
    o = (struct fixture_opts){.shape = "qwen3-huge"};
    ck_assert_int_eq(fixture_write(&o, p), STRATA_EINVAL);
    ck_assert_int_ne(access(p, F_OK), 0);
}
END_TEST

/* ---- determinism ----------------------------------------------------------------------------- */

START_TEST(same_seed_same_bytes)
{
    for (int mode = FIXTURE_FLOAT; mode <= FIXTURE_BLOCKS; mode++) {
        struct fixture_opts o = {
            .seed = 42, .mode = (enum fixture_mode)mode, .zipf = 1.0, .threads = 1};
        ck_assert_int_eq(fixture_write(&o, tmp_path("d1.gguf")), 0);
        o.threads = 3; /* other threads, same bytes */
        ck_assert_int_eq(fixture_write(&o, tmp_path("d2.gguf")), 0);
        o.seed = 43;
        ck_assert_int_eq(fixture_write(&o, tmp_path("d3.gguf")), 0);
        uint64_t h1 = file_hash(tmp_path("d1.gguf")), h2 = file_hash(tmp_path("d2.gguf"));
        ck_assert_uint_eq(h1, h2);
        ck_assert_uint_ne(h1, file_hash(tmp_path("d3.gguf")));
    }
}
END_TEST

/* ---- random blocks --------------------------------------------------------------------------- */

/* Random blocks decode to finite weights with the spread the float path would give them. */
START_TEST(random_blocks_are_bounded)
{
    struct fixture_opts o = {.mode = FIXTURE_BLOCKS, .seed = 3};
    struct gguf_file *f = write_open(&o, "blocks.gguf");
    struct fixture_hparams hp;
    ck_assert_int_eq(fixture_hparams(NULL, NULL, &hp), 0);
    struct {
        const char *name;
        double want_std;
    } cases[] = {
        {"blk.0.attn_q.weight", 1.0 / sqrt(hp.n_embd)},                          /* Q4_K */
        {"blk.1.attn_k.weight", 1.0 / sqrt(hp.n_embd)},                          /* Q8_0 */
        {"blk.0.attn_output.weight", 1.0 / sqrt(hp.n_head * hp.head_dim) / 2.0}, /* Q5_K */
        {"blk.1.ffn_down_exps.weight", 1.0 / sqrt(hp.n_ff_exp) / 2.0},           /* Q6_K */
        {"output.weight", 16.0 / sqrt(hp.n_embd)},                               /* Q6_K */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct gguf_tensor *t = gguf_tensor_find(f, cases[c].name);
        ck_assert_ptr_nonnull(t);
        uint64_t n = t->ne[0] * t->ne[1] * t->ne[2];
        float *v = malloc(n * sizeof *v);
        ck_assert_int_eq(quant_dequantize(t->type, t->data, v, (int64_t)n), 0);
        double s = 0, sq = 0;
        for (uint64_t i = 0; i < n; i++) {
            ck_assert(isfinite(v[i]));
            s += v[i];
            sq += (double)v[i] * v[i];
        }
        double mean = s / (double)n, std = sqrt(sq / (double)n - mean * mean);
        printf("random blocks %s (%s): mean %.5f std %.5f, float path std %.5f\n", cases[c].name,
               qtype_name(t->type), mean, std, cases[c].want_std);
        ck_assert_msg(std > 0.7 * cases[c].want_std && std < 1.4 * cases[c].want_std,
                      "%s: std %g, want ~%g", cases[c].name, std, cases[c].want_std);
        ck_assert_msg(fabs(mean) < 0.1 * std, "%s: mean %g", cases[c].name, mean);
        free(v);
    }
    gguf_close(f);
}
END_TEST

/* qwen3-mini (0.7 GB of random blocks) is written at disk speed: a few seconds. */
START_TEST(qwen3_mini_random_blocks)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct fixture_opts o = {.shape = "qwen3-mini", .seed = 7};
    struct gguf_file *f = write_open(&o, "mini.gguf");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    check_model(f, &(struct want){.arch = QWEN3MOE, .shape = "qwen3-mini"});
    uint64_t n = f->splits[0].size;
    gguf_close(f);
    unlink(tmp_path("mini.gguf"));
    printf("qwen3-mini q4_k_m: %.1f MiB written in %.2f s (%.0f MiB/s)\n", (double)n / 1048576.0, s,
           (double)n / 1048576.0 / s);
    ck_assert_uint_gt(n, 600u << 20);
}
END_TEST

/* gpt-oss as llama.cpp's loader creates it (src/llama-model.cpp, LLM_ARCH_OPENAI_MOE) and
 * llama-quantize's MXFP4_MOE types it: written here independently of tools/fixture.c. */
static void check_gpt_oss(const struct gguf_file *f, const char *shape, bool mxfp4_moe)
{
    char k[160];
#define K(suffix) (snprintf(k, sizeof k, "gpt-oss." suffix), k)
    check_str(f, "general.architecture", "gpt-oss");
    struct fixture_hparams hp;
    ck_assert_int_eq(fixture_hparams("gpt-oss", shape, &hp), 0);
    const uint32_t L = get_u32(f, K("block_count")), E = get_u32(f, K("embedding_length"));
    const uint32_t H = get_u32(f, K("attention.head_count")),
                   HKV = get_u32(f, K("attention.head_count_kv"));
    const uint32_t X = get_u32(f, K("expert_count"));
    const uint32_t F = get_u32(f, K("expert_feed_forward_length"));
    const uint32_t hd = get_u32(f, K("attention.key_length"));
    ck_assert_uint_eq(L, hp.n_layer);
    ck_assert_uint_eq(X, hp.n_expert);
    ck_assert_uint_eq(get_u32(f, K("attention.value_length")), hd);
    ck_assert_uint_eq(get_u32(f, K("attention.sliding_window")), shape ? 128 : 8);
    check_str(f, K("rope.scaling.type"), "yarn");
    float factor = 0;
    ck_assert_int_eq(gguf_get_f32(f, K("rope.scaling.factor"), &factor), 0);
    ck_assert_float_eq(factor, 32.0f);
    ck_assert_uint_eq(get_u32(f, K("rope.scaling.original_context_length")), 4096);
    if (mxfp4_moe) ck_assert_uint_eq(get_u32(f, "general.file_type"), 38);
#undef K
    const struct gguf_value *toks;
    ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &toks), 0);
    const uint64_t V = toks->arr.n;
    const uint32_t dense = mxfp4_moe ? QT_Q8_0 : QT_F32, exps = mxfp4_moe ? QT_MXFP4 : QT_F32;
    uint64_t n = 0;
    char nm[128];
#define T(type, nd, a0, a1, a2, ...)                                                               \
    (snprintf(nm, sizeof nm, __VA_ARGS__), n++, expect(f, nm, type, nd, a0, a1, a2))
    T(dense, 2, E, V, 1, "token_embd.weight");
    T(QT_F32, 1, E, 1, 1, "output_norm.weight");
    T(dense, 2, E, V, 1, "output.weight");
    for (uint32_t l = 0; l < L; l++) {
        T(QT_F32, 1, E, 1, 1, "blk.%u.attn_norm.weight", l);
        T(QT_F32, 1, E, 1, 1, "blk.%u.post_attention_norm.weight", l);
        T(dense, 2, E, H * hd, 1, "blk.%u.attn_q.weight", l);
        T(dense, 2, E, HKV * hd, 1, "blk.%u.attn_k.weight", l);
        T(dense, 2, E, HKV * hd, 1, "blk.%u.attn_v.weight", l);
        T(dense, 2, H * hd, E, 1, "blk.%u.attn_output.weight", l);
        T(QT_F32, 1, H * hd, 1, 1, "blk.%u.attn_q.bias", l);
        T(QT_F32, 1, HKV * hd, 1, 1, "blk.%u.attn_k.bias", l);
        T(QT_F32, 1, HKV * hd, 1, 1, "blk.%u.attn_v.bias", l);
        T(QT_F32, 1, E, 1, 1, "blk.%u.attn_output.bias", l);
        T(QT_F32, 1, H, 1, 1, "blk.%u.attn_sinks.weight", l);
        T(QT_F32, 2, E, X, 1, "blk.%u.ffn_gate_inp.weight", l);
        T(QT_F32, 1, X, 1, 1, "blk.%u.ffn_gate_inp.bias", l);
        T(exps, 3, E, F, X, "blk.%u.ffn_gate_exps.weight", l);
        T(exps, 3, E, F, X, "blk.%u.ffn_up_exps.weight", l);
        T(exps, 3, F, E, X, "blk.%u.ffn_down_exps.weight", l);
        T(QT_F32, 2, F, X, 1, "blk.%u.ffn_gate_exps.bias", l);
        T(QT_F32, 2, F, X, 1, "blk.%u.ffn_up_exps.bias", l);
        T(QT_F32, 2, E, X, 1, "blk.%u.ffn_down_exps.bias", l);
    }
#undef T
    ck_assert_uint_eq(f->n_tensors, n);
}

START_TEST(gpt_oss_tensors_keys_and_random_mxfp4)
{
    struct fixture_opts o = {.arch = "gpt-oss", .type = "f32", .seed = 7};
    struct gguf_file *f = write_open(&o, "oss.gguf");
    check_gpt_oss(f, NULL, false);
    gguf_close(f);
    o.type = "mxfp4_moe";
    f = write_open(&o, "oss-mx.gguf");
    check_gpt_oss(f, NULL, true);
    gguf_close(f);
    /* random MXFP4 blocks (the large shapes' path): E8M0 scales give the float path's spread */
    o.mode = FIXTURE_BLOCKS;
    f = write_open(&o, "oss-mx-blocks.gguf");
    check_gpt_oss(f, NULL, true);
    const struct gguf_tensor *t = gguf_tensor_find(f, "blk.1.ffn_up_exps.weight");
    const uint64_t n = t->ne[0] * t->ne[1] * t->ne[2];
    float *v = malloc(n * sizeof *v);
    ck_assert_int_eq(quant_dequantize(t->type, t->data, v, (int64_t)n), 0);
    double sum = 0, sq = 0;
    for (uint64_t i = 0; i < n; i++) {
        ck_assert(isfinite(v[i]));
        sum += v[i];
        sq += (double)v[i] * v[i];
    }
    const double mean = sum / (double)n, std = sqrt(sq / (double)n - mean * mean);
    const double want = 1.0 / sqrt((double)t->ne[0]);
    printf("random mxfp4 blocks %s: mean %.5f std %.5f, float path std %.5f\n", t->name, mean, std,
           want);
    /* E8M0 scales are powers of two: the spread lands within a factor sqrt(2) of the aim */
    ck_assert_msg(std > 0.6 * want && std < 1.5 * want, "std %g, want ~%g", std, want);
    ck_assert_msg(fabs(mean) < 0.1 * std, "mean %g", mean);
    free(v);
    gguf_close(f);
    unlink(tmp_path("oss.gguf"));
    unlink(tmp_path("oss-mx.gguf"));
    unlink(tmp_path("oss-mx-blocks.gguf"));
}
END_TEST

/* glm4moe: llama.cpp's GLM4_MOE tensors and keys: a dense layer, the MoE layers' selection bias
 * and ungated shared expert, the MTP layer's own tensors after the trunk; the real shapes. */
START_TEST(glm4moe_tensors_keys_and_shapes)
{
    struct fixture_opts o = {.arch = "glm4moe", .type = "f32", .seed = 7};
    struct gguf_file *f = write_open(&o, "glm.gguf");
    check_str(f, "general.architecture", "glm4moe");
    ck_assert_uint_eq(get_u32(f, "glm4moe.block_count"), 4);
    ck_assert_uint_eq(get_u32(f, "glm4moe.nextn_predict_layers"), 1);
    ck_assert_uint_eq(get_u32(f, "glm4moe.leading_dense_block_count"), 1);
    ck_assert_uint_eq(get_u32(f, "glm4moe.rope.dimension_count"), 64);
    ck_assert_uint_eq(get_u32(f, "glm4moe.attention.key_length"), 128);
    ck_assert_uint_eq(get_u32(f, "glm4moe.expert_shared_count"), 1);
    ck_assert_uint_eq(get_u32(f, "glm4moe.expert_gating_func"), 2);
    ck_assert_uint_eq(get_u32(f, "glm4moe.feed_forward_length"), 768);
    float scale = 0;
    ck_assert_int_eq(gguf_get_f32(f, "glm4moe.expert_weights_scale", &scale), 0);
    ck_assert_float_eq(scale, 2.5f);
    expect(f, "blk.0.ffn_gate.weight", QT_F32, 2, 256, 768, 1);
    expect(f, "blk.0.ffn_down.weight", QT_F32, 2, 768, 256, 1);
    ck_assert_ptr_null(gguf_tensor_find(f, "blk.0.ffn_gate_inp.weight"));
    ck_assert_ptr_null(gguf_tensor_find(f, "blk.0.ffn_up_exps.weight"));
    for (uint32_t l = 1; l < 4; l++) {
        char n[64];
        snprintf(n, sizeof n, "blk.%u.exp_probs_b.bias", l);
        expect(f, n, QT_F32, 1, 8, 1, 1);
        snprintf(n, sizeof n, "blk.%u.ffn_up_shexp.weight", l);
        expect(f, n, QT_F32, 2, 256, 256, 1);
        snprintf(n, sizeof n, "blk.%u.post_attention_norm.weight", l);
        expect(f, n, QT_F32, 1, 256, 1, 1);
        snprintf(n, sizeof n, "blk.%u.attn_q.bias", l);
        expect(f, n, QT_F32, 1, 512, 1, 1);
        snprintf(n, sizeof n, "blk.%u.attn_k_norm.weight", l);
        expect(f, n, QT_F32, 1, 128, 1, 1);
        snprintf(n, sizeof n, "blk.%u.ffn_gate_inp_shexp.weight", l);
        ck_assert_ptr_null(gguf_tensor_find(f, n));
    }
    expect(f, "blk.3.nextn.eh_proj.weight", QT_F32, 2, 512, 256, 1);
    expect(f, "blk.3.nextn.enorm.weight", QT_F32, 1, 256, 1, 1);
    ck_assert_ptr_null(gguf_tensor_find(f, "blk.2.nextn.eh_proj.weight"));
    gguf_close(f);
    unlink(tmp_path("glm.gguf"));
    /* the real models' config.json, as metadata */
    struct fixture_hparams hp;
    ck_assert_int_eq(fixture_hparams("glm4moe", "glm4.5-air", &hp), 0);
    ck_assert_uint_eq(hp.n_layer, 46);
    ck_assert_uint_eq(hp.n_embd, 4096);
    ck_assert_uint_eq(hp.n_expert, 128);
    ck_assert_uint_eq(hp.n_ff_exp, 1408);
    ck_assert_uint_eq(hp.n_ff_shexp, 1408);
    ck_assert_uint_eq(hp.n_rot, 64);
    ck_assert(!hp.qk_norm);
    ck_assert_int_eq(fixture_hparams("glm4moe", "glm4.5", &hp), 0);
    ck_assert_uint_eq(hp.n_layer, 92);
    ck_assert_uint_eq(hp.n_dense_lead, 3);
    ck_assert_uint_eq(hp.n_expert, 160);
    ck_assert_float_eq(hp.exp_scale, 2.5f);
    ck_assert(hp.qk_norm);
    /* the GLM fields stay zero for the other architectures */
    ck_assert_int_eq(fixture_hparams("qwen3moe", "glm4.5", &hp), 0);
    ck_assert_uint_eq(hp.n_dense_lead + hp.n_nextn + hp.n_rot, 0);
}
END_TEST

/* deepseek2: the MLA tensors as current converters write them (attn_k_b, attn_v_b: one matrix
 * per head) and the older attn_kv_b, the cache's head sizes in key/value_length and the heads' in
 * the _mla keys (only the heads' in the older files), the expert groups and YaRN; real shapes. */
START_TEST(deepseek2_tensors_keys_and_shapes)
{
    struct fixture_opts o = {.arch = "deepseek2", .type = "f32", .seed = 7};
    struct gguf_file *f = write_open(&o, "ds.gguf");
    check_str(f, "general.architecture", "deepseek2");
    ck_assert_uint_eq(get_u32(f, "deepseek2.block_count"), 4);
    ck_assert_uint_eq(get_u32(f, "deepseek2.attention.head_count_kv"), 1);
    ck_assert_uint_eq(get_u32(f, "deepseek2.attention.key_length"), 256 + 64);
    ck_assert_uint_eq(get_u32(f, "deepseek2.attention.value_length"), 256);
    ck_assert_uint_eq(get_u32(f, "deepseek2.attention.key_length_mla"), 192);
    ck_assert_uint_eq(get_u32(f, "deepseek2.attention.value_length_mla"), 128);
    ck_assert_uint_eq(get_u32(f, "deepseek2.attention.q_lora_rank"), 256);
    ck_assert_uint_eq(get_u32(f, "deepseek2.attention.kv_lora_rank"), 256);
    ck_assert_uint_eq(get_u32(f, "deepseek2.expert_group_count"), 4);
    ck_assert_uint_eq(get_u32(f, "deepseek2.expert_group_used_count"), 2);
    check_str(f, "deepseek2.rope.scaling.type", "yarn");
    expect(f, "blk.1.attn_q_a.weight", QT_F32, 2, 256, 256, 1);
    expect(f, "blk.1.attn_q_b.weight", QT_F32, 2, 256, 4 * 192, 1);
    expect(f, "blk.1.attn_kv_a_mqa.weight", QT_F32, 2, 256, 256 + 64, 1);
    expect(f, "blk.1.attn_k_b.weight", QT_F32, 3, 128, 256, 4);
    expect(f, "blk.1.attn_v_b.weight", QT_F32, 3, 256, 128, 4);
    expect(f, "blk.1.attn_output.weight", QT_F32, 2, 4 * 128, 256, 1);
    expect(f, "blk.1.ffn_norm.weight", QT_F32, 1, 256, 1, 1);
    expect(f, "blk.0.ffn_gate.weight", QT_F32, 2, 256, 768, 1);
    expect(f, "blk.2.exp_probs_b.bias", QT_F32, 1, 8, 1, 1);
    expect(f, "blk.3.nextn.eh_proj.weight", QT_F32, 2, 512, 256, 1);
    ck_assert_ptr_null(gguf_tensor_find(f, "blk.1.attn_kv_b.weight"));
    ck_assert_ptr_null(gguf_tensor_find(f, "blk.1.post_attention_norm.weight"));
    gguf_close(f);
    o.old_layout = true;
    f = write_open(&o, "ds-old.gguf");
    ck_assert_uint_eq(get_u32(f, "deepseek2.attention.head_count_kv"), 4);
    ck_assert_uint_eq(get_u32(f, "deepseek2.attention.key_length"), 192);
    ck_assert_uint_eq(get_u32(f, "deepseek2.attention.value_length"), 128);
    ck_assert_ptr_null(gguf_find(f, "deepseek2.attention.key_length_mla"));
    expect(f, "blk.1.attn_kv_b.weight", QT_F32, 2, 256, 4 * (128 + 128), 1);
    ck_assert_ptr_null(gguf_tensor_find(f, "blk.1.attn_k_b.weight"));
    gguf_close(f);
    /* the q4_k_m mix gives the 128-wide k_b rows llama.cpp's fallback */
    o.old_layout = false;
    o.type = NULL;
    f = write_open(&o, "ds-mix.gguf");
    ck_assert_uint_eq(gguf_tensor_find(f, "blk.1.attn_k_b.weight")->type, QT_Q5_0);
    gguf_close(f);
    unlink(tmp_path("ds.gguf"));
    unlink(tmp_path("ds-old.gguf"));
    unlink(tmp_path("ds-mix.gguf"));
    struct fixture_hparams hp;
    ck_assert_int_eq(fixture_hparams("deepseek2", "deepseek-v3", &hp), 0);
    ck_assert_uint_eq(hp.n_layer, 61);
    ck_assert_uint_eq(hp.n_expert, 256);
    ck_assert_uint_eq(hp.n_group, 8);
    ck_assert_uint_eq(hp.n_lora_q, 1536);
    ck_assert_uint_eq(hp.n_lora_kv, 512);
    ck_assert_uint_eq(hp.n_dense_lead, 3);
    ck_assert_float_eq(hp.yarn_factor, 40.0f);
    ck_assert_int_eq(fixture_hparams("deepseek2", "kimi-k2", &hp), 0);
    ck_assert_uint_eq(hp.n_expert, 384);
    ck_assert_uint_eq(hp.n_head, 64);
    ck_assert_int_eq(fixture_hparams("deepseek2", "glm4.7-flash", &hp), 0);
    ck_assert_uint_eq(hp.head_dim, 256);
    ck_assert_uint_eq(hp.head_dim_v, 256);
    ck_assert_uint_eq(hp.n_nextn, 1);
}
END_TEST

/* ---- vocabulary ------------------------------------------------------------------------------ */

static int64_t find_token(const struct gguf_value *toks, const char *s)
{
    for (uint64_t i = 0; i < toks->arr.n; i++) {
        struct gguf_str t = gguf_arr_str(toks, i);
        if (t.len == strlen(s) && memcmp(t.ptr, s, t.len) == 0) return (int64_t)i;
    }
    return -1;
}

START_TEST(builtin_vocab)
{
    struct fixture_opts o = {.type = "q8_0"};
    struct gguf_file *f = write_open(&o, "vocab.gguf");
    const struct gguf_value *toks, *types, *merges;
    ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &toks), 0);
    ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_INT32, &types), 0);
    ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_STRING, &merges), 0);
    check_str(f, "tokenizer.ggml.model", "gpt2");
    check_str(f, "tokenizer.ggml.pre", "qwen2");
    ck_assert_uint_eq(toks->arr.n, 512);
    ck_assert_uint_eq(types->arr.n, 512);
    ck_assert_uint_eq(gguf_tensor_find(f, "token_embd.weight")->ne[1], 512);
    /* GPT-2's byte order: '!' first, the space byte as U+0120 'Ġ', newline as U+010A 'Ċ' */
    ck_assert_int_eq(find_token(toks, "!"), 0);
    ck_assert_int_ge(find_token(toks, "\xc4\xa0"), 0);
    ck_assert_int_ge(find_token(toks, "\xc4\x8a"), 0);
    ck_assert_int_ge(find_token(toks, "\xc4\xa0the"), 256); /* a merge learned from the sample */
    ck_assert_uint_ge(merges->arr.n, 150);
    for (uint64_t m = 0; m < merges->arr.n; m++) {
        struct gguf_str s = gguf_arr_str(merges, m);
        char buf[256];
        ck_assert_uint_lt(s.len, sizeof buf);
        memcpy(buf, s.ptr, s.len);
        buf[s.len] = '\0';
        char *sp = strchr(buf, ' ');
        ck_assert_ptr_nonnull(sp);
        *sp = '\0';
        ck_assert_int_ge(find_token(toks, buf), 0);
        ck_assert_int_ge(find_token(toks, sp + 1), 0);
        memmove(sp, sp + 1, strlen(sp + 1) + 1);
        ck_assert_int_ge(find_token(toks, buf), 0); /* the merged token exists */
    }
    int64_t eot = find_token(toks, "<|endoftext|>"), ims = find_token(toks, "<|im_start|>");
    int64_t ime = find_token(toks, "<|im_end|>");
    ck_assert(eot > 255 && ims > 255 && ime > 255);
    ck_assert_int_eq(gguf_arr_i64(types, (uint64_t)eot), 3);
    ck_assert_int_eq(gguf_arr_i64(types, (uint64_t)ime), 3);
    ck_assert_int_eq(gguf_arr_i64(types, 0), 1);
    ck_assert_int_eq(gguf_arr_i64(types, 511), 5); /* padding, as convert_hf_to_gguf.py pads */
    ck_assert_uint_eq(get_u32(f, "tokenizer.ggml.bos_token_id"), (uint32_t)eot);
    ck_assert_uint_eq(get_u32(f, "tokenizer.ggml.eos_token_id"), (uint32_t)ime);
    struct gguf_str tmpl;
    ck_assert_int_eq(gguf_get_str(f, "tokenizer.chat_template", &tmpl), 0);
    ck_assert_ptr_nonnull(memmem(tmpl.ptr, tmpl.len, "<|im_start|>", 12));
    gguf_close(f);
}
END_TEST

START_TEST(vocab_from_file)
{
    const char *vp = test_data_path("tokenizers/ggml-vocab-gpt-2.gguf");
    if (!vp) return;
    struct gguf_file *src = NULL;
    ck_assert_int_eq(gguf_open(vp, &src), 0);
    const struct gguf_value *st;
    ck_assert_int_eq(gguf_get_arr(src, "tokenizer.ggml.tokens", GGUF_STRING, &st), 0);
    struct fixture_opts o = {.arch = "llama", .type = "q8_0", .vocab = vp};
    struct gguf_file *f = write_open(&o, "gpt2vocab.gguf");
    const struct gguf_value *toks;
    ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_STRING, &toks), 0);
    ck_assert_uint_eq(toks->arr.n, st->arr.n);
    struct gguf_str a = gguf_arr_str(toks, 1000), b = gguf_arr_str(st, 1000);
    ck_assert(a.len == b.len && memcmp(a.ptr, b.ptr, a.len) == 0);
    check_str(f, "tokenizer.ggml.model", "gpt2");
    for (uint64_t i = 0; i < src->n_kv; i++)
        if (strncmp(src->kv[i].key, "tokenizer.", 10) == 0)
            ck_assert_ptr_nonnull(gguf_find(f, src->kv[i].key));
    check_model(f, &(struct want){.arch = LLAMA, .type = "q8_0"});
    ck_assert_uint_eq(gguf_tensor_find(f, "output.weight")->ne[1], st->arr.n);
    gguf_close(f);
    gguf_close(src);
}
END_TEST

/* ---- routing and logits ---------------------------------------------------------------------- */

static uint64_t lcg = 0x853c49e6748fea9bull;
static float test_rand(void) /* uniform with unit variance */
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return ((float)(lcg >> 40) / 16777216.0f * 2.0f - 1.0f) * 1.7320508f;
}

/* rms_h: RMSNorm(x) * w, as the model feeds the router and the output matrix. */
static void rms_h(const float *x, const float *w, float *h, uint32_t n)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + 1e-6));
    for (uint32_t i = 0; i < n; i++)
        h[i] = x[i] * r * w[i];
}

static const float *f32_data(const struct gguf_file *f, const char *name)
{
    const struct gguf_tensor *t = gguf_tensor_find(f, name);
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->type, QT_F32);
    return (const float *)t->data;
}

/* route: per-expert top-1 and top-k counts of n random residual states (unit spread, plus the
 * token embedding's sink coordinate, read from the file) through layer l's router. */
static void route(const struct gguf_file *f, uint32_t l, int n, uint32_t *top1, uint32_t *topk)
{
    struct fixture_hparams hp;
    ck_assert_int_eq(fixture_hparams(NULL, NULL, &hp), 0);
    uint32_t E = hp.n_embd, X = hp.n_expert;
    char nm[64];
    snprintf(nm, sizeof nm, "blk.%u.ffn_gate_inp.weight", l);
    const float *W = f32_data(f, nm);
    snprintf(nm, sizeof nm, "blk.%u.ffn_norm.weight", l);
    const float *wn = f32_data(f, nm);
    float sink = f32_data(f, "token_embd.weight")[0];
    float x[1024], h[1024], logit[64];
    memset(top1, 0, X * sizeof *top1);
    memset(topk, 0, X * sizeof *topk);
    for (int s = 0; s < n; s++) {
        for (uint32_t i = 0; i < E; i++)
            x[i] = test_rand();
        x[0] = sink;
        rms_h(x, wn, h, E);
        bool used[64] = {false};
        for (uint32_t e = 0; e < X; e++) {
            double d = 0;
            for (uint32_t i = 0; i < E; i++)
                d += (double)W[(size_t)e * E + i] * h[i];
            logit[e] = (float)d;
        }
        for (uint32_t k = 0; k < hp.n_expert_used; k++) {
            int best = -1;
            for (uint32_t e = 0; e < X; e++)
                if (!used[e] && (best < 0 || logit[e] > logit[best])) best = (int)e;
            used[best] = true;
            topk[best]++;
            if (k == 0) top1[best]++;
        }
    }
}

START_TEST(zipf_router_skews_popularity)
{
    struct fixture_opts o = {.type = "f32", .zipf = 1.0, .seed = 5};
    struct gguf_file *f = write_open(&o, "zipf.gguf");
    struct fixture_hparams hp;
    ck_assert_int_eq(fixture_hparams(NULL, NULL, &hp), 0);
    uint32_t X = hp.n_expert, top1[64], topk[64], first[2];
    for (uint32_t l = 0; l < hp.n_layer; l++) {
        route(f, l, 20000, top1, topk);
        /* the intended ranking: router column 0 is beta * log(p_e) / h0, largest first */
        char nm[64];
        snprintf(nm, sizeof nm, "blk.%u.ffn_gate_inp.weight", l);
        const float *W = f32_data(f, nm);
        uint32_t order[64] = {0};
        for (uint32_t e = 0; e < X; e++)
            order[e] = e;
        for (uint32_t i = 0; i < X; i++)
            for (uint32_t j = i + 1; j < X; j++)
                if (W[(size_t)order[j] * hp.n_embd] > W[(size_t)order[i] * hp.n_embd]) {
                    uint32_t t = order[i];
                    order[i] = order[j];
                    order[j] = t;
                }
        first[l] = order[0];
        /* fit log(top-1 share) against log(rank): the measured Zipf exponent */
        double sx = 0, sy = 0, sxx = 0, sxy = 0;
        int inversions = 0;
        printf("zipf:1.0 layer %u top-1 / top-%u counts by intended rank:", l, hp.n_expert_used);
        for (uint32_t r = 0; r < X; r++) {
            double lx = log(r + 1.0), ly = log(top1[order[r]] + 1.0);
            sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly;
            if (r > 0 && topk[order[r]] > topk[order[r - 1]]) inversions++;
            printf(" %u/%u", top1[order[r]], topk[order[r]]);
        }
        double slope = (X * sxy - sx * sy) / (X * sxx - sx * sx);
        printf(" -> exponent %.2f, %d inversions\n", -slope, inversions);
        ck_assert_int_le(inversions, 1);
        ck_assert_uint_gt(topk[order[0]], 4 * topk[order[X - 1]]);
        ck_assert(-slope > 0.75 && -slope < 1.3);
    }
    ck_assert_uint_ne(first[0], first[1]); /* each layer has its own ranking (this seed) */
    gguf_close(f);

    o.zipf = 0;
    f = write_open(&o, "uniform.gguf");
    for (uint32_t l = 0; l < hp.n_layer; l++) {
        route(f, l, 20000, top1, topk);
        uint32_t lo = topk[0], hi = topk[0];
        for (uint32_t e = 1; e < X; e++) {
            lo = topk[e] < lo ? topk[e] : lo;
            hi = topk[e] > hi ? topk[e] : hi;
        }
        printf("uniform layer %u: top-%u counts from %u to %u\n", l, hp.n_expert_used, lo, hi);
        ck_assert_uint_lt(hi, 2 * lo);
    }
    gguf_close(f);
}
END_TEST

/* The output matrix spreads logits so a greedy step rarely has two candidates within 0.05. */
START_TEST(greedy_logit_gap)
{
    struct fixture_opts o = {.type = "f32", .seed = 11};
    struct gguf_file *f = write_open(&o, "gap.gguf");
    const struct gguf_tensor *out = gguf_tensor_find(f, "output.weight");
    const float *W = (const float *)out->data, *wn = f32_data(f, "output_norm.weight");
    uint32_t E = (uint32_t)out->ne[0], V = (uint32_t)out->ne[1];
    float x[1024], h[1024];
    int close = 0, n = 1000;
    for (int s = 0; s < n; s++) {
        for (uint32_t i = 0; i < E; i++)
            x[i] = test_rand();
        rms_h(x, wn, h, E);
        float a = -INFINITY, b = -INFINITY;
        for (uint32_t v = 0; v < V; v++) {
            double d = 0;
            for (uint32_t i = 0; i < E; i++)
                d += (double)W[(size_t)v * E + i] * h[i];
            if (d > a) {
                b = a;
                a = (float)d;
            } else if (d > b) {
                b = (float)d;
            }
        }
        close += a - b < 0.05f;
    }
    printf("greedy steps with the top two logits within 0.05: %d of %d\n", close, n);
    ck_assert_int_lt(close, n / 50);
    gguf_close(f);
}
END_TEST

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

int main(void)
{
    Suite *s = suite_create("fixture");
    TCase *tc = tcase_create("archs");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, qwen3moe_types);
    tcase_add_test(tc, glm4moe_tensors_keys_and_shapes);
    tcase_add_test(tc, deepseek2_tensors_keys_and_shapes);
    tcase_add_test(tc, llama_layouts);
    tcase_add_test(tc, olmoe_and_qwen2moe);
    tcase_add_test(tc, gpt_oss_tensors_keys_and_random_mxfp4);
    tcase_add_test(tc, bad_options_are_refused);
    suite_add_tcase(s, tc);
    tc = tcase_create("bytes");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, same_seed_same_bytes);
    tcase_add_test(tc, random_blocks_are_bounded);
    tcase_add_test(tc, qwen3_mini_random_blocks);
    tcase_add_test(tc, builtin_vocab);
    tcase_add_test(tc, vocab_from_file);
    suite_add_tcase(s, tc);
    tc = tcase_create("numbers");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, zipf_router_skews_popularity);
    tcase_add_test(tc, greedy_logit_gap);
    suite_add_tcase(s, tc);
    const char *dir = test_tmpdir(); /* before the forks, so every test writes here */
    int rv = test_run(s);
    nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS); /* the files add up to ~100 MB */
    return rv;
}
