"""Scenario: presets, resolution to SI units, share semantics, replace, round trip, and every bad input."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exonet import Scenario, ScenarioError
from exonet.scenario import ALGORITHMS, FAMILIES, Resolved, list_presets
from exonet.scenario.resolved import LINUX_WINDOW
from exonet.scenario.scenario import NIC_KEYS
from exonet.trace import OPS

PRESETS = ["datacenter", "cross-region", "cross-continent", "home-broadband", "mobile-edge", "hetero-cluster"]


def minimal(**network: Any) -> dict[str, Any]:
    return {"name": "t", "network": {"bandwidth": "1 Gbit/s", **network}}


def two_regions(first: dict[str, Any], second: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        **minimal(latency="1 ms"),
        "regions": [{"name": "a", **first}, {"name": "b", **second}],
        "links": [{"between": ["a", "b"], "bandwidth": "10 Gbit/s", "latency": "40 ms"}],
        **extra,
    }


# ---------------------------------------------------------------- presets
def test_the_six_presets_ship() -> None:
    assert set(PRESETS) <= set(list_presets())


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("num_nodes", [1, 2, 3, 8, 64])
def test_every_preset_resolves_for_any_node_count(name: str, num_nodes: int) -> None:
    scenario = Scenario.load(name)
    assert scenario.name == name and scenario.description
    r = scenario.resolve(num_nodes)
    assert isinstance(r, Resolved) and r.num_nodes == num_nodes
    for per_rank in (r.uplink, r.downlink, r.region, r.speed):
        assert len(per_rank) == num_nodes
    assert all(x > 0 for x in (*r.uplink, *r.downlink, *r.speed))
    assert set(r.algorithms) == set(OPS)
    assert all(r.algorithms[op] in ALGORITHMS[op] for op in OPS)
    for event in r.events:
        assert event.ranks and all(0 <= rank < num_nodes for rank in event.ranks)
    for a in range(num_nodes):
        for b in range(num_nodes):
            assert r.path_latency(a, b) >= 0


@pytest.mark.parametrize("name", PRESETS)
def test_presets_describe_themselves(name: str) -> None:
    text = Scenario.load(name).describe(num_nodes=8)
    assert text.startswith(name) and "resolved for 8 nodes" in text and "ranks 0" in text


def test_preset_numbers() -> None:
    dc = Scenario.load("datacenter").resolve(4)
    assert dc.uplink == (0.9 * 400e9 / 8,) * 4 and dc.latency == 2e-6
    cr = Scenario.load("cross-region").resolve(4)
    assert cr.region == ("us-east", "us-east", "eu-west", "eu-west")
    assert cr.links[("eu-west", "us-east")].latency == 0.037
    assert cr.path_latency(0, 3) == 0.037 and cr.path_latency(0, 1) == 50e-6
    home = Scenario.load("home-broadband").resolve(4)
    assert home.uplink[0] < home.downlink[0] and home.speed == (1.0, 1.0, 0.43, 0.15)
    assert home.jitter == "lognormal"
    edge = Scenario.load("mobile-edge").resolve(10)
    assert {e.kind for e in edge.events} == {"slow", "down"}
    assert Scenario.load("hetero-cluster").resolve(8).speed == (1, 1, 1, 1, 0.315, 0.315, 0.126, 0.066)


def test_unknown_preset_lists_presets_and_suggests_the_nearest() -> None:
    with pytest.raises(ScenarioError) as info:
        Scenario.load("home-broadbnd")
    assert "did you mean 'home-broadband'" in str(info.value)
    assert all(name in str(info.value) for name in PRESETS)


# ---------------------------------------------------------------- loading and coercion
def test_load_file_coerce_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "two.toml"
    path.write_text('name = "two"\n[network]\nbandwidth = "1 Gbit/s"\nlatency = "10 ms"\n')
    by_path = Scenario.load(path)
    assert by_path.source == str(path)
    assert Scenario.load(str(path)) == by_path
    assert Scenario.coerce(path) == by_path == Scenario.coerce(str(path))
    assert Scenario.coerce(by_path) is by_path
    assert Scenario.coerce({"name": "two", "network": {"bandwidth": "1 Gbit/s", "latency": "10 ms"}}) == by_path
    assert Scenario.coerce("datacenter").name == "datacenter"
    with pytest.raises(TypeError, match="scenario"):
        Scenario.coerce(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", PRESETS)
def test_to_dict_round_trips(name: str) -> None:
    scenario = Scenario.load(name)
    again = Scenario.from_dict(scenario.to_dict())
    assert again == scenario and hash(again) == hash(scenario)
    assert again.resolve(8) == scenario.resolve(8)


def test_to_dict_is_a_copy() -> None:
    scenario = Scenario.from_dict(minimal())
    scenario.to_dict()["network"]["bandwidth"] = "1 bit/s"
    assert scenario.resolve(1).uplink == (125e6,)


def test_missing_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="nope.toml: no such scenario file"):
        Scenario.load(tmp_path / "nope.toml")


# ---------------------------------------------------------------- resolution
def test_defaults_are_ideal() -> None:
    r = Scenario.from_dict(minimal()).resolve(3)
    assert r.uplink == r.downlink == (125e6,) * 3
    assert r.latency == 0.0 and r.tcp_window is None and r.sharing == "max-min"
    assert r.speed == (1.0,) * 3 and r.region == ("default",) * 3 and r.links == {}
    assert r.jitter == "none" and r.sigma == 0.0 and r.compute_mode == "measured" and r.mfu == 1.0
    assert r.algorithms == FAMILIES["ring"] and r.events == ()


def test_uplink_downlink_overrides_and_efficiency_everywhere() -> None:
    d = two_regions({"share": 0.5}, {"share": 0.5})
    d["network"].update(uplink="20 Mbit/s", efficiency=0.5, tcp_window="4 MiB")
    d["nodes"] = [{"share": 0.5, "bandwidth": "100 Mbit/s"}, {"ranks": [3], "downlink": "8 Mbit/s", "speed": 0.5}]
    r = Scenario.from_dict(d).resolve(4)
    assert r.uplink == (1.25e6, 1.25e6, 6.25e6, 6.25e6)
    assert r.downlink == (62.5e6, 62.5e6, 6.25e6, 0.5e6)
    assert r.speed == (1.0, 1.0, 1.0, 0.5)
    assert r.links[("a", "b")].bandwidth == 0.5 * 1.25e9 and r.tcp_window == 4 * 2**20


def test_uplink_and_downlink_without_bandwidth() -> None:
    r = Scenario.from_dict({"name": "t", "network": {"uplink": "8 Mbit/s", "downlink": "80 Mbit/s"}}).resolve(2)
    assert r.uplink == (1e6, 1e6) and r.downlink == (10e6, 10e6)


def test_link_latency_defaults_to_network_latency() -> None:
    d = two_regions({"share": 0.5}, {"share": 0.5})
    del d["links"][0]["latency"]
    r = Scenario.from_dict(d).resolve(2)
    assert r.links[("a", "b")].latency == 1e-3 == r.path_latency(0, 1)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_collective_family_and_per_op_override(family: str) -> None:
    backend = {"backend": family} if family in ("nccl", "gloo") else {}  # a library's algorithms need that library
    r = Scenario.from_dict(minimal(collective=family, **backend)).resolve(4)
    assert r.algorithms == FAMILIES[family]
    over = Scenario.from_dict(minimal(collective=family, algorithms={"broadcast": "binomial", "all_to_all": "star"},
                                      **backend))
    assert over.resolve(4).algorithms == {**FAMILIES[family], "broadcast": "binomial", "all_to_all": "star"}


def test_family_table() -> None:
    assert FAMILIES["ring"] == dict(zip(OPS, ("ring", "ring", "ring", "chain", "direct", "chain", "direct", "direct",
                                              "dissemination")))
    assert FAMILIES["halving_doubling"]["broadcast"] == "binomial"
    assert FAMILIES["tree"] == dict(zip(OPS, ("tree", "ring", "ring", "binomial", "direct", "binomial", "binomial",
                                              "binomial", "dissemination")))
    assert FAMILIES["gloo"]["barrier"] == "dissemination" and FAMILIES["nccl"]["reduce"] == "nccl"


def test_compute_stragglers_and_events_resolve() -> None:
    d = minimal()
    d["compute"] = {"mode": "flops", "tflops": 312.0, "mfu": 0.4}
    d["stragglers"] = {"jitter": "normal", "sigma": 0.1, "seed": 7}
    d["events"] = [
        {"kind": "slow", "ranks": [1], "from_step": 5, "to_step": 9, "factor": 4.0},
        {"kind": "down", "share": 0.5, "from_s": 1.5, "to_s": "2 min"},
    ]
    r = Scenario.from_dict(d).resolve(4)
    assert (r.compute_mode, r.tflops, r.mfu, r.jitter, r.sigma, r.seed) == ("flops", 312.0, 0.4, "normal", 0.1, 7)
    slow, down = r.events
    assert (slow.kind, slow.ranks, slow.from_step, slow.to_step, slow.factor) == ("slow", (1,), 5, 9, 4.0)
    assert (down.ranks, down.from_s, down.to_s, down.from_step) == ((2, 3), 1.5, 120.0, None)


# ---------------------------------------------------------------- share semantics
@pytest.mark.parametrize(
    ("n", "expected"),
    [(1, "a"), (2, "ab"), (3, "aab"), (4, "aabb"), (5, "aaabb"), (8, "aaaabbbb")],
)
def test_region_shares_are_blocks_in_listing_order(n: int, expected: str) -> None:
    d = two_regions({"share": 0.5}, {"share": 0.5})
    assert "".join(Scenario.from_dict(d).resolve(n).region) == expected


@pytest.mark.parametrize("n", range(1, 65))
def test_region_shares_partition_exactly_for_thirds(n: int) -> None:
    region = Scenario.load("cross-continent").resolve(n).region
    counts = [region.count(name) for name in ("americas", "europe", "asia")]
    assert sum(counts) == n and max(counts) - min(counts) <= 1
    assert list(region) == sorted(region, key=["americas", "europe", "asia"].index)


def test_ranks_left_over_by_shares_are_default_and_need_links() -> None:
    d = {**minimal(), "regions": [{"name": "a", "share": 0.5}]}
    with pytest.raises(ScenarioError, match="'a' and 'default' both hold nodes"):
        Scenario.from_dict(d).resolve(4)
    d["links"] = [{"between": ["default", "a"], "bandwidth": "1 Gbit/s"}]
    assert Scenario.from_dict(d).resolve(4).region == ("a", "a", "default", "default")
    assert Scenario.from_dict(d).resolve(1).region == ("a",)


def test_explicit_and_share_regions_mix() -> None:
    d = two_regions({"share": 0.25}, {"ranks": [3]})
    d["regions"].append({"name": "c", "ranks": [1, 2]})
    d["links"] += [{"between": ["a", "c"], "bandwidth": "1 Gbit/s"}, {"between": ["b", "c"], "bandwidth": "1 Gbit/s"}]
    assert Scenario.from_dict(d).resolve(4).region == ("a", "c", "c", "b")


@pytest.mark.parametrize(
    ("share", "n", "expected"),
    [(0.25, 8, (6, 7)), (0.25, 4, (3,)), (0.25, 1, (0,)), (0.25, 3, (2,)), (0.1, 3, (2,)), (0.5, 3, (1, 2)),
     (1.0, 3, (0, 1, 2))],
)
def test_node_and_event_shares_are_the_last_ranks(share: float, n: int, expected: tuple[int, ...]) -> None:
    d = minimal()
    d["nodes"] = [{"share": share, "speed": 0.5}]
    d["events"] = [{"kind": "down", "share": share, "from_step": 0, "to_step": 1}]
    r = Scenario.from_dict(d).resolve(n)
    assert tuple(i for i, s in enumerate(r.speed) if s == 0.5) == expected
    assert r.events[0].ranks == expected


def test_later_node_entries_override_earlier_ones() -> None:
    d = minimal()
    d["nodes"] = [{"share": 0.5, "speed": 0.5}, {"share": 0.25, "speed": 0.25}, {"ranks": [0], "speed": 2.0}]
    assert Scenario.from_dict(d).resolve(4).speed == (2.0, 1.0, 0.5, 0.25)


# ---------------------------------------------------------------- replace
def test_replace_network_keys_by_name_and_tables_by_dict() -> None:
    base = Scenario.load("cross-region")
    s = base.replace(bandwidth="100 Mbit/s", latency="3 ms", collective="star", backend=None, nccl=None, name="slow")
    r = s.resolve(4)
    assert s.name == "slow" and r.uplink[0] == pytest.approx(0.94 * 12.5e6) and r.latency == 0.003
    assert r.algorithms == FAMILIES["star"]
    assert "replace(bandwidth, latency, collective, backend, nccl, name)" in s.source
    assert base.resolve(4).uplink[0] == pytest.approx(0.94 * 12.5e9)  # the original is untouched
    flops = base.replace(compute={"mode": "flops", "tflops": 989.0})
    assert flops.resolve(2).compute_mode == "flops"
    assert base.replace(network={"efficiency": 0.5}).resolve(2).uplink[0] == 0.5 * 12.5e9
    assert base.replace(tcp_window=None).resolve(2).tcp_window == LINUX_WINDOW  # NCCL on Linux hosts
    assert base.replace(tcp_window=None, backend=None, nccl=None).resolve(2).tcp_window is None
    assert base.replace(regions=None, links=None).resolve(2).region == ("default", "default")


def test_replace_merges_algorithms_op_by_op_as_the_variants_name_says() -> None:
    """Chained ``replace(algorithms=...)`` kept only the last op while the name listed both."""
    s = Scenario.load("datacenter").replace(algorithms={"all_reduce": "star"}).replace(
        algorithms={"broadcast": "binomial"})
    assert s.name == "datacenter (algorithms.all_reduce=star) (algorithms.broadcast=binomial)"
    assert s.resolve(4).algorithms["all_reduce"] == "star" and s.resolve(4).algorithms["broadcast"] == "binomial"
    # without the override, the preset's own: datacenter runs NCCL
    assert s.replace(network={"algorithms": {"all_reduce": None}}).resolve(4).algorithms["all_reduce"] == "nccl"


def test_replace_a_nested_table_that_was_absent() -> None:
    s = Scenario.from_dict(minimal()).replace(stragglers={"jitter": "exponential", "sigma": 0.5})
    assert s.resolve(1).jitter == "exponential"


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"bandwith": "1 Gbit/s"}, "did you mean 'bandwidth'"),
        ({"compute": "flops"}, "expected a dict"),
        ({"compute": {"mod": "flops"}}, "compute.mod: unknown key (did you mean 'mode'?)"),
        ({"bandwidth": 100}, "network.bandwidth"),
        ({"bandwidth": None}, "network.bandwidth is required"),
    ],
)
def test_replace_errors(changes: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ScenarioError) as info:
        Scenario.load("datacenter").replace(**changes)
    assert fragment in str(info.value)


# ---------------------------------------------------------------- bad input matrix
NET = '[network]\nbandwidth = "1 Gbit/s"\n'
BAD_FILES: list[tuple[str, str, list[str]]] = [
    ("unknown-top", 'name = "x"\nnetwrok = 1\n' + NET, [": netwrok: unknown key", "did you mean 'network'"]),
    ("unknown-net", 'name = "x"\n[network]\nbandwith = "1 Gbit/s"\n',
     ["network.bandwith: unknown key", "did you mean 'bandwidth'"]),
    ("unknown-region-key", 'name = "x"\n' + NET + '[[regions]]\nname = "a"\nshar = 0.5\n',
     ["regions[0].shar", "'share'"]),
    ("unknown-algo-op", 'name = "x"\n' + NET + '[network.algorithms]\nallreduce = "ring"\n',
     ["network.algorithms.allreduce", "'all_reduce'"]),
    ("bad-unit", 'name = "x"\n[network]\nbandwidth = "1 Gbit/z"\n',
     ["network.bandwidth", "unknown rate unit", "Gbit/s"]),
    ("bare-number", 'name = "x"\n[network]\nbandwidth = 100\n', ["network.bandwidth", "no unit"]),
    ("bare-latency", 'name = "x"\n' + NET + "latency = 5\n", ["network.latency", "no unit", "30 ms"]),
    ("zero-bw", 'name = "x"\n[network]\nbandwidth = "0 Gbit/s"\n', ["network.bandwidth", "positive"]),
    ("negative-bw", 'name = "x"\n[network]\nbandwidth = "-1 Gbit/s"\n', ["network.bandwidth", "positive"]),
    ("negative-latency", 'name = "x"\n' + NET + 'latency = "-1 ms"\n', ["network.latency", "non-negative"]),
    ("zero-window", 'name = "x"\n' + NET + 'tcp_window = "0 MiB"\n', ["network.tcp_window", "positive"]),
    ("malformed", 'name = "x"\n[network]\nbandwidth = "1 Gbit/s\n', ["malformed TOML", "line 3"]),
    ("malformed-2", 'name = "x"\n\n\n\nnetwork = [\n', ["malformed TOML", "line "]),
    ("bad-sharing", 'name = "x"\n' + NET + 'sharing = "fair"\n', ["network.sharing", "max-min, fifo"]),
    ("bad-collective", 'name = "x"\n' + NET + 'collective = "rign"\n', ["network.collective", "did you mean 'ring'"]),
    ("bad-algo", 'name = "x"\n' + NET + '[network.algorithms]\nbroadcast = "ring"\n',
     ["network.algorithms.broadcast", "chain, binomial"]),
    ("bad-mode", 'name = "x"\n' + NET + '[compute]\nmode = "cpu"\n', ["compute.mode", "measured, wall, flops"]),
    ("flops-no-tflops", 'name = "x"\n' + NET + '[compute]\nmode = "flops"\n', ["compute.tflops is required"]),
    ("tflops-no-mode", 'name = "x"\n' + NET + "[compute]\ntflops = 312.0\n", ["compute.tflops", "mode"]),
    ("mfu-zero", 'name = "x"\n' + NET + '[compute]\nmode = "flops"\ntflops = 1.0\nmfu = 0\n',
     ["compute.mfu", "[1e-06, 1]"]),
    ("mfu-big", 'name = "x"\n' + NET + '[compute]\nmode = "flops"\ntflops = 1.0\nmfu = 1.5\n',
     ["compute.mfu", "[1e-06, 1]"]),
    ("tflops-str", 'name = "x"\n' + NET + '[compute]\nmode = "flops"\ntflops = "989"\n',
     ["compute.tflops", "expected a number"]),
    ("efficiency", 'name = "x"\n' + NET + "efficiency = 1.2\n", ["network.efficiency", "[0.001, 1]"]),
    ("efficiency-nan", 'name = "x"\n' + NET + "efficiency = nan\n", ["network.efficiency", "out of range"]),
    ("bad-jitter", 'name = "x"\n' + NET + '[stragglers]\njitter = "gaussian"\nsigma = 0.1\n',
     ["stragglers.jitter", "lognormal"]),
    ("negative-sigma", 'name = "x"\n' + NET + '[stragglers]\njitter = "normal"\nsigma = -0.1\n',
     ["stragglers.sigma", "[0, 10]"]),
    ("sigma-no-jitter", 'name = "x"\n' + NET + "[stragglers]\nsigma = 0.1\n",
     ["stragglers.sigma needs stragglers.jitter"]),
    ("jitter-no-sigma", 'name = "x"\n' + NET + '[stragglers]\njitter = "normal"\n', ["stragglers.sigma is required"]),
    ("bad-seed", 'name = "x"\n' + NET + '[stragglers]\nseed = -1\n', ["stragglers.seed", "non-negative integer"]),
    ("speed-zero", 'name = "x"\n' + NET + "[[nodes]]\nshare = 0.5\nspeed = 0\n", ["nodes[0].speed", "[1e-06, 1e+06]"]),
    ("speed-negative", 'name = "x"\n' + NET + "[[nodes]]\nranks = [0]\nspeed = -2.0\n", ["nodes[0].speed"]),
    ("node-empty", 'name = "x"\n' + NET + "[[nodes]]\nranks = [0]\n", ["nodes[0]", "sets nothing"]),
    ("node-both", 'name = "x"\n' + NET + "[[nodes]]\nranks = [0]\nshare = 0.5\nspeed = 2.0\n",
     ["nodes[0]", "exactly one of"]),
    ("share-zero", 'name = "x"\n' + NET + "[[nodes]]\nshare = 0\nspeed = 2.0\n", ["nodes[0].share", "(0, 1]"]),
    ("ranks-str", 'name = "x"\n' + NET + '[[nodes]]\nranks = "0"\nspeed = 2.0\n', ["nodes[0].ranks", "list of ranks"]),
    ("ranks-negative", 'name = "x"\n' + NET + "[[nodes]]\nranks = [-1]\nspeed = 2.0\n", ["nodes[0].ranks[0]"]),
    ("ranks-dup", 'name = "x"\n' + NET + "[[nodes]]\nranks = [1, 1]\nspeed = 2.0\n", ["nodes[0].ranks", "twice"]),
    ("no-name", NET, ["missing required key `name`"]),
    ("name-not-str", "name = 3\n" + NET, ["name", "non-empty string"]),
    ("no-network", 'name = "x"\n', ["missing required table [network]"]),
    ("no-bandwidth", 'name = "x"\n[network]\nuplink = "1 Gbit/s"\n', ["network.bandwidth is required"]),
    ("network-not-table", 'name = "x"\nnetwork = "fast"\n', ["network", "expected a table"]),
    ("regions-not-array", 'name = "x"\nregions = "x"\n' + NET, ["regions", "array of tables"]),
    ("region-no-name", 'name = "x"\n' + NET + "[[regions]]\nshare = 0.5\n", ["regions[0]", "`name`"]),
    ("region-dup", 'name = "x"\n' + NET + '[[regions]]\nname = "a"\nshare = 0.5\n'
     '[[regions]]\nname = "a"\nshare = 0.5\n', ["regions[1].name", "twice"]),
    ("region-sum", 'name = "x"\n' + NET + '[[regions]]\nname = "a"\nshare = 0.7\n'
     '[[regions]]\nname = "b"\nshare = 0.7\n', ["regions", "more than 1"]),
    ("link-unknown-region", 'name = "x"\n' + NET + '[[regions]]\nname = "us"\nshare = 1.0\n[[links]]\n'
     'between = ["us", "ue"]\nbandwidth = "1 Gbit/s"\n', ["links[0].between", "'ue'"]),
    ("link-self", 'name = "x"\n' + NET + '[[links]]\nbetween = ["a", "a"]\nbandwidth = "1 Gbit/s"\n',
     ["links[0].between", "two different"]),
    ("link-no-bw", 'name = "x"\n' + NET + '[[regions]]\nname = "a"\nshare = 1.0\n[[links]]\n'
     'between = ["a", "default"]\n', ["links[0]", "`bandwidth`"]),
    ("link-zero-bw", 'name = "x"\n' + NET + '[[regions]]\nname = "a"\nshare = 1.0\n[[links]]\n'
     'between = ["a", "default"]\nbandwidth = "0 bit/s"\n', ["links[0].bandwidth", "positive"]),
    ("bad-event-kind", 'name = "x"\n' + NET + '[[events]]\nkind = "crash"\nranks = [0]\nfrom_step = 1\nto_step = 2\n',
     ["events[0].kind", "slow, down"]),
    ("slow-no-factor", 'name = "x"\n' + NET + '[[events]]\nkind = "slow"\nranks = [0]\nfrom_step = 1\n',
     ["events[0]", "`factor`"]),
    ("down-factor", 'name = "x"\n' + NET + '[[events]]\nkind = "down"\nranks = [0]\nto_step = 2\nfactor = 2.0\n',
     ["events[0].factor"]),
    ("down-forever", 'name = "x"\n' + NET + '[[events]]\nkind = "down"\nranks = [0]\nfrom_step = 2\n',
     ["events[0]", "needs an end"]),
    ("event-backwards", 'name = "x"\n' + NET + '[[events]]\nkind = "down"\nranks = [0]\nfrom_step = 5\nto_step = 5\n',
     ["events[0].to_step", "after from_step"]),
    ("event-mixed", 'name = "x"\n' + NET + '[[events]]\nkind = "down"\nranks = [0]\nfrom_step = 5\nto_s = 5.0\n',
     ["events[0]", "not both"]),
    ("event-no-window", 'name = "x"\n' + NET + '[[events]]\nkind = "slow"\nshare = 0.5\nfactor = 2.0\n',
     ["events[0]", "needs a window"]),
    ("event-bad-seconds", 'name = "x"\n' + NET + '[[events]]\nkind = "down"\nranks = [0]\nto_s = "5 parsecs"\n',
     ["events[0].to_s", "unknown time unit"]),
    ("datetime", "name = 1979-05-27\n" + NET, ["name", "non-empty string"]),
]


@pytest.mark.parametrize(("stem", "text", "fragments"), BAD_FILES, ids=[case[0] for case in BAD_FILES])
def test_bad_files_name_the_file_and_field(tmp_path: Path, stem: str, text: str, fragments: list[str]) -> None:
    path = tmp_path / f"{stem}.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        Scenario.load(path)
    message = str(info.value)
    assert re.match(rf"{re.escape(str(path))}(:\d+)?: ", message), message  # file, or file:line of the key
    for fragment in fragments:
        assert fragment in message, message


RESOLVE_ERRORS: list[tuple[dict[str, Any], int, list[str]]] = [
    ({**minimal(), "nodes": [{"ranks": [5], "speed": 2.0}]}, 4, ["nodes[0].ranks", "rank 5", "0..3"]),
    ({**minimal(), "events": [{"kind": "down", "ranks": [4], "to_step": 3}]}, 4, ["events[0].ranks", "rank 4"]),
    (two_regions({"ranks": [0, 9]}, {"share": 0.5}), 4, ["regions[0].ranks", "rank 9"]),
    (two_regions({"share": 0.5}, {"ranks": [1, 2]}), 4, ["regions[1] ('b') and regions[0] ('a')", "rank 1"]),
    (two_regions({"ranks": [0, 1]}, {"ranks": [1]}), 2, ["both contain rank 1"]),
    ({**two_regions({"share": 0.5}, {"share": 0.5}), "links": []}, 2, ["'a' and 'b'", "[[links]]"]),
]


@pytest.mark.parametrize(("data", "n", "fragments"), RESOLVE_ERRORS)
def test_resolve_errors_name_the_field(data: dict[str, Any], n: int, fragments: list[str]) -> None:
    scenario = Scenario.from_dict(data, source="bad.toml")
    with pytest.raises(ScenarioError) as info:
        scenario.resolve(n)
    assert str(info.value).startswith("bad.toml: ")
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_missing_link_is_only_needed_when_both_regions_hold_nodes() -> None:
    scenario = Scenario.from_dict({**two_regions({"share": 0.5}, {"share": 0.5}), "links": []})
    assert scenario.resolve(1).region == ("a",)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_resolve_rejects_bad_node_counts(bad: Any) -> None:
    with pytest.raises(ValueError, match="num_ranks"):
        Scenario.from_dict(minimal()).resolve(bad)


def test_resolve_takes_every_rank_and_the_old_keyword_warns() -> None:
    """``num_nodes`` means trainers everywhere; resolve's world of ranks is ``num_ranks`` (trainers + servers)."""
    scenario = Scenario.from_dict(minimal())
    assert scenario.resolve(num_ranks=5, servers=1).num_nodes == 5
    with pytest.warns(DeprecationWarning, match=r"num_ranks="):
        assert scenario.resolve(num_nodes=5, servers=1).num_nodes == 5


@pytest.mark.parametrize("value", [None, [], "name", 3])
def test_from_dict_rejects_non_tables(value: object) -> None:
    with pytest.raises(ScenarioError, match="<dict>: expected a table"):
        Scenario.from_dict(value)  # type: ignore[arg-type]


# ---------------------------------------------------------------- property-based
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 70), st.floats(allow_nan=True), st.text(max_size=12),
    st.sampled_from(["1 Gbit/s", "10 ms", "4 MiB", "0 s", "ring", "star", "max-min", "flops", "lognormal", "slow",
                     "down", "a", "b", "default"]),
)
KEYS = st.sampled_from(
    ["name", "description", "network", "compute", "regions", "links", "nodes", "stragglers", "events", "bandwidth",
     "uplink", "downlink", "latency", "collective", "sharing", "efficiency", "tcp_window", "algorithms", "all_reduce",
     "broadcast", "mode", "tflops", "mfu", "ranks", "share", "between", "speed", "jitter", "sigma", "seed", "kind",
     "from_step", "to_step", "from_s", "to_s", "factor", "bogus"]
) | st.text(max_size=8)
TREES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=6),
                     max_leaves=30)


def _check_loaded(make) -> None:
    try:
        scenario = make()
    except ScenarioError:
        return
    for n in (1, 2, 3, 8):
        try:
            assert scenario.resolve(n).num_nodes == n
        except ScenarioError:
            pass
    assert Scenario.from_dict(scenario.to_dict()) == scenario
    assert isinstance(scenario.describe(), str)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(TREES)
def test_arbitrary_dicts_give_a_scenario_or_a_scenario_error(tree: Any) -> None:
    _check_loaded(lambda: Scenario.from_dict(tree))


def _tables(tree: Any) -> list[dict[str, Any]]:
    """Every table inside ``tree``, the top level included."""
    if isinstance(tree, dict):
        return [tree, *(t for value in tree.values() for t in _tables(value))]
    if isinstance(tree, list):
        return [t for value in tree for t in _tables(value)]
    return []


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PRESETS), st.data())
def test_mutated_presets_give_a_scenario_or_a_scenario_error(name: str, data: st.DataObject) -> None:
    tree = Scenario.load(name).to_dict()
    for _ in range(data.draw(st.integers(1, 3))):
        table = data.draw(st.sampled_from(_tables(tree)))
        key = data.draw(st.sampled_from(sorted(table)) | KEYS if table else KEYS)
        if data.draw(st.booleans()):
            table.pop(key, None)
        else:
            table[key] = data.draw(TREES)
    _check_loaded(lambda: Scenario.from_dict(tree))


BASE = ['name = "f"', "[network]", 'bandwidth = "1 Gbit/s"']
FRAGMENTS = st.sampled_from(
    ['latency = "5 ms"', '[[regions]]\nname = "a"\nshare = 0.5', '[[regions]]\nname = "b"\nranks = [1]',
     '[[links]]\nbetween = ["a", "b"]\nbandwidth = "1 Gbit/s"', "[[nodes]]\nshare = 0.5\nspeed = 0.5",
     '[[events]]\nkind = "down"\nshare = 0.5\nto_step = 3', '[stragglers]\njitter = "normal"\nsigma = 0.1',
     '[compute]\nmode = "flops"\ntflops = 1.0', "[[regions]]", 'name = "a"', "share = 0.5", "x = [", "= 1", '"',
     "efficiency = 2", "speed = 0"]
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(), st.lists(FRAGMENTS, max_size=14).map(lambda lines: "\n".join([*BASE, *lines]))))
def test_arbitrary_toml_text_gives_a_scenario_or_a_scenario_error(text: str) -> None:
    _check_loaded(lambda: Scenario.from_toml(text, "fuzz.toml"))


def test_replace_bandwidth_means_both_directions_of_every_nic():
    s = Scenario.load("home-broadband").replace(bandwidth="100 Mbit/s", nodes=[])
    r = s.resolve(4)
    eff = Scenario.load("home-broadband").to_dict()["network"].get("efficiency", 1.0)
    assert set(r.uplink) == set(r.downlink) == {100e6 / 8 * eff}
    kept = Scenario.load("home-broadband").replace(bandwidth="100 Mbit/s", uplink="5 Mbit/s", nodes=[]).resolve(2)
    assert set(kept.uplink) == {5e6 / 8 * eff} and set(kept.downlink) == {100e6 / 8 * eff}


def test_replace_bandwidth_moves_the_nodes_own_nics_and_keeps_their_ranks_and_speeds():
    home = Scenario.load("home-broadband")
    fast = home.replace(bandwidth="1 Gbit/s")
    eff = home.to_dict()["network"]["efficiency"]
    r, before = fast.resolve(8), home.resolve(8)
    assert set(r.uplink) == set(r.downlink) == {1e9 / 8 * eff}  # the slow quarter's 10 Mbit/s uplink too
    assert r.speed == before.speed and min(before.uplink) == 10e6 / 8 * eff

    def rest(s: Scenario) -> list[dict]:
        return [{k: v for k, v in n.items() if k not in NIC_KEYS} for n in s.to_dict()["nodes"]]

    assert rest(fast) == rest(home)
    # given nodes in the same call, those are the nodes
    mine = home.replace(bandwidth="1 Gbit/s", nodes=[{"ranks": [0], "uplink": "1 Mbit/s"}]).resolve(2)
    assert mine.uplink == (1e6 / 8 * eff, 1e9 / 8 * eff)


def test_scenarios_names_the_backend_the_nic_and_what_runs_each_op(capsys) -> None:
    """From the command line a user can check which model will run: the library, its NIC and sockets, the
    algorithm and protocol (set, the preset's, or the library's default) and every op, and per level under [hosts]."""
    from exonet.cli import main

    assert main(["scenarios", "cross-region"]) == 0
    out = capsys.readouterr().out
    for words in ("backend     nccl, NIC aws (preset)", "2 channels x 16 sockets (the aws NIC default)",
                  "at most 5 Gbit/s per flow", "the tuner's choice of ring or tree per call (NCCL's default)",
                  "reduce: the chain towards the root", "barrier: an all-reduce of one float"):
        assert words in out, words
    hosts = Scenario.load("cross-region").replace(collective="ring", hosts={"devices": 8, "bandwidth": "450 GB/s"})
    text = hosts.describe()
    assert "algorithm: ring (set, as NCCL_ALGO)" in text and "a ring per device (rail) through its NIC" in text
    assert "NIC aws (set)" in text  # a preset the user replaced is the user's own
    gloo = Scenario.from_dict({"name": "g", "network": {"bandwidth": "1 Gbit/s", "backend": "gloo"}}).describe()
    assert "backend     gloo over TCP sockets, 1 connection per pair (default)" in gloo
    assert "barrier: dissemination" in gloo and "collective  " not in gloo
    direct = Scenario.load("cross-region").replace(algorithms={"all_reduce": "direct"}).describe()
    assert ("instead, all_reduce: exonet's phase direct (set in [network.algorithms]) on nccl's sockets, "
            "not nccl's own") in direct
