"""Convergence study: every built-in strategy on scikit-learn's digits, K nodes, one table.

Each strategy trains the same MLP from the same initial weights with the same per-node
batch, so the table shows what each one trades: how low the node-averaged model's
validation loss gets, how far the nodes drift apart (rank 0's own model and the mean L2
distance to the average), how many bytes each node sends, and what that costs in
simulated wall-clock on a fast and a slow network, for the whole run and until the
averaged model first reaches a target loss (one training run, replayed by ``compare`` in
each scenario).

Settings are the papers' defaults scaled to a 26k-parameter model and a few hundred
steps, with one exception: the outer Nesterov momentum of DiLoCo and SPARTA+DiLoCo is
0.5 instead of 0.9. With 0.9 (tuned for H = 500 on language models) the outer step
overshoots on this small problem and the validation loss climbs back up after ~100 steps.
Evaluations come every H = 25 steps, right after the DiLoCo-family syncs.

    python examples/compare_strategies.py [--steps 400] [--nodes 4] [--target-loss 0.25]
                                          [--scenarios datacenter home-broadband] [--out compare_strategies.png]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from exonet import FitResult, LocalTrainer, Scenario, compare
from exonet.strategies import (
    DDPStrategy,
    DeMoStrategy,
    DiLoCoStrategy,
    FedAvgStrategy,
    OptimSpec,
    SPARTADiLoCoStrategy,
    SPARTAStrategy,
    Strategy,
    StreamingDiLoCoStrategy,
)
from exonet.study.comparison import Comparison
from exonet.toy import digits, digits_mlp
from exonet.units import format_bytes, format_time

H = 25  # inner steps per round of the DiLoCo family, and the evaluation interval


def strategies() -> dict[str, Strategy]:
    """The seven strategies, each with settings under which it learns digits in a few hundred steps."""
    inner = OptimSpec("adamw", lr=1e-3)
    outer = OptimSpec("sgd", lr=0.7, momentum=0.5, nesterov=True)
    return {
        "DDP": DDPStrategy(inner),
        "FedAvg H=5": FedAvgStrategy(inner, H=5),
        f"DiLoCo H={H}": DiLoCoStrategy(inner, outer_optim_spec=outer, H=H),
        "SPARTA p=0.005": SPARTAStrategy(inner, p_sparta=0.005),
        "DeMo top-32/64²": DeMoStrategy(OptimSpec("sgd", lr=1e-3), compression_topk=32, compression_chunk=64),
        f"SPARTA+DiLoCo H={H}": SPARTADiLoCoStrategy(inner, outer_optim_spec=outer, p_sparta=0.005, H=H),
        "Streaming DiLoCo 4-bit": StreamingDiLoCoStrategy(inner, H=H, num_fragments=3, delay_steps=1,
                                                          quantize_bits=4),
    }


def initial_val_loss(val: TensorDataset) -> float:
    """The untrained model's validation loss, so the table shows how far each strategy got from it."""
    with torch.no_grad():
        return float(digits_mlp()(val.tensors))


def table(results: dict[str, FitResult], comparison: Comparison, scenarios: list[str], steps: int) -> str:
    """One markdown row per strategy: losses, drift, payload per node, simulated time per scenario.

    A scenario's cell reads "total / to target": the whole run's simulated wall-clock, then
    when the averaged model first reached the target loss.
    """
    rows = {(row["run"], row["scenario"]): row for row in comparison.rows}
    header = ["strategy", "val loss", "rank-0 local loss", "drift", "payload/node", "payload/node/step",
              *(f"{s}: total / to {comparison.target_loss}" for s in scenarios)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, run in results.items():
        first = rows[(name, scenarios[0])]
        payload = first["payload_bytes_per_node"]
        cells = [name, f"{first['final_loss']:.4f}", f"{run.history['eval'][-1]['local_loss']:.4f}",
                 f"{first['drift']:.3g}", format_bytes(payload), format_bytes(payload / steps)]
        for scen in scenarios:
            row = rows[(name, scen)]
            reached = row["time_to_target_s"]
            cells.append(f"{format_time(row['wall_clock_s'])} / {'—' if reached is None else format_time(reached)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps per node")
    parser.add_argument("--nodes", type=int, default=4, help="K, the number of node processes")
    parser.add_argument("--scenarios", nargs="+", default=["datacenter", "home-broadband"],
                        help="preset names or TOML paths to replay every run in")
    parser.add_argument("--target-loss", type=float, default=0.25, help="validation loss whose arrival is timed")
    parser.add_argument("--out", type=Path, default=Path("compare_strategies.png"),
                        help="where to write the loss vs simulated time plot (PNG)")
    args = parser.parse_args()

    train, val = digits(train=True), digits(train=False)
    start = time.perf_counter()
    results: dict[str, FitResult] = {}
    for name, strategy in strategies().items():
        run = LocalTrainer(digits_mlp(), train, val).fit(
            strategy, num_nodes=args.nodes, max_steps=args.steps, batch_size=16,
            val_interval=min(H, args.steps), val_size=len(val), seed=0, progress=False)
        results[name] = run
        print(f"{name:24s} trained in {run.real_time_s:5.1f} s, val loss {run.history['eval'][-1]['loss']:.4f}",
              flush=True)
    scenarios = [Scenario.load(s) for s in args.scenarios]
    comparison = compare(results, scenarios, target_loss=args.target_loss)
    params = sum(p.numel() for p in digits_mlp().parameters())
    print(f"\nDigits MLP ({params:,} parameters), K={args.nodes}, {args.steps} steps, batch 16 per node; "
          f"untrained val loss {initial_val_loss(val):.4f} (ln 10 = {math.log(10):.4f}).\n")
    print(table(results, comparison, [s.name for s in scenarios], args.steps))
    print(f"\nplot: {comparison.plot(args.out)} (target loss dotted); "
          f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
