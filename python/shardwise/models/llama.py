"""Llama with shardwise.nn: the graph src/shardwise/models/llama.cc builds for a Llama (RMSNorm,
rotary positions on q and k, grouped-query attention with the fused kernel, a SwiGLU MLP, no biases,
weights in Hugging Face's [out, in] layout, the head tied to the embedding; Mixtral's MoE MLPs with
`moe`), under transformers' parameter names, so ``shardwise train --model llama ...`` and ``Trainer(model=Llama(...))`` give
the same losses bit for bit."""
import math

from .. import nn
from ..graph import shard
from .._core import Replicate


def _norm(dim, eps):
    norm = nn.RMSNorm(dim, eps)
    shard(norm.weight, tp=Replicate())  # whole on tp, as the built-in model places it
    return norm


class SelfAttention(nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim, theta):
        self.heads, self.kv_heads, self.head_dim, self.theta = heads, kv_heads, head_dim, theta
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False, parallel="column", out_in=True)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False, parallel="column", out_in=True)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False, parallel="column", out_in=True)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False, parallel="row", out_in=True)

    def forward(self, h):
        q = nn.rotary(nn.split_heads(self.q_proj(h), self.heads), self.theta)
        k = nn.rotary(nn.split_heads(self.k_proj(h), self.kv_heads), self.theta)
        v = nn.split_heads(self.v_proj(h), self.kv_heads)
        b, _, s, d = q.shape
        scale = 1.0 / math.sqrt(self.head_dim)
        if self.kv_heads == self.heads:
            ctx = nn.attention(q, k, v, scale)
        else:  # each kv head's group of query heads together (the kernel's grouped form)
            groups = q.reshape(b, self.kv_heads, self.heads // self.kv_heads, s, d)
            ctx = nn.attention(groups, k, v, scale).reshape(b, self.heads, s, d)
        return self.o_proj(nn.merge_heads(ctx))


class MLP(nn.Module):
    def __init__(self, hidden, width):
        self.gate_proj = nn.Linear(hidden, width, bias=False, parallel="column", out_in=True)
        self.up_proj = nn.Linear(hidden, width, bias=False, parallel="column", out_in=True)
        self.down_proj = nn.Linear(width, hidden, bias=False, parallel="row", out_in=True)

    def forward(self, x):
        return self.down_proj(nn.ops.swiglu(self.gate_proj(x), self.up_proj(x)))


class Layer(nn.Module):
    def __init__(self, hidden, heads, kv_heads, width, eps, theta, moe):
        self.input_layernorm = _norm(hidden, eps)
        self.self_attn = SelfAttention(hidden, heads, kv_heads, hidden // heads, theta)
        self.post_attention_layernorm = _norm(hidden, eps)
        if moe:  # Mixtral's name for the sparse MLP
            self.block_sparse_moe = nn.MoE(hidden, width, **moe)
        else:
            self.mlp = MLP(hidden, width)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        mlp = self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp
        return x + mlp(self.post_attention_layernorm(x))


class Llama(nn.Decoder):
    """A Llama: kv_heads (0: heads) must divide over tp; width 0 is 4 x hidden. `moe` (a dict of
    nn.MoE's experts, top_k, aux_loss, z_loss) makes every layer's MLP a Mixtral MoE."""

    def __init__(self, layers, hidden, heads, vocab, kv_heads=0, width=0, eps=1e-6, theta=10000.0, moe=None):
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, hidden, vocab_parallel=True)
        self.model.layers = nn.ModuleList([Layer(hidden, heads, kv_heads or heads, width or 4 * hidden, eps, theta, moe)
                                           for _ in range(layers)])
        self.model.norm = _norm(hidden, eps)

    def embed(self, ids):
        return self.model.embed_tokens(ids)

    def blocks(self):
        return self.model.layers

    def head(self, x, labels):  # tied to the embedding
        w = self.model.embed_tokens.weight()
        return nn.with_extra_loss(nn.lm_head_loss(self.model.norm(x), w, labels))
