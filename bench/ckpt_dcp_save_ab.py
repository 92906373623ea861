"""The save of bench/ckpt_dcp.py alone, three rounds, shardwise.checkpoint and DCP alternating which
goes first: is the save's ratio to DCP bound by the disk? (BENCHMARKS.md, 2026-11-29 05:50.)

    torchrun --nproc-per-node 4 bench/ckpt_dcp_save_ab.py DIR    (python: the venv of make bench-ckpt-dcp)
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_dcp as B  # noqa: E402
def main():
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard as TShard
    import shardwise as sw
    from shardwise import checkpoint as ckpt
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    local = {name: B.original(torch, name, s).chunk(n)[rank].clone() for name, s in B.all_names().items()}
    model = {k: v for k, v in local.items() if "/" not in k}
    moments = {k: v for k, v in local.items() if "/" in k}
    total = sum(4 * torch.Size(s).numel() for s in B.all_names().values())
    mesh = init_device_mesh("cpu", (n,))
    shapes = B.all_names()
    def dtensor(name, t):
        full = torch.Size(shapes[name])
        return DTensor.from_local(t, mesh, [TShard(0)], run_check=False, shape=full, stride=torch.empty(full, device="meta").stride())
    state = {"model": {k: dtensor(k, v) for k, v in model.items()}, "optim": {k: dtensor(k, v) for k, v in moments.items()}}
    base = sys.argv[1]
    for r in range(3):
        for who in (["dcp", "sw"] if r % 2 else ["sw", "dcp"]):
            d = os.path.join(base, f"{who}{r}")
            if who == "sw":
                _, t = B.timed(dist, lambda: ckpt.save(model, d, {"fsdp": n}, [sw.Shard(0)], rank, group=ckpt.TorchGroup(), optimizer=moments))
            else:
                _, t = B.timed(dist, lambda: dcp.save(state, checkpoint_id=d))
            if rank == 0: print(f"round {r} {who}: {t:.3f} s = {total/t/1e9:.2f} GB/s", flush=True)
            dist.barrier()
            if rank == 0: shutil.rmtree(d, ignore_errors=True)
            dist.barrier()
    dist.destroy_process_group()
main()
