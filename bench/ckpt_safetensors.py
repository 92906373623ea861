#!/usr/bin/env python3
"""safetensors' load of a shardwise checkpoint's own files (shardwise writes safetensors shards),
for bench/ckpt.sh to print beside shardwise's load of the same bytes. Uses the torch framework
(safe_open mmaps the file; one byte of every page is touched so the bytes are read) when torch imports, else numpy.

    VENV/bin/python bench/ckpt_safetensors.py DIR    (DIR: a checkpoint-N directory)
"""
import glob
import os
import sys
import time

from safetensors import safe_open

try:
    import torch
    framework = "pt"
except ImportError:
    framework = "numpy"


def main():
    files = sorted(glob.glob(os.path.join(sys.argv[1], "model*.safetensors")))
    t0 = time.perf_counter()
    nbytes = 0
    keep = {}
    for path in files:
        with safe_open(path, framework=framework) as f:
            for k in f.keys():
                t = f.get_tensor(k)
                # get_tensor may hand out pages of the mapping not yet read: touch one byte of every
                # page so the time includes reading the bytes from disk, as the other loads do.
                raw = t.reshape(-1).view(torch.uint8) if framework == "pt" else t.reshape(-1).view("u1")
                int(raw[::4096].sum())
                keep[k] = t
                nbytes += t.nbytes if framework == "numpy" else t.numel() * t.element_size()
    dt = time.perf_counter() - t0
    print(f"safetensors load ({framework}, {len(files)} files): {nbytes / 1e9:.2f} GB in {dt:.2f} s = "
          f"{nbytes / dt / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
