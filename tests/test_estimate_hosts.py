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
    assert main(argv) == 0
    assert "K=16 (2 hosts of 8)" in capsys.readouterr().out
    assert main(argv[:8] + ["3"] + argv[9:]) == 2
    assert "--hosts 3 does not divide --nodes 16" in capsys.readouterr().err
