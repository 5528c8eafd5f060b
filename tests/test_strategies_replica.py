"""DiLoCo and Streaming DiLoCo over replica groups: validation, equivalence with plain DiLoCo, exact bytes."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from exonet import LocalTrainer
from exonet.strategies.base import OptimSpec, flatten
from exonet.strategies.diloco import DiLoCoStrategy
from exonet.strategies.replica import ReplicaGroups
from exonet.strategies.streaming_diloco import StreamingDiLoCoStrategy
from exonet.toy import linear_regressor, synthetic_regression
from exonet.trace import Collective

K, G, B, STEPS, H = 4, 2, 4, 6, 2
SGD = OptimSpec("sgd", lr=0.05)


@pytest.mark.parametrize("make, text", [
    (lambda: DiLoCoStrategy(replica_size=0), "replica_size must be >= 1"),
    (lambda: DiLoCoStrategy(replica_size=1.5), "replica_size must be an integer"),
    (lambda: DiLoCoStrategy(replica_size=2, participation=0.5), "replica_size"),
    (lambda: DiLoCoStrategy(replica_size=2, island_size=2), "replica_size"),
    (lambda: DiLoCoStrategy(replica_size=2, elastic=True), "elastic=True"),
    (lambda: StreamingDiLoCoStrategy(replica_size=2, quantize_bits=4), "replica_size"),
])
def test_bad_replica_size_fails_at_construction(make, text):
    with pytest.raises((ValueError, TypeError), match=text):
        make()


@pytest.mark.parametrize("strategy", [DiLoCoStrategy(replica_size=3), StreamingDiLoCoStrategy(replica_size=3)])
def test_replica_size_must_divide_the_nodes_checked_in_the_parent(strategy):
    trainer = LocalTrainer(linear_regressor(), synthetic_regression(n=64))
    with pytest.raises(ValueError, match="replica_size=3 must divide the number of nodes K=4"):
        trainer.fit(strategy, num_nodes=4, max_steps=2, batch_size=2, progress=False)


def test_groups_are_consecutive_workers_and_matching_local_ranks():
    g = ReplicaGroups(rank=5, num_nodes=6, size=3)
    assert (g.inner, g.outer, g.local, g.workers) == ((3, 4, 5), (2, 5), 2, 2)
    assert g.all_groups == [(0, 1, 2), (3, 4, 5), (0, 3), (1, 4), (2, 5)]
    assert g.shard_length(7) == 3


def _data() -> TensorDataset:
    return TensorDataset(*(t.double() for t in synthetic_regression(n=K * B * STEPS).tensors))


def _union_of_worker_batches(data: TensorDataset) -> TensorDataset:
    """The rows that make plain DiLoCo with K/G workers (batch G·B, unshuffled) see, at every step, the
    union of its replica group's batches: worker w's rows interleaved with the others' (DistributedSampler
    deals rows w::workers)."""
    rank_rows = [list(range(len(data)))[r::K] for r in range(K)]  # what each of the K ranks reads, in order
    worker_rows = [[i for s in range(STEPS) for r in range(w * G, (w + 1) * G) for i in rank_rows[r][s * B:(s + 1) * B]]
                   for w in range(K // G)]
    order = [rows[i] for i in range(len(worker_rows[0])) for rows in worker_rows]
    return TensorDataset(*(t[order] for t in data.tensors))


def _fit(strategy, data, num_nodes, batch_size):
    return LocalTrainer(linear_regressor().double(), data).fit(
        strategy, num_nodes=num_nodes, max_steps=STEPS, batch_size=batch_size, shuffle=False, val_size=0,
        progress=False)


@pytest.fixture(scope="module")
def replica_runs():
    data = _data()
    grouped = _fit(DiLoCoStrategy(SGD, H=H, replica_size=G), data, K, B)
    plain = _fit(DiLoCoStrategy(SGD, H=H), _union_of_worker_batches(data), K // G, G * B)
    return grouped, plain


def _params(result) -> torch.Tensor:
    return flatten([p.detach() for p in result.model.parameters()])


def test_diloco_over_replica_groups_equals_plain_diloco_on_the_union_of_each_groups_batches(replica_runs):
    grouped, plain = replica_runs
    got, want = _params(grouped), _params(plain)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    assert not torch.equal(want, _params(_fit(DiLoCoStrategy(SGD, H=H), _data(), K, B)))  # the grouping matters


def test_diloco_over_replica_groups_sends_exact_bytes(replica_runs):
    grouped, _ = replica_runs
    p = sum(t.numel() for t in linear_regressor().parameters())  # 14 float64 parameters
    shard = math.ceil(p / G)
    for rank in range(K):
        worker, local = divmod(rank, G)
        inner = tuple(range(worker * G, worker * G + G))
        outer = tuple(range(local, K, G))
        got = [(e.op, e.nbytes, e.group) for e in grouped.trace.events[rank] if isinstance(e, Collective)]
        step = [("all_reduce", 8 * p, inner)]
        sync = [("all_reduce", 8 * shard, outer), ("all_gather", 8 * shard, inner)]
        assert got == (step * H + sync) * (STEPS // H)
        assert grouped.payload_bytes(rank) == STEPS * 8 * p + (STEPS // H) * 2 * 8 * shard


@pytest.mark.slow
def test_streaming_diloco_over_replica_groups_equals_plain_streaming_on_the_union():
    data = _data()
    make = dict(optim_spec=SGD, H=H, num_fragments=1, delay_steps=1)
    grouped = _fit(StreamingDiLoCoStrategy(**make, replica_size=G), data, K, B)
    plain = _fit(StreamingDiLoCoStrategy(**make), _union_of_worker_batches(data), K // G, G * B)
    torch.testing.assert_close(_params(grouped), _params(plain), rtol=0, atol=1e-6)  # θ_global is fp32
    p = sum(t.numel() for t in linear_regressor().parameters())
    syncs = STEPS // H
    assert grouped.payload_bytes(0) == STEPS * 8 * p + syncs * 2 * 8 * math.ceil(p / G)
