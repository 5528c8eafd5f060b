"""The scale and memory benchmarks run end to end at tiny sizes and print their figures and ratios (not timed)."""

from __future__ import annotations

import pytest

from exonet.bench import memory, scale


@pytest.mark.slow
def test_scale_bench_reports_startup_against_spawn_step_time_and_memory_per_node(capsys):
    assert scale.main(["--nodes", "2,3", "--steps", "3", "--models", "mlp,cnn", "--startup-nodes", "2",
                       "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "ratio spawn/exonet: cold" in out and "prepared" in out and "warm" in out
    assert out.count("per additional node:") == 2 and "time per step ~ K^" in out
    assert "scale bench: cnn" in out and "K=  3" in out


@pytest.mark.slow
def test_memory_bench_reports_the_extra_pss_of_a_dataset_against_a_tiny_one(capsys):
    assert memory.main(["--nodes", "2", "--gib", "0.004", "--tiny-rows", "256", "--steps", "3",
                        "--kinds", "tensor,numpy,memmap"]) == 0
    out = capsys.readouterr().out
    assert out.count("x the dataset (K copies: 2x)") == 6 and "memmap" in out


def test_scale_exponent_and_slope_are_least_squares_fits():
    assert scale.exponent([8, 16, 32], [1.0, 2.0, 4.0]) == pytest.approx(1.0)
    assert scale.slope([8, 16, 32], [100.0, 180.0, 340.0]) == pytest.approx(10.0)
