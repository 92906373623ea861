#!/usr/bin/env python3
"""The GPU benchmark of issue 34 (docs/gpu.md): training tokens/s, MFU and peak device memory of
GPT-2 124M and a ~1B Llama in bf16, in PyTorch eager (attention through sdpa) and torch.compile,
and in `shardwise train --device cuda` where the binary has that option ("shardwise: not yet
supported" otherwise: no figure is made up). tools/gpu_check.sh runs it on the GPU machine.

    python3 bench/gpu_vs_torch.py --budget 150 --shardwise build/bin/shardwise --summary S.txt
    python3 bench/gpu_vs_torch.py --cpu-smoke     # tiny shapes on the CPU: proves the script runs

Models (plain PyTorch modules here, no transformers needed):
  gpt2-124m: 12 layers, 12 heads, hidden 768, vocab 50257, seq 1024, batch 16 (124.4M parameters).
  llama-1b:  Llama 3.2 1B's shape: 16 layers, 32 heads, 8 key/value heads, hidden 2048, SwiGLU
             8192, vocab 128256, tied head, rotary theta 500000, seq 2048, batch 4 (1.24B parameters).
A step: forward, cross-entropy, backward, gradient clipping at 1.0 and AdamW (fused on CUDA), with
fp32 weights and optimizer state and bf16 autocast (PyTorch's usual mixed precision); shardwise's
rows run `--bf16 --compute bf16` (bf16 weights with fp32 masters, bf16 GEMM and attention operands,
f32 accumulation, norms, softmax and loss: docs/gpu.md). Each row
runs in a process of its own (clean peak memory, and a row past the time left is stopped, saying
so): --warmup steps (torch.compile compiles there) then --steps timed steps.

tokens/s = batch x seq x steps / their time. MFU = tokens/s x FLOPs per token / the card's dense
bf16 peak: FLOPs per token = 6 x (weights of the matmuls, the LM head included) + 12 x layers x
hidden x seq (attention scores and values, counted whole as in PaLM's appendix B). Peaks: H100 SXM
and H200 989 TFLOP/s, H100 NVL 835, H100 PCIe 756, A100 312; another card gets no MFU, named.
Peak memory: torch.cuda.max_memory_allocated on CUDA; on the CPU the process's peak RSS.
"""
import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

PEAK_BF16_TFLOPS = [("H200", 989.0), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0)]

MODELS = {
    "gpt2-124m": dict(arch="gpt2", layers=12, heads=12, kv_heads=12, hidden=768, ffn=3072, vocab=50257, seq=1024,
                      batch=16),
    "llama-1b": dict(arch="llama", layers=16, heads=32, kv_heads=8, hidden=2048, ffn=8192, vocab=128256, seq=2048,
                     batch=4),
}
SMOKE = {
    "gpt2-124m": dict(arch="gpt2", layers=2, heads=2, kv_heads=2, hidden=32, ffn=128, vocab=128, seq=16, batch=2),
    "llama-1b": dict(arch="llama", layers=2, heads=4, kv_heads=2, hidden=32, ffn=64, vocab=128, seq=16, batch=2),
}


def peak_tflops(card):
    """The card's dense bf16 peak and its name in the table, or (None, why)."""
    for name, tflops in PEAK_BF16_TFLOPS:
        if name.lower() in card.lower():
            if name == "H100" and "pcie" in card.lower():
                continue
            return tflops, name
    return None, f"no bf16 peak known for '{card}'"


def matmul_weights(c):
    h, kv = c["hidden"], c["hidden"] * c["kv_heads"] // c["heads"]
    attn = h * h * 2 + h * kv * 2  # q, o; k, v
    mlp = h * c["ffn"] * (3 if c["arch"] == "llama" else 2)
    return c["layers"] * (attn + mlp) + c["vocab"] * h  # the LM head


def flops_per_token(c):
    return 6 * matmul_weights(c) + 12 * c["layers"] * c["hidden"] * c["seq"]


def build_model(torch, c):
    nn, F = torch.nn, torch.nn.functional
    h, nh, nkv, hd = c["hidden"], c["heads"], c["kv_heads"], c["hidden"] // c["heads"]
    llama = c["arch"] == "llama"

    def norm():
        return nn.RMSNorm(h, eps=1e-5) if llama else nn.LayerNorm(h, eps=1e-5)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = norm(), norm()
            self.q = nn.Linear(h, h, bias=not llama)
            self.kv = nn.Linear(h, 2 * nkv * hd, bias=not llama)
            self.o = nn.Linear(h, h, bias=not llama)
            if llama:
                self.gate_up = nn.Linear(h, 2 * c["ffn"], bias=False)
            else:
                self.fc = nn.Linear(h, c["ffn"])
            self.down = nn.Linear(c["ffn"], h, bias=not llama)

        def forward(self, x, rope):
            b, s, _ = x.shape
            y = self.n1(x)
            q = self.q(y).view(b, s, nh, hd).transpose(1, 2)
            k, v = self.kv(y).view(b, s, 2, nkv, hd).permute(2, 0, 3, 1, 4)
            if rope is not None:
                q, k = apply_rope(q, rope), apply_rope(k, rope)
            if nkv != nh:
                k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, s, h))
            y = self.n2(x)
            if llama:
                g, u = self.gate_up(y).chunk(2, dim=-1)
                return x + self.down(F.silu(g) * u)
            return x + self.down(F.gelu(self.fc(y), approximate="tanh"))

    def apply_rope(t, rope):
        cos, sin = rope
        t1, t2 = t[..., : hd // 2], t[..., hd // 2 :]
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(c["vocab"], h)
            self.wpe = None if llama else nn.Embedding(c["seq"], h)
            self.blocks = nn.ModuleList(Block() for _ in range(c["layers"]))
            self.nf = norm()
            if llama:
                inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
                ang = torch.outer(torch.arange(c["seq"], dtype=torch.float32), inv)
                self.register_buffer("cos", ang.cos(), persistent=False)
                self.register_buffer("sin", ang.sin(), persistent=False)

        def forward(self, ids, labels):
            x = self.wte(ids)
            if self.wpe is not None:
                x = x + self.wpe.weight[: ids.shape[1]]
            rope = (self.cos, self.sin) if llama else None
            for blk in self.blocks:
                x = blk(x, rope)
            logits = F.linear(self.nf(x), self.wte.weight)  # tied head
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))

    return Model()


def torch_row(o):
    """One PyTorch row in this process: prints one JSON line."""
    import torch

    cuda = not o.cpu_smoke
    if not cuda:
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    c = (SMOKE if o.cpu_smoke else MODELS)[o.row]
    dev = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    model = build_model(torch, c).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=cuda)
    fwd = torch.compile(model) if o.mode == "compile" else model
    ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), device=dev)
    labels = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), device=dev)

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = fwd(ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(o.warmup):
        loss = step()
    sync()
    warm_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(o.steps):
        loss = step()
    sync()
    dt = time.perf_counter() - t0
    row = dict(params=params, tokens_per_s=c["batch"] * c["seq"] * o.steps / dt, step_s=dt / o.steps,
               warmup_s=warm_s, loss=float(loss))
    if cuda:
        row["peak_bytes"] = torch.cuda.max_memory_allocated()
        row["card"] = torch.cuda.get_device_name()
    else:
        row["peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        row["card"] = "cpu"
    print(json.dumps(row), flush=True)


def shardwise_support(binary):
    """(supported, why not): whether `train --help` lists --device."""
    if not binary or not os.path.exists(binary):
        return False, f"binary not built ({binary or 'no --shardwise given'})"
    try:
        text = subprocess.run([binary, "train", "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"`train --help` failed: {e}"
    if not re.search(r"^\s*--device\b", text, re.M):
        return False, "train has no --device option"
    return True, ""


def shardwise_row(o, name, timeout):
    """shardwise train on the model's shape; its figures from metrics.jsonl (median after warm-up)."""
    c = (SMOKE if o.cpu_smoke else MODELS)[name]
    run_dir = tempfile.mkdtemp(prefix="sw_bench_")
    cmd = [o.shardwise, "train", "--model", c["arch"], "--layers", str(c["layers"]), "--heads", str(c["heads"]),
           "--hidden", str(c["hidden"]), "--vocab", str(c["vocab"]), "--seq", str(c["seq"]),
           "--global-batch", str(c["batch"]), "--steps", str(o.warmup + o.steps), "--bf16", "--compute", "bf16", "--run-dir", run_dir]
    if c["arch"] == "llama":
        cmd += ["--kv-heads", str(c["kv_heads"]), "--intermediate-size", str(c["ffn"])]
    if not o.cpu_smoke:
        cmd += ["--device", "cuda"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            last = ((p.stderr or p.stdout).strip().splitlines() or ["no output"])[-1]
            return {"error": f"failed (rc {p.returncode}): {last[:200]}"}
        rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if line.strip()]
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after {timeout:.0f} s (the time left)"}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    rates = sorted(r["tokens_per_s"] for r in rows if r.get("step", 0) > o.warmup and r.get("tokens_per_s"))
    if not rates:
        return {"error": "metrics.jsonl has no tokens_per_s after the warm-up"}
    out = {"tokens_per_s": rates[len(rates) // 2], "card": "cpu" if o.cpu_smoke else "cuda"}
    peak = [r[k] for r in rows for k in ("device_peak_bytes", "peak_device_bytes") if k in r]
    if peak:
        out["peak_bytes"] = max(peak)
    return out


def fmt_row(label, r, c):
    if "error" in r:
        return f"{label:<34} {r['error']}"
    peak, peak_name = peak_tflops(r.get("card", "")) if r.get("card") not in ("cpu", None) else (None, "cpu")
    mfu = f"{100 * r['tokens_per_s'] * flops_per_token(c) / (peak * 1e12):5.1f}%" if peak else "   n/a"
    mem = f"{r['peak_bytes'] / 2**30:7.2f} GiB" if "peak_bytes" in r else "  (not reported)"
    return f"{label:<34} {r['tokens_per_s']:12.0f} tok/s  MFU {mfu}  peak {mem}"


def run_rows(o):
    start = time.monotonic()
    left = lambda: o.budget - (time.monotonic() - start)
    lines, card = [], None
    sw_ok, sw_why = shardwise_support(o.shardwise) if o.shardwise else (False, "no --shardwise given")
    if o.cpu_smoke and o.shardwise and os.path.exists(o.shardwise):
        sw_ok = True  # on the CPU shardwise runs without --device: the metrics path is proven here
    for name in o.models:
        c = (SMOKE if o.cpu_smoke else MODELS)[name]
        for mode in o.modes:
            label = f"{name} torch {mode}" + (" (sdpa)" if mode == "eager" else "")
            if left() < 5:
                lines.append(f"{label:<34} skipped: the budget of {o.budget:.0f} s is spent")
                continue
            cmd = [sys.executable, os.path.abspath(__file__), "--row", name, "--mode", mode, "--steps", str(o.steps),
                   "--warmup", str(o.warmup)] + (["--cpu-smoke"] if o.cpu_smoke else [])
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=left())
                if p.returncode == 0:
                    r = json.loads(p.stdout.strip().splitlines()[-1])
                    card = card or r.get("card")
                else:
                    r = {"error": f"failed (rc {p.returncode}): {(p.stderr.strip().splitlines() or [''])[-1][:200]}"}
            except subprocess.TimeoutExpired:
                r = {"error": f"stopped: past the budget of {o.budget:.0f} s"}
            lines.append(fmt_row(label, r, c))
        label = f"{name} shardwise" + ("" if o.cpu_smoke else " --device cuda")
        if not sw_ok:
            lines.append(f"{label:<34} shardwise: not yet supported ({sw_why})")
        elif left() < 5:
            lines.append(f"{label:<34} skipped: the budget of {o.budget:.0f} s is spent")
        else:
            r = shardwise_row(o, name, left())
            if "card" in r and card and not o.cpu_smoke:
                r["card"] = card
            lines.append(fmt_row(label, r, c))
    return card, lines


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--cpu-smoke", "--dry-run", dest="cpu_smoke", action="store_true",
                   help="tiny shapes on the CPU (no GPU needed): proves the script runs")
    a.add_argument("--budget", type=float, default=150, help="seconds for all rows; a row past them is stopped")
    a.add_argument("--models", default="gpt2-124m,llama-1b", help="comma-separated: " + ",".join(MODELS))
    a.add_argument("--modes", default="eager,compile", help="comma-separated: eager, compile")
    a.add_argument("--steps", type=int, default=10, help="timed steps per row")
    a.add_argument("--warmup", type=int, default=3, help="steps before the timed ones (torch.compile compiles here)")
    a.add_argument("--shardwise", help="the shardwise binary (its rows need `train --device`)")
    a.add_argument("--summary", help="also append the table to this file")
    a.add_argument("--row", help=argparse.SUPPRESS)
    a.add_argument("--mode", help=argparse.SUPPRESS)
    o = a.parse_args()
    if o.row:
        return torch_row(o)
    o.models = [m for m in o.models.split(",") if m]
    o.modes = [m for m in o.modes.split(",") if m]
    bad = [m for m in o.models if m not in MODELS] + [m for m in o.modes if m not in ("eager", "compile")]
    if bad:
        sys.exit(f"gpu_vs_torch.py: unknown model or mode: {', '.join(bad)} (models: {', '.join(MODELS)}; modes: eager, compile)")
    card, lines = run_rows(o)
    head = [f"bench (bench/gpu_vs_torch.py{' --cpu-smoke' if o.cpu_smoke else ''}): bf16, {o.warmup} warm-up + "
            f"{o.steps} timed steps per row"]
    if card and card != "cpu":
        peak, name = peak_tflops(card)
        head.append(f"card: {card}; MFU against " + (f"{name}'s dense bf16 peak, {peak:.0f} TFLOP/s" if peak else name))
    for name in o.models:
        c = (SMOKE if o.cpu_smoke else MODELS)[name]
        head.append(f"{name}: {matmul_weights(c) / 1e6:.2f}M matmul weights, {flops_per_token(c) / 1e6:.3f} MFLOP/token, "
                    f"batch {c['batch']} x seq {c['seq']}")
    text = "\n".join(head + lines)
    print(text)
    if o.summary:
        with open(o.summary, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
