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
  lora-merge  a PEFT LoRA adapter (random non-zero B) on GPT-2 (Conv1D, fan_in_fan_out; alpha / r and
              rsLoRA) and on a plain nn.Linear model (weights [out, in] in a safetensors file) ->
              `shardwise ckpt lora-merge` equals PEFT's merge_and_unload within 1e-6; shardwise
              loads the GPT-2 adapter (`train --lora-from`) and gives PEFT's loss within 1e-5.
  lora-train  shardwise trains LoRA adapters on dp=2 x tp=2 and saves -> PeftModel.from_pretrained
              loads the checkpoint without warnings -> its loss equals shardwise's within 1e-5 (the
              first step's loss of `train --lora-from`), lora-merge of it gives PEFT's logits within
              1e-5, and its adapter_config.json equals PEFT's for the same LoraConfig.
  llama       the same checks for `--model llama`: a transformers LlamaForCausalLM (grouped-query
              attention, untied head) -> `--init-from` -> transformers' first loss within 1e-5; a shardwise
              Llama checkpoint -> LlamaForCausalLM with no missing/unexpected keys, no warnings, same loss;
              its greedy generate = `shardwise generate` on dp=2 x tp=2, logits within 1e-5.
--only gpt2|lora|llama (repeatable) runs those parts (gpt2: init-from and load; lora: lora-merge and
lora-train; llama); without it, all of them.
With --golden DIR it also writes the small files tests/golden/hf/ holds, which `make test` replays
without PyPI (tests/generate/test_hf_golden.cc, test_lora_golden.cc, test_llama_hf.cc,
test_generate_llama.cc).
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


def load_cleanly(ckpt, architecture, label):
    """AutoModelForCausalLM.from_pretrained(ckpt) with no missing, unexpected or mismatched keys and
    no warning (transformers' logger and Python's warnings both watched)."""
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
    assert type(model).__name__ == architecture, type(model).__name__
    print(f"  {label} AutoModelForCausalLM: {type(model).__name__}, no missing/unexpected keys, no warnings")
    return model


def check_loss_on_a_batch(shardwise, tmp, model, ckpt, seq, label, mesh="dp=2,tp=2"):
    """transformers' loss on one byte sequence of seq + 1 tokens equals the first step's loss of
    `shardwise train --init-from ckpt` on `mesh` on a file holding exactly that sequence."""
    tokens = [ord(c) for c in "12+34=46\n41+"][: seq + 1]
    while len(tokens) < seq + 1:
        tokens.append(10)
    tag = label.strip().replace(" ", "-")
    data = os.path.join(tmp, f"{tag}_tokens.txt")
    with open(data, "wb") as f:
        f.write(bytes(tokens))
    want, _ = hf_loss(model, tokens)
    got = first_loss(shardwise, tmp, f"{tag}-{mesh}-back", ckpt, data, mesh, ["--data-format", "bytes"])
    assert abs(got - want) <= TOL * max(1, abs(want)), (mesh, got, want)
    print(f"  {label} loss on a batch ({mesh}): shardwise {got:.7f} = transformers {want:.7f}")


def check_load(shardwise, tmp):
    root = os.path.join(tmp, "sw")
    run([shardwise, "train", "--mesh", "dp=2,tp=2", "--steps", "30", "--layers", "2", "--hidden", "32", "--heads",
         "4", "--digits", "2", "--global-batch", "8", "--save-every", "30", "--run-dir", root, "--progress", "none"])
    ckpt = os.path.join(root, "checkpoints", "checkpoint-30")
    model = load_cleanly(ckpt, "GPT2LMHeadModel", "load     ")
    check_loss_on_a_batch(shardwise, tmp, model, ckpt, model.config.n_positions, "load     ")
    check_generate(shardwise, tmp, model, ckpt, "generate ")


def check_generate(shardwise, tmp, model, ckpt, label):
    """Greedy `shardwise generate` on dp=2 x tp=2 (with the logits each token came from) against
    transformers': the same tokens, and transformers' logits over prompt + generated equal
    shardwise's within 1e-5."""
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
    print(f"  {label} greedy on dp=2 x tp=2 = transformers' generate for {len(prompts)} prompts; "
          f"logits max |diff| {worst:.2e}")


LORA_TARGETS = ["c_attn", "c_proj", "c_fc"]


def read_safetensors_dir(path):
    """Every tensor of a directory's model.safetensors (one file or an index of shards)."""
    from safetensors.torch import load_file
    out = {}
    index = os.path.join(path, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    for f in files:
        out.update(load_file(os.path.join(path, f)))
    return out


def random_lora(model, config, seed):
    """PEFT's LoRA on `model` with B drawn non-zero (PEFT starts it at zero: the merge would be trivial)."""
    from peft import get_peft_model
    peft_model = get_peft_model(model, config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return peft_model.eval()


def compare_merge(shardwise, tmp, label, base_path, adapter_dir, merged, tol=1e-6):
    out = os.path.join(tmp, "merged-" + label)
    run([shardwise, "ckpt", "lora-merge", base_path, adapter_dir, out])
    got = read_safetensors_dir(out)
    want = {k: v for k, v in merged.items() if k != "lm_head.weight"}  # tied to wte: not in the files
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    worst = max((got[k].double() - want[k].double()).abs().max().item() for k in want)
    assert worst <= tol, (label, worst)
    print(f"  lora-merge {label:24s} = merge_and_unload, max |diff| {worst:.2e} over {len(want)} tensors")
    return out


def check_lora_merge(shardwise, tmp, golden):
    from peft import LoraConfig
    base_dir = os.path.join(tmp, "lora-base")
    tiny_gpt2(7).save_pretrained(base_dir)
    rng = np.random.default_rng(3)
    tokens = [int(t) for t in rng.integers(0, 300, size=17)]
    data = os.path.join(tmp, "lora-tokens.bin")
    write_u16(data, tokens)
    for rslora in [False, True]:
        label = "gpt2 conv1d" + (" rslora" if rslora else "")
        config = LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, fan_in_fan_out=True, lora_dropout=0.0,
                            use_rslora=rslora, task_type="CAUSAL_LM")
        model = random_lora(GPT2LMHeadModel.from_pretrained(base_dir), config, seed=11)
        adapter = os.path.join(tmp, "adapter-" + label.replace(" ", "-"))
        model.save_pretrained(adapter)
        want, logits = hf_loss(model, tokens)
        for mesh in ["tp=2", "dp=2,tp=2"]:
            got = first_loss(shardwise, tmp, f"lora-{label}-{mesh}".replace(" ", "-"), base_dir, data, mesh,
                             ["--lora-from", adapter])
            assert abs(got - want) <= TOL * max(1, abs(want)), (label, mesh, got, want)
            print(f"  lora-from  {label:24s} {mesh:10s} first loss {got:.7f} = PEFT {want:.7f}")
        merged = model.merge_and_unload().state_dict()
        compare_merge(shardwise, tmp, label, base_dir, adapter, merged)
        if golden and rslora:
            write_lora_golden(golden, adapter, merged, want)
    # A plain nn.Linear model: weights [out, in] in a safetensors file, no fan_in_fan_out.
    from safetensors.torch import save_file
    torch.manual_seed(5)
    linear = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 8))
    lin_dir = os.path.join(tmp, "linear")
    os.makedirs(lin_dir)
    save_file({k: v.contiguous() for k, v in linear.state_dict().items()}, os.path.join(lin_dir, "model.safetensors"),
              metadata={"format": "pt"})
    model = random_lora(linear, LoraConfig(r=3, lora_alpha=6, target_modules=["0", "2"]), seed=13)
    adapter = os.path.join(tmp, "adapter-linear")
    model.save_pretrained(adapter)
    compare_merge(shardwise, tmp, "nn.Linear", os.path.join(lin_dir, "model.safetensors"), adapter,
                  model.merge_and_unload().state_dict())


def write_lora_golden(golden, adapter, merged, loss):
    """tests/golden/hf/lora_gpt2 (PEFT's adapter files on gpt2_tiny) and lora_gpt2_expected.json: PEFT's
    loss on tokens.bin and, of each merged weight, its sum and every 53rd element (kept small)."""
    out = os.path.join(golden, "lora_gpt2")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    shutil.copy(os.path.join(adapter, "adapter_model.safetensors"), out)
    config = json.load(open(os.path.join(adapter, "adapter_config.json")))
    config["base_model_name_or_path"] = "gpt2_tiny"  # PEFT wrote the temporary directory's path
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True))
    stride = 53
    samples = {}
    for name, t in sorted(merged.items()):
        if not any(f".{m}.weight" in name for m in LORA_TARGETS):
            continue
        flat = t.double().flatten()
        samples[name] = {"shape": list(t.shape), "sum": flat.sum().item(), "stride": stride,
                         "samples": flat[::stride].tolist()}
    import peft
    json.dump({"generator": f"tools/hf_parity.py with torch {torch.__version__}, transformers "
                            f"{transformers.__version__}, peft {peft.__version__}",
               "loss": loss, "merged": samples},
              open(os.path.join(golden, "lora_gpt2_expected.json"), "w"), indent=1)


def peft_model_cleanly(architecture, base_dir, adapter):
    """PeftModel.from_pretrained(architecture.from_pretrained(base_dir), adapter) in eval mode. PEFT
    itself calls a deprecated transformers property; any other warning or log record (missing or
    unexpected adapter keys, a config field it does not know) is a failure."""
    from peft import PeftModel
    handler = Collect()
    logging.getLogger("peft").addHandler(handler)
    logging.getLogger("transformers").addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(architecture.from_pretrained(base_dir), adapter).eval()
    caught = [str(w.message) for w in caught if "is_gradient_checkpointing" not in str(w.message)]
    assert not caught and not handler.records, (caught, handler.records)
    return model


def check_lora_train(shardwise, tmp):
    from peft import LoraConfig, get_peft_model
    base_dir = os.path.join(tmp, "lora-base")  # written by check_lora_merge
    data = os.path.join(tmp, "lora-tokens.bin")
    root = os.path.join(tmp, "sw-lora")
    run([shardwise, "train", "--init-from", base_dir, "--data", data, "--mesh", "dp=2,tp=2", "--steps", "6",
         "--global-batch", "4", "--lr", "1e-2", "--warmup", "1", "--lora-rank", "4", "--lora-alpha", "16",
         "--lora-targets", ",".join(LORA_TARGETS), "--save-every", "6", "--run-dir", root, "--progress", "none",
         "--eval-every", "0"])
    ckpt = os.path.join(root, "checkpoints", "checkpoint-6")
    model = peft_model_cleanly(GPT2LMHeadModel, base_dir, ckpt)
    b = model.base_model.model.transformer.h[0].attn.c_attn.lora_B["default"].weight
    assert b.abs().max().item() > 0, "the trained adapter's B is still zero"
    print("  lora-train PeftModel.from_pretrained(base, shardwise checkpoint): no warnings, B trained")
    tokens = list(np.fromfile(data, dtype=np.uint16).astype(int))
    want, logits = hf_loss(model, tokens)
    got = first_loss(shardwise, tmp, "lora-back", base_dir, data, "tp=2", ["--lora-from", ckpt])
    assert abs(got - want) <= TOL * max(1, abs(want)), (got, want)
    print(f"  lora-train loss on the batch: shardwise {got:.7f} = PEFT {want:.7f}")
    merged_dir = os.path.join(tmp, "sw-lora-merged")
    run([shardwise, "ckpt", "lora-merge", base_dir, ckpt, merged_dir])
    _, merged_logits = hf_loss(GPT2LMHeadModel.from_pretrained(merged_dir).eval(), tokens)
    worst = (merged_logits - logits).abs().max().item()
    assert worst <= TOL, worst
    print(f"  lora-train lora-merge of it: transformers logits = PEFT's, max |diff| {worst:.2e}")
    # shardwise's own logits of the merged model (generate --logits-out: the row each new token came
    # from, teacher-forced here by one new token per prefix) equal PEFT's.
    logits_file = os.path.join(tmp, "lora-logits.safetensors")
    seq = model.base_model.model.config.n_positions
    prefixes = [tokens[:n] for n in (3, 8, seq)]
    cmd = [shardwise, "generate", "--checkpoint", merged_dir, "--max-new-tokens", "1", "--mesh", "tp=2",
           "--eos-id", "-1", "--logits-out", logits_file,
           "--prompt-ids", ";".join(",".join(str(t) for t in p) for p in prefixes)]
    run(cmd)
    from safetensors.numpy import load_file
    rows = load_file(logits_file)
    worst = max(float(np.abs(rows[f"logits.{i}"][0] - logits[len(p) - 1].numpy()).max()) for i, p in enumerate(prefixes))
    assert worst <= TOL, worst
    print(f"  lora-train shardwise generate's logits of the merged model = PEFT's, max |diff| {worst:.2e}")
    peft_dir = os.path.join(tmp, "peft-same-config")
    config = LoraConfig(r=4, lora_alpha=16, target_modules=LORA_TARGETS, fan_in_fan_out=True, task_type="CAUSAL_LM")
    get_peft_model(GPT2LMHeadModel.from_pretrained(base_dir), config).save_pretrained(peft_dir)
    ours, theirs = (json.load(open(os.path.join(d, "adapter_config.json"))) for d in (ckpt, peft_dir))
    for c in (ours, theirs):
        c.pop("peft_version", None), c.pop("base_model_name_or_path", None)
        c["target_modules"] = sorted(c["target_modules"])
    assert ours == theirs, {k: (ours.get(k), theirs.get(k)) for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)}
    from safetensors import safe_open
    shapes = [{k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
              for f in (safe_open(os.path.join(d, "adapter_model.safetensors"), "pt") for d in (ckpt, peft_dir))]
    assert shapes[0] == shapes[1], shapes
    print(f"  lora-train adapter_config.json and adapter keys/shapes = PEFT's ({len(shapes[0])} tensors)")


def tiny_llama(seed, vocab=128, seq=16):
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=seq, rms_norm_eps=1e-6,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                      bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    return LlamaForCausalLM(cfg).eval()


def check_init_from_meshes(shardwise, tmp, label, model, data, want, meshes):
    """`shardwise train --init-from` the model's save_pretrained directory: the first loss on every
    mesh equals transformers' `want` within TOL."""
    d = os.path.join(tmp, "hf-" + label)
    model.save_pretrained(d)
    for mesh in meshes:
        got = first_loss(shardwise, tmp, f"{label}-{mesh}", d, data, mesh)
        assert abs(got - want) <= TOL * max(1, abs(want)), (mesh, got, want)
        print(f"  {label} init-from {mesh:10s} first loss {got:.7f} = transformers {want:.7f}")


def write_decoder_golden(golden, name, model, tokens, want, logits, generator):
    """tests/golden/hf/<name>_tiny (the model's save_pretrained), <name>_tokens.bin and
    <name>_tiny_expected.json: transformers' loss, logits and greedy generate from the first 5
    tokens (eos = its config's, 127), which tests/generate/test_generate_llama.cc replays with
    `shardwise generate`'s graphs."""
    out = os.path.join(golden, f"{name}_tiny")
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    write_u16(os.path.join(golden, f"{name}_tokens.bin"), tokens)
    greedy = model.generate(torch.tensor([tokens[:5]]), attention_mask=torch.ones(1, 5, dtype=torch.long),
                            max_new_tokens=8, do_sample=False, pad_token_id=127)[0].tolist()
    json.dump({"generator": f"{generator} with torch {torch.__version__}, transformers "
                            f"{transformers.__version__}",
               "tokens": tokens, "loss": want, "last_logits": logits[-1].tolist(),
               "argmax": logits.argmax(-1).tolist(), "greedy_prompt": tokens[:5], "greedy": greedy},
              open(os.path.join(golden, f"{name}_tiny_expected.json"), "w"), indent=1)


def check_llama_init_from(shardwise, tmp, golden):
    model = tiny_llama(11)
    rng = np.random.default_rng(5)
    tokens = [int(t) for t in rng.integers(0, 128, size=17)]
    data = os.path.join(tmp, "llama_tokens.bin")
    write_u16(data, tokens)
    want, logits = hf_loss(model, tokens)
    check_init_from_meshes(shardwise, tmp, "llama", model, data, want, ["tp=2", "dp=2,tp=2", "tp=2,pp=2"])
    if golden:
        write_decoder_golden(golden, "llama", model, tokens, want, logits, "tools/hf_parity.py")


def check_llama_load(shardwise, tmp):
    root = os.path.join(tmp, "sw-llama")
    run([shardwise, "train", "--model", "llama", "--mesh", "dp=2,tp=2", "--steps", "30", "--layers", "2", "--hidden",
         "32", "--heads", "4", "--kv-heads", "2", "--intermediate-size", "64", "--untied-head", "--digits", "2",
         "--global-batch", "8", "--save-every", "30", "--run-dir", root, "--progress", "none"])
    ckpt = os.path.join(root, "checkpoints", "checkpoint-30")
    model = load_cleanly(ckpt, "LlamaForCausalLM", "llama load")
    assert model.config.num_key_value_heads == 2 and not model.config.tie_word_embeddings, model.config
    check_loss_on_a_batch(shardwise, tmp, model, ckpt, model.config.max_position_embeddings, "llama load")
    check_generate(shardwise, tmp, model, ckpt, "llama generate")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shardwise")
    ap.add_argument("--golden", help="write the golden files of tests/golden/hf into this directory")
    ap.add_argument("--only", choices=["gpt2", "lora", "llama"], action="append",
                    help="run (and with --golden, write) these parts' checks only (repeatable; default: all)")
    a = ap.parse_args()
    parts = set(a.only or ["gpt2", "lora", "llama"])
    transformers.logging.set_verbosity_warning()
    if a.golden:
        os.makedirs(a.golden, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"transformers {transformers.__version__}, torch {torch.__version__}")
        if "gpt2" in parts:
            check_init_from(a.shardwise, tmp, a.golden)
            check_load(a.shardwise, tmp)
        if "lora" in parts:
            check_lora_merge(a.shardwise, tmp, a.golden)
            check_lora_train(a.shardwise, tmp)
        if "llama" in parts:
            check_llama_init_from(a.shardwise, tmp, a.golden)
            check_llama_load(a.shardwise, tmp)
    print("hf parity ok")


if __name__ == "__main__":
    main()
