#include "common/arena/model.h"
#include "common/base/err.h"
#include "common/quant/qtype.h"
#include "gpu-worker/backend.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* fixture writes the tiny fixture of arch (type NULL: the Q4_K_M mix) and returns its path. */
static const char *fixture(const char *arch, const char *type, bool tied)
{
    static char path[600];
    snprintf(path, sizeof path, "%s/%s-%s%s.gguf", test_tmpdir(), arch, type ? type : "q4_k_m",
             tied ? "-tied" : "");
    struct fixture_opts o = {.arch = arch, .type = type, .tied = tied, .seed = 7};
    ck_assert_msg(fixture_write(&o, path) == 0, "fixture %s: %s", path, strata_errdetail());
    return path;
}

/* A rewrite of a GGUF file with one change, for the error paths and the old expert layout. */
struct edit {
    const char *arch;         /* general.architecture becomes this */
    const char *drop_tensor;  /* leave this tensor out */
    const char *drop_key;     /* leave this key out */
    const char *short_tensor; /* declare this one with a row fewer (ne1 - 1) */
    const char *retype;       /* declare this one as Q8_1 (not computable), zero data */
    bool split_experts;       /* blk.N.ffn_X_exps -> one blk.N.ffn_X.E per expert */
};

static bool is_exps(const struct gguf_tensor *t)
{
    size_t n = strlen(t->name);
    return n > 12 && strcmp(t->name + n - 12, "_exps.weight") == 0;
}

static void rewrite(const char *src, const char *dst, const struct edit *e)
{
    struct gguf_file *f;
    struct gguf_writer *w;
    ck_assert_int_eq(gguf_open(src, &f), 0);
    ck_assert_int_eq(gguf_writer_open(dst, f->alignment == 32 ? 0 : f->alignment, &w), 0);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const char *k = f->kv[i].key;
        if (strcmp(k, "general.alignment") == 0 || (e->drop_key && strcmp(k, e->drop_key) == 0))
            continue;
        if (e->arch && strcmp(k, "general.architecture") == 0)
            ck_assert_int_eq(gguf_w_str(w, k, e->arch), 0);
        else
            ck_assert_int_eq(gguf_w_value(w, k, &f->kv[i].val), 0);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        uint64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        if (e->drop_tensor && strcmp(t->name, e->drop_tensor) == 0) continue;
        if (e->split_experts && is_exps(t)) {
            char name[128];
            int len = (int)(strlen(t->name) - 12);
            for (uint64_t x = 0; x < t->ne[2]; x++) {
                snprintf(name, sizeof name, "%.*s.%llu.weight", len, t->name,
                         (unsigned long long)x);
                ck_assert_int_eq(gguf_w_tensor(w, name, t->type, 2, ne), 0);
            }
            continue;
        }
        uint32_t type = t->type;
        if (e->short_tensor && strcmp(t->name, e->short_tensor) == 0) ne[1]--;
        if (e->retype && strcmp(t->name, e->retype) == 0) type = QT_Q8_1;
        ck_assert_int_eq(gguf_w_tensor(w, t->name, type, t->n_dims, ne), 0);
    }
    ck_assert_int_eq(gguf_writer_begin(w), 0);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        uint64_t bytes = t->nbytes;
        if (e->drop_tensor && strcmp(t->name, e->drop_tensor) == 0) continue;
        if (e->short_tensor && strcmp(t->name, e->short_tensor) == 0) bytes -= bytes / t->ne[1];
        if (e->retype && strcmp(t->name, e->retype) == 0) {
            uint64_t rb;
            ck_assert_int_eq(qtype_row_bytes(QT_Q8_1, t->ne[0], &rb), 0);
            void *z = calloc(t->ne[1] * t->ne[2], rb);
            ck_assert_int_eq(gguf_writer_data(w, z, rb * t->ne[1] * t->ne[2]), 0);
            free(z);
            continue;
        }
        ck_assert_int_eq(gguf_writer_data(w, t->data, bytes), 0);
    }
    ck_assert_int_eq(gguf_writer_finish(w), 0);
    gguf_close(f);
}

/* load_err returns model_load's code for path (and frees what it opened). */
static int load_err(const char *path)
{
    struct gguf_file *f;
    struct model *m = NULL;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    int rv = model_load(f, &m);
    model_fini(m);
    gguf_close(f);
    return rv;
}

/* last_logits runs ids through a fresh forward pass and returns the last token's logits. */
static float *last_logits(const struct model *m, const int32_t *ids, uint32_t n)
{
    struct kv_cache *kv;
    struct backend *fw;
    struct kv_seq s;
    struct backend_opts fo = {.n_threads = 1, .max_pass_tokens = 16, .n_ctx = 64, .n_seq = 1};
    ck_assert_int_eq(backend_start(m, &fo, &fw), 0);
    kv = backend_kv(fw);
    kv_seq_init(&s);
    float *logits = malloc(m->hp.n_vocab * sizeof *logits);
    ck_assert_msg(backend_prompt(fw, &s, ids, n, 0, logits) == 0, "%s", strata_errdetail());
    kv_seq_fini(kv, &s);
    backend_close(fw);
    return logits;
}

static const int32_t prompt[12] = {1, 17, 42, 5, 99, 3, 250, 7, 64, 128, 11, 2};

START_TEST(each_arch_gets_llama_cpp_behaviour)
{
    static const struct {
        const char *arch;
        enum model_rope rope;
        enum model_gating gating;
        bool norm;
        enum model_qk_norm qk;
        bool bias, shexp;
    } want[] = {
        {"qwen3moe", MODEL_ROPE_NEOX, MODEL_GATING_SOFTMAX_TOPK, true, MODEL_QK_NORM_HEAD, 0, 0},
        {"llama", MODEL_ROPE_NORM, MODEL_GATING_TOPK_SOFTMAX, true, MODEL_QK_NORM_NONE, 0, 0},
        {"olmoe", MODEL_ROPE_NEOX, MODEL_GATING_SOFTMAX_TOPK, false, MODEL_QK_NORM_FULL, 0, 0},
        {"qwen2moe", MODEL_ROPE_NEOX, MODEL_GATING_SOFTMAX_TOPK, false, MODEL_QK_NORM_NONE, 1, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        struct fixture_hparams fh;
        ck_assert_int_eq(fixture_hparams(want[i].arch, NULL, &fh), 0);
        struct gguf_file *f;
        struct model *m;
        const char *path = fixture(want[i].arch, NULL, false);
        ck_assert_int_eq(gguf_open(path, &f), 0);
        ck_assert_msg(model_load(f, &m) == 0, "%s: %s", want[i].arch, strata_errdetail());
        const struct model_hparams *hp = &m->hp;
        ck_assert_str_eq(model_arch_name(hp->arch), want[i].arch);
        ck_assert_int_eq(hp->rope, want[i].rope);
        ck_assert_int_eq(hp->gating, want[i].gating);
        ck_assert_int_eq(hp->norm_topk, want[i].norm);
        ck_assert_int_eq(hp->qk_norm, want[i].qk);
        ck_assert_int_eq(hp->qkv_bias, want[i].bias);
        ck_assert_int_eq(hp->n_ff_shexp != 0, want[i].shexp);
        ck_assert_uint_eq(hp->n_embd, fh.n_embd);
        ck_assert_uint_eq(hp->n_head_kv, fh.n_head_kv);
        ck_assert_uint_eq(hp->head_dim, fh.head_dim);
        ck_assert_uint_eq(hp->n_expert, fh.n_expert);
        ck_assert_uint_eq(hp->n_ff_exp, fh.n_ff_exp);
        ck_assert_float_eq(hp->rms_eps, fh.rms_eps);
        ck_assert_ptr_nonnull(m->layers[hp->n_layer - 1].ffn_norm);
        ck_assert_ptr_ne(m->output.data, m->token_embd.data);
        float *l = last_logits(m, prompt, 12);
        for (uint32_t v = 0; v < hp->n_vocab; v++) ck_assert(isfinite(l[v]));
        free(l);
        model_fini(m);
        gguf_close(f);
        unlink(path);
    }
}
END_TEST

START_TEST(old_per_expert_tensors_give_the_same_logits)
{
    const char *src = fixture("llama", NULL, false);
    char dst[600];
    snprintf(dst, sizeof dst, "%s/llama-split.gguf", test_tmpdir());
    rewrite(src, dst, &(struct edit){.split_experts = true});
    struct gguf_file *fa, *fb;
    struct model *a, *b;
    ck_assert_int_eq(gguf_open(src, &fa), 0);
    ck_assert_int_eq(gguf_open(dst, &fb), 0);
    ck_assert_int_eq(gguf_tensor_find(fb, "blk.0.ffn_down_exps.weight") == NULL, 1);
    ck_assert_ptr_nonnull(gguf_tensor_find(fb, "blk.0.ffn_down.1.weight"));
    ck_assert_int_eq(model_load(fa, &a), 0);
    ck_assert_msg(model_load(fb, &b) == 0, "%s", strata_errdetail());
    float *la = last_logits(a, prompt, 12), *lb = last_logits(b, prompt, 12);
    ck_assert_mem_eq(la, lb, a->hp.n_vocab * sizeof *la);
    free(la);
    free(lb);
    model_fini(a);
    model_fini(b);
    gguf_close(fa);
    gguf_close(fb);
    unlink(src);
    unlink(dst);
}
END_TEST

START_TEST(tied_output_and_every_type)
{
    struct gguf_file *f;
    struct model *m;
    const char *path = fixture("qwen3moe", NULL, true);
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_int_eq(model_load(f, &m), 0);
    ck_assert_ptr_eq(m->output.data, m->token_embd.data);
    free(last_logits(m, prompt, 4));
    model_fini(m);
    gguf_close(f);
    unlink(path);
    /* One file per type, every weight matrix in it: each is computable end to end. */
    const char *types[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
                           "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        path = fixture("qwen3moe", types[i], false);
        ck_assert_int_eq(gguf_open(path, &f), 0);
        ck_assert_msg(model_load(f, &m) == 0, "%s: %s", types[i], strata_errdetail());
        ck_assert_int_eq(m->layers[0].wq.type, qtype_parse(types[i]));
        float *l = last_logits(m, prompt, 4);
        for (uint32_t v = 0; v < m->hp.n_vocab; v++) ck_assert(isfinite(l[v]));
        free(l);
        model_fini(m);
        gguf_close(f);
        unlink(path);
    }
}
END_TEST

/* A qwen2moe file without q/k/v biases (llama.cpp: TENSOR_NOT_REQUIRED) loads, and its forward
 * pass runs without them: finite logits, other than those of the same weights with biases. */
START_TEST(qwen2moe_without_biases_loads)
{
    char path[600];
    snprintf(path, sizeof path, "%s/qwen2moe-nobias.gguf", test_tmpdir());
    struct fixture_opts o = {.arch = "qwen2moe", .seed = 7, .no_bias = true};
    ck_assert_msg(fixture_write(&o, path) == 0, "%s", strata_errdetail());
    const char *with = fixture("qwen2moe", NULL, false);
    struct gguf_file *f, *g;
    struct model *m, *mb;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_ptr_null(gguf_tensor_find(f, "blk.0.attn_q.bias"));
    ck_assert_msg(model_load(f, &m) == 0, "refused: %s", strata_errdetail());
    ck_assert(!m->hp.qkv_bias);
    ck_assert_ptr_null(m->layers[0].bq);
    ck_assert_int_eq(gguf_open(with, &g), 0);
    ck_assert_int_eq(model_load(g, &mb), 0);
    ck_assert(mb->hp.qkv_bias);
    ck_assert_ptr_nonnull(mb->layers[0].bq);
    float *l = last_logits(m, prompt, 12), *lb = last_logits(mb, prompt, 12);
    for (uint32_t v = 0; v < m->hp.n_vocab; v++)
        ck_assert(isfinite(l[v]));
    ck_assert(memcmp(l, lb, m->hp.n_vocab * sizeof *l) != 0);
    free(l);
    free(lb);
    model_fini(m);
    model_fini(mb);
    gguf_close(f);
    gguf_close(g);
    o.arch = "olmoe"; /* the option says what it is for */
    ck_assert_int_eq(fixture_write(&o, path), STRATA_EINVAL);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "--no-bias"));
}
END_TEST

START_TEST(bad_files_are_refused_by_name)
{
    const char *src = fixture("qwen2moe", NULL, false);
    char dst[600];
    snprintf(dst, sizeof dst, "%s/bad.gguf", test_tmpdir());
    static const struct {
        struct edit e;
        int code;
        const char *says;
    } cases[] = {
        {{.arch = "gpt2"}, STRATA_EUNSUPPORTED, "architecture 'gpt2'"},
        {{.drop_tensor = "blk.1.attn_k.weight"}, STRATA_ENOENT, "blk.1.attn_k.weight"},
        /* biases are optional, but the three go together */
        {{.drop_tensor = "blk.0.attn_q.bias"}, STRATA_EUNSUPPORTED, "blk.0.attn_q.bias"},
        {{.drop_tensor = "blk.1.ffn_up_exps.weight"}, STRATA_ENOENT, "blk.1.ffn_up_exps"},
        {{.drop_tensor = "blk.0.ffn_gate_inp_shexp.weight"}, STRATA_ENOENT, "ffn_gate_inp_shexp"},
        {{.drop_key = "qwen2moe.block_count"}, STRATA_ENOENT, "qwen2moe.block_count"},
        {{.short_tensor = "blk.0.attn_output.weight"}, STRATA_EFORMAT, "blk.0.attn_output.weight"},
        {{.retype = "blk.1.attn_v.weight"}, STRATA_EUNSUPPORTED, "q8_1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite(src, dst, &cases[i].e);
        ck_assert_int_eq(load_err(dst), cases[i].code);
        ck_assert_msg(strstr(strata_errdetail(), cases[i].says), "case %zu: '%s' lacks '%s'", i,
                      strata_errdetail(), cases[i].says);
    }
    unlink(src);
    unlink(dst);
}
END_TEST

/* gpt-oss: llama.cpp's behaviour (NEOX, top-k then softmax, sliding windows on even layers, YaRN),
 * every bias and sink loaded, and each expert's biases as blob parts right after their matrices,
 * reached through the resolver as the file's rows. */
START_TEST(gpt_oss_loads_with_its_biases_in_the_blob)
{
    const char *path = fixture("gpt-oss", NULL, false);
    struct gguf_file *f;
    struct model *m;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_msg(model_load(f, &m) == 0, "%s", strata_errdetail());
    const struct model_hparams *hp = &m->hp;
    ck_assert_str_eq(model_arch_name(hp->arch), "gpt-oss");
    ck_assert_int_eq(hp->rope, MODEL_ROPE_NEOX);
    ck_assert_int_eq(hp->gating, MODEL_GATING_TOPK_SOFTMAX);
    ck_assert(hp->qkv_bias && hp->attn_out_bias && hp->attn_sinks && hp->router_bias &&
              hp->exp_bias && hp->glu_oai);
    ck_assert_uint_eq(hp->n_swa, 8);
    ck_assert_float_eq(hp->yarn_factor, 32.0f);
    ck_assert_uint_eq(hp->yarn_orig_ctx, 4096);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        ck_assert_int_eq(L->swa, l % 2 == 0);
        ck_assert(L->bo && L->sinks && L->router_b && L->bq && L->ffn_norm);
        uint64_t at = 0;
        for (int i = 0; i < MODEL_BLOB_PARTS; i++) {
            const int p = (i % 2 ? MODEL_PART_BIAS : 0) + i / 2;
            const struct model_mat *pm = &L->part[p % MODEL_PART_COUNT];
            const uint64_t bytes =
                p >= MODEL_PART_BIAS ? pm->n_out * sizeof(float) : pm->row_bytes * pm->n_out;
            ck_assert_uint_ge(L->blob.part_off[p], at);
            ck_assert_uint_eq(L->blob.part_off[p] % 256, 0);
            at = L->blob.part_off[p] + bytes;
        }
        ck_assert_uint_eq(L->blob.bytes, at);
        static const char *const names[] = {"gate", "up", "down"};
        for (int p = 0; p < MODEL_PART_COUNT; p++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%u.ffn_%s_exps.bias", l, names[p]);
            const struct gguf_tensor *t = gguf_tensor_find(f, name);
            ck_assert_ptr_nonnull(t);
            const uint32_t e = hp->n_expert - 1, n = L->part[p].n_out;
            ck_assert_mem_eq(model_expert_part(m, l, e, (enum model_part)(MODEL_PART_BIAS + p)),
                             t->data + (size_t)e * n * sizeof(float), n * sizeof(float));
        }
    }
    model_fini(m);
    gguf_close(f);
    char dst[600];
    snprintf(dst, sizeof dst, "%s/bad-oss.gguf", test_tmpdir());
    static const struct {
        struct edit e;
        int code;
        const char *says;
    } cases[] = {
        {{.drop_tensor = "blk.1.attn_sinks.weight"}, STRATA_ENOENT, "blk.1.attn_sinks.weight"},
        {{.drop_tensor = "blk.0.ffn_down_exps.bias"}, STRATA_ENOENT, "blk.0.ffn_down_exps.bias"},
        {{.drop_tensor = "blk.0.attn_output.bias"}, STRATA_ENOENT, "blk.0.attn_output.bias"},
        {{.drop_key = "gpt-oss.attention.sliding_window"}, STRATA_ENOENT, "sliding_window"},
        {{.retype = "blk.1.ffn_up_exps.bias"}, STRATA_EUNSUPPORTED, "must be f32"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite(path, dst, &cases[i].e);
        ck_assert_int_eq(load_err(dst), cases[i].code);
        ck_assert_msg(strstr(strata_errdetail(), cases[i].says), "case %zu: '%s' lacks '%s'", i,
                      strata_errdetail(), cases[i].says);
    }
    unlink(path);
    unlink(dst);
}
END_TEST

/* glm4moe: llama.cpp's behaviour (NEOX over half the head, sigmoid routing with the selection
 * bias, renormalized and scaled), the leading dense layer with no router or experts, the ungated
 * shared expert, and the MTP layer in the file but not in the model. */
START_TEST(glm4moe_loads_its_layer_kinds)
{
    const char *path = fixture("glm4moe", NULL, false);
    struct gguf_file *f;
    struct model *m;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_msg(model_load(f, &m) == 0, "%s", strata_errdetail());
    const struct model_hparams *hp = &m->hp;
    ck_assert_str_eq(model_arch_name(hp->arch), "glm4moe");
    ck_assert_int_eq(hp->rope, MODEL_ROPE_NEOX);
    ck_assert_int_eq(hp->gating, MODEL_GATING_SIGMOID);
    ck_assert_int_eq(hp->qk_norm, MODEL_QK_NORM_HEAD);
    ck_assert(hp->norm_topk && hp->exp_probs_b && hp->qkv_bias && !hp->shexp_gated);
    ck_assert_uint_eq(hp->n_layer, 3); /* block_count 4 less the MTP layer */
    ck_assert_uint_eq(hp->n_nextn, 1);
    ck_assert_uint_eq(hp->head_dim, 128);
    ck_assert_uint_eq(hp->n_rot, 64);
    ck_assert_uint_eq(hp->n_dense_lead, 1);
    ck_assert_uint_eq(hp->n_ff_dense, 768);
    ck_assert_uint_eq(hp->n_ff_shexp, hp->n_ff_exp);
    ck_assert_float_eq(hp->exp_scale, 2.5f);
    const struct model_layer *D = &m->layers[0];
    ck_assert(D->dense && D->ffn_gate.data && D->ffn_up.data && D->ffn_down.data);
    ck_assert_uint_eq(D->ffn_gate.n_out, 768);
    ck_assert_uint_eq(D->router.n_out, 0);
    ck_assert_uint_eq(D->blob.bytes, 0);
    ck_assert_ptr_null(D->exp_probs_b);
    for (uint32_t l = 1; l < hp->n_layer; l++) {
        const struct model_layer *L = &m->layers[l];
        ck_assert(!L->dense && L->exp_probs_b && L->q_norm && L->bq && L->gate_shexp.data);
        ck_assert_ptr_null(L->gate_inp_shexp.data);
        ck_assert_uint_gt(L->blob.bytes, 0);
    }
    model_fini(m);
    gguf_close(f);
    char dst[600];
    snprintf(dst, sizeof dst, "%s/bad-glm.gguf", test_tmpdir());
    static const struct {
        struct edit e;
        int code;
        const char *says;
    } cases[] = {
        {{.drop_tensor = "blk.0.ffn_up.weight"}, STRATA_ENOENT, "blk.0.ffn_up.weight"},
        {{.drop_tensor = "blk.2.exp_probs_b.bias"}, STRATA_ENOENT, "blk.2.exp_probs_b.bias"},
        {{.drop_tensor = "blk.1.ffn_down_shexp.weight"}, STRATA_ENOENT, "ffn_down_shexp"},
        {{.drop_key = "glm4moe.expert_weights_scale"}, STRATA_ENOENT, "expert_weights_scale"},
        {{.drop_key = "glm4moe.expert_shared_count"}, STRATA_ENOENT, "expert_shared_count"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite(path, dst, &cases[i].e);
        ck_assert_int_eq(load_err(dst), cases[i].code);
        ck_assert_msg(strstr(strata_errdetail(), cases[i].says), "case %zu: '%s' lacks '%s'", i,
                      strata_errdetail(), cases[i].says);
    }
    /* the MTP layer's tensors are not read: a file without them is the same model */
    rewrite(path, dst, &(struct edit){.drop_tensor = "blk.3.nextn.eh_proj.weight"});
    ck_assert_int_eq(load_err(dst), 0);
    unlink(path);
    unlink(dst);
}
END_TEST

/* with_kv_b rewrites an f32 deepseek2 file the older converters' way: each layer's attn_k_b and
 * attn_v_b become one attn_kv_b (n_head*(nope + v) rows of kv_lora_rank: a head's key rows, the
 * k_b matrices transposed, then its value rows). */
static void with_kv_b(const char *src, const char *dst)
{
    struct gguf_file *f;
    struct gguf_writer *w;
    ck_assert_int_eq(gguf_open(src, &f), 0);
    ck_assert_int_eq(gguf_writer_open(dst, 0, &w), 0);
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (strcmp(f->kv[i].key, "general.alignment") != 0)
            ck_assert_int_eq(gguf_w_value(w, f->kv[i].key, &f->kv[i].val), 0);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) ck_assert_int_eq(gguf_writer_begin(w), 0);
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const struct gguf_tensor *t = &f->tensors[i], *v;
            if (strstr(t->name, "attn_v_b")) continue;
            if (!strstr(t->name, "attn_k_b")) {
                if (pass == 0)
                    ck_assert_int_eq(gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne), 0);
                else
                    ck_assert_int_eq(gguf_writer_data(w, t->data, t->nbytes), 0);
                continue;
            }
            char name[96];
            unsigned l;
            ck_assert_int_eq(sscanf(t->name, "blk.%u.", &l), 1);
            snprintf(name, sizeof name, "blk.%u.attn_v_b.weight", l);
            ck_assert_ptr_nonnull(v = gguf_tensor_find(f, name));
            ck_assert_int_eq(t->type, QT_F32);
            const uint64_t nope = t->ne[0], R = t->ne[1], H = t->ne[2], V = v->ne[1];
            snprintf(name, sizeof name, "blk.%u.attn_kv_b.weight", l);
            if (pass == 0) {
                const uint64_t ne[4] = {R, H * (nope + V), 1, 1};
                ck_assert_int_eq(gguf_w_tensor(w, name, QT_F32, 2, ne), 0);
                continue;
            }
            float *kv = malloc(R * H * (nope + V) * sizeof *kv);
            const float *kb = (const float *)t->data, *vb = (const float *)v->data;
            for (uint64_t h = 0; h < H; h++) {
                float *rows = kv + h * (nope + V) * R;
                for (uint64_t d = 0; d < nope; d++)
                    for (uint64_t c = 0; c < R; c++)
                        rows[d * R + c] = kb[(h * R + c) * nope + d];
                memcpy(rows + nope * R, vb + h * V * R, V * R * sizeof *kv);
            }
            ck_assert_int_eq(gguf_writer_data(w, kv, R * H * (nope + V) * sizeof *kv), 0);
            free(kv);
        }
    }
    ck_assert_int_eq(gguf_writer_finish(w), 0);
    gguf_close(f);
}

/* deepseek2: MLA's geometry (the cache is MQA over latent + rope key, no V rows), DeepSeek-V3's
 * routing (groups, sigmoid, bias, scaling) and YaRN scale; attn_kv_b files give the same logits
 * bit for bit as the attn_k_b/attn_v_b they were made from. */
START_TEST(deepseek2_loads_mla)
{
    const char *path = fixture("deepseek2", "f32", false);
    struct gguf_file *f;
    struct model *m;
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_msg(model_load(f, &m) == 0, "%s", strata_errdetail());
    const struct model_hparams *hp = &m->hp;
    ck_assert_str_eq(model_arch_name(hp->arch), "deepseek2");
    ck_assert(hp->mla && hp->exp_probs_b && hp->norm_topk && !hp->shexp_gated);
    ck_assert_int_eq(hp->rope, MODEL_ROPE_NORM);
    ck_assert_int_eq(hp->gating, MODEL_GATING_SIGMOID);
    ck_assert_uint_eq(hp->n_head_kv, 1);
    ck_assert_uint_eq(hp->head_dim, 256 + 64);
    ck_assert_uint_eq(hp->head_dim_v, 256);
    ck_assert_uint_eq(hp->head_dim_qk, 192);
    ck_assert_uint_eq(hp->head_dim_vo, 128);
    ck_assert_uint_eq(hp->n_lora_q, 256);
    ck_assert_uint_eq(hp->n_nextn, 1); /* GLM-4.7-Flash's MTP layer, skipped */
    ck_assert_uint_eq(hp->n_group, 4);
    ck_assert_uint_eq(hp->n_group_used, 2);
    ck_assert_float_eq(hp->yarn_factor, 40.0f);
    const float ms = 1.0f + 0.1f * logf(40.0f);
    ck_assert_float_eq_tol(hp->kq_scale, ms * ms / sqrtf(192.0f), 1e-7f);
    ck_assert(m->layers[0].dense && !m->layers[1].dense);
    ck_assert(m->layers[1].k_b.data && m->layers[1].v_b.data && m->layers[1].q_a_norm);
    ck_assert_uint_eq(m->layers[1].k_b.n_in, 128);
    ck_assert_uint_eq(m->layers[1].k_b.n_out, 256);
    ck_assert_uint_eq(m->layers[1].v_b.n_out, 128);
    struct kv_config kc;
    backend_kv_config(m, 64, 1, &kc);
    ck_assert_uint_eq(kc.k_dim, 320);
    ck_assert_uint_eq(kc.v_dim, 0);
    float *a = last_logits(m, prompt, 12);
    char old[600];
    snprintf(old, sizeof old, "%s/ds-kv_b.gguf", test_tmpdir());
    with_kv_b(path, old);
    struct gguf_file *g;
    struct model *mo;
    ck_assert_int_eq(gguf_open(old, &g), 0);
    ck_assert_msg(model_load(g, &mo) == 0, "%s", strata_errdetail());
    ck_assert_ptr_null(gguf_tensor_find(g, "blk.1.attn_k_b.weight"));
    float *b = last_logits(mo, prompt, 12);
    ck_assert_mem_eq(a, b, hp->n_vocab * sizeof *a);
    free(a);
    free(b);
    model_fini(mo);
    gguf_close(g);
    model_fini(m);
    gguf_close(f);
    static const struct {
        struct edit e;
        int code;
        const char *says;
    } cases[] = {
        {{.drop_tensor = "blk.1.attn_v_b.weight"}, STRATA_ENOENT, "blk.1.attn_v_b.weight"},
        {{.drop_tensor = "blk.2.attn_kv_a_norm.weight"}, STRATA_ENOENT, "attn_kv_a_norm"},
        {{.drop_key = "deepseek2.attention.kv_lora_rank"}, STRATA_ENOENT, "kv_lora_rank"},
        {{.short_tensor = "blk.1.attn_q_b.weight"}, STRATA_EFORMAT, "attn_q_b"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite(path, old, &cases[i].e);
        ck_assert_int_eq(load_err(old), cases[i].code);
        ck_assert_msg(strstr(strata_errdetail(), cases[i].says), "case %zu: '%s' lacks '%s'", i,
                      strata_errdetail(), cases[i].says);
    }
    unlink(path);
    unlink(old);
}
END_TEST

/* A resolver that counts its calls and forwards to the GGUF one. */
struct counting {
    model_expert_fn fn;
    void *ctx;
    unsigned calls;
};

static const void *counting_part(void *ctx, uint32_t l, uint32_t e, enum model_part p)
{
    struct counting *c = ctx;
    __atomic_add_fetch(&c->calls, 1, __ATOMIC_RELAXED);
    return c->fn(c->ctx, l, e, p);
}

START_TEST(experts_come_only_through_the_resolver)
{
    struct gguf_file *f;
    struct model *m;
    const char *path = fixture("olmoe", NULL, false);
    ck_assert_int_eq(gguf_open(path, &f), 0);
    ck_assert_int_eq(model_load(f, &m), 0);
    float *a = last_logits(m, prompt, 12);
    struct counting c = {m->expert_part, m->expert_ctx, 0};
    model_set_expert_resolver(m, counting_part, &c);
    float *b = last_logits(m, prompt, 12);
    ck_assert_mem_eq(a, b, m->hp.n_vocab * sizeof *a);
    /* Every (layer, distinct expert) of each pass asks for its three parts. */
    ck_assert_uint_ge(c.calls, 3 * m->hp.n_layer * m->hp.n_expert_used);
    ck_assert_uint_eq(c.calls % 3, 0);
    free(a);
    free(b);
    model_fini(m);
    gguf_close(f);
    unlink(path);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 240); /* Debug + ASan builds run ~10x slower */
    tcase_add_test(tc, each_arch_gets_llama_cpp_behaviour);
    tcase_add_test(tc, old_per_expert_tensors_give_the_same_logits);
    tcase_add_test(tc, tied_output_and_every_type);
    tcase_add_test(tc, qwen2moe_without_biases_loads);
    tcase_add_test(tc, bad_files_are_refused_by_name);
    tcase_add_test(tc, gpt_oss_loads_with_its_biases_in_the_blob);
    tcase_add_test(tc, glm4moe_loads_its_layer_kinds);
    tcase_add_test(tc, deepseek2_loads_mla);
    tcase_add_test(tc, experts_come_only_through_the_resolver);
    suite_add_tcase(s, tc);
    return test_run(s);
}
