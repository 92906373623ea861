"""Arrays on a CUDA device go in and out as device tensors over the same memory, proven without a
GPU on the fake device (cuda:FAKE: host memory mapped PROT_NONE outside explicit copies, so any
host read of it kills the process). The hooks of shardwise._core._testing are test-only."""
import gc

import numpy as np
import pytest

import shardwise as sw
from shardwise._core import _testing

FAKE = 9   # the fake device's ordinal: far from any real GPU's
KDLCUDA = 2


@pytest.fixture(scope="module", autouse=True)
def fake_device():
    _testing.register_fake_device(FAKE)


def host_values():
    return np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5


def test_a_device_array_goes_in_and_out_without_a_copy():
    d = sw.to_device(host_values(), FAKE)
    assert d.__dlpack_device__() == (KDLCUDA, FAKE)
    before = _testing.device_copy_stats()
    e = sw.to_device(d, FAKE)   # in as a device tensor, out as a device array: same memory
    assert _testing.data_ptr(e) == _testing.data_ptr(d)
    assert e.__dlpack_device__() == (KDLCUDA, FAKE)
    assert _testing.device_copy_stats() == before
    np.testing.assert_array_equal(sw.to_host(e), host_values())
    after = _testing.device_copy_stats()
    assert after["to_host_copies"] == before["to_host_copies"] + 1
    assert after["to_host_bytes"] == before["to_host_bytes"] + 48


def test_the_copies_in_and_out_are_counted_once_each():
    before = _testing.device_copy_stats()
    d = sw.to_device(np.ones(5, np.int64), FAKE)
    back = sw.to_host(d)
    after = _testing.device_copy_stats()
    assert after["to_device_copies"] - before["to_device_copies"] == 1
    assert after["to_device_bytes"] - before["to_device_bytes"] == 40
    assert back.dtype == np.int64 and (back == 1).all()


def test_a_returned_device_array_outlives_the_array_that_made_it():
    d = sw.to_device(host_values(), FAKE)
    e = sw.to_device(d, FAKE)
    del d
    gc.collect()
    # The allocator caches freed blocks: had e lost its storage, these would take it over.
    others = [sw.to_device(np.full((3, 4), 7, np.float32), FAKE) for _ in range(4)]
    np.testing.assert_array_equal(sw.to_host(e), host_values())
    assert len(others) == 4


def test_a_host_array_is_returned_as_is_by_to_host():
    x = host_values()
    y = sw.to_host(x)
    assert np.shares_memory(x, y)


def test_a_non_contiguous_device_array_is_refused():
    d = sw.to_device(host_values(), FAKE)
    t = _testing.view(d, [4, 3], [1, 4])   # the transpose, on the device
    with pytest.raises(sw.Error, match=rf"not C-contiguous \(strides in elements: 1,4; on cuda:{FAKE}\)"):
        sw.to_host(t)


def test_host_only_apis_refuse_a_device_array_by_name(tmp_path):
    d = sw.to_device(host_values(), FAKE)
    with pytest.raises(sw.Error, match=rf"run_op: add runs its CPU kernel here .*input 0 is on cuda:{FAKE}.*x\.cpu\(\)"):
        sw.run_op("add", [d, d])
    with pytest.raises(sw.Error, match=rf"run_op: add .*input 1 is on cuda:{FAKE}"):
        sw.run_op("add", [host_values(), d])
    with pytest.raises(sw.Error, match=rf"checkpoint\.save reads host memory.*cuda:{FAKE}"):
        sw.checkpoint.save_all_ranks([{"w": d}], tmp_path, {"dp": 1}, [sw.Replicate()])


def test_a_cuda_array_shardwise_has_no_device_for_is_a_clear_error():
    a = _testing.cuda_array_at(5)   # claims cuda:5; its memory is never read
    reason = "built without CUDA" if not sw.built_with_cuda else "sees no such GPU"
    with pytest.raises(sw.Error, match=rf"cuda:5, but .*{reason}.*x\.cpu\(\)"):
        sw.to_host(a)
    with pytest.raises(sw.Error, match=r"run_op: add runs its CPU kernel here .*input 0 is on cuda:5"):
        sw.run_op("add", [a, a])


def test_to_device_names_what_it_cannot_do():
    d = sw.to_device(host_values(), FAKE)
    with pytest.raises(sw.Error, match=rf"on cuda:{FAKE}, not cuda:5.*host"):
        sw.to_device(d, 5)
    with pytest.raises(sw.Error, match="shardwise has no cuda:6"):
        sw.to_device(host_values(), 6)


def test_an_op_with_a_cuda_kernel_needs_a_package_with_cuda():
    if sw.built_with_cuda:
        pytest.skip("this package has CUDA: gelu on the fake device would launch a real kernel on fake memory; "
                    "python/tests_gpu runs it on a GPU")
    d = sw.to_device(host_values(), FAKE)
    with pytest.raises(sw.Error, match=rf"run_op: gelu runs its CPU kernel here .*built without CUDA.*cuda:{FAKE}"):
        sw.run_op("gelu", [d])
