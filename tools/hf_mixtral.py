#!/usr/bin/env python3
"""Parity of shardwise's MoE Llama with transformers' Mixtral (not part of `make test`).

Checks, each against transformers' own results:
  init-from  a random-init MixtralForCausalLM (2 layers, hidden 32, 4 heads over 2 kv heads, 4
             experts, top-2, untied head; save_pretrained: per-expert keys
             model.layers.N.block_sparse_moe.experts.E.w1/w2/w3.weight) -> `shardwise train --init-from`
             on 1 rank, ep=2, ep=2 x tp=2, dp=2 x ep=2 -> the first-step loss equals transformers' loss
             on the same 16 tokens within 1e-5.
  load       shardwise trains a Mixtral-shaped MoE Llama on ep=2 x dp=2 and saves ->
             AutoModelForCausalLM.from_pretrained gives a MixtralForCausalLM with no missing,
             unexpected or mismatched keys and no warnings -> its loss on a batch equals shardwise's
             (`train --init-from` of that checkpoint, first step, on ep=2 and on one rank) within
             1e-5; greedy `shardwise generate` on dp=2 x tp=2 gives transformers' tokens and its
             logits (--logits-out) equal transformers' within 1e-5.
With --golden DIR it also writes tests/golden/hf/mixtral_tiny, mixtral_tokens.bin and
mixtral_tiny_expected.json, which `make test` replays without PyPI (tests/models/test_mixtral_ckpt.cc).
The aux loss is off in these comparisons (output_router_logits False in transformers, --aux-loss 0).
The golden also holds transformers' load-balancing losses of the same batch (`aux_loss_model`: its
load_balancing_loss_func over every layer's router logits pooled, as MixtralForCausalLM adds it;
`aux_loss_layers`: the same function on each layer alone) and the gradient norms of the loss with
each at coefficient 0.02, which tests/models/test_mixtral_ckpt.cc compares with `--aux-loss-scope
model` and `layer`.
Needs: torch, transformers >= 5 (Mixtral's router: softmax over all experts, top-k, renormalised).
Usage: tools/hf_mixtral.py build/bin/shardwise [--golden tests/golden/hf] (make hf-parity, make hf-golden)
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import MixtralConfig, MixtralForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity import (check_generate, check_init_from_meshes, check_loss_on_a_batch, hf_loss,  # noqa: E402
                       load_cleanly, run, write_decoder_golden, write_u16)


def tiny_mixtral(seed, vocab=128, seq=16):
    torch.manual_seed(seed)
    cfg = MixtralConfig(hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=seq, rms_norm_eps=1e-6,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                        num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.0,
                        bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    model = MixtralForCausalLM(cfg).eval()
    # transformers initialises the router near zero, where top-2 of 4 is decided by noise: spread it.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    return model


MESHES = ["dp=1", "ep=2", "ep=2,tp=2", "dp=2,ep=2"]


def check_init_from(shardwise, tmp, golden):
    model = tiny_mixtral(13)
    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(0, 128, size=17)]
    data = os.path.join(tmp, "mixtral_tokens.bin")
    write_u16(data, tokens)
    want, logits = hf_loss(model, tokens)
    check_init_from_meshes(shardwise, tmp, "mixtral", model, data, want, MESHES)
    if golden:
        write_decoder_golden(golden, "mixtral", model, tokens, want, logits, "tools/hf_mixtral.py")
        write_router_golden(golden, model, tokens)


def write_router_golden(golden, model, tokens, coef=0.02):
    """Adds transformers' load-balancing losses of `tokens[:-1]` to <golden>/mixtral_tiny_expected.json
    (`aux_loss_model`, `aux_loss_layers`) and the global L2 norm of the gradient of every parameter of
    cross-entropy + coef x each (`grad_norm_model`, `grad_norm_layer`, coef in `aux_coef`)."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    x = torch.tensor([tokens[:-1]])
    y = torch.tensor(tokens[1:])
    c = model.config
    expected_path = os.path.join(golden, "mixtral_tiny_expected.json")
    with open(expected_path) as f:
        expected = json.load(f)
    norms = {}
    for scope in ["model", "layer"]:
        model.zero_grad()
        out = model(x, attention_mask=torch.ones_like(x), output_router_logits=True)
        layers = [load_balancing_loss_func((r,), c.num_local_experts, c.num_experts_per_tok) for r in out.router_logits]
        aux = out.aux_loss if scope == "model" else sum(layers)
        loss = torch.nn.functional.cross_entropy(out.logits[0].float(), y) + coef * aux
        loss.backward()
        norms[scope] = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())))
        if scope == "model":
            expected["aux_loss_model"] = float(out.aux_loss.detach())
            expected["aux_loss_layers"] = [float(a.detach()) for a in layers]
    model.zero_grad()
    expected["aux_coef"] = coef
    expected["grad_norm_model"], expected["grad_norm_layer"] = norms["model"], norms["layer"]
    with open(expected_path, "w") as f:
        json.dump(expected, f, indent=1)


def check_load(shardwise, tmp):
    root = os.path.join(tmp, "sw-mixtral")
    run([shardwise, "train", "--model", "llama", "--mesh", "dp=2,ep=2", "--steps", "30", "--layers", "2", "--hidden",
         "32", "--heads", "4", "--kv-heads", "2", "--intermediate-size", "32", "--untied-head", "--experts", "4",
         "--top-k", "2", "--digits", "2", "--global-batch", "8", "--save-every", "30", "--run-dir", root,
         "--progress", "none"])
    ckpt = os.path.join(root, "checkpoints", "checkpoint-30")
    model = load_cleanly(ckpt, "MixtralForCausalLM", "mixtral load")
    c = model.config
    assert c.num_local_experts == 4 and c.num_experts_per_tok == 2 and c.num_key_value_heads == 2, c
    for mesh in ["ep=2", "dp=1"]:
        check_loss_on_a_batch(shardwise, tmp, model, ckpt, c.max_position_embeddings, "mixtral load", mesh)
    check_generate(shardwise, tmp, model, ckpt, "mixtral generate")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shardwise")
    ap.add_argument("--golden", help="write the golden files of tests/golden/hf into this directory")
    a = ap.parse_args()
    transformers.logging.set_verbosity_warning()
    if a.golden:
        os.makedirs(a.golden, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"transformers {transformers.__version__}, torch {torch.__version__}")
        check_init_from(a.shardwise, tmp, a.golden)
        check_load(a.shardwise, tmp)
    print("mixtral parity ok")


if __name__ == "__main__":
    main()
