"""Pipeline parallelism: a model cut into stages on different ranks, timed by the trace it would produce.

``PipelineSpec`` says how: S stages, M micro-batches per step, and the schedule (GPipe: every forward,
then every backward; 1F1B: S − s − 1 forwards to fill stage s, then one forward and one backward in
turn, then the rest of the backwards). ``pipeline_trace`` writes the trace of R replicas of such a
pipeline (ranks r·S + s): each stage's share of the compute per micro-batch, each activation sent to
the next stage and each activation gradient to the previous one (point-to-point, the sends posted
asynchronously and waited at the step's end, the receives blocking), and the data-parallel exchange
of each stage's parameters among its replicas. The replay then shows the pipeline's bubble and what
slow links between stages cost (``exonet estimate --stages S --micro-batches M --schedule 1f1b``).
"""

from __future__ import annotations

from dataclasses import dataclass

from exonet.arguments import check_int
from exonet.trace import Trace

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class PipelineSpec:
    """A model in ``stages`` stages, ``micro_batches`` micro-batches per step, run by ``schedule``.

    Args:
        stages: S, the ranks one replica of the model spans.
        micro_batches: M, the micro-batches a step's batch is cut into.
        schedule: "gpipe" or "1f1b".
        activation_bytes: bytes one micro-batch's activations (and their gradients) put on a stage boundary;
            None: an estimate takes tokens per micro-batch × the model's width × its dtype's size.
    """

    stages: int
    micro_batches: int = 1
    schedule: str = "1f1b"
    activation_bytes: float | None = None

    def __post_init__(self) -> None:
        check_int("stages", self.stages, low=1)
        check_int("micro_batches", self.micro_batches, low=1)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {self.schedule!r}")
        if self.activation_bytes is not None and not self.activation_bytes >= 0:
            raise ValueError(f"activation_bytes must be >= 0, got {self.activation_bytes!r}")


def order(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s work in one step: ("F", m) and ("B", m) in the order it runs them."""
    forwards = [("F", m) for m in range(micro_batches)]
    backwards = [("B", m) for m in range(micro_batches)]
    if schedule == "gpipe":
        return forwards + backwards
    warm = min(stages - stage - 1, micro_batches)
    steady = [item for m in range(micro_batches - warm) for item in (forwards[warm + m], backwards[m])]
    return forwards[:warm] + steady + backwards[micro_batches - warm:]


def pipeline_trace(spec: PipelineSpec, *, replicas: int, steps: int, step_time: float, activation_bytes: float,
                   stage_bytes: float, sync_every: int, dtype: str = "float32") -> Trace:
    """The trace of ``replicas`` copies of the pipeline training ``steps`` steps.

    Args:
        spec: the stages, micro-batches and schedule.
        replicas: R, data-parallel copies of the pipeline (ranks r·S + s).
        steps: optimizer steps.
        step_time: seconds one replica's whole model would compute per step on one device; a stage does 1/S of
            it, a micro-batch 1/M of that, a forward a third and a backward two thirds.
        activation_bytes: bytes a micro-batch sends across each stage boundary, each way.
        stage_bytes: bytes of one stage's parameters, all-reduced among its replicas every ``sync_every`` steps
            (1: data parallel every step; H: DiLoCo's rounds; 0: never).
        dtype: the element type of what is sent.
    """
    S, M = spec.stages, spec.micro_batches
    trace = Trace(S * replicas, meta={"pipeline": {"stages": S, "micro_batches": M, "schedule": spec.schedule}})
    share = step_time / (S * M)
    size = int(round(activation_bytes))
    for r in range(replicas):
        for s in range(S):
            rank = r * S + s
            peers = [q * S + s for q in range(replicas)]
            for step in range(steps):
                sends = []
                for kind, _ in order(spec.schedule, s, S, M):
                    forward = kind == "F"
                    source, target = (rank - 1, rank + 1) if forward else (rank + 1, rank - 1)
                    if (s > 0 if forward else s < S - 1):
                        trace.add_collective(rank, "recv", size, (source, rank), dtype=dtype)
                    trace.add_compute(rank, share / 3 if forward else 2 * share / 3)
                    if (s < S - 1 if forward else s > 0):
                        sends.append(trace.add_collective(rank, "send", size, (rank, target), True, dtype=dtype))
                for cid in sends:
                    trace.add_wait(rank, cid)
                if replicas > 1 and sync_every and (step + 1) % sync_every == 0:
                    trace.add_collective(rank, "all_reduce", int(round(stage_bytes)), peers, dtype=dtype)
                trace.add_step(rank)
    return trace
