"""Trace: what every node did, in order, so a network model can replay it.

A trace holds one ordered event list per node. Events are:

* ``Compute``: a span of local work between two communications (wall seconds,
  thread-CPU seconds and, when counted, FLOPs).
* ``Collective``: a collective this node issued (op, payload bytes, dtype, group,
  whether it was async, and the real start/end seconds when recorded).
* ``Wait``: the node blocked until one of its own async collectives finished.
* ``Step``: the end of a training step.
* ``Discard``: the node's work since its last sync was thrown away (an elastic node that
  failed adopts the others' state instead); the replay counts that compute as lost.

The k-th collective a rank issues on a group matches the k-th collective of every
other member on that group; that is how the simulator pairs them. A point-to-point
message is a pair of events on its group of two: op "send" on the sender, "recv" on the
receiver; the k-th send from a to b matches b's k-th recv from a. Only sends count as
payload (the receiver passes in a buffer, not data).

File format (line-oriented JSON, one value per line, UTF-8)::

    {"format": "exonet-trace", "version": 1, "num_ranks": K, "meta": {...}}   # K: trainers + servers
    ["c", rank, wall_s, cpu_s, flops]                                   # Compute
    ["x", rank, cid, op, nbytes, group|null, async 0|1, dtype, start_s|null, end_s|null]
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
import math
import numbers
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Union

from exonet.errors import TraceError
from exonet.files import atomic_file

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce", "gather", "scatter",
       "barrier")
P2P_OPS = ("send", "recv")
STORE_OPS = ("put", "get")  # an object store between peers: a key's bytes go up once, and down to each reader
MAX_KEY = 1024  # characters of a store key
FORMAT = "exonet-trace"
VERSION = 1
MAX_NODES = 1 << 20  # a header claiming more is corrupt; loading would allocate a list per node
MAX_SECONDS = 1e15  # a compute span longer (about 30 million years) is corrupt, and sums of such overflow
MAX_BYTES = (1 << 63) - 1  # a payload is a tensor's byte count, an int64
MAX_PAYLOAD = 1 << 50  # 1 PiB: more than any collective moves, and its time in ticks stays small enough to solve


@dataclass(slots=True)
class Compute:
    """Local work between communications.

    Events are plain slotted records, read-only by convention (traces share event objects between
    ranks and copies; events are not hashable): a frozen dataclass costs 1.8 µs to build against
    0.2 µs, and the Communicator builds two on every collective.
    """

    wall_s: float
    cpu_s: float
    flops: float = 0.0


@dataclass(slots=True)
class Collective:
    """One collective issued by one rank. ``nbytes`` is the payload this rank passes in.

    A store op (``put``/``get``) has no group and names its ``key``: a get reads what the put of that key wrote.
    """

    cid: int
    op: str
    nbytes: int
    group: tuple[int, ...] | None = None
    async_op: bool = False
    dtype: str = "float32"
    start_s: float | None = None
    end_s: float | None = None
    key: str | None = None


@dataclass(slots=True)
class Wait:
    """The rank blocks until its own async collective ``cid`` has finished."""

    cid: int


@dataclass(slots=True)
class Step:
    """End of a training step on this rank."""


@dataclass(slots=True)
class Discard:
    """The rank's work since its last sync is lost (it adopts the state of nodes that stayed up)."""


Event = Union[Compute, Collective, Wait, Step, Discard]
_STEP = Step()
_DISCARD = Discard()


@dataclass(init=False)
class Trace:
    """Per-rank ordered events of a run (recorded or built by hand): its trainers, then its servers.

    Args:
        num_nodes: the trainers (``num_nodes`` means trainers everywhere in exonet); the trace covers them and
            the ``meta["servers"]`` server ranks after them.
        meta: free-form facts about the run (strategy, parameter count, ...); an estimate's holds the compute
            it was given (``"compute"``: step_time_s, tflops, mfu), which ``simulate`` times its spans by.
        events: one list per rank (default: empty lists).
        num_ranks: every rank, trainers and servers, given instead of ``num_nodes`` (as a trace file's header does).
    """

    num_ranks: int
    meta: dict[str, Any]
    events: list[list[Event]]

    def __init__(self, num_nodes: int | None = None, meta: dict[str, Any] | None = None,
                 events: list[list[Event]] | None = None, *, num_ranks: int | None = None) -> None:
        self.meta = {} if meta is None else meta
        servers = self.meta.get("servers", 0)
        if isinstance(servers, bool) or not isinstance(servers, int) or servers < 0:
            raise ValueError(f"Trace: meta['servers'] must be a non-negative integer, got {servers!r}")
        for name, value in (("num_nodes", num_nodes), ("num_ranks", num_ranks)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"Trace: {name} must be an integer >= 1, got {value!r}")
        if num_ranks is None:
            if num_nodes is None:
                raise TypeError("Trace: give num_nodes (the trainers) or num_ranks (every rank)")
            num_ranks = num_nodes + servers
        elif num_nodes is not None and num_nodes + servers != num_ranks:
            raise ValueError(f"Trace: num_nodes={num_nodes} trainers and {servers} servers are not "
                             f"num_ranks={num_ranks}")
        if servers >= num_ranks:
            raise ValueError(f"Trace: {servers} servers leave no trainer among num_ranks={num_ranks}")
        self.num_ranks = num_ranks
        self.events = events or [[] for _ in range(num_ranks)]
        if len(self.events) != num_ranks:
            raise ValueError(f"Trace: events has {len(self.events)} rank lists, expected num_ranks={num_ranks}")
        self._next_cid = [
            1 + max((e.cid for e in evs if isinstance(e, Collective)), default=-1) for evs in self.events
        ]

    @property
    def num_nodes(self) -> int:
        """The trainers: every rank but the ``meta["servers"]`` servers after them."""
        return self.num_ranks - self.meta.get("servers", 0)

    # ----------------------------------------------------------------- builder
    def _rank(self, rank: int) -> list[Event]:
        if not isinstance(rank, int) or not 0 <= rank < self.num_ranks:
            raise ValueError(f"Trace: rank must be in [0, {self.num_ranks}), got {rank!r}")
        return self.events[rank]

    def add_compute(self, rank: int, seconds: float, *, cpu_s: float | None = None, flops: float = 0.0) -> None:
        """Append a compute span of ``seconds`` wall time (thread-CPU time defaults to the same)."""
        evs = self._rank(rank)
        try:
            evs.append(_compute(seconds, seconds if cpu_s is None else cpu_s, flops))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"Trace.add_compute: seconds, cpu_s and flops must be >= 0 and finite; {exc}") from None

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
        key: str | None = None,
    ) -> int:
        """Append a collective and return its id (unique per rank, for ``add_wait``).

        ``group`` is normalised as a file's is: its ranks sorted, and the whole world stored as None. A store op
        (``"put"``, ``"get"``) takes no group and a ``key``.
        """
        evs = self._rank(rank)
        cid = self._next_cid[rank]
        try:
            event = _collective(rank, self.num_ranks, cid, op, nbytes, group, bool(async_op), dtype, start_s, end_s,
                                key)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"Trace.add_collective: {exc}") from None
        self._next_cid[rank] += 1
        evs.append(event)
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

    def add_discard(self, rank: int) -> None:
        """Mark ``rank``'s compute since its last sync as thrown away."""
        self._rank(rank).append(_DISCARD)

    # ---------------------------------------------------------------- queries
    def num_steps(self, rank: int = 0) -> int:
        return sum(1 for e in self._rank(rank) if e is _STEP or isinstance(e, Step))

    def payload_bytes_per_step(self, rank: int) -> list[int]:
        """Payload bytes ``rank`` passed to collectives in each step (trailing events, such as a strategy's
        ``finish``, form no step: ``payload_bytes`` counts them)."""
        out, acc = [], 0
        for e in self._rank(rank):
            if isinstance(e, Collective) and self._sends(e):
                acc += e.nbytes
            elif isinstance(e, Step):
                out.append(acc)
                acc = 0
        return out

    def payload_bytes(self, rank: int) -> int:
        """Total payload bytes ``rank`` passed to collectives and sends."""
        return sum(e.nbytes for e in self._rank(rank) if isinstance(e, Collective) and self._sends(e))

    def payload_per_trainer(self) -> float:
        """Payload bytes per training rank: the mean over the ranks before the servers (``meta["servers"]``).

        The one "payload per node" that compare, ``exonet estimate`` and the projection report.
        """
        trainers = self.num_nodes
        return sum(self.payload_bytes(r) for r in range(trainers)) / trainers

    def payload_per_server(self) -> float | None:
        """Payload bytes per serving rank (the last ``meta["servers"]``); None without servers."""
        servers = self.meta.get("servers", 0)
        return sum(self.payload_bytes(r) for r in range(self.num_nodes, self.num_ranks)) / servers if servers else None

    def _sends(self, e: Collective) -> bool:
        """Whether the payload of ``e`` goes to another node: not a receive, nor a group of one (a K = 1
        run's all-reduce sends nothing, as DiLoCo and SPARTA, which skip it there, already counted); a put goes to
        the store whatever K."""
        if e.op in STORE_OPS:
            return e.op == "put"
        return e.op != "recv" and (self.num_ranks if e.group is None else len(e.group)) > 1

    def collectives(self, rank: int) -> Iterator[Collective]:
        return (e for e in self._rank(rank) if isinstance(e, Collective))

    def scaled(self, bytes: float = 1.0, compute: float = 1.0) -> "Trace":
        """A what-if copy: payloads times ``bytes``, compute spans times ``compute``.

        ``bytes=10`` models a 10x larger model; ``compute=0.5`` a device twice as fast.

        What it keeps: every collective, in number and order; each one's payload is scaled. A
        bucketed all-reduce (DDP) is therefore not re-cut for the larger model: a run of a 10x
        model sends about 10x as many 25 MiB buckets, each launched earlier in backward, so it
        hides more of its traffic than the scaled copy does. A copy whose steps hold several
        all-reduces with ``bytes != 1`` warns; ``exonet.estimate`` builds a faithful trace of
        any size from the strategy itself.
        """
        if bytes <= 0 or compute <= 0:
            raise ValueError(f"Trace.scaled: bytes and compute must be > 0, got {bytes}, {compute}")
        if bytes != 1 and self._bucketed():
            import warnings

            warnings.warn(f"Trace.scaled(bytes={bytes:g}): the trace's steps hold several all-reduces (DDP buckets); "
                          f"the copy keeps their number and scales each, where a model {bytes:g}x larger would be cut "
                          f"into about {bytes:g}x as many buckets that overlap backward more finely; use "
                          f"exonet.estimate for a faithful projection", UserWarning, stacklevel=2)
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
        if isinstance(meta.get("compute"), dict):  # an estimate's stated compute, as the copy now has it
            given = meta["compute"]
            meta["compute"] = dict(given, step_time_s=given.get("step_time_s", 0.0) * compute,
                                   tflops=given["tflops"] / compute if given.get("tflops") else None)
        return Trace(meta=meta, events=new_events, num_ranks=self.num_ranks)

    def _bucketed(self) -> bool:
        """Whether some rank's step holds more than one all-reduce (bucketed gradients, whose count depends on size)."""
        for evs in self.events:
            count = 0
            for e in evs:
                if isinstance(e, Step):
                    count = 0
                elif isinstance(e, Collective) and e.op == "all_reduce":
                    count += 1
                    if count > 1:
                        return True
        return False

    def validate(self) -> None:
        """Check that collectives match across group members, and each rank's sends to another its receives from
        it (a message's k-th send meets the k-th receive; it is no collective of the pair); raise TraceError if not."""
        counts: dict[tuple[int, ...], list[list[str]]] = {}
        messages: dict[tuple[int, int], list[int]] = {}  # (sender, receiver) -> [sends, receives]
        everyone = tuple(range(self.num_ranks))
        for rank, evs in enumerate(self.events):
            for e in evs:
                if isinstance(e, Collective) and e.op in P2P_OPS:
                    low, high = e.group or everyone
                    peer = high if low == rank else low
                    messages.setdefault((rank, peer) if e.op == "send" else (peer, rank), [0, 0])[e.op == "recv"] += 1
                elif isinstance(e, Collective):
                    grp = e.group or everyone
                    per_rank = counts.setdefault(grp, [[] for _ in range(self.num_ranks)])
                    per_rank[rank].append(e.op)
        for (sender, receiver), (sent, received) in messages.items():
            if sent != received:
                raise TraceError(f"trace: rank {sender} sends {sent} messages to rank {receiver}, "
                                 f"which receives {received}")
        for grp, per_rank in counts.items():
            seqs = {r: per_rank[r] for r in grp}
            first = seqs[grp[0]]
            for r, seq in seqs.items():
                if len(seq) != len(first):
                    raise TraceError(
                        f"trace: rank {r} issued {len(seq)} collectives on group {grp}, "
                        f"rank {grp[0]} issued {len(first)}"
                    )
                for k, (a, b) in enumerate(zip(first, seq)):
                    if a != b:
                        raise TraceError(f"trace: collective #{k} on group {grp} is {a} on rank {grp[0]} "
                                         f"but {b} on rank {r}")

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> Path:
        """Write the trace atomically (a temporary file renamed into place)."""
        n = 0
        with atomic_file(path, "w") as f:
            f.write(json.dumps({"format": FORMAT, "version": VERSION, "num_ranks": self.num_ranks,
                                "meta": self.meta}) + "\n")
            for rank, evs in enumerate(self.events):
                for e in evs:
                    f.write(json.dumps(_encode(rank, e), separators=(",", ":")) + "\n")
                    n += 1
            f.write(json.dumps({"end": True, "events": n}) + "\n")
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Trace":
        """Read a trace written by ``save``; any defect raises TraceError naming the file and line."""
        path = Path(path)
        if path.is_dir():
            path = path / "trace.jsonl"
        text = _read_text(path)
        lines = text.splitlines()
        num_ranks, meta = _read_header(path, text, lines)
        events = _read_events(path, lines, num_ranks)
        try:
            return cls(meta=meta, events=events, num_ranks=num_ranks)
        except ValueError as err:  # the header's meta does not fit its ranks (servers)
            raise TraceError(f"{path}:1: {err}") from None


# ---------------------------------------------------------------------- reading a file
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


def _seconds(name: str, value: Any, limit: float = MAX_SECONDS) -> float:
    """A finite, non-negative number of seconds (or FLOPs, with no limit): what a compute span is made of."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    x = _finite(value)
    if x is None or x < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    if x > limit:
        raise ValueError(f"{name} must be at most {limit:g}, got {value!r}")
    return x


def _finite(value: int | float) -> float | None:
    """``value`` as a float, or None when it is NaN, infinite or an int too large for a float."""
    try:
        x = float(value)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def _integer(name: str, value: Any) -> int:
    """A non-negative integer (an integral float such as 4.0 counts; a bool does not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, numbers.Integral)):
        raise TypeError(f"{name} must be a non-negative integer, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    number = value if isinstance(value, (int, float)) else int(value)  # an Integral (numpy's) compares as its int
    if number < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if number > MAX_BYTES:
        raise ValueError(f"{name} must be below 2**63, got {value!r}")
    return int(number)


def _time_stamp(name: str, value: Any) -> float | None:
    if value is None:
        return None
    x = None if isinstance(value, bool) or not isinstance(value, (int, float)) else _finite(value)
    if x is None:
        raise ValueError(f"{name} must be a finite number of seconds or null, got {value!r}")
    return x


def _compute(wall_s: Any, cpu_s: Any, flops: Any) -> Compute:
    return Compute(_seconds("seconds", wall_s), _seconds("cpu_s", cpu_s), _seconds("flops", flops, math.inf))


def _collective(rank: int, num_nodes: int, cid: Any, op: Any, nbytes: Any, group: Any, async_op: bool, dtype: Any,
                start_s: Any, end_s: Any, key: Any = None) -> Collective:
    if op not in OPS and op not in P2P_OPS and op not in STORE_OPS:
        raise ValueError(f"op must be one of {', '.join(OPS + P2P_OPS + STORE_OPS)}, got {op!r}")
    if op in STORE_OPS:
        if group is not None:
            raise ValueError(f"a {op} goes to the object store: it takes no group, got {group!r}")
        if not isinstance(key, str) or not key or len(key) > MAX_KEY or not key.isprintable():
            raise ValueError(f"a {op} needs its key, a printable string of 1 to {MAX_KEY} characters, got {key!r}")
    elif key is not None:
        raise ValueError(f"only put and get name a key; a {op} has none, got {key!r}")
    if op in P2P_OPS and (group is None and num_nodes != 2 or group is not None and len(group) != 2):
        raise ValueError(f"a {op} needs its group to be the pair (sender, receiver), got {group!r}")
    if not isinstance(dtype, str) or not dtype:
        raise TypeError(f"dtype must be a non-empty string such as 'float32', got {dtype!r}")
    grp = _normalise_group(group, num_nodes)
    if grp is not None and rank not in grp:
        raise ValueError(f"rank {rank} is not a member of group {grp}")
    size = _integer("nbytes", nbytes)
    if size > MAX_PAYLOAD:
        raise ValueError(f"nbytes must be at most 2**50 (1 PiB), the largest payload exonet simulates, got {nbytes!r}")
    return Collective(_integer("cid", cid), op, size, grp, async_op, dtype,
                      _time_stamp("start_s", start_s), _time_stamp("end_s", end_s), key)


def coalesced(events: list[Event]) -> list[Event]:
    """``events`` with every run of adjacent compute spans merged into one (seconds, CPU seconds and FLOPs
    summed). A replay times a span by its work at the rank's per-step speed and jitter, through any outage
    window, so a run of spans takes what their sum takes: the same trace, fewer events to replay."""
    out: list[Event] = []
    run: list[Compute] = []
    for e in [*events, None]:
        if type(e) is Compute:
            run.append(e)
            continue
        if len(run) > 1:
            out.append(Compute(sum(c.wall_s for c in run), sum(c.cpu_s for c in run), sum(c.flops for c in run)))
        else:
            out += run
        run = []
        if e is not None:
            out.append(e)
    return out


def _normalise_group(group: Any, num_nodes: int) -> tuple[int, ...] | None:
    """A group as one canonical value: sorted ranks, or None for the whole world (however it was spelt).

    Order carries no meaning (the group's members are a set), so ``[1, 0]`` is ``(0, 1)`` and
    ``[0, ..., K-1]`` is None; then equal groups compare equal wherever collectives are matched.
    """
    if group is None:
        return None
    if isinstance(group, (str, bytes)) or not isinstance(group, (list, tuple, range)):
        raise TypeError(f"group must be a list of ranks or null, got {group!r}")
    if not all(isinstance(r, (int, numbers.Integral)) and not isinstance(r, bool) for r in group):
        raise TypeError(f"group must list integer ranks, got {group!r}")
    grp = tuple(sorted(int(r) for r in group))
    twice = [a for a, b in zip(grp, grp[1:]) if a == b]
    outside = [r for r in grp if not 0 <= r < num_nodes]
    problems = (["it is empty"] if not grp
                else [f"rank {r} twice" for r in twice[:1]] + [f"rank {r} is outside" for r in outside[:1]])
    if problems:
        raise ValueError(f"group must be distinct ranks in [0, {num_nodes}), got {list(group)} ({', '.join(problems)})")
    return None if len(grp) == num_nodes else grp


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
            return rank, _compute(v[2], v[3], v[4])
        if kind == "x":
            if v[6] not in (0, 1) or isinstance(v[6], float):
                raise ValueError(f"async must be 0 or 1, got {v[6]!r}")
            e = _collective(rank, self.num_nodes, v[2], v[3], v[4], v[5], bool(v[6]), v[7], v[8], v[9],
                            v[10] if keyed else None)
            if e.cid in self.cids[rank]:
                raise ValueError(f"rank {rank} issued collective id {e.cid} twice")
            self.cids[rank].add(e.cid)
            if e.async_op:
                self.async_cids[rank].add(e.cid)
            return rank, e
        if kind == "w":
            cid = _integer("cid", v[2])
            if cid not in self.async_cids[rank]:
                raise ValueError(f"rank {rank} waits for collective id {cid}, which it has not issued as async")
            return rank, Wait(cid)
        if kind == "d":
            return rank, _DISCARD
        return rank, _STEP


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
