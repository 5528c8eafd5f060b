"""Time-aware training: asynchronous strategies through a parameter server on the online clock."""

from __future__ import annotations

import math

import pytest
import torch

from exonet import LocalTrainer, Scenario, Trace, simulate
from exonet.runtime.testing import SleepyModel
from exonet.strategies import AsyncDiLoCoStrategy, DiLoCoStrategy, FedAvgStrategy, FedBuffStrategy, OptimSpec
from exonet.toy import synthetic_classification, tiny_mlp

SPEEDS = (1.0, 0.8, 0.4, 0.2)
LIMIT = 0.15
# Four trainers at speeds 1, 0.8, 0.4, 0.2 and their server (rank 4) on a fast network;
# FLOPs make compute deterministic.
HETERO = Scenario.from_dict({
    "name": "hetero-four", "network": {"bandwidth": "10 Gbit/s", "latency": "50 us"},
    "compute": {"mode": "flops", "tflops": 1e-5, "mfu": 1.0},
    "nodes": [{"ranks": [r], "speed": v} for r, v in enumerate(SPEEDS) if v != 1.0],
})
H = 4
STEP_S = 0.0014336  # a step of tiny_mlp on 16 rows at speed 1: its FLOPs at 1e-5 TFLOP/s
PARAMS = sum(p.numel() for p in tiny_mlp().parameters())


def fit(strategy, model=None, **kwargs):
    data, val = synthetic_classification(1024, 8, 4), synthetic_classification(128, 8, 4, train=False)
    return LocalTrainer(model or tiny_mlp(), data, val).fit(
        strategy, num_nodes=4, max_steps=1000, batch_size=16, seed=0, scenario=HETERO, max_sim_time_s=LIMIT,
        val_interval=4, val_size=64, progress=False, **kwargs)


def shape(trace) -> list[list[tuple]]:
    """A trace without its real-time stamps: what must repeat exactly from run to run."""
    return [[(type(e).__name__, getattr(e, "op", None), getattr(e, "group", None), getattr(e, "nbytes", None),
              getattr(e, "flops", None)) for e in events] for events in trace.events]


def async_diloco() -> AsyncDiLoCoStrategy:
    return AsyncDiLoCoStrategy(OptimSpec("sgd", lr=0.1), H=H)


@pytest.fixture(scope="module")
def runs():
    return {"async": fit(async_diloco()), "again": fit(async_diloco()),
            "sleepy": fit(async_diloco(), model=SleepyModel(0.02, rank=0)),
            "sync": fit(DiLoCoStrategy(OptimSpec("sgd", lr=0.1), H=H)),
            "deadline": fit(FedAvgStrategy(OptimSpec("sgd", lr=0.1), H=H, deadline_s=12 * STEP_S))}


@pytest.mark.slow
def test_async_diloco_steps_follow_speed_and_sync_diloco_steps_are_equal(runs):
    steps = [runs["async"].trace.num_steps(r) for r in range(4)]
    assert runs["async"].trace.num_steps(4) == 0  # the server trains nothing
    for r in range(1, 4):
        assert steps[r] / steps[0] == pytest.approx(SPEEDS[r], rel=0.1), steps
    sync = runs["sync"]
    assert len({sync.trace.num_steps(r) for r in range(4)}) == 1 and sync.trace.num_steps(0) < steps[0]


@pytest.mark.slow
def test_the_online_clock_equals_replay_and_the_same_seed_gives_the_same_run(runs):
    a, b = runs["async"], runs["again"]
    assert a.sim_wall_clock_s == pytest.approx(a.simulate(HETERO).wall_clock_s, rel=1e-9)
    assert a.trace.meta["decided_in"] == {"scenario": "hetero-four", "fingerprint": HETERO.fingerprint}
    assert "decided_in" not in runs["sync"].trace.meta  # a time budget alone decides no order
    assert a.sim_wall_clock_s >= LIMIT
    assert a.history["train_loss"] == b.history["train_loss"] and a.history["eval"] == b.history["eval"]
    assert shape(a.trace) == shape(b.trace)
    evals = [e for e in a.history["eval"] if not e.get("final")]  # and the final model at the end (test_time_aware)
    # the initial model at 0 updates and time 0 (the seed gym's step-0 evaluation), then every 4 updates
    assert [e["step"] for e in evals] == list(range(0, 4 * len(evals) - 3, 4))
    times = [e["sim_time_s"] for e in evals]
    assert times == sorted(times) and times[0] == 0 < times[1] and times[-1] <= a.sim_wall_clock_s
    from exonet.study.comparison import time_to_loss

    assert all(e["updates"] == e["step"] for e in evals)  # steps of the server's model, not of the trainers
    assert time_to_loss(a.history, a.sim.step_end_times, 10.0) == a.sim.step_end_times[0]  # from the training loss


@pytest.mark.slow
def test_updates_are_applied_in_simulated_order_whatever_the_real_order(runs):
    fast_in_sim, slow_in_reality = runs["async"], runs["sleepy"]  # rank 0 is the fastest in the scenario
    assert slow_in_reality.real_time_s > 0.02 * slow_in_reality.trace.num_steps(0)  # rank 0 slept every step
    for a, b in zip(fast_in_sim.model.parameters(), slow_in_reality.model.parameters()):
        assert torch.equal(a, b)
    assert fast_in_sim.history["eval"] == slow_in_reality.history["eval"]
    senders = [c.group for c in fast_in_sim.trace.collectives(4) if c.op == "recv"]
    assert senders == [c.group for c in slow_in_reality.trace.collectives(4) if c.op == "recv"]


@pytest.mark.slow
def test_point_to_point_bytes_are_exact(runs):
    r = runs["async"]
    nbytes = PARAMS * 4
    rounds = [r.trace.num_steps(w) // H for w in range(4)]
    for w in range(4):
        assert r.trace.payload_bytes(w) == rounds[w] * nbytes  # one Δ per finished round
        assert [c.op for c in r.trace.collectives(w)] == ["send", "recv"] * rounds[w]
    assert r.trace.payload_bytes(4) == sum(rounds) * nbytes  # the server answers every arrival
    assert r.sim.wire_bytes == [rounds[w] * nbytes for w in range(4)] + [sum(rounds) * nbytes]


@pytest.mark.slow
def test_deadline_fedavg_drops_exactly_the_nodes_the_scenario_makes_late(runs):
    r = runs["deadline"]
    assert r.sim.per_node[0].compute_s == pytest.approx(STEP_S * r.trace.num_steps(0), rel=1e-9)
    # H = 4 steps take 4, 5, 10 and 20 step times at speeds 1, 0.8, 0.4, 0.2: against a deadline of 12, rank 3
    # is late every round (and so a round behind); the others average, every round.
    rounds = [r.trace.num_steps(q) // H for q in range(4)]
    together = min(rounds[:3])  # rounds all three finished before the limit stopped them (at slightly different steps)
    for q in range(3):
        groups = [c.group for c in r.trace.collectives(q) if c.op == "all_reduce"]
        assert groups[:together] == [(0, 1, 2)] * together and len(groups) <= rounds[q]
    late = r.trace.collectives(3)
    assert [(c.op, c.group) for c in late] == [("recv", (0, 3))] * rounds[3]  # it adopts the result, sends nothing
    sent = [c for c in r.trace.collectives(0) if c.op in ("send", "all_reduce")]
    assert [c.group for c in sent if c.op == "send"] == [(0, 3)] * rounds[3]
    assert r.trace.payload_bytes(3) == 0 and r.trace.payload_bytes(0) == len(sent) * PARAMS * 4
    assert r.sim_wall_clock_s == pytest.approx(r.simulate(HETERO).wall_clock_s, rel=1e-9)
    assert rounds[3] < rounds[2] < rounds[0]  # nobody waits for the late


# ------------------------------------------------------------------------------- the server's arithmetic
class _Server:
    """Enough of a node for a server strategy's ``apply``: its global parameters and the setup it needs."""

    @staticmethod
    def of(strategy, params: int = 3, trainers: int = 2):
        from exonet.strategies.base import NodeContext

        model = torch.nn.Linear(params, 1, bias=False)
        with torch.no_grad():
            model.weight.zero_()
        strategy.setup(model, None, NodeContext(trainers, trainers, 10, 0, torch.device("cpu")))
        return strategy


def test_delayed_nesterov_applies_momentum_every_n_arrivals():
    s = _Server.of(AsyncDiLoCoStrategy(outer_optim_spec=OptimSpec("sgd", lr=0.5, momentum=0.9), delayed_nesterov=2,
                                       grad_scale=0.0))
    s.apply(torch.tensor([1.0, 0.0, 0.0]), 0)
    assert s.global_params.tolist() == [0.0, 0.0, 0.0]  # buffered, c = 0
    s.apply(torch.tensor([0.0, 2.0, 0.0]), 1)
    d = torch.tensor([0.5, 1.0, 0.0])  # the buffer's mean; m = d; θ = −η (β m + d)
    assert torch.allclose(s.global_params, -0.5 * (0.9 * d + d))
    scaled = _Server.of(AsyncDiLoCoStrategy(outer_optim_spec=OptimSpec("sgd", lr=0.5, momentum=0.9), delayed_nesterov=2,
                                            grad_scale=0.25))
    scaled.apply(torch.tensor([1.0, 0.0, 0.0]), 0)
    assert scaled.global_params.tolist() == [-0.125, 0.0, 0.0]  # θ −= η c Δ between momentum steps


def test_delayed_nesterov_reads_the_sgds_nesterov_flag_and_rejects_what_it_would_ignore():
    """nesterov=False, weight_decay and a naive run's grad_scale changed nothing before (max diff 0.0)."""
    heavy = _Server.of(AsyncDiLoCoStrategy(outer_optim_spec=OptimSpec("sgd", lr=0.5, momentum=0.9, nesterov=False),
                                           delayed_nesterov=1))
    heavy.apply(torch.tensor([1.0, 0.0, 0.0]), 0)
    heavy.apply(torch.tensor([1.0, 0.0, 0.0]), 1)
    assert torch.allclose(heavy.global_params, torch.tensor([-0.5 * (1 + 1.9), 0.0, 0.0]))  # θ −= η m, m = β m + d
    with pytest.raises(ValueError, match="weight_decay would be ignored"):
        AsyncDiLoCoStrategy(outer_optim_spec=OptimSpec("sgd", lr=0.7, momentum=0.9, weight_decay=0.5))
    AsyncDiLoCoStrategy(outer_optim_spec=OptimSpec("sgd", lr=0.7, momentum=0.9, weight_decay=0.0))  # a no-op is fine
    with pytest.raises(ValueError, match="grad_scale=0.5 scales the arrivals between"):
        AsyncDiLoCoStrategy(delayed_nesterov=None, grad_scale=0.5)


def test_naive_async_diloco_takes_an_outer_step_per_arrival():
    s = _Server.of(AsyncDiLoCoStrategy(outer_optim_spec=OptimSpec("sgd", lr=0.5), delayed_nesterov=None))
    s.apply(torch.tensor([1.0, 2.0, 0.0]), 0)
    s.apply(torch.tensor([1.0, 0.0, 0.0]), 1)
    assert s.global_params.tolist() == [-1.0, -1.0, 0.0]


def test_fedbuff_steps_after_b_arrivals_with_staleness_weights():
    s = _Server.of(FedBuffStrategy(buffer_size=2), trainers=3)  # the default server step: SGD lr 1, the paper's
    s.apply(torch.tensor([2.0, 0.0, 0.0]), 0)
    assert s.global_params.tolist() == [0.0, 0.0, 0.0] and s.version == 0
    s.apply(torch.tensor([0.0, 2.0, 0.0]), 1)
    assert s.global_params.tolist() == [-1.0, -1.0, 0.0] and s.version == 1  # mean of the two, fresh
    assert s.sent_version == [0, 1, 0]  # trainer 0's reply went out before the step
    s.apply(torch.tensor([0.0, 0.0, 3.0]), 2)  # trained from version 0: one step stale, weight 1/√2
    s.apply(torch.tensor([0.0, 0.0, 1.0]), 0)  # likewise
    assert torch.allclose(s.global_params, torch.tensor([-1.0, -1.0, -(3 + 1) / math.sqrt(2) / 2]))
    assert s.version == 2 and s.sent_version == [2, 1, 1]


def test_fedbuff_server_steps_its_outer_optimizer_on_the_buffer_mean():
    s = _Server.of(FedBuffStrategy(buffer_size=2, outer_optim_spec=OptimSpec("sgd", lr=0.5, momentum=0.5)), trainers=2)
    s.apply(torch.tensor([2.0, 0.0, 0.0]), 0)
    s.apply(torch.tensor([0.0, 2.0, 0.0]), 1)  # mean d = [1, 1, 0]: m = d, θ = −0.5·m
    assert s.global_params.tolist() == [-0.5, -0.5, 0.0]
    s.apply(torch.tensor([2.0, 0.0, 0.0]), 1)
    s.apply(torch.tensor([2.0, 0.0, 0.0]), 1)  # fresh both times: d = [2, 0, 0], m = 0.5·[1, 1, 0] + d
    assert s.global_params.tolist() == [-0.5 - 0.5 * 2.5, -0.5 - 0.5 * 0.5, 0.0]


def test_strategies_with_a_server_need_the_clock_and_check_their_arguments():
    trainer = LocalTrainer(tiny_mlp(), synthetic_classification(64, 8, 4))
    with pytest.raises(ValueError, match="AsyncDiLoCoStrategy .*scenario="):
        trainer.fit(async_diloco(), num_nodes=2, max_steps=2, progress=False)
    with pytest.raises(ValueError, match="compute.mode 'measured'"):
        trainer.fit(async_diloco(), num_nodes=2, max_steps=2, scenario="cross-continent", progress=False)
    with pytest.raises(ValueError, match="delayed_nesterov: the outer optimizer must be SGD"):
        AsyncDiLoCoStrategy(outer_optim_spec="adam", delayed_nesterov=2)
    with pytest.raises(ValueError, match="buffer_size"):
        FedBuffStrategy(buffer_size=0)


def test_the_clock_tells_a_node_its_simulated_time_and_what_a_transfer_would_take():
    from exonet.runtime.clock import SimClock
    from exonet.trace import Compute, Step

    uplinks = Scenario.from_dict({"name": "two-speeds", "network": {"bandwidth": "8 Mbit/s"},
                                  "compute": {"mode": "flops", "tflops": 1e-6, "mfu": 1.0},
                                  "nodes": [{"ranks": [1], "speed": 0.5, "uplink": "4 Mbit/s"}]})
    clock = SimClock(uplinks, 4, math.inf, 10, synchronous=False)
    clock.feed(1, [Compute(0.0, 0.0, 1e6), Step()])  # 1 MFLOP at 1 MFLOP/s and speed 0.5
    clock.ask(1, ("now",))
    clock.ask(0, ("transfer", "all_reduce", 1_000_000, None))
    clock.ask(2, ("transfer", "send", 1_000_000, (1, 2)))
    answers = {rank: answer for rank, _, answer in clock.answers()}
    assert answers[1] == 2.0
    assert answers[0] == pytest.approx(2 * 3 / 4 * 1_000_000 / 5e5, rel=1e-12)  # ring: 2(n−1)/n·S over rank 1's uplink
    assert answers[2] == pytest.approx(1_000_000 / 5e5, rel=1e-12)  # rank 1's uplink is the bottleneck


def test_replaying_an_asynchronous_trace_in_another_scenario_warns_that_its_order_was_chosen_elsewhere():
    import warnings

    trace = Trace(4, meta={"decided_in": {"scenario": HETERO.name, "fingerprint": HETERO.fingerprint}})
    for rank in range(4):
        trace.add_compute(rank, 0.01)
        trace.add_collective(rank, "all_reduce", 4096)
        trace.add_step(rank)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        simulate(trace, Scenario.from_dict(HETERO.to_dict()))  # an equal scenario: the order is its own
        simulate(Trace(4, events=trace.events), "datacenter")  # no clock decided anything
    with pytest.warns(UserWarning, match=r"order .* the online clock chose in scenario 'hetero-four'; replayed in "
                                         r"'home-broadband' it keeps that order.*scenario='home-broadband'"):
        simulate(trace, "home-broadband")
    with pytest.warns(UserWarning, match=r"chose in scenario 'hetero-four' before the trace was scaled; replayed in "
                                         r"'hetero-four'"):
        simulate(trace.scaled(bytes=10), HETERO)  # its own scenario, but not the traffic the order was chosen for
    assert HETERO.fingerprint != Scenario.load("home-broadband").fingerprint and len(HETERO.fingerprint) == 16
