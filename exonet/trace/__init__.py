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

Modules: ``events`` (the events and the checks each passes), ``fileformat`` (a trace on disk: JSON Lines,
checked line by line); ``Trace`` (here) builds, queries and validates a trace.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

from exonet.errors import TraceError
from exonet.trace import fileformat
from exonet.trace.events import (
    DISCARD,
    MAX_KEY,
    MAX_PAYLOAD,
    OPS,
    P2P_OPS,
    STEP,
    STORE_OPS,
    Collective,
    Compute,
    Discard,
    Event,
    Step,
    Wait,
    checked_collective,
    checked_compute,
    coalesced,
)

__all__ = ["MAX_KEY", "MAX_PAYLOAD", "OPS", "P2P_OPS", "STORE_OPS", "Collective", "Compute", "Discard", "Event", "Step",
           "Trace", "Wait", "coalesced"]


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
        self._next_cid = [cid for row, n in self.row_runs()
                          for cid in [1 + max((e.cid for e in row if isinstance(e, Collective)), default=-1)] * n]

    def row_runs(self, start: int = 0, stop: int | None = None) -> list[tuple[list[Event], int]]:
        """The event lists of ranks ``start`` to ``stop`` (default: all) as runs of equal lists: (list, how many
        ranks in a row).

        Every rank of an estimate holds rank 0's events (the same objects), and a scan over the runs costs one
        rank's events, not n ranks'. Lists whose ends are the same objects are compared whole (a C loop that finds
        shared objects equal without calling their ``__eq__``); others, such as a loaded trace's per-rank copies
        of equal events, are runs of their own, which costs a scan what it cost before.
        """
        runs: list[tuple[list[Event], int]] = []
        for row in self.events[start:stop]:
            last = runs[-1][0] if runs else None
            if last is not None and (row is last or (len(row) == len(last) and row and row[0] is last[0]
                                                     and row[-1] is last[-1] and row == last)):
                runs[-1] = (last, runs[-1][1] + 1)
            else:
                runs.append((row, 1))
        return runs

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
            evs.append(checked_compute(seconds, seconds if cpu_s is None else cpu_s, flops))
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
            event = checked_collective(rank, self.num_ranks, cid, op, nbytes, group, bool(async_op), dtype, start_s,
                                       end_s, key)
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
        self._rank(rank).append(STEP)

    def add_discard(self, rank: int) -> None:
        """Mark ``rank``'s compute since its last sync as thrown away."""
        self._rank(rank).append(DISCARD)

    # ---------------------------------------------------------------- queries
    def num_steps(self, rank: int = 0) -> int:
        return sum(1 for e in self._rank(rank) if e is STEP or isinstance(e, Step))

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
        return self._payload(self._rank(rank))

    def _payload(self, events: list[Event]) -> int:
        return sum(e.nbytes for e in events if isinstance(e, Collective) and self._sends(e))

    def _payload_of_ranks(self, start: int, stop: int) -> int:
        """Payload bytes of ranks ``start`` to ``stop`` together, each run of equal ranks counted once."""
        return sum(n * self._payload(row) for row, n in self.row_runs(start, stop))

    def payload_per_trainer(self) -> float:
        """Payload bytes per training rank: the mean over the ranks before the servers (``meta["servers"]``).

        The one "payload per node" that compare, ``exonet estimate`` and the projection report.
        """
        trainers = self.num_nodes
        return self._payload_of_ranks(0, trainers) / trainers

    def payload_per_server(self) -> float | None:
        """Payload bytes per serving rank (the last ``meta["servers"]``); None without servers."""
        servers = self.meta.get("servers", 0)
        return self._payload_of_ranks(self.num_nodes, self.num_ranks) / servers if servers else None

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
        """Write the trace atomically (a temporary file renamed into place; the format: ``fileformat``)."""
        return fileformat.write(path, self.num_ranks, self.meta, self.events)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Trace":
        """Read a trace written by ``save``; any defect raises TraceError naming the file and line."""
        path = Path(path)
        if path.is_dir():
            path = path / "trace.jsonl"
        num_ranks, meta, events = fileformat.read(path)
        try:
            return cls(meta=meta, events=events, num_ranks=num_ranks)
        except ValueError as err:  # the header's meta does not fit its ranks (servers)
            raise TraceError(f"{path}:1: {err}") from None
