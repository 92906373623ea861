"""Modules for models written in Python with single-device semantics (shardwise.graph builds their
graph): parameters named by their attribute paths (the checkpoint keys), and the layers the built-in
C++ models are made of, composed as those builders compose them (src/shardwise/models/gpt.cc), so a
model written with them computes the built-in model's numbers.

Parameters are stored as the C++ builders store them: a Linear's weight is [in, out]. Tensor
parallelism is a placement by mesh dim name on the parameters (``parallel="column"``: the weight
``Shard(1)`` on tp, its bias ``Shard(0)``; ``"row"``: the weight ``Shard(0)``); dims the mesh lacks are
ignored, so one model runs on any mesh.

Sequence parallelism (``Trainer(sp=True)``, the built-in models' ``--sp``) is Megatron's: between
the tensor-parallel regions the residual stream [B, S, H] is split over tp on its sequence. The
layers mark the regions' edges as Megatron's layers do: a norm's output is gathered whole (the tp
region starts: "g"), a row-parallel Linear's product is reduce-scattered onto the sequence (it ends:
"g-bar"), and a Decoder's embedding output starts the split stream. A model of other layers marks its
residual stream itself: ``shard(x, tp=Shard(1))``.
"""
import contextlib
import math

import numpy as np

from . import _core
from .graph import apply, current_graph, ops, place_activation, placements_for, sequence_parallel, shard, user_site

__all__ = ["Parameter", "Module", "Decoder", "ModuleList", "Linear", "Embedding", "LayerNorm", "RMSNorm", "MLP", "SwiGLU",
           "attention", "split_heads", "merge_heads", "lm_head_loss", "cross_entropy", "shard", "ops", "rotary", "constant",
           "recompute", "dropout", "MoE", "add_loss", "with_extra_loss", "output", "positions", "split_sequence",
           "sequence_parallel", "context_parallel"]


class Parameter:
    """A trained parameter of `shape`: initialised to normal(0, std) keyed by its name (std > 0, the
    built-in models' draw: any mesh holds the single-device numbers) or to the constant `value`."""

    def __init__(self, shape, std=0.0, value=0.0, dtype="f32", placements=None):
        self.shape, self.std, self.value, self.dtype = tuple(shape), float(std), float(value), dtype
        self.name = None  # set from the module tree when a trace starts
        self.placements, self.placement_site = dict(placements or {}), user_site()

    def __call__(self):
        """The parameter's value in the graph being traced (created at its first use)."""
        graph = current_graph()
        made = graph.params.get(id(self))
        if made is not None:
            return made
        if self.name is None:
            raise _core.UsageError(f"{self.placement_site}: a parameter of shape {self.shape} belongs to no module "
                                   "of the model (assign it to a Module attribute)")
        # bf16 runs store f32 parameters in bf16 (f32 masters in the optimizer) and cast them to f32
        # for the kernels, as the built-in models do.
        stored = "bf16" if self.dtype == "f32" and graph.native.param_dtype == "bf16" else self.dtype
        t = graph.param(self.name, self.shape, stored, self.std, self.value)
        graph.sites[self.name] = self.placement_site
        if any(_is_partial(p) for p in self.placements.values()):
            raise _core.UsageError(f"{self.placement_site}: the parameter '{self.name}' is placed Partial: a "
                                   "parameter is stored whole or sharded (Replicate or Shard), never as a sum of parts")
        text = placements_for(graph, self.placements, self.placement_site)
        if text is not None:
            try:
                t.graph.annotate(t.id, text)
            except _core.Error as e:
                raise type(e)(f"{self.placement_site}: {e}") from None
        if stored != self.dtype:
            t = apply("cast", [t], {"dtype": self.dtype}, self.name + "." + self.dtype)
        graph.params[id(self)] = t
        return t


def _is_partial(placement):
    return str(placement).startswith("P")


class Module:
    """A model or a part of one: Parameters and Modules assigned as attributes (or in a ModuleList)
    are its own, named by their attribute paths ("transformer.h.0.ln_1.weight")."""

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def named_parameters(self, prefix=""):
        """(name, Parameter) pairs, in attribute order."""
        for attr, value in vars(self).items():
            path = f"{prefix}{attr}"
            if isinstance(value, Parameter):
                yield path, value
            elif isinstance(value, Module):
                yield from value.named_parameters(path + ".")

    def name_parameters(self):
        """Gives every parameter its name (done by the trace); Error if one is reachable twice."""
        seen = {}
        for name, p in self.named_parameters():
            if id(p) in seen and seen[id(p)] != name:
                raise _core.UsageError(f"{p.placement_site}: the parameter '{seen[id(p)]}' is also '{name}': share "
                                       "a module's parameter by using the module, not by assigning it twice")
            seen[id(p)] = name
            p.name = name


class Decoder(Module):
    """A model the pipeline can cut into stages: embed(ids) -> x, blocks() (a ModuleList, split
    evenly over the stages of a pp mesh), head(x, labels) -> the mean loss; forward runs them in
    turn. run_block(index, block, x) runs one block (override it to wrap blocks, e.g. in recompute())."""

    def embed(self, ids):
        raise NotImplementedError(f"{type(self).__name__} has no embed()")

    def blocks(self):
        raise NotImplementedError(f"{type(self).__name__} has no blocks()")

    def head(self, x, labels):
        raise NotImplementedError(f"{type(self).__name__} has no head()")

    def run_block(self, index, block, x):
        return block(x)

    def forward(self, ids, labels):
        x = split_sequence(self.embed(ids))
        for index, block in enumerate(self.blocks()):
            x = self.run_block(index, block, x)
        return self.head(x, labels)


class ModuleList(Module):
    """Modules named by their index ("h.0", "h.1", ...)."""

    def __init__(self, modules):
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(vars(self).values())

    def __len__(self):
        return len(vars(self))

    def __getitem__(self, i):
        return vars(self)[str(i)]


class Linear(Module):
    """y = x W + b with W [n_in, n_out] (``out_in=True``: W [n_out, n_in], PyTorch's and Hugging
    Face's layout, y = x W^T); parallel "column" (W split on its output dim over tp, b Shard(0)) or
    "row" (W split on its input dim: the product is Partial over tp, b added after its reduction)."""

    def __init__(self, n_in, n_out, bias=True, std=0.02, parallel=None, out_in=False):
        if parallel not in (None, "column", "row"):
            raise _core.UsageError(f"{user_site()}: Linear parallel='{parallel}' is not None, 'column' or 'row'")
        self.out_in, self.parallel = out_in, parallel
        self.weight = Parameter((n_out, n_in) if out_in else (n_in, n_out), std=std)
        if parallel:
            output_dim = 0 if out_in else 1
            shard(self.weight, tp=_core.Shard(output_dim if parallel == "column" else 1 - output_dim))
        if bias:
            self.bias = Parameter((n_out,))
            if parallel == "column":
                shard(self.bias, tp=_core.Shard(0))

    def forward(self, x):
        w = self.weight()
        b = self.bias() if hasattr(self, "bias") else None
        y = apply("matmul", [x, w], {"trans_y": True} if self.out_in else None)
        if self.parallel == "row" and y.ndim >= 3:
            y = split_sequence(y)  # reduce-scattered onto the sequence under sp (else all-reduced)
        return y if b is None else y + b


class Embedding(Module):
    """weight [num, dim] looked up by ids; ``vocab_parallel`` shards the rows over tp."""

    def __init__(self, num, dim, std=0.02, vocab_parallel=False):
        self.weight = Parameter((num, dim), std=std)
        if vocab_parallel:
            shard(self.weight, tp=_core.Shard(0))

    def forward(self, ids):
        return apply("embedding", [ids, self.weight()])


class LayerNorm(Module):
    """LayerNorm over the last dim: weight ones, bias zeros."""

    def __init__(self, dim, eps=1e-5):
        self.weight = Parameter((dim,), value=1.0)
        self.bias = Parameter((dim,))
        self.eps = eps

    def forward(self, x):
        attrs = {"begin_norm_axis": -1, "epsilon": float(self.eps)}
        return _gathered(apply("layer_norm", [x, self.weight(), self.bias()], attrs)[0])


class RMSNorm(Module):
    """RMSNorm over the last dim: weight ones."""

    def __init__(self, dim, eps=1e-6):
        self.weight = Parameter((dim,), value=1.0)
        self.eps = eps

    def forward(self, x):
        return _gathered(apply("rms_norm", [x, self.weight()], {"begin_norm_axis": -1, "epsilon": float(self.eps)})[0])


class MLP(Module):
    """Linear (column) -> GELU -> Linear (row), named c_fc and c_proj as GPT-2's."""

    def __init__(self, dim, width=None, std=0.02, proj_std=None):
        width = width or 4 * dim
        self.c_fc = Linear(dim, width, std=std, parallel="column")
        self.c_proj = Linear(width, dim, std=std if proj_std is None else proj_std, parallel="row")

    def forward(self, x):
        return self.c_proj(apply("gelu", [self.c_fc(x)]))


class SwiGLU(Module):
    """down(silu(gate x) * up x) (the fused swiglu op), named as Llama's gate_proj, up_proj, down_proj."""

    def __init__(self, dim, width, std=0.02, bias=False):
        self.gate_proj = Linear(dim, width, bias=bias, std=std, parallel="column")
        self.up_proj = Linear(dim, width, bias=bias, std=std, parallel="column")
        self.down_proj = Linear(width, dim, bias=bias, std=std, parallel="row")

    def forward(self, x):
        return self.down_proj(apply("swiglu", [self.gate_proj(x), self.up_proj(x)]))


class MoE(Module):
    """Mixtral's sparse MLP on x [B, S, H] (the moe_mlp op: each token to its top_k experts, each a
    SwiGLU MLP of `width`): the router gate [E, H] whole, the experts' stacked w1, w3 [E, width, H]
    and w2 [E, H, width] split over ep on E. Its weighted load-balancing (aux_loss) and z (z_loss)
    losses join the model's loss through add_loss(). Its router statistics (each expert's tokens,
    the aux and z losses) go into the run's metrics ("moe") as the built-in MoE's, under the layer
    its name holds ("model.layers.3.block_sparse_moe": 3; else its order in the traced graph)."""

    def __init__(self, hidden, width, experts, top_k=2, aux_loss=0.0, z_loss=0.0, std=0.02):
        self.top_k, self.aux_loss, self.z_loss = top_k, aux_loss, z_loss
        self.gate = Module()
        self.gate.weight = shard(Parameter((experts, hidden), std=std), tp=_core.Replicate())
        self.experts = Module()
        whole_but_ep = {"ep": _core.Shard(0), "dp": _core.Replicate(), "tp": _core.Replicate()}
        self.experts.w1 = shard(Parameter((experts, width, hidden), std=std), whole_but_ep)
        self.experts.w3 = shard(Parameter((experts, width, hidden), std=std), whole_but_ep)
        self.experts.w2 = shard(Parameter((experts, hidden, width), std=std), whole_but_ep)

    def forward(self, x):
        b, s, h = x.shape
        tokens = x.reshape(b * s, h)
        e = self.experts
        path = self.gate.weight.name[: -len(".gate.weight")]
        out = apply("moe_mlp", [tokens, self.gate.weight(), e.w1(), e.w3(), e.w2()], {"top_k": self.top_k}, path + ".moe")
        graph = current_graph()
        digits = [int(part) for part in path.split(".") if part.isdigit()]
        graph.moe.append((digits[0] if digits else len(graph.moe), out[0].name, e.w1.shape[0]))
        if self.aux_loss > 0:
            add_loss(apply("scale", [out[1]], {"scale": float(self.aux_loss), "bias": 0.0}))
        if self.z_loss > 0:
            add_loss(apply("scale", [out[2]], {"scale": float(self.z_loss), "bias": 0.0}))
        return out[0].reshape(b, s, h)


def split_sequence(x):
    """Under sequence parallelism (``Trainer(sp=True)``) the activation x [B, S, ...] split over tp
    on its sequence (Shard(1)), the batch over the data dims; x as it is otherwise."""
    return place_activation(x, "S(1)") if sequence_parallel() else x


def _gathered(x):
    # A norm's output under sp: whole on tp, for the column-parallel layers that read it.
    return place_activation(x, "R") if sequence_parallel() else x


def output(name, x):
    """Marks x [batch, ...] as the model's output `name`: Trainer.evaluate(batch) returns it whole, a
    NumPy array of its global shape, from the forward without dropout on any mesh. The loss and
    training graphs are unchanged (x itself). Returns x."""
    graph = current_graph()
    if not graph.predicting:
        return x
    site = user_site()
    if name in graph.outputs:
        raise _core.UsageError(f"{site}: the output '{name}' is marked twice")
    if graph.rows is not None and (not x.shape or x.shape[0] != graph.rows):
        raise _core.UsageError(f"{site}: the output '{name}' has shape {x.shape}: an output's dim 0 is the batch "
                               f"(its {graph.rows} rows)")
    marked = apply("reshape", [x], {"shape": list(x.shape)}, name)  # the value named as the output
    if marked.name != name:
        raise _core.UsageError(f"{site}: the output '{name}' is named as another value of the model: choose another name")
    graph.outputs[name] = marked
    return x


def add_loss(term):
    """Adds a scalar term (a router loss) to the graph's extra loss, which the model's head adds to
    its loss (with_extra_loss)."""
    graph = current_graph()
    graph.extra_loss = term if graph.extra_loss is None else graph.extra_loss + term


def with_extra_loss(loss):
    """`loss` plus the terms add_loss() collected in this graph (none: `loss` itself)."""
    extra = current_graph().extra_loss
    return loss if extra is None else loss + extra


def split_heads(x, heads):
    """[B, S, heads * D] -> [B, heads, S, D]."""
    b, s, h = x.shape
    return x.reshape(b, s, heads, h // heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """[B, heads, S, D] -> [B, S, heads * D]."""
    b, n, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * d)


def _dropout_attrs(p, site):
    graph = current_graph()
    if p <= 0 or not graph.training:
        return None
    return {"p": float(p), "seed": int(graph.native.seed), "stream": _core._stream_id(site) >> 1}


def dropout(x, p, site):
    """Dropout with probability p while training (the identity in the loss-only graph): its masks are
    keyed by the run's seed, the site's name, the sample and the position, as the built-in models'
    (so any mesh drops the same elements)."""
    attrs = _dropout_attrs(p, site)
    if attrs is None:
        return x
    return apply("dropout", [x], dict(attrs, training=True), site)[0]


def attention(q, k, v, scale=None, dropout=0.0, site="attn.dropout"):
    """Causal attention on [B, heads, S, D] with the fused kernel (flash_attention): softmax(q k^T *
    scale) v, scale 1/sqrt(D) by default; attention dropout p keyed by `site` while training. On a
    cp mesh the sequence is in cp's balanced order (balanced_ranks) and, with --cp-attention ring
    (the default), the kernel is ring_attention, as the built-in models'."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    attrs = {"scale": float(scale)}
    attrs.update(_dropout_attrs(dropout, site) or {})
    op, cp = "flash_attention", context_parallel()
    if cp > 1:  # the sequence in cp's balanced order; "ring": k and v blocks travel the cp ring
        attrs["balanced_ranks"] = cp
        op = "ring_attention" if current_graph().native.cp_attention == "ring" else op
    return apply(op, [q, k, v], attrs)[0]


def constant(name, value):
    """An input of the graph bound once to `value` (an array; replicated on every rank), e.g. a
    table of positions; the same Tensor for a name already declared."""
    return current_graph().constant(name, np.ascontiguousarray(value))


def rotary(x, theta=10000.0):
    """x [B, heads, S, D] rotated by its positions (positions(S): 0..S-1, cp's order on a cp mesh;
    rotary_embedding: Llama's rotate-half form, frequencies theta^(-2i/D))."""
    return apply("rotary_embedding", [x, positions(x.shape[2])], {"theta": float(theta)})


def context_parallel():
    """The cp dim's size of the graph being traced (1: no cp): its sequences are split over cp ranks."""
    return int(current_graph().native.cp_size)


def positions(seq):
    """The original position of each stored token of a sequence of `seq` tokens, [seq] i64: 0 .. seq-1,
    or on a cp mesh (whose sequences are stored in cp's balanced order) each token's own; look a
    position embedding up with it (``ops.embedding(nn.positions(S), wpe)``) for a model to run on cp."""
    return constant("positions", np.asarray(current_graph().native.positions(seq), dtype=np.int64))


@contextlib.contextmanager
def recompute():
    """The ops applied inside are recomputed for the backward instead of kept (activation
    recompute, one segment; segments do not nest): ``with nn.recompute(): x = block(x)``."""
    graph = current_graph()
    graph.native.begin_segment()
    try:
        yield
    finally:
        graph.native.end_segment()


def _sum_scale(x):
    count = 1
    for d in x.shape[:-1]:
        count *= d
    return 1.0 / count


def lm_head_loss(x, weight, labels):
    """The mean next-token cross-entropy of the logits x weight^T (x [B, S, H], weight [V, H]) with
    the fused head (the logits made and dropped in row chunks; vocab-parallel on a mesh with tp), as
    the built-in models' training loss: the summed loss over B x S tokens, scaled. In the predictions
    graph the logits [B, S, V] are made and marked as the output "logits"."""
    graph = current_graph()
    if graph.predicting:  # the logits made whole, an output ("logits")
        return cross_entropy(output("logits", apply("matmul", [x, weight], {"trans_y": True})), labels)
    op = "vocab_parallel_lm_head_cross_entropy" if graph.has_dim("tp") else "lm_head_cross_entropy"
    scale = _sum_scale(x)
    attrs = {"reduction": "sum"}
    grads = (1 if x.requires_grad else 0) | (2 if weight.requires_grad else 0)
    if grads:  # the head's gradients come out of its forward
        attrs.update(forward_grads=grads, grad_scale=scale)
    total = apply(op, [x, weight, labels], attrs)
    total = total[0] if isinstance(total, tuple) else total
    return apply("scale", [total], {"scale": scale, "bias": 0.0})


def cross_entropy(logits, labels):
    """The mean cross-entropy of logits [..., V] against labels [...] (vocab-parallel with tp)."""
    op = "vocab_parallel_cross_entropy" if current_graph().has_dim("tp") else "cross_entropy"
    total = apply(op, [logits, labels], {"reduction": "sum"})
    return apply("scale", [total], {"scale": _sum_scale(logits), "bias": 0.0})
