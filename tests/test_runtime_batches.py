"""A TensorDataset's batches taken by one index per tensor are the batches DataLoader deals, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from exonet import LocalTrainer
from exonet.runtime.batches import epoch_order, gathered_batches
from exonet.strategies import DiLoCoStrategy, OptimSpec
from exonet.toy import synthetic_classification, tiny_mlp


def _loader_batches(ds: Dataset, order: torch.Tensor, batch_size: int) -> list:
    return list(DataLoader(ds, batch_size=batch_size, sampler=order.tolist(), drop_last=True))  # type: ignore[arg-type]


@pytest.mark.parametrize("batch_size", [1, 7, 11, 23, 24])  # 23 samples: 23, 3, 2, 1 and no batches
def test_gathered_batches_are_the_loaders_own(batch_size):
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(50, 3, 2, generator=g), torch.randint(0, 9, (50,), generator=g),
                       torch.randn(50, generator=g, dtype=torch.float64))
    order = epoch_order(50, 1, 2, seed=4, epoch=3, shuffle=True, shared=True)[2:]  # a resumed node's rest (int32)
    got = list(gathered_batches(ds, order, batch_size) or [])
    want = _loader_batches(ds, order, batch_size)
    assert len(got) == len(want) == len(order) // batch_size
    for mine, theirs in zip(got, want):
        assert type(mine) is type(theirs) is list
        for a, b in zip(mine, theirs, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and a.is_contiguous() and torch.equal(a, b)


def test_a_channels_last_image_comes_contiguous_as_the_loaders_stack_makes_it():
    images = torch.randn(6, 3, 4, 5).to(memory_format=torch.channels_last)
    ds = TensorDataset(images, torch.arange(6))
    order = torch.tensor([5, 0, 3, 1], dtype=torch.int32)
    for mine, theirs in zip(gathered_batches(ds, order, 2) or [], _loader_batches(ds, order, 2), strict=True):
        assert mine[0].stride() == theirs[0].stride() == mine[0].contiguous().stride()
        assert torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1])


def test_any_other_dataset_is_left_to_the_loader():
    class Rows(TensorDataset):  # a subclass may fetch its own way
        pass

    assert gathered_batches(Rows(torch.zeros(4)), torch.arange(4), 2) is None
    assert gathered_batches([(0,), (1,)], torch.arange(2), 1) is None
    sparse = TensorDataset(torch.eye(4).to_sparse(), torch.arange(4))  # DataLoader's error says to pass collate_fn
    assert gathered_batches(sparse, torch.arange(4), 2) is None


def test_a_fit_trains_the_same_whether_batches_are_gathered_or_loaded():
    """``dataloader_kwargs`` send batches through DataLoader; without them they are gathered: the same run."""
    data = synthetic_classification(96, dim=8, classes=4)
    runs = [LocalTrainer(tiny_mlp(), data).fit(DiLoCoStrategy(OptimSpec("adam", lr=0.01), H=3), num_nodes=2,
                                               max_steps=9, batch_size=8, progress=False, val_size=0, **extra)
            for extra in ({}, {"dataloader_kwargs": {"pin_memory": False}})]
    assert runs[0].history["train_loss"] == runs[1].history["train_loss"]  # 96 / 2 / 8: a second epoch too
    for a, b in zip(runs[0].model.parameters(), runs[1].model.parameters()):
        assert torch.equal(a, b)
