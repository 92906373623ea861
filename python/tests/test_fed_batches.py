"""A model fed batches of its own from NumPy (Trainer(data=...), Trainer.step(batch=...)):
examples/vit_tiny.py, a ViT on float patches [B, P, D] with integer class labels [B] (and its
mean-squared-error reward head on float targets [B]), gives its single-rank curve on every mesh
(each rank binding its rows of the batch; on pp meshes the patches on the first stage, the labels
on the last) and its PyTorch reference's (tests/golden/vit_*_losses.json,
tools/pymodel_golden.py); a batch of the wrong shape or dtype is an error naming the input."""
import importlib.util
import json
import pathlib

import numpy as np
import pytest

import shardwise as sw

REPO = pathlib.Path(__file__).resolve().parents[2]
SIZE = {"patches": 4, "patch_dim": 12, "hidden": 16, "heads": 2, "layers": 2, "classes": 4}
RUN = {"global_batch": 8, "lr": 3e-3, "min_lr": 3e-4, "warmup": 5, "weight_decay": 0.1, "clip": 1.0,
       "seed": 20261122, "eval_every": 0, "progress": "none"}
STEPS = 20


def vit_tiny():
    spec = importlib.util.spec_from_file_location("vit_tiny", REPO / "examples" / "vit_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vit_curve(tmp_path, mesh, head="classes", steps=STEPS, **options):
    vit = vit_tiny()
    model = vit.ViT(**SIZE, head_loss=head)
    data = vit.synthetic_batches(model, RUN["global_batch"], steps)
    with sw.Trainer(model=model, data=data, mesh=mesh, steps=steps, run_dir=tmp_path / mesh, **RUN,
                    **options) as trainer:
        return [trainer.step().loss for _ in range(steps)]


@pytest.fixture(scope="module", params=["classes", "reward"])
def single(request, tmp_path_factory):
    return request.param, vit_curve(tmp_path_factory.mktemp("single"), "dp=1", request.param)


@pytest.mark.parametrize("mesh", ["dp=2", "tp=2", "dp=2,tp=2", "pp=2", "dp=2,pp=2"])
def test_vit_curve_is_the_single_rank_curve_on_every_mesh(tmp_path, single, mesh):
    head, expected = single
    assert vit_curve(tmp_path, mesh, head) == pytest.approx(expected, abs=1e-5)
    assert expected[-1] < expected[0] * (0.97 if head == "classes" else 0.5)  # it learns


@pytest.mark.parametrize("head", ["classes", "reward"])
def test_vit_equals_its_pytorch_reference(tmp_path, head):
    golden = json.loads((REPO / "tests" / "golden" / f"vit_{head}_losses.json").read_text())
    cfg = golden["config"]
    assert {k: cfg[k] for k in SIZE} == SIZE and cfg["head_loss"] == head
    assert vit_curve(tmp_path, "dp=1", head) == pytest.approx(golden["losses"], rel=1e-4)


def test_accumulated_micro_batches_take_their_own_rows(tmp_path, single):
    # Two micro-batches of 4 rows on dp=2 (2 rows a rank each): the same curve as one of 8.
    head, expected = single
    assert vit_curve(tmp_path, "dp=2", head, micro_batch=2) == pytest.approx(expected, abs=1e-5)


def test_step_batch_is_the_data_path_and_a_different_batch_trains_differently(tmp_path):
    vit = vit_tiny()
    model = vit.ViT(**SIZE)
    batches = vit.synthetic_batches(model, RUN["global_batch"], 3)
    options = dict(model=model, mesh="dp=2", steps=3, **RUN)
    with sw.Trainer(inputs=batches[0], run_dir=tmp_path / "a", **options) as trainer:
        given = [trainer.step(batch=b).loss for b in batches]
    with sw.Trainer(data=lambda step: batches[step], run_dir=tmp_path / "b", **options) as trainer:
        assert [trainer.step().loss for _ in range(3)] == given
    swapped = {"patches": batches[0]["patches"][::-1].copy(), "labels": batches[0]["labels"]}
    with sw.Trainer(inputs=batches[0], run_dir=tmp_path / "c", **options) as trainer:
        assert trainer.step(batch=swapped).loss != given[0]


def test_a_wrong_batch_is_an_error_naming_the_input(tmp_path):
    vit = vit_tiny()
    model = vit.ViT(**SIZE)
    good = vit.synthetic_batches(model, RUN["global_batch"], 1)[0]
    with sw.Trainer(model=model, inputs=good, mesh="dp=2", steps=3, run_dir=tmp_path / "r", **RUN) as trainer:
        with pytest.raises(sw.UsageError, match=r"'patches' must be f32 of shape \(8, 4, 12\).*float64"):
            trainer.step(batch=dict(good, patches=good["patches"].astype(np.float64)))
        with pytest.raises(sw.UsageError, match=r"'labels' must be i64 of shape \(8,\).*\(4,\)"):
            trainer.step(batch=dict(good, labels=good["labels"][:4]))
        with pytest.raises(sw.UsageError, match=r"the inputs \['labels', 'patches'\], got \['patches'\]"):
            trainer.step(batch={"patches": good["patches"]})
        with pytest.raises(sw.UsageError, match="patches: the array of shape 8x4x12 is not C-contiguous"):
            trainer.step(batch=dict(good, patches=np.asfortranarray(good["patches"])))
        with pytest.raises(sw.UsageError, match="no batch for this step"):
            trainer.step()
        assert trainer.step(batch=good).step == 1  # the run goes on after the refused batches
        assert trainer.memory_plan()  # planned with the fed inputs, not the loader's ids
    with pytest.raises(sw.UsageError, match=r"ViT.forward cannot take the batch's inputs \['image', 'labels'\]"):
        sw.Trainer(model=model, inputs={"image": good["patches"], "labels": good["labels"]}, steps=1,
                   run_dir=tmp_path / "s", **RUN)


def test_data_naming_files_is_still_the_data_option(tmp_path):
    # A path (or a list of them) is `--data`: token files for the loader, not batches.
    with pytest.raises(sw.Error, match="missing.bin"):
        sw.Trainer(data=str(tmp_path / "missing.bin"), steps=1, run_dir=tmp_path / "r", progress="none")


def test_trace_takes_an_example_batch_and_a_plain_module_is_refused_on_pp(tmp_path):
    vit = vit_tiny()
    model = vit.ViT(**SIZE)
    batch = vit.synthetic_batches(model, RUN["global_batch"], 1)[0]
    graph = sw.trace(model, mesh="dp=2,tp=2", batch=8, inputs=batch)
    assert graph.loss.shape == ()
    assert "patches (input f32 8x4x12): [S(0),R]" in graph.explain("patches")  # rows over dp
    # Fed batches reach pipeline stages (the ViT is an nn.Decoder), but a plain Module has no stages.
    class Plain(sw.nn.Module):
        def __init__(self):
            self.vit = vit.ViT(**SIZE)

        def forward(self, patches, labels):
            return self.vit(patches, labels)

    with pytest.raises(sw.UsageError, match="write Plain as a shardwise.nn.Decoder"):
        sw.Trainer(model=Plain(), inputs=batch, mesh="pp=2", steps=1, run_dir=tmp_path / "pp", **RUN)


def test_a_batch_for_a_model_on_token_ids_is_refused(tmp_path):
    with sw.Trainer(steps=1, global_batch=8, digits=2, layers=1, hidden=32, heads=2, progress="none",
                    run_dir=tmp_path / "r") as trainer:
        with pytest.raises(sw.UsageError, match="for a model fed batches of its own"):
            trainer.step(batch={"x": np.zeros((8, 2), np.float32)})
        assert trainer.step().step == 1


@pytest.mark.parametrize("mesh", ["dp=1", "dp=2", "tp=2", "pp=2"])
def test_a_python_model_on_the_fake_device_gives_the_cpu_curve_bit_for_bit(tmp_path, mesh):
    # device="fake": the parameters, state and every step's tensors in the fake device's memory
    # (host memory closed to the host outside explicit copies), each micro-batch's fed rows copied in.
    cpu = vit_curve(tmp_path / "cpu", mesh, steps=4)
    assert vit_curve(tmp_path / "dev", mesh, steps=4, device="fake") == cpu
