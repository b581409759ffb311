#include "tools/convert.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/arena/model.h"
#include "common/quant/qtype.h"
#include "gpu-worker/backend.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Round trip: an F32 fixture GGUF is written out as a Hugging Face checkpoint (HF names, per-expert
 * or fused experts, Mixtral q/k in rotate-half order), converted back, and must give the very same
 * logits. */

struct st_out {
    json_t *hdr;
    FILE *data; /* tensor bytes, appended */
    uint64_t off;
};

static void st_put(struct st_out *s, const char *name, uint32_t n_dims, const uint64_t *shape,
                   const float *v)
{
    uint64_t n = 1;
    json_t *sh = json_array();
    for (uint32_t d = 0; d < n_dims; d++) {
        json_array_append_new(sh, json_integer((json_int_t)shape[d]));
        n *= shape[d];
    }
    ck_assert_uint_eq(fwrite(v, sizeof *v, n, s->data), n);
    json_object_set_new(s->hdr, name,
                        json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", sh,
                                  "data_offsets", (json_int_t)s->off,
                                  (json_int_t)(s->off + n * 4)));
    s->off += n * 4;
}

/* hf_name maps a GGUF tensor name to its Hugging Face name (expert index e, or -1). */
static void hf_name(const char *g, bool mixtral, char *out, size_t n)
{
    static const char *const map[][3] = {
        {"attn_norm.weight", "input_layernorm.weight", NULL},
        {"ffn_norm.weight", "post_attention_layernorm.weight", NULL},
        {"attn_q.weight", "self_attn.q_proj.weight", NULL},
        {"attn_k.weight", "self_attn.k_proj.weight", NULL},
        {"attn_v.weight", "self_attn.v_proj.weight", NULL},
        {"attn_output.weight", "self_attn.o_proj.weight", NULL},
        {"attn_q.bias", "self_attn.q_proj.bias", NULL},
        {"attn_k.bias", "self_attn.k_proj.bias", NULL},
        {"attn_v.bias", "self_attn.v_proj.bias", NULL},
        {"attn_q_norm.weight", "self_attn.q_norm.weight", NULL},
        {"attn_k_norm.weight", "self_attn.k_norm.weight", NULL},
        {"ffn_gate_inp.weight", "mlp.gate.weight", "block_sparse_moe.gate.weight"},
        {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", NULL},
        {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight", NULL},
        {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight", NULL},
        {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight", NULL},
    };
    int layer;
    char rest[96];
    if (strcmp(g, "token_embd.weight") == 0) snprintf(out, n, "model.embed_tokens.weight");
    else if (strcmp(g, "output_norm.weight") == 0) snprintf(out, n, "model.norm.weight");
    else if (strcmp(g, "output.weight") == 0) snprintf(out, n, "lm_head.weight");
    else {
        ck_assert_int_eq(sscanf(g, "blk.%d.%95s", &layer, rest), 2);
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            if (strcmp(rest, map[i][0]) == 0) {
                snprintf(out, n, "model.layers.%d.%s", layer,
                         mixtral && map[i][2] ? map[i][2] : map[i][1]);
                return;
            }
        ck_abort_msg("no HF name for %s", g);
    }
}

/* export writes fixture f (F32) as a checkpoint in dir; fused: qwen3moe's 3-D gate_up/down. */
static void export(const struct gguf_file *f, const char *dir, const char *arch, bool fused)
{
    const bool mixtral = strcmp(arch, "llama") == 0;
    struct fixture_hparams h;
    ck_assert_int_eq(fixture_hparams(arch, NULL, &h), 0);
    char path[700];
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/data.tmp", dir);
    struct st_out s = {json_object(), fopen(path, "w+b"), 0};
    ck_assert_ptr_nonnull(s.data);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        ck_assert_uint_eq(t->type, QT_F32);
        const float *v = (const float *)t->data;
        char name[160];
        const size_t len = strlen(t->name);
        if (len > 12 && strcmp(t->name + len - 12, "_exps.weight") == 0) {
            int layer;
            char part[8];
            ck_assert_int_eq(sscanf(t->name, "blk.%d.ffn_%7[a-z]_exps", &layer, part), 2);
            const uint64_t per = t->ne[0] * t->ne[1];
            if (fused && strcmp(part, "down") == 0) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", layer);
                st_put(&s, name, 3, (uint64_t[]){t->ne[2], t->ne[1], t->ne[0]}, v);
                continue;
            }
            if (fused && strcmp(part, "gate") == 0) {
                /* gate_up: per expert, the gate rows then the up rows. */
                char up_name[64];
                snprintf(up_name, sizeof up_name, "blk.%d.ffn_up_exps.weight", layer);
                const float *u = (const float *)gguf_tensor_find(f, up_name)->data;
                float *gu = malloc(2 * per * t->ne[2] * sizeof *gu);
                for (uint64_t e = 0; e < t->ne[2]; e++) {
                    memcpy(gu + 2 * e * per, v + e * per, per * sizeof *gu);
                    memcpy(gu + (2 * e + 1) * per, u + e * per, per * sizeof *gu);
                }
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", layer);
                st_put(&s, name, 3, (uint64_t[]){t->ne[2], 2 * t->ne[1], t->ne[0]}, gu);
                free(gu);
                continue;
            }
            if (fused) continue; /* up went into gate_up */
            static const char *const hf[2][3] = {{"gate_proj", "up_proj", "down_proj"},
                                                 {"w1", "w3", "w2"}};
            int k = strcmp(part, "gate") == 0 ? 0 : strcmp(part, "up") == 0 ? 1 : 2;
            for (uint64_t e = 0; e < t->ne[2]; e++) {
                snprintf(name, sizeof name, "model.layers.%d.%s.experts.%llu.%s.weight", layer,
                         mixtral ? "block_sparse_moe" : "mlp", (unsigned long long)e,
                         hf[mixtral][k]);
                st_put(&s, name, 2, (uint64_t[]){t->ne[1], t->ne[0]}, v + e * per);
            }
            continue;
        }
        hf_name(t->name, mixtral, name, sizeof name);
        const bool qk = strstr(t->name, "attn_q.weight") || strstr(t->name, "attn_k.weight");
        if (mixtral && qk) {
            /* Undo llama.cpp's permute: HF row j*hd/2 + i of a head is GGUF row 2i + j. */
            const uint64_t hd = h.head_dim, rows = t->ne[1], n0 = t->ne[0];
            float *p = malloc(rows * n0 * sizeof *p);
            for (uint64_t r = 0; r < rows; r++) {
                uint64_t hh = r / hd, x = r % hd, g = hh * hd + 2 * (x % (hd / 2)) + x / (hd / 2);
                memcpy(p + r * n0, v + g * n0, n0 * sizeof *p);
            }
            st_put(&s, name, 2, (uint64_t[]){rows, n0}, p);
            free(p);
        } else if (t->n_dims == 1 && !strstr(t->name, "shexp")) {
            st_put(&s, name, 1, (uint64_t[]){t->ne[0]}, v);
        } else {
            st_put(&s, name, 2, (uint64_t[]){t->ne[1], t->ne[0]}, v);
        }
    }
    /* The file: 8-byte header length, header, data. */
    char *hdr = json_dumps(s.hdr, JSON_COMPACT);
    uint64_t hlen = strlen(hdr);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *out = fopen(path, "wb");
    fwrite(&hlen, 8, 1, out);
    fwrite(hdr, 1, hlen, out);
    rewind(s.data);
    char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, s.data)) > 0) fwrite(buf, 1, got, out);
    ck_assert_int_eq(fclose(out), 0);
    fclose(s.data);
    snprintf(path, sizeof path, "%s/data.tmp", dir);
    remove(path);
    free(hdr);
    json_decref(s.hdr);

    static const char *const cls[][2] = {{"qwen3moe", "Qwen3MoeForCausalLM"},
                                         {"llama", "MixtralForCausalLM"},
                                         {"olmoe", "OlmoeForCausalLM"},
                                         {"qwen2moe", "Qwen2MoeForCausalLM"}};
    const char *c = NULL;
    for (size_t i = 0; i < 4; i++)
        if (strcmp(cls[i][0], arch) == 0) c = cls[i][1];
    json_t *cfg = json_pack(
        "{s:[s], s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:b, s:b}",
        "architectures", c, "hidden_size", (json_int_t)h.n_embd, "num_hidden_layers",
        (json_int_t)h.n_layer, "num_attention_heads", (json_int_t)h.n_head, "num_key_value_heads",
        (json_int_t)h.n_head_kv, "head_dim", (json_int_t)h.head_dim, "intermediate_size",
        (json_int_t)(mixtral || strcmp(arch, "olmoe") == 0 ? h.n_ff_exp : h.n_ff),
        mixtral ? "num_local_experts" : "num_experts", (json_int_t)h.n_expert,
        "num_experts_per_tok", (json_int_t)h.n_expert_used, "max_position_embeddings",
        (json_int_t)h.n_ctx, "vocab_size",
        (json_int_t)gguf_tensor_find(f, "token_embd.weight")->ne[1],
        "moe_intermediate_size", (json_int_t)h.n_ff_exp, "rms_norm_eps", (double)h.rms_eps,
        "rope_theta", (double)h.rope_base, "tie_word_embeddings", 0, "norm_topk_prob",
        strcmp(arch, "qwen3moe") == 0);
    if (h.n_ff_shexp)
        json_object_set_new(cfg, "shared_expert_intermediate_size", json_integer(h.n_ff_shexp));
    snprintf(path, sizeof path, "%s/config.json", dir);
    ck_assert_int_eq(json_dump_file(cfg, path, 0), 0);
    json_decref(cfg);
}

static float *logits_of(const char *path, struct gguf_file **fo)
{
    static const int32_t ids[] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
    struct model *m;
    ck_assert_int_eq(gguf_open(path, fo), 0);
    ck_assert_msg(model_load(*fo, &m) == 0, "%s: %s", path, strata_errdetail());
    struct kv_cache *kv;
    struct backend *fw;
    struct kv_seq s;
    struct backend_opts o = {.n_threads = 1, .max_pass_tokens = 16, .n_ctx = 32, .n_seq = 1};
    ck_assert_int_eq(backend_start(m, &o, &fw), 0);
    kv = backend_kv(fw);
    kv_seq_init(&s);
    float *l = malloc(m->hp.n_vocab * sizeof *l);
    ck_assert_int_eq(backend_prompt(fw, &s, ids, 11, 0, l), 0);
    kv_seq_fini(kv, &s);
    backend_close(fw);
    model_fini(m);
    return l;
}

static void round_trip(const char *arch, bool fused)
{
    char src[600], dir[600], out[700];
    snprintf(src, sizeof src, "%s/%s-f32.gguf", test_tmpdir(), arch);
    snprintf(dir, sizeof dir, "%s/hf-%s%s", test_tmpdir(), arch, fused ? "-fused" : "");
    snprintf(out, sizeof out, "%s/converted.gguf", dir);
    struct fixture_opts fo = {.arch = arch, .type = "f32", .seed = 11};
    ck_assert_int_eq(fixture_write(&fo, src), 0);
    struct gguf_file *a, *b;
    float *la = logits_of(src, &a);
    export(a, dir, arch, fused);
    struct convert_opts co = {dir, out, QT_F32, NULL};
    ck_assert_msg(convert_hf(&co) == 0, "%s: %s", arch, strata_errdetail());
    float *lb = logits_of(out, &b);
    const uint64_t V = gguf_tensor_find(a, "token_embd.weight")->ne[1];
    ck_assert_msg(memcmp(la, lb, V * sizeof *la) == 0,
                  "%s: converted logits differ (%g vs %g)", arch, la[0], lb[0]);
    /* Q8_0 converts too, and its logits stay close. */
    co.type = QT_Q8_0;
    ck_assert_int_eq(convert_hf(&co), 0);
    struct gguf_file *c;
    float *lc = logits_of(out, &c);
    double d = 0, lo = la[0], hi = la[0];
    for (uint64_t i = 0; i < V; i++) {
        d = fmax(d, fabs(la[i] - lc[i]));
        lo = fmin(lo, la[i]);
        hi = fmax(hi, la[i]);
    }
    /* Q8_0 weights and activations: a few percent of the logits' spread, never more. */
    ck_assert_msg(d < 0.1 * (hi - lo), "%s: q8_0 logits differ by %g of a spread of %g", arch,
                  d, hi - lo);
    /* --vocab copies the source's tokenizer (same token count as the model), byte for byte. */
    co.type = QT_F32;
    co.vocab = src;
    ck_assert_msg(convert_hf(&co) == 0, "%s --vocab: %s", arch, strata_errdetail());
    struct gguf_file *t;
    ck_assert_int_eq(gguf_open(out, &t), 0);
    const struct gguf_value *ta, *tb;
    ck_assert_int_eq(gguf_get_arr(a, "tokenizer.ggml.tokens", GGUF_STRING, &ta), 0);
    ck_assert_int_eq(gguf_get_arr(t, "tokenizer.ggml.tokens", GGUF_STRING, &tb), 0);
    ck_assert_uint_eq(ta->arr.n, tb->arr.n);
    for (uint64_t i = 0; i < ta->arr.n; i++) {
        struct gguf_str x = gguf_arr_str(ta, i), y = gguf_arr_str(tb, i);
        ck_assert(x.len == y.len && memcmp(x.ptr, y.ptr, x.len) == 0);
    }
    ck_assert_ptr_nonnull(gguf_find(t, "tokenizer.ggml.model"));
    gguf_close(t);
    free(la);
    free(lb);
    free(lc);
    gguf_close(a);
    gguf_close(b);
    gguf_close(c);
}

START_TEST(mixtral_round_trip)
{
    round_trip("llama", false);
}
END_TEST

START_TEST(qwen2moe_round_trip)
{
    round_trip("qwen2moe", false);
}
END_TEST

START_TEST(qwen3moe_fused_round_trip)
{
    round_trip("qwen3moe", true);
}
END_TEST

START_TEST(olmoe_round_trip)
{
    round_trip("olmoe", false);
}
END_TEST

START_TEST(unsupported_architecture_is_named)
{
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/hf-gpt2", test_tmpdir());
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"architectures\": [\"GPT2LMHeadModel\"]}", f);
    fclose(f);
    struct convert_opts co = {dir, "/nonexistent/x.gguf", QT_F32, NULL};
    ck_assert_int_eq(convert_hf(&co), STRATA_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "GPT2LMHeadModel"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("convert");
    TCase *tc = tcase_create("convert");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, mixtral_round_trip);
    tcase_add_test(tc, qwen2moe_round_trip);
    tcase_add_test(tc, qwen3moe_fused_round_trip);
    tcase_add_test(tc, olmoe_round_trip);
    tcase_add_test(tc, unsupported_architecture_is_named);
    suite_add_tcase(s, tc);
    return test_run(s);
}
