"""The netsim benchmark runs end to end on a small size and reports its figures."""

from __future__ import annotations

from exonet.bench import netsim


def test_bench_reports_events_per_second(capsys):
    assert netsim.main(["--steps", "20", "--nodes", "8", "--mbytes", "1"]) == 0
    out = capsys.readouterr().out
    assert "480 events in" in out and "events/s" in out and "simulated wall-clock" in out
