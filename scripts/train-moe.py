#!/usr/bin/env python3
"""train-moe — train strata's benchmark MoE: a Qwen3-MoE-shaped model (transformers'
Qwen3MoeForCausalLM, 8 layers of 64 experts, top-8, about 415 M parameters) whose routing is
learned, so that expert caches and the tier's policies can be measured on routing with the
temporal locality of a real model (docs/benchmark-moe.md).

Input (--ids): the token ids of the whole text, raw little-endian uint32 (`strata tokenize` of the
text with the demo model's tokenizer, models/demo-tokenizer.gguf; .txt: decimal ids). The last 10%
is held out and never trained on.
Output (--out):
  config.json, model.safetensors  the checkpoint with the best held-out loss (`strata convert`
                                  writes the GGUF: qwen3moe, llama.cpp's names and keys)
  loss.csv                        step, train loss, held-out loss, balance loss, lr, elapsed s
  heldout_ids.bin                 the held-out ids, raw uint32
  routing.trace                   the trained model's routing over the first --trace-tokens
                                  held-out tokens, float32, in windows of --ctx tokens each from
                                  an empty context, the way `strata trace` records one: the trace
                                  file of tools/trace.h (`strata trace --replay routing.trace`)
  train.json                      the shape, the figures and the time each phase took
Deterministic for a seed (batches, init) up to the GPU's bf16 kernels. Prints the loss curve and
the time. Needs torch and transformers 4.5x or 5.x; the helpers (config, balance loss, held-out
loss) are tools/train_demo.py's.
"""
import argparse
import csv
import json
import math
import os
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T_START = time.time()

TRACE_MAGIC = b"STRATATR"
TRACE_VERSION = 1


def log(*a):
    print(f"[{time.time() - T_START:6.1f}s]", *a, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ids", required=True, help="token ids: raw little-endian uint32 (.txt: decimal)")
    p.add_argument("--vocab-size", type=int, default=4096, help="the tokenizer's n_vocab")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--seconds", type=float, default=60.0, help="training wall-clock budget")
    for k, v in dict(layers=8, hidden=512, heads=8, kv_heads=4, head_dim=64, experts=64, top_k=8,
                     expert_ff=512).items():  # expert_ff: moe_intermediate_size
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    p.add_argument("--rope-theta", type=float, default=1e6)
    p.add_argument("--ctx", type=int, default=256, help="training sequence and trace window")
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1, help="cosine floor, fraction of --lr")
    p.add_argument("--warmup", type=int, default=30, help="linear warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--aux-coef", type=float, default=0.01, help="load-balancing loss weight")
    p.add_argument("--eval-every", type=int, default=40, help="steps between held-out evaluations")
    p.add_argument("--eval-tokens", type=int, default=8192, help="held-out tokens an evaluation scores")
    p.add_argument("--trace-tokens", type=int, default=16384, help="held-out tokens traced")
    p.add_argument("--experts-impl", default="auto",
                   help="transformers 5's experts implementation: grouped_mm, eager, or auto (the "
                        "faster of the two over a few timed steps)")
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    a.tie = False
    return a


def write_trace(path, n_layer, n_expert, n_used, ctx, rows):
    """Writes the trace file of tools/trace.h. rows: per token, per layer, n_used distinct expert
    ids (any order; written ascending)."""
    w = 1 if n_expert <= 256 else 2
    fmt = "<%d%s" % (n_layer * n_used, "B" if w == 1 else "H")
    with open(path, "wb") as f:
        f.write(TRACE_MAGIC + struct.pack("<5IQ", TRACE_VERSION, n_layer, n_expert, n_used, ctx,
                                          len(rows)))
        for tok in rows:
            flat = []
            for sel in tok:
                s = sorted(int(e) for e in sel)
                if len(s) != n_used or len(set(s)) != n_used or s[0] < 0 or s[-1] >= n_expert:
                    raise ValueError(f"a token's picks {sel}: need {n_used} distinct ids < {n_expert}")
                flat.extend(s)
            f.write(struct.pack(fmt, *flat))


def read_trace(path):
    """(n_layer, n_expert, n_used, ctx, rows) of a trace file (the tests' check of write_trace)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != TRACE_MAGIC:
        raise ValueError(f"{path}: not a strata trace")
    ver, L, E, U, ctx, n = struct.unpack_from("<5IQ", data, 8)
    w = 1 if E <= 256 else 2
    per = L * U
    body = data[36:]
    if ver != TRACE_VERSION or len(body) != n * per * w:
        raise ValueError(f"{path}: version {ver}, {len(body)} bytes for {n} tokens")
    flat = struct.unpack("<%d%s" % (n * per, "B" if w == 1 else "H"), body)
    rows = [[list(flat[(t * L + l) * U:(t * L + l + 1) * U]) for l in range(L)] for t in range(n)]
    return L, E, U, ctx, rows


def record_routing(torch, model, ids, ctx, k, dev, batch=32):
    """Per token of ids (a CPU LongTensor, whole windows of ctx), per layer, the top-k expert ids
    of the router, each window from an empty context (float32, no autocast)."""
    n = (len(ids) // ctx) * ctx
    x_all = ids[:n].view(-1, ctx)
    rows = []
    with torch.no_grad():
        for i in range(0, len(x_all), batch):
            x = x_all[i:i + batch].to(dev)
            rl = model(input_ids=x, use_cache=False, output_router_logits=True).router_logits
            # each: (batch * ctx, n_expert) (or (batch, ctx, n_expert)), probabilities
            # (transformers 5) or logits (4.x): the same order either way
            picks = [r.float().reshape(-1, r.shape[-1]).topk(k, dim=-1).indices.sort(dim=-1).values.cpu()
                     for r in rl]
            stacked = torch.stack(picks, dim=1)  # (batch * ctx, n_layer, k)
            rows.extend(stacked.tolist())
    return rows


def set_experts_impl(model, name):
    """transformers 5 runs the experts through a registry (eager, grouped_mm, batched_mm); 4.x has
    one loop. Returns the implementation in use."""
    if name != "eager" and hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation(name)
            return name
        except Exception as e:  # an older 5.x without that implementation
            log(f"experts implementation {name}: {e}; eager")
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    return "eager"


def main():
    a = parse_args()
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import contextlib
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import Qwen3MoeForCausalLM
    import train_demo as td
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device "
        f"{torch.cuda.get_device_name() if cuda else 'cpu'}")
    bf16 = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
    ids = torch.tensor(td.read_ids(a.ids), dtype=torch.long)
    if len(ids) < 20 * a.ctx or int(ids.max()) >= a.vocab_size:
        sys.exit(f"{a.ids}: {len(ids)} ids, max {int(ids.max())}: need >= {20 * a.ctx} ids "
                 f"below --vocab-size {a.vocab_size}")
    n_held = len(ids) // 10
    train, held = ids[:-n_held].to(dev), ids[-n_held:]
    held.numpy().astype("<u4").tofile(os.path.join(a.out, "heldout_ids.bin"))
    held_eval = held[:max(a.ctx, (min(a.eval_tokens, n_held) // a.ctx) * a.ctx)]
    log(f"{len(ids)} ids: {len(train)} train, {n_held} held out (the last 10%)")

    model = Qwen3MoeForCausalLM(td.make_config(a)).to(dev)
    impl = set_experts_impl(model, "grouped_mm" if a.experts_impl == "auto" else a.experts_impl)
    # auto: steps 2-4 timed with grouped_mm, 6-8 with eager (1 and 5 warm up), then the faster
    trial = {} if a.experts_impl == "auto" and impl != "eager" and cuda else None
    td.add_dropout(torch, model, a.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    per_expert = 3 * a.hidden * a.expert_ff
    active = n_params - a.layers * (a.experts - a.top_k) * per_expert
    log(f"{n_params / 1e6:.1f} M parameters, {active / 1e6:.1f} M active a token; experts: {impl}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    offs = torch.arange(a.ctx + 1, device=dev)

    def step_once(lr):
        for g in opt.param_groups:
            g["lr"] = lr
        start = torch.randint(0, len(train) - a.ctx - 1, (a.batch,), device=dev, generator=gen)
        seq = train[start[:, None] + offs]
        with bf16():
            out = model(input_ids=seq[:, :-1], use_cache=False, output_router_logits=True)
        ce = F.cross_entropy(out.logits.float().reshape(-1, a.vocab_size), seq[:, 1:].reshape(-1))
        aux = td.balance_loss(torch, out.router_logits, a.top_k)
        loss = ce + a.aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return ce, aux

    t_train = time.time()
    deadline = t_train + a.seconds
    rows, best, best_state, best_step, step = [], float("inf"), None, 0, 0
    run_ce, run_aux, run_n = 0.0, 0.0, 0
    while step == 0 or time.time() < deadline:
        frac = min(1.0, (time.time() - t_train) / a.seconds)
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (
            a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
        try:
            ce, aux = step_once(lr)
        except Exception as e:
            if step or impl == "eager":
                raise
            log(f"experts implementation {impl} failed in training ({type(e).__name__}: {e}); eager")
            impl, trial = set_experts_impl(model, "eager"), None
            opt.zero_grad(set_to_none=True)
            ce, aux = step_once(lr)
        step += 1
        run_ce, run_aux, run_n = run_ce + ce.item(), run_aux + aux.detach().item(), run_n + 1
        if trial is not None:
            now = time.time()  # .item() above waited for the step
            if step in (1, 5):
                trial["t0"] = now
            elif step in (4, 8):
                trial[impl] = (now - trial["t0"]) / 3
                if step == 4:
                    impl = set_experts_impl(model, "eager")
                else:
                    impl = min(("grouped_mm", "eager"), key=lambda k: trial[k])
                    set_experts_impl(model, impl)
                    log("seconds a step: " + ", ".join(f"{k} {trial[k]:.3f}" for k in
                        ("grouped_mm", "eager")) + f"; training on with {impl}")
                    trial = None
        last = time.time() >= deadline
        if step % a.eval_every and not last:
            continue
        hl, _ = td.heldout_nll(torch, model, held_eval, a.ctx, a.ctx, bf16)
        el = time.time() - t_train
        rows.append((step, run_ce / run_n, hl, run_aux / run_n, lr, el))
        log(f"step {step}: train {run_ce / run_n:.4f}, held-out {hl:.4f} (ppl {math.exp(hl):.1f}), "
            f"balance {run_aux / run_n:.3f} (1 = even), lr {lr:.2e}, "
            f"{step * a.batch * a.ctx / el:.0f} tok/s")
        run_ce, run_aux, run_n = 0.0, 0.0, 0
        if hl < best:
            best, best_step = hl, step
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    t_trained = time.time()
    log(f"trained {step} steps in {t_trained - t_train:.1f} s; best held-out loss {best:.4f} at "
        f"step {best_step}")
    model.load_state_dict(best_state)
    model.eval()
    set_experts_impl(model, "eager")  # float32 below: grouped_mm takes bf16 only
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model.float()
    td.save(model, a, a.out)
    with open(os.path.join(a.out, "loss.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "train_loss", "heldout_loss", "aux_loss", "lr", "elapsed_s"])
        w.writerows(rows)
    t_saved = time.time()
    n_trace = min(a.trace_tokens, n_held) // a.ctx * a.ctx
    routing = record_routing(torch, model, held[:n_trace], a.ctx, a.top_k, dev)
    write_trace(os.path.join(a.out, "routing.trace"), a.layers, a.experts, a.top_k, a.ctx, routing)
    share = [[0] * a.experts for _ in range(a.layers)]
    for tok in routing:
        for l, sel in enumerate(tok):
            for e in sel:
                share[l][e] += 1
    busiest = [max(s) / (len(routing) * a.top_k) for s in share]
    t_traced = time.time()
    log(f"routing of {len(routing)} held-out tokens traced; busiest expert of a layer "
        f"{min(busiest):.1%}-{max(busiest):.1%} of its picks (even {1 / a.experts:.1%})")
    res = dict(shape=dict(layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
                          head_dim=a.head_dim, experts=a.experts, top_k=a.top_k,
                          expert_ff=a.expert_ff, vocab=a.vocab_size),
               parameters=n_params, active_parameters=active, experts_impl=impl, steps=step,
               best_step=best_step, best_heldout_loss=best, tokens_trained=step * a.batch * a.ctx,
               batch=a.batch, ctx=a.ctx, seed=a.seed, lr=a.lr,
               train_seconds=t_trained - t_train, save_seconds=t_saved - t_trained,
               trace_seconds=t_traced - t_saved, trace_tokens=len(routing),
               busiest_expert_share=busiest, torch=torch.__version__,
               transformers=transformers.__version__,
               device=torch.cuda.get_device_name() if cuda else "cpu")
    with open(os.path.join(a.out, "train.json"), "w") as f:
        json.dump(res, f, indent=1)
    log(f"done: {a.out} ({sorted(os.listdir(a.out))})")


if __name__ == "__main__":
    main()
