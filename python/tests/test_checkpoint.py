"""shardwise.checkpoint: 4 Python processes save a sharded state dict (uneven dims, an optimizer
group) through a file rendezvous or a pure-Python group object, 2 processes load it on another
layout, bit for bit against the original arrays; the CLI verifies what Python saved; errors are
CheckpointError with the C++ message.

Run as a script, this file is one worker process: `python test_checkpoint.py save|load ...`."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import shardwise as sw
from shardwise import checkpoint as ckpt

SAVE_MESH = {"dp": 2, "tp": 2}
# name -> (global shape, dtype, placements on SAVE_MESH); dims of 13, 10, 9 and 3 split unevenly.
TENSORS = {
    "wte.weight": ((13, 6), np.float32, [sw.Shard(0), sw.Shard(1)]),
    "h.0.mlp.weight": ((6, 10), np.float32, [sw.Replicate(), sw.Shard(1)]),
    "h.0.mlp.bias": ((10,), np.float32, [sw.Replicate(), sw.Replicate()]),
    "ids": ((9, 3), np.int64, [sw.Shard(1), sw.Shard(0)]),
}
MOMENTS = ["wte.weight", "h.0.mlp.weight"]
LOAD_MESH = {"tp": 2}


def full_arrays():
    """The global tensors and moments, the same in every process."""
    rng = np.random.default_rng(31)
    out = {}
    for name, (shape, dtype, _) in TENSORS.items():
        out[name] = (rng.integers(-1000, 1000, shape) if dtype == np.int64 else rng.standard_normal(shape)).astype(dtype)
    for name in MOMENTS:
        for m in ("exp_avg", "exp_avg_sq"):
            out[f"{name}/{m}"] = rng.standard_normal(TENSORS[name][0]).astype(np.float32)
    return out


def shard(array, mesh, placements, rank):
    return np.ascontiguousarray(array[sw.local_block(array.shape, mesh, placements, rank)[2]])


def local_state(rank):
    full = full_arrays()
    model = {n: shard(full[n], SAVE_MESH, p, rank) for n, (_, _, p) in TENSORS.items()}
    optimizer = {n: {m: shard(full[f"{n}/{m}"], SAVE_MESH, TENSORS[n][2], rank) for m in ("exp_avg", "exp_avg_sq")}
                 for n in MOMENTS}
    return model, optimizer


class PipeFreeFileGroup:
    """A pure-Python group object (what a torch.distributed group stands in for): all_gather_bytes
    through files in a directory, written under a temporary name and renamed."""

    def __init__(self, directory, rank, size):
        self.dir, self._rank, self._size, self.calls = pathlib.Path(directory), rank, size, 0

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def all_gather_bytes(self, mine):
        call, self.calls = self.calls, self.calls + 1
        tmp = self.dir / f".c{call}-r{self._rank}"
        tmp.write_bytes(mine)
        tmp.rename(self.dir / f"c{call}-r{self._rank}")
        paths = [self.dir / f"c{call}-r{r}" for r in range(self._size)]
        deadline = time.time() + 120
        while not all(p.exists() for p in paths):
            assert time.time() < deadline, f"rank {self._rank}: call {call} timed out"
            time.sleep(0.005)
        return [p.read_bytes() for p in paths]


def worker_save(kind, rank, rdv, out):
    model, optimizer = local_state(rank)
    group = sw.checkpoint.FileGroup(rdv, rank, 4) if kind == "file" else PipeFreeFileGroup(rdv, rank, 4)
    placements = {n: p for n, (_, _, p) in TENSORS.items()}
    result = ckpt.save(model, out, SAVE_MESH, placements, rank, group=group, step=7, optimizer=optimizer,
                       files={"config.json": {"model_type": "test"}}, async_save=(kind == "object"))
    if kind == "object":
        del model, optimizer  # the async save copied the shards before returning
        result = result.wait()
    print(result)


def worker_load(rank, path):
    full = full_arrays()
    place = {n: [sw.Shard(1)] if len(s) == 2 else [sw.Shard(0)] for n, (s, _, _) in TENSORS.items()}
    got = ckpt.load(path, LOAD_MESH, place, rank)
    moments = ckpt.load(path, LOAD_MESH, place, rank, group_name="optimizer")
    assert sorted(got) == sorted(TENSORS) and len(moments) == 2 * len(MOMENTS), (sorted(got), sorted(moments))
    for name, array in {**got, **moments}.items():
        expected = shard(full[name], LOAD_MESH, place[name.split("/")[0]], rank)
        assert array.dtype == expected.dtype and array.shape == expected.shape, (name, array.shape, expected.shape)
        assert array.tobytes() == expected.tobytes(), f"{name} differs on rank {rank}"
    print("ok")


def spawn(*args):
    return subprocess.Popen([sys.executable, __file__, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(procs):
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            outs.append(out.strip())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


@pytest.mark.parametrize("kind", ["file", "object"])
def test_four_processes_save_two_processes_load_another_layout_bit_for_bit(kind, tmp_path, cli):
    rdv, out = tmp_path / "rdv", tmp_path / "ckpt"
    rdv.mkdir()
    dirs = finish([spawn("save", kind, r, rdv, out) for r in range(4)])
    assert dirs == [str(out / "checkpoint-7")] * 4
    described = ckpt.info(out)
    assert described.step == 7 and described.names == sorted(TENSORS)
    assert described.shapes["wte.weight"] == (13, 6) and described.dtypes["ids"] == "i64"
    assert sorted(described.groups["optimizer"]) == sorted(f"{n}/{m}" for n in MOMENTS for m in ("exp_avg", "exp_avg_sq"))
    assert json.loads((out / "checkpoint-7" / "config.json").read_text()) == {"model_type": "test"}
    assert finish([spawn("load", r, out) for r in range(2)]) == ["ok", "ok"]
    cli("ckpt", "verify", str(out / "checkpoint-7"))


def test_one_process_saves_for_every_rank_and_loads_whole(tmp_path):
    states = [local_state(r) for r in range(4)]
    placements = {n: p for n, (_, _, p) in TENSORS.items()}
    saved = ckpt.save_all_ranks([m for m, _ in states], tmp_path, SAVE_MESH, placements, step=2,
                                optimizers=[o for _, o in states])
    whole = ckpt.load(saved, {"x": 1}, [sw.Replicate()], 0)
    full = full_arrays()
    for name in TENSORS:
        assert whole[name].tobytes() == full[name].tobytes()
    f64 = ckpt.load(saved, {"x": 1}, [sw.Replicate()], 0, names=["h.0.mlp.bias"], dtype="float64")
    assert f64["h.0.mlp.bias"].dtype == np.float64
    np.testing.assert_array_equal(f64["h.0.mlp.bias"], full["h.0.mlp.bias"].astype(np.float64))


GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "tests" / "golden" / "hf"


def first_loss(shardwise_bin, init_from, run_dir):
    p = subprocess.run([shardwise_bin, "train", "--init-from", str(init_from), "--data", str(GOLDEN / "tokens.bin"),
                        "--mesh", "tp=2", "--steps", "1", "--global-batch", "4", "--eval-every", "0",
                        "--progress", "none", "--run-dir", str(run_dir)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["loss"]


def test_a_gpt2_resaved_sharded_from_python_trains_like_the_original(tmp_path, shardwise_bin, cli):
    src = GOLDEN / "gpt2_tiny"
    weights = ckpt.load(src, {"x": 1}, [sw.Replicate()], 0)
    mesh = {"fsdp": 4}
    shards = [{n: shard(w, mesh, [sw.Shard(0)], r) for n, w in weights.items()} for r in range(4)]
    files = {f: json.loads((src / f).read_text()) for f in ("config.json", "generation_config.json")}
    saved = ckpt.save_all_ranks(shards, tmp_path / "resaved", mesh, [sw.Shard(0)], files=files)
    cli("ckpt", "verify", saved)
    assert first_loss(shardwise_bin, saved, tmp_path / "a") == first_loss(shardwise_bin, src, tmp_path / "b")
    cli("ckpt", "merge", saved, str(tmp_path / "merged"))
    merged = ckpt.load(tmp_path / "merged", {"x": 1}, [sw.Replicate()], 0)
    assert sorted(merged) == sorted(weights)
    assert all(merged[n].tobytes() == w.tobytes() for n, w in weights.items())


def test_a_key_map_stores_q_k_v_side_by_side_in_one_fused_tensor(tmp_path):
    rng = np.random.default_rng(5)
    qkv = {n: rng.standard_normal((4, 6)).astype(np.float32) for n in ("q", "k", "v")}
    key_map = {n: {"key": "c_attn.weight", "key_shape": [4, 18], "offset": [0, 6 * i], "shape": [4, 6]}
               for i, n in enumerate(("q", "k", "v"))}
    mesh = {"tp": 2}
    shards = [{n: shard(a, mesh, [sw.Shard(1)], r) for n, a in qkv.items()} for r in range(2)]
    moments = [{n: {"exp_avg": s[n], "exp_avg_sq": s[n]} for n in s} for s in shards]
    saved = ckpt.save_all_ranks(shards, tmp_path, mesh, [sw.Shard(1)], key_map=key_map, optimizers=moments)
    assert ckpt.info(saved).names == ["k", "q", "v"]  # the manifest's key map names them
    assert "q/exp_avg_sq" in ckpt.info(saved).groups["optimizer"]
    stored = ckpt.load(saved, {"x": 1}, [sw.Replicate()], 0, key_map={})  # the files' own keys
    assert stored["c_attn.weight"].tobytes() == np.concatenate([qkv["q"], qkv["k"], qkv["v"]], axis=1).tobytes()
    assert ckpt.load(saved, {"x": 1}, [sw.Replicate()], 0, names=["k"])["k"].tobytes() == qkv["k"].tobytes()


def test_shards_that_no_global_shape_explains_are_refused_on_every_rank(tmp_path):
    shards = [{"a": np.zeros((2, 5), np.float32)} for _ in range(4)]
    shards[1]["a"] = np.zeros((2, 4), np.float32)
    with pytest.raises(sw.CheckpointError, match=r"'a': rank 1 holds a shard of shape 2x4, but .* global shape 8x5"):
        ckpt.save_all_ranks(shards, tmp_path, {"dp": 4}, [sw.Shard(0)])
    assert not any(tmp_path.iterdir())  # nothing written


def test_uneven_shards_follow_chunk_semantics_or_give_shapes(tmp_path):
    # 2 rows then 3 of a 5-row tensor: torch.chunk would cut 3 then 2.
    shards = [{"a": np.zeros((2, 2), np.float32)}, {"a": np.ones((3, 2), np.float32)}]
    with pytest.raises(sw.CheckpointError, match="chunk semantics"):
        ckpt.save_all_ranks(shards, tmp_path, {"dp": 2}, [sw.Shard(0)])
    with pytest.raises(sw.CheckpointError, match=r"rank 1 holds a block of shape 2x2, its layout mesh=\[dp=2\] S\(0\) gives 3x2"):
        ckpt.save_all_ranks(shards[::-1], tmp_path, {"dp": 2}, [sw.Shard(0)], shapes={"a": (6, 2)})
    saved = ckpt.save_all_ranks(shards[::-1], tmp_path, {"dp": 2}, [sw.Shard(0)], shapes={"a": (5, 2)})
    assert ckpt.info(saved).shapes["a"] == (5, 2)
    np.testing.assert_array_equal(ckpt.load(saved, {"x": 1}, [sw.Replicate()], 0)["a"][:3], 1)


def test_a_save_root_loads_its_newest_complete_checkpoint_and_leaves_a_save_in_progress_alone(tmp_path):
    for step in (1, 2):
        ckpt.save_all_ranks([{"a": np.full(3, step, np.float32)}], tmp_path, {"x": 1}, [sw.Replicate()], step=step)
    in_progress = tmp_path / "checkpoint-3.tmp"
    in_progress.mkdir()  # another job's save, not yet renamed
    assert ckpt.info(tmp_path).step == 2
    assert (ckpt.load(tmp_path, {"x": 1}, [sw.Replicate()], 0)["a"] == 2).all()
    assert in_progress.exists()


def test_load_errors_name_the_problem(tmp_path):
    saved = ckpt.save_all_ranks([{"a": np.ones(4, np.float32)}], tmp_path / "c", {"x": 1}, [sw.Replicate()])
    with pytest.raises(sw.CheckpointError, match="missing from the checkpoint.*'b'"):
        ckpt.load(saved, {"x": 1}, [sw.Replicate()], 0, names=["a", "b"])
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(sw.CheckpointError, match="is a file, not a checkpoint directory"):
        ckpt.load(a_file, {"x": 1}, [sw.Replicate()], 0)
    with pytest.raises(sw.CheckpointError, match=str(a_file)):
        ckpt.save({"a": np.ones(4, np.float32)}, a_file, {"x": 1}, [sw.Replicate()], 0)


def test_a_group_objects_exception_surfaces_with_its_message(tmp_path):
    class Broken:
        def rank(self):
            return 0

        def size(self):
            return 2

        def all_gather_bytes(self, mine):
            raise ValueError("the network is down")

    with pytest.raises(sw.CheckpointError, match="the network is down"):
        ckpt.save({"a": np.ones(4, np.float32)}, tmp_path, {"dp": 2}, [sw.Shard(0)], 0, group=Broken())
    with pytest.raises(sw.CheckpointError, match="needs their group"):
        ckpt.save({"a": np.ones(4, np.float32)}, tmp_path, {"dp": 2}, [sw.Shard(0)], 0)


def worker_mpi(out):
    """Under mpirun: no group given, the save runs over the MPI world."""
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    whole = np.arange(15, dtype=np.float32).reshape(5, 3)
    print(ckpt.save({"a": shard(whole, {"dp": 2}, [sw.Shard(0)], rank)}, out, {"dp": 2}, [sw.Shard(0)], rank))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")
def test_under_mpirun_a_save_needs_no_group(tmp_path):
    p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "btl",
                        "self,vader", "-np", "2", sys.executable, __file__, "mpi", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    # Each rank prints the directory it saved; mpirun may run the two lines together.
    path = str(tmp_path / "checkpoint-0")
    assert p.stdout.count(path) == 2 and not p.stdout.replace(path, " ").split(), p.stdout
    got = ckpt.load(tmp_path, {"x": 1}, [sw.Replicate()], 0)["a"]
    assert got.tobytes() == np.arange(15, dtype=np.float32).reshape(5, 3).tobytes()


if __name__ == "__main__":
    if sys.argv[1] == "mpi":
        worker_mpi(sys.argv[2])
    elif sys.argv[1] == "save":
        worker_save(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        worker_load(int(sys.argv[2]), sys.argv[3])
