"""The analytic fast path agrees with the flow-by-flow event model on randomised cases.

Random node counts, regions and inter-region links, heterogeneous NICs and latencies,
TCP windows, both sharing policies, every algorithm, random sizes; then traces where
collectives overlap (async ops, disjoint and nested subgroups) and members go down,
so the engine has to take fast collectives over mid-phase.
"""

from __future__ import annotations

import random

import pytest

from exonet import Trace
from exonet.netsim import simulate
from exonet.scenario import ALGORITHMS, EventSpec, LinkSpec, Resolved
from exonet.trace import OPS

exact = {"rel": 1e-9, "abs": 1e-12}


def random_scenario(rng: random.Random, n: int, *, outages: int = 0) -> Resolved:
    regions = [f"r{i}" for i in range(rng.randint(1, 3))]
    links = {
        (a, b): LinkSpec(10 ** rng.uniform(7.5, 10), rng.uniform(1e-4, 5e-2))
        for i, a in enumerate(regions) for b in regions[i + 1 :]
    }
    events = []
    for _ in range(outages):
        start = rng.uniform(0.0, 0.5)
        events.append(EventSpec("down", (rng.randrange(n),), from_s=start, to_s=start + rng.uniform(0.01, 0.3)))
    return Resolved(
        num_nodes=n,
        uplink=tuple(10 ** rng.uniform(7.5, 10) for _ in range(n)),
        downlink=tuple(10 ** rng.uniform(7.5, 10) for _ in range(n)),
        region=tuple(rng.choice(regions) for _ in range(n)),
        latency=rng.uniform(1e-5, 1e-2),
        links=links,
        speed=tuple(rng.uniform(0.5, 2.0) for _ in range(n)),
        algorithms={op: rng.choice(ALGORITHMS[op]) for op in OPS},
        sharing=rng.choice(["max-min", "fifo"]),
        tcp_window=rng.choice([None, 10 ** rng.uniform(4, 7)]),
        events=tuple(events),
    )


def random_trace(rng: random.Random, n: int, count: int) -> Trace:
    """Collectives in one global order (so no deadlock), random groups, async ops waited on later."""
    specs = []
    for _ in range(count):
        group = None if rng.random() < 0.4 else tuple(sorted(rng.sample(range(n), rng.randint(1, n))))
        specs.append((rng.choice(OPS), rng.randint(0, 50_000_000), group, rng.random() < 0.5))
    t = Trace(n)
    for r in range(n):
        pending = []
        for op, size, group, async_op in specs:
            if group is not None and r not in group:
                continue
            t.add_compute(r, rng.uniform(0.0, 0.05))
            cid = t.add_collective(r, op, size, group=group, async_op=async_op)
            if async_op:
                pending.append(cid)
            if pending and rng.random() < 0.3:
                t.add_wait(r, pending.pop(0))
            if rng.random() < 0.3:
                t.add_step(r)
        for cid in pending:
            t.add_wait(r, cid)
    return t


def assert_same(fast, slow) -> None:
    assert fast.wall_clock_s == pytest.approx(slow.wall_clock_s, **exact)
    assert fast.step_end_times == pytest.approx(slow.step_end_times, **exact)
    assert fast.wire_bytes == slow.wire_bytes
    for a, b in zip(fast.per_node, slow.per_node):
        assert (a.compute_s, a.comm_s, a.idle_s) == pytest.approx((b.compute_s, b.comm_s, b.idle_s), **exact)


@pytest.mark.parametrize("seed", range(60))
def test_a_lone_collective_matches_the_event_model(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 12)
    resolved = random_scenario(rng, n)
    op = rng.choice(OPS)
    t = Trace(n)
    for r in range(n):
        t.add_collective(r, op, rng.randint(1, 200_000_000) if r == 0 else 0)
    fast, slow = simulate(t, resolved), simulate(t, resolved, fast_path=False)
    assert fast.wall_clock_s > 0
    assert_same(fast, slow)


@pytest.mark.parametrize("seed", range(40))
def test_overlapping_collectives_and_outages_match_the_event_model(seed):
    rng = random.Random(1000 + seed)
    n = rng.randint(2, 8)
    resolved = random_scenario(rng, n, outages=rng.randint(0, 2))
    trace = random_trace(rng, n, rng.randint(3, 12))
    assert_same(simulate(trace, resolved), simulate(trace, resolved, fast_path=False))
