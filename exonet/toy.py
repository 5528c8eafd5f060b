"""Small models and datasets made in code, for examples, benchmarks and tests.

They live in the package (not in tests/) because node processes unpickle them by
module path, and a spawned process can import ``exonet.toy`` but not a test file.
Models that fail or stall on purpose are in ``exonet.runtime.testing``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

if TYPE_CHECKING:
    from exonet.runtime.pipeline import Staged


class _Supervised(nn.Module):
    """Wraps a network so that ``model((x, y))`` returns ``loss(net(x), y)``, as exonet expects."""

    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = staticmethod(nn.functional.cross_entropy)

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return self.loss(self.net(x), y)


class Classifier(_Supervised):
    """Cross-entropy wrapper: ``model((x, y))`` returns the loss."""


class Regressor(_Supervised):
    """Mean-squared-error wrapper: ``model((x, y))`` returns the loss."""

    loss = staticmethod(nn.functional.mse_loss)


def bench_mlp(seed: int = 0) -> Classifier:
    """The benchmark MLP: Linear 64→256, ReLU, 256→256, ReLU, 256→10."""
    torch.manual_seed(seed)
    return Classifier(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))


def tiny_mlp(in_dim: int = 8, hidden: int = 16, classes: int = 4, seed: int = 0) -> Classifier:
    torch.manual_seed(seed)
    return Classifier(nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, classes)))


def linear_regressor(in_dim: int = 6, out_dim: int = 2, seed: int = 0) -> Regressor:
    torch.manual_seed(seed)
    return Regressor(nn.Linear(in_dim, out_dim))


def synthetic_classification(n: int = 1024, dim: int = 64, classes: int = 10, seed: int = 0,
                             train: bool = True) -> TensorDataset:
    """Gaussian blobs, one per class: learnable, deterministic, no download.

    ``seed`` fixes the task (the class centres); ``train`` picks an independent sample of it.
    """
    centers = torch.randn(classes, dim, generator=torch.Generator().manual_seed(seed)) * 2
    g = torch.Generator().manual_seed(seed * 2 + (1 if train else 2) + 10_000)
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + torch.randn(n, dim, generator=g)
    return TensorDataset(x, y)


def synthetic_regression(n: int = 256, in_dim: int = 6, out_dim: int = 2, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(in_dim, out_dim, generator=g)
    x = torch.randn(n, in_dim, generator=g)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(n, out_dim, generator=g))


class ShardFactory:
    """A dataset factory ``f(rank, num_nodes, train)``: each rank builds its own shard."""

    def __init__(self, n: int = 512, dim: int = 8, classes: int = 4, seed: int = 0) -> None:
        self.n, self.dim, self.classes, self.seed = n, dim, classes, seed

    def __call__(self, rank: int, num_nodes: int, train: bool) -> Dataset:
        full = synthetic_classification(self.n, self.dim, self.classes, self.seed, train)
        idx = torch.arange(rank, self.n, num_nodes)
        return TensorDataset(*(t[idx] for t in full.tensors))


def digits(train: bool = True, val_fraction: float = 0.2, seed: int = 0) -> TensorDataset:
    """scikit-learn's 8×8 digits (shipped with the package, no download), scaled to [0, 1].

    A fixed, seeded split: ``train=False`` gives the held-out ``val_fraction``.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("the digits data set needs scikit-learn: pip install 'exonet[examples]'") from None
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(len(x) * (1 - val_fraction))
    idx = order[:cut] if train else order[cut:]
    return TensorDataset(x[idx], y[idx])


def digits_mlp(hidden: int = 128, seed: int = 0) -> Classifier:
    """A small MLP for digits: 64 → hidden → hidden → 10."""
    torch.manual_seed(seed)
    return Classifier(nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                    nn.Linear(hidden, 10)))


# ---------------------------------------------------------------- a small GPT, whole or in stages
STDLIB_MODULES = ("functools", "textwrap", "heapq", "dataclasses", "collections", "random", "fractions", "statistics")


def stdlib_text(modules: tuple[str, ...] = STDLIB_MODULES) -> str:
    """The source of a few standard-library modules, read from this interpreter's installation (no download)."""
    texts = []
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ImportError(f"stdlib_text: no source for module {name!r} in this interpreter")
        texts.append(Path(spec.origin).read_text(encoding="utf-8"))
    return "\n\n".join(texts)


class CharWindows(Dataset):
    """Every ``stride``-th window of ``block`` characters, paired with the window shifted by one (the targets)."""

    def __init__(self, ids: torch.Tensor, block: int, stride: int) -> None:
        self.ids, self.block, self.stride = ids, block, stride

    def __len__(self) -> int:
        return (len(self.ids) - self.block - 1) // self.stride + 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.stride
        return self.ids[start : start + self.block], self.ids[start + 1 : start + self.block + 1]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which each position sees only itself and earlier ones."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Pre-norm transformer block: attention, then a 4x MLP, each added to the residual stream."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TokenEmbedding(nn.Module):
    """Token ids to the residual stream: a token's embedding plus its position's."""

    def __init__(self, vocab: int, block: int, width: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(block, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))


class NextTokenHead(nn.Module):
    """The residual stream to next-token logits: a final norm and an unbiased projection."""

    def __init__(self, width: int, vocab: int) -> None:
        super().__init__()
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(x))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of every position's next token."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def staged_gpt(vocab: int, block: int, width: int = 64, layers: int = 4, heads: int = 4, seed: int = 0) -> Staged:
    """A small GPT a pipeline can cut between any two of its modules: the embedding, ``layers`` blocks, the head."""
    from exonet.runtime.pipeline import Staged

    torch.manual_seed(seed)
    return Staged([TokenEmbedding(vocab, block, width), *(Block(width, heads) for _ in range(layers)),
                   NextTokenHead(width, vocab)], next_token_loss)
