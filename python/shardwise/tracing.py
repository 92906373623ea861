"""A model written with shardwise.nn traced into the graph the Trainer runs: the inputs "ids" and
"labels" [B, S] i64 (the batch split over the data dims dp and ep, as the built-in models' are),
``model(ids, labels)`` giving the scalar mean loss. The Trainer calls the builder once per mesh and
micro-batch size, on its ranks' behalf (Trainer(model=...)); ``trace`` does the same by hand.

A model fed batches of its own (Trainer(model=..., data=...)) takes instead the inputs its batches
name, by name (``model(patches=..., labels=...)``), each [B, ...] with the batch's per-sample shape
and dtype, split over the data dims as ids are."""
import inspect
import traceback

import numpy as np

from . import _core
from .graph import Graph, activation_placements, tracing


def _boundary(graph, t):
    """An input's layout: the batch over the data dims, whole elsewhere."""
    if graph.mesh_dims:
        graph.native.annotate(t.id, activation_placements(graph, "R"))
    return t


def _stage_boundary(graph, t):
    """The activation between pipeline stages: as an input's, split on the sequence over tp under sp."""
    if graph.mesh_dims:
        graph.native.annotate(t.id, activation_placements(graph, "S(1)" if graph.native.sequence_parallel else "R"))
    return t


_DTYPES = {np.dtype(n): s for n, s in (("float32", "f32"), ("float64", "f64"), ("float16", "f16"), ("int64", "i64"),
                                        ("int32", "i32"), ("int8", "i8"), ("uint8", "u8"), ("bool", "bool"))}


def input_specs(batch):
    """{name: (per-sample shape, dtype)} of a batch (a dict of arrays [B, ...])."""
    if not isinstance(batch, dict) or not batch:
        raise _core.UsageError(f"a batch is a dict of arrays by input name, got {type(batch).__name__}")
    specs = {}
    for name, value in batch.items():
        array = np.asarray(value)
        if array.ndim < 1 or array.dtype not in _DTYPES:
            raise _core.UsageError(f"the batch's '{name}' must be an array [batch, ...] of a dtype shardwise computes "
                                   f"on, got shape {array.shape} dtype {array.dtype}")
        specs[name] = (tuple(array.shape[1:]), _DTYPES[array.dtype])
    return specs


def check_batch(batch, specs, rows):
    """The batch's arrays by name (read in place), each checked against its spec: [rows, *shape] of the dtype."""
    if not isinstance(batch, dict) or set(batch) != set(specs):
        got = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise _core.UsageError(f"the batch must have the inputs {sorted(specs)}, got {got}")
    out = {}
    for name, (shape, dtype) in specs.items():
        array = np.asarray(batch[name])
        if array.shape != (rows,) + shape or _DTYPES.get(array.dtype) != dtype:
            raise _core.UsageError(f"the batch's '{name}' must be {dtype} of shape {(rows,) + shape} (the global "
                                   f"batch's rows), got {array.dtype} of shape {array.shape}")
        out[name] = array
    return out


def _model_inputs(model, seq, inputs):
    if inputs is None:
        return {"ids": ("ids", (seq,), "i64"), "labels": ("labels", (seq,), "i64")}, "ids, labels"
    try:
        inspect.signature(model.forward).bind(**inputs)
    except TypeError as e:
        where = _source_of(model) or type(model).__name__
        raise _core.UsageError(f"{where}: {type(model).__name__}.forward cannot take the batch's inputs "
                               f"{sorted(inputs)}: {e}") from None
    return {name: (name, shape, dtype) for name, (shape, dtype) in inputs.items()}, ", ".join(inputs)


def trace_into(graph, model, sequences, seq, inputs=None):
    """Builds `model`'s graph for a micro-batch of `sequences` x `seq` tokens (or of `sequences` rows
    of the batch's `inputs`, {name: (per-sample shape, dtype)}) into `graph`; the loss Tensor."""
    model.name_parameters()
    feeds, names = _model_inputs(model, seq, inputs)
    with tracing(graph):
        args = {key: _boundary(graph, graph.input(name, (sequences,) + tuple(shape), dtype))
                for key, (name, shape, dtype) in feeds.items()}
        loss = model(**args)
    if getattr(loss, "shape", None) != ():
        where = _source_of(model) or type(model).__name__
        got = f"shape {loss.shape}" if hasattr(loss, "shape") else type(loss).__name__
        raise _core.UsageError(f"{where}: {type(model).__name__}.forward({names}) must return the scalar mean "
                               f"loss, got {got}")
    return loss


def trace(model, mesh=None, batch=2, seq=8, sequence_parallel=False, inputs=None):
    """The graph of `model` for one micro-batch of `batch` sequences of `seq` tokens on `mesh` (a
    shardwise.graph.Graph: its nodes, values' sites); errors name the user's file and line.
    `inputs`: an example batch (a dict of arrays) for a model fed batches of its own."""
    graph = Graph(mesh, sequence_parallel)
    graph.loss = trace_into(graph, model, batch, seq, None if inputs is None else input_specs(inputs))
    return graph


def _decoder(model):
    from .nn import Decoder

    if not isinstance(model, Decoder):
        where = _source_of(model) or type(model).__name__
        raise _core.UsageError(f"{where}: a pp mesh cuts the model into stages by its blocks: write "
                               f"{type(model).__name__} as a shardwise.nn.Decoder (embed, blocks, head)")
    return model


def _param_names(graph):
    return {t.name for t in graph.params.values()}


def _stage_feeds(model, sequences, seq, inputs):
    """The inputs of the first stage (the embedding's) and of the last (the head's besides x), each
    [(name, shape, dtype)]: "ids" and "labels" [B, S], or a fed model's inputs by the names embed()
    and head() take (every input one of them)."""
    if inputs is None:
        return [("ids", (sequences, seq), "i64")], [("labels", (sequences, seq), "i64")]
    first = [n for n in inspect.signature(model.embed).parameters if n in inputs]
    last = [n for n in list(inspect.signature(model.head).parameters)[1:] if n in inputs]
    unused = sorted(set(inputs) - set(first) - set(last))
    if unused:
        raise _core.UsageError(f"{describe(model)}: on a pp mesh the batch's inputs go to embed() (the first "
                               f"stage) or head() (the last) by name, and neither takes {unused}")
    feeds = {n: (n, (sequences,) + tuple(shape), dtype) for n, (shape, dtype) in inputs.items()}
    return [feeds[n] for n in first], [feeds[n] for n in last]


def _call_with(fn, graph, feeds, fed, *leading):
    """fn(*leading, the feeds as inputs of `graph`): by name for a fed model, else in order."""
    values = [_boundary(graph, graph.input(name, shape, dtype)) for name, shape, dtype in feeds]
    if fed:
        return fn(*leading, **{name: v for (name, _, _), v in zip(feeds, values)})
    return fn(*leading, *values)


def _stage_shape_and_tie(model, feeds, fed):
    """The activation's shape between the stages, and the parameter the embedding and the head both
    use ("" for none), from the embedding and the head traced apart."""
    embed = Graph()
    with tracing(embed):
        x = _call_with(model.embed, embed, feeds[0], fed)
    head = Graph()
    with tracing(head):
        _call_with(model.head, head, feeds[1], fed, head.input("x", x.shape, x.dtype))
    tied = sorted(_param_names(embed) & _param_names(head))
    if len(tied) > 1:
        raise _core.UsageError(f"{describe(model)}: the embedding and the head share {len(tied)} parameters "
                               f"({', '.join(tied)}); a pipeline sums the gradients of one")
    return x.shape, x.dtype, tied[0] if tied else ""


def trace_stage(graph, model, sequences, seq, training, part, inputs=None):
    """Blocks [first, end) of a Decoder as a pipeline stage's graph (with the embedding on the first,
    the head on the last; a fed model's inputs on the stage whose embed() or head() takes them):
    (loss, input, output, output_grad, extra_loss, tied) as the native Trainer takes them."""
    from .nn import split_sequence

    first, end, embeddings, head = part
    model = _decoder(model)
    model.name_parameters()
    feeds, fed = _stage_feeds(model, sequences, seq, inputs), inputs is not None
    shape, dtype, tied = _stage_shape_and_tie(model, feeds, fed)
    loss = x_in = x_out = x_grad = None
    with tracing(graph):
        if embeddings:
            x = split_sequence(_call_with(model.embed, graph, feeds[0], fed))
        else:
            x = x_in = _stage_boundary(graph, graph.input("stage_input", shape, dtype))
            graph.native.set_requires_grad(x.id, training)
        blocks = list(model.blocks())
        for index in range(first, end):
            x = model.run_block(index, blocks[index], x)
        extra = None
        if head:
            loss = _call_with(model.head, graph, feeds[1], fed, x)
        else:  # the stage's own loss terms (nn.add_loss: MoE router losses) go in its extra loss
            x_out = _stage_boundary(graph, x)
            x_grad = _stage_boundary(graph, graph.input(x.name + "@grad_in", shape, dtype))
            extra = graph.extra_loss if training else None
    return tuple(-1 if t is None else t.id for t in (loss, x_in, x_out, x_grad, extra)) + (tied,)


def model_builder(model, inputs=None):
    """The callable the native Trainer calls to trace `model` (python/src/graph.h python_model);
    `inputs` ({name: (per-sample shape, dtype)}) for a model fed batches of its own."""
    graphs = []  # kept for error sites: value name -> user's line

    def build(native, sequences, seq, training, part, predicting=False):
        graph = Graph(native=native)
        graph.training, graph.predicting, graph.rows = training and not predicting, predicting, sequences
        graphs.append(graph)
        model.training = graph.training
        if part[2] and part[3]:  # the whole model: one stage
            ids = (trace_into(graph, model, sequences, seq, inputs).id, -1, -1, -1, -1, "")
        else:
            ids = trace_stage(graph, model, sequences, seq, graph.training, part, inputs)
        if predicting:  # no loss read: the outputs
            ids = (-1,) + ids[1:4] + (-1,) + ids[5:]
        return ids + (list(graph.outputs), graph.moe)

    build.graphs = graphs
    return build


def eval_batch(batch, specs, seq):
    """Trainer.evaluate's batch checked: the model's inputs by name (a token model's "ids" and
    "labels" [rows, seq] i64), any number of rows (the same for each), as contiguous arrays; an input
    the batch lacks (labels) is zeros."""
    if specs is None:
        specs = {"ids": ((seq,), "i64"), "labels": ((seq,), "i64")}
    if not isinstance(batch, dict) or not batch or not set(batch) <= set(specs):
        got = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise _core.UsageError(f"evaluate(batch): a batch is a dict of arrays by input name, of the inputs "
                               f"{sorted(specs)}; got {got}")
    rows = len(np.asarray(next(iter(batch.values()))))
    out = {}
    for name, (shape, dtype) in specs.items():
        zeros = np.zeros((rows,) + shape, dtype=next(k for k, v in _DTYPES.items() if v == dtype))
        array = np.ascontiguousarray(batch[name]) if name in batch else zeros
        if array.ndim < 1 or array.shape != (rows,) + shape or _DTYPES.get(array.dtype) != dtype or rows < 1:
            raise _core.UsageError(f"evaluate(batch): the batch's '{name}' must be {dtype} of shape ({rows}, "
                                   f"{', '.join(map(str, shape))}) (rows, ...), got {array.dtype} of shape {array.shape}")
        out[name] = array
    return out


def _source_of(model):
    try:
        return inspect.getsourcefile(type(model))
    except TypeError:  # defined in exec'd code or the interpreter
        return None


def describe(model):
    where = _source_of(model)
    return f"python: {type(model).__name__}" + (f" ({where})" if where else "")


def error_text(error):
    """The message of an error raised while tracing: a shardwise.Error's own (it names the user's
    line), another's with its type and the innermost line that raised it."""
    if isinstance(error, _core.Error):
        return str(error)
    frames = traceback.extract_tb(error.__traceback__)
    site = f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""
    return f"{site}{type(error).__name__}: {error}"
