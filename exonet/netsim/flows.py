"""Flows: a fluid model of messages sharing link capacity.

A message in transit is a *flow*: bytes draining through a fixed set of links at a
rate. Rates are recomputed whenever a flow starts, ends, or is paused, so between
two such moments every rate is constant and the next completion time is exact.
This is the fluid model SimGrid uses; it is exact where the packet level is noise.

Sharing policies:

* ``"max-min"`` (default): progressive filling. All unfrozen flows grow at the same
  rate until a link saturates or a flow reaches its own cap (TCP window); those flows
  freeze, and the rest keep growing. k flows on one link each get B/k.
* ``"fifo"``: each link carries one message at a time, at the path's full rate, in
  order of arrival. A message holds its whole path while it transmits (cut-through),
  so an idle path still costs α + s/B, the contract's per-message cost; a message
  waits while any link of its path is claimed by an earlier message (strict FIFO,
  no overtaking, hence no deadlock: the oldest message is always first everywhere).

Latency is not part of the fluid: a message's bytes occupy its links from the moment
it starts, and it is delivered α after its last byte leaves (transmission, then
propagation). Times are compared with a relative tolerance (``REL_TOL``), never
with float equality, so rounding can neither livelock the loop nor lose a flow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

REL_TOL = 1e-12


class Flow:
    """A message in transit: ``remaining`` bytes through ``links`` at ``rate`` bytes/s.

    ``latency`` is added after the last byte leaves; ``tag`` names the owner (a collective).
    """

    __slots__ = ("cap", "dst", "latency", "links", "rate", "remaining", "size", "src", "tag")

    def __init__(self, src: int, dst: int, links: tuple[int, ...], size: float, cap: float, latency: float, tag: object) -> None:
        self.src = src
        self.dst = dst
        self.links = links
        self.size = size
        self.remaining = size
        self.cap = cap
        self.latency = latency
        self.rate = 0.0
        self.tag = tag


def max_min(flows: Sequence[Flow], capacity: Sequence[float]) -> None:
    """Set every flow's rate to its max-min fair share (progressive filling with per-flow caps)."""
    count: dict[int, int] = {}
    for f in flows:
        for link in f.links:
            count[link] = count.get(link, 0) + 1
    residual = {link: capacity[link] for link in count}
    level = 0.0
    live = list(flows)
    while live:
        step = min(residual[link] / c for link, c in count.items() if c)
        step = min(step, min(f.cap for f in live) - level)
        level += step
        for link, c in count.items():
            if c:
                residual[link] -= step * c
        still = []
        for f in live:
            if f.cap <= level * (1.0 + REL_TOL) or any(residual[link] <= REL_TOL * capacity[link] for link in f.links):
                f.rate = min(level, f.cap)
                for link in f.links:
                    count[link] -= 1
            else:
                still.append(f)
        live = still


def fifo(flows: Sequence[Flow], capacity: Sequence[float]) -> None:
    """Give the oldest message on each link the path's full rate; later ones wait (rate 0)."""
    claimed: set[int] = set()
    for f in flows:
        if claimed.isdisjoint(f.links):
            f.rate = min(f.cap, *(capacity[link] for link in f.links))
        else:
            f.rate = 0.0
        claimed.update(f.links)


SHARING = {"max-min": max_min, "fifo": fifo}


class FluidNetwork:
    """The flows in transit on one network, and the time up to which they have drained.

    Args:
        capacity: bytes/s of every link, indexed by link id.
        sharing: "max-min" or "fifo".

    Call ``advance(t)`` to drain flows up to time ``t`` at their current rates, add or
    pause flows, then ``update()`` to collect finished flows and recompute rates.
    """

    def __init__(self, capacity: Sequence[float], sharing: str = "max-min", *, resolution: float = 0.0) -> None:
        self.capacity = capacity
        self.resolution = resolution  # seconds: a flow this close to its end is done (the caller's clock tick)
        self._allocate = SHARING[sharing]
        self.flows: dict[Flow, None] = {}  # an insertion-ordered set: arrival order matters to FIFO
        self._paused: dict[int, int] = {}  # rank -> how many outages hold it down
        self.now = 0.0

    def __len__(self) -> int:
        return len(self.flows)

    def advance(self, t: float) -> None:
        """Drain every flow at its current rate up to time ``t``."""
        dt = t - self.now
        if dt > 0:
            for f in self.flows:
                if f.rate:
                    f.remaining -= f.rate * dt
            self.now = t

    def add(self, flow: Flow) -> None:
        self.flows[flow] = None

    def pause(self, rank: int, down: bool) -> None:
        """Mark ``rank`` down (its flows stop) or up again; outages may overlap."""
        held = self._paused.get(rank, 0) + (1 if down else -1)
        if held:
            self._paused[rank] = held
        else:
            self._paused.pop(rank, None)

    def update(self) -> list[Flow]:
        """Remove and return the flows that have finished by ``now``, then recompute rates."""
        tolerance = max(REL_TOL * self.now, self.resolution)
        done = [
            f for f in self.flows
            if f.remaining <= REL_TOL * f.size or (f.rate > 0 and f.remaining <= f.rate * tolerance)
        ]
        for f in done:
            f.remaining = 0.0
            del self.flows[f]
        paused = self._paused
        if paused:
            active = []
            for f in self.flows:
                if f.src in paused or f.dst in paused:
                    f.rate = 0.0
                else:
                    active.append(f)
        else:
            active = list(self.flows)
        if active:
            self._allocate(active, self.capacity)
        return done

    def rebase(self) -> None:
        """Restart this network's clock at 0 (flows keep their remaining bytes).

        A caller with a long-running clock rebases at every rate change, so ``now`` only
        ever spans the time since the last change and never loses precision to a large offset.
        """
        self.now = 0.0

    def next_finish(self) -> float:
        """When the next flow finishes at current rates (inf if none can)."""
        best = math.inf
        for f in self.flows:
            if f.rate > 0:
                t = f.remaining / f.rate
                best = min(best, t)
        return self.now + best

    def settle(self, until: float = math.inf) -> list[tuple[Flow, float]]:
        """Run this network on its own up to ``until``: each finished flow with its finish time.

        Flows still in transit at ``until`` stay in ``flows`` with their remaining bytes.
        """
        out: list[tuple[Flow, float]] = []
        while True:
            out.extend((f, self.now) for f in self.update())
            t = self.next_finish()
            if t > until:
                if until < math.inf:
                    self.advance(until)
                return out
            if t == math.inf:
                return out
            self.advance(t)
