"""Communicator: the only door from a strategy to torch.distributed.

Every call performs the real collective, counts the payload this rank passed in,
and appends the node's trace: the compute span since the last communication, then
the collective (and, for async calls, a Wait when the handle is waited on; an async
collective's end is the Wait, so its ``end_s`` stays None). That
is what makes byte counting, tracing and simulation automatic for every strategy.

Bookkeeping traffic (start-up broadcast, evaluation averaging, the final model)
goes through ``bookkeeping()``: the clock is paused, nothing is recorded or counted.

``blocking`` is the one hook for the runtime: every call that waits on other nodes runs
inside ``comm.blocking()``. The node passes its heartbeat's, so the progress watchdog
can tell a node that waits in a collective from the node that hangs (exonet.runtime.watchdog).
Under the online clock (exonet.runtime.clock) ``clock`` is the node's link to it: ``recv_any``
asks it who to receive from, and when it ``announces``, every blocking call first
reports the events so far (the call itself included, its ``end_s`` then None).
"""

from __future__ import annotations

import contextlib
import time
import weakref
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch

# distributed_c10d, not torch.distributed: inside a node the latter's functions route here (runtime/dist_calls.py)
from torch.distributed import distributed_c10d as dist

from exonet.trace import Collective, Compute, Discard, Event, Step, Wait

GroupArg = Sequence[int] | None
REDUCE_OPS = ("sum", "mean", "max", "min", "avg")  # as torch's ReduceOp; "avg" is exonet's older spelling of "mean"
P2P_KINDS = {"send": dist.isend, "recv": dist.irecv}  # batch_isend_irecv's kinds and torch's posting calls
_DTYPE_NAMES: dict[torch.dtype, str] = {}  # "float32" for torch.float32: str() of a dtype costs a call per collective


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def any_source_question(cid: int, tensor: torch.Tensor | Callable[[int], torch.Tensor]) -> tuple:
    """The online clock's ``recv_any`` question; a buffer chosen per sender is asked as 0 bytes (the send's count)."""
    if callable(tensor):
        return ("recv_any", cid, 0, "float32")
    return ("recv_any", cid, tensor.numel() * tensor.element_size(), _dtype_name(tensor.dtype))


class ClockSide(Protocol):
    """A node's side of the online clock, as a Communicator uses it (the runtime's ClockLink, estimate's RankLink)."""

    announces: bool  # report events before every blocking call

    def announce(self, events: list[Event]) -> None: ...

    def ask(self, question: tuple, events: list[Event]) -> Any: ...


def _posted(work: Any) -> Callable[[bool], Any]:
    """A launch that returns a transfer already posted (``batch_isend_irecv`` posts the group in one call)."""
    return lambda _async: work


def _no_copy_back(_: torch.Tensor) -> None:
    """``_staged``'s copy-back for a tensor the backend reads in place."""


def _unwatched(*where: Any) -> contextlib.AbstractContextManager[None]:
    """The blocking context of a communicator nobody watches: ``where`` (call, peer, number) goes unused."""
    return contextlib.nullcontext()


class Handle:
    """An async collective in flight; ``wait()`` blocks until it ends and returns its result.

    A checkpoint keeps it as ``state_dict()`` (its id and result: the transfer ends there, untraced)
    and a resumed node rebuilds it with ``Communicator.restore_handle``: its ``wait()`` then records
    the same Wait the uninterrupted run records, so the trace and the numerics are unchanged.
    """

    def __init__(self, comm: "Communicator", cid: int, work: Any, finish: Callable[[], Any]) -> None:
        self._comm, self._cid, self._work, self._finish = comm, cid, work, finish
        self._result: Any = None
        self._settled = False  # the transfer has ended and ``_result`` holds it
        self._done = False  # the strategy has waited (the trace has its Wait, when traced)
        self.kept = False  # a checkpoint holds it (``state_dict``): exonet.runtime.checkpoint checks each in flight is

    @property
    def cid(self) -> int:
        """The collective's id in this rank's trace."""
        return self._cid

    def wait(self, traced: bool = True) -> Any:
        """Block until it ends; ``traced=False`` leaves the wait out of the trace (the replay does not wait for it)."""
        if not self._done:
            self._comm._flush_compute()
            if traced:
                self._comm.events.append(Wait(self._cid))
                self._comm._announce()
            self._settle()
            self._comm._restart_clock()
            self._done = True
            self._comm._in_flight.pop(self._cid, None)
        return self._result

    def _settle(self) -> Any:
        """End the transfer and take its result, recording nothing (the strategy's ``wait`` still records its Wait)."""
        if not self._settled:
            if self._work is not None:
                with self._comm.blocking("wait", -1, self._cid):
                    self._work.wait()
                    if self._comm._sync is not None:  # NCCL's wait does not block the host
                        self._comm._sync()
            self._result = self._finish()
            self._settled = True
        return self._result

    def is_completed(self) -> bool:
        return self._done or self._work is None or self._work.is_completed()

    def state_dict(self) -> dict[str, Any]:
        """Its collective id and result, for a checkpoint (taken inside ``bookkeeping()``: the transfer ends
        now, untraced; a handle already waited on is no longer in flight and has no state to keep)."""
        if self._done:
            raise RuntimeError(f"Handle.state_dict: collective {self._cid} was already waited on; a checkpoint "
                               "keeps only the handles still in flight")
        result = self._settle()
        if not isinstance(result, torch.Tensor):
            raise TypeError(f"Handle.state_dict: collective {self._cid} returned {type(result).__name__}, not a tensor")
        self.kept = True
        return {"cid": self._cid, "result": result.detach().clone()}


class _StoreRead:
    """A get in flight: ``wait()`` reads the key into the tensor once it is there."""

    def __init__(self, comm: "Communicator", key: str, tensor: torch.Tensor) -> None:
        self.comm, self.key, self.tensor = comm, key, tensor

    def wait(self) -> None:
        self.comm._store().get(self.key, self.tensor)

    def is_completed(self) -> bool:
        return bool(self.comm._store().ready(self.key))


class Communicator:
    """Collectives for one rank, counted and traced.

    Args:
        rank: this node's global rank.
        world_size: number of nodes.
        device: where the strategy's tensors live (MPS tensors are staged through CPU).
        backend: the process group backend in use ("gloo" or "nccl").
        blocking: a context every call that waits on other nodes runs inside, given the call, its peer and
            its number (the node passes its heartbeat's, so waiting on the network is never taken for a
            hang, and a stall says where each node waits).
        clock: the node's link to the online simulated clock, when fit has one.
    """

    def __init__(self, rank: int, world_size: int, device: torch.device, backend: str = "gloo", *,
                 blocking: Callable[..., contextlib.AbstractContextManager[None]] = _unwatched,
                 clock: ClockSide | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.backend = backend
        self.events: list[Event] = []
        self._groups: dict[tuple[int, ...], Any] = {}
        self._next_cid = 0
        # async collectives not yet waited on (weakly: a handle the strategy drops is no longer in flight)
        self._in_flight: weakref.WeakValueDictionary[int, Handle] = weakref.WeakValueDictionary()
        self._pending_flops = 0.0
        self._step_flops = 0.0  # FLOPs attributed since the last step boundary
        self._t0 = time.perf_counter()
        self._sync = torch.cuda.synchronize if device.type == "cuda" else None
        self._running = False
        self.blocking = blocking
        self.clock = clock
        self.sitting_out = False  # an elastic node that is down: its work is not the run's and is not traced
        self.object_store: Any = None  # the fit's object store (exonet.runtime.object_store), for put and get
        self._restart_clock()

    @property
    def next_cid(self) -> int:
        """The id the next collective gets: a checkpoint keeps it, and a resumed node continues from it
        (set before its first collective), so ids stay unique across the run and restored handles keep theirs."""
        return self._next_cid

    @next_cid.setter
    def next_cid(self, value: int) -> None:
        if self._next_cid:
            raise RuntimeError(f"Communicator.next_cid: {self._next_cid} collectives were issued already; a resumed "
                               "node sets it before its first one")
        self._next_cid = value

    def restore_handle(self, state: dict[str, Any]) -> Handle:
        """A handle kept in a checkpoint by ``Handle.state_dict``: its transfer is over; its ``wait()`` is traced."""
        result = state["result"].to(self.device)
        handle = self._in_flight[int(state["cid"])] = Handle(self, int(state["cid"]), None, lambda: result)
        return handle

    def in_flight(self) -> list[Handle]:
        """The async collectives issued and not yet waited on, oldest first (a checkpoint must keep each)."""
        return [self._in_flight[cid] for cid in sorted(self._in_flight)]

    # ---------------------------------------------------------------- clock
    def now(self) -> float:
        """Seconds since this communicator started (real time, for the trace's start/end stamps)."""
        return time.perf_counter() - self._t0

    def begin(self) -> None:
        """Start timing compute: work before this (set-up, data loading warm-up) is not the run's."""
        self._running = True
        self._restart_clock()

    def _restart_clock(self) -> float:
        """Start a compute span now; returns now as ``now()`` reads it."""
        self._wall = time.perf_counter()
        self._cpu = time.thread_time()
        return self._wall - self._t0

    def _flush_compute(self) -> float:
        """Close the compute span in progress and start the next; returns now as ``now()`` reads it."""
        if self._sync is not None:
            self._sync()
        wall, cpu = time.perf_counter(), time.thread_time()
        if self._running and (wall > self._wall or self._pending_flops):
            if not self.sitting_out:
                self.events.append(Compute(wall - self._wall, max(0.0, cpu - self._cpu), self._pending_flops))
            self._pending_flops = 0.0
        self._wall, self._cpu = wall, cpu
        return wall - self._t0

    def add_flops(self, flops: float) -> None:
        """Attribute FLOPs to the compute span in progress."""
        self._pending_flops += flops
        self._step_flops += flops

    def flops_done(self, cumulative: float) -> None:
        """This step has done ``cumulative`` FLOPs so far: the span in progress gets what is new.

        The node calls it from gradient hooks with a profile counted once, so a step that
        communicates mid-backward splits its FLOPs where its compute spans split.
        """
        if cumulative > self._step_flops:
            self.add_flops(cumulative - self._step_flops)

    def mark_step(self) -> list[Event]:
        """End of a training step: close the compute span, record the boundary, hand over the step's events."""
        self._flush_compute()
        self._step_flops = 0.0
        self.events.append(Step())
        events, self.events = self.events, []
        return events

    def _announce(self) -> None:
        """Under an announcing clock, report the events so far before a blocking call."""
        if self.clock is not None and self.clock.announces:
            events, self.events = self.events, []
            self.clock.announce(events)

    def discard(self) -> None:
        """Record that this node's work since its last sync is thrown away (the replay counts it as lost)."""
        self._flush_compute()
        self.events.append(Discard())

    def take_events(self) -> list[Event]:
        """Events since the last step boundary (e.g. communication a strategy finished after its last step)."""
        self._flush_compute()
        events, self.events = self.events, []
        return events

    @contextlib.contextmanager
    def bookkeeping(self) -> Iterator[None]:
        """Traffic and work that are not the algorithm's: neither traced, counted nor timed.

        The clock pauses: the compute span in progress resumes afterwards instead of being
        split, so evaluations and checkpoints leave no mark on the trace.
        """
        if self._sync is not None:
            self._sync()
        wall, cpu = time.perf_counter() - self._wall, time.thread_time() - self._cpu
        try:
            yield
        finally:
            if self._sync is not None:
                self._sync()
            self._wall, self._cpu = time.perf_counter() - wall, time.thread_time() - cpu

    # ---------------------------------------------------------------- groups
    def declare_groups(self, groups: Sequence[Sequence[int]]) -> None:
        """Create the process groups for ``groups`` (lists of global ranks); every rank calls this alike.

        torch names a new process group by how many groups each process already has, so
        groups created by their members alone (``use_local_synchronization``) get
        different names on different ranks as soon as memberships vary from round to
        round, and hang. Creating every group on every rank, in the same order, keeps
        the names in step; non-members return at once. Groups already created, groups
        of one and the whole world are skipped.
        """
        for ranks in groups:
            key = self._key(ranks)
            if len(key) < 2 or len(key) == self.world_size or key in self._groups:
                continue
            with self.blocking("declare_groups"):
                self._groups[key] = dist.new_group(list(key))

    def adopt_group(self, ranks: Sequence[int], group: Any) -> None:
        """Run collectives on ``ranks`` on ``group``, a process group the strategy created itself (through
        ``torch.distributed.new_group``); the whole world and groups already known are left as they are."""
        key = self._key(ranks)
        if len(key) < self.world_size:
            self._groups.setdefault(key, group)

    def _key(self, ranks: Sequence[int]) -> tuple[int, ...]:
        """``ranks`` as a group's sorted members; a rank out of range, or named twice, is an error.

        (A group as long as the world is the world: a typo such as [0, 1, 2, 9] must not pass for it.)
        """
        key = tuple(sorted(int(r) for r in ranks))
        if key and not 0 <= key[0] <= key[-1] < self.world_size:  # sorted: the ends say it (every collective asks)
            bad = key[0] if key[0] < 0 else key[-1]
            raise ValueError(f"group {list(ranks)}: rank {bad} is not a rank in [0, {self.world_size})")
        if len(set(key)) != len(key):
            twice = next(a for a, b in zip(key, key[1:]) if a == b)
            raise ValueError(f"group {list(ranks)}: rank {twice} is named twice; name each member once")
        return key

    def group_of(self, ranks: GroupArg) -> Any:
        """The process group for ``ranks`` (None = everyone); it must have been declared on every rank."""
        if ranks is None:
            return None
        key = self._key(ranks)
        if len(key) == self.world_size:
            return None
        if self.rank not in key:
            raise ValueError(f"rank {self.rank} is not a member of group {key}")
        if key not in self._groups:
            raise ValueError(f"group {key} was never declared: every rank must call "
                             f"comm.declare_groups([...{list(key)}...]) before a collective on it")
        return self._groups[key]

    def _members(self, ranks: GroupArg) -> tuple[int, ...] | None:
        if ranks is None:
            return None
        key = self._key(ranks)
        return None if len(key) == self.world_size else key

    def group_size(self, ranks: GroupArg) -> int:
        return self.world_size if ranks is None else len(self._key(ranks))

    # ------------------------------------------------------------- plumbing
    def _run(self, op: str, payload: torch.Tensor, group: GroupArg, async_op: bool,
             launch: Callable[[bool], Any], finish: Callable[[], Any], key: str | None = None) -> Any:
        """Record the compute span, issue ``launch`` and record the collective (sync or async).

        The clock is read once on each side of the call (the span's end is the collective's start,
        its end the next span's start): this runs on every collective, so its cost is counted in
        microseconds (``python -m exonet.bench communicator``).
        """
        start = self._flush_compute()
        cid = self._next_cid
        self._next_cid += 1
        nbytes = payload.nbytes
        dtype = _dtype_name(payload.dtype)
        members = self._members(group)
        if async_op:
            work = launch(True)
            self.events.append(Collective(cid, op, nbytes, members, True, dtype, start, None, key))
            handle = self._in_flight[cid] = Handle(self, cid, work, finish)
            self._restart_clock()
            return handle
        announced = self.clock is not None and self.clock.announces
        if announced:  # the clock must see this call before it blocks
            self.events.append(Collective(cid, op, nbytes, members, False, dtype, start, None, key))
            self._announce()
        peer = -1
        if op in ("send", "recv"):
            assert group is not None  # a message's group is its (src, dst) pair
            peer = group[0] + group[1] - self.rank
        with self.blocking(op, peer, cid):
            launch(False)
            result = finish()
            if self._sync is not None:
                self._sync()
        end = self._restart_clock()
        if not announced:
            self.events.append(Collective(cid, op, nbytes, members, False, dtype, start, end, key))
        return result

    def _staged(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[torch.Tensor], object]]:
        """Backends cannot read MPS memory: stage through CPU and copy back afterwards."""
        if not tensor.is_mps:
            return tensor, _no_copy_back
        host = tensor.detach().to("cpu")
        return host, lambda out: tensor.copy_(out.to(tensor.device))

    def _chunked(self, op: str, tensor: torch.Tensor, group: GroupArg) -> tuple[torch.Tensor, Any, int]:
        """A contiguous host-readable buffer of ``tensor`` that splits into one chunk per member, its group and size."""
        n = self.group_size(group)
        if tensor.shape[0] % n:
            raise ValueError(f"{op}: dim 0 ({tensor.shape[0]}) must divide by the group size {n}")
        buf, _ = self._staged(tensor)
        return buf.contiguous(), self.group_of(group), n

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

    def send(self, tensor: torch.Tensor, dst: int, async_op: bool = False) -> Any:
        """Send ``tensor`` to global rank ``dst``, which must ``recv`` it (the k-th send to dst, its k-th recv).

        Counted as this rank's payload; simulated as one message on this rank's uplink, any
        inter-region link and ``dst``'s downlink. Returns the tensor, or a Handle.
        """
        self._check_peer("send", dst)
        buf, finish = self._p2p_buffer("send", tensor)
        return self._run("send", tensor, (self.rank, dst), async_op,
                         lambda a: dist.isend(buf, dst) if a else dist.send(buf, dst), finish)

    def recv(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> Any:
        """Receive into ``tensor`` what global rank ``src`` sends; returns it (or a Handle whose wait() does)."""
        self._check_peer("recv", src)
        out, finish = self._p2p_buffer("recv", tensor)
        return self._run("recv", tensor, (src, self.rank), async_op,
                         lambda a: dist.irecv(out, src) if a else dist.recv(out, src), finish)

    def batch_isend_irecv(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> list[Handle]:
        """Post every ``("send" | "recv", tensor, peer)`` at once, as torch's ``batch_isend_irecv`` (NCCL runs them
        as one group); returns a Handle per op, in order, whose ``wait()`` gives its tensor.

        Each is traced as an async send or recv, so the replay runs the group's transfers together, sharing
        the NICs, and the rank blocks where it waits on them.
        """
        posted = []
        for i, op in enumerate(ops):
            if not (isinstance(op, tuple) and len(op) == 3 and op[0] in P2P_KINDS):
                raise ValueError(f"batch_isend_irecv: ops[{i}] must be ('send' | 'recv', tensor, peer), got {op!r}")
            kind, tensor, peer = op
            self._check_peer(kind, peer)
            posted.append((kind, tensor, peer, *self._p2p_buffer(kind, tensor)))
        works = dist.batch_isend_irecv([dist.P2POp(P2P_KINDS[kind], buf, peer) for kind, _, peer, buf, _ in posted])
        return [self._run(kind, tensor, (self.rank, peer) if kind == "send" else (peer, self.rank), True,
                          _posted(work), finish)
                for (kind, tensor, peer, _, finish), work in zip(posted, works)]

    def put(self, key: str, tensor: torch.Tensor) -> None:
        """Write ``tensor`` to the object store under ``key`` (each key once); ``get`` reads it on any rank.

        Traced as a put of the tensor's bytes: in a replay it travels once from this node to the store
        (``[store]`` in the scenario), however many nodes read it.
        """
        self._store_op("put")
        self._run("put", tensor, None, False, lambda _: self._store().put(key, tensor), lambda: None, key=key)

    def get(self, key: str, tensor: torch.Tensor, async_op: bool = False) -> Any:
        """Fill ``tensor`` with the object ``key`` once some rank has put it; returns ``tensor`` (or a Handle).

        A key no rank puts ends the run after fit's ``timeout_s``, naming the key and this rank.
        """
        self._store_op("get")
        read = _StoreRead(self, key, tensor)
        return self._run("get", tensor, None, async_op, lambda a: read if a else read.wait(), lambda: tensor, key=key)

    def _store_op(self, op: str) -> None:
        if self.clock is not None and self.clock.announces:
            raise NotImplementedError(f"comm.{op}: the online clock (an asynchronous strategy, or max_sim_time_s) "
                                      "does not model the object store; replay the run with simulate() instead")

    def _store(self) -> Any:
        if self.object_store is None:
            raise RuntimeError(f"comm.put/get on rank {self.rank}: this run has no object store (a fit on one machine "
                               "has one; a multi-host torchrun run shares no directory)")
        return self.object_store

    def _p2p_buffer(self, kind: str, tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], torch.Tensor]]:
        """The contiguous host-readable buffer a send reads or a receive fills, and what returns ``tensor`` after."""
        buf, copy_back = self._staged(tensor)
        out = buf.contiguous()
        if kind == "send":
            return out, lambda: tensor

        def finish() -> torch.Tensor:
            if out is not buf:
                buf.copy_(out)
            copy_back(buf)
            return tensor

        return out, finish

    def recv_any(self, tensor: torch.Tensor | Callable[[int], torch.Tensor]) -> tuple[int, float] | None:
        """Receive into ``tensor`` the message that arrives first in simulated time, from any rank.

        The online clock decides (a parameter server applies updates in simulated arrival
        order, whatever order the real processes send in); the trace records a plain recv
        from that rank. Returns (sender, simulated seconds it was received), or None once no
        message can come (every other rank has finished). Needs the online clock: a run of a
        strategy with a server, given a scenario. ``tensor`` may be a function of the sender
        giving the buffer, for messages whose size depends on who sends (Decoupled DiLoCo's
        fragments); the trace's recv then records 0 bytes and the replay times the send's.
        """
        if self.clock is None:
            raise RuntimeError("recv_any: the online clock decides who is received first; it runs for strategies "
                               "with a server (Strategy.servers) given fit(scenario=...)")
        self._flush_compute()
        cid = self._next_cid
        self._next_cid += 1
        events, self.events = self.events, []
        answer = self.clock.ask(any_source_question(cid, tensor), events)
        if answer is not None:
            if callable(tensor):
                tensor = tensor(answer[0])
            buf, copy_back = self._staged(tensor)
            out = buf.contiguous()
            with self.blocking("recv", answer[0], cid):
                dist.recv(out, answer[0])
            if out is not buf:
                buf.copy_(out)
            copy_back(buf)
        self._restart_clock()
        return answer

    # ---------------------------------------------------------------- questions to the simulated clock
    # A time-aware strategy asks these through its Communicator, never the simulator: each needs
    # the online clock, which runs whenever fit has a scenario, and is answered from the same
    # replay that times the run (so a replay of the finished trace gives the same times).
    def _ask(self, what: str, question: tuple) -> Any:
        if self.clock is None:
            raise RuntimeError(f"{what} needs the online clock: fit with a scenario (fit(..., scenario=S))")
        return self.clock.ask(question, self.take_events())

    @property
    def has_clock(self) -> bool:
        """Whether the simulated clock answers this node's questions (fit was given a scenario)."""
        return self.clock is not None

    def sim_now(self) -> float:
        """This rank's simulated time, in seconds, once its events so far have been replayed."""
        return self._ask("Communicator.sim_now", ("now",))

    def speeds(self) -> tuple[float, ...]:
        """Every rank's relative compute speed in the scenario (1 = the scenario's device)."""
        return tuple(self._ask("Communicator.speeds", ("speeds",)))

    def transfer_time(self, op: str, nbytes: int, group: GroupArg = None) -> float:
        """Simulated seconds that collective (or a ``send`` of ``nbytes``) would take on an idle network."""
        return self._ask("Communicator.transfer_time", ("transfer", op, nbytes, self._members(group)))

    def deadline_round(self, round_index: int, deadline_s: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(participants, late) of deadline round ``round_index``: who finished its local work in time.

        Every trainer asks once per round when its local work ends; the answer comes once every
        trainer has finished the round or stopped (exonet.runtime.clock, ``SimClock._deadline``).
        """
        participants, late = self._ask("deadline_s", ("deadline", round_index, deadline_s))
        return tuple(participants), tuple(late)

    def elastic_round(self, round_index: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(up, out, rejoin) for an elastic sync ``round_index``: who averages, who is down, who comes back.

        Under ``[failures]`` (or ``down`` events) the clock answers from the replay: the up nodes
        average among themselves, a node that is out sits the round out, and a rejoining node
        receives the current state (exonet.runtime.clock).
        """
        up, out, rejoin = self._ask("elastic=True", ("elastic", round_index))
        return tuple(up), tuple(out), tuple(rejoin)

    def _check_peer(self, op: str, peer: int) -> None:
        if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(f"{op}: the peer must be another rank in [0, {self.world_size}), got {peer!r}")

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
