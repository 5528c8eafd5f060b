"""Run directories: a run's config, metrics and trace on disk, every file written atomically.

Layout of ``<run_dir>/<time>-<label>/``::

    config.json      the resolved configuration and the run's id (``run_id``, which its checkpoints
                     carry too), written when the run starts
    checkpoints/     resumable checkpoints, when asked for (see exonet.runtime.checkpoint)
    metrics.jsonl    one JSON object per line: {"step", "train_loss"} and {"step", "eval": {...}},
                     written as the run goes, then a closing line {"end": true, "lines": N} at its end
    trace.jsonl      the trace (see exonet.trace)
    status.json      {"complete": true|false, "real_time_s": ...}, written last

The folder exists from the start of the run, so checkpoints have a home and an
interrupted run can save what it has. Each file is written under a temporary name and
renamed into place, and status.json comes last: a folder without it is a run still
going (or one whose process was killed outright); ``complete: false`` marks a run that
failed or was interrupted after saving its history and trace so far.

The folder given to ``fit(run_dir=...)`` holds such runs one level down; ``find_runs``
resolves either kind of path to run directories, for ``exonet simulate`` and ``compare``.

Every file here is read back as data: JSON (``read_json``, ``read_metrics``), the trace's JSON
lines (exonet.trace) and checkpoints through ``torch.load(weights_only=True)``; nothing read
from a run directory can run code. What is read is checked: a file must be a regular file, and
the metrics' and config's keys are plain identifiers (``SAFE_KEY``) with numbers for values, so a
crafted key cannot travel on into a CSV, a log or a shell. Nothing is written through a link
(exonet.files), and a resume refuses a run directory holding links (``check_links``).
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator

from exonet.errors import TraceError
from exonet.files import atomic_file, open_regular, read_regular, temp_name
from exonet.trace import Trace

# A key read back from a run (metrics, evaluations, config): an identifier, nothing a shell or a CSV would act on.
SAFE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,63}")
# The files a fit writes in a run directory it resumes: never through a link, whatever follow_symlinks says.
WRITTEN = ("metrics.jsonl", "trace.jsonl", "status.json", "train.csv", "validation.csv", "run.lock",
           "checkpoints/latest.json")


def write_json(path: Path, value: Any) -> None:
    with atomic_file(path) as f:
        f.write((json.dumps(value, indent=2, default=repr) + "\n").encode())


def create_run(root: str | os.PathLike, label: str, config: dict[str, Any]) -> Path:
    """Create a fresh, uniquely named run folder under ``root`` (race-free) holding config.json."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{label}"
    path, n = root / base, 1
    while True:
        try:
            path.mkdir()
            break
        except FileExistsError:
            n += 1
            path = root / f"{base}-{n}"
    write_json(path / "config.json", {**config, "run_id": uuid.uuid4().hex})
    return path


def run_id(path: Path) -> str:
    """The id in a run's config.json, which each of its checkpoints carries: a checkpoint from another run
    is told apart by it. TraceError when config.json has none."""
    file = path / "config.json"
    value = read_config(path).get("run_id")
    if not isinstance(value, str) or not value:
        raise TraceError(f"{file}: no run_id: the run was started by an exonet older than checkpoints that load "
                         "without code (or the file was edited), so its checkpoints cannot be resumed")
    return value


def reopen_run(path: Path) -> tuple[dict[str, Any] | None, int]:
    """A resumed run is running again: drop the old status so the folder no longer looks finished.

    Returns the status it had and how many steps its metrics hold: a resumed fit that fails before
    passing them puts that status back (``restore_status``) rather than overwrite the run with less.
    """
    status = path / "status.json"
    try:
        old = read_json(status) if status.exists() else None
        held = len(read_metrics(path / "metrics.jsonl")["train_loss"])
    except TraceError:  # a run killed before it could save: nothing whole to keep
        old, held = None, 0
    status.unlink(missing_ok=True)
    return old, held


def restore_status(path: Path, status: dict[str, Any] | None) -> None:
    """Put back the status ``reopen_run`` dropped (nothing, when the run had none)."""
    if status is not None:
        write_json(path / "status.json", status)


def metric_lines(history: dict[str, list], losses_from: int = 0, evals_from: int = 0) -> list[str]:
    """metrics.jsonl's lines for the history's losses and evaluations from the given positions on."""
    losses = history.get("train_loss", [])[losses_from:]
    lines = [json.dumps({"step": step, "train_loss": loss}) for step, loss in enumerate(losses, start=losses_from + 1)]
    return lines + [json.dumps({"step": ev["step"], "eval": ev}) for ev in history.get("eval", [])[evals_from:]]


def write_metrics(file: Path, history: dict[str, list]) -> None:
    lines = metric_lines(history)
    lines.append(json.dumps({"end": True, "lines": len(lines)}))
    with atomic_file(file) as f:
        f.write(("\n".join(lines) + "\n").encode())


class MetricsLog:
    """metrics.jsonl written as the run goes: each new loss and evaluation appended and flushed.

    The first ``sync`` writes the file whole (a resumed run's earlier steps first, so a resume that
    fails before its first step leaves the file as it was); ``write_metrics`` replaces it at the end
    with the closing line, which a live file lacks. A write that fails (a full disk) is warned about
    once and streaming stops; the run goes on, and its final write says what failed.
    """

    def __init__(self, file: Path, history: dict[str, list]) -> None:
        self.file, self.history = file, history
        self._out: Any = None
        self._written = (0, 0)  # losses and evaluations in the file
        self._failed = False

    def sync(self) -> None:
        """Write what the history gained since the last call."""
        if self._failed:
            return
        losses, evals = len(self.history["train_loss"]), len(self.history["eval"])
        try:
            if self._out is None:
                with atomic_file(self.file) as f:
                    f.write("".join(line + "\n" for line in metric_lines(self.history)).encode())
                self._out = os.fdopen(open_regular(self.file, os.O_WRONLY | os.O_APPEND), "a", encoding="utf-8")
            else:
                self._out.write("".join(line + "\n" for line in metric_lines(self.history, *self._written)))
                self._out.flush()
        except OSError as exc:
            self._failed = True
            warnings.warn(f"fit: cannot write {self.file} as the run goes ({exc}); training goes on", stacklevel=2)
            return
        self._written = (losses, evals)

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


def write_run(path: Path, history: dict[str, list], trace: Trace, complete: bool, real_time_s: float) -> Path:
    """Save the history and trace into the run folder, then status.json last."""
    write_metrics(path / "metrics.jsonl", history)
    trace.save(path / "trace.jsonl")
    write_json(path / "status.json", {"complete": complete, "real_time_s": real_time_s})
    return path


def load_run(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, list], Trace]:
    """Read a run directory back: (config, history, trace). Defects raise TraceError naming the file.

    A run that failed or was interrupted (``run_status(path)["complete"]`` is False) loads too:
    its history and trace are what it recorded before stopping.
    """
    path = Path(path)
    if not path.is_dir():
        raise TraceError(f"{path}: not a run directory (expected a folder with config.json, metrics.jsonl, "
                         "trace.jsonl, status.json)")
    run_status(path)
    return read_config(path), read_metrics(path / "metrics.jsonl"), Trace.load(path / "trace.jsonl")


def find_runs(path: str | os.PathLike) -> tuple[list[Path], list[str]]:
    """The run directories a path names, and a note for each run it leaves out.

    A run directory names itself (complete or not: an incomplete one still has what it
    recorded). A folder of runs, as given to ``fit(run_dir=...)``, names every complete run
    one level down, oldest first (folder names start with the start time); the incomplete
    and unfinished ones are left out with a note. A folder with no run in it is a TraceError
    saying what it holds.
    """
    path = Path(path)
    if not path.is_dir():
        raise TraceError(f"{path}: no such run directory or folder of runs")
    if (path / "config.json").exists():
        return [path], []
    candidates = sorted(p for p in path.iterdir() if p.is_dir() and (p / "config.json").exists())
    runs, notes = [], []
    for run in candidates:
        why = incomplete(run)
        if why is None:
            runs.append(run)
        else:
            notes.append(f"{run}: left out: {why}")
    if runs:
        return runs, notes
    if candidates:
        raise TraceError(f"{path}: no complete run in this folder ({'; '.join(notes)}); name a run directory "
                         "itself to simulate what it recorded")
    held = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    what = "nothing (it is empty)" if not held else ", ".join(held[:10]) + (f" and {len(held) - 10} more"
                                                                           if len(held) > 10 else "")
    raise TraceError(f"{path}: no run directory in this folder (a run directory holds config.json, metrics.jsonl, "
                     f"trace.jsonl and status.json; fit(run_dir=...) makes one per run inside it); it holds {what}")


def incomplete(run: Path) -> str | None:
    """Why a run directory is not a complete run, or None when it is."""
    if not (run / "status.json").exists():
        return "no status.json: the run is still going, or its process was killed before it could save"
    if run_status(run)["complete"]:
        return None
    steps = len(read_metrics(run / "metrics.jsonl")["train_loss"])
    planned = read_config(run).get("max_steps", "?")
    return f"incomplete: it failed or was interrupted after {steps} of {planned} steps (those steps can be simulated)"


def run_status(path: str | os.PathLike) -> dict[str, Any]:
    """status.json of a run: ``complete`` (bool) and ``real_time_s``; TraceError if absent or unreadable."""
    file = Path(path) / "status.json"
    if not file.exists():
        raise TraceError(f"{file}: missing: the run is still going, or its process was killed before it could save")
    status = read_json(file)
    if not isinstance(status, dict) or not isinstance(status.get("complete"), bool):
        raise TraceError(f"{file}: expected an object with a boolean 'complete', got {status!r}")
    return status


def read_metrics(file: Path) -> dict[str, list]:
    """metrics.jsonl as a history: each line checked (keys from ``SAFE_KEY``, values numbers); TraceError naming
    the file and line for anything else."""
    history: dict[str, list] = {"train_loss": [], "eval": []}
    try:
        lines = read_regular(file, TraceError).decode("utf-8").splitlines()
    except FileNotFoundError:
        raise TraceError(f"{file}: missing from the run directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{file}: cannot read ({exc})") from None
    for lineno, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"expected an object, got {type(row).__name__}")
            if row.get("end") is True:
                if lineno != len(lines) or row.get("lines") != lineno - 1:
                    raise ValueError(f"closing line says {row.get('lines')} lines, the file holds {lineno - 1} "
                                     f"before it and {len(lines) - lineno} after")
                return history
            if "train_loss" in row:
                history["train_loss"].append(float(_number(row["train_loss"], "train_loss")))
            else:
                history["eval"].append(_evaluation(row["eval"]))
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError, RecursionError) as exc:
            raise TraceError(f"{file}:{lineno}: bad metrics line ({exc})") from None
    raise TraceError(f"{file}: truncated (no closing line; read {len(lines)} lines)")


def _number(value: Any, key: str) -> int | float | bool:
    """``value`` if it is a number (a flag counts: an evaluation's ``final``); else ValueError naming ``key``."""
    if not isinstance(value, (int, float)):
        raise ValueError(f"{key!r} must be a number, got {value!r:.80}")
    return value


def _evaluation(entry: Any) -> dict[str, Any]:
    """An evaluation read back: an object with an integer ``step``, identifier keys and number values."""
    if not isinstance(entry, dict) or type(entry.get("step")) is not int:
        raise ValueError(f"an evaluation must be an object with an integer 'step', got {entry!r:.80}")
    for key, value in entry.items():
        if not SAFE_KEY.fullmatch(key):
            raise ValueError(f"evaluation key {key!r:.80} is not an identifier ({SAFE_KEY.pattern})")
        _number(value, key)
    return dict(entry)


def read_config(run: Path) -> dict[str, Any]:
    """A run's config.json: a JSON object (plain data: it runs no code) whose keys are identifiers (``SAFE_KEY``),
    or TraceError naming the file."""
    file = run / "config.json"
    config = read_json(file)
    if not isinstance(config, dict):
        raise TraceError(f"{file}: expected a JSON object, got {type(config).__name__}")
    bad = next((key for key in config if not SAFE_KEY.fullmatch(key)), None)
    if bad is not None:
        raise TraceError(f"{file}: key {bad!r:.80} is not an identifier ({SAFE_KEY.pattern}); this is not the "
                         "config.json exonet wrote")
    return config


def read_json(file: Path) -> Any:
    """A JSON file of a run directory as data, or TraceError naming it (a ValueError, as every malformed file)."""
    try:
        return json.loads(read_regular(file, TraceError).decode("utf-8"))
    except FileNotFoundError:
        raise TraceError(f"{file}: missing from the run directory") from None
    except TraceError:
        raise
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not JSON, an integer too long
        raise TraceError(f"{file}: cannot read ({type(exc).__name__}: {exc})") from None


def check_links(run: Path, follow_symlinks: bool = False) -> None:
    """Refuse a run directory to resume that holds a symbolic link, naming it (TraceError).

    A link in a run directory from someone else can point anywhere: a resumed fit would read from there, and
    write there. Links among the run's top-level entries and anywhere under ``checkpoints/`` are refused;
    ``follow_symlinks`` lets a trusted run read through them (``checkpoints/`` on another disk, say), but the
    files a fit writes (``WRITTEN``) are never links.
    """
    for path in _entries(run, follow_symlinks):
        if not path.is_symlink():
            continue
        written = path.relative_to(run).as_posix() in WRITTEN
        if follow_symlinks and not written:
            continue
        why = ("a resumed fit writes this file, and exonet never writes through a link (follow_symlinks=True "
               "reads through links, it does not write through them)" if written else
               "a resumed fit would read or write where it points; replace it with the file or folder itself, or "
               "pass follow_symlinks=True if you trust this run directory")
        raise TraceError(f"resume_from: {path} is a symbolic link (to {os.readlink(path)!r}): {why}")


def _entries(run: Path, follow_symlinks: bool) -> Iterator[Path]:
    """The run's top-level entries and everything under ``checkpoints/`` (through links only when following)."""
    yield from (Path(entry.path) for entry in os.scandir(run))
    checkpoints = run / "checkpoints"
    if checkpoints.is_dir() and (follow_symlinks or not checkpoints.is_symlink()):
        for folder, dirs, files in os.walk(checkpoints, followlinks=follow_symlinks):
            yield from (Path(folder) / name for name in [*dirs, *files])


def drop_leftovers(run: Path) -> list[Path]:
    """Remove the temporary files a killed fit left in ``run`` and under ``checkpoints/``; returns them.

    Call only while holding the run's lock (exonet.runtime.runlock): then no other fit is writing them (and
    after ``check_links``: a linked folder is then one the user trusts).
    """
    folders = [run, run / "checkpoints", *sorted((run / "checkpoints").glob("step-*"))]
    dropped = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for entry in os.scandir(folder):
            if temp_name(entry.name) and not entry.is_dir(follow_symlinks=False):
                Path(entry.path).unlink(missing_ok=True)
                dropped.append(Path(entry.path))
    return dropped
