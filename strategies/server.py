"""ServerStrategy: asynchronous rounds through a parameter server, in simulated arrival order.

The K trainers each take their own number of local steps, send their pseudo-gradient
Δ = θ_start − θ_local to the server (rank K, after the trainers) and wait for the server's
current parameters, from which they continue; nobody waits for anybody else. The server
receives with ``comm.recv_any``: the online clock (exonet.runtime.clock) hands it the message that
arrives first in simulated time, so updates are applied in the order the scenario's
network and devices produce, whatever order the real processes reach it in. Subclasses say
what an update does to the global parameters (``apply``).

Where the server lives: it is the trace's last rank, K, a node like any other with its
own NIC; give it one in the scenario with ``[[nodes]] ranks = [K]`` (otherwise it gets the
scenario's defaults). Its own work (the outer step) takes no simulated time. Messages are
point-to-point: every round a trainer sends P·itemsize bytes and receives as many.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Callable

import torch

from exonet.strategies.base import (
    NodeContext,
    OptimSpec,
    Strategy,
    check_int,
    flatten,
    unflatten_into,
)

if TYPE_CHECKING:
    from exonet.communicator import Communicator


class ServerStrategy(Strategy):
    """H local steps per round on each trainer; the server applies each trainer's Δ as it arrives.

    Args:
        optim_spec: the trainers' optimizer (name, class or OptimSpec). Default AdamW lr 1e-3.
        H: local steps per round (the fastest trainer's, with ``dynamic_local_updates``).
        max_norm: clip the local gradient norm before each local step.
        dynamic_local_updates: each trainer takes H·v/v_max local steps per round, v its compute speed
            in the scenario (at least 1), so rounds end at about the same simulated time (DyLU,
            Liu et al. 2024).
        lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the inner learning-rate schedule.
    """

    servers = 1

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        H: int = 100,
        dynamic_local_updates: bool = False,
    ) -> None:
        super().__init__(optim_spec)
        check_int("H", H, low=1)
        self.H = H
        self.dynamic_local_updates = bool(dynamic_local_updates)

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        super().setup(model, comm, ctx)
        self.server = ctx.num_nodes
        with torch.no_grad():
            self.global_params = flatten(self.params)  # θ_start on a trainer, θ_global on the server
        self.local_H = self.H
        if self.dynamic_local_updates and self.rank != self.server:
            if not comm.has_clock:
                raise RuntimeError("dynamic_local_updates needs the online clock (fit with a scenario)")
            trainers = comm.speeds()[: ctx.num_nodes]
            self.local_H = max(1, round(self.H * trainers[self.rank] / max(trainers)))
        self.since_sync = 0

    # ---------------------------------------------------------------- trainer
    def step(self) -> None:
        self.optimizer_step()
        self.since_sync += 1
        if self.since_sync < self.local_H:
            return
        with torch.no_grad():
            delta = self.global_params - flatten(self.params)
            # Sent async and waited for after the reply: the clock must see the receive before this node
            # blocks, or it would hold the replay at the send's end while the server waits on the replay.
            sent = self.comm.send(delta, self.server, async_op=True)
            self.comm.recv(self.global_params, self.server)
            sent.wait()
            unflatten_into(self.global_params, self.params)
        self.since_sync = 0

    # ----------------------------------------------------------------- server
    def serve(self, updated: Callable[[int, float], None]) -> None:
        """The server rank's whole life (the node calls it instead of the training loop).

        Serves until ``comm.recv_any`` says no trainer is left, calling ``updated(n, sim_time_s)``
        after the n-th update of the global parameters, so the node can evaluate them.
        """
        delta = torch.empty_like(self.global_params)
        updates = 0
        while (arrival := self.comm.recv_any(delta)) is not None:
            trainer, when = arrival
            with torch.no_grad():
                self.apply(delta, trainer)
                unflatten_into(self.global_params, self.params)
            updates += 1
            updated(updates, when)
            self.comm.send(self.global_params, trainer)

    @abc.abstractmethod
    def apply(self, delta: torch.Tensor, trainer: int) -> None:
        """Update ``self.global_params`` with ``trainer``'s pseudo-gradient ``delta`` (on the server)."""
