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
wait), and after the outage the rank redoes that work before going on. A failure while the
rank is blocked in a collective only delays the collective (what it contributes is kept).

Slowdowns affect compute only; links are the scenario's ``[network]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from operator import attrgetter

import numpy as np

from exonet.errors import ScenarioError
from exonet.netsim.failures import FailureBudget, FailureProcess
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
        self.down: list[list[tuple[float, float]]] = [[] for _ in range(n)]
        self._gated: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.windowed = [False] * n
        for i, e in enumerate(resolved.events):
            self._add_event(i, e, n)
        spec = resolved.failures
        # a rank that never fails (a server, with failures.servers = false) has None
        self.failures = ([FailureProcess(spec, r) if spec.servers or r < n - resolved.servers else None
                          for r in range(n)] if spec is not None else None)
        self._failed = [0] * n  # failures of each rank recorded as outages so far
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
        if not live:
            return start + work, [(start, start + work, UP)]
        edges = sorted({x for t0, t1, _ in live for x in (t0, t1) if start < x < math.inf})
        pieces: list[tuple[float, float, int]] = []
        t, left, fails = start, work, self._fail_starts[rank]
        for edge in [*edges, math.inf]:
            slow = 1.0
            for t0, t1, f in live:
                if t0 <= t < t1:
                    slow *= f
            if math.isinf(slow):
                failed = since is not None and t in fails
                if failed:
                    assert since is not None  # failed implies it
                    left = since + work  # the work since the last sync is lost: redo it all
                pieces.append((t, edge, FAILED if failed else DOWN))
            elif t + left * slow <= edge:
                end = t + left * slow
                pieces.append((t, end, UP))
                return end, pieces
            else:
                left -= (edge - t) / slow
                pieces.append((t, edge, UP))
            t = edge
        raise AssertionError("unreachable: the last edge is infinite")

    # --------------------------------------------------------------- outages
    def add_down(self, rank: int, t0: float, t1: float) -> None:
        """Record an outage of ``rank`` over [t0, t1)."""
        self.down[rank].append((t0, t1))
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
        for t0, t1 in outages[self._failed[rank]:]:
            self.add_down(rank, t0, t1)
            self._fail_starts[rank].add(t0)
        self._failed[rank] = len(outages)
        assert self._budget is not None  # set with self.failures
        self._budget.drawn(sum(self._failed), t)
        return outages

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
        """The earliest time >= ``t`` at which every one of ``members`` is up."""
        moved = True
        while moved:
            moved = False
            for r in members:
                self.failures_through(r, t)
                for t0, t1 in self.down[r]:
                    if t0 <= t < t1:
                        t, moved = t1, True
        return t


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
