#!/usr/bin/env python3
"""PyTorch DTensor's per-op cost on a simulated [2, 4] mesh, for the rule-call comparison in
BENCHMARKS.md ("SPMD rule inference").

Rank 0 of a fake 8-rank process group (torch's FakeStore/"fake" backend: collectives do nothing), so
only DTensor's own work is timed. For each op, with the placements of bench/bench_rules.cc's rows:
  warm     — a DTensor op call minus the same op on the local tensors (dispatch + cached propagation +
             wrapping), median of rounds;
(all three are the CPU time of the calling thread, so a busy machine does not inflate them)
  cached   — ShardingPropagator.propagate_op_sharding on the op's schema (an LRU-cache hit);
  uncached — propagate_op_sharding_non_cached (the strategy search a cache miss runs).
Run: build/hf-venv/bin/python bench/dtensor_overhead.py   (any venv with torch 2.x)
"""
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore


def per_call_us(fn, calls, rounds=7):
    fn()
    times = []
    for _ in range(rounds):
        t = time.thread_time()
        for _ in range(calls):
            fn()
        times.append((time.thread_time() - t) / calls * 1e6)
    return statistics.median(times)


def main():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    mesh = init_device_mesh("cpu", (2, 4))
    torch.set_num_threads(1)

    def dt(shape, placements):
        local = torch.randn(shape)
        return DTensor.from_local(local, mesh, placements, run_check=False)

    # Small local blocks: the figure is DTensor's overhead, not the kernel.
    cases = [
        ("unary gelu [S(0),P(sum)]", torch.ops.aten.gelu.default,
         lambda: (dt((4, 8, 16), [Shard(0), Partial()]),)),
        ("unary gelu [S(0),S(1)]", torch.ops.aten.gelu.default,
         lambda: (dt((4, 8, 16), [Shard(0), Shard(1)]),)),
        ("binary add with broadcast [S(0),S(2)] + [R,S(0)]", torch.ops.aten.add.Tensor,
         lambda: (dt((4, 8, 4), [Shard(0), Shard(2)]), dt((2, 16), [Replicate(), Shard(0)]))),
        ("reduction sum axis=[1] [S(0),S(1)]", torch.ops.aten.sum.dim_IntList,
         lambda: (dt((4, 8, 16), [Shard(0), Shard(1)]), [1])),
        ("matmul column-parallel [S(0),R]·[R,S(1)]", torch.ops.aten.mm.default,
         lambda: (dt((8, 16), [Shard(0), Replicate()]), dt((16, 8), [Replicate(), Shard(1)]))),
        ("matmul row-parallel [S(0),S(1)]·[R,S(0)]", torch.ops.aten.mm.default,
         lambda: (dt((8, 4), [Shard(0), Shard(1)]), dt((4, 8), [Replicate(), Shard(0)]))),
    ]
    prop = DTensor._op_dispatcher.sharding_propagator
    dispatcher = DTensor._op_dispatcher
    print(f"torch {torch.__version__}; fake 8-rank group, mesh [2, 4], one thread")
    print(f"{'op':52s} {'warm µs':>9s} {'cached µs':>10s} {'uncached µs':>12s}")
    for name, op, make in cases:
        args = make()
        local = tuple(a.to_local() if isinstance(a, DTensor) else a for a in args)
        if op is torch.ops.aten.add.Tensor:  # the local blocks do not broadcast: time x + x
            local = (local[0], local[0])
        warm = per_call_us(lambda: op(*args), 300) - per_call_us(lambda: op(*local), 300)
        info = dispatcher.unwrap_to_op_info(op, args, {})
        cached = per_call_us(lambda: prop.propagate_op_sharding(info.schema), 3000)
        uncached = per_call_us(lambda: prop.propagate_op_sharding_non_cached(info.schema), 20, rounds=5)
        print(f"{name:52s} {warm:9.1f} {cached:10.2f} {uncached:12.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
