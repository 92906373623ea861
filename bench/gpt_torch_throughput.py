#!/usr/bin/env python3
"""Tokens/s of the GPT of tests/golden/gpt_parity.py in PyTorch (training steps: forward,
backward, clipping, AdamW), for bench/run_gpt.sh and bench/peer_torch2.sh to put beside
shardwise's figure, and the process's peak RSS.

    /usr/bin/python3 bench/gpt_torch_throughput.py --threads 2 --steps 6
    PYTHON bench/gpt_torch_throughput.py --attention sdpa [--compile] --layers 12 --hidden 768 ...

--attention naive: the scores [B, NH, S, S] materialized (softmax(q k^T / sqrt(d) + mask) v), as
shardwise's unfused graph; sdpa: torch.nn.functional.scaled_dot_product_attention(is_causal=True)
(PyTorch 2.x). --compile: the loss function through torch.compile (the first steps compile; the
figure excludes --warmup steps).
"""
import argparse
import math
import resource
import time

import torch


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--layers", type=int, default=4)
    a.add_argument("--hidden", type=int, default=256)
    a.add_argument("--heads", type=int, default=4)
    a.add_argument("--seq", type=int, default=256)
    a.add_argument("--vocab", type=int, default=256)
    a.add_argument("--batch", type=int, default=8)
    a.add_argument("--steps", type=int, default=6)
    a.add_argument("--threads", type=int, default=2)
    a.add_argument("--attention", choices=["naive", "sdpa"], default="naive")
    a.add_argument("--compile", action="store_true")
    a.add_argument("--warmup", type=int, default=1, help="first steps left out of the figure")
    o = a.parse_args()
    torch.set_num_threads(o.threads)
    torch.manual_seed(0)
    L, H, NH, S, V, B = o.layers, o.hidden, o.heads, o.seq, o.vocab, o.batch
    HD = H // NH
    def param(*shape, std=0.02):
        return (torch.randn(*shape) * std).requires_grad_()
    p = {"wte": param(V, H), "wpe": param(S, H), "lnf.w": torch.ones(H, requires_grad=True), "lnf.b": torch.zeros(H, requires_grad=True)}
    for l in range(L):
        for n, shape in [("q", (H, H)), ("k", (H, H)), ("v", (H, H)), ("o", (H, H)), ("fc", (H, 4 * H)), ("proj", (4 * H, H))]:
            p[f"{l}.{n}.w"] = param(*shape)
            p[f"{l}.{n}.b"] = torch.zeros(shape[1], requires_grad=True)
        for n in ("ln1", "ln2"):
            p[f"{l}.{n}.w"] = torch.ones(H, requires_grad=True)
            p[f"{l}.{n}.b"] = torch.zeros(H, requires_grad=True)
    mask = torch.triu(torch.full((S, S), -1e9), diagonal=1)
    def lin(x, n):
        return x @ p[n + ".w"] + p[n + ".b"]
    def ln(x, n):
        return torch.nn.functional.layer_norm(x, (H,), p[n + ".w"], p[n + ".b"], 1e-5)
    def forward(ids, labels):
        x = p["wte"][ids] + p["wpe"]
        for l in range(L):
            h = ln(x, f"{l}.ln1")
            q, k, v = (lin(h, f"{l}.{n}").reshape(B, S, NH, HD).transpose(1, 2) for n in "qkv")
            if o.attention == "sdpa":
                ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                ctx = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HD) + mask, dim=-1) @ v
            x = x + lin(ctx.transpose(1, 2).reshape(B, S, H), f"{l}.o")
            x = x + lin(torch.nn.functional.gelu(lin(ln(x, f"{l}.ln2"), f"{l}.fc"), approximate="tanh"), f"{l}.proj")
        logits = ln(x, "lnf") @ p["wte"].T
        return torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))
    loss_fn = torch.compile(forward) if o.compile else forward
    opt = torch.optim.AdamW(list(p.values()), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
    ids = torch.randint(0, V, (B, S))
    labels = torch.randint(0, V, (B, S))
    times = []
    for step in range(o.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    steady = times[o.warmup:] if len(times) > o.warmup else times[-1:]
    kind = o.attention + (" compiled" if o.compile else "")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"torch {torch.__version__} {kind} threads {o.threads}: {B * S / (sum(steady) / len(steady)):.0f} tokens/s "
          f"(median step {sorted(steady)[len(steady) // 2] * 1e3:.0f} ms, first {o.warmup} step(s) excluded); "
          f"peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()
