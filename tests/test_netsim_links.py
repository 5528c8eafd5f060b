"""Per-link statistics of a replay (SimResult.links) against hand-derived bytes and busy times.

A link is busy while at least one flow moves bytes on it; latency is not part of that
time (the bytes have left). Every case is checked on the fast path and on the event path.
"""

from __future__ import annotations

import pytest

from exonet import Trace
from exonet.netsim import simulate
from exonet.scenario import LinkSpec, Resolved

B = 1.0e9  # NIC bytes/s
A = 1.0e-3  # one-way latency, s
S = 10_000_003  # not divisible by any n below
exact = {"rel": 1e-9, "abs": 1e-12}
paths = pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "event"])


def resolved(n: int, *, regions: tuple[str, ...] | None = None, link_bw: float | None = None, **options) -> Resolved:
    links = {("eu", "us"): LinkSpec(bandwidth=link_bw, latency=A)} if link_bw else {}
    return Resolved(num_nodes=n, uplink=(B,) * n, downlink=(B,) * n, region=regions or ("default",) * n,
                    latency=A, links=links, speed=(1.0,) * n, algorithms={}, **options)


def by_name(result) -> dict:
    return {link.name: link for link in result.links}


def everyone(n: int, op: str, nbytes: int) -> Trace:
    t = Trace(n)
    for r in range(n):
        t.add_compute(r, 0.5)
        t.add_collective(r, op, nbytes)
        t.add_step(r)
    return t


@paths
@pytest.mark.parametrize("n", [2, 3, 5])
def test_ring_all_reduce_puts_2_n_minus_1_over_n_S_on_every_nic_busy_for_its_transfer_time(n, fast_path):
    result = simulate(everyone(n, "all_reduce", S), resolved(n), fast_path=fast_path)
    links = by_name(result)
    assert len(links) == 2 * n
    wall = result.wall_clock_s
    assert wall == pytest.approx(0.5 + 2 * (n - 1) * A + 2 * (n - 1) / n * S / B, **exact)
    for r in range(n):
        for side in ("uplink", "downlink"):
            link = links[f"{side} {r}"]
            assert link.capacity == B
            assert link.bytes == pytest.approx(2 * (n - 1) / n * S, **exact)
            assert link.busy_s == pytest.approx(2 * (n - 1) / n * S / B, **exact)  # each phase's S/n at B, no α
            assert link.utilization == pytest.approx(link.bytes / (B * wall), **exact)
            assert link.busy_fraction == pytest.approx(link.busy_s / wall, **exact)
        assert links[f"uplink {r}"].bytes == pytest.approx(result.wire_bytes[r], abs=1)


@paths
def test_the_inter_region_link_carries_the_ring_traffic_that_crosses_it_and_is_named_the_most_loaded(fast_path):
    # ring 0→1→2→3→0 with us = {0, 1}, eu = {2, 3}: 1→2 crosses us->eu, 3→0 crosses eu->us, S/4 per phase
    link_bw = B / 10
    result = simulate(everyone(4, "all_reduce", S), resolved(4, regions=("us", "us", "eu", "eu"), link_bw=link_bw),
                      fast_path=fast_path)
    links = by_name(result)
    assert set(links) == {f"{side} {r}" for r in range(4) for side in ("uplink", "downlink")} | {"us->eu", "eu->us"}
    for name in ("us->eu", "eu->us"):
        assert links[name].capacity == link_bw
        assert links[name].bytes == pytest.approx(6 / 4 * S, **exact)
        assert links[name].busy_s == pytest.approx(6 * (S / 4) / link_bw, **exact)
    # the uplink feeding the slow link moves at its rate; the others at B
    assert links["uplink 1"].busy_s == pytest.approx(6 * (S / 4) / link_bw, **exact)
    assert links["uplink 0"].busy_s == pytest.approx(6 * (S / 4) / B, **exact)
    top = result.busiest_links(1)[0]
    assert top.name in ("us->eu", "eu->us")
    assert f"most loaded link: {top.name}" in result.summary()


@paths
def test_two_messages_sharing_a_region_link_keep_it_busy_for_both_transfers(fast_path):
    # 0→2 and 1→3 start together and share us->eu max-min: L/2 each, so the link is busy 2S/L
    link_bw = B / 4
    t = Trace(4)
    t.add_collective(0, "send", S, group=(0, 2))
    t.add_collective(1, "send", S, group=(1, 3))
    t.add_collective(2, "recv", S, group=(0, 2))
    t.add_collective(3, "recv", S, group=(1, 3))
    result = simulate(t, resolved(4, regions=("us", "us", "eu", "eu"), link_bw=link_bw), fast_path=fast_path)
    links = by_name(result)
    assert links["us->eu"].bytes == pytest.approx(2 * S, **exact)
    assert links["us->eu"].busy_s == pytest.approx(2 * S / link_bw, **exact)
    assert links["eu->us"].bytes == 0 and links["eu->us"].busy_s == 0
    assert links["uplink 0"].busy_s == pytest.approx(2 * S / link_bw, **exact)
    assert links["uplink 0"].utilization == pytest.approx(S / (B * result.wall_clock_s), **exact)
    assert result.wall_clock_s == pytest.approx(A + 2 * S / link_bw, **exact)


def test_a_collective_taken_over_mid_phase_is_accounted_as_on_the_event_path():
    # the all-reduce on (0, 1) starts alone (fast path); the one on (2, 3) starts mid-phase and takes it over
    t = Trace(4)
    for r in (0, 1):
        t.add_collective(r, "all_reduce", S, group=(0, 1))
        t.add_step(r)
    for r in (2, 3):
        t.add_compute(r, 0.3 * S / B)
        t.add_collective(r, "all_reduce", S, group=(2, 3))
        t.add_step(r)
    fast, event = (simulate(t, resolved(4), fast_path=f) for f in (True, False))
    for a, b in zip(fast.links, event.links):
        assert a.name == b.name
        assert a.bytes == pytest.approx(b.bytes, **exact)
        assert a.busy_s == pytest.approx(b.busy_s, **exact)
        assert a.busy_s == pytest.approx(S / B, **exact)  # ring of two: two phases of S/2 at B


def test_fifo_counts_only_the_message_that_moves():
    # FIFO: 0→1 and 0→2 both leave rank 0's uplink, one after the other; rank 2's downlink waits idle first
    t = Trace(3)
    t.add_collective(0, "send", S, group=(0, 1), async_op=True)
    t.add_collective(0, "send", S, group=(0, 2))
    t.add_collective(1, "recv", S, group=(0, 1))
    t.add_collective(2, "recv", S, group=(0, 2))
    links = by_name(simulate(t, resolved(3, sharing="fifo")))
    assert links["uplink 0"].busy_s == pytest.approx(2 * S / B, **exact)
    assert links["downlink 1"].busy_s == pytest.approx(S / B, **exact)
    assert links["downlink 2"].busy_s == pytest.approx(S / B, **exact)


def test_packet_headers_are_carried_bytes():
    mss, header = 1448, 52
    result = simulate(everyone(2, "broadcast", S), resolved(2, mss=mss, header_bytes=header))
    links = by_name(result)
    wire = S + -(-S // mss) * header
    assert links["uplink 0"].bytes == pytest.approx(wire, **exact)
    assert links["downlink 1"].bytes == pytest.approx(wire, **exact)
    assert links["uplink 1"].bytes == 0
