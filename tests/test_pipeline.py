"""Pipelines timed: the schedules' order, their bubble and slow stage boundaries against closed forms."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import pytest

from exonet import PipelineSpec
from exonet.estimate import estimate
from exonet.estimate.pipeline import order, paths, pipeline_trace, stage_work
from exonet.netsim import simulate
from exonet.scenario import Scenario
from exonet.trace import Collective


def test_1f1b_fills_then_alternates_then_drains_and_gpipe_runs_every_forward_first():
    assert order("1f1b", 0, 4, 6) == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4), ("B", 1),
                                      ("F", 5), ("B", 2), ("B", 3), ("B", 4), ("B", 5)]
    assert order("1f1b", 3, 4, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert order("gpipe", 1, 4, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "micro"), [(4, 8), (2, 1), (3, 5), (1, 4)])
def test_a_step_takes_m_plus_s_minus_one_micro_batch_slots(schedule, stages, micro):
    """On a free network a step is (M + S − 1) slots of one stage's forward and backward of one micro-batch:
    (M + S − 1)·T/(S·M) for T seconds of a whole model's step; the rest of S·M slots is the bubble."""
    free = Scenario.from_dict({"name": "free", "network": {"bandwidth": "100 Gbit/s", "latency": "0 s"},
                               "compute": {"mode": "wall"}})
    trace = pipeline_trace(PipelineSpec(stages, micro, schedule), replicas=1, steps=3, step_time=12.0,
                           activation_bytes=0, stage_bytes=0, sync_every=0)
    assert simulate(trace, free).wall_clock_s == pytest.approx(3 * (micro + stages - 1) * 12.0 / (stages * micro),
                                                               rel=1e-9)


def test_a_slow_boundary_costs_its_latency_and_transfer_each_way():
    """Two stages, one micro-batch, 1 Gbit/s and 10 ms between them, 125 MB of activations: a step is both
    stages' compute (T) plus the activation's and its gradient's trip, 2·(10 ms + 1 s)."""
    link = Scenario.from_dict({"name": "link", "network": {"bandwidth": "1 Gbit/s", "latency": "10 ms"},
                               "compute": {"mode": "wall"}})
    trace = pipeline_trace(PipelineSpec(2, 1, "gpipe"), replicas=1, steps=1, step_time=6.0,
                           activation_bytes=125_000_000, stage_bytes=0, sync_every=0)
    assert simulate(trace, link).wall_clock_s == pytest.approx(6.0 + 2 * (0.010 + 1.0), rel=1e-9)


def test_replicas_of_a_stage_all_reduce_its_parameters_as_the_strategy_says():
    trace = pipeline_trace(PipelineSpec(2, 2), replicas=3, steps=4, step_time=1.0, activation_bytes=8,
                           stage_bytes=1000, sync_every=2)
    for rank in range(6):
        reduces = [(e.group, e.nbytes) for e in trace.events[rank] if isinstance(e, Collective)
                   and e.op == "all_reduce"]
        assert reduces == [(tuple(range(rank % 2, 6, 2)), 1000)] * 2  # steps 2 and 4, with its stage's replicas


def test_estimate_cuts_the_layer_stack_and_sizes_activations_by_tokens_and_width():
    est = estimate("diloco:H=5", params=1e8, num_nodes=4, max_steps=10, tokens_per_step=4096, tflops=100, mfu=0.5,
                   dtype="bf16", pipeline=PipelineSpec(2, 4, "1f1b"))
    width = 512  # the 1e8-parameter stack of 24 blocks: d = 512
    sends = [e.nbytes for e in est.trace.events[0] if isinstance(e, Collective) and e.op == "send"]
    assert sends == [4096 // 4 * width * 2] * 4 * 10  # 4 micro-batches a step, bf16
    reduces = [e for e in est.trace.events[0] if isinstance(e, Collective) and e.op == "all_reduce"]
    assert len(reduces) == 2 and reduces[0].group == (0, 2) and reduces[0].nbytes == est.params  # bf16: 2 B / 2
    assert "2 stages × 2 replicas, 4 micro-batches per step, 1f1b" in est.assumptions[1]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_nodes": 3}, "num_nodes=3 is not a multiple of stages=2"),
    ({"strategy": "sparta"}, "ddp .* or diloco"),
    ({"tokens_per_step": None, "tflops": None, "mfu": None, "step_time": 1.0}, "activations are tokens per micro"),
])
def test_what_a_pipeline_estimate_cannot_take_is_named(kwargs, message):
    args = {"strategy": "ddp", "params": 1e8, "num_nodes": 4, "max_steps": 2, "tokens_per_step": 4096, "tflops": 100,
            "mfu": 0.5, "pipeline": PipelineSpec(2)}
    with pytest.raises(ValueError, match=message):
        estimate(**{**args, **kwargs})


def test_a_bad_spec_is_named():
    with pytest.raises(ValueError, match="schedule must be one of"):
        PipelineSpec(2, 4, "zigzag")
    with pytest.raises(ValueError, match="stages"):
        PipelineSpec(0)
    with pytest.raises(ValueError, match="cuts must be >= 1, got 0"):
        PipelineSpec(3, cuts=[0, 2])
    assert PipelineSpec(3, cuts=[1, 2]).cuts == (1, 2)
    with pytest.raises(ValueError, match=r"routing must be None or one of 'random', 'balanced', got 'nearest'"):
        PipelineSpec(2, 4, "gpipe", routing="nearest")
    with pytest.raises(ValueError, match=r"routing='random' runs the GPipe schedule .* not '1f1b'"):
        PipelineSpec(2, 4, "1f1b", routing="random")
    with pytest.raises(ValueError, match=r"skip=0.25 runs the GPipe schedule"):
        PipelineSpec(3, 4, "1f1b", skip=0.25)
    with pytest.raises(ValueError, match=r"skip must be a probability in \[0, 1\], got 1.5"):
        PipelineSpec(3, 4, "gpipe", skip=1.5)


def test_a_skipped_stage_is_passed_over_both_ways_and_never_the_first_or_last():
    """SkipPipe: with skip = 1 every micro-batch goes from stage 0 straight to stage 3 and back; stages 1 and 2
    run nothing; with skip = 0.5 the skips are drawn apart from the routes, which stay as they were."""
    always = stage_work(PipelineSpec(4, 2, "gpipe", skip=1.0), 0, 1, step=0, seed=0)
    assert [(w.kind, w.before, w.after) for w in always] == [("F", None, 3)] * 2 + [("B", None, 3)] * 2
    assert stage_work(PipelineSpec(4, 2, "gpipe", skip=1.0), 1, 1, step=0, seed=0) == []
    assert {w.before for w in stage_work(PipelineSpec(4, 2, "gpipe", skip=1.0), 3, 1, 0, 0)} == {0}
    routed = PipelineSpec(4, 8, "gpipe", routing="balanced")
    half = dataclasses.replace(routed, skip=0.5)
    skipped = paths(half, 2, step=3, seed=1)
    assert all(path[0] is not None and path[3] is not None for by_m in skipped for path in by_m)
    assert 0 < sum(path[s] is None for by_m in skipped for path in by_m for s in (1, 2)) < 32
    assert all(a in (None, b) for x, y in zip(skipped, paths(routed, 2, 3, 1)) for p, q in zip(x, y)
               for a, b in zip(p, q))


def test_a_routed_micro_batch_starts_at_its_data_and_balanced_routing_deals_every_replica_m():
    """Paths are a pure function of (seed, step); stage 0 is the replica whose data it is; "balanced" gives each
    replica of a later stage exactly M micro-batches, "random" draws each independently (loads uneven)."""
    balanced, uneven = PipelineSpec(3, 4, "gpipe", routing="balanced"), PipelineSpec(3, 4, "gpipe", routing="random")
    route = paths(balanced, 3, step=5, seed=1)
    assert route == paths(balanced, 3, step=5, seed=1) and route != paths(balanced, 3, step=6, seed=1)
    assert all(route[q][m][0] == q for q in range(3) for m in range(4))
    for s in (1, 2):
        assert sorted(route[q][m][s] for q in range(3) for m in range(4)) == [0] * 4 + [1] * 4 + [2] * 4
    assert any(route[q][m][1] != q for q in range(3) for m in range(4))  # micro-batches leave their replica
    loads = [sorted(Counter(p[1] for by_m in paths(uneven, 3, step, 1) for p in by_m).values()) for step in range(8)]
    assert any(load != [4, 4, 4] for load in loads)
    assert paths(PipelineSpec(3, 4, "gpipe"), 3, 5, 1) == [[(q, q, q)] * 4 for q in range(3)]


def test_a_routed_stage_runs_what_reaches_it_in_the_order_every_rank_shares():
    """Each stage's forwards are the micro-batches routed to it, in (micro-batch, source) order, then its
    backwards in the same order; each comes from the rank its path says, and goes on to the next."""
    spec = PipelineSpec(2, 3, "gpipe", routing="random")
    route = paths(spec, 2, step=0, seed=7)
    for rank in range(4):
        replica, stage = divmod(rank, 2)
        mine = [(q, m) for m in range(3) for q in range(2) if route[q][m][stage] == replica]
        work = stage_work(spec, rank, 2, step=0, seed=7)
        assert [(w.kind, w.source, w.micro) for w in work] == [(k, q, m) for k in "FB" for q, m in mine]
        for w in work:
            assert w.before == (None if stage == 0 else route[w.source][w.micro][0] * 2)
            assert w.after == (None if stage == 1 else route[w.source][w.micro][1] * 2 + 1)



def test_a_replayed_pipeline_reports_each_stage_and_each_boundary():
    """Three stages, four micro-batches, GPipe, on a free network: every stage computes T/3 of each step's
    (M + S − 1)·T/(S·M), so each is busy 4/6 of the time; each boundary carries M activations and M gradients
    of A bytes per step."""
    free = Scenario.from_dict({"name": "free", "network": {"bandwidth": "100 Gbit/s", "latency": "0 s"},
                               "compute": {"mode": "wall"}})
    trace = pipeline_trace(PipelineSpec(3, 4, "gpipe"), replicas=2, steps=2, step_time=12.0, activation_bytes=1000,
                           stage_bytes=0, sync_every=0)
    result = simulate(trace, free)
    assert result.stages == 3
    assert result.stage_utilization() == pytest.approx([4 / 6] * 3, rel=1e-6)
    assert result.boundary_bytes() == [2 * 2 * 4 * 2 * 1000] * 2  # replicas × steps × M × both ways
    assert "pipeline: 3 stages, bubble 33.3%; stage utilization 66.7%, 66.7%, 66.7%" in result.summary()


def test_routed_micro_batches_cross_every_boundary_once_each_way():
    """Routing moves a micro-batch between replicas, not off its boundaries: a routed replay carries the
    unrouted bytes on each boundary, some of them between ranks of different replicas."""
    free = Scenario.from_dict({"name": "free", "network": {"bandwidth": "100 Gbit/s", "latency": "0 s"},
                               "compute": {"mode": "wall"}})
    args = dict(replicas=3, steps=2, step_time=12.0, activation_bytes=1000, stage_bytes=0, sync_every=0)
    routed = pipeline_trace(PipelineSpec(3, 4, "gpipe", routing="random"), **args)
    result = simulate(routed, free)
    assert result.boundary_bytes() == simulate(pipeline_trace(PipelineSpec(3, 4, "gpipe"), **args),
                                               free).boundary_bytes() == [3 * 2 * 4 * 2 * 1000] * 2
    assert any(c.group[0] // 3 != c.group[1] // 3 for r in range(9) for c in routed.collectives(r) if c.op == "send")
    assert routed.meta["pipeline"]["routing"] == "random"


@pytest.mark.parametrize(("codec", "wire"), [("lowrank:41", 4096 // 4 * 41 * 4), ("quantized:4", 1024 * 512 // 2 + 68)])
def test_the_cli_sizes_activations_by_the_boundary_codec(capsys, codec, wire):
    """``--boundary-codec`` sizes each micro-batch's activations (tokens per micro-batch × width) by the codec."""
    from exonet.cli import main

    assert main(["estimate", "--model-params", "1e8", "--strategy", "ddp", "--nodes", "2", "--stages", "2",
                 "--micro-batches", "4", "--steps", "2", "--tokens-per-step", "4096", "--tflops", "100", "--dtype",
                 "bf16", "--scenario", "datacenter", "--boundary-codec", codec]) == 0
    assert f"{wire:.4g} bytes of activations per micro-batch and boundary" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "match"), [
    (["--boundary-codec", "lowrank:8"], r"--boundary-codec compresses what crosses .*: give --stages"),
    (["--stages", "2", "--boundary-codec", "lowrank"], r"--boundary-codec: expected quantized:BITS, topk:TOP_K"),
    (["--routing", "random"], r"--routing routes micro-batches between .*: give --stages"),
    (["--stages", "2", "--routing", "random"], r"routing='random' runs the GPipe schedule"),
])
def test_a_boundary_codec_the_cli_cannot_use_is_named(capsys, argv, match):
    from exonet.cli import main

    assert main(["estimate", "--model-params", "1e8", "--strategy", "ddp", "--nodes", "2", "--steps", "2",
                 "--step-time", "1", "--scenario", "datacenter", *argv]) == 2
    assert re.search(match, capsys.readouterr().err)
