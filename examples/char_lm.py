"""A nanoGPT-style character model on Python's own sources: how DiLoCo scales with the node count.

The text is a handful of standard-library modules read from this interpreter's own
installation (nothing is downloaded). A two-layer causal transformer learns to predict
the next character; DiLoCo trains it with K = 1, 2 and 4 nodes, each node with the same
batch, so K nodes see K times the data for the same number of steps and the same
payload per node. The table shows what the extra nodes buy in validation loss and what
a run costs in simulated wall-clock on a network where synchronisation is expensive.

Compute is charged by FLOPs at ``--tflops`` (the same for every K, as the per-node batch
is), so the simulated times differ by communication only. Measured CPU time on a busy
host is noisy and inflates unevenly with K (a lone node runs more intra-op threads);
``--measured`` replays it anyway.

    python examples/char_lm.py [--steps 1000] [--nodes-list 1 2 4] [--H 50] [--scenario cross-region]
                               [--tflops 0.03] [--measured] [--out char_lm.png]
    python examples/char_lm.py --steps 3000    # longer (~4 min on 2 idle cores): samples start to look like Python
    python examples/char_lm.py --width 128 --layers 4 --heads 8 --steps 3000    # a bigger model, for a GPU
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from exonet import FitResult, LocalTrainer, Scenario, SimResult
from exonet.strategies import DiLoCoStrategy, OptimSpec
from exonet.toy import STDLIB_MODULES, Block, CharWindows, stdlib_text
from exonet.units import format_bytes, format_time


class CharGPT(nn.Module):
    """A small GPT over characters; ``model((context, targets))`` returns the mean next-character loss."""

    def __init__(self, vocab: int, block: int, width: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(block, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.ln(self.blocks(self.tok(ids) + self.pos(pos))))

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.logits(x).flatten(0, 1), y.flatten())

    @torch.no_grad()
    def sample(self, prompt: list[int], n: int, temperature: float = 0.8, seed: int = 0) -> list[int]:
        """Continue ``prompt`` by ``n`` characters, drawn from the softened next-character distribution."""
        self.eval()
        g = torch.Generator().manual_seed(seed)
        ids = list(prompt)
        for _ in range(n):
            logits = self.logits(torch.tensor([ids[-self.block :]]))[0, -1] / temperature
            ids.append(int(torch.multinomial(logits.softmax(-1), 1, generator=g)))
        return ids


def table(runs: dict[int, FitResult], sims: dict[int, SimResult], scenario: str, steps: int, batch: int,
          block: int) -> str:
    """One markdown row per node count: data seen, final losses, payload per node, simulated time."""
    header = ["K", "chars seen", "val loss", "rank-0 local loss", "payload/node", f"sim time: {scenario}",
              "real time"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for k, run in runs.items():
        last = run.history["eval"][-1]
        payload = sum(run.payload_bytes(r) for r in range(k)) / k
        cells = [str(k), f"{k * steps * batch * block:,}", f"{last['loss']:.4f}", f"{last['local_loss']:.4f}",
                 format_bytes(payload), format_time(sims[k].wall_clock_s), f"{run.real_time_s:.0f} s"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: dict[int, FitResult], sims: dict[int, SimResult], scenario: str, path: Path) -> Path:
    """Validation loss of the node-averaged model against simulated time, one line per K.

    The training loss (what ``compare.plot`` draws) is each node's own loss on its own batch,
    which hides what extra nodes buy; the averaged model's validation loss shows it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for k, run in runs.items():
        evals = run.history["eval"]
        times = [sims[k].step_end_times[e["step"] - 1] for e in evals]
        ax.plot(times, [e["loss"] for e in evals], marker="o", label=f"K={k}")
    ax.set_xlabel(f"simulated wall-clock in {scenario} (s)")
    ax.set_ylabel("validation loss (node-averaged model)")
    ax.set_title("DiLoCo, same per-node batch: more nodes, more data")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps per node")
    parser.add_argument("--nodes-list", type=int, nargs="+", default=[1, 2, 4], help="node counts K to compare")
    parser.add_argument("--H", type=int, default=50, help="DiLoCo inner steps per round")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per node per step")
    parser.add_argument("--block", type=int, default=64, help="context length in characters")
    parser.add_argument("--width", type=int, default=64, help="embedding width")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (must divide --width)")
    parser.add_argument("--scenario", default="cross-region", help="preset name or TOML path to simulate in")
    parser.add_argument("--tflops", type=float, default=0.03,
                        help="simulated device speed in TFLOP/s (0.03: about what one CPU core sustains on this model)")
    parser.add_argument("--measured", action="store_true",
                        help="replay the measured thread-CPU time of each step instead of FLOPs at --tflops")
    parser.add_argument("--out", type=Path, default=Path("char_lm.png"),
                        help="where to write the loss vs simulated time plot (PNG)")
    args = parser.parse_args()
    if args.width % args.heads:
        parser.error(f"--heads ({args.heads}) must divide --width ({args.width})")

    start = time.perf_counter()
    text = stdlib_text()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text])
    cut = int(len(ids) * 0.9)
    train = CharWindows(ids[:cut], args.block, stride=max(1, args.block // 4))
    val = CharWindows(ids[cut:], args.block, stride=args.block)
    print(f"{len(text):,} characters from {len(STDLIB_MODULES)} standard-library modules, vocabulary {len(vocab)}; "
          f"{len(train):,} training windows, {len(val):,} validation windows")

    scenario = Scenario.load(args.scenario)
    if not args.measured:
        scenario = scenario.replace(compute={"mode": "flops", "tflops": args.tflops})
    runs: dict[int, FitResult] = {}
    for k in args.nodes_list:
        torch.manual_seed(0)
        model = CharGPT(len(vocab), args.block, args.width, args.layers, args.heads)
        strategy = DiLoCoStrategy(OptimSpec("adamw", lr=3e-3), H=args.H)
        runs[k] = LocalTrainer(model, train, val).fit(
            strategy, num_nodes=k, max_steps=args.steps, batch_size=args.batch_size,
            val_interval=min(args.H, args.steps), val_size=min(len(val), 256), seed=0, progress=False)
        print(f"K={k}: trained in {runs[k].real_time_s:.1f} s, val loss {runs[k].history['eval'][-1]['loss']:.4f}",
              flush=True)
    params = sum(p.numel() for p in runs[args.nodes_list[0]].model.parameters())
    sims = {k: run.simulate(scenario) for k, run in runs.items()}
    compute = "measured CPU time" if args.measured else f"{args.tflops:g} TFLOP/s"
    print(f"\nCharGPT ({params:,} parameters), DiLoCo H={args.H}, {args.steps} steps, batch {args.batch_size} "
          f"windows of {args.block} characters per node, compute {compute}; "
          f"uniform guess: ln {len(vocab)} = {math.log(len(vocab)):.3f}\n")
    print(table(runs, sims, scenario.name, args.steps, args.batch_size, args.block))
    best = runs[max(runs)].model.cpu()  # sample on the CPU whatever device trained it
    prompt = [index[c] for c in "def "]
    print(f"\nsample from the K={max(runs)} model:\n" + "".join(vocab[i] for i in best.sample(prompt, 200)))
    path = plot(runs, sims, scenario.name, args.out)
    print(f"\nplot: {path}; total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
