#!/usr/bin/env python3
"""The reference for shardwise's `train --compute bf16`: gpt_parity.py's GPT-2 (the same initial
weights, batches, forward and optimizer) with its forward under torch.autocast(device_type="cpu",
dtype=torch.bfloat16), 20 steps, losses written to a JSON golden file (`make bf16-golden`).

    python tests/golden/bf16_autocast_parity.py INPUTS.safetensors tests/golden/gpt_bf16_losses.json

INPUTS.safetensors: `build/tests/golden_export OUT gpt2-bf16` (golden::bf16_parity_config). Under
CPU autocast every matmul reads bf16 operands and gives a bf16 product (f32 accumulation); adding
an f32 bias, mask or residual promotes back to f32, so LayerNorm, GELU and softmax see f32 inputs
and run in f32, and cross-entropy is on autocast's f32 list: what shardwise's --compute bf16
builds (its unfused attention and head). q k^T is scaled after the product here, before it in
shardwise; with a head dim of 16 the factor 1/4 is a power of two and both give the same bits.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_parity import gpt_forward, run  # noqa: E402


def check_config(cfg):
    assert cfg.get("compute") == "bf16", "the inputs are not golden::bf16_parity_config's"
    assert cfg["hidden"] // cfg["heads"] == 16, "the q scaling's order matters unless 1/sqrt(head dim) is 2^-k"


def autocast_forward(cfg, p):
    f32_forward = gpt_forward(cfg, p)

    def forward(ids, labels):
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            loss = f32_forward(ids, labels)
        assert loss.dtype == torch.float32, loss.dtype
        return loss

    return forward


if __name__ == "__main__":
    run(autocast_forward, "tests/golden/bf16_autocast_parity.py", check_config)
