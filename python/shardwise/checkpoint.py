"""Unified checkpoints from any job: save this rank's shards, load any rank's shards on any layout.

The files are the ones ``shardwise train`` writes (manifest, digests, atomic commit; Hugging Face
safetensors under the names you give), so ``shardwise ckpt verify/inspect/merge``, ``--resume``,
``--init-from`` and transformers read what Python saved::

    import numpy as np, shardwise as sw
    from shardwise import checkpoint as ckpt
    group = ckpt.FileGroup("/shared/rdv", rank, 4)        # or a torch.distributed group: TorchGroup()
    ckpt.save({"w": my_shard}, "/shared/ckpt", {"dp": 4}, [sw.Shard(0)], rank, group=group, step=10)
    mine = ckpt.load("/shared/ckpt", {"tp": 2}, [sw.Shard(1)], rank)   # {"w": this rank's block}

The group carries the save's few control messages (its plan, the ranks' reports, the commit); no
tensor data moves between ranks: every rank writes its own bytes into the shared directory.
"""
import json

from . import _core
from ._core import AsyncSave, CheckpointError, CheckpointGroup, Replicate, Shard  # noqa: F401

__all__ = ["save", "save_all_ranks", "load", "info", "FileGroup", "TorchGroup", "AsyncSave", "CheckpointInfo"]

MOMENTS = ("exp_avg", "exp_avg_sq")


class FileGroup:
    """A group of ``size`` ranks meeting in a directory every rank sees (comm/file_rendezvous.h):
    for jobs with no MPI and no group object. Every rank constructs one with the same ``dir`` and
    ``size``; one group per directory at a time. A rank that waits longer than ``timeout`` seconds
    for the others raises CheckpointError naming them; one waiting for a rank whose process has
    exited on the same machine raises it within a second."""

    def __init__(self, dir, rank, size, timeout=300.0):
        self.dir, self.rank, self.size = str(dir), int(rank), int(size)
        self._native = _core._file_group(self.dir, self.rank, self.size, float(timeout))

    def __repr__(self):
        return f"FileGroup({self.dir!r}, rank={self.rank}, size={self.size})"


class TorchGroup:
    """A torch.distributed process group (the default one when ``pg`` is None) as a checkpoint
    group: rank(), size() and all_gather_bytes over ``all_gather_object``, and point-to-point
    messages (send_bytes / recv_bytes over ``dist.send`` / ``dist.recv`` of uint8 tensors, with the
    save's tags), which carry the ranks' reports to rank 0 and its answers. An async save's worker
    thread makes only those point-to-point calls, no collective, so the caller's collectives on
    ``pg`` keep their order while it runs. Peers are ranks of ``pg``."""

    def __init__(self, pg=None):
        import torch  # lazily: torch is not a dependency of shardwise
        import torch.distributed as dist
        self._torch, self._dist, self._pg = torch, dist, pg

    def rank(self):
        return self._dist.get_rank(self._pg)

    def size(self):
        return self._dist.get_world_size(self._pg)

    def all_gather_bytes(self, mine):
        out = [None] * self.size()
        self._dist.all_gather_object(out, bytes(mine), group=self._pg)
        return out

    def _global(self, peer):
        return peer if self._pg is None else self._dist.get_global_rank(self._pg, peer)

    def send_bytes(self, data, peer, tag):
        """Sends ``data`` to rank ``peer`` of the group: its length (one int64), then its bytes."""
        torch, dst = self._torch, self._global(peer)
        self._dist.send(torch.tensor([len(data)], dtype=torch.int64), dst, group=self._pg, tag=tag)
        if len(data):
            self._dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst, group=self._pg, tag=tag)

    def recv_bytes(self, peer, tag):
        """The next bytes rank ``peer`` of the group sent with ``tag``."""
        torch, src = self._torch, self._global(peer)
        n = torch.empty(1, dtype=torch.int64)
        self._dist.recv(n, src, group=self._pg, tag=tag)
        data = torch.empty(int(n.item()), dtype=torch.uint8)
        if data.numel():
            self._dist.recv(data, src, group=self._pg, tag=tag)
        return data.numpy().tobytes()

    def __repr__(self):
        return f"TorchGroup({self._pg!r})"


class CheckpointInfo:
    """What a checkpoint holds: ``dir`` (the checkpoint directory read), ``step``, ``groups``
    ({group: {name: (shape, dtype)}}); ``names``, ``shapes``, ``dtypes`` of the model group."""

    def __init__(self, raw):
        self.dir, self.step, self.groups = raw["dir"], raw["step"], raw["groups"]
        model = self.groups.get("model", {})
        self.names = sorted(model)
        self.shapes = {n: model[n][0] for n in model}
        self.dtypes = {n: model[n][1] for n in model}

    def __repr__(self):
        return f"CheckpointInfo(dir={self.dir!r}, step={self.step}, groups={sorted(self.groups)})"


def info(path, key_map=None):
    """The groups, names, shapes, dtypes and step of the checkpoint at ``path`` (a checkpoint
    directory, a Hugging Face model directory, or a save root: its newest complete checkpoint)."""
    return CheckpointInfo(_core._ckpt_info(str(path), _key_map_json(key_map)))


def _key_map_json(key_map, suffix=""):
    if key_map is None:
        return None
    if isinstance(key_map, str):
        key_map = json.loads(key_map)
    out = {}
    for name, entry in key_map.items():
        entry = dict(entry)
        if "key" in entry:
            entry["key"] += suffix
        if "slices" in entry:
            entry["slices"] = [k + suffix for k in entry["slices"]]
        out[name + suffix] = entry
    return json.dumps(out)


def _torch_placements(name, placements):
    out = []
    for p in placements:
        kind = type(p).__name__
        if kind == "Shard":
            out.append(Shard(p.dim))
        elif kind == "Replicate":
            out.append(Replicate())
        else:
            raise CheckpointError(f"'{name}': placement {p!r}: a checkpoint holds values (Shard, Replicate); "
                                  "reduce a Partial first")
    return out


def _placements_for(placements, name):
    if isinstance(placements, dict):
        if name in placements:
            return placements[name]
        param = name.rsplit("/", 1)[0]
        if "/" in name and param in placements:  # "<param>/exp_avg" takes its parameter's layout
            return placements[param]
        raise CheckpointError(f"no placements for '{name}' (placements names {sorted(placements)})")
    return placements


def _entry(name, value, placements, shapes):
    """(name, local array, placements, global shape or None) of one value of a state dict."""
    shape = shapes.get(name) if shapes else None
    if hasattr(value, "to_local") and hasattr(value, "placements"):  # a DTensor: its layout and shape
        ps = placements.get(name) if isinstance(placements, dict) else None
        if ps is None:
            ps = _torch_placements(name, value.placements)
        shape = tuple(value.shape) if shape is None else shape
        value = value.to_local()
    else:
        ps = _placements_for(placements, name)
    if hasattr(value, "detach"):  # a torch tensor that requires grad exports no DLPack capsule
        value = value.detach()
    return (name, value, ps, tuple(shape) if shape is not None else None)


def _flat_optimizer(optimizer):
    flat = {}
    for name, value in (optimizer or {}).items():
        if isinstance(value, dict):
            for moment, array in value.items():
                flat[f"{name}/{moment}"] = array
        else:
            flat[name] = value
    return flat


def _groups(state_dict, placements, optimizer, shapes, key_map, single_file):
    model = [_entry(n, v, placements, shapes) for n, v in state_dict.items()]
    groups = [("model", model, _key_map_json(key_map), single_file)]
    flat = _flat_optimizer(optimizer)
    if flat:
        moments = None
        if key_map is not None:
            moments = json.loads(_key_map_json(key_map, "/" + MOMENTS[0]))
            moments.update(json.loads(_key_map_json(key_map, "/" + MOMENTS[1])))
            moments = json.dumps(moments)
        groups.append(("optimizer", [_entry(n, v, placements, shapes) for n, v in flat.items()], moments, False))
    return groups


def _files(files):
    json_files, raw_files = [], []
    for name, value in (files or {}).items():
        if isinstance(value, (bytes, bytearray)):
            raw_files.append((name, bytes(value)))
        elif isinstance(value, str):
            json_files.append((name, value))
        else:
            json_files.append((name, json.dumps(value)))
    return json_files, raw_files


def _mesh(mesh):
    return mesh if isinstance(mesh, _core.Mesh) else _core.Mesh(mesh)


def _native_group(group, mesh, rank):
    if group is None:
        if _core._launched_by_mpirun():
            native = _core._mpi_group()
        elif len(_mesh(mesh)) == 1:
            native = _core._single_group()
        else:
            raise CheckpointError("a save over several ranks needs their group: group=FileGroup(dir, rank, size), "
                                  "TorchGroup(), any object with rank(), size() and all_gather_bytes(bytes), or "
                                  "run under mpirun (save_all_ranks simulates every rank in one process)")
    elif isinstance(group, CheckpointGroup):
        native = group
    elif isinstance(group, FileGroup):
        native = group._native
    elif group == "mpi":
        native = _core._mpi_group()
    elif hasattr(group, "all_gather_bytes"):
        native = _core._object_group(group)
    else:
        raise CheckpointError(f"group {group!r} is not a checkpoint group (FileGroup, TorchGroup, 'mpi', or an "
                              "object with rank(), size() and all_gather_bytes(bytes))")
    if rank is not None and native.rank != rank:
        raise CheckpointError(f"rank {rank} given, but this process is rank {native.rank} of {native!r}")
    return native


def save(state_dict, path, mesh, placements, rank=None, group=None, step=0, *, optimizer=None, shapes=None,
         key_map=None, files=None, async_save=False, max_shard_bytes=5_000_000_000, sha256=False,
         save_total_limit=0, single_file=False):
    """Collective: every rank of ``group`` saves its local shards into ``path``/checkpoint-<step>
    and gets that directory (or, with ``async_save``, an AsyncSave whose ``wait()`` gives it).

    ``state_dict``: name -> this rank's shard (NumPy, torch CPU tensors, anything with DLPack or
    the buffer protocol, read without a copy; a DTensor brings its own placements and shape).
    ``placements``: one layout for all, or name -> layout (Placements, [Shard(0), Replicate()],
    "S(0),R"). Global shapes come from every rank's local shapes (uneven dims cut as torch.chunk
    cuts them); ``shapes`` (name -> global shape) gives them instead. ``optimizer``: moments as
    {"<param>/exp_avg": shard} or {param: {"exp_avg": shard, "exp_avg_sq": shard}}, saved in the
    "optimizer" group with their parameter's layout. ``key_map``: where the model's tensors lie in
    the stored (fused) tensors, in the manifest's form (ckpt/key_map.h). ``files``: name -> dict
    (a JSON file such as config.json) or bytes, written by rank 0. Errors are CheckpointError,
    the same on every rank, raised before anything is written."""
    native = _native_group(group, mesh, rank)
    json_files, raw_files = _files(files)
    return _core._save(native, str(path), mesh, _groups(state_dict, placements, optimizer, shapes, key_map,
                                                        single_file),
                       int(step), json_files, raw_files, int(max_shard_bytes), bool(sha256), int(save_total_limit),
                       bool(async_save))


def save_all_ranks(shards_by_rank, path, mesh, placements, step=0, *, optimizers=None, shapes=None, key_map=None,
                   files=None, max_shard_bytes=5_000_000_000, sha256=False, save_total_limit=0, single_file=False):
    """One process saving for every rank of ``mesh`` (a thread per rank): ``shards_by_rank[r]`` is
    rank r's state dict (``optimizers[r]`` its moments); otherwise as save()."""
    optimizers = optimizers or [None] * len(shards_by_rank)
    per_rank = [_groups(sd, placements, opt, shapes, key_map, single_file)
                for sd, opt in zip(shards_by_rank, optimizers)]
    json_files, raw_files = _files(files)
    return _core._save_all_ranks(str(path), mesh, per_rank, int(step), json_files, raw_files, int(max_shard_bytes),
                                 bool(sha256), int(save_total_limit))


def _dtype_name(dtype):
    text = str(getattr(dtype, "name", dtype))
    return text[len("torch."):] if text.startswith("torch.") else text


def load(path, mesh, placements, rank, names=None, dtype=None, group_name="model", key_map=None):
    """This rank's blocks of the checkpoint's tensors under ``placements`` on ``mesh``, as arrays
    over the loaded memory (no copy; bf16 as a DLPack array): {name: array}, None where ``rank``
    holds no block. Reads only this rank's bytes. ``names``: the tensors to load (default: every
    one of the group); ``dtype``: convert to it (default: as stored); ``group_name``: "model",
    "optimizer" (names "<param>/exp_avg"), ...; ``key_map``: as in save() (default: the manifest's).
    ``path`` may be a checkpoint directory, a Hugging Face model directory or a save root."""
    described = _core._ckpt_info(str(path), _key_map_json(key_map) if group_name == "model" else None)
    tensors = described["groups"].get(group_name)
    if tensors is None:
        raise CheckpointError(f"'{described['dir']}' has no tensor group '{group_name}' "
                              f"(it has {sorted(described['groups'])})")
    wanted = sorted(tensors) if names is None else list(names)
    specs = []
    for n in wanted:
        if n in tensors:
            shape, stored = tensors[n]
            specs.append((n, shape, _placements_for(placements, n), stored if dtype is None else _dtype_name(dtype)))
        else:  # the C++ load names every missing key
            specs.append((n, (), [Replicate()] * _mesh(mesh).ndim, "f32"))
    maps = _key_map_json(key_map) if group_name == "model" else None
    return _core._ckpt_load(described["dir"], group_name, mesh, specs, int(rank), maps, dtype is not None)
