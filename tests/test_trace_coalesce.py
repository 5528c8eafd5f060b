"""Adjacent compute spans merged (``exonet.trace.coalesced``) replay exactly as the spans they merge."""

from __future__ import annotations

import pytest

from exonet.netsim import simulate
from exonet.scenario import Scenario
from exonet.trace import Trace, coalesced


def test_merging_adjacent_compute_spans_changes_no_replay():
    """Jitter is drawn per rank and step, outages and slowdowns split work wherever it runs: a run of spans takes
    what one span of their sum takes, so ``coalesced`` traces replay to the same times."""
    scenario = Scenario.from_dict({
        "name": "rough", "network": {"bandwidth": "1 Gbit/s", "latency": "5 ms"}, "compute": {"mode": "wall"},
        "stragglers": {"jitter": "lognormal", "sigma": 0.3, "seed": 7},
        "events": [{"kind": "slow", "ranks": [1], "from_s": 0.7, "to_s": 2.9, "factor": 3.0},
                   {"kind": "down", "ranks": [2], "from_s": 1.1, "to_s": 1.6}]})
    trace = Trace(3)
    for rank in range(3):
        for step in range(4):
            for i in range(5):
                trace.add_compute(rank, 0.05 * (i + 1 + rank))
            trace.add_collective(rank, "all_reduce", 4_000_000)
            trace.add_compute(rank, 0.1)
            trace.add_compute(rank, 0.02)
            trace.add_step(rank)
    merged = Trace(3, events=[coalesced(events) for events in trace.events])
    assert sum(map(len, merged.events)) == 3 * 4 * 4
    a, b = simulate(trace, scenario), simulate(merged, scenario)
    assert b.wall_clock_s == pytest.approx(a.wall_clock_s, rel=1e-12)
    assert [n.compute_s for n in b.per_node] == pytest.approx([n.compute_s for n in a.per_node], rel=1e-12)
    assert b.step_end_times == pytest.approx(a.step_end_times, rel=1e-12)
