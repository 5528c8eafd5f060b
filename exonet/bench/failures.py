"""Failures at scale in the replay: a DDP trace under mtbf 50 h and repair 2 h, where waits draw many failures.

    python -m exonet.bench failures [--nodes 256] [--steps 100] [--step-time 60] [--mtbf "50 h"] [--repair "2 h"]

Each of ``--nodes`` ranks computes ``--step-time`` seconds, then a 1 MB all-reduce, ``--steps`` times, on a
1 Gbit/s network. A blocking all-reduce waits until all ranks are up at once: at 256 nodes a rank is up
50/52 of the time and all of them (50/52)^256 = 4·10^-5 of it, so every wait draws about 2·10^4 failures
(exonet.netsim.failures.all_up_wait). The replay's cost is linear in the failures drawn now (outages are
indexed per rank); it was quadratic, past 120 s. Target: 10 s for the default.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

TARGET_S = 10.0


def replay(nodes: int, steps: int, step_time: float, mtbf: str, repair: str) -> dict[str, Any]:
    """Build the trace, replay it once, and return the figures."""
    from exonet import Scenario, Trace, simulate

    trace = Trace(num_nodes=nodes)
    for _ in range(steps):
        for r in range(nodes):
            trace.add_compute(r, step_time)
            trace.add_collective(r, "all_reduce", 1_000_000)
            trace.add_step(r)
    scenario = Scenario.from_dict({"name": "failing", "network": {"bandwidth": "1 Gbit/s", "latency": "1 ms"},
                                   "failures": {"mtbf": mtbf, "repair": repair, "restart": "0 s"}})
    start = time.perf_counter()
    res = simulate(trace, scenario)
    seconds = time.perf_counter() - start
    return {"nodes": nodes, "steps": steps, "seconds": seconds, "failures": res.failures,
            "wall_clock_h": res.wall_clock_s / 3600, "goodput": res.goodput, "ok": seconds <= TARGET_S}


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m exonet.bench failures", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-time", type=float, default=60.0, help="compute seconds per step (default 60)")
    parser.add_argument("--mtbf", default="50 h")
    parser.add_argument("--repair", default="2 h")
    args = parser.parse_args(argv)
    figures = replay(args.nodes, args.steps, args.step_time, args.mtbf, args.repair)
    print(f"replay: {figures['nodes']} nodes x {figures['steps']} steps, mtbf {args.mtbf}, repair {args.repair}: "
          f"{figures['failures']:,} failures in {figures['seconds']:.2f} s (target {TARGET_S:g} s); simulated "
          f"{figures['wall_clock_h']:.4g} h, goodput {figures['goodput']:.2%}")
    return figures
