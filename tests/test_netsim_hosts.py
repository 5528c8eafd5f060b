"""Hosts of many devices, hierarchical and region-aware collectives: closed forms, the fast path, the schema."""

from __future__ import annotations

import math
import random

import pytest

from exonet import Scenario, ScenarioError, Trace
from exonet.netsim import simulate
from exonet.scenario import ALGORITHMS, HostSpec, LinkSpec, Resolved
from exonet.trace import OPS

exact = {"rel": 1e-12, "abs": 1e-15}
B, A = 100e9 / 8, 10e-6  # NIC bytes/s, network latency
BF, AF = 2400e9 / 8, 1e-6  # fabric bytes/s per device port, fabric latency


def hosted(G: int, H: int, nic: str = "per-device", **network) -> Scenario:
    return Scenario.from_dict({
        "name": "hosts",
        "network": {"bandwidth": "100 Gbit/s", "latency": "10 us", **network},
        "hosts": {"devices": G, "bandwidth": "2400 Gbit/s", "latency": "1 us", "nic": nic},
    })


def one(n: int, op: str, nbytes: int, group: tuple[int, ...] | None = None) -> Trace:
    t = Trace(n)
    for r in range(n) if group is None else group:
        t.add_collective(r, op, nbytes, group=group)
        t.add_step(r)
    return t


def both_paths(trace: Trace, scenario: object) -> float:
    """The wall-clock on the fast path, checked against the event path."""
    fast, slow = simulate(trace, scenario), simulate(trace, scenario, fast_path=False)
    assert fast.wall_clock_s == pytest.approx(slow.wall_clock_s, **exact)
    assert fast.wire_bytes == slow.wire_bytes
    return fast.wall_clock_s


# ------------------------------------------------------------------ closed forms
@pytest.mark.parametrize("G,H", [(2, 2), (4, 3), (8, 2)])
@pytest.mark.parametrize("nic", ["per-device", "per-host"])
def test_hierarchical_all_reduce_is_the_closed_form(G, H, nic):
    S = 100_000_000
    inter = S / G if nic == "per-device" else S  # a per-host NIC carries all G rings
    closed = 2 * ((G - 1) * AF + (G - 1) / G * S / BF) + 2 * (H - 1) * A + 2 * (H - 1) / H * inter / B
    assert both_paths(one(G * H, "all_reduce", S), hosted(G, H, nic)) == pytest.approx(closed, **exact)


@pytest.mark.parametrize("nic", ["per-device", "per-host"])
def test_hierarchical_all_gather_reduce_scatter_and_broadcast(nic):
    G, H, s = 4, 3, 3_000_000
    per_nic = 1 if nic == "per-device" else G
    gather = (H - 1) * (A + per_nic * s / B) + (G - 1) * (AF + H * s / BF)  # across hosts first, then inside
    scatter = (G - 1) * (AF + s / G / BF) + (H - 1) * (A + per_nic * s / (G * H) / B)  # inside first
    broadcast = math.ceil(math.log2(H)) * (A + s / B) + math.ceil(math.log2(G)) * (AF + s / BF)
    sc = hosted(G, H, nic)
    assert both_paths(one(G * H, "all_gather", s), sc) == pytest.approx(gather, **exact)
    assert both_paths(one(G * H, "reduce_scatter", s), sc) == pytest.approx(scatter, **exact)
    assert both_paths(one(G * H, "broadcast", s), sc) == pytest.approx(broadcast, **exact)


@pytest.mark.parametrize("nic,per_nic", [("per-device", 2), ("per-host", 4)])
def test_all_to_all_stays_direct_under_hosts(nic, per_nic):
    # G = 2, H = 2: each rank sends S/4 to its host peer (fabric) and to the two devices of the other host
    S = 8_000_000
    closed = max(AF + S / 4 / BF, A + per_nic * S / 4 / B)
    assert both_paths(one(4, "all_to_all", S), hosted(2, 2, nic)) == pytest.approx(closed, **exact)


def test_a_message_inside_a_host_crosses_only_the_fabric():
    t = Trace(8)
    t.add_collective(1, "send", 5_000_000, group=(1, 2))
    t.add_collective(2, "recv", 5_000_000, group=(1, 2))
    t.add_collective(3, "send", 5_000_000, group=(3, 4))
    t.add_collective(4, "recv", 5_000_000, group=(3, 4))
    result = simulate(t, hosted(4, 2))
    assert result.per_node[2].comm_s == pytest.approx(AF + 5e6 / BF, **exact)
    assert result.per_node[4].comm_s == pytest.approx(A + 5e6 / B, **exact)


def test_a_subgroup_uses_the_hierarchy_restricted_to_its_members():
    G, H, S = 4, 2, 40_000_000
    even = tuple(range(0, G * H, 2))  # two devices per host
    L = 2
    closed = 2 * (L - 1) * (AF + S / L / BF) + 2 * (H - 1) * (A + S / L / H / B)
    assert both_paths(one(G * H, "all_reduce", S, even), hosted(G, H)) == pytest.approx(closed, **exact)
    leaders = (0, 4)  # one device per host: a flat ring over the NICs
    assert both_paths(one(G * H, "all_reduce", S, leaders), hosted(G, H)) == pytest.approx(2 * (A + S / 2 / B), **exact)


def test_an_uneven_group_falls_back_to_one_ring_in_region_order():
    S = 30_000_000
    # 0 -> 1 inside host 0, 1 -> 4 and 4 -> 0 across hosts: each phase waits for the NIC hop
    assert both_paths(one(8, "all_reduce", S, (0, 1, 4)), hosted(4, 2)) == pytest.approx(4 * (A + S / 3 / B), **exact)


def two_regions(m: int, link_bw: float, *, hosts: dict | None = None, regions_ranks=None, **network) -> Scenario:
    regions = regions_ranks or [{"name": "us", "share": 0.5}, {"name": "eu", "share": 0.5}]
    d = {
        "name": "two-regions",
        "network": {"bandwidth": "100 Gbit/s", "latency": "10 us", **network},
        "regions": regions,
        "links": [{"between": ["us", "eu"], "bandwidth": f"{link_bw * 8} bit/s", "latency": "20 ms"}],
    }
    if hosts:
        d["hosts"] = hosts
    return Scenario.from_dict(d)


def test_region_hierarchical_all_reduce_crosses_the_link_with_S():
    m, S, BL, AL = 4, 80_000_000, 1e9 / 8, 20e-3
    sc = two_regions(m, BL, collective="hierarchical")
    # reduce-scatter and all-gather inside each region; m rings of S/m across the link, which they share
    closed = 2 * (m - 1) * (A + S / m / B) + 2 * AL + S / BL
    assert both_paths(one(2 * m, "all_reduce", S), sc) == pytest.approx(closed, **exact)
    flat = 2 * (2 * m - 1) * AL + 2 * (2 * m - 1) / (2 * m) * S / BL  # the ring: 1.75·S on the link at 8 nodes
    assert both_paths(one(2 * m, "all_reduce", S), sc.replace(collective="ring")) == pytest.approx(flat, **exact)


def test_three_levels_host_region_and_across_regions():
    G, Hr, S, BL, AL = 2, 2, 80_000_000, 1e9 / 8, 20e-3
    hosts = {"devices": G, "bandwidth": "2400 Gbit/s", "latency": "1 us"}
    sc = two_regions(G * Hr, BL, hosts=hosts)
    closed = (2 * (G - 1) * (AF + S / G / BF) + 2 * (Hr - 1) * (A + S / (G * Hr) / B) + 2 * AL + S / BL)
    assert both_paths(one(2 * G * Hr, "all_reduce", S), sc) == pytest.approx(closed, **exact)


def test_a_flat_ring_follows_regions():
    S, BL, AL = 40_000_000, 1e9 / 8, 20e-3
    interleaved = [{"name": "us", "ranks": [0, 2]}, {"name": "eu", "ranks": [1, 3]}]
    sc = two_regions(2, BL, regions_ranks=interleaved, collective="ring")
    # ring 0 -> 2 -> 1 -> 3 -> 0: one flow each way on the link per phase, not two
    closed = 2 * 3 * (AL + S / 4 / BL)
    assert both_paths(one(4, "all_reduce", S), sc) == pytest.approx(closed, **exact)


def test_without_hosts_or_regions_hierarchical_is_the_ring():
    sc = Scenario.from_dict({"name": "flat", "network": {"bandwidth": "1 Gbit/s", "latency": "1 ms"}})
    trace = one(6, "all_reduce", 6_000_000)
    assert simulate(trace, sc.replace(collective="hierarchical")).wall_clock_s == simulate(trace, sc).wall_clock_s


def random_hosted(rng: random.Random) -> Resolved:
    G = rng.choice([1, 2, 3, 4])
    n = G * rng.randint(1, 4)
    per_region = [rng.randint(0, 1) for _ in range(n // G)]
    region = tuple(f"r{per_region[r // G]}" for r in range(n))
    return Resolved(
        num_nodes=n, uplink=tuple(10 ** rng.uniform(8, 10) for _ in range(n)),
        downlink=tuple(10 ** rng.uniform(8, 10) for _ in range(n)), region=region, latency=rng.uniform(1e-5, 1e-2),
        links={("r0", "r1"): LinkSpec(10 ** rng.uniform(7.5, 9.5), rng.uniform(1e-4, 5e-2))},
        speed=(1.0,) * n, algorithms={op: rng.choice(ALGORITHMS[op]) for op in OPS},
        sharing=rng.choice(["max-min", "fifo"]),
        hosts=HostSpec(G, 10 ** rng.uniform(10, 11.5), rng.uniform(0, 1e-5), rng.choice(["per-device", "per-host"])),
    )


@pytest.mark.parametrize("seed", range(30))
def test_fast_path_and_event_path_agree_with_hosts(seed):
    rng = random.Random(seed)
    resolved = random_hosted(rng)
    n = resolved.num_nodes
    t = Trace(n)
    specs = [(rng.choice(OPS), rng.randint(1, 50_000_000),
              None if rng.random() < 0.5 else tuple(sorted(rng.sample(range(n), rng.randint(1, n)))),
              rng.random() < 0.5) for _ in range(6)]
    for r in range(n):
        pending = []
        for op, size, group, async_op in specs:
            if group is None or r in group:
                t.add_compute(r, rng.uniform(0, 0.01))
                cid = t.add_collective(r, op, size, group=group, async_op=async_op)
                if async_op:
                    pending.append(cid)
        for cid in pending:
            t.add_wait(r, cid)
        t.add_step(r)
    fast, slow = simulate(t, resolved), simulate(t, resolved, fast_path=False)
    assert fast.wall_clock_s == pytest.approx(slow.wall_clock_s, rel=1e-9, abs=1e-12)
    assert fast.wire_bytes == slow.wire_bytes


# ------------------------------------------------------------------ the schema
def test_hosts_resolve_describe_and_replace():
    sc = hosted(4, 2)
    r = sc.resolve(8)
    assert r.hosts == HostSpec(4, BF, AF, "per-device")
    assert r.algorithms["all_reduce"] == "hierarchical" and r.algorithms["all_to_all"] == "direct"
    assert "hosts       4 devices per host, fabric 2.4 Tbit/s per device, latency 1 us, NIC per-device" in sc.describe()
    assert sc.replace(hosts={"nic": "per-host"}).resolve(8).hosts.nic == "per-host"
    assert sc.replace(collective="ring").resolve(8).algorithms["all_reduce"] == "ring"
    flat = sc.replace(hosts=None).resolve(8)
    assert flat.hosts is None and flat.algorithms["all_reduce"] == "ring"
    assert sc.replace(efficiency=0.5).resolve(8).hosts.bandwidth == BF / 2


@pytest.mark.parametrize("hosts,message", [
    ({"bandwidth": "1 Tbit/s"}, r"\[hosts\]: missing required key `devices`"),
    ({"devices": 8}, r"\[hosts\]: missing required key `bandwidth`"),
    ({"devices": 0, "bandwidth": "1 Tbit/s"}, r"hosts.devices: expected an integer >= 1"),
    ({"devices": 8, "bandwidth": "1 Tbit/s", "nic": "per-hots"}, r"hosts.nic: .*did you mean 'per-host'"),
    ({"devices": 8, "bandwidth": "1 Tbit/s", "nics": "per-host"}, r"hosts.nics: unknown key \(did you mean 'nic'"),
])
def test_bad_hosts_tables_are_named(hosts, message):
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_dict({"name": "x", "network": {"bandwidth": "1 Gbit/s"}, "hosts": hosts})


def test_hosts_must_be_whole_and_inside_one_region():
    with pytest.raises(ScenarioError, match=r"hosts.devices = 4 does not divide num_nodes=6"):
        hosted(4, 2).resolve(6)
    sc = two_regions(3, 1e9, hosts={"devices": 2, "bandwidth": "1 Tbit/s"})
    with pytest.raises(ScenarioError, match=r"host 1 \(ranks 2-3\) spans regions 'eu', 'us'"):
        sc.resolve(6)


def test_a_per_host_nic_is_set_on_the_hosts_lowest_rank_and_elsewhere_is_an_error():
    """With nic = "per-host" a host's devices share its lowest rank's NIC: an override on another rank
    changed nothing while describe() showed it; now it is an error naming the entry and the rank to use.
    On the lowest rank it slows the host's whole inter-host traffic."""
    t = Trace(8)
    for r in range(8):
        t.add_collective(r, "all_reduce", 10_000_000)
    base = {"name": "h", "network": {"bandwidth": "10 Gbit/s", "latency": "10 us"},
            "hosts": {"devices": 4, "bandwidth": "450 GB/s", "nic": "per-host"}}
    with pytest.raises(ScenarioError, match=r"nodes\[0\] sets the NIC of rank 3, .* share rank 0's NIC"):
        simulate(t, dict(base, nodes=[{"ranks": [3], "bandwidth": "10 Mbit/s"}]))
    fast = simulate(t, base).wall_clock_s
    for ranks in ([0], [0, 1, 2, 3]):
        slow = simulate(t, dict(base, nodes=[{"ranks": ranks, "bandwidth": "10 Mbit/s"}])).wall_clock_s
        assert slow > 100 * fast
    speed_only = dict(base, nodes=[{"ranks": [3], "speed": 0.5}])  # not a NIC: allowed anywhere
    assert simulate(t, speed_only).wall_clock_s == pytest.approx(fast)


@pytest.mark.parametrize("with_hosts", [True, False])
def test_the_largest_latency_in_a_group_is_the_largest_over_all_its_pairs(with_hosts):
    """``Resolved.max_latency`` looks at a few ranks per region (a group's round-trip timeout rests on it):
    it equals the max over every pair, a rank with itself included, on hosts across three regions."""
    spec = {"name": "three", "network": {"bandwidth": "10 Gbit/s", "latency": "2 ms"},
            "regions": [{"name": n, "share": 1 / 3} for n in "abc"],
            "links": [{"between": ["a", "b"], "latency": "30 ms", "bandwidth": "1 Gbit/s"},
                      {"between": ["b", "c"], "latency": "70 ms", "bandwidth": "1 Gbit/s"},
                      {"between": ["a", "c"], "latency": "90 ms", "bandwidth": "1 Gbit/s"}]}
    if with_hosts:
        spec["hosts"] = {"devices": 4, "bandwidth": "2400 Gbit/s", "latency": "1 us"}
    resolved = Scenario.from_dict(spec).resolve(24)
    draw = random.Random(5)
    groups = [tuple(range(24)), (0,), (0, 1), (0, 5), (3, 9, 17), *(tuple(draw.sample(range(24), k)) for k in
                                                                   (2, 3, 5, 8, 13) for _ in range(4))]
    for group in groups:
        want = max(resolved.path_latency(a, b) for a in group for b in group)
        assert resolved.max_latency(group) == want, group
