"""FedBuff: buffered asynchronous aggregation (Nguyen et al., AISTATS 2022, arXiv 2106.06639).

Clients train from the model version they last received and send their update as they
finish; the server buffers updates, weighting each by its staleness, and steps after every
B arrivals (exonet.strategies.server).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from exonet.strategies.base import NodeContext, OptimSpec, check_int
from exonet.strategies.server import ServerStrategy

if TYPE_CHECKING:
    from exonet.communicator import Communicator


class FedBuffStrategy(ServerStrategy):
    """The server steps after every ``buffer_size`` arrivals with their staleness-weighted mean.

    An update from a client whose model is τ server steps old counts with weight
    s(τ) = 1/√(1+τ) (the paper's polynomial staleness scaling); after B arrivals the server
    steps its optimizer on Σ s(τ_i)·Δ_i / B (by default θ ← θ − η_g · Σ s(τ_i)·Δ_i / B, η_g = 1) and its
    version advances. Each client gets the current
    parameters back at once (possibly unchanged) and continues.

    Args:
        optim_spec: the clients' optimizer. Default AdamW lr 1e-3.
        outer_optim_spec: the server's optimizer over θ, stepped on the buffer's weighted mean
            Σ s(τ_i)·Δ_i / B. Default SGD(lr=1.0): θ ← θ − η_g · Σ s(τ_i)·Δ_i / B with η_g = 1, the paper's step
            (``server_lr=η`` is its deprecated spelling, ``OptimSpec("sgd", lr=η)``).
        H: local steps per round (the paper's K).
        buffer_size: B, arrivals per server step.
        max_norm: clip the local gradient norm.
        dynamic_local_updates: local steps proportional to speed (see ``ServerStrategy``).
        lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the inner schedule.
    """

    name = "fedbuff"

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        outer_optim_spec: OptimSpec | str | type | None = None,
        H: int = 100,
        buffer_size: int = 2,
        dynamic_local_updates: bool = False,
    ) -> None:
        super().__init__(optim_spec, H=H, dynamic_local_updates=dynamic_local_updates)
        check_int("buffer_size", buffer_size, low=1)
        self.buffer_size = buffer_size
        self.outer_optim_spec = OptimSpec.coerce(outer_optim_spec, "outer_optim_spec", OptimSpec("sgd", lr=1.0))

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        super().setup(model, comm, ctx)
        if self.rank == self.server:
            self.buffer = torch.zeros_like(self.global_params)
            self.buffered = 0
            self.version = 0
            self.sent_version = [0] * ctx.num_nodes  # the version each client trains from
            self.outer_optimizer = self.outer_optim_spec.build([self.global_params])

    def apply(self, delta: torch.Tensor, trainer: int) -> None:
        staleness = self.version - self.sent_version[trainer]
        self.buffer.add_(delta, alpha=1 / math.sqrt(1 + staleness))
        self.buffered += 1
        if self.buffered == self.buffer_size:
            self.global_params.grad = self.buffer.div_(self.buffer_size)
            self.outer_optimizer.step()
            self.global_params.grad = None
            self.buffer.zero_()
            self.buffered = 0
            self.version += 1
        self.sent_version[trainer] = self.version  # the reply carries this version
