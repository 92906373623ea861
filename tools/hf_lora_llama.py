#!/usr/bin/env python3
"""LoRA on the Llama builder against PEFT (not part of `make test`; `make hf-parity` and `make hf-golden` run it).

For three bases of tests/golden/hf, llama_tiny (--lora-targets all-linear, rsLoRA), qwen2_tiny
(PEFT's default targets for Qwen2, q_proj and v_proj; its q/k/v biases stay frozen) and mixtral_tiny
(q_proj, v_proj and the experts' fused parameters experts.gate_up_proj, experts.down_proj: PEFT's
target_parameters), `shardwise train` trains LoRA adapters for 4 steps on dp=2 x tp=2 (Mixtral:
dp=2 x ep=2) and saves them. This script trains nothing
itself: it loads the base in transformers, applies shardwise's saved adapter with
PeftModel.from_pretrained (any warning, such as a missing or unexpected adapter key, fails), and
records PEFT's loss on the base's token file and, of PEFT's merge_and_unload, the logits at the
last position and the greedy tokens. It checks shardwise against them as well: the first loss of
`train --lora-from` on tp=2, and (not for Mixtral's expert adapters) `ckpt lora-merge` followed by
`generate --logits-out`.
With --golden DIR it writes DIR/lora_<name>/ (the adapter files, base_model_name_or_path
"<name>_tiny") and DIR/lora_<name>_expected.json, which tests/generate/test_lora_hf_golden.cc
replays without PyPI.
"""
import argparse
import json
import os
import shutil
import tempfile

import numpy as np
import peft
import torch
import transformers
from transformers import AutoModelForCausalLM

from hf_parity import TOL, first_loss, hf_loss, peft_model_cleanly, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "hf")
# name, options, mesh of the training run, whether `ckpt lora-merge` merges it (not an expert adapter)
CASES = [("llama", ["--lora-targets", "all-linear", "--lora-rslora"], "dp=2,tp=2", True),
         ("qwen2", [], "dp=2,tp=2", True),
         ("qwen3", ["--lora-targets", "all-linear"], "dp=2,tp=2", True),
         ("mistral", [], "dp=2,tp=2", True),
         ("mixtral", ["--lora-targets", "q_proj,v_proj,experts.gate_up_proj,experts.down_proj"], "dp=2,ep=2", False)]


def train_adapter(shardwise, tmp, name, options, mesh):
    """shardwise's adapter: 4 steps on `mesh` from the base, saved at step 4."""
    root = os.path.join(tmp, "lora-" + name)
    run([shardwise, "train", "--init-from", os.path.join(GOLDEN, f"{name}_tiny"), "--data",
         os.path.join(GOLDEN, f"{name}_tokens.bin"), "--mesh", mesh, "--steps", "4", "--global-batch", "4",
         "--lr", "1e-2", "--warmup", "1", "--lora-rank", "4", "--lora-alpha", "8", *options, "--save-every", "4",
         "--run-dir", root, "--progress", "none", "--eval-every", "0"])
    return os.path.join(root, "checkpoints", "checkpoint-4")


def check_case(shardwise, tmp, name, options, mesh, merge, golden):
    base_dir = os.path.join(GOLDEN, f"{name}_tiny")
    data = os.path.join(GOLDEN, f"{name}_tokens.bin")
    tokens = [int(t) for t in np.fromfile(data, dtype=np.uint16)]
    adapter = train_adapter(shardwise, tmp, name, options, mesh)
    model = peft_model_cleanly(AutoModelForCausalLM, base_dir, adapter)
    trained = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert trained and all(p.abs().max().item() > 0 for p in trained), "an adapter's B is still zero"
    want, _ = hf_loss(model, tokens)
    got = first_loss(shardwise, tmp, f"{name}-lora-back", base_dir, data, "tp=2", ["--lora-from", adapter])
    assert abs(got - want) <= TOL * max(1, abs(want)), (name, got, want)
    print(f"  {name}: PEFT loads shardwise's adapter ({len(trained)} modules) without warnings; "
          f"loss shardwise {got:.7f} = PEFT {want:.7f}")
    merged = model.merge_and_unload().eval()
    merged_loss, logits = hf_loss(merged, tokens)
    if not merge:  # shardwise's lora-merge refuses adapters of expert parameters
        if golden:
            write_golden(golden, name, adapter, want, merged, tokens, logits)
        return
    merged_dir = os.path.join(tmp, f"merged-{name}")
    run([shardwise, "ckpt", "lora-merge", base_dir, adapter, merged_dir])
    logits_file = os.path.join(tmp, f"logits-{name}.safetensors")
    run([shardwise, "generate", "--checkpoint", merged_dir, "--max-new-tokens", "1", "--mesh", "tp=2", "--eos-id",
         "-1", "--logits-out", logits_file, "--prompt-ids", ",".join(str(t) for t in tokens[:-1])])
    from safetensors.numpy import load_file
    worst = float(np.abs(load_file(logits_file)["logits.0"][0] - logits[-1].numpy()).max())
    assert worst <= TOL, (name, worst)
    print(f"  {name}: lora-merge's logits = PEFT merge_and_unload's, max |diff| {worst:.2e}")
    if golden:
        write_golden(golden, name, adapter, want, merged, tokens, logits)


def write_golden(golden, name, adapter, loss, merged, tokens, logits):
    out = os.path.join(golden, f"lora_{name}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    shutil.copy(os.path.join(adapter, "adapter_model.safetensors"), out)
    config = json.load(open(os.path.join(adapter, "adapter_config.json")))
    config["base_model_name_or_path"] = f"{name}_tiny"  # shardwise wrote the run's --init-from path
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True))
    eos = merged.config.eos_token_id
    greedy = merged.generate(torch.tensor([tokens[:5]]), attention_mask=torch.ones(1, 5, dtype=torch.long),
                             max_new_tokens=8, do_sample=False, pad_token_id=eos)[0].tolist()
    json.dump({"generator": f"tools/hf_lora_llama.py with torch {torch.__version__}, transformers "
                            f"{transformers.__version__}, peft {peft.__version__}",
               "loss": loss,
               "merged": {"tokens": tokens, "last_logits": logits[-1].tolist(), "argmax": logits.argmax(-1).tolist(),
                          "greedy_prompt": tokens[:5], "greedy": greedy, "eos": eos}},
              open(os.path.join(golden, f"lora_{name}_expected.json"), "w"), indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shardwise")
    ap.add_argument("--golden", help="write lora_<name>/ and lora_<name>_expected.json into this directory")
    ap.add_argument("--only", nargs="+", choices=[c[0] for c in CASES], default=[c[0] for c in CASES],
                    help="run (and with --golden, write) these cases only")
    a = ap.parse_args()
    transformers.logging.set_verbosity_warning()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"transformers {transformers.__version__}, peft {peft.__version__}, torch {torch.__version__}")
        for name, options, mesh, merge in [c for c in CASES if c[0] in a.only]:
            check_case(a.shardwise, tmp, name, options, mesh, merge, a.golden)
    print("hf lora llama ok")


if __name__ == "__main__":
    main()
