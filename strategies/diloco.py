"""DiLoCo: Distributed Low-Communication training (Douillard et al. 2023, arXiv 2311.08105).

FedAvg's rounds with an outer optimizer on the shared parameters, i.e. FedOpt
(Reddi et al. 2020) with AdamW inside and Nesterov momentum outside.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from exonet.strategies.base import NodeContext, OptimSpec, check_range, flatten, outer_spec, unflatten_into
from exonet.strategies.codecs import QuantizedMean, check_bits
from exonet.strategies.fedavg import FedAvgStrategy
from exonet.strategies.replica import ReplicaGroups, check_replica_size, check_replica_world
from exonet.strategies.transport import check_transport, exchange

if TYPE_CHECKING:
    from exonet.communicator import Communicator, Handle

OVERLAPS = (None, "delayed", "eager")


class DiLoCoStrategy(FedAvgStrategy):
    """H inner steps, then every node applies the same outer step to θ_global.

    Each node keeps θ_global, a flat copy of the parameters at the last sync, and the
    outer optimizer over it. At the end of a round the group all-reduces (one flattened
    buffer, op "avg") its inner parameters θ_local, sets the outer gradient
    Δ = θ_global − mean(θ_local) (the mean pseudo-gradient, as the members share θ_global),
    steps the outer optimizer and restarts from the new θ_global. There is no master copy on
    rank 0 and no broadcast back: at full participation each node sends ``P * itemsize`` bytes
    per round. K = 1 still takes the outer step; the first sync comes after exactly H inner
    steps; the inner optimizer keeps its state.

    Partial participation (``participation`` < 1) follows FedOpt's client sampling, which DiLoCo
    builds on: every round starts from the current global state. After round r's outer step its
    participants hold the new θ_global and outer-optimizer state; the nodes drawn for round r + 1
    that sat round r out receive both (one broadcast of θ_global plus the outer state, from the
    lowest-ranked participant of round r, traced and simulated like any collective) and restart
    their inner steps from θ_global, discarding what they trained while out. So every member of a
    round shares θ_global, Δ is the mean of the members' pseudo-gradients, and all participants
    hold identical parameters after each sync. A node that is out neither sends nor receives.
    With ``island_size`` (as in ``FedAvgStrategy``) each island averages inside itself, and a
    node keeps the θ_global and outer state of the island it last synced in.

    Replica groups (``replica_size`` G > 1, torchft's HSDP + DiLoCo): consecutive groups of G ranks
    are one DiLoCo worker whose ranks average gradients every step (one flat all-reduce inside the
    worker); the outer sync averages θ_local shard-wise across workers and all-gathers the shards
    inside (``exonet.strategies.replica``). G must divide K; it excludes participation < 1,
    ``island_size`` and ``deadline_s``.

    Overlapped outer steps (``overlap``, Kale, Douillard & Donchev 2025, "Eager Updates For Overlapped
    Communication and Computation in DiLoCo", arXiv 2502.12996): a round's all-reduce of the pseudo-gradients
    Δ_m = θ_global − θ_local runs during the next round's H inner steps instead of blocking, and each node
    steps its outer optimizer at the end of round t on what has landed:

    * ``"delayed"``: the previous round's mean, Δ̄_{t−1} (nothing at the end of the first round);
    * ``"eager"``: the mean with its own stale share swapped for its fresh one,
      Δ̃_m = Δ_m,t / M + Σ_{m'≠m} Δ_{m',t−1} / M = Δ̄_{t−1} − Δ_m,t−1 / M + Δ_m,t / M,
      so a node's outer step sees its own work at once and the others' one round late.
    Under eager the nodes' θ_global differ by their own last shares (with plain SGD outside, by Δ_m,t / M).
    The last round's mean lands at the end of the run with no round left to take it. At K = 1 eager is
    DiLoCo. Every node takes part in every round (no participation, islands, replica groups, deadline,
    elastic, quantize_bits or store).

    Defaults: the outer optimizer is the paper's SGD lr 0.7, momentum 0.9, Nesterov;
    H = 100 and the inner AdamW lr 1e-3 are the seed gym's (the paper uses H = 500 and
    AdamW lr 4e-4, weight decay 0.1 for its 150M-parameter language models).

    Args:
        optim_spec: the inner optimizer (name, class or OptimSpec). Default AdamW lr 1e-3.
        outer_optim_spec: the outer optimizer over θ_global. Default SGD(lr=0.7, momentum=0.9, nesterov=True).
        H: inner steps per round.
        max_norm: clip the inner gradient norm before each inner step.
        participation: fraction of nodes taking part in each round, in (0, 1].
        island_size: nodes per averaging island each round; None averages over all participants.
        replica_size: ranks per DiLoCo worker (data-parallel inside); 1 makes every rank a worker.
        deadline_s: deadline rounds, as in ``FedAvgStrategy``: the late adopt θ_global and the outer state
            (their work is discarded).
        elastic: rounds go on without the nodes that failed since their last sync, as in ``FedAvgStrategy``:
            a failed node adopts θ_global and the outer state from the lowest-ranked node that stayed up.
        quantize_bits: None sends θ_local in full (an all-reduce); 1 to 16 sends each node's pseudo-gradient
            θ_global − θ_local at that many bits per value through MuLoCo's error-fed statistical quantizer
            (``codecs.QuantizedMean``: one all-gather of the packed codes per round). Not with replica_size > 1,
            deadline_s or elastic.
        error_decay: with ``quantize_bits``, how much of the unsent error carries to the next round (MuLoCo's 0.9).
        overlap: None (block on each round's all-reduce), "delayed" or "eager" (see above).
        transport: "all_gather" (the all-reduce, or the quantized all-gather) or "store": each node puts its
            parameters (or its quantized message) in the object store once and gets the group's others; not with
            replica_size > 1, deadline_s or elastic.
        lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the inner learning-rate schedule,
            as in ``Strategy``.
    """

    name = "diloco"

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        outer_optim_spec: OptimSpec | str | type | None = None,
        H: int = 100,
        participation: float = 1.0,
        island_size: int | None = None,
        replica_size: int = 1,
        deadline_s: float | None = None,
        elastic: bool = False,
        quantize_bits: int | None = None,
        error_decay: float = 0.9,
        transport: str = "all_gather",
        overlap: str | None = None,
    ) -> None:
        super().__init__(optim_spec, island_size=island_size, H=H, participation=participation,
                         deadline_s=deadline_s, elastic=elastic)
        self.outer_optim_spec = outer_spec(outer_optim_spec)
        self.quantize_bits = None if quantize_bits is None else check_bits("quantize_bits", quantize_bits)
        check_range("error_decay", error_decay, low=0, high=1)
        self.error_decay = error_decay
        if quantize_bits is not None and (replica_size > 1 or deadline_s is not None or elastic):
            raise ValueError("quantize_bits: the quantized exchange is a round's all-gather; it cannot be combined "
                             "with replica_size > 1, deadline_s or elastic=True")
        self.transport = check_transport(transport)
        if transport == "store" and (replica_size > 1 or deadline_s is not None or elastic):
            raise ValueError("transport='store': a round's exchange goes through the store; it cannot be combined "
                             "with replica_size > 1, deadline_s or elastic=True")
        self.replica_size = check_replica_size(replica_size)
        if overlap not in OVERLAPS:
            raise ValueError(f"overlap must be None, 'delayed' or 'eager', got {overlap!r}")
        if overlap is not None and (participation != 1 or island_size is not None or replica_size > 1
                                    or deadline_s is not None or elastic or quantize_bits is not None
                                    or transport != "all_gather"):
            raise ValueError("overlap: every node's all-reduce runs through the next round; it cannot be combined "
                             "with participation < 1, island_size, replica_size > 1, deadline_s, elastic=True, "
                             "quantize_bits or transport='store'")
        self.overlap = overlap
        if replica_size > 1 and (participation != 1 or island_size is not None or deadline_s is not None or elastic):
            raise ValueError("replica_size: a replica group syncs every round as one worker; it cannot be combined "
                             "with participation < 1, island_size, deadline_s or elastic=True (elastic rounds are "
                             "per node: give each worker one node)")

    def check_world(self, num_nodes: int) -> None:
        super().check_world(num_nodes)
        check_replica_world(self.replica_size, num_nodes)

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        super().setup(model, comm, ctx)
        with torch.no_grad():
            self.global_params = flatten(self.params)
        self.outer_optimizer = self.outer_optim_spec.build([self.global_params])
        self._replicas = ReplicaGroups.for_node(self.rank, self.num_nodes, self.replica_size, comm)
        self._in_flight: tuple[Handle | None, torch.Tensor] | None = None  # overlap: last round's all-reduce, own Δ
        self._quantized = None if self.quantize_bits is None else QuantizedMean(
            [p.numel() for p in self.params], self.quantize_bits, self.error_decay, self.global_params.dtype,
            self.global_params.device)

    def group_mean(self, group: tuple[int, ...]) -> torch.Tensor:
        """The group's mean parameters; with ``quantize_bits``, θ_global minus the mean of the members'
        quantized, error-fed pseudo-gradients."""
        key = f"{self.name}/round{self.rounds_done()}"
        if self._quantized is not None:
            return self.global_params - self._quantized.mean(self.global_params - flatten(self.params), self.comm,
                                                             group, self.transport, key)
        if self.transport == "all_gather" or len(group) < 2:
            return super().group_mean(group)
        return exchange(self.comm, flatten(self.params), group, "store", key).mean(0)

    def step(self) -> None:
        if self._replicas is not None:
            self._replicas.average_gradients(self.comm, self.params)
        super().step()

    def sync_round(self) -> None:
        if self.overlap is not None:
            self._overlapped_round()
            return
        if self._replicas is not None:
            with torch.no_grad():
                self.apply_average(self._replicas.start_mean(self.comm, flatten(self.params)).wait())
            return
        super().sync_round()
        self.hand_off(self.rounds_done())

    def _overlapped_round(self) -> None:
        """Start this round's all-reduce of Δ_m, step on what has landed, restart from θ_global."""
        with torch.no_grad():
            delta = self.global_params - flatten(self.params)
            handle = self.comm.all_reduce(delta.clone(), op="avg", async_op=True) if self.num_nodes > 1 else None
            landed = None
            if self._in_flight is not None:
                previous, own = self._in_flight
                mean = own if previous is None else previous.wait()
                landed = mean if self.overlap == "delayed" else mean.sub_(own, alpha=1 / self.num_nodes)
            if self.overlap == "eager":
                landed = delta / self.num_nodes if landed is None else landed.add_(delta, alpha=1 / self.num_nodes)
            if landed is not None:
                self.global_params.grad = landed
                self.outer_optimizer.step()
                self.global_params.grad = None
            unflatten_into(self.global_params, self.params)
            self._in_flight = (handle, delta)

    def finish(self) -> None:
        """The last round's all-reduce lands (no round is left to step on it)."""
        if self._in_flight is not None and self._in_flight[0] is not None:
            self._in_flight[0].wait()
        self._in_flight = None
        super().finish()

    def hand_off(self, round_index: int) -> None:
        """Give the nodes of the next round that sat round ``round_index`` out its global state.

        Every node computes the same groups from the shared seed and declares the hand-off group;
        nothing is sent when the next round has no newcomer or lies beyond ``max_steps``.
        """
        if self.participation == 1 or (round_index + 1) * self.H > self.ctx.max_steps:
            return
        fresh = {r for island in self.round_partition(round_index) for r in island}
        newcomers = sorted({r for island in self.round_partition(round_index + 1) for r in island} - fresh)
        if not newcomers:
            return
        group = (min(fresh), *newcomers)
        self.comm.declare_groups([group])
        if self.rank not in group:
            return
        with torch.no_grad():
            state = self._global_state()
            self.comm.broadcast(state, src=group[0], group=group)
            if self.rank != group[0]:
                self._load_global_state(state)
                unflatten_into(self.global_params, self.params)

    def global_state(self) -> torch.Tensor:
        return self._global_state()

    def adopt_global_state(self, state: torch.Tensor) -> None:
        self._load_global_state(state)
        unflatten_into(self.global_params, self.params)

    def _outer_state(self) -> dict[str, Any]:
        """The outer optimizer's state for θ_global, in key order.

        A node that has never taken an outer step has none yet: a zero-gradient step creates it
        with the right keys and shapes, and the caller overwrites θ_global and the state at once.
        """
        if not self.outer_optimizer.state[self.global_params]:
            self.global_params.grad = torch.zeros_like(self.global_params)
            self.outer_optimizer.step()
            self.global_params.grad = None
        state = self.outer_optimizer.state[self.global_params]
        return {key: state[key] for key in sorted(state)}

    def _global_state(self) -> torch.Tensor:
        """θ_global followed by every outer-optimizer state value, as one buffer of θ_global's dtype."""
        theta = self.global_params.detach()
        values = [torch.as_tensor(v, device=theta.device).reshape(-1).to(theta.dtype)
                  for v in self._outer_state().values()]
        return torch.cat([theta.reshape(-1), *values])

    def _load_global_state(self, buffer: torch.Tensor) -> None:
        """Adopt a buffer made by ``_global_state`` on another node."""
        values = self._outer_state()
        state = self.outer_optimizer.state[self.global_params]
        offset = self.global_params.numel()
        self.global_params.copy_(buffer[:offset])
        for key, value in values.items():
            n = torch.as_tensor(value).numel()
            part = buffer[offset : offset + n]
            if isinstance(value, torch.Tensor):
                value.copy_(part.view_as(value))
            else:
                state[key] = type(value)(part.item())
            offset += n

    def apply_average(self, mean: torch.Tensor) -> None:
        """Outer step on θ_global with gradient θ_global − mean(θ_local); restart the inner steps from it."""
        self.global_params.grad = mean.sub_(self.global_params).neg_()  # Δ in the received buffer: no new P floats
        self.outer_optimizer.step()
        self.global_params.grad = None
        unflatten_into(self.global_params, self.params)

    def state_dict(self) -> dict[str, Any]:
        state = {**super().state_dict(), "global_params": self.global_params.detach().clone(),
                 "outer_optimizer": self.outer_optimizer.state_dict()}
        if self._quantized is not None:
            state["error"] = self._quantized.error.clone()
        if self._in_flight is not None:  # the transfer ends now (Handle.state_dict); the resumed node waits as this one
            handle, own = self._in_flight
            state["in_flight"] = {"own": own.clone(), "pending": None if handle is None else handle.state_dict()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            self.global_params.copy_(state["global_params"])
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        if self._quantized is not None:
            self._quantized.error.copy_(state["error"])
        if "in_flight" in state:
            saved = state["in_flight"]
            pending = None if saved["pending"] is None else self.comm.restore_handle(saved["pending"])
            self._in_flight = (pending, saved["own"].to(self.global_params.device))
