"""A replay that plays back the steps that repeat one already replayed (issue 44 §1): exact, not approximate.

Every case replays its trace twice, with the memo and without (``memo=False``: every step replayed), and
requires the two results to be the same in every field, bit for bit, and the memo to have played back
what repeats (or nothing, where compute varies per step).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exonet import LocalTrainer, Scenario, Trace
from exonet.bench.netsim import ddp_trace, overlap_trace, two_regions
from exonet.estimate import estimate
from exonet.netsim import memo as memo_module
from exonet.netsim import simulate
from exonet.netsim.result import SimResult
from exonet.strategies import DiLoCoStrategy
from exonet.toy import synthetic_classification, tiny_mlp


def assert_same(full: SimResult, memo: SimResult) -> None:
    """Every field of the two results equal (the memo's statistics aside), arrays and timelines included."""
    a, b = dataclasses.asdict(full), dataclasses.asdict(memo)
    assert "memo" in b.pop("stats") and a.pop("stats") == {}
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        if name == "link_loads":
            assert len(x) == len(y) and all(np.array_equal(u, v) for u, v in zip(x, y)), name
        else:
            assert x == y, name


def both(trace: Trace, scenario) -> SimResult:
    memo = simulate(trace, scenario)
    assert_same(simulate(trace, scenario, memo=False), memo)
    return memo


WAN = {"name": "wan", "network": {"bandwidth": "1 Gbit/s", "latency": "30 ms",
                                      "slow_start_after_idle": True}}


def played(result: SimResult) -> int:
    return result.stats["memo"]["played_back"]


@pytest.mark.parametrize("parity", [False, True])
def test_overlapping_collectives_play_back_exactly(parity, monkeypatch):
    """Two async all-reduces a step on groups that share the WAN link: flows share links on the event path. Chunks of
    3 links play the busy seconds back in several chunks per group, the last one partial."""
    monkeypatch.setattr(memo_module, "_CHUNK", 3)
    result = both(overlap_trace(30, 8, 50_000_000, parity=parity), two_regions(8, jitter=False))
    assert played(result) >= 26 and result.stats["memo"]["hit_rate"] == played(result) / 30


@pytest.mark.parametrize("buckets, identical", [(1, False), (4, False), (4, True)])
def test_ddp_buckets_play_back_exactly(buckets, identical):
    """Blocking DDP, overlapped buckets, and an estimate-like trace every rank of which mirrors rank 0."""
    assert played(both(ddp_trace(40, 8, 20_000_000, buckets=buckets, identical=identical),
                       two_regions(8, jitter=False))) >= 36


def test_jittered_compute_is_fed_whole_at_once_to_the_same_result():
    """Compute that differs in every step of the probe: no step can repeat another, so nothing is fed in steps."""
    result = both(overlap_trace(20, 8, 50_000_000, parity=True), two_regions(8))
    assert result.stats["memo"] == {"steps": 0, "played_back": 0, "hit_rate": 0.0, "boundaries": 0, "missed": 0}
    steady = both(overlap_trace(20, 8, 50_000_000, parity=True), two_regions(8, jitter=False))
    assert played(steady) > 0  # the same trace without jitter: the probe lets it through


def test_jittered_compute_plays_back_nothing_and_changes_nothing(monkeypatch):
    """Keys that never come back: after ``_UNSEEN`` boundaries the rest is fed whole, to the same result."""
    monkeypatch.setattr(memo_module, "_UNSEEN", 8)
    monkeypatch.setattr(memo_module, "_PROBE", 0)  # the probe would feed it whole at once
    result = both(overlap_trace(20, 8, 50_000_000, parity=True), two_regions(8))
    assert played(result) == 0 and result.stats["memo"]["boundaries"] == 8


def test_jitter_after_a_sync_point_gives_up_after_its_misses(monkeypatch):
    """Blocking DDP levels the ranks at every step, so the key comes back, but the jittered step never does."""
    monkeypatch.setattr(memo_module, "_PROBE", 0)  # the probe would feed it whole at once
    result = both(ddp_trace(60, 4, 1_000_000), two_regions(4))
    assert played(result) == 0 and result.stats["memo"]["missed"] == memo_module._MISSES


def diloco_like(steps: int, h: int, nodes: int = 4) -> Trace:
    """Local steps, and every ``h``-th step an all-reduce: the state repeats once a round, not once a step."""
    t = Trace(num_nodes=nodes)
    for k in range(steps):
        for r in range(nodes):
            t.add_compute(r, 0.1 * (1 + 0.1 * r))
            if k % h == h - 1:
                t.add_collective(r, "all_reduce", 40_000_000)
            t.add_step(r)
    return t


def test_a_cycle_of_rounds_plays_back_from_its_second_round():
    result = both(diloco_like(60, 5), WAN)
    assert played(result) >= 60 - 3 * 5


def test_a_step_that_changes_is_replayed_and_the_ones_after_it_play_back_again():
    t = diloco_like(40, 1)
    bigger = Trace(num_nodes=4)
    for r in range(4):  # step 20 sends ten times the bytes
        events = t.events[r]
        for i, e in enumerate(events):
            bigger.events[r].append(dataclasses.replace(e, nbytes=e.nbytes * 10) if i == 20 * 3 + 1 else e)
    result = both(bigger, WAN)
    assert 30 <= played(result) <= 36


def test_a_wait_for_an_earlier_steps_collective_is_replayed_exactly():
    """An async all-reduce waited for one step later (Streaming DiLoCo's overlap) crosses the boundary."""
    t = Trace(num_nodes=4)
    cids: list[list[int]] = [[] for _ in range(4)]
    for k in range(30):
        for r in range(4):
            t.add_compute(r, 0.05)
            cids[r].append(t.add_collective(r, "all_reduce", 10_000_000, async_op=True))
            if k:
                t.add_wait(r, cids[r][k - 1])
            t.add_step(r)
    for r in range(4):
        t.add_wait(r, cids[r][-1])
    both(t, WAN)


@pytest.mark.parametrize("strategy, preset", [("diloco:H=4", "cross-region"), ("ddp", "datacenter"),
                                              ("streaming_diloco:H=6,num_fragments=3", "cross-region")])
def test_estimates_on_hosts_play_back_exactly(strategy, preset):
    """NCCL over hosts of 4 devices (hierarchical collectives, slow start between rounds)."""
    scenario = Scenario.load(preset).replace(hosts={"devices": 4, "bandwidth": "450 GB/s"})
    est = estimate(strategy, params=2e8, num_nodes=16, max_steps=24, step_time=0.5, dtype="bf16")
    result = both(est.trace, scenario)
    assert result.stats["memo"]["steps"] == 24
    if strategy != "streaming_diloco:H=6,num_fragments=3":  # its waits cross steps: replayed whole
        assert played(result) >= 12


def test_a_real_fits_trace_plays_back_where_its_compute_is_counted_and_not_where_it_is_measured():
    """A DiLoCo fit's trace: timed by FLOPs its steps repeat; timed by measured CPU they do not. Exact both ways."""
    fit = LocalTrainer(tiny_mlp(), synthetic_classification(256, dim=8, classes=4)).fit(
        DiLoCoStrategy(H=3), num_nodes=2, max_steps=24, batch_size=8, val_size=0, progress=False)
    counted = both(fit.trace, {**WAN, "compute": {"mode": "flops", "tflops": 1e-4, "mfu": 1.0}})
    assert played(counted) >= 12
    measured = both(fit.trace, WAN)
    assert played(measured) == 0


def test_a_lossy_replay_and_its_range_play_back_exactly():
    """Phases that lose packets to a shallow queue: the range's two extra replays are memoised too."""
    scenario = {"name": "lossy", "network": {"bandwidth": "200 Mbit/s", "latency": "20 ms", "streams": 16,
                                             "queue": "2 ms"}}
    result = both(ddp_trace(20, 4, 20_000_000, buckets=2), scenario)
    assert result.wall_clock_range[0] <= result.wall_clock_s <= result.wall_clock_range[1]


def test_a_message_received_steps_after_it_was_sent_is_replayed_exactly():
    """Rank 0 sends at step 10 and rank 1 receives at step 12 (under gloo the message waits for the receive):
    steps with a message are replayed, and those around them, which do not touch it, play back."""
    t = diloco_like(40, 1, nodes=2)
    moved = Trace(num_nodes=2)
    for r, events in enumerate(t.events):
        step = 0
        for e in events:
            moved.events[r].append(e)
            if type(e).__name__ == "Step":
                step += 1
                if (r, step) == (0, 10):
                    sent = moved.add_collective(0, "send", 3_000_000, group=(0, 1), async_op=True)
                elif (r, step) == (1, 12):
                    moved.add_collective(1, "recv", 3_000_000, group=(0, 1))
    moved.add_wait(0, sent)
    for scenario in (WAN, {**WAN, "network": {**WAN["network"], "backend": "gloo"}}):
        result = both(moved, scenario)
        assert 20 <= played(result) <= 36
