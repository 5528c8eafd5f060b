"""Failures in simulated time: the failure process, what a failure costs a replay, and goodput."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from exonet import LocalTrainer, Scenario, ScenarioError, Trace, simulate
from exonet.netsim import Simulation
from exonet.netsim import failures as failure_model
from exonet.netsim.compute import ComputeModel
from exonet.netsim.failures import FailureProcess
from exonet.scenario import FailureSpec
from exonet.strategies import DDPStrategy, DiLoCoStrategy, OptimSpec
from exonet.strategies.base import flatten
from exonet.toy import synthetic_classification, tiny_mlp
from exonet.trace import Collective, Discard

NET = {"bandwidth": "100 Mbit/s", "latency": "2 ms"}
B, ALPHA = 100e6 / 8, 2e-3


def scenario(**failures) -> Scenario:
    return Scenario.from_dict({"name": "failing", "network": NET, "failures": failures})


def ddp_trace(n: int, steps: int, c: float, nbytes: int) -> Trace:
    t = Trace(num_nodes=n)
    for _ in range(steps):
        for r in range(n):
            t.add_compute(r, c)
            t.add_collective(r, "all_reduce", nbytes)
            t.add_step(r)
    return t


def up_times(p: FailureProcess, k: int) -> np.ndarray:
    starts = np.array([p.outage(i)[0] for i in range(k)])
    ends = np.array([0.0] + [p.outage(i)[1] for i in range(k - 1)])
    return starts - ends


def test_draws_are_reproducible_and_their_means_match_within_sampling_error():
    spec = FailureSpec(mtbf=3600.0, repair=600.0, restart=120.0, distribution="lognormal", sigma=0.8, seed=7)
    a, b = FailureProcess(spec, 3), FailureProcess(spec, 3)
    b.through(1e6)  # drawn in another order and further: the same outages
    assert [a.outage(i) for i in range(50)] == b.outages[:50]
    assert FailureProcess(spec, 4).outage(0) != a.outage(0)
    n = 20_000
    ups = up_times(a, n)
    assert abs(ups.mean() - 3600.0) < 4 * 3600.0 / math.sqrt(n)  # Exp(mtbf): sd = mtbf
    downs = np.array([t1 - t0 for t0, t1 in (a.outage(i) for i in range(n))]) - 120.0
    sd = 600.0 * math.sqrt(math.exp(0.8**2) - 1)  # a lognormal of mean 600
    assert abs(downs.mean() - 600.0) < 4 * sd / math.sqrt(n)
    exp = FailureProcess(FailureSpec(mtbf=10.0, repair=3.0, distribution="exponential"), 0)
    repairs = np.array([t1 - t0 for t0, t1 in (exp.outage(i) for i in range(n))])
    assert abs(repairs.mean() - 3.0) < 4 * 3.0 / math.sqrt(n)
    fixed = FailureProcess(FailureSpec(mtbf=10.0, repair=3.0, restart=1.0), 0)
    assert [t1 - t0 for t0, t1 in (fixed.outage(i) for i in range(100))] == pytest.approx([4.0] * 100, abs=1e-9)


def test_a_ranks_outages_do_not_depend_on_the_node_count():
    s = scenario(mtbf="30 s", repair="5 s", seed=3)
    small, large = ComputeModel(s.resolve(2)), ComputeModel(s.resolve(6))
    assert small.failures_through(1, 500.0) == large.failures_through(1, 500.0)
    assert len(small.failures_through(1, 500.0)) > 5 and small.down[1] == large.down[1]
    assert large.failures_through(0, 500.0) != large.failures_through(1, 500.0)


def _one_failure(n: int, steps: int, c: float, ar: float, seed_range: range, **failures):
    """The first seed whose run has exactly one failure, during a compute span: (seed, rank, its outage)."""
    period = c + ar
    for seed in seed_range:
        spec = FailureSpec(seed=seed, **failures)
        hits = []
        for r in range(n):
            p = FailureProcess(spec, r)
            hits += [(r, p.outage(k)) for k in range(3)
                     if p.outage(k)[0] < steps * period + 2 * (spec.repair + spec.restart + c)]
        if len(hits) == 1:
            r, (t0, t1) = hits[0]
            if t0 % period < c * 0.999 and t0 < (steps - 1) * period:
                return seed, r, t0, t1
    raise AssertionError("no seed in range gives one failure in compute")


@pytest.mark.parametrize("fast_path", [True, False])
def test_one_failure_in_a_ddp_run_costs_its_closed_form(fast_path):
    n, steps, c, nbytes = 4, 30, 2.0, 1_000_000
    ar = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * nbytes / B  # ring all-reduce
    seed, rank, t0, t1 = _one_failure(n, steps, c, ar, range(200), mtbf=600.0, repair=25.0, restart=5.0)
    res = simulate(ddp_trace(n, steps, c, nbytes), Scenario.from_dict(
        {"name": "one", "network": NET,
         "failures": {"mtbf": "600 s", "repair": "25 s", "restart": "5 s", "seed": seed}}),
        fast_path=fast_path)
    period = c + ar
    j = int(t0 // period)
    u = t0 - j * period  # compute the failed node had done in step j: thrown away, redone after the outage
    wall = t1 + c + ar + (steps - j - 1) * period
    assert res.failures == 1
    assert res.wall_clock_s == pytest.approx(wall, rel=1e-12)
    assert res.per_node[rank].lost_s == pytest.approx(u, rel=1e-9)
    assert res.per_node[rank].compute_s == pytest.approx(steps * c + u, rel=1e-12)
    assert res.goodput == pytest.approx(steps * c / wall, rel=1e-12)
    lost = res.lost
    assert lost["lost_work"] == pytest.approx(u, rel=1e-9) and lost["down"] == pytest.approx(t1 - t0, rel=1e-12)
    assert lost["comm"] == pytest.approx(n * steps * ar, rel=1e-9)
    assert res.goodput * n * wall + sum(lost.values()) == pytest.approx(n * wall, rel=1e-12)
    assert res.wire_bytes == simulate(ddp_trace(n, steps, c, nbytes), {"name": "ok", "network": NET}).wire_bytes


def test_a_failure_in_a_diloco_round_throws_away_the_round():
    """No collective for H steps: a failure loses every step since the last outer sync."""
    n, H, rounds, c, nbytes = 2, 5, 6, 1.0, 1_000_000
    ar = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * nbytes / B
    t = Trace(num_nodes=n)
    for _ in range(rounds):
        for r in range(n):
            for _ in range(H):
                t.add_compute(r, c)
                t.add_step(r)
            t.add_collective(r, "all_reduce", nbytes)
    period = H * c + ar
    seed, rank, t0, t1 = _one_failure(n, rounds, H * c, ar, range(400), mtbf=40.0, repair=3.0)
    res = simulate(t, {"name": "d", "network": NET, "failures": {"mtbf": "40 s", "repair": "3 s", "seed": seed}})
    j = int(t0 // period)
    u = t0 - j * period
    assert res.per_node[rank].lost_s == pytest.approx(u, rel=1e-9)
    assert res.wall_clock_s == pytest.approx(t1 + H * c + ar + (rounds - j - 1) * period, rel=1e-12)


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    t = ddp_trace(3, 40, 1.0, 100_000)
    a, b = simulate(t, scenario(mtbf="20 s", repair="4 s", restart="1 s", seed=5)), \
        simulate(t, scenario(mtbf="20 s", repair="4 s", restart="1 s", seed=5))
    other = simulate(t, scenario(mtbf="20 s", repair="4 s", restart="1 s", seed=6))
    assert a.failures > 2
    assert (a.wall_clock_s, a.per_node, a.step_end_times) == (b.wall_clock_s, b.per_node, b.step_end_times)
    assert other.wall_clock_s != a.wall_clock_s


def test_without_failures_goodput_is_utilization_and_nothing_is_lost():
    res = simulate(ddp_trace(4, 10, 1.0, 1_000_000), {"name": "ok", "network": NET})
    assert res.failures == 0 and res.goodput == res.utilization
    assert res.lost["lost_work"] == res.lost["down"] == 0.0


def test_describe_shows_the_expected_failures():
    s = scenario(mtbf="50 h", repair="10 min", restart="2 min", seed=0)
    text = s.describe(8)
    assert "expected failures: 8 nodes x T / 50.2 h" in text and f"{8 * 3600 / (50.2 * 3600):.4g} per hour" in text
    assert s.resolve(8).failures.expected_failures(8, 3600.0) == pytest.approx(8 / 50.2)


@pytest.mark.parametrize("failures, message", [
    ({"repair": "1 s"}, "failures: missing required key `mtbf`"),
    ({"mtbf": "0 s"}, "failures.mtbf"),
    ({"mtbf": "1 h", "sigma": 0.5}, "sigma: applies only to distribution = 'lognormal'"),
    ({"mtbf": "1 h", "repair": "1 s", "distribution": "lognormal"}, "sigma: is required"),
    ({"mtbf": "1 h", "distribution": "exponential"}, "set repair > 0"),
    ({"mtbf": "1 h", "distributon": "fixed"}, "did you mean 'distribution'"),
    ({"mtbf": "1 h", "distribution": "weibull"}, "expected one of: fixed, exponential, lognormal"),
])
def test_a_bad_failures_table_is_a_clear_error(failures, message):
    with pytest.raises(ScenarioError, match=message):
        scenario(**failures)


def test_failures_during_collectives_replay_alike_on_both_paths_and_fed_step_by_step():
    """Outages that stop flows in flight: the fast path, the event path and incremental feeding agree."""
    t = ddp_trace(3, 12, 0.001, 2_000_000)
    s = scenario(mtbf="0.3 s", repair="0.05 s", restart="0.01 s", seed=1)
    whole, slow = simulate(t, s), simulate(t, s, fast_path=False)
    sim = Simulation(s.resolve(3))
    for step in range(12):
        for r in range(3):
            for e in t.events[r][3 * step : 3 * step + 3]:
                sim.feed(r, e)
            sim.run_until_blocked()
    fed = sim.result()
    assert whole.failures > 3
    assert whole.wall_clock_s == pytest.approx(slow.wall_clock_s, rel=1e-12) == pytest.approx(fed.wall_clock_s,
                                                                                                rel=1e-12)
    assert [p.comm_s for p in whole.per_node] == pytest.approx([p.comm_s for p in fed.per_node], rel=1e-12)


def test_an_elastic_round_loses_exactly_the_failed_nodes_work_and_sends_it_the_state():
    """Ranks 0 and 2 stay up and average; rank 1 discards its round and receives the state (P bytes) from rank 0."""
    c, S, P = 3.0, 1_000_000, 2_500_000
    t = Trace(num_nodes=3)
    for r in range(3):
        t.add_compute(r, c)
    t.add_compute(1, 0.5)  # more work since the last sync: all of it is lost
    for r in (0, 2):
        t.add_collective(r, "all_reduce", S, group=(0, 2))
    sent = t.add_collective(0, "send", P, group=(0, 1), async_op=True)
    t.add_discard(1)
    t.add_collective(1, "recv", P, group=(0, 1), async_op=True)
    for r in range(3):
        t.add_compute(r, c)
        t.add_collective(r, "all_reduce", S)
        t.add_step(r)
    t.add_wait(0, sent)
    res = simulate(t, {"name": "ideal", "network": NET})
    assert res.per_node[1].lost_s == pytest.approx(c + 0.5, rel=1e-12)
    assert res.lost["lost_work"] == pytest.approx(c + 0.5, rel=1e-12)
    assert res.goodput == pytest.approx(5 * c / (3 * res.wall_clock_s), rel=1e-12)  # rank 1 keeps only its second c
    ar2, ar3 = 2 * ALPHA + S / B, 4 * ALPHA + 4 / 3 * S / B
    assert res.wire_bytes == [round(S + P + 4 / 3 * S), round(4 / 3 * S), round(S + 4 / 3 * S)]
    assert res.wall_clock_s == pytest.approx(max(c + ar2, c + 0.5) + c + ar3, rel=1e-12)
    assert Trace.load(t.save(Path(tempfile.mkdtemp()) / "t.trace")).events == t.events  # Discard survives a file


# ----------------------------------------------------------------- elastic strategies in real processes
class _Consistent:
    """Checks after every sync that every node in the run (not out, down) holds the same parameters, bit for bit."""

    def check(self) -> None:
        with torch.no_grad(), self.comm.bookkeeping():
            present = torch.zeros(self.num_nodes)
            present[self.rank] = 0.0 if self.comm.sitting_out else 1.0
            present = self.comm.untraced_all_reduce(present)
            source = int(present.nonzero()[0])
            mine = flatten(self.params)
            theirs = self.comm.untraced_broadcast(mine.clone(), source)
            if present[self.rank] and not torch.equal(mine, theirs):
                raise AssertionError(f"rank {self.rank}: parameters differ from rank {source}'s "
                                     f"after step {self.local_step}")


class CheckedDDP(_Consistent, DDPStrategy):
    def step(self) -> None:
        super().step()
        self.check()


class CheckedDiLoCo(_Consistent, DiLoCoStrategy):
    def step(self) -> None:
        super().step()
        if self.local_step % self.H == 0:
            self.check()


FAILING = Scenario.from_dict({
    "name": "failing", "network": {"bandwidth": "1 Gbit/s", "latency": "1 ms"},
    "compute": {"mode": "flops", "tflops": 1e-6, "mfu": 1.0},
    "failures": {"mtbf": "0.3 s", "repair": "0.02 s", "restart": "0.01 s", "seed": 1},
})


def elastic_fit(strategy):
    data, val = synthetic_classification(512, 8, 4), synthetic_classification(128, 8, 4, train=False)
    return LocalTrainer(tiny_mlp(), data, val).fit(strategy, num_nodes=3, max_steps=12, batch_size=16, seed=0,
                                                   scenario=FAILING, val_size=64, progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "diloco"])
def test_elastic_nodes_hold_the_same_parameters_after_every_sync_through_failures(name):
    strategy = CheckedDDP(OptimSpec("adamw", lr=0.01), elastic=True) if name == "ddp" else \
        CheckedDiLoCo(OptimSpec("sgd", lr=0.1), H=3, elastic=True)
    r = elastic_fit(strategy)  # a node whose parameters differ raises, and fit raises NodeFailure
    sim = r.sim
    assert sim.failures > 0 and r.simulate(FAILING).wall_clock_s == pytest.approx(sim.wall_clock_s, rel=1e-12)
    discards = [q for q in range(3) for e in r.trace.events[q] if isinstance(e, Discard)]
    sends = [e for e in r.trace.events[0] + r.trace.events[1] + r.trace.events[2]
             if isinstance(e, Collective) and e.op == "send"]
    assert discards and 0 < len(sends) <= len(discards)  # a failed node discards each round it is out, then rejoins
    params = sum(p.numel() for p in tiny_mlp().parameters())
    tensors = len(list(tiny_mlp().parameters()))
    # DDP sends the parameters and AdamW's two moments and step per tensor; DiLoCo θ_global and the outer momentum
    state = 4 * (3 * params + tensors) if name == "ddp" else 4 * 2 * params
    assert {e.nbytes for e in sends} == {state}
    subgroups = {e.group for q in range(3) for e in r.trace.events[q]
                 if isinstance(e, Collective) and e.op == "all_reduce"}
    assert any(g is not None for g in subgroups)  # some rounds averaged without a failed node
    assert sim.lost["lost_work"] > 0 and sim.goodput < sim.utilization


def test_elastic_needs_the_clock_and_excludes_deadlines():
    with pytest.raises(ValueError, match="elastic.*deadline_s"):
        DiLoCoStrategy(H=2, elastic=True, deadline_s=1.0)
    with pytest.raises(TypeError, match="elastic must be True or False"):
        DDPStrategy(elastic="yes")
    trainer = LocalTrainer(tiny_mlp(), synthetic_classification(64, 8, 4))
    with pytest.raises(ValueError, match="scenario"):
        trainer.fit(DDPStrategy(elastic=True), num_nodes=2, max_steps=2, progress=False)


def test_compare_shows_a_goodput_column_only_under_failures():
    from exonet import compare

    t = ddp_trace(3, 20, 1.0, 100_000)
    failing = scenario(mtbf="10 s", repair="2 s", seed=2)
    table = compare({"ddp": t}, [failing, {"name": "ok", "network": NET}])
    with_failures, without = table.rows
    assert with_failures["goodput"] == simulate(t, failing).goodput < with_failures["utilization"]
    assert "goodput" not in without and "| goodput |" in table.to_markdown()
    assert "goodput" not in compare({"ddp": t}, [{"name": "ok", "network": NET}]).to_markdown()


@pytest.mark.slow
def test_the_failures_study_example_tabulates_goodput_for_six_strategies(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    plot = tmp_path / "failures.png"
    proc = subprocess.run([sys.executable, str(root / "examples" / "failures_study.py"), "--steps", "10", "--H", "5",
                           "--deadline", "6", "--mtbf", "30", "--plot", str(plot)],
                          capture_output=True, text=True, timeout=400, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "%" in line]
    assert len(rows) == 6 and plot.exists()
    goodput = {row.split(" | ")[0][2:]: float(row.split(" | ")[3].rstrip("%")) for row in rows}
    assert goodput["elastic DDP"] > goodput["DDP (blocking)"]


def test_an_elastic_node_out_at_the_end_does_not_extend_the_run():
    """Rank 1 goes down mid-step and sits out to the end: the run ends with rank 0, and only the part of
    rank 1's time inside the run is counted (5 s of compute, all of it thrown away, then down)."""
    c = 10.0
    t = Trace(num_nodes=2, meta={"elastic": True})
    for _ in range(2):
        t.add_compute(0, c)
        t.add_step(0)
    t.add_compute(1, c)  # paused by the outage at 5 s; resumes at 100 s
    for _ in range(2):
        t.add_discard(1)
        t.add_step(1)
    down = {"kind": "down", "ranks": [1], "from_s": 5.0, "to_s": 100.0}
    res = simulate(t, {"name": "out", "network": NET, "events": [down]})
    assert res.wall_clock_s == 2 * c
    assert res.step_end_times == [c, 2 * c]
    one = res.per_node[1]
    assert (one.compute_s, one.comm_s, one.idle_s, one.lost_s, one.down_s) == (5.0, 0.0, 15.0, 5.0, 15.0)
    assert res.goodput == (2 * c + 5.0 - 5.0) / (2 * 2 * c)
    assert res.utilization == (2 * c + 5.0) / (2 * 2 * c)
    assert res.timelines[1].end == 2 * c and max(res.timelines[1].times) == 2 * c


@pytest.mark.slow
def test_an_elastic_estimate_goes_on_without_its_failed_nodes():
    """Elastic DDP estimated on the online clock: the nodes that stay up never wait for one that is down,
    so the run takes its steps' compute (plus all-reduces) and each failure loses at most one step's work."""
    from exonet.estimate import estimate, simulate_estimate

    failing = Scenario.from_dict({"name": "failing", "network": {"bandwidth": "400 Gbit/s", "latency": "10 us"},
                                  "failures": {"mtbf": "20 min", "repair": "5 min", "restart": "2 min", "seed": 0}})
    steps, step_time = 30, 10.0
    est = estimate("ddp:elastic=True", params=1e6, num_nodes=6, max_steps=steps, step_time=step_time, scenario=failing)
    res = simulate_estimate(est, failing)
    assert res.failures >= 2
    assert steps * step_time < res.wall_clock_s < steps * step_time * 1.01
    assert res.lost["lost_work"] <= res.failures * step_time
    blocking = simulate_estimate(estimate("ddp", params=1e6, num_nodes=6, max_steps=steps, step_time=step_time),
                                 failing)
    assert blocking.wall_clock_s > res.wall_clock_s + 7 * 60  # it waits out each repair and restart


@pytest.mark.slow
def test_the_failures_at_scale_example_compares_elastic_ddp_with_workers():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / "failures_at_scale.py"
    spec = importlib.util.spec_from_file_location("failures_at_scale", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = {row["strategy"]: row for row in module.main(["--steps", "60", "--device-mtbf", "100"])}
    assert len(rows) == 6 and all(row["failures"] > 0 for row in rows.values())
    assert rows["elastic DDP, 16 replicas"]["goodput"] > rows["DDP (blocking), 16 replicas"]["goodput"]
    for row in rows.values():  # goodput and the node-seconds lost account for all of the machine time
        machine = row["nodes"] * row["wall_clock_s"]
        assert row["goodput"] * machine + sum(row["lost"].values()) == pytest.approx(machine, rel=1e-9)


def test_servers_fail_like_any_rank_unless_failures_servers_is_false():
    """The last rank serves (trace meta "servers"): with servers = false it is never down, the trainers
    still fail, and the run no longer waits out the server's outages."""
    t = ddp_trace(3, 40, 1.0, 100_000)
    t.meta["servers"] = 1
    failing = dict(mtbf="20 s", repair="4 s", restart="1 s", seed=5)
    both, trainers = simulate(t, scenario(**failing)), simulate(t, scenario(**failing, servers=False))
    assert both.per_node[2].down_s > 0 and trainers.per_node[2].down_s == 0
    assert 0 < trainers.failures < both.failures and trainers.wall_clock_s < both.wall_clock_s
    assert "server ranks do not fail" in Scenario.from_dict(
        {"name": "f", "network": NET, "failures": {**failing, "servers": False}}).describe()
    with pytest.raises(ScenarioError, match="failures.servers: expected true or false"):
        scenario(mtbf="20 s", servers="no")


def test_utilisation_goodput_and_lost_time_count_the_trainers_not_the_server():
    """Two trainers compute 1 s a step and send 1 MB to the server (the last rank, trace meta "servers"), which
    only receives: they never wait (a message flows as its sender issues it), so utilisation is 1, where
    counting the server would cap it at 2/3, and the trainers' machine time is all accounted for."""
    steps, c, nbytes = 5, 1.0, 1_000_000
    t = Trace(num_nodes=2, meta={"servers": 1})  # two trainers, then the server
    for _ in range(steps):
        for r in (0, 1):
            t.add_compute(r, c)
            t.add_collective(r, "send", nbytes, group=(r, 2), async_op=True)
            t.add_step(r)
        for r in (0, 1):
            t.add_collective(2, "recv", nbytes, group=(r, 2))
    res = simulate(t, Scenario.from_dict({"name": "calm", "network": NET}))
    last = 2 * nbytes / B + ALPHA  # the last two messages, after the last compute, share the server's downlink
    assert res.wall_clock_s == pytest.approx(steps * c + last, rel=1e-9)
    assert res.servers == 1 and res.utilization == pytest.approx(2 * steps * c / (2 * res.wall_clock_s), rel=1e-12)
    machine = 2 * res.wall_clock_s
    assert res.goodput * machine + sum(res.lost.values()) == pytest.approx(machine, rel=1e-12)


def test_a_failure_process_that_would_take_unbounded_work_is_refused_with_the_bound(tmp_path):
    """mtbf 1 ms against 20 ms of compute between syncs: e^20 tries per step (the old replay spun for ever)."""
    trace = ddp_trace(2, 3, 0.02, 1000).save(tmp_path / "t.jsonl")
    toml = tmp_path / "s.toml"
    toml.write_text('name = "flaky"\n[network]\nbandwidth = "100 Mbit/s"\n[failures]\nmtbf = "1 ms"\nrepair = "1 ms"\n')
    done = subprocess.run([sys.executable, "-m", "exonet", "simulate", str(trace), "--scenario", str(toml)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert re.search(r"error: scenario: failures.mtbf: 1 ms makes this replay expect more than 1,000,000 failures, "
                     r"work without bound: .* rank 0 computes 20 ms between syncs, which takes e\^20 = 4.85e\+08 "
                     r"tries on average", done.stderr), done.stderr


def test_a_failure_process_drawing_past_the_bound_is_refused(monkeypatch):
    """Failures while ranks wait on the network cost no redone work but still one draw each: counted too."""
    monkeypatch.setattr(failure_model, "MAX_FAILURES", 100)
    t = ddp_trace(2, 2, 1e-6, 10**8)  # 16 s of all-reduce per step at 100 Mbit/s: about 1,600 failures
    with pytest.raises(ScenarioError, match=r"^scenario: failures.mtbf: 10 ms makes this replay draw more than 100 "
                                            r"failures by .* of simulated time; raise failures.mtbf"):
        simulate(t, scenario(mtbf="10 ms", repair="10 ms"))
    assert simulate(ddp_trace(2, 2, 1e-6, 10**5), scenario(mtbf="10 ms", repair="10 ms")).failures < 100


@pytest.mark.parametrize("start", [5.0, 10.5])
def test_an_outage_inside_a_collective_is_waiting_not_comm(start: float) -> None:
    """Issue 33's reproduction: 10 s of compute, a 100 MB all-reduce, rank 1 down for 100 s from ``start``.

    Down before the collective or inside it, rank 0 waits 100 s for rank 1 either way (it was booked as
    100.8 s of comm when the outage began inside the collective)."""
    t = Trace(num_nodes=2)
    for r in range(2):
        t.add_compute(r, 10.0)
        t.add_collective(r, "all_reduce", 100_000_000)
        t.add_step(r)
    sc = {"name": "x", "network": {"bandwidth": "1 Gbit/s"},
          "events": [{"kind": "down", "ranks": [1], "from_s": start, "to_s": start + 100}]}
    lost = simulate(t, sc).lost
    assert lost["waiting"] == pytest.approx(100.0) and lost["comm"] == pytest.approx(1.6)
    assert lost["down"] == pytest.approx(100.0)
