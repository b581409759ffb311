/* fixture_vocab — the built-in tokenizer of fixtures: a small byte-level BPE in GPT-2's format.
 *
 * Tokens: the 256 byte tokens in GPT-2's byte-to-unicode order (ids 0..255, as Qwen's vocabulary
 * has them), then merges learned deterministically from a fixed English sample compiled into this
 * module, then the specials <|endoftext|> (bos, pad), <|im_start|>, <|im_end|> (eos) as CONTROL
 * tokens, then [PADn] UNUSED tokens up to the requested size, as convert_hf_to_gguf.py pads Qwen.
 * Written as llama.cpp reads it: tokenizer.ggml.model "gpt2", pre "qwen2", a chatml template.
 * Pure; any thread.
 */
#ifndef STRATA_FIXTURE_VOCAB_H
#define STRATA_FIXTURE_VOCAB_H

#include <stdint.h>

#include "common/gguf/gguf.h"

/* fixture_vocab_write adds the tokenizer.* keys of the built-in vocabulary, padded to n_vocab
 * tokens, to w (before gguf_writer_begin). STRATA_EINVAL when n_vocab is smaller than the built-in
 * vocabulary (the detail says its size), STRATA_ENOMEM, or the writer's codes. */
int fixture_vocab_write(struct gguf_writer *w, uint32_t n_vocab);

#endif
