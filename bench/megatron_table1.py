#!/usr/bin/env python3
"""The step-time model at cluster scale, on paper (docs/planner.md): the analytic per-layer model
(`plan --predict --analytic`, what `plan --auto` uses above 64 devices) against two published tables.

1. Narayanan et al., SC'21 (arXiv 2104.04473) Table 1: ten GPT models of 1.7 B to 1 T parameters on
   32 to 3,072 A100s, on examples/clusters/a100-80gb-dgx.json with the paper's t, p, GPUs and batch.
   What the table does not give is set as Megatron-LM ran then: micro-batch 1, full recompute (the
   paper's FLOP count, its eq. 3, assumes it), the interleaved schedule (section 2.2.2) with 2
   virtual stages a rank where a stage's layers are even, else 3 (76.1 B's 15 and 529.6 B's 3
   layers a stage), the pipeline scatter/gather of section 4.1, the unfused attention core (2021:
   scores materialized, before flash attention), no sequence parallelism, no sharded optimizer,
   bf16, sequence 2048, vocabulary 51,200. TFLOP/s per GPU is the paper's eq. 3:
   96 B s l h^2 (1 + s / 6h + V / 16 l h) over the predicted step and the GPUs.
2. The Llama 3 paper (arXiv 2407.21783) Table 4: Llama 3 405B (126 layers, hidden 16384, 128 heads,
   8 key/value heads, SwiGLU 53248, vocabulary 128256, untied head) on examples/clusters/h100-80gb.json:
   8,192 GPUs TP8 PP16 DP64 at 8 K (430 TFLOP/s per GPU), 16,384 GPUs DP128 (400), and 16,384 GPUs
   TP8 CP16 PP16 DP8 at 128 K (380); 16 M tokens a batch. Set where the table is silent: micro-batch 1,
   no recompute (section 3.3.2 trains 8 K without activation checkpointing), sequence parallelism,
   the optimizer states sharded over the data ranks (stage 1), fused (flash) attention, and the
   interleaved schedule with 4 virtual stages (126 layers: 2 a chunk but 1 in the first and the last,
   as train splits them: 8 on the middle ranks, 7 on the first and last, as Llama 3's stages; 2
   virtual stages are printed beside it). TFLOP/s per GPU is model FLOPs:
   6 x (the matmul parameters, the head included) + 6 l s h (causal attention) a token, no recompute.

One efficiency factor, `compute`, is fitted by bisection on one named row, FIT_ROW (18.4 B: the
largest row without a pipeline, so its step has no bubble and no pipeline messages, only compute,
memory-bound kernels, tp all-reduces and the gradient sync), and kept fixed for every other row of
both tables (the H100 reuses the A100's: the share of its peak the GEMMs reach is taken as the same);
`memory` and `network` stay 1. A row is "within 15%" when its predicted TFLOP/s per GPU is. Then
`plan --auto --analytic` searches each row's job on its GPUs (memory within 90% of 80 GB): its best,
its TFLOP/s by the same formula, whether it predicts at least the paper's configuration, and what it
changed. Beside the analytic memory, each row's memory from the compiled programs: `plan --memory
--symmetric` on the paper's configuration (each stage of the first rank of every pipeline rank
compiled, shapes only, and its memory plan's peak; the other ranks hold the same shapes), the
largest rank's peak and the seconds it took; rows over MEMORY_SECONDS (default 300) say so.

    python3 bench/megatron_table1.py [BUILD_DIR=build] [MEMORY_SECONDS=300]
    (several minutes: plan --auto and the compiled memory plan of each row)
"""
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
SW = os.path.join(BUILD, "bin", "shardwise")
MEMORY_SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 300
A100 = os.path.join(ROOT, "examples", "clusters", "a100-80gb-dgx.json")
H100 = os.path.join(ROOT, "examples", "clusters", "h100-80gb.json")
FIT_ROW = "18.4B"
# name, heads, hidden, layers, tp, pp, GPUs, batch, paper TFLOP/s per GPU
TABLE1 = [
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
# name, GPUs, tp, cp, pp, dp, seq, batch (sequences), paper TFLOP/s per GPU
TABLE4 = [
    ("405B 8K", 8192, 8, 1, 16, 64, 8192, 2048, 430),
    ("405B 8K", 16384, 8, 1, 16, 128, 8192, 2048, 400),
    ("405B 128K", 16384, 8, 16, 16, 8, 131072, 128, 380),
]
LLAMA = dict(layers=126, hidden=16384, heads=128, kv=8, ffn=53248, vocab=128256)
PARTS = ["compute", "memory_bound", "tp_all_reduce", "cp_exchange", "pp_send", "bubble", "grad_sync"]


def cluster_file(preset, compute, directory):
    c = json.load(open(preset))
    c["efficiency"] = {"compute": compute}
    path = os.path.join(directory, f"{c['name']}_{compute:.6f}.json")
    json.dump(c, open(path, "w"))
    return path


def run_json(args):
    return json.loads(subprocess.run([SW] + args, check=True, capture_output=True, text=True).stdout)


class Table1Row:
    def __init__(self, row):
        self.name, heads, hidden, layers, self.tp, self.pp, self.gpus, self.batch, self.paper = row
        self.model = ["--layers", str(layers), "--hidden", str(hidden), "--heads", str(heads), "--seq", "2048",
                      "--vocab", "51200", "--global-batch", str(self.batch), "--bf16", "--compute", "bf16",
                      "--attention", "unfused"]
        self.flops = 96 * self.batch * 2048 * layers * hidden ** 2 * (1 + 2048 / (6 * hidden) + 51200 / (16 * layers * hidden))
        dp = self.gpus // (self.tp * self.pp)
        self.paper_options = {"--mesh": ",".join(f"{k}={v}" for k, v in (("pp", self.pp), ("dp", dp), ("tp", self.tp))
                                                 if v > 1), "--micro-batch": "1", "--recompute": "full"}
        if self.pp > 1:
            self.paper_options.update({"--schedule": "interleaved", "--virtual": "2" if layers // self.pp % 2 == 0 else "3"})


class Table4Row:
    def __init__(self, row, virtual=4):
        self.name, self.gpus, tp, cp, pp, dp, seq, self.batch, self.paper = row
        m = LLAMA
        self.model = ["--model", "llama", "--layers", str(m["layers"]), "--hidden", str(m["hidden"]), "--heads",
                      str(m["heads"]), "--kv-heads", str(m["kv"]), "--intermediate-size", str(m["ffn"]), "--vocab",
                      str(m["vocab"]), "--untied-head", "--seq", str(seq), "--global-batch", str(self.batch), "--bf16",
                      "--compute", "bf16"]
        d = m["hidden"] // m["heads"]
        matmul = m["layers"] * (m["hidden"] * d * (m["heads"] + 2 * m["kv"]) + m["heads"] * d * m["hidden"] +
                                3 * m["hidden"] * m["ffn"]) + m["vocab"] * m["hidden"]
        self.flops = self.batch * seq * (6 * matmul + 6 * m["layers"] * seq * m["hidden"])
        mesh = f"pp={pp},dp={dp}" + (f",cp={cp}" if cp > 1 else "") + f",tp={tp}"
        self.paper_options = {"--mesh": mesh, "--sp": "", "--sharding-stage": "1", "--micro-batch": "1",
                              "--recompute": "none", "--schedule": "interleaved", "--virtual": str(virtual)}


def options_list(options):
    out = []
    for k, v in options.items():
        out += [k] + ([v] if v else [])
    return out


def predict(row, cluster):
    j = run_json(["plan", "--predict", "--analytic", "--json", "--cluster", cluster, "--ranks", str(row.gpus)] +
                 row.model + options_list(row.paper_options))
    return row.flops / j["step_time_s"] / row.gpus / 1e12, j


def fit(row, preset, d):
    lo, hi = 0.05, 1.0
    for _ in range(30):  # TFLOP/s grows with the factor
        mid = (lo + hi) / 2
        if predict(row, cluster_file(preset, mid, d))[0] < row.paper:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def parse_options(text):
    words, out, i = text.split(), {}, 0
    while i < len(words):
        has_value = i + 1 < len(words) and not words[i + 1].startswith("--")
        out[words[i]] = words[i + 1] if has_value else ""
        i += 2 if has_value else 1
    return out


def changed(paper, auto):
    """The options auto's choice sets otherwise than the paper's ("sp off -> on"); the batch split's
    accumulation and the gradient buckets follow from the rest."""
    defaults = {"--sharding-stage": "0", "--recompute": "none", "--schedule": "1f1b", "--virtual": "1"}
    value = lambda options, k: ("on" if options[k] == "" else options[k]) if k in options else defaults.get(k, "off")
    out = [f"{k[2:]} {value(paper, k)} -> {value(auto, k)}" for k in sorted(set(paper) | set(auto))
           if k not in ("--accumulation", "--overlap-grad-reduce") and value(paper, k) != value(auto, k)]
    return "; ".join(out) or "nothing"


def compiled_memory(row):
    """The largest rank's peak (GiB) of the paper configuration's compiled programs and the seconds it
    took, or None and why not."""
    args = [SW, "plan", "--memory", "--symmetric", "--json", "--memory-limit", "none", "--ranks", str(row.gpus)]
    args += row.model + options_list(row.paper_options)
    start = time.monotonic()
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=MEMORY_SECONDS)
    except subprocess.TimeoutExpired:
        return None, f"over {MEMORY_SECONDS:.0f} s"
    seconds = time.monotonic() - start
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["failed"])[-1][:60]
    peak = max(rank["peak"] for rank in json.loads(r.stdout)["ranks"])
    return peak / 2**30, f"{seconds:.1f} s"


def auto_best(row, cluster):
    j = run_json(["plan", "--auto", "--analytic", "--json", "--top", "1", "--cluster", cluster, "--devices",
                  str(row.gpus)] + row.model)
    best = j["candidates"][0]
    return row.flops / best["step_time_s"] / row.gpus / 1e12, best, j


def shares(j):
    return " ".join(f"{j['shares'].get(p, 0):.3f}" for p in PARTS)


def report(rows, cluster, fitted=None):
    print(f"{'row':>10} {'GPUs':>5} {'paper':>5} {'model':>6} {'error':>7} {'GiB':>5} {'plan GiB (x analytic)':>24}  "
          f"{' '.join(p[:8] for p in PARTS)}  {'auto':>6} {'GiB':>5}  auto's choice: what it changed")
    within, at_least = 0, 0
    for row in rows:
        t, j = predict(row, cluster)
        err = t / row.paper - 1
        within += row.name != fitted and abs(err) <= 0.15
        auto, best, search = auto_best(row, cluster)
        at_least += auto >= t * (1 - 1e-9)
        planned, note = compiled_memory(row)
        ratio = f"{planned * 2**30 / j['memory_bytes']:.2f}x, " if planned is not None else ""
        planned = f"{planned:.1f} ({ratio}{note})" if planned is not None else f"- ({note})"
        print(f"{row.name:>10} {row.gpus:>5} {row.paper:>5} {t:>6.1f} {err:>+7.1%} {j['memory_bytes'] / 2**30:>5.1f} "
              f"{planned:>24}  "
              f"{shares(j)}  {auto:>6.1f} {best['memory_bytes'] / 2**30:>5.1f}  "
              f"{changed(row.paper_options, parse_options(best['train_options']))}"
              f" ({search['searched']} combinations, {search['seconds']:.1f} s)" + ("  (fitted)" if row.name == fitted else ""))
    return within, at_least


def main():
    with tempfile.TemporaryDirectory() as d:
        table1 = [Table1Row(r) for r in TABLE1]
        compute = fit(next(r for r in table1 if r.name == FIT_ROW), A100, d)
        print(f"compute efficiency fitted on the {FIT_ROW} row: {compute:.4f}; memory and network 1")
        print("Narayanan et al. Table 1, A100 preset (shares of the step: " + ", ".join(PARTS) + ")")
        within, at_least = report(table1, cluster_file(A100, compute, d), FIT_ROW)
        print(f"within 15% of the paper, of the {len(table1) - 1} rows not fitted: {within}; plan --auto at least the "
              f"paper's configuration: {at_least} of {len(table1)}")
        print("Llama 3 Table 4, H100 preset, the same compute factor (no fit)")
        h100 = cluster_file(H100, compute, d)
        within, at_least = report([Table4Row(r) for r in TABLE4], h100)
        print(f"within 15%: {within} of {len(TABLE4)}; plan --auto at least the paper's configuration: {at_least} of "
              f"{len(TABLE4)}")
        for row in (Table4Row(r, virtual=2) for r in TABLE4):
            t, j = predict(row, h100)
            print(f"  with 2 virtual stages: {row.name} on {row.gpus}: {t:.1f} TFLOP/s ({t / row.paper - 1:+.1%}), "
                  f"{j['memory_bytes'] / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
