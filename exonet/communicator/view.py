"""GroupView: the Communicator as a strategy sees it when its world is a group of the run's ranks.

A pipeline's stage s has R replicas, global ranks ``q·S + s`` (q = 0..R−1), and the data-parallel
strategy that keeps them in step must not know there are other stages: to it the world is R ranks
and it is rank q. The view says so (``rank``, ``world_size``), runs every collective whose group is
None on the replicas, and turns the ranks a strategy names (roots, peers, explicit groups) from its
numbering into global ranks. Groups a strategy declares are declared for every stage alike, because
torch names process groups by the order each process creates them. Object-store keys get the stage's
prefix. With R = 1 there is nobody to exchange with: collectives return at once, with nothing traced.
Everything else (the clock, events, bookkeeping) is the node's Communicator itself.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

if TYPE_CHECKING:
    from exonet.communicator import Communicator

# Collectives with a ``group`` and, where rooted, the argument that names the root.
COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "reduce", "gather", "scatter", "barrier", "all_to_all",
               "reduce_scatter")
ROOTS = {"broadcast": "src", "reduce": "dst", "gather": "dst", "scatter": "src"}


class _Done:
    """The handle of a collective among one rank: nothing to wait for."""

    def __init__(self, result: Any) -> None:
        self._result = result

    def wait(self, traced: bool = True) -> Any:
        return self._result

    def is_completed(self) -> bool:
        return True


def _alone(op: str, tensor: torch.Tensor | None) -> Any:
    """What ``op`` among one rank returns: its own tensor, as one member's stack, or nothing."""
    if op in ("all_gather", "gather"):
        assert tensor is not None
        return tensor.unsqueeze(0).clone()
    return None if op == "barrier" else tensor


class GroupView:
    """``comm`` seen by a strategy whose world is ``members`` (global ranks; its rank j is ``members[j]``).

    Args:
        comm: the node's Communicator.
        members: the group's global ranks in the strategy's order; this node must be one of them.
        siblings: every group of the same shape, each in the same order (a pipeline's stages' replicas), so a group
            the strategy declares is declared on every rank alike.
        key_prefix: prefixed to object-store keys, so groups never read each other's objects.
    """

    def __init__(self, comm: Communicator, members: Sequence[int], siblings: Sequence[Sequence[int]],
                 key_prefix: str) -> None:
        if comm.rank not in members:
            raise ValueError(f"GroupView: rank {comm.rank} is not in its group {list(members)}")
        view = self.__dict__
        view["_comm"] = comm
        view["_members"] = tuple(members)
        view["_siblings"] = [tuple(group) for group in siblings]
        view["_prefix"] = key_prefix
        view["rank"] = self._members.index(comm.rank)
        view["world_size"] = len(self._members)

    def __getattr__(self, name: str) -> Any:
        if name in COLLECTIVES:
            return self._collective(name)
        return getattr(self._comm, name)

    def __setattr__(self, name: str, value: Any) -> None:  # a resumed node sets ``next_cid`` on its comm
        setattr(self._comm, name, value)

    def _global(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank!r} is not a rank of this group's world [0, {self.world_size})")
        return self._members[rank]

    def _group(self, group: Sequence[int] | None) -> list[int]:
        return list(self._members) if group is None else [self._global(r) for r in group]

    def _collective(self, op: str) -> Callable[..., Any]:
        method = getattr(self._comm, op)
        signature = inspect.signature(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            if self.world_size == 1:
                result = _alone(op, bound.arguments.get("tensor"))
                return _Done(result) if bound.arguments["async_op"] else result
            bound.arguments["group"] = self._group(bound.arguments["group"])
            if op in ROOTS:
                bound.arguments[ROOTS[op]] = self._global(bound.arguments[ROOTS[op]])
            return method(*bound.args, **bound.kwargs)

        return call

    # -------------------------------------------------------------- messages
    def send(self, tensor: torch.Tensor, dst: int, async_op: bool = False) -> Any:
        return self._comm.send(tensor, self._global(dst), async_op)

    def recv(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> Any:
        return self._comm.recv(tensor, self._global(src), async_op)

    def batch_isend_irecv(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> list[Any]:
        return self._comm.batch_isend_irecv([(kind, tensor, self._global(peer)) for kind, tensor, peer in ops])

    def put(self, key: str, tensor: torch.Tensor) -> None:
        self._comm.put(self._prefix + key, tensor)

    def get(self, key: str, tensor: torch.Tensor, async_op: bool = False) -> Any:
        return self._comm.get(self._prefix + key, tensor, async_op)

    # ---------------------------------------------------------------- groups
    def declare_groups(self, groups: Sequence[Sequence[int]]) -> None:
        """Declare ``groups`` (this view's ranks) for every sibling group, in one order on every rank."""
        local = [list(group) for group in groups]
        for group in local:
            for r in group:
                self._global(r)  # a rank outside the view is named as the strategy numbered it
        self._comm.declare_groups([[sibling[r] for r in group] for sibling in self._siblings for group in local])

    def group_size(self, group: Sequence[int] | None) -> int:
        return len(self._group(group))
