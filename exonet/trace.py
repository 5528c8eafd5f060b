"""Trace: what every node did, in order, so a network model can replay it.

A trace holds one ordered event list per node. Events are:

* ``Compute``: a span of local work between two communications (wall seconds,
  thread-CPU seconds and, when counted, FLOPs).
* ``Collective``: a collective this node issued (op, payload bytes, dtype, group,
  whether it was async, and the real start/end seconds when recorded).
* ``Wait``: the node blocked until one of its own async collectives finished.
* ``Step``: the end of a training step.

The k-th collective a rank issues on a group matches the k-th collective of every
other member on that group; that is how the simulator pairs them.

File format (line-oriented JSON, one value per line, UTF-8)::

    {"format": "exonet-trace", "version": 1, "num_nodes": K, "meta": {...}}
    ["c", rank, wall_s, cpu_s, flops]                                   # Compute
    ["x", rank, cid, op, nbytes, group|null, async 0|1, dtype, start_s|null, end_s|null]
    ["w", rank, cid]                                                    # Wait
    ["s", rank]                                                         # Step
    {"end": true, "events": N}

The closing line lets a reader tell a complete file from a truncated one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Union

from exonet.errors import TraceError

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
FORMAT = "exonet-trace"
VERSION = 1


@dataclass(slots=True, frozen=True)
class Compute:
    """Local work between communications."""

    wall_s: float
    cpu_s: float
    flops: float = 0.0


@dataclass(slots=True, frozen=True)
class Collective:
    """One collective issued by one rank. ``nbytes`` is the payload this rank passes in."""

    cid: int
    op: str
    nbytes: int
    group: tuple[int, ...] | None = None
    async_op: bool = False
    dtype: str = "float32"
    start_s: float | None = None
    end_s: float | None = None


@dataclass(slots=True, frozen=True)
class Wait:
    """The rank blocks until its own async collective ``cid`` has finished."""

    cid: int


@dataclass(slots=True, frozen=True)
class Step:
    """End of a training step on this rank."""


Event = Union[Compute, Collective, Wait, Step]
_STEP = Step()


@dataclass
class Trace:
    """Per-node ordered events of a run (recorded or built by hand).

    Args:
        num_nodes: how many ranks the trace covers.
        meta: free-form facts about the run (strategy, parameter count, ...).
    """

    num_nodes: int
    meta: dict[str, Any] = field(default_factory=dict)
    events: list[list[Event]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.num_nodes, int) or isinstance(self.num_nodes, bool) or self.num_nodes < 1:
            raise ValueError(f"Trace: num_nodes must be an integer >= 1, got {self.num_nodes!r}")
        if not self.events:
            self.events = [[] for _ in range(self.num_nodes)]
        elif len(self.events) != self.num_nodes:
            raise ValueError(f"Trace: events has {len(self.events)} node lists, expected num_nodes={self.num_nodes}")
        self._next_cid = [
            1 + max((e.cid for e in evs if isinstance(e, Collective)), default=-1) for evs in self.events
        ]

    # ----------------------------------------------------------------- builder
    def _rank(self, rank: int) -> list[Event]:
        if not isinstance(rank, int) or not 0 <= rank < self.num_nodes:
            raise ValueError(f"Trace: rank must be in [0, {self.num_nodes}), got {rank!r}")
        return self.events[rank]

    def add_compute(self, rank: int, seconds: float, *, cpu_s: float | None = None, flops: float = 0.0) -> None:
        """Append a compute span of ``seconds`` wall time (thread-CPU time defaults to the same)."""
        if seconds < 0 or (cpu_s is not None and cpu_s < 0) or flops < 0:
            raise ValueError(f"Trace.add_compute: seconds, cpu_s and flops must be >= 0, got {seconds}, {cpu_s}, {flops}")
        self._rank(rank).append(Compute(float(seconds), float(seconds if cpu_s is None else cpu_s), float(flops)))

    def add_collective(
        self,
        rank: int,
        op: str,
        nbytes: int,
        group: tuple[int, ...] | list[int] | None = None,
        async_op: bool = False,
        *,
        dtype: str = "float32",
        start_s: float | None = None,
        end_s: float | None = None,
    ) -> int:
        """Append a collective and return its id (unique per rank, for ``add_wait``)."""
        evs = self._rank(rank)
        if op not in OPS:
            raise ValueError(f"Trace.add_collective: op must be one of {', '.join(OPS)}, got {op!r}")
        if int(nbytes) != nbytes or nbytes < 0:
            raise ValueError(f"Trace.add_collective: nbytes must be a non-negative integer, got {nbytes!r}")
        grp = _normalise_group(group, self.num_nodes)
        if grp is not None and rank not in grp:
            raise ValueError(f"Trace.add_collective: rank {rank} is not a member of group {grp}")
        cid = self._next_cid[rank]
        self._next_cid[rank] += 1
        evs.append(Collective(cid, op, int(nbytes), grp, bool(async_op), dtype, start_s, end_s))
        return cid

    def add_wait(self, rank: int, cid: int) -> None:
        """Block ``rank`` until its async collective ``cid`` ends."""
        evs = self._rank(rank)
        if not any(isinstance(e, Collective) and e.cid == cid and e.async_op for e in reversed(evs)):
            raise ValueError(f"Trace.add_wait: rank {rank} has no async collective with id {cid}")
        evs.append(Wait(cid))

    def add_step(self, rank: int) -> None:
        """Mark the end of a training step on ``rank``."""
        self._rank(rank).append(_STEP)

    # ---------------------------------------------------------------- queries
    def num_steps(self, rank: int = 0) -> int:
        return sum(1 for e in self._rank(rank) if e is _STEP or isinstance(e, Step))

    def payload_bytes_per_step(self, rank: int) -> list[int]:
        """Payload bytes ``rank`` passed to collectives in each step (trailing events form no step)."""
        out, acc = [], 0
        for e in self._rank(rank):
            if isinstance(e, Collective):
                acc += e.nbytes
            elif isinstance(e, Step):
                out.append(acc)
                acc = 0
        return out

    def payload_bytes(self, rank: int) -> int:
        """Total payload bytes ``rank`` passed to collectives."""
        return sum(e.nbytes for e in self._rank(rank) if isinstance(e, Collective))

    def collectives(self, rank: int) -> Iterator[Collective]:
        return (e for e in self._rank(rank) if isinstance(e, Collective))

    def scaled(self, bytes: float = 1.0, compute: float = 1.0) -> "Trace":
        """A what-if copy: payloads times ``bytes``, compute spans times ``compute``.

        ``bytes=10`` models a 10x larger model; ``compute=0.5`` a device twice as fast.
        """
        if bytes <= 0 or compute <= 0:
            raise ValueError(f"Trace.scaled: bytes and compute must be > 0, got {bytes}, {compute}")
        new_events: list[list[Event]] = []
        for evs in self.events:
            row: list[Event] = []
            for e in evs:
                if isinstance(e, Compute):
                    e = Compute(e.wall_s * compute, e.cpu_s * compute, e.flops * compute)
                elif isinstance(e, Collective):
                    e = replace(e, nbytes=int(round(e.nbytes * bytes)))
                row.append(e)
            new_events.append(row)
        meta = dict(self.meta, scaled={"bytes": bytes, "compute": compute})
        return Trace(self.num_nodes, meta, new_events)

    def validate(self) -> None:
        """Check that collectives match across group members; raise TraceError if not."""
        counts: dict[tuple[int, ...], list[list[str]]] = {}
        everyone = tuple(range(self.num_nodes))
        for rank, evs in enumerate(self.events):
            for e in evs:
                if isinstance(e, Collective):
                    grp = e.group or everyone
                    per_rank = counts.setdefault(grp, [[] for _ in range(self.num_nodes)])
                    per_rank[rank].append(e.op)
        for grp, per_rank in counts.items():
            seqs = {r: per_rank[r] for r in grp}
            first = seqs[grp[0]]
            for r, seq in seqs.items():
                if len(seq) != len(first):
                    raise TraceError(
                        f"trace: rank {r} issued {len(seq)} collectives on group {grp}, rank {grp[0]} issued {len(first)}"
                    )
                for k, (a, b) in enumerate(zip(first, seq)):
                    if a != b:
                        raise TraceError(f"trace: collective #{k} on group {grp} is {a} on rank {grp[0]} but {b} on rank {r}")

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> Path:
        """Write the trace atomically (a temporary file renamed into place)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        n = 0
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(json.dumps({"format": FORMAT, "version": VERSION, "num_nodes": self.num_nodes, "meta": self.meta}) + "\n")
                for rank, evs in enumerate(self.events):
                    for e in evs:
                        f.write(json.dumps(_encode(rank, e), separators=(",", ":")) + "\n")
                        n += 1
                f.write(json.dumps({"end": True, "events": n}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Trace":
        """Read a trace written by ``save``; any defect raises TraceError naming the file and line."""
        path = Path(path)
        if path.is_dir():
            path = path / "trace.jsonl"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise TraceError(f"{path}: no such trace file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}: cannot read trace ({exc})") from None
        lines = text.splitlines()
        if not lines:
            raise TraceError(f"{path}: empty file, expected an exonet trace")
        header = _parse_line(path, 1, lines[0])
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise TraceError(f"{path}:1: not an exonet trace (expected a header with format={FORMAT!r})")
        if header.get("version") != VERSION:
            raise TraceError(f"{path}:1: unsupported trace version {header.get('version')!r}, expected {VERSION}")
        num_nodes = header.get("num_nodes")
        if not isinstance(num_nodes, int) or num_nodes < 1:
            raise TraceError(f"{path}:1: num_nodes must be a positive integer, got {num_nodes!r}")
        events: list[list[Event]] = [[] for _ in range(num_nodes)]
        footer = None
        for lineno, line in enumerate(lines[1:], start=2):
            value = _parse_line(path, lineno, line)
            if isinstance(value, dict):
                footer = value
                if lineno != len(lines):
                    raise TraceError(f"{path}:{lineno}: closing line before the end of the file")
                break
            try:
                rank, event = _decode(value, num_nodes)
            except (ValueError, TypeError, IndexError) as exc:
                raise TraceError(f"{path}:{lineno}: bad event {line[:80]!r} ({exc})") from None
            events[rank].append(event)
        n = sum(len(e) for e in events)
        if footer is None or footer.get("end") is not True:
            raise TraceError(f"{path}: truncated trace (no closing line; read {n} events)")
        if footer.get("events") != n:
            raise TraceError(f"{path}: closing line says {footer.get('events')} events, file holds {n}")
        return cls(num_nodes, dict(header.get("meta") or {}), events)


def _normalise_group(group: Any, num_nodes: int) -> tuple[int, ...] | None:
    if group is None:
        return None
    grp = tuple(sorted(int(r) for r in group))
    if not grp or len(set(grp)) != len(grp) or grp[0] < 0 or grp[-1] >= num_nodes:
        raise ValueError(f"group must be distinct ranks in [0, {num_nodes}), got {group!r}")
    return None if len(grp) == num_nodes else grp


def _encode(rank: int, e: Event) -> list:
    if isinstance(e, Compute):
        return ["c", rank, e.wall_s, e.cpu_s, e.flops]
    if isinstance(e, Collective):
        return ["x", rank, e.cid, e.op, e.nbytes, list(e.group) if e.group else None, int(e.async_op), e.dtype, e.start_s, e.end_s]
    if isinstance(e, Wait):
        return ["w", rank, e.cid]
    return ["s", rank]


def _decode(v: list, num_nodes: int) -> tuple[int, Event]:
    kind, rank = v[0], v[1]
    if not isinstance(rank, int) or not 0 <= rank < num_nodes:
        raise ValueError(f"rank {rank!r} out of range")
    if kind == "c":
        return rank, Compute(float(v[2]), float(v[3]), float(v[4]))
    if kind == "x":
        if v[3] not in OPS:
            raise ValueError(f"unknown op {v[3]!r}")
        group = tuple(v[5]) if v[5] is not None else None
        return rank, Collective(int(v[2]), v[3], int(v[4]), group, bool(v[6]), str(v[7]), v[8], v[9])
    if kind == "w":
        return rank, Wait(int(v[2]))
    if kind == "s":
        return rank, _STEP
    raise ValueError(f"unknown event kind {kind!r}")


def _parse_line(path: Path, lineno: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
