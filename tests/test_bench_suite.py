"""Smoke tests of the benchmark suite: each benchmark runs end to end at a tiny size and returns its figures
(not timed), and the dispatcher turns them into the exit status."""

from __future__ import annotations

import math

import pytest

from exonet.bench import communicator, strategies
from exonet.bench.__main__ import exit_status
from exonet.bench.__main__ import main as dispatch

BENCHMARKS = ("communicator", "memory", "netsim", "runtime", "scale", "simulator", "strategies")
STRATEGIES = ("bare torch", "DDP", "FedAvg", "DiLoCo", "SPARTA", "DeMo")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_the_dispatcher_lists_every_benchmark_when_refusing_an_unknown_name(capsys, name):
    assert dispatch(["no-such-bench"]) == 2
    assert name in capsys.readouterr().err


@pytest.mark.parametrize(("result", "status"), [({"x": 1.0}, 0), ({"ok": True}, 0), ({"ok": False, "x": 1.0}, 1),
                                                (0, 0), (1, 1), (None, 0)])
def test_figures_exit_zero_unless_a_check_failed_and_statuses_pass_through(result, status):
    assert exit_status(result) == status


def positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def test_communicator_bench_returns_both_sides_and_their_ratio_per_size(capsys):
    figures = communicator.main(["--quick"])
    assert figures["nodes"] == 2 and "ok" not in figures
    for side in ("alone", "k_nodes"):
        (row,) = figures[side].values()
        assert list(figures[side]) == [4096]
        assert all(positive(row[key]) for key in ("raw", "ours", "raw_cpu", "ours_cpu"))
        assert row["low"] <= row["paired"] <= row["high"]
        assert row["ratio"] == pytest.approx(1 + row["paired"] / row["raw"])
    assert figures["bookkeeping_share"][4096] == pytest.approx(figures["alone"][4096]["paired"]
                                                               / figures["k_nodes"][4096]["raw"])
    assert "K=2 gloo processes" in capsys.readouterr().out  # and prints them


@pytest.mark.slow
def test_strategies_bench_checks_demo_against_the_reference_and_times_every_strategy(capsys):
    figures = strategies.main(["--quick", "--steps", "5"])
    assert figures["ok"] is True and figures["demo"]["max_diff"] <= 1e-6  # ok is False when they disagree
    demo = figures["demo"]
    assert positive(demo["exonet_s"]) and demo["speedup"] == pytest.approx(demo["reference_s"] / demo["exonet_s"])
    assert list(figures["step_s"]) == list(STRATEGIES)
    assert all(positive(t) for t in figures["step_s"].values()) and figures["ratio_to_bare"]["bare torch"] == 1.0
    steps = figures["step_s"]
    assert figures["ratio_to_bare"]["DeMo"] == pytest.approx(steps["DeMo"] / steps["bare torch"])
    assert "ratio to bare torch" in capsys.readouterr().out


@pytest.mark.parametrize(("max_diff", "status"), [(1e-6, 0), (2e-6, 1)])
def test_the_strategies_bench_exits_nonzero_when_demo_and_the_reference_disagree(monkeypatch, max_diff, status):
    measured = {"demo": 0.001, "reference": 0.003, "max_diff": max_diff}
    monkeypatch.setattr(strategies, "measure", lambda k, **args: (measured, {"bare torch": 0.002, "DDP": 0.004}))
    assert dispatch(["strategies", "--quick"]) == status
    assert strategies.main(["--quick"])["ratio_to_bare"] == {"bare torch": 1.0, "DDP": 2.0}


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
