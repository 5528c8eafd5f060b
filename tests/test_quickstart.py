"""The main job: its projection at scale and its tables are the same run to run (compute from counted FLOPs)."""

from __future__ import annotations

import pytest
import torch

from exonet.estimate import LayerStack
from exonet.study.projection import Scale, project, to_markdown
from exonet.study.quickstart import DEFAULT_SCENARIOS, compute_model, quickstart, quickstart_strategies

SMALL = Scale(params=2e5, steps=4, per_steps=1000)


@pytest.mark.parametrize("name", DEFAULT_SCENARIOS)
def test_every_default_scenario_times_compute_from_flops(name):
    assert compute_model(name, 4).startswith("counted FLOPs / (")


def test_a_scenario_without_device_flops_times_compute_by_this_machines_cpu():
    assert compute_model("cross-continent", 4).startswith("this machine's thread-CPU seconds")


def test_the_projection_is_deterministic_and_differs_by_strategy_and_network():
    strategies = {k: v for k, v in quickstart_strategies().items() if k in ("DDP", "DiLoCo H=25")}
    scale = Scale(params=2e5, steps=50, per_steps=1000)
    rows = project(strategies, ["datacenter", "home-broadband"], nodes=4, scale=scale)
    assert rows == project(strategies, ["datacenter", "home-broadband"], nodes=4, scale=scale)
    util = {(r["run"], r["scenario"]): r["utilization"] for r in rows}
    assert util[("DDP", "home-broadband")] < util[("DiLoCo H=25", "home-broadband")]
    assert util[("DDP", "home-broadband")] < util[("DDP", "datacenter")]


def test_projected_bytes_are_the_strategies_payload_scaled_to_the_stated_steps():
    params = sum(p.numel() for p in LayerStack(200_000, 24, torch.bfloat16).parameters())
    rows = project({k: v for k, v in quickstart_strategies().items() if k == "DDP"}, ["datacenter"], nodes=4,
                   scale=SMALL)
    # DDP all-reduces every gradient once per step: 2 bytes per bf16 parameter, scaled from 4 steps to 1,000.
    assert rows[0]["payload_bytes_per_node"] == 2 * params * 4 * 250
    table = to_markdown(rows, SMALL, {"extra": ["x"]})
    assert table.splitlines()[0] == ("| run | scenario | compute util @2e+05 | time per 1,000 steps | "
                                     "payload/node per 1,000 steps | extra |")


def test_a_scenario_without_a_device_cannot_be_projected():
    with pytest.raises(ValueError, match="cross-continent.*names no device"):
        project(quickstart_strategies(), ["cross-continent"], nodes=4, scale=SMALL)


@pytest.mark.slow
def test_the_quickstart_tables_are_identical_run_to_run(tmp_path, capsys):
    first = quickstart(tmp_path / "a", steps=12, nodes=2, scale=SMALL).to_markdown()
    printed_first = capsys.readouterr().out
    second = quickstart(tmp_path / "b", steps=12, nodes=2, scale=SMALL).to_markdown()
    printed_second = capsys.readouterr().out
    assert first == second
    projection = [line for line in printed_first.splitlines() if "@2e+05" in line or "| DeMo | " in line]
    assert projection and projection == [line for line in printed_second.splitlines() if line in projection]
    assert "compute model per scenario:" in printed_first
    assert "datacenter: counted FLOPs / (989 TFLOP/s" in printed_first
    assert "projected to 2e+05 parameters (bf16), 2 nodes" in printed_first


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"scenarios": ["datacenter", "nowhere"]}, "unknown scenario preset 'nowhere'"),
    ({"nodes": 0}, "nodes must be an integer >= 1, got 0"),
    ({"steps": -1}, "steps must be an integer >= 1, got -1"),
])
def test_bad_arguments_fail_before_any_training(tmp_path, capsys, kwargs, match):
    from exonet.errors import ScenarioError

    with pytest.raises((ScenarioError, ValueError), match=match):
        quickstart(out_dir=tmp_path / "qs", **kwargs)
    assert "training" not in capsys.readouterr().out and not (tmp_path / "qs").exists()


def test_a_scenario_without_a_device_fails_before_any_training(tmp_path, monkeypatch):
    """cross-continent passed the early check, trained all four strategies, then failed in the projection."""
    import exonet

    class NoTraining:
        def __init__(self, *args, **kwargs):
            raise AssertionError("the quickstart trained before checking its scenarios")

    monkeypatch.setattr(exonet, "LocalTrainer", NoTraining)
    with pytest.raises(ValueError, match=r"^quickstart: scenario 'cross-continent' names no device"):
        quickstart(out_dir=tmp_path / "qs", scenarios=["datacenter", "cross-continent"])
    assert not (tmp_path / "qs").exists()
