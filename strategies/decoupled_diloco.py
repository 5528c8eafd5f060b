"""Decoupled DiLoCo (Google DeepMind, arXiv 2604.21428): workers (the paper's "learners") that never wait.

M workers, each a data-parallel group of G ranks (``replica_size``), train on their own and
stream parameter fragments to a syncer, a parameter server (the rank after the K trainers). The
syncer merges a fragment once a minimum quorum of workers has sent it, so a slow or failed
worker stalls nobody. Built from Streaming DiLoCo's fragments and schedule
(exonet.strategies.streaming_diloco) and the server of asynchronous DiLoCo
(exonet.strategies.server): the syncer acts in simulated arrival order (``comm.recv_any``).

Exact rules (t counts a worker's inner steps):

* Fragments and schedule: Streaming DiLoCo's. F fragments (``num_fragments``) of whole tensors; fragment f starts a
  sync after inner step t when ``t >= o_f = (f+1)·H // F`` and ``(t − o_f) % H == 0``; its merged
  value is taken τ steps later.
* Worker, at a start: Δ_f = θ_global,f − θ_local,f (fp32, sent in the parameters' dtype, by the
  worker's first rank). At completion: receive θ_global,f from the syncer (shared inside the
  worker by a broadcast), ``θ_local,f ← (1 − α)·θ_global,f + α·θ_local,f``.
* Syncer, per fragment: the r-th sync of a worker belongs to round r of the fragment. Round r
  merges once it holds Q = ``quorum`` contributions of its own (or every worker that can still send
  one), after a grace window of γ·τ·(the worker's step time, measured from its arrivals): the
  arrivals inside it join (with γ = 0, those of the same instant). The first arrival after it, or a
  worker asking for the merged fragment, closes it: with Q < M each worker sends a 1-element pull
  a step before it needs the fragment, so the window never holds a worker up.
* Merge: the outer optimizer's step on the weighted mean Σ w_i·Δ_i / Σ w_i, w_i = n_i / √(1 + s_i):
  n_i the tokens (inner steps × G) worker i trained since its previous sync of that fragment, s_i
  the merges of the fragment since the θ_f it trained from (0 on time; FedBuff's staleness factor).
* Late: a contribution to a round already merged is stale. It is not dropped: it joins the
  fragment's next merge, and its worker gets the latest θ_global,f back at once (so a worker back
  from an outage takes the latest fragments and goes on). One that arrives after its fragment's
  last merge of the run is not applied: a last outer step (momentum included) on stale work alone
  moves the final model away from what the workers trained. With a worker at half speed and one
  down for a sixth of a digits run, the loss was 0.113 with stale work at full weight, 0.104 with
  the staleness factor, 0.098 with it dropped, 0.099 for Streaming DiLoCo on healthy hardware.
* Leaving: a worker stopped before ``max_steps`` (a ``max_sim_time_s`` budget) sends one message of
  the size the syncer expects next, holding NaN, so the quorum no longer counts on it; the syncer
  answers it once it has sent the worker's last fragment (1 element), and the worker then ends.

With Q = M, γ = 0, equal speeds and no failures every round merges all M contributions with equal
weights: the run equals Streaming DiLoCo with the same outer optimizer, and each trainer sends the
same bytes (Δ_f once per sync; the syncer's replies are its own payload).

Defaults: F = 24 fragments and τ = 2, the paper's setting; quorum 1; γ = 0.5;
α = 0.5 and the outer optimizer (SGD lr 0.7, momentum 0.9, Nesterov) as Streaming DiLoCo.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

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
from exonet.strategies.replica import ReplicaGroups, check_replica_size, check_replica_world
from exonet.strategies.streaming_diloco import check_schedule, cut_fragments, fragment_offsets

if TYPE_CHECKING:
    from exonet.communicator import Communicator, Handle


def worker_sends(offsets: Sequence[int], H: int, tau: int, pulls: bool,
                  max_steps: int) -> Iterator[tuple[str, int, int]]:
    """Every message a worker sends the syncer, in order: ("delta" | "pull", fragment, step), then ("done", -1, ·).

    The worker and the syncer both walk it: the syncer so knows the size of each worker's next
    message, and the step and tokens a Δ stands for, without a header on the wire.
    """
    def starting(s: int) -> list[int]:
        return [f for f, o in enumerate(offsets) if s >= o and (s - o) % H == 0]

    for s in range(1, max_steps + 1):
        for f in starting(s):
            yield "delta", f, s
        if pulls and tau == 0:
            for f in starting(s):
                yield "pull", f, s
        if pulls and tau >= 1 and s + 1 - tau >= 1:
            for f in starting(s + 1 - tau):
                yield "pull", f, s
    if pulls and tau >= 1:  # finish(): the rounds still in flight, in start order
        for s in range(max(1, max_steps + 2 - tau), max_steps + 1):
            for f in starting(s):
                yield "pull", f, max_steps
    yield "done", -1, max_steps


def pulls(quorum: int, workers: int) -> bool:
    """Whether workers ask for each merged fragment: when a round may merge before every worker is in, the
    syncer holds it in a window (of γ·slack, or of one instant with γ = 0) that a worker's need must end."""
    return quorum < workers


@dataclass
class Merge:
    """One merge of a fragment, for the record (``Syncer.merges``): who counted, with what weight."""

    fragment: int
    round: int
    time: float
    weights: dict[int, float]  # worker -> its share of the mean (summed over its contributions)
    stale: tuple[int, ...]  # workers whose contribution came from an earlier round


@dataclass
class _Owed:
    """A reply the syncer owes a worker: the fragment, once merged (ready) and, with pulls, asked for."""

    fragment: int
    ready: bool
    pulled: bool


@dataclass
class _Fragment:
    """The syncer's state of one fragment: its round, the contributions it holds, its grace window."""

    version: int = 0  # the round the next merge closes
    ontime: dict[int, tuple[torch.Tensor, float]] = field(default_factory=dict)  # worker -> (Δ, weight)
    stale: list[tuple[int, torch.Tensor, float]] = field(default_factory=list)
    deadline: float | None = None  # the grace window's end, once the quorum is reached


class Syncer:
    """The syncer's decisions, apart from the network: fed arrivals in simulated time, it says what to send whom.

    Args:
        global_params: θ_global of each fragment (fp32), stepped in place.
        outer_optim_spec: the outer optimizer (one per fragment).
        workers: M.
        quorum: K, contributions a round needs before it may merge.
        grace_fraction: γ, the share of the slack (τ of the worker's steps) the syncer waits past the quorum.
        delay_steps: τ.

    With quorum < workers, replies wait for the worker's pull (``pulls``).

    Each of ``arrive``, ``pull`` and ``leave`` returns the replies to send now, in
    order: (worker, fragment); the reply carries θ_global of that fragment as it is then.
    """

    def __init__(self, global_params: list[torch.Tensor], outer_optim_spec: OptimSpec, workers: int, quorum: int,
                 grace_fraction: float, delay_steps: int) -> None:
        self.global_params = global_params
        self.outer_optimizers = [outer_optim_spec.build([g]) for g in global_params]
        self.workers, self.quorum, self.grace = workers, quorum, grace_fraction
        self.tau, self.pulls = delay_steps, pulls(quorum, workers)
        self.fragments = [_Fragment() for _ in global_params]
        self.owed: list[deque[_Owed]] = [deque() for _ in range(workers)]
        self.left: set[int] = set()
        self.last: dict[int, tuple[float, int]] = {}  # worker -> (time, step) of its latest Δ
        self.step_s: dict[int, float] = {}  # worker -> its step time, from its arrivals
        self.merges: list[Merge] = []
        self.base = [[0] * len(global_params) for _ in range(workers)]  # merges in the θ_f each worker holds

    def arrive(self, worker: int, fragment: int, round_: int, delta: torch.Tensor, tokens: float, step: int,
               time: float) -> list[tuple[int, int]]:
        """``worker``'s Δ of its ``round_``-th sync of ``fragment``, trained over ``tokens``, sent after ``step``."""
        self._expire(time)
        if worker in self.last and step > self.last[worker][1]:
            t0, s0 = self.last[worker]
            self.step_s[worker] = (time - t0) / (step - s0)
        self.last[worker] = (time, step)
        frag = self.fragments[fragment]
        weight = tokens / math.sqrt(1 + frag.version - self.base[worker][fragment])
        if round_ < frag.version:  # stale: weighted into the next merge; the worker takes the latest fragment now
            frag.stale.append((worker, delta, weight))
            self.owed[worker].append(_Owed(fragment, True, not self.pulls))
        elif round_ == frag.version:
            frag.ontime[worker] = (delta, weight)
            self.owed[worker].append(_Owed(fragment, False, not self.pulls))
            self._consider(fragment, time, worker)
        else:
            raise RuntimeError(f"syncer: worker {worker} sent round {round_} of fragment {fragment} before round "
                               f"{frag.version} was merged")
        return self._flush(time)

    def pull(self, worker: int, fragment: int, time: float) -> list[tuple[int, int]]:
        """``worker`` asks for its next reply of ``fragment``: a round still in its grace window merges now."""
        self._expire(time)
        owed = next(o for o in self.owed[worker] if o.fragment == fragment and not o.pulled)
        owed.pulled = True
        return self._flush(time)

    def leave(self, worker: int, time: float) -> list[tuple[int, int]]:
        """``worker`` sends no more: rounds stop counting on it, and its owed replies need no pull."""
        self._expire(time)
        self.left.add(worker)
        for owed in self.owed[worker]:
            owed.pulled = True
        for f in range(len(self.fragments)):
            self._consider(f, time, None)
        return self._flush(time)

    def _consider(self, f: int, time: float, by: int | None) -> None:
        """Merge fragment f now, open its grace window, or keep waiting for its quorum."""
        frag = self.fragments[f]
        have = len(frag.ontime)
        possible = have + sum(1 for m in range(self.workers) if m not in self.left and m not in frag.ontime)
        if have == 0 or have < min(self.quorum, possible):
            return
        if have == possible:
            self._merge(f, time)
        elif frag.deadline is None:  # γ = 0 still takes the arrivals of this same instant
            frag.deadline = time + self.grace * self.tau * (0.0 if by is None else self.step_s.get(by, 0.0))

    def _expire(self, time: float) -> None:
        """Close the grace windows that ended before ``time``."""
        for f, frag in enumerate(self.fragments):
            if frag.deadline is not None and frag.deadline < time:
                self._merge(f, frag.deadline)

    def _merge(self, f: int, time: float) -> None:
        frag = self.fragments[f]
        parts = [(m, d, n, False) for m, (d, n) in frag.ontime.items()] + [(m, d, n, True) for m, d, n in frag.stale]
        total = sum(n for _, _, n, _ in parts)
        mean = torch.zeros_like(self.global_params[f])
        weights: dict[int, float] = {}
        for m, d, n, _ in parts:
            mean.add_(d.float(), alpha=n / total)
            weights[m] = weights.get(m, 0.0) + n / total
        theta = self.global_params[f]
        theta.grad = mean
        self.outer_optimizers[f].step()
        theta.grad = None
        self.merges.append(Merge(f, frag.version, time, weights, tuple(m for m, _, _, stale in parts if stale)))
        for m in frag.ontime:
            owed = next(o for o in self.owed[m] if o.fragment == f and not o.ready)
            owed.ready = True
        frag.version += 1
        frag.ontime, frag.stale, frag.deadline = {}, [], None

    def _flush(self, time: float) -> list[tuple[int, int]]:
        """The replies now due, each worker's in the order it waits for them.

        A round in its grace window whose worker already waits for it (pulled, or left) merges now.
        """
        for f, frag in enumerate(self.fragments):
            if frag.deadline is not None and any(o.pulled for m in frag.ontime for o in self.owed[m]
                                                 if o.fragment == f and not o.ready):
                self._merge(f, time)
        out = []
        for m, queue in enumerate(self.owed):
            while queue and queue[0].ready and queue[0].pulled:
                f = queue.popleft().fragment
                self.base[m][f] = self.fragments[f].version  # the θ_f it trains from next
                out.append((m, f))
        return out


@dataclass
class _Round:
    """A worker's sync of one fragment in flight."""

    fragment: int
    due: int
    sent: "Handle | None"
    pull: "Handle | None" = None
    pulled: bool = False


class DecoupledDiLoCoStrategy(Strategy):
    """Streaming DiLoCo's fragments merged by a syncer with a quorum, a grace window and token weights.

    Args:
        optim_spec: the workers' inner optimizer. Default AdamW lr 1e-3.
        outer_optim_spec: the syncer's outer optimizer, one per fragment. Default SGD(lr=0.7, momentum=0.9,
            nesterov=True).
        H: inner steps between two syncs of the same fragment, >= num_fragments.
        num_fragments: P, at most H and at most the model's parameter tensors (checked at setup).
        delay_steps: τ, inner steps between sending a fragment and taking its merged value, 0 <= τ <= H.
        quorum: K, workers' contributions a merge needs (at most the number of workers M).
        grace_fraction: γ in [0, 1): the share of the slack the syncer waits past the quorum for more workers.
        merge_alpha: α in [0, 1]: θ_local ← (1 − α)·θ_global + α·θ_local after a merge.
        replica_size: G, ranks per worker (data-parallel inside it; G must divide the trainers).
        max_norm, lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio: as ``Strategy``.
    """

    name = "decoupled_diloco"
    servers = 1

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        outer_optim_spec: OptimSpec | str | type | None = None,
        H: int = 100,
        num_fragments: int = 24,
        delay_steps: int = 2,
        quorum: int = 1,
        grace_fraction: float = 0.5,
        merge_alpha: float = 0.5,
        replica_size: int = 1,
    ) -> None:
        super().__init__(optim_spec)
        self.outer_optim_spec = outer_spec(outer_optim_spec)
        check_schedule(H, num_fragments, delay_steps)
        check_int("quorum", quorum, low=1)
        check_range("grace_fraction", grace_fraction, low=0, high=1)
        if grace_fraction == 1:
            raise ValueError("grace_fraction must be < 1 (a share of the slack before the fragment is due), got 1")
        check_range("merge_alpha", merge_alpha, low=0, high=1)
        self.H, self.num_fragments, self.delay_steps = H, num_fragments, delay_steps
        self.quorum, self.grace_fraction, self.merge_alpha = quorum, grace_fraction, merge_alpha
        self.replica_size = check_replica_size(replica_size)

    def check_world(self, num_nodes: int) -> None:
        check_replica_world(self.replica_size, num_nodes)
        workers = num_nodes // self.replica_size
        if self.quorum > workers:
            raise ValueError(f"quorum={self.quorum} exceeds the {workers} workers (num_nodes={num_nodes} / "
                             f"replica_size={self.replica_size}); a merge could never happen")

    def setup(self, model: torch.nn.Module, comm: "Communicator", ctx: NodeContext) -> None:
        """Cut the model into fragments; a worker keeps its copy of θ_global, the syncer the outer optimizers."""
        super().setup(model, comm, ctx)
        self.check_world(ctx.num_nodes)
        self.fragments, self.global_params = cut_fragments(self.params, self.num_fragments)
        self.offsets = fragment_offsets(self.H, self.num_fragments)
        self.server = ctx.num_nodes
        self.workers = ctx.num_nodes // self.replica_size
        self.pulls = pulls(self.quorum, self.workers)
        self._wire_dtype = self.params[0].dtype if self.params else torch.float32
        G = self.replica_size
        if G > 1:  # every rank, the syncer too, creates the workers' groups alike
            comm.declare_groups([tuple(range(w * G, (w + 1) * G)) for w in range(self.workers)])
        if self.rank == self.server:
            return
        self._replicas = ReplicaGroups(self.rank, ctx.num_nodes, G) if G > 1 else None
        self.leader = self.rank % G == 0
        self._sends = worker_sends(self.offsets, self.H, self.delay_steps, self.pulls, ctx.max_steps)
        self._next = next(self._sends)
        self._in_flight: list[_Round] = []

    # ---------------------------------------------------------------- worker
    def step(self) -> None:
        if self._replicas is not None:
            self._replicas.average_gradients(self.comm, self.params)
        self.optimizer_step()
        t = self.local_step + 1  # this step's number
        with torch.no_grad():
            self._complete_due(t)
            while self._next[0] == "delta" and self._next[2] == t:
                self._start(self._next[1], t)
            self._complete_due(t)
            for r in self._in_flight:
                if self.pulls and r.due == t + 1 and not r.pulled:
                    self._pull(r)

    def finish(self) -> None:
        """Take every fragment still in flight; a worker stopped early first tells the syncer it leaves."""
        leave = None
        with torch.no_grad():
            if self.local_step < self.ctx.max_steps and self._next[0] != "done":
                if self.leader:  # async, as every send here: the clock must see this node's receives next
                    size = 1 if self._next[0] == "pull" else self.global_params[self._next[1]].numel()
                    leave = self.comm.send(torch.full((size,), math.nan, dtype=self._wire_dtype), self.server,
                                           async_op=True)
                for r in self._in_flight:
                    r.pulled = True
            while self._in_flight:
                self._complete(self._in_flight[0])
        if leave is not None:  # the syncer's word that it took the leave: only then may the send be waited on
            self.comm.recv(torch.empty(1, dtype=self._wire_dtype, device=self.global_params[0].device), self.server)
            leave.wait()

    def _advance(self, kind: str, fragment: int) -> None:
        """Walk ``worker_sends`` with each message, as the syncer does (a mismatch is a bug, said at once)."""
        if self._next[:2] != (kind, fragment):
            raise RuntimeError(f"decoupled_diloco: rank {self.rank} sends {kind} {fragment}, the syncer expects "
                               f"{self._next}")
        self._next = next(self._sends)

    def _start(self, f: int, t: int) -> None:
        self._advance("delta", f)
        delta = self.global_params[f] - flatten(self.fragments[f]).float()
        sent = self.comm.send(delta.to(self._wire_dtype), self.server, async_op=True) if self.leader else None
        self._in_flight.append(_Round(f, t + self.delay_steps, sent))

    def _pull(self, r: _Round) -> None:
        self._advance("pull", r.fragment)
        if self.leader:
            r.pull = self.comm.send(torch.zeros(1, dtype=self._wire_dtype), self.server, async_op=True)
        r.pulled = True

    def _complete_due(self, t: int) -> None:
        for r in [r for r in self._in_flight if r.due == t]:
            self._complete(r)

    def _complete(self, r: _Round) -> None:
        if self.pulls and not r.pulled:
            self._pull(r)
        theta = self.global_params[r.fragment]
        merged = torch.empty(theta.numel(), dtype=self._wire_dtype, device=theta.device)
        if self.leader:
            self.comm.recv(merged, self.server)
            for handle in (r.sent, r.pull):
                if handle is not None:
                    handle.wait()
        if self._replicas is not None:
            self.comm.broadcast(merged, self._replicas.inner[0], group=self._replicas.inner)
        theta.copy_(merged)
        params = self.fragments[r.fragment]
        unflatten_into(torch.lerp(theta, flatten(params).float(), self.merge_alpha), params)
        self._in_flight.remove(r)

    # ----------------------------------------------------------------- syncer
    def serve(self, updated: Callable[[int, float], None]) -> None:
        """The syncer's life: take each worker's messages in simulated arrival order until none can come."""
        G = self.replica_size
        syncer = Syncer(self.global_params, self.outer_optim_spec, self.workers, self.quorum, self.grace_fraction,
                        self.delay_steps)
        expected = [worker_sends(self.offsets, self.H, self.delay_steps, self.pulls, self.ctx.max_steps)
                    for _ in range(self.workers)]
        heads = [next(e) for e in expected]
        rounds = [[0] * self.num_fragments for _ in range(self.workers)]
        synced = [[0] * self.num_fragments for _ in range(self.workers)]  # the step of each worker's last sync
        device = self.global_params[0].device
        buffers: dict[str | int, torch.Tensor] = {"pull": torch.empty(1, dtype=self._wire_dtype, device=device)}
        merges = 0

        def buffer(sender: int) -> torch.Tensor:
            kind, f, _ = heads[sender // G]
            if kind == "pull":
                return buffers["pull"]
            buffers[f] = torch.empty(self.global_params[f].numel(), dtype=self._wire_dtype, device=device)
            return buffers[f]

        sent: list[Handle] = []
        leaving: set[int] = set()  # workers that left and are owed the acknowledgement

        def reply(out: list[tuple[int, int]]) -> None:
            # async: a worker may be steps away from its receive, and the clock must see the syncer's next
            # receive (recv_any) meanwhile, or the replay would wait at the send while the worker waits on it
            for m, f in out:
                sent.append(self.comm.send(self.global_params[f].to(self._wire_dtype, copy=True), m * G,
                                           async_op=True))

        def served(time: float) -> None:
            """The syncer's model is θ_global: copy the fragments merged since, and count each merge an update."""
            nonlocal merges
            with torch.no_grad():
                for f in {merge.fragment for merge in syncer.merges[merges:]}:
                    unflatten_into(self.global_params[f], self.fragments[f])
            while merges < len(syncer.merges):
                merges += 1
                updated(merges, time)

        while (arrival := self.comm.recv_any(buffer)) is not None:
            sender, time = arrival
            m = sender // G
            kind, f, step = heads[m]
            got = buffers["pull" if kind == "pull" else f]
            with torch.no_grad():
                if not got.is_meta and math.isnan(float(got[0])):
                    out = syncer.leave(m, time)
                    heads[m] = ("done", -1, step)
                    leaving.add(m)
                elif kind == "pull":
                    out = syncer.pull(m, f, time)
                else:
                    tokens = (step - synced[m][f]) * G
                    synced[m][f] = step
                    out = syncer.arrive(m, f, rounds[m][f], got.float(), tokens, step, time)
                    rounds[m][f] += 1
                if heads[m][0] != "done":
                    heads[m] = next(expected[m])
                    if heads[m][0] == "done":
                        out += syncer.leave(m, time)
                served(time)
            reply(out)
            for m in [m for m in leaving if not syncer.owed[m]]:  # after its last reply: the leave is taken
                sent.append(self.comm.send(buffers["pull"].new_zeros(1), m * G, async_op=True))
                leaving.remove(m)
        for handle in sent:
            handle.wait()
        self.syncer = syncer
