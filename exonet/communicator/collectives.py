"""The collectives, each performed, counted and traced: ``Communicator`` is the door a strategy uses."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed import distributed_c10d as dist

from exonet.communicator.core import REDUCE_OPS, GroupArg
from exonet.communicator.messages import Messages
from exonet.communicator.questions import ClockQuestions


class Communicator(Messages, ClockQuestions):
    """Collectives for one rank, counted and traced (``CommCore`` holds its arguments); messages, the object
    store and the clock's questions come from its mixins."""

    # ------------------------------------------------------------ bookkeeping
    def untraced_all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` in place across all ranks, outside the algorithm: not traced, not counted.

        For the runtime's own traffic (evaluation, the final average), used inside ``bookkeeping()``.
        """
        buf, copy_back = self._staged(tensor)
        with self.blocking("all_reduce (evaluation or the final averaging)"):
            dist.all_reduce(buf)
        copy_back(buf)
        return tensor

    def untraced_broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite ``tensor`` with rank ``src``'s copy, outside the algorithm: not traced, not counted."""
        buf, copy_back = self._staged(tensor)
        with self.blocking("broadcast (the start-up model)"):
            dist.broadcast(buf, src)
        copy_back(buf)
        return tensor

    # ----------------------------------------------------------- collectives
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", group: GroupArg = None, async_op: bool = False) -> Any:
        """Reduce ``tensor`` in place across the group; ``op`` is "sum", "mean" (alias "avg"), "max" or "min".

        Returns the tensor, or a Handle whose ``wait()`` returns it.
        """
        if op not in REDUCE_OPS:
            raise ValueError(f"all_reduce: op must be one of {', '.join(map(repr, REDUCE_OPS))}, got {op!r}")
        buf, copy_back = self._staged(tensor)
        pg, n = self.group_of(group), self.group_size(group)
        reduce_op = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(op, dist.ReduceOp.SUM)

        def finish() -> torch.Tensor:
            if op in ("mean", "avg"):
                buf.div_(n)
            copy_back(buf)
            return tensor

        return self._run("all_reduce", tensor, group, async_op,
                         lambda a: dist.all_reduce(buf, reduce_op, group=pg, async_op=a), finish)

    def all_gather(self, tensor: torch.Tensor, group: GroupArg = None, async_op: bool = False) -> Any:
        """Gather every member's ``tensor`` (same shape on all); returns a tensor of shape (n, *tensor.shape)."""
        buf, _ = self._staged(tensor)
        pg, n = self.group_of(group), self.group_size(group)
        out = buf.new_empty((n, *buf.shape))
        return self._run("all_gather", tensor, group, async_op,
                         lambda a: dist.all_gather(list(out.unbind(0)), buf.contiguous(), group=pg, async_op=a),
                         lambda: out.to(tensor.device))

    def broadcast(self, tensor: torch.Tensor, src: int = 0, group: GroupArg = None, async_op: bool = False) -> Any:
        """Overwrite ``tensor`` on every member with global rank ``src``'s copy."""
        buf, copy_back = self._staged(tensor)
        pg = self.group_of(group)

        def finish() -> torch.Tensor:
            copy_back(buf)
            return tensor

        return self._run("broadcast", tensor, group, async_op,
                         lambda a: dist.broadcast(buf, src, group=pg, async_op=a), finish)

    def reduce(self, tensor: torch.Tensor, dst: int, op: str = "sum", group: GroupArg = None,
               async_op: bool = False) -> Any:
        """Reduce ``tensor`` across the group into global rank ``dst``'s copy, in place; ``op`` as for all_reduce.

        Only ``dst``'s tensor holds the result afterwards (the others' hold partial sums, as torch's). Returns the
        tensor, or a Handle. The simulator roots every rooted op at the group's lowest rank (the trace keeps no
        root): on nodes alike the time is the same, and ``dst`` = the lowest rank keeps each node's bytes exact.
        """
        if op not in REDUCE_OPS:
            raise ValueError(f"reduce: op must be one of {', '.join(map(repr, REDUCE_OPS))}, got {op!r}")
        self._check_root("reduce", dst, group)
        buf, copy_back = self._staged(tensor)
        pg, n = self.group_of(group), self.group_size(group)
        reduce_op = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(op, dist.ReduceOp.SUM)

        def finish() -> torch.Tensor:
            if op in ("mean", "avg") and self.rank == dst:
                buf.div_(n)
            copy_back(buf)
            return tensor

        return self._run("reduce", tensor, group, async_op,
                         lambda a: dist.reduce(buf, dst, reduce_op, group=pg, async_op=a), finish)

    def gather(self, tensor: torch.Tensor, dst: int, group: GroupArg = None, async_op: bool = False) -> Any:
        """Gather every member's ``tensor`` (same shape on all) on global rank ``dst``.

        Returns, on ``dst``, a tensor of shape (n, *tensor.shape) in member order, and None elsewhere (or a
        Handle whose ``wait()`` does).
        """
        self._check_root("gather", dst, group)
        buf, _ = self._staged(tensor)
        buf = buf.contiguous()
        pg, n = self.group_of(group), self.group_size(group)
        out = buf.new_empty((n, *buf.shape)) if self.rank == dst else None
        parts = list(out.unbind(0)) if out is not None else None
        return self._run("gather", tensor, group, async_op,
                         lambda a: dist.gather(buf, parts, dst=dst, group=pg, async_op=a),
                         lambda: out.to(tensor.device) if out is not None else None)

    def scatter(self, tensor: torch.Tensor, src: int, group: GroupArg = None, async_op: bool = False) -> Any:
        """Split global rank ``src``'s ``tensor`` along dim 0 into n equal chunks; member j receives chunk j.

        Every member passes a tensor of the full shape (only ``src``'s contents are read), so each records the
        full input, as for reduce_scatter. Returns this member's chunk (or a Handle whose ``wait()`` does).
        """
        self._check_root("scatter", src, group)
        buf, pg, n = self._chunked("scatter", tensor, group)
        out = buf.new_empty((buf.shape[0] // n, *buf.shape[1:]))
        parts = list(buf.chunk(n)) if self.rank == src else None
        return self._run("scatter", tensor, group, async_op,
                         lambda a: dist.scatter(out, parts, src=src, group=pg, async_op=a),
                         lambda: out.to(tensor.device))

    def barrier(self, group: GroupArg = None, async_op: bool = False) -> Any:
        """Wait until every member of the group has called it; no payload (gloo: a dissemination barrier;
        NCCL: an all-reduce of one float). Returns None, or a Handle."""
        pg = self.group_of(group)
        return self._run("barrier", torch.empty(0), group, async_op,
                         lambda a: dist.barrier(group=pg, async_op=a), lambda: None)

    def _check_root(self, op: str, root: int, group: GroupArg) -> None:
        members = range(self.world_size) if group is None else self._key(group)
        if isinstance(root, bool) or not isinstance(root, int) or root not in members:
            raise ValueError(f"{op}: the root must be a global rank in the group {list(members)}, got {root!r}")

    def all_to_all(self, tensor: torch.Tensor, group: GroupArg = None, async_op: bool = False) -> Any:
        """Split ``tensor`` along dim 0 into n equal chunks; chunk j goes to the j-th member.

        Returns a tensor of the same shape whose chunk j came from the j-th member.
        """
        buf, pg, _ = self._chunked("all_to_all", tensor, group)
        out = torch.empty_like(buf)
        return self._run("all_to_all", tensor, group, async_op,
                         lambda a: dist.all_to_all_single(out, buf, group=pg, async_op=a),
                         lambda: out.to(tensor.device))

    def reduce_scatter(self, tensor: torch.Tensor, op: str = "sum", group: GroupArg = None,
                       async_op: bool = False) -> Any:
        """Reduce ``tensor`` across the group; member j receives the j-th of n equal chunks along dim 0.

        On gloo it runs as an all-to-all plus a local sum (the same bytes on the wire as a
        direct reduce-scatter, and portable across torch versions).
        """
        if op not in ("sum", "mean", "avg"):
            raise ValueError(f"reduce_scatter: op must be 'sum' or 'mean' (alias 'avg'), got {op!r}")
        buf, pg, n = self._chunked("reduce_scatter", tensor, group)
        chunk = buf.shape[0] // n
        if self.backend == "nccl":
            out = buf.new_empty((chunk, *buf.shape[1:]))

            def launch(a: bool) -> Any:
                return dist.reduce_scatter_tensor(out, buf, group=pg, async_op=a)

            def reduced() -> torch.Tensor:
                return out
        else:
            recv = torch.empty_like(buf)

            def launch(a: bool) -> Any:
                return dist.all_to_all_single(recv, buf, group=pg, async_op=a)

            def reduced() -> torch.Tensor:
                return recv.view(n, chunk, *buf.shape[1:]).sum(0)

        def finish() -> torch.Tensor:
            out = reduced()
            if op in ("mean", "avg"):
                out = out / n
            return out.to(tensor.device)

        return self._run("reduce_scatter", tensor, group, async_op, launch, finish)
