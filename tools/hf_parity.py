#!/usr/bin/env python3
"""Parity with transformers and PEFT (not part of `make test`; run `make hf-parity`).

Checks, each against the Python libraries' own results:
  init-from   a transformers GPT-2 (random init, save_pretrained: one file, then sharded with an
              index) -> `shardwise train --init-from` on tp=2 -> the first-step loss equals
              transformers' loss on the same batch within 1e-5.
  load        shardwise trains on dp=2 x tp=2 and saves -> AutoModelForCausalLM.from_pretrained with
              no missing, unexpected or mismatched keys and no warnings -> its loss on a batch equals
              shardwise's (the first step's loss of `train --init-from`) within 1e-5; its greedy
              generate equals `shardwise generate` on dp=2 x tp=2, whose logits (--logits-out) equal
              transformers' within 1e-5.
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
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

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
    # Greedy generation on tp=2 (with the logits each token came from) against transformers': the
    # same tokens, and transformers' logits over prompt + generated equal shardwise's within 1e-5.
    prompts = ["12+34=", "7+8=", "99+1="]
    logits_file = os.path.join(tmp, "logits.safetensors")
    cmd = [shardwise, "generate", "--checkpoint", ckpt, "--max-new-tokens", "4", "--mesh", "dp=2,tp=2",
           "--json", "--logits-out", logits_file]
    for p in prompts:
        cmd += ["--prompt", p]
    got = json.loads(run(cmd))["sequences"]
    from safetensors.numpy import load_file
    sw_logits = load_file(logits_file)
    worst = 0.0
    for i, p in enumerate(prompts):
        ids = [ord(c) for c in p]
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=4, do_sample=False, pad_token_id=10)[0].tolist()
        assert got[i]["new_ids"] == out[len(ids):], (p, got[i]["new_ids"], out[len(ids):])
        with torch.no_grad():
            x = torch.tensor([out[:-1]])
            ref = model(x, attention_mask=torch.ones_like(x)).logits[0, len(ids) - 1:].numpy()
        diff = float(np.abs(ref - sw_logits[f"logits.{i}"]).max())
        worst = max(worst, diff)
        assert diff <= TOL, (p, diff)
    print(f"  generate  greedy on dp=2 x tp=2 = transformers' generate for {len(prompts)} prompts; "
          f"logits max |diff| {worst:.2e}")


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
    print("hf parity ok")


if __name__ == "__main__":
    main()
