"""The data one node trains on: its dataset (given or built by a factory), its sample order in each epoch,
the validation sample it scores, and its batches on the device and split into micro-batches.

Pure functions of their arguments, apart from the node loop (exonet.runtime.node): the parent checks
datasets with them before it starts any node, and a resumed node recomputes its place from them.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol

import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from exonet.seeding import shared_generator


def validation_sample(length: int, val_size: int, seed: int) -> list[int]:
    """The validation samples every evaluation scores: a seeded random ``val_size`` of ``length``, in order.

    On ordered data (text) the first ``val_size`` samples would be a biased estimate, and a fresh draw
    at each evaluation would make evaluations noisy to compare.
    """
    return sorted(torch.randperm(length, generator=shared_generator(seed, "validation"))[:val_size].tolist())


MAP_STYLE = ("a map-style Dataset (with __len__ and __getitem__: nodes are dealt samples by index) or a factory "
             "f(rank, num_nodes, train) returning one")


class MapDataset(Protocol):
    """What ``check_map_style`` admits: a length and samples by index (a torch Dataset or not)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


def resolve_dataset(data: Any, rank: int, num_nodes: int, train: bool) -> MapDataset:
    """A Dataset is used as given (split later by a sampler); a factory builds this rank's shard."""
    name = "train_dataset" if train else "val_dataset"
    if not is_factory(data):
        check_map_style(name, data)
        return data
    try:
        built = data(rank, num_nodes, train)
    except TypeError as exc:
        if "positional argument" not in str(exc):
            raise
        raise TypeError(f"{name}: the factory must take (rank, num_nodes, train), as f(rank, num_nodes, train); "
                        f"calling it failed: {exc}") from None
    check_map_style(f"{name} (built by its factory for rank {rank})", built)
    return built


def check_map_style(name: str, data: Any) -> None:
    """Raise TypeError naming ``name`` unless ``data`` is a dataset nodes can be dealt samples of by index."""
    if isinstance(data, IterableDataset) or not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        raise TypeError(f"{name} must be {MAP_STYLE}, got {type(data).__name__}")


def is_factory(data: Any) -> bool:
    """A callable that is not itself a dataset (an IterableDataset is a dataset, not a factory)."""
    return callable(data) and not isinstance(data, Dataset) and not (hasattr(data, "__getitem__")
                                                                   and hasattr(data, "__len__"))


def epoch_indices(n: int, rank: int, num_nodes: int, seed: int, epoch: int, shuffle: bool, shared: bool) -> list[int]:
    """``epoch_order`` as a list of ints."""
    return epoch_order(n, rank, num_nodes, seed, epoch, shuffle, shared).tolist()


def epoch_order(n: int, rank: int, num_nodes: int, seed: int, epoch: int, shuffle: bool, shared: bool) -> torch.Tensor:
    """The sample order of one node in one epoch, an integer tensor: a pure function of its arguments.

    A ``shared`` dataset (one Dataset split across nodes) is dealt exactly as
    DistributedSampler(drop_last=True) deals it; a node's own shard (from a factory) is
    shuffled with a generator derived from (seed, rank, epoch). Being pure, the order
    lets a resumed node start mid-epoch without loading the batches it skips. A tensor, not a
    list: 4 bytes an index where a Python int costs 36, in every node (DistributedSampler
    itself lists all n indices).
    """
    small = torch.int32 if n < 2**31 else torch.int64  # randperm gives the same values in either
    if shared:
        g = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g, dtype=small) if shuffle else torch.arange(n, dtype=small)
        return order[: n // num_nodes * num_nodes][rank::num_nodes]
    if not shuffle:
        return torch.arange(n, dtype=small)
    return torch.randperm(n, generator=shared_generator(seed, "data", rank, epoch), dtype=small)


def gathered_batches(ds: Any, order: torch.Tensor, batch_size: int) -> Iterator[list[torch.Tensor]] | None:
    """A ``TensorDataset``'s batches in ``order`` (the last partial one dropped), each tensor's rows taken by one
    index; None for any other dataset.

    DataLoader fetches a batch one sample at a time and stacks them (about 100 us for 32 rows, a fifth of
    a small model's step); one index per tensor, made contiguous as a stack is (a channels-last image
    keeps its layout when indexed), gives the same tensors in the same list that its default collate
    makes, and draws nothing from any generator. A sparse tensor is left to DataLoader, whose error
    says what to do.
    """
    if type(ds) is not TensorDataset or any(t.layout != torch.strided for t in ds.tensors):
        return None
    order = order.long()

    def batches() -> Iterator[list[torch.Tensor]]:
        for start in range(0, len(order) - batch_size + 1, batch_size):
            rows = order[start:start + batch_size]
            yield [t[rows].contiguous() for t in ds.tensors]

    return batches()


def to_device(batch: Any, device: torch.device) -> Any:
    """The batch's tensors on ``device``, inside the same tuples, lists and dicts."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def split_batch(batch: Any, size: int) -> list[tuple[Any, int]]:
    """Split a batch into micro-batches of at most ``size`` rows; returns (micro, rows) pairs."""
    if isinstance(batch, torch.Tensor):
        parts = batch.split(size)
        return [(p, p.shape[0]) for p in parts]
    if isinstance(batch, (list, tuple)):
        cols = [split_batch(b, size) for b in batch]
        return [(type(batch)(c[i][0] for c in cols), cols[0][i][1]) for i in range(len(cols[0]))]
    if isinstance(batch, dict):
        keyed = {k: split_batch(v, size) for k, v in batch.items()}
        first = next(iter(keyed.values()))
        return [({k: v[i][0] for k, v in keyed.items()}, first[i][1]) for i in range(len(first))]
    raise TypeError(f"minibatch_size: cannot split a batch of type {type(batch).__name__}; "
                    "use tensors, tuples or dicts")


def batch_rows(batch: Any) -> int:
    """The rows of a batch: of a tensor, of its first item, of its first value."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, (list, tuple)):
        return batch_rows(batch[0])
    if isinstance(batch, dict):
        return batch_rows(next(iter(batch.values())))
    raise TypeError(f"cannot tell the batch size of a {type(batch).__name__}")
