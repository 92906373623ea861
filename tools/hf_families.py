#!/usr/bin/env python3
"""Parity of the Llama builder's families with transformers: Qwen2 (q/k/v biases), Qwen3 (per-head q/k
RMSNorm before rotary) and Mistral (Llama's graph, sliding_window null) against Qwen2ForCausalLM,
Qwen3ForCausalLM and MistralForCausalLM (not part of `make test`).

Checks, for each model, against transformers' own results:
  init-from  a random-init Qwen2ForCausalLM (2 layers, hidden 24, 4 heads over 2 kv heads, random
             q/k/v biases, untied head, rope_theta 1e6) and Qwen3ForCausalLM (hidden 32, 4 heads over
             1 kv head, head_dim 8, random q/k norm weights, tied head, rope_theta 5e5) and
             MistralForCausalLM (hidden 16, 2 heads over 1 kv head, untied head, rope_theta 2e4) ->
             `shardwise train --init-from` on 1 rank, tp=2, dp=2 x tp=2, tp=2 x pp=2 -> the
             first-step loss equals transformers' within 1e-5.
  load       `--init-from` that model, 20 steps on dp=2 x tp=2, saved -> AutoModelForCausalLM loads a
             Qwen2/Qwen3/MistralForCausalLM with no missing, unexpected or mismatched keys and
             no warnings -> its loss on a batch equals shardwise's; greedy `shardwise generate`
             gives transformers' tokens and logits within 1e-5.
With --golden DIR it also writes tests/golden/hf/<qwen2|qwen3|mistral>_tiny, <name>_tokens.bin and
<name>_tiny_expected.json, which `make test` replays without PyPI (tests/models/test_hf_families.cc,
tests/generate/test_generate_llama.cc).
A fourth model, qwen3_hd, is a Qwen3ForCausalLM whose head_dim (16) is not hidden / heads (48 / 4), 4 heads
over 2 kv heads, untied head: the q/k/v/o projections are heads x head_dim wide, as real Qwen3 checkpoints.
Usage: tools/hf_families.py build/bin/shardwise [--golden tests/golden/hf] [--only qwen2 qwen3 qwen3_hd mistral]
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import (MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity import (check_generate, check_init_from_meshes, check_loss_on_a_batch, hf_loss,  # noqa: E402
                       load_cleanly, run, write_decoder_golden, write_u16)


def tiny_qwen2(seed, vocab=128, seq=16):
    torch.manual_seed(seed)
    cfg = Qwen2Config(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=seq, rms_norm_eps=1e-6,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=False,
                      use_sliding_window=False, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    model = Qwen2ForCausalLM(cfg).eval()
    # transformers initialises the biases to zero, where a missing bias would go unnoticed.
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    return model


def tiny_qwen3(seed, vocab=128, seq=16, hidden=32, kv_heads=1, head_dim=8, tied=True):
    torch.manual_seed(seed)
    cfg = Qwen3Config(hidden_size=hidden, intermediate_size=24 if tied else 40, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab,
                      max_position_embeddings=seq, rms_norm_eps=1e-6,
                      rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                      tie_word_embeddings=tied, use_sliding_window=False, bos_token_id=vocab - 1,
                      eos_token_id=vocab - 1)
    model = Qwen3ForCausalLM(cfg).eval()
    # transformers initialises the q/k norms to one, where a missing norm weight would go unnoticed.
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.uniform_(0.5, 1.5)
    return model


def tiny_qwen3_hd(seed):
    """A Qwen3 whose head_dim (16) is not hidden / heads (48 / 4 = 12), as Qwen3-0.6B's 128 vs 1024 / 16:
    q_proj [64, 48], k/v_proj [32, 48], o_proj [48, 64], q/k norms [16], an untied head."""
    return tiny_qwen3(seed, hidden=48, kv_heads=2, head_dim=16, tied=False)


def tiny_mistral(seed, vocab=128, seq=16):
    torch.manual_seed(seed)
    cfg = MistralConfig(hidden_size=16, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, vocab_size=vocab, max_position_embeddings=seq, rms_norm_eps=1e-5,
                        rope_parameters={"rope_type": "default", "rope_theta": 20000.0}, tie_word_embeddings=False,
                        sliding_window=None, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    return MistralForCausalLM(cfg).eval()


def check_init_from(shardwise, tmp, golden, name, model, seed, generator="tools/hf_families.py"):
    rng = np.random.default_rng(seed)
    tokens = [int(t) for t in rng.integers(0, 128, size=17)]
    data = os.path.join(tmp, f"{name}_tokens.bin")
    write_u16(data, tokens)
    want, logits = hf_loss(model, tokens)
    check_init_from_meshes(shardwise, tmp, name, model, data, want, ["dp=1", "tp=2", "dp=2,tp=2", "tp=2,pp=2"])
    if golden:
        write_decoder_golden(golden, name, model, tokens, want, logits, generator)


def check_load(shardwise, tmp, name, model, architecture):
    base = os.path.join(tmp, f"hf-{name}-base")
    model.save_pretrained(base)
    root = os.path.join(tmp, f"sw-{name}")
    run([shardwise, "train", "--init-from", base, "--mesh", "dp=2,tp=2", "--steps", "20", "--digits", "2",
         "--global-batch", "8", "--lr", "3e-3", "--save-every", "20", "--run-dir", root, "--progress", "none"])
    ckpt = os.path.join(root, "checkpoints", "checkpoint-20")
    loaded = load_cleanly(ckpt, architecture, f"{name} load")
    assert loaded.config.num_key_value_heads == model.config.num_key_value_heads, loaded.config
    assert loaded.config.tie_word_embeddings == model.config.tie_word_embeddings, loaded.config
    check_loss_on_a_batch(shardwise, tmp, loaded, ckpt, loaded.config.max_position_embeddings, f"{name} load")
    check_generate(shardwise, tmp, loaded, ckpt, f"{name} generate")


# Each family's fixture: its constructor and seed, the seed of its token file, transformers' class.
FAMILIES = {
    "qwen2": (tiny_qwen2, 17, 9, "Qwen2ForCausalLM"),
    "qwen3": (tiny_qwen3, 19, 3, "Qwen3ForCausalLM"),
    "qwen3_hd": (tiny_qwen3_hd, 29, 5, "Qwen3ForCausalLM"),
    "mistral": (tiny_mistral, 23, 4, "MistralForCausalLM"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shardwise")
    ap.add_argument("--golden", help="write the golden files of tests/golden/hf into this directory")
    ap.add_argument("--only", nargs="+", choices=list(FAMILIES), default=list(FAMILIES),
                    help="run (and with --golden, write) these models' checks only")
    a = ap.parse_args()
    transformers.logging.set_verbosity_warning()
    if a.golden:
        os.makedirs(a.golden, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"transformers {transformers.__version__}, torch {torch.__version__}")
        for name, (make, seed, token_seed, cls) in FAMILIES.items():
            if name in a.only:
                model = make(seed)
                check_init_from(a.shardwise, tmp, a.golden, name, model, token_seed)
                check_load(a.shardwise, tmp, name, model, cls)
    print(f"{' and '.join(a.only)} parity ok")


if __name__ == "__main__":
    main()
