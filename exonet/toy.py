"""Small models and datasets made in code, for examples, benchmarks and tests.

They live in the package (not in tests/) because node processes unpickle them by
module path, and a spawned process can import ``exonet.toy`` but not a test file.
Models that fail or stall on purpose are in ``exonet.runtime.testing``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset


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
