"""The runtime with real processes and real gloo collectives: equivalence, bytes, failures, concurrency."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch.utils.data import TensorDataset

from exonet import LocalTrainer, NodeFailure, Trainer, simulate
from exonet.rundir import load_run
from exonet.runtime.testing import FailingModel, ProbeStrategy
from exonet.strategies import AllReduceStrategy, DDPStrategy, OptimSpec
from exonet.toy import (
    ShardFactory,
    bench_mlp,
    linear_regressor,
    synthetic_classification,
    synthetic_regression,
    tiny_mlp,
)
from exonet.trace import Wait


def sgd_on_union(data: TensorDataset, k: int, batch: int, steps: int, lr: float,
                 dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """One process doing SGD on the union of the K node batches (unshuffled DistributedSampler order)."""
    model = linear_regressor().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    shards = [list(range(len(data)))[r::k] for r in range(k)]
    for s in range(steps):
        idx = [i for shard in shards for i in shard[s * batch:(s + 1) * batch]]
        opt.zero_grad()
        model(data[idx]).backward()
        opt.step()
    return model


@pytest.fixture(scope="module")
def ddp_run():
    data = synthetic_regression(n=96)
    result = LocalTrainer(linear_regressor(), data).fit(
        DDPStrategy(OptimSpec("sgd", lr=0.05)), num_nodes=3, max_steps=6, batch_size=4, shuffle=False, progress=False)
    return data, result


def test_ddp_equals_sgd_on_union_of_node_batches(ddp_run):
    data, result = ddp_run
    reference = sgd_on_union(data, k=3, batch=4, steps=6, lr=0.05)
    for (name, got), want in zip(result.model.named_parameters(), reference.parameters()):
        assert torch.allclose(got, want, atol=1e-5), name


def test_ddp_payload_is_4P_per_step(ddp_run):
    _, result = ddp_run
    p = sum(t.numel() for t in result.model.parameters())
    for rank in range(3):
        assert result.payload_bytes(rank) == 4 * p * 6
        assert result.payload_bytes_per_step(rank) == [4 * p] * 6


def test_trace_records_one_collective_per_step_and_history(ddp_run):
    _, result = ddp_run
    trace = result.trace
    assert trace.num_nodes == 3 and all(trace.num_steps(r) == 6 for r in range(3))
    ops = [c.op for c in trace.collectives(1)]
    assert ops == ["all_reduce"] * 6
    # overlapped DDP: the one bucket of this small model is launched async from backward and waited for in step()
    assert all(c.group is None and c.async_op and c.start_s >= 0 for c in trace.collectives(0))
    assert sum(isinstance(e, Wait) for e in trace.events[0]) == 6
    assert len(result.history["train_loss"]) == 6
    trace.validate()


def test_gradient_accumulation_matches_full_batch():
    data = synthetic_regression(n=64)
    kwargs = dict(num_nodes=2, max_steps=3, batch_size=8, shuffle=False, progress=False)
    full = LocalTrainer(linear_regressor(), data).fit(DDPStrategy(OptimSpec("sgd", lr=0.1)), **kwargs)
    micro = LocalTrainer(linear_regressor(), data).fit(DDPStrategy(OptimSpec("sgd", lr=0.1)), minibatch_size=3,
                                                       **kwargs)
    for a, b in zip(full.model.parameters(), micro.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_every_communicator_op_gives_the_right_answer_and_is_traced():
    result = LocalTrainer(tiny_mlp(), synthetic_classification(96, dim=8, classes=4)).fit(
        ProbeStrategy(OptimSpec("sgd", lr=0.01)), num_nodes=3, max_steps=2, batch_size=4, progress=False)
    ops0 = [c.op for c in result.trace.collectives(0)]
    assert ops0[:12] == ["all_reduce", "all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all",
                         "reduce", "gather", "scatter", "barrier", "all_reduce", "all_reduce"]
    assert [c.group for c in result.trace.collectives(0)][11] == (0, 1)
    assert len(list(result.trace.collectives(2))) == 2 * 13  # rank 2 is outside the subgroup
    grouped = [c for c in result.trace.collectives(0) if c.op in ("send", "recv")]
    assert [(c.op, c.group, c.async_op) for c in grouped[:2]] == [("send", (0, 1), True), ("recv", (0, 2), True)]
    # payload is what each rank passes in: 2n + 2n floats, 3 (own part), 5, 2n, n, then reduce 2n, gather 3 (own
    # part), scatter 2n (the full input), barrier 0, then 4 and 2 (subgroup), and the 6 batch_isend_irecv sends
    n = 3
    per_step = 2 * n + 2 * n + 3 + 5 + 2 * n + n + 2 * n + 3 + 2 * n + 4 + 2 + 6
    assert result.payload_bytes_per_step(0) == [4 * per_step] * 2
    assert simulate(result.trace, "datacenter").wall_clock_s > 0  # every op replays
    asyncs = [c for c in result.trace.collectives(1) if c.async_op]
    assert len(asyncs) == 2 * 3  # the async all-reduce and the grouped send and recv, each step
    result.trace.validate()


def test_dataset_factory_builds_one_shard_per_node():
    result = LocalTrainer(tiny_mlp(), ShardFactory(n=128), ShardFactory(n=64)).fit(
        AllReduceStrategy(OptimSpec("adam", lr=0.01)), num_nodes=2, max_steps=4, batch_size=8, val_interval=2,
        val_size=32, progress=False)
    assert [e["step"] for e in result.history["eval"]] == [0, 2, 4]
    assert all(e["drift"] < 1e-6 and abs(e["correlation"] - 1) < 1e-4 for e in result.history["eval"])


def test_node_raising_fails_fast_with_rank_and_traceback_and_leaves_nothing(node_pids, ceiling_s):
    model = FailingModel(fail_rank=1, fail_step=3, message="deliberate failure at step 3")
    t0 = time.monotonic()
    with pytest.raises(NodeFailure) as info:
        LocalTrainer(model, synthetic_classification(256, dim=8, classes=4)).fit(
            DDPStrategy(), num_nodes=2, max_steps=20, batch_size=8, progress=False)
    assert time.monotonic() - t0 < ceiling_s  # promptly: not at fit's 30-minute progress timeout
    assert info.value.rank == 1
    assert "deliberate failure at step 3" in str(info.value) and "Traceback" in str(info.value)
    assert node_pids() == []


def test_two_concurrent_fits_both_succeed():
    results: dict[int, object] = {}

    def run(i: int) -> None:
        results[i] = LocalTrainer(tiny_mlp(seed=i), synthetic_classification(128, dim=8, classes=4)).fit(
            DDPStrategy(), num_nodes=2, max_steps=5, batch_size=8, progress=False)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0, 1]
    assert all(len(r.history["train_loss"]) == 5 for r in results.values())


def test_same_seed_same_curve_and_run_directory(tmp_path):
    data = synthetic_classification(256, dim=8, classes=4)
    runs = [LocalTrainer(tiny_mlp(), data).fit(DDPStrategy(), num_nodes=2, max_steps=5, batch_size=8, seed=3,
                                               progress=False, run_dir=tmp_path) for _ in range(2)]
    assert runs[0].history["train_loss"] == runs[1].history["train_loss"]
    config, history, trace = load_run(runs[0].run_dir)
    assert config["num_nodes"] == 2 and config["strategy"]["strategy"] == "DDPStrategy"
    assert history["train_loss"] == runs[0].history["train_loss"]
    assert trace.payload_bytes(1) == runs[0].payload_bytes(1)
    other = LocalTrainer(tiny_mlp(), data).fit(DDPStrategy(), num_nodes=2, max_steps=5, batch_size=8, seed=4,
                                               progress=False)
    assert other.history["train_loss"] != runs[0].history["train_loss"]


@pytest.mark.slow
def test_seed_style_snippet_runs_as_written():
    model, train_dataset, val_dataset = (bench_mlp(), synthetic_classification(4096),
                                         synthetic_classification(512, train=False))
    trainer = LocalTrainer(model, train_dataset, val_dataset)
    result = trainer.fit(strategy=DDPStrategy(optim_spec=OptimSpec("adamw", lr=1e-3)),
                         num_nodes=4, device="cpu", max_steps=200, batch_size=32,
                         val_interval=50, val_size=256, seed=0)
    assert len(result.history["train_loss"]) == 200
    assert result.history["train_loss"][-1] < result.history["train_loss"][0] / 10
    assert [e["step"] for e in result.history["eval"]] == [0, 50, 100, 150, 200]
    assert Trainer is LocalTrainer


@pytest.mark.parametrize(("kwargs", "exc", "text"), [
    (dict(num_nodes=0), ValueError, "num_nodes"),
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(batch_size=8, minibatch_size=16), ValueError, "minibatch_size"),
    (dict(device="tpu"), ValueError, "device"),
    (dict(batch_size=64, num_nodes=2), ValueError, "fewer than one batch"),
    (dict(max_steps=0), ValueError, "max_steps"),
    (dict(bogus=1), TypeError, "bogus"),
])
def test_bad_arguments_name_the_argument(kwargs, exc, text):
    trainer = LocalTrainer(tiny_mlp(), synthetic_classification(64, dim=8, classes=4))
    with pytest.raises(exc, match=text):
        trainer.fit(DDPStrategy(), progress=False, **kwargs)


def test_bad_optimizer_specs_name_the_optimizer_and_the_option():
    with pytest.raises(ValueError, match="unknown optimizer 'adamm'.*adamw"):
        OptimSpec("adamm")
    with pytest.raises(TypeError, match="momentumm"):
        OptimSpec("sgd", lr=0.1, momentumm=0.9)


def test_a_strategy_that_is_not_one_is_a_type_error_naming_strategy():
    with pytest.raises(TypeError, match="strategy"):
        LocalTrainer(tiny_mlp(), synthetic_classification(64, dim=8, classes=4)).fit("ddp")


def test_start_port_is_accepted_with_a_warning():
    with pytest.warns(UserWarning, match="start_port"):
        LocalTrainer(tiny_mlp(), synthetic_classification(64, dim=8, classes=4), start_port=12345)


def test_float64_model_keeps_float64_precision_through_the_final_average():
    data = TensorDataset(*(t.double() for t in synthetic_regression(n=64).tensors))
    result = LocalTrainer(linear_regressor().double(), data).fit(
        DDPStrategy(OptimSpec("sgd", lr=0.05)), num_nodes=2, max_steps=4, batch_size=4, shuffle=False, progress=False)
    reference = sgd_on_union(data, k=2, batch=4, steps=4, lr=0.05, dtype=torch.float64)
    for got, want in zip(result.model.parameters(), reference.parameters()):
        assert got.dtype == torch.float64 and torch.allclose(got, want, atol=1e-12, rtol=0)


def test_warm_up_starts_the_server_every_fit_forks_from_without_importing_torch(node_pids):
    import subprocess
    import sys
    from multiprocessing import forkserver

    import exonet

    script = ("import sys, exonet; exonet.warm_up(); from multiprocessing import forkserver; "
              "print(forkserver._forkserver._forkserver_pid is not None, 'torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True).stdout.split() == ["True", "False"]  # started before the caller imports torch
    exonet.warm_up()
    server = forkserver._forkserver._forkserver_pid
    exonet.warm_up()  # twice: the same server
    assert forkserver._forkserver._forkserver_pid == server
    LocalTrainer(linear_regressor(4, 1), TensorDataset(torch.randn(32, 4), torch.randn(32, 1))).fit(
        DDPStrategy(OptimSpec("sgd", lr=0.1)), num_nodes=2, max_steps=2, batch_size=4, progress=False)
    assert forkserver._forkserver._forkserver_pid == server and node_pids() == []


def test_a_fit_says_where_its_start_up_went(ddp_run):
    """``FitResult.startup``: seconds from fit's call to each part, the parent's and then the last trainer's, in the
    order they happen (``python -m exonet.bench runtime --startup`` prints them)."""
    _, result = ddp_run
    parts = ["imported", "configured", "nodes started", "forked", "joined", "loaded", "set up", "first step"]
    assert list(result.startup) == parts
    times = [result.startup[part] for part in parts]
    assert 0 <= times[0] <= times[1] <= times[2]  # the parent imports, checks, then starts the nodes
    assert times[1] <= times[3] and times[3:] == sorted(times[3:])  # a node forks, joins, loads, sets up, steps
    assert times[-1] < result.real_time_s + times[2]  # the first step ends inside the run
