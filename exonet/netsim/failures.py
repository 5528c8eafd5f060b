"""Failures: each rank's outages drawn from the scenario's ``[failures]`` process, lazily.

A rank alternates up and down (an alternating renewal process): up for U_k ~ Exp(mean
``mtbf``), then down for D_k = repair_k + ``restart``, where repair_k is ``repair`` itself
(``distribution = "fixed"``), Exp(mean ``repair``), or ``repair``·exp(σz − σ²/2), z ~ N(0, 1)
(``"lognormal"``, mean ``repair``). Outage k is [t0_k, t0_k + D_k) with
t0_k = Σ_{i<=k} U_i + Σ_{i<k} D_i. Over a long run a rank fails T / (mtbf + E[D]) times.

Draws come from a generator seeded with (seed, rank) on a stream of their own (stragglers'
jitter uses another), in the order U_0, repair_0, U_1, repair_1, ..., so a rank's outages
depend neither on the node count nor on how far or in which order the replay asks: the
horizon is unknown in advance, so outages are drawn as far as they are needed.

A failure throws away a rank's compute since its last sync, so W seconds of it between two syncs
take e^(W/mtbf) − 1 failures on average to get through: an mtbf far below a rank's compute
between syncs ("1 ms" for steps of a second) is work without bound. ``FailureBudget`` adds that
expectation up span by span, and the failures drawn, and refuses the replay, naming
``failures.mtbf``, once either passes ``MAX_FAILURES`` over the run.

A blocking collective waits until all its m failing members are up at once. A rank is up a share
p = mtbf / (mtbf + E[repair] + restart) of the time, so all m are up only p^m of it, and they come up
together at the rate m·p^(m−1) / (mtbf + E[D]): waiting for that from a moment some are down draws
(1 − p^m) / p^(m−1) failures on average. ``all_up_wait`` refuses, naming ``failures.repair``, where
that alone passes ``MAX_FAILURES`` (mtbf 1 h, repair 10 h, 8 ranks: 2·10^7 failures per wait, an endless
replay); mtbf 50 h, repair 2 h, 256 ranks expects 2·10^4 and is replayed.

``UnitFailures`` is the same process for a unit of many devices that is one thing to the model (a
worker of N/M chips, exonet.netsim.workers): its devices fail independently with mean ``mtbf`` each,
so the unit's failures arrive at the summed rate, live devices / ``mtbf``, with no object per device.
"""

from __future__ import annotations

import math
import warnings
from bisect import bisect_right
from operator import itemgetter

import numpy as np

from exonet.errors import ScenarioError
from exonet.scenario import FailureSpec
from exonet.units import format_time

_STREAM = 0xFA11  # keeps failure draws apart from the jitter drawn from (seed, rank)
_UNIT_STREAM = 0xC41F  # a unit's failures: apart from a rank's, so that unit 0 and rank 0 draw differently
MAX_FAILURES = 10**6  # expected (or drawn) failures over one replay past which it is refused


class FailureBudget:
    """The failures a replay expects and has drawn, refused past ``MAX_FAILURES``.

    Args:
        spec: the scenario's failure process.
    """

    def __init__(self, spec: FailureSpec) -> None:
        self.spec = spec
        self.expected = 0.0

    def compute(self, rank: int, since: float | None, work: float) -> None:
        """Count a compute span of ``work`` seconds begun ``since`` seconds of work after the rank's last sync
        (None: a failure only pauses it); ScenarioError when the run's expected failures pass the bound."""
        m = self.spec.mtbf
        if since is None:  # nothing is redone: failures come at the rate of time
            self.expected += work / m
        else:  # getting through W seconds of work that a failure restarts takes e^(W/m) - 1 failures on average
            self.expected += _tries((since + work) / m) - _tries(since / m)
        if not self.expected <= MAX_FAILURES:
            total = (since or 0.0) + work
            tries = f"e^{total / m:.4g}" + (f" = {_tries(total / m) + 1:.3g}" if total / m < 700 else "")
            raise ScenarioError(
                f"scenario: failures.mtbf: {format_time(m)} makes this replay expect more than {MAX_FAILURES:,} "
                f"failures, work without bound: a failure throws away a rank's compute since its last sync, and "
                f"rank {rank} computes {format_time(total)} between syncs, which takes {tries} tries on average "
                f"(e^(work / mtbf)); raise failures.mtbf well above the compute between syncs")

    def drawn(self, count: int, t: float) -> None:
        """ScenarioError once the failures drawn over the run (``count``, by simulated time ``t``) pass the bound."""
        if count > MAX_FAILURES:
            raise ScenarioError(
                f"scenario: failures.mtbf: {format_time(self.spec.mtbf)} makes this replay draw more than "
                f"{MAX_FAILURES:,} failures by {format_time(t)} of simulated time; raise failures.mtbf")


def all_up_wait(spec: FailureSpec, members: int) -> float:
    """Failures drawn, on average, while waiting for ``members`` failing ranks to be up at once; ScenarioError
    naming ``failures.repair`` where that passes ``MAX_FAILURES`` (the replay would never end)."""
    down = spec.repair + spec.restart
    p = spec.mtbf / (spec.mtbf + down)
    wait = (1.0 - p**members) / p ** (members - 1) if p > 0 else math.inf
    if not wait <= MAX_FAILURES:
        raise ScenarioError(
            f"scenario: failures.repair: {format_time(spec.repair)} (plus restart {format_time(spec.restart)}) "
            f"against mtbf {format_time(spec.mtbf)} keeps a rank up {p:.3g} of the time, so the {members} ranks "
            f"of a collective are all up at once only p^{members} = {p**members:.3g} of it: waiting for that draws "
            f"about {wait:.3g} failures each time, more than {MAX_FAILURES:,}, a replay without end; shorten "
            f"failures.repair, raise failures.mtbf, or let the run go on without failed nodes (an elastic strategy)")
    return wait


def warn_default_restart(failures: dict | None, elastic: bool = False) -> None:
    """Warn that a ``[failures]`` table (as written) gives no ``restart``, naming the default taken: a failure
    then costs its repair and the work thrown away, but no reload (an elastic worker stalls ``pause`` instead)."""
    if failures is None or "restart" in failures or elastic:
        return
    warnings.warn(f"scenario: [failures] gives no restart: took the default restart = \"{format_time(0.0)}\", so a "
                  f"failure costs only its repair and the work since the last sync; a synchronous job's reload and "
                  f"rejoin takes minutes (scenarios/README.md, \"[failures] defaults\"): set failures.restart",
                  UserWarning, stacklevel=3)


def _tries(x: float) -> float:
    """e^x − 1, and inf where it passes what a float holds."""
    return math.expm1(x) if x < 700 else math.inf


class FailureProcess:
    """One rank's outages under a ``FailureSpec``.

    Args:
        spec: the scenario's failure process.
        rank: the rank whose outages these are.
    """

    def __init__(self, spec: FailureSpec, rank: int) -> None:
        self.spec = spec
        self._rng = np.random.default_rng([spec.seed, rank, _STREAM])
        self.outages: list[tuple[float, float]] = []  # drawn so far, in order, disjoint: starts and ends both sorted
        self._t = 0.0  # the end of the latest outage drawn

    def first_ending(self, t: float, drawn: int | None = None) -> int:
        """The index of the first outage among the first ``drawn`` (default: all drawn) that ends after ``t``
        (or is a zero-length one at ``t``): a bisection, since outages are disjoint and in order."""
        hi = len(self.outages) if drawn is None else drawn
        i = bisect_right(self.outages, t, hi=hi, key=itemgetter(1))
        while i > 0 and self.outages[i - 1][0] == self.outages[i - 1][1] == t:
            i -= 1
        return i

    def outage(self, k: int) -> tuple[float, float]:
        """The k-th outage (from 0): [start, end) in seconds."""
        while len(self.outages) <= k:
            self._draw()
        return self.outages[k]

    def through(self, t: float) -> list[tuple[float, float]]:
        """Every outage that starts at or before ``t`` (drawn as needed), and the next one after it."""
        while not self.outages or self.outages[-1][0] <= t:
            self._draw()
        return self.outages

    def _draw(self) -> None:
        start = self._t + self._rng.exponential(self.spec.mtbf)
        self._t = start + draw_repair(self.spec, self._rng) + self.spec.restart
        self.outages.append((start, self._t))


def draw_repair(spec: FailureSpec, rng: np.random.Generator) -> float:
    """One repair time under ``spec.distribution``: ``repair`` itself, Exp(mean repair), or lognormal (mean repair)."""
    if spec.distribution == "exponential":
        return float(rng.exponential(spec.repair))
    if spec.distribution == "lognormal":
        return spec.repair * math.exp(spec.sigma * rng.standard_normal() - spec.sigma**2 / 2)
    return spec.repair


class UnitFailures:
    """The failures of a unit of devices that fail independently, each up for Exp(mean ``mtbf``).

    The next failure comes after Exp(mean mtbf / live) for ``live`` devices up (the minimum of their
    exponential up-times); draws are seeded with (seed, unit) on a stream of their own.

    Args:
        spec: the scenario's failure process (``mtbf`` per device).
        unit: the unit's index, for its seed.
    """

    def __init__(self, spec: FailureSpec, unit: int) -> None:
        self.spec = spec
        self.rng = np.random.default_rng([spec.seed, unit, _UNIT_STREAM])

    def gap(self, live: int) -> float:
        """Seconds to the next failure among ``live`` devices (inf when none is up)."""
        return float(self.rng.exponential(self.spec.mtbf / live)) if live > 0 else math.inf

    def repair(self) -> float:
        """How long the devices a failure took down stay out."""
        return draw_repair(self.spec, self.rng)
