#!/usr/bin/env python3
"""hf-golden — Hugging Face transformers' logits for strata's test models (gpt-oss, glm4moe,
deepseek2), the golden side of gpu-worker/fwd_hf_golden_test.c.

The models are `strata fixture --arch ARCH --type f32 --seed 11` (the tiny shape):
  gpt-oss    2 layers, 8 experts top-2, a sliding window of 8, YaRN, sinks, biases everywhere;
  glm4moe    3 layers (the first dense) + an MTP layer (in the file, never run), half of each
             128-wide head rotated (NEOX), q/k norms, q/k/v biases, sigmoid routing with the
             selection bias exp_probs_b, 1 shared expert, routed scaling 2.5;
  deepseek2  3 layers (the first dense) + an MTP layer, multi-head latent attention (q and kv
             LoRA ranks 256, key heads 128 + 64 rotated, value heads 128, attn_k_b / attn_v_b),
             YaRN x40 with mscale from yarn_log_multiplier, 8 experts in 4 groups (2 kept) top-2,
             the selection bias, 1 shared expert, routed scaling 2.5.
A quantized form is `strata quantize F32.gguf Q.gguf f32 --tensor-type _exps=TYPE`, read back as
floats by `strata quantize Q.gguf BACK.gguf f32` (the reference runs on the dequantized weights;
strata on the blocks). For each GGUF given it builds transformers' model (GptOssForCausalLM,
Glm4MoeForCausalLM, DeepseekV3ForCausalLM; float32, eager attention) with the file's
hyper-parameters, loads its tensors (llama.cpp's names and layouts mapped to transformers'), feeds
the fixed token sequence teacher-forced (one pass: position p's logits predict p + 1) and writes
  OUT/NAME.logits.f32  (tokens, n_vocab) float32, little endian
  OUT/NAME.json        {"arch", "n_vocab", "tokens": [...], "transformers", "torch", "layout",
                        "checks", and for glm4moe / deepseek2 "routing"}
The mapping is checked in the same run against direct computations from the GGUF's tensors that
follow llama.cpp's definition (float64): the expert layout is the one of the candidates whose MoE
block reproduces the direct block on random rows (transformers' fused layout changed across
versions; none matching is an error); then, on the activations of the golden pass itself (forward
hooks), every layer's attention and FFN output is compared with the direct computation on the
same input ("checks": the largest difference relative to the output's largest magnitude; above
1e-4 is printed as MISMATCH and makes the exit status 2, after the files are written). "routing"
counts, on random rows through each MoE layer's router, how often the selection bias and the group
limit change the choice and how often transformers' group mask (0.0, llama.cpp's -inf) would.
Needs torch and transformers (GptOss: 4.55 or later; Glm4Moe and DeepseekV3: 4.56 or later); the
GGUF reader is this file's (stdlib; no numpy).
  python3 scripts/hf-golden.py --out DIR NAME=FILE.gguf [NAME=FILE.gguf ...]
"""
import argparse
import array
import inspect
import json
import math
import os
import struct
import sys

TOKENS_LEN = 48  # past gpt-oss's sliding window (8) several times over
CHECK_TOL = 1e-4
GGUF_TYPES = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
              6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
CLASSES = {"gpt-oss": ("GptOssConfig", "GptOssForCausalLM"),
           "glm4moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM"),
           "deepseek2": ("DeepseekV3Config", "DeepseekV3ForCausalLM")}


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
    os.makedirs(a.out, exist_ok=True)
    bad = []
    for spec in a.models:
        name, _, path = spec.partition("=")
        kv, ts = read_gguf(path)
        arch = kv["general.architecture"]
        if arch not in CLASSES:
            sys.exit(f"{path}: architecture {arch}: hf-golden knows {', '.join(CLASSES)}")
        missing = [c for c in CLASSES[arch] if not hasattr(tf, c)]
        if missing:
            print(f"{name}: transformers {tf.__version__} has no {', '.join(missing)}: skipped",
                  flush=True)
            bad.append(name)
            continue
        try:
            bad += golden(torch, tf, name, Gguf(torch, kv, ts), a)
        except (Exception, SystemExit) as e:  # report it and go on with the next file
            import traceback
            traceback.print_exc()
            print(f"{name}: FAILED: {e}", flush=True)
            bad.append(name)
    if bad:
        print(f"FAILED or mismatched: {', '.join(bad)}", flush=True)
        sys.exit(2)


class Gguf:
    """The file's hyper-parameters (llama.cpp's keys) and tensors as torch arrays (ggml's ne
    reversed: a matrix of ne (in, out) is (out, in), transformers' Linear layout)."""

    def __init__(self, torch, kv, ts):
        self.torch, self.kv, self.ts = torch, kv, ts
        self.arch = kv["general.architecture"]

    def g(self, k, d=None):
        return self.kv.get(f"{self.arch}.{k}", d)

    def has(self, nm):
        return nm in self.ts

    def t(self, nm):
        ne, raw = self.ts[nm]
        return self.torch.frombuffer(bytearray(raw), dtype=self.torch.float32).reshape(
            *reversed(ne)).clone()


def make_config(tf, cls_name, kw, rope, theta, extra_rope=None):
    """cls_name(**kw) with the rope given as rope_parameters (transformers 5) or as rope_theta
    and rope_scaling (4.x)."""
    cls = getattr(tf, cls_name)
    params = inspect.signature(cls.__init__).parameters
    kw = dict(kw)
    if "rope_parameters" in params:
        kw["rope_parameters"] = dict(rope or {"rope_type": "default"}, rope_theta=float(theta),
                                     **(extra_rope or {}))
    else:
        kw["rope_theta"] = float(theta)
        if rope:
            kw["rope_scaling"] = rope
    # keys transformers' class does not name go to its **kwargs (attributes), as config.json's do
    return cls(**kw)


class Loader:
    """Copies GGUF tensors into the model's parameters and remembers which ones it set, so that a
    parameter left at its random init is an error."""

    def __init__(self, torch, model, f):
        self.torch, self.model, self.f = torch, model, f
        self.done = set()

    def set(self, param, value):
        if tuple(param.shape) != tuple(value.shape):
            sys.exit(f"shape mismatch: parameter {tuple(param.shape)}, value {tuple(value.shape)}")
        param.copy_(value)
        self.done.add(id(param))

    def put(self, param, nm):
        self.set(param, self.f.t(nm))

    def check_all_set(self):
        left = [n for n, p in self.model.named_parameters() if id(p) not in self.done]
        if left:
            sys.exit(f"parameters left unset by the GGUF mapping: {left[:20]}")


def golden(torch, tf, name, f, a):
    A = f.arch
    if A == "gpt-oss":
        model, layout, meta = build_gpt_oss(torch, tf, f)
    else:
        model, layout, meta = build_glm_ds(torch, tf, f)
    g_ = torch.Generator().manual_seed(a.seed)
    V = f.ts["token_embd.weight"][0][1]
    tokens = torch.randint(0, V, (TOKENS_LEN,), generator=g_).tolist()
    checks, bad = {}, []
    hooks, seen = [], {}
    if A != "gpt-oss":
        for il, layer in enumerate(model.model.layers):
            for part in ("self_attn", "mlp"):
                def hook(mod, args, kwargs, out, key=(il, part)):
                    x = args[0] if args else kwargs["hidden_states"]
                    y = out[0] if isinstance(out, tuple) else out
                    seen[key] = (x.detach().clone(), y.detach().clone())
                hooks.append(getattr(layer, part).register_forward_hook(hook, with_kwargs=True))
    logits = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float()
    for h in hooks:
        h.remove()
    if A != "gpt-oss" and len(seen) != 2 * len(model.model.layers):
        print(f"{name}: MISMATCH the hooks saw {sorted(seen)}, not every layer's attention and FFN",
              flush=True)
        bad.append(name)
    for (il, part), (x, y) in sorted(seen.items()):
        x64 = x[0].double()
        want = (direct_attention if part == "self_attn" else direct_ffn)(torch, f, meta, il, x64)
        err = float((y[0].double() - want).abs().max() / max(want.abs().max(), 1e-30))
        checks[f"blk.{il}.{'attn' if part == 'self_attn' else 'ffn'}"] = err
        if not err <= CHECK_TOL:
            print(f"{name}: MISMATCH blk.{il} {part}: transformers against the direct "
                  f"computation {err:.3g} of the output's magnitude", flush=True)
            bad.append(name)
    with open(os.path.join(a.out, name + ".logits.f32"), "wb") as out:
        out.write(array.array("f", logits.contiguous().reshape(-1).tolist()).tobytes())
    js = {"arch": A, "n_vocab": V, "tokens": tokens, "transformers": tf.__version__,
          "torch": torch.__version__, "layout": layout, "yarn_truncate": True, "checks": checks}
    js.update(meta.get("report", {}))
    with open(os.path.join(a.out, name + ".json"), "w") as out:
        json.dump(js, out)
    print(f"{name}: {TOKENS_LEN} positions of {V} logits, expert layout {layout}, "
          f"argmax of the first positions {logits.argmax(-1)[:8].tolist()}", flush=True)
    if checks:
        print(f"{name}: checks " + ", ".join(f"{k} {v:.2g}" for k, v in checks.items()), flush=True)
    if meta.get("report"):
        print(f"{name}: {meta['report']}", flush=True)
    return sorted(set(bad))


# ---- gpt-oss ---------------------------------------------------------------------------------


def build_gpt_oss(torch, tf, f):
    g = f.g
    E, L = g("embedding_length"), g("block_count")
    H, KVH = g("attention.head_count"), g("attention.head_count_kv")
    D = g("attention.key_length", E // H)
    X, K, F = g("expert_count"), g("expert_used_count"), g("expert_feed_forward_length")
    V = f.ts["token_embd.weight"][0][1]
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
    cfg = make_config(tf, "GptOssConfig", kw, rope, theta)
    model = tf.GptOssForCausalLM(cfg).float().eval()
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    t = f.t
    m = model.model
    m.embed_tokens.weight.copy_(t("token_embd.weight"))
    m.norm.weight.copy_(t("output_norm.weight"))
    model.lm_head.weight.copy_(t("output.weight"))
    layout = None
    for il, layer in enumerate(m.layers):
        p = f"blk.{il}."
        at = layer.self_attn
        for proj, nm in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")):
            getattr(at, proj).weight.copy_(t(p + nm + ".weight"))
            getattr(at, proj).bias.copy_(t(p + nm + ".bias"))
        at.o_proj.weight.copy_(t(p + "attn_output.weight"))
        at.o_proj.bias.copy_(t(p + "attn_output.bias"))
        at.sinks.copy_(t(p + "attn_sinks.weight"))
        layer.input_layernorm.weight.copy_(t(p + "attn_norm.weight"))
        layer.post_attention_layernorm.weight.copy_(t(p + "post_attention_norm.weight"))
        mlp = layer.mlp
        mlp.router.weight.copy_(t(p + "ffn_gate_inp.weight"))
        mlp.router.bias.copy_(t(p + "ffn_gate_inp.bias"))
        w = dict(gate=t(p + "ffn_gate_exps.weight"), up=t(p + "ffn_up_exps.weight"),
                 down=t(p + "ffn_down_exps.weight"), gate_b=t(p + "ffn_gate_exps.bias"),
                 up_b=t(p + "ffn_up_exps.bias"), down_b=t(p + "ffn_down_exps.bias"))
        layout = load_gpt_oss_experts(torch, mlp, w, E, X, K, F, layout)
    return model, layout, {}


def direct_gpt_oss_moe(torch, x, router_w, router_b, w, K):
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


def load_gpt_oss_experts(torch, mlp, w, E, X, K, F, layout):
    """Sets mlp's experts from w in the layout that reproduces direct_gpt_oss_moe (tried once,
    then kept)."""
    ex = mlp.experts
    cands = [tuple(layout)] if layout else [(i, c, d) for i in (True, False)
                                            for c in ("in_out", "out_in") for d in ("in_out", "out_in")]
    x = torch.randn(5, E, generator=torch.Generator().manual_seed(7))
    want = direct_gpt_oss_moe(torch, x, mlp.router.weight, mlp.router.bias, w, K)
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


# ---- glm4moe and deepseek2 -------------------------------------------------------------------


def build_glm_ds(torch, tf, f):
    g, ds = f.g, f.arch == "deepseek2"
    nextn = g("nextn_predict_layers", 0)
    E, L = g("embedding_length"), g("block_count") - nextn  # the MTP layers: never run
    H, KVH = g("attention.head_count"), g("attention.head_count_kv", g("attention.head_count"))
    X, K, F = g("expert_count"), g("expert_used_count"), g("expert_feed_forward_length")
    V = f.ts["token_embd.weight"][0][1]
    dense, S = g("leading_dense_block_count", 0), g("expert_shared_count", 0)
    theta, eps = g("rope.freq_base", 10000.0), g("attention.layer_norm_rms_epsilon")
    n_rot = g("rope.dimension_count")
    G, GU = g("expert_group_count", 0) or 1, g("expert_group_used_count", 0) or 1
    scale, norm = g("expert_weights_scale", 1.0), bool(g("expert_weights_norm", False))
    if g("expert_gating_func", 2) != 2:
        sys.exit(f"{f.arch}: expert_gating_func {g('expert_gating_func')}: transformers' class "
                 "routes with the sigmoid (2)")
    meta = dict(E=E, H=H, KVH=KVH, X=X, K=K, G=G, GU=GU, scale=scale, norm=norm, eps=eps,
                theta=theta, n_rot=n_rot, dense=dense, ds=ds)
    kw = dict(vocab_size=V, hidden_size=E, intermediate_size=g("feed_forward_length"),
              moe_intermediate_size=F, num_hidden_layers=L, num_attention_heads=H,
              n_routed_experts=X, num_experts_per_tok=K, n_shared_experts=S,
              first_k_dense_replace=dense, routed_scaling_factor=float(scale),
              norm_topk_prob=norm, n_group=G, topk_group=GU, rms_norm_eps=eps,
              tie_word_embeddings=False, attention_dropout=0.0, hidden_act="silu",
              attn_implementation="eager")
    cls_cfg, cls_model = CLASSES[f.arch]
    if "num_nextn_predict_layers" in inspect.signature(getattr(tf, cls_cfg).__init__).parameters:
        kw["num_nextn_predict_layers"] = 0
    if ds:
        R, rot = g("attention.kv_lora_rank"), n_rot
        kl, vl = g("attention.key_length_mla"), g("attention.value_length_mla")
        if kl is None:
            sys.exit("deepseek2: the file has no attention.key_length_mla (an old layout with "
                     "attn_kv_b): give a current one")
        factor, orig = g("rope.scaling.factor", 1.0), g("rope.scaling.original_context_length", 4096)
        # convert_hf_to_gguf.py writes yarn_log_multiplier = 0.1 * mscale_all_dim; DeepSeek-V3's
        # config has mscale = mscale_all_dim (1.0), so the rope's own magnitude is 1, as llama.cpp's
        mall = g("rope.scaling.yarn_log_multiplier", 0.0) / 0.1
        meta.update(R=R, rot=rot, nope=kl - rot, VH=vl, kl=kl, factor=factor, orig=orig,
                    log_mul=g("rope.scaling.yarn_log_multiplier", 0.0),
                    q_lora=g("attention.q_lora_rank", 0))
        kw.update(num_key_value_heads=H, q_lora_rank=meta["q_lora"] or None, kv_lora_rank=R,
                  qk_nope_head_dim=kl - rot, qk_rope_head_dim=rot, v_head_dim=vl,
                  attention_bias=False, rope_interleave=True,
                  max_position_embeddings=int(orig * factor))
        rope = None
        if g("rope.scaling.type") == "yarn":
            rope = {"rope_type": "yarn", "factor": float(factor), "beta_fast": 32.0,
                    "beta_slow": 1.0, "original_max_position_embeddings": int(orig),
                    "mscale": float(mall), "mscale_all_dim": float(mall), "truncate": True}
        cfg = make_config(tf, cls_cfg, kw, rope, theta)
    else:
        D = g("attention.key_length", E // H)
        meta.update(D=D)
        kw.update(num_key_value_heads=KVH, head_dim=D, partial_rotary_factor=n_rot / D,
                  use_qk_norm=f.has("blk.0.attn_q_norm.weight"),
                  attention_bias=f.has("blk.0.attn_q.bias"),
                  max_position_embeddings=g("context_length"))
        cfg = make_config(tf, cls_cfg, kw, None, theta, {"partial_rotary_factor": n_rot / D})
    model = getattr(tf, cls_model)(cfg).float().eval()
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    ld = Loader(torch, model, f)
    m = model.model
    if len(m.layers) != L:
        sys.exit(f"{f.arch}: transformers built {len(m.layers)} layers, the file runs {L}")
    ld.put(m.embed_tokens.weight, "token_embd.weight")
    ld.put(m.norm.weight, "output_norm.weight")
    ld.put(model.lm_head.weight, "output.weight")
    layout = None
    for il, layer in enumerate(m.layers):
        p = f"blk.{il}."
        at = layer.self_attn
        ld.put(layer.input_layernorm.weight, p + "attn_norm.weight")
        if ds:
            load_mla(torch, ld, at, p, meta)
            ld.put(layer.post_attention_layernorm.weight, p + "ffn_norm.weight")
        else:
            for proj, nm in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")):
                ld.put(getattr(at, proj).weight, p + nm + ".weight")
                if getattr(at, proj).bias is not None:
                    ld.put(getattr(at, proj).bias, p + nm + ".bias")
            ld.put(at.o_proj.weight, p + "attn_output.weight")
            if f.has(p + "attn_q_norm.weight"):
                ld.put(at.q_norm.weight, p + "attn_q_norm.weight")
                ld.put(at.k_norm.weight, p + "attn_k_norm.weight")
            ld.put(layer.post_attention_layernorm.weight, p + "post_attention_norm.weight")
        mlp = layer.mlp
        if il < dense:
            for x in ("gate", "up", "down"):
                ld.put(getattr(mlp, x + "_proj").weight, p + f"ffn_{x}.weight")
            continue
        router = mlp.gate if hasattr(mlp, "gate") else mlp.router
        ld.put(router.weight, p + "ffn_gate_inp.weight")
        # the selection bias (transformers' e_score_correction_bias, a buffer)
        ld.put(router.e_score_correction_bias, p + "exp_probs_b.bias")
        if S:
            for x in ("gate", "up", "down"):
                ld.put(getattr(mlp.shared_experts, x + "_proj").weight, p + f"ffn_{x}_shexp.weight")
        layout = load_experts(torch, ld, mlp, f, meta, il, layout)
    ld.check_all_set()
    meta["report"] = routing_report(torch, f, meta, L)
    return model, layout, meta


def load_mla(torch, ld, at, p, mt):
    """DeepSeek's MLA: convert_hf_to_gguf.py splits kv_b_proj (H * (nope + v), R) per head into
    attn_k_b (ne nope, R, H: each head's k part transposed) and attn_v_b (ne R, v, H)."""
    f, H, nope, VH, R = ld.f, mt["H"], mt["nope"], mt["VH"], mt["R"]
    if mt["q_lora"]:
        ld.put(at.q_a_proj.weight, p + "attn_q_a.weight")
        ld.put(at.q_a_layernorm.weight, p + "attn_q_a_norm.weight")
        ld.put(at.q_b_proj.weight, p + "attn_q_b.weight")
    else:
        ld.put(at.q_proj.weight, p + "attn_q.weight")
    ld.put(at.kv_a_proj_with_mqa.weight, p + "attn_kv_a_mqa.weight")
    ld.put(at.kv_a_layernorm.weight, p + "attn_kv_a_norm.weight")
    k_b, v_b = f.t(p + "attn_k_b.weight"), f.t(p + "attn_v_b.weight")  # (H, R, nope), (H, v, R)
    kv_b = torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(H * (nope + VH), R)
    ld.set(at.kv_b_proj.weight, kv_b)
    ld.put(at.o_proj.weight, p + "attn_output.weight")


def expert_weights(f, il):
    p = f"blk.{il}."
    return dict(gate=f.t(p + "ffn_gate_exps.weight"), up=f.t(p + "ffn_up_exps.weight"),
                down=f.t(p + "ffn_down_exps.weight"))  # (X, F, E), (X, F, E), (X, E, F)


def load_experts(torch, ld, mlp, f, mt, il, layout):
    """Sets mlp's routed experts: a list of MLPs (4.x) or fused 3-D parameters (5.x) in the layout
    (gate and up concatenated or interleaved, each matrix (out, in) or (in, out)) that reproduces
    the direct FFN block on random rows (tried once, then kept)."""
    w = expert_weights(f, il)
    X, E, F = w["gate"].shape[0], w["gate"].shape[2], w["gate"].shape[1]
    ex = mlp.experts
    x = torch.randn(5, E, generator=torch.Generator().manual_seed(7))
    want = direct_ffn(torch, f, mt, il, x.double())
    if isinstance(ex, torch.nn.ModuleList):
        for e in range(X):
            for nm in ("gate", "up", "down"):
                ld.set(getattr(ex[e], nm + "_proj").weight, w[nm][e])
        cands, layout = [None], "module_list"
    else:
        cands = [tuple(layout)] if layout else [(i, c, d) for i in (False, True)
                                                for c in ("out_in", "in_out") for d in ("out_in", "in_out")]
    errs = []
    for cand in cands:
        if cand is not None:
            inter, gu, dn = cand
            g, u = w["gate"], w["up"]  # (X, F, E): out_in
            m_ = torch.stack([g, u], dim=2).reshape(X, 2 * F, E) if inter else torch.cat([g, u], dim=1)
            if gu == "in_out":
                m_ = m_.transpose(1, 2)
            d_ = w["down"] if dn == "out_in" else w["down"].transpose(1, 2)
            if tuple(ex.gate_up_proj.shape) != tuple(m_.shape) or tuple(ex.down_proj.shape) != tuple(d_.shape):
                continue
            ld.set(ex.gate_up_proj, m_.contiguous())
            ld.set(ex.down_proj, d_.contiguous())
        got = mlp(x[None])
        got = (got[0] if isinstance(got, tuple) else got).reshape(5, E).double()
        err = float((got - want).abs().max() / want.abs().max())
        errs.append((cand, err))
        if err <= CHECK_TOL:
            return layout if cand is None else list(cand)
        if layout:
            break
    src = inspect.getsource(type(mlp).forward)[:2000]
    sys.exit(f"{f.arch} blk.{il}: no expert layout reproduces the direct MoE block ({errs}); "
             f"transformers' block: {type(mlp).__name__}, {type(ex).__name__}\n{src}")


# ---- llama.cpp's definitions, computed directly from the GGUF's tensors (float64) -------------


def rms(torch, x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def route(torch, f, mt, il, x, mask=float("-inf")):
    """llama.cpp's build_moe_ffn routing for sigmoid gating: (the chosen experts, their weights,
    the choice without the bias, the choice without the group limit). x: (T, E) float64."""
    p = f"blk.{il}."
    probs = torch.sigmoid(x @ f.t(p + "ffn_gate_inp.weight").double().T)
    sel = probs + f.t(p + "exp_probs_b.bias").double()
    X, K, G, GU = mt["X"], mt["K"], mt["G"], mt["GU"]
    plain = sel.topk(K, dim=-1).indices
    nobias = probs.topk(K, dim=-1).indices
    if G > 1:
        # a group scores the sum of its two best; the best GU groups stay, the others are masked
        grp = sel.reshape(-1, G, X // G)
        gscore = grp.topk(2, dim=-1).values.sum(-1)
        keep = gscore.topk(GU, dim=-1).indices
        gmask = torch.zeros_like(gscore, dtype=torch.bool).scatter_(1, keep, True)
        sel = sel.masked_fill(~gmask.repeat_interleave(X // G, dim=1), mask)
    idx = sel.topk(K, dim=-1).indices
    wt = probs.gather(1, idx)
    if mt["norm"]:
        wt = wt / wt.sum(-1, keepdim=True).clamp(min=6.103515625e-5)
    return idx, wt * mt["scale"], nobias, plain


def swiglu(torch, x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def direct_ffn(torch, f, mt, il, x):
    """Layer il's FFN on its normalized input x (T, E): the dense SwiGLU, or the routed experts
    (sigmoid routing, selection bias, group limit, normalized and scaled weights) plus the
    ungated shared expert."""
    p, d = f"blk.{il}.", lambda nm: f.t(nm).double()
    if il < mt["dense"]:
        return swiglu(torch, x, d(p + "ffn_gate.weight"), d(p + "ffn_up.weight"), d(p + "ffn_down.weight"))
    w = {k: v.double() for k, v in expert_weights(f, il).items()}
    idx, wt, _, _ = route(torch, f, mt, il, x)
    out = torch.zeros_like(x)
    for r in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[r, j])
            out[r] += wt[r, j] * swiglu(torch, x[r:r + 1], w["gate"][e], w["up"][e], w["down"][e])[0]
    if f.has(p + "ffn_gate_shexp.weight"):
        out += swiglu(torch, x, d(p + "ffn_gate_shexp.weight"), d(p + "ffn_up_shexp.weight"),
                      d(p + "ffn_down_shexp.weight"))
    return out


def rope_angles(torch, mt, T, n_rot):
    """(T, n_rot / 2) angles of ggml's rope: theta_i = p * base^(-2i / n_rot), with YaRN (ext
    factor 1, beta 32 / 1, the ramp's ends rounded to whole dims) when the file has it."""
    i = torch.arange(n_rot // 2, dtype=torch.float64)
    extrap = mt["theta"] ** (-2.0 * i / n_rot)
    freq = extrap
    if mt.get("factor", 1.0) > 1.0:
        base, orig = mt["theta"], mt["orig"]

        def corr(beta):
            return n_rot * math.log(orig / (beta * 2 * math.pi)) / (2 * math.log(base))

        lo, hi = max(0.0, math.floor(corr(32.0))), min(n_rot - 1.0, math.ceil(corr(1.0)))
        ramp = 1 - ((i - lo) / max(0.001, hi - lo)).clamp(0, 1)
        freq = extrap / mt["factor"] * (1 - ramp) + extrap * ramp
    return torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]


def rope_neox(torch, x, ang):
    """NEOX: dims i and i + n_rot / 2 of the first n_rot rotate together. x (T, h, D)."""
    n = ang.shape[1]
    c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., :n], x[..., n:2 * n]
    return torch.cat([a * c - b * s, a * s + b * c, x[..., 2 * n:]], dim=-1)


def rope_norm(torch, x, ang):
    """NORM: adjacent pairs (2i, 2i + 1) rotate together. x (T, h, n_rot)."""
    c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).reshape(x.shape)


def causal_softmax(torch, scores):
    T = scores.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1)


def direct_attention(torch, f, mt, il, x):
    """Layer il's attention on its normalized input x (T, E), positions 0..T-1, as llama.cpp
    computes it: glm4moe's GQA with biases, per-head q/k norms and NEOX rope on the first n_rot
    dims; deepseek2's MLA in the absorbed form (the nope query taken into the latent through
    attn_k_b, the latent attended, the output through attn_v_b), NORM rope with YaRN on the rope
    parts, scale mscale^2 / sqrt(key head) with mscale = 1 + yarn_log_multiplier * ln(factor)."""
    p, d = f"blk.{il}.", lambda nm: f.t(nm).double()
    T, H, eps = x.shape[0], mt["H"], mt["eps"]
    if not mt["ds"]:
        D, KVH = mt["D"], mt["KVH"]

        def proj(nm, heads):
            y = x @ d(p + nm + ".weight").T
            if f.has(p + nm + ".bias"):
                y = y + d(p + nm + ".bias")
            return y.reshape(T, heads, D)

        q, k, v = proj("attn_q", H), proj("attn_k", KVH), proj("attn_v", KVH)
        if f.has(p + "attn_q_norm.weight"):
            q, k = rms(torch, q, d(p + "attn_q_norm.weight"), eps), rms(torch, k, d(p + "attn_k_norm.weight"), eps)
        ang = rope_angles(torch, mt, T, mt["n_rot"])
        q, k = rope_neox(torch, q, ang), rope_neox(torch, k, ang)
        rep = H // KVH
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = causal_softmax(torch, torch.einsum("thd,shd->hts", q, k) / math.sqrt(D))
        o = torch.einsum("hts,shd->thd", att, v).reshape(T, H * D)
        return o @ d(p + "attn_output.weight").T
    R, rot, nope = mt["R"], mt["rot"], mt["nope"]
    if mt["q_lora"]:
        q = rms(torch, x @ d(p + "attn_q_a.weight").T, d(p + "attn_q_a_norm.weight"), eps) @ d(p + "attn_q_b.weight").T
    else:
        q = x @ d(p + "attn_q.weight").T
    q = q.reshape(T, H, mt["kl"])
    q_nope, q_pe = q[..., :nope], q[..., nope:]
    kva = x @ d(p + "attn_kv_a_mqa.weight").T
    c = rms(torch, kva[:, :R], d(p + "attn_kv_a_norm.weight"), eps)  # (T, R)
    ang = rope_angles(torch, mt, T, rot)
    q_pe = rope_norm(torch, q_pe, ang)
    k_pe = rope_norm(torch, kva[:, None, R:], ang)[:, 0]  # (T, rot)
    q_lat = torch.einsum("thn,hrn->thr", q_nope, d(p + "attn_k_b.weight"))  # k_b (H, R, nope)
    mscale = 1.0 + mt["log_mul"] * math.log(mt["factor"]) if mt["factor"] > 1.0 else 1.0
    scores = (torch.einsum("thr,sr->hts", q_lat, c) + torch.einsum("thd,sd->hts", q_pe, k_pe))
    att = causal_softmax(torch, scores * mscale * mscale / math.sqrt(mt["kl"]))
    o_lat = torch.einsum("hts,sr->thr", att, c)
    o = torch.einsum("thr,hvr->thv", o_lat, d(p + "attn_v_b.weight"))  # v_b (H, v, R)
    return o.reshape(T, H * mt["VH"]) @ d(p + "attn_output.weight").T


def routing_report(torch, f, mt, L):
    """How much the fixture's routing exercises the selection bias and the group limit, and whether
    transformers' group mask (0.0 where llama.cpp puts -inf) could choose differently: counted on
    random unit rows through each MoE layer's router."""
    x = torch.randn(512, mt["E"], generator=torch.Generator().manual_seed(9)).double()
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
    rep = {"rows": 512, "bias_changes_choice": 0, "group_limit_changes_choice": 0,
           "zero_mask_differs": 0}
    for il in range(mt["dense"], L):
        idx, _, nobias, plain = route(torch, f, mt, il, x)
        idx0, _, _, _ = route(torch, f, mt, il, x, mask=0.0)
        same = lambda a, b: (a.sort(-1).values == b.sort(-1).values).all(-1)
        rep["bias_changes_choice"] += int((~same(plain, nobias)).sum())
        rep["group_limit_changes_choice"] += int((~same(idx, plain)).sum())
        rep["zero_mask_differs"] += int((~same(idx, idx0)).sum())
    rep["moe_layers"] = L - mt["dense"]
    return {"routing": rep}


if __name__ == "__main__":
    main()
