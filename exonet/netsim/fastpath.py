"""Fast path: the duration of a collective that has the network to itself, without events.

When no other collective is in flight, a collective's phases see an otherwise idle
network, so each phase is an isolated fluid problem: its messages start together,
share links max-min fairly (or FIFO), and the phase ends when the last is delivered,
i.e. max over its messages of (finish time + α of its path). The finish times come
from running the same ``FluidNetwork`` the event engine uses, on its own, so the two
agree to rounding. Multi-region paths, heterogeneous NICs and TCP caps are all in
the flows; nothing is assumed uniform.

Phases are run once and recorded (``flows.Solo``), cached by the phase's messages, and
whole plans by (op, members, bytes), so a run that repeats one collective thousands of
times solves it once.

If something else starts while a fast collective is in flight (another collective,
an outage of a member), ``state_at`` looks up where the current phase stands at that
instant, so the engine can take the collective over message by message.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from exonet.netsim import tcp
from exonet.netsim.collectives import choose, phases
from exonet.netsim.flows import Batch, Solo
from exonet.netsim.topology import Phase, Topology

_CACHE_LIMIT = 4096
_PREFIX_LIMIT = 64  # plans whose per-phase running busy totals are kept (each phases × links floats)


@dataclass(slots=True, eq=False)
class Plan:
    """One collective as phases, with the bytes each rank puts on the wire.

    ``offsets`` (set by ``Planner.duration``) are the phase start times relative to
    the collective's start, followed by its total duration. ``load`` is the bytes it puts
    on each link (by link id); ``busy`` (set by ``Planner.busy``) each link's busy seconds
    when it runs alone, whole; ``windows`` (set by ``Planner.windows``) when each phase's
    bytes are on the wire.
    """

    phases: list[Phase]
    sent: tuple[tuple[int, float], ...]
    load: np.ndarray
    offsets: list[float] | None = None
    busy: np.ndarray | None = None
    windows: tuple[np.ndarray, np.ndarray] | None = None


def _sent_by_rank(steps: list[Phase]) -> dict[int, float]:
    """The bytes each rank sends in ``steps``, added message by message in order; a run of one phase object
    (a ring's) of whole bytes is added as whole repeats at once, which is exact below 2**53."""
    sent: dict[int, float] = {}
    i = 0
    while i < len(steps):
        phase, end = steps[i], i + 1
        while end < len(steps) and steps[end] is phase:
            end += 1
        per: dict[int, float] = {}
        for src, _, size, *_ in phase:
            per[src] = per.get(src, 0.0) + size
        whole = all(float(m[2]).is_integer() for m in phase) and all(
            sent.get(src, 0.0) + (end - i) * size < 2**53 for src, size in per.items())
        for _ in range(1 if whole else end - i):
            for src, _, size, *_ in phase:
                sent[src] = sent.get(src, 0.0) + size * (end - i if whole else 1)
        i = end
    return sent


class Planner:
    """Builds, caches and times collective plans for one topology.

    Args:
        topology: links and paths of the scenario.
        algorithms: op -> algorithm name.
        sharing: "max-min" or "fifo".
    """

    def __init__(self, topology: Topology, algorithms: dict[str, str], sharing: str) -> None:
        self._topo = topology
        self._builders = choose(algorithms)
        self._sharing = sharing
        self._plans: dict[tuple[str, tuple[int, ...], int, int], Plan] = {}
        self._solos: dict[Phase, tuple[Solo, float]] = {}  # each phase run alone, and its duration
        self._prefix: dict[int, tuple[Plan, np.ndarray]] = {}  # id(plan) -> (plan, busy before each phase)

    def plan(self, op: str, members: tuple[int, ...], nbytes: int, halved: int = 0) -> Plan:
        """The phases of ``op`` among ``members`` on ``nbytes`` (cached).

        ``halved`` > 0: the group's connections went cold (``tcp.halvings``; ``tcp.NEW`` for new ones), so
        each message also pays its pair's slow start.
        """
        key = (op, members, nbytes, halved)
        plan = self._plans.get(key)
        if plan is None:
            if op == "p2p":  # one message, members = (sender, receiver)
                steps: list[Phase] = [((members[0], members[1], float(nbytes)),)] if nbytes else []
            else:
                steps = phases(self._builders[op], members, nbytes, self._topo)
            if halved:
                topo, r = self._topo, self._topo.resolved
                alone: dict[int, tuple[np.ndarray, list[float]]] = {}  # a ring repeats one phase object
                for p in steps:
                    if id(p) not in alone:
                        alone[id(p)] = (topo.lone_rates(p), [topo.rtt(m[0], m[1]) for m in p])
                steps = tcp.cold_phases(steps, [alone[id(p)][0] for p in steps], [alone[id(p)][1] for p in steps],
                                        r.streams, halved, tcp.initial_window(r.mss))
            sent = _sent_by_rank(steps)
            if len(self._plans) >= _CACHE_LIMIT:
                self._plans.clear()
            load = sum((self._topo.load(phase) for phase in steps), np.zeros(len(self._topo.capacity)))
            plan = self._plans[key] = Plan(steps, tuple(sent.items()), load)
        return plan

    def duration(self, plan: Plan) -> float:
        """How long ``plan`` takes alone on the network."""
        if plan.offsets is None:
            offsets = [0.0]
            for phase in plan.phases:
                offsets.append(offsets[-1] + self._phase_time(phase))
            plan.offsets = offsets
        return plan.offsets[-1]

    def windows(self, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
        """When each phase of ``plan`` run alone has bytes on the wire: (starts, ends), seconds from its start.

        A phase transmits from its start until its last byte leaves; the rest of the phase is
        propagation (α), when its links carry nothing of it. Two collectives whose windows on
        shared links never overlap never share a link's rate, so each may be timed as if alone.
        """
        if plan.windows is None:
            self.duration(plan)
            assert plan.offsets is not None
            starts = np.array(plan.offsets[:-1])
            plan.windows = (starts, starts + np.array([self._solo(phase)[0].times[-1] for phase in plan.phases]))
        return plan.windows

    def busy(self, plan: Plan, tau: float = math.inf) -> np.ndarray:
        """Each link's busy seconds (a flow moving on it) in the first ``tau`` seconds of ``plan`` run alone.

        Phases are not pipelined, so a link's busy time is the sum of its phases'; the
        vector has one entry per link id, then the padding (always 0). The whole plan's is
        kept on the plan; partial sums come from per-phase running totals, kept for the few
        plans asked (a collective taken over or handed back mid-run).
        """
        if plan.busy is None:
            self.duration(plan)
            plan.busy = sum((self._solo(phase)[0].busy() for phase in plan.phases),
                            np.zeros(len(self._topo.capacity) + 1))
        offsets = plan.offsets
        assert offsets is not None
        if tau >= offsets[-1]:
            return plan.busy
        hit = self._prefix.get(id(plan))
        if hit is None or hit[0] is not plan:
            if len(self._prefix) >= _PREFIX_LIMIT:
                self._prefix.clear()
            rows = [np.zeros(len(self._topo.capacity) + 1), *(self._solo(phase)[0].busy() for phase in plan.phases)]
            hit = self._prefix[id(plan)] = (plan, np.cumsum(rows, axis=0))
        p = bisect_right(offsets, tau) - 1
        before = hit[1][p]
        return before if tau == offsets[p] else before + self._solo(plan.phases[p])[0].busy(tau - offsets[p])

    def _phase_time(self, phase: Phase) -> float:
        return self._solo(phase)[1]

    def _solo(self, phase: Phase) -> tuple[Solo, float]:
        """``phase`` run alone (recorded, so a take-over mid-phase is a look-up), and how long it takes."""
        hit = self._solos.get(phase)
        if hit is None:
            batch = self._topo.batch(phase, None)
            solo = Solo(self._topo.capacity, self._sharing, batch.shape, batch.size)
            t = max(at + latency for rows, at in solo.finishes() for latency, _ in batch.arrivals(rows))
            if len(self._solos) >= _CACHE_LIMIT:
                self._solos.clear()
            hit = self._solos[phase] = (solo, t)
        return hit

    def state_at(self, plan: Plan, tau: float,
                 tag: object) -> tuple[int, float, list[tuple[Batch, np.ndarray, float]], list[Batch]]:
        """Where a lone ``plan`` stands ``tau`` seconds after it started.

        Returns the current phase index, that phase's start (relative), the messages
        whose bytes have all left as (batch, rows, time they did, relative to the phase
        start), and the batches still in transit with their remaining bytes, owned by ``tag``.
        """
        offsets = plan.offsets
        assert offsets is not None, "state_at needs a timed plan"
        p = min(bisect_right(offsets, tau) - 1, len(plan.phases) - 1)
        done, rest = self._solo(plan.phases[p])[0].state(tau - offsets[p], tag)
        return p, offsets[p], done, rest
