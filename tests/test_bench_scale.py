"""The scale and memory benchmarks run end to end at tiny sizes and return their figures and ratios (not timed)."""

from __future__ import annotations

import math

import pytest

from exonet.bench import memory, scale


@pytest.mark.slow
def test_scale_bench_returns_startup_against_spawn_step_time_and_memory_per_node(capsys):
    figures = scale.main(["--nodes", "2,3", "--steps", "3", "--models", "mlp,cnn", "--startup-nodes", "2",
                          "--repeat", "1"])
    assert set(figures["startup"]) == {"cold", "prepared", "warm", "spawn"}
    assert all(s > 0 for s in figures["startup"].values())
    assert list(figures["models"]) == ["mlp", "cnn"]
    for model in figures["models"].values():  # one process-heavy run: its two models, not two runs
        rows = model["rows"]
        # a step's time is the difference of a 3-step and a 1-step fit: on a loaded machine it can come out
        # negative (a clean CI run read -16 ms), and the exponent is then nan, as the bench prints it
        assert [r["k"] for r in rows] == [2, 3] and all(math.isfinite(r["step_s"]) and r["pss"] > 0 for r in rows)
        assert model["pss_per_node"] == pytest.approx(rows[1]["pss"] - rows[0]["pss"])  # slope through two points
        assert model["step_exponent"] == pytest.approx(scale.exponent([2, 3], [r["step_s"] for r in rows]),
                                                       nan_ok=True)
    assert "ratio spawn/exonet: cold" in capsys.readouterr().out  # and prints them


@pytest.mark.slow
def test_memory_bench_returns_the_extra_pss_of_a_dataset_against_a_tiny_one(capsys):
    figures = memory.main(["--nodes", "2", "--gib", "0.004", "--tiny-rows", "256", "--steps", "3",
                           "--kinds", "tensor,numpy,memmap"])
    size = figures["dataset_bytes"]
    assert size == int(0.004 * 2**30 / memory.ROW_BYTES) * memory.ROW_BYTES
    assert list(figures["kinds"]) == ["tensor", "numpy", "memmap"]
    for levels in figures["kinds"].values():
        assert list(levels) == ["peak", "steady"]
        for f in levels.values():
            assert f["tiny_bytes"] > 0
            assert f["extra_ratio"] == pytest.approx((f["large_bytes"] - f["tiny_bytes"]) / size)
    out = capsys.readouterr().out
    assert "x the dataset (K copies: 2x)" in out
    assert "caution: K processes' memory varies by about 100 MiB" in out  # 4 MiB: the ratios are noise


def test_scale_exponent_and_slope_are_least_squares_fits():
    assert scale.exponent([8, 16, 32], [1.0, 2.0, 4.0]) == pytest.approx(1.0)
    assert scale.slope([8, 16, 32], [100.0, 180.0, 340.0]) == pytest.approx(10.0)


def test_the_worker_model_figures_take_workers_and_the_old_learners_flag_warns(capsys):
    args = ["--chips", "4096", "--hours", "1", "--startup-nodes", "0", "--models", ""]
    figures = scale.main([*args, "--workers", "4"])["workers"]
    assert figures["chips"] == 4096 and figures["workers"] == 4
    with pytest.warns(DeprecationWarning, match="--learners is now --workers"):
        again = scale.main([*args, "--learners", "4"])["workers"]
    assert again["workers"] == 4 and again["goodput"] == figures["goodput"]
    assert "4,096 chips in 4 workers" in capsys.readouterr().out
