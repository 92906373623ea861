#!/usr/bin/env python3
"""The step-time model at cluster scale, on paper (docs/planner.md): the ten rows of Narayanan et al.,
SC'21 (arXiv 2104.04473) Table 1, GPT models of 1.7 B to 1 T parameters on 32 to 3,072 A100s, each
predicted by `shardwise plan --predict` (the compiled programs: one per pipeline rank) on the A100
preset with the paper's tensor and pipeline sizes and batch, and its TFLOP/s per GPU set beside the
paper's.

Fixed choices (the table does not give them): micro-batch 1, full recompute (the paper's FLOP count
assumes it), bf16, the 1F1B schedule, the gradient buckets reducing once a step, sequence 2048,
vocabulary 51,200. TFLOP/s per GPU is the paper's formula (its eq. 3): 96 B s l h^2 (1 + s / 6h +
V / 16 l h) over the predicted step and the GPUs.

Each row is predicted twice: by the compiled programs and by the analytic per-layer model
(`plan --predict --analytic`, what `plan --auto` uses at this scale). For each model one efficiency
factor, `compute`, is fitted on one named row (FIT_ROW, the 1.7 B row: data parallelism only, the
least communication) by bisection and kept for the other nine; the others stay 1. A row "within 15%"
predicts TFLOP/s per GPU within 15% of the paper's. Then `plan --auto` searches each row's job on its
GPUs of the analytic model's fitted cluster: its best candidate (memory within 90% of 80 GB), its
TFLOP/s by the same formula, and whether it predicts at least the paper's configuration.

    python3 bench/megatron_table1.py [BUILD_DIR=build]   (about a minute: plan --auto over each row)
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
SW = os.path.join(BUILD, "bin", "shardwise")
PRESET = os.path.join(ROOT, "examples", "clusters", "a100-80gb-dgx.json")
SEQ, VOCAB = 2048, 51200
FIT_ROW = "1.7B"
# name, heads, hidden, layers, tp, pp, GPUs, batch, paper TFLOP/s per GPU
ROWS = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("1T", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]


def cluster_file(compute, directory):
    c = json.load(open(PRESET))
    c["efficiency"] = {"compute": compute}
    path = os.path.join(directory, f"a100_{compute:.6f}.json")
    json.dump(c, open(path, "w"))
    return path


def model_args(row):
    name, heads, hidden, layers, tp, pp, gpus, batch, _ = row
    return ["--layers", str(layers), "--hidden", str(hidden), "--heads", str(heads), "--seq", str(SEQ), "--vocab",
            str(VOCAB), "--global-batch", str(batch), "--bf16"]


def paper_tflops(row, step):
    name, heads, hidden, layers, tp, pp, gpus, batch, _ = row
    flops = 96 * batch * SEQ * layers * hidden ** 2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))
    return flops / step / gpus / 1e12


def tflops_per_gpu(row, cluster, analytic=False):
    name, heads, hidden, layers, tp, pp, gpus, batch, _ = row
    dp = gpus // (tp * pp)
    mesh = ",".join(f"{k}={v}" for k, v in (("pp", pp), ("dp", dp), ("tp", tp)) if v > 1) or "dp=1"
    args = [SW, "plan", "--predict", "--json", "--cluster", cluster, "--mesh", mesh, "--ranks", str(gpus),
            "--micro-batch", "1", "--recompute", "full"] + model_args(row)
    if dp > 1:
        args += ["--overlap-grad-reduce", "on"]
    if analytic:
        args += ["--analytic"]
    step = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)["step_time_s"]
    return paper_tflops(row, step)


def fit(d, analytic):
    row = next(r for r in ROWS if r[0] == FIT_ROW)
    lo, hi = 0.05, 1.0
    for _ in range(30):  # TFLOP/s grows with the factor
        mid = (lo + hi) / 2
        if tflops_per_gpu(row, cluster_file(mid, d), analytic) < row[8]:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def auto_best(row, cluster):
    args = [SW, "plan", "--auto", "--analytic", "--json", "--top", "1", "--cluster", cluster, "--devices",
            str(row[6])] + model_args(row)
    j = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    best = j["candidates"][0]
    return paper_tflops(row, best["step_time_s"]), best, j["predicted"]


def main():
    with tempfile.TemporaryDirectory() as d:
        programs, analytic = fit(d, False), fit(d, True)
        fitted_p, fitted_a = cluster_file(programs, d), cluster_file(analytic, d)
        print(f"compute efficiency fitted on the {FIT_ROW} row: {programs:.4f} (programs), {analytic:.4f} (analytic)")
        print(f"{'row':>7} {'tp':>3} {'pp':>3} {'GPUs':>5} {'batch':>5} {'paper':>6} {'programs':>9} {'error':>7} "
              f"{'analytic':>9} {'error':>7} {'auto':>7}  auto's choice")
        within = {"programs": 0, "analytic": 0}
        at_least = 0
        for row in ROWS:
            p, a = tflops_per_gpu(row, fitted_p), tflops_per_gpu(row, fitted_a, True)
            ep, ea = p / row[8] - 1, a / row[8] - 1
            if row[0] != FIT_ROW:
                within["programs"] += abs(ep) <= 0.15
                within["analytic"] += abs(ea) <= 0.15
            auto, best, _ = auto_best(row, fitted_a)
            at_least += auto >= a * (1 - 1e-9)
            print(f"{row[0]:>7} {row[4]:>3} {row[5]:>3} {row[6]:>5} {row[7]:>5} {row[8]:>6} {p:>9.1f} {ep:>+7.1%} "
                  f"{a:>9.1f} {ea:>+7.1%} {auto:>7.1f}  {best['train_options']} "
                  f"({best['memory_bytes'] / 2**30:.1f} GiB)" + ("  (fitted)" if row[0] == FIT_ROW else ""))
        print(f"within 15% of the paper, of the {len(ROWS) - 1} rows not fitted: {within['programs']} (programs), "
              f"{within['analytic']} (analytic); plan --auto at least the paper's configuration (analytic): "
              f"{at_least} of {len(ROWS)}")


if __name__ == "__main__":
    main()
