"""Meshes, placements and each rank's block, against an independent formula of chunk sharding."""
import itertools
import math

import numpy as np
import pytest

import shardwise as sw


def chunk(n, parts, index):
    """torch.chunk semantics, written out: ceil(n / parts) per part, short or empty at the end."""
    size = math.ceil(n / parts) if parts else 0
    begin = min(n, size * index)
    return begin, min(n, begin + size) - begin


def test_mesh_from_dict_list_and_string_agree():
    a = sw.Mesh({"dp": 2, "tp": 3})
    assert a.shape == (2, 3) and a.dim_names == ["dp", "tp"] and a.size == 6
    assert a == sw.Mesh("dp=2,tp=3")
    assert sw.Mesh([2, 3]).shape == (2, 3)
    assert a.dim_index("tp") == 1
    assert a.coords(4) == [1, 1]
    assert sw.Mesh([2], process_ids=[5, 7]).process_ids == [5, 7]


def test_placements_compare_and_print_like_dtensor():
    p = sw.Placements([sw.Shard(0), sw.Partial("max"), sw.Replicate()])
    assert len(p) == 3 and p[0] == sw.Shard(0) and p[1].reduce_op == "max" and p[2].is_replicate()
    assert p == [sw.Shard(0), sw.Partial("max"), sw.Replicate()]
    assert p == "S(0),P(max),R"
    assert repr(p) == "Placements([Shard(0), Partial('max'), Replicate()])"
    assert sw.Shard(1).dim == 1 and sw.Shard(1).is_shard(1) and not sw.Shard(1).is_shard(0)


@pytest.mark.parametrize("shape", [(8, 6), (5, 7), (1, 3), (0, 4)])
def test_local_shape_and_block_follow_chunk_sharding(shape):
    mesh = sw.Mesh({"dp": 2, "tp": 3})
    for p0, p1 in itertools.product([sw.Replicate(), sw.Shard(0), sw.Shard(1)], repeat=2):
        for rank in range(mesh.size):
            c = mesh.coords(rank)
            want_off, want_shape = [0, 0], list(shape)
            for mesh_dim, p in enumerate((p0, p1)):
                if p.is_shard():
                    d = p.dim
                    off, size = chunk(want_shape[d], mesh.shape[mesh_dim], c[mesh_dim])
                    want_off[d] += off
                    want_shape[d] = size
            assert sw.local_shape(shape, mesh, [p0, p1], rank) == tuple(want_shape)
            lshape, offset, slices = sw.local_block(shape, mesh, [p0, p1], rank)
            assert lshape == tuple(want_shape) and offset == tuple(want_off)
            assert np.zeros(shape)[slices].shape == lshape


def test_shards_of_every_rank_cover_the_tensor_once():
    mesh = sw.Mesh([2, 2])
    x = np.arange(5 * 7).reshape(5, 7)
    count = np.zeros_like(x)
    for rank in range(4):
        _, _, slices = sw.local_block(x.shape, mesh, [sw.Shard(0), sw.Shard(1)], rank)
        count[slices] += 1
    assert (count == 1).all()


def test_co_sharded_dim_keeps_its_split_order():
    p = sw.Placements("S(0)@1,S(0)@0")
    assert p.shard_order(0) == [1, 0]
    assert str(p) == "S(0)@1,S(0)@0"
    mesh = sw.Mesh([2, 2])
    # Mesh dim 1 splits first: rank (0, 1) holds the second quarter's... block at offset 4 of 8.
    assert sw.local_block((8,), mesh, p, rank=1)[1] == (4,)
    assert sw.local_block((8,), mesh, "S(0),S(0)", rank=1)[1] == (2,)


def test_bad_layouts_raise_usage_errors_naming_the_problem():
    mesh = sw.Mesh([2, 2])
    with pytest.raises(sw.UsageError, match="dim 2"):
        sw.local_shape((4, 4), mesh, [sw.Shard(2), sw.Replicate()], 0)
    with pytest.raises(sw.UsageError, match="1 placements for a mesh of 2 dims"):
        sw.local_shape((4, 4), mesh, [sw.Shard(0)], 0)
    with pytest.raises(sw.UsageError, match="not in"):
        sw.local_shape((4, 4), mesh, "R,R", rank=9)
    with pytest.raises(sw.Error):
        sw.Partial("median")
    assert issubclass(sw.UsageError, sw.Error) and issubclass(sw.Error, RuntimeError)
