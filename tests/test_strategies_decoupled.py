"""Decoupled DiLoCo: the syncer's quorum, grace window and token weights, and its equivalence with Streaming DiLoCo."""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch.utils.data import TensorDataset

from exonet import LocalTrainer, Scenario, compare
from exonet.estimate import estimate
from exonet.strategies import STRATEGIES, DecoupledDiLoCoStrategy, OptimSpec, StreamingDiLoCoStrategy
from exonet.strategies.base import NodeContext, flatten
from exonet.strategies.decoupled_diloco import Syncer, worker_sends
from exonet.toy import synthetic_classification, tiny_mlp

FLAT = Scenario.from_dict({"name": "flat", "network": {"bandwidth": "10 Gbit/s", "latency": "50 us"},
                           "compute": {"mode": "flops", "tflops": 1e-5, "mfu": 1.0}})


# ---------------------------------------------------------------- bad input, named
@pytest.mark.parametrize("kwargs, name", [
    ({"quorum": 0}, "quorum"), ({"grace_fraction": 1.0}, "grace_fraction"),
    ({"grace_fraction": -0.1}, "grace_fraction"),
    ({"H": 10}, "num_fragments"), ({"delay_steps": 101}, "delay_steps"), ({"merge_alpha": 2}, "merge_alpha"),
    ({"replica_size": 0}, "replica_size"),
])
def test_bad_arguments_fail_at_construction_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DecoupledDiLoCoStrategy(**kwargs)


def test_a_quorum_above_the_workers_and_more_fragments_than_tensors_are_named():
    with pytest.raises(ValueError, match=r"quorum=3 exceeds the 2 workers \(num_nodes=4 / replica_size=2\)"):
        LocalTrainer(tiny_mlp(), synthetic_classification(64, 8, 4)).fit(
            DecoupledDiLoCoStrategy(quorum=3, replica_size=2), num_nodes=4, max_steps=2, scenario=FLAT,
            progress=False)
    strategy = DecoupledDiLoCoStrategy(H=8, num_fragments=3)
    with pytest.raises(ValueError, match=r"num_fragments \(3\) exceeds the number of trainable parameter tensors"):
        strategy.setup(torch.nn.Linear(3, 1), None, NodeContext(0, 1, 8, 0, torch.device("cpu")))


def test_the_spec_and_the_vocabulary_are_the_others():
    assert STRATEGIES["decoupled_diloco"] is DecoupledDiLoCoStrategy
    s = DecoupledDiLoCoStrategy("sgd", outer_optim_spec=OptimSpec("sgd", lr=0.5), H=48, quorum=2)
    assert (s.optim_spec.cls, s.outer_optim_spec.kwargs, s.num_fragments, s.delay_steps) == (
        torch.optim.SGD, {"lr": 0.5}, 24, 2)
    with pytest.raises(TypeError):
        DecoupledDiLoCoStrategy("sgd", None, 48)  # hyperparameters are keyword-only


# ---------------------------------------------------------------- the syncer on a scripted arrival order
def syncer(workers: int, quorum: int, grace: float, fragments: int = 2) -> Syncer:
    """θ_global = 0 per fragment; outer SGD lr 1 without momentum, so θ after a merge is −(the weighted mean)."""
    return Syncer([torch.zeros(2) for _ in range(fragments)], OptimSpec("sgd", lr=1.0), workers, quorum, grace,
                  delay_steps=2)


def delta(value: float) -> torch.Tensor:
    return torch.full((2,), value)


def test_a_round_merges_at_its_quorum_with_the_same_instants_arrivals_and_answers_a_late_worker_at_once():
    s = syncer(workers=3, quorum=2, grace=0.0)
    assert s.pulls  # the quorum is below the workers: replies wait for each worker's pull
    assert s.arrive(0, 0, 0, delta(1.0), 4, 4, time=1.0) == []  # one of two: no merge
    assert s.arrive(1, 0, 0, delta(3.0), 4, 4, time=2.0) == []  # the quorum, at 2.0: the instant may bring more
    assert s.merges == []
    # worker 2 arrives later: the round merged at 2.0 without it; its Δ is kept for the next merge, and it is
    # answered with the latest fragment as soon as it asks
    assert s.arrive(2, 0, 0, delta(6.0), 4, 4, time=2.5) == []
    assert (s.merges[0].fragment, s.merges[0].round, s.merges[0].time, s.merges[0].weights) == (
        0, 0, 2.0, {0: 0.5, 1: 0.5})
    assert s.global_params[0].tolist() == [-2.0, -2.0]
    assert s.pull(2, 0, time=2.6) == [(2, 0)]
    assert s.pull(0, 0, time=2.7) == [(0, 0)]
    assert s.pull(1, 0, time=2.7) == [(1, 0)]
    assert s.arrive(0, 0, 1, delta(0.0), 4, 8, time=3.0) == []
    assert s.arrive(1, 0, 1, delta(0.0), 4, 8, time=3.5) == []
    assert s.pull(0, 0, time=3.6) == [(0, 0)]  # worker 0 needs it: the round merges now
    # worker 2's Δ trained from θ before one merge: weighted 4/√2, not dropped
    stale = 4 / math.sqrt(2)
    last = s.merges[-1]
    assert (last.round, last.time, last.stale, last.weights) == (
        1, 3.5, (2,), pytest.approx({0: 4 / (8 + stale), 1: 4 / (8 + stale), 2: stale / (8 + stale)}))
    assert s.global_params[0].tolist() == pytest.approx([-2.0 - 6 * stale / (8 + stale)] * 2)


def test_all_workers_in_merge_at_once_and_are_answered_without_a_pull():
    s = syncer(workers=2, quorum=2, grace=0.5)
    assert not s.pulls
    assert s.arrive(0, 1, 0, delta(1.0), 4, 4, time=1.0) == []
    assert s.arrive(1, 1, 0, delta(3.0), 4, 4, time=1.0) == [(0, 1), (1, 1)]
    assert s.global_params[1].tolist() == [-2.0, -2.0]


def test_the_grace_window_takes_who_arrives_within_gamma_of_the_slack_and_a_pull_ends_it():
    s = syncer(workers=3, quorum=1, grace=0.5)
    assert s.arrive(0, 0, 0, delta(1.0), 1, 1, time=1.0) == []  # no step time known yet: a window of one instant
    assert s.pull(0, 0, time=1.5) == [(0, 0)]
    assert (s.merges[0].time, s.merges[0].weights) == (1.0, {0: 1.0})
    # worker 0's step time is now 1 s: the slack is τ = 2 steps = 2 s, the window γ·2 s = 1 s past the quorum
    assert s.arrive(0, 1, 0, delta(2.0), 2, 2, time=2.0) == []
    assert s.arrive(1, 1, 0, delta(4.0), 2, 2, time=2.9) == []  # inside the window: it waits with worker 0
    assert len(s.merges) == 1
    assert s.arrive(2, 1, 0, delta(8.0), 2, 2, time=3.5) == []  # after it: the round merged at 3.0 without it
    merged = s.merges[1]
    assert (merged.fragment, merged.time, merged.weights, merged.stale) == (1, 3.0, {0: 0.5, 1: 0.5}, ())
    assert s.pull(0, 1, time=3.6) == [(0, 1)]
    # the next round of fragment 1: worker 2's late Δ joins it; worker 0 asks before the window ends
    assert s.arrive(0, 1, 1, delta(0.0), 4, 6, time=6.0) == []
    assert s.pull(2, 1, time=6.1) == [(2, 1)]  # the late worker takes the latest fragment
    assert s.pull(0, 1, time=6.2) == [(0, 1)]  # waiting for it ends the window early
    merged = s.merges[2]  # worker 2's 2 tokens, one merge stale: 2/√2
    stale = 2 / math.sqrt(2)
    assert (merged.time, merged.stale, merged.weights) == (
        6.2, (2,), pytest.approx({0: 4 / (4 + stale), 2: stale / (4 + stale)}))


def test_updates_are_weighted_by_the_tokens_trained_since_the_last_sync():
    s = syncer(workers=2, quorum=2, grace=0.0)
    s.arrive(0, 0, 0, delta(1.0), 30, 3, time=1.0)
    s.arrive(1, 0, 0, delta(4.0), 10, 1, time=1.0)
    assert s.merges[0].weights == {0: 0.75, 1: 0.25}
    assert s.global_params[0].tolist() == [-(0.75 * 1.0 + 0.25 * 4.0)] * 2


def test_a_worker_back_from_a_failure_takes_the_latest_fragments_and_its_stale_work_counts():
    s = syncer(workers=2, quorum=1, grace=0.0)
    for r in range(3):  # worker 1 is down: worker 0 alone merges three rounds
        assert s.arrive(0, 0, r, delta(1.0), 4, 4 * (r + 1), time=float(r)) == []
        assert s.pull(0, 0, time=r + 0.5) == [(0, 0)]
    assert s.global_params[0].tolist() == [-3.0, -3.0]
    assert s.arrive(1, 0, 0, delta(5.0), 4, 4, time=3.5) == []  # back, with its work from before the outage
    assert s.pull(1, 0, time=3.6) == [(1, 0)]  # answered with θ after the 3 merges it missed
    s.arrive(0, 0, 3, delta(1.0), 4, 16, time=4.0)
    s.pull(0, 0, time=4.5)
    # weighted, not dropped: its 4 tokens, trained from θ three merges old, count 4/√(1 + 3) = 2 against 4
    assert (s.merges[-1].weights, s.merges[-1].stale) == (pytest.approx({0: 2 / 3, 1: 1 / 3}), (1,))
    assert s.global_params[0].tolist() == pytest.approx([-3.0 - (2 / 3 * 1.0 + 1 / 3 * 5.0)] * 2)


def test_a_worker_that_leaves_no_longer_holds_back_the_quorum():
    s = syncer(workers=3, quorum=3, grace=0.0)
    s.arrive(0, 0, 0, delta(1.0), 4, 4, time=1.0)
    s.arrive(1, 0, 0, delta(1.0), 4, 4, time=1.0)
    assert s.merges == []
    assert s.leave(2, time=2.0) == [(0, 0), (1, 0)]
    assert s.merges[0].weights == {0: 0.5, 1: 0.5}


def test_workers_send_each_fragment_every_H_steps_staggered_with_a_pull_a_step_before_it_is_due():
    sends = list(worker_sends([2, 4], H=4, tau=2, pulls=True, max_steps=8))  # worker_sends(offsets, ...)
    assert sends == [("delta", 0, 2), ("pull", 0, 3), ("delta", 1, 4), ("pull", 1, 5), ("delta", 0, 6),
                     ("pull", 0, 7), ("delta", 1, 8), ("pull", 1, 8), ("done", -1, 8)]
    assert [k for k, _, _ in worker_sends([2, 4], H=4, tau=2, pulls=False, max_steps=8)].count("pull") == 0


# ---------------------------------------------------------------- equivalence with Streaming DiLoCo
class KeepLocal:
    """Saves each trainer's final parameters (the run returns only one model) to $DECOUPLED_KEEP."""

    def finish(self) -> None:
        super().finish()  # type: ignore[misc]
        if self.rank < self.num_nodes:  # type: ignore[attr-defined]
            torch.save(flatten(self.params).detach(),  # type: ignore[attr-defined]
                       os.path.join(os.environ["DECOUPLED_KEEP"], f"{type(self).__name__}-{self.rank}.pt"))


class KeptStreaming(KeepLocal, StreamingDiLoCoStrategy):
    pass


class KeptDecoupled(KeepLocal, DecoupledDiLoCoStrategy):
    pass


@pytest.mark.parametrize("num_nodes, replica_size", [(2, 1), pytest.param(4, 2, marks=pytest.mark.slow)])
def test_all_workers_no_grace_equal_speeds_equals_streaming_diloco(tmp_path, monkeypatch, num_nodes, replica_size):
    monkeypatch.setenv("DECOUPLED_KEEP", str(tmp_path))
    raw = synthetic_classification(256, 8, 4)
    data = TensorDataset(raw.tensors[0].double(), raw.tensors[1])
    kwargs = {"outer_optim_spec": OptimSpec("sgd", lr=0.7, momentum=0.9, nesterov=True), "H": 4, "num_fragments": 2,
              "delay_steps": 2, "merge_alpha": 0.5, "replica_size": replica_size}
    runs = {}
    for cls, extra in ((KeptStreaming, {}), (KeptDecoupled, {"quorum": num_nodes // replica_size,
                                                             "grace_fraction": 0.0})):
        runs[cls] = LocalTrainer(tiny_mlp().double(), data).fit(
            cls(OptimSpec("sgd", lr=0.1), **kwargs, **extra), num_nodes=num_nodes, max_steps=13, batch_size=8,
            shuffle=False, scenario=FLAT, val_size=0, progress=False)
    for rank in range(num_nodes):
        streaming = torch.load(tmp_path / f"KeptStreaming-{rank}.pt")
        decoupled = torch.load(tmp_path / f"KeptDecoupled-{rank}.pt")
        assert streaming.dtype == torch.float64
        assert torch.allclose(decoupled, streaming, rtol=0, atol=1e-6)
    if replica_size == 1:  # each trainer sends Δ_f once per sync, as Streaming DiLoCo's all-reduce passes it in
        assert [runs[KeptDecoupled].trace.payload_bytes(r) for r in range(num_nodes)] == [
            runs[KeptStreaming].trace.payload_bytes(r) for r in range(num_nodes)]


def test_estimate_runs_the_strategy_on_meta_tensors_with_its_syncer():
    e = estimate("decoupled_diloco:H=4,num_fragments=2", model=lambda: torch.nn.Sequential(
        torch.nn.Linear(100, 100), torch.nn.Linear(100, 10)), num_nodes=2, max_steps=8, step_time=1.0, scenario=FLAT)
    params = 100 * 100 + 100 + 100 * 10 + 10
    # two whole models of Δ per worker over 8 steps (each fragment twice), and a 4-byte pull per sync (quorum 1 < 2)
    assert e.trace.payload_bytes(0) == e.trace.payload_bytes(1) == 2 * 4 * params + 4 * 4
    assert e.trace.meta["servers"] == 1


# ---------------------------------------------------------------- a real run: K = 8, one worker slow, one failing
DIGITS_NET = {"name": "digits-eight", "network": {"bandwidth": "1 Gbit/s", "latency": "1 ms"},
              "compute": {"mode": "flops", "tflops": 1e-4, "mfu": 1.0}}
# 4 workers x 2 ranks; worker 1 (ranks 2, 3) at half speed, worker 3 (ranks 6, 7) down for a sixth of the run
ROUGH = Scenario.from_dict({**DIGITS_NET, "name": "digits-eight-rough", "nodes": [{"ranks": [2, 3], "speed": 0.5}],
                            "events": [{"kind": "down", "ranks": [6, 7], "from_s": 1.0, "to_s": 1.5}]})
SHAPE = {"H": 12, "num_fragments": 3, "delay_steps": 2, "merge_alpha": 0.5, "replica_size": 2}


def digits_fit(strategy, scenario: Scenario, **kwargs):
    from exonet.toy import digits, digits_mlp

    return LocalTrainer(digits_mlp(), digits(), digits(train=False)).fit(
        strategy, num_nodes=8, batch_size=16, seed=0, scenario=scenario, val_interval=10**6, val_size=256,
        progress=False, **kwargs)


@pytest.fixture(scope="module")
def rough_runs():
    def decoupled():
        return digits_fit(DecoupledDiLoCoStrategy(OptimSpec("adamw", lr=3e-3), **SHAPE), ROUGH, max_steps=1000,
                          max_sim_time_s=3.0)

    # the baseline: Streaming DiLoCo on healthy hardware for the steps the healthy workers take in 3 s
    healthy = digits_fit(StreamingDiLoCoStrategy(OptimSpec("adamw", lr=3e-3), **SHAPE),
                         Scenario.from_dict(DIGITS_NET), max_steps=120)
    return decoupled(), decoupled(), healthy


@pytest.mark.slow
def test_a_slow_and_a_failing_worker_stall_nobody_and_the_loss_stays_within_10pct_of_healthy_streaming(rough_runs):
    run, again, healthy = rough_runs
    steps = [run.trace.num_steps(r) for r in range(8)]
    assert steps[0] == steps[1] == steps[4] == steps[5] >= 115  # the healthy workers train the whole 3 s
    assert steps[2] == steps[3] < 0.6 * steps[0]  # the slow one at its own pace
    assert steps[6] == steps[7] < steps[0]  # the failed one lost its outage, and came back
    assert run.sim.lost["down"] == pytest.approx(1.0)  # two ranks down for 0.5 s
    assert 0.75 < run.sim.goodput < 0.95  # reported: the outage is the loss, nobody waits for the slow worker
    assert run.sim.lost["waiting"] < 0.01 * 8 * run.sim.wall_clock_s
    loss, baseline = run.history["eval"][-1]["loss"], healthy.history["eval"][-1]["loss"]
    assert loss < 1.1 * baseline, (loss, baseline)
    # the same seed, the same run
    assert again.history["eval"][-1]["loss"] == loss
    assert all(torch.equal(a, b) for a, b in zip(run.model.parameters(), again.model.parameters()))
    assert [run.trace.payload_bytes(r) for r in range(9)] == [again.trace.payload_bytes(r) for r in range(9)]
    (row,) = compare({"decoupled": run}, [ROUGH]).rows  # compared as the others: the syncer's bytes apart
    assert row["payload_bytes_per_server"] == run.trace.payload_bytes(8)
    assert row["payload_bytes_per_node"] == sum(run.trace.payload_bytes(r) for r in range(8)) / 8


# ---------------------------------------------------------------- uneven hardware: the quorum's worth
# 8 workers of one rank (and the syncer: 9 processes); ranks 4-7 on chips 18% slower, every step 10% noisy
UNEVEN = Scenario.from_dict({"name": "uneven-eight", "network": {"bandwidth": "10 Gbit/s", "latency": "100 us"},
                             "compute": {"mode": "flops", "tflops": 1e-4, "mfu": 1.0},
                             "nodes": [{"ranks": [4, 5, 6, 7], "speed": 1 / 1.18}],
                             "stragglers": {"jitter": "lognormal", "sigma": 0.1, "seed": 0}})


@pytest.mark.slow
def test_with_uneven_chips_quorum_1_keeps_the_machine_busy_and_quorum_8_waits_for_the_slow_ones():
    # a fragment syncs every step without overlap (τ = 0), so every round sees a step's noise whole
    goodput = {q: digits_fit(DecoupledDiLoCoStrategy(OptimSpec("adamw", lr=3e-3), H=3, num_fragments=3, delay_steps=0,
                                                     quorum=q), UNEVEN, max_steps=1000, max_sim_time_s=2.0).sim.goodput
               for q in (1, 8)}
    assert goodput[1] >= 0.97, goodput  # the paper: 100%
    assert goodput[8] == pytest.approx(0.84, abs=0.05), goodput  # the paper: 84%
