"""The object store in a replay: puts and gets become messages to and from one more rank that plays the store.

A trace that uses ``comm.put(key, t)`` / ``comm.get(key, t)`` records ``put`` and ``get`` ops with their keys.
``with_store`` rewrites it for the engine, which knows collectives and messages: rank S (one more server, after
every rank) is the store, each put a send to S, each get a receive from S, and S's own events say when it
can serve what. S posts a receive for every put at once, then serves the gets in the order the data allows:
it repeatedly takes, among the gets at the head of each reader's queue (a reader's reads arrive in its
order), the one whose put comes first (by step, then rank), waits for that put to have landed, and sends it.
So a get waits for its put, a key is uploaded once however many read it, and every transfer crosses the
peer's NIC, the store's (its ``throughput``) and any inter-region link, at the store's ``latency``
(exonet.netsim.topology, ``_store_path``).
"""

from __future__ import annotations

import heapq
from dataclasses import replace

from exonet.errors import TraceError
from exonet.trace import STORE_OPS, Collective, Event, Step, Trace, Wait


def uses_store(trace: Trace) -> bool:
    return any(isinstance(e, Collective) and e.op in STORE_OPS for events, _ in trace.row_runs() for e in events)


def with_store(trace: Trace) -> Trace:
    """``trace`` with its puts and gets as messages to and from a store rank (a new last server); the trace
    itself when it has none. ``meta["store"]`` marks the result."""
    if not uses_store(trace):
        return trace
    store = trace.num_ranks
    ranks: list[list[Event]] = []
    puts: dict[str, tuple[int, int, int, int]] = {}  # key -> (step, rank, order, nbytes)
    reads: list[list[tuple[str, int]]] = []  # per rank, its gets in order: (key, nbytes)
    for rank, events in enumerate(trace.events):
        out: list[Event] = []
        mine: list[tuple[str, int]] = []
        step = 0
        for e in events:
            if isinstance(e, Step):
                step += 1
            if not (isinstance(e, Collective) and e.op in STORE_OPS):
                out.append(e)
                continue
            assert e.key is not None  # a store op always names its key (exonet.trace)
            if e.op == "put":
                if e.key in puts:
                    raise TraceError(f"trace: rank {rank} puts key {e.key!r}, which rank {puts[e.key][1]} already "
                                     "put; a key is written once")
                puts[e.key] = (step, rank, len(puts), e.nbytes)
                out.append(replace(e, op="send", group=(rank, store), key=None))
            else:
                mine.append((e.key, e.nbytes))
                out.append(replace(e, op="recv", group=(rank, store), key=None))
        ranks.append(out)
        reads.append(mine)
    missing = [(rank, key) for rank, mine in enumerate(reads) for key, _ in mine if key not in puts]
    if missing:
        rank, key = missing[0]
        raise TraceError(f"trace: rank {rank} gets key {key!r}, which no rank puts")
    ranks.append(_store_events(store, puts, reads))
    meta = {**trace.meta, "servers": trace.meta.get("servers", 0) + 1, "store": True}
    return Trace(meta=meta, events=ranks, num_ranks=trace.num_ranks + 1)


def _store_events(store: int, puts: dict[str, tuple[int, int, int, int]],
                  reads: list[list[tuple[str, int]]]) -> list[Event]:
    """The store rank's events: a receive posted for every put, then each read served once its put has landed."""
    events: list[Event] = []
    landed: dict[str, int] = {}
    for key, (_, rank, _, nbytes) in sorted(puts.items(), key=lambda item: item[1][:3]):
        landed[key] = len(events)
        events.append(Collective(len(events), "recv", nbytes, (rank, store), True, "uint8"))
    waited: set[str] = set()
    heads = [(puts[mine[0][0]][:3], rank, 0) for rank, mine in enumerate(reads) if mine]
    heapq.heapify(heads)
    sends = []
    while heads:
        _, rank, i = heapq.heappop(heads)
        key, nbytes = reads[rank][i]
        if key not in waited:
            events.append(Wait(landed[key]))
            waited.add(key)
        sends.append(len(events))
        events.append(Collective(len(events), "send", puts[key][3], (rank, store), True, "uint8"))
        if i + 1 < len(reads[rank]):
            heapq.heappush(heads, (puts[reads[rank][i + 1][0]][:3], rank, i + 1))
    events += [Wait(cid) for cid in sends]
    return events
