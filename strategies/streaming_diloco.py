"""Streaming DiLoCo (Douillard et al., arXiv 2501.18512): DiLoCo in fragments, overlapped, optionally 4-bit.

DiLoCo (arXiv 2311.08105) synchronises the whole model every H steps, so the network
sits idle between bursts of P parameters. Streaming DiLoCo cuts the model into F
fragments that take turns: each fragment still syncs every H steps, but the
fragments are staggered by H/F, so each burst is about P/F. Each fragment's
reduction is started asynchronously and only needed τ steps later, so it overlaps
the inner steps; the outer gradient may travel in 4 or 8 bits.

Exact rules implemented here (the step count t is the number of inner steps done):

* Fragments: the trainable parameter tensors, in ``model.parameters()`` order, cut into
  F contiguous groups; fragment f ends at the tensor boundary closest to (f+1)·P/F
  (ties to the earlier boundary), keeping at least one tensor per fragment.
* Schedule: fragment f has offset ``o_f = (f+1)·H // F`` and starts a sync after inner
  step t when ``t >= o_f`` and ``(t − o_f) % H == 0``. F = 1 syncs at t = H, 2H, ...
  like DiLoCo; the last fragment always syncs at multiples of H.
* Start (step t): Δ_f = θ_global,f − θ_local,f in fp32; its average over the nodes is
  started asynchronously (``all_reduce`` op "avg", or the quantized reduce-scatter +
  all-gather of ``exonet.strategies.quantize``).
* Completion (after inner step t + τ; τ = 0 completes in the same step): wait,
  ``θ_global,f ← OuterOpt_f(θ_global,f, mean Δ_f)`` (one outer optimizer and its state
  per fragment), then merge ``θ_local,f ← (1 − α)·θ_global,f + α·θ_local,f``. α = 0
  adopts θ_global exactly (DiLoCo's merge); α > 0 keeps part of the τ local steps
  made while the reduction was in flight.
* Quantized transfer: the ``all_to_all`` phase is issued at the start; the
  ``all_gather`` phase is issued at the first step boundary after the start (when
  τ >= 2, so it overlaps too) or at completion time (τ <= 1), and waited at completion.
* ``finish()`` completes every round still in flight, in start order. A checkpoint keeps
  each in-flight round as it stands: its own Δ and the result of the collective it waits
  on (that transfer ends at the checkpoint, untraced). A resumed run picks the round up at
  the same phase, so it issues, waits and records exactly what the uninterrupted run does.
* Wire dtype: Δ is computed in fp32 but travels in the parameters' dtype (a bf16 model sends
  bf16, as DiLoCo does); the outer step runs on θ_global in fp32.
* Replica groups (``replica_size`` G > 1): the ranks of a worker average gradients every step,
  and a fragment's mean is taken shard-wise across workers, started at the start and
  all-gathered inside the worker at completion (``exonet.strategies.replica``).
* K = 1 sends nothing (the average of one node is itself) but still takes the outer
  step τ steps later, as DiLoCo does.

Defaults: the outer optimizer is DiLoCo's SGD(lr 0.7, momentum 0.9, Nesterov); H = 100
and inner AdamW lr 1e-3 match ``DiLoCoStrategy``; τ = 1 and α = 0.5 follow the paper's
overlapped runs; F = 2 and exact (unquantized) transfer are conservative choices for
small models (the paper's headline run uses 4 bits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch

from exonet.strategies.base import (
    NodeContext,
    OptimSpec,
    Strategy,
    check_int,
    check_range,
    flatten,
    outer_spec,
    unflatten_into,
)
from exonet.strategies.quantize import BITS, QuantizedAllReduce
from exonet.strategies.replica import ReplicaGroups, ShardedMean, check_replica_size, check_replica_world

if TYPE_CHECKING:
    from exonet.communicator import Communicator, Handle


def fragment_bounds(sizes: Sequence[int], num_fragments: int) -> list[range]:
    """Cut tensors of ``sizes`` elements into ``num_fragments`` contiguous groups of about equal size.

    Fragment f ends at the tensor boundary closest to (f+1)·total/F (ties to the earlier
    one), leaving at least one tensor for each fragment.

    Returns:
        one ``range`` of tensor indices per fragment.

    Raises:
        ValueError: fewer tensors than fragments.
    """
    if num_fragments > len(sizes):
        raise ValueError(f"num_fragments ({num_fragments}) exceeds the number of trainable parameter tensors "
                         f"({len(sizes)}); a fragment holds whole tensors")
    cumulative = [0]
    for s in sizes:
        cumulative.append(cumulative[-1] + s)
    total = cumulative[-1]
    bounds = [0]
    for f in range(1, num_fragments):
        candidates = range(bounds[-1] + 1, len(sizes) - (num_fragments - f) + 1)
        bounds.append(min(candidates, key=lambda i: abs(cumulative[i] - f * total / num_fragments)))
    bounds.append(len(sizes))
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def check_schedule(H: int, num_fragments: int, delay_steps: int) -> None:
    """Validate a fragment schedule's arguments, each named: H >= 1, 1 <= F <= H, 0 <= τ <= H."""
    check_int("H", H, low=1)
    check_int("num_fragments", num_fragments, low=1)
    check_int("delay_steps", delay_steps, low=0)
    why = {"num_fragments": "each fragment syncs once every H steps",
           "delay_steps": "a fragment's sync lands before its next one starts"}
    for name, value in (("num_fragments", num_fragments), ("delay_steps", delay_steps)):
        if value > H:  # the bound is another argument: say which, since a default may be what broke it
            raise ValueError(f"{name} must be <= H = {H} ({why[name]}), got {value}")


def cut_fragments(params: list[torch.Tensor],
                  num_fragments: int) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
    """The parameters in ``num_fragments`` fragments (``fragment_bounds``), and each fragment's θ_global in fp32."""
    fragments = [params[r.start : r.stop] for r in fragment_bounds([p.numel() for p in params], num_fragments)]
    with torch.no_grad():
        return fragments, [flatten(ps).float() for ps in fragments]


def fragment_offsets(H: int, num_fragments: int) -> list[int]:
    """The step offset o_f = (f+1)·H // F of each fragment's syncs (at t = o_f, o_f + H, ...)."""
    return [(f + 1) * H // num_fragments for f in range(num_fragments)]


@dataclass
class _Round:
    """One fragment's synchronisation in flight."""

    fragment: int
    start: int
    due: int
    delta: torch.Tensor
    pending: "Handle | QuantizedAllReduce | ShardedMean | None"


class StreamingDiLoCoStrategy(Strategy):
    """DiLoCo whose fragments sync in turn, overlapped with τ inner steps, optionally quantized.

    Args:
        optim_spec: the inner optimizer (name, class or OptimSpec). Default AdamW lr 1e-3.
        outer_optim_spec: the outer optimizer of every fragment. Default SGD(lr=0.7, momentum=0.9, nesterov=True).
        H: inner steps between two syncs of the same fragment, >= 1.
        num_fragments: F, 1 <= F <= H (and at most the number of parameter tensors).
        delay_steps: τ, inner steps between starting a fragment's reduction and using it, 0 <= τ <= H.
        quantize_bits: None (exact fp32), 8 or 4: the outer gradient's wire precision.
        merge_alpha: α in [0, 1]; after an outer step θ_local ← (1 − α)·θ_global + α·θ_local.
        max_norm: clip the inner gradient norm before each inner step.
        replica_size: ranks per DiLoCo worker (data-parallel inside, G must divide K); not with quantize_bits.
        lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: the inner learning-rate schedule,
            as in ``Strategy``.
    """

    name = "streaming_diloco"

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        outer_optim_spec: OptimSpec | str | type | None = None,
        H: int = 100,
        num_fragments: int = 2,
        delay_steps: int = 1,
        quantize_bits: int | None = None,
        merge_alpha: float = 0.5,
        replica_size: int = 1,
    ) -> None:
        super().__init__(optim_spec)
        self.outer_optim_spec = outer_spec(outer_optim_spec)
        check_schedule(H, num_fragments, delay_steps)
        if quantize_bits is not None and (isinstance(quantize_bits, bool) or quantize_bits not in BITS):
            raise ValueError(f"quantize_bits must be None, 4 or 8, got {quantize_bits!r}")
        check_range("merge_alpha", merge_alpha, low=0, high=1)
        self.H = H
        self.num_fragments = num_fragments
        self.delay_steps = delay_steps
        self.quantize_bits = quantize_bits
        self.merge_alpha = merge_alpha
        self.replica_size = check_replica_size(replica_size)
        if replica_size > 1 and quantize_bits is not None:
            raise ValueError("replica_size: the quantized transfer runs over all nodes; use quantize_bits=None "
                             "with replica groups")

    def check_world(self, num_nodes: int) -> None:
        check_replica_world(self.replica_size, num_nodes)

    def setup(self, model: torch.nn.Module, comm: "Communicator", ctx: NodeContext) -> None:
        """Cut the model into fragments; keep θ_global (fp32) and an outer optimizer per fragment."""
        super().setup(model, comm, ctx)
        self.fragments, self.global_params = cut_fragments(self.params, self.num_fragments)
        self.outer_optimizers = [self.outer_optim_spec.build([g]) for g in self.global_params]
        self.offsets = fragment_offsets(self.H, self.num_fragments)
        self._in_flight: list[_Round] = []
        self._wire_dtype = self.params[0].dtype if self.params else torch.float32
        self._replicas = ReplicaGroups.for_node(self.rank, self.num_nodes, self.replica_size, comm)

    def step(self) -> None:
        if self._replicas is not None:
            self._replicas.average_gradients(self.comm, self.params)
        self.optimizer_step()
        t = self.local_step + 1  # this step's number
        with torch.no_grad():
            self._advance(t)
            for f, offset in enumerate(self.offsets):
                if t >= offset and (t - offset) % self.H == 0:
                    self._start(f, t)
            self._advance(t)

    def finish(self) -> None:
        with torch.no_grad():
            while self._in_flight:
                self._complete(self._in_flight[0])

    def _start(self, f: int, t: int) -> None:
        delta = self.global_params[f] - flatten(self.fragments[f]).float()
        self._launch(_Round(f, t, t + self.delay_steps, delta, None))

    def _launch(self, r: _Round) -> None:
        """Issue the round's reduction (on a copy: ``r.delta`` stays this node's own Δ, a single node's mean)."""
        if self.num_nodes == 1:
            r.pending = None
        elif self.quantize_bits is not None:
            r.pending = QuantizedAllReduce(self.comm, r.delta, self.quantize_bits)
        elif self._replicas is not None:
            r.pending = self._replicas.start_mean(self.comm, r.delta.to(self._wire_dtype), async_op=True)
        else:
            r.pending = self.comm.all_reduce(r.delta.to(self._wire_dtype, copy=True), op="avg", async_op=True)
        self._in_flight.append(r)

    def _advance(self, t: int) -> None:
        """Complete the rounds due by step t; move quantized rounds started earlier to their second phase."""
        for r in list(self._in_flight):
            if t >= r.due:
                self._complete(r)
            elif t > r.start and isinstance(r.pending, QuantizedAllReduce):
                r.pending.reduce()

    def _complete(self, r: _Round) -> None:
        mean = r.delta if r.pending is None else r.pending.wait().float()
        theta = self.global_params[r.fragment]
        theta.grad = mean
        self.outer_optimizers[r.fragment].step()
        theta.grad = None
        params = self.fragments[r.fragment]
        unflatten_into(torch.lerp(theta, flatten(params).float(), self.merge_alpha), params)
        self._in_flight.remove(r)

    def state_dict(self) -> dict[str, Any]:
        """Also each in-flight round: its Δ and its reduction, whose transfer ends now (``Handle.state_dict``)."""
        rounds = [{"fragment": r.fragment, "start": r.start, "due": r.due, "delta": r.delta.clone(),
                   "pending": None if r.pending is None else r.pending.state_dict()} for r in self._in_flight]
        return {**super().state_dict(), "global_params": [g.detach().clone() for g in self.global_params],
                "outer_optimizers": [o.state_dict() for o in self.outer_optimizers], "in_flight": rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            for g, saved in zip(self.global_params, state["global_params"]):
                g.copy_(saved)
        for o, saved in zip(self.outer_optimizers, state["outer_optimizers"]):
            o.load_state_dict(saved)
        device = self.global_params[0].device
        self._in_flight = [_Round(r["fragment"], r["start"], r["due"], r["delta"].to(device),
                                  self._restore_pending(r["pending"])) for r in state["in_flight"]]

    def _restore_pending(self, state: dict[str, Any] | None) -> "Handle | QuantizedAllReduce | ShardedMean | None":
        """A reduction kept by ``state_dict``, of the kind ``_launch`` issues."""
        if state is None:
            return None
        if self.quantize_bits is not None:
            return QuantizedAllReduce.restore(self.comm, state)
        if self._replicas is not None:
            return ShardedMean.restore(self._replicas, self.comm, state)
        return self.comm.restore_handle(state)
