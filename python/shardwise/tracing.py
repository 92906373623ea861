"""A model written with shardwise.nn traced into the graph the Trainer runs: the inputs "ids" and
"labels" [B, S] i64 (the batch split over the data dims dp and ep, as the built-in models' are),
``model(ids, labels)`` giving the scalar mean loss. The Trainer calls the builder once per mesh and
micro-batch size, on its ranks' behalf (Trainer(model=...)); ``trace`` does the same by hand."""
import inspect
import traceback

from . import _core
from .graph import Graph, tracing


def _batch_placements(graph):
    return ",".join("S(0)" if d in ("dp", "ep") else "R" for d in graph.mesh_dims)


def trace_into(graph, model, sequences, seq):
    """Builds `model`'s graph for a micro-batch of `sequences` x `seq` tokens into `graph`; the loss Tensor."""
    model.name_parameters()
    with tracing(graph):
        ids = graph.input("ids", (sequences, seq), "i64")
        labels = graph.input("labels", (sequences, seq), "i64")
        if graph.mesh_dims:
            for t in (ids, labels):
                graph.native.annotate(t.id, _batch_placements(graph))
        loss = model(ids, labels)
    if getattr(loss, "shape", None) != ():
        where = _source_of(model) or type(model).__name__
        got = f"shape {loss.shape}" if hasattr(loss, "shape") else type(loss).__name__
        raise _core.UsageError(f"{where}: {type(model).__name__}.forward(ids, labels) must return the scalar mean "
                               f"loss, got {got}")
    return loss


def trace(model, mesh=None, batch=2, seq=8, sequence_parallel=False):
    """The graph of `model` for one micro-batch of `batch` sequences of `seq` tokens on `mesh` (a
    shardwise.graph.Graph: its nodes, values' sites); errors name the user's file and line."""
    graph = Graph(mesh, sequence_parallel)
    graph.loss = trace_into(graph, model, batch, seq)
    return graph


def model_builder(model):
    """The callable the native Trainer calls to trace `model` (python/src/graph.h python_model)."""
    graphs = []  # kept for error sites: value name -> user's line

    def build(native, sequences, seq, training):
        graph = Graph(native=native)
        graphs.append(graph)
        model.training = training
        return trace_into(graph, model, sequences, seq).id

    build.graphs = graphs
    return build


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
