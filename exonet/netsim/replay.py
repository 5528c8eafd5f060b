"""``simulate``: replay a whole trace, or several jobs' traces on one network, in a scenario.

(The incremental engine is exonet.netsim.engine.) Several jobs are laid on global ranks as one
trace, each job's collectives on groups of its own ranks, so they share links as any two groups do.

Besides resolving the scenario for the trace's node count, it checks where the trace's order
came from: an asynchronous run's order was chosen by the online clock in one scenario, for the
traffic as recorded, and replaying it elsewhere keeps that order; that deserves a warning.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from exonet.errors import ScenarioError
from exonet.netsim.engine import Simulation
from exonet.netsim.failures import warn_default_restart
from exonet.netsim.memo import Memo
from exonet.netsim.progress import ReplayBar, wanted
from exonet.netsim.result import SimResult
from exonet.netsim.spread import with_range
from exonet.netsim.store import uses_store, with_store
from exonet.scenario import Resolved, Scenario, ScenarioLike
from exonet.trace import Collective, Compute, Event, Trace


def simulate(trace: Trace | Sequence[Trace], scenario: Resolved | ScenarioLike, *, history: Sequence[Any] | None = None,
             fast_path: bool = True, placement: Sequence[Any] | None = None,
             given_compute: bool = True, progress: bool | None = None, memo: bool = True) -> SimResult:
    """Replay ``trace`` in ``scenario`` and return the simulated outcome.

    Args:
        trace: the run's per-node events; or a list of traces, several jobs sharing one network
            (each on its own ranks; their collectives are different groups and share links max-min).
        scenario: a ``Resolved`` scenario, or anything ``Scenario.coerce`` accepts
            (a Scenario, a preset name, a path to a TOML file, a dict).
        history: per-step mean training losses, for ``SimResult.loss_vs_time``; with several
            traces, one such list (or None) per job.
        fast_path: time lone collectives analytically (exact; off only to cross-check).
        placement: with several traces, the global ranks each job occupies, one entry per job:
            a list of ranks (the job's rank i runs on the i-th), or ``{"hosts": [h, ...]}`` for
            whole hosts of the scenario's ``[hosts]``. Default: consecutive blocks in the order
            given, each job starting on a new host when the scenario has hosts.
        progress: draw a progress bar on stderr for a replay that runs over ``DELAY_S`` (2 s) of wall-clock
            time (exonet.netsim.progress); None (the default) draws one only when stderr is a terminal.
        memo: feed one trace in steps and play back each step that repeats one already replayed (exact;
            exonet.netsim.memo); False replays every step, to cross-check.

    With several traces the result covers the whole network (``wall_clock_s``: when the last job
    ended; ``per_node`` by global rank) and adds ``jobs`` (each job's own SimResult, its ranks as
    in its trace) and ``links`` (what every link carried, per job, and its utilisation).
    """
    bar = ReplayBar() if wanted(progress) else None
    try:  # (the body stays here: the warnings below name simulate's caller, stacklevel=3)
        if isinstance(trace, Trace):
            if placement is not None:
                raise ValueError("simulate: placement= places several jobs; pass a list of traces, or no placement")
            trace = with_store(trace)  # puts and gets as messages to one more rank, the store
            if isinstance(scenario, Resolved):
                resolved, name = scenario, scenario.name
                if trace.meta.get("store") and resolved.store is None:
                    raise ScenarioError("simulate: the trace puts and gets through an object store; pass a Scenario "
                                        "(not a Resolved one) so the store's rank is resolved from [store]")
            else:
                chosen = Scenario.coerce(scenario)
                resolved = chosen.resolve(trace.num_ranks, servers=trace.meta.get("servers", 0),
                                          store=bool(trace.meta.get("store")))
                name = chosen.name
                warn_default_restart(chosen.to_dict().get("failures"))
                given = given_compute and isinstance(trace.meta.get("compute"), dict)
                _warn_if_decided_elsewhere(trace, with_given_compute(chosen) if given else chosen)
            resolved, caution = _given_timing(trace, resolved, name, given_compute)
            if caution is None:
                resolved, caution = _compute_timing(resolved, name, [trace])

            def replay(resolved: Resolved) -> tuple[SimResult, bool]:
                sim = Simulation(resolved, fast_path=fast_path, name=name, rewind=not trace.meta.get("elastic", False))
                if not memo or not Memo.applies(sim):
                    sim.feed_trace(trace)
                    if bar is not None:
                        bar.attach(sim)
                    return sim.result(history), sim.lossy
                steps = Memo(sim, trace)
                if bar is not None:
                    bar.attach(sim, steps.events)
                steps.run()
                return dataclasses.replace(sim.result(history), stats={"memo": steps.stats()}), sim.lossy

            first, lossy = replay(resolved)
            result = _cautioned(with_range(first, resolved, lossy, lambda r: replay(r)[0]), caution)
            pipeline = trace.meta.get("pipeline")
            return dataclasses.replace(result, stages=pipeline["stages"]) if isinstance(pipeline, dict) else result
        return _simulate_jobs(list(trace), scenario, history, fast_path, placement, bar)
    finally:
        if bar is not None:
            bar.close()


def _simulate_jobs(traces: list[Trace], scenario: Resolved | ScenarioLike, history: Sequence[Any] | None,
                   fast_path: bool, placement: Sequence[Any] | None, bar: ReplayBar | None) -> SimResult:
    """Several jobs on one network: their traces laid on global ranks as one trace, replayed once."""
    if not traces or not all(isinstance(t, Trace) for t in traces):
        raise TypeError("simulate: expected a Trace or a non-empty list of Traces")
    if any(uses_store(t) for t in traces):
        raise ValueError("simulate: a job that uses the object store (put/get) replays alone; several jobs sharing "
                         "one network cannot share a store yet")
    if history is not None and len(history) != len(traces):
        raise ValueError(f"simulate: history has {len(history)} entries for {len(traces)} jobs; "
                         "give one list (or None) per job")
    if isinstance(scenario, Resolved):
        chosen, devices = None, scenario.hosts.devices if scenario.hosts else 1
    else:
        chosen = Scenario.coerce(scenario)
        devices = chosen.to_dict().get("hosts", {}).get("devices", 1)
    jobs = _place(traces, placement, devices)
    n = max(r for ranks in jobs for r in ranks) + 1
    n += -n % devices
    if isinstance(scenario, Resolved):
        resolved, name = scenario, scenario.name
        if resolved.num_nodes < n:
            raise ScenarioError(f"simulate: the placement uses {n} ranks "
                                f"but the scenario was resolved for {resolved.num_nodes}")
        n = resolved.num_nodes
    else:
        assert chosen is not None  # coerced above: the scenario is not Resolved
        resolved, name = chosen.resolve(n), chosen.name
        warn_default_restart(chosen.to_dict().get("failures"))
        for t in traces:
            _warn_if_decided_elsewhere(t, chosen)
    resolved, caution = _compute_timing(resolved, name, traces)
    whole = Trace(n)
    for t, ranks in zip(traces, jobs):
        everyone = tuple(sorted(ranks))
        for local, events in enumerate(t.events):
            whole.events[ranks[local]] = [_moved(e, ranks, everyone) for e in events]
    sim = Simulation(resolved, fast_path=fast_path, name=name)
    sim.feed_trace(whole)
    if bar is not None:
        bar.attach(sim)
    result = _cautioned(sim.result(), caution)
    result.jobs = [sim.job_result(ranks, sum(map(len, t.events)), None if history is None else history[j],
                                  t.meta.get("servers", 0)) for j, (t, ranks) in enumerate(zip(traces, jobs))]
    result.links = sim.link_loads(jobs)
    return result


def _place(traces: list[Trace], placement: Sequence[Any] | None, devices: int) -> list[list[int]]:
    """Each job's global ranks, checked: one per node of its trace, no rank in two jobs."""
    if placement is None:
        jobs, start = [], 0
        for t in traces:
            jobs.append(list(range(start, start + t.num_ranks)))
            start += t.num_ranks + -t.num_ranks % devices
        return jobs
    if len(placement) != len(traces):
        raise ValueError(f"simulate: placement has {len(placement)} entries for {len(traces)} traces; give one per job")
    jobs = []
    owner: dict[int, int] = {}  # global rank -> its job
    for j, (t, entry) in enumerate(zip(traces, placement)):
        if isinstance(entry, Mapping):
            hosts = entry.get("hosts", ())  # (a placement with no hosts fails the check before its hosts are read)
            if set(entry) != {"hosts"} or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in hosts):
                raise ValueError(f"simulate: placement[{j}] must be a list of ranks or {{'hosts': [host indices]}}, "
                                 f"got {entry!r}")
            ranks = [h * devices + d for h in hosts for d in range(devices)]
        else:
            ranks = list(entry)
        if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks):
            raise ValueError(f"simulate: placement[{j}] must hold non-negative integer ranks (or hosts), got {entry!r}")
        if len(ranks) != t.num_ranks:
            raise ValueError(f"simulate: placement[{j}] gives {len(ranks)} ranks but trace {j} has {t.num_ranks} ranks")
        for r in ranks:
            if r in owner:
                raise ValueError(f"simulate: placement[{j}] and placement[{owner[r]}] both hold rank {r}; "
                                 "jobs need their own ranks")
            owner[r] = j
        jobs.append(ranks)
    return jobs


def _moved(e: Event, ranks: list[int], everyone: tuple[int, ...]) -> Event:
    """``e`` of a job laid on global ``ranks``: a collective's group renamed (None: the job's ranks)."""
    if type(e) is not Collective:
        return e
    group = everyone if e.group is None else tuple(ranks[r] for r in e.group)
    return dataclasses.replace(e, group=group)


def with_given_compute(scenario: Scenario) -> Scenario:
    """``scenario`` timing compute by the trace's own seconds (``mode = "wall"``): what an estimate was given.

    Its per-node speeds and jitter still apply; the name stays, since the estimate states its compute itself.
    """
    return scenario.replace(compute={"mode": "wall"}, name=scenario.name)


def _given_timing(trace: Trace, resolved: Resolved, name: str, given_compute: bool) -> tuple[Resolved, str | None]:
    """The scenario to replay an estimate's trace in, and a caution naming what timed its compute.

    An estimate records the compute it was given (``meta["compute"]``); a scenario that names a
    device (``compute.mode = "flops"``) would otherwise time those spans at its own TFLOP/s, silently.
    """
    given = trace.meta.get("compute")
    if not isinstance(given, dict) or resolved.compute_mode != "flops":
        return resolved, None  # no device in the scenario: the trace's own seconds time it already
    stated = f"{given.get('step_time_s', 0.0):.4g} s per step"
    if given.get("tflops"):
        stated += f" at {given['tflops']:g} TFLOP/s x MFU {given.get('mfu', 1.0):g}"
    device = f"the device of scenario {name!r} ({resolved.tflops:g} TFLOP/s x MFU {resolved.mfu:g})"
    if given_compute:
        return dataclasses.replace(resolved, compute_mode="wall"), (
            f"compute timed as the estimate gave it ({stated}), not on {device}; "
            "simulate(..., given_compute=False) times it there")
    if not _counts_flops(trace):
        return resolved, None  # given as seconds: _compute_timing says the wall seconds time it
    return resolved, f"compute timed on {device}, not as the estimate gave it ({stated})"


def _compute_timing(resolved: Resolved, name: str, traces: list[Trace]) -> tuple[Resolved, str | None]:
    """The scenario to replay ``traces`` in, and a caution when it had to change.

    Under ``compute.mode = "flops"`` a span lasts its FLOPs ÷ (TFLOP/s × MFU), so a trace whose compute
    carries no FLOPs at all (built by hand with seconds, or ``fit(count_flops=False)``) would replay with
    no compute: such a trace is timed by its wall seconds instead, and the result's cautions say so. Jobs
    of which some count FLOPs and some do not cannot share one clock: that is an error.
    """
    if resolved.compute_mode != "flops":
        return resolved, None
    counted = [_counts_flops(t) for t in traces]
    if None not in counted:
        return resolved, None
    if True in counted:
        raise ScenarioError(f"simulate: job {counted.index(None)}'s compute spans carry no FLOPs while job "
                            f"{counted.index(True)}'s do, and scenario {name!r} times compute from FLOPs "
                            "(compute.mode = 'flops'): give every job's spans FLOPs, or replay in a scenario "
                            "with compute.mode = 'wall'")
    return dataclasses.replace(resolved, compute_mode="wall"), (
        f"compute timed by the trace's wall seconds: scenario {name!r} times compute from FLOPs "
        f"({resolved.tflops:g} TFLOP/s x MFU {resolved.mfu:g}) and this trace's compute spans carry none "
        "(built by hand, or fit(count_flops=False)); give them FLOPs (Trace.add_compute(..., flops=...)) "
        "to time them on the scenario's devices")


def _counts_flops(trace: Trace) -> bool | None:
    """True if some compute span carries FLOPs, None if spans take time but none carries FLOPs, else False."""
    timed = False
    for events in trace.events:
        for e in events:
            if isinstance(e, Compute):
                if e.flops > 0:
                    return True
                timed = timed or e.wall_s > 0
    return None if timed else False


def _cautioned(result: SimResult, caution: str | None) -> SimResult:
    if caution is not None:
        result.cautions = (caution, *result.cautions)
    return result


def _warn_if_decided_elsewhere(trace: Trace, scenario: Scenario) -> None:
    """An asynchronous run's order (arrivals, who made a deadline) was chosen by the online clock in
    the scenario it ran in (``meta["decided_in"]``), for the trace as recorded; replayed in another
    scenario, or scaled (``Trace.scaled``), that order stays. (A ``Resolved`` scenario is exonet's
    own, made for this trace: it is not checked.)"""
    decided = trace.meta.get("decided_in")
    if not isinstance(decided, dict):
        return
    scaled = "scaled" in trace.meta
    if scaled or decided.get("fingerprint") != scenario.fingerprint:
        where = f"scenario {decided.get('scenario')!r}" + (" before the trace was scaled" if scaled else "")
        warnings.warn(f"simulate: this trace is of an asynchronous run whose order (arrivals at the server, who made "
                      f"each deadline) the online clock chose in {where}; replayed in {scenario.name!r} it keeps "
                      f"that order, so the times are that order's on this network, not what the run would have done "
                      f"here (fit it with scenario={scenario.name!r} for that)", stacklevel=3)
