#include "gpu-worker/backend.h"
#include "common/base/err.h"
#include "common/quant/qtype.h"
#include "tests/testutil.h"
#include "tools/fixture.h"
#include "tools/quantize.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* strata's test models against Hugging Face transformers: the logits transformers computed in
 * float32 on the GPU machine's host (scripts/hf-golden.py, which checks its tensor mapping against
 * direct computations of llama.cpp's definition in the same run) for `strata fixture --arch ARCH
 * --type f32 --seed 11` (the tiny shape), over a fixed sequence of 48 tokens fed teacher-forced,
 * in tests/golden/<arch>-<variant>.{json,logits.f32}:
 *   gpt-oss    2 layers, 8 experts top-2, a sliding window of 8, YaRN, sinks and biases
 *              (GptOssForCausalLM);
 *   glm4moe    a dense layer and two MoE layers (+ the MTP layer, never run), half of each head
 *              rotated, q/k norms, q/k/v biases, sigmoid routing with the selection bias, a shared
 *              expert, routed scaling (Glm4MoeForCausalLM);
 *   deepseek2  a dense layer and two MoE layers (+ MTP), MLA with both LoRAs and attn_k_b /
 *              attn_v_b, YaRN x40 with mscale, 4 groups of 2 experts (2 kept) top-2, the
 *              selection bias, a shared expert, routed scaling (DeepseekV3ForCausalLM).
 * The CPU backend runs the same file, rebuilt here from the fixture's seed (deterministic:
 * fwd_golden_test pins its logits), position by position in passes of 5 (a window of 8 cut
 * across passes):
 *   f32          every tensor F32; tolerance 1e-4 of each position's logit range (max - min of
 *                transformers' logits), fwd_parity_test's for F32, and every position's argmax
 *                equal;
 *   mxfp4, q8_0  the expert matrices quantized (`strata quantize F32 OUT f32 --tensor-type
 *                _exps=TYPE`), the reference run on them dequantized back to floats: the weights
 *                are equal, so the difference is strata's product (activations quantized per 32,
 *                as ggml's dots with Q8_0) against transformers' float one; tolerance 2e-2 of the
 *                range, and the argmax equal unless transformers' top two are closer than the
 *                tolerance.
 * The run prints the worst difference. Skips a variant whose golden files are absent. */

#define FIXTURE_SEED 11

struct variant {
    const char *arch, *name;
    uint32_t exps; /* QT_F32: the fixture as it is; else its _exps tensors quantized to it */
    float tol_frac;
};

static const struct variant variants[] = {
    {"gpt-oss", "f32", QT_F32, 1e-4f},   {"gpt-oss", "mxfp4", QT_MXFP4, 2e-2f},
    {"glm4moe", "f32", QT_F32, 1e-4f},   {"glm4moe", "q8_0", QT_Q8_0, 2e-2f},
    {"deepseek2", "f32", QT_F32, 1e-4f}, {"deepseek2", "q8_0", QT_Q8_0, 2e-2f}};

static void golden(const struct variant *var)
{
    char js[800], bin[800], f32[800], gguf[800];
    const char *A = var->arch;
    const bool quant = var->exps != QT_F32;
    snprintf(js, sizeof js, "%s/tests/golden/%s-%s.json", STRATA_SOURCE_DIR, A, var->name);
    snprintf(bin, sizeof bin, "%s/tests/golden/%s-%s.logits.f32", STRATA_SOURCE_DIR, A, var->name);
    struct stat st;
    if (stat(js, &st) != 0 || stat(bin, &st) != 0) {
        printf("SKIP hf golden %s %s: tests/golden/%s-%s.{json,logits.f32} absent "
               "(scripts/hf-golden.py makes them)\n",
               A, var->name, A, var->name);
        return;
    }
    snprintf(f32, sizeof f32, "%s/%s-f32.gguf", test_tmpdir(), A);
    struct fixture_opts fo = {.arch = A, .type = "f32", .seed = FIXTURE_SEED};
    ck_assert_msg(fixture_write(&fo, f32) == 0, "%s", strata_errdetail());
    snprintf(gguf, sizeof gguf, "%s", f32);
    if (quant) {
        snprintf(gguf, sizeof gguf, "%s/%s-%s.gguf", test_tmpdir(), A, var->name);
        struct quantize_opts qo = {.type = QT_F32, .threads = 2, .n_overrides = 1};
        qo.overrides[0] = (struct quantize_override){"_exps", var->exps};
        ck_assert_msg(quantize_file(f32, gguf, &qo, NULL) == 0, "%s", strata_errdetail());
    }
    json_error_t je;
    json_t *j = json_load_file(js, 0, &je);
    ck_assert_msg(j != NULL, "%s: %s", js, je.text);
    json_t *tokens = json_object_get(j, "tokens");
    const uint32_t V = (uint32_t)json_integer_value(json_object_get(j, "n_vocab"));
    const size_t n = json_array_size(tokens);
    size_t len;
    float *ref = (float *)test_read_file(bin, &len);
    ck_assert_ptr_nonnull(ref);
    ck_assert_uint_eq(len, n * V * sizeof(float));

    struct gguf_file *f;
    struct model *m;
    ck_assert_int_eq(gguf_open(gguf, &f), 0);
    ck_assert_msg(model_load(f, &m) == 0, "%s", strata_errdetail());
    ck_assert_uint_eq(m->hp.n_vocab, V);
    struct backend *fw;
    struct kv_seq s;
    struct backend_opts bo = {
        .n_threads = 2, .max_pass_tokens = 8, .n_ctx = (uint32_t)n, .n_seq = 1};
    ck_assert_int_eq(backend_start(m, &bo, &fw), 0);
    kv_seq_init(&s);
    float *l = malloc(n * V * sizeof *l);
    ck_assert_ptr_nonnull(l);
    /* chunks of 5: a window of 8 cut across passes */
    struct backend_token t[5];
    for (size_t i = 0; i < n; i += 5) {
        const uint32_t c = n - i < 5 ? (uint32_t)(n - i) : 5;
        for (uint32_t k = 0; k < c; k++)
            t[k] = (struct backend_token){
                &s, (int32_t)json_integer_value(json_array_get(tokens, i + k)), true};
        ck_assert_msg(backend_eval(fw, t, c, l + i * V) == 0, "%s", strata_errdetail());
    }
    float worst = 0;
    uint32_t agree = 0;
    for (size_t p = 0; p < n; p++) {
        const float *r = ref + p * V, *x = l + p * V;
        uint32_t best = 0, ref1 = 0, ref2 = r[0] >= r[1] ? 1 : 0;
        float lo = r[0], hi = r[0];
        for (uint32_t v = 0; v < V; v++)
            lo = r[v] < lo ? r[v] : lo, hi = r[v] > hi ? r[v] : hi;
        const float tol = var->tol_frac * (hi - lo);
        for (uint32_t v = 0; v < V; v++) {
            const float d = fabsf(x[v] - r[v]);
            worst = d / (hi - lo) > worst ? d / (hi - lo) : worst;
            ck_assert_msg(d <= tol,
                          "%s %s position %zu token %u: strata %g, transformers %g "
                          "(tolerance %g)",
                          A, var->name, p, v, x[v], r[v], tol);
            if (x[v] > x[best]) best = v;
            if (r[v] > r[ref1]) ref1 = v;
        }
        for (uint32_t v = 0; v < V; v++)
            if (v != ref1 && r[v] > r[ref2]) ref2 = v;
        agree += best == ref1;
        if (!quant || r[ref1] - r[ref2] > tol)
            ck_assert_msg(best == ref1, "%s %s position %zu: strata's argmax %u, transformers' %u",
                          A, var->name, p, best, ref1);
    }
    printf("hf golden %s %s: %zu positions, largest logit difference %.3g of the logit "
           "range (tolerance %g), top-1 equal at %u of %zu\n",
           A, var->name, n, worst, var->tol_frac, agree, n);
    free(l);
    free(ref);
    kv_seq_fini(backend_kv(fw), &s);
    backend_close(fw);
    model_fini(m);
    gguf_close(f);
    json_decref(j);
    unlink(f32);
    if (quant) unlink(gguf);
}

START_TEST(matches_transformers)
{
    golden(&variants[_i]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fwd_hf_golden");
    TCase *tc = tcase_create("fwd_hf_golden");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, matches_transformers, 0, (int)(sizeof variants / sizeof variants[0]));
    suite_add_tcase(s, tc);
    return test_run(s);
}
