"""What nodes and the parent say to each other: one small record per kind of message.

Nodes report on their pipe (never through collectives); under the online clock the parent
answers on each node's control pipe. A send is complete once it returns, so a node killed
right after a report has still delivered it; but step reports that come quicker than every
``Outbox.EVERY_S`` wait to go together (``Steps``), and any other report sends them first.
Records are slotted dataclasses: cheap to build and pickle, and a reader names fields instead
of tuple positions. A node's messages are final: handlers dispatch on ``type(msg) is X``,
which a type checker narrows only for final classes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, final

from exonet.trace import Event

# ---------------------------------------------------------------- node -> parent
# A node's start-up, in order: forked from the server, joined the process group, unpickled the model, set up its
# strategy (the initial weights broadcast, the first batch drawn), ended its first step.
STARTUP = ("forked", "joined", "loaded", "set up", "first step")


@final
@dataclass(slots=True)
class StepDone:
    """A finished step: its mean loss on this node and the step's trace events; a node's first also carries when
    (``time.monotonic()``) it reached each part of its start-up (``STARTUP``)."""

    rank: int
    step: int
    loss: float | None  # None: a rank that computes no loss (a pipeline's stages before the last)
    events: list[Event]
    marks: dict[str, float] | None = None


@final
@dataclass(slots=True)
class Evaluated:
    """An evaluation (rank 0's, or a server's): an entry of ``history["eval"]``."""

    rank: int
    step: int
    entry: dict[str, Any]


@final
@dataclass(slots=True)
class Checkpointed:
    """The node wrote its checkpoint file for ``step``."""

    rank: int
    step: int


@final
@dataclass(slots=True)
class NodeDone:
    """Trailing events, and on the reporting rank the final model state (None elsewhere)."""

    rank: int
    events: list[Event]
    state: Any


@final
@dataclass(slots=True)
class NodeError:
    """The node raised: its traceback, and when (``time.monotonic()``: the earliest error is blamed)."""

    rank: int
    traceback: str
    at: float


@final
@dataclass(slots=True)
class Events:
    """Events reported before a blocking call, so the online clock can replay up to it."""

    rank: int
    events: list[Event]


@final
@dataclass(slots=True)
class Query:
    """Events so far and a question to the online clock (``SimClock.ask``), whose answer the node awaits."""

    rank: int
    events: list[Event]
    question: tuple


@final
@dataclass(slots=True)
class Steps:
    """Step reports that went together (``Outbox``), in order."""

    rank: int
    steps: list[StepDone]


NodeMessage = StepDone | Evaluated | Checkpointed | NodeDone | NodeError | Events | Query


class Outbox:
    """A node's reports to the parent, where nothing waits on each step's (no online clock).

    Each report wakes the parent, which costs the node 35 us alone and 80-150 us beside torch on two
    cores: a sixth of a small model's step. So a step report goes at once only when ``EVERY_S`` have
    passed since the last send (every step of a run whose steps take that long); the others are held
    until a later report goes. Any other report (a checkpoint's, an evaluation, the end, an error)
    sends those held first, so the parent reads each node's reports in order. Held reports can wait
    longer than ``EVERY_S`` when the node then blocks (a collective waiting on a slow peer): progress
    and the loss curve lag meanwhile. A node killed outright loses the steps held, steps ended less than
    ``EVERY_S`` apart, never a checkpoint's.
    """

    EVERY_S = 0.05

    def __init__(self, send: Callable[[NodeMessage | Steps], None], now: Callable[[], float] = time.monotonic) -> None:
        self._send, self._now = send, now
        self._held: list[StepDone] = []
        self._sent_at = now()

    def __call__(self, msg: NodeMessage) -> None:
        if type(msg) is StepDone and msg.marks is None:  # a first step's start-up marks go at once
            self._held.append(msg)
            if self._now() - self._sent_at >= self.EVERY_S:
                self.flush()
            return
        self.flush()
        self._send(msg)

    def flush(self) -> None:
        """Send the step reports held."""
        held, self._held = self._held, []
        if held:
            self._send(held[0] if len(held) == 1 else Steps(held[0].rank, held))
        self._sent_at = self._now()


# ---------------------------------------------------------------- parent -> node (the online clock)
@dataclass(slots=True)
class StepDecision:
    """Whether step ``step`` runs (a time budget stops the run once simulated time is spent)."""

    step: int
    go: bool


@dataclass(slots=True)
class Answer:
    """The clock's answer to the node's open question."""

    value: Any
