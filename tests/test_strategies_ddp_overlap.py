"""Overlapped, bucketed DDP: same numbers as one flat all-reduce, buckets launched inside backward, exact bytes.

The fits are shared through module-scoped fixtures (each costs about a second of start-up).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exonet import LocalTrainer, Scenario, simulate
from exonet.strategies import DDPStrategy, OptimSpec
from exonet.strategies.base import flatten
from exonet.strategies.ddp import bucket_assignment
from exonet.toy import Classifier, synthetic_classification
from exonet.trace import Collective, Compute, Step, Wait

STEPS = 4
CAP_MB = 0.5  # 512 KiB buckets: three buckets for the model below


def deep_mlp() -> Classifier:
    """Four Linear layers (8 parameter tensors, 563,210 parameters, 2.25 MB of fp32 gradients)."""
    torch.manual_seed(0)
    return Classifier(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                    nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)))


P = sum(p.numel() for p in deep_mlp().parameters())


def fit(**ddp):
    data = synthetic_classification(512, 64, 10)
    minibatch = ddp.pop("minibatch_size", None)
    strategy = DDPStrategy(OptimSpec("sgd", lr=0.05), bucket_cap_mb=CAP_MB, **ddp)
    return LocalTrainer(deep_mlp(), data).fit(strategy, num_nodes=2, max_steps=STEPS, batch_size=32, seed=0,
                                              minibatch_size=minibatch, progress=False)


@pytest.fixture(scope="module")
def runs():
    return {"overlap": fit(), "flat": fit(overlap=False), "overlap_accum": fit(minibatch_size=8),
            "flat_accum": fit(overlap=False, minibatch_size=8)}


def steps_of(events):
    """A rank's events split at its step marks."""
    out, cur = [], []
    for e in events:
        if isinstance(e, Step):
            out.append(cur)
            cur = []
        else:
            cur.append(e)
    return out


def test_buckets_follow_torch_ddp():
    params = list(deep_mlp().parameters())
    buckets = bucket_assignment(params, round(CAP_MB * (1 << 20)))
    assert buckets == [[7, 6, 5, 4], [3, 2], [1, 0]]  # reverse order; each closes once it reaches the cap
    assert bucket_assignment(params, 25 << 20) == [[7, 6, 5, 4], [3, 2, 1, 0]]  # the first bucket closes at 1 MiB


@pytest.mark.slow
def test_overlapped_ddp_equals_one_flat_all_reduce(runs):
    for a, b in (("overlap", "flat"), ("overlap_accum", "flat_accum")):
        got, want = runs[a], runs[b]
        torch.testing.assert_close(flatten([p.detach() for p in got.model.parameters()]),
                                   flatten([p.detach() for p in want.model.parameters()]), rtol=0, atol=1e-6)
        assert got.history["train_loss"] == pytest.approx(want.history["train_loss"], abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["overlap", "overlap_accum"])
def test_buckets_launch_inside_backward_and_carry_exactly_4p_bytes(runs, name):
    trace = runs[name].trace
    for rank in range(2):
        assert trace.payload_bytes_per_step(rank) == [4 * P] * STEPS
        for events in steps_of(trace.events[rank]):
            launches = [i for i, e in enumerate(events) if isinstance(e, Collective)]
            waits = [i for i, e in enumerate(events) if isinstance(e, Wait)]
            assert len(launches) == 3 and all(events[i].async_op and events[i].op == "all_reduce" for i in launches)
            assert len(waits) == 3 and max(launches) < min(waits)
            # backward goes on between the first launch and the last: compute spans sit between them
            assert len([e for e in events[launches[0]:waits[-1]] if isinstance(e, Compute)]) >= 2
            inside = [e for e in events[launches[0]:launches[-1]] if isinstance(e, Compute)]
            assert len(inside) == 2 and all(e.flops > 0 for e in inside)  # backward's FLOPs between launches
    # FLOPs are split where the spans split, and sum to the counted forward+backward per step
    spans = [e for e in steps_of(trace.events[0])[1] if isinstance(e, Compute)]
    flat_spans = [e for e in steps_of(runs["flat"].trace.events[0])[1] if isinstance(e, Compute)]
    assert sum(e.flops for e in spans) == pytest.approx(sum(e.flops for e in flat_spans), rel=1e-12)


@pytest.mark.slow
def test_overlap_hides_communication_on_the_datacenter_preset(runs):
    # The datacenter network with a device slow enough that this small model's compute is comparable to its
    # communication (on an H100 its 108 MFLOP step takes 0.3 us, and there is nothing to hide behind). The phase
    # model: under NCCL each of these 512 KiB buckets pays tens of microseconds of NCCL's own latency, which
    # this model's 50 us of compute cannot hide, so there three buckets are slower than one flat all-reduce.
    scenario = Scenario.load("datacenter").replace(compute={"tflops": 2.0}, backend=None, nccl=None)
    over, flat = (simulate(runs[k].trace, scenario) for k in ("overlap", "flat"))
    assert over.wall_clock_s < flat.wall_clock_s
    assert over.wall_clock_s >= max(n.compute_s for n in over.per_node)
    assert over.per_node[0].compute_s == pytest.approx(flat.per_node[0].compute_s, rel=1e-9)  # FLOPs-based compute


def test_bad_bucket_arguments_are_named():
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        DDPStrategy(bucket_cap_mb=0)
    with pytest.raises(TypeError, match="overlap"):
        DDPStrategy(overlap="yes")


# ------------------------------------------------------------------ asynchronous SPARTA
SPARTA_STEPS = 6


@pytest.fixture(scope="module")
def sparta_runs():
    from exonet.strategies import SPARTAStrategy
    from exonet.toy import tiny_mlp

    data = synthetic_classification(256, 8, 4)
    return {d: LocalTrainer(tiny_mlp(), data).fit(SPARTAStrategy(OptimSpec("sgd", lr=0.1), p_sparta=0.2, delay_steps=d),
                                                  num_nodes=2, max_steps=SPARTA_STEPS, batch_size=16, seed=0,
                                                  progress=False)
            for d in (0, 2)}


@pytest.mark.slow
def test_async_sparta_sends_the_same_coordinates_and_applies_them_d_steps_later(sparta_runs):
    blocking, delayed = sparta_runs[0].trace, sparta_runs[2].trace
    assert delayed.payload_bytes_per_step(0) == blocking.payload_bytes_per_step(0)  # same seeded index sets
    assert all(not c.async_op for c in blocking.collectives(0))
    per_step = steps_of(delayed.events[0])
    launched: dict[int, int] = {}  # cid -> step it was launched in
    for s, events in enumerate(per_step):
        for e in events:
            if isinstance(e, Collective):
                assert e.async_op
                launched[e.cid] = s
            elif isinstance(e, Wait):
                assert s == launched[e.cid] + 2  # applied after the next two steps' compute
    tail = [e for e in delayed.events[0][sum(len(x) + 1 for x in per_step):] if isinstance(e, Wait)]
    assert len(tail) == 2  # the last two exchanges are applied by finish()
    losses = [sparta_runs[d].history["train_loss"] for d in (0, 2)]
    assert losses[0][0] == losses[1][0] and losses[0][1:] != losses[1][1:]  # the first step precedes any exchange


def test_delay_steps_is_validated():
    from exonet.strategies import SPARTAStrategy

    with pytest.raises(ValueError, match="delay_steps"):
        SPARTAStrategy(delay_steps=-1)
    with pytest.raises(TypeError, match="delay_steps"):
        SPARTAStrategy(delay_steps=1.5)


def test_the_seed_gyms_async_sparta_delay_spelling():
    from exonet.strategies import SPARTAStrategy

    assert SPARTAStrategy(async_sparta_delay=3).delay_steps == 3
    with pytest.raises(TypeError, match="aliases"):
        SPARTAStrategy(delay_steps=1, async_sparta_delay=2)
