"""`network.backend`: NCCL's pipelined ring and tree, its tuner, gloo's segmented ring, Linux TCP windows and
slow start after idle, and the predicted range; each against its closed form (exonet/netsim/README.md)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest

from exonet import Scenario, ScenarioError, Trace, compare, simulate
from exonet.netsim import gloo, nccl, tcp
from exonet.netsim.engine import Simulation
from exonet.netsim.spread import recovery_quantiles
from exonet.scenario.resolved import LINUX_WINDOW

MIB = 1024 * 1024
GBIT = 1e9 / 8


def scenario(**network: Any) -> Scenario:
    return Scenario.from_dict({"name": "t", "network": {"bandwidth": "1 Gbit/s", **network}})


def one(op: str, nbytes: int, n: int, *, repeats: int = 1, gap: float = 0.0) -> Trace:
    t = Trace(num_nodes=n)
    for r in range(n):
        for _ in range(repeats):
            t.add_collective(r, op, nbytes)
            if gap:
                t.add_compute(r, gap)
    return t


def nccl_ring(latency: str = "5 ms") -> Scenario:
    return scenario(latency=latency, backend="nccl", slow_start_after_idle=False,
                    nccl={"algorithm": "ring", "protocol": "simple"})


def test_nccl_ring_all_reduce_is_its_loops_of_pipelined_slices() -> None:
    n, S, alpha = 4, 64 * MIB, 5e-3
    b = GBIT / 2  # two channels share the NIC
    tau = 2 * MIB / b  # a 2 MiB chunk per step; four loops of 4 × 2 MiB per channel
    a = alpha + 14e-6  # NCCL's per-hop overhead over the network (Simple)
    loop = 5 * max(tau, tau / 2 + a) + tau + a
    expected = 8.4e-6 + 4 * loop
    assert simulate(one("all_reduce", S, n), nccl_ring()).wall_clock_s == pytest.approx(expected, rel=1e-9)


def test_nccl_ring_hides_latency_that_the_phase_model_pays_per_step() -> None:
    n, S = 8, 256 * MIB
    pipelined = simulate(one("all_reduce", S, n), nccl_ring(latency="1 ms")).wall_clock_s
    phases = simulate(one("all_reduce", S, n), scenario(latency="1 ms")).wall_clock_s
    bandwidth = 2 * (n - 1) / n * S / GBIT
    assert phases == pytest.approx(2 * (n - 1) * 1e-3 + bandwidth, rel=1e-9)
    # every step's chunk (2 MiB at 62.5 MB/s on each of two channels: 33.6 ms) covers a slice plus the hop's
    # latency, so only the loops' ends pay latency: 128 MiB per channel is 8 loops of 8 × 2 MiB
    assert pipelined == pytest.approx(8.4e-6 + bandwidth + 8 * (1e-3 + 14e-6), rel=1e-9)
    assert pipelined < phases


def test_nccl_all_gather_and_reduce_scatter_loops_have_n_minus_one_steps() -> None:
    n, s, alpha = 4, 8 * MIB, 5e-3
    b, a = GBIT / 2, alpha + 14e-6
    for op in ("all_gather", "reduce_scatter"):
        total = s * n if op == "all_gather" else s
        c = min(n * 2 * MIB, total / 2) / n
        loops = math.ceil(total / 2 / (n * 2 * MIB))
        tau = c / b
        expected = 8.4e-6 + loops * (2 * max(tau, tau / 2 + a) + tau + a)
        assert simulate(one(op, s, n), nccl_ring()).wall_clock_s == pytest.approx(expected, rel=1e-9), op


def test_nccl_tree_of_two_is_its_fill_plus_the_buffer_once() -> None:
    S, alpha = 8 * MIB, 5e-3
    sc = scenario(latency="5 ms", backend="nccl", slow_start_after_idle=False,
                  nccl={"algorithm": "tree", "protocol": "simple"})
    a = alpha + 14e-6
    x = 512 * 1024 / (GBIT / 2)  # a 512 KiB chunk on one of two channels
    expected = 8.4e-6 + 2 * a + x + S / GBIT  # D = 1: up and down; each NIC carries S/2 of each tree
    assert simulate(one("all_reduce", S, 2), sc).wall_clock_s == pytest.approx(expected, rel=1e-9)


def test_nccl_tuner_constants_and_choice() -> None:
    rate = 10e9 / 8  # a 10 Gbit/s NIC
    ring_ll = 6.6 + 14 * 5.0 + 4096 / (1000 * min(20.4, 0.625) * 8 / 14)
    tree_ll = 6.8 + 2 * 3 * 5.0 + 4096 / (1000 * (1.25 / 3.8) * 0.5 * 0.7)  # correction at log2(4096/64) = 6
    assert nccl.tuner_time("all_reduce", "ring", "ll", 4096, 8, 2, rate) == pytest.approx(ring_ll)
    assert nccl.tuner_time("all_reduce", "tree", "ll", 4096, 8, 2, rate) == pytest.approx(tree_ll)
    spec = Scenario.from_dict({"name": "t", "network": {"bandwidth": "10 Gbit/s", "backend": "nccl"}}).resolve(8).nccl
    assert spec is not None
    assert nccl.choose("all_reduce", 4096, 8, spec, rate) == ("tree", "ll")  # small: latency decides
    assert nccl.choose("all_gather", 4096, 8, spec, rate) == ("ring", "ll")  # the tree only all-reduces
    assert nccl.choose("all_reduce", 256 * MIB, 8, spec, rate) == ("ring", "simple")  # large: bandwidth decides
    assert nccl.channels_used(40_000, 8, "simple", 2) == 1 and nccl.channels_used(70_000, 8, "simple", 2) == 2


def test_nccl_ll_sends_its_flags() -> None:
    sc = scenario(latency="1 ms", backend="nccl", slow_start_after_idle=False,
                  nccl={"algorithm": "ring", "protocol": "ll"})
    result = simulate(one("all_reduce", 64 * 1024, 4), sc)
    assert result.wire_bytes == [2 * 2 * 3 / 4 * 64 * 1024] * 4  # twice the ring's 2(n−1)/n·S


def test_nccl_sockets_follow_the_nic() -> None:
    def streams(**spec: Any) -> int:
        return scenario(backend="nccl", nccl=spec).resolve(2).streams

    assert streams() == 2  # two channels, the data on each connection's one socket
    assert streams(nic="aws") == 2 * 16 and streams(nic="gcp") == 2 * 4
    assert streams(nic="aws", socket_threads=16) == 2 * 64  # at most 64 per connection
    assert scenario(backend="nccl", streams=3).resolve(2).streams == 3


def test_gloo_segmented_ring_with_two_segments_in_flight() -> None:
    n, S, alpha = 4, 16 * MIB, 5e-3
    x = MIB / GBIT  # 16 segments of 1 MiB, 4 per rank
    expected = 2 * alpha + 2 * 3 * 4 * max(x, alpha + x / 2)
    sc = scenario(latency="5 ms", backend="gloo", slow_start_after_idle=False)
    assert simulate(one("all_reduce", S, n), sc).wall_clock_s == pytest.approx(expected, rel=1e-9)
    assert gloo.segments(100, 4) == 8 and gloo.segments(9 * MIB, 4) == 12


def test_gloo_of_two_queues_its_ready_notices_behind_its_data() -> None:
    """At n = 2 the notice to the one peer waits behind the segment being sent: x + α per segment, no fill term."""
    S, alpha = 16 * MIB, 25e-3
    x = MIB / GBIT  # 16 segments of 1 MiB, 8 per rank
    sc = scenario(latency="25 ms", backend="gloo", slow_start_after_idle=False, tcp_window="64 MiB")
    assert simulate(one("all_reduce", S, 2), sc).wall_clock_s == pytest.approx(2 * 8 * (x + alpha), rel=1e-9)
    s = 4 * MIB
    assert simulate(one("all_gather", s, 2), sc).wall_clock_s == pytest.approx(2 * (s / 2 / GBIT + alpha), rel=1e-9)


def test_gloo_all_gather_in_halves() -> None:
    s, alpha = 4 * MIB, 2e-3
    x = s / 2 / GBIT
    sc = scenario(latency="2 ms", backend="gloo", slow_start_after_idle=False)
    expected = alpha + 2 * 2 * max(x, alpha + x / 2)
    assert simulate(one("all_gather", s, 3), sc).wall_clock_s == pytest.approx(expected, rel=1e-9)


def test_a_backend_gives_linux_its_window() -> None:
    alpha = 37e-3
    sc = scenario(latency="37 ms", backend="gloo", slow_start_after_idle=False)
    # a bulk sender keeps 70% of tcp_wmem max (4 MiB) in flight; the receiver advertises half of tcp_rmem max (6 MiB)
    assert sc.resolve(2).tcp_window == LINUX_WINDOW == min(0.7 * 4 * MIB, 6 * MIB / 2)
    rate = LINUX_WINDOW / (2 * alpha)  # one stream, window-limited below the gigabit
    expected = gloo.all_reduce_time(64 * MIB, 2, rate, alpha)
    assert simulate(one("all_reduce", 64 * MIB, 2), sc).wall_clock_s == pytest.approx(expected, rel=1e-9)
    assert scenario(latency="37 ms").resolve(2).tcp_window is None  # no backend: the ideal model, uncapped


def test_slow_start_delay_closed_form() -> None:
    iw, rate, rtt = 14480.0, 125e6, 0.02
    # windows 14480·2^i stay below rate·rtt = 2.5 MB for i ≤ 7, and 8 MB outlasts those 8 rounds
    assert tcp.slow_start_delay(8e6, rate, rtt, iw) == pytest.approx(8 * rtt - iw * 255 / rate, rel=1e-12)
    # 30 kB ends in round 1 (14480 + 28960 bytes): only round 0 waits
    assert tcp.slow_start_delay(30e3, rate, rtt, iw) == pytest.approx(rtt - iw / rate, rel=1e-12)
    assert tcp.slow_start_delay(8e6, rate, rtt, 2.5e6) == 0.0  # already at the full window
    assert tcp.halvings(0.1, 0.22) == 0 and tcp.halvings(0.5, 0.22) == 2 and tcp.halvings(1e6, 0.22) == tcp.NEW


def _cold_message_by_message(phases: list, rates: list, rtts: list, streams: int, halved: int, initial: float) -> list:
    """``tcp.cold_phases`` by its definition: every message of every phase, each pair's bytes added in order."""
    sent: dict[tuple[int, int], float] = {}
    out = []
    for phase, rate, rtt in zip(phases, rates, rtts):
        messages = []
        for m, r, R in zip(phase, rate.tolist(), rtt):
            before = sent.get((m[0], m[1]), 0.0)
            sent[(m[0], m[1])] = after = before + m[2]
            per = r / streams
            start = max(initial, tcp.had_window(per * R) / 2.0**halved)
            late = (tcp.slow_start_delay(after / streams, per, R, start)
                    - tcp.slow_start_delay(before / streams, per, R, start))
            shift = (m[3] if len(m) > 3 else 0.0) + late
            messages.append((m[0], m[1], m[2], shift) if shift else m)
        out.append(tuple(messages))
    return out


@pytest.mark.parametrize("halved", [1, 3, tcp.NEW])
def test_a_repeated_phase_past_slow_start_is_itself_and_the_ramp_is_the_message_by_message_one(halved) -> None:
    """A ring repeats one phase object; once every message of it is past its pair's slow start, the rest of the
    run is that object, and the pairs' bytes wait to be added until a later phase reads them. Every shift is the
    message-by-message one exactly: pairs that ramp at different speeds, a pair twice in a phase, another phase
    on the same pairs in between, and the ring again."""
    np = pytest.importorskip("numpy")
    ring = ((0, 1, 1e5, 1e-3), (1, 2, 2e5, 1e-3), (2, 3, 1e5, 0.0), (3, 0, 2e5, 1e-3), (0, 1, 3e4, 1e-3))
    rates, rtts = np.array([1e8, 5e8, 1e9, 2e7, 1e8]), [1e-3, 2e-3, 1e-3, 0.01, 1e-3]  # ramps of 1 to 10 repeats
    other = ((0, 1, 5e7), (2, 3, 5e6, 2e-3))  # large enough to cross rounds, so their late depends on before
    other_rates, other_rtts = np.array([3e8, 1e8]), [0.3, 0.2]
    phases = [ring] * 40 + [other] * 3 + [ring] * 5
    rate_list = [rates] * 40 + [other_rates] * 3 + [rates] * 5
    rtt_list = [rtts] * 40 + [other_rtts] * 3 + [rtts] * 5
    got = tcp.cold_phases(phases, rate_list, rtt_list, 2, halved, tcp.initial_window(None))
    assert got == _cold_message_by_message(phases, rate_list, rtt_list, 2, halved, tcp.initial_window(None))
    assert got[39] is ring  # itself by the end of the run
    assert (got[0] != ring) == (halved > 1)  # late at first, unless halving once left the window above rate × RTT
    assert any(a != b for a, b in zip(got[40:43], phases[40:43])) == (halved > 1)  # the other phase ramps on


def test_the_bytes_of_a_run_past_slow_start_count_for_the_phase_after_it() -> None:
    """31 repeats of one message of an initial window per stream (a short ramp, soon past), then one byte per
    stream on the same pair at a long ramp: the pair has sent exactly 31 windows = 14480·(2⁵ − 1), the end of
    round 4, so that byte starts round 5 and waits out round 4. One repeat fewer and it would not wait."""
    np = pytest.importorskip("numpy")
    iw = tcp.initial_window(None)
    ring, probe = ((0, 1, 2 * iw),), ((0, 1, 2.0),)
    short, long = (np.array([2 * 20_000.0]), [1.0]), (np.array([2e9]), [1.0])  # rate × RTT per stream: 20 kB, 1 GB

    def cold(repeats: int) -> list:
        phases = [ring] * repeats + [probe]
        return tcp.cold_phases(phases, [short[0]] * repeats + [long[0]], [short[1]] * repeats + [long[1]], 2,
                               tcp.NEW, iw)

    got = cold(31)
    assert got[-2] is ring  # the run was skipped ...
    assert got[-1][0][3] == pytest.approx(1.0 - 16 * iw / 1e9, rel=1e-12)  # ... and its bytes still counted
    assert len(cold(30)[-1][0]) == 3  # one window less: the byte ends inside round 4, on time


def test_slow_start_after_idle_in_a_replay() -> None:
    S, alpha = 8_000_000, 10e-3
    sc = scenario(latency="10 ms", backend="gloo", algorithms={"all_reduce": "star"})
    rtt, iw = 2 * alpha, tcp.initial_window(None)
    ramp = tcp.slow_start_delay(S, GBIT, rtt, iw)
    star = 2 * alpha + 2 * S / GBIT
    t = Trace(num_nodes=2)
    for r in range(2):
        t.add_collective(r, "all_reduce", S)  # new connections: slow start
        t.add_collective(r, "all_reduce", S)  # right after: warm
        t.add_compute(r, 10.0)
        t.add_collective(r, "all_reduce", S)  # idle 10 s > RTO = 0.22 s: slow start again
    result = simulate(t, sc)
    ends = [span.end_s for span in result.collectives]
    assert ends[0] == pytest.approx(star + 2 * ramp, rel=1e-9)  # each phase's one message ramps
    assert ends[1] - ends[0] == pytest.approx(star, rel=1e-9)
    assert ends[2] - ends[1] - 10.0 == pytest.approx(star + 2 * ramp, rel=1e-9)
    off = simulate(t, sc.replace(slow_start_after_idle=False))
    assert off.wall_clock_s == pytest.approx(3 * star + 10.0, rel=1e-9)


def test_an_idle_connection_restarts_from_the_window_it_had() -> None:
    """Idle 0.5 s > two RTOs (0.22 s): the window it had, twice its rate × RTT in flight, halves twice, to the
    path's BDP / 2, so the ramp costs one round of half an RTT on each phase's message."""
    S, alpha = 8_000_000, 10e-3
    sc = scenario(latency="10 ms", backend="gloo", algorithms={"all_reduce": "star"})
    rtt = 2 * alpha
    assert tcp.halvings(0.5, tcp.rto(rtt)) == 2 and tcp.had_window(GBIT * rtt) == 2 * GBIT * rtt
    ramp = tcp.slow_start_delay(S, GBIT, rtt, tcp.had_window(GBIT * rtt) / 4)
    assert ramp == pytest.approx(rtt / 2, rel=1e-12)
    t = Trace(num_nodes=2)
    for r in range(2):
        t.add_collective(r, "all_reduce", S)
        t.add_compute(r, 0.5)
        t.add_collective(r, "all_reduce", S)
    ends = [span.end_s for span in simulate(t, sc).collectives]
    assert ends[1] - ends[0] - 0.5 == pytest.approx(2 * alpha + 2 * S / GBIT + 2 * ramp, rel=1e-9)


def test_the_range_is_zero_width_where_nothing_is_stochastic() -> None:
    result = simulate(one("all_reduce", 12_000_000, 4, repeats=3), scenario(latency="1 ms"))
    assert result.wall_clock_range == (result.wall_clock_s, result.wall_clock_s)
    assert "range" not in result.summary()


def test_the_range_spans_the_recovery_costs_p10_and_p90_where_queues_overflow() -> None:
    sc = scenario(bandwidth="100 Mbit/s", latency="1 ms", queue="5 ms", streams=16, tcp_window="4 MiB")
    trace = one("all_reduce", 12_000_000, 4, repeats=4)
    result = simulate(trace, sc)
    low, high = result.wall_clock_range
    assert low < result.wall_clock_s < high
    resolved = sc.resolve(4)
    for q, bound in zip(recovery_quantiles(), (low, high)):
        sim = Simulation(dataclasses.replace(resolved, recovery=q))
        sim.feed_trace(trace)
        assert sim.result().wall_clock_s == pytest.approx(bound, rel=1e-12)
    assert "wall-clock range (p10-p90)" in result.summary()


@pytest.mark.parametrize("network, words", [
    ({"backend": "ncl"}, ["network.backend", "did you mean 'nccl'"]),
    ({"nccl": {"channels": 2}}, ["network.nccl", 'backend = "nccl"']),
    ({"backend": "nccl", "nccl": {"chanels": 2}}, ["network.nccl.chanels", "did you mean 'channels'"]),
    ({"backend": "nccl", "nccl": {"protocol": "simpel"}}, ["network.nccl.protocol", "did you mean 'simple'"]),
    ({"backend": "gloo", "tcp_window": "-4 MiB"}, ["network.tcp_window"]),
    ({"backend": "gloo", "slow_start_after_idle": "yes"}, ["network.slow_start_after_idle", "true or false"]),
    ({"collective": "gloo"}, ["network.collective", 'backend = "gloo"']),
])
def test_bad_backend_keys_are_named(network: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ScenarioError) as err:
        scenario(**network)
    for word in words:
        assert word in str(err.value)


def test_the_readme_table_is_what_the_example_prints() -> None:
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("backends_example", root / "examples" / "backends.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    readme = (root / "exonet" / "netsim" / "README.md").read_text()
    for row in example.rows():
        assert row in readme


def test_compare_shows_the_range_only_where_it_has_width() -> None:
    trace = one("all_reduce", 12_000_000, 4, repeats=2)
    lossy = scenario(bandwidth="100 Mbit/s", latency="1 ms", queue="5 ms", streams=16, tcp_window="4 MiB")
    with pytest.warns(UserWarning, match="overflow the shaped queue"):  # compare repeats the caution
        table = compare({"ring": trace}, [lossy, scenario(latency="1 ms")])
    low, high = table.rows[0]["wall_clock_range"]
    assert low < table.rows[0]["wall_clock_s"] < high
    assert table.rows[1]["wall_clock_range"] == (table.rows[1]["wall_clock_s"],) * 2
    assert "| p10-p90 |" in table.to_markdown()
    calm = compare({"ring": trace}, [scenario(latency="1 ms")]).to_markdown()
    assert "| p10-p90 |" not in calm and "| real run p10-p90 |" in calm  # nothing random, but the model's own error


@pytest.mark.parametrize("body, where", [
    ('[network]\nbandwidth = "1 Gbit/s"\nlatency = "10 ms"\nbackend = "ncl"\n', ":5: network.backend: "),
    ('[network]\nbandwidth = "1 Gbit/s"\nbackend = "nccl"\nnccl = { chanels = 2 }\n', ":5: network.nccl.chanels: "),
    ('[network]\nbandwidth = "1 Gbit/s"\n[network.nccl]\nnic = "aws"\n', ":4: network.nccl: "),
    ('[network]\nbandwidth = "1 Gbit/s"\n[[links]]\nbetween = ["a", "b"]\nbandwidth = "1 Gbit/s"\n'
     '[[links]]\nbetween = ["a", "c"]\nbandwidth = "fast"\n', ":9: links[1].bandwidth: "),
])
def test_a_files_bad_key_is_named_with_its_line(tmp_path: Path, body: str, where: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n' + body)
    with pytest.raises(ScenarioError) as err:
        Scenario.load(path)
    assert f"{path}{where}" in str(err.value)


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_fast_and_event_paths_agree_under_a_backend(backend: str) -> None:
    """Shifted messages time the same whether a collective rests on the fast path or runs flow by flow."""
    t = Trace(num_nodes=4)
    for r in range(4):
        for step in range(3):
            t.add_compute(r, 0.01 * (r + 1))
            world = t.add_collective(r, "all_reduce", 6 * MIB, async_op=True)
            t.add_collective(r, "all_gather", MIB, group=(0, 1) if r < 2 else (2, 3))
            t.add_wait(r, world)
            t.add_step(r)
    sc = scenario(latency="2 ms", backend=backend)
    fast, slow = simulate(t, sc), simulate(t, sc, fast_path=False)
    assert fast.wall_clock_s == pytest.approx(slow.wall_clock_s, rel=1e-9)
    assert fast.step_end_times == pytest.approx(slow.step_end_times, rel=1e-9)



def test_a_ring_across_regions_waits_on_its_mean_hop_and_ends_on_its_slowest() -> None:
    """Two regions of two: the ring's hops are 0.1 ms, 20 ms, 0.1 ms, 20 ms (region-ordered)."""
    sc = Scenario.from_dict({
        "name": "t", "network": {"bandwidth": "1 Gbit/s", "latency": "100 us", "backend": "nccl",
                                 "slow_start_after_idle": False, "tcp_window": "64 MiB",
                                 "nccl": {"algorithm": "ring", "protocol": "simple"}},
        "regions": [{"name": "a", "share": 0.5}, {"name": "b", "share": 0.5}],
        "links": [{"between": ["a", "b"], "bandwidth": "10 Gbit/s", "latency": "20 ms"}]})
    S, n = 8 * MIB, 4
    mean, slowest = (0.1e-3 + 20e-3) / 2 + 14e-6, 20e-3 + 14e-6
    expected = 8.4e-6 + nccl.ring_time("all_reduce", S, n, 2, GBIT, mean, last=slowest)
    tau = S / 2 / n / (GBIT / 2)  # one loop: a 1 MiB chunk per channel step
    assert expected == pytest.approx(8.4e-6 + 5 * max(tau, tau / 2 + mean) + tau + slowest, rel=1e-12)
    assert simulate(one("all_reduce", S, n), sc).wall_clock_s == pytest.approx(expected, rel=1e-9)


def test_nccl_over_verbs_has_no_tcp() -> None:
    r = scenario(latency="2 us", backend="nccl", nccl={"transport": "ib"}).resolve(4)
    assert (r.tcp_window, r.streams, r.slow_start) == (None, 1, False)
    assert r.algorithms["all_reduce"] == "nccl"
    assert Scenario.load("datacenter").resolve(2).nccl.transport == "ib"  # type: ignore[union-attr]
    assert Scenario.load("cross-region").resolve(2).streams == 32
