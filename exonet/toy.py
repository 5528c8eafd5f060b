"""Small models and datasets made in code, for tests, benchmarks and examples.

They live in the package (not in tests/) because node processes unpickle them by
module path, and a spawned process can import ``exonet.toy`` but not a test file.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset


class Classifier(nn.Module):
    """Wraps a network so that ``model((x, y))`` returns the cross-entropy loss, as exonet expects."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)


class Regressor(nn.Module):
    """Mean-squared-error wrapper: ``model((x, y))`` returns the loss."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)


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


class FailingModel(nn.Module):
    """Raises on ``fail_rank`` at step ``fail_step`` (counting forward calls): for failure tests."""

    def __init__(self, fail_rank: int, fail_step: int, message: str = "boom", how: str = "raise") -> None:
        super().__init__()
        self.inner = tiny_mlp()
        self.fail_rank, self.fail_step, self.message, self.how = fail_rank, fail_step, message, how
        self.calls = 0

    def forward(self, batch: Any) -> torch.Tensor:
        import os
        import signal
        import time

        import torch.distributed as dist

        if self.training:
            self.calls += 1
            if dist.is_initialized() and dist.get_rank() == self.fail_rank and self.calls == self.fail_step:
                if self.how == "raise":
                    raise RuntimeError(self.message)
                if self.how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if self.how == "hang":
                    time.sleep(3600)
        return self.inner(batch)
