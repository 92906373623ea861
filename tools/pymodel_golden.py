#!/usr/bin/env python3
"""The PyTorch references of examples/gptj.py and examples/vit_tiny.py (models written only in Python
with shardwise.nn): the same model in eager float32 PyTorch, from the same initial weights and
batches, trained 20 steps with the same AdamW, clipping and learning-rate schedule; the losses go to
a small golden file that python/tests/test_models.py and test_fed_batches.py replay (within 1e-4
relative). Not part of `make test`.

Two steps, two interpreters (shardwise's package has no PyTorch; PyTorch's venv has no shardwise):

    PYTHONPATH=<shardwise package> python3 tools/pymodel_golden.py export /tmp/gptj_inputs.npz
    /work/hfvenv/bin/python tools/pymodel_golden.py torch /tmp/gptj_inputs.npz tests/golden/gptj_losses.json

and for the ViT (classification head; `reward`: the mean-squared-error head) `export-vit HEAD NPZ`
and `torch-vit NPZ tests/golden/vit_<HEAD>_losses.json`; for examples/sentence_embedding.py
(`contrastive`: InfoNCE over in-batch negatives; `reward`: its pooled MSE head) `export-embed HEAD
NPZ` and `torch-embed NPZ tests/golden/embed_<HEAD>_losses.json`.

`export` writes the initial parameters by name (as the run draws them), the batches of every step
(as its loader reads them, or the example's synthetic batches) and the configuration; `torch`
trains on them.
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
# The ViT's run: batches of its own (no loader), and its size.
VIT_OPTIONS = {"mesh": "dp=1", "steps": 20, "global_batch": 8, "lr": 3e-3, "min_lr": 3e-4, "warmup": 5,
               "weight_decay": 0.1, "clip": 1.0, "seed": 20261122}
VIT_MODEL = {"patches": 4, "patch_dim": 12, "hidden": 16, "heads": 2, "layers": 2, "classes": 4}
# The sentence embedder's run (batches of its own) and size: a Qwen2-style decoder with GQA.
EMBED_OPTIONS = dict(VIT_OPTIONS, lr=1e-3, min_lr=1e-4)
EMBED_MODEL = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "vocab": 64}
EMBED_SEQ = 8


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_gptj():
    return load_example("gptj")


def initial_values(model, seed):
    """The model's initial parameters by name ("param.<name>"), as the run draws them."""
    from shardwise import _core

    model.name_parameters()
    return {f"param.{name}": _core._initial_value(name, p.shape, p.std, p.value, seed)
            for name, p in model.named_parameters()}


def export(out_path):
    import shardwise as sw
    from shardwise import _core

    model = load_gptj().GPTJ(vocab=OPTIONS["vocab"], **MODEL)
    config = sw.TrainConfig(**OPTIONS)
    arrays = initial_values(model, OPTIONS["seed"])
    for step, (ids, labels) in enumerate(_core._batches(config.args, OPTIONS["steps"])):
        arrays[f"batch.{step}.ids"], arrays[f"batch.{step}.labels"] = ids, labels
    resolved = config.to_dict()
    cfg = dict(MODEL, **OPTIONS, beta1=resolved["beta1"], beta2=resolved["beta2"], epsilon=1e-8,
               total_steps=OPTIONS["steps"])
    np.savez(out_path, config=np.array(json.dumps(cfg)), **arrays)
    print(f"wrote {len(arrays)} arrays to {out_path}")


def torch_inputs(in_path):
    """The exported configuration, batches and parameters (torch tensors by name) of `export`."""
    import torch

    data = np.load(in_path)
    torch.set_num_threads(1)
    p = {k[len("param."):]: torch.tensor(data[k], requires_grad=True) for k in data.files if k.startswith("param.")}
    return json.loads(str(data["config"])), data, p


def train_and_write(cfg, p, data, forward, model, out_path):
    """Trains with the GPT golden's optimizer, schedule and clipping; writes the losses."""
    import torch

    sys.path.insert(0, str(REPO / "tests" / "golden"))
    from gpt_parity import train_steps

    losses = train_steps(cfg, p, data, forward)
    with open(out_path, "w") as f:
        json.dump({"generator": "tools/pymodel_golden.py with torch " + torch.__version__, "model": model,
                   "config": cfg, "losses": losses}, f, indent=1)
        f.write("\n")


def train_torch(in_path, out_path):
    import torch
    import torch.nn.functional as F

    cfg, data, p = torch_inputs(in_path)
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

    train_and_write(cfg, p, data, forward, "examples/gptj.py", out_path)


def export_vit(head, out_path):
    """The ViT's initial parameters, its synthetic batches ("batch.<k>.ids" the patches, ".labels"
    the labels) and configuration."""
    import shardwise as sw

    vit = load_example("vit_tiny")
    model = vit.ViT(**VIT_MODEL, head_loss=head)
    arrays = initial_values(model, VIT_OPTIONS["seed"])
    for step, batch in enumerate(vit.synthetic_batches(model, VIT_OPTIONS["global_batch"], VIT_OPTIONS["steps"])):
        arrays[f"batch.{step}.ids"], arrays[f"batch.{step}.labels"] = batch["patches"], batch["labels"]
    resolved = sw.TrainConfig(**VIT_OPTIONS).to_dict()
    cfg = dict(VIT_MODEL, **VIT_OPTIONS, head_loss=head, beta1=resolved["beta1"], beta2=resolved["beta2"],
               epsilon=1e-8, total_steps=VIT_OPTIONS["steps"])
    np.savez(out_path, config=np.array(json.dumps(cfg)), **arrays)
    print(f"wrote {len(arrays)} arrays to {out_path}")


def train_torch_vit(in_path, out_path):
    import torch
    import torch.nn.functional as F

    cfg, data, p = torch_inputs(in_path)
    H, NH, P = cfg["hidden"], cfg["heads"], cfg["patches"]
    HD = H // NH

    def ln(x, name):
        return F.layer_norm(x, (H,), p[name + ".weight"], p[name + ".bias"], 1e-5)

    def linear(x, name):
        return x @ p[name + ".weight"] + p[name + ".bias"]

    def block(x, pre):
        """Pre-LayerNorm encoder block: bidirectional attention (no mask), then the GELU MLP."""
        B = x.shape[0]
        h = ln(x, pre + ".ln_1")
        q, k, v = (linear(h, f"{pre}.attn.{n}").reshape(B, P, NH, HD).transpose(1, 2) for n in "qkv")
        ctx = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HD), dim=-1) @ v
        x = x + linear(ctx.transpose(1, 2).reshape(B, P, H), pre + ".attn.proj")
        fc = F.gelu(linear(ln(x, pre + ".ln_2"), pre + ".mlp.c_fc"), approximate="tanh")
        return x + linear(fc, pre + ".mlp.c_proj")

    def forward(patches, labels):
        x = linear(patches, "patch_embed") + p["pos_embed"]
        for layer in range(cfg["layers"]):
            x = block(x, f"encoder.{layer}")
        out = linear(ln(x, "ln_f").mean(dim=1), "classifier")
        if cfg["head_loss"] == "classes":
            return F.cross_entropy(out, labels)
        return ((out.reshape(-1) - labels) ** 2).mean()

    train_and_write(cfg, p, data, forward, "examples/vit_tiny.py", out_path)


def export_embed(head, out_path):
    """The sentence embedder's initial parameters, its synthetic batches ("batch.<k>.ids" the query
    and passage stacked [B, 2, S], or the query alone for the reward head; ".labels") and configuration."""
    import shardwise as sw

    se = load_example("sentence_embedding")
    model = se.SentenceEmbedder(**EMBED_MODEL, head_loss=head)
    arrays = initial_values(model, EMBED_OPTIONS["seed"])
    batches = se.synthetic_batches(model, EMBED_OPTIONS["global_batch"], EMBED_SEQ, EMBED_OPTIONS["steps"])
    for step, batch in enumerate(batches):
        ids = batch["query"] if head == "reward" else np.stack([batch["query"], batch["passage"]], axis=1)
        arrays[f"batch.{step}.ids"], arrays[f"batch.{step}.labels"] = ids, batch["labels"]
    resolved = sw.TrainConfig(**EMBED_OPTIONS).to_dict()
    cfg = dict(EMBED_MODEL, **EMBED_OPTIONS, seq=EMBED_SEQ, head_loss=head, temperature=model.temperature,
               beta1=resolved["beta1"], beta2=resolved["beta2"], epsilon=1e-8, total_steps=EMBED_OPTIONS["steps"])
    np.savez(out_path, config=np.array(json.dumps(cfg)), **arrays)
    print(f"wrote {len(arrays)} arrays to {out_path}")


def train_torch_embed(in_path, out_path):
    import torch
    import torch.nn.functional as F

    cfg, data, p = torch_inputs(in_path)
    H, NH, KV, S = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["seq"]
    HD = H // NH
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
    angles = torch.arange(S, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rms(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * p[name + ".weight"]

    def linear(x, name):
        y = x @ p[name + ".weight"].T  # Hugging Face's [out, in]
        return y + p[name + ".bias"] if name + ".bias" in p else y

    def heads(x, n):
        return x.reshape(x.shape[0], S, n, HD).transpose(1, 2)

    def rotary(x):
        x1, x2 = x[..., : HD // 2], x[..., HD // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def layer(x, pre):
        """Qwen2's decoder layer: GQA with q/k/v biases and rotary positions (causal), SwiGLU MLP."""
        h = rms(x, pre + ".input_layernorm")
        a = pre + ".self_attn."
        q, k, v = heads(linear(h, a + "q_proj"), NH), heads(linear(h, a + "k_proj"), KV), heads(linear(h, a + "v_proj"), KV)
        k, v = k.repeat_interleave(NH // KV, dim=1), v.repeat_interleave(NH // KV, dim=1)
        ctx = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True, scale=1.0 / math.sqrt(HD))
        x = x + linear(ctx.transpose(1, 2).reshape(x.shape[0], S, H), a + "o_proj")
        h = rms(x, pre + ".post_attention_layernorm")
        m = pre + ".mlp."
        return x + linear(F.silu(linear(h, m + "gate_proj")) * linear(h, m + "up_proj"), m + "down_proj")

    def forward(ids, labels):
        x = p["model.embed_tokens.weight"][ids.reshape(-1, S)]
        for i in range(cfg["layers"]):
            x = layer(x, f"model.layers.{i}")
        pooled = rms(x, "model.norm")[:, -1]  # the last token's final state
        if cfg["head_loss"] == "reward":
            return ((linear(pooled, "score").reshape(-1) - labels) ** 2).mean()
        e = pooled * torch.rsqrt(pooled.pow(2).sum(-1, keepdim=True) + 1e-12)
        q, passages = e.reshape(-1, 2, H).unbind(1)
        return F.cross_entropy(q @ passages.T / cfg["temperature"], labels)

    train_and_write(cfg, p, data, forward, "examples/sentence_embedding.py", out_path)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "export":
        export(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "torch":
        train_torch(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "export-vit" and sys.argv[2] in ("classes", "reward"):
        export_vit(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "torch-vit":
        train_torch_vit(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "export-embed" and sys.argv[2] in ("contrastive", "reward"):
        export_embed(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "torch-embed":
        train_torch_embed(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
