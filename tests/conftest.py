"""Shared fixtures for the runtime tests (pytest loads this file; test files cannot import each other)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest


def _node_pids() -> list[int]:
    """Live children of the forkserver that starts nodes (every node is one).

    Other children of the test process (a wandb service, a subprocess of another test) are not nodes.
    """
    from multiprocessing import forkserver

    parents = {getattr(forkserver._forkserver, "_forkserver_pid", None)} - {None}
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip()) in parents and fields.get("State", "").strip()[:1] != "Z":
            if b"resource_tracker" not in cmdline and b"forkserver" not in cmdline:
                pids.append(int(status.parent.name))
    return pids


@pytest.fixture
def node_pids() -> Callable[[], list[int]]:
    """A function listing node processes left running (it should return [] after every fit)."""
    return _node_pids


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            ppid = next(int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("PPid:"))
        except (OSError, StopIteration):
            continue
        children.setdefault(ppid, []).append(int(status.parent.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State:"))
    except (OSError, StopIteration):
        return False
    return "Z" not in state.split()[1]


def _left_running(pids: set[int], within_s: float = 5.0) -> list[int]:
    """Those of ``pids`` still running (not zombies) once ``within_s`` has passed or all have ended."""
    deadline = time.monotonic() + within_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return sorted(pid for pid in pids if _alive(pid))


@pytest.fixture
def descendants() -> Callable[[int], set[int]]:
    """A function giving every process below a pid: its children, theirs, and so on (from /proc)."""
    return _descendants


@pytest.fixture
def left_running() -> Callable[..., list[int]]:
    """A function giving those of a set of pids still running after a few seconds' grace (it should return [])."""
    return _left_running


@pytest.fixture
def running_fit(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, Path]]:
    """tests/interrupt_fit.py (a fit that runs until stopped) in a subprocess, once training is under way (its
    first checkpoint committed): the process and its run directory. Killed after the test if still running."""
    script = Path(__file__).with_name("interrupt_fit.py")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("*/checkpoints/latest.json")):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "training never got under way"
            time.sleep(0.1)
        (run,) = tmp_path.iterdir()
        yield proc, run
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


FUZZ_WORKER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("fuzz_worker", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps([module.fuzz(*job) for job in json.loads(sys.argv[2])]))
"""


def _fuzz_in_processes(test_file: Path, workers: list[list[tuple]], timeout_s: float = 1200) -> list[int]:
    """Run ``fuzz(*job)`` of ``test_file`` for each worker's jobs, the workers at once (one Hypothesis loop is one
    process on one core; a 2-core machine's other core would sit idle); returns the examples each job ran. A
    worker's failure (Hypothesis's falsifying example and traceback) fails the test with its output."""
    procs = [subprocess.Popen([sys.executable, "-c", FUZZ_WORKER, str(test_file), json.dumps(jobs)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for jobs in workers]
    ran = []
    try:
        for proc, jobs in zip(procs, workers):
            out, err = proc.communicate(timeout=timeout_s)
            assert proc.returncode == 0, f"fuzz worker {jobs} exited {proc.returncode}:\n{out[-2000:]}\n{err[-8000:]}"
            ran += json.loads(out.splitlines()[-1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return ran


@pytest.fixture
def fuzz_in_processes() -> Callable[..., list[int]]:
    """A function running a fuzz module's ``fuzz(*job)`` calls in parallel worker processes (see above)."""
    return _fuzz_in_processes
