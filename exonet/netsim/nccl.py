"""NCCL's collectives as it runs them over TCP sockets: pipelined rings, double binary trees, and its tuner.

Read from NCCL 2.30 (``src/include/collectives.h``, ``src/enqueue.cc``, ``src/device/all_reduce.h``,
``src/device/prims_simple.h``, ``src/graph/tuning.cc``, ``src/graph/trees.cc``,
``src/transport/net_socket.cc``); the netsim README cites the lines.

**Channels.** NCCL cuts a buffer into contiguous parts, one per channel (2 on a host with one
NIC), and runs each part on its own connections; for small buffers it uses fewer channels (one
per 32 KiB for the Simple ring). The channels share the NIC, so each runs at b = R / C of the
ring's rate R.

**The pipelined ring (Simple protocol).** A channel loops over its part in chunks of 2 MiB per
rank (the last loop's chunk is what is left ÷ n). A loop of an all-reduce is 2(n−1) steps of one
chunk; each step is cut into slices (half a chunk, at least 32 KiB), and a rank forwards a slice as
soon as it has arrived, while the slice after it is still on the wire. With τ = c / b a step's time
on the wire, x = τ / m its slice's (m slices per step) and a the one-way latency plus NCCL's
per-hop overhead, step k+1 starts max(τ, x + a) after step k: the link stays busy (latency hidden)
when τ ≥ x + a, else it waits x + a per step. A loop ends when its last step has arrived, and the
next starts then (the kernel's loop is sequential):

    T_loop = (s − 1)·max(τ, x + a) + τ + a,     s = 2(n−1) (all-reduce), n−1 (all-gather, reduce-scatter)
    T      = base latency + Σ over loops T_loop

Where the ring's hops differ in latency (regions), a in the max is their mean (each step waits on
the hop before it, so the waits go round the ring) and the last term the slowest hop's.

where the phase model pays s·(α + τ) per loop. All-gather and reduce-scatter have the same loop of
n−1 steps. Broadcast is a chain (root first) in 512 KiB chunks, one slice each:
T = base + (n−2)·(τ_c + a) + S_ch / b + a, τ_c the chunk's time. Reduce is the same chain run towards
the root (each rank adds what arrives to its own and forwards it): the broadcast mirrored, the same T.
Gather and scatter are grouped send/recv (the phase model's direct algorithm), and torch's barrier on
NCCL is an all-reduce of one float.

**The tree (all-reduce).** Two binary trees over the ranks, each carrying half of the buffer (one
leaf where the other is interior); every chunk (512 KiB) goes up D = ⌊log2 n⌋ levels, reduced on
the way, and straight back down, with reduce and broadcast running at once, chunk by chunk. On an
idle network T = base + 2D·a + (2D − 1)·x_c + T_bw, with x_c a chunk's time on a channel and T_bw
the time of all the trees' edges carrying their bytes at once, which the fluid network gives (a NIC
sends up to 2S: S/2 up and S to two children where it is interior, S/2 up where it is a leaf;
S/B for n = 2).

**Protocols.** Simple sends the bytes; LL sends 8-byte flags beside every 8 data bytes (wire = 2×
data) in steps of 32 KiB of data, and a rank forwards each 16-byte line as it lands, so a step
waits only on the hop (x = 0: max(τ, a)), with LL's smaller per-hop overhead. LL128 (120 of
every 128 bytes) is off over sockets by default and offered when asked.

**The tuner** picks (algorithm, protocol) by NCCL's own model, time = lat + nBytes / bw (µs, GB/s),
with NCCL's constants for one GPU per host over the network (``_BASE``, ``_HOP``; `ncclTopoTuneModel`
and `ncclTopoGetAlgoTime`). It knows the NIC's speed (here the scenario's rate, as if NCCL read it),
not the network's latency, as NCCL does not (the socket plugin reports 0).

**Into the phase model.** Each NCCL collective is given as phases of messages, as every algorithm
is, so contention, queues, windows, outages and per-link statistics apply unchanged: the ring as its
s phases per loop folded into s phases of the whole buffer (the bytes each link carries are exact),
the tree as one phase of all its edges, broadcast as one phase of its n−1 hops, each carrying the whole
buffer (a pipelined chain keeps every hop busy at once, so each link carries S, for S/R of wire time in
all). Each message carries a latency shift (the fourth item of a message) that makes the phases, run
alone, take exactly the T above; a shift is never more negative than the hop's latency (a message
cannot arrive before it is sent), so a plan must not need more: a chain cut into n−1 whole-buffer
phases did, and cost (n−1)·S/R. Under contention the shift stays what it was alone, an approximation
the README states.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from exonet.netsim.rings import mirrored, ordered, ring_phases
from exonet.netsim.topology import Phase, Topology
from exonet.scenario.resolved import NcclSpec

# Simple protocol sizes, as fractions of NCCL_BUFFSIZE (4 MiB by default) over NCCL_STEPS = 8 steps:
CHUNK = 4 / 8  # the ring's chunk: ALLREDUCE_CHUNKSTEPS = 4 steps (2 MiB)
TREE_CHUNK = 1 / 8  # the tree's and the ring broadcast's chunk: one step (512 KiB)
MIN_SLICE = 2 / 8 / 32  # a slice is at least stepSize × StepPerSlice / 32 (32 KiB)
LL_STEP = 32 * 1024  # LL: 64 KiB of lines per step, half of them flags
CHANNEL_BYTES = 32 * 1024  # NCCL keeps one channel per nt × threshold bytes: 512 threads × 64 (Simple)
LL_CHANNEL_BYTES = 512 * 8  # LL: 512 threads × 8 bytes, × nRanks for the ring
WIRE = {"simple": 1.0, "ll": 2.0, "ll128": 128 / 120}  # wire bytes per data byte
# Tuner constants (µs), one GPU per host, over the network (tuning.cc baseLat and hwLat[NET], tree's for ppn = 1)
_BASE = {("ring", "ll"): 6.6, ("ring", "ll128"): 14.0, ("ring", "simple"): 8.4,
         ("tree", "ll"): 6.8, ("tree", "ll128"): 14.0, ("tree", "simple"): 8.4}
_HOP = {"ll": 5.0, "ll128": 8.5, "simple": 14.0}  # hwLat[NET][TREE][proto]: a step across the network
_LL_MAX_BW = 20.4  # GB/s, llMaxBws for three or more hosts (Intel CPUs)
_PLATEAU = 1.4  # Simple ring all-reduce latency factor across hosts (sm80 and newer)
_TREE_CORRECTION = {  # treeCorrectionFactor[proto][log2(nBytes / 64)], for sizes below 512 MiB
    "ll": (1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1, 1),
    "ll128": (1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1, 1),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}
PROTOCOLS_BY_DEFAULT = ("ll", "simple")  # LL128 needs GPU-direct paths that sockets do not give


def steps(op: str, n: int) -> int:
    """Transfers of one chunk per loop of NCCL's ring."""
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def tuner_time(op: str, algorithm: str, protocol: str, nbytes: float, n: int, channels: int, rate: float) -> float:
    """NCCL's own estimate (µs) of ``op`` on ``nbytes`` across ``n`` hosts of NIC ``rate`` bytes/s.

    inf where the algorithm does not offer the op (the tree only all-reduces).
    """
    if algorithm == "tree" and op != "all_reduce":
        return math.inf
    hop = _HOP[protocol]
    bus = rate / 1e9  # GB/s: the NIC, all channels together
    if algorithm == "ring":
        s = steps(op, n) if op != "broadcast" else n
        lat = _BASE["ring", protocol] + (steps(op, n) if op != "broadcast" else 1) * hop
        bw = {"ll": min(_LL_MAX_BW, bus * 0.5), "ll128": bus * 0.92, "simple": bus}[protocol] * n / s
        if protocol == "simple" and op == "all_reduce" and nbytes / (channels * n) >= 64:
            lat *= _PLATEAU
    else:
        lat = _BASE["tree", protocol] + 2 * int(math.log2(n)) * hop
        bw = {"ll": min(bus / 3.8, _LL_MAX_BW), "ll128": bus * 120 / 128, "simple": bus * 0.92}[protocol] * 0.5
        size_class = int(math.log2(max(1.0, nbytes / 64)))
        if size_class < len(_TREE_CORRECTION[protocol]):
            bw *= _TREE_CORRECTION[protocol][size_class]
    return lat + nbytes / (1000 * bw)


def choose(op: str, nbytes: float, n: int, spec: NcclSpec, rate: float) -> tuple[str, str]:
    """(algorithm, protocol) as NCCL's tuner picks them, within what ``spec`` allows."""
    algorithms = ("ring", "tree") if spec.algorithm == "auto" else (spec.algorithm,)
    protocols = PROTOCOLS_BY_DEFAULT if spec.protocol == "auto" else (spec.protocol,)
    options = [(tuner_time(op, a, p, nbytes, n, spec.channels, rate), a, p) for a in algorithms for p in protocols]
    best = min(options)
    if math.isinf(best[0]):  # the tree only reduces: other ops take the ring
        best = min((tuner_time(op, "ring", p, nbytes, n, spec.channels, rate), "ring", p) for p in protocols)
    return best[1], best[2]


def channels_used(nbytes: float, n: int, protocol: str, channels: int) -> int:
    """Channels NCCL keeps for ``nbytes``: one per 32 KiB (Simple) or per 4 KiB × n (LL ring), at least one."""
    per = CHANNEL_BYTES if protocol != "ll" else LL_CHANNEL_BYTES * n
    c = channels
    while nbytes < c * per and c >= 2:
        c -= 1
    return c


def ring_time(op: str, nbytes: float, n: int, channels: int, rate: float, latency: float,
              protocol: str = "simple", buffsize: float = 4 * 1024 * 1024, last: float | None = None) -> float:
    """Seconds of NCCL's ring on an idle network (module docstring), without the tuner's base latency.

    ``nbytes`` is the buffer (all-reduce, broadcast) or the full input/output (all-gather, reduce-scatter);
    ``rate`` the ring's rate in bytes/s (all channels), ``latency`` a hop's (network + NCCL's overhead), the
    mean over the ring's hops where they differ (a step waits on the hop before it, and the waits go round
    the ring), and ``last`` the slowest hop's, which a loop's last arrival may cross (default ``latency``).
    """
    last = latency if last is None else last
    b = rate / channels
    part = nbytes * WIRE[protocol] / channels
    if op == "broadcast":
        chunk = min(TREE_CHUNK * buffsize if protocol == "simple" else LL_STEP * 2, part)
        return (n - 2) * (chunk / b + latency) + part / b + last
    s = steps(op, n)
    per_loop = n * (CHUNK * buffsize if protocol == "simple" else LL_STEP * WIRE[protocol])
    total, left = 0.0, part
    while left > 0:
        c = min(per_loop, left) / n  # the last loop's chunk is what is left ÷ n
        left -= per_loop
        tau = c / b
        # a Simple step waits for its first slice; LL and LL128 forward each line (16 or 128 bytes) as it lands
        x = tau / min(2, max(1, math.ceil(c / (MIN_SLICE * buffsize)))) if protocol == "simple" else 0.0
        total += (s - 1) * max(tau, x + latency) + tau + last
    return total


def tree_fill(nbytes: float, n: int, channels: int, rate: float, latency: float, protocol: str = "simple",
              buffsize: float = 4 * 1024 * 1024) -> float:
    """Seconds a pipelined double binary tree adds to its edges' bandwidth time: 2D·a + (2D − 1)·x_c."""
    depth = int(math.log2(n))
    per_channel = nbytes * WIRE[protocol] / (2 * channels)  # each tree carries half, on its channels
    chunk = min(TREE_CHUNK * buffsize if protocol == "simple" else LL_STEP * 2, per_channel)
    return 2 * depth * latency + (2 * depth - 1) * chunk / (rate / channels)


def _tree_edges(g: Sequence[int], size: float) -> Phase:
    """Both trees' edges, up and down, each carrying ``size`` (half the buffer): the heap and its mirror."""
    n = len(g)
    msgs = []
    for i in range(1, n):
        parent = (i - 1) // 2
        for a, b in ((g[i], g[parent]), (g[n - 1 - i], g[n - 1 - parent])):
            msgs += [(a, b, size), (b, a, size)]
    return tuple(msgs)


def _host_tree_edges(hosts: Sequence[Sequence[int]], size: float) -> Phase:
    """NCCL's trees across hosts: a chain through each host's devices, and the double binary tree between hosts,
    tree A joining hosts through their first device's NIC and its mirror through their last device's."""
    firsts, lasts = [h[0] for h in hosts], [h[-1] for h in hosts]
    between = _tree_edges(firsts, size)
    mirror = _tree_edges(lasts[::-1], size)
    chains = tuple(m for h in hosts for a, b in zip(h, h[1:]) for m in ((a, b, size), (b, a, size)))
    return between + mirror + chains + chains  # each tree runs its own chain inside a host


def _hosts_of(ring: Sequence[int], topo: Topology) -> list[list[int]] | None:
    """The ring's members host by host, where ``[hosts]`` gives two or more hosts holding the same number (> 1) of
    them; else None (NCCL then runs one ring over them, as without hosts)."""
    if topo.hosts is None:
        return None
    by_host: dict[int, list[int]] = {}
    for r in ring:
        by_host.setdefault(topo.host(r), []).append(r)
    hosts = list(by_host.values())
    size = len(hosts[0])
    if len(hosts) < 2 or size < 2 or any(len(h) != size for h in hosts):
        return None
    return hosts


def _rails(hosts: Sequence[Sequence[int]]) -> list[list[int]]:
    """NCCL's rings through a cluster of hosts: one per local device j, crossing each host's devices over the fabric
    from its device j round to j − 1, then through that device's NIC to the next host's device j, so with a NIC per
    device every NIC carries one ring each way (with one NIC per host, the host's rings share it)."""
    size = len(hosts[0])
    return [[h[(j + k) % size] for h in hosts for k in range(size)] for j in range(size)]


def _equal_share(phase: Phase, topo: Topology) -> float:
    """The rate every message of a phase of equal messages gets alone: the least of its path's rate and each of its
    links' capacity over the messages crossing it (max-min sharing, whose slowest messages end the phase)."""
    paths = [topo.path(m[0], m[1]) for m in phase]
    crossing: dict[int, int] = {}
    for p in paths:
        for link in p.links:
            crossing[link] = crossing.get(link, 0) + 1
    return min(min(p.rate, *(topo.capacity[link] / crossing[link] for link in p.links)) for p in paths)


def _chain_from(ring: Sequence[int], root: int) -> list[int]:
    """``ring`` rotated to start at ``root``: the chain a broadcast follows."""
    i = list(ring).index(root)
    return [*ring[i:], *ring[:i]]


def plan(op: str, g: Sequence[int], nbytes: float, topo: Topology) -> list[Phase]:
    """``op`` among ``g`` on ``nbytes`` as NCCL runs it, as phases whose idle time is NCCL's (module docstring).

    Under ``[hosts]`` the rings are rails (``_rails``), the buffer split between them, and the tree joins hosts
    (``_host_tree_edges``); the ring's rate is then all its rails' together.
    """
    if op == "reduce":  # a chain towards the root: the broadcast's, backwards (reduce.h runs the ring's chain)
        return mirrored(plan("broadcast", g, nbytes, topo))
    spec = topo.resolved.nccl or NcclSpec()
    n = len(g)
    ring = ordered(g, topo)
    hosts = _hosts_of(ring, topo)
    rails = [ring] if hosts is None else _rails(hosts)
    hops = [topo.path(rails[0][i], rails[0][(i + 1) % n]) for i in range(n)]
    alpha = max(p.latency for p in hops)
    step = tuple(m for rail in rails for m in ring_phases(rail, 1.0, 1)[0])
    per_message = _equal_share(step, topo)  # a rail's rate
    rate = per_message * len(rails)
    algorithm, protocol = choose(op, nbytes, n, spec, rate)
    c = channels_used(nbytes, n, protocol, max(spec.channels, len(rails)))  # a channel per rail at least
    hop = alpha + _HOP[protocol] * 1e-6
    mean = sum(p.latency for p in hops) / n + _HOP[protocol] * 1e-6
    base = _BASE[algorithm, protocol] * 1e-6
    wire = WIRE[protocol]
    if algorithm == "tree":
        return [_tree(g, nbytes, hosts, topo, c, min(p.rate for p in hops), hop, protocol, base, spec.buffsize)]
    split = nbytes * wire / len(rails)
    if op == "broadcast":  # the chain's hops all stream at once, as a pipelined chain does in its steady state
        chains = [_chain_from(rail, g[0]) for rail in rails]
        phases: list[Phase] = [tuple((ch[h], ch[h + 1], split) for ch in chains for h in range(n - 1))]
        target = base + ring_time(op, nbytes, n, c, rate, mean, protocol, spec.buffsize, hop)
    else:
        size = split / n if op != "all_gather" else split
        phases = [tuple(m for rail in rails for m in ring_phases(rail, size, 1)[0])] * steps(op, n)
        total = nbytes * n if op == "all_gather" else nbytes
        target = base + ring_time(op, total, n, c, rate, mean, protocol, spec.buffsize, hop)
    ideal = sum(alpha + max(m[2] for m in phase) / per_message for phase in phases)
    shift = (target - ideal) / len(phases)
    shifted: dict[int, Phase] = {}  # a ring's phases are one object repeated: shift it once, and keep it one
    for phase in phases:
        if id(phase) not in shifted:
            shifted[id(phase)] = tuple((*m, shift) for m in phase)
    return [shifted[id(phase)] for phase in phases]


def _tree(g: Sequence[int], nbytes: float, hosts: list[list[int]] | None, topo: Topology, c: int, rate: float,
          hop: float, protocol: str, base: float, buffsize: float) -> Phase:
    """The tree all-reduce as one phase of all its edges, shifted so that alone it takes NCCL's time: base, the
    pipeline's fill down and up its levels (a host's chain adds a level per device after the first), and the
    edges' bandwidth time, which the network gives."""
    half = nbytes * WIRE[protocol] / 2
    if hosts is None:
        phase = _tree_edges(g, half)
        fill = tree_fill(nbytes, len(g), c, rate, hop, protocol, buffsize)
    else:
        phase = _host_tree_edges(hosts, half)
        chain = len(hosts[0]) - 1
        fabric = topo.path(hosts[0][0], hosts[0][1]).latency + _HOP[protocol] * 1e-6
        chunk = min(TREE_CHUNK * buffsize if protocol == "simple" else LL_STEP * 2, half / c)
        fill = tree_fill(nbytes, len(hosts), c, rate, hop, protocol, buffsize)
        fill += 2 * chain * (fabric + chunk / (rate / c))
    alpha = max(topo.path(m[0], m[1]).latency for m in phase)
    shift = base + fill - alpha  # the phase alone takes α + T_bw + shift
    return tuple((*m, shift) for m in phase)
