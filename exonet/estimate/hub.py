"""The online clock of an asynchronous estimate: every rank's thread reports to it and waits for its answers.

``exonet.estimate`` runs a strategy that reacts to simulated time (a server, deadline or elastic
rounds) with one thread per rank against the online clock of ``fit`` (exonet.runtime.clock);
this is the parent's part that ``fit`` plays, and each rank's side of it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


class OnlineHub:
    """The online clock shared by the threads of an asynchronous estimate (the parent's part in ``fit``).

    Every rank's events pass through ``report``: fed to the clock, kept for the trace (with each
    answered ``recv_any`` recorded as a plain recv, as ``fit`` records it), and the answers the
    clock can give are handed to the ranks that wait for them.

    Args:
        clock: the online clock of the estimate's scenario.
        world: every rank, trainers then servers.
    """

    def __init__(self, clock: Any, world: int) -> None:
        self.clock, self.world = clock, world
        self.events: list[list] = [[] for _ in range(world)]
        self._answers: dict[int, Any] = {}
        # one lock, one condition per rank: an answer wakes only its asker (waking every thread on every
        # report made the threads' wake-ups, not the clock, the cost of a large estimate)
        self._lock = threading.Lock()
        self._conds = [threading.Condition(self._lock) for _ in range(world)]
        self._asking: set[int] = set()
        self._alive = world
        # one rank runs at a time, until it waits for an answer: the ranks' torch calls otherwise hand
        # the GIL back and forth (system time grew as threads squared), and the clock orders them anyway
        self._turn = threading.Lock()
        self.error: BaseException | None = None

    def report(self, rank: int, events: list, *, question: tuple | None = None, done: bool = False) -> None:
        from exonet.runtime.clock import received_event

        with self._lock:
            self.events[rank].extend(events)
            self.clock.feed(rank, events)
            if done:
                self.clock.close(rank)
                self._alive -= 1
            if question is not None:
                self.clock.ask(rank, question)
            for asker, asked, answer in self.clock.answers():
                if answer is not None and asked[0] == "recv_any":
                    self.events[asker].append(received_event(asker, asked, answer))
                self._answers[asker] = answer
                self._conds[asker].notify()
            self._check_stuck()

    def enter(self) -> None:
        """Take the turn to run (a rank's thread holds it while it runs)."""
        self._turn.acquire()

    def leave(self) -> None:
        """Hand the turn on (a rank that waits or ends)."""
        self._turn.release()

    def answer(self, rank: int) -> Any:
        """Wait for the clock's answer to ``rank``'s question (raises if it can never come)."""
        self.leave()
        try:
            return self._wait(rank)
        finally:
            self.enter()

    def _wait(self, rank: int) -> Any:
        with self._lock:
            self._asking.add(rank)
            try:
                self._check_stuck()
                while rank not in self._answers:
                    if self.error is not None:
                        raise RuntimeError("estimate: another rank failed") from self.error
                    self._conds[rank].wait()
                return self._answers.pop(rank)
            finally:
                self._asking.discard(rank)

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = exc
            self._alive -= 1
            self._wake_all()

    def _check_stuck(self) -> None:
        """Every live rank waits and nothing is answered: the clock never will (called with the lock held)."""
        if self.error is None and self._asking and len(self._asking) == self._alive and not self._answers:
            self.error = RuntimeError("estimate: every rank waits for the online clock, which cannot "
                                      "answer any of them (the strategy's messages do not match)")
            self._wake_all()

    def _wake_all(self) -> None:
        for cond in self._conds:
            cond.notify()


@dataclass
class RankLink:
    """A rank's side of the ``OnlineHub``, in place of the runtime's ClockLink (same methods)."""

    hub: OnlineHub
    rank: int
    announces: bool = True
    gated: bool = False

    def allows(self, step: int) -> bool:
        return True

    def announce(self, events: list) -> None:
        self.hub.report(self.rank, events)

    def ask(self, question: tuple, events: list) -> Any:
        self.hub.report(self.rank, events, question=question)
        return self.hub.answer(self.rank)
