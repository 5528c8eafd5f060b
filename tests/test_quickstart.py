"""The main job's table is the same run to run: its presets time compute from counted FLOPs, not this CPU."""

from __future__ import annotations

import pytest

from exonet.quickstart import DEFAULT_SCENARIOS, compute_model, quickstart


def test_every_default_scenario_times_compute_from_flops():
    for name in DEFAULT_SCENARIOS:
        assert compute_model(name, 4).startswith("counted FLOPs / (")
    assert compute_model("cross-continent", 4).startswith("this machine's thread-CPU seconds")


@pytest.mark.slow
def test_the_quickstart_table_is_identical_run_to_run(tmp_path, capsys):
    first = quickstart(tmp_path / "a", steps=12, nodes=2).to_markdown()
    second = quickstart(tmp_path / "b", steps=12, nodes=2).to_markdown()
    assert first == second
    printed = capsys.readouterr().out
    assert printed.count("compute model per scenario:") == 2 and "datacenter: counted FLOPs / (989 TFLOP/s" in printed
