"""``estimate --hosts G``: an estimate's scenario gains hosts of G devices on an NVLink-class fabric."""

from __future__ import annotations

import json

import pytest

from exonet import Scenario
from exonet.cli import main
from exonet.estimate import HOST_FABRIC, estimate, simulate_estimate, with_hosts
from exonet.strategies import DDPStrategy

B, A = 100e9 / 8, 10e-6  # NIC bytes/s, latency
BF, AF = 450e9, 1e-6  # the --hosts fabric: 450 GB/s per device each way, 1 us
FLAT = {"name": "flat", "network": {"bandwidth": "100 Gbit/s", "latency": "10 us", "collective": "ring"}}


def test_with_hosts_adds_the_stated_fabric_and_hierarchical_collectives():
    hosted = with_hosts(Scenario.from_dict(FLAT), 8, 64)
    assert hosted.to_dict()["hosts"] == {"devices": 8, **HOST_FABRIC}
    assert hosted.to_dict()["network"]["collective"] == "hierarchical"
    spec = hosted.resolve(64).hosts
    assert (spec.devices, spec.bandwidth, spec.latency, spec.nic) == (8, BF, AF, "per-device")


def test_a_scenario_with_hosts_keeps_its_own():
    own = Scenario.from_dict({**FLAT, "hosts": {"devices": 4, "bandwidth": "100 GB/s"}})
    assert with_hosts(own, 4) is own
    with pytest.raises(ValueError, match=r"--hosts 8: scenario 'flat' already has \[hosts\] devices = 4"):
        with_hosts(own, 8)


@pytest.mark.parametrize("devices, nodes, match", [(3, 64, "--hosts 3 does not divide --nodes 64"),
                                                   (0, 8, "--hosts: expected an integer >= 1"),
                                                   (True, 8, "--hosts: expected an integer >= 1")])
def test_bad_hosts_name_the_argument(devices, nodes, match):
    with pytest.raises(ValueError, match=match):
        with_hosts("datacenter", devices, nodes)


def test_a_hosted_ddp_estimate_is_the_hierarchical_closed_form():
    G, H, steps, step_time = 4, 2, 3, 0.5
    est = estimate(DDPStrategy("sgd", overlap=False), params=1e6, num_nodes=G * H, max_steps=steps, step_time=step_time,
                   dtype="bf16", layers=2)
    S = est.trace.payload_bytes(0) / steps
    per_step = 2 * ((G - 1) * AF + (G - 1) / G * S / BF) + 2 * (H - 1) * A + 2 * (H - 1) / H * (S / G) / B
    sim = simulate_estimate(est.trace, with_hosts(FLAT, G))
    assert sim.wall_clock_s == pytest.approx(steps * (step_time + per_step), rel=1e-9)
    flat = simulate_estimate(est.trace, FLAT)
    assert flat.wall_clock_s == pytest.approx(steps * (step_time + 2 * (G * H - 1) * (A + S / (G * H) / B)), rel=1e-9)


def test_the_cli_answers_hosts_across_two_regions_in_one_command(capsys):
    argv = ["estimate", "--model-params", "1e7", "--strategy", "ddp", "--nodes", "16", "--hosts", "8",
            "--scenario", "cross-region", "--steps", "2", "--step-time", "1", "--dtype", "bf16", "--layers", "2"]
    assert main(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hosts"] == 8
    est = estimate("ddp", params=1e7, num_nodes=16, max_steps=2, step_time=1, dtype="bf16", layers=2)
    hosted = simulate_estimate(est.trace, with_hosts("cross-region", 8))
    flat = simulate_estimate(est.trace, "cross-region")
    assert report["wall_clock_s"] == pytest.approx(hosted.wall_clock_s, rel=1e-12)
    assert hosted.wall_clock_s < flat.wall_clock_s  # the link carries S, not 1.75·S, and intra-host hops ride NVLink
    levels = report["scenarios"][0]["wire_bytes_per_level"]
    assert levels["in_host"] > levels["nic"] >= levels["inter_region"] > 0  # the fabric carries the most
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "K=16 (2 hosts of 8)" in text and "per 1,000 steps" in text and "wire bytes per node: inter-region" in text
    assert main(argv[:8] + ["3"] + argv[9:]) == 2
    assert "--hosts 3 does not divide --nodes 16" in capsys.readouterr().err



THREE_SITES = """name = "three-sites"
[network]
bandwidth = "100 Gbit/s"
latency = "50 us"
backend = "nccl"
[hosts]
devices = 8
bandwidth = "450 GB/s"
latency = "1 us"
""" + "".join(f'[[regions]]\nname = "{site}"\nshare = 0.3333333333333333\n' for site in ("us", "eu", "asia")) + "".join(
    f'[[links]]\nbetween = ["{a}", "{b}"]\nbandwidth = "10 Gbit/s"\nlatency = "40 ms"\n'
    for a, b in (("us", "eu"), ("eu", "asia"), ("us", "asia")))


@pytest.mark.parametrize("strategy", ["async_diloco:H=2", "decoupled_diloco:H=2,num_fragments=2,replica_size=8"])
def test_a_strategy_with_servers_estimates_on_hosts_with_num_nodes_its_trainers(strategy, tmp_path, capsys):
    """--nodes 24 on three sites of 8-GPU hosts: 24 trainers plus the server, in estimate() and the CLI alike (the
    early check counted the server among the nodes: "does not divide --nodes 23")."""
    path = tmp_path / "three-sites.toml"
    path.write_text(THREE_SITES)
    est = estimate(strategy, params=1e6, num_nodes=24, max_steps=4, step_time=0.1, layers=2, scenario=path)
    servers = est.trace.meta["servers"]
    assert servers >= 1 and est.trace.num_nodes == 24 and est.trace.num_ranks == 24 + servers
    assert simulate_estimate(est.trace, path).wall_clock_s > 0
    argv = ["estimate", "--model-params", "1e6", "--strategy", strategy, "--nodes", "24", "--scenario", str(path),
            "--steps", "4", "--step-time", "0.1", "--layers", "2", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["wall_clock_s"] > 0
