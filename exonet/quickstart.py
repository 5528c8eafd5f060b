"""The main job: four strategies, one training run each, compared on three contrasting networks.

Trains DDP, DiLoCo, SPARTA and DeMo with K nodes on scikit-learn's digits (no
download), then replays each run's trace in a datacenter, two cloud regions and
volunteers on home broadband, prints the comparison, and writes the plot, the run
directories and Chrome traces.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from exonet.comparison import Comparison

DEFAULT_SCENARIOS = ("datacenter", "cross-region", "home-broadband")
TARGET_LOSS = 0.25


def quickstart_strategies() -> dict:
    """The four strategies compared, with settings that let each learn on digits."""
    from exonet.strategies import DDPStrategy, DeMoStrategy, DiLoCoStrategy, OptimSpec, SPARTAStrategy

    inner = OptimSpec("adamw", lr=1e-3)
    # Outer Nesterov momentum 0.5, not the paper's 0.9: on a problem this small 0.9 overshoots.
    outer = OptimSpec("sgd", lr=0.7, momentum=0.5, nesterov=True)
    return {
        "DDP": DDPStrategy(inner),
        "DiLoCo H=25": DiLoCoStrategy(inner, outer, H=25),
        "SPARTA p=0.005": SPARTAStrategy(inner, p_sparta=0.005),
        "DeMo": DeMoStrategy(lr=1e-3),
    }


def compute_model(scenario: str, nodes: int) -> str:
    """How ``scenario`` times compute, in words (the quickstart prints it beside the table)."""
    from exonet.scenario import Scenario

    r = Scenario.load(scenario).resolve(nodes)
    if r.compute_mode == "flops":
        return f"counted FLOPs / ({r.tflops:g} TFLOP/s x MFU {r.mfu:g}), same on every machine"
    return f"this machine's {'thread-CPU' if r.compute_mode == 'measured' else 'wall'} seconds (varies with load)"


def quickstart(out_dir: Path = Path("exonet_quickstart"), steps: int = 400, nodes: int = 4,
               scenarios: Sequence[str] | None = None) -> Comparison:
    """Train, compare, print, plot; returns the comparison (its table is what was printed)."""
    from exonet import LocalTrainer, compare
    from exonet.toy import digits, digits_mlp

    out_dir.mkdir(parents=True, exist_ok=True)
    scenarios = list(scenarios or DEFAULT_SCENARIOS)
    results = {}
    for name, strategy in quickstart_strategies().items():
        print(f"training {name} with K={nodes} for {steps} steps ...", flush=True)
        results[name] = LocalTrainer(digits_mlp(), digits(train=True), digits(train=False)).fit(
            strategy, num_nodes=nodes, max_steps=steps, batch_size=16, val_interval=25, val_size=512, seed=0,
            run_dir=out_dir / "runs")
        print(f"  done in {results[name].real_time_s:.1f} s; run directory {results[name].run_dir}", flush=True)
    table = compare(results, scenarios, target_loss=TARGET_LOSS)
    print()
    print(f"Simulated wall-clock per strategy and network (K={nodes}, {steps} steps, target val loss {TARGET_LOSS}):")
    print(table.to_markdown())
    print("\ncompute model per scenario:")
    for name in scenarios:
        print(f"  {name}: {compute_model(name, nodes)}")
    plot = table.plot(out_dir / "loss_vs_time.png")
    for (run, scen), sim in table.results.items():
        if scen == scenarios[-1]:
            sim.to_chrome_trace(out_dir / f"trace-{run.split()[0].lower()}-{scen}.json")
    print(f"\nplot: {plot}\nChrome traces (open in https://ui.perfetto.dev): {out_dir}/trace-*.json")
    return table
