"""A fake torch.distributed over files in $FAKE_TORCH_DIR: this process is rank $FAKE_TORCH_RANK of
$FAKE_TORCH_WORLD. send/recv and all_gather_object as torch has them (in-place recv, tags, global
peer ranks, groups from new_group); `calls` counts them."""
import os
import pathlib
import pickle
import threading
import time

import numpy as np

calls = {"send": 0, "recv": 0, "all_gather_object": 0}
_lock = threading.Lock()
_counters = {}


class _Group:
    def __init__(self, ranks):
        self.ranks = list(ranks)

    def __repr__(self):
        return f"FakeGroup({self.ranks})"


def _env():
    return pathlib.Path(os.environ["FAKE_TORCH_DIR"]), int(os.environ["FAKE_TORCH_RANK"]), int(os.environ["FAKE_TORCH_WORLD"])


def _ranks(group):
    return list(range(_env()[2])) if group is None else group.ranks


def new_group(ranks):
    return _Group(ranks)


def get_rank(group=None):
    return _ranks(group).index(_env()[1])


def get_world_size(group=None):
    return len(_ranks(group))


def get_global_rank(group, group_rank):
    return group.ranks[group_rank]


def _next(key):
    with _lock:
        n = _counters.get(key, 0)
        _counters[key] = n + 1
        return n


def _post(name, payload):
    d = _env()[0]
    (d / f".{name}").write_bytes(pickle.dumps(payload))
    (d / f".{name}").rename(d / name)


def _take(name, keep=False):
    path, deadline = _env()[0] / name, time.time() + 60
    while not path.exists():
        if time.time() > deadline:
            raise RuntimeError(f"fake torch.distributed: rank {_env()[1]} waited 60 s for {name}")
        time.sleep(0.002)
    payload = pickle.loads(path.read_bytes())
    if not keep:
        path.unlink()
    return payload


def _check_peer(peer, group):
    if peer not in _ranks(group):
        raise ValueError(f"global rank {peer} is not part of group {group}")


def send(tensor, dst, group=None, tag=0):
    _check_peer(dst, group)
    me = _env()[1]
    calls["send"] += 1
    _post(f"p2p-{me}-{dst}-{tag}-{_next(('send', dst, tag))}", (str(tensor.dtype), tensor.numpy().tobytes()))


def recv(tensor, src, group=None, tag=0):
    _check_peer(src, group)
    me = _env()[1]
    calls["recv"] += 1
    dtype, data = _take(f"p2p-{src}-{me}-{tag}-{_next(('recv', src, tag))}")
    if dtype != str(tensor.dtype) or len(data) != tensor.nbytes:
        raise RuntimeError(f"recv: a {dtype} message of {len(data)} bytes into a {tensor.dtype} tensor of {tensor.nbytes}")
    tensor.numpy()[...] = np.frombuffer(data, dtype=tensor.dtype)
    return src


def all_gather_object(out, obj, group=None):
    ranks, me = _ranks(group), _env()[1]
    calls["all_gather_object"] += 1
    call = _next(("all_gather", tuple(ranks)))
    _post(f"ag-{'.'.join(map(str, ranks))}-{call}-{me}", obj)
    out[:] = [_take(f"ag-{'.'.join(map(str, ranks))}-{call}-{r}", keep=True) for r in ranks]
