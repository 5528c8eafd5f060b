"""Replica groups: DiLoCo whose workers are themselves data-parallel groups (torchft's HSDP + DiLoCo).

With ``replica_size`` G, consecutive groups of G ranks form one DiLoCo worker: worker w holds
ranks ``w·G .. w·G + G − 1``. Inside a worker the ranks all-reduce (average) their gradients
every step, so they hold identical parameters; across workers the outer sync runs shard-wise:
the flat buffer of P elements is padded to ``G·⌈P/G⌉`` and local rank j averages shard j
(``⌈P/G⌉`` elements) with local rank j of every other worker (group ``j, j + G, j + 2G, ...``),
then the worker all-gathers its G averaged shards. Each rank so sends ``P·itemsize`` per step
inside its worker and ``⌈P/G⌉·itemsize`` twice per outer sync (the all-reduce across workers
and its own part of the all-gather inside), instead of ``P·itemsize`` across workers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from exonet.strategies.base import check_int, flatten, unflatten_into

if TYPE_CHECKING:
    from exonet.communicator import Communicator


def check_replica_size(replica_size: int) -> int:
    """Validate a strategy's ``replica_size`` argument (an integer >= 1) and return it."""
    check_int("replica_size", replica_size, low=1)
    return replica_size


def check_replica_world(replica_size: int, num_nodes: int) -> None:
    """``replica_size`` must divide the number of nodes (every worker is a whole group)."""
    if num_nodes % replica_size:
        raise ValueError(f"replica_size={replica_size} must divide the number of nodes K={num_nodes} "
                         f"(consecutive groups of replica_size ranks form one DiLoCo worker)")


class ReplicaGroups:
    """This rank's place among the replica groups, and the collectives that use it.

    Args:
        rank: this node's global rank.
        num_nodes: K, a multiple of ``size``.
        size: G, ranks per worker.
    """

    def __init__(self, rank: int, num_nodes: int, size: int) -> None:
        check_replica_world(size, num_nodes)
        self.size = size
        self.workers = num_nodes // size
        worker, local = divmod(rank, size)
        self.local = local
        self.inner = tuple(range(worker * size, (worker + 1) * size))  # this worker's ranks
        self.outer = tuple(range(local, num_nodes, size))  # local rank j of every worker
        self.all_groups = ([tuple(range(w * size, (w + 1) * size)) for w in range(self.workers)]
                           + [tuple(range(j, num_nodes, size)) for j in range(size)])

    @classmethod
    def for_node(cls, rank: int, num_nodes: int, size: int, comm: Communicator) -> ReplicaGroups | None:
        """This node's replica groups, declared on ``comm``; None when every worker is one rank."""
        if size <= 1:
            return None
        groups = cls(rank, num_nodes, size)
        groups.declare(comm)
        return groups

    def declare(self, comm: Communicator) -> None:
        """Create every worker's group and every shard group (on every rank alike, as process groups need)."""
        comm.declare_groups(self.all_groups)

    def average_gradients(self, comm: Communicator, params: list[torch.Tensor]) -> None:
        """Average the gradients inside the worker: one flat all-reduce, as DDP without overlap."""
        if self.size == 1:
            return
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = p.detach().new_zeros(p.shape)
            grads.append(p.grad)
        flat = flatten(grads)
        comm.all_reduce(flat, op="avg", group=self.inner)
        unflatten_into(flat, grads)

    def shard_length(self, numel: int) -> int:
        """Elements in each rank's shard of a flat buffer of ``numel``: ⌈numel / G⌉."""
        return math.ceil(numel / self.size)

    def start_mean(self, comm: Communicator, flat: torch.Tensor, async_op: bool = False) -> "ShardedMean":
        """Start averaging ``flat`` (identical on the worker's ranks) over the workers, shard-wise."""
        return ShardedMean(self, comm, flat, async_op)


class ShardedMean:
    """A flat buffer's mean over the workers: this rank's shard across workers, then an all-gather inside.

    ``wait()`` returns the full mean (a new tensor of ``flat``'s length); the all-gather is
    issued then, so an asynchronous start overlaps only the transfer across workers.
    """

    def __init__(self, groups: ReplicaGroups, comm: Communicator, flat: torch.Tensor, async_op: bool) -> None:
        self.groups, self.comm, self.numel = groups, comm, flat.numel()
        n = groups.shard_length(self.numel)
        start = groups.local * n
        shard = flat.new_zeros(n)
        own = flat[start : start + n]
        shard[: own.numel()] = own
        self._pending: Any = shard
        if groups.workers > 1:
            self._pending = comm.all_reduce(shard, op="avg", group=groups.outer, async_op=async_op)

    def wait(self) -> torch.Tensor:
        shard = self._pending if isinstance(self._pending, torch.Tensor) else self._pending.wait()
        gathered = shard if self.groups.size == 1 else self.comm.all_gather(shard, group=self.groups.inner)
        return gathered.reshape(-1)[: self.numel].clone()

    def state_dict(self) -> dict[str, Any]:
        """The shard's mean across workers (its transfer ends now, untraced), for a checkpoint."""
        pending = self._pending
        kept = {"shard": pending.clone()} if isinstance(pending, torch.Tensor) else {"handle": pending.state_dict()}
        return {"numel": self.numel, **kept}

    @classmethod
    def restore(cls, groups: ReplicaGroups, comm: Communicator, state: dict[str, Any]) -> "ShardedMean":
        """The mean ``state_dict`` kept: its ``wait()`` records the wait and the all-gather as before."""
        kept = cls.__new__(cls)
        kept.groups, kept.comm, kept.numel = groups, comm, state["numel"]
        kept._pending = comm.restore_handle(state["handle"]) if "handle" in state else state["shard"].to(comm.device)
        return kept
