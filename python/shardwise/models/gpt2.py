"""GPT-2 with shardwise.nn: the graph src/shardwise/models/gpt.cc builds (fused attention, the fused
vocab-parallel LM head tied to the token embedding, no dropout), under the same parameter names, so
``shardwise train --layers L --hidden H --heads N`` and ``Trainer(model=GPT2(L, H, N, seq, vocab))``
give the same losses bit for bit."""
import math

from .. import nn


class Attention(nn.Module):
    """Causal self-attention: q, k, v column-parallel (heads split over tp), c_proj row-parallel."""

    def __init__(self, hidden, heads, proj_std):
        self.heads = heads
        self.q_proj = nn.Linear(hidden, hidden, parallel="column")
        self.k_proj = nn.Linear(hidden, hidden, parallel="column")
        self.v_proj = nn.Linear(hidden, hidden, parallel="column")
        self.c_proj = nn.Linear(hidden, hidden, std=proj_std, parallel="row")

    def forward(self, x):
        q, k, v = (nn.split_heads(p(x), self.heads) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.c_proj(nn.merge_heads(nn.attention(q, k, v)))


class Block(nn.Module):
    def __init__(self, hidden, heads, proj_std):
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, proj_std)
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = nn.MLP(hidden, proj_std=proj_std)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab, std):
        proj_std = std / math.sqrt(2.0 * layers)  # GPT-2's residual projections
        self.wte = nn.Embedding(vocab, hidden, std=std, vocab_parallel=True)
        self.wpe = nn.Embedding(seq, hidden, std=std)
        self.h = nn.ModuleList([Block(hidden, heads, proj_std) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden)


class GPT2(nn.Decoder):
    """forward(ids, labels): the mean next-token cross-entropy (labels are the next tokens)."""

    def __init__(self, layers, hidden, heads, seq, vocab, std=0.02):
        self.transformer = Transformer(layers, hidden, heads, seq, vocab, std)

    def embed(self, ids):
        t = self.transformer
        return nn.ops.embedding(ids, t.wte.weight()) + t.wpe.weight()

    def blocks(self):
        return self.transformer.h

    def head(self, x, labels):  # tied to the token embedding
        t = self.transformer
        return nn.lm_head_loss(t.ln_f(x), t.wte.weight(), labels)
