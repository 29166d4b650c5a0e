"""A small causal language model (nanoGPT-like) on a generated token task, for a CUDA GPU.

``language_model.yaml`` names these functions. Each sequence is a walk through a fixed random
chain over the vocabulary: after token ``t`` comes ``successor[t]`` with probability
``FOLLOW``, else any token. Next-token accuracy is learnable in a few epochs and tops out near
``FOLLOW``: a model that has learned the chain predicts every follow and misses the rest.
Nothing is downloaded. The model returns logits ``[batch, sequence, vocabulary]`` (the classes
last, as Hugging Face's causal models do) for targets ``[batch, sequence]``, the inputs shifted
by one; the sequence length (64) differs from the vocabulary (256), so the class axis is never
ambiguous.
"""

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

VOCAB, LENGTH, FOLLOW = 256, 64, 0.9


def _walks(size: int, chain: torch.Tensor, generator: torch.Generator) -> TensorDataset:
    """``size`` walks of LENGTH + 1 tokens: the first LENGTH the inputs, the last LENGTH the
    targets (next-token prediction)."""
    tokens = torch.empty(size, LENGTH + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(VOCAB, (size,), generator=generator)
    jumps = torch.randint(VOCAB, (size, LENGTH), generator=generator)
    follows = torch.rand(size, LENGTH, generator=generator) < FOLLOW
    for step in range(LENGTH):
        tokens[:, step + 1] = torch.where(follows[:, step], chain[tokens[:, step]], jumps[:, step])
    return TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def chain_walks(n_train: int = 20000, n_val: int = 2000, seed: int = 0):
    """Generated walks (train, validation) through one chain, disjoint by their own seeds."""
    chain = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))
    train = _walks(n_train, chain, torch.Generator().manual_seed(seed + 1))
    return train, _walks(n_val, chain, torch.Generator().manual_seed(seed + 2))


class Block(nn.Module):
    """Pre-norm causal self-attention (``F.scaled_dot_product_attention``) and an MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final norm and a linear head."""

    def __init__(self, vocab: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(LENGTH, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        hidden = self.blocks(self.tokens(ids) + self.positions(positions))
        return self.head(self.norm(hidden))  # [batch, sequence, vocabulary]


def gpt(num_classes: int = VOCAB, width: int = 128, layers: int = 2, heads: int = 4):
    """A TinyGPT over ``num_classes`` tokens (the data set's vocabulary)."""
    return TinyGPT(num_classes, width, layers, heads)
