"""Compute: how long a rank's compute span takes, given its speed, jitter and events.

A span's *work* is its base seconds, from the scenario's ``compute.mode``:
``"measured"`` the trace's thread-CPU seconds, ``"wall"`` its wall seconds, ``"flops"``
its FLOPs ÷ (tflops·1e12·mfu). Work is divided by the rank's ``speed`` and multiplied
by the rank's jitter factor for the current step (one draw per rank and step, from a
generator seeded with (seed, rank), so results never depend on replay order):

* ``lognormal``: exp(σz − σ²/2) (mean 1);
* ``normal``: max(0, 1 + σz);
* ``exponential``: 1 + σ·E, E ~ Exp(1) (a rank is only ever slower).

Events (``[[events]]``), each for some ranks:

* ``slow`` in steps [from_step, to_step): the rank's compute in those steps takes
  ``factor`` times longer. In seconds [from_s, to_s): compute progresses at 1/factor
  of its speed during the window (a span straddling an edge is slowed in part).
* ``down`` in seconds [from_s, to_s): the rank neither computes nor communicates;
  compute pauses and resumes after it, its flows stop, a collective that needs it
  does not start until it is back. Time down counts as idle.
* ``down`` in steps [from_step, to_step): the outage starts when the rank begins
  step ``from_step`` and lasts as long as the work of its steps from_step..to_step−1
  (speed, jitter and step slowdowns applied), as if the node dropped out for that
  many of its steps; afterwards it does those steps' work and communication as
  recorded, since the trace fixes who took part. (A node makes no progress while
  down, so no step can end an outage; its length has to come from the work it skips.)

Failures (``[failures]``, drawn per rank by exonet.netsim.failures) are outages like
``down`` in seconds, with one difference: a failure that strikes while the rank computes
throws away its compute since its last sync (the end of its latest blocking collective or
wait), and after the outage the rank redoes that work before going on. A failure strikes
whatever its length: one of ``repair`` 0 and ``restart`` 0 is a zero-length outage, which
pauses nothing but still throws the work away. A failure while the rank is blocked in a
collective only delays the collective (what it contributes is kept).

Outages are kept per rank in order (the failure process draws them disjoint and in time order;
``down`` events and gated steps are few), so the questions a replay asks of them (is a rank down
at t, what overlaps [a, b), when are all of a group up again) are bisections, not rescans of every
outage drawn so far; ``up_time`` merges the members' outages in start order, drawing as it goes.

Slowdowns affect compute only; links are the scenario's ``[network]``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from operator import attrgetter

import numpy as np

from exonet.errors import ScenarioError
from exonet.netsim.failures import MAX_FAILURES, FailureBudget, FailureProcess, all_up_wait
from exonet.scenario import EventSpec, Resolved
from exonet.trace import Compute, Step

_JITTER_BLOCK = 1024

# A window: (from_step, to_step, from_s, to_s, factor); factor inf means down.
_Window = tuple[float, float, float, float, float]
# What a piece of a compute span is: computing, down, or down after a failure that threw the work since sync away.
UP, DOWN, FAILED = range(3)


class ComputeModel:
    """Per-rank compute speed, jitter, slowdowns and outages of one scenario.

    Args:
        resolved: the scenario made concrete for the trace's node count.
    """

    def __init__(self, resolved: Resolved) -> None:
        n = resolved.num_nodes
        speed = resolved.speed or (1.0,) * n
        if len(speed) != n or not all(s > 0 and math.isfinite(s) for s in speed):
            raise ScenarioError(f"scenario: speed must list {n} positive finite factors, got {speed!r}")
        self.scale = [1.0 / s for s in speed]
        self._base = _base(resolved)
        self._jitter = _jitter(resolved)
        self._draws: list[list[float]] = [[] for _ in range(n)]
        self._rngs = [np.random.default_rng([resolved.seed, r]) for r in range(n)] if self._jitter else []
        self._step_slow: list[list[tuple[int, float, float]]] = [[] for _ in range(n)]
        self._timed: list[list[_Window]] = [[] for _ in range(n)]
        self.down: list[list[tuple[float, float]]] = [[] for _ in range(n)]  # every outage: events, failures
        self._event_down: list[list[tuple[float, float]]] = [[] for _ in range(n)]  # outages not failures: few
        self._gated: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.windowed = [False] * n
        for i, e in enumerate(resolved.events):
            self._add_event(i, e, n)
        spec = resolved.failures
        # a rank that never fails (a server, with failures.servers = false) has None
        self.failures = ([FailureProcess(spec, r) if spec.servers or r < n - resolved.servers else None
                          for r in range(n)] if spec is not None else None)
        self._failed = [0] * n  # failures of each rank recorded as outages so far
        self._recorded = 0  # their sum
        self._budget = FailureBudget(spec) if spec is not None else None
        self._fail_starts: list[set[float]] = [set() for _ in range(n)]
        self.windowed = [bool(w) or spec is not None for w in self._timed]
        self.gated_steps = [{lo for lo, _ in g} for g in self._gated]
        self.plain = not self._jitter and not any(self._step_slow)

    def _add_event(self, i: int, e: EventSpec, n: int) -> None:
        where = f"scenario: events[{i}]"
        if e.kind not in ("slow", "down"):
            raise ScenarioError(f"{where}.kind: expected 'slow' or 'down', got {e.kind!r}")
        bad = [r for r in e.ranks if not 0 <= r < n]
        if bad:
            raise ScenarioError(f"{where}.ranks: rank {bad[0]} is out of range for {n} nodes")
        by_step = e.from_step is not None or e.to_step is not None
        if by_step and (e.from_s is not None or e.to_s is not None):
            raise ScenarioError(f"{where}: give a window in steps (from_step/to_step) "
                                "or in seconds (from_s/to_s), not both")
        lo_step, hi_step = e.from_step or 0, math.inf if e.to_step is None else e.to_step
        lo_s, hi_s = e.from_s or 0.0, math.inf if e.to_s is None else e.to_s
        if hi_step <= lo_step or hi_s <= lo_s:
            raise ScenarioError(f"{where}: the window ends before it starts")
        if e.kind == "slow":
            if not e.factor > 0 or math.isinf(e.factor):
                raise ScenarioError(f"{where}.factor: must be a positive finite multiplier, got {e.factor!r}")
            for r in e.ranks:
                if by_step:
                    self._step_slow[r].append((lo_step, hi_step, e.factor))
                else:
                    self._timed[r].append((0, math.inf, lo_s, hi_s, e.factor))
            return
        if math.isinf(hi_step if by_step else hi_s):
            raise ScenarioError(f"{where}: a 'down' event needs an end (to_step or to_s), or the node never returns")
        for r in e.ranks:
            if by_step:
                self._gated[r].append((int(lo_step), int(hi_step)))
            else:
                self.add_down(r, lo_s, hi_s)

    # ------------------------------------------------------------------ work
    def work(self, rank: int, step: int, span: Compute) -> float:
        """Seconds of compute ``span`` needs at step ``step`` before timed windows."""
        w = self._base(span) * self.scale[rank]
        if self.plain:
            return w
        if self._jitter:
            draws = self._draws[rank]
            while step >= len(draws):
                draws.extend(self._jitter(self._rngs[rank]).tolist())
            w *= draws[step]
        for lo, hi, factor in self._step_slow[rank]:
            if lo <= step < hi:
                w *= factor
        return w

    def run(self, rank: int, step: int, start: float, work: float,
            since: float | None = 0.0) -> tuple[float, list[tuple[float, float, int]]]:
        """When ``work`` seconds of compute begun at ``start`` end, through slow and down windows and failures.

        ``since`` is the work the rank has done since its last sync, which a failure during
        the span throws away (the rank then redoes ``since`` + ``work`` from scratch); None: a
        failure only pauses the span (an elastic run, whose strategy discards the work itself).
        Returns the end time and the pieces ``(t0, t1, what)`` the span splits into, ``what``
        one of UP, DOWN, FAILED (the outage of a failure that struck in this span).
        """
        if self.failures is None or self.failures[rank] is None:
            return self._run(rank, step, start, work, since)
        assert self._budget is not None  # set with self.failures
        self._budget.compute(rank, since, work)
        horizon = start + work
        while True:
            self.failures_through(rank, horizon)
            end, pieces = self._run(rank, step, start, work, since)
            if end <= horizon:
                return end, pieces
            horizon = end

    def _run(self, rank: int, step: int, start: float, work: float,
             since: float | None) -> tuple[float, list[tuple[float, float, int]]]:
        live = [(t0, t1, f) for lo, hi, t0, t1, f in self._timed[rank] if lo <= step < hi and t1 > start]
        fails = self._failures_from(rank, start)
        if not live and (not fails or fails[0][0] >= start + work):  # (a failure at the end strikes the next span)
            return start + work, [(start, start + work, UP)]
        live += [(t0, t1, math.inf) for t0, t1 in fails]
        strikes = {t0 for t0, _ in fails} if since is not None else set()
        edges = sorted({x for t0, t1, _ in live for x in (t0, t1) if start < x < math.inf})
        pieces: list[tuple[float, float, int]] = []
        t, left = start, work
        for edge in [*edges, math.inf]:
            struck = t in strikes  # (a zero-length failure too: it contains no t, but it strikes)
            if struck:
                assert since is not None  # strikes are only kept when the work since sync is lost
                left = since + work  # the work since the last sync is lost: redo it all
            slow = _slowdown(live, t)
            if math.isinf(slow):
                pieces.append((t, edge, FAILED if struck else DOWN))
            else:
                if struck:
                    pieces.append((t, t, FAILED))
                if t + left * slow <= edge:
                    end = t + left * slow
                    pieces.append((t, end, UP))
                    return end, pieces
                left -= (edge - t) / slow
                pieces.append((t, edge, UP))
            t = edge
        raise AssertionError("unreachable: the last edge is infinite")

    # --------------------------------------------------------------- outages
    def add_down(self, rank: int, t0: float, t1: float) -> None:
        """Record an outage of ``rank`` over [t0, t1) (a ``down`` event or a gated step's, not a failure)."""
        self.down[rank].append((t0, t1))
        self._event_down[rank].append((t0, t1))
        self._timed[rank].append((0, math.inf, t0, t1, math.inf))
        self.windowed[rank] = True

    def process(self, rank: int) -> FailureProcess | None:
        """``rank``'s failure process; None if it never fails."""
        return None if self.failures is None else self.failures[rank]

    def failures_through(self, rank: int, t: float) -> list[tuple[float, float]]:
        """Record as outages ``rank``'s failures that start by ``t`` and the next one; return them all."""
        process = self.process(rank)
        if process is None:
            return []
        outages = process.through(t)
        if len(outages) > self._failed[rank]:
            new = outages[self._failed[rank]:]
            self.down[rank].extend(new)
            self._fail_starts[rank].update(t0 for t0, _ in new)
            self._failed[rank] = len(outages)
            self._recorded += len(new)
            assert self._budget is not None  # set with self.failures
            self._budget.drawn(self._recorded, t)
        return outages

    def _failures_from(self, rank: int, t: float) -> list[tuple[float, float]]:
        """``rank``'s failures recorded so far that end after ``t`` (or are zero-length at ``t``), in order."""
        process = self.process(rank)
        if process is None:
            return []
        drawn = self._failed[rank]
        return process.outages[process.first_ending(t, drawn):drawn]

    def outages_between(self, rank: int, a: float, b: float) -> list[tuple[float, float]]:
        """``rank``'s outages recorded so far that overlap (a, b): t0 < b and t1 > a (events first, then failures)."""
        out = [(t0, t1) for t0, t1 in self._event_down[rank] if t0 < b and t1 > a]
        for t0, t1 in self._failures_from(rank, a):
            if t0 >= b:
                break
            if t1 > a:
                out.append((t0, t1))
        return out

    def down_at(self, rank: int, t: float) -> bool:
        """Whether ``rank`` is down (failed, or a ``down`` event) at ``t`` seconds, drawing failures through ``t``."""
        self.failures_through(rank, t)
        return any(t0 <= t < t1 for t0, t1 in self._event_down[rank]) or any(
            t0 <= t < t1 for t0, t1 in self._failures_from(rank, t)[:1])

    def fail_starts(self, rank: int) -> set[float]:
        """When ``rank``'s failures drawn so far struck."""
        return self._fail_starts[rank]

    def outages_at(self, rank: int, step: int, upcoming: Iterable[object], complete: bool) -> list[float] | None:
        """Outages by step that begin as ``rank`` begins ``step``: their lengths, in seconds.

        ``upcoming`` is the rank's queued events. Returns None when they do not yet reach
        the end of an outage's steps and more may be fed (``complete`` False): its length
        is not known yet. When the input is complete, an outage past the end of the
        rank's events lasts for the work that remains.
        """
        due = [(lo, hi) for lo, hi in self._gated[rank] if lo == step]
        if not due:
            return []
        out = []
        for lo, hi in due:
            total, s, reached = 0.0, step, False
            for e in upcoming:
                if isinstance(e, Compute):
                    total += self.work(rank, s, e)
                elif isinstance(e, Step):
                    s += 1
                    if s == hi:
                        reached = True
                        break
            if not reached and not complete:
                return None
            out.append(total)
        return out

    def up_time(self, members: Iterable[int], t: float) -> float:
        """The earliest time >= ``t`` at which every one of ``members`` is up.

        The members' outages are merged in start order (failures drawn as the merge needs them): the first
        time no outage begun by then covers is the answer. A wait that could only end after more failures
        than the replay allows is refused at once, naming ``failures.repair`` (failures.all_up_wait).
        """
        members = list(members)
        heap = []
        for r in members:
            stream = self._outages_after(r, t)
            first = next(stream, None)
            if first is not None:
                heap.append((first, r, stream))
        heapq.heapify(heap)
        if self._budget is not None and any(t0 <= t < t1 for (t0, t1), _, _ in heap):  # a wait: can it end?
            all_up_wait(self._budget.spec, sum(self.process(r) is not None for r in members))
        reach, merged = t, 0
        while heap and heap[0][0][0] <= reach:
            (_, t1), r, stream = heap[0]
            reach = max(reach, t1)
            nxt = next(stream, None)
            if nxt is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (nxt, r, stream))
            merged += 1
            if merged > MAX_FAILURES:
                assert self._budget is not None  # only failures go on without end
                self._budget.drawn(self._recorded + merged, reach)
        for r in members:
            self.failures_through(r, reach)
        return reach

    def _outages_after(self, rank: int, t: float) -> Iterator[tuple[float, float]]:
        """``rank``'s outages that end after ``t``, in start order: its events, and its failures for ever."""
        events = sorted(w for w in self._event_down[rank] if w[1] > t)
        process = self.process(rank)
        if process is None:
            return iter(events)
        process.through(t)
        return heapq.merge(events, _drawn_from(process, process.first_ending(t)))


def _drawn_from(process: FailureProcess, k: int) -> Iterator[tuple[float, float]]:
    """``process``'s outages from the k-th on, drawn as they are asked for."""
    while True:
        yield process.outage(k)
        k += 1


def _slowdown(live: list[tuple[float, float, float]], t: float) -> float:
    """The product of the factors of the windows that contain ``t`` (inf: down)."""
    slow = 1.0
    for t0, t1, f in live:
        if t0 <= t < t1:
            slow *= f
    return slow


def _base(resolved: Resolved):
    """The function giving a span's base seconds under the scenario's compute mode."""
    mode = resolved.compute_mode
    if mode == "measured":
        return attrgetter("cpu_s")
    if mode == "wall":
        return attrgetter("wall_s")
    if mode == "flops":
        if not resolved.tflops or not resolved.tflops > 0 or not resolved.mfu > 0:
            raise ScenarioError("scenario: compute.mode 'flops' needs tflops > 0 and mfu > 0, "
                                f"got {resolved.tflops!r}, {resolved.mfu!r}")
        rate = resolved.tflops * 1e12 * resolved.mfu
        return lambda span: span.flops / rate
    raise ScenarioError(f"scenario: compute.mode must be 'measured', 'wall' or 'flops', got {mode!r}")


def _jitter(resolved: Resolved):
    """A function drawing a block of per-step factors from a generator, or None for no jitter."""
    kind, sigma = resolved.jitter, resolved.sigma
    if kind == "none":
        return None
    if not sigma >= 0 or math.isinf(sigma):
        raise ScenarioError(f"scenario: stragglers.sigma must be a finite number >= 0, got {sigma!r}")
    if kind == "lognormal":
        return lambda rng: np.exp(sigma * rng.standard_normal(_JITTER_BLOCK) - sigma * sigma / 2)
    if kind == "normal":
        return lambda rng: np.maximum(0.0, 1.0 + sigma * rng.standard_normal(_JITTER_BLOCK))
    if kind == "exponential":
        return lambda rng: 1.0 + sigma * rng.standard_exponential(_JITTER_BLOCK)
    raise ScenarioError(f"scenario: stragglers.jitter must be none, lognormal, normal or exponential, got {kind!r}")
