"""The GPU proof that a checkpoint crosses between the GPU and the host bit for bit, both ways
(python/tests/checkpoint_crossing.py, which `make test` runs on the fake device). Run only by
tools/gpu_check.sh on a GPU machine; anywhere else it skips, saying why."""
import os
import sys

import pytest

import shardwise as sw

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import checkpoint_crossing as crossing  # noqa: E402


def test_a_checkpoint_crosses_between_the_gpu_and_the_host_bit_for_bit(tmp_path):
    if not sw.built_with_cuda:
        pytest.skip("this shardwise package was built without CUDA")
    try:
        crossing.check_crossing(tmp_path, "cuda")
    except sw.UsageError as e:
        if "no GPU is visible" not in str(e):
            raise
        pytest.skip(str(e).splitlines()[0])
