"""Sequence parallelism for models written in Python: Trainer(sp=True) (the built-in models' --sp)
splits the residual stream over tp on its sequence between the tensor-parallel regions, the nn
layers marking the regions' edges as the built-in models do, so the Python GPT-2 and Llama give the
built-in --sp runs' losses bit for bit and plan the same halved activations."""
import pytest

import shardwise as sw
from shardwise import nn
from shardwise.models import GPT2, Llama

RUN = {"global_batch": 8, "digits": 2, "seq": 12, "vocab": 128, "eval_every": 0, "progress": "none"}
SIZE = {"layers": 2, "hidden": 32, "heads": 2}
LLAMA = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2}


def curve(tmp_path, tag, model=None, steps=3, **options):
    with sw.Trainer(model=model, steps=steps, run_dir=tmp_path / tag, **RUN, **options) as trainer:
        return [(m.loss, m.grad_norm) for m in (trainer.step() for _ in range(steps))]


def activations(tmp_path, tag, model=None, **options):
    with sw.Trainer(model=model, steps=1, run_dir=tmp_path / tag, **RUN, **options) as trainer:
        return trainer.memory_plan()["ranks"][0]["activations"]


@pytest.mark.parametrize("mesh", ["tp=2", "dp=2,tp=2", "tp=2,pp=2"])
def test_python_gpt2_with_sp_equals_the_builtin_sp_run(tmp_path, mesh):
    builtin = curve(tmp_path, "builtin", mesh=mesh, sp=True, **SIZE)
    python = curve(tmp_path, "python", model=GPT2(seq=RUN["seq"], vocab=RUN["vocab"], **SIZE), mesh=mesh, sp=True)
    assert python == builtin  # losses and gradient norms, exactly


@pytest.mark.parametrize("moe", [False, True])
def test_python_llama_and_mixtral_with_sp_equal_the_builtin_sp_run(tmp_path, moe):
    # RMSNorm gathers, the row-parallel [out, in] Linear reduce-scatters; Mixtral's MoE reads the
    # gathered norm output as the built-in model's does.
    experts = {"intermediate_size": 48, "experts": 4, "top_k": 2, "aux_loss": 0.02} if moe else {}
    builtin = curve(tmp_path, "builtin", model="llama", mesh="dp=2,tp=2", sp=True, **LLAMA, **experts)
    model = Llama(vocab=RUN["vocab"], width=48 if moe else 0, moe={"experts": 4, "top_k": 2, "aux_loss": 0.02} if moe else None,
                  **LLAMA)
    python = curve(tmp_path, "python", model=model, mesh="dp=2,tp=2", sp=True)
    assert python == builtin


def test_sp_plans_the_builtin_models_halved_residual_activations(tmp_path):
    # The memory plan of the Python GPT-2 with sp is the built-in --sp run's. Against tp=2 without
    # sp, each tp rank keeps half of the residual stream the LayerNorms save for their backward: the
    # input [B, S, H] f32 of its 5 LayerNorms (ln_1 and ln_2 of 2 layers, ln_f) and their mean and
    # rstd [B, S]. Without the layers' marks (the old code) the stream stays whole.
    model = GPT2(seq=RUN["seq"], vocab=RUN["vocab"], **SIZE)
    with_sp = activations(tmp_path, "sp", model=model, mesh="tp=2", sp=True)
    assert with_sp == activations(tmp_path, "builtin", mesh="tp=2", sp=True, **SIZE)
    tokens = RUN["global_batch"] * RUN["seq"]
    halved = 5 * (tokens * SIZE["hidden"] * 4 + 2 * tokens * 4) // 2
    assert activations(tmp_path, "no-sp", model=model, mesh="tp=2") - with_sp == halved


def test_sp_leaves_the_curve_of_a_model_of_its_own_unchanged(tmp_path):
    # A model that is no Decoder marks its residual stream itself (shard(x, tp=Shard(1))); with the
    # norms and the row-parallel Linear's marks its curve is the tp=2 curve without sp.
    class Net(nn.Module):
        def __init__(self):
            self.emb = nn.Embedding(RUN["vocab"], 32, vocab_parallel=True)
            self.ln = nn.LayerNorm(32)
            self.mlp = nn.MLP(32)
            self.ln_f = nn.LayerNorm(32)

        def forward(self, ids, labels):
            x = nn.shard(self.emb(ids), tp=sw.Shard(1)) if nn.sequence_parallel() else self.emb(ids)
            x = x + self.mlp(self.ln(x))
            return nn.lm_head_loss(self.ln_f(x), self.emb.weight(), labels)

    plain = curve(tmp_path, "plain", model=Net(), mesh="tp=2")
    split = curve(tmp_path, "sp", model=Net(), mesh="tp=2", sp=True)
    assert [l for l, _ in split] == pytest.approx([l for l, _ in plain], abs=1e-6)


@pytest.mark.parametrize("attention", ["ring", "gather"])
def test_python_gpt2_on_cp_equals_the_builtin_cp_run(tmp_path, attention):
    # cp=2 stores each sequence in cp's balanced order: GPT-2's position embedding is looked up by
    # nn.positions() and nn.attention is ring_attention (or, with --cp-attention gather, the fused
    # kernel on the gathered keys) with balanced_ranks, as the built-in model's.
    for mesh in ("cp=2", "dp=2,cp=2"):
        builtin = curve(tmp_path, "builtin", mesh=mesh, cp_attention=attention, **SIZE)
        model = GPT2(seq=RUN["seq"], vocab=RUN["vocab"], **SIZE)
        assert curve(tmp_path, "python", model=model, mesh=mesh, cp_attention=attention) == builtin, mesh


def test_python_llama_on_cp_equals_the_builtin_cp_run(tmp_path):
    # Rotary positions follow cp's order (nn.rotary's positions).
    builtin = curve(tmp_path, "builtin", model="llama", mesh="cp=2", **LLAMA)
    python = curve(tmp_path, "python", model=Llama(vocab=RUN["vocab"], **LLAMA), mesh="cp=2")
    assert python == builtin


def test_python_gpt2_on_cp_gives_its_single_rank_curve(tmp_path):
    single = curve(tmp_path, "single", model=GPT2(seq=RUN["seq"], vocab=RUN["vocab"], **SIZE), mesh="dp=1")
    on_cp = curve(tmp_path, "cp", model=GPT2(seq=RUN["seq"], vocab=RUN["vocab"], **SIZE), mesh="cp=2")
    assert [l for l, _ in on_cp] == pytest.approx([l for l, _ in single], abs=1e-5)
