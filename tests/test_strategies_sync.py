"""FedAvg, DiLoCo, SPARTA and SPARTA+DiLoCo: validation, equivalences and payload bytes.

Process tests share their fits through module-scoped fixtures (each fit costs about a
second of process start-up); the rest runs in this process.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from exonet import LocalTrainer
from exonet.communicator import Communicator
from exonet.strategies.base import NodeContext, OptimSpec, flatten
from exonet.strategies.ddp import DDPStrategy
from exonet.strategies.diloco import DiLoCoStrategy
from exonet.strategies.fedavg import FedAvgStrategy
from exonet.strategies.sparta import SparseAverager, SPARTAStrategy
from exonet.strategies.sparta_diloco import SPARTADiLoCoStrategy
from exonet.toy import bench_mlp, linear_regressor, synthetic_classification, synthetic_regression, tiny_mlp

STEPS = 6
P = sum(p.numel() for p in tiny_mlp().parameters())  # 212 parameters, fp32
SGD = OptimSpec("sgd", lr=0.1)
ADAMW = OptimSpec("adamw", lr=0.01)
PLAIN_OUTER = OptimSpec("sgd", lr=1.0)  # outer SGD lr 1, no momentum: the outer step adopts the mean


def _fit(strategy, num_nodes=2, steps=STEPS, model=None, data=None):
    model = tiny_mlp() if model is None else model
    data = synthetic_classification(256, 8, 4) if data is None else data
    return LocalTrainer(model, data).fit(strategy, num_nodes=num_nodes, max_steps=steps, batch_size=16, seed=0,
                                         progress=False)


def _params(result) -> torch.Tensor:
    return flatten([p.detach() for p in result.model.parameters()])


def _assert_same_run(a, b, atol=1e-5):
    torch.testing.assert_close(_params(a), _params(b), rtol=0, atol=atol)
    assert a.history["train_loss"] == pytest.approx(b.history["train_loss"], abs=atol)


# ------------------------------------------------------------------ construction
@pytest.mark.parametrize("make, argument", [
    (lambda: DiLoCoStrategy(H=0), "H"),
    (lambda: DiLoCoStrategy(H=2.5), "H"),
    (lambda: FedAvgStrategy(H=True), "H"),
    (lambda: DiLoCoStrategy(participation=0), "participation"),
    (lambda: FedAvgStrategy(participation=1.5), "participation"),
    (lambda: FedAvgStrategy(island_size=0), "island_size"),
    (lambda: DiLoCoStrategy(max_norm=-1.0), "max_norm"),
    (lambda: SPARTAStrategy(p_sparta=0), "p_sparta"),
    (lambda: SPARTAStrategy(p_sparta=1.01), "p_sparta"),
    (lambda: SPARTADiLoCoStrategy(p_sparta=float("nan")), "p_sparta"),
    (lambda: SPARTADiLoCoStrategy(sparta_interval=0), "sparta_interval"),
    (lambda: DiLoCoStrategy(optim_spec="adamm"), "optim_spec"),
    (lambda: SPARTAStrategy(optim_spec="nope"), "optim_spec"),
    (lambda: DiLoCoStrategy(outer_optim_spec="sgdd"), "outer_optim_spec"),
    (lambda: DiLoCoStrategy(outer_optim_spec=42), "outer_optim_spec"),
    (lambda: SPARTADiLoCoStrategy(optim_spec="sgd", inner_optim_spec="adam"), "inner_optim_spec"),
    (lambda: FedAvgStrategy(warmup_steps=-1), "warmup_steps"),
])
def test_bad_arguments_fail_at_construction_naming_the_argument(make, argument):
    with pytest.raises((ValueError, TypeError), match=argument):
        make()


def test_seed_gym_spellings_and_paper_defaults():
    d = DiLoCoStrategy("adam", H=100)
    assert d.optim_spec.cls is torch.optim.Adam and d.H == 100
    assert d.outer_optim_spec.cls is torch.optim.SGD
    assert d.outer_optim_spec.kwargs == {"lr": 0.7, "momentum": 0.9, "nesterov": True}
    assert DiLoCoStrategy(optim_spec="sgd", outer_optim_spec=PLAIN_OUTER).outer_optim_spec is PLAIN_OUTER
    assert DiLoCoStrategy().optim_spec.cls is torch.optim.AdamW
    assert FedAvgStrategy("sgd", island_size=2, H=5).island_size == 2 and FedAvgStrategy().H == 1
    assert SPARTAStrategy().p_sparta == 0.005
    s = SPARTADiLoCoStrategy(inner_optim_spec="sgd", p_sparta=0.1, sparta_interval=5, H=50)
    assert s.optim_spec.cls is torch.optim.SGD and (s.p_sparta, s.sparta_interval, s.H) == (0.1, 5, 50)
    assert s.config()["outer_optim_spec"]["nesterov"] is True


# ------------------------------------------------------------------ rounds, masks, outer step (in process)
def _bound(strategy, rank=0, num_nodes=1, model=None):
    """``strategy`` set up as node ``rank`` of ``num_nodes`` in this process (seed 0), without collectives."""
    strategy.setup(tiny_mlp() if model is None else model, Communicator(rank, num_nodes, torch.device("cpu")),
                   NodeContext(rank, num_nodes, 100, 0, torch.device("cpu")))
    return strategy


@pytest.mark.parametrize("k, island_size, participation, sizes, redrawn", [
    (7, 3, 1.0, [3, 4], True),          # a lone leftover node joins the last island
    (8, 3, 1.0, [2, 3, 3], True),       # a leftover pair is an island of its own
    (7, None, 0.5, [4], True),          # ceil(0.5 * 7) participants
    (10, 2, 0.6, [2, 2, 2], True),      # islands are cut from the participants
    (5, 9, 1.0, [5], False),            # island_size >= K: one island
    (3, 1, 1.0, [1, 1, 1], False),      # islands of one: no averaging
])
def test_round_groups_partition_the_participants_identically_on_every_node(k, island_size, participation, sizes,
                                                                            redrawn):
    nodes = [_bound(FedAvgStrategy(island_size=island_size, participation=participation), r, k) for r in range(k)]
    partitions = []
    for round_index in range(1, 7):
        groups = {r: nodes[r].round_group(round_index) for r in range(k)}
        islands = {g for g in groups.values() if g is not None}
        for r, g in groups.items():
            assert g is None or r in g
        assert all(groups[m] == g for g in islands for m in g)               # every member sees the same island
        assert sorted(len(g) for g in islands) == sizes
        assert sum(len(g) for g in islands) == max(1, math.ceil(participation * k - 1e-9))
        partitions.append(frozenset(islands))
    assert (len(set(partitions)) > 1) == redrawn                             # redrawn from the seed each round


def test_sparse_indices_are_shared_distinct_and_about_p_of_the_parameters():
    params = list(bench_mlp().parameters())
    numel = sum(p.numel() for p in params)
    a, b = SparseAverager(0.005), SparseAverager(0.005)
    a.bind(params, None, seed=3)
    b.bind(params, None, seed=3)
    idx = a.indices(7)
    assert torch.equal(idx, b.indices(7)) and not torch.equal(idx, a.indices(8))
    assert (idx[1:] > idx[:-1]).all() and 0 <= idx[0] and idx[-1] < numel
    assert 0.9 * 0.005 * numel <= len(idx) <= a.k
    dense = SparseAverager(1.0)
    dense.bind(params, None, seed=3)
    assert torch.equal(dense.indices(1), torch.arange(numel))
    quarter = SparseAverager(0.25)
    quarter.bind(params, None, seed=3)
    assert len(quarter.indices(1)) == round(0.25 * numel)                   # dense regime: exactly k


def _train_alone(strategy, steps):
    """One node (K = 1) training a linear regressor in this process; no collective is needed."""
    model = linear_regressor()
    _bound(strategy, model=model)
    x, y = synthetic_regression(64).tensors
    for step in range(steps):
        strategy.zero_grad()
        model((x[8 * step: 8 * step + 8], y[8 * step: 8 * step + 8])).backward()
        strategy.step()
    return model


def test_diloco_on_one_node_takes_the_nesterov_outer_step_after_exactly_H_steps():
    lr, mu, H = 0.7, 0.9, 2
    model = _train_alone(DiLoCoStrategy(SGD, H=H), steps=2 * H)
    ref = linear_regressor()
    inner = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = synthetic_regression(64).tensors
    theta = flatten([p.detach() for p in ref.parameters()]).clone()
    momentum = torch.zeros_like(theta)
    for step in range(2 * H):
        inner.zero_grad()
        ref((x[8 * step: 8 * step + 8], y[8 * step: 8 * step + 8])).backward()
        inner.step()
        if (step + 1) % H == 0:
            delta = theta - flatten([p.detach() for p in ref.parameters()])
            momentum = mu * momentum + delta
            theta = theta - lr * (delta + mu * momentum)
            torch.nn.utils.vector_to_parameters(theta.clone(), ref.parameters())  # a copy: params must not alias θ
    torch.testing.assert_close(flatten([p.detach() for p in model.parameters()]), theta, rtol=0, atol=1e-6)


def test_diloco_state_dict_restores_theta_global_and_outer_momentum():
    first = DiLoCoStrategy(SGD, H=2)
    model = _train_alone(first, steps=3)          # mid-round: θ_global and the outer momentum are set
    state = copy.deepcopy(first.state_dict())     # as a checkpoint would: no tensor shared with `first`
    assert set(state) >= {"local_step", "optimizer", "global_params", "outer_optimizer"}
    second = DiLoCoStrategy(SGD, H=2)
    clone = linear_regressor()
    clone.load_state_dict(model.state_dict())
    _bound(second, model=clone)
    second.load_state_dict(state)
    assert second.local_step == 3 and torch.equal(second.global_params, first.global_params)
    x, y = synthetic_regression(64, seed=1).tensors
    for strategy, m in ((first, model), (second, clone)):
        strategy.zero_grad()
        m((x[:8], y[:8])).backward()
        strategy.step()                            # step 4 ends a round: the outer momentum matters
    assert torch.equal(flatten([p.detach() for p in model.parameters()]),
                       flatten([p.detach() for p in clone.parameters()]))


# ------------------------------------------------------------------ equivalences (real processes)
@pytest.fixture(scope="module")
def ddp_sgd():
    return _fit(DDPStrategy(SGD))


@pytest.fixture(scope="module")
def fedavg_h1():
    return _fit(FedAvgStrategy(ADAMW, H=1))


@pytest.fixture(scope="module")
def fedavg_h3():
    return _fit(FedAvgStrategy(ADAMW, H=3))


@pytest.fixture(scope="module")
def diloco_h3():
    return _fit(DiLoCoStrategy(ADAMW, outer_optim_spec=PLAIN_OUTER, H=3))


def test_diloco_h1_with_plain_outer_sgd_equals_ddp(ddp_sgd):
    _assert_same_run(_fit(DiLoCoStrategy(SGD, outer_optim_spec=PLAIN_OUTER, H=1)), ddp_sgd)


def test_fedavg_equals_diloco_with_outer_sgd_lr1_no_momentum(fedavg_h3, diloco_h3):
    _assert_same_run(fedavg_h3, diloco_h3)


def test_sparta_p1_equals_per_step_parameter_averaging(fedavg_h1, ddp_sgd):
    _assert_same_run(_fit(SPARTAStrategy(ADAMW, p_sparta=1.0)), fedavg_h1)
    assert not torch.allclose(_params(fedavg_h1), _params(ddp_sgd), atol=1e-3)  # AdamW: not DDP in disguise


def test_sparta_diloco_p1_is_per_step_averaging_with_outer_steps_that_adopt_the_mean(fedavg_h1):
    _assert_same_run(_fit(SPARTADiLoCoStrategy(ADAMW, outer_optim_spec=PLAIN_OUTER, p_sparta=1.0, H=3)), fedavg_h1)


# ------------------------------------------------------------------ payload bytes (real processes)
def test_fedavg_and_diloco_send_4P_once_per_H_steps(fedavg_h3, diloco_h3):
    for result in (fedavg_h3, diloco_h3):
        for rank in range(2):
            assert result.payload_bytes_per_step(rank) == [0, 0, 4 * P, 0, 0, 4 * P]
            assert [(c.op, c.group) for c in result.trace.collectives(rank)] == [("all_reduce", None)] * 2


def test_sparta_sends_about_4pP_per_step_and_no_mask():
    model = bench_mlp()
    numel = sum(p.numel() for p in model.parameters())
    result = _fit(SPARTAStrategy(p_sparta=0.005), steps=4, model=model, data=synthetic_classification(256, 64, 10))
    expected = 4 * 0.005 * numel
    averager = SparseAverager(0.005)
    averager.bind(list(model.parameters()), None, seed=0)  # the codec's count: the draws of fit's seed, steps 1-4
    for rank in range(2):
        per_step = result.payload_bytes_per_step(rank)
        assert per_step == [averager.wire_nbytes(t) for t in range(1, 5)]
        assert all(0.9 * expected <= b <= 4 * round(0.005 * numel) for b in per_step)
        collectives = list(result.trace.collectives(rank))
        assert [(c.op, c.dtype) for c in collectives] == [("all_reduce", "float32")] * 4  # one per step, values only
    assert result.payload_bytes_per_step(0) == result.payload_bytes_per_step(1)


def test_sparta_diloco_interleaves_sparse_exchanges_and_full_syncs():
    result = _fit(SPARTADiLoCoStrategy(p_sparta=0.25, sparta_interval=2, H=4), steps=8)
    sparse = 4 * round(0.25 * P)       # dense regime: exactly k values
    for rank in range(2):
        assert result.payload_bytes_per_step(rank) == [0, sparse, 0, 4 * P, 0, sparse, 0, 4 * P]


def test_islands_average_on_seeded_subgroups():
    k, island_size = 4, 2
    result = _fit(FedAvgStrategy(H=2, island_size=island_size), num_nodes=k, steps=6)
    groups = {r: [c.group for c in result.trace.collectives(r)] for r in range(k)}
    nodes = [_bound(FedAvgStrategy(H=2, island_size=island_size), r, k) for r in range(k)]
    for rank in range(k):
        assert result.payload_bytes_per_step(rank) == [0, 4 * P, 0, 4 * P, 0, 4 * P]
        assert groups[rank] == [nodes[rank].round_group(i) for i in (1, 2, 3)]
        for i, g in enumerate(groups[rank]):
            assert len(g) == island_size and rank in g and all(groups[m][i] == g for m in g)


def test_partial_participation_charges_only_the_participants():
    k = 3
    result = _fit(FedAvgStrategy(H=1, participation=0.5), num_nodes=k, steps=4)
    nodes = [_bound(FedAvgStrategy(H=1, participation=0.5), r, k) for r in range(k)]
    for step in range(4):
        groups = [nodes[r].round_group(step + 1) for r in range(k)]
        assert sum(g is not None for g in groups) == 2
        for rank, g in enumerate(groups):
            assert result.payload_bytes_per_step(rank)[step] == (4 * P if g else 0)
    for rank in range(k):
        assert [c.group for c in result.trace.collectives(rank)] == [
            g for g in (nodes[rank].round_group(i) for i in range(1, 5)) if g is not None]
