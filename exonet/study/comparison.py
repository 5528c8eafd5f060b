"""compare: strategies against scenarios, from recorded runs, without retraining.

Each run (a FitResult, a Trace, or a run directory) is replayed in each scenario;
one row per (run, scenario) holds the simulated wall-clock, the time to a target
loss, bytes per node, utilisation, how far nodes drifted apart, and what the run trained
(node-steps kept, tokens, time per token: exonet.study.tokens), since a run that discards work
can end sooner by training less. A folder given to
``fit(run_dir=...)`` stands for every complete run inside it (exonet.rundir.find_runs).
"""

from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from exonet.files import check_output, output_path
from exonet.runtime.fit_result import FitResult
from exonet.study.tokens import trained
from exonet.trace import Trace


@dataclass
class Run:
    """What compare needs of a run: its trace and, when known, its loss history."""

    name: str
    trace: Trace
    history: dict[str, list] = field(default_factory=dict)

    @classmethod
    def coerce(cls, name: str, obj: Any) -> "Run":
        if isinstance(obj, FitResult):
            return cls(name, obj.trace, obj.history)
        if isinstance(obj, Trace):
            return cls(name, obj)
        if isinstance(obj, (str, os.PathLike)):
            from exonet.rundir import load_run

            path = Path(obj)
            if path.is_dir():
                _, history, trace = load_run(path)
                return cls(name, trace, history)
            return cls(name, Trace.load(path))
        raise TypeError(f"compare: run {name!r} must be a FitResult, a Trace or a run directory, "
                        f"got {type(obj).__name__}")


def expand_runs(name: str, obj: Any) -> tuple[dict[str, Any], list[str]]:
    """The runs one ``compare`` entry stands for, by name, and notes on the incomplete ones.

    A folder of runs (as given to ``fit(run_dir=...)``) stands for every complete run in it:
    named ``name`` when it holds one, ``name/<run folder>`` when it holds several. A run
    directory that is incomplete stays in, with a note saying so.
    """
    if not isinstance(obj, (str, os.PathLike)) or not Path(obj).is_dir():
        return {name: obj}, []
    from exonet.rundir import find_runs, incomplete

    runs, notes = find_runs(obj)
    if len(runs) == 1 and runs[0] == Path(obj):
        why = incomplete(runs[0])
        return {name: runs[0]}, [f"{runs[0]}: {why}"] if why else []
    if len(runs) == 1:
        return {name: runs[0]}, notes
    return {f"{name}/{label}": run for label, run in zip(run_names(runs), runs)}, notes


def run_names(paths: Sequence[Path]) -> list[str]:
    """Each run's name (``fit(run_name=...)``, or the strategy and K): its folder's name after the start time
    (``<time>-<name>``, exonet.rundir); the folder's whole name where two runs share a name."""
    names = [re.sub(r"^\d{8}-\d{6}-", "", path.name) or path.name for path in paths]
    return [name if names.count(name) == 1 else path.name for name, path in zip(names, paths)]


def _named(runs: Any) -> Mapping[str, Any]:
    """``compare``'s runs as a mapping: one folder or a list of runs named by their run names, or by position."""
    if isinstance(runs, (str, os.PathLike)):
        runs = [runs]
    if isinstance(runs, (list, tuple)):
        paths = iter(run_names([Path(obj) for obj in runs if isinstance(obj, (str, os.PathLike))]))
        runs = {next(paths) if isinstance(obj, (str, os.PathLike)) else f"run {i}": obj for i, obj in enumerate(runs)}
    if not isinstance(runs, Mapping):
        raise TypeError(f"compare: runs must map names to runs (FitResult, Trace, run directory or folder of runs), "
                        f"or be a folder or a list of them, got {type(runs).__name__}")
    if not runs:
        raise ValueError("compare: runs is empty; pass a mapping of name -> FitResult, Trace or run directory")
    return runs


def time_to_loss(history: Mapping[str, list], step_end_times: Sequence[float], target: float) -> float | None:
    """Simulated seconds until the loss first reaches ``target``.

    Uses the node-averaged evaluation loss when the run evaluated, else the mean
    training loss smoothed over the last 10 steps (as plotted), so one lucky batch
    does not count. None when the run never reached it. A server's evaluations count
    updates, not steps, so they are not placed on the step times (the training loss is).
    """
    evals = [e for e in history.get("eval") or [] if "updates" not in e]
    if evals:
        points = [(e["step"], e["loss"]) for e in evals]
    else:
        losses = history.get("train_loss") or []
        points = [(int(step), loss) for step, loss in _smooth([(i + 1, v) for i, v in enumerate(losses)])]
    for step, loss in points:
        if loss <= target and 1 <= step <= len(step_end_times):
            return step_end_times[step - 1]
    return None


@dataclass
class Comparison:
    """The table compare returns: ``rows`` (one dict per run × scenario) plus the SimResults behind them.

    A row's ``time_to_target_s`` is None where the run's loss never reached the target, and NaN where
    the run has no loss to judge by (a bare trace): the table shows "not reached" and "—".
    """

    rows: list[dict[str, Any]]
    results: dict[tuple[str, str], Any]
    runs: dict[str, Run]
    target_loss: float | None = None
    loss: str = "train"  # the quantity of the curves, the target line and "to target": "train" or "validation"

    COLUMNS = (
        ("run", "run", "{}"),
        ("scenario", "scenario", "{}"),
        ("wall_clock_s", "sim time", "{}"),
        ("wall_clock_range", "p10-p90", "{}"),
        ("expected_range", "real run p10-p90", "{}"),
        ("tokens", "tokens", "{:.4g}"),
        ("time_per_token_s", "time/token", "{:.4g} s"),
        ("steps_trained", "steps kept", "{}"),
        ("time_per_step_s", "time/step", "{}"),
        ("time_to_target_s", "to target", "{}"),
        ("final_loss", "final loss", "{:.4f}"),
        ("payload_bytes_per_node", "payload/node", "{}"),
        ("payload_bytes_per_server", "payload/server", "{}"),
        ("wire_bytes_per_node", "wire/node", "{}"),
        ("wide_area_bytes_per_node", "wide-area/node", "{}"),
        ("cost_usd", "egress $", "{}"),
        ("cost_usd_per_1000_steps", "egress $/1k steps", "{}"),
        ("utilization", "compute util", "{:.1%}"),
        ("goodput", "goodput", "{:.1%}"),
        ("drift", "drift", "{:.3g}"),
    )

    def to_markdown(self) -> str:
        from exonet.units import format_bytes, format_dollars, format_time

        def cell(key: str, fmt: str, value: Any) -> str:
            if value is None or (isinstance(value, float) and math.isnan(value)):
                return "not reached" if key == "time_to_target_s" and value is None else "—"
            if key in ("wall_clock_s", "time_to_target_s", "time_per_step_s"):
                return format_time(value)
            if key in ("wall_clock_range", "expected_range"):
                return f"{format_time(value[0])} – {format_time(value[1])}"
            if "_bytes_per_" in key:
                return format_bytes(value)
            if key.startswith("cost_usd"):
                return format_dollars(value)
            return fmt.format(value)

        served = any(row.get("servers") for row in self.rows)
        # tokens where the traces state them; node-steps kept where a run kept fewer than it took
        tokens = any(row.get("tokens") is not None for row in self.rows)
        dropped = any(row["steps_trained"] < row["trainers"] * row["steps"] for row in self.rows)
        cols = [c for c in self.COLUMNS if (c[0] != "time_to_target_s" or self.target_loss is not None)
                and (c[0] != "payload_bytes_per_server" or served)
                and (c[0] != "goodput" or any("goodput" in row for row in self.rows))
                and (c[0] not in ("wide_area_bytes_per_node", "cost_usd", "cost_usd_per_1000_steps")
                     or any(row.get(c[0]) for row in self.rows))
                and (c[0] not in ("tokens", "time_per_token_s") or tokens)
                and (c[0] not in ("steps_trained", "time_per_step_s") or dropped)
                and (c[0] not in ("wall_clock_range", "expected_range")
                     or any(row[c[0]][1] > row[c[0]][0] for row in self.rows))]
        header = "| " + " | ".join(title for _, title, _ in cols) + " |"
        rule = "|" + "|".join("---" for _ in cols) + "|"
        body = ["| " + " | ".join(cell(k, f, row.get(k)) for k, _, f in cols) + " |" for row in self.rows]
        return "\n".join([header, rule, *body])

    def __str__(self) -> str:
        return self.to_markdown()

    def plot(self, path: str | os.PathLike) -> Path:
        """Loss vs simulated wall-clock: one panel per scenario, one line per run (needs matplotlib).

        The quantity is ``self.loss``: the node-averaged model's validation loss (a server's model for an
        asynchronous run) when every run evaluated, else the training loss (mean over nodes, a trailing
        mean over 10 steps); the y-axis names it, and the target line and "to target" use it too.
        """
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("compare.plot needs matplotlib: pip install 'exonet[examples]'") from None
        scenarios = list(dict.fromkeys(s for _, s in self.results))
        fig, axes = plt.subplots(1, len(scenarios), figsize=(5 * len(scenarios), 4), squeeze=False)
        for ax, scen in zip(axes[0], scenarios):
            for (run_name, s), sim in self.results.items():
                if s != scen or not self.runs[run_name].history.get("train_loss"):
                    continue  # a bare Trace has no loss to draw
                curve = _curve(self.runs[run_name], sim, self.loss)
                if curve:
                    ax.plot([t for t, _ in curve], [loss for _, loss in curve], label=run_name,
                            marker="o" if self.loss == "validation" else None, markersize=3)  # sparse evaluations
            ax.set_xscale("log")
            ax.set_title(scen)
            ax.set_xlabel("simulated wall-clock (s)")
            ax.set_ylabel(LOSS_LABELS[self.loss])
            if self.target_loss is not None:
                ax.axhline(self.target_loss, color="grey", linestyle=":", linewidth=1)
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small")
        fig.tight_layout()
        path = output_path(path)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


LOSS_LABELS = {"train": "train loss (mean over nodes, 10-step trailing mean)",
               "validation": "validation loss (node-averaged or server model)"}


def _curve(run: Run, sim: Any, loss: str) -> list[tuple[float, float]]:
    """The (simulated seconds, loss) points drawn for ``run`` in ``sim``: validation or smoothed training loss."""
    if loss == "validation":
        return sim.loss_vs_time(evals=run.history.get("eval") or [])
    return _smooth(sim.loss_vs_time()) if run.history.get("train_loss") else []


def _time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """When ``curve`` first reaches ``target``: None if it never does, NaN if there is no curve to judge by."""
    if not curve:
        return math.nan
    return next((t for t, value in curve if value <= target), None)


def _unique_labels(names: list[str]) -> list[str]:
    """Scenario names made unique (sweeps built with ``replace`` keep the base name): "x", "x #2", ..."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name} #{seen[name]}")
    return out


def _smooth(points: list[tuple[float, float]], window: int = 10) -> list[tuple[float, float]]:
    """A trailing mean over ``window`` steps, so noisy per-step losses read as curves."""
    out, acc = [], []
    for t, loss in points:
        acc.append(loss)
        if len(acc) > window:
            acc.pop(0)
        out.append((t, sum(acc) / len(acc)))
    return out


def compare(runs: Mapping[str, Any] | str | os.PathLike | Sequence[Any], scenarios: Sequence[Any],
            target_loss: float | None = None, loss: str = "auto",
            plot: str | os.PathLike | None = None) -> Comparison:
    """Replay every run in every scenario.

    Args:
        runs: name → FitResult, Trace, run directory, or a folder of runs (every complete run in it;
            incomplete ones are left out with a warning); or one folder, or a list (named by their run names).
            A folder of several runs names each ``<name>/<run name>``.
        scenarios: Scenario objects, preset names or paths.
        target_loss: report the simulated time at which each run first reached this loss.
        loss: the quantity of "final loss", "to target" and ``plot``: "validation" (the last evaluation),
            "train" (the mean of the last 10 training losses), or "auto" (validation when
            every run with a history evaluated, so asynchronous and time-aware runs read by their models, not
            by per-trainer training losses in arrival order; else train).
        plot: also draw loss vs simulated time to this PNG (``Comparison.plot``), as ``exonet compare --plot``.

    Returns:
        A Comparison with ``rows``, ``to_markdown()`` and ``plot(path)``.
    """
    from exonet.netsim import simulate
    from exonet.scenario import Scenario

    if plot is not None:
        check_output(plot, "compare(plot=)")  # before the replays, not after
    runs = _named(runs)
    if isinstance(scenarios, (str, os.PathLike, Scenario)):
        scenarios = [scenarios]
    named: dict[str, Any] = {}
    for name, obj in runs.items():
        found, notes = expand_runs(name, obj)
        for note in notes:
            warnings.warn(f"compare: {note}", stacklevel=2)
        clash = sorted(set(found) & set(named))
        if clash:
            raise ValueError(f"compare: the run name {clash[0]!r} is given twice; names must be unique")
        named.update(found)
    loaded = {name: Run.coerce(name, obj) for name, obj in named.items()}
    if loss not in ("auto", "train", "validation"):
        raise ValueError(f"compare: loss must be 'auto', 'train' or 'validation', got {loss!r}")
    if loss == "auto":
        drawn = [r for r in loaded.values() if r.history.get("train_loss")]
        loss = "validation" if drawn and all(r.history.get("eval") for r in drawn) else "train"
    scens = [Scenario.coerce(s) for s in scenarios]
    labels = _unique_labels([s.name for s in scens])
    rows, results = [], {}
    cautioned: dict[str, set[str]] = {}
    for scen, label in zip(scens, labels):
        for name, run in loaded.items():
            sim = simulate(run.trace, scen, history=run.history.get("train_loss"))
            results[(name, label)] = sim
            for text in sim.cautions:
                if text not in cautioned.setdefault(label, set()):  # once per scenario, whichever runs reach it
                    cautioned[label].add(text)
                    warnings.warn(f"compare: scenario {label}: {text}", stacklevel=2)
            k = run.trace.num_ranks
            servers = run.trace.meta.get("servers", 0)
            trainers = run.trace.num_nodes
            evals = run.history.get("eval") or []
            losses = run.history.get("train_loss") or []
            # the same quantity as "to target" and the curves for every row: one column never mixes the two
            if loss == "validation":
                final = evals[-1]["loss"] if evals else None
            else:
                final = sum(losses[-10:]) / len(losses[-10:]) if losses else None
            rows.append({
                "run": name,
                "scenario": label,
                "nodes": k,
                "steps": run.trace.num_steps(0),
                "wall_clock_s": sim.wall_clock_s,
                "wall_clock_range": sim.wall_clock_range,
                "expected_range": sim.expected_range,
                "regime": sim.regime,
                "time_to_target_s": None if target_loss is None else _time_to(_curve(run, sim, loss), target_loss),
                "final_loss": final,
                "trainers": trainers,
                "servers": servers,
                # trainers and servers apart: a server answers every trainer, so it would skew a mean over all
                "payload_bytes_per_node": run.trace.payload_per_trainer(),
                "payload_bytes_per_server": run.trace.payload_per_server(),
                "wire_bytes_per_node": sim.wire_per_trainer(),
                "wide_area_bytes_per_node": sim.wire_by_level()["inter_region"],
                "cost_usd": sim.cost,
                "cost_usd_per_1000_steps": 1000 * sim.cost / max(1, sim.num_steps),
                "utilization": sim.utilization,
                "drift": evals[-1].get("drift", evals[-1].get("divergence")) if evals else None,  # older runs
                "correlation": evals[-1].get("correlation") if evals else None,
                **({"goodput": sim.goodput} if scen.resolve(k, servers).failures is not None else {}),
                **trained(sim, run.trace),
            })
    table = Comparison(rows, results, loaded, target_loss, loss)
    if plot is not None:
        table.plot(plot)
    return table
