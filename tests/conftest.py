"""Shared fixtures for the runtime tests (pytest loads this file; test files cannot import each other)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

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
