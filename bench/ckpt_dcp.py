"""shardwise.checkpoint against torch.distributed.checkpoint (DCP), side by side in one run.

A 4-process torchrun job (gloo, CPU) holds a GPT-2 124M-shaped state dict FSDP-style (every
tensor Shard(0) over the 4 ranks, torch.chunk's cut) plus AdamW's exp_avg / exp_avg_sq, ~1.49 GB,
and saves it with shardwise.checkpoint.save (group: TorchGroup) and with dcp.save (DTensors). Then
2-process jobs (fresh processes for each) load each checkpoint twice: as Shard(1) (1-D tensors Shard(0)) and as whole
tensors; every value is compared bit for bit with the originals (regenerated from a seed per
tensor). Finally transformers' AutoModelForCausalLM.from_pretrained loads the model part of the
shardwise checkpoint: no missing keys, and the embedding equals the original.

GB/s is 1e9 bytes / s: for a save, the checkpoint's tensor bytes over the wall time from a barrier
before to a barrier after; for a load, the bytes the ranks received (the whole checkpoint once for
Shard(1), once per rank for whole tensors) over the same kind of wall time; before each load the
page cache holds none of either checkpoint's files (evict() below). Peak RSS is the
largest VmHWM over the ranks, reset with /proc/self/clear_refs just before the load: the process's
baseline (Python, torch, shardwise) plus what the load held at its peak, the loaded tensors included.
CPU s is the load's CPU time (user + system) summed over its ranks: what it costs where the cores
are shared, whatever share of them the run got.

    python bench/ckpt_dcp.py --dir /tmp/ckpt_dcp [--rounds 1]    (CKPT_DCP_SMALL=1: a tiny GPT-2)    (python: a venv with torch,
    transformers, safetensors, numpy and shardwise installed; `make bench-ckpt-dcp` makes one)
"""
import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import zlib

GPT2 = dict(vocab=50257, n_positions=1024, n_embd=768, n_layer=12)
if os.environ.get("CKPT_DCP_SMALL"):  # a quick check of the script itself: a 2-layer, 64-wide GPT-2
    GPT2 = dict(vocab=1001, n_positions=128, n_embd=64, n_layer=2)


def gpt2_shapes():
    v, p, h, n = GPT2["vocab"], GPT2["n_positions"], GPT2["n_embd"], GPT2["n_layer"]
    out = {"transformer.wte.weight": (v, h), "transformer.wpe.weight": (p, h)}
    for i in range(n):
        pre = f"transformer.h.{i}."
        out.update({pre + "ln_1.weight": (h,), pre + "ln_1.bias": (h,), pre + "attn.c_attn.weight": (h, 3 * h),
                    pre + "attn.c_attn.bias": (3 * h,), pre + "attn.c_proj.weight": (h, h),
                    pre + "attn.c_proj.bias": (h,), pre + "ln_2.weight": (h,), pre + "ln_2.bias": (h,),
                    pre + "mlp.c_fc.weight": (h, 4 * h), pre + "mlp.c_fc.bias": (4 * h,),
                    pre + "mlp.c_proj.weight": (4 * h, h), pre + "mlp.c_proj.bias": (h,)})
    out.update({"transformer.ln_f.weight": (h,), "transformer.ln_f.bias": (h,)})
    return out


def original(torch, name, shape):
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(shape, generator=g, dtype=torch.float32)


def all_names():
    shapes = gpt2_shapes()
    names = dict(shapes)
    for n, s in shapes.items():
        names[n + "/exp_avg"] = s
        names[n + "/exp_avg_sq"] = s
    return names


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s():
    """This process's CPU time so far (user + system, every thread), in seconds."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(dist, fn, cpu=None):
    """fn()'s result and wall seconds between barriers; with a dict `cpu`, cpu["s"] gets this
    process's CPU seconds in fn() (on a machine whose cores are all busy, the wall time is mostly
    the share of them the processes got; the CPU time is what the work costs)."""
    dist.barrier()
    t, c = time.perf_counter(), cpu_s()
    out = fn()
    if cpu is not None:
        cpu["s"] = cpu_s() - c
    dist.barrier()
    return out, time.perf_counter() - t


def phase_save(args):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard as TShard
    import shardwise as sw
    from shardwise import checkpoint as ckpt

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    local = {name: original(torch, name, s).chunk(n)[rank].clone() for name, s in all_names().items()}
    model = {k: v for k, v in local.items() if "/" not in k}
    moments = {k: v for k, v in local.items() if "/" in k}
    total = sum(4 * torch.Size(s).numel() for s in all_names().values())
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": GPT2["vocab"],
              "n_positions": GPT2["n_positions"], "n_embd": GPT2["n_embd"], "n_layer": GPT2["n_layer"],
              "n_head": GPT2["n_embd"] // 64, "tie_word_embeddings": True, "torch_dtype": "float32"}
    results = {}
    sw_dir, dcp_dir = os.path.join(args.dir, "sw"), os.path.join(args.dir, "dcp")
    saved, results["sw_save_s"] = timed(dist, lambda: ckpt.save(
        model, sw_dir, {"fsdp": n}, [sw.Shard(0)], rank, group=ckpt.TorchGroup(), optimizer=moments,
        files={"config.json": config}))
    mesh = init_device_mesh("cpu", (n,))
    shapes = all_names()

    def dtensor(name, t):
        full = torch.Size(shapes[name])
        return DTensor.from_local(t, mesh, [TShard(0)], run_check=False, shape=full,
                                  stride=torch.empty(full, device="meta").stride())

    state = {"model": {k: dtensor(k, v) for k, v in model.items()},
             "optim": {k: dtensor(k, v) for k, v in moments.items()}}
    _, results["dcp_save_s"] = timed(dist, lambda: dcp.save(state, checkpoint_id=dcp_dir))
    if rank == 0:
        results.update(sw_dir=saved, total_bytes=total)
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def check(torch, name, got, rank, n, sharded):
    full = original(torch, name, all_names()[name])
    if sharded:
        full = full.chunk(n, dim=1 if full.dim() == 2 else 0)[rank]
    got = got if isinstance(got, torch.Tensor) else torch.from_numpy(got)
    assert got.shape == full.shape and torch.equal(got.contiguous().view(torch.int32),
                                                   full.contiguous().view(torch.int32)), f"{name} differs on {rank}"


def phase_load(args):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.distributed.tensor as dt
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard as TShard
    import shardwise as sw
    from shardwise import checkpoint as ckpt

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    names = all_names()
    sw_dir, dcp_dir = args.sw_dir, os.path.join(args.dir, "dcp")
    results = {}
    sharded, tag, who = args.layout == "shard1", args.layout, args.who
    place = {k: [sw.Shard(1) if len(s) == 2 else sw.Shard(0)] if sharded else [sw.Replicate()]
             for k, s in names.items()}

    def sw_load():
        m = ckpt.load(sw_dir, {"tp": n}, place, rank)
        m.update(ckpt.load(sw_dir, {"tp": n}, place, rank, group_name="optimizer"))
        return m

    def dcp_load():
        def target(k, s):
            if not sharded:
                return torch.empty(s)
            return dt.empty(s, device_mesh=mesh, placements=[TShard(1 if len(s) == 2 else 0)])
        state = {"model": {k: target(k, s) for k, s in names.items() if "/" not in k},
                 "optim": {k: target(k, s) for k, s in names.items() if "/" in k}}
        dcp.load(state, checkpoint_id=dcp_dir)
        flat = {**state["model"], **state["optim"]}
        return {k: (v.to_local() if sharded else v) for k, v in flat.items()}

    gc.collect()
    reset_peak()
    cpu = {}
    got, seconds = timed(dist, sw_load if who == "sw" else dcp_load, cpu)
    peak = peak_mib()
    got_bytes = sum(v.nbytes for v in got.values())
    for k, v in got.items():
        check(torch, k, v, rank, n, sharded)
    del got
    gathered = [None] * n
    dist.all_gather_object(gathered, (got_bytes, peak, cpu["s"]))
    results[f"{who}_load_{tag}_s"] = seconds
    results[f"{who}_load_{tag}_bytes"] = sum(b for b, _, _ in gathered)
    results[f"{who}_load_{tag}_peak_mib"] = max(p for _, p, _ in gathered)
    results[f"{who}_load_{tag}_cpu_s"] = sum(c for _, _, c in gathered)
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def phase_hf(args):
    import torch
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(args.sw_dir, output_loading_info=True)
    missing = [k for k in info["missing_keys"]]
    wte = model.transformer.wte.weight.detach()
    same = torch.equal(wte, original(torch, "transformer.wte.weight", tuple(wte.shape)))
    print("RESULT " + json.dumps({"hf_missing_keys": missing, "hf_unexpected_keys": list(info["unexpected_keys"]),
                                  "hf_wte_equal": bool(same)}), flush=True)
    assert not missing and same, (missing, same)


def evict(root):
    """Drops the page-cache pages of every file under `root` (synced first), so that every load
    reads from the disk: shardwise's save writes with direct I/O, DCP's through the page cache, and
    a load right after a save would otherwise read DCP's checkpoint from memory."""
    for d, _, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):])


def torchrun(nproc, *args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", __file__,
            *args]


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def report(r):
    total = r["total_bytes"]
    rows = [("save, 4 ranks Shard(0)", gbps(total, r["sw_save_s"]), gbps(total, r["dcp_save_s"]), "", "", "", "")]
    for tag, what in (("shard1", "load on 2 ranks, Shard(1)"), ("whole", "load on 2 ranks, whole tensors")):
        rows.append((what, gbps(r[f"sw_load_{tag}_bytes"], r[f"sw_load_{tag}_s"]),
                     gbps(r[f"dcp_load_{tag}_bytes"], r[f"dcp_load_{tag}_s"]),
                     f"{r[f'sw_load_{tag}_peak_mib']:.0f}", f"{r[f'dcp_load_{tag}_peak_mib']:.0f}",
                     f"{r[f'sw_load_{tag}_cpu_s']:.2f}", f"{r[f'dcp_load_{tag}_cpu_s']:.2f}"))
    print(f"checkpoint: {total / 1e9:.3f} GB of tensors (GPT-2, {GPT2['n_layer']} layers x {GPT2['n_embd']}, + AdamW moments, f32)")
    print("| what | shardwise GB/s | DCP GB/s | shardwise / DCP | peak RSS MiB shardwise | DCP | CPU s shardwise | DCP |")
    print("|---|---|---|---|---|---|---|---|")
    for what, a, b, pa, pb, ca, cb in rows:
        print(f"| {what} | {a:.2f} | {b:.2f} | {a / b:.2f}x | {pa} | {pb} | {ca} | {cb} |")
    print(f"transformers from_pretrained: missing keys {r['hf_missing_keys']}, wte equal: {r['hf_wte_equal']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--phase", choices=["save", "load", "hf"])
    ap.add_argument("--sw-dir")
    ap.add_argument("--who", choices=["sw", "dcp"])
    ap.add_argument("--layout", choices=["shard1", "whole"])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    if args.phase:
        return {"save": phase_save, "load": phase_load, "hf": phase_hf}[args.phase](args)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in range(args.rounds):
        shutil.rmtree(args.dir, ignore_errors=True)
        os.makedirs(args.dir)
        r = run(torchrun(4, "--phase", "save", "--dir", args.dir), env)
        for layout in ("shard1", "whole"):  # each load in fresh processes: its own peak RSS
            for who in ("sw", "dcp"):
                evict(args.dir)
                r.update(run(torchrun(2, "--phase", "load", "--dir", args.dir, "--sw-dir", r["sw_dir"], "--who", who,
                                      "--layout", layout), env))
        r.update(run([sys.executable, __file__, "--phase", "hf", "--dir", args.dir, "--sw-dir", r["sw_dir"]], env))
        print(f"round {k + 1} of {args.rounds}, {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
        report(r)
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
