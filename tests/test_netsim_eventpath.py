"""The batched event path agrees with the flow-by-flow fluid model it replaced, on randomised cases.

``Reference`` below is that model as it was (one ``Flow`` at a time, progressive filling
recomputed from scratch at every change), behind the batch interface the engine speaks.
Two checks: the two networks driven by the same random operations give the same rates,
finish times and finished flows; and whole replays (overlapping collectives on several
groups, outages, both sharing policies, TCP windows) give the same results with the
reference on the pure event path as with the new network, fast path and hand-back included.
"""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest

from exonet.bench import netsim as netsim_bench
from exonet.netsim import engine, flows, simulate
from exonet.netsim.flows import REL_TOL, Batch, FluidNetwork, Shape
from exonet.scenario import ALGORITHMS, EventSpec, LinkSpec, Resolved
from exonet.trace import Trace

exact = {"rel": 1e-9, "abs": 1e-12}


# ---------------------------------------------------------------- the reference
class Flow:
    """A message in transit: ``remaining`` bytes through ``links`` at ``rate`` bytes/s."""

    __slots__ = ("cap", "dst", "links", "rate", "remaining", "size", "src")

    def __init__(self, src: int, dst: int, links: tuple[int, ...], size: float, cap: float) -> None:
        self.src, self.dst, self.links, self.size, self.remaining, self.cap, self.rate = (src, dst, links, size, size,
                                                                                          cap, 0.0)


def reference_max_min(flows: list[Flow], capacity) -> None:
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


def reference_fifo(flows: list[Flow], capacity) -> None:
    claimed: set[int] = set()
    for f in flows:
        f.rate = min(f.cap, *(capacity[link] for link in f.links)) if claimed.isdisjoint(f.links) else 0.0
        claimed.update(f.links)


class Reference:
    """The flow-by-flow network behind the batch interface: it takes batches and answers (batch, rows)."""

    def __init__(self, capacity, sharing: str = "max-min", *, resolution: float = 0.0) -> None:
        self.capacity = capacity
        self.resolution = resolution
        self._allocate = {"max-min": reference_max_min, "fifo": reference_fifo}[sharing]
        self._flows: dict[Flow, tuple[Batch, int]] = {}
        self._paused: dict[int, int] = {}
        self.now = 0.0
        self.busy_s = np.zeros(len(capacity) + 1)  # per link: seconds some flow moved on it

    def __len__(self) -> int:
        return len(self._flows)

    @property
    def batches(self) -> list[Batch]:
        return list(dict.fromkeys(b for b, _ in self._flows.values()))

    def _sync(self) -> None:
        """Bring the batches' rows (bytes left, rate) up to date with the flows, as ``FluidNetwork`` keeps them."""
        for b in self.batches:
            b.rate = np.zeros(len(b.shape))
        for f, (b, i) in self._flows.items():
            b.remaining[i], b.rate[i] = f.remaining, f.rate

    def busy(self) -> frozenset[int]:
        return frozenset(link for f in self._flows for link in f.links)

    def add(self, batch: Batch) -> None:
        s = batch.shape
        for i in np.flatnonzero(batch.live):
            f = Flow(int(s.src[i]), int(s.dst[i]), s.paths[i], float(batch.size[i]), float(s.cap[i]))
            f.remaining = float(batch.remaining[i])
            self._flows[f] = (batch, int(i))

    def advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for f in self._flows:
                if f.rate:
                    f.remaining -= f.rate * dt
            for link in {link for f in self._flows if f.rate for link in f.links}:
                self.busy_s[link] += dt
            self.now = t
            self._sync()

    def pause(self, rank: int, down: bool) -> None:
        held = self._paused.get(rank, 0) + (1 if down else -1)
        if held:
            self._paused[rank] = held
        else:
            self._paused.pop(rank, None)

    def update(self) -> list[tuple[Batch, np.ndarray]]:
        tolerance = max(REL_TOL * self.now, self.resolution)
        done = [f for f in self._flows
                if f.remaining <= REL_TOL * f.size or (f.rate > 0 and f.remaining <= f.rate * tolerance)]
        out: dict[Batch, list[int]] = {}
        for f in done:
            batch, i = self._flows.pop(f)
            batch.live[i], batch.remaining[i] = False, math.inf
            batch.left -= 1
            out.setdefault(batch, []).append(i)
        active = [f for f in self._flows if f.src not in self._paused and f.dst not in self._paused]
        for f in self._flows:
            f.rate = 0.0
        if active:
            self._allocate(active, self.capacity)
        self._sync()
        return [(b, np.array(rows)) for b, rows in out.items()]

    def rates(self) -> list[tuple[float, float]]:
        """(rate, bytes left) of every flow in transit, in arrival order."""
        return [(f.rate, f.remaining) for f in self._flows]

    def rebase(self) -> None:
        self.now = 0.0

    def next_finish(self) -> float:
        return self.now + min((f.remaining / f.rate for f in self._flows if f.rate > 0), default=math.inf)

    def run(self, until: float = math.inf) -> list[tuple[Batch, np.ndarray, float]]:
        out = []
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


# ------------------------------------------------------- the networks side by side
def random_batch(rng: random.Random, links: int, n: int) -> tuple[Shape, np.ndarray]:
    """A few messages with random paths, caps and endpoints, often of one size (as a phase's are)."""
    k = rng.randint(1, 6)
    paths = [tuple(rng.sample(range(links), rng.randint(1, min(3, links)))) for _ in range(k)]
    caps = [math.inf if rng.random() < 0.7 else rng.uniform(0.2, 3.0) for _ in range(k)]
    size = rng.choice([1.0, rng.uniform(0.1, 5.0)])
    sizes = [size if rng.random() < 0.7 else rng.uniform(0.0, 5.0) for _ in range(k)]
    ends = [(rng.randrange(n), rng.randrange(n)) for _ in range(k)]
    shape = Shape(paths, [a for a, _ in ends], [b for _, b in ends], caps, [0.0] * k, pad=links)
    return shape, np.array(sizes)


def in_transit(net: FluidNetwork) -> list[float]:
    """(rate, bytes left) of every flow in transit, flattened (pytest.approx compares flat sequences only)."""
    return [float(x) for b in net.batches for i in np.flatnonzero(b.live) for x in (b.rate[i], b.remaining[i])]


@pytest.mark.parametrize("sharing", ["max-min", "fifo"])
@pytest.mark.parametrize("seed", range(25))
def test_the_batched_network_matches_the_flow_by_flow_one(sharing, seed):
    rng = random.Random(seed)
    links, n = rng.randint(2, 8), rng.randint(2, 5)
    capacity = [rng.choice([1.0, rng.uniform(0.5, 4.0)]) for _ in range(links)]
    new, ref = FluidNetwork(capacity, sharing), Reference(capacity, sharing)
    down: list[int] = []
    for tag in range(40):
        action = rng.random()
        if action < 0.45:
            shape, sizes = random_batch(rng, links, n)
            new.add(Batch(shape, sizes, tag))
            ref.add(Batch(shape, sizes, tag))
        elif action < 0.55:
            up = bool(down) and rng.random() < 0.5
            rank = down.pop() if up else rng.randrange(n)
            if not up:
                down.append(rank)
            new.pause(rank, not up)
            ref.pause(rank, not up)
        else:
            t = ref.next_finish()
            assert new.next_finish() == pytest.approx(t, rel=1e-9)
            if t < math.inf:
                new.advance(t)
                ref.advance(t)
        finished = [{(b.tag, int(i)) for b, rows in net.update() for i in rows} for net in (new, ref)]
        assert finished[0] == finished[1]
        assert in_transit(new) == pytest.approx([x for flow in ref.rates() for x in flow], rel=1e-9, abs=1e-12)
    assert new.next_finish() == pytest.approx(ref.next_finish(), rel=1e-9)


# ------------------------------------------------------------- whole replays
def random_case(rng: random.Random) -> tuple[Trace, Resolved]:
    """Steps of compute, then async collectives on the world, halves and random subgroups, all overlapping."""
    n = rng.randint(2, 9)
    regions = [f"r{i}" for i in range(rng.randint(1, 3))]
    links = {(a, b): LinkSpec(10 ** rng.uniform(7.5, 10), rng.uniform(1e-4, 5e-2))
             for i, a in enumerate(regions) for b in regions[i + 1:]}
    events = []
    for _ in range(rng.choice([0, 0, 1, 2])):
        start = rng.uniform(0.0, 1.0)
        events.append(EventSpec("down", (rng.randrange(n),), from_s=start, to_s=start + rng.uniform(0.01, 0.3)))
    resolved = Resolved(
        num_nodes=n,
        uplink=tuple(10 ** rng.uniform(8, 10) for _ in range(n)),
        downlink=tuple(10 ** rng.uniform(8, 10) for _ in range(n)),
        region=tuple(rng.choice(regions) for _ in range(n)),
        latency=rng.uniform(1e-5, 1e-2),
        links=links,
        algorithms={op: rng.choice(ALGORITHMS[op]) for op in ("all_reduce", "all_gather", "broadcast")},
        sharing=rng.choice(["max-min", "max-min", "fifo"]),
        tcp_window=rng.choice([None, None, 10 ** rng.uniform(4, 7)]),
        events=tuple(events),
    )
    half = max(1, n // 2)
    groups = [None, tuple(range(half)), tuple(range(half, n)) or None]
    trace = Trace(n)
    for _ in range(rng.randint(1, 4)):
        specs = [(rng.choice(["all_reduce", "all_reduce", "all_gather", "broadcast"]),
                  rng.choice(groups + [tuple(sorted(rng.sample(range(n), rng.randint(1, n))))]),
                  rng.randint(0, 30_000_000)) for _ in range(rng.randint(1, 3))]
        for r in range(n):
            trace.add_compute(r, rng.uniform(0.0, 0.05))
            ids = [trace.add_collective(r, op, size, group=group, async_op=True)
                   for op, group, size in specs if group is None or r in group]
            for cid in ids:
                trace.add_wait(r, cid)
            trace.add_step(r)
    return trace, resolved


def assert_same(a, b) -> None:
    assert a.wall_clock_s == pytest.approx(b.wall_clock_s, **exact)
    assert a.step_end_times == pytest.approx(b.step_end_times, **exact)
    assert a.wire_bytes == b.wire_bytes
    for x, y in zip(a.per_node, b.per_node):
        assert (x.compute_s, x.comm_s, x.idle_s) == pytest.approx((y.compute_s, y.comm_s, y.idle_s), **exact)
    assert [link.name for link in a.links] == [link.name for link in b.links]
    assert [link.bytes for link in a.links] == pytest.approx([link.bytes for link in b.links], **exact)
    assert [link.busy_s for link in a.links] == pytest.approx([link.busy_s for link in b.links], **exact)


def count_calls(monkeypatch, *names: str) -> dict[str, int]:
    """Count calls of these ``Simulation`` methods from now on."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        def counted(self, *args, _name=name, _f=getattr(engine.Simulation, name)):
            calls[_name] += 1
            return _f(self, *args)
        monkeypatch.setattr(engine.Simulation, name, counted)
    return calls


def flow_by_flow(monkeypatch, trace: Trace, resolved: Resolved):
    monkeypatch.setattr(engine, "FluidNetwork", Reference)
    monkeypatch.setattr(flows, "FluidNetwork", Reference)
    return simulate(trace, resolved, fast_path=False)


@pytest.mark.parametrize("seed", range(40))
def test_replays_match_the_flow_by_flow_event_path(seed, monkeypatch):
    trace, resolved = random_case(random.Random(seed))
    fast, events = simulate(trace, resolved), simulate(trace, resolved, fast_path=False)
    monkeypatch.setattr(engine, "FluidNetwork", Reference)
    monkeypatch.setattr(flows, "FluidNetwork", Reference)  # the fast path's phases run alone (flows.Solo)
    before = simulate(trace, resolved, fast_path=False)
    assert_same(events, before)
    assert_same(fast, before)


@pytest.mark.parametrize("seed", range(12))
def test_the_overlap_bench_trace_matches_the_flow_by_flow_event_path(seed, monkeypatch):
    # collectives on all ranks and on each region at once: many take-overs and hand-backs per step
    rng = random.Random(seed)
    n = rng.randint(3, 12)
    trace = netsim_bench.overlap_trace(rng.randint(2, 4), n, rng.randint(1, 20_000_000), seed=seed)
    resolved = dataclasses.replace(netsim_bench.two_regions(n), sharing=rng.choice(["max-min", "fifo"]),
                                   latency=rng.uniform(1e-5, 1e-3))
    assert_same(simulate(trace, resolved), flow_by_flow(monkeypatch, trace, resolved))



@pytest.mark.parametrize("seed", range(10))
def test_collectives_rest_together_while_their_transmissions_are_apart(seed, monkeypatch):
    # latency-bound rings on shared links (world, and even/odd or regional halves across a slow long link): their
    # bytes are on the wire a fraction of each phase, so they rest on the fast path together, split where their
    # windows meet and are guarded where event-path flows wait on their links; all of it as the flow-by-flow model
    rng = random.Random(seed)
    n = rng.randint(4, 12)
    trace = netsim_bench.overlap_trace(rng.randint(3, 6), n, rng.randint(1_000_000, 20_000_000), seed=seed,
                                       parity=seed % 2 == 0)
    resolved = dataclasses.replace(netsim_bench.two_regions(n), latency=rng.uniform(1e-4, 2e-3),
                                   links={("eu", "us"): LinkSpec(10 ** rng.uniform(8.5, 9.5), rng.uniform(0.01, 0.05))})
    calls = count_calls(monkeypatch, "_rest")
    fast = simulate(trace, resolved)
    assert calls["_rest"] > 0
    assert_same(fast, flow_by_flow(monkeypatch, trace, resolved))


def test_the_parity_bench_splits_and_guards_resting_collectives_exactly(monkeypatch):
    # 16 nodes, world and even/odd rings, a 40 ms link: windows meet (splits) and event-path flows cross
    # resting collectives' links between their windows (guards)
    trace = netsim_bench.overlap_trace(4, 16, 20_000_000, parity=True)
    resolved = netsim_bench.two_regions(16)
    calls = count_calls(monkeypatch, "_rest", "_split", "_guard")
    fast = simulate(trace, resolved)
    assert min(calls.values()) > 0, calls
    assert_same(fast, flow_by_flow(monkeypatch, trace, resolved))
