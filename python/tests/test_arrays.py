"""Arrays cross into C++ and back without copies; every dtype shardwise holds round-trips; what
cannot be read in place is refused with a clear error."""
import gc

import numpy as np
import pytest

import shardwise as sw

DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int8, np.uint8, np.bool_]


def test_an_op_reads_numpy_inputs_and_returns_numpy_outputs():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((3, 4), 0.5, dtype=np.float32)
    (out,) = sw.run_op("add", [a, b])
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, a + b)
    (mm,) = sw.run_op("matmul", [a, a.T.copy()])
    np.testing.assert_allclose(mm, a @ a.T, rtol=1e-6)


def test_no_copy_in_or_out_and_the_result_outlives_its_maker():
    x = np.arange(24, dtype=np.float32)
    (y,) = sw.run_op("reshape", [x], {"shape": [4, 6]})
    assert y.shape == (4, 6)
    # reshape shares storage in C++: the output is the input's own memory, passed both ways.
    assert np.shares_memory(x, y)
    x[5] = 100.0
    assert y[0, 5] == 100.0
    del x
    gc.collect()
    assert y[0, 5] == 100.0 and y[3, 5] == 23.0  # y keeps x's buffer alive through the C++ tensor


def test_a_computed_output_lives_after_the_inputs_are_gone():
    a = np.ones((64, 64), np.float32)
    (out,) = sw.run_op("multiply", [a, a])
    del a
    gc.collect()
    big = [np.full((64, 64), 7, np.float32) for _ in range(50)]  # reuse freed memory
    assert (out == 1).all() and len(big) == 50
    assert out.flags.c_contiguous and out.base is not None


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips_bit_for_bit(dtype):
    x = (np.arange(10) % 3).astype(dtype)
    (y,) = sw.run_op("reshape", [x], {"shape": [2, 5]})
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y.reshape(-1), x)


def test_non_contiguous_input_is_refused_not_misread():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(sw.UsageError, match="not C-contiguous.*ascontiguousarray"):
        sw.run_op("add", [x.T, x.T])
    with pytest.raises(sw.UsageError, match="not C-contiguous"):
        sw.run_op("add", [x[:, ::2], x[:, ::2]])
    (ok,) = sw.run_op("add", [np.ascontiguousarray(x.T), np.ascontiguousarray(x.T)])
    np.testing.assert_array_equal(ok, 2 * x.T)


def test_a_dtype_shardwise_does_not_hold_is_named():
    with pytest.raises(sw.UsageError, match="complex64"):
        sw.run_op("add", [np.zeros(2, np.complex64)] * 2)


def test_bf16_outputs_speak_dlpack():
    x = np.arange(6, dtype=np.float32)
    (h,) = sw.run_op("cast", [x], {"dtype": "bf16"})
    assert hasattr(h, "__dlpack__") and hasattr(h, "__dlpack_device__")
    (back,) = sw.run_op("cast", [h], {"dtype": "f32"})
    np.testing.assert_array_equal(back, x)
