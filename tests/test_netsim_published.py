"""Published results, reproduced by replaying the papers' own schedules through exonet's simulator."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from exonet.validate.published import (
    GRID_STEP,
    INTELLECT1,
    METHODS,
    TABLE4_1B,
    TARGETS,
    LayerDAG,
    distro_example,
    intellect1,
    streaming_diloco_table4,
)


@pytest.mark.slow
def test_streaming_diloco_table4_1b_row_within_one_grid_step():
    ours = streaming_diloco_table4()
    for method in METHODS:
        for target, got, published in zip(TARGETS, ours[method], TABLE4_1B[method]):
            ratio = got / published
            assert 1 / GRID_STEP <= ratio <= GRID_STEP, (method, target, got, published)


def test_the_dag_matches_the_paper_on_a_cell_boundary():
    # The paper prints the highest grid bandwidth still below the target: 184.2 Gbit/s is under 90%
    # for data-parallel, and the next grid point (222.3) reaches it.
    dp = LayerDAG("data-parallel")
    assert dp.utilization(184.2) < 0.9 <= dp.utilization(184.2 * GRID_STEP)
    assert LayerDAG("+ overlap").delay == 2 and LayerDAG("Streaming DiLoCo").delay == 1
    assert sorted(l for s in range(1, 101) for l in LayerDAG("Streaming DiLoCo").synced(s)) == list(range(24))


@pytest.mark.parametrize(("seconds", "published"), zip(INTELLECT1["all_reduce_s"], INTELLECT1["utilization"]))
def test_intellect1_utilisations_from_its_all_reduce_times(seconds, published):
    bandwidth, utilization = intellect1(seconds)
    assert utilization == pytest.approx(published, abs=1e-3)  # the paper rounds to 0.1%
    assert bandwidth == pytest.approx(8 * 2 * 13 / 14 * 10e9 / seconds, rel=1e-12)


def test_intellect1_bandwidth_at_its_fastest_all_reduce():
    assert intellect1(103.0)[0] == pytest.approx(1.442e9, rel=1e-3)  # 1.44 Gbit/s per node


def test_distro_worked_example():
    down, up = distro_example()
    assert down == pytest.approx(6.944, rel=1e-12)  # 31 × 2.8 MB on 100 Mbit/s
    assert up == pytest.approx(2.24, rel=1e-12)  # 2.8 MB on 10 Mbit/s


def test_estimate_json_reports_the_bandwidth_for_each_utilisation(tmp_path):
    scenario = tmp_path / "ideal.toml"
    scenario.write_text('name = "ideal"\n[network]\nbandwidth = "100 Gbit/s"\n')
    out = subprocess.run([sys.executable, "-m", "exonet", "estimate", "--model-params", "1e8", "--strategy", "ddp",
                          "--nodes", "2", "--steps", "3", "--step-time", "0.01", "--dtype", "bf16", "--layers", "4",
                          "--scenario", str(scenario), "--solve-utilization", "0.5,0.9", "--json"],
                         capture_output=True, text=True, check=True).stdout
    report = json.loads(out)
    assert report["payload_bytes_per_node"] == 3 * 2 * report["params"]
    assert 0 < report["utilization"] <= 1 and report["wall_clock_s"] >= 0.03
    need = report["bandwidth_for_utilization"]
    assert set(need) == {"0.5", "0.9"} and 0 < need["0.5"] < need["0.9"]
