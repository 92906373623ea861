"""A checkpoint crosses between the host and the fake device bit for bit, both ways
(checkpoint_crossing.py; python/tests_gpu runs the same on a GPU)."""
import os
import pathlib

import checkpoint_crossing as crossing


def test_a_checkpoint_crosses_between_the_host_and_the_fake_device_bit_for_bit(tmp_path):
    crossing.check_crossing(tmp_path, "fake")


def test_a_changed_byte_is_found(tmp_path):
    # The comparison can fail: one byte of a saved tensor file changed is named.
    saved = pathlib.Path(crossing.trained_and_saved(tmp_path / "a", None))
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in os.listdir(saved):
        (copy / f).write_bytes((saved / f).read_bytes())
    name = next(f for f in os.listdir(copy) if f.startswith("model-") and f.endswith(".safetensors"))
    data = bytearray((copy / name).read_bytes())
    data[-1] ^= 1
    (copy / name).write_bytes(bytes(data))
    assert crossing.differing_files(saved, copy) == [name]
