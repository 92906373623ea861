"""Models written in Python (shardwise.nn, shardwise.ops) trained by the Trainer: the Python GPT-2
gives the built-in model's losses bit for bit on every mesh; a model the project does not have
(examples/gptj.py) gives its single-rank curve on every mesh; ops come from the C++ registry."""
import importlib.util
import pathlib

import numpy as np
import pytest

import shardwise as sw
from shardwise import nn
from shardwise.models import GPT2, Llama

REPO = pathlib.Path(__file__).resolve().parents[2]
# The embedded addition task (2 digits), a tiny GPT-2.
SIZE = {"layers": 2, "hidden": 32, "heads": 2}
RUN = {"global_batch": 8, "digits": 2, "seq": 12, "vocab": 128, "eval_every": 0, "progress": "none"}


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def curve(tmp_path, tag, model=None, steps=4, **options):
    with sw.Trainer(model=model, steps=steps, run_dir=tmp_path / tag, **RUN, **options) as trainer:
        return [(m.loss, m.grad_norm) for m in (trainer.step() for _ in range(steps))]




@pytest.mark.parametrize("mesh", ["dp=1", "dp=2", "tp=2", "dp=2,tp=2", "pp=2", "dp=2,pp=2"])
def test_python_gpt2_equals_the_builtin_bit_for_bit(tmp_path, mesh):
    seq, vocab = RUN["seq"], RUN["vocab"]
    builtin = curve(tmp_path, "builtin", mesh=mesh, **SIZE)
    python = curve(tmp_path, "python", model=GPT2(seq=seq, vocab=vocab, **SIZE), mesh=mesh)
    assert python == builtin  # losses and gradient norms, exactly


@pytest.mark.parametrize("mesh", ["dp=1", "dp=2,tp=2"])
def test_python_gpt2_with_dropout_and_bf16_equals_the_builtin(tmp_path, mesh):
    # Dropout at every site of the built-in model (masks keyed by the seed, the site, the sample and
    # the position) and bf16 parameters with f32 masters: still bit for bit.
    for options in ({"dropout": 0.1}, {"bf16": True}):
        builtin = curve(tmp_path, "builtin", mesh=mesh, **SIZE, **options)
        model = GPT2(seq=RUN["seq"], vocab=RUN["vocab"], dropout=options.get("dropout", 0.0), **SIZE)
        python = curve(tmp_path, "python", model=model, mesh=mesh, bf16=options.get("bf16", False))
        assert python == builtin, options


@pytest.mark.parametrize("mesh", ["dp=1", "dp=2,tp=2", "pp=2"])
def test_python_llama_equals_the_builtin_bit_for_bit(tmp_path, mesh):
    # Grouped-query attention (4 heads, 2 kv heads), rotary positions, RMSNorm, SwiGLU, weights
    # [out, in]; the built-in run is Trainer(model="llama"): a string is still the --model option.
    size = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2}
    builtin = curve(tmp_path, "builtin", model="llama", mesh=mesh, **size)
    python = curve(tmp_path, "python", model=Llama(vocab=RUN["vocab"], **size), mesh=mesh)
    assert python == builtin


MOE = {"experts": 4, "top_k": 2, "aux_loss": 0.02, "z_loss": 0.001}


@pytest.mark.parametrize("mesh", ["dp=1", "ep=2", "dp=2,tp=2", "pp=2"])
def test_python_mixtral_equals_the_builtin_bit_for_bit(tmp_path, mesh):
    # nn.MoE (moe_mlp, experts split over ep, the router's aux and z losses added to the loss; on
    # pp=2 the first stage's router losses are its extra loss) against --model llama --experts 4.
    size = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2}
    builtin = curve(tmp_path, "builtin", model="llama", mesh=mesh, intermediate_size=48, experts=4, top_k=2,
                    aux_loss=0.02, router_z_loss=0.001, **size)
    python = curve(tmp_path, "python", model=Llama(vocab=RUN["vocab"], width=48, moe=MOE, **size), mesh=mesh)
    assert python == builtin


@pytest.mark.parametrize("mesh", ["dp=1", "ep=2", "pp=2"])
def test_python_mixtral_metrics_carry_the_builtin_router_statistics(tmp_path, mesh):
    # Each MoE layer's expert loads (min, mean, max tokens), dropped tokens, aux and z losses in the
    # metrics equal --experts 4's; the old code logged none for the Python model.
    size = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2}
    options = dict(RUN, mesh=mesh, steps=2)

    def moe(tag, model, **more):
        with sw.Trainer(model=model, run_dir=tmp_path / tag, **options, **more) as trainer:
            return [trainer.step().to_dict().get("moe") for _ in range(2)]

    builtin = moe("builtin", "llama", intermediate_size=48, experts=4, top_k=2, aux_loss=0.02, router_z_loss=0.001,
                  **size)
    python = moe("python", Llama(vocab=RUN["vocab"], width=48, moe=MOE, **size))
    assert [len(step) for step in builtin] == [2, 2] and builtin[0][1]["layer"] == 1
    assert python == builtin


def test_python_gpt2_differs_when_its_graph_differs(tmp_path):
    # The comparison above can fail: one LayerNorm epsilon changed changes the losses.
    seq, vocab = RUN["seq"], RUN["vocab"]
    model = GPT2(seq=seq, vocab=vocab, **SIZE)
    model.transformer.ln_f.eps = 1e-3
    assert curve(tmp_path, "other", model=model, steps=2) != curve(tmp_path, "b", **SIZE, steps=2)


@pytest.fixture(scope="module")
def gptj_single(tmp_path_factory):
    model = load_example("gptj").GPTJ(layers=2, hidden=32, heads=2, vocab=RUN["vocab"])
    return curve(tmp_path_factory.mktemp("gptj"), "single", model=model, steps=20, mesh="dp=1")


@pytest.mark.parametrize("mesh, options, recompute", [
    ("dp=2", {}, False), ("tp=2", {}, False), ("dp=2,tp=2", {}, False),
    ("dp=2,tp=2", {"sharding_stage": 3}, False), ("dp=2", {"sharding_stage": 2, "micro_batch": 2}, False),
    ("dp=2", {"sharding_stage": 1}, True), ("pp=2", {}, False), ("tp=2,pp=2", {"schedule": "fthenb"}, False),
])
def test_gptj_curve_is_the_single_rank_curve_on_every_mesh(tmp_path, gptj_single, mesh, options, recompute):
    gptj = load_example("gptj")
    model = gptj.GPTJ(layers=2, hidden=32, heads=2, vocab=RUN["vocab"], recompute=recompute)
    sharded = curve(tmp_path, "mesh", model=model, steps=20, mesh=mesh, **options)
    assert len(sharded) == 20
    for (loss, _), (single, _) in zip(sharded, gptj_single):
        assert loss == pytest.approx(single, abs=1e-5)
    assert gptj_single[-1][0] < gptj_single[0][0] - 0.3  # it learns


def test_every_registered_op_is_reachable_by_name():
    names = [op.name for op in sw.ops()]
    assert "matmul" in names and "flash_attention" in names
    for name in names:
        assert callable(getattr(sw.ops, name)) and getattr(sw.ops, name).__name__ == name
    assert set(names) <= set(dir(sw.ops))
    with pytest.raises(AttributeError, match="no op named 'matmull'; did you mean 'matmul'"):
        sw.ops.matmull


def test_trace_gives_symbolic_tensors_and_the_users_names():
    seq, vocab = 8, 16
    graph = sw.trace(GPT2(layers=1, hidden=16, heads=2, seq=seq, vocab=vocab), mesh="dp=2,tp=2", batch=4, seq=seq)
    assert graph.loss.shape == () and graph.loss.dtype == "f32"
    assert "transformer.h.0.attn.q_proj.weight" in graph.sites
    assert any("flash_attention" in node for node in graph.nodes)


def test_gptj_equals_its_pytorch_reference(tmp_path):
    # tests/golden/gptj_losses.json: the same model in eager float32 PyTorch from the same initial
    # weights and batches (tools/pymodel_golden.py, run outside make test).
    import json

    golden = json.loads((REPO / "tests" / "golden" / "gptj_losses.json").read_text())
    cfg = golden["config"]
    model = load_example("gptj").GPTJ(layers=cfg["layers"], hidden=cfg["hidden"], heads=cfg["heads"],
                                      vocab=cfg["vocab"])
    options = {k: cfg[k] for k in ("mesh", "digits", "seq", "vocab", "global_batch", "lr", "min_lr", "warmup",
                                   "weight_decay", "clip", "seed", "beta1", "beta2")}
    with sw.Trainer(model=model, steps=cfg["steps"], progress="none", run_dir=tmp_path / "run", **options) as trainer:
        losses = [trainer.step().loss for _ in range(cfg["steps"])]
    assert losses == pytest.approx(golden["losses"], rel=1e-4)


def test_a_python_models_checkpoint_holds_its_names_on_any_mesh(tmp_path):
    # Saved after 2 steps on dp=2 x tp=2 and on one rank: the parameters under the model's own
    # names (examples/gptj.py's attribute paths), each the whole tensor, the two meshes' within
    # 1e-5 of each other; config.json is the model_config given.
    import json
    from shardwise import checkpoint as ckpt

    gptj = load_example("gptj")
    saved = {}
    for mesh in ("dp=1", "dp=2,tp=2"):
        model = gptj.GPTJ(layers=2, hidden=32, heads=2, vocab=RUN["vocab"])
        with sw.Trainer(model=model, model_config={"model_type": "gptj_example", "n_layer": 2}, mesh=mesh, steps=2,
                        run_dir=tmp_path / mesh, **RUN) as trainer:
            trainer.step(), trainer.step()
            directory = trainer.save()
        saved[mesh] = ckpt.load(directory, {"dp": 1}, [sw.Replicate()], rank=0)
        config = json.loads((pathlib.Path(directory) / "config.json").read_text())
        assert config["model_type"] == "gptj_example" and config["vocab_size"] == RUN["vocab"]
    names = {name for name, _ in model.named_parameters()}
    assert set(saved["dp=1"]) == names and "transformer.h.1.mlp.fc_in.weight" in names
    for name in names:
        assert saved["dp=2,tp=2"][name].shape == saved["dp=1"][name].shape
        assert abs(saved["dp=2,tp=2"][name] - saved["dp=1"][name]).max() < 1e-5, name


def test_the_memory_plan_is_the_python_models(tmp_path):
    # One rank holds every parameter: 4 bytes an element of the model's own parameters (GPT-J's,
    # not the built-in GPT-2's the options would describe), and the Python GPT-2's plan is the
    # built-in's on dp=2 x tp=2.
    gptj = load_example("gptj").GPTJ(layers=2, hidden=32, heads=2, vocab=RUN["vocab"])
    with sw.Trainer(model=gptj, mesh="dp=1", steps=1, run_dir=tmp_path / "j", **RUN) as trainer:
        plan = trainer.memory_plan()
    elements = sum(int(np.prod(p.shape)) for _, p in gptj.named_parameters())
    assert plan["ranks"][0]["params"] == 4 * elements
    plans = []
    for model in (GPT2(seq=RUN["seq"], vocab=RUN["vocab"], **SIZE), None):
        options = {} if model else SIZE
        with sw.Trainer(model=model, mesh="dp=2,tp=2", steps=1, run_dir=tmp_path / str(len(plans)), **RUN,
                        **options) as trainer:
            plans.append(trainer.memory_plan()["ranks"])
    assert plans[0] == plans[1]


def test_a_python_model_resumes_from_its_checkpoint(tmp_path):
    # Resumed from the checkpoint of step 2, step 3 is the uninterrupted run's step 3.
    gptj = load_example("gptj")
    options = dict(RUN, mesh="dp=2,tp=2", steps=3)
    with sw.Trainer(model=gptj.GPTJ(layers=2, hidden=32, heads=2, vocab=RUN["vocab"]), save_every=1,
                    run_dir=tmp_path / "a", **options) as trainer:
        losses = [trainer.step().loss for _ in range(3)]
    with sw.Trainer(model=gptj.GPTJ(layers=2, hidden=32, heads=2, vocab=RUN["vocab"]), run_dir=tmp_path / "b",
                    resume=tmp_path / "a" / "checkpoints" / "checkpoint-2", **options) as trainer:
        assert trainer.steps == 2
        assert trainer.step().loss == losses[2]


def test_plan_and_explain_of_a_traced_model(cli):
    # The Python GPT-2's program has the built-in one's reshards and collectives (`shardwise plan
    # --summary` of the same run), and explain() says why a value got its placement.
    size = {"layers": 2, "hidden": 32, "heads": 2}
    graph = sw.trace(GPT2(seq=12, vocab=128, **size), mesh="dp=2,tp=2", batch=8, seq=12)
    words = ["plan", "--mesh", "dp=2,tp=2", "--seq", "12", "--vocab", "128", "--global-batch", "8", "--digits", "2",
             "--summary"] + [w for k, v in size.items() for w in (f"--{k}", str(v))]
    assert graph.plan(summary=True) == cli(*words).splitlines()[0]
    assert "all_reduce" in graph.plan()
    why = graph.explain("transformer.h.0.mlp.c_fc.weight", graph.loss.name)
    assert "transformer.h.0.mlp.c_fc.weight (param f32 32x128): [R,S(1)]" in why and graph.loss.name in why


def test_train_takes_a_python_model(tmp_path):
    # shardwise.train(config, model=...) is Trainer(model=...) stepped to the end: the same losses,
    # every step's metrics (on_step in order), and the built-in model's losses for the Python GPT-2.
    seen = []
    config = sw.TrainConfig(mesh="dp=2", steps=3, save_every=3, run_dir=tmp_path / "call", **RUN)
    result = sw.train(config, model=GPT2(seq=RUN["seq"], vocab=RUN["vocab"], **SIZE), on_step=seen.append)
    assert result.steps == 3 and [m.step for m in result.metrics] == [1, 2, 3] and seen == result.metrics
    assert result.run_dir == str(tmp_path / "call") and result.checkpoint.endswith("checkpoint-3")
    stepped = curve(tmp_path, "stepped", model=GPT2(seq=RUN["seq"], vocab=RUN["vocab"], **SIZE), steps=3, mesh="dp=2")
    builtin = sw.train(mesh="dp=2", steps=3, run_dir=tmp_path / "builtin", **RUN, **SIZE)
    assert [(m.loss, m.grad_norm) for m in result.metrics] == stepped
    assert [m.loss for m in builtin.metrics] == [m.loss for m in result.metrics]


def test_only_a_decoder_is_cut_into_pipeline_stages(tmp_path):
    # A Module that merely has a `blocks` attribute is no Decoder: the Trainer leaves --layers alone
    # (it used to take len(model.blocks()), failing for a non-callable attribute).
    class NotADecoder(nn.Module):
        def __init__(self):
            self.blocks = nn.ModuleList([nn.Linear(4, 4)])
            self.emb = nn.Embedding(RUN["vocab"], RUN["vocab"])

        def forward(self, ids, labels):
            return nn.cross_entropy(self.emb(ids), labels)

    with sw.Trainer(model=NotADecoder(), steps=1, run_dir=tmp_path / "x", **RUN) as trainer:
        assert trainer.config["layers"] == sw.TrainConfig()["layers"]
        assert np.isfinite(trainer.step().loss)


def test_the_run_header_describes_the_python_model_and_its_data(tmp_path, capfd):
    # The options' layers, hidden and heads are not a Python model's (the defaults, 128 and 4, were
    # printed); a model fed batches of its own reads no tokens (the header named the addition task).
    with sw.Trainer(model=GPT2(seq=RUN["seq"], vocab=RUN["vocab"], **SIZE), steps=1, run_dir=tmp_path / "g", **RUN):
        pass
    header = capfd.readouterr().out.splitlines()
    assert header[0].startswith("shardwise train: python: GPT2 (") and "gpt2.py), seq 12, vocab 128: " in header[0]
    assert "hidden" not in header[0] and "head" not in header[0]
    vit_tiny = load_example("vit_tiny")
    model = vit_tiny.ViT(patches=4, patch_dim=12, hidden=16, heads=2, layers=1, classes=4)
    with sw.Trainer(model=model, data=vit_tiny.synthetic_batches(model, 8, 1), global_batch=8, steps=1,
                    progress="none", run_dir=tmp_path / "v"):
        pass
    header = capfd.readouterr().out.splitlines()
    assert header[0].startswith("shardwise train: python: ViT") and "seq" not in header[0] and "hidden" not in header[0]
    assert "  data: the batches given from Python (inputs patches, labels)" in header
    assert not any("addition" in line for line in header)
