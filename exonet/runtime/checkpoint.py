"""Checkpoints: resumable snapshots of every node, committed by the parent once all K are written.

Layout under a run directory::

    checkpoints/
        step-00000040/
            node-0.pt ... node-{K-1}.pt   each node's own: model, strategy.state_dict() (optimizer,
                                          schedule, the strategy's buffers), RNG states, step
            metrics.jsonl, trace.jsonl    the parent's: history and trace up to this step
        latest.json                       {"step": 40, "dir": "step-00000040"}: the commit record

A checkpoint counts only once latest.json names it. Nodes write their files as
bookkeeping (never traced or timed) and report them; the parent writes the history,
the trace and then latest.json when all K have reported, so a crash mid-checkpoint
leaves the previous one in force. Only the committed step folder is kept. The data
position is the step itself: a node's batch order is a pure function of
(seed, rank, epoch), so a resumed node skips straight to it without loading a batch.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exonet.errors import TraceError
from exonet.files import atomic_file
from exonet.rundir import read_json, read_metrics, write_json, write_metrics
from exonet.strategies.base import Strategy
from exonet.trace import Trace

LATEST = "latest.json"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def node_file(folder: Path, rank: int) -> Path:
    return folder / f"node-{rank}.pt"


# ------------------------------------------------------------------ node side
def save_node(root: Path, step: int, rank: int, model: torch.nn.Module, strategy: Strategy) -> None:
    """Write this node's checkpoint for ``step`` (after that step's optimizer update)."""
    folder = step_dir(root, step)
    folder.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "rank": rank, "model": model.state_dict(), "strategy": strategy.state_dict(),
             "rng": _rng_state()}
    with atomic_file(node_file(folder, rank)) as f:
        torch.save(state, f)


def load_node(folder: Path, rank: int, model: torch.nn.Module, strategy: Strategy) -> None:
    """Restore model, strategy and RNG states written by ``save_node`` (call after ``strategy.setup``)."""
    # Our own file from our own run, holding optimizer and RNG objects: a full unpickle is needed.
    file = node_file(folder, rank)
    try:
        state = torch.load(file, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch's reader names no file: "failed reading zip archive"
        raise TraceError(f"resume_from: {file}: cannot read the checkpoint ({exc})") from None
    model.load_state_dict(state["model"])
    strategy.load_state_dict(state["strategy"])
    _set_rng_state(state["rng"])


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------- parent side
class CheckpointBook:
    """The parent's record of checkpoints: counts node reports and commits a step once all K are in.

    Args:
        root: the run's ``checkpoints`` folder.
        num_nodes: K.
    """

    def __init__(self, root: Path, num_nodes: int) -> None:
        self.root, self.num_nodes = root, num_nodes
        self._reports: dict[int, set[int]] = {}

    def report(self, rank: int, step: int) -> bool:
        """Note that ``rank`` wrote its file for ``step``; True once every node has."""
        ranks = self._reports.setdefault(step, set())
        ranks.add(rank)
        if len(ranks) < self.num_nodes:
            return False
        del self._reports[step]
        return True

    def commit(self, step: int, history: dict[str, list], trace: Trace,
               references: dict[int, float] | None = None) -> None:
        """Make ``step`` the checkpoint to resume from, then drop older ones (``references``: each rank's
        first loss, which the divergence watch of a resumed run measures against)."""
        folder = step_dir(self.root, step)
        write_metrics(folder / "metrics.jsonl", history)
        trace.save(folder / "trace.jsonl")
        record: dict[str, Any] = {"step": step, "dir": folder.name}
        if references:
            record["references"] = {str(rank): loss for rank, loss in references.items()}
        write_json(self.root / LATEST, record)
        self.prune(below=step)

    def prune(self, below: float = float("inf")) -> None:
        """Remove step folders other than the committed one; only those before ``below``, as nodes may be
        writing later ones. With no bound (once nodes have stopped) unfinished checkpoints go too."""
        keep = read_json(self.root / LATEST)["dir"] if (self.root / LATEST).exists() else None
        for folder in self.root.glob("step-*"):
            if folder.name != keep and int(folder.name.removeprefix("step-")) < below:
                shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Resume:
    """A committed checkpoint to continue from."""

    step: int
    folder: Path
    history: dict[str, list]
    trace: Trace
    references: dict[int, float]  # each rank's first loss in the run resumed (exonet.runtime.divergence)


def load_latest(run_path: Path, num_nodes: int) -> Resume:
    """The run's committed checkpoint; TraceError naming the file if any part is missing or unreadable."""
    latest = run_path / "checkpoints" / LATEST
    if not latest.exists():
        raise TraceError(f"resume_from: {latest} is missing: {run_path} holds no complete checkpoint "
                         "(was it run with checkpoint_interval?)")
    record = read_json(latest)
    if (not isinstance(record, dict) or not isinstance(record.get("step"), int)
            or not isinstance(record.get("dir"), str)):
        raise TraceError(f"{latest}: expected {{'step': int, 'dir': str}}, got {record!r}")
    folder = latest.parent / record["dir"]
    for rank in range(num_nodes):
        if not node_file(folder, rank).is_file():
            raise TraceError(f"resume_from: {node_file(folder, rank)} is missing (the checkpoint needs one file "
                             f"per node, num_nodes={num_nodes})")
    trace = Trace.load(folder / "trace.jsonl")
    if trace.num_nodes != num_nodes:
        raise ValueError(f"resume_from: the checkpoint holds {trace.num_nodes} nodes, "
                         f"this fit has num_nodes={num_nodes}")
    history = read_metrics(folder / "metrics.jsonl")
    held = {len(history["train_loss"]), *(trace.num_steps(r) for r in range(num_nodes))}
    if held != {record["step"]}:
        raise TraceError(f"{latest}: says step {record['step']}, but {folder.name} holds "
                         f"{' and '.join(map(str, sorted(held)))} steps; the checkpoint is inconsistent "
                         "(edited or mixed from two runs)")
    saved = record.get("references")
    if isinstance(saved, dict):
        references = {int(rank): float(loss) for rank, loss in saved.items()}
    else:  # a checkpoint from before references were kept: the first step's mean loss stands for each rank's
        first = (history.get("train_loss") or [None])[0]
        references = {} if first is None else dict.fromkeys(range(num_nodes), float(first))
    return Resume(record["step"], folder, history, trace, references)
