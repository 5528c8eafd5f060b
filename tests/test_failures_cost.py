"""A failure always costs what it costs (issue 42): zero-length outages strike, defaults are named, waits end.

A failure of ``repair`` 0 and ``restart`` 0 is a zero-length outage: it pauses nothing, but it still throws
the rank's work since its last sync away, in the estimate, the trace replay and the worker model alike.
"""

from __future__ import annotations

import json
import math
import time
import warnings

import pytest

from exonet import Scenario, ScenarioError, Trace, simulate
from exonet.bench import failures as failures_bench
from exonet.cli import main
from exonet.netsim.failures import FailureProcess, all_up_wait
from exonet.netsim.workers import worker_goodput
from exonet.scenario import FailureSpec

NET = {"bandwidth": "100 Mbit/s", "latency": "2 ms"}
B, ALPHA = 100e6 / 8, 2e-3
HOUR = 3600.0


def diloco_trace(n: int, h: int, rounds: int, c: float, nbytes: int) -> Trace:
    """H steps of ``c`` seconds of compute, then one all-reduce of ``nbytes``, ``rounds`` times on ``n`` ranks."""
    t = Trace(num_nodes=n)
    for _ in range(rounds):
        for r in range(n):
            for _ in range(h):
                t.add_compute(r, c)
                t.add_step(r)
            t.add_collective(r, "all_reduce", nbytes)
    return t


def test_the_issue_estimate_with_only_an_mtbf_costs_goodput_and_time(tmp_path, capsys):
    """`estimate --strategy diloco:H=10 --nodes 4 --steps 40 --step-time 600` with [failures] mtbf = "2 h" alone
    reported 15 failures, goodput 100% and the 6.67 h of a run without failures."""
    head = 'name = "{}"\n[network]\nbandwidth = "1 Gbit/s"\nlatency = "10 ms"\n'
    (tmp_path / "calm.toml").write_text(head.format("calm"))
    (tmp_path / "flaky.toml").write_text(head.format("flaky") + '[failures]\nmtbf = "2 h"\n')
    args = ["estimate", "--model-params", "1e6", "--strategy", "diloco:H=10", "--nodes", "4", "--steps", "40",
            "--step-time", "600", "--json", "--scenario", str(tmp_path / "calm.toml"),
            "--scenario", str(tmp_path / "flaky.toml")]
    with pytest.warns(UserWarning, match=r'gives no restart: took the default restart = "0 s"'):
        assert main(args) == 0
    calm, flaky = json.loads(capsys.readouterr().out)["scenarios"]
    assert flaky["failures"] > 0 and flaky["goodput"] < 0.99 and flaky["lost_s"]["lost_work"] > 0
    assert flaky["wall_clock_s"] > calm["wall_clock_s"] * 1.1
    assert calm["wall_clock_s"] == pytest.approx(40 * 600, rel=0.01)


def _one_zero_length_failure(n: int, period: float, c: float, rounds: int, mtbf: float) -> tuple[int, int, float]:
    """The first seed whose run has exactly one (zero-length) failure, inside a compute stretch: (seed, rank, t0)."""
    for seed in range(500):
        spec = FailureSpec(mtbf=mtbf, seed=seed)
        hits = [(r, FailureProcess(spec, r).outage(k)[0]) for r in range(n) for k in range(3)]
        hits = [(r, t0) for r, t0 in hits if t0 < rounds * period + 2 * c]
        if len(hits) == 1 and hits[0][1] % period < c * 0.999 and hits[0][1] < (rounds - 1) * period:
            return seed, *hits[0]
    raise AssertionError("no seed in range gives one failure in compute")


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_zero_length_failure_in_the_replay_throws_away_the_round(fast_path):
    """No repair, no restart: the outage has no length, but the round's work since the last sync is redone."""
    n, h, rounds, c, nbytes = 2, 5, 6, 1.0, 1_000_000
    ar = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * nbytes / B
    period = h * c + ar
    seed, rank, t0 = _one_zero_length_failure(n, period, h * c, rounds, mtbf=40.0)
    scenario = {"name": "d", "network": NET, "failures": {"mtbf": "40 s", "seed": seed, "restart": "0 s"}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # restart is given: no warning
        res = simulate(diloco_trace(n, h, rounds, c, nbytes), scenario, fast_path=fast_path)
    j = int(t0 // period)
    u = t0 - j * period  # the work since the round's sync: thrown away, redone at once
    assert res.failures == 1
    assert res.per_node[rank].lost_s == pytest.approx(u, rel=1e-9)
    assert res.wall_clock_s == pytest.approx(t0 + h * c + ar + (rounds - j - 1) * period, rel=1e-12)
    assert res.lost["down"] == 0.0 and res.goodput < res.utilization


def test_a_failure_costs_restart_whatever_repair_is():
    """The outage is repair + restart: restart alone (repair 0) is paid, on top of the work thrown away."""
    n, h, rounds, c, nbytes = 2, 5, 6, 1.0, 1_000_000
    ar = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * nbytes / B
    period = h * c + ar
    seed, rank, t0 = _one_zero_length_failure(n, period, h * c, rounds, mtbf=40.0)
    trace = diloco_trace(n, h, rounds, c, nbytes)
    bare = simulate(trace, {"name": "d", "network": NET, "failures": {"mtbf": "40 s", "seed": seed, "restart": "0 s"}})
    # (restart moves later failures, not this one: each draw is independent of the outage lengths before it)
    paid = simulate(trace, {"name": "d", "network": NET,
                            "failures": {"mtbf": "40 s", "seed": seed, "restart": "0.5 s"}})
    assert paid.per_node[rank].lost_s == pytest.approx(bare.per_node[rank].lost_s, rel=1e-9)
    assert paid.wall_clock_s == pytest.approx(bare.wall_clock_s + 0.5, rel=1e-9)
    assert paid.lost["down"] == pytest.approx(0.5, rel=1e-9)


def test_a_failures_table_without_restart_warns_naming_the_default():
    trace = diloco_trace(2, 2, 2, 1.0, 1000)
    with pytest.warns(UserWarning, match=r'^scenario: \[failures\] gives no restart: took the default restart = '
                                         r'"0 s".*set failures.restart'):
        simulate(trace, {"name": "d", "network": NET, "failures": {"mtbf": "100 h"}})
    with pytest.warns(UserWarning, match="gives no restart"):
        worker_goodput(Scenario.from_dict({"name": "c", "network": NET, "failures": {"mtbf": "1000 h"}}),
                        100, elastic=False, horizon_s=HOUR)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # elastic workers stall pause, not restart: nothing to warn about
        worker_goodput(Scenario.from_dict({"name": "c", "network": NET, "failures": {"mtbf": "1000 h"}}),
                        100, horizon_s=HOUR)


def test_a_worker_throws_away_its_work_since_its_last_sync():
    """Decoupled DiLoCo, not elastic, no restart: each failure restarts the worker's round of S seconds, so
    g = λS / (e^(λS) − 1) with λ = chips / mtbf (before: goodput 1, failures for free)."""
    s = Scenario.from_dict({"name": "c", "network": NET, "failures": {"mtbf": "1000 h", "restart": "0 s"}})
    free = worker_goodput(s, 1000, 1, elastic=False, horizon_s=500 * HOUR)
    assert free.failures > 400 and free.goodput == pytest.approx(1.0) and free.lost == 0.0  # syncing always: none lost
    r = worker_goodput(s, 1000, 1, elastic=False, horizon_s=500 * HOUR, sync_s=600.0)
    lam_s = 1000 / (1000 * HOUR) * 600.0
    g = lam_s / math.expm1(lam_s)
    assert r.goodput == pytest.approx(g, abs=0.01) and r.goodput < 0.95
    assert r.goodput + r.stalled + r.missing + r.lost == pytest.approx(1.0) and r.stalled == 0.0


@pytest.mark.parametrize("horizon", [1e300, math.inf, math.nan, -1.0])
def test_an_absurd_worker_horizon_is_refused_at_once(horizon):
    s = Scenario.from_dict({"name": "c", "network": NET, "failures": {"mtbf": "1000 h", "pause": "1 s"}})
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"^worker_goodput: horizon_s"):
        worker_goodput(s, 1000, horizon_s=horizon)
    assert time.perf_counter() - start < 1.0


def test_a_wait_for_all_up_that_cannot_end_is_refused_naming_repair():
    """mtbf 1 h, repair 10 h, K = 8: all eight up at once (1/11)^8 of the time (the replay spun past 300 s)."""
    trace = diloco_trace(8, 1, 2, 600.0, 1000)
    start = time.perf_counter()
    with pytest.raises(ScenarioError, match=r"^scenario: failures\.repair: 10 h \(plus restart 0 s\) against mtbf "
                                            r"1 h .* p\^8 = 4\.67e-09 .*a replay without end"):
        simulate(trace, {"name": "x", "network": NET, "failures": {"mtbf": "1 h", "repair": "10 h", "restart": "0 s"}})
    assert time.perf_counter() - start < 5.0
    assert all_up_wait(FailureSpec(mtbf=50 * HOUR, repair=2 * HOUR), 256) == pytest.approx(2.2e4, rel=0.05)


def test_outages_are_indexed_a_256_node_replay_through_a_quarter_million_failures_ends():
    """mtbf 50 h, repair 2 h, 256 nodes, 100 steps: every wait for all 256 up draws ~2·10^4 failures (ran past
    120 s when each wait rescanned every outage drawn); the figure is the bench's, this a generous bound."""
    figures = failures_bench.main(["--nodes", "256", "--steps", "100"])
    assert figures["failures"] > 10**5 and figures["seconds"] < 60
