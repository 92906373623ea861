"""Trainer.evaluate(batch): the outputs a model written in Python marks (nn.output; the LM head's
"logits"), whole, from its forward without dropout on any mesh; no gradient, no step."""
import importlib.util
import pathlib

import numpy as np
import pytest

import shardwise as sw
from shardwise import nn
from shardwise.models import GPT2

REPO = pathlib.Path(__file__).resolve().parents[2]
RUN = {"global_batch": 8, "digits": 2, "seq": 12, "vocab": 128, "eval_every": 0, "progress": "none"}
SIZE = {"layers": 2, "hidden": 32, "heads": 2}
IDS = np.random.default_rng(0).integers(0, RUN["vocab"], size=(5, RUN["seq"]), dtype=np.int64)  # 5 rows: padded


def gpt2():
    return GPT2(seq=RUN["seq"], vocab=RUN["vocab"], **SIZE)


def outputs(tmp_path, tag, model, batch, steps=0, **options):
    with sw.Trainer(model=model, steps=max(steps, 1), run_dir=tmp_path / tag, **RUN, **options) as trainer:
        for _ in range(steps):
            trainer.step()
        return trainer.evaluate(batch)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    return outputs(tmp_path_factory.mktemp("one"), "one", gpt2(), {"ids": IDS})


@pytest.mark.parametrize("mesh", ["dp=2,tp=2", "tp=2,pp=2", "dp=2,pp=2"])
def test_gpt2_logits_on_a_mesh_equal_one_ranks(tmp_path, one_rank, mesh):
    logits = one_rank["logits"]
    assert list(one_rank) == ["logits"] and logits.shape == (5, RUN["seq"], RUN["vocab"]) and logits.dtype == np.float32
    got = outputs(tmp_path, "mesh", gpt2(), {"ids": IDS}, mesh=mesh)["logits"]
    assert got.shape == logits.shape
    assert np.abs(got - logits).max() < 1e-5


def test_gpt2_logits_equal_the_builtin_models_generate(tmp_path, one_rank):
    # The built-in GPT-2 of the same seed is the same model (the Python one gives its losses bit for
    # bit): generate's logits of the token after a prompt of 11 tokens are the logits at position 10.
    with sw.Trainer(mesh="dp=1", steps=1, run_dir=tmp_path / "builtin", **RUN, **SIZE) as trainer:
        checkpoint = trainer.save()
    for row in range(IDS.shape[0]):
        _, logits = sw.generate(checkpoint, prompt_ids=IDS[row, :11], max_new_tokens=1, eos_id=-1, return_logits=True,
                                kv_cache=False)
        assert np.abs(logits[0] - one_rank["logits"][row, 10]).max() < 1e-5, row
    assert np.abs(one_rank["logits"][:, 10]).max() > 1e-2  # the comparison can fail


def test_evaluating_leaves_the_training_curve_unchanged(tmp_path):
    # No gradient and no step: the losses with an evaluation before every step are the losses without.
    def losses(tag, evaluate):
        with sw.Trainer(model=gpt2(), mesh="dp=2,tp=2", steps=3, run_dir=tmp_path / tag, **RUN) as trainer:
            seen = []
            for _ in range(3):
                if evaluate:
                    trainer.evaluate({"ids": IDS})
                seen.append(trainer.step().loss)
            return seen, trainer.evaluate({"ids": IDS})["logits"]

    plain, after = losses("plain", False)
    evaluated, after_evaluated = losses("evaluated", True)
    assert evaluated == plain
    assert np.array_equal(after, after_evaluated)


def test_a_fed_models_pooled_and_reward_outputs_on_a_mesh_equal_one_ranks(tmp_path):
    spec = importlib.util.spec_from_file_location("vit_tiny", REPO / "examples" / "vit_tiny.py")
    vit_tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vit_tiny)
    size = {"patches": 4, "patch_dim": 12, "hidden": 16, "heads": 2, "layers": 2}
    got = {}
    for mesh in ("dp=1", "dp=2,tp=2"):
        model = vit_tiny.ViT(**size, classes=4, head_loss="reward")
        data = vit_tiny.synthetic_batches(model, global_batch=8, steps=2)
        with sw.Trainer(model=model, data=data, mesh=mesh, global_batch=8, steps=2, progress="none",
                        run_dir=tmp_path / mesh) as trainer:
            trainer.step()
            got[mesh] = trainer.evaluate({"patches": data[1]["patches"][:6]})  # labels absent: zeros
    assert sorted(got["dp=1"]) == ["pooled", "reward"]
    assert got["dp=1"]["pooled"].shape == (6, 16) and got["dp=1"]["reward"].shape == (6, 1)
    for name in ("pooled", "reward"):
        assert np.abs(got["dp=2,tp=2"][name] - got["dp=1"][name]).max() < 1e-5, name


def test_evaluate_errors_name_the_problem(tmp_path):
    class NoOutput(nn.Module):
        def __init__(self):
            self.emb = nn.Embedding(RUN["vocab"], 16)

        def forward(self, ids, labels):
            return nn.cross_entropy(self.emb(ids), labels)

    with sw.Trainer(model=NoOutput(), steps=1, run_dir=tmp_path / "none", **RUN) as trainer:
        with pytest.raises(sw.UsageError, match=r"marks no output: mark one in forward with nn.output"):
            trainer.evaluate({"ids": IDS})
        with pytest.raises(sw.UsageError, match=r"evaluate\(batch\) gives the outputs it marks"):
            trainer.evaluate()
        with pytest.raises(sw.UsageError, match=r"of the inputs \['ids', 'labels'\]; got \['tokens'\]"):
            trainer.evaluate({"tokens": IDS})
        with pytest.raises(sw.UsageError, match=r"'ids' must be i64 of shape \(5, 12\)"):
            trainer.evaluate({"ids": IDS[:, :4]})
    with sw.Trainer(model=gpt2(), mesh="cp=2", steps=1, run_dir=tmp_path / "cp", **RUN) as trainer:
        with pytest.raises(sw.Error, match=r"evaluate\(batch\) on a mesh with a cp dim is not built yet"):
            trainer.evaluate({"ids": IDS})
    with sw.Trainer(steps=1, run_dir=tmp_path / "builtin", **RUN, **SIZE) as trainer:
        with pytest.raises(sw.UsageError, match=r"return_logits=True"):
            trainer.evaluate({"ids": IDS})
