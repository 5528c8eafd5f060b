"""The Chrome/Perfetto trace of a replay (``SimResult.to_chrome_trace``): what each node and link did.

Layout (open in ui.perfetto.dev or chrome://tracing):

* one process per node ("node r", pid r) whose thread (tid r) holds its compute / comm / idle
  spans, which tile the run;
* under it, each collective and message the node took part in as an async slice: name = op
  (``all_reduce``, ``send → 3``, ``recv ← 0``; "(async)" when issued asynchronously, so it
  overlaps the node's compute), args = op, bytes, group, algorithm, async. Overlapping slices
  get sub-tracks of their own;
* an arrow (flow event) per point-to-point message, from the sender's track where it left to
  the receiver's where it arrived;
* a process "network" (pid = number of nodes) with a counter track per link that carried
  bytes: its utilisation per window (``SimResult.link_series``).

The file is strict JSON: a time that is not finite raises ValueError instead of writing
``nan`` or ``inf``, which JSON lacks and viewers reject.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from exonet.files import atomic_file
from exonet.netsim.spans import IDLE, KINDS

WINDOWS = 200  # counter samples per link over the run


def write(result: Any, path: str | os.PathLike) -> Path:
    """Write ``result`` (a SimResult, which calls this; not imported, so the two form no circle) as Chrome
    trace JSON at ``path`` (atomically) and return the path."""

    path = Path(path)
    events: list[str] = []
    n = len(result.timelines)
    for rank, line in enumerate(result.timelines):
        events.append(_meta("process_name", rank, rank, f"node {rank}"))
        events.append(_meta("thread_name", rank, rank, f"node {rank}"))
        spans = [(line.times[2 * i], line.times[2 * i + 1], line.kinds[i]) for i in range(len(line.kinds))]
        if result.wall_clock_s > line.end:
            spans.append((line.end, result.wall_clock_s, IDLE))
        events.extend(
            f'{{"ph": "X", "pid": {rank}, "tid": {rank}, "name": "{KINDS[kind]}", "cat": "{KINDS[kind]}", '
            f'"ts": {_us(start, rank)}, "dur": {_us(end - start, rank)}}}'
            for start, end, kind in spans
        )
    events.extend(_collectives(result, n))
    events.extend(_links(result, n))
    with atomic_file(path, "w") as f:
        f.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        f.write(",\n".join(events))
        f.write("\n]}\n")
    return path


def _collectives(result: Any, n: int) -> Iterator[str]:
    """Each collective as an async slice on every member, each message's arrow from sender to receiver."""
    for i, c in enumerate(result.collectives):
        args = {"op": c.op, "bytes": c.nbytes, "group": list(c.group), "algorithm": c.algorithm, "async": c.async_op}
        start, end = _us(c.start_s, c.group[0]), _us(c.end_s, c.group[0])
        if c.op == "send":
            src, dst = c.group
            sides = [(src, f"send → {dst}"), (dst, f"recv ← {src}")]
        else:
            name = f"{c.op} (async)" if c.async_op else c.op
            sides = [(rank, name) for rank in c.group]
        for rank, name in sides:
            common = (f'"cat": "collective", "pid": {rank}, "tid": {rank}, "id": {i * n + rank}, '
                      f'"name": {json.dumps(name)}')
            yield f'{{"ph": "b", {common}, "ts": {start}, "args": {json.dumps(args)}}}'
            yield f'{{"ph": "e", {common}, "ts": {end}}}'
        if c.op == "send":
            yield (f'{{"ph": "s", "cat": "message", "name": "message", "id": {i}, "pid": {src}, "tid": {src}, '
                   f'"ts": {start}}}')
            yield (f'{{"ph": "f", "bp": "e", "cat": "message", "name": "message", "id": {i}, '
                   f'"pid": {dst}, "tid": {dst}, "ts": {end}}}')


def _links(result: Any, n: int) -> Iterator[str]:
    """A counter track per link that carried bytes: its utilisation in each window of the run."""
    used = [i for i, link in enumerate(result.links) if link.bytes > 0]
    if not used:
        return
    yield _meta("process_name", n, 0, f"network: {result.scenario_name or 'exonet simulation'}")
    edges, series = result.link_series(WINDOWS, used)
    for row, i in zip(series, used):
        name = json.dumps(result.links[i].name)
        for t, value in zip(edges, [*row.tolist(), 0.0]):
            yield (f'{{"ph": "C", "pid": {n}, "tid": 0, "name": {name}, "ts": {_us(float(t), -1)}, '
                   f'"args": {{"utilization": {value!r}}}}}')


def _meta(kind: str, pid: int, tid: int, name: str) -> str:
    return json.dumps({"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}})


def _us(seconds: float, rank: int) -> str:
    """``seconds`` in microseconds as a JSON number (Python's repr, which round-trips)."""
    us = seconds * 1e6
    if not math.isfinite(us):
        where = "the network" if rank < 0 else f"node {rank}"
        raise ValueError(f"SimResult.to_chrome_trace: {where} has a span of {seconds!r} s; "
                         "a Chrome trace needs finite times")
    return repr(us)
