"""Divergence detection: a non-finite or runaway training loss stops the run or warns, as ``fit`` is told.

Checked in the parent on each loss a node reports, so it costs the nodes nothing. A loss is
*runaway* when it exceeds ``factor`` times that rank's first loss: an untrained model's loss is
the ceiling a healthy run stays under (a run that learned to a tiny loss may still spike far
above its best on one batch, so the best is no reference).
"""

from __future__ import annotations

import math
import warnings

from exonet.errors import DivergenceError

POLICIES = ("raise", "warn", "ignore")


class DivergenceWatch:
    """Watches each rank's losses.

    Args:
        policy: "raise" (stop the run with DivergenceError), "warn" (once per rank, with step and rank) or "ignore".
        factor: a loss above ``factor`` × the rank's first loss counts as runaway.
    """

    def __init__(self, policy: str = "raise", factor: float = 10.0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"fit: on_divergence must be one of {', '.join(map(repr, POLICIES))}, got {policy!r}")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
            raise ValueError(f"fit: divergence_factor must be a number > 1, got {factor!r}")
        self.policy, self.factor = policy, float(factor)
        self._first: dict[int, float] = {}
        self._warned: set[int] = set()

    @property
    def references(self) -> dict[int, float]:
        """Each rank's first loss, the reference for runaway (a checkpoint keeps it for the resumed run)."""
        return dict(self._first)

    def restore(self, references: dict[int, float]) -> None:
        """Continue a resumed run: its ranks' first losses are those of the run it continues, not the
        already trained losses it reports first."""
        self._first.update(references)

    def check(self, rank: int, step: int, loss: float) -> None:
        """Raise or warn if ``loss`` (rank's training loss at 0-based ``step``) is non-finite or runaway."""
        if self.policy == "ignore":
            return
        why = None
        if not math.isfinite(loss):
            why = f"the training loss is {loss}"
        elif rank in self._first and self._first[rank] > 0 and loss > self.factor * self._first[rank]:
            why = (f"the training loss {loss:.4g} is over {self.factor:g}x its first ({self._first[rank]:.4g}); lower "
                   "the learning rate (or the outer learning rate / momentum), clip with max_norm, or raise "
                   "divergence_factor")
        elif math.isfinite(loss):
            self._first.setdefault(rank, loss)
        if why is None:
            return
        if self.policy == "raise":
            raise DivergenceError(rank, step, loss, why)
        if rank not in self._warned:
            self._warned.add(rank)
            warnings.warn(f"training diverged on rank {rank} at step {step}: {why} (on_divergence='warn': "
                          "training goes on; warned once per rank)", stacklevel=2)
