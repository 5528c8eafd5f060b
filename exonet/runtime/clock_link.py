"""A node's link to the online simulated clock (exonet.runtime.clock): its step decisions and its answers.

Apart from the clock itself so that a node, which forks from a server whose imports are the first fit's
critical path, does not import the network simulator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from exonet.runtime.messages import Answer, Events, NodeMessage, Query, StepDecision
from exonet.trace import Event


class ClockLink:
    """A node's side of the online clock: step decisions and answers arrive on one pipe, in order.

    Args:
        control: the read end of the parent's messages (``StepDecision`` and ``Answer``).
        report: sends a message to the parent (the node's pipe).
        rank: this node.
        blocked: the heartbeat's context for waiting on others (waiting for the clock is not a hang).
        gated: whether steps wait for decisions (a limit in simulated time was given).
        announces: report events before every blocking call (a run with a server: see the module doc).
    """

    def __init__(self, control: Any, report: Callable[[NodeMessage], None], rank: int,
                 blocked: Callable[[str], AbstractContextManager[Any]], gated: bool, announces: bool) -> None:
        self._control, self._report, self.rank, self._blocked = control, report, rank, blocked
        self.gated, self.announces = gated, announces
        self._steps: deque[StepDecision] = deque()

    def _read(self, want: type) -> Any:
        """The next message of type ``want`` (StepDecision or Answer); decisions that come first are kept."""
        while True:
            if want is StepDecision and self._steps:
                return self._steps.popleft()
            with self._blocked("the simulated clock"):
                msg = self._control.recv()
            if type(msg) is want:
                return msg
            if type(msg) is not StepDecision:
                raise RuntimeError(f"online clock: expected a {want.__name__}, got {msg!r}")
            self._steps.append(msg)

    def allows(self, step: int) -> bool:
        """Whether step ``step`` may run (waits for the parent's decision when the run is gated)."""
        if not self.gated:
            return True
        decision = self._read(StepDecision)
        if decision.step != step:
            raise RuntimeError(f"online clock: expected the decision for step {step}, got one for step {decision.step}")
        return decision.go

    def announce(self, events: list[Event]) -> None:
        """Report events before a blocking call, so the clock can replay up to it."""
        if events:
            self._report(Events(self.rank, events))

    def ask(self, question: tuple, events: list[Event]) -> Any:
        """Report ``events``, ask ``question`` (see ``SimClock.ask``) and wait for the answer."""
        self._report(Query(self.rank, events, question))
        return self._read(Answer).value
