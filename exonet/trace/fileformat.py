"""A trace on disk.

File format (line-oriented JSON, one value per line, UTF-8)::

    {"format": "exonet-trace", "version": 1, "num_ranks": K, "meta": {...}}   # K: trainers + servers
    ["c", rank, wall_s, cpu_s, flops]                                   # Compute
    ["x", rank, cid, op, nbytes, group|null, async 0|1, dtype, start_s|null, end_s|null(, key)]  # a put/get: key
    ["w", rank, cid]                                                    # Wait
    ["s", rank]                                                         # Step
    ["d", rank]                                                         # Discard
    {"end": true, "events": N}

The closing line lets a reader tell a complete file from a truncated one. Reading checks
every value as the builder does, and any defect is a TraceError naming the file and line:
strict JSON (no NaN or Infinity in events), times finite and in [0, MAX_SECONDS], byte
counts integers in [0, 2**63), ids unique per rank, a wait naming an earlier async
collective of its rank, a group of distinct ranks in range that holds the issuing rank.
A group is stored canonically, sorted and with the whole world as null, so ``[1, 0]``
is ``(0, 1)`` and ``[0, 1, 2]`` of three nodes is null, and equal groups match.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from exonet.errors import TraceError
from exonet.files import atomic_file
from exonet.trace.events import (
    DISCARD,
    STEP,
    Collective,
    Compute,
    Discard,
    Event,
    Wait,
    checked_collective,
    checked_compute,
    checked_integer,
)

FORMAT = "exonet-trace"
VERSION = 1
MAX_NODES = 1 << 20  # a header claiming more is corrupt; loading would allocate a list per node


def write(path: str | os.PathLike, num_ranks: int, meta: dict[str, Any], events: list[list[Event]]) -> Path:
    """Write a trace atomically (a temporary file renamed into place)."""
    n = 0
    with atomic_file(path, "w") as f:
        f.write(json.dumps({"format": FORMAT, "version": VERSION, "num_ranks": num_ranks, "meta": meta}) + "\n")
        for rank, evs in enumerate(events):
            for e in evs:
                f.write(json.dumps(_encode(rank, e), separators=(",", ":")) + "\n")
                n += 1
        f.write(json.dumps({"end": True, "events": n}) + "\n")
    return Path(path)


def read(path: Path) -> tuple[int, dict[str, Any], list[list[Event]]]:
    """A file's ranks, meta and events per rank; any defect raises TraceError naming the file and line."""
    text = _read_text(path)
    lines = text.splitlines()
    num_ranks, meta = _read_header(path, text, lines)
    return num_ranks, meta, _read_events(path, lines, num_ranks)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read trace ({exc})") from None


def _read_header(path: Path, text: str, lines: list[str]) -> tuple[int, dict[str, Any]]:
    """The first line's node count and meta; ``text`` tells a JSON document that is not a trace from garbage."""
    if not lines:
        raise TraceError(f"{path}: empty file, expected an exonet trace")
    try:
        header = _parse_line(path, 1, lines[0], strict=False)  # meta is free-form: Python's NaN may sit in it
    except TraceError:
        if _is_json(text):  # a JSON document (a run's config.json, a Chrome trace): the wrong file
            raise TraceError(f"{path}: one JSON document, not an exonet trace (a trace is JSON Lines, a header "
                             f"then one event per line: a run directory's trace.jsonl)") from None
        raise
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise TraceError(f"{path}:1: not an exonet trace (expected a header with format={FORMAT!r})")
    if header.get("version") != VERSION:
        raise TraceError(f"{path}:1: unsupported trace version {header.get('version')!r}, expected {VERSION}")
    key = "num_ranks" if "num_ranks" in header else "num_nodes"  # files before 0.1.0's rename said num_nodes
    num_ranks = header.get(key)
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or not 1 <= num_ranks <= MAX_NODES:
        raise TraceError(f"{path}:1: {key} must be an integer in [1, {MAX_NODES}], got {num_ranks!r}")
    meta = header.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise TraceError(f"{path}:1: meta must be an object, got {type(meta).__name__}")
    return num_ranks, dict(meta or {})


def _read_events(path: Path, lines: list[str], num_nodes: int) -> list[list[Event]]:
    """Each rank's events from the lines after the header, up to the closing line, which must end the file
    and count them."""
    events: list[list[Event]] = [[] for _ in range(num_nodes)]
    reader = _Reader(num_nodes)
    footer = None
    for lineno, line in enumerate(lines[1:], start=2):
        value = _parse_line(path, lineno, line)
        if isinstance(value, dict):
            footer = value
            if lineno != len(lines):
                raise TraceError(f"{path}:{lineno}: closing line before the end of the file")
            break
        try:
            rank, event = reader.decode(value)
        except (ValueError, TypeError) as exc:
            raise TraceError(f"{path}:{lineno}: bad event {line[:80]!r} ({exc})") from None
        events[rank].append(event)
    n = sum(len(e) for e in events)
    if footer is None or footer.get("end") is not True:
        raise TraceError(f"{path}: truncated trace (no closing line; read {n} events)")
    if footer.get("events") != n:
        raise TraceError(f"{path}: closing line says {footer.get('events')} events, file holds {n}")
    return events


def _encode(rank: int, e: Event) -> list:
    if isinstance(e, Compute):
        return ["c", rank, e.wall_s, e.cpu_s, e.flops]
    if isinstance(e, Collective):
        line = ["x", rank, e.cid, e.op, e.nbytes, list(e.group) if e.group else None, int(e.async_op), e.dtype,
                e.start_s, e.end_s]
        return line if e.key is None else [*line, e.key]
    if isinstance(e, Wait):
        return ["w", rank, e.cid]
    if isinstance(e, Discard):
        return ["d", rank]
    return ["s", rank]


class _Reader:
    """Decodes a file's event lines, keeping what the builder knows: ids issued and async ids to wait on."""

    _ARITY = {"c": 5, "x": 10, "w": 3, "s": 2, "d": 2}

    def __init__(self, num_nodes: int) -> None:
        self.num_nodes = num_nodes
        self.cids: list[set[int]] = [set() for _ in range(num_nodes)]
        self.async_cids: list[set[int]] = [set() for _ in range(num_nodes)]

    def decode(self, v: Any) -> tuple[int, Event]:
        if not isinstance(v, list) or not v or v[0] not in self._ARITY:
            raise ValueError(f"expected an event [kind, rank, ...] with kind one of {', '.join(self._ARITY)}")
        kind = v[0]
        keyed = kind == "x" and len(v) == 11  # a store op: its key last
        if len(v) != self._ARITY[kind] and not keyed:
            raise ValueError(f"a {kind!r} event has {self._ARITY[kind]} fields, got {len(v)}")
        rank = v[1]
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.num_nodes:
            raise ValueError(f"rank {rank!r} out of range [0, {self.num_nodes})")
        if kind == "c":
            return rank, checked_compute(v[2], v[3], v[4])
        if kind == "x":
            if v[6] not in (0, 1) or isinstance(v[6], float):
                raise ValueError(f"async must be 0 or 1, got {v[6]!r}")
            e = checked_collective(rank, self.num_nodes, v[2], v[3], v[4], v[5], bool(v[6]), v[7], v[8], v[9],
                            v[10] if keyed else None)
            if e.cid in self.cids[rank]:
                raise ValueError(f"rank {rank} issued collective id {e.cid} twice")
            self.cids[rank].add(e.cid)
            if e.async_op:
                self.async_cids[rank].add(e.cid)
            return rank, e
        if kind == "w":
            cid = checked_integer("cid", v[2])
            if cid not in self.async_cids[rank]:
                raise ValueError(f"rank {rank} waits for collective id {cid}, which it has not issued as async")
            return rank, Wait(cid)
        if kind == "d":
            return rank, DISCARD
        return rank, STEP


def _parse_line(path: Path, lineno: int, line: str, strict: bool = True) -> Any:
    try:
        return json.loads(line, parse_constant=_reject_constant if strict else None)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    except ValueError as exc:  # NaN / Infinity, which Python writes and JSON lacks
        raise TraceError(f"{path}:{lineno}: not valid JSON ({exc})") from None
    except RecursionError:
        raise TraceError(f"{path}:{lineno}: not valid JSON (nested too deeply)") from None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
