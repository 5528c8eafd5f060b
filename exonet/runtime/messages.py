"""What nodes and the parent say to each other: one small record per kind of message.

Nodes report on their pipe (never through collectives); under the online clock the parent
answers on each node's control pipe. A send is complete once it returns, so a node killed
right after a report has still delivered it. Records are slotted dataclasses: cheap to build
and pickle, and a reader names fields instead of tuple positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exonet.trace import Event


# ---------------------------------------------------------------- node -> parent
@dataclass(slots=True)
class StepDone:
    """A finished step: its mean loss on this node and the step's trace events."""

    rank: int
    step: int
    loss: float
    events: list[Event]


@dataclass(slots=True)
class Evaluated:
    """An evaluation (rank 0's, or a server's): an entry of ``history["eval"]``."""

    rank: int
    step: int
    entry: dict[str, Any]


@dataclass(slots=True)
class Checkpointed:
    """The node wrote its checkpoint file for ``step``."""

    rank: int
    step: int


@dataclass(slots=True)
class NodeDone:
    """Trailing events, and on the reporting rank the final model state (None elsewhere)."""

    rank: int
    events: list[Event]
    state: Any


@dataclass(slots=True)
class NodeError:
    """The node raised: its traceback, and when (``time.monotonic()``: the earliest error is blamed)."""

    rank: int
    traceback: str
    at: float


@dataclass(slots=True)
class Events:
    """Events reported before a blocking call, so the online clock can replay up to it."""

    rank: int
    events: list[Event]


@dataclass(slots=True)
class Query:
    """Events so far and a question to the online clock (``SimClock.ask``), whose answer the node awaits."""

    rank: int
    events: list[Event]
    question: tuple


NodeMessage = StepDone | Evaluated | Checkpointed | NodeDone | NodeError | Events | Query


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
