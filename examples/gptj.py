"""A GPT-J-style decoder written only in Python with shardwise.nn: each block computes attention and
the MLP in parallel from one LayerNorm (x + attn(ln(x)) + mlp(ln(x))), q/k/v and the attention's
output projection without biases, rotary positions on q and k (over the whole head, in
transformers' rotate-half form), and an LM head of its own (not tied to the embedding). Trained on
any mesh:

    import shardwise as sw, gptj
    model = gptj.GPTJ(layers=2, hidden=32, heads=2, vocab=16)
    with sw.Trainer(model=model, mesh="dp=2,tp=2", seq=8, vocab=16, steps=20) as t: ...
"""
import contextlib
import math

from shardwise import nn


class ParallelBlock(nn.Module):
    def __init__(self, hidden, heads, proj_std):
        self.heads = heads
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = nn.Module()
        self.attn.q_proj = nn.Linear(hidden, hidden, bias=False, parallel="column")
        self.attn.k_proj = nn.Linear(hidden, hidden, bias=False, parallel="column")
        self.attn.v_proj = nn.Linear(hidden, hidden, bias=False, parallel="column")
        self.attn.out_proj = nn.Linear(hidden, hidden, bias=False, std=proj_std, parallel="row")
        self.mlp = nn.Module()
        self.mlp.fc_in = nn.Linear(hidden, 4 * hidden, parallel="column")
        self.mlp.fc_out = nn.Linear(4 * hidden, hidden, std=proj_std, parallel="row")

    def forward(self, x):
        h = self.ln_1(x)
        a = self.attn
        q, k, v = (nn.split_heads(p(h), self.heads) for p in (a.q_proj, a.k_proj, a.v_proj))
        q, k = nn.rotary(q), nn.rotary(k)
        attn = a.out_proj(nn.merge_heads(nn.attention(q, k, v)))
        mlp = self.mlp.fc_out(nn.ops.gelu(self.mlp.fc_in(h)))
        return x + attn + mlp


class GPTJ(nn.Decoder):
    def __init__(self, layers, hidden, heads, vocab, std=0.02, recompute=False):
        self.recompute = recompute  # each block recomputed for the backward instead of kept
        proj_std = std / math.sqrt(2.0 * layers)
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, hidden, std=std, vocab_parallel=True)
        self.transformer.h = nn.ModuleList([ParallelBlock(hidden, heads, proj_std) for _ in range(layers)])
        self.transformer.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Embedding(vocab, hidden, std=std, vocab_parallel=True)  # [V, H], rows over tp

    def embed(self, ids):
        return self.transformer.wte(ids)

    def blocks(self):
        return self.transformer.h

    def run_block(self, index, block, x):
        with nn.recompute() if self.recompute else contextlib.nullcontext():
            return block(x)

    def head(self, x, labels):
        return nn.lm_head_loss(self.transformer.ln_f(x), self.lm_head.weight(), labels)
