"""A strategy file written against torch.distributed and the seed gym's base class runs in fit, every byte counted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch

from exonet import LocalTrainer
from exonet.errors import NodeFailure
from exonet.strategies.gym_protocol import GymProtocol, as_strategy
from exonet.toy import linear_regressor, synthetic_regression
from exonet.trace import Collective


def _strategy_file():
    """tests/gym_style_strategy.py, imported as a user's own module would be; its classes travel to the nodes by
    value (the test directory is not on the nodes' path)."""
    path = Path(__file__).with_name("gym_style_strategy.py")
    spec = importlib.util.spec_from_file_location("gym_style_strategy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gym_style_strategy"] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


FILE = _strategy_file()
MasterCopyDiLoCo, ObjectGather = FILE.MasterCopyDiLoCo, FILE.ObjectGather

K, STEPS, H = 3, 6, 2


@pytest.fixture(scope="module")
def gym_run():
    return LocalTrainer(linear_regressor(), synthetic_regression(n=96), synthetic_regression(n=32, seed=1)).fit(
        MasterCopyDiLoCo(H=H), num_nodes=K, max_steps=STEPS, batch_size=4, shuffle=False, progress=False,
        val_interval=STEPS, val_size=32)


def test_a_gym_protocol_object_is_run_whatever_its_base_class():
    wrapped = as_strategy(MasterCopyDiLoCo())
    assert isinstance(wrapped, GymProtocol) and as_strategy(wrapped) is wrapped
    with pytest.raises(TypeError, match="has no _init_node, step, zero_grad"):
        GymProtocol(object())


def test_its_torch_distributed_calls_are_traced_and_counted_to_the_byte(gym_run):
    """Per round: the list all_gather of the flat parameters (4P bytes in), the async 4-byte all_reduce, the
    broadcast of the master copy (4P): nothing else, and the payload is their sum."""
    p = sum(t.numel() for t in linear_regressor().parameters())
    round_calls = [("all_gather", 4 * p, False), ("all_reduce", 4, True), ("broadcast", 4 * p, False)]
    for rank in range(K):
        calls = [(e.op, e.nbytes, e.async_op) for e in gym_run.trace.events[rank] if isinstance(e, Collective)]
        assert calls == round_calls * (STEPS // H)
    assert gym_run.trace.payload_per_trainer() == (8 * p + 4) * (STEPS // H)


def test_it_trains_as_the_gym_trainer_drives_it(gym_run):
    """Every replica ends on the broadcast master copy: rank 0's own model and the node-averaged one score alike,
    and both moved from the initial model."""
    first, last = gym_run.history["eval"][0], gym_run.history["eval"][-1]
    assert (first["step"], last["step"]) == (0, STEPS)
    assert last["local_loss"] == pytest.approx(last["loss"], rel=1e-6) and last["loss"] != first["loss"]


def test_a_call_exonet_cannot_model_ends_the_run_naming_the_call_and_the_line():
    with pytest.raises(NodeFailure, match=r"torch\.distributed\.all_gather_object at .*gym_style_strategy\.py:\d+"):
        LocalTrainer(linear_regressor(), synthetic_regression(n=96)).fit(
            ObjectGather(H=H), num_nodes=2, max_steps=2, batch_size=4, progress=False)


def test_routing_ends_with_the_node_and_never_touches_the_parent():
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    assert dist.all_reduce is distributed_c10d.all_reduce and dist.P2POp is distributed_c10d.P2POp
    assert torch.distributed.all_gather_object is distributed_c10d.all_gather_object


def test_every_routed_call_gives_torchs_result_and_is_traced_once():
    """K = 2, one step: each routed function returns what torch.distributed would (the strategy asserts every
    value), and the trace holds each call as exonet's own op, in order."""
    run = LocalTrainer(linear_regressor(), synthetic_regression(n=32)).fit(
        FILE.EveryCall(), num_nodes=2, max_steps=1, batch_size=4, progress=False, val_size=0)
    ops = [e.op for e in run.trace.events[0] if isinstance(e, Collective)]
    assert ops == ["all_reduce", "all_gather", "all_gather", "broadcast", "reduce", "gather", "scatter",
                   "reduce_scatter", "all_to_all", "send", "recv", "send", "recv", "barrier"]
