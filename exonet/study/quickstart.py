"""The main job: four strategies, one training run each, compared on three contrasting networks.

Trains DDP, DiLoCo, SPARTA and DeMo with K nodes on scikit-learn's digits (no
download) for their real loss curves, projects each strategy to a 1B-parameter bf16
model on each preset's devices and network (exonet.study.projection, the machinery of
``exonet estimate``) for the trade-off at a scale that matters, replays each small
run's own trace in a datacenter, two cloud regions and volunteers on home broadband,
prints both tables, and writes the plot, the run directories and Chrome traces.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from exonet.study.comparison import Comparison
    from exonet.study.projection import Scale

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
        "DiLoCo H=25": DiLoCoStrategy(inner, outer_optim_spec=outer, H=25),
        "SPARTA p=0.005": SPARTAStrategy(inner, p_sparta=0.005),
        "DeMo": DeMoStrategy(OptimSpec("sgd", lr=1e-3)),
    }


def compute_model(scenario: str, nodes: int) -> str:
    """How ``scenario`` times compute, in words (the quickstart prints it beside the table)."""
    from exonet.scenario import Scenario

    r = Scenario.load(scenario).resolve(nodes)
    if r.compute_mode == "flops":
        return f"counted FLOPs / ({r.tflops:g} TFLOP/s x MFU {r.mfu:g}), same on every machine"
    return f"this machine's {'thread-CPU' if r.compute_mode == 'measured' else 'wall'} seconds (varies with load)"


def steps_to_target(history: dict, target: float) -> int | None:
    """The first evaluated step at which the node-averaged model's validation loss reached ``target``."""
    return next((e["step"] for e in history.get("eval", []) if e["loss"] <= target), None)


def projection_table(results: dict, scenarios: Sequence[str], nodes: int, scale: Scale | None = None) -> str:
    """The quickstart's first table: each strategy at ``scale`` per scenario, beside its small run's real loss."""
    from exonet.study.projection import Scale, project, to_markdown

    scale = scale or Scale()
    rows = project(quickstart_strategies(), scenarios, nodes=nodes, scale=scale)
    final = {name: r.history["eval"][-1]["loss"] for name, r in results.items()}
    reached = {name: steps_to_target(r.history, TARGET_LOSS) for name, r in results.items()}
    extra = {
        "digits: final val loss": [f"{final[row['run']]:.4f}" for row in rows],
        f"digits: steps to {TARGET_LOSS}": [str(reached[row["run"]] or "not reached") for row in rows],
    }
    return to_markdown(rows, scale, extra) + f"\n\n{scale.describe(nodes)}"


def quickstart(out_dir: Path = Path("exonet_quickstart"), steps: int = 400, nodes: int = 4,
               scenarios: Sequence[str] | None = None, scale: Scale | None = None) -> Comparison:
    """Train, project (to ``scale``, default 1B parameters in bf16), compare, print, plot.

    Returns the comparison of the small runs (its table is the second one printed).
    """
    from exonet import LocalTrainer, Scenario, compare
    from exonet.study.projection import scenario_device
    from exonet.toy import digits, digits_mlp

    for value, what in ((steps, "steps"), (nodes, "nodes")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"quickstart: {what} must be an integer >= 1, got {value!r}")
    scenarios = list(scenarios or DEFAULT_SCENARIOS)
    for name in scenarios:  # a misspelt scenario, or one the projection cannot time, fails now, not after training
        scenario_device(Scenario.coerce(name), nodes, who="quickstart")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, strategy in quickstart_strategies().items():
        print(f"training {name} with K={nodes} for {steps} steps ...", flush=True)
        results[name] = LocalTrainer(digits_mlp(), digits(train=True), digits(train=False)).fit(
            strategy, num_nodes=nodes, max_steps=steps, batch_size=16, val_interval=25, val_size=512, seed=0,
            run_dir=out_dir / "runs")
        print(f"  done in {results[name].real_time_s:.1f} s; run directory {results[name].run_dir}", flush=True)
    print()
    print("The trade-off at scale, per strategy and network:")
    print(projection_table(results, scenarios, nodes, scale))
    table = compare(results, scenarios, target_loss=TARGET_LOSS)
    print()
    print(f"The digits runs themselves, replayed (K={nodes}, {steps} steps, target val loss {TARGET_LOSS}):")
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
