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

Why batches: the messages of one collective phase enter the network together, so
they are kept together as a ``Batch`` of numpy rows (bytes left, rate), and every
step (drain, finish, next finish) costs a few array operations per batch, not a
Python loop per message. Rates depend only on which flows are in transit (never on
their bytes), and a training run repeats the same few combinations of phases
thousands of times, so each combination's allocation is solved once and cached:
a rate change that was seen before costs a dictionary look-up.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

import numpy as np

REL_TOL = 1e-12
_CACHE_LIMIT = 1024  # allocations kept per network: a run needs tens; this bounds memory at 256-node phases
_NETWORKS_KEPT = 8  # networks (capacities) whose allocations are kept, e.g. the scenarios of one sweep
_shape_ids = itertools.count()


class Shape:
    """The fixed part of a batch of messages: endpoints, links, caps and latencies, one row per message.

    ``links`` is padded with ``pad`` (a link of infinite capacity) to a rectangle. ``id``
    identifies the shape in a network's cache of allocations, so equal phases share one.
    ``latencies`` are the distinct latencies and ``latency_of`` each row's index into them,
    so a caller converts a handful of latencies, not one per message.
    """

    __slots__ = ("cap", "dst", "id", "latencies", "latency", "latency_of", "links", "paths", "reach", "src", "still",
                 "unset")

    def __init__(self, paths: Sequence[tuple[int, ...]], src: Sequence[int], dst: Sequence[int],
                 cap: Sequence[float], latency: Sequence[float], pad: int) -> None:
        width = max(map(len, paths))
        self.paths = tuple(paths)
        self.reach = frozenset(itertools.chain.from_iterable(paths))  # the links its messages cross
        self.links = np.array([p + (pad,) * (width - len(p)) for p in paths], dtype=np.intp).reshape(len(paths), width)
        self.src = np.array(src, dtype=np.intp)
        self.dst = np.array(dst, dtype=np.intp)
        self.cap = np.array(cap, dtype=float)
        self.latency = np.array(latency, dtype=float)
        values, index = np.unique(self.latency, return_inverse=True)
        self.latencies = [float(x) for x in values]
        self.latency_of = index.reshape(-1)
        self.id = next(_shape_ids)
        self.still = np.zeros(len(paths))  # the rates of a batch not yet (or no longer) allocated ...
        self.unset = np.full(len(paths), math.nan)  # ... and their divisors, shared by every batch of this shape
        self.still.flags.writeable = self.unset.flags.writeable = False

    def __len__(self) -> int:
        return len(self.paths)


class Batch:
    """Messages of one owner (``tag``) that enter the network together: bytes left and rate per row.

    A row that has finished holds ``inf`` bytes and rate 0, so it never finishes again.
    ``eta`` is a time (on its network's clock) before which no row can finish, so the
    network checks a batch only when it may have: -inf until its network has timed it.
    """

    __slots__ = ("biggest", "eta", "key", "left", "live", "rate", "remaining", "shape", "size", "slow", "span", "tag",
                 "threshold")

    def __init__(self, shape: Shape, size: np.ndarray, tag: object) -> None:
        self.shape = shape
        self.size = size
        self.threshold = REL_TOL * size  # a row with this few bytes left is done
        self.biggest = float(size.max())
        self.eta = -math.inf
        self.span = 0.0  # how far before its finish time at current rates a row may count as done
        self.remaining = size.copy()
        self.rate = shape.still
        self.slow = shape.unset  # rate with nan where 0, for finish times without a division by zero
        self.tag = tag
        self.live = np.ones(len(shape), dtype=bool)
        self.left = len(shape)  # rows in transit
        self.key: tuple = (shape.id, None)  # (shape, live rows); None while every row is live

    def __len__(self) -> int:
        return self.left

    def arrivals(self, rows: np.ndarray) -> list[tuple[float, int]]:
        """(latency, how many) of ``rows``: when, after their last byte left, how many are delivered."""
        s = self.shape
        if len(s.latencies) == 1:
            return [(s.latencies[0], len(rows))]
        counts = np.bincount(s.latency_of[rows], minlength=len(s.latencies))
        return [(lat, int(k)) for lat, k in zip(s.latencies, counts) if k]


def max_min(links: np.ndarray, cap: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates of flows (rows of link ids, per-flow caps) by progressive filling.

    ``capacity`` has one entry per link id, then the padding id (capacity inf, never
    saturated). Every flow grows at the common level until a link it crosses saturates or
    it reaches its cap.
    """
    links_n = len(capacity)
    rate = np.zeros(len(cap))
    count = np.bincount(links.ravel(), minlength=links_n).astype(float)
    count[-1] = 0.0
    residual = capacity.copy()
    full = REL_TOL * capacity
    full[-1] = -math.inf
    live = np.ones(len(cap), dtype=bool)
    level = 0.0
    while True:
        used = count > 0
        step = float((residual[used] / count[used]).min())
        step = min(step, float(cap[live].min()) - level)
        level += step
        residual -= step * count
        frozen = live & ((cap <= level * (1.0 + REL_TOL)) | (residual <= full)[links].any(axis=1))
        rate[frozen] = np.minimum(level, cap[frozen])
        count -= np.bincount(links[frozen].ravel(), minlength=links_n)
        count[-1] = 0.0
        live &= ~frozen
        if not live.any():
            return rate


def fifo(links: np.ndarray, cap: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Give the oldest message on each link the path's full rate; later ones wait (rate 0)."""
    rate = np.zeros(len(cap))
    pad = len(capacity) - 1
    claimed: set[int] = set()
    for i, row in enumerate(links.tolist()):
        path = [link for link in row if link != pad]
        if claimed.isdisjoint(path):
            rate[i] = min(float(cap[i]), *(float(capacity[link]) for link in path))
        claimed.update(path)
    return rate


SHARING = {"max-min": max_min, "fifo": fifo}

# Allocations by network (sharing, capacities): shared by every FluidNetwork of one topology,
# the engine's and the fast path's, since a phase's rates depend on nothing else.
_ALLOCATIONS: dict[tuple, dict[tuple, list[tuple[np.ndarray, np.ndarray, float]]]] = {}


def _allocations(capacity: np.ndarray, sharing: str) -> dict[tuple, list[tuple[np.ndarray, np.ndarray, float]]]:
    key = (sharing, capacity.tobytes())
    cache = _ALLOCATIONS.get(key)
    if cache is None:
        if len(_ALLOCATIONS) >= _NETWORKS_KEPT:
            _ALLOCATIONS.clear()
        cache = _ALLOCATIONS[key] = {}
    return cache


class FluidNetwork:
    """The flows in transit on one network, and the time up to which they have drained.

    Args:
        capacity: bytes/s of every link, indexed by link id.
        sharing: "max-min" or "fifo".
        resolution: seconds; a flow this close to its end is done (the caller's clock tick).

    Call ``advance(t)`` to drain flows up to time ``t`` at their current rates, add
    batches or pause ranks, then ``update()`` to collect finished flows and recompute rates.
    """

    def __init__(self, capacity: Sequence[float], sharing: str = "max-min", *, resolution: float = 0.0) -> None:
        self.pad = len(capacity)  # the link id that pads a batch's rows: infinite capacity
        self._capacity = np.array([*capacity, math.inf], dtype=float)
        self.resolution = resolution
        self._allocate = SHARING[sharing]
        self.batches: dict[Batch, None] = {}  # an insertion-ordered set: arrival order matters to FIFO
        self._paused: dict[int, int] = {}  # rank -> how many outages hold it down
        self._changed = False
        self._rates = _allocations(self._capacity, sharing)
        self.now = 0.0
        self.busy_s = np.zeros(len(capacity) + 1)  # per link id (then the padding): seconds a flow moved on it
        self.tape: list[tuple[np.ndarray, float]] | None = None  # when a list: each addition to busy_s, in order
        self._moving: np.ndarray | None = None  # the links a flow moves on at current rates (None: not yet known)
        self._key: tuple | None = None  # the allocation's key in force (None: none yet, or paused rows)
        self._movings: dict[tuple, np.ndarray] = {}  # allocation key -> its moving links (rates follow from the key)

    def __len__(self) -> int:
        return sum(b.left for b in self.batches)

    def busy(self) -> frozenset[int]:
        """The links that flows in transit cross."""
        return frozenset().union(*(b.shape.reach for b in self.batches))

    def advance(self, t: float) -> None:
        """Drain every flow at its current rate up to time ``t``."""
        dt = t - self.now
        if dt > 0:
            for b in self.batches:
                b.remaining -= b.rate * dt
            if self.batches:
                if self._moving is None:
                    moving = self._movings.get(self._key) if self._key is not None else None
                    if moving is None:
                        moving = self._moving_links()
                        if self._key is not None:
                            if len(self._movings) >= _CACHE_LIMIT:
                                self._movings.clear()
                            self._movings[self._key] = moving
                    self._moving = moving
                self.busy_s[self._moving] += dt
                if self.tape is not None:
                    self.tape.append((self._moving, dt))
            self.now = t

    def _moving_links(self) -> np.ndarray:
        """Which links carry a flow with a positive rate now (a flow that waits or is paused keeps none busy)."""
        moving = np.zeros(self.pad + 1, dtype=bool)
        for b in self.batches:
            moving[b.shape.links[b.rate > 0]] = True
        moving[self.pad] = False
        return moving

    def add(self, batch: Batch) -> None:
        """Put ``batch`` in transit from ``now`` (with the bytes it has left: it may come from another network)."""
        batch.eta = -math.inf
        if batch.left:
            self.batches[batch] = None
            self._changed = True
            self._moving = self._key = None

    def remove(self, tag: object) -> None:
        """Take the flows of ``tag`` (a collective that was aborted) out of transit."""
        for b in [b for b in self.batches if b.tag is tag]:
            del self.batches[b]
            self._changed = True
            self._moving = self._key = None

    def pause(self, rank: int, down: bool) -> None:
        """Mark ``rank`` down (its flows stop) or up again; outages may overlap."""
        held = self._paused.get(rank, 0) + (1 if down else -1)
        if held:
            self._paused[rank] = held
        else:
            self._paused.pop(rank, None)
        self._changed = True
        self._moving = self._key = None

    def update(self) -> list[tuple[Batch, np.ndarray]]:
        """Remove the flows that have finished by ``now`` and recompute rates.

        Returns each batch that had flows finish with the indices of its rows that did.
        """
        now = self.now
        tolerance = max(REL_TOL * now, self.resolution)
        done = []
        for b in list(self.batches):
            if b.eta - now > tolerance:
                continue  # its next finish is further off than any rounding could bring it
            finished = b.remaining <= np.maximum(b.threshold, b.rate * tolerance)
            if np.count_nonzero(finished):
                rows = np.flatnonzero(finished)
                b.remaining[rows] = math.inf
                b.live[rows] = False
                b.left -= len(rows)
                b.key = (b.shape.id, b.live.tobytes())
                done.append((b, rows))
                if not b.left:
                    del self.batches[b]
                    b.rate, b.slow = b.shape.still, b.shape.unset
        if done or self._changed:
            self._reallocate()
        return done

    def _reallocate(self) -> None:
        self._changed = False
        self._moving = None
        batches = list(self.batches)
        paused = self._paused
        if paused:
            down = np.array(list(paused), dtype=np.intp)
            masks = [b.live & ~(np.isin(b.shape.src, down) | np.isin(b.shape.dst, down)) for b in batches]
            key = tuple((b.shape.id, m.tobytes()) for b, m in zip(batches, masks))
        else:
            masks = None
            key = tuple(b.key for b in batches)
        self._key = None if paused else key
        rates = self._rates.get(key)
        if rates is None:
            rates = self._solve(batches, masks)
            if len(self._rates) >= _CACHE_LIMIT:
                self._rates.clear()
            self._rates[key] = rates
        for b, (rate, slow, low) in zip(batches, rates):
            b.rate, b.slow = rate, slow
            # a row is done within REL_TOL of its size, or of rounding: 2·REL_TOL·size/rate bounds both
            b.span = 2.0 * REL_TOL * b.biggest / low

    def _solve(self, batches: list[Batch],
               masks: list[np.ndarray] | None) -> list[tuple[np.ndarray, np.ndarray, float]]:
        """Allocate rates to the live (and not paused) rows of ``batches``: per batch
        (rate, rate or nan, lowest rate > 0)."""
        if masks is None:
            masks = [b.live for b in batches]
        rows = [np.flatnonzero(m) for m in masks]
        out = []
        if any(len(r) for r in rows):
            width = max(b.shape.links.shape[1] for b in batches)
            links = np.concatenate([_widen(b.shape.links[r], width, self.pad) for b, r in zip(batches, rows)])
            cap = np.concatenate([b.shape.cap[r] for b, r in zip(batches, rows)])
            flat = self._allocate(links, cap, self._capacity)
        else:
            flat = np.zeros(0)
        start = 0
        for b, r in zip(batches, rows):
            rate = np.zeros(len(b.shape))
            rate[r] = flat[start:start + len(r)]
            start += len(r)
            slow = np.where(rate > 0, rate, math.nan)
            rate.flags.writeable = slow.flags.writeable = False
            low = float(np.fmin.reduce(slow)) if len(slow) else math.nan
            out.append((rate, slow, math.inf if math.isnan(low) else low))
        return out

    def rebase(self) -> None:
        """Restart this network's clock at 0 (flows keep their remaining bytes).

        A caller with a long-running clock rebases at every rate change, so ``now`` only
        ever spans the time since the last change and never loses precision to a large offset.
        """
        for b in self.batches:
            b.eta -= self.now
        self.now = 0.0

    def next_finish(self) -> float:
        """When the next flow finishes at current rates (inf if none can)."""
        best = math.inf
        for b in self.batches:
            t = float(np.fmin.reduce(b.remaining / b.slow))  # nan (rate 0) never wins
            b.eta = self.now + t - b.span  # nan when nothing moves: then always checked
            if t < best:
                best = t
        return self.now + best

    def run(self, until: float = math.inf) -> list[tuple[Batch, np.ndarray, float]]:
        """Run this network on its own up to ``until``: (batch, rows, time) for the flows that finish.

        Flows still in transit at ``until`` stay in the network with their remaining bytes.
        """
        out: list[tuple[Batch, np.ndarray, float]] = []
        while True:
            out.extend((b, rows, self.now) for b, rows in self.update())
            t = self.next_finish()
            if t > until:
                if until < math.inf:
                    self.advance(until)
                return out
            if t == math.inf:
                return out
            self.advance(t)


def _widen(links: np.ndarray, width: int, pad: int) -> np.ndarray:
    """``links`` padded with ``pad`` to ``width`` columns."""
    if links.shape[1] == width:
        return links
    out = np.full((len(links), width), pad, dtype=np.intp)
    out[:, : links.shape[1]] = links
    return out


class Solo:
    """One batch run alone on an otherwise idle network, recorded at every change of rates.

    ``state(until, tag)`` answers what ``FluidNetwork.run(until)`` on that batch would: the
    rows finished by then with their times, and the batch (owned by ``tag``) with the bytes
    it has left. It starts from the last recorded change before ``until`` and drains from
    there, the run's own arithmetic, so the answer is the run's to the bit, without running.

    Args:
        capacity: bytes/s of every link, indexed by link id.
        sharing: "max-min" or "fifo".
        shape, size: the batch's messages and their bytes.
    """

    def __init__(self, capacity: Sequence[float], sharing: str, shape: Shape, size: np.ndarray) -> None:
        self.shape, self.size = shape, size
        net, batch = FluidNetwork(capacity, sharing), Batch(shape, size, None)
        net.add(batch)
        self.times: list[float] = []
        self._busy: list[np.ndarray] = []  # per point: each link's busy seconds so far (as FluidNetwork.busy_s)
        self._points: list[tuple[list[np.ndarray], np.ndarray, np.ndarray, int, tuple, np.ndarray]] = []
        while True:
            finished = [rows for _, rows in net.update()]
            self.times.append(net.now)
            self._busy.append(net.busy_s.copy())
            self._points.append((finished, batch.remaining.copy(), batch.live.copy(), batch.left, batch.key,
                                 batch.rate))
            t = net.next_finish()
            if t == math.inf:
                return
            net.advance(t)

    def finishes(self) -> list[tuple[np.ndarray, float]]:
        """(rows, time) of every finish, until the last row's."""
        return [(rows, t) for t, point in zip(self.times, self._points) for rows in point[0]]

    def busy(self, until: float = math.inf) -> np.ndarray:
        """Each link's busy seconds (as ``FluidNetwork.busy_s``) in the batch's first ``until`` seconds."""
        k = bisect.bisect_right(self.times, until) - 1
        busy = self._busy[k]
        if k + 1 < len(self.times) and until > self.times[k]:  # the links that move until the next point
            busy = busy + (until - self.times[k]) * (self._busy[k + 1] > busy)
        return busy

    def state(self, until: float, tag: object) -> tuple[list[tuple[Batch, np.ndarray, float]], list[Batch]]:
        """(batch, rows, time) of the rows finished by ``until``, and the batch in transit then
        (none if all are done)."""
        k = bisect.bisect_right(self.times, until) - 1
        batch = Batch(self.shape, self.size, tag)
        _, remaining, live, left, key, rate = self._points[k]
        batch.remaining, batch.live, batch.left, batch.key = remaining.copy(), live.copy(), left, key
        dt = until - self.times[k]
        if dt > 0 and until < math.inf:
            batch.remaining -= rate * dt
        done = [(batch, rows, t) for t, point in zip(self.times[: k + 1], self._points) for rows in point[0]]
        return done, [batch] if left else []

