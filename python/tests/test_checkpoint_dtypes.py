"""The unsigned dtypes safetensors has (U16, U32, U64; U8 too) through shardwise.checkpoint, from
NumPy arrays without a copy: saved on one layout and loaded on another bit for bit (the blocks
compared with NumPy slices cut by torch.chunk's rule, computed here), a safetensors file whose
bytes this test writes itself read as the right arrays, and an op on them refused by name."""
import json

import numpy as np
import pytest

import shardwise as sw
from shardwise import checkpoint as ckpt

UNSIGNED = (np.uint8, np.uint16, np.uint32, np.uint64)


def chunk(n, parts, i):
    """torch.chunk's cut of n into parts: blocks of ceil(n / parts), the last ones short or empty."""
    size = -(-n // parts)
    return slice(min(n, i * size), min(n, (i + 1) * size))


def full_arrays():
    rng = np.random.default_rng(7)
    out = {}
    for k, dtype in enumerate(UNSIGNED):
        info = np.iinfo(dtype)
        a = rng.integers(0, info.max, (5, 7), dtype=dtype, endpoint=True)
        a[0, 0], a[-1, -1] = info.max, info.max - 1  # the top bit (above 2^53 for u64)
        out[f"w{k}"] = a
    return out


def test_unsigned_tensors_saved_on_dp2_tp2_load_on_tp3_bit_for_bit(tmp_path):
    full = full_arrays()
    mesh = {"dp": 2, "tp": 2}
    shards = []
    for rank in range(4):
        dp, tp = divmod(rank, 2)
        shards.append({n: np.ascontiguousarray(a[chunk(5, 2, dp), chunk(7, 2, tp)]) for n, a in full.items()})
    saved = ckpt.save_all_ranks(shards, tmp_path, mesh, [sw.Shard(0), sw.Shard(1)])
    info = ckpt.info(saved)
    assert info.dtypes == {"w0": "u8", "w1": "u16", "w2": "u32", "w3": "u64"}
    for rank in range(3):
        got = ckpt.load(saved, {"tp": 3}, [sw.Shard(1)], rank)
        for n, a in full.items():
            want = a[:, chunk(7, 3, rank)]
            assert got[n].dtype == a.dtype and got[n].shape == want.shape
            assert got[n].tobytes() == want.tobytes(), (n, rank)
            # DLPack out: another array over the same buffer, same values.
            assert np.from_dlpack(got[n]).tobytes() == want.tobytes()


def write_safetensors(path, arrays):
    """A safetensors file written byte by byte: 8-byte little-endian header length, the JSON header,
    the tensors' little-endian bytes in order."""
    names = {np.dtype(np.uint16): "U16", np.dtype(np.uint32): "U32", np.dtype(np.uint64): "U64",
             np.dtype(np.uint8): "U8"}
    header, data, at = {}, b"", 0
    for name, a in arrays.items():
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        data, at = data + raw, at + len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)


def test_a_safetensors_file_written_by_another_tool_reads_its_unsigned_tensors(tmp_path):
    arrays = {"a": np.array([[0, 65535, 4660], [1, 2, 3]], np.uint16),
              "b": np.array([4294967295, 0, 305419896], np.uint32),
              "c": np.array([2**64 - 1, 2**63 + 5], np.uint64)}
    write_safetensors(tmp_path / "model.safetensors", arrays)
    assert ckpt.info(tmp_path).dtypes == {"a": "u16", "b": "u32", "c": "u64"}
    whole = ckpt.load(tmp_path, {"x": 1}, [sw.Replicate()], 0)
    for n, a in arrays.items():
        assert whole[n].dtype == a.dtype
        np.testing.assert_array_equal(whole[n], a)
    cols = ckpt.load(tmp_path, {"tp": 2}, {"a": [sw.Shard(1)], "b": [sw.Shard(0)], "c": [sw.Shard(0)]}, 1)
    np.testing.assert_array_equal(cols["a"], arrays["a"][:, 2:])
    np.testing.assert_array_equal(cols["c"], arrays["c"][1:])


def test_an_op_or_a_conversion_on_an_unsigned_tensor_is_an_error_naming_the_dtype(tmp_path):
    a = np.arange(4, dtype=np.uint32)
    with pytest.raises(sw.UsageError, match="op 'add', input 0: dtype u32 is storage-only"):
        sw.run_op("add", [a, a])
    saved = ckpt.save_all_ranks([{"a": a}], tmp_path, {"x": 1}, [sw.Replicate()])
    with pytest.raises(sw.CheckpointError, match="converting u32 to f32: dtype u32 is storage-only"):
        ckpt.load(saved, {"x": 1}, [sw.Replicate()], 0, dtype="float32")
