#!/usr/bin/env python3
"""The reference for shardwise's GPT trainer: the same model, initial weights, batches and
optimizer in PyTorch (Debian's python3-torch 1.13), 20 steps, losses written to a JSON golden file.

    python3 tests/golden/gpt_parity.py INPUTS.safetensors tests/golden/gpt_losses.json

INPUTS.safetensors comes from shardwise (`build/tests/golden_export`, run by `make golden`): the
initial parameters under their names, batch.<k>.ids / batch.<k>.labels (int64) for every step,
and the configuration in the __metadata__ (strings). It is read here with numpy only.
"""
import json
import math
import struct
import sys

import numpy as np
import torch

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[base + begin : base + end], dtype=DTYPES[info["dtype"]])
        tensors[name] = arr.reshape(info["shape"]).copy()
    return tensors, meta


def adamw(cfg, params):
    """shardwise's AdamW: weight decay on matrices (rank >= 2) only."""
    params = list(params)
    decay = [v for v in params if v.ndim >= 2]
    no_decay = [v for v in params if v.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["epsilon"])


def lr_at(cfg, step):
    """shardwise's schedule (train/optimizer.cc LrSchedule::at): linear warm-up, cosine to min_lr."""
    peak, floor, warmup, total = cfg["lr"], cfg["min_lr"], cfg["warmup"], cfg["total_steps"]
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    if step >= total:
        return floor
    progress = (step - warmup) / max(1, total - warmup)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))


def train_steps(cfg, params, batches, forward):
    """cfg["steps"] steps of forward(ids, labels) on batches["batch.<k>.ids" / ".labels"] with adamw,
    clipping and lr_at, as shardwise's trainer takes them; the losses."""
    opt = adamw(cfg, params.values())
    losses = []
    for step in range(cfg["steps"]):
        ids = torch.tensor(batches[f"batch.{step}.ids"])
        labels = torch.tensor(batches[f"batch.{step}.labels"])
        opt.zero_grad()
        loss = forward(ids, labels)
        loss.backward()
        if cfg["clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), cfg["clip"])
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        opt.step()
        losses.append(loss.item())
        print(f"step {step + 1}: loss {loss.item():.6f}")
    return losses


def gpt_forward(cfg, p):
    """forward(ids, labels) -> the mean loss of shardwise's GPT-2 on the parameters p (by name)."""
    L, NH, H, S, V = cfg["layers"], cfg["heads"], cfg["hidden"], cfg["seq"], cfg["vocab"]
    HD = H // NH
    eps = cfg["layer_norm_epsilon"]

    def ln(x, name):
        return torch.nn.functional.layer_norm(x, (H,), p[name + ".weight"], p[name + ".bias"], eps)

    def linear(x, name):
        return x @ p[name + ".weight"] + p[name + ".bias"]

    mask = torch.triu(torch.full((S, S), -1e9), diagonal=1)

    def forward(ids, labels):
        B = ids.shape[0]
        x = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"]
        for l in range(L):
            pre = f"transformer.h.{l}"
            h = ln(x, pre + ".ln_1")
            def heads(y):
                return y.reshape(B, S, NH, HD).transpose(1, 2)
            q = heads(linear(h, pre + ".attn.q_proj"))
            k = heads(linear(h, pre + ".attn.k_proj"))
            v = heads(linear(h, pre + ".attn.v_proj"))
            scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(HD)) + mask
            ctx = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, S, H)
            x = x + linear(ctx, pre + ".attn.c_proj")
            m = torch.nn.functional.gelu(linear(ln(x, pre + ".ln_2"), pre + ".mlp.c_fc"), approximate="tanh")
            x = x + linear(m, pre + ".mlp.c_proj")
        logits = ln(x, "transformer.ln_f") @ p["transformer.wte.weight"].T
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="sum")
        return loss / (B * S)

    return forward


def run(forward_of, generator, check_config=lambda cfg: None):
    """argv: INPUTS.safetensors OUT.json. Trains forward_of(cfg, params) and writes the golden file."""
    inputs, out_path = sys.argv[1], sys.argv[2]
    t, meta = read_safetensors(inputs)
    cfg = json.loads(meta["config"])
    check_config(cfg)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    p = {k: torch.tensor(v, requires_grad=True) for k, v in t.items() if not k.startswith("batch.")}
    losses = train_steps(cfg, p, t, forward_of(cfg, p))
    with open(out_path, "w") as f:
        json.dump({"generator": generator + " with torch " + torch.__version__, "config": cfg, "losses": losses},
                  f, indent=1)
        f.write("\n")


def main():
    run(gpt_forward, "tests/golden/gpt_parity.py")


if __name__ == "__main__":
    main()
