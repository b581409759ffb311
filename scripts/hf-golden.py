#!/usr/bin/env python3
"""hf-golden — Hugging Face transformers' logits for strata's gpt-oss test model, the golden side
of gpu-worker/fwd_hf_golden_test.c.

The model is `strata fixture --arch gpt-oss --type f32` (seed 11: the tiny shape, 2 layers, 8
experts top-2, a sliding window of 8, YaRN, sinks, biases everywhere); its MXFP4 form is
`strata quantize F32.gguf MXFP4.gguf mxfp4_moe`, read back as floats by `strata quantize MXFP4.gguf
BACK.gguf f32` (the reference runs on the dequantized weights; strata on the MXFP4 blocks). For
each GGUF given it builds transformers' GptOssForCausalLM (float32, eager attention) with the
file's hyper-parameters, loads its tensors (llama.cpp's names and layouts mapped to transformers'),
feeds the fixed token sequence teacher-forced (one pass: position p's logits predict p + 1) and
writes
  OUT/NAME.logits.f32  (tokens, n_vocab) float32, little endian
  OUT/NAME.json        {"n_vocab", "tokens": [...], "transformers", "torch", "layout"}
transformers' expert layout changed across versions (gate and up interleaved or concatenated,
matrices stored (in, out) or (out, in)): the layout is the one of the candidates whose MoE block
reproduces a direct computation from the GGUF's tensors (router top-k, softmax of the chosen
logits, the clamped SwiGLU of the gpt-oss paper) on random rows; none matching is an error.
Needs torch and transformers with GptOss (4.55 or later); the GGUF reader is this file's (stdlib).
  python3 scripts/hf-golden.py --out DIR NAME=FILE.gguf [NAME=FILE.gguf ...]
"""
import argparse
import inspect
import json
import os
import struct
import sys

TOKENS_LEN = 48  # past the sliding window (8) several times over
GGUF_TYPES = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
              6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}


class Reader:
    def __init__(self, data):
        self.d, self.o = data, 0

    def take(self, fmt, n):
        v = struct.unpack_from(fmt, self.d, self.o)[0]
        self.o += n
        return v

    def string(self):
        n = self.take("<Q", 8)
        s = self.d[self.o:self.o + n].decode("utf-8", "replace")
        self.o += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I", 4), self.take("<Q", 8)
            return [self.value(et) for _ in range(n)]
        fmt, n = GGUF_TYPES[t]
        return self.take(fmt, n)


def read_gguf(path):
    """(kv dict, {name: (shape as ggml ne, float32 bytes)}) of a GGUF whose tensors are all F32."""
    with open(path, "rb") as f:
        data = f.read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF")
    r.o = 4
    _version, n_t, n_kv = r.take("<I", 4), r.take("<Q", 8), r.take("<Q", 8)
    kv = {}
    for _ in range(n_kv):
        k = r.string()
        kv[k] = r.value(r.take("<I", 4))
    infos = []
    for _ in range(n_t):
        name = r.string()
        nd = r.take("<I", 4)
        ne = [r.take("<Q", 8) for _ in range(nd)]
        typ, off = r.take("<I", 4), r.take("<Q", 8)
        infos.append((name, ne, typ, off))
    align = kv.get("general.alignment", 32)
    base = (r.o + align - 1) // align * align
    tensors = {}
    for name, ne, typ, off in infos:
        if typ != 0:
            sys.exit(f"{path}: tensor {name} has type {typ}: give F32 files (strata quantize X Y f32)")
        n = 1
        for d in ne:
            n *= d
        tensors[name] = (ne, data[base + off:base + off + 4 * n])
    return kv, tensors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234, help="the token sequence's seed")
    ap.add_argument("models", nargs="+", help="NAME=FILE.gguf (F32 tensors)")
    a = ap.parse_args()
    import torch
    import transformers as tf
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_grad_enabled(False)
    print(f"transformers {tf.__version__}, torch {torch.__version__}", flush=True)
    if not hasattr(tf, "GptOssForCausalLM"):
        sys.exit(f"transformers {tf.__version__} has no GptOssForCausalLM")
    os.makedirs(a.out, exist_ok=True)
    for spec in a.models:
        name, _, path = spec.partition("=")
        kv, ts = read_gguf(path)
        golden(torch, tf, name, kv, ts, a)


def golden(torch, tf, name, kv, ts, a):
    A = kv["general.architecture"]
    g = lambda k, d=None: kv.get(f"{A}.{k}", d)
    E, L = g("embedding_length"), g("block_count")
    H, KVH = g("attention.head_count"), g("attention.head_count_kv")
    D = g("attention.key_length", E // H)
    X, K, F = g("expert_count"), g("expert_used_count"), g("expert_feed_forward_length")
    V = ts["token_embd.weight"][0][1]
    theta, eps, swa = g("rope.freq_base"), g("attention.layer_norm_rms_epsilon"), g("attention.sliding_window")
    factor, orig = g("rope.scaling.factor", 1.0), g("rope.scaling.original_context_length", 4096)
    rope = {"rope_type": "yarn", "factor": float(factor), "beta_fast": 32.0, "beta_slow": 1.0,
            "original_max_position_embeddings": int(orig),
            # llama.cpp's (and strata's) YaRN rounds the ramp's ends to whole dims
            "truncate": True}
    kw = dict(vocab_size=V, hidden_size=E, intermediate_size=F, num_hidden_layers=L,
              num_attention_heads=H, num_key_value_heads=KVH, head_dim=D, num_local_experts=X,
              num_experts_per_tok=K, sliding_window=swa, rms_norm_eps=eps, attention_bias=True,
              tie_word_embeddings=False, max_position_embeddings=int(orig * factor),
              layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)],
              attention_dropout=0.0, router_aux_loss_coef=0.0, output_router_logits=False,
              attn_implementation="eager")
    params = inspect.signature(tf.GptOssConfig.__init__).parameters
    if "rope_parameters" in params:
        kw["rope_parameters"] = dict(rope, rope_theta=float(theta))
    else:
        kw["rope_theta"], kw["rope_scaling"] = float(theta), rope
    cfg = tf.GptOssConfig(**kw)
    model = tf.GptOssForCausalLM(cfg).float().eval()
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")

    def t(nm, *shape):
        ne, raw = ts[nm]
        return torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(*shape).clone()

    m = model.model
    m.embed_tokens.weight.copy_(t("token_embd.weight", V, E))
    m.norm.weight.copy_(t("output_norm.weight", E))
    model.lm_head.weight.copy_(t("output.weight", V, E))
    layout = None
    for il, layer in enumerate(m.layers):
        p = f"blk.{il}."
        at = layer.self_attn
        for proj, nm, rows in (("q_proj", "attn_q", H * D), ("k_proj", "attn_k", KVH * D),
                               ("v_proj", "attn_v", KVH * D)):
            getattr(at, proj).weight.copy_(t(p + nm + ".weight", rows, E))
            getattr(at, proj).bias.copy_(t(p + nm + ".bias", rows))
        at.o_proj.weight.copy_(t(p + "attn_output.weight", E, H * D))
        at.o_proj.bias.copy_(t(p + "attn_output.bias", E))
        at.sinks.copy_(t(p + "attn_sinks.weight", H))
        layer.input_layernorm.weight.copy_(t(p + "attn_norm.weight", E))
        layer.post_attention_layernorm.weight.copy_(t(p + "post_attention_norm.weight", E))
        mlp = layer.mlp
        mlp.router.weight.copy_(t(p + "ffn_gate_inp.weight", X, E))
        mlp.router.bias.copy_(t(p + "ffn_gate_inp.bias", X))
        w = dict(gate=t(p + "ffn_gate_exps.weight", X, F, E), up=t(p + "ffn_up_exps.weight", X, F, E),
                 down=t(p + "ffn_down_exps.weight", X, E, F), gate_b=t(p + "ffn_gate_exps.bias", X, F),
                 up_b=t(p + "ffn_up_exps.bias", X, F), down_b=t(p + "ffn_down_exps.bias", X, E))
        layout = load_experts(torch, mlp, w, E, X, K, F, layout)
    g_ = torch.Generator().manual_seed(a.seed)
    tokens = torch.randint(0, V, (TOKENS_LEN,), generator=g_).tolist()
    logits = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float()
    with open(os.path.join(a.out, name + ".logits.f32"), "wb") as f:
        f.write(logits.contiguous().numpy().astype("<f4").tobytes())
    with open(os.path.join(a.out, name + ".json"), "w") as f:
        json.dump({"n_vocab": V, "tokens": tokens, "transformers": tf.__version__,
                   "torch": torch.__version__, "layout": layout, "yarn_truncate": True}, f)
    print(f"{name}: {TOKENS_LEN} positions of {V} logits, expert layout {layout}, "
          f"argmax of the first positions {logits.argmax(-1)[:8].tolist()}", flush=True)


def direct_moe(torch, x, router_w, router_b, w, K):
    """The gpt-oss MoE block from the GGUF's tensors: top-k of the router's logits, softmax over
    the chosen, each expert's clamped SwiGLU (alpha 1.702, limit 7) with its biases."""
    logits = x @ router_w.T + router_b
    top, idx = logits.topk(K, dim=-1)
    wt = top.softmax(-1)
    out = torch.zeros_like(x)
    for r in range(x.shape[0]):
        for j in range(K):
            e = int(idx[r, j])
            gate = (w["gate"][e] @ x[r] + w["gate_b"][e]).clamp(max=7.0)
            up = (w["up"][e] @ x[r] + w["up_b"][e]).clamp(-7.0, 7.0)
            h = (up + 1) * gate * torch.sigmoid(gate * 1.702)
            out[r] += wt[r, j] * (w["down"][e] @ h + w["down_b"][e])
    return out


def load_experts(torch, mlp, w, E, X, K, F, layout):
    """Sets mlp's experts from w in the layout that reproduces direct_moe (tried once, then kept)."""
    ex = mlp.experts
    cands = [layout] if layout else [(i, c, d) for i in (True, False) for c in ("in_out", "out_in")
                                     for d in ("in_out", "out_in")]
    x = torch.randn(5, E, generator=torch.Generator().manual_seed(7))
    want = direct_moe(torch, x, mlp.router.weight, mlp.router.bias, w, K)
    for inter, gu, dn in cands:
        g, u = w["gate"].transpose(1, 2), w["up"].transpose(1, 2)  # (X, E, F): in_out
        gb, ub = w["gate_b"], w["up_b"]
        if inter:
            m_ = torch.stack([g, u], dim=-1).reshape(X, E, 2 * F)
            b_ = torch.stack([gb, ub], dim=-1).reshape(X, 2 * F)
        else:
            m_, b_ = torch.cat([g, u], dim=-1), torch.cat([gb, ub], dim=-1)
        if gu == "out_in":
            m_ = m_.transpose(1, 2)
        d_ = w["down"].transpose(1, 2) if dn == "in_out" else w["down"]  # (X, F, E) in_out
        if tuple(ex.gate_up_proj.shape) != tuple(m_.shape) or tuple(ex.down_proj.shape) != tuple(d_.shape):
            continue
        ex.gate_up_proj.copy_(m_)
        ex.gate_up_proj_bias.copy_(b_)
        ex.down_proj.copy_(d_)
        ex.down_proj_bias.copy_(w["down_b"])
        got = mlp(x[None])
        got = (got[0] if isinstance(got, tuple) else got).reshape(5, E)
        err = float((got - want).abs().max())
        if err <= 1e-4 * max(1.0, float(want.abs().max())):
            return (inter, gu, dn)
        if layout:
            sys.exit(f"expert layout {layout} stopped matching (max error {err})")
    sys.exit("no expert layout of transformers' GptOssExperts reproduces the direct MoE block: "
             + inspect.getsource(type(ex).forward)[:3000])


if __name__ == "__main__":
    main()
