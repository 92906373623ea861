"""shardwise.generate against `shardwise generate` (SHARDWISE_BIN) from the same checkpoint."""
import json
import subprocess

import numpy as np
import pytest

import shardwise as sw


@pytest.fixture(scope="module")
def checkpoint(shardwise_bin, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("gen") / "run"
    subprocess.run([shardwise_bin, "train", "--mesh", "dp=1,tp=2", "--layers", "1", "--hidden", "32", "--heads", "2",
                    "--steps", "3", "--global-batch", "4", "--digits", "2", "--eval-every", "0", "--progress", "none",
                    "--save-every", "3", "--run-dir", str(run_dir)], check=True, capture_output=True)
    return run_dir / "checkpoints" / "checkpoint-3"


def cli_generate(shardwise_bin, checkpoint, *args):
    p = subprocess.run([shardwise_bin, "generate", "--checkpoint", str(checkpoint), "--json", *args],
                       capture_output=True, text=True, check=True)
    return [s["new_ids"] for s in json.loads(p.stdout)["sequences"]]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "top_k": 5, "seed": 7},
                                      {"top_p": 0.8, "seed": 3}])
def test_generate_gives_the_clis_tokens(shardwise_bin, checkpoint, sampling):
    args = ["--prompt", "12+34=", "--prompt", "5+6=", "--max-new-tokens", "6", "--mesh", "tp=2"]
    for name, value in sampling.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    expected = cli_generate(shardwise_bin, checkpoint, *args)
    got = sw.generate(checkpoint, ["12+34=", "5+6="], max_new_tokens=6, mesh="tp=2", **sampling)
    assert [list(g) for g in got] == expected
    one = sw.generate(checkpoint, prompt_ids=np.frombuffer(b"12+34=", np.uint8), max_new_tokens=6, mesh="tp=2",
                      **sampling)
    assert one.dtype == np.int64 and list(one) == expected[0]


def test_generate_returns_each_new_tokens_logits(checkpoint):
    ids, logits = sw.generate(checkpoint, "12+34=", max_new_tokens=4, eos_id=-1, return_logits=True)
    assert logits.dtype == np.float32 and logits.shape[0] == 4 and logits.shape[1] >= 16
    assert list(np.argmax(logits, axis=1)) == list(ids)  # greedy: each token is its row's argmax


def test_generate_errors_are_the_commands(checkpoint, tmp_path):
    with pytest.raises(sw.UsageError, match="is not a directory"):
        sw.generate(tmp_path / "none", "1+1=")
    with pytest.raises(sw.UsageError, match="prompt"):
        sw.generate(checkpoint)
