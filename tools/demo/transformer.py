"""The small decoder-only transformer that the FSDP2 demo, tests and benchmark train.

    model = TinyTransformer(vocab=64, dim=32, heads=4, blocks=3, seq=16)
    shard_transformer(model, mesh, fully_shard, **fsdp_kwargs)  # each block its own unit
    loss = lm_loss(model, tokens)                                 # next-token cross-entropy

The parameters are a deterministic function of `seed` (torch.manual_seed), so a
single-process reference and every rank of a sharded run start from the same
weights. `batch(step, rank, n)` makes rank `rank`'s micro-batch of step `step`;
the global batch of a step is the ranks' batches concatenated in rank order.
Plain torch only (no hsdp import): the tests' reference runs without a daemon.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-norm causal self-attention + MLP."""

    def __init__(self, dim, heads, mlp_ratio=4):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        att = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) / math.sqrt(d // self.heads)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v.transpose(1, 2)).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=64, dim=32, heads=4, blocks=3, seq=16, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.seq = seq
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(blocks))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def batch(step, rank, n, vocab=64, seq=16):
    """Rank `rank`'s micro-batch of step `step`: n sequences of seq + 1 tokens."""
    gen = torch.Generator().manual_seed(10_000 * step + rank + 1)
    return torch.randint(0, vocab, (n, seq + 1), generator=gen)


def global_batch(step, world, n, vocab=64, seq=16):
    return torch.cat([batch(step, r, n, vocab, seq) for r in range(world)])


def lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                           tokens[:, 1:].reshape(-1))


def shard_transformer(model, mesh, fully_shard, **kwargs):
    """fully_shard on every block (its own unit, in order) and then on the root."""
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model
