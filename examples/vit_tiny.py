"""A ViT-tiny written only in Python with shardwise.nn, trained on batches of its own: patches
[B, P, D] (float32) embedded by a Linear with a learned position embedding, pre-LayerNorm encoder
blocks with bidirectional multi-head attention (softmax(q k^T / sqrt(d)) v, no mask) and a GELU
MLP, then a final LayerNorm, the tokens mean-pooled, a Linear head and the cross-entropy against the
class labels [B] (int64). Trained on any mesh from NumPy arrays:

    import numpy as np, shardwise as sw, vit_tiny
    model = vit_tiny.ViT(patches=4, patch_dim=12, hidden=16, heads=2, layers=2, classes=4)
    data = vit_tiny.synthetic_batches(model, global_batch=8, steps=20)
    with sw.Trainer(model=model, data=data, mesh="dp=2,tp=2", global_batch=8, steps=20) as t: ...

`head_loss` picks the head: "classes" (the cross-entropy) or "reward" (a scalar head trained on
float targets [B] by the mean-squared error, as a pooled regression / reward model).
"""
import math

import numpy as np

from shardwise import nn


def bidirectional_attention(q, k, v):
    """softmax(q k^T / sqrt(d)) v on [B, heads, P, d]: every token attends to every token."""
    scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(q.shape[-1]))
    return nn.ops.softmax(scores, axis=-1) @ v


class Block(nn.Module):
    def __init__(self, hidden, heads, proj_std):
        self.heads = heads
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = nn.Module()
        self.attn.q = nn.Linear(hidden, hidden, parallel="column")
        self.attn.k = nn.Linear(hidden, hidden, parallel="column")
        self.attn.v = nn.Linear(hidden, hidden, parallel="column")
        self.attn.proj = nn.Linear(hidden, hidden, std=proj_std, parallel="row")
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = nn.MLP(hidden, proj_std=proj_std)

    def forward(self, x):
        h = self.ln_1(x)
        a = self.attn
        q, k, v = (nn.split_heads(p(h), self.heads) for p in (a.q, a.k, a.v))
        x = x + a.proj(nn.merge_heads(bidirectional_attention(q, k, v)))
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Decoder):
    """embed (the patches' Linear and the position embedding), blocks (the encoder) and head (the
    final LayerNorm, the pooling, the head and its loss): an nn.Decoder, so a pp mesh cuts the
    encoder into stages, the patches bound on the first stage and the labels on the last."""

    def __init__(self, patches, patch_dim, hidden, heads, layers, classes, head_loss="classes", std=0.02):
        if head_loss not in ("classes", "reward"):
            raise ValueError(f"head_loss '{head_loss}' is not 'classes' or 'reward'")
        self.patches, self.patch_dim, self.classes, self.head_loss = patches, patch_dim, classes, head_loss
        proj_std = std / math.sqrt(2.0 * layers)
        self.patch_embed = nn.Linear(patch_dim, hidden, std=std)
        self.pos_embed = nn.Parameter((patches, hidden), std=std)
        self.encoder = nn.ModuleList([Block(hidden, heads, proj_std) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden)
        self.classifier = nn.Linear(hidden, classes if head_loss == "classes" else 1, std=std)

    def forward(self, patches, labels):
        x = self.embed(patches)
        for index, block in enumerate(self.blocks()):
            x = self.run_block(index, block, x)
        return self.head(x, labels)

    def embed(self, patches):
        return self.patch_embed(patches) + self.pos_embed()

    def blocks(self):
        return self.encoder

    def head(self, x, labels):
        # [B, hidden], the tokens mean-pooled, and [B, classes] or [B, 1]: Trainer.evaluate(batch)'s outputs
        pooled = nn.output("pooled", nn.ops.mean(self.ln_f(x), axis=[1]))
        out = nn.output(self.head_loss, self.classifier(pooled))
        if self.head_loss == "classes":
            return nn.cross_entropy(out, labels)
        error = out.reshape(labels.shape[0]) - labels
        return nn.ops.mean(error * error)                     # the mean-squared error over the batch


def synthetic_batches(model, global_batch, steps, seed=0):
    """`steps` batches {"patches": [B, P, D] f32, "labels": [B]} whose labels depend on the patches
    (the class of the largest mean over a group of features; for a reward head, that mean)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        x = rng.standard_normal((global_batch, model.patches, model.patch_dim)).astype(np.float32)
        groups = x.mean(axis=1)[:, : (model.patch_dim // model.classes) * model.classes]
        scores = groups.reshape(global_batch, model.classes, -1).mean(axis=2)
        if model.head_loss == "classes":
            y = scores.argmax(axis=1).astype(np.int64)
        else:
            y = scores.max(axis=1).astype(np.float32)
        out.append({"patches": x, "labels": y})
    return out
