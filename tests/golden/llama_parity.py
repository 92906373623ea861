#!/usr/bin/env python3
"""The reference for shardwise's Llama: transformers' LlamaForCausalLM with shardwise's initial
weights, trained on the same batches with the same AdamW, warm-up + cosine schedule and clipping
for 20 steps; the losses go to a JSON golden file that tests/models/test_llama_golden.cc replays.

    python tests/golden/llama_parity.py INPUTS.safetensors tests/golden/llama_losses.json

With "experts" in the configuration (`golden_export OUT moe`, `make moe-golden`: moe_losses.json)
the MLP of every MoE layer is replaced by MoE below, a PyTorch reference of Mixtral's sparse MoE
block written from its definition (not shardwise's code), and the loss adds aux_loss x the
load-balancing loss and router_z_loss x the z-loss of every MoE layer.

INPUTS.safetensors comes from shardwise (`build/tests/golden_export OUT llama`, run by
`make llama-golden`): the initial parameters under transformers' names, batch.<k>.ids /
batch.<k>.labels (int64) for every step, and the configuration in the __metadata__. Needs PyPI's
torch and transformers (the venv of `make hf-parity`); not part of `make test`.
"""
import json
import math
import struct
import sys

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

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


class Experts(torch.nn.Module):
    def __init__(self, E, I, H):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.empty(E, I, H))
        self.w3 = torch.nn.Parameter(torch.empty(E, I, H))
        self.w2 = torch.nn.Parameter(torch.empty(E, H, I))


class MoE(torch.nn.Module):
    """Mixtral's block_sparse_moe: softmax over the E router logits, the top-k experts (ties: the
    lower index), their probabilities renormalised to sum 1, out = sum of weight x SwiGLU expert
    (w2(silu(w1 x) * w3 x)). The router runs in double (as shardwise's does, so both choose the same
    experts); aux = E * sum_i f_i P_i (f_i = assignments to i / N, P_i = mean p_i: transformers'
    load_balancing_loss_func), z = mean logsumexp^2 (ST-MoE). Dropless only."""

    def __init__(self, E, I, H, k):
        super().__init__()
        self.gate = torch.nn.Linear(H, E, bias=False)
        self.experts = Experts(E, I, H)
        self.k = k
        self.aux = self.z = None

    def forward(self, h):
        shape = h.shape
        x = h.reshape(-1, shape[-1])
        N, E = x.shape[0], self.gate.weight.shape[0]
        logits = x.double() @ self.gate.weight.double().t()
        p = torch.softmax(logits, dim=-1)
        order = torch.sort(-p.detach(), dim=-1, stable=True).indices[:, : self.k]  # stable: ties to the lower index
        chosen = torch.gather(p, 1, order)
        weight = chosen / chosen.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(E):
            token, slot = torch.nonzero(order == e, as_tuple=True)
            if token.numel() == 0:
                continue
            xe = x[token]
            y = (torch.nn.functional.silu(xe @ self.experts.w1[e].t()) * (xe @ self.experts.w3[e].t())) @ self.experts.w2[e].t()
            out = out.index_add(0, token, (weight[token, slot].unsqueeze(1) * y.double()).float())
        counts = torch.zeros(E, dtype=torch.float64).index_add(0, order.reshape(-1), torch.ones(order.numel(), dtype=torch.float64))
        self.aux = E * torch.sum(counts / N * p.mean(dim=0))
        self.z = torch.mean(torch.logsumexp(logits, dim=-1) ** 2)
        return out.reshape(shape)


def main():
    inputs, out_path = sys.argv[1], sys.argv[2]
    t, meta = read_safetensors(inputs)
    cfg = json.loads(meta["config"])
    assert cfg["model"] == "llama", cfg
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = LlamaConfig(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
        max_position_embeddings=cfg["seq"], rms_norm_eps=cfg["rms_norm_eps"],
        rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        tie_word_embeddings=cfg["tie_word_embeddings"], attention_dropout=0.0, attn_implementation="eager")
    model = LlamaForCausalLM(config)
    moe = []
    if cfg.get("experts", 0) > 0:
        assert cfg["capacity_factor"] == 0, "the reference is dropless"
        for l, layer in enumerate(model.model.layers):
            if cfg["moe_layers"] and l not in cfg["moe_layers"]:
                continue
            block = MoE(cfg["experts"], cfg["intermediate_size"], cfg["hidden"], cfg["top_k"])
            del layer._modules["mlp"]
            layer.block_sparse_moe = block
            object.__setattr__(layer, "mlp", block)  # the decoder layer calls self.mlp
            moe.append(block)
    state = {k: torch.tensor(v) for k, v in t.items() if not k.startswith("batch.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    model.train()
    p = dict(model.named_parameters())
    assert set(p) == set(state), sorted(set(p) ^ set(state))

    decay = [v for k, v in p.items() if v.ndim >= 2]
    no_decay = [v for k, v in p.items() if v.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["epsilon"])

    def lr_at(step):
        peak, floor, warmup, total = cfg["lr"], cfg["min_lr"], cfg["warmup"], cfg["total_steps"]
        if warmup > 0 and step < warmup:
            return peak * (step + 1) / warmup
        if step >= total:
            return floor
        progress = (step - warmup) / max(1, total - warmup)
        return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))

    V = cfg["vocab"]
    losses = []
    for step in range(cfg["steps"]):
        ids = torch.tensor(t[f"batch.{step}.ids"])
        labels = torch.tensor(t[f"batch.{step}.labels"])
        B, S = ids.shape
        opt.zero_grad()
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="sum") / (B * S)
        for block in moe:
            loss = loss + cfg["aux_loss"] * block.aux.float() + cfg["router_z_loss"] * block.z.float()
        loss.backward()
        if cfg["clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(p.values()), cfg["clip"])
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.step()
        losses.append(loss.item())
        print(f"step {step + 1}: loss {loss.item():.6f}")
    with open(out_path, "w") as f:
        json.dump({"generator": f"tests/golden/llama_parity.py with torch {torch.__version__}, transformers "
                                f"{transformers.__version__} (LlamaForCausalLM{', MoE MLPs' if moe else ''})",
                   "config": cfg, "losses": losses}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
