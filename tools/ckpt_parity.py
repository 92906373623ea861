#!/usr/bin/env python3
"""Parity with Hugging Face's safetensors library (not part of `make test`; run `make parity`).

Feeds the HF fixture through `shardwise ckpt merge` and `convert --dtype f16|f64`, then:
- loads every shard shardwise wrote with safetensors (safe_open, numpy) and compares each tensor with
  the fixture's values cast with numpy;
- checks the shards carry metadata format=pt (what transformers' loader requires);
- writes the same tensors with safetensors.numpy.save_file (metadata format=pt) and checks that
  shardwise's shard is byte-identical to it.
Needs: pip install safetensors numpy.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file


def main():
    shardwise, fixture = sys.argv[1], sys.argv[2]
    ref = load_file(fixture)
    checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in")
        os.makedirs(src)
        shutil.copy(fixture, os.path.join(src, "model.safetensors"))
        for label, args, dtype in [("merged", [], np.float32), ("f16", ["--dtype", "f16"], np.float16),
                                   ("f64", ["--dtype", "f64"], np.float64)]:
            out = os.path.join(tmp, label)
            cmd = [shardwise, "ckpt", "convert" if args else "merge", src, out] + args
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
            files = sorted(set(index["weight_map"].values()))
            for name, file in index["weight_map"].items():
                with safe_open(os.path.join(out, file), framework="np") as f:
                    assert f.metadata() == {"format": "pt"}, f.metadata()
                    got = f.get_tensor(name)
                want = ref[name].astype(dtype)
                assert got.dtype == want.dtype and got.shape == want.shape, (label, name, got.dtype, got.shape)
                assert np.array_equal(got, want), (label, name)
                checked += 1
            assert len(files) == 1
            mine = open(os.path.join(out, files[0]), "rb").read()
            theirs_path = os.path.join(tmp, label + "_hf.safetensors")
            save_file({k: v.astype(dtype) for k, v in ref.items()}, theirs_path, metadata={"format": "pt"})
            assert mine == open(theirs_path, "rb").read(), f"{label}: shardwise's file differs from safetensors.save_file"
    print(f"parity ok: {checked} tensors loaded by HF safetensors equal the fixture; files byte-identical to save_file")


if __name__ == "__main__":
    main()
