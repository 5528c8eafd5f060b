"""Two network rules that must not pass silently: the TCP window at zero latency, and
what strict no-overtaking FIFO does to the closed forms (the figures the README states)."""

from __future__ import annotations

import pytest

from exonet import Scenario, ScenarioError, Trace
from exonet.netsim import simulate
from exonet.scenario import Resolved

B = 1.0e6  # bytes/s
A = 1.0e-3  # one-way latency, s
S = 1_000_000
exact = {"rel": 1e-9, "abs": 1e-12}


def resolved(n: int, sharing: str = "max-min", latency: float = A, **options) -> Resolved:
    return Resolved(num_nodes=n, uplink=(B,) * n, downlink=(B,) * n, region=options.pop("region", ("default",) * n),
                    latency=latency, links=options.pop("links", {}), speed=(1.0,) * n, sharing=sharing, **options)


def one(scenario: Resolved, op: str, nbytes: int) -> float:
    t = Trace(scenario.num_nodes)
    for r in range(scenario.num_nodes):
        t.add_collective(r, op, nbytes)
        t.add_step(r)
    return simulate(t, scenario).wall_clock_s


# ------------------------------------------------------------------ tcp_window at latency 0
def test_a_window_with_every_latency_zero_is_an_error_naming_the_file_and_field():
    with pytest.raises(ScenarioError, match=r"lan\.toml:4: network\.tcp_window: has no effect.*every latency is 0"):
        Scenario.from_toml('name = "lan"\n[network]\nbandwidth = "1 Gbit/s"\ntcp_window = "4 MiB"\n', "lan.toml")
    with pytest.raises(ScenarioError, match="network.tcp_window"):
        Scenario.load("home-broadband").replace(latency="0 s")


@pytest.mark.parametrize(("pair", "crosses"), [((0, 1), False), ((0, 2), True)])
def test_a_window_binds_only_on_paths_with_latency(pair, crosses):
    """Documented rule: latency 0 inside a region, 40 ms across; the window caps only the crossing flow."""
    doc = {"name": "w", "network": {"bandwidth": "8 Mbit/s", "tcp_window": "10 kB"},
           "regions": [{"name": "a", "ranks": [0, 1]}, {"name": "b", "ranks": [2]}],
           "links": [{"between": ["a", "b"], "bandwidth": "8 Mbit/s", "latency": "40 ms"}]}
    scenario = Scenario.from_dict(doc)                       # valid: one path has a round trip
    cap = 10_000 / (2 * 0.040)                              # 125 kB/s < B
    t = Trace(3)
    for r in pair:
        t.add_collective(r, "broadcast", S, group=pair)
    assert simulate(t, scenario).wall_clock_s == pytest.approx(0.040 + S / cap if crosses else S / B, **exact)


# ------------------------------------------------------------------ FIFO against the closed forms
@pytest.mark.parametrize("n", [3, 4, 8, 16])
def test_fifo_makes_an_all_pairs_phase_take_2n_minus_3_messages(n):
    """Direct all_gather: α + (n−1)s/B under max-min, α + (2n−3)s/B under FIFO (1.5× at 3, 1.93× at 16)."""
    algos = {"all_gather": "direct"}
    fair = one(resolved(n, algorithms=algos), "all_gather", S)
    fifo = one(resolved(n, "fifo", algorithms=algos), "all_gather", S)
    assert fair == pytest.approx(A + (n - 1) * S / B, **exact)
    assert fifo == pytest.approx(A + (2 * n - 3) * S / B, **exact)


@pytest.mark.parametrize("n", [3, 4, 8, 16])
@pytest.mark.parametrize(("op", "chunks"), [("reduce_scatter", 1), ("all_to_all", 1), ("all_reduce", 2)])
def test_fifo_makes_every_direct_all_pairs_phase_take_2n_minus_3_chunk_messages(n, op, chunks):
    t = one(resolved(n, "fifo", algorithms={op: "direct"}), op, S)
    assert t == pytest.approx(chunks * (A + (2 * n - 3) / n * S / B), **exact)


@pytest.mark.parametrize("n", [3, 4, 8, 16])
def test_fifo_slows_direct_broadcast_and_tree(n):
    fifo = resolved(n, "fifo", algorithms={"broadcast": "direct"})
    assert one(fifo, "broadcast", S) == pytest.approx(2 * A + (3 * n - 4) / n * S / B, **exact)
    if n == 4:
        tree = resolved(n, "fifo", algorithms={"all_reduce": "tree"})
        assert one(tree, "all_reduce", S) == pytest.approx(4 * A + 4 * S / B, **exact)  # max-min: 4α + 3S/B


@pytest.mark.parametrize("n", [3, 4, 8, 16])
@pytest.mark.parametrize(("op", "algo"), [("all_reduce", "ring"), ("all_reduce", "star"), ("broadcast", "binomial"),
                                          ("broadcast", "chain"), ("all_gather", "ring"),
                                          ("all_reduce", "halving_doubling")])
def test_fifo_does_not_slow_one_message_per_link_algorithms(n, op, algo):
    algos = {op: algo}
    assert one(resolved(n, "fifo", algorithms=algos), op, S) == pytest.approx(
        one(resolved(n, algorithms=algos), op, S), **exact)
