"""Benchmark the network simulator: replay a large DDP trace and report events per second.

``python -m exonet.bench netsim [--steps N] [--nodes K] [--mbytes M] [--event-path]``

The trace: every step, every rank computes for about 0.25 s (a fixed per-rank
offset of up to ±2 %), issues one all_reduce of M MB, and marks the step end. The
scenario: two regions of K/2 ranks, 10 Gbit/s NICs, 100 µs latency within a
region, a 10 Gbit/s 40 ms link between them, ring algorithms, lognormal jitter
σ = 0.05. Building the trace is timed apart from the replay.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from exonet.netsim import simulate
from exonet.scenario import LinkSpec, Resolved
from exonet.trace import Collective, Compute, Step, Trace


def ddp_trace(steps: int, nodes: int, nbytes: int, seed: int = 0) -> Trace:
    """A DDP-shaped trace built directly from events (the builder's checks would dominate at this size)."""
    rng = np.random.default_rng(seed)
    per_rank = 0.25 * (1.0 + 0.02 * rng.uniform(-1.0, 1.0, nodes))
    step = Step()
    events = []
    for r in range(nodes):
        span = Compute(float(per_rank[r]), float(per_rank[r]))
        row: list = []
        for k in range(steps):
            row += (span, Collective(k, "all_reduce", nbytes), step)
        events.append(row)
    return Trace(nodes, {"bench": "netsim"}, events)


def two_regions(nodes: int) -> Resolved:
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
        jitter="lognormal",
        sigma=0.05,
        seed=0,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m exonet.bench netsim", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--mbytes", type=float, default=100.0)
    parser.add_argument("--event-path", action="store_true", help="disable the fast path (every flow as events)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    trace = ddp_trace(args.steps, args.nodes, int(args.mbytes * 1e6))
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = simulate(trace, two_regions(args.nodes), fast_path=not args.event_path)
    replay = time.perf_counter() - t0
    print(f"trace: {args.steps} steps x {args.nodes} nodes, all_reduce {args.mbytes:g} MB/step, built in {built:.2f} s")
    print(f"replay: {result.events} events in {replay:.2f} s = {result.events / replay:,.0f} events/s")
    print(f"simulated wall-clock {result.wall_clock_s:.1f} s, step {result.wall_clock_s / max(1, result.num_steps):.4f} s, "
          f"utilization {result.utilization:.1%}, wire {result.wire_bytes[0] / 1e9:.1f} GB per node")
    return 0
