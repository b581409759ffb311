/* convert — a Hugging Face checkpoint (config.json + *.safetensors) to a GGUF file strata and
 * llama.cpp read, through strata's GGUF writer.
 *
 * Architectures: Qwen3MoeForCausalLM -> qwen3moe, MixtralForCausalLM -> llama (with experts),
 * OlmoeForCausalLM -> olmoe, Qwen2MoeForCausalLM -> qwen2moe. Tensor names and KV keys are
 * llama.cpp's. Per-expert 2-D weights are stacked into 3-D blk.N.ffn_X_exps tensors, fused
 * experts.gate_up_proj (num_experts, 2*ff, hidden) is split into gate and up, and Mixtral's q/k
 * rows are permuted from Hugging Face's rotate-half order to adjacent pairs (normal RoPE), as
 * llama.cpp's convert_hf_to_gguf.py does. Weight matrices get the chosen type (F32, F16, Q8_0);
 * norms, biases and routers stay F32. No tokenizer is written (generate with token ids).
 * Streams one row at a time: memory stays small whatever the model size. Any thread; no state.
 */
#ifndef STRATA_CONVERT_H
#define STRATA_CONVERT_H

#include <stdint.h>

struct convert_opts {
    const char *dir;  /* the checkpoint: config.json and one or more *.safetensors */
    const char *out;  /* the GGUF to write (atomically) */
    uint32_t type;    /* weight matrices: QT_F32, QT_F16 or QT_Q8_0 */
    const char *vocab; /* a GGUF whose tokenizer.* keys are copied in (its token count must be
                          the model's vocab_size); NULL: no tokenizer */
};

/* convert_hf converts o->dir to o->out. STRATA_EUNSUPPORTED for an architecture or a config it
 * does not handle (named in the detail), STRATA_ENOENT for a missing file or tensor,
 * STRATA_EFORMAT for a malformed config, safetensors header or tensor shape, I/O errors. */
int convert_hf(const struct convert_opts *o);

#endif
