"""RunRecord: what the nodes of a run have reported so far, turned into history and trace.

Node messages (see exonet.runtime.run) arrive per node and out of step with each other; the
record keeps every node's trace events, the mean training loss of each step once every
trainer still running has reported it (trainers of an asynchronous run stop at different
steps), evaluations, and the final model. Both the local supervisor
and a torchrun launch feed it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exonet.runtime.messages import STARTUP, Evaluated, Events, NodeDone, NodeMessage, Query, StepDone
from exonet.trace import Event, Step, Trace

if TYPE_CHECKING:
    from exonet.runtime.checkpoint import Resume


def _upto(events: list[Event], steps: int) -> list[Event]:
    """The events of the first ``steps`` steps."""
    seen = 0
    for i, e in enumerate(events):
        if isinstance(e, Step):
            seen += 1
            if seen == steps:
                return events[: i + 1]
    return list(events)


class RunRecord:
    """History, trace and final model of a run, built from node messages.

    Args:
        num_nodes: every rank (K trainers, then any servers).
        max_steps: the run's length (for the progress bar).
        meta: the trace's metadata.
        resume: the checkpoint this run continues (its history and trace come first), or None.
        progress: draw a progress bar, starting at ``start_step``.
        start_step: the step the run starts (or resumes) from.
        trainers: how many ranks train (default: all).
    """

    def __init__(self, num_nodes: int, max_steps: int, meta: dict[str, Any], resume: "Resume | None" = None,
                 progress: bool = False, start_step: int = 0, trainers: int | None = None) -> None:
        self.num_nodes, self.meta = num_nodes, meta
        self.trainers = num_nodes if trainers is None else trainers
        self.history: dict[str, list] = {"train_loss": [], "eval": []}
        self.events: list[list[Event]] = [[] for _ in range(num_nodes)]
        if resume is not None:  # its nodes continue the checkpoint's collective ids (exonet.runtime.checkpoint)
            self.history = resume.history
            self.events = [list(evs) for evs in resume.trace.events]
        self.state: bytes | None = None
        self.logger: Any = None  # a WandbLogger when fit(wandb_project=...) asked for one
        self.metrics: Any = None  # a MetricsLog (exonet.rundir) writing metrics.jsonl as the run goes
        self.watch: Any = None  # a DivergenceWatch (exonet.runtime.divergence) checking every reported loss
        self.done: set[int] = set()
        # time.monotonic() at each part of the start-up: the parent's, and each node's from its first step
        self.started: dict[str, float] = {}
        self.marks: dict[int, dict[str, float]] = {}
        self._losses: dict[int, dict[int, float | None]] = {}
        self._bar = None
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=max_steps, initial=start_step, desc=f"exonet K={num_nodes}", unit="step",
                             leave=False)

    def handle(self, msg: NodeMessage) -> None:
        """Take a StepDone, Evaluated, NodeDone, Events or Query message."""
        rank = msg.rank
        if type(msg) is StepDone:
            if msg.marks is not None:
                self.marks[rank] = msg.marks
            self.events[rank].extend(msg.events)
            self._losses.setdefault(msg.step, {})[rank] = msg.loss
            if self.watch is not None and msg.loss is not None:
                self.watch.check(rank, msg.step, msg.loss)
            self._flush_losses()
        elif type(msg) is Evaluated:
            self.history["eval"].append(msg.entry)
            if self.logger is not None:
                self.logger.log_eval(msg.entry)
            if self.metrics is not None:
                self.metrics.sync()
        elif type(msg) is Events or type(msg) is Query:  # reported before a blocking call (exonet.runtime.clock)
            self.events[rank].extend(msg.events)
        elif type(msg) is NodeDone:
            self.events[rank].extend(msg.events)
            if msg.state is not None:
                self.state = msg.state
            self.done.add(rank)
            self._flush_losses()
        else:
            raise ValueError(f"RunRecord: unexpected message {msg!r}")

    def _flush_losses(self) -> None:
        nxt = start = len(self.history["train_loss"])
        while self._losses.get(nxt) and all(r in self._losses[nxt] or r in self.done for r in range(self.trainers)):
            losses = [loss for loss in self._losses.pop(nxt).values() if loss is not None]
            self.history["train_loss"].append(sum(losses) / len(losses) if losses else float("nan"))
            nxt += 1
            if self.logger is not None:
                self.logger.log_step(nxt, self.history["train_loss"][-1])
            if self._bar is not None:
                self._bar.update(1)
                self._bar.set_postfix(loss=f"{self.history['train_loss'][-1]:.4f}", refresh=False)
        if nxt > start and self.metrics is not None:
            self.metrics.sync()

    def startup(self) -> dict[str, float]:
        """When (``time.monotonic()``) the parent, then the last trainer, reached each part of the start-up."""
        out = dict(self.started)
        trainers = [m for rank, m in self.marks.items() if rank < self.trainers]
        for part in STARTUP:
            reached = [m[part] for m in trainers if part in m]
            if reached:
                out[part] = max(reached)
        return out

    def trace(self) -> Trace:
        return Trace(meta=dict(self.meta), events=self.events, num_ranks=self.num_nodes)

    def snapshot(self, steps: int) -> tuple[dict[str, list], Trace]:
        """History and trace of the first ``steps`` steps (nodes may already be further on)."""
        history = {"train_loss": self.history["train_loss"][:steps],
                   "eval": [e for e in self.history["eval"] if e["step"] <= steps]}
        trace = Trace(meta=dict(self.meta), events=[_upto(evs, steps) for evs in self.events], num_ranks=self.num_nodes)
        return history, trace

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self.metrics is not None:
            self.metrics.close()
