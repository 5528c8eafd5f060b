"""CUDA: K nodes sharing one device over gloo, bf16 autocast, DeMo and Streaming DiLoCo, the Communicator's
synchronisation before it reads clocks, and one rank per device over NCCL where several devices exist.

Marked ``gpu``; every test skips, saying why, on a machine without CUDA (CI has none).
Run them on a GPU machine with ``python -m pytest -m gpu``.
"""

from __future__ import annotations

import pytest
import torch

from exonet import LocalTrainer
from exonet.communicator import Communicator
from exonet.strategies import DDPStrategy, DeMoStrategy, OptimSpec, StreamingDiLoCoStrategy
from exonet.toy import synthetic_classification, tiny_mlp

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: no CUDA device on this machine"),
]

DATA = synthetic_classification(512, dim=8, classes=4)


def _fit(strategy, k: int, **kwargs):
    return LocalTrainer(tiny_mlp(), DATA, DATA).fit(strategy, num_nodes=k, device="cuda", max_steps=6, batch_size=16,
                                                    val_size=64, val_interval=3, seed=0, progress=False, **kwargs)


def test_nodes_sharing_one_device_use_gloo_with_cuda_tensors():
    result = _fit(DDPStrategy(OptimSpec("sgd", lr=0.1)), 2, devices=[0])
    assert result.config["backend"] == "gloo"
    assert result.payload_bytes(0) == result.payload_bytes(1) > 0
    assert len(result.history["train_loss"]) == 6


def test_bf16_autocast_trains_on_cuda():
    result = _fit(DDPStrategy(OptimSpec("adamw", lr=1e-3)), 2, devices=[0], autocast="bf16")
    assert all(torch.isfinite(torch.tensor(result.history["train_loss"])))


@pytest.mark.parametrize("strategy", [DeMoStrategy(OptimSpec("sgd", lr=1e-3)),
                                      StreamingDiLoCoStrategy(OptimSpec("adamw", lr=1e-3), H=3, num_fragments=2)],
                         ids=["demo", "streaming_diloco"])
def test_compressed_and_streaming_strategies_on_a_shared_device(strategy):
    result = _fit(strategy, 2, devices=[0])
    assert result.payload_bytes(0) > 0 and result.history["eval"][-1]["loss"] < 5


def test_the_communicator_synchronises_before_it_reads_the_clock():
    comm = Communicator(0, 1, torch.device("cuda", 0))
    comm.begin()
    x = torch.randn(4096, 4096, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        x = x @ x / 4096
    end.record()
    comm._flush_compute()  # what every collective does before it stamps its start
    gpu_s = start.elapsed_time(end) / 1e3  # valid: the flush synchronised the device
    assert comm.events[-1].wall_s >= 0.9 * gpu_s


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices for one rank per device over NCCL")
def test_one_rank_per_device_uses_nccl():
    k = min(4, torch.cuda.device_count())
    result = _fit(DDPStrategy(OptimSpec("sgd", lr=0.1)), k)
    assert result.config["backend"] == "nccl"
    assert len({result.payload_bytes(r) for r in range(k)}) == 1
