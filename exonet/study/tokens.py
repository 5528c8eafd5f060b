"""Tokens trained and time per token: a run that throws work away trains less than it steps.

Every node of a run takes the same number of steps, but an elastic run's failed nodes discard
their work and a node sitting out computes nothing, so an elastic run can end sooner than a
blocking one by training less. ``SimResult.steps_trained`` counts the node-steps whose work the
run kept. Times a trace's tokens per node-step (``trace.meta["tokens_per_step"]``: ``estimate``
records its ``tokens_per_step``, one number or one per node) it is the tokens trained, and the
wall-clock over it the time per token: the figure that compares a run that dropped work with one
that did not. Without tokens, ``time_per_step_s`` is the wall-clock per step kept on every trainer
(``wall_clock_s`` / steps for a run that kept all its work).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exonet.netsim.result import SimResult
    from exonet.trace import Trace


def tokens_per_step(trace: Trace) -> list[float] | None:
    """Each trainer's tokens per step as the trace states them (``meta["tokens_per_step"]``), else None."""
    given = trace.meta.get("tokens_per_step")
    if given is None:
        return None
    trainers = trace.num_nodes
    return [float(given)] * trainers if isinstance(given, (int, float)) else [float(t) for t in given]


def trained(sim: SimResult, trace: Trace) -> dict[str, Any]:
    """What the replay ``sim`` of ``trace`` trained, beside its time.

    Returns:
        ``steps_trained`` (node-steps whose work was kept), ``tokens`` and ``time_per_token_s`` (None when
        the trace states no tokens per step) and ``time_per_step_s`` (wall-clock per step kept by every
        trainer; None if none was).
    """
    steps = sim.steps_trained
    per = tokens_per_step(trace)
    tokens = None if per is None else sum(p.trained_steps * t for p, t in zip(sim.per_node[:sim.trainers], per))
    return {
        "steps_trained": steps,
        "tokens": tokens,
        "time_per_token_s": sim.wall_clock_s / tokens if tokens else None,
        "time_per_step_s": sim.wall_clock_s * sim.trainers / steps if steps else None,
    }
