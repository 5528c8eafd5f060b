"""The replay's state records: one per rank, one per collective (or message) instance, and
the online clock's any-source receive (``AnyRecv``), which a rank's queue holds beside trace events.

Plain slotted records, mutated by the engine (exonet.netsim.engine); times are ticks
(exonet.netsim.agenda), except the timeline, which is kept in seconds.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass

from exonet.netsim.fastpath import Plan
from exonet.trace import Event


@dataclass(frozen=True)
class AnyRecv:
    """Receive whichever message to this rank arrives first (fed by the online clock, never found in a trace).

    Among the messages already delivered when it is posted it takes the one delivered first
    (ties: the lowest sender), else the next one to arrive; only the oldest unreceived message
    of each sender is eligible, so each sender's messages keep their order. The node then
    receives from that sender, and the trace records a plain ``recv`` from it, which replays
    to the same times.
    """

    nbytes: int


class RankState:
    """One rank's replay state: its queue of events, cursor (ticks), accounting (ticks) and timeline."""

    __slots__ = (
        "aborted",
        "async_ops",
        "block_t",
        "blocked",
        "comm",
        "compute",
        "counts",
        "gate",
        "idle",
        "kept",
        "kinds",
        "lost",
        "mark",
        "open",
        "queue",
        "rank",
        "since_work",
        "span_end",
        "step",
        "step_ends",
        "synced",
        "t",
        "times",
        "trained",
        "unsynced",
    )

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.queue: deque[Event | AnyRecv] = deque()
        self.t = 0
        self.step = 0
        self.step_ends: list[int] = []  # the tick each of its steps ended
        self.synced = 0  # the tick its latest blocking collective (or wait) ended
        # set by the Discard of a node that failed since its last sync: its time after this tick (the work
        # it threw away, the outage it sits out) is not the run's, which may end before it; None once it
        # computes or syncs again (a late node's discarded work, as in deadline rounds, stays the run's)
        self.kept: int | None = None
        self.blocked: Instance | None = None
        self.block_t = 0
        self.open = True
        self.gate = False  # an outage by step begins at this step and its length is not yet known
        self.compute = self.comm = self.idle = 0
        self.since_work = 0.0  # seconds of work since its last sync, which a failure throws away
        self.mark = 0  # its compute (ticks) when it last synced or failed
        self.lost = 0  # compute (ticks) thrown away by failures
        self.aborted = 0  # exposed comm (ticks) in collectives a member's failure aborted (elastic runs)
        # an elastic collective went on without it: it stays unsynced (the clock sees it failed) until it discards
        self.unsynced = False
        # steps whose work it kept, steps computed since its last sync, its compute (ticks) at its last step
        self.trained = [0, 0, 0]
        self.times = array("d")  # span (start, end) pairs in seconds
        self.kinds = bytearray()
        self.span_end = -1  # the last span's end tick
        self.counts: dict[tuple[int, ...], int] = {}
        self.async_ops: dict[int, Instance] = {}


class Instance:
    """One collective instance: its members' arrivals, then its progress on the network."""

    __slots__ = (
        "arrivals",
        "async_op",
        "began",
        "done",
        "down",
        "dropped",
        "end",
        "key",
        "last",
        "members",
        "nbytes",
        "op",
        "pending",
        "phase",
        "plan",
        "ranks",
        "ready",
        "sent",
        "setup",
        "start",
        "taken",
        "token",
        "waiters",
    )

    def __init__(self, key: tuple[tuple[int, ...], int], op: str, members: tuple[int, ...]) -> None:
        self.key = key
        self.op = op
        self.members = members
        self.nbytes = 0
        self.ranks: list[int] = []  # who has issued it, in order
        self.arrivals: list[int] = []  # the tick each of them issued it (elastic runs)
        self.down: list[tuple[float, float]] | None = None  # its members' outages, once it has ended
        self.last = 0  # the latest arrival
        self.ready = 0  # a gloo message: the tick its receiver's recv-ready notice reaches the sender
        self.sent = -1  # a gloo message: the tick its last byte left the sender, whose send is then done
        self.waiters: list[RankState] = []
        self.start = self.end = 0
        self.setup = 0  # ticks of its group's one-time set-up it paid just before ``start``
        self.done = False
        self.plan: Plan | None = None
        self.phase = 0
        self.pending = 0  # messages of the current phase not yet delivered
        self.token = 0  # invalidates a fast-path end event when the engine takes over
        self.taken = -1  # the phase it was in when last taken over from the fast path
        self.async_op = False  # some member issued it asynchronously
        # elastic runs: the tick its first attempt began (-1: never aborted), and the members it went on without
        self.began = -1
        self.dropped: frozenset[int] = frozenset()
