"""A sentence-embedding model written only in Python with shardwise.nn, trained as PaddleNLP's
EmbeddingTrainer trains one: a Qwen2-style decoder (RMSNorm, rotary positions, grouped-query
attention with q/k/v biases, a SwiGLU MLP; causal attention) embeds a query and its positive
passage, each pooled from the final states (the last token, as Qwen-based embedders pool, or the
mean over the tokens) and L2-normalised; the in-batch contrastive loss (InfoNCE) is the
cross-entropy of the logits q . p^T / temperature [B, B] against each query's own passage (its row
index, fed with the batch as "labels").

The negatives are every passage of the micro-batch, on every mesh: the passage embeddings, split
over dp as the batch is, are annotated Replicate on dp (an all-gather; its gradient a
reduce-scatter), so each rank's queries [B / dp, H] meet all B passages and the loss is the
single-device loss. ``negatives="local", dp=N`` instead scores each of N groups of rows (each dp
rank's, on a mesh of dp=N) against its own passages only (what an all-gather left out would give):
a different loss whenever N > 1. The micro-batch is what the negatives span: with accumulation or a
pipeline's micro-batches, each its own (the labels index its rows: synthetic_batches(micro_batch=)).

It is an nn.Decoder (embed(query, passage), blocks, head(x, labels)), so a pp mesh cuts it into
stages, the batch's query and passage bound on the first and its labels on the last.

    import shardwise as sw, sentence_embedding as se
    model = se.SentenceEmbedder(layers=2, hidden=32, heads=4, kv_heads=2, vocab=64)
    data = se.synthetic_batches(model, global_batch=8, seq=8, steps=20)
    with sw.Trainer(model=model, data=data, mesh="dp=2,tp=2", global_batch=8, steps=20) as t: ...

`head_loss="reward"` is the pooled regression / reward variant: a scalar head ("score") on the
pooled query embedding, trained on float targets [B] ("labels") by the mean-squared error.
"""
import numpy as np

from shardwise import Replicate, nn, shard
from shardwise.models.llama import Layer


def qwen2_layer(hidden, heads, kv_heads, width, eps, theta):
    """A Llama layer with Qwen2's biases on q, k and v (Hugging Face's names and [out, in] layout)."""
    layer = Layer(hidden, heads, kv_heads, width, eps, theta, None)
    attn, head_dim = layer.self_attn, hidden // heads
    for name, n_out in (("q_proj", heads * head_dim), ("k_proj", kv_heads * head_dim), ("v_proj", kv_heads * head_dim)):
        setattr(attn, name, nn.Linear(hidden, n_out, bias=True, parallel="column", out_in=True))
    return layer


def l2_normalize(x, eps=1e-12):
    """x [B, H] / sqrt(sum(x^2) + eps) by rows."""
    return x * nn.ops.rsqrt(nn.ops.scale(nn.ops.sum(x * x, axis=[-1], keepdim=True), bias=eps))


class SentenceEmbedder(nn.Decoder):
    def __init__(self, layers, hidden, heads, vocab, kv_heads=0, width=0, eps=1e-6, theta=10000.0, pooling="last",
                 temperature=0.1, head_loss="contrastive", negatives="global", dp=1):
        if pooling not in ("last", "mean"):
            raise ValueError(f"pooling '{pooling}' is not 'last' or 'mean'")
        if head_loss not in ("contrastive", "reward"):
            raise ValueError(f"head_loss '{head_loss}' is not 'contrastive' or 'reward'")
        if negatives not in ("global", "local"):
            raise ValueError(f"negatives '{negatives}' is not 'global' or 'local'")
        self.pooling, self.temperature, self.head_loss = pooling, temperature, head_loss
        self.negatives, self.dp, self.vocab = negatives, dp, vocab
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, hidden, vocab_parallel=True)
        self.model.layers = nn.ModuleList([qwen2_layer(hidden, heads, kv_heads or heads, width or 4 * hidden, eps, theta)
                                           for _ in range(layers)])
        self.model.norm = nn.RMSNorm(hidden, eps)
        shard(self.model.norm.weight, tp=Replicate())
        if head_loss == "reward":
            self.score = nn.Linear(hidden, 1, bias=False, out_in=True)

    def forward(self, query, labels, passage=None):
        x = self.embed(query, passage)
        for index, block in enumerate(self.blocks()):
            x = self.run_block(index, block, x)
        return self.head(x, labels)

    def embed(self, query, passage=None):
        """The tokens' embeddings [B, S, H]; with passages, each query's row followed by its passage's
        ([2B, S, H]: a rank's queries and passages stay on it)."""
        if passage is not None:
            b, s = query.shape
            query = nn.ops.stack(query, passage, axis=1).reshape(2 * b, s)
        return self.model.embed_tokens(query)

    def blocks(self):
        return self.model.layers

    def pool(self, x):
        """The final states [N, S, H] pooled to [N, H]: the last token's, or the mean over the tokens."""
        n, s, h = x.shape
        if self.pooling == "mean":
            return nn.ops.mean(x, axis=[1])
        return nn.ops.slice(x, axes=[1], starts=[s - 1], ends=[s]).reshape(n, h)

    def head(self, x, labels):
        pooled = self.pool(self.model.norm(x))
        if self.head_loss == "reward":
            error = self.score(pooled).reshape(labels.shape[0]) - labels
            return nn.ops.mean(error * error)
        b, h = labels.shape[0], pooled.shape[1]
        pairs = pooled.reshape(b, 2, h)
        q, p = (l2_normalize(nn.ops.slice(pairs, axes=[1], starts=[i], ends=[i + 1]).reshape(b, h)) for i in (0, 1))
        if self.negatives == "local":  # each dp rank's queries against its own passages
            g = self.dp
            q, p = q.reshape(g, b // g, h), p.reshape(g, b // g, h)
            logits = nn.ops.matmul(q, p, trans_y=True) * (1.0 / self.temperature)
            return nn.cross_entropy(logits, labels.reshape(g, b // g))
        p = shard(p, dp=Replicate())  # every passage on every dp rank: the negatives over dp
        logits = nn.ops.matmul(q, p, trans_y=True) * (1.0 / self.temperature)  # [B, B]
        return nn.cross_entropy(logits, labels)


def synthetic_batches(model, global_batch, seq, steps, micro_batch=None, seed=0):
    """`steps` batches of token ids, {"query", "passage": [B, S] i64, "labels": [B]}: each passage a
    noisy copy of its query (a quarter of its tokens redrawn); "labels" each row's index in its
    micro-batch of `micro_batch` rows (the passage it matches; with local negatives, in its dp
    rank's rows), or for a reward model a score of the query (f32: the share of its tokens in the
    vocabulary's lower half)."""
    rng = np.random.default_rng(seed)
    micro = (micro_batch or global_batch) // (model.dp if model.negatives == "local" else 1)
    out = []
    for _ in range(steps):
        query = rng.integers(0, model.vocab, (global_batch, seq), dtype=np.int64)
        if model.head_loss == "reward":
            out.append({"query": query, "labels": (query < model.vocab // 2).mean(axis=1).astype(np.float32)})
            continue
        passage = np.where(rng.random((global_batch, seq)) < 0.25,
                           rng.integers(0, model.vocab, (global_batch, seq), dtype=np.int64), query)
        labels = np.arange(global_batch, dtype=np.int64) % micro
        out.append({"query": query, "passage": passage, "labels": labels})
    return out
