"""The GPU proof of zero-copy CUDA arrays (docs/gpu.md): torch CUDA tensors into shardwise and
back over the same memory. Run only by tools/gpu_check.sh on a GPU machine (never by `make test`,
which collects python/tests alone); anywhere else every test skips, saying why. torch is imported
inside the fixture, never at collection."""
import gc

import numpy as np
import pytest

import shardwise as sw


@pytest.fixture(scope="module")
def torch():
    if not sw.built_with_cuda:
        pytest.skip("this shardwise package was built without CUDA")
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


def test_a_torch_cuda_tensor_goes_in_and_out_without_a_copy(torch):
    x = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    out = sw.to_device(x, x.device.index)   # a device tensor over x's memory, returned as is
    assert out.__dlpack_device__() == (2, x.device.index)
    y = torch.from_dlpack(out)
    assert y.device == x.device and y.data_ptr() == x.data_ptr() and tuple(y.shape) == (3, 4)


def test_the_returned_tensor_outlives_the_one_that_made_it(torch):
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    y = torch.from_dlpack(sw.to_device(x, x.device.index))
    ptr = x.data_ptr()
    del x
    gc.collect()
    others = [torch.full((1 << 20,), 7.0, device="cuda") for _ in range(4)]  # would reuse a freed block
    torch.cuda.synchronize()
    assert y.data_ptr() == ptr and all(o.data_ptr() != ptr for o in others)
    assert torch.equal(y.cpu(), torch.arange(1 << 20, dtype=torch.float32))


def test_copies_to_and_from_the_gpu_through_shardwise(torch):
    x = torch.randn(7, 1023, device="cuda")
    torch.cuda.synchronize()
    np.testing.assert_array_equal(sw.to_host(x), x.cpu().numpy())
    host = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    d = torch.from_dlpack(sw.to_device(host, 0))
    assert d.is_cuda
    np.testing.assert_array_equal(d.cpu().numpy(), host)
    assert torch.from_dlpack(sw.to_device(d, 0)).data_ptr() == d.data_ptr()


def test_non_contiguous_and_host_only_uses_are_refused(torch):
    x = torch.ones(3, 4, device="cuda")
    with pytest.raises(sw.Error, match="not C-contiguous"):
        sw.to_device(x.t(), 0)
    with pytest.raises(sw.Error, match=r"run_op: add runs its CPU kernel here .*input 0 is on cuda:0"):
        sw.run_op("add", [x, x])


def test_a_round_trip_through_ops_with_a_cuda_kernel(torch):
    x = torch.randn(7, 1023, device="cuda")
    (y,) = sw.run_op("gelu", [x])            # the CUDA kernel: in and out on the GPU
    assert y.__dlpack_device__() == (2, x.device.index)
    (z,) = sw.run_op("silu", [y])            # a device output goes straight back in
    yt, zt = torch.from_dlpack(y), torch.from_dlpack(z)
    assert yt.is_cuda and zt.is_cuda and tuple(zt.shape) == (7, 1023)
    (y_cpu,) = sw.run_op("gelu", [x.cpu().numpy()])   # the CPU kernels: the reference
    (z_cpu,) = sw.run_op("silu", [yt.cpu().numpy()])
    # docs/gpu.md's tolerances for these kernels: float both sides, tanhf / expf on the GPU.
    np.testing.assert_allclose(yt.cpu().numpy(), y_cpu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(zt.cpu().numpy(), z_cpu, rtol=1e-5, atol=1e-6)
