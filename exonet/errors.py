"""The errors exonet raises on purpose, each naming what was wrong and where."""

from __future__ import annotations


class ScenarioError(ValueError):
    """A scenario file or dict is invalid (the message names the file, field and what was expected)."""


class TraceError(ValueError):
    """A trace or run directory cannot be read (the message names the file)."""


class NodeFailure(RuntimeError):
    """A node process died or raised; ``rank`` says which, the message carries its traceback or signal."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(f"node {rank} failed: {message}")
        self.rank = rank


class DivergenceError(RuntimeError):
    """Training diverged: a node's loss became non-finite or ran away (``fit(on_divergence="raise")``).

    ``rank``, ``step`` (0-based) and ``loss`` say where; the run is stopped and its run directory marked incomplete.
    """

    def __init__(self, rank: int, step: int, loss: float, why: str) -> None:
        super().__init__(f"training diverged on rank {rank} at step {step}: {why}")
        self.rank, self.step, self.loss = rank, step, loss
