"""Smoke tests of the benchmark suite: each benchmark runs end to end at a tiny size and prints its ratio (not timed)."""

from __future__ import annotations

import re

import pytest

from exonet.bench import communicator, strategies
from exonet.bench.__main__ import main as dispatch


def test_the_dispatcher_lists_every_benchmark_and_refuses_an_unknown_name(capsys):
    assert dispatch(["no-such-bench"]) == 2
    listed = capsys.readouterr().err
    for name in ("communicator", "strategies", "simulator", "runtime", "netsim"):
        assert name in listed


def test_communicator_bench_reports_both_sides_and_their_ratio(capsys):
    assert communicator.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "bookkeeping alone, 1 gloo process" in out and "K=2 gloo processes" in out
    row = (r"4 KiB +raw dist.all_reduce +[\d.]+ us +exonet Communicator +[\d.]+ us +overhead [+-][\d.]+ us "
           r"\[[+-][\d.]+, [+-][\d.]+\] +ratio exonet/raw [\d.]+ \(paired\)")
    assert len(re.findall(row, out)) == 2  # one process, then K
    assert re.search(r"4 KiB: exonet's bookkeeping \([\d.]+ us\) is [\d.]+% of a K=2 all-reduce", out)


def test_strategies_bench_checks_demo_against_the_reference_and_times_every_strategy(capsys):
    assert strategies.main(["--quick", "--steps", "5"]) == 0  # nonzero when DeMo and the reference disagree
    out = capsys.readouterr().out
    match = re.search(r"speed-up ([\d.]+)x +largest difference after 2 steps ([\d.e+-]+)", out)
    assert match and float(match.group(2)) <= 1e-6
    for name in ("bare torch", "DDP", "FedAvg", "DiLoCo", "SPARTA", "DeMo"):
        assert re.search(rf"{name} +[\d.]+ ms/step +ratio to bare torch [\d.]+", out), name


def test_simulator_is_the_netsim_benchmark_under_its_suite_name(capsys):
    assert dispatch(["simulator", "--steps", "20", "--nodes", "8", "--mbytes", "1"]) == 0
    assert "480 events in" in capsys.readouterr().out


def test_communicator_overhead_is_the_median_of_paired_differences_with_its_order_statistic_interval():
    raw = [(1.0 + i, 0.1) for i in range(100)]           # drift: raw calls grow slower over the run
    ours = [(r + 0.01 * i, 0.2) for i, (r, _) in enumerate(raw)]  # paired differences 0.00, 0.01, ..., 0.99
    o = communicator.overhead(raw, ours)
    assert o.paired == pytest.approx(0.495) and o.raw == pytest.approx(50.5) and o.ours_cpu == 0.2
    assert (o.low, o.high) == pytest.approx((0.39, 0.60))  # P(B(100, 1/2) <= 39) = 1.76% <= 2.5% < P(B <= 40)
    assert o.share == pytest.approx(0.495 / 50.5)
    assert communicator.median_ranks(1050) == (492, 557) and communicator.median_ranks(5) == (0, 4)
    assert communicator.median_ranks(6) == (0, 5)  # P(B(6, 1/2) = 0) = 1.6%: the extremes, at 96.9%
