"""Benchmark the network simulator: replay a large DDP trace and report events per second.

``python -m exonet.bench netsim [--steps N] [--nodes K] [--mbytes M] [--buckets B] [--identical] [--event-path]``

The trace: every step, every rank computes for about 0.25 s (a fixed per-rank
offset of up to ±2 %), issues one all_reduce of M MB, and marks the step end; with
``--buckets B`` the all-reduce is B async buckets launched through the backward (overlapped
DDP), which queue on the world group. The scenario: two regions of K/2 ranks, 10 Gbit/s
NICs, 100 µs latency within a region, a 10 Gbit/s 40 ms link between them, ring
algorithms, lognormal jitter σ = 0.05. ``--identical`` drops the offsets and the jitter,
as an ``estimate`` trace: the engine then replays one rank for all. Building the trace
is timed apart from the replay.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from exonet.netsim import simulate
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
    events = []
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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m exonet.bench netsim", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--mbytes", type=float, default=100.0)
    parser.add_argument("--buckets", type=int, default=1, help="overlapped DDP: async all-reduces per step (default 1, blocking)")
    parser.add_argument("--identical", action="store_true",
                        help="every rank the same events and no jitter, as an estimate (replayed once for all ranks)")
    parser.add_argument("--event-path", action="store_true", help="disable the fast path (every flow as events)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    trace = ddp_trace(args.steps, args.nodes, int(args.mbytes * 1e6), buckets=args.buckets, identical=args.identical)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = simulate(trace, two_regions(args.nodes, jitter=not args.identical), fast_path=not args.event_path)
    replay = time.perf_counter() - t0
    print(f"trace: {args.steps} steps x {args.nodes} nodes, all_reduce {args.mbytes:g} MB/step in {args.buckets} "
          f"bucket(s), built in {built:.2f} s")
    print(f"replay: {result.events} events in {replay:.2f} s = {result.events / replay:,.0f} events/s")
    print(f"simulated wall-clock {result.wall_clock_s:.1f} s, step {result.wall_clock_s / max(1, result.num_steps):.4f} s, "
          f"utilization {result.utilization:.1%}, wire {result.wire_bytes[0] / 1e9:.1f} GB per node")
    return 0
