"""Benchmark the network simulator: replay a large DDP trace and report events per second.

``python -m exonet.bench netsim [--steps N] [--nodes K] [--mbytes M] [--buckets B] [--identical] [--event-path]``
``python -m exonet.bench netsim --overlap [--parity] [--no-jitter] [--steps N] [--nodes K] [--reference-steps R]``
``[--fit]``

The trace: every step, every rank computes for about 0.25 s (a fixed per-rank
offset of up to ±2 %), issues one all_reduce of M MB, and marks the step end; with
``--buckets B`` the all-reduce is B async buckets launched through the backward (overlapped
DDP), which queue on the world group. The scenario: two regions of K/2 ranks, 10 Gbit/s
NICs, 100 µs latency within a region, a 10 Gbit/s 40 ms link between them, ring
algorithms, lognormal jitter σ = 0.05. ``--identical`` drops the offsets and the jitter,
as an ``estimate`` trace: the engine then replays one rank for all. Building the trace
is timed apart from the replay.

``--overlap`` is the trace where collectives overlap, so flows share links: every step,
every rank issues two async all-reduces of M MB at once, one on all ranks and one on its
own region's ranks (hierarchical data parallelism), then waits for both; with ``--parity``
the second is on the ranks of its own parity (even or odd), so both cross the shared link. It is replayed
with the memo (exonet.netsim.memo: a step that repeats one replayed is played back) and without, whole,
with the hit rate and whether the two agree; ``--no-jitter`` drops the compute jitter, so steps repeat.
Then, on the first R steps, as the engine runs it and on the event path alone
(``fast_path=False``: every collective flow by flow, no analytic phases), side by side.
``--fit`` replays it at several node counts and step counts and fits the growth exponents
of the replay time (time ∝ n^a at fixed steps, ∝ steps^b at fixed n).

``--range`` times the predicted range (issue 30): the DDP trace (default 1,000 steps × 64 nodes) in the
two-region scenario with 1 Gbit/s NICs, a 1 ms queue per NIC direction and 16 TCP streams, so its phases lose packets;
one replay (``Simulation`` alone) against ``simulate``, which adds the p10 and p90 replays. Target: the
range adds at most 2× to the replay's time.

``--estimate`` is the 1,024-device hierarchical estimate (issue 21): ``exonet estimate`` of a
1B-parameter bf16 model on ``--hosts`` hosts of ``--devices`` GPUs (default 128 × 8) in the
cross-region preset, ``--strategy`` (default DDP; DiLoCo runs every rank while ``estimate``
counts its world-group declaration as subgroups) for ``--steps`` steps (default 100), built and
replayed, with its time (wall and CPU) and the process's peak resident memory (target: ≤ 30 s,
≤ 2 GiB).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from exonet.netsim import simulate
from exonet.netsim.engine import Simulation
from exonet.scenario import LinkSpec, Resolved
from exonet.trace import Collective, Compute, Step, Trace, Wait


def ddp_trace(steps: int, nodes: int, nbytes: int, seed: int = 0, buckets: int = 1, identical: bool = False) -> Trace:
    """A DDP-shaped trace built directly from events (the builder's checks would dominate at this size).

    With ``buckets`` > 1 it is overlapped DDP: forward (a third of the step), then the backward
    in ``buckets`` equal spans, each followed by an async all-reduce of ``nbytes / buckets``,
    then a wait for each bucket in order. ``identical`` gives every rank the same events (as
    ``estimate`` does), which the engine replays once for all.
    """
    rng = np.random.default_rng(seed)
    per_rank = 0.25 * (1.0 + 0.02 * (np.zeros(nodes) if identical else rng.uniform(-1.0, 1.0, nodes)))
    step = Step()
    events: list[list] = []
    for r in range(nodes):
        if identical and events:
            events.append(events[0])  # the same list: the engine sees at once that every rank replays alike
            continue
        if buckets == 1:
            span = Compute(float(per_rank[r]), float(per_rank[r]))
            row: list = []
            for k in range(steps):
                row += (span, Collective(k, "all_reduce", nbytes), step)
        else:
            forward = Compute(float(per_rank[r]) / 3, float(per_rank[r]) / 3)
            backward = Compute(float(per_rank[r]) * 2 / 3 / buckets, float(per_rank[r]) * 2 / 3 / buckets)
            size = nbytes // buckets
            row = []
            for k in range(steps):
                ids = range(k * buckets, (k + 1) * buckets)
                row.append(forward)
                for cid in ids:
                    row += (backward, Collective(cid, "all_reduce", size, None, True))
                row += [Wait(cid) for cid in ids]
                row.append(step)
        events.append(row)
    return Trace(nodes, {"bench": "netsim"}, events)


def overlap_trace(steps: int, nodes: int, nbytes: int, seed: int = 0, parity: bool = False) -> Trace:
    """Every step: compute, then async all-reduces on all ranks and on the rank's region (its half), then both waits.

    With ``parity`` the second all-reduce is on the ranks of the rank's parity instead (even or odd ranks).

    Ranks of one region share their event objects (nothing changes an event once built), so a 10,000-step
    trace stays small.
    """
    rng = np.random.default_rng(seed)
    per_rank = 0.25 * (1.0 + 0.02 * rng.uniform(-1.0, 1.0, nodes))
    half = nodes // 2
    step = Step()
    tails = []
    groups = ((tuple(range(0, nodes, 2)), tuple(range(1, nodes, 2))) if parity
              else (tuple(range(half)), tuple(range(half, nodes))))
    for region in groups:
        tail: list = []
        for k in range(steps):
            tail.append((Collective(2 * k, "all_reduce", nbytes, None, True),
                         Collective(2 * k + 1, "all_reduce", nbytes, region, True),
                         Wait(2 * k), Wait(2 * k + 1), step))
        tails.append(tail)
    events = []
    for r in range(nodes):
        span = Compute(float(per_rank[r]), float(per_rank[r]))
        row: list = []
        for rest in tails[r % 2 if parity else r >= half]:
            row.append(span)
            row += rest
        events.append(row)
    return Trace(nodes, {"bench": "netsim-overlap"}, events)


def replay_seconds(steps: int, nodes: int, nbytes: int, fast_path: bool = True, parity: bool = False,
                   jitter: bool = True, memo: bool = True) -> float:
    """CPU seconds to replay the overlapped trace (building it not included).

    The replay is single-threaded, so on an idle machine this is its wall time, and on a
    busy one it is still the replay's own cost (so the fits are not bent by the load).
    """
    trace = overlap_trace(steps, nodes, nbytes, parity=parity)
    t0 = time.process_time()
    simulate(trace, two_regions(nodes, jitter=jitter), fast_path=fast_path, memo=memo)
    return time.process_time() - t0


def exponent(xs: list[int], ys: list[float]) -> float:
    """The least-squares slope of log y against log x: y grows as x to this power."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def overlap(args: argparse.Namespace) -> int:
    nbytes = int(args.mbytes * 1e6)
    t0 = time.perf_counter()
    trace = overlap_trace(args.steps, args.nodes, nbytes, parity=args.parity)
    built = time.perf_counter() - t0
    scenario = two_regions(args.nodes, jitter=not args.no_jitter)
    print(f"trace: {args.steps} steps x {args.nodes} nodes, per step two concurrent async all_reduces "
          f"of {args.mbytes:g} MB (all ranks, and the rank's {'parity' if args.parity else 'region'} "
          f"of {args.nodes // 2}), built in {built:.2f} s; compute {'without' if args.no_jitter else 'with'} jitter")
    runs = {}
    for memo in (True, False):
        t0, c0 = time.perf_counter(), time.process_time()
        runs[memo] = simulate(trace, scenario, memo=memo)
        replay, cpu = time.perf_counter() - t0, time.process_time() - c0
        stats = runs[memo].stats.get("memo", {})
        how = (f"with the memo ({stats.get('played_back', 0)} of {args.steps} steps played back, hit rate "
               f"{stats.get('hit_rate', 0.0):.1%})" if memo else "every step replayed (memo=False)")
        print(f"replay, {how}: {runs[memo].events} events in {replay:.2f} s ({cpu:.2f} s CPU) "
              f"= {replay / args.steps * 1e3:.3f} ms per step")
    result, full = runs[True], runs[False]
    same = (result.wall_clock_s, result.step_end_times, result.per_node, result.collectives) == (
        full.wall_clock_s, full.step_end_times, full.per_node, full.collectives)
    print(f"the same ticks, per-node times and spans both ways: {'yes' if same else 'NO'}")
    print(f"simulated wall-clock {result.wall_clock_s:.1f} s, "
          f"step {result.wall_clock_s / max(1, result.num_steps):.4f} s, "
          f"utilization {result.utilization:.1%}")
    r = min(args.reference_steps, args.steps)
    if r > 0:
        here = replay_seconds(r, args.nodes, nbytes, parity=args.parity)
        alone = replay_seconds(r, args.nodes, nbytes, fast_path=False, parity=args.parity)
        print(f"side by side on the first {r} steps (CPU): {here / r * 1e3:.3f} ms per step as run, "
              f"{alone / r * 1e3:.3f} ms on the event path alone (fast_path=False): {alone / here:.1f}x")
    if args.fit:
        fit(args, nbytes)
    return 0


def fit(args: argparse.Namespace, nbytes: int) -> None:
    """How the replay's CPU time grows in nodes (16 up to ``--fit-nodes``) and in steps, with the memo and without."""
    fit_steps, most = max(5, args.steps // 50), max(40, args.steps // 4)
    nodes = [n for n in (16, 32, 64, 128, 256, 512, 1024) if n <= args.fit_nodes]
    counts = [most // 8, most // 4, most // 2, most]
    kind = dict(parity=args.parity, jitter=not args.no_jitter)
    for memo in (True, False):
        how = "with the memo" if memo else "every step replayed"
        by_n = [replay_seconds(fit_steps, n, nbytes, memo=memo, **kind) for n in nodes]
        by_steps = [replay_seconds(k, args.nodes, nbytes, memo=memo, **kind) for k in counts]
        print(f"fit (CPU, {how}), {fit_steps} steps: " + ", ".join(f"n={n} {t:.2f} s" for n, t in zip(nodes, by_n))
              + f" -> time grows as n^{exponent(nodes, by_n):.2f}")
        print(f"fit (CPU, {how}), {args.nodes} nodes: "
              + ", ".join(f"{k} steps {t:.2f} s" for k, t in zip(counts, by_steps))
              + f" -> time grows as steps^{exponent(counts, by_steps):.2f}")


def estimate_case(hosts: int = 128, devices: int = 8, strategy: str = "ddp", steps: int = 100,
                  params: float = 1e9) -> dict:
    """The hierarchical estimate at ``hosts`` × ``devices``: its figures (seconds, peak memory) and its answer."""
    import resource

    from exonet.estimate import estimate, simulate_estimate, with_hosts

    nodes = hosts * devices
    t0, c0 = time.perf_counter(), time.process_time()
    est = estimate(strategy, params=params, num_nodes=nodes, max_steps=steps, step_time=1.0, dtype="bf16")
    built = time.perf_counter() - t0
    sim = simulate_estimate(est.trace, with_hosts("cross-region", devices, nodes))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"nodes": nodes, "strategy": strategy, "steps": steps, "seconds": seconds, "cpu_seconds": cpu,
            "build_seconds": built, "replay_seconds": seconds - built, "peak_bytes": peak,
            "wall_clock_s": sim.wall_clock_s, "utilization": sim.utilization}


def estimate_report(args: argparse.Namespace) -> dict:
    figures = estimate_case(args.hosts, args.devices, args.strategy, args.steps)
    print(f"estimate: {figures['strategy']}, 1B bf16, {args.hosts} hosts x {args.devices} = {figures['nodes']} "
          "devices, "
          f"cross-region, {figures['steps']} steps")
    print(f"took {figures['seconds']:.2f} s, {figures['cpu_seconds']:.2f} s CPU "
          f"(trace {figures['build_seconds']:.2f} s, "
          f"replay {figures['replay_seconds']:.2f} s), "
          f"peak memory {figures['peak_bytes'] / 2**30:.2f} GiB (process RSS)")
    print(f"simulated wall-clock {figures['wall_clock_s']:.1f} s, utilization {figures['utilization']:.1%}")
    return figures


def two_regions(nodes: int, jitter: bool = True) -> Resolved:
    nic = 10e9 / 8
    half = nodes // 2
    return Resolved(
        num_nodes=nodes,
        uplink=(nic,) * nodes,
        downlink=(nic,) * nodes,
        region=("us",) * half + ("eu",) * (nodes - half),
        latency=100e-6,
        links={("eu", "us"): LinkSpec(10e9 / 8, 40e-3)},
        algorithms={"all_reduce": "ring"},
        jitter="lognormal" if jitter else "none",
        sigma=0.05,
        seed=0,
    )


def range_report(args: argparse.Namespace) -> int:
    """CPU seconds of one lossy replay, and of ``simulate`` with its range (two more replays)."""
    trace = ddp_trace(args.steps, args.nodes, int(args.mbytes * 1e6))
    nic = (1e9 / 8,) * args.nodes  # 1 Gbit/s NICs, so their queues, not the shared link, bound the ring
    lossy = dataclasses.replace(two_regions(args.nodes), uplink=nic, downlink=nic, queue=(1e-3, "s"), streams=16,
                                tcp_window=4 * 2**20)
    t0 = time.process_time()
    sim = Simulation(lossy)
    sim.feed_trace(trace)
    single = sim.result()
    one = time.process_time() - t0
    t0 = time.process_time()
    ranged = simulate(trace, lossy)
    both = time.process_time() - t0
    low, high = ranged.wall_clock_range
    print(f"trace: {args.steps} steps x {args.nodes} nodes, all_reduce {args.mbytes:g} MB/step, lossy: {sim.lossy}")
    print(f"one replay {one:.2f} s CPU (wall-clock {single.wall_clock_s:.1f} s); with the range {both:.2f} s CPU "
          f"(p10 {low:.1f} s, p90 {high:.1f} s): the range adds {both / one - 1:.2f}x")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m exonet.bench netsim", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--mbytes", type=float, default=100.0)
    parser.add_argument("--buckets", type=int, default=1,
                        help="overlapped DDP: async all-reduces per step (default 1, blocking)")
    parser.add_argument("--identical", action="store_true",
                        help="every rank the same events and no jitter, as an estimate (replayed once for all ranks)")
    parser.add_argument("--event-path", action="store_true", help="disable the fast path (every flow as events)")
    parser.add_argument("--overlap", action="store_true",
                        help="two concurrent async all-reduces per step, on all ranks and on each region "
                             "(flows share links)")
    parser.add_argument("--parity", action="store_true",
                        help="with --overlap: the second all-reduce on even/odd ranks (both cross the shared link)")
    parser.add_argument("--no-jitter", action="store_true",
                        help="with --overlap: compute without jitter (the per-rank offsets stay): steps repeat")
    parser.add_argument("--reference-steps", type=int, default=100,
                        help="with --overlap: steps replayed side by side on the event path alone "
                             "(default 100; 0 skips)")
    parser.add_argument("--fit", action="store_true",
                        help="with --overlap: fit the growth exponents in nodes and in steps, with the memo and "
                             "without")
    parser.add_argument("--fit-nodes", type=int, default=1024, help="with --fit: the most nodes fitted (default 1024)")
    parser.add_argument("--estimate", action="store_true",
                        help="the hierarchical estimate: 1B bf16 on --hosts x --devices, cross-region, --steps steps")
    parser.add_argument("--hosts", type=int, default=128, help="with --estimate: hosts (default 128)")
    parser.add_argument("--devices", type=int, default=8, help="with --estimate: devices per host (default 8)")
    parser.add_argument("--strategy", default="ddp", help="with --estimate: the strategy (default ddp)")
    parser.add_argument("--range", action="store_true",
                        help="time the predicted range on a lossy scenario (default 1,000 steps)")
    argv = list(argv)
    if "--range" in argv and "--steps" not in argv:
        argv += ["--steps", "1000"]
    if "--estimate" in argv and "--steps" not in argv:
        argv += ["--steps", "100"]
    args = parser.parse_args(argv)
    if args.overlap:
        return overlap(args)
    if args.estimate:
        estimate_report(args)
        return 0
    if args.range:
        return range_report(args)
    t0 = time.perf_counter()
    trace = ddp_trace(args.steps, args.nodes, int(args.mbytes * 1e6), buckets=args.buckets, identical=args.identical)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = simulate(trace, two_regions(args.nodes, jitter=not args.identical), fast_path=not args.event_path)
    replay = time.perf_counter() - t0
    print(f"trace: {args.steps} steps x {args.nodes} nodes, all_reduce {args.mbytes:g} MB/step in {args.buckets} "
          f"bucket(s), built in {built:.2f} s")
    print(f"replay: {result.events} events in {replay:.2f} s = {result.events / replay:,.0f} events/s")
    print(f"simulated wall-clock {result.wall_clock_s:.1f} s, "
          f"step {result.wall_clock_s / max(1, result.num_steps):.4f} s, "
          f"utilization {result.utilization:.1%}, wire {result.wire_bytes[0] / 1e9:.1f} GB per node")
    return 0
