#!/usr/bin/env python3
"""The GPU machine's scripts without a GPU and without PyTorch (torch is never imported here; the
PyTorch rows' own CPU run is `make gpu-bench-smoke`):

- bench/gpu_vs_torch.py's model shapes give the published parameter counts (GPT-2 124M:
  124,439,808; Llama 3.2 1B: 1,235,814,400), its peak table picks the card's dense bf16 peak, and
  MFU is tokens/s x FLOPs per token / peak;
- its shardwise rows: "shardwise: not yet supported" when `train --help` lacks --device, and
  otherwise the median tokens/s after the warm-up from metrics.jsonl of a (fake) binary, run with
  --device cuda and --bf16 --compute bf16 (bf16 GEMMs and attention, as PyTorch's autocast rows);
- tools/gpu_curves.py passes equal curves and fails, naming the run, curves that differ by more
  than the tolerance.

    python3 tests/gpu_deps/test_gpu_scripts.py ROOT
"""
import importlib.util
import os
import stat
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))

# A shardwise stand-in: `train --help` lists --device when FAKE_DEVICE is set; `train ... --run-dir
# D --steps N` writes N metrics rows (tokens/s 1000 x step, doubled with --device cuda; loss 1/step,
# plus FAKE_SHIFT with --device); a --bf16 run without --compute bf16 (bf16 storage, f32 kernels: no
# GPU figure) fails.
FAKE = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, sys
    a = sys.argv[1:]
    if a[:2] == ["train", "--help"]:
        print("Options:\\n  --steps INT\\n" + ("  --device TEXT   where the run's tensors live\\n" if os.environ.get("FAKE_DEVICE") else ""))
        sys.exit(0)
    d, n = a[a.index("--run-dir") + 1], int(a[a.index("--steps") + 1])
    if "--bf16" in a and ("--compute" not in a or a[a.index("--compute") + 1] != "bf16"):
        sys.exit("fake shardwise: --bf16 without --compute bf16 computes in f32")
    shift = float(os.environ.get("FAKE_SHIFT", "0")) if "--device" in a else 0.0
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for s in range(1, n + 1):
            rate = 1000.0 * s * (2 if "--device" in a and a[a.index("--device") + 1] == "cuda" else 1)
            f.write(json.dumps({"step": s, "loss": 1.0 / s + shift, "tokens_per_s": rate}) + "\\n")
    """)


def load_bench():
    spec = importlib.util.spec_from_file_location("gpu_vs_torch", os.path.join(ROOT, "bench", "gpu_vs_torch.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    assert "torch" not in sys.modules, "gpu_vs_torch.py imports torch at its top"
    return m


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def test_shapes_and_peaks(m):
    # Everything but the matmul weights (LM head tied to the embedding, counted once): GPT-2's
    # learned positions, LayerNorms and biases; Llama's RMSNorms.
    g = m.MODELS["gpt2-124m"]
    h, f = g["hidden"], g["ffn"]
    gpt2_rest = g["seq"] * h + g["layers"] * (2 * 2 * h + 4 * h + f + h) + 2 * h
    check(m.matmul_weights(g) + gpt2_rest == 124_439_808, f"GPT-2 124M: {m.matmul_weights(g) + gpt2_rest} parameters")
    ll = m.MODELS["llama-1b"]
    llama_rest = ll["layers"] * 2 * ll["hidden"] + ll["hidden"]
    check(m.matmul_weights(ll) + llama_rest == 1_235_814_400, f"Llama 1B: {m.matmul_weights(ll) + llama_rest} parameters")
    check(m.flops_per_token(g) == 6 * m.matmul_weights(g) + 12 * 12 * 768 * 1024, "GPT-2 FLOPs per token")
    check(m.peak_tflops("NVIDIA H200") == (989.0, "H200"), m.peak_tflops("NVIDIA H200"))
    check(m.peak_tflops("NVIDIA H100 80GB HBM3") == (989.0, "H100"), m.peak_tflops("NVIDIA H100 80GB HBM3"))
    check(m.peak_tflops("NVIDIA H100 PCIe") == (756.0, "H100 PCIe"), m.peak_tflops("NVIDIA H100 PCIe"))
    check(m.peak_tflops("Tesla T4")[0] is None, "an unknown card gets no peak")
    line = m.fmt_row("x", {"tokens_per_s": 100000.0, "card": "NVIDIA H200", "peak_bytes": 2**31}, g)
    mfu = 100 * 100000.0 * m.flops_per_token(g) / 989e12
    check(f"MFU {mfu:5.1f}%" in line and "2.00 GiB" in line, line)


def run_bench(tmp, fake, env_extra):
    env = dict(os.environ, **env_extra)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_vs_torch.py"), "--modes", "", "--models",
                        "gpt2-124m", "--steps", "4", "--warmup", "2", "--shardwise", fake, "--summary",
                        os.path.join(tmp, "summary.txt")], capture_output=True, text=True, env=env, timeout=60)
    check(p.returncode == 0, f"gpu_vs_torch.py failed: {p.stderr}")
    return p.stdout


def test_shardwise_rows(tmp, fake):
    out = run_bench(tmp, fake, {})
    check("gpt2-124m shardwise --device cuda" in out and "shardwise: not yet supported (train has no --device option)"
          in out, out)
    check("tok/s" not in out, "a figure without a run:\n" + out)
    out = run_bench(tmp, fake, {"FAKE_DEVICE": "1"})
    # Steps 3..6 are timed (2 warm-up): rates 2 x (3000..6000) with --device cuda, median the upper
    # middle, 10000.
    check("10000 tok/s" in out and "(not reported)" in out, out)
    check(out.strip() in open(os.path.join(tmp, "summary.txt")).read(), "the table is not in --summary")


def test_curves(fake):
    def curves(shift):
        env = dict(os.environ, FAKE_DEVICE="1", FAKE_SHIFT=shift)
        return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gpu_curves.py"), fake, "--models", "gpt2",
                               "--meshes", "1,tp=2"], capture_output=True, text=True, env=env, timeout=60)
    p = curves("0.00005")
    check(p.returncode == 0 and p.stdout.count(": ok,") == 2, p.stdout + p.stderr)
    p = curves("0.001")
    check(p.returncode == 1 and "curve gpt2 mesh tp=2: cuda against host: FAILED, largest loss difference 0.001"
          in p.stdout, p.stdout + p.stderr)


def main():
    m = load_bench()
    test_shapes_and_peaks(m)
    with tempfile.TemporaryDirectory() as tmp:
        fake = os.path.join(tmp, "shardwise")
        with open(fake, "w") as f:
            f.write(FAKE)
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)
        test_shardwise_rows(tmp, fake)
        test_curves(fake)
    print("gpu scripts: ok")


if __name__ == "__main__":
    main()
