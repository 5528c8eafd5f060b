"""Topology: which links a message crosses, its latency and its rate cap.

Every rank has a NIC with an uplink and a downlink (bytes/s). A message from rank a
to rank b crosses a's uplink, then the inter-region link in the a→b direction when
the two ranks sit in different regions (shared by every flow crossing it that way),
then b's downlink. Latency α is one-way and paid once per message, end to end; a
scenario's ``message_overhead`` (host cost per message) adds to it, max(1, n/host_cores)
times when the n nodes share ``host_cores`` CPU cores (every member of a phase does its
host work at once, so one machine's cores serve them in turn). With ``mss`` set,
a message of s payload bytes puts s + ⌈s/mss⌉·header_bytes on its links (the packets'
headers, counted as a shaper or NIC counts them); without it, s.
A TCP window W caps a flow at W / (2α) on its path, and ``flow_rate`` (a cloud's per-flow
limit, AWS's 5 Gbit/s by default under NCCL with ``nic = "aws"``) caps it at that whatever
the latency, ``streams`` times over for a transfer split over connections; on a path with α = 0 the round
trip is 0 and the window never binds (the scenario schema refuses a window when
every latency is 0, since it would then do nothing at all). A transfer split over
``streams`` = N TCP connections has N windows: its cap is N·W / RTT (``Resolved.inflight``).

With a ``queue`` (Q bytes, or τ seconds at the rate, per NIC direction), a direction that
a phase saturates holds a standing queue: q = Q/B seconds (τ). The ACKs of a flow leave
through its receiver's uplink and arrive through its sender's downlink, so they wait
behind the data queued there: the flow's window cap becomes N·W / (2α + Σ q over the NIC
directions of its ACK path that hold a queue). Its own data's queue does not count: the
bytes queued there are its own window's, and a window that fills them keeps the link
busy. A direction holds a queue in a phase when the phase's allocation without queues
fills it and it is the first full link of a flow that its window does not limit.
A full queued direction also overflows: its streams lose packets and stall in recovery,
the more the fewer bytes of queue each holds. With m transfers of N streams crossing it,
w = Q / (m·N) bytes per stream, it runs at e = w / (w + c) of its rate, c = RECOVERY_BYTES
(measured, see exonet/validate/README.md), once the phase's first Q bytes through it have
filled the queue: a phase putting D > Q bytes through it keeps D / (Q + (D − Q)/e) of its
rate, and one with D ≤ Q never overflows it.

With ``[hosts]``, a message between two devices of one host crosses only the fabric:
the sender's fabric up-port and the receiver's fabric down-port, with the fabric's latency
and no TCP window (NVLink is not TCP). Between hosts it crosses NICs as above; under
``nic = "per-host"`` every device of a host uses the host's one NIC, that of its lowest rank
(so the host's flows share it, at that rank's rates).

Links are numbered so a flow is a tuple of small integers: uplinks ``0..n-1``,
downlinks ``n..2n-1``, then two ids per inter-region link (one per direction), then,
with hosts, the fabric up-ports and down-ports of the n devices.
Each link has a readable name (``link_name``: "uplink 3", "downlink 3", "us->eu",
"fabric up 3"), for per-link statistics.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from exonet.errors import ScenarioError
from exonet.netsim.flows import REL_TOL, Batch, Shape, max_min
from exonet.netsim.tcp import INITIAL_WINDOW, SEGMENT
from exonet.scenario import Resolved

_CACHE_LIMIT = 4096
# Bytes of link time a stream's losses cost per queue share it holds, read off the netns matrix of
# exonet/validate/README.md ("Real slow links"); the same at MTU 1500 and 9001, so bytes, not packets.
RECOVERY_BYTES = 11000.0

# A point-to-point message of a collective phase: (source rank, destination rank, bytes), optionally with a
# fourth item, seconds added to its path's latency (negative where a pipelined algorithm hides part of it behind
# the transfer of the slices before it; see exonet/netsim/nccl.py).
Message = tuple[int, int, float] | tuple[int, int, float, float]
Phase = tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class Path:
    """What a message from one rank to another goes through."""

    links: tuple[int, ...]
    latency: float  # one-way seconds, the scenario's message_overhead included
    cap: float  # per-flow rate cap in bytes/s (TCP window / RTT); inf when uncapped or the path's latency is 0
    rate: float  # the rate this path gives a lone flow: min(cap, every link's capacity)


class Topology:
    """Links, capacities and paths of a resolved scenario.

    Args:
        resolved: the scenario made concrete for the trace's node count.
    """

    def __init__(self, resolved: Resolved) -> None:
        n = resolved.num_nodes
        for name, rates in (("uplink", resolved.uplink), ("downlink", resolved.downlink)):
            if len(rates) != n:
                raise ScenarioError(f"scenario: {name} lists {len(rates)} ranks, expected num_nodes={n}")
            bad = [r for r, x in enumerate(rates) if not x > 0 or math.isinf(x)]
            if bad:
                raise ScenarioError(f"scenario: {name} of rank {bad[0]} must be a positive finite rate, "
                                    f"got {rates[bad[0]]!r}")
        if len(resolved.region) != n:
            raise ScenarioError(f"scenario: region lists {len(resolved.region)} ranks, expected num_nodes={n}")
        if resolved.tcp_window is not None and not resolved.tcp_window > 0:
            raise ScenarioError(f"scenario: tcp_window must be > 0 bytes, got {resolved.tcp_window!r}")
        self.num_nodes = n
        self._resolved = resolved
        self.capacity: list[float] = [*resolved.uplink, *resolved.downlink]
        self._link_ids: dict[tuple[str, str], int] = {}
        for (a, b), spec in sorted(resolved.links.items()):
            if not spec.bandwidth > 0:
                raise ScenarioError(f"scenario: link between {a!r} and {b!r} needs a positive bandwidth, "
                                    f"got {spec.bandwidth!r}")
            for direction in ((a, b), (b, a)):
                self._link_ids[direction] = len(self.capacity)
                self.capacity.append(spec.bandwidth)
        hosts = self.hosts = resolved.hosts
        self._fabric = len(self.capacity)
        if hosts is not None:
            if not hosts.bandwidth > 0 or math.isinf(hosts.bandwidth):
                raise ScenarioError("scenario: hosts.bandwidth must be a positive finite rate, "
                                    f"got {hosts.bandwidth!r}")
            self.capacity.extend([hosts.bandwidth] * (2 * n))
        self._paths: dict[tuple[int, int], Path] = {}
        self._rtts: dict[tuple[int, int], float] = {}  # a plan of 1,024 devices asks for 17.8M, of few pairs
        self._wire: dict[float, float] = {}  # payload -> wire bytes, of the few message sizes a plan has
        self._shapes: dict[Hashable, Shape] = {}  # by the phase's (src, dst) pairs (and shifts, sizes: _phase)
        self._phases: dict[int, tuple[Phase, Shape, np.ndarray]] = {}  # id(phase) -> (phase, shape, wire sizes)
        self._reach: dict[int, tuple[Sequence[Phase], frozenset[int]]] = {}  # id(plan's phases) -> (phases, links)
        # of the phases that overflowed a queue: whether each stream's piece fit in one initial window
        self._overflows: set[bool] = set()
        self.lossy = False  # whether a phase lost packets to an overflowing queue: a stochastic regime

    @property
    def resolved(self) -> Resolved:
        """The scenario this topology was built from."""
        return self._resolved

    def load(self, phase: Phase) -> np.ndarray:
        """Bytes the messages of ``phase`` put on each link, by link id (wire sizes, headers included)."""
        _, shape, sizes = self._phase(phase)
        out = np.zeros(len(self.capacity) + 1)  # the last entry takes the padding of short paths
        np.add.at(out, shape.links, np.broadcast_to(sizes[:, None], shape.links.shape))
        return out[:-1]

    def path(self, src: int, dst: int) -> Path:
        """The path of a message from ``src`` to ``dst`` (cached)."""
        key = (src, dst)
        p = self._paths.get(key)
        if p is None:
            p = self._paths[key] = self._build(src, dst)
        return p

    def host(self, rank: int) -> int:
        """The host holding ``rank`` (each rank is its own host when the scenario has none)."""
        return rank if self.hosts is None else self.hosts.host(rank)

    def region(self, rank: int) -> str:
        return self._resolved.region[rank]

    def link_name(self, link: int) -> str:
        """A readable name for link id ``link``: "uplink 3", "downlink 3", "us->eu", "fabric up 3", "fabric down 3"."""
        n = self.num_nodes
        if link < 2 * n:
            return f"{'uplink' if link < n else 'downlink'} {link % n}"
        if link >= self._fabric:
            return f"fabric {'up' if link - self._fabric < n else 'down'} {(link - self._fabric) % n}"
        return next(f"{a}->{b}" for (a, b), i in self._link_ids.items() if i == link)

    def _build(self, src: int, dst: int) -> Path:
        r = self._resolved
        share = 1.0 if r.host_cores is None else max(1.0, self.num_nodes / r.host_cores)
        hosts, n = self.hosts, self.num_nodes
        if r.store is not None and n - 1 in (src, dst):
            return self._store_path(src, dst, share)
        if hosts is not None and hosts.host(src) == hosts.host(dst):
            links: tuple[int, ...] = (self._fabric + src, self._fabric + n + dst)
            return Path(links, hosts.latency + r.message_overhead * share, math.inf, hosts.bandwidth)
        nic_src, nic_dst = src, dst
        if hosts is not None and hosts.nic == "per-host":
            nic_src, nic_dst = src - src % hosts.devices, dst - dst % hosts.devices
        a, b = r.region[src], r.region[dst]
        links = (nic_src, n + nic_dst)
        if a != b:
            links = (nic_src, self._region_link(a, b, src, dst), n + nic_dst)
        latency = r.path_latency(src, dst)
        inflight = r.inflight
        cap = inflight / (2.0 * latency) if inflight is not None and latency > 0 else math.inf
        cap = min(cap, r.flow_cap)  # a cloud's per-flow limit, whatever the latency
        rate = min(cap, *(self.capacity[i] for i in links))
        return Path(links, latency + r.message_overhead * share, cap, rate)

    def egress_cost(self, load: np.ndarray) -> float:
        """Dollars for ``load`` (bytes by link id): what crosses each priced inter-region link times its price."""
        prices = self._resolved.egress
        return sum(float(load[i]) * prices[pair] for pair, i in self._link_ids.items() if pair in prices)

    def _store_path(self, src: int, dst: int, share: float) -> Path:
        """A request to the object store (the last rank) or a read from it: the peer's NIC and the store's, any
        inter-region link between them, the store's latency on top of the path's, capped at ``upload`` (to it) or
        ``download`` (from it) as well as by the windows and the per-flow limit."""
        r, n = self._resolved, self.num_nodes
        store = r.store
        assert store is not None  # only called for a replay with a store
        peer = dst if src == n - 1 else src
        nic = peer
        if self.hosts is not None and self.hosts.nic == "per-host":
            nic = peer - peer % self.hosts.devices
        a, b = r.region[src], r.region[dst]
        ends = (nic, n + n - 1) if dst == n - 1 else (n - 1, n + nic)
        links = ends if a == b else (ends[0], self._region_link(a, b, src, dst), ends[1])
        latency = r.path_latency(src, dst) + store.latency
        cap = r.inflight / (2.0 * latency) if r.inflight is not None and latency > 0 else math.inf
        limit = store.upload if dst == n - 1 else store.download
        cap = min(cap, r.flow_cap, math.inf if limit is None else limit)
        rate = min(cap, *(self.capacity[i] for i in links))
        return Path(links, latency + r.message_overhead * share, cap, rate)

    def _region_link(self, a: str, b: str, src: int, dst: int) -> int:
        link = self._link_ids.get((a, b))
        if link is None:
            raise ScenarioError(f"scenario: ranks {src} ({a!r}) and {dst} ({b!r}) exchange data "
                                f"but no link joins regions {a!r} and {b!r}")
        return link

    def wire_size(self, size: float) -> float:
        """The bytes a message of ``size`` payload bytes puts on its links (payload plus packet headers)."""
        mss = self._resolved.mss
        return size if mss is None or size == 0 else size + math.ceil(size / mss) * self._resolved.header_bytes

    def lone_rates(self, phase: Phase) -> np.ndarray:
        """Each message's max-min rate (bytes/s) when ``phase`` runs alone on the network."""
        _, shape, _ = self._phase(phase)
        return max_min(shape.links, shape.cap, np.array([*self.capacity, math.inf]))

    def rtt(self, src: int, dst: int) -> float:
        """The round trip of a message from ``src`` to ``dst``: twice the one-way latency (host overheads left out)."""
        rtt = self._rtts.get((src, dst))
        if rtt is None:
            rtt = self._rtts[(src, dst)] = 2.0 * self._resolved.path_latency(src, dst)
        return rtt

    def batch(self, phase: Phase, tag: object) -> Batch:
        """The messages of ``phase`` as one batch owned by ``tag``."""
        _, shape, sizes = self._phase(phase)
        return Batch(shape, sizes, tag)

    def reach(self, phases: Sequence[Phase]) -> frozenset[int]:
        """The links the messages of ``phases`` (a collective's plan) cross (cached by identity, as plans are)."""
        hit = self._reach.get(id(phases))
        if hit is None or hit[0] is not phases:
            if len(self._reach) >= _CACHE_LIMIT:
                self._reach.clear()
            hit = self._reach[id(phases)] = (phases, frozenset().union(*(self._phase(p)[1].reach for p in phases)))
        return hit[1]

    def _phase(self, phase: Phase) -> tuple[Phase, Shape, np.ndarray]:
        """``phase``'s shape and wire sizes.

        Phases are cached by identity (plans are cached, so a run's phases are a few objects
        reused every step), and phases with the same (source, destination) pairs share one
        ``Shape``, so the network's cache of allocations serves all of them.
        """
        hit = self._phases.get(id(phase))
        if hit is None or hit[0] is not phase:
            pairs = tuple((m[0], m[1]) for m in phase)
            wire = self._wire
            sizes = np.array([wire[m[2]] if m[2] in wire else wire.setdefault(m[2], self.wire_size(m[2]))
                              for m in phase], dtype=float)
            shift = tuple(m[3] if len(m) > 3 else 0.0 for m in phase)
            key: Hashable = pairs if not any(shift) else (pairs, shift)
            key = key if self._resolved.queue is None else (key, sizes.tobytes())  # recovery depends on bytes
            shape = self._shapes.get(key)
            if shape is None:
                shape = self._shape(pairs, sizes, shift)
                if len(self._shapes) >= _CACHE_LIMIT:
                    self._shapes.clear()
                self._shapes[key] = shape
            if len(self._phases) >= _CACHE_LIMIT:
                self._phases.clear()
            hit = self._phases[id(phase)] = (phase, shape, sizes)
        return hit

    def _shape(self, pairs: Sequence[tuple[int, int]], sizes: np.ndarray, shift: Sequence[float]) -> Shape:
        paths = [self.path(src, dst) for src, dst in pairs]
        return Shape([p.links for p in paths], [a for a, _ in pairs], [b for _, b in pairs],
                     self._caps(pairs, paths, sizes), [max(0.0, p.latency + d) for p, d in zip(paths, shift)],
                     pad=len(self.capacity))

    def _caps(self, pairs: Sequence[tuple[int, int]], paths: Sequence[Path], sizes: np.ndarray) -> list[float]:
        """Each message's rate cap in a phase, with the queue's two terms (see the module docstring).

        Both are set from the phase's allocation without them, as if the phase ran alone: the
        ACK term N·W / (2α + q of the queues on its ACK path), and the recovery term: each of the
        m transfers through a full queued direction is capped at its share of what that keeps.
        """
        r = self._resolved
        caps = [p.cap for p in paths]
        if r.queue is None:
            return caps
        pad = len(self.capacity)
        width = max(len(p.links) for p in paths)
        links = np.array([p.links + (pad,) * (width - len(p.links)) for p in paths], dtype=np.intp)
        capacity = np.array([*self.capacity, math.inf])
        rate = max_min(links, np.array(caps, dtype=float), capacity)
        load = np.bincount(links.ravel(), weights=np.repeat(rate, width), minlength=pad + 1)
        full = (load >= capacity * (1.0 - REL_TOL)) & (np.arange(pad + 1) < 2 * self.num_nodes)  # NIC directions
        crossing = np.bincount(links.ravel(), minlength=pad + 1)
        through = np.bincount(links.ravel(), weights=np.repeat(sizes, width), minlength=pad + 1)
        inflight = r.inflight
        waits = self._standing_queues(pairs, paths, caps, rate, full, inflight) if inflight is not None else {}
        burst = r.streams * INITIAL_WINDOW * (SEGMENT if r.mss is None else r.mss + r.header_bytes)
        out = []
        for (src, dst), p, cap, size in zip(pairs, paths, caps, sizes):
            if inflight is not None:
                rtt = 2.0 * r.path_latency(src, dst) + sum(waits.get(link, 0.0) for link in self.path(dst, src).links)
                cap = min(inflight / rtt, r.flow_cap) if rtt > 0 else cap
            for link in p.links:
                keep = self._recovery(link, int(crossing[link]), float(through[link])) if full[link] else 1.0
                if keep < 1.0:  # its share of what the direction keeps
                    cap = min(cap, keep * self.capacity[link] / int(crossing[link]))
                    self.lossy = True
                    self._overflows.add(bool(size <= burst))
            out.append(cap)
        return out

    def cautions(self) -> tuple[str, ...]:
        """Where the phases replayed so far sit in a regime the real-links testbed found this model optimistic in.

        Several TCP streams overflowing a shaped queue: real links took 0.8–2.7× the model's time
        (median 1.3×); with pieces that fit in one initial window, whose losses end in retransmission
        timeouts, up to 7.5× (exonet/validate/README.md). One stream is left out: it was measured
        within about ±10% of the model, with the outliers listed there.
        """
        r = self._resolved
        if r.streams == 1 or not self._overflows:
            return ()
        text = (f"phases overflow the shaped queue with {r.streams} TCP streams per transfer: the testbed's "
                "real tbf-shaped links took 0.8-2.7x this model's time there (median 1.3x)")
        if True in self._overflows:
            text += (f", and up to 7.5x where, as here, each stream's piece fits in one initial window "
                     f"({INITIAL_WINDOW} segments) and its losses end in retransmission timeouts")
        return (text + "; expect real times above these (exonet/validate/README.md, Real slow links)",)

    def _recovery(self, link: int, transfers: int, nbytes: float) -> float:
        """The share of its rate a full queued direction keeps when a phase puts ``nbytes`` through it.

        The first Q bytes fill the queue without loss; the rest run at e = w / (w + c), w the
        queue's bytes per stream, c = RECOVERY_BYTES: D / (Q + (D − Q) / e) over D = ``nbytes``.
        """
        r = self._resolved
        queue = r.queue_delay(self.capacity[link]) * self.capacity[link]
        if nbytes <= queue:
            return 1.0
        per_stream = queue / (transfers * r.streams)
        e = per_stream / (per_stream + RECOVERY_BYTES * r.recovery)
        return nbytes / (queue + (nbytes - queue) / e)

    def _standing_queues(self, pairs: Sequence[tuple[int, int]], paths: Sequence[Path], caps: Sequence[float],
                         rate: np.ndarray, full: np.ndarray, window: float) -> dict[int, float]:
        """Seconds of standing queue per NIC direction in a phase, from its allocation without queues (``rate``).

        A flow that its window does not limit builds its queue at the first full link of its path;
        that queue holds what the windows of its flows put in flight beyond their round trips
        (N·W − rate·2α each), at most Q.
        """
        r = self._resolved
        excess: dict[int, float] = {}
        for (src, dst), p, flow, cap in zip(pairs, paths, rate, caps):
            first = next((link for link in p.links if full[link]), None)
            if first is not None and flow < cap * (1.0 - REL_TOL):
                excess[first] = excess.get(first, 0.0) + window - flow * 2.0 * r.path_latency(src, dst)
        return {link: min(r.queue_delay(self.capacity[link]), extra / self.capacity[link])
                for link, extra in excess.items()}
