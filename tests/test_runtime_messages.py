"""A node's outbox: quick step reports go together, in order, and never after a report that follows them."""

from __future__ import annotations

from exonet.runtime.messages import Checkpointed, NodeError, Outbox, StepDone, Steps


class Clock:
    """The outbox's clock, in seconds, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def step(n: int, marks: dict | None = None) -> StepDone:
    return StepDone(3, n, 0.5, [], marks)


def steps_every(seconds: float, count: int) -> tuple[list, Outbox]:
    """An outbox fed ``count`` step reports ``seconds`` apart: what it sent, and the box."""
    sent: list = []
    clock = Clock()
    box = Outbox(sent.append, clock)
    for n in range(count):
        clock.now += seconds
        box(step(n))
    return sent, box


def test_quick_steps_wait_and_go_together_in_order():
    sent, box = steps_every(0.011, 4)
    assert sent == []  # 44 ms since the box opened: all four held
    sent, box = steps_every(0.011, 5)
    assert sent == [Steps(3, [step(n) for n in range(5)])]  # 55 ms: the fifth sends them all
    box(step(5))
    assert len(sent) == 1  # held again, until the next 50 ms have passed


def test_slow_steps_go_one_by_one_as_they_end():
    sent, _ = steps_every(0.06, 3)
    assert sent == [step(0), step(1), step(2)]


def test_any_other_report_sends_the_held_steps_first():
    sent: list = []
    box = Outbox(sent.append, Clock())
    box(step(0, marks={"first step": 1.0}))  # start-up marks go at once
    box(step(1))
    box(step(2))
    box(Checkpointed(3, 3))
    box(step(3))
    error = NodeError(3, "Traceback ...", 2.0)
    box(error)
    assert sent == [step(0, marks={"first step": 1.0}), Steps(3, [step(1), step(2)]), Checkpointed(3, 3), step(3),
                    error]
