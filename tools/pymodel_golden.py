#!/usr/bin/env python3
"""The PyTorch reference of examples/gptj.py (a model written only in Python with shardwise.nn): the
same GPT-J-style model in eager float32 PyTorch, from the same initial weights and batches, trained
20 steps with the same AdamW, clipping and learning-rate schedule; the losses go to a small golden
file that python/tests/test_models.py replays (within 1e-4 relative). Not part of `make test`.

Two steps, two interpreters (shardwise's package has no PyTorch; PyTorch's venv has no shardwise):

    PYTHONPATH=<shardwise package> python3 tools/pymodel_golden.py export /tmp/gptj_inputs.npz
    /work/hfvenv/bin/python tools/pymodel_golden.py torch /tmp/gptj_inputs.npz tests/golden/gptj_losses.json

`export` writes the initial parameters by name (as the run draws them), the batches of every step
(as its loader reads them) and the configuration; `torch` trains on them.
"""
import importlib.util
import json
import math
import pathlib
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
# The run both sides train: the options of shardwise.Trainer, and the model's size.
OPTIONS = {"mesh": "dp=1", "digits": 2, "seq": 12, "vocab": 128, "steps": 20, "global_batch": 8, "lr": 3e-3,
           "min_lr": 3e-4, "warmup": 5, "weight_decay": 0.1, "clip": 1.0, "seed": 20261122}
MODEL = {"layers": 2, "hidden": 32, "heads": 2}


def load_gptj():
    spec = importlib.util.spec_from_file_location("gptj", REPO / "examples" / "gptj.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def export(out_path):
    import shardwise as sw
    from shardwise import _core

    model = load_gptj().GPTJ(vocab=OPTIONS["vocab"], **MODEL)
    model.name_parameters()
    config = sw.TrainConfig(**OPTIONS)
    arrays = {}
    for name, p in model.named_parameters():
        arrays[f"param.{name}"] = _core._initial_value(name, p.shape, p.std, p.value, OPTIONS["seed"])
    for step, (ids, labels) in enumerate(_core._batches(config.args, OPTIONS["steps"])):
        arrays[f"batch.{step}.ids"], arrays[f"batch.{step}.labels"] = ids, labels
    resolved = config.to_dict()
    cfg = dict(MODEL, **OPTIONS, beta1=resolved["beta1"], beta2=resolved["beta2"], epsilon=1e-8,
               total_steps=OPTIONS["steps"])
    np.savez(out_path, config=np.array(json.dumps(cfg)), **arrays)
    print(f"wrote {len(arrays)} arrays to {out_path}")


def train_torch(in_path, out_path):
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(REPO / "tests" / "golden"))
    from gpt_parity import train_steps  # the GPT golden's optimizer, schedule and clipping

    data = np.load(in_path)
    cfg = json.loads(str(data["config"]))
    torch.set_num_threads(1)
    p = {k[len("param."):]: torch.tensor(data[k], requires_grad=True) for k in data.files if k.startswith("param.")}
    L, H, NH, S, V = cfg["layers"], cfg["hidden"], cfg["heads"], cfg["seq"], cfg["vocab"]
    HD = H // NH

    def ln(x, name):
        return F.layer_norm(x, (H,), p[name + ".weight"], p[name + ".bias"], 1e-5)

    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
    angles = torch.arange(S, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rotary(x):  # transformers' rotate_half form
        x1, x2 = x[..., : HD // 2], x[..., HD // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def parallel_block(x, pre):
        """x + attn(ln_1(x)) + mlp(ln_1(x)): GPT-J's block, q/k/v and out_proj without biases."""
        B = x.shape[0]
        h = ln(x, pre + ".ln_1")
        q, k, v = ((h @ p[f"{pre}.attn.{n}.weight"]).reshape(B, S, NH, HD).transpose(1, 2)
                   for n in ("q_proj", "k_proj", "v_proj"))
        q, k = rotary(q), rotary(k)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(HD))
        attn = ctx.transpose(1, 2).reshape(B, S, H) @ p[pre + ".attn.out_proj.weight"]
        fc = h @ p[pre + ".mlp.fc_in.weight"] + p[pre + ".mlp.fc_in.bias"]
        return x + attn + F.gelu(fc, approximate="tanh") @ p[pre + ".mlp.fc_out.weight"] + p[pre + ".mlp.fc_out.bias"]

    def forward(ids, labels):
        x = p["transformer.wte.weight"][ids]
        for layer in range(L):
            x = parallel_block(x, f"transformer.h.{layer}")
        logits = ln(x, "transformer.ln_f") @ p["lm_head.weight"].T
        return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="sum") / labels.numel()

    losses = train_steps(cfg, p, data, forward)
    with open(out_path, "w") as f:
        json.dump({"generator": "tools/pymodel_golden.py with torch " + torch.__version__, "model": "examples/gptj.py",
                   "config": cfg, "losses": losses}, f, indent=1)
        f.write("\n")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "export":
        export(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "torch":
        train_torch(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
