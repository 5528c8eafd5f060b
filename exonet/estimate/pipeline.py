"""Pipeline parallelism: a model cut into stages on different ranks, timed by the trace it would produce.

``PipelineSpec`` says how: S stages, M micro-batches per step, and the schedule (GPipe: every forward,
then every backward; 1F1B: S − s − 1 forwards to fill stage s, then one forward and one backward in
turn, then the rest of the backwards). ``pipeline_trace`` writes the trace of R replicas of such a
pipeline (ranks r·S + s): each stage's share of the compute per micro-batch, each activation sent to
the next stage and each activation gradient to the previous one (point-to-point, the sends posted
asynchronously and waited at the step's end, the receives blocking), and the data-parallel exchange
of each stage's parameters among its replicas. The replay then shows the pipeline's bubble and what
slow links between stages cost (``exonet estimate --stages S --micro-batches M --schedule 1f1b``).

With ``routing`` (SWARM's randomised routing between stage replicas), a micro-batch is no longer tied to its
replica's ranks: it starts at stage 0 of the replica whose data it is, and at every later stage goes to the
replica ``paths`` picks for it, from the fit's seed and the step, so every rank knows every path without a
message. A stage then runs the micro-batches routed to it, forwards then backwards (GPipe), each in one
order shared by every rank (micro-batch, then source replica), which is why no rank can wait on one that
waits on it. With ``skip`` (SkipPipe), a micro-batch also passes over each middle stage with that probability:
the stage before sends straight to the one after, and the skipped stage's layers act as the identity for it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from exonet.arguments import check_int
from exonet.estimate.result import Estimate
from exonet.trace import Trace
from exonet.units import plural

if TYPE_CHECKING:
    from exonet.runtime.boundary import BoundaryCodec
    from exonet.strategies.base import Strategy

SCHEDULES = ("gpipe", "1f1b")
ROUTINGS = ("random", "balanced")


@dataclass(frozen=True)
class PipelineSpec:
    """A model in ``stages`` stages, ``micro_batches`` micro-batches per step, run by ``schedule``.

    Args:
        stages: S, the ranks one replica of the model spans.
        micro_batches: M, the micro-batches a step's batch is cut into.
        schedule: "gpipe" or "1f1b".
        activation_bytes: bytes one micro-batch's activations (and their gradients) put on a stage boundary;
            None: an estimate takes tokens per micro-batch × the model's width × its dtype's size.
        cuts: for ``fit``, the layer index each stage after the first starts at (S − 1 of them); None: cuts that
            balance the parameters per stage.
        codec: what crosses every boundary, both ways (``exonet.runtime.boundary``: ``Quantized``, ``TopK``,
            ``LowRank``); None: the tensors as they are.
        routing: how a micro-batch picks the replica of each stage after the first (SWARM): "random" (each
            stage's replica drawn uniformly, loads uneven as real draws are), "balanced" (a random deal that gives
            every replica of a stage exactly M micro-batches); None: a micro-batch stays in its replica. Needs
            the GPipe schedule.
        skip: the probability that a micro-batch passes over each stage between the first and the last
            (SkipPipe; drawn like the routes), whose input and output must then have one shape; 0: none is
            skipped. Needs the GPipe schedule.
    """

    stages: int
    micro_batches: int = 1
    schedule: str = "1f1b"
    activation_bytes: float | None = None
    cuts: tuple[int, ...] | None = None
    codec: BoundaryCodec | None = None
    routing: str | None = None
    skip: float = 0.0

    def __post_init__(self) -> None:
        check_int("stages", self.stages, low=1)
        check_int("micro_batches", self.micro_batches, low=1)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {self.schedule!r}")
        if self.activation_bytes is not None and not self.activation_bytes >= 0:
            raise ValueError(f"activation_bytes must be >= 0, got {self.activation_bytes!r}")
        if self.codec is not None and not callable(getattr(self.codec, "coder", None)):
            raise TypeError(f"codec must be a boundary codec (exonet.runtime.boundary: Quantized, TopK, LowRank), got "
                            f"{type(self.codec).__name__}")
        if self.routing is not None and self.routing not in ROUTINGS:
            raise ValueError(f"routing must be None or one of {', '.join(map(repr, ROUTINGS))}, got {self.routing!r}")
        if not (isinstance(self.skip, (int, float)) and 0 <= self.skip <= 1):
            raise ValueError(f"skip must be a probability in [0, 1], got {self.skip!r}")
        for name, drawn in (("routing", self.routing is not None), ("skip", self.skip > 0)):
            if drawn and self.schedule != "gpipe":
                raise ValueError(f"{name}={getattr(self, name)!r} runs the GPipe schedule (every forward, then every "
                                 f"backward), not {self.schedule!r}: give schedule='gpipe'")
        if self.cuts is not None:
            object.__setattr__(self, "cuts", tuple(check_int("cuts", c, low=1) for c in self.cuts))

    @property
    def drawn(self) -> bool:
        """Whether micro-batches take paths drawn per step (routing or skipping) rather than their replica's."""
        return self.routing is not None or self.skip > 0


def order(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s work in one step: ("F", m) and ("B", m) in the order it runs them."""
    forwards = [("F", m) for m in range(micro_batches)]
    backwards = [("B", m) for m in range(micro_batches)]
    if schedule == "gpipe":
        return forwards + backwards
    warm = min(stages - stage - 1, micro_batches)
    steady = [item for m in range(micro_batches - warm) for item in (forwards[warm + m], backwards[m])]
    return forwards[:warm] + steady + backwards[micro_batches - warm:]


def paths(spec: PipelineSpec, replicas: int, step: int, seed: int) -> list[list[tuple[int | None, ...]]]:
    """``paths[q][m]``: the replica of each stage that micro-batch m of replica q runs on at ``step`` (stage 0:
    q, whose data it is; None: it skips that stage); a pure function of its arguments, so every rank draws the
    same."""
    S, M = spec.stages, spec.micro_batches
    route: list[list[list[int | None]]] = [[[q] * S for _ in range(M)] for q in range(replicas)]
    if spec.routing is not None and replicas > 1:
        draw = random.Random(seed * 1_000_003 + step)
        for s in range(1, S):
            if spec.routing == "random":
                picks = [draw.randrange(replicas) for _ in range(M * replicas)]
            else:
                picks = [r for r in range(replicas) for _ in range(M)]
                draw.shuffle(picks)
            for i, (m, q) in enumerate((m, q) for m in range(M) for q in range(replicas)):
                route[q][m][s] = picks[i]
    if spec.skip > 0:
        skips = random.Random(f"skip/{seed}/{step}")  # its own draws: the routes do not depend on skip
        for s in range(1, S - 1):
            for m in range(M):
                for q in range(replicas):
                    if skips.random() < spec.skip:
                        route[q][m][s] = None
    return [[tuple(path) for path in by_m] for by_m in route]


@dataclass(frozen=True)
class Work:
    """One forward ("F") or backward ("B") of micro-batch ``micro`` of replica ``source`` on a stage, with the
    ranks its input comes from and its output goes to (None: it starts or ends there)."""

    kind: str
    source: int
    micro: int
    before: int | None
    after: int | None


def stage_work(spec: PipelineSpec, rank: int, replicas: int, step: int, seed: int,
               route: list[list[tuple[int | None, ...]]] | None = None) -> list[Work]:
    """What ``rank`` (stage ``rank % S`` of replica ``rank // S``) runs at ``step``, in order (see the module);
    ``route``: the step's ``paths``, when the caller has drawn them already."""
    S = spec.stages
    replica, stage = divmod(rank, S)
    if not spec.drawn:  # each micro-batch stays in its replica: the neighbours are the ranks either side
        before, after = rank - 1 if stage else None, rank + 1 if stage < S - 1 else None
        return [Work(kind, replica, m, before, after)
                for kind, m in order(spec.schedule, stage, S, spec.micro_batches)]
    route = paths(spec, replicas, step, seed) if route is None else route
    mine = [(q, m) for m in range(spec.micro_batches) for q in range(replicas) if route[q][m][stage] == replica]
    done = []
    for kind, q, m in ((kind, q, m) for kind in "FB" for q, m in mine):
        ran = [(s, r) for s, r in enumerate(route[q][m]) if r is not None]  # the first and last stages always run
        at = ran.index((stage, replica))
        before = None if at == 0 else ran[at - 1][1] * S + ran[at - 1][0]
        after = None if at == len(ran) - 1 else ran[at + 1][1] * S + ran[at + 1][0]
        done.append(Work(kind, q, m, before, after))
    return done


def pipeline_trace(spec: PipelineSpec, *, replicas: int, steps: int, step_time: float, activation_bytes: float,
                   stage_bytes: float, sync_every: int, dtype: str = "float32", seed: int = 0) -> Trace:
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
        seed: draws the micro-batches' paths under the spec's ``routing``.
    """
    S, M = spec.stages, spec.micro_batches
    trace = Trace(S * replicas, meta={"pipeline": {"stages": S, "micro_batches": M, "schedule": spec.schedule,
                                                   "routing": spec.routing, "skip": spec.skip}})
    share = step_time / (S * M)
    size = int(round(activation_bytes))
    routes = [paths(spec, replicas, step, seed) if spec.drawn else None for step in range(steps)]  # drawn once
    for r in range(replicas):
        for s in range(S):
            rank = r * S + s
            peers = [q * S + s for q in range(replicas)]
            for step in range(steps):
                sends = []
                for work in stage_work(spec, rank, replicas, step, seed, routes[step]):
                    forward = work.kind == "F"
                    source, target = (work.before, work.after) if forward else (work.after, work.before)
                    if source is not None:
                        trace.add_collective(rank, "recv", size, (source, rank), dtype=dtype)
                    trace.add_compute(rank, share / 3 if forward else 2 * share / 3)
                    if target is not None:
                        sends.append(trace.add_collective(rank, "send", size, (rank, target), True, dtype=dtype))
                for cid in sends:
                    trace.add_wait(rank, cid)
                if replicas > 1 and sync_every and (step + 1) % sync_every == 0:
                    trace.add_collective(rank, "all_reduce", int(round(stage_bytes)), peers, dtype=dtype)
                trace.add_step(rank)
    return trace


def pipelined(spec: PipelineSpec, strategy: Strategy, params: int, width: int | None, nodes: int, steps: int,
               step_time: float | None, tokens: float | None, dtype: torch.dtype, described: str, *,
               uniform: bool) -> Estimate:
    """``estimate`` of a pipeline: ``nodes`` ranks as replicas of ``spec.stages`` stages (``exonet.estimate.pipeline``);
    ``uniform``: every replica computes alike (no profile, no per-node tokens)."""
    if step_time is None or not uniform:
        raise ValueError("estimate: pipeline= takes one step_time or tokens_per_step for every replica, not a "
                         "profile or per-node tokens")
    if nodes % spec.stages:
        raise ValueError(f"estimate: num_nodes={nodes} is not a multiple of stages={spec.stages}: the ranks are "
                         "replicas of the whole pipeline")
    replicas = nodes // spec.stages
    sync_every = {"ddp": 1, "diloco": getattr(strategy, "H", 0)}.get(strategy.name)
    if sync_every is None:
        raise ValueError(f"estimate: with a pipeline, the strategy says what a stage's replicas exchange: ddp (every "
                         f"step) or diloco:H=... (every H steps), not {strategy.name}")
    size = torch.empty((), dtype=dtype).element_size()
    activation = spec.activation_bytes
    if activation is None:
        if tokens is None or width is None:
            raise ValueError("estimate: a pipeline's activations are tokens per micro-batch × the model's width; give "
                             "tokens_per_step= and params= (or the PipelineSpec's activation_bytes=)")
        activation = tokens / spec.micro_batches * width * size
        if spec.codec is not None:  # what the codec puts on the wire for a micro-batch's (tokens, width)
            activation = spec.codec.coder(torch.Size([max(1, round(tokens / spec.micro_batches)), width])).wire_nbytes
    trace = pipeline_trace(spec, replicas=replicas, steps=steps, step_time=step_time, activation_bytes=activation,
                           stage_bytes=params * size / spec.stages, sync_every=sync_every,
                           dtype=str(dtype).removeprefix("torch."))
    trace.meta.update(estimate=True, strategy=type(strategy).__name__, params=params, steps=steps,
                      compute={"step_time_s": step_time, "tflops": None, "mfu": None})
    exchange = ("none" if replicas == 1 else f"every {plural(sync_every, 'step')} an all-reduce of the stage's "
                f"{params * size / spec.stages:.4g} bytes among its {replicas} replicas")
    assumptions = [
        f"model: {params:,} parameters: {described}",
        f"pipeline: {plural(spec.stages, 'stage')} × {plural(replicas, 'replica')}, "
        f"{spec.micro_batches} micro-batch{'' if spec.micro_batches == 1 else 'es'} per step, "
        f"{spec.schedule}; {activation:.4g} bytes of activations per micro-batch and boundary, each way"
        f"{'' if spec.codec is None else f' (through {spec.codec!r})'}"
        f"{'' if spec.routing is None else f', each routed to a {spec.routing} replica of the next stage'}"
        f"{'' if not spec.skip else f', each skipping a middle stage with probability {spec.skip:g}'}; {exchange}",
        f"compute: {step_time:.4g} s per step for a replica's whole model, 1/{spec.stages} of it per stage, a forward "
        "a third and a backward two thirds of each micro-batch's share",
    ]
    return Estimate(trace, params, step_time, assumptions)
