#!/usr/bin/env python3
"""hf-golden-glm-ds — tiny random Hugging Face GLM-4.5 (Glm4MoeForCausalLM) and DeepSeek-V3
(DeepseekV3ForCausalLM) models, their GGUF files in llama.cpp's layout and their reference logits:
the golden side of gpu-worker/fwd_parity_test.c for glm4moe and deepseek2.

tools/hf_models.py does this for the older architectures through `strata convert`; strata's
converter does not know these two, so this script writes the GGUF itself (with the `gguf` package,
the tensor names and keys of llama.cpp's convert_hf_to_gguf.py: Glm4MoeModel, DeepseekV2Model with
kv_b split into the per-head k_b and v_b). For each model it writes
  OUT/<arch>.gguf        F32 weights
  OUT/<arch>.json        {"arch", "n_vocab", "prompt": [64 ids], "greedy": [32 ids]}
  OUT/<arch>.logits.f32  33 rows of n_vocab float32: after the prompt, then after each greedy id
The selection bias (e_score_correction_bias, zero at init) is set to random values so it matters.
Needs torch, transformers (>= 4.56: both classes) and gguf. CPU float32 is the reference.
  python3 scripts/hf-golden-glm-ds.py --out tests/parity
Status: written with the architectures' llama.cpp support (tests/llamacpp checks those); not run
yet (no machine with torch and transformers was at hand).
"""
import argparse
import json
import os

import numpy as np
import torch
import transformers as tf
import gguf

VOCAB = 512
PROMPT_LEN = 64
STEPS = 32
SEED = 1234


def glm4moe():
    cfg = tf.Glm4MoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=192, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        partial_rotary_factor=0.5, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True, n_group=1,
        topk_group=1, use_qk_norm=True, attention_bias=True, rope_theta=1e6, rms_norm_eps=1e-5,
        max_position_embeddings=512, tie_word_embeddings=False, attn_implementation="eager")
    return "glm4moe", tf.Glm4MoeForCausalLM, cfg


def deepseek2():
    cfg = tf.DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=192, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32,
        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, n_group=4, topk_group=2,
        rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=4096 * 40,
        rope_scaling={"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        tie_word_embeddings=False, attn_implementation="eager")
    return "deepseek2", tf.DeepseekV3ForCausalLM, cfg


def np32(t):
    return t.detach().to(torch.float32).cpu().numpy()


def write_gguf(path, arch, model, cfg):
    w = gguf.GGUFWriter(path, arch)
    n_layer = cfg.num_hidden_layers
    w.add_block_count(n_layer)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_expert_count(cfg.n_routed_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_shared_count(cfg.n_shared_experts)
    w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    w.add_expert_weights_norm(cfg.norm_topk_prob)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    sd = {k: np32(v) for k, v in model.state_dict().items()}
    if arch == "glm4moe":
        hd = cfg.head_dim
        w.add_head_count_kv(cfg.num_key_value_heads)
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_rope_dimension_count(int(hd * cfg.partial_rotary_factor))
        w.add_uint32(f"{arch}.nextn_predict_layers", 0)
    else:
        R, rope = cfg.kv_lora_rank, cfg.qk_rope_head_dim
        nope, v = cfg.qk_nope_head_dim, cfg.v_head_dim
        w.add_head_count_kv(1)
        w.add_q_lora_rank(cfg.q_lora_rank)
        w.add_kv_lora_rank(R)
        w.add_key_length(R + rope)
        w.add_value_length(R)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v)
        w.add_rope_dimension_count(rope)
        w.add_expert_group_count(cfg.n_group)
        w.add_expert_group_used_count(cfg.topk_group)
        rs = cfg.rope_scaling
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rs["mscale_all_dim"])
    # a byte-level vocabulary of VOCAB tokens is enough: the test feeds ids
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<t{i}>" for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    w.add_token_merges([])

    def put(name, arr):
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    for il in range(n_layer):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        put(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        if arch == "glm4moe":
            for x in "qkv":
                put(b + f"attn_{x}.weight", sd[p + f"self_attn.{x}_proj.weight"])
                put(b + f"attn_{x}.bias", sd[p + f"self_attn.{x}_proj.bias"])
            put(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            put(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
            put(b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"])
        else:
            H = cfg.num_attention_heads
            put(b + "attn_q_a.weight", sd[p + "self_attn.q_a_proj.weight"])
            put(b + "attn_q_a_norm.weight", sd[p + "self_attn.q_a_layernorm.weight"])
            put(b + "attn_q_b.weight", sd[p + "self_attn.q_b_proj.weight"])
            put(b + "attn_kv_a_mqa.weight", sd[p + "self_attn.kv_a_proj_with_mqa.weight"])
            put(b + "attn_kv_a_norm.weight", sd[p + "self_attn.kv_a_layernorm.weight"])
            kv_b = sd[p + "self_attn.kv_b_proj.weight"].reshape(H, nope + v, R)
            # convert_hf_to_gguf.py: k_b = kv_b[:, :nope].transpose -> {nope, R, H} in ggml order
            put(b + "attn_k_b.weight", np.transpose(kv_b[:, :nope, :], (0, 2, 1)))
            put(b + "attn_v_b.weight", kv_b[:, nope:, :])
            put(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        put(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        if il < cfg.first_k_dense_replace:
            for x in ("gate", "up", "down"):
                put(b + f"ffn_{x}.weight", sd[p + f"mlp.{x}_proj.weight"])
            continue
        put(b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"])
        put(b + "exp_probs_b.bias", sd[p + "mlp.gate.e_score_correction_bias"])
        for x in ("gate", "up", "down"):
            put(b + f"ffn_{x}_exps.weight",
                np.stack([sd[p + f"mlp.experts.{e}.{x}_proj.weight"]
                          for e in range(cfg.n_routed_experts)]))
            put(b + f"ffn_{x}_shexp.weight", sd[p + f"mlp.shared_experts.{x}_proj.weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    put("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/parity")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for make in (glm4moe, deepseek2):
        arch, cls, cfg = make()
        torch.manual_seed(SEED)
        model = cls(cfg).eval()
        with torch.no_grad():
            for name, buf in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buf.copy_(0.1 * torch.randn_like(buf))
        write_gguf(os.path.join(args.out, f"{arch}.gguf"), arch, model, cfg)
        g = torch.Generator().manual_seed(SEED + 1)
        prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=g).tolist()
        ids, rows = list(prompt), []
        with torch.no_grad():
            for step in range(STEPS + 1):
                logits = model(torch.tensor([ids])).logits[0, -1].to(torch.float32)
                rows.append(logits.numpy().astype("<f4").tobytes())
                if step < STEPS:
                    ids.append(int(torch.argmax(logits)))
        with open(os.path.join(args.out, f"{arch}.json"), "w") as f:
            json.dump({"arch": arch, "n_vocab": VOCAB, "prompt": prompt,
                       "greedy": ids[PROMPT_LEN:]}, f)
        with open(os.path.join(args.out, f"{arch}.logits.f32"), "wb") as f:
            f.write(b"".join(rows))
        print(f"{arch}: {len(prompt)} prompt ids, {STEPS} greedy steps")


if __name__ == "__main__":
    main()
