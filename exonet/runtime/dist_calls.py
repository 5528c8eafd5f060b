"""``torch.distributed`` calls made inside a node, routed through its Communicator: counted, traced and timed.

A strategy written against ``torch.distributed`` (``dist.all_reduce``, ``dist.all_gather(list, t)``,
``dist.new_group(backend="gloo")``, ``isend``/``irecv``, async handles) runs unchanged: for the node's
lifetime (``routed(comm)``), the public functions of ``torch.distributed`` are replaced by ones that call the
same operation through exonet's Communicator, which runs it on the same process groups and records it as it
records exonet's own.

Why wrap the functions rather than register a process-group backend: a Python backend must implement the
C++ ``Backend`` interface, whose methods and work objects have changed from one torch release to the next
since 2.4, and would then have to drive gloo or NCCL itself; the functions' signatures are public, documented
and stable, and the Communicator already runs every op on the real backend. exonet's own code calls
``torch.distributed.distributed_c10d``, which is left alone, so nothing is counted twice.

Not wrapped: code that imported a function before the node started (``from torch.distributed import
all_reduce`` at the top of a module imported by the parent). A call exonet cannot model (object collectives,
uneven all-to-all splits, a receive from any source, reduce ops other than sum, avg, max and min) raises
``NotImplementedError`` naming the call and the line that made it; it is never run uncounted.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import traceback
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

if TYPE_CHECKING:
    from exonet.communicator import Communicator

OPS = {c10d.ReduceOp.SUM: "sum", c10d.ReduceOp.AVG: "avg", c10d.ReduceOp.MAX: "max", c10d.ReduceOp.MIN: "min"}
UNMODELLED = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
              "send_object_list", "recv_object_list", "all_reduce_coalesced", "all_gather_coalesced",
              "monitored_barrier", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced")


class Work:
    """What torch's async calls return: ``wait()`` finishes the op (and copies results where torch puts them)."""

    def __init__(self, handle: Any, after: Callable[[Any], object] = lambda _: None) -> None:
        self._handle, self._after, self._done = handle, after, False

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            self._after(self._handle.wait())
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or self._handle.is_completed()


def _caller() -> str:
    """``file:line`` of the call into torch.distributed (the first frame outside this module)."""
    here = __file__
    for frame in reversed(traceback.extract_stack()[:-1]):
        if frame.filename != here:
            return f"{frame.filename}:{frame.lineno}"
    return "?"


def unmodelled(name: str, why: str) -> NotImplementedError:
    return NotImplementedError(f"torch.distributed.{name} at {_caller()}: {why}; exonet counts and times every "
                               "call it runs, so it runs none it cannot model")


class Router:
    """The node's replacements for ``torch.distributed``'s functions, bound to its Communicator."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm

    # ------------------------------------------------------------ arguments
    def ranks(self, group: Any) -> tuple[int, ...] | None:
        """A process group as the Communicator's group (global ranks); the group is used as it is."""
        if group is None or group is c10d.GroupMember.WORLD:
            return None
        ranks = tuple(dist.get_process_group_ranks(group))
        self.comm.adopt_group(ranks, group)
        return ranks

    def op(self, name: str, op: Any) -> str:
        if op not in OPS:
            raise unmodelled(name, f"reduce op {op} is not one of sum, avg, max, min")
        return OPS[op]

    def finish(self, result: Any, async_op: bool, after: Callable[[Any], object] = lambda _: None) -> Any:
        """torch's return: None (after ``after``), or a Work whose ``wait()`` runs ``after``."""
        if async_op:
            return Work(result, after)
        after(result)
        return None

    @staticmethod
    def global_rank(group: Any, rank: Any, group_rank: Any) -> int:
        return int(rank) if group_rank is None else dist.get_global_rank(group, group_rank)

    # ----------------------------------------------------------- collectives
    def all_reduce(self, tensor: torch.Tensor, op: Any = c10d.ReduceOp.SUM, group: Any = None,
                   async_op: bool = False) -> Any:
        return self.finish(self.comm.all_reduce(tensor, self.op("all_reduce", op), self.ranks(group), async_op),
                           async_op)

    def all_gather(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None,
                   async_op: bool = False) -> Any:
        def copy(out: torch.Tensor) -> None:
            for target, row in zip(tensor_list, out):
                target.copy_(row)

        return self.finish(self.comm.all_gather(tensor, self.ranks(group), async_op), async_op, copy)

    def all_gather_into_tensor(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None,
                               async_op: bool = False) -> Any:
        return self.finish(self.comm.all_gather(input_tensor, self.ranks(group), async_op), async_op,
                           lambda out: output_tensor.copy_(out.reshape(output_tensor.shape)))

    def broadcast(self, tensor: torch.Tensor, src: Any = None, group: Any = None, async_op: bool = False,
                  group_src: Any = None) -> Any:
        root = self.global_rank(group, src, group_src)
        return self.finish(self.comm.broadcast(tensor, root, self.ranks(group), async_op), async_op)

    def reduce(self, tensor: torch.Tensor, dst: Any = None, op: Any = c10d.ReduceOp.SUM, group: Any = None,
               async_op: bool = False, group_dst: Any = None) -> Any:
        root = self.global_rank(group, dst, group_dst)
        return self.finish(self.comm.reduce(tensor, root, self.op("reduce", op), self.ranks(group), async_op),
                           async_op)

    def gather(self, tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None, dst: Any = None,
               group: Any = None, async_op: bool = False, group_dst: Any = None) -> Any:
        root = self.global_rank(group, 0 if dst is None and group_dst is None else dst, group_dst)

        def copy(out: torch.Tensor | None) -> None:
            if out is not None and gather_list is not None:
                for target, row in zip(gather_list, out):
                    target.copy_(row)

        return self.finish(self.comm.gather(tensor, root, self.ranks(group), async_op), async_op, copy)

    def scatter(self, tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None, src: Any = None,
                group: Any = None, async_op: bool = False, group_src: Any = None) -> Any:
        root = self.global_rank(group, 0 if src is None and group_src is None else src, group_src)
        ranks = self.ranks(group)
        n = self.comm.group_size(ranks)
        full = (torch.cat([t.reshape(1, *tensor.shape) for t in scatter_list]) if scatter_list
                else tensor.new_zeros((n, *tensor.shape)))
        return self.finish(self.comm.scatter(full, root, ranks, async_op), async_op,
                           lambda out: tensor.copy_(out.reshape(tensor.shape)))

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op: Any = c10d.ReduceOp.SUM,
                              group: Any = None, async_op: bool = False) -> Any:
        name = self.op("reduce_scatter_tensor", op)
        if name not in ("sum", "avg"):
            raise unmodelled("reduce_scatter_tensor", f"reduce op {op}: exonet's reduce-scatter sums or averages")
        result = self.comm.reduce_scatter(input, name, self.ranks(group), async_op)
        return self.finish(result, async_op, lambda out: output.copy_(out.reshape(output.shape)))

    def reduce_scatter(self, output: torch.Tensor, input_list: list[torch.Tensor], op: Any = c10d.ReduceOp.SUM,
                       group: Any = None, async_op: bool = False) -> Any:
        return self.reduce_scatter_tensor(output, torch.cat([t.reshape(-1) for t in input_list]), op, group,
                                          async_op)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Any = None,
                          input_split_sizes: Any = None, group: Any = None, async_op: bool = False) -> Any:
        if output_split_sizes is not None or input_split_sizes is not None:
            raise unmodelled("all_to_all_single", "uneven splits")
        return self.finish(self.comm.all_to_all(input, self.ranks(group), async_op), async_op,
                           lambda out: output.copy_(out))

    def all_to_all(self, output_tensor_list: list[torch.Tensor], input_tensor_list: list[torch.Tensor],
                   group: Any = None, async_op: bool = False) -> Any:
        if len({t.numel() for t in [*output_tensor_list, *input_tensor_list]}) > 1:
            raise unmodelled("all_to_all", "tensors of different sizes")
        flat = torch.cat([t.reshape(-1) for t in input_tensor_list])

        def copy(out: torch.Tensor) -> None:
            for target, part in zip(output_tensor_list, out.chunk(len(output_tensor_list))):
                target.copy_(part.reshape(target.shape))

        return self.finish(self.comm.all_to_all(flat, self.ranks(group), async_op), async_op, copy)

    def barrier(self, group: Any = None, async_op: bool = False, device_ids: Any = None, timeout: Any = None) -> Any:
        return self.finish(self.comm.barrier(self.ranks(group), async_op), async_op)

    # -------------------------------------------------------- point to point
    def send(self, tensor: torch.Tensor, dst: Any = None, group: Any = None, tag: int = 0,
             group_dst: Any = None) -> None:
        self.comm.send(tensor, self.global_rank(group, dst, group_dst))

    def isend(self, tensor: torch.Tensor, dst: Any = None, group: Any = None, tag: int = 0,
              group_dst: Any = None) -> Work:
        return Work(self.comm.send(tensor, self.global_rank(group, dst, group_dst), async_op=True))

    def recv(self, tensor: torch.Tensor, src: Any = None, group: Any = None, tag: int = 0,
             group_src: Any = None) -> int:
        if src is None and group_src is None:
            raise unmodelled("recv", "a receive from any source (give src)")
        peer = self.global_rank(group, src, group_src)
        self.comm.recv(tensor, peer)
        return peer

    def irecv(self, tensor: torch.Tensor, src: Any = None, group: Any = None, tag: int = 0,
              group_src: Any = None) -> Work:
        if src is None and group_src is None:
            raise unmodelled("irecv", "a receive from any source (give src)")
        return Work(self.comm.recv(tensor, self.global_rank(group, src, group_src), async_op=True))

    def batch_isend_irecv(self, p2p_op_list: list[Any]) -> list[Work]:
        kinds = {"isend": "send", "irecv": "recv"}
        ops = []
        for p2p in p2p_op_list:
            kind = kinds.get(getattr(p2p.op, "__name__", ""))
            if kind is None:
                raise unmodelled("batch_isend_irecv", f"op {p2p.op!r} (isend or irecv expected)")
            ops.append((kind, p2p.tensor, int(p2p.peer)))
        return [Work(h) for h in self.comm.batch_isend_irecv(ops)]

    # ---------------------------------------------------------------- groups
    def new_group(self, *args: Any, **kwargs: Any) -> Any:
        """torch's own group (every rank calls it, as torch requires), known to the Communicator from then on."""
        group = ORIGINALS["new_group"](*args, **kwargs)
        ranks = inspect.signature(ORIGINALS["new_group"]).bind(*args, **kwargs).arguments.get("ranks")
        if group is not None and group is not c10d.GroupMember.NON_GROUP_MEMBER and ranks:
            self.comm.adopt_group(tuple(ranks), group)
        return group


ROUTED = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "gather", "scatter",
          "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "send", "isend",
          "recv", "irecv", "batch_isend_irecv", "new_group")
ORIGINALS: dict[str, Any] = {name: getattr(dist, name)
                             for name in (*ROUTED, *UNMODELLED, "P2POp") if hasattr(dist, name)}


def _p2p_op(router: Router) -> type:
    """``dist.P2POp`` that takes the routed ``isend``/``irecv`` (torch's checks its op against its own two)."""
    own = {router.isend: ORIGINALS["isend"], router.irecv: ORIGINALS["irecv"]}

    class P2POp(c10d.P2POp):
        def __new__(cls, op: Callable, *args: Any, **kwargs: Any) -> Any:
            return super().__new__(cls, own.get(op, op), *args, **kwargs)

    return P2POp


def _refusal(name: str) -> Callable[..., Any]:
    @functools.wraps(ORIGINALS[name])
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise unmodelled(name, "exonet has no model of this call (send tensors through the collectives it has)")

    return refuse


@contextlib.contextmanager
def routed(comm: Communicator) -> Iterator[None]:
    """For the block, ``torch.distributed``'s public functions run through ``comm`` (see the module docstring)."""
    router = Router(comm)
    replaced = {name: getattr(router, name) for name in ROUTED if name in ORIGINALS}
    replaced.update({name: _refusal(name) for name in UNMODELLED if name in ORIGINALS})
    replaced["P2POp"] = _p2p_op(router)
    for name, fn in replaced.items():
        setattr(dist, name, fn)
    try:
        yield
    finally:
        for name in replaced:
            setattr(dist, name, ORIGINALS[name])
