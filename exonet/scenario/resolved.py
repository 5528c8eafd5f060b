"""Resolved: a scenario made concrete for a node count, in SI base units, which is all the simulator reads.

``exonet.scenario.scenario`` builds it (``Scenario.resolve``) from a document whose quantities are
strings and whose ranks may be shares; the records here are plain frozen values: the hosts, the
inter-region links, the transient events and the failure process, and ``Resolved`` itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class HostSpec:
    """Hosts of ``devices`` consecutive ranks joined by an intra-host fabric (NVLink-class)."""

    devices: int  # ranks per host; host h holds ranks [h*devices, (h+1)*devices)
    bandwidth: float  # bytes/s of each device's port into the fabric, each direction (efficiency applied)
    latency: float = 0.0  # seconds, one-way, between two devices of one host
    nic: str = "per-device"  # "per-device": a NIC per rank; "per-host": the host's devices share its lowest rank's NIC

    def host(self, rank: int) -> int:
        """The host that holds ``rank``."""
        return rank // self.devices


@dataclass(frozen=True)
class LinkSpec:
    """An inter-region link: shared by all flows crossing it, each direction."""

    bandwidth: float  # bytes/s, each direction, efficiency applied
    latency: float  # seconds, one-way; replaces the node latency for pairs across it


@dataclass(frozen=True)
class StoreSpec:
    """An object store between peers (``comm.put``/``comm.get``): the last rank of a replay that uses one."""

    latency: float  # seconds added to each request's path (a round trip to the store's front end)
    upload: float | None  # bytes/s one peer may send it (None: its NIC's)
    download: float | None  # bytes/s one peer may read from it (None: its NIC's)
    throughput: float  # bytes/s the store takes in, and gives out, over all peers


@dataclass(frozen=True)
class EventSpec:
    """A transient slowdown ("slow", compute time x factor) or outage ("down") of some ranks."""

    kind: str  # "slow" | "down"
    ranks: tuple[int, ...]
    from_step: int | None = None
    to_step: int | None = None  # exclusive
    from_s: float | None = None
    to_s: float | None = None  # exclusive
    factor: float = 1.0


@dataclass(frozen=True)
class FailureSpec:
    """A failure process per rank: up for Exp(mtbf), then down for a repair (per ``distribution``) plus ``restart``."""

    mtbf: float  # seconds, the mean up-time between failures
    repair: float = 0.0  # seconds: fixed, or the mean of the exponential / lognormal draw
    restart: float = 0.0  # seconds, fixed: reload and rejoin after the repair
    distribution: str = "fixed"  # "fixed" | "exponential" | "lognormal" (repair times)
    sigma: float = 0.0  # the lognormal's sigma
    seed: int = 0
    servers: bool = True  # whether server ranks (a parameter server) fail too; False: only trainers do
    slice: int = 1  # devices one failure takes down (its blast radius), for the worker model (netsim.workers)
    pause: float = 0.0  # seconds an elastic worker stalls on each failure (netsim.workers)

    def expected_failures(self, num_nodes: int, seconds: float) -> float:
        """Expected failures over ``seconds`` of run on ``num_nodes`` ranks: nodes × T / (mtbf + repair + restart)."""
        return num_nodes * seconds / (self.mtbf + self.repair + self.restart)


# The share of its send buffer that a bulk sender keeps in flight: Linux wakes a blocked writer only once a third of
# the buffer is free, and the buffer also holds bytes not yet sent. `ss -tmi` on a stream at RTT 100 ms showed 2.9 MB
# unacknowledged of a 4 MiB buffer (the validate README, "Linux's window").
SEND_BUFFER_IN_FLIGHT = 0.7


def linux_window(tcp_wmem_max: float, tcp_rmem_max: float) -> float:
    """The bytes one TCP stream keeps in flight on a Linux host with these buffer maxima and autotuning: what its
    send buffer keeps in flight, or what the receiver advertises (half its buffer, ``tcp_adv_win_scale = 1``)."""
    return min(SEND_BUFFER_IN_FLIGHT * tcp_wmem_max, tcp_rmem_max / 2)


# Linux's defaults, tcp_wmem max 4 MiB and tcp_rmem max 6 MiB: 2.8 MiB. A scenario with a `backend` describes real
# hosts, so this is its `tcp_window` unless it gives one.
LINUX_WINDOW = linux_window(4 * 1024 * 1024, 6 * 1024 * 1024)

# The most one TCP flow may carry on a cloud's VMs, by the vendor's documentation, where it states one: AWS limits a
# single flow (one 5-tuple) to 5 Gbit/s between instances outside one cluster placement group (10 Gbit/s inside
# one; "Amazon EC2 instance network bandwidth", EC2 User Guide). GCP's and Azure's bandwidth pages state no per-flow
# limit, so none is assumed there. With NCCL each socket is a flow; set network.flow_rate for other cases.
FLOW_RATE = {"aws": 5e9 / 8}
# An object store's defaults: a bucket takes in and gives out far more than one peer's NIC (S3 serves 100 Gbit/s to a
# single client prefix-sharded), and its first byte takes tens of milliseconds.
STORE_THROUGHPUT = 100e9 / 8
STORE_LATENCY = 0.03


@dataclass(frozen=True)
class NcclSpec:
    """How NCCL runs a scenario's collectives (``[network.nccl]``); the defaults are NCCL's own, see netsim/nccl.py."""

    algorithm: str = "auto"  # "auto" (NCCL's tuner picks per call) | "ring" | "tree"
    protocol: str = "auto"  # "auto" | "simple" | "ll" | "ll128"
    channels: int = 2  # rings (and trees) NCCL runs side by side, each on its own connections
    buffsize: float = 4 * 1024 * 1024  # NCCL_BUFFSIZE: a connection's 8 steps; a ring chunk is half of it
    nic: str = "generic"  # the NIC's vendor, which sets NCCL's socket defaults: "generic" | "aws" | "gcp"
    transport: str = "socket"  # "socket" (TCP: windows, slow start) | "ib" (InfiniBand/RoCE verbs: no TCP)
    socket_threads: int | None = None  # NCCL_SOCKET_NTHREADS (None: the NIC's default)
    socks_per_thread: int | None = None  # NCCL_NSOCKS_PERTHREAD (None: the NIC's default)

    @property
    def sockets(self) -> int:
        """TCP connections that carry a channel's data between two ranks: threads × sockets per thread, at most 64.

        net_socket.cc's defaults: 2 × 8 on AWS (ENA), 4 × 1 on GCP (gVNIC), and none elsewhere, where the data
        goes down the connection's one control socket.
        """
        threads, socks = {"aws": (2, 8), "gcp": (4, 1), "generic": (1, 1)}[self.nic]
        threads = self.socket_threads or threads
        return min(64, threads * (self.socks_per_thread or socks))


@dataclass(frozen=True)
class Resolved:
    """A scenario made concrete for ``num_nodes`` ranks; every quantity in SI base units.

    Attributes:
        uplink / downlink: per-rank NIC rates in bytes/s (efficiency applied).
        region: per-rank region name ("default" when the scenario has no regions).
        latency: default one-way node-to-node latency in seconds.
        links: inter-region links keyed by the sorted pair of region names.
        speed: per-rank relative compute throughput (compute time / speed).
        algorithms: op name -> algorithm name, for every op in exonet.trace.OPS.
        sharing: "max-min" or "fifo".
        tcp_window: bytes, or None; a flow's rate is capped at window / (2 * latency of its path), and not
            at all on a path whose latency is 0.
        mss / header_bytes: TCP payload bytes per packet (None: no framing) and the bytes per packet
            the links count besides it; a message of s bytes puts s + ceil(s / mss) * header_bytes on them.
        message_overhead: host seconds per message (send + receive), added to every message's latency.
        host_cores: None, or the CPU cores all nodes share (one machine running every node): a phase's
            host work is spread over them, so message_overhead counts max(1, num_nodes / host_cores) times.
        group_concurrency: how many collectives of one group may run at once (1: in issue order, as NCCL).
        queue: the bottleneck queue of each NIC direction, (bytes, "bytes") or (seconds at the link's rate, "s");
            None: no queue (the fluid model). ``queue_delay`` turns it into seconds at a rate.
        streams: TCP connections a transfer between two nodes is split over (1: gloo).
        setup: seconds the first collective (or message) of each group pays before it starts.
        backend: None (the phase model), "nccl" or "gloo": the library whose collectives and sockets run.
        nccl: how NCCL runs (with backend "nccl"), else None.
        slow_start: whether a connection idle longer than its RTO restarts from the initial window.
        inflight: bytes a transfer between two ranks may have in flight (its TCP windows), or None: no cap.
        flow_rate: the most one TCP connection may carry, bytes/s (a cloud's per-flow limit), or None: no limit;
            a transfer over ``streams`` connections gets ``streams`` times it (``flow_cap``).
        compute_mode: "measured" | "wall" | "flops"; tflops and mfu serve "flops".
        jitter: "none" | "lognormal" | "normal" | "exponential"; sigma its spread; seed its RNG seed.
        events: transient slowdowns and outages.
        hosts: None (every rank its own machine), or the hosts the ranks sit in: messages between two devices
            of one host cross only the fabric, with the fabric's latency.
        failures: the failure process of every rank (``[failures]``), or None.
        servers: how many of the last ranks serve (they fail only if ``failures.servers``).
        store: the object store (``[store]``), played by the last rank, when the replayed trace puts and gets.
        egress: dollars per byte that cross from region a to region b, keyed (a, b): the link's ``egress``,
            else region a's; pairs without a price are free.
    """

    num_nodes: int
    uplink: tuple[float, ...]
    downlink: tuple[float, ...]
    region: tuple[str, ...]
    latency: float
    links: dict[tuple[str, str], LinkSpec] = field(default_factory=dict)
    speed: tuple[float, ...] = ()
    algorithms: dict[str, str] = field(default_factory=dict)
    sharing: str = "max-min"
    tcp_window: float | None = None
    mss: float | None = None
    header_bytes: float = 0.0
    message_overhead: float = 0.0
    host_cores: float | None = None
    group_concurrency: int = 1
    queue: tuple[float, str] | None = None
    streams: int = 1
    setup: float = 0.0
    compute_mode: str = "measured"
    tflops: float | None = None
    mfu: float = 1.0
    jitter: str = "none"
    sigma: float = 0.0
    seed: int = 0
    events: tuple[EventSpec, ...] = ()
    name: str = ""
    hosts: HostSpec | None = None
    failures: FailureSpec | None = None
    servers: int = 0  # the last ``servers`` ranks serve (a parameter server); the rest train
    backend: str | None = None
    nccl: NcclSpec | None = None
    slow_start: bool = False
    recovery: float = 1.0  # multiplies the loss-recovery cost per stream (netsim's RECOVERY_BYTES): its draw
    flow_rate: float | None = None
    egress: dict[tuple[str, str], float] = field(default_factory=dict)  # $/byte from region a to region b
    store: StoreSpec | None = None  # the object store, the last rank (one of the servers), when the trace uses one

    @property
    def inflight(self) -> float | None:
        """Bytes a transfer may have in flight: ``streams`` TCP windows."""
        return None if self.tcp_window is None else self.streams * self.tcp_window

    @property
    def flow_cap(self) -> float:
        """The most a transfer between two ranks may carry by the per-flow limit: ``streams`` flows' worth."""
        return math.inf if self.flow_rate is None else self.streams * self.flow_rate

    def path_latency(self, src: int, dst: int) -> float:
        """One-way latency between two ranks (the fabric's within a host, the inter-region link's across regions;
        the object store is on no host)."""
        on_store = self.store is not None and self.num_nodes - 1 in (src, dst)
        if self.hosts is not None and not on_store and self.hosts.host(src) == self.hosts.host(dst):
            return self.hosts.latency
        a, b = self.region[src], self.region[dst]
        if a == b:
            return self.latency
        return self.links[(min(a, b), max(a, b))].latency

    def max_latency(self, ranks: Sequence[int]) -> float:
        """The largest ``path_latency`` between two of ``ranks``, a rank with itself included: worked out on a few
        of them, as a path's latency depends only on whether its ends share a host (or one is the store) and on
        their regions: per region, the ranks of at most two hosts."""
        places: dict[tuple[str, bool], dict[int | None, int]] = {}
        for r in ranks:
            on_store = self.store is not None and r == self.num_nodes - 1
            hosts = places.setdefault((self.region[r], on_store), {})
            host = None if self.hosts is None or on_store else self.hosts.host(r)
            if host not in hosts and len(hosts) < 2:
                hosts[host] = r
        few = [r for hosts in places.values() for r in hosts.values()]
        return max(self.path_latency(a, b) for a in few for b in few)

    def queue_delay(self, rate: float) -> float:
        """Seconds a full bottleneck queue holds a packet at ``rate`` bytes/s (0 without a queue)."""
        if self.queue is None:
            return 0.0
        value, unit = self.queue
        return value if unit == "s" else value / rate
