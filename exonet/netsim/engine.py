"""Engine: replay per-rank events through a SimPy model, incrementally.

``Simulation`` consumes each rank's events as they are fed (``feed``), so a run can be
simulated while it is produced; ``simulate`` is the convenience wrapper for a whole
trace. How time passes:

* A rank runs its own events without waiting for the clock: compute spans only
  move its own cursor (their length depends on its speed, jitter and outages, all
  known in advance), so only collectives become SimPy events. This keeps a
  10,000-step, 64-node replay to a few events per step.
* The k-th collective a rank issues on a group matches the k-th of every other
  member on that group (group None = all ranks). It starts when the last member
  has issued it, and not before every member is up. Members normally pass the
  same ``nbytes``; if they differ, the largest is simulated. A sync collective blocks its
  rank until it ends; an async one lets the rank go on until a ``Wait`` on it.
* A collective that starts on an idle network (nothing else in flight) runs on the
  fast path: its end time comes from ``Planner.duration`` in one event. If another
  collective starts, or a member goes down, before it ends, the engine takes it
  over at that instant (``Planner.state_at``) and from then on runs every flow
  through the shared ``FluidNetwork``: one SimPy event per rate change, one per
  batch of deliveries.
* ``Step`` marks only record the time. A rank's step i ends at its cursor; step i of
  the run ends when its slowest rank ends it.

Incremental feeding is safe because a rank that is waiting for input (open, not
blocked, nothing queued) holds the clock back: no event at or after its cursor is
processed until it is fed or closed, so nothing it will do can land in the past.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Iterable, Sequence

import simpy

from exonet.errors import ScenarioError, TraceError
from exonet.netsim.compute import ComputeModel
from exonet.netsim.fastpath import Plan, Planner
from exonet.netsim.flows import SHARING, Flow, FluidNetwork
from exonet.netsim.result import COMM, COMPUTE, IDLE, NodeTimes, SimResult, Timeline
from exonet.netsim.topology import Topology
from exonet.scenario import Resolved
from exonet.trace import Collective, Compute, Event, Step, Trace, Wait


class _Rank:
    """One rank's replay state: its queue of events, cursor, accounting and timeline."""

    __slots__ = (
        "async_ops",
        "block_t",
        "blocked",
        "comm",
        "compute",
        "counts",
        "gate",
        "idle",
        "kinds",
        "open",
        "queue",
        "rank",
        "step",
        "t",
        "times",
    )

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.queue: deque[Event] = deque()
        self.t = 0.0
        self.step = 0
        self.blocked: _Collective | None = None
        self.block_t = 0.0
        self.open = True
        self.gate = False  # an outage by step begins at this step and its length is not yet known
        self.compute = self.comm = self.idle = 0.0
        self.times = array("d")
        self.kinds = bytearray()
        self.counts: dict[tuple[int, ...] | None, int] = {}
        self.async_ops: dict[int, _Collective] = {}


class _Collective:
    """One collective instance: its members' arrivals, then its progress on the network."""

    __slots__ = (
        "done",
        "end",
        "key",
        "last",
        "members",
        "nbytes",
        "op",
        "pending",
        "phase",
        "plan",
        "ranks",
        "start",
        "token",
        "waiters",
    )

    def __init__(self, key: tuple, op: str, members: tuple[int, ...]) -> None:
        self.key = key
        self.op = op
        self.members = members
        self.nbytes = 0
        self.ranks: list[int] = []  # who has issued it, in order
        self.last = 0.0  # the latest arrival
        self.waiters: list[_Rank] = []
        self.start = self.end = 0.0
        self.done = False
        self.plan: Plan | None = None
        self.phase = 0
        self.pending = 0  # messages of the current phase not yet delivered
        self.token = 0  # invalidates a fast-path end event when the engine takes over


class Simulation:
    """An incremental replay of per-rank events in one scenario.

    Args:
        resolved: the scenario made concrete for the run's node count.
        fast_path: time lone collectives analytically (exact; off only to cross-check).
        name: the scenario's name, for the result.

    Feed events with ``feed``/``feed_trace``, advance with ``run_until_blocked``, and
    collect the outcome with ``result`` (which closes the input and runs to the end).
    """

    def __init__(self, resolved: Resolved, *, fast_path: bool = True, name: str = "") -> None:
        if resolved.sharing not in SHARING:
            raise ScenarioError(f"scenario: network.sharing must be one of {', '.join(SHARING)}, got {resolved.sharing!r}")
        n = resolved.num_nodes
        self.resolved = resolved
        self.name = name
        self.env = simpy.Environment()
        self._topo = Topology(resolved)
        self._cm = ComputeModel(resolved)
        self._planner = Planner(self._topo, resolved.algorithms, resolved.sharing)
        self._net = FluidNetwork(self._topo.capacity, resolved.sharing)
        self._net_token = 0
        self._fast = fast_path
        self._ranks = [_Rank(r) for r in range(n)]
        self._everyone = tuple(range(n))
        self._open: dict[tuple, _Collective] = {}  # issued by some members, not yet by all
        self._active: dict[_Collective, None] = {}  # in flight on the event path
        self._lone: _Collective | None = None  # in flight on the fast path
        self._step_ends: list[float] = []
        self._wire = [0.0] * n
        self._last_end = 0.0
        self._events = 0
        self._horizon = math.inf  # the earliest cursor of a rank waiting for input
        self._gates = any(self._cm.gated_steps)
        for r, outages in enumerate(self._cm.down):
            for t0, t1 in outages:
                self._schedule_outage(r, t0, t1)
            self._ranks[r].gate = 0 in self._cm.gated_steps[r]

    # ----------------------------------------------------------------- input
    def feed(self, rank: int, event: Event) -> None:
        """Append one event to ``rank``'s input (processed by ``run_until_blocked``)."""
        rk = self._ranks[rank]
        if not rk.open:
            raise ValueError(f"Simulation.feed: rank {rank}'s input was closed")
        rk.queue.append(event)

    def feed_trace(self, trace: Trace) -> None:
        """Feed every event of a whole trace."""
        if trace.num_nodes != len(self._ranks):
            raise ScenarioError(
                f"simulate: the trace has {trace.num_nodes} nodes but the scenario was resolved for {len(self._ranks)}"
            )
        for rk, events in zip(self._ranks, trace.events):
            rk.queue.extend(events)

    def close(self, rank: int | None = None) -> None:
        """Declare that ``rank`` (default: every rank) will be fed nothing more."""
        for rk in self._ranks if rank is None else [self._ranks[rank]]:
            rk.open = False

    @property
    def now(self) -> float:
        """Simulated time up to which the network has been replayed."""
        return self.env.now

    def rank_time(self, rank: int) -> float:
        """Simulated time ``rank`` has reached in its own events."""
        return self._ranks[rank].t

    def run_until_blocked(self) -> float:
        """Replay as far as the input allows; returns the simulated time reached."""
        self._horizon = math.inf
        for rk in self._ranks:
            self._advance(rk)
        env = self.env
        while env.peek() < self._horizon:
            env.step()
        return env.now

    def result(self, history: Sequence[float] | None = None) -> SimResult:
        """Close the input, replay to the end and return the outcome.

        Args:
            history: per-step mean training losses, one per step, for ``loss_vs_time``.
        """
        self.close()
        self.run_until_blocked()
        if self._open:
            c = next(iter(self._open.values()))
            group, k = c.key
            missing = [r for r in c.members if r not in c.ranks]
            raise TraceError(
                f"trace: collective #{k} ({c.op}) on group {list(group) if group else 'all ranks'} was issued by "
                f"ranks {c.ranks} but never by ranks {missing}; collectives must match across the group's members"
            )
        ends = self._step_ends
        if history is not None and len(history) != len(ends):
            raise ValueError(f"simulate: history has {len(history)} losses but the trace has {len(ends)} steps")
        wall = max(self._last_end, *(rk.t for rk in self._ranks))
        nodes = [NodeTimes(rk.rank, rk.compute, rk.comm, rk.idle + (wall - rk.t), rk.step) for rk in self._ranks]
        total = sum(node.compute_s for node in nodes)
        return SimResult(
            wall_clock_s=wall,
            per_node=nodes,
            step_end_times=list(ends),
            wire_bytes=[round(b) for b in self._wire],
            utilization=total / (len(nodes) * wall) if wall > 0 else 0.0,
            scenario_name=self.name,
            num_steps=len(ends),
            events=self._events,
            history=None if history is None else [float(x) for x in history],
            timelines=[Timeline(rk.times, bytes(rk.kinds), rk.t) for rk in self._ranks],
        )

    # ----------------------------------------------------------------- ranks
    def _advance(self, rk: _Rank) -> None:
        """Run ``rk``'s queued events until it blocks or runs out of input."""
        q, cm, r = rk.queue, self._cm, rk.rank
        while rk.blocked is None and (q or rk.gate):
            if rk.gate and not self._open_gate(rk):
                break
            if not q:
                break
            e = q.popleft()
            kind = type(e)
            self._events += 1
            if kind is Compute:
                start = rk.t
                work = cm.work(r, rk.step, e)
                if cm.windowed[r]:
                    end, pieces = cm.run(r, rk.step, start, work)
                    for a, b, down in pieces:
                        self._spend(rk, a, b, IDLE if down else COMPUTE)
                else:
                    end = start + work
                    self._spend(rk, start, end, COMPUTE)
                rk.t = end
            elif kind is Collective:
                self._issue(rk, e)
            elif kind is Step:
                self._step(rk)
            elif kind is Wait:
                c = rk.async_ops.get(e.cid)
                if c is None:
                    raise TraceError(f"trace: rank {r} waits for collective id {e.cid}, which it never issued as async")
                self._block(rk, c)
            else:
                raise TraceError(f"trace: rank {r}: unknown event {e!r}")
        if rk.blocked is None and rk.open and rk.t < self._horizon:
            self._horizon = rk.t

    def _spend(self, rk: _Rank, a: float, b: float, kind: int) -> None:
        """Account [a, b) of ``rk``'s time to ``kind`` and add it to its timeline."""
        if b <= a:
            return
        if kind == COMPUTE:
            rk.compute += b - a
        elif kind == COMM:
            rk.comm += b - a
        else:
            rk.idle += b - a
        kinds, times = rk.kinds, rk.times
        if kinds and kinds[-1] == kind and times[-1] == a:
            times[-1] = b
        else:
            times.append(a)
            times.append(b)
            kinds.append(kind)

    def _step(self, rk: _Rank) -> None:
        i, ends = rk.step, self._step_ends
        if i < len(ends):
            ends[i] = max(ends[i], rk.t)
        else:
            ends.append(rk.t)
        rk.step = i + 1
        if self._gates and rk.step in self._cm.gated_steps[rk.rank]:
            rk.gate = True

    def _open_gate(self, rk: _Rank) -> bool:
        """Start the outages by step that begin at ``rk``'s current step, once their length is known."""
        lengths = self._cm.outages_at(rk.rank, rk.step, rk.queue, complete=not rk.open)
        if lengths is None:
            return False
        rk.gate = False
        for length in lengths:
            if length > 0:
                self._cm.add_down(rk.rank, rk.t, rk.t + length)
                self._schedule_outage(rk.rank, rk.t, rk.t + length)
        return True

    def _issue(self, rk: _Rank, e: Collective) -> None:
        """``rk`` arrives at a collective; the last member to arrive schedules its start."""
        group = e.group
        k = rk.counts.get(group, 0)
        rk.counts[group] = k + 1
        key = (group, k)
        c = self._open.get(key)
        if c is None:
            if group is not None and rk.rank not in group:
                raise TraceError(f"trace: rank {rk.rank} issued a collective on group {list(group)}, which it is not in")
            c = self._open[key] = _Collective(key, e.op, tuple(sorted(group)) if group is not None else self._everyone)
        elif c.op != e.op:
            raise TraceError(
                f"trace: collective #{k} on group {list(group) if group else 'all ranks'} is {c.op} on rank {c.ranks[0]} "
                f"but {e.op} on rank {rk.rank}"
            )
        c.ranks.append(rk.rank)
        c.nbytes = max(c.nbytes, e.nbytes)
        c.last = max(c.last, rk.t)
        if e.async_op:
            rk.async_ops[e.cid] = c
        else:
            self._block(rk, c)
        if len(c.ranks) == len(c.members):
            del self._open[key]
            self._at(c.last, self._start, c)

    def _block(self, rk: _Rank, c: _Collective) -> None:
        rk.blocked = c
        rk.block_t = rk.t
        if c.done:
            self._release(rk, c)
        else:
            c.waiters.append(rk)

    def _release(self, rk: _Rank, c: _Collective) -> None:
        """``rk`` was blocked on ``c``, which has ended: idle until it started, then exposed comm."""
        tb = rk.block_t
        end = max(c.end, tb)
        start = min(max(c.start, tb), end)
        self._spend(rk, tb, start, IDLE)
        if self._cm.down[rk.rank]:
            cursor = start
            for t0, t1 in sorted(self._cm.down[rk.rank]):
                lo, hi = max(t0, cursor), min(t1, end)
                if hi > lo:
                    self._spend(rk, cursor, lo, COMM)
                    self._spend(rk, lo, hi, IDLE)
                    cursor = hi
            self._spend(rk, cursor, end, COMM)
        else:
            self._spend(rk, start, end, COMM)
        rk.t = end
        rk.blocked = None

    # ------------------------------------------------------------ collectives
    def _at(self, t: float, fn, *args) -> None:
        """Call ``fn(t, *args)`` when the clock reaches ``t`` (which is passed exactly, not via env.now)."""
        ev = self.env.timeout(max(0.0, t - self.env.now))
        ev.callbacks.append(lambda _: fn(t, *args))

    def _start(self, t: float, c: _Collective) -> None:
        up = self._cm.up_time(c.members, t)
        if up > t:
            self._at(up, self._start, c)
            return
        c.start = t
        plan = c.plan = self._planner.plan(c.op, c.members, c.nbytes)
        wire = self._wire
        for r, sent in plan.sent:
            wire[r] += sent
        if not plan.phases:
            self._end(t, c)
        elif self._fast and self._lone is None and not self._active:
            self._lone = c
            self._at(t + self._planner.duration(plan), self._lone_end, c, c.token)
        else:
            if self._lone is not None:
                self._take_over(t, self._lone)
            self._active[c] = None
            self._begin_phase(t, c, 0)

    def _lone_end(self, t: float, c: _Collective, token: int) -> None:
        if c.token != token:
            return
        if self._lone is c:
            self._lone = None
        self._end(t, c)

    def _take_over(self, t: float, c: _Collective) -> None:
        """Move the fast-path collective ``c`` onto the event path at time ``t``, mid-phase if need be."""
        self._lone = None
        plan = c.plan
        assert plan is not None and plan.offsets is not None
        if c.start + plan.offsets[-1] <= t:
            return  # it ends now: its end event is due at this very time and it has no flows left
        c.token += 1
        p, p_start, done, rest = self._planner.state_at(plan, t - c.start, c)
        c.phase = p
        c.pending = len(plan.phases[p])
        base = c.start + p_start
        later: list[tuple[float, Flow]] = []
        for f, at in done:
            arrive = base + at + f.latency
            if arrive <= t:
                c.pending -= 1
            else:
                later.append((arrive, f))
        self._active[c] = None
        self._deliver_later(later)
        if rest:
            self._net.advance(t)
            for f in rest:
                self._net.add(f)
            self._net_changed(t)
        if c.pending == 0:
            self._phase_done(t, c)

    def _begin_phase(self, t: float, c: _Collective, p: int) -> None:
        assert c.plan is not None
        c.phase = p
        flows = self._topo.flows(c.plan.phases[p], c)
        c.pending = len(flows)
        net = self._net
        net.advance(t)
        for f in flows:
            net.add(f)
        self._net_changed(t)

    def _net_changed(self, t: float) -> None:
        """After flows were added, paused or drained to ``t``: deliver finished ones, reschedule the next."""
        done = self._net.update()
        if done:
            self._deliver_later((t + f.latency, f) for f in done)
        self._net_token += 1
        nxt = self._net.next_finish()
        if nxt < math.inf:
            self._at(nxt, self._flows_due, self._net_token)

    def _deliver_later(self, timed: Iterable[tuple[float, Flow]]) -> None:
        """Deliver each flow at its time, one event per distinct time."""
        by_time: dict[float, list[Flow]] = {}
        for at, f in timed:
            by_time.setdefault(at, []).append(f)
        for at, batch in by_time.items():
            self._at(at, self._deliver, batch)

    def _flows_due(self, t: float, token: int) -> None:
        if token == self._net_token:
            self._net.advance(t)
            self._net_changed(t)

    def _deliver(self, t: float, flows: list[Flow]) -> None:
        for f in flows:
            c = f.tag
            c.pending -= 1
            if c.pending == 0:
                self._phase_done(t, c)

    def _phase_done(self, t: float, c: _Collective) -> None:
        assert c.plan is not None
        if c.phase + 1 < len(c.plan.phases):
            self._begin_phase(t, c, c.phase + 1)
        else:
            del self._active[c]
            self._end(t, c)

    def _end(self, t: float, c: _Collective) -> None:
        c.end = t
        c.done = True
        self._last_end = max(self._last_end, t)
        waiters, c.waiters = c.waiters, []
        for rk in waiters:
            self._release(rk, c)
        for rk in waiters:
            self._advance(rk)

    # --------------------------------------------------------------- outages
    def _schedule_outage(self, rank: int, t0: float, t1: float) -> None:
        self._at(t0, self._outage, rank, True)
        self._at(t1, self._outage, rank, False)

    def _outage(self, t: float, rank: int, down: bool) -> None:
        """``rank`` goes down (its flows stop) or comes back."""
        lone = self._lone
        if down and lone is not None and rank in lone.members:
            self._take_over(t, lone)
        self._net.advance(t)
        self._net.pause(rank, down)
        self._net_changed(t)


def simulate(trace: Trace, scenario: object, *, history: Sequence[float] | None = None, fast_path: bool = True) -> SimResult:
    """Replay ``trace`` in ``scenario`` and return the simulated outcome.

    Args:
        trace: the run's per-node events.
        scenario: a ``Resolved`` scenario, or anything ``Scenario.coerce`` accepts
            (a Scenario, a preset name, a path to a TOML file, a dict).
        history: per-step mean training losses, for ``SimResult.loss_vs_time``.
        fast_path: time lone collectives analytically (exact; off only to cross-check).
    """
    if isinstance(scenario, Resolved):
        resolved, name = scenario, scenario.name
    else:
        from exonet.scenario import Scenario

        chosen = Scenario.coerce(scenario)
        resolved, name = chosen.resolve(trace.num_nodes), chosen.name
    sim = Simulation(resolved, fast_path=fast_path, name=name)
    sim.feed_trace(trace)
    return sim.result(history)
