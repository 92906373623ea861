#!/usr/bin/env python3
"""The GPU-against-CPU curve check of issue 34 (docs/gpu.md), run by tools/gpu_check.sh: 20 steps of
a small GPT-2, a small Llama and a small Mixtral (Llama with 4 experts, top 2) on one rank, dp=2 and
tp=2, and the Mixtral on ep=2 (its experts and tokens over 2 ranks) (rank threads; on the GPU all
sharing one card), once on the host and once with `--device cuda`; every step's loss must agree within
--tol (1e-4; TF32 stays off, shardwise's default). Prints one line per run and exits 1 when a
curve differs or a run fails.

    python3 tools/gpu_curves.py build/bin/shardwise            # host against cuda
    python3 tools/gpu_curves.py build/bin/shardwise --b host   # host against host: the harness alone
    python3 tools/gpu_curves.py build/bin/shardwise --b fake --tol 0   # the tests' fake device: bit for bit

"host" runs without --device; any other name runs with --device NAME (cuda, cuda:N, fake).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

MODELS = {
    "gpt2": ["--model", "gpt2", "--layers", "2", "--heads", "4", "--hidden", "64", "--vocab", "128"],
    "llama": ["--model", "llama", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--hidden", "64", "--vocab", "128"],
    "mixtral": ["--model", "llama", "--experts", "4", "--top-k", "2", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                "--hidden", "64", "--vocab", "128"],
}
MESHES = {"1": [], "dp=2": ["--mesh", "dp=2"], "tp=2": ["--mesh", "tp=2"], "ep=2": ["--mesh", "ep=2"]}
MOE = {"mixtral"}  # the models an ep mesh takes (the others' pairs with ep are left out)


def losses(binary, model, mesh, device, steps, timeout):
    run_dir = tempfile.mkdtemp(prefix="sw_curve_")
    cmd = [binary, "train", *MODELS[model], *MESHES[mesh], "--steps", str(steps), "--seed", "1", "--run-dir", run_dir]
    if device != "host":
        cmd += ["--device", device]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"`{' '.join(cmd)}` failed (rc {p.returncode}): {tail[0]}")
        rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if line.strip()]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("shardwise", help="the shardwise binary")
    a.add_argument("--a", default="host", help="the reference device (host: no --device)")
    a.add_argument("--b", default="cuda", help="the device checked against it")
    a.add_argument("--steps", type=int, default=20)
    a.add_argument("--tol", type=float, default=1e-4)
    a.add_argument("--models", default="gpt2,llama,mixtral")
    a.add_argument("--meshes", default="1,dp=2,tp=2,ep=2")
    a.add_argument("--timeout", type=float, default=60, help="seconds per run")
    o = a.parse_args()
    bad = [m for m in o.models.split(",") if m not in MODELS] + [m for m in o.meshes.split(",") if m not in MESHES]
    if bad:
        sys.exit(f"gpu_curves.py: unknown model or mesh: {', '.join(bad)} (models: {', '.join(MODELS)}; meshes: "
                 f"{', '.join(MESHES)})")
    failed = 0
    for model in o.models.split(","):
        for mesh in o.meshes.split(","):
            if mesh.startswith("ep=") and model not in MOE:
                continue
            label = f"curve {model} mesh {mesh}: {o.b} against {o.a}"
            try:
                ref = losses(o.shardwise, model, mesh, o.a, o.steps, o.timeout)
                got = losses(o.shardwise, model, mesh, o.b, o.steps, o.timeout)
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
                print(f"{label}: FAILED: {e}")
                failed += 1
                continue
            if sorted(ref) != sorted(got) or len(ref) != o.steps:
                print(f"{label}: FAILED: steps {sorted(ref)[:3]}... against {sorted(got)[:3]}... ({len(ref)}, {len(got)} steps)")
                failed += 1
                continue
            worst = max(abs(ref[s] - got[s]) for s in ref)
            ok = worst <= o.tol
            failed += not ok
            print(f"{label}: {'ok' if ok else 'FAILED'}, largest loss difference {worst:.3g} over {len(ref)} steps "
                  f"(tolerance {o.tol:g})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
