"""Decoupled DiLoCo's goodput grid: 150k to 2.4M chips that fail once a year each, trained six ways.

Decoupled DiLoCo (arXiv 2604.21428) splits a machine into M workers that never wait for each
other (quorum 1), so a chip failure stalls only its worker. Its goodput figure, redone with
exonet's worker model (exonet.netsim.workers; a worker is one unit failing at the summed rate
of its chips, so 2.4M chips cost what 150k do):

* ``dp``: data-parallel without elasticity: every failure stalls the whole job ``restart``;
* ``elastic``: elastic data-parallel: every failure stalls the whole job ``pause``, then it
  trains without the failed ``slice`` until the ``repair``;
* ``M=2`` ... ``M=16``: Decoupled DiLoCo, M elastic workers of N/M chips each.

The timings are not all in the paper; they are chosen once, for every cell, from it and from
comparable systems (strategies/README.md, "Goodput at a million chips", says why):

    [failures]
    mtbf = "8766 h"    # a year per chip: the paper's MTBI, which it calls aggressive
    restart = "75 s"   # a synchronous job re-formed on spare chips from in-memory state, plus the step lost
    pause = "20 s"     # an elastic job re-formed without the failed slice ("tens of seconds", Gemini 2.5)
    slice = 64         # a 4x4x4 TPU cube, what the optical switch swaps out (Gemini 1.0)
    repair = "2 h"     # until the slice is back

    python examples/decoupled_goodput.py [--days 7] [--seed 0] [--plot examples/decoupled_goodput.png] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from exonet import Scenario
from exonet.netsim.workers import worker_goodput

CHIPS = (150_000, 300_000, 600_000, 1_200_000, 2_400_000)
METHODS = {"dp": (1, False), "elastic": (1, True), "M=2": (2, True), "M=4": (4, True), "M=8": (8, True),
           "M=16": (16, True)}  # label: (workers, elastic)
FAILURES = {"mtbf": "8766 h", "restart": "75 s", "pause": "20 s", "slice": 64, "repair": "2 h"}
PUBLISHED = {("dp", 1_200_000): 0.27, ("elastic", 1_200_000): 0.58, ("M=8", 1_200_000): 0.88,
             ("M=16", 1_200_000): 0.93}  # the paper's cells at 1.2M chips, as its summaries report them


def grid(days: float, seed: int) -> list[dict[str, Any]]:
    """One row per method and chip count: goodput over ``days`` of simulated training."""
    scenario = Scenario.from_dict({"name": "chips-fail-once-a-year", "network": {"bandwidth": "100 Gbit/s"},
                                   "failures": {**FAILURES, "seed": seed}})
    rows = []
    for method, (workers, elastic) in METHODS.items():
        for chips in CHIPS:
            r = worker_goodput(scenario, chips, workers, elastic=elastic, horizon_s=days * 86400)
            rows.append({"method": method, "chips": chips, "goodput": r.goodput, "failures": r.failures,
                         "stalled": r.stalled, "missing": r.missing})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The grid as a markdown table, methods down, chips across; a published cell beside ours."""
    head = "| method | " + " | ".join(f"{c / 1e6:g}M chips" for c in CHIPS) + " |"
    lines = [head, "|---|" + "---|" * len(CHIPS)]
    for method in METHODS:
        cells = []
        for r in (r for r in rows if r["method"] == method):
            paper = PUBLISHED.get((method, r["chips"]))
            cells.append(f"{r['goodput']:.1%}" + ("" if paper is None else f" (paper {paper:.0%})"))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        ax.plot([r["chips"] for r in mine], [100 * r["goodput"] for r in mine], marker="o", label=method)
    for (method, chips), value in PUBLISHED.items():
        ax.plot(chips, 100 * value, "kx", markersize=9)
    ax.plot([], [], "kx", label="paper, 1.2M chips")
    ax.set_xscale("log")
    ax.set_xticks(CHIPS, [f"{c / 1e6:g}M" for c in CHIPS])
    ax.set_xticks([], minor=True)
    ax.set_xlabel("chips (MTBI 1 year each)")
    ax.set_ylabel("goodput (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=float, default=7.0, help="simulated days of training per cell")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=None, help="write goodput against chips to this PNG")
    p.add_argument("--json", action="store_true", help='print {"rows": [{"method", "chips", "goodput"}, ...]} only')
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    rows = grid(args.days, args.seed)
    if args.json:
        print(json.dumps({"rows": [{k: r[k] for k in ("method", "chips", "goodput")} for r in rows]}))
    else:
        print(f"goodput over {args.days:g} simulated days, chip MTBI 1 year, {FAILURES}, seed {args.seed} "
              f"({sum(r['failures'] for r in rows):,} failures drawn in {time.perf_counter() - t0:.1f} s)\n")
        print(table(rows))
    if args.plot:
        plot(rows, args.plot)
        if not args.json:
            print(f"\nplot: {args.plot}")
    return rows


if __name__ == "__main__":
    main()
