"""estimate: a layer stack or the user's own module on meta tensors, with backward hooks that overlap buckets."""

from __future__ import annotations

import math
import re

import pytest
import torch

from exonet.estimate import LayerStack, estimate, simulate_estimate
from exonet.scenario import Scenario
from exonet.toy import bench_mlp
from exonet.trace import Collective, Compute, Step, Wait

BENCH_P = sum(p.numel() for p in bench_mlp().parameters())


def first_step(events):
    return events[: next(i for i, e in enumerate(events) if isinstance(e, Step))]


def test_a_users_module_is_built_on_meta_and_its_buckets_overlap_backward():
    e = estimate("ddp:bucket_cap_mb=0.1", model="exonet.toy:bench_mlp", num_nodes=2, max_steps=3, step_time=0.3)
    assert e.params == BENCH_P and e.trace.payload_bytes_per_step(0) == [4 * BENCH_P] * 3
    step = first_step(e.trace.events[0])
    kinds = [type(x).__name__ for x in step]
    assert kinds[0] == "Compute" and step[0].wall_s == pytest.approx(0.1)  # forward: a third of the step
    launches = [i for i, x in enumerate(step) if isinstance(x, Collective)]
    assert len(launches) >= 2 and all(step[i].async_op for i in launches)
    assert any(isinstance(x, Compute) and x.wall_s > 0 for x in step[launches[0]:launches[-1]])  # backward between
    assert sum(x.wall_s for x in step if isinstance(x, Compute)) == pytest.approx(0.3)
    assert [x for x in step if isinstance(x, Wait)] and max(launches) < min(i for i, x in enumerate(step)
                                                                            if isinstance(x, Wait))


def test_the_layer_stack_is_sized_as_real_models_are_and_holds_about_the_parameters_asked_for():
    stack = LayerStack(1_000_000_000, 24, torch.bfloat16)
    assert (stack.width, stack.vocab) == (1792, 41984)  # ⌊√(1e9 / 288) / 128⌋·128; the rest in a V×d embedding
    assert sum(p.numel() for p in stack.parameters()) == 24 * 12 * 1792**2 + 41984 * 1792
    assert abs(sum(p.numel() for p in stack.parameters()) - 1e9) <= 64 * 1792
    with pytest.raises(ValueError, match="layers="):
        estimate("ddp", params=1e6, num_nodes=2, max_steps=1, step_time=1.0, layers=0)
    with pytest.raises(ValueError, match=r"params=1.5: 24 transformer-like blocks cannot hold .* has 288\)"):
        estimate("ddp", params=1.5, num_nodes=2, max_steps=1, step_time=1.0)  # 1.5e9 meant
    with pytest.raises(ValueError, match="model="):
        estimate("ddp", model="no_such_module:f", num_nodes=2, max_steps=1, step_time=1.0)
    with pytest.raises(ValueError, match="not both"):
        estimate("ddp", params=1e6, model="exonet.toy:bench_mlp", num_nodes=2, max_steps=1, step_time=1.0)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"step_time": 1.0, "tokens_per_step": 1000, "tflops": 100}, "step_time=, or tokens_per_step= .* not both"),
    ({"step_time": 1.0, "mfu": 0.5}, "not both"),
    ({"model": "exonet.toy:digits_mlp", "params": None, "step_time": 1.0, "layers": 4}, "a model= has its own layers"),
    ({"tokens_per_step": 1000}, "needs tflops= .*or a scenario"),
    ({"tokens_per_step": 1000, "scenario": "datacenter"}, None),
    ({"tokens_per_step": 1000, "scenario": {"name": "m", "network": {"bandwidth": "1 Gbit/s"}}},
     "scenario 'm' times compute by 'measured', not by FLOPs; give tflops="),
    ({"tokens_per_step": 1000, "tflops": 0.0}, "tflops= must be a finite number > 0"),
    ({"tokens_per_step": 1000, "tflops": math.inf}, "tflops= must be a finite number > 0, got inf"),
    ({"step_time": 1.0, "tokens_per_step": 5000}, "not both"),  # the tokens were dropped without a word
    ({"tokens_per_step": -1000, "tflops": 100}, "tokens_per_step= must be a finite number > 0, got -1000"),
    ({"tokens_per_step": math.inf, "tflops": 100}, "tokens_per_step= must be a finite number > 0, got inf"),
    ({"params": math.inf, "step_time": 1.0}, "params=, num_nodes= and max_steps= must be finite and >= 1, got inf"),
])
def test_compute_is_given_one_way_and_the_other_options_are_not_ignored(kwargs, match):
    args = {"params": 1e6, "num_nodes": 2, "max_steps": 1, **kwargs}
    if match is not None:
        with pytest.raises(ValueError, match=match):
            estimate("ddp", **args)
        return
    est = estimate("ddp", **args)  # the scenario's device: datacenter's TFLOP/s and MFU
    r = Scenario.load("datacenter").resolve(1)
    assert est.step_time_s == pytest.approx(6 * 1e6 * 1000 / (r.tflops * 1e12 * r.mfu), rel=1e-6)
    assert "the device of scenario 'datacenter'" in est.assumptions[1]
    assert " at " not in estimate("ddp", params=1e6, num_nodes=2, max_steps=1, step_time=1.0).assumptions[1]

@pytest.mark.parametrize("argv, match", [
    (["--model-params", "1e30", "--step-time", "1"],  # was torch's "Storage size calculation overflowed"
     r"--model-params 1e\+30: more than the layer stack holds \(1e\+18 parameters"),
    (["--model-params", "1e9", "--step-time", "1e300"],  # was OverflowError: cannot convert float infinity
     r"--step-time 1e\+300: 10 steps of it are 1e\+301 s of compute, more than the simulated clock holds "
     r"\(4.87e\+288 s\)"),
    (["--model-params", "1e9", "--tokens-per-step", "1e300", "--tflops", "1", "--mfu", "0.5"],
     r"--tokens-per-step 1e\+300 at 1 TFLOP/s and MFU 0.5 \(a step of inf s\): 10 steps"),
    (["--model-params", "1e9", "--step-time", "1", "--layers", "1000000000"],  # was building 4e9 tensors
     r"--layers 1000000000: more blocks than 1e\+09 parameters fill"),
], ids=["params 1e30", "step time 1e300", "tokens 1e300", "layers 1e9"])
def test_numbers_beyond_what_the_model_holds_are_named(capsys, argv, match):
    from exonet.cli import main

    assert main(["estimate", "--strategy", "ddp", "--nodes", "2", "--steps", "10", "--scenario", "datacenter",
                 *argv]) == 2
    assert re.search(r"^exonet estimate: error: " + match, capsys.readouterr().err)


def test_the_largest_numbers_the_model_holds_are_accepted():
    assert estimate("ddp", params=1e18, num_nodes=2, max_steps=1, step_time=1.0, layers=1).params == pytest.approx(1e18,
                                                                                                         rel=1e-3)
    assert estimate("ddp", params=1e6, num_nodes=2, max_steps=10, step_time=4e287).step_time_s == 4e287


def test_overlap_beats_one_flat_all_reduce_in_an_estimate():
    scenario = {"name": "lan", "network": {"bandwidth": "10 Gbit/s"}}
    kwargs = dict(params=4e8, num_nodes=4, max_steps=3, step_time=0.2, dtype="bf16", layers=8)
    over = simulate_estimate(estimate("ddp", **kwargs).trace, scenario)
    flat = simulate_estimate(estimate("ddp:overlap=False", **kwargs).trace, scenario)
    assert over.per_node[0].compute_s == pytest.approx(flat.per_node[0].compute_s) == pytest.approx(0.6)
    assert 0.6 <= over.wall_clock_s < flat.wall_clock_s


@pytest.mark.parametrize(("spec", "match"), [
    ("diloco:H=50,outer_lr=0.7", r"strategy=diloco: unknown argument 'outer_lr' \(did you mean 'outer_optim_spec'\?\)"),
    ("diloco:h=5", r"unknown argument 'h' \(did you mean 'H'\?\)"),
    ("ddp:H=5", "unknown argument 'H'; DDPStrategy takes optim_spec, bucket_cap_mb, overlap"),
    ("sparta:p=0.01", "unknown argument 'p'.*takes optim_spec, p_sparta"),  # the gym's spelling: a warning in code
])
def test_a_strategy_spec_names_only_the_strategys_own_arguments(spec, match):
    from exonet.estimate import parse_strategy

    with pytest.raises(ValueError, match=match):
        parse_strategy(spec)
    assert parse_strategy("diloco:H=50,outer_optim_spec='sgd'").H == 50


def test_estimate_takes_fits_names_and_the_old_ones_warn():
    new = estimate("ddp", params=1e6, num_nodes=2, max_steps=3, step_time=1.0)
    with pytest.warns(DeprecationWarning, match="nodes= is deprecated, use num_nodes="):
        old = estimate("ddp", params=1e6, nodes=2, max_steps=3, step_time=1.0)
    assert old.trace.num_nodes == new.trace.num_nodes == 2 and old.trace.num_steps(0) == 3
    with pytest.raises(TypeError, match="max_steps is missing|missing required keyword argument 'max_steps'"):
        estimate("ddp", params=1e6, num_nodes=2, step_time=1.0)
    with pytest.raises(TypeError, match="steps is the old spelling of max_steps; pass only max_steps"):
        estimate("ddp", params=1e6, num_nodes=2, max_steps=3, steps=3, step_time=1.0)
