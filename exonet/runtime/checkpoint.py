"""Checkpoints: resumable snapshots of every node, committed by the parent once all K are written.

Layout under a run directory::

    checkpoints/
        step-00000040/
            node-0.pt ... node-{K-1}.pt   each node's own: model, strategy.state_dict() (optimizer,
                                          schedule, the strategy's buffers and its exchanges in
                                          flight), RNG states, and where it belongs: format, run
                                          id, step, rank, the id of its next collective
            metrics.jsonl, trace.jsonl    the parent's: history and trace up to this step
        latest.json                       {"step": 40, "dir": "step-00000040", "run": ...}: the commit record

A checkpoint counts only once latest.json names it. Nodes write their files as
bookkeeping (never traced or timed) and report them; the parent writes the history,
the trace and then latest.json when all K have reported, so a crash mid-checkpoint
leaves the previous one in force. Only the committed step folder is kept. The data
position is the step itself: a node's batch order is a pure function of
(seed, rank, epoch), so a resumed node skips straight to it without loading a batch.

Loading runs no code. A node file holds tensors and plain values only (dicts, lists,
tuples, numbers, strings, None; ``save_node`` refuses anything else, naming it) and is
read with ``torch.load(weights_only=True)``, which refuses a file naming any other Python
object. Before a node starts, the parent checks the commit record and each node file
against where it was found: latest.json's ``dir`` is a plain folder name inside
``checkpoints/``, every file carries this run's id (config.json's ``run_id``), the step
latest.json names, the rank of its file name, and the collective count of its rank's
trace; anything else is a TraceError naming the file.
"""

from __future__ import annotations

import random
import re
import shutil
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from exonet.errors import TraceError
from exonet.files import atomic_file, plain_name
from exonet.rundir import read_config, read_json, read_metrics, run_id, write_json, write_metrics
from exonet.strategies.base import Strategy
from exonet.trace import Trace

LATEST = "latest.json"
# Unfinished checkpoints (written by some nodes, not yet committed by the parent) at once: a node whose next
# checkpoint would make more waits for the parent to catch up, so a parent that falls behind fills no disk.
MAX_UNFINISHED = 2
WAIT_S = 0.01
FORMAT = 2  # a node file's layout; format 1 pickled numpy's RNG state, and loading it needed code
_PLAIN = (int, float, bool, str, type(None))


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def node_file(folder: Path, rank: int) -> Path:
    return folder / f"node-{rank}.pt"


# ------------------------------------------------------------------ node side
def save_node(root: Path, step: int, rank: int, model: torch.nn.Module, strategy: Strategy) -> None:
    """Write this node's checkpoint for ``step`` (after that step's optimizer update; ``root`` is the run's
    ``checkpoints`` folder). A value that could not be loaded without code is a TypeError naming it; a
    collective in flight that the strategy's state does not keep, a RuntimeError naming it."""
    folder = step_dir(root, step)
    folder.mkdir(parents=True, exist_ok=True)
    in_flight = strategy.comm.in_flight()
    for handle in in_flight:
        handle.kept = False
    state = {"format": FORMAT, "run": run_id(root.parent), "step": step, "rank": rank,
             "next_cid": strategy.comm.next_cid, "model": model.state_dict(), "strategy": strategy.state_dict(),
             "rng": _rng_state()}
    lost = [handle.cid for handle in in_flight if not handle.kept]
    if lost:
        raise RuntimeError(f"checkpoint: {type(strategy).__name__}.state_dict() does not keep the collective(s) "
                           f"{', '.join(map(str, lost))} still in flight after step {step}: a resume would lose them "
                           "and end elsewhere. Keep each with Handle.state_dict() and rebuild it with "
                           "Communicator.restore_handle() in load_state_dict (as SPARTAStrategy does)")
    where = _not_plain(state, "")
    if where is not None:
        path, value = where
        raise TypeError(f"checkpoint: {path} is a {type(value).__module__}.{type(value).__qualname__}; a checkpoint "
                        "holds tensors and plain values only (dict, list, tuple, int, float, bool, str, None), so that "
                        "loading it runs no code: return those from state_dict()")
    with atomic_file(node_file(folder, rank)) as f:
        torch.save(state, f)


def wait_for_room(root: Path, step: int, beat: Callable[[], None]) -> None:
    """Wait until writing ``step``'s checkpoint leaves at most ``MAX_UNFINISHED`` unfinished ones (``beat``: this
    node's heartbeat, called while it waits: the parent it waits for is alive, it is the one watching).

    A checkpoint whose folder exists already (a faster node made it) never waits: the parent commits in step
    order, so the slower nodes that complete the waiting ones must pass.
    """
    while not step_dir(root, step).exists():
        committed = _committed_step(root)
        unfinished = [f for f in root.glob("step-*") if _step_of(f) > committed]
        if len(unfinished) < MAX_UNFINISHED:
            return
        beat()
        time.sleep(WAIT_S)


def _step_of(folder: Path) -> int:
    number = folder.name.removeprefix("step-")
    return int(number) if number.isdigit() else -1


def _committed_step(root: Path) -> int:
    """The step latest.json names (0 when there is none yet, or while the parent replaces it)."""
    try:
        record = read_json(root / LATEST)
    except TraceError:
        return 0
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) else 0


def _not_plain(value: Any, path: str) -> tuple[str, Any] | None:
    """The first value under ``value`` that ``torch.load(weights_only=True)`` would refuse, with its path."""
    if type(value) in (torch.Tensor, torch.nn.Parameter) or isinstance(value, _PLAIN):
        return None
    if type(value) in (dict, OrderedDict):
        for k, v in value.items():
            found = _not_plain(k, f"{path}[{k!r}] (its key)") or _not_plain(v, f"{path}[{k!r}]")
            if found:
                return found
        return None
    if type(value) in (list, tuple):
        return next((f for i, v in enumerate(value) if (f := _not_plain(v, f"{path}[{i}]"))), None)
    return path or "the state", value


def read_node(file: Path, *, mmap: bool = False) -> dict[str, Any]:
    """A node file read as data (``weights_only``: tensors and plain values, no code), its fields checked.

    ``mmap`` maps the tensors instead of reading them (the parent's checks read only the fields).
    TraceError naming the file when it is unreadable, names a Python object, or is not a node file.
    """
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch's reader names no file: "failed reading zip archive"
        raise TraceError(f"{file}: cannot read the checkpoint ({_reason(exc)})") from None
    if not isinstance(state, dict):
        raise TraceError(f"{file}: not an exonet checkpoint (holds a {type(state).__name__}, not a dict)")
    held = state.get("format", 1)
    if type(held) is not int or held != FORMAT:
        raise TraceError(f"{file}: checkpoint format {held!r:.40}, this exonet reads format {FORMAT} "
                         "(format 1 needed code to load; resume it with the exonet that wrote it, or start again)")
    for key, kind in (("run", str), ("step", int), ("rank", int), ("next_cid", int), ("model", dict),
                      ("strategy", dict), ("rng", dict)):
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            raise TraceError(f"{file}: {key} must be a {kind.__name__}, got {state.get(key)!r:.80}")
    return state


def _reason(exc: Exception) -> str:
    """torch's reason in one line; a refused object is named, without torch's advice to load it anyway."""
    text = str(exc)
    refused = re.search(r"\bGLOBAL ([\w.]+)", text)
    if refused:
        return (f"it names the Python object {refused.group(1)}, which loading would import or call; a checkpoint "
                "holds tensors and plain values only, so it was not loaded")
    if text.startswith("Weights only load failed"):  # then torch's advice, its reason, a pointer to its docs
        why = [part for part in text.split("\n\n") if part.strip() and not part.startswith(("Weights only", "Check"))]
        return "it holds more than tensors and plain values: " + " ".join(" ".join(why).split())[:200]
    text = " ".join(text.split()) or type(exc).__name__
    return text.split(". ")[0][:200]  # torch goes on with advice: "This is an internal miniz error. If you ..."


def load_node(folder: Path, rank: int, model: torch.nn.Module, strategy: Strategy) -> None:
    """Restore model, strategy, RNG states and the collective count written by ``save_node`` (call after
    ``strategy.setup``, before the first collective); TraceError naming the file if they do not fit."""
    file = node_file(folder, rank)
    state = read_node(file)
    if state["rank"] != rank:
        raise TraceError(f"{file}: holds rank {state['rank']}'s checkpoint, not rank {rank}'s")
    try:
        model.load_state_dict(state["model"])
        strategy.load_state_dict(state["strategy"])
        _set_rng_state(state["rng"])
    except Exception as exc:  # the file's values are untrusted data: whatever they break, name the file
        why = " ".join(str(exc).split())[:500]
        raise TraceError(f"{file}: does not fit this fit's model or strategy ({type(exc).__name__}: {why})") from None
    strategy.comm.next_cid = state["next_cid"]


def _rng_state() -> dict[str, Any]:
    """The RNG states, their long integer sequences as tensors: a weights-only load reads a tensor at once,
    but a list of 624 ints one opcode at a time (two thirds of a small node file's load time)."""
    numpy = np.random.get_state(legacy=False)
    version, internal, gauss = random.getstate()
    key = torch.from_numpy(numpy["state"]["key"].astype(np.int64))
    state = {"torch": torch.get_rng_state(), "python": (version, torch.tensor(internal, dtype=torch.int64), gauss),
             "numpy": {**numpy, "state": {**numpy["state"], "key": key}}}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    """Set what ``_rng_state`` saved (or a format-2 file of an earlier exonet, which kept lists of ints)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(_ints(internal)), gauss))
    numpy = state["numpy"]
    np.random.set_state({**numpy, "state": {**numpy["state"],
                                            "key": np.array(_ints(numpy["state"]["key"]), np.uint32)}})
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _ints(values: torch.Tensor | list[int]) -> list[int]:
    if isinstance(values, torch.Tensor):
        if values.dtype != torch.int64 or values.dim() != 1:
            raise ValueError(f"an RNG state must be a 1-d int64 tensor, got {values.dtype} of shape "
                             f"{tuple(values.shape)}")
        return values.tolist()
    return [int(v) for v in values]


# ---------------------------------------------------------------- parent side
class CheckpointBook:
    """The parent's record of checkpoints: counts node reports and commits a step once all K are in.

    Args:
        root: the run's ``checkpoints`` folder.
        num_nodes: K.
    """

    def __init__(self, root: Path, num_nodes: int) -> None:
        self.root, self.num_nodes = root, num_nodes
        self.run = run_id(root.parent)
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
        record: dict[str, Any] = {"step": step, "dir": folder.name, "run": self.run}
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
    """The run's committed checkpoint, every file checked against where it was found (see the module's
    docstring); TraceError naming the file if any part is missing, unreadable or from elsewhere."""
    latest = run_path / "checkpoints" / LATEST
    if not latest.exists():
        interval = read_config(run_path).get("checkpoint_interval")
        why = (f"the run was stopped before its first checkpoint was complete (checkpoint_interval={interval}: the "
               f"first is committed after step {interval}), so there is nothing to resume: start it again"
               if isinstance(interval, int) and interval > 0 else
               "the run was started without checkpoint_interval, so it has no checkpoint to resume from")
        raise TraceError(f"resume_from: {latest} is missing: {why}")
    record = read_json(latest)
    if (not isinstance(record, dict) or not isinstance(record.get("step"), int) or isinstance(record["step"], bool)
            or record["step"] < 1 or not isinstance(record.get("dir"), str) or not isinstance(record.get("run"), str)):
        raise TraceError(f"{latest}: expected {{'step': int >= 1, 'dir': str, 'run': str}}, got {record!r:.300}")
    folder = latest.parent / plain_name(record["dir"], f"{latest}: dir", TraceError)
    run, step = run_id(run_path), record["step"]
    if record["run"] != run:
        raise TraceError(f"{latest}: written by run {record['run']}, but {run_path} is run {run} (its config.json): "
                         "the checkpoints come from another run")
    if not folder.is_dir():
        raise TraceError(f"{latest}: dir: no folder {record['dir']!r} in {latest.parent}")
    for rank in range(num_nodes):
        if not node_file(folder, rank).is_file():
            raise TraceError(f"resume_from: {node_file(folder, rank)} is missing (the checkpoint needs one file "
                             f"per node, num_nodes={num_nodes})")
    trace = Trace.load(folder / "trace.jsonl")
    if trace.num_ranks != num_nodes:
        raise ValueError(f"resume_from: {folder / 'trace.jsonl'} holds {trace.num_ranks} ranks, "
                         f"this fit has num_nodes={num_nodes}")
    history = read_metrics(folder / "metrics.jsonl")
    held = {len(history["train_loss"]), *(trace.num_steps(r) for r in range(num_nodes))}
    if held != {step}:
        raise TraceError(f"{latest}: says step {step}, but {folder.name} holds "
                         f"{' and '.join(map(str, sorted(held)))} steps; the checkpoint is inconsistent "
                         "(edited or mixed from two runs)")
    _check_nodes(folder, num_nodes, run, step, trace)
    return Resume(step, folder, history, trace, _references(record, latest, history, num_nodes))


def _check_nodes(folder: Path, num_nodes: int, run: str, step: int, trace: Trace) -> None:
    """Each node file holds this run's checkpoint of this step, for the rank its name says, having issued the
    collectives its rank's trace holds (a resumed node continues their ids)."""
    states = {rank: read_node(node_file(folder, rank), mmap=True) for rank in range(num_nodes)}
    for rank, state in states.items():
        for what, held, want in (("run", state["run"], run), ("step", state["step"], step)):
            if held != want:
                raise TraceError(f"{node_file(folder, rank)}: holds {what} {held!r}, but {folder.parent / LATEST} "
                                 f"names {what} {want!r}: the file comes from "
                                 f"{'another run' if what == 'run' else 'another checkpoint'}")
    wrong = [f"{node_file(folder, rank)} holds rank {state['rank']}'s checkpoint"
             for rank, state in states.items() if state["rank"] != rank]
    if wrong:
        raise TraceError(f"resume_from: {', '.join(wrong)}; node-<r>.pt must hold rank r's (files swapped or renamed)")
    for rank, state in states.items():
        issued = 1 + max((c.cid for c in trace.collectives(rank)), default=-1)
        if state["next_cid"] != issued:
            raise TraceError(f"{node_file(folder, rank)}: rank {rank} had issued {state['next_cid']} collectives, "
                             f"but {folder / 'trace.jsonl'} holds {issued}: the checkpoint is inconsistent")


def _references(record: dict[str, Any], latest: Path, history: dict[str, list], num_nodes: int) -> dict[int, float]:
    """Each rank's first loss in the run resumed, as latest.json keeps them (exonet.runtime.divergence)."""
    saved = record.get("references")
    if saved is None:  # a checkpoint from before references were kept: the first step's mean loss stands for each
        first = (history.get("train_loss") or [None])[0]
        return {} if first is None else dict.fromkeys(range(num_nodes), float(first))
    try:
        references = {int(rank): float(loss) for rank, loss in saved.items()}
    except (AttributeError, TypeError, ValueError):
        references = {}
    if not references or not set(references) <= set(range(num_nodes)):  # (a pipeline's last stages alone report)
        raise TraceError(f"{latest}: references must map ranks in 0..{num_nodes - 1} to their first loss, "
                         f"got {saved!r:.200}")
    return references
