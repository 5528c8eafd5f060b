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
"""

from __future__ import annotations

import math

import numpy as np

from exonet.scenario import FailureSpec

_STREAM = 0xFA11  # keeps failure draws apart from the jitter drawn from (seed, rank)


class FailureProcess:
    """One rank's outages under a ``FailureSpec``.

    Args:
        spec: the scenario's failure process.
        rank: the rank whose outages these are.
    """

    def __init__(self, spec: FailureSpec, rank: int) -> None:
        self.spec = spec
        self._rng = np.random.default_rng([spec.seed, rank, _STREAM])
        self.outages: list[tuple[float, float]] = []  # drawn so far, in order
        self._t = 0.0  # the end of the latest outage drawn

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
        spec, rng = self.spec, self._rng
        start = self._t + rng.exponential(spec.mtbf)
        if spec.distribution == "exponential":
            repair = rng.exponential(spec.repair)
        elif spec.distribution == "lognormal":
            repair = spec.repair * math.exp(spec.sigma * rng.standard_normal() - spec.sigma**2 / 2)
        else:
            repair = spec.repair
        self._t = start + repair + spec.restart
        self.outages.append((start, self._t))
