"""Clusters of hosts: a 1B model on 8 hosts of 8 GPUs across two regions, for five strategies.

    python examples/clusters_of_hosts.py [--steps 100] [--params 1e9]

Each strategy is estimated (its own step logic on meta tensors, bf16, 1 s of compute per
step) and replayed in the ``cross-region`` preset twice: as 64 flat nodes, and with
``--hosts 8`` (NVLink-class fabric inside each host; NCCL's rings through every device's NIC), the same as
``exonet estimate --model-params 1e9 --strategy S --nodes 64 --hosts 8 --scenario cross-region
--steps 100 --step-time 1 --dtype bf16``. A strategy ``estimate`` cannot handle yet gets its
error in the table instead of figures.
"""

from __future__ import annotations

import argparse

from exonet.estimate import estimate, simulate_estimate, with_hosts
from exonet.scenario.units import format_bytes, format_time

STRATEGIES = ["ddp", "diloco:H=50", "streaming_diloco:H=50", "async_diloco:H=50", "demo"]
NODES, DEVICES, SCENARIO = 64, 8, "cross-region"


def row(strategy: str, steps: int, params: float) -> list[str]:
    """One strategy's cells: wall-clock and utilisation flat and in hosts, and bytes per node."""
    try:
        est = estimate(strategy, params=params, num_nodes=NODES, max_steps=steps, step_time=1.0, dtype="bf16",
                       scenario=SCENARIO)  # asynchronous strategies run the online clock in it
        flat = simulate_estimate(est, SCENARIO)
        hosted = simulate_estimate(est, with_hosts(SCENARIO, DEVICES, NODES))
    except Exception as exc:  # noqa: BLE001 - the table reports what estimate cannot do yet
        reason = str(exc).splitlines()[0][:90] or type(exc).__name__
        return [strategy, f"not yet: {reason}", "", "", "", ""]
    return [strategy, format_time(flat.wall_clock_s), f"{flat.utilization:.1%}", format_time(hosted.wall_clock_s),
            f"{hosted.utilization:.1%}", format_bytes(est.trace.payload_bytes(0))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--params", type=float, default=1e9)
    args = parser.parse_args()
    header = ["strategy", "64 flat nodes", "utilisation", f"8 hosts x {DEVICES}", "utilisation", "payload per node"]
    print(f"{args.params:g} parameters (bf16), {args.steps} steps of 1 s, {NODES} GPUs, {SCENARIO}")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for strategy in STRATEGIES:
        print("| " + " | ".join(row(strategy, args.steps, args.params)) + " |", flush=True)


if __name__ == "__main__":
    main()
