#!/usr/bin/env python3
"""FP8 (F8_E4M3 with per-block weight_scale_inv) golden files, made by torch and transformers.

Not part of `make test` (it needs torch); run it with the peers' venv:
    /work/hfvenv/bin/python tools/fp8_golden.py tests/golden/fp8 [--shardwise build/bin/shardwise]
and commit what it writes; tests/ckpt/test_fp8.cc and tests/models/test_fp8_init_from.cc replay it.

Writes into OUT:
  e4m3.safetensors        codes (F8_E4M3 [256], every byte) and values (F32 [256]: torch's float8_e4m3fn
                          decoding of each); encode_in (F32, ties, subnormals, out-of-range values) and
                          encode_out (F8_E4M3: torch's clamp(x, -448, 448).to(float8_e4m3fn)).
  llama_fp8_tiny/         tests/golden/hf/llama_tiny with its seven linear weights per layer quantised as
                          the DeepSeek-V3 / Qwen FP8 releases store them: F8_E4M3 plus an F32
                          "<module>.weight_scale_inv" per block of BLOCK (ragged at the edges: 16 and 32 are no
                          multiples of 12), config.json's quantization_config naming the block size.
                          Quantisation is transformers' Fp8Quantize formula: per block amax,
                          scale = 448 / amax, q = clamp(w * scale).to(float8_e4m3fn), scale_inv = 1 / scale.
  llama_fp8_tiny_dequant.safetensors
                          every tensor of the model as f32: the quantised ones dequantised by transformers'
                          own _dequantize_fp8_weight (an independent implementation of
                          w = q * scale_inv[i / b0, j / b1]), the others as stored.
With --shardwise BIN it also converts tests/golden/hf/llama_tiny with `ckpt convert --dtype f8-e4m3` and
checks that torch reads the file as FP8 with scales, holding torch's quantisation byte for byte, that
transformers' dequantisation of it is within the E4M3 bound (2^-4 of each block's amax) of the
original weights, and that AutoModelForCausalLM loads it (FineGrainedFP8Config(dequantize=True), on a
CPU) to those values.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, FineGrainedFP8Config
from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..", "tests", "golden", "hf", "llama_tiny")
BLOCK = [8, 12]
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
F8 = torch.float8_e4m3fn


def quantize(w, block):
    rows, cols = w.shape
    br, bc = (rows + block[0] - 1) // block[0], (cols + block[1] - 1) // block[1]
    q = torch.empty(rows, cols, dtype=F8)
    inv = torch.empty(br, bc, dtype=torch.float32)
    for i in range(br):
        for j in range(bc):
            tile = w[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]].to(torch.float32)
            amax = tile.abs().max()
            scale = torch.tensor(448.0, dtype=torch.float32) / amax if amax > 0 else torch.tensor(1.0)
            q[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]] = \
                torch.clamp(tile * scale, -448.0, 448.0).to(F8)
            inv[i, j] = (torch.tensor(1.0, dtype=torch.float32) / scale)
    return q, inv


def is_linear(key):
    parts = key.split(".")
    return key.endswith(".weight") and len(parts) >= 2 and parts[-2] in LINEAR


def write_codes(out):
    codes = torch.arange(256, dtype=torch.uint8).view(F8)
    enc_in = torch.tensor([0.0, -0.0, 1.0, 1.0625, 1.1875, 1.0 + 1 / 32, 1.0 + 3 / 32, 448.0, 464.0, 480.0, 1e6,
                           -1e6, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -11, 1.5 * 2.0 ** -10, 2.0 ** -7,
                           0.875 * 2.0 ** -6, 0.9375 * 2.0 ** -6, -0.3, 0.1, 3.14159, -17.3, 2.0 ** -12,
                           240.0, 248.0, 256.0, 272.0, 288.0, 416.0, 432.0],
                          dtype=torch.float32)
    save_file({"codes": codes, "values": codes.to(torch.float32), "encode_in": enc_in,
               "encode_out": torch.clamp(enc_in, -448.0, 448.0).to(F8)}, os.path.join(out, "e4m3.safetensors"))


def write_model(out):
    src = load_file(os.path.join(SOURCE, "model.safetensors"))
    model_dir = os.path.join(out, "llama_fp8_tiny")
    shutil.rmtree(model_dir, ignore_errors=True)
    os.makedirs(model_dir)
    stored, dequant = {}, {}
    for key, w in sorted(src.items()):
        if is_linear(key):
            q, inv = quantize(w, BLOCK)
            stored[key], stored[key + "_scale_inv"] = q, inv
            dequant[key] = _dequantize_fp8_weight(q.clone(), inv, BLOCK, torch.float32)
        else:
            stored[key] = w
            dequant[key] = w.to(torch.float32)
    save_file(stored, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
    save_file(dequant, os.path.join(out, "llama_fp8_tiny_dequant.safetensors"))
    with open(os.path.join(SOURCE, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                     "weight_block_size": BLOCK}
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    shutil.copy(os.path.join(SOURCE, "generation_config.json"), model_dir)


def check_shardwise(shardwise):
    src = load_file(os.path.join(SOURCE, "model.safetensors"))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fp8")
        subprocess.run([shardwise, "ckpt", "convert", SOURCE, out, "--dtype", "f8-e4m3"], check=True)
        with open(os.path.join(out, "config.json")) as f:
            qc = json.load(f)["quantization_config"]
        block = qc["weight_block_size"]
        assert qc["quant_method"] == "fp8" and qc["fmt"] == "e4m3", qc
        ours = {}
        for name in os.listdir(out):
            if name.endswith(".safetensors"):
                ours.update(load_file(os.path.join(out, name)))
        checked = 0
        for key, w in src.items():
            if not is_linear(key):
                assert torch.equal(ours[key], w), key
                continue
            q, inv = ours[key], ours[key + "_scale_inv"]
            assert q.dtype == F8 and inv.dtype == torch.float32, (key, q.dtype, inv.dtype)
            mine_q, mine_inv = quantize(w, block)
            assert torch.equal(q.view(torch.uint8), mine_q.view(torch.uint8)), key
            assert torch.equal(inv, mine_inv), key
            back = _dequantize_fp8_weight(q.clone(), inv, block, torch.float32)
            amax = w.abs().max()
            assert (back - w).abs().max() <= amax * 2.0 ** -4, key
            checked += 1
        # transformers itself loads the file (dequantised on a CPU) to the same values.
        model = AutoModelForCausalLM.from_pretrained(out, quantization_config=FineGrainedFP8Config(dequantize=True))
        state = model.state_dict()
        for key, w in src.items():
            if is_linear(key):
                want = _dequantize_fp8_weight(ours[key].clone(), ours[key + "_scale_inv"], block, torch.float32)
                assert torch.equal(state[key].float(), want), key
        print(f"shardwise's f8-e4m3 file: {checked} FP8 weights, torch's quantisation byte for byte; "
              "transformers loads it to those values")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shardwise")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    write_codes(a.out)
    write_model(a.out)
    if a.shardwise:
        check_shardwise(a.shardwise)
    print(f"wrote {a.out} (torch {torch.__version__})")


if __name__ == "__main__":
    sys.exit(main())
