"""The field's low-communication methods on one small GPT: DiLoCo, SparseLoCo, MuLoCo and NoLoCo on home broadband.

K = 4 nodes train the character-level GPT of ``examples/char_lm.py`` (2 layers, width 64, 64-character
context; text: a few standard-library modules of this interpreter, nothing downloaded) from the same
initial weights, with the same per-node batch, the same H and the same inner AdamW learning rate, so
that the methods differ only in what they do every H steps. (NoLoCo's default inner optimizer is Adam
lr 6e-4; here it gets the others' AdamW.) MuLoCo keeps Muon on the hidden matrices (lr 0.02, its
default) and AdamW at the shared lr on the rest; it runs twice, sending full-precision parameters
and 2-bit error-fed pseudo-gradients. DiLoCo and MuLoCo share the outer Nesterov SGD (lr 0.7,
momentum 0.5) of the other examples here; SparseLoCo and NoLoCo keep their own outer steps. Each run's
trace is then replayed in one scenario (``home-broadband``: 20 Mbit/s uplinks, one of the four on
10 Mbit/s, GPUs of three speeds) with compute charged by the FLOPs torch counts at ``--tflops``, so
the table is the same on every machine. Each trace is also replayed across two cloud regions
(``--priced``, default ``cross-region``) with egress priced at ``--egress`` per GB leaving either
region, the dollars a run's wide-area bytes cost. It prints the node-averaged model's validation
loss, the payload each node sent, the simulated wall-clock in both and the dollars, and draws
validation loss against simulated time in the first.

    python examples/field_methods.py [--steps 300] [--H 10] [--lr 3e-3] [--scenario home-broadband]
                                     [--priced cross-region] [--egress "0.02 $/GB"] [--tflops 0.03]
                                     [--out examples/field_methods.png]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/ is not a package: reuse char_lm's model and data
from char_lm import CharGPT, CharWindows, stdlib_text  # noqa: E402

from exonet import FitResult, LocalTrainer, Scenario, SimResult  # noqa: E402
from exonet.strategies import (  # noqa: E402
    DiLoCoStrategy,
    MuLoCoStrategy,
    NoLoCoStrategy,
    OptimSpec,
    SparseLoCoStrategy,
    Strategy,
)
from exonet.units import format_bytes, format_dollars, format_time  # noqa: E402

NODES = 4
BLOCK = 64  # context length in characters, as char_lm.py


def strategies(H: int, lr: float) -> dict[str, Strategy]:
    """The four methods (MuLoCo twice), with the same H and inner learning rate."""
    inner = OptimSpec("adamw", lr=lr)
    muon = OptimSpec("muon", adamw_lr=lr)
    outer = OptimSpec("sgd", lr=0.7, momentum=0.5, nesterov=True)
    return {
        f"DiLoCo H={H}": DiLoCoStrategy(inner, outer_optim_spec=outer, H=H),
        f"SparseLoCo H={H}": SparseLoCoStrategy(inner, H=H),
        f"MuLoCo H={H}": MuLoCoStrategy(muon, outer_optim_spec=outer, H=H),
        f"MuLoCo H={H} 2-bit": MuLoCoStrategy(muon, outer_optim_spec=outer, H=H, quantize_bits=2),
        f"NoLoCo H={H}": NoLoCoStrategy(inner, H=H),
    }


def table(runs: dict[str, FitResult], sims: dict[str, SimResult], priced: dict[str, SimResult],
          labels: tuple[str, str]) -> str:
    """One markdown row per strategy: final validation loss, payload per node, simulated wall-clock in both
    scenarios, and the egress dollars in the priced one."""
    lines = [f"| strategy | val loss | payload/node | sim time, {labels[0]} | sim time, {labels[1]} | egress $ |",
             "|---|---|---|---|---|---|"]
    for name, run in runs.items():
        lines.append(f"| {name} | {run.history['eval'][-1]['loss']:.4f} | "
                     f"{format_bytes(run.trace.payload_per_trainer())} | {format_time(sims[name].wall_clock_s)} | "
                     f"{format_time(priced[name].wall_clock_s)} | {format_dollars(priced[name].cost)} |")
    return "\n".join(lines)


def with_egress(name: str, price: str) -> Scenario:
    """Preset ``name`` with every region's egress priced at ``price``."""
    spec = Scenario.load(name).to_dict()
    spec["regions"] = [{**region, "egress": price} for region in spec.get("regions", [])]
    if not spec["regions"]:
        raise SystemExit(f"--priced {name}: the scenario has no [[regions]], so no byte leaves one")
    return Scenario.from_dict(spec)


def plot(runs: dict[str, FitResult], sims: dict[str, SimResult], label: str, path: Path) -> Path:
    """Validation loss of the node-averaged model against simulated time, one line per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, run in runs.items():
        points = sims[name].loss_vs_time(evals=run.history["eval"])
        ax.plot([t for t, _ in points], [loss for _, loss in points], marker="o", markersize=3, label=name)
    ax.set_xlabel(f"simulated wall-clock in {label} (s)")
    ax.set_ylabel("validation loss (node-averaged model)")
    ax.set_title(f"K={NODES}: DiLoCo, SparseLoCo, MuLoCo and NoLoCo")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per node")
    parser.add_argument("--H", type=int, default=10, help="inner steps per round, every method")
    parser.add_argument("--lr", type=float, default=3e-3, help="inner AdamW learning rate, every method")
    parser.add_argument("--scenario", default="home-broadband", help="preset name or TOML path to replay in")
    parser.add_argument("--priced", default="cross-region", help="a preset with regions, replayed with priced egress")
    parser.add_argument("--egress", default="0.02 $/GB", help="egress price of every region of --priced")
    parser.add_argument("--tflops", type=float, default=0.03, help="simulated device speed in TFLOP/s")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("field_methods.png"),
                        help="where to write the loss vs simulated time plot (PNG)")
    args = parser.parse_args()

    start = time.perf_counter()
    text = stdlib_text()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text])
    cut = int(len(ids) * 0.9)
    train, val = CharWindows(ids[:cut], BLOCK, BLOCK // 4), CharWindows(ids[cut:], BLOCK, BLOCK)
    runs: dict[str, FitResult] = {}
    for name, strategy in strategies(args.H, args.lr).items():
        torch.manual_seed(0)
        model = CharGPT(len(vocab), BLOCK)  # char_lm's defaults: width 64, 2 layers, 4 heads
        runs[name] = LocalTrainer(model, train, val).fit(
            strategy, num_nodes=NODES, max_steps=args.steps, batch_size=16, val_interval=min(args.H, args.steps),
            val_size=min(len(val), 256), seed=0, progress=False)
        print(f"{name:20s} trained in {runs[name].real_time_s:5.1f} s, "
              f"val loss {runs[name].history['eval'][-1]['loss']:.4f}", flush=True)

    base = Scenario.load(args.scenario)
    scenario = base.replace(compute={"mode": "flops", "tflops": args.tflops, "mfu": 1.0})
    sims = {name: run.simulate(scenario) for name, run in runs.items()}
    far = with_egress(args.priced, args.egress)
    far = far.replace(compute={"mode": "flops", "tflops": args.tflops, "mfu": 1.0})
    priced = {name: run.simulate(far) for name, run in runs.items()}
    label = f"{base.name} at {args.tflops:g} TFLOP/s"
    params = sum(p.numel() for p in next(iter(runs.values())).model.parameters())
    print(f"\nCharGPT ({params:,} parameters), K={NODES}, {args.steps} steps, batch 16 windows of {BLOCK} characters "
          f"per node, inner lr {args.lr:g}; replayed in {label}:\n")
    print(table(runs, sims, priced, (base.name, f"{args.priced} at {args.egress}")))
    print(f"\nplot: {plot(runs, sims, label, args.out)}; total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
