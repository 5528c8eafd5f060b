"""Run directories: a run's config, metrics and trace on disk, written atomically.

Layout of ``<run_dir>/<name>/``::

    config.json      the resolved configuration (strategy, hyperparameters, K, steps, seed ...)
    metrics.jsonl    one JSON object per line: {"step", "train_loss"} and {"step", "eval": {...}}
    trace.jsonl      the trace (see exonet.trace)
    status.json      {"complete": true|false, "real_time_s": ...}

Everything is written into a hidden temporary folder that is renamed into place
last, so a crash never leaves a directory that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from exonet.errors import TraceError
from exonet.trace import Trace


def new_run_path(root: str | os.PathLike, label: str) -> Path:
    """A fresh, unique run folder name under ``root`` (not yet created)."""
    root = Path(root)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = f"{stamp}-{label}"
    path, n = root / base, 1
    while path.exists():
        n += 1
        path = root / f"{base}-{n}"
    return path


def write_run(path: Path, config: dict[str, Any], history: dict[str, list], trace: Trace,
              complete: bool, real_time_s: float) -> Path:
    """Write the run to ``path`` atomically (temporary folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=repr) + "\n", encoding="utf-8")
        with open(tmp / "metrics.jsonl", "w", encoding="utf-8") as f:
            for step, loss in enumerate(history.get("train_loss", []), start=1):
                f.write(json.dumps({"step": step, "train_loss": loss}) + "\n")
            for ev in history.get("eval", []):
                f.write(json.dumps({"step": ev["step"], "eval": ev}) + "\n")
        trace.save(tmp / "trace.jsonl")
        (tmp / "status.json").write_text(json.dumps({"complete": complete, "real_time_s": real_time_s}) + "\n",
                                         encoding="utf-8")
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def load_run(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, list], Trace]:
    """Read a run directory back: (config, history, trace). Defects raise TraceError naming the file."""
    path = Path(path)
    if not path.is_dir():
        raise TraceError(f"{path}: not a run directory (expected a folder with config.json, metrics.jsonl, trace.jsonl)")
    config = _read_json(path / "config.json")
    history: dict[str, list] = {"train_loss": [], "eval": []}
    metrics = path / "metrics.jsonl"
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TraceError(f"{metrics}: cannot read ({exc.strerror or exc})") from None
    for lineno, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
            if "train_loss" in row:
                history["train_loss"].append(float(row["train_loss"]))
            else:
                history["eval"].append(dict(row["eval"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"{metrics}:{lineno}: bad metrics line ({exc})") from None
    return config, history, Trace.load(path / "trace.jsonl")


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TraceError(f"{file}: missing from the run directory") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{file}: cannot read ({exc})") from None
