"""The network simulator against hand-derived times: closed forms, contention, stragglers, events.

Each test builds a tiny trace with the Trace builder and a Resolved scenario with the
``net`` factory, replays it, and asserts the exact simulated time (rel 1e-9), in the
style of SimPy's own tests.
"""

from __future__ import annotations

import json
import math

import pytest

from exonet import Trace
from exonet.errors import ScenarioError, TraceError
from exonet.netsim import Simulation, simulate
from exonet.netsim.collectives import BUILDERS
from exonet.scenario import ALGORITHMS, EventSpec, LinkSpec, Resolved

B = 1.0e9  # bytes/s
A = 1.0e-3  # one-way latency, s
S = 10_000_003  # not divisible by any n below
exact = {"rel": 1e-9, "abs": 1e-15}


@pytest.fixture
def net():
    """Factory: a Resolved scenario, uniform unless told otherwise."""

    def make(n: int, *, bw: float = B, latency: float = A, up=None, down=None, regions=None, links=None,
             algorithms=None, **options) -> Resolved:
        return Resolved(
            num_nodes=n,
            uplink=tuple(up or (bw,) * n),
            downlink=tuple(down or (bw,) * n),
            region=tuple(regions or ("default",) * n),
            latency=latency,
            links=links or {},
            speed=options.pop("speed", (1.0,) * n),
            algorithms=algorithms or {},
            **options,
        )

    return make


def one(resolved: Resolved, op: str, nbytes: int, *, fast_path: bool = True):
    """Replay a single collective issued by every rank at time 0."""
    t = Trace(resolved.num_nodes)
    for r in range(resolved.num_nodes):
        t.add_collective(r, op, nbytes)
        t.add_step(r)
    return simulate(t, resolved, fast_path=fast_path)


# ------------------------------------------------------------------ closed forms
def _hd(n: int) -> float:
    """Halving-doubling all-reduce: power of two, or folded onto p = 2^⌊log2 n⌋ survivors."""
    p = 1 << (n.bit_length() - 1)
    fold = 2 * (A + S / B) if p != n else 0.0
    return fold + 2 * math.log2(p) * A + 2 * (p - 1) / p * S / B


def _chain(n: int) -> float:
    """A pipelined chain of c chunks over n − 1 hops: c = round(√((n−2)·S/(α·B))) in [1, 64] (1 for n ≤ 2)."""
    c = 1 if n <= 2 else max(1, min(64, round(math.sqrt((n - 2) * S / (A * B)))))
    return (c + n - 2) * (A + S / (c * B))


def _binomial_gather(n: int, s: float) -> float:
    """Round j: ranks at odd multiples of 2^j send their blocks (up to 2^j ranks' s) 2^j down; the largest ends it."""
    return sum(A + max(min(1 << j, n - i) for i in range(1 << j, n, 2 << j)) * s / B
               for j in range((n - 1).bit_length()))


CLOSED_FORMS = {
    ("all_reduce", "ring"): lambda n: 2 * (n - 1) * A + 2 * (n - 1) / n * S / B,
    ("all_reduce", "halving_doubling"): _hd,
    ("all_reduce", "star"): lambda n: 2 * A + 2 * (n - 1) * S / B,
    ("all_reduce", "direct"): lambda n: 2 * A + 2 * (n - 1) / n * S / B,
    ("all_gather", "ring"): lambda n: (n - 1) * A + (n - 1) * S / B,
    ("all_gather", "star"): lambda n: 2 * A + (n - 1) * S / B + (n - 1) ** 2 * S / B,
    ("all_gather", "direct"): lambda n: A + (n - 1) * S / B,
    ("reduce_scatter", "ring"): lambda n: (n - 1) * A + (n - 1) / n * S / B,
    ("reduce_scatter", "star"): lambda n: 2 * A + (n - 1) * S / B + (n - 1) / n * S / B,
    ("reduce_scatter", "direct"): lambda n: A + (n - 1) / n * S / B,
    ("broadcast", "binomial"): lambda n: math.ceil(math.log2(n)) * (A + S / B),
    ("broadcast", "star"): lambda n: A + (n - 1) * S / B,
    ("broadcast", "direct"): lambda n: 2 * A + 2 * (n - 1) / n * S / B,
    ("all_to_all", "direct"): lambda n: A + (n - 1) / n * S / B,
    ("all_to_all", "star"): lambda n: 2 * A + 2 * (n - 1) ** 2 / n * S / B,
    # rooted at the group's lowest rank; a reduce is its broadcast mirrored, so it takes the broadcast's time
    ("reduce", "chain"): lambda n: _chain(n),
    ("reduce", "binomial"): lambda n: math.ceil(math.log2(n)) * (A + S / B),
    ("reduce", "star"): lambda n: A + (n - 1) * S / B,
    ("reduce", "direct"): lambda n: 2 * A + 2 * (n - 1) / n * S / B,
    ("gather", "direct"): lambda n: A + (n - 1) * S / B,
    ("gather", "binomial"): lambda n: _binomial_gather(n, S),
    ("scatter", "direct"): lambda n: A + (n - 1) / n * S / B,
    ("scatter", "binomial"): lambda n: _binomial_gather(n, S / n),
    ("barrier", "dissemination"): lambda n: math.ceil(math.log2(n)) * A,
    ("barrier", "star"): lambda n: 2 * A,
    ("barrier", "direct"): lambda n: A,
}


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 16])
@pytest.mark.parametrize("op, algorithm", sorted(CLOSED_FORMS))
def test_closed_form(net, op, algorithm, n, fast_path):
    result = one(net(n, algorithms={op: algorithm}), op, S, fast_path=fast_path)
    assert result.wall_clock_s == pytest.approx(CLOSED_FORMS[op, algorithm](n), **exact)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
@pytest.mark.parametrize("op, per_phase", [("all_gather", lambda n: (n - 1) * S),
                                           ("reduce_scatter", lambda n: (n - 1) / n * S)])
def test_recursive_doubling_and_halving_on_powers_of_two(net, op, per_phase, n):
    result = one(net(n, algorithms={op: "halving_doubling"}), op, S)
    assert result.wall_clock_s == pytest.approx(math.log2(n) * A + per_phase(n) / B, **exact)


def test_recursive_doubling_and_halving_fold_three_ranks(net):
    # all_gather: fold s (α + s/B); survivor 0 holds 2s and sends it, 1 sends s (α + 2s/B); unfold 2s (α + 2s/B)
    ag = one(net(3, algorithms={"all_gather": "halving_doubling"}), "all_gather", S)
    assert ag.wall_clock_s == pytest.approx(3 * A + 5 * S / B, **exact)
    # reduce_scatter: fold S; survivor 1 sends 2S/3 (two ranks' chunks) to survivor 0; unfold S/3
    rs = one(net(3, algorithms={"reduce_scatter": "halving_doubling"}), "reduce_scatter", S)
    assert rs.wall_clock_s == pytest.approx(3 * A + 2 * S / B, **exact)


@pytest.mark.parametrize("n, expected", [(2, 2 * A + S / B), (4, 4 * A + 3 * S / B)])
def test_double_binary_tree(net, n, expected):
    assert one(net(n, algorithms={"all_reduce": "tree"}), "all_reduce", S).wall_clock_s == pytest.approx(expected,
                                                                                                          **exact)


@pytest.mark.parametrize("n", range(2, 20))
def test_double_binary_tree_is_bounded_by_its_depth(net, n):
    depth = n.bit_length() - 1
    t = one(net(n, algorithms={"all_reduce": "tree"}), "all_reduce", S).wall_clock_s
    assert 2 * depth * (A + S / (2 * B)) * (1 - 1e-12) <= t <= 2 * depth * (A + S / B) * (1 + 1e-12)


@pytest.mark.parametrize("n", [2, 4, 9])
def test_pipelined_chain_broadcast(net, n):
    c = 1 if n == 2 else round(math.sqrt((n - 2) * S / (A * B)))
    expected = (c + n - 2) * (A + S / (c * B))
    assert one(net(n, algorithms={"broadcast": "chain"}), "broadcast", S).wall_clock_s == pytest.approx(expected,
                                                                                                        **exact)


@pytest.mark.parametrize("op, algorithm", sorted((op, a) for op, algos in BUILDERS.items() for a in algos))
def test_a_group_of_one_takes_no_time(net, op, algorithm):
    result = one(net(1, algorithms={op: algorithm}), op, S)
    assert result.wall_clock_s == 0.0 and result.wire_bytes == [0]


def test_every_algorithm_the_scenario_offers_is_implemented():
    assert {op: tuple(a) for op, a in BUILDERS.items()} == {op: tuple(a) for op, a in ALGORITHMS.items()}


def test_zero_bytes_still_pay_latency(net):
    assert one(net(4), "all_reduce", 0).wall_clock_s == pytest.approx(6 * A, **exact)


# ------------------------------------------------------------------ wire bytes
@pytest.mark.parametrize(
    "op, algorithm, expected",
    [
        ("all_reduce", "ring", lambda n, r: 2 * (n - 1) / n * S),
        ("all_reduce", "star", lambda n, r: (n - 1) * S if r == 0 else S),
        ("all_reduce", "direct", lambda n, r: 2 * (n - 1) / n * S),
        ("all_gather", "ring", lambda n, r: (n - 1) * S),
        ("reduce_scatter", "ring", lambda n, r: (n - 1) / n * S),
        ("broadcast", "binomial", lambda n, r: {0: 3 * S, 1: 2 * S}.get(r, 0)),
        ("broadcast", "star", lambda n, r: (n - 1) * S if r == 0 else 0),
        ("all_to_all", "direct", lambda n, r: (n - 1) / n * S),
    ],
)
def test_wire_bytes_per_algorithm(net, op, algorithm, expected):
    n = 6
    result = one(net(n, algorithms={op: algorithm}), op, S)
    assert result.wire_bytes == [round(expected(n, r)) for r in range(n)]


# ------------------------------------------------------------------ contention
def test_k_flows_crossing_one_link_each_get_a_kth(net):
    # three star broadcasts 0→3, 1→4, 2→5 start together; all cross us→eu (L < NIC)
    L, AL = 3e8, 5e-3
    resolved = net(6, regions=["us"] * 3 + ["eu"] * 3, links={("eu", "us"): LinkSpec(L, AL)},
                   algorithms={"broadcast": "star"})
    t = Trace(6)
    for r in range(6):
        t.add_collective(r, "broadcast", S, group=(r % 3, r % 3 + 3))
    assert simulate(t, resolved).wall_clock_s == pytest.approx(AL + 3 * S / L, **exact)


@pytest.mark.parametrize("fast_path", [True, False])
def test_two_rings_sharing_an_inter_region_link_slow_down_as_max_min_predicts(net, fast_path):
    # us = {0,1,2,3}, eu = {4,5,6,7}. Ring (0,1,4,5): 0→1, 1→4 (us→eu), 4→5, 5→0 (eu→us);
    # ring (2,3,6,7) likewise, so each direction of the link carries one flow of each ring.
    # Link L = 0.6 B: alone a crossing flow gets L; together each gets L/2 (< B). Local hops get B.
    # A phase moves c = S/4 per flow and lasts max(A + c/B, AL + c/rate); 2(4-1) = 6 phases.
    L, AL = 0.6 * B, 4e-3
    resolved = net(8, regions=["us"] * 4 + ["eu"] * 4, links={("eu", "us"): LinkSpec(L, AL)})
    alone, both = Trace(8), Trace(8)
    for r in (0, 1, 4, 5):
        alone.add_collective(r, "all_reduce", S, group=(0, 1, 4, 5))
    for r in range(8):
        both.add_collective(r, "all_reduce", S, group=(0, 1, 4, 5) if r in (0, 1, 4, 5) else (2, 3, 6, 7))
    c = S / 4
    assert simulate(alone, resolved, fast_path=fast_path).wall_clock_s == pytest.approx(6 * (AL + c / L), **exact)
    assert simulate(both, resolved, fast_path=fast_path).wall_clock_s == pytest.approx(6 * (AL + c / (L / 2)), **exact)


def test_fifo_sends_one_message_at_a_time(net):
    # star all_gather on 3 ranks, fifo: the two incast messages reach the hub one after the other
    resolved = net(3, sharing="fifo", algorithms={"all_gather": "star"})
    result = one(resolved, "all_gather", S)
    # phase 1: 2 messages of s through the hub's downlink; phase 2: 2 messages of 2s from its uplink
    assert result.wall_clock_s == pytest.approx(2 * A + 2 * S / B + 4 * S / B, **exact)


def test_tcp_window_caps_a_flow_at_window_over_rtt(net):
    W = 1e5  # window / (2·A) = 5e7 B/s < B
    result = one(net(2, tcp_window=W), "all_reduce", S)
    assert result.wall_clock_s == pytest.approx(2 * (A + (S / 2) / (W / (2 * A))), **exact)


def test_uplink_downlink_asymmetry(net):
    up, down = 1e8, 1e9
    ring = one(net(4, up=[up] * 4, down=[down] * 4), "all_reduce", S)
    assert ring.wall_clock_s == pytest.approx(6 * A + 6 / 4 * S / up, **exact)
    # star: the incast is limited by each sender's uplink, the hub's uplink then carries 3 copies
    star = one(net(4, up=[up] * 4, down=[down] * 4, algorithms={"all_reduce": "star"}), "all_reduce", S)
    assert star.wall_clock_s == pytest.approx(2 * A + S / up + 3 * S / up, **exact)


def test_heterogeneous_nic_is_the_ring_bottleneck(net):
    slow = 2e8
    result = one(net(4, up=[B, B, slow, B]), "all_reduce", S)
    assert result.wall_clock_s == pytest.approx(6 * (A + S / 4 / slow), **exact)


# ------------------------------------------------------------------ stragglers and overlap
def ring2() -> float:
    return 2 * A + S / B  # ring all-reduce of S on two ranks


def test_sync_collective_starts_at_the_slowest_arrival(net):
    t = Trace(3)
    for r, secs in enumerate((1.0, 2.0, 3.0)):
        t.add_compute(r, secs)
        t.add_collective(r, "all_reduce", S)
        t.add_step(r)
    result = simulate(t, net(3))
    ring3 = 4 * A + 4 / 3 * S / B
    assert result.wall_clock_s == pytest.approx(3.0 + ring3, **exact)
    assert [n.idle_s for n in result.per_node] == pytest.approx([2.0, 1.0, 0.0], **exact)
    assert [n.comm_s for n in result.per_node] == pytest.approx([ring3] * 3, **exact)


def test_half_speed_doubles_compute(net):
    t = Trace(2)
    for r in range(2):
        t.add_compute(r, 1.0)
        t.add_step(r)
    result = simulate(t, net(2, speed=(1.0, 0.5)))
    assert [n.compute_s for n in result.per_node] == pytest.approx([1.0, 2.0], **exact)
    assert result.wall_clock_s == pytest.approx(2.0, **exact)


@pytest.mark.parametrize("compute", [0.5 * ring2(), 2.0 * ring2()])
def test_async_all_reduce_is_hidden_behind_compute(net, compute):
    t = Trace(2)
    for r in range(2):
        t.add_compute(r, 1.0)
        cid = t.add_collective(r, "all_reduce", S, async_op=True)
        t.add_compute(r, compute)
        t.add_wait(r, cid)
        t.add_step(r)
    result = simulate(t, net(2))
    assert result.wall_clock_s == pytest.approx(1.0 + max(compute, ring2()), **exact)
    assert result.per_node[0].comm_s == pytest.approx(max(0.0, ring2() - compute), **exact)


def jittery(seed: int, net) -> float:
    t = Trace(2)
    for r in range(2):
        for _ in range(5):
            t.add_compute(r, 1.0)
            t.add_collective(r, "all_reduce", S)
            t.add_step(r)
    return simulate(t, net(2, jitter="lognormal", sigma=0.2, seed=seed)).wall_clock_s


def test_jitter_is_seeded(net):
    assert jittery(1, net) == jittery(1, net)
    assert jittery(1, net) != jittery(2, net)


@pytest.mark.parametrize("kind", ["normal", "exponential"])
def test_every_jitter_distribution_moves_compute(net, kind):
    t = Trace(1)
    for _ in range(20):
        t.add_compute(0, 1.0)
        t.add_step(0)
    result = simulate(t, net(1, jitter=kind, sigma=0.1, seed=0))
    assert result.wall_clock_s != pytest.approx(20.0) and result.wall_clock_s > 0


def steps(n: int, count: int, compute: float = 1.0, op: str | None = None) -> Trace:
    t = Trace(n)
    for r in range(n):
        for _ in range(count):
            t.add_compute(r, compute)
            if op:
                t.add_collective(r, op, S)
            t.add_step(r)
    return t


def test_slow_by_step_multiplies_those_steps(net):
    event = EventSpec("slow", (0,), from_step=1, to_step=2, factor=4.0)
    result = simulate(steps(1, 3), net(1, events=(event,)))
    assert result.step_end_times == pytest.approx([1.0, 5.0, 6.0], **exact)


def test_slow_by_seconds_stretches_the_part_of_a_span_inside_the_window(net):
    event = EventSpec("slow", (0,), from_s=0.5, to_s=1.0, factor=2.0)
    # 0.5 s of work before the window, 0.25 inside it (at half speed), 0.25 after
    assert simulate(steps(1, 1), net(1, events=(event,))).wall_clock_s == pytest.approx(1.25, **exact)


def test_down_by_seconds_pauses_compute_and_counts_as_idle(net):
    event = EventSpec("down", (0,), from_s=0.5, to_s=1.5)
    result = simulate(steps(1, 1), net(1, events=(event,)))
    assert result.wall_clock_s == pytest.approx(2.0, **exact)
    assert (result.per_node[0].compute_s, result.per_node[0].idle_s) == pytest.approx((1.0, 1.0), **exact)


def test_a_collective_waits_for_a_member_that_is_down(net):
    event = EventSpec("down", (1,), from_s=0.0, to_s=2.0)
    result = one(net(2, events=(event,)), "all_reduce", S)
    assert result.wall_clock_s == pytest.approx(2.0 + ring2(), **exact)
    assert result.per_node[0].idle_s == pytest.approx(2.0, **exact)


@pytest.mark.parametrize("fast_path", [True, False])
def test_an_outage_mid_transfer_stops_the_flows_for_its_length(net, fast_path):
    start, length = A + 0.25 * S / B, 0.7  # rank 1 goes down while the first phase's bytes move
    event = EventSpec("down", (1,), from_s=start, to_s=start + length)
    result = one(net(2, events=(event,)), "all_reduce", S, fast_path=fast_path)
    assert result.wall_clock_s == pytest.approx(ring2() + length, **exact)
    rank1 = result.per_node[1]
    assert rank1.idle_s == pytest.approx(length, **exact) and rank1.comm_s == pytest.approx(ring2(), **exact)


def test_down_by_step_lasts_the_work_of_the_steps_it_covers(net):
    # rank 1 drops out as it begins step 1, for its work of steps 1..2 (2 s), then does them
    event = EventSpec("down", (1,), from_step=1, to_step=3)
    result = simulate(steps(2, 3, op="all_reduce"), net(2, events=(event,)))
    step = 1.0 + ring2()
    assert result.step_end_times == pytest.approx([step, 2 * step + 2.0, 3 * step + 2.0], **exact)


# ------------------------------------------------------------------ accounting, results, errors
def mixed_trace() -> Trace:
    """Async collectives, subgroups, uneven compute: everything the accounting has to cover."""
    t = Trace(4)
    for r in range(4):
        for k in range(3):
            t.add_compute(r, 0.1 * (r + 1) + 0.05 * k)
            cid = t.add_collective(r, "all_reduce", S, async_op=True)
            t.add_compute(r, 0.01)
            t.add_collective(r, "all_gather", S // 7, group=(0, 1) if r < 2 else (2, 3))
            t.add_wait(r, cid)
            t.add_step(r)
    return t


@pytest.mark.parametrize("fast_path", [True, False])
def test_compute_comm_idle_add_up_to_the_wall_clock(net, fast_path):
    event = EventSpec("down", (2,), from_s=0.2, to_s=0.3)
    result = simulate(mixed_trace(), net(4, events=(event,)), fast_path=fast_path)
    for node in result.per_node:
        assert node.compute_s + node.comm_s + node.idle_s == pytest.approx(result.wall_clock_s, **exact)
    total = sum(n.compute_s for n in result.per_node)
    assert result.utilization == pytest.approx(total / (4 * result.wall_clock_s), **exact)
    assert len(result.step_end_times) == result.num_steps == 3
    assert result.step_end_times == sorted(result.step_end_times)


def test_chrome_trace_has_one_track_per_node(net, tmp_path):
    result = simulate(mixed_trace(), net(4))
    path = result.to_chrome_trace(tmp_path / "timeline.json")
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {r: f"node {r}" for r in range(4)}
    for rank in range(4):
        spans = [e for e in events if e["ph"] == "X" and e["tid"] == rank]
        assert {e["name"] for e in spans} <= {"compute", "comm", "idle"}
        assert sum(e["dur"] for e in spans) == pytest.approx(result.wall_clock_s * 1e6, rel=1e-9)


def test_loss_vs_time_and_summary(net):
    result = simulate(steps(2, 3, op="all_reduce"), net(2), history=[3.0, 2.0, 1.5])
    assert result.loss_vs_time() == list(zip(result.step_end_times, [3.0, 2.0, 1.5]))
    text = result.summary()
    assert "2 nodes, 3 steps" in text and len(text.splitlines()) == 6
    assert text.splitlines()[1].startswith("a real run, by the model's measured errors in the phase regime")
    assert text.splitlines()[-1].startswith("most loaded link: ")
    with pytest.raises(ValueError, match="history has 2 losses but the trace has 3 steps"):
        simulate(steps(2, 3), net(2), history=[1.0, 2.0])


def test_same_trace_and_scenario_give_the_same_result(net):
    resolved = net(4, jitter="lognormal", sigma=0.3, seed=7)
    a, b = simulate(mixed_trace(), resolved), simulate(mixed_trace(), resolved)
    assert (a.wall_clock_s, a.step_end_times, a.per_node) == (b.wall_clock_s, b.step_end_times, b.per_node)


def test_incremental_feeding_matches_the_whole_trace(net):
    trace, resolved = mixed_trace(), net(4)
    whole = simulate(trace, resolved)
    sim = Simulation(resolved)
    cursors = [0] * 4
    while any(c < len(trace.events[r]) for r, c in enumerate(cursors)):
        for r in range(4):  # one event per rank per round, replaying as far as allowed after each round
            if cursors[r] < len(trace.events[r]):
                sim.feed(r, trace.events[r][cursors[r]])
                cursors[r] += 1
        sim.run_until_blocked()
    result = sim.result()
    assert result.wall_clock_s == pytest.approx(whole.wall_clock_s, **exact)
    assert result.step_end_times == pytest.approx(whole.step_end_times, **exact)


def test_the_clock_waits_for_a_rank_that_has_not_been_fed(net):
    sim = Simulation(net(2))
    for ev in steps(2, 1, compute=5.0, op="all_reduce").events[0]:
        sim.feed(0, ev)
    assert sim.run_until_blocked() == 0.0  # rank 1 is still at 0 s: nothing may happen after it
    sim.feed(1, steps(1, 1, compute=1.0).events[0][0])
    sim.run_until_blocked()
    assert sim.rank_time(1) == 1.0


def test_node_count_mismatch_is_a_clear_error(net):
    with pytest.raises(ScenarioError, match="trace has 3 ranks but the scenario was resolved for 2"):
        simulate(Trace(3), net(2))


def test_mismatched_collectives_are_trace_errors(net):
    t = Trace(2)
    t.add_collective(0, "all_reduce", S)
    t.add_collective(1, "all_gather", S)
    with pytest.raises(TraceError, match="is all_reduce on rank 0 but all_gather on rank 1"):
        simulate(t, net(2))
    t = Trace(2)
    t.add_collective(0, "all_reduce", S)
    with pytest.raises(TraceError, match=r"issued by ranks \[0\] but never by ranks \[1\]"):
        simulate(t, net(2))


def test_scenario_errors_name_what_is_wrong(net):
    with pytest.raises(ScenarioError, match="'ring' is not offered for broadcast"):
        simulate(Trace(2), net(2, algorithms={"broadcast": "ring"}))
    with pytest.raises(ScenarioError, match="no link joins regions"):
        one(net(2, regions=["us", "eu"]), "all_reduce", S)
    with pytest.raises(ScenarioError, match="needs an end"):
        simulate(Trace(2), net(2, events=(EventSpec("down", (0,), from_s=1.0),)))
    with pytest.raises(ScenarioError, match="sharing"):
        simulate(Trace(2), net(2, sharing="fair"))


def test_scenario_dicts_are_accepted_and_named():
    scenario = {"name": "lan", "network": {"bandwidth": "8 Gbit/s", "latency": "1 ms"}}
    result = simulate(steps(2, 1, compute=0.0, op="all_reduce"), scenario)
    assert result.scenario_name == "lan"
    assert result.wall_clock_s == pytest.approx(ring2(), **exact)


@pytest.mark.parametrize("mode, expected", [("measured", 0.5), ("wall", 2.0), ("flops", 4.0)])
def test_compute_mode_picks_what_a_span_costs(net, mode, expected):
    t = Trace(1)
    t.add_compute(0, 2.0, cpu_s=0.5, flops=4e12)  # flops: 4e12 / (2 TFLOP/s x mfu 0.5) = 4 s
    t.add_step(0)
    options = {"tflops": 2.0, "mfu": 0.5} if mode == "flops" else {}
    assert simulate(t, net(1, compute_mode=mode, **options)).wall_clock_s == pytest.approx(expected, **exact)
    with pytest.raises(ScenarioError, match="needs tflops"):
        simulate(t, net(1, compute_mode="flops"))


def test_a_trace_without_flops_is_timed_by_its_seconds_in_a_flops_scenario_and_says_so(net):
    """A hand-built trace (seconds only) in a FLOPs preset took no compute at all (utilisation 0): it is
    timed by its wall seconds, with a caution; a trace that counts FLOPs anywhere keeps FLOPs timing, and
    jobs of both kinds on one network are an error naming them."""
    flops = net(1, compute_mode="flops", tflops=2.0, mfu=0.5)
    t = Trace(1)
    t.add_compute(0, 2.0, cpu_s=0.5)
    t.add_step(0)
    result = simulate(t, flops)
    assert result.wall_clock_s == pytest.approx(2.0, **exact) and result.utilization == pytest.approx(1.0)
    assert len(result.cautions) == 1 and "compute timed by the trace's wall seconds" in result.cautions[0]
    assert "caution: compute timed by the trace's wall seconds" in result.summary()
    preset = simulate(t, "cross-region")
    assert preset.wall_clock_s == pytest.approx(2.0, **exact) and "'cross-region'" in preset.cautions[0]
    counted = Trace(1)
    counted.add_compute(0, 2.0, flops=4e12)
    counted.add_compute(0, 1.0)  # a span without FLOPs beside counted ones is the run's own: it costs 0 s
    counted.add_step(0)
    result = simulate(counted, flops)
    assert result.wall_clock_s == pytest.approx(4.0, **exact) and result.cautions == ()
    with pytest.raises(ScenarioError, match="job 1's compute spans carry no FLOPs while job 0's do"):
        simulate([counted, t], net(2, compute_mode="flops", tflops=2.0, mfu=0.5))
    assert simulate([t, t], net(2, compute_mode="flops", tflops=2.0, mfu=0.5)).cautions


def test_a_group_of_one_sends_nothing_pays_no_setup_and_counts_no_payload(net):
    """A K = 1 DDP run was charged home-broadband's 0.5 s set-up and 4P of payload per step, where
    FedAvg, DiLoCo and SPARTA (which skip the call alone) had none: a group of one connects nothing."""
    t = Trace(2)
    for r in range(2):
        t.add_compute(r, 1.0)
        t.add_collective(r, "all_reduce", 1000, group=(r,))
        t.add_step(r)
    result = simulate(t, net(2, setup=0.5))
    assert result.wall_clock_s == pytest.approx(1.0, **exact) and result.wire_bytes == [0, 0]
    assert t.payload_bytes(0) == 0 and t.payload_bytes_per_step(1) == [0]
    for r in range(2):
        t.add_collective(r, "all_reduce", 1000)  # the world: set up once, then 2α + S/B
    result = simulate(t, net(2, setup=0.5))
    assert result.wall_clock_s == pytest.approx(1.0 + 0.5 + 2 * A + 1000 / B, **exact)
    assert t.payload_bytes(0) == 1000 and t.payload_bytes_per_step(0) == [0]  # the trailing one forms no step
    alone = Trace(1)
    alone.add_collective(0, "all_reduce", 1000)
    alone.add_step(0)
    assert alone.payload_bytes(0) == 0 and simulate(alone, net(1, setup=0.5)).wall_clock_s == 0.0


def test_down_by_step_from_the_first_step(net):
    event = EventSpec("down", (0,), from_step=0, to_step=1)
    result = simulate(steps(1, 2), net(1, events=(event,)))
    assert result.step_end_times == pytest.approx([2.0, 3.0], **exact)
    assert result.per_node[0].idle_s == pytest.approx(1.0, **exact)


def test_an_outage_by_step_waits_until_its_steps_have_been_fed(net):
    event = EventSpec("down", (0,), from_step=0, to_step=2)
    sim = Simulation(net(1, events=(event,)))
    trace = steps(1, 3)
    for ev in trace.events[0][:2]:  # step 0 only: the outage's length (steps 0 and 1) is not known yet
        sim.feed(0, ev)
    sim.run_until_blocked()
    assert sim.rank_time(0) == 0.0
    for ev in trace.events[0][2:]:
        sim.feed(0, ev)
    sim.run_until_blocked()
    assert sim.rank_time(0) == pytest.approx(5.0, **exact)


def test_an_outage_by_step_that_opens_as_a_collective_ends_starts_then_not_a_rounding_earlier():
    # a rank released by a collective's end reaches a "down" event's step at that very tick; its start went
    # through seconds and back and could land a tick before the clock: simpy's "Negative delay" (mobile-edge)
    from exonet.estimate import estimate, simulate_estimate

    est = estimate("ddp", params=1e6, num_nodes=4, max_steps=25, step_time=0.01)
    sim = simulate_estimate(est, "mobile-edge")
    down = [p.down_s for p in sim.per_node]
    assert sum(d > 0 for d in down) == 1 and sim.wall_clock_s > 0  # the preset's share 0.1: one of four ranks
