"""shardwise.checkpoint.TorchGroup against a fake torch.distributed (fake_torch/: make test has no
PyTorch; bench/ckpt_dcp.py runs the real one): 4 processes save through TorchGroup with an async
save while the caller keeps making collectives on the group, the save's reports go point to point
(send_bytes / recv_bytes), and 2 processes load the result on another layout bit for bit (test_checkpoint.py's worker_load).

Run as a script, this file is one worker process: `python test_checkpoint_torch_group.py RANK DIR OUT`."""
import json
import os
import pathlib
import subprocess
import sys

from test_checkpoint import SAVE_MESH, TENSORS, finish, local_state, spawn

FAKE = pathlib.Path(__file__).resolve().parent / "fake_torch"


def worker(rank, rdv, out):
    sys.path.insert(0, str(FAKE))
    import torch.distributed as dist  # the fake

    from shardwise import checkpoint as ckpt

    group = ckpt.TorchGroup()
    # Point to point on a subgroup: peers are the subgroup's ranks, an empty message is a message.
    pair = dist.new_group([1, 3])
    if rank in (1, 3):
        g = ckpt.TorchGroup(pair)
        if g.rank() == 0:
            g.send_bytes(b"from 1", 1, 5)
            g.send_bytes(b"", 1, 5)
        else:
            assert (g.recv_bytes(0, 5), g.recv_bytes(0, 5)) == (b"from 1", b"")
    model, optimizer = local_state(rank)
    placements = {n: p for n, (_, _, p) in TENSORS.items()}
    handle = ckpt.save(model, out, SAVE_MESH, placements, rank, group=group, step=9, optimizer=optimizer,
                       async_save=True)
    for i in range(5):  # the caller's own collectives on the group while the save's worker runs
        got = [None] * 4
        dist.all_gather_object(got, (i, rank))
        assert got == [(i, r) for r in range(4)], got
    print(json.dumps({"dir": handle.wait(), **dist.calls}))


def save_processes(tmp_path):
    rdv, out = tmp_path / "rdv", tmp_path / "ckpt"
    rdv.mkdir()
    procs = []
    for r in range(4):
        env = dict(os.environ, FAKE_TORCH_DIR=str(rdv), FAKE_TORCH_RANK=str(r), FAKE_TORCH_WORLD="4")
        procs.append(subprocess.Popen([sys.executable, __file__, str(r), str(rdv), str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return [json.loads(line) for line in finish(procs)], out


def test_torch_group_saves_with_point_to_point_reports_and_loads_bit_for_bit(tmp_path, cli):
    reports, out = save_processes(tmp_path)
    assert [r["dir"] for r in reports] == [str(out / "checkpoint-9")] * 4
    # Every rank sent and received the save's reports and answers point to point; the only
    # all-gathers are the caller's 5 and the save's plan, made before save() returned.
    assert all(r["send"] > 0 and r["recv"] > 0 for r in reports), reports
    assert len({r["all_gather_object"] for r in reports}) == 1, reports
    assert finish([spawn("load", r, out) for r in range(2)]) == ["ok", "ok"]
    cli("ckpt", "verify", str(out / "checkpoint-9"))


if __name__ == "__main__":
    worker(int(sys.argv[1]), sys.argv[2], sys.argv[3])
