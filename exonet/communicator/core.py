"""The Communicator's state and plumbing: its clock and events, its groups, how one call is run and traced, and
the Handle of an async call in flight.

``CommCore`` is what the collectives (``collectives``), the messages and object store (``messages``) and the
questions to the simulated clock (``questions``) share; ``Communicator`` mixes them.
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
_DTYPE_NAMES: dict[torch.dtype, str] = {}  # "float32" for torch.float32: str() of a dtype costs a call per collective


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


class ClockSide(Protocol):
    """A node's side of the online clock, as a Communicator uses it (the runtime's ClockLink, estimate's RankLink)."""

    announces: bool  # report events before every blocking call

    def announce(self, events: list[Event]) -> None: ...

    def ask(self, question: tuple, events: list[Event]) -> Any: ...


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

    def __init__(self, comm: "CommCore", cid: int, work: Any, finish: Callable[[], Any]) -> None:
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


class CommCore:
    """One rank's communicator state: its clock, events and groups, and how a call is run and traced.

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
