"""SPARTA: sparse parameter averaging (Beton et al. 2025, "Improving the Efficiency of Distributed
Training using Sparse Parameter Averaging", openreview.net/forum?id=stFPf3gzq1).

After every optimizer step the nodes average a small random fraction ``p`` of all
parameters. Every node draws the same index set from the shared seed and the step
number, so the mask costs zero bytes (the seed gym broadcast a full boolean mask per
tensor, about 50x the payload at p = 0.005), and the selected values of every
tensor travel in one flattened all-reduce.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import torch

from exonet.strategies.base import (NodeContext, OptimSpec, Strategy, base_options, check_range, inner_spec,
                                    shared_generator)

if TYPE_CHECKING:
    from exonet.communicator import Communicator

# Below this fraction of P, indices are drawn with replacement and de-duplicated
# (O(k log k), about k/(2P) <= 3% fewer than k); above it, a permutation (O(P)) gives exactly k.
_DENSE_FRACTION = 1 / 16


class SparseAverager:
    """SPARTA's exchange, shared by ``SPARTAStrategy`` and ``SPARTADiLoCoStrategy``.

    Selects k = round(p·P) of the P flat parameter coordinates (at least one) and averages
    them over all nodes with a single all-reduce of k values. The index set depends only
    on (seed, step): sparse draws use ``randint`` + ``unique``, so a few collisions make
    the set slightly smaller than k; dense draws (k > P/16) use ``randperm`` so that p = 1
    averages every coordinate exactly.

    Args:
        p_sparta: fraction of the parameters averaged per exchange, in (0, 1].
    """

    def __init__(self, p_sparta: float) -> None:
        check_range("p_sparta", p_sparta, low=0, low_open=True, high=1)
        self.p = p_sparta

    def bind(self, params: list[torch.nn.Parameter], comm: Communicator, seed: int) -> None:
        """Attach to a node's parameters and communicator (called from the strategy's ``setup``)."""
        self.params, self.comm, self.seed = params, comm, seed
        self.offsets = [0, *itertools.accumulate(p.numel() for p in params)]
        self._offsets = torch.tensor(self.offsets)
        self.numel = self.offsets[-1]
        self.k = max(1, round(self.p * self.numel))

    def indices(self, step: int) -> torch.Tensor:
        """Sorted, distinct flat indices for ``step``, identical on every node."""
        g = shared_generator(self.seed, "sparta", step)
        if self.k > self.numel * _DENSE_FRACTION:
            return torch.randperm(self.numel, generator=g)[: self.k].sort().values
        return torch.randint(self.numel, (self.k,), generator=g).unique()

    def average(self, step: int) -> None:
        """Average the coordinates drawn for ``step`` over all nodes, in place."""
        if self.comm.world_size == 1:
            return
        idx = self.indices(step)
        bounds = torch.searchsorted(idx, self._offsets).tolist()
        local = [(idx[a:b] - off).to(p.device) for p, a, b, off in zip(self.params, bounds, bounds[1:], self.offsets)]
        with torch.no_grad():
            values = torch.cat([p.take(i) for p, i in zip(self.params, local)])
            self.comm.all_reduce(values, op="avg")
            for p, i, v in zip(self.params, local, values.split([len(i) for i in local])):
                p.put_(i, v.to(p.dtype))


class SparseAveraging(Strategy):
    """A strategy that owns a ``SparseAverager`` as ``self.sparse`` (made in its constructor), bound at ``setup``."""

    sparse: SparseAverager

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        super().setup(model, comm, ctx)
        self.sparse.bind(self.params, comm, ctx.seed)


class SPARTAStrategy(SparseAveraging):
    """Local optimizer steps, each followed by averaging a seeded random fraction of the parameters.

    Payload per node per step: about ``p_sparta * P * itemsize`` bytes, no mask bytes.
    With ``p_sparta = 1`` it is per-step parameter averaging (FedAvg with H = 1). The
    index sets derive from (seed, step), so ``local_step`` is the only state beyond the base's.

    Args:
        inner_optim: the local optimizer (name, class or OptimSpec). Default AdamW lr 1e-3.
        p_sparta: fraction of the parameters averaged after every step, in (0, 1].
        max_norm: clip the local gradient norm before each step.
        optim_spec: alias of ``inner_optim`` (seed gym spelling).
        lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the learning-rate schedule,
            as in ``Strategy``.
    """

    name = "sparta"

    def __init__(
        self,
        inner_optim: OptimSpec | str | type | None = None,
        p_sparta: float = 0.005,
        max_norm: float | None = None,
        *,
        optim_spec: OptimSpec | str | type | None = None,
        lr_scheduler: str | type | None = None, lr_scheduler_kwargs: dict[str, Any] | None = None,
        warmup_steps: int = 0, cosine_min_ratio: float = 0.0,
    ) -> None:
        super().__init__(inner_spec(inner_optim, optim_spec), **base_options(locals()))
        self.sparse = SparseAverager(p_sparta)
        self.p_sparta = p_sparta

    def step(self) -> None:
        self.optimizer_step()
        self.local_step += 1
        self.sparse.average(self.local_step)
