"""What happened in a run, drawn: Streaming DiLoCo (or overlapped DDP) on two regions.

Trains a small MLP on digits with K=4 for a few steps, recording it into a run folder, then
runs ``exonet timeline RUN_DIR --scenario examples/timeline.toml --out examples/timeline.png``
on it: each node's compute, exposed communication and idle time, its async collectives in
flight (Streaming DiLoCo's fragments sync under the next inner steps), and the busiest links'
utilisation; the text picture is printed too.

    python examples/timeline.py [--strategy streaming|ddp] [--steps 24] [--out examples/timeline.png]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from exonet import LocalTrainer
from exonet.cli import main as cli
from exonet.strategies import DDPStrategy, OptimSpec, StreamingDiLoCoStrategy
from exonet.toy import digits, digits_mlp

SCENARIO = Path(__file__).with_name("timeline.toml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).with_name("timeline.png")))
    parser.add_argument("--strategy", choices=["streaming", "ddp"], default="streaming")
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    strategy = (StreamingDiLoCoStrategy(OptimSpec("adamw", lr=1e-3), H=6, num_fragments=3)
                if args.strategy == "streaming"
                else DDPStrategy(OptimSpec("sgd", lr=0.05), bucket_cap_mb=1))
    trainer = LocalTrainer(digits_mlp(hidden=1024), digits(), digits(train=False))
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / f"{args.strategy}-k4"  # the folder given to fit(run_dir=...); its name titles the chart
        trainer.fit(strategy, num_nodes=4, max_steps=args.steps, batch_size=256, val_size=0, progress=False,
                    device="cpu", run_dir=runs, run_name=args.strategy)
        cli(["timeline", str(runs), "--scenario", str(SCENARIO), "--out", args.out])


if __name__ == "__main__":
    main()
