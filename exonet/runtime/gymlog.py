"""The older gym's CSV logs: ``train.csv`` and ``validation.csv`` with its columns, for its plotting code.

The gym's CSVLogger wrote ``logs/<run_name>/train.csv`` (step, examples_trained, train_loss,
train_perplexity, lr) and ``validation.csv`` (step, local_loss, local_perplexity, global_loss,
global_perplexity), steps counted from 0 for training and as steps done for evaluations. exonet
writes the same files from a finished run's history; ``lr`` is left empty, as the gym left it
when no learning-rate callback had fired (exonet's nodes do not report the learning rate). Each file
is written whole under a temporary name and renamed into place (exonet.files.atomic_file): a full
disk names the file and leaves no empty CSV, and a CSV that is a link is refused, not written through.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from exonet.files import atomic_file

TRAIN_COLUMNS = ("step", "examples_trained", "train_loss", "train_perplexity", "lr")
VALIDATION_COLUMNS = ("step", "local_loss", "local_perplexity", "global_loss", "global_perplexity")
GYM_LOG_DIR = "logs"  # the gym's CSVLogger default, relative to the working directory


def perplexity(loss: Any) -> Any:
    """exp(loss), as the gym logged it (inf past float range, nan for nan); "" where there is no loss."""
    if isinstance(loss, bool) or not isinstance(loss, (int, float)):
        return ""
    return math.exp(loss) if not loss >= 700 else math.inf


def write_gym_csv(folder: str | Path, history: dict[str, list], examples_per_step: int) -> Path:
    """Write ``train.csv`` and ``validation.csv`` into ``folder`` (created); returns it.

    Args:
        folder: where to write.
        history: a FitResult's history (``train_loss`` per step, ``eval`` entries with ``loss``/``local_loss``).
        examples_per_step: samples trained per step over all trainers (batch_size × K), as the gym counted them.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_file(folder / "train.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TRAIN_COLUMNS)
        for step, loss in enumerate(history.get("train_loss", [])):
            w.writerow([step, examples_per_step * (step + 1), loss, perplexity(loss), ""])
    with atomic_file(folder / "validation.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(VALIDATION_COLUMNS)
        for entry in history.get("eval", []):
            local, glob = entry.get("local_loss", ""), entry.get("loss", "")
            w.writerow([entry["step"], local, perplexity(local), glob, perplexity(glob)])
    return folder


def replicas(config: dict[str, Any]) -> int:
    """How many copies of the model train on batches of their own: the nodes, or a pipeline's replicas."""
    return config["num_nodes"] // (config.get("pipeline") or {"stages": 1})["stages"]
