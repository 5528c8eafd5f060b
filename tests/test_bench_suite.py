"""Smoke tests of the benchmark suite: each benchmark runs end to end at a tiny size and prints its ratio (not timed)."""

from __future__ import annotations

import re

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
    assert "K=2 gloo processes" in out
    assert re.search(r"4 KiB +raw dist.all_reduce +[\d.]+ us +exonet Communicator +[\d.]+ us +ratio exonet/raw [\d.]+",
                     out)


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
