"""Failures at scale: goodput of 1,024 devices trained as one elastic data-parallel job or as decoupled workers.

The question of Decoupled DiLoCo (arXiv 2604.21428): when chips fail at a rate, how much of the
machine's time still trains the model? Here 1,024 devices are grouped into units that fail as
one (a unit stops when any of its devices fails, so its MTBF is the device MTBF over its devices),
and each unit is one exonet node:

* DDP, blocking (SPMD): 16 data-parallel replicas of 64 devices each; every step waits for a
  failed replica to be repaired, restarted and to redo its step;
* elastic DDP: the same 16 replicas; the replicas that stayed up average each step and go on, a
  failed one sits out until it is back and then receives the state (torchft's quorum);
* elastic DiLoCo with M workers (M = 8, 16) of 1,024 / M devices, H inner steps per round: the
  workers that stayed up average each round, a failed one loses its round and rejoins later;
* asynchronous DiLoCo with M workers: a synchronizer applies each worker's update as it comes,
  and a down worker simply stops sending (the nearest of exonet's strategies to Decoupled
  DiLoCo's workers). The synchronizer does not fail (``[failures] servers = false``) unless
  ``--servers-fail``.

Every membership change makes a new process group, whose first collective pays ``--reform``
seconds (``network.setup``: the quorum's re-formation, communicator creation), for every strategy alike.
Everything is ``exonet estimate``: a 1B-parameter bf16 model, ``--step-time`` seconds of compute
per step on every unit, 400 Gbit/s per unit, the failure draws fixed by the seed.

    python examples/failures_at_scale.py [--device-mtbf 500] [--steps 240] [--step-time 60]
"""

from __future__ import annotations

import argparse
import time

from exonet import Scenario
from exonet.estimate import estimate, simulate_estimate

DEVICES, REPLICAS = 1024, 16


def scenario(units: int, device_mtbf_h: float, repair_min: float, restart_min: float, reform_s: float,
             seed: int, servers_fail: bool) -> Scenario:
    """``units`` nodes of DEVICES / units devices each; a unit fails at the summed rate of its devices."""
    per_unit = device_mtbf_h / (DEVICES // units)
    return Scenario.from_dict({
        "name": f"{units}-units", "network": {"bandwidth": "400 Gbit/s", "latency": "10 us", "setup": f"{reform_s} s"},
        "failures": {"mtbf": f"{per_unit} h", "repair": f"{repair_min} min", "restart": f"{restart_min} min",
                     "seed": seed, "servers": servers_fail},
    })


def cases(H: int) -> list[tuple[str, str, int]]:
    """(label, strategy spec, units)."""
    return [
        (f"DDP (blocking), {REPLICAS} replicas", "ddp", REPLICAS),
        (f"elastic DDP, {REPLICAS} replicas", "ddp:elastic=True", REPLICAS),
        *((f"elastic DiLoCo, {m} workers", f"diloco:H={H},elastic=True", m) for m in (8, 16)),
        *((f"async DiLoCo, {m} workers", f"async_diloco:H={H}", m) for m in (8, 16)),
    ]


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device-mtbf", type=float, default=500.0, help="hours between failures of one device")
    p.add_argument("--repair", type=float, default=10.0, help="minutes a failed unit is down")
    p.add_argument("--restart", type=float, default=2.0, help="minutes to rejoin after the repair")
    p.add_argument("--reform", type=float, default=30.0, help="seconds a new process group's first collective waits")
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--step-time", type=float, default=60.0, help="compute seconds per step")
    p.add_argument("-H", type=int, default=30, help="DiLoCo inner steps per round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--servers-fail", action="store_true",
                   help="the async synchronizer fails like a unit too (default: it does not, as in Decoupled DiLoCo)")
    args = p.parse_args(argv)
    rows = []
    print(f"{DEVICES} devices, device MTBF {args.device_mtbf:g} h (one failure every "
          f"{args.device_mtbf / DEVICES * 60:.1f} min somewhere), repair {args.repair:g} min + restart "
          f"{args.restart:g} min, re-formation {args.reform:g} s; {args.steps} steps of {args.step_time:g} s")
    print("| strategy | units of devices | failures | goodput | wall-clock | lost: work | down | waiting |")
    print("|---|---|---|---|---|---|---|---|")
    for label, spec, units in cases(args.H):
        t0 = time.perf_counter()
        failing = scenario(units, args.device_mtbf, args.repair, args.restart, args.reform, args.seed,
                           args.servers_fail)
        est = estimate(spec, params=1e9, layers=2, num_nodes=units, max_steps=args.steps, step_time=args.step_time,
                       dtype="bf16", scenario=failing)
        res = simulate_estimate(est, failing)
        lost = res.lost
        rows.append({"strategy": label, "units": units, "nodes": res.trainers, "failures": res.failures,
                     "goodput": res.goodput,
                     "wall_clock_s": res.wall_clock_s, "lost": lost, "seconds": time.perf_counter() - t0})
        machine = res.trainers * res.wall_clock_s  # the trainers' time: a server waits by design
        print(f"| {label} | {units} × {DEVICES // units} | {res.failures} | {res.goodput:.1%} | "
              f"{res.wall_clock_s / 3600:.2f} h | {lost['lost_work'] / machine:.1%} | {lost['down'] / machine:.1%} | "
              f"{lost['waiting'] / machine:.1%} |")
    return rows


if __name__ == "__main__":
    main()
