"""SPARTA: sparse parameter averaging (Beton et al. 2025, "Improving the Efficiency of Distributed
Training using Sparse Parameter Averaging", openreview.net/forum?id=stFPf3gzq1).

After every optimizer step the nodes average a small random fraction ``p`` of all
parameters. Every node draws the same index set from the shared seed and the step
number, so the mask costs zero bytes (the seed gym broadcast a full boolean mask per
tensor, about 50x the payload at p = 0.005), and the selected values of every
tensor travel in one flattened all-reduce.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from exonet.strategies.base import (
    NodeContext,
    OptimSpec,
    Strategy,
    check_int,
    check_range,
    shared_generator,
)

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

    def bind(self, params: list[torch.Tensor], comm: Communicator, seed: int) -> None:
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

    def wire_nbytes(self, step: int) -> int:
        """Bytes one node's message for ``step`` puts on the wire: the drawn coordinates' values, in the parameters'
        dtype; the index set is drawn from the shared seed on every node and costs none."""
        dtype = functools.reduce(torch.promote_types, (p.dtype for p in self.params))  # torch.cat's, of the values
        return len(self.indices(step)) * torch.empty((), dtype=dtype).element_size()

    def expected_count(self) -> int:
        """How many distinct indices a draw holds on average: k for a permutation, P·(1 − (1 − 1/P)^k) else."""
        if self.k > self.numel * _DENSE_FRACTION:
            return self.k
        return max(1, round(-self.numel * math.expm1(self.k * math.log1p(-1 / self.numel)))) if self.numel > 1 else 1

    def _select(self, step: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Per-tensor local indices drawn for ``step``, and the current values there (one flat buffer).

        Meta tensors (``exonet.estimate``) hold no values to average, so nothing is drawn (at 1B
        parameters a draw costs more than a second): the buffer has the expected number of
        distinct indices, and no index.
        """
        if self.params[0].is_meta:
            return [], self.params[0].new_empty(self.expected_count())
        idx = self.indices(step)
        bounds = torch.searchsorted(idx, self._offsets).tolist()
        local = [(idx[a:b] - off).to(p.device) for p, a, b, off in zip(self.params, bounds, bounds[1:], self.offsets)]
        with torch.no_grad():
            return local, torch.cat([p.take(i) for p, i in zip(self.params, local)])

    def average(self, step: int) -> None:
        """Average the coordinates drawn for ``step`` over all nodes, in place."""
        if self.comm.world_size == 1:
            return
        local, values = self._select(step)
        self.comm.all_reduce(values, op="avg")
        if not local:
            return
        with torch.no_grad():
            for p, i, v in zip(self.params, local, values.split([len(i) for i in local])):
                p.put_(i, v.to(p.dtype))

    def launch(self, step: int) -> "Exchange | None":
        """Start averaging the coordinates drawn for ``step`` asynchronously (None on a single node)."""
        if self.comm.world_size == 1:
            return None
        local, values = self._select(step)
        return Exchange(local, values.clone(), self.comm.all_reduce(values, op="avg", async_op=True))

    def apply(self, exchange: "Exchange | None") -> None:
        """Wait for ``exchange`` and move its coordinates by (average − what this node sent).

        Local progress made on those coordinates since the launch is kept, as in SPARTA's
        asynchronous form; applied at once, this is plain averaging.
        """
        if exchange is None:
            return
        average = exchange.handle.wait()
        if not exchange.local:
            return
        with torch.no_grad():
            sizes = [len(i) for i in exchange.local]
            for p, i, avg, sent in zip(self.params, exchange.local, average.split(sizes), exchange.sent.split(sizes)):
                p.put_(i, (avg - sent).to(p.dtype), accumulate=True)

    def exchange_state(self, exchange: "Exchange | None") -> dict[str, Any] | None:
        """An exchange in flight as a checkpoint keeps it: where it reads, what this node sent, its handle's result."""
        if exchange is None:
            return None
        return {"local": [i.cpu() for i in exchange.local], "sent": exchange.sent.detach().clone(),
                "handle": exchange.handle.state_dict()}

    def restore_exchange(self, state: dict[str, Any] | None) -> "Exchange | None":
        """The exchange ``exchange_state`` kept; applying it moves the coordinates as the original would have."""
        if state is None:
            return None
        device = self.params[0].device
        return Exchange([i.to(device) for i in state["local"]], state["sent"].to(device),
                        self.comm.restore_handle(state["handle"]))


class Exchange(NamedTuple):
    """A sparse exchange in flight: where it reads, what this node sent, its handle (whose wait gives the average)."""

    local: list[torch.Tensor]
    sent: torch.Tensor
    handle: Any


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
    index sets derive from (seed, step).

    With ``delay_steps = d > 0`` the exchange is asynchronous, as in the paper: the
    average of step t's coordinates is launched after step t and applied after step
    t + d, so it travels while the next d steps compute; applying it adds (average − the
    value this node sent), keeping the local progress made meanwhile. ``d = 0`` is the
    blocking form. Exchanges still in flight at the end are applied by ``finish``; a
    checkpoint keeps those in flight, so a resumed run applies them at the same steps.

    Args:
        optim_spec: the local optimizer (name, class or OptimSpec). Default AdamW lr 1e-3.
        p_sparta: fraction of the parameters averaged after every step, in (0, 1].
        max_norm: clip the local gradient norm before each step.
        delay_steps: how many steps an exchange may stay in flight (0: blocking).
        async_sparta_delay: alias of ``delay_steps`` (seed gym spelling).
        lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the learning-rate schedule,
            as in ``Strategy``.
    """

    name = "sparta"

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        p_sparta: float = 0.005,
        delay_steps: int = 0,
        async_sparta_delay: int | None = None,
    ) -> None:
        super().__init__(optim_spec)
        if async_sparta_delay is not None:
            if delay_steps:
                raise TypeError("delay_steps and async_sparta_delay are aliases of one argument; pass only one of them")
            delay_steps = async_sparta_delay
        check_int("delay_steps", delay_steps, low=0)
        self.sparse = SparseAverager(p_sparta)
        self.p_sparta = p_sparta
        self.delay_steps = delay_steps

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        super().setup(model, comm, ctx)
        self._in_flight: deque[Exchange | None] = deque()

    def step(self) -> None:
        self.optimizer_step()
        t = self.local_step + 1  # this step's number
        if self.delay_steps == 0:
            self.sparse.average(t)
            return
        self._in_flight.append(self.sparse.launch(t))
        if len(self._in_flight) > self.delay_steps:
            self.sparse.apply(self._in_flight.popleft())

    def finish(self) -> None:
        while self._in_flight:
            self.sparse.apply(self._in_flight.popleft())

    def state_dict(self) -> dict[str, Any]:
        """Also the exchanges in flight (their results taken now): a resumed run applies them when the
        uninterrupted run would, and records their waits as it would."""
        return {**super().state_dict(), "in_flight": [self.sparse.exchange_state(e) for e in self._in_flight]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._in_flight = deque(self.sparse.restore_exchange(e) for e in state["in_flight"])
