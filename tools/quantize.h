/* quantize — `strata quantize`: rewrite a GGUF file with its weight matrices in one quant type, as
 * llama-quantize does without an importance matrix (same bytes for the same source rows:
 * common/quant/quant.h).
 *
 * Weight matrices are the 2-D and 3-D tensors whose name ends in ".weight"; each is dequantized to
 * F32 row by row (any computable source type) and quantized to its output type (quantize_choose).
 * Every other tensor is copied byte for byte, every KV pair is copied (gguf_w_value) except split.*
 * (the output is one file), general.alignment (the writer sets it) and general.file_type /
 * general.quantization_version, which are rewritten. Tensors stream through in chunks of rows, so a
 * file larger than RAM is fine; rows of a chunk are spread over opts.threads threads. The caller's
 * thread blocks until the file is written (a temporary renamed into place) or an error.
 */
#ifndef STRATA_QUANTIZE_H
#define STRATA_QUANTIZE_H

#include "common/gguf/gguf.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define QUANTIZE_MAX_OVERRIDES 16
#define QUANTIZE_MAX_KV        16

/* A per-tensor override, as llama-quantize's --tensor-type: weight matrices whose name contains
 * `pattern` get `type` (the first matching override wins; the block-size fallback still applies). */
struct quantize_override {
    const char *pattern;
    uint32_t type;
};

/* A metadata override, as llama-quantize's --override-kv KEY=TYPE:VALUE: TYPE is int (INT32),
 * float (FLOAT32), bool (true/false) or str. It replaces the key, or adds it. */
struct quantize_kv {
    const char *key;
    struct gguf_value val; /* STRING values point into the caller's text */
};

struct quantize_opts {
    uint32_t type; /* target type: quant_can_quantize(type); ignored with copy */
    bool copy;     /* llama-quantize's COPY: every tensor byte for byte, general.file_type kept
                      (to edit metadata only) */
    bool pure;    /* no exceptions but 1-D tensors (and the block-size fallback, which is forced) */
    bool mxfp4_moe; /* llama-quantize's MXFP4_MOE: 3-D weights (stacked experts) become MXFP4,
                       the other matrices type (Q8_0 as llama.cpp; its rules above still apply) */
    int threads;  /* threads over rows; <= 0: the online CPUs */
    FILE *report; /* the per-tensor table and totals go here; NULL for none */
    int n_overrides;
    struct quantize_override overrides[QUANTIZE_MAX_OVERRIDES];
    int n_kv;
    struct quantize_kv kv[QUANTIZE_MAX_KV];
};

/* quantize_kv_parse parses "KEY=TYPE:VALUE" (text must outlive out: the key and a string value
 * point into it, and the '=' is overwritten). STRATA_EINVAL with the reason in the detail. */
int quantize_kv_parse(char *text, struct quantize_kv *out);

struct quantize_totals {
    uint64_t bytes_in, bytes_out; /* tensor data of the input and output */
    uint32_t n_converted;         /* tensors whose type changed */
    uint32_t n_tensors;
};

/* quantize_choose returns the output type of tensor t for opts, with *reason set to the report's
 * note (a static string: which rule applied, "" for a plain conversion to opts->type). The rules:
 *   - a 2-D or 3-D tensor whose name does not end in ".weight": kept as it is;
 *   - 1-D tensors: with --pure kept as they are; without, made F32 (they are norms and biases,
 *     computed in float anyway; an integer 1-D tensor is kept);
 *   - with --pure, routers (ffn_gate_inp.weight) are kept as they are (F32 in any converted file),
 *     before any --tensor-type: llama-quantize never quantizes them;
 *   - without --pure: norms ("norm" in the name) and routers (ffn_gate_inp, ffn_gate_inp_shexp)
 *     become F32; token_embd and output follow the target like every matrix;
 *   - a row length that is not a multiple of the target's block falls back as llama.cpp does:
 *     Q2_K, Q3_K, IQ4_XS -> IQ4_NL; Q4_K -> Q5_0; Q5_K -> Q5_1; Q6_K -> Q8_0; and a row that is
 *     not a multiple of 32 either -> F16;
 *   - with mxfp4_moe, a 3-D weight (stacked experts) takes MXFP4 instead of the target;
 *   - a matrix already of the output type is copied (no second rounding). */
uint32_t quantize_choose(const struct gguf_tensor *t, const struct quantize_opts *opts,
                         const char **reason);

/* quantize_ftype returns llama.cpp's general.file_type (LLAMA_FTYPE_*) closest to a target type:
 * F32 0, F16 1, Q4_0 2, Q4_1 3, Q8_0 7, Q5_0 8, Q5_1 9, Q2_K 10, Q3_K 12 (Q3_K_M), Q4_K 15
 * (Q4_K_M), Q5_K 17 (Q5_K_M), Q6_K 18, IQ4_NL 25, IQ4_XS 30, BF16 32, MXFP4 38
 * (MXFP4_MOE). */
uint32_t quantize_ftype(uint32_t type);

/* quantize_file writes out_path from in_path. Errors: those of gguf_open / the writer,
 * STRATA_EUNSUPPORTED for a target type that cannot be quantized to or a weight matrix whose type
 * strata cannot dequantize (detail names the tensor), STRATA_ENOMEM. totals may be NULL. */
int quantize_file(const char *in_path, const char *out_path, const struct quantize_opts *opts,
                  struct quantize_totals *totals);

#endif
