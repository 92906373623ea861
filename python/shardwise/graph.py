"""Graphs built from Python with single-device semantics: symbolic tensors (shape and dtype, checked as
each op is applied), every op of the C++ registry by name (``shardwise.ops.matmul(a, b)``), and
annotations by mesh dim name (``shard(w, tp=sw.Shard(1))``).

An error while building (a shape or dtype the op refuses, an unknown mesh dim) is a
``shardwise.Error`` whose message starts with the user's ``file:line``: the first caller outside
this package.
"""
import difflib
import os
import re
import sys

from . import _core

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# The mesh dims shardwise knows (mesh/strategy.h): a placement for one of them that the mesh lacks is
# ignored, so that one model runs on any mesh; any other name is an error.
MESH_DIMS = ("dp", "tp", "pp", "ep", "cp")


def user_site():
    """'file:line' of the innermost caller outside the shardwise package."""
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR:
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _at_site(error, site):
    """The same kind of error with the user's file and line in front of its message."""
    return type(error)(f"{site}: {error}")


class Tensor:
    """A value of a graph being built: its name, global shape and dtype (no data)."""

    __slots__ = ("graph", "id", "name", "shape", "dtype", "requires_grad")

    def __init__(self, graph, value_id):
        self.graph, self.id = graph, value_id
        self.name, self.shape, self.dtype, self.requires_grad = graph.meta(value_id)

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        return f"Tensor({self.name!r}, shape={self.shape}, dtype={self.dtype})"

    def __add__(self, other):
        return apply("add", [self, other])

    def __sub__(self, other):
        return apply("subtract", [self, other])

    def __mul__(self, other):
        if isinstance(other, (int, float)):
            return apply("scale", [self], {"scale": float(other), "bias": 0.0})
        return apply("multiply", [self, other])

    def __truediv__(self, other):
        if isinstance(other, (int, float)):
            return apply("scale", [self], {"scale": 1.0 / float(other), "bias": 0.0})
        return apply("divide", [self, other])

    def __matmul__(self, other):
        return apply("matmul", [self, other])

    def __neg__(self):
        return apply("neg", [self])

    def reshape(self, *shape):
        shape = list(shape[0]) if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else list(shape)
        return apply("reshape", [self], {"shape": shape})

    def transpose(self, *perm):
        perm = list(perm[0]) if len(perm) == 1 and isinstance(perm[0], (list, tuple)) else list(perm)
        return apply("transpose", [self], {"perm": perm})


class Graph:
    """A graph being built on a mesh (None: one device), as the Trainer traces a model."""

    def __init__(self, mesh=None, sequence_parallel=False, native=None):
        self.native = native if native is not None else _core._Graph(mesh, sequence_parallel)
        self.sites = {}  # value name -> 'file:line' where the user made it
        self.params = {}  # id(nn.Parameter) -> its Tensor in this graph
        self.annotated = {}  # value name -> 'file:line' of the user's shard() of it
        self.constants = {}  # name -> Tensor: inputs bound once (constant())
        self.training = True  # False: the loss-only graph (no dropout)
        self.predicting = False  # the predictions graph (Trainer.evaluate(batch)): nn.output marks its outputs
        self.rows = None  # the micro-batch's rows (an output's dim 0)
        self.outputs = {}  # name -> Tensor: the outputs nn.output marked
        self.moe = []  # (layer, moe_mlp's first output's name, experts) of each nn.MoE applied
        self.extra_loss = None  # the terms nn.add_loss() collected (router losses)

    @property
    def mesh_dims(self):
        return list(self.native.mesh_dims)

    @property
    def nodes(self):
        return list(self.native.nodes)

    def has_dim(self, name):
        return name in self.native.mesh_dims

    def _made(self, value_id, site):
        t = Tensor(self.native, value_id)
        self.sites[t.name] = site
        return t

    def _loss_id(self):
        loss = getattr(self, "loss", None)
        if loss is None:
            raise _core.UsageError(f"{user_site()}: the graph has no loss yet (shardwise.trace sets it)")
        return loss.id

    def explain(self, *names):
        """Why each named value (a parameter's name, or a Tensor's .name) got its placement, the
        backward included: `shardwise plan --explain`'s lines."""
        return "\n".join(_core._explain(self.native, self._loss_id(), list(names)))

    def plan(self, summary=False):
        """The program each rank runs (`shardwise plan`), or with `summary` its reshard cost and
        collectives (`plan --summary`'s first line)."""
        return _core._plan(self.native, self._loss_id(), summary)

    def input(self, name, shape, dtype="f32"):
        site = user_site()
        try:
            return self._made(self.native.input(name, list(shape), dtype), site)
        except _core.Error as e:
            raise _at_site(e, site) from None

    def constant(self, name, value):
        """An input bound once, on every rank, to a copy of `value` (an array), replicated; the
        same Tensor again for a name already declared."""
        if name in self.constants:
            return self.constants[name]
        site = user_site()
        try:
            t = self._made(self.native.constant(name, value), site)
            if self.mesh_dims:
                self.native.annotate(t.id, ",".join("R" for _ in self.mesh_dims))
        except _core.Error as e:
            raise _at_site(e, site) from None
        self.constants[name] = t
        return t

    def param(self, name, shape, dtype="f32", std=0.0, value=0.0):
        site = user_site()
        try:
            return self._made(self.native.param(name, list(shape), dtype, std, value), site)
        except _core.Error as e:
            raise _at_site(e, site) from None


_stack = []  # the graphs being traced, innermost last


def current_graph():
    """The graph being traced (Error outside a trace)."""
    if not _stack:
        raise _core.UsageError(f"{user_site()}: no graph is being built: call the model through a Trainer or "
                               "shardwise.trace")
    return _stack[-1]


class tracing:
    """Makes `graph` the current graph for the `with` block."""

    def __init__(self, graph):
        self.graph = graph

    def __enter__(self):
        _stack.append(self.graph)
        return self.graph

    def __exit__(self, *exc):
        _stack.pop()


def apply(op, inputs, attrs=None, name=""):
    """Applies the registered op `op` to `inputs` (Tensors): its output Tensor, or a tuple of them."""
    site = user_site()
    graph = current_graph()
    for i, t in enumerate(inputs):
        if not isinstance(t, Tensor):
            raise _core.UsageError(f"{site}: {op}: input {i} is {type(t).__name__}, not a shardwise Tensor "
                                   "(constants enter as attributes or inputs)")
    try:
        ids = graph.native.op(op, [t.id for t in inputs], attrs or {}, name)
    except _core.Error as e:
        raise _at_site(e, site) from None
    outs = tuple(graph._made(i, site) for i in ids)
    return outs[0] if len(outs) == 1 else outs


def _op_names():
    return [o.name for o in _core.ops()]


class _Ops:
    """Every op of the C++ registry: ``ops.matmul(a, b, trans_y=True)`` applies it (inputs positional,
    attributes as keywords, ``name=`` the output's name); ``ops()`` lists them (OpInfo)."""

    def __call__(self):
        return _core.ops()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        names = _op_names()
        if name not in names:
            near = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean '{near[0]}'?" if near else ""
            raise AttributeError(f"no op named '{name}'{hint}")

        def op(*inputs, **attrs):
            out_name = attrs.pop("name", "")
            flat = []
            for x in inputs:
                flat.extend(x if isinstance(x, (list, tuple)) else [x])
            return apply(name, flat, attrs, out_name)

        op.__name__ = name
        op.__doc__ = f"The registered op '{name}' applied to symbolic tensors."
        return op

    def __dir__(self):
        return _op_names()


ops = _Ops()


def _placement_text(p):
    return p if isinstance(p, str) else str(p)


def placements_for(graph, placements, site):
    """Text placements over `graph`'s mesh from {mesh dim name: placement}; None when no named dim is on
    the mesh (the annotation is left to completion, as the built-in models leave it)."""
    for dim in placements:
        if dim not in MESH_DIMS:
            raise _core.UsageError(f"{site}: unknown mesh dim '{dim}' (mesh dims are named "
                                   f"{', '.join(MESH_DIMS)})")
    dims = graph.mesh_dims
    if not any(d in dims for d in placements):
        return None
    return ",".join(_placement_text(placements.get(d, "R")) for d in dims)


def activation_placements(graph, on_tp):
    """An activation's placements over `graph`'s mesh, as the built-in models annotate them
    (Strategy::placements): `on_tp` on tp, the batch Shard(0) over the data dims dp and ep, the
    sequence Shard(1) over cp."""
    dims = {"tp": on_tp, "dp": "S(0)", "ep": "S(0)", "cp": "S(1)"}
    return ",".join(dims.get(d, "R") for d in graph.mesh_dims)


def sequence_parallel():
    """Whether the graph being traced runs sequence-parallel (``Trainer(sp=True)``, ``--sp``)."""
    return bool(current_graph().native.sequence_parallel)


def place_activation(x, on_tp):
    """Annotates the activation x [B, S, ...]: `on_tp` on tp, the batch over the data dims; x."""
    graph = current_graph()
    if graph.mesh_dims:
        graph.native.annotate(x.id, activation_placements(graph, on_tp))
    return x


def shard(value, placements=None, **by_dim):
    """Annotates `value` (a Tensor, or a Parameter: at each creation) with placements by mesh dim
    name: ``shard(w, tp=sw.Shard(1))`` or ``shard(w, {"tp": "S(1)", "dp": "R"})``; dims the mesh lacks
    are ignored. Returns `value`."""
    site = user_site()
    spec = dict(placements or {}, **by_dim)
    if not isinstance(value, Tensor):  # a Parameter declaration: annotated when created
        for dim in spec:
            if dim not in MESH_DIMS:
                raise _core.UsageError(f"{site}: unknown mesh dim '{dim}' (mesh dims are named "
                                       f"{', '.join(MESH_DIMS)})")
        value.placements, value.placement_site = spec, site
        return value
    graph = current_graph()
    text = placements_for(graph, spec, site)
    if text is not None:
        try:
            value.graph.annotate(value.id, text)
        except _core.Error as e:
            raise _at_site(e, site) from None
        graph.annotated[value.name] = site
    return value


def with_user_site(error, graphs):
    """`error` (a shardwise.Error from compiling or running traced graphs) with the user's file and
    line of the first value it names in quotes: where the user annotated it, else where it was made.
    The same error when it names none (or already starts with a site)."""
    message = str(error)
    for name in re.findall(r"'([^']+)'", message):
        for graph in graphs:
            site = graph.annotated.get(name) or graph.sites.get(name)
            if site and not message.startswith(site):
                return _at_site(error, site)
    return error
