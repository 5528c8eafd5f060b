"""The state of a ``Simulation``, declared once: what its parts (engine, eventpath, handover, outages,
outcome, queries) share, so each types against it instead of reaching for attributes only ``__init__`` makes.

``Simulation`` (exonet.netsim.engine) is one class in six files: ``Simulation`` itself and the
mixins ``EventPath``, ``Handover``, ``Outages``, ``Outcomes`` and ``ClockQueries``. They all inherit ``SimState``,
whose annotations are the whole shared state (``Simulation.__init__`` sets every one) and whose
stubs name the methods one part calls in another. The fast path's hand-over bookkeeping is an
object of its own, ``HandoverState``, owned as ``_handover``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from exonet.netsim.agenda import Agenda
    from exonet.netsim.compute import ComputeModel
    from exonet.netsim.fastpath import Plan, Planner
    from exonet.netsim.flows import FluidNetwork
    from exonet.netsim.state import Instance, RankState
    from exonet.netsim.topology import Topology
    from exonet.scenario import Resolved


@dataclass
class HandoverState:
    """What moves a collective between the fast path and the event path (exonet.netsim.handover)."""

    windowed: bool  # resting collectives may share links apart in time (max-min only)
    lone: Instance | None = None  # in flight on the fast path from an idle network
    # handed back to the fast path mid-run: (tick its phase 0 would have begun, phase it resumed at, its links)
    resting: dict[Instance, tuple[int, int, frozenset[int]]] = field(default_factory=dict)
    taken_at: int = -1  # the tick of the latest take-over


class SimState:
    """The annotated state every part of ``Simulation`` shares (set in ``Simulation.__init__``)."""

    resolved: Resolved
    name: str
    _agenda: Agenda
    _topo: Topology
    _cm: ComputeModel
    _planner: Planner
    _algorithms: dict[str, str]  # op -> the algorithm that runs it, for the spans
    _net: FluidNetwork
    _net_epoch: int  # the tick at which the fluid network's clock reads 0
    _net_token: int
    _fast: bool
    _rewind: bool
    _ranks: list[RankState]
    _everyone: tuple[int, ...]
    _members: dict[tuple[int, ...] | None, tuple[int, ...]]
    _open: dict[tuple, Instance]  # issued by some members, not yet by all
    _late: dict[tuple, tuple[Instance, set[int]]]  # elastic: started without members yet to issue it
    _concurrency: int
    _running: dict[tuple[int, ...], int]  # group -> collectives started or due to start
    _queued: dict[tuple[int, ...], deque[Instance]]  # group -> issued by all, waiting their turn
    _active: dict[Instance, None]  # in flight on the event path
    _handover: HandoverState
    _calm: bool  # nothing but the network stops a flow
    _step_ends: list[int]
    _wire: list[float]
    _carried: dict[Plan, int]  # plan -> how many collectives ran it (for the links' loads)
    _alone: dict[Plan, int]  # plan -> how many ran it whole on the fast path (for the links' busy time)
    _busy: np.ndarray  # busy seconds of fast-path parts of collectives, per link
    _ended: list[Instance]  # every collective and message, in the order they ended
    _last_end: int
    _events: int
    _horizon: float  # the earliest cursor of a rank waiting for input
    _lookahead: set[int]  # ranks waiting for input that do not hold the clock back
    _gates: bool
    _mirror: bool  # ranks 1.. mirror rank 0 (see feed_trace)
    _inbox: dict[int, list[Instance]]  # receiver -> messages delivered that it has not received
    _any: dict[int, RankState]  # receivers waiting in an any-source receive
    _rendezvous: bool  # gloo: a message waits for its receiver's recv-ready notice (Engine._post)
    _unmatched: dict[int, list[Instance]]  # gloo: receiver -> messages sent that wait for its receive
    _on_wire: dict[tuple[int, ...], list[Instance]]  # gloo: (sender, receiver) -> messages whose bytes have not left
    _behind: dict[Instance, list[Instance]]  # gloo: message -> recv-ready notices queued behind its bytes
    _received: dict[int, list[tuple[int, float]]]  # receiver -> (sender, seconds) its AnyRecvs took
    _group_end: dict[tuple[int, ...], int]  # members -> tick their latest collective ended
    _rtos: dict[tuple[int, ...], float]  # members -> the RTO of their slowest pair
    _set_up: set[tuple[int, ...]]  # groups whose one-time set-up is paid
    _failing: int  # failure calls on the agenda
    _stalled: dict[int, int]  # rank -> its next failure, while nothing else can move

    if TYPE_CHECKING:  # the methods its parts call across files (engine, eventpath, handover, outages, queries)
        def close(self, rank: int | None = None) -> None: ...
        def run_until_blocked(self) -> float: ...
        def down_at(self, rank: int, t: float) -> bool: ...
        def was_down(self, rank: int, a: float, b: float) -> bool: ...
        def _advance(self, rk: RankState) -> None: ...
        def _spend(self, rk: RankState, a: int, b: int, kind: int) -> None: ...
        def _add_busy(self, busy: np.ndarray) -> None: ...
        def _queue_start(self, c: Instance) -> None: ...
        def _sending_until(self, c: Instance, end: int) -> None: ...
        def _sent(self, t: int, c: Instance, token: int | None = None) -> None: ...
        def _block(self, rk: RankState, c: Instance) -> None: ...
        def _release(self, rk: RankState, c: Instance) -> None: ...
        def _start(self, t: int, c: Instance) -> None: ...
        def _drain(self, t: int) -> None: ...
        def _net_changed(self, t: int) -> None: ...
        def _deliver_later(self, timed: Iterable[tuple[int, Instance, int]]) -> None: ...
        def _phase_done(self, t: int, c: Instance) -> None: ...
        def _end(self, t: int, c: Instance) -> None: ...
        def _take_over(self, t: int, c: Instance, settle: bool = True) -> None: ...
        def _take_over_touching(self, t: int, links: frozenset[int]) -> None: ...
        def _rest(self, c: Instance, origin: int, p: int) -> None: ...
        def _overlaps(self, t: int, c: Instance, origin: int, p: int,
                      links: frozenset[int]) -> list[tuple[int, Instance]] | None: ...
        def _split(self, t: int, c: Instance, token: int, other: Instance, other_token: int) -> None: ...
