"""Egress pricing: "$/GB" in a scenario, the dollars a replay costs, and where they are reported."""

from __future__ import annotations

import json

import pytest

from exonet.cli import main
from exonet.errors import ScenarioError
from exonet.netsim import simulate
from exonet.scenario import Scenario
from exonet.trace import Trace
from exonet.units import format_dollars, parse_price

GB = 1e9


def two_regions(us: str | None = "0.09 $/GB", link: str | None = None) -> Scenario:
    regions = [{"name": "us", "ranks": [0]}, {"name": "eu", "ranks": [1]}]
    if us is not None:
        regions[0]["egress"] = us
    between = {"between": ["us", "eu"], "bandwidth": "1 Gbit/s", "latency": "40 ms"}
    if link is not None:
        between["egress"] = link
    return Scenario.from_dict({"name": "priced", "network": {"bandwidth": "1 Gbit/s", "latency": "1 ms"},
                               "regions": regions, "links": [between]})


def all_reduce(nbytes: int) -> Trace:
    trace = Trace(2)
    for rank in range(2):
        trace.add_collective(rank, "all_reduce", nbytes)
        trace.add_step(rank)
    return trace


@pytest.mark.parametrize(("text", "per_byte"), [("0.08 $/GB", 0.08 / GB), ("20 $/TB", 20 / 1e12),
                                                ("0.02 $/GiB", 0.02 / 2**30), ("0 $/GB", 0.0)])
def test_a_price_is_dollars_per_byte(text, per_byte):
    assert parse_price(text) == pytest.approx(per_byte, rel=1e-15)


@pytest.mark.parametrize(("text", "message"), [("0.08", "has no unit"), ("0.08 $/Gb", "unknown price unit"),
                                               ("-1 $/GB", "must be non-negative"), (0.08, "has no unit")])
def test_a_bad_price_names_the_field(text, message):
    with pytest.raises(ScenarioError, match=f"regions\\[0\\].egress.*{message}"):
        two_regions(us=text)


def test_each_direction_pays_its_source_regions_price_unless_the_link_has_its_own():
    us, link = parse_price("0.09 $/GB"), parse_price("0.02 $/GB")
    assert two_regions().resolve(2).egress == {("us", "eu"): us}
    assert two_regions(link="0.02 $/GB").resolve(2).egress == {("us", "eu"): link, ("eu", "us"): link}
    assert two_regions(us=None).resolve(2).egress == {}


def test_a_replay_costs_the_bytes_that_crossed_each_priced_direction():
    """K = 2 all-reduce of 1 GB: the ring sends S = 1 GB each way across the link; only us->eu is priced."""
    result = simulate(all_reduce(10**9), two_regions())
    assert {link.name: link.bytes for link in result.links if "->" in link.name} == {"us->eu": GB, "eu->us": GB}
    assert result.cost == pytest.approx(0.09, rel=1e-12)
    assert "egress cost $0.09" in result.summary()
    assert simulate(all_reduce(10**9), two_regions(us=None)).cost == 0.0


def test_estimate_reports_dollars_per_run_and_per_thousand_steps(tmp_path, capsys):
    path = tmp_path / "priced.toml"
    path.write_text('name = "priced"\n[network]\nbandwidth = "1 Gbit/s"\nlatency = "1 ms"\n'
                    '[[regions]]\nname = "us"\nshare = 0.5\negress = "0.09 $/GB"\n'
                    '[[regions]]\nname = "eu"\nshare = 0.5\negress = "0.05 $/GB"\n'
                    '[[links]]\nbetween = ["us", "eu"]\nbandwidth = "1 Gbit/s"\nlatency = "40 ms"\n')
    args = ["estimate", "--model-params", "1e6", "--strategy", "diloco:H=5", "--nodes", "2", "--steps", "10",
            "--step-time", "0.1", "--scenario", str(path)]
    assert main([*args, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["scenarios"][0]
    crossing = row["wire_bytes_per_level"]["inter_region"] * 2  # both trainers' bytes, one each way
    assert row["cost_usd"] == pytest.approx(crossing / 2 * (0.09 + 0.05) / GB, rel=1e-9)
    assert row["cost_usd_per_1000_steps"] == pytest.approx(100 * row["cost_usd"], rel=1e-12)
    assert main(args) == 0
    assert f"egress {format_dollars(row['cost_usd'])} per run" in capsys.readouterr().out


def test_compare_adds_dollar_columns_only_where_a_scenario_prices_egress():
    from exonet.study.comparison import compare

    table = compare({"ar": all_reduce(10**9)}, [two_regions(), two_regions(us=None)])
    assert [row["cost_usd"] for row in table.rows] == [pytest.approx(0.09, rel=1e-12), 0.0]
    text = table.to_markdown()
    assert "egress $" in text and "$0.09" in text
    assert "egress $" not in compare({"ar": all_reduce(10**9)}, [two_regions(us=None)]).to_markdown()


def test_describe_names_each_price():
    text = two_regions(link="0.02 $/GB").describe(2)
    assert "region      us: ranks [0], egress $0.09/GB" in text
    assert "link        us <-> eu: 1 Gbit/s, latency 40 ms, egress $0.02/GB either way" in text
