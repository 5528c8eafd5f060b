"""Proportional set size (PSS) of a process tree, sampled while a run goes: what a run costs in RAM.

PSS divides each shared page among the processes that map it, so summing it over the
parent, the forkserver and the K nodes counts a shared dataset once and a copied one K
times (RSS would count shared pages K times). Read from ``/proc/PID/smaps_rollup`` (Linux).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any


def pss(pid: int) -> dict[str, int]:
    """The ``Pss*`` lines of a process's smaps_rollup, in bytes ({} once the process is gone)."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("Pss"):
            key, value = line.split(":", 1)
            out[key] = int(value.split()[0]) * 1024
    return out


def descendants(root: int) -> list[int]:
    """``root`` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


class TreeSampler:
    """Samples the summed PSS of this process and its descendants in a thread; keeps the peak and every sample.

    Use as a context manager around the run; ``peak`` is bytes, ``peak_detail`` maps each pid at the
    peak to its Pss lines, ``samples`` lists (summed bytes, process count).
    """

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self.peak_detail: dict[int, dict[str, int]] = {}
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            detail = {pid: pss(pid) for pid in descendants(os.getpid())}
            total = sum(d.get("Pss", 0) for d in detail.values())
            self.samples.append((total, len(detail)))
            if total > self.peak:
                self.peak, self.peak_detail = total, detail
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "TreeSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


MIB = 2**20
