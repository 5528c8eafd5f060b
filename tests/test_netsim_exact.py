"""The simulator stays exact where floats would drift: feed order, late times, per-group order, stuck traces."""

from __future__ import annotations

import pytest

from exonet import Trace
from exonet.errors import TraceError
from exonet.netsim import Simulation, simulate
from exonet.netsim.engine import AnyRecv
from exonet.scenario import LinkSpec, Resolved
from exonet.trace import Collective, Compute, Step


def uniform(n: int, bw: float, latency: float = 0.0, **options) -> Resolved:
    return Resolved(num_nodes=n, uplink=(bw,) * n, downlink=(bw,) * n, region=("default",) * n, latency=latency,
                    speed=(1.0,) * n, **options)


def fed_in_order(trace: Trace, resolved: Resolved, order: list[int]):
    """Feed whole ranks one at a time in ``order``, replaying as far as allowed after each."""
    sim = Simulation(resolved)
    for r in order:
        for e in trace.events[r]:
            sim.feed(r, e)
        sim.close(r)
        sim.run_until_blocked()
    return sim.result()


def two_gathers() -> Trace:
    """Ranks 0 and 1 each all-gather with rank 2 (1 MB and 2 MB); rank 2 issues both async."""
    t = Trace(3)
    t.add_collective(0, "all_gather", 1_000_000, group=(0, 2))
    t.add_collective(1, "all_gather", 2_000_000, group=(1, 2))
    a = t.add_collective(2, "all_gather", 1_000_000, group=(0, 2), async_op=True)
    b = t.add_collective(2, "all_gather", 2_000_000, group=(1, 2), async_op=True)
    t.add_wait(2, a)
    t.add_wait(2, b)
    for r in range(3):
        t.add_step(r)
    return t


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 1, 0], [1, 2, 0], [2, 0, 1]])
def test_fifo_does_not_depend_on_the_order_ranks_are_fed(order):
    resolved = uniform(3, 1e6, sharing="fifo", algorithms={"all_gather": "direct"})
    whole = simulate(two_gathers(), resolved)
    fed = fed_in_order(two_gathers(), resolved, order)
    # Both start at t=0; the (0, 2) gather is first by (group, index), so rank 2's downlink takes it first.
    assert [n.comm_s for n in whole.per_node] == pytest.approx([1.0, 3.0, 3.0], rel=1e-12)
    assert [n.comm_s for n in fed.per_node] == [n.comm_s for n in whole.per_node]
    assert fed.wall_clock_s == whole.wall_clock_s


@pytest.mark.parametrize("t0", [0.0, 1e4, 1e6, 1e8])
def test_a_tiny_collective_late_in_a_long_run_is_timed_exactly(t0):
    n, nbytes, bw = 64, 1000, 10e9 / 8
    t = Trace(n)
    for r in range(n):
        t.add_compute(r, t0)
        t.add_collective(r, "all_reduce", nbytes)
        t.add_step(r)
    resolved = uniform(n, bw, algorithms={"all_reduce": "ring"})
    closed = 2 * (n - 1) / n * nbytes / bw
    for fast in (True, False):
        result = simulate(t, resolved, fast_path=fast)
        assert result.per_node[0].comm_s == pytest.approx(closed, rel=1e-9)
        assert result.per_node[0].compute_s == t0
    fast, event = (simulate(t, resolved, fast_path=f).per_node[5].comm_s for f in (True, False))
    assert fast == pytest.approx(event, rel=1e-9)


def queued_pair(resolved: Resolved) -> list[float]:
    """Two async all-reduces of 1 MB on the same group, issued together; each waited for in turn."""
    t = Trace(2)
    for r in range(2):
        a = t.add_collective(r, "all_reduce", 1_000_000, async_op=True)
        b = t.add_collective(r, "all_reduce", 1_000_000, async_op=True)
        t.add_wait(r, a)
        t.add_step(r)
        t.add_wait(r, b)
        t.add_step(r)
    return simulate(t, resolved).step_end_times


def test_collectives_on_one_group_run_one_at_a_time_in_issue_order():
    one = 1_000_000 / 1e6  # ring, n=2: S/B
    assert queued_pair(uniform(2, 1e6)) == pytest.approx([one, 2 * one], rel=1e-12)
    # With two at once (gloo's two worker threads) they share the NICs and end together.
    assert queued_pair(uniform(2, 1e6, group_concurrency=2)) == pytest.approx([2 * one, 2 * one], rel=1e-12)


def test_collectives_on_different_groups_still_share_links():
    t = Trace(3)
    for r, group in ((0, (0, 2)), (1, (1, 2))):
        t.add_collective(r, "all_gather", 1_000_000, group=group)
        t.add_step(r)
    a = t.add_collective(2, "all_gather", 1_000_000, group=(0, 2), async_op=True)
    b = t.add_collective(2, "all_gather", 1_000_000, group=(1, 2), async_op=True)
    t.add_wait(2, a)
    t.add_wait(2, b)
    t.add_step(2)
    result = simulate(t, uniform(3, 1e6, algorithms={"all_gather": "direct"}))
    assert result.wall_clock_s == pytest.approx(2.0, rel=1e-12)  # rank 2's downlink carries 2 MB at once, max-min


def test_every_spelling_of_a_group_is_the_same_group():
    t = Trace(3)
    t.events[0].append(Collective(0, "all_reduce", 3000, (0, 1, 2)))
    t.events[1].append(Collective(0, "all_reduce", 3000, None))
    t.events[2].append(Collective(0, "all_reduce", 3000, (2, 1, 0)))
    ref = Trace(3)
    for r in range(3):
        ref.add_collective(r, "all_reduce", 3000)
    resolved = uniform(3, 1e6, latency=1e-3)
    assert simulate(t, resolved).wall_clock_s == simulate(ref, resolved).wall_clock_s


def test_a_cyclic_wait_names_what_each_rank_is_blocked_on():
    t = Trace(3)
    t.add_collective(0, "all_reduce", 10, group=(0, 1))
    t.add_collective(0, "broadcast", 10)
    t.add_collective(1, "broadcast", 10)
    t.add_collective(1, "all_reduce", 10, group=(0, 1))
    t.add_collective(2, "broadcast", 10)
    with pytest.raises(TraceError) as info:
        simulate(t, uniform(3, 1e6))
    message = str(info.value)
    assert "rank 0 waits in all_reduce #0 on group [0, 1], issued by ranks [0] but not yet by ranks [1]" in message
    assert "rank 1 is blocked first in broadcast #0 on all ranks" in message
    assert "rank 1 waits in broadcast #0 on all ranks, issued by ranks [1, 2] but not yet by ranks [0]" in message
    assert "never by" not in message


def symmetric_buckets(n: int, steps: int) -> Trace:
    """Overlapped-DDP-shaped steps, identical on every rank (as ``estimate`` builds them)."""
    t = Trace(n)
    for r in range(n):
        for _ in range(steps):
            t.add_compute(r, 0.003)
            ids = []
            for b in range(4):
                t.add_compute(r, 0.001 * (b + 1))
                ids.append(t.add_collective(r, "all_reduce", 250_000 * (b + 1), async_op=True))
            for cid in ids:
                t.add_wait(r, cid)
            t.add_step(r)
    return t


@pytest.mark.parametrize("resolved", [uniform(8, 1e8, latency=1e-4),
                                      Resolved(num_nodes=8, uplink=(1e8,) * 4 + (2e7,) * 4, downlink=(1e8,) * 8,
                                               region=("a",) * 4 + ("b",) * 4, latency=1e-4, speed=(1.0,) * 8,
                                               links={("a", "b"): LinkSpec(5e7, 0.02)})])
def test_identical_ranks_are_replayed_once_with_the_same_result(resolved):
    trace = symmetric_buckets(8, 5)
    mirrored = simulate(trace, resolved)
    full = fed_in_order(trace, resolved, list(range(8)))  # incremental feeding replays every rank
    assert mirrored.wall_clock_s == full.wall_clock_s
    assert mirrored.step_end_times == full.step_end_times
    assert mirrored.per_node == full.per_node and mirrored.wire_bytes == full.wire_bytes
    assert mirrored.events == full.events
    jittered = Resolved(**{**resolved.__dict__, "jitter": "lognormal", "sigma": 0.1})
    assert simulate(trace, jittered).per_node[0] != simulate(trace, jittered).per_node[1]  # no mirroring then


# ------------------------------------------------------------------ point-to-point messages
def test_a_message_crosses_the_senders_uplink_the_link_and_the_receivers_downlink():
    resolved = Resolved(num_nodes=3, uplink=(1e6, 4e6, 4e6), downlink=(4e6, 2e6, 4e6), region=("a", "a", "b"),
                        latency=1e-3, speed=(1.0,) * 3, links={("a", "b"): LinkSpec(5e5, 0.03)})
    t = Trace(3)
    t.add_collective(0, "send", 1_000_000, group=(0, 1))
    t.add_collective(1, "recv", 1_000_000, group=(0, 1))
    t.add_collective(1, "send", 1_000_000, group=(1, 2))
    t.add_collective(2, "recv", 1_000_000, group=(1, 2))
    for r in range(3):
        t.add_step(r)
    result = simulate(t, resolved)
    first = 1e-3 + 1_000_000 / 1e6  # α + s / min(uplink 0, downlink 1)
    second = 0.03 + 1_000_000 / 5e5  # across the region link: its latency and bandwidth
    assert result.step_end_times == pytest.approx([first + second], rel=1e-12)
    assert result.per_node[0].comm_s == pytest.approx(first, rel=1e-12)
    assert result.wire_bytes == [1_000_000, 1_000_000, 0]
    assert t.payload_bytes(0) == t.payload_bytes(1) == 1_000_000 and t.payload_bytes(2) == 0  # a recv is no payload


def test_messages_each_way_are_separate_channels_and_a_missing_recv_is_named():
    t = Trace(2)
    for r in range(2):
        a = t.add_collective(r, "send", 2_000_000, group=(0, 1), async_op=True)
        t.add_collective(r, "recv", 2_000_000, group=(0, 1))
        t.add_wait(r, a)
        t.add_step(r)
    result = simulate(t, uniform(2, 1e6))
    assert result.wall_clock_s == pytest.approx(2.0, rel=1e-12)  # both directions at once, full duplex
    bad = Trace(2)
    bad.add_collective(0, "send", 10, group=(0, 1))
    bad.add_collective(1, "send", 10, group=(0, 1))
    with pytest.raises(TraceError, match="message #0 from rank 0 to rank 1, issued by ranks \\[0\\] "
                                         "but never by ranks \\[1\\] \\(rank 1 ended its events without issuing it"):
        simulate(bad, uniform(2, 1e6))  # sent, never received
    stuck = Trace(2)
    stuck.add_collective(0, "recv", 10, group=(0, 1))
    stuck.add_collective(1, "recv", 10, group=(0, 1))
    with pytest.raises(TraceError, match="rank 0 waits in message #0 from rank 1 to rank 0, issued by ranks \\[0\\] "
                                         "but not yet by ranks \\[1\\] \\(rank 1 is blocked first in message #0 "
                                         "from rank 0"):
        simulate(stuck, uniform(2, 1e6))
    with pytest.raises(ValueError, match="pair"):
        Trace(3).add_collective(0, "send", 10)


def test_a_message_flows_when_sent_and_a_late_recv_takes_it_at_once():
    t = Trace(2)
    t.add_collective(0, "send", 1_000_000, group=(0, 1))
    t.add_compute(1, 2.0)
    t.add_collective(1, "recv", 1_000_000, group=(0, 1))
    for r in range(2):
        t.add_step(r)
    result = simulate(t, uniform(2, 1e6))
    assert result.step_end_times == [2.0]
    assert result.per_node[0].comm_s == pytest.approx(1.0, rel=1e-12)  # the sender is done when it has arrived
    assert result.per_node[1].comm_s == 0.0  # already buffered at the receiver


def _server_run(order: list[int], server_compute: float = 0.0) -> Simulation:
    """Ranks 0 and 1 send 1 MB to rank 2 after 0.5 s and 0.2 s; rank 2 takes two messages from anyone."""
    sim = Simulation(uniform(3, 1e6))
    feeds = {0: [Compute(0.5, 0.5), Collective(0, "send", 1_000_000, (0, 2)), Step()],
             1: [Compute(0.2, 0.2), Collective(0, "send", 1_000_000, (1, 2)), Step()],
             2: [Compute(server_compute, server_compute), AnyRecv(1_000_000), AnyRecv(1_000_000)]}
    for r in order:
        for e in feeds[r]:
            sim.feed(r, e)
        if r != 2:
            sim.close(r)  # a sender that may still send holds the replay back at its cursor
        sim.run_until_blocked()
    return sim


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 1, 0], [1, 2, 0]])
def test_an_any_source_receive_takes_messages_in_simulated_arrival_order(order):
    sim = _server_run(order)
    # rank 1 alone on the server's downlink for 0.3 s, then both share it: rank 1 ends at 1.9 s, rank 0 at 2.2 s
    assert [s for s, _ in sim.received(2)] == [1, 0]
    assert [t for _, t in sim.received(2)] == pytest.approx([1.9, 2.2], rel=1e-12)
    assert not sim.waits_for_any(2)


def test_an_any_source_receive_after_both_arrived_takes_the_first_delivered_and_replays_alike():
    sim = _server_run([0, 1, 2], server_compute=5.0)
    assert sim.received(2) == [(1, 5.0), (0, 5.0)]
    online = sim.result()
    replay = Trace(3)
    for r, wait in enumerate([0.5, 0.2]):
        replay.add_compute(r, wait)
        replay.add_collective(r, "send", 1_000_000, group=(r, 2))
        replay.add_step(r)
    replay.add_compute(2, 5.0)
    for sender, _ in sim.received(2):
        replay.add_collective(2, "recv", 1_000_000, group=(sender, 2))
    again = simulate(replay, uniform(3, 1e6))
    assert again.wall_clock_s == online.wall_clock_s and again.per_node == online.per_node


def test_an_any_source_receive_is_cancelled_once_nothing_can_arrive():
    sim = Simulation(uniform(2, 1e6))
    sim.feed(1, AnyRecv(10))
    sim.run_until_blocked()
    assert sim.may_receive(1)  # rank 0 may still send
    sim.close(0)
    sim.run_until_blocked()
    assert sim.waits_for_any(1) and not sim.may_receive(1)
    sim.cancel_any(1)
    sim.close(1)
    assert sim.result().wall_clock_s == 0.0
    stuck = Simulation(uniform(2, 1e6))
    stuck.feed(1, AnyRecv(10))
    with pytest.raises(TraceError, match="rank 1 waits for a message from any rank"):
        stuck.result()
