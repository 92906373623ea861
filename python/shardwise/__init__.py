"""shardwise: layouts, SPMD rules, reshard plans, unified checkpoints and training over a C++ core.

Layouts in the vocabulary of PyTorch DTensor and PaddlePaddle::

    import shardwise as sw
    mesh = sw.Mesh({"dp": 2, "tp": 2})
    sw.local_shape((8, 6), mesh, [sw.Shard(0), sw.Shard(1)], rank=3)   # (4, 3)
    sw.infer("matmul", mesh, [(8, 16), (16, 4)], [[sw.Shard(0), sw.Replicate()]] * 2).outputs

Training and generation, as `shardwise train` and `shardwise generate` run them::

    result = sw.train(mesh="dp=2,tp=2", steps=20, on_step=print)   # or sw.Trainer(...).step()
    sw.generate(result.checkpoint, "123+456=", max_new_tokens=4)

Models written in Python with single-device semantics (shardwise.nn), trained on any mesh::

    trainer = sw.Trainer(model=MyModel(...), mesh="dp=2,tp=2", seq=64, vocab=256, steps=20)

Errors are shardwise.Error (UsageError, CheckpointError, DataError) with the C++ message.
"""
from ._core import (  # noqa: F401
    CheckpointError,
    DataError,
    Error,
    Mesh,
    OpInfo,
    Partial,
    Placement,
    Placements,
    Replicate,
    ReshardPlan,
    ReshardStep,
    RuleAnswer,
    Shard,
    UsageError,
    infer,
    local_block,
    local_shape,
    plan_reshard,
    built_with_cuda,
    run_op,
    to_device,
    to_host,
)
from .graph import Tensor, ops, shard  # noqa: F401  (ops: every registered op, ops() lists them)
from .tracing import trace  # noqa: F401
from .training import Metrics, TrainConfig, Trainer, TrainResult, generate, train  # noqa: F401

from . import checkpoint  # noqa: E402,F401  (shardwise.checkpoint: save / load / info)
from . import nn  # noqa: E402,F401  (shardwise.nn: modules for models written in Python)

__version__ = "0.1.0"
