"""The netsim benchmark runs end to end on a small size and reports its figures."""

from __future__ import annotations

import re

from exonet.bench import netsim


def test_bench_reports_events_per_second(capsys):
    assert netsim.main(["--steps", "20", "--nodes", "8", "--mbytes", "1"]) == 0
    out = capsys.readouterr().out
    assert "480 events in" in out and "events/s" in out and "simulated wall-clock" in out


def test_overlap_bench_reports_side_by_side_and_fits(capsys):
    args = ["--overlap", "--steps", "4", "--nodes", "8", "--mbytes", "1", "--reference-steps", "2", "--fit",
            "--fit-nodes", "32"]
    assert netsim.main(args) == 0
    out = capsys.readouterr().out
    assert "ms per step" in out and "event path alone" in out
    assert "n^" in out and "steps^" in out
    assert "fit (CPU, with the memo), 5 steps: n=16" in out and "n=32" in out and "n=64" not in out
    assert "fit (CPU, every step replayed), 8 nodes" in out


def test_the_overlap_trace_matches_its_description():
    trace = netsim.overlap_trace(3, 6, 1000)
    world, region = trace.events[4][1:3]
    assert (world.group, world.async_op) == (None, True) and region.group == (3, 4, 5)
    assert [type(e).__name__ for e in trace.events[0][:6]] == ["Compute", "Collective", "Collective", "Wait", "Wait",
                                                               "Step"]
    assert all(len(row) == 3 * 6 for row in trace.events)


def test_the_parity_overlap_puts_the_second_all_reduce_on_even_or_odd_ranks(capsys):
    trace = netsim.overlap_trace(3, 6, 1000, parity=True)
    assert trace.events[4][2].group == (0, 2, 4) and trace.events[3][2].group == (1, 3, 5)
    assert netsim.main(["--overlap", "--parity", "--steps", "4", "--nodes", "8", "--mbytes", "1",
                        "--reference-steps", "2"]) == 0
    assert "the rank's parity of 4" in capsys.readouterr().out


def test_the_hierarchical_estimate_case_returns_its_figures(capsys):
    from exonet.estimate import estimate, simulate_estimate, with_hosts

    figures = netsim.estimate_case(hosts=2, devices=4, steps=3, params=1e7)
    assert (figures["nodes"], figures["strategy"], figures["steps"]) == (8, "ddp", 3)
    assert 0 < figures["build_seconds"] <= figures["seconds"] and figures["cpu_seconds"] > 0
    assert 0 < figures["peak_bytes"] < 2 * 2**30
    est = estimate("ddp", params=1e7, num_nodes=8, max_steps=3, step_time=1.0, dtype="bf16")
    assert figures["wall_clock_s"] == simulate_estimate(est.trace, with_hosts("cross-region", 4)).wall_clock_s
    assert netsim.main(["--estimate", "--hosts", "2", "--devices", "4", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 hosts x 4 = 8 devices, cross-region, 2 steps" in out and "GiB" in out and "s CPU" in out


def test_range_bench_replays_a_lossy_trace_with_its_range(capsys):
    assert netsim.main(["--range", "--steps", "10", "--nodes", "8"]) == 0
    out = capsys.readouterr().out
    assert "lossy: True" in out and "the range adds" in out
    p10, p90 = (float(x) for x in re.search(r"p10 ([\d.]+) s, p90 ([\d.]+) s", out).groups())
    assert p10 < p90
