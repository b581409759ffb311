#!/usr/bin/env python3
"""hf_models — tiny random Hugging Face MoE models and their reference logits, the golden side of
strata's parity test (gpu-worker/fwd_parity_test.c).

For each architecture (Qwen3MoeForCausalLM with norm_topk_prob=True, MixtralForCausalLM,
OlmoeForCausalLM with num_key_value_heads == num_attention_heads, Qwen2MoeForCausalLM) it builds a
tiny model with a fixed seed and eager attention, saves it (safetensors + config.json) under
OUT/hf/<arch>/, feeds a fixed 64-token prompt and 32 greedy steps, and writes
  OUT/<arch>.json        {"arch", "n_vocab", "prompt": [64 ids], "greedy": [32 ids]}
  OUT/<arch>.logits.f32  33 rows of n_vocab float32 (little endian): the logits after the prompt,
                         then after each of the 32 greedy tokens
With --strata PATH it also runs `PATH convert OUT/hf/<arch> OUT/<arch>.gguf` (F32 weights).
Needs torch and transformers (a GPU is optional: CPU float32 is the reference). Run:
  python3 tools/hf_models.py --out tests/parity --strata build/strata
"""
import argparse
import json
import os
import struct
import subprocess

import torch
import transformers as tf

VOCAB = 512
PROMPT_LEN = 64
STEPS = 32

COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
              attn_implementation="eager")


def configs():
    yield "qwen3moe", tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig(
        **COMMON, num_key_value_heads=2, head_dim=32, intermediate_size=256,
        moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
        rope_theta=1e6, decoder_sparse_step=1, mlp_only_layers=[])
    yield "llama", tf.MixtralForCausalLM, tf.MixtralConfig(
        **COMMON, num_key_value_heads=2, intermediate_size=96, num_local_experts=8,
        num_experts_per_tok=2, rope_theta=1e6)
    yield "olmoe", tf.OlmoeForCausalLM, tf.OlmoeConfig(
        **COMMON, num_key_value_heads=4, intermediate_size=64, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=False, rope_theta=10000.0, clip_qkv=None)
    yield "qwen2moe", tf.Qwen2MoeForCausalLM, tf.Qwen2MoeConfig(
        **COMMON, num_key_value_heads=2, intermediate_size=256, moe_intermediate_size=64,
        shared_expert_intermediate_size=96, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False, rope_theta=1e6, decoder_sparse_step=1, mlp_only_layers=[])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/parity")
    ap.add_argument("--strata", help="a strata binary: also convert each model to OUT/<arch>.gguf")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for arch, cls, cfg in configs():
        torch.manual_seed(a.seed)
        model = cls(cfg).float().eval()
        # Random init leaves norms at 1 and biases at 0: perturb them so the test sees them.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.1)
        hf_dir = os.path.join(a.out, "hf", arch)
        model.save_pretrained(hf_dir, safe_serialization=True)
        g = torch.Generator().manual_seed(a.seed + 1)
        prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=g).tolist()
        ids, greedy, rows = list(prompt), [], []
        with torch.no_grad():
            for _ in range(STEPS):
                # Full recompute each step: no cache, the plainest reference.
                logits = model(torch.tensor([ids])).logits[0, -1].float()
                rows.append(logits)
                nxt = int(torch.argmax(logits))
                greedy.append(nxt)
                ids.append(nxt)
            rows.append(model(torch.tensor([ids])).logits[0, -1].float())
        with open(os.path.join(a.out, arch + ".logits.f32"), "wb") as f:
            for r in rows:
                f.write(struct.pack("<%df" % VOCAB, *r.tolist()))
        with open(os.path.join(a.out, arch + ".json"), "w") as f:
            json.dump({"arch": arch, "n_vocab": VOCAB, "prompt": prompt, "greedy": greedy}, f)
        if a.strata:
            subprocess.run([a.strata, "convert", hf_dir, os.path.join(a.out, arch + ".gguf")],
                           check=True)
        print(arch, "greedy", greedy[:8], "...")


if __name__ == "__main__":
    main()
