"""A lone collective under a backend takes its library's closed form, and moves exactly its bytes.

Rooted ops (broadcast, reduce, gather, scatter) root at the group's lowest rank, as the simulator does.

The invariant behind every backend model: each op × backend × algorithm × protocol, alone on a uniform
network, ends at the time its closed form gives (exonet/netsim/nccl.py and gloo.py state them) and puts
exactly the bytes its algorithm sends on the wire, on the fast path and on the event path alike; so do
point-to-point sends, alone and batched, and gloo's ring over hosts. Sizes,
node counts, rates and latencies are drawn from a grid; the TCP window of the backend's Linux hosts is part
of the model, so the rate a transfer gets is min(NIC, its windows / RTT). Slow start after idle is off: its
ramp is the TCP model's term on top (tests/test_netsim_backends.py times it).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exonet import Scenario, Trace, simulate
from exonet.netsim import gloo, nccl
from exonet.scenario import Resolved

RATES = ("100 Mbit/s", "1 Gbit/s", "10 Gbit/s", "100 Gbit/s")
LATENCIES = ("0 s", "50 us", "1 ms", "10 ms", "40 ms")
SIZES = (4096, 100_003, 3 * 2**20 + 17, 64 * 2**20, 300 * 2**20)


def lone(op: str, n: int, nbytes: int, network: dict, *, fast_path: bool) -> tuple[float, list[int], Resolved]:
    """Every rank issues one ``op`` of ``nbytes`` at time 0; (wall-clock, wire bytes per node, the scenario)."""
    trace = Trace(num_nodes=n)
    for rank in range(n):
        trace.add_collective(rank, op, nbytes)
        trace.add_step(rank)
    scenario = Scenario.from_dict({"name": "lone", "network": {"slow_start_after_idle": False, **network}})
    result = simulate(trace, scenario, fast_path=fast_path)
    return result.wall_clock_s, result.wire_bytes, scenario.resolve(n)


def window_rate(r: Resolved) -> float:
    """The rate one transfer gets alone: the NIC, or its windows per round trip, or its flows' limit, where they
    bind."""
    cap = r.inflight / (2 * r.latency) if r.inflight is not None and r.latency > 0 else math.inf
    return min(r.uplink[0], cap, r.flow_cap)


# ---------------------------------------------------------------- NCCL
def nccl_closed_form(op: str, n: int, nbytes: int, r: Resolved) -> tuple[float, list[float]]:
    """NCCL's time for ``op`` alone (nccl.py's docstring) and the bytes each rank puts on the wire."""
    assert r.nccl is not None
    rate, spec = window_rate(r), r.nccl
    algorithm, protocol = nccl.choose("broadcast" if op == "reduce" else op, nbytes, n, spec, rate)
    c = nccl.channels_used(nbytes, n, protocol, spec.channels)
    hop = r.latency + nccl._HOP[protocol] * 1e-6
    base = nccl._BASE[algorithm, protocol] * 1e-6
    wire = nccl.WIRE[protocol]
    if op == "all_to_all":  # grouped send/recv: every rank's n − 1 pieces of S/n at once on its NIC
        return r.latency + nbytes / n / min(rate, r.uplink[0] / (n - 1)), [(n - 1) / n * nbytes] * n
    if op in ("gather", "scatter"):  # grouped send/recv: the root's NIC carries the n − 1 transfers at once
        each = nbytes if op == "gather" else nbytes / n
        sent = [0.0] + [each] * (n - 1) if op == "gather" else [each * (n - 1)] + [0.0] * (n - 1)
        return r.latency + each / min(rate, r.uplink[0] / (n - 1)), sent
    if op == "barrier":  # torch's barrier on NCCL: an all-reduce of one float
        return nccl_closed_form("all_reduce", n, 4, r)
    if algorithm == "tree":
        half = nbytes * wire / 2
        sends = [0] * n  # messages each rank sends, and receives, in the one phase of both trees' edges
        for i in range(1, n):
            for a, b in ((i, (i - 1) // 2), (n - 1 - i, n - 1 - (i - 1) // 2)):
                sends[a] += 1
                sends[b] += 1
        # equal messages, each capped by its windows: the busiest NIC direction shares its rate among the most of
        # them (a rank sends as many as it receives), so they end last
        slowest = min(rate, r.uplink[0] / max(sends))
        return base + nccl.tree_fill(nbytes, n, c, rate, hop, protocol, spec.buffsize) + half / slowest, \
            [s * half for s in sends]
    total = nbytes * n if op == "all_gather" else nbytes
    chain = "broadcast" if op == "reduce" else op  # a reduce is the broadcast's chain run towards the root
    time = base + nccl.ring_time(chain, total, n, c, rate, hop, protocol, spec.buffsize, hop)
    if op == "broadcast":
        return time, [nbytes * wire] * (n - 1) + [0.0]  # a chain: every rank but the last forwards the buffer
    if op == "reduce":
        return time, [0.0] + [nbytes * wire] * (n - 1)  # every rank but the root forwards its partial sum
    per_step = nbytes * wire if op == "all_gather" else nbytes * wire / n
    return time, [nccl.steps(op, n) * per_step] * n


NCCL_CASES = [(op, algorithm, protocol) for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
              for algorithm in ("auto", "ring", "tree") for protocol in ("auto", "simple", "ll", "ll128")
              if not (algorithm == "tree" and op != "all_reduce")]
NCCL_CASES += [(op, "auto", "auto") for op in ("all_to_all", "gather", "scatter", "barrier")]


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "event"])
@pytest.mark.parametrize(("op", "algorithm", "protocol"), NCCL_CASES)
@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 9), nbytes=st.sampled_from(SIZES), rate=st.sampled_from(RATES),
       latency=st.sampled_from(LATENCIES), nic=st.sampled_from(("generic", "aws")))
def test_a_lone_nccl_collective_takes_its_closed_form(op: str, algorithm: str, protocol: str, fast_path: bool,
                                                      n: int, nbytes: int, rate: str, latency: str, nic: str) -> None:
    spec = {"nic": nic, **({} if algorithm == "auto" else {"algorithm": algorithm}),
            **({} if protocol == "auto" else {"protocol": protocol})}
    network = {"bandwidth": rate, "latency": latency, "backend": "nccl", "nccl": spec}
    wall, sent, r = lone(op, n, nbytes, network, fast_path=fast_path)
    time, expected = nccl_closed_form(op, n, nbytes, r)
    assert wall == pytest.approx(time, rel=1e-9, abs=1e-12)
    assert sent == [round(b) for b in expected] or sent == pytest.approx(expected, abs=1.0)


@pytest.mark.parametrize("n", [4, 8])
def test_a_lone_nccl_broadcast_is_the_pipelined_chain_not_n_minus_one_buffers(n: int) -> None:
    """256 MiB at 1 Gbit/s and 10 ms: the chain streams the buffer once (about S/R), where n−1 whole-buffer hops in
    turn took (n−1)·S/R: 6.44 s at K = 4 and 15.0 s at K = 8 against 2.19 s and 2.27 s."""
    S = 256 * 2**20
    wall, _, r = lone("broadcast", n, S, {"bandwidth": "1 Gbit/s", "latency": "10 ms", "backend": "nccl"},
                      fast_path=True)
    time, _ = nccl_closed_form("broadcast", n, S, r)
    assert wall == pytest.approx(time, rel=0.02)
    assert wall < 1.1 * S / (1e9 / 8) + 0.2


# ---------------------------------------------------------------- gloo
def fanout_broadcast(n: int, nbytes: int, flow: float, nic: float, alpha: float) -> float:
    """gloo's broadcast: phase d holds the sends of the positions with d bits set, each to all its children at once,
    so a sender's m transfers share its NIC (each also capped at ``flow`` by its window)."""
    depth = (n - 1).bit_length()
    widest = [0] * (depth + 1)
    for v in range(n):
        children = sum(1 for i in range(v.bit_length(), depth) if v + (1 << i) < n)
        widest[v.bit_count()] = max(widest[v.bit_count()], children)
    return sum(alpha + nbytes / min(flow, nic / m) for m in widest if m)


def gloo_closed_form(op: str, n: int, nbytes: int, r: Resolved) -> tuple[float, list[float]]:
    """gloo's time for ``op`` alone (gloo.py's docstring, the phase forms for what gloo runs as exonet does) and the
    bytes each rank sends."""
    rate, alpha = window_rate(r), r.latency
    if op == "all_reduce":
        return gloo.all_reduce_time(nbytes, n, rate, alpha), [2 * (n - 1) / n * nbytes] * n
    if op == "all_gather":
        return gloo.all_gather_time(nbytes, n, rate, alpha), [(n - 1) * nbytes] * n
    if op == "reduce_scatter":
        return (n - 1) * alpha + (n - 1) / n * nbytes / rate, [(n - 1) / n * nbytes] * n
    if op == "all_to_all":
        return alpha + nbytes / n / min(rate, r.uplink[0] / (n - 1)), [(n - 1) / n * nbytes] * n  # n−1 at once
    if op == "reduce":  # gloo/reduce.cc: the all-reduce's first half, then every rank's S/n to the root at once
        half = gloo.all_reduce_time(nbytes, n, rate, alpha) / 2
        to_root = alpha + nbytes / n / min(rate, r.uplink[0] / (n - 1))
        return half + to_root, [(n - 1) / n * nbytes] + [n / n * nbytes] * (n - 1)
    if op == "gather":
        return alpha + nbytes / min(rate, r.uplink[0] / (n - 1)), [0.0] + [float(nbytes)] * (n - 1)
    if op == "scatter":
        return alpha + nbytes / n / min(rate, r.uplink[0] / (n - 1)), [(n - 1) / n * nbytes] + [0.0] * (n - 1)
    if op == "barrier":  # gloo/barrier.cc: a dissemination barrier, ⌈log2 n⌉ rounds of empty messages
        return (n - 1).bit_length() * alpha, [0.0] * n
    depth = (n - 1).bit_length()
    children = [sum(1 for i in range(v.bit_length(), depth) if v + (1 << i) < n) for v in range(n)]
    return fanout_broadcast(n, nbytes, rate, r.uplink[0], alpha), [c * nbytes for c in children]


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "event"])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce",
                                "gather", "scatter", "barrier"])
@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 9), nbytes=st.sampled_from(SIZES), rate=st.sampled_from(RATES),
       latency=st.sampled_from(LATENCIES))
def test_a_lone_gloo_collective_takes_its_closed_form(op: str, fast_path: bool, n: int, nbytes: int, rate: str,
                                                      latency: str) -> None:
    wall, sent, r = lone(op, n, nbytes, {"bandwidth": rate, "latency": latency, "backend": "gloo"},
                         fast_path=fast_path)
    time, expected = gloo_closed_form(op, n, nbytes, r)
    assert wall == pytest.approx(time, rel=1e-9, abs=1e-12)
    assert sent == pytest.approx(expected, abs=1.0)


# ---------------------------------------------------------------- point to point
@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "event"])
@pytest.mark.parametrize("backend", ["nccl", "gloo"])
@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 9), nbytes=st.sampled_from(SIZES), rate=st.sampled_from(RATES),
       latency=st.sampled_from(LATENCIES), batched=st.booleans())
def test_lone_sends_take_one_transfer_each_and_a_batch_of_them_runs_at_once(backend: str, fast_path: bool, n: int,
                                                                             nbytes: int, rate: str, latency: str,
                                                                             batched: bool) -> None:
    """Rank 0 sends ``nbytes`` to 1 alone: α + S/R under NCCL; under gloo the data waits for the receiver's
    recv-ready notice, posted at the same instant, so 2α + S/R. Batched (``batch_isend_irecv``: every rank sends to
    the next and receives from the one before, all posted at once, as a ring exchange): every NIC carries one
    transfer each way, so the whole batch ends with the one transfer's time, and each rank puts S on the wire."""
    trace = Trace(num_nodes=n)
    pairs = [(r, (r + 1) % n) for r in range(n)] if batched and n > 2 else [(0, 1)]
    for src, dst in pairs:  # each a send and its receive, async when batched: the replay runs them together
        trace.add_collective(src, "send", nbytes, group=(src, dst) if src < dst else (dst, src), async_op=batched)
        trace.add_collective(dst, "recv", nbytes, group=(src, dst) if src < dst else (dst, src), async_op=batched)
    for rank in range(n):
        if batched:
            for event in list(trace.events[rank]):
                trace.add_wait(rank, event.cid)
        trace.add_step(rank)
    scenario = Scenario.from_dict({"name": "p2p", "network": {"slow_start_after_idle": False, "bandwidth": rate,
                                                              "latency": latency, "backend": backend}})
    result = simulate(trace, scenario, fast_path=fast_path)
    r = scenario.resolve(n)
    notice = r.latency if backend == "gloo" else 0.0
    assert result.wall_clock_s == pytest.approx(notice + r.latency + nbytes / window_rate(r), rel=1e-9, abs=1e-12)
    senders = {src for src, _ in pairs}
    assert result.wire_bytes == [nbytes if rank in senders else 0 for rank in range(n)]


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "event"])
@pytest.mark.parametrize("backend", ["nccl", "gloo"])
@pytest.mark.parametrize(("send_at", "recv_at"), [(0.3, 0.0), (0.0, 0.3), (0.2, 0.15)])
def test_a_message_starts_when_its_backend_lets_it_and_frees_its_sender_when_sent(backend: str, fast_path: bool,
                                                                                 send_at: float,
                                                                                 recv_at: float) -> None:
    """Rank 0 computes ``send_at`` s, sends S async, waits, computes 0.1 s more; rank 1 computes ``recv_at`` s and
    receives. NCCL sends at once and the send is done on delivery: 0.1 s after send + α + S/R (or the receive, if
    that comes later). gloo holds the data
    until the receiver's recv-ready notice arrives (recv + α), and its send is done when the last byte has left:
    0.1 s after max(send, recv + α) + S/R (measured on the delay line: ``exonet.validate.stages``)."""
    nbytes, alpha = 2_000_000, 0.05
    trace = Trace(num_nodes=2)
    trace.add_compute(0, send_at)
    trace.add_wait(0, trace.add_collective(0, "send", nbytes, group=(0, 1), async_op=True))
    trace.add_compute(0, 0.1)
    trace.add_compute(1, recv_at)
    trace.add_collective(1, "recv", nbytes, group=(0, 1))
    scenario = Scenario.from_dict({"name": "p2p", "network": {"slow_start_after_idle": False, "bandwidth": "1 Gbit/s",
                                                              "latency": f"{alpha} s", "backend": backend},
                                   "compute": {"mode": "wall"}})
    transfer = nbytes / window_rate(scenario.resolve(2))
    if backend == "gloo":
        start = max(send_at, recv_at + alpha)
        want = max(start + transfer + 0.1, start + alpha + transfer)
    else:
        want = max(send_at + alpha + transfer + 0.1, recv_at)  # (a message that came early waits in a buffer)
    assert simulate(trace, scenario, fast_path=fast_path).wall_clock_s == pytest.approx(want, rel=1e-9)


# ---------------------------------------------------------------- one way to say it
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_collective_names_nccls_algorithm_as_nccl_algo_does(algorithm: str) -> None:
    """``collective = "ring"`` beside ``backend = "nccl"`` is NCCL's ring, not exonet's phase ring: exactly what
    ``[network.nccl] algorithm = "ring"`` gives."""
    network = {"bandwidth": "1 Gbit/s", "latency": "5 ms", "backend": "nccl"}
    said = lone("all_reduce", 4, 64 * 2**20, {**network, "collective": algorithm}, fast_path=True)
    spelt = lone("all_reduce", 4, 64 * 2**20, {**network, "nccl": {"algorithm": algorithm}}, fast_path=True)
    assert said[0] == spelt[0] and said[1] == spelt[1]
    assert said[2].nccl == spelt[2].nccl and said[2].algorithms == spelt[2].algorithms


# ---------------------------------------------------------------- NCCL over hosts
@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "event"])
@pytest.mark.parametrize(("op", "G", "H"), [("all_reduce", 4, 2), ("all_reduce", 8, 3), ("all_gather", 4, 3),
                                            ("reduce_scatter", 8, 2), ("broadcast", 4, 2)])
def test_nccl_over_hosts_runs_a_ring_per_device_through_its_nic(op: str, G: int, H: int, fast_path: bool) -> None:
    """With a NIC per device, NCCL's rings (rails) cross every host's devices over the fabric and leave each host
    through a different device's NIC, so the ring runs at G NICs' rate: its closed form with R = G·B, a channel per
    rail, and the mean of the rail's hops (G − 1 fabric hops and one NIC hop per host) as its latency."""
    n, S = G * H, 256 * 2**20
    network = {"bandwidth": "100 Gbit/s", "latency": "20 us", "backend": "nccl", "collective": "ring",
               "nccl": {"protocol": "simple", "transport": "ib"}}
    hosts = {"devices": G, "bandwidth": "450 GB/s", "latency": "1 us"}
    trace = Trace(num_nodes=n)
    for rank in range(n):
        trace.add_collective(rank, op, S // n if op == "all_gather" else S)
        trace.add_step(rank)
    scenario = Scenario.from_dict({"name": "hosts", "network": network, "hosts": hosts})
    wall = simulate(trace, scenario, fast_path=fast_path).wall_clock_s
    r = scenario.resolve(n)
    assert r.algorithms["all_reduce"] == "nccl"  # [hosts] with a backend runs the library's algorithms
    hop = nccl._HOP["simple"] * 1e-6
    mean = (H * r.latency + H * (G - 1) * r.hosts.latency) / n + hop
    total = (S // n) * n if op == "all_gather" else S
    c = nccl.channels_used(total, n, "simple", G)

    def closed_form(rate: float) -> float:
        return nccl._BASE["ring", "simple"] * 1e-6 + nccl.ring_time(op, total, n, c, rate, mean, "simple",
                                                                    last=r.latency + hop)

    assert wall == pytest.approx(closed_form(G * r.uplink[0]), rel=1e-9)
    # one NIC per host: the host's G rails share it, so the ring runs at one NIC's rate
    shared = scenario.replace(hosts={**hosts, "nic": "per-host"})
    assert simulate(trace, shared, fast_path=fast_path).wall_clock_s == pytest.approx(closed_form(r.uplink[0]),
                                                                                      rel=1e-9)


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "event"])
@pytest.mark.parametrize("nic", ["per-device", "per-host"])
@pytest.mark.parametrize(("G", "H"), [(4, 2), (2, 3), (8, 2)])
def test_gloo_over_hosts_runs_its_one_ring_over_every_rank(G: int, H: int, nic: str, fast_path: bool) -> None:
    """gloo knows no hosts: its ring visits every rank in order, each step in lockstep, so the one hop per host that
    leaves through a NIC sets every step's pace (the fabric's hops wait for it), with one NIC or one per device."""
    n, S = G * H, 64 * 2**20
    trace = Trace(num_nodes=n)
    for rank in range(n):
        trace.add_collective(rank, "all_reduce", S)
        trace.add_step(rank)
    scenario = Scenario.from_dict({"name": "hosts", "network": {"slow_start_after_idle": False, "backend": "gloo",
                                                                "bandwidth": "10 Gbit/s", "latency": "1 ms"},
                                   "hosts": {"devices": G, "bandwidth": "450 GB/s", "latency": "1 us", "nic": nic}})
    result = simulate(trace, scenario, fast_path=fast_path)
    r = scenario.resolve(n)
    assert r.algorithms["all_reduce"] == "gloo"
    assert result.wall_clock_s == pytest.approx(gloo.all_reduce_time(S, n, window_rate(r), r.latency), rel=1e-9)
    assert result.wire_bytes == pytest.approx([2 * (n - 1) / n * S] * n, abs=1.0)


def test_a_phase_algorithm_beside_a_backend_is_refused_naming_what_the_backend_runs() -> None:
    from exonet import ScenarioError

    with pytest.raises(ScenarioError, match=r'nccl does not run "hierarchical" .*choose one of: nccl, ring, tree'):
        Scenario.from_dict({"name": "x", "network": {"bandwidth": "1 Gbit/s", "backend": "nccl",
                                                     "collective": "hierarchical"}})
    with pytest.raises(ScenarioError, match=r"say it once"):
        Scenario.from_dict({"name": "x", "network": {"bandwidth": "1 Gbit/s", "backend": "nccl", "collective": "ring",
                                                     "nccl": {"algorithm": "tree"}}})


# ---------------------------------------------------------------- a cloud's per-flow limit
def test_a_per_flow_limit_caps_each_connection_whatever_the_latency() -> None:
    """AWS lets one TCP flow carry at most 5 Gbit/s outside a placement group: gloo's one connection per pair on a
    10 Gbit/s NIC runs at 5, where NCCL's 32 sockets per pair (nic = "aws") are capped at 32 × 5 Gbit/s."""
    S = 256 * 2**20
    network = {"bandwidth": "10 Gbit/s", "latency": "0 s", "backend": "gloo"}
    free, _, r = lone("all_reduce", 2, S, network, fast_path=True)
    capped, _, rc = lone("all_reduce", 2, S, {**network, "flow_rate": "5 Gbit/s"}, fast_path=False)
    assert r.flow_rate is None and rc.flow_cap == 5e9 / 8
    assert free == pytest.approx(gloo.all_reduce_time(S, 2, 10e9 / 8, 0.0), rel=1e-9)
    assert capped == pytest.approx(gloo.all_reduce_time(S, 2, 5e9 / 8, 0.0), rel=1e-9)
    aws = {"bandwidth": "400 Gbit/s", "latency": "0 s", "backend": "nccl", "nccl": {"nic": "aws", "algorithm": "ring"}}
    _, _, ra = lone("all_reduce", 2, S, aws, fast_path=True)
    assert ra.flow_rate == 5e9 / 8 and ra.flow_cap == 32 * 5e9 / 8  # 2 channels x 16 sockets
    wall, _, _ = lone("all_reduce", 2, S, aws, fast_path=True)
    time, _ = nccl_closed_form("all_reduce", 2, S, ra)  # its rate: min(NIC, flows), as window_rate gives
    assert wall == pytest.approx(time, rel=1e-9)
