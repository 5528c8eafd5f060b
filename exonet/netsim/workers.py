"""Worker-level goodput: a machine of N chips split into M workers, at any chip count.

The replay (exonet.netsim.engine) gives every rank a node, and a million chips would be a million
nodes. This model works a level up, as Decoupled DiLoCo (arXiv 2604.21428) reasons: a worker of
N/M chips is one unit whose chips fail independently, each with mean ``[failures] mtbf`` (the
paper's MTBI per chip), so its failures arrive at the summed rate, live chips / mtbf, exponential
and seeded per worker (``UnitFailures``). The cost is one event per failure, whatever the chip count.

What a failure costs its worker (``worker_goodput``):

* not elastic: the worker throws away its training since its last sync (``sync_s``: a Decoupled
  DiLoCo worker's outer step; 0 syncs continuously and loses nothing) and stalls ``restart`` (a
  synchronous job re-forms on spare chips and reloads its state), then goes on whole. A failure
  strikes whatever its length: ``restart`` 0 still throws the work away;
* elastic: the worker stalls ``pause`` (its quorum re-forms without the failed chips), then trains
  without the ``slice`` chips the failure took down until ``repair`` after the failure.

No failure arrives during a stall (the alternating renewal of exonet.netsim.failures), so one
worker of n chips that stalls d per failure and never misses a slice keeps g = 1 / (1 + d·n/mtbf);
with syncs every S seconds of training, λ = n/mtbf, g = λS / ((e^(λS) − 1)(1 + λd)) (a round of S
is started again after every failure within it).
Workers are independent: Decoupled DiLoCo with a quorum of 1, where a failure stalls only its
worker. One worker of all the chips is data-parallel training (elastic or not). Goodput is the
share of the machine's chip-time that trains the model.

``quorum_goodput`` is the other half of the paper's argument: workers at uneven speeds, whose
every sync waits for a quorum of them; ``scenario_quorum_goodput`` reads those speeds from a scenario.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from exonet.netsim.failures import MAX_FAILURES, UnitFailures, warn_default_restart
from exonet.scenario import FailureSpec, Scenario

_QUORUM_STREAM = 0x0A0F  # the speed noise of quorum_goodput, apart from every failure stream


@dataclass(frozen=True)
class WorkerGoodput:
    """What ``worker_goodput`` found, in chip-seconds over ``chips`` × ``horizon_s``.

    ``goodput + stalled + missing + lost == 1``: trained, stalled (a whole worker waiting out a pause or
    restart), missing (a slice out for repair while its worker trains on) and lost (trained since the
    worker's last sync, then thrown away by a failure).
    """

    chips: int
    workers: int
    elastic: bool
    horizon_s: float
    failures: int
    goodput: float
    stalled: float
    missing: float
    lost: float = 0.0


def worker_goodput(scenario: Scenario, chips: int, workers: int = 1, *, elastic: bool = True,
                    horizon_s: float = 86400.0, sync_s: float = 0.0) -> WorkerGoodput:
    """Goodput of ``chips`` chips in ``workers`` independent workers under ``scenario``'s ``[failures]``.

    Args:
        scenario: its ``[failures]`` gives the per-chip ``mtbf``, ``restart`` (not elastic), ``pause``,
            ``slice`` and ``repair`` (elastic), and the ``seed``.
        chips: the machine's chips, split as evenly as can be.
        workers: M; 1 is data-parallel training.
        elastic: whether a failure costs ``pause`` and a missing slice (True) or a ``restart``.
        horizon_s: simulated seconds of training; its expected failures (chips × horizon_s / mtbf, one event
            each) must stay within ``MAX_FAILURES``.
        sync_s: training seconds between a worker's syncs, whose work a failure throws away when not elastic
            (0: none is lost).
    """
    spec = scenario.failures
    if spec is None:
        raise scenario.key_error("failures", "worker_goodput needs a [failures] table (e.g. mtbf = \"8766 h\")")
    if not 1 <= workers <= chips:
        raise ValueError(f"worker_goodput: workers must be in [1, chips = {chips:,}], got {workers}")
    _check_horizon(horizon_s, chips * horizon_s / spec.mtbf if math.isfinite(horizon_s) else math.inf)
    if not 0 <= sync_s < math.inf:
        raise ValueError(f"worker_goodput: sync_s must be a finite number of seconds >= 0, got {sync_s!r}")
    warn_default_restart(scenario.to_dict().get("failures"), elastic)
    smallest = chips // workers
    if spec.slice > smallest:
        raise scenario.key_error("failures.slice", f"{spec.slice:,} devices is larger than a worker "
                                 f"({chips:,} chips / {workers} workers = {smallest:,} devices); a failure takes "
                                 f"down at most its worker")
    sizes = [smallest + (i < chips % workers) for i in range(workers)]
    sync = 0.0 if elastic else sync_s
    runs = [_worker(spec, UnitFailures(spec, i), n, elastic, horizon_s, sync) for i, n in enumerate(sizes)]
    total = chips * horizon_s
    return WorkerGoodput(chips=chips, workers=workers, elastic=elastic, horizon_s=horizon_s,
                          failures=sum(r[0] for r in runs), goodput=sum(r[1] for r in runs) / total,
                          stalled=sum(r[2] for r in runs) / total, missing=sum(r[3] for r in runs) / total,
                          lost=sum(r[4] for r in runs) / total)


def _check_horizon(horizon_s: float, expected: float) -> None:
    """ValueError naming ``horizon_s`` unless it is finite, > 0, and expects at most ``MAX_FAILURES`` failures (each
    one event: a horizon of 1e300 s would never end)."""
    if not 0 < horizon_s < math.inf:
        raise ValueError(f"worker_goodput: horizon_s must be a finite number of seconds > 0, got {horizon_s!r}")
    if not expected <= MAX_FAILURES:
        raise ValueError(f"worker_goodput: horizon_s = {horizon_s:.4g} s expects about {expected:.3g} failures "
                         f"(chips × horizon_s / mtbf), more than {MAX_FAILURES:,}, one event each: shorten horizon_s "
                         f"(the goodput of a shorter one is the same within its sampling error)")


def _worker(spec: FailureSpec, failures: UnitFailures, n: int, elastic: bool, horizon: float,
             sync: float) -> tuple[int, float, float, float, float]:
    """One worker of ``n`` chips over ``horizon`` seconds: (failures, trained, stalled, missing, lost chip-seconds),
    which add up to n · horizon; a failure throws away the training since its last sync, every ``sync`` (0: none)."""
    stall = spec.pause if elastic else spec.restart
    out: list[tuple[float, int]] = []  # (back at, chips) of the slices out for repair
    t, live, count, trained, stalled, missing, lost = 0.0, n, 0, 0.0, 0.0, 0.0, 0.0
    since = 0.0  # seconds trained since the last sync (with ``sync``, when not elastic: live is n throughout)
    while t < horizon:
        back = out[0][0] if out else math.inf
        strike = t + failures.gap(live)
        end = min(strike, back, horizon)
        trained += live * (end - t)
        missing += (n - live) * (end - t)
        if sync > 0:
            since = math.fmod(since + (end - t), sync)
        t = end
        if end == back:  # a slice is repaired (the exponential is memoryless: the next gap is drawn afresh)
            live += heapq.heappop(out)[1]
        elif end == strike:
            count += 1
            trained, lost, since = trained - live * since, lost + live * since, 0.0  # back to the last sync
            if elastic:
                down = min(spec.slice, live)
                live -= down
                heapq.heappush(out, (t + failures.repair(), down))
            until = min(t + stall, horizon)
            while t < until:  # the whole worker waits; slices may come back meanwhile
                step = min(until, out[0][0]) if out else until
                stalled += live * (step - t)
                missing += (n - live) * (step - t)
                t = step
                while out and out[0][0] <= t:
                    live += heapq.heappop(out)[1]
    return count, trained, stalled, missing, lost

def quorum_goodput(speeds: Sequence[float], quorum: int, *, sigma: float = 0.0, rounds: int = 2000,
                   seed: int = 0) -> float:
    """Goodput of workers at ``speeds`` whose every sync waits for ``quorum`` of them.

    Worker i computes a round in (1 / speeds[i]) · exp(σz − σ²/2), z ~ N(0, 1) drawn per worker and
    round (the stragglers' lognormal jitter, mean 1). Round r closes when ``quorum`` workers have
    delivered it; a worker that delivered before the close waits for it, one that delivers after
    starts its next round at once (its late update is merged, stale). Goodput: compute over the
    workers' time. A quorum of 1 never waits; a quorum of all of them waits for the slowest.
    """
    if not speeds or not all(s > 0 for s in speeds):
        raise ValueError(f"quorum_goodput: speeds must be positive numbers, one per worker, got {list(speeds)}")
    m = len(speeds)
    if not 1 <= quorum <= m:
        raise ValueError(f"quorum_goodput: quorum must be in [1, workers = {m}], got {quorum}")
    rng = np.random.default_rng([seed, _QUORUM_STREAM])
    work = np.exp(sigma * rng.standard_normal((rounds, m)) - sigma**2 / 2) / np.asarray(speeds, dtype=float)
    start = np.zeros(m)
    for r in range(rounds):
        arrive = start + work[r]
        start = np.maximum(arrive, np.partition(arrive, quorum - 1)[quorum - 1])
    return float(work.sum() / start.sum())


def scenario_quorum_goodput(scenario: Scenario, workers: int, quorum: int, *, rounds: int = 2000) -> float:
    """``quorum_goodput`` of ``workers`` workers, one rank each, at the speeds of ``scenario``'s ``[[nodes]]`` and
    the lognormal jitter (sigma, seed) of its ``[stragglers]``: the scenario a real run of them would use."""
    r = scenario.resolve(workers)
    if r.jitter not in ("none", "lognormal"):
        raise scenario.key_error("stragglers.jitter", f"the worker model draws lognormal speed noise; got "
                                 f"{r.jitter!r} (use \"lognormal\" or \"none\")")
    return quorum_goodput(r.speed, quorum, sigma=r.sigma, rounds=rounds, seed=r.seed)
