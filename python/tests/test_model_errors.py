"""A mistake in a model written in Python is one shardwise.Error whose message starts with the file
and line of the mistake (the user's line, not shardwise's), while tracing or from the Trainer."""
import numpy as np
import pytest

import shardwise as sw
from shardwise import nn


def line_of(marker):
    """The line of this file holding the comment `marker`."""
    with open(__file__) as f:
        for number, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# {marker}"):
                return number
    raise AssertionError(marker)


class Tiny(nn.Module):
    """Embedding, one Linear and the LM head; `mistake` puts one error in."""

    def __init__(self, mistake=None, hidden=8, vocab=16):
        self.mistake = mistake
        self.wte = nn.Embedding(vocab, hidden, vocab_parallel=True)
        self.fc = nn.Linear(hidden + (mistake == "shape"), hidden, parallel="column")
        if mistake == "dim":
            sw.shard(self.fc.weight, tq=sw.Shard(0))  # unknown dim
        if mistake == "partial":
            sw.shard(self.fc.weight, tp=sw.Partial())  # partial parameter

    def forward(self, ids, labels):
        x = self.wte(ids)
        if self.mistake == "dtype":
            x = nn.ops.embedding(x, self.wte.weight())  # wrong dtype
        if self.mistake == "rule":
            sw.shard(x, tp=sw.Shard(3))  # no rule
        if self.mistake == "ids":
            sw.shard(ids, tp=sw.Partial())  # ids not split over dp
        h = self.fc(x)  # shape
        return nn.lm_head_loss(h, self.wte.weight(), labels)


@pytest.mark.parametrize("mistake, marker, words", [
    ("shape", "shape", "matmul"),
    ("dtype", "wrong dtype", "embedding"),
    ("dim", "unknown dim", "unknown mesh dim 'tq'"),
    ("rule", "no rule", "placement S(3) on mesh dim 1 names tensor dim 3, but the tensor has rank 3"),
    ("partial", "partial parameter", "a parameter is stored whole or sharded"),
])
def test_a_mistake_names_the_users_line(mistake, marker, words):
    with pytest.raises(sw.Error) as e:
        sw.trace(Tiny(mistake), mesh="dp=2,tp=2", batch=4, seq=4)
    message = str(e.value)
    assert message.startswith(f"{__file__}:{line_of(marker)}: "), message
    assert words in message


def test_the_trainer_reports_the_users_line(tmp_path):
    with pytest.raises(sw.Error) as e:
        sw.Trainer(model=Tiny("shape", vocab=128), mesh="dp=2", digits=2, seq=12, vocab=128, steps=1,
                   global_batch=4, progress="none", run_dir=tmp_path / "run")
    assert f"{__file__}:{line_of('shape')}: " in str(e.value)


def test_an_error_of_the_run_names_the_line_that_placed_the_value(tmp_path):
    # Tracing accepts ids placed Partial over tp (and so whole over dp); the loader, which splits
    # the batch over dp, refuses it: the error names the user's shard() line.
    with pytest.raises(sw.Error) as e:
        trainer = sw.Trainer(model=Tiny("ids", vocab=128), mesh="dp=2,tp=2", digits=2, seq=12, vocab=128,
                             steps=1, global_batch=8, progress="none", run_dir=tmp_path / "run")
        trainer.step()
    assert str(e.value).startswith(f"{__file__}:{line_of('ids not split over dp')}: "), str(e.value)
    assert "'ids'" in str(e.value)


def test_a_correct_model_traces():
    graph = sw.trace(Tiny(), mesh="dp=2,tp=2", batch=4, seq=4)
    assert graph.loss.shape == ()


def test_a_pipeline_needs_a_decoder(tmp_path):
    # A pp mesh cuts the model by its blocks: a plain Module (one forward) is refused by name.
    with pytest.raises(sw.Error, match="write Tiny as a shardwise.nn.Decoder"):
        sw.Trainer(model=Tiny(vocab=128), mesh="pp=2", digits=2, seq=12, vocab=128, steps=1, global_batch=8,
                   progress="none", run_dir=tmp_path / "run")


def test_a_cp_mesh_is_refused_to_a_fed_model_by_name(tmp_path):
    # The trainer stores token ids in cp's balanced order (nn follows it); a model fed batches of its
    # own is not put in that order: a cp mesh is refused rather than trained wrong.
    class Fed(nn.Module):
        def __init__(self):
            self.w = nn.Parameter((4, 1), std=0.1)

        def forward(self, x, y):
            error = (x @ self.w()).reshape(y.shape[0]) - y
            return nn.ops.mean(error * error)

    batch = {"x": np.ones((4, 4), np.float32), "y": np.zeros(4, np.float32)}
    with pytest.raises(sw.Error) as e:
        trainer = sw.Trainer(model=Fed(), data=[batch], mesh="cp=2", seq=12, steps=1, global_batch=4,
                             progress="none", run_dir=tmp_path / "run")
        trainer.step()
    assert "context parallelism (cp) does not compose with a Python model fed batches of its own" in str(e.value)
