#!/usr/bin/env python3
"""Tokens added to a tokenizer grow the model as transformers' resize_token_embeddings does (not part
of `make test`).

A random-init LlamaForCausalLM (vocab 99, untied head) saved with a tokenizer to which two special
tokens were added (`<|im_start|>` 99, `<|im_end|>` 100: len(tokenizer) 101), as a chat fine-tune
brings it. Checks:
  train      `shardwise train --init-from` that directory (no option: the tokenizer's 101 ids)
             with --lr 1e-20 (no change in f32), saved after one step -> AutoModelForCausalLM loads the checkpoint with no
             missing, unexpected or mismatched keys and no warnings, vocab_size 101, AutoTokenizer
             loads the copied tokenizer (101 tokens); the old rows of the embedding and the head are
             the base's bit for bit; transformers' loss of the loaded model on 17 tokens that use
             the added ids equals shardwise's first-step loss within 1e-5 on 1 rank, tp=2 (101 rows
             over 2 ranks: uneven), dp=2 x tp=2 and pp=2.
  mean       the added rows are within 1e-5 of transformers' own resize_token_embeddings(101)
             (mean_resizing=True: both are the old rows' mean plus a draw of 1e-9 x their covariance).
With --golden DIR it writes resize_llama_tiny (the base directory with its tokenizer),
resize_tokens.bin and resize_llama_tiny_expected.json (the loss, transformers' added rows), which
tests/models/test_vocab_resize.cc replays.
Usage: tools/hf_resize_vocab.py build/bin/shardwise [--golden tests/golden/hf]
"""
import argparse
import copy
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity import TOL, first_loss, hf_loss, load_cleanly, run, tiny_llama, write_u16  # noqa: E402

OLD, ADDED = 99, ["<|im_start|>", "<|im_end|>"]


def chat_tokenizer():
    vocab = {f"t{i}": i for i in range(OLD - 1)}
    vocab["<unk>"] = OLD - 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": ADDED})
    assert len(fast) == OLD + len(ADDED), len(fast)
    return fast


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shardwise")
    ap.add_argument("--golden")
    a = ap.parse_args()
    transformers.logging.set_verbosity_warning()
    new = OLD + len(ADDED)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"transformers {transformers.__version__}, torch {torch.__version__}")
        model = tiny_llama(31, vocab=OLD)
        base = os.path.join(tmp, "base")
        model.save_pretrained(base)
        chat_tokenizer().save_pretrained(base)
        rng = np.random.default_rng(6)
        tokens = [int(t) for t in rng.integers(0, OLD, size=17)]
        tokens[3], tokens[9], tokens[12] = OLD, OLD + 1, OLD  # the added tokens, as a chat format places them
        data = os.path.join(tmp, "resize_tokens.bin")
        write_u16(data, tokens)

        root = os.path.join(tmp, "sw")
        run([a.shardwise, "train", "--init-from", base, "--data", data, "--steps", "1", "--global-batch", "4",
             "--lr", "1e-20", "--min-lr", "0", "--save-every", "1", "--run-dir", root, "--progress", "none", "--eval-every", "0"])
        ckpt = os.path.join(root, "checkpoints", "checkpoint-1")
        loaded = load_cleanly(ckpt, "LlamaForCausalLM", "resize")
        assert loaded.config.vocab_size == new, loaded.config.vocab_size
        assert len(AutoTokenizer.from_pretrained(ckpt)) == new
        for ours, theirs in ((loaded.model.embed_tokens.weight, model.model.embed_tokens.weight),
                             (loaded.lm_head.weight, model.lm_head.weight)):
            assert torch.equal(ours[:OLD], theirs), "old rows changed"
        want, _ = hf_loss(loaded, tokens)
        for mesh in ["dp=1", "tp=2", "dp=2,tp=2", "pp=2"]:
            got = first_loss(a.shardwise, tmp, f"resize-{mesh}", base, data, mesh)
            assert abs(got - want) <= TOL * max(1, abs(want)), (mesh, got, want)
            print(f"  resize init-from {mesh:10s} first loss {got:.7f} = transformers {want:.7f}")

        resized = copy.deepcopy(model)
        resized.resize_token_embeddings(new)
        theirs = {"embed": resized.model.embed_tokens.weight[OLD:].detach(), "head": resized.lm_head.weight[OLD:].detach()}
        ours = {"embed": loaded.model.embed_tokens.weight[OLD:].detach(), "head": loaded.lm_head.weight[OLD:].detach()}
        for k in theirs:
            diff = (theirs[k] - ours[k]).abs().max().item()
            assert diff <= 1e-5, (k, diff)
            print(f"  resize {k} added rows within {diff:.2e} of transformers' resize_token_embeddings")

        if a.golden:
            out = os.path.join(a.golden, "resize_llama_tiny")
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(base, out)
            write_u16(os.path.join(a.golden, "resize_tokens.bin"), tokens)
            json.dump({"generator": f"tools/hf_resize_vocab.py with torch {torch.__version__}, transformers "
                                    f"{transformers.__version__}",
                       "tokens": tokens, "loss": want, "old_vocab": OLD, "vocab": new,
                       "transformers_added_embed": theirs["embed"].tolist(),
                       "transformers_added_head": theirs["head"].tolist()},
                      open(os.path.join(a.golden, "resize_llama_tiny_expected.json"), "w"), indent=1)
    print("resize parity ok")


if __name__ == "__main__":
    main()
