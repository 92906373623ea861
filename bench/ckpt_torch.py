#!/usr/bin/env python3
"""torch.save / torch.load of the same tensors as bench/bench_ckpt.cc (16 f32 matrices 4096x4096,
1.07 GB), for bench/ckpt.sh to print beside shardwise's figures.

    /usr/bin/python3 bench/ckpt_torch.py save DIR [GiB]   (fsync'ed, like shardwise's save)
    /usr/bin/python3 bench/ckpt_torch.py load DIR
"""
import os
import sys
import time

import torch


def main():
    mode, d = sys.argv[1], sys.argv[2]
    path = os.path.join(d, "torch.pt")
    if mode == "save":
        gib = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
        n = int(16 * gib)
        tensors = {f"layer{i}.weight": torch.randn(4096, 4096) for i in range(n)}
        nbytes = sum(t.numel() * 4 for t in tensors.values())
        os.makedirs(d, exist_ok=True)
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(tensors, f)
            f.flush()
            os.fsync(f.fileno())
        dt = time.perf_counter() - t0
        print(f"torch.save: {nbytes / 1e9:.2f} GB in {dt:.2f} s = {nbytes / dt / 1e9:.2f} GB/s (fsync'ed)")
    else:
        t0 = time.perf_counter()
        tensors = torch.load(path)
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        dt = time.perf_counter() - t0
        print(f"torch.load: {nbytes / 1e9:.2f} GB in {dt:.2f} s = {nbytes / dt / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
