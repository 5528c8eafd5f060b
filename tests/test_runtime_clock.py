"""The online clock: fit(scenario=..., max_sim_time_s=T) trains until the simulated clock reaches T."""

from __future__ import annotations

import pytest

from exonet import LocalTrainer, Scenario
from exonet.strategies import DDPStrategy, DiLoCoStrategy, OptimSpec
from exonet.toy import synthetic_classification, tiny_mlp

LIMIT = 0.05
# A slow network and a slow, uneven pair of devices: FLOPs make compute deterministic.
HETERO = Scenario.from_dict({
    "name": "hetero-pair", "network": {"bandwidth": "1 Mbit/s", "latency": "1 ms"},
    "compute": {"mode": "flops", "tflops": 1e-4, "mfu": 1.0}, "nodes": [{"ranks": [1], "speed": 0.5}],
})


def clocked(strategy, **kwargs):
    data, val = synthetic_classification(512, 8, 4), synthetic_classification(128, 8, 4, train=False)
    return LocalTrainer(tiny_mlp(), data, val).fit(strategy, num_nodes=2, max_steps=500, batch_size=16, seed=0,
                                                   scenario=HETERO, max_sim_time_s=LIMIT, val_interval=4, val_size=64,
                                                   progress=False, **kwargs)


@pytest.fixture(scope="module")
def runs():
    return {"ddp": clocked(DDPStrategy(OptimSpec("sgd", lr=0.1))),
            "ddp_again": clocked(DDPStrategy(OptimSpec("sgd", lr=0.1))),
            "diloco": clocked(DiLoCoStrategy(OptimSpec("sgd", lr=0.1), H=4))}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "diloco"])
def test_a_synchronous_run_stops_at_the_simulated_limit_with_equal_steps(runs, name):
    r = runs[name]
    ends = r.history["sim_time_s"]
    assert len(ends) == len(r.history["train_loss"]) < 500
    assert ends[-2] < LIMIT <= ends[-1]  # the last step began before the limit
    assert r.trace.num_steps(0) == r.trace.num_steps(1) == len(ends)  # the slow node gates the fast one
    assert r.sim_wall_clock_s == r.sim.wall_clock_s
    assert r.simulate(HETERO).wall_clock_s == pytest.approx(r.sim_wall_clock_s, rel=1e-9)  # replay == the clock
    evals = r.history["eval"]
    # each evaluation at its step's end; the initial model's (step 0, as the seed gym evaluates it) at time 0
    assert evals[-1]["step"] == len(ends) and all(e["sim_time_s"] == (ends[e["step"] - 1] if e["step"] else 0.0)
                                                  for e in evals)


@pytest.mark.slow
def test_the_same_seed_gives_the_same_clocked_run(runs):
    a, b = runs["ddp"], runs["ddp_again"]
    assert a.history["train_loss"] == b.history["train_loss"] and a.history["sim_time_s"] == b.history["sim_time_s"]
    assert [[(type(e), e.flops if hasattr(e, "flops") else None) for e in evs] for evs in a.trace.events] == \
           [[(type(e), e.flops if hasattr(e, "flops") else None) for e in evs] for evs in b.trace.events]


def test_the_clock_needs_a_scenario_with_deterministic_compute():
    trainer = LocalTrainer(tiny_mlp(), synthetic_classification(64, 8, 4))
    with pytest.raises(ValueError, match="max_sim_time_s.*scenario"):
        trainer.fit(DDPStrategy(), num_nodes=2, max_steps=2, max_sim_time_s=1.0, progress=False)
    with pytest.raises(ValueError, match="compute.mode 'measured'"):
        trainer.fit(DDPStrategy(), num_nodes=2, max_steps=2, max_sim_time_s=1.0, scenario="cross-continent",
                    progress=False)
    with pytest.raises(ValueError, match="max_sim_time_s"):
        trainer.fit(DDPStrategy(), num_nodes=2, max_steps=2, max_sim_time_s=-1.0, scenario=HETERO, progress=False)


@pytest.mark.slow
def test_send_and_recv_are_real_counted_traced_and_simulated():
    from exonet.runtime.testing import RingPassStrategy
    from exonet.strategies.base import OptimSpec as Spec

    steps, numel = 3, 2500
    r = LocalTrainer(tiny_mlp(), synthetic_classification(128, 8, 4)).fit(
        RingPassStrategy(numel, optim_spec=Spec("sgd", lr=0.1)), num_nodes=3, max_steps=steps, batch_size=8,
        progress=False)  # a wrong value received fails the run
    for rank in range(3):
        assert r.payload_bytes_per_step(rank) == [4 * numel] * steps  # sends only
        ops = [(c.op, c.group) for c in r.trace.collectives(rank)]
        assert ops == [("send", tuple(sorted((rank, (rank + 1) % 3)))),
                       ("recv", tuple(sorted((rank, (rank - 1) % 3))))] * steps
    sim = r.simulate({"name": "p2p", "network": {"bandwidth": "8 Mbit/s"},
                      "compute": {"mode": "flops", "tflops": 1e-3}})
    assert sim.wire_bytes == [4 * numel * steps] * 3
    for node in sim.per_node:  # equal compute: each recv waits for a 10 kB message sent at once, at 1 MB/s
        assert node.comm_s == pytest.approx(steps * 4 * numel / 1e6, rel=1e-9)


EVEN = Scenario.from_dict({
    "name": "even-pair", "network": {"bandwidth": "10 Mbit/s", "latency": "2 ms"},
    "compute": {"mode": "flops", "tflops": 1e-4, "mfu": 1.0},
})


@pytest.mark.slow
def test_a_strategy_asks_the_clock_through_typed_communicator_methods(tmp_path):
    import json

    from exonet.runtime.testing import ClockProbeStrategy

    data = synthetic_classification(256, 8, 4)
    result = LocalTrainer(tiny_mlp(), data, data).fit(
        ClockProbeStrategy(OptimSpec("sgd", lr=0.1), str(tmp_path)), num_nodes=2, max_steps=4, batch_size=16,
        seed=0, scenario=EVEN, max_sim_time_s=1e9, val_size=0, progress=False)
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    ends = result.simulate(EVEN).step_end_times
    for s in seen:
        assert s["speeds"] == [1.0, 1.0]
        # ring all-reduce, n = 2: 2(n-1)·α + 2(n-1)/n·S/B on an idle network
        assert s["transfer"] == pytest.approx(2 * 2e-3 + s["bytes"] / (10e6 / 8), rel=1e-12)
        assert s["now"] == pytest.approx(ends, rel=1e-12)  # the clock's "now" after a step is that step's end
