"""GPT-2 with shardwise.nn: the graph src/shardwise/models/gpt.cc builds (fused attention, the fused
vocab-parallel LM head tied to the token embedding, dropout at the same sites), under the same
parameter names, so ``shardwise train --layers L --hidden H --heads N [--dropout P] [--bf16]`` and
``Trainer(model=GPT2(L, H, N, seq, vocab[, dropout=P])[, bf16=True])`` give the same losses bit for
bit."""
import math

from .. import nn


class Attention(nn.Module):
    """Causal self-attention: q, k, v column-parallel (heads split over tp), c_proj row-parallel."""

    def __init__(self, hidden, heads, proj_std, dropout, prefix):
        self.heads, self.dropout, self.prefix = heads, dropout, prefix
        self.q_proj = nn.Linear(hidden, hidden, parallel="column")
        self.k_proj = nn.Linear(hidden, hidden, parallel="column")
        self.v_proj = nn.Linear(hidden, hidden, parallel="column")
        self.c_proj = nn.Linear(hidden, hidden, std=proj_std, parallel="row")

    def forward(self, x):
        q, k, v = (nn.split_heads(p(x), self.heads) for p in (self.q_proj, self.k_proj, self.v_proj))
        ctx = nn.attention(q, k, v, dropout=self.dropout, site=self.prefix + ".dropout")
        return nn.dropout(self.c_proj(nn.merge_heads(ctx)), self.dropout, self.prefix + ".resid_dropout")


class Block(nn.Module):
    def __init__(self, hidden, heads, proj_std, dropout, prefix):
        self.dropout, self.prefix = dropout, prefix
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, proj_std, dropout, prefix + ".attn")
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = nn.MLP(hidden, proj_std=proj_std)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + nn.dropout(self.mlp(self.ln_2(x)), self.dropout, self.prefix + ".mlp.dropout")


class Transformer(nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab, std, dropout):
        proj_std = std / math.sqrt(2.0 * layers)  # GPT-2's residual projections
        self.wte = nn.Embedding(vocab, hidden, std=std, vocab_parallel=True)
        self.wpe = nn.Embedding(seq, hidden, std=std)
        self.h = nn.ModuleList([Block(hidden, heads, proj_std, dropout, f"transformer.h.{i}") for i in range(layers)])
        self.ln_f = nn.LayerNorm(hidden)


class GPT2(nn.Decoder):
    """forward(ids, labels): the mean next-token cross-entropy (labels are the next tokens)."""

    def __init__(self, layers, hidden, heads, seq, vocab, std=0.02, dropout=0.0):
        self.dropout = dropout  # GPT-2's embd, attn and resid pdrop, all one
        self.transformer = Transformer(layers, hidden, heads, seq, vocab, std, dropout)

    def embed(self, ids):
        t = self.transformer
        wpe = t.wpe.weight()
        if nn.context_parallel() > 1:  # the tokens in cp's order: each one's own position
            wpe = nn.ops.embedding(nn.positions(ids.shape[1]), wpe)
        return nn.dropout(nn.ops.embedding(ids, t.wte.weight()) + wpe, self.dropout, "emb.dropout")

    def blocks(self):
        return self.transformer.h

    def head(self, x, labels):  # tied to the token embedding
        t = self.transformer
        return nn.lm_head_loss(t.ln_f(x), t.wte.weight(), labels)
