"""A short checkpointed fit for the SIGKILL test to kill and resume (run as ``python tests/kill_fit.py ROOT|RUN OUT
[COMMIT]``).

Not a test module: tests/test_runtime_kills.py starts it in a new session and kills the whole session (the fit,
its forkserver and its nodes) with SIGKILL, as a power cut would. ROOT, a folder: a fresh run under it; RUN, a run
directory: resume it. A fit that ends writes OUT.pt (the final model's state) and OUT.json (the history). With
COMMIT = n, the fit kills its session itself inside its n-th commit of checkpoints/latest.json (this process's
n-th, counting from its start): the new pointer written under its temporary name, not yet renamed into place.
"""

import json
import os
import signal
import sys
from pathlib import Path

import torch

import exonet.files
from exonet import LocalTrainer
from exonet.strategies import DDPStrategy, OptimSpec
from exonet.toy import synthetic_classification, tiny_mlp

DATA = synthetic_classification(128, dim=8, classes=4)
VAL = synthetic_classification(32, dim=8, classes=4, train=False)
KW = dict(num_nodes=2, max_steps=30, batch_size=8, val_interval=5, val_size=16, seed=7, checkpoint_interval=2,
          progress=False)


def die_inside_commit(n: int) -> None:
    """SIGKILL this session between writing the n-th latest.json and renaming it into place."""
    replace, seen = exonet.files._replace_regular, [0]

    def replace_or_die(tmp: Path, path: Path) -> None:
        if path.name == "latest.json":
            seen[0] += 1
            if seen[0] == n:
                os.killpg(0, signal.SIGKILL)
        replace(tmp, path)

    exonet.files._replace_regular = replace_or_die


if __name__ == "__main__":
    where, out = Path(sys.argv[1]), sys.argv[2]
    if len(sys.argv) > 3:
        die_inside_commit(int(sys.argv[3]))
    strategy = DDPStrategy(OptimSpec("adamw", lr=3e-3, weight_decay=0.01))
    place = {"resume_from": where} if (where / "config.json").exists() else {"run_dir": where}
    result = LocalTrainer(tiny_mlp(), DATA, VAL).fit(strategy, **place, **KW)
    torch.save(result.model.state_dict(), f"{out}.pt")
    Path(f"{out}.json").write_text(json.dumps(result.history))
