#!/usr/bin/env python3
"""The reference for shardwise's Llama: transformers' LlamaForCausalLM with shardwise's initial
weights, trained on the same batches with the same AdamW, warm-up + cosine schedule and clipping
for 20 steps; the losses go to a JSON golden file that tests/models/test_llama_golden.cc replays.

    python tests/golden/llama_parity.py INPUTS.safetensors tests/golden/llama_losses.json

With "experts" in the configuration (`golden_export OUT moe`, `make moe-golden`: moe_losses.json)
the model is transformers' MixtralForCausalLM instead: its MixtralSparseMoeBlock (router softmax in
float32, top-k, renormalised, SwiGLU experts) is every layer's MLP, and the loss adds aux_loss x
transformers' load-balancing loss and router_z_loss x its router z-loss of every layer
(router_losses). This script only renames shardwise's parameters into transformers' layout and
drives the training; no part of the model is written here.
transformers' router runs in float32 where shardwise's runs in double: a token whose k-th and
(k+1)-th probabilities nearly tie could go to other experts in the two (on this run none does: the
replay agrees within 2e-7 relative, against a bound of 1e-4).

INPUTS.safetensors comes from shardwise (`build/tests/golden_export OUT llama`, run by
`make llama-golden`): the initial parameters under transformers' names, batch.<k>.ids /
batch.<k>.labels (int64) for every step, and the configuration in the __metadata__. Needs PyPI's
torch and transformers (the venv of `make hf-parity`); not part of `make test`.
"""
import json
import struct
import sys

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func

from gpt_parity import train_steps  # the GPT golden's optimizer, schedule and clipping

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


def hf_state(t, moe):
    """shardwise's exported parameters under the names of the transformers model: for Mixtral each
    layer's block_sparse_moe.experts.w1 / w3 / w2 [E, I, H] / [E, H, I] become mlp.experts.gate_up_proj
    (w1 then w3 along I: the halves MixtralExperts chunks into gate and up) and mlp.experts.down_proj,
    and block_sparse_moe.gate.weight mlp.gate.weight (transformers >= 5's fused layout)."""
    state = {k: torch.tensor(v) for k, v in t.items() if not k.startswith("batch.")}
    if not moe:
        return state
    out = {}
    for k, v in state.items():
        if ".block_sparse_moe.experts.w3" in k:
            continue
        if ".block_sparse_moe.experts.w1" in k:
            k, v = k.replace("block_sparse_moe.experts.w1", "mlp.experts.gate_up_proj"), torch.cat([v, state[k.replace("w1", "w3")]], 1)
        k = k.replace("block_sparse_moe.experts.w2", "mlp.experts.down_proj").replace("block_sparse_moe.gate", "mlp.gate")
        out[k] = v
    return out


def make_model(cfg):
    """LlamaForCausalLM, or with "experts" MixtralForCausalLM (the same decoder with transformers'
    MixtralSparseMoeBlock as every layer's MLP), eager attention and experts."""
    common = dict(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
        max_position_embeddings=cfg["seq"], rms_norm_eps=cfg["rms_norm_eps"],
        rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        tie_word_embeddings=cfg["tie_word_embeddings"], attention_dropout=0.0, attn_implementation="eager")
    if cfg.get("experts", 0) == 0:
        return LlamaForCausalLM(LlamaConfig(**common))
    assert cfg["capacity_factor"] == 0, "transformers' Mixtral is dropless"
    assert not cfg["moe_layers"] or cfg["moe_layers"] == list(range(cfg["layers"])), "Mixtral has MoE in every layer"
    return MixtralForCausalLM(MixtralConfig(
        **common, num_local_experts=cfg["experts"], num_experts_per_tok=cfg["top_k"], router_jitter_noise=0.0,
        router_aux_loss_coef=cfg["aux_loss"], sliding_window=None, experts_implementation="eager"))


def router_losses(cfg, out, B, S):
    """aux_loss x the load-balancing loss + router_z_loss x the z-loss, summed over the layers (shardwise's
    default --aux-loss-scope layer), both transformers' functions on transformers' router logits:
    Mixtral's load_balancing_loss_func on each layer's logits alone, Switch Transformers'
    router_z_loss_func (mean logsumexp^2, ST-MoE; Mixtral has none)."""
    E, k = cfg["experts"], cfg["top_k"]
    total = 0.0
    for r in out.router_logits:
        total = total + cfg["aux_loss"] * load_balancing_loss_func((r,), E, k)
        total = total + cfg["router_z_loss"] * router_z_loss_func(r.reshape(B, S, E))
    return total


def main():
    inputs, out_path = sys.argv[1], sys.argv[2]
    t, meta = read_safetensors(inputs)
    cfg = json.loads(meta["config"])
    assert cfg["model"] == "llama", cfg
    torch.manual_seed(0)
    torch.set_num_threads(1)
    moe = cfg.get("experts", 0) > 0
    model = make_model(cfg)
    state = hf_state(t, moe)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    model.train()
    p = dict(model.named_parameters())
    assert set(p) == set(state), sorted(set(p) ^ set(state))

    V = cfg["vocab"]

    def forward(ids, labels):
        B, S = ids.shape
        out = model(input_ids=ids, output_router_logits=True) if moe else model(input_ids=ids)
        loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), labels.reshape(-1), reduction="sum") / (B * S)
        if moe:
            loss = loss + router_losses(cfg, out, B, S)
        return loss

    losses = train_steps(cfg, p, t, forward)
    with open(out_path, "w") as f:
        json.dump({"generator": f"tests/golden/llama_parity.py with torch {torch.__version__}, transformers "
                                f"{transformers.__version__} ({type(model).__name__})",
                   "config": cfg, "losses": losses}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
