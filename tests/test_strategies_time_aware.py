"""Asynchronous and time-aware runs reported right (issue 20, items 1-7), each from its reproduction."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from exonet import LocalTrainer, Scenario, ScenarioError, compare, simulate
from exonet.errors import DivergenceError
from exonet.runtime.divergence import DivergenceWatch
from exonet.strategies import AsyncDiLoCoStrategy, DDPStrategy, OptimSpec, Strategy
from exonet.strategies.base import NodeContext, flatten, unflatten_into
from exonet.toy import synthetic_classification, tiny_mlp

TWO_REGIONS = {
    "name": "two-regions", "network": {"bandwidth": "1 Gbit/s", "latency": "1 ms"},
    "compute": {"mode": "flops", "tflops": 1e-5, "mfu": 1.0},
    "regions": [{"name": "us", "share": 0.5}, {"name": "eu", "share": 0.5}],
    "links": [{"between": ["us", "eu"], "bandwidth": "100 Mbit/s", "latency": "20 ms"}],
    "nodes": [{"share": 0.25, "speed": 0.25}],
}
STEP_S = 0.0014336  # a step of tiny_mlp on 16 rows at speed 1: its FLOPs at 1e-5 TFLOP/s
BUDGET = 0.1


# ---------------------------------------------------------------- 1. a server never moves the trainers
def test_a_server_rank_does_not_move_the_trainers_and_lives_where_the_scenario_says():
    s = Scenario.from_dict(TWO_REGIONS)
    assert s.resolve(5).region == ("us", "us", "us", "eu", "eu")  # five trainers: 3 + 2
    placed = s.resolve(5, servers=1)
    assert placed.region == ("us", "us", "eu", "eu", "us")  # four trainers 2 + 2; the server in rank 0's region
    assert placed.speed == (1.0, 1.0, 1.0, 0.25, 1.0)  # the slow quarter is of the trainers, not the server
    there = Scenario.from_dict({**TWO_REGIONS, "server": {"region": "eu"}})
    assert there.resolve(5, servers=1).region == ("us", "us", "eu", "eu", "eu")
    assert "server      region eu" in there.describe()
    assert "server      rank 0's region" in s.describe()
    with pytest.raises(ScenarioError, match=r"server.region: 'asia' is not a region of this scenario; regions: 'us'"):
        Scenario.from_dict({**TWO_REGIONS, "server": {"region": "asia"}})


# ---------------------------------------------------------------- 5. divergence
def test_a_non_finite_or_runaway_loss_raises_naming_rank_and_step_or_warns_once():
    watch = DivergenceWatch("raise")
    watch.check(0, 0, 2.3)
    watch.check(0, 1, 22.0)  # under 10x the first loss
    with pytest.raises(DivergenceError, match=r"rank 0 at step 2: the training loss 973 is over 10x its first"):
        watch.check(0, 2, 973.0)
    with pytest.raises(DivergenceError, match=r"rank 3 at step 0: the training loss is nan") as info:
        watch.check(3, 0, math.nan)
    assert (info.value.rank, info.value.step) == (3, 0)
    warn = DivergenceWatch("warn")
    with pytest.warns(UserWarning, match=r"training diverged on rank 1 at step 4: the training loss is inf"):
        warn.check(1, 4, math.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn.check(1, 5, math.inf)  # once per rank
        DivergenceWatch("ignore").check(0, 0, math.nan)
    with pytest.raises(ValueError, match="on_divergence must be one of 'raise', 'warn', 'ignore', got 'stop'"):
        DivergenceWatch("stop")


def test_async_diloco_defaults_to_delayed_nesterov_over_the_trainers():
    s = AsyncDiLoCoStrategy()
    model = torch.nn.Linear(3, 1)
    s.setup(model, None, NodeContext(3, 3, 10, 0, torch.device("cpu")))  # the server of 3 trainers
    assert s.delayed_nesterov == 3 and not hasattr(s, "outer_optimizer")
    with pytest.raises(ValueError, match="pass delayed_nesterov=None for a naive outer step"):
        AsyncDiLoCoStrategy(outer_optim_spec="adam")
    assert AsyncDiLoCoStrategy(outer_optim_spec="adam", delayed_nesterov=None).delayed_nesterov is None


@pytest.mark.slow
def test_a_diverging_fit_stops_with_the_rank_and_step_or_warns():
    data = synthetic_classification(256, 8, 4)
    with pytest.raises(DivergenceError, match=r"training diverged on rank \d at step \d+"):
        LocalTrainer(tiny_mlp(), data).fit(DDPStrategy(OptimSpec("sgd", lr=1e6)), num_nodes=2, max_steps=12,
                                           batch_size=16, val_size=0, progress=False)
    with pytest.warns(UserWarning, match=r"training diverged on rank 0 at step \d+"):
        result = LocalTrainer(tiny_mlp(), data).fit(DDPStrategy(OptimSpec("sgd", lr=1e6)), num_nodes=2, max_steps=12,
                                                    batch_size=16, val_size=0, progress=False, on_divergence="warn")
    assert len(result.history["train_loss"]) == 12


# ---------------------------------------------------------------- 7. the clock and all_reduce's op
class AdaptiveStrategy(Strategy):
    """Averages gradients, and checks what a network-adaptive strategy needs: the clock and every reduce op."""

    def step(self) -> None:
        clock = self.comm.clock
        if clock is None:
            raise AssertionError("no clock although fit has a scenario")
        # ring all-reduce of 1 MB over 2 nodes at 8 Mbit/s (1 MB/s), no latency: 2(n-1)/n * S/B = 1 s exactly
        took = clock.ask(("transfer", "all_reduce", 1_000_000, None), self.comm.take_events())
        if took != pytest.approx(1.0, rel=1e-12):
            raise AssertionError(f"transfer: {took}")
        if not clock.ask(("now",), self.comm.take_events()) >= 0:
            raise AssertionError("now")
        r = float(self.rank + 1)
        for op, want in (("sum", 3.0), ("mean", 1.5), ("max", 2.0), ("min", 1.0)):
            got = self.comm.all_reduce(torch.full((2,), r), op=op)
            if got.tolist() != [want, want]:
                raise AssertionError(f"all_reduce {op}: {got.tolist()}")
        grads = [p.grad for p in self.params]
        flat = self.comm.all_reduce(flatten(grads), op="mean")
        unflatten_into(flat, grads)
        self.optimizer_step()


@pytest.mark.slow
def test_a_strategy_has_the_clock_whenever_fit_has_a_scenario_and_all_reduce_takes_torchs_ops():
    measured = Scenario.from_dict({"name": "eight-mbit", "network": {"bandwidth": "8 Mbit/s"}})  # measured compute
    result = LocalTrainer(tiny_mlp(), synthetic_classification(128, 8, 4)).fit(
        AdaptiveStrategy(OptimSpec("sgd", lr=0.1)), num_nodes=2, max_steps=3, batch_size=16, val_size=0,
        progress=False, scenario=measured)
    assert result.sim_wall_clock_s == simulate(result.trace, measured).wall_clock_s  # replayed as without a clock
    ops = [c.op for c in result.trace.collectives(0)]
    assert ops == ["all_reduce"] * 15  # four ops and the gradients, each step


# ---------------------------------------------------------------- 2, 3, 4, 6: one asynchronous run
@pytest.fixture(scope="module")
def async_run():
    data, val = synthetic_classification(256, 8, 4), synthetic_classification(64, 8, 4, train=False)
    scenario = Scenario.from_dict(TWO_REGIONS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = LocalTrainer(tiny_mlp(), data, val).fit(
            AsyncDiLoCoStrategy(OptimSpec("sgd", lr=0.1), H=4), num_nodes=4, batch_size=16, seed=0,
            scenario=scenario, max_sim_time_s=BUDGET, val_interval=3, val_size=64, progress=False)
    return result, scenario, caught


@pytest.mark.slow
def test_an_async_run_evaluates_its_final_model_at_its_final_time(async_run):
    result, _, _ = async_run
    evals = result.history["eval"]
    updates = sum(1 for c in result.trace.collectives(4) if c.op == "recv")
    assert max(e["updates"] for e in evals) == updates  # the final model was evaluated ...
    assert evals[-1]["sim_time_s"] == result.sim_wall_clock_s  # ... and the curve reaches the end of the run
    assert evals[-1]["loss"] == max(evals[:-1], key=lambda e: e["updates"])["loss"]


@pytest.mark.slow
def test_a_time_budget_alone_trains_over_further_epochs(async_run):
    result, _, caught = async_run
    per_epoch = 256 // 4 // 16
    assert result.trace.num_steps(0) > 2 * per_epoch  # the fastest trainer went round its shard several times
    assert result.sim_wall_clock_s >= BUDGET
    assert not [w for w in caught if "stopped at step" in str(w.message)]


@pytest.mark.slow
def test_a_node_that_stops_before_the_budget_says_which_rank_when_and_why():
    data = synthetic_classification(256, 8, 4)
    with pytest.warns(UserWarning, match=r"rank 0 stopped at step 4, at 0\.010 s simulated, before the "
                                         r"max_sim_time_s budget of 0\.1 s: it reached max_steps=4"):
        result = LocalTrainer(tiny_mlp(), data).fit(
            AsyncDiLoCoStrategy(OptimSpec("sgd", lr=0.1), H=2), num_nodes=4, batch_size=16, max_steps=4,
            scenario=Scenario.from_dict(TWO_REGIONS), max_sim_time_s=BUDGET, val_size=0, progress=False)
    # the settings that decide a time-aware run are in its config (config.json had neither)
    assert result.config["scenario"] == TWO_REGIONS["name"] and result.config["max_sim_time_s"] == BUDGET


@pytest.mark.slow
def test_compare_reports_trainers_and_servers_apart_and_plots_validation_loss_vs_time(async_run, tmp_path):
    result, scenario, _ = async_run
    table = compare({"async": result}, [scenario], target_loss=10.0)
    (row,) = table.rows
    trainers = [result.trace.payload_bytes(r) for r in range(4)]
    assert row["payload_bytes_per_node"] == sum(trainers) / 4
    assert row["payload_bytes_per_server"] == result.trace.payload_bytes(4) == sum(trainers)
    assert "payload/server" in table.to_markdown()
    assert table.loss == "validation"
    curve = table.results[("async", scenario.name)].loss_vs_time(evals=result.history["eval"])
    assert curve == sorted((e["sim_time_s"], e["loss"]) for e in result.history["eval"])
    assert row["time_to_target_s"] == curve[0][0]  # the validation curve's first point is below 10
    assert compare({"async": result}, [scenario], loss="train").loss == "train"
    assert table.plot(tmp_path / "async.png").stat().st_size > 1000
