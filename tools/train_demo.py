#!/usr/bin/env python3
"""Train strata's bundled demo model: a small qwen3moe (transformers' Qwen3MoeForCausalLM) on text
pre-tokenized by strata's own tokenizer (`strata bpe-train`, then `strata tokenize`).

Input (--ids): the token ids of the whole text, raw little-endian uint32 (a name ending in .txt is
read as decimal ids separated by spaces, as `strata tokenize` prints them). The last 10% is held out.
Output (--out): the best checkpoint by held-out loss (save_pretrained: config.json + safetensors),
loss.csv (step, train loss, held-out loss, ...), loss.png, heldout_ids.bin (raw uint32, for
`strata perplexity --ids`), perplexity.json and greedy.json (a greedy continuation, for `strata run`).

Perplexity rule, the same as `strata perplexity` (tools/perplexity.h): windows start at token 0,
stride, 2*stride, ...; each covers [b, min(b+ctx, N)) and is evaluated from an empty context; token p
(1 <= p < N) is scored once, in the first window that holds it at a position after the window's
first token: window b scores [max(b+1, end of the previous window), its end). Windows stop at the one
reaching N. With stride == ctx (the default, 256) the windows do not overlap and each scores ctx-1
tokens. Perplexity = exp(total NLL / scored tokens), NLL in float64 over float32 logits.
"""
import argparse, csv, json, math, os, sys, time

T_START = time.time()


def log(*a):
    print(f"[{time.time() - T_START:6.1f}s]", *a, flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ids", required=True, help="token ids: raw little-endian uint32 (.txt: decimal)")
    p.add_argument("--vocab-size", type=int, required=True, help="the tokenizer's n_vocab")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--minutes", type=float, default=8.0, help="wall-clock cap for the whole script")
    p.add_argument("--reserve", type=float, default=40.0, help="seconds kept for the final steps")
    for k, v in dict(layers=6, hidden=256, heads=4, kv_heads=2, head_dim=64, experts=16, top_k=2,
                     expert_ff=256).items():  # the model's shape; expert_ff: moe_intermediate_size
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    p.add_argument("--tie", action="store_true", help="tie the output head to the embeddings")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--ctx", type=int, default=256, help="training sequence and perplexity window")
    p.add_argument("--stride", type=int, default=256, help="perplexity window stride")
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1, help="cosine floor, fraction of --lr")
    p.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.1,
                   help="dropout on the embeddings and on every attention and MoE block output")
    p.add_argument("--aux-coef", type=float, default=0.01, help="load-balancing loss weight")
    p.add_argument("--eval-every", type=int, default=100, help="steps between held-out evaluations")
    p.add_argument("--patience", type=int, default=6, help="evaluations without improvement to stop")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def read_ids(path):
    import array
    a = array.array("I")
    if path.endswith(".txt"):
        with open(path) as f:
            a.extend(int(t) for t in f.read().replace(",", " ").split())
    else:
        with open(path, "rb") as f:
            a.frombytes(f.read())
        if sys.byteorder != "little":
            a.byteswap()
    return a


def make_config(a):
    import inspect
    from transformers import Qwen3MoeConfig
    kw = dict(vocab_size=a.vocab_size, hidden_size=a.hidden, intermediate_size=a.expert_ff,
              moe_intermediate_size=a.expert_ff, num_hidden_layers=a.layers,
              num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
              num_experts=a.experts, num_experts_per_tok=a.top_k, norm_topk_prob=True,
              decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=2048,
              rms_norm_eps=1e-6, tie_word_embeddings=a.tie, output_router_logits=True,
              router_aux_loss_coef=a.aux_coef, attention_dropout=0.0, use_cache=False)
    # transformers 5 moved rope_theta into rope_parameters; 4.x takes it directly.
    if "rope_parameters" in inspect.signature(Qwen3MoeConfig.__init__).parameters:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": a.rope_theta}
    else:
        kw["rope_theta"] = a.rope_theta
    cfg = Qwen3MoeConfig(**kw)
    for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_experts", "num_experts_per_tok",
              "moe_intermediate_size", "head_dim", "num_key_value_heads", "norm_topk_prob"):
        if getattr(cfg, k, None) != kw[k]:
            sys.exit(f"Qwen3MoeConfig ignored {k}={kw[k]} (has {getattr(cfg, k, None)}): "
                     "this transformers version names it differently")
    return cfg


def add_dropout(torch, model, p):
    """Qwen3Moe has no residual dropout: forward hooks drop out the embeddings and each block's
    attention and MoE outputs in training. It slows the overfitting of 300K tokens by a 22M model
    (trial runs on an H200 overfit after ~400 steps); the best held-out loss moved little."""
    def hook(mod, inp, out):
        if isinstance(out, tuple):
            return (torch.nn.functional.dropout(out[0], p, mod.training),) + tuple(out[1:])
        return torch.nn.functional.dropout(out, p, mod.training)
    if p > 0:
        model.model.embed_tokens.register_forward_hook(hook)
        for layer in model.model.layers:
            layer.self_attn.register_forward_hook(hook)
            layer.mlp.register_forward_hook(hook)


def save(model, a, out):
    """save_pretrained, plus the 4.x names of two keys transformers 5 renamed (num_experts is
    num_local_experts, rope_theta moved into rope_parameters) for converters that read those."""
    model.save_pretrained(out)
    path = os.path.join(out, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.setdefault("num_experts", a.experts)
    cfg.setdefault("rope_theta", a.rope_theta)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def balance_loss(torch, router_out, k):
    """Switch Transformer's load-balancing loss, averaged over layers: E * sum_e f_e * P_e with f_e
    the share of top-k picks and P_e the mean router probability of expert e; 1.0 is perfectly even.
    Computed here because transformers 5.x routers return probabilities as router_logits and its
    loss softmaxes them again, which flattens the loss to a constant (huggingface/transformers
    #45120). Either form is accepted: rows that are already probabilities are used as they are."""
    total = 0.0
    for r in router_out:
        r = r.float().reshape(-1, r.shape[-1])
        d = r.detach()
        is_prob = bool(d.min() >= 0) and bool(((d.sum(-1) - 1).abs() < 1e-2).all())
        probs = r if is_prob else r.softmax(-1)
        picks = d.topk(k, dim=-1).indices.flatten()
        f = torch.bincount(picks, minlength=r.shape[-1]).float() / picks.numel()
        total = total + r.shape[-1] * (f * probs.mean(0)).sum()
    return total / len(router_out)


def windows(n, ctx, stride):
    """The perplexity windows (begin, end, first scored position): see the module docstring."""
    out, prev_end = [], 0
    for b in range(0, n, stride):
        e = min(b + ctx, n)
        s = max(b + 1, prev_end)
        if s < e:
            out.append((b, e, s))
        prev_end = e
        if e == n:
            break
    return out


def heldout_nll(torch, model, ids, ctx, stride, amp, batch=64):
    """Mean NLL and scored-token count of ids (a CPU LongTensor) under the window rule."""
    ws = windows(len(ids), ctx, stride)
    dev = next(model.parameters()).device
    total, count, i, was_training = 0.0, 0, 0, model.training
    model.eval()
    with torch.no_grad():
        while i < len(ws):
            j = i
            while j < len(ws) and j - i < batch and ws[j][1] - ws[j][0] == ws[i][1] - ws[i][0]:
                j += 1
            x = torch.stack([ids[b:e] for b, e, _ in ws[i:j]]).to(dev)
            with amp():
                logits = model(input_ids=x, use_cache=False).logits
            lp = torch.log_softmax(logits.float()[:, :-1], dim=-1)
            nll = -lp.gather(-1, x[:, 1:].unsqueeze(-1)).squeeze(-1)  # [r, k] predicts b + k + 1
            for r, (b, e, s) in enumerate(ws[i:j]):
                part = nll[r, s - b - 1:]
                total += part.double().sum().item()
                count += part.numel()
            i = j
    model.train(was_training)
    return total / max(count, 1), count


def main():
    a = parse_args()
    import contextlib
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3MoeForCausalLM
    import transformers
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {dev}")
    bf16 = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
    ids = torch.tensor(read_ids(a.ids), dtype=torch.long)
    if len(ids) < 20 * a.ctx or int(ids.max()) >= a.vocab_size:
        sys.exit(f"{a.ids}: {len(ids)} ids, max {int(ids.max())}: need >= {20 * a.ctx} ids "
                 f"below --vocab-size {a.vocab_size}")
    n_held = len(ids) // 10
    train, held = ids[:-n_held].to(dev), ids[-n_held:]
    held.numpy().astype("<u4").tofile(os.path.join(a.out, "heldout_ids.bin"))
    log(f"{len(ids)} ids: {len(train)} train, {n_held} held out (the last 10%)")

    model = Qwen3MoeForCausalLM(make_config(a)).to(dev)
    add_dropout(torch, model, a.dropout)
    log(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))
    deadline = T_START + 60 * a.minutes - a.reserve
    t_train = time.time()
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    offs = torch.arange(a.ctx + 1, device=dev)
    rows, best, best_state, bad, step, stop = [], float("inf"), None, 0, 0, "time"
    run_ce, run_aux, run_n = 0.0, 0.0, 0
    while time.time() < deadline:
        frac = min(1.0, (time.time() - t_train) / max(deadline - t_train, 1.0))
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (
            a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        start = torch.randint(0, len(train) - a.ctx - 1, (a.batch,), device=dev, generator=gen)
        seq = train[start[:, None] + offs]
        with bf16():
            out = model(input_ids=seq[:, :-1], use_cache=False, output_router_logits=True)
        ce = F.cross_entropy(out.logits.float().reshape(-1, a.vocab_size), seq[:, 1:].reshape(-1))
        aux = balance_loss(torch, out.router_logits, a.top_k)
        loss = ce + a.aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        run_ce, run_aux, run_n = run_ce + ce.item(), run_aux + aux.detach().item(), run_n + 1
        if step % a.eval_every:
            continue
        hl, _ = heldout_nll(torch, model, held, a.ctx, a.stride, bf16)
        el = time.time() - T_START
        rows.append((step, run_ce / run_n, hl, lr, run_aux / run_n, el))
        log(f"step {step}: train {run_ce / run_n:.4f}, held-out {hl:.4f} (ppl {math.exp(hl):.1f}), "
            f"balance {run_aux / run_n:.3f} (1 = even), lr {lr:.2e}, "
            f"{step * a.batch * a.ctx / (time.time() - t_train):.0f} tok/s")
        run_ce, run_aux, run_n = 0.0, 0.0, 0
        if hl < best:
            best, bad = hl, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            best_step = step
        else:
            bad += 1
            if bad >= a.patience:
                stop = f"no held-out improvement in {a.patience} evaluations"
                break
    if best_state is None:
        sys.exit(f"no evaluation ran in {a.minutes} minutes ({step} steps): lower --eval-every")
    log(f"stopped after {step} steps ({stop}); best held-out loss {best:.4f} at step {best_step}")
    model.load_state_dict(best_state)
    model.eval()
    save(model, a, a.out)
    with open(os.path.join(a.out, "loss.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "train_loss", "heldout_loss", "lr", "aux_loss", "elapsed_s"])
        w.writerows(rows)

    # Final figures in float32 (no autocast, no TF32), comparable with strata's F32 forward.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model.float()
    nll, scored = heldout_nll(torch, model, held, a.ctx, a.stride, contextlib.nullcontext)
    res = dict(perplexity=math.exp(nll), mean_nll=nll, scored_tokens=scored, heldout_ids=n_held,
               ctx=a.ctx, stride=a.stride, dtype="float32", best_step=best_step, steps=step,
               stop=stop, heldout_file="heldout_ids.bin",
               rule="windows at 0, stride, ...; each [b, min(b+ctx, N)) from an empty context; "
                    "scores [max(b+1, previous end), end); exp(total NLL / scored)")
    log(f"held-out perplexity (float32, ctx {a.ctx}, stride {a.stride}): {res['perplexity']:.3f} "
        f"over {scored} tokens")
    try:  # how the router spreads held-out tokens over experts, per layer (for `strata trace`)
        with torch.no_grad():
            x = held[: (len(held) // a.ctx) * a.ctx].view(-1, a.ctx)[:64].to(dev)
            rl = model(input_ids=x, use_cache=False, output_router_logits=True).router_logits
        res["expert_share"] = [
            (torch.bincount(r.float().topk(a.top_k, dim=-1).indices.flatten(), minlength=a.experts)
             / (r.shape[0] * a.top_k)).tolist() for r in rl]
    except Exception as e:  # a figure for the notes, not needed by anything downstream
        log(f"no expert_share: {e}")
    with open(os.path.join(a.out, "perplexity.json"), "w") as f:
        json.dump(res, f, indent=1)
    with torch.no_grad():  # greedy continuation of the first 32 held-out tokens, float32
        prompt = held[:32].tolist()
        seq = list(prompt)
        for _ in range(64):
            logits = model(input_ids=torch.tensor([seq], device=dev), use_cache=False).logits
            seq.append(int(logits[0, -1].argmax()))
    with open(os.path.join(a.out, "greedy.json"), "w") as f:
        json.dump({"prompt_ids": prompt, "greedy_ids": seq[len(prompt):]}, f)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([r[0] for r in rows], [r[1] for r in rows], label="train (mean since last eval)")
        ax.plot([r[0] for r in rows], [r[2] for r in rows], label="held-out")
        ax.axvline(best_step, color="gray", ls=":", label=f"best, step {best_step}")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats/token)")
        ax.set_title(f"demo qwen3moe: held-out ppl {res['perplexity']:.1f}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "loss.png"), dpi=120)
    except Exception as e:  # the plot is a convenience: the CSV has the numbers
        log(f"no loss.png: {e}")
    log(f"done: {a.out} ({sorted(os.listdir(a.out))})")


if __name__ == "__main__":
    main()
