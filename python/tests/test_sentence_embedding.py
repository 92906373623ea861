"""examples/sentence_embedding.py: a Qwen2-style decoder trained as a sentence embedder on batches
fed from NumPy, by InfoNCE over in-batch negatives gathered over dp (and its pooled reward head by
the MSE), gives its single-rank curve on every mesh and its PyTorch reference's
(tests/golden/embed_*_losses.json, tools/pymodel_golden.py export-embed / torch-embed); without the
gather (each dp rank's own negatives) the dp curve is another."""
import importlib.util
import json
import pathlib

import numpy as np
import pytest

import shardwise as sw

REPO = pathlib.Path(__file__).resolve().parents[2]


def golden(head):
    return json.loads((REPO / "tests" / "golden" / f"embed_{head}_losses.json").read_text())


# The run and the model's size are the PyTorch reference's.
CONFIG = golden("contrastive")["config"]
SIZE = {k: CONFIG[k] for k in ("layers", "hidden", "heads", "kv_heads", "vocab")}
RUN = dict({k: CONFIG[k] for k in ("global_batch", "lr", "min_lr", "warmup", "weight_decay", "clip", "seed")},
           eval_every=0, progress="none")
SEQ, STEPS = CONFIG["seq"], CONFIG["steps"]


def example():
    path = REPO / "examples" / "sentence_embedding.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def curve(tmp_path, mesh, micro=None, **model_options):
    se = example()
    model = se.SentenceEmbedder(**SIZE, **model_options)
    data = se.synthetic_batches(model, RUN["global_batch"], SEQ, STEPS, micro_batch=micro)
    dp = dict(d.split("=") for d in mesh.split(",")).get("dp", "1")
    options = {} if micro is None else {"micro_batch": micro // int(dp)}
    with sw.Trainer(model=model, data=data, mesh=mesh, steps=STEPS, run_dir=tmp_path / mesh, **RUN,
                    **options) as trainer:
        return [trainer.step().loss for _ in range(STEPS)]


@pytest.fixture(scope="module", params=["contrastive", "reward"])
def single(request, tmp_path_factory):
    return request.param, curve(tmp_path_factory.mktemp("single"), "dp=1", head_loss=request.param)


@pytest.mark.parametrize("mesh", ["dp=2", "tp=2", "dp=2,tp=2", "pp=2"])
def test_embedder_curve_is_the_single_rank_curve_on_every_mesh(tmp_path, single, mesh):
    # pp=2: the batches reach the first stage's embed(query, passage) and the last stage's
    # head(x, labels); one micro-batch of all 8 rows, so the negatives are the single-rank run's.
    head, expected = single
    micro = RUN["global_batch"] if "pp" in mesh else None
    assert curve(tmp_path, mesh, micro, head_loss=head) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("head", ["contrastive", "reward"])
def test_embedder_equals_its_pytorch_reference(tmp_path, head):
    reference = golden(head)
    assert reference["config"]["head_loss"] == head
    assert {k: reference["config"][k] for k in CONFIG if k != "head_loss"} == {k: v for k, v in CONFIG.items()
                                                                              if k != "head_loss"}
    losses = curve(tmp_path, "dp=1", head_loss=head)
    assert losses == pytest.approx(reference["losses"], rel=1e-4)
    if head == "reward":
        assert sum(losses[-5:]) < 0.25 * sum(losses[:5])  # it learns


def test_negatives_not_gathered_over_dp_give_another_dp_curve(tmp_path):
    # Each dp rank's queries against its own passages only: on dp=2 a different loss from the first
    # step, so the curves above equal the single-rank one because the negatives cross dp.
    expected = curve(tmp_path / "single", "dp=1", head_loss="contrastive")
    local = curve(tmp_path, "dp=2", negatives="local", dp=2)
    assert abs(local[0] - expected[0]) > 1e-2
    assert curve(tmp_path / "one", "dp=1", negatives="local", dp=2) == pytest.approx(local, abs=1e-5)


def test_passage_embeddings_are_all_gathered_and_their_gradient_reduce_scattered():
    se = example()
    model = se.SentenceEmbedder(**SIZE)
    batch = se.synthetic_batches(model, RUN["global_batch"], SEQ, 1)[0]
    summary = sw.trace(model, mesh="dp=2", batch=8, inputs=batch).plan(summary=True)
    assert "all_gather x1" in summary and "reduce_scatter x1" in summary
    assert "all_gather" not in sw.trace(se.SentenceEmbedder(**SIZE, negatives="local", dp=2), mesh="dp=2", batch=8,
                                        inputs=batch).plan(summary=True)


@pytest.mark.parametrize("mesh", ["dp=2", "dp=2,tp=2", "pp=2", "dp=2,pp=2"])
def test_mean_pooling_and_accumulation_keep_the_single_rank_curve(tmp_path, mesh):
    # Two micro-batches of 4 rows (accumulated, or the pipeline's): each its own negatives (labels
    # index the micro-batch's rows).
    expected = curve(tmp_path / "one", "dp=1", micro=4, pooling="mean")
    assert curve(tmp_path, mesh, micro=4, pooling="mean") == pytest.approx(expected, abs=1e-5)
    assert expected != pytest.approx(curve(tmp_path / "whole", "dp=1", pooling="mean"), abs=1e-3)


def test_a_fed_input_no_stage_takes_is_an_error_on_pp(tmp_path):
    se = example()
    model = se.SentenceEmbedder(**SIZE)
    batch = dict(se.synthetic_batches(model, RUN["global_batch"], SEQ, 1)[0], weights=np.ones(8, np.float32))
    with pytest.raises(sw.UsageError, match=r"embed\(\) \(the first stage\) or head\(\) \(the last\).*\['weights'\]"):
        sw.Trainer(model=model, inputs=batch, mesh="pp=2", steps=1, run_dir=tmp_path / "r", **RUN)


@pytest.mark.parametrize("mesh", ["dp=1", "dp=2,tp=2", "pp=2"])
def test_validate_gives_held_out_batches_mean_loss_as_one_rank(tmp_path, mesh):
    se = example()
    model = se.SentenceEmbedder(**SIZE)
    batches = se.synthetic_batches(model, RUN["global_batch"], SEQ, STEPS)  # the PyTorch reference's
    held = se.synthetic_batches(model, RUN["global_batch"], SEQ, 2, seed=1)
    micro = {"micro_batch": RUN["global_batch"]} if "pp" in mesh else {}
    with sw.Trainer(model=model, inputs=batches[0], mesh=mesh, steps=3, run_dir=tmp_path / "v", **RUN, **micro) as t:
        first = t.validate([batches[0]])
        each = [t.validate(b) for b in held]
        before = t.validate(held)
        losses = [t.step(batch=b).loss for b in batches[:2]]
        after = t.validate(held)
        assert t.step(batch=batches[2]).step == 3
    # The initial parameters' loss on the first batch: eager PyTorch's first loss, and the first step's.
    assert first == pytest.approx(golden("contrastive")["losses"][0], rel=1e-4)
    assert first == pytest.approx(losses[0], abs=1e-6)
    assert before == pytest.approx(sum(each) / 2, abs=1e-6) and after != pytest.approx(before, abs=1e-4)
    # Validating changes nothing: the run's curve is the one without it.
    with sw.Trainer(model=model, inputs=batches[0], mesh=mesh, steps=3, run_dir=tmp_path / "t", **RUN, **micro) as t:
        assert [t.step(batch=b).loss for b in batches[:2]] == losses


def test_validate_of_a_fed_model_needs_batches_of_its_inputs(tmp_path):
    se = example()
    model = se.SentenceEmbedder(**SIZE)
    batch = se.synthetic_batches(model, RUN["global_batch"], SEQ, 1)[0]
    with sw.Trainer(model=model, inputs=batch, mesh="dp=2", steps=1, run_dir=tmp_path / "r", **RUN) as t:
        with pytest.raises(sw.UsageError, match="needs held-out batches"):
            t.validate()
        with pytest.raises(sw.UsageError, match=r"the batch's 'query' must be i64 of shape \(8, 8\)"):
            t.validate([dict(batch, query=batch["query"][:4])])
    with sw.Trainer(steps=1, global_batch=8, digits=2, layers=1, hidden=32, heads=2, progress="none",
                    run_dir=tmp_path / "builtin") as t:
        with pytest.raises(sw.UsageError, match=r"validate\(data\) is for a model fed batches of its own"):
            t.validate([batch])


def test_contrastive_training_lowers_the_held_out_loss(tmp_path):
    # The in-batch losses jump with each batch's hardness; 8 held-out batches show it learns.
    se = example()
    model = se.SentenceEmbedder(**SIZE)
    held = se.synthetic_batches(model, RUN["global_batch"], SEQ, 8, seed=1)
    data = se.synthetic_batches(model, RUN["global_batch"], SEQ, STEPS)
    with sw.Trainer(model=model, data=data, mesh="dp=2", steps=STEPS, run_dir=tmp_path / "r", **RUN) as t:
        before = t.validate(held)
        for _ in range(STEPS):
            t.step()
        assert t.validate(held) < 0.8 * before
