#!/usr/bin/env python3
"""Parity with transformers and PEFT (not part of `make test`; run `make hf-parity`).

Checks, each against the Python libraries' own results:
  init-from   a transformers GPT-2 (random init, save_pretrained: one file, then sharded with an
              index) -> `shardwise train --init-from` on tp=2 -> the first-step loss equals
              transformers' loss on the same batch within 1e-5.
  load        shardwise trains on dp=2 x tp=2 and saves -> AutoModelForCausalLM.from_pretrained with
              no missing, unexpected or mismatched keys and no warnings -> its loss on a batch equals
              shardwise's (the first step's loss of `train --init-from`) within 1e-5, and its greedy generate equals
              `shardwise generate` (when the binary has the command).
  llama       the same two checks for `--model llama`: a transformers LlamaForCausalLM (grouped-query
              attention, untied head) -> `--init-from` -> transformers' first loss within 1e-5; a shardwise
              Llama checkpoint -> LlamaForCausalLM with no missing/unexpected keys, no warnings, same loss.
With --golden DIR it also writes the small files tests/golden/hf/ holds, which `make test` replays
without PyPI (tests/train/test_hf_golden.cc).
Needs: pip install torch transformers peft safetensors numpy (the Makefile target makes a venv).
"""
import argparse
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

TOL = 1e-5


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def write_u16(path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def hf_loss(model, tokens):
    """Mean next-token cross-entropy of one sequence: inputs tokens[:-1], labels tokens[1:]."""
    x = torch.tensor([tokens[:-1]])
    y = torch.tensor([tokens[1:]])
    with torch.no_grad():
        logits = model(x, attention_mask=torch.ones_like(x)).logits.double()
    return torch.nn.functional.cross_entropy(logits[0], y[0]).item(), logits[0]


def first_loss(shardwise, tmp, label, model_dir, data, mesh, extra=()):
    """Loss of step 1 (before any update) of `shardwise train --init-from`; every sample of a file of
    exactly seq + 1 tokens is the whole file, so the batch is that sequence."""
    run_dir = os.path.join(tmp, "run-" + label)
    run([shardwise, "train", "--init-from", model_dir, "--data", data, "--mesh", mesh, "--steps", "1",
         "--global-batch", "4", "--run-dir", run_dir, "--progress", "none", "--eval-every", "0", *extra])
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return json.loads(f.readline())["loss"]


def tiny_gpt2(seed, vocab=300, seq=16):
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=seq, vocab_size=vocab, bos_token_id=vocab - 1,
                     eos_token_id=vocab - 1, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    return GPT2LMHeadModel(cfg).eval()


def check_init_from(shardwise, tmp, golden):
    model = tiny_gpt2(7)
    rng = np.random.default_rng(3)
    tokens = [int(t) for t in rng.integers(0, 300, size=17)]
    data = os.path.join(tmp, "tokens.bin")
    write_u16(data, tokens)
    want, logits = hf_loss(model, tokens)
    for label, shard in [("single", None), ("sharded", "40KB")]:
        d = os.path.join(tmp, "hf-" + label)
        if shard:
            model.save_pretrained(d, max_shard_size=shard)
            assert os.path.exists(os.path.join(d, "model.safetensors.index.json")), os.listdir(d)
        else:
            model.save_pretrained(d)
        for mesh in ["tp=2", "dp=2,tp=2"]:
            got = first_loss(shardwise, tmp, f"{label}-{mesh}", d, data, mesh)
            assert abs(got - want) <= TOL * max(1, abs(want)), (label, mesh, got, want)
            print(f"  init-from {label:8s} {mesh:10s} first loss {got:.7f} = transformers {want:.7f}")
    if golden:
        out = os.path.join(golden, "gpt2_tiny")
        shutil.rmtree(out, ignore_errors=True)
        model.save_pretrained(out)
        write_u16(os.path.join(golden, "tokens.bin"), tokens)
        greedy = model.generate(torch.tensor([tokens[:5]]), max_new_tokens=8, do_sample=False,
                                pad_token_id=299)[0].tolist()
        json.dump({"generator": f"tools/hf_parity.py with torch {torch.__version__}, transformers "
                                f"{transformers.__version__}",
                   "tokens": tokens, "loss": want, "last_logits": logits[-1].tolist(),
                   "argmax": logits.argmax(-1).tolist(), "greedy_prompt": tokens[:5], "greedy": greedy},
                  open(os.path.join(golden, "gpt2_tiny_expected.json"), "w"), indent=1)


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


def check_load(shardwise, tmp):
    root = os.path.join(tmp, "sw")
    run([shardwise, "train", "--mesh", "dp=2,tp=2", "--steps", "30", "--layers", "2", "--hidden", "32", "--heads",
         "4", "--digits", "2", "--global-batch", "8", "--save-every", "30", "--run-dir", root, "--progress", "none"])
    ckpt = os.path.join(root, "checkpoints", "checkpoint-30")
    handler = Collect()
    logging.getLogger("transformers").addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, info = AutoModelForCausalLM.from_pretrained(ckpt, output_loading_info=True)
    model.eval()
    problems = {k: v for k, v in info.items() if v}
    assert not problems, problems
    assert not handler.records, handler.records
    assert not caught, [str(w.message) for w in caught]
    assert type(model).__name__ == "GPT2LMHeadModel"
    print(f"  load      AutoModelForCausalLM: {type(model).__name__}, no missing/unexpected keys, no warnings")
    seq = model.config.n_positions
    tokens = [ord(c) for c in "12+34=46\n41+"][: seq + 1]
    while len(tokens) < seq + 1:
        tokens.append(10)
    data = os.path.join(tmp, "sw_tokens.txt")
    with open(data, "wb") as f:
        f.write(bytes(tokens))
    want, _ = hf_loss(model, tokens)
    got = first_loss(shardwise, tmp, "sw-back", ckpt, data, "dp=2,tp=2", ["--data-format", "bytes"])
    assert abs(got - want) <= TOL * max(1, abs(want)), (got, want)
    print(f"  load      loss on a batch: shardwise {got:.7f} = transformers {want:.7f}")
    help_text = subprocess.run([shardwise, "--help"], capture_output=True, text=True).stdout
    if "generate" in help_text:
        prompt = "12+34="
        out = model.generate(torch.tensor([[ord(c) for c in prompt]]), max_new_tokens=3, do_sample=False,
                             pad_token_id=10)[0].tolist()
        want_text = bytes(out).decode("latin-1")
        got_text = run([shardwise, "generate", "--checkpoint", ckpt, "--prompt", prompt, "--max-new-tokens", "3",
                        "--mesh", "tp=2", "--eos-id", "-1"])
        print(f"  generate  transformers {want_text!r}; shardwise printed {got_text.strip()!r}")
        assert want_text in got_text, (want_text, got_text)


def tiny_llama(seed, vocab=128, seq=16):
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=seq, rms_norm_eps=1e-6,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                      bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    return LlamaForCausalLM(cfg).eval()


def check_llama_init_from(shardwise, tmp, golden):
    model = tiny_llama(11)
    rng = np.random.default_rng(5)
    tokens = [int(t) for t in rng.integers(0, 128, size=17)]
    data = os.path.join(tmp, "llama_tokens.bin")
    write_u16(data, tokens)
    want, logits = hf_loss(model, tokens)
    d = os.path.join(tmp, "hf-llama")
    model.save_pretrained(d)
    for mesh in ["tp=2", "dp=2,tp=2", "tp=2,pp=2"]:
        got = first_loss(shardwise, tmp, f"llama-{mesh}", d, data, mesh)
        assert abs(got - want) <= TOL * max(1, abs(want)), (mesh, got, want)
        print(f"  llama init-from {mesh:10s} first loss {got:.7f} = transformers {want:.7f}")
    if golden:
        out = os.path.join(golden, "llama_tiny")
        shutil.rmtree(out, ignore_errors=True)
        model.save_pretrained(out)
        write_u16(os.path.join(golden, "llama_tokens.bin"), tokens)
        json.dump({"generator": f"tools/hf_parity.py with torch {torch.__version__}, transformers "
                                f"{transformers.__version__}",
                   "tokens": tokens, "loss": want, "last_logits": logits[-1].tolist(),
                   "argmax": logits.argmax(-1).tolist()},
                  open(os.path.join(golden, "llama_tiny_expected.json"), "w"), indent=1)


def check_llama_load(shardwise, tmp):
    root = os.path.join(tmp, "sw-llama")
    run([shardwise, "train", "--model", "llama", "--mesh", "dp=2,tp=2", "--steps", "30", "--layers", "2", "--hidden",
         "32", "--heads", "4", "--kv-heads", "2", "--intermediate-size", "64", "--untied-head", "--digits", "2",
         "--global-batch", "8", "--save-every", "30", "--run-dir", root, "--progress", "none"])
    ckpt = os.path.join(root, "checkpoints", "checkpoint-30")
    handler = Collect()
    logging.getLogger("transformers").addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, info = AutoModelForCausalLM.from_pretrained(ckpt, output_loading_info=True)
    logging.getLogger("transformers").removeHandler(handler)
    model.eval()
    problems = {k: v for k, v in info.items() if v}
    assert not problems, problems
    assert not handler.records, handler.records
    assert not caught, [str(w.message) for w in caught]
    assert type(model).__name__ == "LlamaForCausalLM", type(model).__name__
    assert model.config.num_key_value_heads == 2 and not model.config.tie_word_embeddings, model.config
    print(f"  llama load AutoModelForCausalLM: {type(model).__name__}, no missing/unexpected keys, no warnings")
    seq = model.config.max_position_embeddings
    tokens = [ord(c) for c in "12+34=46\n41+"][: seq + 1]
    while len(tokens) < seq + 1:
        tokens.append(10)
    data = os.path.join(tmp, "sw_llama_tokens.txt")
    with open(data, "wb") as f:
        f.write(bytes(tokens))
    want, _ = hf_loss(model, tokens)
    got = first_loss(shardwise, tmp, "sw-llama-back", ckpt, data, "dp=2,tp=2", ["--data-format", "bytes"])
    assert abs(got - want) <= TOL * max(1, abs(want)), (got, want)
    print(f"  llama load loss on a batch: shardwise {got:.7f} = transformers {want:.7f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shardwise")
    ap.add_argument("--golden", help="write the golden files of tests/golden/hf into this directory")
    ap.add_argument("--only", choices=["gpt2", "llama"], help="run (and with --golden, write) one model's checks")
    a = ap.parse_args()
    transformers.logging.set_verbosity_warning()
    if a.golden:
        os.makedirs(a.golden, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"transformers {transformers.__version__}, torch {torch.__version__}")
        if a.only != "llama":
            check_init_from(a.shardwise, tmp, a.golden)
            check_load(a.shardwise, tmp)
        if a.only != "gpt2":
            check_llama_init_from(a.shardwise, tmp, a.golden)
            check_llama_load(a.shardwise, tmp)
    print("hf parity ok")


if __name__ == "__main__":
    main()
