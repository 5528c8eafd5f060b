"""Progress watchdog: tell a node that hangs from the nodes that wait for it.

Each node owns six doubles in a small shared array (``ctx.Array("d", SLOTS * K, lock=False)``):
the time of its last sign of progress (``time.monotonic``, system-wide on Linux), whether it
is inside a call that blocks on other nodes (a collective, a wait, rendezvous), whether its
start-up is over, and which blocking call that is (its kind, its peer, its collective number),
so that a stall can say where each node waits. A node beats at every step, evaluation batch
and checkpoint, and on entering and leaving a blocking call; the parent reads the array a few
times a second.

Blame rule: a node that is *not* blocked and has shown no progress for longer than its
allowance is hung, and the one silent longest is blamed. The allowance is
``progress_timeout_s`` once training runs and the larger ``startup_allowance`` before a
node's first step (rendezvous, dataset construction, FLOP counting). A node waiting in a
collective is never blamed while a peer it waits for is still computing. If every running
node is blocked and all are past their allowance, the collectives themselves are stuck
(mismatched calls, say): the message says where each node waits, and the node named is the
odd one out (the fewest nodes waiting in the same call; the one waiting longest among them).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from exonet.errors import NodeFailure

SLOTS = 6
BEAT, BLOCKED, STARTED, CALL, PEER, CALL_ID = range(SLOTS)
# What a node can wait in (the CALL slot holds the index); "" is a call of no name.
CALLS = ("", "rendezvous", "declare_groups", "all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all",
         "send", "recv", "wait", "all_reduce (evaluation or the final averaging)", "broadcast (the start-up model)",
         "the simulated clock", "reduce", "gather", "scatter", "barrier", "put", "get")
CALL_CODE = {call: float(i) for i, call in enumerate(CALLS)}  # a dict: this runs around every collective
STARTUP_MIN_S = 120.0
STARTUP_FACTOR = 4.0


def startup_allowance(progress_timeout_s: float) -> float:
    """Seconds a node may take to reach its first step: start-up is slower than a step."""
    return max(STARTUP_MIN_S, STARTUP_FACTOR * progress_timeout_s)


class Heartbeat:
    """One node's slot in the shared progress array (a private list when nobody watches, e.g. torchrun)."""

    def __init__(self, array: Any | None, rank: int) -> None:
        self._a = array if array is not None else [0.0] * SLOTS * (rank + 1)
        self._i = rank * SLOTS
        self._a[self._i + PEER] = self._a[self._i + CALL_ID] = -1.0  # no blocking call yet: no peer, no number
        self.beat()

    def beat(self) -> None:
        self._a[self._i + BEAT] = time.monotonic()

    def started(self) -> None:
        """Start-up is over: from now on the (shorter) progress timeout applies."""
        self._a[self._i + STARTED] = 1.0
        self.beat()

    @contextlib.contextmanager
    def blocked(self, call: str = "", peer: int = -1, call_id: int = -1) -> Iterator[None]:
        """Mark a call that waits on other nodes, so the watchdog blames them rather than us.

        ``call`` (one of ``CALLS``), ``peer`` (a send's or receive's other rank) and ``call_id`` (the
        collective's number on this rank) say where it waits, for the message of a stall.
        """
        i = self._i
        prev = [self._a[i + k] for k in (BLOCKED, CALL, PEER, CALL_ID)]
        self._a[i + BLOCKED], self._a[i + CALL], self._a[i + PEER], self._a[i + CALL_ID] = (
            1.0, CALL_CODE[call], peer, call_id)
        self.beat()
        try:
            yield
        finally:
            self._a[i + BLOCKED], self._a[i + CALL], self._a[i + PEER], self._a[i + CALL_ID] = prev
            self.beat()


class Watchdog:
    """The parent's reader of the progress array.

    Args:
        array: the shared array the nodes beat into.
        num_nodes: K.
        timeout_s: ``progress_timeout_s``; the start-up allowance derives from it.
    """

    def __init__(self, array: Any, num_nodes: int, timeout_s: float) -> None:
        self.array, self.num_nodes, self.timeout_s = array, num_nodes, timeout_s
        self.startup_s = startup_allowance(timeout_s)
        self.t0 = time.monotonic()

    def check(self, finished: set[int]) -> NodeFailure | None:
        """The failure to raise if some node stopped making progress, else None."""
        now = time.monotonic()
        overdue: list[tuple[float, int, bool, bool]] = []  # (last sign of life, rank, blocked, started)
        running = 0
        for rank in range(self.num_nodes):
            if rank in finished:
                continue
            running += 1
            i = rank * SLOTS
            last = max(self.array[i + BEAT], self.t0)
            started = self.array[i + STARTED] > 0
            if now - last > (self.timeout_s if started else self.startup_s):
                overdue.append((last, rank, self.array[i + BLOCKED] > 0, started))
        hung = sorted(o for o in overdue if not o[2])
        if hung:
            last, rank, _, started = hung[0]
            return NodeFailure(rank, self._message(now - last, started, "it was computing, not waiting on a peer"))
        if overdue and len(overdue) == running:
            return self._stuck(now, overdue)
        return None

    def _waits_in(self, rank: int) -> str:
        """Where ``rank`` waits, in words: "send to 1 (call #0)"."""
        i = rank * SLOTS
        call, peer, call_id = CALLS[int(self.array[i + CALL])] or "a blocking call", int(self.array[i + PEER]), \
            int(self.array[i + CALL_ID])
        if peer >= 0:
            call += f" {'to' if call == 'send' else 'from'} {peer}"
        return call + (f" (call #{call_id})" if call_id >= 0 else "")

    def _stuck(self, now: float, overdue: list[tuple[float, int, bool, bool]]) -> NodeFailure:
        """Every running node waits in a call: say where each waits, and name the odd one out."""
        where: dict[str, list[tuple[float, int, bool, bool]]] = {}
        for o in sorted(overdue):
            where.setdefault(self._waits_in(o[1]), []).append(o)
        odd = min(where.values(), key=len)  # fewest in one call; the first waited longest
        last, rank, _, started = odd[0]
        waits = "; ".join(f"{'ranks' if len(os) > 1 else 'rank'} {', '.join(str(r) for r in sorted(o[1] for o in os))}"
                          f" in {call}" for call, os in sorted(where.items(), key=lambda w: min(o[1] for o in w[1])))
        why = f"every node is blocked: {waits}"
        why += f"; mismatched calls? rank {rank} is the odd one out" if len(where) > 1 else ""
        return NodeFailure(rank, self._message(now - last, started, why))

    def _message(self, age: float, started: bool, why: str) -> str:
        if started:
            return (f"no progress for {age:.1f} s ({why}); the limit is progress_timeout_s={self.timeout_s:g}: "
                    "raise it if a step legitimately takes longer, or pass progress_timeout_s=None")
        return (f"no progress for {age:.1f} s during start-up ({why}); start-up may take "
                f"max({STARTUP_MIN_S:g} s, {STARTUP_FACTOR:g} x progress_timeout_s) = {self.startup_s:g} s: "
                "raise progress_timeout_s, or pass progress_timeout_s=None")
