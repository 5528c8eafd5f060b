"""Progress watchdog: tell a node that hangs from the nodes that wait for it.

Each node owns three doubles in a small shared array (``ctx.Array("d", 3 * K, lock=False)``):
the time of its last sign of progress (``time.monotonic``, system-wide on Linux), whether it
is inside a call that blocks on other nodes (a collective, a wait, rendezvous), and whether
its start-up is over. A node beats at every step, evaluation batch and checkpoint, and on
entering and leaving a blocking call; the parent reads the array a few times a second.

Blame rule: a node that is *not* blocked and has shown no progress for longer than its
allowance is hung, and the one silent longest is blamed. The allowance is
``progress_timeout_s`` once training runs and the larger ``startup_allowance`` before a
node's first step (rendezvous, dataset construction, FLOP counting). A node waiting in a
collective is never blamed while a peer it waits for is still computing. If every running
node is blocked and all are past their allowance, the collectives themselves are stuck
(mismatched calls, say) and the node waiting longest is named.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from exonet.errors import NodeFailure

SLOTS = 3
BEAT, BLOCKED, STARTED = range(SLOTS)
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
        self.beat()

    def beat(self) -> None:
        self._a[self._i + BEAT] = time.monotonic()

    def started(self) -> None:
        """Start-up is over: from now on the (shorter) progress timeout applies."""
        self._a[self._i + STARTED] = 1.0
        self.beat()

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        """Mark a call that waits on other nodes, so the watchdog blames them rather than us."""
        prev = self._a[self._i + BLOCKED]
        self._a[self._i + BLOCKED] = 1.0
        self.beat()
        try:
            yield
        finally:
            self._a[self._i + BLOCKED] = prev
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
            last, rank, _, started = min(overdue)
            return NodeFailure(rank, self._message(now - last, started,
                                                   "every node is blocked in a collective (mismatched collectives?)"))
        return None

    def _message(self, age: float, started: bool, why: str) -> str:
        if started:
            return (f"no progress for {age:.1f} s ({why}); the limit is progress_timeout_s={self.timeout_s:g}: "
                    "raise it if a step legitimately takes longer, or pass progress_timeout_s=None")
        return (f"no progress for {age:.1f} s during start-up ({why}); start-up may take "
                f"max({STARTUP_MIN_S:g} s, {STARTUP_FACTOR:g} x progress_timeout_s) = {self.startup_s:g} s: "
                "raise progress_timeout_s, or pass progress_timeout_s=None")
